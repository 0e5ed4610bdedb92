"""Finding the best plan: enumerate every valid plan, prune analytically, simulate the rest.

For a model, a GPU count and a global batch, ``enumerate_plans`` lists every plan the
simulator can run: each tensor-parallel size that divides the heads, K/V heads and FFN
width (at most one node, ``max_tp``), each pipeline depth up to the layer count (one that
does not split the layers evenly gets ``layer_split="auto"``, which ``candidates`` works out
as ``trainsim run`` does: the split that balances the stages, ``sim.program.stage_balance``),
data parallelism filling the GPUs and dividing the batch, each micro-batch size that
divides the per-replica batch, interleaving (vpp > 1, Megatron-LM's rule that the
micro-batches be a multiple of pp; every vpp that splits the layers evenly, or, when pp does
not, vpp = 2, 4, 8, ... while every virtual stage keeps a layer), every schedule (gpipe, 1f1b, zb-h1, zb-h2 for one
chunk per stage; interleaved for several), ZeRO stages 0–3 (0 only when dp = 1),
recompute none/selective/full and sequence parallelism (only when tp > 1, where it
means something), for a mixture of experts expert parallelism (every divisor of the
experts that folds into the stage's GPUs; ``sim.inputs.experts``) and expert tensor
parallelism (etp 1 or tp), and context parallelism from ``LONG_SEQUENCE`` tokens on
(cp 1, 2, 4, 8; ``sim.program.context_parallel``), and with ep > 1 the MoE token
dispatcher (alltoall, allgather, flex; ``sim.program.dispatch``). Given layer splits,
placements and DDP bucket sizes keep their defaults; ``trainsim sweep`` varies those. ``SearchSpace`` narrows any dimension. FP8
(``fp8_format``) is searched only when asked (``SearchSpace.fp8_format``, ``trainsim search
--fp8-format off,hybrid``): it changes the training's numerics, which is the user's choice,
and it doubles the plans; the two formats cost the same (``sim.program.fp8``), so one of
them is enough to compare with BF16.

``search`` then works in three steps:

1. **Memory.** ``sim.program.estimate`` gives each plan's per-GPU peak; a plan that does not
   fit the GPU is dropped without simulation.
2. **Time.** Each plan gets an analytic *bound* (``bound_s``): the part of its
   estimated step the simulator cannot hide, priced as ``sim.program.estimate`` prices it,

       bound = m·T + bubble + optimizer

   with T the slowest pipeline rank's F + B + W per micro-batch (compute and the
   tensor-parallel collectives that block it), m the micro-batches, and the schedule's
   bubble summed over the *other* ranks, so that unequal stages (the embedding on the
   first, the output layer on the last) are not all charged at the slowest one's rate:
   Σ T_r / v for gpipe, 1f1b and interleaved (which is (p−1)·T/v for equal stages,
   Narayanan et al. SC'21), Σ max(0, F_r + B_r − W_r) for zb-h1 and
   Σ max(0, F_r + B_r − 2·W_r) for zb-h2 (Qi et al., ICLR 2024). Data-parallel and
   pipeline p2p traffic is left out: the simulator overlaps it with backward. A mixture
   of experts' token exchanges are priced at their least time (an all-to-all's bytes for
   peers on the rank's node over NVLink while the rest cross the network; the allgather
   dispatcher's other nodes' share through the node's NICs while the node's peers' comes
   over NVLink; flex's inter-node and intra-node exchanges at once, and an inter-node one
   alone where its group has one rank a node, ``_ep_times``), and the
   bubble leaves out the other ranks' exchanges, which can run while the slowest rank computes. With
   ``overlap_moe_expert_parallel_comm`` (``sim.program.ep_overlap``) the slowest rank's
   m·T becomes max(m·C + A₁, m·A), C its compute and A its all-to-alls per micro-batch:
   a pair's all-to-alls may hide under the other micro-batch's compute, but they run one
   at a time on their stream, and without pipelining micro-batch 0's forward and the last
   backward run alone (A₁ = A when pp = 1, else 0).
   For mixtures of experts the bubble is instead what no schedule avoids whatever the stages
   weigh (``_pipeline_floor``: a rank waits for the ranks before it to run a forward at the
   start and a backward at the end, and under 1F1B its first backward for the ranks after it),
   the largest over the ranks, so that the bound is a true lower bound: ``bound / simulated ≤ 1``
   (tests/test_search_moe_cp.py checks it on an all-to-all-heavy model over two nodes, whose
   first stage, with the embedding and one layer more, is the slowest).
   Plans are simulated in order of increasing bound, in waves of fixed size; before
   each wave, if the next plan's ``bound / margin`` exceeds the second-best simulated
   time (``exact`` = 2: the best and the runner-up the explanation compares), it and
   every plan after it are pruned. ``margin`` is the estimate's error factor
   (``DEFAULT_MARGIN``): the simulator must never be more than ``margin`` times faster
   than the bound, i.e. ``bound / simulated ≤ margin`` for every plan, and then pruning
   never drops the best two. ``measure_margin`` and ``experiments/bench_sweep.py``
   measure that ratio on a sample. Where the bound is a true lower bound (a mixture of
   experts, with each of the three dispatchers: ``Candidate.lower_bound``) no error factor
   is needed, and unless a margin is given the search prunes those plans at margin 1
   (``plan_margin``). A screened plan (step 2's screening, ``screen_sizes``) runs its
   cheaper screening first, with the wave's full runs; its first run at a micro-batches
   gives a tighter floor, T(a) + (m − a)·slope / margin with slope the bound's growth per
   micro-batch (``first_run_floor``). The second runs go in order of that floor, the
   lowest two first; then a plan whose floor exceeds the second best so far is pruned
   without its second run. Waves have a fixed size, so which plans are simulated,
   and so every result, does not depend on the executor or the number of workers.
   A plan is also skipped (``pruned: dominated``) when a plan of its *recompute family*
   (the same plan but for its recompute, ``recompute_family``) with less recompute has
   run and fit: it does the same work and more, so it cannot be faster. The best two are
   then the best two of the plans no such lighter plan dominates. (With ``margin=inf``
   every plan that fits is simulated.) The estimates themselves can run on the sweep's
   workers (``candidates(..., map=Runner.map)``).
3. **Rank and explain.** Simulated plans that fit are ranked by iteration time (the
   batch is fixed, so this is tokens/s), or with ``rank_by="tokens-per-joule"`` by energy
   per token (then pruned by an energy floor, ``search``), ties by plan key; ``explain``
   sets the best plan's time and memory parts against the runner-up's.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache

from sim.program.api import (
    auto_layer_split, BuildContext, default_layout, edge_works, estimate_of, Estimate,
    fp8_any_layout, group_comm_time, layer_as_run, layer_key, layer_phase_times, moe_layer_groups, plan_edge_works, transfer_time, work_times,
)
from sim.errors import InputError, require
from sim.inputs.hardware import HardwareProfile
from sim.inputs.model import ModelSpec
from sim.inputs.plan import RECOMPUTE, SCHEDULES, ZERO_STAGES, ParallelPlan
from sim.inputs.plan_sections import FrameworkPlan, ParallelismPlan, PrecisionPlan, RecomputePlan
from sim.inputs.precision import FP8_FORMATS
from sim.inputs.strategies import schedule_named
from sim.inputs.experts import DISPATCHERS, Folding
from sim.inputs.schema_commands import DEFAULT_MARGIN as _DEFAULT_MARGIN, LONG_SEQUENCE as _LONG_SEQUENCE

DEFAULT_MARGIN = _DEFAULT_MARGIN
"""The estimate's error factor for pruning (see the module doc; declared, with how it was
measured, where ``trainsim search --margin`` takes it: ``sim.inputs.schema_commands``)."""

PIPELINE_SCHEDULES = tuple(s for s in SCHEDULES if schedule_named(s).one_chunk)
ASKED_SCHEDULES = tuple(s for s in SCHEDULES if not schedule_named(s).searched and not schedule_named(s).from_file)
"""Schedules a search tries only where ``--schedule`` names them, at every vpp (looped BFS)."""
PLAN_COLUMNS = ("dp", "tp", "pp", "vpp", "micro_batch_size", "zero_stage", "schedule", "recompute",
                "sequence_parallel")
"""The plan fields a search varies (the columns of its CSV)."""


@dataclass(frozen=True)
class SearchSpace:
    """Which values each dimension may take; None means every valid one."""

    tp: tuple | None = None
    pp: tuple | None = None
    vpp: tuple | None = None
    micro_batch_size: tuple | None = None
    zero_stage: tuple | None = None
    schedule: tuple | None = None
    recompute: tuple | None = None
    sequence_parallel: tuple | None = None
    max_tp: int | None = None
    """Largest tensor-parallel size when ``tp`` is not given (default: GPUs per node)."""
    fp8_format: tuple = (None,)
    """FP8 formats to try, None for BF16 (the default: BF16 only; see the module doc)."""
    ep: tuple | None = None
    """Expert-parallel sizes (default: every valid one for a mixture of experts, 1 otherwise)."""
    etp: tuple | None = None
    """Expert tensor-parallel sizes (default: 1 and the plan's tp for a mixture of experts)."""
    cp: tuple | None = None
    """Context-parallel sizes (default: 1, 2, 4, 8 from ``LONG_SEQUENCE`` tokens on, else 1)."""
    dispatcher: tuple | None = None
    """MoE token dispatchers (default: every one that applies, ``sim.program.dispatch``:
    alltoall, allgather and flex for a plan with ep > 1, alltoall otherwise)."""

    def __post_init__(self):
        def need(cond: bool, name: str, v, allowed: str) -> None:  # the error names the attribute as data
            require(cond, f"search: {name}", v, allowed, setting=name)

        for name in ("tp", "pp", "vpp", "micro_batch_size", "ep", "etp", "cp"):
            for v in getattr(self, name) or ():
                need(isinstance(v, int) and not isinstance(v, bool) and v > 0, name, v, "expected integers > 0")
        for v in self.zero_stage or ():
            need(v in ZERO_STAGES and not isinstance(v, bool), "zero_stage", v, "allowed: 0, 1, 2, 3")
        for v in self.schedule or ():
            need(v in SCHEDULES and not schedule_named(v).from_file, "schedule", v,
                 f"allowed: {', '.join(s for s in SCHEDULES if not schedule_named(s).from_file)}")
        for v in self.recompute or ():
            need(v in RECOMPUTE, "recompute", v, f"allowed: {', '.join(RECOMPUTE)}")
        for v in self.dispatcher or ():
            need(v in DISPATCHERS, "dispatcher", v, f"allowed: {', '.join(DISPATCHERS)}")
        for v in self.sequence_parallel or ():
            need(isinstance(v, bool), "sequence_parallel", v, "expected true or false")
        need(isinstance(self.fp8_format, tuple) and self.fp8_format, "fp8_format", self.fp8_format,
             "expected a non-empty tuple")
        for v in self.fp8_format:
            need(v is None or v in FP8_FORMATS, "fp8_format", v, f"allowed: {', '.join(FP8_FORMATS)}, or None for BF16")

    def allows(self, name: str, value) -> bool:
        allowed = getattr(self, name)
        return allowed is None or value in allowed


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan_key(plan: ParallelPlan) -> str:
    """A short, unique, sortable name of a plan, e.g.
    ``dp0004-tp02-pp02-v1-mb001-gbs000032-z0-1f1b-none-sp0`` (fields a search does not vary
    are appended as ``name=value`` when they differ from the defaults)."""
    d = asdict(plan)
    key = (f"dp{plan.dp:04d}-tp{plan.tp:02d}-pp{plan.pp:02d}-v{plan.vpp}-mb{plan.micro_batch_size:03d}"
           f"-gbs{plan.global_batch_size:06d}-z{plan.zero_stage}-{plan.schedule}-{plan.recompute}"
           f"-sp{int(plan.sequence_parallel)}")
    extra = [f"{k}={d[k]}" for k, v in sorted(_defaults().items())
             if k not in PLAN_COLUMNS and k != "global_batch_size" and d.get(k) != v]
    return "-".join([key, *extra])


@lru_cache(maxsize=1)
def _defaults() -> dict:
    return asdict(ParallelPlan())


def enumerate_plans(model: ModelSpec, gpus: int, global_batch_size: int, space: SearchSpace = SearchSpace(),
                    gpus_per_node: int = 8) -> list[ParallelPlan]:
    """Every valid plan for ``gpus`` GPUs and ``global_batch_size`` sequences, sorted by key."""
    require(isinstance(gpus, int) and gpus > 0, "search: gpus", gpus, "expected an integer > 0")
    require(isinstance(global_batch_size, int) and global_batch_size > 0, "search: global_batch_size",
            global_batch_size, "expected an integer > 0")
    max_tp = space.max_tp or gpus_per_node
    cps = space.cp or ((1, 2, 4, 8) if model.seq_length >= LONG_SEQUENCE else (1,))
    plans = []
    for tp in _divisors(gpus):
        if not space.allows("tp", tp) or (space.tp is None and tp > max_tp):
            continue
        if any(x % tp for x in (model.num_attention_heads, model.num_key_value_heads or model.num_attention_heads,
                                model.ffn_hidden_size)):
            continue
        for pp in _divisors(gpus // tp):
            for cp in cps:
                if (gpus // tp // pp) % cp:
                    continue
                dp = gpus // (tp * pp * cp)
                if not space.allows("pp", pp) or pp > model.num_layers or global_batch_size % dp:
                    continue
                for mbs in _divisors(global_batch_size // dp):
                    if space.allows("micro_batch_size", mbs):
                        plans += _with_experts(model, space, _variants(model, global_batch_size, space, dp, tp, pp,
                                                                       mbs, cp), gpus_per_node)
    plans.sort(key=plan_key)
    return plans


LONG_SEQUENCE = _LONG_SEQUENCE
"""From this sequence length on, ``enumerate_plans`` tries context parallelism by default
(shorter sequences rarely need it, and it multiplies the plans; declared with the option
whose default it sets, ``sim.inputs.schema_commands``)."""


def _with_experts(model, space, plans: list[ParallelPlan], gpus_per_node: int = 8) -> list[ParallelPlan]:
    """Each plan under every expert-parallel size, expert tensor-parallel size and token
    dispatcher the space allows (a mixture of experts: ep a divisor of the experts, etp 1 or
    tp, ep x etp folding into the stage's GPUs; etp = tp is the plan's default, ``etp=None``;
    allgather and flex only with ep > 1); plans the model, the folding rules or the
    dispatcher's layout on nodes of ``gpus_per_node`` GPUs refuse are left out."""
    out = []
    for plan in plans:
        eps = space.ep or (_divisors(model.num_experts) if model.moe else (1,))
        etps = space.etp or ((plan.tp, 1) if model.moe else (plan.tp,))
        for ep, etp, d in itertools.product(eps, dict.fromkeys(etps), space.dispatcher or DISPATCHERS):
            try:
                cand = replace(plan, ep=ep, etp=None if etp == plan.tp else etp, dispatcher=d)
                cand.check_model(model)
                if cand.token_dispatcher.deepep:
                    default_layout(cand, gpus_per_node)
            except InputError:
                continue
            out.append(cand)
    return out


def _interleavings(model, pp: int) -> list[int]:
    """Model chunks per pipeline rank (vpp > 1) to try: with an even split every vpp whose
    virtual stages split the layers evenly (Megatron-LM's rule); with an uneven one (the
    layers do not divide pp, split by ``--layer-split auto``) vpp = 2, 4, 8, ... while every
    virtual stage keeps a layer. The bubble shrinks as 1/vpp, so doubling steps span the
    trade-off between the bubble and the p2p traffic without trying every vpp."""
    if model.num_layers % pp == 0:
        return [v for v in range(2, model.num_layers // pp + 1) if model.num_layers % (pp * v) == 0]
    return [2 ** k for k in range(1, model.num_layers.bit_length()) if pp * 2 ** k <= model.num_layers]


def _variants(model, gbs, space, dp, tp, pp, mbs, cp=1) -> list[ParallelPlan]:
    m = gbs // (mbs * dp)
    split = None if model.num_layers % pp == 0 else "auto"  # uneven: balanced by ``candidates``
    shapes = []  # (vpp, schedule)
    if pp == 1:
        shapes.append((1, "1f1b"))
    else:
        shapes += [(1, s) for s in PIPELINE_SCHEDULES]
        shapes += [(v, "interleaved") for v in _interleavings(model, pp) if m % pp == 0]
        shapes += [(v, s) for s in ASKED_SCHEDULES if s in (space.schedule or ())
                   for v in (1, *_interleavings(model, pp))]
    out = []
    for vpp, schedule in shapes:
        if not (space.allows("vpp", vpp) and space.allows("schedule", schedule)):
            continue
        for zero in (ZERO_STAGES if dp * cp > 1 else (0,)):
            for rec in RECOMPUTE:
                for sp in ((False, True) if tp > 1 else (False,)):
                    if space.allows("zero_stage", zero) and space.allows("recompute", rec) and \
                            space.allows("sequence_parallel", sp):
                        out += [ParallelPlan(dp=dp, tp=tp, pp=pp, vpp=vpp, sequence_parallel=sp,
                                             micro_batch_size=mbs, global_batch_size=gbs, recompute=rec,
                                             zero_stage=zero, schedule=schedule, fp8_format=fp8, cp=cp,
                                             layer_split=split)
                                for fp8 in dict.fromkeys(space.fp8_format)]
    return out


@lru_cache(maxsize=4096)
def _phases(model: ModelSpec, profile: HardwareProfile, tp_link: str, par: ParallelismPlan, rec: RecomputePlan,
            prec: PrecisionPlan, fw: FrameworkPlan) -> tuple:
    """Per phase F, B, W: (phase, layer_s, embedding_s, head_s, layer_s), compute plus tp
    collectives, for the layer, embedding and head as the plan's sections run them
    (``sim.program.workload``), cached on the sections."""
    b, t, sp = par.micro_batch_size, par.tp, par.sequence_parallel

    def times(work):
        return work_times(work, profile, t, tp_link)

    layer = times(layer_as_run(model, par, rec, prec, fw, any_layout=fp8_any_layout(profile)))
    emb, head = (times(w) for w in edge_works(model, b, t, sp, fw.cross_entropy, fw.gradient_accumulation_fusion))
    return tuple((ph, sum(layer[ph]), sum(emb[ph]), sum(head[ph]), sum(layer[ph])) for ph in ("F", "B", "W"))


def _layered_phases(model, plan, profile, est, gpus_per_node, ep) -> tuple:
    """``_phases`` for a mixture of experts or context parallelism: dense and MoE layers
    priced apart (``sim.program.estimate.layer_phase_times``; an MoE layer's expert-parallel
    all-to-alls at their least time, ``ep`` from ``_ep_times``), the embedding and head on
    the rank's s/cp tokens; per phase (phase, dense layer, embedding, head, MoE layer)."""
    t = plan.tp
    dense = layer_phase_times(model, plan, profile, est.links["tp"], gpus_per_node, "bf16", False)
    moe = dense
    if model.moe:
        moe = {ph: (c, x - ep[ph][0] + ep[ph][1]) for ph, (c, x) in
               layer_phase_times(model, plan, profile, est.links["tp"], gpus_per_node, "bf16", True).items()}
    emb, head = (work_times(w, profile, t, est.links["tp"]) for w in plan_edge_works(model, plan))
    return tuple((ph, sum(dense[ph]), sum(emb[ph]), sum(head[ph]), sum(moe[ph])) for ph in ("F", "B", "W"))


def _kind_phases(model, plan, profile, est, gpus_per_node, ep) -> dict:
    """Under a layer pattern (``sim.inputs.layers``): each distinct layer's (F, B, W) seconds
    per micro-batch, as ``_layered_phases`` prices a dense or an MoE layer."""
    out = {}
    for lay in model.layer_kinds:
        times = layer_phase_times(model, plan, profile, est.links["tp"], gpus_per_node, "bf16", lay.is_moe, lay)
        if lay.is_moe:
            times = {ph: (c, x - ep[ph][0] + ep[ph][1]) for ph, (c, x) in times.items()}
        out[lay] = tuple(sum(times[ph]) for ph in ("F", "B", "W"))
    return out


def _ep_times(model, plan, profile, gpus_per_node) -> dict:
    """Per phase, one MoE layer's token exchanges as ``layer_phase_times`` prices them and at
    their least time: (priced_s, least_s). Each is priced as the bytes leaving a rank over
    the network once its group spans nodes; the least time counts what must cross: of an
    all-to-all (the ``alltoall`` dispatcher) the k−1 peers on the rank's own node are
    reached over NVLink while the rest cross, so it takes at least the larger of the
    off-node share (n−k)/n over the network and the on-node share (k−1)/n over NVLink
    (balanced routing: each peer gets 1/n); an all-gather or reduce-scatter over n ranks, k
    a node (``allgather``), at least the larger of the other nodes' share (n−k)/n entering
    through the node's k NICs and the node peers' (k−1)/n over NVLink; flex's two exchanges
    run at once, each already priced at its own link's least time, so at least the larger;
    where the intra-node one has a single rank (the group has one rank on each node: etp = tp
    with tp·etp filling a node, or a group of one rank a node), the inter-node exchange runs
    alone, each of them (the dispatch and the combine) at its own time.

    ``priced`` is what ``layer_phase_times`` adds for them, so that ``least`` replaces exactly
    that; both count every exchange the simulator runs."""
    out = {ph: (0.0, 0.0) for ph in ("F", "B", "W")}
    if not model.moe or plan.ep == 1:
        return out
    work, sizes, link = moe_layer_groups(model, plan, gpus_per_node, True, profile=profile)
    group = Folding(plan).ep_group(0) if not plan.token_dispatcher.gathers else Folding(plan).tp_ep_group(0)
    n, k = len(group), sum(1 for r in group if r // gpus_per_node == group[0] // gpus_per_node)
    for ph in out:
        priced = least = beside = alone = 0.0  # beside: as the estimate pairs them; alone: a pending inter-node one
        for c in work.comms(ph):
            if c.group in ("ep", "tpep") and sizes[c.group] > 1:
                if k == n:  # inside one node
                    t = group_comm_time(c, n, "nvlink", profile)
                    priced, least = priced + t, least + t
                    continue
                priced += group_comm_time(c, n, "ib", profile)
                if c.group == "ep":
                    least += max(transfer_time(c.nbytes * (n - k) / n, "ib", profile),
                                 transfer_time(c.nbytes * (k - 1) / n, "nvlink", profile))
                else:
                    least += max(transfer_time(c.nbytes * (n - k) / n / k, "ib", profile),
                                 transfer_time(c.nbytes * (k - 1) / n, "nvlink", profile))
            elif c.group in ("ep_rail", "ep_node") and sizes[c.group] > 1:
                t = group_comm_time(c, sizes[c.group], link[c.group], profile)
                if c.side:  # (a pending one without a partner ran alone, in both)
                    priced, least, beside, alone = priced + beside, least + alone, t, t
                else:
                    priced, least = priced + max(t, beside), least + max(t, alone)
                    beside = alone = 0.0
            elif c.group == "ep_node" and not c.side:  # the intra-node exchange of one rank: the
                least, alone = least + alone, 0.0          # inter-node one before it ran alone
        out[ph] = (out[ph][0] + priced + beside, out[ph][1] + least + alone)
    return out


def bound_s(ctx: BuildContext, est: Estimate) -> float:
    """The part of the estimated step the simulator cannot overlap (see the module doc):
    m·T + bubble + optimizer, T the slowest pipeline rank's F + B + W per micro-batch
    (compute and tensor-, expert- and context-parallel collectives, as ``sim.program.estimate``
    prices them on the context's paced profile; expert-parallel all-to-alls at their least
    time, ``_ep_times``), and the bubble without the other ranks' all-to-alls, which can
    run while the slowest rank computes."""
    return bound_parts(ctx, est)[0]


def bound_parts(ctx: BuildContext, est: Estimate) -> tuple[float, float]:
    """(``bound_s``, its growth per micro-batch): the largest over the pipeline ranks of
    their own work per micro-batch (the m·T term's T, each rank's own rather than the
    slowest's where they differ), which no steady-state period undercuts where the bound
    holds at every micro-batch count (``search``'s screening prunes with it)."""
    model, plan, profile, gpus_per_node = ctx.model, ctx.plan, ctx.profile, ctx.gpus_per_node
    p, v, m = plan.pp, plan.vpp, plan.num_microbatches
    layered = model.moe or plan.cp > 1 or model.layers is not None
    # a layer's prices depend on no field of the pipeline, ZeRO or overlap sections (``layer_key``):
    # plans that differ only in those (a search's vpp, schedules, layer splits) share them
    key = (model, layer_key(plan), profile, gpus_per_node, est.links["tp"], layered)
    if key not in _LAYER_PRICES:
        if len(_LAYER_PRICES) >= 4096:
            _LAYER_PRICES.clear()
        ep = _ep_times(model, plan, profile, gpus_per_node)
        _LAYER_PRICES[key] = ep, _layered_phases(model, plan, profile, est, gpus_per_node, ep) if layered else None
    ep, ph = _LAYER_PRICES[key]
    if not layered:
        sec = plan.sections
        ph = _phases(model, profile, est.links["tp"], sec.parallelism, sec.recompute, sec.precision, sec.framework)
    ranks, a2a = [], []  # per pipeline rank: (F, B, W) seconds per micro-batch over its chunks; all-to-all seconds
    kinds = _kind_phases(model, plan, profile, est, gpus_per_node, ep) if model.layers is not None else None
    for r in range(p):
        ids = [i for c in range(v) for i in plan.layer_range(model, c * p + r)]
        n_moe = sum(1 for i in ids if model.is_moe_layer(i))
        if kinds is not None:  # a layer pattern: each layer at its kinds' price
            ranks.append(tuple(sum(kinds[model.layer(i)][k] for i in ids) + (emb if r == 0 else 0.0)
                               + (head if r == p - 1 else 0.0) for k, (_, _, emb, head, _) in enumerate(ph)))
        else:
            ranks.append(tuple((len(ids) - n_moe) * lay + n_moe * moe + (emb if r == 0 else 0.0)
                               + (head if r == p - 1 else 0.0) for _, lay, emb, head, moe in ph))
        a2a.append(n_moe * sum(least for _, least in ep.values()))
    own = [m * sum(ranks[r]) for r in range(p)]  # each rank's own work over the micro-batches
    per = [sum(ranks[r]) for r in range(p)]  # and its growth per micro-batch
    if plan.overlap_moe_expert_parallel_comm:
        # a pair's all-to-alls can run beside the other micro-batch's compute, one at a time on
        # their stream; without pipelining micro-batch 0's forward and the last backward run alone
        for r in range(p):
            compute = sum(ranks[r]) - a2a[r]
            own[r] = max(m * compute + (a2a[r] if p == 1 else 0.0), m * a2a[r])
            per[r] = max(compute, a2a[r])
    slope = max(per)
    if model.moe:
        return _pipeline_floor(ranks, own, plan) + est.time["optimizer"], slope
    slowest = max(range(p), key=lambda r: own[r])
    others = [ranks[r] for r in range(p) if r != slowest]
    k = plan.pipeline.bubble_weight_passes  # (Zero Bubble: W passes fill each bubble)
    if k:
        bubble = sum(max(0.0, f + b - k * w) for f, b, w in others)
    else:
        bubble = sum(f + b + w for f, b, w in others) / v
    # the other ranks' all-to-alls can run while the slowest rank computes: out of the bubble
    bubble = max(0.0, bubble - sum(a2a[r] for r in range(p) if r != slowest) / v)
    return own[slowest] + bubble + est.time["optimizer"], slope


_LAYER_PRICES: dict = {}
"""``bound_parts``' per-layer prices (``_ep_times``, ``_layered_phases``) by ``layer_key``."""


def _pipeline_floor(ranks: list, own: list, plan) -> float:
    """The step's least time over the pipeline ranks, each rank's own work plus the waits no
    schedule avoids (the bound for mixtures of experts, which must stay below the simulated
    time whatever the stages weigh): rank r starts after the ranks before it have each run a
    forward and ends after they have each run a backward and weight gradient (Σ_{s<r}
    (F_s + B_s + W_s)/v); under 1F1B (v = 1) its first backward also waits for the ranks after
    it to run micro-batch 0's forward and backward, beside at most p − 1 − r warm-up forwards
    of its own (max(0, Σ_{s>r} (F_s + B_s) − (p − 1 − r)·F_r)). For equal stages the last
    rank's term is m·T + (p − 1)·T/v, the usual bubble."""
    p, v = plan.pp, plan.vpp
    floor = 0.0
    for r in range(p):
        before = sum(f + b + w for f, b, w in ranks[:r]) / v
        after = 0.0
        if plan.pipeline.pipedream_flush and v == 1:
            after = max(0.0, sum(f + b for f, b, _ in ranks[r + 1:]) - (p - 1 - r) * ranks[r][0])
        floor = max(floor, own[r] + before + after)
    return floor


@dataclass
class Candidate:
    """One enumerated plan with its estimate and what the search made of it."""

    plan: ParallelPlan
    key: str
    estimate: Estimate
    bound_s: float
    status: str = "pending"
    """'pruned: memory', 'pruned: time', or the simulation's status ('ok', 'error', 'crashed')."""
    record: dict | None = None
    """The simulation's record (``sim.studies.sweep.evaluate``) when it was simulated."""
    slope_s: float = 0.0
    """The bound's growth per micro-batch (``bound_parts``): with the bound's margin, the least
    steady-state period, which ``search`` extrapolates a screening's first run with."""
    lower_bound: bool = False
    """``bound_s`` is a true lower bound of the simulated time (a mixture of experts'
    ``_pipeline_floor``, with every dispatcher's exchanges at their least time): the search's
    default margin prunes it at 1 (``plan_margin``)."""


@dataclass
class SearchResult:
    candidates: list[Candidate]
    ranked: list[dict]
    """Simulated plans that ran, best first: records with ``summary``."""
    margin: float | None
    """The margin given (``SearchOptions.margin``); None: each plan's ``plan_margin``."""
    counts: dict = field(default_factory=dict)
    stopped: str | None = None
    """Why the search ended before it was done ("SIGINT", "SIGTERM", "max-time"), or None."""

    @property
    def best(self) -> dict | None:
        return self.ranked[0] if self.ranked else None


def candidates(model: ModelSpec, plans: list[ParallelPlan], profile: HardwareProfile,
               gpus_per_node: int = 8, map=None, chunks: int = 1) -> list[Candidate]:
    """Estimate each plan; those that do not fit the GPU are marked 'pruned: memory'. A plan
    with ``layer_split="auto"`` gets its balanced split first (``balanced_plan``).

    ``map(fn, items)`` (``sim.studies.sweep.Runner.map``) spreads the work over a sweep's
    workers in ``chunks`` runs of consecutive plans (plans that share a balanced split sit
    together in key order); the candidates are the same either way."""
    if map is None or chunks <= 1 or len(plans) < 2 * _CHUNK_MIN:
        return _estimate((model, plans, profile, gpus_per_node))
    size = max(_CHUNK_MIN, math.ceil(len(plans) / chunks))
    parts = [(model, plans[i:i + size], profile, gpus_per_node) for i in range(0, len(plans), size)]
    return [c for part in map(_estimate, parts) for c in part]


_CHUNK_MIN = 32
"""The fewest plans a worker estimates at once (fewer cost more to send than to price)."""


def _estimate(job: tuple) -> list[Candidate]:
    """``candidates`` of ``(model, plans, profile, gpus_per_node)`` in this process."""
    model, plans, profile, gpus_per_node = job
    out, splits = [], {}
    for plan in plans:
        if plan.layer_split == "auto":
            plan = balanced_plan(model, plan, profile, splits)
        ctx, est = estimate_of(model, plan, profile, gpus_per_node=gpus_per_node)
        bound, slope = bound_parts(ctx, est)
        c = Candidate(plan, plan_key(plan), est, bound, slope_s=slope, lower_bound=model.moe)
        if not est.fits:
            c.status = "pruned: memory"
        out.append(c)
    return out


def balanced_plan(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, cache: dict) -> ParallelPlan:
    """``plan`` with ``--layer-split auto`` worked out as ``trainsim run`` works it out
    (``sim.program.stage_balance.auto_layer_split``). The split prices one micro-batch's
    compute and collectives per layer, which neither the ZeRO stage nor the schedule
    changes, so plans that differ only in those share it (``cache``)."""
    key = replace(plan, zero_stage=0, schedule="interleaved" if plan.vpp > 1 else "1f1b")
    if key not in cache:
        cache[key] = auto_layer_split(model, key, profile).layer_split
    return replace(plan, layer_split=cache[key])


def even_splits(model: ModelSpec, plan: ParallelPlan) -> list[tuple[int, ...]]:
    """The splits of ``model``'s layers over ``plan``'s pp·vpp (virtual) stages as even as
    they go, other than the plan's own: the extra layers on the first stages, or on the last."""
    stages = plan.pp * plan.vpp
    q, r = divmod(model.num_layers, stages)
    own = tuple(plan.layer_split) if isinstance(plan.layer_split, (list, tuple)) else None
    splits = ((q + 1,) * r + (q,) * (stages - r), (q,) * (stages - r) + (q + 1,) * r)
    return [x for x in dict.fromkeys(splits) if x != own and min(x) > 0]


@dataclass(frozen=True)
class SplitFailure:
    """A plan left out only because of its layer split: it does not fit the GPU (by the
    estimate that pruned it), the same plan with ``split`` does (``estimate``), and its bound
    is below the time of a plan the search lists."""

    candidate: Candidate
    split: tuple[int, ...]
    estimate: Estimate


def split_failures(model: ModelSpec, cands: list[Candidate], profile: HardwareProfile, below_s: float,
                   gpus_per_node: int = 8, limit: int = 5, tries: int = 32) -> list[SplitFailure]:
    """Candidates pruned for memory with an uneven split (``balanced_plan``'s, balanced for
    time) that another split as even as it goes (``even_splits``) makes fit, fastest bound
    first: those whose bound is below ``below_s`` (the time of the last plan listed), so that
    they could have been listed. At most ``limit``, after estimating at most ``tries`` plans."""
    out: list[SplitFailure] = []
    pool = sorted((c for c in cands if c.status == "pruned: memory" and c.bound_s < below_s
                   and isinstance(c.plan.layer_split, (list, tuple))), key=lambda c: (c.bound_s, c.key))
    for c in pool[:tries]:
        for split in even_splits(model, c.plan):
            try:
                _, est = estimate_of(model, replace(c.plan, layer_split=split), profile, gpus_per_node=gpus_per_node)
            except InputError:
                continue
            if est.fits:
                out.append(SplitFailure(c, split, est))
                break
        if len(out) >= limit:
            break
    return out


@dataclass(frozen=True)
class SearchOptions:
    """How ``search`` prunes and simulates; checked when made (``require``: the field, the
    value, what is allowed).

    ``screen``: a plan with many micro-batches is first simulated at two small counts and
    its time extrapolated (``screen_sizes``; status ``"screened"``); after the pruning, the
    ``final`` fastest plans (default ``exact``) that were only screened are simulated in
    full, and ``ranked`` holds the plans simulated in full.

    ``rank_by="tokens-per-joule"`` ranks by energy per token (``sim.results.energy``; the
    batch is fixed, so by energy per iteration) and prunes by a floor of a plan's energy:
    every GPU at ``idle_power_w`` for its estimated bound / margin, which no simulated
    iteration undercuts (``idle · T <= energy`` for every GPU). It prunes far less than
    time does; it neither screens nor skips heavier recompute (both reason about time)."""

    margin: float | None = None
    """The estimate's error factor: a plan whose bound / margin is above the ``exact``-th
    best simulated so far is pruned (inf: no time pruning); None: ``plan_margin``'s, 1 where a
    plan's bound is a true lower bound (the mixtures of experts) and ``DEFAULT_MARGIN`` else."""
    exact: int = 2
    """How many of the best plans the pruning keeps exact (the threshold is the exact-th best)."""
    wave: int = 16
    """Plans simulated at once between prunings."""
    screen: bool = False
    final: int | None = None
    rank_by: str = "throughput"
    """throughput or tokens-per-joule."""
    idle_power_w: float | None = None
    """A GPU's idle power (the floor of the energy bound), needed to rank by tokens-per-joule."""

    def __post_init__(self):
        require(self.rank_by in ("throughput", "tokens-per-joule"), "search: rank_by", self.rank_by,
                "allowed: throughput, tokens-per-joule")
        require(not self.by_energy or (self.idle_power_w is not None and self.idle_power_w >= 0),
                "search: idle_power_w", self.idle_power_w,
                "watts >= 0 (the floor of the energy bound), needed to rank by tokens-per-joule")
        margin, exact, wave, final = self.margin, self.exact, self.wave, self.finalists
        require(margin is None or isinstance(margin, (int, float)) and not math.isnan(margin) and margin >= 1,
                "search: margin", margin, "expected a number >= 1 (inf: no time pruning), or None (plan_margin's)")
        require(isinstance(exact, int) and exact >= 1, "search: exact", exact, "expected an integer >= 1")
        require(isinstance(wave, int) and wave >= 1, "search: wave", wave, "expected an integer >= 1")
        require(isinstance(final, int) and final >= 1, "search: final", final, "expected an integer >= 1")

    @property
    def by_energy(self) -> bool:
        """Ranked (and pruned) by energy, not time."""
        return self.rank_by == "tokens-per-joule"

    @property
    def screens(self) -> bool:
        """Whether plans are screened (never when ranked by energy)."""
        return self.screen and not self.by_energy

    @property
    def finalists(self) -> int:
        """How many screened finalists are simulated in full (``final``, default ``exact``)."""
        return self.exact if self.final is None else self.final

    def floor_of(self, c: Candidate) -> float:
        """The least a candidate can cost by its bound: time, or with ``by_energy`` every
        GPU at ``idle_power_w`` for that time."""
        return c.bound_s / plan_margin(c, self.margin) * (c.plan.world_size * self.idle_power_w if self.by_energy else 1.0)

    def runs_of(self, c: Candidate) -> int:
        """Simulations a candidate takes: two where it is screened."""
        return 2 if self.screens and screen_sizes(c.plan) else 1


def search(cands: list[Candidate], simulate, options: SearchOptions = SearchOptions(), *, planned=None,
           stoppable: bool = False, finished: dict | None = None, screening_records: bool = False) -> SearchResult:
    """Prune ``cands`` (from ``candidates``) and simulate the survivors with
    ``simulate(plans) -> records`` (one record per plan, in order;
    ``sim.studies.sweep.Runner.run`` gives them), as ``options`` say (``SearchOptions``:
    margin, waves, screening, ranking). ``cands`` are left as they are; the result holds
    copies.

    ``planned(n)``, when given, is told before each wave how many simulations the search
    may still run in all (those run so far, the runs of every plan left that the pruning
    cannot rule out yet, and the full runs of screened finalists; a plan is two runs when
    screened), a count that only shrinks as the pruning learns, and at the end how many it
    ran (the progress display's total).

    ``stoppable``: a Ctrl-C (``KeyboardInterrupt``, a SIGTERM made one by
    ``sim.workers.sigterm_as_interrupt``) or a spent time budget
    (``sim.studies.sweep_executors.TimeBudgetSpent``) during the simulations ends the search
    with what it has (``SearchResult.stopped`` says which; the plans not simulated are
    ``"not simulated"``), taking the records of the interrupted wave that had finished from
    ``finished`` (records by key, ``sim.studies.sweep.Runner.log.done``). The caller ends
    its workers.

    ``screening_records``: ``simulate`` takes ``screening``, the keys of the plans it is given
    that are screening runs (``Runner.run``'s, which makes their records only what
    ``extrapolate`` reads)."""
    from sim.studies.sweep_executors import TimeBudgetSpent
    from sim.workers import Terminated

    by_energy, final = options.by_energy, options.finalists
    cands = [Candidate(c.plan, c.key, c.estimate, c.bound_s, "pending" if c.estimate.fits else "pruned: memory",
                       slope_s=c.slope_s, lower_bound=c.lower_bound) for c in cands]
    order = sorted((c for c in cands if c.status == "pending"), key=lambda c: (c.bound_s, c.key))
    times: list[float] = []
    lightest: dict = {}  # recompute family -> the least recompute among its plans that ran and fit
    spent = [0]  # simulations run so far

    def run(plans: list, screening: frozenset = frozenset()) -> list[dict]:
        # the longest first (a simulation's time goes with its micro-batches), so that the
        # workers finish a call together; the records come back in the plans' order
        order = sorted(range(len(plans)), key=lambda i: -plans[i].num_microbatches)
        recs = [None] * len(plans)
        given = [plans[i] for i in order]
        for i, rec in zip(order, simulate(given, screening=screening) if screening_records and screening
                          else simulate(given)):
            recs[i] = rec
        spent[0] += len(plans)
        return recs

    stopped = None
    try:
        _waves(order, run, options, planned, spent, times, lightest)
        key = (lambda s: s["energy_per_token_j"]) if by_energy else (lambda s: s["iteration_time_s"])
        finalists = sorted((c for c in cands if c.record is not None and _ran_and_fit(c.record)),
                           key=lambda c: (key(c.record["summary"]), c.key))[:final]
        again = [c for c in finalists if c.status == "screened"]
        for c, rec in zip(again, run([c.plan for c in again]) if again else []):
            c.record, c.status = rec, rec["status"]
        if planned is not None:
            planned(spent[0])
    except (KeyboardInterrupt, TimeBudgetSpent) as exc:
        if not stoppable:
            raise
        stopped = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT" if isinstance(exc, KeyboardInterrupt) \
            else "max-time"
        for c in cands:  # what the interrupted wave finished
            rec = (finished or {}).get(c.key)
            if c.status in ("pending", "screened") and rec is not None:
                c.record, c.status = rec, rec["status"]
            if c.status == "pending":
                c.status = "not simulated"
    key = (lambda s: s["energy_per_token_j"]) if by_energy else (lambda s: s["iteration_time_s"])
    ranked = sorted((c.record for c in cands if c.status == "ok" and c.record["summary"].get("fits", True)),
                    key=lambda r: (key(r["summary"]), r["key"]))
    counts = {"plans": len(cands), "evaluated": sum(c.record is not None for c in cands),
              "screened": sum(c.status == "screened" for c in cands),
              "ok": len(ranked), "does_not_fit": sum(c.status == "ok" for c in cands) - len(ranked),
              "failed": sum(c.status in ("error", "crashed") for c in cands),
              "pruned_memory": sum(c.status == "pruned: memory" for c in cands),
              "pruned_time": sum(c.status == "pruned: time" for c in cands),
              "pruned_dominated": sum(c.status == "pruned: dominated" for c in cands),
              "not_simulated": sum(c.status == "not simulated" for c in cands), "simulations": spent[0]}
    counts["pruned"] = counts["pruned_memory"] + counts["pruned_time"] + counts["pruned_dominated"]
    return SearchResult(cands, ranked, options.margin, counts, stopped)


def plan_margin(c: Candidate, margin: float | None) -> float:
    """The margin ``search`` prunes ``c`` with: ``margin`` when given (``trainsim search
    --margin``), else 1 where ``c``'s bound is a true lower bound (``Candidate.lower_bound``:
    no plan simulates faster than it, so no error factor is needed; the mixtures of experts,
    every dispatcher, tests/test_search_moe_cp.py) and ``DEFAULT_MARGIN`` for the rest."""
    if margin is not None:
        return margin
    return 1.0 if c.lower_bound else DEFAULT_MARGIN


def _waves(order, run, options: SearchOptions, planned, spent, times, lightest) -> None:
    """``search``'s waves over ``order`` (candidates by bound), pruning before each;
    ``spent`` (simulations run, a one-item list), ``times`` (the simulated plans' times or
    energies) and ``lightest`` (recompute family -> its least recompute that ran and fit)
    are the search's, updated as the waves run."""
    exact, margin, wave, screen, final = options.exact, options.margin, options.wave, options.screens, options.finalists
    by_energy, floor_of, runs_of = options.by_energy, options.floor_of, options.runs_of
    i = 0
    while i < len(order):
        threshold = sorted(times)[exact - 1] if len(times) >= exact else math.inf
        if planned is not None:  # what may still run: the plans left that the pruning cannot rule out yet
            left = [runs_of(c) for c in order[i:] if floor_of(c) <= threshold]
            screened = sum(c.status == "screened" for c in order[:i]) + left.count(2)
            planned(spent[0] + sum(left) + min(final, screened))  # and the full runs of screened finalists
        floor = floor_of(order[i])
        if floor > threshold:
            for c in order[i:]:
                c.status = "pruned: time"
            break
        batch = []
        while i < len(order) and len(batch) < wave:
            c, i = order[i], i + 1
            family, weight = recompute_family(c.plan)
            if floor_of(c) > threshold:  # (plans' margins differ, so a later plan's floor may pass the threshold)
                c.status = "pruned: time"  # as `planned` counted it: it cannot beat the best so far
            elif lightest.get(family, weight) < weight and math.isfinite(plan_margin(c, margin)) and not by_energy:
                c.status = "pruned: dominated"
            else:
                batch.append(c)
        def floor(c, sizes, first) -> float:  # the least time a screening's first run allows
            mc = plan_margin(c, margin)
            return first_run_floor(c, sizes, first, mc) if math.isfinite(mc) else -math.inf

        def bar(recs) -> float:  # the second best of the times so far and the wave's
            known = sorted(times + [r["summary"]["iteration_time_s"] for r in recs if _ran_and_fit(r)])
            return known[exact - 1] if len(known) >= exact else math.inf

        cut = screen and not by_energy
        for c, rec in zip(batch, _simulate_wave(batch, run, screen, floor if cut else None, bar, lead=exact)):
            if rec is None:  # its first screening run rules it out
                c.status = "pruned: time"
                continue
            c.record, c.status = rec, rec["status"]
            if _ran_and_fit(rec):
                s = rec["summary"]
                times.append(s["energy_per_iteration_j"] if by_energy else s["iteration_time_s"])
                family, weight = recompute_family(c.plan)
                lightest[family] = min(weight, lightest.get(family, weight))


def _ran_and_fit(rec: dict) -> bool:
    return rec["status"] in ("ok", "screened") and rec["summary"].get("fits", True)


def screen_sizes(plan: ParallelPlan) -> tuple[int, int] | None:
    """The two micro-batch counts ``search`` screens ``plan`` at, or None to simulate it in
    full: a = pp·(vpp + 1), past the warm-up (every rank in its steady one-forward-one-
    backward rhythm: 2·pp for one chunk a stage, more with interleaving, whose warm-up runs
    (vpp − 1)·pp chunks more), and b = a + 2·pp (interleaving needs multiples of pp), when
    a + b is below the plan's micro-batches and its memory does not grow with them (not
    gpipe). From a on, an iteration's time grows by one steady-state period per extra
    micro-batch, T(m) = T(a) + (m − a)·(T(b) − T(a))/(b − a): the warm-up, the drain, the
    gradient sync after the last backward and the optimizer step do not depend on m, and
    the peak memory is reached within the first b (at most pp micro-batches in flight
    with one chunk, 2·pp for zb-h2). tests/test_search_moe_cp.py checks it against full
    simulations."""
    a = plan.pp * (plan.vpp + 1)
    b = a + 2 * plan.pp
    if not plan.pipeline.periodic or plan.num_microbatches <= a + b:
        return None
    return a, b


def screened_plans(plan: ParallelPlan, sizes: tuple[int, int]) -> list[ParallelPlan]:
    """``plan`` with the global batch cut to each of ``sizes`` micro-batches."""
    per = plan.global_batch_size // plan.num_microbatches  # sequences per micro-batch, over dp
    return [replace(plan, global_batch_size=per * m) for m in sizes]


def extrapolate(plan: ParallelPlan, sizes: tuple[int, int], records: list[dict]) -> dict | None:
    """A screened record of ``plan`` from its runs at ``sizes`` micro-batches (``records``),
    or None when either did not run: the iteration time extrapolated to the plan's
    micro-batches (``screen_sizes``), ``fits`` from the larger run."""
    if any(r["status"] != "ok" for r in records):
        return None
    (a, b), (ta, tb) = sizes, (r["summary"]["iteration_time_s"] for r in records)
    t = ta + (plan.num_microbatches - a) * (tb - ta) / (b - a)
    return {"key": plan_key(plan), "plan": asdict(plan), "status": "screened", "error": None,
            "summary": {"iteration_time_s": t, "fits": records[1]["summary"].get("fits", True)},
            "screened": {"microbatches": [a, b], "iteration_time_s": [ta, tb]}}


def _simulate_wave(batch: list[Candidate], simulate, screen: bool, floor=None, threshold=None,
                   lead: int = 2) -> list[dict | None]:
    """Records for a wave's candidates: screened where ``screen`` and ``screen_sizes``
    allow, else in full; a plan whose screening runs failed is simulated in full.
    ``simulate(plans, screening)`` (``search``'s) is told the keys of the screening runs.

    The cheaper run of each screening goes first, with the full runs (one call, so they run
    in parallel). With ``floor(candidate, sizes, first_record)`` (the least time its first
    run allows, ``first_run_floor``) and ``threshold(records)`` (the time a plan must beat,
    given the wave's records so far), the second runs then go in order of that floor: the
    ``lead`` lowest first, then, once their times are known, every other plan whose floor
    is still below the threshold (a plan above it gets None: ``search`` marks it pruned)."""
    sizes = [screen_sizes(c.plan) if screen else None for c in batch]
    first = [c.plan if sz is None else screened_plans(c.plan, sz)[0] for c, sz in zip(batch, sizes)]
    recs = simulate(first, frozenset(plan_key(p) for p, sz in zip(first, sizes) if sz is not None)) if first else []
    out: list = [r if sz is None else None for r, sz in zip(recs, sizes)]
    redo = [i for i, (r, sz) in enumerate(zip(recs, sizes)) if sz is not None and r["status"] != "ok"]
    second = [i for i, (r, sz) in enumerate(zip(recs, sizes)) if sz is not None and r["status"] == "ok"]
    if floor is not None:
        low = {i: floor(batch[i], sizes[i], recs[i]) for i in second}
        second.sort(key=lambda i: (low[i], batch[i].key))
    parts = [second] if floor is None else [second[:lead], second[lead:]]
    for k, part in enumerate(parts):
        if k and floor is not None:  # what the wave's runs so far leave to beat
            bar = threshold([r for r in out if r is not None])
            part = [i for i in part if low[i] <= bar]
        runs = [screened_plans(batch[i].plan, sizes[i])[1] for i in part]
        for i, rec in zip(part, simulate(runs, frozenset(map(plan_key, runs))) if part else []):
            out[i] = extrapolate(batch[i].plan, sizes[i], [recs[i], rec])
            if out[i] is None:
                redo.append(i)
    redo.sort()
    for i, rec in zip(redo, simulate([batch[i].plan for i in redo]) if redo else []):
        out[i] = rec
    return out


def first_run_floor(c: Candidate, sizes: tuple[int, int], record: dict, margin: float) -> float:
    """The least time ``c``'s screening can extrapolate to, from its first run alone (at
    a = ``sizes[0]`` micro-batches, ``record``): T(a) + (m − a)·slope / margin, with slope the
    bound's growth per micro-batch (``Candidate.slope_s``). Where the bound / margin stays
    below the simulated time at every micro-batch count (what pruning by the bound rests on),
    it stays below T(a) + (m − a)·s for every large m, so s, the steady-state period the
    screening extrapolates with, is at least slope / margin."""
    a, m = sizes[0], c.plan.num_microbatches
    return record["summary"]["iteration_time_s"] + (m - a) * c.slope_s / margin


RECOMPUTE_WEIGHT = {"none": 0, "selective": 1, "full": 2}
"""Recompute by the work it adds: selective recomputes the attention core, full the whole
layer, attention core included."""


def recompute_family(plan: ParallelPlan) -> tuple:
    """(the plan with its recompute and layer split left out, its recompute's weight).
    Within a family a plan with more recompute does the same work and more (the recomputed
    forward), so it cannot run faster than one with less that fits: ``search`` does not
    simulate it once such a plan has run and fit. (An uneven split is balanced for each
    plan's own work, ``balanced_plan``: on any split the heavier plan does at least the
    lighter one's work, and the lighter plan's split is the one balanced for it.)"""
    return (replace(plan, recompute="none", recompute_modules=None, layer_split=None),
            RECOMPUTE_WEIGHT.get(plan.recompute, 0))


def measure_margin(cands: list[Candidate]) -> dict:
    """How the estimate's bound compares with simulation over the simulated candidates:
    the ratios ``bound_s / simulated time`` (min, median, max). The margin a search needs
    is at least ``max``."""
    ratios = sorted(c.bound_s / c.record["summary"]["iteration_time_s"] for c in cands
                    if c.record is not None and c.record["status"] in ("ok", "screened"))
    if not ratios:
        return {"plans": 0}
    return {"plans": len(ratios), "min": ratios[0], "median": ratios[len(ratios) // 2], "max": ratios[-1]}
