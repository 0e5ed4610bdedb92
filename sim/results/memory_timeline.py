"""GPU memory over time, from the allocations and frees the passes attach to actions.

Every action may carry ``mem`` entries, (when, category, bytes), applied when the
action starts or ends on its rank. The engine records them in order; this module turns
them into what users ask: each rank's memory per category over time, its peak and the
breakdown at the peak, and what is left at the end (which must be the resident
baseline: parameters, gradients and optimizer states, and the reserve).

Categories used by the passes: ``parameters``, ``gradients``, ``optimizer`` (resident
model states, sharded as the ZeRO stage says), ``activations`` (stored for backward, per
micro-batch and stage), ``gathered`` (ZeRO-3 parameters gathered for a layer),
``buckets`` (gradients waiting for their reduce-scatter or all-reduce), ``reserve``
(the CUDA context, communication buffers and allocator fragmentation from the profile).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from sim.results.trace import Trace

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "gathered", "buckets", "reserve")


@dataclass(frozen=True)
class MemoryPeak:
    """A rank's highest total and what it was made of at that moment (bytes)."""

    rank: int
    time_s: float
    total_bytes: float
    breakdown: dict


_BY_RANK: dict[int, tuple[int, dict[int, list]]] = {}
"""Per live trace (by ``id``): how many memory changes it had when indexed, and its
changes by rank. An entry goes when its trace is garbage-collected."""


def _events_of(trace: Trace, rank: int) -> list[tuple[float, str, float]]:
    """The rank's memory changes, indexed once per trace (traces hold millions)."""
    key = id(trace)
    index = _BY_RANK.get(key)
    if index is None or index[0] != len(trace.memory):
        by: dict[int, list] = {}
        for t, r, c, b in trace.memory:
            by.setdefault(r, []).append((t, c, b))
        if index is None:
            weakref.finalize(trace, _BY_RANK.pop, key, None)
        index = _BY_RANK[key] = (len(trace.memory), by)
    return index[1].get(rank, [])


def timeline(trace: Trace, rank: int) -> tuple[list[float], dict[str, list[float]]]:
    """Times and, per category, the bytes held just after each time (step function)."""
    events = _events_of(trace, rank)
    cats = sorted({c for _, c, _ in events}, key=lambda c: (CATEGORIES.index(c) if c in CATEGORIES else 99, c))
    level = {c: 0.0 for c in cats}
    times: list[float] = []
    series: dict[str, list[float]] = {c: [] for c in cats}
    for i, (t, c, b) in enumerate(events):
        level[c] += b
        if i + 1 < len(events) and events[i + 1][0] == t:
            continue  # record once per instant, after all its changes
        times.append(t)
        for k in cats:
            series[k].append(level[k])
    return times, series


def peak(trace: Trace, rank: int) -> MemoryPeak:
    """The moment the rank's total memory is highest (first such moment)."""
    times, series = timeline(trace, rank)
    best_i, best = 0, -1.0
    for i in range(len(times)):
        total = sum(s[i] for s in series.values())
        if total > best * (1 + 1e-12) + 1e-6:
            best_i, best = i, total
    if not times:
        return MemoryPeak(rank, 0.0, 0.0, {})
    return MemoryPeak(rank, times[best_i], best, {c: s[best_i] for c, s in series.items()})


def final(trace: Trace, rank: int) -> dict:
    """Bytes held per category once everything has run."""
    _, series = timeline(trace, rank)
    return {c: s[-1] for c, s in series.items() if s}


def highest_peak(trace: Trace) -> MemoryPeak:
    """The rank with the highest peak (ties: lowest rank)."""
    ranks = sorted({r for _, r, _, _ in trace.memory})
    peaks = [peak(trace, r) for r in ranks]
    if not peaks:
        return MemoryPeak(0, 0.0, 0.0, {})
    return max(peaks, key=lambda p: (p.total_bytes, -p.rank))


def min_level(trace: Trace, rank: int) -> float:
    """The lowest any category ever went (negative means something was freed twice)."""
    _, series = timeline(trace, rank)
    return min((min(s) for s in series.values() if s), default=0.0)
