"""Mixture-of-experts and multi-head latent attention shapes: what ``ModelSpec`` counts
for them (this module takes the spec as it is and imports nothing of it).

A mixture-of-experts (MoE) layer (Shazeer et al. 2017; GShard; Switch; Mixtral; DeepSeek)
replaces the MLP by ``num_experts`` routed experts, each an MLP of width
``moe_ffn_hidden_size``, of which a router (one h × E matrix) picks ``moe_router_topk``
per token, plus optional shared experts every token passes through (DeepSeek's, one MLP
of total width ``moe_shared_expert_intermediate_size``). Attention and norms are as in
a dense layer. Which layers are MoE: layer i when i >= ``moe_first_k_dense`` and
i % ``moe_layer_freq`` == 0.

Multi-head latent attention (MLA; DeepSeek-V2, Liu et al. 2024, §2.1; DeepSeek-V3) is
counted from its real projections (DeepSeek-V3's config.json names in brackets):

    query    h → q_lora_rank [q_a_proj], RMSNorm, → heads·(qk + rope) [q_b_proj]
             (without q_lora_rank: h → heads·(qk + rope) directly)
    key/val  h → kv_lora_rank + rope [kv_a_proj_with_mqa], RMSNorm on the kv_lora_rank
             part, → heads·(qk + v) [kv_b_proj]
    output   heads·v → h [o_proj]

with qk = ``qk_head_dim`` (qk_nope_head_dim), rope = ``qk_pos_emb_head_dim``
(qk_rope_head_dim) and v = ``v_head_dim``. The rotary key (rope wide) is one per token,
shared by all heads. No biases.
"""

from __future__ import annotations

from sim.errors import require


def _pos_int(where: str, field: str, value) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0, f"{where}: {field}", value,
            "expected an integer > 0")


def _check_groups(m, where: str) -> None:
    """Group-limited routing: G groups dividing the experts, M <= G of them per token,
    holding at least k experts between them (Megatron-LM's and DeepSeek-V3's rules)."""
    groups, top = m.moe_router_num_groups, m.moe_router_group_topk
    if groups is None:
        require(top is None, f"{where}: moe_router_group_topk", top, "needs moe_router_num_groups")
        return
    _pos_int(where, "moe_router_num_groups", groups)
    require(m.num_experts % groups == 0, f"{where}: moe_router_num_groups", groups,
            f"must divide num_experts {m.num_experts}")
    require(top is not None, f"{where}: moe_router_group_topk", top, "required with moe_router_num_groups")
    _pos_int(where, "moe_router_group_topk", top)
    require(top <= groups, f"{where}: moe_router_group_topk", top,
            f"must be <= moe_router_num_groups {groups}")
    require(top * (m.num_experts // groups) >= m.moe_router_topk, f"{where}: moe_router_group_topk", top,
            f"its groups must hold at least moe_router_topk {m.moe_router_topk} experts "
            f"({m.num_experts // groups} per group)")


def check_moe_fields(m, where: str) -> None:
    """The MoE and MLA fields of spec ``m`` (called by ``ModelSpec.__post_init__``)."""
    if m.kv_channels is not None:
        _pos_int(where, "kv_channels", m.kv_channels)
    if m.num_experts is not None:
        _pos_int(where, "num_experts", m.num_experts)
        _pos_int(where, "moe_router_topk", m.moe_router_topk)
        require(m.moe_router_topk <= m.num_experts, f"{where}: moe_router_topk", m.moe_router_topk,
                f"must be <= num_experts {m.num_experts}")
        _check_groups(m, where)
        _pos_int(where, "moe_layer_freq", m.moe_layer_freq)
        require(isinstance(m.moe_first_k_dense, int) and not isinstance(m.moe_first_k_dense, bool)
                and 0 <= m.moe_first_k_dense < m.num_layers, f"{where}: moe_first_k_dense", m.moe_first_k_dense,
                f"expected an integer in 0..{m.num_layers - 1}")
        if m.moe_ffn_hidden_size is None:
            object.__setattr__(m, "moe_ffn_hidden_size", m.ffn_hidden_size)
        _pos_int(where, "moe_ffn_hidden_size", m.moe_ffn_hidden_size)
        if m.moe_shared_expert_intermediate_size is not None:
            _pos_int(where, "moe_shared_expert_intermediate_size", m.moe_shared_expert_intermediate_size)
    else:
        for f in ("moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_router_num_groups",
                  "moe_router_group_topk"):
            require(getattr(m, f) is None, f"{where}: {f}", getattr(m, f), "needs num_experts (an MoE model)")
    mla = ("qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
    if m.kv_lora_rank is not None:
        _pos_int(where, "kv_lora_rank", m.kv_lora_rank)
        for f in mla:
            _pos_int(where, f, getattr(m, f))
        if m.q_lora_rank is not None:
            _pos_int(where, "q_lora_rank", m.q_lora_rank)
        require(m.num_key_value_heads == m.num_attention_heads, f"{where}: num_key_value_heads",
                m.num_key_value_heads, "must equal num_attention_heads under MLA (every head has its own K and V)")
    else:
        for f in mla + ("q_lora_rank",):
            require(getattr(m, f) is None, f"{where}: {f}", getattr(m, f), "needs kv_lora_rank (MLA)")


def mla_projections(m) -> list[tuple[str, int, int, bool]]:
    """MLA's projections as (name, input width, output width, split over tensor
    parallelism) in forward order; the down-projections are replicated on every
    tensor-parallel rank, the per-head ones split (Megatron-Core's MLA)."""
    heads, qk, rope, v = m.num_attention_heads, m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim
    h = m.hidden_size
    out = []
    if m.q_lora_rank is not None:
        out += [("attn.q_down", h, m.q_lora_rank, False), ("attn.q_up", m.q_lora_rank, heads * (qk + rope), True)]
    else:
        out += [("attn.q", h, heads * (qk + rope), True)]
    out += [("attn.kv_down", h, m.kv_lora_rank + rope, False), ("attn.kv_up", m.kv_lora_rank, heads * (qk + v), True)]
    return out


def mla_params(m) -> int:
    """Parameters of one MLA block (projections, their two RMSNorms, output projection)."""
    weights = sum(i * o for _, i, o, _ in mla_projections(m))
    norms = (m.q_lora_rank or 0) + m.kv_lora_rank
    return weights + norms + m.num_attention_heads * m.v_head_dim * m.hidden_size


def mla_params_per_rank(m, tp: int) -> float:
    """One MLA block's parameters on one of ``tp`` ranks (down-projections and their norms
    replicated, the rest split)."""
    split = sum(i * o for _, i, o, s in mla_projections(m) if s) + m.num_attention_heads * m.v_head_dim * m.hidden_size
    replicated = sum(i * o for _, i, o, s in mla_projections(m) if not s) + (m.q_lora_rank or 0) + m.kv_lora_rank
    return split / tp + replicated


def moe_mlp_params(m, active: bool = False) -> int:
    """The MLP part of an MoE layer: router, routed experts (all, or the k a token uses)
    and shared experts."""
    experts = m.moe_router_topk if active else m.num_experts
    shared = m.mlp_params_of(m.moe_shared_expert_intermediate_size) if m.moe_shared_expert_intermediate_size else 0
    return m.hidden_size * m.num_experts + experts * m.mlp_params_of(m.moe_ffn_hidden_size) + shared
