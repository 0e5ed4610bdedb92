"""``trainsim goodput``: a training campaign over days, with failures, checkpoints and restarts.

Takes ``trainsim run``'s model, cluster and plan flags (or an experiment file), simulates
one iteration for the step time (``--step-time-s`` skips it), and then the job's life
over ``--days``: failures drawn per cause from ``--failures`` (a preset such as
``llama3``, or a TOML file) at rates per device-hour scaled by the job's GPUs, hosts,
NICs and switches; detection, restarts, waits for ``--hot-spares``; checkpoint saves
(synchronous, or ``--async-save``) whose bytes come from the memory model and whose time
from ``--storage-bandwidth``. Prints goodput, interruptions and time lost by cause, and
the checkpoint interval that maximises goodput next to Young's and Daly's; ``--json``
prints one object; ``--out DIR`` writes the report and the pictures.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from sim import session
from sim.commands.run import settings_of
from sim.commands.settings import RUN_FLAGS, say_defaults
from sim.errors import InputError
from sim.fileio import check_output_dir, write_json_atomic
from sim.inputs.experiment import blame, values_of
from sim.inputs.flags import add_arguments as add_schema_arguments, add_section
from sim.inputs.schema import RunSettings
from sim.inputs.schema_commands import DEFAULT_STORAGE_BPS, ExperimentFile, GoodputCampaign
from sim.progress import Progress
from sim.studies.goodput import Study, checkpoint_of, daly_goodput, device_counts, \
    load_failures, preset_names, run_study
from sim.studies.goodput.timeline import busiest_window, progress_points, window_spans

NAME = "goodput"
HELP = ("Simulate a training campaign over days (failures, detection, restarts, checkpoints, hot spares) and report "
        "goodput and the best checkpoint interval.")
_FLAGS = [f for f in RUN_FLAGS if f not in ("kineto", "gpu_hour_price")]  # (a campaign reports no cost yet)


def add_arguments(p) -> None:
    add_section(p, ExperimentFile)
    add_schema_arguments(p, _FLAGS, helps={
        "out": "directory for goodput.json and the pictures (goodput_timeline.png, goodput_interval.png)",
        "json": "print one JSON object"})
    add_section(p, GoodputCampaign, formats={"presets": ", ".join(preset_names())})


def run(args) -> int:
    check_output_dir(args.out, "--out")
    interval, spares = args.checkpoint_interval, args.hot_spares  # (None: auto, unlimited)
    storage = DEFAULT_STORAGE_BPS if args.storage_bandwidth is None else args.storage_bandwidth
    failures = load_failures(args.failures)
    exp, settings = settings_of(args)
    try:
        prepared = session.prepare(RunSettings.from_values(values_of(settings)))
        say_defaults(prepared.settings.model)
        step, summary = _step_time(prepared, args.step_time_s)
    except InputError as exc:
        if exp is None:
            raise
        raise blame(exc, exp.path, settings) from None
    plan, profile = prepared.plan, prepared.profile
    pcie = profile.links["pcie"]
    ckpt = checkpoint_of(prepared.model.num_params, plan.world_size, storage, pcie.bandwidth_Bps * pcie.efficiency,
                         asynchronous=args.async_save)
    devices = device_counts(prepared.topology, plan.world_size)
    study = Study(step, ckpt, failures, devices, args.days * 86400.0, spares)
    with Progress() as bar:
        bar.update("simulating the campaign and searching the checkpoint interval")
        rep, camp = run_study(study, interval, args.seed, record=bool(args.out))
    rep["step_time_source"] = "given" if args.step_time_s is not None else "simulated"
    rep["run"] = {"model": prepared.model.name, "gpus": plan.world_size, "gpu": profile.name,
                  "plan": {"dp": plan.dp, "tp": plan.tp, "pp": plan.pp}, "fits": summary.get("fits")}
    if args.out:
        _write(rep, study, camp, Path(args.out))
    if args.json:
        print(json.dumps(rep, sort_keys=True))
        return 0
    _print(rep, prepared)
    if args.out:
        print(f"\nwrote {Path(args.out) / 'goodput.json'}, goodput_timeline.png, goodput_interval.png")
    return 0


def _step_time(prepared, given: float | None) -> tuple[float, dict]:
    if given is not None:
        return given, {}
    with Progress() as bar:
        bar.update(f"simulating one iteration on {prepared.plan.world_size} GPUs")
        _, summary = session.run(prepared)
    return summary["iteration_time_s"], summary


WINDOW_S = 12 * 3600.0
"""The hours the timeline picture shows second by second."""


def _write(rep: dict, study, camp, out: Path) -> None:
    from sim.results.plot_goodput import plot_interval, plot_timeline

    out.mkdir(parents=True, exist_ok=True)
    length = min(WINDOW_S, camp.horizon_s)
    lo = busiest_window([t for t, _, planned in camp.failures if not planned], length, camp.horizon_s)
    window = (lo, lo + length)
    categories = {c.name: c.category or c.name for c in study.failures.causes}
    plot_timeline(rep, window_spans(camp, *window), progress_points(camp), camp.failures, window, categories,
                  out / "goodput_timeline.png")
    m, ck, r = study.mtbf_s, study.checkpoint, study.mean_restart_s
    closed = (lambda tau: daly_goodput(tau, ck.stall_s, m, r)) if math.isfinite(m) else None
    plot_interval(rep, closed, out / "goodput_interval.png")
    write_json_atomic(rep, out / "goodput.json")


TOP_CAUSES = 10
"""Causes listed one by one (by time lost); the rest are summed in one line."""


def _hours(s: float) -> str:
    if s == 0:
        return "0"
    if s >= 86400 * 2:
        return f"{s / 86400:.1f} d"
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s / 60:.1f} min"
    return f"{s:.1f} s"


def _print(r: dict, prepared) -> None:
    plan, ck, dev = prepared.plan, r["checkpoint"], r["devices"]
    print(prepared.model.describe())
    print(f"{plan.world_size} x {prepared.profile.name} on {prepared.topology.describe()}; "
          f"dp {plan.dp} x tp {plan.tp} x pp {plan.pp}")
    src = "simulated iteration" if r["step_time_source"] == "simulated" else "given"
    fits = "" if r["run"]["fits"] in (None, True) else " (the plan does not fit in memory; see trainsim run)"
    print(f"step time {r['step_time_s']:.3f} s ({src}){fits}")
    stall = f"stalls {ck['stall_s']:.3g} s" if ck["mode"] == "sync" else \
        f"stalls {ck['copy_to_host_s']:.3g} s (copy to host), writes {ck['write_s']:.3g} s in the background"
    print(f"checkpoint {ck['bytes'] / 1e12:.2f} TB (16-bit weights + optimizer states, each shard once), "
          f"{ck['mode']} save {stall}; read back in {ck['load_s']:.3g} s")
    mtbf = r["mtbf_s"]
    print(f"failures: {r['failures']['name']}" + (f" ({r['failures']['source']})" if r['failures']['source'] else ""))
    print(f"  on {dev['gpu']:,} GPUs, {dev['node']:,} hosts, {dev['nic']:,} NICs, {dev['switch']:,} switches: "
          + (f"an unexpected interruption every {_hours(mtbf)} on average" if mtbf else "no unexpected failures"))
    print(f"  hot spares: {r['hot_spares']}")
    how = "auto: the best simulated" if r["checkpoint_interval_auto"] else "as given"
    print(f"\ncampaign: {r['days']:g} days, seed {r['seed']}, a checkpoint every {r['checkpoint_interval_s']:.1f} s of "
          f"training ({r['checkpoint_interval_iterations']} iterations; {how})")
    print(f"  goodput            {r['goodput'] * 100:6.1f}%   (useful training {_hours(r['useful_s'])} of "
          f"{_hours(r['wall_s'])})")
    print(f"  interruptions      {r['unexpected_interruptions']:6d}    unexpected (+ {r['planned_interruptions']} planned)")
    print(f"  checkpoint stalls  {_hours(r['checkpoint_stall_s']):>7}   ({r['checkpoints_durable']:,} checkpoints durable)")
    heads = ("lost work", "detect", "wait", "restart", "total")
    print(f"\n  {'time lost by cause':<26} {'count (expected)':>15} " + " ".join(f"{h:>9}" for h in heads))
    lost = r["time_lost_by_cause_s"]
    names = [n for n in sorted(lost, key=lambda n: (-lost[n]["total_s"], n))
             if r["interruptions_by_cause"][n] or r["expected_interruptions_by_cause"][n] >= 0.5]
    for n in names[:TOP_CAUSES]:
        k, e, t = r["interruptions_by_cause"][n], r["expected_interruptions_by_cause"][n], lost[n]
        cells = [t["lost_work_s"], t["detect_s"], t["wait_s"], t["restart_s"] + t["save_s"], t["total_s"]]
        print(f"  {n:<26} {k:5d} ({e:7.1f}) " + " ".join(f"{_hours(v):>9}" for v in cells))
    rest = names[TOP_CAUSES:]
    if rest:
        k = sum(r["interruptions_by_cause"][n] for n in rest)
        e = sum(r["expected_interruptions_by_cause"][n] for n in rest)
        print(f"  {f'{len(rest)} more causes':<26} {k:5d} ({e:7.1f}) {'':>39} "
              f"{_hours(sum(lost[n]['total_s'] for n in rest)):>9}   (--json has each)")
    print("\ncheckpoint interval that maximises goodput:")
    print(f"  simulated          {r['best_checkpoint_interval_s']:9.1f} s   goodput {r['best_goodput'] * 100:.2f}% "
          f"(over {r['search']['horizon_days']:,.0f} simulated days)")
    if r["daly_interval_s"] is not None:
        print(f"  Daly 2006          {r['daly_interval_s']:9.1f} s   closed-form goodput "
              f"{r['daly_goodput_at_best'] * 100:.2f}% at the simulated best")
        print(f"  Young 1974         {r['young_interval_s']:9.1f} s   (both with M = {_hours(mtbf)} between unexpected "
              f"failures, checkpoint {ck['stall_s']:.3g} s, restart {r['mean_restart_s']:.0f} s)")
