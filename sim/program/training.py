"""One training iteration as a program: model + plan + hardware (+ topology) -> Program.

The three inputs stay separate (as Calculon keeps model, system and execution apart):
``sim.program.workload`` says what each layer computes, ``sim.program.costs`` how long
each kernel and the optimizer step take on the profile, ``sim.program.memory`` how many
bytes each rank holds and moves (model states, activations, gradient and parameter
buffers), the schedule says in which order each pipeline rank runs its steps, and the
passes (``sim.program.passes``, ``sim.program.zero``) add the communication and the
memory events. ``sim.session`` hands the program to the engine, which runs it on the
topology.

    schedule -> to_program -> replicate -> add_tp_collectives -> add_p2p
             -> add_grad_sync -> add_optimizer -> add_memory
"""

from __future__ import annotations

from functools import lru_cache

from sim.program import passes
from sim.program import zero
from sim.program.amax import add_amax_reductions, chunk_gemms, stage_groups
from sim.program.actions import Action, Program
from sim.program.coalesce import coalesce, isolated_tp_pricer
from sim.program.costs import cpu_optimizer_step_time, op_time, optimizer_step_time
from sim.errors import InputError
from sim.inputs.hardware import HardwareProfile
from sim.program.limits import DEFAULT_MAX_EVENTS, check_size
from sim.program.memory.states import expert_data_parallel, stage_param_split
from sim.program.memory import (
    chunk_activation_parts,
    fp8_layer_weights,
    layer_param_bytes,
    offload_copy_bytes,
    optimizer_shard_params,
    param_allgather_bytes,
    recompute_working_bytes,
    stage_resident_bytes,
    sync_bucket_bytes,
    zero3_depth,
)
from sim.inputs.experts import Folding
from sim.inputs.model import ModelSpec, layer_param_split
from sim.inputs.plan import ParallelPlan
from sim.program.schedule_io import validate
from sim.program.schedules import Schedule, Step, build_schedule, to_program
from sim.inputs.topology import Topology
from sim.program.routing import Routing
from sim.program.workload import Comm, chunk_work, p2p_bytes
from sim.program.tp import overlapped_layer

_COLLECTIVE = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
               "all_to_all": "alltoall", "shift": "shift"}
PIPELINE_KINDS = ("F", "B", "I", "W")


class _Segments:
    """Per (virtual stage, step kind): the step's compute segments and tp collectives."""

    def __init__(self, model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile,
                 price=None, keep_layers=None):
        self.model, self.plan, self.profile = model, plan, profile
        self._cache = lru_cache(maxsize=None)(self._build)
        self._coalesced = lru_cache(maxsize=None)(self._coalesce)
        self.price = price  # closed-form price of isolated tp collectives (sim.program.coalesce), or None
        self.keep_layers = keep_layers or (lambda step: True)
        self._by_name: dict[str, tuple] = {}
        self.routing = Routing(model, plan) if model.moe else None
        """Tokens per expert (``sim.program.routing``); steps differ by micro-batch unless balanced."""
        self._per_mb = self.routing is not None and not self.routing.balanced
        self._sizes = {"tp": plan.tp, "ep": plan.ep, "etp": plan.etp_size, "cp": plan.cp}

    def _coalesce(self, stage: int, kind: str, keep: bool, mb=None):
        return coalesce(self._cache(stage, kind, mb), self.price, keep)

    def layers(self, stage: int, mb: int | None = None) -> list:
        """(layer id, Work) of a virtual stage in forward order: -1 embedding, L the head
        (``mb``: the micro-batch, for the expert loads of uneven routing)."""
        works = chunk_work(self.model, self.plan, stage, mb, self.routing)
        ids = list(self.plan.layer_range(self.model, stage))
        out, k = [], 0
        for w in works:
            if w.name == "embedding":
                out.append((-1, w))
            elif w.name == "head":
                out.append((self.model.num_layers, w))
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
                segs += overlapped_layer(live, lid, lambda op: op_time(op, self.profile), self.plan.tp,
                                         lambda it: isinstance(it, Comm), lambda c: _COLLECTIVE[c.collective],
                                         base=len(segs), group_of=lambda c: c.group)
                continue
            dur = flops = 0.0
            side: dict[str, int] = {}  # side collectives of the layer by name -> their segment's position
            waits: tuple = ()
            for it in items:
                if isinstance(it, Comm):
                    if dur or waits:
                        segs.append(passes.Segment("compute", dur, flops, layer=lid, waits=waits))
                        dur, flops, waits = 0.0, 0.0, ()
                    if self._sizes[it.group] > 1:
                        if it.side:  # issued now, beside the compute that follows (ring attention)
                            side[it.name] = len(segs)
                            main = next((k for k in range(len(segs) - 1, -1, -1) if not segs[k].side), None)
                            segs.append(passes.Segment("collective", op=_COLLECTIVE[it.collective], nbytes=it.nbytes,
                                                       layer=lid, group=it.group, side=True,
                                                       waits=() if main is None else (main,)))
                        else:
                            segs.append(passes.Segment("collective", op=_COLLECTIVE[it.collective],
                                                       nbytes=it.nbytes, layer=lid, group=it.group))
                else:
                    if it.after in side:  # this op needs that side collective: a new piece waits for it
                        if dur or waits:
                            segs.append(passes.Segment("compute", dur, flops, layer=lid, waits=waits))
                            dur = flops = 0.0
                        waits = (side[it.after],)
                    dur += op_time(it, self.profile)
                    flops += it.flops
            if dur or waits or not items:
                segs.append(passes.Segment("compute", dur, flops, layer=lid, waits=waits))
        return tuple(segs)

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


FIDELITIES = ("full", "reduced")


def build_program(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile,
                  schedule: Schedule | None = None, fidelity: str = "full",
                  gpus_per_node: int = 8, topology: Topology | None = None,
                  coalesce_tp: bool = True, max_events: float | None = DEFAULT_MAX_EVENTS,
                  collective_model: str = "flows", nccl=None) -> tuple[Schedule, Program]:
    """The iteration program of ``plan``: every GPU's compute and communication.

    ``fidelity="reduced"`` simulates one GPU per pipeline stage (dp index 0, tp index
    0). The other GPUs do the same work at the same times, so they are shadows: they take
    part in every collective, whose ring hops touching a simulated GPU cross the full
    topology, but their own compute and traffic are not simulated; by symmetry each
    shadow's hops take as long as the simulated ones. Reduced fidelity also prices ring
    collectives as fluid hops (``sim.engine.algorithms``). Left out: contention between
    collectives of different tensor-parallel ranks on shared links (on rail-optimized
    fabrics with tensor parallelism inside a node they use different rails).

    A plan whose simulation would exceed ``max_events`` SimPy events (None: no limit) is
    refused before anything is built (``sim.program.limits``).
    """
    if fidelity not in FIDELITIES:
        raise InputError(f"fidelity: got {fidelity!r}; allowed: {', '.join(FIDELITIES)}")
    plan.check_model(model)
    price = None
    expert_groups = plan.ep > 1 or (model.moe and plan.etp_size not in (1, plan.tp)) or plan.cp > 1
    if coalesce_tp and topology is not None and not plan.tp_comm_overlap and not expert_groups:
        # (overlapped chunks are not a chain; expert all-to-alls share links with other traffic)
        price = isolated_tp_pricer(plan, topology, profile.link_efficiencies(), nccl)  # nccl: op, group, bytes -> s
    check_size(model, plan, fidelity, max_events, topology, coalesced=price is not None if topology else None,
               collective_model=collective_model)
    if schedule is None:
        schedule = build_schedule(plan.schedule, plan.pp, plan.num_microbatches, plan.vpp)
    elif (schedule.pp, schedule.vpp, schedule.num_microbatches) != (plan.pp, plan.vpp, plan.num_microbatches):
        raise InputError(
            f"schedule {schedule.name}: has pp={schedule.pp}, vpp={schedule.vpp}, m={schedule.num_microbatches}; "
            f"the plan needs pp={plan.pp}, vpp={plan.vpp}, m={plan.num_microbatches}"
        )
    validate(schedule)
    segments = _Segments(model, plan, profile, price, _layer_steps(schedule, plan))
    prog = to_program(schedule, lambda step: 0.0)
    keep = None
    if fidelity == "reduced":
        # Tensor-parallel peers are shadows only where each GPU has a NIC of its own, so
        # that their own data-parallel traffic could not contend with the simulated one's.
        own_nics = topology is None or _own_nics(topology)
        keep = lambda g: plan.coords(g)[0] == 0 and (not own_nics or plan.coords(g)[2] == 0)  # noqa: E731
    # The passes run on one GPU per pipeline stage (dp 0, tp 0); ``passes.expand`` then
    # copies each stage's program onto its GPUs (``keep``: the simulated ones).
    folding = Folding(plan) if model.moe else None
    rep_of, moved, groups_of = _copies(plan, folding)
    rep_set = {rep_of(g) for g in range(plan.world_size)}
    prog = passes.replicate(prog, plan.world_size, plan.coords, plan.rank, lambda g: g in rep_set)
    def other_groups(r: int) -> dict:
        out = {"cp": plan.cp_group(r)} if plan.cp > 1 else {}
        if folding is not None:
            out.update(ep=folding.ep_group(r), etp=folding.etp_group(r))
        return out

    prog = passes.add_tp_collectives(prog, segments, plan.tp_group, other_groups)
    if plan.fp8_format is not None:  # delayed scaling's amax all-reduces (before the sends, which wait for them)
        prog = add_amax_reductions(prog, stage_groups(plan), chunk_gemms(model, plan), nccl)
    act_bytes = p2p_bytes(model, plan.micro_batch_size, plan.tp, plan.sequence_parallel, cp=plan.cp)
    prog = passes.add_p2p(prog, lambda consumer: act_bytes)

    layer_grad = layer_param_bytes(model, plan.tp, 0)
    emb_grad = layer_param_bytes(model, plan.tp, -1)
    head_grad = layer_param_bytes(model, plan.tp, model.num_layers)
    split = {lid: [2.0 * x for x in layer_param_split(model, lid, plan.tp, plan.ep, plan.etp_size)]
             for lid in range(model.num_layers) if model.is_moe_layer(lid)}

    def grad_bytes(rank: int, layer: int) -> float:
        if layer == -1:
            return emb_grad
        if layer == model.num_layers:
            return head_grad
        got = split.get(layer)
        return layer_grad if got is None else got[0]

    z = plan.zero_stage
    bucket = sync_bucket_bytes(plan)
    sync = dict(op="allreduce" if z == 0 else "reducescatter", every_microbatch=z >= 2, bucket_memory=z >= 2)
    prog = passes.add_grad_sync(prog, grad_bytes, plan.dp_group, bucket, plan.dp_overlap, **sync)
    if split:  # the experts' gradients, over the ranks that hold the same experts
        prog = passes.add_grad_sync(prog, lambda r, lid: split[lid][1] if lid in split else 0.0, folding.edp_group,
                                    bucket, plan.dp_overlap, label="expert grad bucket", **sync)
    if z == 3:
        prog = zero.add_param_gathers(prog, grad_bytes, plan.dp_group, zero3_depth(model, plan))
    psi_split = [stage_param_split(model, plan, s) for s in range(plan.pp)]
    edp = expert_data_parallel(plan)
    psi = [d + x for d, x in psi_split]
    if plan.offload_optimizer:
        # Memory-bound Adam on the host, whose bandwidth the node's GPUs share.
        sharing = min(gpus_per_node, plan.world_size)
        cpu = [cpu_optimizer_step_time(optimizer_shard_params(n, plan.dp_cp, z), profile, sharing) for n in psi]
        copy = [offload_copy_bytes(n, plan.dp_cp) for n in psi]
        prog = zero.add_offloaded_optimizer(prog, lambda r: copy[plan.coords(r)[1]], lambda r: cpu[plan.coords(r)[1]])
        done = "params to GPU"
    else:
        step_s = [optimizer_step_time(optimizer_shard_params(d, plan.dp_cp, z) + optimizer_shard_params(x, edp, z),
                                      profile) for d, x in psi_split]
        prog = passes.add_optimizer(prog, lambda r: step_s[plan.coords(r)[1]])
        done = "optimizer"
    fp8_saved = (lambda lid: fp8_layer_weights(model, plan.tp, lid)) if plan.fp8_param_gather else (lambda lid: 0.0)
    # FP8 weights (--fp8-param-gather) are gathered in 1 byte instead of 2
    if z in (1, 2) and plan.param_gather_overlap:
        prog = zero.add_param_allgather_ahead(prog, lambda r, lid: grad_bytes(r, lid) - fp8_saved(lid), plan.dp_group,
                                              bucket)
        if split:
            prog = zero.add_param_allgather_ahead(prog, lambda r, lid: split[lid][1] if lid in split else 0.0,
                                                  folding.edp_group, bucket, label="expert param allgather")
    elif z in (1, 2):
        stage_layers = plan.stage_layers(model)
        gathered = [param_allgather_bytes(d) - sum(fp8_saved(i) for c in range(plan.vpp)
                                                   for i in plan.layer_range(model, c * plan.pp + s))
                    for s, (d, _) in enumerate(psi_split)]

        def tensors(rank: int) -> int:
            # the rank's layers over its model chunks, plus the embedding and the head
            p = plan.coords(rank)[1]
            return sum(stage_layers[c * plan.pp + p] for c in range(plan.vpp)) + 2

        prog = zero.add_param_allgather(prog, lambda r: gathered[plan.coords(r)[1]], plan.dp_group, bucket, done,
                                        tensors)
        if split:
            prog = zero.add_param_allgather(prog, lambda r: param_allgather_bytes(psi_split[plan.coords(r)[1]][1]),
                                            folding.edp_group, bucket, done, tensors, label="expert param allgather")
    prog = add_memory(prog, model, plan, profile, segments)
    prog = passes.expand(prog, plan.world_size, rep_of, moved, keep, groups_of)
    return schedule, prog


def _copies(plan: ParallelPlan, folding: Folding | None = None):
    """What ``passes.expand`` needs to copy the stage programs (made on dp 0, tp 0) onto
    every GPU: ``rep_of(g)``, the GPU of g's stage that the passes ran on; ``moved(x, g)``,
    the rank whose dp and tp indices are x's shifted by g's (a bijection of the cluster
    that maps ``rep_of(g)`` to g, its tp group onto g's and its dp group onto g's); and
    ``groups_of(g)``, the template's tp and dp groups -> g's (each a tuple of the plan's,
    made once, instead of moving their members one by one). With expert parallelism
    ``moved`` is ``folding.moved``, which also keeps the expert groups."""
    size = {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp_cp}
    stride, s = {}, 1
    for dim in plan.placement_order:  # ranks are mixed-radix numbers (sim.inputs.placement)
        stride[dim], s = s, s * size[dim]
    sd, sp, st = stride["dp"], stride["pp"], stride["tp"]
    nd, npp, nt, nc = plan.dp_cp, plan.pp, plan.tp, plan.cp

    def rep_of(g: int) -> int:
        return g // sp % npp * sp

    def moved(x: int, g: int) -> int:
        xd, gd = x // sd % nd, g // sd % nd  # the dp index runs over dp·cp, cp the inner digit
        d = (xd // nc + gd // nc) % plan.dp * nc + (xd + gd) % nc
        t = (x // st + g // st) % nt
        return d * sd + x // sp % npp * sp + t * st

    tp_groups: dict[int, tuple] = {}  # by first member
    dp_groups: dict[int, tuple] = {}

    def groups_of(g: int) -> dict[tuple, tuple]:
        rep = rep_of(g)
        tg = g - g // st % nt * st
        dg = g - g // sd % nd * sd
        if tg not in tp_groups:
            tp_groups[tg] = tuple(tg + i * st for i in range(nt))
        if dg not in dp_groups:
            dp_groups[dg] = tuple(dg + i * sd for i in range(nd))
        return {plan.tp_group(rep): tp_groups[tg], plan.dp_group(rep): dp_groups[dg]}

    if folding is not None and (plan.ep > 1 or plan.etp_size != plan.tp):
        moved = folding.moved  # noqa: F811 (the expert groups need the folded digits)
    return rep_of, moved, groups_of


def _own_nics(topology: Topology) -> bool:
    """Whether every GPU reaches the network through a NIC no other GPU uses."""
    g = topology.graph
    seen: set[str] = set()
    for gpu in topology.gpus:
        nics = [n for n in g.neighbors(gpu) if g.nodes[n]["kind"] == "nic"]
        if len(nics) > 1 or any(n in seen for n in nics):
            return False
        seen.update(nics)
        for n in nics:
            if sum(1 for m in g.neighbors(n) if g.nodes[m]["kind"] == "gpu") > 1:
                return False
    return True


def _layer_steps(schedule: Schedule, plan: ParallelPlan):
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
        if plan.zero_stage == 3:
            return True
        if plan.zero_stage == 2:
            return step.kind in ("B", "W")
        return step in last

    return keep


def add_memory(prog: Program, model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile,
               segments: "_Segments") -> Program:
    """Resident model states (sharded per the ZeRO stage), the reserve, and each
    (stage, micro-batch)'s stored activations while they are alive; the bytes are
    ``sim.program.memory``'s."""
    resident = [stage_resident_bytes(model, plan, s, profile.memory_reserve_bytes) for s in range(plan.pp)]
    chunk = [chunk_activation_parts(model, plan, vs) for vs in range(plan.pp * plan.vpp)]

    stage_of: dict[str, int] = {}

    def stored(rank: int, step: str) -> float:
        stage = stage_of.get(step)
        if stage is None:
            stage = stage_of[step] = Step.parse(step).stage
        return chunk[stage]

    working = recompute_working_bytes(model, plan)
    transient = (lambda rank, step: working) if plan.recompute == "full" else None
    prog = zero.add_activation_memory(prog, stored, transient)
    return zero.add_resident(prog, lambda rank: resident[plan.coords(rank)[1]])
