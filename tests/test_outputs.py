"""Perfetto/Chrome JSON and PNG timelines."""

import json

from sim.program.actions import Action, Program
from sim.engine.core import simulate
from sim.results.export import to_chrome, write_chrome
from sim.results.plot import plot_timeline
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
    p = plot_timeline(tr, tmp_path / "t.png", title="test", show_transfers=True)
    data = p.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_pareto_axes_fit_the_plans_and_the_best_plans_label_stays_inside():
    # issue 44: pareto.png cut off the best plan's label and left its right half empty
    # (the axis ran out to the GPU's capacity, far beyond every plan)
    from sim.results.plot import pareto_figure

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
