"""The discrete-event engine: runs a Program on a topology and returns a Trace.

Each (rank, stream) pair runs its actions in order, one at a time: an action starts
when its stream is free and every action it depends on has finished, holds the stream
for as long as it takes, and records a span. Streams are dependency counters driven by
SimPy callbacks, not one SimPy process each: a compute action is one timed call that
finishes it (the duration it carries; costs are computed outside, from a hardware
profile; ``sim.engine.kernel.Calls``); sends, receives, copies and collectives take as
long as the flow-level network model (``sim.engine.network``) needs for their transfers.
The event loop, and everything else that depends on how SimPy works inside, is in
``sim.engine.kernel``.

The engine does not know which schedule produced a program, nor any hardware figure.

Deadlock: SimPy stops when no event is left. If some action has not finished by then,
nothing can ever finish it (a receive with no matching send, a collective that a member
never joins, a cycle of dependencies), and ``DeadlockError`` names every blocked rank,
the action it is stuck on and what that action waits for. A simulation never hangs.
"""

from __future__ import annotations

import time
from collections import deque
from functools import partial
from itertools import chain, compress, count, islice
from operator import attrgetter, eq

from sim.program.actions import Action, Program
from sim.engine import invariants
from sim.engine.collectives import Collectives
from sim.engine.deadlock import explain_deadlock
from sim.engine.gpu_speed import slow_down
from sim.engine.kernel import Calls, CheckingEnvironment, Environment
from sim.engine.network import Network
from sim.engine.slowdown import Slowdown
from sim.engine.program_index import consume, index_program
from sim.errors import DeadlockError, InputError
from sim.gc_tuning import simulation_pause
from sim.inputs.topology import Topology
from sim.results.trace import MemoryLog, Span, Trace

_tuple_new = tuple.__new__  # a Span without the named tuple's Python-level __new__
_SPAN_ORDER = attrgetter("rank", "stream", "start_s", "end_s", "name")  # the trace's order


def simulate(program: Program, topology: Topology, *, link_efficiency: dict[str, float] | None = None,
             fluid_collectives: bool = False, check_invariants: bool | None = None,
             overlap_slowdown: float = 0.0, nccl=None, gpu_slowdown: dict[int, float] | None = None) -> Trace:
    """Run ``program`` on ``topology`` and return its ``Trace``.

    ``link_efficiency`` scales each link kind's bandwidth (e.g. ``{"ib": 0.96}``).
    ``fluid_collectives`` prices each ring hop as one transfer (``sim.engine.algorithms``).
    ``overlap_slowdown`` σ: compute on a rank runs at 1/(1 + σ) while one of its sends,
    receives or collectives moves data (``sim.engine.slowdown``; those whose claim holds SMs,
    ``Action.slows_compute``; a send/recv pair's is its send's). ``nccl``: protocols and NVLS (``sim.engine.nccl``).
    ``gpu_slowdown``: rank -> factor, each slow GPU's compute taking that many times as long
    (``sim.engine.gpu_speed``). ``check_invariants`` checks ``sim.engine.invariants`` during and after the run (default:
    debug mode, the environment variable ``TRAINSIM_DEBUG``). Python's garbage collector is left as it
    is found, unless the process opted into ``sim.gc_tuning`` (the ``trainsim`` command does).
    """
    if check_invariants is None:
        check_invariants = invariants.enabled()
    with simulation_pause():
        if not 0.0 <= overlap_slowdown < float("inf"):
            raise InputError(f"overlap_slowdown: got {overlap_slowdown!r}; expected a number >= 0")
        for r, f in (gpu_slowdown or {}).items():
            if not 0 < f < float("inf"):
                raise InputError(f"gpu_slowdown: rank {r}: got {f!r}; expected a factor > 0")
        engine = _Engine(program, topology, link_efficiency, fluid_collectives, check_invariants, overlap_slowdown,
                         nccl, gpu_slowdown)
        try:
            return engine.run()
        finally:
            engine.release()


class _Engine:
    """Streams as dependency counters driven by SimPy callbacks.

    Each action gets an index (``sim.engine.program_index``); ``pending[i]`` counts its
    unfinished dependencies, the action before it on its stream included, and
    ``dependents[i]`` lists the actions waiting for it. An action starts when its count
    reaches zero. A compute action is one call to finish it, due when its time is up
    (``sim.engine.kernel.Calls``: one SimPy event each, though calls due at one instant
    mostly share a queue entry; the members of a grouped comm, which start together, share
    one call when they take the same time); sends, receives, copies and collectives finish from the
    network's calls and events. Finishing an action
    releases the next one on its stream, then its dependents; actions that become ready
    at the same instant start in the order they became ready (a queue, not recursion), so
    a simulation is deterministic and never deep in the Python stack.
    """

    def __init__(self, program: Program, topology: Topology, link_efficiency, fluid: bool = False,
                 check: bool = False, overlap_slowdown: float = 0.0, nccl=None, gpu_slowdown=None):
        top = program.max_rank()
        if top >= topology.num_gpus:
            raise InputError(
                f"program: uses rank {top}, but topology {topology.name} has {topology.num_gpus} GPUs (ranks 0..{topology.num_gpus - 1})"
            )
        program.check()
        self.program = program
        self.topology = topology
        self.fluid, self.nccl = fluid, nccl
        self.check = check
        self.env = CheckingEnvironment(0.0) if check else Environment(0.0)  # float time from the start
        self.calls = Calls(self.env)
        self.net = Network(self.env, topology, link_efficiency, check=check, calls=self.calls)
        self.spans: list[Span] = []
        self.memory: list = []  # (time, rank, changes) of each start or end that changes memory, flat (MemoryLog)
        t0 = time.perf_counter()
        ix = index_program(program)
        if gpu_slowdown:
            slow_down(ix.dur, ix.slowable, ix.rank_of, gpu_slowdown)
        self._acts, self._shown, self._rank_of = ix.acts, ix.shown, ix.rank_of
        self._streams, self._members, self._ids = ix.streams, ix.members, ix.ids
        self._pending, self._dependents, self._nxt = ix.pending, ix.dependents, ix.nxt
        self._key_of, self._needed, self._barrier_of = ix.key_of, ix.needed, ix.barrier_of
        self._partner, self._p2p, self._pairs = ix.partner, ix.p2p, ix.pairs
        self._sends, self._quiet, self._collectives, self._slowable = ix.sends, ix.quiet, ix.collectives, ix.slowable
        self._dur, self._mem_start, self._mem_end = ix.dur, ix.mem_start, ix.mem_end
        n = len(ix.acts)
        self._start = [0.0] * n
        self._end = [-1.0] * n  # -1 until the action finishes
        self._busy_start: list[float | None] = [None] * n  # when data started to move, if not at start
        self._link_of: list[int | None] = [None] * n
        self._ready: deque[int] = deque()
        self._arrived = bytearray(n)  # a send or recv that waits for its partner
        self._pair_link: list[int] = [0] * n
        self._overlap_slowdown = overlap_slowdown
        self._build_core()
        self._index_s = time.perf_counter() - t0

    # ------------------------------------------------------------------ run
    def run(self) -> Trace:
        env = self.env
        t0 = time.perf_counter()
        self._prepare()
        t1 = time.perf_counter()
        self._start_ready()
        env.run()
        unfinished = [sid for sid, mine in enumerate(self._members) if mine and self._end[mine[-1]] < 0]
        if unfinished:
            raise DeadlockError(explain_deadlock(self, unfinished), env.now)
        t2 = time.perf_counter()
        self._drop_loop_state()
        self.spans = self._spans()
        if not self._spans_in_order():
            self.spans.sort(key=_SPAN_ORDER)
        carried = self.net.link_bytes()
        link_bytes = {self.net.link_names[i]: b for i, b in carried.items()}
        kinds = {self.net.link_names[i]: self.net.link_kinds[i] for i in carried}
        ranks = {r: {"node": self.topology.node_of(r), "device": self.topology.gpu(r)} for r in self.program.ranks}
        trace = Trace(self.spans, list(self.net.records), link_bytes, kinds, ranks, self.topology.name,
                      MemoryLog(self.memory))
        trace.known_end_s(max(self._end, default=0.0))  # (every span's end is its action's: the same latest one)
        trace.stats = {"events": env.events_processed, "queue_entries": self.calls.entries + self.net.events_triggered,
                       "actions": len(self.program),
                       "transfers": len(trace.transfers), "simulated_gpus": len(self.program.actions),
                       "engine_setup_s": self._index_s + t1 - t0, "engine_loop_s": t2 - t1,
                       "engine_wall_s": time.perf_counter() - t1}
        if self.check:
            if self.net.active:
                invariants.violation(f"{self.net.active} network flows never finished")
            invariants.check(self.program, trace, self.net)
        return trace

    _RUN_STATE = tuple(f"_{n}" for n in "acts shown rank_of streams members pending dependents nxt key_of needed barrier_of "
                       "partner p2p dur mem_start mem_end start end busy_start link_of arrived pair_link sends quiet "
                       "collectives slowable ready".split())

    _TRACE_STATE = ("_shown", "_rank_of", "_partner", "_streams", "_members", "_start", "_end", "_busy_start",
                    "_link_of")
    """What ``_spans`` reads of the run state."""

    def _drop_loop_state(self) -> None:
        """Empty what only the event loop read (counts, dependents, durations, pairs, the
        compute slowdown's state) once it has ended without a deadlock, before the spans
        are made: their memory then serves the spans instead of adding to the peak."""
        keep = self._TRACE_STATE
        for name in self._RUN_STATE:
            value = self.__dict__.get(name)
            if name not in keep and isinstance(value, (list, dict, set, bytearray, deque)):
                value.clear()
        if self.__dict__.get("_slow") is not None:
            self._slow.release()
            self._slow = None

    def release(self) -> None:
        """Let go of the run's state once its trace is made. The event loop's closures and
        the network's and collectives' callbacks refer to one another, and ``sim.gc_tuning``
        freezes what is alive when the run ends, so the cyclic collector would never free
        that state: emptied here (the index's arrays are the engine's own), each run leaves
        a few small objects behind, not its millions of entries."""
        for value in map(self.__dict__.get, self._RUN_STATE):
            if isinstance(value, (list, dict, set, bytearray, deque)):
                value.clear()
        for fn in self.__dict__.get("_closures", ()):
            for cell in getattr(fn, "__closure__", None) or ():  # the hot path's closures name each other
                cell.cell_contents = None
        if self.__dict__.get("_slow") is not None:
            self._slow.release()
        for part in filter(None, map(self.__dict__.get, ("net", "_coll"))):
            part.__dict__.clear()
        self.__dict__.clear()

    def _prepare(self) -> None:
        """Set-up before the clock starts: the route of every point-to-point pair and the
        steps of every distinct collective (routing is the costly part); then the network
        is sealed (``Network.seal``). Each matched pair's entry in ``p2p`` is made here, with
        its route, so the run need not look it up (``sim.engine.program_index``: ``pairs``)."""
        acts, plan = self._acts, self._coll.plan_steps
        planned: set[int] = set()  # (ids: the members of a collective share its action, planned once)
        for i in self._collectives:
            a = acts[i]
            if id(a) not in planned:
                planned.add(id(a))
                plan(a)
        p2p, route, rank_of = self._p2p, self.net.route, self._rank_of
        sends, recvs, nbytes, labels = self._pairs
        srcs = list(map(rank_of.__getitem__, sends))  # (rank_of's int objects, not one more per pair)
        dsts = list(map(rank_of.__getitem__, recvs))
        pairs = list(zip(srcs, dsts))
        made = dict.fromkeys(pairs)  # each (source, destination) once, in the sends' index order
        for pair in made:  # (routes made in the order they come, as one by one)
            made[pair] = route(*pair)
        entries = list(zip(sends, recvs, srcs, dsts, nbytes, labels, map(made.__getitem__, pairs)))
        del pairs, made
        consume(map(p2p.__setitem__, sends, entries))  # (set in C: no Python step per pair)
        consume(map(p2p.__setitem__, recvs, entries))
        self._pairs = None  # (made: its lists are not kept through the run)
        self.net.seal()  # (every route is made: bundles may fold the links only they cross)

    def _spans_in_order(self) -> bool:
        """Whether the spans, built stream by stream, are already in the trace's order
        (rank, stream, start, end, name). Within a stream the actions ran one after the
        other, so starts never decrease; only streams listed out of (rank, name) order or
        actions that start at the same instant (ones that take no time) can be out of
        order, and only those are compared."""
        if self._streams != sorted(self._streams):
            return False
        spans = self.spans
        starts = list(map(self._start.__getitem__, chain.from_iterable(self._members)))  # (each span's start_s)
        ties = compress(count(), map(eq, starts, islice(starts, 1, None)))  # k where spans k, k+1 start together
        return all(spans[k].stream != spans[k + 1].stream or spans[k].rank != spans[k + 1].rank
                   or _SPAN_ORDER(spans[k]) <= _SPAN_ORDER(spans[k + 1]) for k in ties)

    def _spans(self) -> list[Span]:
        """The trace's spans, from what the run recorded per action, stream by stream.
        Made in index order (the run's lists read front to back, not a stream's actions
        a rank's worth apart: about a third less time at 1,024 GPUs), then put in stream
        order (each stream's actions are its ``members``; a stream is its actions'
        ``stream``). What a span shows of its action is read from ``shown`` (the index's:
        one action per position of like ranks, a few thousand objects), not from each
        rank's own, and a send's or recv's peer is its partner's rank (every one met its
        partner: the run ended without a deadlock)."""
        rank_of = self._rank_of
        made = [_tuple_new(Span, (r, a.stream, a.name, a.kind, a.category or (a.op or a.kind), s, e, a.nbytes,
                                  a.flops, a.peer if p < 0 else rank_of[p], a.op, link, s if b is None else b, a.layer))
                for r, a, s, e, b, link, p in zip(rank_of, self._shown, self._start, self._end, self._busy_start,
                                                  self._link_of, self._partner)]
        return list(map(made.__getitem__, chain.from_iterable(self._members)))

    def _build_core(self) -> None:
        """The hot path, as closures over local lists (cheaper than attribute lookups):
        ``_finish(i, busy_start, link_id)`` ends action ``i`` now and starts what that
        makes ready; ``_start_ready()`` starts the actions that wait for nothing."""
        env = self.env
        at = self.calls.at
        acts, rank_of = self._acts, self._rank_of
        members, pending, dependents, nxt = self._members, self._pending, self._dependents, self._nxt
        start, end = self._start, self._end
        busy_start, link_of = self._busy_start, self._link_of
        barrier_of = self._barrier_of
        record = self.memory.extend  # (a memory change: its time, rank and changes; MemoryLog)
        dur, mem_start, mem_end = self._dur, self._mem_start, self._mem_end
        ready = self._ready
        popleft = ready.popleft
        copy = self._copy
        p2p, arrived, partner, pair_link = self._p2p, self._arrived, self._partner, self._pair_link
        link_ids = count(1)  # a transfer's id, drawn when the first of its pair arrives
        draining = False

        def finish(i, bstart=None, lid=None):
            """End action ``i`` now (``i`` < 0: none) and start what that makes ready, in
            the order it became ready: each one's start inline, here (a call per action
            costs), unless a start further up the stack is already doing it."""
            nonlocal draining
            now = env.now
            if i >= 0:
                end[i] = now
                m = mem_end[i]
                if m is not None:
                    record((now, rank_of[i], m))
                if bstart is not None:
                    busy_start[i] = bstart
                    link_of[i] = lid
                j = nxt[i]
                if j >= 0:
                    pending[j] -= 1
                    if not pending[j]:
                        ready.append(j)
                deps = dependents[i]
                if deps:
                    for j in deps:
                        pending[j] -= 1
                        if not pending[j]:
                            ready.append(j)
            if ready and not draining:  # (nothing made ready: nothing to start)
                draining = True
                try:
                    while ready:
                        i = popleft()
                        b = barrier_of[i]
                        if b is not None:  # ready; the group starts when its last member is
                            b[0] -= 1
                            b[1].append(i)
                            if not b[0]:  # released: the members start next, in the order they came
                                group = b[1]
                                d = dur[group[0]]
                                if d and d > 0 and one_timer_ends(group, d):  # (one timer ends them all)
                                    for j in group:
                                        barrier_of[j] = None
                                        start[j] = now
                                        m = mem_start[j]
                                        if m is not None:
                                            record((now, rank_of[j], m))
                                    at(now + d, finish_all, group)
                                else:
                                    for j in group:
                                        barrier_of[j] = None
                                    ready.extendleft(reversed(group))
                            continue
                        start[i] = now
                        m = mem_start[i]
                        if m is not None:
                            record((now, rank_of[i], m))
                        d = dur[i]
                        if d is not None:  # compute or comm
                            if d > 0:
                                if slowable is None or not slowable[i]:
                                    at(now + d, finish, i)
                                else:
                                    slow_start(i, d, now)
                            else:
                                finish(i)
                            continue
                        p = p2p[i]
                        if p is not None:
                            if arrived[partner[i]]:  # the second of a send/recv pair: the transfer starts
                                join_p2p(i, p)
                            else:  # the first waits for its partner
                                arrived[i] = 1
                                pair_link[i] = next(link_ids)
                            continue
                        a = acts[i]
                        kind = a.kind
                        if kind == "collective":
                            join_collective(rank_of[i], a, i)
                        elif kind == "copy":
                            copy(i, a, now)
                        else:  # a send or recv with no partner: waits for ever (a deadlock)
                            arrived[i] = 1
                finally:
                    draining = False

        def finish_all(group):
            """End a released barrier's members, in the order they came: what each one's own
            timer would have done, those timers' ids being consecutive and their time one."""
            for j in group:
                finish(j)

        def one_timer_ends(group, d):
            """Whether every member of a released barrier takes ``d`` and runs on a plain
            timer (none of them slowed by concurrent NCCL kernels)."""
            for j in group:
                if dur[j] != d or (slowable is not None and slowable[j]):
                    return False
            return True

        def start_ready():
            ready.extend(mine[0] for mine in members if mine and not pending[mine[0]])
            finish(-1)

        slowable = slow_start = began = None
        nccl_finish = finish  # (sends', receives' and collectives' ends, which count NCCL kernels)
        self._closures, self._slow = (finish, start_ready), None  # (what release() unties)
        if self._overlap_slowdown > 0:
            self._slow = Slowdown(self._slowable, self._rank_of, self.env, finish, at, self._overlap_slowdown)
            slowable, slow_start, nccl_finish, began = (self._slow.slowable, self._slow.start,
                                                        self._slow.nccl_finish, self._slow.nccl_started)
            join_p2p = self._slow.p2p_join(self.net.start, self._partner, self._pair_link)
            quiet = self._quiet
            if quiet:  # (sends that leave the SMs to compute, ``Action.slows_compute``: not counted)
                counted, plain = join_p2p, self._p2p_join(finish)

                def join_p2p(i: int, pair: tuple) -> None:
                    (plain if pair[0] in quiet else counted)(i, pair)
        else:
            join_p2p = self._p2p_join(finish)
        self._coll = Collectives(self.net, self.program.shadows, self.fluid, self._key_of, self._needed, nccl_finish,
                                 self.nccl)
        self._coll.on_begin, self._coll.plain_finish = began, finish
        join_collective = self._coll.join
        self._finish, self._start_ready = finish, start_ready

    def _copy(self, i: int, a: Action, now: float) -> None:
        self.net.transfer_host(self._rank_of[i], a.nbytes, a.op == "d2h",
                               f"{a.category or 'copy'} {a.name}").callbacks.append(partial(self._copied, i, now))

    def _copied(self, i: int, began: float, _event) -> None:
        self._finish(i, began, None)

    def _p2p_join(self, finish):
        """``join_p2p(i, pair)`` for the hot path, when the second of a send/recv pair
        arrives (the first waits: ``drain``), ``pair`` being ``p2p[i]`` (see
        ``sim.engine.program_index``; ``_prepare`` adds the route): starts the transfer, whose
        arrival finishes both."""
        partner, pair_link = self._partner, self._pair_link
        env, start = self.env, self.net.start

        def delivered(pair):
            si, ri, began, lid = pair
            finish(si, began, lid)
            finish(ri, began, lid)

        def join_p2p(i: int, pair: tuple) -> None:
            si, ri, src, dst, nbytes, label, route = pair
            start(route, src, dst, nbytes, label, 1, delivered, (si, ri, env.now, pair_link[partner[i]]))

        return join_p2p
