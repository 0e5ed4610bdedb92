"""Hugging Face configs of the layer-kind families (issue 53 item 2): each written from the
published config.json's fields (the repository named above it), read into the same model as
its preset, and every key either read or ignored on purpose (``FAMILY_KEYS``)."""

import json

import pytest

from sim.errors import InputError
from sim.inputs.hf_config import FAMILY_KEYS, model_from_hf_config
from sim.inputs.layers import ChunkedAttention, FullAttention, Mamba2, SlidingWindowAttention
from sim.inputs.model import preset

# meta-llama/Llama-4-Scout-17B-16E config.json (text_config; vision_config left out)
SCOUT = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "tie_word_embeddings": False,
         "text_config": {"attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0,
                         "attn_scale": 0.1, "attn_temperature_tuning": True, "bos_token_id": 200000,
                         "eos_token_id": [200001, 200007, 200008], "floor_scale": 8192, "head_dim": 128,
                         "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
                         "interleave_moe_layer_step": 1, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
                         "max_position_embeddings": 10485760, "model_type": "llama4_text", "num_attention_heads": 40,
                         "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
                         "num_local_experts": 16, "output_router_logits": False, "pad_token_id": 200018,
                         "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "rope_type": "llama3"},
                         "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
                         "torch_dtype": "bfloat16", "use_cache": True, "use_qk_norm": True, "vocab_size": 202048}}
# openai/gpt-oss-120b config.json
GPT_OSS = {"architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
           "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
           "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
           "layer_types": ["sliding_attention", "full_attention"] * 18, "max_position_embeddings": 131072,
           "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36,
           "num_key_value_heads": 8, "num_local_experts": 128, "output_router_logits": False, "pad_token_id": 199999,
           "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                                   "original_max_position_embeddings": 4096, "rope_type": "yarn",
                                                   "truncate": False},
           "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
           "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True,
           "vocab_size": 201088}
# google/gemma-3-27b-pt config.json (text_config)
GEMMA3 = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
          "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                          "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                          "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                          "sliding_window": 1024, "max_position_embeddings": 131072, "vocab_size": 262208,
                          "final_logit_softcapping": None, "attn_logit_softcapping": None,
                          "rope_local_base_freq": 10000.0, "sliding_window_pattern": 6,
                          "hidden_activation": "gelu_pytorch_tanh"},
          "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0"}
# nvidia/Nemotron-H-56B-Base-8K config.json (its fields; the pattern as the preset's)
NEMOTRON_H = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 8192,
              "num_hidden_layers": 118, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
              "attention_head_dim": 128, "intermediate_size": 32768, "mamba_num_heads": 256, "mamba_head_dim": 64,
              "ssm_state_size": 256, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "vocab_size": 131072,
              "max_position_embeddings": 8192, "tie_word_embeddings": False, "attention_bias": False,
              "mlp_bias": False, "use_bias": False, "use_conv_bias": True, "mlp_hidden_act": "relu2",
              "mamba_hidden_act": "silu", "layer_norm_epsilon": 1e-05, "residual_in_fp32": False,
              "rescale_prenorm_residual": True, "time_step_min": 0.001, "time_step_max": 0.1,
              "time_step_floor": 0.0001, "time_step_limit": [0.0, float("inf")], "expand": 2,
              "hybrid_override_pattern": "M-M-M-M*-" + "M-M-M-M-M*-" * 9 + "M-" * 5}
# Qwen/Qwen3-Next-80B-A3B-Instruct config.json
QWEN3_NEXT = {"architectures": ["Qwen3NextForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
              "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4, "head_dim": 256,
              "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5120,
              "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
              "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
              "mlp_only_layers": [], "model_type": "qwen3_next", "moe_intermediate_size": 512, "norm_topk_prob": True,
              "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48,
              "num_key_value_heads": 2, "output_router_logits": False, "partial_rotary_factor": 0.25,
              "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000, "router_aux_loss_coef": 0.001,
              "shared_expert_intermediate_size": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "transformers_version": "4.57.0.dev0", "use_cache": True, "vocab_size": 151936}
# zai-org/GLM-4.5 config.json
GLM45 = {"architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
         "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
         "hidden_size": 5120, "partial_rotary_factor": 0.5, "initializer_range": 0.02, "intermediate_size": 12288,
         "max_position_embeddings": 131072, "model_type": "glm4_moe", "moe_intermediate_size": 1536,
         "norm_topk_prob": True, "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 160,
         "n_shared_experts": 1, "routed_scaling_factor": 2.5, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
         "num_hidden_layers": 92, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": None,
         "rope_theta": 1000000, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
         "torch_dtype": "bfloat16", "transformers_version": "4.54.0", "use_cache": True, "use_qk_norm": True,
         "vocab_size": 151552}
# state-spaces/mamba2-2.7b as transformers' Mamba2Config names its fields (64 layers, h 2560,
# 80 heads of 64, state 128, one group, chunks of 256)
MAMBA2 = {"model_type": "mamba2", "hidden_size": 2560, "num_hidden_layers": 64, "num_heads": 80, "head_dim": 64,
          "expand": 2, "state_size": 128, "n_groups": 1, "conv_kernel": 4, "chunk_size": 256, "vocab_size": 50288,
          "tie_word_embeddings": True, "use_bias": False, "use_conv_bias": True, "layer_norm_epsilon": 1e-05,
          "residual_in_fp32": True, "time_step_min": 0.001, "time_step_max": 0.1, "time_step_floor": 0.0001,
          "time_step_limit": [0.0, float("inf")], "rescale_prenorm_residual": False, "norm_before_gate": False,
          "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}

PRESET_OF = [(SCOUT, "llama4-scout", 8192), (GPT_OSS, "gpt-oss-120b", 4096), (GEMMA3, "gemma3-27b", 8192),
             (NEMOTRON_H, "nemotron-h-56b", 8192), (QWEN3_NEXT, "qwen3-next-80b-a3b", 4096), (GLM45, "glm4.5", 4096)]


@pytest.mark.parametrize("cfg,name,seq", PRESET_OF, ids=[p[1] for p in PRESET_OF])
def test_a_published_config_reads_into_its_preset(cfg, name, seq):
    got, want = model_from_hf_config(cfg, seq_length=seq), preset(name)
    assert got.layers == want.layers
    assert (got.num_params, got.active_params) == (want.num_params, want.active_params)


@pytest.mark.parametrize("cfg", [SCOUT, GPT_OSS, GEMMA3, NEMOTRON_H, QWEN3_NEXT, GLM45, MAMBA2],
                         ids=["llama4", "gpt_oss", "gemma3", "nemotron_h", "qwen3_next", "glm4_moe", "mamba2"])
def test_every_key_is_read_or_ignored_on_purpose(cfg):
    from sim.inputs.hf_config import _COMMON_IGNORED

    read, ignored = FAMILY_KEYS[cfg["model_type"]]
    inner = cfg.get("text_config", {})
    keys = (set(cfg) | set(inner)) - {"text_config", "vision_config"}
    assert keys <= set(read) | set(ignored) | set(_COMMON_IGNORED)


def test_mamba2_config_counts_its_published_size():
    # state-spaces/mamba2-2.7b: 2.7B parameters (Dao & Gu 2024, Table 3)
    m = model_from_hf_config(MAMBA2, seq_length=2048)
    assert all(isinstance(lay.mixer, Mamba2) and lay.mlp is None for lay in m.layers)
    assert abs(m.num_params - 2.7e9) < 0.05e9


def test_llama4_maverick_interleaves_dense_and_moe_layers():
    cfg = json.loads(json.dumps(SCOUT))
    cfg["text_config"].update(num_local_experts=128, interleave_moe_layer_step=2)
    m = model_from_hf_config(cfg, seq_length=8192)
    assert m.layers == preset("llama4-maverick").layers
    assert isinstance(m.layers[3].mixer, FullAttention) and isinstance(m.layers[0].mixer, ChunkedAttention)


def test_gemma2_alternates_local_and_global_layers():
    # google/gemma-2-9b config.json: 42 layers, h 3584, 16 heads of 256, 8 kv heads, 14336, window 4096
    cfg = {"model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
           "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
           "max_position_embeddings": 8192, "sliding_window": 4096, "query_pre_attn_scalar": 256,
           "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh"}
    m = model_from_hf_config(cfg, seq_length=8192)
    assert [type(lay.mixer) for lay in m.layers[:2]] == [SlidingWindowAttention, FullAttention]
    # Gemma 2 report (arXiv 2408.00118), Table 2: 917,504,000 embedding and 8,324,201,984
    # non-embedding parameters for the 9B model
    assert m.tied_embeddings and m.embedding_params == 917_504_000
    assert abs(m.num_params - m.embedding_params - 8_324_201_984) < 0.01 * 8_324_201_984


def test_mistral_sliding_window_windows_every_layer():
    # mistralai/Mistral-7B-v0.1 config.json: sliding_window 4096
    cfg = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
           "max_position_embeddings": 32768, "sliding_window": 4096}
    m = model_from_hf_config(cfg, seq_length=8192)
    assert all(lay.mixer == SlidingWindowAttention(window=4096) for lay in m.layers)
    plain = model_from_hf_config({**cfg, "sliding_window": None}, seq_length=8192)
    assert plain.layers is None and plain.num_params == m.num_params


@pytest.mark.parametrize("change,mentions", [
    ({"layer_types": ["sliding_attention", "banana"] * 18}, "layer_types[1]: got 'banana'; allowed"),
    ({"sliding_window": 8192}, "sliding_window: got 8192; must be <= seq_length 4096"),
])
def test_bad_family_configs_are_refused_in_one_line(change, mentions):
    with pytest.raises(InputError) as e:
        model_from_hf_config({**GPT_OSS, **change}, seq_length=4096)
    assert mentions in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_nemotron_h_layer_kind_is_refused():
    bad = {**NEMOTRON_H, "hybrid_override_pattern": "E" + NEMOTRON_H["hybrid_override_pattern"][1:]}
    with pytest.raises(InputError, match=r"hybrid_override_pattern\[0\]: got 'E'; allowed layer kinds"):
        model_from_hf_config(bad)


def test_a_small_hybrid_runs_end_to_end(tmp_path, capsys):
    # a Nemotron-H-like config of four one-block layers through `trainsim run` (simulated,
    # pipeline of 2): every kind's kernels go through the engine and the memory timeline
    from sim.cli import main

    cfg = {"model_type": "nemotron_h", "hidden_size": 512, "num_hidden_layers": 4, "hybrid_override_pattern": "M*-M",
           "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 1024,
           "mamba_num_heads": 16, "mamba_head_dim": 64, "ssm_state_size": 64, "n_groups": 2, "chunk_size": 128,
           "vocab_size": 8192, "max_position_embeddings": 1024}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    rc = main(["run", "--hf-config", str(path), "--gpu", "h100-sxm", "--gpus", "4", "--tensor-model-parallel-size", "2",
               "--sequence-parallel", "--pipeline-model-parallel-size", "2", "--global-batch-size", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["iteration_time_s"] > 0 and out["params"] == model_from_hf_config(cfg).num_params
