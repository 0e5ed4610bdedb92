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
"""

from __future__ import annotations

from sim.errors import InputError, require

RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe", "moe_act", "shared_experts")
"""Megatron-Core's ``recompute_modules`` choices that trainsim models (module doc)."""
DEFAULT_MODULES = ("core_attn",)
"""What ``selective`` recomputes when no modules are given (Megatron-Core's default)."""
EXPERT_MODULES = ("moe", "moe_act", "shared_experts")
FIELD = "recompute_modules"


def _refuse(value, allowed: str) -> InputError:
    return InputError(field=f"plan: {FIELD}", value=value, allowed=allowed, setting=FIELD)


def parse_recompute_modules(value) -> tuple[str, ...] | None:
    """The modules as a tuple in ``RECOMPUTE_MODULES`` order, each once: from a list of
    names (the flag's words, an experiment file's list) or a string of names separated by
    commas or spaces. Refused: an empty list, or a name not in ``RECOMPUTE_MODULES``."""
    if value is None:
        return None
    words = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if words is None or not all(isinstance(w, str) for w in words):
        raise _refuse(value, f"expected module names, of {', '.join(RECOMPUTE_MODULES)}")
    names = [n for w in words for n in w.replace(",", " ").split()]
    if not names:
        raise _refuse(value, f"expected at least one module, of {', '.join(RECOMPUTE_MODULES)}")
    for n in names:
        if n not in RECOMPUTE_MODULES:
            raise _refuse(n, f"allowed: {', '.join(RECOMPUTE_MODULES)}")
    return tuple(m for m in RECOMPUTE_MODULES if m in names)


def modules_in_effect(recompute: str, modules=None) -> tuple[str, ...]:
    """The modules recomputed under granularity ``recompute``: none for 'none' and 'full'
    (full recomputes the whole layer), ``modules`` or ``DEFAULT_MODULES`` for 'selective'."""
    if recompute != "selective":
        return ()
    return DEFAULT_MODULES if modules is None else tuple(modules)


def check_recompute_plan(plan) -> tuple[str, ...] | None:
    """The plan's own rules (``ParallelPlan.__post_init__``): modules are known names, only
    beside ``selective``, and not ``moe_act`` or ``layernorm`` under FP8 delayed scaling. Returns them as
    ``parse_recompute_modules`` orders them (the plan keeps that)."""
    if plan.recompute_modules is None:
        return None
    mods = parse_recompute_modules(plan.recompute_modules)
    require(plan.recompute == "selective", f"plan: {FIELD}", ",".join(mods),
            f"needs recompute_granularity selective (got {plan.recompute}): 'full' recomputes the whole layer, "
            "'none' nothing", setting=FIELD)
    fp8 = [m for m in ("layernorm", "moe_act") if m in mods]
    # Megatron-Core (core_v0.14.0 on, megatron/core/transformer/transformer_config.py): "Delayed scaling does
    # not support moe_act and layernorm recompute for fp8"; current scaling and block scales may
    require(plan.fp8_format is None or not fp8 or plan.fp8_recipe != "delayed", f"plan: {FIELD}", ",".join(fp8),
            "not with fp8_recipe delayed: FP8 delayed scaling cannot recompute moe_act or layernorm (Megatron-Core's "
            "rule; tensorwise, mxfp8 and blockwise can)", setting=FIELD)
    return mods


def check_recompute_model(plan, model) -> None:
    """Checks that need the model (``ParallelPlan.check_model``): each module is one the
    model has."""
    mods = plan.recompute_modules or ()
    name = getattr(model, "name", "the model")
    for m in mods:
        if m in EXPERT_MODULES:
            require(model.moe, f"plan: {FIELD}", m, f"{name} has no experts (a dense model: use mlp)", setting=FIELD)
        if m == "shared_experts":
            require(bool(model.moe_shared_expert_intermediate_size), f"plan: {FIELD}", m,
                    f"{name} has no shared experts", setting=FIELD)
        if m == "mla_up_proj":
            require(model.mla, f"plan: {FIELD}", m, f"{name} has no multi-latent attention (MLA)", setting=FIELD)
        if m == "mlp":
            require(model.num_moe_layers < model.num_layers, f"plan: {FIELD}", m,
                    f"every layer of {name} is an MoE layer (mlp recomputes dense MLPs only; use moe or moe_act)",
                    setting=FIELD)
