"""A first-order answer without simulation: per-GPU memory and step time of a plan.

This is the fast path for sweeps and the baseline the simulator must beat on fidelity.
It adds up, never overlaps (``dp_overlap`` and the bucket size are the simulator's):

    step = m·T + bubble + pp_comm + dp_comm + optimizer

where T = T_F + T_B + T_W is the slowest pipeline stage's time for one micro-batch (the
F, B and W op times of the layers ``plan.stage_layers`` puts on it, over all its
chunks, plus their tensor-parallel collectives, the embedding on the first stage and
the output head on the last) and m the micro-batches per step. Every term is priced by
``sim.program.costs``, which quotes the formulas: the kernels' roofline, the schedule's
bubble (GPipe, Narayanan et al. SC'21, Qi et al. ICLR 2024), the pipeline's
point-to-point transfers, the gradient sync per ZeRO stage (the ring closed forms with
the ZeRO paper's volumes) and the memory-bound optimizer step (28 bytes per local
parameter). Collectives run over the slowest link their group spans: ``nvlink`` when
every group of that dimension stays inside a node under the plan's ``placement``, else
``ib``; a data-parallel group across nodes runs one ring per member on a node.

Under FP8 or FP4 (``plan.precision``) the layers' work is what ``sim.program.fp8`` makes of it
(FP8 GEMMs at the fp8 peak, Transformer Engine's casts and transposes around them), the
same work the simulator runs, and each chunk's forward and backward of a micro-batch ends
with delayed scaling's amax all-reduce over the stage's tp·dp·cp GPUs
(``sim.program.amax``), a ring over ``ib`` when the stage spans nodes: the ``amax`` term,
also in T (it blocks the stage's compute).

Model FLOPs are F + B + W of every GEMM and attention op without recomputation, which
for GPT shapes is Korthikanti et al.'s Eq. 7, 72·B·L·s·h²·(1 + s/(6h) + V/(12hL));
MFU = model FLOPs / (step · GPUs · peak), against the BF16 dense peak whatever the
precision, so that BF16 and FP8 runs compare on one scale. Hardware FLOPs add the
recomputed work.
Memory is the worst stage's model states, activations in flight at the stage's peak
and temporaries, as ``sim.program.memory`` adds them up (``stage_memory_bytes``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import lru_cache

from sim.inputs.hardware import HardwareProfile
from sim.inputs.model import ModelSpec
from sim.inputs.plan import ParallelPlan
from sim.inputs.plan_sections import OverlapPlan, PipelinePlan, ZeroPlan
from sim.inputs.recompute import layer_recompute
from sim.inputs.strategies import RECOMPUTE_POLICIES
from sim.program.build import BuildContext
from sim.program.amax import GEMMS_PER_LAYER, reduction_bytes, stage_groups
from sim.inputs.precision import check_support
from sim.program.costs import (
    OPTIMIZER_BYTES_PER_PARAM,
    collective_time,
    grad_reduce_scale,
    grad_sync_time,
    optimizer_step_time,
    pipeline_bubble_time,
    pipeline_p2p_time,
    transfer_time,
    work_times,
)
from sim.program.memory import (model_state_bytes, optimizer_shard_params, stage_memory_bytes, stage_param_split,
                                stage_params_per_rank)
from sim.inputs.experts import Folding
from sim.inputs.frameworks import framework_of
from sim.program.dispatch import DISPATCH_GROUPS, default_layout, dispatch_groups, group_sizes, moe_shape
from sim.program.workload_moe import MoeShape
from sim.program.workload import (LayerRun, Work, fp8_any_layout, head_work, layer_work, mtp_works, p2p_bytes,
                                  plan_edge_works, plan_layer_work)

_MATMUL = ("gemm", "attention")


@dataclass(frozen=True)
class Estimate:
    """Analytic per-GPU memory (bytes) and step time (seconds) of one plan."""

    model: str
    gpu: str
    plan: ParallelPlan
    num_params: int
    params_per_gpu: float
    worst_stage: int
    memory: dict
    """Worst stage, bytes: weights, gradients, optimizer, activations, temporaries, total."""
    memory_capacity_bytes: float
    fits: bool
    time: dict
    """Seconds: compute, tp_comm, amax (FP8's amax all-reduces; 0 in BF16), pipeline_bubble,
    pp_comm, dp_comm, optimizer, step."""
    links: dict
    """Link kind each group's collectives are timed on: tp, dp, pp."""
    tokens_per_s: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float

    def to_dict(self) -> dict:
        d = asdict(self)
        d["plan"] = asdict(self.plan)
        return d


def _links(plan: ParallelPlan, gpus_per_node: int) -> dict:
    """Link kind each dimension's groups use under the plan's placement."""
    return {d: "nvlink" if plan.max_nodes_spanned(d, gpus_per_node) == 1 else "ib"
            for d in ("tp", "dp", "pp")}


@lru_cache(maxsize=64)  # (of the model alone: a search asks it of every plan)
def model_flops_per_sequence(model: ModelSpec, recompute: str = "none", modules: tuple | None = None) -> float:
    """GEMM and attention FLOPs of forward and backward for one sequence (incl. recompute
    when given, ``modules`` what selective recomputes); the sum Korthikanti's Eq. 7 (none)
    and Megatron's Eq. 3 (full) close-form. For a mixture of experts, the FLOPs of the
    parameters each token uses (router, its k experts, shared experts): MFU counts
    active-parameter FLOPs. Under a layer pattern each layer by its kinds (a window's band,
    a Mamba-2 or Gated DeltaNet layer's projections and chunked products)."""
    run = LayerRun(1, recompute=recompute, modules=modules)
    if model.layers is not None:
        moe = MoeShape(1, 1, model.seq_length * model.moe_router_topk) if model.moe else None
        per = {lay: layer_work(model, run, moe=moe if lay.is_moe else None, layer=lay).flops(kinds=_MATMUL)
               for lay in model.layer_kinds}
        return head_work(model, 1).flops(kinds=_MATMUL) + sum(per[model.layer(i)] for i in range(model.num_layers))
    layer = layer_work(model, run).flops(kinds=_MATMUL)
    total = (model.num_layers - model.num_moe_layers) * layer + head_work(model, 1).flops(kinds=_MATMUL)
    if model.moe:  # a mixture of experts: active-parameter FLOPs (each token's k experts, balanced)
        moe = MoeShape(1, 1, model.seq_length * model.moe_router_topk)
        total += model.num_moe_layers * layer_work(model, run, moe=moe).flops(kinds=_MATMUL)
    return total


def plan_flops_per_sequence(model: ModelSpec, plan: ParallelPlan) -> float:
    """``model_flops_per_sequence`` with the plan's recomputation: under recompute method
    block only the layers that recompute (``sim.inputs.recompute.layer_recompute``, the first
    ``recompute_num_layers`` of each model chunk) add their forward again."""
    if plan.recompute_method != "block":
        return model_flops_per_sequence(model, plan.recompute, plan.recompute_modules)
    total = model_flops_per_sequence(model)
    moe = MoeShape(1, 1, model.seq_length * model.moe_router_topk) if model.moe else None

    def extra(lid: int) -> float:
        shape = moe if model.is_moe_layer(lid) else None
        return (layer_work(model, LayerRun(1, recompute="full"), moe=shape).flops(kinds=_MATMUL)
                - layer_work(model, LayerRun(1), moe=shape).flops(kinds=_MATMUL))
    for vs in range(plan.pp * plan.vpp):
        for pos, lid in enumerate(plan.layer_range(model, vs)):
            if RECOMPUTE_POLICIES[layer_recompute(plan, pos)].whole_layer:
                total += extra(lid)
    return total


def group_comm_time(c, n: int, link: str, profile: HardwareProfile) -> float:
    """An expert- or context-parallel collective ``c`` over ``n`` ranks: the bytes leaving a
    rank, (n-1)/n of the buffer (all of it for a ring shift), over ``link``."""
    return transfer_time(c.nbytes if c.collective == "shift" else c.nbytes * (n - 1) / n, link, profile)


def layer_phase_times(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, tp_link: str,
                 gpus_per_node: int, dtype: str, moe: bool, layer=None) -> dict:
    """``_layer_phase_times`` (its doc), a copy of the remembered answer: ``estimate_in``, a
    search's bound (``sim.studies.search.bound_s``) and the balanced split
    (``sim.program.stage_balance``) each ask it of the same plan, and a search of plans that
    differ only in their pipeline chunks, schedule or layer split (``layer_key``)."""
    key = (model, layer_key(plan), profile, tp_link, gpus_per_node, dtype, moe, layer)
    hit = _LAYER_PHASES.get(key)
    if hit is None:
        if len(_LAYER_PHASES) >= 4096:
            _LAYER_PHASES.clear()
        hit = _LAYER_PHASES[key] = _layer_phase_times(model, plan, profile, tp_link, gpus_per_node, dtype, moe, layer)
    return dict(hit)


_LAYER_PHASES: dict = {}
"""``layer_phase_times``' answers by ``layer_key``."""

_NOT_PER_LAYER = {f.name for section in (PipelinePlan, ZeroPlan, OverlapPlan) for f in fields(section)} - {"pp"}
_PER_LAYER = tuple(f.name for f in fields(ParallelPlan) if f.name not in _NOT_PER_LAYER)


def layer_key(plan: ParallelPlan) -> tuple:
    """What one layer's work and price per micro-batch depend on: every plan field but those
    of the pipeline section (``sim.inputs.plan_sections.PipelinePlan``: the model chunks, the
    schedule, the layer split and what sets them, which place the layers on the stages
    without changing any layer), the ZeRO section (the model states and their collectives,
    outside the layer's work) and the overlap section (what the simulator overlaps; the
    estimate adds up). A layer's work is ``layer_as_run`` of the parallelism, recompute,
    precision and framework sections, its expert-parallel groups ``_layer_groups``' of the
    sizes, placement and dispatcher. The pipeline depth stays in: with the GPUs fixed it sets
    where the expert-parallel groups fall."""
    return tuple(getattr(plan, name) for name in _PER_LAYER)


def _layer_phase_times(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, tp_link: str,
                       gpus_per_node: int, dtype: str, moe: bool, layer=None) -> dict:
    """Per phase (compute_s, comm_s) of one layer and micro-batch (an MoE one under balanced
    routing): tensor-parallel collectives as ``work_times`` prices them, and each
    expert- or context-parallel one as the bytes leaving a rank ((n-1)/n of the buffer;
    all of it for a ring shift) over the link its group crosses (NVLink inside a node,
    else the network). Ring attention's exchanges beside the attention compute are taken
    as hidden under it. ``layer``: its kinds under a layer pattern (``sim.inputs.layers``)."""
    work, sizes, link = moe_layer_groups(model, plan, gpus_per_node, moe, layer, profile)
    base = work_times(Work(work.name, tuple(i for i in work.items if getattr(i, "group", "tp") == "tp")),
                      profile, plan.tp, tp_link, dtype)
    out = {}
    for ph, (comp, comm) in base.items():
        beside = 0.0  # flex's inter-node exchange, which runs beside the intra-node one after it
        for c in work.comms(ph):
            n = sizes.get(c.group, 1)
            if n > 1 and c.side and c.group in DISPATCH_GROUPS:  # one still pending had no intra-
                comm += beside                                      # node partner: it ran alone
                beside = group_comm_time(c, n, link[c.group], profile)
            elif n > 1 and not c.side:
                comm += max(beside, group_comm_time(c, n, link[c.group], profile))
                beside = 0.0
        out[ph] = (comp, comm + beside)
    return out


def moe_layer_groups(model: ModelSpec, plan: ParallelPlan, gpus_per_node: int, moe: bool, layer=None,
                     profile: HardwareProfile | None = None):
    """(one layer's work under balanced routing, the size of each group its collectives run
    over, the link each group crosses: NVLink inside a node, else the network), the token
    dispatcher's groups on nodes of ``gpus_per_node`` GPUs (``sim.program.dispatch``); ``profile``: the
    GPU, for its FP8 kernels (``plan_layer_work``)."""
    b, t = plan.micro_batch_size, plan.tp
    tokens = b * model.seq_length // plan.cp // (t if plan.sp else 1)
    layout, sizes, link = _layer_groups(plan, gpus_per_node, moe)
    lid = next((i for i in range(model.num_layers) if model.is_moe_layer(i)), 0)
    shape = moe_shape(model, plan, lid, tokens * model.moe_router_topk, layout) if moe else None
    work = plan_layer_work(model, plan, shape, layer, profile=profile)
    return work, dict(sizes), dict(link)


_GROUPS: dict = {}
"""``_layer_groups``' answers by the plan fields they depend on (a search asks for them of
thousands of plans that share a few layouts, and each walks its groups rank by rank)."""


def _layer_groups(plan: ParallelPlan, gpus_per_node: int, moe: bool) -> tuple:
    """(the first expert-parallel group's layout, the size of each group, the link each
    crosses) of ``moe_layer_groups``. They depend only on the sizes, the placement and the
    dispatcher (``Folding``, ``sim.program.dispatch``), which key them."""
    key = (plan.tp, plan.pp, plan.dp, plan.cp, plan.ep, plan.etp_size, plan.placement, plan.dispatcher,
           gpus_per_node, moe)
    if key not in _GROUPS:
        layout = default_layout(plan, gpus_per_node) if moe else None
        sizes = {"cp": plan.cp}
        groups = {"cp": plan.cp_group(0)}
        if moe:
            fold = Folding(plan)
            sizes.update(ep=plan.ep, etp=plan.etp_size, **group_sizes(plan, layout))
            groups.update(ep=fold.ep_group(0), etp=fold.etp_group(0),
                          **dispatch_groups(fold, 0, lambda r: r // gpus_per_node))
        link = {k: "nvlink" if len({r // gpus_per_node for r in g}) == 1 else "ib" for k, g in groups.items()}
        if len(_GROUPS) >= 4096:
            _GROUPS.clear()
        _GROUPS[key] = layout, sizes, link
    return _GROUPS[key]


def _amax_time(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, gpus_per_node: int):
    """(stage, phase) -> seconds of FP8's amax all-reduces one micro-batch adds to that
    phase of that pipeline stage: one after each chunk's F and one after its B, over the
    stage's tp·dp·cp GPUs (``sim.program.amax``); 0 without FP8 or with one GPU a stage."""
    group = stage_groups(plan)
    n = plan.tp * plan.dp_cp
    if plan.precision is None or not plan.precision.recipe.history or n < 2:
        return lambda stage, ph: 0.0
    p, v = plan.pp, plan.vpp

    def link(stage: int) -> str:
        members = group(plan.rank(dp=0, pp=stage, tp=0))
        return "nvlink" if len({r // gpus_per_node for r in members}) == 1 else "ib"

    def time(stage: int, ph: str) -> float:
        if ph not in ("F", "B"):
            return 0.0
        kind = link(stage)
        return sum(collective_time("all_reduce", reduction_bytes(ph, GEMMS_PER_LAYER * len(layers)), n, kind, profile)
                   for layers in (plan.layer_range(model, c * p + stage) for c in range(v)) if len(layers))

    return time


_LAYER_TIMES: dict = {}
"""``estimate_in``'s per-layer prices (``_layer_times``) by ``layer_key``: a search prices
thousands of plans that differ only in how their layers sit on the stages."""


def _layer_times(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, tp_link: str, gpus_per_node: int,
                 dtype: str) -> tuple:
    """Per phase (compute_s, tp_comm_s) of one micro-batch: (a dense layer, an MoE layer, a
    dense layer that keeps its activations under recompute method block, each layer kind
    under a layer pattern (else None), the embedding, the head with the MTP modules)."""
    t = plan.tp
    kind_t = None

    def phases(work):
        """Per phase (compute_s, tp_comm_s) of one micro-batch."""
        return work_times(work, profile, t, tp_link, dtype)

    if plan.cp == 1:
        layer_t = phases(plan_layer_work(model, plan, profile=profile))
    else:
        layer_t = layer_phase_times(model, plan, profile, tp_link, gpus_per_node, dtype, False)
    moe_t = layer_phase_times(model, plan, profile, tp_link, gpus_per_node, dtype, True) if model.moe else layer_t
    # recompute method block: the dense layers past the first recompute_num_layers of a chunk do not recompute
    # (MoE layers and context parallelism are priced at the plan's granularity, an upper bound)
    kept_t = phases(plan_layer_work(model, plan, recompute="none", profile=profile)) \
        if plan.recompute_method == "block" and plan.cp == 1 else layer_t
    if model.layers is not None:  # each distinct layer priced by its kinds
        kind_t = {lay: layer_phase_times(model, plan, profile, tp_link, gpus_per_node, dtype, lay.is_moe, lay)
                  for lay in model.layer_kinds}
        layer_t = moe_t = kind_t[model.layer(0)]
    emb_t, head_t = (phases(w) for w in plan_edge_works(model, plan))
    for k in range(model.mtp_num_layers):  # multi-token prediction: its own work, and its layer's at its kind's
        own, kind = phases(mtp_works(model, plan, k, profile=profile)[0]), moe_t if model.is_moe_layer(model.num_layers + k) else layer_t
        head_t = {ph: tuple(a + b + c for a, b, c in zip(head_t[ph], own[ph], kind[ph])) for ph in head_t}
    return layer_t, moe_t, kept_t, kind_t, emb_t, head_t


def estimate(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *,
             gpus_per_node: int = 8, dtype: str = "bf16", flash_attention: bool | None = None,
             dp_channels: int | None = None) -> Estimate:
    """Per-GPU memory and first-order step time of ``plan`` for ``model`` on ``profile``
    (``estimate_in`` the job's ``BuildContext``, which paces the profile).

    ``dp_channels``: rings a data-parallel collective across nodes runs at once, each
    through its own NIC; default one per group member on a node, as NCCL does (and as
    the simulator's network does); 1 models a single ring through one NIC."""
    ctx = BuildContext.create(model, plan, profile, gpus_per_node=gpus_per_node)
    return estimate_in(ctx, dtype=dtype, flash_attention=flash_attention, dp_channels=dp_channels)


def estimate_in(ctx: BuildContext, *, dtype: str = "bf16", flash_attention: bool | None = None,
                dp_channels: int | None = None) -> Estimate:
    """``estimate`` of the context's job, priced on its (paced) profile."""
    model, plan, profile, gpus_per_node = ctx.model, ctx.plan, ctx.profile, ctx.gpus_per_node
    check_support(plan.precision, profile)
    links = _links(plan, gpus_per_node)
    b, t, p, v, m = plan.micro_batch_size, plan.tp, plan.pp, plan.vpp, plan.num_microbatches
    sp = plan.sequence_parallel

    key = (model, layer_key(plan), profile, links["tp"], gpus_per_node, dtype)
    if key not in _LAYER_TIMES:
        if len(_LAYER_TIMES) >= 4096:
            _LAYER_TIMES.clear()
        _LAYER_TIMES[key] = _layer_times(model, plan, profile, links["tp"], gpus_per_node, dtype)
    layer_t, moe_t, kept_t, kind_t, emb_t, head_t = _LAYER_TIMES[key]
    amax = _amax_time(model, plan, profile, gpus_per_node)
    stage_times = []          # per stage: {phase: (compute_s, tp_comm_s, amax_s)}
    for stage in range(p):
        ids = [i for c in range(v) for i in plan.layer_range(model, c * p + stage)]
        n_moe = sum(1 for i in ids if model.is_moe_layer(i))
        n_kept = sum(1 for c in range(v) for pos, i in enumerate(plan.layer_range(model, c * p + stage))
                     if not model.is_moe_layer(i) and layer_recompute(plan, pos) != plan.recompute)
        n = len(ids) - n_moe - n_kept
        times = {}
        for ph in layer_t:
            c = n * layer_t[ph][0] + n_moe * moe_t[ph][0] + n_kept * kept_t[ph][0]
            x = n * layer_t[ph][1] + n_moe * moe_t[ph][1] + n_kept * kept_t[ph][1]
            if model.layers is not None:  # (a recompute method's kept layers are priced at the plan's granularity)
                c = sum(kind_t[model.layer(i)][ph][0] for i in ids)
                x = sum(kind_t[model.layer(i)][ph][1] for i in ids)
            if stage == 0:
                c, x = c + emb_t[ph][0], x + emb_t[ph][1]
            if stage == p - 1:
                c, x = c + head_t[ph][0], x + head_t[ph][1]
            times[ph] = (c, x, amax(stage, ph))
        stage_times.append(times)
    slowest = max(stage_times, key=lambda st: sum(map(sum, st.values())))
    compute_mb = sum(c for c, _, _ in slowest.values())
    tp_mb = sum(x for _, x, _ in slowest.values())
    amax_mb = sum(a for _, _, a in slowest.values())
    t_f, t_b, t_w = (sum(slowest[ph]) for ph in ("F", "B", "W"))

    pp_comm = pipeline_p2p_time(p2p_bytes(model, b, t, sp, cp=plan.cp), m, p, v, links["pp"], profile)

    params = [stage_params_per_rank(model, plan, s) for s in range(p)]
    psi = max(params)
    # the reductions' bytes per 16-bit gradient byte, the routed experts' in their own dtype where it differs
    # (sim.inputs.frameworks: reduce dtype by parallelizer), weighted by the largest stage's split
    reduce_scale, expert_scale = grad_reduce_scale(plan, model.moe), grad_reduce_scale(plan, model.moe, True)
    if expert_scale != reduce_scale:
        dense_x, expert_x = stage_param_split(model, plan, params.index(psi))
        reduce_scale = (dense_x * reduce_scale + expert_x * expert_scale) / max(dense_x + expert_x, 1.0)
    dp, z, dp_link = plan.dp_cp, plan.zero_stage, links["dp"]
    # A dp group spanning nodes runs one ring per member on a node (NCCL channels), each
    # through its own NIC (sim.inputs.topology.default_channels).
    spanned = plan.max_nodes_spanned("dp", gpus_per_node)
    ch = (max(1, dp // spanned) if dp_channels is None else dp_channels) if dp_link == "ib" else 1

    time = {
        "compute": m * compute_mb,
        "tp_comm": m * tp_mb,
        "amax": m * amax_mb,
        # one fill and drain per call of the schedule (pp_call_microbatches: sim.program.schedules.repeated)
        "pipeline_bubble": pipeline_bubble_time(plan.pipeline, p, v, t_f, t_b, t_w) * plan.sharding.schedule_calls,
        "pp_comm": pp_comm,
        "dp_comm": grad_sync_time(z, model_state_bytes(psi).grads_bytes, dp, m, dp_link, profile, channels=ch,
                                  reduce_scale=reduce_scale),
        "optimizer": optimizer_step_time(optimizer_shard_params(psi, dp, z), profile,
                                         OPTIMIZER_BYTES_PER_PARAM[framework_of(plan).optimizer]),
    }
    time["step"] = sum(time.values())

    any_layout = fp8_any_layout(profile)
    memories = [stage_memory_bytes(model, plan, stage, flash_attention, any_layout) for stage in range(p)]
    worst = max(range(p), key=lambda s: memories[s]["total"])

    seqs = plan.global_batch_size
    model_flops = seqs * model_flops_per_sequence(model)
    hw_flops = seqs * plan_flops_per_sequence(model, plan)
    step, world = time["step"], plan.world_size
    return Estimate(
        model=model.name, gpu=profile.name, plan=plan, num_params=model.num_params,
        params_per_gpu=params[worst], worst_stage=worst, memory=memories[worst],
        memory_capacity_bytes=profile.hbm_capacity_bytes,
        fits=memories[worst]["total"] <= profile.hbm_capacity_bytes, time=time, links=links,
        tokens_per_s=seqs * model.seq_length / step,
        model_flops_per_step=model_flops, hardware_flops_per_step=hw_flops,
        model_tflops_per_gpu=model_flops / step / world / 1e12,
        hardware_tflops_per_gpu=hw_flops / step / world / 1e12,
        mfu=model_flops / (step * world * profile.peak(dtype)))
