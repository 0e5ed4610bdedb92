"""``trainsim run``: simulate one training iteration of a plan on a cluster.

The model, GPU and plan come from Megatron-LM-style flags (shared with ``trainsim
estimate``) or from an experiment TOML file (``trainsim run FILE``; flags after it
override it). The cluster is ``--nodes`` nodes of the GPU's DGX node (or
``--topology``) on a rail-optimized or fat-tree fabric; data parallelism fills the GPUs.
Prints a summary, or one JSON object with ``--json``; ``--out DIR`` writes the
summary JSON, the Perfetto trace and the timeline PNG.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from sim.commands._spec import add_arguments as add_spec_arguments
from sim.commands._spec import model_from_args, plan_from_args, schedule_from_args
from sim.errors import InputError
from sim.build.estimate import estimate, model_flops_per_sequence
from sim.inputs.experiment import TABLES, blame, experiment_argv, given_dests, read_experiment
from sim.fileio import check_output_dir
from sim.inputs.hardware import load_profile
from sim.results.memory_timeline import highest_peak
from sim.results.metrics import iteration_metrics
from sim.inputs.topology_build import FABRICS, OVERSUBSCRIPTION, FabricSpec, load_topology
from sim.build.training import TrainingRun, simulate_training
from sim.engine.limits import DEFAULT_MAX_EVENTS
from sim.units import POSITIVE_INT, Number, format_bytes, format_time

NAME = "run"
HELP = "Simulate one training iteration (every GPU's compute and communication) and report its metrics."

NODE_OF_GPU = {"a100-80gb": "dgx-a100", "h100-sxm": "dgx-h100", "h200": "dgx-h200"}


def add_arguments(p) -> None:
    p.add_argument("experiment", nargs="?", metavar="FILE", help="an experiment .toml (flags after it override it)")
    add_spec_arguments(p)
    c = p.add_argument_group("cluster")
    c.add_argument("--nodes", type=POSITIVE_INT, help="nodes in the cluster (default: enough for the plan's GPUs)")
    c.add_argument("--topology", help="node or cluster .toml, or a built-in name (default: the GPU's DGX node)")
    c.add_argument("--fabric", choices=FABRICS, default=None, help="inter-node fabric (default rail)")
    c.add_argument("--oversubscription", type=OVERSUBSCRIPTION, default=None, help="fat-tree/leaf uplink oversubscription")
    p.add_argument("--fidelity", choices=("auto", "full", "reduced"), default="auto",
                   help="full: every GPU; reduced: one GPU per pipeline stage, the others as shadows in its "
                        "collectives (default auto: reduced above 256 GPUs)")
    p.add_argument("--max-events", type=Number(float, above=0, allow_inf=True), default=DEFAULT_MAX_EVENTS,
                   metavar="N",
                   help="refuse a plan whose simulation would process more SimPy events than this, estimated "
                        f"before anything is built (default {DEFAULT_MAX_EVENTS:.0e}, about half an hour; inf: "
                        "no limit)")
    p.add_argument("--out", help="directory for summary.json, trace.json, timeline.png and memory.png")
    p.add_argument("--kineto", metavar="DIR",
                   help="directory for PyTorch-profiler-shaped traces, trace_rank{r}.json per simulated GPU "
                        "(for Holistic Trace Analysis)")


def max_events_of(args) -> float | None:
    """The event limit the flags ask for (None: no limit)."""
    limit = getattr(args, "max_events", DEFAULT_MAX_EVENTS)
    return None if limit == float("inf") else limit


def _parse_with_experiment(args):
    """Re-parse with the experiment file's flags first, then the command line's, so the
    command line overrides the file."""
    parser = args._parser
    cli = list(args._argv)
    cli.remove(NAME)
    cli.remove(args.experiment)
    return parser.parse_args(experiment_argv(args.experiment, parser) + cli)


def _cluster(args, world: int, profile_name: str):
    topo_name = args.topology or NODE_OF_GPU.get(profile_name)
    if topo_name is None:
        raise InputError(f"--topology: not given, and GPU profile {profile_name!r} has no built-in node; "
                         f"give --topology NODE.toml (built-in GPUs: {', '.join(NODE_OF_GPU)})")
    fabric = None
    if args.fabric or args.oversubscription:
        fabric = FabricSpec(type=args.fabric or "rail", oversubscription=args.oversubscription or 1.0)
    if args.nodes is not None and args.nodes < 1:
        raise InputError(f"--nodes: got {args.nodes}; expected an integer >= 1")
    topo = load_topology(topo_name, nodes=args.nodes, fabric=fabric, min_gpus=world, flag="--topology")
    if topo.num_gpus < world:
        raise InputError(f"--gpus: got {world}; topology {topo.name} has {topo.num_gpus} GPUs"
                         + (f" (--nodes {args.nodes})" if args.nodes is not None else ""))
    if topo.gpus_per_node != args.gpus_per_node:
        raise InputError(f"--gpus-per-node: got {args.gpus_per_node}; topology {topo.name} has "
                         f"{topo.gpus_per_node} GPUs per node")
    return topo


def _gpus(args) -> int | None:
    """--gpus, or all GPUs of --nodes nodes."""
    if args.gpus is not None:
        return args.gpus
    if args.nodes is not None:
        return args.nodes * args.gpus_per_node
    return None


def summarize(run: TrainingRun) -> dict:
    """The JSON summary of a simulated iteration (deterministic for the same input)."""
    model, plan, profile = run.model, run.plan, run.profile
    seqs = plan.global_batch_size
    met = iteration_metrics(
        run.trace, tokens=seqs * model.seq_length,
        model_flops=seqs * model_flops_per_sequence(model),
        hardware_flops=seqs * model_flops_per_sequence(model, plan.recompute),
        gpus=plan.world_size, peak_flops=profile.peak())
    est = estimate(model, plan, profile, gpus_per_node=run.topology.gpus_per_node)
    pk = highest_peak(run.trace)
    br = pk.breakdown
    d, stage, t = plan.coords(pk.rank)
    return {
        "model": model.name, "params": model.num_params, "gpu": profile.name, "topology": run.topology.name,
        "gpus": plan.world_size, "schedule": run.schedule.name, "plan": asdict(plan), "fidelity": run.fidelity,
        "simulated_gpus": len(run.program.actions),
        **met,
        "memory": {"parameters_bytes": br.get("parameters", 0.0) + br.get("gathered", 0.0),
                   "gradients_bytes": br.get("gradients", 0.0) + br.get("buckets", 0.0),
                   "optimizer_bytes": br.get("optimizer", 0.0), "activations_bytes": br.get("activations", 0.0),
                   "reserve_bytes": br.get("reserve", 0.0), "peak_bytes": pk.total_bytes,
                   "breakdown_at_peak_bytes": br, "rank": pk.rank, "pipeline_stage": stage, "peak_time_s": pk.time_s,
                   "analytic_peak_bytes": est.memory["total"]},
        "memory_capacity_bytes": profile.hbm_capacity_bytes,
        "fits": pk.total_bytes <= profile.hbm_capacity_bytes,
        "estimate_iteration_time_s": est.time["step"],
        "actions": len(run.program), "transfers": len(run.trace.transfers),
    }


def _names(run: TrainingRun) -> dict[int, str]:
    out = {}
    for r in run.program.ranks:
        d, p, t = run.plan.coords(r)
        dev = run.topology.gpu(r)
        local = dev.rsplit("gpu", 1)[-1] if "gpu" in dev else str(r)
        out[r] = f"node {run.topology.node_of(r)} / GPU {local} (stage {p}, tp {t}, dp {d})"
    return out


def _lane(stream: str) -> str:
    return "pp" if stream.startswith("pp") else stream


def write_outputs(run: TrainingRun, summary: dict, out: Path) -> None:
    from sim.results.export import write_chrome, write_json_atomic
    from sim.results.plot import plot_memory, plot_timeline

    plan = run.plan
    if plan.pp > 1:
        ranks = [plan.rank(dp=0, pp=s, tp=0) for s in range(plan.pp)]
        names = {r: f"stage {plan.coords(r)[1]} (rank {r})" for r in ranks}
    else:
        ranks = [plan.rank(dp=d, pp=0, tp=0) for d in range(min(plan.dp, 4))]
        names = {r: f"dp {plan.coords(r)[0]} (rank {r})" for r in ranks}
    write_chrome(run.trace, out / "trace.json", names=_names(run))
    title = (f"{run.model.name}, {plan.world_size} GPUs (dp {plan.dp} x tp {plan.tp} x pp {plan.pp}), "
             f"{run.schedule.name}, m={plan.num_microbatches}: {summary['iteration_time_s'] * 1e3:.1f} ms")
    plot_timeline(run.trace, out / "timeline.png", title=title, ranks=set(ranks), lane_names=names,
                  lane_of_stream=_lane)
    plot_memory(run.trace, out / "memory.png", ranks, names, run.profile.hbm_capacity_bytes,
                title=f"{run.model.name}: memory per GPU over one iteration ({run.schedule.name}, ZeRO-{plan.zero_stage})")
    write_json_atomic(summary, out / "summary.json")


def check_outputs(args) -> None:
    """``--out`` and ``--kineto`` must be folders that can be written: checked before any work."""
    check_output_dir(args.out, "--out")
    check_output_dir(args.kineto, "--kineto")


def _simulate(args):
    model = model_from_args(args)
    profile = load_profile(args.gpu, flag="--gpu")
    args.gpus = _gpus(args)
    plan = plan_from_args(args, model)
    schedule = schedule_from_args(args, plan)
    topo = _cluster(args, plan.world_size, profile.name)
    from sim.progress import Progress

    with Progress() as bar:
        bar.update(f"simulating {plan.world_size} GPUs")
        return simulate_training(model, plan, profile, topo, schedule, args.fidelity,
                                 max_events=max_events_of(args))


def run(args) -> int:
    check_outputs(args)
    if args.experiment:
        exp = read_experiment(args.experiment, args._parser)
        cli = list(args._argv)
        args = _parse_with_experiment(args)
        given = given_dests(cli, args._parser)
        if not exp.has_model and not given & set(TABLES["model"]):
            raise InputError(f"{exp.path}: model: missing; add a [model] table (preset = \"llama2-7b\", "
                             "hf_config = \"config.json\" or num_layers = ...) or pass --model PRESET")
        try:
            run_ = _simulate(args)
        except InputError as exc:
            raise blame(exc, exp.path, exp.settings, skip=given) from None
    else:
        run_ = _simulate(args)
    summary = summarize(run_)
    if args.out:
        write_outputs(run_, summary, Path(args.out))
    if args.kineto:
        from sim.api import write_kineto_files

        write_kineto_files(run_, args.kineto)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return 0
    _print(summary, run_)
    if args.out:
        print(f"\nwrote {Path(args.out) / 'summary.json'}, trace.json, timeline.png, memory.png")
    if args.kineto:
        print(f"wrote {Path(args.kineto)}/trace_rank<r>.json (PyTorch profiler format)")
    return 0


def _print(s: dict, run: TrainingRun) -> None:
    plan = run.plan
    print(f"{run.model.describe()}")
    print(f"{s['gpus']} x {s['gpu']} on {run.topology.describe()}")
    if run.fidelity == "reduced":
        print(f"fidelity: reduced ({s['simulated_gpus']} GPUs simulated, one per pipeline stage; the others are shadows"
              " in its collectives)")
    print(f"plan: dp {plan.dp} x tp {plan.tp} x pp {plan.pp}{f' (vpp {plan.vpp})' if plan.vpp > 1 else ''}, "
          f"schedule {s['schedule']}, micro-batch {plan.micro_batch_size} x {plan.num_microbatches}, "
          f"global batch {plan.global_batch_size}, recompute {plan.recompute}, ZeRO-{plan.zero_stage}, "
          f"sp {'on' if plan.sp else 'off'}")
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
    m = s["memory"]
    verdict = "fits" if s["fits"] else "DOES NOT FIT: this plan cannot run as configured (times are shown anyway)"
    print(f"  peak memory        {format_bytes(m['peak_bytes']):>12} of {format_bytes(s['memory_capacity_bytes'])} "
          f"on rank {m['rank']} (stage {m['pipeline_stage']}) at {format_time(m['peak_time_s'])}: {verdict}")
    for cat, v in m["breakdown_at_peak_bytes"].items():
        if v:
            print(f"    {cat:<16} {format_bytes(v):>12}")
