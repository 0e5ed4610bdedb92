"""--overlap-moe-expert-parallel-comm (``sim.program.ep_overlap``): which steps pair, the order
the pass gives their pieces, the overlapped all-to-alls' closed form on two micro-batches,
bounds that hold on any plan, memory, and full against reduced fidelity."""

from dataclasses import replace

import pytest

import sim.session
from sim.inputs.hardware import load_profile
from sim.inputs.model import llama
from sim.inputs.plan import ParallelPlan
from sim.inputs.schema import SimulationSettings
from sim.inputs.topology_build import load_topology
from sim.program.build import BuildContext
from sim.program.ep_overlap import EP_STREAM, overlap_schedule, steady_pairs
from sim.program.workload_moe import COUNTS_OP
from sim.program.launch import LAUNCH_CATEGORY
from sim.program.memory.inflight import inflight_chunks
from sim.program.schedules import interleaved
from sim.program.training import run_passes
from sim.results import memory_timeline
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
QUIET = replace(H100, overlap_compute_slowdown=0.0)  # compute beside an all-to-all at full speed
TINY = llama("tiny-moe", 4, 512, 8, 8, 1024, 2000, 256, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=512)


def _run(model, plan, profile=H100, nodes=1, fidelity="full", pxn=True):
    topo = load_topology("dgx-h100", nodes=nodes)
    return simulate_training(Job(model, plan, profile, topo),
                             SimulationSettings(fidelity=fidelity, nccl_pxn_disable=not pxn))


def _without_all_to_alls(monkeypatch):
    """Make the session simulate every program with its expert-parallel collectives taking no time
    (zero-length compute in their place, same names, streams and dependencies)."""
    build = sim.session.build

    def stripped(ctx):
        schedule, prog = build(ctx)
        acts = {r: [a.evolve(kind="compute", group=(), op="", nbytes=0, duration_s=0.0)
                    if a.kind == "collective" and a.category == "ep" else a for a in lst]
                for r, lst in prog.actions.items()}
        return schedule, prog.with_actions(acts)

    monkeypatch.setattr(sim.session, "build", stripped)


def test_steady_state_forwards_pair_with_the_backward_after_them():
    # no pipelining: micro-batch 0's forward alone, then F(j+1) beside B(j), the last backward alone
    s = overlap_schedule(1, 1, 4)
    assert str(s) == "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3"
    assert steady_pairs(s, 0) == [("0F1", "0B0"), ("0F2", "0B1"), ("0F3", "0B2")]
    assert steady_pairs(overlap_schedule(1, 1, 1), 0) == []
    # interleaved 1F1B with Megatron's one more warm-up forward: every step after the warm-up
    # forwards and before the cool-down backwards pairs (without it the last rank's first
    # steady forward and backward would be one chunk of one micro-batch)
    s = overlap_schedule(2, 2, 4)
    assert s.ranks[1][:4] == interleaved(2, 2, 4).ranks[1][:3] + (s.ranks[1][3],)
    assert ("1F2", "1B0") not in steady_pairs(s, 1) and ("1F2", "1B0") in zip(
        map(str, interleaved(2, 2, 4).ranks[1]), map(str, interleaved(2, 2, 4).ranks[1][1:]))
    for r, warm in ((0, 2 * 1 + 1 * 2 + 1), (1, 0 + 1 * 2 + 1)):
        pairs = steady_pairs(s, r)
        assert len(pairs) == 4 * 2 - warm
        row = [str(st) for st in s.ranks[r]]
        assert all(row.index(b) == row.index(f) + 1 for f, b in pairs)


def test_the_pass_interleaves_a_pair_layer_by_layer_with_all_to_alls_on_their_stream():
    plan = ParallelPlan(dp=4, ep=4, global_batch_size=8, overlap_moe_expert_parallel_comm=True)
    ctx = BuildContext.create(TINY, plan, H100)
    before = run_passes(ctx, stop="ep_overlap").program.actions[0]
    after = run_passes(ctx, stop="fp8_amax").program.actions[0]
    assert sorted(a.name for a in before) == sorted(a.name for a in after)
    # every dependency on the rank comes earlier in its list: each stream's order can run
    seen = set()
    for a in after:
        assert all(d in seen for d in a.deps if isinstance(d, str)), a.name
        seen.add(a.name)
    # the warm-up forward and the last backward keep their all-to-alls on the compute stream
    ep = [a for a in after if a.kind == "collective" and a.category == "ep"]
    counts = [a for a in ep if a.name.endswith(" " + COUNTS_OP)]
    assert {a.name.split(".")[0] for a in ep if a.stream == "compute" and a not in counts} == {"0F0", "0B1"}
    # the forwards' token-count gathers stay on the compute stream, paired or not (Megatron's
    # router_and_preprocess runs in the attention node): one per MoE layer of each forward
    assert all(a.stream == "compute" for a in counts) and len(counts) == 4 * 2
    # in the pair (F1, B0), per MoE layer: B's combine gradient, F's dispatch, B's dispatch gradient, F's combine
    comm = [a for a in after if a.stream == EP_STREAM]
    assert [a.name.split(".")[0] for a in comm] == ["0B0", "0F1"] * 8          # 4 layers x 2 each
    layer_of = {a.name: a.layer for a in after}
    assert [layer_of[a.name] for a in comm[::4]] == [3, 2, 1, 0]                # the backward's layers
    assert [layer_of[a.name] for a in comm[1::4]] == [0, 1, 2, 3]               # beside the forward's
    compute = [a.name.split(".")[0] for a in after if a.stream == "compute" and a.name[:3] in ("0F1", "0B0")]
    assert compute[:2] == ["0B0", "0F1"] and compute.count("0F1") and compute.count("0B0")


def _pieces(trace, step):
    """{piece name: (category, seconds)} of one step on rank 0, in the order they ran; the
    compute segment that the host's launches cut in two after the MoE forward's host
    synchronisation (``sim.program.launch``) counted as one piece, the host's own pieces
    left out (each must end before the kernel waiting for it would start: launches do not
    bind here, so the pieces run back to back as the closed form says)."""
    spans = sorted((s for s in trace.spans if s.rank == 0 and s.name.split(".")[0] == step),
                   key=lambda s: (s.start_s, s.end_s))
    host = [s for s in spans if s.category == LAUNCH_CATEGORY]

    def index(s):
        return int(s.name.split(".")[1].split(" ")[0]) if "." in s.name else None

    tails = {index(h) + 2 for h in host}  # host piece i, then the segment's body i + 1 and its last kernel i + 2
    out: dict = {}
    last = None
    for s in spans:
        if s.category == LAUNCH_CATEGORY:
            continue
        if last is not None and index(s) in tails:
            out[last] = (s.category, out[last][1] + s.end_s - s.start_s)
            continue
        out[s.name] = (s.category, s.end_s - s.start_s)
        last = s.name
    for h in host:
        assert any(s.start_s >= h.end_s for s in spans if s.stream == "compute" and s.end_s > h.end_s)
    return out


def _fold_counts(pieces: dict) -> dict:
    """``_pieces`` with the forward's token-count all-gather (``COUNTS_OP``: on the compute stream,
    between the router and the permutation) and the compute piece after it added to the compute
    piece before it: one run, the closed form's A0."""
    out: dict = {}
    merge = False
    for name, (cat, t) in pieces.items():
        if name.endswith(" " + COUNTS_OP) or merge:
            last = next(reversed(out))
            out[last] = (out[last][0], out[last][1] + t)
            merge = not merge
            continue
        out[name] = (cat, t)
    return out


@pytest.mark.parametrize("hidden, topk, gpus", [
    (2048, 8, 8),       # one node: each all-to-all shorter than the compute beside it, all hidden
    (4096, 1, 16),      # two nodes: the all-to-alls over InfiniBand outlast some of it
])
def test_two_micro_batches_match_the_closed_form(hidden, topk, gpus):
    """One MoE layer, no pipelining, ep = dp = all GPUs, two micro-batches: F0 alone, then F1
    beside B0, then B1 alone (the gradient all-reduce after it, the same tail in both runs).

    Without the overlap everything runs on the compute stream, back to back. With it, the pair
    (F1, B0) runs B's output-layer backward, F's embedding, then the MoE layer pair
    b0 + max(f0, cb1) + max(b1, cf1) + max(f1, cb2) + max(b2, cf2) + f2, then B's embedding and
    F's output layer. Each all-to-all, alone on the communication stream and in step on every
    rank, lasts what it lasted without the overlap."""
    model = llama("one-moe", 1, hidden, 16, 16, 256, 1000, 1024, num_experts=16, moe_router_topk=topk,
                  moe_ffn_hidden_size=512)
    kw = dict(dp=gpus, ep=gpus, global_batch_size=2 * gpus)
    plain = _run(model, ParallelPlan(**kw), QUIET, nodes=gpus // 8).trace
    over = _run(model, ParallelPlan(**kw, overlap_moe_expert_parallel_comm=True), QUIET, nodes=gpus // 8).trace
    f1, b0 = _fold_counts(_pieces(plain, "0F1")), _pieces(plain, "0B0")
    # forward: embedding, A0, dispatch, experts, combine, A2, output layer; backward the reverse
    cats = ["F", "F", "ep", "F", "ep", "F", "F"]
    assert [c for c, _ in f1.values()] == cats and [c for c, _ in b0.values()] == [
        "B" if c == "F" else c for c in cats]
    f_emb, f0, cf1, f1_, cf2, f2, f_head = (t for _, t in f1.values())
    b_head, b0_, cb1, b1, cb2, b2, b_emb = (t for _, t in b0.values())
    assert min(cf1, cf2, cb1, cb2) > 0.2 * min(f0, b1, f1_, b2)              # the all-to-alls weigh
    hidden_all = max(cb1, cf1, cb2, cf2) < min(f0, b1, f1_, b2)
    assert hidden_all == (gpus == 8)                                          # both cases are covered
    pair = (b_head + f_emb + b0_ + max(f0, cb1) + max(b1, cf1) + max(f1_, cb2) + max(b2, cf2) + f2
            + b_emb + f_head)
    serial = sum(t for _, t in f1.values()) + sum(t for _, t in b0.values())
    start = {s.name: s.start_s for s in plain.spans if s.rank == 0}
    end = {s.name: s.end_s for s in plain.spans if s.rank == 0}
    assert start["0B1.0"] - end["0F0"] == pytest.approx(serial, rel=1e-9)  # no gap without the overlap
    assert over.end_s == pytest.approx(plain.end_s - serial + pair, rel=1e-9)
    if hidden_all:
        assert plain.end_s - over.end_s == pytest.approx(cf1 + cf2 + cb1 + cb2, rel=1e-9)
    # the trace shows it: each all-to-all of the pair on its own stream, under the other micro-batch's compute
    a2a = [s for s in over.spans if s.rank == 0 and s.stream == EP_STREAM]
    assert [s.name.split(".")[0] for s in a2a] == ["0B0", "0F1", "0B0", "0F1"]
    for s in a2a:
        other = "0F1" if s.name.startswith("0B0") else "0B0"
        assert any(c.stream == "compute" and c.name.startswith(other) and c.start_s < s.end_s and c.end_s > s.start_s
                   for c in over.spans if c.rank == 0)


@pytest.mark.parametrize("ffn, kw, nodes, faster, pxn", [
    (512, dict(dp=16, ep=16, global_batch_size=64), 2, True, True),                 # no pipelining, 4 micro-batches
    (512, dict(dp=4, pp=2, vpp=2, ep=4, global_batch_size=32), 1, True, True),      # interleaved, 8 micro-batches
    # all-to-alls over InfiniBand that outlast every compute run: nothing to hide them under, and
    # each forward's output now leaves at the end of its pair; the overlap costs a little here.
    # That takes NCCL_PXN_DISABLE: the cross-rail sends then climb to the spines (12.5 GB/s a
    # leaf uplink) and the all-to-alls take several times as long as under PXN, where they stay
    # on their rails at the NICs' rate and hide under the compute beside them.
    (64, dict(dp=8, pp=2, vpp=2, ep=8, global_batch_size=32), 2, False, False),
    (64, dict(dp=8, pp=2, vpp=2, ep=8, global_batch_size=32), 2, True, True),
])
def test_the_overlap_is_never_faster_than_the_compute_alone(ffn, kw, nodes, faster, pxn, monkeypatch):
    """With the engine's overlap slowdown on: the iteration is never faster than the same program
    with its all-to-alls taking no time (start times only move earlier when durations shrink, and
    the slowdown goes with them). Where the all-to-alls are shorter than the compute beside them
    the overlap beats running them in line; where they outlast it, it may not."""
    model = llama("moe-4", 4, 2048, 16, 16, 256, 1000, 1024, num_experts=16, moe_router_topk=8,
                  moe_ffn_hidden_size=ffn)
    plain = _run(model, ParallelPlan(**kw), nodes=nodes, pxn=pxn).trace.end_s
    over = _run(model, ParallelPlan(**kw, overlap_moe_expert_parallel_comm=True), nodes=nodes, pxn=pxn).trace.end_s
    _without_all_to_alls(monkeypatch)
    alone = _run(model, ParallelPlan(**kw, overlap_moe_expert_parallel_comm=True), nodes=nodes, pxn=pxn).trace.end_s
    assert alone <= over
    assert (over < plain) == faster
    if not faster:
        assert over < 1.05 * plain


def test_activations_of_two_micro_batches_are_alive_without_pipelining():
    plan = ParallelPlan(dp=4, ep=4, global_batch_size=16)
    plain = _run(TINY, plan).trace
    over_plan = replace(plan, overlap_moe_expert_parallel_comm=True)
    over = _run(TINY, over_plan).trace
    one = max(memory_timeline.timeline(plain, 0)[1]["activations"])
    both = max(memory_timeline.timeline(over, 0)[1]["activations"])
    assert one < both <= 2 * one * (1 + 1e-12)
    assert memory_timeline.final(over, 0)["activations"] == pytest.approx(0, abs=1e-3)
    assert inflight_chunks(plan, 0) == 1 and inflight_chunks(over_plan, 0) == 2   # the estimate's count
    # with interleaving, Megatron's one more warm-up forward: one more chunk-micro-batch in flight
    inter = ParallelPlan(dp=2, pp=2, vpp=2, ep=2, global_batch_size=16)
    for stage in (0, 1):
        assert inflight_chunks(replace(inter, overlap_moe_expert_parallel_comm=True), stage) == \
            inflight_chunks(inter, stage) + 1


@pytest.mark.parametrize("kw, nodes", [
    (dict(dp=8, pp=2, vpp=2, ep=4, global_batch_size=32), 2),
    (dict(dp=16, pp=2, vpp=2, ep=16, global_batch_size=64), 4),                       # ep over four nodes
    (dict(dp=16, pp=2, vpp=2, ep=16, global_batch_size=64, moe_routing="zipf:1.0"), 4),
    (dict(dp=16, ep=8, global_batch_size=64), 2),
])
def test_full_and_reduced_fidelity_agree(kw, nodes):
    model = llama("moe-16", 4, 512, 8, 8, 1024, 2000, 256, num_experts=16, moe_router_topk=2,
                  moe_ffn_hidden_size=512)
    plan = ParallelPlan(**kw, overlap_moe_expert_parallel_comm=True)
    full = _run(model, plan, nodes=nodes).trace.end_s
    reduced = _run(model, plan, nodes=nodes, fidelity="reduced").trace.end_s
    assert reduced == pytest.approx(full, rel=0.01)
