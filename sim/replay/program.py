"""Rank graphs -> the engine's ``Program``: every rank of the job, partners matched.

``complete`` fills the ranks nobody traced with clones of traced ones (``clone_source``:
the traced rank with the same data-parallel role, see below), each peer and group member
moved as the rank is. ``to_program`` makes one ``Action`` per node: compute at its
measured duration on its lane, collectives and send/recv as the network model's
(``algo`` and ``protocol`` left to NCCL's tuner, as ``trainsim run`` does), ``comm``
nodes at their measured duration; a collective keeps its node's claim (``Node.transport``,
``Node.slows_compute``: what moves it, and whether it slows the compute beside it). The n-th send from a to b is matched with the n-th
recv on b from a; sends or receives left without a partner, and collectives on a group
whose members do not all run the same number of them, are replayed at their measured
duration instead (counted in ``Replayed.unmatched``), so that a partial trace never
deadlocks.

Cloning: an untraced rank k copies a traced rank t with the same role: one whose
data-parallel group holds k (k is its replica: the groups of its all-reduces,
reduce-scatters and all-gathers named for data parallelism, else of all of them), else
the traced rank nearest below k in rank order (the last traced rank when none is below).
The clone keeps t's kernels at their measured durations, moves each peer p to
(p + k - t) mod world, and each group that does not hold k the same way (a group that
holds k, such as the world group, is kept). Data-parallel replicas and ring neighbours
clone this way exactly; a pipeline stage's role is only right if a rank of that stage
was traced.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sim.program.actions import Action, Program
from sim.replay.graph import Node, RankGraph


@dataclass
class Replayed:
    """What ``to_program`` made: the program, and per rank the node behind each action name."""

    program: Program
    nodes: dict[int, dict[str, Node]]
    unmatched: int = 0
    cloned: dict[int, int] = field(default_factory=dict)
    """Untraced rank -> the traced rank it copies."""


def clone_source(rank: int, traced, replicas: dict | None = None) -> int:
    """The traced rank an untraced ``rank`` copies (see the module doc); ``replicas``:
    traced rank -> the ranks of its data-parallel groups."""
    same = [t for t in sorted(traced) if rank in (replicas or {}).get(t, ())]
    if same:
        return same[0]
    below = [t for t in sorted(traced) if t <= rank]
    return below[-1] if below else max(traced)


_DP_NAME = re.compile(r"data|(^|[^a-z])dp([^a-z]|$)", re.I)


def is_data_parallel_name(name: str) -> bool:
    """Whether a process group's name says data parallelism (``DATA_PARALLEL_GROUP``, ``dp``)."""
    return bool(name) and bool(_DP_NAME.search(name))


def replica_ranks(graphs: dict[int, RankGraph]) -> dict[int, set]:
    """Per traced rank, the ranks of its data-parallel groups (see the module doc)."""
    out = {}
    for r, g in graphs.items():
        colls = [n for n in g.nodes if n.kind == "collective" and n.op in ("allreduce", "reducescatter", "allgather")]
        named = [n for n in colls if is_data_parallel_name(n.pg_name)]
        out[r] = {m for n in (named or colls) for m in n.group}
    return out


def complete(graphs: dict[int, RankGraph], world: int) -> tuple[dict[int, RankGraph], dict[int, int]]:
    """Every rank of ``world``: the traced graphs and clones for the rest."""
    out = dict(graphs)
    cloned = {}
    replicas = replica_ranks(graphs) if len(graphs) < world else {}
    for k in range(world):
        if k in out:
            continue
        t = clone_source(k, graphs, replicas)
        shift = k - t

        def move(r, shift=shift):
            return (r + shift) % world

        g = graphs[t]
        nodes = []
        for n in g.nodes:
            if n.kind == "collective" and k not in n.group:
                n = _with(n, group=tuple(sorted(move(r) for r in n.group)))
            elif n.kind in ("send", "recv"):
                n = _with(n, peer=move(n.peer))
            nodes.append(n)
        out[k] = RankGraph(k, tuple(nodes), g.source, g.traced_step_s, dict(g.meta, cloned_from=t))
        cloned[k] = t
    return dict(sorted(out.items())), cloned


def _with(n: Node, **kw) -> Node:
    return n._replace(**kw)


def action_name(n: Node) -> str:
    return f"{n.name} #{n.id}"


def to_program(graphs: dict[int, RankGraph]) -> Replayed:
    """The engine's program of ``graphs`` (every rank of the job; see the module doc)."""
    ranks = set(graphs)
    # Point-to-point partners: the n-th send a->b with the n-th recv on b from a.
    sends: dict[tuple, list] = {}
    recvs: dict[tuple, list] = {}
    for r, g in graphs.items():
        for n in g.nodes:
            if n.kind == "send":
                sends.setdefault((r, n.peer), []).append(n.id)
            elif n.kind == "recv":
                recvs.setdefault((n.peer, r), []).append(n.id)
    lonely: dict[int, set[int]] = {r: set() for r in graphs}
    for key in set(sends) | set(recvs):
        s, v = sends.get(key, []), recvs.get(key, [])
        a, b = key
        if b not in ranks or a not in ranks:
            lonely.setdefault(a, set()).update(s)
            lonely.setdefault(b, set()).update(v)
            continue
        lonely[a].update(s[len(v):])
        lonely[b].update(v[len(s):])
    # Collectives: every member of a group must run as many of them on it.
    counts: dict[tuple, dict[int, list]] = {}
    for r, g in graphs.items():
        for n in g.nodes:
            if n.kind == "collective":
                counts.setdefault(n.group, {}).setdefault(r, []).append(n.id)
    for group, per in counts.items():
        if any(m not in ranks for m in group):
            for r, ids in per.items():
                lonely[r].update(ids)
            continue
        least = min(len(per.get(m, [])) for m in group)
        for r, ids in per.items():
            lonely[r].update(ids[least:])
    actions: dict[int, list[Action]] = {}
    index: dict[int, dict[str, Node]] = {}
    unmatched = 0
    new = Action.new
    for r, g in graphs.items():
        names = {n.id: f"{n.name} #{n.id}" for n in g.nodes}
        acts = []
        alone = lonely.get(r, set())
        for n in g.nodes:
            name = names[n.id]
            deps = tuple([names[d] for d in n.ctrl_deps + n.data_deps]) if n.ctrl_deps or n.data_deps else ()
            kind = n.kind
            if kind == "compute":
                a = new(name, kind="compute", stream=n.lane, duration_s=n.duration_s, category=n.category,
                        deps=deps, flops=n.flops)
            elif kind == "comm" or n.id in alone:
                unmatched += kind != "comm"
                a = new(name, kind="comm", stream=n.lane, duration_s=n.duration_s, category="comm", deps=deps, op=n.op)
            elif kind == "collective":
                a = new(name, kind="collective", stream=n.lane, op=n.op, group=n.group, nbytes=n.nbytes,
                        category="comm", deps=deps, transport=n.transport, slows_compute=n.slows_compute)
            else:
                a = new(name, kind=kind, stream=n.lane, peer=n.peer, nbytes=n.nbytes, category="comm", deps=deps,
                        slows_compute=n.slows_compute)
            acts.append(a)
        actions[r] = acts
        index[r] = dict(zip(names.values(), g.nodes)) if len(names) == len(g.nodes) else \
            {names[n.id]: n for n in g.nodes}
    # (checked once, by the engine: names unique, dependencies and partners present)
    return Replayed(Program(actions, check=False), index, unmatched)


__all__ = ["Replayed", "complete", "to_program", "clone_source", "replica_ranks", "is_data_parallel_name"]
