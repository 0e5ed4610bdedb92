"""The Transformer Engine release (``transformer_engine``, ``sim.inputs.precision``): from TE 2.0
a per-tensor FP8 tensor on a GPU whose FP8 GEMMs take any layout (Blackwell's profiles:
``fp8_gemm_any_layout``) is one row-wise copy, so the layer runs no FP8 transposes and its casts
write one copy instead of two. Checked against a hand count of the bytes on a tiny layer; Hopper,
and TE 1.x on Blackwell, run what they ran before; MXFP8 is the same on every release; the
grouped GEMMs' casts lose TE's fused multi-tensor cast-transpose. Refusals of bad versions are
in test_bad_inputs."""

import pytest

from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt, llama
from sim.inputs.plan import ParallelPlan
from sim.inputs.precision import CURRENT_TE, NON_TN_FP8_SINCE, RECIPES, Precision, te_version
from sim.program.costs import op_time
from sim.program.fp8 import fp8_layer_work
from sim.program.memory import fp8_weight_copy_bytes, stage_memory_bytes
from sim.program.workload import LayerRun, layer_work, plan_layer_work
from sim.program.workload_moe import MoeShape

B200, GB200, GB300, H100 = (load_profile(n) for n in ("b200", "gb200", "gb300", "h100-sxm"))
S, H, F = 256, 512, 2048  # tokens per micro-batch, hidden, MLP width (4h, GeLU)
MODEL = gpt("te-layer", 2, H, 8, 4096, S)  # 8 heads of 64 (MHA: the QKV output is 3h)
GEMM_PARAMS = H * 3 * H + H * H + 2 * H * F  # QKV, projection, MLP up and down


def _precision(recipe="delayed", te="2.9"):
    return Precision("hybrid", RECIPES[recipe], transformer_engine=te_version(te))


def _work(precision, any_layout, tp=1, sp=False, fp8_params=False):
    return fp8_layer_work(layer_work(MODEL, LayerRun(1, tp, sp)), precision, tp, sp, 1, fp8_params, any_layout)


def _names(work):
    return {i.name for i in work.items if hasattr(i, "kind")}


def _layer_s(work, gpu):
    return sum(op_time(i, gpu) for i in work.items if hasattr(i, "kind"))


def _transposing(names):
    return {n for n in names if n.endswith(("transpose", "_t"))}


def test_the_profiles_say_which_gpus_take_any_fp8_layout():
    assert (B200.fp8_gemm_any_layout, GB200.fp8_gemm_any_layout, GB300.fp8_gemm_any_layout) == (True, True, True)
    assert not H100.fp8_gemm_any_layout and not load_profile("h200").fp8_gemm_any_layout
    assert te_version("2.9") == (2, 9) and te_version("v1.14.0+87fbe81") == (1, 14, 0)
    assert NON_TN_FP8_SINCE == (2, 0) and te_version(CURRENT_TE) >= NON_TN_FP8_SINCE


def test_blackwell_from_te_2_drops_the_transposes_and_the_layer_by_exactly_their_bytes():
    """Delayed scaling, tp 1, one micro-batch. What TE 1.14 makes on top of TE 2.9 on a B200, by
    hand (1-byte FP8 elements): the weight gradients of QKV and MLP-up transpose their saved FP8
    input (S·H read and S·H written, each one kernel); the casts of the projection's and
    MLP-down's inputs (S·H, S·F), of the four output gradients (QKV 3·S·H, projection S·H,
    MLP-up S·F, MLP-down S·H) and of the four weights (GEMM_PARAMS) write a transposed copy
    as big as the FP8 one. Everything else (the GEMMs, the norms' FP8 output) is the same."""
    old, new = _work(_precision(te="1.14"), True), _work(_precision(te="2.9"), True)
    assert _transposing(_names(new)) == set()
    assert _transposing(_names(old)) == {
        "attn.qkv.wgrad.transpose", "mlp.up.wgrad.transpose", "attn.proj.to_fp8_t", "mlp.down.to_fp8_t",
        "attn.qkv.dgrad.to_fp8_t", "attn.proj.dgrad.to_fp8_t", "mlp.up.dgrad.to_fp8_t", "mlp.down.dgrad.to_fp8_t",
        "attn.qkv.weight_to_fp8_t", "attn.proj.weight_to_fp8_t", "mlp.up.weight_to_fp8_t", "mlp.down.weight_to_fp8_t"}
    transposes = 2 * (2 * S * H)
    second_copies = S * H + S * F + (3 * S * H + S * H + S * F + S * H) + GEMM_PARAMS
    rate = B200.hbm_bandwidth_Bps * B200.memory_efficiency
    expected = (transposes + second_copies) / rate + 2 * B200.kernel_launch_s
    assert _layer_s(old, B200) - _layer_s(new, B200) == pytest.approx(expected, rel=1e-9)
    cast = {i.name: i for i in new.items if hasattr(i, "kind")}["mlp.down.to_fp8"]
    assert (cast.bytes_read, cast.bytes_written) == (2 * S * F, S * F)  # bf16 in, one fp8 copy out


def test_hopper_and_te_1_keep_every_transpose():
    for recipe, te in (("delayed", "1.14"), ("delayed", "2.9"), ("tensorwise", "2.9")):
        hopper = _work(_precision(recipe, te), False, tp=2, sp=True)
        assert hopper == _work(_precision(recipe, "1.13" if recipe == "delayed" else "2.2"), False, tp=2, sp=True)
    # Blackwell under TE 1.14 runs Hopper's kernels
    assert _work(_precision(te="1.14"), True, tp=2, sp=True) == _work(_precision(te="1.14"), False, tp=2, sp=True)
    assert _layer_s(_work(_precision(te="1.14"), True), B200) == _layer_s(_work(_precision(te="1.14"), False), B200)


def test_current_scaling_under_sequence_parallelism_gathers_without_transposing():
    """Tensorwise, tp 2 with sequence parallelism: every GEMM's FP8 input saved for its weight
    gradient (cast without its transpose before the gather, or cast locally by the row-parallel
    GEMMs under sequence parallelism) and the gathered output gradients of the projection and
    MLP-down are transposed on Hopper, not on Blackwell under TE 2.9; the amax passes and their
    all-reduces stay."""
    hopper, blackwell = (_names(_work(_precision("tensorwise"), a, tp=2, sp=True)) for a in (False, True))
    assert _transposing(blackwell) == set()
    gemms = ("attn.qkv", "attn.proj", "mlp.up", "mlp.down")
    assert {n for n in hopper - blackwell if n.endswith("transpose")} == {
        *(f"{g}.wgrad.transpose" for g in gemms), "attn.proj.dgrad.transpose", "mlp.down.dgrad.transpose"}
    assert {n for n in hopper if "amax" in n} == {n for n in blackwell if "amax" in n}


def test_fp8_weights_need_no_step_kernel_on_blackwell():
    """With FP8 weights (``fp8_params``) Hopper transposes each weight once a step; on Blackwell
    under TE 2.x the FP8 weight is the GEMM's operand as it is."""
    hopper = _names(_work(_precision(), False, fp8_params=True))
    blackwell = _names(_work(_precision(), True, fp8_params=True))
    assert {n for n in hopper if "weight" in n} == {f"{g}.weight_transpose" for g in
                                                     ("attn.qkv", "attn.proj", "mlp.up", "mlp.down")}
    assert {n for n in blackwell if "weight" in n} == set()


def test_mxfp8_is_the_same_on_every_release():
    """MXFP8's column-wise copy is quantized from BF16 with its own blocks (not a transpose), on
    every release that has the recipe."""
    assert _work(_precision("mxfp8", "2.0"), True) == _work(_precision("mxfp8", "2.9"), True)


def test_grouped_gemm_casts_run_one_kernel_per_expert_without_the_transposes():
    """TE's fused ``nvte_multi_cast_transpose`` of all the splits needs both FP8 copies
    (``multi_tensor_quantize_impl``: columnwise data present); without the transposes each of
    the E local experts' splits is cast on its own."""
    e = 4
    model = llama("te-moe", 2, H, 8, 8, 1024, 2000, S, num_experts=e, moe_router_topk=2, moe_ffn_hidden_size=1024)
    work = layer_work(model, LayerRun(1, 1, False), moe=MoeShape(ep=1, etp=1, load=S * 2))
    kernels = {}
    for any_layout in (False, True):
        ops = fp8_layer_work(work, _precision(), 1, False, 1, False, any_layout).items
        kernels[any_layout] = {i.name: i.kernels for i in ops if i.name.startswith("moe.experts.up.")}
    assert kernels[False]["moe.experts.up.to_fp8_t"] == 1
    assert kernels[True]["moe.experts.up.to_fp8"] == e


def test_a_plan_carries_the_release_into_the_layer_it_builds():
    plan = dict(dp=8, global_batch_size=8, fp8_format="hybrid")
    for te, gpu, transposes in (("1.14", B200, True), ("2.9", B200, False), (None, B200, False),
                                ("2.9", H100, True), ("2.9", None, True)):
        work = plan_layer_work(MODEL, ParallelPlan(transformer_engine=te, **plan), profile=gpu)
        assert bool(_transposing(_names(work))) is transposes, (te, gpu and gpu.name)
    assert ParallelPlan(**plan).summary().get("transformer_engine") is None  # the default is not printed
    assert ParallelPlan(transformer_engine="2.7", **plan).summary()["transformer_engine"] == "2.7"


def test_a_blackwell_rank_holds_one_fp8_copy_of_each_per_tensor_weight_under_te_2():
    """TE 1.x keeps the FP8 weight and its transpose (2 bytes a GEMM weight parameter beside the
    BF16 weight); TE 2.x on Blackwell keeps the FP8 weight alone (1 byte), and with FP8 weights
    (``fp8_param_gather``) the FP8 weight is the parameter: 1 byte where the 16-bit weight's 2
    are counted, -1. MXFP8 keeps both quantized copies on every GPU."""
    gemm_weights = MODEL.num_layers * GEMM_PARAMS  # pp 1, tp 1: the rank holds every layer
    for fp8_params, old, new in ((False, 2, 1), (True, 0, -1)):
        plans = {te: ParallelPlan(dp=2, global_batch_size=2, zero_stage=1, fp8_format="hybrid",
                                  fp8_param_gather=fp8_params, transformer_engine=te) for te in ("1.14", "2.9")}
        assert fp8_weight_copy_bytes(MODEL, plans["1.14"], 0, True) == pytest.approx(old * gemm_weights)
        assert fp8_weight_copy_bytes(MODEL, plans["2.9"], 0, True) == pytest.approx(new * gemm_weights)
        assert fp8_weight_copy_bytes(MODEL, plans["2.9"], 0, False) == pytest.approx(old * gemm_weights)  # Hopper
        weights = {te: stage_memory_bytes(MODEL, plan, 0, any_layout=True)["weights"] for te, plan in plans.items()}
        assert weights["1.14"] - weights["2.9"] == pytest.approx(gemm_weights)
    mx = ParallelPlan(dp=2, global_batch_size=2, fp8_format="e4m3", fp8_recipe="mxfp8")
    assert fp8_weight_copy_bytes(MODEL, mx, 0, True) == pytest.approx(2 * (1 + 1 / 32) * gemm_weights)
