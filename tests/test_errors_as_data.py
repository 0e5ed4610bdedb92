"""Errors as data (issue 52, item 5): an error carries its field, value, what is allowed,
its setting and the file (and line) it was read from, and every front end names it from
those: an experiment file by its line and key, the command line by the flag. Nothing
reads a message back to find out where it came from."""

import contextlib
import io
import json

import pytest

from sim.cli import main
from sim.errors import InputError, require
from sim.inputs.hf_config import model_from_hf_config
from sim.inputs.tomlio import TomlFile
from sim.studies.search import SearchSpace


def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _line_of(text: str, start: str) -> int:
    """The 1-based line of ``text`` that starts with ``start`` (the expectation, found here)."""
    return next(i for i, line in enumerate(text.splitlines(), start=1) if line.startswith(start))


def test_in_file_prefixes_once_and_keeps_the_structure():
    exc = InputError(field="gpus", value=0, allowed="expected an integer > 0", setting="gpus")
    placed = exc.in_file("e.toml")
    assert str(placed) == "e.toml: gpus: got 0; expected an integer > 0"
    assert (placed.path, placed.field, placed.value, placed.allowed, placed.setting) == \
        ("e.toml", "gpus", 0, "expected an integer > 0", "gpus")
    assert placed.in_file("e.toml") is placed  # named already: as it is, however it reads
    assert str(placed.in_file("outer.toml")) == "outer.toml: e.toml: gpus: got 0; expected an integer > 0"


def test_require_with_a_path_names_the_file_in_front():
    with pytest.raises(InputError) as info:
        require(False, "hidden_size", -1, "expected an integer > 0", path="cfg/config.json")
    assert str(info.value) == "cfg/config.json: hidden_size: got -1; expected an integer > 0"
    assert info.value.path == "cfg/config.json" and info.value.field == "hidden_size"


def test_toml_errors_record_file_line_and_key(tmp_path):
    text = "# a comment\n[node]\ngpus = 8\nnvlink_bandwidth_GBps = -1\n"
    path = tmp_path / "n.toml"
    path.write_text(text)
    f = TomlFile(path)
    exc = f.error("node.nvlink_bandwidth_GBps", "got -1; expected a number > 0")
    line = _line_of(text, "nvlink_bandwidth_GBps")
    assert (exc.path, exc.line, exc.field) == (str(path), line, "node.nvlink_bandwidth_GBps")
    assert str(exc) == f"{path}:{line}: node.nvlink_bandwidth_GBps: got -1; expected a number > 0"


def test_a_config_json_error_names_the_file_once(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 512,
                                "num_attention_heads": 0, "intermediate_size": 1024, "vocab_size": 1000,
                                "max_position_embeddings": 128}))
    with pytest.raises(InputError) as info:
        model_from_hf_config(path)
    assert str(info.value) == f"{path}: num_attention_heads: got 0; expected an integer > 0"
    assert str(info.value).count(str(path)) == 1 and info.value.path == str(path)


def test_a_bad_recipe_in_a_file_is_named_by_its_line_and_key_and_on_the_command_line_by_its_flag(tmp_path):
    text = ('[model]\npreset = "llama2-7b"\n\n[cluster]\ngpu = "h100-sxm"\ngpus = 8\n\n'
            '[plan]\nfp8_format = "hybrid"\nfp8_recipe = "mxfp8"\n')
    path = tmp_path / "e.toml"
    path.write_text(text)
    why = ("got 'mxfp8'; GPU h100-sxm has no MX block-scaled tensor cores (its profile's mx_block_scaling is "
           "false); allowed on h100-sxm: delayed, tensorwise, blockwise; mxfp8 needs a GPU with mx_block_scaling "
           "(b200, gb200, gb300)")
    code, out, err = _cli(["run", str(path)])
    assert (code, out) == (2, "")
    assert err == f"trainsim: error: {path}:{_line_of(text, 'fp8_recipe')}: plan.fp8_recipe: {why}\n"
    code, out, err = _cli(["run", "--model", "llama2-7b", "--gpu", "h100-sxm", "--gpus", "8",
                           "--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"])
    assert (code, out, err) == (2, "", f"trainsim: error: --fp8-recipe: {why}\n")


def test_a_search_space_error_carries_its_attribute_and_the_command_names_the_flag():
    with pytest.raises(InputError) as info:
        SearchSpace(zero_stage=(5,))
    assert (info.value.setting, info.value.value) == ("zero_stage", 5)
    assert str(info.value) == "search: zero_stage: got 5; allowed: 0, 1, 2, 3"
    code, _, err = _cli(["search", "--model", "llama2-7b", "--gpus", "8", "--global-batch-size", "8",
                         "--zero", "0,5"])
    assert code == 2 and err == "trainsim: error: --zero: got 5; allowed: 0, 1, 2, 3\n"


def test_the_collective_vocabulary_is_declared_once_for_the_engine_and_the_settings():
    """``trainsim collective`` lists the ops, algorithms and protocols the engine builds, from
    inputs (``schema_sim``): the program's names are those, and the run setting ``nccl_algo``
    / ``nccl_protocol`` takes the same algorithms and protocols (in its own order)."""
    from sim.inputs.schema_sim import (COLLECTIVE_ALGOS, COLLECTIVE_OPS, COLLECTIVE_PROTOCOLS, NCCL_ALGOS,
                                       NCCL_PROTOCOLS)
    from sim.program.actions import ALGOS, OPS, PROTOCOLS

    assert (OPS, ALGOS, PROTOCOLS) == (COLLECTIVE_OPS, COLLECTIVE_ALGOS, COLLECTIVE_PROTOCOLS)
    assert set(NCCL_ALGOS) == set(ALGOS) and set(NCCL_PROTOCOLS) == set(PROTOCOLS)


def test_more_gpus_than_the_topology_holds_is_named_by_the_file_line_or_the_flag(tmp_path):
    text = '[model]\npreset = "llama2-7b"\n\n[cluster]\ngpu = "h100-sxm"\ntopology = "dgx-h100"\nnodes = 1\ngpus = 16\n'
    path = tmp_path / "g.toml"
    path.write_text(text)
    why = "got 16; topology dgx-h100x1-rail has 8 GPUs (--nodes 1)"
    assert _cli(["run", str(path)]) == (2, "", f"trainsim: error: {path}:{_line_of(text, 'gpus =')}: cluster.gpus: {why}\n")
    assert _cli(["run", "--model", "llama2-7b", "--gpu", "h100-sxm", "--topology", "dgx-h100", "--nodes", "1",
                 "--gpus", "16"]) == (2, "", f"trainsim: error: --gpus: {why}\n")
