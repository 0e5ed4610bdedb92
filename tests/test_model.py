"""ModelSpec: parameter counts against Megatron Eq. 2 and published sizes; importers; bad input."""

import json

import pytest

from sim.errors import InputError
from sim.inputs.model import (
    PRESETS,
    ModelSpec,
    gpt,
    preset,
    with_seq_length,
)
from sim.inputs.hf_config import model_from_hf_config
from sim.inputs.resolve import model_from_megatron_args


def megatron_eq2(l, h, V, s):
    """Narayanan et al. SC'21, Eq. 2: P = 12lh²(1 + 13/(12h) + (V+s)/(12lh))."""
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


@pytest.mark.parametrize("name", ["gpt-22b", "gpt-175b", "gpt-530b", "gpt-1t", "gpt3-175b", "gpt2-1.5b"])
def test_gpt_params_match_megatron_eq2(name):
    m = preset(name)
    eq2 = megatron_eq2(m.num_layers, m.hidden_size, m.vocab_size, m.seq_length)
    # Eq. 2 leaves out the final LayerNorm (weight and bias: 2h); everything else is the same.
    assert m.num_params - 2 * m.hidden_size == pytest.approx(eq2, rel=1e-12)


def test_megatron_sc21_model_sizes():
    # Megatron-LM SC'21 Table 2 (REFERENCE.md): "174.6B" and "529.6B" models.
    assert round(preset("gpt-175b").num_params / 1e9, 1) == 174.6
    assert round(preset("gpt-530b").num_params / 1e9, 1) == 529.6


@pytest.mark.parametrize("name,published", [
    # Parameter counts of the released checkpoints (Hugging Face model cards / safetensors).
    ("gpt2-1.5b", 1_557_611_200),
    ("llama2-7b", 6_738_415_616),
    ("llama2-70b", 68_976_648_192),
    ("llama3-8b", 8_030_261_248),
    ("llama3-70b", 70_553_706_496),
    ("llama3-405b", 405_853_388_800),      # Llama 3.1 405B
])
def test_presets_match_released_checkpoints(name, published):
    assert preset(name).num_params == published


def test_405b_and_175b_headline_sizes():
    assert preset("llama3-405b").num_params == pytest.approx(405e9, rel=0.005)
    assert preset("gpt3-175b").num_params == pytest.approx(175e9, rel=0.005)


def test_every_preset_builds_and_describes_itself():
    for name in PRESETS:
        m = preset(name)
        assert m.name == name and f"{m.num_layers} layers" in m.describe()


def test_llama_layer_params_by_hand():
    # Llama 3 8B layer: q,o 4096² each; k,v 4096×1024 each; 3 MLP matrices 4096×14336;
    # two RMSNorm weights of 4096.
    m = preset("llama3-8b")
    assert m.kv_dim == 1024 and m.head_dim == 128
    assert m.params_per_layer == 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert m.embedding_params == 128256 * 4096
    assert m.output_params == 128256 * 4096 + 4096  # untied head + final norm


# Public Llama 3 8B config.json values (meta-llama/Meta-Llama-3-8B).
LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}


def test_hf_llama3_8b_config_gives_8b(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B_CONFIG))
    m = model_from_hf_config(path)
    assert round(m.num_params / 1e9, 1) == 8.0
    assert m.num_params == 8_030_261_248
    # issue 54: the sequence length is 4096 (the config names no training length), not the position limit 8192
    assert (m.mlp, m.norm, m.num_key_value_heads, m.tied_embeddings, m.seq_length) == ("swiglu", "rmsnorm", 8, False, 4096)
    assert m.max_position_embeddings == 8192


def test_hf_model_is_named_from_what_the_file_says_not_its_folder(tmp_path):
    # issue 44: --hf-config nc/config.json named the model "nc", after its folder
    def name(**cfg):
        path = tmp_path / "nc" / "config.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({k: v for k, v in {**LLAMA3_8B_CONFIG, **cfg}.items() if v is not None}))
        return model_from_hf_config(path).name

    assert name(_name_or_path="meta-llama/Meta-Llama-3-8B") == "Meta-Llama-3-8B"
    assert name(_name_or_path="/ckpt/llama3-8b/") == "llama3-8b"
    assert name() == "llama"  # model_type
    assert name(model_type=None) == "LlamaForCausalLM"  # the first architecture
    assert name(model_type=None, architectures=None) == "nc"  # the folder, as a last resort
    assert model_from_hf_config(tmp_path / "nc" / "config.json", name="mine").name == "mine"


def test_hf_kv_heads_null_means_mha_and_tied_flag():
    cfg = dict(LLAMA3_8B_CONFIG, num_key_value_heads=None, tie_word_embeddings=True)
    m = model_from_hf_config(cfg, seq_length=2048)
    assert m.num_key_value_heads == 32 and m.seq_length == 2048
    assert m.num_params == 8_030_261_248 + 2 * 4096 * 3072 * 32 - 128256 * 4096


def test_hf_llama2_70b_config_gives_the_released_count():
    # Public meta-llama/Llama-2-70b-hf config.json values; 68,976,648,192 parameters released.
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
           "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 32000,
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
           "torch_dtype": "float16"}
    m = model_from_hf_config(cfg)
    assert m.num_params == 68_976_648_192
    assert (m.num_key_value_heads, m.kv_dim, m.seq_length) == (8, 1024, 4096)


def test_hf_gpt2_xl_config():
    cfg = {"model_type": "gpt2", "n_embd": 1600, "n_layer": 48, "n_head": 25, "n_positions": 1024,
           "n_ctx": 1024, "n_inner": None, "vocab_size": 50257, "resid_pdrop": 0.1, "activation_function": "gelu_new"}
    m = model_from_hf_config(cfg)
    assert m.num_params == preset("gpt2-1.5b").num_params
    assert m.ffn_hidden_size == 6400 and m.tied_embeddings


def test_megatron_args_import():
    m = model_from_megatron_args(["--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96",
                                  "--vocab-size", "51200", "--seq-length", "2048"])
    assert m.num_params == preset("gpt-175b").num_params
    ll = model_from_megatron_args(["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32",
                                   "--ffn-hidden-size", "14336", "--vocab-size", "128256", "--seq-length", "8192",
                                   "--group-query-attention", "--num-query-groups", "8", "--swiglu",
                                   "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                                   "--untie-embeddings-and-output-weights", "--disable-bias-linear"])
    assert ll.num_params == preset("llama3-8b").num_params


def test_megatron_flags_fill_every_attribute_of_the_spec_they_name():
    # Each renamed setting's declared conversion (sim.inputs.schema_model), checked whole: the
    # Llama 3 8B flags, dropout off, give the preset field for field, its name aside.
    from dataclasses import replace

    ll = model_from_megatron_args(["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32",
                                   "--ffn-hidden-size", "14336", "--vocab-size", "128256", "--seq-length", "8192",
                                   "--group-query-attention", "--num-query-groups", "8", "--swiglu",
                                   "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                                   "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                                   "--attention-dropout", "0", "--hidden-dropout", "0"], name="llama3-8b")
    assert ll == preset("llama3-8b")
    # one dropout left on keeps the dropout kernels (Megatron-LM: either probability > 0)
    on = model_from_megatron_args(["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                   "--vocab-size", "100", "--seq-length", "16", "--attention-dropout", "0"])
    assert on.dropout and replace(on, dropout=False) == model_from_megatron_args(
        ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--vocab-size", "100",
         "--seq-length", "16", "--attention-dropout", "0", "--hidden-dropout", "0"])


def test_each_model_setting_names_the_spec_attribute_it_fills():
    # One declaration: a setting fills the ModelSpec attribute of its name, or the one its field
    # names; the few that fill none choose the model (preset, config) or build its layers.
    import dataclasses

    from sim.inputs.model import ModelSpec
    from sim.inputs.schema_model import MEGATRON_ONLY, MODEL_FIELDS, SPEC_SETTINGS

    attrs = {f.name for f in dataclasses.fields(ModelSpec)}
    assert all(f.spec in attrs for f in MODEL_FIELDS if f.spec)
    assert {f.name for f in MODEL_FIELDS if not f.spec} == {"model", "hf_config", "group_query_attention",
                                                             *MEGATRON_ONLY} - {"hybrid_override_pattern"}
    assert SPEC_SETTINGS == {"num_key_value_heads": "num_query_groups", "mlp": "swiglu", "norm": "normalization",
                             "position_embedding": "position_embedding_type",
                             "tied_embeddings": "untie_embeddings_and_output_weights", "bias": "disable_bias_linear"}


def test_a_position_limit_given_on_a_preset_is_taken():
    # GPT-2 XL's learned table is 1024 x 1600; --max-position-embeddings 2048 doubles its rows.
    from sim.inputs.resolve import model_from_settings
    from sim.inputs.schema import RunSettings

    m = model_from_settings(RunSettings.from_values({"model": "gpt2-1.5b", "max_position_embeddings": 2048}).model)
    assert m.embedding_params - preset("gpt2-1.5b").embedding_params == 1024 * 1600


def one_line_error(fn, *words):
    with pytest.raises(InputError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_bad_shapes_are_one_line_errors():
    one_line_error(lambda: gpt("x", 2, 1000, 3, 100, 16), "num_attention_heads", "3", "hidden_size 1000")
    one_line_error(lambda: ModelSpec("x", 2, 64, 8, 256, 100, 16, num_key_value_heads=3),
                   "num_key_value_heads", "3", "num_attention_heads 8")
    one_line_error(lambda: gpt("x", 0, 64, 8, 100, 16), "num_layers", "0")
    one_line_error(lambda: ModelSpec("x", 2, 64, 8, 256, 100, 16, mlp="relu"), "mlp", "relu")
    one_line_error(lambda: preset("gpt-9"), "model", "gpt-9", "llama3-8b")
    one_line_error(lambda: with_seq_length(preset("gpt-175b"), 4096), "seq_length", "4096")


def test_bad_imports_are_one_line_errors(tmp_path):
    cfg = dict(LLAMA3_8B_CONFIG)
    del cfg["intermediate_size"]
    one_line_error(lambda: model_from_hf_config(cfg), "intermediate_size", "missing")
    one_line_error(lambda: model_from_hf_config(dict(LLAMA3_8B_CONFIG, model_type="t5")), "model_type", "t5")
    one_line_error(lambda: model_from_hf_config(dict(LLAMA3_8B_CONFIG, num_attention_heads=-4)),
                   "num_attention_heads", "-4")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    one_line_error(lambda: model_from_hf_config(bad), "not valid JSON")
    one_line_error(lambda: model_from_hf_config(tmp_path / "missing.json"), "cannot read")
    one_line_error(lambda: model_from_megatron_args(["--num-layers", "2", "--lr", "0.1"]), "--lr")
    one_line_error(lambda: model_from_megatron_args(["--num-layers", "2"]), "--hidden-size", "required")
