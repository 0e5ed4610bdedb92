"""Fitting a profile's models to measurements (numpy least squares and grid search).

Every fit minimises *relative* error, so a 10 µs kernel counts as much as a 10 ms one,
and each returns the RMS relative error of the fitted model over its points, which the
calibration report prints beside the numbers.

- **α-β of a link kind** from collectives (ours or nccl-tests'): the ring closed forms
  (REFERENCE.md; n ranks, S the nccl-tests buffer size, α per step, B the link's
  achieved bandwidth)

      all-reduce                          2(n−1)·α + 2(n−1)/n · S/B
      all-gather, reduce-scatter, all-to-all (n−1)·α +  (n−1)/n · S/B
      broadcast, reduce (pipelined chain)  (n−1)·α +           S/B
      send/recv                                   α +           S/B

  are linear in (α, 1/B): one weighted ``numpy.linalg.lstsq`` over every point of every
  op. A negative α (noise at small sizes) is refitted with α = 0. NCCL's base latency of
  a collective (``sim.engine.nccl``: the simulator adds it to every collective) is taken
  off each measured time first.
- **Memory-bound kernels**: t = launch + bytes / (bandwidth · efficiency), linear in
  (launch, 1/rate): lstsq again; ``kernel_launch_s`` is the intercept, the bandwidth
  is a large copy's.
- **GEMM efficiency model** (``HardwareProfile.gemm_efficiency``, the simulator's own
  function): for each k0 on a grid and tile relative efficiencies by coordinate descent,
  the best-GEMM efficiency has a closed form (weighted least squares of
  t − launch = flops / (peak · best · q(shape))); the combination with the least RMS
  log error wins.
- **Attention**: ``attention_max_efficiency`` the same way, with the GEMM fit's k0, from
  forward (4·b·s²·h FLOPs) and backward (8·b·s²·h) times, the simulator's FLOP counts.

Fitted fractions are clipped to (0, 1] because a profile requires it; when a clip
happens the fit says so (``clipped``), so the report can explain it.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from sim.errors import InputError
from sim.inputs.hardware import HardwareProfile

_ALPHA_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1,
                "reduce_scatter": lambda n: n - 1, "alltoall": lambda n: n - 1,
                "broadcast": lambda n: n - 1, "reduce": lambda n: n - 1, "send_recv": lambda n: 1}
BUSBW_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
                "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send_recv": lambda n: 1.0}
COLLECTIVE_OPS = tuple(_ALPHA_STEPS)
K0_GRID = (0, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512)
REL_GRID = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)


def ring_coefficients(op: str, n: int) -> tuple[float, float]:
    """(steps multiplying α, factor multiplying S/B) of ``op``'s closed form on n ranks."""
    if op not in _ALPHA_STEPS:
        raise InputError(f"collective: got {op!r}; allowed: {', '.join(COLLECTIVE_OPS)}")
    if not isinstance(n, int) or n < 2:
        raise InputError(f"ranks: got {n!r}; a collective needs at least 2 ranks")
    return float(_ALPHA_STEPS[op](n)), float(BUSBW_FACTOR[op](n))


def fit_alpha_beta(points, base_s: float = 0.0) -> dict:
    """α (s) and B (bytes/s) from ``(op, ranks, nbytes, time_s)`` points (see the module doc).

    ``base_s``: the fixed cost the simulator adds to every collective it prices with the
    fitted link (NCCL's base latency, ``sim.engine.nccl``; not to send/recv), taken off
    each collective's time first, so that the link's α does not absorb it and the
    simulated collective (base + closed form) matches what was measured. Points no longer
    than ``base_s`` are left out."""
    pts = [(op, int(n), float(s), float(t) - (base_s if op != "send_recv" else 0.0)) for op, n, s, t in points
           if s >= 0]
    pts = [p for p in pts if p[3] > 0]
    if len(pts) < 2:
        raise InputError(f"alpha-beta fit: got {len(pts)} usable points; need at least 2 sizes")
    A = np.array([[ring_coefficients(op, n)[0] / t, ring_coefficients(op, n)[1] * s / t] for op, n, s, t in pts])
    y = np.ones(len(pts))
    (alpha, inv_b), *_ = np.linalg.lstsq(A, y, rcond=None)
    if alpha < 0:
        alpha = 0.0
        inv_b = float(np.linalg.lstsq(A[:, 1:], y, rcond=None)[0][0])
    if not inv_b > 0:
        raise InputError("alpha-beta fit: times do not grow with size; measure larger messages")
    pred = A @ np.array([alpha, inv_b])
    return {"latency_s": float(alpha), "bandwidth_Bps": float(1.0 / inv_b), "points": len(pts),
            "rms_rel_error": float(np.sqrt(np.mean((pred - 1.0) ** 2))), "base_latency_s": float(base_s)}


def fit_memory(records, copy_bandwidth_Bps: float) -> dict:
    """``kernel_launch_s``, ``hbm_bandwidth_Bps`` and ``memory_efficiency`` from
    memory-bound kernels (``bytes``, ``time_s``) and a large copy's bandwidth.

    The copy gives the bandwidth (what large, streaming work such as the optimizer step
    sees); the kernels' fitted rate over it is the efficiency, capped at 1 where the
    kernels ran faster than the copy (on a CPU they fit in cache; ``clipped`` says so,
    and the simulator then takes such kernels at the copy's rate)."""
    rows = [(float(r["bytes"]), float(r["time_s"])) for r in records if r["time_s"] > 0]
    if len(rows) < 2:
        raise InputError("memory fit: need at least 2 kernel timings")
    A = np.array([[1.0 / t, b / t] for b, t in rows])
    y = np.ones(len(rows))
    (launch, inv_rate), *_ = np.linalg.lstsq(A, y, rcond=None)
    if launch < 0:
        launch = 0.0
        inv_rate = float(np.linalg.lstsq(A[:, 1:], y, rcond=None)[0][0])
    if not inv_rate > 0:
        raise InputError("memory fit: kernel times do not grow with bytes; measure larger sizes")
    rate = 1.0 / inv_rate
    pred = A @ np.array([launch, inv_rate])
    eff = rate / copy_bandwidth_Bps
    out = {"kernel_launch_s": float(launch), "kernel_rate_Bps": float(rate),
           "rms_rel_error": float(np.sqrt(np.mean((pred - 1.0) ** 2))), "clipped": bool(eff > 1.0)}
    out.update(hbm_bandwidth_Bps=float(copy_bandwidth_Bps), memory_efficiency=float(min(eff, 1.0)))
    return out


def _scale_fit(a: np.ndarray, t: np.ndarray, launch: float) -> tuple[float, float]:
    """x minimising Σ((a·x + launch − t)/t)², then the RMS log error with x."""
    u = a / t
    x = float(np.sum(u * (1.0 - launch / t)) / np.sum(u * u))
    return x, float(np.sqrt(np.mean(np.log((a * x + launch) / t) ** 2))) if x > 0 else math.inf


def fit_gemm(records, profile: HardwareProfile, launch_s: float, dtype: str = "bf16",
             tiles=None) -> dict:
    """``gemm_max_efficiency``, ``gemm_k_overhead`` and ``gemm_tiles`` of ``profile``
    (whose peak and SM count are taken as given) fitted to GEMM timings."""
    rows = [r for r in records if r["time_s"] > 0]
    if len(rows) < 3:
        raise InputError("gemm fit: need at least 3 GEMM timings")
    peak = profile.peak(dtype)
    t = np.array([r["time_s"] for r in rows])
    flops = np.array([r["flops"] for r in rows])
    tiles = [list(x) for x in (tiles or profile.gemm_tiles)]
    best = None

    def evaluate(k0, rels):
        trial = replace(profile, gemm_tiles=tuple((a, b, r) for (a, b, _), r in zip(tiles, rels)),
                        gemm_k_overhead=float(k0), gemm_max_efficiency=1.0,
                        sustained_compute_fraction=1.0)  # (kernels run alone)
        q = np.array([trial.gemm_efficiency(r["m"], r["n"], r["k"], r["batch"]) for r in rows])
        x, err = _scale_fit(flops / (peak * q), t, launch_s)
        return err, x, trial

    for k0 in K0_GRID:
        rels = [1.0] * len(tiles)
        err, x, trial = evaluate(k0, rels)
        for _ in range(2):  # coordinate descent over the tiles' relative efficiencies
            for i in range(1, len(tiles)):
                for r in REL_GRID:
                    cand = rels[:i] + [r] + rels[i + 1:]
                    e, xx, tt = evaluate(k0, cand)
                    if e < err - 1e-12:
                        err, x, trial, rels = e, xx, tt, cand
        if best is None or err < best[0]:
            best = (err, x, trial)
    err, x, trial = best
    eff = 1.0 / x if x > 0 else 1.0
    clipped = eff > 1.0
    eff = min(eff, 1.0)
    if clipped:  # refit the error with the capped value
        alone = replace(trial, gemm_max_efficiency=1.0, sustained_compute_fraction=1.0)
        q = np.array([alone.gemm_efficiency(r["m"], r["n"], r["k"], r["batch"])
                      for r in rows])
        err = float(np.sqrt(np.mean(np.log((flops / (peak * q) + launch_s) / t) ** 2)))
    return {"gemm_max_efficiency": float(eff), "gemm_k_overhead": trial.gemm_k_overhead,
            "gemm_tiles": [list(x) for x in trial.gemm_tiles], "rms_log_error": float(err),
            "clipped": bool(clipped), "points": len(rows)}


def fit_attention(records, profile: HardwareProfile, launch_s: float, dtype: str = "bf16") -> dict:
    """``attention_max_efficiency`` from forward and backward times (``profile`` gives the
    peak, SM count, k0 and the backward's and causal kernel's relative efficiencies, which
    the measured kernels are taken to share)."""
    peak = profile.peak(dtype)
    unit = replace(profile, attention_max_efficiency=1.0, sustained_compute_fraction=1.0)
    a, t = [], []
    for r in records:
        b, h, s, d = r["batch"], r["heads"], r["seq"], r["head_dim"]
        for flops, time_s, q in ((4.0 * b * s * s * h * d, r["forward_s"], unit.attention_efficiency(s, s, d, b * h)),
                                 (8.0 * b * s * s * h * d, r["backward_s"],
                                  unit.attention_efficiency(s, s, d, b * h, backward=True))):
            if time_s > 0:
                a.append(flops / (peak * q))
                t.append(time_s)
    if len(t) < 2:
        raise InputError("attention fit: need at least 2 attention timings")
    x, err = _scale_fit(np.array(a), np.array(t), launch_s)
    eff = 1.0 / x if x > 0 else 1.0
    return {"attention_max_efficiency": float(min(eff, 1.0)), "clipped": bool(eff > 1.0),
            "unclipped": float(eff), "rms_log_error": err, "points": len(t)}


def best_gemm_rate(records, launch_s: float = 0.0) -> float:
    """The highest FLOP/s any measured GEMM reached (net of the launch overhead)."""
    return max(r["flops"] / max(r["time_s"] - launch_s, r["time_s"] * 0.5) for r in records)
