"""A flow-level network model on SimPy: transfers share links fairly.

Each transfer is a *flow* over the directed links of its route. It first spends the
route's latency (the sum of its links' ``latency_s``), then moves its bytes at a rate
set by **max-min fair sharing**: progressive filling raises every flow's rate together
until some link is full; the flows crossing that link are frozen at their share, and
filling continues for the rest (Bertsekas & Gallager, *Data Networks*, 6.5.2). Rates are
recomputed whenever a flow starts or ends, only for the flows connected to it through
shared links, and flows that start or end at the same instant are handled in one batch.

So an uncontended transfer of S bytes takes ``latency + S / bottleneck_bandwidth``; two
flows over one link take twice as long as one; the two directions of a full-duplex link
are separate resources and do not slow each other.

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

from simpy import Event

from sim.engine.kernel import Calls, Environment
from sim.inputs.topology import Topology
from sim.results.trace import TransferRecord

_tuple_new = tuple.__new__  # a TransferRecord without the named tuple's Python-level __new__
_new_object = object.__new__
_EPS = 1e-12


class _Flow:
    __slots__ = ("links", "remaining", "rate", "last_t", "version", "callback", "arg", "src", "dst", "nbytes", "start",
                 "label", "medium", "bottleneck")

    def __init__(self, links, nbytes, callback, arg, src, dst, start, label, medium, bottleneck):
        self.links = links
        self.bottleneck = bottleneck
        self.remaining = float(nbytes)
        self.rate = 0.0
        self.last_t = start
        self.version = 0
        self.callback, self.arg = callback, arg  # on arrival: callback(arg) is called, or event arg triggered
        self.src, self.dst, self.nbytes, self.start, self.label = src, dst, nbytes, start, label
        self.medium = medium


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
        for u, v, d in sorted(topology.graph.edges(data=True), key=lambda e: (str(e[0]), str(e[1]))):
            cap = d["bandwidth_Bps"] * eff.get(d["kind"], 1.0)
            for a, b in ((u, v), (v, u)):
                self._link_id[(a, b)] = len(self.capacity)
                self.capacity.append(cap)
                self.link_names.append((a, b))
                self.link_kinds.append(d["kind"])
        self._flows_on: list[set[_Flow]] = [set() for _ in self.capacity]
        self._host_bytes: dict[int, float] = {}  # carried by host copies, per link
        self._route: dict[tuple[int, int], tuple[tuple[int, ...], float, str, float, list[float]]] = {}
        self._dirty: set[int] = set()
        self._pending = False
        self.records: list[TransferRecord] = []
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
        self.active += 1
        carried[0] += nbytes
        if latency > 0:
            self._at(now + latency * latency_steps, self._join_call, flow)
        else:
            self._join(flow)

    def transfer_host(self, rank: int, nbytes: float, to_host: bool, label: str = "") -> Event:
        """Copy ``nbytes`` between GPU ``rank`` and its host CPU over their PCIe link."""
        done = self.env.event()
        links = tuple(self._link_id[l] for l in self.topology.host_route(rank, to_host))
        latency = sum(self.topology.graph.edges[l]["latency_s"] for l in self.topology.host_route(rank, to_host))
        flow = _Flow(links, nbytes, None, done, rank, rank, self.env.now, label, "pcie",
                     min((self.capacity[l] for l in links), default=math.inf))
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
        return {l: out[l] for l in sorted(out) if out[l] > 0}

    def route(self, src: int, dst: int) -> tuple[tuple[int, ...], float, str, float, list[float]]:
        """The route from GPU ``src`` to GPU ``dst``, for ``start``: its link ids, its
        latency, its medium, its bottleneck capacity and the bytes issued onto it so far
        (a one-item list). Looked up once per pair (routing is the costly part)."""
        key = (src, dst)
        r = self._route.get(key)
        if r is None:
            links = self.topology.route(src, dst)
            ids = tuple(self._link_id[l] for l in links)
            kinds = {self.link_kinds[i] for i in ids}
            medium = next((k for k in ("ethernet", "ib", "pcie", "nvlink") if k in kinds), "local")
            bottleneck = min((self.capacity[i] for i in ids), default=math.inf)
            r = (ids, self.topology.path_latency_s(src, dst), medium, bottleneck, [0.0])
            self._route[key] = r
        return r

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
        for l in links:
            fl = flows_on[l]
            if fl:
                shared = True
            fl.add(flow)
        if shared:  # rates change on its links: re-allocated in one batch at this instant
            self._dirty.update(links)
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
        for l in flow.links:  # (a flow that never joined its links has none left: see _join)
            fl = flows_on[l]
            fl.remove(flow)
            if fl:  # the flows left on this link may now go faster
                self._dirty.add(l)
        flow.remaining = 0.0
        self.active -= 1
        self.records.append(_tuple_new(TransferRecord, (flow.src, flow.dst, flow.nbytes, flow.start, now, flow.label,
                                                        flow.medium)))
        if flow.callback is not None:  # (the engine's: finishes actions, may start flows)
            flow.callback(flow.arg)
        else:
            self.events_triggered += 1
            flow.arg.succeed()
        if self._dirty:
            self._request_reallocation()

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
        # The component: flows reachable from the dirty links through shared links.
        flows: set[_Flow] = set()
        links: set[int] = set()
        stack = list(self._dirty)
        self._dirty.clear()
        while stack:
            l = stack.pop()
            if l in links:
                continue
            links.add(l)
            for f in self._flows_on[l]:
                if f not in flows:
                    flows.add(f)
                    stack.extend(f.links)
        if not flows:
            return
        for f in flows:  # bring progress up to now at the old rate
            if f.rate > 0:
                f.remaining -= f.rate * (now - f.last_t)
            f.last_t = now
        if len(flows) == 1:  # alone: its route's bottleneck (what progressive filling gives)
            (f,) = flows
            new_rate = {f: min(self.capacity[l] for l in f.links)}
        else:
            new_rate = _max_min_rates(flows, links, self.capacity, self._flows_on)
        for f in sorted(flows, key=_flow_key):
            r = new_rate[f]
            if r == f.rate:
                continue
            f.rate = r
            f.version += 1
            left = max(f.remaining, 0.0)
            delay = left / r if r > 0 else math.inf
            if math.isinf(delay):
                continue
            self._at(now + delay, self._timer_call, (f, f.version))
        if self.check:
            self._check_capacity(links)

    def _check_capacity(self, links) -> None:
        """Debug mode: the flows on each link together stay within its capacity."""
        for l in links:
            cap = self.capacity[l]
            if math.isinf(cap):
                continue
            used = sum(f.rate for f in self._flows_on[l])
            if used > cap * (1 + 1e-9):
                from sim.engine.invariants import violation

                violation(f"link {self.link_names[l][0]}->{self.link_names[l][1]} carries {used:.6g} B/s at "
                          f"t={self.env.now!r}, over its capacity {cap:.6g} B/s")


def _flow_key(f: _Flow):
    return (f.start, f.src, f.dst, f.label, f.nbytes)


def _max_min_rates(flows: set[_Flow], links: set[int], capacity: list[float], flows_on: list[set]) -> dict:
    """Progressive filling: the max-min fair rate of each flow (deterministic).

    The link with the smallest fair share (capacity left / flows not yet frozen) is the
    next bottleneck; its flows are frozen at that share. Freezing a flow at the smallest
    share never lowers another link's share, so a heap with lazy updates finds each next
    bottleneck.
    """
    rate: dict[_Flow, float] = {}
    left = {l: capacity[l] for l in links if not math.isinf(capacity[l])}
    count = {l: len(flows_on[l]) for l in left}
    heap = [(left[l] / count[l], l) for l in sorted(left) if count[l] > 0]
    heapq.heapify(heap)
    unfrozen = set(flows)
    while unfrozen and heap:
        share, l = heapq.heappop(heap)
        c = count[l]
        if c == 0:
            continue
        current = max(left[l], 0.0) / c
        if current > share * (1 + _EPS) + _EPS:
            heapq.heappush(heap, (current, l))
            continue
        for f in sorted(flows_on[l] & unfrozen, key=_flow_key):
            rate[f] = current
            unfrozen.discard(f)
            for m in f.links:
                if m in left:
                    left[m] -= current
                    count[m] -= 1
    for f in unfrozen:  # flows that cross only infinite links
        rate[f] = math.inf
    return rate
