"""Sweeps: identical results on every executor (Dask included), failures recorded, dead
workers retried, interrupted sweeps resumed with every point exactly once."""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.cli import main
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.studies.search import plan_key
from sim.studies.sweep import Progress, ResultsLog, Runner, evaluate, make_context
from sim.inputs.topology_build import load_topology

H100 = load_profile("h100-sxm")
TINY = gpt("tiny", 4, 512, 8, 4096, 256)
CTX = make_context(TINY, H100, load_topology("dgx-h100", nodes=1))
PLANS = [ParallelPlan(dp=8 // (tp * pp), tp=tp, pp=pp, micro_batch_size=mb, global_batch_size=16, zero_stage=z)
         for tp, pp, mb, z in ((1, 1, 1, 0), (1, 1, 2, 1), (2, 1, 1, 0), (2, 2, 1, 0), (1, 2, 2, 3), (1, 4, 1, 0))]
ROOT = Path(__file__).resolve().parent.parent

SWEEP_TOML = """\
name = "sweep test"
[model]
num_layers = 4
hidden_size = 512
num_attention_heads = 8
vocab_size = 4096
seq_length = 256
[cluster]
gpu = "h100-sxm"
gpus = 8
[plan]
tensor_model_parallel_size = [1, 2, 3]
pipeline_model_parallel_size = [1, 2]
micro_batch_size = [1, 2]
sequence_parallel = [false, true]
global_batch_size = 64
"""


# Worker hooks: module-level, so spawned workers can import them (they see the test's sys.path).
def _die_once(ctx, plan):
    marker = Path(os.environ["TRAINSIM_TEST_DIR"]) / f"died-{plan_key(plan)}"
    if plan.tp == 2 and plan.pp == 1 and not marker.exists():
        marker.touch()
        os._exit(1)
    return evaluate(ctx, plan)


def _always_die(ctx, plan):
    if plan.tp == 2 and plan.pp == 1:
        os._exit(1)
    return evaluate(ctx, plan)


def _parent_and_watchdog():
    import threading

    return os.getppid(), [t.name for t in threading.enumerate() if t.name == "trainsim-parent-watchdog"]


def _strip(records):
    return sorted(records, key=lambda r: r["key"])


@pytest.fixture(scope="module")
def local_records():
    with Runner(workers=2, progress=False) as runner:
        return runner.run(CTX, PLANS)


def test_local_records_are_those_of_trainsim_run_and_do_not_depend_on_the_worker_count(local_records):
    assert [r["key"] for r in local_records] == [plan_key(p) for p in PLANS]  # in the order asked
    assert all(r["status"] == "ok" and r["error"] is None for r in local_records)
    with Runner(workers=0) as inline:
        assert inline.run(CTX, PLANS) == local_records
    # The summary is exactly what ``trainsim run --json`` prints for that plan.
    from sim.session import summarize
    from sim.inputs.schema import SimulationSettings
    from sim.session import Job, simulate_training

    assert local_records[3]["summary"] == summarize(simulate_training(Job(TINY, PLANS[3], H100, CTX.topology()),
                                                                      SimulationSettings(fidelity="auto")))


def test_a_dask_local_cluster_gives_the_local_executors_records(local_records, tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setenv("TRAINSIM_TEST_DIR", str(tmp_path))
    with Runner(workers=2, dask="local", progress=False) as runner:
        info = runner._client.scheduler_info()["workers"]
        assert len(info) == 2 and len({w["id"] for w in info.values()}) == 2
        assert len(set(runner._client.run(os.getpid).values()) | {os.getpid()}) == 3  # processes
        # each of them tied to this process: it dies with it, however it dies (sim.workers)
        assert list(runner._client.run(_parent_and_watchdog).values()) == [(os.getpid(),
                                                                           ["trainsim-parent-watchdog"])] * 2
        records = runner.run(CTX, PLANS)
        assert json.dumps(_strip(records), sort_keys=True) == json.dumps(_strip(local_records), sort_keys=True)
        # A worker that dies mid-plan: Dask's scheduler runs the plan again on a live worker.
        runner.fn = _die_once
        again = runner.run(CTX, [ParallelPlan(dp=4, tp=2, global_batch_size=32)])
        # the workers there are now (the nanny starts a dead one again) die with this process (sim.workers)
        tied = list(runner._client.run(_parent_and_watchdog).values())
        assert tied and all(t == (os.getpid(), ["trainsim-parent-watchdog"]) for t in tied), tied
    assert (tmp_path / f"died-{again[0]['key']}").exists() and again[0]["status"] == "ok", again[0]


def test_a_plan_that_raises_is_recorded_and_the_sweep_goes_on(tmp_path):
    too_big = ParallelPlan(dp=16, global_batch_size=16)  # 16 GPUs on an 8-GPU node
    log = ResultsLog(tmp_path / "r.jsonl")
    with Runner(workers=0, log=log) as runner:
        recs = runner.run(CTX, [PLANS[0], too_big, PLANS[2]])
    assert [r["status"] for r in recs] == ["ok", "error", "ok"]
    assert recs[1]["error"].startswith("InputError: plan: needs dp x tp x pp = 16 x 1 x 1 = 16 GPUs")
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert sorted(x["key"] for x in lines) == sorted(r["key"] for r in recs)


def test_a_dead_worker_is_retried_and_the_sweep_completes(tmp_path, monkeypatch, local_records):
    monkeypatch.setenv("TRAINSIM_TEST_DIR", str(tmp_path))
    with Runner(workers=2, fn=_die_once, progress=False) as runner:
        recs = runner.run(CTX, PLANS)
        assert runner.retried >= 1
    assert (tmp_path / f"died-{plan_key(PLANS[2])}").exists()
    assert recs == local_records


def test_a_plan_that_kills_every_worker_is_recorded_as_crashed(local_records):
    with Runner(workers=2, fn=_always_die, progress=False, max_retries=1) as runner:
        recs = runner.run(CTX, PLANS)
    assert recs[2]["status"] == "crashed" and "worker process died 2 times" in recs[2]["error"]
    assert [r for i, r in enumerate(recs) if i != 2] == [r for i, r in enumerate(local_records) if i != 2]


def test_interrupted_in_process_then_resumed_every_point_once(tmp_path):
    calls = []

    def interrupt_after_two(ctx, plan):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(plan)
        return evaluate(ctx, plan)

    path = tmp_path / "results.jsonl"
    with pytest.raises(KeyboardInterrupt):
        with Runner(workers=0, log=ResultsLog(path), fn=interrupt_after_two) as runner:
            runner.run(CTX, PLANS)
    first = path.read_text().splitlines()
    assert len(first) == 2 and all(json.loads(x)["status"] == "ok" for x in first)
    with open(path, "a") as fh:  # as if killed in the middle of writing a third line
        fh.write('{"key": "dp0002-tp0')
    ran = []

    def counting(ctx, plan):
        ran.append(plan)
        return evaluate(ctx, plan)

    with Runner(workers=0, log=ResultsLog(path, resume=True), fn=counting) as runner:
        recs = runner.run(CTX, PLANS)
    lines = path.read_text().splitlines()
    assert lines[:2] == first and len(ran) == len(PLANS) - 2
    keys = [json.loads(x)["key"] for x in lines]
    assert sorted(keys) == sorted(plan_key(p) for p in PLANS) and len(set(keys)) == len(keys)
    assert [r["key"] for r in recs] == [plan_key(p) for p in PLANS]


def _foreground_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_sweep_killed_by_sigint_leaves_a_valid_file_and_resume_finishes_it(tmp_path, capsys):
    toml = tmp_path / "sweep.toml"
    # Points of about half a second each, so that the signal lands with several still to run.
    toml.write_text(SWEEP_TOML.replace("global_batch_size = 64", "global_batch_size = 512"))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # As a terminal's foreground job gets it: SIGINT at its default and not blocked. A test
    # run started in the background by a script (``make test &``) has SIGINT ignored, as
    # background jobs of non-interactive shells do, and a child inherits that: the sweep
    # would then ignore the signal, as it should, and this test would fail for that alone.
    proc = subprocess.Popen([sys.executable, "-m", "sim", "sweep", str(toml), "--out", str(out), "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            preexec_fn=_foreground_sigint)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        # 8 invalid (tp 3) points are written first, then the simulated ones as they finish.
        if results.exists() and len(results.read_text().splitlines()) >= 10:
            break
        time.sleep(0.02)
    # Popen.send_signal skips a process that has exited: a sweep that finished first would
    # look like one that ignored the signal (exit 0, nothing on stderr).
    assert proc.poll() is None, f"the sweep finished before the signal was sent (exit {proc.returncode})"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "rerun with --resume" in err and "Traceback" not in err
    before = results.read_text().splitlines()
    done = [json.loads(x) for x in before]  # every line is a whole record
    assert 10 <= len(done) < 24
    assert main(["sweep", str(toml), "--out", str(out), "--workers", "0"]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert main(["sweep", str(toml), "--out", str(out), "--resume", "--workers", "0", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    lines = results.read_text().splitlines()
    assert lines[:len(before)] == before
    keys = [json.loads(x)["key"] for x in lines]
    assert len(keys) == len(set(keys)) == 24 == summary["points"]
    assert summary["invalid"] == 8 and summary["evaluated"] == 16 and summary["failed"] == 0
    assert summary["best"]["key"] in keys
    invalid = [json.loads(x) for x in lines if json.loads(x)["status"] == "error"]
    assert all(r["error"].startswith("InputError: --gpus: got 8") for r in invalid)
    assert all("plan.tensor_model_parallel_size=3" in r["point"] for r in invalid)
    csv_rows = (out / "results.csv").read_text().splitlines()
    assert len(csv_rows) == 25 and csv_rows[0].startswith("key,status,")
    assert (out / "pareto.png").exists() and json.loads((out / "sweep.json").read_text()) == summary


@pytest.mark.parametrize("text,message", [
    ('[model]\npreset = ["gpt2-1.5b"]\n[cluster]\ngpus = 8\n', ":2: model.preset: got a list"),
    ('[model]\npreset = "gpt2-1.5b"\n[cluster]\ngpus = 8\n[plan]\nmicro_batch_size = []\n',
     ":6: plan.micro_batch_size: got an empty list"),
    ('[model]\npreset = "gpt2-1.5b"\n[cluster]\ngpus = 8\n[plan]\nmicro_batch_size = [1, "two"]\n',
     "plan.micro_batch_size[1]: got 'two'; expected an integer"),
    ('[model]\npreset = "gpt2-1.5b"\n[plan]\nmicro_batch_size = [1, 2]\n', "a sweep needs cluster.gpus"),
    ('[model]\npreset = "gpt2-1.5b"\n[cluster]\ngpus = 8\n[plan]\nmicro_batchsize = [1, 2]\n',
     "plan.micro_batchsize: unknown key"),
])
def test_sweep_file_errors_are_one_line_and_write_nothing(tmp_path, capsys, text, message):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    assert main(["sweep", str(f), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_progress_bar_redraws_on_a_terminal_and_writes_nothing_elsewhere_for_quick_work():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        p = Progress(4, stream=stream)
        p.step()
        p.step()
        p.close()
    assert "2/4" in tty.getvalue() and "ETA" in tty.getvalue() and "plans/s" in tty.getvalue()
    assert pipe.getvalue() == ""  # done well within the first few seconds


def test_progress_off_a_terminal_is_a_plain_line_every_few_seconds():
    # issue 44: nothing was printed for four minutes when stderr was not a terminal
    import time

    pipe = io.StringIO()
    start = time.monotonic() - 40.0  # the command began 40 s ago
    with Progress(112, stream=pipe, label="search", every_s=0.05, start=start) as p:
        p.step(37)
        time.sleep(0.3)  # one long simulation: the lines keep coming while it runs
    lines = pipe.getvalue().splitlines()
    assert 2 <= len(lines) <= 7 and "\r" not in pipe.getvalue()
    for line in lines:
        head, elapsed = line.split(", ")
        assert head == "search: 37/112 plans simulated"
        assert elapsed.endswith(" s elapsed") and 40.0 <= float(elapsed.split()[0]) < 60.0
    silent = io.StringIO()
    with Progress(4, stream=silent, enabled=False, every_s=0.01) as p:
        time.sleep(0.05)
    assert silent.getvalue() == ""


# ---------------------------------------------------------------- workers that cannot start
_SCRIPT = """\
import multiprocessing, sys
from sim.inputs.plan import ParallelPlan
from sim.studies.sweep import ResultsLog, Runner, evaluate
{before}
def sweep():
    plans = [ParallelPlan(dp=d, global_batch_size=8) for d in (1, 2, 4, 8)]
    with Runner(workers=2, progress=False, log=ResultsLog(sys.argv[1])) as runner:
        runner.run(None, plans)
    print("done")
{call}
"""


def _script(tmp_path, before="", guarded=False):
    script = tmp_path / "my_sweep.py"
    script.write_text(_SCRIPT.format(before=before, call='if __name__ == "__main__":\n    sweep()' if guarded
                                     else "sweep()"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    p = subprocess.run([sys.executable, str(script), str(tmp_path / "out" / "results.jsonl")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    return p, time.monotonic() - start


def _error_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.startswith("sim.studies.sweep.WorkerStartError: ")]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def _results_valid(tmp_path):
    f = tmp_path / "out" / "results.jsonl"
    assert not f.exists() or all(json.loads(x) for x in f.read_text().splitlines())  # nothing half-written


def test_a_script_without_the_main_guard_fails_fast_naming_the_guard(tmp_path):
    # Every spawned worker imports the script again, which starts a sweep of its own
    # while still bootstrapping: multiprocessing refuses, so no worker ever starts.
    p, took = _script(tmp_path)
    assert p.returncode != 0 and "done" not in p.stdout
    line = _error_line(p.stderr)
    assert "died while starting" in line and "before running any plan" in line, line
    assert "bootstrapping phase" in line and 'under `if __name__ == "__main__":`' in line, line
    assert "my_sweep.py" in line, line
    assert took < 45, took  # not minutes of retries
    _results_valid(tmp_path)


def test_a_worker_whose_import_fails_fails_fast_with_its_exception(tmp_path):
    before = ("if __name__ == '__mp_main__':  # imported again, in a spawned worker\n"
              "    raise ImportError('fancy_kernels: not installed on this machine')\n")
    p, took = _script(tmp_path, before=before, guarded=True)
    line = _error_line(p.stderr)
    assert "the worker said: ImportError: fancy_kernels: not installed on this machine" in line, line
    assert "bootstrapping" not in line and took < 45, (line, took)
    _results_valid(tmp_path)
    # The same script with workers that start: the sweep runs.
    (tmp_path / "out" / "results.jsonl").unlink(missing_ok=True)
    p, _ = _script(tmp_path, guarded=True)
    assert p.returncode == 0 and p.stdout.strip() == "done", p.stderr[-3000:]
    assert len((tmp_path / "out" / "results.jsonl").read_text().splitlines()) == 4


class _Cancelling:
    """An executor that cancels the first ``n`` submissions of each plan (as a Dask cluster
    sometimes does with the task of a worker that died) and runs the rest inline."""

    def __init__(self, n):
        import concurrent.futures as cf

        self.cf, self.n, self.seen = cf, n, {}

    def submit(self, fn, ctx, plan):
        f = self.cf.Future()
        k = plan_key(plan)
        self.seen[k] = self.seen.get(k, 0) + 1
        if self.seen[k] <= self.n:
            f.cancel()
            f.set_running_or_notify_cancel()  # as an executor does: waiters now see it done
        else:
            f.set_result(fn(ctx, plan))
        return f

    def shutdown(self, *a, **k):
        pass


class _LosesScatteredContext:
    """Stands in for a Dask client and its executor: the first context scattered is lost
    (as when the one worker holding it dies), so the cluster cancels every task that
    needs it; a context scattered later is there."""

    def __init__(self):
        import concurrent.futures as cf

        self.cf, self.scattered, self.submitted = cf, [], []

    def scatter(self, obj, broadcast=False, hash=True):
        self.scattered.append(obj)
        return ("scattered", len(self.scattered) - 1)

    def submit(self, fn, ref, plan):
        self.submitted.append(ref[1])
        f = self.cf.Future()
        if ref[1] == 0:
            f.cancel()
            f.set_running_or_notify_cancel()
        else:
            f.set_result(fn(self.scattered[ref[1]], plan))
        return f

    def shutdown(self, *a, **k):
        pass

    def close(self):
        pass


def test_a_plan_cancelled_with_its_scattered_context_lost_runs_again_with_it_scattered_again():
    plans = PLANS[:2]
    with Runner(workers=0, progress=False) as runner:
        runner._pool = runner._client = fake = _LosesScatteredContext()
        records = runner.run(CTX, plans)
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert len(fake.scattered) == 2  # up front, and again once the cancelled plans came back
    assert fake.submitted == [0, 0, 1, 1]  # both plans with the lost context, then again with the new one
    with Runner(workers=0) as inline:
        assert records == inline.run(CTX, plans)


@pytest.mark.parametrize("cancels,status", [(1, "ok"), (2, "ok"), (3, "crashed")])
def test_a_plan_the_executor_cancels_is_submitted_again(cancels, status):
    plans = PLANS[:2]
    with Runner(workers=0, max_retries=2) as runner:
        runner._pool = pool = _Cancelling(cancels)
        records = runner.run(CTX, plans)
    assert [r["status"] for r in records] == [status, status]
    assert pool.seen == {plan_key(p): min(cancels + 1, 3) for p in plans}  # at most 1 + max_retries
    if status == "crashed":
        assert records[0]["error"] == "the executor cancelled this plan 3 times"
    else:
        with Runner(workers=0) as inline:
            assert records == inline.run(CTX, plans)


def test_a_worker_does_not_grow_point_after_point(monkeypatch):
    # A worker process opts into sim.gc_tuning (init_worker), which freezes what a
    # simulation leaves alive; some of it is in reference cycles that only the collector
    # frees. A worker runs point after point: once more than
    # COLLECT_FROZEN objects were frozen since the last collection, the next simulation
    # collects them, so over 30 points the frozen count falls back at least once and
    # never rises more than COLLECT_FROZEN and one point's rise above where it started
    # (after a first point, which freezes the process's own objects too).
    import gc

    from sim import gc_tuning

    monkeypatch.setattr(gc_tuning, "COLLECT_FROZEN", 30_000)
    with gc_tuning.tuned():  # (a worker: tune_process, for the rest of its life)
        evaluate(CTX, PLANS[0])
        counts = [gc.get_freeze_count()]
        for i in range(30):
            evaluate(CTX, PLANS[i % len(PLANS)])
            counts.append(gc.get_freeze_count())
    rise = max(b - a for a, b in zip(counts, counts[1:]))
    assert 0 < rise < 30_000
    assert max(counts) <= counts[0] + 30_000 + rise
    assert any(b < a for a, b in zip(counts, counts[1:]))  # collected at least once
    gc.unfreeze()


def test_sweep_reports_progress_off_a_terminal_and_its_wall_time(tmp_path, capsys, monkeypatch):
    # issue 44: nothing on stderr for minutes when it is not a terminal
    import re

    import sim.progress

    monkeypatch.setattr(sim.progress, "LINE_EVERY_S", 0.05)
    toml = tmp_path / "sweep.toml"
    toml.write_text(SWEEP_TOML)
    t0 = time.monotonic()
    assert main(["sweep", str(toml), "--workers", "0"]) == 0
    wall = time.monotonic() - t0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines and all(re.fullmatch(r"sweep: \d+/16 plans simulated, \d+\.\d s elapsed", x) for x in lines), err
    reported = float(re.search(r"16 simulated .* in ([\d.]+) s \(wall time\)", out).group(1))
    assert 0 < reported <= wall + 0.05
