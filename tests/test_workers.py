"""Worker processes die with their parent (sim.workers): fit, search and sweep with 2 workers,
the parent ended by SIGKILL, SIGTERM or SIGINT; no worker is left (checked by pid), no
semaphore is left in /dev/shm, and no leaked-semaphore warning is printed."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="semaphores in /dev/shm, PR_SET_PDEATHSIG")
ROOT = Path(__file__).resolve().parent.parent
WORKERS_GONE_S = 10  # the bound: a polling limit, not a timing assertion

SMALL_MODEL = ["--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16", "--vocab-size", "8192",
               "--seq-length", "512", "--gpu", "h100-sxm"]
SWEEP_TOML = """\
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
tensor_model_parallel_size = [1, 2]
pipeline_model_parallel_size = [1, 2]
micro_batch_size = [1, 2]
sequence_parallel = [false, true]
global_batch_size = 512
"""
FIT_ROW = dict(source="test a", gpu="a100-80gb", precision="bf16", num_layers=2, hidden_size=512,
               num_attention_heads=8, vocab_size=32000, seq_length=1024, activation="gelu",
               tensor_model_parallel_size=2, pipeline_model_parallel_size=1, sequence_parallel="false", needs="")


def _fit_csv(path: Path) -> Path:
    rows = [dict(FIT_ROW, source=f"test {s}", hidden_size=h, gpus=g, global_batch_size=2 * g,
                 measured_iteration_time_s=str(t))
            for s, h, t in (("a", 512, 0.05), ("b", 1024, 0.11), ("c", 768, 0.08)) for g in (8, 16)]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def _argv(command: str, tmp_path: Path) -> list[str]:
    if command == "fit":
        return ["fit", str(_fit_csv(tmp_path / "runs.csv")), "--gpu", "a100-80gb", "--jobs", "2",
                "--cache", str(tmp_path / "sims.jsonl"), "--out", str(tmp_path / "fitted.json")]
    if command == "search":
        return ["search", *SMALL_MODEL, "--nodes", "1", "--global-batch-size", "32", "--workers", "2",
                "--out", str(tmp_path / "out")]
    toml = tmp_path / "sweep.toml"
    toml.write_text(SWEEP_TOML)
    return ["sweep", str(toml), "--workers", "2", "--out", str(tmp_path / "out")]


def _foreground_sigint() -> None:
    # as a terminal's foreground job: SIGINT at its default (a test run in the background has it ignored)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _is_worker(p: psutil.Process) -> bool:
    """Not Python's resource tracker (which ends once the workers are gone: it is checked too)."""
    return "resource_tracker" not in " ".join(p.cmdline())


def _gone(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def start_with_workers(argv: list[str], cwd: Path, workers: int = 2):
    """The command in a subprocess, once ``workers`` of its worker processes are tied to it
    (each runs the watchdog thread, ``sim.workers.tie_to_parent``): (process, its children,
    the semaphores it holds open in /dev/shm)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "sim", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=cwd, preexec_fn=_foreground_sigint)
    parent = psutil.Process(proc.pid)
    children: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + 120
    ready = []
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            for c in parent.children(recursive=True):
                children.setdefault(c.pid, c)
            ready = [c for c in children.values() if not _gone(c) and _is_worker(c) and c.num_threads() >= 2]
        except psutil.NoSuchProcess:
            pass
        if len(ready) >= workers:
            break
        time.sleep(0.02)
    assert proc.poll() is None, f"the command ended before its workers started (exit {proc.returncode}): " \
                                f"{proc.communicate()[1][-2000:]}"
    assert len(ready) >= workers, "the workers did not start"
    sems = {m.path for m in parent.memory_maps() if "/dev/shm/sem." in m.path}
    return proc, list(children.values()), sems


def _left(children) -> list[int]:
    deadline = time.monotonic() + WORKERS_GONE_S
    while time.monotonic() < deadline:
        left = [c.pid for c in children if not _gone(c)]
        if not left:
            return []
        time.sleep(0.05)
    return [c.pid for c in children if not _gone(c)]


@pytest.mark.parametrize("command", ["fit", "search", "sweep"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["SIGKILL", "SIGTERM", "SIGINT"])
def test_no_worker_outlives_its_parent(command, sig, tmp_path):
    proc, children, sems = start_with_workers(_argv(command, tmp_path), tmp_path)
    assert sum(_is_worker(c) for c in children) >= 2
    proc.send_signal(sig)
    try:
        proc.wait(timeout=60)
        assert _left(children) == [], f"workers left after {sig.name}"
    finally:  # a worker that outlived its parent is this test's to end
        for c in children:
            if not _gone(c):
                c.kill()
    _, err = proc.communicate(timeout=60)
    assert sems, "the pool's semaphores were not found"
    assert [s for s in sems if os.path.exists(s)] == [], "semaphores left in /dev/shm"
    assert "leaked semaphore" not in err and "Traceback" not in err, err
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == (143 if sig == signal.SIGTERM else 130), err
        assert ("terminated (SIGTERM)" if sig == signal.SIGTERM else "interrupted") in err
    # nothing half-written: no output file but whole ones (a temporary is never left behind),
    # and the cache and results logs are whole lines but for a torn last one (dropped when read)
    assert not (tmp_path / "fitted.json").exists()
    for log in (tmp_path / "sims.jsonl", tmp_path / "out" / "results.jsonl"):
        if log.exists():
            for line in log.read_text().splitlines()[:-1]:
                json.loads(line)
    assert [p.name for p in tmp_path.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"] == []

