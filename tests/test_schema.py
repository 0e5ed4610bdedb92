"""The settings schema: one field reaches TOML files, the Python API and the CLI alike.

The first test adds a throwaway setting to a copy of the package, as a developer would
(one field of ``ParallelPlan`` in ``sim/inputs/plan.py``), and sees it in all three, with the same check of
its value in each. The others check the schema against the front ends of this tree.
"""

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sim.cli import build_parser, main
from sim.errors import InputError
from sim.inputs import schema
from sim.inputs.experiment import TABLES, read_experiment, settings_from_values, values_of
from sim.inputs.flags import given, help_of

ROOT = Path(__file__).resolve().parents[1]

NEW_FIELD = ('    throwaway_knob_s: float | None = setting(help="a knob a test adds (seconds)", '
             'type=Number(float, above=0), flag="--throwaway-knob")\n')

PROBE = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    import sim
    from sim.cli import build_parser, main
    from sim.errors import InputError
    from sim.inputs.experiment import read_experiment, values_of
    from sim.inputs.flags import given
    from sim.inputs.schema import RunSettings

    out = {}
    # CLI: the flag exists, is listed in --help and parses to the field
    p = build_parser()
    ns = p.parse_args(["run", "--model", "llama2-7b", "--throwaway-knob", "2.5"])
    out["cli"] = given(ns).get("throwaway_knob_s")
    out["cli_settings"] = RunSettings.from_values(given(ns)).plan.throwaway_knob_s
    # TOML: the key of [plan]
    exp = read_experiment(sys.argv[1])
    out["toml"] = RunSettings.from_values(values_of(exp.settings)).plan.throwaway_knob_s
    # API: a keyword of sim.run, checked as the field checks it
    tiny = {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1024, "seq_length": 256}
    r = sim.run(model=tiny, gpu="h100-sxm", gpus=2, throwaway_knob_s=0.5)
    out["api_ran"] = r.iteration_time_s > 0
    out["plan"] = r.plan.throwaway_knob_s  # the plan the program builder read
    try:
        sim.run(model=tiny, throwaway_knob_s=-1)
    except InputError as exc:
        out["api_error"] = str(exc)
    try:
        read_experiment(sys.argv[2])
    except InputError as exc:
        out["toml_error"] = str(exc)
    out["cli_rc"] = main(["run", "--model", "llama2-7b", "--throwaway-knob", "-1"])
    print(json.dumps(out))
''')


def test_a_new_setting_is_one_field_and_reaches_toml_api_and_cli(tmp_path):
    pkg = tmp_path / "sim"
    shutil.copytree(ROOT / "sim", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    src = (pkg / "inputs" / "plan.py").read_text()
    anchor = "\n    def __post_init__(self):\n"
    assert src.count(anchor) == 1
    (pkg / "inputs" / "plan.py").write_text(src.replace(anchor, NEW_FIELD + anchor))
    good = tmp_path / "good.toml"
    good.write_text('[model]\npreset = "llama2-7b"\n\n[plan]\nthrowaway_knob_s = 1.5\n')
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\npreset = "llama2-7b"\n\n[plan]\nthrowaway_knob_s = 0\n')
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    proc = subprocess.run([sys.executable, str(probe), str(good), str(bad)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cli"] == out["cli_settings"] == 2.5
    assert out["toml"] == 1.5
    assert out["api_ran"] and out["plan"] == 0.5
    assert out["api_error"] == "throwaway_knob_s: got -1; expected a finite number > 0"
    assert out["toml_error"] == f"{bad}:5: plan.throwaway_knob_s: got 0; expected a finite number > 0"
    assert out["cli_rc"] == 2
    assert "trainsim: error: --throwaway-knob: got -1; expected a finite number > 0" in proc.stderr
    # and the unchanged tree does not have it: the copy's one line made it
    with pytest.raises(InputError, match="throwaway_knob_s: unknown setting"):
        settings_from_values({"throwaway_knob_s": 1.0})


def test_every_field_has_a_flag_of_its_name_and_file_fields_a_key():
    for name, f in schema.FIELDS.items():
        assert f.flag.startswith("--") and f.flag[2:].replace("-", "_") in (name, "zero")
        assert help_of(name) is None or help_of(name).strip()
    file_fields = {field for keys in TABLES.values() for field in keys}
    assert file_fields == set(schema.FIELDS) - {"json", "out", "kineto", "export_chakra"}  # outputs are not written in files


def test_run_takes_every_field_as_a_flag_with_the_schema_default():
    sub = build_parser()._subparsers._group_actions[0].choices["run"]  # noqa: SLF001 - argparse keeps them there
    flags = {o for a in sub._actions for o in a.option_strings}
    assert {f.flag for f in schema.FIELDS.values()} <= flags
    # nothing typed: every field at its default
    settings = schema.RunSettings.from_values(given(sub.parse_args([])))
    assert settings == schema.RunSettings()
    assert settings.cluster.gpu == "a100-80gb" and settings.plan.overlap_grad_reduce is True


@pytest.mark.parametrize("field,bad,why", [
    ("tensor_model_parallel_size", 0, "got 0; expected an integer >= 1"),
    ("zero", 4, "got 4; allowed: 0, 1, 2, 3"),
    ("sequence_parallel", "yes", "got 'yes'; expected true or false"),
    ("fabric", "torus", "got 'torus'; allowed: rail, fat-tree"),
    ("attention_dropout", 1.5, "got 1.5; expected a finite number in [0, 1]"),
    ("max_events", float("nan"), "got nan; expected a number > 0 (inf allowed)"),
])
def test_a_bad_value_is_named_the_same_way_from_python_a_file_and_a_dataclass(tmp_path, field, bad, why):
    with pytest.raises(InputError) as api:
        settings_from_values({field: bad})
    assert str(api.value) == f"{field}: {why}"
    with pytest.raises(InputError) as direct:
        schema.section_of(schema.SECTION_OF[field], {field: bad})
    assert str(direct.value) == f"{field}: {why}"
    table, key = schema.FIELDS[field].tables[0]
    value = json.dumps(bad) if not isinstance(bad, float) or bad == bad else "nan"
    exp = tmp_path / "exp.toml"
    head = '[model]\npreset = "llama2-7b"\n' + ("" if table == "model" else f"\n[{table}]\n")
    exp.write_text(f"{head}{key} = {value}\n")
    with pytest.raises(InputError) as file:
        read_experiment(exp)
    assert str(file.value) == f"{exp}:{head.count(chr(10)) + 1}: {table}.{key}: {why}"


def test_deepspeed_names_and_megatron_flags_set_the_same_fields(tmp_path):
    exp = tmp_path / "ds.toml"
    exp.write_text('[model]\npreset = "llama2-7b"\n\n[zero_optimization]\nstage = 3\n'
                   'stage3_prefetch_bucket_size = 5e8\nstage3_max_live_parameters = 1e9\n')
    from_file = schema.RunSettings.from_values(values_of(read_experiment(exp).settings)).plan
    ns = build_parser().parse_args(["run", "--model", "llama2-7b", "--zero", "3",
                                    "--zero3-prefetch-bucket-size", "5e8", "--zero3-max-live-parameters", "1e9"])
    from_flags = schema.RunSettings.from_values(given(ns)).plan
    assert from_file == from_flags
    assert (from_file.zero, from_file.zero3_prefetch_bucket_size, from_file.zero3_max_live_parameters) == (3, 5e8, 1e9)


def test_flags_typed_after_a_file_override_it_field_by_field(tmp_path, capsys):
    exp = tmp_path / "exp.toml"
    exp.write_text('[model]\nnum_layers = 2\nhidden_size = 256\nnum_attention_heads = 4\nvocab_size = 1024\n'
                   'seq_length = 256\n\n[cluster]\ngpu = "h100-sxm"\ngpus = 4\n\n[plan]\n'
                   'tensor_model_parallel_size = 2\nglobal_batch_size = 8\n')
    assert main(["run", str(exp), "--json"]) == 0
    file_only = json.loads(capsys.readouterr().out)
    assert main(["run", str(exp), "--tensor-model-parallel-size", "1", "--json"]) == 0
    overridden = json.loads(capsys.readouterr().out)
    assert (file_only["plan"]["tp"], file_only["plan"]["dp"]) == (2, 2)
    assert (overridden["plan"]["tp"], overridden["plan"]["dp"]) == (1, 4)
    assert overridden["plan"]["global_batch_size"] == 8


def test_settings_doc_lists_every_field():
    doc = (ROOT / "docs" / "settings.md").read_text()
    from sim.inputs.flags import settings_markdown

    assert doc == settings_markdown(), "docs/settings.md is out of date: python -m sim.inputs.flags > docs/settings.md"
    for f in schema.FIELDS.values():
        assert re.search(rf"`{re.escape(f.flag)}`", doc)


def test_an_error_carries_its_setting_value_allowed_and_where_it_was_written(tmp_path):
    # The same rule (tp must divide the heads) seen from a file, from Python and from the
    # command line: each names the setting as its user wrote it, from the error's fields.
    import sim

    exp = tmp_path / "exp.toml"
    exp.write_text('[model]\npreset = "llama2-7b"\n\n[plan]\ntensor_model_parallel_size = 3\n')
    with pytest.raises(InputError) as file:
        sim.run(str(exp))
    e = file.value
    assert (e.path, e.line, e.field, e.value, e.setting) == (str(exp), 5, "plan.tensor_model_parallel_size", 3, "tp")
    assert e.allowed == "must divide num_attention_heads 32 of llama2-7b"
    assert str(e) == f"{exp}:5: plan.tensor_model_parallel_size: got 3; {e.allowed}"
    with pytest.raises(InputError) as api:
        sim.run(model="llama2-7b", tensor_model_parallel_size=3)
    assert str(api.value) == f"tensor_model_parallel_size: got 3; {e.allowed}" and api.value.path is None
    assert main(["run", "--model", "llama2-7b", "--tensor-model-parallel-size", "3"]) == 2


def test_no_command_declares_a_flag_by_hand():
    # Every command's flags and positional arguments come from schema fields (sim.inputs.schema,
    # sim.inputs.schema_commands): no add_argument call is left in sim/commands.
    import ast

    root = Path(__file__).resolve().parents[1] / "sim" / "commands"
    calls = [(p.name, node.lineno) for p in sorted(root.glob("*.py")) for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"]
    assert calls == []


@pytest.mark.parametrize("argv,want", [
    # positional arguments from fields: one or more (fit's runs), an optional file, a required one
    (["fit", "a.csv", "b.csv", "--gpu", "h100-sxm"], {"runs": ["a.csv", "b.csv"], "jobs": 1, "json": False}),
    (["goodput"], {"experiment": None, "days": 54.0, "seed": 0, "hot_spares": None, "checkpoint_interval": None,
                   "storage_bandwidth": None}),  # (None: unlimited spares, the best interval, the default storage)
    (["goodput", "--hot-spares", "2", "--checkpoint-interval", "600", "--storage-bandwidth", "500GB"],
     {"hot_spares": 2, "checkpoint_interval": 600.0, "storage_bandwidth": 5e11}),
    (["sweep", "e.toml"], {"experiment": "e.toml"}),
    (["import-trace", "t.json", "--top", "3"], {"traces": ["t.json"], "top": 3, "level": "auto"}),
    (["replay", "r0.json", "--step", "2"], {"traces": ["r0.json"], "step": 2, "data_parallel_size": None}),
    (["import-nccl-tests", "l.txt"], {"logs": ["l.txt"], "link": "ib", "links_per_rank": 1, "min_size": "0"}),
    (["calibrate", "--link", "pcie"], {"link": "pcie", "out": "calibrated.json", "procs": None}),
])
def test_command_options_parse_with_their_declared_defaults(argv, want):
    ns = vars(build_parser().parse_args(argv))
    assert {k: ns[k] for k in want} == want


@pytest.mark.parametrize("argv,err", [
    (["fit", "a.csv", "--gpu", "h100-sxm", "--jobs", "x"], "--jobs: got 'x'; expected an integer >= 1"),
    (["import-trace", "t.json", "--level", "ops"], "--level: got ops; allowed: auto, kernels, annotations, cpu_ops"),
    (["import-nccl-tests", "l.txt", "--link", "wifi"], "--link: got wifi; allowed: nvlink, pcie, ib, ethernet"),
    (["goodput", "--days", "40000"], "--days: got 40000; expected a finite number > 0 <= 36500"),
    (["goodput", "--hot-spares", "x"], "--hot-spares: got 'x'; expected an integer >= 0 or unlimited"),
    (["goodput", "--storage-bandwidth", "0"], "--storage-bandwidth: got '0'; expected a bandwidth > 0 bytes/s"),
])
def test_a_command_options_bad_value_is_refused_by_its_field(argv, err, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err == f"trainsim: error: {err}\n"
