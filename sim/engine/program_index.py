"""A program as arrays, for the engine: every action gets an index, and what the run needs
to know before the clock starts is computed once here.

- ``acts``, ``rank_of``: each action and the rank it runs on; ``streams`` lists
  (rank, stream name); ``members[sid]`` the actions of a stream in order; ``ids`` maps
  (rank, name) to an index. Indices go round the streams (see ``_index``).
- ``pending[i]`` counts action i's dependencies, and one more for the action before it
  on its stream, if any: ``nxt[j]`` (or -1). It is a ``bytearray`` when every count fits
  in a byte. ``dependents[j]`` lists the actions that name j in their ``deps``.
- ``dur[i]``: the duration of a compute or comm action (None for the others);
  ``mem_start[i]``, ``mem_end[i]``: its memory changes, as (category, bytes) pairs, when
  it starts and when it ends (None if none), so that the run need not read the action.
  Equal values share one object (a training step has a few dozen distinct durations
  over a million actions), and ``dependents`` are tuples made in index order: what the
  run reads per action then sits together in memory instead of next to each action's
  other data, rank by rank, so the event loop waits less for memory.
- ``partner[i]``: the send or recv that action i meets (or -1). The n-th send from a to b
  with a given tag (or none) meets the n-th recv on b from a with that tag, counted in
  each rank's program order across its streams. ``p2p[i]``, shared by both of a matched
  pair: (send index, recv index, source rank, destination rank, bytes, transfer label),
  to which the engine adds the route; None for the others. A recv that names a size must
  name the send's.
- ``key_of[i]``: the meeting key of a collective (its sorted group and its tag, or its
  sequence number on that group).
- ``needed[group]``: the simulated members of a group (shadows arrive implicitly).
- ``barrier_of[i]``: for a ``comm`` action with a group of two or more simulated ranks,
  the barrier its members share, ``[members still to arrive, indices arrived]`` (state
  the run mutates: build a new index per run).
"""

from __future__ import annotations

from sim.program.actions import Action, Program
from sim.errors import InputError


class ProgramIndex:
    """What ``index_program`` returns (see the module doc)."""

    __slots__ = ("acts", "rank_of", "streams", "members", "ids", "order", "pending", "dependents",
                 "key_of", "partner", "p2p", "needed", "barrier_of",
                 "dur", "mem_start", "mem_end", "nxt")


def index_program(program: Program) -> ProgramIndex:
    ix = ProgramIndex()
    _index(ix, program)
    _match(ix, program)
    return ix


def _index(ix: ProgramIndex, program: Program) -> None:
    """Indices go round the streams: the first action of every stream, then the second,
    and so on. Actions that run at about the same time on different ranks then sit side
    by side in the engine's arrays, so the run, which moves across ranks at each
    instant, reads memory close to what it just read rather than a rank's worth away.
    The actions are read stream by stream (the order they were made in, and so the cheap
    one), and lists are built in that order too (``dependents[j]``, for one, lists its
    actions stream by stream)."""
    streams: list[tuple[int, str]] = []
    slots: list[list[tuple[int, Action]]] = []  # per stream: (position in the rank's list, action)
    for r, lst in program.actions.items():
        by: dict[str, list[tuple[int, Action]]] = {}
        for k, a in enumerate(lst):
            by.setdefault(a.stream, []).append((k, a))
        for name in sorted(by):
            streams.append((r, name))
            slots.append(by[name])
    members: list[list[int]] = [[] for _ in streams]
    live = list(range(len(streams)))
    n = depth = 0
    while live:
        for sid in live:
            members[sid].append(n)
            n += 1
        depth += 1
        live = [sid for sid in live if len(slots[sid]) > depth]
    acts: list = [None] * n
    rank_of = [0] * n
    ids: dict[tuple[int, str], int] = {}
    order: list[int] = []  # indices in program order, rank by rank
    pending = [0] * n
    nxt = [-1] * n
    dur: list[float | None] = [None] * n
    mem_start: list[tuple | None] = [None] * n
    mem_end: list[tuple | None] = [None] * n
    local: list[int] = []
    same_dur: dict = {}  # one object per distinct duration, and per distinct memory change
    same_mem: dict = {}
    for sid, (r, _) in enumerate(streams):
        if sid == 0 or streams[sid - 1][0] != r:
            order += local
            local = [0] * len(program.actions[r])
        prev = -1
        for (k, a), i in zip(slots[sid], members[sid]):
            acts[i] = a
            rank_of[i] = r
            ids[(r, a.name)] = i
            local[k] = i
            if prev >= 0:
                nxt[prev] = i
                pending[i] = 1
            prev = i
            kind = a.kind
            if kind == "compute" or kind == "comm":
                d = a.duration_s
                dur[i] = same_dur.setdefault(d, d)
            if a.mem:
                for when, table in (("start", mem_start), ("end", mem_end)):
                    m = tuple((category, float(nbytes)) for w, category, nbytes in a.mem if w == when)
                    if m:
                        table[i] = same_mem.setdefault(m, m)
    order += local
    dependents: list = [None] * n
    for sid, (r, _) in enumerate(streams):
        for (_, a), i in zip(slots[sid], members[sid]):
            if a.deps:
                for d in a.deps:
                    j = ids[(r, d) if d.__class__ is str else d]
                    pending[i] += 1
                    if dependents[j] is None:
                        dependents[j] = [i]
                    else:
                        dependents[j].append(i)
    dependents = [d if d is None else tuple(d) for d in dependents]  # (made in index order: see the module doc)
    ix.acts, ix.rank_of, ix.streams, ix.members = acts, rank_of, streams, members
    if max(pending, default=0) < 256:  # the usual case: a byte each is quicker to count down
        pending = bytearray(pending)
    ix.ids, ix.order, ix.pending, ix.dependents, ix.nxt = ids, order, pending, dependents, nxt
    ix.dur, ix.mem_start, ix.mem_end = dur, mem_start, mem_end


def _match(ix: ProgramIndex, program: Program) -> None:
    p2p_seq: dict[tuple, int] = {}
    coll_seq: dict[tuple, int] = {}
    acts, rank_of = ix.acts, ix.rank_of
    n = len(acts)
    key_of: list = [None] * n
    waiting: dict[tuple, int] = {}
    partner = [-1] * n
    p2p: list = [None] * n
    for i in ix.order:  # program order: "the n-th send" counts across the rank's streams
        a = acts[i]
        kind = a.kind
        if kind == "send" or kind == "recv":
            r = rank_of[i]
            pair = (r, a.peer, a.tag) if kind == "send" else (a.peer, r, a.tag)
            k = p2p_seq.get((pair, kind), 0)
            p2p_seq[(pair, kind)] = k + 1
            key = (pair, k)
            j = waiting.pop(key, None)
            if j is None:
                waiting[key] = i
            else:
                partner[i], partner[j] = j, i
                si, ri = (i, j) if kind == "send" else (j, i)
                send, recv = acts[si], acts[ri]
                if recv.nbytes and recv.nbytes != send.nbytes:
                    raise InputError(
                        f"program: recv {recv.name!r} on rank {rank_of[ri]} expects {recv.nbytes} bytes but the matching send {send.name!r} on rank {rank_of[si]} sends {send.nbytes}"
                    )
        elif kind == "collective":
            r = rank_of[i]
            group = tuple(sorted(a.group))
            if a.tag:
                key = (group, "tag", a.tag)
            else:
                k = coll_seq.get((group, r), 0)
                coll_seq[(group, r)] = k + 1
                key = (group, "seq", k)
            key_of[i] = key
    same: dict = {}  # one object per distinct size (of one type: 4 and 4.0 stay apart)
    for si in range(n):  # each pair's entry, made at its send in index order (like dependents)
        ri = partner[si]
        if ri >= 0 and acts[si].kind == "send":
            send = acts[si]
            b = send.nbytes
            p2p[si] = p2p[ri] = (si, ri, rank_of[si], rank_of[ri], same.setdefault((b.__class__, b), b),
                                 f"{send.category or 'p2p'} {send.name}")
    shadows = program.shadows
    needed = {g: sum(1 for x in g if x not in shadows)
              for g in {a.group for lst in program.actions.values() for a in lst if a.kind in ("collective", "comm")}}
    barrier_of: list = [None] * n
    barriers: dict[tuple, list] = {}
    for i in range(n):  # (index order, for the same reason as dependents')
        a = acts[i]
        if a.kind == "comm" and len(a.group) > 1 and needed[a.group] > 1:
            key = (tuple(sorted(a.group)), a.name)
            b = barriers.get(key)
            if b is None:
                b = barriers[key] = [needed[a.group], []]
            barrier_of[i] = b
    ix.key_of, ix.partner, ix.p2p, ix.needed, ix.barrier_of = key_of, partner, p2p, needed, barrier_of


