"""Context parallelism: ring attention's exchanges (bytes, overlap with the attention
steps), the all-gather variant, activations divided by cp, groups, fidelity, bad input."""

import pytest

from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import llama
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.program.memory import chunk_activation_bytes, stage_memory_bytes
from sim.program.workload import LayerRun, layer_work
from sim.inputs.schema import SimulationSettings
from sim.session import Job, simulate_training

# GQA: 8 query heads of 64, 2 K/V heads: kv width 2·2·64 = 256
TINY = llama("tiny-cp", 2, 512, 8, 2, 1024, 2000, 4096)
A100 = load_profile("a100-80gb")


def test_ring_attention_exchanges_each_key_value_chunk_once_per_step():
    w = layer_work(TINY, LayerRun(1, cp=2))
    shifts = [c for c in w.comms("F") if c.group == "cp"]
    # one exchange (cp - 1) of the local chunk's K and V: (s/cp) tokens x 256 wide x 2 bytes
    assert [(c.collective, c.side, c.nbytes) for c in shifts] == [("shift", True, 2048 * 256 * 2)]
    steps = [o for o in w.ops("F") if o.name.startswith("attn.core.cp")]
    full = layer_work(TINY, LayerRun(1)).ops("F")
    core = next(o for o in full if o.name == "attn.core")
    assert len(steps) == 2 and sum(o.flops for o in steps) == pytest.approx(core.flops / 2)
    assert steps[0].shape == (2048, 2048, 64) and steps[1].after == "attn.cp.kv1"
    # backward: K/V with their gradients (twice the bytes) per step, then the gradients home
    back = [c for c in w.comms("B") if c.group == "cp"]
    assert [c.nbytes for c in back] == [2 * 2048 * 256 * 2, 2048 * 256 * 2]


def test_all_gather_variant_gathers_the_whole_sequence_keys_and_values():
    w = layer_work(TINY, LayerRun(1, cp=4, cp_comm="all-gather"))
    ag = next(c for c in w.comms("F") if c.group == "cp")
    assert (ag.collective, ag.nbytes) == ("all_gather", 4096 * 256 * 2)
    core = next(o for o in w.ops("F") if o.name == "attn.core")
    assert core.shape == (1024, 4096, 64)


def test_activations_are_divided_by_cp_exactly():
    one = ParallelPlan(dp=1)
    for cp in (2, 4):
        plan = ParallelPlan(dp=1, cp=cp)
        assert chunk_activation_bytes(TINY, plan, 0) == pytest.approx(chunk_activation_bytes(TINY, one, 0) / cp)
        assert stage_memory_bytes(TINY, plan, 0)["activations"] == pytest.approx(
            stage_memory_bytes(TINY, one, 0)["activations"] / cp)


def test_cp_groups_sit_inside_the_data_parallel_dimension():
    plan = ParallelPlan(dp=2, cp=2, tp=2, placement="tp-dp-pp")     # Megatron's tp, cp, dp, pp order
    assert plan.world_size == 8 and plan.dp_cp == 4
    assert plan.cp_group(0) == (0, 2) and plan.cp_group(5) == (5, 7)
    assert plan.dp_group(0) == (0, 2, 4, 6)                          # gradients reduce over dp x cp
    assert plan.num_microbatches == 1                                 # batch per replica: dp = 2


def _run(cp, fidelity="full", comm="p2p"):
    plan = ParallelPlan(dp=1, cp=cp, cp_comm_type=comm, global_batch_size=1)
    return simulate_training(Job(TINY, plan, A100, load_topology("dgx-a100")), SimulationSettings(fidelity=fidelity))


def test_the_ring_exchange_runs_beside_the_attention_step_it_feeds():
    run = _run(2)
    spans = sorted((s for s in run.trace.spans_of(0) if s.name.startswith("0F0")), key=lambda s: s.start_s)
    shift = next(s for s in spans if s.category == "cp")
    before = max((s for s in spans if s.kind == "compute" and s.end_s <= shift.start_s + 1e-12), key=lambda s: s.end_s)
    # issued as soon as the projections that make K and V are done, on its own stream
    assert shift.stream != before.stream and shift.start_s == pytest.approx(before.end_s)
    during = [s for s in spans if s.kind == "compute" and s.start_s < shift.end_s and s.end_s > shift.start_s]
    assert during, "the first attention step computes while the chunk is in flight"
    after = min((s for s in spans if s.kind == "compute" and s.start_s >= during[0].end_s - 1e-12),
                key=lambda s: s.start_s)
    assert after.start_s == pytest.approx(max(during[0].end_s, shift.end_s))


def test_full_and_reduced_fidelity_agree():
    plan = ParallelPlan(dp=2, cp=2, global_batch_size=4)
    topo = load_topology("dgx-a100")
    full = simulate_training(Job(TINY, plan, A100, topo), SimulationSettings(fidelity="full")).trace.end_s
    reduced = simulate_training(Job(TINY, plan, A100, topo), SimulationSettings(fidelity="reduced")).trace.end_s
    assert reduced == pytest.approx(full, rel=0.01)


def test_bad_context_parallel_input_is_one_line():
    with pytest.raises(InputError, match=r"2 x cp = 6 must divide seq_length 4096"):
        ParallelPlan(dp=1, cp=3).check_model(TINY)
    with pytest.raises(InputError, match=r"context parallelism needs flash attention"):
        ParallelPlan(dp=1, cp=2, attention="unfused")
    with pytest.raises(InputError, match=r"cp_comm_type: got 'ring'"):
        ParallelPlan(dp=1, cp=2, cp_comm_type="ring")


def test_tp_comm_overlap_keeps_the_ring_exchange_beside_the_compute():
    from sim.program.tp import TP_COMM_STREAM
    from sim.program.training import build_program

    plan = ParallelPlan(dp=1, cp=2, tp=2, sequence_parallel=True, tp_comm_overlap=True, global_batch_size=1)
    _, prog = build_program(TINY, plan, A100)
    shifts = [a for a in prog.actions[0] if a.category == "cp" and a.op == "shift"]
    assert shifts and all(a.stream in (TP_COMM_STREAM, "compute") for a in shifts)
    assert sum(a.stream == TP_COMM_STREAM for a in shifts) == len(shifts) - TINY.num_layers  # but the dkv homes
    waiting = [a for a in prog.actions[0] if any(d in {s.name for s in shifts} for d in a.deps)
               and a.kind == "compute"]
    assert waiting                                          # the attention steps wait for their chunk
    simulate_training(Job(TINY, plan, A100, load_topology("dgx-a100")), SimulationSettings(fidelity="full"))


def test_activations_grow_through_each_forward_and_the_peak_falls_within_the_iteration():
    # issue 44: llama3-8b, s = 32768, cp 4 on 8 H100s reported its peak "at 0.00 us" and a
    # memory plot with activations flat over the iteration (each micro-batch's stored
    # activations were allocated whole at its forward's first piece, the next one's at the
    # same instant the last was freed). They are stored layer by layer as the forward
    # runs and freed layer by layer as the backward runs.
    from dataclasses import replace

    from sim.inputs.model import preset
    from sim.results.memory_timeline import highest_peak, timeline

    model = replace(preset("llama3-8b"), seq_length=32768)
    plan = ParallelPlan(dp=2, cp=4, global_batch_size=8, zero_stage=1)
    run = simulate_training(Job(model, plan, load_profile("h100-sxm"), load_topology("dgx-h100", nodes=1)))
    end = max(s.end_s for s in run.trace.spans)
    pk = highest_peak(run.trace)
    assert 0 < pk.time_s < end
    times, series = timeline(run.trace, pk.rank)
    act = series["activations"]
    top = max(act)
    # one micro-batch at a time (pp = 1): the peak holds exactly one micro-batch's activations
    assert top == pytest.approx(chunk_activation_bytes(model, plan, 0), rel=1e-9)
    assert pk.breakdown["activations"] == pytest.approx(top, rel=1e-9)
    i = act.index(top)
    rises = sum(b > a for a, b in zip(act[:i], act[1:i + 1]))
    assert rises >= model.num_layers  # at least one allocation per layer before the peak
    assert times[i] > 0 and act[0] < top / model.num_layers * 2  # little is held when the first forward starts
    after = act[i:]
    falls = sum(b < a for a, b in zip(after, after[1:]))
    assert falls >= model.num_layers * plan.num_microbatches  # freed layer by layer in every backward
    assert act[-1] == pytest.approx(0.0, abs=1.0)


def test_ring_attention_merges_outputs_and_accumulates_gradients_at_the_busiest_rank():
    # TINY at cp 4: 1024 local tokens (b 1); queries 8 x 64 = 512 wide, keys and values 256 wide;
    # 2-byte elements; lse 4 bytes x 8 heads x 1024 tokens per step.
    cp, n, q, kv, e = 4, 1024, 512, 256, 2
    w = layer_work(TINY, LayerRun(1, cp=cp))
    merge = next(o for o in w.ops("F") if o.name == "attn.cp.out_correction")
    lse = 4 * 8 * n
    # rank cp - 1 merges cp whole partial outputs (read out and the step's, write out) into a zeroed output
    assert merge.bytes_read == pytest.approx(cp * (2 * e * n * q + 2 * lse))
    assert merge.bytes_written == pytest.approx((cp + 1) * e * n * q)
    names = [o.name for o in w.ops("F")]
    assert names.index("attn.cp.out_correction") == names.index("attn.core.cp3") + 1
    acc = [o for o in w.ops("B") if o.name.startswith("attn.cp.grad_accumulation")]
    # q (512) >= kv/2 (128): rank cp - 1, whose later steps cover all its queries and half the chunk;
    # step 0 copies dq (read 1, write 1) and cats then copies dkv (read 2, write 2), later steps add
    # (dq read 2, write 1; dkv read 3, write 2)
    assert [(o.bytes_read, o.bytes_written) for o in acc] == [
        (e * n * (q + 2 * kv), e * n * (q + 2 * kv))] + [
        (e * n * (2 * q + 3 * 0.5 * kv), e * n * (q + 2 * 0.5 * kv))] * (cp - 1)
