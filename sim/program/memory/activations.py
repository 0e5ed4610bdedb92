"""Activations: the tensors a layer stores in forward for its backward.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", Table 2) give the bytes stored per layer per micro-batch, for sequence s,
micro-batch b, hidden h, heads a, tensor-parallel size t, 16-bit activations and 1-byte
dropout masks:

    no parallelism              sbh(34 + 5as/h)
    tensor parallel             sbh(10 + 24/t + 5as/(ht))
    tensor + sequence parallel  (sbh/t)(34 + 5as/h)
    tp + selective recompute    sbh(10 + 24/t)
    tp + sp + selective         sbh·34/t
    full recompute              2sbh  (the layer input; /t under sequence parallelism)

Under FP8 or FP4 training (``plan.precision``) Transformer Engine saves the quantized cast of each FP8
GEMM's input for its weight gradient (the norm's FP8 output for QKV and MLP-up, the FP8
input or its transpose for the projection and MLP-down: ``save_for_backward`` in TE's
``layernorm_linear.py`` and ``linear.py``), 1 byte per element instead of 2; the norms'
inputs, Q, K, V and the activation's input stay 16-bit (``Storing.of(precision=...)``).

``activation_terms`` itemizes the same tensors (LayerNorm inputs, QKV input, Q, K, V,
softmax and its dropout, projection input, GeLU input and output, dropout masks) so
that SwiGLU, grouped-query attention, models without dropout and flash attention
(which stores no s×s tensor, only a 4-byte log-sum-exp per query row) follow from
the same accounting; with ``flash_attention=False`` and a GPT layer it reproduces the
table above exactly.

Selective recomputation by module (``sim.inputs.recompute``: Megatron-Core's
``--recompute-modules``) drops each recomputed module's tensors to what its recompute needs
(``recomputed_terms``): the attention core its softmax (the table's selective rows), the
norms their outputs (the next GEMM's stored input), MLA's up-projections Q, K and V, the
expert activation its output, and a standard checkpoint (``mlp``, ``moe``, ``shared_experts``)
everything of its module but the input.

Outside the layers, the first pipeline stage stores the embedding's dropout mask and
the last the final norm's and the logit GEMM's inputs and the fp32 softmax of the
vocab-parallel cross-entropy (Korthikanti: 4sbV/t). A model chunk (virtual stage)
stores its layers' tensors plus those (``chunk_activation_bytes``; by layer,
``chunk_activation_parts``): the simulator allocates each layer's as that layer's forward
starts and frees them as its last backward step (B, or W when backward is split) ends. Under
full recomputation the backward re-runs one layer's forward at a time and holds that
layer's full set of tensors while it runs (``recompute_working_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import singledispatch

from sim.errors import require
from sim.inputs.layers import FullAttention, Layer
from sim.inputs.strategies import RECOMPUTE_POLICIES
from sim.inputs.model import ModelSpec
from sim.inputs.plan import RECOMPUTE, ParallelPlan
from sim.inputs.plan_sections import ParallelismPlan, PrecisionPlan, RecomputePlan
from sim.inputs.recompute import keeps_checkpoint, layer_recompute, modules_in_effect, mtp_recompute
from sim.inputs.precision import Precision
from sim.program.fp8 import saved_input_bytes


def activation_terms(model: ModelSpec, key: "Storing", layer: Layer | None = None) -> dict:
    """Bytes each stored tensor of one layer takes for one micro-batch on one rank, as ``key``
    (``Storing.of``) says it runs (``layer``: the layer's kinds under a layer pattern, each
    block's own tensors, ``kind_terms``)."""
    terms = kind_terms(model, layer, key) if layer is not None else _stored_terms(model, key)
    return {k: v for k, v in terms.items() if v}


@dataclass(frozen=True)
class Storing:
    """What decides the tensors a layer stores on one rank besides the model: the rank's
    micro-batch ``b``, tensor-parallel size ``t`` and sequence parallelism in effect ``sp``, the
    recompute granularity and the modules recomputed (``mods``, ``modules_in_effect``'s),
    whether attention is fused (``flash``), the bytes per element of a stored GEMM input
    (``g``) and an MoE layer's (ep, etp) (``experts``; None: dense)."""

    b: int
    t: int
    sp: bool
    recompute: str
    flash: bool
    g: float
    experts: tuple[int, int] | None
    mods: tuple

    @classmethod
    def of(cls, micro_batch: int, tp: int = 1, sequence_parallel: bool = False, recompute: str = "none",
           flash_attention: bool = True, precision: Precision | None = None,
           experts: tuple[int, int] | None = None, modules: tuple | None = None) -> "Storing":
        """The key of a layer run on ``micro_batch`` per rank, ``tp`` and ``sequence_parallel``,
        recomputing ``recompute`` (``modules``: what ``selective`` recomputes, default the
        attention core, ``recomputed_terms``), with ``flash_attention`` or not, in ``precision``
        (the FP8 GEMMs' inputs are stored in 1 byte (NVFP4's in 1/2), with their block scales
        under a block-scaled recipe, ``sim.program.fp8.saved_input_bytes``; see the module doc),
        an MoE layer's ``experts`` (ep, etp) under balanced routing (``moe_terms``)."""
        require(recompute in RECOMPUTE, "recompute", recompute, f"allowed: {', '.join(RECOMPUTE)}")
        return cls(micro_batch, tp, sequence_parallel and tp > 1, recompute, flash_attention,
                   2 if precision is None else saved_input_bytes(precision.recipe), experts,
                   modules_in_effect(recompute, modules))


def attention_terms(m: ModelSpec, b: int, t: int, sp: bool, g: float, flash_attention: bool, mods: tuple) -> dict:
    """An attention block's tensors between its norm and its dropout: the QKV input, Q, K
    and V, the softmax statistics (flash: a 4-byte log-sum-exp per query row, whatever the
    window; unfused: the s×s scores, masked but whole) and the projection input."""
    s, h, a = m.seq_length, m.hidden_size, m.num_attention_heads
    sbh = s * b * h
    rep = t if sp and t > 1 else 1
    r = m.num_key_value_heads / a
    terms = {
        "attn.qkv.input": g * sbh / rep,
        "attn.q": 2 * sbh / t,
        "attn.k": 2 * sbh * r / t,
        "attn.v": 2 * sbh * r / t,
    }
    if "core_attn" not in mods:
        if flash_attention:
            terms["attn.softmax.lse"] = 4 * a * s * b / t
        else:
            terms["attn.softmax"] = 2 * a * s * s * b / t
            if m.dropout:
                terms["attn.softmax.dropout_mask"] = a * s * s * b / t
                terms["attn.softmax.dropout"] = 2 * a * s * s * b / t
    terms["attn.proj.input"] = g * sbh / t
    return terms


def _mlp_terms(m: ModelSpec, sbh: float, t: int, rep: int, g: float) -> dict:
    f = m.ffn_hidden_size / m.hidden_size    # MLP width in units of h
    terms = {"mlp.up.input": g * sbh / rep}
    if m.mlp != "swiglu":  # ungated (gelu, relu2): the activation's input
        terms[f"mlp.{m.mlp}.input"] = 2 * sbh * f / t
    else:
        terms["mlp.gate"] = 2 * sbh * f / t
        terms["mlp.up"] = 2 * sbh * f / t
    terms["mlp.down.input"] = g * sbh * f / t
    return terms


def _stored_terms(model: ModelSpec, k: Storing) -> dict:
    """``activation_terms``' tensors, ``k.g`` bytes per element of a stored GEMM input."""
    m, b, t, sp, g, experts, mods = model, k.b, k.t, k.sp, k.g, k.experts, k.mods
    s, h = m.seq_length, m.hidden_size
    sbh = s * b * h
    rep = t if sp else 1                     # divisor of the non-tensor-parallel regions
    if RECOMPUTE_POLICIES[k.recompute].whole_layer:
        return {"layer.input": 2 * sbh / rep}
    mask = 1 if m.dropout else 0
    terms = {"attn.norm.input": 2 * sbh / rep}
    terms.update(attention_terms(m, b, t, sp, g, k.flash, mods))
    terms["attn.dropout_mask"] = mask * sbh / rep
    terms["mlp.norm.input"] = 2 * sbh / rep
    if experts is not None:
        terms.update(moe_terms(m, b, t, sp, experts))
        terms["mlp.dropout_mask"] = mask * sbh / rep
        return recomputed_terms(terms, mods, 2 * b * s * h / rep)
    terms.update(_mlp_terms(m, sbh, t, rep, g))
    terms["mlp.dropout_mask"] = mask * sbh / rep
    return recomputed_terms(terms, mods, 2 * sbh / rep)


def kind_terms(m: ModelSpec, layer: Layer, k: Storing) -> dict:
    """A layer of a model with a layer pattern, block by block: each block's norm input,
    the block's own tensors (its kind's ``stored``; a dense MLP's or an MoE block's as in
    every other model) and its dropout mask; then what the recomputed modules free.
    Full recomputation keeps the layer input alone."""
    b, t, sp, g, mods = k.b, k.t, k.sp, k.g, k.mods
    sbh = m.seq_length * b * m.hidden_size
    rep = t if sp else 1
    if RECOMPUTE_POLICIES[k.recompute].whole_layer:
        return {"layer.input": 2 * sbh / rep}
    mask = 1 if m.dropout else 0
    terms: dict = {}
    for kind in layer.blocks:
        blk = kind.block
        terms[f"{blk}.norm.input"] = 2 * sbh / rep
        if kind.mixes:
            terms.update(mixer_stored(kind, m, b, t, sp, g, k.flash, mods))
        elif layer.is_moe:
            terms.update(moe_terms(m, b, t, sp, k.experts or (1, t)))
        else:
            terms.update(_mlp_terms(m, sbh, t, rep, g))
        terms[f"{blk}.dropout_mask"] = mask * sbh / rep
    return recomputed_terms(terms, mods, 2 * sbh / rep)


_DROPPED = {
    "layernorm": ("attn.qkv.input", "mlp.up.input", "moe.shared.up.input", "moe.input"),
    "mla_up_proj": ("attn.q", "attn.k", "attn.v"),
    "mlp": ("mlp.gelu.input", "mlp.relu2.input", "mlp.gate", "mlp.up", "mlp.down.input"),
    "moe_act": ("moe.experts.down.input", "moe.experts.clamped"),
    "shared_experts": ("moe.shared.act", "moe.shared.down.input"),
}
"""What each recomputed module frees (``sim.inputs.recompute``): layernorm its outputs, which
the GEMMs after it store as their inputs (the QKV's; the MLP-up's, or the MoE block's and
its shared experts'); mla_up_proj Q, K and V; mlp the dense MLP's inner tensors; moe_act
the experts' activation output, their down-projection input; shared_experts theirs."""


def recomputed_terms(terms: dict, mods: tuple, block_input: float) -> dict:
    """``terms`` less what the recomputed modules ``mods`` free (``_DROPPED``; the attention
    core's softmax is left out before). A standard checkpoint (``mlp``, ``moe``) keeps its
    input, the 16-bit norm output of ``block_input`` bytes: the MLP-up's stored input becomes
    it, and ``moe`` stores nothing else of its block (``moe.input``). A norm output
    recomputed (``layernorm``) is not stored either way."""
    terms = dict(terms)
    if "mlp" in mods and "mlp.up.input" in terms:
        terms["mlp.up.input"] = block_input
    if "moe" in mods and "moe.router.probs" in terms:
        terms = {k: v for k, v in terms.items() if not k.startswith("moe.")}
        terms["moe.input"] = block_input
    for mod in mods:
        for k in _DROPPED.get(mod, ()):
            terms.pop(k, None)
    return {k: v for k, v in terms.items() if v}


def moe_terms(m: ModelSpec, b: int, t: int, sp: bool, experts: tuple[int, int]) -> dict:
    """What an MoE block stores for its backward on one rank, balanced routing: the router's
    fp32 probabilities, the R = T·k token copies entering the rank's experts (gathered over
    etp) with their gate/up outputs and down inputs, the experts' outputs the weighted sum
    needs, and the shared experts' tensors as a tensor-parallel MLP's. T = b·s (/tp under
    sequence parallelism)."""
    ep, etp = experts
    T = b * m.seq_length // (t if sp else 1)
    R = T * m.moe_router_topk
    h, f = m.hidden_size, m.moe_ffn_hidden_size
    n = R * etp                                 # tokens through this rank's expert shards
    out = {"moe.router.probs": 4 * T * m.num_experts, "moe.experts.up.input": 2 * n * h,
           "moe.experts.down.input": 2 * n * f / etp, "moe.experts.output": 2 * R * h}
    if m.mlp == "gelu":
        out["moe.experts.gelu.input"] = 2 * n * f / etp
    else:
        out["moe.experts.gate"] = out["moe.experts.up"] = 2 * n * f / etp
    if m.activation_clamp is not None:  # the clamped copy (cat of the halves) the fused activation saves,
        out["moe.experts.clamped"] = 4 * n * f / etp  # beside the up output the clamps keep (sim.program.workload_moe)
    fs = m.moe_shared_expert_intermediate_size
    if fs:
        full = b * m.seq_length
        out["moe.shared.up.input"] = 2 * full * h / (t if sp else 1)
        out["moe.shared.act"] = (2 if m.mlp == "gelu" else 4) * full * fs / t
        out["moe.shared.down.input"] = 2 * full * fs / t
    return out


def activation_bytes_per_layer(model: ModelSpec, key: Storing, layer: Layer | None = None) -> float:
    """Activation bytes one layer stores for one micro-batch on one rank, as ``key`` says it
    runs (Korthikanti Table 2 when attention is unfused and the layer is GPT-style)."""
    return sum(activation_terms(model, key, layer).values())


def plan_layer_bytes(model: ModelSpec, plan: ParallelPlan, flash_attention: bool, moe: bool,
                     recompute: str | None = None, layer: Layer | None = None) -> float:
    """``activation_bytes_per_layer`` of a dense (``moe`` False) or MoE layer as ``plan`` runs
    it (``recompute``: another granularity than the plan's, without its modules; ``layer``:
    its kinds under a layer pattern)."""
    s = plan.sections
    rec = s.recompute if recompute is None or recompute == plan.recompute else \
        replace(s.recompute, recompute=recompute, recompute_modules=None)
    return layer_bytes(model, s.parallelism, rec, s.precision, flash_attention,
                       (plan.ep, plan.etp_size) if moe else None, layer)


def layer_bytes(model: ModelSpec, par: ParallelismPlan, rec: RecomputePlan, prec: PrecisionPlan,
                flash_attention: bool, experts: tuple[int, int] | None = None, layer: Layer | None = None) -> float:
    """``activation_bytes_per_layer`` from the plan's sections (``sim.inputs.plan_sections``):
    ``par``'s micro-batch and tensor/sequence parallelism, ``rec``'s granularity and modules,
    ``prec``'s precision."""
    return activation_bytes_per_layer(model, Storing.of(par.micro_batch_size, par.tp, par.sequence_parallel,
                                                        rec.recompute, flash_attention, prec.precision, experts,
                                                        rec.recompute_modules), layer)


def _kind_bytes(model: ModelSpec, plan: ParallelPlan, flash_attention: bool, recompute: str | None = None) -> dict:
    """Under a layer pattern: each distinct layer's ``plan_layer_bytes``."""
    return {lay: plan_layer_bytes(model, plan, flash_attention, lay.is_moe, recompute, lay)
            for lay in model.layer_kinds}


def stage_layer_bytes(model: ModelSpec, plan: ParallelPlan, virtual_stage: int, flash_attention: bool,
                      recompute: str | None = None) -> float:
    """Activation bytes of a chunk's transformer layers for one micro-batch (dense and MoE
    layers each at their own size), before the division by cp."""
    if model.layers is not None:
        by_kind = _kind_bytes(model, plan, flash_attention, recompute)
        return sum(by_kind[model.layer(i)] for i in plan.layer_range(model, virtual_stage))
    if recompute is None:
        return sum(layer_parts(model, plan, virtual_stage, flash_attention).values())
    dense = plan_layer_bytes(model, plan, flash_attention, False, recompute)
    ids = plan.layer_range(model, virtual_stage)
    n_moe = sum(1 for i in ids if model.is_moe_layer(i))
    moe = plan_layer_bytes(model, plan, flash_attention, True, recompute) if n_moe else 0.0
    return (len(ids) - n_moe) * dense + n_moe * moe


def layer_parts(model: ModelSpec, plan: ParallelPlan, virtual_stage: int, flash_attention: bool) -> dict[int, float]:
    """Layer id -> activation bytes of one micro-batch for the chunk's transformer layers
    (before the division by cp), each at its own kind (dense or MoE) and, under a recompute
    method (``sim.inputs.recompute``), its own granularity: under block the first
    ``recompute_num_layers`` store their input only, the rest everything; under uniform the
    first layer of each group stores the group's input and the others nothing."""
    ids = list(plan.layer_range(model, virtual_stage))
    out, priced = {}, {}  # (moe, granularity) -> bytes: the chunk's layers are of a few kinds
    for pos, lid in enumerate(ids):
        rec = layer_recompute(plan, pos)
        keep = not RECOMPUTE_POLICIES[rec].whole_layer or keeps_checkpoint(plan, pos)
        if not keep:
            out[lid] = 0.0
            continue
        kind = (model.is_moe_layer(lid), rec)
        if kind not in priced:
            priced[kind] = plan_layer_bytes(model, plan, flash_attention, kind[0], rec)
        out[lid] = priced[kind]
    return out


def head_activation_bytes(model: ModelSpec, micro_batch: int, tp: int = 1,
                          sequence_parallel: bool = False) -> float:
    """Last stage, per micro-batch: final norm input, logit GEMM input and the fp32
    softmax the vocab-parallel cross-entropy keeps (Korthikanti: 4sbV/t)."""
    sp = sequence_parallel and tp > 1
    sbh = model.seq_length * micro_batch * model.hidden_size
    norm_and_logit_inputs = 2 * (2 * sbh / (tp if sp else 1))
    return norm_and_logit_inputs + 4 * model.seq_length * micro_batch * model.vocab_size / tp


def embedding_activation_bytes(model: ModelSpec, micro_batch: int, tp: int = 1,
                               sequence_parallel: bool = False) -> float:
    """First stage, per micro-batch: the embedding dropout mask (GPT-style models)."""
    sp = sequence_parallel and tp > 1
    sbh = model.seq_length * micro_batch * model.hidden_size
    return sbh / (tp if sp else 1) if model.dropout else 0.0


def chunk_activation_bytes(model: ModelSpec, plan: ParallelPlan, virtual_stage: int,
                           flash_attention: bool | None = None) -> float:
    """Bytes one micro-batch's forward stores on a rank of model chunk ``virtual_stage``:
    its layers' (``plan.stage_layers``), plus the embedding's on virtual stage 0 and the
    output layer's on the last. Under context parallelism each rank stores its s/cp tokens’
    tensors: 1/cp of them (context parallelism runs flash attention only, whose stored
    tensors are all linear in s)."""
    if flash_attention is None:  # (the plan's attention)
        flash_attention = plan.attention_mode.fused
    b, t, sp = plan.micro_batch_size, plan.tp, plan.sequence_parallel
    total = stage_layer_bytes(model, plan, virtual_stage, flash_attention)
    if virtual_stage == 0:
        total += embedding_activation_bytes(model, b, t, sp)
    if virtual_stage == plan.pp * plan.vpp - 1:
        total += head_activation_bytes(model, b, t, sp) + sum(mtp_activation_bytes(model, plan, k, flash_attention)
                                                              for k in range(model.mtp_num_layers))
    return total / plan.cp  # context parallelism: every stored tensor holds s/cp of the tokens


def chunk_activation_parts(model: ModelSpec, plan: ParallelPlan, virtual_stage: int,
                           flash_attention: bool | None = None) -> dict[int, float]:
    """``chunk_activation_bytes`` by the layer that stores them, for the memory timeline:
    layer id -> bytes, the embedding as layer -1 and the output layer as layer
    ``model.num_layers`` (the ids the workload's actions carry). A layer's tensors are
    stored while its forward runs and freed as its backward finishes, so a micro-batch's
    activations grow through the forward rather than appear whole at its start."""
    if flash_attention is None:
        flash_attention = plan.attention_mode.fused
    b, t, sp = plan.micro_batch_size, plan.tp, plan.sequence_parallel
    parts = {}
    if virtual_stage == 0:
        parts[-1] = embedding_activation_bytes(model, b, t, sp)
    if model.layers is not None:
        by_kind = _kind_bytes(model, plan, flash_attention)
        parts.update({i: by_kind[model.layer(i)] for i in plan.layer_range(model, virtual_stage)})
    else:
        parts.update(layer_parts(model, plan, virtual_stage, flash_attention))
    if virtual_stage == plan.pp * plan.vpp - 1:
        parts[model.num_layers] = head_activation_bytes(model, b, t, sp)
        for k in range(model.mtp_num_layers):
            parts[model.num_layers + 1 + k] = mtp_activation_bytes(model, plan, k, flash_attention)
    return {i: v / plan.cp for i, v in parts.items() if v}


def mtp_activation_bytes(model: ModelSpec, plan: ParallelPlan, k: int, flash_attention: bool = True) -> float:
    """Multi-token-prediction module ``k``, per micro-batch (``sim.program.workload.mtp_works``):
    its layer's activations (of the layer's kind), the inputs of its two norms and of its
    projection (2h wide; sequence-sharded under sequence parallelism) and its pass through
    the output head and loss (``head_activation_bytes``)."""
    b, t, sp = plan.micro_batch_size, plan.tp, plan.sequence_parallel
    lay = model.layer(model.num_layers + k) if model.layers is not None else None
    layer = plan_layer_bytes(model, plan, flash_attention, model.is_moe_layer(model.num_layers + k),
                             mtp_recompute(plan), layer=lay)
    sbh = model.seq_length * b * model.hidden_size / (t if sp and t > 1 else 1)
    return layer + 2 * (2 * sbh) + 2 * (2 * sbh) + head_activation_bytes(model, b, t, sp)


def recompute_working_bytes(model: ModelSpec, plan: ParallelPlan) -> float:
    """Under full recomputation, the one layer's full activations (as without recompute)
    that a backward step holds while it re-runs that layer's forward. Under selective
    recomputation of modules besides the attention core, what they regenerate for one layer
    (its stored bytes with the attention core alone recomputed less those with the modules;
    the larger of a dense and an MoE layer's), held while that layer's backward runs; the
    attention core's few regenerated bytes are left out, as they always were. 0 otherwise."""
    sec = plan.sections
    if plan.recompute_policy.whole_layer:  # under uniform, a group of recompute_num_layers re-runs its forward at once
        group = 1 if plan.recompute_method != "uniform" else min(  # (no group longer than a chunk)
            plan.recompute_num_layers, max(len(plan.layer_range(model, vs)) for vs in range(plan.pp * plan.vpp)))
        kept = replace(sec.recompute, recompute="none", recompute_modules=None)  # (a layer as without recompute)
        if model.layers is not None:
            return group * max(layer_bytes(model, sec.parallelism, kept, sec.precision, True,
                                           (plan.ep, plan.etp_size) if lay.is_moe else None, lay)
                               for lay in model.layer_kinds) / plan.cp
        return group * layer_bytes(model, sec.parallelism, kept, sec.precision, True) / plan.cp
    mods = plan.recomputed_modules
    if not set(mods) - {"core_attn"}:
        return 0.0
    core = tuple(m for m in mods if m == "core_attn")

    def layer(moe: bool, modules: tuple, lay: Layer | None = None) -> float:
        rec = replace(sec.recompute, recompute="selective", recompute_modules=modules)
        return layer_bytes(model, sec.parallelism, rec, sec.precision, plan.attention_mode.fused,
                           (plan.ep, plan.etp_size) if moe else None, lay)

    if model.layers is not None:
        return max(layer(lay.is_moe, core, lay) - layer(lay.is_moe, mods, lay) for lay in model.layer_kinds) / plan.cp
    kinds = {model.is_moe_layer(i) for i in range(model.num_layers)}
    return max(layer(moe, core) - layer(moe, mods) for moe in kinds) / plan.cp


# A mixer kind's stored tensors: its own (``sim.inputs.layers``: Mamba-2, Gated DeltaNet), or
# for the attention kinds Korthikanti et al. 2022's attention tensors, registered here where
# ``attention_terms`` lives (inputs/ never reaches up into program/).
@singledispatch
def mixer_stored(kind, m, b: int, t: int, sp: bool, g: float, flash: bool, mods: tuple) -> dict:
    """Name -> bytes of what a mixer keeps for its backward."""
    return kind.stored(m, b, t, sp, g, flash, mods)


@mixer_stored.register
def _(kind: FullAttention, m, b: int, t: int, sp: bool, g: float, flash: bool, mods: tuple) -> dict:
    terms = attention_terms(m, b, t, sp, g, flash, mods)
    if kind.output_gate:  # the gate's pre-activation, for the sigmoid's and the product's backward
        terms["attn.gate"] = 2 * b * m.seq_length * m.q_dim / t
    return terms
