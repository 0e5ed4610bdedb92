"""FP8 for the routed experts (``sim.program.fp8``): Megatron-Core's expert linears are TE
modules, so under FP8 their GEMMs run in FP8 with TE's casts (no sequence parallelism inside
an expert), their FP8 weights are gathered in one byte and their FP8 copies are held."""

import pytest

from sim.inputs.model import llama
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.inputs.hardware import load_profile
from sim.inputs.precision import fp8_precision
from sim.program.fp8 import fp8_layer_work
from sim.program.memory import fp8_weight_copy_bytes
from sim.program.memory.states import stage_param_split
from sim.program.workload import LayerRun, layer_work
from sim.program.workload_moe import MoeShape
from sim.session import Job, simulate_training

H, F, S, K, E = 512, 1024, 256, 2, 4
TINY = llama("tiny-moe", 2, H, 8, 8, 1024, 2000, S, num_experts=E, moe_router_topk=K, moe_ffn_hidden_size=F)


def _items(work):
    return {i.name: i for i in work.items if hasattr(i, "kind")}


@pytest.mark.parametrize("tp", [1, 2])
def test_expert_gemms_run_in_fp8_with_their_inputs_and_gradients_cast_and_transposed(tp):
    # ep = 1: the rank runs all E experts on the R = T*k routed copies of its T tokens
    # (T = S/tp under sequence parallelism, which Megatron-LM requires for MoE with tp > 1).
    # Inside an expert TE sees no sequence parallelism, so every FP8 input of an expert GEMM
    # is cast and transposed at once: read 2 bytes, write 2 (FP8 and its transpose) per element.
    m = 3
    work = layer_work(TINY, LayerRun(1, tp, tp > 1), moe=MoeShape(ep=1, etp=tp, load=S // tp * K))
    ops = _items(fp8_layer_work(work, fp8_precision("hybrid"), tp, tp > 1, microbatches=m, fp8_params=True))
    rows = S // tp * K * tp  # the tokens' copies, gathered over etp = tp
    f = F // tp
    for g in ("moe.experts.up", "moe.experts.down"):
        for suffix in ("", ".dgrad", ".wgrad"):
            assert ops[g + suffix].dtype == "fp8"
    assert ops["moe.router"].dtype == "bf16"
    for name, elems in (("moe.experts.up.to_fp8_t", rows * H), ("moe.experts.down.to_fp8_t", rows * f),
                        ("moe.experts.down.dgrad.to_fp8_t", rows * H),
                        ("moe.experts.up.dgrad.to_fp8_t", rows * 2 * f)):  # SwiGLU: gate and up
        assert (ops[name].bytes_read, ops[name].bytes_written) == pytest.approx((2 * elems, 2 * elems)), name
    for name, w in (("moe.experts.up.weight_transpose", E * H * 2 * f), ("moe.experts.down.weight_transpose", E * f * H)):
        assert (ops[name].bytes_read, ops[name].bytes_written) == pytest.approx((w / m, w / m)), name
    assert not any(n.startswith("moe.experts") and n.endswith(("wgrad.transpose", ".to_fp8")) for n in ops)


def test_expert_weights_are_gathered_in_one_byte_and_their_fp8_copies_held():
    plan = dict(dp=8, ep=4, micro_batch_size=1, global_batch_size=16, zero_stage=1, fp8_format="hybrid")
    topo, gpu = load_topology("dgx-h100"), load_profile("h100-sxm")
    gathered = {}
    for fp8_params in (False, True):
        run = simulate_training(Job(TINY, ParallelPlan(**plan, fp8_param_gather=fp8_params), gpu, topo))
        gathered[fp8_params] = sum(s.nbytes for s in run.trace.spans_of(0)
                                   if s.name.startswith("expert param allgather"))
    experts = stage_param_split(TINY, ParallelPlan(**plan), 0)[1]
    assert experts == pytest.approx(2 * (E // 4) * 3 * H * F)  # 2 layers, 1 local expert of gate, up, down
    assert gathered[False] == pytest.approx(2 * experts) and gathered[True] == pytest.approx(experts)
    # TE's FP8 weight and transpose (2 bytes a parameter) of the attention GEMMs and the experts
    attention = 2 * (H * (H + 2 * 512) + H * H)  # 2 layers; 8 heads of 64, 8 key/value groups: kv = h
    assert fp8_weight_copy_bytes(TINY, ParallelPlan(**plan), 0) == pytest.approx(2 * (attention + experts))


def test_expert_casts_run_one_kernel_per_expert_as_te_quantizes_each_split():
    """TE's GroupedLinear quantizes each expert's split on its own (``multi_tensor_quantize_impl``),
    except delayed scaling's one fused cast-transpose of all splits; current scaling launches a
    zeroing of the amax, an amax, a scale and a cast per split. E = 4 local experts (ep = 1), m = 8
    micro-batches; each kernel pays the profile's fixed per-kernel cost."""
    from sim.program.costs import op_time

    work = layer_work(TINY, LayerRun(1, 1, False), moe=MoeShape(ep=1, etp=1, load=S * K))
    kernels = {}
    for fmt, recipe in (("hybrid", "tensorwise"), ("hybrid", "delayed"), ("e4m3", "mxfp8")):
        ops = _items(fp8_layer_work(work, fp8_precision(fmt, recipe), 1, False, microbatches=8))
        kernels[recipe] = {n: o.kernels for n, o in ops.items() if n.startswith("moe.experts.up.")}
    # nvte_compute_amax per split: its amax zeroed (launch_amax_kernel's memset), then the amax kernel
    assert kernels["tensorwise"]["moe.experts.up.amax"] == 2 * E
    assert kernels["tensorwise"]["moe.experts.up.to_fp8_t"] == 2 * E  # scale from amax, cast, per split
    assert kernels["tensorwise"]["moe.experts.up.dgrad.to_fp8_t"] == 2 * E
    assert kernels["delayed"]["moe.experts.up.to_fp8_t"] == 1  # nvte_multi_cast_transpose, all splits
    assert kernels["mxfp8"]["moe.experts.up.quantize"] == E
    # the weights' casts run once per step, in its first micro-batch: ceil(4 / 8) = 1 per micro-batch
    assert kernels["tensorwise"]["moe.experts.up.weight_to_fp8_t"] == 1
    gpu = load_profile("h100-sxm")
    ops = _items(fp8_layer_work(work, fp8_precision("hybrid", "tensorwise"), 1, False, microbatches=8))
    cast = ops["moe.experts.up.to_fp8_t"]
    # an expert's cast is one of the MoE block's memory-bound kernels (moe_memory_relative_efficiency)
    moved = (cast.bytes_read + cast.bytes_written) / gpu.memory_rate(False, moe=True)
    assert op_time(cast, gpu) == pytest.approx(moved + 2 * E * gpu.kernel_launch_s, rel=1e-12)
    amax = ops["moe.experts.up.amax"]
    moved = (amax.bytes_read + amax.bytes_written) / gpu.memory_rate(False, moe=True)
    assert op_time(amax, gpu) == pytest.approx(moved + 2 * E * gpu.kernel_launch_s, rel=1e-12)
    # a dense layer's casts are one kernel each, its amax passes two (zero, then the amax kernel)
    dense = _items(fp8_layer_work(layer_work(TINY, LayerRun(1, 1, False)), fp8_precision("hybrid", "tensorwise"), 1, False))
    assert [n for n in dense if n.endswith(".amax")]
    assert all(o.kernels == (2 if n.endswith(".amax") else 1) for n, o in dense.items() if hasattr(o, "kernels"))


def test_te_pads_each_expert_split_for_the_quantized_grouped_gemm_by_hand():
    """Megatron-Core's TEGroupedMLP pads every local expert's split to Transformer Engine's
    alignment under FP8 (Fp8Padding: 16 rows, 32 under MXFP8) and unpads the down projection's
    output; TE returns the input untouched when the splits are aligned. Dropless, the routed
    counts are not: (align - 1)/2 rows per expert on average. E = 4 local experts of 128 rows
    (T = 256 tokens, k = 2, ep = 1), h = 512, BF16 activations, FP32 probabilities."""
    from sim.program.costs import op_time
    from sim.program.workload_moe import quant_align, quant_pad_rows

    assert (quant_align(None), quant_align("tensorwise"), quant_align("delayed"), quant_align("mxfp8")) == (0, 16, 16, 32)
    n, local, e = S * K, E, 2
    for align in (16, 32):
        shape = MoeShape(ep=1, etp=1, load=S * K, quant_align=align)
        pad = (align - 1) / 2
        assert quant_pad_rows(shape, n // local) == pad
        n2 = n + local * pad  # the padded rows
        ops = _items(fp8_layer_work(layer_work(TINY, LayerRun(1, 1, False), moe=shape),
                                    fp8_precision("e4m3", "mxfp8" if align == 32 else "tensorwise"), 1, False))
        expect = {"moe.experts.pad": (e * n * H + 4 * n, e * n2 * H + 4 * n2, 2),  # hidden states and probs
                  "moe.experts.unpad": (e * n2 * H, e * n * H, 1),
                  "moe.experts.unpad.grad": (e * n * H, e * n2 * H, 1),   # the unpadding's backward pads
                  "moe.experts.pad.grad": (e * n2 * H + 4 * n2, e * n * H + 4 * n, 2)}
        gpu = load_profile("h100-sxm")
        for name, (read, written, kernels) in expect.items():
            op = ops[name]
            assert (op.bytes_read, op.bytes_written, op.kernels) == pytest.approx((read, written, kernels)), name
            # memory-bound: its bytes at the profile's library-kernel rate times the MoE block's
            # relative rate (1 when unset), plus each kernel's fixed cost
            rate = gpu.hbm_bandwidth_Bps * gpu.memory_efficiency * (gpu.moe_memory_relative_efficiency or 1)
            t = (read + written) / rate + kernels * gpu.kernel_launch_s
            assert op_time(op, gpu) == pytest.approx(t, rel=1e-12), name
        names = [i.name for i in layer_work(TINY, LayerRun(1, 1, False), moe=shape).items]
        for before, after in (("moe.experts.pad", "moe.experts.up"), ("moe.experts.down", "moe.experts.unpad"),
                              ("moe.experts.unpad.grad", "moe.experts.down.dgrad"),
                              ("moe.experts.up.dgrad", "moe.experts.pad.grad")):
            assert names.index(after) == names.index(before) + 1, (before, after)


def test_aligned_splits_and_bf16_run_no_padding_kernel():
    """Drop-and-pad (a capacity factor) gives every local expert the same rows: padded by
    (-rows) mod align, nothing when they are a multiple (TE's "no padding needed"); BF16 never pads."""
    from sim.program.workload_moe import quant_pad_rows

    def names(shape):
        return {i.name for i in layer_work(TINY, LayerRun(1, 1, False), moe=shape).items}

    aligned = MoeShape(ep=1, etp=1, load=S * K, dropless=False, quant_align=32)  # 128 rows per expert
    assert quant_pad_rows(aligned, 128) == 0 and not {n for n in names(aligned) if ".pad" in n or "unpad" in n}
    odd = MoeShape(ep=1, etp=1, load=400, dropless=False, quant_align=32)  # 100 rows per expert: 28 more
    assert quant_pad_rows(odd, 100) == 28 and "moe.experts.pad" in names(odd)
    assert not {n for n in names(MoeShape(ep=1, etp=1, load=S * K)) if "pad" in n}


def test_moe_shape_takes_the_alignment_from_the_plans_recipe():
    from sim.program.dispatch import moe_shape

    base = dict(dp=4, ep=4, micro_batch_size=1, global_batch_size=8)
    assert moe_shape(TINY, ParallelPlan(**base), 0, S * K).quant_align == 0
    assert moe_shape(TINY, ParallelPlan(**base, fp8_format="hybrid", fp8_recipe="tensorwise"), 0, S * K).quant_align == 16
    assert moe_shape(TINY, ParallelPlan(**base, fp8_format="e4m3", fp8_recipe="mxfp8"), 0, S * K).quant_align == 32


def test_only_megatron_core_pads_the_expert_splits():
    # the padding is Megatron-Core's TEGroupedMLP's: another framework's experts get none here
    from sim.program.dispatch import moe_shape

    plan = dict(dp=4, ep=4, micro_batch_size=1, global_batch_size=8, fp8_format="hybrid", fp8_recipe="tensorwise")
    assert moe_shape(TINY, ParallelPlan(**plan, framework="megatron"), 0, S * K).quant_align == 16
    assert moe_shape(TINY, ParallelPlan(**plan, framework="automodel"), 0, S * K).quant_align == 0


def test_hybridep_pads_the_expert_rows_in_its_own_permutation():
    """Megatron-Core's HybridEP backend (``--moe-flex-dispatcher-backend hybridep``) passes the FP8
    recipe's alignment to its dispatch as ``pad_multiple`` (``_HybridEPManager.dispatch``,
    token_dispatcher.py at Megatron-LM cba6b0ed), whose permute kernel writes each local expert's rows
    padded to it; TEGroupedMLP's Fp8Padding then finds the splits aligned and returns its input.
    DeepEP's backend leaves them unaligned (no ``moe_router_padding_for_quantization``), so
    TEGroupedMLP pads. HybridEP's forward dispatch also gathers every rank's routing map and runs
    its metadata kernel on it (``HybridEPBuffer.dispatch_with_permute``). Everything else in the
    layer is the same: the HybridEP layer's ops are the DeepEP layer's less its four padding
    kernels, with those two before the forward exchange."""
    from sim.program.dispatch import moe_shape

    base = dict(dp=4, ep=4, micro_batch_size=1, global_batch_size=8, fp8_format="e4m3", fp8_recipe="mxfp8",
                dispatcher="flex")
    work = {}
    for backend in ("deepep", "hybridep"):
        plan = ParallelPlan(**base, moe_flex_dispatcher_backend=backend)
        shape = moe_shape(TINY, plan, 0, S * K)
        assert shape.quant_align == 32 and shape.dispatcher.backend == backend
        work[backend] = fp8_layer_work(layer_work(TINY, LayerRun(1, 1, False), moe=shape),
                                       fp8_precision("e4m3", "mxfp8"), 1, False)
    pads = {"moe.experts.pad", "moe.experts.unpad", "moe.experts.unpad.grad", "moe.experts.pad.grad"}
    deepep, hybridep = ([i for i in work[b].items] for b in ("deepep", "hybridep"))
    assert {i.name for i in deepep} & pads == pads
    key = lambda i: (i.name, i.phase, getattr(i, "bytes_read", None), getattr(i, "nbytes", None))  # noqa: E731
    extra = {"moe.dispatch.routing_map", "moe.dispatch.metadata"}
    assert [key(i) for i in deepep if i.name not in pads] == [key(i) for i in hybridep if i.name not in extra]
    # T = 256 tokens a rank, E = 4 experts, ep 4: a 256 x 4 map of 1-byte flags from each of 4 ranks;
    # the kernel reads the 4,096 gathered flags and writes an int32 rank map of 256 x 4 entries and
    # a 256 x 4 local-expert map (one local expert a rank); right before the exchange
    got = {i.name: i for i in hybridep}
    assert (got["moe.dispatch.routing_map"].collective, got["moe.dispatch.routing_map"].nbytes) == ("all_gather", 4096)
    assert (got["moe.dispatch.metadata"].bytes_read, got["moe.dispatch.metadata"].bytes_written) == (4096, 4 * 1024 + 1024)
    names = [i.name for i in hybridep]
    assert names.index("moe.dispatch.metadata") + 1 == names.index("moe.dispatch.rdma")
    assert not extra & {i.name for i in deepep}
    # both permute the received tokens once the exchange is done
    assert {i.name: i for i in hybridep}["moe.permute.map"].after == "moe.dispatch.rdma"
    assert {i.name: i for i in deepep}["moe.permute.map"].after == "moe.dispatch.rdma"


def test_the_flex_backends_hold_their_own_sms_unless_the_plan_says():
    """Megatron-Core's defaults: moe_deepep_num_sms 20, moe_hybridep_num_sms 16 (TransformerConfig at
    cba6b0ed); Megatron-Bridge's performance recipes set HybridEP's to 32 (``moe_flex_num_sms``)."""
    from sim.program.dispatch import moe_shape

    base = dict(dp=4, ep=4, micro_batch_size=1, global_batch_size=8, dispatcher="flex")
    sms = lambda **kw: moe_shape(TINY, ParallelPlan(**base, **kw), 0, S * K).sms  # noqa: E731
    assert (sms(), sms(moe_flex_dispatcher_backend="hybridep"),
            sms(moe_flex_dispatcher_backend="hybridep", moe_flex_num_sms=32)) == (20, 16, 32)
