"""The parts of a layer's work that mixtures of experts and MLA change (``sim.program.workload``
builds the rest and calls these).

MoE block (Megatron-Core's ``MoELayer`` with the all-to-all token dispatcher), on a rank
that routes T tokens (b·s, or b·s/tp under sequence parallelism; Megatron-LM requires
sequence parallelism for MoE with tp > 1) to k experts each, R = T·k copies:

    forward   router GEMM (T × E × h) and its softmax/top-k; permute (copy the R token
              copies into expert order); dispatch all-to-all over the expert-parallel
              group; [all-gather over the expert-tensor-parallel group]; the rank's
              E/ep experts as grouped GEMMs (up, activation, down) on the L tokens it
              received (× etp after the gather); [reduce-scatter over etp]; combine
              all-to-all; unpermute (the k copies of each token weighted and summed);
              shared experts as a tensor-parallel MLP on every token
    backward  the same in reverse, input gradients only (B)
    weights   the experts' grouped weight GEMMs, the shared experts' and the router's (W)

L is the tokens the busiest rank of the group receives (``sim.program.routing``): R when
routing is balanced. Every rank is given the busiest one's expert work, since the combine
all-to-all cannot finish before it, and the all-to-alls move L·h per rank (the busiest
rank's receive, what its links must carry): nccl-tests' all-to-all size, the send buffer,
is L·h·bytes, so a balanced all-to-all of ep ranks moves T·k·h·bytes·(ep−1)/ep over the
links of each. Grouped GEMMs are priced as E/ep GEMMs of L/(E/ep) rows each (one batched
kernel; the per-expert spread of the counts is not).

MLA (DeepSeek-V2/V3, ``sim.inputs.moe``): the query and key/value projections are the
real down- and up-projections with their RMSNorms; the down-projections are replicated
on every tensor-parallel rank and run on all b·s tokens (the gathered sequence), the
up-projections split by head. The attention core multiplies queries and keys of
qk + rope = 192 wide and values of 128 (DeepSeek-V3).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.inputs.moe import mla_projections

_ACT_FLOPS = {"gelu": 10, "swiglu": 6}


@dataclass(frozen=True)
class MoeShape:
    """How one MoE layer runs on a rank: expert-parallel size, expert tensor-parallel size,
    and the tokens the busiest rank of the expert-parallel group receives."""

    ep: int
    etp: int
    load: int
    dispatcher: str = "alltoall"
    """``sim.program.dispatch``: alltoall, allgather or flex."""
    rail: float = 0.0
    """flex: tokens per rank of the inter-node exchange (the engine's all-to-all buffer)."""
    node: float = 0.0
    """flex: tokens per rank of the intra-node exchange."""


def attention_widths(m) -> tuple[int, int, int, int]:
    """(width of Q, K and V together, width of the attention output, query/key head
    width, value head width), over all heads."""
    if m.mla:
        d_qk, d_v = m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
        heads = m.num_attention_heads
        return heads * (2 * d_qk + d_v), heads * d_v, d_qk, d_v
    return m.q_dim + 2 * m.kv_dim, m.q_dim, m.head_dim, m.head_dim


def qkv_forward(w, m, n_tok: int, t: int) -> None:
    """The query/key/value projections: one GEMM, or MLA's projections and norms."""
    if not m.mla:
        w.gemm("attn.qkv", n_tok, attention_widths(m)[0] // t, m.hidden_size, bias=m.bias)
        return
    for name, i, o, split in mla_projections(m):
        w.gemm(name, n_tok, o // t if split else o, i)
        if name.endswith("down"):
            rank = o if name == "attn.q_down" else m.kv_lora_rank
            w.mem(f"{name}.norm", w.e * n_tok * rank, w.e * n_tok * rank, 5 * n_tok * rank)


def qkv_dgrad(w, m, n_tok: int, t: int) -> None:
    """Input gradients of the projections, in reverse."""
    if not m.mla:
        w.gemm("attn.qkv.dgrad", n_tok, m.hidden_size, attention_widths(m)[0] // t)
        return
    for name, i, o, split in reversed(mla_projections(m)):
        if name.endswith("down"):
            rank = o if name == "attn.q_down" else m.kv_lora_rank
            w.mem(f"{name}.norm.grad", 2 * w.e * n_tok * rank, w.e * n_tok * rank, 10 * n_tok * rank)
        w.gemm(f"{name}.dgrad", n_tok, i, o // t if split else o)


def qkv_wgrads(w, m, n_tok: int, t: int, regather: bool) -> None:
    """Weight gradients of the projections (their sequence-parallel input gathered again)."""
    if regather:
        w.comm("attn.qkv.all_gather.input", "all_gather", w.e * n_tok * m.hidden_size)
    if not m.mla:
        w.gemm("attn.qkv.wgrad", m.hidden_size, attention_widths(m)[0] // t, n_tok)
        return
    for name, i, o, split in mla_projections(m):
        w.gemm(f"{name}.wgrad", i, o // t if split else o, n_tok)


def _tokens(m, b: int, t: int, sp: bool) -> int:
    n_tok = b * m.seq_length
    return n_tok // t if sp and t > 1 else n_tok


def _expert_rows(m, shape: MoeShape) -> tuple[int, int, int, int]:
    """(tokens per local expert, local experts, expert width on this rank, up width)."""
    local = m.num_experts // shape.ep
    f = m.moe_ffn_hidden_size // shape.etp
    rows = max(1, -(-shape.load * shape.etp // local))
    return rows, local, f, (2 if m.mlp == "swiglu" else 1) * f


def moe_forward(w, m, b: int, t: int, sp: bool, shape: MoeShape) -> None:
    """An MoE block's forward between its norm and its residual add (module doc)."""
    e, h, E, k = w.e, m.hidden_size, m.num_experts, m.moe_router_topk
    T = _tokens(m, b, t, sp)
    R, L = T * k, shape.load
    w.gemm("moe.router", T, E, h)
    w.mem("moe.router.topk", 4 * T * E, 4 * T * E + 12 * R, 8 * T * E, framework=True)
    w.mem("moe.permute", e * R * h + 8 * R, e * R * h, output=e * R * h)
    after = _exchange(w, m, shape, T, "dispatch")
    rows, local, f, f_up = _expert_rows(m, shape)
    w.gemm("moe.experts.up", rows, f_up, h, batch=local, after=after)
    n = rows * local
    read = (2 if m.mlp == "swiglu" else 1) * n * f
    w.mem(f"moe.experts.{m.mlp}", e * read, e * n * f, _ACT_FLOPS[m.mlp] * n * f, framework=True)
    w.gemm("moe.experts.down", rows, h, f, batch=local)
    after = _exchange(w, m, shape, T, "combine")
    w.mem("moe.unpermute", e * R * h + 4 * R, e * _unpermuted(shape, T) * h, 2 * R * h, framework=True, after=after)
    _shared(w, m, b, t, sp, "F")


def moe_backward(w, m, b: int, t: int, sp: bool, shape: MoeShape) -> None:
    """An MoE block's input gradients, between its residual's and its norm's."""
    e, h, E, k = w.e, m.hidden_size, m.num_experts, m.moe_router_topk
    T = _tokens(m, b, t, sp)
    R, L = T * k, shape.load
    _shared(w, m, b, t, sp, "B")
    w.mem("moe.unpermute.grad", e * _unpermuted(shape, T) * h + 4 * R, e * R * h, R * h, framework=True)
    after = _exchange(w, m, shape, T, "combine.grad")
    rows, local, f, f_up = _expert_rows(m, shape)
    w.gemm("moe.experts.down.dgrad", rows, f, h, batch=local, after=after)
    n = rows * local
    read = (3 if m.mlp == "swiglu" else 2) * n * f
    wrote = (2 if m.mlp == "swiglu" else 1) * n * f
    w.mem(f"moe.experts.{m.mlp}.grad", e * read, e * wrote, 2 * _ACT_FLOPS[m.mlp] * n * f, framework=True)
    w.gemm("moe.experts.up.dgrad", rows, h, f_up, batch=local)
    after = _exchange(w, m, shape, T, "dispatch.grad")
    w.mem("moe.permute.grad", e * R * h + 8 * R, e * T * h, R * h, framework=True, after=after)
    w.mem("moe.router.topk.grad", 4 * T * E + 12 * R, 4 * T * E, 8 * T * E, framework=True)
    w.gemm("moe.router.dgrad", T, h, E)


def _unpermuted(shape: MoeShape, T: int) -> int:
    """Tokens the unpermute writes: the rank's own, or under the allgather dispatcher all
    T·etp·ep of its etp × ep group (the rows its reduce-scatter then sums)."""
    return T * shape.etp * shape.ep if shape.dispatcher == "allgather" else T


def _exchange(w, m, shape: MoeShape, T: int, what: str) -> str | None:
    """The collectives that move the tokens to the experts (``what``: dispatch, combine,
    dispatch.grad or combine.grad) as ``shape.dispatcher`` runs them (``sim.program.dispatch``);
    returns the name of a side collective the next op must wait for (flex's inter-node
    exchange, which runs beside its intra-node one), or None."""
    e, h, L = w.e, m.hidden_size, shape.load
    stem, _, grad = what.partition(".")
    suffix = ".grad" if grad else ""
    gather = "all_gather" if what in ("dispatch", "combine.grad") else "reduce_scatter"  # towards the experts
    if shape.dispatcher == "allgather":
        n = shape.etp * shape.ep
        if stem == "dispatch":  # the routing map (1 byte a flag, no gradient) and the probabilities
            w.comm(f"moe.dispatch.allgather.routing{suffix}", gather,
                   T * n * m.num_experts * (e + (0 if grad else 1)), group="tpep")
        w.comm(f"moe.{stem}.allgather{suffix}", gather, e * T * n * h, group="tpep")
        return None
    if shape.dispatcher == "flex":
        rail = f"moe.{stem}.rdma{suffix}"
        w.comm(rail, "all_to_all", e * shape.rail * h, group="ep_rail", side=True)
        w.comm(f"moe.{stem}.nvl{suffix}", "all_to_all", e * shape.node * h, group="ep_node")
        return rail
    steps = {"dispatch": (("moe.dispatch", "ep"), ("moe.all_gather", "etp")),
             "combine": (("moe.reduce_scatter", "etp"), ("moe.combine", "ep")),
             "combine.grad": (("moe.combine.grad", "ep"), ("moe.all_gather.grad", "etp")),
             "dispatch.grad": (("moe.reduce_scatter.grad", "etp"), ("moe.dispatch.grad", "ep"))}[what]
    for name, group in steps:
        if group == "ep" and shape.ep > 1:
            w.comm(name, "all_to_all", e * L * h, group="ep")
        elif group == "etp" and shape.etp > 1:
            w.comm(name, gather, e * L * shape.etp * h, group="etp")
    return None


def moe_wgrads(w, m, b: int, t: int, sp: bool, shape: MoeShape) -> None:
    """An MoE block's weight gradients: experts (grouped), shared experts, router."""
    h, E = m.hidden_size, m.num_experts
    rows, local, f, f_up = _expert_rows(m, shape)
    w.gemm("moe.experts.down.wgrad", f, h, rows, batch=local)
    w.gemm("moe.experts.up.wgrad", h, f_up, rows, batch=local)
    _shared(w, m, b, t, sp, "W")
    w.gemm("moe.router.wgrad", h, E, _tokens(m, b, t, sp))


def _shared(w, m, b: int, t: int, sp: bool, phase: str) -> None:
    """The shared experts: one tensor-parallel MLP of their total width on every token."""
    width = m.moe_shared_expert_intermediate_size
    if not width:
        return
    e, h = w.e, m.hidden_size
    n_tok = b * m.seq_length
    f = width // t
    f_up = (2 if m.mlp == "swiglu" else 1) * f
    gather = t > 1 and sp
    if phase == "F":
        if gather:
            w.comm("moe.shared.all_gather", "all_gather", e * n_tok * h)
        w.gemm("moe.shared.up", n_tok, f_up, h)
        w.mem(f"moe.shared.{m.mlp}", e * (f_up * n_tok), e * n_tok * f, _ACT_FLOPS[m.mlp] * n_tok * f, framework=True)
        w.gemm("moe.shared.down", n_tok, h, f)
        if t > 1:
            w.comm("moe.shared.reduce_scatter", "reduce_scatter" if sp else "all_reduce", e * n_tok * h)
    elif phase == "B":
        if gather:
            w.comm("moe.shared.all_gather.grad", "all_gather", e * n_tok * h)
        w.gemm("moe.shared.down.dgrad", n_tok, f, h)
        w.mem(f"moe.shared.{m.mlp}.grad", e * (f_up + f) * n_tok, e * f_up * n_tok,
              2 * _ACT_FLOPS[m.mlp] * n_tok * f, framework=True)
        w.gemm("moe.shared.up.dgrad", n_tok, h, f_up)
        if t > 1:
            w.comm("moe.shared.reduce_scatter.grad", "reduce_scatter" if sp else "all_reduce", e * n_tok * h)
    else:
        w.gemm("moe.shared.down.wgrad", f, h, n_tok)
        if gather:
            w.comm("moe.shared.all_gather.input", "all_gather", e * n_tok * h)
        w.gemm("moe.shared.up.wgrad", h, f_up, n_tok)
