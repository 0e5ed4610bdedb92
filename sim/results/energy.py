"""What an iteration costs in energy: each GPU's power follows its state through the trace.

At every instant of the iteration a GPU is in one of four states, read from its spans:

- **compute-bound**: its compute stream runs a GEMM or attention kernel (the compute term
  of the kernel's roofline is the larger, ``sim.program.costs``). The SM clock settles where
  the draw meets the power limit, so the GPU draws its limit: ``power_limit_w``, or the cap
  set with ``--power-limit-w`` (``power_cap_w``, ``sim.inputs.power``).
- **memory-bound**: its compute stream runs a kernel bound by HBM bandwidth (norms,
  elementwise fusions, the optimizer step): ``memory_bound_power_fraction`` of the limit
  (at most the cap).
- **communicating**: no compute kernel, but an NCCL kernel (a collective, send or receive)
  or a host copy moves data: ``communication_power_fraction`` of the limit (at most the cap).
  A collective that waits for its peers counts from when its data starts to move, as in
  ``sim.results.metrics``; before that the GPU waits.
- **idle**: nothing runs, or only waits: ``idle_power_w``.

A compute span is one pipeline step's piece (``2F0.3``), which merges many kernels: the
share of its time in compute-bound kernels is the step's, from the step's ops priced as the
program prices them (``step_compute_fractions``); its power is that share of the
compute-bound power and the rest of the memory-bound power. Other compute spans (the
optimizer step) are memory-bound.

A GPU's energy over an iteration of T seconds is the integral of its power over [0, T]
(after its last action it idles until the iteration ends), so for every GPU

    idle_power_w · T  <=  energy  <=  power_limit_w · T.

The cluster's energy sums over its GPUs. Under reduced fidelity (``sim.program.training``:
one data-parallel replica of each pipeline stage simulated, the others its shadows doing
the same work at the same times) each simulated GPU stands for the GPUs of its pipeline
stage that were not simulated, shared equally (``rank_weights``); on a mixed cluster each
GPU is priced on its own type's profile. The figures count the GPU boards only: not the
host CPUs, memory, NICs, switches or cooling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from sim.errors import InputError
from sim.program.api import bias_pass_time, chunk_work, fixed_time, in_moe_block, job_profile, op_time, Step
from sim.results.trace import Span, Trace

STATES = ("compute_bound", "memory_bound", "communication", "idle")
COMPUTE_STREAM = "compute"
"""The stream of a GPU's compute kernels (other streams of kind ``compute``, ``cpu`` for an
offloaded optimizer step and ``memory`` for markers, are not the GPU's kernels)."""
COMM_KINDS = ("collective", "send", "recv", "comm", "copy")
PIPELINE = ("F", "B", "I", "W")


@dataclass(frozen=True)
class PowerStates:
    """Watts one GPU draws in each state (module doc)."""

    compute_bound_w: float
    memory_bound_w: float
    communication_w: float
    idle_w: float

    @classmethod
    def of(cls, profile) -> "PowerStates | None":
        """A profile's power states; None when it lacks a figure the model needs."""
        need = (profile.power_limit_w, profile.idle_power_w, profile.memory_bound_power_fraction,
                profile.communication_power_fraction)
        if any(v is None for v in need):
            return None
        limit = profile.power_limit_w
        cap = profile.power_cap_w if profile.power_cap_w is not None else limit
        return cls(cap, min(profile.memory_bound_power_fraction * limit, cap),
                   min(profile.communication_power_fraction * limit, cap), profile.idle_power_w)

    def compute_w(self, compute_fraction: float) -> float:
        """Watts of a compute span whose time is ``compute_fraction`` compute-bound kernels."""
        return compute_fraction * self.compute_bound_w + (1.0 - compute_fraction) * self.memory_bound_w


def _union_s(group: np.ndarray, start: np.ndarray, end: np.ndarray, groups: int, span_s: float) -> np.ndarray:
    """Per group, the seconds the union of its intervals covers. The groups' intervals are
    shifted ``span_s`` apart (longer than any interval's end) so that one sort and one running
    maximum of the ends merge each group's intervals without touching the others'."""
    if not len(start):
        return np.zeros(groups)
    shift = group * span_s
    order = np.argsort(start + shift, kind="stable")
    s, e = (start + shift)[order], (end + shift)[order]
    reach = np.maximum.accumulate(e)
    before = np.concatenate(([-np.inf], reach[:-1]))
    return np.bincount(group[order], weights=np.maximum(0.0, e - np.maximum(s, before)), minlength=groups)


def state_seconds(spans: Iterable[Span], end_s: float,
                  fraction_of: Callable[[int], Callable[[Span], float]]) -> dict[int, dict[str, float]]:
    """Per rank with spans, the seconds of [0, ``end_s``] it spends in each state (module doc);
    ``fraction_of(rank)(span)``: the share of a compute span's time in compute-bound kernels.
    A GPU computes while its compute stream runs a kernel; it communicates while a
    collective, transfer or copy moves data and it does not compute; else it idles."""
    ranks: dict[int, int] = {}
    fractions: dict[int, Callable] = {}
    cg, cs, ce, cf, mg, ms, me = [], [], [], [], [], [], []
    for sp in spans:
        kind, start, end = sp.kind, sp.start_s, sp.end_s
        g = ranks.get(sp.rank)
        if g is None:
            g = ranks[sp.rank] = len(ranks)
            fractions[g] = fraction_of(sp.rank)
        if end <= start:
            continue
        if kind == "compute":
            if sp.stream == COMPUTE_STREAM:
                cg.append(g), cs.append(start), ce.append(end), cf.append(fractions[g](sp))
        elif kind in COMM_KINDS:
            if sp.busy_start_s is not None:
                start = sp.busy_start_s
            if end > start:
                mg.append(g), ms.append(start), me.append(end)
    n, span_s = len(ranks), end_s + 1.0
    cg, cs, ce, cf = np.array(cg, dtype=int), np.array(cs), np.array(ce), np.array(cf)
    busy = _union_s(cg, cs, ce, n, span_s)
    either = _union_s(np.concatenate((cg, np.array(mg, dtype=int))), np.concatenate((cs, ms)),
                      np.concatenate((ce, me)), n, span_s)
    bound = np.bincount(cg, weights=cf * (ce - cs), minlength=n)
    memory = np.bincount(cg, weights=(1.0 - cf) * (ce - cs), minlength=n)
    out = {}
    for r, g in ranks.items():
        idle = end_s - either[g]
        out[r] = {"compute_bound": float(bound[g]), "memory_bound": float(memory[g]),
                  "communication": float(either[g] - busy[g]),
                  "idle": float(idle) if idle > 1e-12 * end_s else 0.0}  # (not rounding's crumbs)
    return out


def _joules(seconds: dict[str, float], power: PowerStates) -> dict[str, float]:
    return {"compute_bound": seconds["compute_bound"] * power.compute_bound_w,
            "memory_bound": seconds["memory_bound"] * power.memory_bound_w,
            "communication": seconds["communication"] * power.communication_w,
            "idle": seconds["idle"] * power.idle_w}


def gpu_energy(spans: Iterable[Span], end_s: float, power: PowerStates,
               compute_fraction: Callable[[Span], float]) -> dict:
    """Joules one GPU spends in each state over [0, ``end_s``] (module doc), from its spans;
    ``compute_fraction(span)``: the share of a compute span's time in compute-bound kernels."""
    seconds = state_seconds(spans, end_s, lambda r: compute_fraction)
    if len(seconds) > 1:
        raise ValueError(f"gpu_energy: spans of ranks {sorted(seconds)}; expected one GPU's")
    return _joules(next(iter(seconds.values()), {"compute_bound": 0.0, "memory_bound": 0.0,
                                                  "communication": 0.0, "idle": end_s}), power)


def rank_weights(trace: Trace, plan) -> dict[int, float]:
    """GPUs each simulated rank stands for: the plan's GPUs of its pipeline stage over the
    stage's simulated ranks (1 at full fidelity; under reduced fidelity the shadows of a
    stage are shared equally among its simulated ranks)."""
    ranks = sorted({s.rank for s in trace.spans})
    per_stage: dict[int, list[int]] = {}
    for r in ranks:
        per_stage.setdefault(plan.coords(r)[1], []).append(r)
    stage_gpus = plan.world_size / plan.pp
    return {r: stage_gpus / len(rs) for rs in per_stage.values() for r in rs}


def iteration_energy(trace: Trace, plan, power_of: Callable[[int], PowerStates],
                     fraction_of: Callable[[int], Callable[[Span], float]], tokens: float) -> dict:
    """The energy figures of one iteration (``trainsim run --json``'s keys): joules per
    iteration and per token, the cluster's and each GPU's average watts, and joules by state.
    ``power_of(rank)``: its GPU's power states; ``fraction_of(rank)``: its ``compute_fraction``
    (``gpu_energy``)."""
    T = trace.end_s
    weights = rank_weights(trace, plan)
    seconds = state_seconds(trace.spans, T, fraction_of)
    by_state = dict.fromkeys(STATES, 0.0)
    for r, w in sorted(weights.items()):
        for k, v in _joules(seconds[r], power_of(r)).items():
            by_state[k] += w * v
    total = sum(by_state.values())
    return {"energy_per_iteration_j": total, "energy_per_token_j": total / tokens if tokens else 0.0,
            "average_power_w": total / T if T > 0 else 0.0,
            "average_power_per_gpu_w": total / T / plan.world_size if T > 0 else 0.0,
            "energy_by_state_j": by_state}


def step_compute_fractions(model, plan, profile) -> Callable[[Span], float]:
    """``span -> share of its time in compute-bound kernels``: for a pipeline step's piece
    (category F, B, I or W, named ``<virtual stage><kind><micro-batch>[.piece]``), the share
    of the step's kernel time in ops whose roofline's compute term is the larger, priced on
    ``profile`` as the job runs it (paced, ``sim.program.build.job_profile``) with the
    balanced expert loads; 0 for every other compute span (the optimizer step)."""
    prof = job_profile(profile, plan)
    phases = {"F": ("F",), "B": ("B", "W"), "I": ("B",), "W": ("W",)}
    cache: dict[tuple[int, str], float] = {}

    def of_step(stage: int, kind: str) -> float:
        key = (stage, kind)
        if key not in cache:
            bound = total = 0.0
            for work in chunk_work(model, plan, stage, profile=prof):
                for phase in phases[kind]:
                    for op in work.ops(phase):
                        t = op_time(op, prof)
                        total += t
                        bound += t if compute_bound(op, prof) else 0.0
            cache[key] = bound / total if total > 0 else 0.0
        return cache[key]

    by_name: dict[tuple[str, str], float] = {}

    def of_span(name: str, category: str) -> float:
        if category not in PIPELINE:
            return 0.0
        try:
            step = Step.parse(name.split(".")[0].split(" ")[0])
        except InputError:  # not a step's name: the kind's mean over the virtual stages
            n = plan.pp * plan.vpp
            return sum(of_step(v, category) for v in range(n)) / n
        return of_step(step.stage, step.kind)

    def fraction(span: Span) -> float:
        key = (span.name, span.category)
        f = by_name.get(key)
        if f is None:
            f = by_name[key] = of_span(*key)
        return f

    return fraction


def compute_bound(op, profile) -> bool:
    """Whether an op's time is its roofline's compute term (``sim.program.costs.op_time``:
    max(compute, memory) + bias pass + launch), not its memory term."""
    memory = (op.bytes_read + op.bytes_written) / profile.memory_rate(op.framework, in_moe_block(op))
    compute = op_time(op, profile) - bias_pass_time(op, profile) - fixed_time(op, profile)
    return op.flops > 0 and compute > memory * (1.0 + 1e-9)


def run_energy(run, tokens: float) -> dict | None:
    """The energy figures of a ``sim.session.TrainingRun`` (``iteration_energy``), or None
    when a GPU's profile lacks the power figures (``PowerStates.of``)."""
    mixed = run.mixed
    profiles = mixed.profiles if mixed is not None else {run.profile.name: run.profile}
    states = {name: PowerStates.of(p) for name, p in profiles.items()}
    if any(v is None for v in states.values()):
        return None
    fractions = {name: step_compute_fractions(run.model, run.plan, p) for name, p in profiles.items()}
    type_of = (lambda r: mixed.of_rank[r]) if mixed is not None else (lambda r: run.profile.name)
    return iteration_energy(run.trace, run.plan, lambda r: states[type_of(r)], lambda r: fractions[type_of(r)],
                            tokens)


def _si(value: float, unit: str) -> str:
    """``12.3 kJ``: ``value`` with the SI prefix that reads best, three significant figures."""
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m")):
        if abs(value) >= scale or scale == 1e-3:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def energy_line(summary: dict) -> str:
    """The energy line ``trainsim run`` prints: joules per iteration and per token, tokens
    per joule, and the cluster's and each GPU's average power."""
    e = summary.get("energy_per_iteration_j")
    if e is None:
        return "  energy             not modelled (the GPU's profile gives no power figures)"
    per_token = summary["energy_per_token_j"]
    return (f"  energy             {_si(e, 'J'):>12}   per iteration; {_si(per_token, 'J')}/token "
            f"({1 / per_token:.3g} tokens/J), average {_si(summary['average_power_w'], 'W')} "
            f"({summary['average_power_per_gpu_w']:.0f} W per GPU)")
