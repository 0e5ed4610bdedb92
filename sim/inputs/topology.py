"""The cluster as a networkx graph, and routes through it.

A topology is an undirected ``networkx.Graph`` whose nodes are devices with a ``kind``
(``gpu``, ``nvswitch``, ``nic``, ``switch``, ``cpu``) and whose edges are full-duplex
links with a ``kind`` (``nvlink``, ``pcie``, ``ib``, ``ethernet``), a per-direction
``bandwidth_Bps`` and a ``latency_s``. GPUs carry a ``rank`` (0..n-1, the index programs
and collectives use) and a ``node`` (the host they sit in).

Routing picks a shortest path by hop count. GPUs and CPUs are endpoints only: traffic
never transits through them on its way elsewhere, except through a GPU that relays for
NCCL's PXN (below). Paths are found between the transit devices next
to the two GPUs, with a bidirectional search and two small balls around the ends, so a
route costs little even on clusters of thousands of nodes. Where several shortest paths exist (ECMP through different spines),
the choice is a deterministic hash of the (source, destination) pair, so the same
input always gives the same routes and different pairs spread over the spines.

PXN (PCI x NVLink, NCCL 2.12+; ``pxn_level``): a send to a GPU of another node leaves
by the NIC of the sender's node that serves the GPU with the destination's local index
(the destination's rail), reached over NVLink through the GPU that NIC is local to (the
relay, NCCL's "proxy rank"); the receiver always receives on its own NIC. That is
``ncclTopoGetNetDev`` for point-to-point connections (``src/graph/search.cc``: the local
NIC of the local rank with the peer's ``nvmlDev``, under ``NCCL_P2P_PXN_LEVEL``), the
relay being ``ncclTopoGetLocalGpu`` (the first GPU whose own NIC it is) and receives
staying local (``src/transport/net.cc``, "We don't support PXN on receive yet").
Level 0 (or ``NCCL_PXN_DISABLE=1``) sends on the sender's own NIC; level 1 ("use PXN
if needed") relays only when the sender does not reach that NIC itself; level 2
(NCCL's default, "as much as possible to maximize aggregation") always sends through
the NIC's first GPU, even when the sender shares that NIC. On a rail fabric a cross-rail
send then takes NVLink and one rail instead of climbing to a spine. Ring, tree and
hierarchical collectives join GPUs of one local index across nodes already, so PXN
changes none of their hops. Trainsim relays only on a topology with rails (``has_rails``:
some node's NICs hang off different switches): on a fat-tree, where all NICs of a node
reach one leaf, the relay would only change which of two equal links to the same switch
carries the bytes, and routes stay on the sender's own NIC.

Builders for DGX-style nodes and rail-optimized or fat-tree clusters, and the TOML
loader, live in ``sim.inputs.topology_build``.
"""

from __future__ import annotations

import copy
import math
import zlib

import networkx as nx

from sim.errors import InputError

DEVICE_KINDS = ("gpu", "nvswitch", "nic", "switch", "cpu")
LINK_KINDS = ("nvlink", "pcie", "ib", "ethernet")

Link = tuple[str, str]  # a directed link (from device, to device)

PXN_LEVELS = (0, 1, 2)
"""What ``NCCL_P2P_PXN_LEVEL`` takes (``src/graph/search.cc``): 0 no PXN for point-to-point,
1 PXN where needed, 2 PXN as much as possible (NCCL's default)."""
DEFAULT_PXN_LEVEL = 2
"""NCCL's default ``NCCL_P2P_PXN_LEVEL`` (``NCCL_PARAM(P2pPxnLevel, "P2P_PXN_LEVEL", 2)``,
``src/graph/search.cc``), with ``NCCL_PXN_DISABLE=0`` (``src/graph/paths.cc``)."""


class Topology:
    """A validated cluster graph with GPU ranks, routes and link attributes.

    ``graph`` is the networkx graph (undirected; each edge is a full-duplex link whose
    two directions carry ``bandwidth_Bps`` each, independently).
    """

    def __init__(self, graph: nx.Graph, name: str = "custom", pxn_level: int = DEFAULT_PXN_LEVEL):
        self.graph = graph
        self.name = name
        self.pxn_level = pxn_level
        """PXN for sends between nodes (module doc): 0 off, 1 where needed, 2 as much as possible."""
        self._validate()
        gpus = sorted(
            (d["rank"], n) for n, d in graph.nodes(data=True) if d["kind"] == "gpu"
        )
        self.gpus: list[str] = [n for _, n in gpus]
        self._route_cache: dict[tuple[int, int], tuple[Link, ...]] = {}
        self._core: nx.Graph | None = None
        self._hops: dict[tuple, int | None] = {}  # (u, v) -> hops between them in the core graph
        self._bfs: dict[tuple, list[set]] = {}  # (u, cutoff) -> nodes by distance from u
        self._stems: dict[str, str] = {}
        self._twins: dict[str, str] = {}  # core device -> the first met with its very neighbours (_twin)
        self._twin_of: dict[frozenset, str] = {}
        self._ends: dict[str, list] = {}  # GPU -> its core neighbours, with their link's width and kind (_core_ends)
        self._stem_ends: dict[str, list] = {}  # GPU -> the same with their stems and twins (_end_stems)
        self._meets: dict[tuple, list] = {}  # (levels' sources and distances) -> nodes in both, sorted (_mids)
        self._steps: dict[tuple, list] = {}  # (source, cutoff, distance, node) -> its next hops towards the source
        self._between: dict[tuple, list] = {}  # (switch, switch) two hops apart -> the half-way nodes (_hung_path)
        self._nics: dict[str, list[str]] = {}  # GPU -> its NICs (_nics_of)
        self._firsts: dict[str, str] = {}  # NIC -> the first GPU whose own NIC it is (_pxn_relay)
        self._vias: dict[int, dict[int, int | None]] = {}  # src -> destination's local index -> the same
        self._rank_locals: list[int] | None = None  # rank -> its local index (_pxn_relay)
        self._rails: bool | None = None
        self._members: dict[int, list[str]] = {}  # node -> its GPUs in rank order
        self._node_list: list[int] | None = None  # rank -> its node (node_of)
        self._by_node: dict[int, dict[int, str]] = {}  # node -> its GPUs by local index
        self._pxn_copies: dict[int, Topology] = {}  # PXN level -> this topology at that level (``with_pxn``)
        self.memo: dict = {}
        """Values derived from this topology's graph and routes by other layers (NCCL's tuner's
        choices: ``sim.engine.tuner``), kept with it so that every simulation on it (a fit's
        many) reuses them; a copy with other routes (``with_pxn``) starts its own."""

    # ----------------------------------------------------------------- validation
    def _validate(self) -> None:
        g = self.graph
        ranks = []
        for n, d in g.nodes(data=True):
            kind = d.get("kind")
            if kind not in DEVICE_KINDS:
                raise InputError(
                    f"topology {self.name}: device {n!r}: kind: got {kind!r}; allowed: {', '.join(DEVICE_KINDS)}"
                )
            if kind == "gpu":
                for key in ("rank", "node"):
                    v = d.get(key)
                    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                        raise InputError(
                            f"topology {self.name}: gpu {n!r}: {key}: got {v!r}; expected an integer >= 0"
                        )
                ranks.append(d["rank"])
        if not ranks:
            raise InputError(f"topology {self.name}: has no device of kind 'gpu'")
        if sorted(ranks) != list(range(len(ranks))):
            raise InputError(
                f"topology {self.name}: gpu ranks: got {sorted(ranks)[:8]}...; expected each of 0..{len(ranks) - 1} exactly once"
            )
        for u, v, d in g.edges(data=True):
            where = f"topology {self.name}: link {u!r}-{v!r}"
            if d.get("kind") not in LINK_KINDS:
                raise InputError(f"{where}: kind: got {d.get('kind')!r}; allowed: {', '.join(LINK_KINDS)}")
            bw = d.get("bandwidth_Bps")
            if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not bw > 0 or math.isnan(bw):
                raise InputError(f"{where}: bandwidth_Bps: got {bw!r}; expected a number > 0")
            lat = d.get("latency_s")
            if isinstance(lat, bool) or not isinstance(lat, (int, float)) or not (0 <= lat < math.inf):
                raise InputError(f"{where}: latency_s: got {lat!r}; expected a finite number >= 0")

    # ------------------------------------------------------------------ queries
    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    def gpu(self, rank: int) -> str:
        """The device id of the GPU with this rank."""
        if not 0 <= rank < len(self.gpus):
            raise InputError(f"rank: got {rank}; topology {self.name} has ranks 0..{len(self.gpus) - 1}")
        return self.gpus[rank]

    def node_of(self, rank: int) -> int:
        """The host (node index) a GPU rank sits in."""
        nodes = self._node_list
        if nodes is None:
            nodes = self._node_list = [self.graph.nodes[n]["node"] for n in self.gpus]
        if not 0 <= rank < len(nodes):
            self.gpu(rank)  # (its error)
        return nodes[rank]

    @property
    def gpus_per_node(self) -> int:
        counts: dict[int, int] = {}
        for n in self.gpus:
            h = self.graph.nodes[n]["node"]
            counts[h] = counts.get(h, 0) + 1
        return max(counts.values())

    @property
    def num_nodes(self) -> int:
        return len({self.graph.nodes[n]["node"] for n in self.gpus})

    def link(self, u: str, v: str) -> dict:
        """Attributes (kind, bandwidth_Bps, latency_s) of the link between u and v."""
        return self.graph.edges[u, v]

    # ------------------------------------------------------------------ routing
    def _core_graph(self) -> nx.Graph:
        """The devices that may carry transit traffic (all but GPUs and CPUs)."""
        if self._core is None:
            keep = [n for n, d in self.graph.nodes(data=True) if d["kind"] not in ("gpu", "cpu")]
            self._core = self.graph.subgraph(keep).copy()
        return self._core

    def route(self, src: int, dst: int) -> tuple[Link, ...]:
        """The directed links a transfer from GPU ``src`` to GPU ``dst`` crosses: through
        the PXN relay (``relay``) where there is one, else the shortest route."""
        key = (src, dst)
        cached = self._route_cache.get(key)
        if cached is not None:
            return cached
        via = self.relay(src, dst)
        if via is None:
            links = self._direct(src, dst)
        else:
            links = self._direct(src, via) + self._direct(via, dst)
        self._route_cache[key] = links
        return links

    # ------------------------------------------------------------------ PXN
    def with_pxn(self, level: int) -> "Topology":
        """This topology with PXN at ``level`` (``PXN_LEVELS``; the module doc): the same
        graph and searches, routes of its own; ``self`` when the level is already that."""
        if level not in PXN_LEVELS:
            raise InputError(field="nccl_p2p_pxn_level", value=level,
                             allowed=f"allowed: {', '.join(map(str, PXN_LEVELS))}", setting="nccl_p2p_pxn_level")
        if level == self.pxn_level:
            return self
        other = self._pxn_copies.get(level)  # (one copy per level: its routes and memo serve every run on it)
        if other is None:
            self._pxn_copies.setdefault(self.pxn_level, self)
            other = self._pxn_copies[level] = copy.copy(self)  # (sharing _pxn_copies: the same graph)
            other.pxn_level = level
            other._route_cache, other._vias, other.memo = {}, {}, {}
        return other

    def has_rails(self) -> bool:
        """Whether some node's NICs hang off different switches (a rail-optimized fabric):
        only there does PXN change a route (module doc)."""
        if self._rails is None:
            g = self.graph
            switches: dict[int, set] = {}
            for n, d in g.nodes(data=True):
                if d["kind"] == "nic":
                    ups = frozenset(m for m in g.neighbors(n) if g.nodes[m]["kind"] == "switch")
                    # (a NIC's node: its own attribute, or, in a graph file, its GPUs')
                    node = d.get("node", next((g.nodes[m]["node"] for m in sorted(g.neighbors(n))
                                               if g.nodes[m]["kind"] == "gpu"), None))
                    if ups:
                        switches.setdefault(node, set()).add(ups)
            self._rails = any(len(v) > 1 for v in switches.values())
        return self._rails

    def relay(self, src: int, dst: int) -> int | None:
        """The rank of the GPU a send from ``src`` to ``dst`` goes through under PXN (NCCL's
        proxy rank; module doc), or None when it goes straight: PXN off, the same node, no
        rails, no GPU of the destination's local index on the sender's node, or the sender
        itself sending by that NIC."""
        if self.pxn_level > 0 and src != dst and self.node_of(src) != self.node_of(dst) and self.has_rails():
            return self._pxn_relay(src, dst)  # (kept per sender and local index: _vias)
        return None

    def _pxn_relay(self, src: int, dst: int) -> int | None:
        """``relay`` between nodes: it depends on the destination through its local index
        only, so it is worked out once per (sender, local index)."""
        locals_ = self._rank_locals
        if locals_ is None:
            locals_ = self._rank_locals = [self._local_index(x) for x in self.gpus]
        local = locals_[dst]
        mine = self._vias.get(src)
        if mine is None:
            mine = self._vias[src] = {}
        via = mine.get(local, mine)
        if via is mine:
            via = mine[local] = self._pxn_relay_to(src, local)
        return via

    def _pxn_relay_to(self, src: int, local: int) -> int | None:
        g = self.graph
        s = self.gpu(src)
        peer = self._local_gpus(g.nodes[s]["node"]).get(local)
        nics = self._nics_of(peer) if peer is not None else []
        if not nics:
            return None
        nic = nics[0]
        if self.pxn_level == 1 and nic in self._nics_of(s):
            return None  # ("if needed": the sender reaches that NIC on its own PCIe)
        first = self._firsts.get(nic)
        if first is None:
            first = self._firsts[nic] = min((self._local_index(x), x) for x in g.neighbors(nic)
                                            if g.nodes[x]["kind"] == "gpu" and self._nics_of(x)[:1] == [nic])[1]
        return None if first == s else g.nodes[first]["rank"]

    def _local_index(self, gpu: str) -> int:
        """A GPU's index inside its node (NCCL's ``nvmlDev``): its ``local`` attribute, else
        its place among its node's GPUs by rank."""
        d = self.graph.nodes[gpu]
        if "local" in d:
            return d["local"]
        return self._node_members()[d["node"]].index(gpu)

    def _local_gpus(self, node: int) -> dict[int, str]:
        """The GPUs of ``node`` by local index."""
        got = self._by_node.get(node)
        if got is None:
            got = self._by_node[node] = {self._local_index(x): x for x in self._node_members()[node]}
        return got

    def _node_members(self) -> dict[int, list[str]]:
        """Every node's GPUs in rank order (made once)."""
        if not self._members:
            for x in self.gpus:
                self._members.setdefault(self.graph.nodes[x]["node"], []).append(x)
        return self._members

    def _nics_of(self, gpu: str) -> list[str]:
        """The NICs a GPU reaches on its own PCIe, in name order (its own NIC first)."""
        got = self._nics.get(gpu)
        if got is None:
            g = self.graph
            got = self._nics[gpu] = sorted(n for n in g.neighbors(gpu) if g.nodes[n]["kind"] == "nic")
        return got

    def _direct(self, src: int, dst: int) -> tuple[Link, ...]:
        """The shortest route from GPU ``src`` to GPU ``dst`` (no relay)."""
        if src == dst:
            return ()
        s, d = self.gpu(src), self.gpu(dst)
        h = zlib.crc32(f"{src}->{dst}".encode())
        if self.graph.has_edge(s, d):
            path = [s, d]
        else:
            path = [s, *self._core_path(s, d, h), d]
        return tuple(zip(path[:-1], path[1:]))

    def _core_path(self, s: str, d: str, h: int) -> list[str]:
        """A shortest path between the transit devices next to GPUs s and d; among
        equal ones, a deterministic choice by the hash ``h`` (ECMP). What a pair's choice
        is made from (hops, meeting points, next hops) is kept per switch and distance, not
        per pair (``_core_hops``, ``_mids``, ``_walk_to``)."""
        best, ends = None, []
        lasts = self._end_stems(d)
        hops, core_hops = self._hops, self._core_hops
        for a, ra, ta, hung_a, width_a, kind_a, open_a in self._end_stems(s):
            for b, rb, tb, hung_b, width_b, kind_b, _ in lasts:
                # _core_hops(a, b), its usual cases inline (the rest through it)
                if a == b or ra == b or rb == a:
                    n = core_hops(a, b)
                elif ta != tb:
                    n = hops.get((ta, tb), hops)
                    if n is hops:
                        n = core_hops(a, b)
                    elif n is not None:
                        n += hung_a + hung_b
                elif ra == rb:
                    n = hung_a + hung_b
                else:
                    n = 2 + hung_a + hung_b if open_a else None
                if n is None:
                    continue
                # Fewest hops first; among those, the widest links out of s and into d,
                # then the better kind of link, so GPUs of a node that share a NIC talk
                # through the NVSwitch, not over PCIe.
                score = (n, -min(width_a, width_b), max(kind_a, kind_b))
                if best is None or score < best:
                    best, ends = score, [(a, b, ra, rb)]
                elif score == best:
                    ends.append((a, b, ra, rb))
        if best is None:
            raise InputError(f"topology {self.name}: no route from {s} to {d}")
        best = best[0]
        a, b, ra, rb = ends[h % len(ends)]  # (_pick)
        if best == 0:
            return [a]
        hung = self._hung_path(a, b, best, h, ra, rb)
        if hung is not None:
            return hung
        # Nodes on shortest a-b paths: half-way nodes x with dist(a, x) = m and
        # dist(x, b) = best - m; then walk back to a and on to b, one hop at a time.
        m = (best + 1) // 2
        mid = _pick(self._mids(a, m, b, best - m), h)
        return self._walk_to(a, m, mid, h)[::-1] + self._walk_to(b, best - m, mid, h)[1:]

    def _hung_path(self, a: str, b: str, hops: int, h: int, ra: str | None = None,
                   rb: str | None = None) -> list[str] | None:
        """The path the search below finds between ``a`` and ``b``, ``hops`` apart, when
        both hang off a switch (their stems: a NIC on its leaf) and the two switches are
        one, or two hops apart (two leaves of a fabric); else None. Then the half-way
        nodes are the two switches' common neighbours (``_mids``, kept per pair of
        switches), and the walks back from one of them to each end have one option a hop
        (``_walk_to``): the route is the ends, their switches and the neighbour that hash
        ``h`` picks, as the search would pick it, without its per-pair steps. (``ra``,
        ``rb``: the stems of ``a`` and ``b``, where the caller has them.)"""
        if ra is None or rb is None:
            ra, rb = self._stem(a), self._stem(b)
        if ra == a or rb == b:
            return None
        if ra == rb:
            return [a, ra, b] if hops == 2 else None
        if hops != 4:
            return None
        key = (ra, rb)
        mids = self._between.get(key)
        if mids is None:  # (neither end is a neighbour of the other's switch: the same for all that hang there)
            mids = self._between[key] = self._mids(a, 2, b, 2)
        return [a, ra, mids[h % len(mids)], rb, b]  # (_pick)

    def _end_stems(self, gpu: str) -> list[tuple[str, str, str, int, float, int, bool]]:
        """``_core_ends`` with each device's stem, its stem's twin, whether it hangs off
        its stem (1 or 0) and whether its stem has a core neighbour, what ``_core_hops``
        and ``_core_path`` read of it (kept per GPU)."""
        got = self._stem_ends.get(gpu)
        if got is None:
            adj = self._core_graph().adj
            got = self._stem_ends[gpu] = [(a, r, self._twin(r), int(r != a), w, k, len(adj[r]) > 0)
                                          for a, w, k in self._core_ends(gpu) for r in (self._stem(a),)]
        return got

    def _core_ends(self, gpu: str) -> list[tuple[str, float, int]]:
        """The core devices next to ``gpu`` in name order, each with its link's bandwidth
        and its kind's rank in ``_KIND_ORDER`` (kept per GPU)."""
        got = self._ends.get(gpu)
        if got is None:
            core, g = self._core_graph(), self.graph
            got = self._ends[gpu] = [(a, g.edges[gpu, a]["bandwidth_Bps"], _KIND_ORDER.get(g.edges[gpu, a]["kind"], 9))
                                     for a in sorted(n for n in g.neighbors(gpu) if n in core)]
        return got

    def _side(self, u: str, k: int) -> tuple[str, int, list[set]]:
        """What ``_core_levels(u, k)`` is made from: (source, shift, levels), the levels of
        ``u``'s stem one hop further out without ``u`` (shift 1) when it hangs off one and
        ``k > 0``, else ``u``'s own (shift 0)."""
        r = self._stem(u)
        if r == u or k == 0:
            return u, 0, self._core_levels(u, k)
        return r, 1, self._core_levels(r, k - 1)

    def _mids(self, a: str, m: int, b: str, n: int) -> list[str]:
        """The nodes ``m`` hops from ``a`` and ``n`` from ``b``, sorted (``_core_levels(a, m)[m]``
        and ``_core_levels(b, n)[n]`` met), from their stems' levels, kept per stem."""
        ra, sa, la = self._side(a, m)
        rb, sb, lb = self._side(b, n)
        key = (ra, m - sa, rb, n - sb)
        both = self._meets.get(key)
        if both is None:
            x, y = la[m - sa], lb[n - sb]
            both = self._meets[key] = sorted(v for v in x if v in y)
        if sa or sb:  # (u is not in the levels made from its stem)
            return [v for v in both if not (sa and v == a) and not (sb and v == b)]
        return both

    def _walk_to(self, u: str, k: int, x: str, h: int) -> list[str]:
        """``_walk`` over ``_core_levels(u, k)``: from ``x`` (``k`` hops from ``u``) back to
        ``u``, one hop at a time; among equal next hops, the choice by hash ``h``. A node's
        next hops are kept per (stem, distance)."""
        r, shift, levels = self._side(u, k)
        adj = self._core_graph().adj
        path = [x]
        while k > 0:
            j = k - 1 - shift  # (the level below, in the levels of r)
            if j < 0:  # (u itself, one hop from its stem)
                options = [u] if u in adj[x] else []
            else:
                key = (r, len(levels), j, x)
                options = self._steps.get(key)
                if options is None:
                    below, near = levels[j], adj[x]
                    if len(below) <= len(near):
                        options = [y for y in below if y in near]
                    else:
                        options = [y for y in near if y in below]
                    options = self._steps[key] = sorted(options)
                if shift:
                    options = [y for y in options if y != u]
            x = _pick(options, h)
            path.append(x)
            k -= 1
        return path

    def _stem(self, u: str) -> str:
        """The one core neighbour of ``u`` if it has just one (a NIC's switch), else ``u``:
        distances from a NIC are its switch's plus one, so a large fabric's searches are
        made (and kept) once per switch instead of once per NIC."""
        r = self._stems.get(u)
        if r is None:
            adj = self._core_graph().adj[u]
            r = self._stems[u] = next(iter(adj)) if len(adj) == 1 else u
        return r

    def _core_hops(self, a: str, b: str) -> int | None:
        """Hops between a and b in the core graph (None: no path), through their stems,
        and between stems through their twins (``_twin``): a search per pair of twin
        classes, not per pair of switches (a rail fabric's leaves are all twins)."""
        if a == b:
            return 0
        ra, rb = self._stem(a), self._stem(b)
        if ra == b or rb == a:
            return 1
        if ra == rb:
            n = 0
        else:
            ta, tb = self._twin(ra), self._twin(rb)
            if ta == tb:  # (same neighbours, not each other's: two hops apart, if they have any)
                n = 2 if self._core_graph().adj[ra] else None
            else:
                key = (ta, tb)
                if key not in self._hops:
                    try:
                        n = len(nx.bidirectional_shortest_path(self._core_graph(), ta, tb)) - 1
                    except nx.NetworkXNoPath:
                        n = None
                    self._hops[key] = self._hops[(tb, ta)] = n  # (links go both ways: the way back is as long)
                n = self._hops[key]
        return None if n is None else n + (ra != a) + (rb != b)

    def _twin(self, u: str) -> str:
        """The first core device met with exactly ``u``'s neighbours (its class of false
        twins). Twins u, v are not adjacent (no device is its own neighbour) and every
        other device x is as far from u as from v (a path's first hop from one is a
        neighbour of the other), so hops between stems are hops between their twins'
        representatives, when the two classes differ."""
        t = self._twins.get(u)
        if t is None:
            t = self._twins[u] = self._twin_of.setdefault(frozenset(self._core_graph().adj[u]), u)
        return t

    def _core_levels(self, u: str, cutoff: int) -> list[set]:
        """Core nodes by distance from ``u`` up to ``cutoff`` (``levels[k]``: k hops away),
        from its stem's (kept) when u hangs off one: u at 0, the stem at 1, then the
        stem's levels one further out, without u."""
        r = self._stem(u)
        if r == u or cutoff == 0:
            key = (u, cutoff)
            if key not in self._bfs:
                self._bfs[key] = _levels(nx.single_source_shortest_path_length(self._core_graph(), u, cutoff=cutoff))
            return self._bfs[key]
        inner = self._core_levels(r, cutoff - 1)
        return [{u}, *(level - {u} for level in inner)]

    def host_route(self, rank: int, to_host: bool = True) -> tuple[Link, ...]:
        """The links between GPU ``rank`` and its host CPU's memory, in the direction of the
        copy: its PCIe link, or on a Grace superchip its NVLink-C2C port and the C2C link the
        superchip's GPUs share (``sim.inputs.topology_nodes.add_node``)."""
        g = self.gpu(rank)
        path = [g]
        while True:
            cpus = sorted(n for n in self.graph.neighbors(path[-1])
                          if self.graph.nodes[n]["kind"] == "cpu" and n not in path)
            if not cpus:
                break
            path.append(cpus[0])
        if len(path) == 1:
            raise InputError(f"topology {self.name}: rank {rank} has no link to a device of kind 'cpu' "
                             "(optimizer and activation offload need one)")
        links = tuple(zip(path, path[1:]))
        return links if to_host else tuple((b, a) for a, b in reversed(links))

    def path_latency_s(self, src: int, dst: int) -> float:
        """Sum of the link latencies on the route from ``src`` to ``dst``."""
        return sum(self.graph.edges[u, v]["latency_s"] for u, v in self.route(src, dst))

    def bottleneck_Bps(self, src: int, dst: int) -> float:
        """The smallest per-direction bandwidth on the route (inf for src == dst)."""
        return min((self.graph.edges[u, v]["bandwidth_Bps"] for u, v in self.route(src, dst)), default=math.inf)

    def route_kinds(self, src: int, dst: int) -> tuple[str, ...]:
        """Link kinds along the route, e.g. ``('pcie', 'ib', 'ib', 'pcie')``."""
        return tuple(self.graph.edges[u, v]["kind"] for u, v in self.route(src, dst))

    # ------------------------------------------------------------------ export
    def write_graphml(self, path) -> None:
        """Write the graph as GraphML (through networkx) for other tools to read."""
        nx.write_graphml(self.graph, path)

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for _, d in self.graph.nodes(data=True):
            kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
        parts = ", ".join(f"{kinds[k]} {k}" for k in DEVICE_KINDS if k in kinds)
        return f"{self.name}: {self.num_nodes} node(s), {parts}, {self.graph.number_of_edges()} links"


def _levels(dist: dict) -> list[set]:
    """Nodes by their distance from a BFS source: ``levels[k]`` holds those k hops away."""
    levels: list[set] = [set() for _ in range(max(dist.values()) + 1)]
    for x, k in dist.items():
        levels[k].add(x)
    return levels


_KIND_ORDER = {"nvlink": 0, "pcie": 1, "ib": 2, "ethernet": 3}
"""Preference among link kinds when routes tie on hops and bandwidth."""


def _pick(candidates: list[str], h: int) -> str:
    return candidates[h % len(candidates)]


def check_pxn(topology: Topology, *, pxn_disable: bool, pxn_level: int, flag: str = "") -> None:
    """A PXN setting other than NCCL's default on a topology without rails (``has_rails``:
    one node, a fat-tree, one NIC a node) changes no route: an input error, one line naming
    the setting, its value and why (``flag``: ``"--"`` to name them as command-line flags)."""
    if topology.has_rails():
        return
    name, value = ("nccl_pxn_disable", True) if pxn_disable else ("nccl_p2p_pxn_level", pxn_level)
    if name == "nccl_p2p_pxn_level" and pxn_level == DEFAULT_PXN_LEVEL:
        return
    field = f"--{name.replace('_', '-')}" if flag == "--" else name
    raise InputError(field=field, value=value, setting=name,
                     allowed=f"it changes nothing on topology {topology.name}, which has no rails (no node whose NICs "
                             f"reach different switches): PXN only re-routes sends between nodes of a rail-optimized "
                             f"fabric; allowed: NCCL's default here (PXN on, level {DEFAULT_PXN_LEVEL}), or a rail "
                             f"fabric (--fabric rail, more than one node)")


def ranks_by_node(topology: Topology, ranks) -> dict[int, list[int]]:
    """``ranks`` grouped by the node they are on, nodes and members in order."""
    by_node: dict[int, list[int]] = {}
    for r in ranks:
        by_node.setdefault(topology.node_of(r), []).append(r)
    return {h: sorted(v) for h, v in sorted(by_node.items())}


def default_channels(topology: Topology, ranks) -> int:
    """Rings a ring collective over ``ranks`` runs at once, as NCCL's channels: one per
    group member on a node (one per NIC of a DGX node) when the group spans nodes, else one."""
    groups = ranks_by_node(topology, ranks)
    if len(groups) < 2:
        return 1
    return min(len(v) for v in groups.values())


def nvls_capable(topology, ranks) -> bool:
    """Every GPU of ``ranks`` hangs off an NVSwitch with NVLink SHARP."""
    return all(nvswitch_of(topology, r) is not None for r in ranks)


def nvswitch_of(topology, rank: int):
    """The NVLink-SHARP NVSwitch device next to GPU ``rank``, or None."""
    g = topology.graph
    gpu = topology.gpu(rank)
    for n in sorted(g.neighbors(gpu)):
        d = g.nodes[n]
        if d["kind"] == "nvswitch" and d.get("nvlink_sharp"):
            return n
    return None
