"""One training iteration as a program: a pipeline of named passes over one context.

The inputs stay separate (as Calculon keeps model, system and execution apart):
``sim.program.workload`` says what each layer computes, ``sim.program.costs`` how long
each kernel and the optimizer step take on the profile, ``sim.program.memory`` how many
bytes each rank holds and moves, and the schedule in which order each pipeline rank runs
its steps. ``BuildContext`` (``sim.program.build``) holds the model, the plan, the
topology, the profile paced once for the job, and the build options; ``build`` runs the
passes below on it, in this order (``PASSES``), each a function
``(context, draft) -> draft`` that adds one thing to the program in progress (``Draft``:
the schedule and the program so far):

    limits        refuse a simulation over the event limit, before anything is built
    schedule      the pipeline schedule's steps, one compute action each per pipeline rank
    stages        each pipeline rank's steps onto its stage's template GPU (dp 0, tp 0)
    layers        each step cut into its layers' compute segments and the collectives
                  inside a layer: tensor- (tp), context- (cp) and expert-parallel (ep, etp)
    ep_overlap    with ``overlap_moe_expert_parallel_comm``, each steady-state forward and
                  backward pair interleaved layer by layer, all-to-alls on their own stream
    fp8_amax      FP8 delayed scaling's amax all-reduces after each chunk's F and B
    p2p           pipeline sends and receives between stages
    grad_sync     data-parallel gradient buckets (all-reduce, or reduce-scatter under
                  ZeRO), and the experts' over their own data-parallel group
    zero3_gather  ZeRO-3's per-layer parameter all-gathers, prefetched as the framework
                  does (``backward_prefetch``), kept from forward to backward without
                  ``reshard_after_forward`` (an MoE layer's experts over their own
                  data-parallel group); under PyTorch FSDP (llm-foundry's FSDP1, torchtitan's
                  and AutoModel's FSDP2) its copies around them (``sim.program.fsdp``)
    process_group_streams  every data-parallel collective (gathers, gradient buckets) on
                  its process group's one NCCL stream, in the order it is issued
                  (``sim.program.process_group_streams``)
    optimizer     the optimizer step on the GPU
    offload       or, with ``offload_optimizer``, on the host with its copies
    param_gather  ZeRO-1/2's parameter all-gather after the step (or overlapped ahead of
                  the next forward); FP8 weights gathered in one byte; under DeepSpeed's
                  ZeRO-3, its persistent parameters' all-gather after the step
    memory        resident model states and each micro-batch's stored activations
    activation_offload  with ``cpu_offloading_num_layers``, the first N layers' activations
                  to the host and back (``sim.program.activation_offload``)
    expand        each template GPU's program copied onto every GPU of its stage
                  (reduced fidelity: one GPU per stage simulated, the rest shadows)

A pass that has nothing to add for the plan (no FP8, no ZeRO-3) returns the draft as it
is. The passes up to ``expand`` run on one GPU per pipeline stage; ``expand`` copies the
result onto the cluster (``sim.program.passes.expand``). The generic program passes
these call live in ``sim.program.passes`` (replicate, p2p, gradient buckets, optimizer,
expand), ``sim.program.zero`` (ZeRO, offload, memory events) and ``sim.program.amax``.

A new feature is a setting in the schema and a pass here (or a branch of the pass it
belongs to), with a test of what that pass adds on a hand-checkable plan
(``tests/test_passes.py``). ``build_program`` is the same pipeline behind the long
argument list (``sim.session`` calls it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from sim.errors import InputError
from sim.inputs.experts import Folding
from sim.inputs.frameworks import (DEFAULT_FRAMEWORK, FRAMEWORKS, deepspeed_kept_layers, framework_of, p2p_blocks,
                                   persistent_params)
from sim.inputs.hardware import HardwareProfile
from sim.inputs.model import ModelSpec, layer_param_split, mtp_param_split
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology import Topology
from sim.program import passes
from sim.program import zero
from sim.program.actions import Program
from sim.program.activation_offload import add_activation_offload
from sim.program.amax import add_amax_reductions, chunk_gemms, stage_groups
from sim.program.build import BuildContext
from sim.program.costs import (GRAD_REDUCE_BYTES, OPTIMIZER_BYTES_PER_PARAM, cpu_optimizer_step_time,
                               grad_reduce_scale, optimizer_step_time)
from sim.program.ep_overlap import add_ep_overlap, overlap_schedule, steady_pairs
from sim.program.dispatch import dispatch_groups, ep_layout
from sim.program.fp8 import BF16_BYTES, gathered_weight_bytes
from sim.program.fsdp import (GRAD_BYTES, add_deferred_accumulations, add_fsdp_copies, deferred_accumulations,
                              fsdp_copies)
from sim.program.limits import check_size
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
from sim.program.memory.states import expert_data_parallel, stage_param_split
from sim.program.process_group_streams import group_streams, put_on_group_streams
from sim.program.schedule_io import validate
from sim.program.schedules import Schedule, Step, build_schedule, repeated, to_program
from sim.program.segments import StepSegments, layer_steps
from sim.program.workload import p2p_bytes


@dataclass(frozen=True)
class Draft:
    """The program in progress: the schedule (once the ``schedule`` pass has run) and the
    program so far."""

    schedule: Schedule | None = None
    program: Program | None = None

    def with_program(self, program: Program) -> "Draft":
        return replace(self, program=program)


# ---------------------------------------------------------------- what several passes share
def _grad_bytes(ctx: BuildContext) -> Callable[[int, int], float]:
    """(rank, layer) -> the 16-bit gradient (and weight) bytes of a layer on the template
    rank: the embedding (-1), a transformer layer (its dense part in an MoE layer), the head."""
    model, plan = ctx.model, ctx.plan
    layer_grad = layer_param_bytes(model, plan.tp, 0)
    emb_grad = layer_param_bytes(model, plan.tp, -1)
    head_grad = layer_param_bytes(model, plan.tp, model.num_layers)
    dense = {lid: bytes_[0] for lid, bytes_ in _expert_split(ctx).items()}
    dense.update(_mtp_dense_bytes(ctx))

    def grad_bytes(rank: int, layer: int) -> float:
        if layer == -1:
            return emb_grad
        if layer == model.num_layers:
            return head_grad
        got = dense.get(layer)
        return layer_grad if got is None else got

    return grad_bytes


def _fp8_gather_savings(ctx: BuildContext) -> tuple[Callable[[int], float], float]:
    """With FP8 weights (``fp8_param_gather``): (layer -> the bytes a parameter all-gather
    of that layer saves on its FP8 GEMM weights, the experts' share of their 16-bit
    bytes gathered), from ``sim.program.fp8.gathered_weight_bytes``: 1 byte of 2 per
    weight per-tensor, none under MXFP8 (gathered in BF16); (0, 1) without them. The
    routed experts' weights are all FP8 GEMM weights (``sim.program.fp8``)."""
    model, plan = ctx.model, ctx.plan
    if not plan.fp8_param_gather:
        return (lambda lid: 0.0), 1.0
    kept = gathered_weight_bytes(plan.precision.recipe)
    saved = BF16_BYTES - kept
    return (lambda lid: saved * fp8_layer_weights(model, plan.tp, lid)), kept / BF16_BYTES


def _expert_split(ctx: BuildContext) -> dict[int, list[float]]:
    """Per MoE layer: [dense bytes, expert bytes] of its 16-bit parameters on a rank (the
    experts' are synced over the expert data-parallel group); empty without MoE layers."""
    model, plan = ctx.model, ctx.plan
    out = {lid: [2.0 * x for x in layer_param_split(model, lid, plan.tp, plan.ep, plan.etp_size)]
           for lid in range(model.num_layers) if model.is_moe_layer(lid)}
    for k in range(model.mtp_num_layers):  # multi-token prediction module k: action layer id L + 1 + k
        if model.is_moe_layer(model.num_layers + k):
            out[model.num_layers + 1 + k] = [2.0 * x for x in mtp_param_split(model, k, plan.tp, plan.ep,
                                                                              plan.etp_size)]
    return out


def _mtp_dense_bytes(ctx: BuildContext) -> dict[int, float]:
    """Per multi-token-prediction module (action layer id L + 1 + k): the 16-bit bytes of
    its dense parameters on a rank (``mtp_param_split``), the first one with the embedding
    copy the last stage holds for it (``stage_param_split``)."""
    model, plan = ctx.model, ctx.plan
    copy = model.vocab_size * model.hidden_size / plan.tp if plan.pp > 1 and not model.tied_embeddings else 0.0
    return {model.num_layers + 1 + k: 2.0 * (mtp_param_split(model, k, plan.tp, plan.ep, plan.etp_size)[0]
                                              + (copy if k == 0 else 0.0)) for k in range(model.mtp_num_layers)}


EXPERT_GRAD_LABEL = "expert grad bucket"
"""The name of the routed experts' gradient reductions (``grad_sync``), by which FSDP's
copies tell them from the dense ones (``sim.program.fsdp.add_fsdp_copies``)."""


def _expert_bytes(split: dict[int, list[float]]) -> Callable[[int, int], float]:
    return lambda rank, lid: split[lid][1] if lid in split else 0.0


def _persistent_bytes(ctx: BuildContext) -> Callable[[int], float]:
    """layer -> the 16-bit bytes of its parameters that DeepSpeed's ZeRO-3 never partitions
    (``sim.inputs.frameworks.persistent_params``; 0 outside DeepSpeed): the embedding (-1),
    a transformer layer, the head."""
    model, plan = ctx.model, ctx.plan
    got = {lid: 2.0 * persistent_params(model, plan, lid) for lid in (-1, 0, model.num_layers)}
    return lambda lid: got[lid] if lid in (-1, model.num_layers) else got[0] if 0 <= lid < model.num_layers else 0.0


def _sync_options(plan: ParallelPlan, bucket_bytes: float) -> passes.GradSync:
    """How the gradient buckets are reduced under the plan's ZeRO stage (``sim.inputs.strategies.ZeroStage``):
    reduce-scattered into shards once it shards anything (DeepSpeed: only once it shards the
    parameters), every micro-batch once it shards the gradients."""
    zero, overlap, sharding = plan.sections.zero.zero, _sync_overlap(plan), plan.sharding
    if sharding.deepspeed:  # sim.inputs.frameworks: DeepSpeed's reduction of the gradient buckets
        return passes.GradSync(bucket_bytes, overlap, op="reducescatter" if zero.shards_params else "allreduce",
                               every_microbatch=zero.shards_grads,
                               bucket_memory=zero.shards_grads and not sharding.bucket_buffers,  # else in the buffers
                               at_most=zero.shards_optimizer,
                               on_compute=zero.shards_optimizer and not sharding.overlap_comm)
    deferred = sharding.defer_grad_sync  # FSDP's: once per step, the unsharded gradients held till then
    return passes.GradSync(bucket_bytes, overlap, op="reducescatter" if zero.shards_optimizer else "allreduce",
                           every_microbatch=zero.shards_grads and not deferred, bucket_memory=zero.shards_grads,
                           held_from_first=deferred, after_step=deferred and plan.pp > 1,
                           window=sharding.pp_sync_window)  # once per pipeline-schedule call under FSDP2


def _sync_overlap(plan: ParallelPlan) -> bool:
    """Whether the buckets are reduced under backward: as the plan says, and under DeepSpeed
    for ZeRO-2/3 (backward hooks) and for ZeRO-1 with ``overlap_comm``; not without ZeRO
    (the engine's all-reduce after backward)."""
    if plan.sharding.deepspeed:
        zero = plan.sections.zero.zero  # (ZeRO-1 is the stage that shards the optimizer but not the gradients)
        return zero.shards_grads or zero.shards_optimizer and plan.sharding.overlap_comm
    return plan.dp_overlap


def _stage_of(plan: ParallelPlan) -> Callable[[int], int]:
    return lambda rank: plan.coords(rank)[1]


# ---------------------------------------------------------------- the passes
def limits(ctx: BuildContext, draft: Draft) -> Draft:
    """Refuse a plan whose simulation would exceed ``ctx.max_events`` (``sim.program.limits``)."""
    coalesced = ctx.tp_price is not None if ctx.topology else None
    check_size(ctx.model, ctx.plan, ctx.fidelity, ctx.max_events, ctx.topology, coalesced=coalesced,
               collective_model=ctx.collective_model)
    return draft


def schedule(ctx: BuildContext, draft: Draft) -> Draft:
    """The plan's pipeline schedule (or the context's own, which must fit the plan), one
    compute action per step on each pipeline rank, cross-rank deps free for now; with
    ``pp_call_microbatches`` the schedule of that many micro-batches once per call
    (``sim.program.schedules.repeated``)."""
    plan, sched = ctx.plan, ctx.schedule
    if sched is None and plan.overlap_moe_expert_parallel_comm:  # Megatron's order for it (sim.program.ep_overlap)
        sched = overlap_schedule(plan.pp, plan.vpp, plan.num_microbatches)
    elif sched is None and plan.pp_call_microbatches:  # one schedule call per accumulation step (AutoModel's)
        sched = repeated(build_schedule(plan.schedule, plan.pp, plan.pp_call_microbatches, plan.vpp),
                         plan.sharding.schedule_calls)
    elif sched is None:
        sched = build_schedule(plan.schedule, plan.pp, plan.num_microbatches, plan.vpp)
    elif (sched.pp, sched.vpp, sched.num_microbatches) != (plan.pp, plan.vpp, plan.num_microbatches):
        raise InputError(
            f"schedule {sched.name}: has pp={sched.pp}, vpp={sched.vpp}, m={sched.num_microbatches}; "
            f"the plan needs pp={plan.pp}, vpp={plan.vpp}, m={plan.num_microbatches}"
        )
    validate(sched)
    return Draft(sched, to_program(sched, lambda step: 0.0))


def stages(ctx: BuildContext, draft: Draft) -> Draft:
    """Each pipeline rank's steps onto the GPU of its stage that the passes run on (dp 0,
    tp 0; ``copy_maps``); ``expand`` copies the finished program onto the others."""
    plan = ctx.plan
    rep_of = copy_maps(plan, ctx.folding)[0]
    rep_set = {rep_of(g) for g in range(plan.world_size)}
    return draft.with_program(passes.replicate(draft.program, plan.world_size, plan.coords, plan.rank,
                                               lambda g: g in rep_set))


def layers(ctx: BuildContext, draft: Draft) -> Draft:
    """Each step's layers: compute segments and the collectives inside a layer, over the
    tensor-, context- and expert-parallel groups (``sim.program.segments``)."""
    plan, folding = ctx.plan, ctx.folding
    node_of = _node_of(ctx)
    layout = ep_layout(plan, node_of) if folding is not None and plan.token_dispatcher.deepep else None
    segments = StepSegments(ctx.model, plan, ctx.profile, ctx.tp_price, layer_steps(draft.schedule, plan), layout)

    def other_groups(r: int) -> dict:
        out = {"cp": plan.cp_group(r)} if plan.cp > 1 else {}
        if folding is not None:
            out.update(ep=folding.ep_group(r), etp=folding.etp_group(r))
            if not plan.token_dispatcher.exchanges_all_to_all:
                out.update(dispatch_groups(folding, r, node_of))
        return out

    return draft.with_program(passes.add_tp_collectives(draft.program, segments, plan.tp_group, other_groups))


def ep_overlap(ctx: BuildContext, draft: Draft) -> Draft:
    """With ``overlap_moe_expert_parallel_comm``: each steady-state forward and the backward
    beside it interleaved layer by layer, their expert-parallel all-to-alls on a stream of
    their own (``sim.program.ep_overlap``)."""
    plan, sched = ctx.plan, draft.schedule
    if not plan.overlap_moe_expert_parallel_comm:
        return draft
    stage = _stage_of(plan)
    return draft.with_program(add_ep_overlap(draft.program, lambda r: steady_pairs(sched, stage(r))))


def fp8_amax(ctx: BuildContext, draft: Draft) -> Draft:
    """FP8 delayed scaling's amax all-reduces over the stage's GPUs (``sim.program.amax``),
    before the sends, which wait for them; nothing in BF16 or under a recipe without an amax
    history (``sim.program.fp8``)."""
    if ctx.plan.precision is None or not ctx.plan.precision.recipe.history:
        return draft
    return draft.with_program(add_amax_reductions(draft.program, stage_groups(ctx.plan),
                                                  chunk_gemms(ctx.model, ctx.plan), ctx.nccl))


P2P_NET_CHANNELS = 2
"""Thread blocks (one SM each) of an NCCL send or receive to a peer on another node, which is
what a pipeline transfer between nodes holds: NCCL's ``ncclTopoGetNchannels`` (NVIDIA/nccl
v2.25.1-1 ``src/graph/paths.cc``, the NCCL of the NGC 25.01 PyTorch image that NeMo 25.02 is
built on; the same in 2.28) starts a remote peer from 2 channels per NIC and keeps 2 where one
NIC drives the GPU (DGX H100/B200: one NIC per GPU), unless ``NCCL_NCHANNELS_PER_NET_PEER`` sets
it. Two SMs of 132 (H100) or 148 (B200), and HBM traffic at the NIC's 50 GB/s, under 1% of its
bandwidth: such a transfer slows the compute beside it by about 1.5%, not by the
``overlap_compute_slowdown`` measured beside collectives that run on many channels (Lee et al.
2025), so the engine does not count it (``Action.slows_compute``); the 1.5% is left out. A
transfer inside a node runs on 2 channels per NVLink of its path (the same function:
``2*max(1, bw/nvlBw)``) and at NVLink speed through HBM, and is counted."""


def p2p(ctx: BuildContext, draft: Draft) -> Draft:
    """Every cross-stage dependency as a send and a receive of one micro-batch's activations
    (or their gradients). A transfer over the network leaves the SMs to the compute beside it
    (``P2P_NET_CHANNELS``). Under Megatron-Core's non-interleaved 1F1B a rank waits for each send
    before its next step (``sim.inputs.frameworks.p2p_blocks``)."""
    plan, topo = ctx.plan, ctx.topology
    act_bytes = p2p_bytes(ctx.model, plan.micro_batch_size, plan.tp, plan.sequence_parallel, cp=plan.cp)
    return draft.with_program(passes.add_p2p(draft.program, lambda consumer: act_bytes,
                                             quiet=None if topo is None else _through_a_nic(topo),
                                             blocking=p2p_blocks(plan)))


def _through_a_nic(topo):
    """(src, dst) -> whether the route between the two GPUs crosses a network link (InfiniBand or
    Ethernet), memoised: NCCL's net transport, on ``P2P_NET_CHANNELS`` channels."""
    seen: dict[tuple[int, int], bool] = {}

    def crosses(src: int, dst: int) -> bool:
        got = seen.get((src, dst))
        if got is None:
            got = seen[(src, dst)] = any(k in ("ib", "ethernet") for k in topo.route_kinds(src, dst))
        return got
    return crosses


def _bucket_units(ctx: BuildContext, bucket_bytes: float) -> Callable[[int, int], tuple[int, float]] | None:
    """Under Megatron-Core's or Apex's bucketing (``sim.inputs.frameworks.GRAD_BUCKETS``):
    (rank, layer) -> (the layer's unit on that rank, its bucket bytes). Megatron-Core's unit is
    the model chunk: ``bucket_bytes`` on the first pipeline stage's first chunk, one bucket for
    the whole chunk (infinite) on every other stage and chunk; the embedding is the first
    chunk's, the head and the multi-token-prediction modules the last chunk's. Apex's
    (``whole_units``) is the model chunk under interleaving, the same way, else the layer, the
    embedding and the head with the stage's first layer; each one bucket. None under uniform
    buckets or without overlapped buckets."""
    plan, model, buckets = ctx.plan, ctx.model, ctx.plan.sharding.grad_buckets
    if not buckets.whole_units and (not buckets.per_chunk or math.isinf(bucket_bytes)):
        return None
    chunk = {lid: c for c in range(plan.vpp) for s in range(plan.pp)
             for lid in plan.layer_range(model, c * plan.pp + s)}
    last, stage = plan.vpp - 1, _stage_of(plan)
    if buckets.whole_units and plan.vpp == 1:  # one unit a layer; the rest with the stage's first layer
        first = {s: next(iter(plan.layer_range(model, s)), -1) for s in range(plan.pp)}

        def layer_unit(rank: int, lid: int) -> tuple[int, float]:
            return (lid if lid in chunk else first[stage(rank)]), math.inf

        return layer_unit

    def unit(rank: int, lid: int) -> tuple[int, float]:
        c = 0 if lid < 0 else chunk.get(lid, last)
        return c, buckets.unit_bytes(stage(rank), c, bucket_bytes)

    return unit


def grad_sync(ctx: BuildContext, draft: Draft) -> Draft:
    """Gradient buckets over the data-parallel group (all-reduced; reduce-scattered under
    ZeRO, every micro-batch under ZeRO-2/3), then the experts' over the ranks that hold the
    same experts."""
    plan, moe = ctx.plan, ctx.model.moe
    scale = grad_reduce_scale(plan, moe)
    sync = _sync_options(plan, scale * sync_bucket_bytes(plan))
    if not sync.every_microbatch:  # (a sync per micro-batch is ZeRO-2's, not Megatron-Core's DDP)
        sync = replace(sync, unit=_bucket_units(ctx, sync.bucket_bytes))
    dense = _grad_bytes(ctx)
    prog = passes.add_grad_sync(draft.program, lambda r, lid: scale * dense(r, lid), plan.dp_group,
                                replace(sync, prep_s=grad_prep(ctx, experts=False)))
    split = _expert_split(ctx)
    if split:
        experts, e_scale = _expert_bytes(split), grad_reduce_scale(plan, moe, experts=True)
        prog = passes.add_grad_sync(prog, lambda r, lid: e_scale * experts(r, lid), ctx.folding.edp_group,
                                    replace(sync, label=EXPERT_GRAD_LABEL, prep_s=grad_prep(ctx, experts=True)))
    return draft.with_program(prog)


def grad_prep(ctx: BuildContext, experts: bool) -> Callable[[float], float] | None:
    """Seconds of the kernels Megatron-Core's DDP runs over a gradient bucket of ``nb`` bytes (its
    gradients in the reduce dtype: the buffer's ``grad_data``) on the compute stream before the
    bucket's collective, as a function of ``nb``; None where there are none, or outside
    Megatron-Core's own DDP (other frameworks, ZeRO-3's Megatron-FSDP).

    ``_ParamAndGradBucketGroup.start_grad_sync`` (NVIDIA/Megatron-LM 791b70e0, the Megatron-Core
    of the NeMo 25.02 container: megatron/core/distributed/param_and_grad_buffer.py), called from
    the gradient hook of the bucket's last parameter on the default stream, runs two passes before
    it issues the reduce-scatter or all-reduce:

    - with ``check_for_nan_in_grad`` (``ParallelPlan.check_for_nan_in_grad``), ``grad_data.norm(p=2)``
      for each bucket: one read of its gradients (``CHECK_NAN_BYTES_PER_BYTE``). The rerun state
      machine that would look at the result is off (``RerunMode.DISABLED``, its default, which
      neither Megatron-LM's default ``--rerun-mode disabled`` nor NeMo changes), so no host sync;
    - where ``gradient_scaling_factor`` is not 1, ``grad_data *= gradient_scaling_factor``: a read
      and a write (``SCALE_BYTES_PER_BYTE``). ``DistributedDataParallel.__init__`` sets it to
      1/(dp·cp) for every bucket unless ``average_in_collective``
      (``ParallelPlan.ddp_average_in_collective``), and then to 1 for the dense buckets and
      1/ep for the experts' (NCCL's AVG over the expert data-parallel group leaves the 1/ep).

    Each pass is one kernel (``kernel_launch_s``) at the profile's memory rate."""
    plan = ctx.plan
    if framework_of(plan) is not FRAMEWORKS[DEFAULT_FRAMEWORK] or plan.zero.shards_params:
        return None
    scaled = (plan.ep > 1) if (experts and plan.ddp_average_in_collective) else not plan.ddp_average_in_collective
    per_byte = (CHECK_NAN_BYTES_PER_BYTE if plan.check_for_nan_in_grad else 0.0) + (
        SCALE_BYTES_PER_BYTE if scaled else 0.0)
    kernels = int(plan.check_for_nan_in_grad) + int(scaled)
    if not kernels:
        return None
    rate, launch = ctx.profile.memory_rate(), ctx.profile.kernel_launch_s
    return lambda nb: per_byte * nb / rate + kernels * launch


CHECK_NAN_BYTES_PER_BYTE = 1.0
"""Bytes the NaN check's norm moves per byte of a bucket's gradients: it reads them once."""
SCALE_BYTES_PER_BYTE = 2.0
"""Bytes the in-place gradient scaling moves per byte of a bucket's gradients: a read and a write."""


def zero3_gather(ctx: BuildContext, draft: Draft) -> Draft:
    """ZeRO-3: each layer's parameters all-gathered before each use, up to the prefetch
    depth ahead, and freed after it (``sim.program.zero.add_param_gathers``), FP8 weights
    (``fp8_param_gather``, Megatron-FSDP's) in 1 byte (``_fp8_gather_savings``): the dense ones
    over the data-parallel group, then an MoE layer's experts over their own data-parallel
    group (FSDP2 with EP: the experts a module of their own, sharded over edp). Under
    DeepSpeed (``sim.inputs.frameworks``) without its persistent tensors, prefetched as its
    trace does, and the layers reused within ``stage3_max_reuse_distance`` kept from forward
    to backward."""
    plan = ctx.plan
    if not plan.zero.shards_params:
        return draft
    model, depth, sharding = ctx.model, zero3_depth(ctx.model, plan), plan.sharding
    # FSDP1's BACKWARD_POST: the gather of layer i-1 issued once the GPU has finished layer i+1 (the host one
    # layer ahead under limit_all_gathers, sim.inputs.frameworks), whatever the prefetch depth
    how = dict(backward_depth=1 if sharding.prefetch_after_backward else None,
               reshard_after_forward=sharding.reshard_after_forward, window=sharding.pp_sync_window)
    grad_bytes, (fp8_saved, expert_share) = _grad_bytes(ctx), _fp8_gather_savings(ctx)
    persistent = _persistent_bytes(ctx)
    if sharding.deepspeed:  # sim.inputs.frameworks: what DeepSpeed keeps for the backward right after
        how["kept_layers"] = deepspeed_kept_layers(model, plan, list(range(-1, model.num_layers + 1)))
    prog = zero.add_param_gathers(draft.program, lambda r, lid: grad_bytes(r, lid) - fp8_saved(lid) - persistent(lid),
                                  plan.dp_group, depth, **how)
    split = _expert_split(ctx)
    if split:
        experts = _expert_bytes(split)
        prog = zero.add_param_gathers(prog, lambda r, lid: expert_share * experts(r, lid), ctx.folding.edp_group,
                                      depth, label="gather experts of layer", **how)
    # PyTorch FSDP's own copies around each gather and reduce-scatter (sim.program.fsdp), once both are placed;
    # the experts' reduce-scatters in their own dtype (sim.inputs.frameworks: reduce dtype by parallelizer)
    fp32 = sharding.reduce_fp32(model.moe)
    e_fp32 = sharding.reduce_fp32(model.moe, experts=True)
    prog = add_fsdp_copies(prog, fsdp_copies(sharding.fsdp, fp32), GRAD_REDUCE_BYTES[fp32],
                           ctx.profile.memory_rate(), ctx.profile.kernel_launch_s,
                           experts=(EXPERT_GRAD_LABEL, fsdp_copies(sharding.fsdp, e_fp32), GRAD_REDUCE_BYTES[e_fp32]))
    if sharding.defer_grad_sync:  # the unsharded gradients accumulated across micro-batches (sim.program.fsdp)
        first, later = deferred_accumulations(fp32)
        window = sharding.pp_sync_window
        prog = add_deferred_accumulations(prog, first, later, lambda r, lid: grad_bytes(r, lid) / GRAD_BYTES,
                                          plan.dp_group, ctx.profile.memory_rate(), ctx.profile.kernel_launch_s,
                                          window=window)
        if split:
            first, later = deferred_accumulations(e_fp32)
            # experts alone on their rank (edp 1) are outside FSDP: autograd still accumulates them (sim.program.fsdp)
            prog = add_deferred_accumulations(prog, first, later, lambda r, lid: experts(r, lid) / GRAD_BYTES,
                                              ctx.folding.edp_group, ctx.profile.memory_rate(),
                                              ctx.profile.kernel_launch_s, label="experts of layer", window=window,
                                              alone=deferred_accumulations(False)[1])
    return draft.with_program(prog)


def process_group_streams(ctx: BuildContext, draft: Draft) -> Draft:
    """Each rank's data-parallel collectives so far (gradient buckets, ZeRO-3 gathers) on
    their process group's stream, the dense group's and the experts' apart, each right after
    the action it is issued after; at one such action the reductions first
    (``sim.program.process_group_streams``). The optimizer's and ``param_gather``'s, added
    after it, are made on those streams in issue order."""
    # (FSDP1's BACKWARD_POST too: the gather of layer i-1 shares its anchor, layer i+1's backward, with layer
    # i+1's reduce-scatter, which the host issued one post-backward hook before it: reductions first)
    return draft.with_program(put_on_group_streams(draft.program, _group_streams(ctx)))


def _group_streams(ctx: BuildContext) -> Callable[[int], dict[tuple, str]]:
    """rank -> {data-parallel group: its stream} (``sim.program.process_group_streams.group_streams``)."""
    return group_streams(ctx.plan.dp_group, ctx.folding.edp_group if _expert_split(ctx) else None)


def optimizer(ctx: BuildContext, draft: Draft) -> Draft:
    """The optimizer step on the GPU, over the rank's shard of its stage's parameters
    (dense over dp·cp, experts over their data-parallel group); not when offloaded."""
    plan = ctx.plan
    if plan.offload_optimizer:
        return draft
    z, edp = plan.zero_stage, expert_data_parallel(plan)
    per_param = OPTIMIZER_BYTES_PER_PARAM[framework_of(plan).optimizer]  # (Composer's unfused AdamW: sim.program.costs)
    step_s = [optimizer_step_time(optimizer_shard_params(d, plan.dp_cp, z) + optimizer_shard_params(x, edp, z),
                                  ctx.profile, per_param) for d, x in _param_split(ctx)]
    stage = _stage_of(plan)
    return draft.with_program(passes.add_optimizer(draft.program, lambda r: step_s[stage(r)]))


def offload(ctx: BuildContext, draft: Draft) -> Draft:
    """ZeRO-Offload: gradients to the host, memory-bound Adam there (the host bandwidth
    shared by the node's GPUs), parameters back (``sim.program.zero.add_offloaded_optimizer``)."""
    plan = ctx.plan
    if not plan.offload_optimizer:
        return draft
    psi = [d + x for d, x in _param_split(ctx)]
    sharing = min(ctx.gpus_per_node, plan.world_size)
    cpu = [cpu_optimizer_step_time(optimizer_shard_params(n, plan.dp_cp, plan.zero_stage), ctx.profile, sharing)
           for n in psi]
    copy = [offload_copy_bytes(n, plan.dp_cp) for n in psi]
    stage = _stage_of(plan)
    return draft.with_program(zero.add_offloaded_optimizer(draft.program, lambda r: copy[stage(r)],
                                                           lambda r: cpu[stage(r)]))


def param_gather(ctx: BuildContext, draft: Draft) -> Draft:
    """ZeRO-1/2: the updated parameters all-gathered, after the optimizer step or, with
    ``overlap_param_gather``, bucket by bucket ahead of the next forward's first use; FP8
    weights (``fp8_param_gather``) in 1 byte instead of 2 (MXFP8 ones in BF16,
    ``_fp8_gather_savings``); the experts' over their group. Under DeepSpeed's ZeRO-3, the
    persistent tensors in one all-gather after the step (stage3.py ``_post_step``)."""
    model, plan = ctx.model, ctx.plan
    if plan.zero.shards_params and plan.sharding.deepspeed:  # DeepSpeed's persistent parameters, once after the step
        done = "params to GPU" if plan.offload_optimizer else "optimizer"
        stage_layers, stage = plan.stage_layers(model), _stage_of(plan)
        persistent = _persistent_bytes(ctx)
        nb = [stage_layers[s] * persistent(0) + (persistent(-1) if s == 0 else 0)
              + (persistent(model.num_layers) if s == plan.pp - 1 else 0) for s in range(plan.pp)]
        return draft.with_program(zero.add_param_allgather(draft.program, lambda r: nb[stage(r)], plan.dp_group,
                                                           math.inf, done, lambda r: 1,
                                                           label="persistent params allgather"))
    if not plan.zero.gathers_after_step:
        return draft
    bucket, split, prog = sync_bucket_bytes(plan), _expert_split(ctx), draft.program
    grad_bytes, (fp8_saved, expert_share) = _grad_bytes(ctx), _fp8_gather_savings(ctx)
    if plan.param_gather_overlap:
        unit = _bucket_units(ctx, bucket)  # (the distributed optimizer gathers over the gradients' buckets)
        prog = zero.add_param_allgather_ahead(prog, lambda r, lid: grad_bytes(r, lid) - fp8_saved(lid),
                                              plan.dp_group, bucket, unit=unit)
        if split:
            experts = _expert_bytes(split)
            prog = zero.add_param_allgather_ahead(prog, lambda r, lid: expert_share * experts(r, lid),
                                                  ctx.folding.edp_group, bucket, label="expert param allgather",
                                                  stream=_expert_stream(ctx), unit=unit)
        return draft.with_program(prog)
    done = "params to GPU" if plan.offload_optimizer else "optimizer"  # the step's last action
    psi_split, stage = _param_split(ctx), _stage_of(plan)
    stage_layers = plan.stage_layers(model)
    gathered = [param_allgather_bytes(d) - sum(fp8_saved(i) for c in range(plan.vpp)
                                               for i in plan.layer_range(model, c * plan.pp + s))
                for s, (d, _) in enumerate(psi_split)]

    def tensors(rank: int) -> int:
        # the rank's layers over its model chunks, plus the embedding and the head
        p = stage(rank)
        return sum(stage_layers[c * plan.pp + p] for c in range(plan.vpp)) + 2

    prog = zero.add_param_allgather(prog, lambda r: gathered[stage(r)], plan.dp_group, bucket, done, tensors)
    if split:
        prog = zero.add_param_allgather(prog, lambda r: expert_share * param_allgather_bytes(psi_split[stage(r)][1]),
                                        ctx.folding.edp_group, bucket, done, tensors, label="expert param allgather",
                                        stream=_expert_stream(ctx))
    return draft.with_program(prog)


def _expert_stream(ctx: BuildContext) -> Callable[[int], str]:
    """rank -> the stream of its experts' data-parallel process group (``_group_streams``)."""
    streams = _group_streams(ctx)
    return lambda r: streams(r)[tuple(ctx.folding.edp_group(r))]


def memory(ctx: BuildContext, draft: Draft) -> Draft:
    """Resident model states (sharded per the ZeRO stage) and the reserve from the start,
    and each (stage, micro-batch)'s stored activations while they are alive (with full
    recompute, or selective recompute of modules, a layer's working set during backward); the bytes are
    ``sim.program.memory``'s."""
    model, plan = ctx.model, ctx.plan
    resident = [stage_resident_bytes(model, plan, s, ctx.profile.memory_reserve_bytes,
                                     ctx.profile.fp8_gemm_any_layout) for s in range(plan.pp)]
    chunk = [chunk_activation_parts(model, plan, vs) for vs in range(plan.pp * plan.vpp)]
    stage_of: dict[str, int] = {}

    def stored(rank: int, step: str) -> float:
        stage = stage_of.get(step)
        if stage is None:
            stage = stage_of[step] = Step.parse(step).stage
        return chunk[stage]

    working = recompute_working_bytes(model, plan)
    transient = (lambda rank, step: working) if working else None
    prog = zero.add_activation_memory(draft.program, stored, transient)
    stage = _stage_of(plan)
    return draft.with_program(zero.add_resident(prog, lambda rank: resident[stage(rank)]))


def activation_offload(ctx: BuildContext, draft: Draft) -> Draft:
    """With ``cpu_offloading_num_layers``: the first N layers' activations to the host and back
    around their backward (``sim.program.activation_offload``; pp 1, so stage 0's layers)."""
    n = ctx.plan.cpu_offloading_num_layers
    if not n:
        return draft
    parts = chunk_activation_parts(ctx.model, ctx.plan, 0)  # (layer id -> bytes per micro-batch)
    return draft.with_program(add_activation_offload(draft.program, ctx.model.num_layers, n, parts))


def expand(ctx: BuildContext, draft: Draft) -> Draft:
    """Each template GPU's program onto every GPU of its stage (``passes.expand``). Under
    reduced fidelity only dp index 0 is simulated (and tp index 0 where each GPU has a NIC
    of its own, so that its peers' data-parallel traffic could not contend with its own);
    the others are shadows."""
    plan = ctx.plan
    keep = None
    if ctx.fidelity == "reduced":
        own_nics = ctx.topology is None or _own_nics(ctx.topology)
        keep = lambda g: plan.coords(g)[0] == 0 and (not own_nics or plan.coords(g)[2] == 0)  # noqa: E731
    rep_of, moved, groups_of = copy_maps(plan, ctx.folding)
    if ctx.folding is not None and not plan.token_dispatcher.exchanges_all_to_all:
        groups_of = _with_dispatch_groups(groups_of, rep_of, ctx.folding, _node_of(ctx))
    return draft.with_program(passes.expand(draft.program, plan.world_size, rep_of, moved, keep, groups_of))


def _node_of(ctx: BuildContext) -> Callable[[int], int]:
    """A global rank's node: the topology's, or ranks filling nodes of ``gpus_per_node`` in order."""
    return ctx.topology.node_of if ctx.topology is not None else (lambda r: r // ctx.gpus_per_node)


def _with_dispatch_groups(groups_of, rep_of, folding, node_of):
    """``groups_of`` that also maps the template's token-dispatcher groups onto g's
    (``sim.program.dispatch.dispatch_groups``): a group of the ranks on one node does not
    move with the folding's digits (``Folding.moved`` would shift it across nodes)."""
    def both(g: int) -> dict:
        out = dict(groups_of(g))
        mine, theirs = dispatch_groups(folding, rep_of(g), node_of), dispatch_groups(folding, g, node_of)
        out.update({mine[k]: theirs[k] for k in mine})
        return out
    return both


def _param_split(ctx: BuildContext) -> list[tuple[float, float]]:
    """Per pipeline stage: (dense, expert) parameters on one of its GPUs."""
    return [stage_param_split(ctx.model, ctx.plan, s) for s in range(ctx.plan.pp)]


PIPELINE: tuple[tuple[str, Callable[[BuildContext, Draft], Draft]], ...] = (
    ("limits", limits), ("schedule", schedule), ("stages", stages), ("layers", layers), ("ep_overlap", ep_overlap),
    ("fp8_amax", fp8_amax),
    ("p2p", p2p), ("grad_sync", grad_sync), ("zero3_gather", zero3_gather),
    ("process_group_streams", process_group_streams), ("optimizer", optimizer),
    ("offload", offload), ("param_gather", param_gather), ("memory", memory),
    ("activation_offload", activation_offload), ("expand", expand),
)
PASSES = tuple(name for name, _ in PIPELINE)
"""The passes' names, in the order ``build`` runs them (module doc)."""


def run_passes(ctx: BuildContext, draft: Draft | None = None, *, start: str | None = None,
               stop: str | None = None) -> Draft:
    """Run the passes from ``start`` (default the first) up to, not including, ``stop``
    (default: to the end) on ``draft`` (default empty). A test runs the pipeline up to a
    pass, then the pass alone, and looks at what it added."""
    for name in (start, stop):
        if name is not None and name not in PASSES:
            raise InputError(f"pass: got {name!r}; allowed: {', '.join(PASSES)}")
    draft = draft or Draft()
    running = start is None
    for name, step in PIPELINE:
        if name == stop:
            break
        running = running or name == start
        if running:
            draft = step(ctx, draft)
    return draft


def build(ctx: BuildContext) -> tuple[Schedule, Program]:
    """The schedule and iteration program of ``ctx``: every pass, in order."""
    draft = run_passes(ctx)
    return draft.schedule, draft.program


def build_program(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, topology: Topology | None = None,
                  **options) -> tuple[Schedule, Program]:
    """The iteration program of ``plan``: every GPU's compute and communication
    (``build`` on ``BuildContext.create`` of the arguments, the profile paced for the job;
    ``options``: ``BuildContext``'s build options by name, its defaults for the others:
    ``schedule``, ``fidelity``, ``gpus_per_node``, ``coalesce_tp``, ``max_events``,
    ``collective_model``, ``nccl``).

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
    return build(BuildContext.create(model, plan, profile, topology, **options))


def copy_maps(plan: ParallelPlan, folding: Folding | None = None):
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
    rep_groups: dict[int, tuple] = {}  # template GPU -> its tp and dp groups (the plan's, made once per stage)

    def groups_of(g: int) -> dict[tuple, tuple]:
        rep = rep_of(g)
        tg = g - g // st % nt * st
        dg = g - g // sd % nd * sd
        if tg not in tp_groups:
            tp_groups[tg] = tuple(tg + i * st for i in range(nt))
        if dg not in dp_groups:
            dp_groups[dg] = tuple(dg + i * sd for i in range(nd))
        mine = rep_groups.get(rep)
        if mine is None:
            mine = rep_groups[rep] = (plan.tp_group(rep), plan.dp_group(rep))
        return {mine[0]: tp_groups[tg], mine[1]: dp_groups[dg]}

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
