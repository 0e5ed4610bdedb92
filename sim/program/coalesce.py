"""Coalescing what does not change the answer: tensor-parallel collectives that have
their links to themselves.

Megatron's tensor-parallel collectives sit between the compute pieces of every layer,
so a faithful program has four or more actions per layer per micro-batch. When every
tensor-parallel group lies inside one node behind an NVSwitch and no other traffic
crosses NVLink (each pipeline and data-parallel group has at most one member per node,
so their transfers leave through the NICs), each collective runs alone on its ring,
and its time is exactly NCCL's base latency (``sim.engine.nccl``) plus the ring closed form

    all-reduce 2(n−1)(α + S/(nB)),   all-gather, reduce-scatter (n−1)(α + S/(nB))

(``sim.program.costs.ring_time``) with α the GPU-NVSwitch-GPU latency and B the NVLink
bandwidth times its efficiency: what the network model computes for them
(``tests/test_collectives.py`` checks that to 1e-9). Then a layer's pieces can become
one compute span and one communication span of the same total length, and a step's
layers one pair when nothing needs the layer boundaries (only the last backward of each
layer anchors gradient buckets, and ZeRO-3 gathers need every layer). The step ends at
exactly the same time.
"""

from __future__ import annotations

from typing import Callable

from sim.inputs.plan import ParallelPlan
from sim.inputs.profile_checks import NCCL_BASE_LATENCY_S
from sim.inputs.topology import Topology
from sim.program.costs import ring_time
from sim.program.passes import Segment


def isolated_tp_pricer(plan: ParallelPlan, topology: Topology, link_efficiency: dict[str, float],
                       alone: Callable[[str, tuple, float], float] | None = None) -> Callable[[Segment], float] | None:
    """The closed-form price of a tensor-parallel collective when TP traffic provably has
    NVLink to itself (see the module doc), else None. Without ``alone`` the formula is
    NCCL's base latency of a ring under Simple (what the engine's default NCCL model and
    the actions' default algorithm and protocol pay: ``sim.engine.nccl``) plus
    ``sim.program.costs.ring_time``; this function only decides whether it is exact and
    reads α and B off the topology. With ``alone`` (``sim.engine.tuner.alone_time`` bound to
    the run's topology and NCCL settings, ``nccl_algo``/``nccl_protocol``) each collective
    is priced as the engine runs it alone: the algorithm and protocol NCCL's tuner picks
    (or the forced one), the longest chain of latencies through its steps plus the most
    loaded link's bytes over its capacity, after its base latency, which for a ring is
    ``ring_time`` (with the protocol's α and β) and for NVLS ``costs.nvls_time``
    (tests/test_nccl_training.py checks both against the engine). Either way each
    coalesced collective pays NCCL's base latency once, as the engine's would."""
    if plan.tp < 2 or plan.world_size > topology.num_gpus:
        return None
    node = topology.node_of
    if any(len({node(r) for r in g}) != 1 for g in plan.groups("tp")):
        return None
    for dim in ("pp", "dp"):
        if any(len({node(r) for r in g}) != len(g) for g in plan.groups(dim)):
            return None
    a, b = plan.groups("tp")[0][:2]
    route = topology.route(a, b)
    if {topology.link(u, v)["kind"] for u, v in route} != {"nvlink"} or len(route) != 2 \
            or topology.graph.nodes[route[0][1]]["kind"] != "nvswitch":
        return None
    if not _uniform_nvlink(plan, topology, topology.link(*route[0])):
        return None
    if alone is not None:
        return _nccl_pricer(tuple(plan.groups("tp")[0]), alone)
    alpha = topology.path_latency_s(a, b)
    bw = topology.bottleneck_Bps(a, b) * link_efficiency.get("nvlink", 1.0)
    n = plan.tp
    base = NCCL_BASE_LATENCY_S["ring"]["simple"]

    def price(seg: Segment) -> float:
        return base + ring_time(seg.op, seg.nbytes, n, alpha, bw)

    return price


def _nccl_pricer(group, alone: Callable[[str, tuple, float], float]) -> Callable[[Segment], float]:
    """Each collective's time alone on its group, as ``alone(op, group, nbytes)`` gives it
    (cached per op and size)."""
    cache: dict[tuple, float] = {}

    def price(seg: Segment) -> float:
        key = (seg.op, seg.nbytes)
        t = cache.get(key)
        if t is None:
            t = cache[key] = alone(seg.op, group, seg.nbytes)
        return t

    return price


def _uniform_nvlink(plan: ParallelPlan, topology: Topology, ref: dict) -> bool:
    """Every GPU of the plan reaches one NVSwitch over a link like ``ref``, no GPU has a
    direct link to another, and no device shared by two GPUs (a NIC) offers a wider link
    than NVLink: then every tensor-parallel pair's route is GPU-NVSwitch-GPU (routing
    prefers it, ``Topology.route``) with the bandwidth and latency the closed form is
    priced on."""
    g = topology.graph
    for r in range(plan.world_size):
        gpu = topology.gpu(r)
        switches = 0
        for n in g.neighbors(gpu):
            kind = g.nodes[n]["kind"]
            if kind == "gpu":
                return False
            e = g.edges[gpu, n]
            if kind == "nvswitch":
                if (e["kind"], e["bandwidth_Bps"], e["latency_s"]) != (ref["kind"], ref["bandwidth_Bps"], ref["latency_s"]):
                    return False
                switches += 1
            elif e["bandwidth_Bps"] > ref["bandwidth_Bps"] \
                    and sum(1 for m in g.neighbors(n) if g.nodes[m]["kind"] == "gpu") > 1:
                return False  # a shared NIC wider than NVLink: node traffic would take it
        if switches != 1:
            return False
    return True


def coalesce(segs, price: Callable[[Segment], float], keep_layers: bool) -> tuple[Segment, ...]:
    """Each layer's pieces (or the whole step's, without ``keep_layers``) as one compute
    segment followed by one communication segment of the collectives' total time."""
    groups: list[list[Segment]] = []
    for s in segs:
        if keep_layers and groups and groups[-1][0].layer != s.layer:
            groups.append([s])
        elif not groups:
            groups.append([s])
        else:
            groups[-1].append(s)
    out: list[Segment] = []
    for g in groups:
        layer = g[0].layer if keep_layers else None
        comp = [s for s in g if s.kind == "compute"]
        coll = [s for s in g if s.kind == "collective"]
        out.append(Segment("compute", sum(s.duration_s for s in comp), sum(s.flops for s in comp), layer=layer))
        if coll:
            out.append(Segment("comm", sum(price(s) for s in coll), op="coalesced",
                               nbytes=sum(s.nbytes for s in coll), layer=layer))
    return tuple(out)
