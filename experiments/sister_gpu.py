"""A Blackwell fit carried to its sister GPU: each GPU's rows predicted by the other's fit.

The B200 (DGX B200, 1,000 W) and the GB200 (NVL72, 1,200 W) carry the same Blackwell GPU; what
sets one apart from the other in a training step is its clock under its power and its hosts,
networks and racks, which trainsim models. Their best kernels were measured apart (the
Maximum Achievable Matmul FLOPS table the presets' ``efficiency_ceilings`` cite), so one
GPU's fit carries to the other as:

- ``sustained_compute_fraction``: the same (the fraction of the best kernels' speed a step
  sustains);
- ``fp8_gemm_max_efficiency``: the same fraction of the profile's FP8 ceiling (the other's
  cap x this ceiling / the other's ceiling); ``gemm_max_efficiency`` sits at each profile's
  BF16 ceiling already;
- ``moe_memory_relative_efficiency``: the same (the B200's preset takes the GB200's already).

Every other field stays the GPU's own. The rows are those of the GPU's fit of record (the
report ``PRESET_REPORTS`` names), simulated as the fit simulates them; none of them informed
the other GPU's fit, so the error is out of sample, as the fit's held-out error is.

    python experiments/sister_gpu.py              # print the committed result (no simulation)
    python experiments/sister_gpu.py --simulate   # simulate again (2 processes: B200 1 min, GB200 5)

``--simulate`` writes ``experiments/fit-cache/sister-gpu-2026-12-08.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.inputs.hardware import load_profile  # noqa: E402

RESULT = ROOT / "experiments" / "fit-cache" / "sister-gpu-2026-12-08.json"
PRESET_REPORTS = {gpu: ROOT / "experiments" / "fit-cache" / f"{gpu}-fit-report-2026-12-07-mla-fp8.json"
                  for gpu in ("b200", "gb200")}
"""The reports of the fits whose values the presets hold (docs/accuracy.md)."""
PAIRS = (("gb200", "b200"), ("b200", "gb200"))
"""(the fit carried, the GPU whose rows it predicts)."""
CARRIED = ("sustained_compute_fraction", "fp8_gemm_max_efficiency", "moe_memory_relative_efficiency")


def carried(source: str, target: str) -> dict:
    """The values ``target`` takes from ``source``'s preset (module doc)."""
    a, b = load_profile(source), load_profile(target)
    cap = "fp8_gemm_max_efficiency"
    return {"sustained_compute_fraction": a.sustained_compute_fraction,
            cap: a.fp8_gemm_max_efficiency * b.efficiency_ceilings[cap] / a.efficiency_ceilings[cap],
            "moe_memory_relative_efficiency": a.moe_memory_relative_efficiency}


def _time(job) -> float:
    from sim.calibrate.fit_sims import prepare_rows, row_time_s
    from sim.calibrate.runs_csv import read_runs

    target, values, file, line = job
    run = next(r for r in read_runs(ROOT / file) if r.line == line)
    return row_time_s(prepare_rows([run], target)[0], replace(load_profile(target), **values))


def simulate() -> dict:
    out = {}
    for source, target in PAIRS:
        report = json.loads(PRESET_REPORTS[target].read_text())
        files = report["data"].split(", ")
        values = carried(source, target)
        jobs = [(target, values, row.get("file", files[0]), row["line"]) for row in report["rows"]]
        with get_context("spawn").Pool(2) as pool:
            times = pool.map(_time, jobs)
        out[f"{source}->{target}"] = {
            "values": values, "report": PRESET_REPORTS[target].name,
            "rows": [{"file": Path(f).name, "line": line, "measured_s": row["measured_s"], "simulated_s": t,
                      "error": t / row["measured_s"] - 1, "held_out_error": row["held_out_error"]}
                     for (_, _, f, line), row, t in zip(jobs, report["rows"], times)]}
    return out


def show(result: dict) -> None:
    for n, (pair, r) in enumerate(result.items()):
        source, target = pair.split("->")
        if n:
            print()
        v = r["values"]
        print(f"{target} rows at {source}'s fit: fraction {v['sustained_compute_fraction']:.6f}, FP8 cap "
              f"{v['fp8_gemm_max_efficiency']:.6f}, MoE rate {v['moe_memory_relative_efficiency']:.6f}")
        print(f"  {'row':<28}{'measured s':>11}{'carried':>9}{'own fit held out':>18}")
        for row in sorted(r["rows"], key=lambda x: x["error"]):
            print(f"  {row['file'] + ':' + str(row['line']):<28}{row['measured_s']:>11.3f}"
                  f"{row['error'] * 100:>+8.1f}%{row['held_out_error'] * 100:>+17.1f}%")
        mean = statistics.mean(abs(x["error"]) for x in r["rows"])
        own = statistics.mean(abs(x["held_out_error"]) for x in r["rows"])
        worst = max(abs(x["error"]) for x in r["rows"])
        print(f"  mean |error| {mean * 100:.2f}% (max {worst * 100:.1f}%) carried from {source}; "
              f"{own * 100:.2f}% held out by {target}'s own fit ({len(r['rows'])} rows)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--simulate", action="store_true", help=f"simulate again and write {RESULT.name}")
    args = p.parse_args(argv)
    if args.simulate:
        RESULT.write_text(json.dumps(simulate(), indent=1, sort_keys=True) + "\n")
    show(json.loads(RESULT.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
