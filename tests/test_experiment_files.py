"""Every example under experiments/ runs through the CLI and agrees with the API; bad
experiment files are one-line errors naming the key and the line, with exit code 2."""

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

import sim
from sim.cli import main

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def _stdout(*argv) -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main([str(a) for a in argv]) == 0
    return buf.getvalue()


def test_every_example_file_is_tested():
    # sweep.toml: docs/search.md quotes `trainsim sweep experiments/sweep.toml`, which tests/test_docs.py runs
    assert sorted(p.name for p in EXPERIMENTS.glob("*.toml")) == ["gpt3-175b-3d.toml", "schedules.toml", "sweep.toml",
                                                                   "zero.toml"]


def _check_outputs(d: Path, summary: dict) -> None:
    """A run's --out files exist and parse, and summary.json is the summary printed."""
    assert json.loads((d / "summary.json").read_text()) == summary
    assert json.loads((d / "trace.json").read_text())["traceEvents"]
    for png in ("timeline.png", "memory.png"):
        assert (d / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", d / png


def test_schedules_example(tmp_path):
    out = tmp_path / "schedules"
    data = json.loads(_stdout("compare", EXPERIMENTS / "schedules.toml", "--json", "--out", out))
    api = sim.compare(EXPERIMENTS / "schedules.toml")
    assert json.loads(api.to_json()) == data
    assert json.loads((out / "compare.json").read_text()) == data
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for p in data["plans"]:
        _check_outputs(out / p["name"], p["summary"])
    # (docs/experiment-files.md quotes this command's table; tests/test_docs.py runs it)
    rows = {r["name"]: r for r in data["rows"]}
    assert list(rows) == ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"]
    assert [p["summary"]["schedule"] for p in data["plans"]] == list(rows)
    assert data["plans"][2]["summary"]["plan"]["vpp"] == 2
    # Published shapes (Narayanan et al. SC'21; Qi et al. ICLR 2024): GPipe and 1F1B take
    # the same time, GPipe holds more activations; interleaving and zero-bubble cut the bubble.
    assert rows["gpipe"]["iteration_time_s"] == pytest.approx(rows["1f1b"]["iteration_time_s"], rel=0.01)
    assert rows["gpipe"]["peak_bytes"] > rows["1f1b"]["peak_bytes"]
    assert rows["interleaved"]["bubble_fraction"] < rows["1f1b"]["bubble_fraction"]
    assert rows["zb-h2"]["bubble_fraction"] < rows["zb-h1"]["bubble_fraction"] < rows["1f1b"]["bubble_fraction"]
    assert sum(r["best"] for r in rows.values()) == 1


def test_zero_example_with_outputs(tmp_path):
    out = tmp_path / "zero"
    text = _stdout("compare", EXPERIMENTS / "zero.toml", "--out", out)
    assert "OOM" in text and "* best:" in text
    data = json.loads((out / "compare.json").read_text())
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"
    for d in ("zero-0", "zero-1", "zero-2", "zero-3"):
        _check_outputs(out / d, next(p["summary"] for p in data["plans"] if p["name"] == d))
    api = sim.compare(EXPERIMENTS / "zero.toml")
    assert json.loads(api.to_json()) == data
    rows = {r["name"]: r for r in data["rows"]}
    assert [rows[f"zero-{z}"]["zero_stage"] for z in range(4)] == [0, 1, 2, 3]
    # ZeRO's model states (Rajbhandari et al. SC'20): 16, 4 + 12/8, 2 + 14/8, 16/8 bytes per parameter.
    states = [rows[f"zero-{z}"]["memory_bytes"]["parameters"] + rows[f"zero-{z}"]["memory_bytes"]["gradients"]
              + rows[f"zero-{z}"]["memory_bytes"]["optimizer"] for z in range(4)]
    assert states[0] > states[1] > states[2] > states[3]
    assert not rows["zero-0"]["fits"] and rows["zero-3"]["fits"]
    assert api.best.name == data["best"] != "zero-0"


def test_gpt3_example(tmp_path):
    cli = _stdout("run", EXPERIMENTS / "gpt3-175b-3d.toml", "--json", "--out", tmp_path / "gpt3").strip()
    r = sim.run(EXPERIMENTS / "gpt3-175b-3d.toml")
    assert r.to_json() == cli
    _check_outputs(tmp_path / "gpt3", r.to_dict())
    s = r.summary
    assert (s["gpus"], s["plan"]["tp"], s["plan"]["pp"], s["plan"]["dp"]) == (1024, 8, 16, 8)
    assert s["fidelity"] == "reduced" and s["fits"] and s["model"] == "gpt3-175b"
    assert 0.2 < s["mfu"] < 0.6


# ---------------------------------------------------------------- bad files
TINY = """[model]
num_layers = 4
hidden_size = 512
num_attention_heads = 8
vocab_size = 8192
seq_length = 512
[cluster]
gpu = "h100-sxm"
gpus = 8
"""
PLANS = """[plan]
pipeline_model_parallel_size = 2
global_batch_size = 8
[[plans]]
name = "a"
schedule = "gpipe"
[[plans]]
name = "b"
schedule = "1f1b"
"""

BAD = {
    # kind: (file text, text the one-line error contains, text of the line it must point at or None)
    "unknown table": (TINY + "[modle]\nx = 1\n" + PLANS, "modle: unknown key", "[modle]"),
    "unknown key": (TINY + PLANS.replace("global_batch_size = 8", "global_batch_size = 8\ncolour = 1"),
                    "plan.colour: unknown key", "colour = 1"),
    "wrong type": (TINY + PLANS.replace("= 8\n[[", "= \"eight\"\n[["),
                   "plan.global_batch_size: got 'eight'; expected an integer", "global_batch_size = \"eight\""),
    "bool for an integer": (TINY.replace("gpus = 8", "gpus = true") + PLANS,
                            "cluster.gpus: got True; expected an integer", "gpus = true"),
    "bad choice": (TINY + "fidelity = \"high\"\n" + PLANS,
                   "cluster.fidelity: got 'high'; allowed: auto, full, reduced", "fidelity = \"high\""),
    "table not a table": ("cluster = 3\n" + PLANS, "cluster: got 3; expected a table [cluster]", "cluster = 3"),
    "missing model": (TINY.split("[cluster]")[1].join(["[cluster]", ""]) + PLANS, "model: missing", None),
    "plans not an array": ("plans = \"gpipe\"\n" + TINY, "plans: got 'gpipe'; expected an array of tables",
                           "plans = \"gpipe\""),
    "plans as one table": (TINY + "[plans]\nname = \"a\"\n", "got a single table [plans]", "[plans]"),
    "empty plans": ("plans = []\n" + TINY, "plans: got an empty array", "plans = []"),
    "duplicate plan names": (TINY + PLANS.replace('name = "b"', 'name = "a"'),
                             "plans[1].name: got 'a' again (first at line", 'name = "a"\nschedule = "1f1b"'),
    "plan without a name": (TINY + PLANS.replace('name = "b"\n', ""), "plans[1].name: missing", "[[plans]]\nschedule"),
    "unknown key in a plan": (TINY + PLANS + "nodes = 2\n", "plans[1].nodes: unknown key", "nodes = 2"),
    "wrong type in a plan": (TINY + PLANS.replace('schedule = "1f1b"', "schedule = [1]"),
                             "plans[1].schedule: got [1]; expected a string", "schedule = [1]"),
    "unknown DeepSpeed key": (TINY + PLANS + "[plans.zero_optimization]\nstag = 3\n",
                              "plans[1].zero_optimization.stag: unknown key", "stag = 3"),
    "plan invalid for the model": (TINY + PLANS.replace('schedule = "1f1b"', "tensor_model_parallel_size = 3"),
                                   "plan 'b': --gpus: got 8; must be a positive multiple", '[[plans]]\nname = "b"'),
    "not TOML": (TINY + "[plan\n", "not valid TOML", None),
}


def _line_of(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_experiment_files_are_one_line_errors(tmp_path, capsys, kind):
    text, message, at = BAD[kind]
    f = tmp_path / "bad.toml"
    f.write_text(text)
    out = tmp_path / "out"
    assert main(["compare", str(f), "--out", str(out)]) == 2, kind
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainsim: error: ") and captured.out == "", (kind, captured)
    assert message in err[0], (kind, err[0])
    if at is not None:
        assert f"{f}:{_line_of(text, at)}: " in err[0], (kind, err[0])
    else:
        assert str(f) in err[0], (kind, err[0])
    assert not out.exists()  # nothing half-written


def test_missing_file_and_run_of_a_file_with_plans(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: file not found" in capsys.readouterr().err
    f = tmp_path / "plans.toml"
    f.write_text(TINY + PLANS)
    assert main(["run", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lists 2 plans (a, b)" in err[0] and f"trainsim compare {f}" in err[0]


def test_flags_after_the_file_override_every_plan(tmp_path):
    f = tmp_path / "plans.toml"
    f.write_text(TINY + PLANS)
    data = json.loads(_stdout("compare", f, "--global-batch-size", "4", "--json"))
    assert [p["summary"]["plan"]["global_batch_size"] for p in data["plans"]] == [4, 4]
    assert [p["summary"]["schedule"] for p in data["plans"]] == ["gpipe", "1f1b"]
    assert [p["summary"]["plan"]["dp"] for p in data["plans"]] == [4, 4]


# ---------------------------------------------------------------- DeepSpeed's offload_optimizer object
ZERO = TINY + """[plan]
global_batch_size = 8
[zero_optimization]
stage = 2
"""


@pytest.mark.parametrize("form", [
    "offload_optimizer = true\n",
    'offload_optimizer = {device = "cpu"}\n',
    'offload_optimizer = {device = "cpu", pin_memory = true}\n',
    '[zero_optimization.offload_optimizer]\ndevice = "cpu"\npin_memory = false\n',
])
def test_offload_optimizer_as_a_boolean_or_deepspeeds_object_is_the_flag(tmp_path, capsys, form):
    f = tmp_path / "offload.toml"
    f.write_text(ZERO + form)
    flag = json.loads(_stdout("run", f, "--json"))
    assert flag == json.loads(_stdout("run", tmp_path / "offload.toml", "--json", "--offload-optimizer"))
    (tmp_path / "plain.toml").write_text(ZERO)
    assert flag == json.loads(_stdout("run", tmp_path / "plain.toml", "--json", "--offload-optimizer"))
    assert flag["plan"]["offload_optimizer"] is True and flag["memory"]["optimizer_bytes"] == 0
    assert flag != json.loads(_stdout("run", tmp_path / "plain.toml", "--json"))  # it does change the result
    assert capsys.readouterr().err == ""  # pin_memory is accepted without a word


@pytest.mark.parametrize("form", ["offload_optimizer = false\n", 'offload_optimizer = {device = "none"}\n',
                                  "offload_optimizer = {pin_memory = true}\n"])  # DeepSpeed's default device: none
def test_offload_optimizer_off_forms(tmp_path, form):
    (tmp_path / "off.toml").write_text(ZERO + form)
    (tmp_path / "plain.toml").write_text(ZERO)
    off = json.loads(_stdout("run", tmp_path / "off.toml", "--json"))
    assert off["plan"]["offload_optimizer"] is False
    assert off == json.loads(_stdout("run", tmp_path / "plain.toml", "--json"))


_NVME_PLAN = TINY + PLANS + '[plans.zero_optimization]\nstage = 1\n[plans.zero_optimization.offload_optimizer]\n' \
                            'device = "nvme"\n'
OFFLOAD_BAD = {
    "nvme": (ZERO + 'offload_optimizer = {device = "nvme", pin_memory = true}\n',
             "zero_optimization.offload_optimizer.device: got 'nvme'; allowed: cpu, none (offload to NVMe is not "
             "modelled)", "offload_optimizer ="),
    "other device": (ZERO + '[zero_optimization.offload_optimizer]\npin_memory = true\ndevice = "gpu"\n',
                     "zero_optimization.offload_optimizer.device: got 'gpu'; allowed: cpu, none", 'device = "gpu"'),
    "nvme in a plan": (_NVME_PLAN, "plans[1].zero_optimization.offload_optimizer.device: got 'nvme'; allowed: cpu, none",
                       'device = "nvme"'),
    "unknown key": (ZERO + 'offload_optimizer = {device = "cpu", nvme_path = "/local_nvme"}\n',
                    "zero_optimization.offload_optimizer.nvme_path: unknown key; allowed keys are device, pin_memory",
                    "offload_optimizer ="),
    "pin_memory not a bool": (ZERO + 'offload_optimizer = {device = "cpu", pin_memory = "yes"}\n',
                              "zero_optimization.offload_optimizer.pin_memory: got 'yes'; expected true or false",
                              "offload_optimizer ="),
    "a string": (ZERO + 'offload_optimizer = "cpu"\n',
                 "zero_optimization.offload_optimizer: got 'cpu'; expected true, false or a table such as "
                 '{device = "cpu"}', "offload_optimizer ="),
}


@pytest.mark.parametrize("kind", list(OFFLOAD_BAD))
def test_bad_offload_optimizer_objects_are_one_line_errors(tmp_path, capsys, kind):
    text, message, at = OFFLOAD_BAD[kind]
    f = tmp_path / "bad.toml"
    f.write_text(text)
    assert main(["compare" if "[[plans]]" in text else "run", str(f)]) == 2, kind
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainsim: error: ") and captured.out == "", (kind, captured)
    assert f"{f}:{_line_of(text, at)}: {message}" in err[0], (kind, err[0])
