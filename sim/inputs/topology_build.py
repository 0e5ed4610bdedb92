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

The builders (``NodeSpec``, ``FabricSpec``, ``build_cluster``) live in
``sim.inputs.topology_nodes`` and are re-exported here. Units are converted to SI here,
once.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import networkx as nx

from sim.errors import InputError
from sim.inputs.tomlio import TomlFile
from sim.inputs.topology import DEVICE_KINDS, LINK_KINDS, Topology
from sim.inputs.topology_mixed import build_mixed_cluster
from sim.inputs.topology_nodes import (  # noqa: F401 (re-exported: where builders were first)
    FABRICS, GB, MAX_CLUSTER_GPUS, OVERSUBSCRIPTION, US, FabricSpec, NodeSpec, add_fabric, add_link, add_node,
    build_cluster, build_node, check_cluster_size)


NODE_OF_GPU = {"a100-80gb": "dgx-a100", "h100-sxm": "dgx-h100", "h200": "dgx-h200", "b200": "dgx-b200",
               "gb200": "gb200-nvl72", "gb300": "gb300-nvl72"}
"""The built-in node of each built-in GPU profile (the default topology): its DGX, or for
GB200 the NVL72 rack, one 72-GPU NVLink domain."""


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


# ---------------------------------------------------------------------- TOML
_NODE_KEYS = {
    "name", "gpus", "gpu_profile", "nvlink_bandwidth_GBps", "nvlink_latency_us",
    "pcie_bandwidth_GBps", "pcie_latency_us", "nics", "nic_kind", "nic_bandwidth_GBps", "nic_latency_us",
    "nvlink_sharp", "host_link", "host_bandwidth_GBps", "host_latency_us", "gpus_per_host",
}
_FABRIC_KEYS = {"type", "nodes_per_leaf", "spines", "oversubscription", "switch_latency_us"}
_DEVICE_KEYS = {"id", "kind", "rank", "node", "gpu_profile"}
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
        **_host(f, t, p),
    )


def _host(f: TomlFile, t: dict, p: str) -> dict:
    """The GPU-host link keys: ``host_link`` pcie (default; the PCIe keys price it) or c2c
    (a Grace superchip: ``host_bandwidth_GBps`` per direction, ``gpus_per_host`` GPUs on it)."""
    link = f.string(t, "host_link", p, choices=("pcie", "c2c"), default="pcie")
    if link == "pcie":
        for key in ("host_bandwidth_GBps", "host_latency_us", "gpus_per_host"):
            if key in t:
                raise f.error(p + key, f"got {t[key]!r}; only with host_link = \"c2c\" (PCIe takes pcie_bandwidth_GBps)")
        return {}
    gpus = int(f.number(t, "gpus", p, integer=True, positive=True))
    per = int(f.number(t, "gpus_per_host", p, integer=True, positive=True, default=2))
    if gpus % per:
        raise f.error(p + "gpus_per_host", f"got {per}; expected a divisor of gpus ({gpus})")
    return dict(host_link="c2c", host_bandwidth_Bps=f.number(t, "host_bandwidth_GBps", p, positive=True) * GB,
                host_latency_s=f.number(t, "host_latency_us", p, default=0.5, minimum=0) * US, gpus_per_host=per)


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
        raise exc.in_file(f.path) from None


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
            if "gpu_profile" in d:  # (a mixed cluster: this GPU's profile; default the run's --gpu)
                attrs["gpu_profile"] = f.string(d, "gpu_profile", p)
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
        add_link(
            g, a, b, f.string(l, "kind", p, choices=LINK_KINDS),
            f.number(l, "bandwidth_GBps", p, positive=True) * GB,
            f.number(l, "latency_us", p, default=1.0, minimum=0) * US,
        )
    try:
        return Topology(g, _name(f, data, "name", "", f.path.stem))
    except InputError as exc:
        raise exc.in_file(f.path) from None


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


def _node_list(f: TomlFile, c: dict) -> tuple[list[str], list[int]]:
    """``cluster.node`` and ``cluster.nodes``: one node file and a count, or lists of equal
    length (a cluster of several node kinds, the nodes of each kind in turn)."""
    refs, counts = c["node"], c["nodes"]
    if not isinstance(refs, list):
        return [f.string(c, "node", "cluster.")], [int(f.number(c, "nodes", "cluster.", integer=True, positive=True))]
    if not refs or not all(isinstance(r, str) for r in refs):
        raise f.error("cluster.node", f"got {refs!r}; expected a node file name or a list of them")
    if not isinstance(counts, list) or len(counts) != len(refs) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in counts):
        raise f.error("cluster.nodes", f"got {counts!r}; expected a list of {len(refs)} integers >= 1, the nodes of "
                                       f"each kind in cluster.node")
    return refs, counts


def _cluster_node(f: TomlFile, node_ref: str, k: int | None) -> NodeSpec:
    """The node file a cluster file names (relative to the cluster file when a path)."""
    ref = Path(node_ref)
    if not ref.is_absolute() and ref.suffix == ".toml":
        ref = f.path.parent / ref
    try:
        return load_node_spec(str(ref))
    except InputError as exc:
        raise f.error("cluster.node" + (f"[{k}]" if k is not None else ""), str(exc)) from None


def load_node_spec(name_or_path: str) -> NodeSpec:
    f = TomlFile(_resolve(name_or_path))
    if "node" not in f.data:
        raise InputError(f"{f.path}: not a node file (it has no [node] table)", path=str(f.path))
    return _parse_node(f, f.table(f.data, "node"))


def load_topology(name_or_path: str, nodes: int | None = None, fabric: FabricSpec | None = None,
                  min_gpus: int | None = None, flag: str = "topology", gpus_per_node: int | None = None) -> Topology:
    """A topology from a built-in name or a TOML file.

    For a node file, ``nodes`` copies are joined by ``fabric`` (default rail-optimized);
    ``nodes`` defaults to enough nodes for ``min_gpus`` GPUs (or 1). For a cluster file, ``nodes`` and ``fabric`` override the file's.
    A graph file is taken as it is (``nodes`` must then be None).
    ``gpus_per_node`` (a node file only) uses that many GPUs of each node, at most the
    node's (``used_gpus``): a job on 64 GPUs of each 72-GPU NVL72 rack.
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
        refs, counts = _node_list(f, c)
        cname = _name(f, c, "name", "cluster.", "")
        if "node" in data and len(refs) == 1:
            specs = [_parse_node(f, f.table(data, "node"))]
        else:
            specs = [_cluster_node(f, ref, k if len(refs) > 1 else None) for k, ref in enumerate(refs)]
        fab = fabric or _parse_fabric(f, f.table(data, "fabric"))
        try:
            if len(specs) > 1:
                if nodes is not None:
                    dashes = "--" if flag.startswith("--") else ""
                    raise InputError(f"{dashes}nodes: got {nodes}; {f.path} lists nodes of {len(specs)} kinds "
                                     f"({' + '.join(f'{n} x {s.name}' for s, n in zip(specs, counts))}), so it "
                                     "fixes its own size")
                return build_mixed_cluster(list(zip(specs, counts)), fab, name=cname or f.path.stem)
            n = nodes if nodes is not None else counts[0]
            return build_cluster(specs[0], n, fab, name=(cname or None) if nodes is None else None)
        except InputError as exc:
            raise exc.in_file(f.path) from None
    if "node" in data:
        spec = used_gpus(_parse_node(f, f.table(data, "node")), gpus_per_node, flag)
        fab = fabric or _parse_fabric(f, f.table(data, "fabric"))
        if nodes is None:
            nodes = max(1, math.ceil((min_gpus or 1) / spec.gpus))
        try:
            return build_cluster(spec, nodes, fab)
        except InputError as exc:
            raise exc.in_file(f.path) from None
    raise InputError(f"{f.path}: no [node], [cluster] or [[device]] table; nothing to build", path=str(f.path))


def used_gpus(spec: NodeSpec, gpus: int | None, flag: str = "topology") -> NodeSpec:
    """``spec`` with only its first ``gpus`` GPUs (and as many of its NICs) in use: a job
    that takes part of each NVLink domain (64 GPUs of an NVL72 rack, so that groups of 16,
    32 or 64 stay inside one rack); the idle GPUs carry no traffic and are left out.
    ``gpus`` None or the node's own count: ``spec`` itself."""
    if gpus is None or gpus == spec.gpus:
        return spec
    if gpus > spec.gpus:
        dashes = "--" if flag.startswith("--") else ""
        raise InputError(f"{dashes}gpus-per-node: got {gpus}; node {spec.name} has {spec.gpus} GPUs in its NVLink "
                         f"domain; allowed: 1..{spec.gpus}")
    return replace(spec, name=f"{spec.name}-{gpus}of{spec.gpus}", gpus=gpus, nics=min(spec.nics, gpus))
