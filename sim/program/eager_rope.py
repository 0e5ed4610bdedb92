"""The rotary embedding as eager PyTorch runs it in NeMo AutoModel's own MoE models.

trainsim's MLA (``sim.program.workload_moe.qkv_forward``) prices the projections, their norms
and the attention core; like Megatron-Core's, whose rows the presets are fitted to, it has no
kernel for the rotary embedding: Megatron-Core's MLA with ``apply_rope_fusion`` rotates the
query's rope part in place and builds the key and value in one fused kernel each
(``fused_apply_mla_rope_for_q`` / ``fused_apply_mla_rope_for_kv``), whose cost the fitted
compute fraction carries with the rest of its small kernels.

NeMo AutoModel's MLA (nemo_automodel/components/models/deepseek_v3/layers.py ``MLA.forward``
@ 89e3a9fdd604, which its Kimi-K2 rows run too) does it with eager ops
(components/moe/rope_utils.py ``apply_rotary_emb``) after the query's up-projection:

    q = q.view(b, s, heads, qk_head_dim + rope)
    q_nope, q_pe = torch.split(q, [qk_head_dim, rope], dim=-1)        # views
    q_pe = apply_rotary_emb(q_pe, freqs_cis)   # x.float(); view_as_complex(x) * freqs_cis;
                                               # view_as_real(...).flatten(3); .to(bf16)
    q = torch.cat([q_nope, q_pe], dim=-1)

and the same ``apply_rotary_emb`` on the key's single rope head ``k_pe`` [b, s, 1, rope]. So per
layer and micro-batch, over N = b·s tokens and H heads on the rank, with r the rope width and
d the no-rope query width (element counts, the byte sizes in the code below):

- forward, each one kernel: the fp32 upcast of q_pe (reads N·H·r bf16, writes it in fp32), the
  complex multiply (reads the fp32 q_pe and the N·r/2 complex fp32 frequencies, writes N·H·r
  fp32; 6 FLOPs a complex product), the downcast (reads fp32, writes bf16) and ``torch.cat``
  (reads N·H·(d + r), writes as much); the same three rope kernels on k_pe (N·r elements);
- backward (autograd, in reverse): the downcast's backward (bf16 gradient to fp32), the complex
  multiply's (the gradient times the conjugate frequencies), the upcast's (fp32 to bf16), and
  ``torch.split``'s, which concatenates the two query gradients into q's [N, H, d + r] (the
  ``cat``'s own backward only slices: views); the same three on k_pe's gradient.

AutoModel's Qwen3-MoE attention (components/models/qwen3_moe/layers.py ``Qwen3MoeAttention.forward``
@ 8d9bfb90e3d8, the M4 row's) rotates the whole query and key heads after their per-head norms
with GPT-OSS's ``_apply_rotary_emb`` (components/models/gpt_oss/layers.py), the rotate-half form
in the activations' dtype:

    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)   # fp32 [b, s, d/2]
    x1, x2 = torch.chunk(x, 2, dim=-1)                                         # views
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    return torch.cat((o1, o2), dim=-1)

so per tensor of n elements (rows of head width d; ``rotate_half_ops``): forward the two casts
of the b·s·d/2 fp32 angles, four half-size products (each reads n/2 elements and the angles,
writes n/2), the subtraction and the addition (each reads n, writes n/2) and the ``cat`` (reads
and writes n); backward the four products' gradients (the gradient times cos or sin), the
subtraction's negation, autograd's sums of the two gradients x1 and x2 each receive (each reads
n, writes n/2), and ``chunk``'s backward, a ``cat`` of them (the forward ``cat``'s backward and
the addition's only pass views on). Megatron-Core's rows run Transformer Engine's fused rope
(``apply_rope_fusion``), unpriced like its MLA kernels. AutoModel's dense models are Hugging
Face's with its Liger kernels (a fused rope), so only a model with routed experts gets these.

The key's concatenation (``torch.cat([k_nope, k_pe.expand(...)])``) is not added: Megatron-Core's
fused kernel for the key and value writes as much, so neither framework's is priced. Under
full recomputation the forward ones run again before the backward (they follow the query's
up-projection, ``attn.q_up``, wherever it runs). The kernels are the framework's own eager
ops (``Op.framework``: the profile's ``framework_kernel_efficiency``).
"""

from __future__ import annotations

from dataclasses import replace

from sim.inputs.model import ModelSpec
from sim.program.ops import Op, Work

FP32_BYTES = 4
"""``x.float()``: the rope part is rotated in fp32 (``apply_rotary_emb``)."""
COMPLEX_MUL_FLOPS = 6
"""FLOPs of one complex product (four multiplies, two adds) per two elements."""


def _chain(name: str, phase: str, rows: float, tokens: float, r: int, d: int, e: int, grad: bool, query: bool,
           recompute: bool) -> list[Op]:
    """The rope kernels of one tensor of ``rows`` token-heads (``tokens`` tokens) with rope width
    ``r`` (and, for the ``query``, its concatenation with the d-wide no-rope part), forward or
    (``grad``) backward, in the order they run."""
    n = rows * r
    freqs = FP32_BYTES * tokens * r  # freqs_cis: tokens x r/2 complex64, broadcast over the heads

    def op(kind: str, read: float, written: float, flops: float = 0.0) -> Op:
        return Op(f"{name}{'.grad' if grad else ''}.{kind}", phase, "memory", float(flops), float(read),
                  float(written), float(written), recompute=recompute, framework=True)

    rotate = op("rotate", FP32_BYTES * n + freqs, FP32_BYTES * n, COMPLEX_MUL_FLOPS * n / 2)
    if not grad:  # upcast, rotate, downcast, then the query's cat
        cat = [op("cat", e * rows * (d + r), e * rows * (d + r))] if query else []
        return [op("upcast", e * n, FP32_BYTES * n), rotate, op("downcast", FP32_BYTES * n, e * n)] + cat
    # the downcast's backward (to fp32), the rotation's, the upcast's (to bf16), then split's cat
    split = [op("split_cat", e * rows * (d + r), e * rows * (d + r))] if query else []
    return [op("downcast", e * n, FP32_BYTES * n), rotate, op("upcast", FP32_BYTES * n, e * n)] + split


def rope_ops(model: ModelSpec, tokens: int, tp: int, phase: str, grad: bool, recompute: bool = False,
             dtype_bytes: int = 2) -> list[Op]:
    """AutoModel's eager MLA rope kernels (module doc) for ``tokens`` tokens on one of ``tp``
    ranks (heads split over tp): forward, or ``grad`` its backward."""
    heads = model.num_attention_heads // tp
    r, d, e = model.qk_pos_emb_head_dim, model.qk_head_dim, dtype_bytes
    q = _chain("attn.q_rope", phase, tokens * heads, tokens, r, d, e, grad, True, recompute)
    k = _chain("attn.k_rope", phase, tokens, tokens, r, d, e, grad, False, recompute)
    return q + k


def rotate_half_ops(model: ModelSpec, tokens: int, tp: int, phase: str, grad: bool, recompute: bool = False,
                    dtype_bytes: int = 2) -> list[Op]:
    """GPT-OSS's ``_apply_rotary_emb`` (module doc) on the query's and the key's heads of
    ``tokens`` tokens on one of ``tp`` ranks: forward, or ``grad`` its backward."""
    e, d = dtype_bytes, model.head_dim
    angles = tokens * d / 2  # cos (and sin): b x s x d/2 fp32, cast to the activations' dtype per call
    out = []
    for name, heads in (("attn.q_rope", model.num_attention_heads // tp),
                        ("attn.k_rope", max(1, model.num_key_value_heads // tp))):
        n = tokens * heads * d

        def op(kind: str, read: float, written: float, flops: float, _name=name) -> Op:
            return Op(f"{_name}{'.grad' if grad else ''}.{kind}", phase, "memory", float(flops), float(read),
                      float(written), float(written), recompute=recompute, framework=True)

        product = [op(f"mul{i}", e * (n / 2 + angles), e * n / 2, n / 2) for i in range(4)]
        if not grad:  # the angles' casts, x1·cos, x2·sin, their difference, x2·cos, x1·sin, their sum, cat
            casts = [op(f"{w}.cast", FP32_BYTES * angles, e * angles, 0.0) for w in ("cos", "sin")]
            diff, total = (op(k, e * n, e * n / 2, n / 2) for k in ("sub", "add"))
            out += casts + product[:2] + [diff] + product[2:] + [total] + [op("cat", e * n, e * n, 0.0)]
        else:  # the products' gradients, -grad(o1), the sums into x1 and x2, chunk's cat
            sums = [op(f"sum{i}", e * n, e * n / 2, n / 2) for i in range(2)]
            out += product[2:] + [op("neg", e * n / 2, e * n / 2, n / 2)] + product[:2] + sums + \
                [op("chunk_cat", e * n, e * n, 0.0)]
    return out


def with_eager_rope(work: Work, model: ModelSpec, micro_batch: int, tp: int, eager: bool) -> Work:
    """``work`` with AutoModel's eager rope kernels (module doc) when ``eager``
    (``Framework.eager_rope``) and the model is one of AutoModel's own (routed experts) with
    rotary positions: MLA's after each query up-projection (the recomputed one too) and its
    gradients before the up-projection's input gradient; otherwise the rotate-half form after the
    query and key projections (after their per-head norms, ``attn.qk_norm``, where there are
    any) and its gradients before theirs. Unchanged otherwise."""
    if not eager or not model.moe or (not model.mla and model.position_embedding != "rope"):
        return work
    tokens = micro_batch * model.seq_length
    if model.mla:
        ops, after, before = rope_ops, "attn.q_up", "attn.q_up.dgrad"
    else:
        ops, after = rotate_half_ops, "attn.qk_norm" if model.qk_layernorm else "attn.qkv"
        before = "attn.qk_norm.grad" if model.qk_layernorm else "attn.qkv.dgrad"
    items = []
    for it in work.items:
        if isinstance(it, Op) and it.name == before:
            items += ops(model, tokens, tp, it.phase, grad=True)
        items.append(it)
        if isinstance(it, Op) and it.name == after:
            items += [replace(o, recompute=it.recompute) for o in ops(model, tokens, tp, it.phase, grad=False)]
    return Work(work.name, tuple(items))
