"""The discrete-event engine: runs a Program on a topology and returns a Trace.

This is the only module that drives SimPy. Each (rank, stream) pair runs its actions
in order, one at a time: an action starts when its stream is free and every action it
depends on has finished, holds the stream for as long as it takes, and records a span.
Streams are dependency counters driven by SimPy callbacks, not one SimPy process each:
a compute action is a single timeout (the duration it carries; costs are computed
outside, from a hardware profile); sends, receives, copies and collectives take as long
as the flow-level network model (``sim.network``) needs for their transfers.

The engine does not know which schedule produced a program, nor any hardware figure.

Deadlock: SimPy stops when no event is left. If some action has not finished by then,
nothing can ever finish it (a receive with no matching send, a collective that a member
never joins, a cycle of dependencies), and ``DeadlockError`` names every blocked rank,
the action it is stuck on and what that action waits for. A simulation never hangs.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from contextlib import contextmanager
from functools import partial

import simpy
from simpy.events import Timeout

_tuple_new = tuple.__new__  # a Span without the named tuple's Python-level __new__

from sim import collectives, invariants
from sim.actions import Action, Program
from sim.errors import DeadlockError, InputError
from sim.network import Network
from sim.topology import Topology
from sim.trace import Span, Trace


def simulate(program: Program, topology: Topology, *, link_efficiency: dict[str, float] | None = None,
             fluid_collectives: bool = False, check_invariants: bool | None = None) -> Trace:
    """Run ``program`` on ``topology`` and return its ``Trace``.

    ``link_efficiency`` scales each link kind's bandwidth (e.g. ``{"ib": 0.96}``).
    ``fluid_collectives`` prices each ring hop as one transfer (``sim.collectives``).
    ``check_invariants`` checks ``sim.invariants`` during and after the run (default:
    debug mode, the environment variable ``TRAINSIM_DEBUG``).
    """
    if check_invariants is None:
        check_invariants = invariants.enabled()
    with gc_paused():
        return _Engine(program, topology, link_efficiency, fluid_collectives, check_invariants).run()


@contextmanager
def gc_paused():
    """Python's cyclic garbage collector off for a while. Building and running a program
    allocates millions of small objects and no reference cycles; with the collector on,
    its full passes walk every one of them again and again. On the way out the objects
    still alive are frozen (``gc.freeze``), so that the next full pass does not walk
    them either (2.5-3 s on GPT-3 175B at 256 GPUs); reference counting still frees
    them as usual."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.freeze()
            gc.enable()


class _CountingEnvironment(simpy.Environment):
    """A SimPy environment that knows how many events it has processed (for benchmarks):
    every event scheduled draws the next number of ``_eid``, and a run that ends has
    processed every event it scheduled. (Counting in ``step`` would add a Python call
    to every event.)"""

    @property
    def events_processed(self) -> int:
        scheduled = self._eid.__reduce__()[1][0]  # the counter's next value, without drawing it
        return scheduled - len(self._queue)


class _CheckingEnvironment(_CountingEnvironment):
    """Debug mode: also checks that simulated time never goes backwards."""

    def step(self):
        before = self._now
        super().step()
        if self._now < before:
            invariants.violation(f"simulated time went backwards from {before!r} s to {self._now!r} s")


class _Rendezvous:
    """Where the parties of a send/recv pair or of a collective meet: ``posted`` maps
    each party to its action index, ``meta`` is the link id (p2p) or the first member's
    action (collective)."""

    __slots__ = ("posted", "meta", "began")

    def __init__(self):
        self.posted: dict = {}
        self.meta = None
        self.began = None  # when the last party arrived and data started to move


class _Engine:
    """Streams as dependency counters driven by SimPy callbacks.

    Each action gets an index; ``pending[i]`` counts its unfinished dependencies and
    ``dependents[i]`` lists the actions waiting for it. A stream starts its head action
    when it is idle and the action's count is zero. A compute action is one SimPy
    timeout whose callback finishes it; sends, receives, copies and collectives finish
    from the network's events. Finishing an action starts its stream's next one and
    releases its dependents; actions that become ready at the same instant start in
    the order they became ready (a queue, not recursion), so a simulation is
    deterministic and never deep in the Python stack.
    """

    def __init__(self, program: Program, topology: Topology, link_efficiency, fluid: bool = False,
                 check: bool = False):
        top = program.max_rank()
        if top >= topology.num_gpus:
            raise InputError(
                f"program: uses rank {top}, but topology {topology.name} has {topology.num_gpus} GPUs (ranks 0..{topology.num_gpus - 1})"
            )
        program.check()
        self.program = program
        self.topology = topology
        self.fluid = fluid
        self.check = check
        self.env = _CheckingEnvironment() if check else _CountingEnvironment()
        self.net = Network(self.env, topology, link_efficiency, check=check)
        self.spans: list[Span] = []
        self.memory: list[tuple[float, int, str, float]] = []
        self._p2p: dict[tuple, _Rendezvous] = {}
        self._coll: dict[tuple, _Rendezvous] = {}
        self._keys: dict[tuple[int, str], tuple] = {}
        self._step_plans: dict[tuple, tuple] = {}
        self._link_ids = 0
        self._index()
        self._assign_match_keys()

    def _index(self) -> None:
        acts: list[Action] = []
        rank_of: list[int] = []
        stream_of: list[int] = []
        streams: list[tuple[int, str]] = []
        members: list[list[int]] = []
        ids: dict[tuple[int, str], int] = {}
        for r, lst in self.program.actions.items():
            by: dict[str, list[Action]] = {}
            for a in lst:
                by.setdefault(a.stream, []).append(a)
            for name in sorted(by):
                sid = len(streams)
                streams.append((r, name))
                mine = []
                for a in by[name]:
                    i = len(acts)
                    ids[(r, a.name)] = i
                    acts.append(a)
                    rank_of.append(r)
                    stream_of.append(sid)
                    mine.append(i)
                members.append(mine)
        pending = [0] * len(acts)
        dependents: list[list[int] | None] = [None] * len(acts)
        for i, a in enumerate(acts):
            if a.deps:
                r = rank_of[i]
                for d in a.deps:
                    j = ids[(r, d) if d.__class__ is str else d]
                    pending[i] += 1
                    if dependents[j] is None:
                        dependents[j] = [i]
                    else:
                        dependents[j].append(i)
        self._acts, self._rank_of, self._stream_of = acts, rank_of, stream_of
        self._streams, self._members, self._ids = streams, members, ids
        self._pending, self._dependents = pending, dependents
        self._pos = [0] * len(streams)
        self._busy = [False] * len(streams)
        self._start = [0.0] * len(acts)
        self._finished = bytearray(len(acts))
        self._ready: deque[int] = deque()
        self._draining = False

    def _assign_match_keys(self) -> None:
        """Static matching: the n-th untagged send a->b meets the n-th recv on b from a."""
        p2p_seq: dict[tuple, int] = {}
        coll_seq: dict[tuple, int] = {}
        for r, acts in self.program.actions.items():
            for a in acts:
                if a.kind in ("send", "recv"):
                    pair = (r, a.peer) if a.kind == "send" else (a.peer, r)
                    if a.tag:
                        key = (*pair, "tag", a.tag)
                    else:
                        n = p2p_seq.get((pair, a.kind), 0)
                        p2p_seq[(pair, a.kind)] = n + 1
                        key = (*pair, "seq", n)
                    self._keys[(r, a.name)] = key
                elif a.kind == "collective":
                    group = tuple(sorted(a.group))
                    if a.tag:
                        key = (group, "tag", a.tag)
                    else:
                        n = coll_seq.get((group, r), 0)
                        coll_seq[(group, r)] = n + 1
                        key = (group, "seq", n)
                    self._keys[(r, a.name)] = key

    # ------------------------------------------------------------------ run
    def run(self) -> Trace:
        env = self.env
        t0 = time.perf_counter()
        for sid in range(len(self._streams)):
            self._kick(sid)
        env.run()
        engine_s = time.perf_counter() - t0
        unfinished = [sid for sid, mine in enumerate(self._members) if self._pos[sid] < len(mine)]
        if unfinished:
            raise DeadlockError(self._explain(unfinished), env.now)
        self.spans.sort(key=lambda s: (s.rank, s.stream, s.start_s, s.end_s, s.name))
        link_bytes = {self.net.link_names[i]: b for i, b in enumerate(self.net.link_bytes) if b > 0}
        kinds = {self.net.link_names[i]: self.net.link_kinds[i] for i, b in enumerate(self.net.link_bytes) if b > 0}
        ranks = {r: {"node": self.topology.node_of(r), "device": self.topology.gpu(r)} for r in self.program.ranks}
        trace = Trace(self.spans, list(self.net.records), link_bytes, kinds, ranks, self.topology.name, self.memory)
        trace.stats = {"events": env.events_processed, "actions": len(self.program),
                       "transfers": len(self.net.records), "simulated_gpus": len(self.program.actions),
                       "engine_wall_s": engine_s}
        if self.check:
            if self.net.active:
                invariants.violation(f"{self.net.active} network flows never finished")
            invariants.check(self.program, trace, self.net)
        return trace

    def _kick(self, sid: int) -> None:
        """Start stream ``sid``'s head action if it can start now (and whatever that
        makes ready, in order)."""
        self._ready.append(sid)
        if not self._draining:
            self._drain()

    def _drain(self) -> None:
        ready = self._ready
        self._draining = True
        pos, busy, members, pending, begin = self._pos, self._busy, self._members, self._pending, self._begin
        try:
            while ready:
                sid = ready.popleft()
                if busy[sid]:
                    continue
                mine = members[sid]
                k = pos[sid]
                if k < len(mine) and pending[mine[k]] == 0:
                    busy[sid] = True
                    begin(mine[k])
        finally:
            self._draining = False

    def _begin(self, i: int) -> None:
        a = self._acts[i]
        now = self.env._now
        self._start[i] = now
        if a.mem:
            self._apply_mem(self._rank_of[i], a, "start")
        kind = a.kind
        if kind == "compute" or kind == "comm":
            if a.duration_s > 0:
                Timeout(self.env, a.duration_s).callbacks.append(partial(self._timed_out, i))
            else:
                self._finish(i, now, None)
        elif kind == "collective":
            self._join_collective(self._rank_of[i], a, i)
        elif kind == "copy":
            self.net.transfer_host(self._rank_of[i], a.nbytes, a.op == "d2h",
                                   f"{a.category or 'copy'} {a.name}").callbacks.append(partial(self._copied, i, now))
        else:
            self._join_p2p(self._rank_of[i], a, i)

    def _timed_out(self, i: int, _event) -> None:
        self._finish(i, self._start[i], None)

    def _copied(self, i: int, began: float, _event) -> None:
        self._finish(i, began, None)

    def _finish(self, i: int, busy_start: float, link_id) -> None:
        a = self._acts[i]
        rank = self._rank_of[i]
        if a.mem:
            self._apply_mem(rank, a, "end")
        sid = self._stream_of[i]
        self.spans.append(_tuple_new(Span, (rank, self._streams[sid][1], a.name, a.kind, a.category or (a.op or a.kind),
                                            self._start[i], self.env._now, a.nbytes, a.flops, a.peer, a.op, link_id,
                                            busy_start, a.layer)))
        self._finished[i] = 1
        self._busy[sid] = False
        self._pos[sid] += 1
        ready = self._ready
        ready.append(sid)
        deps = self._dependents[i]
        if deps:
            pending, stream_of = self._pending, self._stream_of
            for j in deps:
                pending[j] -= 1
                if pending[j] == 0:
                    ready.append(stream_of[j])
        if not self._draining:
            self._drain()

    def _apply_mem(self, rank: int, a: Action, when: str) -> None:
        now = self.env._now
        for w, category, nbytes in a.mem:
            if w == when:
                self.memory.append((now, rank, category, float(nbytes)))

    # ------------------------------------------------------------------ p2p
    def _join_p2p(self, rank: int, a: Action, i: int) -> None:
        key = self._keys[(rank, a.name)]
        rv = self._p2p.get(key)
        if rv is None:
            rv = self._p2p[key] = _Rendezvous()
            self._link_ids += 1
            rv.meta = self._link_ids
        rv.posted[a.kind] = (rank, a, i)
        if len(rv.posted) == 2:
            rv.began = self.env._now
            (src, send, si), (dst, recv, ri) = rv.posted["send"], rv.posted["recv"]
            if recv.nbytes and recv.nbytes != send.nbytes:
                raise InputError(
                    f"program: recv {recv.name!r} on rank {dst} expects {recv.nbytes} bytes but the matching send {send.name!r} on rank {src} sends {send.nbytes}"
                )
            ev = self.net.transfer(src, dst, send.nbytes, f"{send.category or 'p2p'} {send.name}")
            ev.callbacks.append(partial(self._delivered, si, ri, rv))
            del self._p2p[key]

    def _delivered(self, si: int, ri: int, rv: _Rendezvous, _event) -> None:
        self._finish(si, rv.began, rv.meta)
        self._finish(ri, rv.began, rv.meta)

    # ------------------------------------------------------------------ collectives
    def _join_collective(self, rank: int, a: Action, i: int) -> None:
        key = self._keys[(rank, a.name)]
        rv = self._coll.get(key)
        if rv is None:
            rv = self._coll[key] = _Rendezvous()
            rv.meta = a
        first = rv.meta
        if (a.op, a.nbytes, a.algo, a.channels, a.group) != (first.op, first.nbytes, first.algo, first.channels, first.group):
            raise InputError(
                f"program: collective {a.name!r} on rank {rank} ({a.op}, {a.nbytes} B, {a.algo}) does not match "
                f"{first.name!r} on the other members ({first.op}, {first.nbytes} B, {first.algo})"
            )
        rv.posted[rank] = i
        if len(rv.posted) == sum(1 for g in a.group if g not in self.program.shadows):
            del self._coll[key]
            rv.began = self.env._now
            self._run_steps(self._plan_steps(a), rv, f"{a.category or a.op} {a.op} {a.name}")

    def _plan_steps(self, a: Action):
        """The collective's steps and their bookkeeping, built once per distinct
        (op, group, size, algorithm): a training iteration repeats the same few
        collectives thousands of times. Under reduced fidelity with fluid rings, hops
        between two shadows are dropped: no simulated rank waits for them, and by
        symmetry they take as long as the hops that are simulated."""
        key = (a.op, a.group, a.nbytes, a.algo, a.channels)
        plan = self._step_plans.get(key)
        if plan is not None:
            return plan
        steps = collectives.build(a.op, a.group, a.nbytes, self.topology, a.algo, channels=a.channels or None,
                                  fluid=self.fluid)
        shadows = self.program.shadows
        if self.fluid and a.algo == "ring" and shadows:
            # Drop hops between two shadows, unless they share a link with a kept hop
            # (then they are contention the simulated ranks must see).
            touching = [i for i, s in enumerate(steps) if s.src not in shadows or s.dst not in shadows]
            used = {l for i in touching for l in self.topology.route(steps[i].src, steps[i].dst)}
            keep = [i for i, s in enumerate(steps) if s.src not in shadows or s.dst not in shadows
                    or not used.isdisjoint(self.topology.route(s.src, s.dst))]
            index = {old: new for new, old in enumerate(keep)}
            steps = [collectives.Transfer(s.src, s.dst, s.nbytes, tuple(index[d] for d in s.deps), s.label,
                                          s.latency_steps) for s in (steps[i] for i in keep)]
        children: list[list[int]] = [[] for _ in steps]
        involved: dict[int, int] = {}
        for i, st in enumerate(steps):
            for d in st.deps:
                children[d].append(i)
            for r in {st.src, st.dst}:
                if r not in shadows:
                    involved[r] = involved.get(r, 0) + 1
        plan = (steps, children, [len(st.deps) for st in steps], involved)
        self._step_plans[key] = plan
        return plan

    def _run_steps(self, plan, rv: _Rendezvous, label: str) -> None:
        """Start each step when its dependencies are done; finish each rank's action
        when its own steps (as sender or receiver) are all done."""
        steps, children, waiting0, involved = plan
        waiting = list(waiting0)
        action_of = rv.posted
        left = {r: involved.get(r, 0) for r in action_of}
        net = self.net
        began = rv.began

        def finished(i):
            s = steps[i]
            for r in (s.src, s.dst) if s.src != s.dst else (s.src,):
                if r in left:
                    left[r] -= 1
                    if left[r] == 0:
                        self._finish(action_of[r], began, None)
            for c in children[i]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    start(c)

        def start(i):
            s = steps[i]
            net.transfer(s.src, s.dst, s.nbytes, f"{label} {s.label}", s.latency_steps).callbacks.append(
                lambda _e: finished(i))

        for r in sorted(left):
            if left[r] == 0:
                self._finish(action_of[r], began, None)
        for i in range(len(steps)):
            if waiting[i] == 0:
                start(i)

    # ------------------------------------------------------------------ deadlock
    def _explain(self, unfinished: list[int]) -> dict[int, str]:
        out: dict[int, list[str]] = {}
        resolve = self.program.resolve
        for sid in unfinished:
            rank, stream = self._streams[sid]
            i = self._members[sid][self._pos[sid]]
            a = self._acts[i]
            if self._pending[i] > 0:
                pending = [f"{r}:{n}" for r, n in (resolve(rank, d) for d in a.deps)
                           if not self._finished[self._ids[(r, n)]]]
                why = f"waits for {', '.join(pending)}"
            elif a.kind == "collective":
                key = self._keys[(rank, a.name)]
                rv = self._coll.get(key)
                missing = [g for g in a.group if (rv is None or g not in rv.posted) and g not in self.program.shadows]
                why = f"{a.op} over ranks {list(a.group)} waits for ranks {missing} to join"
            elif a.kind == "send":
                why = f"waits for rank {a.peer} to post the matching recv"
            elif a.kind == "recv":
                why = f"waits for rank {a.peer} to post the matching send"
            else:
                why = "did not finish"
            out.setdefault(rank, []).append(f"{a.kind} {a.name!r} on stream {stream} {why}")
        return {r: " | ".join(v) for r, v in sorted(out.items())}
