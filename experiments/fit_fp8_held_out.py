"""The FP8 rows of a fit held out at an FP8 GEMM cap measured outside the fit.

    .venv/bin/python experiments/fit_fp8_held_out.py FIT.json [--cap 0.709] [--data RUNS.csv] [--jobs 2]

``trainsim fit --json`` predicts each group's rows from a fit made without that group.
In the fit data the FP8 rows are one group, and no other row reads the FP8 GEMM cap
(``fp8_gemm_max_efficiency``), so that group's held-out fit keeps the cap the profile
started from: a value fitted to those very rows. This script predicts them honestly:
at the fraction and spread the report's held-out fit found without them, and at a cap
measured on the kernel alone. The default is the Maximum Achievable Matmul FLOPS table's
H100 SXM figure (stas00/ml-engineering, compute/accelerator/README.md: torch._scaled_mm,
float8_e4m3fn operands from torch.randn, 1,402.6 of 1,979 TFLOP/s), the same tool and
inputs as the BF16 cap ``gemm_max_efficiency`` (794.5 of 989).

Prints and writes ``experiments/out/fit_fp8_held_out/results.json`` and ``verdict.md``:
per FP8 row the measured, simulated and error, and the group's mean and max |error|.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.calibrate import fit_runs  # noqa: E402
from sim.calibrate.fit_sims import Simulations, prepare_rows, worker_pool  # noqa: E402
from sim.calibrate.runs_csv import read_runs  # noqa: E402
from sim.fileio import write_text_atomic  # noqa: E402
from sim.inputs.hardware import load_profile  # noqa: E402

MAMF_H100_FP8_CAP = 1402.6 / 1979.0
CAP = "fp8_gemm_max_efficiency"


def held_out_at_cap(report: dict, cap: float, jobs: int = 1) -> dict:
    """Simulate every FP8 group's rows of ``report`` (a ``trainsim fit --json`` report) at
    its held-out fit's values with the FP8 cap set to ``cap``."""
    names = [p["name"] for p in report["parameters"]]
    if CAP not in names:
        raise SystemExit(f"fit_fp8_held_out: the report did not fit {CAP} (parameters: {', '.join(names)})")
    fp8 = [g for g in report["groups"] if g["precision"].startswith("fp8")]
    if not fp8:
        raise SystemExit("fit_fp8_held_out: the report has no FP8 group")
    params, _ = fit_runs.choose_parameters(names, report["group_count"])
    lines = {line for g in fp8 for line in g["lines"]}
    runs = [r for r in read_runs(report["data"]) if r.line in lines]
    by_line = {r["line"]: r for r in report["rows"]}
    profile = load_profile(report["profile"], flag="--gpu")
    out = {"profile": report["profile"], "data": report["data"], "data_sha256": report["data_sha256"], "cap": cap,
           "groups": []}
    pool = worker_pool(jobs, report["profile"], params, runs, report["data"]) if jobs > 1 else contextlib.nullcontext()
    with pool as workers:
        sims = Simulations(profile, params, prepare_rows(runs, report["profile"], report["data"]), workers, None)
        index = {r.line: i for i, r in enumerate(runs)}
        for g in fp8:
            values = [cap if p.path == CAP else g["held_out_fit"][p.path] for p in params]
            times = sims.times([index[line] for line in g["lines"]], values)
            rows = [{"line": line, "gpus": by_line[line]["gpus"], "measured_s": by_line[line]["measured_s"],
                     "simulated_s": t, "error": t / by_line[line]["measured_s"] - 1.0,
                     "report_held_out_error": by_line[line]["held_out_error"]}
                    for line, t in zip(g["lines"], times)]
            errs = [abs(r["error"]) for r in rows]
            out["groups"].append({"id": g["id"], "model": g["model"], "source": g["source"],
                                  "values": dict(zip((p.path for p in params), values)), "rows": rows,
                                  "mean_abs_error": sum(errs) / len(errs), "max_abs_error": max(errs)})
    return out


def verdict(res: dict) -> str:
    lines = [f"# FP8 rows held out at the FP8 cap {res['cap']:.4f}", "",
             f"Profile {res['profile']}, data {res['data']} (sha256 {res['data_sha256'][:12]}).", ""]
    for g in res["groups"]:
        v = ", ".join(f"{k} {x:.5g}" for k, x in g["values"].items())
        lines += [f"## {g['id']}: {g['model']}", "", f"Values: {v}.", "",
                  "| line | GPUs | measured s | simulated s | error | fit report's held-out error |",
                  "|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['line']} | {r['gpus']} | {r['measured_s']:.3f} | {r['simulated_s']:.3f} | "
                  f"{100 * r['error']:+.1f}% | {100 * r['report_held_out_error']:+.1f}% |" for r in g["rows"]]
        lines += ["", f"Mean |error| {100 * g['mean_abs_error']:.1f}%, max {100 * g['max_abs_error']:.1f}%.", ""]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="experiments/fit_fp8_held_out.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("report", help="a `trainsim fit --json` report (FIT.json)")
    ap.add_argument("--cap", type=float, default=MAMF_H100_FP8_CAP,
                    help=f"the FP8 GEMM cap to predict at (default {MAMF_H100_FP8_CAP:.4f}: MAMF, H100 SXM)")
    ap.add_argument("--data", default=None, help="the runs file, where it is not where the report says")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "out" / "fit_fp8_held_out"))
    args = ap.parse_args(argv)
    if not 0 < args.cap <= 1:
        ap.error(f"--cap: got {args.cap}; allowed: a fraction of the FP8 peak in (0, 1]")
    try:
        report = json.loads(Path(args.report).read_text())
    except (OSError, ValueError) as exc:
        ap.error(f"report: cannot read {args.report}: {exc}")
    missing = [k for k in ("parameters", "groups", "rows", "data", "data_sha256", "profile") if k not in report]
    if missing:
        ap.error(f"report: {args.report} is not a `trainsim fit --json` report (no {', '.join(missing)}); "
                 "a fitted profile (--out) is not one")
    if args.data:
        report = {**report, "data": args.data}
    if not Path(report["data"]).is_file():
        ap.error(f"--data: the runs file {report['data']} is not there; give its path")
    if hashlib.sha256(Path(report["data"]).read_bytes()).hexdigest() != report["data_sha256"]:
        ap.error(f"--data: {report['data']} is not the file the fit read (its sha256 differs from the report's)")
    res = held_out_at_cap(report, args.cap, args.jobs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(json.dumps(res, indent=1) + "\n", out / "results.json")
    text = verdict(res)
    write_text_atomic(text, out / "verdict.md")
    print(text)
    return res


if __name__ == "__main__":
    main()
