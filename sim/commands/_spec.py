"""Flags shared by the commands that take a model, a GPU and a parallel plan.

The model comes from a preset (``--model``), a Hugging Face config.json
(``--hf-config``) or Megatron-LM's shape flags; the plan from Megatron-LM's
parallelism flags (``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
``--decoder-first-pipeline-num-layers``, ...) plus ``--schedule`` and ``--placement``,
with data parallelism filling ``--gpus``. ``trainsim estimate`` and ``trainsim run``
read the same flags, and experiment TOML files use the same names with underscores.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from sim.errors import InputError, require
from sim.inputs.hardware import PRESETS as GPU_PRESETS
from sim.inputs.model import (
    PRESETS,
    add_megatron_model_arguments,
    model_from_hf_config,
    model_from_megatron_namespace,
    preset,
    with_seq_length,
)
from sim.inputs.plan import DDP_BUCKET_BYTES, ParallelPlan
from sim.build.schedules import SCHEDULES
from sim.units import NONNEGATIVE_INT, POSITIVE_INT, Number, parse_size


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Model, hardware and parallel-plan flags."""
    src = p.add_argument_group("model (one of)")
    src.add_argument("--model", metavar="PRESET", help=f"one of: {', '.join(PRESETS)}")
    src.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json")
    add_megatron_model_arguments(p)
    hw = p.add_argument_group("hardware")
    hw.add_argument("--gpu", default="a100-80gb",
                    help=f"{', '.join(GPU_PRESETS)} or a profile .json (default a100-80gb)")
    hw.add_argument("--gpus", type=POSITIVE_INT, help="total GPUs; data parallelism fills them (default tp x pp)")
    hw.add_argument("--gpus-per-node", type=POSITIVE_INT, default=8)
    par = p.add_argument_group("parallelism and batch (Megatron-LM flags)")
    par.add_argument("--tensor-model-parallel-size", type=POSITIVE_INT, default=1)
    par.add_argument("--pipeline-model-parallel-size", type=POSITIVE_INT, default=1)
    par.add_argument("--num-layers-per-virtual-pipeline-stage", type=POSITIVE_INT)
    par.add_argument("--num-virtual-stages-per-pipeline-rank", type=POSITIVE_INT,
                     help="model chunks per pipeline rank (vpp), Megatron-LM's alternative to the flag above")
    par.add_argument("--schedule", metavar="NAME|CSV",
                     help=f"pipeline schedule: {', '.join(SCHEDULES)}, or a schedule .csv file "
                          "(default 1f1b, interleaved when vpp > 1)")
    par.add_argument("--decoder-first-pipeline-num-layers", type=POSITIVE_INT, metavar="N",
                     help="transformer layers on the first pipeline stage (the rest split evenly)")
    par.add_argument("--decoder-last-pipeline-num-layers", type=POSITIVE_INT, metavar="N",
                     help="transformer layers on the last pipeline stage (the rest split evenly)")
    par.add_argument("--account-for-embedding-in-pipeline-split", action="store_true",
                     help="count the embedding as one layer when splitting layers over stages")
    par.add_argument("--account-for-loss-in-pipeline-split", action="store_true",
                     help="count the output layer and loss as one layer when splitting layers over stages")
    par.add_argument("--placement", default="tp-pp-dp",
                     help="order of tp, pp, dp from innermost (consecutive ranks) to outermost "
                          "(default tp-pp-dp; Megatron-LM's order is tp-dp-pp)")
    par.add_argument("--sequence-parallel", action="store_true")
    par.add_argument("--micro-batch-size", type=POSITIVE_INT, default=1)
    par.add_argument("--global-batch-size", type=POSITIVE_INT, help="default micro-batch size x data-parallel size")
    par.add_argument("--recompute-granularity", choices=["none", "selective", "full"], default="none")
    par.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=0, help="ZeRO stage (default 0)")
    par.add_argument("--zero3-prefetch-depth", type=NONNEGATIVE_INT, default=None, metavar="N",
                     help="ZeRO-3: layers whose parameters are gathered ahead (default 1)")
    par.add_argument("--zero3-prefetch-bucket-size", type=Number(float, minimum=0), default=None, metavar="PARAMS",
                     help="ZeRO-3: parameters gathered ahead, as DeepSpeed's stage3_prefetch_bucket_size "
                          "(sets the depth in whole layers)")
    par.add_argument("--zero3-max-live-parameters", type=Number(float, above=0), default=None, metavar="PARAMS",
                     help="ZeRO-3: most gathered parameters alive at once (DeepSpeed stage3_max_live_parameters)")
    par.add_argument("--zero-bucket-size", default=None, metavar="BYTES",
                     help="ZeRO-2/3 gradient reduce-scatter bucket, e.g. 500MB (default: --bucket-size)")
    par.add_argument("--offload-optimizer", action="store_true",
                     help="ZeRO-Offload: optimizer states in host memory, optimizer step on the CPU")
    par.add_argument("--overlap-grad-reduce", action=argparse.BooleanOptionalAction, default=True,
                     help="overlap the data-parallel gradient all-reduce with backward (default on)")
    par.add_argument("--bucket-size", default=None, metavar="BYTES",
                     help=f"gradient bucket size, e.g. 25MiB (default {DDP_BUCKET_BYTES // 2**20} MiB, PyTorch DDP's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def model_from_args(args):
    """The ModelSpec the flags describe (exactly one source)."""
    megatron = any(getattr(args, k) is not None for k in
                   ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size"))
    chosen = [n for n, on in (("--model", args.model), ("--hf-config", args.hf_config),
                              ("Megatron shape flags", megatron)) if on]
    if len(chosen) != 1:
        raise InputError(f"model: got {', '.join(chosen) or 'nothing'}; give exactly one of --model PRESET, "
                         "--hf-config PATH or Megatron flags (--num-layers --hidden-size ...)")
    if args.model:
        require(args.model in PRESETS, "--model", args.model, f"allowed presets: {', '.join(PRESETS)}")
        model = preset(args.model)
        return with_seq_length(model, args.seq_length) if args.seq_length else model
    if args.hf_config:
        return model_from_hf_config(args.hf_config, seq_length=args.seq_length)
    return model_from_megatron_namespace(args)


def plan_from_args(args, model) -> ParallelPlan:
    """The ParallelPlan the flags describe, checked against the model."""
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    gpus = args.gpus if args.gpus is not None else tp * pp
    require(gpus > 0 and tp > 0 and pp > 0 and gpus % (tp * pp) == 0, "--gpus", gpus,
            f"must be a positive multiple of tensor x pipeline parallel size = {tp} x {pp}")
    uneven = (args.decoder_first_pipeline_num_layers is not None
              or args.decoder_last_pipeline_num_layers is not None
              or args.account_for_embedding_in_pipeline_split or args.account_for_loss_in_pipeline_split)
    vpp = 1
    per, chunks = args.num_layers_per_virtual_pipeline_stage, args.num_virtual_stages_per_pipeline_rank
    require(per is None or chunks is None, "--num-virtual-stages-per-pipeline-rank", chunks,
            "give it or --num-layers-per-virtual-pipeline-stage, not both")
    if per is not None:
        require(not uneven, "--num-layers-per-virtual-pipeline-stage", per,
                "assumes an even split; with uneven stages give --num-virtual-stages-per-pipeline-rank")
        require(per > 0 and model.num_layers % (pp * per) == 0, "--num-layers-per-virtual-pipeline-stage",
                per, f"must divide num_layers / pp = {model.num_layers} / {pp}")
        vpp = model.num_layers // (pp * per)
    elif chunks is not None:
        require(chunks > 0, "--num-virtual-stages-per-pipeline-rank", chunks, "expected an integer > 0")
        vpp = chunks
    schedule = args.schedule
    if schedule is not None and schedule not in SCHEDULES:
        require(schedule.endswith(".csv"), "--schedule", schedule,
                f"allowed: {', '.join(s for s in SCHEDULES if s != 'custom')}, or a path to a schedule .csv")
        require(not Path(schedule).is_dir(), "--schedule", schedule, "is a directory; expected a schedule .csv file")
        require(Path(schedule).is_file(), "--schedule", schedule, "no such schedule file")
        schedule = "custom"
    bucket = parse_size(args.bucket_size, "--bucket-size") if args.bucket_size is not None else DDP_BUCKET_BYTES
    zbucket = parse_size(args.zero_bucket_size, "--zero-bucket-size") if args.zero_bucket_size is not None else None
    depth = args.zero3_prefetch_depth
    if args.zero3_prefetch_bucket_size is not None:
        require(depth is None, "--zero3-prefetch-bucket-size", args.zero3_prefetch_bucket_size,
                "give it or --zero3-prefetch-depth, not both")
        require(args.zero3_prefetch_bucket_size >= 0, "--zero3-prefetch-bucket-size",
                args.zero3_prefetch_bucket_size, "expected a number of parameters >= 0")
        from sim.build.memory import layer_params_per_rank

        depth = math.ceil(args.zero3_prefetch_bucket_size / layer_params_per_rank(model, tp))
    if depth is not None:
        require(depth >= 0, "--zero3-prefetch-depth", depth, "expected an integer >= 0")
    plan = ParallelPlan(dp=gpus // (tp * pp), tp=tp, pp=pp, vpp=vpp, sequence_parallel=args.sequence_parallel,
                        micro_batch_size=args.micro_batch_size, global_batch_size=args.global_batch_size,
                        recompute=args.recompute_granularity, zero_stage=args.zero, schedule=schedule,
                        dp_overlap=args.overlap_grad_reduce, bucket_size_bytes=bucket,
                        zero3_prefetch_depth=1 if depth is None else depth, zero_bucket_size_bytes=zbucket,
                        zero3_max_live_parameters=args.zero3_max_live_parameters,
                        offload_optimizer=args.offload_optimizer,
                        placement=args.placement,
                        first_stage_layers=args.decoder_first_pipeline_num_layers,
                        last_stage_layers=args.decoder_last_pipeline_num_layers,
                        account_for_embedding=args.account_for_embedding_in_pipeline_split,
                        account_for_loss=args.account_for_loss_in_pipeline_split)
    plan.check_model(model)
    return plan


def schedule_from_args(args, plan: ParallelPlan):
    """The ``Schedule`` of ``--schedule FILE.csv``, checked against the plan's pipeline
    size, model chunks and micro-batches (None for a built-in schedule)."""
    if plan.schedule != "custom":
        return None
    from sim.build.schedule_io import load_schedule_csv

    sched = load_schedule_csv(args.schedule)
    have = (sched.pp, sched.vpp, sched.num_microbatches)
    need = (plan.pp, plan.vpp, plan.num_microbatches)
    if have != need:
        raise InputError(f"{args.schedule}: schedule {sched.name}: has pp={have[0]}, vpp={have[1]}, m={have[2]} "
                         f"(rows, model chunks per row, micro-batches); the plan needs pp={need[0]}, vpp={need[1]}, "
                         f"m={need[2]} (global batch / (micro-batch size x dp))")
    return sched
