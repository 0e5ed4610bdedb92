"""Collectives in the engine: where a collective's members meet, and how its steps run.

Each member's ``collective`` action joins a rendezvous keyed by its meeting key (its
group and tag, or its sequence number on that group: ``sim.engine.program_index``). When the
last simulated member has joined, the collective's steps (``sim.engine.algorithms``: point-to-
point transfers with dependencies) start on the network, each when the steps it depends
on are done, and each member's action finishes when its own steps, as sender or
receiver, are all done. An NCCL collective's first steps start after its base latency
(``sim.engine.nccl.base_latency``: kernel launch and setup), which its members' actions
count as busy; collectives moved outside NCCL (``Action.transport`` ``direct``) and
point-to-point ops pay none. Steps are planned once per distinct (op, group, size,
algorithm, channels): an iteration repeats the same few collectives thousands of times.

Used by ``sim.engine.core`` only; it drives no SimPy event of its own beyond the network's.
"""

from __future__ import annotations

import math

from sim.program.actions import Action
from sim.engine import algorithms as collectives
from sim.engine.network import Network
from sim.errors import InputError
from sim.engine.nccl import (DEFAULT_MODEL, POINT_TO_POINT_OPS, TunerRequest, base_latency, protocol_cost,
                             rate_caps, ring_step_latency, transfer_cost)
from sim.engine.tuner import choose, runnable
from sim.inputs.topology import default_channels, nvls_capable, ranks_by_node


BUNDLED_OPS = ("alltoall",)
"""Ops whose steps run as one bundle of flows under the flow model (``Collectives._bundled``):
their point-to-point sends all start at once, carry equal bytes and wait for nothing."""


class _Rendezvous:
    """Where the members of one collective meet: ``posted`` maps each member that has
    arrived to its action index, ``first`` is the first member's action, ``began`` is when
    the last member arrived and data started to move."""

    __slots__ = ("posted", "first", "began")

    def __init__(self, first: Action):
        self.posted: dict[int, int] = {}
        self.first = first
        self.began = None


def holds_no_sms(a: Action) -> bool:
    """Whether collective ``a`` leaves the GPU's SMs to the compute beside it (no overlap
    slowdown): its claim says so (``Action.slows_compute`` false: copy engines move it, or
    the compute beside it is already priced without its SMs; the pass that made it decides)."""
    return not a.slows_compute


class Collectives:
    """The engine's collectives on network ``net`` (its clock and topology theirs).
    ``finish(i, busy_start, link_id)`` is the engine's: it ends action ``i`` now."""

    def __init__(self, net: Network, shadows, fluid: bool, key_of: list, needed: dict, finish, nccl=None):
        self.env, self.net, self.topology = net.env, net, net.topology
        self.shadows, self.fluid = shadows, fluid
        self.key_of, self.needed, self.finish = key_of, needed, finish
        self._open: dict[tuple, _Rendezvous] = {}
        self._plans: dict[tuple, tuple] = {}
        self._labels: dict[str, dict[str, str]] = {}
        self._bundles: dict[tuple, list] = {}  # (group, protocol) -> its all-to-all's Bundles (one per latency)
        self.nccl = nccl or DEFAULT_MODEL
        """Protocols and NVLS figures (``sim.engine.nccl``)."""
        self._choices: dict[tuple, tuple[str, str]] = {}
        self._shapes: dict[tuple, tuple] = {}  # group -> what the tuner's choice depends on (``_shape``)
        self._gpu_links: dict[int, tuple] = {}
        self._efficiency: dict | None = None
        self._tuner_capacity: list[float] | None = None  # per topology link id (``_capped``)
        self.on_begin = None
        """Called as ``on_begin(rank, now)`` for each simulated member when a collective's
        data starts to move (the engine's overlap slowdown), if set; not for collectives
        that hold no SMs (``holds_no_sms``), which end through ``plain_finish``."""
        self.plain_finish = finish
        """The engine's finish without the overlap slowdown's count (``holds_no_sms``)."""

    def waiting(self, key) -> _Rendezvous | None:
        """The rendezvous still waiting for members under ``key``, if any (for deadlocks)."""
        return self._open.get(key)

    def join(self, rank: int, a: Action, i: int) -> None:
        """Action ``i`` of ``rank`` reaches collective ``a``; the last member starts it."""
        key = self.key_of[i]
        rv = self._open.get(key)
        if rv is None:
            rv = self._open[key] = _Rendezvous(a)
        first = rv.first
        if (a.op, a.nbytes, a.algo, a.protocol, a.channels, a.group) != \
                (first.op, first.nbytes, first.algo, first.protocol, first.channels, first.group):
            raise InputError(
                f"program: collective {a.name!r} on rank {rank} ({a.op}, {a.nbytes} B, {a.algo}) does not match "
                f"{first.name!r} on the other members ({first.op}, {first.nbytes} B, {first.algo})"
            )
        rv.posted[rank] = i
        if len(rv.posted) == self.needed[a.group]:
            del self._open[key]
            rv.began = self.env.now
            quiet = holds_no_sms(a)
            if self.on_begin is not None and not quiet:  # (every member's NCCL kernel now moves data)
                for r in rv.posted:
                    self.on_begin(r, rv.began)
            plan = self.plan_steps(a)
            self._run(plan, rv, f"{a.category or a.op} {a.op} {a.name}", self.plain_finish if quiet else self.finish,
                      plan[5])

    def plan_steps(self, a: Action):
        """The collective's steps and their bookkeeping, built once per distinct
        (op, group, size, algorithm, channels, transport). Under reduced fidelity with fluid rings,
        hops between two shadows are dropped: no simulated rank waits for them, and by
        symmetry they take as long as the hops that are simulated. Under the flow model an
        all-to-all is one bundle of all its sends (``_bundled``), shadows' included: one
        flow, whose weights on the links are the contention the whole group makes."""
        key = (a.op, a.group, a.nbytes, a.algo, a.protocol, a.channels, a.transport)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        algo, protocol = self.choose(a)
        outside = a.transport != "nccl"  # (no NCCL kernel: no base, step latencies or rate caps)
        shadows = self.shadows
        start = self.net.start
        if self.fluid and a.op in BUNDLED_OPS and len(a.group) > 1:
            args, ranks, start = self._bundled(a, protocol)
            steps = [collectives.Transfer(ranks[0], ranks[-1], arg[3], (), arg[4]) for arg in args]
            ends = [tuple(r for r in ranks if r not in shadows)] * len(args)
        else:
            steps = collectives.build(a.op, a.group, a.nbytes, self.topology, algo, channels=a.channels or None,
                                      fluid=self.fluid)
            steps = self._without_shadow_hops(steps) if self.fluid and algo == "ring" and shadows else steps
            nccl_algo = None if a.op in POINT_TO_POINT_OPS or outside else algo
            args = self._step_args(steps, protocol, nccl_algo, nccl_algo and ring_step_latency(
                self.nccl, a.op, a.group, self.topology, algo, protocol))
            if not outside:
                args = self._capped(args, steps, a, algo, protocol)
            ends = [tuple(r for r in ((st.src, st.dst) if st.src != st.dst else (st.src,)) if r not in shadows)
                    for st in steps]
        # Per step: the simulated ranks whose action it counts toward, and the steps that wait for it.
        children: list[list[int]] = [[] for _ in steps]
        involved: dict[int, int] = {}
        for i, st in enumerate(steps):
            for d in st.deps:
                children[d].append(i)
            for r in ends[i]:
                involved[r] = involved.get(r, 0) + 1
        base = 0.0 if outside else base_latency(self.nccl, a.op, a.group, self.topology, algo, protocol)
        plan = (args, ends, [tuple(c) for c in children], [len(st.deps) for st in steps], involved, base, start)
        self._plans[key] = plan
        return plan

    def _without_shadow_hops(self, steps):
        """Reduced fidelity's fluid rings: hops between two shadows dropped, unless they
        share a link with a kept hop (then they are contention the simulated ranks must see)."""
        shadows, route = self.shadows, self.topology.route
        touching = [i for i, s in enumerate(steps) if s.src not in shadows or s.dst not in shadows]
        used = {l for i in touching for l in route(steps[i].src, steps[i].dst)}
        keep = [i for i, s in enumerate(steps) if s.src not in shadows or s.dst not in shadows
                or not used.isdisjoint(route(s.src, s.dst))]
        index = {old: new for new, old in enumerate(keep)}
        return [collectives.Transfer(s.src, s.dst, s.nbytes, tuple(index[d] for d in s.deps), s.label,
                                     s.latency_steps, s.path, s.nvls, s.lead_bytes) for s in (steps[i] for i in keep)]

    def _bundled(self, a: Action, protocol: str):
        """An all-to-all as ``Bundle``s (``sim.engine.network``) of its point-to-point sends
        (``sim.engine.algorithms.alltoall_pairs``), shadows' too, one per route latency
        (``Network.bundles``): they carry equal bytes and wait for nothing, and the sends of
        one latency start at once, so the flow that moves them in step ends when its most
        loaded link has carried its members' bytes, as the slowest of them would alone.
        Returns each bundle's start arguments (a step each; every member's action waits for
        all of them), the ranks they involve, and their start function. Bundles are made
        once per group and protocol."""
        pairs, member_bytes = collectives.alltoall_pairs(a.group, a.nbytes)
        key = (a.group, protocol)
        bundles = self._bundles.get(key)
        if bundles is None:
            model = self.nccl
            bundles = self._bundles[key] = self.net.bundles(
                pairs, lambda lat, medium: protocol_cost(lat, medium, 0.0, 1, model, protocol)[0], self.shadows)
        nbytes = protocol_cost(0.0, "nvlink", member_bytes, 1, self.nccl, protocol)[1]  # (wire bytes: any medium's)
        start_bundle = self.net.start_bundle

        def start(route, src, dst, nbytes, label, latency_steps, callback, arg):
            start_bundle(route, nbytes, label, callback, arg)

        ranks = sorted(a.group)
        return [(bundle, ranks[0], ranks[-1], nbytes, a.op, 1) for bundle in bundles], ranks, start

    def efficiency(self) -> dict[str, float]:
        """Each link kind's capacity over its line rate (the profile's efficiencies)."""
        if self._efficiency is not None:
            return self._efficiency
        net, kinds = self.net, self.net.link_kinds
        out = self._efficiency = {}
        for kind in dict.fromkeys(kinds):  # (each kind's first link, found in C: no pass over every link in Python)
            i = kinds.index(kind)
            out[kind] = net.capacity[i] / net.bandwidth[i]
        return out

    def choose(self, a: Action) -> tuple[str, str]:
        """The action's algorithm and protocol, NCCL's tuner's choice where "auto"
        (``sim.engine.nccl.choose``), one choice per shape of group (``_shape``) and size. A collective
        outside NCCL (``Action.transport`` ``direct``) pays no base latency, so the choice leaves it out."""
        algo = a.algo if self.nccl.algo is None else self.nccl.algo
        protocol = a.protocol if self.nccl.protocol is None else self.nccl.protocol
        if self.nccl.algo is None and algo != "auto" and protocol != "auto":
            return algo, protocol
        key = (a.op, a.nbytes, algo, protocol, self._shape(a.group), a.transport)
        c = self._choices.get(key)
        if c is None:
            if self.nccl.algo is not None and not runnable(a.op, a.group, self.topology, algo):
                algo = "auto"  # (a run-wide algorithm this collective cannot run: the tuner's choice)
            if algo != "auto" and protocol != "auto":
                c = (algo, protocol)
            else:
                c = choose(TunerRequest(a.op, a.group, a.nbytes, self.topology, self.efficiency(), self.nccl, algo,
                                        protocol, base=a.transport == "nccl"))
            self._choices[key] = c
        return c

    def _shape(self, group: tuple) -> tuple:
        """What the tuner's choice for ``group`` depends on besides the op and size: its
        members per node, whether NVLS can run, and each member's own links (kind,
        bandwidth, latency, in the members' order), so that groups on different hardware
        (a mixed cluster's node types, a mesh of uneven links) are chosen for separately
        while the like groups of a uniform cluster share one choice."""
        got = self._shapes.get(group)
        if got is None:
            nodes = ranks_by_node(self.topology, group)
            got = self._shapes[group] = (tuple(len(v) for v in nodes.values()), nvls_capable(self.topology, group),
                                         tuple(self._links_of(r) for r in group))
        return got

    def _links_of(self, rank: int) -> tuple:
        got = self._gpu_links.get(rank)
        if got is None:
            g = self.topology.graph
            gpu = self.topology.gpu(rank)
            got = self._gpu_links[rank] = tuple(sorted((e["kind"], e["bandwidth_Bps"], e["latency_s"])
                                                       for e in (g.edges[gpu, n] for n in g.neighbors(gpu))))
        return got

    def _step_args(self, steps, protocol: str, algo: str | None = None, step_s: float | None = None) -> list[tuple]:
        """The network's ``start`` arguments of each step under ``protocol``: Simple and
        plain steps on their routes as they are; other protocols and NVLS steps on a
        copy of the route whose latency and the bytes follow ``sim.engine.nccl``."""
        route, net, topo = self.net.route, self.net, self.topology
        if protocol == "simple" and not any(st.nvls or st.path for st in steps) and (algo is None or
                                                                                   self.nccl.arch is None):
            return [(route(st.src, st.dst), st.src, st.dst, st.nbytes, st.label, st.latency_steps) for st in steps]
        eff = self.efficiency()
        args = []
        for st in steps:
            if st.path:
                ids = tuple(net._link_id[l] for l in st.path)
                # kept with the network's routes, so that its bytes count in link_bytes
                r = net._route.setdefault(("path",) + st.path, (ids, 0.0, net.link_kinds[ids[0]],
                                                                min(net.capacity[i] for i in ids), [0.0]))
            else:
                r = route(st.src, st.dst)
                if not st.nvls:  # (from the route the network keeps: its latency and medium, no graph lookups)
                    lat, nbytes = protocol_cost(r[1], r[2], st.nbytes, st.latency_steps, self.nccl, protocol, algo,
                                                step_s)
                    args.append(((r[0], lat, r[2], r[3], r[4]), st.src, st.dst, nbytes, st.label, 1))
                    continue
            lat, nbytes, _ = transfer_cost(st, topo, eff, self.nccl, protocol, algo, step_s)
            args.append(((r[0], lat, r[2], r[3], r[4]), st.src, st.dst, nbytes, st.label, 1))
        return args

    def _capped(self, args: list[tuple], steps, a: Action, algo: str, protocol: str) -> list[tuple]:
        """``args`` with each step's rate cap under NCCL's tuning model
        (``sim.engine.nccl.rate_caps``): a capped step crosses a link of its own of the cap's
        capacity too (``Network.private_link``), which bounds its rate under max-min
        sharing as the channels NCCL runs bound it."""
        eff = self.efficiency()
        if self._tuner_capacity is None:  # (each link's bandwidth_Bps times its kind's efficiency, as rate_caps has it)
            net = self.net
            self._tuner_capacity = [bw * eff.get(kind, 1.0) for bw, kind in zip(net.bandwidth, net.link_kinds)]
        tcap = self._tuner_capacity  # (the steps' routes' link ids, before any private link below)
        caps = rate_caps(steps, TunerRequest(a.op, a.group, a.nbytes, self.topology, eff, self.nccl, algo, protocol),
                         a.channels or default_channels(self.topology, a.group),
                         bottlenecks=[min(map(tcap.__getitem__, arg[0][0]), default=math.inf) for arg in args])
        if caps is None:
            return args
        out = []
        for (route, src, dst, nbytes, label, lsteps), cap in zip(args, caps):
            if cap < route[3]:
                route = (route[0] + (self.net.private_link(cap),), route[1], route[2], cap, route[4])
            out.append((route, src, dst, nbytes, label, lsteps))
        return out

    def _run(self, plan, rv: _Rendezvous, label: str, finish, base_s: float = 0.0) -> None:
        """Start each step when its dependencies are done, the first ones ``base_s`` after
        the members met (NCCL's base latency); ``finish`` each rank's action when its own
        steps (as sender or receiver) are all done (its busy time from the meeting)."""
        if base_s > 0:
            self.net.calls.at(self.env.now + base_s, self._begin, (plan, rv, label, finish))
        else:
            self._begin((plan, rv, label, finish))

    def _begin(self, job) -> None:
        """``_run``'s work once the base latency has passed: start the steps that wait for none."""
        plan, rv, label, finish = job
        args, ends, children, waiting0, involved, _, start = plan
        waiting = list(waiting0)
        action_of = rv.posted
        left = {r: involved.get(r, 0) for r in action_of}
        began = rv.began
        # The transfers' labels: one string per distinct label, however many collectives
        # share it (every data-parallel group's all-reduce of a bucket does).
        labels = self._labels.get(label)
        if labels is None:
            labels = self._labels[label] = {}

        def finished(i):
            for r in ends[i]:
                if r in left:
                    left[r] -= 1
                    if not left[r]:
                        finish(action_of[r], began, None)
            for c in children[i]:
                waiting[c] -= 1
                if not waiting[c]:  # (the step starts: its start inline, a call less per step)
                    route, src, dst, nbytes, step_label, latency_steps = args[c]
                    full = labels.get(step_label)
                    if full is None:
                        full = labels[step_label] = f"{label} {step_label}"
                    start(route, src, dst, nbytes, full, latency_steps, finished, c)

        for r in sorted(left):
            if left[r] == 0:
                finish(action_of[r], began, None)
        # The steps ready at the start, listed before any starts: a step with no latency and
        # no bytes finishes inside ``start``, and the children that frees are started there.
        for i in [i for i, w in enumerate(waiting) if w == 0]:
            route, src, dst, nbytes, step_label, latency_steps = args[i]
            full = labels.get(step_label)
            if full is None:
                full = labels[step_label] = f"{label} {step_label}"
            start(route, src, dst, nbytes, full, latency_steps, finished, i)
