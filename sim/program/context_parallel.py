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
"""

from __future__ import annotations

from sim.program.workload_moe import attention_widths


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
    w.comm("attn.cp.dkv.home", "shift", e * n_tok * kv, group="cp")  # each chunk's gradient back to its rank
