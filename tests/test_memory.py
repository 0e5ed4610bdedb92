"""Memory model: ZeRO Table 1 cell by cell, Korthikanti Table 2 case by case, pipeline
in-flight counts, per-rank parameter shards, ZeRO-3 temporaries."""

import pytest

from sim.errors import InputError
from sim.program.memory import (
    Storing,
    activation_bytes_per_layer,
    activation_terms,
    chunk_activation_bytes,
    grad_bucket_bytes,
    embedding_activation_bytes,
    head_activation_bytes,
    inflight_chunks,
    inflight_per_chunk,
    layer_param_bytes,
    layer_params_per_rank,
    model_state_bytes,
    offload_copy_bytes,
    optimizer_shard_params,
    param_allgather_bytes,
    recompute_working_bytes,
    stage_activation_bytes,
    stage_memory_bytes,
    stage_params_per_rank,
    stage_resident_bytes,
    sync_bucket_bytes,
    zero3_depth,
    zero3_gathered_param_bytes,
    zero_temporary_bytes,
)
from sim.inputs.model import gpt, llama, preset
from sim.inputs.plan import ParallelPlan

ND = (1, 4, 16, 64, 256, 1024)

# ZeRO (Rajbhandari et al. SC'20) Table 1, GB = 1e9 bytes of model states per device.
TABLE1 = {
    ("7.5B", 1): (120, 52.5, 35.6, 31.4, 30.4, 30.1),
    ("7.5B", 2): (120, 41.3, 21.6, 16.6, 15.4, 15.1),
    ("7.5B", 3): (120, 30, 7.5, 1.88, 0.47, 0.12),
    ("128B", 3): (2048, 512, 128, 32, 8, 2),
    ("1T", 1): (16000, 7000, 4750, 4187, 4046, 4011),
}
# GPT shapes whose own parameter count is the Ψ each row uses (the paper gives no shapes):
# 7.504B, 128.03B and 1000.006B parameters.
SHAPES = {
    "7.5B": preset("zero-7.5b"),
    "128B": gpt("zero-128b", 207, 7168, 56, 51200, 2048),
    "1T": gpt("zero-1t", 164, 22528, 176, 51200, 1024),
}


def _decimals(printed) -> int:
    text = repr(float(printed)).rstrip("0").rstrip(".")
    return len(text.split(".")[1]) if "." in text else 0


def within_paper_rounding(computed: float, printed) -> bool:
    """The paper rounds most cells half-up but truncates others (4187.5 -> 4187,
    35.625 -> 35.6): accept computed in [printed - half a unit, printed + one unit)."""
    unit = 10.0 ** -_decimals(printed)
    return printed - unit / 2 - 1e-9 <= computed < printed + unit


@pytest.mark.parametrize("row", sorted(TABLE1))
def test_zero_table1_every_cell(row):
    size, stage = row
    psi = SHAPES[size].num_params
    for nd, printed in zip(ND, TABLE1[row]):
        gb = model_state_bytes(psi, nd, stage).total / 1e9
        assert within_paper_rounding(gb, printed), (size, stage, nd, gb, printed)


def test_zero_stage_formulas():
    psi, nd = 1e9, 8
    assert model_state_bytes(psi, nd, 0).total == 16 * psi
    assert model_state_bytes(psi, nd, 1).total == 4 * psi + 12 * psi / nd
    assert model_state_bytes(psi, nd, 2).total == 2 * psi + 14 * psi / nd
    assert model_state_bytes(psi, nd, 3).total == 16 * psi / nd
    s = model_state_bytes(psi, nd, 2)
    assert (s.params_bytes, s.grads_bytes, s.optimizer_bytes) == (2 * psi, 2 * psi / nd, 12 * psi / nd)


# Korthikanti et al. 2022 Table 3 shapes: 22B (a=64, h=6144, t=8) and 175B (a=96, h=12288, t=8).
@pytest.mark.parametrize("name", ["gpt-22b", "gpt-175b"])
@pytest.mark.parametrize("b", [1, 4])
def test_korthikanti_table2_every_case(name, b):
    m = preset(name)
    s, h, a, t = m.seq_length, m.hidden_size, m.num_attention_heads, 8
    sbh = s * b * h
    cases = {
        ("none", 1, False): sbh * (34 + 5 * a * s / h),
        ("none", t, False): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        ("none", t, True): sbh / t * (34 + 5 * a * s / h),
        ("selective", t, False): sbh * (10 + 24 / t),
        ("selective", t, True): sbh * 34 / t,
        ("selective", 1, False): sbh * 34,
        ("full", 1, False): 2 * sbh,
        ("full", t, False): 2 * sbh,
    }
    for (recompute, tp, sp), expected in cases.items():
        got = activation_bytes_per_layer(m, Storing.of(b, tp, sp, recompute, flash_attention=False))
        assert got == pytest.approx(expected, rel=1e-12), (recompute, tp, sp)
    # Under sequence parallelism Megatron keeps the full-recompute checkpoint sharded too.
    assert activation_bytes_per_layer(m, Storing.of(b, t, True, "full")) == pytest.approx(2 * sbh / t)


def test_flash_attention_stores_no_s_squared_tensor():
    m = preset("gpt-175b")
    b, t = 1, 8
    s, a = m.seq_length, m.num_attention_heads
    flash = activation_bytes_per_layer(m, Storing.of(b, t, True, "none", flash_attention=True))
    sel = activation_bytes_per_layer(m, Storing.of(b, t, True, "selective", flash_attention=False))
    assert flash == pytest.approx(sel + 4 * a * s * b / t)     # + fp32 log-sum-exp per row


def test_llama_terms_by_hand():
    # s=16, b=2, h=64, a=8, kv=2, ffn=160, no dropout, tp=2, sp: every term by hand.
    m = llama("t", 2, 64, 8, 2, 160, 100, 16)
    terms = activation_terms(m, Storing.of(2, tp=2, sequence_parallel=True, recompute="selective"))
    sbh = 16 * 2 * 64
    assert terms == {
        "attn.norm.input": 2 * sbh / 2, "attn.qkv.input": 2 * sbh / 2,
        "attn.q": 2 * sbh / 2, "attn.k": 2 * sbh * 2 / 8 / 2, "attn.v": 2 * sbh * 2 / 8 / 2,
        "attn.proj.input": 2 * sbh / 2, "mlp.norm.input": 2 * sbh / 2, "mlp.up.input": 2 * sbh / 2,
        "mlp.gate": 2 * 16 * 2 * 160 / 2, "mlp.up": 2 * 16 * 2 * 160 / 2, "mlp.down.input": 2 * 16 * 2 * 160 / 2,
    }


def test_pipeline_inflight_counts():
    # 1F1B: stage i holds p - i micro-batches; interleaved first stage p·(1 + (p-1)/(p·v)) chunks' worth.
    plan = ParallelPlan(pp=4, global_batch_size=16)
    assert [inflight_chunks(plan, i) for i in range(4)] == [4, 3, 2, 1]
    assert inflight_chunks(ParallelPlan(pp=4, global_batch_size=2), 0) == 2   # fewer micro-batches than stages
    for p, v in ((4, 2), (8, 3), (2, 4)):
        pl = ParallelPlan(pp=p, vpp=v, global_batch_size=8 * p)
        m = gpt("x", p * v * 2, 64, 4, 100, 16, dropout=False)
        per_layer = activation_bytes_per_layer(m, Storing.of(1))
        layers_per_stage = m.num_layers // p
        first = stage_activation_bytes(m, pl, 0)
        assert first == pytest.approx(p * layers_per_stage * per_layer * (1 + (p - 1) / (p * v)))


def test_inflight_by_schedule():
    # p = 4, m = 8. GPipe: all m forwards before any backward. 1F1B: p - i. ZB-H1: rank i
    # runs p - 1 - i warm-up forwards and delays its W passes by i micro-batches, and W
    # frees a micro-batch's activations, so (p - i) + i = p on every stage (Qi et al. ICLR
    # 2024: p·M_B). ZB-H2 fills every stage to its limit 2p - 1 ((2p-1)·M_B).
    def counts(schedule, m=8):
        plan = ParallelPlan(pp=4, global_batch_size=m, schedule=schedule)
        return [inflight_chunks(plan, i) for i in range(4)]
    assert counts("gpipe") == [8, 8, 8, 8]
    assert counts("1f1b") == [4, 3, 2, 1]
    assert counts("zb-h1") == [4, 4, 4, 4]
    assert counts("zb-h2") == [7, 7, 7, 7]
    assert counts("zb-h2", m=2) == counts("zb-h1", m=2) == counts("gpipe", m=2) == [2, 2, 2, 2]


def _schedule_peak_per_chunk(schedule, rank, weights=None):
    """Walk the rank's steps: per chunk, the (stage, micro-batch) pairs between their F
    and their last backward step (B, or W when split), at the first moment their
    (weighted) total is highest."""
    weights = weights or (1,) * schedule.vpp
    live, best, at_best = [0] * schedule.vpp, -1, None
    last_bwd = "W" if any(st.kind == "W" for st in schedule.ranks[rank]) else "B"
    for st in schedule.ranks[rank]:
        chunk = st.stage // schedule.pp
        if st.kind == "F":
            live[chunk] += 1
        elif st.kind == last_bwd:
            live[chunk] -= 1
        level = sum(w * n for w, n in zip(weights, live))
        if level > best:
            best, at_best = level, tuple(live)
    return at_best


@pytest.mark.parametrize("name,vpps", [("gpipe", (1,)), ("1f1b", (1,)), ("zb-h1", (1,)), ("zb-h2", (1,)),
                                       ("interleaved", (2, 3, 4))])
def test_inflight_counts_are_what_the_generated_schedules_hold(name, vpps):
    # The estimate's counts against the schedules the simulator runs, p = 2..8 and m below,
    # at and above p (interleaved: multiples of p, m = p included), chunk by chunk.
    from sim.program.schedules import build_schedule

    for p in range(2, 9):
        for v in vpps:
            ms = {1, 2, p - 1, p, p + 1, 2 * p - 1, 2 * p, 3 * p + 1}
            if name == "interleaved":
                ms = {p, 2 * p, 3 * p}
            for m in sorted(x for x in ms if x >= 1):
                sched = build_schedule(name, p, m, v)
                plan = ParallelPlan(pp=p, vpp=v, global_batch_size=m, schedule=name)
                for i in range(p):
                    assert inflight_per_chunk(plan, i) == _schedule_peak_per_chunk(sched, i), (p, v, m, i)
                    if v > 1:   # chunks of unequal bytes: the byte peak, not the count peak
                        for w in ((7,) + (1,) * (v - 1), (1,) * (v - 1) + (9,), tuple(range(1, v + 1))):
                            assert inflight_per_chunk(plan, i, w) == _schedule_peak_per_chunk(sched, i, w)
                if name in ("zb-h1", "zb-h2"):
                    # Qi et al.: the peak over stages is p·M_B (ZB-H1), (2p-1)·M_B (ZB-H2)
                    limit = p if name == "zb-h1" else 2 * p - 1
                    assert max(inflight_chunks(plan, i) for i in range(p)) == min(limit, m)


@pytest.mark.parametrize("schedule,vpp,m,first", [
    ("gpipe", 1, 4, None), ("1f1b", 1, 8, None), ("1f1b", 1, 2, None), ("zb-h1", 1, 8, None),
    ("zb-h1", 1, 3, None), ("zb-h2", 1, 8, None), ("zb-h2", 1, 5, None), ("interleaved", 2, 8, None),
    ("interleaved", 2, 4, None), ("zb-h1", 1, 8, 1), ("interleaved", 2, 8, 10)])
def test_estimated_stage_activations_match_the_simulated_memory_timeline(schedule, vpp, m, first):
    # What the estimate says each stage stores (sim.program.estimate uses stage_activation_bytes)
    # against the peak of the activations category on that stage's rank in a real
    # simulate_training run; a model with dropout, so the embedding's mask and the
    # output layer's logits count on the first and last stage too.
    from sim.program.estimate import estimate
    from sim.inputs.hardware import load_profile
    from sim.results.memory_timeline import timeline
    from sim.inputs.topology_build import load_topology
    from sim.session import Job, simulate_training

    h100 = load_profile("h100-sxm")
    model = gpt("small", 16, 256, 4, 512, 128)
    p = 4
    plan = ParallelPlan(pp=p, vpp=vpp, global_batch_size=m, schedule=schedule, first_stage_layers=first)
    run = simulate_training(Job(model, plan, h100, load_topology("dgx-h100")))
    simulated = [max(timeline(run.trace, plan.rank(pp=s))[1]["activations"]) for s in range(p)]
    estimated = [stage_activation_bytes(model, plan, s) for s in range(p)]
    assert estimated == pytest.approx(simulated, rel=1e-12)
    est = estimate(model, plan, h100)
    assert est.memory["activations"] == pytest.approx(simulated[est.worst_stage], rel=1e-12)


def test_interleaved_inflight_by_chunk_follows_megatron_order():
    # p = 2, v = 2, m = 4. Rank 0 warms up with (p-1)·2 + (v-1)·p = 4 forwards,
    # mb0/c0, mb1/c0, mb0/c1, mb1/c1, then forwards mb2/c0 before its first backward.
    plan = ParallelPlan(pp=2, vpp=2, global_batch_size=4)
    assert inflight_per_chunk(plan, 0) == (3, 2)
    # rank 1: (v-1)·p = 2 warm-up forwards mb0/c0, mb1/c0, then mb0/c1.
    assert inflight_per_chunk(plan, 1) == (2, 1)
    # m = p caps the count at m·v: every chunk holds all m micro-batches.
    assert inflight_per_chunk(ParallelPlan(pp=4, vpp=3, global_batch_size=4), 0) == (4, 4, 4)


def test_gpipe_holds_every_microbatch_on_every_stage():
    m = preset("gpt-22b")                              # dropout: the embedding stores a mask
    plan = ParallelPlan(pp=4, global_batch_size=8, schedule="gpipe")
    per_layer = activation_bytes_per_layer(m, Storing.of(1))
    assert stage_activation_bytes(m, plan, 0) == pytest.approx(
        8 * 12 * per_layer + 8 * embedding_activation_bytes(m, 1))
    assert stage_activation_bytes(m, plan, 1) == pytest.approx(8 * 12 * per_layer)
    assert stage_activation_bytes(m, plan, 3) == pytest.approx(8 * 12 * per_layer + 8 * head_activation_bytes(m, 1))
    one = ParallelPlan(pp=4, global_batch_size=8)      # 1F1B: the last stage keeps one micro-batch's logits
    assert stage_activation_bytes(m, one, 3) == pytest.approx(12 * per_layer + head_activation_bytes(m, 1))


def test_uneven_stages_memory():
    m = preset("llama3-8b")
    plan = ParallelPlan(pp=4, global_batch_size=8, first_stage_layers=5)     # 5, 9, 9, 9
    per_layer = activation_bytes_per_layer(m, Storing.of(1))
    assert stage_activation_bytes(m, plan, 0) == pytest.approx(4 * 5 * per_layer)
    assert stage_activation_bytes(m, plan, 1) == pytest.approx(3 * 9 * per_layer)
    lp = layer_params_per_rank(m)
    assert stage_params_per_rank(m, plan, 1) == 9 * lp
    assert stage_params_per_rank(m, plan, 0) == 5 * lp + m.vocab_size * m.hidden_size
    assert sum(stage_params_per_rank(m, plan, s) for s in range(4)) == m.num_params
    # Llama 3 405B: 126 layers over 16 stages counting embedding and loss as a layer each.
    big = preset("llama3-405b")
    p405 = ParallelPlan(pp=16, tp=8, account_for_embedding=True, account_for_loss=True)
    params = [stage_params_per_rank(big, p405, s) for s in range(16)]
    lp8 = layer_params_per_rank(big, 8)
    assert params[1] == 8 * lp8 and params[0] == 7 * lp8 + big.vocab_size * big.hidden_size / 8
    assert params[15] == 7 * lp8 + big.vocab_size * big.hidden_size / 8 + big.norm_params
    # interleaved with uneven chunks: rank 0 holds chunk 0 (7 layers) and chunk 1 (8 layers)
    pi = ParallelPlan(pp=8, vpp=2, global_batch_size=16, account_for_embedding=True, account_for_loss=True)
    held = inflight_per_chunk(pi, 0)                                           # Megatron order
    assert stage_activation_bytes(big, pi, 0) == pytest.approx((held[0] * 7 + held[1] * 8)
                                                               * activation_bytes_per_layer(big, Storing.of(1)))


def test_stage_params_add_up():
    m = preset("llama3-8b")
    assert stage_params_per_rank(m, ParallelPlan(), 0) == m.num_params
    pp = ParallelPlan(pp=4)
    assert sum(stage_params_per_rank(m, pp, s) for s in range(4)) == m.num_params
    tied = preset("gpt-22b")
    # a tied embedding is held twice when first and last stage differ (Megatron keeps a copy)
    assert sum(stage_params_per_rank(tied, ParallelPlan(pp=4), s) for s in range(4)) == \
        tied.num_params + tied.vocab_size * tied.hidden_size
    # tp: split matrices divide, norms and row-parallel biases replicate
    h = tied.hidden_size
    assert layer_params_per_rank(tied, 8) * 8 == tied.params_per_layer + 7 * (2 * tied.norm_params + 2 * h)


def test_temporaries():
    assert zero3_gathered_param_bytes(1e8, prefetch_layers=1) == 2 * 2e8
    assert zero3_gathered_param_bytes(1e9, prefetch_layers=3, max_live_parameters=1e9) == 2e9
    assert grad_bucket_bytes() == 1e9      # DeepSpeed reduce_bucket_size 5e8 elements in fp16
    with pytest.raises(InputError, match="prefetch_layers"):
        zero3_gathered_param_bytes(1e8, prefetch_layers=-1)
    with pytest.raises(InputError, match="zero_stage"):
        model_state_bytes(1e9, 8, 4)


def test_sixteen_bit_buffers_add_up_to_the_stage_states():
    m = preset("gpt2-1.5b")              # tied embeddings, learned positions
    plan = ParallelPlan()
    psi = stage_params_per_rank(m, plan, 0)
    # the per-layer gradients (embedding -1, layers, head L) are the stage's 2Ψ
    per_layer = [layer_param_bytes(m, 1, layer) for layer in range(-1, m.num_layers + 1)]
    assert sum(per_layer) == pytest.approx(model_state_bytes(psi).grads_bytes, rel=1e-12)
    assert layer_param_bytes(m, 4, 0) == 2 * layer_params_per_rank(m, 4)
    assert param_allgather_bytes(psi) == 2 * psi
    assert offload_copy_bytes(psi, 8) == 2 * psi / 8
    assert optimizer_shard_params(psi, 8, 0) == psi and optimizer_shard_params(psi, 8, 1) == psi / 8


def test_buckets_and_zero3_prefetch_depth():
    assert sync_bucket_bytes(ParallelPlan(dp=2, zero_stage=2, bucket_size_bytes=100, zero_bucket_size_bytes=50)) == 50
    assert sync_bucket_bytes(ParallelPlan(dp=2, zero_stage=1, bucket_size_bytes=100, zero_bucket_size_bytes=50)) == 100
    assert sync_bucket_bytes(ParallelPlan(dp=2, zero_stage=3, bucket_size_bytes=100)) == 100
    m = preset("gpt2-1.5b")
    per_layer = layer_params_per_rank(m, 1)
    assert zero3_depth(m, ParallelPlan(dp=2, zero_stage=3, zero3_prefetch_depth=4)) == 4
    # at most 3.5 layers alive: the one in use and 2 ahead
    assert zero3_depth(m, ParallelPlan(dp=2, zero_stage=3, zero3_prefetch_depth=4,
                                       zero3_max_live_parameters=3.5 * per_layer)) == 2


def test_what_a_rank_holds():
    m = preset("gpt2-1.5b")
    plan = ParallelPlan(dp=8, zero_stage=2, global_batch_size=8)
    st = model_state_bytes(stage_params_per_rank(m, plan, 0), 8, 2)
    assert stage_resident_bytes(m, plan, 0, 1e9) == {"parameters": st.params_bytes, "gradients": st.grads_bytes,
                                                     "optimizer": st.optimizer_bytes, "reserve": 1e9}
    off = ParallelPlan(dp=8, zero_stage=2, global_batch_size=8, offload_optimizer=True)
    assert stage_resident_bytes(m, off, 0, 0.0)["optimizer"] == 0.0     # ZeRO-Offload: the states live on the host
    # a chunk stores its layers' tensors plus the embedding's (first) and the head's (last);
    # GPipe holds every micro-batch's
    gp = ParallelPlan(pp=2, schedule="gpipe", micro_batch_size=1, global_batch_size=4)
    b = activation_bytes_per_layer(m, Storing.of(1))
    layers = gp.stage_layers(m)
    assert chunk_activation_bytes(m, gp, 0) == layers[0] * b + embedding_activation_bytes(m, 1)
    assert chunk_activation_bytes(m, gp, 1) == layers[1] * b + head_activation_bytes(m, 1)
    for s in (0, 1):
        assert stage_activation_bytes(m, gp, s) == pytest.approx(4 * chunk_activation_bytes(m, gp, s), rel=1e-12)
    assert recompute_working_bytes(m, gp) == 0.0
    full = ParallelPlan(recompute="full")
    assert recompute_working_bytes(m, full) == activation_bytes_per_layer(m, Storing.of(1, recompute="none"))
    # the estimate's temporaries: one DeepSpeed bucket, plus ZeRO-3's gathered layer and one ahead
    z3 = ParallelPlan(dp=8, zero_stage=3, global_batch_size=8)
    psi = stage_params_per_rank(m, z3, 0)
    assert zero_temporary_bytes(m, z3, psi) == grad_bucket_bytes(min(psi, 5e8)) + \
        zero3_gathered_param_bytes(layer_params_per_rank(m, 1))
    assert zero_temporary_bytes(m, ParallelPlan(dp=8, global_batch_size=8), psi) == 0.0
    mem = stage_memory_bytes(m, z3, 0)
    assert mem["total"] == pytest.approx(model_state_bytes(psi, 8, 3).total + mem["activations"] + mem["temporaries"])
