"""Activations in flight: how many micro-batches' tensors a pipeline stage holds at once.

A pipeline stage's activation peak is the activations of the (chunk, micro-batch) pairs
it has run forward but whose last backward step (B, or W when the backward is split
into I and W) it has not yet run: the weight-gradient pass W needs the layer inputs, so
a zero-bubble schedule frees a micro-batch's activations at its W, not at its I. Per
schedule, for stage i of p, m micro-batches and v chunks per stage
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
    looped-bfs   m on each of v chunks all of a chunk's forwards, chunk after chunk,
                                       before any backward (breadth-first, PyTorch's
                                       ScheduleLoopedBFS)

These are the counts of the generated schedules (``sim.program.schedules``) themselves:
walking each rank's steps and counting the pairs between their F and their last
backward step gives exactly these numbers, chunk by chunk, at the first moment of the
peak (the tests check p = 2..8, m below, at and above p). Under ZB-H1 and ZB-H2 the
last stage holds as much as the first.

The interleaved count is Megatron-LM's warm-up length plus the first steady-state
forward; for the first stage it is p·v·(1 + (p−1)/(p·v)) chunks, the (1 + (p−1)/(p·v))
factor of Korthikanti et al. Which chunks they belong to follows Megatron's order
(groups of p micro-batches per chunk: chunk ⌊k/p⌋ mod v for the k-th forward, the
chunks in reverse for the backwards). That matters when chunks differ in bytes (uneven
splits; the embedding's and the output layer's tensors on the first and last chunk):
the chunks held change through the steady state, and the byte peak is the highest of
those moments, not necessarily the first moment of the highest count.

With ``overlap_moe_expert_parallel_comm`` and no pipelining (p = 1), the forward of
micro-batch j + 1 runs beside the backward of j (``sim.program.ep_overlap``): min(2, m).
With interleaving Megatron runs one more warm-up forward per rank then: one more
chunk-micro-batch (at most m·v; the pair's forward stores while its backward frees).

A 'custom' schedule is counted as 1F1B (interleaved when v > 1); the simulator's memory
pass tracks the real program. The embedding's stored tensors count with the
micro-batches in flight on virtual stage 0, the output layer's with those on the last
virtual stage (``stage_activation_bytes``).
"""

from __future__ import annotations

from sim.errors import require
from sim.inputs.model import ModelSpec
from sim.inputs.plan import ParallelPlan
from sim.program.memory.activations import (
    chunk_activation_bytes,
    embedding_activation_bytes,
    head_activation_bytes,
    stage_layer_bytes,
)


def inflight_per_chunk(plan: ParallelPlan, stage: int, weights: tuple | None = None) -> tuple:
    """Micro-batches whose activations each chunk of pipeline stage ``stage`` holds at the
    stage's peak, under ``plan.schedule`` (see the module doc); one entry per chunk.

    ``weights`` (one per chunk, e.g. its bytes per micro-batch): under interleaving the
    chunks held change during the steady state, so the peak in bytes is the first moment
    the weighted sum is highest; by default every chunk weighs the same (the peak count)."""
    p, v, m = plan.pp, plan.vpp, plan.num_microbatches
    require(isinstance(stage, int) and 0 <= stage < p, "stage", stage, f"expected 0..{p - 1}")
    if plan.pipeline.in_flight_one_chunk == "m":  # (GPipe, looped BFS: every forward before any backward)
        return (m,) * v
    if v == 1:
        held = plan.pipeline.held_one_chunk(p, stage, m)
        if plan.overlap_moe_expert_parallel_comm:  # (p = 1) one forward ahead of each backward
            held += 1
        return (min(held, m),)
    return _interleaved_peak(p, v, m, stage, weights or (1,) * v, int(plan.overlap_moe_expert_parallel_comm))


def _interleaved_peak(p: int, v: int, m: int, stage: int, weights: tuple, extra: int = 0) -> tuple:
    """Megatron's interleaved order on rank ``stage`` (``sim.program.schedules.interleaved``):
    the k-th forward is chunk ⌊(k mod pv)/p⌋, the k-th backward chunk v − 1 − ⌊(k mod pv)/p⌋,
    after ``warm`` warm-up forwards one forward then one backward. The held pairs peak
    at the end of the warm-up or just after a steady-state forward (backwards only free);
    those moments repeat with period pv, so pv of them are enough."""
    total, pv = m * v, p * v
    warm = total if m == p else min(2 * (p - stage - 1) + (v - 1) * p + extra, total)

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
                           flash_attention: bool | None = None) -> float:
    """Peak activation bytes on one rank of pipeline stage ``stage``: for each of its
    chunks, the micro-batches in flight times the chunk's layers, plus the embedding's
    (virtual stage 0) and the output layer's (last virtual stage) tensors, at the moment
    their sum is highest."""
    plan.check_model(model)
    if flash_attention is None:  # (the plan's attention)
        flash_attention = plan.attention_mode.fused
    b, t, sp = plan.micro_batch_size, plan.tp, plan.sequence_parallel
    p, v = plan.pp, plan.vpp
    emb = embedding_activation_bytes(model, b, t, sp) if stage == 0 else 0.0
    head = head_activation_bytes(model, b, t, sp) if stage == p - 1 else 0.0
    weights = tuple(chunk_activation_bytes(model, plan, c * p + stage, flash_attention) for c in range(v))
    held = inflight_per_chunk(plan, stage, weights)
    total = sum(held[c] * stage_layer_bytes(model, plan, c * p + stage, flash_attention) for c in range(v))
    return (total + held[0] * emb + held[v - 1] * head) / plan.cp  # a cp rank stores its s/cp tokens
