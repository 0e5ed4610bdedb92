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
forward for ``full``, the attention core's forward for ``selective``. FLOPs are the
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

from sim.errors import require
from sim.inputs.model import ModelSpec
from sim.inputs.plan import ATTENTION, RECOMPUTE, ParallelPlan

PHASES = ("F", "B", "W")
OP_KINDS = ("gemm", "attention", "memory")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")

# Nominal FLOPs per element of memory-bound kernels (they never bound the time).
_NORM_FLOPS = {"layernorm": 8, "rmsnorm": 5}
_ACT_FLOPS = {"gelu": 10, "swiglu": 6}


@dataclass(frozen=True)
class Op:
    """One kernel: what it computes and what it moves, for one micro-batch on one rank."""

    name: str
    phase: str
    kind: str
    """'gemm', 'attention' (fused flash) or 'memory' (elementwise, norm, embedding, loss)."""
    flops: float
    bytes_read: float
    bytes_written: float
    output_bytes: float
    shape: tuple = ()
    """GEMM (m, n, k); attention (seq_q, seq_k, head_dim)."""
    batch: int = 1
    """Independent GEMMs (or sequences × heads for attention) in the kernel."""
    recompute: bool = False
    framework: bool = False
    """A memory-bound kernel of the framework's own (Megatron-LM's torch.compile fusions,
    PyTorch eager ops), not a tuned library kernel: it streams at the profile's
    ``framework_kernel_efficiency``."""


@dataclass(frozen=True)
class Comm:
    """A collective over the tensor-parallel group. ``nbytes`` follows nccl-tests: the
    full buffer on one rank (the tensor all-reduced, the gathered output of an
    all-gather, the unreduced input of a reduce-scatter)."""

    name: str
    phase: str
    collective: str
    nbytes: float
    recompute: bool = False


@dataclass(frozen=True)
class Work:
    """Ops and collectives of one piece of the model, in execution order (F, then B, then W)."""

    name: str
    items: tuple

    def ops(self, phase: str | None = None, recompute: bool = True) -> tuple:
        return tuple(i for i in self.items if isinstance(i, Op) and (phase is None or i.phase == phase)
                     and (recompute or not i.recompute))

    def comms(self, phase: str | None = None, recompute: bool = True) -> tuple:
        return tuple(i for i in self.items if isinstance(i, Comm) and (phase is None or i.phase == phase)
                     and (recompute or not i.recompute))

    def flops(self, phase: str | None = None, recompute: bool = True, kinds=OP_KINDS) -> float:
        return sum(o.flops for o in self.ops(phase, recompute) if o.kind in kinds)

    def phase(self, phase: str) -> tuple:
        return tuple(i for i in self.items if i.phase == phase)


class _Builder:
    def __init__(self, name: str, e: int):
        self.name, self.e, self.items, self.phase = name, e, [], "F"

    def gemm(self, name, m, n, k, batch=1):
        e = self.e
        self.items.append(Op(name, self.phase, "gemm", 2.0 * m * n * k * batch,
                             e * (m * k + k * n) * batch, e * m * n * batch, e * m * n * batch,
                             (m, n, k), batch))

    def mem(self, name, read, written, flops=0.0, output=None, framework=False):
        self.items.append(Op(name, self.phase, "memory", float(flops), float(read), float(written),
                             float(written if output is None else output), framework=framework))

    def attention(self, name, flops, read, written, output, seq, head_dim, batch):
        self.items.append(Op(name, self.phase, "attention", float(flops), float(read), float(written),
                             float(output), (seq, seq, head_dim), batch))

    def comm(self, name, collective, nbytes):
        self.items.append(Comm(name, self.phase, collective, float(nbytes)))

    def build(self) -> Work:
        return Work(self.name, tuple(self.items))


def _check(model: ModelSpec, micro_batch: int, tp: int, recompute: str) -> None:
    require(isinstance(micro_batch, int) and micro_batch > 0, "micro_batch", micro_batch,
            "expected an integer > 0")
    require(isinstance(tp, int) and tp > 0, "tp", tp, "expected an integer > 0")
    require(recompute in RECOMPUTE, "recompute", recompute, f"allowed: {', '.join(RECOMPUTE)}")
    for field in ("num_attention_heads", "num_key_value_heads", "ffn_hidden_size"):
        require(getattr(model, field) % tp == 0, "tp", tp,
                f"must divide {field} {getattr(model, field)} of {model.name}")


def _attention_forward(w: _Builder, m: ModelSpec, b: int, t: int, attention: str) -> None:
    """The attention core's forward: one flash kernel, or Megatron-LM's unfused core
    attention (QKᵀ as a batched GEMM per head, the fused scale-mask-softmax and the
    dropout over the b·(a/t)·s² scores in memory, then AV); the same FLOPs either way."""
    e, s, h = w.e, m.seq_length, m.hidden_size
    heads, d = m.num_attention_heads // t, m.head_dim
    n_tok, qkv = b * s, (h + 2 * m.kv_dim) // t
    if attention == "flash":
        w.attention("attn.core", 4 * b * s * s * h / t, e * n_tok * qkv, e * n_tok * h / t + 4 * b * heads * s,
                    e * n_tok * h / t, s, d, b * heads)
        return
    bh = b * heads
    scores = bh * s * s
    w.gemm("attn.scores", s, s, d, batch=bh)
    w.mem("attn.softmax", e * scores, e * scores, 5 * scores)
    if m.dropout:
        w.mem("attn.dropout", e * scores, e * scores + scores, scores, framework=True)  # (and its 1-byte mask)
    w.gemm("attn.context", s, d, s, batch=bh)


def _attention_backward(w: _Builder, m: ModelSpec, b: int, t: int, attention: str) -> None:
    """The attention core's backward (input gradients only: it has no weights): the flash
    kernel's, or the unfused one's dV = PᵀdO, dP = dO·Vᵀ, dropout and softmax backward
    over the scores, dQ = dS·K and dK = dSᵀ·Q."""
    e, s, h = w.e, m.seq_length, m.hidden_size
    heads, d = m.num_attention_heads // t, m.head_dim
    n_tok, qkv = b * s, (h + 2 * m.kv_dim) // t
    if attention == "flash":
        w.attention("attn.core.grad", 8 * b * s * s * h / t,
                    e * (n_tok * qkv + 2 * n_tok * h / t) + 4 * b * heads * s,
                    e * n_tok * qkv, e * n_tok * qkv, s, d, b * heads)
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


def _layer_forward(w: _Builder, m: ModelSpec, b: int, t: int, sp: bool, attention: str = "flash") -> None:
    """Append one layer's forward (ops and collectives) to ``w`` in its current phase."""
    e, s, h = w.e, m.seq_length, m.hidden_size
    n_tok = b * s
    nn = n_tok // t if sp else n_tok                 # tokens seen by norms/dropout/residuals
    qkv = (h + 2 * m.kv_dim) // t
    f = m.ffn_hidden_size // t
    f_up = (2 if m.mlp == "swiglu" else 1) * f
    mask = nn * h if m.dropout else 0
    norm_flops = _NORM_FLOPS[m.norm]

    for blk, gemm_in in (("attn", qkv), ("mlp", f_up)):
        w.mem(f"{blk}.norm", e * (nn * h + m.norm_params), e * nn * h, norm_flops * nn * h)
        if t > 1 and sp:
            w.comm(f"{blk}.all_gather", "all_gather", e * n_tok * h)
        w.gemm(f"{blk}.{'qkv' if blk == 'attn' else 'up'}", n_tok, gemm_in, h)
        if blk == "attn":
            _attention_forward(w, m, b, t, attention)
            w.gemm("attn.proj", n_tok, h, h // t)
        else:
            read = (2 if m.mlp == "swiglu" else 1) * n_tok * f
            w.mem(f"mlp.{m.mlp}", e * read, e * n_tok * f, _ACT_FLOPS[m.mlp] * n_tok * f, framework=True)
            w.gemm("mlp.down", n_tok, h, f)
        if t > 1:
            w.comm(f"{blk}.{'reduce_scatter' if sp else 'all_reduce'}",
                   "reduce_scatter" if sp else "all_reduce", e * n_tok * h)
        # bias + dropout + residual add, fused as in Megatron-LM
        w.mem(f"{blk}.residual", 2 * e * nn * h, e * nn * h + mask, 3 * nn * h, output=e * nn * h, framework=True)


def layer_work(model: ModelSpec, micro_batch: int, tp: int = 1, sequence_parallel: bool = False,
               recompute: str = "none", dtype_bytes: int = 2, attention: str = "flash") -> Work:
    """One transformer layer's F, B and W for one micro-batch on one tensor-parallel rank
    (``attention``: "flash" or "unfused", ``ParallelPlan.attention``)."""
    _check(model, micro_batch, tp, recompute)
    require(attention in ATTENTION, "attention", attention, f"allowed: {', '.join(ATTENTION)}")
    m, b, t, e = model, micro_batch, tp, dtype_bytes
    sp = sequence_parallel and t > 1
    s, h = m.seq_length, m.hidden_size
    n_tok = b * s
    nn = n_tok // t if sp else n_tok
    qkv = (h + 2 * m.kv_dim) // t
    f = m.ffn_hidden_size // t
    f_up = (2 if m.mlp == "swiglu" else 1) * f
    mask = nn * h if m.dropout else 0
    norm_flops = _NORM_FLOPS[m.norm]

    w = _Builder("layer", e)
    _layer_forward(w, m, b, t, sp, attention)

    w.phase = "B"
    start = len(w.items)
    if recompute == "full":
        _layer_forward(w, m, b, t, sp, attention)
    elif recompute == "selective":
        _attention_forward(w, m, b, t, attention)
    w.items[start:] = [_as_recompute(i) for i in w.items[start:]]
    for blk, k_in, act in (("mlp", f_up, True), ("attn", qkv, False)):
        w.mem(f"{blk}.residual.grad", e * nn * h + mask, e * nn * h, nn * h, framework=True)
        if t > 1 and sp:
            w.comm(f"{blk}.all_gather.grad", "all_gather", e * n_tok * h)
        if act:
            w.gemm("mlp.down.dgrad", n_tok, f, h)
            read = (3 if m.mlp == "swiglu" else 2) * n_tok * f
            wrote = (2 if m.mlp == "swiglu" else 1) * n_tok * f
            w.mem(f"mlp.{m.mlp}.grad", e * read, e * wrote, 2 * _ACT_FLOPS[m.mlp] * n_tok * f, framework=True)
            w.gemm("mlp.up.dgrad", n_tok, h, f_up)
        else:
            w.gemm("attn.proj.dgrad", n_tok, h // t, h)
            _attention_backward(w, m, b, t, attention)
            w.gemm("attn.qkv.dgrad", n_tok, h, qkv)
        if t > 1:
            w.comm(f"{blk}.{'reduce_scatter' if sp else 'all_reduce'}.grad",
                   "reduce_scatter" if sp else "all_reduce", e * n_tok * h)
        w.mem(f"{blk}.norm.grad", 2 * e * nn * h + e * m.norm_params, e * nn * h + e * m.norm_params,
              2 * norm_flops * nn * h, output=e * nn * h)

    w.phase = "W"
    for name, rows, cols, regather in (("mlp.down", f, h, False), ("mlp.up", h, f_up, True),
                                       ("attn.proj", h // t, h, False), ("attn.qkv", h, qkv, True)):
        if regather and sp:
            w.comm(f"{name}.all_gather.input", "all_gather", e * n_tok * h)
        w.gemm(f"{name}.wgrad", rows, cols, n_tok)
    return w.build()


def _as_recompute(item):
    return replace(item, phase="B", recompute=True)


def embedding_work(model: ModelSpec, micro_batch: int, tp: int = 1, sequence_parallel: bool = False,
                   dtype_bytes: int = 2) -> Work:
    """Token (vocab-parallel) and position embedding lookup on the first stage."""
    _check(model, micro_batch, tp, "none")
    m, b, t, e = model, micro_batch, tp, dtype_bytes
    sp = sequence_parallel and t > 1
    n_tok, h = b * m.seq_length, m.hidden_size
    pos = 1 if m.position_embedding == "learned" else 0
    w = _Builder("embedding", e)
    w.mem("embed.lookup", 8 * n_tok + e * n_tok * h * (1 + pos), e * n_tok * h, n_tok * h * pos, framework=True)
    if t > 1:
        w.comm("embed.reduce_scatter" if sp else "embed.all_reduce",
               "reduce_scatter" if sp else "all_reduce", e * n_tok * h)
    w.phase = "W"
    if sp:
        w.comm("embed.all_gather.grad", "all_gather", e * n_tok * h)
    # scatter-add of the gradient rows into the (vocab shard of the) table
    w.mem("embed.wgrad", e * n_tok * h * (2 + pos), e * n_tok * h * (1 + pos), n_tok * h * (1 + pos), framework=True)
    return w.build()


def head_work(model: ModelSpec, micro_batch: int, tp: int = 1, sequence_parallel: bool = False,
              dtype_bytes: int = 2) -> Work:
    """Final norm, logit GEMM (vocab-parallel) and cross-entropy on the last stage."""
    _check(model, micro_batch, tp, "none")
    m, b, t, e = model, micro_batch, tp, dtype_bytes
    sp = sequence_parallel and t > 1
    n_tok, h = b * m.seq_length, m.hidden_size
    nn = n_tok // t if sp else n_tok
    v = math.ceil(m.vocab_size / t)
    norm_flops = _NORM_FLOPS[m.norm]
    w = _Builder("head", e)
    w.mem("head.norm", e * (nn * h + m.norm_params), e * nn * h, norm_flops * nn * h)
    if sp:
        w.comm("head.all_gather", "all_gather", e * n_tok * h)
    w.gemm("head.logits", n_tok, v, h)
    # vocab-parallel cross-entropy: fp32 softmax kept for backward; max, sum and target
    # logit all-reduced over the tp group (3 floats per token)
    w.mem("head.loss", e * n_tok * v, 4 * n_tok * v, 5 * n_tok * v, framework=True)
    if t > 1:
        w.comm("head.loss.all_reduce", "all_reduce", 3 * 4 * n_tok)
    w.phase = "B"
    w.mem("head.loss.grad", 4 * n_tok * v, e * n_tok * v, 2 * n_tok * v, framework=True)
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


def chunk_work(model: ModelSpec, plan: ParallelPlan, virtual_stage: int) -> list:
    """The works of one model chunk in execution order: the embedding (virtual stage 0
    only), its layers (one shared ``Work`` per layer, ``plan.stage_layers(model)`` of them,
    so uneven splits are honoured) and the head with the loss (last virtual stage only).
    Chunk c of pipeline stage s is virtual stage c·pp + s (Megatron's interleaved assignment)."""
    n = plan.pp * plan.vpp
    require(isinstance(virtual_stage, int) and 0 <= virtual_stage < n, "virtual_stage", virtual_stage,
            f"expected 0..{n - 1} (pp x vpp = {plan.pp} x {plan.vpp})")
    b, t, sp = plan.micro_batch_size, plan.tp, plan.sequence_parallel
    plan.check_model(model)
    layer = layer_work(model, b, t, sp, plan.recompute, attention=plan.attention)
    works = [layer] * plan.stage_layers(model)[virtual_stage]
    if virtual_stage == 0:
        works.insert(0, embedding_work(model, b, t, sp))
    if virtual_stage == n - 1:
        works.append(head_work(model, b, t, sp))
    return works


def p2p_bytes(model: ModelSpec, micro_batch: int, tp: int = 1, sequence_parallel: bool = False,
              dtype_bytes: int = 2) -> float:
    """Bytes one rank sends to the next pipeline stage per micro-batch (and its gradient
    back): the b·s·h activation, split over the tp group under sequence parallelism."""
    sp = sequence_parallel and tp > 1
    return dtype_bytes * micro_batch * model.seq_length * model.hidden_size / (tp if sp else 1)
