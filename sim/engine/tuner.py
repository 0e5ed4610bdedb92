"""NCCL's tuner: which algorithm and protocol run a collective (``sim.engine.nccl``).

Like NCCL's ``ncclTopoTuneModel`` (NVIDIA/nccl ``src/graph/tuning.cc``) it estimates each
enabled (algorithm, protocol)'s time as latency + size / bandwidth and takes the
fastest (the latency starting, as NCCL's does, from the pair's base latency,
``sim.engine.nccl.base_latency``), with NCCL's rules on what is enabled (NVLS inside one node on NVLink-SHARP
switches only, NVLS-tree across nodes only, tree for all-reduce only, NVLS Simple only,
broadcast and all-to-all ring only). Both terms come from the collective's own transfer
steps on the topology (the longest chain of latencies through the steps, and the most
loaded directed link's bytes over its capacity, or the rate caps of NCCL's tuning model,
``sim.engine.nccl_tuning``: channels for the size, protocol caps, NVLS chunks), so choice
and simulation agree.
"""

from __future__ import annotations

import math

from sim.engine.algorithms import build
from sim.engine.nccl import (POINT_TO_POINT_OPS, PROTOCOLS, NcclModel, TunerRequest, base_latency, rate_caps,
                             ring_step_latency, route_links, transfer_cost)
from sim.inputs.topology import default_channels, nvls_capable, ranks_by_node


def candidates(op: str, nodes: int, sharp: bool, equal_nodes: bool) -> list[tuple[str, str]]:
    """(algorithm, protocol) pairs NCCL enables for ``op`` on a group over ``nodes`` nodes."""
    out = []
    algos = ["ring"]
    if op == "allreduce":
        algos.append("tree")
        if sharp and nodes == 1:
            algos.append("nvls")
        if sharp and nodes > 1 and equal_nodes:
            algos.append("nvls_tree")
    elif op in ("reducescatter", "allgather") and sharp and nodes == 1:
        algos.append("nvls")
    for a in algos:
        for p in (("simple",) if a.startswith("nvls") else PROTOCOLS):
            out.append((a, p))
    return out


def estimate(steps, request: TunerRequest, base_s: float = 0.0, caps: list[float] | None = None,
             step_s: float | None = None) -> float:
    """Seconds the steps of collective ``request`` take under its ``protocol`` by the
    tuner's estimate: the collective's base latency ``base_s``
    (``sim.engine.nccl.base_latency``, paid before the first transfer), plus the longest
    chain of latencies (through dependencies; NCCL's per-step latencies of its
    ``nccl_algo`` where it has one, ``step_s`` where given: ``ring_step_latency``), plus
    the most loaded directed link's bytes over its capacity or, where steps have rate
    ``caps`` (``sim.engine.nccl.rate_caps``), the longest chain of capped steps' bytes over
    their caps, whichever is longer."""
    topology, efficiency, model = request.topology, request.efficiency, request.model
    protocol, algo = request.protocol, request.nccl_algo
    finish = [0.0] * len(steps)
    capped = [0.0] * len(steps)
    load: dict = {}
    get = load.get
    for i, s in enumerate(steps):
        lat, nbytes, links = transfer_cost(s, topology, efficiency, model, protocol, algo, step_s)
        deps = s.deps
        if not deps:
            finish[i] = lat + 0.0
            if caps is not None:
                capped[i] = nbytes / caps[i] + 0.0
        elif len(deps) == 1:
            finish[i] = lat + finish[deps[0]]
            if caps is not None:
                capped[i] = nbytes / caps[i] + capped[deps[0]]
        else:
            finish[i] = lat + max([finish[d] for d in deps])
            if caps is not None:
                capped[i] = nbytes / caps[i] + max([capped[d] for d in deps])
        for l in links:
            load[l] = get(l, 0.0) + nbytes
    bw = max((b / (bw_kind[0] * efficiency.get(bw_kind[1], 1.0))
              for (l, b), bw_kind in zip(load.items(), route_links(topology, tuple(load)))), default=0.0)
    return base_s + max(finish, default=0.0) + max(bw, max(capped, default=0.0))


def collective_time(request: TunerRequest, steps=None, all_channels: bool = False) -> float:
    """``estimate`` of ``request`` under its (``algo``, ``protocol``) as an NCCL collective:
    its base latency, NCCL's per-step latencies and its tuning-model rate caps
    (``sim.engine.nccl.rate_caps``), on the channels NCCL runs for the size or, with
    ``all_channels``, on all of them, as NCCL's tuner prices its choice. ``base`` False:
    not an NCCL kernel (``Action.transport`` ``direct``), priced on the links alone, as
    point-to-point ops are. ``steps``: its steps where already built (fluid)."""
    r = request
    steps = build(r.op, r.ranks, r.nbytes, r.topology, r.algo, fluid=True) if steps is None else steps
    if r.nccl_algo is None:
        return estimate(steps, r)
    caps = rate_caps(steps, r, default_channels(r.topology, r.ranks), all_channels)
    return estimate(steps, r, base_latency(r.model, r.op, r.ranks, r.topology, r.algo, r.protocol), caps,
                    ring_step_latency(r.model, r.op, r.ranks, r.topology, r.algo, r.protocol))


def _memo_key(what: str, request: TunerRequest) -> tuple:
    """The key of a tuner result in the topology's ``memo``: everything it is computed from
    besides the topology (the efficiencies and the NCCL model by value: a fit's simulations
    make new but equal ones)."""
    r = request
    return (what, r.op, r.ranks, r.nbytes, tuple(sorted(r.efficiency.items())), repr(r.model), r.algo, r.protocol,
            r.base)


def choose(request: TunerRequest) -> tuple[str, str]:
    """``_choose``, remembered with the topology (``Topology.memo``): a run asks the same
    question once per group of a kind, and a fit's every simulation asks the same ones."""
    if request.op in POINT_TO_POINT_OPS:
        return ("ring", "simple" if request.protocol == "auto" else request.protocol)
    key = _memo_key("choose", request)
    memo = request.topology.memo
    got = memo.get(key)
    if got is None:
        got = memo[key] = _choose(request)
    return got


def _choose(request: TunerRequest) -> tuple[str, str]:
    """The (algorithm, protocol) NCCL's tuner would run ``request`` with: the fastest
    enabled pair by ``estimate`` with all the communicator's channels
    (``collective_time``; as NCCL, the channels a small size leaves idle are dropped after
    the choice); ``algo`` or ``protocol`` other than "auto" fixes that part (as NCCL_ALGO
    and NCCL_PROTO do). ``base`` False: a collective that pays no base latency
    (``Action.transport`` ``direct``), the fastest by its transfers alone."""
    op, ranks, topology, algo, protocol = request.op, request.ranks, request.topology, request.algo, request.protocol
    if op in POINT_TO_POINT_OPS:
        return ("ring", "simple" if protocol == "auto" else protocol)
    by_node = ranks_by_node(topology, ranks)
    sizes = {len(v) for v in by_node.values()}
    sharp = nvls_capable(topology, ranks)
    options = [(a, p) for a, p in candidates(op, len(by_node), sharp, len(sizes) == 1)
               if algo in ("auto", a) and protocol in ("auto", p)]
    if not options:
        return (algo if algo != "auto" else "ring", protocol if protocol != "auto" else "simple")
    best, best_t = None, math.inf
    built: dict = {}
    for a, p in options:
        if a not in built:
            built[a] = build(op, ranks, request.nbytes, topology, a, fluid=True)
        t = collective_time(request.running(a, p), built[a], all_channels=True)
        if best is None or t < best_t * (1 - 1e-9):  # (the first when none is finite: a free network)
            best, best_t = (a, p), t
    return best


def runnable(op: str, ranks, topology, algo: str) -> bool:
    """Whether NCCL could run ``op`` over ``ranks`` with ``algo`` (the rules of
    ``candidates``; hierarchical: all-reduce only)."""
    if algo in ("auto", "ring"):
        return True
    if algo == "hierarchical":
        return op == "allreduce"
    by_node = ranks_by_node(topology, ranks)
    ok = candidates(op, len(by_node), nvls_capable(topology, ranks), len({len(v) for v in by_node.values()}) == 1)
    return any(a == algo for a, _ in ok)


def alone_time(op: str, ranks, nbytes: float, topology, efficiency: dict, model: NcclModel) -> float:
    """Seconds a collective takes with nothing else on the network, under what the engine
    runs for it (``sim.engine.collectives.Collectives.choose``: ``model.algo`` and
    ``model.protocol`` where set and runnable, else the tuner's choice): ``estimate`` of
    its steps with its base latency, which is the flow model's time when nothing contends.
    Remembered with the topology (``Topology.memo``), as ``choose``."""
    request = TunerRequest(op, ranks, nbytes, topology, efficiency, model)
    key = _memo_key("alone", request)
    got = topology.memo.get(key)
    if got is None:
        got = topology.memo[key] = _alone_time(request)
    return got


def _alone_time(request: TunerRequest) -> float:
    algo, protocol = request.model.algo or "auto", request.model.protocol or "auto"
    if not runnable(request.op, request.ranks, request.topology, algo):
        algo = "auto"
    if algo == "auto" or protocol == "auto":
        algo, protocol = choose(request.running(algo, protocol))
    return collective_time(request.running(algo, protocol))
