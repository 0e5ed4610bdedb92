"""The search's and sweep's picture (``pareto.png``): tokens/s against peak memory per
GPU, one dot per plan that ran and fit, the Pareto front joined (no plan both faster and
smaller), the best plan starred and labelled. The axes fit the plans, so they spread over
the whole width; a GPU capacity beyond them is written in a corner rather than drawn.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.ticker import FuncFormatter

from sim.results.plot import plt, save_png
from sim.units import format_bytes


def plot_pareto(points, path: str | Path, title: str = "", capacity_bytes: float | None = None) -> Path:
    """Tokens/s against peak memory per GPU, one dot per plan: ``points`` are
    ``(peak_bytes, tokens_per_s, on_front, label)``; the Pareto front (no plan both faster
    and smaller) is joined by a line, labelled points are annotated (the best plan)."""
    return save_png(pareto_figure(points, title, capacity_bytes), path)


def pareto_figure(points, title: str = "", capacity_bytes: float | None = None):
    """``plot_pareto``'s figure. The axes fit the plans (a GPU capacity beyond them is
    written in a corner, not drawn, so that the plans are not squeezed into one half),
    and a label is written on the side of its point that faces the middle of the axes,
    so that the best plan's, at the top right, stays inside."""
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    xs = [p[0] / 2**30 for p in points]
    ys = [p[1] for p in points]
    ax.scatter(xs, ys, s=14, color="#9DB4D3", label="simulated plan", zorder=2)
    front = sorted((p[0] / 2**30, p[1]) for p in points if p[2])
    if front:
        ax.plot([x for x, _ in front], [y for _, y in front], "-o", color="#C44E52", markersize=5,
                label="Pareto front", zorder=3)
    if xs:
        ax.set_xlim(*_padded(min(xs), max(xs)))
        ax.set_ylim(*_padded(min(ys), max(ys)))
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    for x, y, (_, _, _, label) in zip(xs, ys, points):
        if label:
            ax.scatter([x], [y], marker="*", s=160, color="#DD8452", zorder=4)
            right, top = x > (x0 + x1) / 2, y > (y0 + y1) / 2
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(-8 if right else 8, -8 if top else 8),
                        ha="right" if right else "left", va="top" if top else "bottom", fontsize=8,
                        bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
                        zorder=5)
    if capacity_bytes:
        cap = capacity_bytes / 2**30
        if x0 <= cap <= x1:
            ax.axvline(cap, color="black", linestyle="--", linewidth=1,
                       label=f"GPU memory ({format_bytes(capacity_bytes)})")
        else:  # outside the plans' range: say so rather than squash the plans into a corner
            ax.text(0.01, 0.99, f"GPU memory {format_bytes(capacity_bytes)} (off the chart)",
                    transform=ax.transAxes, ha="left", va="top", fontsize=8)  # no plan is up there
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:,.0f}"))
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("tokens/s")
    ax.grid(linestyle=":", alpha=0.5)
    ax.set_axisbelow(True)
    ax.set_title(title or "plans: throughput against memory", fontsize=10)
    if points:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def _padded(lo: float, hi: float, frac: float = 0.06) -> tuple[float, float]:
    """``lo``..``hi`` widened by ``frac`` of the span on each side (a single value by a
    little of itself), so the outermost points are not cut by the frame."""
    pad = (hi - lo) * frac or abs(hi) * frac or 1.0
    return lo - pad, hi + pad
