"""The engine's SimPy kernel (``sim.engine.kernel``): the SimPy internals it relies on are
still there and shaped as it uses them; its timed calls and its event loop process events
exactly as SimPy's own ``run()`` does; and nothing outside it touches SimPy's internals,
nor does reading a trace import SimPy at all."""

import heapq
import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import simpy
import simpy.events

from sim.engine.kernel import Calls, CheckingEnvironment, Environment

TESTED = "4.1.x"
ROOT = Path(__file__).resolve().parent.parent


def _changed(what: str) -> str:
    return (f"SimPy {simpy.__version__} changed the internals sim/engine/kernel.py uses ({what}): "
            f"trainsim is tested against simpy {TESTED}")


# ------------------------------------------------------------------ SimPy's internals
def test_the_environment_internals_the_kernel_uses_are_there():
    env = simpy.Environment(2.5)
    assert getattr(env, "_now", None) == 2.5, _changed("Environment._now, the clock")
    env._now = 3.0  # as the kernel's loop moves it
    env.timeout(1.0)
    assert env.peek() == 4.0, _changed("Environment._now, the clock schedule() adds delays to")
    env = simpy.Environment(2.5)
    assert isinstance(getattr(env, "_queue", None), list), _changed("Environment._queue, a heap in a list")
    eid = getattr(env, "_eid", None)
    assert isinstance(eid, itertools.count), _changed("Environment._eid, an itertools.count of event ids")
    assert repr(eid) == "count(0)", _changed("repr(Environment._eid), read for its next value")
    assert isinstance(simpy.Environment.__dict__.get("now"), property), _changed("Environment.now, a property")
    for name in ("step", "run", "schedule"):
        assert callable(getattr(simpy.Environment, name, None)), _changed(f"Environment.{name}")


def test_a_queue_entry_is_time_priority_id_event():
    env = simpy.Environment(0.0)
    first = env.timeout(1.5)
    second = env.event()
    second.succeed("x")
    assert simpy.events.NORMAL == 1 and simpy.events.URGENT == 0, _changed("the priorities NORMAL and URGENT")
    entries = sorted(env._queue)
    assert all(type(e) is tuple and len(e) == 4 for e in entries), _changed("a queue entry, a 4-tuple")
    assert entries == [(0.0, simpy.events.NORMAL, 1, second), (1.5, simpy.events.NORMAL, 0, first)], \
        _changed("a queue entry, (time, priority, event id, event)")
    assert repr(env._eid) == "count(2)", _changed("Environment._eid, one id drawn per event scheduled")
    assert heapq.heappop(env._queue)[3] is second, _changed("Environment._queue, a heap (heapq) of entries")


def test_step_reads_only_callbacks_and_ok_of_a_queued_event():
    # A Calls entry is no SimPy Event: it carries callbacks and _ok, and SimPy's step
    # must need nothing more of an event that did not fail.
    class Bare:
        __slots__ = ("callbacks",)
        _ok = True

    env = simpy.Environment(0.0)
    bare, seen = Bare(), []
    bare.callbacks = [seen.append]
    heapq.heappush(env._queue, (1.0, simpy.events.NORMAL, next(env._eid), bare))
    env.step()
    assert seen == [bare] and bare.callbacks is None and env.now == 1.0, \
        _changed("step() reads an event's callbacks and _ok only, and sets its callbacks to None")
    ok = env.event()
    ok.succeed(7)
    assert ok._ok is True, _changed("Event._ok of a triggered event")


def test_the_public_event_state_the_loop_reads_of_a_failure():
    # The loop raises a failed event nobody defused as step() does, through these.
    env = simpy.Environment(0.0)
    bad = env.event()
    bad.fail(ValueError("x"))
    assert bad.ok is False and isinstance(bad.value, ValueError) and bad.defused is False
    assert bad._ok is False, _changed("Event._ok of a failure")
    bad.defused = True
    assert bad.defused is True


# ------------------------------------------------------------------ the kernel
def test_calls_at_one_instant_share_a_queue_entry_and_keep_their_order():
    # Separate SimPy timeouts would run a, b, the SimPy event, c (in id order at t=1),
    # then d, the call d makes for its own instant, and f. Calls give the same order,
    # with a, b in one entry, c in its own (the SimPy event took an id after b's, so b's
    # entry takes no more calls), and at t=2 d, f and e in one: f's id came after x's,
    # but x is a call at another instant, and e joins the entry while it runs.
    env = simpy.Environment()
    calls = Calls(env)
    log = []
    calls.at(1.0, log.append, "a")
    calls.at(1.0, log.append, "b")
    env.timeout(1.0).callbacks.append(lambda _e: log.append("simpy"))
    calls.at(1.0, log.append, "c")
    calls.at(2.0, lambda x: (log.append(x), calls.at(env.now, log.append, "e")), "d")
    calls.at(1.5, log.append, "x")
    calls.at(2.0, log.append, "f")
    env.run()
    assert log == ["a", "b", "simpy", "c", "x", "d", "f", "e"]
    assert calls.entries == 4 and env.now == 2.0


def test_a_call_after_a_simpy_event_at_one_instant_stays_behind_it():
    # The timeout draws an id after a's, so b gets an entry of its own behind it; at t=1
    # the timeout's callback asks for a call now, which goes after b (SimPy: a, the
    # timeout, b, then the new call, in id order).
    env = simpy.Environment()
    calls = Calls(env)
    log = []
    calls.at(1.0, log.append, "a")
    env.timeout(1.0).callbacks.append(lambda _e: (log.append("simpy"), calls.at(env.now, log.append, "late")))
    calls.at(1.0, log.append, "b")
    env.run()
    assert log == ["a", "simpy", "b", "late"]


def _mixed_schedule(env):
    """Calls (some sharing an entry, one joining its run while it runs), SimPy timeouts
    and a triggered event at the same and at different instants; returns the log."""
    calls = Calls(env)
    log = []
    calls.at(1.0, log.append, "a")
    calls.at(1.0, log.append, "b")
    env.timeout(1.0).callbacks.append(lambda _e: log.append("simpy"))
    calls.at(1.0, lambda x: (log.append(x), calls.at(env.now, log.append, "c2")), "c")
    ev = env.event()
    calls.at(0.5, lambda _x: ev.succeed(), None)
    ev.callbacks.append(lambda _e: (log.append(("event", env.now)), calls.at(2.0, log.append, "d3")))
    calls.at(2.0, log.append, "d")
    calls.at(1.5, log.append, "x")
    calls.at(2.0, log.append, "d2")
    return log


def test_the_engine_loop_processes_events_exactly_as_simpys_run():
    # The engine's environment runs the queue with its own loop (step's work inline,
    # a Calls entry's calls made right there); the same schedule must give the same
    # order and end time as SimPy's own run().
    ours, theirs = Environment(0.0), simpy.Environment(0.0)
    log_ours, log_theirs = _mixed_schedule(ours), _mixed_schedule(theirs)
    assert ours.calls is not None  # (so its loop makes the calls itself)
    ours.run()
    theirs.run()
    assert log_ours == log_theirs == [("event", 0.5), "a", "b", "simpy", "c", "c2", "x", "d", "d2", "d3"]
    assert ours.now == theirs.now == 2.0
    assert ours.events_processed == 11  # 9 calls, a timeout and the event


def test_the_engine_loop_raises_a_failed_event_as_simpy_does():
    for env in (Environment(0.0), simpy.Environment(0.0)):
        env.event().fail(ValueError("link down"))
        with pytest.raises(ValueError, match="link down") as info:
            env.run()
        assert isinstance(info.value.__cause__, ValueError)
        defused = env.event()
        defused.fail(ValueError("handled"))
        defused.defused = True
        env.run()  # a defused failure does not stop the run


def test_now_is_the_clock_whichever_loop_runs():
    # Environment.now is a plain attribute, not SimPy's property: the fast loop,
    # SimPy's run(until) and the checking environment's step-by-step run all keep it.
    for env in (Environment(0.0), CheckingEnvironment(0.0)):
        seen = []
        calls = Calls(env)
        calls.at(1.0, lambda _x: seen.append(env.now), None)
        env.timeout(2.0).callbacks.append(lambda _e: seen.append(env.now))
        calls.at(3.0, lambda _x: seen.append(env.now), None)
        env.run(until=2.5)
        assert seen == [1.0, 2.0] and env.now == env._now == 2.5
        env.run()
        assert seen == [1.0, 2.0, 3.0] and env.now == env._now == 3.0
    assert Environment(4.0).now == 4.0


# ------------------------------------------------------------------ containment
_PRIVATE = re.compile(r"\._(now|queue|eid|ok|value|defused|active_proc)\b|\b(NORMAL|URGENT|PENDING)\b")
_IMPORT = re.compile(r"^\s*(import|from)\s+simpy\b")


def test_no_module_but_the_kernel_touches_simpys_internals():
    # The engine's modules use SimPy's public names only; the rest of sim/ does not
    # import SimPy at all.
    offenders = []
    for path in sorted((ROOT / "sim").rglob("*.py")):
        engine = path.parent == ROOT / "sim" / "engine"
        if path == ROOT / "sim" / "engine" / "kernel.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if (engine and _PRIVATE.search(code)) or (not engine and _IMPORT.search(code)):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "SimPy internals (or SimPy) outside sim/engine/kernel.py:\n" + "\n".join(offenders)


@pytest.mark.parametrize("modules", ["sim.results.trace, sim.results.metrics, sim.results.export",
                                     "sim.results.memory_timeline"])
def test_reading_a_trace_does_not_import_simpy(modules):
    code = f"import sys; import {modules}; assert 'simpy' not in sys.modules, 'simpy imported'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
