"""Collectives as graphs of point-to-point transfers.

A collective is expanded into ``Transfer`` steps, each a point-to-point send of some
bytes that may start once the steps it depends on have finished. The network then
prices every step on the topology, so contention between steps (and with other traffic)
comes out of the link model rather than out of a formula. Pure functions, no SimPy.

Ring algorithms (as NCCL runs them, one channel): with n ranks and S bytes,
reduce-scatter and all-gather take n−1 steps of S/n each; all-reduce is reduce-scatter
then all-gather, 2(n−1) steps. A step from rank i to its ring successor needs the chunk
rank i received in the previous step, and goes after rank i's previous send on the same
connection. On an uncontended ring with per-step latency α and bandwidth B, all-reduce
therefore takes 2(n−1)(α + S/(nB)) (Patarasuk & Yuan 2009; Thakur et al. 2005).

Hierarchical all-reduce (as for multi-node DGX clusters): ring reduce-scatter inside
each node (g GPUs, S/g per GPU), ring all-reduce of each GPU's 1/g shard across nodes
among the GPUs with the same local index (one ring per rail, all rails in parallel),
then ring all-gather inside each node. Each NIC then carries 2(N−1)/N · S/g bytes instead
of a flat ring's 2(n−1)/n · S/k (k channels). The buffer is cut into up to ``channels``
pieces (of at least ``PIPELINE_PIECE_BYTES``) that go through the three phases as a
pipeline: a connection sends one piece's steps after the previous piece's.

Ring order follows the topology: GPUs of one node are neighbours, and successive nodes
are walked in alternating directions (0..g−1, then g−1..0, ...), so that every
inter-node hop joins two GPUs with the same local index, which share a rail.

Channels: like NCCL, a ring collective that spans nodes runs several rings at once
(one per GPU of a node by default, each carrying 1/k of the data), the ring of channel c
starting at local GPU c, so the inter-node hops of different channels use different
rails and every NIC carries traffic. Inside one node, or with ``channels=1``, it is the
single ring above; on an uncontended node, k channels take exactly as long as one.

Flows (the default collective model; ``fluid=True`` here): each hop of each ring channel
is one flow that carries all its steps' bytes, 2(n−1)/n·S/k for an all-reduce, in at
most ``FLOW_PIECES`` transfers one after another, each paying its steps' share of the
latencies; every hop starts at once and the collective ends with its last hop. On an
uncontended ring that is exactly the step-by-step time above, with n·k·FLOW_PIECES
transfers instead of 2(n−1)·n·k; under contention each hop shares its links max-min
fairly for as long as it runs (a hop on fast links may finish before the ring's slowest,
where lock-step rounds would pace it).

Broadcast is a pipelined chain from the root along each channel's ring: the buffer is
cut into pieces of at least ``BROADCAST_PIECE_BYTES`` (at most 8(n−2) of them) and piece
j+1 follows piece j hop by hop, so a large broadcast runs near the link bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.program.actions import ALGOS, FLOW_PIECES, OPS
from sim.errors import InputError
from sim.inputs.topology import Topology, default_channels, ranks_by_node

PIPELINE_PIECE_BYTES = 4 * 2**20
"""Hierarchical all-reduce: at least this much per pipelined piece."""
BROADCAST_PIECE_BYTES = 2**20
"""Chain broadcast: at least this much per piece. NCCL pipelines 512 KiB chunks; twice
that keeps a 1 GiB broadcast to about as many transfers as a 1 GiB ring all-reduce."""
BROADCAST_PIECES_PER_HOP = 8
"""A chain broadcast over n ranks uses at most this many pieces per hop beyond the first,
8(n−2): filling and draining the pipeline then costs at most 1/8 of S/B."""


@dataclass(frozen=True, slots=True)
class Transfer:
    """One step: ``nbytes`` from rank ``src`` to rank ``dst`` after steps ``deps``."""

    src: int
    dst: int
    nbytes: float
    deps: tuple[int, ...]
    label: str
    latency_steps: int = 1
    """How many times the route's latency the transfer pays (a fluid ring hop carries
    all its steps at once and pays each step's latency)."""
    path: tuple = ()
    """Directed device links to cross instead of the route from src to dst (NVLS: a
    GPU's link to its NVSwitch)."""
    nvls: bool = False
    """An NVLS transfer (``sim.engine.algorithms_nccl``): priced at the profile's NVLS
    efficiency and latency (``sim.engine.nccl``)."""
    lead_bytes: float = 0.0
    """NVLS, the way back from the switch: bytes its GPU sends to the switch before the
    first chunk comes back (NVLS's chunked pipeline, ``sim.engine.nccl_tuning``), which it
    waits for at the NVLS rate under NCCL's tuning model."""


def ring_order(topology: Topology, ranks, rotate: int = 0) -> list[int]:
    """Ranks ordered as a ring: by node, alternating direction inside successive nodes,
    each node's members rotated to start at position ``rotate`` (a channel's ring)."""
    order: list[int] = []
    for k, members in enumerate(ranks_by_node(topology, ranks).values()):
        c = rotate % len(members)
        members = members[c:] + members[:c]
        order.extend(members if k % 2 == 0 else reversed(members))
    return order


class _Builder:
    def __init__(self, fluid: bool = False):
        self.steps: list[Transfer] = []
        self.fluid = fluid

    def add(self, src, dst, nbytes, deps, label, latency_steps: int = 1) -> int:
        """A step from ``src`` to ``dst`` on its route, after ``deps``; its index."""
        self.steps.append(Transfer(src, dst, nbytes, tuple(sorted(set(deps))), label, latency_steps))
        return len(self.steps) - 1

    def add_nvls(self, rank, link: tuple, nbytes, deps, label, lead_bytes: float = 0.0) -> int:
        """An NVLS step of GPU ``rank`` over the one directed device ``link`` between it and
        its NVSwitch (``Transfer.path``, ``Transfer.nvls``, ``Transfer.lead_bytes``), after
        ``deps``; its index."""
        self.steps.append(Transfer(rank, rank, nbytes, tuple(sorted(set(deps))), label, 1, (link,), True, lead_bytes))
        return len(self.steps) - 1

    def ring(self, order: list[int], nsteps: int, chunk: float, label: str,
             ready: dict[int, list[int]] | None = None,
             after: dict[int, list[int]] | None = None) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """``nsteps`` ring steps of ``chunk`` bytes over ``order``.

        ``ready[r]`` lists steps that must finish before rank r's data is ready.
        ``after[r]`` lists an earlier piece's sends from rank r that this ring's first
        send must follow: a connection sends one piece after another, as NCCL does.
        Returns, per rank, the last step that delivered data to it (its result is then
        complete), and its last send.
        """
        n = len(order)
        ready, after = ready or {}, after or {}
        if self.fluid:
            # Each ring hop carries its steps in at most FLOW_PIECES transfers, each of
            # several steps' bytes paying their latencies, one after another.
            pieces = min(nsteps, FLOW_PIECES)
            recv, sends = {}, {}
            for i, r in enumerate(order):
                dst = order[(i + 1) % n]
                prev = list(ready.get(r, ())) + list(after.get(r, ()))
                done = 0
                for k in range(pieces):
                    steps = (nsteps * (k + 1)) // pieces - done
                    done += steps
                    idx = self.add(r, dst, chunk * steps, prev, f"{label} steps {done - steps}..{done - 1}",
                                   latency_steps=steps)
                    prev = [idx]
                sends[r] = [idx]
                recv[dst] = [idx]
            return recv, sends
        last_recv = {r: list(ready.get(r, ())) for r in order}
        sends: dict[int, list[int]] = {r: [] for r in order}
        for k in range(nsteps):
            new_recv = {}
            for i, r in enumerate(order):
                dst = order[(i + 1) % n]
                deps = last_recv[r] + (sends[r] if k else list(after.get(r, ())))
                idx = self.add(r, dst, chunk, deps, f"{label} step {k}")
                sends[r] = [idx]
                new_recv[dst] = [idx]
            last_recv = new_recv
        return last_recv, sends

    def rings(self, topology: Topology, ranks, nsteps: int, nbytes: float, label: str, channels: int) -> None:
        """``channels`` rings at once over ``ranks``, each moving 1/channels of the data."""
        n = len(ranks)
        for c in range(channels):
            tag = f"{label} ch{c}" if channels > 1 else label
            self.ring(ring_order(topology, ranks, rotate=c), nsteps, nbytes / (n * channels), tag)


def build(op: str, ranks, nbytes: float, topology: Topology, algo: str = "ring", root: int | None = None,
          channels: int | None = None, fluid: bool = False) -> list[Transfer]:
    """The transfer steps of collective ``op`` over ``ranks`` on ``topology``.

    ``nbytes`` is the buffer size as nccl-tests reports it: the full (per-rank) buffer
    for all-reduce, broadcast and all-to-all, the full gathered (or pre-scatter) buffer
    for all-gather and reduce-scatter; ``shift`` sends each rank's ``nbytes`` to the next
    rank of the group (in rank order, the last to the first). ``sendrecv`` takes ``ranks = (src, dst)``.
    ``channels`` (ring algorithms) defaults to ``default_channels``. With ``fluid``, each
    ring hop is one transfer of all its steps' bytes paying all their latencies: on an
    uncontended homogeneous ring that is exactly the step-by-step time, n transfers
    instead of n·steps, and contention still comes from the network (see the module doc).
    """
    if op not in OPS:
        raise InputError(f"op: got {op!r}; allowed: {', '.join(OPS)}")
    if algo not in ALGOS or algo == "auto":
        raise InputError(f"algo: got {algo!r}; allowed: {', '.join(a for a in ALGOS if a != 'auto')}")
    ranks = list(ranks)
    if len(set(ranks)) != len(ranks):
        raise InputError(f"group: got {ranks}; ranks in a collective must be distinct")
    if nbytes < 0:
        raise InputError(f"size: got {nbytes}; expected bytes >= 0")
    b = _Builder(fluid)
    n = len(ranks)
    if op == "sendrecv":
        if n != 2:
            raise InputError(f"group: got {ranks}; sendrecv takes exactly (src, dst)")
        b.add(ranks[0], ranks[1], nbytes, (), "sendrecv")
        return b.steps
    if n == 1:
        return []
    if channels is not None and (isinstance(channels, bool) or not isinstance(channels, int) or channels < 1):
        raise InputError(f"channels: got {channels!r}; expected an integer >= 1")
    if algo == "hierarchical":
        if op != "allreduce":
            raise InputError(f"algo: got 'hierarchical' for op {op!r}; hierarchical is implemented for allreduce only")
        pieces = channels or default_channels(topology, ranks)
        pieces = max(1, min(pieces, math.ceil(nbytes / PIPELINE_PIECE_BYTES)))
        _hierarchical_allreduce(b, ranks, nbytes, topology, pieces)
        return b.steps
    if algo in ("tree", "nvls", "nvls_tree"):
        from sim.engine import algorithms_nccl as nccl

        if algo == "tree":
            if op != "allreduce":
                raise InputError(f"algo: got 'tree' for op {op!r}; tree runs allreduce only (as in NCCL)")
            nccl.tree_allreduce(b, ranks, nbytes, topology, channels or default_channels(topology, ranks))
        elif algo == "nvls":
            nccl.check_nvls(op, ranks, topology, "nvls")
            nccl.nvls_steps(b, ranks, op, nbytes, topology)
        else:
            nccl.nvls_tree_allreduce(b, ranks, nbytes, topology)
        return b.steps
    if channels is None:
        channels = default_channels(topology, ranks)
    if op == "allreduce":
        b.rings(topology, ranks, 2 * (n - 1), nbytes, "allreduce", channels)
    elif op in ("reducescatter", "allgather"):
        b.rings(topology, ranks, n - 1, nbytes, op, channels)
    elif op == "broadcast":
        root = ranks[0] if root is None else root
        if root not in ranks:
            raise InputError(f"root: got {root}; not in the group {sorted(ranks)}")
        for c in range(channels):
            _ring_broadcast(b, ring_order(topology, ranks, rotate=c), nbytes / channels, root,
                            f"broadcast ch{c}" if channels > 1 else "broadcast")
    elif op == "alltoall":
        pairs, each = alltoall_pairs(ranks, nbytes)
        for r, q in pairs:
            b.add(r, q, each, (), "alltoall")
    elif op == "shift":  # each rank's buffer to the next in rank order (ring attention's exchange)
        order = sorted(ranks)
        for i, r in enumerate(order):
            b.add(r, order[(i + 1) % n], nbytes, (), "shift")
    return b.steps


def alltoall_pairs(ranks, nbytes: float) -> tuple[list[tuple[int, int]], float]:
    """An all-to-all's point-to-point sends: every (source, destination) pair of distinct
    ranks, in order, and the bytes of each, 1/n of a rank's buffer of ``nbytes``."""
    order = sorted(ranks)
    return [(r, q) for r in order for q in order if q != r], nbytes / len(order)


def broadcast_chunks(n: int, nbytes: float) -> int:
    """Pieces a chain broadcast over ``n`` ranks cuts ``nbytes`` into: one per
    ``BROADCAST_PIECE_BYTES`` (as NCCL pipelines fixed-size chunks), at most
    ``BROADCAST_PIECES_PER_HOP``·(n−2) (pieces only pay off when there is a hop to
    overlap with; the cap keeps the transfer count bounded), at least 1."""
    cap = BROADCAST_PIECES_PER_HOP * (n - 2)
    return max(1, min(math.ceil(nbytes / BROADCAST_PIECE_BYTES), cap))


def _ring_broadcast(b: _Builder, order: list[int], nbytes: float, root: int, label: str = "broadcast") -> None:
    """Pipelined chain from ``root`` along the ring: c chunks (``broadcast_chunks``)
    over n−1 hops. Across nodes ``build`` runs one chain per channel, each on its own
    channel's ring (so on its own rail) with 1/channels of the buffer, as NCCL does.

    Chunk j's hop k waits for chunk j's hop k−1 and chunk j−1's hop k, so on an
    uncontended chain it takes (n − 2 + c)(α + S/(cB)) = (n − 2 + c)α + S/B·(1 + (n−2)/c):
    for large buffers close to the (n−1)α + S/B that nccl-tests' broadcast busbw implies.
    """
    n = len(order)
    start = order.index(root)
    chain = order[start:] + order[:start]
    c = broadcast_chunks(n, nbytes)
    prev_hop: list[int | None] = [None] * (n - 1)  # last chunk's step on each hop
    for j in range(c):
        below = None
        for k in range(n - 1):
            deps = [d for d in (below, prev_hop[k]) if d is not None]
            below = b.add(chain[k], chain[k + 1], nbytes / c, deps, f"{label} chunk {j}")
            prev_hop[k] = below


def _hierarchical_allreduce(b: _Builder, ranks: list[int], nbytes: float, topology: Topology, chunks: int) -> None:
    """Intra-node reduce-scatter, inter-node all-reduce per rail, intra-node all-gather,
    pipelined over ``chunks`` pieces of the buffer: piece j+1 enters a phase as soon as
    piece j has left it on the same connections, so the phases overlap."""
    by_node = ranks_by_node(topology, ranks)
    sizes = sorted(len(v) for v in by_node.values())
    if sizes[0] != sizes[-1]:
        raise InputError(
            f"algo: hierarchical all-reduce needs the same number of ranks on every node; got {sizes}"
        )
    g = sizes[0]
    intra = list(by_node.values())
    # After a ring reduce-scatter, member i of every node holds the same shard (all nodes
    # use the same member order), so the rings across nodes join the members i.
    rails = [[members[i] for members in intra] for i in range(g)]
    n_nodes = len(intra)
    piece = nbytes / chunks
    sent: dict[str, dict[int, list[int]]] = {"rs": {}, "inter": {}, "ag": {}}
    for j in range(chunks):
        tag = f" chunk {j}" if chunks > 1 else ""
        ready: dict[int, list[int]] = {}
        if g > 1:
            for members in intra:
                recv, send = b.ring(members, g - 1, piece / g, "hier intra reducescatter" + tag, after=sent["rs"])
                ready.update(recv)
                sent["rs"].update(send)
        done = dict(ready)
        if n_nodes > 1:
            for i, rail in enumerate(rails):
                recv, send = b.ring(rail, 2 * (n_nodes - 1), piece / (g * n_nodes),
                                    f"hier inter allreduce rail {i}" + tag, ready=ready, after=sent["inter"])
                done.update(recv)
                sent["inter"].update(send)
        if g > 1:
            for members in intra:
                _, send = b.ring(members, g - 1, piece / g, "hier intra allgather" + tag, ready=done, after=sent["ag"])
                sent["ag"].update(send)
