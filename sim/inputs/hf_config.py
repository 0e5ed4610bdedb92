"""Models from a Hugging Face ``config.json``: Llama-family and GPT-2 field names, and
the mixtures of experts (Mixtral, Qwen-MoE, DeepSeek-V2/V3 with MLA) of ``sim.inputs.moe``.

A config.json is a foreign file with dozens of keys irrelevant here (token ids, rope
scaling, dtype), so only the keys read are checked, strictly.
"""

from __future__ import annotations

from pathlib import Path

from sim.errors import InputError, require
from sim.inputs.model import ModelSpec, gpt, llama, positive_int


HF_SEQ_LENGTH = 4096
"""The sequence length of a model from a config.json that names no training length (and
allows this many positions): a common pretraining length. ``max_position_embeddings`` is
the longest context the model accepts, often extended far past its training length
(Qwen2.5-14B: 131,072), which would make every plan's activations out of reach."""
TRAINING_LENGTH_KEYS = ("seq_length", "max_sequence_length", "n_ctx")
"""Keys with which a config.json names its training length (ChatGLM and Qwen 1 ``seq_length``,
GPT-2 ``n_ctx``), before ``rope_scaling.original_max_position_embeddings`` (the length
trained at before a long-context extension, Llama 3.1's 8192)."""


def training_seq_length(cfg: dict, max_positions: int) -> tuple[int, str]:
    """The sequence length to simulate for a config.json given no ``seq_length``, and why: the
    training length the config names, or ``HF_SEQ_LENGTH``; at most ``max_positions``."""
    rope = cfg.get("rope_scaling")
    named = [(k, cfg.get(k)) for k in TRAINING_LENGTH_KEYS]
    named.append(("rope_scaling.original_max_position_embeddings",
                  rope.get("original_max_position_embeddings") if isinstance(rope, dict) else None))
    for key, v in named:
        if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= max_positions:
            return v, f"the config's {key}"
    if max_positions < HF_SEQ_LENGTH:
        return max_positions, f"the config's position limit, below the default {HF_SEQ_LENGTH}"
    return HF_SEQ_LENGTH, f"the default for a config that names no training length; it allows {max_positions:,}"


def seq_length_note(source: str | Path | dict) -> str:
    """One line saying which sequence length a config.json gets without ``--seq-length``."""
    cfg = source if isinstance(source, dict) else _read(source)
    gpt2 = _model_type(cfg) == "gpt2"
    key = "n_positions" if gpt2 else "max_position_embeddings"
    n, why = training_seq_length(cfg, _hf_int(cfg, key, str(source)))
    return f"--hf-config {source}: seq_length {n} ({why}); --seq-length sets another"


def _read(source: str | Path) -> dict:
    from sim.fileio import read_json

    return read_json(source, "--hf-config")


def _model_type(cfg: dict) -> str | None:
    return cfg.get("model_type") or ("gpt2" if "n_embd" in cfg else "llama" if "intermediate_size" in cfg else None)


_LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "qwen2_moe", "deepseek_v2", "deepseek_v3")


def _hf_int(cfg: dict, key: str, where: str, default=None) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise InputError(f"{where}: {key}: missing; expected an integer > 0")
    positive_int(f"{where}: {key}", v)
    return v


def model_from_hf_config(source: str | Path | dict, seq_length: int | None = None,
                         name: str | None = None) -> ModelSpec:
    """A spec from a Hugging Face ``config.json`` (a path or the parsed dict).

    Llama-family (``model_type`` llama, mistral, qwen2, qwen3): hidden_size,
    intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads (null =
    heads), head_dim (null = hidden / heads), vocab_size, max_position_embeddings,
    tie_word_embeddings (default false). Mixtures of experts (``sim.inputs.moe``):
    mixtral (num_local_experts, num_experts_per_tok), qwen2_moe / qwen3_moe (num_experts,
    num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size,
    decoder_sparse_step, mlp_only_layers = [] only) and deepseek_v2 / deepseek_v3
    (n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts,
    first_k_dense_replace, moe_layer_freq, n_group and topk_group for group-limited routing
    when n_group > 1, and MLA's q_lora_rank, kv_lora_rank,
    qk_nope_head_dim, qk_rope_head_dim, v_head_dim).
    GPT-2: n_embd, n_layer, n_head, n_positions, n_inner (null = 4·n_embd), vocab_size;
    embeddings tied. ``seq_length`` defaults to the training length the config names, or
    ``HF_SEQ_LENGTH`` (``training_seq_length``), never to the position limit alone.
    """
    where = "config.json"
    if not isinstance(source, dict):
        where = str(source)
        cfg = _read(source)
    else:
        cfg = source
    require(isinstance(cfg, dict), where, type(cfg).__name__, "expected a JSON object")
    try:
        return _from_hf(cfg, where, seq_length, name)
    except InputError as exc:  # e.g. heads that do not divide the width: still name the file
        msg = str(exc)
        raise (exc if msg.startswith(where) else InputError(f"{where}: {msg}")) from None


def _hf_bool(cfg: dict, key: str, where: str, default: bool) -> bool:
    v = cfg.get(key, default)
    require(isinstance(v, bool), f"{where}: {key}", v, "expected true or false")
    return v


def _hf_dropout(cfg: dict, key: str, where: str) -> float:
    v = cfg.get(key, 0.1)
    if v is None:
        return 0.0
    require(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1, f"{where}: {key}", v,
            "expected a probability in [0, 1]")
    return float(v)


def _from_hf(cfg: dict, where: str, seq_length: int | None, name: str | None) -> ModelSpec:
    mtype = _model_type(cfg)
    name = name or _hf_name(cfg, where) or mtype
    if mtype == "gpt2":
        h = _hf_int(cfg, "n_embd", where)
        n_pos = _hf_int(cfg, "n_positions", where)
        inner = cfg.get("n_inner")
        drop = any([_hf_dropout(cfg, k, where) > 0 for k in ("resid_pdrop", "attn_pdrop", "embd_pdrop")])
        return gpt(str(name), _hf_int(cfg, "n_layer", where), h, _hf_int(cfg, "n_head", where),
                   _hf_int(cfg, "vocab_size", where), seq_length or training_seq_length(cfg, n_pos)[0],
                   ffn_hidden_size=_hf_int(cfg, "n_inner", where) if inner is not None else 4 * h,
                   max_position_embeddings=n_pos, dropout=drop)
    require(mtype in _LLAMA_TYPES, f"{where}: model_type", mtype,
            f"supported: gpt2, {', '.join(_LLAMA_TYPES)}; any other decoder-only model runs from its shape with "
            "Megatron-LM's flags instead of --hf-config (--num-layers, --hidden-size, --num-attention-heads, "
            "--ffn-hidden-size, --vocab-size, --seq-length, ...)")
    heads = _hf_int(cfg, "num_attention_heads", where)
    kv = cfg.get("num_key_value_heads")
    tie = _hf_bool(cfg, "tie_word_embeddings", where, False)
    bias = _hf_bool(cfg, "attention_bias", where, False) or _hf_bool(cfg, "mlp_bias", where, False)
    max_pos = _hf_int(cfg, "max_position_embeddings", where)
    kw = _hf_moe(cfg, mtype, where)
    if cfg.get("head_dim") is not None and "kv_lora_rank" not in kw:
        kw["kv_channels"] = _hf_int(cfg, "head_dim", where)
    return llama(str(name), _hf_int(cfg, "num_hidden_layers", where), _hf_int(cfg, "hidden_size", where),
                 heads, heads if kv is None else _hf_int(cfg, "num_key_value_heads", where),
                 _hf_int(cfg, "intermediate_size", where), _hf_int(cfg, "vocab_size", where),
                 seq_length or training_seq_length(cfg, max_pos)[0], tied_embeddings=tie, bias=bias, max_position_embeddings=max_pos, **kw)


def _hf_name(cfg: dict, where: str) -> str | None:
    """The model's name as the file gives it: the last part of ``_name_or_path``
    (``meta-llama/Meta-Llama-3-8B`` -> ``Meta-Llama-3-8B``), else ``model_type``, else the
    first of ``architectures``; the file's folder only when the file names nothing."""
    path = cfg.get("_name_or_path")
    require(path is None or isinstance(path, str), f"{where}: _name_or_path", path, "expected a string")
    arch = cfg.get("architectures")
    for candidate in (Path(path).name if path else None, cfg.get("model_type"),
                      arch[0] if isinstance(arch, list) and arch else None):
        if isinstance(candidate, str) and candidate.strip():
            return candidate.strip()
    return Path(where).parent.name if where != "config.json" else None


def _hf_moe(cfg: dict, mtype: str, where: str) -> dict:
    """The MoE and MLA fields of a config.json of ``mtype``, as ModelSpec keywords."""
    kw: dict = {}
    if mtype == "mixtral":
        kw = {"num_experts": _hf_int(cfg, "num_local_experts", where)}
    elif mtype in ("qwen2_moe", "qwen3_moe"):
        kw = {"num_experts": _hf_int(cfg, "num_experts", where),
              "moe_ffn_hidden_size": _hf_int(cfg, "moe_intermediate_size", where),
              "moe_layer_freq": _hf_int(cfg, "decoder_sparse_step", where, 1)}
        if cfg.get("shared_expert_intermediate_size"):
            kw["moe_shared_expert_intermediate_size"] = _hf_int(cfg, "shared_expert_intermediate_size", where)
        dense = cfg.get("mlp_only_layers") or []
        require(dense == [], f"{where}: mlp_only_layers", dense, "only [] is supported (every sparse step is MoE)")
    elif mtype in ("deepseek_v2", "deepseek_v3"):
        kw = {"num_experts": _hf_int(cfg, "n_routed_experts", where),
              "moe_ffn_hidden_size": _hf_int(cfg, "moe_intermediate_size", where),
              "moe_layer_freq": _hf_int(cfg, "moe_layer_freq", where, 1),
              "moe_first_k_dense": cfg.get("first_k_dense_replace", 0) or 0,
              "kv_lora_rank": _hf_int(cfg, "kv_lora_rank", where),
              "qk_head_dim": _hf_int(cfg, "qk_nope_head_dim", where),
              "qk_pos_emb_head_dim": _hf_int(cfg, "qk_rope_head_dim", where),
              "v_head_dim": _hf_int(cfg, "v_head_dim", where)}
        if cfg.get("q_lora_rank") is not None:
            kw["q_lora_rank"] = _hf_int(cfg, "q_lora_rank", where)
        shared = cfg.get("n_shared_experts") or 0
        if shared:
            positive_int(f"{where}: n_shared_experts", shared)
            kw["moe_shared_expert_intermediate_size"] = shared * kw["moe_ffn_hidden_size"]
    else:
        return kw
    kw["moe_router_topk"] = _hf_int(cfg, "num_experts_per_tok", where)
    if mtype in ("deepseek_v2", "deepseek_v3") and (cfg.get("n_group") or 1) > 1:
        kw["moe_router_num_groups"] = _hf_int(cfg, "n_group", where)
        kw["moe_router_group_topk"] = _hf_int(cfg, "topk_group", where)
    return kw
