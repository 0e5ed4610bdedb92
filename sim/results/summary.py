"""The JSON summary of a simulated iteration: the figures ``trainsim run --json`` prints.

Throughput and MFU (``sim.results.metrics``), the time on the critical rank split into
compute, exposed communication and idle, the energy of the iteration and its
average power (``sim.results.energy``), its cost at the GPU-hour price given
(``sim.inputs.cost``; null without one), the highest memory peak with its breakdown
(``sim.results.memory_timeline``), and the analytic estimate beside the simulated
figures (``sim.program.estimate``). Deterministic for the same run.
"""

from __future__ import annotations



from sim.inputs.cost import run_cost
from sim.program.api import estimate, model_flops_per_sequence, plan_flops_per_sequence
from sim.inputs.precision import label
from sim.results.energy import run_energy
from sim.results.memory_timeline import highest_peak
from sim.results.metrics import iteration_metrics


ENERGY_KEYS = ("energy_per_iteration_j", "energy_per_token_j", "average_power_w", "average_power_per_gpu_w",
               "energy_by_state_j")
"""The energy figures (``sim.results.energy``): null when the GPU's profile has no power figures."""


def summarize(run) -> dict:
    """The summary of a ``sim.session.TrainingRun`` (deterministic for the same input)."""
    model, plan, profile = run.model, run.plan, run.profile
    seqs = plan.global_batch_size
    met = iteration_metrics(
        run.trace, tokens=seqs * model.seq_length,
        model_flops=seqs * model_flops_per_sequence(model),
        hardware_flops=seqs * plan_flops_per_sequence(model, plan),
        gpus=plan.world_size, peak_flops=profile.peak())
    energy = run_energy(run, seqs * model.seq_length) or dict.fromkeys(ENERGY_KEYS)
    gpus = ([(run.mixed.profiles[n], k) for n, k in run.mixed.counts().items()] if run.mixed is not None
            else [(profile, plan.world_size)])
    cost = run_cost(gpus, met["iteration_time_s"], seqs * model.seq_length)
    est = estimate(model, plan, profile, gpus_per_node=run.topology.gpus_per_node)
    pk = highest_peak(run.trace)
    br = pk.breakdown
    d, stage, t = plan.coords(pk.rank)
    return {
        "model": model.name, "params": model.num_params, "active_params": model.active_params, "gpu": profile.name, "topology": run.topology.name,
        "gpus": plan.world_size, "schedule": run.schedule.name, "plan": plan.summary(), "fidelity": run.fidelity,
        "precision": label(plan.precision),
        "fidelity_reason": run.fidelity_reason, "collective_model": run.collective_model,
        "simulated_gpus": len(run.program.actions),
        **met,
        **energy,
        **cost, "gpu_hours_per_iteration": met["iteration_time_s"] / 3600.0 * plan.world_size,
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


def screening_summary(run) -> dict:
    """What a search reads of a screening run (``sim.studies.search.extrapolate``): the
    iteration time and whether the highest memory peak fits, with that peak. The same
    values ``summarize`` gives (``iteration_time_s`` is the trace's end, ``fits`` its peak
    against the GPU's memory), without the breakdowns, energy, cost and estimate that only a
    full summary shows: a screening run's own figures are never printed (its plan's time
    is extrapolated from two of them)."""
    pk = highest_peak(run.trace)
    capacity = run.profile.hbm_capacity_bytes
    return {"iteration_time_s": run.trace.end_s, "fits": pk.total_bytes <= capacity,
            "memory": {"peak_bytes": pk.total_bytes}, "memory_capacity_bytes": capacity, "fidelity": run.fidelity,
            "screening": True}
