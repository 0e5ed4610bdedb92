"""Perfetto/Chrome JSON and PNG timelines."""

import json

import pytest

from sim.program.actions import Action, Program
from sim.engine.core import simulate
from sim.results.export import to_chrome, write_chrome
from sim.results.plot import TimelineView, plot_timeline
from sim.inputs.topology_build import load_topology


def _program():
    g = (0, 1, 2, 3)
    acts = {}
    for r in g:
        acts[r] = [Action("F0", duration_s=1e-3, category="F"),
                   Action("ar", kind="collective", op="allreduce", group=g, nbytes=2**24, deps=("F0",)),
                   Action("F1", duration_s=2e-3, category="F")]
    acts[0].append(Action("s", kind="send", peer=9, nbytes=2**20, category="pp", deps=("F1",)))
    acts[9] = [Action("r", kind="recv", peer=0, nbytes=2**20, category="pp"), Action("B0", duration_s=1e-3, deps=("r",))]
    return Program(acts)


def test_chrome_trace_structure():
    tr = simulate(_program(), load_topology("dgx-h100", nodes=2))
    doc = to_chrome(tr)
    ev = doc["traceEvents"]
    pnames = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert pnames[9] == "node 1 / GPU 1 (rank 9)"
    tnames = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert tnames[(0, 0)] == "compute" and tnames[(0, 1)] == "comm"
    xs = [e for e in ev if e["ph"] == "X"]
    assert len(xs) == len(tr.spans)
    f0 = next(e for e in xs if e["pid"] == 0 and e["name"] == "F0")
    assert f0["ts"] == 0 and abs(f0["dur"] - 1000.0) < 1e-9  # microseconds
    # Slices on one thread must not overlap (they nest trivially).
    by_thread = {}
    for e in xs:
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))
    # One flow arrow from the send to its receive, bound inside both slices.
    s = [e for e in ev if e["ph"] == "s"]
    f = [e for e in ev if e["ph"] == "f"]
    assert len(s) == len(f) == 1 and s[0]["id"] == f[0]["id"] and f[0]["bp"] == "e"
    assert (s[0]["pid"], f[0]["pid"]) == (0, 9)
    recv = next(e for e in xs if e["pid"] == 9 and e["name"] == "r")
    assert recv["ts"] <= f[0]["ts"] <= recv["ts"] + recv["dur"]


def test_same_input_gives_byte_identical_trace(tmp_path):
    topo = load_topology("dgx-h100", nodes=2)
    a = write_chrome(simulate(_program(), topo), tmp_path / "a.json").read_bytes()
    b = write_chrome(simulate(_program(), load_topology("dgx-h100", nodes=2)), tmp_path / "b.json").read_bytes()
    assert a == b
    json.loads(a)


def test_timeline_png_is_written(tmp_path):
    tr = simulate(_program(), load_topology("dgx-h100", nodes=2))
    p = plot_timeline(tr, tmp_path / "t.png", TimelineView(title="test", show_transfers=True))
    data = p.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_pareto_axes_fit_the_plans_and_the_best_plans_label_stays_inside():
    # issue 44: pareto.png cut off the best plan's label and left its right half empty
    # (the axis ran out to the GPU's capacity, far beyond every plan)
    from sim.results.plot_pareto import pareto_figure

    gib = 2**30
    pts = [((20 + i) * gib, 1e6 + i * 5e4, i % 3 == 0, "") for i in range(20)]
    best = "dp 8 x tp 2 x pp 4 (vpp 2), interleaved, mb 1, ZeRO-1, recompute selective, sp"
    pts.append((40 * gib, 2.2e6, True, best))  # the fastest and the largest, top right
    capacity = 79.65 * gib
    fig = pareto_figure(pts, "title", capacity)
    ax = fig.axes[0]
    x0, x1 = ax.get_xlim()
    assert x0 < 20 and 40 < x1 and (40 - 20) / (x1 - x0) > 0.8  # the plans fill the width
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    label = next(t for t in ax.texts if t.get_text() == best)
    box = label.get_window_extent(renderer)
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
    # the capacity off the chart is said in the same figure the text reports
    assert any(t.get_text() == "GPU memory 79.65 GiB (off the chart)" for t in ax.texts)
    import matplotlib.pyplot as plt

    plt.close(fig)


def _bar_widths(ax, y):
    """Widths (data units) of the bars drawn in lane ``y`` of a timeline's axes."""
    out = []
    for coll in ax.collections:
        for path in coll.get_paths():
            v = path.vertices
            if v[:, 1].min() >= y - 0.45 and v[:, 1].max() <= y + 0.45:
                out.append(v[:, 0].max() - v[:, 0].min())
    return out


def test_pipeline_sends_are_drawn_visibly_wide_in_the_picture_only():
    # issue 44: on a 16-micro-batch 1F1B timeline the pipeline lane showed one tick for 16
    # sends (each microseconds of a second-long step, under a pixel wide)
    import matplotlib.pyplot as plt

    from sim.results.plot import MIN_BAR_FRACTION, timeline_figure
    from sim.results.trace import Span, Trace

    spans = [Span(0, "compute", f"0F{i}", "compute", "F", i * 0.06, i * 0.06 + 0.05) for i in range(16)]
    spans += [Span(0, "pp", f"send 0F{i}", "send", "pp", i * 0.06 + 0.05, i * 0.06 + 0.05 + 5e-6) for i in range(16)]
    trace = Trace(spans, [], {}, {})
    fig = timeline_figure(trace, TimelineView("t", lane_names={0: "stage 0"}))
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    pp = labels.index("stage 0 · pp")
    widths = _bar_widths(ax, pp)
    end_ms = trace.end_s * 1e3
    assert len(widths) == 16 and min(widths) >= end_ms * MIN_BAR_FRACTION * 0.99
    # the forward bars keep their true widths, and the trace its true times
    assert sorted(round(w, 6) for w in _bar_widths(ax, labels.index("stage 0 · compute"))) == [50.0] * 16
    assert all(s.end_s - s.start_s == pytest.approx(5e-6) for s in spans if s.kind == "send")
    plt.close(fig)


def test_ranks_that_look_alike_are_drawn_once_with_their_count():
    # issue 44: the hierarchical all-reduce figure (``trainsim demo``) repeated 32
    # near-identical lanes
    import matplotlib.pyplot as plt

    from sim.commands.collective import CollectiveOptions, run_collective
    from sim.results.plot import timeline_figure

    topo = load_topology("dgx-h100", nodes=2)
    trace, _ = run_collective("allreduce", 2**30, 16, topo, CollectiveOptions(algo="hierarchical"))
    fig = timeline_figure(trace, TimelineView("t", show_transfers=True, max_lanes=32))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    counts = [int(x.split("×")[1].split()[0]) if "×" in x else 1 for x in labels if x.endswith("sends")]
    assert sum(counts) == 16 and len(counts) < 16  # every rank counted once, alike ones drawn once
    plt.close(fig)
    # ranks that differ stay apart: the pipeline above, rank 1 idle at the start
    from sim.results.trace import Span, Trace

    spans = [Span(r, "compute", "0F0", "compute", "F", 0.01 * r, 0.01 * r + 0.05) for r in range(3)]
    spans.append(Span(3, "compute", "0F0", "compute", "F", 0.0, 0.05))
    fig = timeline_figure(Trace(spans, [], {}, {}), TimelineView("t"))
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["rank 0 ×2", "rank 1", "rank 2"]
    plt.close(fig)


def test_context_parallel_ranks_and_traffic_are_labelled_cp(tmp_path, monkeypatch):
    # issue 44: context-parallel ranks were labelled "dp 0..3", ring attention's traffic sat
    # in a lane called "tp-comm"
    import sim.results.plot
    from sim.inputs.hardware import load_profile
    from sim.inputs.model import llama
    from sim.inputs.plan import ParallelPlan
    from sim.session import Job, simulate_training, summarize, write_outputs

    drawn = {}
    monkeypatch.setattr(sim.results.plot, "plot_timeline", lambda trace, path, view: drawn.update(vars(view)))
    monkeypatch.setattr(sim.results.plot, "plot_memory", lambda *a, **kw: None)
    model = llama("tiny-cp", 2, 512, 8, 2, 1024, 2000, 4096)
    plan = ParallelPlan(dp=2, cp=2, global_batch_size=4)
    run = simulate_training(Job(model, plan, load_profile("a100-80gb"), load_topology("dgx-a100", nodes=1)))
    write_outputs(run, summarize(run), tmp_path)
    assert sorted(drawn["lane_names"].values()) == ["dp 0 · cp 0 (rank 0)", "dp 0 · cp 1 (rank 1)",
                                                   "dp 1 · cp 0 (rank 2)", "dp 1 · cp 1 (rank 3)"]
    lane = drawn["lane_of_span"]
    cp = [sp for sp in run.trace.spans if sp.category == "cp"]
    assert cp and {lane(sp) for sp in cp} == {"cp-comm"}
    assert "cp-comm" not in {lane(sp) for sp in run.trace.spans if sp.category != "cp"}


def test_capacity_is_printed_as_the_text_prints_it_in_every_picture(tmp_path, monkeypatch):
    # issue 44: capacity 79.65 GiB in the text, "80 GiB" in compare.png's legend
    import matplotlib.pyplot as plt

    import sim.results.plot
    from sim.cli import main

    figs = []
    monkeypatch.setattr(sim.results.plot, "save_png", lambda fig, path: figs.append(fig) or path)
    flags = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "8192",
             "--seq-length", "512", "--gpu", "h100-sxm", "--gpus", "8", "--pipeline-model-parallel-size", "4",
             "--global-batch-size", "16"]
    assert main(["compare", *flags, "--schedules", "gpipe,1f1b", "--out", str(tmp_path / "o")]) == 0
    texts = [t.get_text() for fig in figs for ax in fig.axes
             for t in [*ax.texts, *(ax.get_legend().get_texts() if ax.get_legend() else [])]]
    capacity = [t for t in texts if "capacity" in t]
    assert capacity and all("79.65 GiB" in t for t in capacity), capacity
    for fig in figs:
        plt.close(fig)


def test_a_traces_makespan_is_read_once_and_again_when_its_spans_change():
    """``Trace.end_s`` is the latest span end (a hand-made trace), kept between reads, and read
    afresh when the span list is replaced or grows."""
    import copy

    from sim.results.trace import Span, Trace

    spans = [Span(0, "compute", f"0F{i}", "compute", "F", i * 1.0, i * 1.0 + 0.5) for i in range(4)]
    trace = Trace(spans, [], {}, {})
    assert trace.end_s == 3.5 and trace.end_s == 3.5
    trace.spans.append(Span(1, "compute", "1F0", "compute", "F", 0.0, 9.0))
    assert trace.end_s == 9.0                      # grown: read again
    other = copy.copy(trace)
    other.spans = spans[:2]
    assert other.end_s == 1.5 and trace.end_s == 9.0  # replaced on a copy: each its own
    assert Trace([], [], {}, {}).end_s == 0.0
