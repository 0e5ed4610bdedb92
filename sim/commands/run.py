"""``trainsim run``: simulate one training iteration of a plan on a cluster.

The model, GPU and plan come from Megatron-LM-style flags (shared with ``trainsim
estimate``) or from an experiment TOML file (``trainsim run FILE``; flags after it
override it). The cluster is ``--nodes`` nodes of the GPU's DGX node (or
``--topology``) on a rail-optimized or fat-tree fabric; data parallelism fills the GPUs.
Prints a summary, or one JSON object with ``--json``; ``--out DIR`` writes the
summary JSON, the Perfetto trace and the timeline PNG; ``--export-chakra DIR`` the
program as Chakra execution traces (``sim.results.export_chakra``).
"""

from __future__ import annotations

import json
from pathlib import Path

from sim import session
from sim.commands.settings import RUN_FLAGS, check_outputs, say_defaults, typed
from sim.errors import InputError
from sim.inputs.experiment import MODEL_FIELDS, Setting, Where, blame, read_experiment, values_of
from sim.inputs.flags import add_arguments as add_schema_arguments
from sim.inputs.schema import RunSettings
from sim.progress import Progress
from sim.inputs.cost import cost_line
from sim.results.energy import energy_line
from sim.results.export_chakra import chakra_line
from sim.results.moe_report import moe_lines
from sim.results.mixed_report import mixed_lines
from sim.results.stragglers import straggler_lines
from sim.units import format_bytes, format_microbatches, format_time

NAME = "run"
HELP = "Simulate one training iteration (every GPU's compute and communication) and report its metrics."


def add_arguments(p) -> None:
    from sim.inputs.flags import add_section
    from sim.inputs.schema_commands import ExperimentFile

    add_section(p, ExperimentFile)
    add_schema_arguments(p, [*RUN_FLAGS, "export_chakra"])


def settings_of(args) -> tuple[object, dict]:
    """The experiment file (or None) and the settings of the file with the typed flags over it."""
    cli = typed(args)
    if not args.experiment:
        return None, cli
    exp = read_experiment(args.experiment)
    if exp.plans:
        raise InputError(f"{exp.path}: plans: the file lists {len(exp.plans)} plans "
                         f"({', '.join(p.name for p in exp.plans)}); `trainsim run` simulates one: "
                         f"compare them with `trainsim compare {args.experiment}`")
    if not exp.has_model and not set(cli) & MODEL_FIELDS:
        raise InputError(f"{exp.path}: model: missing; add a [model] table (preset = \"llama2-7b\", "
                         "hf_config = \"config.json\" or num_layers = ...) or pass --model PRESET")
    return exp, {**exp.settings, **cli}


def _every_rank(settings: dict) -> dict:
    """``--export-chakra`` writes every rank's trace, so every GPU is simulated: ``auto``
    fidelity runs full, and ``reduced`` (asked for) is refused before any work."""
    chosen = settings.get("fidelity")
    if chosen is not None and chosen.value == "reduced":
        where = f"{chosen.where.f.path}:{chosen.where.line}: " if chosen.where.f is not None else ""
        raise InputError(f"--export-chakra: {where}fidelity 'reduced' simulates one GPU per pipeline stage; "
                         "Chakra needs every rank's trace: use fidelity full (or auto)")
    return {**settings, "fidelity": Setting("fidelity", "fidelity", "full", Where())}


def _simulate(settings: dict):
    prepared = session.prepare(RunSettings.from_values(values_of(settings)))
    say_defaults(prepared.settings.model)
    with Progress() as bar:
        bar.update(f"simulating {prepared.plan.world_size} GPUs")
        return session.run(prepared)


def run(args) -> int:
    check_outputs(args)
    exp, settings = settings_of(args)
    if args.export_chakra:
        settings = _every_rank(settings)
    try:
        run_, summary = _simulate(settings)
    except InputError as exc:
        if exp is None:
            raise
        raise blame(exc, exp.path, settings) from None
    chakra = None
    if args.export_chakra:  # (first: it may refuse the program, and then nothing is written)
        chakra = session.write_chakra_files(run_, args.export_chakra)
    if args.out:
        session.write_outputs(run_, summary, Path(args.out))
    if args.kineto:
        session.write_kineto_files(run_, args.kineto)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return exit_status(summary["fits"])
    _print(summary, run_)
    if args.out:
        print(f"\nwrote {Path(args.out) / 'summary.json'}, trace.json, timeline.png, memory.png")
    if args.kineto:
        print(f"wrote {Path(args.kineto)}/trace_rank<r>.json (PyTorch profiler format)")
    if chakra is not None:
        print(chakra_line(chakra, args.export_chakra))
    return exit_status(summary["fits"])


def exit_status(fits: bool) -> int:
    """0 when the plan fits in GPU memory, 1 when it does not (the results are printed and
    written all the same), as ``trainsim search`` exits 1 when no plan fits; 2 is bad input."""
    return 0 if fits else 1


def _print(s: dict, run: session.TrainingRun) -> None:
    plan = run.plan
    print(f"{run.model.describe()}")
    print(f"{s['gpus']} x {s['gpu']} on {run.topology.describe()}")
    if run.fidelity == "reduced":
        print(f"fidelity: reduced ({s['simulated_gpus']} GPUs simulated, one per pipeline stage; the others are shadows"
              " in its collectives)")
    elif run.fidelity_reason.startswith("auto"):
        print("fidelity: full (every GPU simulated)")
    if run.fidelity_reason.startswith("auto"):
        print(f"  chosen by {run.fidelity_reason}")
    print(f"plan: dp {plan.dp}{f' x cp {plan.cp} ({plan.cp_comm_type})' if plan.cp > 1 else ''} x tp {plan.tp} x "
          f"pp {plan.pp}{f' (vpp {plan.vpp})' if plan.vpp > 1 else ''}"
          f"{f', ep {plan.ep} x etp {plan.etp_size}' if s.get('moe') else ''}, "
          f"schedule {s['schedule']}, global batch {plan.global_batch_size}: "
          f"{format_microbatches(plan.num_microbatches, plan.micro_batch_size, run.model.seq_length)} per replica, "
          f"recompute {plan.recompute_label}, ZeRO-{plan.zero_stage}"
          f"{' (parameter gather overlapped)' if plan.param_gather_overlap else ''}, "
          f"sp {'on' if plan.sp else 'off'}, precision {s['precision']}")
    T = s["iteration_time_s"]
    print()
    print(f"  iteration time     {format_time(T):>12}   (analytic estimate {format_time(s['estimate_iteration_time_s'])})")
    print(f"  tokens/s           {s['tokens_per_s']:>12,.0f}")
    print(f"  TFLOP/s per GPU    {s['tflops_per_gpu']:>12.1f}   MFU {s['mfu'] * 100:.1f}%   HFU {s['hfu'] * 100:.1f}%")
    print(f"  pipeline bubble    {s['bubble_fraction'] * 100:>11.1f}%")
    print(f"  time on rank {s['critical_rank']} (the last to finish):")
    print(f"    compute          {format_time(s['compute_s']):>12}  {s['compute_s'] / T * 100:5.1f}%")
    for kind, v in s["exposed_comm_s"].items():
        if v > 0:
            print(f"    exposed {kind:<8} {format_time(v):>12}  {v / T * 100:5.1f}%")
    print(f"    idle             {format_time(s['idle_s']):>12}  {s['idle_fraction'] * 100:5.1f}%")
    print(f"    comm hidden under compute: {s['comm_overlap_fraction'] * 100:.1f}%")
    print(energy_line(s))
    if cost_line(s):
        print(cost_line(s))
    if "mixed" in s:
        print("\n".join(mixed_lines(s["mixed"])))
    if "stragglers" in s:
        print("\n".join(straggler_lines(s["stragglers"])))
    if "moe" in s:
        print("\n".join(moe_lines(s["moe"])))
    m = s["memory"]
    verdict = "fits" if s["fits"] else "DOES NOT FIT: this plan cannot run as configured (times are shown anyway)"
    print(f"  peak memory        {format_bytes(m['peak_bytes']):>12} of {format_bytes(s['memory_capacity_bytes'])} "
          f"on rank {m['rank']} (stage {m['pipeline_stage']}) at {format_time(m['peak_time_s'])}: {verdict}")
    for cat, v in m["breakdown_at_peak_bytes"].items():
        if v:
            print(f"    {cat:<16} {format_bytes(v):>12}")
