"""``trainsim estimate``: per-GPU memory and first-order step time of a plan, no simulation.

The model comes from a preset (``--model``), a Hugging Face config.json
(``--hf-config``) or Megatron-LM's shape flags; the plan from Megatron-LM's parallelism
flags (``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``, ...), with
data parallelism filling ``--gpus``. Prints a table, or one JSON object with ``--json``.
"""

from __future__ import annotations

import argparse
import json

from sim.errors import InputError, require
from sim.estimate import estimate
from sim.hardware import PRESETS as GPU_PRESETS
from sim.hardware import load_profile
from sim.model import (
    PRESETS,
    add_megatron_model_arguments,
    model_from_hf_config,
    model_from_megatron_namespace,
    preset,
    with_seq_length,
)
from sim.plan import ParallelPlan
from sim.units import format_bytes, format_time

NAME = "estimate"
HELP = "Analytic per-GPU memory and first-order step time of a training plan (no simulation)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("model (one of)")
    src.add_argument("--model", metavar="PRESET", help=f"one of: {', '.join(PRESETS)}")
    src.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json")
    add_megatron_model_arguments(p)
    hw = p.add_argument_group("hardware")
    hw.add_argument("--gpu", default="a100-80gb",
                    help=f"{', '.join(GPU_PRESETS)} or a profile .json (default a100-80gb)")
    hw.add_argument("--gpus", type=int, help="total GPUs; data parallelism fills them (default tp x pp)")
    hw.add_argument("--gpus-per-node", type=int, default=8)
    par = p.add_argument_group("parallelism and batch (Megatron-LM flags)")
    par.add_argument("--tensor-model-parallel-size", type=int, default=1)
    par.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    par.add_argument("--num-layers-per-virtual-pipeline-stage", type=int)
    par.add_argument("--sequence-parallel", action="store_true")
    par.add_argument("--micro-batch-size", type=int, default=1)
    par.add_argument("--global-batch-size", type=int, help="default micro-batch size x data-parallel size")
    par.add_argument("--recompute-granularity", choices=["none", "selective", "full"], default="none")
    par.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=0, help="ZeRO stage (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _model(args):
    megatron = any(getattr(args, k) is not None for k in
                   ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size"))
    chosen = [n for n, on in (("--model", args.model), ("--hf-config", args.hf_config),
                              ("Megatron shape flags", megatron)) if on]
    if len(chosen) != 1:
        raise InputError(f"model: got {', '.join(chosen) or 'nothing'}; give exactly one of --model PRESET, "
                         "--hf-config PATH or Megatron flags (--num-layers --hidden-size ...)")
    if args.model:
        model = preset(args.model)
        return with_seq_length(model, args.seq_length) if args.seq_length else model
    if args.hf_config:
        return model_from_hf_config(args.hf_config, seq_length=args.seq_length)
    return model_from_megatron_namespace(args)


def _plan(args, model) -> ParallelPlan:
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    gpus = args.gpus if args.gpus is not None else tp * pp
    require(gpus > 0 and tp > 0 and pp > 0 and gpus % (tp * pp) == 0, "--gpus", gpus,
            f"must be a positive multiple of tensor x pipeline parallel size = {tp} x {pp}")
    vpp = 1
    if args.num_layers_per_virtual_pipeline_stage:
        per = args.num_layers_per_virtual_pipeline_stage
        require(per > 0 and model.num_layers % (pp * per) == 0, "--num-layers-per-virtual-pipeline-stage",
                per, f"must divide num_layers / pp = {model.num_layers} / {pp}")
        vpp = model.num_layers // (pp * per)
    plan = ParallelPlan(dp=gpus // (tp * pp), tp=tp, pp=pp, vpp=vpp, sequence_parallel=args.sequence_parallel,
                        micro_batch_size=args.micro_batch_size, global_batch_size=args.global_batch_size,
                        recompute=args.recompute_granularity, zero_stage=args.zero)
    plan.check_model(model)
    return plan


def run(args) -> int:
    model = _model(args)
    plan = _plan(args, model)
    profile = load_profile(args.gpu)
    est = estimate(model, plan, profile, gpus_per_node=args.gpus_per_node)
    if args.json:
        print(json.dumps(est.to_dict(), indent=2))
        return 0
    pl = plan
    print(model.describe())
    print(f"gpu: {profile.name} ({profile.peak() / 1e12:.0f} TFLOP/s bf16, "
          f"{format_bytes(profile.hbm_capacity_bytes)} HBM)")
    print(f"plan: {pl.world_size} GPUs = dp {pl.dp} x tp {pl.tp} x pp {pl.pp}"
          f"{f' (vpp {pl.vpp})' if pl.vpp > 1 else ''}, sp {'on' if pl.sp else 'off'}, "
          f"micro-batch {pl.micro_batch_size}, global batch {pl.global_batch_size} "
          f"({pl.num_microbatches} micro-batches), recompute {pl.recompute}, ZeRO-{pl.zero_stage}")
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
    for key in ("compute", "tp_comm", "pipeline_bubble", "pp_comm", "dp_comm", "optimizer"):
        share = est.time[key] / est.time["step"] * 100
        print(f"  {key:<16}{format_time(est.time[key]):>14}  {share:5.1f}%")
    print(f"  {'step':<16}{format_time(est.time['step']):>14}")
    print()
    print(f"tokens/s {est.tokens_per_s:,.0f}   model TFLOP/s per GPU {est.model_tflops_per_gpu:.1f}   "
          f"hardware TFLOP/s per GPU {est.hardware_tflops_per_gpu:.1f}   MFU {est.mfu * 100:.1f}%")
    return 0
