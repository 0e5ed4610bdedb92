"""Per-algorithm fits from nccl-tests logs that say which algorithm ran (``sim.calibrate.nccl_tests``).

Ring logs (or logs that name no algorithm) fit the links' α-β with the ring closed forms
(``nccl_tests.fit_link``). An NVLS log fits the two profile fields that belong to NVLS
alone: ``nvls_efficiency`` (the fraction of the NVLink line rate a GPU's NVLS traffic
reaches) and ``nvls_latency_s``, with the switch-reduction closed form of
``sim.engine.algorithms_nccl``. Tree and NVLS-tree have no parameter of their own (they
are priced by the links' α-β and, for NVLS-tree, ``nvls_efficiency``): their logs are
reported and not fitted (``plan``).
"""

from __future__ import annotations

from dataclasses import replace

from sim.errors import InputError
from sim.inputs.hardware import HardwareProfile

FITS = {None: "links", "ring": "links", "nvls": "nvls"}
"""Which parameters a log of each algorithm fits (ring: the links' α-β, with Simple or no protocol named)."""


def plan(results) -> dict:
    """{"links": [results], "nvls": [results], "none": [(result, why)]}: which log fits what."""
    out = {"links": [], "nvls": [], "none": []}
    for r in results:
        kind = FITS.get(r.algo)
        if kind == "links" and r.protocol not in (None, "simple"):
            out["none"].append((r, f"ring with protocol {r.protocol}: the links' alpha-beta are fitted from Simple"))
        elif kind is None:
            out["none"].append((r, f"{r.algo} has no parameter of its own (priced by the links' alpha-beta"
                                   f"{' and nvls_efficiency' if r.algo == 'nvls_tree' else ''})"))
        else:
            out[kind].append(r)
    return out


def fit_nvls(results, nvlink_line_rate_Bps: float, min_bytes: int = 0) -> dict:
    """``nvls_efficiency`` and ``nvls_latency_s`` from NVLS logs: a GPU's NVLS traffic
    takes t = α + k·S / (B·e), k = (n+1)/n for all-reduce (S + S/n each way at once) and 1
    for reduce-scatter and all-gather, B the NVLink line rate (``sim.engine.algorithms_nccl``),
    the way back starting after NVLS's first round of chunks (``sim.program.costs.nvls_time``
    with ``sim.engine.nccl_tuning.nvls_lead_bytes``); fitted as ``fit_alpha_beta`` does
    (least squares on relative error)."""
    from sim.engine.nccl_tuning import nvls_lead_bytes
    from sim.program.costs import nvls_time

    pts = []
    for res in results:
        if res.op not in ("all_reduce", "reduce_scatter", "all_gather") or res.ranks is None:
            raise InputError(f"{res.source}: op: got {res.op} on {res.ranks} ranks; an NVLS fit needs all_reduce, "
                             "reduce_scatter or all_gather with known ranks")
        n = res.ranks
        for r in res.rows:
            if r["bytes"] >= max(1, min_bytes):
                S = r["bytes"]
                out = S * (n + 1) / n if res.op == "all_reduce" else S if res.op == "reduce_scatter" else S / n
                # the bytes the busier way moves, the way back after NVLS's first round of chunks
                x = nvls_time(res.op, S, n, 0.0, 1.0, 1.0, nvls_lead_bytes(S, n, out))
                pts.append((1.0, x, r["time_s"]))
    import numpy as np

    if len(pts) < 2:
        raise InputError(f"NVLS fit: got {len(pts)} usable points; need at least 2 sizes")
    A = np.array([[a / t, x / t] for a, x, t in pts])
    (alpha, inv_b), *_ = np.linalg.lstsq(A, np.ones(len(pts)), rcond=None)
    if alpha < 0:
        alpha, inv_b = 0.0, float(np.linalg.lstsq(A[:, 1:], np.ones(len(pts)), rcond=None)[0][0])
    if not inv_b > 0:
        raise InputError("NVLS fit: times do not grow with size; measure larger messages")
    rms = float(np.sqrt(np.mean((A @ np.array([alpha, inv_b]) - 1.0) ** 2)))
    return {"nvls_efficiency": 1.0 / inv_b / nvlink_line_rate_Bps, "nvls_latency_s": float(alpha),
            "bandwidth_Bps": 1.0 / inv_b, "points": len(pts), "rms_rel_error": rms}


def apply_nvls(profile: HardwareProfile, fit: dict, sources: list[str]) -> HardwareProfile:
    """``profile`` with ``nvls_efficiency`` and ``nvls_latency_s`` from ``fit_nvls``, sources naming the logs."""
    text = (f"fitted from nccl-tests NVLS logs ({', '.join(sources)}): t = alpha + k*S/(B*eff) over {fit['points']} "
            f"sizes, B the NVLink line rate, {fit['bandwidth_Bps'] / 1e9:.1f} GB/s reached, RMS error {fit['rms_rel_error']:.1%}")
    return replace(profile, nvls_efficiency=round(fit["nvls_efficiency"], 6), nvls_latency_s=fit["nvls_latency_s"],
                   sources={**profile.sources, "nvls_efficiency": text, "nvls_latency_s": text})
