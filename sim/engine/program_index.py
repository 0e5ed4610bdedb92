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

from collections import deque
from functools import partial

import numpy as np

from sim.program.actions import Program
from sim.errors import InputError


consume = partial(deque, maxlen=0)
"""Runs an iterator to its end, keeping nothing (``map`` of a setter, at C speed)."""


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


class _Shape:
    """What the index needs of one rank's list, made once for every rank ``like`` it
    (``Program.like``): positions are a rank's own list's."""

    __slots__ = ("names", "slots", "pos", "dur", "mem_start", "mem_end", "nxt", "pending", "dep_src", "dep_dst",
                 "cross")

    def __init__(self, lst):
        by: dict[str, list[int]] = {}
        for k, name in enumerate([a.stream for a in lst]):
            got = by.get(name)
            if got is None:
                by[name] = [k]
            else:
                got.append(k)
        self.names = sorted(by)
        self.slots = [by[name] for name in self.names]
        self.pos = pos = {a.name: k for k, a in enumerate(lst)}
        n = len(lst)
        nxt = np.full(n, -1, dtype=np.int64)
        pending = np.zeros(n, dtype=np.int64)
        for ks in self.slots:
            nxt[ks[:-1]] = ks[1:]
            pending[ks[1:]] = 1
        dur: list = [None] * n
        mem_start: list = [None] * n
        mem_end: list = [None] * n
        src, dst, cross = [], [], []
        for k, a in enumerate(lst):
            kind = a.kind
            if kind == "compute" or kind == "comm":
                dur[k] = a.duration_s
            if a.mem:
                for when, table in (("start", mem_start), ("end", mem_end)):
                    m = tuple((category, float(nbytes)) for w, category, nbytes in a.mem if w == when)
                    if m:
                        table[k] = m
            if a.deps:
                pending[k] += len(a.deps)
                if any(d.__class__ is not str for d in a.deps):
                    cross.append(k)  # (read from each rank's own action: its ranks differ)
                    continue
                for d in a.deps:
                    src.append(pos[d])
                    dst.append(k)
        self.dur, self.mem_start, self.mem_end = dur, mem_start, mem_end
        self.nxt, self.pending = nxt, pending
        self.dep_src, self.dep_dst = np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)
        self.cross = cross


def _index(ix: ProgramIndex, program: Program) -> None:
    """Indices go round the ranks: the first action of every rank, then the second, and
    so on. Actions that run at about the same time on different ranks then sit side by
    side in the engine's arrays, so the run, which moves across ranks at each instant,
    reads memory close to what it just read rather than a rank's worth away. Ranks
    ``like`` another (``Program.like``) share its shape (``_Shape``), and the arrays are
    filled for all of them at once (numpy), then handed to the run as lists."""
    actions = program.actions
    ranks = list(actions)
    row_of = {r: q for q, r in enumerate(ranks)}
    lengths = np.array([len(actions[r]) for r in ranks], dtype=np.int64)
    width = int(lengths.max(initial=0))
    n = int(lengths.sum())
    # idx[q, k]: the index of position k of ranks[q] (counted column by column)
    live = (np.arange(width)[:, None] < lengths[None, :]).ravel()
    idx = (np.cumsum(live) - 1).reshape(width, len(ranks)).T
    del live
    like = program.like
    classes: dict[int, list[int]] = {}
    for r in ranks:
        t = like.get(r, r)
        if t not in actions or len(actions[t]) != len(actions[r]):
            t = r
        classes.setdefault(t, []).append(r)
    acts: list = [None] * n
    dur_a = np.empty(n, dtype=object)
    mem_start_a = np.empty(n, dtype=object)
    mem_end_a = np.empty(n, dtype=object)
    nxt_a = np.empty(n, dtype=np.int64)
    pending_a = np.empty(n, dtype=np.int64)
    rank_a = np.empty(n, dtype=np.int64)
    srcs, dsts = [], []
    streams: list[tuple[int, str]] = []
    members: list[list[int]] = []
    pos_of: dict[int, dict[str, int]] = {}
    local_of: dict[int, list[int]] = {}
    stream_of: dict[int, list] = {}
    same_dur: dict = {}  # one object per distinct duration, and per distinct memory change
    same_mem: dict = {}
    for t, rs in classes.items():
        lst = actions[t]
        shape = _Shape(lst)
        m = len(lst)
        rows = np.array([row_of[r] for r in rs], dtype=np.int64)
        at = idx[rows, :m]  # (ranks of the class) x positions
        dur_a[at] = _objects([None if d is None else same_dur.setdefault(d, d) for d in shape.dur])
        mem_start_a[at] = _objects([None if x is None else same_mem.setdefault(x, x) for x in shape.mem_start])
        mem_end_a[at] = _objects([None if x is None else same_mem.setdefault(x, x) for x in shape.mem_end])
        nxt_a[at] = np.where(shape.nxt >= 0, at[:, np.maximum(shape.nxt, 0)], -1)
        pending_a[at] = shape.pending
        rank_a[at] = np.array(rs, dtype=np.int64)[:, None]
        if len(shape.dep_src):
            srcs.append(at[:, shape.dep_src].ravel())
            dsts.append(at[:, shape.dep_dst].ravel())
        for r, row in zip(rs, at.tolist()):
            consume(map(acts.__setitem__, row, actions[r]))
            pos_of[r] = shape.pos
            local_of[r] = row
            stream_of[r] = [(name, [row[k] for k in ks]) for name, ks in zip(shape.names, shape.slots)]
        if shape.cross:
            cross_src, cross_dst = [], []
            for r in rs:
                lst_r, row = actions[r], local_of[r]
                for k in shape.cross:
                    for d in lst_r[k].deps:
                        j = row[pos_of[r][d]] if d.__class__ is str else None
                        if j is None:
                            dr, dn = d
                            j = ("x", dr, dn)
                        cross_src.append(j)
                        cross_dst.append(row[k])
            srcs.append(cross_src)  # (resolved below, once every rank's table exists)
            dsts.append(cross_dst)
    for r in ranks:
        for name, mine in stream_of[r]:
            streams.append((r, name))
            members.append(mine)
    src_all: list[int] = []
    dst_all: list[int] = []
    for s_, d_ in zip(srcs, dsts):
        if isinstance(s_, list):
            s_ = np.array([j if j.__class__ is not tuple else local_of[j[1]][pos_of[j[1]][j[2]]] for j in s_],
                          dtype=np.int64)
            d_ = np.array(d_, dtype=np.int64)
        src_all.append(s_)
        dst_all.append(d_)
    dependents: list = [None] * n
    if src_all:
        src = np.concatenate(src_all)
        dst = np.concatenate(dst_all)
        # Each action's dependents in index order (as the run reads them; see the module doc),
        # made as tuples by zip for all sources with the same number of dependents at once.
        order = np.lexsort((dst, src))
        src, dst = src[order], dst[order]
        first = np.flatnonzero(np.concatenate(([True], src[1:] != src[:-1])))
        sizes = np.diff(np.append(first, len(src)))
        for size in np.unique(sizes).tolist():
            at = first[sizes == size]
            columns = [dst[at + c].tolist() for c in range(size)]
            consume(map(dependents.__setitem__, src[at].tolist(), zip(*columns)))
    ix.acts, ix.rank_of, ix.streams, ix.members = acts, rank_a.tolist(), streams, members
    pending = pending_a.tolist()
    if max(pending, default=0) < 256:  # the usual case: a byte each is quicker to count down
        pending = bytearray(pending)
    ix.ids, ix.pending, ix.dependents, ix.nxt = _Ids(pos_of, local_of), pending, dependents, nxt_a.tolist()
    ix.order = [i for r in ranks for i in local_of[r]]  # indices in program order, rank by rank
    ix.dur, ix.mem_start, ix.mem_end = dur_a.tolist(), mem_start_a.tolist(), mem_end_a.tolist()


def _objects(values: list) -> np.ndarray:
    """A one-dimensional numpy array of these Python objects (set one by one where some
    are tuples, which numpy would otherwise take for rows)."""
    out = np.empty(len(values), dtype=object)
    if any(v.__class__ is tuple for v in values):
        for k, v in enumerate(values):
            out[k] = v
    else:
        out[:] = values
    return out


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
