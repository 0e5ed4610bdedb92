"""NVFP4 training (``--fp4-recipe nvfp4``, ``sim.inputs.precision``, ``sim.program.fp8``): a
GEMM's time against a hand-computed roofline at the FP4 peak, the quantize, Hadamard and amax
kernels of a tiny layer against their bytes by hand, the weight copies and saved inputs in
memory against their closed forms, the profile's FP4 efficiency against the TE benchmark it
comes from, the refusal on Hopper, and the precision registry (one object per recipe, the
``current-scaling`` alias). Every FP8 and BF16 result is the same as before: test_fp8*.py."""

import pytest

import sim
from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.inputs.precision import RECIPES, check_support, fp8_precision
from sim.program.costs import op_time
from sim.program.fp8 import fp8_layer_work
from sim.program.memory import Storing, activation_terms, fp8_weight_copy_bytes
from sim.program.ops import Op
from sim.program.workload import LayerRun, layer_work

GB200 = load_profile("gb200")
GB300 = load_profile("gb300")
H100 = load_profile("h100-sxm")
NVFP4 = ParallelPlan(fp4_recipe="nvfp4").precision
S, H, F, L = 256, 512, 2048, 2  # tokens per micro-batch, hidden, MLP width (4h, GeLU), layers
MODEL = gpt("nvfp4-layer", L, H, 8, 4096, S)
LAYER_GEMM_PARAMS = H * 3 * H + H * H + 2 * H * F  # QKV, projection, MLP up and down


def _ops(precision, tp=1, sp=False, m=1):
    work = fp8_layer_work(layer_work(MODEL, LayerRun(1, tp, sp)), precision, tp, sp, m)
    return {o.name: o for o in work.items if hasattr(o, "kind")}, work


def _hbm_time(read, written, profile):
    return (read + written) / (profile.hbm_bandwidth_Bps * profile.memory_efficiency) + profile.kernel_launch_s


# ------------------------------------------------------------------- GEMM time
def test_a_gemm_under_nvfp4_against_fp8_by_hand():
    # m = 256·152 rows, n = 256: tiles of 256x128 fill GB200's 152 SMs exactly twice, so the tile and wave
    # factors are 1 and only the cap and the k0 term remain.
    m, n, k = 256 * GB200.sm_count, 256, 16384
    flops = 2 * m * n * k

    def gemm(dtype, element_bytes):
        return Op("mlp.up", "F", "gemm", flops, element_bytes * (m * k + k * n), 2 * m * n, 2 * m * n,
                  shape=(m, n, k), dtype=dtype)

    cap, s, k0 = GB200.fp8_gemm_max_efficiency, GB200.sustained_compute_fraction, GB200.gemm_k_overhead
    fp4_rate = 10e15 * cap * 0.951 * 0.726 * s * k / (k + k0 * 10e15 / 2.5e15)  # datasheet peaks (dense)
    fp8_rate = 5e15 * cap * s * k / (k + k0 * 5e15 / 2.5e15)
    fp4_s, fp8_s = flops / fp4_rate, flops / fp8_rate
    assert fp4_s > (0.5 * (m * k + k * n) + 2 * m * n) / GB200.memory_rate()  # compute-bound
    fixed = GB200.gemm_kernel_fixed_s  # a Blackwell GEMM kernel's own fixed time (XLA's B200 cuBLAS table)
    assert op_time(gemm("nvfp4", 0.5), GB200) == pytest.approx(fp4_s + fixed, rel=1e-12)
    assert op_time(gemm("fp8", 1), GB200) == pytest.approx(fp8_s + fixed, rel=1e-12)
    assert fp8_s / fp4_s == pytest.approx(2 * 0.951 * 0.726 * (k + 2 * k0) / (k + 4 * k0), rel=1e-12)


def test_the_fp4_efficiency_reproduces_te_s_b300_benchmark():
    # TE's gemm_profiling page, B300, --pre-quantize, 12 GEMMs of a layer (hidden 4096, FFN 16384,
    # 15,872 tokens): MXFP8 7.161 ms, NVFP4 3.764 ms per layer.
    tokens, h, f = 15872, 4096, 16384

    def layer_s(kernel, peak):
        total = 0.0
        for k, n in ((h, 3 * h), (h, h), (h, f), (f, h)):  # QKV, projection, MLP up, down
            for a, b, c in ((tokens, n, k), (tokens, k, n), (k, n, tokens)):  # fprop, dgrad, wgrad
                total += 2 * a * b * c / (GB300.peak(peak) * GB300.gemm_efficiency(a, b, c, 1, kernel))
        return total

    assert layer_s("mxfp8", "fp8") / layer_s("nvfp4", "fp4") == pytest.approx(7.161 / 3.764, rel=0.002)


# ------------------------------------------------------------------- kernels
def test_nvfp4_kernels_of_a_tiny_layer_by_hand():
    ops, work = _ops(NVFP4, m=4)
    x = S * F  # MLP-down's input: read in BF16; its amax pass, the row-wise copy, the Hadamard column-wise copy
    copy = x * (0.5 + 1 / 16)  # E2M1 plus one E4M3 scale per 16 elements
    assert (ops["mlp.down.amax"].bytes_read, ops["mlp.down.amax"].bytes_written) == (2 * x, 0.0)
    assert (ops["mlp.down.quantize"].bytes_read, ops["mlp.down.quantize"].bytes_written) == (2 * x, copy)
    hq = ops["mlp.down.hadamard_quantize"]
    assert (hq.bytes_read, hq.bytes_written) == (2 * x, copy)
    assert op_time(hq, GB200) == pytest.approx(_hbm_time(2 * x, copy, GB200), rel=1e-12)
    w = F * H / 4  # the weight, once a step over m = 4 micro-batches: amax, then both copies in 16x16 blocks
    assert ops["mlp.down.weight_amax"].bytes_read == 2 * w
    assert ops["mlp.down.weight_quantize"].bytes_written == pytest.approx(2 * w * (0.5 + 1 / 256), rel=1e-12)
    # the norms write BF16 and their outputs get an amax pass (no fused norm amax for NVFP4)
    assert "attn.qkv.amax" in ops and "attn.qkv.hadamard_quantize" in ops
    # the GEMMs read half a byte per operand element, at the FP4 peak; no transposes
    down = ops["mlp.down"]
    assert down.dtype == "nvfp4" and down.bytes_read == 0.5 * (S * F + F * H)
    assert ops["mlp.down.wgrad"].dtype == ops["mlp.down.dgrad"].dtype == "nvfp4"
    assert not [n for n in ops if n.endswith(".transpose") or n.endswith("_t")]
    # the output gradient of each GEMM: amax, then both copies (the column-wise one through the Hadamard kernel)
    g = S * H  # MLP-down's output gradient
    assert ops["mlp.down.dgrad.hadamard_quantize"].bytes_written == pytest.approx(g * (0.5 + 1 / 16), rel=1e-12)
    assert not [c for c in work.items if not hasattr(c, "kind") and c.name.endswith("amax.all_reduce")]


def test_nvfp4_all_reduces_the_amax_of_gathered_tensors_and_gathers_fp4():
    ops, work = _ops(NVFP4, tp=2, sp=True)
    comms = {c.name: c for c in work.items if not hasattr(c, "kind")}
    assert sorted(n for n in comms if n.endswith(".amax.all_reduce")) == [
        "attn.proj.dgrad.amax.all_reduce", "attn.qkv.amax.all_reduce",
        "mlp.down.dgrad.amax.all_reduce", "mlp.up.amax.all_reduce"]
    bf16 = {c.name: c for c in layer_work(MODEL, LayerRun(1, 2, True)).items if not hasattr(c, "kind")}
    # the forward input's gather carries the row-wise FP4 copy with its scales: (1/2 + 1/16) of 2 bytes
    assert comms["mlp.all_gather"].nbytes == pytest.approx(bf16["mlp.all_gather"].nbytes * (0.5 + 1 / 16) / 2)


# ------------------------------------------------------------------- memory
def test_weight_copies_and_saved_inputs_in_fp4():
    plan = ParallelPlan(fp4_recipe="nvfp4")
    assert fp8_weight_copy_bytes(MODEL, plan, 0) == pytest.approx(2 * L * LAYER_GEMM_PARAMS * (0.5 + 1 / 256))
    terms = activation_terms(MODEL, Storing.of(1, precision=NVFP4))
    assert terms["mlp.down.input"] == pytest.approx(S * F * (0.5 + 1 / 16), rel=1e-12)
    assert terms["attn.q"] == 2 * S * H  # BF16 tensors are untouched


# ------------------------------------------------------------------- a run and refusals
def test_a_run_under_nvfp4_against_mxfp8_on_gb300():
    # GB300's FP4 peak is 3x its FP8 peak: at hidden 4096 the GEMMs' 1.9x outweighs the amax and Hadamard
    # passes (on GB200, 2x, a hidden-2048 layer comes out slower than MXFP8: the quantize kernels dominate)
    common = dict(num_layers=2, hidden_size=4096, num_attention_heads=16, vocab_size=4096, seq_length=2048,
                  gpu="gb300", gpus=1, global_batch_size=2)
    nv = sim.run(**common, fp4_recipe="nvfp4")
    mx = sim.run(**common, fp8_format="e4m3", fp8_recipe="mxfp8")
    assert nv.summary["precision"] == "nvfp4"
    assert nv.iteration_time_s < mx.iteration_time_s
    assert nv.peak_memory_bytes < mx.peak_memory_bytes  # half-byte copies and saved inputs


def test_refused_on_hopper_and_ampere_and_with_fp8():
    with pytest.raises(InputError, match="--fp4-recipe: got 'nvfp4'; GPU h100-sxm has no FP4 tensor cores"):
        check_support(NVFP4, H100)
    with pytest.raises(InputError, match="a100-80gb has no FP4"):
        check_support(NVFP4, load_profile("a100-80gb"))
    check_support(NVFP4, GB200)
    with pytest.raises(InputError, match="fp4_recipe: got 'nvfp4'; not with fp8_format e4m3"):
        ParallelPlan(fp4_recipe="nvfp4", fp8_format="e4m3")
    with pytest.raises(InputError, match="fp8_param_gather"):
        ParallelPlan(fp4_recipe="nvfp4", fp8_param_gather=True, zero_stage=1)


# ------------------------------------------------------------------- the registry
def test_megatron_s_fp4_format_flag_runs_the_same_recipe():
    # Megatron-LM turns FP4 on with --fp4-format e2m1; its --fp4-recipe defaults to nvfp4
    assert ParallelPlan(fp4_format="e2m1").precision == NVFP4
    assert ParallelPlan(fp4_format="e2m1", fp4_recipe="nvfp4").precision == NVFP4
    with pytest.raises(InputError, match="fp4_format: got 'e2m1'; not with fp8_format hybrid"):
        ParallelPlan(fp4_format="e2m1", fp8_format="hybrid")


def test_current_scaling_is_tensorwise():
    plan = ParallelPlan(fp8_format="e4m3", fp8_recipe="current-scaling")
    assert plan.fp8_recipe == "tensorwise" and plan.precision == fp8_precision("e4m3", "tensorwise")
    assert _ops(plan.precision)[1] == _ops(fp8_precision("e4m3", "tensorwise"))[1]


def test_each_recipe_says_what_it_needs_and_keeps():
    assert [n for n, r in RECIPES.items() if r.history] == ["delayed"]
    assert {n: r.needs for n, r in RECIPES.items()} == {"delayed": "fp8", "tensorwise": "fp8", "mxfp8": "mx",
                                                        "blockwise": "fp8", "nvfp4": "fp4"}
    assert ParallelPlan().precision is None


def test_a_profile_with_an_fp4_efficiency_needs_an_fp4_peak():
    from sim.inputs.hardware import HardwareProfile

    d = GB200.to_dict()
    assert HardwareProfile.from_dict(d).nvfp4_gemm_relative_efficiency == 0.726
    del d["peak_flops"]["fp4"]
    with pytest.raises(InputError, match="nvfp4_gemm_relative_efficiency.*no fp4"):
        HardwareProfile.from_dict(d)
