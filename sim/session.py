"""A run, start to finish: settings -> inputs -> program -> engine -> summary -> files.

This is the layer every front end stands on (``sim.api``, each ``trainsim`` command,
the studies); none of them builds a run any other way:

    RunSettings (sim.inputs.schema)
      -> prepare: a Job: model, plan, hardware profile, topology, schedule   (sim.inputs.resolve)
      -> simulate_training(Job, SimulationSettings): BuildContext -> build (sim.program)
         -> engine.simulate -> Trace
      -> summarize (sim.results.summary)
      -> write_outputs: summary.json, trace.json, timeline.png, memory.png (sim.results)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import partial
from pathlib import Path

from sim.program.actions import Program
from sim.inputs.precision import check_support
from sim.program.schedules import Schedule
from sim.program.stage_balance import auto_layer_split, build_mixed
from sim.program.build import BuildContext
from sim.program.training import build
from sim.engine.core import simulate
from sim.engine.nccl import NcclModel
from sim.engine.tuner import alone_time
from sim.errors import InputError
from sim.gc_tuning import simulation_pause
from sim.inputs.hardware import HardwareProfile
from sim.inputs.model import ModelSpec
from sim.inputs.plan import ParallelPlan
from sim.inputs.cost import priced
from sim.inputs.power import capped
from sim.inputs.rules import check_cluster, check_nccl_algo
from sim.inputs.resolve import model_from_settings, plan_from_settings, profile_from_settings, topology_from_settings
from sim.inputs.schema import AUTO_FULL_FIDELITY_EVENTS, RunSettings, SimulationSettings
from sim.inputs.mixed_gpus import MixedGpus, mixed_gpus
from sim.inputs.stragglers import Stragglers, degrade, per_gpu_fidelity, resolve_stragglers
from sim.inputs.topology import Topology, check_pxn
from sim.results.mixed_report import mixed_report
from sim.results.stragglers import plotted_stragglers, straggler_report
from sim.results.moe_report import moe_report
from sim.results.summary import summarize
from sim.results.trace import Trace

__all__ = ["TrainingRun", "Job", "Prepared", "prepare", "simulate_training", "choose_fidelity", "run", "summarize",
           "write_outputs", "write_kineto_files", "write_chakra_files", "rank_names"]


@dataclass
class TrainingRun:
    """A simulated iteration and everything needed to explain it."""

    model: ModelSpec
    plan: ParallelPlan
    profile: HardwareProfile
    topology: Topology
    schedule: Schedule
    program: Program
    trace: Trace
    fidelity: str = "full"
    fidelity_reason: str = ""
    """Why this fidelity ran (asked for, or what ``auto`` weighed)."""
    collective_model: str = "flows"
    stragglers: Stragglers | None = None
    """Its slow GPUs and degraded links (``topology`` is the degraded one), if any."""
    mixed: MixedGpus | None = None
    """The GPU type of each rank on a mixed cluster (``profile`` is rank 0's), if any."""


@dataclass(frozen=True)
class Job:
    """What is simulated: the model, the plan, the GPU, the cluster and what varies them."""

    model: ModelSpec
    plan: ParallelPlan
    profile: HardwareProfile
    """The GPU's profile (on a mixed cluster, rank 0's; ``mixed`` prices the others)."""
    topology: Topology
    schedule: Schedule | None = None
    """A schedule read from a .csv file (None: the plan's built-in schedule)."""
    stragglers: Stragglers | None = None
    """Slow GPUs and degraded links (``sim.inputs.stragglers``), if any."""
    mixed: MixedGpus | None = None
    """GPU types per rank on a mixed cluster (``sim.inputs.mixed_gpus``; ``profile`` is rank 0's)."""


@dataclass(frozen=True)
class Prepared(Job):
    """Everything a run is built from, checked: what ``prepare`` returns. A ``Job``, with
    the settings it was prepared from (``settings.simulation``: how it is simulated)."""

    settings: RunSettings = field(kw_only=True)

    @property
    def job(self) -> Job:
        """The job alone, without the settings."""
        return Job(*(getattr(self, f.name) for f in fields(Job)))


def schedule_from_settings(plan: ParallelPlan) -> Schedule | None:
    """The ``Schedule`` of ``schedule = "FILE.csv"``, checked against the plan's pipeline
    size, model chunks and micro-batches (None for a built-in schedule)."""
    if not plan.pipeline.from_file:
        return None
    from sim.program.schedule_io import load_schedule_csv

    sched = load_schedule_csv(plan.schedule_file)
    have = (sched.pp, sched.vpp, sched.num_microbatches)
    need = (plan.pp, plan.vpp, plan.num_microbatches)
    if have != need:
        raise InputError(f"{plan.schedule_file}: schedule {sched.name}: has pp={have[0]}, vpp={have[1]}, m={have[2]} "
                         f"(rows, model chunks per row, micro-batches); the plan needs pp={need[0]}, vpp={need[1]}, "
                         f"m={need[2]} (global batch / (micro-batch size x dp))")
    return sched


def prepare(settings: RunSettings, model: ModelSpec | None = None, plan: ParallelPlan | None = None) -> Prepared:
    """Check the settings and build what the run needs; every input error is raised here,
    before anything is simulated. ``model`` and ``plan`` replace what the settings say."""
    model = model if model is not None else model_from_settings(settings.model)
    profile = profile_from_settings(settings.cluster)
    gpus = plan.world_size if plan is not None else settings.cluster.total_gpus()
    # the cluster first: a plan for GPUs the cluster does not have is not worth checking
    topo = topology_from_settings(settings.cluster, gpus, profile.name) if gpus is not None else None
    if plan is None:
        plan = plan_from_settings(settings.plan, settings.cluster.total_gpus(), model)
    elif plan.pipeline.from_file and plan.schedule_file is None:
        raise InputError("plan: a ParallelPlan with schedule 'custom' needs its CSV: "
                         "pass schedule='path/to.csv' instead of a ParallelPlan")
    else:
        plan.check_model(model)
    check_support(plan.precision, profile)
    schedule = schedule_from_settings(plan)
    if topo is None:
        topo = topology_from_settings(settings.cluster, plan.world_size, profile.name)
    check_nccl_algo(settings.simulation.nccl_algo, topo)
    check_pxn(topo, pxn_disable=settings.simulation.nccl_pxn_disable,
              pxn_level=settings.simulation.nccl_p2p_pxn_level)
    topo = topo.with_pxn(settings.simulation.pxn_level)
    check_cluster(plan, settings.cluster.pinned(), topo, f"on {topo.name}")
    mixed = mixed_gpus(topo, plan.world_size, profile)
    if mixed is not None:  # (every type under the cap: --power-limit-w applies to every GPU)
        mixed = replace(mixed, profiles={n: priced(capped(p, settings.cluster.power_limit_w), settings.cluster.prices())
                                         for n, p in mixed.profiles.items()})
        profile = next(iter(mixed.profiles.values()))  # rank 0's: the run's links, NCCL figures and summary
    if plan.layer_split == "auto":
        plan = auto_layer_split(model, plan, profile, mixed)
    return Prepared(model, plan, profile, topo, schedule, resolve_stragglers(settings.simulation, topo, plan.world_size),
                    mixed, settings=settings)


def simulate_training(job: Job, settings: SimulationSettings | None = None, *,
                      coalesce_tp: bool = True) -> TrainingRun:
    """Simulate one iteration of ``job`` and return the run.

    ``settings`` (None: every GPU, ``fidelity="full"``, the rest at their defaults): its
    ``fidelity``, "full", "reduced", or "auto" (``choose_fidelity``); ``collective_model``,
    "flows" or "steps" (reduced fidelity always runs flows); ``nccl_algo`` and
    ``nccl_protocol``, what every collective runs, as NCCL_ALGO and NCCL_PROTO ("auto":
    NCCL's tuner, ``sim.engine.tuner``, per collective); plans over ``max_events`` are
    refused up front (``sim.program.limits``). The job's ``stragglers`` (slow GPUs and
    degraded links, ``sim.inputs.stragglers``) need every GPU simulated, and so does a
    mixed cluster (``mixed``: each rank's GPU type, each priced on its own profile,
    ``sim.program.stage_balance``). ``coalesce_tp``: price chains of isolated tensor-parallel
    collectives in closed form (``sim.program.coalesce``)."""
    if settings is None:
        settings = SimulationSettings(fidelity="full")
    model, plan, profile, topology, stragglers = job.model, job.plan, job.profile, job.topology, job.stragglers
    fidelity, collective_model = settings.fidelity, settings.collective_model
    reason = f"asked for ({fidelity})"
    if stragglers:
        fidelity, reason = per_gpu_fidelity(fidelity)
        topology = degrade(topology, stragglers.links)
    if job.mixed is not None:
        fidelity, reason = per_gpu_fidelity(fidelity, "GPUs of several types")
    check_nccl_algo(settings.nccl_algo, topology)
    topology = topology.with_pxn(settings.pxn_level)  # (NCCL_PXN_DISABLE, NCCL_P2P_PXN_LEVEL: the sends' routes)
    nccl = NcclModel.from_profile(profile).forcing(settings.nccl_algo, settings.nccl_protocol)
    eff = profile.link_efficiencies()
    alone = partial(alone_time, topology=topology, efficiency=eff, model=nccl)  # (coalesced TP collectives)
    if plan.world_size > topology.num_gpus:
        raise InputError(
            f"plan: needs dp x {'cp x ' if plan.cp > 1 else ''}tp x pp = {plan.dp} x "
            f"{f'{plan.cp} x ' if plan.cp > 1 else ''}{plan.tp} x {plan.pp} = {plan.world_size} GPUs; "
            f"topology {topology.name} has {topology.num_gpus}"
        )
    if fidelity == "auto":
        fidelity, reason = choose_fidelity(model, plan, topology, collective_model)
    flows = collective_model == "flows" or fidelity == "reduced"
    with simulation_pause():  # (where the process opted in: sim.gc_tuning)
        ctx = BuildContext.create(model, plan, profile, topology, schedule=job.schedule, fidelity=fidelity,
                                  gpus_per_node=topology.gpus_per_node, coalesce_tp=coalesce_tp,
                                  max_events=settings.event_limit, collective_model=collective_model, nccl=alone)
        schedule, prog = build(ctx) if job.mixed is None else build_mixed(
            lambda p: build(ctx.on(p)), job.mixed.profiles, job.mixed.of_rank)
        # (inside the same pause: the engine's own finds the collector off and leaves the
        # program it was given alone, instead of walking it once more)
        trace = simulate(prog, topology, link_efficiency=eff, fluid_collectives=flows,
                         overlap_slowdown=profile.overlap_compute_slowdown, nccl=nccl,
                         gpu_slowdown=stragglers.slow if stragglers else None)
    return TrainingRun(model, plan, profile, topology, schedule, prog, trace, fidelity, reason,
                       "flows" if flows else "steps", stragglers or None, job.mixed)


def choose_fidelity(model: ModelSpec, plan: ParallelPlan, topology: Topology,
                    collective_model: str = "flows") -> tuple[str, str]:
    """What ``fidelity = "auto"`` runs, and why: every GPU when the estimated events of a
    full-fidelity run fit in ``AUTO_FULL_FIDELITY_EVENTS``, else one GPU per stage."""
    from sim.program.limits import estimate_events

    events = estimate_events(model, plan, "full", topology, collective_model=collective_model)["events"]
    if events <= AUTO_FULL_FIDELITY_EVENTS:
        return "full", f"auto: about {events:.2g} events at full fidelity, within {AUTO_FULL_FIDELITY_EVENTS:.2g}"
    return "reduced", f"auto: about {events:.2g} events at full fidelity, over {AUTO_FULL_FIDELITY_EVENTS:.2g}"


def run(prepared: Prepared) -> tuple[TrainingRun, dict]:
    """Simulate what ``prepare`` built; returns the run and its JSON summary."""
    job, sim_settings = prepared.job, prepared.settings.simulation
    training_run = simulate_training(job, sim_settings)
    summary = summarize(training_run)
    # (the comparisons below run at the fidelity the run ran)
    ran = replace(sim_settings, fidelity=training_run.fidelity)
    if training_run.mixed is not None:
        summary["mixed"] = mixed_report(training_run, summary, auto=prepared.settings.plan.get("layer_split") == "auto")
    if training_run.stragglers:  # the same iteration without them: what they cost
        summary["stragglers"] = straggler_report(training_run, simulate_training(replace(job, stragglers=None), ran))
    if prepared.model.moe:  # routing's imbalance, against the same plan routed evenly when it was not
        plan = prepared.plan
        balanced = None
        if plan.moe_routing not in ("balanced", "round-robin") or plan.moe_capacity_factor is not None:
            # (round-robin's loads are balanced: what it changes is where a token's experts sit, not imbalance)
            even = replace(plan, moe_routing="balanced", moe_capacity_factor=None)
            balanced = simulate_training(replace(job, plan=even, stragglers=None, mixed=None), ran).trace.end_s
        summary["moe"] = moe_report(training_run, summary, balanced)
    return training_run, summary


def rank_names(run: TrainingRun) -> dict[int, str]:
    """Each simulated rank's place, for trace viewers: node, GPU, stage, tp and dp index."""
    out = {}
    for r in run.program.ranks:
        d, p, t = run.plan.coords(r)
        dev = run.topology.gpu(r)
        local = dev.rsplit("gpu", 1)[-1] if "gpu" in dev else str(r)
        slow = run.stragglers.slow.get(r) if run.stragglers else None
        out[r] = f"node {run.topology.node_of(r)} / GPU {local} (stage {p}, tp {t}, {_dp_cp(run.plan, d)}" + \
            (f", {run.mixed.of_rank[r]}" if run.mixed else "") + (f", slow x{slow:.3g})" if slow else ")")
    return out


def _lane(span) -> str:
    """The timeline lane of a span: every pipeline stream in one ``pp`` lane, and
    context-parallel traffic (ring attention's exchanges) in a ``cp-comm`` lane of its own,
    whichever stream it ran on."""
    if span.category == "cp":
        return "cp-comm"
    return "pp" if span.stream.startswith("pp") else span.stream


def _dp_cp(plan, index: int) -> str:
    """``dp 1`` or, under context parallelism (the index runs over dp·cp, cp innermost),
    ``dp 0 · cp 3``."""
    return f"dp {index}" if plan.cp == 1 else f"dp {index // plan.cp} · cp {index % plan.cp}"


def write_outputs(run: TrainingRun, summary: dict, out: Path) -> None:
    """summary.json, trace.json (Perfetto), timeline.png and memory.png in ``out``."""
    from sim.results.export import write_chrome, write_json_atomic
    from sim.results.plot import TimelineView, plot_memory, plot_timeline

    plan = run.plan
    if plan.pp > 1:
        ranks = [plan.rank(dp=0, pp=s, tp=0) for s in range(plan.pp)]
        names = {r: f"stage {plan.coords(r)[1]} (rank {r})" for r in ranks}
    else:
        ranks = [plan.rank(dp=d, pp=0, tp=0) for d in range(min(plan.dp_cp, 4))]
        names = {r: f"{_dp_cp(plan, plan.coords(r)[0])} (rank {r})" for r in ranks}
    ranks, names = plotted_stragglers(run, summary, ranks, names)
    write_chrome(run.trace, out / "trace.json", names=rank_names(run))
    extra = (f" x cp {plan.cp}" if plan.cp > 1 else "") + (f", ep {plan.ep}" if plan.ep > 1 else "")
    title = (f"{run.model.name}, {plan.world_size} GPUs (dp {plan.dp} x tp {plan.tp} x pp {plan.pp}{extra}), "
             f"{run.schedule.name}, m={plan.num_microbatches}: {summary['iteration_time_s'] * 1e3:.1f} ms")
    plot_timeline(run.trace, out / "timeline.png", TimelineView(title=title, ranks=frozenset(ranks), lane_names=names,
                                                                lane_of_span=_lane))
    plot_memory(run.trace, out / "memory.png", ranks, names, run.profile.hbm_capacity_bytes,
                title=f"{run.model.name}: memory per GPU over one iteration ({run.schedule.name}, ZeRO-{plan.zero_stage})")
    write_json_atomic(summary, out / "summary.json")


def write_kineto_files(training_run: TrainingRun, out: str | Path) -> list[Path]:
    """The Kineto-shaped traces of a run, one ``trace_rank{r}.json`` per simulated GPU."""
    from sim.results.export_kineto import (KinetoRun, collective_claims, collective_groups, cross_stream_waits,
                                           write_kineto)

    program = training_run.program
    return write_kineto(training_run.trace, out, KinetoRun(
        world_size=training_run.plan.world_size, device_name=training_run.profile.name,
        memory_bytes=training_run.profile.hbm_capacity_bytes, groups=collective_groups(program),
        names=rank_names(training_run), waits=cross_stream_waits(program), claims=collective_claims(program)))


def write_chakra_files(training_run: TrainingRun, out: str | Path):
    """The run's program as Chakra execution traces, ``trainsim.{r}.et`` per rank and
    ``comm_group.json`` (``sim.results.export_chakra``)."""
    from sim.results.export_chakra import write_chakra

    return write_chakra(training_run.program, out, world_size=training_run.plan.world_size,
                        device_name=training_run.profile.name, iteration_time_s=training_run.trace.end_s,
                        trace=training_run.trace)
