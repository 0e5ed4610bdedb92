"""The B200 rows of the fit data (experiments/fit-data/b200_runs.csv, rows B1-B3, M8 and M9 of
../shared/fit-data/more-sources-2026-12-03.md): their step times from the published
throughput, and the NeMo 25.02 scripts' settings they take from ``BY_SOURCE``."""

from pathlib import Path

import pytest

from sim.calibrate.runs_csv import read_runs

ROOT = Path(__file__).resolve().parent.parent
ROWS = {r.values["model"]: r for r in read_runs(ROOT / "experiments/fit-data/b200_runs.csv")}


@pytest.mark.parametrize("model, gbs, seq, tokens_per_gpu, gpus", [
    ("llama3-8b", 128, 8192, 26006, 8), ("llama3-70b", 128, 8192, 3062, 64), ("llama3-405b", 64, 8192, 625, 128),
    ("mixtral-8x7b", 256, 4096, 15457, 64), ("mixtral-8x22b", 64, 65536, 2232, 256)])
def test_step_time_is_the_tokens_of_a_step_over_the_published_throughput(model, gbs, seq, tokens_per_gpu, gpus):
    r = ROWS[model]
    assert (r.values["global_batch_size"], r.values["seq_length"], r.values["gpus"]) == (gbs, seq, gpus)
    assert r.measured_s == pytest.approx(gbs * seq / (tokens_per_gpu * gpus), rel=5e-5)
    assert r.skip is None and r.gpu == "b200"


def test_rows_take_the_scripts_optimizer_fp8_weights_and_tp_overlap():
    for r in ROWS.values():
        v = r.values
        assert (v["zero"], v["overlap_param_gather"], v["fp8_format"], v["fp8_param_gather"]) == (1, True, "hybrid", True)
        assert v["bucket_size"] == 2 * 128 * 2**20  # 128 Mi parameters of BF16 gradients
        assert v["tp_comm_overlap"] == (v["model"] in ("llama3-70b", "llama3-405b"))
    assert ROWS["mixtral-8x22b"].values["micro_batch_size"] == 1  # the table's swapped GBS/MBS, as the config has it
    assert len({r.group for r in ROWS.values()}) == 5


def test_rows_graph_the_layers_where_the_b200_configs_say_cuda_graphs_1():
    """model_configs_b200.csv @ d3f25b121048: cuda_graphs 1 for the 8B, 70B and 8x7B pre-training rows, 0 for the
    405B and 8x22B; the scripts set ``enable_cuda_graph``, which Megatron-Core 791b70e0 (NeMo 25.02's manifest)
    applies to the whole TransformerLayer: the ``full`` scope."""
    graphed = {m: r.values.get("cuda_graph") for m, r in ROWS.items()}
    assert graphed == {"llama3-8b": "full", "llama3-70b": "full", "llama3-405b": None,
                       "mixtral-8x7b": "full", "mixtral-8x22b": None}
    # the graphed MoE row drops and pads (Megatron-Core graphs an MoE block only with a capacity factor)
    assert ROWS["mixtral-8x7b"].values["moe_expert_capacity_factor"] == 1.0
