"""From settings to the objects a run is built from: the model, the plan, the cluster.

Each function takes a section of ``sim.inputs.schema`` and returns the checked object
(``ModelSpec``, ``ParallelPlan``, ``Topology``), or raises ``InputError`` naming the
setting by its flag (an experiment file's errors are pointed at its key and line by
``sim.inputs.experiment.blame``).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from sim.errors import NEGATIVE_VALUE, InputError, from_argparse, require
from sim.inputs.hf_config import model_from_hf_config
from sim.inputs.megatron_model import MOE_FIELDS, model_from_megatron_settings
from sim.inputs.model import PRESETS, ModelSpec, layer_params_per_rank, preset, with_seq_length
from sim.inputs.placement import DEFAULT_PLACEMENT
from sim.inputs.plan import DDP_BUCKET_BYTES, SCHEDULES, ParallelPlan
from sim.inputs.flags import add_arguments, given
from sim.inputs.layer_split import parse_layer_split
from sim.inputs.schema import ClusterSettings, ModelSettings, PlanSettings, fields_of
from sim.inputs.topology import Topology
from sim.units import parse_size

NODE_OF_GPU = {"a100-80gb": "dgx-a100", "h100-sxm": "dgx-h100", "h200": "dgx-h200"}
"""The built-in node of each built-in GPU profile (the default topology)."""
_SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size")


def has_model(m: ModelSettings) -> bool:
    """Whether the settings name a model at all (a preset, a config.json or a shape)."""
    return bool(m.model or m.hf_config or any(getattr(m, k) is not None for k in _SHAPE))


def model_from_settings(m: ModelSettings) -> ModelSpec:
    """The ModelSpec the settings describe (exactly one source)."""
    megatron = any(getattr(m, k) is not None for k in _SHAPE)
    chosen = [n for n, on in (("--model", m.model), ("--hf-config", m.hf_config),
                              ("Megatron shape flags", megatron)) if on]
    if len(chosen) != 1:
        raise InputError(f"model: got {', '.join(chosen) or 'nothing'}; give exactly one of --model PRESET, "
                         "--hf-config PATH or Megatron flags (--num-layers --hidden-size ...)")
    if m.model:
        require(m.model in PRESETS, "--model", m.model, f"allowed presets: {', '.join(PRESETS)}")
        model = preset(m.model)
        model = with_seq_length(model, m.seq_length) if m.seq_length else model
    elif m.hf_config:
        model = model_from_hf_config(m.hf_config, seq_length=m.seq_length)
    else:
        return model_from_megatron_settings(m)
    return with_moe_settings(model, m)


def with_moe_settings(model: ModelSpec, m: ModelSettings) -> ModelSpec:
    """A preset's or config.json's model with the MoE/MLA flags given on top (``--num-experts 16``,
    ``--moe-router-topk 1``, ...); an error names the flag."""
    changes = {f: getattr(m, f) for f in MOE_FIELDS if getattr(m, f) is not None}
    if not changes:
        return model
    try:
        return replace(model, **changes)
    except InputError as exc:
        field, _, rest = str(exc).removeprefix(f"model {model.name}: ").partition(": ")
        raise InputError(f"--{field.replace('_', '-')}: {rest}" if field in changes else str(exc)) from None


class _StrictParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_VALUE  # '-4' is a value to check, not a flag

    def error(self, message: str):  # noqa: D401 - argparse API
        raise from_argparse(message)


MEGATRON_SHAPE_FIELDS = tuple(n for n in fields_of("model") if n not in ("model", "hf_config"))
"""The Megatron-LM model-shape settings (``--num-layers``, ``--hidden-size``, ...)."""


def model_from_megatron_args(argv: Sequence[str], name: str = "megatron") -> ModelSpec:
    """A spec from a Megatron-LM argument list, e.g. ``['--num-layers', '96', ...]``."""
    parser = _StrictParser(prog="megatron-args", add_help=False, allow_abbrev=False)
    add_arguments(parser, MEGATRON_SHAPE_FIELDS)
    return model_from_megatron_settings(ModelSettings(**given(parser.parse_args(list(argv)))), name)


def plan_from_settings(p: PlanSettings, gpus: int | None, model: ModelSpec) -> ParallelPlan:
    """The ParallelPlan the settings describe on ``gpus`` GPUs (None: tp x pp), checked
    against the model."""
    tp, pp, cp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size
    gpus = gpus if gpus is not None else tp * pp * cp
    require(gpus > 0 and tp > 0 and pp > 0 and gpus % (tp * pp * cp) == 0, "--gpus", gpus,
            f"must be a positive multiple of tensor x pipeline x context parallel size = {tp} x {pp} x {cp}")
    uneven = (p.decoder_first_pipeline_num_layers is not None or p.decoder_last_pipeline_num_layers is not None
              or p.account_for_embedding_in_pipeline_split or p.account_for_loss_in_pipeline_split)
    vpp = 1
    per, chunks = p.num_layers_per_virtual_pipeline_stage, p.num_virtual_stages_per_pipeline_rank
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
    schedule = p.schedule
    builtin = [s for s in SCHEDULES if s != "custom"]
    if schedule is not None and schedule not in builtin:
        require(schedule.endswith(".csv"), "--schedule", schedule,
                f"allowed: {', '.join(builtin)}, or a path to a schedule .csv")
        require(not Path(schedule).is_dir(), "--schedule", schedule, "is a directory; expected a schedule .csv file")
        require(Path(schedule).is_file(), "--schedule", schedule, "no such schedule file")
        schedule = "custom"
    bucket = parse_size(p.bucket_size, "--bucket-size") if p.bucket_size is not None else DDP_BUCKET_BYTES
    zbucket = parse_size(p.zero_bucket_size, "--zero-bucket-size") if p.zero_bucket_size is not None else None
    depth = p.zero3_prefetch_depth
    if p.zero3_prefetch_bucket_size is not None:
        require(depth is None, "--zero3-prefetch-bucket-size", p.zero3_prefetch_bucket_size,
                "give it or --zero3-prefetch-depth, not both")
        require(p.zero3_prefetch_bucket_size >= 0, "--zero3-prefetch-bucket-size",
                p.zero3_prefetch_bucket_size, "expected a number of parameters >= 0")
        depth = math.ceil(p.zero3_prefetch_bucket_size / layer_params_per_rank(model, tp))
    if depth is not None:
        require(depth >= 0, "--zero3-prefetch-depth", depth, "expected an integer >= 0")
    require(not p.tp_comm_overlap or tp == 1 or p.sequence_parallel, "--tp-comm-overlap", True,
            "needs --sequence-parallel (it overlaps the sequence-parallel all-gathers and reduce-scatters)")
    require(not p.overlap_param_gather or p.zero in (1, 2), "--overlap-param-gather", True,
            f"needs --zero 1 or 2 (got {p.zero}): it overlaps the sharded optimizer's parameter all-gather "
            "(Megatron-LM: with --use-distributed-optimizer)")
    require(not p.fp8_param_gather or (p.fp8_format is not None and p.zero in (1, 2)), "--fp8-param-gather", True,
            f"needs --fp8-format and --zero 1 or 2 (got {p.fp8_format or 'BF16'}, --zero {p.zero}): it keeps the "
            "sharded optimizer's weights in FP8 (Megatron-LM: with --use-distributed-optimizer)")
    require(not (p.overlap_param_gather and p.offload_optimizer), "--overlap-param-gather", True,
            "not with --offload-optimizer (the parameters come back from the host over PCIe)")
    placement = p.placement
    if cp > 1 and placement == DEFAULT_PLACEMENT:
        placement = "tp-dp-pp"  # Megatron-LM's order: tp, cp, dp, pp from innermost
    plan = ParallelPlan(dp=gpus // (tp * pp * cp), tp=tp, pp=pp, vpp=vpp, sequence_parallel=p.sequence_parallel,
                        cp=cp, cp_comm_type=p.cp_comm_type,
                        tp_comm_overlap=p.tp_comm_overlap,
                        gradient_accumulation_fusion=p.gradient_accumulation_fusion,
                        cross_entropy="megatron-fused" if p.cross_entropy_loss_fusion else "megatron",
                        micro_batch_size=p.micro_batch_size, global_batch_size=p.global_batch_size,
                        recompute=p.recompute_granularity, attention=p.attention, zero_stage=p.zero,
                        fp8_format=p.fp8_format,
                        ep=p.expert_model_parallel_size, etp=p.expert_tensor_parallel_size,
                        moe_routing=p.moe_routing, moe_capacity_factor=p.moe_expert_capacity_factor,
                        moe_seed=p.moe_routing_seed,
                        schedule=schedule,
                        dp_overlap=p.overlap_grad_reduce, bucket_size_bytes=bucket,
                        zero3_prefetch_depth=1 if depth is None else depth, zero_bucket_size_bytes=zbucket,
                        zero3_max_live_parameters=p.zero3_max_live_parameters,
                        offload_optimizer=p.offload_optimizer, param_gather_overlap=p.overlap_param_gather,
                        fp8_param_gather=p.fp8_param_gather,
                        placement=placement,
                        first_stage_layers=p.decoder_first_pipeline_num_layers,
                        last_stage_layers=p.decoder_last_pipeline_num_layers,
                        account_for_embedding=p.account_for_embedding_in_pipeline_split,
                        account_for_loss=p.account_for_loss_in_pipeline_split,
                        layer_split=parse_layer_split(p.layer_split))
    plan.check_model(model)
    return plan


def topology_from_settings(c: ClusterSettings, world: int, profile_name: str) -> Topology:
    """The cluster: ``c.topology`` (default: the GPU's DGX node) times ``c.nodes`` (default:
    enough for ``world`` GPUs) on ``c.fabric``; checked to hold ``world`` GPUs."""
    from sim.inputs.topology_build import FabricSpec, load_topology

    topo_name = c.topology or NODE_OF_GPU.get(profile_name)
    if topo_name is None:
        raise InputError(f"--topology: not given, and GPU profile {profile_name!r} has no built-in node; "
                         f"give --topology NODE.toml (built-in GPUs: {', '.join(NODE_OF_GPU)})")
    fabric = None
    if c.fabric or c.oversubscription:
        fabric = FabricSpec(type=c.fabric or "rail", oversubscription=c.oversubscription or 1.0)
    topo = load_topology(topo_name, nodes=c.nodes, fabric=fabric, min_gpus=world, flag="--topology")
    if topo.num_gpus < world:
        raise InputError(f"--gpus: got {world}; topology {topo.name} has {topo.num_gpus} GPUs"
                         + (f" (--nodes {c.nodes})" if c.nodes is not None else ""))
    if topo.gpus_per_node != c.gpus_per_node:
        raise InputError(f"--gpus-per-node: got {c.gpus_per_node}; topology {topo.name} has "
                         f"{topo.gpus_per_node} GPUs per node")
    return topo
