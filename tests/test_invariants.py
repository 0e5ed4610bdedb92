"""The invariant checker (debug mode) holds on real runs and catches each kind of
violation it claims to: every check is shown failing on a trace broken on purpose."""

import math

import pytest
import simpy

from sim.engine import invariants
from sim.engine.core import simulate
from sim.inputs.hardware import load_profile
from sim.engine.invariants import InvariantError, check
from sim.engine.kernel import CheckingEnvironment
from sim.inputs.model import gpt
from sim.engine.network import Network
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.inputs.schema import SimulationSettings
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
TINY = gpt("tiny", 4, 512, 8, 4096, 256)


def test_the_suite_runs_in_debug_mode(monkeypatch):
    assert invariants.enabled()  # tests/conftest.py switches it on for every test
    monkeypatch.setenv("TRAINSIM_DEBUG", "0")
    assert not invariants.enabled()
    monkeypatch.setenv("TRAINSIM_DEBUG", "")
    assert not invariants.enabled()


@pytest.fixture(scope="module")
def run():
    # Pipeline p2p, DP all-reduce, ZeRO-1 memory: every kind of check has material.
    plan = ParallelPlan(dp=2, pp=2, micro_batch_size=1, global_batch_size=8, zero_stage=1)
    return simulate_training(Job(TINY, plan, H100, load_topology("dgx-h100", nodes=1)))


@pytest.mark.parametrize("plan", [
    ParallelPlan(dp=2, tp=2, pp=2, micro_batch_size=1, global_batch_size=8, schedule="1f1b"),
    ParallelPlan(dp=4, pp=2, micro_batch_size=1, global_batch_size=8, zero_stage=3, zero3_prefetch_depth=2),
    ParallelPlan(dp=8, micro_batch_size=1, global_batch_size=8, zero_stage=2, offload_optimizer=True),
    ParallelPlan(pp=4, vpp=1, global_batch_size=8, schedule="zb-h2"),
    # DeepSpeed's contiguous-gradient bucket buffer: allocated up front, resident in 'buckets'
    ParallelPlan(dp=4, micro_batch_size=1, global_batch_size=8, zero_stage=3, framework="deepspeed"),
])
def test_real_runs_satisfy_every_invariant(plan):
    topo = load_topology("dgx-h100", nodes=2)
    for fidelity in ("full", "reduced"):
        r = simulate_training(Job(TINY, plan, H100, topo), SimulationSettings(fidelity=fidelity))
        check(r.program, r.trace)  # also ran inside simulate (debug mode); explicit here


def _broken(run, **changes):
    """The run's trace with one span changed (by index into the sorted spans)."""
    import copy

    t = copy.copy(run.trace)
    t.spans = list(run.trace.spans)
    t.memory = list(run.trace.memory)
    t.transfers = list(run.trace.transfers)
    for i, fields in changes.items():
        t.spans[int(i[1:])] = t.spans[int(i[1:])]._replace(**fields)
    return t


def _index(run, pred):
    return next(i for i, s in enumerate(run.trace.spans) if pred(s))


def test_overlapping_ops_on_one_stream_are_caught(run):
    spans = run.trace.spans
    i = next(i for i in range(1, len(spans)) if spans[i].rank == spans[i - 1].rank
             and spans[i].stream == spans[i - 1].stream and spans[i - 1].end_s > spans[i - 1].start_s)
    prev = spans[i - 1]
    t = _broken(run, **{f"s{i}": {"start_s": prev.start_s, "busy_start_s": prev.start_s}})
    with pytest.raises(InvariantError, match="still running|before its dependency"):
        check(run.program, t)


def test_starting_before_a_dependency_ends_is_caught(run):
    prog = run.program
    r, a = next((r, a) for r, acts in prog.actions.items() for a in acts
                if any(not isinstance(d, str) for d in a.deps))  # a cross-stream dependency
    i = _index(run, lambda s: s.rank == r and s.name == a.name)
    t = _broken(run, **{f"s{i}": {"start_s": 0.0, "busy_start_s": 0.0}})
    with pytest.raises(InvariantError, match="before its dependency|still running"):
        check(prog, t)


def test_an_action_that_never_ran_is_caught(run):
    t = _broken(run)
    dropped = t.spans.pop(len(t.spans) // 2)
    with pytest.raises(InvariantError, match=f"{dropped.name!r} on rank {dropped.rank} never ran"):
        check(run.program, t)


def test_a_send_received_with_another_size_is_caught(run):
    i = _index(run, lambda s: s.kind == "recv")
    t = _broken(run, **{f"s{i}": {"nbytes": run.trace.spans[i].nbytes + 1}})
    with pytest.raises(InvariantError, match="bytes but recv"):
        check(run.program, t)


def test_a_recv_without_its_send_is_caught(run):
    i = _index(run, lambda s: s.kind == "recv")
    t = _broken(run, **{f"s{i}": {"link_id": 10**9}})
    with pytest.raises(InvariantError, match="expected one send and one recv"):
        check(run.program, t)


def test_negative_memory_is_caught(run):
    t = _broken(run)
    t.memory.insert(0, (0.0, 0, "activations", -1e6))
    t.memory.append((t.end_s, 0, "activations", 1e6))  # ends balanced: only the dip is wrong
    with pytest.raises(InvariantError, match="'activations' on rank 0 went negative"):
        check(run.program, t)


def test_memory_left_over_at_the_end_is_caught(run):
    t = _broken(run)
    t.memory.append((t.end_s, 1, "activations", 4096.0))
    with pytest.raises(InvariantError, match="'activations' on rank 1 ends the iteration at 4096"):
        check(run.program, t)
    t = _broken(run)
    t.memory.append((t.end_s, 1, "optimizer", -4096.0))
    with pytest.raises(InvariantError, match="'optimizer' on rank 1 ends the iteration"):
        check(run.program, t)
    t = _broken(run)  # a transient category with nothing resident in it must end empty
    t.memory.append((t.end_s, 0, "buckets", 1e9))
    with pytest.raises(InvariantError, match="'buckets' on rank 0 ends the iteration at 1e\\+09 bytes, not the resident 0"):
        check(run.program, t)


def test_a_transfer_faster_than_its_bottleneck_is_caught(make_star):
    topo = make_star([100e9, 100e9])
    from sim.program.actions import Action, Program

    prog = Program({0: [Action("s", kind="send", peer=1, nbytes=1e9)],
                    1: [Action("r", kind="recv", peer=0, nbytes=1e9)]})
    from sim.engine.core import _Engine

    eng = _Engine(prog, topo, None, check=True)
    trace = eng.run()
    assert trace.end_s == pytest.approx(1e9 / 100e9)
    rec = trace.transfers[0]
    trace.transfers = [rec.__class__(rec.src, rec.dst, rec.nbytes, rec.start_s, rec.start_s + 0.5 * 1e9 / 100e9,
                                     rec.label, rec.medium)]
    with pytest.raises(InvariantError, match="faster than its bottleneck"):
        check(prog, trace, eng.net)


def _two_flows(topo):
    from sim.program.actions import Action, Program

    return Program({0: [Action("s", kind="send", peer=2, nbytes=1e9)],
                    1: [Action("s", kind="send", peer=2, nbytes=1e9)],
                    2: [Action("r0", kind="recv", peer=0, nbytes=1e9, stream="a"),
                        Action("r1", kind="recv", peer=1, nbytes=1e9, stream="b")]})


def test_a_link_over_its_capacity_is_caught(make_star, monkeypatch):
    topo = make_star([100e9, 100e9, 100e9])
    assert simulate(_two_flows(topo), topo).end_s == pytest.approx(2e9 / 100e9)  # they share gpu2's link
    import sim.engine.network

    real = sim.engine.network._max_min_rates
    monkeypatch.setattr(sim.engine.network, "_max_min_rates", lambda *a: {f: 2 * r for f, r in real(*a).items()})
    with pytest.raises(InvariantError, match="over its capacity"):
        simulate(_two_flows(topo), topo)


def test_a_flow_whose_rate_history_does_not_add_up_is_caught(make_star, monkeypatch):
    topo = make_star([100e9, 100e9, 100e9])
    real = Network._reallocate

    def lying(self, _event=None):
        real(self, _event)
        for fl in self._flows_on:
            for f in fl:
                f.rate *= 0.5  # recorded rate no longer what the timers were set with

    monkeypatch.setattr(Network, "_reallocate", lying)
    with pytest.raises(InvariantError, match="not delivered"):
        simulate(_two_flows(topo), topo)


def test_time_going_backwards_is_caught():
    env = CheckingEnvironment()
    env.timeout(5.0)
    env._now = env.now = 10.0  # as if something had advanced the clock (both names of it) past a pending event
    with pytest.raises(InvariantError, match="went backwards from 10.0 s to 5.0 s"):
        env.step()


def test_checks_are_off_without_debug_mode(make_star, monkeypatch):
    monkeypatch.setenv("TRAINSIM_DEBUG", "0")
    import sim.engine.network

    real = sim.engine.network._max_min_rates
    monkeypatch.setattr(sim.engine.network, "_max_min_rates", lambda *a: {f: 2 * r for f, r in real(*a).items()})
    topo = make_star([100e9, 100e9, 100e9])
    assert simulate(_two_flows(topo), topo).end_s == pytest.approx(1e9 / 100e9)  # wrong, and unchecked
    assert not math.isnan(simulate(_two_flows(topo), topo, check_invariants=False).end_s)
