"""A program as arrays, for the engine: every action gets an index, and what the run needs
to know before the clock starts is computed once here.

- ``acts``, ``rank_of``, ``stream_of``: each action and where it runs; ``streams`` lists
  (rank, stream name); ``members[sid]`` the actions of a stream in order; ``ids`` maps
  (rank, name) to an index.
- ``pending[i]`` counts action i's dependencies, and one more for the action before it
  on its stream, if any: ``nxt[j]`` (or -1). ``dependents[j]`` lists the actions that name
  j in their ``deps``.
- ``dur[i]``: the duration of a compute or comm action (None for the others);
  ``mem_start[i]``, ``mem_end[i]``: its memory changes, as (category, bytes) pairs, when
  it starts and when it ends (None if none), so that the run need not read the action.
- ``partner[i]``: the send or recv that action i meets (or -1). The n-th send from a to b
  with a given tag (or none) meets the n-th recv on b from a with that tag, counted in
  each rank's program order across its streams.
- ``key_of[i]``: the meeting key of a collective (its sorted group and its tag, or its
  sequence number on that group).
- ``needed[group]``: the simulated members of a group (shadows arrive implicitly).
- ``barrier_of[i]``: for a ``comm`` action with a group of two or more simulated ranks,
  the barrier its members share, ``[members still to arrive, indices arrived]`` (state
  the run mutates: build a new index per run).
"""

from __future__ import annotations

from sim.actions import Action, Program


class ProgramIndex:
    """What ``index_program`` returns (see the module doc)."""

    __slots__ = ("acts", "rank_of", "stream_of", "streams", "members", "ids", "order", "pending", "dependents",
                 "key_of", "partner", "needed", "barrier_of",
                 "dur", "mem_start", "mem_end", "nxt")


def index_program(program: Program) -> ProgramIndex:
    ix = ProgramIndex()
    _index(ix, program)
    _match(ix, program)
    return ix


def _index(ix: ProgramIndex, program: Program) -> None:
    acts: list[Action] = []
    rank_of: list[int] = []
    stream_of: list[int] = []
    streams: list[tuple[int, str]] = []
    members: list[list[int]] = []
    ids: dict[tuple[int, str], int] = {}
    order: list[int] = []  # indices in program order, rank by rank
    for r, lst in program.actions.items():
        by: dict[str, list[tuple[int, Action]]] = {}
        for k, a in enumerate(lst):
            by.setdefault(a.stream, []).append((k, a))
        local = [0] * len(lst)
        for name in sorted(by):
            sid = len(streams)
            streams.append((r, name))
            mine = []
            for k, a in by[name]:
                i = len(acts)
                ids[(r, a.name)] = i
                local[k] = i
                acts.append(a)
                rank_of.append(r)
                stream_of.append(sid)
                mine.append(i)
            members.append(mine)
        order.extend(local)
    pending = [0] * len(acts)
    dependents: list[list[int] | None] = [None] * len(acts)
    dur: list[float | None] = [None] * len(acts)
    mem_start: list[tuple | None] = [None] * len(acts)
    mem_end: list[tuple | None] = [None] * len(acts)
    for i, a in enumerate(acts):
        kind = a.kind
        if kind == "compute" or kind == "comm":
            dur[i] = a.duration_s
        if a.mem:
            for when, table in (("start", mem_start), ("end", mem_end)):
                m = tuple((category, float(nbytes)) for w, category, nbytes in a.mem if w == when)
                if m:
                    table[i] = m
        if a.deps:
            r = rank_of[i]
            for d in a.deps:
                j = ids[(r, d) if d.__class__ is str else d]
                pending[i] += 1
                if dependents[j] is None:
                    dependents[j] = [i]
                else:
                    dependents[j].append(i)
    ix.acts, ix.rank_of, ix.stream_of, ix.streams, ix.members = acts, rank_of, stream_of, streams, members
    nxt = [-1] * len(acts)
    for mine in members:
        for i, j in zip(mine, mine[1:]):
            nxt[i] = j
            pending[j] += 1
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
    shadows = program.shadows
    needed = {g: sum(1 for x in g if x not in shadows)
              for g in {a.group for a in acts if a.kind in ("collective", "comm")}}
    barrier_of: list = [None] * n
    barriers: dict[tuple, list] = {}
    for i, a in enumerate(acts):
        if a.kind == "comm" and len(a.group) > 1 and needed[a.group] > 1:
            key = (tuple(sorted(a.group)), a.name)
            b = barriers.get(key)
            if b is None:
                b = barriers[key] = [needed[a.group], []]
            barrier_of[i] = b
    ix.key_of, ix.partner, ix.needed, ix.barrier_of = key_of, partner, needed, barrier_of
