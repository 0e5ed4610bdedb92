"""Each pipeline step cut into its layers: compute segments and the collectives between them.

A schedule's step (``2F0``: virtual stage 2's forward of micro-batch 0) is one compute
action until the program-building pass ``layers`` (``sim.program.training``) asks
``StepSegments`` what it holds: per layer, in the step's order (forward: embedding,
layers, head; backward the reverse), the layer's ops priced by ``sim.program.costs``,
merged into one compute segment between communications, and the layer's collectives
(``sim.program.workload``'s ``Comm`` items) over their groups: tensor-parallel
all-reduces or all-gathers and reduce-scatters, context-parallel ring shifts or
all-gathers (issued beside the compute that follows, ``side``), expert-parallel
all-to-alls and expert-tensor-parallel gathers. A collective whose group has one GPU is
left out. Under ``tp_comm_overlap`` a layer's tensor-parallel pairs become Transformer
Engine's chunked pipelines (``sim.program.tp.overlapped_layer``).

Segments depend on the step alone (its virtual stage and kind; and its micro-batch when
uneven expert routing gives micro-batches different loads, ``sim.program.routing``), so
they are built once per step and shared by every rank that runs it. Where isolated
tensor-parallel collectives provably have their links to themselves, a chain of them and
the compute between is coalesced into one priced segment (``sim.program.coalesce``),
except in the steps ``layer_steps`` says must keep per-layer pieces (gradient buckets
and ZeRO gathers act per layer).
"""

from __future__ import annotations

from functools import lru_cache

from sim.inputs.model import ModelSpec
from sim.inputs.hardware import HardwareProfile
from sim.inputs.plan import ParallelPlan
from sim.program import passes
from sim.program.actions import Action
from sim.program.coalesce import coalesce
from sim.program.costs import op_time, ring_time
from sim.program.dispatch import DISPATCH_GROUPS, group_sizes
from sim.program.launch import HOST_LAUNCH_S
from sim.program.routing import Routing
from sim.program.schedules import Schedule, Step
from sim.inputs.tp_overlap import margin_profile, overlaps
from sim.program.tp import ItemReader, overlapped_layer
from sim.program.workload import Comm, chunk_work

_COLLECTIVE = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
               "all_to_all": "alltoall", "shift": "shift"}
PIPELINE_KINDS = ("F", "B", "I", "W")
EXPERT_GROUPS = ("ep", "etp") + DISPATCH_GROUPS


class StepSegments:
    """Per (virtual stage, step kind): the step's compute segments and collectives (module doc)."""

    def __init__(self, model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile,
                 price=None, keep_layers=None, layout=None):
        self.model, self.plan, self.profile = model, plan, profile
        self._cache = lru_cache(maxsize=None)(self._build)
        self._coalesced = lru_cache(maxsize=None)(self._coalesce)
        self.price = price  # closed-form price of isolated tp collectives (sim.program.coalesce), or None
        self.keep_layers = keep_layers or (lambda step: True)
        self._by_name: dict[str, tuple] = {}
        self.routing = Routing(model, plan) if model.moe else None
        """Tokens per expert (``sim.program.routing``); steps differ by micro-batch unless balanced."""
        self._per_mb = self.routing is not None and not self.routing.balanced
        self.layout = layout
        """Where the expert-parallel groups sit on the nodes (``sim.program.dispatch.EpLayout``)."""
        self._overlaps = overlaps(plan.tp_comm_overlap_cfg)
        """Transformer Engine's overlap per GEMM (``sim.inputs.tp_overlap``), or None."""
        self._sizes = {"tp": plan.tp, "ep": plan.ep, "etp": plan.etp_size, "cp": plan.cp,
                       **group_sizes(plan, layout)}

    def _coalesce(self, stage: int, kind: str, keep: bool, mb=None):
        return coalesce(self._cache(stage, kind, mb), self.price, keep)

    def layers(self, stage: int, mb: int | None = None) -> list:
        """(layer id, Work) of a virtual stage in forward order: -1 embedding, L the head,
        L + 1 + k multi-token-prediction module k (``mb``: the micro-batch, for the expert
        loads of uneven routing)."""
        works = chunk_work(self.model, self.plan, stage, mb, self.routing, self.layout, self.profile)
        ids = list(self.plan.layer_range(self.model, stage))
        out, k, mtp = [], 0, self.model.num_layers + 1
        for w in works:
            if w.name == "embedding":
                out.append((-1, w))
            elif w.name == "head":
                out.append((self.model.num_layers, w))
            elif w.name == "mtp":
                out.append((mtp, w))
                mtp += 1
            else:
                out.append((ids[k], w))
                k += 1
        return out

    def _build(self, stage: int, kind: str, mb: int | None = None) -> tuple[passes.Segment, ...]:
        seq = self.layers(stage, mb)
        if kind == "F":
            parts = [(lid, w.phase("F")) for lid, w in seq]
        elif kind == "B":
            parts = [(lid, w.phase("B") + w.phase("W")) for lid, w in reversed(seq)]
        elif kind == "I":
            parts = [(lid, w.phase("B")) for lid, w in reversed(seq)]
        else:
            parts = [(lid, w.phase("W")) for lid, w in reversed(seq)]
        segs: list[passes.Segment] = []
        for lid, items in parts:
            if self.plan.tp_comm_overlap and self.plan.tp > 1:
                live = [it for it in items if not isinstance(it, Comm) or self._sizes[it.group] > 1]
                read = ItemReader(self._time_on, lambda it: isinstance(it, Comm), lambda c: _COLLECTIVE[c.collective],
                                  group_of=lambda c: c.group, label_of=_label, comm_of=self._ub_comm_s)
                segs += overlapped_layer(live, lid, self.plan.tp, read, base=len(segs), cfg=self._overlaps)
                continue
            dur = flops = 0.0
            side: dict[str, int] = {}  # side collectives of the layer by name -> their segment's position
            waits: tuple = ()
            host = _HostLaunches(segs)
            for it in items:
                if it.host_sync:
                    if dur or waits:
                        host.compute(dur, flops, lid, waits)
                        dur, flops, waits = 0.0, 0.0, ()
                    host.sync()
                if isinstance(it, Comm):
                    if dur or waits:
                        host.compute(dur, flops, lid, waits)
                        dur, flops, waits = 0.0, 0.0, ()
                    if self._sizes[it.group] > 1:
                        host.launched(1)
                        if it.side:  # issued now, beside the compute that follows (ring attention)
                            side[it.name] = len(segs)
                            main = next((k for k in range(len(segs) - 1, -1, -1) if not segs[k].side), None)
                            segs.append(passes.Segment("collective", op=_COLLECTIVE[it.collective], nbytes=it.nbytes,
                                                       layer=lid, group=it.group, side=True, label=_label(it),
                                                       waits=() if main is None else (main,)))
                        else:
                            segs.append(passes.Segment("collective", op=_COLLECTIVE[it.collective],
                                                       nbytes=it.nbytes, layer=lid, group=it.group,
                                                       label=_label(it)))
                else:
                    needs = tuple(side[n] for n in (it.after if isinstance(it.after, tuple) else (it.after,))
                                  if n in side)
                    if needs:  # this op needs side collectives: a new piece waits for them
                        if dur or waits:
                            host.compute(dur, flops, lid, waits)
                            dur = flops = 0.0
                        waits = needs
                    g = self._time_on(it, it.sms_held) if it.sms_held else op_time(it, self.profile)
                    dur += g
                    flops += it.flops
                    host.launched(it.kernels, g)
            if dur or waits or not items:
                host.compute(dur, flops, lid, waits)
        return tuple(segs)

    def _time_on(self, op, sms_held: int = 0) -> float:
        """``op_time`` of ``op`` on the SMs an overlap leaves it (``sim.inputs.tp_overlap``)."""
        return op_time(op, margin_profile(self.profile, sms_held))

    def _ub_comm_s(self, op: str, nbytes: float) -> float:
        """Seconds a userbuffers collective of the tensor-parallel group takes alone, by the ring
        closed form over NVLink without NCCL's base latency (``sim.program.costs.ring_time``)."""
        link = self.profile.link("nvlink" if "nvlink" in self.profile.links else "pcie")
        return ring_time(op, nbytes, self.plan.tp, link.latency_s, link.bandwidth_Bps * link.efficiency)

    def __call__(self, rank: int, action: Action):
        """The step's segments (one tuple per step name, whatever the rank: the pieces
        depend on the step alone)."""
        if action.kind != "compute" or action.category not in PIPELINE_KINDS:
            return None
        segs = self._by_name.get(action.name)
        if segs is None:
            step = Step.parse(action.name)
            mb = step.mb if self._per_mb else None
            if self.price is not None:
                segs = tuple(self._coalesced(step.stage, step.kind, self.keep_layers(step), mb))
            else:
                segs = tuple(self._cache(step.stage, step.kind, mb))
            self._by_name[action.name] = segs
        return segs


class _HostLaunches:
    """Appends a layer's compute segments to ``segs``; after a host synchronisation
    (``Op.host_sync``) with the host's launches beside them (``sim.program.launch``): per
    compute segment a host piece of its kernels' launches (and those of the collectives
    before it), after the previous piece (the first after the segment before the
    synchronisation), and the segment's last kernel cut off to wait for its piece."""

    def __init__(self, segs: list):
        self.segs = segs
        self.on = False
        self.prev: int | None = None  # the host's latest piece (or the GPU's piece it waits for)
        self.kernels = 0
        self.last = 0.0  # GPU seconds of the latest kernel

    def sync(self) -> None:
        self.on, self.kernels = True, 0
        self.prev = len(self.segs) - 1 if self.segs else None

    def launched(self, kernels: int, gpu_s: float = 0.0) -> None:
        if self.on:
            self.kernels += kernels
            if gpu_s:
                self.last = gpu_s

    def compute(self, dur: float, flops: float, lid, waits: tuple) -> None:
        segs = self.segs
        if not self.on or not self.kernels or not dur:
            segs.append(passes.Segment("compute", dur, flops, layer=lid, waits=waits))
            return
        after = () if self.prev is None else (self.prev,)
        segs.append(passes.Segment("host", self.kernels * HOST_LAUNCH_S, layer=lid, waits=after))
        self.prev, self.kernels = len(segs) - 1, 0
        tail = min(self.last, dur)
        if dur > tail:
            segs.append(passes.Segment("compute", dur - tail, flops * (1 - tail / dur), layer=lid, waits=waits))
            waits = ()
        segs.append(passes.Segment("compute", tail, flops * tail / dur, layer=lid, waits=waits + (self.prev,)))


def _label(comm: Comm) -> str:
    """What a collective's action is called after its step's piece number: the token
    dispatchers' exchanges by their names (``moe.dispatch``, ``moe.dispatch.rdma``, ...), so
    a trace shows which dispatcher ran; nothing for the others."""
    return comm.name if comm.group in EXPERT_GROUPS else ""


def layer_steps(schedule: Schedule, plan: ParallelPlan):
    """Which steps must keep per-layer pieces: every step under ZeRO-3 (gathers per
    layer), every backward under ZeRO-2 (reduce-scatter per layer and micro-batch), and
    otherwise each stage's last backward on its rank (gradient buckets), when dp > 1."""
    last: set[Step] = set()
    for steps in schedule.ranks:
        final: dict[int, Step] = {}
        for st in steps:
            if st.kind in ("B", "W"):
                final[st.stage] = st
        last.update(final.values())

    def keep(step: Step) -> bool:
        if plan.dp_cp == 1:
            return False
        if plan.zero.shards_params:
            return True
        if plan.zero.reduce_scatters_each_backward:
            return step.kind in ("B", "W")
        return step in last

    return keep
