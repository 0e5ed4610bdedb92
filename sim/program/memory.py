"""What each GPU holds: model states, activations and temporary buffers.

Model states (ZeRO, Rajbhandari et al. SC'20). Mixed-precision Adam keeps, per
parameter, a 16-bit weight (2Ψ bytes), a 16-bit gradient (2Ψ) and K = 12 bytes of
optimizer state (fp32 master weight, momentum, variance): 16Ψ in all. Over Nd
data-parallel ranks ZeRO shards them as

    stage 0:        2Ψ + 2Ψ + 12Ψ
    stage 1 (P_os):     4Ψ + 12Ψ/Nd
    stage 2 (P_os+g):   2Ψ + 14Ψ/Nd
    stage 3 (P_os+g+p): 16Ψ/Nd

where Ψ is the parameter count on the rank (its tensor- and pipeline-parallel shard).

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation", Table 2):
bytes stored per layer per micro-batch, for sequence s, micro-batch b, hidden h,
heads a, tensor-parallel size t, 16-bit activations and 1-byte dropout masks:

    no parallelism              sbh(34 + 5as/h)
    tensor parallel             sbh(10 + 24/t + 5as/(ht))
    tensor + sequence parallel  (sbh/t)(34 + 5as/h)
    tp + selective recompute    sbh(10 + 24/t)
    tp + sp + selective         sbh·34/t
    full recompute              2sbh  (the layer input; /t under sequence parallelism)

``activation_terms`` itemizes the same tensors (LayerNorm inputs, QKV input, Q, K, V,
softmax and its dropout, projection input, GeLU input and output, dropout masks) so
that SwiGLU, grouped-query attention, models without dropout and flash attention
(which stores no s×s tensor, only a 4-byte log-sum-exp per query row) follow from
the same accounting; with ``flash_attention=False`` and a GPT layer it reproduces the
table above exactly.

In flight. A pipeline stage's activation peak is the activations of the (chunk,
micro-batch) pairs it has run forward but whose last backward step (B, or W when the
backward is split into I and W) it has not yet run: the weight-gradient pass W needs the
layer inputs, so a zero-bubble schedule frees a micro-batch's activations at its W, not at
its I. Per schedule, for stage i of p, m micro-batches and v chunks per stage
(``inflight_per_chunk``):

    gpipe        m                     all forwards run before any backward (GPipe)
    1f1b         min(p − i, m)         PipeDream-Flush (Narayanan et al. SC'21)
    zb-h1        min(p, m)             p − i − 1 warm-up forwards, W delayed by i micro-
                                       batches: (p − i) + i = p on every stage, the
                                       paper's p·M_B (Qi et al. ICLR 2024)
    zb-h2        min(2p − 1, m)        every stage fills up to the (2p−1)·M_B limit of
                                       Qi et al. (W deferred to the tail)
    interleaved  min(2(p − i − 1) + (v − 1)·p + 1, m·v) chunk-micro-batches; m·v when
                                       m = p (Megatron then runs every forward first)

These are the counts of the generated schedules (``sim.program.schedules``) themselves: walking
each rank's steps and counting the pairs between their F and their last backward step
gives exactly these numbers, chunk by chunk, at the first moment of the peak (the tests
check p = 2..8, m below, at and above p). Under ZB-H1 and ZB-H2 the last stage holds
as much as the first.
The interleaved count is Megatron-LM's warm-up length plus the first steady-state
forward; for the first stage it is p·v·(1 + (p−1)/(p·v)) chunks, the (1 + (p−1)/(p·v))
factor of Korthikanti et al. Which chunks they belong to follows Megatron's order
(groups of p micro-batches per chunk: chunk ⌊k/p⌋ mod v for the k-th forward, the
chunks in reverse for the backwards). That matters when chunks differ in bytes (uneven
splits; the embedding's and the output layer's tensors on the first and last chunk):
the chunks held change through the steady state, and the byte peak is the highest of
those moments, not necessarily the first moment of the highest count.
A 'custom' schedule is counted as 1F1B (interleaved when v > 1); the simulator's memory
pass tracks the real program.
The embedding's stored tensors count with the micro-batches in flight on virtual stage
0, the output layer's with those on the last virtual stage.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import require
from sim.inputs.model import ModelSpec, layer_params_per_rank  # noqa: F401  (layer_params_per_rank re-exported)
from sim.inputs.plan import RECOMPUTE, ParallelPlan

# DeepSpeed defaults (zero_optimization.reduce_bucket_size, stage3_max_live_parameters).
DEEPSPEED_REDUCE_BUCKET_ELEMS = 500_000_000
DEEPSPEED_MAX_LIVE_PARAMETERS = 1_000_000_000


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
    require(zero_stage in (0, 1, 2, 3), "zero_stage", zero_stage, "allowed: 0, 1, 2, 3")
    p, g, o = param_bytes * num_params, grad_bytes * num_params, optimizer_bytes * num_params
    return ModelStates(p / dp if zero_stage >= 3 else p,
                       g / dp if zero_stage >= 2 else g,
                       o / dp if zero_stage >= 1 else o)


# ------------------------------------------------------------------ parameters
def stage_params_per_rank(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Parameters one rank of pipeline stage ``stage`` holds (the layers of all its chunks,
    as ``plan.stage_layers`` splits them, plus the embedding on the first stage and the
    final norm and output layer on the last)."""
    plan.check_model(model)
    require(0 <= stage < plan.pp, "stage", stage, f"expected 0..{plan.pp - 1}")
    t, h = plan.tp, model.hidden_size
    layers = plan.stage_layers(model)
    n = sum(layers[c * plan.pp + stage] for c in range(plan.vpp)) * layer_params_per_rank(model, t)
    word = model.vocab_size * h / t                       # vocab-parallel table
    if stage == 0:
        pos = model.max_position_embeddings if model.position_embedding == "learned" else 0
        n += word + pos * h
    if stage == plan.pp - 1:
        n += model.norm_params
        if not model.tied_embeddings or plan.pp > 1:      # untied, or a tied copy on the last stage
            n += word
    return n


# ----------------------------------------------------------------- activations
def activation_terms(model: ModelSpec, micro_batch: int, tp: int = 1, sequence_parallel: bool = False,
                     recompute: str = "none", flash_attention: bool = True) -> dict:
    """Bytes each stored tensor of one layer takes for one micro-batch on one rank."""
    require(recompute in RECOMPUTE, "recompute", recompute, f"allowed: {', '.join(RECOMPUTE)}")
    m, b, t = model, micro_batch, tp
    s, h, a = m.seq_length, m.hidden_size, m.num_attention_heads
    sp = sequence_parallel and t > 1
    sbh = s * b * h
    rep = t if sp else 1                     # divisor of the non-tensor-parallel regions
    if recompute == "full":
        return {"layer.input": 2 * sbh / rep}
    r = m.num_key_value_heads / a
    f = m.ffn_hidden_size / h                # MLP width in units of h
    mask = 1 if m.dropout else 0
    terms = {
        "attn.norm.input": 2 * sbh / rep,
        "attn.qkv.input": 2 * sbh / rep,
        "attn.q": 2 * sbh / t,
        "attn.k": 2 * sbh * r / t,
        "attn.v": 2 * sbh * r / t,
    }
    if recompute == "none":
        if flash_attention:
            terms["attn.softmax.lse"] = 4 * a * s * b / t
        else:
            terms["attn.softmax"] = 2 * a * s * s * b / t
            if m.dropout:
                terms["attn.softmax.dropout_mask"] = a * s * s * b / t
                terms["attn.softmax.dropout"] = 2 * a * s * s * b / t
    terms["attn.proj.input"] = 2 * sbh / t
    terms["attn.dropout_mask"] = mask * sbh / rep
    terms["mlp.norm.input"] = 2 * sbh / rep
    terms["mlp.up.input"] = 2 * sbh / rep
    if m.mlp == "gelu":
        terms["mlp.gelu.input"] = 2 * sbh * f / t
    else:
        terms["mlp.gate"] = 2 * sbh * f / t
        terms["mlp.up"] = 2 * sbh * f / t
    terms["mlp.down.input"] = 2 * sbh * f / t
    terms["mlp.dropout_mask"] = mask * sbh / rep
    return {k: v for k, v in terms.items() if v}


def activation_bytes_per_layer(model: ModelSpec, micro_batch: int, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               flash_attention: bool = True) -> float:
    """Activation bytes one layer stores for one micro-batch on one rank (Korthikanti Table 2
    when ``flash_attention`` is False and the layer is GPT-style)."""
    return sum(activation_terms(model, micro_batch, tp, sequence_parallel, recompute,
                                flash_attention).values())


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


def inflight_per_chunk(plan: ParallelPlan, stage: int, weights: tuple | None = None) -> tuple:
    """Micro-batches whose activations each chunk of pipeline stage ``stage`` holds at the
    stage's peak, under ``plan.schedule`` (see the module doc); one entry per chunk.

    ``weights`` (one per chunk, e.g. its bytes per micro-batch): under interleaving the
    chunks held change during the steady state, so the peak in bytes is the first moment
    the weighted sum is highest; by default every chunk weighs the same (the peak count)."""
    p, v, m = plan.pp, plan.vpp, plan.num_microbatches
    require(isinstance(stage, int) and 0 <= stage < p, "stage", stage, f"expected 0..{p - 1}")
    if plan.schedule == "gpipe":
        return (m,)
    if v == 1:
        held = {"zb-h1": p, "zb-h2": 2 * p - 1}.get(plan.schedule, p - stage)
        return (min(held, m),)
    return _interleaved_peak(p, v, m, stage, weights or (1,) * v)


def _interleaved_peak(p: int, v: int, m: int, stage: int, weights: tuple) -> tuple:
    """Megatron's interleaved order on rank ``stage`` (``sim.program.schedules.interleaved``): the
    k-th forward is chunk ⌊(k mod pv)/p⌋, the k-th backward chunk v − 1 − ⌊(k mod pv)/p⌋,
    after ``warm`` warm-up forwards one forward then one backward. The held pairs peak
    at the end of the warm-up or just after a steady-state forward (backwards only free);
    those moments repeat with period pv, so pv of them are enough."""
    total, pv = m * v, p * v
    warm = total if m == p else min(2 * (p - stage - 1) + (v - 1) * p, total)

    def forwards(n: int, c: int) -> int:               # chunk c's among the first n forwards
        return n // pv * p + min(max(n % pv - c * p, 0), p)

    best, at_best = -1.0, (0,) * v
    for nf, nb in [(warm, 0)] + [(k + warm + 1, k) for k in range(min(total - warm, pv))]:
        live = tuple(forwards(nf, c) - forwards(nb, v - 1 - c) for c in range(v))
        level = sum(w * n for w, n in zip(weights, live))
        if level > best:
            best, at_best = level, live
    return at_best


def inflight_chunks(plan: ParallelPlan, stage: int) -> int:
    """Chunk-micro-batches whose activations stage ``stage`` holds at its peak: p − i under
    1F1B, Megatron's warm-up count plus one, (p − i − 1)·2 + (v − 1)·p + 1, interleaved (at
    most m·v), m under GPipe, p under ZB-H1 and 2p − 1 under ZB-H2 on every stage (each
    at most m; see the module doc)."""
    return sum(inflight_per_chunk(plan, stage))


def stage_activation_bytes(model: ModelSpec, plan: ParallelPlan, stage: int,
                           flash_attention: bool = True) -> float:
    """Peak activation bytes on one rank of pipeline stage ``stage``: for each of its
    chunks, the micro-batches in flight times the chunk's layers, plus the embedding's
    (virtual stage 0) and the output layer's (last virtual stage) tensors, at the moment
    their sum is highest."""
    plan.check_model(model)
    b, t, sp = plan.micro_batch_size, plan.tp, plan.sequence_parallel
    p, v = plan.pp, plan.vpp
    per_layer = activation_bytes_per_layer(model, b, t, sp, plan.recompute, flash_attention)
    layers = plan.stage_layers(model)
    emb = embedding_activation_bytes(model, b, t, sp) if stage == 0 else 0.0
    head = head_activation_bytes(model, b, t, sp) if stage == p - 1 else 0.0
    weights = [layers[c * p + stage] * per_layer for c in range(v)]
    weights[0] += emb
    weights[v - 1] += head
    held = inflight_per_chunk(plan, stage, tuple(weights))
    total = sum(held[c] * layers[c * p + stage] for c in range(v)) * per_layer
    return total + held[0] * emb + held[v - 1] * head


# ------------------------------------------------------------------ temporaries
def zero3_gathered_param_bytes(layer_params: float, prefetch_layers: int = 1, param_bytes: int = 2,
                               max_live_parameters: float = DEEPSPEED_MAX_LIVE_PARAMETERS) -> float:
    """ZeRO-3: full (dp-gathered) weights of the layer in use and of ``prefetch_layers``
    ahead, at most ``max_live_parameters`` (DeepSpeed ``stage3_max_live_parameters``)."""
    require(prefetch_layers >= 0, "prefetch_layers", prefetch_layers, "expected an integer >= 0")
    return param_bytes * min(layer_params * (1 + prefetch_layers), max(layer_params, max_live_parameters))


def grad_bucket_bytes(bucket_elems: float = DEEPSPEED_REDUCE_BUCKET_ELEMS, grad_bytes: int = 2) -> float:
    """A gradient communication bucket (DeepSpeed ``reduce_bucket_size`` elements)."""
    require(bucket_elems >= 0, "bucket_elems", bucket_elems, "expected a count >= 0")
    return grad_bytes * bucket_elems
