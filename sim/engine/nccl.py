"""NCCL's protocols and its choice of algorithm and protocol ("tuner").

Protocols (NCCL's LL, LL128 and Simple) change each step's α and β. The topology's
link latencies and the profile's link efficiencies describe Simple, NCCL's protocol for
large buffers; another protocol ``p`` moves ``nbytes / bandwidth_fraction[p]`` bytes on
the wire (LL sends a 4-byte flag with every 4 bytes of data; LL128 8 bytes of flag per
128-byte line) and pays its route's latency times ``hop_latency[p] / hop_latency[simple]``
(per medium: NVLink or PCIe, and the network). The figures are NCCL's own tuning
constants (``src/graph/tuning.cc``: ``hwLatencies`` for ring, and the ring bandwidth
refinements ``busBw * .5`` for LL and ``busBw * 0.92`` for LL128), kept in the hardware
profile (``nccl_protocols``) with their sources.

NCCL's tuning model (``sim.engine.nccl_tuning``), with a profile of a GPU its tables know
(``NcclModel.arch``): every step of a ring, tree or NVLS-tree pays NCCL's own per-step
latency for its algorithm, protocol and medium instead of its route's (``hop_latency``; a
ring across nodes its steps' average, ``ring_step_latency``); each transfer runs at most at
the rate the channels NCCL keeps for the size and the protocol's caps allow
(``rate_caps``: the engine gives a capped transfer a link of its own, the tuner counts it);
NVLS's way back waits for the first round of chunks. Without one, collectives are the
links' closed forms above.

NVLS (NVLink SHARP): the NVSwitch reduces (multimem.ld_reduce) and multicasts
(multimem.st); its transfers run at ``nvls_efficiency`` of the NVLink line rate and pay
``nvls_latency_s`` (NCCL's ``hwLatencies[NVLINK][NVLS][Simple]``, 25 µs) instead of hop
latencies. NVLS runs Simple only, as in NCCL.

Base latency: NCCL's tuner starts every collective's latency from a fixed cost of the
(algorithm, protocol) pair, kernel launch and setup (``baseLatencies`` in tuning.cc, µs:
ring 6.6/14.0/8.4 and tree 6.8/14.0/8.4 for LL/LL128/Simple, NVLS and NVLS-tree 0; the
profile's ``nccl_base_latency_s``). Every NCCL collective here pays it once, between the
moment its last member arrives and its first transfer (``sim.engine.collectives``, under
both collective models; the members' actions count it as busy), and the tuner adds it to
its estimate (``base_latency``). Hierarchical all-reduce, which NCCL does not have, is
taken as three NCCL ring calls (reduce-scatter in each node, all-reduce across nodes,
all-gather in each node, as Horovod and DeepSpeed issue it): ring's base once per phase.
Not NCCL collectives, so no base: point-to-point transfers (pipeline sends and receives,
ring attention's ``shift``, all-to-all, which PyTorch runs as grouped ``ncclSend``/
``ncclRecv`` outside NCCL's collective table), one-rank groups, and collectives whose
bytes move outside NCCL (``Action.transport`` ``direct``: copy engines or a library's own
kernel), whose (algorithm, protocol) is chosen without it too.

``sim.engine.tuner.choose`` is the tuner: like NCCL's ``ncclTopoTuneModel`` it estimates each enabled
(algorithm, protocol)'s time as latency + size / bandwidth and takes the fastest, but it
takes both terms from the collective's own transfer steps on the topology (the longest
chain of latencies through the steps, and the most loaded link's bytes over its
capacity), so the choice and the simulated times agree. NCCL's rules on what is
enabled are kept: NVLS only inside one node on NVLink-SHARP switches, NVLS-tree only
across nodes, tree for all-reduce only, broadcast and all-to-all ring only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from sim.engine import nccl_tuning as tuning
from sim.engine.nccl_tuning import ARCH_OF_GPU
from sim.inputs.profile_checks import NCCL_BASE_LATENCY_S
from sim.inputs.topology import ranks_by_node

PROTOCOLS = ("ll", "ll128", "simple")
NCCL_TUNING = "NVIDIA/nccl src/graph/tuning.cc (ncclTopoTuneModel)"

DEFAULT_PROTOCOLS = {
    "ll": {"bandwidth_fraction": 0.5, "hop_latency_nvlink_s": 0.6e-6, "hop_latency_net_s": 2.7e-6},
    "ll128": {"bandwidth_fraction": 0.92, "hop_latency_nvlink_s": 1.9e-6, "hop_latency_net_s": 4.0e-6},
    "simple": {"bandwidth_fraction": 1.0, "hop_latency_nvlink_s": 3.4e-6, "hop_latency_net_s": 14.0e-6},
}
"""NCCL's ring figures: hwLatencies[NVLINK|NET][RING][LL, LL128, Simple] (µs) and the
ring bandwidth refinements (LL: busBw·0.5; LL128: busBw·0.92 = 120/128 of Simple)."""
DEFAULT_NVLS_LATENCY_S = 25e-6
"""hwLatencies[NVLINK][NVLS][Simple] in NCCL's tuning.cc."""
PROTOCOL_KEYS = ("bandwidth_fraction", "hop_latency_nvlink_s", "hop_latency_net_s")


@dataclass(frozen=True)
class NcclModel:
    """What the engine needs to price protocols and NVLS (from a hardware profile)."""

    protocols: dict
    """protocol -> {bandwidth_fraction, hop_latency_nvlink_s, hop_latency_net_s}."""
    nvls_efficiency: float = 1.0
    """Fraction of the NVLink line rate one GPU's NVLS traffic reaches."""
    nvls_latency_s: float = DEFAULT_NVLS_LATENCY_S
    algo: str | None = None
    """The algorithm of every collective of the run, as NCCL_ALGO ("auto": the tuner's
    choice; None: each action's own). A collective the forced algorithm cannot run (tree
    for an all-gather, NVLS across nodes) keeps the tuner's choice (``forced_or_auto``)."""
    protocol: str | None = None
    """The protocol of every collective of the run, as NCCL_PROTO (None: each action's own)."""
    base_latency_s: dict = field(default_factory=lambda: NCCL_BASE_LATENCY_S)
    """algorithm (ring, tree, nvls, nvls_tree) -> protocol -> seconds each NCCL collective
    pays once before its first transfer (``base_latency``)."""
    arch: str | None = None
    """GPU architecture NCCL's tables are read for (hopper, ampere, ...); None: no tuning
    model beyond the links (``sim.engine.nccl_tuning``: channels for the size, protocol
    caps, NVLS chunks)."""
    cpu: str = "intel"
    """CPU vendor of the nodes (intel, amd): NCCL's LL cap across nodes depends on it."""

    def forcing(self, algo: str | None, protocol: str | None) -> "NcclModel":
        """This model with the run-wide ``algo`` and ``protocol`` (``nccl_algo``, ``nccl_protocol``)."""
        return replace(self, algo=algo, protocol=protocol)

    @staticmethod
    def from_profile(profile) -> "NcclModel":
        if profile is None:
            return DEFAULT_MODEL
        arch, cpu = next((v for k, v in ARCH_OF_GPU.items() if profile.name.startswith(k)), (None, "intel"))
        return NcclModel(dict(profile.nccl_protocols or DEFAULT_PROTOCOLS), profile.nvls_efficiency or 1.0,
                         profile.nvls_latency_s if profile.nvls_latency_s is not None else DEFAULT_NVLS_LATENCY_S,
                         base_latency_s=dict(profile.nccl_base_latency_s or NCCL_BASE_LATENCY_S), arch=arch, cpu=cpu)

    def fraction(self, protocol: str) -> float:
        return self.protocols[protocol]["bandwidth_fraction"] / self.protocols["simple"]["bandwidth_fraction"]

    def latency_ratio(self, protocol: str, medium: str) -> float:
        key = "hop_latency_net_s" if medium in ("ib", "ethernet") else "hop_latency_nvlink_s"
        return self.protocols[protocol][key] / self.protocols["simple"][key]


DEFAULT_MODEL = NcclModel(DEFAULT_PROTOCOLS)

POINT_TO_POINT_OPS = ("alltoall", "shift", "sendrecv")
"""Ops NCCL runs as grouped sends and receives (``ncclSend``/``ncclRecv``: PyTorch's
all-to-all, ring attention's exchange, pipeline transfers), outside its collective tuning
table: no base latency."""


@dataclass(frozen=True)
class TunerRequest:
    """One collective as NCCL's tuning model prices it: ``op`` over ``ranks`` with buffer
    ``nbytes`` (nccl-tests' size, as ``sim.engine.algorithms.build`` takes it) on
    ``topology``, whose link kinds run at ``efficiency`` of their line rate (None: line
    rate), under ``model`` (None: ``DEFAULT_MODEL``); ``algo`` and ``protocol`` "auto" for
    the tuner's choice or fixed (as NCCL_ALGO and NCCL_PROTO do); ``base`` False: not an
    NCCL kernel (``Action.transport`` ``direct``), which pays no base latency, no NCCL
    per-step latency and no rate cap: priced on its links alone. What the tuner
    (``sim.engine.tuner``: ``choose``, ``collective_time``, ``estimate``) and ``rate_caps``
    take: the values that travel together from the engine's collectives, the session's
    pricing of a collective alone and ``trainsim collective``."""

    op: str
    ranks: tuple
    nbytes: float
    topology: object
    efficiency: dict | None = None
    model: NcclModel | None = None
    algo: str = "auto"
    protocol: str = "auto"
    base: bool = True

    def __post_init__(self):
        object.__setattr__(self, "ranks", tuple(self.ranks))
        if self.efficiency is None:
            object.__setattr__(self, "efficiency", {})
        if self.model is None:
            object.__setattr__(self, "model", DEFAULT_MODEL)

    def running(self, algo: str, protocol: str) -> "TunerRequest":
        """This request under (``algo``, ``protocol``)."""
        return replace(self, algo=algo, protocol=protocol)

    @property
    def nccl_algo(self) -> str | None:
        """The NCCL algorithm whose per-step latencies its steps pay under NCCL's tuning
        model (``protocol_cost``): ``algo``, or None for a collective priced on its routes
        (not an NCCL kernel, ``base`` False, or a point-to-point op)."""
        return self.algo if self.base and self.op not in POINT_TO_POINT_OPS else None


def base_latency(model: NcclModel, op: str, ranks, topology, algo: str, protocol: str) -> float:
    """Seconds NCCL collective ``op`` over ``ranks`` under (``algo``, ``protocol``) pays
    once before its first transfer (the module doc): ``model.base_latency_s[algo][protocol]``;
    0 for point-to-point ops (``POINT_TO_POINT_OPS``) and one-rank groups (NCCL copies
    locally). Hierarchical all-reduce is three NCCL ring collectives one after another (a
    reduce-scatter inside each node, an all-reduce across nodes, an all-gather inside each
    node, as Horovod and DeepSpeed issue it): ring's base latency once per phase it has."""
    ranks = list(ranks)
    if op in POINT_TO_POINT_OPS or len(ranks) < 2:
        return 0.0
    if algo == "hierarchical":
        nodes = ranks_by_node(topology, ranks)
        per_node = max(len(v) for v in nodes.values())
        calls = (2 if per_node > 1 else 0) + (1 if len(nodes) > 1 else 0)
        return calls * model.base_latency_s["ring"][protocol]
    return model.base_latency_s[algo][protocol]


def transfer_cost(step, topology, efficiency: dict, model: NcclModel, protocol: str, algo: str | None = None,
                  step_s: float | None = None):
    """(latency_s, wire bytes, directed links) of one transfer step under ``protocol`` of
    NCCL collective ``algo`` (None: a point-to-point transfer, priced on its route);
    ``step_s``: its per-step latency where the collective sets one (``ring_step_latency``)."""
    g = topology.graph
    links = step.path or topology.route(step.src, step.dst)
    if step.nvls:
        eff = efficiency.get("nvlink", 1.0)
        lead = 0.0
        if step.lead_bytes and model.arch is not None:  # (the NVLS pipeline's first round of chunks)
            lead = step.lead_bytes / (g.edges[links[0]]["bandwidth_Bps"] * model.nvls_efficiency)
        return model.nvls_latency_s * bool(step.latency_steps) + lead, step.nbytes * eff / model.nvls_efficiency, links
    medium, latency_s = route_facts(topology, links)
    lat, nbytes = protocol_cost(latency_s, medium, step.nbytes, step.latency_steps, model, protocol, algo, step_s)
    return lat, nbytes, links


def route_facts(topology, links: tuple) -> tuple[str, float]:
    """(slowest medium, summed latency in seconds) of the route ``links``, as the network
    has them; remembered with the topology (``Topology.memo``): a tuner's estimate asks
    for the same routes step after step."""
    key = ("route", links)
    got = topology.memo.get(key)
    if got is None:
        g = topology.graph
        kinds = {g.edges[l]["kind"] for l in links}
        medium = next((k for k in ("ethernet", "ib", "pcie", "nvlink") if k in kinds), "local")  # (as the network's)
        got = topology.memo[key] = (medium, sum(g.edges[l]["latency_s"] for l in links))
    return got


def route_links(topology, links: tuple) -> tuple[tuple[float, str], ...]:
    """(bandwidth_Bps, kind) of each link of the route ``links``, in order; remembered with
    the topology (``Topology.memo``)."""
    key = ("links", links)
    got = topology.memo.get(key)
    if got is None:
        facts = topology.memo.get("link facts")
        if facts is None:
            facts = topology.memo["link facts"] = {}
        out = []
        for l in links:  # (a link's facts kept once: routes share their links)
            f = facts.get(l)
            if f is None:
                e = topology.graph.edges[l]
                f = facts[l] = (e["bandwidth_Bps"], e["kind"])
            out.append(f)
        got = topology.memo[key] = tuple(out)
    return got


def hop_latency(model: NcclModel, algo: str, protocol: str, medium: str) -> float:
    """Seconds one step of ``algo`` under ``protocol`` pays on a route whose slowest medium
    is ``medium``, as NCCL's tuning model has it (``hwLatencies[NVLINK|PCI|NET][algo][proto]``,
    ``sim.engine.nccl_tuning.HW_LATENCY_S``): ring (and hierarchical, three ring calls) from
    the profile's ``nccl_protocols``, which hold ring's NVLink and network rows; 0 on a
    route that leaves no GPU (``local``)."""
    if medium == "local":
        return 0.0
    hw = "net" if medium in ("ib", "ethernet") else "pci" if medium == "pcie" else "nvlink"
    table = "ring" if algo == "hierarchical" else algo
    if table == "ring" and hw != "pci":
        return model.protocols[protocol][f"hop_latency_{hw}_s"]
    return tuning.HW_LATENCY_S[table][hw][protocol]


def ring_step_latency(model: NcclModel, op: str, ranks, topology, algo: str, protocol: str) -> float | None:
    """The latency every step of a ring ``op`` over ``ranks`` spanning nodes pays under
    NCCL's tuning model: its ``nsteps`` steps cost ``(nsteps − nInterSteps) · intraLat +
    nInterSteps · interLat`` (``ncclTopoTuneModel``; nInterSteps = 2(N−1) for all-reduce,
    N−1 for all-gather and reduce-scatter over N nodes), spread evenly: a ring's steps go
    through every rank in turn, so every hop waits for the inter-node ones, and in the flow
    model each hop pays its steps' share. None where each hop pays its own medium's
    (one node, no architecture, other algorithms and ops)."""
    if model.arch is None or algo != "ring" or op not in ("allreduce", "allgather", "reducescatter"):
        return None
    nodes = ranks_by_node(topology, ranks)
    if len(nodes) < 2:
        return None
    n, N = len(list(ranks)), len(nodes)
    factor = 2 if op == "allreduce" else 1
    nsteps, inter = factor * (n - 1), factor * (N - 1)
    members = next(m for m in nodes.values())
    g = topology.graph
    kinds = {g.edges[l]["kind"] for l in topology.route(members[0], members[1])} if len(members) > 1 else set()
    intra = hop_latency(model, algo, protocol, "pcie" if "pcie" in kinds and "nvlink" not in kinds else "nvlink")
    return ((nsteps - inter) * intra + inter * hop_latency(model, algo, protocol, "ib")) / nsteps


def protocol_cost(latency_s: float, medium: str, nbytes: float, latency_steps: int, model: NcclModel,
                  protocol: str, algo: str | None = None, step_s: float | None = None) -> tuple[float, float]:
    """(latency_s, wire bytes) of a step that is not NVLS, on a route of ``latency_s``
    whose slowest medium is ``medium``, under ``protocol`` (see the module doc). A step of
    NCCL collective ``algo`` under NCCL's tuning model (``model.arch`` known) pays NCCL's
    per-step latency instead (``hop_latency``, or ``step_s`` where given:
    ``ring_step_latency``), whatever the topology's links say."""
    if algo is not None and model.arch is not None:
        per_step = hop_latency(model, algo, protocol, medium) if step_s is None else step_s
        return per_step * latency_steps, nbytes / model.fraction(protocol)
    lat = latency_s * latency_steps
    if protocol != "simple":
        return lat * model.latency_ratio(protocol, medium), nbytes / model.fraction(protocol)
    return lat, nbytes


def rate_caps(steps, request: TunerRequest, channels: int, all_channels: bool = False,
              bottlenecks: list[float] | None = None) -> list[float] | None:
    """Each step's rate cap (wire B/s) under NCCL's tuning model (``sim.engine.nccl_tuning``)
    for collective ``request`` under its (``algo``, ``protocol``),
    or None where it sets none (no architecture, NVLS, hierarchical, point-to-point, one
    rank): at most ``nc / C`` of the step's route bottleneck (the channels the size keeps),
    times a tree's refinement and size correction over the protocol's wire fraction, and at
    most the protocol's bus-bandwidth cap spread over the algorithm's connections: a ring
    hop of one of ``channels`` rings moves busBw / channels, a tree edge of one of
    ``channels`` × ``trees`` trees busBw / (channels · trees · 2(n−1)/n). ``all_channels``:
    as if every channel of the communicator ran, as NCCL's tuner prices a choice
    (``ncclTopoGetAlgoTime`` knows nothing of the channels ``topoGetAlgoInfo`` drops after).
    ``bottlenecks``: each step's route bottleneck as worked out below (its links' least
    ``bandwidth_Bps`` times its kind's efficiency), where the caller has it at hand (the
    engine, from its network's link ids: no route looked up again by its links)."""
    op, nbytes, topology, efficiency, model = (request.op, request.nbytes, request.topology, request.efficiency,
                                               request.model)
    algo, protocol, ranks = request.algo, request.protocol, request.ranks
    if model.arch is None or algo not in ("ring", "tree") or op in POINT_TO_POINT_OPS or len(ranks) < 2:
        return None
    nodes = len(ranks_by_node(topology, ranks))
    n = len(ranks)
    nc, c = tuning.channels_used(algo, protocol, math.inf if all_channels else nbytes, n, nodes)
    share = nc / c
    wire = model.fraction(protocol)
    per_connection = tuning.bus_cap_Bps(model.arch, model.cpu, algo, protocol, nodes, nc, c) / wire / channels
    if algo == "tree":
        share *= tuning.tree_factor(protocol, nodes, wire) * tuning.tree_correction(protocol, nbytes)
        per_connection /= (2 if nodes > 1 else 1) * 2 * (n - 1) / n
    if share >= 1 and math.isinf(per_connection):
        return None
    if bottlenecks is not None:
        return [min(bottleneck * share, per_connection) for bottleneck in bottlenecks]
    caps = []
    by_route: dict = {}  # route -> its slowest link's capacity (steps share routes: every channel's ring)
    route = topology.route
    for s in steps:
        links = s.path or route(s.src, s.dst)
        bottleneck = by_route.get(links)
        if bottleneck is None:
            bottleneck = by_route[links] = min((bw * efficiency.get(kind, 1.0)
                                                for bw, kind in route_links(topology, links)), default=math.inf)
        caps.append(min(bottleneck * share, per_connection))
    return caps


