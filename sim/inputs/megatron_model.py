"""A model from Megatron-LM's shape settings (``sim.inputs.schema_model.ModelSettings``):
``--num-layers``, ``--hidden-size``, ... and the MoE flags (``--num-experts``,
``--moe-router-topk``, ``--moe-router-num-groups``, ``--moe-router-group-topk``, ``--moe-ffn-hidden-size``, ``--moe-shared-expert-intermediate-size``,
``--moe-layer-freq``) and MLA's (``--q-lora-rank``, ``--kv-lora-rank``, ...)."""

from __future__ import annotations

from sim.errors import InputError
from sim.inputs.model import ModelSpec


_MEGATRON_SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length")

# The flag that sets each ModelSpec field a shape given by flags can get wrong, so that an
# error names what the user typed (``--num-attention-heads``, not ``num_attention_heads``).
_MEGATRON_FLAGS = {f: "--" + f.replace("_", "-") for f in
                   ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size",
                    "seq_length", "max_position_embeddings")}
_MEGATRON_FLAGS["num_key_value_heads"] = "--num-query-groups"
MOE_FIELDS = ("kv_channels", "num_experts", "moe_router_topk", "moe_router_num_groups", "moe_router_group_topk",
              "moe_ffn_hidden_size",
              "moe_shared_expert_intermediate_size", "moe_layer_freq", "moe_first_k_dense", "q_lora_rank",
              "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
"""ModelSpec fields with a flag of the same name (``--num-experts``, ...), passed through when set."""
MOE_FIELDS += ("mtp_num_layers",)  # multi-token prediction (--mtp-num-layers), passed through the same way
_MEGATRON_FLAGS.update({f: "--" + f.replace("_", "-") for f in MOE_FIELDS})


def _name_megatron_flags(exc: InputError, name: str) -> InputError:
    """``model megatron: num_attention_heads: got 7; must divide hidden_size 512`` as
    ``--num-attention-heads: got 7; must divide hidden_size 512`` (from the error's fields). The reason keeps the
    field names: an experiment file's shape comes through here too, and ``blame`` puts
    the file's key in front, where a flag in the reason would read oddly."""
    if exc.setting not in _MEGATRON_FLAGS or exc.allowed is None:
        return exc
    return exc.renamed(_MEGATRON_FLAGS[exc.setting])


def model_from_megatron_settings(ns, name: str = "megatron") -> ModelSpec:
    """A spec from Megatron-LM shape settings (``sim.inputs.schema.ModelSettings``: ``num_layers``,
    ``hidden_size``, ... ``normalization``, ``position_embedding_type``)."""
    for key in _MEGATRON_SHAPE:
        if getattr(ns, key, None) is None:
            raise InputError(f"--{key.replace('_', '-')}: missing; required to describe the model with Megatron "
                             f"flags (--{' --'.join(k.replace('_', '-') for k in _MEGATRON_SHAPE)})")
    kv = ns.num_query_groups if ns.group_query_attention else None
    if ns.group_query_attention and kv is None:
        raise InputError("--num-query-groups: missing; required with --group-query-attention")
    ffn = ns.ffn_hidden_size or 4 * ns.hidden_size
    try:
        return ModelSpec(
            name, ns.num_layers, ns.hidden_size, ns.num_attention_heads, ffn, ns.vocab_size,
            ns.seq_length, num_key_value_heads=kv, mlp="swiglu" if ns.swiglu else "gelu",
            norm=ns.normalization.lower(),
            position_embedding="learned" if ns.position_embedding_type == "learned_absolute" else "rope",
            max_position_embeddings=ns.max_position_embeddings,
            tied_embeddings=not ns.untie_embeddings_and_output_weights, bias=not ns.disable_bias_linear,
            dropout=(ns.attention_dropout or 0) > 0 or (ns.hidden_dropout or 0) > 0,
            **{f: getattr(ns, f) for f in MOE_FIELDS if getattr(ns, f, None) is not None})
    except InputError as exc:
        raise _name_megatron_flags(exc, name) from None
