"""What is being trained: a decoder-only transformer, described by its shape.

A ``ModelSpec`` is the shape of a GPT-style or Llama-style decoder stack and nothing
else: no parallelism, no hardware. GPT style (GPT-2/3, Megatron's GPT) has learned
position embeddings, LayerNorm, biases, a GeLU MLP of width ``ffn_hidden_size`` (4h by
default) and dropout. Llama style has rotary positions (no parameters), RMSNorm, no
biases, a SwiGLU MLP (gate, up and down projections) and grouped-query attention with
``num_key_value_heads`` K/V heads shared by groups of query heads.

Parameter count. For the GPT layout Megatron-LM (Narayanan et al., SC'21, Eq. 2) gives

    P = 12·l·h² · (1 + 13/(12h) + (V + s)/(12·l·h))

i.e. per layer 12h² weights and 13h biases and LayerNorm parameters, plus V·h token
embeddings (tied with the output layer) and s·h position embeddings. ``num_params``
counts the same things, plus the final LayerNorm's 2h that Eq. 2 leaves out; for other
shapes it counts each weight matrix from the shape (K/V projections are h × kv_dim,
SwiGLU has three h × ffn matrices, an untied output layer adds another V·h).

Three ways in: presets (``preset(name)``), a Hugging Face ``config.json``
(``model_from_hf_config``; Llama-family and GPT-2 field names) and Megatron-LM's
command-line arguments (``model_from_megatron_args``). A config.json is a foreign file
with dozens of keys irrelevant here (token ids, rope scaling, dtype), so only the keys
read are checked, strictly; unknown Megatron flags, on the other hand, are errors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from sim.errors import InputError, require

MLP_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_KINDS = ("learned", "rope")


def _positive_int(field: str, value) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
            field, value, "expected an integer > 0")


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer."""

    name: str
    num_layers: int
    """Transformer layers (l, L)."""
    hidden_size: int
    """Model width (h)."""
    num_attention_heads: int
    """Query heads (a); must divide hidden_size."""
    ffn_hidden_size: int
    """MLP inner width: 4h for GPT, e.g. 14336 for Llama 3 8B."""
    vocab_size: int
    """Vocabulary (V), unpadded."""
    seq_length: int
    """Training sequence length (s)."""
    num_key_value_heads: int | None = None
    """K/V heads for grouped-query attention; None means one per query head (MHA)."""
    mlp: str = "gelu"
    """'gelu' (two matrices) or 'swiglu' (gate, up and down: three matrices)."""
    norm: str = "layernorm"
    """'layernorm' (weight and bias) or 'rmsnorm' (weight only)."""
    position_embedding: str = "learned"
    """'learned' (a max_position_embeddings × h table) or 'rope' (no parameters)."""
    max_position_embeddings: int | None = None
    """Rows of the learned position table; None means seq_length."""
    tied_embeddings: bool = True
    """Output layer shares the token embedding matrix."""
    bias: bool = True
    """Linear layers carry biases (GPT) or not (Llama)."""
    dropout: bool = True
    """Dropout after attention and MLP (and on attention probabilities): GPT yes, Llama no."""

    def __post_init__(self):
        where = f"model {self.name}"
        for f in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                  "vocab_size", "seq_length"):
            _positive_int(f"{where}: {f}", getattr(self, f))
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        _positive_int(f"{where}: num_key_value_heads", self.num_key_value_heads)
        if self.max_position_embeddings is None:
            object.__setattr__(self, "max_position_embeddings", self.seq_length)
        _positive_int(f"{where}: max_position_embeddings", self.max_position_embeddings)
        require(self.hidden_size % self.num_attention_heads == 0,
                f"{where}: num_attention_heads", self.num_attention_heads,
                f"must divide hidden_size {self.hidden_size}")
        require(self.num_attention_heads % self.num_key_value_heads == 0,
                f"{where}: num_key_value_heads", self.num_key_value_heads,
                f"must divide num_attention_heads {self.num_attention_heads}")
        require(self.mlp in MLP_KINDS, f"{where}: mlp", self.mlp, f"allowed: {', '.join(MLP_KINDS)}")
        require(self.norm in NORM_KINDS, f"{where}: norm", self.norm, f"allowed: {', '.join(NORM_KINDS)}")
        require(self.position_embedding in POSITION_KINDS, f"{where}: position_embedding",
                self.position_embedding, f"allowed: {', '.join(POSITION_KINDS)}")
        if self.position_embedding == "learned":
            require(self.seq_length <= self.max_position_embeddings, f"{where}: seq_length",
                    self.seq_length,
                    f"must be <= max_position_embeddings {self.max_position_embeddings} (learned positions)")

    # ------------------------------------------------------------------ shape
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_dim(self) -> int:
        """Width of the K (and of the V) projection: kv_heads × head_dim."""
        return self.num_key_value_heads * self.head_dim

    # ------------------------------------------------------------- parameters
    @property
    def norm_params(self) -> int:
        """Parameters of one norm: weight and bias for LayerNorm, weight for RMSNorm."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden_size

    @property
    def attention_params(self) -> int:
        h, kv = self.hidden_size, self.kv_dim
        weights = h * (h + 2 * kv) + h * h
        biases = (h + 2 * kv) + h if self.bias else 0
        return weights + biases

    @property
    def mlp_params(self) -> int:
        h, f = self.hidden_size, self.ffn_hidden_size
        if self.mlp == "gelu":
            return 2 * h * f + ((f + h) if self.bias else 0)
        return 3 * h * f + ((2 * f + h) if self.bias else 0)

    @property
    def params_per_layer(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.norm_params

    @property
    def embedding_params(self) -> int:
        """Token embeddings plus learned position embeddings (first pipeline stage)."""
        pos = self.max_position_embeddings if self.position_embedding == "learned" else 0
        return (self.vocab_size + pos) * self.hidden_size

    @property
    def output_params(self) -> int:
        """Final norm plus the output layer's own matrix (none when tied)."""
        return self.norm_params + (0 if self.tied_embeddings else self.vocab_size * self.hidden_size)

    @property
    def num_params(self) -> int:
        """Total parameters, each shared matrix counted once."""
        return self.num_layers * self.params_per_layer + self.embedding_params + self.output_params

    def describe(self) -> str:
        gqa = f", {self.num_key_value_heads} kv heads" if self.num_key_value_heads != self.num_attention_heads else ""
        return (f"{self.name}: {self.num_params / 1e9:.2f}B params, {self.num_layers} layers, h={self.hidden_size}, "
                f"{self.num_attention_heads} heads{gqa}, ffn={self.ffn_hidden_size} ({self.mlp}), "
                f"V={self.vocab_size}, s={self.seq_length}")


def gpt(name: str, num_layers: int, hidden_size: int, num_attention_heads: int, vocab_size: int,
        seq_length: int, ffn_hidden_size: int | None = None, **kw) -> ModelSpec:
    """A GPT-style spec (GeLU MLP of 4h unless given, LayerNorm, biases, learned positions, tied)."""
    return ModelSpec(name, num_layers, hidden_size, num_attention_heads,
                     ffn_hidden_size or 4 * hidden_size, vocab_size, seq_length, **kw)


def llama(name: str, num_layers: int, hidden_size: int, num_attention_heads: int,
          num_key_value_heads: int, ffn_hidden_size: int, vocab_size: int, seq_length: int,
          **kw) -> ModelSpec:
    """A Llama-style spec (SwiGLU, RMSNorm, no biases, RoPE, untied, no dropout)."""
    kw = {"mlp": "swiglu", "norm": "rmsnorm", "position_embedding": "rope",
          "tied_embeddings": False, "bias": False, "dropout": False, **kw}
    return ModelSpec(name, num_layers, hidden_size, num_attention_heads, ffn_hidden_size,
                     vocab_size, seq_length, num_key_value_heads=num_key_value_heads, **kw)


# Shapes from the papers and model cards that introduced them.
_PRESETS = {
    # GPT-2 XL (Radford et al. 2019, Table 2; HF gpt2-xl config: n_embd 1600, 48 layers, 25 heads).
    "gpt2-1.5b": lambda: gpt("gpt2-1.5b", 48, 1600, 25, 50257, 1024),
    # GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads, ctx 2048).
    "gpt3-175b": lambda: gpt("gpt3-175b", 96, 12288, 96, 50257, 2048),
    # Korthikanti et al. 2022, Table 3 shapes (V = 51200, s = 2048); the 175B one is also
    # Megatron-LM SC'21's 174.6B model, the 530B one its 529.6B model.
    "gpt-22b": lambda: gpt("gpt-22b", 48, 6144, 64, 51200, 2048),
    "gpt-175b": lambda: gpt("gpt-175b", 96, 12288, 96, 51200, 2048),
    "gpt-530b": lambda: gpt("gpt-530b", 105, 20480, 128, 51200, 2048),
    "gpt-1t": lambda: gpt("gpt-1t", 128, 25600, 160, 51200, 2048),
    # ZeRO (Rajbhandari et al. SC'20) Table 1 uses Ψ = 7.5B without naming a shape; this
    # GPT shape (h 5120, 40 heads) has 7.504B parameters, the Ψ the table's cells round from.
    "zero-7.5b": lambda: gpt("zero-7.5b", 23, 5120, 40, 51200, 1024),
    # Llama 2 (Touvron et al. 2023, Table 1 and the HF configs).
    "llama2-7b": lambda: llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    "llama2-70b": lambda: llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    # Llama 3 / 3.1 (Dubey et al. 2024, Table 3 and the HF configs); trained at s = 8192.
    "llama3-8b": lambda: llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    "llama3-70b": lambda: llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    "llama3-405b": lambda: llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
}
PRESETS = tuple(_PRESETS)


def preset(name: str) -> ModelSpec:
    """A named preset (see ``PRESETS``)."""
    require(name in _PRESETS, "model", name, f"allowed presets: {', '.join(PRESETS)}")
    return _PRESETS[name]()


# --------------------------------------------------------------- Hugging Face
_LLAMA_TYPES = ("llama", "mistral")


def _hf_int(cfg: dict, key: str, where: str, default=None) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise InputError(f"{where}: {key}: missing; expected an integer > 0")
    _positive_int(f"{where}: {key}", v)
    return v


def model_from_hf_config(source: str | Path | dict, seq_length: int | None = None,
                         name: str | None = None) -> ModelSpec:
    """A spec from a Hugging Face ``config.json`` (a path or the parsed dict).

    Llama-family (``model_type`` llama or mistral): hidden_size, intermediate_size,
    num_hidden_layers, num_attention_heads, num_key_value_heads (null = heads),
    vocab_size, max_position_embeddings, tie_word_embeddings (default false).
    GPT-2: n_embd, n_layer, n_head, n_positions, n_inner (null = 4·n_embd), vocab_size;
    embeddings tied. ``seq_length`` defaults to the position limit.
    """
    where = "config.json"
    if not isinstance(source, dict):
        from sim.fileio import read_json

        where = str(source)
        cfg = read_json(source, "--hf-config")
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
    mtype = cfg.get("model_type") or ("gpt2" if "n_embd" in cfg else "llama" if "intermediate_size" in cfg else None)
    if name is None and "_name_or_path" in cfg:
        name = cfg["_name_or_path"]
        require(isinstance(name, str), f"{where}: _name_or_path", name, "expected a string")
    name = name or (Path(where).parent.name if where != "config.json" else None) or mtype
    if mtype == "gpt2":
        h = _hf_int(cfg, "n_embd", where)
        n_pos = _hf_int(cfg, "n_positions", where)
        inner = cfg.get("n_inner")
        drop = any([_hf_dropout(cfg, k, where) > 0 for k in ("resid_pdrop", "attn_pdrop", "embd_pdrop")])
        return gpt(str(name), _hf_int(cfg, "n_layer", where), h, _hf_int(cfg, "n_head", where),
                   _hf_int(cfg, "vocab_size", where), seq_length or n_pos,
                   ffn_hidden_size=_hf_int(cfg, "n_inner", where) if inner is not None else 4 * h,
                   max_position_embeddings=n_pos, dropout=drop)
    require(mtype in _LLAMA_TYPES, f"{where}: model_type", mtype,
            f"supported: gpt2, {', '.join(_LLAMA_TYPES)}")
    heads = _hf_int(cfg, "num_attention_heads", where)
    kv = cfg.get("num_key_value_heads")
    tie = _hf_bool(cfg, "tie_word_embeddings", where, False)
    bias = _hf_bool(cfg, "attention_bias", where, False) or _hf_bool(cfg, "mlp_bias", where, False)
    max_pos = _hf_int(cfg, "max_position_embeddings", where)
    return llama(str(name), _hf_int(cfg, "num_hidden_layers", where), _hf_int(cfg, "hidden_size", where),
                 heads, heads if kv is None else _hf_int(cfg, "num_key_value_heads", where),
                 _hf_int(cfg, "intermediate_size", where), _hf_int(cfg, "vocab_size", where),
                 seq_length or max_pos, tied_embeddings=tie, bias=bias, max_position_embeddings=max_pos)


# ------------------------------------------------------------------- Megatron
def layer_params_per_rank(model: ModelSpec, tp: int = 1) -> float:
    """Parameters of one layer on one tensor-parallel rank: column-parallel weights and
    biases and row-parallel weights are split; row-parallel biases and norms replicated."""
    m, h, t = model, model.hidden_size, tp
    f_up = (2 if m.mlp == "swiglu" else 1) * m.ffn_hidden_size
    qkv = h + 2 * m.kv_dim
    split = h * qkv + h * h + h * f_up + m.ffn_hidden_size * h
    if m.bias:
        split += qkv + f_up
    replicated = 2 * m.norm_params + (2 * h if m.bias else 0)
    return split / t + replicated


_MEGATRON_SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length")

# The flag that sets each ModelSpec field a shape given by flags can get wrong, so that an
# error names what the user typed (``--num-attention-heads``, not ``num_attention_heads``).
_MEGATRON_FLAGS = {f: "--" + f.replace("_", "-") for f in
                   ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size",
                    "seq_length", "max_position_embeddings")}
_MEGATRON_FLAGS["num_key_value_heads"] = "--num-query-groups"


def _name_megatron_flags(exc: InputError, name: str) -> InputError:
    """``model megatron: num_attention_heads: got 7; must divide hidden_size 512`` as
    ``--num-attention-heads: got 7; must divide hidden_size 512``. The reason keeps the
    field names: an experiment file's shape comes through here too, and ``blame`` puts
    the file's key in front, where a flag in the reason would read oddly."""
    field, _, rest = str(exc).removeprefix(f"model {name}: ").partition(": ")
    if field not in _MEGATRON_FLAGS or not rest.startswith("got "):
        return exc
    return InputError(f"{_MEGATRON_FLAGS[field]}: {rest}")


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
            dropout=(ns.attention_dropout or 0) > 0 or (ns.hidden_dropout or 0) > 0)
    except InputError as exc:
        raise _name_megatron_flags(exc, name) from None


def with_seq_length(model: ModelSpec, seq_length: int) -> ModelSpec:
    """The same model trained at another sequence length (learned positions must cover it)."""
    return replace(model, seq_length=seq_length)
