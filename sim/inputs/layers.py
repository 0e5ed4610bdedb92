"""Layer kinds: what one layer of a model is, found by name in one registry (``KINDS``).

A model is a sequence of layers (``Layer``), each a *mixer* (the block that mixes tokens:
attention of some kind, or a state-space / linear-attention recurrence) and an *MLP* (a
dense MLP or a mixture of experts), either of which may be absent (Nemotron-H's layers are
each one block: a Mamba-2 mixer, an attention mixer or an MLP). Each block sits between its
norm and its residual add. A kind is a frozen dataclass that owns, in one place:

- its parameters (``params``; per tensor-parallel rank ``params_per_rank``);
- its tensor/context/sequence-parallel rules (``check_plan``: a one-line refusal where
  Megatron-Core has no such combination, never an invented cost);
- the kernels it runs in forward, backward (input gradients) and weight gradients
  (``forward``, ``backward``, ``wgrads``, onto ``sim.program.ops.Builder``), with the FLOPs
  and bytes of each; the profile prices them (GEMMs at its shape-dependent GEMM
  efficiency, flash attention at its attention efficiency, the rest as memory-bound kernels);
- the tensors it stores for its backward (``stored``: bytes by name, one micro-batch on one
  rank), from which activation memory and recompute rules follow.

The kinds a model had before layer kinds existed (full causal attention, MLA, a dense MLP
and an MoE block) call the costing functions of ``sim.program.workload`` and
``sim.program.workload_moe`` unchanged, so every existing model gives identical results:
``ModelSpec.layers`` is None for them and ``standard_layer`` builds each layer from the
model's fields as before.

Kinds (``KINDS``; the name is what presets and configs say):

==================  =========================================================================
``attention``       full causal attention (grouped-query; optional output gate, Qwen3-Next)
``sliding``         sliding-window causal attention, each query sees the last ``window`` keys
                    (Mistral, Gemma 2/3 local layers, gpt-oss)
``chunked``         chunked local attention, causal within chunks of ``chunk`` tokens (Llama 4)
``mla``             multi-head latent attention (DeepSeek-V2/V3; ``sim.inputs.moe``)
``mamba2``          Mamba-2 (Dao & Gu 2024, SSD): in/out projections, causal conv, chunked scan
``gated_deltanet``  Gated DeltaNet linear attention (Yang, Kautz & Hatamizadeh 2024), chunked
``mlp``             dense MLP (gated SwiGLU or not, as the model's ``mlp``)
``moe``             mixture of experts, with shared experts where the model has them
==================  =========================================================================

Attention FLOPs follow the project's convention (``sim.program.workload``): the papers'
non-causal count, 2·s·s per head and width for QKᵀ plus AV, which is twice the causal work.
A window or chunk counts its causal band the same way, doubled: a query at position i sees
min(i+1, w) keys, summed over the sequence s·w − w²/2 + O(w), doubled 2sw − w², i.e.
``keys_per_query`` = 2w − w²/s keys (s when w >= s; chunked: c keys, each chunk's c²/2
doubled). The flash kernel is priced at the attention efficiency of s queries against those
keys.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from sim.errors import InputError, require


def _pos(where: str, field: str, value) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0, f"{where}: {field}", value,
            "expected an integer > 0")


def _plan(cond: bool, field: str, value, allowed: str) -> None:
    """A plan rule of a kind: named as the plan's field, which the front end names as the
    user wrote it (``--tensor-model-parallel-size``, ``--context-parallel-size``)."""
    require(cond, f"plan: {field}", value, allowed, setting=field)


def _divides(tp: int, value: int, what: str, m) -> None:
    _plan(value % tp == 0, "tp", tp, f"must divide {what} {value} of {m.name}")


# ------------------------------------------------------------------------------ base
@dataclass(frozen=True)
class Kind:
    """A block of a layer. Subclasses set ``name`` (its registry key), ``role`` ('mixer'
    or 'mlp') and ``block`` (the prefix of its kernels' names)."""

    name: ClassVar[str] = ""
    role: ClassVar[str] = ""
    block: ClassVar[str] = ""
    owns_tp_comms: ClassVar[bool] = False
    """The block issues its own tensor-parallel collectives (the MoE block); otherwise the
    layer wraps it in Megatron-LM's column/row-parallel pair (all-reduce, or all-gather and
    reduce-scatter under sequence parallelism)."""

    @property
    def mixes(self) -> bool:
        """A mixer (attention, state space, linear attention), not an MLP."""
        return self.role == "mixer"

    def check(self, m, where: str) -> None:
        """The kind's own fields against the model (called by ``ModelSpec``)."""

    def check_plan(self, m, plan) -> None:
        """Tensor/context-parallel rules of this kind under ``plan``."""

    def describe(self) -> str:
        vals = [f"{f.name}={getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) != f.default]
        return f"{self.name}({', '.join(vals)})" if vals else self.name


# -------------------------------------------------------------------------- attention
@dataclass(frozen=True)
class FullAttention(Kind):
    """Full causal (grouped-query) attention: QKV column-parallel, the output projection
    row-parallel, a/t heads per rank (Megatron-LM). ``output_gate``: a sigmoid gate of the
    attention output computed by a second query-wide projection (Qwen3-Next's gated
    attention; its q_proj is twice as wide)."""

    output_gate: bool = False
    name: ClassVar[str] = "attention"
    role: ClassVar[str] = "mixer"
    block: ClassVar[str] = "attn"

    def keys_per_query(self, s: int) -> int:
        return s

    def params(self, m) -> int:
        return m.attention_params + (m.hidden_size * m.q_dim if self.output_gate else 0)

    def params_per_rank(self, m, tp: int) -> float:
        h = m.hidden_size
        qkv = m.q_dim + 2 * m.kv_dim
        split = h * qkv + m.q_dim * h + (qkv if m.bias else 0) + (h * m.q_dim if self.output_gate else 0)
        return split / tp + (h if m.bias else 0)

    def check_plan(self, m, plan) -> None:
        _divides(plan.tp, m.num_attention_heads, "num_attention_heads", m)
        _divides(plan.tp, m.num_key_value_heads, "num_key_value_heads", m)

    # its kernels (forward, the recomputed core, backward, weight gradients) and stored
    # tensors are the dense attention's, built by sim.program (``workload.mixer_forward`` and
    # its siblings, ``memory.activations.mixer_stored``) with this kind's keys per query


@dataclass(frozen=True)
class SlidingWindowAttention(FullAttention):
    """Causal attention over the last ``window`` tokens (Mistral 7B's ``sliding_window``;
    Gemma 2/3 local layers; gpt-oss's banded layers, 128 tokens). FLOPs and flash time
    follow the band (module doc); the unfused core still multiplies and masks all s×s
    scores. Transformer Engine runs a window under context parallelism only with the
    all-gather exchange (TE's ``DotProductAttention`` docs: sliding windows with
    ``cp_comm_type`` 'a2a' or 'all_gather'); trainsim does not model a window's
    all-gather exchange, so any cp > 1 is refused."""

    window: int = 0
    name: ClassVar[str] = "sliding"

    field: ClassVar[str] = "sliding_window"

    def check(self, m, where: str) -> None:
        _pos(where, self.field, self.window)
        require(self.window <= m.seq_length, f"{where}: {self.field}", self.window,
                f"must be <= seq_length {m.seq_length} (a window as long as the sequence is full attention)")

    def keys_per_query(self, s: int) -> int:
        w = self.window
        return s if w >= s else round(2 * w - w * w / s)

    def check_plan(self, m, plan) -> None:
        super().check_plan(m, plan)
        _plan(plan.cp == 1, "cp", plan.cp,
                f"context parallelism over {self.name} attention is not modelled (1 only, {m.name})")


@dataclass(frozen=True)
class ChunkedAttention(SlidingWindowAttention):
    """Llama 4's chunked local attention (``attention_chunk_size`` 8192): causal attention
    inside consecutive chunks of ``window`` tokens, none across them; per query c keys in
    the doubled convention (module doc)."""

    name: ClassVar[str] = "chunked"
    field: ClassVar[str] = "attention_chunk_size"

    def check(self, m, where: str) -> None:
        """A chunk may exceed the sequence (then the layer is full attention: Llama 4
        trained at 4K tokens with 8K chunks); a window may not (``SlidingWindowAttention``)."""
        _pos(where, self.field, self.window)

    def keys_per_query(self, s: int) -> int:
        return min(self.window, s)


@dataclass(frozen=True)
class MLA(FullAttention):
    """Multi-head latent attention (DeepSeek-V2/V3): ``sim.inputs.moe`` counts it,
    ``sim.program.workload_moe`` builds its projections."""

    name: ClassVar[str] = "mla"

    def params(self, m) -> int:
        return m.attention_params

    def params_per_rank(self, m, tp: int) -> float:
        from sim.inputs.moe import mla_params_per_rank

        return mla_params_per_rank(m, tp)


# --------------------------------------------------------------------------- Mamba-2
@dataclass(frozen=True)
class Mamba2(Kind):
    """A Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs", §7 and the SSD algorithm of
    §6/Listing 1), as Megatron-Core's ``MambaMixer`` and HF's ``Mamba2Mixer`` build it:
    ``heads`` H of ``head_dim`` P (d_inner = H·P), state N = ``state``, G = ``groups`` of
    B/C shared by H/G heads, a causal depthwise conv of ``conv`` taps, chunks of
    Q = ``chunk`` tokens.

    Parameters: in_proj h → 2·d_inner + 2·G·N + H (z, x, B, C, dt), no bias; conv1d over
    d_inner + 2GN channels with a bias; A_log, D and dt_bias (H each); the gated RMSNorm
    (d_inner); out_proj d_inner → h.

    SSD per sequence of T tokens, T/Q chunks (Listing 1's four steps), forward:
    intra-chunk C·Bᵀ per group 2Q²N and its product with X per head 2Q²P; chunk states
    Bᵀ·X per head 2QNP; the outputs from the passed states C·state per head 2QNP; the
    state passing between chunks a scan over T/Q states of N·P per head (memory-bound).
    Forward = (T/Q)·(2Q²N·G + H·(2Q²P + 4QNP)); backward twice that (each product's two
    input gradients). Tensor parallelism splits heads and groups (``heads`` and ``groups``
    divisible by tp; Megatron-Core's rule); Megatron-Core's Mamba layers do not run under
    context parallelism (refused)."""

    heads: int = 0
    head_dim: int = 0
    state: int = 0
    groups: int = 1
    conv: int = 4
    chunk: int = 256
    name: ClassVar[str] = "mamba2"
    role: ClassVar[str] = "mixer"
    block: ClassVar[str] = "mamba"

    def check(self, m, where: str) -> None:
        for f in ("heads", "head_dim", "state", "groups", "conv", "chunk"):
            _pos(where, f"mamba2 {f}", getattr(self, f))
        require(self.heads % self.groups == 0, f"{where}: mamba2 groups", self.groups,
                f"must divide heads {self.heads}")

    @property
    def d_inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.groups * self.state

    @property
    def in_width(self) -> int:
        return 2 * self.d_inner + 2 * self.groups * self.state + self.heads

    def params(self, m) -> int:
        h = m.hidden_size
        return (h * self.in_width + self.conv_dim * (self.conv + 1) + 3 * self.heads + self.d_inner
                + self.d_inner * h)

    def params_per_rank(self, m, tp: int) -> float:
        return self.params(m) / tp  # every part is split by head/group over tp

    def check_plan(self, m, plan) -> None:
        _plan(self.heads % plan.tp == 0, "tp", plan.tp, f"must divide mamba2 heads {self.heads} of {m.name}")
        _plan(self.groups % plan.tp == 0, "tp", plan.tp, f"must divide mamba2 groups {self.groups} of {m.name}")
        _plan(plan.cp == 1, "cp", plan.cp,
                f"Megatron-Core does not run Mamba layers under context parallelism (1 only, {m.name})")

    def ssd_gemms(self, b: int, s: int, t: int) -> list:
        """The SSD scan's matrix products of one micro-batch on one rank, as (name, m, n, k,
        batch) batched GEMMs (class doc)."""
        Q = min(self.chunk, s)
        n = b * -(-s // Q)                       # chunks of the micro-batch
        H, G, N, P = self.heads // t, self.groups // t, self.state, self.head_dim
        return [("mamba.ssd.cb", Q, Q, N, n * G), ("mamba.ssd.diag", Q, P, Q, n * H),
                ("mamba.ssd.states", N, P, Q, n * H), ("mamba.ssd.off", Q, P, N, n * H)]

    def ssd_flops(self, b: int, s: int, t: int = 1) -> float:
        return sum(2.0 * mm * nn * kk * bb for _, mm, nn, kk, bb in self.ssd_gemms(b, s, t))

    def forward(self, w, m, b: int, t: int, attention: str, ctx: tuple) -> None:
        e, s, h = w.e, m.seq_length, m.hidden_size
        n_tok = b * s
        w.gemm("mamba.in_proj", n_tok, self.in_width // t, h)
        c = self.conv_dim // t
        w.mem("mamba.conv1d", e * n_tok * c, e * n_tok * c, 2 * self.conv * n_tok * c)
        for name, mm, nn, kk, bb in self.ssd_gemms(b, s, t):
            w.gemm(name, mm, nn, kk, batch=bb)
        self._state_passing(w, b, s, t, "mamba.ssd.scan")
        d = self.d_inner // t
        w.mem("mamba.gated_norm", 2 * e * n_tok * d, e * n_tok * d, 8 * n_tok * d)
        w.gemm("mamba.out_proj", n_tok, h, d)

    def _state_passing(self, w, b: int, s: int, t: int, name: str) -> None:
        """The inter-chunk recurrence: each chunk's fp32 state (H·P·N per sequence) read,
        decayed and added to the next (SSD step 3)."""
        chunks = b * -(-s // min(self.chunk, s))
        st = chunks * (self.heads // t) * self.head_dim * self.state
        w.mem(name, 4 * 2 * st, 4 * st, 2 * st)

    def recompute_core(self, w, m, b, t, attention, ctx) -> None:
        """Selective ``core_attn`` recompute applies to attention layers only."""

    def backward(self, w, m, b: int, t: int, attention: str, ctx: tuple) -> None:
        e, s, h = w.e, m.seq_length, m.hidden_size
        n_tok = b * s
        d = self.d_inner // t
        w.gemm("mamba.out_proj.dgrad", n_tok, d, h)
        w.mem("mamba.gated_norm.grad", 3 * e * n_tok * d, 2 * e * n_tok * d, 16 * n_tok * d)
        self._state_passing(w, b, s, t, "mamba.ssd.scan.grad")
        for name, mm, nn, kk, bb in reversed(self.ssd_gemms(b, s, t)):
            w.gemm(f"{name}.dgrad_a", mm, kk, nn, batch=bb)
            w.gemm(f"{name}.dgrad_b", kk, nn, mm, batch=bb)
        c = self.conv_dim // t
        w.mem("mamba.conv1d.grad", 2 * e * n_tok * c, 2 * e * n_tok * c, 4 * self.conv * n_tok * c)
        w.gemm("mamba.in_proj.dgrad", n_tok, h, self.in_width // t)

    def wgrads(self, w, m, n_tok: int, t: int, sp: bool) -> None:
        h = m.hidden_size
        w.gemm("mamba.out_proj.wgrad", self.d_inner // t, h, n_tok)
        if sp:
            w.comm("mamba.in_proj.all_gather.input", "all_gather", w.e * n_tok * h)
        w.gemm("mamba.in_proj.wgrad", h, self.in_width // t, n_tok)

    def stored(self, m, b: int, t: int, sp: bool, g: float, flash: bool, mods: tuple) -> dict:
        """The in_proj input (the norm output), its output (z, x, B, C, dt), the conv output,
        the chunk states (fp32, H·P·N per chunk), the scan output and the gated norm's
        output (the out_proj input); 16-bit unless said."""
        s = m.seq_length
        n_tok = b * s
        rep = t if sp else 1
        chunks = b * -(-s // min(self.chunk, s))
        return {"mamba.in_proj.input": g * n_tok * m.hidden_size / rep,
                "mamba.in_proj.output": 2 * n_tok * self.in_width / t,
                "mamba.conv1d.output": 2 * n_tok * self.conv_dim / t,
                "mamba.ssd.states": 4 * chunks * self.heads * self.head_dim * self.state / t,
                "mamba.ssd.output": 2 * n_tok * self.d_inner / t,
                "mamba.out_proj.input": g * n_tok * self.d_inner / t}


# ------------------------------------------------------------------- Gated DeltaNet
@dataclass(frozen=True)
class GatedDeltaNet(Kind):
    """Gated DeltaNet linear attention (Yang, Kautz & Hatamizadeh 2024, "Gated Delta Networks:
    Improving Mamba2 with Delta Rule", ICLR 2025), as Qwen3-Next builds it (HF
    ``Qwen3NextGatedDeltaNet``): ``key_heads`` of ``key_dim`` for q and k, ``value_heads``
    of ``value_dim`` for v and the output gate z; a causal depthwise conv of ``conv`` taps over
    q, k, v; per value head a decay α and a step β; a gated RMSNorm; out_proj.

    Parameters: in_proj_qkvz h → 2·Kh·dk + 2·Vh·dv, in_proj_ba h → 2·Vh, conv over
    2·Kh·dk + Vh·dv channels (no bias), A_log and dt_bias (Vh each), the norm (dv), out_proj
    Vh·dv → h.

    Chunked recurrence (the chunkwise WY form of Yang et al. 2024, "Parallelizing Linear
    Transformers with the Delta Rule", §3, that Gated DeltaNet keeps, with the decay folded
    in), per chunk of C tokens and value head (q and k shared by Vh/Kh heads): KKᵀ 2C²dk,
    the triangular solve (I + A)⁻¹ C³/3 multiply-adds, W = T·K 2C²dk and U = T·V 2C²dv,
    QKᵀ 2C²dk, W·S 2C·dk·dv, the intra-chunk output 2C²dv, Q·S 2C·dk·dv and the state update
    Kᵀ·U' 2C·dk·dv: 6C²dk + 4C²dv + 6C·dk·dv + 2C³/3 per chunk and head. Backward twice the
    products. Tensor parallelism splits heads (both head counts divisible by tp); context
    parallelism is refused (not in Megatron-Core's linear-attention layers)."""

    key_heads: int = 0
    value_heads: int = 0
    key_dim: int = 0
    value_dim: int = 0
    conv: int = 4
    chunk: int = 64
    name: ClassVar[str] = "gated_deltanet"
    role: ClassVar[str] = "mixer"
    block: ClassVar[str] = "gdn"

    def check(self, m, where: str) -> None:
        for f in ("key_heads", "value_heads", "key_dim", "value_dim", "conv", "chunk"):
            _pos(where, f"gated_deltanet {f}", getattr(self, f))
        require(self.value_heads % self.key_heads == 0, f"{where}: gated_deltanet key_heads", self.key_heads,
                f"must divide value_heads {self.value_heads}")

    @property
    def key_width(self) -> int:
        return self.key_heads * self.key_dim

    @property
    def value_width(self) -> int:
        return self.value_heads * self.value_dim

    @property
    def in_width(self) -> int:
        return 2 * self.key_width + 2 * self.value_width + 2 * self.value_heads

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_width + self.value_width

    def params(self, m) -> int:
        h = m.hidden_size
        return h * self.in_width + self.conv_dim * self.conv + 2 * self.value_heads + self.value_dim \
            + self.value_width * h

    def params_per_rank(self, m, tp: int) -> float:
        return (self.params(m) - self.value_dim) / tp + self.value_dim

    def check_plan(self, m, plan) -> None:
        for f in ("key_heads", "value_heads"):
            _plan(getattr(self, f) % plan.tp == 0, "tp", plan.tp,
                    f"must divide gated_deltanet {f} {getattr(self, f)} of {m.name}")
        _plan(plan.cp == 1, "cp", plan.cp,
                f"context parallelism over gated_deltanet layers is not supported by Megatron-Core (1 only, {m.name})")

    def chunk_gemms(self, b: int, s: int, t: int) -> list:
        """(name, m, n, k, batch) of the chunked recurrence's products on one rank (class doc)."""
        C = min(self.chunk, s)
        n = b * -(-s // C) * (self.value_heads // t)
        dk, dv = self.key_dim, self.value_dim
        return [("gdn.kk", C, C, dk, n), ("gdn.w", C, dk, C, n), ("gdn.u", C, dv, C, n), ("gdn.qk", C, C, dk, n),
                ("gdn.ws", C, dv, dk, n), ("gdn.intra", C, dv, C, n), ("gdn.qs", C, dv, dk, n),
                ("gdn.state", dk, dv, C, n)]

    def solve_flops(self, b: int, s: int, t: int = 1) -> float:
        C = min(self.chunk, s)
        return 2 * C ** 3 / 3 * b * -(-s // C) * (self.value_heads // t)

    def chunk_flops(self, b: int, s: int, t: int = 1) -> float:
        return sum(2.0 * mm * nn * kk * bb for _, mm, nn, kk, bb in self.chunk_gemms(b, s, t)) \
            + self.solve_flops(b, s, t)

    def forward(self, w, m, b: int, t: int, attention: str, ctx: tuple) -> None:
        e, s, h = w.e, m.seq_length, m.hidden_size
        n_tok = b * s
        w.gemm("gdn.in_proj", n_tok, self.in_width // t, h)
        c = self.conv_dim // t
        w.mem("gdn.conv1d", e * n_tok * c, e * n_tok * c, 2 * self.conv * n_tok * c)
        C = min(self.chunk, s)
        nb = b * -(-s // C) * (self.value_heads // t)
        w.mem("gdn.solve", e * nb * C * C, e * nb * C * C, self.solve_flops(b, s, t))
        for name, mm, nn, kk, bb in self.chunk_gemms(b, s, t):
            w.gemm(name, mm, nn, kk, batch=bb)
        d = self.value_width // t
        w.mem("gdn.gated_norm", 2 * e * n_tok * d, e * n_tok * d, 8 * n_tok * d)
        w.gemm("gdn.out_proj", n_tok, h, d)

    def recompute_core(self, w, m, b, t, attention, ctx) -> None:
        """Selective ``core_attn`` recompute applies to softmax attention layers only."""

    def backward(self, w, m, b: int, t: int, attention: str, ctx: tuple) -> None:
        e, s, h = w.e, m.seq_length, m.hidden_size
        n_tok = b * s
        d = self.value_width // t
        w.gemm("gdn.out_proj.dgrad", n_tok, d, h)
        w.mem("gdn.gated_norm.grad", 3 * e * n_tok * d, 2 * e * n_tok * d, 16 * n_tok * d)
        for name, mm, nn, kk, bb in reversed(self.chunk_gemms(b, s, t)):
            w.gemm(f"{name}.dgrad_a", mm, kk, nn, batch=bb)
            w.gemm(f"{name}.dgrad_b", kk, nn, mm, batch=bb)
        C = min(self.chunk, s)
        nb = b * -(-s // C) * (self.value_heads // t)
        w.mem("gdn.solve.grad", 2 * e * nb * C * C, e * nb * C * C, 2 * self.solve_flops(b, s, t))
        c = self.conv_dim // t
        w.mem("gdn.conv1d.grad", 2 * e * n_tok * c, 2 * e * n_tok * c, 4 * self.conv * n_tok * c)
        w.gemm("gdn.in_proj.dgrad", n_tok, h, self.in_width // t)

    def wgrads(self, w, m, n_tok: int, t: int, sp: bool) -> None:
        h = m.hidden_size
        w.gemm("gdn.out_proj.wgrad", self.value_width // t, h, n_tok)
        if sp:
            w.comm("gdn.in_proj.all_gather.input", "all_gather", w.e * n_tok * h)
        w.gemm("gdn.in_proj.wgrad", h, self.in_width // t, n_tok)

    def stored(self, m, b: int, t: int, sp: bool, g: float, flash: bool, mods: tuple) -> dict:
        """in_proj input and output, conv output, the per-chunk fp32 states (dk·dv per value
        head), the recurrence output and the out_proj input."""
        s = m.seq_length
        n_tok = b * s
        rep = t if sp else 1
        chunks = b * -(-s // min(self.chunk, s))
        return {"gdn.in_proj.input": g * n_tok * m.hidden_size / rep,
                "gdn.in_proj.output": 2 * n_tok * self.in_width / t,
                "gdn.conv1d.output": 2 * n_tok * self.conv_dim / t,
                "gdn.states": 4 * chunks * self.value_heads * self.key_dim * self.value_dim / t,
                "gdn.output": 2 * n_tok * self.value_width / t,
                "gdn.out_proj.input": g * n_tok * self.value_width / t}


# ------------------------------------------------------------------------------- MLPs
@dataclass(frozen=True)
class DenseMLP(Kind):
    """A dense MLP of the model's ``ffn_hidden_size``, gated (SwiGLU: gate, up, down) or not
    (GeLU, or Nemotron-H's squared ReLU: up, down) as the model's ``mlp`` says."""

    name: ClassVar[str] = "mlp"
    role: ClassVar[str] = "mlp"
    block: ClassVar[str] = "mlp"

    def params(self, m, active: bool = False) -> int:
        return m.mlp_params

    def check_plan(self, m, plan) -> None:
        _divides(plan.tp, m.ffn_hidden_size, "ffn_hidden_size", m)


@dataclass(frozen=True)
class MoE(Kind):
    """A mixture of experts (``sim.inputs.moe`` counts it; ``sim.program.workload_moe`` and
    ``sim.program.dispatch`` run it), with shared experts where the model has them."""

    name: ClassVar[str] = "moe"
    role: ClassVar[str] = "mlp"
    block: ClassVar[str] = "mlp"
    owns_tp_comms: ClassVar[bool] = True

    def params(self, m, active: bool = False) -> int:
        from sim.inputs.moe import moe_mlp_params

        return moe_mlp_params(m, active)


KINDS = {k.name: k for k in (FullAttention, SlidingWindowAttention, ChunkedAttention, MLA, Mamba2, GatedDeltaNet,
                             DenseMLP, MoE)}
"""The registry: kind name -> class."""


def kind(name: str, where: str = "layer kind", **params) -> Kind:
    """The kind ``name`` with its parameters (an unknown name is refused in one line)."""
    require(name in KINDS, where, name, f"allowed: {', '.join(KINDS)}")
    return KINDS[name](**params)


@dataclass(frozen=True)
class Layer:
    """One layer: its mixer and its MLP (either may be None: a block-per-layer hybrid)."""

    mixer: Kind | None
    mlp: Kind | None

    def __post_init__(self):
        if self.mixer is None and self.mlp is None:
            raise InputError("layer: mixer, mlp: got 'None, None'; a layer needs at least one block")

    @property
    def blocks(self) -> tuple:
        return tuple(k for k in (self.mixer, self.mlp) if k is not None)

    @property
    def is_moe(self) -> bool:
        return isinstance(self.mlp, MoE)

    def describe(self) -> str:
        return "+".join(k.describe() for k in self.blocks)


def standard_layer(m, moe: bool) -> Layer:
    """A layer of a model without a layer pattern: MLA or full attention, MoE or dense."""
    return Layer(MLA() if m.mla else FullAttention(), MoE() if moe else DenseMLP())


def layer_norms(layer: Layer) -> int:
    """Norms of a layer: one before each block."""
    return len(layer.blocks)
