"""How fast sweeps run, and how far the analytic estimate is from the simulator.

Two questions, one script (``python experiments/bench_sweep.py [--plans N] [--sample N]``):

1. **Plans simulated per second** with 1 and 2 local worker processes (and a Dask
   LocalCluster of 2 workers when dask is installed): the same plans of a small GPT
   (8 layers, h = 1024) on 16 H100s, timed after the workers have started. A control
   (two CPU-bound loops in one process, then in two) says how much a second worker can
   gain on this machine right now: on a machine shared with other work, little.
2. **The estimate's error margin** that ``trainsim search`` prunes with
   (``sim.studies.search.DEFAULT_MARGIN``): over a seeded random sample of valid plans of two
   small models (a GPT on 16 GPUs, a Llama-style model with grouped-query attention on
   32), the ratio of the estimate's bound (``sim.studies.search.bound_s``) to the simulated
   iteration time, and of the full estimate to it. The margin must be at least the
   largest bound ratio, or pruning could drop the winner.

Writes ``experiments/out/bench_sweep/{throughput,margin}.csv``, ``summary.json`` and
``summary.md``, and prints the figures.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
import statistics
import time
from pathlib import Path

from sim.fileio import write_text_atomic
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt, llama
from sim.studies.search import DEFAULT_MARGIN, candidates, enumerate_plans
from sim.studies.sweep import Runner, make_context
from sim.inputs.topology_build import load_topology

OUT = Path(__file__).resolve().parent / "out" / "bench_sweep"
H100 = load_profile("h100-sxm")
GPT = gpt("gpt-8l-1024", 8, 1024, 16, 8192, 512)
LLAMA = llama("llama-8l-1024-gqa", 8, 1024, 16, 4, 2816, 8192, 1024)


def _fitting(model, gpus, gbs):
    return [c for c in candidates(model, enumerate_plans(model, gpus, gbs), H100) if c.status == "pending"]


def _burn(n: int = 5_000_000) -> int:
    s = 0
    for i in range(n):
        s += i
    return s


def headroom() -> float:
    """Speed-up of two pure-Python loops in two processes over one after the other: what
    the machine can give a second worker right now (2 on an idle machine with 2 cores)."""
    from sim.workers import ending_pool, process_pool

    t0 = time.perf_counter()
    _burn(), _burn()
    serial = time.perf_counter() - t0
    with ending_pool(process_pool(2, "fork")) as ex:  # tied to this process (sim.workers)
        list(ex.map(_burn, [10, 10]))
        t0 = time.perf_counter()
        list(ex.map(_burn, [5_000_000] * 2))
        return serial / (time.perf_counter() - t0)


def throughput(n: int, seed: int) -> list[dict]:
    topo = load_topology("dgx-h100", nodes=2)
    ctx = make_context(GPT, H100, topo)
    pool = [c for c in _fitting(GPT, 16, 32) if c.plan.tp <= 4]
    rng = random.Random(seed)
    warm, plans = [c.plan for c in rng.sample(pool, 4)], [c.plan for c in rng.sample(pool, n)]
    rows = []
    setups = [("local", 1), ("local", 2)]
    try:
        import distributed  # noqa: F401

        setups.append(("dask-local", 2))
    except ImportError:
        pass
    for kind, workers in setups:
        t0 = time.monotonic()
        with Runner(workers, "local" if kind == "dask-local" else None, progress=False) as runner:
            runner.run(ctx, warm)  # start the workers and import trainsim in them
            start_s = time.monotonic() - t0
            t1 = time.monotonic()
            recs = runner.run(ctx, plans)
            wall = time.monotonic() - t1
        ok = sum(r["status"] == "ok" for r in recs)
        rows.append({"executor": kind, "workers": workers, "plans": len(plans), "ok": ok, "wall_s": wall,
                     "plans_per_s": len(plans) / wall, "startup_s": start_s})
        print(f"  {kind:<10} {workers} worker(s): {len(plans)} plans in {wall:6.1f} s = "
              f"{len(plans) / wall:5.2f} plans/s (start-up and warm-up {start_s:.1f} s)")
    return rows


def margin(sample: int, seed: int, workers: int) -> list[dict]:
    rows = []
    cases = [(GPT, 16, 32, 2), (LLAMA, 32, 64, 4)]
    for model, gpus, gbs, nodes in cases:
        pool = [c for c in _fitting(model, gpus, gbs) if c.plan.tp <= 4]
        cs = random.Random(seed).sample(pool, min(sample if model is GPT else sample // 2, len(pool)))
        ctx = make_context(model, H100, load_topology("dgx-h100", nodes=nodes))
        with Runner(workers, progress=None) as runner:
            recs = runner.run(ctx, [c.plan for c in cs])
        for c, r in zip(cs, recs):
            if r["status"] != "ok":
                print(f"  {c.key}: {r['error']}")
                continue
            t = r["summary"]["iteration_time_s"]
            rows.append({"model": model.name, "gpus": gpus, "key": c.key, "simulated_s": t,
                         "estimate_s": c.estimate.time["step"], "bound_s": c.bound_s,
                         "bound_ratio": c.bound_s / t, "estimate_ratio": c.estimate.time["step"] / t})
    return rows


def _stats(xs):
    xs = sorted(xs)
    return {"min": xs[0], "median": statistics.median(xs), "max": xs[-1]}


def _write_csv(rows, path):
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\r\n")
    w.writeheader()
    w.writerows(rows)
    write_text_atomic(buf.getvalue(), path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=24, help="plans timed per executor")
    ap.add_argument("--sample", type=int, default=120, help="plans of the GPT sampled for the margin (Llama: half; 0: skip)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    print(f"plans simulated per second (small GPT, 16 x H100; {os.cpu_count()} cores, load average {load:.1f} "
          "before: other processes on the machine slow the workers down):")
    head = headroom()
    print(f"  control: two CPU-bound loops run {head:.2f}x faster in two processes than in one")
    thr = throughput(a.plans, a.seed)
    if a.sample == 0:
        _write_csv(thr, OUT / "throughput.csv")
        return
    print(f"estimate vs simulation on a sample (seed {a.seed}):")
    mar = margin(a.sample, a.seed, 2)
    summary = {"throughput": thr, "margin": {}, "default_margin": DEFAULT_MARGIN, "cores": os.cpu_count(),
               "load_average_before": load,
               "two_process_headroom": head}
    for name in sorted({r["model"] for r in mar}) + ["all"]:
        rs = [r for r in mar if name in ("all", r["model"])]
        b, e = _stats([r["bound_ratio"] for r in rs]), _stats([r["estimate_ratio"] for r in rs])
        summary["margin"][name] = {"plans": len(rs), "bound_over_sim": b, "estimate_over_sim": e}
        print(f"  {name:<20} {len(rs):4d} plans: bound/sim {b['min']:.2f} .. {b['median']:.2f} .. {b['max']:.3f}   "
              f"estimate/sim {e['min']:.2f} .. {e['median']:.2f} .. {e['max']:.2f}")
    worst = max(mar, key=lambda r: r["bound_ratio"])
    print(f"  largest bound/sim {worst['bound_ratio']:.3f} ({worst['model']} {worst['key']}); "
          f"DEFAULT_MARGIN = {DEFAULT_MARGIN} {'covers' if DEFAULT_MARGIN >= worst['bound_ratio'] else 'DOES NOT cover'} it")
    _write_csv(thr, OUT / "throughput.csv")
    _write_csv(mar, OUT / "margin.csv")
    write_text_atomic(json.dumps(summary, indent=1, sort_keys=True) + "\n", OUT / "summary.json")
    md = ["# Sweep throughput and estimate margin", "",
          f"{os.cpu_count()} cores, load average {load:.1f} before the run; two CPU-bound loops ran "
          f"{head:.2f}x faster in two processes than in one.", "",
          "| executor | workers | plans/s |", "|---|---|---|"]
    md += [f"| {r['executor']} | {r['workers']} | {r['plans_per_s']:.2f} |" for r in thr]
    md += ["", "| model | plans | bound/sim min | median | max | estimate/sim min | median | max |",
           "|---|---|---|---|---|---|---|---|"]
    for name, m in summary["margin"].items():
        b, e = m["bound_over_sim"], m["estimate_over_sim"]
        md.append(f"| {name} | {m['plans']} | {b['min']:.2f} | {b['median']:.2f} | {b['max']:.3f} | "
                  f"{e['min']:.2f} | {e['median']:.2f} | {e['max']:.2f} |")
    write_text_atomic("\n".join(md) + "\n", OUT / "summary.md")
    print(f"wrote {OUT}/throughput.csv, margin.csv, summary.json, summary.md")


if __name__ == "__main__":
    main()
