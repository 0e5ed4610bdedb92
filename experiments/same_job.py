"""Rows of one job that a fit misses by different amounts: the error no fitted parameter removes.

A fit's parameters move a job's simulated time (one model at one size, batch and precision)
nearly as a whole, whatever its layout. So where the same job was measured more than once
(two releases of a table, two recipes, two layouts) and the fitted model's time over the
measured one differs between those rows, no fit can bring all of them right: that part of the
error belongs to a setting the rows differ in that trainsim leaves out, or to measurements that
disagree. ``sim.calibrate.fit_runs.same_job`` finds such rows in a fit's report (``trainsim fit``
lists them too) and the least error each job leaves: the least Σ|s·a − 1| over one scale s of
its rows' ratios a.

This script reads the committed reports of the presets' fits (no simulation: a second or two)
and prints, per GPU, the fitted and held-out mean |error|, the least mean |error| the jobs
leave, and the jobs whose rows are missed more than 2% apart:

    python experiments/same_job.py [REPORT.json ...]

Each report names its data files; their rows are read again to group them by job.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.calibrate.fit_runs import SAME_JOB_SHOWN, same_job  # noqa: E402
from sim.calibrate.runs_csv import read_runs  # noqa: E402

PRESET_REPORTS = tuple(ROOT / "experiments" / "fit-cache" / f"{gpu}-fit-report-2026-12-07-mla-fp8.json"
                       for gpu in ("h100-sxm", "b200", "gb200", "gb300"))
"""The reports of the fits whose values the presets hold (docs/accuracy.md)."""


def _missing(report: dict) -> list[str]:
    """The report's data files not found from the project's root (``../shared`` is beside a
    checkout, not in a clone)."""
    return [f for f in report["data"].split(", ") if not (Path(f) if Path(f).is_absolute() else ROOT / f).exists()]


def _runs(report: dict) -> list:
    """The report's rows as ``read_runs`` reads them, in the report's order."""
    files = report["data"].split(", ")
    found = {}
    for f in files:
        for r in read_runs(Path(f) if Path(f).is_absolute() else ROOT / f):
            found[(f if len(files) > 1 else None, r.line)] = r
    return [found[(row.get("file"), row["line"])] for row in report["rows"]]


def main(argv: list[str]) -> int:
    reports = [Path(a) for a in argv] or list(PRESET_REPORTS)
    for path in reports:
        report = json.loads(path.read_text())
        rows = report["rows"]
        if _missing(report):
            print(f"{report['gpu']} ({path.name}): skipped, its data are not here: {', '.join(_missing(report))}")
            continue
        runs = _runs(report)
        jobs = same_job(runs, [r["measured_s"] for r in rows], [r["fitted_s"] for r in rows])
        floor = sum(j["floor_abs_error_sum"] for j in jobs) / len(rows)
        print(f"{report['gpu']} ({path.name}): {len(rows)} rows, {len(jobs)} job{'s' if len(jobs) != 1 else ''} "
              "measured more than once")
        print(f"    mean |error| fitted {report['mean_abs_error']:.2%}, held out {report['loo_mean_abs_error']:.2%}; "
              f"the jobs alone leave at least {floor:.2%}")
        for j in jobs:
            if j["spread"] <= SAME_JOB_SHOWN:
                continue
            by_file: dict[str, list[str]] = {}
            for i in j["rows"]:
                by_file.setdefault(Path(rows[i].get("file", "")).name, []).append(str(rows[i]["line"]))
            where = "; ".join(f"{name} {', '.join(lines)}".strip() for name, lines in by_file.items())
            errors = ", ".join(f"{rows[i]['fitted_error']:+.1%}" for i in j["rows"])
            print(f"  {j['job']}: lines {where}")
            print(f"    fitted {errors}: {j['spread']:.1%} apart, at least "
                  f"{j['floor_abs_error_sum'] / len(j['rows']):.1%} on these rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
