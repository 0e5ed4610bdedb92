"""Why the calibration times kernels with their operands out of cache.

    .venv/bin/python experiments/cold_cache.py [--procs 2] [--repeats 15]

On ``--procs`` worker processes at once (as ``trainsim calibrate`` runs them), times the
reference GPT's GEMM shapes three ways, interleaved call by call so that the machine's
drift hits all three alike: **warm** (the same operands as the call before, as a kernel
timed over and over sees them), **L2 evicted** (a buffer of twice the L2 written in
between) and **evicted** (a buffer of twice the last-level cache written in between,
as the operands of a step's GEMMs are: weights last touched a micro-batch ago,
activations saved in the forward, other kernels run in between). Prints the median
time per shape and the ratios to warm.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = ((256, 256, 256), (256, 768, 256), (256, 1024, 256), (256, 256, 1024), (256, 2048, 256))
"""(m, n, k) of the default reference GPT's GEMMs (micro-batch 2 x sequence 128 tokens, hidden 256)."""


def _worker(ctx, payload):
    import torch

    from sim.calibrate.microbench import cache_sizes, last_level_cache_bytes

    l2 = sorted(cache_sizes("/sys/devices/system/cpu/cpu0/cache"))
    l2 = l2[-2] if len(l2) >= 2 else 2 * 2**20
    llc = last_level_cache_bytes(ctx)
    near = torch.empty(2 * l2 // 4)
    far = torch.empty(2 * llc // 4)
    out = {"l2_bytes": l2, "llc_bytes": llc, "shapes": {}}
    for m, n, k in payload["shapes"]:
        a, b = torch.randn(m, k), torch.randn(k, n)
        for _ in range(3):
            torch.mm(a, b)
        times = {"warm": [], "L2 evicted": [], "evicted": []}
        for rep in range(payload["repeats"]):
            for cond in times:
                if cond == "warm":
                    torch.mm(a, b)
                else:
                    (near if cond == "L2 evicted" else far).fill_(float(rep))
                t0 = time.perf_counter()
                torch.mm(a, b)
                times[cond].append(time.perf_counter() - t0)
        out["shapes"][f"{m}x{n}x{k}"] = {c: statistics.median(v) for c, v in times.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    from sim.calibrate.launch import run_workers

    res = run_workers(_worker, args.procs, {"shapes": SHAPES, "repeats": args.repeats}, timeout_s=900)
    first = res[0]
    print(f"{args.procs} process(es); L2 {first['l2_bytes'] / 2**20:.0f} MiB, last-level cache "
          f"{first['llc_bytes'] / 2**20:.0f} MiB; medians over processes and {args.repeats} calls")
    print("| GEMM (m x n x k) | warm | L2 evicted | evicted | L2 evicted / warm | evicted / warm |")
    print("|---|---:|---:|---:|---:|---:|")
    for key in first["shapes"]:
        t = {c: statistics.median(r["shapes"][key][c] for r in res) for c in first["shapes"][key]}
        print(f"| {key} | {t['warm'] * 1e6:.0f} us | {t['L2 evicted'] * 1e6:.0f} us | {t['evicted'] * 1e6:.0f} us | "
              f"{t['L2 evicted'] / t['warm']:.2f} | {t['evicted'] / t['warm']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
