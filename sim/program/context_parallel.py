"""Context parallelism: each sequence split over ``cp`` GPUs (Megatron-Core with Transformer
Engine's ``attn_mask_type=causal`` context parallelism; Liu et al.'s ring attention).

Every token-wise piece of a layer (norms, GEMMs, MLP, residuals) runs on the rank's s/cp
tokens, so ``sim.program.workload`` builds the layer at sequence s/cp and asks this module
for the attention core, whose queries are local but whose keys and values are the whole
sequence's:

- ``p2p`` (ring attention, Megatron's default ``--cp-comm-type p2p``): cp steps; in step j a
  rank attends its queries to the key/value chunk it holds while it passes that chunk on
  to the next rank of the context-parallel ring and receives the previous rank's (one
  ``shift`` of the chunk's K and V, 2·(s/cp)·kv_width bytes per sequence, on a stream of
  its own, overlapped with the step's compute; step j+1 waits for it). Backward runs the
  ring again, passing key/value chunks and their gradients (twice the bytes), and sends
  each chunk's finished gradient home at the end.
- ``all-gather`` (Llama 3, Dubey et al. 2024 §3.3.2): keys and values are all-gathered over
  the context-parallel group before attention, which then runs as one kernel of s/cp
  queries against s keys; backward gathers them again and reduce-scatters their gradients.

Megatron cuts each sequence into 2·cp chunks and gives rank r chunks r and 2cp−1−r, so
that with a causal mask every rank and every ring step has the same work. trainsim counts
attention FLOPs without the causal halving (as everywhere: the papers' convention), so
each of the cp steps is 1/cp of the rank's attention: s/cp queries against s/cp keys.

Around the ring steps Transformer Engine runs memory-bound kernels of its own
(``AttnFuncWithCPAndKVP2P``, transformer_engine/pytorch/attention.py of TE 2.0, the NeMo 25.02
container's generation; the same code moved to ``dot_product_attention/context_parallel.py``
later). Forward: after the last step, on the compute stream, each step's partial output is
merged into the output (``out`` zero-filled, then ``flash_attn_fwd_out_correction`` per step,
``torch.compile``'d: read the output and the step's output, write the output, over the whole
local sequence on steps j <= rank and its second half after); the softmax statistics'
corrections between the steps run on TE's side streams over b·heads·s/cp floats and are left
out. Backward: after each step's attention gradient, ``dq`` and ``dkv`` (``torch.cat`` of the
step's dk and dv, then added) are accumulated, eager PyTorch, over the queries and the key/value
chunk the step covered (``accumulated_shares``). The next ring step needs every rank of the ring,
so each step runs at the pace of the rank with most to do: priced at that rank (forward: rank
cp - 1, every merge whole; backward: ``busiest_rank``). Not priced: the ``.contiguous()`` copies
of the half of q or of the key/value chunk that a later step feeds its kernel (2 bytes read and
written per element of that half).
"""

from __future__ import annotations

from sim.program.workload_moe import attention_widths


def accumulated_shares(cp: int, step: int, rank: int) -> tuple[float, float]:
    """(share of the local queries, share of the local keys and values) whose gradients ring step
    ``step`` of context-parallel rank ``rank`` computes under Megatron's causal load balancing
    (module doc): step 0 the rank's own two chunks, whole; a later step either all its queries
    against the first half of the received chunk (``step <= rank``) or the second half of its
    queries against the whole chunk."""
    if step == 0:
        return 1.0, 1.0
    return (1.0, 0.5) if step <= rank else (0.5, 1.0)


def busiest_rank(cp: int, q: float, kv: float) -> int:
    """The context-parallel rank whose gradient accumulations move the most bytes (queries ``q``
    wide, keys and values ``kv`` wide): rank cp - 1 when q >= kv/2 (every later step whole
    queries), else rank 0 (every later step the whole received chunk)."""
    return cp - 1 if q >= kv / 2 else 0


def _widths(m, t: int) -> tuple[int, int, int]:
    """(query width, key+value width, output width) on one tensor-parallel rank."""
    width, out, d_qk, _ = attention_widths(m)
    q = m.num_attention_heads * d_qk
    return q // t, (width - q) // t, out // t


def cp_attention_forward(w, m, b: int, t: int, cp: int, cp_comm: str) -> None:
    """The attention core's forward on ``m`` (already at the local sequence s/cp)."""
    e, s = w.e, m.seq_length
    heads, d = m.num_attention_heads // t, m.head_dim
    _, _, d_qk, d_v = attention_widths(m)
    q, kv, out = _widths(m, t)
    n_tok = b * s
    flops = 2 * b * s * (s * cp) * heads * (d_qk + d_v)
    lse = 4 * b * heads * s
    if cp_comm == "all-gather":
        w.comm("attn.cp.all_gather", "all_gather", e * n_tok * cp * kv, group="cp")
        w.attention("attn.core", flops, e * n_tok * (q + cp * kv), e * n_tok * out + lse, e * n_tok * out,
                    (s, s * cp, d), b * heads)
        return
    for j in range(cp):
        if j + 1 < cp:
            w.comm(f"attn.cp.kv{j + 1}", "shift", e * n_tok * kv, group="cp", side=True)
        w.attention(f"attn.core.cp{j}", flops / cp, e * n_tok * (q + kv), e * n_tok * out + lse, e * n_tok * out,
                    (s, s, d), b * heads, after=f"attn.cp.kv{j}" if j else None)
    # the steps' partial outputs merged into the zeroed output (module doc: the busiest rank's cp full steps)
    w.mem("attn.cp.out_correction", cp * (2 * e * n_tok * out + 2 * lse), (cp + 1) * e * n_tok * out,
          kernels=cp + 1)


def cp_attention_backward(w, m, b: int, t: int, cp: int, cp_comm: str) -> None:
    """The attention core's backward (input gradients) under context parallelism."""
    e, s = w.e, m.seq_length
    heads, d = m.num_attention_heads // t, m.head_dim
    _, _, d_qk, d_v = attention_widths(m)
    q, kv, out = _widths(m, t)
    n_tok = b * s
    flops = 4 * b * s * (s * cp) * heads * (d_qk + d_v)
    lse = 4 * b * heads * s
    if cp_comm == "all-gather":
        w.comm("attn.cp.all_gather.grad", "all_gather", e * n_tok * cp * kv, group="cp")
        w.attention("attn.core.grad", flops, e * n_tok * (q + cp * kv + 2 * out) + lse, e * n_tok * (q + cp * kv),
                    e * n_tok * (q + kv), (s, s * cp, d), b * heads)
        w.comm("attn.cp.reduce_scatter.grad", "reduce_scatter", e * n_tok * cp * kv, group="cp")
        return
    for j in range(cp):
        if j + 1 < cp:  # the next key/value chunk and the gradients accumulated for it so far
            w.comm(f"attn.cp.kv{j + 1}.grad", "shift", 2 * e * n_tok * kv, group="cp", side=True)
        w.attention(f"attn.core.grad.cp{j}", flops / cp, e * n_tok * (q + 2 * kv + 2 * out) + lse,
                    e * n_tok * (q + 2 * kv), e * n_tok * (q + 2 * kv), (s, s, d), b * heads,
                    after=f"attn.cp.kv{j}.grad" if j else None)
        # the step's dq and dk, dv added into the accumulated gradients (module doc: the busiest rank's share)
        fq, fkv = accumulated_shares(cp, j, busiest_rank(cp, q, kv))
        first = j == 0  # (a copy into the zeroed buffers: read 1, write 1; later steps add: read 2, write 1)
        w.mem(f"attn.cp.grad_accumulation{j}", e * n_tok * ((1 if first else 2) * fq * q + (2 if first else 3) * fkv * kv),
              e * n_tok * (fq * q + 2 * fkv * kv), framework=True, kernels=3)
    w.comm("attn.cp.dkv.home", "shift", e * n_tok * kv, group="cp")  # each chunk's gradient back to its rank
