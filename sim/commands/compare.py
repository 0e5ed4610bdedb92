"""``trainsim compare``: several plans of one model on one cluster, side by side.

The plans come from an experiment file's ``[[plans]]`` tables (each a name and the
[plan] keys it changes), from ``--schedules gpipe,1f1b,...`` / ``--zero-stages 0,1,2,3``
over one base plan (the file's or the flags'), or both (every plan under every value).
Every flag ``trainsim run`` takes works here too and, typed after the file, overrides
it for every plan. Prints one row per plan (iteration time, tokens/s, MFU, bubble,
exposed communication by kind, peak memory against capacity, fits) with the best plan
marked: the most tokens/s among the plans that fit in memory. ``--json`` prints the
rows and every plan's summary; ``--out DIR`` writes each plan's outputs into
``DIR/<plan>/`` and ``compare.png``, a bar per plan of iteration time split into
compute, exposed communication and bubble, beside its peak memory.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sim import session
from sim.commands.run import exit_status
from sim.commands.settings import RUN_FLAGS, check_outputs, say_defaults, typed
from sim.inputs.experiment import values_of
from sim.inputs.schema import RunSettings
from sim.errors import InputError
from sim.inputs.flags import add_arguments as add_schema_arguments
from sim.inputs.variants import fit_vpp_to_schedule
from sim.studies.sweep_results import tokens_per_joule
from sim.units import format_bytes

NAME = "compare"
HELP = "Simulate several plans (an experiment file's [[plans]], or --schedules / --zero-stages) side by side."


def add_arguments(p) -> None:
    from sim.inputs.flags import add_section
    from sim.inputs.schema_commands import CompareOptions

    add_schema_arguments(p, RUN_FLAGS, helps={
        "out": "directory for compare.png, compare.json and each plan's outputs in DIR/<plan>/",
        "kineto": "directory for each plan's PyTorch-profiler-shaped traces, in DIR/<plan>/trace_rank{r}.json"})
    add_section(p, CompareOptions)


def run(args) -> int:
    from sim import api
    from sim.inputs.experiment import read_experiment
    from sim.progress import Progress

    check_outputs(args)
    cli = typed(args)
    for z in args.zero_stages or ():
        if z not in (0, 1, 2, 3):
            raise InputError(f"--zero-stages: got {z}; allowed: 0, 1, 2, 3")
    exp = read_experiment(args.experiment) if args.experiment else None
    variants = api.variants_of(exp, None, args.schedules, args.zero_stages)
    if not any(k in cli for k in ("model", "hf_config", "num_layers", "hidden_size")) and not (exp and exp.has_model):
        where = f"{exp.path}: " if exp else ""
        raise InputError(f"{where}model: missing; add a [model] table (preset = \"llama2-7b\", "
                         "hf_config = \"config.json\" or num_layers = ...) or pass --model PRESET")
    base = exp.settings if exp else {}
    plans = [{**base, **v.settings, **v.axis, **cli} for v in variants]
    plans = [fit_vpp_to_schedule(v, settings, _layers_of(settings)) for v, settings in zip(variants, plans)]
    for v, settings in zip(variants, plans):  # every plan's input errors before anything is simulated
        api.check_variant(exp, v, settings)
    first = RunSettings.from_values(values_of(plans[0]))
    say_defaults(first.model)
    if args.rank_by == "cost":  # before any simulation: a price is needed (search checks the same)
        from sim.commands.search import check_rank_by
        from sim.inputs.resolve import profile_from_settings

        check_rank_by("cost", profile_from_settings(first.cluster))
    results = []
    with Progress(total=len(variants)) as bar:
        for i, (v, settings) in enumerate(zip(variants, plans)):
            gpus = f"{results[0].summary['gpus']} GPUs, " if results else ""
            bar.update(f"simulating {gpus}plan {i + 1}/{len(variants)} ({v.name})", done=i)
            results.append(api.simulate_variant(exp, v, settings))
    comp = api.Comparison(results, rank_by=args.rank_by)
    if args.out:
        comp.save(args.out)
    if args.kineto:
        for r, d in zip(results, api.plan_dirs([r.name for r in results])):
            session.write_kineto_files(r.run, Path(args.kineto) / d)
    status = exit_status(comp.best is not None)  # 1 when no plan fits, as search
    if args.json:
        print(comp.to_json())
        return status
    print_table(comp)
    if args.out:
        print(f"\nwrote {Path(args.out) / 'compare.png'}, compare.json and each plan's outputs in "
              f"{Path(args.out)}/<plan>/")
    if args.kineto:
        print(f"wrote Kineto traces in {Path(args.kineto)}/<plan>/trace_rank<r>.json")
    return status


def _layers_of(settings):
    """The model's transformer layers, for ``fit_vpp_to_schedule`` (resolved only when asked)."""
    def layers() -> int:
        from sim.inputs.resolve import model_from_settings

        return model_from_settings(RunSettings.from_values(values_of(settings)).model).num_layers
    return layers


def print_table(comp, out=None) -> None:
    """The comparison as a table, one row per plan, the best marked with ``*``."""
    out = out or sys.stdout
    results, rows = comp.results, comp.rows
    first = results[0].run
    print(first.model.describe(), file=out)
    print(f"{first.plan.world_size} x {first.profile.name} on {first.topology.describe()}", file=out)
    if any(r.run.fidelity == "reduced" for r in results):
        print("fidelity: reduced (one data-parallel replica simulated; the others are shadows in its collectives)",
              file=out)
    print(file=out)
    longest = max(r["iteration_time_s"] for r in rows)
    unit, scale = ("s", 1.0) if longest >= 1 else ("ms", 1e3)
    kinds = [k for k in ("tp", "pp", "dp", "zero", "offload", "ep", "cp", "other") if any(r["exposed_comm_s"].get(k, 0) > 0 for r in rows)]
    best = comp.best
    energy = comp.rank_by == "tokens-per-joule"
    cost = comp.rank_by == "cost"
    name_w = max(4, *(len(r["name"]) for r in rows))
    cap = rows[0]["memory_capacity_bytes"]
    head = (f"  {'plan':<{name_w}}  {'time (' + unit + ')':>10}  {'vs best':>7}  {'tokens/s':>11}  {'MFU':>6}  "
            f"{'bubble':>6}  " + "".join(f"{'exp. ' + k:>9}  " for k in kinds)
            + f"{'peak memory':>11}  {'fits':>4}" + (f"  {'tokens/J':>9}" if energy else "")
            + (f"  {'$/M tokens':>10}" if cost else ""))
    print(head, file=out)
    print("  " + "-" * (len(head) - 2), file=out)
    for r in rows:
        t = r["iteration_time_s"]
        vs = f"{(t / best.iteration_time_s - 1) * 100:+.1f}%" if best is not None and not r["best"] else ""
        line = (f"{'*' if r['best'] else ' '} {r['name']:<{name_w}}  {t * scale:>10.3f}  {vs:>7}  "
                f"{r['tokens_per_s']:>11,.0f}  {r['mfu'] * 100:>5.1f}%  {r['bubble_fraction'] * 100:>5.1f}%  "
                + "".join(f"{r['exposed_comm_s'].get(k, 0.0) * scale:>9.3f}  " for k in kinds)
                + f"{r['peak_memory_bytes'] / 2**30:>7.2f} GiB  {'yes' if r['fits'] else 'OOM':>4}"
                + (f"  {1 / r['energy_per_token_j']:>9,.1f}" if energy else "")
                + (f"  {r['cost_per_million_tokens_usd']:>10.4g}" if cost else ""))
        print(line, file=out)
    print(file=out)
    print(f"times in {unit}; exp. = communication not hidden under compute on the critical rank; peak memory of the "
          f"fullest GPU, of {format_bytes(cap)}", file=out)
    if best is not None and energy:
        worst = min(tokens_per_joule(r.summary) for r in results if r.fits)
        print(f"* best: {best.name} (the most tokens per joule of GPU energy among the plans that fit; "
              f"{tokens_per_joule(best.summary) / worst:.2f}x the least efficient that fits)", file=out)
    elif best is not None and cost:
        dearest = max(r.summary["cost_per_million_tokens_usd"] for r in results if r.fits)
        print(f"* best: {best.name} (the fewest dollars per million tokens among the plans that fit, "
              f"${best.summary['cost_per_million_tokens_usd']:.4g}; {dearest / best.summary['cost_per_million_tokens_usd']:.2f}x "
              "cheaper than the dearest that fits)", file=out)
    elif best is not None:
        slowest = max(r.iteration_time_s for r in results if r.fits)
        print(f"* best: {best.name} (the most tokens/s among the plans that fit; "
              f"{slowest / best.iteration_time_s:.2f}x the slowest that fits)", file=out)
    else:
        print("no plan fits in GPU memory: none is marked best", file=out)
    for r in results:
        if r.description:
            print(f"  {r.name}: {r.description}", file=out)
