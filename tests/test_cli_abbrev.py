"""Flags are never abbreviated: a prefix of a flag is an unknown flag, not that flag.

argparse takes a unique prefix for the whole flag by default, and a subparser does not
inherit ``allow_abbrev`` from its parent. With flags as alike as
``--tensor-model-parallel-size`` and ``--global-batch-size``, a typo would silently set
another setting, so every parser the package builds turns prefixes off.
"""

import re

import pytest

from sim.cli import COMMANDS, main
from sim.errors import InputError
from sim.inputs.resolve import model_from_megatron_args


@pytest.fixture(autouse=True)
def no_command_runs(monkeypatch):
    """Were a prefix taken, the command would start its work: fail at once instead."""
    import importlib

    def ran(args):
        raise AssertionError("the command ran: a prefix was taken for a flag")

    for name in COMMANDS:
        monkeypatch.setattr(importlib.import_module(f"sim.commands.{name}"), "run", ran)


def _error_line(capsys, argv) -> str:
    assert main(argv) == 2, argv
    cap = capsys.readouterr()
    lines = cap.err.splitlines()
    assert cap.out == "" and len(lines) == 1 and lines[0].startswith("trainsim: error: "), (argv, cap.err)
    return lines[0]


def test_the_issue_example_is_an_error_naming_both_prefixes(capsys):
    line = _error_line(capsys, ["run", "--model", "llama2-7b", "--tensor-model", "2", "--global-batch", "8"])
    assert "--tensor-model" in line and "--global-batch" in line


def _long_flags(capsys, command: str) -> list[str]:
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    return sorted(set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", capsys.readouterr().out)) - {"--help"})


@pytest.mark.parametrize("command", [c.replace("_", "-") for c in COMMANDS])
def test_no_subcommand_takes_a_prefix_of_its_flags(capsys, command):
    flags = _long_flags(capsys, command)
    assert flags, command
    # the longest flag, cut short by three letters: a prefix of that one flag only
    flag = max(flags, key=len)
    prefix = flag[:-3].rstrip("-")
    assert [f for f in flags if f.startswith(prefix)] == [flag]
    argv = [command, prefix, "1"]
    line = _error_line(capsys, argv)
    while (m := re.search(r"the following arguments are required: (.*)$", line)):
        # give what the command requires, so the line left is about the prefix
        argv += [a for flag in m.group(1).split(", ") for a in (flag, "1")]
        line = _error_line(capsys, argv)
    assert "unrecognized arguments" in line and prefix in line


def test_the_top_level_parser_takes_no_prefix_either(capsys):
    assert "--vers" in _error_line(capsys, ["--vers"])


def test_megatron_argument_lists_take_no_prefix():
    shape = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--vocab-size", "128",
             "--seq-length", "32"]
    assert model_from_megatron_args(shape).num_layers == 2
    with pytest.raises(InputError, match="--num-lay"):
        model_from_megatron_args(["--num-lay", "2", *shape[2:]])
