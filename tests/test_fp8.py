"""FP8 training (``--fp8-format``, ``sim.program.fp8``): a GEMM-bound layer against its
closed form (the GEMMs at the FP8 peak plus Transformer Engine's casts under the
roofline), the FP8 GEMM efficiency, the memory terms, the flag through run, estimate,
experiment files and search, the fit data's FP8 rows, and one-line errors."""

import contextlib
import csv
import io
import json
from dataclasses import replace

import pytest

import sim
from sim.cli import main
from sim.errors import InputError
from sim.inputs.hardware import HardwareProfile, load_profile
from sim.inputs.model import gpt, llama
from sim.inputs.pacing import paced
from sim.inputs.plan import ParallelPlan
from sim.program.costs import op_time
from sim.program.estimate import estimate
from sim.inputs.precision import fp8_precision
from sim.program.fp8 import fp8_layer_work
from sim.program.memory import Storing, activation_bytes_per_layer, fp8_weight_copy_bytes, stage_memory_bytes
from sim.program.workload import LayerRun, chunk_work, layer_work
from sim.studies.search import SearchSpace, enumerate_plans, plan_key

H100 = load_profile("h100-sxm")
A100 = load_profile("a100-80gb")
# A GPT layer whose GEMMs are compute-bound in both precisions (h = N = 2048).
LAYER = gpt("fp8-layer", 2, 2048, 16, 8192, 2048)
TINY = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "4096",
        "--seq-length", "256"]


def _flat(profile: HardwareProfile) -> HardwareProfile:
    """``profile`` with no shape effects: one 1x1 tile on one SM, no k0, no launch cost,
    the microbenchmark's throughput, FP8 GEMMs capped as BF16's. Every GEMM then runs at
    cap x peak of its dtype, every memory-bound kernel at its bytes over the HBM rate."""
    return replace(profile, sm_count=1, gemm_tiles=((1, 1, 1.0),), gemm_k_overhead=0.0, kernel_launch_s=0.0,
                   sustained_compute_fraction=1.0, fp8_gemm_max_efficiency=profile.gemm_max_efficiency)


def _time(work, profile) -> float:
    return sum(op_time(o, profile) for o in work.ops())


def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


# ------------------------------------------------------------------- closed forms
@pytest.mark.parametrize("m", [1, 8])
def test_a_gemm_bound_layer_gains_the_peak_ratio_less_the_casts(m):
    # tp = 1, no sequence parallelism, N = b*s tokens, hidden h, MLP f = 4h (GeLU). The
    # twelve GEMMs run at the FP8 peak instead of the BF16 one (r = 989/1979), and TE's
    # kernels move, per micro-batch (bytes):
    #   forward   projection and MLP-down inputs cast and transposed   4Nh + 4Nf
    #             the two norms write their output in FP8                -2Nh
    #             weights cast and transposed, 1/m of the step's 4 B/param  4(4h^2 + 2hf)/m
    #   backward  output gradients cast and transposed:
    #             MLP-down Nh, MLP-up Nf, projection Nh, QKV 3Nh, 4 B each  4Nh + 4Nf + 4Nh + 12Nh
    #   wgrad     QKV and MLP-up FP8 inputs transposed (1 B read, 1 written)  2Nh + 2Nh
    # all at the HBM rate of tuned kernels; nothing else changes.
    p = _flat(H100)
    n_tok, h, f = LAYER.seq_length, LAYER.hidden_size, LAYER.ffn_hidden_size
    bf16 = layer_work(LAYER, LayerRun(1))
    fp8 = fp8_layer_work(bf16, fp8_precision("hybrid"), microbatches=m)
    for o in bf16.ops() + fp8.ops():
        if o.kind == "gemm":  # the premise: compute-bound under the roofline in both precisions
            rate = p.peak("fp8" if o.dtype == "fp8" else "bf16") * p.gemm_max_efficiency
            assert o.flops / rate > (o.bytes_read + o.bytes_written) / p.memory_rate(), o.name
    gemms = sum(op_time(o, p) for o in bf16.ops() if o.kind == "gemm")
    r = p.peak("bf16") / p.peak("fp8")
    casts = (4 * n_tok * h + 4 * n_tok * f - 2 * n_tok * h + 4 * (4 * h * h + 2 * h * f) / m
             + 4 * n_tok * h + 4 * n_tok * f + 4 * n_tok * h + 12 * n_tok * h + 4 * n_tok * h)
    expected = _time(bf16, p) - gemms + gemms * r + casts / p.memory_rate()
    assert _time(fp8, p) == pytest.approx(expected, rel=1e-12)
    speedup = _time(bf16, p) / _time(fp8, p)
    assert 1 < speedup < p.peak("fp8") / p.peak("bf16")


def test_sequence_parallel_casts_and_fp8_gathers():
    # tp = 2 with sequence parallelism: the norms' outputs and every all-gather carry FP8
    # (half the bytes), reduce-scatters stay BF16; the casts follow TE's sequence-parallel
    # path (module doc of sim.program.fp8), per micro-batch with t = 2, m = 4:
    #   forward   norms -2(N/t)h; projection and MLP-down inputs cast only, 3Nh/t + 3Nf/t;
    #             weights 4(4h^2 + 2hf)/(t m)
    #   backward  MLP-down and projection gradients: local cast 3Nh/t, gathered transpose 2Nh (each);
    #             MLP-up and QKV cast-transpose 4Nf/t and 12Nh/t
    #   wgrad     transposes of every FP8 input: MLP-down 2Nf/t, MLP-up 2Nh, projection 2Nh/t, QKV 2Nh
    p, t, m = _flat(H100), 2, 4
    n_tok, h, f = LAYER.seq_length, LAYER.hidden_size, LAYER.ffn_hidden_size
    bf16 = layer_work(LAYER, LayerRun(1, t, True))
    fp8 = fp8_layer_work(bf16, fp8_precision("e4m3"), t, True, m)
    for coll, factor in (("all_gather", 0.5), ("reduce_scatter", 1.0)):
        assert sum(c.nbytes for c in fp8.comms() if c.collective == coll) == \
            factor * sum(c.nbytes for c in bf16.comms() if c.collective == coll) > 0
    gemms = sum(op_time(o, p) for o in bf16.ops() if o.kind == "gemm")
    casts = (-2 * n_tok * h / t + 3 * n_tok * h / t + 3 * n_tok * f / t + 4 * (4 * h * h + 2 * h * f) / (t * m)
             + 2 * (3 * n_tok * h / t + 2 * n_tok * h) + 4 * n_tok * f / t + 12 * n_tok * h / t
             + 2 * n_tok * f / t + 2 * n_tok * h + 2 * n_tok * h / t + 2 * n_tok * h)
    expected = _time(bf16, p) - gemms * (1 - p.peak("bf16") / p.peak("fp8")) + casts / p.memory_rate()
    assert _time(fp8, p) == pytest.approx(expected, rel=1e-12)


def test_what_stays_bf16_and_the_formats_cost_the_same():
    model = llama("fp8-llama", 2, 1024, 8, 2, 2816, 4096, 512)
    plan = ParallelPlan(tp=2, sequence_parallel=True, fp8_format="hybrid", global_batch_size=4)
    works = chunk_work(model, plan, 0)
    layer, emb, head = works[1], works[0], works[-1]
    assert {o.name for o in layer.ops() if o.dtype == "fp8"} == {
        f"{g}{s}" for g in ("attn.qkv", "attn.proj", "mlp.up", "mlp.down") for s in ("", ".dgrad", ".wgrad")}
    assert all(o.dtype == "bf16" for w in (emb, head) for o in w.ops())  # embedding, LM head, loss
    assert all(o.dtype == "bf16" for o in layer.ops() if o.kind == "attention")  # flash attention
    bf16 = chunk_work(model, replace(plan, fp8_format=None), 0)[1]
    for phase in "FBW":  # same math, other kernels
        assert layer.flops(phase, kinds=("gemm", "attention")) == bf16.flops(phase, kinds=("gemm", "attention"))
    e4m3 = chunk_work(model, replace(plan, fp8_format="e4m3"), 0)[1]
    assert _time(e4m3, H100) == _time(layer, H100) != _time(bf16, H100)
    unfused = fp8_layer_work(layer_work(model, LayerRun(1, attention="unfused")), fp8_precision("hybrid"))
    assert all(o.dtype == "bf16" for o in unfused.ops() if o.name.startswith(("attn.scores", "attn.context")))
    assert fp8_layer_work(bf16, None) is bf16


def test_fp8_gemm_efficiency_caps_and_stretches_k0():
    # eff = cap * sustained * q * k / (k + k0); in FP8 the cap is fp8_gemm_max_efficiency
    # and k0 is longer by the peak ratio (same epilogue time, main loop that much faster).
    p = H100
    r = p.peak("fp8") / p.peak("bf16")
    for m, n, k in ((8192, 8192, 8192), (2048, 9216, 12288), (12288, 3072, 2048), (300, 200, 100)):
        bf16 = p.gemm_efficiency(m, n, k)
        shape = bf16 * (k + p.gemm_k_overhead) / (k * p.gemm_max_efficiency)  # sustained * q
        want = p.fp8_gemm_max_efficiency * shape * k / (k + p.gemm_k_overhead * r)
        assert p.gemm_efficiency(m, n, k, dtype="fp8") == pytest.approx(want, rel=1e-12)
    unset = replace(p, fp8_gemm_max_efficiency=None)  # a profile without its own FP8 cap
    assert unset.gemm_efficiency(4096, 4096, 4096, dtype="fp8") / p.gemm_efficiency(4096, 4096, 4096, dtype="fp8") \
        == pytest.approx(p.gemm_max_efficiency / p.fp8_gemm_max_efficiency)
    assert "fp8_gemm_max_efficiency" in p.sources and "fp8_gemm_max_efficiency" in load_profile("h200").sources


# DeepGEMM's FP8 GEMM throughputs on an H800 (the H100's SMs and FP8 peak, 1,979 TFLOP/s dense),
# NVCC 12.8, as deepseek-ai/DeepGEMM's README published them with its first release (February 2025,
# "Performance": normal GEMMs for dense models and grouped GEMMs for MoE models, contiguous layout;
# a kernel microbenchmark, not a training run): (groups, M per group, N, K) -> TFLOP/s.
DEEPGEMM_H800 = {(1, 4096, 2112, 7168): 1058, (1, 4096, 24576, 1536): 990, (1, 4096, 32768, 512): 590,
                 (1, 4096, 7168, 16384): 1358, (1, 4096, 4096, 7168): 1304, (1, 4096, 7168, 2048): 1025,
                 (4, 8192, 4096, 7168): 1297, (4, 8192, 7168, 2048): 1099,
                 (8, 4096, 4096, 7168): 1288, (8, 4096, 7168, 2048): 1093}


def test_fp8_gemm_shape_model_ramps_with_k_as_deepgemm_measured():
    """The FP8 GEMM model's fall with K and N (k0 stretched by the FP8/BF16 peak ratio, the tile
    and wave terms) against DeepGEMM's measured FP8 GEMMs at M of 4,096-8,192 per group, the
    per-expert M of the Megatron-Bridge MoE rows (1,024-8,192) and K down to 512 (Qwen3's expert
    GEMMs have K of 768-4,096): each shape's measured over modelled throughput, relative to the
    largest K's (4,096 x 7,168 x 16,384), stays within 6% down to K = 1,536 (grouped K = 2,048:
    within 1.2%), and the model is 8% fast at K = 512. So the FP8 rate's ramp with size is
    not what makes a small MoE layer's FP8 GEMMs fast in the simulator (docs/accuracy.md)."""
    p = replace(H100, sustained_compute_fraction=1.0)  # a kernel benchmark: no training-step clocks
    peak = p.peak("fp8") / 1e12
    assert peak == pytest.approx(1979, rel=1e-3)
    ratio = {s: t / (peak * p.gemm_efficiency(s[1], s[2], s[3], batch=s[0], dtype="fp8"))
             for s, t in DEEPGEMM_H800.items()}
    ref = ratio[(1, 4096, 7168, 16384)]
    rel = {s: r / ref for s, r in ratio.items()}
    assert all(abs(r - 1) < 0.06 for s, r in rel.items() if s[3] >= 1536)
    assert all(abs(r - 1) < 0.012 for s, r in rel.items() if s[0] > 1)  # the grouped (contiguous) GEMMs
    assert rel[(1, 4096, 32768, 512)] == pytest.approx(0.917, abs=0.005)


# Transformer Engine's GEMM benchmark, as its documentation's worked example prints it
# (docs/examples/gemm_profiling/gemm_profiling.rst, "Worked Example: 5B Model on H200", pre-quantized
# mode): the 12 GEMMs of one layer of hidden 4,096 and MLP 16,384 at 31 x 512 = 15,872 tokens, on an
# H200 NVL, BF16 (torch.matmul) against FP8 with per-tensor scales and inputs already in FP8
# (FP8CurrentScaling; cuBLASLt through tex.generic_gemm, fast accumulation). ms per layer.
TE_BENCH_TOKENS, TE_BENCH_HIDDEN, TE_BENCH_MLP = 15872, 4096, 16384
TE_BENCH_MS = {"fprop": (10.632, 5.577), "dgrad": (10.747, 5.661), "wgrad": (10.530, 5.547)}  # (BF16, FP8)


def test_fp8_shape_model_against_transformer_engines_published_gemm_benchmark():
    # The benchmark's own shapes: forward (M, N, K) per linear layer, input gradient with N
    # and K swapped, weight gradient with the tokens as the contraction. The H200 NVL runs
    # at its own clock, so only ratios are compared: the FP8 speed-up per pass and the BF16
    # passes against each other. At 0.814 (a cuBLASLt benchmark on an H100 SXM) the model is
    # within 3% of the published speed-up over the layer; at the profile's 0.701 (MAMF's
    # H100 SXM kernel: 0.709) it gives 1.69: the FP8/BF16 ratio of the best kernels differs
    # between benchmarks and parts (the profile's sources). Per pass the model's
    # speed-up grows with the contraction (k0 stretched by the peak ratio matters less at
    # long k): forward 1.93, input gradient 1.95, weight gradient (k = 15,872) 1.99, where
    # the benchmark measures 1.90 for all three; 6% is the shape model's stated accuracy
    # (the sglang cross-check in the profile's sources, -6%/+5%).
    M, H, I = TE_BENCH_TOKENS, TE_BENCH_HIDDEN, TE_BENCH_MLP
    linears = ((H, 3 * H), (H, H), (H, I), (I, H))  # (in, out): QKV, projection, MLP up, MLP down
    shapes = {"fprop": [(M, n, k) for k, n in linears], "dgrad": [(M, k, n) for k, n in linears],
              "wgrad": [(k, n, M) for k, n in linears]}
    p = replace(H100, fp8_gemm_max_efficiency=0.814)

    def ms(kind, dtype):
        return sum(2 * m * n * k / (p.peak(dtype) * p.gemm_efficiency(m, n, k, dtype=dtype)) for m, n, k in shapes[kind])

    for kind, (bf16_ms, fp8_ms) in TE_BENCH_MS.items():
        assert ms(kind, "bf16") / ms(kind, "fp8") == pytest.approx(bf16_ms / fp8_ms, rel=0.06), kind
        assert ms(kind, "bf16") / ms("fprop", "bf16") == pytest.approx(bf16_ms / TE_BENCH_MS["fprop"][0], rel=0.06)
    total = sum(ms(kind, "bf16") for kind in shapes) / sum(ms(kind, "fp8") for kind in shapes)
    published = sum(b for b, _ in TE_BENCH_MS.values()) / sum(f for _, f in TE_BENCH_MS.values())
    assert published == pytest.approx(1.90, abs=0.01) and total == pytest.approx(published, rel=0.04)


# ------------------------------------------------------------------------ memory
def test_memory_fp8_weight_copies_and_fp8_saved_inputs():
    model = gpt("fp8-mem", 8, 1024, 16, 8192, 1024)
    h, f, s, b, t = 1024, 4096, 1024, 2, 2
    plan = ParallelPlan(dp=2, tp=t, pp=2, micro_batch_size=b, global_batch_size=8, fp8_format="hybrid")
    bf16 = replace(plan, fp8_format=None)
    # TE's FP8 copy and transpose of the QKV, projection and MLP weights: 2 B per parameter,
    # (3h^2 + h^2 + 2hf)/t per layer on a rank, 4 layers per stage.
    assert fp8_weight_copy_bytes(model, plan, 0) == 2 * 4 * (4 * h * h + 2 * h * f) / t
    assert fp8_weight_copy_bytes(model, bf16, 0) == 0
    # Saved GEMM inputs in FP8: QKV and MLP-up inputs sbh, projection input sbh/t, MLP-down
    # input sbf/t, one byte each instead of two (no sequence parallelism: rep = 1).
    sbh = s * b * h
    saved = sbh + sbh / t + sbh + s * b * f / t
    assert activation_bytes_per_layer(model, Storing.of(b, t)) \
        - activation_bytes_per_layer(model, Storing.of(b, t, precision=fp8_precision("e4m3"))) \
        == pytest.approx(saved)
    m8, m16 = stage_memory_bytes(model, plan, 0), stage_memory_bytes(model, bf16, 0)
    assert m8["weights"] - m16["weights"] == fp8_weight_copy_bytes(model, plan, 0)
    assert m8["optimizer"] == m16["optimizer"] and m8["gradients"] == m16["gradients"]
    assert m8["activations"] < m16["activations"]


def test_a_simulated_run_holds_the_fp8_copies_and_is_faster():
    kw = dict(model={"num_layers": 4, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 8192,
                     "seq_length": 1024}, gpu="h100-sxm", gpus=2, tensor_model_parallel_size=2,
              sequence_parallel=True, global_batch_size=4)
    bf16, fp8 = sim.run(**kw), sim.run(**kw, fp8_format="hybrid")
    assert bf16.summary["precision"] == "bf16" and fp8.summary["precision"] == "fp8-hybrid"
    assert fp8.summary["plan"]["fp8_format"] == "hybrid"
    copies = fp8_weight_copy_bytes(fp8.model, fp8.plan, 0)
    assert fp8.summary["memory"]["parameters_bytes"] - bf16.summary["memory"]["parameters_bytes"] == \
        pytest.approx(copies)
    assert fp8.iteration_time_s < bf16.iteration_time_s
    assert fp8.summary["estimate_iteration_time_s"] < bf16.summary["estimate_iteration_time_s"]


# ----------------------------------------------------------- the flag everywhere
def test_the_flag_reaches_run_estimate_and_experiment_files(tmp_path):
    args = [*TINY, "--gpu", "h100-sxm", "--gpus", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel",
            "--global-batch-size", "4"]
    code, out, _ = _cli(["run", *args, "--fp8-format", "e4m3", "--json"])
    assert code == 0 and json.loads(out)["precision"] == "fp8-e4m3"
    code, text, _ = _cli(["run", *args, "--fp8-format", "hybrid"])
    assert code == 0 and "precision fp8-hybrid" in text
    est = {}
    for fmt in (None, "hybrid"):
        code, out, _ = _cli(["estimate", *args, "--json", *(["--fp8-format", fmt] if fmt else [])])
        assert code == 0
        est[fmt] = json.loads(out)
    assert est["hybrid"]["plan"]["fp8_format"] == "hybrid" and est[None]["plan"]["fp8_format"] is None
    # a layer this small loses in FP8 (its GEMMs are short, the casts are not): only big GEMMs gain
    assert est["hybrid"]["time"]["compute"] != est[None]["time"]["compute"]
    model = gpt("t", 4, 512, 8, 4096, 256)
    plan = ParallelPlan(tp=2, sequence_parallel=True, global_batch_size=4, fp8_format="hybrid")
    assert est["hybrid"]["memory"]["weights"] - est[None]["memory"]["weights"] == fp8_weight_copy_bytes(model, plan, 0)
    f = tmp_path / "fp8.toml"
    f.write_text('[model]\nnum_layers = 4\nhidden_size = 512\nnum_attention_heads = 8\nvocab_size = 4096\n'
                 'seq_length = 256\n[cluster]\ngpu = "h100-sxm"\ngpus = 2\n[plan]\ntensor_model_parallel_size = 2\n'
                 'sequence_parallel = true\nglobal_batch_size = 4\nfp8_format = "hybrid"\n')
    r = sim.run(f)
    assert r.plan.fp8_format == "hybrid" and r.summary["precision"] == "fp8-hybrid"
    code, out, _ = _cli(["run", str(f), "--json"])
    assert code == 0 and json.loads(out)["iteration_time_s"] == pytest.approx(r.iteration_time_s, rel=1e-12)


def test_explain_lists_the_fp8_kernels():
    from sim.results.explain import explain

    plan = ParallelPlan(tp=2, sequence_parallel=True, global_batch_size=4, fp8_format="hybrid")
    rows = {r["name"]: r for r in explain(LAYER, plan, H100)["parts"]["layer"]["rows"]}
    work = fp8_layer_work(layer_work(LAYER, LayerRun(1, 2, True)), fp8_precision("hybrid"), 2, True, 4)
    assert list(rows) == [i.name for i in work.items]
    pace = paced(H100, plan.world_size)  # explain prices the job's pace, as the simulator does
    for o in work.ops():
        assert rows[o.name]["time_s"] == op_time(o, pace)
        if o.kind == "gemm":
            assert rows[o.name]["efficiency"] == pace.gemm_efficiency(*o.shape, o.batch, o.dtype)
    down = next(o for o in work.ops() if o.name == "mlp.down")
    bf16 = H100.peak("bf16") * H100.gemm_efficiency(*down.shape, down.batch, "bf16")
    assert rows["mlp.down"]["flops_per_s"] > bf16  # faster than the same GEMM in BF16


def test_fp8_with_tensor_parallel_overlap_runs():
    r = sim.run(model={"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8, "vocab_size": 4096,
                       "seq_length": 512}, gpu="h100-sxm", gpus=4, tensor_model_parallel_size=4,
                sequence_parallel=True, tp_comm_overlap=True, global_batch_size=2, fp8_format="hybrid")
    assert r.summary["precision"] == "fp8-hybrid" and r.iteration_time_s > 0


def test_search_enumerates_fp8_when_asked():
    model = gpt("fp8-search", 4, 512, 8, 4096, 256)
    space = SearchSpace(tp=(1, 2), pp=(1, 2), micro_batch_size=(1,), zero_stage=(0,), schedule=("1f1b",),
                        recompute=("none",), sequence_parallel=(False,))
    bf16 = enumerate_plans(model, 8, 8, space)
    both = enumerate_plans(model, 8, 8, replace(space, fp8_format=(None, "hybrid")))
    assert len(both) == 2 * len(bf16) and {p.fp8_format for p in both} == {None, "hybrid"}
    keys = [plan_key(p) for p in both]
    assert len(set(keys)) == len(keys) and sum(k.endswith("fp8_format=hybrid") for k in keys) == len(bf16)
    with pytest.raises(InputError, match="search: fp8_format: got 'e5m2'"):
        SearchSpace(fp8_format=("e5m2",))
    argv = ["search", *TINY, "--gpus", "8", "--global-batch-size", "8", "--tp", "1,2", "--pp", "1",
            "--micro-batch-size", "1", "--zero", "0", "--recompute", "none", "--sequence-parallel", "off",
            "--fp8-format", "off,hybrid", "--workers", "0", "--json", "--margin", "inf"]
    code, out, _ = _cli([*argv, "--gpu", "h100-sxm"])
    res = json.loads(out)
    assert code == 0 and res["plans"] == res["evaluated"] == 4
    assert {e["precision"] for e in res["top"]} == {"bf16", "fp8-hybrid"}
    code, out, err = _cli([*argv, "--gpu", "a100-80gb"])
    assert code == 2 and out == "" and err.count("\n") == 1 and "--fp8-format: got 'hybrid'; GPU a100-80gb" in err


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("command", ["run", "estimate"])
def test_fp8_on_a_gpu_without_an_fp8_peak_is_one_line(command, tmp_path):
    out_dir = tmp_path / "out"
    extra = ["--out", str(out_dir)] if command == "run" else []
    code, out, err = _cli([command, *TINY, "--gpu", "a100-80gb", "--fp8-format", "hybrid", *extra])
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "--fp8-format: got 'hybrid'; GPU a100-80gb has no FP8 tensor cores" in err
    assert "allowed on a100-80gb: leave it unset (BF16)" in err and "h100-sxm" in err
    assert not out_dir.exists()


def test_fp8_errors_from_python_and_profiles(tmp_path):
    # named by the keyword the Python caller passed (as sim.run names tensor_model_parallel_size)
    with pytest.raises(InputError, match="^fp8_format: got 'e4m3'; GPU a100-80gb"):
        sim.run(model={"num_layers": 2, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 4096,
                       "seq_length": 256}, gpu="a100-80gb", fp8_format="e4m3")
    with pytest.raises(InputError, match="plan: fp8_format: got 'e5m2'; allowed: e4m3, hybrid"):
        ParallelPlan(fp8_format="e5m2")
    code, _, err = _cli(["run", *TINY, "--gpu", "h100-sxm", "--fp8-format", "e5m2"])
    assert code == 2 and "--fp8-format" in err and "e5m2" in err and "e4m3, hybrid" in err
    with pytest.raises(InputError, match="GPU a100-80gb has no FP8"):
        estimate(gpt("g", 2, 512, 8, 4096, 256), ParallelPlan(fp8_format="hybrid"), A100)
    with pytest.raises(InputError, match="fp8_gemm_max_efficiency: got 1.5; expected a fraction"):
        replace(H100, fp8_gemm_max_efficiency=1.5)
    with pytest.raises(InputError, match="fp8_gemm_max_efficiency: got 0.8; peak_flops has no fp8 entry"):
        replace(A100, fp8_gemm_max_efficiency=0.8)
    assert A100.fp8_gemm_max_efficiency is None and "fp8_gemm_max_efficiency" not in A100.to_dict()
    path = tmp_path / "h100.json"
    H100.save(path)
    assert load_profile(path).fp8_gemm_max_efficiency == H100.fp8_gemm_max_efficiency
    # the preset's value says where it comes from, and keeps the measured kernel beside it
    assert "trainsim fit" in H100.sources["fp8_gemm_max_efficiency"] and "1,402.6" in H100.sources["fp8_gemm_max_efficiency"]
    # what the FP8 training rows sustain (the fitted cap times the sustained fraction) is no more than
    # the best FP8 GEMM measured on its own with the tool and random inputs the BF16 cap comes from
    # (MAMF table, H100 SXM: FP8 1,402.6 of 1,979 TFLOP/s, BF16 794.5 of 989). (Fitted on the
    # DGX Cloud rows alone the cap was that kernel's within 1%; with the FSDP rows of 2026-12-05 the
    # fraction fell and the cap rose, 2.5% above it: the two trade on the FP8 rows.)
    assert H100.sustained_compute_fraction * H100.fp8_gemm_max_efficiency <= 1402.6 / 1979
    assert H100.gemm_max_efficiency == pytest.approx(794.5 / 989, rel=0.005)


# --------------------------------------------------------------------- fit data
def _runs_csv(path, rows):
    cols = ["source", "gpu", "precision", "gpus", "num_layers", "hidden_size", "num_attention_heads", "vocab_size",
            "seq_length", "tensor_model_parallel_size", "global_batch_size", "needs", "fp8_format",
            "measured_iteration_time_s"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({"source": "s", "gpu": "h100-sxm", "precision": "bf16", "gpus": 2, "num_layers": 2,
                        "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 4096, "seq_length": 256,
                        "tensor_model_parallel_size": 2, "global_batch_size": 4, "needs": "", "fp8_format": "",
                        "measured_iteration_time_s": 0.1, **r})
    return path


def test_fp8_rows_of_the_fit_data_run_in_fp8(tmp_path):
    from sim.calibrate.fit_runs import unsupported
    from sim.calibrate.runs_csv import read_runs

    rows = read_runs(_runs_csv(tmp_path / "r.csv", [{}, {"precision": "fp8", "needs": "fp8"},
                                                    {"precision": "fp8", "fp8_format": "e4m3"},
                                                    {"precision": "fp16"}, {"needs": "sparsity"},
                                                    {"needs": "context_parallel"}]))
    assert [r.values.get("fp8_format") for r in rows] == [None, "hybrid", "e4m3", None, None, None]
    assert [r.skip for r in rows[:3]] == [None, None, None] and rows[5].skip is None
    assert "precision fp16" in rows[3].skip and "sparsity" in rows[4].skip
    assert rows[1].group != rows[0].group  # FP8 rows form their own group
    assert unsupported(rows[1], A100) == "precision fp8: GPU a100-80gb has no fp8 peak"
    assert unsupported(rows[1], H100) is None and unsupported(rows[0], A100) is None
    with pytest.raises(InputError, match=r"line 2: column fp8_format: got 'hybrid'; the row's precision is bf16"):
        read_runs(_runs_csv(tmp_path / "bad.csv", [{"fp8_format": "hybrid"}]))


def test_the_dgx_cloud_gpt3_fp8_rows_keep_fp8_weights_and_its_bf16_rows_do_not(tmp_path):
    from sim.calibrate.runs_csv import read_runs
    from sim.session import prepare
    from sim.inputs.schema import RunSettings

    src = "NVIDIA/dgxc-benchmarking nemo_megatron/README_175b.md (v25.02)"
    rows = read_runs(_runs_csv(tmp_path / "r.csv", [{"source": src}, {"source": src, "precision": "fp8"},
                                                    {"precision": "fp8"}]))
    assert [r.values.get("fp8_param_gather") for r in rows] == [None, True, None]
    assert "nemo_megatron/README_175b (fp8 rows)" in rows[1].by_source
    assert rows[1].values["zero"] == 1  # the sharded optimizer whose gather carries them
    plan = prepare(RunSettings.from_values({**rows[1].values, "gpu": "h100-sxm"})).plan
    assert plan.fp8_param_gather and plan.fp8_format == "hybrid"
