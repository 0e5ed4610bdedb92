"""What a mixed cluster did: GPU types per pipeline stage, the layer split, each stage's
compute, and MFU against the peaks of the GPUs actually there (``sim.inputs.mixed_gpus``).

The summary's own ``mfu`` divides by GPUs x rank 0's peak; ``mixed.mfu`` divides by the
sum of every GPU's own peak, the figure that compares across clusters."""

from __future__ import annotations

from sim.program.api import stage_profiles, stage_time_s


def mixed_report(run, summary: dict, auto: bool = False) -> dict:
    """The ``mixed`` part of the summary of ``run`` (a ``sim.session.TrainingRun`` on GPUs
    of several types)."""
    mixed, plan, model, trace = run.mixed, run.plan, run.model, run.trace
    split = [sum(plan.layer_range(model, c * plan.pp + s).__len__() for c in range(plan.vpp)) for s in range(plan.pp)]
    compute: dict[int, float] = {}
    for sp in trace.spans:
        if sp.kind == "compute" and sp.stream != "cpu":
            compute[sp.rank] = compute.get(sp.rank, 0.0) + sp.end_s - sp.start_s
    per_stage: list[list[float]] = [[] for _ in range(plan.pp)]
    for r, c in compute.items():
        per_stage[plan.coords(r)[1]].append(c)
    estimated = stage_time_s(split, model, plan, stage_profiles(plan, run.profile, mixed))
    types = mixed.stage_types(plan)
    stages = [{"stage": s, "gpu_types": list(types[s]), "layers": split[s], "compute_s": max(per_stage[s], default=0.0),
               "estimated_micro_batch_s": estimated[s]} for s in range(plan.pp)]
    spanning = {tuple(sorted({mixed.of_rank[r] for r in group})) for group in plan.groups("dp")}
    peaks = sum(mixed.profiles[n].peak() for n in mixed.of_rank)
    T = summary["iteration_time_s"]
    model_flops = summary["mfu"] * T * plan.world_size * run.profile.peak()
    return {
        "gpu_types": mixed.counts(),
        "layer_split": split,
        "layer_split_auto": auto,
        "layer_split_given": plan.layer_split is not None,
        "stages": stages,
        "slowest_stage": max(range(plan.pp), key=lambda s: (stages[s]["compute_s"], -s)),
        "data_parallel_groups_span_types": any(len(t) > 1 for t in spanning),
        "mfu": model_flops / (T * peaks) if T > 0 else 0.0,
    }


def mixed_lines(report: dict) -> list[str]:
    """The report as the text ``trainsim run`` prints."""
    from sim.units import format_time

    counts = ", ".join(f"{n} x {name}" for name, n in report["gpu_types"].items())
    how = ("auto: balanced on the stages' GPUs" if report["layer_split_auto"] else "as given"
           if report["layer_split_given"] else "the plan's split; --layer-split auto balances the stages")
    out = [f"  mixed cluster: {counts}; MFU {report['mfu'] * 100:.1f}% of their own peaks",
           f"    layer split {','.join(map(str, report['layer_split']))} ({how})"]
    for st in report["stages"]:
        mark = "  <- slowest" if st["stage"] == report["slowest_stage"] and len(report["stages"]) > 1 else ""
        out.append(f"    stage {st['stage']} on {'+'.join(st['gpu_types'])}: {st['layers']} layers, compute "
                   f"{format_time(st['compute_s'])}{mark}")
    if report["data_parallel_groups_span_types"]:
        out.append("    data-parallel groups span GPU types: each runs at its slowest member's pace")
    return out
