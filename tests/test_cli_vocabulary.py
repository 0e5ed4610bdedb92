"""One vocabulary of flags across commands (issue 54).

``--nodes`` and ``--gpus`` describe a cluster on every command that takes one; a setting's
short alias (``--tp`` for ``--tensor-model-parallel-size``) works on every command that
takes the setting, or on none; a misspelled flag or command gets argparse-style "did you
mean", as an experiment file's misspelled key does.
"""

import json
import re

import pytest

from sim.cli import COMMANDS, did_you_mean, main
from sim.inputs.schema import FIELDS

SMALL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4", "--vocab-size", "1024",
         "--seq-length", "256", "--gpu", "h100-sxm", "--global-batch-size", "16"]


def _flags(capsys, command: str) -> set[str]:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", capsys.readouterr().out))


def _error(capsys, argv) -> str:
    assert main(argv) == 2, argv
    cap = capsys.readouterr()
    lines = cap.err.splitlines()
    assert cap.out == "" and len(lines) == 1 and lines[0].startswith("trainsim: error: "), cap.err
    return lines[0]


@pytest.mark.parametrize("command", [c.replace("_", "-") for c in COMMANDS])
def test_nodes_and_gpus_go_together_and_aliases_are_everywhere_or_nowhere(capsys, command):
    flags = _flags(capsys, command)
    # (replay too: its --gpus is the what-if world size, in whole data-parallel replicas of the traced job)
    assert ("--nodes" in flags) == ("--gpus" in flags), command
    for f in FIELDS.values():
        names = {f.flag, *f.aliases}
        if names & flags:
            assert names <= flags, (command, sorted(names - flags))


def test_the_short_aliases_are_declared_in_the_schema():
    assert FIELDS["tensor_model_parallel_size"].aliases == ("--tp",)
    assert {a for f in FIELDS.values() for a in f.aliases} >= {"--tp", "--pp", "--vpp", "--cp", "--ep", "--etp"}


def _json(capsys, argv) -> dict:
    assert main(argv) == 0, argv
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("command", ["estimate", "explain"])
def test_estimate_and_explain_take_nodes_as_run_does(capsys, command):
    # README step 1 gave `unrecognized arguments: --nodes 2`
    by_nodes = _json(capsys, [command, *SMALL, "--nodes", "2", "--json"])
    by_gpus = _json(capsys, [command, *SMALL, "--gpus", "16", "--json"])
    assert by_nodes == by_gpus


def test_estimate_takes_the_short_aliases(capsys):
    long = _json(capsys, ["estimate", *SMALL, "--gpus", "8", "--tensor-model-parallel-size", "2",
                          "--pipeline-model-parallel-size", "2", "--json"])
    short = _json(capsys, ["estimate", *SMALL, "--gpus", "8", "--tp", "2", "--pp", "2", "--json"])
    assert short == long
    assert short != _json(capsys, ["estimate", *SMALL, "--gpus", "8", "--json"])


def test_run_takes_tp_as_search_does(capsys):
    long = _json(capsys, ["run", *SMALL, "--gpus", "4", "--tensor-model-parallel-size", "2", "--json"])
    short = _json(capsys, ["run", *SMALL, "--gpus", "4", "--tp", "2", "--json"])
    assert short == long and short["plan"]["tp"] == 2


def test_search_takes_the_long_flags_of_its_lists(capsys):
    argv = ["search", *SMALL, "--gpus", "4", "--pp", "1", "--zero", "0", "--micro-batch-size", "1",
            "--recompute", "none", "--workers", "0", "--json"]
    short = _json(capsys, [*argv, "--tp", "2"])
    long = _json(capsys, [*argv, "--tensor-model-parallel-size", "2"])
    assert short == long
    assert {p["plan"]["tp"] for p in long["top"]} == {2}


def test_a_misspelled_flag_gets_did_you_mean(capsys):
    line = _error(capsys, ["run", "--model", "llama2-7b", "--tensor-model-paralel-size", "2"])
    assert "unrecognized arguments: --tensor-model-paralel-size" in line
    assert line.endswith("(did you mean --tensor-model-parallel-size?)")
    line = _error(capsys, ["estimate", "--model", "llama2-7b", "--gpus-per-nod", "8", "--global-bach-size", "8"])
    assert line.endswith("(did you mean --gpus-per-node for --gpus-per-nod, --global-batch-size for --global-bach-size?)")
    # a flag of another command is suggested only from the command typed
    assert "did you mean" not in _error(capsys, ["run", "--model", "llama2-7b", "--xyzzy", "1"])


def test_a_misspelled_command_gets_did_you_mean(capsys):
    assert _error(capsys, ["rnu", "--model", "llama2-7b"]).endswith("(did you mean 'run'?)")


def test_did_you_mean_reads_flags_written_with_equals():
    assert did_you_mean(["--tenssor-model-parallel-size=2"], ["--tensor-model-parallel-size"]) == \
        " (did you mean --tensor-model-parallel-size?)"
    assert did_you_mean(["2", "-x"], ["--tp"]) == ""


def test_demo_takes_gpus_or_nodes(capsys):
    assert "--gpus: got 12; expected a multiple of 8" in _error(capsys, ["demo", "--gpus", "12"])
    assert "with --nodes 2 expected 16" in _error(capsys, ["demo", "--gpus", "8", "--nodes", "2"])


def test_a_megatron_argument_list_suggests_too():
    from sim.errors import InputError
    from sim.inputs.resolve import model_from_megatron_args

    with pytest.raises(InputError, match=r"unrecognized arguments: --num-layer 2 \(did you mean --num-layers\?\)"):
        model_from_megatron_args(["--num-layer", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                  "--vocab-size", "128", "--seq-length", "32"])
