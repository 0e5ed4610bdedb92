"""``trainsim fit``: a profile fitted to measured runs (sim.calibrate.fit_runs, runs_csv).

The measured times here are made by the simulator itself with a profile whose
parameters were moved away from the preset's, so the fit has a known answer; the
held-out predictions are checked against fits the test makes on files without the group.
"""

import contextlib
import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import sim
from sim.calibrate.fit_runs import (DEFAULT_PARAMETERS, TOLERANCE, Simulations, choose_parameters, fit, fit_runs,
                                    group_weights, mean_abs, parameter, prepare_rows, start_value)
from sim.calibrate.runs_csv import read_runs
from sim.cli import main
from sim.errors import InputError
from sim.inputs.hardware import load_profile

PUBLISHED = Path("/work/shared/fit-data/published_runs.csv")
COLUMNS = ["source", "gpu", "precision", "gpus", "num_layers", "hidden_size", "num_attention_heads", "vocab_size",
           "seq_length", "activation", "tensor_model_parallel_size", "pipeline_model_parallel_size",
           "sequence_parallel", "global_batch_size", "needs", "measured_iteration_time_s"]
# Four small models (groups), two sizes each: 8-32 GPUs, a few layers.
MODELS = {
    "a": dict(num_layers=4, hidden_size=1024, num_attention_heads=16, vocab_size=32000, seq_length=1024,
              activation="gelu", tensor_model_parallel_size=2, pipeline_model_parallel_size=2),
    "b": dict(num_layers=4, hidden_size=2048, num_attention_heads=16, vocab_size=32000, seq_length=2048,
              activation="gelu", tensor_model_parallel_size=4, pipeline_model_parallel_size=1),
    "c": dict(num_layers=8, hidden_size=512, num_attention_heads=8, vocab_size=32000, seq_length=4096,
              activation="swiglu", tensor_model_parallel_size=1, pipeline_model_parallel_size=2),
    "d": dict(num_layers=4, hidden_size=1536, num_attention_heads=12, vocab_size=50304, seq_length=2048,
              activation="gelu", tensor_model_parallel_size=2, pipeline_model_parallel_size=1),
}
TRUTH = {"sustained_compute_fraction": 0.80, "attention_max_efficiency": 0.55}


def _rows(models, truth_profile: Path, noise: float = 0.0, sizes=(8, 32)):
    """Rows of ``models`` at ``sizes`` GPUs, timed by the simulator on ``truth_profile``
    (times the row's 1 + noise x (+1, -1, ...))."""
    rows = []
    for name in models:
        m = MODELS[name]
        for gpus in sizes:
            settings = {k: v for k, v in m.items() if k != "activation"}
            dp = gpus // (m["tensor_model_parallel_size"] * m["pipeline_model_parallel_size"])
            r = sim.run(**settings, swiglu=m["activation"] == "swiglu", gpus=gpus, global_batch_size=4 * dp,
                        gpu=str(truth_profile), fidelity="reduced")
            sign = 1 if len(rows) % 2 == 0 else -1
            rows.append({"source": f"test {name}", "gpu": "a100-80gb", "precision": "bf16", "gpus": gpus, **m,
                         "sequence_parallel": "false",
                         "global_batch_size": 4 * dp, "needs": "",
                         "measured_iteration_time_s": repr(r.iteration_time_s * (1 + sign * noise))})
    return rows


def _write(path: Path, rows, columns=COLUMNS) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def truth(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fit") / "truth.json"
    replace(load_profile("a100-80gb"), **TRUTH).save(path)
    return path


def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_fit_recovers_the_parameters_the_runs_were_made_with(truth, tmp_path):
    rows = _rows("abc", truth)
    extra = [dict(rows[0], gpu="h100-sxm"), dict(rows[1], needs="fp8", precision="fp8")]
    data = _write(tmp_path / "runs.csv", rows + extra)
    out = tmp_path / "fitted.json"
    code, stdout, _ = _cli(["fit", str(data), "--gpu", "a100-80gb", "--out", str(out), "--json"])
    assert code == 0
    report = json.loads(stdout)
    # 3 groups: the first 2 of the default set
    assert [p["name"] for p in report["parameters"]] == list(DEFAULT_PARAMETERS[:2]) == list(TRUTH)
    for p in report["parameters"]:
        assert p["fitted"] == pytest.approx(TRUTH[p["name"]], rel=0.02)
    assert report["initial_mean_abs_error"] > 0.05 and report["mean_abs_error"] < 0.002
    assert report["loo_mean_abs_error"] < 0.01  # the data are exactly the model's: held-out predicts them too
    assert report["by_gpu"]["a100-80gb"]["loo_mean_abs_error"] == report["loo_mean_abs_error"]
    assert report["left_out"] == [{"line": 8, "gpu": "h100-sxm"}]
    assert report["skipped"] == [{"line": 9, "reason": "precision fp8: GPU a100-80gb has no fp8 peak"}]
    assert len(report["rows"]) == 6 and {r["group"] for r in report["rows"]} == {"g1", "g2", "g3"}
    fitted = load_profile(out)
    assert fitted.name == "a100-80gb" and fitted.sustained_compute_fraction == report["parameters"][0]["fitted"]
    assert report["data_sha256"] in fitted.sources["sustained_compute_fraction"]
    assert "leave-one-group-out" in fitted.sources["attention_max_efficiency"]
    assert fitted.provenance["fit"]["parameters"] == {p["name"]: p["fitted"] for p in report["parameters"]}
    assert fitted.peak_flops == load_profile("a100-80gb").peak_flops
    code, text, _ = _cli(["fit", str(data), "--gpu", "a100-80gb"])  # the table, from the cache of nothing
    assert code == 0 and "held out" in text and "left out (other GPUs): h100-sxm: lines 8" in text


def test_held_out_prediction_is_a_fit_without_the_group(truth, tmp_path):
    rows = _rows("abc", truth, noise=0.03)
    data = _write(tmp_path / "runs.csv", rows)
    names = ["sustained_compute_fraction"]  # one parameter: the file without a group keeps two groups
    report = fit_runs(data, "a100-80gb", names)
    group = report["groups"][1]
    left = [r for r, row in zip(rows, report["rows"]) if row["group"] != group["id"]]
    alone = fit_runs(_write(tmp_path / "without.csv", left), "a100-80gb", names)
    values = {p["name"]: p["fitted"] for p in alone["parameters"]}
    # the same minimum: the file without the group fits from the profile, the held-out fit from the fit on every
    # row (what its rows see), so the two stop within the fit's own tolerance of each other
    assert values == pytest.approx(group["held_out_fit"], rel=TOLERANCE)
    values = group["held_out_fit"]
    assert values != pytest.approx({p["name"]: p["fitted"] for p in report["parameters"]}, rel=1e-4)
    profile = tmp_path / "without.json"
    replace(load_profile("a100-80gb"), **values).save(profile)
    for r, row in zip(rows, report["rows"]):
        if row["group"] == group["id"]:
            m = MODELS[r["source"].split()[-1]]
            settings = {k: v for k, v in m.items() if k != "activation"}
            t = sim.run(**settings, swiglu=m["activation"] == "swiglu", gpus=r["gpus"],
                        global_batch_size=r["global_batch_size"], gpu=str(profile), fidelity="reduced")
            assert row["held_out_s"] == pytest.approx(t.iteration_time_s, rel=1e-9)
            assert row["held_out_error"] == pytest.approx(row["held_out_s"] / row["measured_s"] - 1, rel=1e-12)


@pytest.mark.parametrize("cell, value, expected", [
    ("tensor_model_parallel_size", "two", "line 3: column tensor_model_parallel_size: got 'two'; expected an integer"),
    ("measured_iteration_time_s", "-1", "line 3: column measured_iteration_time_s: got '-1'; expected a number"),
    ("activation", "relu", "line 3: column activation: got 'relu'; allowed: gelu, swiglu, squared-relu"),
    ("gpus", "", "line 3: column gpus: got ''; a run needs it"),
])
def test_a_bad_cell_is_one_line_naming_row_column_value(tmp_path, cell, value, expected):
    row = {"source": "s", "gpu": "a100-80gb", "precision": "bf16", "gpus": 8, **MODELS["a"], "sequence_parallel": "",
           "global_batch_size": 8, "needs": "", "measured_iteration_time_s": "1.0"}
    data = _write(tmp_path / "runs.csv", [row, dict(row, **{cell: value})])
    out = tmp_path / "fitted.json"
    code, stdout, err = _cli(["fit", str(data), "--gpu", "a100-80gb", "--out", str(out)])
    assert code == 2 and stdout == "" and not out.exists()
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err


def test_unknown_columns_and_too_many_parameters_are_refused(tmp_path):
    row = {"source": "s", "gpu": "a100-80gb", "precision": "bf16", "gpus": 8, **MODELS["a"], "sequence_parallel": "",
           "global_batch_size": 8, "needs": "", "measured_iteration_time_s": "1.0"}
    data = _write(tmp_path / "bad.csv", [dict(row, tflops="150")], COLUMNS + ["tflops"])
    code, _, err = _cli(["fit", str(data), "--gpu", "a100-80gb"])
    assert code == 2 and "line 1: unknown column 'tflops'" in err
    rows = [dict(row, source=f"s{k}", hidden_size=512 * (k + 1)) for k in range(3)]  # 3 groups
    data = _write(tmp_path / "runs.csv", rows)
    out = tmp_path / "fitted.json"
    code, _, err = _cli(["fit", str(data), "--gpu", "a100-80gb", "--out", str(out),
                         "--params", "gemm_max_efficiency,memory_efficiency,kernel_launch_s"])
    assert code == 2 and "3 parameters" in err and "3 groups" in err and "at most 2" in err and not out.exists()
    code, _, err = _cli(["fit", str(data), "--gpu", "a100-80gb", "--params", "peak_flops"])
    assert code == 2 and "--params: got 'peak_flops'; allowed: sustained_compute_fraction, gemm_max_efficiency" in err
    (tmp_path / "d.json").mkdir()
    code, _, err = _cli(["fit", str(data), "--gpu", "a100-80gb", "--out", str(tmp_path / "d.json")])  # before any work
    assert code == 2 and "--out" in err and "it is a directory" in err
    with pytest.raises(InputError, match="at least 2"):
        choose_parameters(None, 1)
    assert [p.path for p in choose_parameters(None, 9)[0]] == list(DEFAULT_PARAMETERS)


@pytest.mark.skipif(not PUBLISHED.exists(), reason="the shared fit data are not here")
def test_the_published_runs_read_into_groups():
    runs = read_runs(PUBLISHED)
    a100 = {r.group for r in runs if r.gpu == "a100-80gb" and not r.skip}
    h100 = {r.group for r in runs if r.gpu == "h100-sxm" and not r.skip}
    assert len(a100) == 2 and len(h100) == 5  # GPT-3 in BF16 and in FP8, Nemotron-4, Llama 3.1 8B and 405B (cp 2)
    assert not [r for r in runs if r.skip]                    # every row is simulated now
    cp = [r for r in runs if r.values.get("context_parallel_size") == 2]
    assert len(cp) == 8                                       # Llama 3.1 8B (5 rows) and 405B (3)
    fp8 = [r for r in runs if r.group[1] == "fp8"]
    assert len(fp8) == 5 and all(r.values["fp8_format"] == "hybrid" and not r.skip for r in fp8)
    nemotron = next(r for r in runs if r.values["hidden_size"] == 18432)
    assert nemotron.values["num_query_groups"] == 8 and nemotron.values["group_query_attention"]
    assert nemotron.values["sequence_parallel"] is True and "sequence_parallel" in nemotron.filled
    # the benchmark's own configuration (dgxc-benchmarking v25.02 nemotron4-340b-synth.yaml) recomputes the core
    # attention: the source's setting, not the general blank default, and no other source takes it
    assert nemotron.values["recompute_granularity"] == "selective" and "recompute_granularity" not in nemotron.filled
    assert {r.values["recompute_granularity"] for r in runs if "recompute_granularity" in r.filled} == {"none"}
    assert all("recompute_granularity" in r.filled for r in runs if r.source.startswith("NVIDIA/dgxc")
               and "Nemotron" not in r.source)
    # Llama 3.1 as the benchmark configures it (llama3.1_8b.yaml, llama3.1_405b.yaml), not Megatron-LM's GPT defaults;
    # the loss fused where the configuration says so (Llama 3.1, Nemotron-4), not for GPT-3 175B
    llama = [r for r in runs if "Llama 3.1" in r.source]
    assert len(llama) == 8 and all(r.values["normalization"] == "RMSNorm" and r.values["position_embedding_type"] == "rope"
                                   and r.values["disable_bias_linear"] and r.values["untie_embeddings_and_output_weights"]
                                   and r.values["hidden_dropout"] == 0.0 for r in llama)
    fused = {r.values.get("cross_entropy_loss_fusion", False) for r in runs if "GPT-3" in r.source or "175b" in r.source}
    assert fused == {False}
    assert all(r.values["cross_entropy_loss_fusion"] for r in runs if "Llama 3.1" in r.source or "Nemotron" in r.source)
    # Transformer Engine's TP overlap where the configuration turns it on (gpt3_175b_hydra.yaml, Nemotron's
    # configure.sh, llama3.1_405b.yaml: ub_tp_comm_overlap true), not for Llama 3.1 8B (tp 1, false) or the A100 paper
    overlapped = {r.values["num_layers"] for r in runs if r.values.get("tp_comm_overlap")}
    assert overlapped == {96, 126}  # GPT-3 175B and Nemotron-4 340B (96 layers), Llama 3.1 405B (126)
    assert len([r for r in runs if r.values.get("tp_comm_overlap")]) == 18
    assert all(r.values["sequence_parallel"] for r in runs if r.values.get("tp_comm_overlap"))
    assert not [r for r in runs if r.gpu == "a100-80gb" and r.values.get("tp_comm_overlap")]
    # every DGX Cloud benchmark shards the optimizer (distributed_fused_adam, overlap_param_sync true): ZeRO-1 with
    # the parameter gather overlapped; the 2021 paper's Megatron-LM had no distributed optimizer
    sharded = [r for r in runs if r.values.get("zero") == 1 and r.values.get("overlap_param_gather")]
    assert len(sharded) == 23 and {r.gpu for r in sharded} == {"h100-sxm"}
    assert not [r for r in runs if r.gpu == "a100-80gb" and r.values.get("zero")]
    # the SC'21 paper's scripts (Megatron-LM examples/sc21): interleaved, 2 layers per virtual stage for 175B
    # (pp 12: 4 chunks a rank), 1 for 530B (pp 35: 3 chunks); local DDP, reduced after backward, in fp32
    a100_rows = [r for r in runs if r.gpu == "a100-80gb"]
    assert {(r.values["num_layers"], r.values["num_layers_per_virtual_pipeline_stage"]) for r in a100_rows} == {
        (96, 2), (105, 1)}
    assert all(r.values["overlap_grad_reduce"] is False and r.values["accumulate_allreduce_grads_in_fp32"]
               and "num_virtual_stages_per_pipeline_rank" not in r.filled for r in a100_rows)
    assert not [r for r in runs if r.gpu != "a100-80gb" and ("accumulate_allreduce_grads_in_fp32" in r.values
                                                             or "overlap_grad_reduce" in r.values)]


def test_a_cell_beats_its_source_setting_and_the_source_beats_the_blank(tmp_path):
    cells = dict(MODELS["a"], source="DGX Cloud Nemotron-4 340B rerun", gpu="a100-80gb", precision="bf16", gpus=8,
                 sequence_parallel="false", global_batch_size=8, needs="", measured_iteration_time_s="1.0")
    rows = [cells, dict(cells, recompute_granularity="full")]
    runs = read_runs(_write(tmp_path / "runs.csv", rows, COLUMNS + ["recompute_granularity"]))
    assert runs[0].values["recompute_granularity"] == "selective" and "recompute_granularity" not in runs[0].filled
    assert runs[1].values["recompute_granularity"] == "full"


def test_parameters_are_profile_fields_by_dotted_path():
    from sim.calibrate.fit_runs import PARAMETERS, get_value, with_values

    base = load_profile("h100-sxm")
    ib = parameter("links.ib.efficiency")
    moved = with_values(base, [ib, parameter("kernel_launch_s")], [0.7, 5e-6])
    assert get_value(moved, "links.ib.efficiency") == 0.7 and moved.kernel_launch_s == 5e-6
    assert moved.links["nvlink"] == base.links["nvlink"] and base.links["ib"].efficiency != 0.7
    for p in PARAMETERS:  # every bound is physical and every preset value can start a fit
        assert p.low < p.high and p.low >= 0 and p.why
        assert p.low <= start_value(base, p) <= p.high
    unset = replace(base, framework_kernel_efficiency=None)
    assert start_value(unset, parameter("framework_kernel_efficiency")) == pytest.approx((0.30 + 0.95) / 2)


def test_workers_give_the_same_report(truth, tmp_path):
    # Each simulation is deterministic: two worker processes simulating rows at once give
    # the report one process gives, but for the seconds taken.
    data = _write(tmp_path / "runs.csv", _rows("ab", truth))
    reports = []
    for jobs in ("1", "2"):
        code, stdout, _ = _cli(["fit", str(data), "--gpu", "a100-80gb", "--json", "--jobs", jobs])
        assert code == 0
        report = json.loads(stdout)
        report.pop("wall_s")
        reports.append(report)
    assert reports[0] == reports[1] and reports[0]["simulations"] > len(reports[0]["rows"])
    code, _, err = _cli(["fit", str(data), "--gpu", "a100-80gb", "--jobs", "0"])
    assert code == 2 and err.strip().splitlines()[-1].endswith("--jobs: got 0; expected an integer >= 1")


def test_fit_recovers_the_gpu_speed_spread_from_runs_of_two_sizes(tmp_path):
    # the spread shows only in how a model's step grows from 8 to 512 GPUs (the slowest of
    # more GPUs is slower: e(8) = 1.42, e(512) = 3.04), the fraction in its level. The fit on
    # every row only (the held-out refits are the other tests' business; here they would
    # triple the time for nothing the recovery depends on)
    truth = {"sustained_compute_fraction": 0.80, "gpu_speed_spread": 0.03}
    path = tmp_path / "truth.json"
    replace(load_profile("a100-80gb"), **truth).save(path)
    runs = read_runs(_write(tmp_path / "runs.csv", _rows("ab", path, sizes=(8, 512))))
    params = [parameter(name) for name in truth]
    base = load_profile("a100-80gb")
    sims = Simulations(base, params, prepare_rows(runs, "a100-80gb"))
    measured = [r.measured_s for r in runs]
    rows = list(range(len(runs)))
    result = fit(sims, rows, measured, group_weights([r.group for r in runs]), [start_value(base, p) for p in params])
    for p, v in zip(params, result.values):
        assert v == pytest.approx(truth[p.path], rel=0.02)
    errors = [t / m - 1 for t, m in zip(sims.times(rows, result.values), measured)]
    assert max(abs(e) for e in errors) < 0.002


MOE_RUNS = Path(__file__).resolve().parent.parent / "experiments" / "fit-data" / "moe_runs.csv"


def test_the_moe_runs_read_with_their_presets_and_fsdp_plans():
    # rows M1-M4 of ../shared/fit-data/more-sources-2026-12-03.md (NeMo AutoModel, FSDP2 + EP)
    runs = read_runs(MOE_RUNS)
    assert [(r.values["model"], r.values["gpus"], r.measured_s) for r in runs] == [
        ("deepseek-v3", 256, 8.18), ("deepseek-v3", 1024, 37.87), ("kimi-k2", 256, 8.86), ("qwen3-30b-a3b", 8, 21.773)]
    assert all(r.values["zero"] == 3 and r.values["moe_routing"] == "round-robin" and r.gpu == "h100-sxm"
               and r.values["placement"] == "tp-dp-pp" and not r.skip
               and r.values["recompute_granularity"] == "full" and r.framework == "automodel" for r in runs)
    # one group per model from the source: DeepSeek-V3's two sizes together
    assert runs[0].group == runs[1].group and len({r.group for r in runs}) == 3
    # no shape column took a blank's default: the preset has the shape
    assert not {"activation", "num_query_groups", "ffn_hidden_size"} & {c for r in runs for c in r.filled}
    plans = [p.plan for p in prepare_rows(runs, "h100-sxm")]
    # dp = GPUs / pp; micro-batches per rank = GBS / dp (the source's LBS / MBS); edp = dp / ep
    assert [(p.dp, p.ep, p.vpp, p.num_microbatches, p.dp // p.ep) for p in plans] == [
        (64, 64, 8, 8, 1), (256, 64, 8, 32, 4), (32, 32, 4, 16, 1), (8, 8, 1, 16, 1)]
    assert [sum(p.stage_layers(prepare_rows([r], "h100-sxm")[0].model)) for p, r in zip(plans, runs)] == [61, 61, 61, 48]


FSDP_RUNS = MOE_RUNS.parent / "fsdp_runs.csv"


def test_the_fsdp_and_nemotron_runs_read_as_their_sources_ran_them():
    # rows F4-F10, F15 and D1-D4 of ../shared/fit-data/more-sources-2026-12-03.md; step times from
    # tokens/s/GPU where the source prints only that: GBS x seq / (tokens/s/GPU x GPUs)
    runs = read_runs(FSDP_RUNS)
    derived = {2: 64 * 8192 / (2973 * 64), 3: 64 * 8192 / (331 * 64), 4: 48 * 2048 / (10643 * 8),
               5: 128 * 2048 / (4800 * 64), 6: 1024 * 2048 / (23422 * 128), 7: 2048 * 2048 / (1039 * 64),
               8: 96 * 2048 / (4641 * 8)}
    for r in runs:
        if r.line in derived:
            assert r.measured_s == pytest.approx(derived[r.line], rel=2e-4)
    # FULL_SHARD and FSDP2 are zero 3, SHARD_GRAD_OP zero 3 kept from forward to backward; Megatron's distributed
    # optimizer zero 1; each row names its framework, and the rows that ran otherwise than their framework's
    # defaults say how
    zero = {r.line: r.values["zero"] for r in runs}
    assert zero == {2: 3, 3: 3, 4: 3, 5: 3, 6: 3, 7: 3, 8: 3, 9: 3, 10: 1, 11: 1, 12: 1, 13: 1}
    assert {r.line for r in runs if r.values.get("reshard_after_forward") is False} == {6}
    assert {r.line: r.framework for r in runs} == {2: "torchtitan", 3: "torchtitan", 4: "llm-foundry", 5: "llm-foundry",
                                                  6: "llm-foundry", 7: "llm-foundry", 8: "llm-foundry", 9: "automodel",
                                                  10: "megatron", 11: "megatron", 12: "megatron", 13: "megatron"}
    assert {r.line: r.values["attention_kernel"] for r in runs if "attention_kernel" in r.values} == {9: "fa2"}
    # MPT-7B's published parameter count (NumParams 6,658,859,008 at 2048 tokens) with the source's settings
    mpt7 = prepare_rows([r for r in runs if r.line == 4], "h100-sxm")[0]
    assert mpt7.model.num_params == 6_658_859_008
    # Nemotron-4 15B takes its architecture from its source (rotary, no biases, untied, squared ReLU as GeLU's shapes)
    d1 = next(r for r in runs if r.line == 10)
    assert d1.values["position_embedding_type"] == "rope" and d1.values["tp_comm_overlap"] is True
    assert next(r for r in runs if r.line == 13).values.get("tp_comm_overlap") is not True  # v25.05: not stated
    assert next(r for r in runs if r.line == 2).skip  # torchtitan's selective op recompute is not modelled
    # grouped by model, source and precision: torchtitan 8B and 70B, four MPT sizes on H100 and one on A100,
    # AutoModel's 70B, Nemotron-4 15B's v25.02 BF16 (16 and 2,048 GPUs together) and FP8, and v25.05
    assert len({r.group for r in runs}) == 11
    assert next(r for r in runs if r.line == 10).group == next(r for r in runs if r.line == 11).group


def test_a_row_needs_a_preset_or_its_shape(tmp_path):
    head = ["source", "gpu", "gpus", "model", "num_layers", "hidden_size", "num_attention_heads", "vocab_size",
            "seq_length", "global_batch_size", "measured_iteration_time_s"]
    ok = {"source": "s", "gpu": "a100-80gb", "gpus": 8, "model": "llama3-8b", "global_batch_size": 8,
          "measured_iteration_time_s": "1.0"}
    (run,) = read_runs(_write(tmp_path / "a.csv", [ok], head))
    assert run.values["model"] == "llama3-8b" and "num_layers" not in run.values and run.label() == "llama3-8b, 8 GPUs"
    with pytest.raises(InputError, match=r"line 2: column num_layers: got ''; a run needs it unless the model column "
                                         r"names a preset"):
        read_runs(_write(tmp_path / "b.csv", [dict(ok, model="")], head))
    short = ["source", "gpu", "gpus", "model", "global_batch_size", "measured_iteration_time_s"]
    assert read_runs(_write(tmp_path / "c.csv", [ok], short))[0].values["model"] == "llama3-8b"
    with pytest.raises(InputError, match=r"line 1: missing column 'num_layers'"):
        read_runs(_write(tmp_path / "d.csv", [{k: v for k, v in ok.items() if k != "model"}],
                         [c for c in short if c != "model"]))


def test_several_files_fit_as_one_table(truth, tmp_path):
    rows = _rows("ab", truth, sizes=(8,))
    one = _write(tmp_path / "one.csv", rows)
    cache = tmp_path / "cache.jsonl"
    names = ["sustained_compute_fraction"]  # 2 groups: one parameter
    whole = fit_runs(one, "a100-80gb", names, cache=cache)
    first, second = _write(tmp_path / "a.csv", rows[:1]), _write(tmp_path / "b.csv", rows[1:] + [
        dict(rows[1], gpu="h100-sxm")])
    split = fit_runs([first, second], "a100-80gb", names, cache=cache)
    assert split["simulations"] == 0       # the same rows: every time comes from the cache (keyed by row, not line)
    assert split["parameters"] == whole["parameters"]
    assert [r["fitted_s"] for r in split["rows"]] == [r["fitted_s"] for r in whole["rows"]]
    assert [(r["file"], r["line"]) for r in split["rows"]] == [(str(first), 2), (str(second), 2)]
    assert split["left_out"] == [{"line": 3, "file": str(second), "gpu": "h100-sxm"}]
    assert split["data"] == f"{first}, {second}" and "file" not in whole["rows"][0]
    code, text, _ = _cli(["fit", str(first), str(second), "--gpu", "a100-80gb", "--cache", str(cache)])
    assert code == 0 and "left out (other GPUs): h100-sxm: lines b.csv:3" in text and "\na.csv:2 " in text
    bad = _write(tmp_path / "c.csv", [dict(rows[0], gpus="")])
    code, _, err = _cli(["fit", str(first), str(bad), "--gpu", "a100-80gb"])
    assert code == 2 and f"{bad}: line 2: column gpus" in err and err.count("\n") == 1


def test_scale_floor_is_the_least_error_one_scale_leaves():
    from sim.calibrate.fit_runs import scale_floor

    # two rows, the model 25% further over one than the other: at best one is right, the other 20% off
    assert scale_floor([1.0, 1.25]) == (pytest.approx(0.2), pytest.approx(0.8))
    assert scale_floor([1.1]) == (0.0, pytest.approx(1 / 1.1))
    # three: the scale that puts the middle one right, |0.9/1.0 - 1| + |1.2/1.0 - 1| = 0.3 (at the others: 0.4, 0.5)
    assert scale_floor([0.9, 1.0, 1.2])[0] == pytest.approx(0.3)
    with pytest.raises(ValueError):
        scale_floor([1.0, 0.0])


def test_a_job_measured_twice_apart_is_reported_with_the_error_it_leaves(truth, tmp_path):
    # The same run from a second source, measured 25% slower: one simulation times both rows, so whatever
    # the fit does the model's time over the measured one differs by 25% between them, and the pair keeps
    # at least 1 - 1/1.25 = 20% of |error| between its two rows.
    rows = _rows("ab", truth, sizes=(8,))
    again = dict(rows[0], source="test a again",
                 measured_iteration_time_s=repr(1.25 * float(rows[0]["measured_iteration_time_s"])))
    data = _write(tmp_path / "runs.csv", rows + [again])
    report = fit_runs(data, "a100-80gb", ["sustained_compute_fraction"])
    (job,) = report["same_job"]
    assert job["lines"] == [2, 4] and "8 GPUs" in job["job"]
    assert job["spread"] == pytest.approx(0.25) and job["floor_abs_error_sum"] == pytest.approx(0.2)
    assert report["same_job_floor"] == pytest.approx(0.2 / 3)
    fitted = [abs(r["fitted_error"]) for r in report["rows"]]
    assert fitted[0] + fitted[2] >= 0.2 - 1e-9   # the fit itself cannot do better on the pair
    code, text, _ = _cli(["fit", str(data), "--gpu", "a100-80gb", "--params", "sustained_compute_fraction"])
    assert code == 0 and "  lines 2, 4 (" in text and "25.0% apart, so at least 10.0% mean |error|" in text


def test_the_model_path_gives_the_answers_of_finite_differences_with_fewer_simulations(truth, tmp_path):
    # sim.calibrate.fit_surrogate: the fit on each row's model of time, checked by simulating,
    # against least squares on simulations with finite differences at every step
    data = _write(tmp_path / "runs.csv", _rows("abc", truth, noise=0.03))
    fast, plain = (fit_runs(data, "a100-80gb", None, fast=f) for f in (True, False))
    assert fast["method"] == "model" and plain["method"] == "differences"
    assert [p["name"] for p in fast["parameters"]] == [p["name"] for p in plain["parameters"]] == list(TRUTH)
    # the same minimum within the plain fit's own stopping tolerance (TOLERANCE of each scaled parameter)
    for a, b in zip(fast["parameters"], plain["parameters"]):
        assert a["fitted"] == pytest.approx(b["fitted"], abs=2 * TOLERANCE * (b["high"] - b["low"]))
    # held-out fits on two groups' rows: the same minimum within the plain fit's tolerance too
    # (it stops on the parameters; a row of group b has a kink at the truth, where the model
    # of sim.calibrate.fit_surrogate takes differences at its anchor)
    for a, b in zip(fast["groups"], plain["groups"]):
        for name, v in b["held_out_fit"].items():
            p = parameter(name)
            assert a["held_out_fit"][name] == pytest.approx(v, abs=2 * TOLERANCE * (p.high - p.low))
    for a, b in zip(fast["rows"], plain["rows"]):
        assert a["fitted_error"] == pytest.approx(b["fitted_error"], abs=1e-4)
        assert a["held_out_error"] == pytest.approx(b["held_out_error"], abs=2e-4)
    assert fast["simulations"] < 0.6 * plain["simulations"]  # (52% with the 2026-12-04 A100 preset as start)
    assert fast["model_max_error"] < 1e-3 and plain["model_max_error"] is None
    # the fitted times are simulations at the fitted values, not the model's
    profile = tmp_path / "fitted.json"
    replace(load_profile("a100-80gb"), **{p["name"]: p["fitted"] for p in fast["parameters"]}).save(profile)
    m, row = MODELS["a"], fast["rows"][0]
    t = sim.run(**{k: v for k, v in m.items() if k != "activation"}, swiglu=False, gpus=row["gpus"],
                global_batch_size=4 * (row["gpus"] // 4), gpu=str(profile), fidelity="reduced")
    assert row["fitted_s"] == pytest.approx(t.iteration_time_s, rel=1e-9)


class _ClosedForm:
    """Stands in for ``Simulations``: row i's time is a_i + b_i / f + c_i · launch exactly."""

    def __init__(self, params, coefficients):
        self.params, self.coefficients, self.cache = tuple(params), coefficients, {}

    def seen(self, row, values):
        return tuple(float(v) for v in values)

    def ensure(self, jobs):
        for i, z in jobs:
            a, b, c = self.coefficients[i]
            self.cache.setdefault((i, z), a + b / z[0] + c * z[1])

    def times(self, rows, values):
        jobs = [(i, self.seen(i, values)) for i in rows]
        self.ensure(jobs)
        return [self.cache[j] for j in jobs]


def test_the_model_of_a_row_is_exact_where_time_is_a_plus_b_over_the_fraction():
    # a time linear in 1/fraction and in the launch cost is the model's own form: from the
    # start and one probe per direction it predicts any point exactly, the first solve lands
    # on the minimum, and the second round finds nothing left to move (two evaluations)
    from sim.calibrate.fit_surrogate import Surrogate, fit_rounds

    params = [parameter("sustained_compute_fraction"), parameter("kernel_launch_s")]
    rows = [(1.0, 2.0, 1e4), (0.5, 4.0, 3e4), (2.0, 1.0, 5e3)]
    sims = _ClosedForm(params, rows)
    truth = (0.8, 5e-6)
    measured = [a + b / truth[0] + c * truth[1] for a, b, c in rows]
    sur = Surrogate(sims)
    values, evaluations, _ = fit_rounds(sur, [0, 1, 2], measured, [1.0] * 3, (0.9, 10e-6), [True, True], TOLERANCE)
    assert values == pytest.approx(truth, rel=1e-6) and evaluations == 2
    # per row: the start, a probe along each direction, the one round; its points all on one
    # smooth piece, a row takes no probes at the answer (Surrogate.smooth)
    assert len(sims.cache) == 3 * (1 + 2 + 1)
    point = (0.7, 15e-6)
    for i, (a, b, c) in enumerate(rows):
        assert sur.predict(i, sur.model(i, (0.9, 10e-6)), point) == pytest.approx(a + b / 0.7 + c * 15e-6, rel=1e-12)


def test_a_fit_whose_start_is_within_the_start_tolerance_of_its_minimum_takes_no_round():
    # rows of the model's own form (a + b/f + c·launch), measured at the truth: from the start
    # and one probe per direction the model's minimum is the truth exactly. A start 5e-4 of the
    # fraction's range from it (under START_TOLERANCE, the finite differences' 1e-3) ends there,
    # with the start and its probes simulated and no round; 2e-3 away it takes the one round,
    # which lands on the truth (two evaluations, as from afar)
    from sim.calibrate.fit_runs import START_TOLERANCE
    from sim.calibrate.fit_surrogate import Surrogate, fit_rounds

    params = [parameter("sustained_compute_fraction"), parameter("kernel_launch_s")]
    rows = [(1.0, 2.0, 1e4), (0.5, 4.0, 3e4), (2.0, 1.0, 5e3)]
    truth = (0.8, 5e-6)
    measured = [a + b / truth[0] + c * truth[1] for a, b, c in rows]
    assert START_TOLERANCE == 1e-3
    for away, rounds in ((5e-4, 0), (2e-3, 1)):
        start = (truth[0] + away * 0.4, truth[1])
        sims = _ClosedForm(params, rows)
        values, evaluations, status = fit_rounds(Surrogate(sims), [0, 1, 2], measured, [1.0] * 3, start,
                                                 [True, True], TOLERANCE, START_TOLERANCE)
        assert evaluations == 1 + rounds and len(sims.cache) == 3 * (1 + 2 + rounds)
        if rounds:
            assert values == pytest.approx(truth, rel=1e-9)
            assert status == "the model's minimum is at the last simulated point"
        else:
            assert values == start and status.endswith("of each range of the start: the start")
    # without a start tolerance (the plain default: TOLERANCE) the close start takes its round too
    sims = _ClosedForm(params, rows)
    values, evaluations, _ = fit_rounds(Surrogate(sims), [0, 1, 2], measured, [1.0] * 3,
                                        (truth[0] + 5e-4 * 0.4, truth[1]), [True, True], TOLERANCE)
    assert evaluations == 2 and values == pytest.approx(truth, rel=1e-9)


class _Composed(_ClosedForm):
    """Row i's time is a_i + b_i / f + c_i / (f · e) (GEMMs at the fraction, attention at the
    fraction times its cap, as the simulator composes them), or with ``kink`` the larger of
    that and k_i + m_i / f (a collective that the compute hides until it speeds up)."""

    def __init__(self, params, coefficients, kink=None):
        super().__init__(params, coefficients)
        self.kink = kink or {}

    def time(self, i, z):
        a, b, c = self.coefficients[i]
        t = a + b / z[0] + c / (z[0] * z[1])
        if i in self.kink:
            k, m = self.kink[i]
            t = max(t, k + m / z[0])
        return t

    def ensure(self, jobs):
        for i, z in jobs:
            self.cache.setdefault((i, z), self.time(i, z))


def test_the_model_composes_the_fraction_and_an_efficiency_cap_as_the_simulator_does():
    # t = a + b/f + c/(f·e) is the model's form (basis 1/f and 1/(f·e)): from the start and one
    # probe per direction it predicts a point far away exactly (1/f and 1/e apart miss the
    # cross term c·(1/f - 1/f0)(1/e - 1/e0): for row 1, 3 x 0.3175 x 0.8333 = 0.794 of 12.64)
    from sim.calibrate.fit_surrogate import Surrogate

    params = [parameter("sustained_compute_fraction"), parameter("attention_max_efficiency")]
    rows = [(1.0, 2.0, 1.0), (0.5, 1.0, 3.0)]
    sims = _Composed(params, rows)
    sur = Surrogate(sims)
    start = (0.9, 0.6)
    sims.ensure(sur.probes([0, 1], start))
    point = (0.7, 0.4)
    for i, (a, b, c) in enumerate(rows):
        t = a + b / 0.7 + c / (0.7 * 0.4)
        assert sur.predict(i, sur.model(i, start), point) == pytest.approx(t, rel=1e-12)
    assert not sur.kinked


def test_a_row_with_a_kink_among_its_points_is_modelled_by_differences_at_its_anchor():
    # row 0's time is the larger of 1 + 2/f + 1/(f·e) (compute) and k + 0.5/f (a collective
    # the compute hides while it is slower), k put so that at e = 0.6 they cross at f = 0.896:
    # between the start (f = 0.9, the collective's side) and its probe along f (towards the
    # middle: 0.9 - 0.02 x 0.4 = 0.892), so no one sum of 1/f and 1/(f·e) goes through the
    # start, its probes and a round's point at f = 0.885 (three points fit two slopes exactly:
    # a kink shows from the fourth)
    from sim.calibrate.fit_surrogate import Surrogate

    params = [parameter("sustained_compute_fraction"), parameter("attention_max_efficiency")]
    a, b, c, e, m, fx = 1.0, 2.0, 1.0, 0.6, 0.5, 0.896
    k = a + (b + c / e - m) / fx  # k + m/fx = a + b/fx + c/(fx e)
    sims = _Composed(params, [(a, b, c)], kink={0: (k, m)})
    sur = Surrogate(sims)
    start = (0.9, e)
    sims.ensure(sur.probes([0], start))
    sur.model(0, start)
    assert not sur.kinked
    sims.ensure([(0, (0.885, e))])
    model = sur.model(0, start)
    assert sur.kinked == {0}
    # the anchor is on the collective's piece, and its differences (KINK_STEP of each range:
    # f 0.9 -> 0.8996, e 0.6 -> 0.59957, which slows the compute by 1/0.9 x (1/0.59957 - 1/0.6)
    # = 0.0013 of the gap 3.1667 x (1/0.896 - 1/0.9) = 0.0157) stay on it: t = k + m/f, whose
    # coefficients on 1/f and 1/(f·e) are m and 0
    z0, t0, moved, slope, curve = model
    assert t0 == pytest.approx(k + m / 0.9, rel=1e-15)
    assert slope == pytest.approx([m, 0.0], abs=1e-9)
    assert not curve.any()  # (differences: a straight piece)
    near = (0.91, e + 0.01)  # on the same piece: exact
    assert sur.predict(0, model, near) == pytest.approx(k + m / 0.91, rel=1e-12)


def test_a_round_that_fits_worse_is_stepped_back_from_not_taken():
    # one row, the larger of a collective k + 0.1/f (flat in f) and the compute 1 + 2/f; k = 3.3
    # puts the kink at f = 1.9 / 2.3 = 0.826. Measured at f = 0.7 (compute: 3.857 s); from f =
    # 0.95 (collective: 3.405 s) the model's slope, 0.1 per unit of 1/f, asks for f = 0.18, so
    # the first round lands on the bound 0.6: 4.333 s, squared residual 0.0153 against the
    # start's 0.0137. That round is not taken: half its step, f = 0.775 (3.581 s, 0.0051), is,
    # and its differences (the compute's piece) lead to f = 0.7, where the residual is 0.
    from sim.calibrate.fit_surrogate import Surrogate, fit_rounds

    params = [parameter("sustained_compute_fraction"), parameter("attention_max_efficiency")]
    sims = _Composed(params, [(1.0, 2.0, 0.0)], kink={0: (3.3, 0.1)})
    measured = [sims.time(0, (0.7, 0.6))]
    assert measured[0] == pytest.approx(1 + 2 / 0.7, rel=1e-15)
    sur = Surrogate(sims)
    values, evaluations, status = fit_rounds(sur, [0], measured, [1.0], (0.95, 0.6), [True, False], TOLERANCE)
    assert values[0] == pytest.approx(0.7, abs=TOLERANCE * 0.4) and values[1] == 0.6
    simulated = [z[0] for _, z in sims.cache]
    assert any(f == pytest.approx(0.6, abs=1e-12) for f in simulated)  # the round not taken
    assert any(f == pytest.approx(0.775, abs=1e-12) for f in simulated)  # half its step
    assert status == "the model's minimum is at the last simulated point" and evaluations == 4


def test_a_parameter_that_ends_at_its_bound_is_warned_about(truth, tmp_path):
    # issue 54: `sustained_compute_fraction 0.9332 -> 1 bounds [0.6, 1]` came with no warning. Runs
    # measured 40% faster than any fraction up to 1 allows push the fit onto the upper bound.
    rows = [dict(r, measured_iteration_time_s=repr(float(r["measured_iteration_time_s"]) * 0.6))
            for r in _rows("ab", truth)]
    data = _write(tmp_path / "runs.csv", rows)
    code, stdout, err = _cli(["fit", str(data), "--gpu", "a100-80gb", "--params", "sustained_compute_fraction"])
    assert code == 0
    line = next(x for x in stdout.splitlines() if x.strip().startswith("sustained_compute_fraction"))
    assert line.endswith("bounds [0.6, 1]   <- at its upper bound")
    assert err.startswith("trainsim: warning: sustained_compute_fraction ended at its upper bound (")
    assert len(err.splitlines()) == 1
    code, stdout, err2 = _cli(["fit", str(data), "--gpu", "a100-80gb", "--params", "sustained_compute_fraction",
                               "--json"])
    assert json.loads(stdout)["parameters"][0]["at_bound"] == "high" and err2 == err


def test_rows_of_the_same_settings_share_their_simulations(truth, tmp_path):
    # A run two sources published (the same settings, two measured times): one simulation
    # serves both rows, which get the time a row prepared on its own gets, in one process
    # and in worker processes alike.
    from sim.calibrate.fit_sims import row_time_s, with_values, worker_pool

    rows = _rows("a", truth, sizes=(8,))
    again = dict(rows[0], source="test a again", measured_iteration_time_s=repr(2 * float(rows[0][
        "measured_iteration_time_s"])))
    runs = read_runs(_write(tmp_path / "runs.csv", rows + [again]))
    profile, params = load_profile("a100-80gb"), [parameter("sustained_compute_fraction")]
    prepared = prepare_rows(runs, "a100-80gb")
    assert prepared[0] is prepared[1]
    alone = prepare_rows(runs[:1], "a100-80gb")[0]
    expected = {v: row_time_s(alone, with_values(profile, params, (v,))) for v in (0.7, 0.8)}
    sims = Simulations(profile, params, prepared)
    assert sims.times([0, 1], (0.7,)) == [expected[0.7]] * 2 and sims.count == 1
    with worker_pool(2, "a100-80gb", params, runs, "runs.csv") as pool:
        sims = Simulations(profile, params, prepared, pool)
        sims.ensure([(1, (0.8,)), (0, (0.8,)), (0, (0.7,))])
    assert sims.count == 2
    assert sims.cache == {(1, (0.8,)): expected[0.8], (0, (0.8,)): expected[0.8], (0, (0.7,)): expected[0.7]}


def test_an_efficiency_ends_at_the_profiles_ceiling_and_the_report_says_so(truth, tmp_path):
    # issue 50: the B200 fit of 2026-12-06 put fp8_gemm_max_efficiency at 0.893, above the
    # B200's own best measured FP8 GEMM (0.763). Here the runs were made with attention at
    # 0.55 (TRUTH); the profile fitted says no attention kernel it ran alone beat 0.50, so the
    # fit, whose unconstrained optimum is 0.55, must stop at 0.50 and say that the ceiling set it.
    from sim.calibrate.fit_runs import bound_warning

    data = _write(tmp_path / "runs.csv", _rows("ab", truth))
    base = replace(load_profile(truth), attention_max_efficiency=0.45)
    free, capped = tmp_path / "free.json", tmp_path / "capped.json"
    base.save(free)
    replace(base, efficiency_ceilings={"attention_max_efficiency": 0.50},
            sources={**base.sources, "efficiency_ceilings": "test: a kernel measured alone at 0.50"}).save(capped)
    args = ["--params", "attention_max_efficiency", "--json"]
    code, stdout, err = _cli(["fit", str(data), "--gpu", str(free), *args])
    free_report = json.loads(stdout)
    (p,) = free_report["parameters"]
    assert code == 0 and p["fitted"] == pytest.approx(TRUTH["attention_max_efficiency"], rel=0.01)
    assert (p["ceiling"], p["at_ceiling"], err) == (0.73, False, "")  # a100's own ceiling: above the truth
    code, stdout, err = _cli(["fit", str(data), "--gpu", str(capped), *args])
    report = json.loads(stdout)
    (p,) = report["parameters"]
    assert code == 0
    assert p["fitted"] == pytest.approx(0.50, abs=0.5e-3 * (0.50 - 0.30))  # at the ceiling, within AT_BOUND
    assert (p["high"], p["ceiling"], p["physical_high"]) == (0.50, 0.50, 0.90)
    assert p["at_bound"] == "high" and p["at_ceiling"] is True
    assert p["ceiling_source"] == "test: a kernel measured alone at 0.50"
    assert report["mean_abs_error"] > 10 * free_report["mean_abs_error"]  # the runs ask for more than it gives
    assert err == f"trainsim: warning: {bound_warning(p)}\n" and "ended at its ceiling" in err
    code, text, _ = _cli(["fit", str(data), "--gpu", str(capped), "--params", "attention_max_efficiency"])
    assert "<- at its ceiling (the profile's best measured kernel)" in text


def test_a_start_above_the_ceiling_starts_at_the_ceiling():
    # A profile whose FP8 cap lies above its ceiling (the GB300's fit of 2026-12-06 put it at 0.789, over
    # the GB200's measured 0.723, before the night's refit started from the ceiling): a refit starts
    # from the ceiling, and the parameters without a ceiling keep their bounds.
    from sim.calibrate.fit_runs import bounded, ceiling

    gb300 = replace(load_profile("gb300"), fp8_gemm_max_efficiency=0.789)
    fp8, frac = parameter("fp8_gemm_max_efficiency"), parameter("sustained_compute_fraction")
    assert ceiling(gb300, fp8) == gb300.efficiency_ceilings["fp8_gemm_max_efficiency"] == 0.723
    assert ceiling(gb300, frac) is None
    (b_fp8, b_frac) = bounded(gb300, (fp8, frac))
    assert (b_fp8.low, b_fp8.high) == (fp8.low, 0.723) and b_frac == frac
    assert gb300.fp8_gemm_max_efficiency > 0.723 and start_value(gb300, b_fp8) == 0.723
    b200 = load_profile("b200")  # the bound the 2026-12-06 fit (0.893) went through
    assert bounded(b200, (fp8,))[0].high == pytest.approx(3432.5 / 4500, abs=5e-4)


class _Rows(_ClosedForm):
    """Stands in for ``Simulations`` in ``fit_and_hold_out``: row i's time is a_i + b_i / f (the
    model's own form), plus, with ``bump`` {row: (f, half width, height)}, a tent of that height
    around f (zero outside it), every simulation counted by phase."""

    phase = "fit"

    def __init__(self, params, coefficients, bump=None):
        super().__init__(params, coefficients)
        self.bump, self.phase_count = bump or {}, {}

    def time(self, i, f):
        a, b = self.coefficients[i]
        x, w, h = self.bump.get(i, (0.0, 1.0, 0.0))
        return a + b / f + h * max(0.0, 1.0 - abs(f - x) / w)

    def ensure(self, jobs):
        for i, z in dict.fromkeys(jobs):
            if (i, z) not in self.cache:
                self.cache[(i, z)] = self.time(i, z[0])
                self.phase_count[self.phase] = self.phase_count.get(self.phase, 0) + 1

    def sensitive(self, rows, values):
        return [True] * len(self.params)


def test_a_held_out_row_whose_model_covers_its_point_takes_the_models_time_checked_once():
    # Three groups of two rows, t = a + b/f. From the start (f = 0.8) each row is simulated there,
    # at its probe (f = 0.792) and at the fit's round (near 0.797): held-out fits that land between
    # those points (or within KINK_STEP of them) are covered by the rows' models, which go through
    # them all; on this form the model's time is the simulation's (to rounding). One covered row
    # (the farthest from its simulations) is simulated to check it, the others not at all.
    from sim.calibrate.fit_runs import HELD_OUT_CHECK, fit_and_hold_out

    params = [parameter("sustained_compute_fraction")]
    coefficients = [(1.0, 2.0), (0.5, 2.2), (2.0, 1.0), (1.5, 1.3), (0.3, 3.0), (0.2, 3.1)]
    groups = ["g1", "g1", "g2", "g2", "g3", "g3"]
    # measured at f = 0.797, each group a little off (+0.2%, -0.1%, -0.1%)
    off = {"g1": 1.002, "g2": 0.999, "g3": 0.999}
    measured = [(a + b / 0.797) * off[g] for (a, b), g in zip(coefficients, groups)]
    sims = _Rows(params, coefficients)
    res = fit_and_hold_out(sims, measured, groups, (0.8,))
    values = {g: p.values[0] for g, p in res["per_group"].items()}
    assert all(0.792 < v < 0.8 for v in values.values())
    for i, ((a, b), g) in enumerate(zip(coefficients, groups)):
        assert res["held_out"][i] == pytest.approx(a + b / values[g], rel=1e-12)
    by = res["held_out_by"]
    assert by.count("model") == 5 and by.count("simulation") == 1
    check = by.index("simulation")
    assert res["held_out_check"]["row"] == check
    assert res["held_out_check"]["model_s"] == pytest.approx(res["held_out_check"]["simulated_s"], rel=1e-12)
    assert sims.phase_count["held-out rows"] == 1 and res["model_error"] < HELD_OUT_CHECK
    # the check is the covered row farthest from its other simulations (start, probe, the fit's round)
    gap = {i: min(abs(values[groups[i]] - z[0]) for r, z in sims.cache if r == i and z != (values[groups[i]],))
           for i in range(6)}
    assert check == max(range(6), key=lambda i: (gap[i], -i))

    # a bump the model cannot see (zero at every point simulated before: the fits run as above)
    # at the checked row's held-out point, 0.1% of its time: the check misses by more than
    # HELD_OUT_CHECK, so every held-out row is simulated, and takes its simulation's time
    v = values[groups[check]]
    a, b = coefficients[check]
    sims = _Rows(params, coefficients, bump={check: (v, gap[check] / 2, 1e-3 * (a + b / v))})
    res = fit_and_hold_out(sims, measured, groups, (0.8,))
    assert {g: p.values[0] for g, p in res["per_group"].items()} == values
    assert res["held_out_by"] == ["simulation"] * 6 and sims.phase_count["held-out rows"] == 6
    for i, g in enumerate(groups):
        assert res["held_out"][i] == sims.time(i, values[g])
    assert res["held_out"][check] == pytest.approx((a + b / v) * 1.001, rel=1e-12)
    assert res["model_error"] == pytest.approx(1 - 1 / 1.001, rel=1e-9)  # (its largest |error|)


class _Bent(_Rows):
    """Row i's time is a_i + b_i / f + c_i / f² (compute that goes as 1/f, and a part of the step
    that curves in it), plus, with ``jump`` {row: (f, height)}, that height below f (a plan that
    crosses a threshold: a collective exposed once the compute is slower than it)."""

    def __init__(self, params, coefficients, jump=None):
        super().__init__(params, coefficients)
        self.jump = jump or {}

    def time(self, i, f):
        a, b, c = self.coefficients[i]
        x, h = self.jump.get(i, (0.0, 0.0))
        return a + b / f + c / f ** 2 + (h if f < x else 0.0)


_BENT = [(1.0, 2.0, 0.02), (0.5, 2.2, 0.05), (2.0, 1.0, 0.01), (1.5, 1.3, 0.03), (0.3, 3.0, 0.04), (0.2, 3.1, 0.02)]
_GROUPS = ["g1", "g1", "g2", "g2", "g3", "g3"]


def _bent_measured(coefficients, at=0.797):
    off = {"g1": 1.002, "g2": 0.999, "g3": 0.999}  # each group a little off its fit, as in the test above
    return [(a + b / at + c / at ** 2) * off[g] for (a, b, c), g in zip(coefficients, _GROUPS)]


def test_a_row_curved_in_the_fraction_is_modelled_with_its_curvature_not_simulated_again():
    # t = a + b/f + c/f² curves in 1/f: after the start, its probe (f = 0.8, 0.792) and the fit's
    # round (near 0.797) its three points lie on no straight line in 1/f (row 0's middle point is
    # c x 4.7e-3 x 7.9e-3 = 7.5e-7 s off the chord; the best line misses by 4.9e-7 s, 1.4e-7 of
    # its time, over SMOOTH) but on one parabola, whose bend over the points' span,
    # c x (1.26e-2)² / 4 = 8e-7 s (2.2e-7 of the time), is under CURVED: the row is curved, not kinked. Its model, quadratic in 1/f about the anchor,
    # is this form exactly: no differences are taken, and every held-out row between its points
    # takes the model's time (the one checked: simulated), equal to the row's time at its held-out
    # fraction.
    from sim.calibrate.fit_runs import fit_and_hold_out
    from sim.calibrate.fit_surrogate import CURVED, SMOOTH, Surrogate

    params = [parameter("sustained_compute_fraction")]
    sims = _Bent(params, _BENT)
    res = fit_and_hold_out(sims, _bent_measured(_BENT), _GROUPS, (0.8,))
    assert "differences" not in sims.phase_count
    values = {g: p.values[0] for g, p in res["per_group"].items()}
    for i, g in enumerate(_GROUPS):
        a, b, c = _BENT[i]
        assert res["held_out"][i] == pytest.approx(a + b / values[g] + c / values[g] ** 2, rel=1e-12)
    covered = [i for i, g in enumerate(_GROUPS) if 0.792 - 4e-4 <= values[g] <= 0.8 + 4e-4]
    assert len(covered) >= 4 and res["held_out_by"].count("simulation") == 6 - len(covered) + 1
    assert sims.phase_count["held-out rows"] == 6 - len(covered) + 1
    # the fit on every row: the fraction where the weighted residuals of the simulated times are least
    f = res["full"].values[0]
    sur = Surrogate(sims)
    for i in range(6):
        model = sur.model(i, (f,))
        z0, t0, moved, b, c = model
        a_, b_, c_ = _BENT[i]
        points = sorted(z[0] for r, z in sims.cache if r == i)
        g = [1 / p for p in points]
        line = np.polyfit(g, [a_ + b_ * x + c_ * x * x for x in g], 1)
        miss = max(abs(np.polyval(line, x) - (a_ + b_ * x + c_ * x * x)) for x in g)
        assert SMOOTH * t0 < miss and c_ * (max(g) - min(g)) ** 2 / 4 < CURVED * t0  # curved, within CURVED
        assert c == pytest.approx([c_], rel=1e-6)  # the row's own curvature
        assert sur.predict(i, model, (0.75,)) == pytest.approx(a_ + b_ / 0.75 + c_ / 0.75 ** 2, rel=1e-9)
    assert sur.curved == set(range(6)) and not sur.kinked


def test_a_row_with_a_jump_among_its_points_is_still_simulated():
    # Row 1 as above but 0.5% slower below f = 0.799 (a jump between its start at 0.8 and its probe
    # at 0.792 and round near 0.797): its points lie on no straight line, and the parabola through
    # them bends by about the jump's height, far over CURVED. It is kinked: modelled by differences
    # at its anchor (simulated), and its held-out time simulated, the row's time with the jump.
    from sim.calibrate.fit_runs import fit_and_hold_out

    params = [parameter("sustained_compute_fraction")]
    a, b, c = _BENT[1]
    sims = _Bent(params, _BENT, jump={1: (0.799, 5e-3 * (a + b / 0.8 + c / 0.64))})
    res = fit_and_hold_out(sims, _bent_measured(_BENT), _GROUPS, (0.8,))
    assert sims.phase_count["differences"] >= 1
    assert res["held_out_by"][1] == "simulation"
    v = res["per_group"]["g1"].values[0]
    assert res["held_out"][1] == sims.time(1, v)
    others = [i for i, by in enumerate(res["held_out_by"]) if by == "model"]
    assert others and 1 not in others


@pytest.mark.parametrize("times_curved, shape", [(0.5, "curved"), (2.0, "kinked")])
def test_a_bend_up_to_curved_is_a_curve_and_past_it_a_kink(times_curved, shape):
    # t = 1 + 2/f + c/f² at f = 0.8 (start), 0.792 (its probe) and 0.797 (a round): the parabola
    # through them bends off its chord by c (1/0.792 - 1/0.8)² / 4 over their span; c set so that
    # the bend is half CURVED of the time at the anchor (0.797) (curved: modelled with its
    # curvature, no differences) or twice it (kinked: differences at the anchor, simulated):
    # c D/4 = k CURVED (1 + 2/0.797 + c/0.797²)
    from sim.calibrate.fit_surrogate import CURVED, Surrogate

    params = [parameter("sustained_compute_fraction")]
    d, k = (1 / 0.792 - 1 / 0.8) ** 2, times_curved * CURVED
    c = k * (1 + 2 / 0.797) / (d / 4 - k / 0.797 ** 2)
    sims = _Bent(params, [(1.0, 2.0, c)])
    sims.ensure([(0, (f,)) for f in (0.8, 0.792, 0.797)])
    model = Surrogate(sims).models([0], (0.797,))[0]
    assert (shape == "curved") == ("differences" not in sims.phase_count)
    if shape == "curved":
        assert model[4] == pytest.approx([c], rel=1e-6)
        assert Surrogate(sims).predict(0, model, (0.795,)) == pytest.approx(sims.time(0, 0.795), rel=1e-12)
    else:
        assert sims.phase_count["differences"] == 1 and not model[4].any()


def test_least_absolute_errors_follow_the_rows_that_agree_where_squares_split_the_difference():
    # Four groups of one row, t = b/f, three measured at f = 0.8 and one at 0.65 (a row the
    # model cannot match: its job measured elsewhere 19% slower). A row's relative error at f
    # is f*/f - 1, so least squares (the default loss) puts 1/f at sum(f*)/sum(f*^2):
    # f = (3 x 0.64 + 0.4225) / 3.05 = 0.768033. Least absolute errors put it at the median
    # of 1/f* weighted by f*: 1/0.8 (weight 2.4 against 0.65), f = 0.8, less the soft-L1
    # smoothing (ABSOLUTE_SCALE 0.005: the three rows at 0.8 pulled 1.1e-3 off by the fourth).
    # Held out, least squares moves 0.8's rows to 0.756667 without their own (+5.73% each) and
    # least absolute errors to about 0.8 (the other two 0.8 rows outweigh 0.65): a mean |error|
    # of (3 x 5.73 + 18.75) / 4 = 8.98% against about 4.8%. The row at 0.65 comes out -18.75%
    # both ways.
    from sim.calibrate.fit_runs import fit_and_hold_out

    params = [parameter("sustained_compute_fraction")]
    coefficients = [(0.0, 2.0), (0.0, 1.5), (0.0, 3.0), (0.0, 2.5)]
    truth = [0.8, 0.8, 0.8, 0.65]
    measured = [b / f for (_, b), f in zip(coefficients, truth)]
    groups = ["g1", "g2", "g3", "g4"]
    res = {loss: fit_and_hold_out(_Rows(params, coefficients), measured, groups, (0.9,), loss=loss)
           for loss in ("squares", "absolute")}
    assert res["squares"]["full"].values[0] == pytest.approx(2.3425 / 3.05, abs=1e-4)
    assert abs(res["absolute"]["full"].values[0] - 0.8) < 2e-3
    held = {loss: [t / m - 1 for t, m in zip(r["held_out"], measured)] for loss, r in res.items()}
    assert held["squares"][:3] == pytest.approx([0.8 / (1.7025 / 2.25) - 1] * 3, abs=1e-3)
    assert all(abs(e) < 4e-3 for e in held["absolute"][:3])
    assert held["squares"][3] == pytest.approx(-0.1875, abs=1e-3)
    assert held["absolute"][3] == pytest.approx(-0.1875, abs=3e-3)
    assert mean_abs(held["squares"]) == pytest.approx((3 * (0.8 / (1.7025 / 2.25) - 1) + 0.1875) / 4, abs=1e-3)
    assert mean_abs(held["absolute"]) < 0.05


def test_a_held_out_fit_moves_from_the_answer_only_by_what_its_group_pulls():
    # Three rows t = b/f measured at f = 0.75 and a fourth whose time does not depend on f; the
    # three are 10% slower below f = 0.785 (a kink: a collective exposed once the compute is
    # slower), which the start (0.8) and its probe (0.792) do not see. The model's minimum, 0.75,
    # and half the step to it simulate worse than the start, so the fit ends at 0.8 (their errors
    # 0.75/0.8 - 1 = -6.25%). Leaving out the fourth row's group leaves every residual that
    # depends on f as it was, so its held-out fit is the fit's own answer, 0.8; a solve of the
    # rows' model alone would go to 0.75 whichever group it left out, and put the three rows at
    # 0.825/0.75 - 1 = +10% held out instead of the -6.25% their own fit leaves them.
    from sim.calibrate.fit_runs import fit_and_hold_out

    params = [parameter("sustained_compute_fraction")]
    coefficients = [(0.0, 2.0, 0.0), (0.0, 1.5, 0.0), (0.0, 3.0, 0.0), (5.0, 0.0, 0.0)]
    measured = [2.0 / 0.75, 1.5 / 0.75, 3.0 / 0.75, 5.0]
    sims = _Bent(params, coefficients, jump={i: (0.785, 0.1 * coefficients[i][1] / 0.785) for i in range(3)})
    res = fit_and_hold_out(sims, measured, ["g1", "g2", "g3", "g4"], (0.8,))
    assert res["full"].values == (0.8,) and "worse than the last point" in res["full"].status
    assert res["per_group"]["g4"].values[0] == pytest.approx(0.8, abs=1e-12)
    for g in ("g1", "g2", "g3"):  # the other rows agree: leaving one out moves nothing either
        assert res["per_group"][g].values[0] == pytest.approx(0.8, abs=1e-9)
    held = [t / m - 1 for t, m in zip(res["held_out"], measured)]
    assert held == pytest.approx([0.75 / 0.8 - 1] * 3 + [0.0], abs=1e-9)
