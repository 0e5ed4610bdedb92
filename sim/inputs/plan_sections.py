"""The parallel plan in typed sections: what each part of the program reads of it.

``ParallelPlan`` (``sim.inputs.plan``) keeps its settings as flat fields, each declared once
with ``setting(...)`` (its flag, key, type, bounds and default), so that ``plan.tp`` and
``replace(plan, tp=4)`` read and write them. Its consumers take the plan by section instead
of as a dozen positional parameters: ``plan.sections.moe`` is a frozen ``MoePlan`` holding
the plan's MoE fields, hashable, so that a cached function keys on the sections it reads
(``sim.program.workload.layer_as_run`` on parallelism, recompute, precision and framework)
and a new field of a section reaches every such function without a new parameter.

The sections follow torchtitan's job config (``Parallelism``, ``Float8``,
``ActivationCheckpoint``, ...): each plan field belongs to exactly one (``SECTION_OF``), and
the same sections order the command line's ``--help`` groups and name the experiment
file's ``[plan.SECTION]`` tables. A section has no defaults of its own: it is always made
from a plan (``of``), whose fields hold them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sim.inputs import strategies as _st


class _Section:
    """What every section does: be made from a plan's fields of the same names."""

    TITLE = ""
    """The section's ``--help`` group (for the fields that name none of their own)."""

    @classmethod
    def of(cls, plan):
        """The section of ``plan`` (a ``ParallelPlan``): its fields, by name."""
        return cls(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class ParallelismPlan(_Section):
    """Data, tensor and context parallelism, where the ranks sit, and the batch."""

    TITLE = "parallelism and batch (Megatron-LM flags)"
    dp: int
    tp: int
    cp: int
    cp_comm_type: str
    sequence_parallel: bool
    placement: str
    micro_batch_size: int
    global_batch_size: int

    @property
    def sp(self) -> bool:
        """Whether sequence parallelism is in effect (requested and tp > 1)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per replica (m)."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)


@dataclass(frozen=True)
class PipelinePlan(_Section):
    """Pipeline stages, model chunks, the schedule and how the layers split over the stages."""

    TITLE = "pipeline parallelism and layer split"
    pp: int
    vpp: int
    layers_per_virtual_stage: int | None
    schedule: str
    schedule_file: str | None
    first_stage_layers: int | None
    last_stage_layers: int | None
    layer_split: tuple[int, ...] | str | None
    pipeline_layout: str | None
    account_for_embedding: bool
    account_for_loss: bool


@dataclass(frozen=True)
class MoePlan(_Section):
    """How a mixture of experts runs: expert parallelism, routing and the token dispatcher."""

    TITLE = "mixture of experts: parallelism and routing"
    ep: int
    etp: int | None
    moe_routing: str
    moe_capacity_factor: float | None
    moe_seed: int
    dispatcher: str
    moe_flex_dispatcher_backend: str
    moe_flex_num_sms: int | None
    overlap_moe_expert_parallel_comm: bool
    moe_permute_fusion: bool
    moe_shared_expert_overlap: bool


@dataclass(frozen=True)
class PrecisionPlan(_Section):
    """The GEMMs' number format (FP8 or FP4) and recipe, FP8 weights, and the Transformer Engine
    release that runs them."""

    TITLE = "precision (FP8 and FP4)"
    fp8_format: str | None
    fp8_recipe: str
    fp4_recipe: str | None
    fp4_format: str | None
    fp8_param_gather: bool
    transformer_engine: str | None

    @property
    def precision(self):
        """The GEMMs' precision as one object (``sim.inputs.precision.Precision``); None: BF16."""
        from sim.inputs.precision import precision_of

        return precision_of(self)


@dataclass(frozen=True)
class ZeroPlan(_Section):
    """The data-parallel gradients and optimizer: ZeRO stage and its DeepSpeed/FSDP knobs,
    buckets, the reduction's dtype, optimizer offload."""

    TITLE = "ZeRO, gradient reduction and the optimizer"
    zero_stage: int
    zero3_prefetch_depth: int
    zero3_prefetch_bucket_size: float | None
    zero3_max_live_parameters: float | None
    reshard_after_forward: bool | None
    defer_fsdp_grad_sync: bool | None
    pp_call_microbatches: int | None
    zero3_param_persistence_threshold: float | None
    zero3_max_reuse_distance: float | None
    overlap_comm: bool | None
    contiguous_gradients: bool | None
    zero_bucket_size_bytes: int | None
    offload_optimizer: bool
    bucket_size_bytes: int | None
    grad_buckets: str | None
    grad_reduce_fp32: bool | None
    check_for_nan_in_grad: bool
    ddp_average_in_collective: bool

    @property
    def zero(self) -> _st.ZeroStage:
        """What the stage shards (``sim.inputs.strategies``)."""
        return _st.zero_stage_of(self.zero_stage)


@dataclass(frozen=True)
class RecomputePlan(_Section):
    """What backward recomputes, and activations offloaded to the host."""

    TITLE = "activation recomputation and offload"
    recompute: str
    recompute_modules: tuple[str, ...] | None
    recompute_method: str | None
    recompute_num_layers: int | None
    cpu_offloading_num_layers: int | None

    @property
    def policy(self) -> _st.RecomputePolicy:
        """The granularity's strategy (``sim.inputs.strategies``)."""
        return _st.recompute_named(self.recompute)

    def at(self, recompute: str | None) -> "RecomputePlan":
        """This section with granularity ``recompute`` (None: as it is), for a layer that
        recomputes otherwise under a recompute method (``sim.inputs.recompute.layer_recompute``)."""
        return self if recompute is None or recompute == self.recompute else \
            dataclasses.replace(self, recompute=recompute)


@dataclass(frozen=True)
class OverlapPlan(_Section):
    """Communication hidden under compute: tensor-parallel userbuffers, the data-parallel
    gradient reduction and the ZeRO-1/2 parameter all-gather."""

    TITLE = "communication overlap"
    tp_comm_overlap: bool
    tp_comm_overlap_cfg: str | None
    dp_overlap: bool
    param_gather_overlap: bool


def loss_kernels(cross_entropy: str, fusion_impl: str) -> str:
    """The loss's kernels (``sim.inputs.plan.CROSS_ENTROPY``) for ``--cross-entropy-loss-fusion`` as
    ``cross_entropy`` and ``--cross-entropy-fusion-impl`` as ``fusion_impl``: Transformer
    Engine's where the fused loss runs its (Megatron-Core's ``compute_language_model_loss``:
    ``te_parallel_cross_entropy`` if ``cross_entropy_fusion_impl == 'te'``, else
    ``fused_vocab_parallel_cross_entropy``)."""
    return "te" if cross_entropy == "megatron-fused" and fusion_impl == "te" else cross_entropy


@dataclass(frozen=True)
class FrameworkPlan(_Section):
    """The training framework and the kernels it runs: attention, the loss, gradient
    accumulation, CUDA graphs, FSDP's prefetch."""

    TITLE = "framework and kernels"
    framework: str | None
    attention_kernel: str | None
    attention: str
    backward_prefetch: str | None
    cross_entropy: str
    cross_entropy_impl: str
    gradient_accumulation_fusion: bool
    cuda_graph: tuple[str, ...] | None

    @property
    def attention_mode(self) -> _st.AttentionMode:
        """How attention runs (``sim.inputs.strategies``)."""
        return _st.attention_named(self.attention)

    @property
    def loss_kernels(self) -> str:
        """The loss's kernels (``loss_kernels``)."""
        return loss_kernels(self.cross_entropy, self.cross_entropy_impl)

    @property
    def kernel(self) -> str:
        """The attention kernel in effect (``sim.inputs.frameworks.attention_kernel_in_effect``)."""
        from sim.inputs.frameworks import attention_kernel_in_effect

        return attention_kernel_in_effect(self)


@dataclass(frozen=True)
class PlanSections:
    """A plan's eight sections (``ParallelPlan.sections``)."""

    parallelism: ParallelismPlan
    pipeline: PipelinePlan
    moe: MoePlan
    precision: PrecisionPlan
    zero: ZeroPlan
    recompute: RecomputePlan
    overlap: OverlapPlan
    framework: FrameworkPlan

    @classmethod
    def of(cls, plan) -> "PlanSections":
        return cls(**{name: section.of(plan) for name, section in SECTIONS.items()})


SECTIONS: dict[str, type] = {
    "parallelism": ParallelismPlan, "pipeline": PipelinePlan, "moe": MoePlan, "precision": PrecisionPlan,
    "zero": ZeroPlan, "recompute": RecomputePlan, "overlap": OverlapPlan, "framework": FrameworkPlan}
"""Each section's class, by name, in the order of the ``--help`` groups."""


SECTION_OF: dict[str, str] = {f.name: name for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
"""The section each plan field belongs to, by field name."""
