"""Expert GEMMs of the measured MoE runs: the shape model against real grouped kernels.

A mixture of experts runs its experts as grouped GEMMs: each rank's E/ep experts, each on
the tokens routed to it, in one kernel (Transformer Engine's grouped GEMM, PyTorch's
``torch._grouped_mm`` that torchtitan and NeMo AutoModel call). trainsim prices them with
the GEMM shape model (``HardwareProfile.gemm_efficiency``: output tiles, waves over the SMs
and a per-tile k cost) as ``batch`` equal GEMMs of the rows each expert receives under
balanced routing. Their rows are few (DeepSeek-V3 on ep 64 at micro-batch 1: 128 per
expert), far from the square shapes the model's cap was measured on, so this script
checks the model where the MoE runs of ``experiments/fit-data/moe_runs.csv`` live.

For each run, every distinct expert GEMM a rank runs (forward, input and weight
gradients: ``sim.program.workload``'s own shapes and names) is timed

- as ``torch.bmm`` of ``batch`` equal GEMMs, operands out of cache, as ``trainsim
  calibrate`` times every batched GEMM (``sim.calibrate.microbench.bench_gemms``), and
- as one ``torch._grouped_mm`` over the same rows (offsets equal), where this PyTorch has
  it and the GPU runs it (it needs BF16 and sm_90 or later),

and set against the model's kernel time at the profile's caps (``gemm_efficiency`` over
the profile's ``sustained_compute_fraction``: the kernel alone, as a benchmark runs it).
A few dense shapes anchor the comparison. It needs a CUDA GPU for meaningful figures; on
a CPU it times float32 kernels (the plumbing only).

    python experiments/expert_gemms.py --gpu h200 --out OUT_DIR [--runs experiments/fit-data/moe_runs.csv]

Writes ``expert_gemms.json`` (every shape: measured and modelled seconds and TFLOP/s)
into ``OUT_DIR`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.calibrate.fit_sims import prepare_rows  # noqa: E402
from sim.calibrate.runs_csv import read_runs  # noqa: E402
from sim.inputs.hardware import load_profile  # noqa: E402
from sim.program.workload import chunk_work  # noqa: E402

DENSE = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 2048, 2048), (16384, 6144, 2048)]
"""Dense anchors (m, n, k): the square the caps come from and two of Qwen3-30B-A3B's."""


def expert_gemms(runs_csv: str, gpu: str) -> list[dict]:
    """Distinct expert GEMMs (name, m, n, k, batch) of each run of ``runs_csv``."""
    runs = [r for r in read_runs(runs_csv) if r.skip is None]
    out, seen = [], set()
    for run, prep in zip(runs, prepare_rows(runs, gpu, runs_csv)):
        model, plan = prep.model, prep.plan
        for vs in range(plan.pp * plan.vpp):
            for work in chunk_work(model, plan, vs):
                for op in work.ops():
                    if op.kind != "gemm" or not op.name.startswith("moe.experts"):
                        continue
                    m, n, k = (int(x) for x in op.shape)
                    key = (model.name, op.name, m, n, k, int(op.batch))
                    if key not in seen:
                        seen.add(key)
                        out.append({"run": f"line {run.line}: {run.label()}", "model": model.name, "name": op.name,
                                    "m": m, "n": n, "k": k, "batch": int(op.batch)})
    return out


def _layout(name: str) -> str:
    if name.endswith(".wgrad"):
        return "tn"
    return "nn" if name.endswith(".dgrad") else "nt"


def time_grouped(ctx, m: int, n: int, k: int, batch: int, layout: str) -> float | None:
    """Seconds of one ``torch._grouped_mm`` of ``batch`` groups of m x n x k (None where
    this PyTorch or device cannot run it). Forward and input gradient: the groups' rows
    stacked (2-D by 3-D); weight gradient: the groups' k stacked (2-D by 2-D)."""
    import torch

    from sim.calibrate.launch import measure

    grouped = getattr(torch, "_grouped_mm", None)
    if grouped is None or not ctx.is_cuda:
        return None
    dt = torch.bfloat16
    sets = []
    for _ in range(3):
        if layout == "tn":  # out[g] = A_g (m x k_g) @ B_g (k_g x n), k stacked
            a = torch.randn(m, k * batch, device=ctx.device, dtype=dt)
            b = torch.randn(n, k * batch, device=ctx.device, dtype=dt).t()
            offs = torch.arange(1, batch + 1, device=ctx.device, dtype=torch.int32) * k
        else:  # out rows stacked: A (m*batch x k) @ B_g (k x n)
            a = torch.randn(m * batch, k, device=ctx.device, dtype=dt)
            b = torch.randn(batch, n, k, device=ctx.device, dtype=dt).transpose(-2, -1)
            offs = torch.arange(1, batch + 1, device=ctx.device, dtype=torch.int32) * m
        sets.append((a, b, offs))
    it = iter(range(10**9))

    def fn():
        a, b, offs = sets[next(it) % len(sets)]
        return grouped(a, b, offs=offs)

    try:
        fn()
        torch.cuda.synchronize()
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        print(f"  _grouped_mm {m}x{n}x{k} x{batch} ({layout}) not run: {str(exc).splitlines()[0][:120]}")
        return None
    return measure(ctx, fn, warmup=3, repeats=9)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="h200", help="profile whose shape model to compare (default h200)")
    ap.add_argument("--runs", default=str(ROOT / "experiments/fit-data/moe_runs.csv"))
    ap.add_argument("--out", default=str(ROOT / "experiments/out/expert_gemms"))
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warm-s", type=float, default=None,
                    help="seconds of back-to-back large GEMMs before timing, so the clocks are a busy GPU's")
    args = ap.parse_args(argv)

    from sim.calibrate.launch import Context, machine_info
    from sim.calibrate.microbench import BUSY_WARMUP_S, bench_gemms, busy_warmup

    args.warm_s = BUSY_WARMUP_S if args.warm_s is None else args.warm_s
    import torch

    cuda = torch.cuda.is_available()
    ctx = Context(0, 1, 0, torch.device("cuda:0" if cuda else "cpu"), "nccl" if cuda else "gloo", 1)
    if cuda:
        torch.cuda.set_device(0)
    profile = load_profile(args.gpu)
    shapes = expert_gemms(args.runs, args.gpu)
    for m, n, k in DENSE:
        shapes.append({"run": "dense anchor", "model": "-", "name": "dense", "m": m, "n": n, "k": k, "batch": 1})
    if not cuda:  # the plumbing only: a CPU times small float32 kernels
        shapes = [dict(s, m=min(s["m"], 64), n=min(s["n"], 64), k=min(s["k"], 64), batch=min(s["batch"], 2))
                  for s in shapes[:4]]
    busy_warmup(ctx, args.warm_s)  # an idle GPU clocks down: time it busy, as a training step runs it
    t0 = time.perf_counter()
    timed = bench_gemms(ctx, [(s["m"], s["n"], s["k"], s["batch"], _layout(s["name"])) for s in shapes],
                        repeats=max(1, args.repeats // 3), warmup=3, sweep=False)
    peak = profile.peak("bf16")
    frac = profile.sustained_compute_fraction
    rows = []
    for s, t in zip(shapes, timed):
        flops = 2.0 * s["m"] * s["n"] * s["k"] * s["batch"]
        eff = profile.gemm_efficiency(s["m"], s["n"], s["k"], s["batch"]) / frac
        g = time_grouped(ctx, s["m"], s["n"], s["k"], s["batch"], _layout(s["name"])) if cuda else None
        rows.append(dict(s, flops=flops, bmm_s=t["time_s"], grouped_mm_s=g, model_s=flops / (peak * eff),
                         model_efficiency=eff, bmm_efficiency=flops / t["time_s"] / peak,
                         grouped_mm_efficiency=None if g is None else flops / g / peak))
    print(f"{len(rows)} GEMMs on {torch.cuda.get_device_name(0) if cuda else 'cpu'} in {time.perf_counter() - t0:.1f} s; "
          f"efficiency = achieved / {peak / 1e12:.0f} TFLOP/s ({args.gpu} BF16 peak)")
    print(f"{'model':<15} {'gemm':<24} {'m x n x k':>20} {'batch':>5} {'bmm':>6} {'grouped':>7} {'shape model':>11}")
    for r in rows:
        g = "-" if r["grouped_mm_efficiency"] is None else f"{r['grouped_mm_efficiency']:.3f}"
        print(f"{r['model']:<15} {r['name']:<24} {r['m']:>6}x{r['n']:>6}x{r['k']:>6} {r['batch']:>5} "
              f"{r['bmm_efficiency']:>6.3f} {g:>7} {r['model_efficiency']:>11.3f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine_info(ctx)
    (out / "expert_gemms.json").write_text(json.dumps(
        {"machine": info, "profile": args.gpu, "peak_flops_bf16": peak, "gemms": rows}, indent=1) + "\n")
    print(f"wrote {out / 'expert_gemms.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
