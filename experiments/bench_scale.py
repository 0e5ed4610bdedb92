"""Benchmark: how fast trainsim simulates production-size runs (issue "Speed and scale").

For GPT-3 175B on 1,024 and 1,536 A100s (Megatron-LM plans: tp 8 x pp 16 x dp 8 and
tp 8 x pp 12 x dp 16, batch 1536) and Llama 3 405B on 8,192 and 16,384 H100s (tp 8 x
pp 16, batch 2048 sequences of 8192 tokens), at reduced and full fidelity, it prints the
wall time of one simulated iteration, the SimPy events processed, events per second and
the peak RSS. Each case runs in a fresh process (so RSS is its own) with a time limit;
cases over the limit are reported as such, not guessed. It also measures a bare SimPy
loop of timeouts in the same run and reports the engine's event rate as a ratio of it.

    python experiments/bench_scale.py [--repeat 2] [--limit 600] [--only reduced|full] [--case TEXT]

Targets (benchmarks, not tests): reduced fidelity Llama 3 405B on 16,384 GPUs under
10 s and 2 GB; full fidelity GPT-3 175B on 1,024 GPUs under 60 s; engine event rate at
least a third of the bare loop's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

CASES = [
    # name, model, gpu, nodes, tp, pp, global batch, extra flags
    ("gpt3-175b 1024xA100", "gpt3-175b", "a100-80gb", 128, 8, 16, 1536, []),
    ("gpt3-175b 1536xA100", "gpt3-175b", "a100-80gb", 192, 8, 12, 1536, []),
    ("llama3-405b 8192xH100", "llama3-405b", "h100-sxm", 1024, 8, 16, 2048,
     ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
      "--recompute-granularity", "full", "--sequence-parallel"]),
    ("llama3-405b 16384xH100", "llama3-405b", "h100-sxm", 2048, 8, 16, 2048,
     ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
      "--recompute-granularity", "full", "--sequence-parallel"]),
]

_CHILD = r"""
import json, resource, sys, time
from sim.cli import build_parser
from sim.commands import run as R
from sim.commands._spec import model_from_args, plan_from_args
from sim.hardware import load_profile
from sim.training import simulate_training
args = build_parser().parse_args(json.loads(sys.argv[1]))
t0 = time.perf_counter()
model = model_from_args(args); profile = load_profile(args.gpu); args.gpus = R._gpus(args)
plan = plan_from_args(args, model); topo = R._cluster(args, plan.world_size, profile.name)
run = simulate_training(model, plan, profile, topo, None, args.fidelity)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "iteration_s": run.trace.end_s, **run.trace.stats,
                  "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def bare_simpy_rate(n: int = 300_000) -> float:
    """Events per second of a bare SimPy loop of timeouts (one process, n timeouts)."""
    import simpy

    env = simpy.Environment()

    def proc():
        for _ in range(n):
            yield env.timeout(1.0)

    env.process(proc())
    t0 = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t0)  # each timeout is one event (plus a process resume)


def run_case(case, fidelity: str, limit: float) -> dict:
    name, model, gpu, nodes, tp, pp, gb, extra = case
    argv = ["run", "--model", model, "--gpu", gpu, "--nodes", str(nodes), "--tensor-model-parallel-size", str(tp),
            "--pipeline-model-parallel-size", str(pp), "--global-batch-size", str(gb), "--fidelity", fidelity,
            "--bucket-size", "1GB", *extra]
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(argv)], capture_output=True, text=True,
                             timeout=limit)
    except subprocess.TimeoutExpired:
        return {"skipped": f"over the {limit:.0f} s limit"}
    if out.returncode != 0:
        return {"skipped": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=2, help="runs per case; the median is printed (default 2)")
    ap.add_argument("--limit", type=float, default=600, help="seconds allowed per run (default 600)")
    ap.add_argument("--only", choices=("reduced", "full"), help="one fidelity only")
    ap.add_argument("--case", default="", help="only the cases whose name contains this text (e.g. 1024xA100)")
    args = ap.parse_args()
    bare = statistics.median(bare_simpy_rate() for _ in range(3))
    print(f"bare SimPy loop: {bare:,.0f} events/s")
    print("wall s: one simulated iteration end to end (topology, program, engine); events/s: SimPy events")
    print("processed per second of the engine's own run, and as a ratio of the bare loop's rate")
    print(f"{'case':<24} {'fidelity':<8} {'wall s':>8} {'events':>11} {'events/s':>10} {'vs bare':>8} "
          f"{'RSS MB':>8} {'iteration s':>12}")
    for case in (c for c in CASES if args.case in c[0]):
        for fidelity in ("reduced", "full"):
            if args.only and fidelity != args.only:
                continue
            runs = [run_case(case, fidelity, args.limit) for _ in range(args.repeat)]
            done = [r for r in runs if "skipped" not in r]
            if not done:
                print(f"{case[0]:<24} {fidelity:<8} skipped: {runs[0]['skipped']}")
                continue
            wall = statistics.median(r["wall_s"] for r in done)
            eng = statistics.median(r["engine_wall_s"] for r in done)
            ev = done[0]["events"]
            rss = max(r["rss_bytes"] for r in done) / 2**20
            print(f"{case[0]:<24} {fidelity:<8} {wall:8.2f} {ev:11,d} {ev / eng:10,.0f} {ev / eng / bare:8.2f} "
                  f"{rss:8.0f} {done[0]['iteration_s']:12.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
