"""Clusters of several node kinds: A100 nodes beside H100 nodes on one fabric.

A cluster file may name several node files with a count each; the nodes of the first
kind come first (ranks 0 up), then the next kind's, and so on:

    [cluster]
    name = "a100-h100"
    node = ["dgx-a100", "dgx-h100"]
    nodes = [2, 2]

Every GPU carries its node's ``gpu_profile`` (``sim.inputs.mixed_gpus`` reads it); each NIC
joins the fabric at its own node's NIC bandwidth, and a leaf's uplinks carry the sum of
its downlinks over the oversubscription (``sim.inputs.topology_nodes.add_fabric``). All
nodes must reach the fabric over the same kind of link (InfiniBand or Ethernet).
"""

from __future__ import annotations

import networkx as nx

from sim.errors import InputError
from sim.inputs.topology import Topology
from sim.inputs.topology_nodes import FabricSpec, NodeSpec, add_fabric, add_node, check_cluster_size


def build_mixed_cluster(groups: list[tuple[NodeSpec, int]], fabric: FabricSpec = FabricSpec(),
                        name: str = "mixed") -> Topology:
    """``groups`` (node spec, how many) one after the other, joined by ``fabric``."""
    specs = [spec for spec, count in groups for _ in range(count)]
    gpus = sum(s.gpus for s in specs)
    check_cluster_size(len(specs), max(s.gpus for s in specs))
    if gpus > 0 and len(specs) > 1:
        kinds = sorted({s.nic_kind for s in specs})
        if len(kinds) > 1 or any(s.nics < 1 for s in specs):
            raise InputError(f"cluster.node: got {', '.join(s.name for s, _ in groups)}; nodes of one cluster need "
                             f"at least one NIC each, all of one kind (got {', '.join(kinds)})")
    missing = [s.name for s, _ in groups if not s.gpu_profile]
    if missing:
        raise InputError(f"cluster.node: got {missing[0]!r} without a gpu_profile; in a cluster of several node "
                         "kinds every node file names its GPU profile (gpu_profile = \"h100-sxm\")")
    g = nx.Graph(gpu_profile=specs[0].gpu_profile)
    rank = 0
    for n, spec in enumerate(specs):
        add_node(g, spec, n, first_rank=rank)
        rank += spec.gpus
    if len(specs) > 1:
        add_fabric(g, specs, fabric)
    return Topology(g, name)
