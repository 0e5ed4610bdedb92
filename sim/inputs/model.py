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

Mixtures of experts and multi-head latent attention (``sim.inputs.moe``) are fields of the
same spec: ``num_params`` counts every expert, ``active_params`` the ones a token uses.

Three ways in: presets (``preset(name)``), a Hugging Face ``config.json``
(``sim.inputs.hf_config.model_from_hf_config``) and Megatron-LM's command-line arguments
(``model_from_megatron_args``); unknown Megatron flags are errors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property

from sim.errors import InputError, require
from sim.inputs.layers import (ChunkedAttention, DenseMLP, FullAttention, GatedDeltaNet, Layer, Mamba2, MoE,
                               SlidingWindowAttention, kind, standard_layer)
from sim.inputs.moe import check_moe_fields, mla_params, mla_params_per_rank, moe_mlp_params

MLP_KINDS = ("gelu", "swiglu", "relu2")
NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_KINDS = ("learned", "rope")


def positive_int(field: str, value, setting: str | None = None, path: str | None = None) -> None:
    """Require ``value`` to be an integer > 0 (``field`` names it in the error; ``path``:
    the file it was read from)."""
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
            field, value, "expected an integer > 0", setting=setting, path=path)


def _require(cond: bool, where: str, attr: str, value, allowed: str) -> None:
    """``require`` for the model's attribute ``attr`` (``where``: which model)."""
    require(cond, f"{where}: {attr}", value, allowed, setting=attr)


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
    """'gelu' (two matrices), 'swiglu' (gate, up and down: three matrices) or 'relu2'
    (squared ReLU, two matrices: Nemotron-H's MLP; dense layers only)."""
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
    kv_channels: int | None = None
    """Width of one attention head (Megatron ``--kv-channels``, HF ``head_dim``); None
    means hidden_size / heads. Qwen3 sets it apart from the width (h 4096, 64 × 128)."""
    # Mixture of experts (sim.inputs.moe): None = a dense model.
    num_experts: int | None = None
    """Routed experts per MoE layer (Megatron ``--num-experts``)."""
    moe_router_topk: int = 2
    """Experts each token is routed to (k)."""
    moe_router_num_groups: int | None = None
    """Group-limited routing (Megatron ``--moe-router-num-groups``, HF ``n_group``): the
    experts split into this many equal groups of consecutive experts; None: no groups."""
    moe_router_group_topk: int | None = None
    """Groups each token picks first, its k experts then among theirs (Megatron
    ``--moe-router-group-topk``, HF ``topk_group``; ``sim.program.routing``)."""
    moe_ffn_hidden_size: int | None = None
    """One routed expert's MLP width; None means ffn_hidden_size."""
    moe_shared_expert_intermediate_size: int | None = None
    """Total width of the shared experts every token passes through (DeepSeek); None: none."""
    moe_layer_freq: int = 1
    """Every n-th layer is an MoE layer (layer i when i % n == 0; Megatron ``--moe-layer-freq``)."""
    moe_first_k_dense: int = 0
    """The first k layers stay dense (HF ``first_k_dense_replace``; DeepSeek-V3: 3)."""
    # Multi-head latent attention (DeepSeek-V2/V3): set by kv_lora_rank.
    q_lora_rank: int | None = None
    """MLA: rank of the query's low-rank projection; None projects queries directly."""
    kv_lora_rank: int | None = None
    """MLA: rank of the joint key/value compression; None means standard attention."""
    qk_head_dim: int | None = None
    """MLA: per-head query/key width without the rotary part (DeepSeek-V3: 128)."""
    qk_pos_emb_head_dim: int | None = None
    """MLA: per-head rotary query/key width, the rotary key shared by all heads (64)."""
    v_head_dim: int | None = None
    """MLA: per-head value width (128)."""
    mtp_num_layers: int = 0
    """Multi-token-prediction modules (DeepSeek-V3 report, arXiv 2412.19437 §2.2; Megatron-LM
    ``--mtp-num-layers``): module k predicts token i+k+1 from the previous depth's hidden
    states and token i+k's embedding through a projection M_k (h × 2h) of the two
    RMS-normalized halves, one transformer layer of the model's kind and the shared output
    head. They run after the last transformer layer (``sim.program.workload.mtp_works``);
    their parameters are not in ``num_params`` (DeepSeek-V3's 671B leaves them out too)."""
    activation_clamp: float | None = None
    """The experts' gated activation clamped before it runs (Megatron-Core's
    ``activation_func_clamp_value``; GPT-OSS 7.0, HF ``swiglu_limit``): the gate half to at most
    the value, the linear half to ±value, as eager kernels (``sim.program.workload_moe``); None: none."""
    qk_layernorm: bool = False
    """RMSNorm over each query and key head after the QKV projection (Megatron-Core
    ``--qk-layernorm``: ``SelfAttention.get_query_key_value_tensors`` runs ``q_layernorm`` and
    ``k_layernorm``, Transformer Engine norms of width ``kv_channels``, on every head; Qwen3 and
    Qwen3-MoE: Megatron-Bridge's ``Qwen3ModelProvider``/``Qwen3MoEModelProvider`` set
    ``qk_layernorm=True``, Hugging Face's ``Qwen3Attention`` has ``q_norm``/``k_norm``). Priced as
    two norm kernels forward and their gradients (``sim.program.workload_moe.qkv_forward``); the
    2 x head-width weights a layer are left out of ``num_params``."""
    moe_expert_bias: bool = False
    """The routed experts' linear layers carry biases (GPT-OSS: HF ``mlp1_bias``/``mlp2_bias``,
    Megatron-Bridge's ``add_bias_linear`` on a ``TEGroupedMLP``); apart from ``bias``, which GLM-4.5
    sets for its attention only. The down projection's bias is added per expert
    (``sim.program.workload_moe``)."""
    layers: tuple | None = None
    """The layer sequence, one ``sim.inputs.layers.Layer`` (mixer and MLP kinds) per layer,
    for models whose layers differ in kind (sliding/chunked/full attention, Mamba-2, Gated
    DeltaNet, MLP-only layers); None: every layer full attention (or MLA) with a dense MLP
    or, where ``is_moe_layer`` says, an MoE block, as before layer kinds existed."""
    hybrid_override_pattern: str | None = None
    """The Megatron-Core hybrid pattern the layers were built from (``--hybrid-override-pattern``,
    ``sim.inputs.megatron_model``), kept for its ``|``: they place the layers on the pipeline
    stages, which the plan takes (``sim.inputs.resolve.plan_from_settings``); None: none given."""

    def __post_init__(self):
        where = f"model {self.name}"
        for f in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                  "vocab_size", "seq_length"):
            positive_int(f"{where}: {f}", getattr(self, f), f)
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        positive_int(f"{where}: num_key_value_heads", self.num_key_value_heads, "num_key_value_heads")
        if self.max_position_embeddings is None:
            object.__setattr__(self, "max_position_embeddings", self.seq_length)
        positive_int(f"{where}: max_position_embeddings", self.max_position_embeddings, "max_position_embeddings")
        if self.kv_channels is None and self.kv_lora_rank is None:
            _require(self.hidden_size % self.num_attention_heads == 0, where, "num_attention_heads", self.num_attention_heads,
                    f"must divide hidden_size {self.hidden_size} (or set kv_channels)")
        check_moe_fields(self, where)
        _require(isinstance(self.mtp_num_layers, int) and not isinstance(self.mtp_num_layers, bool)
                 and self.mtp_num_layers >= 0, where, "mtp_num_layers", self.mtp_num_layers, "expected an integer >= 0")
        _require(self.num_attention_heads % self.num_key_value_heads == 0, where, "num_key_value_heads", self.num_key_value_heads,
                f"must divide num_attention_heads {self.num_attention_heads}")
        _require(self.mlp in MLP_KINDS, where, "mlp", self.mlp, f"allowed: {', '.join(MLP_KINDS)}")
        _require(self.mlp != "relu2" or not self.moe, where, "mlp", self.mlp,
                 "relu2 is modelled for dense MLPs only (allowed with experts: gelu, swiglu)")
        _require(self.norm in NORM_KINDS, where, "norm", self.norm, f"allowed: {', '.join(NORM_KINDS)}")
        _require(self.position_embedding in POSITION_KINDS, where, "position_embedding",
                self.position_embedding, f"allowed: {', '.join(POSITION_KINDS)}")
        if self.position_embedding == "learned":
            _require(self.seq_length <= self.max_position_embeddings, where, "seq_length",
                    self.seq_length,
                    f"must be <= max_position_embeddings {self.max_position_embeddings} (learned positions)")
        if self.layers is not None:
            _require(isinstance(self.layers, tuple) and len(self.layers) == self.num_layers
                     and all(isinstance(x, Layer) for x in self.layers), where, "layers",
                     f"{len(self.layers) if isinstance(self.layers, tuple) else self.layers} layers",
                     f"expected a tuple of {self.num_layers} sim.inputs.layers.Layer")
            for lay in sorted(set(self.layers), key=self.layers.index):
                for k in lay.blocks:
                    k.check(self, where)
            _require(self.moe or not any(lay.is_moe for lay in self.layers), where, "layers", "moe",
                     "an MoE layer needs num_experts")
        if self.hybrid_override_pattern is not None:
            _require(isinstance(self.hybrid_override_pattern, str) and self.layers is not None
                     and len(self.hybrid_override_pattern.replace("|", "")) == self.num_layers, where,
                     "hybrid_override_pattern", self.hybrid_override_pattern,
                     f"expected one letter per layer ({self.num_layers}), with the layers built from it")

    # ------------------------------------------------------------------ shape
    @property
    def head_dim(self) -> int:
        """One head's width (``kv_channels``, else h / heads); under MLA the query/key
        width, rotary part included."""
        if self.mla:
            return self.qk_head_dim + self.qk_pos_emb_head_dim
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def kv_dim(self) -> int:
        """Width of the K (and of the V) projection: kv_heads × head_dim."""
        return self.num_key_value_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of the query projection (and of the attention output before its
        projection): heads × head_dim, which is h unless ``kv_channels`` says otherwise."""
        return self.num_attention_heads * self.head_dim

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank is not None

    @property
    def moe(self) -> bool:
        return self.num_experts is not None

    def is_moe_layer(self, layer: int) -> bool:
        """Whether transformer layer ``layer`` (0-based) has routed experts (past the last
        layer, a multi-token-prediction layer: of the last layer's kind under ``layers``)."""
        if self.layers is not None:
            return self.layers[min(layer, self.num_layers - 1)].is_moe
        return self.moe and layer >= self.moe_first_k_dense and layer % self.moe_layer_freq == 0

    def layer(self, layer: int) -> Layer:
        """Layer ``layer``'s kinds (``sim.inputs.layers``)."""
        if self.layers is not None:
            return self.layers[min(layer, self.num_layers - 1)]
        return standard_layer(self, self.is_moe_layer(layer))

    @cached_property
    def layer_kinds(self) -> tuple:
        """The distinct layers of the stack, in order of first appearance (worked out once per
        spec: the search's plan checks ask for it thousands of times, and Nemotron-H's 118
        layers made that a quarter of its enumeration; ``cached_property`` keeps it out of
        the fields, so equality, hashing and ``asdict`` are unchanged)."""
        seen: dict = {}
        for i in range(self.num_layers):
            seen.setdefault(self.layer(i), None)
        return tuple(seen)

    @property
    def num_moe_layers(self) -> int:
        return sum(1 for i in range(self.num_layers) if self.is_moe_layer(i))

    # ------------------------------------------------------------- parameters
    @property
    def norm_params(self) -> int:
        """Parameters of one norm: weight and bias for LayerNorm, weight for RMSNorm."""
        return (2 if self.norm == "layernorm" else 1) * self.hidden_size

    @property
    def attention_params(self) -> int:
        if self.mla:
            return mla_params(self)
        h, q, kv = self.hidden_size, self.q_dim, self.kv_dim
        weights = h * (q + 2 * kv) + q * h
        biases = (q + 2 * kv) + h if self.bias else 0
        return weights + biases

    def mlp_params_of(self, width: int) -> int:
        """Parameters of one MLP (or expert) of inner width ``width``."""
        h, f = self.hidden_size, width
        if self.mlp != "swiglu":  # ungated: up and down
            return 2 * h * f + ((f + h) if self.bias else 0)
        return 3 * h * f + ((2 * f + h) if self.bias else 0)

    @property
    def mlp_params(self) -> int:
        return self.mlp_params_of(self.ffn_hidden_size)

    @property
    def params_per_layer(self) -> int:
        """Parameters of a dense layer (every layer of a dense model)."""
        return self.attention_params + self.mlp_params + 2 * self.norm_params

    def layer_params(self, layer: int, active: bool = False) -> int:
        """Parameters of transformer layer ``layer``; with ``active``, those one token
        uses (its top-k routed experts instead of all of them)."""
        if self.layers is not None:
            lay = self.layer(layer)
            own = sum(k.params(self) if k.mixes else k.params(self, active) for k in lay.blocks)
            return own + len(lay.blocks) * self.norm_params
        if not self.is_moe_layer(layer):
            return self.params_per_layer
        return self.attention_params + 2 * self.norm_params + moe_mlp_params(self, active)

    @property
    def mtp_params(self) -> int:
        """Parameters of the multi-token-prediction modules, the shared embedding and output
        head left out: each one's transformer layer (of the kind layer ``num_layers + k``
        would be), its projection M_k (2h·h, no bias) and its three norms (of the previous
        hidden states, of the embedding, and before the shared head; Megatron-LM's
        ``enorm``, ``hnorm`` and ``final_layernorm``)."""
        L, h = self.num_layers, self.hidden_size
        return sum(self.layer_params(L + k) + 2 * h * h + 3 * self.norm_params for k in range(self.mtp_num_layers))

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
        if self.layers is not None:
            return sum(self.layer_params(i) for i in range(self.num_layers)) + self.embedding_params + self.output_params
        moe = self.num_moe_layers
        return ((self.num_layers - moe) * self.params_per_layer + moe * self._moe_layer_params(False)
                + self.embedding_params + self.output_params)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through: every dense weight, and in each MoE
        layer its k routed experts and the shared ones (the total for a dense model)."""
        if self.layers is not None:
            return (sum(self.layer_params(i, True) for i in range(self.num_layers)) + self.embedding_params
                    + self.output_params)
        moe = self.num_moe_layers
        return ((self.num_layers - moe) * self.params_per_layer + moe * self._moe_layer_params(True)
                + self.embedding_params + self.output_params)

    def _moe_layer_params(self, active: bool) -> int:
        return self.attention_params + 2 * self.norm_params + (moe_mlp_params(self, active) if self.moe else 0)

    def describe(self) -> str:
        gqa = f", {self.num_key_value_heads} kv heads" if self.num_key_value_heads != self.num_attention_heads else ""
        if self.moe:
            gqa += (f", {self.num_experts} experts top-{self.moe_router_topk} in {self.num_moe_layers} layers "
                    f"({self.active_params / 1e9:.2f}B active)")
        if self.layers is not None:
            counts = {lay: self.layers.count(lay) for lay in self.layer_kinds}
            gqa += "; layers " + ", ".join(f"{n} x {lay.describe()}" for lay, n in counts.items())
        return (f"{self.name}: {self.num_params / 1e9:.2f}B params, {self.num_layers} layers, h={self.hidden_size}, "
                f"{self.num_attention_heads} heads{gqa}, ffn={self.ffn_hidden_size} ({self.mlp}), "
                f"V={self.vocab_size}, s={self.seq_length}")


def model_dict(model: ModelSpec) -> dict:
    """The spec as plain data (a run log's context): its fields, with ``layers`` and
    ``hybrid_override_pattern`` left out when None (as before they existed, so earlier logs still
    match) and ``layers`` otherwise one description per layer (``sim.inputs.layers.Layer.describe``)."""
    d = asdict(model)
    if model.hybrid_override_pattern is None:
        del d["hybrid_override_pattern"]
    if model.layers is None:
        del d["layers"]
    else:
        d["layers"] = [lay.describe() for lay in model.layers]
    return d


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


def _attn(name: str, window: int = 0) -> Layer:
    """An attention layer of kind ``name`` (window or chunk ``window``) with a dense MLP."""
    return Layer(kind(name, window=window) if window and name != "attention" else kind(name), DenseMLP())


def _llama4(name: str, experts: int, step: int) -> ModelSpec:
    """Llama 4 (the presets' comment): MoE on layers i with (i + 1) % step == 0 (HF's
    ``interleave_moe_layer_step``), chunked attention (8192) except on every fourth layer."""
    layers = tuple(Layer(FullAttention() if (i + 1) % 4 == 0 else ChunkedAttention(window=8192),
                         MoE() if (i + 1) % step == 0 else DenseMLP()) for i in range(48))
    return llama(name, 48, 5120, 40, 8, 16384, 202048, 8192, kv_channels=128, num_experts=experts,
                 moe_router_topk=1, moe_ffn_hidden_size=8192, moe_shared_expert_intermediate_size=8192,
                 layers=layers)


def _gpt_oss(name: str, num_layers: int, experts: int) -> ModelSpec:
    layers = tuple(Layer(SlidingWindowAttention(window=128) if i % 2 == 0 else FullAttention(), MoE())
                   for i in range(num_layers))
    return llama(name, num_layers, 2880, 64, 8, 2880, 201088, 4096, kv_channels=64, bias=True, num_experts=experts,
                 moe_router_topk=4, layers=layers, activation_clamp=7.0, moe_expert_bias=True)


def _nemotron_h_pattern() -> str:
    """54 M (Mamba-2), 54 - (MLP) and 10 * (attention) in 118 layers, the attention layers
    spread as in Nemotron-H 8B's ``M-M-M-M*-M-M-M-M-M*-...``."""
    return "M-M-M-M*-" + "M-M-M-M-M*-" * 9 + "M-" * 5


def _nemotron_h() -> ModelSpec:
    mamba = Mamba2(heads=256, head_dim=64, state=256, groups=8, conv=4, chunk=128)
    blocks = {"M": Layer(mamba, None), "*": Layer(FullAttention(), None), "-": Layer(None, DenseMLP())}
    return llama("nemotron-h-56b", 118, 8192, 64, 8, 32768, 131072, 8192, kv_channels=128, mlp="relu2",
                 layers=tuple(blocks[c] for c in _nemotron_h_pattern()))


def _qwen3_next_layer(full: bool) -> Layer:
    mixer = FullAttention(output_gate=True) if full else GatedDeltaNet(key_heads=16, value_heads=32, key_dim=128,
                                                                       value_dim=128, conv=4)
    return Layer(mixer, MoE())


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
    # Mixtures of experts, from their Hugging Face config.json files. The training sequence
    # length is not in a config (it holds the position limit): 4096 is assumed for the
    # Mixtrals, Qwen3's and DeepSeek-V3's pre-training length (V3 report §4.2) is used.
    # Mixtral 8x7B (mistralai/Mixtral-8x7B-v0.1): 46.7B total, 12.9B active (Jiang et al. 2024).
    "mixtral-8x7b": lambda: llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096,
                                  num_experts=8, moe_router_topk=2),
    # Mixtral 8x22B (mistralai/Mixtral-8x22B-v0.1): 141B total, 39B active (Mistral AI).
    "mixtral-8x22b": lambda: llama("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 4096,
                                   num_experts=8, moe_router_topk=2),
    # Qwen3-235B-A22B (Qwen/Qwen3-235B-A22B config.json): 128 experts of 1536, top-8, head_dim
    # 128 with 64 query heads (q width 8192 > h); trained at 4096 tokens (Qwen3 report §3.2).
    "qwen3-235b-a22b": lambda: llama("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, 4096,
                                     kv_channels=128, num_experts=128, moe_router_topk=8,
                                     moe_ffn_hidden_size=1536, qk_layernorm=True),
    # DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json; Liu et al. 2024): MLA, 3 dense layers
    # of 18432, then 256 routed experts of 2048 (top-8, from 4 of 8 groups: n_group 8, topk_group 4)
    # and one shared; 671B total, 37B active,
    # the multi-token-prediction module left out as in those counts; trained at 4096 tokens.
    "deepseek-v3": lambda: llama("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, 4096,
                                 num_experts=256, moe_router_topk=8, moe_ffn_hidden_size=2048,
                                 moe_router_num_groups=8, moe_router_group_topk=4,
                                 moe_shared_expert_intermediate_size=2048, moe_first_k_dense=3,
                                 q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64,
                                 v_head_dim=128),
    # Kimi-K2 (yanring/Megatron-MoE-ModelZoo model_configs/benchmarking/Kimi-K2.yaml @ e8650517d60d,
    # as ../shared/fit-data/more-sources-2026-12-03.md quotes it): DeepSeek-V3's layout with 64 heads,
    # 384 experts of 2048 (top-8, one group: no group limit) and one shared, only layer 0 dense
    # (moe-layer-freq [0]*1+[1]*60); vocabulary 163840, the tokenizer's padded to a multiple of 1280
    # (moonshotai/Kimi-K2 config.json vocab_size). Published: 1.04T total, 32B active (Moonshot AI).
    "kimi-k2": lambda: llama("kimi-k2", 61, 7168, 64, 64, 18432, 163840, 4096,
                             num_experts=384, moe_router_topk=8, moe_ffn_hidden_size=2048,
                             moe_shared_expert_intermediate_size=2048, moe_first_k_dense=1,
                             q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64,
                             v_head_dim=128),
    # Qwen3-30B-A3B (ModelZoo model_configs/benchmarking/Qwen3-30B-A3B.yaml, same commit): 48 layers,
    # h 2048, 32 heads of 128 with 4 query groups, 128 experts of 768, top-8, untied; vocabulary
    # 151936 (the tokenizer's padded to a multiple of 1187, as the yaml asks; Qwen/Qwen3-30B-A3B
    # config.json). Its qk-layernorm (qk_layernorm: Qwen3MoEModelProvider) is priced; its 2 x 128
    # weights a layer are not counted. Published: 30.5B
    # total, 3.3B active (Qwen3 report).
    "qwen3-30b-a3b": lambda: llama("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, 4096, kv_channels=128,
                                   num_experts=128, moe_router_topk=8, moe_ffn_hidden_size=768,
                                   qk_layernorm=True),
    # Grok-1 (xai-org/grok-1 model.py and run.py): 8 experts top-2, gated MLP of 32768
    # (widening factor 8 × 2/3), tied embeddings, 8192 tokens; 314B total (xAI).
    "grok-1": lambda: llama("grok-1", 64, 6144, 48, 8, 32768, 131072, 8192, tied_embeddings=True,
                            num_experts=8, moe_router_topk=2),
    # ------------------------------------------------- models whose layers differ in kind
    # (sim.inputs.layers; each from its Hugging Face config.json, tests/test_layer_kinds.py
    # checks the published parameter counts)
    # Llama 4 Scout (meta-llama/Llama-4-Scout-17B-16E config.json text_config): 48 layers,
    # h 5120, 40 heads of 128 with 8 kv heads, every layer MoE (interleave_moe_layer_step 1),
    # 16 experts of 8192 top-1 plus a shared one, chunked attention of 8192 tokens on three
    # layers of four (the fourth full, without RoPE: no_rope_layers), vocabulary 202048,
    # untied. Published: 109B total, 17B active (Meta's model card). Trained here at 8192.
    "llama4-scout": lambda: _llama4("llama4-scout", 16, 1),
    # Llama 4 Maverick (meta-llama/Llama-4-Maverick-17B-128E config.json text_config): as
    # Scout with 128 experts on every second layer (interleave_moe_layer_step 2: layers 1, 3,
    # ...), the others dense MLPs of intermediate_size_mlp 16384. Published: 400B, 17B active.
    "llama4-maverick": lambda: _llama4("llama4-maverick", 128, 2),
    # gpt-oss (openai/gpt-oss-20b and -120b config.json): h 2880, 64 heads of 64 with 8 kv
    # heads, biases on every linear layer, sliding windows of 128 tokens on even layers and
    # full attention on odd ones (layer_types), experts of 2880 top-4, vocabulary 201088,
    # untied. Published (OpenAI's gpt-oss model card, Table 1): 20.91B total, 3.61B active;
    # 116.83B total, 5.13B active. Trained here at 4096 tokens.
    "gpt-oss-20b": lambda: _gpt_oss("gpt-oss-20b", 24, 32),
    "gpt-oss-120b": lambda: _gpt_oss("gpt-oss-120b", 36, 128),
    # Gemma 3 27B (google/gemma-3-27b-pt config.json text_config): 62 layers, h 5376, 32 heads
    # of 128 with 16 kv heads, a gated GeLU MLP of 21504, tied embeddings of 262208, five
    # local layers (sliding_window 1024) per global one (sliding_window_pattern 6). Published
    # (Gemma 3 report, Table 1): 25,600M non-embedding and 1,416M embedding parameters (the
    # 417M vision encoder not modelled). Trained here at 8192 tokens.
    "gemma3-27b": lambda: llama("gemma3-27b", 62, 5376, 32, 16, 21504, 262208, 8192, kv_channels=128,
                                tied_embeddings=True,
                                layers=tuple(_attn("attention" if (i + 1) % 6 == 0 else "sliding", 1024)
                                             for i in range(62))),
    # Nemotron-H 56B (nvidia/Nemotron-H-56B-Base-8K config.json; Nemotron-H report, arXiv
    # 2504.03624, Table 1): 118 one-block layers, 54 Mamba-2 (256 heads of 64, state 256,
    # 8 groups, conv 4, chunk 128), 10 attention (64 heads of 128, 8 kv heads) and 54 MLPs of
    # 32768 (squared ReLU, ungated: two matrices), h 8192, vocabulary 131072, untied, 8192
    # tokens. The attention layers' exact positions in hybrid_override_pattern only move
    # pipeline splits; this pattern spreads them as the 8B's does. Published: 56B.
    "nemotron-h-56b": lambda: _nemotron_h(),
    # Qwen3-Next-80B-A3B (Qwen/Qwen3-Next-80B-A3B-Instruct config.json): 48 layers, h 2048,
    # Gated DeltaNet on three layers of four (16 key heads and 32 value heads of 128, conv 4)
    # and gated full attention on the fourth (full_attention_interval 4; 16 heads of 256,
    # 2 kv heads, attn_output_gate), every layer MoE: 512 experts of 512, top-10, and a shared
    # expert of 512; vocabulary 151936, untied. Published: 80B total, 3B activated (Qwen's
    # model card). Trained here at 4096 tokens.
    "qwen3-next-80b-a3b": lambda: llama("qwen3-next-80b-a3b", 48, 2048, 16, 2, 5120, 151936, 4096,
                                        kv_channels=256, num_experts=512, moe_router_topk=10,
                                        moe_ffn_hidden_size=512, moe_shared_expert_intermediate_size=512,
                                        layers=tuple(_qwen3_next_layer((i + 1) % 4 == 0) for i in range(48))),
    # GLM-4.5 (zai-org/GLM-4.5 config.json, model_type glm4_moe): 92 layers, h 5120, 96 heads of
    # 128 with 8 kv heads and QKV biases, the first 3 layers dense (12288), then 160 experts of
    # 1536, top-8, and one shared; vocabulary 151552, untied; one MTP layer
    # (num_nextn_predict_layers 1). Published: 355B total, 32B active (GLM-4.5 report).
    "glm4.5": lambda: llama("glm4.5", 92, 5120, 96, 8, 12288, 151552, 4096, kv_channels=128, bias=True,
                            num_experts=160, moe_router_topk=8, moe_ffn_hidden_size=1536,
                            moe_shared_expert_intermediate_size=1536, moe_first_k_dense=3, mtp_num_layers=1),
}
PRESETS = tuple(_PRESETS)


def preset(name: str) -> ModelSpec:
    """A named preset (see ``PRESETS``)."""
    require(name in _PRESETS, "model", name, f"allowed presets: {', '.join(PRESETS)}")
    return _PRESETS[name]()


# ------------------------------------------------------------------- Megatron
def _mlp_split(m: ModelSpec, width: int) -> tuple[float, float]:
    """(split, replicated) parameters of an MLP of ``width`` under tensor parallelism:
    up (column-parallel, with its bias) and down (row-parallel) split, the down bias not."""
    f_up = (2 if m.mlp == "swiglu" else 1) * width
    split = m.hidden_size * f_up + width * m.hidden_size + (f_up if m.bias else 0)
    return split, (m.hidden_size if m.bias else 0)


def layer_param_split(model: ModelSpec, layer: int | None = None, tp: int = 1, ep: int = 1,
                      etp: int | None = None) -> tuple[float, float]:
    """(dense, expert) parameters of transformer layer ``layer`` on one rank, under tensor
    parallelism ``tp`` and, for the routed experts, expert parallelism ``ep`` with expert
    tensor parallelism ``etp`` (default tp). Column-parallel weights and biases and
    row-parallel weights are split over tp; row-parallel biases, norms and the router
    are replicated. The expert part is the rank's num_experts/ep experts, each split
    over etp; 0 for a dense layer (``layer`` None: a dense one)."""
    m, h, t = model, model.hidden_size, tp
    if m.layers is not None:
        return _kind_param_split(m, m.layer(0 if layer is None else layer), t, ep, etp)
    if m.mla:
        attn = mla_params_per_rank(m, t)
    else:
        qkv = m.q_dim + 2 * m.kv_dim
        attn_split = h * qkv + m.q_dim * h + (qkv if m.bias else 0)
        attn_rep = h if m.bias else 0
        attn = attn_split / t + attn_rep
    dense, expert = _mlp_block_split(m, layer is not None and m.is_moe_layer(layer), t, ep, etp)
    return attn + 2 * m.norm_params + dense, expert


def _mlp_block_split(m: ModelSpec, moe: bool, t: int, ep: int, etp: int | None) -> tuple[float, float]:
    """(dense, expert) parameters on one rank of a layer's MLP block: a dense MLP split over
    tp, or an MoE block's router and shared experts (dense) and its num_experts/ep routed
    experts, each split over etp (default tp)."""
    if not moe:
        split, rep = _mlp_split(m, m.ffn_hidden_size)
        return split / t + rep, 0.0
    dense = m.hidden_size * m.num_experts
    if m.moe_shared_expert_intermediate_size:
        split, rep = _mlp_split(m, m.moe_shared_expert_intermediate_size)
        dense += split / t + rep
    split, rep = _mlp_split(m, m.moe_ffn_hidden_size)
    return dense, m.num_experts // ep * (split / (etp or t) + rep)


def _kind_param_split(m: ModelSpec, lay: Layer, t: int, ep: int, etp: int | None) -> tuple[float, float]:
    """``layer_param_split`` of a layer of a model with a layer pattern, block by block:
    each mixer's own per-rank split (``sim.inputs.layers``), one replicated norm per block,
    and a dense MLP or MoE block as for every other model."""
    dense = len(lay.blocks) * m.norm_params + (lay.mixer.params_per_rank(m, t) if lay.mixer is not None else 0)
    if lay.mlp is None:
        return dense, 0.0
    mlp, expert = _mlp_block_split(m, lay.is_moe, t, ep, etp)
    return dense + mlp, expert


def mtp_param_split(model: ModelSpec, k: int, tp: int = 1, ep: int = 1, etp: int | None = None) -> tuple[float, float]:
    """(dense, expert) parameters of multi-token-prediction module ``k`` on one rank: its
    layer's as ``layer_param_split`` splits layer ``num_layers + k``, plus its projection
    (column-parallel, split over tp) and its three norms (``ModelSpec.mtp_params``)."""
    dense, experts = layer_param_split(model, model.num_layers + k, tp, ep, etp)
    return dense + 2 * model.hidden_size ** 2 / tp + 3 * model.norm_params, experts


def layer_params_per_rank(model: ModelSpec, tp: int = 1, layer: int | None = None, ep: int = 1,
                          etp: int | None = None) -> float:
    """Parameters of one layer on one tensor-parallel rank (``layer_param_split``'s sum;
    ``layer`` None: a dense layer, every layer of a dense model)."""
    dense, experts = layer_param_split(model, layer, tp, ep, etp)
    return dense + experts


def with_seq_length(model: ModelSpec, seq_length: int) -> ModelSpec:
    """The same model trained at another sequence length (learned positions must cover it)."""
    return replace(model, seq_length=seq_length)
