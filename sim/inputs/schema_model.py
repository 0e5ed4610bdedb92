"""The model section of the settings: a preset, a Hugging Face config.json or Megatron-LM's
shape flags (``sim.inputs.schema`` gathers the sections).

Each setting declares the ``ModelSpec`` attribute it fills: by default the attribute of its
own name (``num_experts``), else its ``spec`` (``swiglu`` fills ``mlp``) with the field's
``convert`` from the user's value to the spec's (True -> "swiglu"); a setting whose name is
no attribute of ``ModelSpec`` fills none (``model``, ``--mamba-*``: they choose or build the
layers). ``spec_values``, the settings that override a preset's value and the attribute an
error's ``setting`` names (``sim.inputs.schema.setting_field``) all come from that one
declaration, with no list of names kept beside it.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import ClassVar

from sim.inputs.fields import Field, check_section, defaults_of_class, fields_of_class, setting
from sim.inputs.model import ModelSpec
from sim.units import FRACTION, NONNEGATIVE_INT, POSITIVE_INT


def _model_presets() -> str:
    from sim.inputs.model import PRESETS

    return ", ".join(PRESETS)


_MOE = "mixture of experts (Megatron-LM flags)"
_MLA = "multi-head latent attention (Megatron-LM flags)"
_HYBRID = "hybrid layer pattern (Megatron-LM flags)"
_DROPOUT = "dropout probability (default 0.1; > 0 adds the dropout kernels)"


@dataclass(frozen=True)
class ModelSettings:
    """Which model is trained: exactly one of a preset, a Hugging Face config.json, or
    Megatron-LM's shape flags (``num_layers``, ``hidden_size``, ...)."""

    TABLE: ClassVar[str | None] = "model"
    GROUP: ClassVar[str | None] = "model shape (Megatron-LM flags)"

    model: str | None = setting(help=lambda: f"one of: {_model_presets()}", metavar="PRESET", group="model (one of)",
                                tables=(("model", "preset"),))
    hf_config: str | None = setting(help="a Hugging Face config.json", metavar="PATH", group="model (one of)",
                                    path=lambda v: True)
    num_layers: int | None = setting(help="transformer layers", type=POSITIVE_INT)
    hidden_size: int | None = setting(help="model width (hidden size)", type=POSITIVE_INT)
    num_attention_heads: int | None = setting(help="attention heads", type=POSITIVE_INT)
    ffn_hidden_size: int | None = setting(help="default 4 x hidden size (GeLU) ", type=POSITIVE_INT)
    vocab_size: int | None = setting(help="vocabulary size (tokens)", type=POSITIVE_INT)
    seq_length: int | None = setting(help="tokens per sequence", type=POSITIVE_INT)
    max_position_embeddings: int | None = setting(
        help="positions learned position embeddings cover (default: the sequence length)", type=POSITIVE_INT)
    group_query_attention: bool = setting(False, help="grouped-query attention (with --num-query-groups)",
                                          kind="switch")
    num_query_groups: int | None = setting(help="key/value heads under grouped-query attention", type=POSITIVE_INT,
                                           spec="num_key_value_heads")  # (only with --group-query-attention)
    swiglu: bool = setting(False, help="SwiGLU MLP (default GeLU)", kind="switch", spec="mlp",
                           convert=lambda on: "swiglu" if on else "gelu")
    normalization: str = setting("LayerNorm", help="normalization layer (default LayerNorm)",
                                 choices=("LayerNorm", "RMSNorm"), spec="norm", convert=str.lower)
    position_embedding_type: str = setting("learned_absolute", help="position embeddings (default learned_absolute)",
                                           choices=("learned_absolute", "rope"), spec="position_embedding",
                                           convert=lambda v: "learned" if v == "learned_absolute" else v)
    untie_embeddings_and_output_weights: bool = setting(
        False, help="output layer with weights of its own (default: tied to the embedding)", kind="switch",
        spec="tied_embeddings", convert=operator.not_)
    disable_bias_linear: bool = setting(False, help="linear layers without biases", kind="switch", spec="bias",
                                        convert=operator.not_)
    attention_dropout: float = setting(0.1, help="attention " + _DROPOUT, type=FRACTION, spec="dropout",
                                       convert=lambda p: p > 0)
    hidden_dropout: float = setting(0.1, help="hidden " + _DROPOUT, type=FRACTION, spec="dropout",
                                    convert=lambda p: p > 0)
    kv_channels: int | None = setting(help="width of one attention head (default hidden size / heads)",
                                      type=POSITIVE_INT)
    num_experts: int | None = setting(help="routed experts per MoE layer (a mixture of experts; also overrides a "
                                           "preset's or config.json's)", type=POSITIVE_INT, group=_MOE)
    moe_router_topk: int | None = setting(help="experts each token is routed to (default 2)", type=POSITIVE_INT,
                                          group=_MOE)
    moe_router_num_groups: int | None = setting(
        help="split the experts into this many equal groups (one per node or device group) for group-limited "
             "routing (DeepSeek-V3: 8; default none)", type=POSITIVE_INT, group=_MOE)
    moe_router_group_topk: int | None = setting(
        help="groups each token picks before its experts, so its copies reach at most this many "
             "(with --moe-router-num-groups; DeepSeek-V3: 4)", type=POSITIVE_INT, group=_MOE)
    moe_ffn_hidden_size: int | None = setting(help="one routed expert's MLP width (default --ffn-hidden-size)",
                                              type=POSITIVE_INT, group=_MOE)
    moe_shared_expert_intermediate_size: int | None = setting(
        help="total MLP width of the shared experts every token passes through (default none)", type=POSITIVE_INT,
        group=_MOE)
    moe_layer_freq: int | None = setting(help="every n-th layer is MoE (layer i when i %% n == 0; default 1)",
                                         type=POSITIVE_INT, group=_MOE)
    moe_first_k_dense: int | None = setting(help="the first k layers stay dense (Hugging Face "
                                                 "first_k_dense_replace; default 0)", type=NONNEGATIVE_INT,
                                            group=_MOE)
    q_lora_rank: int | None = setting(help="MLA: rank of the query's low-rank projection (default: none)",
                                      type=POSITIVE_INT, group=_MLA)
    kv_lora_rank: int | None = setting(help="MLA: rank of the key/value compression (sets multi-head latent "
                                            "attention)", type=POSITIVE_INT, group=_MLA)
    qk_head_dim: int | None = setting(help="MLA: per-head query/key width without the rotary part",
                                      type=POSITIVE_INT, group=_MLA)
    qk_pos_emb_head_dim: int | None = setting(help="MLA: per-head rotary query/key width", type=POSITIVE_INT,
                                              group=_MLA)
    v_head_dim: int | None = setting(help="MLA: per-head value width", type=POSITIVE_INT, group=_MLA)
    hybrid_override_pattern: str | None = setting(
        help="a hybrid model's layers, one letter each as Megatron-Core's hybrid models take them: M Mamba-2, "
             "* attention, - MLP, E mixture of experts (with --num-experts); as many letters as --num-layers; "
             "| between pipeline stages (virtual-stage order) places them", metavar="PATTERN", group=_HYBRID)
    mamba_state_dim: int | None = setting(help="Mamba-2 state size (default 128, Megatron-LM's)", type=POSITIVE_INT,
                                          group=_HYBRID)
    mamba_head_dim: int | None = setting(help="Mamba-2 head width (default 64, Megatron-LM's)", type=POSITIVE_INT,
                                         group=_HYBRID)
    mamba_num_groups: int | None = setting(help="Mamba-2 B/C groups (default 8, Megatron-LM's)", type=POSITIVE_INT,
                                           group=_HYBRID)
    mamba_num_heads: int | None = setting(help="Mamba-2 heads (default: 2 x hidden size / --mamba-head-dim, "
                                               "Megatron-LM's expand 2)", type=POSITIVE_INT, group=_HYBRID)
    mtp_num_layers: int | None = setting(
        help="multi-token-prediction modules after the last layer, each a transformer layer of the model's kind, a "
             "projection and the shared output head and loss again (DeepSeek-V3 trains with 1; default 0: off, as in "
             "Megatron-LM)", type=NONNEGATIVE_INT)

    def __post_init__(self):
        check_section(self)

    def spec_values(self) -> dict[str, object]:
        """The ``ModelSpec`` attributes these settings fill, by attribute, each converted (a setting
        left at None fills nothing); an attribute two settings fill (``dropout``, of the attention's
        and the hidden dropout) is true when either's is."""
        out: dict[str, object] = {}
        for f in MODEL_FIELDS:
            value = getattr(self, f.attr)
            if f.spec and value is not None:
                value = f.convert(value) if f.convert is not None else value
                out[f.spec] = (out[f.spec] or value) if f.spec in out else value
        return out


def _with_spec(f: Field) -> Field:
    """``f`` with its ``ModelSpec`` attribute filled in: its own name's where the spec has one."""
    return f if f.spec is not None else dataclasses.replace(f, spec=f.name if f.name in _SPEC_ATTRS else "")


_SPEC_ATTRS = frozenset(f.name for f in dataclasses.fields(ModelSpec))
MODEL_FIELDS: tuple[Field, ...] = tuple(_with_spec(f) for f in fields_of_class(ModelSettings, "model"))
"""The model settings, each with the ``ModelSpec`` attribute it fills (``Field.spec``; "" for none)."""
SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size")
"""The settings that describe a model by Megatron-LM's shape flags: any of them given, the model
is theirs (not a preset's or a config.json's)."""
MEGATRON_ONLY = tuple(f.name for f in MODEL_FIELDS if f.group == _HYBRID)
"""The settings of a hybrid layer pattern: they build a Megatron-flag model's layers, and describe
no preset or config.json."""
PRESET_OVERRIDES = tuple(f.name for f in MODEL_FIELDS if f.spec == f.name and f.convert is None
                         and f.name not in SHAPE + MEGATRON_ONLY and defaults_of_class(ModelSettings)[f.name] is None)
"""The settings given on top of a preset's or config.json's model (``--num-experts 16``,
``--kv-channels``, MLA's, ``--max-position-embeddings``; ``--seq-length`` as
``sim.inputs.model.with_seq_length`` sets it): those without a default that fill the
``ModelSpec`` attribute of their name as they are, the shape and a hybrid pattern aside."""
SPEC_SETTINGS = {f.spec: f.name for f in MODEL_FIELDS if f.spec and f.spec != f.name
                 and sum(g.spec == f.spec for g in MODEL_FIELDS) == 1}
"""The ``ModelSpec`` attributes one setting of another name fills, with that setting's name
(``mlp``: ``swiglu``)."""
