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
        raise InputError(f"{where}: {key}: missing; expected an integer > 0", field=key, path=where)
    positive_int(key, v, path=where)
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
    if not isinstance(cfg, dict):
        raise InputError(f"{where}: got {type(cfg).__name__!r}; expected a JSON object", value=type(cfg).__name__,
                         allowed="expected a JSON object", path=where)
    try:
        return _from_hf(cfg, where, seq_length, name)
    except InputError as exc:  # e.g. heads that do not divide the width: still name the file
        raise exc.in_file(where) from None


def _require(where: str, cond: bool, key: str, value, allowed: str) -> None:
    """``require`` for the key ``key`` of the config file ``where``: ``'<where>: <key>: got ...'``."""
    require(cond, key, value, allowed, path=where)


def _hf_bool(cfg: dict, key: str, where: str, default: bool) -> bool:
    v = cfg.get(key, default)
    _require(where, isinstance(v, bool), f"{key}", v, "expected true or false")
    return v


def _hf_dropout(cfg: dict, key: str, where: str) -> float:
    v = cfg.get(key, 0.1)
    if v is None:
        return 0.0
    _require(where, isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1, f"{key}", v,
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
    if mtype in FAMILY_TYPES:
        return _family(cfg, mtype, where, seq_length, str(name))
    _require(where, mtype in _LLAMA_TYPES, "model_type", mtype,
            f"supported: gpt2, {', '.join(_LLAMA_TYPES + FAMILY_TYPES)}; any other decoder-only model runs from its "
            "shape with Megatron-LM's flags instead of --hf-config (--num-layers, --hidden-size, "
            "--num-attention-heads, --ffn-hidden-size, --vocab-size, --seq-length, ...)")
    heads = _hf_int(cfg, "num_attention_heads", where)
    kv = cfg.get("num_key_value_heads")
    tie = _hf_bool(cfg, "tie_word_embeddings", where, False)
    bias = _hf_bool(cfg, "attention_bias", where, False) or _hf_bool(cfg, "mlp_bias", where, False)
    max_pos = _hf_int(cfg, "max_position_embeddings", where)
    kw = _hf_moe(cfg, mtype, where)
    if cfg.get("head_dim") is not None and "kv_lora_rank" not in kw:
        kw["kv_channels"] = _hf_int(cfg, "head_dim", where)
    if mtype in ("qwen3", "qwen3_moe"):  # transformers' Qwen3Attention: q_norm and k_norm on every head
        kw["qk_layernorm"] = True
    if mtype == "mistral" and cfg.get("sliding_window") is not None:  # Mistral 7B v0.1: every layer windowed
        from sim.inputs.layers import DenseMLP, Layer, SlidingWindowAttention

        window = _hf_int(cfg, "sliding_window", where)
        kw["layers"] = tuple(Layer(SlidingWindowAttention(window=window), DenseMLP())
                             for _ in range(_hf_int(cfg, "num_hidden_layers", where)))
    return llama(str(name), _hf_int(cfg, "num_hidden_layers", where), _hf_int(cfg, "hidden_size", where),
                 heads, heads if kv is None else _hf_int(cfg, "num_key_value_heads", where),
                 _hf_int(cfg, "intermediate_size", where), _hf_int(cfg, "vocab_size", where),
                 seq_length or training_seq_length(cfg, max_pos)[0], tied_embeddings=tie, bias=bias, max_position_embeddings=max_pos, **kw)


def _hf_name(cfg: dict, where: str) -> str | None:
    """The model's name as the file gives it: the last part of ``_name_or_path``
    (``meta-llama/Meta-Llama-3-8B`` -> ``Meta-Llama-3-8B``), else ``model_type``, else the
    first of ``architectures``; the file's folder only when the file names nothing."""
    path = cfg.get("_name_or_path")
    _require(where, path is None or isinstance(path, str), "_name_or_path", path, "expected a string")
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
        _require(where, dense == [], "mlp_only_layers", dense, "only [] is supported (every sparse step is MoE)")
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
            positive_int("n_shared_experts", shared, path=where)
            kw["moe_shared_expert_intermediate_size"] = shared * kw["moe_ffn_hidden_size"]
    else:
        return kw
    kw["moe_router_topk"] = _hf_int(cfg, "num_experts_per_tok", where)
    if mtype in ("deepseek_v2", "deepseek_v3") and (cfg.get("n_group") or 1) > 1:
        kw["moe_router_num_groups"] = _hf_int(cfg, "n_group", where)
        kw["moe_router_group_topk"] = _hf_int(cfg, "topk_group", where)
    return kw


# ------------------------------------------------------------------ layer-kind families
# model_type -> (keys read, keys ignored on purpose). A key in neither is outside what the
# reader knows; ``tests/test_hf_families.py`` checks that each published config.json's keys
# fall in one of the two. Ignored keys change no cost trainsim models: token ids, dtypes,
# initialisation, rotary bases and scaling, norm epsilons, soft-capping and attention
# scalars (elementwise, inside the fused kernels), router loss coefficients and scoring
# functions (the router GEMM is the same), inference-only settings, vision towers.
_COMMON_IGNORED = ("architectures", "model_type", "_name_or_path", "bos_token_id", "eos_token_id", "pad_token_id",
                   "torch_dtype", "dtype", "transformers_version", "use_cache", "initializer_range", "rms_norm_eps",
                   "rope_theta", "rope_scaling", "rope_parameters", "hidden_act", "attention_dropout",
                   "output_router_logits", "router_aux_loss_coef", "tie_word_embeddings_note", "head_dim_note")
FAMILY_KEYS = {
    "llama4_text": (("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "intermediate_size", "intermediate_size_mlp", "num_local_experts", "num_experts_per_tok",
                     "interleave_moe_layer_step", "moe_layers", "attention_chunk_size", "no_rope_layers",
                     "vocab_size", "max_position_embeddings", "tie_word_embeddings", "attention_bias"),
                    ("attn_temperature_tuning", "attn_scale", "floor_scale", "use_qk_norm", "router_jitter_noise",
                     "for_llm_compressor", "cache_implementation", "no_rope_layer_interval", "layer_types")),
    "gpt_oss": (("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "intermediate_size", "num_local_experts", "num_experts_per_tok", "experts_per_token", "sliding_window",
                 "layer_types", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "attention_bias",
                 "swiglu_limit"),
                ("initial_context_length", "quantization_config", "num_experts_per_tok_note")),
    "gemma": (("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "intermediate_size", "sliding_window", "sliding_window_pattern", "layer_types", "vocab_size",
               "max_position_embeddings", "tie_word_embeddings", "attention_bias"),
              ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping", "rope_local_base_freq",
               "hidden_activation", "cache_implementation", "use_bidirectional_attention", "sliding_window_size")),
    "glm4_moe": (("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                  "intermediate_size", "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok",
                  "n_shared_experts", "first_k_dense_replace", "n_group", "topk_group", "num_nextn_predict_layers",
                  "vocab_size", "max_position_embeddings", "tie_word_embeddings", "attention_bias"),
                 ("partial_rotary_factor", "routed_scaling_factor", "norm_topk_prob", "use_qk_norm")),
    "nemotron_h": (("hidden_size", "num_hidden_layers", "hybrid_override_pattern", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "attention_head_dim", "intermediate_size", "mamba_num_heads",
                    "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel", "chunk_size", "vocab_size",
                    "max_position_embeddings", "tie_word_embeddings", "attention_bias", "mlp_bias", "use_bias",
                    "mlp_hidden_act"),
                   ("use_conv_bias", "mamba_hidden_act", "time_step_min", "time_step_max", "time_step_floor",
                    "time_step_limit", "time_step_rank", "layer_norm_epsilon", "residual_in_fp32", "rescale_prenorm_residual",
                    "mamba_proj_bias", "hidden_dropout", "num_logits_to_keep", "sliding_window", "expand",
                    "use_mamba_kernels")),
    "mamba2": (("hidden_size", "num_hidden_layers", "num_heads", "head_dim", "state_size", "n_groups",
                "conv_kernel", "chunk_size", "expand", "vocab_size", "tie_word_embeddings", "use_bias"),
               ("use_conv_bias", "time_step_min", "time_step_max", "time_step_floor", "time_step_limit",
                "time_step_rank", "layer_norm_epsilon", "residual_in_fp32", "rescale_prenorm_residual", "norm_before_gate",
                "hidden_act")),
    "qwen3_next": (("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                    "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts",
                    "num_experts_per_tok", "decoder_sparse_step", "mlp_only_layers", "full_attention_interval",
                    "layer_types", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                    "linear_value_head_dim", "linear_conv_kernel_dim", "vocab_size", "max_position_embeddings",
                    "tie_word_embeddings", "attention_bias"),
                   ("partial_rotary_factor", "norm_topk_prob")),
}
FAMILY_KEYS["llama4"] = FAMILY_KEYS["llama4_text"]
for _t in ("gemma2", "gemma3", "gemma3_text"):
    FAMILY_KEYS[_t] = FAMILY_KEYS["gemma"]
FAMILY_TYPES = ("llama4", "llama4_text", "gpt_oss", "gemma2", "gemma3", "gemma3_text", "glm4_moe", "nemotron_h",
                "mamba2", "qwen3_next")


def _layer_list(cfg: dict, key: str, where: str, n: int, allowed: dict) -> list | None:
    """A per-layer list (``layer_types``, ``no_rope_layers``) of n values, each one of ``allowed``."""
    v = cfg.get(key)
    if v is None:
        return None
    _require(where, isinstance(v, list) and len(v) == n, f"{key}", f"{len(v) if isinstance(v, list) else v}",
            f"expected a list of num_hidden_layers = {n} entries")
    for i, x in enumerate(v):
        _require(where, x in allowed, f"{key}[{i}]", x, f"allowed: {', '.join(map(str, allowed))}")
    return [allowed[x] for x in v]


def _family(cfg: dict, mtype: str, where: str, seq_length: int | None, name: str) -> ModelSpec:
    """The layer-kind families (``FAMILY_KEYS``), each read into a ``ModelSpec`` with ``layers``."""
    from sim.inputs.layers import (ChunkedAttention, DenseMLP, FullAttention, GatedDeltaNet, Layer, Mamba2, MoE,
                                   SlidingWindowAttention)

    if mtype in ("llama4", "gemma3") and isinstance(cfg.get("text_config"), dict):
        inner = dict(cfg["text_config"])  # the text model; the outer file's vocabulary and tying where it says
        for key in ("vocab_size", "tie_word_embeddings"):
            if cfg.get(key) is not None:
                inner[key] = cfg[key]
        cfg = inner
    n = _hf_int(cfg, "num_hidden_layers", where)
    h = _hf_int(cfg, "hidden_size", where)
    vocab = _hf_int(cfg, "vocab_size", where)
    gemma = mtype.startswith("gemma")
    tie = _hf_bool(cfg, "tie_word_embeddings", where, gemma)
    max_pos = _hf_int(cfg, "max_position_embeddings", where, 0) if cfg.get("max_position_embeddings") else None
    # as every other config: the training length the config names, else HF_SEQ_LENGTH (training_seq_length)
    s = seq_length or training_seq_length(cfg, max_pos if max_pos is not None else HF_SEQ_LENGTH)[0]
    if mtype == "mamba2":
        heads, hd = _hf_int(cfg, "num_heads", where), _hf_int(cfg, "head_dim", where)
        _require(where, not _hf_bool(cfg, "use_bias", where, False), "use_bias", True,
                "only false is modelled (the published Mamba-2 checkpoints have no projection biases)")
        expand = cfg.get("expand", 2)
        _require(where, heads * hd == expand * h, "num_heads", heads,
                f"num_heads x head_dim = {heads * hd} must be expand x hidden_size = {expand * h}")
        mixer = Mamba2(heads=heads, head_dim=hd, state=_hf_int(cfg, "state_size", where),
                       groups=_hf_int(cfg, "n_groups", where, 1), conv=_hf_int(cfg, "conv_kernel", where, 4),
                       chunk=_hf_int(cfg, "chunk_size", where, 256))
        return llama(name, n, h, heads, heads, heads * hd, vocab, s, kv_channels=hd, tied_embeddings=tie,
                     layers=tuple(Layer(mixer, None) for _ in range(n)))
    heads = _hf_int(cfg, "num_attention_heads", where)
    kv = _hf_int(cfg, "num_key_value_heads", where) if cfg.get("num_key_value_heads") is not None else heads
    hd_key = "attention_head_dim" if cfg.get("head_dim") is None and cfg.get("attention_head_dim") else "head_dim"
    kw: dict = {"kv_channels": _hf_int(cfg, hd_key, where)} if cfg.get(hd_key) is not None else {}
    bias = _hf_bool(cfg, "attention_bias", where, mtype in ("gpt_oss", "glm4_moe")) or \
        _hf_bool(cfg, "mlp_bias", where, False)
    kw.update(tied_embeddings=tie, bias=bias, max_position_embeddings=s if max_pos is None else max_pos)
    if mtype in ("llama4", "llama4_text"):
        step = _hf_int(cfg, "interleave_moe_layer_step", where, 1)
        moe_layers = cfg.get("moe_layers")
        moe_ids = set(moe_layers) if isinstance(moe_layers, list) else {i for i in range(n) if (i + 1) % step == 0}
        rope = _layer_list(cfg, "no_rope_layers", where, n, {0: False, 1: True}) or \
            [(i + 1) % 4 != 0 for i in range(n)]
        chunk = cfg.get("attention_chunk_size")
        if chunk is not None:
            positive_int("attention_chunk_size", chunk, path=where)
        layers = tuple(Layer(ChunkedAttention(window=chunk) if chunk and rope[i] else FullAttention(),
                             MoE() if i in moe_ids else DenseMLP()) for i in range(n))
        f_expert = _hf_int(cfg, "intermediate_size", where)
        return llama(name, n, h, heads, kv, _hf_int(cfg, "intermediate_size_mlp", where, f_expert), vocab, s,
                     num_experts=_hf_int(cfg, "num_local_experts", where),
                     moe_router_topk=_hf_int(cfg, "num_experts_per_tok", where, 1), moe_ffn_hidden_size=f_expert,
                     moe_shared_expert_intermediate_size=f_expert, layers=layers, **kw)
    if mtype == "gpt_oss":
        window = _hf_int(cfg, "sliding_window", where)
        kinds = _layer_list(cfg, "layer_types", where, n, {"sliding_attention": "sliding", "full_attention": "full"}) \
            or ["sliding" if i % 2 == 0 else "full" for i in range(n)]
        layers = tuple(Layer(SlidingWindowAttention(window=window) if k == "sliding" else FullAttention(), MoE())
                       for k in kinds)
        topk = "num_experts_per_tok" if cfg.get("num_experts_per_tok") is not None else "experts_per_token"
        f = _hf_int(cfg, "intermediate_size", where)
        limit = cfg.get("swiglu_limit")
        _require(where, limit is None or (isinstance(limit, (int, float)) and not isinstance(limit, bool)
                                          and limit > 0), "swiglu_limit", limit, "expected a number > 0")
        # HF's GptOssExperts always carry gate_up_proj_bias and down_proj_bias (modeling_gpt_oss.py)
        return llama(name, n, h, heads, kv, f, vocab, s, num_experts=_hf_int(cfg, "num_local_experts", where),
                     moe_router_topk=_hf_int(cfg, topk, where), layers=layers, moe_expert_bias=True,
                     activation_clamp=None if limit is None else float(limit), **kw)
    if gemma:
        window = _hf_int(cfg, "sliding_window", where)
        pattern = cfg.get("sliding_window_pattern", 6 if mtype != "gemma2" else 2)
        positive_int("sliding_window_pattern", pattern, path=where)
        kinds = _layer_list(cfg, "layer_types", where, n, {"sliding_attention": "sliding", "full_attention": "full"}) \
            or ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(n)]
        layers = tuple(Layer(SlidingWindowAttention(window=window) if k == "sliding" else FullAttention(), DenseMLP())
                       for k in kinds)
        return llama(name, n, h, heads, kv, _hf_int(cfg, "intermediate_size", where), vocab, s, layers=layers, **kw)
    if mtype == "glm4_moe":
        f_moe = _hf_int(cfg, "moe_intermediate_size", where)
        shared = cfg.get("n_shared_experts") or 0
        extra = {"moe_shared_expert_intermediate_size": shared * f_moe} if shared else {}
        if (cfg.get("n_group") or 1) > 1:
            extra.update(moe_router_num_groups=_hf_int(cfg, "n_group", where),
                         moe_router_group_topk=_hf_int(cfg, "topk_group", where))
        return llama(name, n, h, heads, kv, _hf_int(cfg, "intermediate_size", where), vocab, s,
                     num_experts=_hf_int(cfg, "n_routed_experts", where),
                     moe_router_topk=_hf_int(cfg, "num_experts_per_tok", where), moe_ffn_hidden_size=f_moe,
                     moe_first_k_dense=cfg.get("first_k_dense_replace", 0) or 0,
                     mtp_num_layers=cfg.get("num_nextn_predict_layers", 0) or 0, **extra, **kw)
    if mtype == "nemotron_h":
        pattern = cfg.get("hybrid_override_pattern")
        _require(where, isinstance(pattern, str) and len(pattern) == n, "hybrid_override_pattern", pattern,
                f"expected a string of num_hidden_layers = {n} characters")
        act = cfg.get("mlp_hidden_act", "relu2")
        _require(where, act == "relu2", "mlp_hidden_act", act, "only relu2 (an ungated MLP) is modelled")
        mamba = Mamba2(heads=_hf_int(cfg, "mamba_num_heads", where), head_dim=_hf_int(cfg, "mamba_head_dim", where),
                       state=_hf_int(cfg, "ssm_state_size", where), groups=_hf_int(cfg, "n_groups", where, 1),
                       conv=_hf_int(cfg, "conv_kernel", where, 4), chunk=_hf_int(cfg, "chunk_size", where, 256))
        _require(where, not _hf_bool(cfg, "use_bias", where, False), "use_bias", True, "only false is modelled")
        blocks = {"M": Layer(mamba, None), "*": Layer(FullAttention(), None), "-": Layer(None, DenseMLP())}
        for i, c in enumerate(pattern):
            _require(where, c in blocks, f"hybrid_override_pattern[{i}]", c,
                    "allowed layer kinds: M (Mamba-2), * (attention), - (MLP)")
        return llama(name, n, h, heads, kv, _hf_int(cfg, "intermediate_size", where), vocab, s, mlp="relu2",
                     layers=tuple(blocks[c] for c in pattern), **kw)
    # qwen3_next
    interval = _hf_int(cfg, "full_attention_interval", where, 4)
    kinds = _layer_list(cfg, "layer_types", where, n, {"linear_attention": "linear", "full_attention": "full"}) \
        or ["full" if (i + 1) % interval == 0 else "linear" for i in range(n)]
    gdn = GatedDeltaNet(key_heads=_hf_int(cfg, "linear_num_key_heads", where),
                        value_heads=_hf_int(cfg, "linear_num_value_heads", where),
                        key_dim=_hf_int(cfg, "linear_key_head_dim", where),
                        value_dim=_hf_int(cfg, "linear_value_head_dim", where),
                        conv=_hf_int(cfg, "linear_conv_kernel_dim", where, 4))
    step = _hf_int(cfg, "decoder_sparse_step", where, 1)
    dense = cfg.get("mlp_only_layers") or []
    _require(where, isinstance(dense, list) and all(isinstance(i, int) for i in dense), "mlp_only_layers", dense,
            "expected a list of layer indices")
    layers = tuple(Layer(FullAttention(output_gate=True) if k == "full" else gdn,
                         MoE() if i not in dense and (i + 1) % step == 0 else DenseMLP())
                   for i, k in enumerate(kinds))
    extra = {}
    if cfg.get("shared_expert_intermediate_size"):
        extra["moe_shared_expert_intermediate_size"] = _hf_int(cfg, "shared_expert_intermediate_size", where)
    return llama(name, n, h, heads, kv, _hf_int(cfg, "intermediate_size", where), vocab, s,
                 num_experts=_hf_int(cfg, "num_experts", where), moe_router_topk=_hf_int(cfg, "num_experts_per_tok", where),
                 moe_ffn_hidden_size=_hf_int(cfg, "moe_intermediate_size", where), layers=layers, **extra, **kw)
