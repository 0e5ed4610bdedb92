"""``trainsim compare``: one row per plan with the best marked, --json, --out with the
chart, the same numbers as ``sim.compare``, and the progress line."""

import io
import json
from contextlib import redirect_stdout

import pytest

import sim
from sim.cli import main
from sim.progress import Progress

FLAGS = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "8192",
         "--seq-length", "512", "--gpu", "h100-sxm", "--gpus", "8", "--pipeline-model-parallel-size", "4",
         "--global-batch-size", "16"]
TINY = {"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 8192, "seq_length": 512}


def _stdout(*argv) -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(list(argv)) == 0
    return buf.getvalue()


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp")
    text = _stdout("compare", *FLAGS, "--schedules", "gpipe,1f1b,zb-h2", "--out", str(out / "o"))
    return out / "o", text, json.loads((out / "o" / "compare.json").read_text())


def test_table_has_one_row_per_plan_and_marks_the_best(compared):
    _, text, data = compared
    lines = text.splitlines()
    rows = [ln for ln in lines if ln[2:].split(" ")[0] in ("gpipe", "1f1b", "zb-h2")]
    assert [r[2:].split()[0] for r in rows] == ["gpipe", "1f1b", "zb-h2"]
    assert sum(r.startswith("*") for r in rows) == 1
    best = next(r for r in rows if r.startswith("*"))[2:].split()[0]
    assert best == data["best"]
    header = next(ln for ln in lines if "tokens/s" in ln)
    for col in ("time (ms)", "MFU", "bubble", "exp. pp", "peak memory", "fits"):
        assert col in header
    assert f"* best: {best}" in text


def test_json_rows_and_best(compared):
    _, _, data = compared
    names = [r["name"] for r in data["rows"]]
    assert names == ["gpipe", "1f1b", "zb-h2"] == [p["name"] for p in data["plans"]]
    rows = {r["name"]: r for r in data["rows"]}
    fitting = [r for r in data["rows"] if r["fits"]]
    assert data["best"] == max(fitting, key=lambda r: r["tokens_per_s"])["name"]
    assert rows["gpipe"]["peak_memory_bytes"] > rows["1f1b"]["peak_memory_bytes"]  # GPipe stashes all 4 micro-batches
    assert rows["zb-h2"]["bubble_fraction"] < rows["1f1b"]["bubble_fraction"]
    for p in data["plans"]:
        assert p["summary"]["schedule"] == p["name"]


def test_out_writes_chart_json_and_each_plan(compared):
    out, _, data = compared
    png = (out / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    for name in ("gpipe", "1f1b", "zb-h2"):
        for f in ("summary.json", "trace.json", "timeline.png", "memory.png"):
            assert (out / name / f).stat().st_size > 0
        assert json.loads((out / name / "summary.json").read_text()) == \
            next(p["summary"] for p in data["plans"] if p["name"] == name)


def test_cli_and_api_agree(compared):
    _, _, data = compared
    c = sim.compare(model=TINY, gpu="h100-sxm", gpus=8, pipeline_model_parallel_size=4, global_batch_size=16,
                    schedules=["gpipe", "1f1b", "zb-h2"])
    assert json.loads(c.to_json()) == data


def test_two_axes_and_kineto(tmp_path):
    text = _stdout("compare", *FLAGS[:-4], "--gpus", "2", "--global-batch-size", "4", "--zero-stages", "0,3",
                   "--pipeline-model-parallel-size", "2", "--schedules", "1f1b,zb-h1", "--kineto", str(tmp_path))
    for name in ("1f1b, zero-0", "1f1b, zero-3", "zb-h1, zero-0", "zb-h1, zero-3"):
        assert name in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1f1b-zero-0", "1f1b-zero-3", "zb-h1-zero-0", "zb-h1-zero-3"]
    assert sorted(p.name for p in (tmp_path / "1f1b-zero-3").iterdir()) == ["trace_rank0.json", "trace_rank1.json"]


@pytest.mark.parametrize("extra,needle", [
    ([], "nothing to compare"),
    (["--zero-stages", "0,5"], "--zero-stages: got 5"),
    (["--zero-stages", "one"], "--zero-stages"),
    (["--schedules", ","], "--schedules"),
    (["--schedules", "gpipe,pipedream"], "plan 'pipedream': --schedule: got 'pipedream'"),
    (["--schedules", "1f1b,interleaved"], "plan 'interleaved'"),
])
def test_bad_compare_flags_are_one_line_errors(capsys, tmp_path, extra, needle):
    assert main(["compare", *FLAGS, *extra, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_progress_draws_on_a_terminal_only():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    with Progress(total=4, stream=tty, delay_s=0.0, interval_s=0.01) as bar:
        bar.update("simulating 2048 GPUs", done=1)
    text = tty.getvalue()
    assert "\rsimulating 2048 GPUs... 25%" in text.replace("\x1b[K", "")
    assert text.endswith("\r\x1b[K")  # the line is erased at the end
    pipe = io.StringIO()
    with Progress(total=4, stream=pipe, delay_s=0.0) as bar:
        bar.update("simulating", done=2)
    assert pipe.getvalue() == ""
    quick = Tty()
    with Progress(total=1, stream=quick, delay_s=10.0) as bar:
        bar.update("quick", done=1)
    assert quick.getvalue() == ""  # nothing for work shorter than the delay


def test_json_is_silent_on_stderr_when_not_a_terminal(capsys):
    assert main(["compare", *FLAGS, "--schedules", "gpipe", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    data = json.loads(out)
    assert data["best"] == "gpipe" and data["rows"][0]["best"] and len(data["plans"]) == 1


def _vpp_of(data: dict) -> dict:
    return {p["name"]: p["summary"]["plan"]["vpp"] for p in data["plans"]}


def test_schedules_give_interleaved_its_own_chunks_and_the_others_one():
    # issue 54: `--schedules 1f1b,interleaved,zb-h2` failed with every flag: interleaved needs vpp > 1,
    # and `--num-virtual-stages-per-pipeline-rank 2` refused the 1F1B plan instead
    eight = [*FLAGS[:FLAGS.index("--num-layers") + 1], "8", *FLAGS[FLAGS.index("--num-layers") + 2:]]
    eight[eight.index("--pipeline-model-parallel-size") + 1] = "2"
    data = json.loads(_stdout("compare", *eight, "--schedules", "1f1b,interleaved,zb-h2", "--json"))
    assert _vpp_of(data) == {"1f1b": 1, "interleaved": 2, "zb-h2": 1}
    data = json.loads(_stdout("compare", *eight, "--schedules", "1f1b,interleaved", "--json",
                              "--num-virtual-stages-per-pipeline-rank", "4"))
    assert _vpp_of(data) == {"1f1b": 1, "interleaved": 4}
    c = sim.compare(model={**TINY, "num_layers": 8}, gpu="h100-sxm", gpus=8, pipeline_model_parallel_size=2,
                    global_batch_size=16, schedules=["gpipe", "interleaved"])
    assert [r.plan.vpp for r in c] == [1, 2]


def test_interleaved_where_the_layers_do_not_split_in_two_chunks_per_stage_says_why(capsys):
    # 4 layers on pp 4: one layer a stage, no second chunk; the plan's own rule explains
    assert main(["compare", *FLAGS, "--schedules", "1f1b,interleaved"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plan 'interleaved'" in err and "needs vpp > 1" in err
