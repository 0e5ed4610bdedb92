"""What each GPU computes: the operations of one transformer layer, the embedding and
the output head, for one micro-batch, under tensor and sequence parallelism.

Each piece of work is a list of ``Op`` (a kernel: GEMM, fused attention or a
memory-bound elementwise/norm kernel, with FLOPs, bytes read and written and output
size) and ``Comm`` (a tensor-parallel collective: its kind and buffer size) in the
order they run, split into three phases as the Zero Bubble paper (Qi et al., ICLR
2024) splits backward: ``F`` forward, ``B`` gradient with respect to the input, ``W``
gradient with respect to the weights. Per layer, with b micro-batch, s sequence, h
hidden and a 4h GeLU MLP, the GEMM and attention FLOPs are exactly the paper's

    F = sbh(24h + 4s),   B = sbh(24h + 8s),   W = sbh·24h

(``4bs²h`` is attention's QKᵀ and AV; the backward of attention has no weights, so its
8bs²h is all in B). Summing F + B + W over layers with the logit layer's 6bshV gives
Korthikanti et al.'s model FLOPs (Eq. 7); with full recomputation the forward runs
twice and the sum is Megatron-LM's Eq. 3, 96·B·s·l·h²·(1 + s/(6h) + V/(16lh)).
Recomputed work is emitted at the start of B with ``recompute=True``: the whole
forward for ``full``, for ``selective`` the forward of each recomputed module
(``sim.inputs.recompute``; the attention core by default) in forward order, the attention
core last. FLOPs are the
papers' (non-causal) counts; elementwise ops carry a nominal few FLOPs per element.

Tensor parallelism follows Megatron-LM: QKV and MLP-up are column-parallel, the
attention output and MLP-down projections row-parallel, so each rank does 1/t of every
GEMM and of attention (a/t heads). Without sequence parallelism an all-reduce of the
b·s·h activation follows each row-parallel GEMM in F and each column-parallel input
gradient in B; with it (Korthikanti et al. 2022) norms, dropout and residuals run on
s/t of the sequence, the all-reduces become all-gather/reduce-scatter pairs, and the
sequence-sharded GEMM inputs are all-gathered again for the weight gradients (in W).
Attention is flash-style by default (one kernel; no s×s tensor is written to memory);
``attention="unfused"`` gives Megatron-LM's original core attention instead: QKᵀ and AV
as batched GEMMs per head around a fused scale-mask-softmax and the attention dropout,
which read and write the b·(a/t)·s² scores (same FLOPs, far more bytes). Activations are bf16
(``dtype_bytes``); dropout masks are one byte per element.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache, singledispatch

from sim.errors import require
from sim.inputs.strategies import ATTENTION_MODES, RECOMPUTE_POLICIES
from sim.inputs.layers import FullAttention, Layer, standard_layer
from sim.inputs.model import ModelSpec
from sim.inputs.moe import mla_projections
from sim.inputs.plan import ATTENTION, CROSS_ENTROPY, RECOMPUTE, ParallelPlan
from sim.inputs.plan_sections import FrameworkPlan, ParallelismPlan, PrecisionPlan, RecomputePlan
from sim.inputs.precision import BF16_BYTES
from sim.inputs.recompute import layer_recompute, modules_in_effect, mtp_recompute
from sim.inputs.frameworks import framework_named
from sim.program.eager_rope import with_eager_rope
from sim.program.fp8 import fp8_layer_work
from sim.program.loss import loss_backward, loss_forward
from sim.program.ops import (COLLECTIVES, MAIN_GRAD_BYTES, OP_KINDS, PHASES, Builder, Comm, Op,  # noqa: F401
                             Work, accumulate_wgrads, with_attention_kernel)
from sim.program.context_parallel import cp_attention_backward, cp_attention_forward
from sim.program.dispatch import moe_shape
from sim.program.workload_moe import (MoeShape, attention_widths, moe_backward, moe_forward, moe_wgrads, qkv_dgrad,
                                      qkv_forward, qkv_wgrads)


class _TpOnly:
    """A plan of tensor parallelism alone, for the kinds' rules when a layer's work is
    built without a plan (``layer_work``'s own arguments)."""

    cp = 1

    def __init__(self, tp: int):
        self.tp = tp


# Nominal FLOPs per element of memory-bound kernels (they never bound the time).
_NORM_FLOPS = {"layernorm": 8, "rmsnorm": 5}
_ACT_FLOPS = {"gelu": 10, "swiglu": 6, "relu2": 2}


def _check(model: ModelSpec, micro_batch: int, tp: int, recompute: str, layer: Layer | None = None) -> None:
    require(isinstance(micro_batch, int) and micro_batch > 0, "micro_batch", micro_batch,
            "expected an integer > 0")
    require(isinstance(tp, int) and tp > 0, "tp", tp, "expected an integer > 0")
    require(recompute in RECOMPUTE, "recompute", recompute, f"allowed: {', '.join(RECOMPUTE)}")
    if model.layers is not None:  # each kind's own rules (``sim.inputs.layers``)
        for kind in (layer or model.layer(0)).blocks:
            kind.check_plan(model, _TpOnly(tp))
        return
    for field in ("num_attention_heads", "num_key_value_heads", "ffn_hidden_size"):
        require(getattr(model, field) % tp == 0, "tp", tp,
                f"must divide {field} {getattr(model, field)} of {model.name}")


def _attention_forward(w: Builder, m: ModelSpec, b: int, t: int, attention: str, cp: int = 1,
                       cp_comm: str = "p2p", keys: int | None = None) -> None:
    """The attention core's forward: one flash kernel, or Megatron-LM's unfused core
    attention (QKᵀ as a batched GEMM per head, the fused scale-mask-softmax and the
    dropout over the b·(a/t)·s² scores in memory, then AV); the same FLOPs either way.
    Under context parallelism (``cp`` > 1) ``sim.program.context_parallel``'s. ``keys``:
    the keys each query sees in the doubled causal convention (``sim.inputs.layers``:
    a sliding window's or a chunk's band; None, or s, for full attention); the flash kernel
    does s·keys of work per head, the unfused core still all s² scores, masked."""
    if cp > 1:
        cp_attention_forward(w, m, b, t, cp, cp_comm)
        return
    e, s = w.e, m.seq_length
    k = s if keys is None else keys
    heads, d = m.num_attention_heads // t, m.head_dim
    width, out, d_qk, d_v = attention_widths(m)
    n_tok, qkv = b * s, width // t
    if ATTENTION_MODES[attention].fused:
        w.attention("attn.core", 2 * b * s * k * heads * (d_qk + d_v), e * n_tok * qkv,
                    e * n_tok * out / t + 4 * b * heads * s, e * n_tok * out / t, (s, k, d), b * heads)
        return
    bh = b * heads
    scores = bh * s * s
    w.gemm("attn.scores", s, s, d, batch=bh)
    w.mem("attn.softmax", e * scores, e * scores, 5 * scores)
    if m.dropout:
        w.mem("attn.dropout", e * scores, e * scores + scores, scores, framework=True)  # (and its 1-byte mask)
    w.gemm("attn.context", s, d, s, batch=bh)


def _attention_backward(w: Builder, m: ModelSpec, b: int, t: int, attention: str, cp: int = 1,
                        cp_comm: str = "p2p", keys: int | None = None) -> None:
    """The attention core's backward (input gradients only: it has no weights): the flash
    kernel's, or the unfused one's dV = PᵀdO, dP = dO·Vᵀ, dropout and softmax backward
    over the scores, dQ = dS·K and dK = dSᵀ·Q (``keys`` as in ``_attention_forward``)."""
    if cp > 1:
        cp_attention_backward(w, m, b, t, cp, cp_comm)
        return
    e, s = w.e, m.seq_length
    k = s if keys is None else keys
    heads, d = m.num_attention_heads // t, m.head_dim
    width, out, d_qk, d_v = attention_widths(m)
    n_tok, qkv = b * s, width // t
    if ATTENTION_MODES[attention].fused:
        w.attention("attn.core.grad", 4 * b * s * k * heads * (d_qk + d_v),
                    e * (n_tok * qkv + 2 * n_tok * out / t) + 4 * b * heads * s,
                    e * n_tok * qkv, e * n_tok * qkv, (s, k, d), b * heads)
        return
    bh = b * heads
    scores = bh * s * s
    w.gemm("attn.context.dgrad_v", s, d, s, batch=bh)
    w.gemm("attn.context.dgrad_p", s, s, d, batch=bh)
    if m.dropout:
        w.mem("attn.dropout.grad", e * scores + scores, e * scores, scores, framework=True)
    w.mem("attn.softmax.grad", 2 * e * scores, e * scores, 4 * scores)
    w.gemm("attn.scores.dgrad_q", s, d, s, batch=bh)
    w.gemm("attn.scores.dgrad_k", s, d, s, batch=bh)


def attention_forward_block(w: Builder, m: ModelSpec, b: int, t: int, attention: str, ctx: tuple,
                            keys: int | None = None, gate: bool = False) -> None:
    """An attention block between its tensor-parallel collectives (``sim.inputs.layers``'
    attention kinds): the Q/K/V projections, [the output gate's projection], the core,
    [the gate's sigmoid and product] and the output projection."""
    n_tok = b * m.seq_length
    qkv_forward(w, m, n_tok, t)
    if gate:
        w.gemm("attn.gate", n_tok, m.q_dim // t, m.hidden_size)
    _attention_forward(w, m, b, t, attention, *ctx, keys=None if keys == m.seq_length else keys)
    if gate:
        g = n_tok * m.q_dim // t
        w.mem("attn.gate.apply", 2 * w.e * g, w.e * g, 5 * g)
    w.gemm("attn.proj", n_tok, m.hidden_size, attention_widths(m)[1] // t, bias=m.bias)


def attention_backward_block(w: Builder, m: ModelSpec, b: int, t: int, attention: str, ctx: tuple,
                             keys: int | None = None, gate: bool = False) -> None:
    """``attention_forward_block``'s input gradients, in reverse."""
    n_tok = b * m.seq_length
    w.gemm("attn.proj.dgrad", n_tok, attention_widths(m)[1] // t, m.hidden_size)
    if gate:
        g = n_tok * m.q_dim // t
        w.mem("attn.gate.apply.grad", 3 * w.e * g, 2 * w.e * g, 8 * g)
    _attention_backward(w, m, b, t, attention, *ctx, keys=None if keys == m.seq_length else keys)
    if gate:
        w.gemm("attn.gate.dgrad", n_tok, m.hidden_size, m.q_dim // t)
    qkv_dgrad(w, m, n_tok, t)


def _mlp_forward(w: Builder, m: ModelSpec, n_tok: int, f: int) -> None:
    w.gemm("mlp.up", n_tok, (2 if m.mlp == "swiglu" else 1) * f, m.hidden_size, bias=m.bias)
    read = (2 if m.mlp == "swiglu" else 1) * n_tok * f
    w.mem(f"mlp.{m.mlp}", w.e * read, w.e * n_tok * f, _ACT_FLOPS[m.mlp] * n_tok * f, framework=True)
    w.gemm("mlp.down", n_tok, m.hidden_size, f, bias=m.bias)


@dataclass(frozen=True)
class LayerRun:
    """How one tensor-parallel rank runs a layer for one micro-batch (``layer_work``): its
    ``micro_batch``, tensor-parallel size ``tp`` and ``sequence_parallel``, the recompute
    granularity (``recompute``, ``ParallelPlan.recompute``; ``modules``: what ``selective``
    recomputes, ``sim.inputs.recompute``, default the attention core), ``attention``: "flash"
    or "unfused" (``ParallelPlan.attention``), the context-parallel size ``cp`` (the rank's
    s/cp tokens) and ``cp_comm``, how attention gets the rest (``sim.program.context_parallel``)."""

    micro_batch: int = 1
    tp: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"
    attention: str = "flash"
    cp: int = 1
    cp_comm: str = "p2p"
    modules: tuple | None = None

    @classmethod
    def of(cls, par: ParallelismPlan, rec: RecomputePlan, fw: FrameworkPlan) -> "LayerRun":
        """The layer as a plan's sections run it."""
        return cls(par.micro_batch_size, par.tp, par.sequence_parallel, rec.recompute, fw.attention, par.cp,
                   par.cp_comm_type, rec.recompute_modules)

    @property
    def sp(self) -> bool:
        """Sequence parallelism in effect (requested and tp > 1)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def ctx(self) -> tuple:
        """(cp, cp_comm), as the attention builders take them."""
        return (self.cp, self.cp_comm)


def _layer_forward(w: Builder, m: ModelSpec, run: LayerRun, moe: MoeShape | None = None,
                   layer: Layer | None = None) -> None:
    """Append one layer's forward (ops and collectives) as ``run`` says to ``w`` in its current
    phase (``m``: the model as the rank's context-parallel share sees it); ``moe``: the layer's
    MLP is a mixture of experts (``sim.program.workload_moe``); ``layer``: its kinds
    (``sim.inputs.layers``; default the model's standard layer)."""
    b, t, sp, attention, cp = run.micro_batch, run.tp, run.sp, run.attention, run.ctx
    e, s, h = w.e, m.seq_length, m.hidden_size
    n_tok = b * s
    nn = n_tok // t if sp else n_tok                 # tokens seen by norms/dropout/residuals
    f = m.ffn_hidden_size // t
    mask = nn * h if m.dropout else 0
    norm_flops = _NORM_FLOPS[m.norm]
    layer = layer or standard_layer(m, moe is not None)

    for kind in layer.blocks:
        blk = kind.block
        w.mem(f"{blk}.norm", e * (nn * h + m.norm_params), e * nn * h, norm_flops * nn * h)
        after = None
        if kind.owns_tp_comms:
            after = moe_forward(w, m, b, t, sp, moe)
        else:
            if t > 1 and sp:
                w.comm(f"{blk}.all_gather", "all_gather", e * n_tok * h)
            if kind.mixes:
                mixer_forward(kind, w, m, b, t, attention, cp)
            else:
                _mlp_forward(w, m, n_tok, f)
            if t > 1:
                w.comm(f"{blk}.{'reduce_scatter' if sp else 'all_reduce'}",
                       "reduce_scatter" if sp else "all_reduce", e * n_tok * h)
        # bias + dropout + residual add, fused as in Megatron-LM
        w.mem(f"{blk}.residual", 2 * e * nn * h, e * nn * h + mask, 3 * nn * h, output=e * nn * h, framework=True,
              after=after)


def layer_work(model: ModelSpec, run: LayerRun = LayerRun(), moe: MoeShape | None = None,
               layer: Layer | None = None) -> Work:
    """One transformer layer's F, B and W for one micro-batch on one tensor-parallel rank, as
    ``run`` says (activations in BF16; ``moe``: how its mixture of experts runs, None for a
    dense layer; ``layer``: the layer's kinds, ``sim.inputs.layers``, default the model's
    standard layer)."""
    _check(model, run.micro_batch, run.tp, run.recompute, layer)
    require(run.attention in ATTENTION, "attention", run.attention, f"allowed: {', '.join(ATTENTION)}")
    m, b, t, e = local_sequence(model, run.cp), run.micro_batch, run.tp, BF16_BYTES
    attention, recompute, modules, ctx, sp = run.attention, run.recompute, run.modules, run.ctx, run.sp
    s, h = m.seq_length, m.hidden_size
    n_tok = b * s
    nn = n_tok // t if sp else n_tok
    f = m.ffn_hidden_size // t
    f_up = (2 if m.mlp == "swiglu" else 1) * f
    mask = nn * h if m.dropout else 0
    norm_flops = _NORM_FLOPS[m.norm]
    layer = layer or standard_layer(m, moe is not None)

    w = Builder("layer", e)
    _layer_forward(w, m, run, moe, layer)

    w.phase = "B"
    start = len(w.items)
    if RECOMPUTE_POLICIES[recompute].whole_layer:
        _layer_forward(w, m, run, moe, layer)
    elif RECOMPUTE_POLICIES[recompute].by_module:
        mods = modules_in_effect(recompute, modules)
        w.items += _recomputed_modules(m, run, moe, mods, e, layer)
        if "core_attn" in mods and layer.mixer is not None:
            mixer_recompute_core(layer.mixer, w, m, b, t, attention, ctx)
    w.items[start:] = [_as_recompute(i) for i in w.items[start:]]
    for kind in reversed(layer.blocks):
        blk = kind.block
        w.mem(f"{blk}.residual.grad", e * nn * h + mask, e * nn * h, nn * h, framework=True)
        if kind.owns_tp_comms:
            moe_backward(w, m, b, t, sp, moe)
        else:
            if t > 1 and sp:
                w.comm(f"{blk}.all_gather.grad", "all_gather", e * n_tok * h)
            if not kind.mixes:
                w.gemm("mlp.down.dgrad", n_tok, f, h)
                read = (3 if m.mlp == "swiglu" else 2) * n_tok * f
                wrote = (2 if m.mlp == "swiglu" else 1) * n_tok * f
                w.mem(f"mlp.{m.mlp}.grad", e * read, e * wrote, 2 * _ACT_FLOPS[m.mlp] * n_tok * f, framework=True)
                w.gemm("mlp.up.dgrad", n_tok, h, f_up)
            else:
                mixer_backward(kind, w, m, b, t, attention, ctx)
            if t > 1:
                w.comm(f"{blk}.{'reduce_scatter' if sp else 'all_reduce'}.grad",
                       "reduce_scatter" if sp else "all_reduce", e * n_tok * h)
        w.mem(f"{blk}.norm.grad", 2 * e * nn * h + e * m.norm_params, e * nn * h + e * m.norm_params,
              2 * norm_flops * nn * h, output=e * nn * h)

    w.phase = "W"
    for kind in reversed(layer.blocks):
        if kind.owns_tp_comms:
            moe_wgrads(w, m, b, t, sp, moe)
        elif not kind.mixes:
            w.gemm("mlp.down.wgrad", f, h, n_tok)
            if sp:
                w.comm("mlp.up.all_gather.input", "all_gather", e * n_tok * h)
            w.gemm("mlp.up.wgrad", h, f_up, n_tok)
        else:
            mixer_wgrads(kind, w, m, n_tok, t, sp)
    return w.build()


def _as_recompute(item):
    return replace(item, phase="B", recompute=True)


def _in_module(name: str, module: str, mla_up: tuple, moe: bool, act: str) -> bool:
    """Whether the forward item ``name`` belongs to recomputed ``module`` (``sim.inputs.recompute``;
    the attention core is ``_attention_forward``'s, emitted on its own)."""
    if module == "layernorm":
        return name in ("attn.norm", "mlp.norm")
    if module == "mla_up_proj":
        return name in mla_up
    if module == "mlp":
        return not moe and name.startswith("mlp.") and name not in ("mlp.norm", "mlp.residual")
    if module == "moe":
        return moe and name.startswith("moe.")
    if module == "moe_act":
        return moe and name in (f"moe.experts.{act}", "moe.experts.clamp")  # the clamp is in bias_act_func
    return module == "shared_experts" and moe and name.startswith("moe.shared.")


def _recomputed_modules(m: ModelSpec, run: LayerRun, moe: MoeShape | None, modules: tuple, e: int,
                        layer: Layer | None = None) -> list:
    """The forward items that ``modules`` run again at the start of backward (besides the
    attention core), in forward order: the layer's forward filtered by module, so that a
    recomputed kernel or collective is the forward's own (``moe`` reruns the router, the
    dispatch and combine all-to-alls, the experts and the shared experts)."""
    mods = [mod for mod in modules if mod != "core_attn"]
    if not mods:
        return []
    fwd = Builder("layer", e)
    _layer_forward(fwd, m, run, moe, layer)
    mla_up = tuple(name for name, _, _, split in mla_projections(m) if split) if m.mla else ()
    return [i for i in fwd.items if any(_in_module(i.name, mod, mla_up, moe is not None, m.mlp) for mod in mods)]


def embedding_work(model: ModelSpec, micro_batch: int, tp: int = 1, sequence_parallel: bool = False,
                   dtype_bytes: int = 2) -> Work:
    """Token (vocab-parallel) and position embedding lookup on the first stage, and its
    backward as PyTorch's dense embedding backward runs it (``F.embedding``, which
    Megatron-LM's ``VocabParallelEmbedding`` calls): zero a gradient the size of the
    table (``embedding_dense_backward`` allocates ``at::zeros`` of the table's shape),
    scatter-add the b·s gradient rows into it, then add it into the fp32 main gradient.
    The lookup is not a GEMM, so gradient-accumulation fusion never covers it: Megatron-LM's
    DDP hook runs ``main_grad.add_(grad)`` after every micro-batch's backward (plain
    PyTorch's ``AccumulateGrad`` the same add)."""
    _check(model, micro_batch, tp, "none")
    m, b, t, e = model, micro_batch, tp, dtype_bytes
    sp = sequence_parallel and t > 1
    n_tok, h = b * m.seq_length, m.hidden_size
    pos = 1 if m.position_embedding == "learned" else 0
    rows = math.ceil(m.vocab_size / t) + pos * m.max_position_embeddings  # the rank's tables
    w = Builder("embedding", e)
    w.mem("embed.lookup", 8 * n_tok + e * n_tok * h * (1 + pos), e * n_tok * h, n_tok * h * pos, framework=True)
    if t > 1:
        w.comm("embed.reduce_scatter" if sp else "embed.all_reduce",
               "reduce_scatter" if sp else "all_reduce", e * n_tok * h)
    w.phase = "W"
    if sp:
        w.comm("embed.all_gather.grad", "all_gather", e * n_tok * h)
    w.mem("embed.wgrad.zero", 0, e * rows * h, framework=True)
    # scatter-add of the gradient rows into the (vocab shard of the) table
    w.mem("embed.wgrad", e * n_tok * h * (2 + pos), e * n_tok * h * (1 + pos), n_tok * h * (1 + pos), framework=True)
    w.mem("embed.main_grad.add", (e + MAIN_GRAD_BYTES) * rows * h, MAIN_GRAD_BYTES * rows * h, rows * h,
          framework=True)
    return w.build()


def head_work(model: ModelSpec, micro_batch: int, tp: int = 1, sequence_parallel: bool = False,
              dtype_bytes: int = 2, cross_entropy: str = "megatron") -> Work:
    """Final norm, logit GEMM (vocab-parallel) and the loss on the last stage, its
    cross entropy as ``cross_entropy`` (``sim.inputs.plan.CROSS_ENTROPY``) runs it."""
    _check(model, micro_batch, tp, "none")
    require(cross_entropy in CROSS_ENTROPY, "cross_entropy", cross_entropy, f"allowed: {', '.join(CROSS_ENTROPY)}")
    m, b, t, e = model, micro_batch, tp, dtype_bytes
    sp = sequence_parallel and t > 1
    n_tok, h = b * m.seq_length, m.hidden_size
    nn = n_tok // t if sp else n_tok
    v = math.ceil(m.vocab_size / t)
    norm_flops = _NORM_FLOPS[m.norm]
    w = Builder("head", e)
    w.mem("head.norm", e * (nn * h + m.norm_params), e * nn * h, norm_flops * nn * h)
    if sp:
        w.comm("head.all_gather", "all_gather", e * n_tok * h)
    w.gemm("head.logits", n_tok, v, h)
    loss_forward(w, cross_entropy, n_tok, v, t)
    w.phase = "B"
    loss_backward(w, cross_entropy, n_tok, v)
    w.gemm("head.logits.dgrad", n_tok, h, v)
    if t > 1:
        w.comm("head.reduce_scatter.grad" if sp else "head.all_reduce.grad",
               "reduce_scatter" if sp else "all_reduce", e * n_tok * h)
    w.mem("head.norm.grad", 2 * e * nn * h + e * m.norm_params, e * nn * h + e * m.norm_params,
          2 * norm_flops * nn * h, output=e * nn * h)
    w.phase = "W"
    if sp:
        w.comm("head.all_gather.input", "all_gather", e * n_tok * h)
    w.gemm("head.logits.wgrad", v, h, n_tok)
    return w.build()


def chunk_work(model: ModelSpec, plan: ParallelPlan, virtual_stage: int, mb: int | None = None,
               routing=None, layout=None, profile=None) -> list:
    """The works of one model chunk in execution order: the embedding (virtual stage 0
    only), its layers (``plan.stage_layers(model)`` of them, so uneven splits are
    honoured; dense layers share one ``Work``) and the head with the loss (last virtual
    stage only). Chunk c of pipeline stage s is virtual stage c·pp + s (Megatron's
    interleaved assignment). A mixture of experts' layers take the busiest expert rank's
    tokens of micro-batch ``mb`` from ``routing`` (``sim.program.routing.Routing``), or the
    balanced load without them, moved by the plan's token dispatcher on the expert-parallel
    group's ``layout`` (``sim.program.dispatch``; default: nodes of 8 GPUs). ``profile``: the
    GPU that runs it, for the FP8 kernels that depend on it (``plan_layer_work``)."""
    n = plan.pp * plan.vpp
    require(isinstance(virtual_stage, int) and 0 <= virtual_stage < n, "virtual_stage", virtual_stage,
            f"expected 0..{n - 1} (pp x vpp = {plan.pp} x {plan.vpp})")
    b, t = plan.micro_batch_size, plan.tp
    plan.check_model(model)
    works = []
    for pos, lid in enumerate(plan.layer_range(model, virtual_stage)):
        moe = None
        if model.is_moe_layer(lid):
            tokens = b * model.seq_length // plan.cp // (t if plan.sp else 1)
            load = routing.max_load(lid, mb) if routing is not None and mb is not None else tokens * \
                model.moe_router_topk
            moe = moe_shape(model, plan, lid, load, layout, routing)
        works.append(plan_layer_work(model, plan, moe, model.layers[lid] if model.layers is not None else None,
                                     recompute=layer_recompute(plan, pos), profile=profile))
    embedding, head = plan_edge_works(model, plan)  # the embedding and the head see the rank's tokens only
    if virtual_stage == 0:
        works.insert(0, embedding)
    if virtual_stage == n - 1:
        works += [mtp_work(model, plan, k, layout, profile) for k in range(model.mtp_num_layers)]
        works.append(head)
    return works


def mtp_works(model: ModelSpec, plan: ParallelPlan, k: int, layout=None, profile=None) -> tuple[Work, Work]:
    """Multi-token-prediction module ``k`` as ``plan`` runs it on the last virtual stage:
    (its own work, its transformer layer's). DeepSeek-V3 (arXiv 2412.19437 §2.2, Eqs. 21-23):
    h'ᵢᵏ = Mₖ[RMSNorm(hᵢᵏ⁻¹); RMSNorm(Emb(tᵢ₊ₖ))], hᵏ = TRMₖ(h'ᵏ), Pᵏ = OutHead(hᵏ), the
    embedding and output head shared with the main model. Its own work is the shared
    embedding looked up again (``embedding_work``, its dense backward included), the two
    norms, the projection Mₖ (2h -> h, column-parallel as Megatron-LM's ``eh_proj``, its
    output gathered over tp) and the output head with the loss again (``head_work``); the
    layer is one of the model's kind (``ModelSpec.is_moe_layer(num_layers + k)``: MoE for
    DeepSeek-V3), under balanced routing."""
    local = local_sequence(model, plan.cp)
    b, t = plan.micro_batch_size, plan.tp
    lid = model.num_layers + k
    moe = None
    if model.is_moe_layer(lid):
        tokens = b * model.seq_length // plan.cp // (t if plan.sp else 1)
        moe = moe_shape(model, plan, lid, tokens * model.moe_router_topk, layout)
    embedding, head = plan_edge_works(model, plan)
    proj = _mtp_projection(local, b, t, plan.sequence_parallel)
    items = tuple(replace(i, name=f"mtp.{i.name}") for i in embedding.items + proj.items + head.items)
    return Work("mtp", items), plan_layer_work(model, plan, moe, model.layer(lid) if model.layers is not None else None,
                                               recompute=mtp_recompute(plan), profile=profile)


def _mtp_projection(m: ModelSpec, b: int, t: int, sequence_parallel: bool, dtype_bytes: int = 2) -> Work:
    """An MTP module's two RMSNorms (of the previous depth's hidden states and of the
    embedding) and its projection Mₖ of the 2h concatenation to h: a column-parallel GEMM
    whose h/t outputs are all-gathered over tp (Megatron-LM's ``eh_proj``, then
    ``gather_from_tensor_model_parallel_region``); under sequence parallelism its input is
    all-gathered first (and again for the weight gradient)."""
    e, h = dtype_bytes, m.hidden_size
    sp = sequence_parallel and t > 1
    n_tok = b * m.seq_length
    nn = n_tok // t if sp else n_tok
    norm_flops = _NORM_FLOPS[m.norm]
    w = Builder("mtp", e)
    for name in ("hnorm", "enorm"):
        w.mem(name, e * (nn * h + m.norm_params), e * nn * h, norm_flops * nn * h)
    if sp:
        w.comm("proj.all_gather", "all_gather", e * n_tok * 2 * h)
    w.gemm("proj", n_tok, h // t, 2 * h)
    if t > 1:
        w.comm("proj.all_gather.output", "all_gather", e * n_tok * h)
    w.phase = "B"
    w.gemm("proj.dgrad", n_tok, 2 * h, h // t)
    if t > 1:
        w.comm("proj.reduce_scatter.grad" if sp else "proj.all_reduce.grad",
               "reduce_scatter" if sp else "all_reduce", e * n_tok * 2 * h)
    for name in ("hnorm", "enorm"):
        w.mem(f"{name}.grad", 2 * e * nn * h + e * m.norm_params, e * nn * h + e * m.norm_params,
              2 * norm_flops * nn * h, output=e * nn * h)
    w.phase = "W"
    if sp:
        w.comm("proj.all_gather.input", "all_gather", e * n_tok * 2 * h)
    w.gemm("proj.wgrad", h // t, 2 * h, n_tok)
    return w.build()


def mtp_work(model: ModelSpec, plan: ParallelPlan, k: int, layout=None, profile=None) -> Work:
    """``mtp_works`` as one piece of the chunk, in the order it runs: in forward the
    embedding, norms and projection, the layer, the output head and loss; in backward the
    reverse; then the weight gradients."""
    own, layer = mtp_works(model, plan, k, layout, profile)
    head = [i for i in own.items if i.name.startswith(("mtp.head.", "mtp.loss"))]
    pre = [i for i in own.items if i not in head]
    items = []
    for ph, parts in (("F", (pre, layer.items, head)), ("B", (head, layer.items, pre)),
                      ("W", (head, layer.items, pre))):
        items += [i for part in parts for i in part if i.phase == ph]
    return Work("mtp", tuple(items))


def plan_edge_works(model: ModelSpec, plan: ParallelPlan) -> tuple[Work, Work]:
    """The embedding's and the head's work as ``plan`` runs them (on the rank's
    ``local_sequence``; the head with the plan's cross entropy and, unless fused, its
    weight gradient's accumulation pass)."""
    local = local_sequence(model, plan.cp)
    b, t, sp = plan.micro_batch_size, plan.tp, plan.sequence_parallel
    return edge_works(local, b, t, sp, plan.loss_kernels, plan.gradient_accumulation_fusion)


@lru_cache(maxsize=256)
def edge_works(model: ModelSpec, b: int, t: int, sp: bool, cross_entropy: str = "megatron",
               fused_accumulation: bool = True) -> tuple[Work, Work]:
    """``plan_edge_works`` from the plan's settings: (embedding, head) for ``model`` as the rank sees it."""
    return (embedding_work(model, b, t, sp),
            accumulate_wgrads(head_work(model, b, t, sp, cross_entropy=cross_entropy), fused_accumulation))


def plan_layer_work(model: ModelSpec, plan: ParallelPlan, moe: MoeShape | None = None,
                    layer: Layer | None = None, recompute: str | None = None, profile=None) -> Work:
    """One layer's work as ``plan`` runs it (``layer_work``, then FP8 casts and unfused
    gradient accumulation as the plan says); ``moe``: its expert shape, None for dense;
    ``layer``: its kinds (``sim.inputs.layers``; None: the model's standard layer);
    ``recompute``: the layer's own granularity under a recompute method
    (``sim.inputs.recompute.layer_recompute``), default the plan's; ``profile``: the GPU that runs
    it, whose ``fp8_gemm_any_layout`` decides whether per-tensor FP8 makes transposes
    (``sim.program.fp8``; None: a GPU whose FP8 GEMMs take TN operands only, Hopper's)."""
    s = plan.sections
    return layer_as_run(model, s.parallelism, s.recompute.at(recompute), s.precision, s.framework, moe, layer,
                        any_layout=fp8_any_layout(profile))


def fp8_any_layout(profile) -> bool:
    """Whether ``profile``'s FP8 GEMMs take any operand layout (``HardwareProfile.fp8_gemm_any_layout``);
    False for None."""
    return profile is not None and profile.fp8_gemm_any_layout


def local_sequence(model: ModelSpec, cp: int) -> ModelSpec:
    """The model as one of ``cp`` context-parallel ranks sees it: s/cp tokens per sequence."""
    return model if cp == 1 else replace(model, seq_length=model.seq_length // cp)


@lru_cache(maxsize=4096)
def layer_as_run(model: ModelSpec, par: ParallelismPlan, rec: RecomputePlan, prec: PrecisionPlan,
                 fw: FrameworkPlan, moe: MoeShape | None = None, layer: Layer | None = None,
                 any_layout: bool = False) -> Work:
    """``plan_layer_work`` from the plan's sections (``sim.inputs.plan_sections``), cached on
    them: ``layer_work`` on the rank's micro-batch, tp and cp share with ``rec``'s recompute and
    ``fw``'s attention, its attention run by ``fw``'s kernel (``with_attention_kernel``), then
    the casts of ``prec``'s precision over ``par``'s micro-batches on a GPU whose FP8 GEMMs take
    any layout or not (``any_layout``, ``sim.program.fp8``) and unfused gradient accumulation
    (``accumulate_wgrads``)."""
    t, sp = par.tp, par.sequence_parallel
    work = with_attention_kernel(layer_work(model, LayerRun.of(par, rec, fw), moe, layer), fw.kernel)
    work = with_eager_rope(work, model, par.micro_batch_size, t, framework_named(fw.framework).eager_rope)
    return accumulate_wgrads(fp8_layer_work(work, prec.precision, t, sp, par.num_microbatches, prec.fp8_param_gather,
                                            any_layout), fw.gradient_accumulation_fusion)


def p2p_bytes(model: ModelSpec, micro_batch: int, tp: int = 1, sequence_parallel: bool = False,
              dtype_bytes: int = 2, cp: int = 1) -> float:
    """Bytes one rank sends to the next pipeline stage per micro-batch (and its gradient
    back): the b·s·h activation, split over the tp group under sequence parallelism."""
    sp = sequence_parallel and tp > 1
    return dtype_bytes * micro_batch * model.seq_length * model.hidden_size / (tp if sp else 1) / cp


# ------------------------------------------------------------------ mixer kinds
# A mixer kind of ``sim.inputs.layers`` builds its own kernels (Mamba-2, Gated DeltaNet),
# except the attention kinds (full, sliding-window, chunked, MLA): theirs are the dense
# attention's builders above, given the kind's keys per query, so they are registered here
# where those builders live (inputs/ never reaches up into program/).
@singledispatch
def mixer_forward(kind, w, m, b: int, t: int, attention: str, ctx: tuple) -> None:
    """A mixer's forward kernels."""
    kind.forward(w, m, b, t, attention, ctx)


@mixer_forward.register
def _(kind: FullAttention, w, m, b: int, t: int, attention: str, ctx: tuple) -> None:
    attention_forward_block(w, m, b, t, attention, ctx, kind.keys_per_query(m.seq_length), kind.output_gate)


@singledispatch
def mixer_recompute_core(kind, w, m, b: int, t: int, attention: str, ctx: tuple) -> None:
    """A mixer's core recomputed under selective recompute (``core_attn``)."""
    kind.recompute_core(w, m, b, t, attention, ctx)


@mixer_recompute_core.register
def _(kind: FullAttention, w, m, b: int, t: int, attention: str, ctx: tuple) -> None:
    _attention_forward(w, m, b, t, attention, *ctx, keys=kind.keys_per_query(m.seq_length))


@singledispatch
def mixer_backward(kind, w, m, b: int, t: int, attention: str, ctx: tuple) -> None:
    """A mixer's backward (input-gradient) kernels."""
    kind.backward(w, m, b, t, attention, ctx)


@mixer_backward.register
def _(kind: FullAttention, w, m, b: int, t: int, attention: str, ctx: tuple) -> None:
    attention_backward_block(w, m, b, t, attention, ctx, kind.keys_per_query(m.seq_length), kind.output_gate)


@singledispatch
def mixer_wgrads(kind, w, m, n_tok: int, t: int, sp: bool) -> None:
    """A mixer's weight-gradient GEMMs."""
    kind.wgrads(w, m, n_tok, t, sp)


@mixer_wgrads.register
def _(kind: FullAttention, w, m, n_tok: int, t: int, sp: bool) -> None:
    w.gemm("attn.proj.wgrad", attention_widths(m)[1] // t, m.hidden_size, n_tok)
    if kind.output_gate:
        w.gemm("attn.gate.wgrad", m.hidden_size, m.q_dim // t, n_tok)
    qkv_wgrads(w, m, n_tok, t, sp)
