"""The checkpoint interval that maximises goodput: closed forms and a search by simulation.

With failures a Poisson process of mean time between failures ``M``, a checkpoint that
costs ``δ`` and a restart that costs ``R``:

- Young (1974), "A first order approximation to the optimum checkpoint interval":
  ``τ = sqrt(2·δ·M)``.
- Daly (2006), "A higher order estimate of the optimum checkpoint interval for restart
  dumps" (Future Generation Computer Systems 22): for ``δ < 2M``,
  ``τ = sqrt(2·δ·M)·[1 + (1/3)·sqrt(δ/(2M)) + (1/9)·(δ/(2M))] − δ``, else ``τ = M``.
  It approximates the optimum of his complete model, in which failures also strike
  during checkpoints and restarts, and the expected wall time of ``T_s`` of work is
  ``T_w = M·e^{R/M}·(e^{(τ+δ)/M} − 1)·T_s/τ``; so the expected goodput is
  ``τ / (M·e^{R/M}·(e^{(τ+δ)/M} − 1))`` (``daly_goodput``).

trainsim compares its simulated optimum with Daly's form (``daly_interval_s``), and
reports Young's beside it. ``search_interval`` finds the optimum by simulation: a coarse
grid of intervals over ``[guess/8, 8·guess]``, then a finer grid over a factor 2 either
side of the best point, whose wall time per unit of work (1/goodput) is fitted by
least squares with ``a + b·τ + c/τ + d·τ²`` (the expansion of Daly's ``T_w/T_s``
starts ``e^{R/M}·(1 + δ/τ + τ/(2M) + ...)``) and minimised; the fine grid is re-centred
once on that minimum. The fit smooths the simulation's noise; it is no closed form of the
optimum (its coefficients come from the simulated points alone).
Every point sees the same failures (common random numbers, ``simulate_campaign``), and the
search horizon holds at least ``SEARCH_FAILURES`` expected failures, so the goodput
differences between intervals are not the luck of the draw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sim.engine.campaign import CampaignConfig, simulate_campaign

SEARCH_FAILURES = 4000
"""Expected unexpected failures over a search's horizon (with seeds, in all)."""
COARSE = 13
"""Coarse grid points over [guess/8, 8·guess] (a factor 1.41 apart)."""
FINE = 13
"""Points of each fine grid (over [centre/2, 2·centre])."""


def young_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Young (1974): sqrt(2·δ·M)."""
    return math.sqrt(2.0 * delta_s * mtbf_s)


def daly_interval_s(delta_s: float, mtbf_s: float) -> float:
    """Daly (2006), the higher-order optimum (see the module doc)."""
    if delta_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = delta_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * delta_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta_s


def daly_goodput(interval_s: float, delta_s: float, mtbf_s: float, restart_s: float) -> float:
    """Expected goodput of Daly's complete model: τ / (M·e^{R/M}·(e^{(τ+δ)/M} − 1))."""
    if math.isinf(mtbf_s):
        return interval_s / (interval_s + delta_s)
    m = mtbf_s
    return interval_s / (m * math.exp(restart_s / m) * math.expm1((interval_s + delta_s) / m))


@dataclass(frozen=True)
class Search:
    """The simulated goodput at each interval tried, and the best interval."""

    points: tuple[tuple[float, float], ...]
    """(interval_s, goodput) of the fine grids, sorted by interval."""
    coarse: tuple[tuple[float, float], ...]
    """(interval_s, goodput) of the coarse grid, over a quarter of the horizon."""
    best_interval_s: float
    best_goodput: float
    """The goodput simulated at ``best_interval_s``."""
    horizon_s: float
    """The horizon each point was simulated over (all seeds together)."""
    seeds: tuple[int, ...]


def search_interval(config_for: Callable[[float], CampaignConfig], guess_s: float, seeds=(0,),
                    min_failures: float = SEARCH_FAILURES) -> Search:
    """The interval with the best simulated goodput. ``config_for(interval_s)`` gives the
    campaign at an interval (its horizon is stretched here so that the seeds together see
    ``min_failures`` expected unexpected failures)."""
    base = config_for(guess_s)
    rate = sum(r for c, r in base.causes if not c.planned)
    seeds = tuple(seeds)
    per_seed = base.horizon_s
    if rate > 0:
        per_seed = max(per_seed, min_failures / rate / len(seeds))
    step = base.step_time_s
    caches: dict[float, dict[int, float]] = {}

    def goodput(interval_s: float, horizon_s: float = per_seed) -> tuple[float, float]:
        steps = max(1, int(round(interval_s / step)))
        cache = caches.setdefault(horizon_s, {})
        if steps not in cache:
            cfg = _stretched(config_for(steps * step), horizon_s)
            cache[steps] = sum(simulate_campaign(cfg, s).useful_s for s in seeds) / (horizon_s * len(seeds))
        return steps * step, cache[steps]

    if rate <= 0:  # nothing fails: the fewer saves the better; one per horizon
        t, g = goodput(per_seed)
        return Search(((t, g),), (), t, g, per_seed * len(seeds), seeds)
    # the coarse grid only has to land within its spacing of the optimum: a quarter of the horizon
    coarse = [goodput(guess_s * 8.0 ** (2.0 * i / (COARSE - 1) - 1.0), per_seed / 4) for i in range(COARSE)]
    centre = max(coarse, key=lambda p: p[1])[0]
    for _ in range(2):  # a fine grid over [c/2, 2c] around the best, re-centred on the fit's optimum
        for i in range(FINE):
            goodput(centre * 2.0 ** (2.0 * i / (FINE - 1) - 1.0))
        near = sorted(goodput(s * step) for s in caches[per_seed] if centre / 2.0 <= s * step <= centre * 2.0)
        centre = _fitted_optimum(near)
    t, g = goodput(centre)
    pts = tuple(sorted(goodput(s * step) for s in caches[per_seed]))
    return Search(pts, tuple(sorted(set(coarse))), t, g, per_seed * len(seeds), seeds)


def _fitted_optimum(points: list[tuple[float, float]]) -> float:
    """The interval that minimises a least-squares fit of wall time per unit of work
    (1/goodput) by ``a + b·τ + c/τ + d·τ²`` (the first terms of Daly's T_w/T_s in τ and
    1/τ, with a quadratic for what follows), searched within the points' range; the best
    point when there are too few points to fit."""
    if len(points) < 6:
        return max(points, key=lambda p: p[1])[0]
    t = np.array([p[0] for p in points])
    y = 1.0 / np.array([max(p[1], 1e-12) for p in points])
    scale = float(np.exp(np.log(t).mean()))
    basis = lambda x: np.c_[np.ones_like(x), x / scale, scale / x, (x / scale) ** 2]  # noqa: E731
    coef = np.linalg.lstsq(basis(t), y, rcond=None)[0]
    xs = np.exp(np.linspace(np.log(t.min()), np.log(t.max()), 4001))
    return float(xs[int(np.argmin(basis(xs) @ coef))])


def _stretched(cfg: CampaignConfig, horizon_s: float) -> CampaignConfig:
    from dataclasses import replace

    return replace(cfg, horizon_s=horizon_s)
