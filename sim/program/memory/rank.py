"""What one rank holds in all: the sums the simulator and the analytic estimate use.

A rank of pipeline stage i holds, for its Ψ_i parameters over Nd data-parallel ranks:

    resident      weights + gradients + optimizer states (ZeRO-sharded, ``states``)
                  + the profile's reserve (CUDA context, allocator slack)
    activations   each in-flight micro-batch's stored tensors (``activations``,
                  ``inflight``)
    temporaries   gradient buckets being reduced (under FSDP's deferred gradient sync
                  the unsharded gradients held across micro-batches); ZeRO-3's
                  gathered weights

With the optimizer offloaded (ZeRO-Offload) the optimizer states live in host memory and
the GPU holds none of them.

The simulator's memory pass (``sim.program.training.memory``) starts each rank with
``stage_resident_bytes`` and allocates ``chunk_activation_bytes`` per forward step; the
passes add buckets and gathered weights as they run, so its peak comes out of the
program. The analytic estimate (``sim.program.estimate``) adds the worst moment up
instead: ``stage_memory_bytes`` is the model states, the activations in flight at the
stage's peak and one DeepSpeed-default bucket (ZeRO ≥ 1) plus the layer in use and one
prefetched (ZeRO-3), at data parallelism above 1.
"""

from __future__ import annotations

from sim.inputs.model import ModelSpec, layer_param_split, layer_params_per_rank
from sim.inputs.plan import ParallelPlan
from sim.program.memory.inflight import stage_activation_bytes
from sim.program.memory.states import (
    DEEPSPEED_REDUCE_BUCKET_ELEMS,
    expert_data_parallel,
    grad_bucket_bytes,
    fp8_weight_copy_bytes,
    stage_model_states,
    stage_param_split,
    stage_params_per_rank,
    sync_bucket_bytes,
    zero3_gathered_param_bytes,
)


def stage_resident_bytes(model: ModelSpec, plan: ParallelPlan, stage: int, reserve_bytes: float,
                         any_layout: bool = False) -> dict:
    """Bytes per category a rank of pipeline stage ``stage`` holds from the start of the
    iteration: its sharded model states (none of the optimizer's when it is offloaded),
    under FP8 Transformer Engine's FP8 weight copies (with the parameters), and
    ``reserve_bytes``."""
    st = stage_model_states(model, plan, stage)
    out = {"parameters": st.params_bytes + fp8_weight_copy_bytes(model, plan, stage, any_layout),
           "gradients": st.grads_bytes,
           "optimizer": 0.0 if plan.offload_optimizer else st.optimizer_bytes,
           "reserve": reserve_bytes}
    buffers = plan.sharding.bucket_buffers
    if buffers:  # DeepSpeed's contiguous_gradients buffers (sim.inputs.frameworks.ShardingStrategy.bucket_buffers)
        out["buckets"] = buffers * sync_bucket_bytes(plan)  # 16-bit elements (the parameters' dtype)
    return out


def zero_temporary_bytes(model: ModelSpec, plan: ParallelPlan, stage_params: float,
                         stage_split: tuple[float, float] | None = None) -> float:
    """The estimate's temporaries on a rank holding ``stage_params`` parameters: one
    DeepSpeed-default gradient bucket (at most the rank's gradients) under ZeRO ≥ 1, and
    ZeRO-3's gathered weights of the layer in use and one ahead, when dp > 1; under FSDP's
    deferred gradient sync with more than one micro-batch, the rank's unsharded gradients
    in the reduction's dtype instead of the bucket (held from the first micro-batch's
    backward to the last one's reduce-scatters, ``sim.inputs.frameworks``). Under FSDP2 with
    pipelining (``ParallelPlan.sharding.pp_sync_window``) the stage's gathered weights
    instead, all of them (``stage_split``: its dense and expert parameters; the experts only
    where their data-parallel group shards them): torch pipelining keeps them gathered until
    the stage's last backward of the schedule call."""
    zero, dp, sharding = plan.sections.zero.zero, plan.dp_cp, plan.sharding  # (sim.inputs.strategies.ZeroStage)
    temp = 0.0
    if zero.shards_optimizer and dp > 1:
        if sharding.defer_grad_sync and plan.num_microbatches > 1:  # experts in their own dtype
            experts = stage_split[1] if stage_split is not None else 0.0
            temp += sum(n * (4 if sharding.reduce_fp32(model.moe, part) else 2)
                        for n, part in ((stage_params - experts, False), (experts, True)))
        else:
            temp += grad_bucket_bytes(min(stage_params, float(DEEPSPEED_REDUCE_BUCKET_ELEMS)))
    if zero.shards_params and dp > 1:
        layer = zero3_gathered_param_bytes(zero3_layer_gather_params(model, plan))
        if sharding.pp_sync_window and stage_split is not None:
            dense, experts = stage_split
            layer = max(layer, zero3_gathered_param_bytes(
                dense + (experts if expert_data_parallel(plan) > 1 else 0.0), prefetch_layers=0))
        temp += layer
    return temp


def zero3_layer_gather_params(model: ModelSpec, plan: ParallelPlan) -> float:
    """The most parameters ZeRO-3 gathers for one layer on a rank: a dense layer's, or an
    MoE layer's dense ones and, when their expert data-parallel group has more than one
    rank, the rank's experts (sharded over it; ``sim.inputs.experts``)."""
    dense = layer_params_per_rank(model, plan.tp)
    if model.layers is not None:  # the largest of the stack's dense layers (sim.inputs.layers)
        dense = max((layer_params_per_rank(model, plan.tp, model.layers.index(lay))
                     for lay in model.layer_kinds if not lay.is_moe), default=0.0)
    moe = [i for i in range(model.num_layers) if model.is_moe_layer(i)]
    if not moe:
        return dense
    d, x = layer_param_split(model, moe[0], plan.tp, plan.ep, plan.etp_size)
    moe_layer = d + (x if expert_data_parallel(plan) > 1 else 0.0)
    return max(moe_layer, dense) if len(moe) < model.num_layers else moe_layer


def stage_memory_bytes(model: ModelSpec, plan: ParallelPlan, stage: int,
                       flash_attention: bool | None = None, any_layout: bool = False) -> dict:
    """The estimate's peak on a rank of pipeline stage ``stage``, bytes: weights,
    gradients, optimizer, activations, temporaries and their total."""
    params = stage_params_per_rank(model, plan, stage)
    states = stage_model_states(model, plan, stage)
    mem = {"weights": states.params_bytes + fp8_weight_copy_bytes(model, plan, stage, any_layout),
           "gradients": states.grads_bytes,
           "optimizer": states.optimizer_bytes,
           "activations": stage_activation_bytes(model, plan, stage, flash_attention),
           "temporaries": zero_temporary_bytes(model, plan, params, stage_param_split(model, plan, stage))}
    mem["total"] = sum(mem.values())
    return mem
