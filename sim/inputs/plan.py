"""How a model is spread over GPUs: the parallel plan.

A ``ParallelPlan`` is the execution half of the three inputs (model, hardware, plan),
kept apart as Calculon keeps them: data-parallel (``dp``), tensor-parallel (``tp``,
Megatron's column/row split) and pipeline-parallel (``pp``) degrees with
``dp · tp · pp = world_size``, virtual pipeline chunks per GPU (``vpp``), the pipeline
schedule, Megatron sequence parallelism, micro-batching, activation recomputation, the
ZeRO stage, DDP's gradient buckets, where ranks sit (``placement``, see
``sim.inputs.placement``) and how layers are split over pipeline stages. Like torchtitan's
``ParallelDims``, it checks itself on construction and a bad value is a one-line
``InputError`` naming the factor; checks that need the model (heads divisible by tp,
layers splittable over the stages) live in ``check_model``.

Layer split (Megatron-LM's ``get_num_layers_to_build`` and
``get_transformer_layer_offset``). Virtual stage ``c·pp + r`` is model chunk c of
pipeline rank r, so the model runs through rank 0..pp−1 with chunk 0, then again with
chunk 1, and so on. By default the ``num_layers`` split evenly over the ``pp·vpp``
virtual stages. Two ways to balance unevenly, which Megatron-LM will not combine:

* ``first_stage_layers`` / ``last_stage_layers`` (``--decoder-first-pipeline-num-layers``,
  ``--decoder-last-pipeline-num-layers``) fix the layers on the first / last pipeline
  rank; the remaining layers split evenly over the middle ranks, and every rank's layers
  split evenly over its vpp chunks.
* ``account_for_embedding`` / ``account_for_loss`` (``--account-for-embedding-in-pipeline-split``,
  ``--account-for-loss-in-pipeline-split``) count the embedding and the output layer with
  its loss as one transformer layer each: the ``num_layers + 1 (+1)`` "layers" split
  evenly over the virtual stages and the first (last) virtual stage builds one real layer
  fewer. Llama 3 405B's 126 layers on 16 stages become 7, 8 × 14, 7 (Llama 3 paper,
  §3.3.2; the Zero Bubble paper balances the same way).

Beyond Megatron-LM's two, ``layer_split`` gives each rank's (or virtual stage's) layers
for any layer count, or "auto" balances them, and ``pipeline_layout`` is Megatron-LM's
``--pipeline-model-parallel-layout`` string (``sim.inputs.layer_split``).

The embedding always runs on virtual stage 0 and the output layer and loss (and any
multi-token-prediction modules) on the last virtual stage, whichever split is used.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property, lru_cache, partial

from sim.inputs import placement as _pl, rules as _rules, strategies as _st
from sim.inputs.cuda_graphs import SCOPES as CUDA_GRAPH_SCOPES, parse_cuda_graph
from sim.inputs.experts import DISPATCHERS
from sim.inputs.fields import fields_of_class, setting, why_not_field
from sim.inputs.frameworks import ATTENTION_KERNELS, BACKWARD_PREFETCH, FRAMEWORKS, GRAD_BUCKETS, \
    PYTORCH_DDP_BUCKET_BYTES, ShardingStrategy, sharding_of
from sim.inputs.precision import CURRENT_TE, FP4_FORMAT, FP4_RECIPES, FP8_FORMATS, FP8_RECIPE_CHOICES, TE_VERSION, \
    Precision, canonical_fp8_recipe, check_precision_plan, check_precision_weights, precision_of
from sim.inputs.recompute import RECOMPUTE_METHODS, RECOMPUTE_MODULES, modules_in_effect, parse_recompute_modules
from sim.inputs.plan_sections import PlanSections, loss_kernels
from sim.inputs.layer_split import parse_layer_split, split_layers, split_layers_cached
from sim.errors import InputError, require
from sim.units import NONNEGATIVE_INT, POSITIVE_INT, Number, parse_size

RECOMPUTE = tuple(_st.RECOMPUTE_POLICIES)
ATTENTION = tuple(_st.ATTENTION_MODES)
CROSS_ENTROPY = ("megatron", "megatron-fused", "te", "pytorch")
"""How the loss is computed over the logits (``sim.program.workload.head_work``):
Megatron-LM's vocab-parallel cross entropy (its default), the same fused by
``--cross-entropy-loss-fusion``, Transformer Engine's fused kernels (the fusion with
``--cross-entropy-fusion-impl te``: ``ParallelPlan.loss_kernels``), or
``torch.nn.functional.cross_entropy`` in the training dtype (tp 1 only; what ``trainsim
validate``'s reference runs)."""
CROSS_ENTROPY_FUSION_IMPLS = ("native", "te")
"""Megatron-Core's ``--cross-entropy-fusion-impl``: which fused cross entropy
``--cross-entropy-loss-fusion`` runs (``megatron/core/models/common/language_module``)."""
ZERO_STAGES = tuple(_st.ZERO)
SCHEDULES = tuple(_st.PIPELINE_SCHEDULES)
DDP_BUCKET_BYTES = PYTORCH_DDP_BUCKET_BYTES
"""PyTorch DDP's default bucket, 25 MiB (``sim.inputs.frameworks.PYTORCH_DDP_BUCKET_BYTES``)."""



_ZERO = "zero_optimization"  # DeepSpeed's table and names
_EXPERTS = "mixture of experts: parallelism and routing"


def _cross_entropy(fused: bool) -> str:
    """``--cross-entropy-loss-fusion`` as the loss's kernels (``CROSS_ENTROPY``)."""
    return "megatron-fused" if fused else "megatron"


def _pos(field: str, value) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
            f"plan: {field}", value, "expected an integer > 0", setting=field)


def _check(cond: bool, field: str, value, allowed: str) -> None:
    """``require`` for the plan's attribute ``field`` (named as the user wrote it by the front end)."""
    require(cond, f"plan: {field}", value, allowed, setting=field)


@dataclass(frozen=True)
class ParallelPlan:
    """Parallel degrees, schedule, batching, recompute, ZeRO stage and rank placement of one run.

    This is the plan section of the settings schema (``sim.inputs.schema``): each field that
    a user sets is declared once, here, with ``setting(...)``: its name as a setting (the
    flag with dashes, the experiment-file key, the keyword of ``sim.run``; Megatron-LM's
    names), its help, its type and bounds, and how the user's value becomes the field's
    (``convert``). ``sim.inputs.resolve.plan_from_settings`` builds the plan from what a user
    gave, with ``dp`` (and, from the model, ``vpp`` and the prefetch depth) filled in; the
    program builder reads this object."""

    dp: int = 1
    """Data-parallel replicas (each replica is tp·pp·cp GPUs); not a setting: the cluster's
    GPUs fix it (``sim.inputs.resolve.plan_from_settings``)."""
    tp: int = setting(1, name="tensor_model_parallel_size", type=POSITIVE_INT, aliases=("--tp",),
                      help="tensor-parallel size: GPUs that split each layer (default 1)")
    """Tensor-parallel degree (Megatron column/row split of every layer)."""
    pp: int = setting(1, name="pipeline_model_parallel_size", type=POSITIVE_INT, aliases=("--pp",),
                      help="pipeline-parallel size: stages the layers are split into (default 1)")
    """Pipeline stages."""
    layers_per_virtual_stage: int | None = setting(
        name="num_layers_per_virtual_pipeline_stage", type=POSITIVE_INT,
        help="layers per model chunk (interleaved schedule; sets vpp)")
    """What sets ``vpp`` from the model's layers (``plan_from_settings``); kept as given."""
    vpp: int = setting(1, name="num_virtual_stages_per_pipeline_rank", type=POSITIVE_INT, aliases=("--vpp",),
                       help="model chunks per pipeline rank (vpp), Megatron-LM's alternative to the flag above")
    """Model chunks per pipeline stage (interleaved 1F1B when > 1)."""
    schedule: str | None = setting(
        help=lambda: f"pipeline schedule: {', '.join(s for s in SCHEDULES if s != 'custom')}, or a schedule .csv "
                     "file (default 1f1b, interleaved when vpp > 1)", metavar="NAME|CSV",
        path=lambda v: v.endswith(".csv"))
    """Pipeline schedule: 'gpipe', '1f1b' (PipeDream-Flush), 'interleaved' (interleaved
    1F1B, needs vpp > 1 and micro-batches a multiple of pp, Megatron-LM's rule), 'zb-h1',
    'zb-h2' (Zero Bubble, Qi et al. ICLR 2024) or 'custom' (a user's schedule CSV,
    ``schedule_file``). gpipe, 1f1b and zb-* run one chunk per stage (vpp = 1). None picks
    '1f1b', or 'interleaved' when vpp > 1 (what Megatron-LM runs for the same flags); after
    construction it is always one of the names."""
    schedule_file: str | None = None
    """The schedule .csv of schedule 'custom' (set from ``--schedule FILE.csv``)."""
    first_stage_layers: int | None = setting(
        name="decoder_first_pipeline_num_layers", type=POSITIVE_INT, metavar="N",
        help="transformer layers on the first pipeline stage (the rest split evenly)")
    """Transformer layers on the first pipeline rank; None: an even share. A multiple of vpp."""
    last_stage_layers: int | None = setting(
        name="decoder_last_pipeline_num_layers", type=POSITIVE_INT, metavar="N",
        help="transformer layers on the last pipeline stage (the rest split evenly)")
    """Transformer layers on the last pipeline rank; None: an even share. A multiple of vpp."""
    layer_split: tuple[int, ...] | str | None = setting(
        metavar="N,N,...|auto", convert=parse_layer_split,
        help="transformer layers per pipeline stage, first to last, e.g. 10,10,12 (any layer count; with vpp > 1 "
             "one entry per stage, split over its chunks as evenly as possible, or one per virtual stage), or "
             "auto: the split that balances the stages' estimated times on their GPUs")
    """Transformer layers on each pipeline rank, first to last (pp entries, each split over the
    rank's vpp chunks as evenly as possible, the earlier chunks one more), or on each virtual
    stage (pp·vpp entries, index ``chunk·pp + rank``; ``sim.inputs.layer_split``); "auto"
    until ``sim.session`` balances the stages on their GPUs (as even as possible meanwhile);
    None: the split above."""
    pipeline_layout: str | None = setting(
        name="pipeline_model_parallel_layout", metavar="LAYOUT",
        help="Megatron-LM's layout of every virtual stage: E embedding, t transformer layer, m MTP layer, L loss, "
             "stages separated by |, with (...)*N and x*N repeats, e.g. 'Et*3|(tt|)*29,t|tL'; its stage count "
             "(pp x vpp) sets vpp")
    """What each virtual stage builds, as the user wrote it (``sim.inputs.layer_split``:
    Megatron-LM's ``PipelineParallelLayerLayout``); it sets ``vpp``."""
    account_for_embedding: bool = setting(
        False, name="account_for_embedding_in_pipeline_split", kind="switch",
        help="count the embedding as one layer when splitting layers over stages")
    """The first virtual stage gets one layer fewer."""
    account_for_loss: bool = setting(
        False, name="account_for_loss_in_pipeline_split", kind="switch",
        help="count the output layer and loss as one layer when splitting layers over stages")
    """The last virtual stage gets one layer fewer."""
    placement: str = setting(
        _pl.DEFAULT_PLACEMENT, help="order of tp, pp, dp from innermost (consecutive ranks) to outermost "
                                    "(default tp-pp-dp; Megatron-LM's order is tp-dp-pp)")
    """Order of the parallel dimensions from innermost (consecutive global ranks) to
    outermost, a permutation of tp, pp, dp joined by '-'. Default 'tp-pp-dp': TP inside a
    node, then the pipeline stages of a replica, then the replicas ('tp-dp-pp' under
    context parallelism, Megatron-LM's order)."""
    sequence_parallel: bool = setting(False, kind="switch",
                                      help="Megatron-LM sequence parallelism in the tensor-parallel group")
    """Norms, dropout and residuals split over the tp group. A no-op when tp = 1 (as in Megatron-LM)."""
    tp_comm_overlap: bool = setting(
        False, kind="switch", help="overlap tensor-parallel all-gathers and reduce-scatters with the GEMMs beside "
                                   "them, in tp chunks (Megatron-LM/Transformer Engine; needs --sequence-parallel)")
    """Transformer Engine's userbuffers (``sim.program.tp``)."""
    tp_comm_overlap_cfg: str | None = setting(
        metavar="NAME|SPEC",
        help="with --tp-comm-overlap, Transformer Engine's overlap method and SMs per GEMM: a configuration by name "
             "(te-1, te-2: TE's defaults; NeMo's userbuffers_* names; dgxc-25.02-gpt3-175b, "
             "dgxc-25.02-llama3.1-405b) or GEMM=METHOD[:NUM_SM][:margin][:aggregate][:splits=N] entries after an "
             "optional name, comma-separated; each GEMM beside an overlap runs on the SMs it leaves (default: TE's "
             "default methods, GEMMs slowed by overlap_compute_slowdown beside a reduce-scatter)")
    """``sim.inputs.tp_overlap``; None: trainsim's older model (its module doc)."""
    cp: int = setting(
        1, name="context_parallel_size", type=POSITIVE_INT, aliases=("--cp",),
        help="context-parallel size: GPUs each sequence is split over (ring attention or an all-gather of keys "
             "and values; inside the data-parallel dimension, cp innermost; default 1)")
    """Context-parallel size (``sim.program.context_parallel``). They sit inside the data-parallel
    dimension, cp innermost, and reduce gradients with it: ``dp_group`` has dp·cp ranks."""
    cp_comm_type: str = setting("p2p", choices=("p2p", "all-gather"),
                                help="how context-parallel attention gets the other chunks' keys and values: p2p "
                                     "(ring attention, overlapped with compute; the default) or all-gather "
                                     "(Llama 3's)")
    ep: int = setting(
        1, name="expert_model_parallel_size", type=POSITIVE_INT, group=_EXPERTS, aliases=("--ep",),
        help="expert-parallel size: GPUs each MoE layer's routed experts are spread over, folded out of each "
             "stage's tp x dp GPUs (default 1)")
    """The GPUs a layer's routed experts are spread over (``sim.inputs.experts``)."""
    etp: int | None = setting(name="expert_tensor_parallel_size", type=POSITIVE_INT, group=_EXPERTS, aliases=("--etp",),
                              help="GPUs each expert is split over (default: the tensor-parallel size)")
    moe_routing: str = setting(
        "balanced", metavar="MODEL|FILE", group=_EXPERTS, path=lambda v: v.endswith((".json", ".csv")),
        help="tokens per expert: balanced, round-robin (token i takes experts k*i..k*i+k-1: the benchmarks' fake "
             "balanced gate), zipf:S (expert popularity by rank^-S), dirichlet:A (popularity drawn "
             "from a Dirichlet of concentration A) or a histogram .json/.csv of tokens per expert measured from a "
             "router (default balanced)")
    """``sim.program.routing``."""
    moe_capacity_factor: float | None = setting(
        name="moe_expert_capacity_factor", type=Number(float, above=0), group=_EXPERTS,
        help="expert capacity as a multiple of the balanced load; tokens above it are dropped (default: dropless)")
    moe_seed: int = setting(0, name="moe_routing_seed", type=int, group=_EXPERTS,
                            help="seed of the routing draws (default 0)")
    overlap_moe_expert_parallel_comm: bool = setting(
        False, kind="switch", group=_EXPERTS,
        help="hide the expert-parallel all-to-alls of one micro-batch under another's compute: in 1F1B's steady "
             "state each forward and the backward beside it run interleaved layer by layer (Megatron-Core's "
             "combined 1F1B; needs ep > 1, and interleaving (vpp > 1) when pp > 1)")
    """``sim.program.ep_overlap``."""
    dispatcher: str = setting(
        "alltoall", name="moe_token_dispatcher_type", choices=DISPATCHERS, group=_EXPERTS, aliases=("--dispatcher",),
        help="how tokens reach their experts (Megatron-Core's dispatchers): alltoall (an all-to-all over the "
             "expert-parallel group, every routed copy sent; the default), allgather (the tokens all-gathered over "
             "the tp x ep group, the outputs reduce-scattered back) or flex (DeepEP: each token crosses InfiniBand "
             "once per node it reaches, then NVLink to its experts' GPUs); allgather and flex need ep > 1")
    """``sim.program.dispatch``."""
    moe_flex_dispatcher_backend: str = setting(
        "deepep", choices=tuple(_st.FLEX_BACKENDS), group=_EXPERTS,
        help="the flex dispatcher's kernels (Megatron-Core's --moe-flex-dispatcher-backend): deepep (DeepEP, then "
             "Transformer Engine's permutation; the default) or hybridep (HybridEP, Megatron-Core's backend for an "
             "NVL72 rack: its permutation pads each expert's rows for FP8 GEMMs, so no padding kernels run); needs "
             "moe_token_dispatcher_type flex")
    """``sim.inputs.strategies.FLEX_BACKENDS``."""
    moe_flex_num_sms: int | None = setting(
        type=POSITIVE_INT, group=_EXPERTS,
        help="SMs the flex dispatcher's kernels hold while they run, taken from the shared experts beside them "
             "(Megatron-Core's moe_deepep_num_sms / moe_hybridep_num_sms; default the backend's: 20 DeepEP, "
             "16 HybridEP); needs moe_token_dispatcher_type flex")
    """``sim.program.workload_moe``: ``MoeShape.sms``."""
    moe_permute_fusion: bool = setting(
        False, kind="switch", group=_EXPERTS,
        help="fuse the token permutation and unpermutation into Transformer Engine's moe_permute kernels (one "
             "gather or scatter-and-sum pass over the routed copies instead of PyTorch's index, sort and gather "
             "ops; default off, as in Megatron-Core)")
    """``sim.program.workload_moe``: the permute and unpermute kernels."""
    moe_shared_expert_overlap: bool = setting(
        False, kind="switch", group=_EXPERTS,
        help="run the shared experts on their own stream beside the dispatch and combine exchanges (Megatron-Core's "
             "--moe-shared-expert-overlap; needs shared experts and the alltoall or flex dispatcher)")
    """``sim.program.workload_moe``: the shared experts beside the token exchanges."""
    cuda_graph: tuple[str, ...] | None = setting(
        kind="list", metavar="SCOPE", convert=parse_cuda_graph,
        help=f"launch these parts of each layer as CUDA graphs (Megatron-Core's --cuda-graph-impl local with "
             f"--cuda-graph-modules, formerly --enable-cuda-graph --cuda-graph-scope): {', '.join(CUDA_GRAPH_SCOPES)}; "
             f"default none. A graph over the MoE block (moe, full, full_iteration) removes the host's per-kernel "
             f"launch cost and needs drop-padding MoE (moe_expert_capacity_factor)")
    """``sim.inputs.cuda_graphs``; None: no graphs."""
    micro_batch_size: int = setting(1, type=POSITIVE_INT, help="sequences per micro-batch (default 1)")
    """Sequences per micro-batch per data-parallel replica (b)."""
    global_batch_size: int | None = setting(type=POSITIVE_INT, help="default micro-batch size x data-parallel size")
    """Sequences per optimizer step over all replicas (B); None means micro_batch_size·dp."""
    recompute: str = setting("none", name="recompute_granularity", choices=RECOMPUTE, aliases=("--recompute",),
                             help="activation recomputation in backward (default none)")
    """'selective' recomputes the attention core (or ``recompute_modules``), 'full' the whole layer."""
    recompute_modules: tuple[str, ...] | None = setting(
        kind="list", metavar="MODULE", convert=parse_recompute_modules,
        help=f"with --recompute-granularity selective, the modules recomputed in backward (Megatron-Core's names, "
             f"space- or comma-separated: {', '.join(RECOMPUTE_MODULES)}; default core_attn)")
    """``sim.inputs.recompute``; None: ``DEFAULT_MODULES`` under selective."""
    recompute_method: str | None = setting(
        choices=RECOMPUTE_METHODS,
        help="with --recompute-granularity full, which layers recompute (Megatron-Core's --recompute-method): block "
             "(the first --recompute-num-layers of each model chunk, the rest keep their activations) or uniform "
             "(every group of that many layers from one checkpoint); default every layer from its own checkpoint")
    """``sim.inputs.recompute``; None: every layer recomputed from its own input (uniform, 1)."""
    recompute_num_layers: int | None = setting(
        type=POSITIVE_INT,
        help="with --recompute-method, the layers per model chunk (block) or per checkpoint (uniform): "
             "Megatron-Core's --recompute-num-layers")
    """``sim.inputs.recompute``; needs ``recompute_method``."""
    attention: str = setting(
        "flash", choices=ATTENTION,
        help="how attention runs: flash (one fused kernel: FlashAttention or cuDNN, Megatron-Core with Transformer "
             "Engine; the default) or unfused (Megatron-LM without --use-flash-attn: QK^T and AV as batched GEMMs, "
             "softmax and dropout over the s x s scores in memory)")
    framework: str | None = setting(
        choices=tuple(FRAMEWORKS),
        help="the training framework that ran: megatron (Megatron-Core / NeMo, what the presets are fitted to; the "
             "default), torchtitan (FSDP2, SDPA's FlashAttention-2), automodel (NeMo AutoModel: FSDP2, Transformer "
             "Engine kernels), llm-foundry (MPT on Composer's FSDP1: Triton flash attention, BACKWARD_POST "
             "prefetch) or deepspeed (DeepSpeed's ZeRO: trace prefetch, persistent small parameters, overlap_comm; "
             "FlashAttention-2); sets the defaults of --attention-kernel and --backward-prefetch")
    """``sim.inputs.frameworks``; None: Megatron-Core."""
    attention_kernel: str | None = setting(
        choices=ATTENTION_KERNELS,
        help="the fused attention kernel: te (Transformer Engine's: cuDNN, FlashAttention-3 class on Hopper, the "
             "profile's own), fa2 (FlashAttention-2, PyTorch SDPA's flash backend) or triton (FlashAttention in "
             "Triton, llm-foundry's attn_impl triton); each at the profile's attention_kernel_speed (default: the "
             "framework's)")
    """``sim.inputs.frameworks``; None: the framework's."""
    fp8_format: str | None = setting(
        choices=FP8_FORMATS,
        help="train the transformer layers' GEMMs in FP8 with Transformer Engine: e4m3 (all tensors E4M3) or hybrid "
             "(E4M3 forward, E5M2 gradients); needs a GPU with an FP8 peak (H100, H200, B200, GB200, GB300); default off (BF16)")
    """``sim.program.fp8``; None: BF16."""
    fp8_recipe: str = setting(
        "delayed", choices=FP8_RECIPE_CHOICES,
        help="with --fp8-format, how Transformer Engine scales FP8 tensors: delayed (a per-tensor scale from an "
             "amax history; the default), tensorwise (per-tensor current scaling: an amax pass before each cast; "
             "current-scaling is another name for it), "
             "mxfp8 (an E8M0 scale per 32 elements; Blackwell) or blockwise (FP32 scales per 1x128 and 128x128 "
             "blocks, DeepSeek-V3's)")
    """``sim.inputs.precision``'s ``RECIPES`` (an alias is stored as the recipe it names)."""
    fp4_recipe: str | None = setting(
        choices=FP4_RECIPES,
        help="train the transformer layers' GEMMs in NVFP4 (Megatron-LM's --fp4-recipe; E2M1 with an E4M3 scale per "
             "16 elements and an FP32 scale per tensor, Transformer Engine's NVFP4BlockScaling); needs a GPU with an "
             "FP4 peak (B200, GB200, GB300); not with --fp8-format; default off")
    """``sim.inputs.precision``; None: no FP4 (unless ``fp4_format`` is set)."""
    fp4_format: str | None = setting(
        choices=(FP4_FORMAT,),
        help="train in FP4 as Megatron-LM's --fp4-format e2m1 does: the same as --fp4-recipe nvfp4 (its default "
             "recipe); default off")
    """``sim.inputs.precision``; None: FP4 only through ``fp4_recipe``."""
    transformer_engine: str | None = setting(
        type=TE_VERSION, metavar="VERSION",
        help=f"the Transformer Engine release that runs FP8 and FP4, e.g. 2.9 or 1.14.0: from 2.0, per-tensor FP8 "
             f"(delayed, tensorwise) on a GPU whose FP8 GEMMs take any operand layout (B200, GB200, GB300) makes no "
             f"transposed FP8 copies; each recipe needs the release that added it (tensorwise 2.2, mxfp8 2.0, "
             f"blockwise 2.3, nvfp4 2.8); default {CURRENT_TE}, the newest release")
    """``sim.inputs.precision.te_version``; None: ``CURRENT_TE``."""
    zero_stage: int = setting(0, name="zero", type=int, choices=ZERO_STAGES, help="ZeRO stage (default 0)",
                              tables=(("plan", "zero"), (_ZERO, "stage")))
    """ZeRO stage over the dp group: 0 none, 1 optimizer states, 2 +gradients, 3 +parameters."""
    zero3_prefetch_depth: int = setting(1, type=NONNEGATIVE_INT, metavar="N",
                                        help="ZeRO-3: layers whose parameters are gathered ahead (default 1)")
    """0: each gather waits until its layer is needed."""
    zero3_prefetch_bucket_size: float | None = setting(
        type=Number(float, minimum=0), metavar="PARAMS", tables=((_ZERO, "stage3_prefetch_bucket_size"),),
        help="ZeRO-3: parameters gathered ahead, as DeepSpeed's stage3_prefetch_bucket_size (sets the depth in "
             "whole layers)")
    """What sets ``zero3_prefetch_depth`` from the model's layers (``plan_from_settings``); kept as given."""
    zero3_max_live_parameters: float | None = setting(
        type=Number(float, above=0), metavar="PARAMS", tables=((_ZERO, "stage3_max_live_parameters"),),
        help="ZeRO-3: most gathered parameters alive at once (DeepSpeed stage3_max_live_parameters)")
    """Caps the prefetch depth. None: no cap."""
    backward_prefetch: str | None = setting(
        choices=BACKWARD_PREFETCH,
        help="ZeRO-3 / FSDP: when a layer's all-gather for backward is issued (PyTorch FSDP1's names): backward_pre "
             "(under the backward of the layer after it, up to --zero3-prefetch-depth layers ahead) or backward_post "
             "(in the post-backward hook of the layer after it, which FSDP1's limit_all_gathers lets the host reach "
             "as the GPU starts that layer's backward: the gather runs under it, after the previous layer's "
             "reduce-scatter; Composer's default); default: the framework's")
    """``sim.inputs.frameworks``; None: the framework's."""
    reshard_after_forward: bool | None = setting(
        kind="bool",
        help="ZeRO-3 / FSDP: free each layer's gathered parameters after its forward and gather them again for "
             "backward (FSDP2's reshard_after_forward, FSDP1's FULL_SHARD); "
             "--no-reshard-after-forward keeps them until the layer's backward is done (FSDP1's SHARD_GRAD_OP); "
             "default: the framework's, off for torchtitan under pipelining (its reshard_after_forward_policy "
             "'default': not pp_enabled), on otherwise")
    """``sim.program.zero.add_param_gathers``; None: the framework's
    (``ParallelPlan.sharding``, ``sim.inputs.frameworks.sharding_of``)."""
    defer_fsdp_grad_sync: bool | None = setting(
        kind="bool",
        help="ZeRO-3 / FSDP with gradient accumulation: reduce-scatter each layer's gradients once per step, after "
             "the last micro-batch's backward, keeping the unsharded gradients until then (NeMo AutoModel's "
             "defer_fsdp_grad_sync); default: the framework's, on for automodel, off otherwise (every micro-batch); "
             "always on under pipelining, where torch's pipeline stage defers it (backward_maybe_with_nosync)")
    """``ParallelPlan.sharding.defer_grad_sync``; None: the framework's."""
    pp_call_microbatches: int | None = setting(
        type=Number(int, minimum=1), metavar="M",
        help="ZeRO-3 under FSDP2 with pipeline parallelism: micro-batches per call of the pipeline schedule (torch "
             "pipelining's schedule.step; NeMo AutoModel: step_scheduler.local_batch_size / micro_batch_size, one "
             "call per accumulation step): the schedule runs once per call, each with its own fill and drain, and "
             "each stage's parameters stay gathered and its gradients unreduced across a call, synced after its "
             "last backward; must divide the micro-batches; default: all of the step's (one call)")
    """``ParallelPlan.sharding.pp_sync_window``; None: one call per step."""
    zero3_param_persistence_threshold: float | None = setting(
        type=Number(float, minimum=0), metavar="PARAMS", tables=((_ZERO, "stage3_param_persistence_threshold"),),
        help="DeepSpeed ZeRO-3: parameter tensors of at most this many elements are never partitioned, stay "
             "gathered and are not fetched (stage3_param_persistence_threshold; default 1e5 under --framework "
             "deepspeed, which alone has it)")
    """``sim.inputs.frameworks.persistent_params``; None: DeepSpeed's default."""
    zero3_max_reuse_distance: float | None = setting(
        type=Number(float, minimum=0), metavar="PARAMS", tables=((_ZERO, "stage3_max_reuse_distance"),),
        help="DeepSpeed ZeRO-3: a layer gathered for forward stays gathered for its backward when fewer "
             "parameters than this are used in between (stage3_max_reuse_distance; default 1e9 under --framework "
             "deepspeed, which alone has it)")
    """``sim.inputs.frameworks.deepspeed_kept_layers``; None: DeepSpeed's default."""
    overlap_comm: bool | None = setting(
        kind="bool", tables=((_ZERO, "overlap_comm"),),
        help="DeepSpeed: reduce the gradient buckets on a stream of their own, under backward; --no-overlap-comm "
             "reduces them on the compute stream (default: on for --zero 3, off otherwise, DeepSpeed's; "
             "--framework deepspeed only)")
    """``ParallelPlan.sharding.overlap_comm``; None: DeepSpeed's default."""
    contiguous_gradients: bool | None = setting(
        kind="bool", tables=((_ZERO, "contiguous_gradients"),),
        help="DeepSpeed: copy each gradient into a bucket buffer of the reduce bucket's size, allocated up front "
             "(two under ZeRO-1/2 with --overlap-comm); --no-contiguous-gradients reduces the gradients where "
             "they are (default on, DeepSpeed's; --framework deepspeed only)")
    """``ParallelPlan.sharding.bucket_buffers``; None: DeepSpeed's default (on)."""
    zero_bucket_size_bytes: int | None = setting(
        name="zero_bucket_size", metavar="BYTES", convert=partial(parse_size, field="--zero-bucket-size"),
        help="ZeRO-2/3 gradient reduce-scatter bucket, e.g. 500MB (default: --bucket-size; under --framework "
             "deepspeed, ZeRO-1/2/3's reduce bucket, default reduce_bucket_size 5e8 elements)")
    """DeepSpeed ``reduce_bucket_size``; None uses ``bucket_size_bytes``."""
    fp8_param_gather: bool = setting(
        False, kind="switch",
        help="with --fp8-format and a sharded optimizer (--zero 1, 2 or 3): keep the GEMM weights in FP8 and "
             "all-gather them in FP8 (MXFP8 ones: in BF16, quantized after; Megatron-LM's flag, NeMo's fp8_params; "
             "default off)")
    """``sim.program.fp8``."""
    param_gather_overlap: bool = setting(
        False, name="overlap_param_gather", kind="switch",
        help="ZeRO-1/2: all-gather the updated parameters bucket by bucket during the next step's forward, ahead of "
             "their first use, instead of after the optimizer step (Megatron-LM's flag, with "
             "--use-distributed-optimizer; default off)")
    offload_optimizer: bool = setting(False, kind="switch", tables=((_ZERO, "offload_optimizer"),),
                                      help="ZeRO-Offload: optimizer states in host memory, optimizer step on the CPU")
    """Gradients go to the host and updated parameters come back over PCIe."""
    cpu_offloading_num_layers: int | None = setting(
        type=POSITIVE_INT,
        help="activation offload to host memory (Megatron-Core's cpu_offloading with cpu_offloading_num_layers, "
             "activations only, as Megatron-Bridge's GB200/GB300 recipes set it): the saved activations of the "
             "first N transformer layers go to the host on a copy stream in forward and come back before their "
             "backward (Transformer Engine's cpu_offload; default off)")
    """``sim.program.activation_offload``; None: off."""
    gradient_accumulation_fusion: bool = setting(
        True, kind="bool",
        help="weight-gradient GEMMs accumulate into the fp32 main gradients (default on, Megatron-LM's); "
             "--no-gradient-accumulation-fusion adds each micro-batch's in a separate pass, as plain PyTorch does")
    """``sim.program.ops.accumulate_wgrads``."""
    cross_entropy: str = setting(
        "megatron", name="cross_entropy_loss_fusion", kind="switch", convert=_cross_entropy,
        help="the loss's vocab-parallel cross entropy in Megatron-LM's fused kernels (torch.compile: 32 bytes per "
             "logit over forward and backward, against 52 unfused; default off, as in Megatron-LM)")
    """``CROSS_ENTROPY``: the loss's kernels over the b·s × V/t logits."""
    cross_entropy_impl: str = setting(
        "native", name="cross_entropy_fusion_impl", choices=CROSS_ENTROPY_FUSION_IMPLS,
        help="which fused cross entropy --cross-entropy-loss-fusion runs: Megatron-LM's own (native, default) or "
             "Transformer Engine's Triton kernels (te: an online softmax, then the gradient written over the "
             "logits in the forward; 10 bytes per bf16 logit over forward and backward)")
    """``CROSS_ENTROPY_FUSION_IMPLS``; ``loss_kernels`` combines it with ``cross_entropy``."""
    dp_overlap: bool = setting(True, name="overlap_grad_reduce", kind="bool",
                               help="overlap the data-parallel gradient all-reduce with backward (default on)")
    """DDP buckets are reduced as soon as their gradients are ready; False syncs after the whole backward."""
    grad_reduce_fp32: bool | None = setting(
        name="accumulate_allreduce_grads_in_fp32", kind="bool",
        help="reduce the data-parallel gradients in fp32, 4 bytes a parameter (Megatron-LM's default for bf16, its "
             "gradient buffer being the fp32 main gradients; default: the framework's, off but for the FSDP of "
             "llm-foundry and torchtitan under --zero 3 (reduce_dtype float32) and of automodel's MoE models but their "
             "routed experts: 16-bit, as PyTorch DDP and NeMo's distributed optimizer with grad_sync_dtype bf16 "
             "reduce them; given, it sets every gradient's)")
    """``GRAD_REDUCE_BYTES``: bytes per parameter the gradient all-reduce or reduce-scatter moves;
    None: the framework's (``ParallelPlan.sharding.reduce_fp32``)."""
    check_for_nan_in_grad: bool = setting(
        True, kind="bool",
        help="Megatron-Core's DDP takes the L2 norm of each gradient bucket before its reduction, a pass over the "
             "bucket on the compute stream (DistributedDataParallelConfig.check_for_nan_in_grad: on in Megatron-LM, "
             "--check-for-nan-in-loss-and-grad, and in NeMo's recipes; default on)")
    """``sim.program.training.grad_prep``: one read of each bucket's gradients before its collective."""
    ddp_average_in_collective: bool = setting(
        False, kind="bool",
        help="Megatron-Core's DDP averages the gradients in the collective (NCCL's AVG) instead of scaling each "
             "bucket by 1/dp in place before it (DistributedDataParallelConfig.average_in_collective; experts' "
             "buckets are still scaled, by 1/ep; default off, Megatron-LM's --ddp-average-in-collective; NeMo's "
             "recipes turn it on)")
    """``sim.program.training.grad_prep``: which buckets Megatron-Core scales in place before their collective."""
    bucket_size_bytes: int | None = setting(
        name="bucket_size", metavar="BYTES", convert=partial(parse_size, field="--bucket-size"),
        help="gradient bucket size in 16-bit bytes, e.g. 25MiB (default: the framework's: under Megatron-Core "
             "max(40M, 1M x dp) parameters, 2 bytes each; else PyTorch DDP's 25 MiB)")
    """DDP gradient bucket size in bytes of 16-bit gradients; None: the framework's
    (``sim.program.memory.states.ddp_bucket_bytes``)."""
    grad_buckets: str | None = setting(
        choices=tuple(GRAD_BUCKETS),
        help="how the gradients are packed into data-parallel buckets below ZeRO-3: megatron-core (a bucket "
             "never spans two model chunks; one bucket for a whole chunk on pipeline stages after the first and "
             "on model chunks after the first, as Megatron-Core's DDP), uniform (--bucket-size everywhere, as "
             "PyTorch DDP) or apex (one bucket a model chunk under interleaving, else a layer, as NeMo 1.0's "
             "Apex distributed Adam); default: the framework's")
    """``ParallelPlan.sharding.grad_buckets``; None: the framework's (``sim.inputs.frameworks.GRAD_BUCKETS``)."""

    def __post_init__(self):
        _pos("dp", self.dp)  # (not a setting: the GPUs fix it)
        # each field alone, against its one declaration: the schema's (``_check_fields``); the
        # values the plan fills in; then the rules between fields, ``sim.inputs.rules.check_plan``'s
        _check_fields(self)
        if self.global_batch_size is None:
            object.__setattr__(self, "global_batch_size", self.micro_batch_size * self.dp)
        _check(self.cross_entropy in CROSS_ENTROPY, "cross_entropy", self.cross_entropy,  # (converted from a switch)
                f"allowed: {', '.join(CROSS_ENTROPY)}")
        # precision: its own rules (sim.inputs.precision)
        check_precision_plan(self)
        object.__setattr__(self, "fp8_recipe", canonical_fp8_recipe(self.fp8_recipe))
        if self.bucket_size_bytes is not None:
            _pos("bucket_size_bytes", self.bucket_size_bytes)  # (converted from a size: "25MiB")
        if self.zero_bucket_size_bytes is not None:
            _pos("zero_bucket_size_bytes", self.zero_bucket_size_bytes)
        check_precision_weights(self)
        _pl.parse_placement(self.placement)
        if self.recompute_modules is not None:
            object.__setattr__(self, "recompute_modules", parse_recompute_modules(self.recompute_modules))
        object.__setattr__(self, "cuda_graph", parse_cuda_graph(self.cuda_graph))
        if self.pipeline_layout is not None:  # (a layout of pp·k stages sets vpp = k)
            object.__setattr__(self, "vpp", _rules.vpp_of_layout(self))
        if self.schedule is None:
            object.__setattr__(self, "schedule", "interleaved" if self.vpp > 1 else "1f1b")
        _rules.check_plan(self)

    def summary(self) -> dict:
        """The plan's fields as JSON-ready values; the settings that only set other fields
        (``layers_per_virtual_stage`` sets vpp, ``zero3_prefetch_bucket_size`` the depth), the
        pipeline layout, the schedule file and the framework settings are left out when not given
        (``reshard_after_forward``, ``grad_reduce_fp32`` and ``defer_fsdp_grad_sync`` when the
        framework's; ``pp_call_microbatches`` when not given)."""
        out = dataclasses.asdict(self)
        for name in ("layers_per_virtual_stage", "schedule_file", "zero3_prefetch_bucket_size", "pipeline_layout",
                     "recompute_modules", "recompute_method", "recompute_num_layers", "framework", "attention_kernel",
                     "backward_prefetch", "fp4_format", "transformer_engine",
                     "tp_comm_overlap_cfg", "grad_reduce_fp32", "defer_fsdp_grad_sync", "pp_call_microbatches",
                     "reshard_after_forward"):
            if out[name] is None:
                del out[name]
        return out

    @cached_property
    def sections(self) -> PlanSections:
        """The plan in its typed sections (``sim.inputs.plan_sections``): ``plan.sections.moe``
        holds the MoE fields, frozen and hashable, for the functions that read them whole."""
        return PlanSections.of(self)

    @property
    def precision(self) -> Precision | None:
        """The layers' GEMM precision as one object (``sim.inputs.precision``); None: BF16."""
        return precision_of(self)

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def dp_cp(self) -> int:
        """Ranks a stage's parameters are replicated over, and its gradients reduced and ZeRO
        states sharded over: data × context parallel (Megatron's data-parallel group with CP)."""
        return self.dp * self.cp

    def cp_group(self, rank: int) -> tuple:
        """Global ranks of ``rank``'s context-parallel group (consecutive along dp), by cp index."""
        d, p, t = self.coords(rank)
        base = d - d % self.cp
        return tuple(self.rank(dp=base + i, pp=p, tp=t) for i in range(self.cp))

    @property
    def pipeline(self) -> _st.PipelineSchedule:
        """The schedule's strategy (``sim.inputs.strategies``)."""
        return _st.schedule_named(self.schedule)

    @property
    def token_dispatcher(self) -> _st.TokenDispatcher:
        """The MoE token dispatcher's strategy (``sim.inputs.strategies``)."""
        return _st.dispatcher_named(self.dispatcher, self.moe_flex_dispatcher_backend)

    @property
    def attention_mode(self) -> _st.AttentionMode:
        """How attention runs (``sim.inputs.strategies``)."""
        return _st.attention_named(self.attention)

    @property
    def loss_kernels(self) -> str:
        """The loss's kernels (``CROSS_ENTROPY``): the fused loss in its implementation's."""
        return loss_kernels(self.cross_entropy, self.cross_entropy_impl)

    @property
    def recompute_policy(self) -> _st.RecomputePolicy:
        """The activation recomputation's strategy (``sim.inputs.strategies``)."""
        return _st.recompute_named(self.recompute)

    @property
    def zero(self) -> _st.ZeroStage:
        """What the ZeRO stage shards (``sim.inputs.strategies``)."""
        return _st.zero_stage_of(self.zero_stage)

    @cached_property
    def sharding(self) -> ShardingStrategy:
        """How the data-parallel states are gathered, reduced and held: the framework's FSDP or
        DeepSpeed ZeRO with the plan's own settings over it, resolved once
        (``sim.inputs.frameworks.sharding_of``)."""
        return sharding_of(self)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per replica (m)."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def sp(self) -> bool:
        """Whether sequence parallelism is in effect (requested and tp > 1)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def recomputed_modules(self) -> tuple[str, ...]:
        """The modules recomputed in backward (``sim.inputs.recompute.modules_in_effect``):
        none unless ``recompute`` is 'selective'."""
        return modules_in_effect(self.recompute, self.recompute_modules)

    @property
    def recompute_label(self) -> str:
        """The granularity, with the modules when they were given: 'selective (layernorm, moe_act)'."""
        mods = self.recompute_modules
        if self.recompute_method is not None:
            return f"{self.recompute} ({self.recompute_method}, {self.recompute_num_layers} layers)"
        return self.recompute if mods is None else f"{self.recompute} ({', '.join(mods)})"

    @property
    def num_virtual_stages(self) -> int:
        """pp · vpp: the model chunks the layers are split into."""
        return self.pp * self.vpp

    @property
    def uneven(self) -> bool:
        """Whether any of the uneven-split options is set."""
        return (self.first_stage_layers is not None or self.last_stage_layers is not None
                or self.layer_split not in (None, "auto") or self.pipeline_layout is not None
                or self.account_for_embedding or self.account_for_loss)

    # ------------------------------------------------------------- placement
    def _sizes(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp * self.cp}

    @property
    def placement_order(self) -> tuple:
        """The dimensions innermost first, e.g. ('tp', 'pp', 'dp')."""
        return _pl.parse_placement(self.placement)

    def coords(self, rank: int) -> tuple:
        """``(dp_index, pp_index, tp_index)`` of global ``rank`` under ``placement``; with
        context parallelism the dp index runs over dp·cp, the cp index innermost."""
        c = _pl.coords(rank, self.placement_order, self._sizes())
        return c["dp"], c["pp"], c["tp"]

    def rank(self, dp: int = 0, pp: int = 0, tp: int = 0) -> int:
        """The global rank with these indices (the inverse of ``coords``)."""
        return _pl.rank_of({"dp": dp, "pp": pp, "tp": tp}, self.placement_order, self._sizes())

    def tp_group(self, rank: int) -> tuple:
        """Global ranks of ``rank``'s tensor-parallel group, by tp index."""
        return _pl.group(rank, "tp", self.placement_order, self._sizes())

    def pp_group(self, rank: int) -> tuple:
        """Global ranks of ``rank``'s pipeline, by stage."""
        return _pl.group(rank, "pp", self.placement_order, self._sizes())

    def dp_group(self, rank: int) -> tuple:
        """Global ranks of ``rank``'s data-parallel group, by replica."""
        return _pl.group(rank, "dp", self.placement_order, self._sizes())

    def groups(self, dim: str) -> tuple:
        """Every group along ``dim`` ('tp', 'pp' or 'dp'), ordered by first member."""
        return _pl.groups(dim, self.placement_order, self._sizes())

    def max_nodes_spanned(self, dim: str, gpus_per_node: int) -> int:
        """The most nodes a ``dim`` group touches (1: all stay inside a node)."""
        return _pl.max_nodes_spanned(dim, self.placement_order, self._sizes(), gpus_per_node)

    # ----------------------------------------------------------- layer split
    def stage_layers(self, model) -> tuple:
        """Transformer layers of each virtual stage; index ``chunk·pp + pp_rank``."""
        args = (model.num_layers, self.sections.pipeline, getattr(model, "name", "the model"),
                getattr(model, "mtp_num_layers", 0))
        try:
            hash(args)
        except TypeError:  # (a split given as a list: worked out each time)
            return split_layers(*args)
        return split_layers_cached(*args)

    def layer_range(self, model, virtual_stage: int) -> range:
        """Global indices of the transformer layers of ``virtual_stage``."""
        n = self.num_virtual_stages
        require(isinstance(virtual_stage, int) and 0 <= virtual_stage < n, "virtual_stage", virtual_stage,
                f"expected 0..{n - 1} (pp x vpp = {self.pp} x {self.vpp})")
        layers = self.stage_layers(model)
        start = sum(layers[:virtual_stage])
        return range(start, start + layers[virtual_stage])

    def layers_per_chunk(self, model) -> int:
        """Layers in each model chunk when the split is even (a stage holds vpp chunks)."""
        layers = set(self.stage_layers(model))
        require(len(layers) == 1, "plan: layer split", self.stage_layers(model),
                "chunks differ in size; use stage_layers(model) for an uneven split")
        return layers.pop()

    @classmethod
    def for_world(cls, world_size: int, **kw) -> "ParallelPlan":
        """A plan whose dp fills ``world_size`` given tp and pp (each must divide it)."""
        _pos("world_size", world_size)
        tp, pp, cp = kw.get("tp", 1), kw.get("pp", 1), kw.get("cp", 1)
        _pos("tp", tp)
        _pos("pp", pp)
        _pos("cp", cp)
        names, sizes = ("tp x pp", f"{tp} x {pp}") if cp == 1 else ("tp x pp x cp", f"{tp} x {pp} x {cp}")
        _check(world_size % (tp * pp * cp) == 0, "world_size", world_size,
                f"must be a multiple of {names} = {sizes} = {tp * pp * cp}")
        return cls(dp=world_size // (tp * pp * cp), **kw)

    def check_model(self, model) -> None:
        """Checks that need the model (``sim.inputs.rules.check_model``): each factor must split
        the layer it cuts, and the layers must split over the (virtual) pipeline stages."""
        _rules.check_model(self, model)

    @property
    def etp_size(self) -> int:
        """Expert tensor-parallel size in effect (``etp``, default tp)."""
        return self.tp if self.etp is None else self.etp


_LABELS = {"dispatcher": "moe_token_dispatcher_type"}
"""Fields whose errors name their setting, the attribute's name being the program's own."""
_CHECKED_BY_RULES = ("first_stage_layers", "last_stage_layers")
"""Bounds checked in order with the field's other rules (``sim.inputs.rules``), naming its flag."""


@lru_cache(maxsize=1)
def _declared() -> tuple:
    """(attribute, schema entry, default) of each plan setting whose attribute holds the value as
    given (no ``convert``): what ``_check_fields`` checks."""
    defaults = {f.name: f.default for f in dataclasses.fields(ParallelPlan)}
    return tuple((f.attr, f, defaults[f.attr]) for f in fields_of_class(ParallelPlan, "plan")
                 if f.convert is None and f.attr not in _CHECKED_BY_RULES)


def _check_fields(plan: ParallelPlan) -> None:
    """Each field of ``plan`` against its declaration (``setting(...)``: type, bounds, choices,
    ``sim.inputs.fields.why_not_field``), the one place its bounds live, so that a plan built
    in Python is refused as a flag or a file's key is, naming the attribute (``plan: tp: got 0;
    expected an integer >= 1``). A value left at its default is not checked again."""
    for attr, f, default in _declared():
        value = getattr(plan, attr)
        if value is default or (value == default and type(value) is type(default)):
            continue
        why = why_not_field(f, value)
        if why is not None:
            name = _LABELS.get(attr, attr)
            raise InputError(field=f"plan: {name}", value=value, allowed=why, setting=attr)
