"""Sensible defaults, said aloud (issue 54).

``--hf-config`` without ``--seq-length`` simulates 4096 tokens (or the training length the
config names), not the position limit, and says which; a plan that does not fit in GPU
memory exits 1 (its results printed all the same), as a search where nothing fits does;
``trainsim fit`` warns when a parameter ends at its bound.
"""

import contextlib
import io
import json

import pytest

from sim.calibrate.fit_runs import at_bound
from sim.cli import main
from sim.inputs.hf_config import HF_SEQ_LENGTH, model_from_hf_config, training_seq_length

QWEN25_14B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 5120,
              "intermediate_size": 13824, "num_hidden_layers": 48, "num_attention_heads": 40,
              "num_key_value_heads": 8, "vocab_size": 152064, "max_position_embeddings": 131072,
              "rope_scaling": None, "tie_word_embeddings": False, "_name_or_path": "Qwen/Qwen2.5-14B"}


def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def test_hf_config_without_seq_length_simulates_4096_tokens_and_says_so(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(QWEN25_14B))
    # the issue: Qwen2.5-14B ran at s = 131,072 and reported 1.14 TiB, DOES NOT FIT
    code, out, err = _cli(["estimate", "--hf-config", cfg, "--gpu", "h100-sxm", "--nodes", "2", "--tp", "8",
                           "--global-batch-size", "16"])
    assert code == 0 and HF_SEQ_LENGTH == 4096
    assert out.splitlines()[0].endswith("s=4096") and ": fits" in out
    assert err.strip() == (f"trainsim: note: --hf-config {cfg}: seq_length 4096 (the default for a config that names "
                           "no training length; it allows 131,072); --seq-length sets another")
    code, out, err = _cli(["estimate", "--hf-config", cfg, "--seq-length", "8192", "--gpu", "h100-sxm", "--nodes", "2",
                           "--tp", "8", "--global-batch-size", "16"])
    assert out.splitlines()[0].endswith("s=8192") and err == ""


@pytest.mark.parametrize("extra, want", [
    ({}, (4096, "the default for a config that names no training length; it allows 131,072")),
    ({"seq_length": 8192}, (8192, "the config's seq_length")),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}},
     (8192, "the config's rope_scaling.original_max_position_embeddings")),
    ({"max_position_embeddings": 2048}, (2048, "the config's position limit, below the default 4096")),
])
def test_the_training_length_a_config_names_comes_first(extra, want):
    cfg = {**QWEN25_14B, **extra}
    assert training_seq_length(cfg, cfg["max_position_embeddings"]) == want
    assert model_from_hf_config(cfg).seq_length == want[0]
    assert model_from_hf_config(cfg, seq_length=1024).seq_length == 1024


def test_gpt2_keeps_its_context_of_1024():
    cfg = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024, "n_ctx": 1024,
           "vocab_size": 50257}
    assert model_from_hf_config(cfg).seq_length == 1024


SMALL = ["--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "8", "--vocab-size", "8192",
         "--seq-length", "1024", "--gpu", "h100-sxm", "--gpus", "2", "--global-batch-size", "4"]
# 200 layers of h=8192 on one GPU: ~160B parameters, far past 80 GB
HUGE = ["--num-layers", "200", "--hidden-size", "8192", "--num-attention-heads", "64", "--vocab-size", "8192",
        "--seq-length", "1024", "--gpu", "h100-sxm", "--gpus", "1", "--global-batch-size", "1"]


@pytest.mark.parametrize("command", ["estimate", "run"])
def test_a_plan_that_does_not_fit_exits_1_and_still_prints(command):
    code, out, err = _cli([command, *SMALL])
    assert code == 0 and "DOES NOT FIT" not in out
    extra = ["--fidelity", "reduced"] if command == "run" else []
    code, out, err = _cli([command, *HUGE, *extra])
    assert code == 1 and "DOES NOT FIT" in out and err == ""
    code, out, _ = _cli([command, *HUGE, *extra, "--json"])
    assert code == 1 and json.loads(out)["fits"] is False


def test_compare_exits_1_only_when_no_plan_fits():
    code, out, _ = _cli(["compare", *SMALL, "--zero-stages", "0,3"])
    assert code == 0 and "* best" in out
    code, out, _ = _cli(["compare", *HUGE, "--zero-stages", "0,1", "--fidelity", "reduced"])
    assert code == 1 and "no plan fits in GPU memory" in out


def test_a_parameter_at_its_bound_is_named():
    assert at_bound(1.0, 0.6, 1.0) == "high" and at_bound(0.99999, 0.6, 1.0) == "high"
    assert at_bound(0.6, 0.6, 1.0) == "low" and at_bound(0.9332, 0.6, 1.0) is None
