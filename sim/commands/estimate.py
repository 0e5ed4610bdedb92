"""``trainsim estimate``: per-GPU memory and first-order step time of a plan, no simulation.

The model comes from a preset (``--model``), a Hugging Face config.json
(``--hf-config``) or Megatron-LM's shape flags; the plan from Megatron-LM's parallelism
flags (``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
``--decoder-first-pipeline-num-layers``, ``--account-for-embedding-in-pipeline-split``, ...)
plus ``--schedule`` and ``--placement``, with data parallelism filling ``--gpus``. Prints a table, or one JSON object with ``--json``.
With a price per GPU-hour (``--gpu-hour-price``, or the profile's), the cost of the
estimated iteration and of a million tokens, as ``trainsim run`` gives them
(``sim.inputs.cost``).
"""

from __future__ import annotations

import json

from sim.program.estimate import estimate
from sim.commands.run import exit_status
from sim.commands.settings import ESTIMATE_FLAGS, analytic_inputs
from sim.inputs.cost import cost_text, run_cost
from sim.inputs.flags import add_arguments as add_schema_arguments
from sim.units import format_bytes, format_microbatches, format_time

NAME = "estimate"
HELP = "Analytic per-GPU memory and first-order step time of a training plan (no simulation)."


def add_arguments(p) -> None:
    add_schema_arguments(p, [f for f in ESTIMATE_FLAGS if f != "json"] + ["gpu_hour_price", "json"])


def run(args) -> int:
    settings, model, plan, profile = analytic_inputs(args)
    est = estimate(model, plan, profile, gpus_per_node=settings.cluster.node_gpus())
    step = est.time["step"]
    cost = {**run_cost([(profile, plan.world_size)], step, plan.global_batch_size * model.seq_length),
            "gpu_hours_per_iteration": step / 3600.0 * plan.world_size}
    if args.json:
        print(json.dumps({"model": model.name, "params": model.num_params, "active_params": model.active_params,
                          **est.to_dict(), **cost}, indent=2))
        return exit_status(est.fits)
    pl = plan
    print(model.describe())
    print(f"gpu: {profile.name} ({profile.peak() / 1e12:.0f} TFLOP/s bf16, "
          f"{format_bytes(profile.hbm_capacity_bytes)} HBM)")
    # the parallel sizes as ``trainsim run`` writes them: cp beside dp, ep x etp for a mixture of experts
    print(f"plan: {pl.world_size} GPUs = dp {pl.dp}{f' x cp {pl.cp} ({pl.cp_comm_type})' if pl.cp > 1 else ''} "
          f"x tp {pl.tp} x pp {pl.pp}"
          f"{f' (vpp {pl.vpp})' if pl.vpp > 1 else ''}{f', ep {pl.ep} x etp {pl.etp_size}' if model.moe else ''}, "
          f"schedule {pl.schedule}, placement {pl.placement}, "
          f"sp {'on' if pl.sp else 'off'}, "
          f"global batch {pl.global_batch_size}: "
          f"{format_microbatches(pl.num_microbatches, pl.micro_batch_size, model.seq_length)} per replica, "
          f"recompute {pl.recompute_label}, ZeRO-{pl.zero_stage}")
    if pl.pp > 1:
        layers = pl.stage_layers(model)
        per_stage = [sum(layers[c * pl.pp + r] for c in range(pl.vpp)) for r in range(pl.pp)]
        print(f"layers per pipeline stage: {' '.join(map(str, per_stage))}")
    print()
    print(f"memory per GPU (worst: pipeline stage {est.worst_stage})")
    for key in ("weights", "gradients", "optimizer", "activations", "temporaries"):
        print(f"  {key:<16}{format_bytes(est.memory[key]):>14}")
    verdict = "fits" if est.fits else "DOES NOT FIT"
    print(f"  {'total':<16}{format_bytes(est.memory['total']):>14}   of "
          f"{format_bytes(est.memory_capacity_bytes)}: {verdict}")
    print()
    print(f"step time (first order, no overlap; links tp={est.links['tp']} dp={est.links['dp']} "
          f"pp={est.links['pp']})")
    for key in ("compute", "tp_comm", "amax", "pipeline_bubble", "pp_comm", "dp_comm", "optimizer"):
        if key == "amax" and not est.time[key]:
            continue
        share = est.time[key] / est.time["step"] * 100
        print(f"  {key:<16}{format_time(est.time[key]):>14}  {share:5.1f}%")
    print(f"  {'step':<16}{format_time(est.time['step']):>14}")
    print()
    print(f"tokens/s {est.tokens_per_s:,.0f}   model TFLOP/s per GPU {est.model_tflops_per_gpu:.1f}   "
          f"hardware TFLOP/s per GPU {est.hardware_tflops_per_gpu:.1f}   MFU {est.mfu * 100:.1f}%")
    if cost_text(cost):
        print(f"cost {cost_text(cost)}")
    return exit_status(est.fits)
