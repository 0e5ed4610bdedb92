"""NCCL's tree and NVLS algorithms as transfer steps (``sim.engine.algorithms``).

Tree all-reduce (NCCL's double binary tree, Sanders, Speck & Träff 2009): inside each
node the GPUs form a chain; across nodes the nodes form two complementary binary trees
(tree 0 in node order, tree 1 in reverse order, so a node that is interior in one is a
leaf in the other) and each tree carries half the data. Per channel c (one per GPU of a
node across nodes, as for rings) the chain of each node starts at local GPU c, whose NIC
(rail c) joins the node to the tree. Data is reduced up the chains and the tree and
broadcast back down, pipelined in chunks: as flows, every edge carries its share up and
down at once, and the pipeline's fill is a chain of zero-byte steps along the longest
path (leaf of the deepest chain to the root and back), which the data steps follow. On an
uncontended topology all-reduce then takes

    2·((g−1)·α_intra + ⌊log2 N⌋·α_inter) + (bytes on the busiest link) / bandwidth

the latency NCCL's tuner gives the tree (``2·((nRanks/nNodes−1)·intraLat +
log2i(nNodes)·interLat)``).

NVLS (NVLink SHARP, single node): GPU i reduce-scatters by asking the switch for its
reduced shard (multimem.ld_reduce: the switch reads shard i from every GPU) and
all-gathers by a multicast store of its shard (multimem.st). Per GPU: all-reduce sends
S + S/n to the switch and receives S/n + S; reduce-scatter sends S and receives S/n;
all-gather sends S/n and receives S. The two directions run at once (NCCL pipelines the
two halves), so all-reduce takes S(n+1)/n / B and busbw = 2(n−1)/(n+1)·B, B the rate a
GPU's NVLS traffic reaches (``nvls_efficiency`` of the line rate). The pipeline moves
chunks: the way back starts once the first round of chunks has gone out (``lead_bytes``,
``sim.engine.nccl_tuning.nvls_lead_bytes``), which a small message pays as latency
(under NCCL's tuning model, with a profile of a known architecture).

NVLS-tree (all-reduce across nodes): NVLS reduce-scatter inside each node, a tree
all-reduce of each GPU's shard (S/g) across nodes among the GPUs of the same local index
(one pair of trees per rail), NVLS all-gather inside each node.
"""

from __future__ import annotations

from sim.errors import InputError
from sim.inputs.topology import ranks_by_node


def _heap_parent(i: int) -> int | None:
    return None if i == 0 else (i - 1) // 2


def _tree_edges(heads: list[int], tree: int) -> list[tuple[int, int]]:
    """(child, parent) pairs of binary tree ``tree`` (0: node order, 1: reversed) over ``heads``."""
    order = heads if tree == 0 else heads[::-1]
    return [(order[i], order[_heap_parent(i)]) for i in range(1, len(order))]


def _latency_chain(b, path_up: list[int], label: str) -> list[int]:
    """Zero-byte steps up ``path_up`` (leaf first) and back down: the pipeline's fill."""
    prev: list[int] = []
    hops = list(zip(path_up[:-1], path_up[1:]))
    for src, dst in hops + [(d, s) for s, d in reversed(hops)]:
        prev = [b.add(src, dst, 0.0, prev, f"{label} latency")]
    return prev


def _longest_path(chains: list[list[int]], heads: list[int]) -> list[int]:
    """Leaf-to-root ranks through the deepest chain and tree 0's deepest node."""
    order = heads
    i = len(order) - 1
    up_tree = [order[i]]
    while i:
        i = _heap_parent(i)
        up_tree.append(order[i])
    node_chain = next(c for c in chains if c[0] == order[len(order) - 1])
    return node_chain[::-1] + up_tree[1:]


def tree_allreduce(b, ranks: list[int], nbytes: float, topology, channels: int, label: str = "tree") -> None:
    """Double binary tree all-reduce (module doc), ``channels`` trees pairs at once."""
    nodes = list(ranks_by_node(topology, ranks).values())
    trees = 2 if len(nodes) > 1 else 1
    gate = None
    for c in range(channels):
        chains = [m[c % len(m):] + m[:c % len(m)] for m in nodes]
        heads = [ch[0] for ch in chains]
        if gate is None:
            gate = _latency_chain(b, _longest_path(chains, heads), label)
        share = nbytes / (channels * trees)
        edges = [(ch[i + 1], ch[i]) for ch in chains for i in range(len(ch) - 1)]
        for t in range(trees):
            tag = f"{label} ch{c} t{t}"
            for child, parent in edges + _tree_edges(heads, t):
                b.add(child, parent, share, gate, f"{tag} reduce", latency_steps=0)
                b.add(parent, child, share, gate, f"{tag} broadcast", latency_steps=0)


def nvls_steps(b, ranks: list[int], op: str, nbytes: float, topology, label: str = "nvls", gate=(),
               pipelined: bool = True) -> None:
    """Each GPU's traffic to and from its NVLink-SHARP switch for ``op`` (module doc); with
    ``pipelined`` (single-node NVLS) the way back carries NVLS's chunked pipeline lead."""
    from sim.inputs.topology import nvswitch_of

    from sim.engine.nccl_tuning import nvls_lead_bytes

    n = len(ranks)
    up, down = {"allreduce": (nbytes * (n + 1) / n, nbytes * (n + 1) / n), "reducescatter": (nbytes, nbytes / n),
                "allgather": (nbytes / n, nbytes)}[op]
    lead = nvls_lead_bytes(nbytes, n, up) if pipelined else 0.0
    for r in ranks:
        sw = nvswitch_of(topology, r)
        gpu = topology.gpu(r)
        b.add_nvls(r, (gpu, sw), up, gate, f"{label} {op} to switch")
        b.add_nvls(r, (sw, gpu), down, gate, f"{label} {op} from switch", lead_bytes=lead)


def check_nvls(op: str, ranks: list[int], topology, algo: str, field: str = "algo") -> list[list[int]]:
    """The group's ranks by node, after checking ``algo`` (nvls, nvls_tree) can run; ``field``
    names it in an error (``--algo`` on the command line)."""
    from sim.inputs.topology import nvls_capable

    if op not in (("allreduce", "reducescatter", "allgather") if algo == "nvls" else ("allreduce",)):
        raise InputError(f"{field}: got {algo!r} for op {op!r}; {algo} runs "
                         + ("allreduce, reducescatter, allgather" if algo == "nvls" else "allreduce"))
    if not nvls_capable(topology, ranks):
        raise InputError(f"{field}: got {algo!r}; topology {topology.name} has no NVLink SHARP "
                         "(nvlink_sharp = false on its NVSwitch; H100/H200/B200/GB200 NVSwitch only); allowed: ring, tree, hierarchical")
    nodes = list(ranks_by_node(topology, ranks).values())
    if algo == "nvls" and len(nodes) > 1:
        raise InputError(f"{field}: got 'nvls' for a group on {len(nodes)} nodes; nvls runs inside one node "
                         "(across nodes: nvls_tree)")
    if algo == "nvls_tree":
        if len(nodes) < 2:
            raise InputError(f"{field}: got 'nvls_tree' for a group on one node; nvls_tree runs across nodes (one node: nvls)")
        if len({len(m) for m in nodes}) > 1:
            raise InputError(f"{field}: nvls_tree needs the same number of ranks on every node; got "
                             f"{sorted(len(m) for m in nodes)}")
    return nodes


def nvls_tree_allreduce(b, ranks: list[int], nbytes: float, topology) -> None:
    """NVLS inside each node, a double binary tree per rail across nodes (module doc)."""
    nodes = check_nvls("allreduce", ranks, topology, "nvls_tree")
    g = len(nodes[0])
    for members in nodes:
        nvls_steps(b, members, "allreduce", nbytes, topology, "nvls_tree intra", pipelined=False)
    for i in range(g):
        rail = [m[i] for m in nodes]
        gate = _latency_chain(b, _rail_path(rail), f"nvls_tree rail {i}")
        for t in range(2):
            for child, parent in _tree_edges(rail, t):
                for src, dst, what in ((child, parent, "reduce"), (parent, child, "broadcast")):
                    b.add(src, dst, nbytes / (2 * g), gate, f"nvls_tree rail {i} t{t} {what}", latency_steps=0)


def _rail_path(rail: list[int]) -> list[int]:
    i = len(rail) - 1
    path = [rail[i]]
    while i:
        i = _heap_parent(i)
        path.append(rail[i])
    return path
