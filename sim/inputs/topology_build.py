"""Building topologies: DGX-style nodes, multi-node fabrics, and TOML files.

Three kinds of TOML file live under ``topologies/`` (and users write their own):

- a **node** file (``[node]``): GPUs per node, NVLink/PCIe/NIC bandwidths (per
  direction, GB/s = 1e9 bytes/s) and latencies (microseconds). ``dgx-a100``,
  ``dgx-h100`` and ``dgx-h200`` are built in this way;
- a **cluster** file (``[cluster]`` + ``[fabric]``): N copies of a node on a
  rail-optimized leaf/spine fabric (NIC i of every node goes to the leaf of rail i, as
  on DGX SuperPODs) or on a plain two-level fat-tree with a configurable
  oversubscription of the leaf uplinks;
- a **graph** file (``[[device]]`` and ``[[link]]`` tables): any topology, device by
  device.

Inside a node every GPU has one link to a single NVSwitch device (the node's NVSwitch
chips act as one non-blocking crossbar) and one PCIe link to its own NIC. Units are
converted to SI here, once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from sim.errors import InputError
from sim.inputs.tomlio import TomlFile
from sim.inputs.topology import DEVICE_KINDS, LINK_KINDS, Topology
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


def topologies_dir() -> Path:
    """The folder of built-in topology files: ``topologies/`` at the repository's top, which
    the package links as ``sim/topologies`` (an installed wheel holds the files there)."""
    here = Path(__file__).resolve().parent
    for cand in (here / "topologies", here.parent / "topologies"):
        if cand.is_dir():
            return cand.resolve()
    return here.parent / "topologies"


def builtin_names() -> list[str]:
    """Names of the TOML files under ``topologies/`` (without ``.toml``)."""
    return sorted(p.stem for p in topologies_dir().glob("*.toml"))


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
    nvlink_sharp: bool = False
    """The NVSwitch reduces and multicasts (NVLink SHARP, third-generation NVSwitch:
    DGX H100/H200; not DGX A100): NCCL's NVLS algorithms can run. Set on the nvswitch
    device as ``nvlink_sharp``."""


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
def _add_link(g: nx.Graph, a: str, b: str, kind: str, bandwidth_Bps: float, latency_s: float) -> None:
    g.add_edge(a, b, kind=kind, bandwidth_Bps=float(bandwidth_Bps), latency_s=float(latency_s))


def add_node(g: nx.Graph, spec: NodeSpec, index: int) -> None:
    """Add node ``index`` (GPUs, NVSwitch, NICs, and the host CPU) to graph ``g``.

    Each GPU has its own PCIe link to the host CPU (its memory), which is what
    optimizer offload crosses; the CPU never carries GPU-to-GPU traffic."""
    nvs = f"node{index}/nvswitch"
    g.add_node(nvs, kind="nvswitch", node=index, nvlink_sharp=bool(spec.nvlink_sharp))
    cpu = f"node{index}/cpu"
    g.add_node(cpu, kind="cpu", node=index)
    for i in range(spec.gpus):
        gpu = f"node{index}/gpu{i}"
        g.add_node(gpu, kind="gpu", rank=index * spec.gpus + i, node=index, local=i)
        _add_link(g, gpu, nvs, "nvlink", spec.nvlink_bandwidth_Bps, spec.nvlink_latency_s)
        _add_link(g, gpu, cpu, "pcie", spec.pcie_bandwidth_Bps, spec.pcie_latency_s)
    for j in range(spec.nics):
        nic = f"node{index}/nic{j}"
        g.add_node(nic, kind="nic", node=index, rail=j)
        # NIC j serves GPU j (GPUs share NICs round-robin when there are fewer NICs).
        for i in range(spec.gpus):
            if i % spec.nics == j:
                _add_link(g, f"node{index}/gpu{i}", nic, "pcie", spec.pcie_bandwidth_Bps, spec.pcie_latency_s)


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
        _add_fabric(g, spec, nodes, fabric)
    return Topology(g, name or f"{spec.name}x{nodes}-{fabric.type}")


def _add_fabric(g: nx.Graph, spec: NodeSpec, nodes: int, fabric: FabricSpec) -> None:
    per_leaf = fabric.leaf_size
    groups = math.ceil(nodes / per_leaf)
    nic_bw, kind = spec.nic_bandwidth_Bps, spec.nic_kind
    leaves: list[tuple[str, int]] = []  # (leaf id, downlink count)
    for k in range(groups):
        members = range(k * per_leaf, min(nodes, (k + 1) * per_leaf))
        if fabric.type == "rail":
            for r in range(spec.nics):
                leaf = f"rail{r}/leaf{k}"
                g.add_node(leaf, kind="switch", role="leaf", rail=r)
                for n in members:
                    _add_link(g, f"node{n}/nic{r}", leaf, kind, nic_bw, spec.nic_latency_s)
                leaves.append((leaf, len(members)))
        else:
            leaf = f"leaf{k}"
            g.add_node(leaf, kind="switch", role="leaf")
            for n in members:
                for r in range(spec.nics):
                    _add_link(g, f"node{n}/nic{r}", leaf, kind, nic_bw, spec.nic_latency_s)
            leaves.append((leaf, len(members) * spec.nics))
    if len(leaves) == 1:
        return
    for s in range(fabric.spines):
        g.add_node(f"spine{s}", kind="switch", role="spine")
    for leaf, down in leaves:
        up_bw = down * nic_bw / fabric.oversubscription / fabric.spines
        for s in range(fabric.spines):
            _add_link(g, leaf, f"spine{s}", kind, up_bw, fabric.switch_latency_s)


# ---------------------------------------------------------------------- TOML
_NODE_KEYS = {
    "name", "gpus", "gpu_profile", "nvlink_bandwidth_GBps", "nvlink_latency_us",
    "pcie_bandwidth_GBps", "pcie_latency_us", "nics", "nic_kind", "nic_bandwidth_GBps", "nic_latency_us",
    "nvlink_sharp",
}
_FABRIC_KEYS = {"type", "nodes_per_leaf", "spines", "oversubscription", "switch_latency_us"}
_DEVICE_KEYS = {"id", "kind", "rank", "node"}
_LINK_KEYS = {"a", "b", "kind", "bandwidth_GBps", "latency_us"}


def _parse_node(f: TomlFile, t: dict) -> NodeSpec:
    p = "node."
    f.check_keys(t, _NODE_KEYS, p, required=("gpus", "nvlink_bandwidth_GBps"))
    num = f.number
    return NodeSpec(
        name=f.string(t, "name", p, default=f.path.stem),
        gpus=int(num(t, "gpus", p, integer=True, positive=True)),
        gpu_profile=f.string(t, "gpu_profile", p, default=""),
        nvlink_bandwidth_Bps=num(t, "nvlink_bandwidth_GBps", p, positive=True) * GB,
        nvlink_latency_s=num(t, "nvlink_latency_us", p, default=1.0, minimum=0) * US,
        pcie_bandwidth_Bps=num(t, "pcie_bandwidth_GBps", p, default=32.0, positive=True) * GB,
        pcie_latency_s=num(t, "pcie_latency_us", p, default=0.5, minimum=0) * US,
        nics=int(num(t, "nics", p, default=0, integer=True, minimum=0)),
        nic_kind=f.string(t, "nic_kind", p, choices=("ib", "ethernet"), default="ib"),
        nic_bandwidth_Bps=num(t, "nic_bandwidth_GBps", p, default=25.0, positive=True) * GB,
        nic_latency_s=num(t, "nic_latency_us", p, default=1.0, minimum=0) * US,
        nvlink_sharp=_flag(f, t, "nvlink_sharp", p),
    )


def _flag(f: TomlFile, t: dict, key: str, prefix: str) -> bool:
    v = t.get(key, False)
    if not isinstance(v, bool):
        raise f.error(prefix + key, f"got {v!r}; expected true or false")
    return v


def _parse_fabric(f: TomlFile, t: dict) -> FabricSpec:
    p = "fabric."
    f.check_keys(t, _FABRIC_KEYS, p)
    try:
        return FabricSpec(
            type=f.string(t, "type", p, choices=FABRICS, default="rail"),
            nodes_per_leaf=int(f.number(t, "nodes_per_leaf", p, default=0, integer=True, minimum=1 if "nodes_per_leaf" in t else 0)),
            spines=int(f.number(t, "spines", p, default=8, integer=True, minimum=1)),
            oversubscription=f.number(t, "oversubscription", p, default=1.0, minimum=1),
            switch_latency_s=f.number(t, "switch_latency_us", p, default=0.5, minimum=0) * US,
        )
    except InputError as exc:
        raise _in_file(f, exc) from None


def _in_file(f: TomlFile, exc: InputError) -> InputError:
    """``exc`` prefixed with the file's name unless it already names it."""
    msg = str(exc)
    return exc if msg.startswith(str(f.path)) else InputError(f"{f.path}: {msg}")


def _name(f: TomlFile, table: dict, key: str, prefix: str, default: str) -> str:
    return f.string(table, key, prefix, default=default)


def _parse_graph(f: TomlFile, data: dict) -> Topology:
    g = nx.Graph()
    devices = f.tables(data, "device")
    links = f.tables(data, "link")
    for i, d in enumerate(devices):
        p = f"device[{i}]."
        f.check_keys(d, _DEVICE_KEYS, p, required=("id", "kind"))
        kind = f.string(d, "kind", p, choices=DEVICE_KINDS)
        attrs = {"kind": kind}
        if kind == "gpu":
            attrs["rank"] = int(f.number(d, "rank", p, integer=True, minimum=0))
            attrs["node"] = int(f.number(d, "node", p, integer=True, minimum=0, default=0))
        dev_id = f.string(d, "id", p)
        if dev_id in g:
            raise f.error(f"{p}id", f"got {dev_id!r}; device ids must be unique")
        g.add_node(dev_id, **attrs)
    for i, l in enumerate(links):
        p = f"link[{i}]."
        f.check_keys(l, _LINK_KEYS, p, required=("a", "b", "kind", "bandwidth_GBps"))
        a, b = f.string(l, "a", p), f.string(l, "b", p)
        for end, name in (("a", a), ("b", b)):
            if name not in g:
                raise f.error(f"{p}{end}", f"got {name!r}; not a declared device id")
        _add_link(
            g, a, b, f.string(l, "kind", p, choices=LINK_KINDS),
            f.number(l, "bandwidth_GBps", p, positive=True) * GB,
            f.number(l, "latency_us", p, default=1.0, minimum=0) * US,
        )
    try:
        return Topology(g, _name(f, data, "name", "", f.path.stem))
    except InputError as exc:
        raise _in_file(f, exc) from None


def _resolve(name_or_path: str, flag: str = "topology") -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        return p
    cand = topologies_dir() / f"{name_or_path}.toml"
    if cand.exists():
        return cand
    raise InputError(
        f"{flag}: got {name_or_path!r}; expected a path to a .toml file or one of: {', '.join(builtin_names())}"
    )


def load_node_spec(name_or_path: str) -> NodeSpec:
    f = TomlFile(_resolve(name_or_path))
    if "node" not in f.data:
        raise InputError(f"{f.path}: not a node file (it has no [node] table)")
    return _parse_node(f, f.table(f.data, "node"))


def load_topology(name_or_path: str, nodes: int | None = None, fabric: FabricSpec | None = None,
                  min_gpus: int | None = None, flag: str = "topology") -> Topology:
    """A topology from a built-in name or a TOML file.

    For a node file, ``nodes`` copies are joined by ``fabric`` (default rail-optimized);
    ``nodes`` defaults to enough nodes for ``min_gpus`` GPUs (or 1). For a cluster file, ``nodes`` and ``fabric`` override the file's.
    A graph file is taken as it is (``nodes`` must then be None).
    """
    f = TomlFile(_resolve(name_or_path, flag))
    data = f.data
    f.check_keys(data, {"name", "description", "node", "cluster", "fabric", "device", "link"}, "")
    if "device" in data or "link" in data:
        dashes = "--" if flag.startswith("--") else ""  # name the command line's flags as the user typed them
        if nodes is not None:
            raise InputError(f"{dashes}nodes: got {nodes}; {f.path} is a device-by-device topology, so it fixes its own size")
        if fabric is not None:
            raise InputError(f"{dashes}fabric: got {fabric.type!r}; {f.path} is a device-by-device topology, "
                             "so it has its own links and no fabric to choose")
        return _parse_graph(f, data)
    _name(f, data, "name", "", "")  # a string, if given
    if "description" in data:
        f.string(data, "description", "")
    if "cluster" in data:
        c = f.table(data, "cluster")
        f.check_keys(c, {"name", "node", "nodes"}, "cluster.", required=("node", "nodes"))
        node_ref = f.string(c, "node", "cluster.")
        cname = _name(f, c, "name", "cluster.", "")
        n_file = int(f.number(c, "nodes", "cluster.", integer=True, positive=True))
        if "node" in data:
            spec = _parse_node(f, f.table(data, "node"))
        else:
            ref = Path(node_ref)
            if not ref.is_absolute() and ref.suffix == ".toml":
                ref = f.path.parent / ref
            try:
                spec = load_node_spec(str(ref))
            except InputError as exc:
                raise f.error("cluster.node", str(exc)) from None
        n = nodes if nodes is not None else n_file
        fab = fabric or _parse_fabric(f, f.table(data, "fabric"))
        try:
            return build_cluster(spec, n, fab, name=(cname or None) if nodes is None else None)
        except InputError as exc:
            raise _in_file(f, exc) from None
    if "node" in data:
        spec = _parse_node(f, f.table(data, "node"))
        fab = fabric or _parse_fabric(f, f.table(data, "fabric"))
        if nodes is None:
            nodes = max(1, math.ceil((min_gpus or 1) / spec.gpus))
        try:
            return build_cluster(spec, nodes, fab)
        except InputError as exc:
            raise _in_file(f, exc) from None
    raise InputError(f"{f.path}: no [node], [cluster] or [[device]] table; nothing to build")
