"""Passes on hand-made programs, and the time breakdown on hand-computed traces."""

import pytest

from sim.program import passes
from sim.program.actions import Action, Program
from sim.engine.core import simulate
from sim.results.metrics import critical_rank, rank_breakdown


def _two_stage():
    # rank 0 = stage 0, rank 1 = stage 1; 1 micro-batch, free-comm deps.
    return Program({
        0: [Action("0F0", duration_s=1.0, category="F", layer=0),
            Action("0B0", duration_s=2.0, category="B", layer=0, deps=((1, "1B0"),))],
        1: [Action("1F0", duration_s=1.0, category="F", layer=1, deps=((0, "0F0"),)),
            Action("1B0", duration_s=2.0, category="B", layer=1, deps=("1F0",))],
    })


def test_add_p2p_turns_cross_rank_deps_into_matched_sends_and_recvs(make_star):
    prog = passes.add_p2p(_two_stage(), lambda consumer: 10.0)
    kinds = sorted((r, a.kind, a.stream) for r, acts in prog.actions.items() for a in acts if a.kind != "compute")
    assert kinds == [(0, "recv", "pp<1"), (0, "send", "pp>1"), (1, "recv", "pp<0"), (1, "send", "pp>0")]
    for acts in prog.actions.values():
        for a in acts:
            assert all(isinstance(d, str) for d in a.deps)  # no cross-rank deps left
    # 10 B at 10 B/s per hop-link, two links of the star but one bottleneck: 1 s per transfer
    tr = simulate(prog, make_star([10.0, 10.0]))
    assert tr.end_s == pytest.approx(1 + 1 + 1 + 2 + 1 + 2)


def test_free_program_and_p2p_program_agree_when_transfers_are_free(make_star):
    free = simulate(_two_stage(), make_star([1.0, 1.0])).end_s
    with_p2p = simulate(passes.add_p2p(_two_stage(), lambda c: 0.0), make_star([1.0, 1.0])).end_s
    assert with_p2p == pytest.approx(free)


def test_tp_expansion_keeps_the_step_name_on_the_last_piece(make_star):
    prog = Program({0: [Action("0F0", category="F")], 1: [Action("0F0", category="F")]})
    segs = [passes.Segment("compute", 1.0, 5.0, layer=0), passes.Segment("collective", op="allreduce", nbytes=4.0, layer=0),
            passes.Segment("compute", 2.0, 7.0, layer=1)]
    out = passes.add_tp_collectives(prog, lambda r, a: segs, lambda r: (0, 1))
    names = [a.name for a in out.actions[0]]
    assert names == ["0F0.0", "0F0.1", "0F0"]
    assert out.actions[0][1].kind == "collective" and out.actions[0][1].group == (0, 1)
    # 1 s compute, all-reduce of 4 B over 2 ranks on 4 B/s links (NCCL's ring/Simple base
    # latency, 8.4 us, then 2 steps of 2 B: 1 s), 2 s compute
    tr = simulate(out, make_star([4.0, 4.0]))
    assert tr.end_s == pytest.approx(4.0 + 8.4e-6, rel=1e-12)
    # tp = 1: the collective disappears and the last compute keeps the name
    solo = passes.add_tp_collectives(Program({0: [Action("0F0", category="F")]}), lambda r, a: segs, lambda r: (0,))
    assert [a.name for a in solo.actions[0]] == ["0F0.0", "0F0"]


def test_grad_buckets_fill_in_backward_order_and_start_early(make_star):
    # One rank pair in dp; 4 layers whose backward runs 3, 2, 1, 0; 1 B of grads per layer.
    def rank_prog():
        return [Action(f"B{l}", duration_s=1.0, category="B", layer=l) for l in (3, 2, 1, 0)]
    prog = Program({0: rank_prog(), 1: rank_prog()})
    out = passes.add_grad_sync(prog, lambda r, l: 1.0, lambda r: (0, 1), passes.GradSync(bucket_bytes=2.0, overlap=True))
    buckets = [a for a in out.actions[0] if a.category == "dp"]
    assert [(b.nbytes, b.deps) for b in buckets] == [(2.0, ("B2",)), (2.0, ("B0",))]
    late = passes.add_grad_sync(prog, lambda r, l: 1.0, lambda r: (0, 1), passes.GradSync(bucket_bytes=2.0, overlap=False))
    assert [b.deps for b in late.actions[0] if b.category == "dp"] == [("B0",), ("B0",)]
    # Overlap hides the first bucket behind the last two layers' backward.
    star = make_star([1.0, 1.0])
    t_on, t_off = simulate(out, star).end_s, simulate(late, star).end_s
    assert t_on < t_off


def test_breakdown_hand_computed(make_star):
    # rank 0: compute 0..2, then a send of 2 B at 1 B/s (2..4) while computing 3..5.
    prog = Program({
        0: [Action("c1", duration_s=2.0), Action("s", kind="send", peer=1, nbytes=2, category="pp", deps=("c1",)),
            Action("gap", kind="compute", duration_s=1.0, stream="other-queue"),
            Action("c2", duration_s=2.0, deps=("gap",), stream="compute2")],
        1: [Action("r", kind="recv", peer=0, nbytes=2, category="pp")],
    })
    tr = simulate(prog, make_star([1.0, 1.0]))
    b = rank_breakdown(tr, 0)
    # compute busy: 0..2 (c1), 0..1 (gap), 1..3 (c2) -> union 0..3; send 2..4 (1 s overlapped, 1 exposed)
    assert b["compute_s"] == pytest.approx(3.0)
    assert b["exposed_comm_s"]["pp"] == pytest.approx(1.0)
    assert b["overlap_s"] == pytest.approx(1.0) and b["comm_s"] == pytest.approx(2.0)
    # rank 1's recv waits 0..2 for the send: waiting is idle, not communication
    b1 = rank_breakdown(tr, 1)
    assert b1["exposed_comm_s"]["pp"] == pytest.approx(2.0) and b1["idle_s"] == pytest.approx(2.0)
    assert critical_rank(tr) == 0


def test_add_p2p_sends_a_producer_output_once_to_a_rank_whose_pieces_all_read_it(make_star):
    # Stage 1's forward split in two pieces (a norm, then a collective of the normed input, as
    # add_tp_collectives leaves a TP layer), both reading stage 0's output: one 10 B transfer,
    # not two (Megatron-Core sends one tensor per stage boundary and micro-batch).
    prog = Program({
        0: [Action("0F0", duration_s=1.0, category="F", layer=0)],
        1: [Action("1F0.0", duration_s=1.0, category="F", layer=1, deps=((0, "0F0"),)),
            Action("1F0", duration_s=1.0, category="F", layer=1, deps=((0, "0F0"), "1F0.0"))],
    })
    out = passes.add_p2p(prog, lambda consumer: 10.0)
    sends = [a for a in out.actions[0] if a.kind == "send"]
    recvs = [a for a in out.actions[1] if a.kind == "recv"]
    assert len(sends) == 1 and len(recvs) == 1
    assert [a.deps for a in out.actions[1] if a.kind != "recv"] == [(recvs[0].name,), (recvs[0].name, "1F0.0")]
    # 1 s of stage 0, one 1 s transfer (10 B at 10 B/s), then the two 1 s pieces: 4 s, not 5
    assert simulate(out, make_star([10.0, 10.0])).end_s == pytest.approx(4.0)


def test_add_p2p_quiet_transfers_leave_the_compute_beside_them_at_full_speed(make_star):
    # Rank 0 sends 10 B (1 s at 10 B/s) while its second compute (2 s) runs. With sigma = 0.5
    # a counted send slows that compute for the second it overlaps: 1 s at 1/1.5 speed does
    # 2/3 s of work, the last 4/3 s run alone, so it ends at 1 + 1 + 4/3 = 10/3 s; a quiet send
    # (NCCL's 2 channels to a peer on another node, training.P2P_NET_CHANNELS) leaves it at 3 s.
    def prog():
        return Program({
            0: [Action("0F0", duration_s=1.0, category="F", layer=0),
                Action("0X0", duration_s=2.0, category="F", layer=0, deps=("0F0",))],
            1: [Action("1F0", duration_s=0.5, category="F", layer=1, deps=((0, "0F0"),))],
        })
    counted = passes.add_p2p(prog(), lambda c: 10.0)
    quiet = passes.add_p2p(prog(), lambda c: 10.0, quiet=lambda src, dst: (src, dst) == (0, 1))
    assert [a.slows_compute for acts in quiet.actions.values() for a in acts if a.kind in ("send", "recv")] == [False, False]
    star = make_star([10.0, 10.0])
    ends = [max(s.end_s for s in simulate(p, star, overlap_slowdown=0.5).spans if s.name == "0X0") for p in (counted, quiet)]
    assert ends == [pytest.approx(10 / 3), pytest.approx(3.0)]


def test_grad_bucket_prep_runs_on_the_backward_stream_before_the_collective(make_star):
    # 4 layers of 1 s backward (3, 2, 1, 0), 1 B of grads each, 2 B buckets; each bucket's prep
    # takes 0.25 s per byte (0.5 s), on the compute stream right after the bucket's last backward.
    def rank_prog():
        return [Action(f"B{l}", duration_s=1.0, category="B", layer=l) for l in (3, 2, 1, 0)]
    prog = Program({0: rank_prog(), 1: rank_prog()})
    plain = passes.GradSync(bucket_bytes=2.0, overlap=True)
    out = passes.add_grad_sync(prog, lambda r, l: 1.0, lambda r: (0, 1), passes.GradSync(
        bucket_bytes=2.0, overlap=True, prep_s=lambda nb: 0.25 * nb))
    preps = [a for a in out.actions[0] if a.category == passes.PREP_CATEGORY]
    buckets = [a for a in out.actions[0] if a.category == "dp"]
    assert [(p.duration_s, p.stream, p.deps) for p in preps] == [(0.5, "compute", ("B2",)), (0.5, "compute", ("B0",))]
    assert [b.deps for b in buckets] == [(preps[0].name,), (preps[1].name,)]
    assert [a.name for a in out.actions[0]].index(preps[0].name) == 2  # before B1 on the stream
    # Each all-reduce: NCCL's base latency a = 8.4 us, then 2 steps of 1 B at 1 B/s (2 s).
    # Without prep: bucket 0 runs 2 .. 4 + a, bucket 1 (ready at 4) queues behind it on the dp
    # stream: ends 6 + 2a. With it: B1 and B0 start 0.5 s later (the first prep), the last
    # bucket waits for its own prep too: ready at 5, after bucket 0 (2.5 .. 4.5 + a): 7 + a.
    a = 8.4e-6
    star = make_star([1.0, 1.0])
    base = simulate(passes.add_grad_sync(prog, lambda r, l: 1.0, lambda r: (0, 1), plain), star).end_s
    assert base == pytest.approx(6.0 + 2 * a, rel=1e-12)
    assert simulate(out, star).end_s == pytest.approx(7.0 + a, rel=1e-12)


def _one_f_one_b_two_stages():
    # Megatron-Core's 1F1B on 2 stages, 2 micro-batches: stage 0 runs F0 F1 B0 B1, stage 1
    # F0 B0 F1 B1; forwards 1 s, backwards 2 s on both stages.
    return Program({
        0: [Action("0F0", duration_s=1.0, category="F", layer=0),
            Action("0F1", duration_s=1.0, category="F", layer=0, deps=("0F0",)),
            Action("0B0", duration_s=2.0, category="B", layer=0, deps=((1, "1B0"),)),
            Action("0B1", duration_s=2.0, category="B", layer=0, deps=((1, "1B1"),))],
        1: [Action("1F0", duration_s=1.0, category="F", layer=1, deps=((0, "0F0"),)),
            Action("1B0", duration_s=2.0, category="B", layer=1, deps=("1F0",)),
            Action("1F1", duration_s=1.0, category="F", layer=1, deps=((0, "0F1"),)),
            Action("1B1", duration_s=2.0, category="B", layer=1, deps=("1F1",))],
    })


def test_blocking_sends_put_each_transfer_on_the_senders_own_path(make_star):
    # Each transfer takes T = 1 s (10 B at 10 B/s). Sends beside the next step, by hand:
    # stage 0 F0 [0,1] F1 [1,2]; stage 1 F0 [2,3] B0 [3,5] F1 [5,6] B1 [6,8]; the gradients
    # reach stage 0 at 6 and 9: B0 [6,8], B1 [9,11]. Step 11 s = f + 2f + 2b + b + 2T.
    prog = _one_f_one_b_two_stages()
    star = make_star([10.0, 10.0])
    assert simulate(passes.add_p2p(prog, lambda c: 10.0), star).end_s == pytest.approx(11.0)
    # Waiting for each send (Megatron-Core's non-interleaved 1F1B): stage 0 F0 [0,1], send
    # [1,2], F1 [2,3], send [3,4]; stage 1 F0 [2,3] B0 [3,5], send [5,6], F1 [6,7] B1 [7,9],
    # send [9,10]; stage 0 B0 [6,8], B1 [10,12]: one more T, 12 s.
    blocking = passes.add_p2p(prog, lambda c: 10.0, blocking=True)
    assert simulate(blocking, star).end_s == pytest.approx(12.0)
    # The waits are the sends before each rank's next compute action, nothing else.
    waits = {a.name: [d for d in a.deps if d.startswith("send")] for acts in blocking.actions.values()
             for a in acts if a.kind == "compute"}
    # (stage 1's last send, B1's gradient, has no step after it to hold)
    assert {n: len(w) for n, w in waits.items() if w} == {"0F1": 1, "0B0": 1, "1F1": 1}


def test_a_blocking_send_holds_everything_up_to_the_next_compute_step():
    # After a send, the next step's side-stream work (TE's overlapped tensor-parallel chunks)
    # waits for it as well as the step's first compute action; later actions are held by that one.
    acts = [Action("0F0", duration_s=1.0, category="F"),
            Action("send 0F0", kind="send", peer=1, nbytes=1.0, stream="pp>1", deps=("0F0",)),
            Action("0F1.chunk", kind="comm", duration_s=0.5, stream="tp-comm", category="tp"),
            Action("0F1", duration_s=1.0, category="F"),
            Action("0F1.next", kind="comm", duration_s=0.5, stream="tp-comm", category="tp", deps=("0F1",))]
    out = {a.name: a.deps for a in passes._wait_for_sends(acts)}
    assert out == {"0F0": (), "send 0F0": ("0F0",), "0F1.chunk": ("send 0F0",), "0F1": ("send 0F0",),
                   "0F1.next": ("0F1",)}
