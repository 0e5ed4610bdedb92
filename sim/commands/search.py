"""``trainsim search``: the best parallel plan for a model, a cluster and a batch.

Enumerates every valid plan (dp, tp, pp, vpp, micro-batch, ZeRO stage, schedule,
recompute, sequence parallelism, for a mixture of experts ep, etp and the token dispatcher, for long sequences
cp, and with ``--fp8-format off,hybrid`` BF16 and FP8;
``sim.studies.search``), drops those the analytic memory model
says do not fit, simulates the others in order of their estimated time until none left
can beat the N-th best by the estimate's error margin, and prints the top N with why the
best wins. ``--out DIR`` writes ``results.jsonl`` (simulated plans, appended as they
finish, resumable with ``--resume``), ``results.csv`` (every plan, with its status),
``pareto.png`` (tokens/s against peak memory) and ``search.json`` (what ``--json``
prints). The helpers for outputs are shared with ``trainsim sweep`` (ranking, the Pareto
front and the CSV table are ``sim.studies.sweep_results``').
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from pathlib import Path

from sim.commands.settings import MODEL_FLAGS, NETWORK_FLAGS, say_defaults
from sim.errors import InputError, require
from sim.fileio import check_output_dir, read_json, write_text_atomic
from sim.inputs.pinning import crossing
from sim.inputs.resolve import model_from_settings, profile_from_settings, topology_from_settings
from sim.inputs.flags import add_arguments as add_schema_arguments, add_section, flags_of, given
from sim.inputs.schema_commands import SEARCH_SPACE_ATTR, ExecutorOptions, SearchBatch, SearchSpaceOptions
from sim.inputs.fields import fields_of_class
from sim.inputs.schema import FIELDS, RunSettings, fields_of
from sim.inputs.plan import ParallelPlan
from sim.inputs.precision import FP8_FORMATS, check_support, fp8_precision
from sim.progress import ProgressBar
from sim.studies.search import (
    DEFAULT_MARGIN,
    SearchOptions,
    SearchSpace,
    candidates,
    enumerate_plans,
    search,
    split_failures,
)
from sim.studies.search_explain import describe_plan, explain
from sim.studies.sweep import RESULTS_FILE, ResultsLog, Runner, make_context
from sim.studies.sweep_results import csv_text, pareto, rank, tokens_per_joule
from sim.units import format_bytes, format_duration, format_time

NAME = "search"
HELP = "Find the best parallel plan: enumerate, prune with the analytic model, simulate the rest, rank."


def add_executor_arguments(p) -> None:
    """--workers, --dask, --out, --resume, --top, --rank-by, --json (shared with ``trainsim sweep``;
    ``sim.inputs.schema_commands.ExecutorOptions``)."""
    add_section(p, ExecutorOptions)


SEARCH_FLAGS = [*MODEL_FLAGS, "gpu", "gpus", "nodes", "gpus_per_node", "power_limit_w", *NETWORK_FLAGS,
                "gpu_hour_price"]
"""The run settings search takes as flags: the model and the cluster (the plan is what it searches)."""


def add_arguments(p) -> None:
    add_schema_arguments(p, SEARCH_FLAGS, groups={"hardware": "cluster"}, helps={
        "gpus": "total GPUs (default: all GPUs of --nodes)",
        "nodes": "nodes in the cluster (default: enough for --gpus)"})
    add_section(p, SearchBatch)
    add_section(p, SearchSpaceOptions)
    add_executor_arguments(p)


def _list(args, name: str, kind=int):
    text = getattr(args, name)
    if text is None:
        return None
    flag = _OPTION[name].flag
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    require(items, flag, text, "expected a comma-separated list")
    out = []
    for x in items:
        if kind is bool:
            require(x in ("on", "off", "true", "false"), flag, x, "allowed: on, off")
            out.append(x in ("on", "true"))
        elif kind is int:
            require(x.isdigit() and int(x) > 0 or (name == "zero" and x == "0"), flag, x,
                    "expected a comma-separated list of integers" + (" >= 0" if name == "zero" else " > 0"))
            out.append(int(x))
        else:
            out.append(x)
    return tuple(out)


def space_from_args(args) -> SearchSpace:
    if args.max_tp is not None:
        require(args.max_tp > 0, "--max-tp", args.max_tp, "expected an integer > 0")
    try:
        return _space(args)
    except InputError as exc:  # SearchSpace names its attribute (``setting``); say which flag
        flag = _SPACE_FLAGS.get(exc.setting) if exc.allowed is not None else None
        if flag is None:
            raise
        raise InputError(field=flag, value=exc.value, allowed=exc.allowed, shown=exc.shown) from None


_OPTION = {f.name: f for f in fields_of_class(SearchSpaceOptions, "search")}
_SPACE_FLAGS = {SEARCH_SPACE_ATTR.get(name, name): f.flag for name, f in _OPTION.items()}
"""The flag of each ``SearchSpace`` attribute (``sim.inputs.schema_commands.SearchSpaceOptions``)."""


def _space(args) -> SearchSpace:
    return SearchSpace(tp=_list(args, "tp"), pp=_list(args, "pp"), vpp=_list(args, "vpp"),
                       micro_batch_size=_list(args, "micro_batch_size"), zero_stage=_list(args, "zero"),
                       schedule=_list(args, "schedule", str), recompute=_list(args, "recompute", str),
                       sequence_parallel=_list(args, "sequence_parallel", bool), max_tp=args.max_tp,
                       fp8_format=_fp8_formats(args), ep=_list(args, "ep"), etp=_list(args, "etp"),
                       cp=_list(args, "cp"), dispatcher=_list(args, "dispatcher", str))


def _fp8_formats(args) -> tuple:
    """``--fp8-format off,hybrid`` as ``(None, "hybrid")`` (default: BF16 only)."""
    items = _list(args, "fp8_format", str)
    if items is None:
        return (None,)
    for x in items:
        require(x == "off" or x in FP8_FORMATS, "--fp8-format", x, f"allowed: off, {', '.join(FP8_FORMATS)}")
    return tuple(None if x == "off" else x for x in items)


def check_executor_args(args) -> None:
    require(args.top >= 1, "--top", args.top, "expected an integer >= 1")
    if args.workers is not None:
        require(args.workers >= 0, "--workers", args.workers, "expected an integer >= 0 (0: run in this process)")
    if args.dask is not None:
        require(args.dask == "local" or "://" in args.dask, "--dask", args.dask,
                "expected 'local' or a scheduler address such as tcp://HOST:8786")
        require(args.dask != "local" or args.workers != 0, "--workers", 0,
                "a Dask LocalCluster needs at least 1 worker")
    require(not args.resume or args.out, "--resume", True, "needs --out DIR (the sweep to continue)")
    check_output_dir(args.out, "--out")


def open_log(args, context: dict) -> ResultsLog:
    """The results log in --out, after checking that a resumed one is the same sweep."""
    if not args.out:
        return ResultsLog(None)
    out = Path(args.out)
    require(not out.exists() or out.is_dir(), "--out", args.out, "exists and is not a directory")
    manifest = out / "manifest.json"
    if args.resume and manifest.exists():
        old = read_json(manifest)
        if not isinstance(old, dict):
            raise InputError(f"{manifest}: got {type(old).__name__}; expected the JSON object trainsim writes "
                             "(delete the folder's contents, or give another --out)")
        if old != json.loads(json.dumps(context, sort_keys=True)):
            diff = sorted(k for k in set(old) | set(context) if old.get(k) != context.get(k))
            raise InputError(f"--resume: {args.out} holds another sweep (it differs in {', '.join(diff)}); "
                             "give another --out or the same inputs")
    log = ResultsLog(out / RESULTS_FILE, resume=args.resume)
    write_text_atomic(json.dumps(context, sort_keys=True, indent=1) + "\n", manifest)
    return log


@contextlib.contextmanager
def interrupted_note(log: ResultsLog):
    """On Ctrl-C, say how many results are safe and how to continue, then stop."""
    try:
        yield
    except KeyboardInterrupt:
        if log.path is not None:
            print(f"trainsim: {len(log.done)} results are in {log.path}; rerun with --resume to finish",
                  file=sys.stderr)
        raise


def entry(rec: dict) -> dict:
    """A ranked plan as --json reports it: its key, then ``trainsim run --json``'s object."""
    return {"key": rec["key"], **rec["summary"]}


def pareto_title(head: str, shown: int, simulated: int, total: str) -> str:
    """The title of pareto.png: it shows the simulated plans that ran and fit, so it says
    how many of the simulated ones that is (the count the text reports as simulated)."""
    return f"{head}\n{shown} plans that ran and fit, of {simulated} simulated ({total})"


def write_outputs(out: Path, rows: list[dict], ranked: list[dict], obj: dict, title: str,
                  capacity_bytes: float, name: str) -> None:
    from sim.results.export import write_json_atomic
    from sim.results.plot_pareto import plot_pareto

    write_text_atomic(csv_text(rows), out / "results.csv")
    front = {r["key"] for r in pareto(ranked)}
    pts = [(r["summary"]["memory"]["peak_bytes"], r["summary"]["tokens_per_s"], r["key"] in front,
            describe_plan(r["plan"]) if r is ranked[0] else "") for r in ranked]
    plot_pareto(pts, out / "pareto.png", title=title, capacity_bytes=capacity_bytes)
    write_json_atomic(obj, out / f"{name}.json")


ALWAYS_SHOWN = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size", "global_batch_size",
                "zero", "recompute_granularity", "schedule")
"""Plan settings a printed ``trainsim run`` command always spells out (the rest when not at
their defaults)."""


def run_command(typed: dict, plan: dict) -> str:
    """The ``trainsim run`` command that simulates ``plan`` (a record's plan, as
    ``dataclasses.asdict`` gives it) on what the search was given (``typed``: its model and
    cluster settings as typed), its layer split included: copy-pasteable (shell-quoted)."""
    import shlex

    default = ParallelPlan()
    values = {}
    for name in fields_of("plan"):
        f = FIELDS[name]
        v = plan.get(f.attr)
        if isinstance(v, list):
            v = tuple(v)
        if name in ALWAYS_SHOWN or v != getattr(default, f.attr):
            if v is not None:
                values[name] = v
    return "trainsim run " + shlex.join(flags_of({**typed, **values}))


def print_top(ranked: list[dict], top: int, rank_by: str = "throughput") -> None:
    """The top plans, one a line (with their tokens per joule, or dollars per million tokens,
    when ranked by it)."""
    energy, cost = rank_by == "tokens-per-joule", rank_by == "cost"
    width = max([62, *(len(describe_plan(r["plan"])) + 2 for r in ranked[:top])])
    print(f"{'#':>3}  {'plan':<{width}}{'iteration':>11}{'tokens/s':>12}{'MFU':>7}{'peak mem':>12}"
          + (f"{'tokens/J':>10}" if energy else "") + (f"{'$/M tokens':>12}" if cost else ""))
    for i, r in enumerate(ranked[:top], start=1):
        s = r["summary"]
        print(f"{i:>3}  {describe_plan(r['plan']):<{width}}{format_time(s['iteration_time_s']):>11}"
              f"{s['tokens_per_s']:>12,.0f}{s['mfu'] * 100:>6.1f}%{format_bytes(s['memory']['peak_bytes']):>12}"
              + (f"{tokens_per_joule(s):>10,.1f}" if energy else "")
              + (f"{s['cost_per_million_tokens_usd']:>12.4g}" if cost else ""))


def check_rank_by(rank_by: str, profile) -> None:
    """Ranking by tokens per joule needs the profile's power figures (``sim.results.energy``)."""
    from sim.results.energy import PowerStates

    require(rank_by != "tokens-per-joule" or PowerStates.of(profile) is not None, "--rank-by", rank_by,
            f"profile {profile.name} gives no power figures (power_limit_w, idle_power_w, "
            "memory_bound_power_fraction, communication_power_fraction): rank by throughput")
    require(rank_by != "cost" or profile.gpu_hour_price_usd is not None, "--rank-by", rank_by,
            f"{profile.name} has no price: give --gpu-hour-price USD, or gpu_hour_price_usd in its profile")


STOP_CODES = {"SIGINT": 130, "SIGTERM": 143, "max-time": 0}
"""The exit status of a search stopped early, by what stopped it (the signals' as a shell reports them)."""
STOPPED_BY = {"SIGINT": "Ctrl-C (SIGINT)", "SIGTERM": "SIGTERM", "max-time": "--max-time {max_time}"}


def run(args) -> int:
    start = time.monotonic()  # the wall time reported counts from here to the report
    # on stderr: what it is doing while it enumerates and estimates, then the count of simulations
    progress = ProgressBar(None, label="search", start=start, noun="simulations")
    try:
        return _run(args, start, progress)
    finally:
        progress.close()


def _run(args, start: float, progress: ProgressBar) -> int:
    check_executor_args(args)
    settings = RunSettings.from_values({k: v for k, v in given(args).items() if k in SEARCH_FLAGS})
    model = model_from_settings(settings.model)
    pattern = model.hybrid_override_pattern
    require(pattern is None or "|" not in pattern, "--hybrid-override-pattern", pattern,
            "its | fixes the pipeline stages, and the search chooses them; give the pattern without |")
    say_defaults(settings.model)
    profile = profile_from_settings(settings.cluster)
    gpus = settings.cluster.total_gpus()
    if gpus is None:
        raise InputError("--gpus: missing; give --gpus N or --nodes N")
    require(gpus > 0, "--gpus", gpus, "expected an integer > 0")
    require(args.global_batch_size > 0, "--global-batch-size", args.global_batch_size, "expected an integer > 0")
    require(args.margin is None or args.margin >= 1, "--margin", args.margin,
            "expected a number >= 1 (inf: no time pruning)")
    require(args.wave >= 1, "--wave", args.wave, "expected an integer >= 1")
    space = space_from_args(args)
    for fmt in space.fp8_format:
        check_support(fp8_precision(fmt), profile)
    check_rank_by(args.rank_by, profile)
    topo = topology_from_settings(settings.cluster, gpus, profile.name)
    require(gpus <= topo.num_gpus, "--gpus", gpus, f"topology {topo.name} has only {topo.num_gpus} GPUs")
    progress.phase(f"enumerating the plans of {gpus} GPUs")
    plans = enumerate_plans(model, gpus, args.global_batch_size, space, topo.gpus_per_node)
    require(plans, "search", f"{gpus} GPUs, global batch {args.global_batch_size}",
            "no valid plan: dp must divide the global batch, tp the heads and pp the layers")
    pinned = settings.cluster.pinned()
    crossing_domains = 0
    if pinned:  # the plans whose pinned groups would cross NVLink domains are not candidates
        inside = [p for p in plans if crossing(p, pinned, topo.gpus_per_node) is None]
        crossing_domains = len(plans) - len(inside)
        require(inside, "--pin-to-nvlink-domain", ",".join(pinned),
                f"no plan of the space keeps those groups inside one NVLink domain of {topo.gpus_per_node} GPUs")
        plans = inside
    ctx = make_context(model, profile, topo)
    # the margin the pruning uses: the given one, else 1 where the bound is a true lower bound
    # (a mixture of experts' plans, ``sim.studies.search.plan_margin``) and the default for the rest
    margin = args.margin if args.margin is not None else 1.0 if model.moe else DEFAULT_MARGIN
    from dataclasses import asdict

    from sim.inputs.model import model_dict

    context = {"command": "search", "model": model_dict(model), "gpu": profile.name, "topology": topo.name,
               "gpus": gpus, "global_batch_size": args.global_batch_size}
    log = open_log(args, context)
    with interrupted_note(log), Runner(args.workers, args.dask, log) as runner:
        progress.phase(f"estimating the memory and time of {len(plans):,} plans")
        # the estimates run on the workers too, several chunks each so that none waits long
        cands = candidates(model, plans, profile, topo.gpus_per_node, map=runner.map, chunks=4 * runner.workers)
        screen = args.screen == "on" and args.rank_by == "throughput"
        if args.max_time is not None:
            runner.deadline = start + args.max_time
        # the count of simulations the pruning may still run, corrected before each wave
        options = SearchOptions(margin=args.margin, wave=args.wave, screen=screen, final=max(args.top, 2),
                                # the cluster's GPUs are fixed: cost per token goes with time, so prune by time
                                rank_by="throughput" if args.rank_by == "cost" else args.rank_by,
                                idle_power_w=profile.idle_power_w)
        result = search(cands, lambda plans, screening=(): runner.run(ctx, plans, progress=progress,
                                                                      screening=screening), options,
                        planned=progress.set_total, stoppable=True, finished=log.done, screening_records=True)
        if result.stopped:
            runner.close(kill=True)  # the simulations under way go with the workers
    ranked = rank(result.ranked, args.rank_by)
    c = result.counts
    typed = {k: v for k, v in given(args).items() if k in SEARCH_FLAGS}
    commands = [run_command(typed, r["plan"]) for r in ranked[:args.top]]
    # plans pruned for memory whose bound could have placed them in the list, had another split been used
    alike = split_failures(model, result.candidates, profile, ranked[:args.top][-1]["summary"]["iteration_time_s"],
                           topo.gpus_per_node) if ranked and args.rank_by == "throughput" else []
    split_only = [{"key": f.candidate.key, "plan": asdict(f.candidate.plan),
                   "peak_bytes": f.candidate.estimate.memory["total"], "bound_s": f.candidate.bound_s,
                   "fits_with_split": list(f.split), "peak_bytes_with_split": f.estimate.memory["total"],
                   "command": run_command(typed, {**asdict(f.candidate.plan), "layer_split": f.split})}
                  for f in alike]
    obj = {"best": entry(ranked[0]) if ranked else None, "top": [entry(r) for r in ranked[:args.top]],
           "commands": commands, "stopped": result.stopped, "split_only": split_only,
           "not_simulated": c["not_simulated"],
           "evaluated": c["evaluated"], "pruned": c["pruned"], "failed": c["failed"],
           "pruned_memory": c["pruned_memory"], "pruned_time": c["pruned_time"],
           "pruned_dominated": c["pruned_dominated"], "screened": c["screened"], "plans": c["plans"],
           "does_not_fit": c["does_not_fit"], "crossing_domains": crossing_domains,
           "margin": margin if math.isfinite(margin) else None, "rank_by": args.rank_by}
    if args.out:
        rows = [{"key": cd.key, "status": cd.status, "plan": asdict(cd.plan),
                 "summary": cd.record["summary"] if cd.record and cd.status != "screened" else None,
                 "error": cd.record.get("error") if cd.record else None,
                 "extra": {"estimate_step_s": cd.estimate.time["step"], "estimate_bound_s": cd.bound_s,
                           "estimate_peak_memory_bytes": cd.estimate.memory["total"],
                           "screened_iteration_time_s": cd.record["summary"]["iteration_time_s"]
                           if cd.status == "screened" else ""}} for cd in result.candidates]
        title = pareto_title(f"{model.name} on {gpus} x {profile.name}, global batch {args.global_batch_size}",
                             len(ranked), c["evaluated"], f"{c['plans']} considered")
        write_outputs(Path(args.out), rows, ranked, obj, title, profile.hbm_capacity_bytes, "search")
    code = STOP_CODES.get(result.stopped, 0)
    if result.stopped and args.out:
        print(f"trainsim: {len(log.done)} results are in {log.path}; rerun with --resume to go on", file=sys.stderr)
    if args.json:
        print(json.dumps(obj, sort_keys=True))
        return code
    print(model.describe())
    print(f"{gpus} x {profile.name} on {topo.describe()}; global batch {args.global_batch_size} x {model.seq_length} tokens")
    margin_shown = f"x {margin:g}" if math.isfinite(margin) else "off"
    wall = time.monotonic() - start  # all of the command's work: estimates, simulations, outputs
    screened = f"{c['screened']} only at fewer micro-batches, " if c["screened"] else ""
    dominated = (f", {c['pruned_dominated']} recompute more than a plan that ran and fit"
                 if c["pruned_dominated"] else "")
    print(f"{c['plans']} plans: {c['pruned_memory']} do not fit in memory, {c['pruned_time']} cannot beat the "
          f"best two (estimate margin {margin_shown}){dominated}, {c['evaluated']} simulated ({screened}{c['failed']} "
          f"failed) in {wall:.1f} s (wall time)")
    if crossing_domains:
        print(f"{crossing_domains} more plan(s) left out: a group pinned by --pin-to-nvlink-domain "
              f"({','.join(pinned)}) would cross NVLink domains")
    if c["does_not_fit"]:
        print(f"{c['does_not_fit']} simulated plan(s) did not fit in memory after all (simulated peak)")
    if result.stopped:
        why = STOPPED_BY[result.stopped].format(max_time=format_duration(args.max_time or 0))
        print(f"stopped by {why} after {wall:.1f} s: {c['not_simulated']} plan(s) the pruning had not ruled out were "
              f"not simulated; {'the best so far' if ranked else 'no plan had run in full'}"
              + (f" (rerun with --resume{' and a longer --max-time' if result.stopped == 'max-time' else ''} "
                 "to go on)" if args.out else ""))
    if not ranked:
        print("no plan ran and fits")
        return code or 1
    print()
    print_top(ranked, args.top, args.rank_by)
    if split_only:
        print(f"left out only because of its layer split (balanced for time): by the estimate that pruned it, it "
              f"does not fit in {format_bytes(profile.hbm_capacity_bytes)}, another split does, and its bound could "
              f"place it in this list:")
        for x in split_only:
            print(f"     {describe_plan(x['plan'])}: {format_bytes(x['peak_bytes'])}; with --layer-split "
                  f"{','.join(map(str, x['fits_with_split']))} {format_bytes(x['peak_bytes_with_split'])} "
                  f"(bound {format_time(x['bound_s'])}): {x['command']}")
    print()
    for line in explain(ranked[0], ranked[1] if len(ranked) > 1 else None):
        print(line)
    print("\neach listed plan on its own (trainsim run prints the same iteration time):")
    for i, cmd in enumerate(commands, start=1):
        print(f"{i:>3}  {cmd}")
    if args.out:
        print(f"\nwrote {Path(args.out) / 'results.csv'}, results.jsonl, pareto.png, search.json")
    return code

