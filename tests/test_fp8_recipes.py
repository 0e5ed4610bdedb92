"""FP8 recipes (``--fp8-recipe``, ``sim.program.fp8``'s ``RECIPES``): MXFP8's memory against
its closed form (n·(1 + 1/32) bytes per copy), each recipe's quantize kernels against a
hand-computed memory-bound cost on a tiny layer, the block-scaled GEMMs' kernels, delayed
scaling unchanged as the default, and the GB300 profile. Refusals are in test_bad_inputs."""

from dataclasses import replace

import pytest

import sim
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import NODE_OF_GPU
from sim.program.costs import op_time
from sim.inputs.precision import RECIPES, Precision, fp8_precision, label
from sim.program.fp8 import fp8_layer_work
from sim.program.memory import Storing, activation_terms, fp8_weight_copy_bytes
from sim.program.workload import LayerRun, layer_work

B200 = load_profile("b200")
H100 = load_profile("h100-sxm")
S, H, F, L = 256, 512, 2048, 2  # tokens per micro-batch, hidden, MLP width (4h, GeLU), layers
MODEL = gpt("recipe-layer", L, H, 8, 4096, S)
LAYER_GEMM_PARAMS = H * 3 * H + H * H + 2 * H * F  # QKV, projection, MLP up and down (MHA, no GQA)


def _ops(recipe, tp=1, sp=False):
    work = fp8_layer_work(layer_work(MODEL, LayerRun(1, tp, sp)), fp8_precision("e4m3", recipe), tp, sp, 1, False)
    return {o.name: o for o in work.items if hasattr(o, "kind")}, work


def _hbm_time(read, written, profile):
    """A memory-bound kernel's roofline time, by hand: bytes over the achieved HBM rate, plus launch."""
    return (read + written) / (profile.hbm_bandwidth_Bps * profile.memory_efficiency) + profile.kernel_launch_s


# ---------------------------------------------------------------------- memory
@pytest.mark.parametrize("recipe,per_copy", [("delayed", 1.0), ("tensorwise", 1.0), ("mxfp8", 1 + 1 / 32),
                                             ("blockwise", 1 + 4 / (128 * 128))])
def test_weight_copies_take_n_times_one_plus_the_scales_per_copy(recipe, per_copy):
    # Two FP8 copies of every GEMM weight (forward, and transpose or column-wise copy for the
    # input gradient); MXFP8: one E8M0 byte per 32 elements; blockwise: one FP32 per 128x128.
    plan = ParallelPlan(fp8_format="e4m3", fp8_recipe=recipe)
    n = L * LAYER_GEMM_PARAMS
    assert fp8_weight_copy_bytes(MODEL, plan, 0) == pytest.approx(2 * n * per_copy, rel=1e-12)


@pytest.mark.parametrize("recipe,per_element", [("delayed", 1.0), ("mxfp8", 1 + 1 / 32), ("blockwise", 1 + 4 / 128)])
def test_saved_gemm_inputs_carry_their_scales(recipe, per_element):
    terms = activation_terms(MODEL, Storing.of(1, precision=fp8_precision("e4m3", recipe)))
    assert terms["attn.qkv.input"] == pytest.approx(S * H * per_element, rel=1e-12)
    assert terms["mlp.down.input"] == pytest.approx(S * F * per_element, rel=1e-12)
    assert terms["attn.q"] == 2 * S * H  # BF16 tensors are untouched


# ---------------------------------------------------------------- quantize kernels
def test_mxfp8_quantizes_both_copies_in_one_memory_bound_kernel():
    ops, _ = _ops("mxfp8")
    g = S * F  # MLP-down's input: tokens x F, read in BF16, written row- and column-wise with scales
    q = ops["mlp.down.quantize"]
    assert (q.bytes_read, q.bytes_written) == (2 * g, 2 * g * (1 + 1 / 32))
    assert op_time(q, B200) == pytest.approx(_hbm_time(2 * g, 2 * g * 33 / 32, B200), rel=1e-12)
    # no FP8 transposes, and the norms write BF16 (quantized after them)
    assert not [n for n in ops if n.endswith(".transpose") or n.endswith("_t")]
    bf16 = {o.name: o for o in layer_work(MODEL, LayerRun(1)).items if hasattr(o, "kind")}
    assert ops["attn.norm"].bytes_written == bf16["attn.norm"].bytes_written
    assert ops["mlp.down"].dtype == "mxfp8"


def test_current_scaling_reads_each_tensor_once_more_for_its_amax():
    cur, _ = _ops("tensorwise")
    old, _ = _ops("delayed")
    g = S * F
    amax = cur["mlp.down.amax"]
    assert (amax.bytes_read, amax.bytes_written) == (2 * g, 0.0)
    # two GPU operations: the FP32 amax zeroed (TE's launch_amax_kernel), then the amax kernel
    assert amax.kernels == 2
    assert op_time(amax, H100) == pytest.approx(_hbm_time(2 * g, 0.0, H100) + H100.kernel_launch_s, rel=1e-12)
    assert cur["mlp.down.to_fp8_t"] == old["mlp.down.to_fp8_t"]  # the cast itself is delayed scaling's
    # the norm computes its own output's amax: QKV's input gets a cast, no amax pass
    assert "attn.qkv.to_fp8_t" in cur and "attn.qkv.amax" not in cur
    extra = sum(o.bytes_read + o.bytes_written for o in cur.values()) - \
        sum(o.bytes_read + o.bytes_written for o in old.values())
    # by hand, per micro-batch (m = 1): amax passes over proj/down inputs (2SH + 2SF), four weights
    # (2 x params), four output gradients (2S(3H + H + F + H)); QKV/up casts read 2SH and write 2SH each,
    # minus their norms' FP8 writes now BF16 (+SH each), minus the wgrad transposes delayed made (2SH each)
    amax_bytes = 2 * S * H + 2 * S * F + 2 * LAYER_GEMM_PARAMS + 2 * S * (3 * H + H + F + H)
    casts = 2 * (4 * S * H) + 2 * S * H - 2 * (2 * S * H)
    assert extra == pytest.approx(amax_bytes + casts, rel=1e-12)


def test_current_scaling_all_reduces_the_amax_of_gathered_tensors_over_tp():
    ops, work = _ops("tensorwise", tp=2, sp=True)
    reductions = [c.name for c in work.items if not hasattr(c, "kind") and c.name.endswith(".amax.all_reduce")]
    # forward: QKV and MLP-up inputs (gathered); backward: projection and MLP-down gradients
    assert sorted(reductions) == ["attn.proj.dgrad.amax.all_reduce", "attn.qkv.amax.all_reduce",
                                  "mlp.down.dgrad.amax.all_reduce", "mlp.up.amax.all_reduce"]
    assert not [c for c in _ops("delayed", 2, True)[1].items if c.name.endswith("amax.all_reduce")]


# ------------------------------------------------------------------- GEMMs
def test_mxfp8_gemms_run_at_their_relative_efficiency_and_blockwise_follows_the_gpu():
    m = n = k = 8192
    assert B200.gemm_efficiency(m, n, k, dtype="mxfp8") == pytest.approx(
        B200.gemm_efficiency(m, n, k, dtype="fp8") * B200.mxfp8_gemm_relative_efficiency, rel=1e-12)
    ops, _ = _ops("blockwise")
    gemm = ops["mlp.up"]
    assert gemm.dtype == "fp8_block"
    assert op_time(gemm, H100) == op_time(replace(gemm, dtype="fp8"), H100)  # Hopper: emulated, FP8 kernels
    assert op_time(gemm, B200) == op_time(replace(gemm, dtype="mxfp8"), B200)  # Blackwell: MXFP8 kernels


# ------------------------------------------------------------ delayed unchanged
def test_delayed_is_the_default_and_what_fp8_format_alone_runs():
    assert ParallelPlan().fp8_recipe == "delayed"
    work = layer_work(MODEL, LayerRun(1, 2, True))
    assert ParallelPlan(fp8_format="hybrid").precision == Precision("hybrid", RECIPES["delayed"])
    assert fp8_layer_work(work, fp8_precision("hybrid"), 2, True) == \
        fp8_layer_work(work, Precision("hybrid", RECIPES["delayed"]), 2, True, 1, False)
    assert label(fp8_precision("hybrid")) == label(fp8_precision("hybrid", "delayed")) == "fp8-hybrid"
    assert label(fp8_precision("e4m3", "mxfp8")) == "fp8-e4m3-mxfp8"
    assert label(None) == "bf16"


def test_a_run_under_each_recipe():
    common = dict(num_layers=2, hidden_size=512, num_attention_heads=8, vocab_size=4096, seq_length=256,
                  gpu="b200", gpus=2, tensor_model_parallel_size=2, sequence_parallel=True, fp8_format="e4m3")
    runs = {r: sim.run(**common, fp8_recipe=r) for r in ("delayed", "tensorwise", "mxfp8")}
    exposed = {r: run.summary["exposed_comm_s"] for r, run in runs.items()}
    assert "amax" in exposed["delayed"]  # the history's stage-wide reductions
    assert "amax" not in exposed["tensorwise"] and "amax" not in exposed["mxfp8"]
    assert runs["mxfp8"].summary["precision"] == "fp8-e4m3-mxfp8"
    assert runs["mxfp8"].peak_memory_bytes > runs["delayed"].peak_memory_bytes  # scales and column-wise copies


# ------------------------------------------------------------------- GB300
def test_gb300_profile_and_rack():
    gb300, gb200 = load_profile("gb300"), load_profile("gb200")
    assert gb300.peak("fp4") == 15e15 and gb300.peak("fp8") == gb200.peak("fp8")
    assert gb300.hbm_capacity_bytes == 288e9 and gb300.power_limit_w == 1400
    assert gb300.link("ib").bandwidth_Bps == 2 * gb200.link("ib").bandwidth_Bps  # ConnectX-8 800G
    assert gb300.mx_block_scaling and NODE_OF_GPU["gb300"] == "gb300-nvl72"
    assert set(gb300.to_dict()) - {"sources"} <= {k.split(".")[0] for k in gb300.sources} | {"name"}


# ------------------------------------------------------------- scale swizzle
def test_mxfp8_swizzles_both_operands_scales_before_every_gemm():
    # Transformer Engine 2.7/2.9 swizzle MXFP8 scales inside each GEMM call: per operand one
    # kernel reading its E8M0 scales (one byte per 32 elements) and writing them swizzled.
    ops, work = _ops("mxfp8")
    gemms = [o.name for o in work.items if getattr(o, "kind", None) == "gemm" and o.dtype == "mxfp8"]
    assert len(gemms) == 12  # QKV, projection, MLP up and down: forward, input and weight gradients
    names = [o.name for o in work.items]
    for g in gemms:
        assert names.index(g + ".swizzle") < names.index(g), g
    m, n, k = S, F, H  # MLP-up's forward: the input S x H and the weight H x F
    sw = ops["mlp.up.swizzle"]
    assert (sw.bytes_read, sw.bytes_written, sw.kernels) == ((m * k + k * n) / 32, (m * k + k * n) / 32, 2)
    by_hand = 2 * (m * k + k * n) / 32 / (B200.hbm_bandwidth_Bps * B200.memory_efficiency) + 2 * B200.kernel_launch_s
    assert op_time(sw, B200) == pytest.approx(by_hand, rel=1e-12)
    wg = ops["mlp.down.wgrad.swizzle"]  # the saved input S x F and the output gradient S x H, column-wise
    assert wg.bytes_read == (F * S + S * H) / 32
    for recipe in ("delayed", "tensorwise", "blockwise", "nvfp4"):
        assert not [o for o in _ops(recipe)[0] if o.endswith(".swizzle")], recipe


def test_a_grouped_gemm_swizzles_its_experts_in_one_kernel_per_operand():
    from sim.program.fp8 import SWIZZLE_TENSORS_PER_KERNEL
    from sim.program.workload_moe import MoeShape
    e, k_top = 4, 2
    tiny = gpt("recipe-moe", L, H, 8, 4096, S, num_experts=e, moe_router_topk=k_top, moe_ffn_hidden_size=F)
    work = fp8_layer_work(layer_work(tiny, LayerRun(1), moe=MoeShape(ep=1, etp=1, load=S * k_top)),
                          fp8_precision("e4m3", "mxfp8"), 1, False, 1, False)
    ops = {o.name: o for o in work.items if hasattr(o, "kind")}
    rows = S * k_top // e  # balanced: each expert's copies
    up = ops["moe.experts.up"]
    assert (up.shape[0], up.shape[2], up.batch) == (rows, H, e)
    scales = (rows * H + H * up.shape[1]) * e / 32  # every expert's input split and weight
    sw = ops["moe.experts.up.swizzle"]
    assert (sw.bytes_read, sw.bytes_written) == (scales, scales)
    assert sw.kernels == 2 and e <= SWIZZLE_TENSORS_PER_KERNEL  # multi_tensor_swizzle_scaling_factors: one launch each
