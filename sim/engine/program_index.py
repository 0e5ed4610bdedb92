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

from itertools import islice

from sim.program.actions import Program
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


class _Ids:
    """(rank, name) -> action index, read through each rank's own name -> position table
    (small tables, and no million-entry dict of tuples to build)."""

    __slots__ = ("pos_of", "local_of")

    def __init__(self, pos_of: dict, local_of: dict):
        self.pos_of, self.local_of = pos_of, local_of

    def __getitem__(self, ref: tuple[int, str]) -> int:
        r, name = ref
        return self.local_of[r][self.pos_of[r][name]]

    def __contains__(self, ref) -> bool:
        return ref[0] in self.pos_of and ref[1] in self.pos_of[ref[0]]


def _index(ix: ProgramIndex, program: Program) -> None:
    """Indices go round the streams: the first action of every stream, then the second,
    and so on. Actions that run at about the same time on different ranks then sit side
    by side in the engine's arrays, so the run, which moves across ranks at each
    instant, reads memory close to what it just read rather than a rank's worth away.
    The actions are read stream by stream (the order they were made in, and so the cheap
    one), and lists are built in that order too (``dependents[j]``, for one, lists its
    actions stream by stream)."""
    streams: list[tuple[int, str]] = []
    slots: list[list[int]] = []  # per stream: the positions of its actions in the rank's list
    lists: list = []  # per stream: its rank's list
    pos_of: dict[int, dict[str, int]] = {}  # per rank: name -> position in its list
    local_of: dict[int, list[int]] = {}  # per rank: position -> index
    for r, lst in program.actions.items():
        by: dict[str, list[int]] = {}
        for k, name in enumerate([a.stream for a in lst]):
            got = by.get(name)
            if got is None:
                by[name] = [k]
            else:
                got.append(k)
        for name in sorted(by):
            streams.append((r, name))
            slots.append(by[name])
            lists.append(lst)
        pos_of[r] = {a.name: k for k, a in enumerate(lst)}
        local_of[r] = [0] * len(lst)
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
    pending = [0] * n
    nxt = [-1] * n
    dur: list[float | None] = [None] * n
    mem_start: list[tuple | None] = [None] * n
    mem_end: list[tuple | None] = [None] * n
    same_dur: dict = {}  # one object per distinct duration, and per distinct memory change
    same_mem: dict = {}
    for sid, (r, _) in enumerate(streams):
        lst, mine, local = lists[sid], members[sid], local_of[r]
        for i, k in zip(mine, slots[sid]):
            a = acts[i] = lst[k]
            rank_of[i] = r
            local[k] = i
            kind = a.kind
            if kind == "compute" or kind == "comm":
                d = a.duration_s
                dur[i] = same_dur.setdefault(d, d)
            if a.mem:
                for when, table in (("start", mem_start), ("end", mem_end)):
                    m = tuple((category, float(nbytes)) for w, category, nbytes in a.mem if w == when)
                    if m:
                        table[i] = same_mem.setdefault(m, m)
        for prev, i in zip(mine, islice(mine, 1, None)):
            nxt[prev] = i
            pending[i] = 1
    order: list[int] = []  # indices in program order, rank by rank
    for local in local_of.values():
        order += local
    dependents: list = [None] * n
    for sid, (r, _) in enumerate(streams):
        lst, pos, local = lists[sid], pos_of[r], local_of[r]
        for i, k in zip(members[sid], slots[sid]):
            deps = lst[k].deps
            if deps:
                for d in deps:
                    j = local[pos[d]] if d.__class__ is str else local_of[d[0]][pos_of[d[0]][d[1]]]
                    pending[i] += 1
                    got = dependents[j]
                    if got is None:
                        dependents[j] = [i]
                    else:
                        got.append(i)
    dependents = [d if d is None else tuple(d) for d in dependents]  # (made in index order: see the module doc)
    ix.acts, ix.rank_of, ix.streams, ix.members = acts, rank_of, streams, members
    if max(pending, default=0) < 256:  # the usual case: a byte each is quicker to count down
        pending = bytearray(pending)
    ix.ids, ix.order, ix.pending, ix.dependents, ix.nxt = _Ids(pos_of, local_of), order, pending, dependents, nxt
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
    sorted_group: dict[tuple, tuple] = {}
    grouped: dict[tuple, None] = {}  # the groups of collective and comm actions, in program order
    for i in ix.order:  # program order: "the n-th send" counts across the rank's streams
        a = acts[i]
        kind = a.kind
        if kind == "compute":
            continue
        if kind == "send" or kind == "recv":
            r = rank_of[i]
            seq = (r, a.peer, a.tag, kind) if kind == "send" else (a.peer, r, a.tag, kind)
            k = p2p_seq.get(seq, 0)
            p2p_seq[seq] = k + 1
            key = (seq[0], seq[1], seq[2], k)  # (source, destination, tag, count)
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
            grouped[a.group] = None
            r = rank_of[i]
            group = sorted_group.get(a.group)
            if group is None:
                group = sorted_group[a.group] = tuple(sorted(a.group))
            if a.tag:
                key = (group, "tag", a.tag)
            else:
                k = coll_seq.get((group, r), 0)
                coll_seq[(group, r)] = k + 1
                key = (group, "seq", k)
            key_of[i] = key
        elif kind == "comm":
            grouped[a.group] = None
    same: dict = {}  # one object per distinct size (of one type: 4 and 4.0 stay apart)
    for si, ri in enumerate(partner):  # each pair's entry, made at its send in index order (like dependents)
        if ri >= 0:
            send = acts[si]
            if send.kind == "send":
                b = send.nbytes
                p2p[si] = p2p[ri] = (si, ri, rank_of[si], rank_of[ri], same.setdefault((b.__class__, b), b),
                                     f"{send.category or 'p2p'} {send.name}")
    shadows = program.shadows
    needed = {g: sum(1 for x in g if x not in shadows) for g in grouped}
    barrier_of: list = [None] * n
    barriers: dict[tuple, list] = {}
    for i, a in enumerate(acts):  # (index order, for the same reason as dependents')
        if a.kind == "comm":
            g = a.group
            if len(g) > 1 and needed[g] > 1:
                group = sorted_group.get(g)
                if group is None:
                    group = sorted_group[g] = tuple(sorted(g))
                key = (group, a.name)
                b = barriers.get(key)
                if b is None:
                    b = barriers[key] = [needed[g], []]
                barrier_of[i] = b
    ix.key_of, ix.partner, ix.p2p, ix.needed, ix.barrier_of = key_of, partner, p2p, needed, barrier_of
