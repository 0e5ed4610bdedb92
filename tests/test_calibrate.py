"""Calibration: the fits recover known models, and a real reduced calibration on this
machine writes a profile that ``--gpu`` accepts.

The real run asserts structure and sanity only (sizes swept upwards, fitted numbers
positive, the fitted link bandwidth within a factor of what the largest messages
showed), never this machine's speed.
"""

import json
import time
from dataclasses import replace

import pytest

from sim.calibrate.fit import (
    fit_alpha_beta,
    fit_attention,
    fit_gemm,
    fit_memory,
    ring_coefficients,
)
from sim.calibrate.microbench import grid_gemms, workload_gemms
from sim.cli import main
from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt, preset
from sim.inputs.plan import ParallelPlan


def test_ring_closed_forms_match_reference():
    # REFERENCE.md: all-reduce 2(n-1)(α + S/(nB)); all-gather / reduce-scatter (n-1)(α + S/(nB)).
    n, S, a, B = 8, 1e6, 3e-6, 100e9
    for op, steps in (("all_reduce", 2 * (n - 1)), ("all_gather", n - 1), ("reduce_scatter", n - 1)):
        ca, cb = ring_coefficients(op, n)
        assert ca * a + cb * S / B == pytest.approx(steps * (a + S / (n * B)))
    assert ring_coefficients("send_recv", 2) == (1.0, 1.0)
    with pytest.raises(InputError, match="collective"):
        ring_coefficients("gossip", 4)


def test_alpha_beta_fit_recovers_the_model_from_mixed_ops():
    a, B = 40e-6, 2.5e9
    pts = []
    for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
        n = 2 if op == "send_recv" else 4
        ca, cb = ring_coefficients(op, n)
        pts += [(op, n, s, ca * a + cb * s / B) for s in (4096, 65536, 2**20, 2**24)]
    fit = fit_alpha_beta(pts)
    assert fit["latency_s"] == pytest.approx(a, rel=1e-9)
    assert fit["bandwidth_Bps"] == pytest.approx(B, rel=1e-9)
    assert fit["rms_rel_error"] < 1e-9 and fit["points"] == 16
    with pytest.raises(InputError, match="grow with size"):
        fit_alpha_beta([("all_reduce", 2, 1e3, 2e-3), ("all_reduce", 2, 1e6, 1e-3)])


def test_memory_fit_recovers_launch_and_efficiency():
    launch, rate, copy = 3e-6, 1.5e12, 2.0e12
    recs = [{"bytes": b, "time_s": launch + b / rate} for b in (1e5, 1e6, 1e7, 1e8)]
    fit = fit_memory(recs, copy)
    assert fit["kernel_launch_s"] == pytest.approx(launch, rel=1e-6)
    assert fit["memory_efficiency"] == pytest.approx(rate / copy, rel=1e-6)
    assert fit["hbm_bandwidth_Bps"] == copy and not fit["clipped"]
    fast = fit_memory(recs, rate / 2)  # kernels faster than the copy (cache-resident)
    assert fast["clipped"] and fast["memory_efficiency"] == 1.0
    assert fast["hbm_bandwidth_Bps"] == rate / 2 and fast["kernel_rate_Bps"] == pytest.approx(rate, rel=1e-6)


def test_gemm_and_attention_fits_recover_a_known_profile():
    # Microbenchmarks time kernels alone: the in-step sustained fraction does not apply.
    truth = replace(load_profile("h100-sxm"), gemm_k_overhead=64.0, gemm_max_efficiency=0.7,
                    attention_max_efficiency=0.55, kernel_launch_s=4e-6, sustained_compute_fraction=1.0)
    shapes = grid_gemms((256, 512, 1024, 2048, 4096, 8192)) + [(4096, 12288, 4096, 1, "nt"), (8192, 128, 8192, 1, "tn")]
    recs = [{"m": m, "n": n, "k": k, "batch": b, "flops": 2.0 * m * n * k * b,
             "time_s": 2.0 * m * n * k * b / (truth.peak() * truth.gemm_efficiency(m, n, k, b)) + truth.kernel_launch_s}
            for m, n, k, b, _ in shapes]
    start = replace(truth, gemm_k_overhead=0.0, gemm_max_efficiency=1.0,
                    gemm_tiles=tuple((a, b, 1.0) for a, b, _ in truth.gemm_tiles))
    fit = fit_gemm(recs, start, truth.kernel_launch_s)
    assert fit["gemm_k_overhead"] == 64.0
    assert fit["gemm_max_efficiency"] == pytest.approx(0.7, rel=0.02)
    assert fit["rms_log_error"] < 0.05 and not fit["clipped"]
    att = []
    for b, h, s, d in ((1, 16, 1024, 128), (1, 16, 4096, 128), (2, 32, 2048, 128)):
        q = truth.attention_efficiency(s, s, d, b * h)
        qb = truth.attention_efficiency(s, s, d, b * h, backward=True)  # the backward kernel: 0.692 of it
        att.append({"batch": b, "heads": h, "seq": s, "head_dim": d,
                    "forward_s": 4.0 * b * s * s * h * d / (truth.peak() * q) + truth.kernel_launch_s,
                    "backward_s": 8.0 * b * s * s * h * d / (truth.peak() * qb) + truth.kernel_launch_s})
    a = fit_attention(att, truth, truth.kernel_launch_s)
    assert a["attention_max_efficiency"] == pytest.approx(0.55, rel=1e-6)


def test_gemm_shapes_come_from_the_simulators_workload():
    model = preset("llama2-7b")
    shapes = workload_gemms(model, ParallelPlan(tp=2, micro_batch_size=1))
    n_tok, h = model.seq_length, model.hidden_size
    assert (n_tok, 3 * h // 2, h, 1, "nt") in shapes    # column-parallel QKV (MHA), x @ W.T
    assert (n_tok, h, h // 2, 1, "nt") in shapes        # row-parallel output projection
    assert (n_tok, h, 3 * h // 2, 1, "nn") in shapes    # QKV input gradient, dy @ W
    assert (h, 3 * h // 2, n_tok, 1, "tn") in shapes    # QKV weight gradient, dy.T @ x
    assert all(m > 0 and n > 0 and k > 0 and b == 1 for m, n, k, b, _ in shapes)


def test_calibrate_command_on_this_machine(tmp_path, capsys):
    pytest.importorskip("torch")
    out, meas = tmp_path / "this-machine.json", tmp_path / "measurements.json"
    argv = ["calibrate", "--quick", "--procs", "2", "--num-layers", "2", "--hidden-size", "64",
            "--num-attention-heads", "2", "--vocab-size", "256", "--seq-length", "32", "--micro-batch-size", "2",
            "--out", str(out), "--measurements", str(meas)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "wrote" in text and "--gpu" in text
    prof = load_profile(out)  # what --gpu PROFILE.json does
    prov = prof.provenance
    assert prov["tool"] == "trainsim calibrate" and prov["processes"] == 2
    for key in ("host", "torch", "numpy", "python", "date", "backend", "device"):
        assert prov[key]
    fitted = ("gemm_max_efficiency", "gemm_k_overhead", "attention_max_efficiency", "memory_efficiency",
              "kernel_launch_s", "hbm_bandwidth_Bps", "peak_flops", "links.ethernet")
    assert all(key in prof.sources for key in fitted)
    assert 0 < prof.gemm_max_efficiency <= 1 and 0 < prof.memory_efficiency <= 1
    assert prof.peak("bf16") > 0 and prof.kernel_launch_s >= 0
    link = prof.link("ethernet" if prov["backend"] == "gloo" else "nvlink")
    data = json.loads(meas.read_text())
    colls = data["measurements"]["collectives"]
    for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
        sizes = [r["bytes"] for r in colls if r["op"] == op]
        assert len(sizes) >= 4 and sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    largest = max(r["busbw_Bps"] for r in colls)
    assert largest / 20 < link.effective_Bps < largest * 20
    assert link.latency_s >= 0
    gemms = data["measurements"]["micro"]["gemm"]
    assert any((r["m"], r["n"], r["k"]) == (64, 3 * 64, 64) for r in gemms)  # the model's QKV shape
    assert all(r["time_s"] > 0 for r in gemms)
    micro = data["measurements"]["micro"]
    assert micro["dtype"] == ("float32" if prov["backend"] == "gloo" else "bfloat16")
    # scaled_dot_product_attention at the model's shape (micro-batch 2, 2 heads, seq 32, head dim 32)
    att = micro["attention"]
    assert any((r["batch"], r["heads"], r["seq"], r["head_dim"]) == (2, 2, 32, 32) for r in att)
    assert all(r["forward_s"] > 0 and r["backward_s"] >= 0 and r["causal"] for r in att)
    # every memory-bound kernel the cost model stands for, each over a rising size sweep
    kernels = {r["kernel"] for r in micro["memory"]}
    assert {"layernorm", "gelu", "swiglu", "softmax", "add"} <= kernels
    import torch.nn.functional as F

    assert "rmsnorm" in kernels or not hasattr(F, "rms_norm")  # torch >= 2.4 has the fused RMSNorm
    for k in kernels:
        sizes = [r["bytes"] for r in micro["memory"] if r["kernel"] == k]
        assert len(sizes) >= 4 and sizes == sorted(sizes) and all(r["time_s"] > 0 for r in micro["memory"])
    assert micro["copy"]["bytes"] >= 2**26 and micro["copy"]["bandwidth_Bps"] > 0
    # On a CPU the per-kernel cost is the framework's, from a tiny training step.
    fw = micro["framework"]
    if prov["backend"] == "gloo":
        assert prof.kernel_launch_s == pytest.approx(fw["step_s"] / fw["kernels"])
        assert "tiny shape" in prof.sources["kernel_launch_s"] and prov["kernel_launch_alone_s"] >= 0
        assert prof.gemm_bias_epilogue is False and "addmm" in prof.sources["gemm_bias_epilogue"]
        # The profiler's cost per recorded event, at the model's shape: its callbacks cost
        # the thread something for each of the (hundreds of) operators a step records.
        pr = micro["profiler"]
        assert pr["model"]["hidden_size"] == 64 and pr["micro_batch_size"] == 2 and pr["events"] > fw["kernels"]
        first = pr["per_op_s_ranks"][0]  # (rank 0's own figures, as the merged record keeps them)
        assert first == pytest.approx(max(0.0, pr["extra_cpu_s"]) / pr["events"])
        assert pr["extra_cpu_s"] == pytest.approx(pr["traced_cpu_s"] - pr["iteration_cpu_s"])
        # (0 is a measurement too: under torch 2.13 on this machine's CPU the profiled and the plain iteration
        # both take about 4 ms for 1,636 events, 2026-12-07, so the least of 11 rounds each way may differ by
        # either sign, and a cost below the noise is clamped to 0)
        assert prof.profiler_op_overhead_s == pytest.approx(pr["per_op_s"]) and prof.profiler_op_overhead_s >= 0
        assert "torch.profiler" in prof.sources["profiler_op_overhead_s"] and len(pr["per_op_s_ranks"]) == 2
    else:
        assert fw is None and micro["profiler"] is None and prof.profiler_op_overhead_s is None
    # The profile drives a simulation.
    assert main(["estimate", "--gpu", str(out), "--num-layers", "2", "--hidden-size", "64",
                 "--num-attention-heads", "2", "--vocab-size", "256", "--seq-length", "32"]) == 0


def test_calibrate_input_errors_are_one_line(tmp_path, capsys):
    pytest.importorskip("torch")
    for argv in (["calibrate", "--out", str(tmp_path / "p.txt")],
                 ["calibrate", "--procs", "0", "--out", str(tmp_path / "p.json")],
                 ["calibrate", "--link", "wifi", "--out", str(tmp_path / "p.json")],
                 ["calibrate", "--seq-length", "128", "--out", str(tmp_path / "p.json")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("trainsim: error: ") and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_reference_model_for_calibration_shapes():
    model = gpt("m", 2, 64, 2, 256, 32, tied_embeddings=False, dropout=False)
    shapes = workload_gemms(model, ParallelPlan(micro_batch_size=2))
    assert (64, 256, 64, 1, "nt") in shapes  # the logits GEMM: tokens x vocab x hidden


def test_collective_sweep_reaches_the_largest_message():
    from sim.calibrate.collectives import sweep_sizes

    base = sweep_sizes(True, False)
    assert sweep_sizes(True, False, base[-1] // 2) == base  # already covered: nothing added
    sizes = sweep_sizes(True, False, 17_000_000)  # a 17 MB data-parallel bucket
    assert sizes[: len(base)] == base and sizes == tuple(sorted(set(sizes)))
    assert sizes[-1] >= 17_000_000 > sizes[-2]
    assert all(b == 2 * a for a, b in zip(sizes[len(base) - 1:], sizes[len(base):]))


def test_shared_cores_time_samples_across_scheduler_slices():
    # CPU processes that outnumber the cores take turns on them: a sample must span several
    # time slices, or the median picks the samples that had a core to themselves.
    torch = pytest.importorskip("torch")
    from sim.calibrate.launch import SHARED_SAMPLE_S, Context, measure

    calls = []

    def fn():  # at least 1 ms
        calls.append(1)
        time.sleep(1e-3)

    def run(shared):
        calls.clear()
        t0 = time.perf_counter()
        measure(Context(0, 1, 0, torch.device("cpu"), "gloo", 1, shared_cores=shared), fn, warmup=1, repeats=1)
        return len(calls), time.perf_counter() - t0

    assert run(False)[0] == 3  # warm-up, the sizing call, a one-call sample (2e-4 s is enough)
    n, wall = run(True)        # the sample repeats the call until it lasts about SHARED_SAMPLE_S
    assert n > 3 and wall > 0.5 * SHARED_SAMPLE_S
