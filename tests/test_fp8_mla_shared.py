"""FP8 for multi-head latent attention's projections and the shared experts
(``sim.program.fp8``): Megatron-Core builds both from Transformer Engine linears (MLA's
``TELinear`` down-projections and ``TELayerNormColumnParallelLinear`` up-projections, the
shared experts' ``TEColumnParallelLinear`` and ``TERowParallelLinear``), so under
``fp8_autocast`` they run in FP8 with TE's casts around them; the shared experts' up-projection
keeps its BF16 input and casts it again for its weight gradient (``save_original_input``)."""

from dataclasses import replace

import pytest

from sim.inputs.model import llama
from sim.inputs.plan import ParallelPlan
from sim.inputs.precision import fp8_precision
from sim.program.fp8 import fp8_layer_work
from sim.program.memory.states import fp8_layer_weights, fp8_weight_copy_bytes, stage_param_split
from sim.program.workload import LayerRun, layer_work
from sim.program.workload_moe import MoeShape

S, H, HEADS = 16, 64, 4
QR, KVR, QK, ROPE, V = 32, 16, 16, 8, 16  # query rank, key/value rank, head widths
E, K, F, SHARED = 4, 2, 96, 64
MLA_MOE = replace(llama("mla-moe", 2, H, HEADS, HEADS, 160, 100, S, num_experts=E, moe_router_topk=K,
                        moe_ffn_hidden_size=F, moe_shared_expert_intermediate_size=SHARED),
                  q_lora_rank=QR, kv_lora_rank=KVR, qk_head_dim=QK, qk_pos_emb_head_dim=ROPE, v_head_dim=V)


def _ops(fmt="hybrid", recipe="delayed", m=1):
    work = layer_work(MLA_MOE, LayerRun(1, 1, False), moe=MoeShape(ep=1, etp=1, load=S * K))
    return {i.name: i for i in fp8_layer_work(work, fp8_precision(fmt, recipe), 1, False, microbatches=m).items
            if hasattr(i, "kind")}


def test_mla_projections_and_shared_experts_run_in_fp8_and_the_router_stays_bf16():
    ops = _ops()
    for g in ("attn.q_down", "attn.q_up", "attn.kv_down", "attn.kv_up", "moe.shared.up", "moe.shared.down"):
        for suffix in ("", ".dgrad", ".wgrad"):
            assert ops[g + suffix].dtype == "fp8", g + suffix
    assert ops["moe.router"].dtype == "bf16"
    assert ops["attn.core"].dtype == "bf16"


def test_casts_by_hand_under_delayed_scaling_on_hopper():
    # Hopper, delayed scaling (one scale from the history, per-tensor casts with their transposes).
    ops = _ops()
    # The down-projections read the attention norm's BF16 output (16 tokens x 64): cast and
    # transposed at once, read 2 bytes and write 2 per element.
    for g in ("attn.q_down", "attn.kv_down"):
        cast = ops[f"{g}.to_fp8_t"]
        assert (cast.bytes_read, cast.bytes_written) == pytest.approx((2 * S * H, 2 * S * H)), g
    # The up-projections fuse the compressed query's and key/value's norms: the norm writes FP8
    # (1 byte an element, where BF16 writes 2), and the weight gradient transposes that saved copy.
    bf16 = {i.name: i for i in layer_work(MLA_MOE, LayerRun(1, 1, False),
                                          moe=MoeShape(ep=1, etp=1, load=S * K)).items if hasattr(i, "kind")}
    for norm, rank, g in (("attn.q_down.norm", QR, "attn.q_up"), ("attn.kv_down.norm", KVR, "attn.kv_up")):
        assert bf16[norm].bytes_written == pytest.approx(2 * S * rank)
        assert ops[norm].bytes_written == pytest.approx(S * rank)
        assert f"{g}.to_fp8_t" not in ops and f"{g}.to_fp8" not in ops
        t = ops[f"{g}.wgrad.transpose"]
        assert (t.bytes_read, t.bytes_written) == pytest.approx((S * rank, S * rank))
    # The shared experts' up-projection (SwiGLU: gate and up, 2 x 64 wide) casts its 16 x 64 input
    # once for the forward (no transpose: it keeps the BF16 input) and again, from BF16, for its
    # weight gradient; its down-projection casts its 16 x 64 input with the transpose.
    fwd, wgrad = ops["moe.shared.up.to_fp8"], ops["moe.shared.up.wgrad.to_fp8"]
    assert (fwd.bytes_read, fwd.bytes_written) == pytest.approx((2 * S * H, S * H))
    assert (wgrad.bytes_read, wgrad.bytes_written) == pytest.approx((2 * S * H, S * H))
    assert "moe.shared.up.to_fp8_t" not in ops and "moe.shared.up.wgrad.transpose" not in ops
    down = ops["moe.shared.down.to_fp8_t"]
    assert (down.bytes_read, down.bytes_written) == pytest.approx((2 * S * SHARED, 2 * S * SHARED))
    # Weights: cast with their transposes from BF16, read 2 bytes and write 2 a parameter.
    w = ops["attn.kv_up.weight_to_fp8_t"]
    assert (w.bytes_read, w.bytes_written) == pytest.approx((2 * KVR * HEADS * (QK + V), 2 * KVR * HEADS * (QK + V)))


def test_mxfp8_quantizes_one_copy_of_the_shared_experts_saved_input_each_time():
    # MXFP8: a copy is 1 byte an element plus one 1-byte scale per 32 elements. A tensor used once
    # per direction is quantized into both copies at once (2 copies written); the shared experts'
    # up-projection writes its forward copy, and its weight gradient the other.
    ops = _ops("e4m3", "mxfp8")
    copy = 1 + 1 / 32
    fwd, wgrad = ops["moe.shared.up.quantize"], ops["moe.shared.up.wgrad.quantize"]
    assert (fwd.bytes_read, fwd.bytes_written) == pytest.approx((2 * S * H, copy * S * H))
    assert (wgrad.bytes_read, wgrad.bytes_written) == pytest.approx((2 * S * H, copy * S * H))
    q = ops["attn.q_down.quantize"]
    assert (q.bytes_read, q.bytes_written) == pytest.approx((2 * S * H, 2 * copy * S * H))
    # the norms write BF16 under MXFP8: the up-projections quantize the norm's output themselves
    up = ops["attn.q_up.quantize"]
    assert (up.bytes_read, up.bytes_written) == pytest.approx((2 * S * QR, 2 * copy * S * QR))


def test_fp8_weights_of_an_mla_moe_layer_by_hand():
    # MLA: q_down 64x32 and kv_down 64x(16+8) replicated on both tensor-parallel ranks; q_up
    # 32x(4 heads x 24), kv_up 16x(4 x (16+16)) and the projection (4 x 16)x64 split over 2;
    # shared experts (SwiGLU) 3 x 64 x 64 split over 2; the router and the routed experts are not
    # counted here.
    replicated = H * QR + H * (KVR + ROPE)
    split = QR * HEADS * (QK + ROPE) + KVR * HEADS * (QK + V) + HEADS * V * H + 3 * H * SHARED
    assert fp8_layer_weights(MLA_MOE, 2, 0) == pytest.approx(replicated + split / 2)
    # A dense model whose query is wider than its hidden size (8 heads of 16 on a 64-wide model,
    # 2 key/value groups): QKV 64 x (128 + 2 x 32) and the projection 128 x 64.
    wide = replace(llama("wide", 2, H, 8, 2, 160, 100, S), kv_channels=16)
    assert wide.q_dim == 128
    assert fp8_layer_weights(wide, 1, 0) == pytest.approx(H * (128 + 64) + 128 * H + 3 * H * 160)


def test_fp8_weight_copies_count_the_mla_and_shared_weights():
    plan = ParallelPlan(dp=4, ep=4, micro_batch_size=1, global_batch_size=8, zero_stage=1, fp8_format="hybrid")
    experts = stage_param_split(MLA_MOE, plan, 0)[1]
    layers = sum(fp8_layer_weights(MLA_MOE, 1, i) for i in range(2))
    assert fp8_weight_copy_bytes(MLA_MOE, plan, 0) == pytest.approx(2 * (layers + experts))
