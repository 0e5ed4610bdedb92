"""The engine: streams, dependencies, exact timelines, deadlocks, determinism."""

import pytest

from sim.program.actions import Action, Program
from sim.engine.core import simulate
from sim.errors import DeadlockError, InputError


def _log(trace):
    return [(s.rank, s.stream, s.name, s.start_s, s.end_s) for s in trace.spans]


def _two_stage() -> Program:
    """Rank 0: F0 (2 s), a 10 B send to rank 1 after it, F1 (2 s); rank 1: G0 (3 s) after the receive."""
    return Program({
        0: [Action("F0", duration_s=2.0),
            Action("s0", kind="send", peer=1, nbytes=10, deps=("F0",)),
            Action("F1", duration_s=2.0)],
        1: [Action("r0", kind="recv", peer=0, nbytes=10),
            Action("G0", duration_s=3.0, deps=("r0",))],
    })


def test_exact_timeline_of_a_tiny_two_stage_program(make_star):
    # Rank 0 computes F0 (2 s), sends 10 B to rank 1 at 10 B/s (1 s, no latency) while
    # computing F1 (2 s); rank 1 computes G0 (3 s) after the data arrives.
    t, prog = make_star([10.0, 10.0]), _two_stage()
    log = _log(simulate(prog, t))
    assert log == [
        (0, "comm", "s0", 2.0, 3.0),
        (0, "compute", "F0", 0.0, 2.0),
        (0, "compute", "F1", 2.0, 4.0),
        (1, "comm", "r0", 0.0, 3.0),  # posted at 0, waits for the send, ends on arrival
        (1, "compute", "G0", 3.0, 6.0),
    ]


def test_two_compute_ops_on_one_stream_never_overlap(make_star):
    t = make_star([1.0])
    prog = Program({0: [Action("a", duration_s=1.5), Action("b", duration_s=2.5)]})
    tr = simulate(prog, t)
    (a, b) = tr.spans_of(0, "compute")
    assert (a.start_s, a.end_s, b.start_s, b.end_s) == (0.0, 1.5, 1.5, 4.0)


def test_cross_rank_dependency_is_honoured(make_star):
    t = make_star([1.0, 1.0])
    prog = Program({0: [Action("a", duration_s=2.0)], 1: [Action("b", duration_s=1.0, deps=((0, "a"),))]})
    tr = simulate(prog, t)
    assert tr.spans_of(1)[0].start_s == 2.0


def test_collective_starts_when_the_last_member_arrives(make_star):
    t = make_star([100.0] * 3)
    group = (0, 1, 2)
    prog = Program({r: [Action("c", duration_s=float(r)),
                        Action("ar", kind="collective", op="allreduce", group=group, nbytes=300, deps=("c",))]
                    for r in group})
    tr = simulate(prog, t)
    # ring all-reduce of 300 B over 3 ranks from t=2: NCCL's base latency (ring, Simple: 8.4 us,
    # baseLatencies in NVIDIA/nccl src/graph/tuning.cc), then 4 steps of 100 B at 100 B/s = 4 s
    for r in group:
        span = [s for s in tr.spans_of(r) if s.name == "ar"][0]
        assert span.start_s == float(r) and span.end_s == pytest.approx(6.0 + 8.4e-6, rel=1e-12)


def test_mismatched_send_recv_raises_deadlock_naming_ranks(make_star):
    t = make_star([1.0, 1.0])
    prog = Program({
        0: [Action("x", kind="send", peer=1, nbytes=4, tag="grad")],
        1: [Action("y", kind="recv", peer=0, nbytes=4, tag="act")],
    })
    with pytest.raises(DeadlockError) as e:
        simulate(prog, t)
    assert set(e.value.stuck) == {0, 1}
    assert "'x'" in e.value.stuck[0] and "rank 1" in e.value.stuck[0]
    assert "'y'" in e.value.stuck[1]


def test_cyclic_wait_is_a_deadlock_not_a_hang(make_star):
    # Both ranks receive first, then send, on one stream: each waits for the other.
    t = make_star([1.0, 1.0])
    prog = Program({
        0: [Action("r", kind="recv", peer=1), Action("s", kind="send", peer=1, nbytes=1)],
        1: [Action("r", kind="recv", peer=0), Action("s", kind="send", peer=0, nbytes=1)],
    })
    with pytest.raises(DeadlockError, match="2 rank"):
        simulate(prog, t)


def test_missing_collective_member_is_a_deadlock(make_star):
    t = make_star([1.0] * 3)
    ar = Action("ar", kind="collective", op="allreduce", group=(0, 1, 2), nbytes=3)
    prog = Program({0: [ar], 1: [ar], 2: [Action("idle", duration_s=1.0)]})
    with pytest.raises(DeadlockError, match=r"waits for ranks \[2\]"):
        simulate(prog, t)


def test_dependency_cycle_is_a_deadlock(make_star):
    t = make_star([1.0, 1.0])
    prog = Program({0: [Action("a", deps=((1, "b"),))], 1: [Action("b", deps=((0, "a"),))]})
    with pytest.raises(DeadlockError, match="waits for 1:b"):
        simulate(prog, t)


@pytest.mark.parametrize("acts,needle", [
    ({0: [Action("a"), Action("a")]}, "appears twice"),
    ({0: [Action("a", deps=("zz",))]}, "dependency 0:zz"),
    ({0: [Action("s", kind="send", peer=5, nbytes=1)]}, "peer"),
    ({0: [Action("c", kind="collective", op="allreduce", group=(1, 2))]}, "does not include rank 0"),
])
def test_inconsistent_programs_are_rejected(acts, needle):
    with pytest.raises(InputError, match=needle):
        Program(acts)


def test_bad_action_fields():
    with pytest.raises(InputError, match="duration_s"):
        Action("a", duration_s=-1.0)
    with pytest.raises(InputError, match="kind"):
        Action("a", kind="sleep")
    with pytest.raises(InputError, match="op"):
        Action("a", kind="collective", op="allsum", group=(0,))


def test_a_recv_that_expects_another_size_than_its_send_is_an_error(make_star):
    # Checked when the program is indexed, before the clock starts, even if the pair
    # would only meet late in the run.
    prog = Program({0: [Action("a", duration_s=5.0), Action("s", kind="send", peer=1, nbytes=100, deps=("a",))],
                    1: [Action("r", kind="recv", peer=0, nbytes=64)]})
    with pytest.raises(InputError, match=r"recv 'r' on rank 1 expects 64 bytes but the matching send 's' on rank 0 sends 100"):
        simulate(prog, make_star([1.0, 1.0]))
    ok = Program({0: [Action("s", kind="send", peer=1, nbytes=100)], 1: [Action("r", kind="recv", peer=0)]})
    assert [s.nbytes for s in simulate(ok, make_star([1.0, 1.0])).spans] == [100, 0]  # a recv may leave its size out


def test_program_larger_than_topology_is_an_error(make_star):
    t = make_star([1.0, 1.0])
    with pytest.raises(InputError, match="has 2 GPUs"):
        simulate(Program({0: [Action("a")], 5: [Action("b")]}), t)


def test_spans_carry_rank_stream_name_times_bytes_and_flops(make_star):
    # The Trace of the issue: (rank, stream, name, start, end, bytes, FLOPs) per action.
    t = make_star([10.0, 10.0])
    prog = Program({
        0: [Action("F0", duration_s=2.0, flops=5e12), Action("s0", kind="send", peer=1, nbytes=30, deps=("F0",))],
        1: [Action("r0", kind="recv", peer=0, nbytes=30)],
    })
    got = {(s.rank, s.stream, s.name, s.start_s, s.end_s, s.nbytes, s.flops) for s in simulate(prog, t).spans}
    assert got == {(0, "compute", "F0", 0.0, 2.0, 0, 5e12),
                   (0, "comm", "s0", 2.0, 5.0, 30, 0.0),      # 30 B at 10 B/s over two links
                   (1, "comm", "r0", 0.0, 5.0, 30, 0.0)}


def test_a_grouped_comm_starts_when_its_last_member_is_ready(make_star):
    # A comm with a group (a collective priced outside the network) is a meeting: rank 0
    # is ready at 1 s, rank 1 at 3 s (its compute) and rank 2 at 2 s (a dependency on
    # rank 0's second compute); all three run the 0.5 s comm from 3 s to 3.5 s.
    t = make_star([1.0] * 3)
    g = (0, 1, 2)
    prog = Program({
        0: [Action("a", duration_s=1.0), Action("c", kind="comm", group=g, duration_s=0.5),
            Action("x", duration_s=1.0, stream="side", deps=("a",))],
        1: [Action("a", duration_s=3.0), Action("c", kind="comm", group=g, duration_s=0.5)],
        2: [Action("c", kind="comm", group=g, duration_s=0.5, deps=((0, "x"),))],
    })
    tr = simulate(prog, t)
    assert [(s.rank, s.start_s, s.end_s) for s in tr.spans if s.name == "c"] == [(0, 3.0, 3.5), (1, 3.0, 3.5),
                                                                                  (2, 3.0, 3.5)]


def test_a_grouped_comms_members_share_one_timer_and_end_in_the_order_they_came(make_star):
    # Ranks 0, 2, 1 are ready at 1, 2, 3 s; the 0.5 s comm runs 3-3.5 s on all three. Its
    # members take the same time, so one timer ends them all: 3 compute timers + 1 = 4
    # events (the zero-length "z" after it take none). They end in the order they came,
    # each followed at once by what that releases: the memory log at 3.5 s reads rank 0's
    # comm end (+1 byte), its "z" start (-1), then rank 2's, then rank 1's.
    t = make_star([1.0] * 3)
    g = (0, 1, 2)
    def program(comm_s):
        return Program({r: [Action("a", duration_s=float(d)),
                            Action("c", kind="comm", group=g, duration_s=comm_s[r], mem=(("end", "c", r + 1),)),
                            Action("z", duration_s=0.0, mem=(("start", "c", -(r + 1)),))]
                        for r, d in ((0, 1), (1, 3), (2, 2))})

    tr = simulate(program((0.5, 0.5, 0.5)), t)
    assert tr.stats["events"] == 4
    assert [(s.rank, s.start_s, s.end_s) for s in tr.spans if s.name == "c"] == [(r, 3.0, 3.5) for r in range(3)]
    assert list(tr.memory) == [(3.5, 0, "c", 1.0), (3.5, 0, "c", -1.0), (3.5, 2, "c", 3.0), (3.5, 2, "c", -3.0),
                               (3.5, 1, "c", 2.0), (3.5, 1, "c", -2.0)]
    # A member that takes another time (here 0.25 s) keeps a timer each: 3 + 3 events.
    tr = simulate(program((0.5, 0.25, 0.5)), t)
    assert tr.stats["events"] == 6
    assert [(s.rank, s.start_s, s.end_s) for s in tr.spans if s.name == "c"] == [(0, 3.0, 3.5), (1, 3.0, 3.25),
                                                                                  (2, 3.0, 3.5)]


def test_a_grouped_comm_waits_only_for_simulated_members(make_star):
    # Rank 2 is a shadow (not simulated): the comm starts when ranks 0 and 1 are ready.
    t = make_star([1.0] * 3)
    g = (0, 1, 2)
    prog = Program({0: [Action("a", duration_s=1.0), Action("c", kind="comm", group=g, duration_s=0.5)],
                    1: [Action("a", duration_s=2.0), Action("c", kind="comm", group=g, duration_s=0.5)]},
                   shadows=(2,))
    tr = simulate(prog, t)
    assert {(s.start_s, s.end_s) for s in tr.spans if s.name == "c"} == {(2.0, 2.5)}


def test_a_grouped_comm_a_member_never_reaches_is_a_deadlock(make_star):
    t = make_star([1.0] * 2)
    prog = Program({0: [Action("c", kind="comm", group=(0, 1), duration_s=0.5)],
                    1: [Action("d", duration_s=1.0)]})
    with pytest.raises(DeadlockError, match=r"rank 0.*'c'.*waits for ranks \[1\] to reach it"):
        simulate(prog, t)


def test_simulated_time_is_a_float_from_the_start(make_star):
    tr = simulate(Program({0: [Action("a", duration_s=1.0)]}), make_star([1.0]))
    assert type(tr.spans[0].start_s) is float


def test_the_nth_send_matches_the_nth_recv_in_program_order_across_streams(make_star):
    # Rank 0 posts "a" (stream x) before "b" (stream y), both to rank 1: the first recv
    # on rank 1 (100 B) matches "a" whatever the streams are called.
    t = make_star([100.0, 100.0])
    prog = Program({0: [Action("a", kind="send", peer=1, nbytes=100, stream="y2"),
                        Action("b", kind="send", peer=1, nbytes=300, stream="x1")],
                    1: [Action("ra", kind="recv", peer=0, nbytes=100, stream="s"),
                        Action("rb", kind="recv", peer=0, nbytes=300, stream="s")]})
    tr = simulate(prog, t)
    ends = {s.name: s.end_s for s in tr.spans}
    # a meets ra at 0 (100 B at 100 B/s: 1 s); b waits for rb, posted when ra ends, then
    # takes 3 s. Matched the other way round, the sizes would disagree (an error).
    assert ends["ra"] == pytest.approx(1.0) and ends["rb"] == pytest.approx(4.0)


def test_spans_come_in_rank_stream_start_end_name_order(make_star):
    # Ranks listed out of order, and a stream whose zero-length actions start at the same
    # instant in an order their names do not follow: the trace is still in (rank, stream,
    # start, end, name) order, as the Trace promises.
    t = make_star([1.0, 1.0, 1.0])
    prog = Program({
        2: [Action("x", duration_s=1.0)],
        0: [Action("z", duration_s=0.0), Action("b", duration_s=0.0), Action("a", duration_s=2.0),
            Action("m", duration_s=0.0, stream="aux"), Action("c", duration_s=1.0, stream="aux")],
        1: [Action("q", duration_s=1.0), Action("p", duration_s=0.0)],
    })
    log = _log(simulate(prog, t))
    assert log == sorted(log, key=lambda r: (r[0], r[1], r[3], r[4], r[2]))
    assert [r[2] for r in log] == ["m", "c", "b", "z", "a", "q", "p", "x"]
    prog = Program({0: [Action("a", duration_s=1.0), Action("b", duration_s=0.0), Action("c", duration_s=1.0)]})
    assert [r[2] for r in _log(simulate(prog, make_star([1.0])))] == ["a", "b", "c"]  # in order already


def test_the_engines_makespan_is_its_latest_span_end(make_star):
    # The engine hands the trace its makespan from the actions' ends (Trace.known_end_s):
    # the same as the latest end read from the spans themselves, here 6 s (the tiny two-stage
    # program: G0 ends at 6 s), and on a program whose last action is a send, not compute.
    trace = simulate(_two_stage(), make_star([10.0, 10.0]))
    assert trace.end_s == 6.0 == max(s.end_s for s in trace.spans)
    prog = Program({0: [Action("F0", duration_s=1.0), Action("s0", kind="send", peer=1, nbytes=40, deps=("F0",))],
                    1: [Action("r0", kind="recv", peer=0, nbytes=40)]})
    trace = simulate(prog, make_star([10.0, 10.0]))  # 40 B at 10 B/s after F0: ends at 1 + 4 s
    assert trace.end_s == 5.0 == max(s.end_s for s in trace.spans)


def test_completions_at_one_instant_are_each_an_event_and_keep_their_order(make_star):
    # Four ranks of five 1 s actions: every completion is due at the same instants as three
    # others (the engine queues those together). Each still counts as one event, the
    # timeline is exact, and a zero-length action released at such an instant runs
    # between them in the order it became ready.
    t = make_star([1.0] * 4)
    prog = Program({r: [Action(f"c{i}", duration_s=1.0) for i in range(5)] for r in range(4)})
    tr = simulate(prog, t)
    assert tr.stats["events"] == 20
    # At each of the five instants the four ranks' next completions are queued one right
    # after another (nothing else happens in between), so they share one queue entry.
    assert tr.stats["queue_entries"] == 5
    assert [(s.rank, s.start_s, s.end_s) for s in tr.spans] == [(r, float(i), i + 1.0) for r in range(4) for i in range(5)]
    prog = Program({0: [Action("a", duration_s=1.0), Action("b", duration_s=1.0, deps=((1, "z"),))],
                    1: [Action("y", duration_s=1.0), Action("z", duration_s=0.0), Action("w", duration_s=1.0)]})
    assert _log(simulate(prog, make_star([1.0, 1.0]))) == [
        (0, "compute", "a", 0.0, 1.0), (0, "compute", "b", 1.0, 2.0),
        (1, "compute", "y", 0.0, 1.0), (1, "compute", "z", 1.0, 1.0), (1, "compute", "w", 1.0, 2.0)]


def test_program_index_counts_dependencies_and_shares_equal_values():
    from sim.engine.program_index import index_program

    # Two ranks, the same two ops each; "b" on rank 1 also waits for rank 0's "a".
    prog = Program({r: [Action("a", duration_s=float("0.25"), mem=(("start", "act", 4),)),  # (a new float each)
                        Action("b", duration_s=0.5, deps=("a",) if r == 0 else ("a", (0, "a")))]
                    for r in (0, 1)})
    ix = index_program(prog)
    a0, b0, a1, b1 = ix.ids[(0, "a")], ix.ids[(0, "b")], ix.ids[(1, "a")], ix.ids[(1, "b")]
    # b waits for a on its stream (nxt) and for each named dependency.
    assert [ix.pending[i] for i in (a0, b0, a1, b1)] == [0, 2, 0, 3]
    assert (ix.nxt[a0], ix.nxt[a1], ix.nxt[b0]) == (b0, b1, -1)
    assert sorted(ix.dependents[a0]) == sorted([b0, b1]) and list(ix.dependents[a1]) == [b1]
    assert ix.dependents[b0] is None
    # Equal durations and memory changes on different ranks are one object each.
    assert prog.actions[0][0].duration_s is not prog.actions[1][0].duration_s
    assert ix.dur[a0] == ix.dur[a1] == 0.25 and ix.dur[a0] is ix.dur[a1]
    assert ix.mem_start[a0] == (("act", 4.0),) and ix.mem_start[a0] is ix.mem_start[a1]


def test_a_finished_run_leaves_no_actions_in_reference_cycles():
    """The engine's closures and the network's callbacks refer to one another, and
    where the process opted into ``sim.gc_tuning`` (the ``trainsim`` command) the collector
    is paused during a run and what is alive after it is frozen: unless the run lets go of
    its state, every run's index (an entry per action) stays in memory for good. After a
    run and its result are dropped, a full collection finds no Action and no engine list
    left in unreachable cycles."""
    import gc

    import sim
    from sim import gc_tuning
    from sim.engine.core import _Engine

    gc.unfreeze()
    gc.collect()  # (what earlier tests left: their exceptions' tracebacks hold engines)
    with gc_tuning.tuned(unfreeze_on_exit=False):
        r = sim.run(model="llama2-7b", gpu="a100-80gb", nodes=2, tensor_model_parallel_size=2,
                    pipeline_model_parallel_size=2, global_batch_size=16, fidelity="full")
    actions = r.run.trace.stats["actions"]
    assert actions > 1000
    del r
    was = gc.get_debug()
    gc.unfreeze()  # (the run froze what was alive when it ended)
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        left = list(gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(was)
    assert not [o for o in left if isinstance(o, (Action, _Engine))]
    assert max((len(o) for o in left if isinstance(o, list)), default=0) < actions / 10


def test_compute_slows_while_an_nccl_kernel_runs_on_its_gpu(make_star):
    # The two-stage program above with sigma = 0.5: F1 starts with the send (2 s), runs at
    # 1/1.5 until the send ends (3 s), so 1/1.5 s of its 2 s are done by then and the
    # remaining 4/3 s run at full speed: it ends at 3 + 4/3. Rank 1 computes nothing
    # while its receive runs.
    t, prog = make_star([10.0, 10.0]), _two_stage()
    log = {(r, n): (a, b) for r, _, n, a, b in _log(simulate(prog, t, overlap_slowdown=0.5))}
    assert log[(0, "F0")] == (0.0, 2.0) and log[(0, "s0")] == (2.0, 3.0)
    assert log[(0, "F1")][0] == 2.0 and log[(0, "F1")][1] == pytest.approx(3.0 + (2.0 - 1.0 / 1.5), rel=1e-12)
    assert log[(1, "G0")] == (3.0, 6.0)
    assert _log(simulate(prog, t, overlap_slowdown=0.0)) == _log(simulate(prog, t))
    with pytest.raises(InputError, match="overlap_slowdown"):
        simulate(prog, t, overlap_slowdown=-1.0)


def test_a_compute_action_that_outlasts_two_nccl_kernels_is_slowed_for_each(make_star):
    # C (10 s) runs while two sends run one after the other on another stream (1 s each,
    # back to back from 0): it is slowed for 2 s, so 2/(1 + sigma) of its work is done by
    # then and it ends at 2 + 10 - 2/(1 + sigma).
    t = make_star([10.0, 10.0])
    sigma = 0.25
    prog = Program({
        0: [Action("C", duration_s=10.0),
            Action("a", kind="send", peer=1, nbytes=10, stream="comm"),
            Action("b", kind="send", peer=1, nbytes=10, stream="comm")],
        1: [Action("ra", kind="recv", peer=0, nbytes=10), Action("rb", kind="recv", peer=0, nbytes=10)],
    })
    spans = {s.name: s for s in simulate(prog, t, overlap_slowdown=sigma).spans}
    assert spans["b"].end_s == pytest.approx(2.0)
    assert spans["C"].end_s == pytest.approx(2.0 + 10.0 - 2.0 / (1 + sigma), rel=1e-12)


def test_communication_whose_claim_leaves_the_sms_does_not_slow_compute(make_star):
    # As above, but the second send, and then an all-gather beside D, claim no SMs
    # (``Action.slows_compute`` false): C is slowed for the first send's 1 s alone and ends
    # at 1 + 10 - 1/(1 + sigma); D (10 s, from C's end) runs beside the all-gather at full speed.
    t = make_star([10.0, 10.0])
    sigma = 0.25
    prog = Program({
        0: [Action("C", duration_s=10.0), Action("D", duration_s=10.0),
            Action("a", kind="send", peer=1, nbytes=10, stream="comm"),
            Action("b", kind="send", peer=1, nbytes=10, stream="comm", slows_compute=False),
            Action("ag", kind="collective", op="allgather", group=(0, 1), nbytes=20, stream="comm", deps=("C",),
                   slows_compute=False)],
        1: [Action("ra", kind="recv", peer=0, nbytes=10), Action("rb", kind="recv", peer=0, nbytes=10),
            Action("ag", kind="collective", op="allgather", group=(0, 1), nbytes=20, slows_compute=False)],
    })
    spans = {s.name: s for s in simulate(prog, t, overlap_slowdown=sigma).spans if s.rank == 0}
    assert spans["b"].end_s == pytest.approx(2.0)
    c_end = 1.0 + 10.0 - 1.0 / (1 + sigma)
    assert spans["C"].end_s == pytest.approx(c_end, rel=1e-12)
    assert spans["ag"].start_s == pytest.approx(c_end, rel=1e-12) and spans["ag"].end_s > c_end
    assert spans["D"].end_s == pytest.approx(c_end + 10.0, rel=1e-12)
    # (the check has teeth: claiming SMs, both slow compute)
    held = Program({r: [a.evolve(slows_compute=True) for a in acts] for r, acts in prog.actions.items()})
    slowed = {s.name: s for s in simulate(held, t, overlap_slowdown=sigma).spans if s.rank == 0}
    assert slowed["C"].end_s == pytest.approx(2.0 + 10.0 - 2.0 / (1 + sigma), rel=1e-12)
    assert slowed["D"].end_s > slowed["C"].end_s + 10.0


def test_a_receive_waiting_for_its_send_does_not_slow_compute(make_star):
    # Rank 1 posts its receive at 0 and computes H (5 s) meanwhile; the data moves from 2 s
    # (when rank 0's F0 ends and the send starts) to 3 s. Only that second slows H:
    # it ends at 5 + 1 - 1/(1 + sigma).
    t = make_star([10.0, 10.0])
    sigma = 0.5
    prog = Program({
        0: [Action("F0", duration_s=2.0), Action("s0", kind="send", peer=1, nbytes=10, deps=("F0",))],
        1: [Action("r0", kind="recv", peer=0, nbytes=10), Action("H", duration_s=5.0)],
    })
    spans = {s.name: s for s in simulate(prog, t, overlap_slowdown=sigma).spans}
    assert (spans["r0"].start_s, spans["r0"].busy_start_s, spans["r0"].end_s) == (0.0, 2.0, 3.0)
    assert spans["H"].end_s == pytest.approx(5.0 + 1.0 - 1.0 / (1 + sigma), rel=1e-12)



def test_memory_changes_read_as_the_list_of_changes_in_order(make_star):
    """The engine keeps memory changes compactly (``sim.results.trace.MemoryLog``); the
    trace still reads them as (time, rank, category, bytes) in the order they happened,
    hand-computed here: "a" (0-1 s) holds 4 bytes of "act" and leaves 8 of "w" that "c"
    (1-1.25 s) frees; "b" on rank 1 (0.5-1.5 s, after "z") holds 2 bytes of "w"."""
    from sim.results.trace import MemoryLog

    prog = Program({0: [Action("a", duration_s=1.0, mem=(("start", "act", 4), ("end", "act", -4), ("end", "w", 8))),
                        Action("c", duration_s=0.25, mem=(("end", "w", -8),))],
                    1: [Action("z", duration_s=0.5),
                        Action("b", duration_s=1.0, mem=(("start", "w", 2), ("end", "w", -2)))]})
    mem = simulate(prog, make_star([1.0, 1.0])).memory
    want = [(0.0, 0, "act", 4.0), (0.5, 1, "w", 2.0), (1.0, 0, "act", -4.0), (1.0, 0, "w", 8.0),
            (1.25, 0, "w", -8.0), (1.5, 1, "w", -2.0)]
    assert isinstance(mem, MemoryLog)
    assert list(mem) == want and mem == want and want == mem and mem == tuple(want) and mem != want[:5]
    assert len(mem) == 6 and mem[0] == want[0] and mem[-1] == want[-1] and mem[1:3] == want[1:3]
    assert {r for _, r, _, _ in mem} == {0, 1}
    with pytest.raises(IndexError):
        mem[6]


def test_ranks_like_another_send_quietly_as_their_own_actions_say(make_star):
    # Ranks 2 and 3 copy ranks 0 and 1 (``Program.like``: the engine indexes 0's and 1's
    # lists once for both), one send of each pair leaving the SMs to compute. Indexed as
    # copies or each on its own, the run is the same; and the quiet send slows less than
    # a send that holds SMs would (the check has teeth).
    t = make_star([10.0, 10.0, 10.0, 10.0])
    sigma = 0.25

    def prog(quiet: bool, like: bool) -> Program:
        acts = {}
        for src, dst in ((0, 1), (2, 3)):
            acts[src] = [Action("C", duration_s=10.0),
                         Action("a", kind="send", peer=dst, nbytes=10, stream="comm"),
                         Action("b", kind="send", peer=dst, nbytes=10, stream="comm", slows_compute=not quiet)]
            acts[dst] = [Action("ra", kind="recv", peer=src, nbytes=10), Action("rb", kind="recv", peer=src, nbytes=10)]
        return Program(acts, check=True, like={2: 0, 3: 1} if like else None)

    def ends(p: Program) -> list:
        return [(s.rank, s.name, s.start_s, s.end_s) for s in simulate(p, t, overlap_slowdown=sigma).spans]

    assert ends(prog(True, True)) == ends(prog(True, False))
    assert ends(prog(False, True)) == ends(prog(False, False))
    c_quiet = {(r, n): e for r, n, _, e in ends(prog(True, True))}
    c_held = {(r, n): e for r, n, _, e in ends(prog(False, True))}
    assert c_quiet[(2, "C")] == c_quiet[(0, "C")] == pytest.approx(1.0 + 10.0 - 1.0 / (1 + sigma), rel=1e-12)
    assert c_held[(2, "C")] == c_held[(0, "C")] == pytest.approx(2.0 + 10.0 - 2.0 / (1 + sigma), rel=1e-12)
