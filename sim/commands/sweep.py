"""``trainsim sweep FILE.toml``: simulate every combination of the plan values a file lists.

The file is an experiment file (``sim.inputs.experiment``: ``[model]``, ``[cluster]``,
``[plan]``, ...) in which any plan field may be a list::

    [cluster]
    gpu = "h100-sxm"
    gpus = 16
    [plan]
    tensor_model_parallel_size = [1, 2, 4]
    pipeline_model_parallel_size = [1, 2]
    micro_batch_size = [1, 2]
    global_batch_size = 32
    schedule = ["1f1b", "zb-h1"]

Every combination (the Cartesian product, in file order) becomes one plan; data
parallelism fills ``cluster.gpus`` (or ``cluster.nodes``), which a sweep must give. A
combination that is not a valid plan is recorded with its error and the sweep goes on,
as is a plan whose simulation raises. It runs on the same executors as ``trainsim
search`` (local processes, ``--dask``), appends results as they finish, resumes with
``--resume``, and writes the same outputs (``results.jsonl``, ``results.csv``,
``pareto.png``, ``sweep.json``). Nothing is pruned: every valid point is simulated.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

from sim.inputs import experiment
from sim.inputs.model import model_dict
from sim.commands.search import (
    add_executor_arguments,
    check_executor_args,
    check_rank_by,
    entry,
    interrupted_note,
    open_log,
    pareto_title,
    print_top,
    write_outputs,
)
from sim.errors import InputError
from sim.studies.search import plan_key
from sim.studies.search_explain import explain
from sim.studies.sweep import Runner, make_context
from sim.studies.sweep_results import rank
from sim.inputs.resolve import model_from_settings, plan_from_settings, profile_from_settings, topology_from_settings
from sim.inputs.schema import RunSettings
from sim.inputs.tomlio import TomlFile, line_of

NAME = "sweep"
HELP = "Simulate every combination of the plan values an experiment file lists (lists allowed in [plan])."
LIST_TABLES = ("plan", "zero_optimization")
"""Tables whose values may be lists (the plan's fields)."""


def add_arguments(p) -> None:
    from sim.inputs.flags import add_section
    from sim.inputs.schema_commands import SweepFile

    add_section(p, SweepFile)
    add_executor_arguments(p)


def expand(path: str, settings: dict | None = None) -> tuple[dict, list[tuple[str, list[tuple]]]]:
    """The file's fixed values (by field), and per listed field (file order) each value
    with the settings it stands for. ``settings``, when given, receives the fixed values as
    ``experiment.Setting``s (by field), so that later errors can point at their lines."""
    f = TomlFile(path)
    data = f.data
    if not data:
        raise InputError(f"{f.path}: empty: no tables, only comments; expected [model], [cluster] and [plan] "
                         "tables")
    f.check_keys(data, experiment.TOP_KEYS, "")
    base: dict = {}
    axes: list[tuple[str, list[tuple]]] = []
    for table, fields in experiment.TABLES.items():
        t = data.get(table, {})
        if not isinstance(t, dict):
            raise f.error(table, f"got {t!r}; expected a table [{table}]")
        keys = {key: field for field, key in fields.items()}
        f.check_keys(t, keys, f"{table}.")
        for key, value in t.items():
            field, name = keys[key], f"{table}.{key}"
            if settings is not None and not isinstance(value, list):
                where = experiment.Where(f, line_of(f, table, key))
                settings[field] = experiment.Setting(field, name, _path(f, field, value), where)
            if isinstance(value, list):
                if table not in LIST_TABLES:
                    raise f.error(name, f"got a list {value!r}; only the fields of "
                                        f"{', '.join(f'[{x}]' for x in LIST_TABLES)} may be lists in a sweep")
                if not value:
                    raise f.error(name, "got an empty list; give at least one value")
                axes.append((name, [(v, {field: _checked(f, f"{name}[{i}]", field, v)}) for i, v in enumerate(value)]))
            else:
                base[field] = _checked(f, name, field, value)
    return base, axes


def _checked(f: TomlFile, name: str, field: str, value):
    value = _path(f, field, value)
    experiment.check(f, name, field, value)
    return value


def _path(f: TomlFile, field: str, value):
    """A relative file path in the file is relative to the file (as ``sim.inputs.experiment`` does)."""
    if field == "schedule" and isinstance(value, str) and value.endswith(".csv"):
        raise f.error("schedule", f"got {value!r}; a sweep takes schedule names, not schedule .csv files")
    return experiment.resolve_path(f.path, field, value)


def points(path: str):
    """(model, profile, topology, points) of a sweep file; a point is ``(key, plan or None,
    description, error)``: the plan when the combination is valid, else its error."""
    settings: dict = {}
    base, axes = expand(path, settings)
    fixed = RunSettings.from_values(base)
    try:
        model = model_from_settings(fixed.model)
        profile = profile_from_settings(fixed.cluster)
        gpus = fixed.cluster.total_gpus()
        if gpus is None:
            raise InputError("cluster.gpus: missing; a sweep needs cluster.gpus or cluster.nodes")
        topo = topology_from_settings(fixed.cluster, gpus, profile.name)
    except InputError as exc:
        raise experiment.blame(exc, Path(path), settings) from None
    out, seen = [], set()
    for combo in itertools.product(*(vals for _, vals in axes)):
        values = dict(base)
        for _, v in combo:
            values.update(v)
        desc = " ".join(f"{name}={json.dumps(v)}" for (name, _), (v, _) in zip(axes, combo))
        try:
            run = RunSettings.from_values(values)
            plan = plan_from_settings(run.plan, gpus, model)
        except InputError as exc:
            key = "invalid: " + desc
            if key not in seen:
                seen.add(key)
                out.append((key, None, desc, f"InputError: {exc}"))
            continue
        key = plan_key(plan)
        if key not in seen:
            seen.add(key)
            out.append((key, plan, desc, None))
    return model, profile, topo, gpus, out


def run(args) -> int:
    start = time.monotonic()  # the wall time reported counts from here to the report
    check_executor_args(args)
    model, profile, topo, gpus, pts = points(args.experiment)
    check_rank_by(args.rank_by, profile)
    ctx = make_context(model, profile, topo)
    context = {"command": "sweep", "model": model_dict(model), "gpu": profile.name, "topology": topo.name, "gpus": gpus}
    log = open_log(args, context)
    invalid = [{"key": k, "plan": {}, "status": "error", "error": err, "summary": None, "point": desc}
               for k, plan, desc, err in pts if plan is None]
    for rec in invalid:
        if rec["key"] not in log.done:
            log.append(rec)
    valid = [plan for _, plan, _, _ in pts if plan is not None]
    with interrupted_note(log), Runner(args.workers, args.dask, log) as runner:
        records = runner.run(ctx, valid, label="sweep", start=start)
    records = sorted(records + invalid, key=lambda r: r["key"])
    ranked = rank(records, args.rank_by)
    failed = sum(r["status"] != "ok" for r in records) - len(invalid)
    obj = {"best": entry(ranked[0]) if ranked else None, "top": [entry(r) for r in ranked[:args.top]],
           "points": len(records), "invalid": len(invalid), "evaluated": len(records) - len(invalid),
           "pruned": 0, "failed": failed,
           "does_not_fit": sum(r["status"] == "ok" and not r["summary"]["fits"] for r in records)}
    if args.out:
        title = pareto_title(f"{model.name} on {gpus} x {profile.name}: sweep", len(ranked), obj["evaluated"],
                             f"{len(records)} points, {len(invalid)} invalid")
        write_outputs(Path(args.out), records, ranked, obj, title, profile.hbm_capacity_bytes, "sweep")
    if args.json:
        print(json.dumps(obj, sort_keys=True))
        return 0
    wall = time.monotonic() - start  # all of the command's work: reading, simulations, outputs
    print(model.describe())
    print(f"{gpus} x {profile.name} on {topo.describe()}")
    print(f"{len(records)} points: {len(invalid)} invalid, {obj['evaluated']} simulated ({failed} failed, "
          f"{obj['does_not_fit']} do not fit) in {wall:.1f} s (wall time)")
    for r in records:
        if r["status"] != "ok":
            print(f"  {r['key']}: {r['error']}")
    if ranked:
        print()
        print_top(ranked, args.top, args.rank_by)
        print()
        for line in explain(ranked[0], ranked[1] if len(ranked) > 1 else None):
            print(line)
    if args.out:
        print(f"\nwrote {Path(args.out) / 'results.csv'}, results.jsonl, pareto.png, sweep.json")
    return 0 if ranked else 1
