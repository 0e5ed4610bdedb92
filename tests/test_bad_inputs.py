"""Every input boundary checks strictly (BAD_INPUTS.md lists what is tried and what comes out).

Each case goes through the real command line: a wrong type, an unknown key, a missing
field, a non-finite or negative number, inconsistent sizes, or a truncated, empty,
binary or non-UTF-8 file must give exit code 2 and exactly one line on stderr,
``trainsim: error: ...``, naming the file (and the line, where there is one), the key and
the value; nothing goes to stdout and no file appears anywhere under the test's folder
(outputs are checked before any work, and written through a temporary name and a rename).
No case gets as far as a simulation or a measurement (the test fails if one starts), so
the module runs in seconds.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest

from sim.cli import main
from sim.errors import InputError

DATA = Path(__file__).resolve().parent / "data"
TOPOLOGIES = Path(__file__).resolve().parent.parent / "topologies"
PROFILE = Path(__file__).resolve().parent.parent / "sim" / "profiles" / "h100-sxm.json"

TINY = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "8192",
        "--seq-length", "512"]
PLAN = ["--gpu", "h100-sxm", "--gpus", "4", "--pipeline-model-parallel-size", "2", "--global-batch-size", "8"]


def _tree(root: Path) -> dict:
    return {p.relative_to(root): (p.is_dir(), p.stat().st_size) for p in sorted(root.rglob("*"))}


@pytest.fixture
def bad(tmp_path, capsys, monkeypatch):
    """``bad(argv, *mentions)``: the CLI exits 2 with one line naming every mention and writes nothing."""
    monkeypatch.chdir(tmp_path)

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the input was checked")

    # Every bad input is caught before any simulation, measurement or reference run.
    import sim.calibrate.profile
    import sim.calibrate.validate
    import sim.studies.collective
    import sim.session

    for mod, name in ((sim.session, "simulate"), (sim.studies.collective, "simulate"),
                      (sim.calibrate.profile, "calibrate"), (sim.calibrate.validate, "run_validation")):
        monkeypatch.setattr(mod, name, no_work)

    def check(argv, *mentions, grid=False):
        """``grid``: a schedule that cannot run may draw its step x rank grid under the line."""
        argv = [str(a) for a in argv]
        before = _tree(tmp_path)
        rc = main(argv)
        cap = capsys.readouterr()
        lines = cap.err.splitlines()
        assert rc == 2, (argv, rc, cap.err)
        assert cap.out == "", (argv, cap.out)
        if grid and len(lines) > 1:
            assert re.match(r"^\s*time \| rank 0 ", lines[1]), cap.err
            lines = lines[:1]
        assert len(lines) == 1 and lines[0].startswith("trainsim: error: "), (argv, cap.err)
        assert "Traceback" not in cap.err
        for m in mentions:
            assert str(m) in lines[0], (argv, m, lines[0])
        assert _tree(tmp_path) == before, (argv, "files were written")
        return lines[0]

    return check


# ---------------------------------------------------------------- broken files, generic
def _write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    p = tmp_path / "in" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")
    return p


def _half(text: str) -> str:
    """The file cut short in the middle of something: a TOML table header if one follows
    the midpoint, else the middle of the line there."""
    mid = len(text) // 2
    header = text.find("\n[", mid)
    if header >= 0:
        return text[: header + 4]
    start, end = text.rfind("\n", 0, mid) + 1, text.find("\n", mid)
    return text[: (start + (end if end >= 0 else len(text))) // 2]


GARBAGE = bytes(range(256)) * 3
"""Binary garbage: every byte value, NULs and invalid UTF-8 included."""


def _latin1(text: str) -> bytes:
    """Valid-looking text with one non-UTF-8 byte (a Latin-1 'é') in a comment or string."""
    return text.replace("dgx", "d\xe9x", 1).encode("latin-1") if "dgx" in text else (
        "# r\xe9sum\xe9\n".encode("latin-1") + text.encode())


def _broken_files(good: str):
    """(class, content) for the file-level classes every loader must reject."""
    return [("empty", ""), ("truncated", _half(good)), ("binary garbage", GARBAGE),
            ("Latin-1 byte", _latin1(good) if not good.lstrip().startswith(("{", "[")) else
             good.replace('"', '"\xe9', 1).encode("latin-1")),
            ("UTF-16", good.encode("utf-16"))]


EXPERIMENT = """[model]
num_layers = 4
hidden_size = 512
num_attention_heads = 8
vocab_size = 8192
seq_length = 512
[cluster]
gpu = "h100-sxm"
gpus = 4
[plan]
pipeline_model_parallel_size = 2
global_batch_size = 8
"""
SWEEP = EXPERIMENT.replace("pipeline_model_parallel_size = 2", "pipeline_model_parallel_size = [1, 2]")
NODE = (TOPOLOGIES / "dgx-a100.toml").read_text()
GRAPH = (TOPOLOGIES / "example-custom.toml").read_text()
PROFILE_TEXT = PROFILE.read_text()
HF = json.dumps({"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
                 "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 8192,
                 "max_position_embeddings": 512}, indent=1)
SCHEDULE = "0F0,0F1,0B0,0F2,0B1,0F3,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n"
NCCL_TEXT = (DATA / "nccl_all_reduce_8gpu.txt").read_text()
NCCL_JSON = (DATA / "nccl_all_reduce_8gpu.json").read_text()
KINETO = gzip.decompress((DATA / "kineto_rank0.json.gz").read_bytes()).decode()

# boundary: (file name, good content, argv with {} where the file goes)
BOUNDARIES = {
    "experiment": ("exp.toml", EXPERIMENT, ["run", "{}", "--out", "out"]),
    "compare": ("cmp.toml", EXPERIMENT, ["compare", "{}", "--out", "out"]),
    "sweep": ("sweep.toml", SWEEP, ["sweep", "{}", "--workers", "0", "--out", "out"]),
    "topology": ("node.toml", NODE, ["collective", "--topology", "{}", "--gpus", "2", "--size", "1MiB",
                                     "--out", "out"]),
    "profile": ("gpu.json", PROFILE_TEXT, ["run", *TINY, *PLAN[2:], "--gpu", "{}", "--out", "out"]),
    "hf-config": ("config.json", HF, ["run", "--hf-config", "{}", *PLAN, "--out", "out"]),
    "schedule": ("mine.csv", SCHEDULE, ["run", *TINY, *PLAN, "--schedule", "{}", "--out", "out"]),
    "nccl-tests text": ("all_reduce.log", NCCL_TEXT, ["import-nccl-tests", "{}", "--profile", "h100-sxm",
                                                      "--out", "out/p.json"]),
    "nccl-tests json": ("all_reduce.json", NCCL_JSON, ["import-nccl-tests", "{}", "--profile", "h100-sxm",
                                                       "--out", "out/p.json"]),
    "kineto": ("rank0.json", KINETO, ["import-trace", "{}", "--out", "out"]),
    "profile to update": ("gpu.json", PROFILE_TEXT, ["import-nccl-tests", str(DATA / "nccl_all_reduce_8gpu.txt"),
                                                     "--profile", "{}", "--out", "out/p.json"]),
}
FILE_CASES = [(b, cls) for b in BOUNDARIES for cls in
              ("empty", "truncated", "binary garbage", "Latin-1 byte", "UTF-16", "missing", "a directory")
              if (b, cls) != ("kineto", "Latin-1 byte")]  # see test_kineto_trace_with_a_stray_byte_loads


def _argv(boundary: str, path) -> list[str]:
    return [str(path) if a == "{}" else a for a in BOUNDARIES[boundary][2]]


@pytest.mark.parametrize("boundary,cls", FILE_CASES, ids=[f"{b}-{c}" for b, c in FILE_CASES])
def test_broken_file(bad, tmp_path, boundary, cls):
    name, good, _ = BOUNDARIES[boundary]
    if cls == "missing":
        path = tmp_path / "in" / name
    elif cls == "a directory":
        path = tmp_path / "in" / name
        path.mkdir(parents=True)
    else:
        path = _write(tmp_path, name, dict(_broken_files(good))[cls])
    bad(_argv(boundary, path), path, grid=boundary == "schedule")


def test_kineto_trace_with_a_stray_byte_loads(tmp_path):
    """Profiler traces are machine-written, and a stray byte that is not UTF-8 (say in a
    kernel name) should not cost the whole trace: the loader replaces it, by design."""
    from sim.calibrate.kineto import load_kineto, op_times

    raw = json.dumps({"traceEvents": [{**_X, "name": "kernel_@"}]}).encode().replace(b"@", b"\xe9")
    path = _write(tmp_path, "rank0.json", raw)
    assert load_kineto(path)["traceEvents"][0]["name"] == "kernel_\ufffd"
    assert list(op_times(path)["ops"]) == ["kernel_\ufffd"]


def test_the_good_files_are_good(tmp_path):
    """The good samples above load, so each broken variant fails for its own reason."""
    from sim.calibrate.kineto import load_kineto
    from sim.calibrate.nccl_tests import load_nccl_tests
    from sim.inputs.hardware import load_profile
    from sim.inputs.hf_config import model_from_hf_config
    from sim.program.schedule_io import load_schedule_csv
    from sim.inputs.topology_build import load_topology

    assert load_profile(_write(tmp_path, "gpu.json", PROFILE_TEXT)).name == "h100-sxm"
    assert model_from_hf_config(_write(tmp_path, "config.json", HF)).num_layers == 4
    assert load_schedule_csv(_write(tmp_path, "mine.csv", SCHEDULE)).num_microbatches == 4
    assert load_topology(str(_write(tmp_path, "node.toml", NODE))).num_gpus == 8
    assert load_topology(str(_write(tmp_path, "graph.toml", GRAPH))).num_gpus == 2
    assert len(load_nccl_tests(_write(tmp_path, "a.log", NCCL_TEXT)).rows) > 10
    assert len(load_nccl_tests(_write(tmp_path, "a.json", NCCL_JSON)).rows) > 10
    assert load_kineto(_write(tmp_path, "k.json", KINETO))["traceEvents"]
    assert main(["estimate", "--hf-config", str(tmp_path / "in" / "config.json"), *PLAN, "--json"]) == 0


# ---------------------------------------------------------------- experiment files
def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def _line(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


EXPERIMENT_CASES = {
    # class: (file text, needle on the line the error points at, mentions)
    "unknown key": (_replace(EXPERIMENT, "gpus = 4", "gpus = 4\ngpu_count = 4"), "gpu_count",
                    ["cluster.gpu_count", "unknown key"]),
    "unknown table": (EXPERIMENT + "[optimizer]\nlr = 1\n", "[optimizer]", ["optimizer", "unknown key"]),
    "wrong type": (_replace(EXPERIMENT, "gpus = 4", 'gpus = "4"'), 'gpus = "4"', ["cluster.gpus", "'4'"]),
    "float for an integer": (_replace(EXPERIMENT, "gpus = 4", "gpus = 4.0"), "gpus = 4.0",
                             ["cluster.gpus", "4.0", "integer"]),
    "nan": (EXPERIMENT.replace("gpus = 4", "gpus = 4\noversubscription = nan"), "oversubscription",
            ["cluster.oversubscription", "nan"]),
    "inf": (EXPERIMENT.replace("gpus = 4", "gpus = 4\noversubscription = inf"), "oversubscription",
            ["cluster.oversubscription", "inf"]),
    "negative": (_replace(EXPERIMENT, "global_batch_size = 8", "global_batch_size = 8\nmicro_batch_size = -1"),
                 "micro_batch_size", ["plan.micro_batch_size", "-1"]),
    "zero": (_replace(EXPERIMENT, "gpus = 4", "gpus = 0"), "gpus = 0", ["cluster.gpus", "0"]),
    "negative model size": (_replace(EXPERIMENT, "num_layers = 4", "num_layers = -4"), "num_layers",
                            ["model.num_layers", "-4"]),
    "negative size string": (_replace(EXPERIMENT, "global_batch_size = 8", 'global_batch_size = 8\nbucket_size = "-5MB"'),
                             "bucket_size", ["plan.bucket_size", "-5MB"]),
    "nan dropout": (_replace(EXPERIMENT, "seq_length = 512", "seq_length = 512\nhidden_dropout = nan"),
                    "hidden_dropout", ["model.hidden_dropout", "nan"]),
    "bad choice": (_replace(EXPERIMENT, "global_batch_size = 8", 'global_batch_size = 8\nschedule = "2f2b"'),
                   "schedule", ["plan.schedule", "2f2b"]),
    "inconsistent sizes": (_replace(EXPERIMENT, "global_batch_size = 8", "global_batch_size = 8\n"
                                    "tensor_model_parallel_size = 3"), "gpus = 4", ["cluster.gpus", "4", "3"]),
    "heads do not divide width": (_replace(EXPERIMENT, "num_attention_heads = 8", "num_attention_heads = 7"),
                                  "num_attention_heads", ["num_attention_heads", "7", "512"]),
    "batch not a multiple": (_replace(EXPERIMENT, "global_batch_size = 8", "global_batch_size = 7"),
                             "global_batch_size", ["global_batch_size", "7"]),
    "unknown preset": ('[model]\npreset = "gpt-5"\n' + EXPERIMENT.split("seq_length = 512\n")[1], "preset",
                       ["model.preset", "gpt-5"]),
    "missing hf_config": ('[model]\nhf_config = "nowhere/config.json"\n' + EXPERIMENT.split("seq_length = 512\n")[1],
                          "hf_config", ["model.hf_config", "nowhere/config.json"]),
    "missing topology": (_replace(EXPERIMENT, "gpus = 4", 'gpus = 4\ntopology = "nowhere.toml"'), "topology",
                         ["cluster.topology", "nowhere.toml"]),
    "missing schedule": (_replace(EXPERIMENT, "global_batch_size = 8", 'global_batch_size = 8\nschedule = "no.csv"'),
                         "schedule", ["plan.schedule", "no.csv"]),
    "missing profile": (_replace(EXPERIMENT, 'gpu = "h100-sxm"', 'gpu = "no.json"'), "gpu =", ["cluster.gpu", "no.json"]),
    "missing model": (EXPERIMENT.split("seq_length = 512\n")[1], None, ["model", "missing"]),
    "only comments": ("# nothing here yet\n", None, ["empty"]),
    "table not a table": ("plan = 3\n" + EXPERIMENT.split("[plan]")[0], "plan = 3", ["plan", "table"]),
    "cut mid-table": (EXPERIMENT.split("[plan]")[0] + "[pla", "[pla", ["TOML"]),
}


@pytest.mark.parametrize("cls", list(EXPERIMENT_CASES))
def test_bad_experiment_file(bad, tmp_path, cls):
    text, needle, mentions = EXPERIMENT_CASES[cls]
    path = _write(tmp_path, "exp.toml", text)
    where = f"{path}:{_line(text, needle)}: " if needle else str(path)
    bad(["run", path, "--out", tmp_path / "out"], where, *mentions)


SWEEP_CASES = {
    "negative in a list": (_replace(SWEEP, "global_batch_size = 8", "global_batch_size = 8\nmicro_batch_size = [1, -2]"),
                           "micro_batch_size", ["plan.micro_batch_size[1]", "-2"]),
    "nan in a list": (_replace(SWEEP, "global_batch_size = 8", "global_batch_size = 8\nzero3_prefetch_depth = [nan]"),
                      "zero3_prefetch_depth", ["plan.zero3_prefetch_depth[0]", "nan"]),
    "empty list": (_replace(SWEEP, "global_batch_size = 8", "global_batch_size = 8\nschedule = []"), "schedule",
                   ["plan.schedule", "empty list"]),
    "list outside the plan": (_replace(SWEEP, "gpus = 4", "gpus = [4, 8]"), "gpus = [", ["cluster.gpus", "list"]),
    "no GPU count": (SWEEP.replace("gpus = 4\n", ""), None, ["cluster.gpus"]),
    "negative GPU count": (_replace(SWEEP, "gpus = 4", "gpus = -4"), "gpus = -4", ["cluster.gpus", "-4"]),
    "unknown key": (_replace(SWEEP, "[plan]", "[plan]\npipeline_parallel = 2"), "pipeline_parallel =",
                    ["plan.pipeline_parallel", "unknown key"]),
    "heads do not divide width": (_replace(SWEEP, "num_attention_heads = 8", "num_attention_heads = 7"),
                                  "num_attention_heads", ["num_attention_heads", "7"]),
    "missing profile": (_replace(SWEEP, 'gpu = "h100-sxm"', 'gpu = "no.json"'), "gpu =", ["cluster.gpu", "no.json"]),
}


@pytest.mark.parametrize("cls", list(SWEEP_CASES))
def test_bad_sweep_file(bad, tmp_path, cls):
    text, needle, mentions = SWEEP_CASES[cls]
    path = _write(tmp_path, "sweep.toml", text)
    where = f"{path}:{_line(text, needle)}: " if needle else str(path)
    bad(["sweep", path, "--workers", "0", "--out", tmp_path / "out"], where, *mentions)


def test_sweep_resume_with_a_garbled_manifest(bad, tmp_path):
    path = _write(tmp_path, "sweep.toml", SWEEP)
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_bytes(b'{"command": "sw')
    bad(["sweep", path, "--workers", "0", "--out", out, "--resume"], out / "manifest.json", "JSON")
    (out / "manifest.json").write_bytes(GARBAGE)
    bad(["sweep", path, "--workers", "0", "--out", out, "--resume"], out / "manifest.json")


# ---------------------------------------------------------------- topology files
TOPOLOGY_CASES = {
    "unknown key": (_replace(NODE, "gpus = 8", "gpus = 8\ncolour = 1"), "colour", ["node.colour", "unknown key"]),
    "missing field": (NODE.replace("gpus = 8\n", ""), None, ["node.gpus", "missing"]),
    "wrong type": (_replace(NODE, "gpus = 8", 'gpus = "8"'), "gpus =", ["node.gpus", "'8'"]),
    "float for an integer": (_replace(NODE, "gpus = 8", "gpus = 8.5"), "gpus =", ["node.gpus", "8.5"]),
    "nan": (_replace(NODE, "nvlink_bandwidth_GBps = 300.0", "nvlink_bandwidth_GBps = nan"), "nvlink_bandwidth",
            ["node.nvlink_bandwidth_GBps", "nan"]),
    "inf": (_replace(NODE, "nvlink_bandwidth_GBps = 300.0", "nvlink_bandwidth_GBps = inf"), "nvlink_bandwidth",
            ["node.nvlink_bandwidth_GBps", "inf"]),
    "negative": (_replace(NODE, "nvlink_latency_us = 1.0", "nvlink_latency_us = -1.0"), "nvlink_latency",
                 ["node.nvlink_latency_us", "-1.0"]),
    "zero bandwidth": (_replace(NODE, "nic_bandwidth_GBps = 25.0", "nic_bandwidth_GBps = 0"), "nic_bandwidth",
                       ["node.nic_bandwidth_GBps", "0"]),
    "bad choice": (_replace(NODE, 'nic_kind = "ib"', 'nic_kind = "wifi"'), "nic_kind", ["node.nic_kind", "wifi"]),
    "table not a table": ("node = 3\n", "node = 3", ["node", "3", "table"]),
    "no tables": ('name = "x"\n', None, ["nothing to build"]),
    "name not a string": ("name = 3\n" + GRAPH, "name = 3", ["name", "3"]),
    "fabric oversubscription": (NODE + "[fabric]\noversubscription = 0.5\n", "oversubscription",
                                ["fabric.oversubscription", "0.5"]),
    "fabric nan": (NODE + "[fabric]\nswitch_latency_us = nan\n", "switch_latency", ["fabric.switch_latency_us", "nan"]),
    "fabric not a table": ("fabric = 1\n" + NODE, "fabric = 1", ["fabric", "table"]),
    "cluster of 0 nodes": ('[cluster]\nnode = "dgx-a100"\nnodes = 0\n', "nodes = 0", ["cluster.nodes", "0"]),
    "cluster of a missing node file": ('[cluster]\nnode = "nowhere.toml"\nnodes = 2\n', "node =",
                                       ["cluster.node", "nowhere.toml"]),
    "cluster not a table": ("cluster = [1, 2]\n", "cluster =", ["cluster", "table"]),
    "devices not tables": ("device = [1, 2]\n", "device =", ["device[0]", "table"]),
    "link to an unknown device": (_replace(GRAPH, 'b = "gpu1"', 'b = "gpu9"'), 'b = "gpu9"', ["link[0].b", "gpu9"]),
    "link with negative bandwidth": (_replace(GRAPH, "bandwidth_GBps = 100.0", "bandwidth_GBps = -100.0"),
                                     "bandwidth_GBps = -100", ["link[0].bandwidth_GBps", "-100"]),
    "gpu ranks with a gap": (_replace(GRAPH, "rank = 1", "rank = 2"), None, ["rank", "2"]),
    "duplicate device": (_replace(GRAPH, 'id = "gpu1"', 'id = "gpu0"'), None, ["device[1].id", "gpu0", "unique"]),
}


@pytest.mark.parametrize("cls", list(TOPOLOGY_CASES))
def test_bad_topology_file(bad, tmp_path, cls):
    text, needle, mentions = TOPOLOGY_CASES[cls]
    path = _write(tmp_path, "topo.toml", text)
    where = f"{path}:{_line(text, needle)}: " if needle else str(path)
    bad(["collective", "--topology", path, "--gpus", "2", "--size", "1MiB", "--out", tmp_path / "out"],
        where, *mentions)


def test_topology_through_an_experiment_file_names_both(bad, tmp_path):
    topo = _write(tmp_path, "topo.toml", _replace(NODE, "gpus = 8", "gpus = -8"))
    exp = _write(tmp_path, "exp.toml", _replace(EXPERIMENT, "gpus = 4", f'gpus = 4\ntopology = "{topo}"'))
    bad(["run", exp, "--out", tmp_path / "out"], topo, "node.gpus", "-8")


# ---------------------------------------------------------------- hardware profiles
def _profile(**changes) -> str:
    d = json.loads(PROFILE_TEXT)
    for key, value in changes.items():
        *parents, leaf = key.split("__")
        t = d
        for p in parents:
            t = t[p]
        if value is _DELETE:
            del t[leaf]
        else:
            t[leaf] = value
    return json.dumps(d, indent=1)


_DELETE = object()
PROFILE_CASES = {
    "unknown key": (_profile(colour=1), ["colour", "unknown key"]),
    "missing key": (_profile(sm_count=_DELETE), ["sm_count", "missing"]),
    "wrong type": (_profile(sm_count="132"), ["sm_count", "'132'"]),
    "float for an integer": (_profile(sm_count=132.5), ["sm_count", "132.5"]),
    "nan": (_profile(hbm_bandwidth_Bps=float("nan")), ["hbm_bandwidth_Bps", "nan"]),
    "inf": (_profile(peak_flops__bf16=float("inf")), ["peak_flops.bf16", "inf"]),
    "negative": (_profile(kernel_launch_s=-1e-6), ["kernel_launch_s", "-1e-06"]),
    "zero capacity": (_profile(hbm_capacity_bytes=0), ["hbm_capacity_bytes", "0"]),
    "fraction above 1": (_profile(links__nvlink__efficiency=1.5), ["links.nvlink.efficiency", "1.5"]),
    "link missing a field": (_profile(links__ib__latency_s=_DELETE), ["links.ib", "latency_s", "missing"]),
    "unknown link kind": (_profile(links__wifi={"latency_s": 0, "bandwidth_Bps": 1, "efficiency": 1}), ["wifi"]),
    "unknown dtype": (_profile(peak_flops__fp6=1e15), ["peak_flops", "fp6"]),
    "bad gemm tiles": (_profile(gemm_tiles=[[128, "x", 1.0]]), ["gemm_tiles"]),
    "fractional tile size": (_profile(gemm_tiles=[[128.5, 128, 1.0]]), ["gemm_tiles", "128.5"]),
    "source not text": (_profile(sources={"name": 3}), ["sources.name", "3"]),
    "not an object": ("[1, 2, 3]", ["JSON object"]),
    "name not a string": (_profile(name=7), ["name", "7"]),
    "memory-bound power below idle": (_profile(memory_bound_power_fraction=0.05),
                                      ["memory_bound_power_fraction", "0.05", "idle power"]),
    "power clock exponent below 1": (_profile(power_clock_exponent=0.5), ["power_clock_exponent", "0.5"]),
    "power cap above the limit": (_profile(power_cap_w=800), ["power_cap_w", "800"]),
}


NO_POWER = _profile(power_limit_w=_DELETE, idle_power_w=_DELETE, sources__power_limit_w=_DELETE,
                    sources__idle_power_w=_DELETE)


@pytest.mark.parametrize("argv,mentions", [
    (["run", *TINY, *PLAN[2:], "--power-limit-w", "500"], ["--power-limit-w", "500", "no power_limit_w"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--rank-by", "tokens-per-joule"],
     ["--rank-by", "tokens-per-joule", "no power figures"]),
], ids=["cap", "rank by energy"])
def test_energy_needs_the_profiles_power_figures(bad, tmp_path, argv, mentions):
    path = _write(tmp_path, "gpu.json", NO_POWER)
    bad([*argv, "--gpu", path], *mentions)


@pytest.mark.parametrize("cls", list(PROFILE_CASES))
def test_bad_profile(bad, tmp_path, cls):
    text, mentions = PROFILE_CASES[cls]
    path = _write(tmp_path, "gpu.json", text)
    bad(["run", *TINY, *PLAN[2:], "--gpu", path, "--out", tmp_path / "out"], path, *mentions)


# ---------------------------------------------------------------- Hugging Face config.json
def _hf(**changes) -> str:
    d = json.loads(HF)
    for k, v in changes.items():
        if v is _DELETE:
            del d[k]
        else:
            d[k] = v
    return json.dumps(d)


NEMOTRON_H = {"model_type": "nemotron_h", "hidden_size": 512, "num_hidden_layers": 4, "hybrid_override_pattern": "M*-E",
              "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 1024,
              "mamba_num_heads": 16, "mamba_head_dim": 64, "ssm_state_size": 64, "n_groups": 2, "vocab_size": 8192,
              "max_position_embeddings": 512}
MAMBA2 = {"model_type": "mamba2", "hidden_size": 192, "num_hidden_layers": 4, "num_heads": 6, "head_dim": 64,
          "expand": 2, "state_size": 64, "n_groups": 1, "vocab_size": 8192}
GPT2 = {"model_type": "gpt2", "n_embd": 512, "n_layer": 4, "n_head": 8, "n_positions": 512, "vocab_size": 8192}
HF_CASES = {
    "wrong type": (_hf(hidden_size="512"), ["hidden_size", "'512'"]),
    "float for an integer": (_hf(hidden_size=512.0), ["hidden_size", "512.0"]),
    "nan": (_hf(num_attention_heads=float("nan")), ["num_attention_heads", "nan"]),
    "negative": (_hf(num_hidden_layers=-4), ["num_hidden_layers", "-4"]),
    "missing field": (_hf(vocab_size=_DELETE), ["vocab_size", "missing"]),
    "heads do not divide width": (_hf(num_attention_heads=7, num_key_value_heads=7), ["num_attention_heads", "7"]),
    "kv heads do not divide heads": (_hf(num_key_value_heads=3), ["num_key_value_heads", "3"]),
    "unsupported model_type": (_hf(model_type="bert"), ["model_type", "bert"]),
    "not an object": ("[512, 4]", ["JSON object"]),
    "bool field not a bool": (_hf(tie_word_embeddings="yes"), ["tie_word_embeddings", "yes"]),
    "bias flag not a bool": (_hf(attention_bias="no"), ["attention_bias", "no"]),
    "gpt2 dropout not a number": (json.dumps({**GPT2, "resid_pdrop": "x"}), ["resid_pdrop", "'x'"]),
    "gpt2 dropout nan": (json.dumps({**GPT2, "attn_pdrop": float("nan")}), ["attn_pdrop", "nan"]),
    "gpt2 dropout negative": (json.dumps({**GPT2, "embd_pdrop": -0.1}), ["embd_pdrop", "-0.1"]),
    "name not a string": (_hf(_name_or_path=["a"]), ["_name_or_path", "['a']"]),
    # layer kinds (issue 53): an unknown kind in a hybrid pattern, a window longer than the sequence
    "unknown layer kind": (json.dumps(NEMOTRON_H), ["hybrid_override_pattern[3]", "'E'", "allowed layer kinds"]),
    "window larger than the sequence": (_hf(model_type="mistral", sliding_window=1024),
                                        ["sliding_window", "1024", "seq_length 512"]),
}


@pytest.mark.parametrize("cls", list(HF_CASES))
def test_bad_hf_config(bad, tmp_path, cls):
    text, mentions = HF_CASES[cls]
    path = _write(tmp_path, "config.json", text)
    bad(["run", "--hf-config", path, *PLAN, "--out", tmp_path / "out"], path, *mentions)


@pytest.mark.parametrize("flags,mentions", [
    (["--tensor-model-parallel-size", "4"], ["--tensor-model-parallel-size", "4", "mamba2 heads 6"]),
    (["--context-parallel-size", "2"], ["--context-parallel-size", "2", "Mamba layers"]),
])
def test_mamba_layer_plan_rules(bad, tmp_path, flags, mentions):
    path = _write(tmp_path, "config.json", json.dumps(MAMBA2))
    bad(["estimate", "--hf-config", path, "--seq-length", "512", "--gpu", "h100-sxm", "--gpus", "4",
         "--global-batch-size", "8", *flags], *mentions)


@pytest.mark.parametrize("flags,mentions", [
    # a hybrid layer pattern (Megatron-Core's letters, issue 53): one line each, exit 2
    (["--hybrid-override-pattern", "M-M"], ["--hybrid-override-pattern", "'M-M'", "has 3 layers", "--num-layers is 4"]),
    (["--hybrid-override-pattern", "M-Mx"], ["--hybrid-override-pattern", "'x'", "allowed: M (Mamba-2)"]),
    (["--hybrid-override-pattern", "M-M*/M"], ["--hybrid-override-pattern", "MTP patterns"]),
    (["--hybrid-override-pattern", "M-*E"], ["--hybrid-override-pattern", "needs --num-experts"]),
    (["--hybrid-override-pattern", "M-|M*", "--layer-split", "1,3"], ["--hybrid-override-pattern", "--layer-split"]),
    (["--hybrid-override-pattern", "M-M*", "--mamba-num-groups", "3"], ["--mamba-num-groups", "3", "heads 16"]),
    (["--mamba-state-dim", "64"], ["--mamba-state-dim", "64", "--hybrid-override-pattern"]),
    (["--pipeline-model-parallel-layout", "EM-|M*L"], ["--pipeline-model-parallel-layout", "every decoder layer t"]),
])
def test_bad_hybrid_pattern(bad, flags, mentions):
    bad(["estimate", *TINY, *PLAN, *flags], *mentions)


def test_search_refuses_a_pattern_that_fixes_the_stages(bad):
    bad(["search", *TINY, "--gpu", "h100-sxm", "--gpus", "4", "--global-batch-size", "8",
         "--hybrid-override-pattern", "M-|M*"], "--hybrid-override-pattern", "the search chooses them")


def test_hybrid_pattern_is_for_megatron_shapes_only(bad):
    bad(["estimate", "--model", "llama3-8b", *PLAN, "--hybrid-override-pattern", "M" * 32],
        "--hybrid-override-pattern", "Megatron shape flags")


def test_seq_length_beyond_learned_positions_names_the_file(bad, tmp_path):
    path = _write(tmp_path, "config.json", json.dumps(GPT2))
    bad(["estimate", "--hf-config", path, *PLAN, "--seq-length", "1024"], path, "seq_length", "1024")


def test_megatron_args_are_strict():
    from sim.inputs.resolve import model_from_megatron_args

    for argv, says in ((["--num-layers", "4", "--hidden-size", "x"], "--hidden-size: got 'x'"),
                       (["--num-layers", "-4"], "--num-layers: got -4"),
                       (["--attention-dropout", "nan"], "--attention-dropout: got nan"),
                       (["--num-layers", "4", "--colour", "red"], "--colour"),
                       (["--num-layers", "4"], "--hidden-size")):
        with pytest.raises(InputError) as e:
            model_from_megatron_args(argv)
        assert says in str(e.value) and "\n" not in str(e.value), (argv, str(e.value))


# ---------------------------------------------------------------- schedule CSVs
SCHEDULE_CASES = {
    "bad cell": ("0F0,0X1\n1F0,1B0\n", ["line 1, cell 2", "0X1"]),
    "cut mid-cell": (SCHEDULE[:-3], ["line 2, cell 8", "'1'"]),
    "stages not a multiple of ranks": ("0F0,0B0\n1F0,2F0\n", ["highest stage is 2"]),
    "wrong pipeline size": ("0F0,0B0,0F1,0B1,0F2,0B2,0F3,0B3\n", ["pp=1", "pp=2"]),
    "wrong micro-batch count": ("0F0,0B0\n1F0,1B0\n", ["m=1", "m=4"]),
    "only comments": ("# nothing\n", ["no rows"]),
    "a step on the wrong rank": (SCHEDULE.replace("1F3", "0F3", 1), ["0F3", "rank 1"]),
}


@pytest.mark.parametrize("cls", list(SCHEDULE_CASES))
def test_bad_schedule_csv(bad, tmp_path, cls):
    text, mentions = SCHEDULE_CASES[cls]
    path = _write(tmp_path, "mine.csv", text)
    bad(["run", *TINY, *PLAN, "--schedule", path, "--out", tmp_path / "out"], path, *mentions, grid=True)


def test_deadlocked_schedule_names_the_file_first_and_draws_the_grid(tmp_path, capsys):
    """The one deliberate exception to one line: a schedule that jams prints the step x
    rank grid under its one-line error (as PyTorch's validator does); nothing is written."""
    path = _write(tmp_path, "jam.csv", "0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n")
    out = tmp_path / "out"
    assert main(["run", *TINY, *PLAN[:-1], "4", "--schedule", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"trainsim: error: {path}: schedule jam") and "deadlock" in err[0]
    assert err[-1].startswith("stuck") and not out.exists()


# ---------------------------------------------------------------- nccl-tests logs
def _nccl_json(result0=None, **changes) -> str:
    d = json.loads(NCCL_JSON)
    d.update(changes)
    if result0 is not None:
        d["results"][0] = {**d["results"][0], **result0}
    return json.dumps(d, indent=1)


def _oop(**changes) -> dict:
    """The first result's out-of-place measurement with ``changes``."""
    return {"out_of_place": {**json.loads(NCCL_JSON)["results"][0]["out_of_place"], **changes}}


_LINES = NCCL_TEXT.splitlines()
_ROW = 20  # line 21: the 512-byte row


def _nccl_row(column: int, value: str) -> str:
    toks = _LINES[_ROW].split()
    toks[column] = value
    return "\n".join(_LINES[:_ROW] + ["   ".join(toks)] + _LINES[_ROW + 1:]) + "\n"


def _rccl(**changes) -> str:
    lines = (DATA / "rccl_all_reduce.jsonl").read_text().splitlines()
    return "\n".join([json.dumps({**json.loads(lines[0]), **changes})] + lines[1:]) + "\n"


NCCL_CASES = {
    "text: cut inside a row": ("all_reduce.log", "\n".join(_LINES[:_ROW] + [_LINES[_ROW][:60]]) + "\n",
                               ["line 21", "truncated"]),
    "text: nan time": ("all_reduce.log", _nccl_row(5, "nan"), ["line 21", "time", "nan"]),
    "text: inf busbw": ("all_reduce.log", _nccl_row(7, "inf"), ["line 21", "busbw", "inf"]),
    "text: negative time": ("all_reduce.log", _nccl_row(5, "-35.00"), ["line 21", "time", "-35"]),
    "text: negative algbw": ("all_reduce.log", _nccl_row(6, "-0.01"), ["line 21", "algbw", "-0.01"]),
    "text: header only": ("all_reduce.log", "\n".join(_LINES[:17]) + "\n", ["no result rows"]),
    "text: no op anywhere": ("results.log", NCCL_TEXT.replace("all_reduce_perf", "perf"), ["op"]),
    "json: results not a list": ("all_reduce.json", _nccl_json(results={"size": 8}), ["results"]),
    "json: result not an object": ("all_reduce.json", _nccl_json(results=[8, 16]), ["results[0]"]),
    "json: nan time": ("all_reduce.json", _nccl_json(_oop(time=float("nan"))), ["results[0]", "time", "nan"]),
    "json: negative time": ("all_reduce.json", _nccl_json(_oop(time=-35.0)), ["results[0]", "time", "-35"]),
    "json: inf bus_bw": ("all_reduce.json", _nccl_json(_oop(bus_bw=float("inf"))), ["results[0]", "bus_bw", "inf"]),
    "json: negative size": ("all_reduce.json", _nccl_json({"size": -8}), ["results[0]", "size", "-8"]),
    "json: size not an integer": ("all_reduce.json", _nccl_json({"size": "8B"}), ["results[0]", "size", "8B"]),
    "json: empty results": ("all_reduce.json", _nccl_json(results=[]), ["results", "empty"]),
    "json: config not an object": ("all_reduce.json", _nccl_json(config=3), ["config"]),
    "json: average not an object": ("all_reduce.json", _nccl_json(average_bus_bandwidth=3),
                                    ["average_bus_bandwidth"]),
    "json: args not a list": ("results.json", _nccl_json(args="all_reduce_perf"), ["args"]),
    "rccl: empty list": ("rccl.json", "[]", ["no result"]),
    "rccl: record not an object": ("rccl.json", "[1, 2]", ["record 0"]),
    "rccl: nan busBw": ("rccl.json", _rccl(busBw=float("nan")), ["record 0", "busBw", "nan"]),
    "rccl: negative time": ("rccl.json", _rccl(time=-1.0), ["record 0", "time", "-1.0"]),
}


@pytest.mark.parametrize("cls", list(NCCL_CASES))
def test_bad_nccl_tests_log(bad, tmp_path, cls):
    name, text, mentions = NCCL_CASES[cls]
    path = _write(tmp_path, name, text)
    bad(["import-nccl-tests", path, "--profile", "h100-sxm", "--out", tmp_path / "out" / "p.json"], path, *mentions)


def test_nccl_tests_sizes_all_below_min_size(bad, tmp_path):
    bad(["import-nccl-tests", DATA / "nccl_all_reduce_8gpu.txt", "--min-size", "1TiB"], "--min-size", "1TiB")


# ---------------------------------------------------------------- Kineto traces
def _kineto(events, **extra) -> str:
    return json.dumps({"traceEvents": events, **extra})


_X = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10.0, "dur": 5.0, "pid": 1, "tid": 1}
KINETO_CASES = {
    "no traceEvents": (json.dumps({"events": []}), ["traceEvents", "missing"]),
    "traceEvents not a list": (json.dumps({"traceEvents": {"a": 1}}), ["traceEvents"]),
    "event not an object": (_kineto([_X, 3]), ["traceEvents[1]", "3"]),
    "ts not a number": (_kineto([{**_X, "ts": "soon"}]), ["traceEvents[0]", "ts", "soon"]),
    "nan ts": (_kineto([{**_X, "ts": float("nan")}]), ["traceEvents[0]", "ts", "nan"]),
    "inf dur": (_kineto([{**_X, "dur": float("inf")}]), ["traceEvents[0]", "dur", "inf"]),
    "negative dur": (_kineto([{**_X, "dur": -5}]), ["traceEvents[0]", "dur", "-5"]),
    "missing name": (_kineto([{k: v for k, v in _X.items() if k != "name"}]), ["traceEvents[0]", "name"]),
    "name not a string": (_kineto([{**_X, "name": 7}]), ["traceEvents[0]", "name", "7"]),
    "negative rank": (_kineto([_X], distributedInfo={"rank": -1}), ["distributedInfo.rank", "-1"]),
    "no events to draw": (_kineto([]), ["no events"]),
}


@pytest.mark.parametrize("cls", list(KINETO_CASES))
def test_bad_kineto_trace(bad, tmp_path, cls):
    text, mentions = KINETO_CASES[cls]
    path = _write(tmp_path, "rank0.json", text)
    bad(["import-trace", path, "--out", tmp_path / "out"], path, *mentions)


@pytest.mark.parametrize("cls", ["truncated gzip", "garbled gzip", "gzip of garbage"])
def test_bad_gzipped_kineto_trace(bad, tmp_path, cls):
    raw = (DATA / "kineto_rank0.json.gz").read_bytes()
    content = {"truncated gzip": raw[: len(raw) // 2],
               "garbled gzip": raw[:20] + bytes(200) + raw[220:],
               "gzip of garbage": gzip.compress(GARBAGE)}[cls]
    path = _write(tmp_path, "rank0.json.gz", content)
    bad(["import-trace", path, "--out", tmp_path / "out"], path)


def test_two_traces_claiming_one_rank(bad, tmp_path):
    path = DATA / "kineto_rank0.json.gz"
    bad(["import-trace", path, path, "--out", tmp_path / "out"], "rank", "same rank")


# ---------------------------------------------------------------- replayed traces
def _replay_doc(kernels=True, rank=0, world=2, device="NVIDIA H100 80GB HBM3", collective=True, extra=()):
    """A small Kineto trace of one data-parallel rank: a kernel, then an all-reduce."""
    ev = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 0, "dur": 2,
           "args": {"correlation": 1}}]
    if kernels:
        ev.append({"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 0, "tid": 7, "ts": 5, "dur": 100,
                   "args": {"stream": 7, "correlation": 1}})
    if kernels and collective:
        ev += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernelExC", "pid": 1, "tid": 1, "ts": 3,
                "dur": 2, "args": {"correlation": 2}},
               {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 20, "ts": 105,
                "dur": 50, "args": {"stream": 20, "correlation": 2, "Collective name": "allreduce",
                                    "In msg nelems": 1024, "Out msg nelems": 1024, "dtype": "BFloat16",
                                    "Process Group Ranks": str(list(range(world)))}}]
    return json.dumps({"distributedInfo": {"rank": rank, "world_size": world},
                       "deviceProperties": [{"id": 0, "name": device}], "traceEvents": ev + list(extra)})


REPLAY_CASES = {
    # name: ({file: text}, extra flags, mentions)
    "not a trace": ({"rank0.json": '{"hello": 1}'}, [], ["in/rank0.json", "traceEvents: missing"]),
    "truncated trace": ({"rank0.json": _replay_doc()[:150]}, [], ["in/rank0.json", "not valid JSON"]),
    "no GPU kernels": ({"rank0.json": _replay_doc(kernels=False)}, [], ["in/rank0.json", "no GPU kernels"]),
    "jobs mixed": ({"rank0.json": _replay_doc(), "rank1.json": _replay_doc(rank=1, world=4)}, [],
                   ["in/rank1.json", "world size", "got 4", "mixed"]),
    "one rank twice": ({"rank0.json": _replay_doc(), "rank0b.json": _replay_doc()}, [],
                       ["in/rank0b.json", "rank 0", "same rank"]),
    "correlation not an id": ({"rank0.json": _replay_doc().replace('"correlation": 1}', '"correlation": [1]}', 1)},
                              [], ["in/rank0.json", "traceEvents[0]", "args.correlation", "[1]"]),
    "a step without GPU work": (  # (its one step begins after the kernel's launch)
        {"rank0.json": _replay_doc(extra=[{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1,
                                           "tid": 1, "ts": 1000, "dur": 50}])},
        [], ["in/rank0.json", "ProfilerStep#4", "no GPU work"]),
    "no such step": ({"rank0.json": _replay_doc()}, ["--step", "3"], ["in/rank0.json", "--step: got 3", "ProfilerStep"]),
    "rank beyond the world": ({"rank0.json": _replay_doc(rank=5)}, [], ["in/rank0.json", "rank: got 5", "world size is 2"]),
    "GPU without a profile": ({"rank0.json": _replay_doc(device="Tesla V100-SXM2-32GB")}, [],
                              ["in/rank0.json", "deviceProperties", "V100", "--gpu"]),
    "data parallelism without gradient collectives": (
        {"rank0.json": _replay_doc(collective=False, world=1)}, ["--data-parallel-size", "2"],
        ["in/rank0.json", "--data-parallel-size", "no all-reduce"]),
    "zero data-parallel replicas": ({"rank0.json": _replay_doc()}, ["--data-parallel-size", "0"],
                                    ["--data-parallel-size", "got 0"]),
    # --gpus: the what-if world size, in whole data-parallel replicas (1 GPU each here)
    "zero GPUs": ({"rank0.json": _replay_doc()}, ["--gpus", "0"], ["--gpus", "got 0"]),
    "GPUs against the replicas": ({"rank0.json": _replay_doc()}, ["--gpus", "4", "--data-parallel-size", "3"],
                                  ["--gpus: got 4", "--data-parallel-size 3", "expected 3"]),
    "more GPUs than the nodes hold": ({"rank0.json": _replay_doc()}, ["--gpus", "16", "--nodes", "1"],
                                      ["--gpus: got 16", "8 GPUs", "--nodes 1"]),
    "GPUs without gradient collectives": (
        {"rank0.json": _replay_doc(collective=False, world=1)}, ["--gpus", "2"],
        ["in/rank0.json", "--gpus", "no all-reduce"]),
}


@pytest.mark.parametrize("cls", list(REPLAY_CASES))
def test_bad_replay(bad, tmp_path, monkeypatch, cls):
    import sim.engine.core

    monkeypatch.setattr(sim.engine.core, "simulate", lambda *a, **k: pytest.fail("replay started"))
    files, flags, mentions = REPLAY_CASES[cls]
    paths = [_write(tmp_path, name, text) for name, text in files.items()]
    bad(["replay", *paths, *flags, "--out", tmp_path / "out"], *mentions)


# ---------------------------------------------------------------- command-line flags
RUN = ["run", *TINY, *PLAN]
FLAG_CASES = [
    # (argv, mentions)
    (RUN + ["--gpus", "-4"], ["--gpus", "-4"]),
    (RUN + ["--gpus", "0"], ["--gpus", "0"]),
    (RUN + ["--gpus", "four"], ["--gpus", "four"]),
    (RUN + ["--gpus", "4.5"], ["--gpus", "4.5"]),
    (RUN + ["--tensor-model-parallel-size", "0"], ["--tensor-model-parallel-size", "0"]),
    (RUN + ["--pipeline-model-parallel-size", "-2"], ["--pipeline-model-parallel-size", "-2"]),
    (RUN + ["--micro-batch-size", "0"], ["--micro-batch-size", "0"]),
    (RUN + ["--global-batch-size", "-8"], ["--global-batch-size", "-8"]),
    (RUN + ["--global-batch-size", "7"], ["--global-batch-size: got 7", "micro_batch_size x dp"]),
    (RUN + ["--gpus-per-node", "0"], ["--gpus-per-node", "0"]),
    (RUN + ["--nodes", "0"], ["--nodes", "0"]),
    (RUN + ["--nodes", "-1"], ["--nodes", "-1"]),
    (RUN + ["--oversubscription", "nan"], ["--oversubscription", "nan"]),
    (RUN + ["--oversubscription", "inf"], ["--oversubscription", "inf"]),
    (RUN + ["--oversubscription", "-2"], ["--oversubscription", "-2"]),
    (RUN + ["--bucket-size", "nan"], ["--bucket-size", "nan"]),
    (RUN + ["--bucket-size=-25MB"], ["--bucket-size", "-25MB"]),
    (RUN + ["--bucket-size", "-25MB"], ["--bucket-size: expected one argument", "--bucket-size=-VALUE"]),
    (RUN + ["--bucket-size", "25 parsecs"], ["--bucket-size", "25 parsecs"]),
    (RUN + ["--zero", "1", "--zero-bucket-size", "inf"], ["--zero-bucket-size", "inf"]),
    (RUN + ["--zero", "3", "--zero3-prefetch-depth", "-1"], ["--zero3-prefetch-depth", "-1"]),
    (RUN + ["--zero", "3", "--zero3-prefetch-bucket-size", "nan"], ["--zero3-prefetch-bucket-size", "nan"]),
    (RUN + ["--zero", "3", "--zero3-max-live-parameters=-1e9"], ["--zero3-max-live-parameters", "-1e9"]),
    (RUN + ["--zero", "5"], ["--zero", "5", "0, 1, 2, 3"]),
    (RUN + ["--gpus", "12", "--pipeline-model-parallel-size", "1", "--global-batch-size", "12", "--num-experts", "4",
            "--expert-model-parallel-size", "2", "--zero", "3"],                  # 2 experts a rank over edp 6
     ["--expert-model-parallel-size", "got 2", "2 experts", "6 expert data-parallel ranks", "width 2048"]),
    # --overlap-moe-expert-parallel-comm: what Megatron-Core refuses with it
    (RUN + ["--overlap-moe-expert-parallel-comm"], ["--overlap-moe-expert-parallel-comm", "expert parallelism",
                                                    "ep 1"]),
    (RUN + ["--pipeline-model-parallel-size", "1", "--expert-model-parallel-size", "2",
            "--overlap-moe-expert-parallel-comm"], ["--overlap-moe-expert-parallel-comm", "no experts"]),
    (RUN + ["--num-experts", "4", "--expert-model-parallel-size", "2", "--overlap-moe-expert-parallel-comm"],
     ["--overlap-moe-expert-parallel-comm", "pp 2", "interleaved"]),
    (RUN + ["--pipeline-model-parallel-size", "1", "--num-experts", "4", "--expert-model-parallel-size", "2",
            "--schedule", "gpipe", "--overlap-moe-expert-parallel-comm"],
     ["--overlap-moe-expert-parallel-comm", "schedule gpipe"]),
    (RUN + ["--pipeline-model-parallel-size", "1", "--num-experts", "4", "--expert-model-parallel-size", "2",
            "--recompute-granularity", "full", "--overlap-moe-expert-parallel-comm"],
     ["--overlap-moe-expert-parallel-comm", "recompute_granularity full"]),
    (RUN + ["--pipeline-model-parallel-size", "1", "--num-experts", "4", "--expert-model-parallel-size", "2",
            "--mtp-num-layers", "2", "--overlap-moe-expert-parallel-comm"],
     ["--overlap-moe-expert-parallel-comm", "multi-token-prediction", "has 2"]),
    (RUN + ["--pipeline-model-parallel-size", "1", "--num-experts", "4", "--expert-model-parallel-size", "2",
            "--recompute-granularity", "selective", "--recompute-modules", "moe", "--overlap-moe-expert-parallel-comm"],
     ["--overlap-moe-expert-parallel-comm", "--recompute-modules moe"]),
    (RUN + ["--moe-token-dispatcher-type", "deepep"], ["--moe-token-dispatcher-type", "deepep", "alltoall, allgather, flex"]),
    (RUN + ["--moe-token-dispatcher-type", "flex"], ["--moe-token-dispatcher-type", "flex", "expert parallelism"]),
    (RUN + ["--num-experts", "4", "--moe-token-dispatcher-type", "allgather"],
     ["--moe-token-dispatcher-type", "allgather", "expert_model_parallel_size > 1"]),
    # CUDA graphs and the MoE layer's kernels (sim.inputs.cuda_graphs, sim.inputs.experts)
    (RUN + ["--cuda-graph", "layer"], ["--cuda-graph", "layer", "full, attn, mlp, moe"]),
    (RUN + ["--cuda-graph", "moe"], ["--cuda-graph", "moe", "no experts"]),
    (RUN + ["--num-experts", "4", "--cuda-graph", "moe"], ["--cuda-graph", "moe", "drop-padding",
                                                           "moe_expert_capacity_factor"]),
    (RUN + ["--num-experts", "4", "--cuda-graph", "full"], ["--cuda-graph", "full", "drop-padding"]),
    (RUN + ["--num-experts", "4", "--cuda-graph", "moe_preprocess"], ["--cuda-graph", "moe_preprocess", "moe_router"]),
    (RUN + ["--num-experts", "4", "--cuda-graph", "moe", "moe_router"], ["--cuda-graph", "moe moe_router", "not both"]),
    (RUN + ["--num-experts", "4", "--cuda-graph", "mlp"], ["--cuda-graph", "mlp", "no dense layer"]),
    (RUN + ["--recompute-granularity", "full", "--cuda-graph", "attn"], ["--cuda-graph", "attn", "full_iteration"]),
    (RUN + ["--num-experts", "4", "--moe-shared-expert-overlap"], ["--moe-shared-expert-overlap", "no shared experts"]),
    # which framework ran (sim.inputs.frameworks)
    (RUN + ["--framework", "colossalai"], ["--framework", "colossalai",
                                           "megatron, torchtitan, automodel, llm-foundry, deepspeed"]),
    # DeepSpeed: its own settings only under it, and under it none of FSDP's or Megatron-LM's
    (RUN + ["--framework", "deepspeed", "--zero", "3"], ["--pipeline-model-parallel-size", "2",
                                                         "incompatible with pipeline parallelism"]),
    (RUN[:-4] + ["--framework", "deepspeed", "--zero", "3", "--zero3-param-persistence-threshold", "-1"],
     ["--zero3-param-persistence-threshold", "-1", ">= 0"]),
    (RUN[:-4] + ["--framework", "deepspeed", "--zero", "3", "--zero3-max-reuse-distance", "nan"],
     ["--zero3-max-reuse-distance", "nan", ">= 0"]),
    (RUN + ["--zero", "3", "--zero3-param-persistence-threshold", "1e5"],
     ["--zero3-param-persistence-threshold", "needs framework deepspeed (got megatron)"]),
    (RUN + ["--overlap-comm"], ["--overlap-comm", "needs framework deepspeed"]),
    (RUN[:-4] + ["--framework", "deepspeed", "--zero", "3", "--backward-prefetch", "backward_post"],
     ["--backward-prefetch", "backward_post", "not a setting of framework deepspeed"]),
    (RUN[:-4] + ["--framework", "deepspeed", "--zero", "3", "--zero3-prefetch-depth", "2"],
     ["--zero3-prefetch-depth", "2", "not a setting of framework deepspeed", "--zero3-prefetch-bucket-size"]),
    (RUN[:-4] + ["--framework", "deepspeed", "--zero", "3", "--no-reshard-after-forward"],
     ["--reshard-after-forward", "not a setting of framework deepspeed"]),
    (RUN[:-4] + ["--framework", "deepspeed", "--zero", "3", "--fp8-format", "hybrid", "--fp8-param-gather"],
     ["--fp8-param-gather", "not a setting of framework deepspeed"]),
    (RUN + ["--framework", "deepspeed", "--no-overlap-grad-reduce"],
     ["--overlap-grad-reduce", "not a setting of framework deepspeed", "overlap_comm"]),
    (RUN[:-4] + ["--framework", "deepspeed", "--zero", "3", "--num-experts", "4", "--expert-model-parallel-size", "2"],
     ["--framework", "deepspeed", "not modelled", "experts"]),
    (RUN + ["--attention-kernel", "fa3"], ["--attention-kernel", "fa3", "te, fa2, triton"]),
    (RUN + ["--attention-kernel", "fa2", "--attention", "unfused"], ["--attention-kernel", "fa2", "attention flash"]),
    (RUN + ["--framework", "torchtitan", "--gpu", "b200"], ["--attention-kernel", "fa2", "profile b200", "te"]),
    (RUN + ["--backward-prefetch", "backward_post"], ["--backward-prefetch", "backward_post", "zero 3 (got 0)"]),
    (RUN + ["--zero", "3", "--backward-prefetch", "post"], ["--backward-prefetch", "post", "backward_pre, backward_post"]),
    (RUN + ["--zero", "2", "--no-reshard-after-forward"], ["--reshard-after-forward", "zero 3 (got 2)"]),
    (RUN + ["--recompute-granularity", "most"], ["--recompute-granularity", "most"]),
    (RUN + ["--recompute-granularity", "selective", "--recompute-modules", "attn"],
     ["--recompute-modules", "'attn'", "core_attn, layernorm"]),
    (RUN + ["--recompute-granularity", "full", "--recompute-modules", "mlp"],
     ["--recompute-modules", "'mlp'", "selective (got full)"]),
    (RUN + ["--recompute-granularity", "selective", "--recompute-modules", "moe_act"],
     ["--recompute-modules", "'moe_act'", "no experts"]),
    (RUN + ["--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj"],
     ["--recompute-modules", "'mla_up_proj'", "(MLA)"]),
    (RUN + ["--num-virtual-stages-per-pipeline-rank", "0"], ["--num-virtual-stages-per-pipeline-rank", "0"]),
    (RUN + ["--decoder-first-pipeline-num-layers", "-1"], ["--decoder-first-pipeline-num-layers", "-1"]),
    (RUN + ["--placement", "tp-tp-dp"], ["placement", "tp-tp-dp"]),
    (RUN + ["--fidelity", "high"], ["--fidelity", "high"]),
    (RUN + ["--attention-dropout", "nan"], ["--attention-dropout", "nan"]),
    (RUN + ["--hidden-dropout", "1.5"], ["--hidden-dropout", "1.5"]),
    (RUN + ["--seq-length", "0"], ["--seq-length", "0"]),
    (["run", *TINY[:-2], "--seq-length", "-512", *PLAN], ["--seq-length", "-512"]),
    (["run", *TINY[:2], *PLAN], ["--hidden-size"]),
    (RUN + ["--model", "llama2-7b"], ["--model", "Megatron"]),
    (["run", "--model", "gpt-5", *PLAN], ["--model", "gpt-5"]),
    (RUN + ["--gpu", "b300"], ["gpu", "b300"]),
    (RUN + ["--topology", "dgx-z100"], ["topology", "dgx-z100"]),
    (RUN + ["--gpus", "16", "--nodes", "1"], ["--gpus", "16"]),
    (RUN + ["--no-such-flag"], ["--no-such-flag"]),
    (RUN + ["--nccl-algo", "collnet"], ["--nccl-algo", "collnet", "allowed"]),
    (RUN + ["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"], ["--fp8-recipe", "mxfp8", "h100-sxm", "allowed on h100-sxm"]),
    (RUN + ["--fp8-recipe", "mxfp4"], ["--fp8-recipe", "mxfp4", "delayed"]),
    (RUN + ["--fp8-recipe", "tensorwise"], ["--fp8-recipe", "tensorwise", "fp8_format"]),
    (RUN + ["--transformer-engine", "2.x"], ["--transformer-engine", "'2.x'", "release number such as 2.9"]),
    (RUN + ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--transformer-engine", "1.14"],
     ["--transformer-engine", "'1.14'", "tensorwise needs Transformer Engine 2.2 or later"]),
    (RUN + ["--fp4-recipe", "nvfp4"], ["--fp4-recipe", "nvfp4", "h100-sxm", "no FP4 tensor cores", "b200"]),
    (RUN + ["--fp4-recipe", "nvfp4", "--fp8-format", "hybrid"], ["--fp4-recipe", "nvfp4", "fp8_format", "hybrid"]),
    (RUN + ["--fp4-format", "e2m1"], ["--fp4-format", "e2m1", "h100-sxm", "no FP4 tensor cores"]),
    (["run", *TINY, *PLAN[2:], "--gpu", "a100-80gb", "--nccl-algo", "nvls"], ["nccl_algo", "nvls", "allowed: auto, ring"]),
    (RUN + ["--nccl-pxn-disable"], ["--nccl-pxn-disable", "True", "changes nothing", "dgx-h100x1-rail", "no rails"]),
    (RUN + ["--nccl-p2p-pxn-level", "3"], ["--nccl-p2p-pxn-level", "3", "allowed: 0, 1, 2"]),
    (["collective", "--gpus", "16", "--fabric", "fat-tree", "--nccl-p2p-pxn-level", "0"],
     ["--nccl-p2p-pxn-level", "0", "changes nothing", "dgx-h100x2-fat-tree", "no rails"]),
    (RUN + ["--pin-to-nvlink-domain", "tp,pp"], ["--pin-to-nvlink-domain", "pp", "tp, cp, ep, etp"]),
    (["run", *TINY, "--gpu", "h100-sxm", "--gpus", "16", "--global-batch-size", "8", "--tensor-model-parallel-size",
      "8", "--context-parallel-size", "2", "--gpus-per-node", "4", "--pin-to-nvlink-domain", "tp"],
     ["--pin-to-nvlink-domain", "tp 8", "ranks 0-7", "4 GPUs each"]),
    (RUN + ["--power-limit-w", "800"], ["--power-limit-w", "800", "(70, 700]"]),
    (RUN + ["--power-limit-w", "50"], ["--power-limit-w", "50", "(70, 700]"]),
    (RUN + ["--power-limit-w", "0"], ["--power-limit-w", "0", "> 0"]),
    (RUN + ["--power-limit-w", "nan"], ["--power-limit-w", "nan"]),
    (["estimate", *TINY, *PLAN, "--power-limit-w", "1000"], ["--power-limit-w", "1000", "(70, 700]"]),
    (["compare", *TINY, *PLAN, "--rank-by", "speed"], ["--rank-by", "speed", "tokens-per-joule", "cost"]),
    (RUN + ["--gpu-hour-price", "abc"], ["--gpu-hour-price", "abc", "US dollars per GPU-hour > 0"]),
    (RUN + ["--gpu-hour-price", "b200=3"], ["--gpu-hour-price", "b200=3", "no price for h100-sxm"]),
    (["compare", *TINY, *PLAN, "--schedules", "1f1b", "--rank-by", "cost"], ["--rank-by", "cost", "no price"]),
    (RUN + ["--tensor-model-paralel-size", "2"], ["--tensor-model-paralel-size",
                                                  "did you mean --tensor-model-parallel-size?"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--power-limit-w", "750"],
     ["--power-limit-w", "750", "(40, 400]"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--rank-by", "joules"], ["--rank-by", "joules"]),
    (["estimate", *TINY, *PLAN, "--gpus", "-4"], ["--gpus", "-4"]),
    (["estimate", *TINY, *PLAN, "--micro-batch-size", "nan"], ["--micro-batch-size", "nan"]),
    (["estimate", *TINY, *PLAN, "--num-attention-heads", "7"], ["--num-attention-heads: got 7", "hidden_size"]),
    (["compare", *TINY, *PLAN, "--schedules", "gpipe,2f2b"], ["2f2b"]),
    (["compare", *TINY, *PLAN, "--zero-stages", "0,7"], ["--zero-stages", "7"]),
    (["compare", *TINY, *PLAN, "--zero-stages", "0,x"], ["--zero-stages", "0,x"]),
    (["collective", "--size", "nan"], ["--size", "nan"]),
    (["collective", "--size=-1MiB"], ["--size", "-1MiB"]),
    (["collective", "--size", "inf"], ["--size", "inf"]),
    (["collective", "--size", "1XB"], ["--size", "1XB"]),
    (["collective", "--gpus", "0"], ["--gpus", "0"]),
    (["collective", "--gpus", "16", "--nodes", "1"], ["--gpus", "16"]),
    (["collective", "--nodes", "-1"], ["--nodes", "-1"]),
    (["collective", "--oversubscription", "nan"], ["--oversubscription", "nan"]),
    (["collective", "--oversubscription", "0.5"], ["--oversubscription", "0.5"]),
    (["collective", "--channels", "0"], ["--channels", "0"]),
    (["collective", "--op", "allsum"], ["--op", "allsum"]),
    (["collective", "--algo", "collnet"], ["--algo", "collnet"]),
    (["collective", "--fabric", "torus"], ["--fabric", "torus"]),
    (["collective", "--gpu", "b300"], ["gpu", "b300"]),
    (["collective", "--gpus", "1"], ["--gpus", "1", "at least 2 GPUs"]),
    (["collective", "--topology", "example-custom", "--fabric", "fat-tree"],
     ["--fabric", "fat-tree", "example-custom.toml", "device-by-device"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "0"], ["--global-batch-size", "0"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--margin", "nan"], ["--margin", "nan"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--margin", "0.5"], ["--margin", "0.5"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--wave", "0"], ["--wave", "0"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--max-time", "10x"], ["--max-time", "10x"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--top", "0"], ["--top", "0"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--workers", "-1"], ["--workers", "-1"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--tp", "1,x"], ["--tp", "x"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--tp", "-2"], ["--tp", "-2"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--max-tp", "0"], ["--max-tp", "0"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--dispatcher", "deepep"],
     ["--dispatcher", "deepep", "alltoall, allgather, flex"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--schedule", "2f2b"], ["--schedule", "2f2b"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--sequence-parallel", "maybe"],
     ["--sequence-parallel", "maybe"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--dask", "nowhere"], ["--dask", "nowhere"]),
    (["search", *TINY, "--gpus", "-4", "--global-batch-size", "8"], ["--gpus", "-4"]),
    (["search", *TINY, "--global-batch-size", "8"], ["--gpus"]),
    (["search", *TINY, "--gpus", "4", "--global-batch-size", "8", "--resume"], ["--resume", "--out"]),
    (["sweep", "in/missing.toml", "--top", "0"], ["--top", "0"]),
    (["demo", "--nodes", "0"], ["--nodes", "0"]),
    (["demo", "--nodes", "x"], ["--nodes", "x"]),
    (["calibrate", "--procs", "0"], ["--procs", "0"]),
    (["calibrate", "--out", "profile.txt"], ["--out", "profile.txt", ".json"]),
    (["calibrate", "--model", "gpt-5"], ["--model", "gpt-5"]),
    (["calibrate", "--seq-length", "512"], ["--seq-length"]),
    (["calibrate", "--link", "wifi"], ["--link", "wifi"]),
    (["calibrate", "--base", "b300"], ["b300"]),
    (["calibrate", "--tensor-model-parallel-size", "-1"], ["--tensor-model-parallel-size", "-1"]),
    (["validate", "--procs", "0"], ["--procs", "0"]),
    (["validate", "--warmup", "-1"], ["--warmup", "-1"]),
    (["validate", "--iters", "nan"], ["--iters", "nan"]),
    (["validate", "--configs", "dp,zz"], ["--configs", "zz"]),
    (["validate", "--profile", "in/missing.json"], ["in/missing.json"]),
    (["validate", "--link", "wifi"], ["--link", "wifi"]),
    (["import-nccl-tests", DATA / "nccl_all_reduce_8gpu.txt", "--ranks", "0"], ["--ranks", "0"]),
    (["import-nccl-tests", DATA / "nccl_all_reduce_8gpu.txt", "--ranks", "-8"], ["--ranks", "-8"]),
    (["import-nccl-tests", DATA / "nccl_all_reduce_8gpu.txt", "--min-size", "nan"], ["--min-size", "nan"]),
    (["import-nccl-tests", DATA / "nccl_all_reduce_8gpu.txt", "--links-per-rank", "0"], ["--links-per-rank", "0"]),
    (["import-nccl-tests", DATA / "nccl_all_reduce_8gpu.txt", "--op", "allsum"], ["op", "allsum"]),
    (["import-nccl-tests", DATA / "nccl_all_reduce_8gpu.txt", "--link", "wifi"], ["--link", "wifi"]),
    (["import-nccl-tests", DATA / "nccl_all_reduce_8gpu.txt", "--out", "p.json"], ["--out", "--profile"]),
    (["import-nccl-tests", DATA / "nccl_all_reduce_8gpu.txt", "--profile", "h100-sxm", "--out", "p.txt"],
     ["--out", "p.txt"]),
    (["import-nccl-tests", DATA / "nccl_all_reduce_8gpu.txt", "--profile", "b300", "--out", "p.json"], ["b300"]),
    (["import-trace", DATA / "kineto_rank0.json.gz", "--top", "0"], ["--top", "0"]),
    (["import-trace", DATA / "kineto_rank0.json.gz", "--level", "ops"], ["--level", "ops"]),
    (["no-such-command"], ["no-such-command"]),
]


@pytest.mark.parametrize("argv,mentions", FLAG_CASES, ids=[" ".join(map(str, a[:1] + a[-2:])) for a, _ in FLAG_CASES])
def test_bad_flag(bad, argv, mentions):
    bad(argv, *mentions)


# ---------------------------------------------------------------- output paths
OUT_COMMANDS = {
    # command: (argv with {} for the output path, the flag, "dir" or "file" output)
    "run": (RUN + ["--out", "{}"], "--out", "dir"),
    "run kineto": (RUN + ["--kineto", "{}"], "--kineto", "dir"),
    "compare": (["compare", *TINY, *PLAN, "--schedules", "gpipe,1f1b", "--out", "{}"], "--out", "dir"),
    "compare kineto": (["compare", *TINY, *PLAN, "--schedules", "gpipe,1f1b", "--kineto", "{}"], "--kineto", "dir"),
    "collective": (["collective", "--gpus", "2", "--size", "1MiB", "--out", "{}"], "--out", "dir"),
    "search": (["search", *TINY, "--gpus", "2", "--global-batch-size", "4", "--workers", "0", "--out", "{}"],
               "--out", "dir"),
    "sweep": (["sweep", "SWEEP", "--workers", "0", "--out", "{}"], "--out", "dir"),
    "demo": (["demo", "--out", "{}"], "--out", "dir"),
    "import-trace": (["import-trace", DATA / "kineto_rank0.json.gz", "--out", "{}"], "--out", "dir"),
    "replay": (["replay", DATA / "kineto_rank0.json.gz", "--out", "{}"], "--out", "dir"),
    "validate": (["validate", "--profile", PROFILE, "--out", "{}"], "--out", "dir"),
    "import-nccl-tests": (["import-nccl-tests", DATA / "nccl_all_reduce_8gpu.txt", "--profile", "h100-sxm",
                           "--out", "{}"], "--out", "file"),
    "calibrate": (["calibrate", "--out", "{}"], "--out", "file"),
    "calibrate measurements": (["calibrate", "--measurements", "{}"], "--measurements", "file"),
}
OUT_CASES = [(c, k) for c, (_, _, what) in OUT_COMMANDS.items()
             for k in (("a file", "under a file") if what == "dir" else ("a directory", "under a file"))]


@pytest.mark.parametrize("command,kind", OUT_CASES, ids=[f"{c}-{k}" for c, k in OUT_CASES])
def test_output_path_that_cannot_be_written(bad, tmp_path, command, kind):
    """An output path that is a file where a folder is wanted, a folder where a file is
    wanted, or under a file, is refused before any work."""
    argv, flag, _ = OUT_COMMANDS[command]
    blocker = tmp_path / "blocker.json"
    blocker.write_text("{}\n")
    target = {"a file": blocker, "under a file": blocker / "sub.json", "a directory": tmp_path / "dir.json"}[kind]
    if kind == "a directory":
        target.mkdir()
    sweep = _write(tmp_path, "sweep.toml", SWEEP)
    argv = [sweep if a == "SWEEP" else target if a == "{}" else a for a in argv]
    bad(argv, flag, target)
    assert blocker.read_text() == "{}\n"


def test_read_only_output_folder(bad, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        bad(RUN + ["--out", ro / "run"], "--out", ro / "run")
        bad(["collective", "--gpus", "2", "--size", "1MiB", "--out", ro], "--out", ro)
    finally:
        ro.chmod(0o755)


# ---------------------------------------------------------------- atomic writers
def _writers():
    from sim.results import export
    from sim.results import export_kineto
    from sim.results import plot
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def png(path):
        fig, ax = plt.subplots()
        ax.plot([0, 1])
        plot.save_png(fig, path)

    return {
        "json": lambda p: export.write_json_atomic({"a": 1}, p),
        "text": lambda p: export.write_text_atomic("a,b\n", p),
        "png": png,
        "kineto": lambda p: export_kineto._write({"traceEvents": []}, p),
    }


@pytest.mark.parametrize("kind", ["json", "text", "png", "kineto"])
def test_a_write_that_fails_leaves_no_file(tmp_path, kind):
    """Writers go through a temporary file and a rename: a failed write (here the target is
    a folder) is an InputError naming the path and leaves nothing behind, not even the
    temporary; a good write leaves the file with the usual permissions."""
    write = _writers()[kind]
    target = tmp_path / "out" / "result"
    target.mkdir(parents=True)
    (target / "keep").write_text("x")
    with pytest.raises(InputError, match=re.escape(str(target))):
        write(target)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["result"]
    good = tmp_path / "out" / "good"
    write(good)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["good", "result"]
    mask = os.umask(0)
    os.umask(mask)
    assert good.stat().st_mode & 0o777 == 0o666 & ~mask


def test_profile_save_is_atomic(tmp_path):
    from sim.inputs.hardware import load_profile

    p = load_profile("h100-sxm")
    p.save(tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == p
    with pytest.raises(InputError, match="cannot write"):
        p.save(tmp_path)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["p.json"]


def test_a_cluster_too_small_is_reported_before_the_plan(bad):
    # 16 GPUs on one 8-GPU node, and a batch that 16 GPUs could not take either: the
    # cluster is what is wrong first (issue 44).
    bad(["run", "--model", "llama2-7b", "--gpu", "h100-sxm", "--nodes", "1", "--gpus", "16",
         "--global-batch-size", "8"], "--gpus: got 16", "has 8 GPUs")


# ---------------------------------------------------------------- Chakra execution traces
def _chakra_cases():
    """(name, {file: bytes}, argv after `replay`, mentions) for BAD_INPUTS.md section 12."""
    pb = pytest.importorskip("google.protobuf", reason="Chakra ETs need protobuf")  # noqa: F841
    from sim.inputs.chakra_schema import NODE_TYPES, encode_stream, messages

    M = messages()
    A = M.AttributeProto
    ring = gzip.decompress((DATA / "chakra" / "custom_allreduce" / "custom_allreduce.0.et.gz").read_bytes())
    good = (DATA / "chakra" / "all_reduce.1.et").read_bytes()

    def et(*nodes):
        return encode_stream([M.GlobalMetadata(version="0.0.4"), *nodes])

    coll = NODE_TYPES["COMM_COLL_NODE"]
    return [
        ("empty", {"x.0.et": b""}, ["in/x.0.et"], ["in/x.0.et", "empty"]),
        ("truncated", {"x.0.et": ring[: len(ring) // 2]}, ["in/x.0.et"], ["in/x.0.et", "truncated"]),
        ("binary garbage", {"x.0.et": GARBAGE}, ["in/x.0.et"], ["in/x.0.et", "not a Chakra"]),
        ("a Kineto trace named .et", {"x.0.et": KINETO.encode()}, ["in/x.0.et"], ["in/x.0.et", "not a Chakra"]),
        ("missing", {}, ["in/x.0.et"], ["in/x.0.et"]),
        ("node type 42", {"x.0.et": et(M.Node(id=0, name="k", type=42))}, ["in/x.0.et"], ["type: got 42"]),
        ("data dependency on a missing node", {"x.0.et": et(M.Node(id=0, name="k", type=4, data_deps=[9]))},
         ["in/x.0.et"], ["data_deps: node 9"]),
        ("a cycle", {"x.0.et": et(M.Node(id=0, name="a", type=4, data_deps=[1]),
                                  M.Node(id=1, name="b", type=4, data_deps=[0]))}, ["in/x.0.et"], ["cycle"]),
        ("collective without comm_size", {"x.0.et": et(M.Node(id=0, name="ar", type=coll,
                                                              attr=[A(name="comm_type", int64_val=0)]))},
         ["in/x.0.et"], ["comm_size: missing"]),
        ("pg_name without a comm-group file", {"x.0.et": et(M.Node(id=0, name="ar", type=coll, attr=[
            A(name="comm_type", int64_val=0), A(name="comm_size", int64_val=8), A(name="pg_name", string_val="3")]))},
         ["in/x.0.et"], ["pg_name: got '3'"]),
        ("two files of rank 1", {"a.1.et": good, "b.1.et": good}, ["in/a.1.et", "in/b.1.et"], ["rank 1"]),
        ("`--step` with ETs", {"x.1.et": good}, ["in/x.1.et", "--step", "2"], ["--step: got 2"]),
        ("ETs mixed with a Kineto trace", {"x.1.et": good, "rank0.json": KINETO.encode()},
         ["in/x.1.et", "in/rank0.json"], ["in/rank0.json", "in/x.1.et"]),
    ]


CHAKRA_CASES = ["empty", "truncated", "binary garbage", "a Kineto trace named .et", "missing", "node type 42",
                "data dependency on a missing node", "a cycle", "collective without comm_size",
                "pg_name without a comm-group file", "two files of rank 1", "`--step` with ETs",
                "ETs mixed with a Kineto trace"]


@pytest.mark.parametrize("case", CHAKRA_CASES)
def test_bad_chakra_et(bad, tmp_path, case):
    (files, argv, mentions), = [c[1:] for c in _chakra_cases() if c[0] == case]
    for name, data in files.items():
        _write(tmp_path, name, data)
    bad(["replay", *argv, "--gpu", "h100-sxm", "--out", "out"], *mentions)


def test_export_chakra_with_reduced_fidelity(bad):
    bad(["run", *TINY, *PLAN, "--fidelity", "reduced", "--export-chakra", "out"], "--export-chakra", "reduced")
