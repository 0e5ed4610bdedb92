"""Where the time goes, kernel by kernel: the report behind ``trainsim explain``.

For one micro-batch on one GPU (one tensor-parallel rank) of a plan, it lists every
kernel the simulator charges for one transformer layer, the embedding (first pipeline
stage) and the output head with the loss (last stage), phase by phase (F forward, B
input gradient, W weight gradient, the recomputed forward marked ``R``), each with its
shape, FLOPs, bytes moved, the time ``sim.program.costs.op_time`` gives it, what bounds
it (compute or memory), the rate it runs at and the efficiency the profile grants it;
and every tensor-parallel collective with its buffer, link and time. Then the same
totals per phase and per micro-batch, and the per-iteration terms of the first-order
estimate (``sim.program.estimate``): micro-batches, bubble, pipeline and gradient
traffic, the optimizer step.

The kernels are those of ``sim.program.workload``, which follows Megatron-LM's layer
(fused bias-GeLU / SwiGLU, fused bias-dropout-add, flash attention, column- and
row-parallel GEMMs); the times are exactly what the simulator uses, so a user can hold
each line against a profiler trace of their own model.
"""

from __future__ import annotations

from sim.inputs.hardware import HardwareProfile
from sim.inputs.model import ModelSpec
from sim.inputs.pacing import slowest_speed
from sim.inputs.plan import ParallelPlan
from sim.program.api import (
    bias_pass_time, collective_time, fixed_time, fsdp_copy_rows, gemm_compute_time, Comm, default_layout, dispatch_groups, estimate_of, gemm_kernel,
    group_comm_time, group_sizes, HOST_LAUNCH_S, in_moe_block, issue_bound, local_sequence, mma_flops_per_score, moe_shape, Op, op_time,
    plan_edge_works, plan_layer_work, Work,
)
from sim.inputs.experts import Folding
from sim.units import format_bytes, format_time

PARTS = ("layer", "moe layer", "embedding", "head")
"""The parts a report may have ("moe layer" for a mixture of experts), in the order shown."""


def _op_row(op: Op, profile: HardwareProfile, dtype: str = "bf16") -> dict:
    t = op_time(op, profile, dtype)
    kernel = dtype
    if op.dtype != "bf16":  # (an FP8 or FP4 GEMM: sim.program.fp8)
        dtype, kernel = gemm_kernel(op.dtype, profile)
    moved = op.bytes_read + op.bytes_written
    if op.kind == "gemm" and op.streams and op.batch > 1:  # one kernel per GEMM on a few streams
        grouped_s, _ = gemm_compute_time(op, profile, dtype, kernel)
        eff = op.flops / (profile.peak(dtype) * grouped_s)
    elif op.kind == "gemm":
        eff = profile.gemm_efficiency(*op.shape, op.batch, kernel)
    elif op.kind == "attention":
        eff = profile.attention_efficiency(*op.shape, op.batch, backward=op.phase == "B" and not op.recompute,
                                           mma_flops_per_score=mma_flops_per_score(op))
    else:
        eff = profile.memory_rate(op.framework, in_moe_block(op)) / profile.hbm_bandwidth_Bps
    busy = t - fixed_time(op, profile) - bias_pass_time(op, profile)  # (a CPU's bias pass: not the bound)
    compute_s = op.flops / (profile.peak(dtype) * eff) if op.kind in ("gemm", "attention") and op.flops else 0.0
    bound = "compute" if op.kind in ("gemm", "attention") and compute_s >= busy - 1e-15 else "memory"
    return {
        "phase": "R" if op.recompute else op.phase,
        "name": op.name,
        "kind": op.kind,
        "shape": list(op.shape),
        "batch": op.batch,
        "flops": op.flops,
        "bytes": moved,
        "time_s": t,
        "bound": bound,
        "flops_per_s": op.flops / t if t > 0 else 0.0,
        "bytes_per_s": moved / t if t > 0 else 0.0,
        "efficiency": eff,
    }


def _comm_row(c: Comm, plan: ParallelPlan, link: str, profile: HardwareProfile, links: dict | None = None,
              sizes: dict | None = None) -> dict:
    if c.group == "tp":
        t = collective_time(c.collective, c.nbytes, plan.tp, link, profile) if plan.tp > 1 else 0.0
        n = plan.tp
    else:  # expert- or context-parallel: the bytes leaving a rank over its group's link (estimate's pricing)
        n = {"ep": plan.ep, "etp": plan.etp_size, "cp": plan.cp, **(sizes or {})}[c.group]
        link = (links or {}).get(c.group, "nvlink")
        t = group_comm_time(c, n, link, profile) if n > 1 else 0.0
    return {"phase": "R" if c.recompute else c.phase, "name": c.name,
            "kind": f"{'cp' if c.group == 'cp' else 'tp' if c.group == 'tp' else 'ep'} comm", "collective": c.collective, "bytes": c.nbytes, "ranks": n, "link": link, "time_s": t,
            "group": c.group, "beside_compute": c.side}


def _part(work: Work, plan: ParallelPlan, link: str, profile: HardwareProfile, links: dict | None = None,
          sizes: dict | None = None) -> dict:
    rows = [_op_row(i, profile) if isinstance(i, Op) else _comm_row(i, plan, link, profile, links, sizes)
            for i in work.items]
    phases: dict[str, dict] = {}
    for r in rows:
        p = phases.setdefault(r["phase"], {"compute_s": 0.0, "tp_comm_s": 0.0, "kernels": 0})
        if r["kind"].endswith(" comm"):
            p["tp_comm_s"] += r["time_s"]
        else:
            p["compute_s"] += r["time_s"]
            p["kernels"] += 1
    total = sum(p["compute_s"] + p["tp_comm_s"] for p in phases.values())
    return {"rows": rows, "phases": phases, "total_s": total, "launch": _launch(work, rows)}


def _launch(work: Work, rows: list) -> dict | None:
    """The host's launches after the forward's synchronisation (``sim.program.launch``): the
    kernels from it to the block's end, their GPU seconds, the host's seconds to launch them
    and ``issue_bound`` over the compute (the exchanges between left out); None without one."""
    start = next((k for k, it in enumerate(work.items) if it.phase == "F" and not it.recompute and it.host_sync),
                 None)
    if start is None:
        return None
    kernels, gpu = 0, []
    for it, r in zip(work.items[start:], rows[start:]):
        if it.phase != "F" or not it.name.startswith("moe."):
            break
        if isinstance(it, Op):
            kernels += it.kernels
            gpu += [r["time_s"] / it.kernels] * it.kernels
        else:
            kernels += 1
    return {"after": work.items[start].name, "kernels": kernels, "host_s": kernels * HOST_LAUNCH_S,
            "gpu_s": sum(gpu), "issue_bound_s": issue_bound(gpu, HOST_LAUNCH_S)}


def explain(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, gpus_per_node: int = 8) -> dict:
    """The report as a dict (the JSON ``trainsim explain --json`` prints)."""
    pace = {"gpus": plan.world_size, "gpu_speed_spread": profile.gpu_speed_spread,
            "slowest_speed": slowest_speed(profile.gpu_speed_spread, plan.world_size)}
    ctx, est = estimate_of(model, plan, profile, gpus_per_node=gpus_per_node)
    profile = ctx.profile  # (paced: as the estimate prices the kernels)
    link = est.links["tp"]
    b, t = plan.micro_batch_size, plan.tp
    local = local_sequence(model, plan.cp)
    embedding, head = plan_edge_works(model, plan)
    works = {"layer": plan_layer_work(model, plan, profile=profile)} if model.layers is None else {}
    works.update(embedding=embedding, head=head)
    counts: dict = {}
    groups = {"cp": plan.cp_group(0)}
    sizes = {}
    moe = None
    if model.moe:  # an MoE layer under balanced routing, moved by the plan's dispatcher
        tokens = b * local.seq_length // (t if plan.sp else 1)
        layout = default_layout(plan, gpus_per_node)
        lid = next(i for i in range(model.num_layers) if model.is_moe_layer(i))
        moe = moe_shape(model, plan, lid, tokens * model.moe_router_topk, layout)
        if model.layers is None:
            works["moe layer"] = plan_layer_work(model, plan, moe, profile=profile)
        fold = Folding(plan)
        groups.update(ep=fold.ep_group(0), etp=fold.etp_group(0))
        sizes = group_sizes(plan, layout)
        groups.update({g: dispatch_groups(fold, 0, lambda r: r // gpus_per_node)[g] for g in sizes if sizes[g] > 1})
    if model.layers is not None:  # a layer pattern (sim.inputs.layers): one part per distinct layer, in stack order
        for k, lay in enumerate(model.layer_kinds):
            works[f"layer {k + 1}"] = plan_layer_work(model, plan, moe if lay.is_moe else None, lay, profile=profile)
            counts[f"layer {k + 1}"] = (lay.describe(), model.layers.count(lay), lay.is_moe)
    links = {k: "nvlink" if len({r // gpus_per_node for r in g}) == 1 else "ib" for k, g in groups.items()}
    parts = {name: _part(w, plan, link, profile, links, sizes) for name, w in works.items()}
    for name, (kind, count, is_moe) in counts.items():
        parts[name].update(layer_kind=kind, count=count, moe=is_moe)
    layers = plan.stage_layers(model)
    per_stage = [sum(layers[c * plan.pp + r] for c in range(plan.vpp)) for r in range(plan.pp)]
    return {
        "model": model.name,
        "gpu": profile.name,
        "plan": {"dp": plan.dp, "tp": plan.tp, "pp": plan.pp, "vpp": plan.vpp, "sequence_parallel": plan.sp,
                 "micro_batch_size": plan.micro_batch_size, "num_microbatches": plan.num_microbatches,
                 "recompute": plan.recompute_label, "zero_stage": plan.zero_stage},
        "tp_link": link,
        "kernel_launch_s": profile.kernel_launch_s,
        "gemm_fixed_s": profile.gemm_fixed_s,
        "pace": pace,
        "parts": parts,
        "layers_per_stage": per_stage,
        "estimate": dict(est.time),
        **({"fsdp_copies": fsdp} if (fsdp := fsdp_copy_rows(ctx)) else {}),
    }


def _cell_shape(r: dict) -> str:
    if r["kind"].endswith(" comm"):
        return f"{r['collective']} {format_bytes(r['bytes'])} over {r['ranks']} ({r['link']})"
    if not r["shape"]:
        return ""
    dims = "x".join(str(int(x)) for x in r["shape"])
    return dims + (f" (x{r['batch']})" if r["batch"] > 1 else "")


def render(report: dict) -> str:
    """The report as text, one table per part."""
    p = report["plan"]
    out = [f"{report['model']} on {report['gpu']}: tp {p['tp']} ({report['tp_link']}), "
           f"sequence parallel {'on' if p['sequence_parallel'] else 'off'}, micro-batch {p['micro_batch_size']}, "
           f"recompute {p['recompute']}",
           "Times are what the simulator charges one GPU for one micro-batch "
           f"(each kernel includes the profile's {format_time(report['kernel_launch_s'])} launch cost"
           + (f"; a GEMM, {format_time(report['gemm_fixed_s'])} instead"
              if report.get("gemm_fixed_s", report["kernel_launch_s"]) != report["kernel_launch_s"] else "")
           + "). "
           "Phases: F forward, R recomputed forward, B input gradient, W weight gradient.",
           ""]
    pace = report["pace"]
    if pace["slowest_speed"] < 1:
        out[-1:-1] = [f"GEMMs and attention run at {pace['slowest_speed']:.3f} of the mean GPU's speed: the expected "
                      f"slowest of {pace['gpus']:,} GPUs (gpu_speed_spread {pace['gpu_speed_spread']:.1%})."]
    what = {"layer": "one transformer layer", "embedding": "embedding (first pipeline stage)",
            "head": "output head and loss (last pipeline stage)",
            "moe layer": "one mixture-of-experts layer (balanced routing)"}
    if "moe layer" in report["parts"]:
        what["layer"] = "one dense transformer layer"
    kinds = [n for n, part in report["parts"].items() if "layer_kind" in part]  # a layer pattern's layers
    for name in [n for n in ("layer", "moe layer") if n in report["parts"]] + kinds + ["embedding", "head"]:
        part = report["parts"][name]
        if name in kinds:
            out.append(f"{name} of {len(kinds)}: {part['layer_kind']} ({part['count']} of the "
                       f"{sum(report['parts'][n]['count'] for n in kinds)} layers"
                       f"{', balanced routing' if part['moe'] else ''})")
        else:
            out.append(f"{what[name]}")
        nw = max([26] + [len(r["name"]) + 1 for r in part["rows"]])  # columns as wide as their longest cell
        sw = max([38] + [len(_cell_shape(r)) + 1 for r in part["rows"]])
        out.append(f"  {'ph':<3}{'kernel':<{nw}}{'kind':<10}{'shape':<{sw}}{'GFLOP':>9}{'moved':>12}"
                   f"{'time':>11}  {'bound':<8}{'rate':>12}{'eff':>6}")
        for r in part["rows"]:
            if r["kind"].endswith(" comm"):
                rate, eff, flops, bound = "", "", "", "link"
            else:
                flops = f"{r['flops'] / 1e9:.1f}" if r["flops"] else "-"
                rate = (f"{r['flops_per_s'] / 1e12:.0f} TFLOP/s" if r["bound"] == "compute"
                        else f"{r['bytes_per_s'] / 1e9:.0f} GB/s")
                eff, bound = f"{r['efficiency']:.0%}", r["bound"]
            out.append(f"  {r['phase']:<3}{r['name']:<{nw}}{r['kind']:<10}{_cell_shape(r):<{sw}}{flops:>9}"
                       f"{format_bytes(r['bytes']):>12}{format_time(r['time_s']):>11}  {bound:<8}{rate:>12}{eff:>6}"
                       .rstrip())
        sums = ", ".join(f"{ph} {format_time(v['compute_s'])} compute + {format_time(v['tp_comm_s'])} comm"
                         for ph, v in part["phases"].items())
        out.append(f"  total {format_time(part['total_s'])}: {sums}")
        la = part.get("launch")
        if la:
            out.append(f"  host: from {la['after']} (the host waits for the GPU) to the block's end it launches "
                       f"{la['kernels']} kernels in {format_time(la['host_s'])} ({format_time(HOST_LAUNCH_S)} each) "
                       f"against {format_time(la['gpu_s'])} of GPU compute; launched one by one onto an idle GPU "
                       f"they would end after {format_time(la['issue_bound_s'])} (the exchanges between let the host "
                       f"catch up: the simulator times it; --cuda-graph moe removes the wait)")
        out.append("")
    fsdp = report.get("fsdp_copies")
    if fsdp:  # PyTorch FSDP's own copies (sim.program.fsdp)
        out.append(f"{fsdp['framework']}'s {fsdp['fsdp'].upper()} copies around one layer's gather and reduce-scatter "
                   f"({fsdp['layer_elements'] / 1e6:.1f}M elements over {fsdp['ranks']} ranks, gradients reduced in "
                   f"{'fp32' if fsdp['reduce_fp32'] else 'bf16'}); each is a memory-bound kernel, per occurrence:")
        out.append(f"  {'when':<13}{'stream':<9}{'copy':<58}{'moved':>12}{'time':>11}")
        for r in fsdp["rows"]:
            out.append(f"  {r['when']:<13}{r['stream']:<9}{r['copy']:<58}{format_bytes(r['bytes']):>12}"
                       f"{format_time(r['time_s']):>11}")
        out.append("  (gather: each all-gather of the layer, forward and backward; reduce: each reduce-scatter, every "
                   "micro-batch; accumulate: from the second micro-batch on)")
        out.append("")
    e = report["estimate"]
    out.append(f"per iteration (first-order estimate, no overlap; layers per stage "
               f"{' '.join(map(str, report['layers_per_stage']))}, {p['num_microbatches']} micro-batches):")
    for key, value in e.items():
        if key == "amax" and not value:   # FP8's amax all-reduces: none in BF16
            continue
        out.append(f"  {key:<28}{format_time(value):>12}")
    return "\n".join(out)
