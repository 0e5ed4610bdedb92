"""The Python API mirrors the CLI: same parser, same numbers, same errors."""

import doctest
import io
import json
import subprocess
import sys
from contextlib import redirect_stdout

import pytest

import sim
from sim.cli import main
from sim.errors import InputError

TINY = {"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 8192, "seq_length": 512}
FLAGS = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "8192",
         "--seq-length", "512", "--gpu", "h100-sxm"]


def _cli_json(*argv) -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(list(argv)) == 0
    return buf.getvalue().strip()


def test_doctests_of_sim_api_run():
    import sim.api

    result = doctest.testmod(sim.api, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 10 and result.failed == 0


def test_import_sim_stays_light():
    out = subprocess.run([sys.executable, "-c", "import sys, sim; print(sorted(m for m in "
                          "('simpy', 'matplotlib', 'sim.api', 'sim.engine.core') if m in sys.modules))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
    assert {"run", "compare", "RunResult", "Comparison"} <= set(dir(sim))
    with pytest.raises(AttributeError):
        sim.no_such_thing  # noqa: B018


def test_run_to_json_is_what_the_cli_prints():
    r = sim.run(model=TINY, gpu="h100-sxm", gpus=8, tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                global_batch_size=8, zero=1)
    cli = _cli_json("run", *FLAGS, "--gpus", "8", "--tensor-model-parallel-size", "2",
                    "--pipeline-model-parallel-size", "2", "--global-batch-size", "8", "--zero", "1", "--json")
    assert r.to_json() == cli
    assert r.to_dict() == json.loads(cli)
    assert r.trace.end_s == r.iteration_time_s
    assert r.plan.zero_stage == 1 and r.model.num_layers == 4
    assert "RunResult(" in repr(r) and "fits" in repr(r)


def test_run_with_spec_objects_and_experiment_file(tmp_path):
    from sim.inputs.plan import ParallelPlan

    model = sim.run(model=TINY, gpus=2, gpu="h100-sxm").model
    plan = ParallelPlan(dp=1, tp=1, pp=2, global_batch_size=4, schedule="gpipe")
    a = sim.run(model=model, plan=plan, gpu="h100-sxm")
    assert a.plan is plan and a.summary["schedule"] == "gpipe"
    f = tmp_path / "exp.toml"
    f.write_text("[model]\nnum_layers = 4\nhidden_size = 512\nnum_attention_heads = 8\nvocab_size = 8192\n"
                 "seq_length = 512\n[cluster]\ngpu = 'h100-sxm'\ngpus = 2\n"
                 "[plan]\npipeline_model_parallel_size = 2\nglobal_batch_size = 4\nschedule = 'gpipe'\n")
    b = sim.run(f)
    assert b.to_json() == a.to_json()  # the same model and plan, from a file
    c = sim.run(f, schedule="1f1b")  # keywords override the file
    assert c.summary["schedule"] == "1f1b"
    assert c.to_json() == _cli_json("run", str(f), "--schedule", "1f1b", "--json")


def test_run_selects_a_named_plan(tmp_path):
    f = tmp_path / "two.toml"
    f.write_text("[model]\nnum_layers = 4\nhidden_size = 512\nnum_attention_heads = 8\nvocab_size = 8192\n"
                 "seq_length = 512\n[cluster]\ngpu = 'h100-sxm'\ngpus = 4\n"
                 "[plan]\npipeline_model_parallel_size = 2\nglobal_batch_size = 8\n"
                 "[[plans]]\nname = 'g'\nschedule = 'gpipe'\n[[plans]]\nname = 'o'\nschedule = '1f1b'\n")
    r = sim.run(f, plan="o")
    assert r.name == "o" and r.summary["schedule"] == "1f1b" and r.plan.dp == 2
    with pytest.raises(InputError, match="plans: the file lists 2 plans"):
        sim.run(f)
    with pytest.raises(InputError, match="no plan named 'x'"):
        sim.run(f, plan="x")


def test_save_writes_the_cli_outputs(tmp_path):
    r = sim.run(model=TINY, gpu="h100-sxm", gpus=4, pipeline_model_parallel_size=2, global_batch_size=4)
    out = r.save(tmp_path / "o", kineto=True)
    for name in ("summary.json", "trace.json", "timeline.png", "memory.png"):
        assert (out / name).stat().st_size > 0
    assert json.loads((out / "summary.json").read_text()) == r.to_dict()
    assert sorted(p.name for p in (out / "kineto").iterdir()) == [f"trace_rank{i}.json" for i in range(4)]


def test_compare_with_plan_dicts_and_axes():
    c = sim.compare(plans=[{"name": "pp2", "pipeline_model_parallel_size": 2},
                           {"name": "tp2", "tensor_model_parallel_size": 2}],
                    model=TINY, gpu="h100-sxm", gpus=4, global_batch_size=8, zero_stages=[0, 1])
    assert [r.name for r in c] == ["pp2, zero-0", "pp2, zero-1", "tp2, zero-0", "tp2, zero-1"]
    assert len(c) == 4 and c["tp2, zero-1"].plan.tp == 2 and c[0].plan.pp == 2
    rows = c.rows
    assert sum(r["best"] for r in rows) == 1
    best = max((r for r in rows if r["fits"]), key=lambda r: r["tokens_per_s"])
    assert best["best"] and c.best.name == best["name"]
    for row in rows:  # the parts of the chart add up to the iteration time
        parts = row["compute_s"] + sum(row["exposed_comm_s"].values()) + row["bubble_s"] + row["other_idle_s"]
        assert parts == pytest.approx(row["iteration_time_s"], rel=1e-6)
    data = json.loads(c.to_json())
    assert data["best"] == c.best.name and [p["name"] for p in data["plans"]] == [r.name for r in c]


@pytest.mark.parametrize("kwargs,needle", [
    ({"model": TINY, "tensor_model_parallel_size": "two"}, "tensor_model_parallel_size: got 'two'; expected an integer"),
    ({"model": TINY, "colour": "red"}, "colour: unknown setting"),
    ({"model": 3}, "model: got 3"),
    ({"model": TINY, "plan": 3}, "plan: got 3"),
    ({"model": TINY, "plan": "gpipe"}, "a plan name needs an experiment file"),
    ({"model": TINY, "sequence_parallel": "yes"}, "sequence_parallel: got 'yes'; expected true or false"),
    ({"model": TINY, "recompute_granularity": "some"}, "recompute_granularity: got 'some'; allowed"),
    ({"gpu": "h100-sxm"}, "model: missing"),
])
def test_api_errors_are_input_errors(kwargs, needle):
    with pytest.raises(InputError) as exc:
        sim.run(**kwargs)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_compare_errors():
    with pytest.raises(InputError, match="nothing to compare"):
        sim.compare(model=TINY)
    with pytest.raises(InputError, match="plan names must be unique"):
        sim.compare(plans=[{"name": "a"}, {"name": "a"}], model=TINY)
    with pytest.raises(InputError, match=r"plan 'bad': .*tp"):
        sim.compare(plans=[{"name": "ok"}, {"name": "bad", "tensor_model_parallel_size": 3}], model=TINY,
                    gpu="h100-sxm")
