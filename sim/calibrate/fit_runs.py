"""Fitting a hardware profile to measured training runs (``trainsim fit``).

The calibration a user with a history of training jobs can do without microbenchmarks:
a few of the profile's physical parameters (``PARAMETERS``, each bounded to a physical
range) are chosen so that trainsim's simulated iteration times match the measured ones
(``sim.calibrate.runs_csv`` reads them).

- **Simulation.** Each run goes through the session layer (``sim.session.prepare`` once,
  then ``simulate_training`` per parameter vector) on the GPU's default cluster with the
  row's GPU count, at ``reduced`` fidelity (one GPU per pipeline stage, the others as
  shadows: the runs are symmetric, every data-parallel replica and tensor-parallel peer
  does the same work; full and reduced fidelity agree within 1%) and the ``flows``
  collective model. Simulations are cached by (row, the values the row's simulation sees:
  ``sim.calibrate.fit_sims``), so the fits that start from the same point share their
  first evaluations, and on disk with ``--cache``. With ``jobs`` > 1 the simulations one
  step of the fit needs run in that many worker processes at once (each simulation is
  deterministic, so the report is the same but for ``wall_s``).
- **Objective.** Relative residuals, predicted / measured − 1, each weighted by
  1/√(rows of its group) so that every group weighs the same (a weak-scaling table's
  rows are near copies; five of them are not five times the evidence), their squares
  summed; with ``loss="absolute"`` (``trainsim fit --loss absolute``) their absolute values,
  each weighted by 1/(rows of its group) (``sim.calibrate.fit_surrogate.LOSSES``).
  ``scipy.optimize.least_squares`` (trust-region reflective, bounded) works on the
  parameters scaled to [0, 1], its Jacobian by forward differences of 1e-3 of each range
  (the simulator's output is piecewise smooth in its costs) taken along what each row's
  simulation sees and chained to the parameters (``Simulations.slopes``: a BF16 row
  costs one simulation per step however many parameters), and few iterations. That is the
  plain path (``fast=False``); by default the least squares runs instead on a model of
  each row's time as a function of what it sees (``sim.calibrate.fit_surrogate``:
  simulated at the start and one probe per direction, then once per round at the
  model's minimum until a round no longer moves it): the same minimum for a few
  simulations per row, and every time the report gives is a simulation.
- **Held out.** Leave-one-group-out: for each group, the same fit without the group's
  rows predicts them. It starts from the fit on every row for the parameters its rows
  see (a converged fit reaches the same minimum from any start, and starting near it
  saves most of the simulations), and from the profile's value for any parameter none of
  its rows sees (such a parameter stays where it starts, and the fit on every row would
  carry the held-out rows' pull into it). On the fast path a held-out fit is one solve of
  the rows' models, whose simulations (start, probes, rounds) surround its minimum; its
  group's rows are then simulated at its answer, but those whose model covers it, checked by
  simulating the farthest of them (``fit_and_hold_out``). Where the fit on every row ended off
  its model's minimum (a round simulated worse than its start: a kink the model does not see),
  such a solve would land near that minimum whichever group it left out; each held-out fit is
  then the fit's answer moved by what leaving the group out moves the model's minimum (the
  H100's fit of 2026-12-07 ended so: its held-out fits had sat at fraction 0.91-0.97 and
  spread 0.018-0.037 around a model minimum of about 0.94 and 0.028, against its answer's
  0.958 and 0.038). A fit needs fewer parameters than groups, so
  each held-out fit still has at least as many groups as parameters.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, replace

import numpy as np

from sim.errors import InputError
from sim.inputs.frameworks import KERNEL_OVERHEAD_MAX_S, OVERHEAD_FRAMEWORKS
from sim.inputs.hardware import HardwareProfile

from sim.calibrate.fit_sims import (COLLECTIVE_MODEL, FIDELITY, FRAMEWORK_OVERHEAD, Simulations, Store,  # noqa: F401 (re-exported)
                                    prepare_rows, with_values, worker_pool)
from sim.calibrate.fit_surrogate import HELD_OUT_CHECK, LOSSES, Surrogate, fit_rounds, scipy_loss

DIFF_STEP = 1e-3
"""Finite-difference step, as a fraction of each parameter's range."""
TOLERANCE = 1e-4
"""``xtol`` of the least-squares fit (relative change of the scaled parameters), where it
stops; its ``ftol`` (relative change of cost) is TOLERANCE², out of the way: on a few rows
with residuals of a few percent the cost is flat along one direction, and stopping on its
step left a held-out fit 15 TOLERANCEs from its minimum (tests/test_fit_runs.py, group c
held out: attention_max_efficiency 0.5650 against 0.5659)."""
START_TOLERANCE = DIFF_STEP
"""A first step of the fast path's model smaller than this fraction of every parameter's range
is not simulated: the fit ends at its start (``sim.calibrate.fit_surrogate.fit_rounds``; a
refit from a profile already fitted to the rows). It is the finite differences' own step, the
distance over which the plain path takes a row's time for linear; the answer is then within
it of the model's minimum. On the fraction (range 0.4, at least 0.6) that moves a row's time
by at most 0.4e-3 / 0.6 = 6.7e-4 relative (compute time goes as 1/fraction, the rest does
not move), a fitted error by under 1e-3 absolute, where the round would simulate every row
(module doc of ``sim.calibrate.fit_surrogate``: on the H100 rows 157 simulations against 80)."""
GRADIENT_TOLERANCE = 1e-8
"""``gtol`` (scipy's default; the gradient is absolute: a looser one stops small residuals short)."""
MAX_EVALUATIONS = 30
"""Most residual evaluations of one fit (each simulates every row it has not simulated at that point)."""


@dataclass(frozen=True)
class Parameter:
    """A profile field the fit may set (a dotted path into ``HardwareProfile``) and its bounds."""

    path: str
    low: float
    high: float
    why: str
    default: bool = False
    """In the default set (``DEFAULT_PARAMETERS``, table order is the priority)."""
    unset: float | None = None
    """Where the fit starts when the profile leaves the field unset (None: the middle of the bounds)."""


PARAMETERS = (
    Parameter("sustained_compute_fraction", 0.60, 1.0, "fraction of the microbenchmark GEMM and attention throughput "
              "sustained through training steps: the SM clock under a whole model's power draw settles below the "
              "boost clock of a short benchmark (NVIDIA specifications: A100 SXM base/boost 1095/1410 MHz = 0.78, "
              "H100 SXM 1590/1980 MHz = 0.80); above 1 a kernel would "
              "beat its own benchmark, below 0.6 the clock would sit under the base clock", True),
    Parameter("gemm_max_efficiency", 0.50, 0.95, "best large-GEMM fraction of the datasheet peak: cuBLAS reaches "
              "80-86% on A100/H100 (REFERENCE.md); nothing sustains 95%, and below 50% the peak or the model is "
              "wrong, not the GEMMs"),
    Parameter("fp8_gemm_max_efficiency", 0.50, 0.95, "best large FP8 GEMM fraction of the FP8 peak: cuBLASLt "
              "E4M3 GEMMs reach 72-82% on H100 (the preset's sources); only FP8 rows depend on it"),
    Parameter("attention_max_efficiency", 0.30, 0.90, "best flash-attention fraction of peak: FlashAttention-2 "
              "50-73% on A100, FlashAttention-3 up to 75% on H100; backward passes run lower", True),
    Parameter("memory_efficiency", 0.50, 0.95, "fraction of HBM peak streaming kernels reach: large copies reach "
              "~90%; short fused elementwise kernels less", True),
    Parameter("framework_kernel_efficiency", 0.30, 0.95, "fraction of HBM peak the framework's own elementwise "
              "kernels (torch.compile fusions, eager cross-entropy) reach: below hand-written kernels, above 30%"),
    Parameter("moe_memory_relative_efficiency", 0.20, 1.0, "rate of a mixture-of-experts block's memory-bound "
              "kernels (token permutation, chunk sorts, padding, the experts' casts and activation) over the other "
              "memory-bound kernels': 1 streams like them; 0.2 lets them take five times as long (no kernel benchmark of "
              "Megatron-Core's MoE block bounds it tighter: experiments/moe_residuals.py)", unset=1.0),
    Parameter("kernel_launch_s", 0.0, 20e-6, "fixed per-kernel cost: CUDA launch latency is 2-5 us, framework "
              "overhead per op adds a few more; 20 us would mean the CPU, not the GPU, sets the pace", True),
    Parameter("gpu_speed_spread", 0.0, 0.05, "GPU-to-GPU speed spread (sim.inputs.pacing): 8% mean, 22% most variation "
              "between GPUs of one SKU (Sinha et al., SC'22); at 5% the slowest of 2,048 would be 17% slow"),
    Parameter("links.ib.efficiency", 0.60, 1.0, "fraction of the InfiniBand line rate NCCL achieves: ~96% at large "
              "messages (REFERENCE.md); 60% allows congested fabrics"),
    Parameter("links.nvlink.efficiency", 0.60, 1.0, "fraction of the NVLink line rate NCCL achieves: 77% (A100) to "
              "82% (H100) all-reduce busbw of the per-direction rate"),
    *(Parameter(f"{FRAMEWORK_OVERHEAD}.{name}", 0.0, KERNEL_OVERHEAD_MAX_S,
                f"seconds each {name} kernel costs over Megatron-Core's (sim.inputs.frameworks): its eager "
                "op-to-launch path and FSDP's module hooks between kernels; 0 with the host always ahead of the GPU, "
                f"{KERNEL_OVERHEAD_MAX_S * 1e6:g} us the whole 5-25 us eager path exposed at every kernel; only "
                f"{name} rows see it", unset=0.0) for name in OVERHEAD_FRAMEWORKS),
)
"""Every parameter the fit may set: name (dotted path), bounds and why those bounds.
Adding one is one line here."""
DEFAULT_PARAMETERS = tuple(p.path for p in PARAMETERS if p.default)


def parameter(path: str) -> Parameter:
    for p in PARAMETERS:
        if p.path == path:
            return p
    raise InputError(f"--params: got {path!r}; allowed: {', '.join(p.path for p in PARAMETERS)}")


def choose_parameters(names: list[str] | None, groups: int) -> tuple[tuple[Parameter, ...], str]:
    """The parameters to fit to ``groups`` groups, and how they were chosen. Without
    ``names``: the default set, cut to its first ``groups − 1`` (table order)."""
    if groups < 2:
        raise InputError(f"{groups} group(s) to fit; leave-one-group-out needs at least 2 (rows of one "
                         "model from one source form a group)")
    if names is None:
        chosen = DEFAULT_PARAMETERS[:groups - 1]
        how = ("the default set" if len(chosen) == len(DEFAULT_PARAMETERS) else
               f"the first {len(chosen)} of the default set ({', '.join(DEFAULT_PARAMETERS)}): a fit needs fewer "
               f"parameters than the {groups} groups")
        return tuple(parameter(n) for n in chosen), how
    if not names or len(set(names)) != len(names):
        raise InputError(f"--params: got {','.join(names)!r}; expected distinct names separated by commas")
    params = tuple(parameter(n) for n in names)
    if len(params) >= groups:
        raise InputError(f"--params: got {len(params)} parameters ({', '.join(names)}); the rows form {groups} "
                         f"groups and a fit needs fewer parameters than groups (so that each held-out fit keeps "
                         f"at least as many groups as parameters): give at most {groups - 1}")
    return params, "--params"


# ---------------------------------------------------------------- profile paths
def get_value(profile: HardwareProfile, path: str) -> float | None:
    """The field at ``path`` (None where the profile leaves it unset)."""
    obj = profile
    for part in path.split("."):
        if obj is None:  # an unset mapping (framework_kernel_overhead_s)
            return None
        try:
            obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
        except (KeyError, AttributeError):
            raise InputError(f"--params: {path}: profile {profile.name} has no such field") from None
    return None if obj is None else float(obj)


def ceiling(profile: HardwareProfile, p: Parameter) -> float | None:
    """The most ``p`` may be on ``profile``: what the profile's own measurements say a kernel
    of that kind achieves alone (``HardwareProfile.efficiency_ceilings``, its source in the
    profile's ``sources``), where that is below the parameter's physical bound; None where the
    profile gives none. A training step's kernels run no faster than the best one measured
    alone, so a fit above it would be making up for something the model leaves out."""
    c = (profile.efficiency_ceilings or {}).get(p.path)
    return c if c is not None and c < p.high else None


def bounded(profile: HardwareProfile, params) -> tuple:
    """``params`` with each upper bound lowered to the profile's ceiling for it (``ceiling``)."""
    return tuple(p if (c := ceiling(profile, p)) is None else replace(p, high=max(c, p.low)) for p in params)


def start_value(profile: HardwareProfile, p: Parameter) -> float:
    """Where the fit starts: the profile's value, clipped into the bounds (unset: the middle)."""
    v = get_value(profile, p.path)
    if v is None:
        v = (p.low + p.high) / 2 if p.unset is None else p.unset
    return min(max(v, p.low), p.high)


@dataclass(frozen=True)
class Fit:
    values: tuple
    evaluations: int
    status: str


def fit(sims: Simulations, rows: list[int], measured, weights, start, free=None, loss: str = "squares") -> Fit:
    """The parameter values (physical units) that minimise the weighted relative residuals
    of ``rows`` (their ``loss``: ``LOSSES``), from ``start``; ``free`` (one bool per parameter, default all) says which
    may move: the others stay at their ``start`` values (a parameter none of the rows reads
    has no say in their residuals, and a bounded trust-region step would still move it)."""
    from scipy.optimize import least_squares

    free = list(free) if free is not None else [True] * len(sims.params)
    on = [j for j, f in enumerate(free) if f]
    low = np.array([p.low for p in sims.params])
    span = np.array([p.high - p.low for p in sims.params])
    u_start = np.clip((np.asarray(start, float) - low) / span, 0.0, 1.0)
    if not on:
        return Fit(tuple(float(v) for v in low + u_start * span), 0, "no parameter the rows read")

    def point(v):
        u = u_start.copy()
        u[on] = np.clip(v, 0.0, 1.0)
        return low + u * span

    def residuals(v):
        return np.array([(t / measured[i] - 1.0) * weights[i] for i, t in zip(rows, sims.times(rows, point(v)))])

    def jacobian(v):  # d residual / d u, by the chain rule through what each row sees (Simulations.slopes)
        slopes = sims.slopes(rows, point(v), DIFF_STEP * span)
        return np.array([[g[j] * span[j] * weights[i] / measured[i] for j in on] for i, g in zip(rows, slopes)])

    res = least_squares(residuals, u_start[on], jac=jacobian, bounds=(0.0, 1.0), method="trf", x_scale=1.0,
                        ftol=TOLERANCE ** 2, xtol=TOLERANCE, gtol=GRADIENT_TOLERANCE, max_nfev=MAX_EVALUATIONS,
                        **scipy_loss(loss))
    return Fit(tuple(float(v) for v in point(res.x)), int(res.nfev), res.message)


def group_weights(groups: list, loss: str = "squares") -> list[float]:
    """Each row's weight, so that every group weighs the same: 1/√(rows in the row's group)
    on a residual whose square is summed, 1/(rows in it) on one whose absolute value is."""
    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r}: expected one of {', '.join(LOSSES)}")
    if loss == "absolute":
        return [1.0 / groups.count(g) for g in groups]
    return [1.0 / math.sqrt(groups.count(g)) for g in groups]


def fit_and_hold_out(sims: Simulations, measured: list[float], groups: list, start, fast: bool = True,
                     loss: str = "squares") -> dict:
    """The fit on every row, and per group the fit without it and its rows' predictions;
    ``fast``: by the model of each row (``sim.calibrate.fit_surrogate``), else by finite
    differences of simulations at every step (``fit``); ``loss``: what each fit makes least
    of the weighted relative errors (``LOSSES``)."""
    rows = list(range(len(measured)))
    weights = group_weights(groups, loss)
    sur = Surrogate(sims) if fast else None
    free = sims.sensitive(rows, start)
    full = (Fit(*fit_rounds(sur, rows, measured, weights, start, free, TOLERANCE, START_TOLERANCE, loss)) if fast
            else fit(sims, rows, measured, weights, start, free=free, loss=loss))
    per_group, mine, models = {}, {}, {}
    sims.phase = "held-out fits"
    # Where the fit on every row ended off its model's minimum (a round simulated worse than the
    # point it stepped from: a kink the model does not see), a held-out solve of that model would
    # land near that minimum whichever group it leaves out. Each held-out fit then moves from the
    # fit's answer by what leaving its group out moves the model's minimum (``_held_out_values``).
    lows, highs = [p.low for p in sims.params], [p.high for p in sims.params]
    base = sur.solve(rows, measured, weights, full.values, free, loss=loss)[0] if fast else None
    span = [h - lo for lo, h in zip(lows, highs)]
    if base is not None and max(abs(b - v) / w for b, v, w in zip(base, full.values, span)) < TOLERANCE:
        base = None  # the fit ended at its model's minimum: the solves stand as they are
    for g in sorted(set(groups)):
        train = [i for i in rows if groups[i] != g]
        mine[g] = [i for i in rows if groups[i] == g]
        seen = sims.sensitive(train, start)
        warm = [v if s else s0 for v, s, s0 in zip(full.values, seen, start)]
        # the weights are recomputed as if the group had never been in the file (they do not change)
        if fast:  # one solve of the model, whose simulations surround the minimum: no simulation
            solved = sur.solve(train, measured, weights, warm, seen, loss=loss)[0]
            if base is None:
                per_group[g] = Fit(solved, 0, "the model's minimum")
            else:
                per_group[g] = Fit(_held_out_values(warm, solved, base, seen, lows, highs), 0,
                                   "the fit's answer moved as the model's minimum moves without the group")
            models[g] = sur.models(mine[g], warm)
        else:
            per_group[g] = fit(sims, train, measured, weights, warm, free=seen, loss=loss)
    sims.phase = "held-out rows"
    # on the fast path a row whose model covers its held-out point (Surrogate.covers) takes the
    # model's time, the one such row farthest from its simulations is simulated to check it, and
    # all of them are simulated if the model missed it by more than HELD_OUT_CHECK
    by_model = {(g, i): sur.predict(i, models[g][i], part.values) for g, part in per_group.items()
                for i in mine[g] if fast and sur.covers(i, models[g][i], part.values)}
    check = max(by_model, key=lambda k: (sur.distance(k[1], per_group[k[0]].values), -rows.index(k[1])),
                default=None)
    by_model.pop(check, None)  # (simulated: its time is the simulation's)
    sims.ensure([(i, sims.seen(i, per_group[g].values)) for g in per_group for i in mine[g]
                 if (g, i) not in by_model])  # all at once
    checked = None
    if check is not None:
        t = sims.times([check[1]], per_group[check[0]].values)[0]
        checked = {"row": check[1], "model_s": sur.predict(check[1], models[check[0]][check[1]],
                                                           per_group[check[0]].values), "simulated_s": t}
        if abs(checked["model_s"] / t - 1.0) > HELD_OUT_CHECK:
            by_model = {}
            sims.ensure([(i, sims.seen(i, per_group[g].values)) for g in per_group for i in mine[g]])
    held_out, model_error = [None] * len(rows), []
    for g, part in per_group.items():
        simulated = [i for i in mine[g] if (g, i) not in by_model]
        if fast:
            model_error += sur.check(simulated, models[g], part.values)
        for i in mine[g]:
            held_out[i] = by_model[(g, i)] if (g, i) in by_model else sims.times([i], part.values)[0]
    return {"full": full, "per_group": per_group, "initial": sims.times(rows, start),
            "fitted": sims.times(rows, full.values), "held_out": held_out,
            "held_out_by": ["model" if any((g, i) in by_model for g in per_group) else "simulation" for i in rows],
            "held_out_check": checked,
            "model_error": max(map(abs, model_error)) if fast and model_error else None}


def _held_out_values(warm, solved, base, seen, lows, highs) -> tuple:
    """A held-out fit where the fit on every row ended off its model's minimum ``base``: the
    fit's answer (``warm``) moved by the model's minimum without the group (``solved``) less
    ``base``, within each parameter's bounds; a parameter the held-out rows do not see stays at
    ``warm``."""
    return tuple(min(max(w + (x - b), lo), hi) if s else w
                 for w, x, b, s, lo, hi in zip(warm, solved, base, seen, lows, highs))


AT_BOUND = 1e-3
"""How close to a bound (as a fraction of the range) a fitted value counts as ending there."""


def at_bound(value: float, low: float, high: float) -> str | None:
    """``"low"`` or ``"high"`` when a fitted value ended at that bound (within ``AT_BOUND`` of
    the range): the data pull it further, so the bound, not the runs, set it and the other
    parameters made up the rest; None inside."""
    span = (high - low) * AT_BOUND
    return "low" if value <= low + span else "high" if value >= high - span else None


def bound_warning(p: dict) -> str:
    """One line saying that a fitted parameter (a report's ``parameters`` entry) ended at a bound."""
    side = "upper" if p["at_bound"] == "high" else "lower"
    if p.get("at_ceiling"):
        return (f"{p['name']} ended at its ceiling ({p['initial']:.4g} -> {p['fitted']:.4g}, the most the profile's "
                f"efficiency_ceilings allows: {p['ceiling']:g}, the best such kernel measured alone): the runs pull it "
                f"further, so the ceiling set it and the other parameters absorbed the rest; what the model leaves "
                f"out of those runs is not this kernel's speed")
    return (f"{p['name']} ended at its {side} bound ({p['initial']:.4g} -> {p['fitted']:.4g}, bounds "
            f"[{p['low']:g}, {p['high']:g}]): the runs pull it further, so the bound set it and the other "
            f"parameters absorbed the rest; check those runs' settings, or fit without it (--params)")


def mean_abs(errors) -> float:
    return float(np.mean(np.abs(errors))) if len(errors) else 0.0


SAME_JOB_SHOWN = 0.02
"""Jobs whose rows the fitted model gets wrong by amounts further apart than this (relative)
are printed (``same_job``); the report lists them all."""


def scale_floor(ratios) -> tuple[float, float]:
    """The least Σ|s·a − 1| over one scale s of every ratio a in ``ratios`` (the model's
    time over the measured one, rows of one job), and that s. The sum is convex and
    piecewise linear in s with its kinks at s = 1/a, so the least is at one of them:
    whatever moves the job's time as a whole leaves at least this error on its rows."""
    a = [float(x) for x in ratios]
    if not a or min(a) <= 0:
        raise ValueError(f"ratios: got {ratios!r}; expected positive numbers")
    best = min((sum(abs(x / k - 1.0) for x in a), 1.0 / k) for k in a)
    return best[0], best[1]


def same_job(runs, measured, fitted) -> list[dict]:
    """Rows of one job (the same model and sequence, precision, GPU count, global batch and
    framework: ``_describe`` and those) among ``runs``, with the fitted model's time over
    the measured one per row, how far apart those ratios are, and ``scale_floor``'s least
    error: what no fitted parameter that scales the job's time as a whole can remove (a
    setting the rows differ in that the model leaves out, or data that disagree). Largest
    floor first; jobs of one row are not listed."""
    by: dict = {}
    for i, r in enumerate(runs):
        key = (_describe(r), r.values.get("gpus"), r.values.get("global_batch_size"), r.framework)
        by.setdefault(key, []).append(i)
    out = []
    for (what, gpus, batch, framework), rows in by.items():
        if len(rows) < 2:
            continue
        ratios = [fitted[i] / measured[i] for i in rows]
        floor, _ = scale_floor(ratios)
        out.append({"rows": rows, "job": f"{what}, {gpus} GPUs, global batch {batch}, {framework}",
                    "spread": max(ratios) / min(ratios) - 1.0, "floor_abs_error_sum": floor})
    return sorted(out, key=lambda j: (-j["floor_abs_error_sum"], j["rows"][0]))


# ---------------------------------------------------------------- the whole job
def _describe(run) -> str:
    v = run.values
    if "num_layers" not in v:  # a preset's shape
        seq = f", seq {v['seq_length']}" if "seq_length" in v else ""
        return f"{v['model']}{seq}, {run.precision}"
    activation = run.group[2][-1] if run.group[2] else ("swiglu" if v.get("swiglu") else "gelu")
    return f"{v['num_layers']} layers, hidden {v['hidden_size']}, {activation}, seq {v['seq_length']}, {run.precision}"


def fit_runs(path, gpu: str, names: list[str] | None = None, jobs: int = 1, cache=None, fast: bool = True,
             loss: str = "squares") -> dict:
    """Read ``path`` (a runs file, or a list of them read as one: each row keeps its
    file), fit the profile ``gpu`` (a preset or a profile .json) to its rows of
    that GPU, hold out each group in turn, and return the report (see ``sim.commands.fit``
    for its keys); ``jobs``: worker processes simulating rows at once; ``cache``: a file
    of simulated times kept across runs (``sim.calibrate.fit_sims.Store``), or None;
    ``fast``: fit each row's model (``sim.calibrate.fit_surrogate``) rather than finite
    differences of simulations at every step (``fit``; the same answers, slower); ``loss``: what
    the fits make least of the rows' weighted relative errors (``LOSSES``)."""
    import hashlib
    from pathlib import Path

    from sim.calibrate.runs_csv import BY_SOURCE, BLANKS, FP8_BY_SOURCE, FP8_ROWS, read_runs
    from sim.fileio import read_bytes
    from sim.inputs.hardware import load_profile

    started = time.monotonic()
    profile = load_profile(gpu, flag="--gpu")
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    path = ", ".join(map(str, paths))  # what the report and the errors name
    runs = [r for p in paths for r in read_runs(p)]
    sha = hashlib.sha256(b"".join(read_bytes(p, "RUNS.csv") for p in paths)).hexdigest()

    def at(r) -> dict:  # where a row is: its line, and its file when there are several
        return {"line": r.line, "file": r.file} if len(paths) > 1 else {"line": r.line}

    mine = [r for r in runs if r.gpu in (None, profile.name)]
    left_out = [{**at(r), "gpu": r.gpu} for r in runs if r.gpu not in (None, profile.name)]
    skips = [r.skip or unsupported(r, profile) for r in mine]
    skipped = [{**at(r), "reason": why} for r, why in zip(mine, skips) if why]
    used = [r for r, why in zip(mine, skips) if not why]
    if not used:
        raise InputError(f"{path}: no rows to fit for GPU {profile.name}: {len(left_out)} row(s) of other GPUs, "
                         f"{len(skipped)} skipped; the gpu column must name the profile ({profile.name})")
    order = list(dict.fromkeys(r.group for r in used))
    ids = {g: f"g{k + 1}" for k, g in enumerate(order)}
    try:
        params, how = choose_parameters(names, len(order))
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from None
    physical = params
    params = bounded(profile, params)  # each efficiency at most the profile's measured best (ceiling)
    start = [start_value(profile, p) for p in params]
    prepared = prepare_rows(used, gpu, str(path))
    measured = [r.measured_s for r in used]
    groups = [ids[r.group] for r in used]
    with worker_pool(jobs, gpu, params, used, str(path)) if jobs > 1 else contextlib.nullcontext() as pool:
        store = Store(cache, profile, params, used) if cache is not None else None
        sims = Simulations(profile, params, prepared, pool, store)
        res = fit_and_hold_out(sims, measured, groups, start, fast, loss)

    def errors(key):
        return [t / m - 1.0 for t, m in zip(res[key], measured)]

    init_e, fit_e, loo_e = errors("initial"), errors("fitted"), errors("held_out")
    rows = [{**at(r), "group": groups[i], "gpus": r.values["gpus"], "measured_s": measured[i],
             "initial_s": res["initial"][i], "fitted_s": res["fitted"][i], "held_out_s": res["held_out"][i],
             "initial_error": init_e[i], "fitted_error": fit_e[i], "held_out_error": loo_e[i],
             "held_out_by": res["held_out_by"][i],
             "blank_cells": list(r.filled)} for i, r in enumerate(used)]
    group_rows = [{"id": ids[g], "source": g[0],
                   "precision": ", ".join(sorted({r.precision for r in used if r.group == g})),
                   "framework": next(r.framework for r in used if r.group == g),
                   "model": _describe(next(r for r in used if r.group == g)),
                   "lines": [r.line if len(paths) == 1 else f"{r.file}:{r.line}" for r in used if r.group == g],
                   "held_out_fit": dict(zip((p.path for p in params), res["per_group"][ids[g]].values)),
                   "loo_mean_abs_error": mean_abs([loo_e[i] for i in range(len(used)) if groups[i] == ids[g]])}
                  for g in order]
    summary = {"row_count": len(used), "group_count": len(order), "initial_mean_abs_error": mean_abs(init_e),
               "mean_abs_error": mean_abs(fit_e), "max_abs_error": float(max(abs(e) for e in fit_e)),
               "loo_mean_abs_error": mean_abs(loo_e), "loo_max_abs_error": float(max(abs(e) for e in loo_e))}
    filled = sorted({c for r in used for c in r.filled})
    jobs = [{"lines": [rows[i]["line"] if len(paths) == 1 else f"{rows[i]['file']}:{rows[i]['line']}"
                       for i in j.pop("rows")], **j} for j in same_job(used, measured, res["fitted"])]
    return {
        "gpu": profile.name, "profile": str(gpu), "data": str(path), "data_sha256": sha,
        "fidelity": FIDELITY, "collective_model": COLLECTIVE_MODEL, "parameters_chosen": how,
        "parameters": [{"name": p.path, "low": p.low, "high": p.high, "initial": s, "fitted": v, "why": p.why,
                        "at_bound": at_bound(v, p.low, p.high),
                        **({"ceiling": p.high, "physical_high": q.high,
                            "ceiling_source": profile.sources.get("efficiency_ceilings", "the profile's efficiency_ceilings"),
                            "at_ceiling": at_bound(v, p.low, p.high) == "high",
                            "profile_value": get_value(profile, p.path)}
                           if p.high < q.high else {})}
                       for p, q, s, v in zip(params, physical, start, res["full"].values)],
        "evaluations": res["full"].evaluations, "fit_status": res["full"].status,
        "method": "model" if fast else "differences", "loss": loss,
        "model_max_error": res["model_error"],
        "held_out_check": None if res["held_out_check"] is None else
        {**at(used[res["held_out_check"]["row"]]), **{k: v for k, v in res["held_out_check"].items() if k != "row"}},
        "groups": group_rows, "rows": rows, "skipped": skipped,
        "same_job": jobs, "same_job_floor": sum(j["floor_abs_error_sum"] for j in jobs) / len(used),
        "left_out": left_out, "blank_cells": {c: {"value": _shown(BLANKS[c][0]), "why": BLANKS[c][1]} for c in filled},
        "by_source": {text: {"settings": {k: _shown(v) for k, v in settings.items()}, "why": why}
                      for text, settings, why in BY_SOURCE + tuple((t + FP8_ROWS, s, w) for t, s, w in FP8_BY_SOURCE)
                      if any(text in r.by_source for r in used)},
        **summary, "by_gpu": {profile.name: summary},
        "simulations": sims.count, "simulations_by_phase": dict(sims.by_phase), "reused": sims.reused,
        "wall_s": time.monotonic() - started,
    }


def unsupported(run, profile: HardwareProfile) -> str | None:
    """Why a row cannot run on ``profile`` (an FP8 row on a GPU without an FP8 peak), or None."""
    if run.precision == "fp8" and "fp8" not in profile.peak_flops:
        return f"precision fp8: GPU {profile.name} has no fp8 peak"
    return None


def _shown(value):
    return "depends on the row" if callable(value) else value


def fitted_profile(profile: HardwareProfile, report: dict, date: str) -> HardwareProfile:
    """``profile`` with the fitted values, its ``sources`` naming the fit (data file, its
    sha256, the parameters, the held-out error, the date) and ``provenance["fit"]`` the same as data."""
    from pathlib import Path

    params = [parameter(p["name"]) for p in report["parameters"]]
    out = with_values(profile, params, [p["fitted"] for p in report["parameters"]])
    names = ", ".join(p.path for p in params)
    sources = dict(profile.sources)
    for p in report["parameters"]:
        sources[p["name"]] = (
            f"trainsim fit {date}: fitted to {', '.join(Path(p).name for p in report['data'].split(', '))} "
            f"(sha256 {report['data_sha256']}), "
            f"{report['row_count']} {report['gpu']} rows in {report['group_count']} groups, parameters {names}"
            f"{', least absolute errors' if report.get('loss') == 'absolute' else ''}: "
            f"{p['fitted']:.6g} within [{p['low']:g}, {p['high']:g}] (was {p['initial']:.6g}); mean |error| "
            f"{report['mean_abs_error']:.1%} fitted, {report['loo_mean_abs_error']:.1%} leave-one-group-out")
    fit_info = {"command": "trainsim fit", "date": date, "data": report["data"], "data_sha256": report["data_sha256"],
                "base_profile": report["profile"], "parameters": {p["name"]: p["fitted"] for p in report["parameters"]},
                "initial": {p["name"]: p["initial"] for p in report["parameters"]}, "rows": report["row_count"],
                "groups": report["group_count"], "mean_abs_error": report["mean_abs_error"],
                "loo_mean_abs_error": report["loo_mean_abs_error"], "fidelity": report["fidelity"],
                "loss": report.get("loss", "squares")}
    return replace(out, sources=sources, provenance={**profile.provenance, "fit": fit_info})
