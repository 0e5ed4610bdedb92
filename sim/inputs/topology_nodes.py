"""Topology builders: DGX-style nodes (``NodeSpec``) and the fabrics that join them
(``FabricSpec``): rail-optimized leaf/spine or a two-level fat-tree. The TOML files
that describe them are read in ``sim.inputs.topology_build``; clusters of several node
kinds are put together in ``sim.inputs.topology_mixed``.

Inside a node every GPU has one link to a single NVSwitch device (the node's NVSwitch
chips act as one non-blocking crossbar) and one PCIe link to its own NIC. A node is an
NVLink domain: eight GPUs in a DGX, or a whole GB200 NVL72 rack (72 GPUs on its NVLink
Switch trays), whose compute trays are no separate devices since every GPU's NVLink ports
reach the switch trays directly. Everything
here is in SI units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from sim.errors import InputError
from sim.inputs.topology import Topology
from sim.units import Number

GB = 1e9
US = 1e-6
FABRICS = ("rail", "fat-tree")
OVERSUBSCRIPTION = Number(float, minimum=1)
"""What ``--oversubscription`` (and ``fabric.oversubscription``) accepts."""

MAX_CLUSTER_GPUS = 131_072
"""Largest cluster built: eight times the largest published training run (Llama 3 405B
on 16,384 H100s). Building its graph takes tens of seconds and about a GB; a typo'd
``--nodes 1000000`` would take hours."""


def check_cluster_size(nodes: int, gpus_per_node: int) -> None:
    """Refuse to build a cluster of more than ``MAX_CLUSTER_GPUS`` GPUs."""
    gpus = nodes * gpus_per_node
    if gpus > MAX_CLUSTER_GPUS:
        raise InputError(
            f"nodes: got {nodes:,} ({gpus:,} GPUs at {gpus_per_node} per node); trainsim builds clusters of up to "
            f"{MAX_CLUSTER_GPUS:,} GPUs, eight times the largest published training run"
        )


@dataclass(frozen=True)
class NodeSpec:
    """One server: GPUs on NVLink through NVSwitch, each GPU with its own NIC over PCIe."""

    name: str
    gpus: int
    gpu_profile: str
    nvlink_bandwidth_Bps: float
    nvlink_latency_s: float
    pcie_bandwidth_Bps: float
    pcie_latency_s: float
    nics: int
    nic_kind: str
    nic_bandwidth_Bps: float
    nic_latency_s: float
    host_link: str = "pcie"
    """How a GPU reaches its host CPU's memory: ``pcie`` (x86 servers: each GPU on its own
    PCIe link, ``pcie_bandwidth_Bps``) or ``c2c`` (Grace superchips, GB200/GB300: NVLink-C2C,
    ``host_bandwidth_Bps`` per direction per superchip, shared by its ``gpus_per_host`` GPUs)."""
    host_bandwidth_Bps: float = 0.0
    """NVLink-C2C per direction, per superchip (``host_link`` c2c only)."""
    host_latency_s: float = 0.0
    gpus_per_host: int = 1
    """GPUs per Grace CPU (``host_link`` c2c): 2 on a GB200/GB300 superchip."""
    nvlink_sharp: bool = False
    """The NVSwitch reduces and multicasts (NVLink SHARP, third-generation NVSwitch: DGX
    H100/H200; NVLink 5 switches: DGX B200, GB200 NVL72; not DGX A100): NCCL's NVLS
    algorithms can run. Set on the nvswitch device as ``nvlink_sharp``."""


@dataclass(frozen=True)
class FabricSpec:
    """How nodes are joined: ``rail`` (leaf per rail) or ``fat-tree`` (leaf per rack)."""

    type: str = "rail"
    nodes_per_leaf: int = 0  # 0: 32 for rail, 4 for fat-tree
    spines: int = 8
    oversubscription: float = 1.0
    switch_latency_s: float = 0.5 * US

    def __post_init__(self):
        if self.type not in FABRICS:
            raise InputError(f"fabric: got {self.type!r}; allowed: {', '.join(FABRICS)}")
        if not (math.isfinite(self.oversubscription) and self.oversubscription >= 1):
            raise InputError(f"oversubscription: got {self.oversubscription!r}; expected a number >= 1")
        if self.spines < 1:
            raise InputError(f"spines: got {self.spines!r}; expected an integer >= 1")
        if self.nodes_per_leaf < 0:
            raise InputError(f"nodes_per_leaf: got {self.nodes_per_leaf!r}; expected an integer >= 1")

    @property
    def leaf_size(self) -> int:
        return self.nodes_per_leaf or (32 if self.type == "rail" else 4)


# ---------------------------------------------------------------------- builders
def add_link(g: nx.Graph, a: str, b: str, kind: str, bandwidth_Bps: float, latency_s: float) -> None:
    g.add_edge(a, b, kind=kind, bandwidth_Bps=float(bandwidth_Bps), latency_s=float(latency_s))


def add_node(g: nx.Graph, spec: NodeSpec, index: int, first_rank: int | None = None) -> None:
    """Add node ``index`` (GPUs, NVSwitch, NICs, and the host CPU) to graph ``g``, its GPUs
    ranked from ``first_rank`` (default ``index`` x GPUs per node) and marked with the
    node's ``gpu_profile``.

    Each GPU has its own PCIe link to the host CPU (its memory), which is what
    optimizer and activation offload cross; the CPU never carries GPU-to-GPU traffic.
    With ``host_link`` c2c (a Grace superchip) the GPUs of superchip k reach device
    ``c2c{k}`` (kind cpu) each on a link of the full C2C bandwidth, and ``c2c{k}`` reaches
    ``grace{k}`` (kind cpu, the superchip's memory) on one link of that bandwidth: the two
    GPUs' copies share it (``Topology.host_route`` crosses both links)."""
    nvs = f"node{index}/nvswitch"
    g.add_node(nvs, kind="nvswitch", node=index, nvlink_sharp=bool(spec.nvlink_sharp))
    cpu = f"node{index}/cpu"
    if spec.host_link != "c2c":
        g.add_node(cpu, kind="cpu", node=index)
    for i in range(spec.gpus):
        gpu = f"node{index}/gpu{i}"
        g.add_node(gpu, kind="gpu", rank=index * spec.gpus + i if first_rank is None else first_rank + i, node=index,
                   local=i, **({"gpu_profile": spec.gpu_profile} if spec.gpu_profile else {}))
        add_link(g, gpu, nvs, "nvlink", spec.nvlink_bandwidth_Bps, spec.nvlink_latency_s)
        if spec.host_link == "c2c":
            k = i // spec.gpus_per_host
            hub, grace = f"node{index}/c2c{k}", f"node{index}/grace{k}"
            if hub not in g:
                g.add_node(hub, kind="cpu", node=index)
                g.add_node(grace, kind="cpu", node=index)
                add_link(g, hub, grace, "nvlink", spec.host_bandwidth_Bps, 0.0)
            add_link(g, gpu, hub, "nvlink", spec.host_bandwidth_Bps, spec.host_latency_s)
        else:
            add_link(g, gpu, cpu, "pcie", spec.pcie_bandwidth_Bps, spec.pcie_latency_s)
    for j in range(spec.nics):
        nic = f"node{index}/nic{j}"
        g.add_node(nic, kind="nic", node=index, rail=j)
        # NIC j serves GPU j (GPUs share NICs round-robin when there are fewer NICs).
        for i in range(spec.gpus):
            if i % spec.nics == j:
                add_link(g, f"node{index}/gpu{i}", nic, "pcie", spec.pcie_bandwidth_Bps, spec.pcie_latency_s)


def build_node(spec: NodeSpec) -> Topology:
    """A single node on its own."""
    g = nx.Graph(gpu_profile=spec.gpu_profile)
    add_node(g, spec, 0)
    return Topology(g, spec.name)


def build_cluster(spec: NodeSpec, nodes: int, fabric: FabricSpec = FabricSpec(), name: str | None = None) -> Topology:
    """``nodes`` copies of ``spec`` joined by ``fabric``.

    Rail-optimized: leaf ``rail r / group k`` connects NIC r of the nodes in group k
    (``nodes_per_leaf`` nodes per group); every leaf connects to every spine.
    Fat-tree: leaf k connects all NICs of the nodes in group k; every leaf connects to
    every spine. In both, a leaf's uplinks together carry its downlink bandwidth divided
    by ``oversubscription``, split evenly over the spines.
    """
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise InputError(f"nodes: got {nodes!r}; expected an integer >= 1")
    if spec.nics < 1 and nodes > 1:
        raise InputError(f"node {spec.name}: nics: got {spec.nics}; a multi-node cluster needs at least 1 NIC per node")
    check_cluster_size(nodes, spec.gpus)
    g = nx.Graph(gpu_profile=spec.gpu_profile)
    for n in range(nodes):
        add_node(g, spec, n)
    if nodes > 1:
        add_fabric(g, [spec] * nodes, fabric)
    return Topology(g, name or f"{spec.name}x{nodes}-{fabric.type}")


def add_fabric(g: nx.Graph, specs: list[NodeSpec], fabric: FabricSpec) -> None:
    """Join nodes 0..len(specs)-1 (node n built from ``specs[n]``) by ``fabric``; each NIC's
    link to its leaf at its node's NIC bandwidth, a leaf's uplinks carrying its downlinks'
    sum over the oversubscription."""
    per_leaf, nodes = fabric.leaf_size, len(specs)
    groups = math.ceil(nodes / per_leaf)
    leaves: list[tuple[str, float]] = []  # (leaf id, downlink bandwidth)
    for k in range(groups):
        members = range(k * per_leaf, min(nodes, (k + 1) * per_leaf))
        if fabric.type == "rail":
            for r in range(max(specs[n].nics for n in members)):
                leaf = f"rail{r}/leaf{k}"
                g.add_node(leaf, kind="switch", role="leaf", rail=r)
                down = [n for n in members if r < specs[n].nics]
                for n in down:
                    add_link(g, f"node{n}/nic{r}", leaf, specs[n].nic_kind, specs[n].nic_bandwidth_Bps,
                              specs[n].nic_latency_s)
                leaves.append((leaf, sum(specs[n].nic_bandwidth_Bps for n in down)))
        else:
            leaf = f"leaf{k}"
            g.add_node(leaf, kind="switch", role="leaf")
            for n in members:
                for r in range(specs[n].nics):
                    add_link(g, f"node{n}/nic{r}", leaf, specs[n].nic_kind, specs[n].nic_bandwidth_Bps,
                              specs[n].nic_latency_s)
            leaves.append((leaf, sum(specs[n].nics * specs[n].nic_bandwidth_Bps for n in members)))
    if len(leaves) == 1:
        return
    kind = specs[0].nic_kind
    for s in range(fabric.spines):
        g.add_node(f"spine{s}", kind="switch", role="spine")
    for leaf, down in leaves:
        up_bw = down / fabric.oversubscription / fabric.spines
        for s in range(fabric.spines):
            add_link(g, leaf, f"spine{s}", kind, up_bw, fabric.switch_latency_s)
