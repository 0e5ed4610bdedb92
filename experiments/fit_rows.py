"""Every row of measured-runs CSVs simulated at the GPU presets, with its error, by framework.

``trainsim fit`` fits a profile to rows; this script only predicts them with the presets as
they are, which for rows that were never fitted is an out-of-sample check. Rows are
simulated as the fit simulates them (``sim.calibrate.fit_sims``: reduced fidelity, flows) on
the GPU their ``gpu`` column names; rows the simulator cannot run (``needs``) are listed as
skipped with the reason.

    python experiments/fit_rows.py experiments/fit-data/fsdp_runs.csv [more.csv ...] [--without cuda_graph]

``--without NEED,...`` simulates, too, the rows whose only missing capabilities are those (say
``cuda_graph``: the rows whose recipe captures CUDA graphs, simulated without them), each
marked with what it was simulated without: a baseline for the change that adds the capability.

Prints one line per row (measured and simulated step, error) and, per GPU and framework
(the ``framework`` setting each row ran, ``sim.inputs.frameworks``) and per framework over
all GPUs, the mean absolute error and the range (the README's accuracy table quotes these
lines).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.calibrate.fit_sims import prepare_rows, row_time_s  # noqa: E402
from sim.calibrate.runs_csv import read_runs  # noqa: E402
from sim.errors import InputError  # noqa: E402


def predict(paths: list[str], without: tuple = ()) -> list[dict]:
    """Each row of ``paths``: its label, GPU, framework, measured and simulated seconds (None: skipped);
    ``without``: capabilities a row may miss and still be simulated (``without`` in its entry)."""
    return list(_predict(paths, without))


def _predict(paths: list[str], without: tuple = ()):
    """``predict``'s rows one at a time, as each is simulated."""
    for path in paths:
        for r in read_runs(path):
            run_anyway = r.skip is not None and r.missing and set(r.missing) <= set(without)
            row = {"file": Path(path).name, "line": r.line, "label": r.label(), "gpu": r.gpu,
                   "framework": r.framework, "measured_s": r.measured_s, "simulated_s": None,
                   "skip": None if run_anyway else r.skip, "without": list(r.missing) if run_anyway else [],
                   "group": r.group[1] if not r.group[2] else None}
            if row["skip"] is None:
                try:
                    p = prepare_rows([r], r.gpu, path)[0]
                    row["simulated_s"] = row_time_s(p, p.profile)
                except InputError as exc:  # a row the simulator refuses: listed with the reason, not fatal
                    row["skip"] = f"refused: {exc}"
            yield row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUNS.csv")
    ap.add_argument("--without", default="", metavar="NEED,...",
                    help="simulate rows whose only missing capabilities are these, without them")
    args = ap.parse_args(argv)
    rows = _predict(args.runs, tuple(n.strip() for n in args.without.split(",") if n.strip()))
    print(f"{'row':<22} {'gpu':<10} {'measured':>9} {'simulated':>9} {'error':>7}  framework")
    by_framework: dict[tuple, list[float]] = {}
    for r in rows:
        where = f"{r['file'].removesuffix('.csv')}:{r['line']} {r['group'] or r['label']}"
        if r["simulated_s"] is None:
            print(f"{where:<40.40} skipped: {r['skip']}", flush=True)
            continue
        err = r["simulated_s"] / r["measured_s"] - 1
        by_framework.setdefault((r["gpu"], r["framework"]), []).append(err)
        without = f"  (without {', '.join(r['without'])})" if r["without"] else ""
        print(f"{where:<40.40} {r['gpu']:<10} {r['measured_s']:>8.3f}s {r['simulated_s']:>8.3f}s {100 * err:>+6.1f}%"
              f"  {r['framework']}{without}", flush=True)
    print()
    for (gpu, fw), errs in by_framework.items():
        print(f"{gpu}, {fw}: {_spread(errs)}")
    frameworks: dict[str, list[float]] = {}
    for (_gpu, fw), errs in by_framework.items():
        frameworks.setdefault(fw, []).extend(errs)
    if len(frameworks) > 1:
        print()
        for fw, errs in frameworks.items():
            print(f"{fw}, every GPU: {_spread(errs)}")
    return 0


def _spread(errs: list[float]) -> str:
    return (f"{len(errs)} rows, mean |error| {100 * statistics.mean(abs(e) for e in errs):.1f}%, "
            f"{100 * min(errs):+.1f}% to {100 * max(errs):+.1f}%")


if __name__ == "__main__":
    sys.exit(main())
