"""Selective recomputation by module: which parts of a layer recompute their forward in backward.

Megatron-Core's ``--recompute-granularity selective`` recomputes the submodules named by
``--recompute-modules`` (``TransformerConfig.recompute_modules``, default ``core_attn``; the
names below are Megatron-Core's, which NeMo uses too). Each keeps only what its recompute
needs and runs its forward again at the start of the layer's backward
(``sim.program.workload``); what it frees is ``sim.program.memory.activations``'):

    core_attn       the attention core (standard checkpoint): frees what it stores beyond
                    Q, K and V (flash: the log-sum-exp; unfused: the s x s softmax and its
                    dropout)
    layernorm       the input and pre-MLP norms (output-discarding checkpoint): frees their
                    outputs, which the QKV and MLP-up (or MoE) GEMMs would store
    mla_up_proj     MLA's query and key/value up-projections with RoPE (output-discarding):
                    frees Q, K and V
    mlp             a dense layer's MLP (standard checkpoint; no-op on MoE layers): keeps its
                    input, frees the up/gate outputs and the down-projection's input
    moe             the whole MoE block (standard checkpoint: router, dispatch and combine
                    all-to-alls, experts, shared experts all run again): keeps its input only
    moe_act         the routed experts' activation function (output-discarding): frees its
                    output, the experts' down-projection input
    shared_experts  the shared experts (standard checkpoint): keep their input, free the rest

Megatron-Core applies the list only under ``selective`` and ignores it otherwise; here a
list beside another granularity is refused, as is a module the model does not have (an
expert module on a dense model, ``mla_up_proj`` without MLA, ``mlp`` without dense layers),
and ``moe_act`` / ``layernorm`` under FP8 delayed scaling (Megatron-Core's own rule; its other
recipes may, since core_v0.14.0). The
flag takes the names space-separated as Megatron-LM does (``--recompute-modules moe_act
layernorm``) or comma-separated; an experiment file a list or such a string.

Full recomputation of some layers (Megatron-Core's ``--recompute-granularity full
--recompute-method block|uniform --recompute-num-layers N``; ``TransformerBlock._checkpointed_forward``
walks the layers of one model chunk, so both count per virtual pipeline chunk):

    block      the first N layers of each chunk recompute their whole forward from their
               input (one checkpoint each); the others keep their activations as without
               recomputation
    uniform    the chunk's layers in groups of N, each group one checkpoint: only the
               group's input is kept, and its backward first re-runs the forward of all N
               layers (so all N layers' activations are held at once); a last group of
               fewer layers when N does not divide the chunk's

``full`` without a method is every layer from its own checkpoint (uniform with N = 1), as
trainsim always ran it (Megatron-Core itself asks for a method). Refused as Megatron-Core
refuses them (``TransformerConfig.__post_init__``): a method or N beside another granularity
than full (Megatron-Core: "When using recompute_granularity: selective recompute_num_layers
must be None"; a method outside full is ignored there), a method without N, N without a
method, N above the layers of a pipeline rank (its message: "between 1 and
num_layers_per_pipeline_rank"), and uniform with N > 1 on a model with multi-token
prediction (``MultiTokenPredictionLayer``: "recompute_num_layers must be 1 for MTP
recompute"); under block the MTP layers do not recompute (Megatron-Core skips them).
"""

from __future__ import annotations

from sim.inputs.fields import name_list
from sim.inputs.strategies import RECOMPUTE_POLICIES

RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")
"""Megatron-Core's ``recompute_modules`` choices that trainsim models (module doc)."""
DEFAULT_MODULES = ("core_attn",)
"""What ``selective`` recomputes when no modules are given (Megatron-Core's default)."""
EXPERT_MODULES = ("moe", "moe_act", "shared_experts")
RECOMPUTE_METHODS = ("block", "uniform")
"""Megatron-Core's ``--recompute-method`` choices (module doc)."""
FIELD = "recompute_modules"


def parse_recompute_modules(value) -> tuple[str, ...] | None:
    """The modules as a tuple in ``RECOMPUTE_MODULES`` order, each once: from a list of
    names (the flag's words, an experiment file's list) or a string of names separated by
    commas or spaces. Refused: an empty list, or a name not in ``RECOMPUTE_MODULES``."""
    return name_list(value, RECOMPUTE_MODULES, FIELD, "module")


def modules_in_effect(recompute: str, modules=None) -> tuple[str, ...]:
    """The modules recomputed under granularity ``recompute``: none for 'none' and 'full'
    (full recomputes the whole layer), ``modules`` or ``DEFAULT_MODULES`` for 'selective'."""
    policy = RECOMPUTE_POLICIES.get(recompute)
    if policy is None or not policy.by_module:
        return ()
    return DEFAULT_MODULES if modules is None else tuple(modules)


def layer_recompute(plan, position: int) -> str:
    """The granularity the layer at ``position`` (0-based) of its model chunk runs under:
    the plan's, except under a recompute method (module doc): block recomputes the first
    ``recompute_num_layers`` ('full') and not the rest ('none'); uniform all ('full')."""
    if not plan.recompute_policy.whole_layer or plan.recompute_method is None:
        return plan.recompute
    if plan.recompute_method == "block":
        return "full" if position < plan.recompute_num_layers else "none"
    return "full"


def keeps_checkpoint(plan, position: int) -> bool:
    """Whether the layer at ``position`` of its chunk stores its input as a checkpoint under
    full recomputation: every layer, except under uniform only the first of each group of
    ``recompute_num_layers`` (the others' inputs are re-made by the group's recompute)."""
    if plan.recompute_method != "uniform":
        return True
    return position % plan.recompute_num_layers == 0


def mtp_recompute(plan) -> str:
    """The granularity of the multi-token-prediction layers: the plan's, except 'none' under
    block (Megatron-Core skips recompute there)."""
    return "none" if plan.recompute_method == "block" else plan.recompute
