"""Which training framework ran: what it does differently from Megatron-Core.

The presets are fitted to Megatron-Core runs (NeMo's and the DGX Cloud benchmarks'), so
trainsim's defaults are Megatron-Core's. PyTorch-native frameworks run the same model
with other kernels and another FSDP, and ``framework`` says which one ran; each setting
below it can also be given on its own (a given one wins over the framework's):

    framework     attention_kernel  backward_prefetch  what the sources say
    megatron      te                backward_pre       Transformer Engine's fused attention (cuDNN; FA3-class
                                                       on Hopper); ZeRO-3 as DeepSpeed: prefetch depth ahead
    torchtitan    fa2               backward_pre       F.scaled_dot_product_attention, whose flash backend is
                                                       FlashAttention-2; FSDP2 (fully_shard) prefetches one
                                                       layer ahead in forward and backward
    automodel     te                backward_pre       NeMo AutoModel: TE attention and linears ("TE kernels");
                                                       FSDP2 with enable_fsdp2_prefetch
    llm-foundry   triton            backward_post      MPT on Composer's FSDP1: llm-foundry's attn_impl triton
                                                       (benchmark script at b2a43a147 / v0.3.0); Composer 0.16
                                                       sets backward_prefetch BACKWARD_POST by default
    deepspeed     fa2               backward_pre       DeepSpeed's ZeRO (below) around a model it does not
                                                       write: Hugging Face transformers' SDPA or flash_attn 2
                                                       ("flash_attention_2"), Megatron-DeepSpeed's
                                                       --use-flash-attn-v2: FlashAttention-2 either way

What the framework's FSDP or DeepSpeed ZeRO does with the plan's own settings over it is
resolved once per plan into a ``ShardingStrategy`` (``ParallelPlan.sharding``, made by
``sharding_of`` with the rules below): the program's passes and the memory estimate read its
values, and no other module compares the plan's framework with a name.

``attention_kernel`` (``HardwareProfile.attention_kernel_speed``): 'te' is the kernel the
profile's ``attention_max_efficiency`` stands for (FlashAttention-3 / cuDNN on Hopper,
FlashAttention-2 on Ampere); 'fa2' is FlashAttention-2 (Dao 2023), which on Hopper uses
none of its new instructions (FlashAttention-3 paper, Shah et al. 2024: about 35% of the
H100's peak); 'triton' is "FlashAttention in Triton" (Dao's flash_attn_triton.py of 2022,
which llm-foundry copies as ``flash_attn_triton.py`` and runs on triton-pre-mlir). A
profile gives each kernel's forward and backward speed relative to its own.

``backward_prefetch`` is PyTorch FSDP1's (``torch.distributed.fsdp.BackwardPrefetch``):
with BACKWARD_PRE a layer's all-gather for backward is issued in the pre-backward hook of
the layer after it, so it runs under that layer's backward; with BACKWARD_POST it is
issued in that layer's post-backward hook (``_post_backward_reshard`` ->
``_prefetch_handle``), which the host runs once it has launched that layer's backward
kernels, not once the GPU has run them (torch 2.1 ``_runtime_utils.py``, the version of
llm-foundry's benchmark image ``mosaicml/pytorch:2.1.0_cu121``). The host runs ahead of
the GPU, held back by ``limit_all_gathers`` (llm-foundry's ``fsdp_config`` sets it:
scripts/train/yamls/pretrain/mpt-*.yaml @ v0.3.0): ``_reshard`` records a free event on
the compute stream after each layer's backward, and ``_unshard`` waits on the host for the
event two reshards back before it gathers (``_FreeEventQueue``, at most two), so the
post-backward hook of layer i issues layer i−1's gather once the GPU has finished layer
i+1's backward, as layer i's starts. On the group's one NCCL stream it follows layer
i+1's reduce-scatter, issued one hook before (``sim.program.process_group_streams``): the
gather runs under layer i's backward, as BACKWARD_PRE's one layer ahead does
(``sim.program.training.zero3_gather``). Only a host slower than the GPU would make each
layer's backward wait for its own gather; the host's eager launches
(``sim.program.launch.HOST_LAUNCH_S`` a kernel, tens of kernels a layer) are far shorter
than these layers' kernels.
``reshard_after_forward`` is FSDP2's (``fully_shard(reshard_after_forward=...)``); False
is FSDP1's SHARD_GRAD_OP: a layer's parameters gathered in forward stay until its backward
is done, so backward gathers nothing (``sim.program.zero.add_param_gathers``).

DeepSpeed's ZeRO, from its source (deepspeedai/DeepSpeed at edaa722, August 2026: the
defaults of ``DeepSpeedZeroConfig`` in deepspeed/runtime/zero/config.py, ``DEEPSPEED_*`` below;
all sizes are in elements, not bytes):

- ZeRO-3 fetches parameters in each module's pre-forward and pre-backward hook
  (partitioned_param_coordinator.py, ``fetch_sub_module``). Once the first step has recorded
  the trace of modules, every fetch also prefetches the next parameters of the trace, at
  most ``stage3_prefetch_bucket_size`` elements per fetch and never more than
  ``stage3_max_live_parameters`` gathered at once (``__n_available_params``). Each fetch (one
  per module, so at least one per weight matrix) moves the prefetch frontier on by a
  bucket, so when a layer's matrices times the bucket reach the layer's parameters the
  frontier outruns the compute and the lead is set by the live-parameter cap
  (``deepspeed_prefetch_depth``); with a smaller bucket one layer ahead is what is
  prefetched, at most (the simulator gathers whole layers).
- Parameters of at most ``stage3_param_persistence_threshold`` elements
  (parameter_offload.py ``mark_persistent_parameters``: ``ds_numel <= threshold``) are never
  partitioned: norms and biases stay gathered, no fetch moves them; their gradients are
  reduce-scattered with the rest and the step all-gathers them once after the optimizer
  (stage3.py ``_post_step``: ``persistent_parameters[0].all_gather``).
- A module's parameters are not released after its forward when they are used again
  within ``stage3_max_reuse_distance`` elements of the trace (``__params_to_release``):
  the layers at the end of the forward, reused by the backward that follows at once,
  stay gathered (``deepspeed_kept_layers``).
- Gradients go into a bucket, which is reduced when the next gradient would overflow
  ``reduce_bucket_size`` (stage3.py ``reduce_independent_p_g_buckets_and_remove_grads``,
  stage_1_and_2.py the same): a reduce-scatter under ZeRO-3 (``reduce_scatter_coalesced``);
  under ZeRO-1/2, with ``use_multi_rank_bucket_allreduce`` on by default, ``average_tensor``
  all-reduces the bucket (``allreduce_and_scatter``). With ``overlap_comm`` (default: on
  for ZeRO-3 only, ``overlap_comm_valid``) the reduction runs on a stream of its own,
  otherwise on the compute stream (``reduce_and_partition_stream`` is the default stream;
  stage 1/2 ``average_tensor``: the current stream). ZeRO-2 and 3 reduce every
  micro-batch; ZeRO-1 only at the accumulation boundary, in backward hooks with
  ``overlap_comm``, else after it (``reduce_gradients``); without ZeRO the engine
  all-reduces after backward in buckets of ``MEMORY_OPT_ALLREDUCE_SIZE`` = 5e8 elements
  (engine.py ``allreduce_gradients`` -> ``buffered_allreduce_fallback``).
- ZeRO-1/2's updated parameters are all-gathered in ``allgather_bucket_size`` pieces
  (runtime/utils.py ``all_gather_dp_groups``). ZeRO-2 and 3 refuse pipeline parallelism
  (runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism").

Deferred gradient sync (NeMo AutoModel's ``defer_fsdp_grad_sync``, read from
NVIDIA-NeMo/Automodel at the commits its rows name): the train recipe's
``get_sync_ctx(model, is_optim_step, defer_fsdp_grad_sync)`` (nemo_automodel/components/
distributed/utils.py) calls FSDP2's ``model.set_requires_gradient_sync(is_optim_step)``
before each micro-batch's forward and backward: True only on the last micro-batch of the
step. ``defer_fsdp_grad_sync`` is ``FSDP2Config``'s field, default True (components/
distributed/config.py @ 2013a4dd6: "Defer FSDP gradient sync to final micro-batch"; at
89e3a9fdd604 and 8d9bfb90e3d8, October 2025, the call has no flag: always deferred). In
PyTorch's FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py
``post_backward``) a group that does not reduce its gradients only reshards its parameters
(``reshard_after_backward`` is left at its default, True: the next micro-batch gathers
them again) and keeps the unsharded gradients on the unsharded parameters (bf16 under
AutoModel's ``reduce_dtype`` bf16; ``to_accumulated_grad_if_needed`` upcasts them to
fp32 when ``reduce_dtype`` is fp32); the next micro-batch's backward adds into them
(autograd's ``AccumulateGrad``: ``grad += new_grad``, a memory-bound add of U elements;
``accumulate_unsharded_grad_if_needed`` in fp32). So a layer has one reduce-scatter (and
one of each of its reduce-side copies, ``sim.program.fsdp``) per step, after the last
micro-batch's backward of it, none of the sharded accumulations, an add of its unsharded
gradients per micro-batch after the first, and its unsharded gradients held from its
first backward of the step until that reduce-scatter ends. The 70B row's yaml sets it off
(examples/llm_pretrain/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml @ 2013a4dd6:
``defer_fsdp_grad_sync: False   # Must be False with GA>1: True → delayed resharding →
OOM``): its row says so (``defer_fsdp_grad_sync`` false). Under pipeline parallelism
PyTorch's ``_PipelineStageBase.backward_maybe_with_nosync`` also turns the sync off for
every backward but the stage's last, then runs each group's ``post_backward`` after that
last backward (not under it: modelled, ``GradSync.after_step``), with
``reshard_after_backward`` False: the parameters stay gathered between micro-batches, so
each layer is gathered once per schedule call (and per forward of a micro-batch too when
``reshard_after_forward`` is on; NeMo AutoModel's MoE parallelizer turns it off under
pipelining, components/moe/parallelizer.py @ 89e3a9fdd604: ``reshard_after_forward=not
pp_enabled``) and held until the call's last backward of it. A call's micro-batches are the
sync window (``ShardingStrategy.pp_sync_window``): AutoModel calls the schedule once per
accumulation step.

Reduce dtype by parallelizer (``Framework.moe_reduce_fp32``, ``expert_reduce_fp32``): NeMo
AutoModel shards a dense model with ``FSDP2Manager``'s policy (bf16 reductions, above) but a
model with routed experts with its MoE parallelizer (components/moe/parallelizer.py @
89e3a9fdd604, the M rows' ``parallelizer`` target), whose ``apply_fsdp`` takes no policy from
the recipe and makes ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32,
output_dtype=bfloat16)`` for the transformer blocks, embedding and head, while the grouped
experts' own ``fully_shard`` over the expert-shard mesh gets no policy (torch's default: the
parameters' dtype, bf16). So the dense gradients of an AutoModel MoE model are
reduce-scattered in fp32 (with FSDP2's fp32 copies, ``sim.program.fsdp``) and the experts'
in bf16. ``accumulate_allreduce_grads_in_fp32`` given sets every gradient's.

``kernel_overhead`` (the PyTorch-native frameworks): each kernel of the framework's
program costs the GPU ``o`` seconds more than the same kernel under Megatron-Core, whose
rows the preset's ``kernel_launch_s`` and compute fraction are fitted to. The mechanism
is the eager path between kernels: every op goes through Python, the autograd and ATen
dispatchers and the backend before ``cudaLaunchKernel`` (5-25 us of CPU per op,
``sim.program.launch.HOST_LAUNCH_S``'s source), and FSDP adds its module hooks to that
path (PyTorch ``torch/distributed/fsdp/_fully_shard/_fsdp_state.py``: ``_pre_forward`` /
``_post_forward`` / ``_pre_backward`` per wrapped module, which unshard, wait on the
all-gather's event and copy out; torchtitan ``parallelize_llama`` wraps every
transformer block). Where the host runs only a little ahead of the GPU (FSDP's
all-gather waits at each block, ``limit_all_gathers`` in FSDP1 making the CPU wait on the
all-gather two blocks back, the optimizer's ``foreach`` kernels launched in chunks of
tensor lists) part of that CPU time shows between kernels on the GPU. How much depends on
the framework and on the host, so it is a fitted number per GPU profile and framework:
``HardwareProfile.framework_kernel_overhead_s[name]`` (``trainsim fit --params
framework_kernel_overhead_s.torchtitan,...``), 0 where a profile gives none, between 0
(the host always ahead) and ``KERNEL_OVERHEAD_MAX_S`` (the whole eager path exposed at
every kernel). ``job_profile`` (``sim.program.build``) adds it to ``kernel_launch_s`` for
the plan's framework: k kernels in a step then cost k·o more. Megatron-Core has none:
its kernels are the ones ``kernel_launch_s`` is fitted to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.inputs.model import ModelSpec, layer_params_per_rank

DEEPSPEED_PREFETCH_BUCKET = 50_000_000
"""``stage3_prefetch_bucket_size`` default, 5e7 elements (deepspeed/runtime/zero/config.py)."""
DEEPSPEED_MAX_LIVE_PARAMETERS = 1_000_000_000
"""``stage3_max_live_parameters`` default, 1e9 elements (deepspeed/runtime/zero/config.py)."""
DEEPSPEED_PERSISTENCE_THRESHOLD = 100_000
"""``stage3_param_persistence_threshold`` default, 1e5 elements (deepspeed/runtime/zero/config.py)."""
DEEPSPEED_MAX_REUSE_DISTANCE = 1_000_000_000
"""``stage3_max_reuse_distance`` default, 1e9 elements (deepspeed/runtime/zero/config.py)."""
DEEPSPEED_BUCKET_ELEMS = 500_000_000
"""``reduce_bucket_size`` and ``allgather_bucket_size`` defaults, 5e8 elements
(deepspeed/runtime/zero/config.py); also the engine's all-reduce bucket without ZeRO
(deepspeed/runtime/engine.py ``MEMORY_OPT_ALLREDUCE_SIZE``)."""

ATTENTION_KERNELS = ("te", "fa2", "triton")
BACKWARD_PREFETCH = ("backward_pre", "backward_post")


@dataclass(frozen=True)
class Framework:
    """What one framework runs where it differs from Megatron-Core."""

    attention_kernel: str
    backward_prefetch: str
    what: str
    kernel_overhead: bool = False
    """Its kernels pay a fitted per-kernel overhead over Megatron-Core's (module doc)."""
    fsdp: str = ""
    """Which PyTorch FSDP runs its ZeRO-3 (``FSDP_KINDS``; "" none: Megatron-Core's and
    DeepSpeed's own), whose memory-bound copies ``sim.program.fsdp`` adds."""
    reduce_fp32: bool = False
    """Its FSDP reduce-scatters the gradients in fp32 (``MixedPrecision(reduce_dtype=float32)``),
    4 bytes a parameter (module doc)."""
    moe_reduce_fp32: bool | None = None
    """For a model with routed experts, the reduce dtype of the FSDP units around its dense
    parameters (attention, shared experts, router, embedding, head) when the framework shards
    an MoE model with another parallelizer than a dense one; None: as ``reduce_fp32``."""
    expert_reduce_fp32: bool | None = None
    """The reduce dtype of the routed experts' own FSDP unit (FSDP2 over the expert
    data-parallel group); None: as the dense parameters of the same model."""
    defer_grad_sync: bool = False
    """Under gradient accumulation its FSDP reduce-scatters the gradients once per step, after
    the last micro-batch's backward, not after every micro-batch's (module doc, "Deferred
    gradient sync")."""
    reshard_under_pp: bool = True
    """Its FSDP frees a layer's gathered parameters after its forward under pipeline parallelism
    too; False: torchtitan's ``reshard_after_forward_policy`` "default" (``reshard_after_forward
    = not pp_enabled``, torchtitan/models/llama3/infra/parallelize.py ``apply_fsdp``)."""
    deepspeed: bool = False
    """Its data parallelism is DeepSpeed's engine and ZeRO (module doc, "DeepSpeed's ZeRO"),
    whatever the stage."""
    eager_rope: bool = False
    """Its own MoE models rotate the query and key with eager PyTorch ops (MLA: an fp32 upcast, a
    complex multiply, a downcast and the query's concatenation; others the rotate-half form) where
    Megatron-Core runs fused rope kernels (``sim.program.eager_rope``)."""
    pads_expert_splits: bool = False
    """Its experts run in Megatron-Core's ``TEGroupedMLP``, which under FP8/FP4 pads each local
    expert's rows to Transformer Engine's alignment (``Fp8Padding``/``Fp8Unpadding``,
    ``sim.program.workload_moe.quant_align``)."""
    grad_buckets: str = "uniform"
    """How its data-parallel wrapper below ZeRO-3 buckets the gradients (``GRAD_BUCKETS``):
    "megatron-core" (Megatron-Core's DDP) or "uniform" (PyTorch DDP's: every stage alike)."""
    optimizer: str = "megatron"
    """Its optimizer step, by name (``sim.program.costs.OPTIMIZER_BYTES_PER_PARAM``: the bytes
    each moves per local parameter, with the gradient clipping its recipes run)."""
    megatron_schedules: bool = False
    """Its pipeline schedules are Megatron-Core's (megatron/core/pipeline_parallel/schedules.py),
    whose sends wait where the schedule says so (``p2p_blocks``); otherwise PyTorch's
    ``torch.distributed.pipelining``."""


KERNEL_OVERHEAD_MAX_S = 25e-6
"""The most a framework's kernel may cost over Megatron-Core's: the whole op-to-launch
path of eager PyTorch exposed on the GPU (5-25 us of CPU per op: Python ~1 us, pybind11
~1, autograd 1-3, ATen dispatch 1-2, backend 1-5, cudaLaunchKernel 1-3 on CUDA 12; the
source of ``sim.program.launch.HOST_LAUNCH_S``)."""

FSDP_KINDS = ("fsdp1", "fsdp2")
"""PyTorch's two FSDPs: FSDP1 (``FullyShardedDataParallel``, one flat parameter per wrapped
module) and FSDP2 (``fully_shard``, one DTensor per parameter)."""

PYTORCH_DDP_BUCKET_BYTES = 25 * 2**20
"""PyTorch DDP's default bucket: ``bucket_cap_mb=25``, i.e. 25 MiB (torch.nn.parallel.DistributedDataParallel)."""

MEGATRON_CORE_BUCKET_PARAMS = 40_000_000
"""Megatron-Core DDP's default bucket floor, in parameters (``GRAD_BUCKETS``); the bucket is
the larger of it and ``MEGATRON_CORE_BUCKET_PARAMS_PER_DP`` times the data-parallel size."""
MEGATRON_CORE_BUCKET_PARAMS_PER_DP = 1_000_000

APEX_BUCKET_BYTES = 100 * 2**20
"""Apex ``DistributedFusedAdam``'s default bucket: ``bucket_cap_mb=100.0`` MiB of the gradient
sync dtype (NVIDIA/apex apex/contrib/optimizers/distributed_fused_adam.py: ``bucket_size =
1024 * 1024 * bucket_cap_mb / dtype_size`` elements)."""


@dataclass(frozen=True)
class GradBuckets:
    """How a data-parallel wrapper below ZeRO-3 packs the gradients into buckets
    (``GRAD_BUCKETS``, ``--grad-buckets``): its default bucket, and whether a stage and
    model chunk other than the first reduce their gradients as one bucket."""

    name: str
    per_chunk: bool
    """Each model chunk its own DDP instance: no bucket spans two chunks, and only the first
    stage's first chunk is cut into buckets (Megatron-Core's)."""
    whole_units: bool = False
    """Each model chunk under interleaved pipelining, else each transformer layer, is one
    effective bucket, reduced when its last gradient is ready; the embedding and the head go
    with the stage's first layer (NeMo 1.0's Apex ``DistributedFusedAdam``)."""

    def default_bytes(self, dp: int) -> float:
        """The bucket in bytes of 16-bit gradients when none is given."""
        if self.per_chunk:
            return 2.0 * max(MEGATRON_CORE_BUCKET_PARAMS, MEGATRON_CORE_BUCKET_PARAMS_PER_DP * dp)
        return APEX_BUCKET_BYTES if self.whole_units else PYTORCH_DDP_BUCKET_BYTES

    def unit_bytes(self, stage: int, chunk: int, bucket_bytes: float) -> float:
        """The bucket of model chunk ``chunk`` on pipeline stage ``stage``: ``bucket_bytes``, or
        all of the unit's gradients at once (infinite) where Megatron-Core turns bucketing off
        and under whole units (whose Apex buckets of ``bucket_bytes`` start together)."""
        if self.whole_units:
            return math.inf
        return bucket_bytes if not self.per_chunk or (stage == 0 and chunk == 0) else math.inf


GRAD_BUCKETS = {"megatron-core": GradBuckets("megatron-core", per_chunk=True),
                "uniform": GradBuckets("uniform", per_chunk=False),
                "apex": GradBuckets("apex", per_chunk=False, whole_units=True)}
"""How the gradients are packed into data-parallel buckets below ZeRO-3 (``--grad-buckets``):

- "megatron-core": Megatron-Core's ``DistributedDataParallel`` (megatron/core/distributed/
  distributed_data_parallel.py, the same in core 0.11's 791b70e0 and core_v0.15.0). Each model
  chunk is wrapped on its own, so no bucket spans two chunks; its bucket is
  ``DistributedDataParallelConfig.bucket_size`` parameters, by default
  ``max(40000000, 1000000 * data_parallel_world_size)`` ("larger DP sizes need larger buckets");
  and it turns bucketing off, one bucket for all of a chunk's gradients, on a pipeline stage
  after the first ("if disable_bucketing or pp_rank > 0: self.bucket_size = None": their
  data-parallel communication is off the critical path) and on every model chunk after the
  first (Megatron-LM's and Megatron-Bridge's ``get_model``/``_ddp_wrap``:
  ``disable_bucketing=(model_chunk_idx > 0)``; NeMo 2.0's megatron_parallel.py the same). The
  parameter all-gather of its distributed optimizer runs over the same buckets.
- "uniform": PyTorch DDP's ``bucket_cap_mb`` (25 MiB by default) on every stage and chunk.
- "apex": NeMo 1.0's Apex ``DistributedFusedAdam`` (optim name ``distributed_fused_adam``, NeMo
  v2.2.0 nemo/collections/nlp/models/language_modeling/megatron_gpt_model.py
  ``configure_optimizers``): NeMo hands it one parameter group per model chunk under
  interleaved pipelining, else per transformer layer, the groups in reverse order and every
  parameter in none of them (the embedding, the head, the final norm) added to the last, the
  stage's first layer or chunk; Apex's ``init_params_bucket`` makes each group one effective
  bucket ("configured so they all perform communication together": every Apex bucket of the
  group waits for all of its parameters, and no bucket spans two groups). Its buckets of
  ``bucket_cap_mb`` (100 MiB by default) start together, which trainsim runs as one collective
  a group; the distributed optimizer's overlapped parameter sync runs over the same groups.
  (The sequence-parallel norms' gradients, which NeMo syncs after the backward, are a rounding
  error here and go with their layer.)"""

FRAMEWORKS = {
    "megatron": Framework("te", "backward_pre", "Megatron-Core / NeMo with Transformer Engine (the presets' fits)",
                          pads_expert_splits=True, grad_buckets="megatron-core", megatron_schedules=True),
    # torchtitan: MixedPrecisionPolicy(param_dtype=mixed_precision_param, reduce_dtype=mixed_precision_reduce),
    # whose defaults are bfloat16 and float32 (torchtitan config ``training.mixed_precision_reduce``)
    "torchtitan": Framework("fa2", "backward_pre", "torchtitan: FSDP2, SDPA attention (FlashAttention-2)", True,
                            fsdp="fsdp2", reduce_fp32=True, reshard_under_pp=False),
    # AutoModel: FSDP2Manager's mp_policy default of its 2025 versions (the F15 row's yaml @ 2013a4dd6 gives none):
    # MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=bfloat16, output_dtype=bfloat16); later versions
    # reduce in float32 (an assumption: the version the row ran is not pinned further)
    # and its defer_fsdp_grad_sync default True (module doc, "Deferred gradient sync")
    # Its MoE models go through another parallelizer (components/moe/parallelizer.py, the M rows' yaml
    # ``parallelizer: _target_: nemo_automodel.components.moe.parallelizer.parallelize_model`` @ 89e3a9fdd604):
    # ``apply_fsdp`` is called without an mp_policy, so its default MixedPrecisionPolicy(param_dtype=bfloat16,
    # reduce_dtype=float32, output_dtype=bfloat16) shards every transformer block, the embedding and the head;
    # the grouped experts get ``fully_shard(experts, mesh=ep_shard_mesh, ...)`` with no mp_policy at all
    # (torch's default: no cast, the parameters' own dtype, bfloat16 from the model's ``self.to(dtype)``).
    # Its DeepSeek-V3 / Kimi-K2 MLA (components/models/deepseek_v3/layers.py ``MLA.forward`` @ 89e3a9fdd604)
    # applies rope_utils.apply_rotary_emb (x.float(), complex multiply, .to(bf16)) and torch.cat, and its Qwen3-MoE
    # (components/models/qwen3_moe/layers.py @ 8d9bfb90e3d8) gpt_oss/layers.py's rotate-half _apply_rotary_emb:
    # eager_rope (its dense models are Hugging Face's with Liger's fused rope).
    "automodel": Framework("te", "backward_pre", "NeMo AutoModel: FSDP2 with prefetch, Transformer Engine kernels",
                           True, fsdp="fsdp2", defer_grad_sync=True, moe_reduce_fp32=True,
                           expert_reduce_fp32=False, eager_rope=True),
    # llm-foundry's H100 and A100-80GB rows: "MP Mode DEFAULT", Composer's get_mixed_precision
    # (composer/trainer/mosaic_fsdp_utils.py of the torch 2.0 era): param_dtype bf16, reduce_dtype float32
    # its optimizer: Composer's unfused DecoupledAdamW and FSDP1's clip_grad_norm_ (sim.program.costs)
    "llm-foundry": Framework("triton", "backward_post",
                             "llm-foundry MPT on Composer FSDP1: Triton flash attention, BACKWARD_POST prefetch", True,
                             fsdp="fsdp1", reduce_fp32=True, optimizer="composer"),
    "deepspeed": Framework("fa2", "backward_pre",
                           "DeepSpeed ZeRO: hook-driven trace prefetch, persistent small parameters, FlashAttention-2",
                           True, deepspeed=True),
}
OVERHEAD_FRAMEWORKS = tuple(name for name, f in FRAMEWORKS.items() if f.kernel_overhead)
"""The frameworks whose kernels pay ``framework_kernel_overhead_s`` (module doc)."""
DEFAULT_FRAMEWORK = "megatron"


def framework_of(plan) -> Framework:
    """The plan's framework (Megatron-Core when none is given)."""
    return FRAMEWORKS[plan.framework or DEFAULT_FRAMEWORK]


def framework_named(name: str | None) -> Framework | None:
    """The framework called ``name`` (Megatron-Core for None); None for a name none has (the
    plan refuses it, naming the choices)."""
    return FRAMEWORKS.get(name or DEFAULT_FRAMEWORK)


def framework_name(plan) -> str:
    """The plan's framework's name (``DEFAULT_FRAMEWORK`` when none is given)."""
    return plan.framework or DEFAULT_FRAMEWORK


def kernel_overhead_s(plan, profile) -> float:
    """Seconds each kernel of the plan's framework costs over Megatron-Core's on ``profile``:
    the profile's fitted ``framework_kernel_overhead_s`` for it, 0 where it gives none or the
    framework pays none (module doc)."""
    name = framework_name(plan)
    if not FRAMEWORKS[name].kernel_overhead or not profile.framework_kernel_overhead_s:
        return 0.0
    return float(profile.framework_kernel_overhead_s.get(name, 0.0))


def p2p_blocks(plan) -> bool:
    """Whether each rank waits for its pipeline sends to finish before its next step.

    Megatron-Core's non-interleaved 1F1B (``forward_backward_pipelining_without_interleaving``,
    megatron/core/pipeline_parallel/schedules.py) exchanges each step's tensors through
    ``p2p_communication``'s ``send_forward``, ``send_forward_recv_backward``,
    ``send_backward_recv_forward`` and ``send_backward``, all of which call ``_communicate`` with
    ``wait_on_reqs=True``: the isend's request is waited on (``req.wait()``, which makes the
    compute stream wait for the NCCL transfer) before the schedule runs its next forward or
    backward, and, with ``batch_p2p_comm`` (Megatron-Bridge and NeMo set it for pp > 1 without
    interleaving: ``comm_overlap.py``), ``torch.cuda.synchronize()`` follows. So a stage's send
    of one micro-batch's activations (or their gradient) lies on its own critical path, where an
    asynchronous send would run beside its next step. The interleaved schedule overlaps them
    (``overlap_p2p_comm``, which Megatron-LM turns on by default and Megatron-Bridge and NeMo
    set for vpp > 1: ``wait_on_reqs=not overlap_p2p_comm``), and the PyTorch-native frameworks'
    ``torch.distributed.pipelining`` schedules send beside their next step too (``Schedule1F1B``
    and ``ScheduleGPipe`` keep each send's work in ``fwd_sends_to_wait`` / ``bwd_sends_to_wait``
    and wait on them later: torch/distributed/pipelining/schedules.py, "Delay send waits"). The host
    synchronisation itself is not priced: the host relaunches the next step's kernels ahead of
    them. Checked in Megatron-LM d98e8a64 (2026-08) and Megatron-Bridge r0.2.0 @ 0465189601951."""
    return plan.pp > 1 and plan.pipeline.waits_for_sends and framework_of(plan).megatron_schedules


def attention_kernel_in_effect(plan) -> str:
    """The attention kernel the plan runs: the one given, else its framework's ('te' under
    unfused attention, which has no attention kernel to price)."""
    if not plan.attention_mode.fused:
        return "te"
    return plan.attention_kernel or framework_of(plan).attention_kernel


# ---------------------------------------------------------------- the plan's sharding, resolved
@dataclass(frozen=True)
class ShardingStrategy:
    """How the plan's data-parallel states are gathered, reduced and held: its framework's
    FSDP or DeepSpeed ZeRO with the plan's own settings over the framework's (a given one
    wins), resolved once per plan (``ParallelPlan.sharding``, made by ``sharding_of``). Every
    value the program and the memory estimate read of FSDP and DeepSpeed is here; no other
    module compares the plan's framework with a name."""

    kind: str
    """Whose sharding runs the plan: "fsdp1" or "fsdp2" (``FSDP_KINDS``: PyTorch's FSDP, under
    ZeRO-3 only), "deepspeed" (DeepSpeed's engine, any stage), "" (Megatron-Core's DDP and
    distributed optimizer; a PyTorch framework below ZeRO-3)."""
    reduce_fp32_dense: bool
    """The gradients of a model without routed experts are reduced in fp32 (``reduce_fp32``)."""
    reduce_fp32_moe_dense: bool
    """The dense parameters' gradients of a model with routed experts are reduced in fp32."""
    reduce_fp32_experts: bool | None
    """The routed experts' gradients are reduced in fp32; None: as the same model's dense ones."""
    defer_grad_sync: bool
    """ZeRO-3's gradients reduce-scattered once per step (or schedule call), after the last
    micro-batch's backward (module doc, "Deferred gradient sync")."""
    reshard_after_forward: bool
    """ZeRO-3 frees a layer's gathered parameters after its forward (module doc)."""
    backward_prefetch: str
    """How ZeRO-3 prefetches in backward (``BACKWARD_PREFETCH``)."""
    pp_sync_window: int | None
    """Under FSDP2 with pipelining, the micro-batches of one pipeline-schedule call, across
    which the stage's parameters stay gathered and its gradients unreduced; None: no FSDP2 or
    no pipeline (``sharding_of``)."""
    schedule_calls: int
    """How many times a step runs the pipeline schedule (``pp_call_microbatches``: one call per
    that many micro-batches, AutoModel's one per accumulation step; else once)."""
    grad_buckets: GradBuckets
    """How the gradients below ZeRO-3 are bucketed (``GRAD_BUCKETS``): the plan's
    ``grad_buckets`` if given, else the framework's; uniform where FSDP or DeepSpeed runs the
    plan (they bucket by their own rules)."""
    overlap_comm: bool
    """DeepSpeed's ``overlap_comm``: as given, else on for ZeRO-3 only (``overlap_comm_valid``)."""
    bucket_buffers: int
    """DeepSpeed's gradient bucket buffers of ``reduce_bucket_size`` elements, allocated whatever
    the gradients' size with ``contiguous_gradients`` (on by default): one under ZeRO-3
    (stage3.py, after the optimizer states: ``bucket.buffer = torch.empty(
    self.reduce_bucket_size, ...)``), one under ZeRO-1/2 and a second with ``overlap_comm``
    (stage_1_and_2.py ``setup_buckets``: "double buffers to avoid data access conflict");
    none without ZeRO or outside DeepSpeed."""
    max_live_parameters: float | None
    """ZeRO-3's cap on gathered parameters (elements): as given, else DeepSpeed's default
    under DeepSpeed, else none."""
    persistence_threshold: float | None
    """DeepSpeed's ``stage3_param_persistence_threshold`` (elements; None: not DeepSpeed,
    nothing persists)."""
    prefetch_bucket_size: float
    """DeepSpeed's ``stage3_prefetch_bucket_size`` (elements): as given, else its default."""
    max_reuse_distance: float
    """DeepSpeed's ``stage3_max_reuse_distance`` (elements): as given, else its default."""

    @property
    def fsdp(self) -> str:
        """The PyTorch FSDP that runs the plan's ZeRO-3 ("fsdp1", "fsdp2"), "" when none does
        (another framework, or a ZeRO stage that does not shard the parameters)."""
        return self.kind if self.kind in FSDP_KINDS else ""

    @property
    def fsdp2(self) -> bool:
        """PyTorch's FSDP2 (``fully_shard``) runs the plan's ZeRO-3."""
        return self.kind == "fsdp2"

    @property
    def deepspeed(self) -> bool:
        """DeepSpeed's engine runs the plan's data parallelism (module doc)."""
        return self.kind == "deepspeed"

    @property
    def prefetch_after_backward(self) -> bool:
        """FSDP1's BACKWARD_POST: a layer's backward all-gather is issued in the post-backward hook
        of the layer after it, with the host one layer ahead of the GPU under ``limit_all_gathers``
        (``sim.program.training.zero3_gather``: backward depth 1, reductions first)."""
        return self.backward_prefetch == "backward_post"

    def reduce_fp32(self, moe: bool = False, experts: bool = False) -> bool:
        """Whether the data-parallel gradients are reduced in fp32: as given
        (``accumulate_allreduce_grads_in_fp32``, every gradient), else as the framework's FSDP
        does under ZeRO-3 (``Framework.reduce_fp32``; for a model with routed experts, ``moe``,
        ``Framework.moe_reduce_fp32`` for its dense parameters and, ``experts``, the routed
        experts' ``Framework.expert_reduce_fp32``), else not (16-bit, Megatron-Core's
        distributed optimizer with grad_sync_dtype bf16 and PyTorch DDP)."""
        if experts and self.reduce_fp32_experts is not None:
            return self.reduce_fp32_experts
        return self.reduce_fp32_moe_dense if moe else self.reduce_fp32_dense


def _given(value, default):
    return default if value is None else value


def sharding_of(plan) -> ShardingStrategy:
    """The plan's ``ShardingStrategy``: its framework's (``FRAMEWORKS``) with the plan's
    settings over it. The rules, each from the source the module doc names:

    - the FSDP runs only under ZeRO-3; DeepSpeed's engine at any stage;
    - reduce dtype: ``grad_reduce_fp32`` given sets every gradient's; else the framework's
      FSDP's per parallelizer (dense, MoE-dense, experts), else 16-bit;
    - deferred gradient sync: always under FSDP2 with pipelining (torch pipelining's
      ``backward_maybe_with_nosync``, whatever is given), else as given
      (``defer_fsdp_grad_sync``), else the framework's; never without a PyTorch FSDP;
    - ``reshard_after_forward``: as given, else not where the framework keeps the gathered
      parameters under pipelining (``Framework.reshard_under_pp``), else yes (FSDP's
      default, FSDP1's FULL_SHARD);
    - the sync window under FSDP2 with pipelining: ``pp_call_microbatches``, else all of the
      step's micro-batches. NeMo AutoModel calls the schedule once per accumulation step with
      ``local_batch_size / micro_batch_size`` micro-batches (recipes/llm/train_ft.py
      ``_forward_backward_step``: ``self.pp.info.schedule.step``; components/distributed/
      pipelining/functional.py: ``n_microbatches = local_batch_size // microbatch_size``; at
      89e3a9fdd604), and torchtitan too (train.py ``forward_backward_step``, one
      ``pp_schedule.step`` per gradient-accumulation step);
    - DeepSpeed's values as given, else ``DeepSpeedZeroConfig``'s defaults (``DEEPSPEED_*``)."""
    f = framework_of(plan)
    zero = plan.zero
    kind = "deepspeed" if f.deepspeed else f.fsdp if zero.shards_params else ""
    fsdp = kind if kind in FSDP_KINDS else ""
    if plan.grad_reduce_fp32 is not None:
        dense = moe_dense = experts = plan.grad_reduce_fp32
    elif not fsdp:
        dense = moe_dense = experts = False
    else:
        dense, experts = f.reduce_fp32, f.expert_reduce_fp32
        moe_dense = _given(f.moe_reduce_fp32, dense)
    if not fsdp:
        defer = False
    elif fsdp == "fsdp2" and plan.pp > 1:
        defer = True
    else:
        defer = _given(plan.defer_fsdp_grad_sync, f.defer_grad_sync)
    overlap_comm = _given(plan.overlap_comm, zero.shards_params)
    if not f.deepspeed or not zero.shards_optimizer or plan.contiguous_gradients is False:
        buffers = 0
    else:
        buffers = 1 if zero.shards_params else 1 + overlap_comm
    return ShardingStrategy(
        kind=kind, reduce_fp32_dense=dense, reduce_fp32_moe_dense=moe_dense, reduce_fp32_experts=experts,
        defer_grad_sync=defer,
        reshard_after_forward=_given(plan.reshard_after_forward, f.reshard_under_pp or plan.pp <= 1),
        backward_prefetch=plan.backward_prefetch or f.backward_prefetch,
        pp_sync_window=(plan.pp_call_microbatches or plan.num_microbatches) if fsdp == "fsdp2" and plan.pp > 1
        else None,
        schedule_calls=plan.num_microbatches // plan.pp_call_microbatches if plan.pp_call_microbatches else 1,
        grad_buckets=GRAD_BUCKETS["uniform" if kind else (plan.grad_buckets or f.grad_buckets)],
        overlap_comm=overlap_comm, bucket_buffers=buffers,
        max_live_parameters=plan.zero3_max_live_parameters
        if plan.zero3_max_live_parameters is not None or not f.deepspeed else DEEPSPEED_MAX_LIVE_PARAMETERS,
        persistence_threshold=_given(plan.zero3_param_persistence_threshold, DEEPSPEED_PERSISTENCE_THRESHOLD)
        if f.deepspeed else None,
        prefetch_bucket_size=_given(plan.zero3_prefetch_bucket_size, DEEPSPEED_PREFETCH_BUCKET),
        max_reuse_distance=_given(plan.zero3_max_reuse_distance, DEEPSPEED_MAX_REUSE_DISTANCE))


# ---------------------------------------------------------------- DeepSpeed's ZeRO
DEEPSPEED_ONLY = ("zero3_param_persistence_threshold", "zero3_max_reuse_distance", "overlap_comm",
                  "contiguous_gradients")
"""Settings only DeepSpeed has (refused under another framework)."""


def layer_tensors(model: ModelSpec, tp: int) -> tuple[float, ...]:
    """The parameter tensors (elements on one of ``tp`` ranks) of a transformer layer of a
    model without layer patterns or MLA, in Megatron-Core's layout (the one
    ``sim.inputs.model.layer_param_split`` counts): the two norms (weight, and bias under
    LayerNorm, h each), the fused QKV weight and bias, the output projection and its bias,
    the MLP's input (gate and up fused under SwiGLU) and output weights and their biases.
    Column-parallel tensors are split over tp, row-parallel biases and norms are not."""
    m, h, t = model, model.hidden_size, tp
    qkv, f_up = m.q_dim + 2 * m.kv_dim, (2 if m.mlp == "swiglu" else 1) * m.ffn_hidden_size
    norms = (h,) * (2 * (m.norm_params // h))
    weights = (h * qkv / t, m.q_dim * h / t, h * f_up / t, m.ffn_hidden_size * h / t)
    biases = (qkv / t, h, f_up / t, h) if m.bias else ()
    return norms + weights + biases


def _persistent(sizes, threshold: float | None) -> float:
    return 0.0 if threshold is None else float(sum(n for n in sizes if n <= threshold))


def persistent_params(model: ModelSpec, plan, layer: int) -> float:
    """Elements of ``layer`` (-1: the embedding, ``num_layers``: the head) on one rank that
    DeepSpeed never partitions: each tensor of at most the persistence threshold (none
    outside DeepSpeed). The embedding's tensors are the word table (V·h/t) and the learned
    positions; the head's the final norm and the untied output matrix (V·h/t)."""
    threshold, h, t = plan.sharding.persistence_threshold, model.hidden_size, plan.tp
    if threshold is None:
        return 0.0
    if layer == -1:
        pos = model.max_position_embeddings if model.position_embedding == "learned" else 0
        return _persistent((model.vocab_size * h / t, pos * h / t), threshold)
    if layer == model.num_layers:
        norms = (h / t,) * (model.norm_params // h)  # the head's bytes count the final norm over tp too
        return _persistent(norms + (() if model.tied_embeddings else (model.vocab_size * h / t,)), threshold)
    return _persistent(layer_tensors(model, t), threshold)


DEEPSPEED_FETCHES_PER_LAYER = 6
"""Module hooks that fetch in one transformer layer, at least: the modules that hold its
parameters in Megatron-Core's fused layout (two norms, QKV, projection, MLP in and out).
Every module's pre-forward hook calls ``fetch_sub_module``, which prefetches a bucket;
Hugging Face's unfused q, k, v, gate and up and the container modules add more."""


def deepspeed_prefetch_depth(model: ModelSpec, plan) -> int:
    """Layers gathered ahead of the one in use under DeepSpeed's ZeRO-3 (module doc): none
    without a prefetch bucket; the live-parameter cap's when the layer's fetches times the
    bucket reach its partitioned parameters (the frontier outruns the compute until
    ``stage3_max_live_parameters`` stops it); else one."""
    bucket = plan.sharding.prefetch_bucket_size
    per_layer = layer_params_per_rank(model, plan.tp) - persistent_params(model, plan, 0)
    if bucket <= 0 or per_layer <= 0:
        return 0
    if DEEPSPEED_FETCHES_PER_LAYER * bucket < per_layer:
        return 1
    return max(0, int(plan.sharding.max_live_parameters // per_layer) - 1)


def deepspeed_kept_layers(model: ModelSpec, plan, layers: list[int]) -> frozenset[int]:
    """Layers (ids of ``layers``, in forward order: -1 the embedding, ``num_layers`` the
    head) whose forward gather DeepSpeed keeps for the backward that follows: after a
    module's forward, ``__params_to_release`` walks the trace on and keeps its parameters
    when it meets them again before ``stage3_max_reuse_distance`` elements. From layer i the
    walk crosses the forward of the layers after it and their backward (each layer one
    module here, all its parameters counted) before it reaches i's backward."""
    distance = plan.sharding.max_reuse_distance
    t = plan.tp
    size = {-1: model.embedding_params / t, model.num_layers: model.output_params / t}
    kept, after = set(), 0.0
    for lid in reversed(layers):
        if 2 * after < distance:
            kept.add(lid)
        after += size.get(lid, layer_params_per_rank(model, t))
    return frozenset(kept)
