"""Pictures of a training campaign (``trainsim goodput``): its timeline and the interval search.

``plot_timeline`` draws three panels: useful training over the whole campaign against
the ideal (no failure, no checkpoint), every interruption marked; a window of hours as a
Gantt bar (training, checkpoint saves, training later rolled back, detection, waiting
for a spare, restart); and the time each cause cost. ``plot_interval`` draws the
simulated goodput against the checkpoint interval, with Daly's closed form, the
simulated best and Young's and Daly's optima marked. Both take plain data (the report
dict and lists of spans and points), not the campaign objects.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from sim.results.plot import plt, save_png

KIND_COLOURS = {"train": "#55A868", "checkpoint": "#4C72B0", "lost": "#E377C2", "detect": "#8C8C8C",
                "wait": "#8172B3", "restart": "#DD8452", "save": "#64B5CD"}
KIND_LABELS = {"train": "training", "checkpoint": "checkpoint save (training stalled)",
               "lost": "training lost (rolled back by a failure)", "detect": "detecting the failure",
               "wait": "waiting for a spare node", "restart": "restart + reading the checkpoint",
               "save": "planned stop: final save"}
LOSS_PARTS = (("lost_work_s", "lost"), ("detect_s", "detect"), ("wait_s", "wait"), ("restart_s", "restart"),
              ("save_s", "save"))
DAY = 86400.0


def _category_colours(categories) -> dict[str, object]:
    cmap = plt.get_cmap("tab10")
    return {c: cmap(i % 10) for i, c in enumerate(sorted(set(categories)))}


def plot_timeline(rep: dict, spans, progress, failures, window: tuple[float, float], categories: dict[str, str],
                  path: str | Path) -> Path:
    """``spans``: (kind, cause, start, end) inside ``window``; ``progress``: (time, useful
    work); ``failures``: (time, cause, planned); ``categories``: cause -> category."""
    fig, axes = plt.subplots(3, 1, figsize=(12, 11.5), gridspec_kw={"height_ratios": [3, 1.3, 3]})
    _progress_panel(axes[0], rep, progress, failures, window, categories)
    _window_panel(axes[1], spans, failures, window)
    _causes_panel(axes[2], rep)
    run = rep.get("run", {})
    what = f"{run.get('model', '')} on {run.get('gpus', 0):,} {run.get('gpu', '')}" if run else ""
    fig.suptitle(f"Training campaign{': ' + what if what else ''}, {rep['days']:g} days, failures "
                 f"{rep['failures']['name']}, a checkpoint every {rep['checkpoint_interval_s']:.0f} s: goodput "
                 f"{rep['goodput'] * 100:.1f}%", fontsize=12)
    fig.tight_layout()
    return save_png(fig, path)


def _progress_panel(ax, rep, progress, failures, window, categories) -> None:
    t = np.array([p[0] for p in progress]) / DAY
    w = np.array([p[1] for p in progress]) / DAY
    end = rep["wall_s"] / DAY
    ax.plot([0, end], [0, end], color="#999999", ls="--", lw=1, label="ideal: training all the time")
    ax.plot(t, w, color="black", lw=1.6, label=f"useful training (goodput {rep['goodput'] * 100:.1f}%)")
    colours = _category_colours(categories.values())
    seen = set()
    for time, cause, planned in failures:
        cat = categories.get(cause, cause)
        label = None if cat in seen else f"interruption: {cat}"
        seen.add(cat)
        ax.axvline(time / DAY, ymin=0, ymax=0.04, color=colours[cat], lw=0.9, label=label)
    ax.axvspan(window[0] / DAY, window[1] / DAY, color="#FFD54F", alpha=0.25, label="window shown below")
    ax.set_xlim(0, end)
    ax.set_ylim(0, end * 1.02)
    ax.set_xlabel("wall-clock time (days)")
    ax.set_ylabel("useful training done (days)")
    ax.set_title(f"Useful training over the campaign: {rep['unexpected_interruptions']} unexpected and "
                 f"{rep['planned_interruptions']} planned interruptions (ticks at the bottom)", fontsize=10.5)
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    ax.grid(alpha=0.3)


def _window_panel(ax, spans, failures, window) -> None:
    lo, hi = window
    hours = (hi - lo) / 3600.0
    bars: dict[str, list] = {}
    for kind, _, a, b in spans:  # one collection per kind: windows can hold thousands of saves
        bars.setdefault(kind, []).append(((a - lo) / 3600.0, (b - a) / 3600.0))
    for kind, xs in bars.items():
        ax.broken_barh(xs, (-0.3, 0.6), facecolors=KIND_COLOURS[kind], lw=0)
    used = list(bars)
    for time, cause, planned in failures:
        if lo <= time <= hi:
            x = (time - lo) / 3600.0
            ax.axvline(x, color="black", lw=0.8)
            ax.text(x, 0.36, cause.replace("_", " "), rotation=90, fontsize=6.5, va="bottom", ha="right")
    ax.set_xlim(0, hours)
    ax.set_ylim(-0.4, 3.2)
    ax.set_yticks([])
    ax.set_xlabel(f"hours after day {lo / DAY:.2f} of the campaign")
    ax.set_title(f"{hours:.0f} hours of the campaign, second by second (black lines: interruptions; checkpoint "
                 "saves are often too short to see)", fontsize=10.5)
    from matplotlib.patches import Patch

    order = [k for k in KIND_COLOURS if k in used]
    ax.legend(handles=[Patch(color=KIND_COLOURS[k], label=KIND_LABELS[k]) for k in order], loc="upper center",
              bbox_to_anchor=(0.5, -0.42), ncol=min(4, max(1, len(order))), fontsize=8, frameon=False)


def _causes_panel(ax, rep, top: int = 12) -> None:
    lost = rep["time_lost_by_cause_s"]
    names = sorted((n for n in lost if lost[n]["total_s"] > 0), key=lambda n: -lost[n]["total_s"])[:top]
    rows = [("checkpoint saves", {"checkpoint": rep["checkpoint_stall_s"]})]
    rows += [(f"{n.replace('_', ' ')} ({rep['interruptions_by_cause'][n]})",
              {kind: lost[n][key] for key, kind in LOSS_PARTS}) for n in names]
    y = np.arange(len(rows))[::-1]
    used = []
    for yi, (_, parts) in zip(y, rows):
        left = 0.0
        for kind, v in parts.items():
            if v <= 0:
                continue
            ax.barh(yi, v / 3600.0, left=left, color=KIND_COLOURS[kind], height=0.7)
            left += v / 3600.0
            if kind not in used:
                used.append(kind)
    ax.set_yticks(y, [r[0] for r in rows], fontsize=8.5)
    ax.set_xlabel("wall-clock hours lost")
    useful = rep["useful_s"] / 3600.0
    ax.set_title(f"Where the {rep['wall_s'] / 3600.0:,.0f} hours went besides {useful:,.0f} hours of useful "
                 "training (cause, interruptions)", fontsize=10.5)
    from matplotlib.patches import Patch

    order = [k for k in KIND_COLOURS if k in used]
    ax.legend(handles=[Patch(color=KIND_COLOURS[k], label=KIND_LABELS[k]) for k in order], loc="lower right",
              fontsize=8)
    ax.grid(axis="x", alpha=0.3)


def plot_interval(rep: dict, closed_form, path: str | Path) -> Path:
    """Simulated goodput against the checkpoint interval; ``closed_form(τ)``: Daly's
    expected goodput (None to leave it out)."""
    pts = rep["search"]["points"]
    coarse = rep["search"].get("coarse_points", [])
    fig, ax = plt.subplots(figsize=(9, 5.5))
    if coarse:
        ax.plot([p[0] for p in coarse], [p[1] * 100 for p in coarse], "o", ms=4, mfc="none", color="#4C72B0",
                label=f"simulated, coarse grid ({rep['search']['horizon_days'] / 4:,.0f} days per point)")
    x = np.array([p[0] for p in pts] + [p[0] for p in coarse])
    y = np.array([p[1] for p in pts]) * 100
    ax.plot(x[:len(y)], y, "o", ms=4, color="#4C72B0",
            label=f"simulated ({rep['search']['horizon_days']:,.0f} days per point; the same failures at every "
                  "interval)")
    if closed_form is not None and len(x):
        xs = np.exp(np.linspace(math.log(x.min()), math.log(x.max()), 300))
        ax.plot(xs, [closed_form(v) * 100 for v in xs], color="#999999", lw=1.2,
                label="Daly 2006 closed form (unexpected failures only, mean restart cost)")
    best = rep["best_checkpoint_interval_s"]
    ax.axvline(best, color="#C44E52", lw=1.6, label=f"simulated best: {best:.0f} s")
    if rep.get("daly_interval_s"):
        ax.axvline(rep["daly_interval_s"], color="black", ls="--", lw=1.1,
                   label=f"Daly 2006 optimum: {rep['daly_interval_s']:.0f} s")
        ax.axvline(rep["young_interval_s"], color="black", ls=":", lw=1.1,
                   label=f"Young 1974 optimum: {rep['young_interval_s']:.0f} s")
    ax.set_xscale("log")
    from matplotlib.ticker import ScalarFormatter

    for axis in (ax.xaxis,):
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(ScalarFormatter())
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.set_xlabel("checkpoint interval (seconds of training between saves, log scale)")
    ax.set_ylabel("goodput (% of wall time spent on useful training)")
    ax.set_title(f"Goodput against the checkpoint interval ({rep['checkpoint']['mode']} saves of "
                 f"{rep['checkpoint']['bytes'] / 1e12:.2f} TB, {rep['checkpoint']['stall_s']:.3g} s stall each)",
                 fontsize=10.5)
    ax.legend(fontsize=8, loc="lower center")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return save_png(fig, path)
