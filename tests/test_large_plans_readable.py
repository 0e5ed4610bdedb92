"""Large plans stay readable (issue 54).

A timeline of many pipeline ranks and micro-batches draws one lane per rank (the first
keeps every stream) and a window from the start when a lane holds more steps than can be
told apart, and its title says so; ``estimate`` names cp and ep in its plan line as
``run`` does; the compare rows' fields are named as ``RunResult``'s.
"""

import contextlib
import io
import json

import matplotlib.pyplot as plt
import pytest

from sim.cli import main
from sim.results.plot import COMPACT_LANES, MAX_BARS, TimelineView, timeline_figure
from sim.results.trace import Span, Trace


def _pipeline(stages: int, micro_batches: int) -> Trace:
    """A 1F1B-shaped trace: each stage computes every micro-batch forward and backward and sends."""
    spans = []
    for r in range(stages):
        t = r * 1e-3
        for i in range(micro_batches):
            for phase in "FB":
                spans.append(Span(r, "compute", f"0{phase}{i}", "compute", phase, t, t + 1e-3))
                spans.append(Span(r, "pp", f"send 0{phase}{i}", "send", "pp", t + 1e-3, t + 1.01e-3))
                t += 1.1e-3
    return Trace(spans, [], {}, {})


def _title_and_labels(fig):
    ax = fig.axes[0]
    return ax.get_title(), [t.get_text() for t in ax.get_yticklabels()], ax.get_xlim()


def test_a_small_pipeline_is_drawn_whole_with_every_lane():
    fig = timeline_figure(_pipeline(4, 16), TimelineView("t"))
    title, labels, (_, x1) = _title_and_labels(fig)
    assert title == "t" and len(labels) == 8 and x1 == pytest.approx(_pipeline(4, 16).end_s * 1e3 * 1.01)
    plt.close(fig)


def test_many_stages_and_micro_batches_show_one_lane_per_stage_and_a_window():
    # the issue: DeepSeek-V3 at pp 32 with 512 micro-batches was solid bands, "first 17 of 32 kinds of rank"
    trace = _pipeline(32, 512)
    fig = timeline_figure(trace, TimelineView("t", lane_names={r: f"stage {r}" for r in range(32)}))
    title, labels, (_, x1) = _title_and_labels(fig)
    assert 64 > COMPACT_LANES
    assert labels[:3] == ["stage 0 · compute", "stage 0 · pp", "stage 1 · compute"]
    assert len(labels) == 33 and all(x.endswith("· compute") for x in labels[2:])   # every stage, none left out
    assert "kinds of rank" not in title
    steps_end = x1 / 1.01
    assert steps_end < trace.end_s * 1e3 / 4
    assert title.split("\n")[1] == (f"stage 0: every stream; the other ranks: compute only; the first "
                                    f"{steps_end:.4g} of {trace.end_s * 1e3:.4g} ms shown (up to {MAX_BARS} compute "
                                    "steps a lane); trace.json holds it all")
    # stage 0, the first to start, shows MAX_BARS steps; the later stages fewer
    ax = fig.axes[0]

    def steps(label):
        y = labels.index(label)
        return len([p for c in ax.collections for p in c.get_paths() if abs(p.vertices[:, 1].mean() - y) < 0.45])

    assert steps("stage 0 · compute") == MAX_BARS
    assert MAX_BARS - 40 < steps("stage 31 · compute") < MAX_BARS
    plt.close(fig)


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_estimate_names_cp_and_ep_in_its_plan_line_as_run_does():
    # the issue: `128 GPUs = dp 8 x tp 8 x pp 1`, where run says `dp 8 x cp 2 (p2p) x tp 8`
    argv = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--nodes", "16", "--tp", "8", "--cp", "2",
            "--seq-length", "8192", "--global-batch-size", "64"]
    _, out, _ = _run(["estimate", *argv])
    plan = next(x for x in out.splitlines() if x.startswith("plan: "))
    assert plan.startswith("plan: 128 GPUs = dp 8 x cp 2 (p2p) x tp 8 x pp 1, ")
    moe = ["--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "16", "--tp", "2", "--ep", "8", "--etp", "1",
           "--sequence-parallel", "--global-batch-size", "32"]
    _, out, _ = _run(["estimate", *moe])
    plan = next(x for x in out.splitlines() if x.startswith("plan: "))
    assert plan.startswith("plan: 16 GPUs = dp 8 x tp 2 x pp 1, ep 8 x etp 1, ")


def test_compare_rows_name_their_fields_as_run_result_does():
    import sim

    c = sim.compare(model={"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 8192,
                           "seq_length": 512}, gpu="h100-sxm", gpus=8, pipeline_model_parallel_size=4,
                    global_batch_size=16, schedules=["gpipe", "1f1b"])
    for r, row in zip(c, c.rows):
        assert row["peak_memory_bytes"] == r.peak_memory_bytes
        assert row["memory_capacity_bytes"] == r.summary["memory_capacity_bytes"]
        for name in ("iteration_time_s", "tokens_per_s", "mfu", "bubble_fraction", "fits"):
            assert row[name] == getattr(r, name)
        # the names before issue 54, kept for scripts that read compare.json
        assert (row["peak_bytes"], row["capacity_bytes"]) == (row["peak_memory_bytes"], row["memory_capacity_bytes"])
    assert json.loads(c.to_json())["rows"][0]["peak_memory_bytes"] == c.rows[0]["peak_memory_bytes"]
