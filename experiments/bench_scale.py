"""Benchmark: how fast trainsim simulates production-size runs (issue "Speed and scale").

For the ZeRO paper's 7.5B model on 64 A100s (plain data parallelism, ZeRO-1, batch 64),
GPT-3 175B on 1,024 and 1,536 A100s (Megatron-LM plans: tp 8 x pp 16 x dp 8 and
tp 8 x pp 12 x dp 16, batch 1536) and Llama 3 405B on 8,192 and 16,384 H100s (tp 8 x
pp 16, batch 2048 sequences of 8192 tokens), and mixtures of experts (Mixtral 8x22B on
256 H100s: tp 2 x pp 4, ep 8; DeepSeek-V3 on 512 and 1,024 H100s: tp 2 x pp 8, ep 64,
batch 4096, balanced and zipf-skewed routing), at reduced fidelity and at full fidelity
under both collective models (flows and steps; DeepSeek-V3 at reduced fidelity only,
``REDUCED_ONLY``), it prints the
wall time of one simulated iteration, the SimPy events processed, events per second and
the peak RSS. Each case runs in a fresh process (so RSS is its own) with a time limit;
cases over the limit are reported as such, not guessed. The engine's time is split into
set-up (indexing the program, routes and collective steps, before the clock starts), the
event loop, and the assembly of the trace (spans, link totals) after it. Its event rate
(SimPy events per second of the event loop) is also given as a ratio of a bare SimPy
loop of timeouts run in the same process right after (best of 3), and, to show what the
trace costs, the same ratio over the event loop and trace assembly together. A loop
shorter than a second (reduced fidelity: a few thousand events) is timed as the bare
loop is, best of 3 runs of the engine on the same program; a longer one, once.

    python experiments/bench_scale.py [--repeat 2] [--limit 600] [--only reduced|full] [--case TEXT]
                                      [--collective-models flows,steps]
    python experiments/bench_scale.py --search --fit --suite [--repeat 1] [--limit 1800]

``--search``, ``--fit`` and ``--suite`` each add one long row of issue 55's table, timed in a
fresh process (wall time, and the CPU time of the command and all its workers, which on a
shared machine says more): ``trainsim search`` of DeepSeek-V3 on 1,024 H100s over its layouts
(``SEARCH``, about 3 minutes on a quiet machine on the evening of 2026-12-06, 10 before issue 55),
``trainsim fit --gpu h100-sxm`` with every held-out fit (``FIT``, 5 to 10 minutes that day, 11
before) and ``make
test`` in a fresh clone of the committed tree (installs included, about 6 minutes; docs/limits.md
has the dated runs). ``--search-args`` and ``--fit-args`` replace the
command's arguments (to try the flags on a small case), ``--suite-target`` the make target.
With any of them only those rows run.

``--case replay`` runs only ``trainsim replay`` of 64 ranks' synthetic Kineto traces of
2,000 kernels each (``sim.replay.synthetic``), the command's wall time from the files
(and its CPU time: on a shared machine the wall time measures the other users too).

Targets (benchmarks, not tests): replay of 64 ranks x 2,000 kernels under 10 s;
reduced fidelity Llama 3 405B on 16,384 GPUs under
10 s and 2 GB; full fidelity GPT-3 175B on 1,024 GPUs under 60 s; engine event rate at
least a third of the bare loop's; DeepSeek-V3 on 512 and 1,024 GPUs under 60 s and 2 GB
(aim 10 s), skewed routing within twice that.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

_MOE = ["--expert-tensor-parallel-size", "1", "--sequence-parallel", "--zero", "1"]
_DEEPSEEK = _MOE + ["--expert-model-parallel-size", "64", "--decoder-first-pipeline-num-layers", "7",
                    "--decoder-last-pipeline-num-layers", "6"]
"""DeepSeek-V3 as issue #40 runs it: tp 2, pp 8 (61 layers as 7 + 6 x 8 + 6), ep 64 over each stage's GPUs."""

CASES = [
    # name, model, gpu, nodes, tp, pp, global batch, extra flags
    ("zero-7.5b 64xA100 dp", "zero-7.5b", "a100-80gb", 8, 1, 1, 64, ["--zero", "1"]),
    ("gpt3-175b 1024xA100", "gpt3-175b", "a100-80gb", 128, 8, 16, 1536, []),
    ("gpt3-175b 1536xA100", "gpt3-175b", "a100-80gb", 192, 8, 12, 1536, []),
    ("llama3-405b 8192xH100", "llama3-405b", "h100-sxm", 1024, 8, 16, 2048,
     ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
      "--recompute-granularity", "full", "--sequence-parallel"]),
    ("llama3-405b 16384xH100", "llama3-405b", "h100-sxm", 2048, 8, 16, 2048,
     ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
      "--recompute-granularity", "full", "--sequence-parallel"]),
    # Mixtures of experts (issue #40): each all-to-all is one bundle of flows
    ("mixtral-8x22b 256xH100", "mixtral-8x22b", "h100-sxm", 32, 2, 4, 1024, _MOE + ["--expert-model-parallel-size", "8"]),
    ("deepseek-v3 512xH100", "deepseek-v3", "h100-sxm", 64, 2, 8, 4096, _DEEPSEEK),
    ("deepseek-v3 1024xH100", "deepseek-v3", "h100-sxm", 128, 2, 8, 4096, _DEEPSEEK),
    ("deepseek-v3 1024xH100 zipf", "deepseek-v3", "h100-sxm", 128, 2, 8, 4096,
     _DEEPSEEK + ["--moe-routing", "zipf:1.2"]),
]
SEARCH = ("search --model deepseek-v3 --gpu h100-sxm --gpus 1024 --global-batch-size 4096 --zero 1 "
          "--schedule 1f1b,interleaved --micro-batch-size 1 --workers 2")
"""Issue 55's search row: every ep, etp, tp, pp, vpp, recompute and dispatcher of DeepSeek-V3 on
1,024 H100s (7,086 plans; docs/search.md)."""
FIT = ("fit ../shared/fit-data/published_runs.csv experiments/fit-data/fsdp_runs.csv --gpu h100-sxm "
       "--params sustained_compute_fraction,fp8_gemm_max_efficiency,gpu_speed_spread --jobs 2")
"""Issue 55's fit row: the H100 refit with every held-out fit (docs/accuracy.md, the refit of 2026-12-05)."""
REDUCED_ONLY = ("deepseek-v3",)
"""Cases run at reduced fidelity only (what ``--fidelity auto`` picks for them): at full
fidelity their 4,096 sequences are tens of millions of events on every GPU."""

_BARE = r"""
import time
import simpy
def bare(n=200_000):  # events per second of a bare SimPy loop of timeouts
    env = simpy.Environment()
    def proc():
        for _ in range(n):
            yield env.timeout(1.0)
    env.process(proc())
    t = time.perf_counter(); env.run()
    return n / (time.perf_counter() - t)
"""

_CHILD = _BARE + r"""
import json, resource, sys, time
from sim import gc_tuning, session
gc_tuning.tune_process()  # (as the trainsim command: the collector paused around each simulation)
from sim.cli import build_parser
from sim.inputs.flags import given
from sim.inputs.schema import RunSettings, SimulationSettings
args = build_parser().parse_args(json.loads(sys.argv[1]))
t0 = time.perf_counter()
prepared = session.prepare(RunSettings.from_values(given(args)))
profile, topo = prepared.profile, prepared.topology
sim_settings = prepared.settings.simulation
run = session.simulate_training(session.Job(prepared.model, prepared.plan, profile, topo),
                                SimulationSettings(fidelity=sim_settings.fidelity, max_events=float("inf"),
                                                   collective_model=sim_settings.collective_model))
wall = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
stats = dict(run.trace.stats)
if stats["engine_loop_s"] < 1.0:  # a short loop: the engine's best of 3, as the bare loop's
    from sim.engine.core import simulate
    again = [simulate(run.program, topo, link_efficiency=profile.link_efficiencies(),
                      fluid_collectives=run.collective_model == "flows").stats for _ in range(2)]
    best = min([stats, *again], key=lambda s: s["engine_loop_s"])
    stats["engine_loop_s"], stats["engine_wall_s"] = best["engine_loop_s"], best["engine_wall_s"]
print(json.dumps({"wall_s": wall, "iteration_s": run.trace.end_s, **stats, "rss_bytes": rss,
                  "bare_events_per_s": max(bare() for _ in range(3))}))
"""


_FLOOR = _BARE + r"""
import json, time
from sim import gc_tuning
gc_tuning.tune_process()
from sim.program.actions import Action, Program
from sim.engine.core import simulate
from sim.inputs.topology_build import load_topology
acts = {r: [Action.new(f"c{i}", stream="compute", duration_s=1e-3 * (1 + (i * 7 + r) % 5), deps=(f"c{i-1}",) if i else ())
            for i in range(4000)] for r in range(32)}
runs = [simulate(Program(acts, check=False), load_topology("dgx-h100", nodes=4), check_invariants=False).stats
        for _ in range(3)]  # (a loop under a second: best of 3, as the bare loop's)
print(json.dumps({**min(runs, key=lambda s: s["engine_loop_s"]), "bare_events_per_s": max(bare() for _ in range(3))}))
"""


def engine_floor() -> dict:
    """The engine on a program of compute actions alone (32 ranks x 4,000 chained actions):
    its per-event cost without the network or any rendezvous."""
    out = subprocess.run([sys.executable, "-c", _FLOOR], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def run_case(case, fidelity: str, limit: float, collective_model: str = "flows") -> dict:
    name, model, gpu, nodes, tp, pp, gb, extra = case
    argv = ["run", "--model", model, "--gpu", gpu, "--nodes", str(nodes), "--tensor-model-parallel-size", str(tp),
            "--pipeline-model-parallel-size", str(pp), "--global-batch-size", str(gb), "--fidelity", fidelity,
            "--collective-model", collective_model, "--bucket-size", "1GB", *extra]
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(argv)], capture_output=True, text=True,
                             timeout=limit)
    except subprocess.TimeoutExpired:
        return {"skipped": f"over the {limit:.0f} s limit"}
    if out.returncode != 0:
        return {"skipped": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
    return json.loads(out.stdout)


def replay_case(ranks: int = 64, kernels: int = 2000, limit: float = 600) -> dict:
    """``trainsim replay`` of synthetic Kineto traces (``sim.replay.synthetic``: ``ranks``
    data-parallel ranks of ``kernels`` kernels each, an all-reduce every 100), every rank
    traced, from .json files: the command's wall time in a fresh process (start-up,
    reading, graph building, the engine and the report)."""
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from sim.replay.synthetic import data_parallel_job

    with tempfile.TemporaryDirectory() as d:
        files = []
        for r, doc in enumerate(data_parallel_job(ranks, kernels)):
            files.append(str(Path(d) / f"rank{r}.json"))
            Path(files[-1]).write_text(json.dumps(doc))
        import resource

        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        try:
            out = subprocess.run([sys.executable, "-m", "sim", "replay", *files, "--json"], capture_output=True,
                                 text=True, timeout=limit, cwd=Path(__file__).resolve().parent.parent)
        except subprocess.TimeoutExpired:
            return {"skipped": f"over the {limit:.0f} s limit"}
        wall = time.perf_counter() - t
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode != 0:
            return {"skipped": out.stderr.strip() or "failed"}
        s = json.loads(out.stdout)
        return {"wall_s": wall, "cpu_s": cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
                "iteration_s": s["iteration_time_s"], "traced_s": s["traced_step_s"]}


def _timed(argv: list[str], limit: float, cwd) -> dict:
    """Run ``argv`` in a fresh process: its wall time and the CPU time (user + sys) of it and
    every process it waited for (the workers of search and fit), or why it did not finish."""
    import resource

    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=limit, cwd=cwd)
    except subprocess.TimeoutExpired:
        return {"skipped": f"over the {limit:.0f} s limit"}
    wall = time.perf_counter() - t
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        return {"skipped": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return {"wall_s": wall, "cpu_s": cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
            "stdout": out.stdout}


def command_case(kind: str, args: str, limit: float) -> dict:
    """``trainsim search`` or ``trainsim fit`` with ``args`` and ``--json``: wall and CPU time,
    and what it found (the best plan and its time; the fitted values and held-out error)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    r = _timed([sys.executable, "-m", "sim", *args.split(), "--json"], limit, root)
    if "skipped" in r:
        return r
    obj = json.loads(r.pop("stdout"))
    if kind == "search":
        r["found"] = (f"best {obj['best']['key']}, {obj['best']['iteration_time_s']:.3f} s; "
                      f"{obj['plans']} plans, {obj['evaluated']} simulated")
    else:
        vals = ", ".join(f"{p['name']} {p['fitted']:.4g}" for p in obj["parameters"])
        r["found"] = (f"{vals}; mean |error| {obj['mean_abs_error']:.2%}, held out {obj['loo_mean_abs_error']:.2%}; "
                      f"{obj['simulations']} simulations")
    return r


def suite_case(target: str, limit: float) -> dict:
    """``make TARGET`` (default ``test``: installs, the wheel check and the whole suite) in a
    fresh clone of the committed tree, as CI runs it."""
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(["git", "clone", "-q", str(root), str(Path(d) / "clone")], check=True)
        r = _timed(["make", target], limit, Path(d) / "clone")
    r.pop("stdout", None)
    if "skipped" not in r:
        r["found"] = f"make {target} in a fresh clone"
    return r


def long_rows(args) -> None:
    """The rows of ``--search``, ``--fit`` and ``--suite`` (medians of ``--repeat`` runs)."""
    print(f"{'case':<24} {'wall s':>8} {'CPU s':>8}  result")
    todo = [("search", lambda: command_case("search", args.search_args, args.limit)) if args.search else None,
            ("fit", lambda: command_case("fit", args.fit_args, args.limit)) if args.fit else None,
            ("suite", lambda: suite_case(args.suite_target, args.limit)) if args.suite else None]
    for name, fn in filter(None, todo):
        runs = [fn() for _ in range(args.repeat)]
        done = [r for r in runs if "skipped" not in r]
        if not done:
            print(f"{name:<24} skipped: {runs[0]['skipped']}", flush=True)
            continue
        print(f"{name:<24} {statistics.median(r['wall_s'] for r in done):8.1f} "
              f"{statistics.median(r['cpu_s'] for r in done):8.1f}  {done[0]['found']}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=2, help="runs per case; the median is printed (default 2)")
    ap.add_argument("--limit", type=float, default=600, help="seconds allowed per run (default 600)")
    ap.add_argument("--only", choices=("reduced", "full"), help="one fidelity only")
    ap.add_argument("--case", default="", help="only the cases whose name contains this text (e.g. 1024xA100, "
                                               "replay)")
    ap.add_argument("--collective-models", default="flows,steps",
                    help="collective models to run at full fidelity, comma-separated (default flows,steps; "
                         "reduced fidelity always runs flows)")
    ap.add_argument("--search", action="store_true", help="time trainsim search of DeepSeek-V3 on 1,024 H100s (SEARCH)")
    ap.add_argument("--search-args", default=SEARCH, help="the search's arguments instead of SEARCH's")
    ap.add_argument("--fit", action="store_true", help="time trainsim fit --gpu h100-sxm with its held-out fits (FIT)")
    ap.add_argument("--fit-args", default=FIT, help="the fit's arguments instead of FIT's")
    ap.add_argument("--suite", action="store_true", help="time make test in a fresh clone of the committed tree")
    ap.add_argument("--suite-target", default="test", help="the make target of --suite (default test)")
    args = ap.parse_args()
    if args.search or args.fit or args.suite:
        long_rows(args)
        return 0
    print("wall s: one simulated iteration end to end (topology, program, engine); set-up s: the engine's")
    print("indexing of the program, routing and collective planning before the clock starts; loop s: its")
    print("event loop; trace s: assembling the trace after it; events/s: SimPy events per second of the")
    print("loop (best of 3 if under a second); vs bare: that rate as a ratio of a bare SimPy loop of")
    print("timeouts run in the same process right after (best of 3); +trace: the same ratio over the loop")
    print("and the trace assembly together;")
    print("entries: SimPy queue entries (timed calls due at one instant share one: sim.engine.kernel.Calls)")
    models = [m for m in args.collective_models.split(",") if m]
    print("model: the collective model (flows: a ring hop is one flow; steps: 2(n-1) lock-step rounds)")
    print(f"{'case':<24} {'fidelity':<8} {'model':<6} {'wall s':>7} {'set-up s':>8} {'loop s':>7} {'trace s':>7} {'events':>11} "
          f"{'entries':>10} {'events/s':>9} {'vs bare':>7} {'+trace':>6} {'RSS MB':>7} {'iteration s':>11}")

    def rates(runs):
        rate = statistics.median(r["events"] / r["engine_loop_s"] for r in runs)
        ratio = statistics.median(r["events"] / r["engine_loop_s"] / r["bare_events_per_s"] for r in runs)
        with_trace = statistics.median(r["events"] / r["engine_wall_s"] / r["bare_events_per_s"] for r in runs)
        return f"{rate:9,.0f} {ratio:7.2f} {with_trace:6.2f}"

    if args.case and args.case in "replay 64x2000":
        runs = [replay_case(limit=args.limit) for _ in range(args.repeat)]
        done = [r for r in runs if "skipped" not in r]
        if not done:
            print(f"{'replay 64 ranks x 2000':<24} skipped: {runs[0]['skipped']}")
        else:
            print(f"{'replay 64 ranks x 2000':<24} {'-':<8} {'-':<6} {statistics.median(r['wall_s'] for r in done):7.2f}"
                  f"{'':>79} {done[0]['iteration_s']:11.3f}   (traced {done[0]['traced_s']:.3f} s; CPU time "
                  f"{statistics.median(r['cpu_s'] for r in done):.2f} s)", flush=True)
        return 0
    floors = [engine_floor() for _ in range(args.repeat)]
    fmed = lambda key: statistics.median(r[key] for r in floors)  # noqa: E731
    print(f"{'compute actions only':<24} {'-':<8} {'-':<6} {'':>7} {'':>8} {fmed('engine_loop_s'):7.2f} "
          f"{fmed('engine_wall_s') - fmed('engine_loop_s'):7.2f} {floors[0]['events']:11,d} "
          f"{floors[0]['queue_entries']:10,d} {rates(floors)}", flush=True)
    for case in (c for c in CASES if args.case in c[0]):
        for fidelity, model in [("reduced", "flows")] + [("full", m) for m in models]:
            if args.only and fidelity != args.only or fidelity == "full" and case[0].startswith(REDUCED_ONLY):
                continue
            runs = [run_case(case, fidelity, args.limit, model) for _ in range(args.repeat)]
            done = [r for r in runs if "skipped" not in r]
            if not done:
                print(f"{case[0]:<24} {fidelity:<8} {model:<6} skipped: {runs[0]['skipped']}")
                continue
            med = lambda key: statistics.median(r[key] for r in done)  # noqa: E731
            ev = done[0]["events"]
            rss = max(r["rss_bytes"] for r in done) / 2**20
            trace_s = statistics.median(r["engine_wall_s"] - r["engine_loop_s"] for r in done)
            print(f"{case[0]:<24} {fidelity:<8} {model:<6} {med('wall_s'):7.2f} {med('engine_setup_s'):8.2f} "
                  f"{med('engine_loop_s'):7.2f} {trace_s:7.2f} {ev:11,d} {done[0]['queue_entries']:10,d} {rates(done)} {rss:7.0f} "
                  f"{done[0]['iteration_s']:11.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
