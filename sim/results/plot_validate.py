"""Measured and simulated timelines one above the other (``trainsim validate``'s PNG).

Two Gantt panels on one time axis: the reference run as the profiler saw it on top, the
simulation below, one lane per rank for compute and one for communication (all of a
rank's p2p and collective streams merged; simulated communication drawn only while data
moves). Colours are the timeline's (``sim.results.plot``), so a forward is the same blue
in both panels and a bubble is a gap in both. Matplotlib comes through
``sim.results.plot``, which stays the only module that imports it.
"""

from __future__ import annotations

from pathlib import Path

from sim.results.plot import LABELS, category_colour, plt, save_png
from sim.results.trace import Trace


def _lanes(trace: Trace, max_ranks: int) -> list[tuple[int, str]]:
    ranks = sorted({s.rank for s in trace.spans})[:max_ranks]
    lanes = []
    for r in ranks:
        kinds = {s.kind == "compute" for s in trace.spans if s.rank == r}
        if True in kinds:
            lanes.append((r, "compute"))
        if False in kinds:
            lanes.append((r, "comm"))
    return lanes


def _draw(ax, trace: Trace, lanes, used: dict, extra: dict) -> None:
    index = {lane: i for i, lane in enumerate(lanes)}
    bars: dict[int, list] = {}
    for s in trace.spans:
        y = index.get((s.rank, "compute" if s.kind == "compute" else "comm"))
        if y is None:
            continue
        a = s.start_s if s.busy_start_s is None else s.busy_start_s
        if s.end_s <= a:
            continue
        c = category_colour(s.category, extra)
        used.setdefault(s.category, c)
        bars.setdefault(y, []).append((a * 1e3, (s.end_s - a) * 1e3, c))
    for y, items in sorted(bars.items()):
        ax.broken_barh([(x, w) for x, w, _ in items], (y - 0.4, 0.8), facecolors=[c for _, _, c in items],
                       edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"rank {r} · {k}" for r, k in lanes], fontsize=8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.grid(axis="x", linestyle=":", alpha=0.5)
    ax.set_axisbelow(True)


def plot_measured_vs_simulated(measured: Trace, simulated: Trace, path: str | Path, title: str = "",
                               measured_label: str = "measured", simulated_label: str = "simulated",
                               max_ranks: int = 8) -> Path:
    """Write the two-panel PNG at ``path`` (atomically) and return the path."""
    lm, ls = _lanes(measured, max_ranks), _lanes(simulated, max_ranks)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(13, 0.42 * (len(lm) + len(ls)) + 2.6), dpi=110, sharex=True,
                                      gridspec_kw={"height_ratios": [max(1, len(lm)), max(1, len(ls))]})
    used: dict[str, str] = {}
    extra: dict[str, str] = {}
    _draw(top, measured, lm, used, extra)
    _draw(bottom, simulated, ls, used, extra)
    top.set_title(f"{measured_label}: {measured.end_s * 1e3:.1f} ms", fontsize=9, loc="left")
    bottom.set_title(f"{simulated_label}: {simulated.end_s * 1e3:.1f} ms", fontsize=9, loc="left")
    bottom.set_xlim(0, max(measured.end_s, simulated.end_s, 1e-9) * 1e3 * 1.01)
    bottom.set_xlabel("time (ms)")
    if title:
        fig.suptitle(title, fontsize=10)
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=LABELS.get(k, k)) for k, c in sorted(used.items())]
    if handles:
        top.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return save_png(fig, path)
