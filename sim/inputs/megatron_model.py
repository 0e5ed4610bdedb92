"""A model from Megatron-LM's shape settings (``sim.inputs.schema_model.ModelSettings``):
``--num-layers``, ``--hidden-size``, ... and the MoE flags (``--num-experts``,
``--moe-router-topk``, ``--moe-router-num-groups``, ``--moe-router-group-topk``, ``--moe-ffn-hidden-size``, ``--moe-shared-expert-intermediate-size``,
``--moe-layer-freq``) and MLA's (``--q-lora-rank``, ``--kv-lora-rank``, ...)."""

from __future__ import annotations

from sim.errors import InputError, require
from sim.inputs.layers import DenseMLP, FullAttention, Layer, Mamba2, MoE
from sim.inputs.model import ModelSpec
from sim.inputs.schema import FIELDS, setting_field
from sim.inputs.schema_model import MEGATRON_ONLY, ModelSettings


_MEGATRON_SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length")


def _name_megatron_flags(exc: InputError, name: str) -> InputError:
    """``model megatron: num_attention_heads: got 7; must divide hidden_size 512`` as
    ``--num-attention-heads: got 7; must divide hidden_size 512`` (from the error's fields: the
    schema's flag of the ``ModelSpec`` attribute it is about). The reason keeps the
    field names: an experiment file's shape comes through here too, and ``blame`` puts
    the file's key in front, where a flag in the reason would read oddly."""
    f = setting_field(exc.setting) if exc.setting is not None and exc.allowed is not None else None
    return exc.renamed(f.flag) if f is not None and f.section == "model" else exc


def model_from_megatron_settings(ns: ModelSettings, name: str = "megatron") -> ModelSpec:
    """A spec from Megatron-LM shape settings (``sim.inputs.schema.ModelSettings``: ``num_layers``,
    ``hidden_size``, ... ``normalization``, ``position_embedding_type``)."""
    for key in _MEGATRON_SHAPE:
        if getattr(ns, key, None) is None:
            raise InputError(f"{FIELDS[key].flag}: missing; required to describe the model with Megatron "
                             f"flags ({' '.join(FIELDS[k].flag for k in _MEGATRON_SHAPE)})")
    kv = ns.num_query_groups if ns.group_query_attention else None
    if ns.group_query_attention and kv is None:
        raise InputError("--num-query-groups: missing; required with --group-query-attention")
    values = ns.spec_values()  # each setting as the ModelSpec attribute its field declares (sim.inputs.schema_model)
    values.update(ffn_hidden_size=ns.ffn_hidden_size or 4 * ns.hidden_size, num_key_value_heads=kv,
                  layers=hybrid_layers(ns))
    try:
        return ModelSpec(name, **values)
    except InputError as exc:
        raise _name_megatron_flags(exc, name) from None


# ------------------------------------------------------------------ hybrid patterns
PATTERN = "--hybrid-override-pattern"
HYBRID_LETTERS = {"M": "Mamba-2", "*": "attention", "-": "MLP", "E": "mixture of experts"}
"""Megatron-Core's hybrid layer symbols (megatron/core/ssm/mamba_hybrid_layer_allocation.py,
``Symbols``): one block per layer, as Nemotron-H's ``hybrid_override_pattern``."""


def pattern_segments(pattern: str) -> list[str]:
    """The pattern's pipeline segments (split at ``|``; one segment without any), each
    checked to hold only Megatron-Core's layer letters; ``/`` (its MTP patterns) refused."""
    require(isinstance(pattern, str) and pattern.replace("|", "") != "", PATTERN, pattern,
            "expected one letter per layer: M (Mamba-2), * (attention), - (MLP), E (mixture of experts)",
            setting="hybrid_override_pattern")
    require("/" not in pattern, PATTERN, pattern, "MTP patterns after '/' are not modelled",
            setting="hybrid_override_pattern")
    for i, c in enumerate(pattern.replace("|", "")):
        require(c in HYBRID_LETTERS, PATTERN, pattern, f"letter {i} is {c!r}; allowed: "
                + ", ".join(f"{k} ({v})" for k, v in HYBRID_LETTERS.items()) + ", | between pipeline stages",
                setting="hybrid_override_pattern")
    return pattern.split("|")


def pattern_layout(pattern: str | None) -> str | None:
    """The pipeline layout (``--pipeline-model-parallel-layout``'s string) that the ``|`` of a
    pattern set: Megatron-Core gives segment k (in virtual-stage order, ``vp_stage·pp +
    pp_rank``: its ``select_pipeline_segment``) to that virtual stage, the embedding to the
    first and the loss to the last; None without a ``|``."""
    if pattern is None or "|" not in pattern:
        return None
    return "|".join(("E" if k == 0 else "") + "t" * len(seg) + ("L" if k == len(segs) - 1 else "")
                    for segs in [pattern_segments(pattern)] for k, seg in enumerate(segs))


def hybrid_layers(ns) -> tuple | None:
    """The layers of ``--hybrid-override-pattern`` (None without one): M a Mamba-2 mixer of
    ``--mamba-*`` (Megatron-LM's defaults: state 128, head width 64, 8 groups, heads
    2·hidden/head width from its expand of 2; conv 4 taps and chunks of 128, MambaMixer's),
    * full attention, - the model's MLP, E a mixture of experts; each a layer of one block."""
    pattern = getattr(ns, "hybrid_override_pattern", None)
    if pattern is None:
        for f in MEGATRON_ONLY:  # the --mamba-* settings
            require(getattr(ns, f, None) is None, FIELDS[f].flag, getattr(ns, f, None),
                    f"sets the Mamba-2 layers of {PATTERN}, which is not given", setting=f)
        return None
    letters = "".join(pattern_segments(pattern))
    require(len(letters) == ns.num_layers, PATTERN, pattern,
            f"has {len(letters)} layers; --num-layers is {ns.num_layers}", setting="hybrid_override_pattern")
    require("E" not in letters or ns.num_experts is not None, PATTERN, pattern,
            "E (a mixture of experts) needs --num-experts", setting="hybrid_override_pattern")
    head_dim = ns.mamba_head_dim or 64            # Megatron-LM arguments.py: --mamba-head-dim 64
    if ns.mamba_num_heads is None:                # MambaMixer: d_inner = expand (2) x hidden, heads = d_inner / headdim
        require(2 * ns.hidden_size % head_dim == 0, "--mamba-head-dim", head_dim,
                f"must divide 2 x hidden size {2 * ns.hidden_size} (or give --mamba-num-heads)",
                setting="mamba_head_dim")
    heads = ns.mamba_num_heads or 2 * ns.hidden_size // head_dim
    mamba = Mamba2(heads=heads, head_dim=head_dim, state=ns.mamba_state_dim or 128,  # --mamba-state-dim 128
                   groups=ns.mamba_num_groups or 8, conv=4, chunk=128)  # --mamba-num-groups 8; d_conv 4, chunk 128
    require(heads % mamba.groups == 0, "--mamba-num-groups", mamba.groups, f"must divide the Mamba-2 heads {heads}",
            setting="mamba_num_groups")
    blocks = {"M": Layer(mamba, None), "*": Layer(FullAttention(), None), "-": Layer(None, DenseMLP()),
              "E": Layer(None, MoE())}
    return tuple(blocks[c] for c in letters)
