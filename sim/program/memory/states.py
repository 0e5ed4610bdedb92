"""Model states and the buffers that carry them: the bytes behind a rank's parameters.

Model states (ZeRO, Rajbhandari et al. SC'20). Mixed-precision Adam keeps, per
parameter, a 16-bit weight (2Ψ bytes), a 16-bit gradient (2Ψ) and K = 12 bytes of
optimizer state (fp32 master weight, momentum, variance): 16Ψ in all. Over Nd
data-parallel ranks ZeRO shards them as

    stage 0:        2Ψ + 2Ψ + 12Ψ
    stage 1 (P_os):     4Ψ + 12Ψ/Nd
    stage 2 (P_os+g):   2Ψ + 14Ψ/Nd
    stage 3 (P_os+g+p): 16Ψ/Nd

where Ψ is the parameter count on the rank (its tensor- and pipeline-parallel shard,
``stage_params_per_rank``). A rank runs the optimizer step over the parameters whose
states it holds: Ψ, or Ψ/Nd from ZeRO-1 on (``optimizer_shard_params``).

16-bit copies. Every buffer that carries weights or gradients takes 2 bytes per
parameter:

- a layer's gradient on one tensor-parallel rank, which is also the size of ZeRO-3's
  all-gathered copy of its weights (``layer_param_bytes``: 2·layer parameters per rank
  for a transformer layer, 2·(V + positions)·h/t for the embedding, 2·(norm + untied
  output matrix)/t for the head);
- ZeRO-1/2's all-gather of the updated weights after the step, 2Ψ in all
  (``param_allgather_bytes``);
- ZeRO-Offload (Ren et al., USENIX ATC 2021): the 16-bit gradient shard copied to the
  host and the updated 16-bit weight shard copied back, 2Ψ/Nd each way
  (``offload_copy_bytes``). The KΨ/Nd bytes of optimizer state then live in host
  memory, not on the GPU.

Temporaries (DeepSpeed's knobs). ZeRO-3 holds the full weights of the layer in use and
of the layers prefetched ahead, at most ``stage3_max_live_parameters`` of them
(``zero3_gathered_param_bytes``; the simulator's prefetch depth under that cap is
``zero3_depth``). Gradients are reduced in buckets: DeepSpeed's ``reduce_bucket_size``
elements in 16 bits (``grad_bucket_bytes``); the simulator's bucket is the plan's
(``sync_bucket_bytes``).
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from functools import lru_cache

from sim.errors import require
from sim.inputs.frameworks import DEEPSPEED_BUCKET_ELEMS, DEEPSPEED_MAX_LIVE_PARAMETERS, deepspeed_prefetch_depth
from sim.inputs.layers import DenseMLP, FullAttention
from sim.inputs.model import ModelSpec, layer_param_split, layer_params_per_rank, mtp_param_split
from sim.inputs.moe import mla_projections
from sim.inputs.plan import DDP_BUCKET_BYTES, ParallelPlan
from sim.inputs.precision import RECIPES
from sim.inputs.strategies import zero_stage_of
from sim.program.fp8 import BF16_BYTES, weight_copy_bytes

DEEPSPEED_REDUCE_BUCKET_ELEMS = DEEPSPEED_BUCKET_ELEMS
"""DeepSpeed's default ``zero_optimization.reduce_bucket_size`` (elements)."""


@dataclass(frozen=True)
class ModelStates:
    """Bytes of weights, gradients and optimizer states on one rank."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def model_state_bytes(num_params: float, dp: int = 1, zero_stage: int = 0, *, param_bytes: int = 2,
                      grad_bytes: int = 2, optimizer_bytes: int = 12) -> ModelStates:
    """Weights, gradients and Adam states of ``num_params`` parameters on one of ``dp``
    ranks under ZeRO stage ``zero_stage`` (see the module doc)."""
    require(num_params >= 0, "num_params", num_params, "expected a count >= 0")
    require(isinstance(dp, int) and dp > 0, "dp", dp, "expected an integer > 0")
    zero = zero_stage_of(zero_stage)
    p, g, o = param_bytes * num_params, grad_bytes * num_params, optimizer_bytes * num_params
    return ModelStates(p / dp if zero.shards_params else p,
                       g / dp if zero.shards_grads else g,
                       o / dp if zero.shards_optimizer else o)


def optimizer_shard_params(num_params: float, dp: int, zero_stage: int) -> float:
    """Parameters whose optimizer step one of ``dp`` ranks runs: all ``num_params``
    without ZeRO, its 1/Nd shard from ZeRO-1 on."""
    return num_params / dp if zero_stage_of(zero_stage).shards_optimizer else num_params


# ------------------------------------------------------------------ parameters
def stage_params_per_rank(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Parameters one rank of pipeline stage ``stage`` holds (the layers of all its chunks,
    as ``plan.stage_layers`` splits them, plus the embedding on the first stage and the
    final norm and output layer on the last)."""
    dense, experts = stage_param_split(model, plan, stage)
    return dense + experts


@lru_cache(maxsize=256)
def stage_param_split(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters one rank of pipeline stage ``stage`` holds: the routed
    experts' (a mixture of experts' num_experts/ep per layer, split over etp; their states
    are sharded over the expert data-parallel group) and everything else. Remembered: the
    estimate asks it of each stage three times (``sim.program.estimate``), a search of
    thousands of plans."""
    plan.check_model(model)
    require(0 <= stage < plan.pp, "stage", stage, f"expected 0..{plan.pp - 1}")
    t, h = plan.tp, model.hidden_size
    if model.moe or model.layers is not None:  # layer by layer where layers differ
        n = experts = 0.0
        for c in range(plan.vpp):
            for lid in plan.layer_range(model, c * plan.pp + stage):
                d, x = layer_param_split(model, lid, t, plan.ep, plan.etp_size)
                n, experts = n + d, experts + x
    else:
        layers = plan.stage_layers(model)
        n = sum(layers[c * plan.pp + stage] for c in range(plan.vpp)) * layer_params_per_rank(model, t)
        experts = 0.0
    word = model.vocab_size * h / t                       # vocab-parallel table
    if stage == 0:
        pos = model.max_position_embeddings if model.position_embedding == "learned" else 0
        n += word + pos * h
    if stage == plan.pp - 1:
        n += model.norm_params
        if not model.tied_embeddings or plan.pp > 1:      # untied, or a tied copy on the last stage
            n += word
        for k in range(model.mtp_num_layers):             # multi-token prediction on the last stage
            d, x = mtp_param_split(model, k, t, plan.ep, plan.etp_size)
            n, experts = n + d, experts + x
        if model.mtp_num_layers and plan.pp > 1 and not model.tied_embeddings:
            n += word                                     # the embedding's copy its input is looked up in
    return n, experts


def expert_data_parallel(plan: ParallelPlan) -> int:
    """Ranks that hold the same experts (tp·dp / (etp·ep)): their states' ZeRO group."""
    return plan.tp * plan.dp_cp // (plan.etp_size * plan.ep)


def stage_model_states(model: ModelSpec, plan: ParallelPlan, stage: int) -> ModelStates:
    """Model states of a rank of ``stage``: dense ones sharded over dp, the experts' over
    the expert data-parallel group."""
    dense, experts = stage_param_split(model, plan, stage)
    a = model_state_bytes(dense, plan.dp_cp, plan.zero_stage)
    if not experts:
        return a
    b = model_state_bytes(experts, expert_data_parallel(plan), plan.zero_stage)
    return ModelStates(a.params_bytes + b.params_bytes, a.grads_bytes + b.grads_bytes,
                       a.optimizer_bytes + b.optimizer_bytes)


FP8_WEIGHT_COPY_BYTES = weight_copy_bytes(RECIPES["delayed"])
"""FP8 training: bytes per transformer-layer GEMM weight parameter of Transformer Engine's FP8
copies, the FP8 weight and its transpose for the input-gradient GEMM (TE's
``get_fp8_workspace`` keeps both while gradients are enabled), beside the 16-bit weight;
under the block-scaled recipes both copies carry their scales (``weight_copy_bytes``)."""


def fp8_layer_weights(model: ModelSpec, tp: int, layer: int) -> float:
    """Parameters of layer ``layer``'s FP8 GEMM weights on one of ``tp`` ranks
    (``sim.program.fp8.FP8_GEMMS``): its attention's (QKV and projection, or MLA's five
    projections, the down-projections replicated on every rank, and its projection) and its
    dense MLP's, or of a mixture-of-experts layer its shared experts' (its routed experts' are
    split by ep and etp, ``fp8_weight_copy_bytes`` counts them; its router stays BF16); 0 for
    the embedding (-1) and the head (``num_layers``)."""
    if not 0 <= layer < model.num_layers:
        return 0.0
    h = model.hidden_size
    width = 3 if model.mlp == "swiglu" else 2
    mlp = width * h * model.ffn_hidden_size / tp
    shared = width * h * (model.moe_shared_expert_intermediate_size or 0) / tp
    if model.mla:
        projections = mla_projections(model)
        attention = (sum(i * o for _, i, o, split in projections if split) / tp
                     + sum(i * o for _, i, o, split in projections if not split)
                     + model.num_attention_heads * model.v_head_dim * h / tp)
    else:
        attention = (h * (model.q_dim + 2 * model.kv_dim) + model.q_dim * h) / tp
    if model.layers is not None:  # only attention, dense MLP and MoE blocks run FP8 GEMMs (sim.program.fp8)
        lay = model.layer(layer)
        return ((attention if isinstance(lay.mixer, FullAttention) else 0)
                + (mlp if isinstance(lay.mlp, DenseMLP) else shared if lay.is_moe else 0))
    return attention + (shared if model.is_moe_layer(layer) else mlp)


def fp8_weight_copy_bytes(model: ModelSpec, plan: ParallelPlan, stage: int, any_layout: bool = False) -> float:
    """The FP8 weight copies (``weight_copy_bytes`` of the plan's recipe per parameter, ``fp8_layer_weights``)
    of the layers a rank of pipeline stage ``stage`` holds; not sharded by ZeRO (they are
    TE's buffers). 0 in BF16; under NVFP4 2·(1/2 + 1/256) bytes. With FP8 weights (``fp8_param_gather``) the copies take
    the 16-bit weight's 2 bytes, already in the parameters, so only what they hold beyond
    2 bytes counts: 0 per-tensor (the FP8 weight and its transpose), 2·(1 + 1/32) − 2 under
    MXFP8 (both copies with their scales; the BF16 gather lives in the gradient buffer,
    ``sim.program.fp8``'s module doc). The routed experts' GEMMs run in FP8 too: their
    weights (``stage_param_split``'s expert share) have copies as well. On a GPU whose FP8
    GEMMs take any layout (``any_layout``) a per-tensor weight under TE 2.0 or later has no
    transpose (``Precision.makes_fp8_transposes``): 1 byte a parameter, and with FP8 weights
    1 − 2 (the FP8 weight alone where the 16-bit one is counted)."""
    if plan.precision is None:
        return 0.0
    transposes = plan.precision.makes_fp8_transposes(any_layout)
    per_param = weight_copy_bytes(plan.precision.recipe, transposes) - (BF16_BYTES if plan.fp8_param_gather else 0)
    ids = [i for c in range(plan.vpp) for i in plan.layer_range(model, c * plan.pp + stage)]
    experts = stage_param_split(model, plan, stage)[1]
    return per_param * (sum(fp8_layer_weights(model, plan.tp, i) for i in ids) + experts)


# ------------------------------------------------------------- 16-bit copies
def layer_param_bytes(model: ModelSpec, tp: int, layer: int) -> float:
    """16-bit bytes of one layer's gradient (and of its gathered weights) on one of ``tp``
    tensor-parallel ranks; ``layer`` -1 is the embedding, ``num_layers`` the head."""
    if layer == -1:
        return 2.0 * model.embedding_params / tp
    if layer == model.num_layers:
        return 2.0 * model.output_params / tp
    return 2.0 * layer_params_per_rank(model, tp, layer if model.layers is not None else None)


def param_allgather_bytes(num_params: float) -> float:
    """ZeRO-1/2: the updated 16-bit weights of ``num_params`` parameters, all-gathered
    over the data-parallel group after the optimizer step (2Ψ)."""
    return 2.0 * num_params


def offload_copy_bytes(num_params: float, dp: int) -> float:
    """ZeRO-Offload: the 16-bit gradient shard a rank copies to the host, and the 16-bit
    weight shard it copies back, for ``num_params`` parameters over ``dp`` ranks (2Ψ/Nd)."""
    return 2.0 * num_params / dp


# ------------------------------------------------------------------ temporaries
def zero3_gathered_param_bytes(layer_params: float, prefetch_layers: int = 1, param_bytes: int = 2,
                               max_live_parameters: float = DEEPSPEED_MAX_LIVE_PARAMETERS) -> float:
    """ZeRO-3: full (dp-gathered) weights of the layer in use and of ``prefetch_layers``
    ahead, at most ``max_live_parameters`` (DeepSpeed ``stage3_max_live_parameters``)."""
    require(prefetch_layers >= 0, "prefetch_layers", prefetch_layers, "expected an integer >= 0")
    return param_bytes * min(layer_params * (1 + prefetch_layers), max(layer_params, max_live_parameters))


def zero3_depth(model: ModelSpec, plan: ParallelPlan) -> int:
    """Layers gathered ahead under ZeRO-3: the plan's depth, capped so that at most
    ``zero3_max_live_parameters`` gathered parameters are alive at once; under DeepSpeed
    its own (``sim.inputs.frameworks.deepspeed_prefetch_depth``)."""
    if plan.sharding.deepspeed:
        return deepspeed_prefetch_depth(model, plan)
    depth, live = plan.zero3_prefetch_depth, plan.sharding.max_live_parameters
    if live is not None:
        per_layer = layer_params_per_rank(model, plan.tp)
        depth = min(depth, max(0, int(live // per_layer) - 1))
    return depth


def grad_bucket_bytes(bucket_elems: float = DEEPSPEED_REDUCE_BUCKET_ELEMS, grad_bytes: int = 2) -> float:
    """A gradient communication bucket (DeepSpeed ``reduce_bucket_size`` elements)."""
    require(bucket_elems >= 0, "bucket_elems", bucket_elems, "expected a count >= 0")
    return grad_bytes * bucket_elems


def ddp_bucket_bytes(plan: ParallelPlan) -> float:
    """The DDP bucket in bytes of 16-bit gradients: ``bucket_size_bytes`` when given, else the
    framework's: under Megatron-Core's bucketing (``sim.inputs.frameworks.GRAD_BUCKETS``)
    max(40,000,000, 1,000,000 x dp) parameters, 2 bytes each; else PyTorch DDP's 25 MiB
    (``sim.inputs.plan.DDP_BUCKET_BYTES``)."""

    if plan.bucket_size_bytes is not None:
        return plan.bucket_size_bytes
    return plan.sharding.grad_buckets.default_bytes(plan.dp)


def sync_bucket_bytes(plan: ParallelPlan) -> float:
    """Bytes per gradient bucket the simulated sync packs: ZeRO-2/3's own reduce bucket
    (``zero_bucket_size_bytes``) when set, else the given DDP bucket or PyTorch DDP's 25 MiB;
    below ZeRO-2 the DDP bucket (``ddp_bucket_bytes``);
    without ``overlap_grad_reduce`` (ZeRO 0/1) one bucket of all the gradients, as
    Megatron-LM reduces them ("Set bucket_size to infinity if overlap_grad_reduce is
    False": megatron/core/distributed/distributed_data_parallel.py; the 2021 local DDP
    all-reduced its whole contiguous gradient buffer at once), its parameter all-gather
    too. Under DeepSpeed every stage's bucket is ``zero_bucket_size_bytes`` when set, else
    5e8 16-bit elements (``reduce_bucket_size``, ``allgather_bucket_size``, and the engine's
    all-reduce bucket without ZeRO: ``sim.inputs.frameworks``)."""
    if plan.sharding.deepspeed:
        return plan.zero_bucket_size_bytes or grad_bucket_bytes()
    if plan.zero.shards_grads:  # (not Megatron-Core's DDP: Megatron-FSDP and ZeRO-2 reduce by their own units)
        return plan.zero_bucket_size_bytes or plan.bucket_size_bytes or DDP_BUCKET_BYTES
    return ddp_bucket_bytes(plan) if plan.dp_overlap else math.inf
