"""A search you can budget (issue 54, item 4): progress counts the simulations the search will
run, ``--max-time`` and Ctrl-C/SIGTERM stop it with the best so far, each listed plan comes
with the ``trainsim run`` command that reproduces it (layer split included), and a plan left
out only because of its split is named."""

import io
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sim.cli import main
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.program.build import BuildContext
from sim.program.estimate import estimate_in
from sim.progress import ProgressBar
from sim.studies.search import SearchSpace, candidates, enumerate_plans, even_splits
from sim.units import Duration

ROOT = Path(__file__).resolve().parent.parent
# 7 layers on pp 2: every plan has an uneven split, which the printed command must carry
UNEVEN = ["--num-layers", "7", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "4096",
          "--seq-length", "256", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch-size", "16"]


def _json(argv, capsys, code=0):
    assert main(argv) == code
    return json.loads(capsys.readouterr().out)


def test_each_printed_run_command_reproduces_its_plan_layer_split_included(capsys):
    out = _json(["search", *UNEVEN, "--pp", "2", "--tp", "1,2", "--micro-batch-size", "1,2", "--zero", "1",
                 "--recompute", "none", "--sequence-parallel", "off", "--workers", "0", "--top", "3", "--json"],
                capsys)
    assert len(out["commands"]) == len(out["top"]) == 3
    for entry, command in zip(out["top"], out["commands"]):
        argv = shlex.split(command)
        assert argv[:2] == ["trainsim", "run"]
        split = ",".join(map(str, entry["plan"]["layer_split"]))
        assert argv[argv.index("--layer-split") + 1] == split
        assert len(entry["plan"]["layer_split"]) == entry["plan"]["pp"] * entry["plan"]["vpp"]
        ran = _json([*argv[1:], "--json"], capsys)
        assert ran == {k: v for k, v in entry.items() if k != "key"}  # the winner's iteration time among the rest
    assert out["best"]["iteration_time_s"] == _json([*shlex.split(out["commands"][0])[1:], "--json"],
                                                    capsys)["iteration_time_s"]


def test_the_text_lists_a_run_command_under_the_table(capsys):
    assert main(["search", *UNEVEN, "--pp", "2", "--tp", "1", "--micro-batch-size", "1", "--zero", "1,2",
                 "--recompute", "none", "--sequence-parallel", "off", "--workers", "0", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "each listed plan on its own (trainsim run prints the same iteration time):" in out
    lines = [x for x in out.splitlines() if x.lstrip().startswith(("1  trainsim run", "2  trainsim run"))]
    assert len(lines) == 2 and all("--layer-split " in x for x in lines)
    assert ", split " in out.split("each listed plan")[0]  # the table shows the split too


def test_a_plan_left_out_only_because_of_its_split_is_named(capsys, tmp_path):
    # The GPU's memory is set between the estimate of the fastest plan with its time-balanced
    # split and with another even split: it is pruned for memory, and the search says why.
    model = gpt("t", 7, 4096, 32, 50304, 2048)
    h100 = load_profile("h100-sxm")
    space = SearchSpace(tp=(1,), pp=(2,), micro_batch_size=(1,), zero_stage=(1,), schedule=("1f1b",),
                        recompute=("none",), sequence_parallel=(False,))
    (cand,) = candidates(model, enumerate_plans(model, 8, 32, space), h100)
    alt = {s: estimate_in(BuildContext.create(model, replace(cand.plan, layer_split=s), h100)).memory["total"]
           for s in even_splits(model, cand.plan)}
    split, peak = min(alt.items(), key=lambda kv: kv[1])
    own = cand.estimate.memory["total"]
    assert peak < own
    profile = tmp_path / "h100-less.json"
    replace(h100, name="h100-less", hbm_capacity_bytes=int((peak + own) / 2)).save(profile)
    argv = ["search", "--num-layers", "7", "--hidden-size", "4096", "--num-attention-heads", "32", "--vocab-size",
            "50304", "--seq-length", "2048", "--gpu", str(profile), "--topology", "dgx-h100", "--gpus", "8",
            "--global-batch-size", "32", "--pp", "2", "--tp", "1,2", "--micro-batch-size", "1", "--zero", "1",
            "--schedule", "1f1b", "--recompute", "none,full", "--sequence-parallel", "off", "--workers", "0"]
    out = _json([*argv, "--json"], capsys)
    assert out["top"], "no plan ran and fit: the case needs one listed"
    (x,) = out["split_only"]
    assert x["key"] == cand.key and x["fits_with_split"] == list(split)
    assert x["peak_bytes"] == own and x["peak_bytes_with_split"] == peak
    assert x["bound_s"] < out["top"][-1]["iteration_time_s"]
    assert f"--layer-split {','.join(map(str, split))}" in x["command"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    table = text.split("\n\n")[1]
    assert "left out only because of its layer split" in table and x["command"] in table


def test_progress_names_its_phase_then_counts_what_it_may_still_run():
    s = io.StringIO()
    bar = ProgressBar(None, stream=s, label="search", every_s=0.01, noun="simulations")
    bar.phase("enumerating the plans of 8 GPUs")
    while "enumerating" not in s.getvalue():  # the periodic line, off a terminal
        time.sleep(0.01)
    bar.set_total(40)
    bar.step(3)
    bar.set_total(5)  # the pruning ruled most of them out
    bar.step(2)
    bar.set_total(2)  # never below what is done
    assert (bar.done, bar.total) == (5, 5)
    bar.close()
    assert s.getvalue().splitlines()[0].startswith("search: enumerating the plans of 8 GPUs, ")
    assert s.getvalue().splitlines()[-1].startswith("search: ")


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("10m", 600), ("1.5h", 5400), ("1h30m", 5400)])
def test_max_time_reads_durations(text, seconds):
    assert Duration()(text) == seconds


@pytest.mark.parametrize("bad", ["0", "-5", "ten", "1h1h", "5x"])
def test_a_bad_max_time_is_one_line_naming_the_flag(bad, capsys):
    assert main(["search", *UNEVEN, "--workers", "0", f"--max-time={bad}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainsim: error: --max-time: got '{bad}'; expected a duration > 0") and err.count("\n") == 1


def test_max_time_stops_the_simulations_with_the_best_so_far(capsys, monkeypatch):
    import sim.session

    simulate, calls = sim.session.simulate_training, []

    def third_one_outlasts_the_budget(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            time.sleep(8.5)  # past --max-time 8s, whatever came before (8 s: room for a loaded machine before it)
        return simulate(*a, **k)

    monkeypatch.setattr(sim.session, "simulate_training", third_one_outlasts_the_budget)
    argv = ["search", *UNEVEN, "--pp", "1,2", "--tp", "1,2", "--micro-batch-size", "1,2", "--zero", "1",
            "--recompute", "none", "--sequence-parallel", "off", "--screen", "off", "--workers", "0",
            "--max-time", "8s"]
    out = _json([*argv, "--json"], capsys)
    assert out["stopped"] == "max-time" and out["not_simulated"] > 0
    assert 2 <= out["evaluated"] == len(calls)  # each simulation that ran is in the result
    assert out["evaluated"] + out["not_simulated"] + out["pruned"] == out["plans"]
    assert out["best"] is not None and out["best"] == out["top"][0]


def _start(argv, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def foreground_sigint():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    return subprocess.Popen([sys.executable, "-m", "sim", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=cwd, preexec_fn=foreground_sigint)


@pytest.mark.parametrize("sig,code,said,workers", [(signal.SIGTERM, 143, "SIGTERM", "2"),
                                                   (signal.SIGINT, 130, "Ctrl-C (SIGINT)", "0")])
def test_a_signal_stops_the_search_with_the_best_so_far_and_nothing_leaked(sig, code, said, workers, tmp_path):
    out_dir = tmp_path / "out"
    argv = ["search", "--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16", "--vocab-size",
            "8192", "--seq-length", "512", "--gpu", "h100-sxm", "--nodes", "1", "--global-batch-size", "64",
            "--tp", "1,2", "--pp", "1,2", "--micro-batch-size", "1,2", "--zero", "1", "--recompute", "none",
            "--schedule", "1f1b", "--sequence-parallel", "off", "--screen", "off", "--margin", "inf",
            "--workers", workers, "--out", str(out_dir)]
    proc = _start(argv, tmp_path)
    results = out_dir / "results.jsonl"
    deadline = time.monotonic() + 120  # a polling limit
    while time.monotonic() < deadline and proc.poll() is None:
        if results.exists() and results.read_text().count("\n") >= 1:  # a plan simulated
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the search ended before the signal (exit {proc.returncode})"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err and "leaked" not in err, err
    assert f"stopped by {said} after " in out and "the best so far" in out
    done = {json.loads(x)["key"]: json.loads(x) for x in results.read_text().splitlines()}  # whole lines only
    summary = json.loads((out_dir / "search.json").read_text())
    assert summary["stopped"] == said.split()[-1].strip("()") and summary["best"]["key"] in done
    assert summary["best"]["iteration_time_s"] == min(r["summary"]["iteration_time_s"] for r in done.values()
                                                      if r["status"] == "ok" and r["summary"]["fits"])
    assert "  1  dp " in out and "  1  trainsim run " in out
    assert "rerun with --resume" in err


def test_the_count_of_simulations_falls_as_the_pruning_learns_and_ends_exact():
    from sim.inputs.topology_build import load_topology
    from sim.studies.search import SearchOptions, search, screen_sizes
    from sim.studies.sweep import evaluate, make_context

    model = gpt("tiny", 4, 512, 8, 4096, 256)
    h100 = load_profile("h100-sxm")
    ctx = make_context(model, h100, load_topology("dgx-h100", nodes=1))
    space = SearchSpace(tp=(1, 2), pp=(1, 2), micro_batch_size=(1, 2), zero_stage=(0, 1), schedule=("1f1b",),
                        recompute=("none",), sequence_parallel=(False,))
    cands = candidates(model, enumerate_plans(model, 8, 64, space), h100)
    ran, told = [], []

    def simulate(plans):
        ran.extend(plans)
        return [evaluate(ctx, p) for p in plans]

    result = search(cands, simulate, SearchOptions(wave=2, screen=True, final=2),
                    planned=lambda n: told.append((len(ran), n)))
    fits = [c for c in cands if c.estimate.fits]
    screenable = sum(screen_sizes(c.plan) is not None for c in fits)
    most = len(fits) + screenable + min(2, screenable)
    assert result.counts["pruned_time"] > 0  # the pruning ruled plans out as it went
    assert screenable and told[0] == (0, most)  # first: every plan that fits, twice if screened, and the finalists' full runs
    assert all(done <= n for done, n in told) and told[-1] == (len(ran), len(ran))  # last: exactly what ran
    assert [n for _, n in told] == sorted((n for _, n in told), reverse=True)  # no screening failed: only falls
    assert told[-2][1] < most
