"""Timeline pictures (matplotlib: this module and the other sim/results/plot_*.py).

``plot_timeline`` draws a Gantt chart: one lane per (rank, stream), time in
milliseconds on x, one bar per span coloured by what it is (forward, backward, weight
gradient, pipeline p2p, tensor- or data-parallel collectives...), with the action's name
written inside the bar when it fits. Idle time is left blank, so pipeline bubbles and
waiting are visible as gaps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from sim.results.trace import Trace  # noqa: E402
from sim.units import format_bytes  # noqa: E402

# Fixed colours for the categories schedules and passes use; others get tab20 colours.
COLOURS = {
    "F": "#4C72B0", "forward": "#4C72B0",
    "B": "#55A868", "backward": "#55A868", "I": "#55A868",
    "W": "#8C8C3C",
    "opt": "#C44E52", "optimizer": "#C44E52",
    "pp": "#DD8452", "send": "#DD8452", "recv": "#E6A86B",
    "tp": "#8172B3", "dp": "#937860", "zero": "#DA8BC3", "ep": "#17BECF",
    "allreduce": "#8172B3", "reducescatter": "#64B5CD", "allgather": "#DA8BC3",
    "broadcast": "#CCB974", "alltoall": "#937860", "shift": "#E377C2", "compute": "#4C72B0", "cp": "#E377C2",
    "amax": "#BCBD22",
    "via nvlink": "#76B900", "via pcie": "#999999", "via ib": "#D62728", "via ethernet": "#FF7F0E",
}
LABELS = {"F": "forward", "B": "backward", "I": "backward (input grad)", "W": "backward (weight grad)",
          "pp": "pipeline p2p", "tp": "tensor-parallel comm", "dp": "data-parallel comm", "opt": "optimizer",
          "ep": "expert-parallel comm (all-to-all)", "cp": "context-parallel comm (ring attention)",
          "amax": "FP8 amax all-reduce", "grad_prep": "gradient NaN check and scaling",
          "via nvlink": "transfer over NVLink", "via pcie": "transfer over PCIe",
          "via ib": "transfer over InfiniBand", "via ethernet": "transfer over Ethernet"}
"""Legend text for the categories whose names are short codes (others are shown as they are)."""


def category_colour(category: str, extra: dict[str, str]) -> str:
    """The colour of spans of ``category``: fixed in ``COLOURS``, else the next tab20
    colour, remembered in ``extra`` so one figure gives a category one colour."""
    if category in COLOURS:
        return COLOURS[category]
    if category not in extra:
        extra[category] = matplotlib.colormaps["tab20"](len(extra) % 20)
    return extra[category]


@dataclass(frozen=True)
class TimelineView:
    """How ``timeline_figure`` draws a trace: which ranks and lanes, and how much of it
    (each field's meaning is in ``timeline_figure``'s docstring)."""

    title: str = ""
    lane_names: Mapping[int, str] | None = None
    """A rank's lane label (default ``rank N``)."""
    max_lanes: int = 64
    show_transfers: bool = False
    ranks: frozenset | None = None
    """The ranks to draw (None: all)."""
    lane_of_stream: Callable[[str], str] | None = None
    lane_of_span: Callable | None = None
    collapse: bool = True
    max_bars: int | None = None
    """None: ``MAX_BARS``."""
    compact_lanes: int | None = None
    """None: ``COMPACT_LANES``."""


def plot_timeline(trace: Trace, path: str | Path, view: TimelineView = TimelineView()) -> Path:
    """Draw the trace as a Gantt PNG at ``path`` (written atomically) and return the path
    (``timeline_figure`` says how)."""
    return save_png(timeline_figure(trace, view), path)


MAX_BARS = 160
"""The most compute steps the busiest lane shows: past that (a 1F1B pipeline of 512
micro-batches has 1,024 per rank, thinner than a pixel) the picture is a window, from the
start through the warm-up into the steady state, and its title says which."""
COMPACT_LANES = 40
"""Past this many lanes (32 pipeline stages with a compute and a p2p lane each), the first
rank keeps every lane and the others their compute lane only, and the title says so."""


MIN_BAR_FRACTION = 1 / 600
"""The narrowest a communication bar is drawn, as a fraction of the timeline's width
(about two pixels): a 16-micro-batch pipeline's sends last microseconds of a
second-long step and would otherwise vanish. Only the picture widens them, never the
trace."""


def timeline_figure(trace: Trace, view: TimelineView = TimelineView()):
    """``plot_timeline``'s figure, drawn as ``view`` says.

    ``ranks`` picks the ranks to draw (default all); ``lane_of_stream`` maps a stream
    name to a lane name, so several streams can share a lane (e.g. every ``pp`` stream),
    and ``lane_of_span`` maps a span to its lane (e.g. context-parallel traffic to a
    ``cp-comm`` lane of its own whatever stream it ran on). With ``show_transfers`` each
    rank gets a ``sends`` lane showing every point-to-point transfer it sent (collective
    steps included), coloured by the slowest kind of link it crossed. Communication bars
    are drawn at least ``MIN_BAR_FRACTION`` of the width wide, except on the compute lane
    (tensor-parallel collectives between the GEMMs), where they would hide the compute. With ``collapse``, ranks
    whose lanes would look the same (the same bars to a pixel) are drawn once, labelled
    ``×N``. Past ``compact_lanes`` lanes (default ``COMPACT_LANES``) the first rank keeps
    every lane and the others their compute lane only; at most ``max_lanes`` lanes are drawn
    (the first ranks). When a lane holds more than ``max_bars`` compute steps (default
    ``MAX_BARS``), only a window from the start is drawn, in which no lane shows more. The
    title says what was left out.
    """
    title, lane_names, max_lanes, show_transfers, ranks = (view.title, view.lane_names, view.max_lanes,
                                                           view.show_transfers, view.ranks)
    lane_of_stream, lane_of_span, collapse = view.lane_of_stream, view.lane_of_span, view.collapse
    max_bars = MAX_BARS if view.max_bars is None else view.max_bars
    compact_lanes = COMPACT_LANES if view.compact_lanes is None else view.compact_lanes
    merge = lane_of_stream or (lambda s: s)
    lane_fn = lane_of_span or (lambda sp: merge(sp.stream))
    streams: dict[int, list[str]] = {}
    for sp in trace.spans:
        if (ranks is None or sp.rank in ranks) and sp.stream != "memory":  # memory: only the resident instant
            lanes_r = streams.setdefault(sp.rank, [])
            if lane_fn(sp) not in lanes_r:
                lanes_r.append(lane_fn(sp))
    streams = {r: sorted(ss, key=lambda ln: (ln != "compute", ln)) for r, ss in sorted(streams.items())}
    if show_transfers:
        streams = {r: ss + ["sends"] for r, ss in streams.items()}
    full_ms = max(trace.end_s * 1e3, 1e-9)
    extra: dict[str, str] = {}
    used: dict[str, str] = {}
    # Compute pieces of one step (named "2F0.0", "2F0.1", ..., "2F0") draw as one bar;
    # communication draws only while data moves (not while it waits for its peers).
    items: dict[tuple, list] = {}
    for sp in trace.spans:
        if sp.rank not in streams or sp.stream == "memory":
            continue
        lane = (sp.rank, lane_fn(sp))
        if sp.kind == "compute":
            key = (lane, sp.category, sp.name.split(".")[0])
            start = sp.start_s
        else:
            key = (lane, sp.category, sp.name, sp.start_s)
            start = sp.start_s if sp.busy_start_s is None else sp.busy_start_s
        it = items.get(key)
        items[key] = [start, sp.end_s, sp.kind] if it is None else [min(it[0], start), max(it[1], sp.end_s), sp.kind]
    t_end_ms, window_steps = _window(items, max_bars, full_ms)
    min_w = t_end_ms * 1.01 * MIN_BAR_FRACTION
    if t_end_ms < full_ms:
        items = {k: v for k, v in items.items() if v[0] * 1e3 < t_end_ms}
    bars: dict[tuple, list[tuple[float, float, str, str]]] = {}  # lane -> (x0, w, colour, name)
    for (lane, cat, name, *_), (a, b, kind) in items.items():
        x0, w = a * 1e3, (b - a) * 1e3
        if kind != "compute" and lane[1] != "compute":  # (on the compute lane it would hide the compute)
            w = max(w, min_w)
        c = category_colour(cat, extra)
        used.setdefault(cat, c)
        bars.setdefault(lane, []).append((x0, w, c, name))
    xfers: dict[tuple, list[tuple[float, float, str]]] = {}  # (lane, band) -> (x0, w, colour)
    media = [m for m in ("nvlink", "pcie", "ib", "ethernet", "local") if any(t.medium == m for t in trace.transfers)] \
        if show_transfers else []
    for tr in trace.transfers if show_transfers else ():
        if tr.src not in streams or tr.start_s * 1e3 >= t_end_ms:
            continue
        cat = f"via {tr.medium}"
        c = category_colour(cat, extra)
        used.setdefault(cat, c)
        xfers.setdefault(((tr.src, "sends"), media.index(tr.medium)), []).append(
            (tr.start_s * 1e3, max((tr.end_s - tr.start_s) * 1e3, min_w), c))
    copies = _identical_ranks(streams, bars, xfers, t_end_ms) if collapse else {r: 1 for r in streams}
    streams = {r: ss for r, ss in streams.items() if r in copies}
    lanes: list[tuple[int, str]] = [(r, s) for r, ss in streams.items() for s in ss]
    compact = (len(lanes) > compact_lanes and sum(len(ss) > 1 for ss in streams.values()) > 1
               and all(ss[0] == "compute" for ss in streams.values()))  # (a collective's lanes are all traffic)
    if compact:  # the first rank shows every stream; the others only what they compute
        first = next(iter(streams))
        streams = {r: (ss if r == first else ss[:1]) for r, ss in streams.items()}
        lanes = [(r, s) for r, ss in streams.items() for s in ss]
    dropped = 0
    if len(lanes) > max_lanes:
        kept_ranks = sorted({r for r, _ in lanes[:max_lanes]})
        dropped = len(streams) - len(kept_ranks)
        lanes = [(r, s) for r, s in lanes if r in kept_ranks][:max_lanes]
    lane_of = {lane: i for i, lane in enumerate(lanes)}
    fig_h = max(2.2, 0.42 * len(lanes) + 1.4)
    fig, ax = plt.subplots(figsize=(13, fig_h), dpi=110)
    min_label_ms = t_end_ms / 60
    thin = t_end_ms / 400  # bars narrower than this get no white edge, which would hide them
    for lane, group_items in bars.items():
        y = lane_of.get(lane)
        if y is None:
            continue
        for x0, w, _, name in group_items:
            if w >= min_label_ms and len(name) * t_end_ms / 170 < w:
                ax.text(x0 + w / 2, y, name, ha="center", va="center", fontsize=7, color="white", clip_on=True)
        for group, edge in (([i for i in group_items if i[1] >= thin], 0.4), ([i for i in group_items if i[1] < thin],
                                                                               0.0)):
            if group:  # one collection per lane: fast for many bars
                ax.broken_barh([(x, w) for x, w, _, _ in group], (y - 0.4, 0.8), facecolors=[c for _, _, c, _ in group],
                               edgecolor="white", linewidth=edge)
    # One band per kind of link inside the "sends" lane, so concurrent transfers (several
    # channels, or phases that overlap) do not hide each other.
    band = 0.8 / max(len(media), 1)
    for (lane, k), group_items in sorted(xfers.items()):
        y = lane_of.get(lane)
        if y is not None:
            ax.broken_barh([(x, w) for x, w, _ in group_items], (y - 0.4 + k * band, band * 0.9),
                           facecolors=[c for _, _, c in group_items], edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(lanes)))
    names = lane_names or {}
    multi = any(len(ss) > 1 for ss in streams.values())
    ax.set_yticklabels([
        (names.get(r, f"rank {r}") + (f" ×{copies[r]}" if copies[r] > 1 else "") + (f" · {s}" if multi else ""))
        for r, s in lanes
    ], fontsize=8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlim(0, t_end_ms * 1.01)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", linestyle=":", alpha=0.5)
    ax.set_axisbelow(True)
    full_title = title or "timeline"
    if dropped:
        full_title += f" (first {len(streams) - dropped} of {len(streams)} kinds of rank shown)"
    notes = []
    if any(n > 1 for n in copies.values()):
        notes.append(f"{sum(copies.values())} ranks; ×N: N ranks that look alike, drawn once")
    if compact:
        notes.append(f"{(names.get(first, f'rank {first}'))}: every stream; the other ranks: compute only")
    if t_end_ms < full_ms:
        notes.append(f"the first {t_end_ms:.4g} of {full_ms:.4g} ms shown (up to {window_steps} compute steps a "
                     f"lane)")
    if compact or t_end_ms < full_ms:
        notes[-1] += "; trace.json holds it all"
    if notes:
        full_title += "\n" + "; ".join(notes)
    ax.set_title(full_title, fontsize=10)
    handles = [Patch(color=c, label=LABELS.get(k, k)) for k, c in sorted(used.items())]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def _window(items: dict, max_bars: int, full_ms: float) -> tuple[float, int]:
    """The end (ms) of the window drawn and the most compute steps a lane shows in it: the
    whole timeline when no lane has more than ``max_bars`` compute steps, else up to the
    first start of a lane's step after its ``max_bars`` first (``timeline_figure``)."""
    starts: dict = {}
    for (lane, *_), (a, _b, kind) in items.items():
        if kind == "compute":
            starts.setdefault(lane, []).append(a * 1e3)
    crowded = [sorted(v)[max_bars] for v in starts.values() if max_bars and len(v) > max_bars]
    if not crowded:
        return full_ms, max(map(len, starts.values()), default=0)
    return min(crowded), max_bars


def _identical_ranks(streams: dict[int, list[str]], bars: dict, xfers: dict, t_end_ms: float) -> dict[int, int]:
    """The ranks to draw, each with how many ranks (itself included) would be drawn
    exactly like it: the same lanes holding the same bars, to a thousandth of the width
    (about a pixel), in the same colours. Ranks keep their order; the first of a kind
    stands for the others."""
    q = t_end_ms / 1000

    def look(r):
        lanes = tuple((ln, tuple(sorted((round(x / q), round(w / q), str(c)) for x, w, c, *_ in bars.get((r, ln), ()))))
                      for ln in streams[r])
        sends = tuple(sorted((k, tuple(sorted((round(x / q), round(w / q), str(c)) for x, w, c in v)))
                             for (lane, k), v in xfers.items() if lane[0] == r))
        return lanes, sends

    first: dict = {}
    copies: dict[int, int] = {}
    for r in streams:
        rep = first.setdefault(look(r), r)
        copies[rep] = copies.get(rep, 0) + 1
    return copies


def save_png(fig, path: str | Path) -> Path:
    """Save ``fig`` as a PNG at ``path`` through a temporary file and a rename (never
    half-written), close it, and return the path."""
    from sim.fileio import atomic_path

    path = Path(path)
    try:
        with atomic_path(path, suffix=".png") as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return path



def plot_memory(trace: Trace, path: str | Path, ranks, lane_names: dict[int, str] | None = None,
                capacity_bytes: float | None = None, title: str = "") -> Path:
    """Memory over time per rank (one panel each): stacked bytes per category in GiB,
    with the GPU's capacity as a dashed line, or, when the highest rank uses less than
    half of it, in the panel's corner (so a small plan's memory is not a flat line)."""
    from sim.results.memory_timeline import CATEGORIES, peak, timeline

    ranks = list(ranks)
    fig, axes = plt.subplots(len(ranks), 1, figsize=(12, 1.9 * len(ranks) + 1.0), dpi=110, sharex=True,
                             squeeze=False)
    colours = dict(zip(CATEGORIES, ("#4C72B0", "#55A868", "#C44E52", "#DD8452", "#8172B3", "#937860", "#BBBBBB")))
    end_ms = trace.end_s * 1e3
    top = max((peak(trace, r).total_bytes for r in ranks), default=0.0)
    show_cap = bool(capacity_bytes) and top >= 0.5 * capacity_bytes
    for ax, r in zip(axes[:, 0], ranks):
        times, series = timeline(trace, r)
        if not times:
            continue
        xs = [t * 1e3 for t in times] + [end_ms]
        cats = sorted(series, key=lambda c: c != "reserve")  # the reserve at the bottom
        ys = [[v / 2**30 for v in series[c]] + [series[c][-1] / 2**30] for c in cats]
        ax.stackplot(xs, ys, labels=cats, colors=[colours.get(c, "#999999") for c in cats], step="post")
        if show_cap:
            ax.axhline(capacity_bytes / 2**30, color="black", linestyle="--", linewidth=1)
            ax.text(end_ms * 0.995, capacity_bytes / 2**30, f"GPU capacity {format_bytes(capacity_bytes)}",
                    va="bottom", ha="right", fontsize=7)
        elif capacity_bytes:
            ax.text(0.995, 0.97, f"GPU capacity {format_bytes(capacity_bytes)} (off the chart)",
                    transform=ax.transAxes, va="top", ha="right", fontsize=7)
        ax.set_ylabel((lane_names or {}).get(r, f"rank {r}") + "\nGiB", fontsize=8)
        ax.grid(axis="y", linestyle=":", alpha=0.5)
        if show_cap:
            ax.set_ylim(0, max(ax.get_ylim()[1], capacity_bytes / 2**30 * 1.08))
        else:
            ax.set_ylim(0, top / 2**30 * 1.15 or 1.0)
    axes[0, 0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    axes[-1, 0].set_xlabel("time (ms)")
    axes[-1, 0].set_xlim(0, end_ms * 1.01)
    axes[0, 0].set_title(title or "memory over time", fontsize=10)
    fig.tight_layout()
    return save_png(fig, path)


# Parts of an iteration in ``plot_compare``: (row key, label, colour, hatch).
_COMPARE_TIME_PARTS = (
    ("compute_s", "compute", "#4C72B0", None),
    ("tp", "exposed tensor-parallel comm", "#8172B3", None),
    ("pp", "exposed pipeline p2p", "#DD8452", None),
    ("dp", "exposed data-parallel comm", "#937860", None),
    ("zero", "exposed ZeRO gathers", "#DA8BC3", None),
    ("offload", "exposed offload copies (PCIe)", "#8C8C3C", None),
    ("ep", "exposed expert-parallel comm (all-to-all)", "#64B5CD", None),
    ("cp", "exposed context-parallel comm", "#E377C2", None),
    ("amax", "exposed FP8 amax reductions", "#BCBD22", None),
    ("other", "exposed other comm", "#999999", None),
    ("bubble_s", "pipeline bubble (idle)", "#FFFFFF", "///"),
    ("other_idle_s", "other idle (waiting)", "#E8E8E8", None),
)
_COMPARE_MEMORY_PARTS = (("parameters", "#4C72B0"), ("gradients", "#55A868"), ("optimizer", "#C44E52"),
                         ("activations", "#DD8452"), ("other", "#BBBBBB"))


def plot_compare(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """One bar per plan (``rows`` as ``sim.api.Comparison.rows``): on the left the
    iteration time of the critical rank split into compute, exposed communication by
    kind and idle time (pipeline bubble hatched), in ms; on the right the peak memory of
    the fullest GPU by category, in GiB, against the GPU's capacity (dashed). The best
    plan is marked ★; plans that do not fit are marked OOM."""
    n = len(rows)
    fig, (ax, mx) = plt.subplots(1, 2, figsize=(13, 0.55 * n + 2.4), dpi=110, sharey=True,
                                 gridspec_kw={"width_ratios": [2.2, 1]})
    ys = list(range(n))
    longest = max((r["iteration_time_s"] for r in rows), default=0.0)
    unit, scale = ("s", 1.0) if longest >= 1 else ("ms", 1e3)
    left = [0.0] * n
    used = []
    for key, label, colour, hatch in _COMPARE_TIME_PARTS:
        vals = [(r[key] if key.endswith("_s") else r["exposed_comm_s"].get(key, 0.0)) * scale for r in rows]
        if not any(v > 0 for v in vals):
            continue
        ax.barh(ys, vals, left=left, height=0.62, color=colour, hatch=hatch, edgecolor="#777777" if hatch else "white",
                linewidth=0.6, label=label)
        left = [a + b for a, b in zip(left, vals)]
        used.append(label)
    for y, r in zip(ys, rows):
        t = r["iteration_time_s"] * scale
        ax.text(t, y, f"  {t:.3g} {unit}", va="center", ha="left", fontsize=8)
    ax.set_xlim(0, max(left + [1e-12]) * 1.16)
    ax.set_yticks(ys)
    ax.set_yticklabels([("★ " if r["best"] else "") + r["name"] for r in rows], fontsize=9)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlabel(f"iteration time ({unit}), critical rank")
    ax.grid(axis="x", linestyle=":", alpha=0.5)
    ax.set_axisbelow(True)
    ax.set_title("where the iteration goes", fontsize=10)
    below = matplotlib.transforms.offset_copy(ax.transAxes, fig=fig, y=-34, units="points")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=below, ncol=min(4, len(used)),
              fontsize=8, frameon=False)
    mleft = [0.0] * n
    for cat, colour in _COMPARE_MEMORY_PARTS:
        vals = [r["memory_bytes"].get(cat, 0.0) / 2**30 for r in rows]
        if not any(v > 0 for v in vals):
            continue
        mx.barh(ys, vals, left=mleft, height=0.62, color=colour, edgecolor="white", linewidth=0.6,
                label="reserve & other" if cat == "other" else cat)
        mleft = [a + b for a, b in zip(mleft, vals)]
    cap = rows[0]["memory_capacity_bytes"] / 2**30 if rows else 0.0
    top = max(mleft + [cap]) * 1.22
    for y, r in zip(ys, rows):
        peak = r["peak_memory_bytes"] / 2**30
        mx.text(peak, y, f" {peak:.1f} GiB" + ("" if r["fits"] else "  OOM"), va="center", ha="left", fontsize=8,
                color="black" if r["fits"] else "#C00000", fontweight="normal" if r["fits"] else "bold",
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.85})
    if cap:
        mx.axvline(cap, color="black", linestyle="--", linewidth=1,
                   label=f"GPU capacity ({format_bytes(rows[0]['capacity_bytes'])})")
    mx.set_xlim(0, top)
    mx.set_xlabel("peak memory per GPU (GiB)")
    mx.grid(axis="x", linestyle=":", alpha=0.5)
    mx.set_axisbelow(True)
    mx.set_title("peak memory (fullest GPU)", fontsize=10)
    below = matplotlib.transforms.offset_copy(mx.transAxes, fig=fig, y=-34, units="points")
    mx.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=below, ncol=3, fontsize=8,
              frameon=False)
    fig.suptitle(title or "plans compared", fontsize=11)
    fig.tight_layout()
    return save_png(fig, path)


def plot_busbw(rows, path: Path, name: str, gpus: int) -> Path:
    """All-reduce bus bandwidth against message size, one line per algorithm (``rows``:
    ``{"size_bytes", "ring": {"busbw_Bps"}, "hierarchical": {"busbw_Bps"}}``)."""
    sizes = [r["size_bytes"] for r in rows]
    curves = {algo: (sizes, [r[algo]["busbw_Bps"] for r in rows]) for algo in ("ring", "hierarchical")}
    return plot_busbw_curves(curves, path, f"all-reduce bus bandwidth on {gpus} GPUs ({name})")


_CURVE_COLOURS = ("#8172B3", "#55A868", "#C44E52", "#DD8452", "#4C72B0", "#937860")


def plot_busbw_curves(curves: dict, path: Path, title: str, notes: dict | None = None) -> Path:
    """Bus bandwidth (GB/s) against message size on a log axis, one line per entry of
    ``curves`` (label -> (sizes in bytes, busbw in B/s)); ``notes`` (label -> one text per
    size) are written next to that line's points where they change (e.g. the algorithm and
    protocol NCCL's tuner chose)."""
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    ticks: set = set()
    for (label, (sizes, busbw)), colour in zip(curves.items(), _CURVE_COLOURS * 4):
        dashed = notes is not None and label not in notes
        ax.plot(sizes, [b / 1e9 for b in busbw], marker="" if dashed else "o", markersize=3, color=colour,
                label=label, linestyle="--" if dashed else "-", linewidth=1.0 if dashed else 1.8)
        ticks.update(sizes)
        last = None
        for x, y, text in zip(sizes, busbw, (notes or {}).get(label, ())):
            if text != last:
                ax.annotate(text, (x, y / 1e9), textcoords="offset points", xytext=(-4, 8), fontsize=7,
                            color=colour, rotation=60)
                last = text
    ax.set_xscale("log", base=2)
    shown = sorted(ticks)[:: max(1, len(ticks) // 12)]
    ax.set_xticks(shown, [format_bytes(s).replace(".00", "") for s in shown], rotation=30, fontsize=8)
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(linestyle=":", alpha=0.6)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return save_png(fig, path)
