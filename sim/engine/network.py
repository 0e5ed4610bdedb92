"""A flow-level network model on SimPy: transfers share links fairly.

Each transfer is a *flow* over the directed links of its route. It first spends the
route's latency (the sum of its links' ``latency_s``), then moves its bytes at a rate
set by **max-min fair sharing**: progressive filling raises every flow's rate together
until some link is full; the flows crossing that link are frozen at their share, and
filling continues for the rest (Bertsekas & Gallager, *Data Networks*, 6.5.2). Rates are
recomputed whenever a flow starts or ends, only for the flows connected to it through
shared links, and flows that start or end at the same instant are handled in one batch.
Without bundles, a component met again (as many flows on each route as before) takes the
rates worked out for it last time (``Network._rates``): a training step's gradient
buckets meet the same few components over and over.

So an uncontended transfer of S bytes takes ``latency + S / bottleneck_bandwidth``; two
flows over one link take twice as long as one; the two directions of a full-duplex link
are separate resources and do not slow each other.

A *bundle* (``Bundle``, ``start_bundle``) is many equal flows that start together and
move in step: an all-to-all's n(n−1) point-to-point sends as one flow per route latency
(``bundles``: sends whose routes' latencies differ do not start together). It crosses each
link with a weight, the number of its member flows routed over that link; its rate is
each member's, so on a link it takes ``weight`` shares of progressive filling and
``weight × rate`` of the capacity, as its members would if they all went at the
slowest one's pace (Bertsekas & Gallager's max-min with one rate per session, the
session here being the bundle's members together). Uncontended, it takes
``latency + S_member / min(capacity / weight)``: the most loaded link's bytes over its
capacity, which is when the members' slowest would end as separate flows. A bundle is
one flow's events however many members it has.

A link's usable capacity is its ``bandwidth_Bps`` times an optional per-kind efficiency
(e.g. from a calibrated hardware profile); the network knows nothing else about
hardware. Every completed transfer is recorded as a ``TransferRecord`` (the trace's,
``sim.results.trace``).

Timers go through ``sim.engine.kernel.Calls`` (a flow's latency, its finish at its
current rate, a re-allocation), so the network adds calls, not SimPy events, to the
event loop; ``transfer`` and ``transfer_host`` return SimPy events for callers that wait
on one.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from operator import attrgetter

import numpy as np

from simpy import Event

from sim.engine.kernel import Calls, Environment
from sim.inputs.topology import Topology
from sim.results.trace import TransferRecord

_tuple_new = tuple.__new__  # a TransferRecord without the named tuple's Python-level __new__
_new_object = object.__new__
_EPS = 1e-12
_MEDIA = ("ethernet", "ib", "pcie", "nvlink", "local")
"""A route's medium: the first of these that one of its links is (``local``: none is)."""


class Bundle:
    """Equal flows that move in step (module doc), made once per group and protocol:
    ``links`` the directed link ids its members cross, ``weights`` how many members cross
    each (integers, in ``links``' order), ``latency_s`` the longest member's route latency,
    ``bottleneck`` a member's rate alone on the network (min capacity / weight),
    ``records`` what a finished bundle leaves in the trace, as (source, destination,
    members, medium): one per source and medium, the members it sent that way together;
    ``carried`` the member bytes issued so far (a one-item list). ``all_links`` and
    ``all_weights`` keep every link it crosses (link ``l`` carried ``carried × weight``);
    ``Network.seal`` may fold the links no other flow can use into one link of its own."""

    __slots__ = ("links", "weights", "weight_of", "all_links", "all_weights", "latency_s", "bottleneck", "records",
                 "carried", "src", "dst", "tightest")

    def __init__(self, links, weights, latency_s, bottleneck, records, src, dst, capacity):
        self.all_links, self.all_weights = links, weights
        self.latency_s, self.bottleneck = latency_s, bottleneck
        self.records, self.src, self.dst = records, src, dst
        self.carried = [0.0]
        self.cross(links, weights, capacity)

    def cross(self, links, weights, capacity) -> None:
        """Cross ``links`` with ``weights`` in the flow model (all of them, or what ``seal`` leaves)."""
        self.links, self.weights = links, weights
        self.weight_of = dict(zip(links, weights))
        self.tightest = sorted((capacity[l] / w, l) for l, w in zip(links, weights) if not math.isinf(capacity[l]))
        """(capacity / weight, link), smallest first: the rate each link would allow the
        bundle alone on it (``_max_min_rates`` reads the first it has to itself)."""


class _Flow:
    __slots__ = ("links", "remaining", "rate", "last_t", "version", "callback", "arg", "src", "dst", "nbytes", "start",
                 "label", "medium", "bottleneck", "bundle", "meets", "ident", "peers")

    def __init__(self, route, nbytes, callback, arg, src, dst, start, label):
        """A flow of ``nbytes`` on ``route`` (as ``Network.route`` gives it: links, latency,
        medium, bottleneck capacity, bytes carried)."""
        self.links, _, self.medium, self.bottleneck, _ = route
        self.remaining = float(nbytes)
        self.rate = 0.0
        self.last_t = start
        self.version = 0
        self.callback, self.arg = callback, arg  # on arrival: callback(arg) is called, or event arg triggered
        self.src, self.dst, self.nbytes, self.start, self.label = src, dst, nbytes, start, label
        self.bundle = self.meets = self.peers = None
        self.ident = id(self.links)


class Network:
    """Links of a topology as shared, full-duplex resources for flows."""

    def __init__(self, env: Environment, topology: Topology, efficiency: dict[str, float] | None = None,
                 check: bool = False, calls: Calls | None = None):
        self.env = env
        self.calls = calls or Calls(env)
        """Where the network's timers go (the engine shares its own)."""
        self.check = check
        """Debug mode: check link capacities and byte accounting (``sim.engine.invariants``)."""
        self.topology = topology
        eff = efficiency or {}
        self._link_id: dict[tuple[str, str], int] = {}
        self.capacity: list[float] = []
        self.link_names: list[tuple[str, str]] = []
        self.link_kinds: list[str] = []
        self._latency: list[float] = []  # each link's latency_s (its route's latency: their sum, as Topology.path_latency_s)
        self.bandwidth: list[float] = []
        """Each topology link's ``bandwidth_Bps`` (line rate; ``capacity`` is after efficiency)."""
        for u, v, d in sorted(topology.graph.edges(data=True), key=lambda e: (str(e[0]), str(e[1]))):
            cap = d["bandwidth_Bps"] * eff.get(d["kind"], 1.0)
            for a, b in ((u, v), (v, u)):
                self._link_id[(a, b)] = len(self.capacity)
                self.capacity.append(cap)
                self.link_names.append((a, b))
                self.link_kinds.append(d["kind"])
                self._latency.append(d["latency_s"])
                self.bandwidth.append(d["bandwidth_Bps"])
        self._medium_rank = [_MEDIA.index(k) if k in _MEDIA else len(_MEDIA) - 1 for k in self.link_kinds]
        """Each topology link's kind's place in ``_MEDIA`` (a route's medium: its links' first)."""
        self._flows_on: list[set[_Flow]] = [set() for _ in self.capacity]
        self._host_bytes: dict[int, float] = {}  # carried by host copies, per link
        self._route: dict[tuple[int, int], tuple[tuple[int, ...], float, str, float, list[float]]] = {}
        self._dirty: set[int] = set()
        self._seeds: set[_Flow] = set()
        """Flows whose component changed since the last re-allocation, where there are bundles: a
        bundle that joined others, the flows a finished bundle met (``_component``)."""
        self._pending = False
        self.records: list[TransferRecord] = []
        self._bundles: list[Bundle] = []  # every bundle made (link_bytes)
        self._sealed = False
        self._folded: set[int] = set()  # links folded into bundles' own (seal)
        self._used: set[int] | None = None
        self._recent: dict[frozenset, tuple] = {}  # the last components' routes, and rates by route id (``_rates``)
        self._recent_bundled: dict[tuple, tuple] = {}  # the same for components with bundles (``_bundled_rates``)
        self._recent_bundled_links = 0  # links held by ``_recent_bundled``'s keys
        self.bundle_records: set[int] = set()
        """Indices in ``records`` of the records bundles left (a source's members sent one way together)."""
        self._at = self.calls.at
        self._join_call, self._timer_call = self._join, self._timer  # bound once, not per call
        self.active = 0
        self.events_triggered = 0
        """SimPy events this network triggered (``transfer``'s), each a queue entry of its own."""

    # ------------------------------------------------------------------ public
    def transfer(self, src: int, dst: int, nbytes: int, label: str = "", latency_steps: int = 1) -> Event:
        """Start moving ``nbytes`` from GPU ``src`` to GPU ``dst``; the event fires when done.
        The route's latency is paid ``latency_steps`` times."""
        done = Event(self.env)
        self.start(self.route(src, dst), src, dst, nbytes, label, latency_steps, None, done)
        return done

    def start(self, route: tuple, src: int, dst: int, nbytes: int, label: str, latency_steps: int, callback,
              arg) -> None:
        """``transfer`` for the engine's hot path, on ``route`` (``route(src, dst)``, looked
        up before the clock starts): when the bytes have arrived, ``callback(arg)`` is
        called (``Calls``), or with no callback, event ``arg`` is triggered."""
        links, latency, medium, bottleneck, carried = route
        now = self.env.now
        flow = _new_object(_Flow)  # (what _Flow() does, without the call to __init__)
        flow.links, flow.bottleneck, flow.remaining, flow.rate, flow.last_t, flow.version = \
            links, bottleneck, float(nbytes), 0.0, now, 0
        flow.callback, flow.arg, flow.src, flow.dst, flow.nbytes, flow.start, flow.label, flow.medium = \
            callback, arg, src, dst, nbytes, now, label, medium
        flow.bundle = flow.meets = flow.peers = None
        flow.ident = id(links)  # (what tells its route apart in a component's key: _rates, _bundled_rates)
        self.active += 1
        carried[0] += nbytes
        if latency > 0:
            self._at(now + latency * latency_steps, self._join_call, flow)
        else:
            self._join(flow)

    def bundles(self, pairs, latency=None, skip=frozenset()) -> list[Bundle]:
        """``pairs`` as bundles of members that start together: one ``bundle`` per distinct
        member latency (``latency(route latency, medium)``, default the route's), shortest
        first. Members with different latencies do not start together (under PXN a send
        relayed over NVLink pays two more hops than a send on its own rail, on the same
        NIC link), so each latency's members move in step among themselves and share the
        links with the others max-min fairly, as their separate flows would."""
        by_latency: dict[float, list] = {}
        for src, dst in pairs:
            _, lat, medium, _ = self._make_route(src, dst)
            by_latency.setdefault(lat if latency is None else latency(lat, medium), []).append((src, dst))
        return [self.bundle(members, latency, skip) for _, members in sorted(by_latency.items())]

    def bundle(self, pairs, latency=None, skip=frozenset()) -> Bundle:
        """The ``Bundle`` of member flows ``pairs`` ((source, destination) GPU pairs, each
        on its route), paying its members' longest latency before it moves, each member's
        ``latency(route latency, medium)`` (default: the route's). Its members' routes are
        not kept as routes of their own (``seal`` tells the links only bundles use). The
        trace records what each source sent, except the sources in ``skip`` (shadows)."""
        weight: dict[int, int] = {}
        by_source: dict[tuple[int, str], list] = {}
        latency_s = 0.0
        for src, dst in pairs:
            ids, lat, medium, _ = self._make_route(src, dst)
            latency_s = max(latency_s, lat if latency is None else latency(lat, medium))
            for l in ids:
                weight[l] = weight.get(l, 0) + 1
            if src in skip:
                continue
            got = by_source.get((src, medium))
            if got is None:
                by_source[(src, medium)] = [dst, 1]
            else:
                got[1] += 1
        links = tuple(sorted(weight))
        weights = tuple(weight[l] for l in links)
        bottleneck = min((self.capacity[l] / w for l, w in zip(links, weights)), default=math.inf)
        records = tuple((src, dst, k, medium) for (src, medium), (dst, k) in sorted(by_source.items()))
        b = Bundle(links, weights, latency_s, bottleneck, records, min(p[0] for p in pairs), max(p[1] for p in pairs),
                   self.capacity)
        self._bundles.append(b)
        if self._sealed:
            self._unfolded(b.all_links)
        return b

    def seal(self) -> None:
        """Every route but bundles' has been made (the engine's set-up): fold the links of
        each bundle that nothing else can cross (its members' ends on GPUs no other flow
        uses: under reduced fidelity, most of its links) into one link of its own. They
        bound it as a link would, by their tightest capacity over weight, which is what
        that link holds; a second flow of the same bundle shares it, as it would share
        them. A route or bundle made later must not cross a folded link (an error)."""
        self._sealed = True
        used = self._used_links()
        crossing: dict[int, int] = {}
        for b in self._bundles:
            for l in b.all_links:
                crossing[l] = crossing.get(l, 0) + 1
        for b in self._bundles:
            cap = self.capacity
            own = [(l, w) for l, w in zip(b.all_links, b.all_weights)
                   if crossing[l] == 1 and l not in used and not math.isinf(cap[l])]
            if not own:
                continue
            folded = {l for l, _ in own}
            kept = [(l, w) for l, w in zip(b.all_links, b.all_weights) if l not in folded]
            v = len(cap)
            cap.append(min(cap[l] / w for l, w in own))
            self._flows_on.append(set())
            self._folded.update(folded)
            b.cross(tuple(l for l, _ in kept) + (v,), tuple(w for _, w in kept) + (1,), cap)

    def private_link(self, capacity: float) -> int:
        """A new link of ``capacity`` B/s that no topology edge is, for one transfer to
        cross beside its route: it bounds that transfer's rate as a link of its own would
        (NCCL's channels and protocol caps, ``sim.engine.collectives``). It carries no
        bytes in ``link_bytes`` (the route's links do)."""
        self.capacity.append(capacity)
        self._flows_on.append(set())
        return len(self.capacity) - 1

    def _unfolded(self, links) -> None:
        """After ``seal``: ``links`` (a new route's) must not cross a folded link."""
        if not self._folded.isdisjoint(links):
            from sim.engine.invariants import violation

            violation("a route made after the network was sealed crosses a link folded into a bundle")
        self._used_links().update(links)

    def _used_links(self) -> set[int]:
        """Links a flow other than a bundle may cross: every route made so far, and each
        GPU's link to its host CPU (host copies)."""
        used = self._used
        if used is None:
            used = self._used = {l for r in self._route.values() for l in r[0]}
            g = self.topology.graph
            for gpu in self.topology.gpus:
                if any(g.nodes[n]["kind"] == "cpu" for n in g.neighbors(gpu)):
                    r = g.nodes[gpu]["rank"]
                    for a, b in self.topology.host_route(r):
                        used.update((self._link_id[(a, b)], self._link_id[(b, a)]))
        return used

    def start_bundle(self, bundle: Bundle, nbytes: float, label: str, callback, arg) -> None:
        """Start ``bundle`` with ``nbytes`` per member; ``callback(arg)`` when every member
        has arrived (``start``'s, for a bundle)."""
        now = self.env.now
        flow = _new_object(_Flow)
        flow.links, flow.bottleneck, flow.remaining, flow.rate, flow.last_t, flow.version = \
            bundle.links, bundle.bottleneck, float(nbytes), 0.0, now, 0
        flow.callback, flow.arg, flow.src, flow.dst, flow.nbytes, flow.start, flow.label, flow.medium = \
            callback, arg, bundle.src, bundle.dst, nbytes, now, label, "bundle"
        flow.bundle = bundle
        flow.meets = set()  # (its links that another flow crosses too: _join and _finish keep them)
        flow.peers = set()  # (the flows it shares a link with: the same)
        flow.ident = id(bundle)
        self.active += 1
        bundle.carried[0] += nbytes
        if bundle.latency_s > 0:
            self._at(now + bundle.latency_s, self._join_call, flow)
        else:
            self._join(flow)

    def transfer_host(self, rank: int, nbytes: float, to_host: bool, label: str = "") -> Event:
        """Copy ``nbytes`` between GPU ``rank`` and its host CPU over their PCIe link (or a
        Grace superchip's NVLink-C2C: medium ``nvlink``)."""
        done = self.env.event()
        route = self.topology.host_route(rank, to_host)
        links = tuple(self._link_id[l] for l in route)
        latency = sum(self.topology.graph.edges[l]["latency_s"] for l in route)
        medium = "pcie" if any(self.link_kinds[l] == "pcie" for l in links) else "nvlink"
        bottleneck = min((self.capacity[l] for l in links), default=math.inf)
        # (a route of its own, not kept: its bytes are counted in _host_bytes)
        flow = _Flow((links, latency, medium, bottleneck, None), nbytes, None, done, rank, rank, self.env.now, label)
        self.active += 1
        for l in links:
            self._host_bytes[l] = self._host_bytes.get(l, 0.0) + nbytes
        self._at(self.env.now + latency, self._join_call, flow)
        return done

    def link_bytes(self) -> dict[int, float]:
        """Bytes issued so far onto each link that carried any, by link id in increasing
        order. Each route keeps its own total, spread over its links here: one addition
        per transfer instead of one per link crossed, and no walk over every link of a
        large fabric."""
        out = dict(self._host_bytes)
        for links, _, _, _, carried in self._route.values():
            b = carried[0]
            if b:
                for l in links:
                    out[l] = out.get(l, 0.0) + b
        for bundle in self._bundles:
            b = bundle.carried[0]
            if b:
                for l, w in zip(bundle.all_links, bundle.all_weights):
                    out[l] = out.get(l, 0.0) + b * w
        return {l: out[l] for l in sorted(out) if out[l] > 0}

    def route(self, src: int, dst: int) -> tuple[tuple[int, ...], float, str, float, list[float]]:
        """The route from GPU ``src`` to GPU ``dst``, for ``start``: its link ids, its
        latency, its medium, its bottleneck capacity and the bytes issued onto it so far
        (a one-item list). Looked up once per pair (routing is the costly part)."""
        key = (src, dst)
        r = self._route.get(key)
        if r is None:
            r = self._route[key] = (*self._make_route(src, dst), [0.0])
            if self._sealed:
                self._unfolded(r[0])
        return r

    def _make_route(self, src: int, dst: int) -> tuple[tuple[int, ...], float, str, float]:
        """``route``'s first four items, made anew."""
        ids = tuple(map(self._link_id.__getitem__, self.topology.route(src, dst)))
        # (the first of ethernet, ib, pcie, nvlink that a link of the route is, else local)
        medium = _MEDIA[min(map(self._medium_rank.__getitem__, ids), default=len(_MEDIA) - 1)]
        bottleneck = min(map(self.capacity.__getitem__, ids), default=math.inf)
        # (Topology.path_latency_s's sum: the same links' latencies in the same order)
        return ids, sum(map(self._latency.__getitem__, ids)), medium, bottleneck

    def _join(self, flow: _Flow) -> None:
        """The flow's latency is over: its bytes start to move."""
        flow.last_t = now = self.env.now
        links = flow.links
        bottleneck = flow.bottleneck
        if flow.remaining <= 0 or bottleneck == math.inf:  # nothing to move, or nothing in the way
            flow.links = ()  # it never joins its links
            self._finish(flow)
            return
        flows_on = self._flows_on
        shared = False
        meets = flow.meets  # (a bundle's: the links where it meets others)
        met = set() if self._bundles else None  # (who it meets: kept where there are bundles, see _reallocate)
        for l in links:
            fl = flows_on[l]
            if fl:
                shared = True
                if len(fl) == 1:  # (the flow already there meets another here now)
                    for o in fl:
                        if o.meets is not None:
                            o.meets.add(l)
                if meets is not None:
                    meets.add(l)
                if met is not None:
                    met |= fl
            fl.add(flow)
        if met:  # each pair once, however many links it shares
            for o in met:
                if o.bundle is not None or meets is not None:
                    _meet(o, flow)
        if shared:  # rates change on its links: re-allocated in one batch at this instant
            if meets is None:
                self._dirty.update(links)
            else:  # (its component: see _reallocate)
                self._seeds.add(flow)
            self._request_reallocation()
            return
        # Alone on every link of its route: max-min gives it the route's bottleneck, and
        # nobody else's rate changes. (A flow that joins one of these links later at this
        # same instant triggers the shared re-allocation, which re-times this one.)
        flow.rate = bottleneck
        flow.version += 1
        self._at(now + flow.remaining / bottleneck, self._timer_call, (flow, flow.version))
        if self.check:
            self._check_capacity(links)

    def _request_reallocation(self) -> None:
        if not self._pending:
            self._pending = True
            self._at(self.env.now, self._reallocate, None)

    def _finish(self, flow: _Flow) -> None:
        now = self.env.now
        flows_on = self._flows_on
        dirty = self._dirty if flow.bundle is None else _NOWHERE  # (a bundle's: its peers, below)
        for l in flow.links:  # (a flow that never joined its links has none left: see _join)
            fl = flows_on[l]
            fl.remove(flow)
            if fl:  # the flows left on this link may now go faster
                dirty.add(l)
                if len(fl) == 1:  # (the one left has it to itself again)
                    for o in fl:
                        if o.meets is not None:
                            o.meets.discard(l)
        peers = flow.peers
        if peers:  # (it meets nobody now; a bundle's peers are where its rates may change)
            for o in peers:
                o.peers.discard(flow)
            if flow.bundle is not None:
                self._seeds.update(peers)
            flow.peers = None
        flow.remaining = 0.0
        self.active -= 1
        if flow.bundle is None:
            self.records.append(_tuple_new(TransferRecord, (flow.src, flow.dst, flow.nbytes, flow.start, now,
                                                            flow.label, flow.medium)))
        else:
            self._bundle_records(flow, now)
        if flow.callback is not None:  # (the engine's: finishes actions, may start flows)
            flow.callback(flow.arg)
        else:
            self.events_triggered += 1
            flow.arg.succeed()
        if self._dirty or self._seeds:
            self._request_reallocation()

    def _bundle_records(self, flow: _Flow, now: float) -> None:
        """A finished bundle's records (``Bundle.records``); in debug mode, a check that it
        took no less than its members' bytes over its bottleneck rate."""
        if self.check and flow.links and now - flow.start < flow.nbytes / flow.bundle.bottleneck * (1 - 1e-9):
            from sim.engine.invariants import violation

            violation(f"bundle {flow.label!r} moved {flow.nbytes} bytes per member in {now - flow.start:.6g} s, "
                      f"faster than its bottleneck allows")
        first = len(self.records)
        self.records.extend(_tuple_new(TransferRecord, (src, dst, flow.nbytes * k, flow.start, now, flow.label, medium))
                            for src, dst, k, medium in flow.bundle.records)
        self.bundle_records.update(range(first, len(self.records)))

    def _timer(self, timer: tuple[_Flow, int]) -> None:
        """A flow's finish time at its last rate has come; stale if its rate changed since."""
        flow, version = timer
        if flow.version == version and flow.remaining > 0:
            if self.check:
                left = flow.remaining - flow.rate * (self.env.now - flow.last_t)
                if abs(left) > max(1e-6 * flow.nbytes, 1.0):
                    from sim.engine.invariants import violation

                    violation(f"flow {flow.label!r} {flow.src}->{flow.dst} finished at t={self.env.now!r} with "
                              f"{left:.6g} of its {flow.nbytes} bytes not delivered")
            self._finish(flow)

    def _reallocate(self, _arg=None) -> None:
        """Max-min fair rates for every flow connected to a changed link."""
        self._pending = False
        now = self.env.now
        # The component: flows reachable from the dirty links through shared links, found a
        # layer at a time with set unions (a component of thousands of flows over ten
        # thousand links); what it holds, not the order it is found in, is what the rates
        # depend on. Where there are bundles, over flows instead (``_component``): a bundle's
        # hundreds of links are not read (on DeepSeek-V3 at 1,024 H100s that reading was
        # half of the loop).
        flows_on = self._flows_on
        if self._bundles:
            flows = self._component()
            links = None
        else:
            links: set[int] = set(self._dirty)
            self._dirty.clear()
            flows: set[_Flow] = set()
            frontier = links
            while frontier:  # (no bundle in the network: every flow's links, read in C)
                new = set().union(*map(flows_on.__getitem__, frontier))
                new -= flows
                if not new:
                    break
                flows |= new
                frontier = set().union(*map(_route_of, new)) - links
                links |= frontier
        if not flows:
            return
        if len(flows) == 1:  # alone: its route's bottleneck (what progressive filling gives)
            (f,) = flows
            rates = [f.bottleneck]
        elif links is None:
            rates = self._bundled_rates(flows)
        else:
            rates = self._rates(flows, links)  # (which reads no flow's progress or rate)
        # Each flow's progress brought up to now at its old rate; only flows whose rate
        # changes draw timers, sorted, so that they draw them in a fixed order.
        changed = []
        for f, r in zip(flows, rates):  # (the set read in the same order as by _rates)
            old = f.rate
            if old > 0:
                f.remaining -= old * (now - f.last_t)
            f.last_t = now
            if r != old:
                f.rate = r
                f.version += 1
                changed.append(f)
        changed.sort(key=_flow_key)
        for f in changed:
            r = f.rate
            left = max(f.remaining, 0.0)
            delay = left / r if r > 0 else math.inf
            if math.isinf(delay):
                continue
            self._at(now + delay, self._timer_call, (f, f.version))
        if self.check:
            self._check_capacity(_links_of(flows) if links is None else links)

    def _component(self) -> set:
        """The flows whose rates may have changed, where the network has bundles: the
        component of each changed bundle (``_seeds``: one that joined others, or met one
        that finished) and of each flow on a changed link (a plain flow's, ``_dirty``), found
        over flows, not links: a plain flow reaches the flows on its few links, a bundle the
        flows it meets (``_Flow.peers``, kept as flows join and finish), which are those on
        the links it shares. Its hundreds of links are not read, nor are the links of the
        component unless its rates must be worked out (``_bundled_rates``)."""
        flows_on = self._flows_on
        seeds = self._seeds
        flows = {f for f in seeds if f.remaining > 0}  # (less one that has finished since)
        seeds.clear()
        if self._dirty:
            flows.update(*map(flows_on.__getitem__, self._dirty))
            self._dirty.clear()
        frontier = flows
        while frontier:
            new = set()
            for f in frontier:
                if f.bundle is None:
                    new.update(*map(flows_on.__getitem__, f.links))
                else:
                    new |= f.peers
            new -= flows
            if not new:
                break
            flows = flows | new
            frontier = new
        return flows

    RECENT = 16
    """How many components' rates ``_rates`` keeps (the last ones met)."""

    def _rates(self, flows: set[_Flow], links: set[int]) -> list[float]:
        """``_max_min_rates`` of a component, as a list in the order the set ``flows`` is
        read (a set left unchanged is read in one order), kept for the next component that
        is the same: without bundles, a component's rates depend only on how many of its flows
        take each route (a flow's links; flows on the same links are frozen together, so
        they get the same rate) and on the links' capacities, which do not change once
        set. A training step repeats a few shapes: the gradient buckets' all-reduces meet
        the same components bucket after bucket (at 16,384 GPUs, 96 of 197 re-allocations
        over about 4,000 flows each), a few re-allocations apart, so the last ``RECENT``
        are kept.

        A route is told by its tuple's identity, not its links: flows take their routes'
        tuples from the network's tables (``route``, the collectives' plans), so the flows
        of one route share one tuple, and ids hash and compare without reading a link (a
        tuple's hash is not kept, and reading its links from memory is most of the cost:
        a key of ids took 0.29 s a run at 16,384 GPUs where the links' took 0.78, the
        same run, interleaved). Where every flow has a route of its own (the usual case)
        the key is the set of ids, else the ids with their counts. Two tuples of the same
        links count as two routes: a component then differs from one met before where
        it need not, and its rates are worked out again, the same. A kept component
        holds its routes' tuples, so their ids are not reused while it is kept."""
        ids = list(map(id, map(_route_of, flows)))
        key = frozenset(ids)
        if len(key) != len(ids):  # (some flows share a route: how many, too)
            key = frozenset(Counter(ids).items())
        recent = self._recent
        kept = recent.get(key)
        if kept is not None:
            return list(map(kept[1].__getitem__, ids))  # (the set read in the same order as ids)
        rates = list(map(_max_min_rates(flows, links, self.capacity, self._flows_on).__getitem__, flows))
        recent[key] = ([f.links for f in flows], dict(zip(ids, rates)))
        if len(recent) > self.RECENT:
            del recent[next(iter(recent))]  # (the oldest)
        return rates

    BUNDLED_LINKS = 2_000_000
    """How many links the components ``_bundled_rates`` keeps may span together (the oldest go
    first): the 3,660 components of the run below fit."""

    def _bundled_rates(self, flows: set[_Flow]) -> list[float]:
        """``_rates`` of a component with bundles, kept for the next component that is the
        same. Its rates are ``_max_min_rates``', a function of what each flow crosses (a
        plain flow its route, a bundle its weighted links), of the component's links
        (``_links_of``: which of a bundle's links count as its own) and of the capacities,
        which do not change once set; every flow on those links is in the component, so
        their counts follow, and the links themselves follow from the flows: a bundle meets
        others exactly where their routes or bundles cross its own. So the key is the flows'
        routes and bundles by identity, with how many of each (a bundle is made once per
        group and protocol, a route once per pair: ``Network.bundles``, ``route``), and the
        links are read only when the rates are worked out. (Before 2026-12-07's
        ``_component`` the key held the links too, with links marked changed that no flow of
        the component still shared: 4,214 keys where 3,660 component shapes met.) An EP-overlapped
        MoE schedule meets a few thousand such components hundreds of thousands of times
        (Qwen3-235B-A22B on 256 H100s, Megatron-Bridge 25.11's layout: 461,431 re-allocations,
        4,214 components; 109 s of simulation without this, 40 s with it), further apart than
        ``RECENT``: every component is kept, the oldest dropped past ``BUNDLED_LINKS``. A kept
        component holds its routes and bundles, so their ids are not reused while it is kept.
        Rates are kept by identity only where the flows of one identity got one rate (flows on
        the same links freeze together)."""
        ids = list(map(_ident_of, flows))
        key = frozenset(ids)
        if len(key) != len(ids):  # (some flows share a route or bundle: how many, too)
            key = frozenset(Counter(ids).items())
        recent = self._recent_bundled
        kept = recent.get(key)
        if kept is not None:
            return list(map(kept[1].__getitem__, ids))  # (the set read in the same order as ids)
        links = _links_of(flows)
        rates = list(map(_max_min_rates(flows, links, self.capacity, self._flows_on).__getitem__, flows))
        by_id: dict[int, float] = {}
        if all(by_id.setdefault(i, r) == r for i, r in zip(ids, rates)):
            recent[key] = ([f.links if f.bundle is None else f.bundle for f in flows], by_id, len(links))
            self._recent_bundled_links += len(links)
            while self._recent_bundled_links > self.BUNDLED_LINKS and len(recent) > 1:
                old = next(iter(recent))  # (the oldest)
                self._recent_bundled_links -= recent[old][2]
                del recent[old]
        return rates

    def _check_capacity(self, links) -> None:
        """Debug mode: the flows on each link together stay within its capacity."""
        for l in links:
            cap = self.capacity[l]
            if math.isinf(cap):
                continue
            used = sum(f.rate * (1 if f.bundle is None else f.bundle.weight_of[l]) for f in self._flows_on[l])
            if used > cap * (1 + 1e-9):
                from sim.engine.invariants import violation

                name = "->".join(self.link_names[l]) if l < len(self.link_names) else "a bundle's own"
                violation(f"link {name} carries {used:.6g} B/s at "
                          f"t={self.env.now!r}, over its capacity {cap:.6g} B/s")


_route_of = attrgetter("links")
_ident_of = attrgetter("ident")


class _Nowhere:
    """A set that keeps nothing (``_finish``: a bundle marks no links)."""

    __slots__ = ()

    def add(self, _item) -> None:
        pass


_NOWHERE = _Nowhere()


def _meet(a: _Flow, b: _Flow) -> None:
    """Flows ``a`` and ``b``, one of them a bundle, share a link: each is the other's peer."""
    if a.peers is None:
        a.peers = set()
    if b.peers is None:
        b.peers = set()
    a.peers.add(b)
    b.peers.add(a)


def _links_of(flows) -> set[int]:
    """A component's links, as ``_max_min_rates`` takes them: a plain flow's route, and the
    links where a bundle meets the others (those it has to itself bound it apart)."""
    return set().union(*[f.links if f.bundle is None else f.meets for f in flows])


_flow_key = attrgetter("start", "src", "dst", "label", "nbytes")
"""A flow's place in the order rates are set and timers drawn: (start, src, dst, label, nbytes)."""


def _max_min_rates(flows: set[_Flow], links: set[int], capacity: list[float], flows_on: list[set]) -> dict:
    """Progressive filling: the max-min fair rate of each flow (deterministic).

    The link with the smallest fair share (capacity left / flows not yet frozen) is the
    next bottleneck; its flows are frozen at that share. Freezing a flow at the smallest
    share never lowers another link's share, so a heap with lazy updates finds each next
    bottleneck. A bundle (``Bundle``) counts as its weight on each link, and takes its
    weight times the share: freezing it still leaves every other link's share at least
    the smallest. ``links`` need not hold a bundle's links that no other flow crosses:
    the tightest of those bounds it as a link of its own would (its share, capacity over
    weight, never changes), one heap entry (numbered below zero).
    """
    bundles = sorted((f for f in flows if f.bundle is not None), key=_flow_key)
    if not bundles:
        return _max_min_plain(flows, links, capacity, flows_on)
    rate: dict[_Flow, float] = {}
    left = {l: capacity[l] for l in links if not math.isinf(capacity[l])}
    count = {l: len(flows_on[l]) for l in left}
    heap = []
    alone: dict[int, _Flow] = {}  # heap key (< 0) -> the bundle its own links bound
    for f in bundles:
        weight_of = f.bundle.weight_of
        for m in _common(count, weight_of):
            count[m] += weight_of[m] - 1
        own = next((x for x in f.bundle.tightest if x[1] not in links), None)
        if own is not None:
            key = -1 - len(alone)
            alone[key] = f
            heap.append((own[0], key))
    # (each link's share once its bundles' weights count; the entries are distinct, so the
    # heap pops them in one order whatever order they are listed in)
    heap += [(left[l] / c, l) for l, c in count.items() if c > 0]
    heapq.heapify(heap)
    unfrozen = set(flows)
    while unfrozen and heap:
        share, l = heapq.heappop(heap)
        if l < 0:  # a bundle's own links: it stops here, if nothing stopped it before
            f = alone[l]
            if f in unfrozen:
                _freeze(f, share, rate, unfrozen, left, count)
            continue
        c = count[l]
        if c == 0:
            continue
        current = max(left[l], 0.0) / c
        if current > share * (1 + _EPS) + _EPS:
            heapq.heappush(heap, (current, l))
            continue
        # (a bundle takes its weight times the share: the order of the subtractions counts)
        for f in sorted(flows_on[l] & unfrozen, key=_flow_key):
            _freeze(f, current, rate, unfrozen, left, count)
    for f in unfrozen:  # flows that cross only infinite links
        rate[f] = math.inf
    return rate


def _max_min_plain(flows: set[_Flow], links: set[int], capacity: list[float], flows_on: list[set]) -> dict:
    """``_max_min_rates`` when no flow is a bundle, with less to do for the links that one
    flow has to itself: in a large fabric more than half of a component's links (a GPU's
    own NIC links). Such a link's share is its capacity until its flow is frozen, and
    nothing else reads it, so it is left out of the capacities and counts that frozen
    flows take their shares off. Its entry is the same, (capacity, link): when it comes
    up its flow, if not frozen yet, stops at that capacity, where the full bookkeeping
    would stop it (the share of one flow on an untouched link); if frozen, the entry is
    passed over, as a link with no flow left would be.

    The links' first entries, (capacity / flows, link), are made at once (numpy) and read
    in order from a sorted list; only the entries pushed back (a share that grew) go on a
    heap. The next entry is the smaller of the two heads: the entries come up in the
    order one heap of them all would give, and a large component, which is done once
    every flow is frozen, never makes the entries it does not reach."""
    rate: dict[_Flow, float] = {}
    inf = math.inf
    ids = list(links)
    n_of = np.fromiter(map(len, map(flows_on.__getitem__, ids)), dtype=np.int64, count=len(ids))
    cap_of = np.fromiter(map(capacity.__getitem__, ids), dtype=np.float64, count=len(ids))
    ids_a = np.array(ids, dtype=np.int64)
    finite = cap_of != inf
    shared = finite & (n_of > 1)
    count = dict(zip(ids_a[shared].tolist(), n_of[shared].tolist()))  # link -> flows not frozen yet
    left = dict(zip(ids_a[shared].tolist(), cap_of[shared].tolist()))  # link -> capacity not taken yet
    used = finite & (n_of > 0)
    share_of, link_of = cap_of[used] / n_of[used], ids_a[used]  # (IEEE division: as Python's)
    order = np.lexsort((link_of, share_of))  # (by share, then link: as the tuples compare)
    shares, firsts = share_of[order].tolist(), link_of[order].tolist()
    k, end = 0, len(shares)
    heap: list = []  # (share, link) pushed back
    unfrozen = set(flows)
    heappop, heappush = heapq.heappop, heapq.heappush
    while unfrozen:
        if k < end:
            share, l = shares[k], firsts[k]
            if heap and heap[0] < (share, l):
                share, l = heappop(heap)
            else:
                k += 1
        elif heap:
            share, l = heappop(heap)
        else:
            break
        c = count.get(l)
        if c is None:  # a link of one flow's own: it stops at its capacity, if nothing stopped it before
            for f in flows_on[l]:
                if f in unfrozen:
                    unfrozen.discard(f)
                    rate[f] = share
                    for m in f.links:
                        if m in left:
                            left[m] -= share
                            count[m] -= 1
            continue
        if c == 0:
            continue
        current = max(left[l], 0.0) / c
        if current > share * (1 + _EPS) + _EPS:
            heappush(heap, (current, l))
            continue
        batch = flows_on[l] & unfrozen  # (each flow takes the same share off each link: any order will do)
        unfrozen -= batch
        for f in batch:
            rate[f] = current
            for m in f.links:
                if m in left:
                    left[m] -= current
                    count[m] -= 1
    for f in unfrozen:  # flows that cross only infinite links
        rate[f] = inf
    return rate


def _freeze(f: _Flow, current: float, rate: dict, unfrozen: set, left: dict, count: dict) -> None:
    """Progressive filling's step: flow ``f`` stops at rate ``current``, which it takes
    off each link's capacity left (times its weight, for a bundle)."""
    rate[f] = current
    unfrozen.discard(f)
    if f.bundle is None:
        for m in f.links:
            if m in left:
                left[m] -= current
                count[m] -= 1
    else:
        weight_of = f.bundle.weight_of
        for m in _common(left, weight_of):
            w = weight_of[m]
            left[m] -= current * w
            count[m] -= w


def _common(a: dict, b: dict) -> list:
    """The keys of both, walking the smaller (a component's few links against a bundle's
    hundreds)."""
    if len(a) > len(b):
        a, b = b, a
    return [k for k in a if k in b]
