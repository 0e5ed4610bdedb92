"""Programs for mixed clusters: each GPU's compute priced on its own GPU type, and a
layer split that balances pipeline stages placed on GPUs of different speeds.

**One program, several prices.** The actions of an iteration (names, streams,
dependencies, collectives, memory) depend on the model and the plan, not on the GPU;
only compute durations do. ``build_mixed`` builds the program once per GPU type and gives
each rank the action list of its own type's program. Ranks listed as copies of another
(``Program.like``) stay so only when both are of one type.

**A balanced split.** Stage s of a pipeline on GPU type g_s spends, per micro-batch,
``n_s·t(g_s) + e_s``: n_s layers of t(g) seconds each (forward, backward and weight
gradient, with their tensor-parallel collectives; ``sim.program.costs.work_times``) and
e_s for the embedding on the first stage and the output layer and loss on the last. The
slowest stage sets the pipeline's pace (Narayanan et al. SC'21), so ``balanced_split``
minimizes max_s(n_s·t_s + e_s) with sum n_s = L: every stage starts with one unit (vpp
layers), and each further unit goes to the stage that would finish it earliest. For
identical units on machines of different speeds, each placed where it would finish
first, the greedy order is optimal for the largest finish time (the list-scheduling
argument for uniform machines, Graham 1969 / Gonzalez, Ibarra and Sahni 1977). A stage
whose GPUs are of several types is priced on its slowest.
"""

from __future__ import annotations

import dataclasses
import heapq

from sim.errors import require
from sim.inputs.hardware import HardwareProfile
from sim.inputs.model import ModelSpec
from sim.inputs.plan import ParallelPlan
from sim.program.actions import Program
from sim.program.build import job_profile
from sim.program.costs import work_times
from sim.program.workload import plan_edge_works, plan_layer_work


def stage_costs(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile) -> tuple[float, float, float]:
    """Seconds per micro-batch on ``profile``: one transformer layer, the embedding and the
    output layer with its loss (F + B + W, compute and tensor-parallel collectives)."""
    def total(work) -> float:
        return sum(c + x for c, x in work_times(work, profile, plan.tp).values())

    layer = plan_layer_work(model, plan)
    embedding, head = plan_edge_works(model, plan)
    return total(layer), total(embedding), total(head)


def balanced_split(model: ModelSpec, plan: ParallelPlan, stage_profiles: list[list[HardwareProfile]]) -> tuple:
    """Layers per pipeline stage that minimize the slowest stage's time (module doc),
    ``stage_profiles[s]`` being the GPU types stage s runs on."""
    p, v, L = plan.pp, plan.vpp, model.num_layers
    require(L % v == 0 and L >= p * v, "--layer-split", "auto",
            f"needs num_layers {L} to be a multiple of vpp = {v} and at least pp x vpp = {p * v}")
    costs = {}
    per_layer, extra = [], []
    for s, profiles in enumerate(stage_profiles):
        slowest = max((costs.setdefault(pr.name, stage_costs(model, plan, pr)) for pr in profiles),
                      key=lambda c: c[0])
        per_layer.append(slowest[0] * v)  # (a unit: vpp layers)
        extra.append((slowest[1] if s == 0 else 0.0) + (slowest[2] if s == p - 1 else 0.0))
    units = [1] * p
    heap = [(2 * per_layer[s] + extra[s], s) for s in range(p)]  # (finish with one more unit, stage)
    heapq.heapify(heap)
    for _ in range(L // v - p):
        _, s = heapq.heappop(heap)
        units[s] += 1
        heapq.heappush(heap, ((units[s] + 1) * per_layer[s] + extra[s], s))
    return tuple(u * v for u in units)


def stage_time_s(split, model: ModelSpec, plan: ParallelPlan, stage_profiles) -> list[float]:
    """Each stage's seconds per micro-batch under ``split`` (what ``balanced_split`` balances)."""
    out = []
    for s, (n, profiles) in enumerate(zip(split, stage_profiles)):
        worst = max((stage_costs(model, plan, pr) for pr in profiles), key=lambda c: c[0])
        out.append(n * worst[0] + (worst[1] if s == 0 else 0.0) + (worst[2] if s == len(split) - 1 else 0.0))
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
    types (``mixed``, a ``sim.inputs.mixed.MixedGpus``; None: every stage on ``profile``)."""
    split = balanced_split(model, plan, stage_profiles(plan, profile, mixed))
    out = dataclasses.replace(plan, layer_split=split)
    out.check_model(model)
    return out


def stage_profiles(plan: ParallelPlan, profile: HardwareProfile, mixed=None) -> list[list[HardwareProfile]]:
    """The GPU types each pipeline stage runs on, each as the job runs it (``job_profile``)."""
    if mixed is None:
        return [[job_profile(profile, plan)] for _ in range(plan.pp)]
    return [[job_profile(mixed.profiles[n], plan) for n in types] for types in mixed.stage_types(plan)]
