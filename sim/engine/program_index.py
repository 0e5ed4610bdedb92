"""A program as arrays, for the engine: every action gets an index, and what the run needs
to know before the clock starts is computed once here.

- ``acts``, ``rank_of``: each action and the rank it runs on; ``shown[i]``: an action with
  the fields of ``acts[i]`` that its span shows, but for a send's or recv's peer (its
  partner's rank), the same object for every rank ``like`` another at that position (its
  template's: ``Program.like``; the rank's own where another kind names a peer). The spans
  read these few thousand objects instead of millions (``sim.engine.core``); ``streams`` lists
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
  pair: (send index, recv index, source rank, destination rank, bytes, transfer label,
  route), made by the engine's set-up from ``pairs`` once it has the routes; None for the
  others (and for all of them until then). A recv that names a size must name the send's.
- ``slowable[i]``: 1 for a compute action on a GPU stream (any but ``cpu``), the actions
  that concurrent NCCL kernels slow (``sim.engine.slowdown``); a ``bytearray``.
- ``sends``: the sends that meet a recv, in index order, and ``pairs``, four lists in that
  order: those sends, the recvs they meet, their bytes and their transfer labels (what
  ``p2p`` is made from); ``quiet``: those of the sends that
  leave the SMs to the compute beside them (``Action.slows_compute`` false), a set read
  from each stage program's shape; ``collectives``: the indices of the collective
  actions, in index order.
- ``key_of[i]``: the meeting key of a collective (its sorted group and its tag, or its
  sequence number on that group).
- ``needed[group]``: the simulated members of a group (shadows arrive implicitly).
- ``barrier_of[i]``: for a ``comm`` action with a group of two or more simulated ranks,
  the barrier its members share, ``[members still to arrive, indices arrived]`` (state
  the run mutates: build a new index per run).

``nxt`` holds the int objects of ``members`` (made from them), and ``rank_of`` one object
per rank: numpy's ``tolist`` makes a new int per entry, 32 bytes each (about 75 MB per
list at 16,384 GPUs, 2.4 million actions). ``nxt`` is set class by class in numpy, from an
object array of the rows' ints: set entry by entry from each stream's members, a
stream's actions a rank's worth apart, it took about 0.35 s at 16,384 GPUs, most of it
waiting for memory. (An ``array`` of integers would be quicker still to make, but the
run would make an int at each read, and those, freed among the run's floats, left the
peak 30 MB higher at 1,024 GPUs.) (The other lists of indices still come from
``tolist``: mapping them onto one object per index reads memory at random, about 0.2 s
a list at 1,024 GPUs.)
"""

from __future__ import annotations

from collections import deque
from functools import partial
from itertools import chain

import numpy as np

from sim.program.actions import Program
from sim.errors import InputError


consume = partial(deque, maxlen=0)
"""Runs an iterator to its end, keeping nothing (``map`` of a setter, at C speed)."""


class ProgramIndex:
    """What ``index_program`` returns (see the module doc)."""

    __slots__ = ("acts", "shown", "rank_of", "streams", "members", "ids", "order", "pending", "dependents",
                 "key_of", "partner", "p2p", "pairs", "needed", "barrier_of",
                 "dur", "mem_start", "mem_end", "nxt", "shapes", "sends", "quiet", "collectives", "slowable")


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
                 "cross", "p2p", "coll", "comm", "slowable")

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
        self.slowable = np.array([a.kind == "compute" and a.stream != "cpu" for a in lst], dtype=np.uint8)
        mem_start: list = [None] * n
        mem_end: list = [None] * n
        src, dst, cross = [], [], []
        self.p2p, self.coll, self.comm = [], [], []
        for k, a in enumerate(lst):
            kind = a.kind
            if kind == "compute" or kind == "comm":
                dur[k] = a.duration_s
                if kind == "comm":
                    self.comm.append(k)
            elif kind == "send" or kind == "recv":
                self.p2p.append(k)
            elif kind == "collective":
                self.coll.append(k)
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
    acts_o = np.empty(n, dtype=object)
    shown_o = np.empty(n, dtype=object)
    rank_o = np.empty(n, dtype=object)
    dur_a = np.empty(n, dtype=object)
    mem_start_a = np.empty(n, dtype=object)
    mem_end_a = np.empty(n, dtype=object)
    pending_a = np.empty(n, dtype=np.int64)
    nxt_o = np.empty(n, dtype=object)  # (the rows' own int objects: see the module doc)
    slow_a = np.zeros(n, dtype=np.uint8)
    srcs, dsts = [], []
    streams: list[tuple[int, str]] = []
    members: list[list[int]] = []
    pos_of: dict[int, dict[str, int]] = {}
    local_of: dict[int, list[int]] = {}
    stream_of: dict[int, list] = {}
    same_dur: dict = {}  # one object per distinct duration, and per distinct memory change
    same_mem: dict = {}
    shapes = []
    for t, rs in classes.items():
        lst = actions[t]
        shape = _Shape(lst)
        m = len(lst)
        rows = np.array([row_of[r] for r in rs], dtype=np.int64)
        at = idx[rows, :m]  # (ranks of the class) x positions
        shapes.append((shape, rs, at))
        dur_a[at] = _objects([None if d is None else same_dur.setdefault(d, d) for d in shape.dur])
        mem_start_a[at] = _objects([None if x is None else same_mem.setdefault(x, x) for x in shape.mem_start])
        mem_end_a[at] = _objects([None if x is None else same_mem.setdefault(x, x) for x in shape.mem_end])
        pending_a[at] = shape.pending
        slow_a[at] = shape.slowable
        if len(shape.dep_src):
            srcs.append(at[:, shape.dep_src].ravel())
            dsts.append(at[:, shape.dep_dst].ravel())
        rows = at.tolist()
        # Each position's next on its stream (as the int objects of the rows: the members'),
        # each rank's actions and its rank (one int object per rank), set in C: set entry by
        # entry, a rank's list lands a rank's worth apart, and the time goes in waiting for memory.
        nxt_o[at] = np.where(shape.nxt >= 0, np.array(rows, dtype=object).reshape(at.shape)[:, shape.nxt], -1)
        block = np.fromiter(chain.from_iterable(map(actions.__getitem__, rs)), dtype=object,
                            count=len(rs) * m).reshape(at.shape)
        acts_o[at] = block
        shown_o[at] = np.fromiter(lst, dtype=object, count=m)  # (the template's, for every rank of the class)
        peered = [k for k, a in enumerate(lst) if a.peer is not None and a.kind != "send" and a.kind != "recv"]
        if peered:  # (each rank's own: peers differ between like ranks; a send's or recv's is its partner's rank)
            shown_o[at[:, peered]] = block[:, peered]
        del block
        rank_o[at] = np.array(rs, dtype=object)[:, None]
        for r, row in zip(rs, rows):
            pos_of[r] = shape.pos
            local_of[r] = row
            stream_of[r] = [(name, list(map(row.__getitem__, ks))) for name, ks in zip(shape.names, shape.slots)]
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
    # (the arrays are freed on return, together: freed here, before the lists below are made,
    # glibc would take those from its heap, not map them, and the run's end keep 45 MB more)
    nxt, acts, rank_of, shown = nxt_o.tolist(), acts_o.tolist(), rank_o.tolist(), shown_o.tolist()
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
    ix.acts, ix.shown, ix.rank_of, ix.streams, ix.members = acts, shown, rank_of, streams, members
    pending = pending_a.tolist()
    if max(pending, default=0) < 256:  # the usual case: a byte each is quicker to count down
        pending = bytearray(pending)
    ix.ids, ix.pending, ix.dependents = _Ids(pos_of, local_of), pending, dependents
    ix.nxt = nxt
    ix.shapes, ix.slowable = shapes, bytearray(slow_a.tobytes())
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
    acts = ix.acts
    n = len(acts)
    partner, p2p, ix.pairs, ix.quiet = _pair(ix, program)
    ix.sends = ix.pairs[0]
    key_of: list = [None] * n
    sorted_group: dict[tuple, tuple] = {}
    shadows = program.shadows
    needed: dict[tuple, int] = {}  # the groups of collective and comm actions, in order met: simulated members
    barrier_of: list = [None] * n
    barriers: dict[tuple, list] = {}
    colls: list[int] = []
    for shape, rs, at in ix.shapes:
        if not shape.coll and not shape.comm:
            continue
        coll_ks, comm_ks = shape.coll, shape.comm
        for r, row in zip(rs, at.tolist()):
            lst = program.actions[r]
            seq: dict[tuple, int] = {}  # this rank's collectives met so far on each group
            for k in coll_ks:  # in program order: "the n-th collective on a group"
                a = lst[k]
                g = a.group
                if g not in needed:
                    needed[g] = sum(1 for x in g if x not in shadows)
                group = sorted_group.get(g)
                if group is None:
                    group = sorted_group[g] = tuple(sorted(g))
                if a.tag:
                    key = (group, "tag", a.tag)
                else:
                    c = seq.get(group, 0)
                    seq[group] = c + 1
                    key = (group, "seq", c)
                i = row[k]
                key_of[i] = key
                colls.append(i)
            for k in comm_ks:  # a grouped comm's barrier, shared by its members (made as met: no second pass)
                a = lst[k]
                g = a.group
                need = needed.get(g)
                if need is None:
                    need = needed[g] = sum(1 for x in g if x not in shadows)
                if len(g) > 1 and need > 1:
                    group = sorted_group.get(g)
                    if group is None:
                        group = sorted_group[g] = tuple(sorted(g))
                    key = (group, a.name)
                    b = barriers.get(key)
                    if b is None:
                        b = barriers[key] = [need, []]
                    barrier_of[row[k]] = b
    ix.key_of, ix.partner, ix.p2p, ix.needed, ix.barrier_of = key_of, partner, p2p, needed, barrier_of
    ix.collectives = sorted(colls)
    ix.shapes = None


def _pair(ix: ProgramIndex, program: Program) -> tuple[list, list, tuple, set]:
    """``partner``, ``p2p`` (see the module doc: its entries are the engine's to make),
    ``pairs`` (the sends that met a recv, in index order, their recvs, bytes and labels),
    and the set of those sends that do not slow compute (``quiet``). The n-th send from a to b with a tag
    meets the n-th recv on b from a with that tag, counting in each rank's program
    order: every send and recv is numbered within its (source, destination, tag, kind)
    by sorting (numpy), and equal numbers meet."""
    n = len(ix.acts)
    partner = [-1] * n
    p2p: list = [None] * n
    tags: dict[str, int] = {}
    parts = []  # per class: (indices, ranks, peers, positions, kinds, tags, sizes, labels, quiet)
    for shape, rs, at in ix.shapes:
        if not shape.p2p:
            continue
        ks = shape.p2p
        tmpl = program.actions[rs[0]]
        kinds = np.array([tmpl[k].kind == "recv" for k in ks], dtype=np.int64)
        tag = np.array([tags.setdefault(tmpl[k].tag, len(tags)) for k in ks], dtype=np.int64)
        sizes = _column([tmpl[k].nbytes for k in ks])
        labels = _column([f"{tmpl[k].category or 'p2p'} {tmpl[k].name}" for k in ks])
        quiet = np.array([not tmpl[k].slows_compute for k in ks], dtype=bool)  # (a ``like`` rank's, the same)
        peers = [a.peer for r in rs for a in map(program.actions[r].__getitem__, ks)]
        parts.append((at[:, ks].ravel(), np.repeat(np.array(rs, dtype=np.int64), len(ks)),
                      np.array(peers, dtype=np.int64), np.tile(np.array(ks, dtype=np.int64), len(rs)),
                      np.tile(kinds, len(rs)), np.tile(tag, len(rs)), np.tile(sizes, len(rs)),
                      np.tile(labels, len(rs)), np.tile(quiet, len(rs))))
    if not parts:
        return partner, p2p, ([], [], [], []), set()
    idx, rank, peer, pos, recv, tag, size, label, quiet = (np.concatenate(c) for c in zip(*parts))
    src = np.where(recv == 1, peer, rank)
    dst = np.where(recv == 1, rank, peer)
    o = np.lexsort((pos, recv, tag, dst, src))  # by (source, destination, tag, kind), then program order
    new = np.ones(len(o), dtype=bool)
    new[1:] = (np.diff(src[o]) != 0) | (np.diff(dst[o]) != 0) | (np.diff(tag[o]) != 0) | (np.diff(recv[o]) != 0)
    starts = np.flatnonzero(new)
    nth = np.empty(len(o), dtype=np.int64)
    nth[o] = np.arange(len(o)) - np.repeat(starts, np.diff(np.append(starts, len(o))))
    o = np.lexsort((recv, nth, tag, dst, src))  # a send right before the recv it meets
    a, b = o[:-1], o[1:]
    met = (recv[a] == 0) & (recv[b] == 1) & (src[a] == src[b]) & (dst[a] == dst[b]) & (tag[a] == tag[b]) \
        & (nth[a] == nth[b])
    s_, r_ = a[met], b[met]
    s_ = s_[np.argsort(idx[s_], kind="stable")]  # each pair's entry made at its send, in index order
    r_ = _partner_of(s_, a[met], b[met])
    bad = np.flatnonzero((size[r_] != 0) & (size[r_] != size[s_]))
    if len(bad):
        si, ri = int(idx[s_[bad[0]]]), int(idx[r_[bad[0]]])
        send, recv_a = ix.acts[si], ix.acts[ri]
        raise InputError(
            f"program: recv {recv_a.name!r} on rank {ix.rank_of[ri]} expects {recv_a.nbytes} bytes but the matching "
            f"send {send.name!r} on rank {ix.rank_of[si]} sends {send.nbytes}"
        )
    sends, recvs = idx[s_].tolist(), idx[r_].tolist()
    consume(map(partner.__setitem__, sends, recvs))  # (each index in one pair: set in C, no tuple per pair)
    consume(map(partner.__setitem__, recvs, sends))
    return partner, p2p, (sends, recvs, size[s_].tolist(), label[s_].tolist()), set(idx[s_[quiet[s_]]].tolist())


def _partner_of(order: np.ndarray, sends: np.ndarray, recvs: np.ndarray) -> np.ndarray:
    """The recvs of ``sends`` (met pairwise with ``recvs``), in the order of ``order``."""
    where = np.empty(int(sends.max(initial=-1)) + 1, dtype=np.int64)
    where[sends] = recvs
    return where[order]


def _column(values: list) -> np.ndarray:
    """A numpy array of Python objects, one per value (sizes keep their type: 4 and 4.0
    stay apart, as the actions gave them)."""
    out = np.empty(len(values), dtype=object)
    for k, v in enumerate(values):
        out[k] = v
    return out
