"""A model from Megatron-LM's shape settings (``sim.inputs.schema_model.ModelSettings``):
``--num-layers``, ``--hidden-size``, ... and the MoE flags (``--num-experts``,
``--moe-router-topk``, ``--moe-router-num-groups``, ``--moe-router-group-topk``, ``--moe-ffn-hidden-size``, ``--moe-shared-expert-intermediate-size``,
``--moe-layer-freq``) and MLA's (``--q-lora-rank``, ``--kv-lora-rank``, ...)."""

from __future__ import annotations

import dataclasses

from sim.errors import InputError
from sim.inputs.model import ModelSpec
from sim.inputs.schema import FIELDS, setting_field
from sim.inputs.schema_model import ModelSettings


_MEGATRON_SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length")
_GIVEN_AS_IS = {f.name for f in dataclasses.fields(ModelSpec)} - {"num_layers", "hidden_size", "num_attention_heads",
                                                                "ffn_hidden_size", "vocab_size", "seq_length",
                                                                "max_position_embeddings"}
MOE_FIELDS = tuple(f.name for f in dataclasses.fields(ModelSettings) if f.name in _GIVEN_AS_IS)
"""ModelSpec fields with a setting of the same name (``--num-experts``, MLA's, ``--mtp-num-layers``):
passed through when set. (The settings that ``ModelSpec`` holds otherwise, such as
``--num-query-groups`` as ``num_key_value_heads``, are converted below.)"""


def _name_megatron_flags(exc: InputError, name: str) -> InputError:
    """``model megatron: num_attention_heads: got 7; must divide hidden_size 512`` as
    ``--num-attention-heads: got 7; must divide hidden_size 512`` (from the error's fields: the
    schema's flag of the ``ModelSpec`` attribute it is about). The reason keeps the
    field names: an experiment file's shape comes through here too, and ``blame`` puts
    the file's key in front, where a flag in the reason would read oddly."""
    f = setting_field(exc.setting) if exc.setting is not None and exc.allowed is not None else None
    return exc.renamed(f.flag) if f is not None and f.section == "model" else exc


def model_from_megatron_settings(ns, name: str = "megatron") -> ModelSpec:
    """A spec from Megatron-LM shape settings (``sim.inputs.schema.ModelSettings``: ``num_layers``,
    ``hidden_size``, ... ``normalization``, ``position_embedding_type``)."""
    for key in _MEGATRON_SHAPE:
        if getattr(ns, key, None) is None:
            raise InputError(f"{FIELDS[key].flag}: missing; required to describe the model with Megatron "
                             f"flags ({' '.join(FIELDS[k].flag for k in _MEGATRON_SHAPE)})")
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
