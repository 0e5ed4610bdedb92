"""Programs for mixed clusters: each GPU's compute priced on its own GPU type, and a
layer split that balances pipeline stages placed on GPUs of different speeds.

**One program, several prices.** The actions of an iteration (names, streams,
dependencies, collectives, memory) depend on the model and the plan, not on the GPU;
only compute durations do. ``build_mixed`` builds the program once per GPU type and gives
each rank the action list of its own type's program. Ranks listed as copies of another
(``Program.like``) stay so only when both are of one type.

**A balanced split.** Stage s of a pipeline on GPU type g_s spends, per micro-batch,
the sum of its layers' times on g_s (forward, backward and weight gradient, with their
tensor- and expert-parallel collectives; a dense layer and a mixture-of-experts layer each
at its own price, so DeepSeek-V3's three dense layers weigh less than its MoE ones) plus
e_s: the embedding on the first virtual stage, the output layer and loss (and the
multi-token-prediction module, ``sim.program.workload.mtp_works``) on the last. The
slowest stage sets the pipeline's pace (Narayanan et al. SC'21). The layers run in order
through the virtual stages, so a split is a cut of the sequence of layer times into pp·vpp
contiguous pieces, each of at least one layer, and ``balanced_split`` finds one exactly by
dynamic programming (the linear-partition recurrence, Skiena, *The Algorithm Design
Manual* §8.5): first the least possible time of the slowest virtual stage, then, among the
cuts that keep every stage within it, the one with the least sum of squared stage times
(the most even). With vpp > 1 a rank runs several virtual stages, so the cut is then moved
one layer at a time while that lowers the slowest rank's total (then the slowest virtual
stage, then the sum of squares). A stage whose GPUs are of several types is priced on its
slowest.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sim.errors import require
from sim.inputs.hardware import HardwareProfile
from sim.inputs.model import ModelSpec
from sim.inputs.plan import ParallelPlan
from sim.program.actions import Program
from sim.program.build import job_profile
from sim.program.costs import work_times
from sim.inputs.layer_split import virtual_split
from sim.program.estimate import layer_key, layer_phase_times
from sim.program.workload import mtp_works, plan_edge_works, plan_layer_work


def stage_costs(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile) -> tuple[float, float, float]:
    """Seconds per micro-batch on ``profile``: one dense transformer layer, the embedding and
    the output layer with its loss and the MTP module if any (F + B + W, compute and
    tensor-parallel collectives)."""
    embedding, head = plan_edge_works(model, plan)
    return (_layer_cost(model, plan, profile, False), _total(embedding, plan, profile),
            head_cost(model, plan, profile))


def _total(work, plan: ParallelPlan, profile: HardwareProfile) -> float:
    return sum(c + x for c, x in work_times(work, profile, plan.tp).values())


def head_cost(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile) -> float:
    """The last virtual stage's work besides its transformer layers: the output layer and
    loss, and each MTP module (its projection, norms and output pass, and its layer at the
    price of a layer of its kind)."""
    total = _total(plan_edge_works(model, plan)[1], plan, profile)
    for k in range(model.mtp_num_layers):
        module, _ = mtp_works(model, plan, k, profile=profile)
        total += _total(module, plan, profile) + _layer_cost(model, plan, profile, model.is_moe_layer(
            model.num_layers + k))
    return total


def _layer_cost(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, moe: bool) -> float:
    """One layer's seconds per micro-batch: a dense one as ``stage_costs`` prices it, an MoE
    one with its expert-parallel collectives (``layer_phase_times``, under balanced routing);
    with context parallelism a dense one too, as the estimate prices it (``work_times`` prices
    only tensor-parallel collectives, and the layer's ring-attention exchanges run over cp)."""
    if not moe and plan.cp == 1:
        return _total(plan_layer_work(model, plan, profile=profile), plan, profile)
    return sum(c + x for c, x in layer_phase_times(model, plan, profile, "nvlink", 8, "bf16", moe).values())


def layer_costs(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile) -> tuple[list[float], float, float]:
    """(seconds of each transformer layer, of the embedding, of the head and MTP) per
    micro-batch on ``profile``. They do not depend on how the layers are placed on the stages
    (``layer_key``), so a search's plans that differ only in that share them."""
    key = (model, layer_key(plan), profile)
    hit = _LAYER_COSTS.get(key)
    if hit is None:
        if len(_LAYER_COSTS) >= 1024:
            _LAYER_COSTS.clear()
        hit = _LAYER_COSTS[key] = _layer_costs(model, plan, profile)
    return list(hit[0]), hit[1], hit[2]


_LAYER_COSTS: dict = {}
"""``layer_costs``' answers by ``layer_key``."""


def _layer_costs(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile) -> tuple[list[float], float, float]:
    if model.layers is not None:  # mixed layers: each distinct layer priced by its kinds
        by_kind = {lay: sum(c + x for c, x in layer_phase_times(model, plan, profile, "nvlink", 8, "bf16", lay.is_moe,
                                                                 lay).values()) for lay in model.layer_kinds}
        _, embedding, _ = stage_costs(model, plan, profile)
        return [by_kind[model.layer(i)] for i in range(model.num_layers)], embedding, head_cost(model, plan, profile)
    kinds = {moe: _layer_cost(model, plan, profile, moe) for moe in {model.is_moe_layer(i)
                                                                      for i in range(model.num_layers)}}
    per_layer = [kinds[model.is_moe_layer(i)] for i in range(model.num_layers)]
    _, embedding, _ = stage_costs(model, plan, profile)
    return per_layer, embedding, head_cost(model, plan, profile)


def _slowest_costs(model, plan, stage_profiles) -> list[tuple[list[float], float, float]]:
    """Per pipeline stage: ``layer_costs`` on its slowest GPU type (by the total)."""
    cache: dict[str, tuple] = {}
    out = []
    for profiles in stage_profiles:
        for pr in profiles:  # each GPU type priced once
            if pr.name not in cache:
                cache[pr.name] = layer_costs(model, plan, pr)
        priced = [cache[pr.name] for pr in profiles]
        out.append(max(priced, key=lambda c: sum(c[0]) + c[1] + c[2]))
    return out


def balanced_split(model: ModelSpec, plan: ParallelPlan, stage_profiles: list[list[HardwareProfile]]) -> tuple:
    """Layers per pipeline stage (vpp 1) or per virtual stage (index ``chunk·pp + rank``,
    vpp > 1) that minimize the slowest stage's time (module doc), ``stage_profiles[s]``
    being the GPU types pipeline stage s runs on."""
    p, v, L = plan.pp, plan.vpp, model.num_layers
    K = p * v
    require(L >= K, "--layer-split", "auto",
            f"needs at least one layer per virtual stage: num_layers {L} < pp x vpp = {p} x {v}")
    priced = _slowest_costs(model, plan, stage_profiles)
    cost = [priced[k % p][0] for k in range(K)]                   # layer times on virtual stage k's GPUs
    extra = [(priced[0][1] if k == 0 else 0.0) + (priced[p - 1][2] if k == K - 1 else 0.0) for k in range(K)]
    prefix = [[0.0] for _ in range(K)]
    for k in range(K):
        for c in cost[k]:
            prefix[k].append(prefix[k][-1] + c)

    def piece(k: int, i: int, j: int) -> float:        # layers i..j-1 on virtual stage k
        return prefix[k][j] - prefix[k][i] + extra[k]

    # the least time of the slowest virtual stage, then the most even cut within it
    worst = _partition(prefix, extra, "max")[0]
    limit = worst * (1 + 1e-12)
    counts = _partition(prefix, extra, "squares", limit)[1]
    if v > 1:
        counts = _even_ranks(counts, p, piece)
    return tuple(counts)


def _partition(prefix, extra, fold: str, limit: float = float("inf")) -> tuple[float, list[int]]:
    """The cut of layers 0..L-1 into K contiguous pieces of >= 1 layer that minimizes the
    fold of the pieces' times, piece k of layers i..j-1 taking prefix[k][j] − prefix[k][i] +
    extra[k]: ``fold`` "max" (the slowest piece) or "squares" (the sum of squares, pieces
    over ``limit`` forbidden). Returns the best value and the counts. Dynamic programming over
    (pieces, layers), each row at once with numpy: the same sums and the same first-minimum
    ties as a loop over every cut."""
    inf = float("inf")
    P = np.asarray(prefix, dtype=float)
    K, L = P.shape[0], P.shape[1] - 1
    i_idx = np.arange(L + 1)[:, None]
    j_idx = np.arange(L + 1)[None, :]
    best = np.full(L + 1, inf)
    best[0] = 0.0
    arg = np.zeros((K + 1, L + 1), dtype=int)
    for k in range(1, K + 1):
        t = (P[k - 1][None, :] - P[k - 1][:, None]) + extra[k - 1]          # t[i, j]: piece k-1 of layers i..j-1
        if fold == "max":
            vals = np.maximum(best[:, None], t)
        else:
            with np.errstate(invalid="ignore"):
                vals = np.where(t <= limit, best[:, None] + t * t, inf)
        ok = (i_idx >= k - 1) & (i_idx < j_idx) & (j_idx >= k) & (j_idx <= L - (K - k))
        vals = np.where(ok, vals, inf)
        arg[k] = np.argmin(vals, axis=0)
        best = vals[arg[k], np.arange(L + 1)]
    counts, j = [], L
    for k in range(K, 0, -1):
        i = int(arg[k][j])
        counts.append(j - i)
        j = i
    return float(best[L]), counts[::-1]


def _even_ranks(counts: list[int], p: int, piece) -> list[int]:
    """Move one layer across a cut between virtual stages while it lowers (the slowest rank's
    total, the slowest virtual stage, the sum of squares) (module doc)."""
    def key(cs):
        starts = [sum(cs[:k]) for k in range(len(cs))]
        times = [piece(k, starts[k], starts[k] + n) for k, n in enumerate(cs)]
        ranks = [sum(times[k] for k in range(r, len(cs), p)) for r in range(p)]
        return max(ranks), max(times), sum(t * t for t in times)

    now = key(counts)
    improved = True
    while improved:
        improved = False
        for k in range(len(counts) - 1):
            for d in (1, -1):
                cs = list(counts)
                cs[k], cs[k + 1] = cs[k] + d, cs[k + 1] - d
                if min(cs[k], cs[k + 1]) < 1:
                    continue
                new = key(cs)
                if new < tuple(x * (1 - 1e-12) for x in now):
                    counts, now, improved = cs, new, True
    return counts


def stage_time_s(split, model: ModelSpec, plan: ParallelPlan, stage_profiles) -> list[float]:
    """Each pipeline stage's seconds per micro-batch under ``split`` (per pipeline stage, or
    per virtual stage: ``sim.inputs.layer_split.virtual_split``): what ``balanced_split``
    balances, summed over a rank's virtual stages."""
    p, v = plan.pp, plan.vpp
    priced = _slowest_costs(model, plan, stage_profiles)
    counts = virtual_split(tuple(split), p, v)
    out = [0.0] * p
    start = 0
    for k, n in enumerate(counts):
        layers, embedding, head = priced[k % p]
        out[k % p] += sum(layers[start:start + n]) + (embedding if k == 0 else 0.0) + \
            (head if k == p * v - 1 else 0.0)
        start += n
    return out


def build_mixed(build, profiles: dict[str, HardwareProfile], of_rank) -> tuple:
    """The schedule and program of a mixed cluster: ``build(profile)`` (a ``build_program``
    with everything but the profile given) once per GPU type in ``profiles``, each rank
    taking the actions of its type's program (``of_rank[r]``)."""
    built = {name: build(profile) for name, profile in profiles.items()}
    schedule, first = next(iter(built.values()))
    actions, like = {}, {}
    for r in first.actions:
        prog = built[of_rank[r]][1]
        mine = prog.actions[r]
        require(len(mine) == len(first.actions[r]), "mixed cluster: program", f"rank {r}",
                "differs in its actions between GPU types (only durations may differ)")
        actions[r] = mine
        t = prog.like.get(r)
        if t is not None and of_rank[t] == of_rank[r]:
            like[r] = t
    return schedule, Program(actions, first.shadows, check=False, like=like)


def auto_layer_split(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, mixed=None) -> ParallelPlan:
    """``plan`` with ``--layer-split auto``: the ``balanced_split`` of its stages on their GPU
    types (``mixed``, a ``sim.inputs.mixed_gpus.MixedGpus``; None: every stage on ``profile``)."""
    split = balanced_split(model, plan, stage_profiles(plan, profile, mixed))
    out = dataclasses.replace(plan, layer_split=split)
    out.check_model(model)
    return out


def stage_profiles(plan: ParallelPlan, profile: HardwareProfile, mixed=None) -> list[list[HardwareProfile]]:
    """The GPU types each pipeline stage runs on, each as the job runs it (``job_profile``)."""
    if mixed is None:
        return [[job_profile(profile, plan)] for _ in range(plan.pp)]
    return [[job_profile(mixed.profiles[n], plan) for n in types] for types in mixed.stage_types(plan)]
