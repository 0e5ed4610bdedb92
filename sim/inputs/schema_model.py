"""The model section of the settings: a preset, a Hugging Face config.json or Megatron-LM's
shape flags (``sim.inputs.schema`` gathers the sections)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sim.inputs.fields import check_section, setting
from sim.units import FRACTION, POSITIVE_INT


def _model_presets() -> str:
    from sim.inputs.model import PRESETS

    return ", ".join(PRESETS)


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
    num_query_groups: int | None = setting(help="key/value heads under grouped-query attention", type=POSITIVE_INT)
    swiglu: bool = setting(False, help="SwiGLU MLP (default GeLU)", kind="switch")
    normalization: str = setting("LayerNorm", help="normalization layer (default LayerNorm)",
                                 choices=("LayerNorm", "RMSNorm"))
    position_embedding_type: str = setting("learned_absolute", help="position embeddings (default learned_absolute)",
                                           choices=("learned_absolute", "rope"))
    untie_embeddings_and_output_weights: bool = setting(
        False, help="output layer with weights of its own (default: tied to the embedding)", kind="switch")
    disable_bias_linear: bool = setting(False, help="linear layers without biases", kind="switch")
    attention_dropout: float = setting(0.1, help="attention " + _DROPOUT, type=FRACTION)
    hidden_dropout: float = setting(0.1, help="hidden " + _DROPOUT, type=FRACTION)

    def __post_init__(self):
        check_section(self)
