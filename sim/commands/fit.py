"""``trainsim fit``: calibrate a hardware profile against measured training runs.

``trainsim fit RUNS.csv [MORE.csv ...] --gpu PROFILE --out FITTED.json [--json] [--params a,b]``
reads one run per row (of every file given, as one table) (``sim.calibrate.runs_csv``: the settings of ``trainsim run`` as columns
plus ``measured_iteration_time_s``), simulates the rows measured on PROFILE's GPU, fits
a few of the profile's physical parameters, each within physical bounds
(``sim.calibrate.fit_runs.PARAMETERS``), and prints per row the measured, fitted and
held-out predicted time: held out means leave-one-group-out, the prediction for a row
comes from a fit without its whole group (one model's rows from one source). ``--out``
writes the fitted profile, its ``sources`` naming the fit.

``--json`` prints one object (errors are fractions, predicted / measured − 1; times in s):

    gpu, profile, data, data_sha256     the profile fitted, as given and by name; the CSV (several: joined by
                                        ", ") and the sha256 of its bytes (of theirs, in order)
    fidelity, collective_model          how each row was simulated ("reduced", "flows")
    parameters                          [{name, low, high, initial, fitted, why}]
    parameters_chosen                   "--params", "the default set", or why fewer were fitted
    rows                                [{line, group, gpus, measured_s, initial_s, fitted_s, held_out_s,
                                          initial_error, fitted_error, held_out_error, held_out_by, blank_cells}]:
                                        held_out_by "simulation", or "model" where the row's model covered its
                                        held-out point (sim.calibrate.fit_runs.fit_and_hold_out)
    groups                              [{id, source, precision, framework, model, lines, held_out_fit,
                                          loo_mean_abs_error}]
    same_job                            [{lines, job, spread, floor_abs_error_sum}]: rows of one job (model, sequence,
                                        precision, GPUs, global batch, framework), the fitted model's time over the
                                        measured one apart by ``spread`` (max / min - 1) between them; the least
                                        sum of |error| over those rows of any one scale of the job's time
                                        (sim.calibrate.fit_runs.same_job), largest first
    same_job_floor                      the sum of those over every job, over the row count: the least mean |error|
                                        they leave whatever scales each job's time
    skipped                             [{line, reason}]: rows of this GPU not simulated (needs, precision)
    (with several files each row, skipped and left_out entry also has its ``file``, and a group's
    ``lines`` are ``file:line``)
    left_out                            [{line, gpu}]: rows of other GPUs
    blank_cells                         {column: {value, why}}: what blank cells of the fitted rows took
    by_source                           {source text: {settings, why}}: settings without a column that
                                        rows of that source took (sim.calibrate.runs_csv.BY_SOURCE)
    row_count, group_count, initial_mean_abs_error, mean_abs_error, max_abs_error,
    loo_mean_abs_error, loo_max_abs_error
    by_gpu                              {gpu: the same counts and errors}, per GPU type
    evaluations                         residual evaluations of the fit on every row (each simulates every row)
    fit_status                          why the fit on every row stopped (scipy's message on the plain path)
    loss                                what the fits made least of the rows' weighted relative errors:
                                        "squares" (the default) or "absolute" (--loss; sim.calibrate.fit_surrogate.LOSSES)
    method, model_max_error             "model": fitted on each row's model of its time, checked by simulating
                                        (sim.calibrate.fit_surrogate); the largest |relative error| of that model
                                        at the held-out rows' simulations (the one place no simulation checks
                                        it: the held-out fits are solved on it). "differences" (the plain path,
                                        fit_runs(fast=False)): null
    held_out_check                      {line, model_s, simulated_s}: the held-out row of those the model covered
                                        farthest from its simulations, simulated to check the model (all of them
                                        are simulated when it missed by more than HELD_OUT_CHECK); null if none
    simulations, reused, wall_s         simulations run (the cache's misses), times taken from --cache's
                                        file, and seconds taken (these change from run to run)
    simulations_by_phase                {what for: simulations run}: the start and its probes, the rounds,
                                        kinked rows' differences, probes at the answer, the held-out
                                        fits (plain path: their evaluations), the held-out rows at theirs
    out                                 the profile written, or null
"""

from __future__ import annotations

import json
import sys

from sim.errors import InputError

NAME = "fit"
HELP = "Fit a hardware profile's efficiencies to measured training runs (CSV); report held-out errors."


def add_arguments(p) -> None:
    from sim.inputs.flags import add_section
    from sim.inputs.schema_commands import FitOptions

    add_section(p, FitOptions)


def run(args) -> int:
    import datetime

    from sim.calibrate.fit_runs import bound_warning, fit_runs, fitted_profile, parameter
    from sim.fileio import check_output_file
    from sim.inputs.hardware import load_profile
    from sim.progress import Progress

    check_output_file(args.out, "--out", suffix=".json")
    names = None
    if args.params is not None:
        names = [n.strip() for n in args.params.split(",")]
        if not all(names):
            raise InputError(f"--params: got {args.params!r}; expected profile fields separated by commas")
        for n in names:
            parameter(n)
    profile = load_profile(args.gpu, flag="--gpu")
    with Progress() as bar:
        bar.update(f"fitting {profile.name} to {', '.join(args.runs)}")
        runs = args.runs[0] if len(args.runs) == 1 else args.runs
        report = fit_runs(runs, args.gpu, names, jobs=args.jobs, cache=args.cache, loss=args.loss)
    report["out"] = args.out
    if args.out:
        fitted_profile(profile, report, datetime.date.today().isoformat()).save(args.out)
    for p in report["parameters"]:  # on stderr, so that --json stays one object
        if p["at_bound"]:
            print(f"trainsim: warning: {bound_warning(p)}", file=sys.stderr)
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0
    _print(report)
    return 0


def _line(entry: dict) -> str:
    """A row's line, after its file's name when the fit read several."""
    from pathlib import Path

    return f"{Path(entry['file']).name}:{entry['line']}" if "file" in entry else str(entry["line"])


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _print(r: dict) -> None:
    from pathlib import Path

    from sim.calibrate.fit_runs import SAME_JOB_SHOWN

    print(f"trainsim fit: {r['gpu']} ({r['profile']}) to {r['data']}")
    print(f"  sha256 {r['data_sha256']}")
    print(f"  {r['row_count']} rows in {r['group_count']} groups, simulated at {r['fidelity']} fidelity (the runs are "
          f"symmetric: one GPU per pipeline stage), {r['collective_model']} collectives")
    least = "" if r.get("loss", "squares") == "squares" else ", least absolute errors (--loss absolute)"
    print(f"\nparameters ({r['parameters_chosen']}{least}):")
    for p in r["parameters"]:
        edge = {"low": "   <- at its lower bound", "high": "   <- at its upper bound"}.get(p.get("at_bound"), "")
        if p.get("at_ceiling"):
            edge = "   <- at its ceiling (the profile's best measured kernel)"
        elif "ceiling" in p:
            edge += f"   (upper bound: the profile's ceiling; physical {p['physical_high']:g})"
        print(f"  {p['name']:<26} {p['initial']:.4g} -> {p['fitted']:.4g}   bounds [{p['low']:g}, {p['high']:g}]{edge}")
    print("\ngroups (each held out in turn; its rows predicted by a fit without it):")
    for g in r["groups"]:
        vals = ", ".join(f"{k} {v:.4g}" for k, v in g["held_out_fit"].items())
        print(f"  {g['id']}: {g['model']} - {g['source']}")
        print(f"      lines {', '.join(map(str, g['lines']))}; fit without it: {vals}")
    print(f"\n{'line':>5} {'group':>5} {'gpus':>6} {'measured':>10} {'initial':>17} {'fitted':>17} "
          f"{'held out':>17}")
    for row in r["rows"]:
        cells = [f"{row[k + '_s']:9.3f} s {_pct(row[k + '_error']):>6}" for k in ("initial", "fitted", "held_out")]
        print(f"{_line(row):>5} {row['group']:>5} {row['gpus']:>6} {row['measured_s']:8.3f} s " + " ".join(cells))
    print(f"\nmean |error|: initial {r['initial_mean_abs_error']:.1%}, fitted {r['mean_abs_error']:.1%} "
          f"(max {r['max_abs_error']:.1%}), held out {r['loo_mean_abs_error']:.1%} (max {r['loo_max_abs_error']:.1%})")
    shown = [j for j in r.get("same_job", []) if j["spread"] > SAME_JOB_SHOWN]
    if shown:
        print("rows of one job missed by different amounts (no fitted parameter separates them: a setting they "
              "differ in that trainsim leaves out, or measurements that disagree):")
        for j in shown:
            lines = ", ".join(Path(str(x)).name for x in j["lines"])  # (a.csv:3 where the fit read several files)
            print(f"  lines {lines} ({j['job']}): {j['spread']:.1%} apart, so at least "
                  f"{j['floor_abs_error_sum'] / len(j['lines']):.1%} mean |error| on these rows")
        print(f"  rows of one job hold the mean |error| over all rows to at least {r['same_job_floor']:.1%}")
    if r["blank_cells"]:
        print("blank cells took: " + "; ".join(f"{c} = {v['value']} ({v['why']})" for c, v in r["blank_cells"].items()))
    for text, v in r.get("by_source", {}).items():
        print(f"rows of {text} took {v['settings']} ({v['why']})")
    for s in r["skipped"]:
        print(f"skipped line {_line(s)}: {s['reason']}")
    if r["left_out"]:
        by = {}
        for x in r["left_out"]:
            by.setdefault(x["gpu"], []).append(_line(x))
        print("left out (other GPUs): " + "; ".join(f"{g}: lines {', '.join(v)}" for g, v in sorted(by.items())))
    reused = f", {r['reused']} times reused from --cache" if r["reused"] else ""
    print(f"{r['simulations']} simulations in {r['wall_s']:.1f} s{reused} ({r['evaluations']} evaluations of the fit "
          "on every row)")
    if r["model_max_error"] is not None:
        print(f"held-out fits solved on each row's model of its time: at the held-out rows it was within "
              f"{r['model_max_error']:.3%} of their simulations")
    by_model = [_line(row) for row in r["rows"] if row.get("held_out_by") == "model"]
    c = r.get("held_out_check")
    if c:
        miss = abs(c["model_s"] / c["simulated_s"] - 1.0)
        print(f"held-out times of lines {', '.join(by_model)} are their rows' models' (each between simulations "
              f"of its row); line {_line(c)}, the farthest from its, simulated: the model within {miss:.1e}"
              if by_model else f"held-out rows all simulated: the model missed the one checked (line {_line(c)}) "
              f"by {miss:.1e}")
    if r["out"]:
        print(f"wrote {r['out']} (profile {r['gpu']} with the fitted values; sources name the fit)")
