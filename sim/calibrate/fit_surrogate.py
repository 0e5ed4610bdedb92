"""The fast path of ``trainsim fit``: least squares on a model of each row, checked by simulating.

A row's simulated iteration time depends on the fitted parameters only through what its
simulation sees (``Simulations.seen``: on the H100 rows, the compute fraction times the
slowest GPU's speed, and the FP8 cap on FP8 rows), and smoothly: the compute on the
step's critical path takes 1/efficiency of its work, the rest (exposed communication,
launches) does not move. So near the points where a row was simulated its time is,
to well under the fit's tolerance,

    t(z) = t(z0) + Σ_k b_k · (g_k(z) − g_k(z0)),

z0 the row's simulated point nearest to where the fit is, and g_k composed as the
simulator composes the rates: a GEMM or attention kernel runs at peak × its efficiency
cap × the compute fraction f (``HardwareProfile.gemm_efficiency``,
``attention_efficiency``), so for such a cap e (``COMPUTE_EFFICIENCIES``) g = 1/(f·e), its
kernels' time, exactly; for the fraction itself and any other efficiency (time goes as its
reciprocal) g = 1/z, and z itself otherwise (a launch cost, a spread); the b_k fitted by
linear least squares to the row's other simulated points. (A sum of 1/f and 1/e apart is
exact in neither's slope once the other moves: its slopes, which a fit's residuals of a few
percent multiply, were off by the cross term.)

A row whose time has a kink among those points (a critical-path switch: an overlapped
collective becoming exposed as the compute speeds up, ``max`` of two such sums) fits
none of them exactly; the model of such a row (``kinked``) is then its one-sided
differences at the anchor, probed there at ``KINK_STEP`` (the finite differences' own
step): the piece the anchor is on, as the plain path sees it. (A row shows a kink once it
has more points near its anchor than directions: from the first round on.) But a row's time
also bends without any one such switch: each time the order of two events on its critical
path changes as the compute speeds up, the slope changes a little, and over a few percent of
a range those many small changes add up to a curve. (The H100 refit of 2026-12-06 from its
preset, moved by FSDP's copies: 20 of its 32 rows missed a straight line through their start,
probe and round by 2.3e-8 to 4.5e-6 of their time, their parabolas bending by 3.4e-8 to 6.6e-6.
Simulated at ten fractions from 0.8527 to 0.8632, the row of published_runs.csv line 18 (128
GPUs) has a slope in 1/f that drifts 3.4308, 3.4302, 3.4296, ... 3.4281, then 3.4283 s: no
one switch but many small ones, and the parabola through three of the points is within 4.7e-7
of the other seven. A kink that matters moves a row by a collective's exposed time.) So a row whose points lie on no
straight piece but on one parabola in each direction's basis (within ``SMOOTH``; its curvature
along a direction only where the points beyond the slopes' tell it) that bends off its chord
by at most ``CURVED`` of its time over their span is ``curved``: its model adds
Σ_k c_k · (g_k(z) − g_k(z0))², exact at the anchor with the slopes there, not the chord's,
and costs no differences; it covers a held-out point between its points as a straight row's does.
Each row is first simulated at the start and once more along each direction it sees, a
step of ``PROBE_STEP`` of the parameter's range towards its middle: far enough that the
held-out fits, which move the fraction by about 1%, interpolate between simulations.

The fit on every row (``fit_rounds``) minimises the weighted residuals of that model
(``scipy.optimize.least_squares``; it costs no simulation), simulates every row at the
answer, and again, until a round moves the scaled parameters by less than
``TOLERANCE``: the answer returned is the last simulated point, whose residuals (and
the report's fitted errors) are real simulations, and at which the model, exact there,
has no step left to take. A fit whose first step would move no scaled parameter by
``START_TOLERANCE`` (``sim.calibrate.fit_runs``: the finite differences' own step) ends
at the start without a round: a refit from a profile already fitted to these rows after a
small change to the simulator. (The H100 refit of 2026-12-06 from the preset, whose rows a
cost change had moved by 0.1-0.5 points, asked for a step of 2.2e-4 of the fraction's
range; its round simulated every row 8.8e-5 from the start, and those three points per
row, so close together, were not one straight piece within ``SMOOTH``; modelled as kinked,
the held-out fits took 26 differences and simulated 29 held-out rows instead of 10: 157
simulations against 80. Such rows are curved now.) Later rounds go on to ``TOLERANCE``: the fit is then converging from afar,
and stopping such a step at ``START_TOLERANCE`` left the test fits of
tests/test_fit_runs.py 4.4e-4 of a range from finite differences' minimum. A round whose simulations fit worse (weighted squared
residuals) than the point it stepped from crossed a kink that point's model did not see:
the fit tries half that step, and goes on from there if it fits better, else ends at the
point (its status says so). The B200 fit of 2026-12-06 went on from such rounds instead,
from one piece to the other (squared residuals 1.48e-2, 1.51e-2, 1.48e-2, 2.66e-2, ...)
for eight rounds, 124 simulations, and returned a point whose squared residuals were 12%
above its first round's; halving again and again there only crept back to that first
round's point, a round each time (its kink at the point itself, its differences taken on
the other side of it). A fit that ends over 1% of a range
from its start probes every row there, a ``KINK_STEP`` along each direction: where a
kinked row's differences are (so they cost nothing more), and a point near the answer
for a curved or kinked row's model; a row whose points, more of them than its directions, all
lie on one straight piece (``Surrogate.smooth``) needs none. Each round costs one simulation per row instead of one per
row and seen direction, and the fit takes two to four rounds where finite differences
took seven evaluations. The held-out fits start from that answer, whose simulations,
with the probes, already surround their minima: each is one solve of the model, with no
simulation but a kinked row's differences at its anchor. Its group's rows are then simulated
at its answer, but for those whose model covers it (``Surrogate.covers``: a row not kinked,
straight or curved, the point within the simulations its model goes through, or a ``KINK_STEP`` beyond them),
which take the model's time: of those the one farthest from its simulations is simulated, and
if the model missed it by more than ``HELD_OUT_CHECK`` all are. How far
the model's prediction was from the simulated ones (``Surrogate.check``) is in the report, a
measure of the model where nothing else checks it.
"""

from __future__ import annotations

import numpy as np

PROBE_STEP = 0.02
"""A row's probe along a direction it sees: this fraction of the parameter's range."""
LOCAL = 3
"""A row's model is fitted to its points within this many probe steps of its anchor
(every direction), where they span what it sees (else to all its points)."""
ROUNDS = 8
"""Most rounds (each simulates every row once) of the fit on every row."""
SMOOTH = 1e-9
"""A row's model that misses one of the points it was fitted to by more than this (relative)
is not one smooth piece there (module doc: a kink, or a curve, ``CURVED``)."""
HELD_OUT_CHECK = 1e-5
"""How far (relative) the model of the held-out row it checks may be from that row's simulation
(``sim.calibrate.fit_runs.fit_and_hold_out``) for the other rows its model covers to keep the
model's times: a held-out error (a few percent) moves by under 0.001 of a percentage point."""
CURVED = HELD_OUT_CHECK
"""A row whose points lie on no straight piece (``SMOOTH``) but on one curved in the model's
basis (a parabola in each direction's g, within ``SMOOTH``) that departs from its chord by at
most this fraction of the row's time over the points' span is curved, not kinked (module doc):
its model keeps that curvature. It is the held-out check's own tolerance: a bend the check
would let pass between a model and a simulation is no kink worth simulating differences for."""
KINK_STEP = 1e-3
"""A kinked row's probes at its anchor: this fraction of each parameter's range (the finite
differences' own step, ``sim.calibrate.fit_runs.DIFF_STEP``)."""


COMPUTE_EFFICIENCIES = ("gemm_max_efficiency", "fp8_gemm_max_efficiency", "attention_max_efficiency")
"""The efficiency caps the compute fraction multiplies (``HardwareProfile.gemm_efficiency``:
``best * sustained_compute_fraction * ...``; ``attention_efficiency`` the same): a kernel
capped by one of them takes time ∝ 1/(fraction × cap)."""
FRACTION = "sustained_compute_fraction"

LOSSES = ("squares", "absolute")
"""What a fit makes least of its rows' weighted relative errors (``trainsim fit --loss``): the sum of
their squares (the default), or of their absolute values, the mean |error| the report gives. Least
squares lets the rows the model misses most set the answer: on the B200's rows, where two
measurements of one job lie 31% apart (``sim.calibrate.fit_runs.same_job``), squares weigh a
22% miss 25 times a 4.4% one, and absolute values 5 times."""
ABSOLUTE_SCALE = 0.005
"""The ``absolute`` loss is scipy's ``soft_l1`` at this scale (relative error): 2s²(√(1 + (r/s)²) − 1),
r² for |r| ≪ s and 2s|r| − 2s² beyond, so smooth at zero for the trust-region steps, and
within 0.5% of a relative error of the absolute value everywhere that matters: every row the
fits here miss by more than 0.5% is on its straight part."""


def loss_total(residuals, loss: str) -> float:
    """The loss ``loss`` (``LOSSES``) of weighted residuals ``residuals``, as scipy's
    ``least_squares`` makes it least (up to its constant factor ½)."""
    r = np.asarray(residuals, float)
    if loss == "squares":
        return float(np.sum(r ** 2))
    s = ABSOLUTE_SCALE
    return float(np.sum(2.0 * s * s * (np.sqrt(1.0 + (r / s) ** 2) - 1.0)))


def scipy_loss(loss: str) -> dict:
    """``least_squares``' keyword arguments for ``loss``."""
    if loss not in LOSSES:
        raise ValueError(f"loss {loss!r}: expected one of {', '.join(LOSSES)}")
    return {"loss": "linear"} if loss == "squares" else {"loss": "soft_l1", "f_scale": ABSOLUTE_SCALE}


def _reciprocal(param) -> bool:
    """Time goes as the reciprocal of an efficiency or a fraction (compute or bytes at that rate)."""
    return param.path.endswith(("efficiency", "fraction"))


class Surrogate:
    """Per row, the model of the module doc, fitted to the row's simulations in ``sims``
    (a ``Simulations``): every time it holds for the row is a point of the model."""

    def __init__(self, sims):
        self.sims = sims
        self.params = sims.params
        self.recip = [_reciprocal(p) for p in self.params]
        names = [p.path for p in self.params]
        f = names.index(FRACTION) if FRACTION in names else None
        self.times_fraction = [f is not None and n in COMPUTE_EFFICIENCIES for n in names]
        """Per parameter, whether its basis is 1/(fraction × it) (``COMPUTE_EFFICIENCIES``)."""
        self.fraction = f
        self.kinked: set = set()
        """Rows whose points lie on no one smooth piece (``_shape``): modelled by differences at the anchor."""
        self.curved: set = set()
        """Rows whose points lie on a curved piece, not a straight one (``_shape``; reported, not used)."""
        self._fitted: dict = {}
        """(row, anchor) -> the seen points (anchor first) its smooth model was fitted to (``covers``)."""

    def g(self, z) -> np.ndarray:
        """The model's basis at the seen values ``z`` (module doc)."""
        z = np.asarray(z, float)
        out = np.where(self.recip, 1.0 / np.where(self.recip, z, 1.0), z)
        if self.fraction is not None:
            out = np.where(self.times_fraction, out / z[self.fraction], out)
        return out

    def moved(self, row: int, values) -> list[int]:
        """The seen directions of ``row`` that move with some parameter."""
        base = self.sims.seen(row, values)
        out = set()
        for j, p in enumerate(self.params):
            y = [float(v) for v in values]
            y[j] += (p.high - p.low) / 2 if y[j] < (p.low + p.high) / 2 else -(p.high - p.low) / 2
            out |= {k for k, (a, b) in enumerate(zip(self.sims.seen(row, y), base)) if a != b}
        return sorted(out)

    def probes(self, rows, values, fraction: float = PROBE_STEP) -> list:
        """The (row, seen) simulations at ``values`` and along each direction each row sees,
        ``fraction`` of the parameter's range towards its middle."""
        jobs = []
        for i in rows:
            z = self.sims.seen(i, values)
            jobs.append((i, z))
            for k in self.moved(i, values):
                p = self.params[k]
                step = fraction * (p.high - p.low)
                zk = list(z)
                zk[k] += step if z[k] < (p.low + p.high) / 2 else -step
                jobs.append((i, tuple(zk)))
        return jobs

    def _points(self, row: int):
        return [(np.array(z), t) for (r, z), t in self.sims.cache.items() if r == row and len(z) == len(self.params)]

    def _anchor(self, row: int, values):
        """``row``'s simulated points, the index of the one nearest ``values`` (in each
        parameter's range: the anchor) and the seen directions that move."""
        moved = self.moved(row, values)
        z = np.array(self.sims.seen(row, values))
        pts = self._points(row)
        span = np.array([p.high - p.low for p in self.params])
        k0 = min(range(len(pts)), key=lambda n: (float(np.sum(((pts[n][0] - z) / span) ** 2)), n))
        return pts, k0, moved

    def _shape(self, pts, k0: int, chosen: list, moved: list):
        """The slopes b and curvatures c (module doc) that ``pts[chosen]`` give about the anchor
        ``pts[k0]``: (b, c, "straight") where a straight piece goes through them within
        ``SMOOTH``; (b, c, "curved") where one with curvature along some directions does and
        bends off straight by at most ``CURVED`` of the anchor's time over their span (c zero
        along the directions its points cannot tell a curvature on); else (None, None, "kinked")."""
        z0, t0 = pts[k0]
        g0 = self.g(z0)
        m = len(moved)
        a = np.array([(self.g(pts[n][0]) - g0)[moved] for n in chosen]).reshape(len(chosen), m)
        y = np.array([pts[n][1] - t0 for n in chosen])
        b = np.linalg.lstsq(a, y, rcond=None)[0]
        if float(np.max(np.abs(a @ b - y), initial=0.0)) <= SMOOTH * abs(t0):
            return b, np.zeros(m), "straight"
        cols = []  # a curvature along each direction whose points, beyond the slopes' own, tell it
        for k in range(m):
            trial = np.hstack([a, a[:, cols + [k]] ** 2])
            if trial.shape[1] <= len(chosen) and np.linalg.matrix_rank(trial) == trial.shape[1]:
                cols.append(k)
        if not cols:
            return None, None, "kinked"
        full = np.hstack([a, a[:, cols] ** 2])
        coef = np.linalg.lstsq(full, y, rcond=None)[0]
        c = np.zeros(m)
        c[cols] = coef[m:]
        spread = np.ptp(np.vstack([a, np.zeros(m)]), axis=0)  # each direction's span of the points, anchor included
        bend = float(np.sum(np.abs(c) * spread ** 2)) / 4  # the most a parabola departs from its chord over its span
        if float(np.max(np.abs(full @ coef - y))) <= SMOOTH * abs(t0) and bend <= CURVED * abs(t0):
            return coef[:m], c, "curved"
        return None, None, "kinked"

    def model(self, row: int, values, pending: list | None = None):
        """(z0, t0, moved directions, their b, their c) of ``row`` anchored at its simulated
        point nearest ``values`` (in each parameter's range). With ``pending``, a kinked row's
        differences not simulated yet are added to it instead (and None returned): ``models``
        simulates them all at once."""
        pts, k0, moved = self._anchor(row, values)
        z0, t0 = pts[k0]
        if not moved:
            return z0, t0, moved, np.zeros(0), np.zeros(0)
        g0 = self.g(z0)
        span = np.array([p.high - p.low for p in self.params])
        near = [n for n, (zp, _) in enumerate(pts) if n != k0
                and float(np.max(np.abs(zp - z0)[moved] / span[moved])) <= LOCAL * PROBE_STEP]
        for chosen in (near, [n for n in range(len(pts)) if n != k0]):  # the nearby points, else every point
            a = np.array([(self.g(pts[n][0]) - g0)[moved] for n in chosen]).reshape(len(chosen), len(moved))
            if len(chosen) >= len(moved) and np.linalg.matrix_rank(a) == len(moved):
                break
        else:
            raise RuntimeError(f"fit model of row {row}: too few simulated points ({len(pts)}) for "
                               f"{len(moved)} seen directions")
        b, c, shape = (None, None, "kinked") if row in self.kinked else self._shape(pts, k0, chosen, moved)
        if shape == "kinked":
            self.kinked.add(row)
            d = self._differences(row, z0, t0, moved, pending)
            return None if d is None else (z0, t0, moved, d, np.zeros(len(moved)))
        if shape == "curved":
            self.curved.add(row)
        self._fitted[(row, tuple(z0))] = np.array([z0] + [pts[n][0] for n in chosen])
        return z0, t0, moved, b, c

    def covers(self, row: int, model, values) -> bool:
        """Whether ``model`` of ``row`` (``model``) stands for the row's simulation at ``values``
        (``fit_and_hold_out``: a held-out row's time): the row is not kinked, what it sees
        there differs from the anchor only along the directions the model moves, and along
        each lies within the points the model was fitted to, widened by ``KINK_STEP`` of the
        range (the finite differences' own step, over which the plain path takes a row for
        linear): there the model interpolates simulations it goes through."""
        z0, _, moved, _, _ = model
        z = np.array(self.sims.seen(row, values))
        if row in self.kinked or any(z[k] != z0[k] for k in range(len(z)) if k not in moved):
            return False
        if not moved:  # a row that sees no parameter: its time does not move
            return True
        pts = self._fitted.get((row, tuple(z0)))
        if pts is None:
            return False
        span = np.array([p.high - p.low for p in self.params])[moved]
        lo, hi = pts[:, moved].min(axis=0) - KINK_STEP * span, pts[:, moved].max(axis=0) + KINK_STEP * span
        return bool(np.all((z[moved] >= lo) & (z[moved] <= hi)))

    def distance(self, row: int, values) -> float:
        """How far (the largest fraction of a range) what ``row`` sees at ``values`` is from
        its nearest simulated point."""
        z = np.array(self.sims.seen(row, values))
        span = np.array([p.high - p.low for p in self.params])
        return min(float(np.max(np.abs(zp - z) / span)) for zp, _ in self._points(row))

    def smooth(self, row: int, values) -> bool:
        """Whether ``row``'s simulated points, more of them than the directions it sees, all
        lie on one straight piece (within ``SMOOTH``: ``_shape``) with the one nearest
        ``values``: a row whose model needs no more points there (``fit_rounds``: no probes at
        its answer). A curved row is probed there: the slopes of a parabola through points a
        few percent of a range apart are not the slopes where the fit ended, and its held-out
        fits solve there."""
        pts, k0, moved = self._anchor(row, values)
        if row in self.kinked or not moved:
            return row not in self.kinked
        z0 = pts[k0][0]
        others = [n for n in range(len(pts)) if n != k0]
        a = np.array([(self.g(pts[n][0]) - self.g(z0))[moved] for n in others]).reshape(len(others), len(moved))
        if len(others) <= len(moved) or np.linalg.matrix_rank(a) < len(moved):
            return False
        return self._shape(pts, k0, others, moved)[2] == "straight"

    def models(self, rows, values) -> dict:
        """Each of ``rows``' model at ``values`` (``model``), the kinked rows' differences
        simulated in one batch (in the pool's workers at once)."""
        pending: list = []
        for i in rows:
            self.model(i, values, pending)
        phase, self.sims.phase = self.sims.phase, "differences"
        self.sims.ensure(pending)
        self.sims.phase = phase
        return {i: self.model(i, values) for i in rows}

    def _differences(self, row: int, z0, t0, moved, pending: list | None = None) -> np.ndarray | None:
        """A kinked row's b: one-sided differences at its anchor ``z0`` (simulated here if
        not yet), a ``KINK_STEP`` of each range towards its middle."""
        jobs = []
        for k in moved:
            p = self.params[k]
            zk = [float(v) for v in z0]
            step = KINK_STEP * (p.high - p.low)
            zk[k] += step if zk[k] < (p.low + p.high) / 2 else -step
            jobs.append((row, tuple(zk)))
        if pending is not None and any(j not in self.sims.cache for j in jobs):
            pending += jobs
            return None
        self.sims.ensure(jobs)
        g0 = self.g(z0)
        a = np.array([(self.g(z) - g0)[moved] for _, z in jobs])
        y = np.array([self.sims.cache[j] - t0 for j in jobs])
        return np.linalg.solve(a, y)

    def predict(self, row: int, model, values) -> float:
        z0, t0, moved, b, c = model
        if not moved:
            return float(t0)
        dz = (self.g(self.sims.seen(row, values)) - self.g(z0))[moved]
        return float(t0 + dz @ b + dz ** 2 @ c)

    def solve(self, rows, measured, weights, start, free, tol: float = 1e-12, loss: str = "squares"):
        """The values minimising the model's weighted relative residuals of ``rows`` (their
        ``loss``, ``LOSSES``) from ``start`` (only ``free`` parameters move; bounded by the
        parameters' ranges), and the models (anchored at ``start``) they were found with."""
        from scipy.optimize import least_squares

        models = self.models(rows, start)
        on = [j for j, f in enumerate(free) if f]
        low = np.array([p.low for p in self.params])
        span = np.array([p.high - p.low for p in self.params])
        u0 = np.clip((np.asarray(start, float) - low) / span, 0.0, 1.0)
        if not on:
            return tuple(float(v) for v in low + u0 * span), models

        def point(v):
            u = u0.copy()
            u[on] = np.clip(v, 0.0, 1.0)
            return low + u * span

        def residuals(v):
            x = point(v)
            return np.array([(self.predict(i, models[i], x) / measured[i] - 1.0) * weights[i] for i in rows])

        res = least_squares(residuals, u0[on], bounds=(0.0, 1.0), method="trf", x_scale=1.0,
                            ftol=tol, xtol=tol, gtol=tol, max_nfev=200, **scipy_loss(loss))
        return tuple(float(v) for v in point(res.x)), models

    def check(self, rows, models, values) -> list[float]:
        """The model's relative error at ``values`` for each of ``rows`` (simulated there)."""
        return [self.predict(i, models[i], values) / t - 1.0 for i, t in zip(rows, self.sims.times(rows, values))]


def fit_rounds(sur: Surrogate, rows, measured, weights, start, free, tolerance: float,
               start_tolerance: float | None = None, loss: str = "squares"):
    """The fit on ``rows`` by rounds (module doc): (values, evaluations, status), the
    evaluations being the points at which every row was simulated (the start included);
    ``loss``: what it makes least of the weighted residuals (``LOSSES``).
    Rounds go on until the model's next step moves no scaled parameter by ``tolerance``;
    ``start_tolerance`` (default ``tolerance``; ``sim.calibrate.fit_runs.START_TOLERANCE``):
    a first step smaller than it is not simulated, and the fit ends at the start."""
    start_tolerance = tolerance if start_tolerance is None else start_tolerance
    span = np.array([p.high - p.low for p in sur.params])

    def moved(a, b) -> float:
        return float(np.max(np.abs((np.array(a) - np.array(b)) / span), initial=0.0))

    def cost(values) -> float:  # the loss of the weighted residuals of the rows' simulations at values
        return loss_total([(t / measured[i] - 1.0) * weights[i] for i, t in zip(rows, sur.sims.times(rows, values))],
                          loss)

    sur.sims.phase = "start and its probes"
    sur.sims.ensure(sur.probes(rows, start))
    sur.sims.phase = "rounds"
    x, n, back = tuple(float(v) for v in start), 1, False
    best = cost(x)
    nxt = sur.solve(rows, measured, weights, x, free, loss=loss)[0]
    while True:
        if moved(nxt, x) < tolerance:
            status = "the model's minimum is at the last simulated point"
            break
        if n == 1 and moved(nxt, x) < start_tolerance:
            status = f"the model's minimum is within {start_tolerance:g} of each range of the start: the start"
            break
        if n > ROUNDS:
            status = f"stopped after {ROUNDS} rounds, still moving"
            break
        sur.sims.ensure([(i, sur.sims.seen(i, nxt)) for i in rows])  # every row at the model's minimum
        n += 1
        if (c := cost(nxt)) < best:
            x, best, back = nxt, c, False
            nxt = sur.solve(rows, measured, weights, x, free, loss=loss)[0]
        elif not back:  # the step crossed a kink the model did not see (module doc): half of it
            nxt, back = tuple((a + b) / 2 for a, b in zip(x, nxt)), True
        else:
            status = "a round fit worse than the last point, and so did half its step: the last point"
            break
    if moved(x, start) > PROBE_STEP / 2:  # far from the start's probes (the held-out fits' models): probe here,
        # where a kinked row's differences are (Surrogate._differences), each row whose points are not one smooth piece
        sur.sims.phase = "probes at the answer"
        sur.sims.ensure(sur.probes([i for i in rows if not sur.smooth(i, x)], x, KINK_STEP))
    return x, n, status
