"""The engine's SimPy kernel: an event loop and timed calls, on SimPy's own event queue.

The engine schedules millions of events per iteration, most of them a plain function
call due at some simulated time. SimPy's public API (``Environment``, ``Event``,
``timeout``, callbacks) would do all of it, but pays for generality at every event: a
``Timeout`` object per call, a Python-level ``step()`` per event. This module does the
same work with less, on SimPy's own data structures, so that SimPy events and the
engine's calls still share one queue and one order:

- ``Calls.at(t, fn, arg)`` has ``fn(arg)`` called at time ``t``, as a timeout with that
  callback would, and calls due at one instant share one queue entry;
- ``Environment.run()`` is SimPy's ``run()`` with the work of ``step()`` inline, and the
  calls of a ``Calls`` entry made right in the loop;
- ``Environment.now`` is a plain attribute, kept equal to SimPy's clock, so that code
  outside this module reads the time through SimPy's public name at the cost of an
  attribute.

This is the only module that touches SimPy's internals, and it touches these four, all
for the event rate: ``Environment._now`` (the clock, which ``schedule`` adds delays to:
the loop moves it with ``now``), ``Environment._queue`` (a heap of ``(time, priority,
event id, event)`` entries, priority ``NORMAL``: the loop pops it, ``Calls`` pushes onto
it), ``Environment._eid`` (the ``itertools.count`` of event ids: ``Calls`` draws from it
as ``schedule`` does, and ``events_processed`` reads its next value from its repr), and
``Event._ok``, which SimPy's ``step()`` reads of a queued event (a ``Calls`` entry
carries it). Failed events are read as SimPy's ``step()`` reads them, but through the
public ``ok``, ``defused`` and ``value``. These internals are SimPy 4.1's;
``pyproject.toml`` pins that series, and ``tests/test_kernel.py`` checks that each is
still there and shaped as used here, and that this loop processes events exactly as
SimPy's own ``run()`` does. Everything else in the engine uses SimPy's public API only
(``docs/architecture.md``, "SimPy: what the engine relies on").
"""

from __future__ import annotations

from heapq import heappop, heappush

import simpy
from simpy.events import NORMAL

from sim.engine import invariants

_new_object = object.__new__


class Environment(simpy.Environment):
    """A SimPy environment with a cheaper run loop, a clock readable as a plain
    attribute, and a count of the events it has processed (for benchmarks)."""

    now = 0.0
    """The current simulated time: SimPy's ``now``, as an attribute (this class
    attribute shadows SimPy's property; every instance sets its own). Every place that
    moves SimPy's clock here moves this one too."""

    calls: Calls | None = None
    """The ``Calls`` whose entries ``run`` makes itself (the first one made on it)."""

    def __init__(self, initial_time: float = 0.0):
        super().__init__(initial_time)
        self.now = initial_time

    @property
    def events_processed(self) -> int:
        """Every event scheduled draws the next number of ``_eid``, and a run that ends
        has processed every event it scheduled. (Counting in the loop would cost at
        every event.)"""
        scheduled = int(repr(self._eid)[6:-1])  # "count(N)": its next value, without drawing it
        return scheduled - len(self._queue)

    def step(self) -> None:
        """SimPy's ``step()``, with ``now`` moved first to the time of the event it is
        about to process (the head of the heap), as SimPy moves its clock before any
        callback runs. SimPy's ``run(until)`` and the checking environment's run go
        through it."""
        queue = self._queue
        if queue:  # (if not, SimPy's step raises EmptySchedule, and the clock stays)
            self.now = queue[0][0]
        super().step()

    def run(self, until=None):
        """Process events until none is left: SimPy's ``run()`` with the work of its
        ``step()`` inline, and the calls of a ``Calls`` entry made right here. Same
        events, same order, same handling of a failed event; a Python call or two less
        per queue entry. (With ``until``, SimPy's own loop.)"""
        if until is not None:
            return super().run(until)
        queue = self._queue
        mine, opened = (self.calls.callbacks, self.calls._open) if self.calls is not None else (None, None)
        while queue:
            now, _, _, event = heappop(queue)
            self._now = self.now = now
            callbacks, event.callbacks = event.callbacks, None
            if callbacks is mine:  # what Calls._make does
                for fn, arg in event.calls:  # (the list may grow while this runs)
                    fn(arg)
                opened.pop(now, None)
                continue
            for callback in callbacks:
                callback(event)
            if not event.ok and not event.defused:  # a failed event nobody handled: as SimPy
                exc = type(event.value)(*event.value.args)
                exc.__cause__ = event.value
                raise exc
        return None


class CheckingEnvironment(Environment):
    """Debug mode: also checks that simulated time never goes backwards."""

    run = simpy.Environment.run  # (one step at a time, through the checking step below)

    def step(self) -> None:
        before = self.now
        super().step()
        if self.now < before:
            invariants.violation(f"simulated time went backwards from {before!r} s to {self.now!r} s")


class _Entry:
    """A ``Calls`` queue entry: its calls, and what SimPy's ``Environment.step`` reads of
    a queued event, its callbacks (which it takes and sets to None) and ``_ok`` (that it
    did not fail). Cheaper to make than a ``Timeout`` (no ``__dict__``)."""

    __slots__ = ("callbacks", "calls")
    _ok = ok = True  # (``_ok`` is what SimPy's own step reads, ``ok`` what this module's loop does)


class Calls:
    """Function calls due at simulated times, on SimPy's event queue.

    ``at(t, fn, arg)`` has ``fn(arg)`` called at time ``t`` (not before now), exactly as
    a SimPy timeout with that callback would: it draws the next event id, and counts as
    one event. Calls due at one instant share one queue entry, made in id order, for as
    long as only ``Calls`` draws ids: SimPy orders events at one instant by id, and no
    other event can then sit between two of them. When anything else draws an id (a
    SimPy event is scheduled), every entry still open takes no more calls, and later
    calls start new ones behind it. In a synchronous training step thousands of calls
    land at one instant (every replica's step of a collective, every GPU's layer), so
    this saves a heap push, a pop and an entry for each but one of them. A call may join
    the entry being made (a call due now joins its end).

    On an ``Environment`` of this module, the first ``Calls`` made registers itself as
    ``env.calls``, and its loop makes an entry's calls itself; on any other SimPy
    environment, SimPy does, through the entry's callback."""

    __slots__ = ("entries", "callbacks", "_open", "_queue", "_eid", "_e", "_env")

    def __init__(self, env: simpy.Environment):
        self._env, self._queue, self._eid = env, env._queue, env._eid
        self.entries = 0
        """Queue entries made so far (each holding one or more calls)."""
        self.callbacks = [self._make]
        """Every entry's callbacks (so that a loop can tell this object's entries)."""
        self._open: dict[float, list] = {}  # time -> the calls of the entry still open at that time
        self._e = -2  # the last id drawn here
        if getattr(env, "calls", False) is None:
            env.calls = self

    def at(self, t: float, fn, arg) -> None:
        e = next(self._eid)
        opened = self._open
        if e != self._e + 1:  # something else drew an id since: it stays ahead of later calls
            opened.clear()
        self._e = e
        run = opened.get(t)
        if run is not None:
            run.append((fn, arg))
        else:
            opened[t] = run = [(fn, arg)]
            entry = _new_object(_Entry)
            entry.callbacks = self.callbacks  # step() only reads it, then sets the entry's to None
            entry.calls = run
            heappush(self._queue, (t, NORMAL, e, entry))
            self.entries += 1

    def _make(self, entry) -> None:
        """An entry's calls, made in order (the list may grow while this runs); then the
        entry leaves the open ones. (No later call could join it anyway: any event at
        this instant still to come drew its id after the entry's, so either it is a call
        in this entry or an id drawn elsewhere closed it. Closing an entry still open
        behind it, early, would be safe too: later calls then go behind it.)"""
        for fn, arg in entry.calls:
            fn(arg)
        self._open.pop(self._env.now, None)
