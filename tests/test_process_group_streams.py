"""One NCCL stream per process group (``sim.program.process_group_streams``): a rank's
data-parallel gathers and reductions run one at a time in the order they are issued, the
experts' group on a stream of its own; timelines by hand on a flat link, and whole plans
(FSDP1, FSDP2 under pipelining, MoE) that still run."""

import pytest

from sim.engine.core import simulate
from sim.inputs.model import gpt, llama
from sim.inputs.hardware import load_profile
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.program import passes, training, zero
from sim.program.actions import Action, Program
from sim.program.build import BuildContext
from sim.program.fsdp import REDUCE_STREAM
from sim.program.process_group_streams import DENSE_STREAM, EXPERT_STREAM, group_streams, put_on_group_streams
from sim.program.training import run_passes
from sim.session import Job, simulate_training

from conftest import star

H100 = load_profile("h100-sxm")
LAT = 8.4e-6
"""NCCL's base latency of a ring collective with the Simple protocol (baseLat in NVIDIA/nccl
src/graph/tuning.cc), the only latency on a star without link latency."""
N = 200.0
"""Bytes of each layer's parameters (gathered) and gradients (reduce-scattered)."""
BW = 100.0
"""Each GPU's link, B/s: a 2-rank ring all-gather or reduce-scatter of N bytes sends N/2 each
way, N / 2 / BW = 1 s, plus LAT."""
C = N / 2 / BW + LAT
F_S, B_S = 2.0, 4.0
"""Each layer's forward and backward, seconds."""


def _three_layers() -> Program:
    """2 data-parallel ranks, one micro-batch of 3 layers: forward 0, 1, 2, backward 2, 1, 0
    (the last piece of a step keeps its name)."""
    def acts():
        names = ["0F0.0", "0F0.1", "0F0", "0B0.2", "0B0.1", "0B0"]
        layers = [0, 1, 2, 2, 1, 0]
        return [Action(n, duration_s=F_S if "F" in n else B_S, category=n[1], layer=lid)
                for n, lid in zip(names, layers)]
    return Program({0: acts(), 1: acts()})


def _fsdp(gathers_first: bool, backward_depth: int = 0) -> Program:
    """ZeRO-3 on ``_three_layers``: gathers one layer ahead in forward, ``backward_depth`` ahead
    in backward (0: a host in step with the GPU issuing FSDP1's BACKWARD_POST gathers; 1: the
    host one layer ahead, as FSDP1's ``limit_all_gathers`` holds it), a reduce-scatter per
    layer after its backward, then one stream."""
    group = lambda r: (0, 1)  # noqa: E731
    prog = passes.add_grad_sync(_three_layers(), lambda r, lid: N, group,
                                passes.GradSync(1.0, op="reducescatter", every_microbatch=True))
    prog = zero.add_param_gathers(prog, lambda r, lid: N, group, depth=1, backward_depth=backward_depth)
    return put_on_group_streams(prog, group_streams(group), gathers_first)


def _stream_log(prog):
    tr = simulate(prog, star([BW, BW]))
    return [(s.name, s.start_s, s.end_s) for s in tr.spans_of(0, DENSE_STREAM)], tr.end_s


def test_fsdp1_backward_post_order_and_step_time_by_hand_with_a_host_in_step_with_the_gpu():
    prog = _fsdp(gathers_first=True)
    assert {a.stream for a in prog.actions[0] if a.kind == "collective"} == {DENSE_STREAM}
    log, end = _stream_log(prog)
    c = C
    # forward: layers 0 and 1 gathered at the start, layer 2 once layer 0 is done (depth 1);
    # backward: each layer's gather issued once the layer after it is done, before that layer's
    # reduce-scatter (_post_backward_hook: _post_backward_reshard, then _reduce_grad)
    want = [("gather layer 0 for 0F0", 0.0, c), ("gather layer 1 for 0F0", c, 2 * c),
            ("gather layer 2 for 0F0", c + F_S, 2 * c + F_S),          # F0 ran from c to c + 2
            ("gather layer 2 for 0B0", c + 3 * F_S, 2 * c + 3 * F_S),  # F2 ended at c + 6
            # B2 from 2c + 6 to 2c + 10, then its gather-ahead and its reduce-scatter, one after the other
            ("gather layer 1 for 0B0", 2 * c + 3 * F_S + B_S, 3 * c + 3 * F_S + B_S),
            ("grad bucket 0 (layers 2..2) of 0B0", 3 * c + 3 * F_S + B_S, 4 * c + 3 * F_S + B_S),
            # B1 from 3c + 10 to 3c + 14
            ("gather layer 0 for 0B0", 3 * c + 3 * F_S + 2 * B_S, 4 * c + 3 * F_S + 2 * B_S),
            ("grad bucket 1 (layers 1..1) of 0B0", 4 * c + 3 * F_S + 2 * B_S, 5 * c + 3 * F_S + 2 * B_S),
            # B0 from 4c + 14 to 4c + 18, then its reduce-scatter
            ("grad bucket 2 (layers 0..0) of 0B0", 4 * c + 3 * F_S + 3 * B_S, 5 * c + 3 * F_S + 3 * B_S)]
    assert [x[0] for x in log] == [w[0] for w in want]
    for (_, s, e), (_, ws, we) in zip(log, want):
        assert (s, e) == (pytest.approx(ws, rel=1e-12), pytest.approx(we, rel=1e-12))
    assert end == pytest.approx(5 * c + 3 * F_S + 3 * B_S, rel=1e-12)  # 23 s + 5 latencies


def test_fsdp1_backward_post_with_the_host_one_layer_ahead_by_hand():
    # FSDP1's BACKWARD_POST as the simulator builds it (sim.program.training.zero3_gather): the gather of
    # layer i-1 issued in layer i's post-backward hook, which limit_all_gathers lets the host reach once the
    # GPU has finished layer i+1 (depth 1 in backward), behind layer i+1's reduce-scatter, issued one hook
    # earlier (reductions first at their shared anchor)
    log, end = _stream_log(_fsdp(gathers_first=False, backward_depth=1))
    c = C
    want = [("gather layer 0 for 0F0", 0.0, c), ("gather layer 1 for 0F0", c, 2 * c),
            ("gather layer 2 for 0F0", c + F_S, 2 * c + F_S),          # F0 from c to c + 2, F1 to c + 4
            ("gather layer 2 for 0B0", c + 2 * F_S, 2 * c + 2 * F_S),  # once F1 is done; F2 to c + 6
            ("gather layer 1 for 0B0", c + 3 * F_S, 2 * c + 3 * F_S),  # once F2 is done, under B2 (c + 6 to c + 10)
            ("grad bucket 0 (layers 2..2) of 0B0", c + 3 * F_S + B_S, 2 * c + 3 * F_S + B_S),
            # anchored at B2 too, after its reduce-scatter: runs under B1 (c + 10 to c + 14)
            ("gather layer 0 for 0B0", 2 * c + 3 * F_S + B_S, 3 * c + 3 * F_S + B_S),
            ("grad bucket 1 (layers 1..1) of 0B0", c + 3 * F_S + 2 * B_S, 2 * c + 3 * F_S + 2 * B_S),
            # B0 from c + 14 to c + 18: no backward waits for its gather
            ("grad bucket 2 (layers 0..0) of 0B0", c + 3 * F_S + 3 * B_S, 2 * c + 3 * F_S + 3 * B_S)]
    assert [x[0] for x in log] == [w[0] for w in want]
    for (_, s, e), (_, ws, we) in zip(log, want):
        assert (s, e) == (pytest.approx(ws, rel=1e-12), pytest.approx(we, rel=1e-12))
    assert end == pytest.approx(2 * c + 3 * F_S + 3 * B_S, rel=1e-12)  # 20 s + 2 latencies: 3 c less than in step


def test_a_gather_and_a_reduce_scatter_issued_together_run_one_after_the_other():
    # FSDP2's order at one anchor: the layer's reduce-scatter (post_backward), then the prefetch
    log, _ = _stream_log(_fsdp(gathers_first=False))
    names = [x[0] for x in log]
    rs2, ag1 = names.index("grad bucket 0 (layers 2..2) of 0B0"), names.index("gather layer 1 for 0B0")
    assert ag1 == rs2 + 1
    assert log[ag1][1] == log[rs2][2]  # starts when the reduce-scatter ends
    for (_, s0, e0), (_, s1, e1) in zip(log, log[1:]):  # never two at once
        assert s1 >= e0
    # each at the link's full rate: one collective's time, not two sharing the link
    assert log[rs2][2] - log[rs2][1] == pytest.approx(C, rel=1e-12)


def test_the_experts_group_has_a_stream_of_its_own():
    # 4 ranks: the dense group is all 4, the experts' groups are {0, 2} and {1, 3}; one dense and
    # one expert reduce-scatter issued after the same backward run at once, on their streams
    dense = lambda r: (0, 1, 2, 3)  # noqa: E731
    experts = lambda r: (r % 2, r % 2 + 2)  # noqa: E731
    prog = Program({r: [Action("0B0", duration_s=1.0, category="B", layer=0),
                        Action("dense rs", kind="collective", op="reducescatter", group=dense(r), nbytes=400.0,
                               category="dp", stream="dp", deps=("0B0",)),
                        Action("expert rs", kind="collective", op="reducescatter", group=experts(r), nbytes=200.0,
                               category="dp", stream="dp", deps=("0B0",))] for r in range(4)})
    streams = group_streams(dense, experts)
    assert streams(1) == {(0, 1, 2, 3): DENSE_STREAM, (1, 3): EXPERT_STREAM}
    assert group_streams(dense, dense)(0) == {(0, 1, 2, 3): DENSE_STREAM}  # the same ranks: one group
    out = put_on_group_streams(prog, streams)
    on = {a.name: a.stream for a in out.actions[0] if a.kind == "collective"}
    assert on == {"dense rs": DENSE_STREAM, "expert rs": EXPERT_STREAM}
    tr = simulate(out, star([1e3] * 4))
    d, = [s for s in tr.spans_of(0) if s.name == "dense rs"]
    x, = [s for s in tr.spans_of(0) if s.name == "expert rs"]
    assert d.start_s == x.start_s == 1.0  # both start as the backward ends: together, not in turn


def test_collectives_on_the_compute_stream_and_other_actions_stay():
    # DeepSpeed without overlap_comm reduces on the compute stream: left there; copies stay put
    acts = [Action("0B0", duration_s=1.0, category="B", layer=0),
            Action("rs", kind="collective", op="reducescatter", group=(0, 1), nbytes=1.0, category="dp",
                   stream="compute", deps=("0B0",)),
            Action("copy", duration_s=1.0, category="fsdp", stream=REDUCE_STREAM, deps=("0B0",))]
    prog = Program({0: list(acts), 1: list(acts)})
    assert put_on_group_streams(prog, group_streams(lambda r: (0, 1))).actions == prog.actions


def test_each_collective_follows_its_anchor_through_fsdps_copies():
    # a gather issued after F0 whose copy-in (its first dependency) sits just before its first use
    acts = [Action("0F0.0", duration_s=1.0, category="F", layer=0),
            Action("0F0.1", duration_s=1.0, category="F", layer=1),
            Action("cast", duration_s=0.5, category="fsdp", stream="fsdp_copy_in", deps=("0F0.0",)),
            Action("ag", kind="collective", op="allgather", group=(0, 1), nbytes=1.0, category="zero",
                   stream="zero", deps=("0F0.0", "cast")),
            Action("0F0", duration_s=1.0, category="F", layer=2, deps=("ag",))]
    got = put_on_group_streams(Program({0: list(acts), 1: list(acts)}), group_streams(lambda r: (0, 1)))
    assert [a.name for a in got.actions[0]] == ["0F0.0", "ag", "0F0.1", "cast", "0F0"]
    assert got.actions[0][1].stream == DENSE_STREAM and got.actions[0][1].deps == ("0F0.0", "cast")


def _on_streams(acts):
    return {a.stream for a in acts if a.kind == "collective" and a.category in ("dp", "zero")}


def _issue_order_holds(acts):
    """On each group stream, the collectives' anchors (their first same-rank dependency,
    through FSDP's copies) never go back in the list."""
    pos = {a.name: i for i, a in enumerate(acts)}
    by = {a.name: a for a in acts}
    last: dict[str, int] = {}
    for a in acts:
        if a.kind != "collective" or a.stream not in (DENSE_STREAM, EXPERT_STREAM):
            continue
        d = a
        while True:
            first = next((x for x in d.deps if isinstance(x, str)), None)
            if first is None or by[first].category != "fsdp":
                break
            d = by[first]
        at = pos[first] if first is not None else -1
        assert at <= pos[a.name] and at >= last.get(a.stream, -1), a.name
        last[a.stream] = at


MOE = llama("two-moe", 2, 256, 4, 4, 512, 1024, 128, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=256)
TINY4 = gpt("tiny4", 4, 256, 4, 512, 256)


def test_the_pass_puts_dense_and_expert_collectives_on_their_groups_streams():
    plan = ParallelPlan(dp=4, ep=2, global_batch_size=8, zero_stage=3, framework="torchtitan")
    ctx = BuildContext.create(MOE, plan, H100)
    before = run_passes(ctx, stop="process_group_streams")
    after = training.process_group_streams(ctx, before)
    acts = after.program.actions[0]
    assert _on_streams(before.program.actions[0]) == {"dp", "zero"}
    assert {a.group: a.stream for a in acts if a.kind == "collective" and a.category in ("dp", "zero")} == \
        {(0, 1, 2, 3): DENSE_STREAM, (0, 2): EXPERT_STREAM}
    assert sorted(a.name for a in acts) == sorted(a.name for a in before.program.actions[0])
    _issue_order_holds(acts)


@pytest.mark.parametrize("kw", [
    dict(framework="llm-foundry", dp=4, zero_bucket_size_bytes=1),        # FSDP1, BACKWARD_POST
    dict(framework="torchtitan", dp=2, pp=2, zero_bucket_size_bytes=1),   # FSDP2 with pipelining
    dict(framework="automodel", dp=2, pp=2, pp_call_microbatches=2,       # FSDP2's window, deferred sync
         zero_bucket_size_bytes=1),
    dict(framework="deepspeed", dp=4),                                    # (its own reduce bucket)
])
def test_whole_plans_run_without_deadlock_in_issue_order(kw):
    plan = ParallelPlan(global_batch_size=8, micro_batch_size=1, zero_stage=3, **kw)
    run = simulate_training(Job(TINY4, plan, H100, load_topology("dgx-h100")))
    assert run.trace.end_s > 0
    _, prog = training.build_program(TINY4, plan, H100, fidelity="reduced")
    for acts in prog.actions.values():
        assert _on_streams(acts) == {DENSE_STREAM}
        _issue_order_holds(acts)
