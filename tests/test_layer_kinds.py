"""Layer kinds (issue 53): the registry, per-kind parameters and FLOPs against hand counts,
per-kind memory and recompute, the plan rules each kind refuses, the new presets' parameter
counts against the published ones, and that a model built from explicit standard layers
costs exactly what the same model without a layer pattern costs."""

import pytest

from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.layers import (KINDS, ChunkedAttention, DenseMLP, FullAttention, GatedDeltaNet, Layer, Mamba2,
                               SlidingWindowAttention, kind)
from sim.inputs.model import llama, preset
from sim.inputs.plan import ParallelPlan
from sim.program.estimate import model_flops_per_sequence
from sim.program.memory.activations import Storing, activation_terms
from sim.program.stage_balance import auto_layer_split, layer_costs
from sim.program.workload import LayerRun, layer_work
from sim.program.workload_moe import MoeShape

H100 = load_profile("h100-sxm")


def near(x, y, rel=0.01):
    return abs(x - y) <= rel * abs(y)


def small(layers, s=1024, **kw):
    """h 256, 4 heads of 64, an MLP of 512, vocabulary 1000."""
    return llama("small", len(layers), 256, 4, 4, 512, 1000, s, layers=tuple(layers), **kw)


def core(work, name="attn.core"):
    return next(op for op in work.items if op.name == name)


# ------------------------------------------------------------------------ registry
def test_every_kind_is_found_by_its_name_and_an_unknown_one_is_refused():
    assert set(KINDS) == {"attention", "sliding", "chunked", "mla", "mamba2", "gated_deltanet", "mlp", "moe"}
    assert kind("sliding", window=128) == SlidingWindowAttention(window=128)
    with pytest.raises(InputError, match="layer kind: got 'banana'; allowed: attention, sliding"):
        kind("banana")


def test_explicit_standard_layers_cost_exactly_what_the_model_without_a_pattern_costs():
    base = preset("llama2-7b")
    explicit = llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096,
                     layers=(Layer(FullAttention(), DenseMLP()),) * 32)
    assert explicit.num_params == base.num_params and explicit.active_params == base.active_params
    for rec in ("none", "selective", "full"):
        a = layer_work(base, LayerRun(1, 2, True, rec))
        b = layer_work(explicit, LayerRun(1, 2, True, rec), layer=explicit.layers[0])
        assert a.items == b.items
        key = Storing.of(1, 2, True, rec)
        assert activation_terms(base, key) == activation_terms(explicit, key, layer=explicit.layers[0])
    assert model_flops_per_sequence(explicit) == pytest.approx(model_flops_per_sequence(base), rel=1e-12)


# --------------------------------------------------------------- windows and chunks
def test_sliding_window_attention_flops_follow_the_band_not_s_squared():
    s, w, heads, d = 1024, 128, 4, 64
    m = small([Layer(SlidingWindowAttention(window=w), DenseMLP())], s=s)
    op = core(layer_work(m, LayerRun(1), layer=m.layers[0]))
    # the causal band, doubled to the papers' non-causal convention: a query at i sees
    # min(i+1, w) keys; sum = w(w+1)/2 + (s-w)w = 122,944 query-key pairs
    pairs = w * (w + 1) // 2 + (s - w) * w
    assert pairs == 122_944
    assert op.flops == 2 * s * 240 * heads * (2 * d)  # 2w - w^2/s = 240 keys per query
    assert near(op.flops, 2 * pairs * 2 * heads * (2 * d), 1e-3)
    assert op.shape == (s, 240, d)  # the flash kernel priced at s queries against the band
    backward = core(layer_work(m, LayerRun(1), layer=m.layers[0]), "attn.core.grad")
    assert backward.flops == 2 * op.flops


def test_a_window_at_128k_costs_its_width_and_full_attention_s():
    s = 131072
    win = small([Layer(SlidingWindowAttention(window=128), DenseMLP())], s=s)
    full = small([Layer(FullAttention(), DenseMLP())], s=s)
    ratio = core(layer_work(win, LayerRun(1), layer=win.layers[0])).flops / core(layer_work(full, LayerRun(1), layer=full.layers[0])).flops
    assert ratio == 256 / s  # 2·128 − 128²/131072 = 255.875 keys, rounded to 256


def test_chunked_attention_sees_its_chunk_and_a_long_chunk_is_full_attention():
    m = small([Layer(ChunkedAttention(window=256), DenseMLP())], s=1024)
    op = core(layer_work(m, LayerRun(1), layer=m.layers[0]))
    # each chunk's causal c²/2 pairs doubled: c keys per query
    assert op.flops == 2 * 1024 * 256 * 4 * 128 and op.shape == (1024, 256, 64)
    longer = small([Layer(ChunkedAttention(window=8192), DenseMLP())], s=1024)
    full = small([Layer(FullAttention(), DenseMLP())], s=1024)
    assert layer_work(longer, LayerRun(1), layer=longer.layers[0]).items == layer_work(full, LayerRun(1), layer=full.layers[0]).items


def test_a_window_longer_than_the_sequence_is_refused():
    with pytest.raises(InputError, match="sliding_window: got 4096; must be <= seq_length 1024"):
        small([Layer(SlidingWindowAttention(window=4096), DenseMLP())], s=1024)


def test_window_attention_stores_what_full_attention_stores_under_flash():
    # flash keeps a log-sum-exp per query row, whatever the window; K and V are b·s·kv wide
    win = small([Layer(SlidingWindowAttention(window=128), DenseMLP())])
    full = small([Layer(FullAttention(), DenseMLP())])
    a = activation_terms(win, Storing.of(1), layer=win.layers[0])
    assert a == activation_terms(full, Storing.of(1), layer=full.layers[0])
    assert a["attn.k"] == a["attn.v"] == 2 * 1024 * 256 and a["attn.softmax.lse"] == 4 * 4 * 1024


# ------------------------------------------------------------------------- Mamba-2
MAMBA = Mamba2(heads=16, head_dim=64, state=64, groups=2, conv=4, chunk=128)


def test_mamba2_parameters_by_hand():
    m = small([Layer(MAMBA, None)])
    # in_proj 256 x (2·1024 + 2·2·64 + 16), conv (1024 + 256) x (4 + 1), A/D/dt 3·16,
    # gated norm 1024, out_proj 1024 x 256
    assert MAMBA.params(m) == 256 * 2320 + 1280 * 5 + 48 + 1024 + 1024 * 256 == 863_536
    assert m.layer_params(0) == 863_536 + 256  # its one RMSNorm


def test_mamba2_ssd_flops_per_chunk_by_hand():
    # Dao & Gu 2024, SSD: T/Q chunks of Q; per chunk C·Bᵀ per group 2Q²N, its product with X
    # per head 2Q²P, chunk states per head 2QNP, outputs from states per head 2QNP
    T, Q, N, P, G, H = 1024, 128, 64, 64, 2, 16
    per_chunk = 2 * Q * Q * N * G + H * (2 * Q * Q * P + 2 * Q * N * P + 2 * Q * N * P)
    assert per_chunk == 71_303_168
    assert MAMBA.ssd_flops(1, T) == (T // Q) * per_chunk == 570_425_344
    m = small([Layer(MAMBA, None)], s=T)
    work = layer_work(m, LayerRun(1), layer=m.layers[0])
    fwd = {op.name: op.flops for op in work.items if op.phase == "F" and op.kind == "gemm"}
    assert fwd["mamba.in_proj"] == 2 * T * 2320 * 256 and fwd["mamba.out_proj"] == 2 * T * 256 * 1024
    assert sum(v for k, v in fwd.items() if k.startswith("mamba.ssd")) == 570_425_344
    bwd = sum(op.flops for op in work.items if op.phase == "B" and op.name.startswith("mamba.ssd") and op.kind == "gemm")
    assert bwd == 2 * 570_425_344
    # no term in s²: twice the sequence, twice the work
    long = small([Layer(MAMBA, None)], s=2 * T)
    assert MAMBA.ssd_flops(1, 2 * T) == 2 * MAMBA.ssd_flops(1, T)
    assert long.seq_length == 2 * T


def test_mamba2_stores_its_chunk_states_and_full_recompute_its_input_only():
    m = small([Layer(MAMBA, None)])
    t = activation_terms(m, Storing.of(1), layer=m.layers[0])
    assert t["mamba.ssd.states"] == 4 * 8 * 16 * 64 * 64  # fp32, 8 chunks of H·P·N
    assert t["mamba.norm.input"] == 2 * 1024 * 256
    assert activation_terms(m, Storing.of(1, recompute="full"), layer=m.layers[0]) == {"layer.input": 2 * 1024 * 256}
    # selective recompute of the attention core has nothing to recompute in a Mamba layer
    sel = layer_work(m, LayerRun(1, recompute="selective"), layer=m.layers[0])
    assert not [i for i in sel.items if i.recompute]


def test_mamba2_plan_rules():
    m = small([Layer(MAMBA, None)])
    ok = ParallelPlan(tp=2, global_batch_size=4)
    ok.check_model(m)
    with pytest.raises(InputError, match="tp: got 4; must divide mamba2 groups 2"):
        ParallelPlan(tp=4, global_batch_size=4).check_model(m)
    with pytest.raises(InputError, match="cp: got 2; Megatron-Core does not run Mamba layers under context"):
        ParallelPlan(cp=2, global_batch_size=4).check_model(m)


# ------------------------------------------------------------------ Gated DeltaNet
GDN = GatedDeltaNet(key_heads=2, value_heads=4, key_dim=128, value_dim=128, conv=4, chunk=64)


def test_gated_deltanet_parameters_and_chunk_flops_by_hand():
    m = small([Layer(GDN, DenseMLP())], s=256)
    # in_proj_qkvz 256 x (2·256 + 2·512), in_proj_ba 256 x 8, conv (2·256 + 512) x 4,
    # A_log and dt_bias 2·4, norm 128, out_proj 512 x 256
    assert GDN.params(m) == 256 * 1536 + 256 * 8 + 1024 * 4 + 8 + 128 + 512 * 256 == 530_568
    # per chunk (C 64) and value head: 6C²dk + 4C²dv + 6C·dk·dv + 2C³/3; 4 chunks x 4 heads
    C, dk, dv = 64, 128, 128
    per = 6 * C * C * dk + 4 * C * C * dv + 6 * C * dk * dv + 2 * C ** 3 / 3
    assert GDN.chunk_flops(1, 256) == pytest.approx(16 * per, rel=1e-12)
    with pytest.raises(InputError, match="tp: got 4; must divide gated_deltanet key_heads 2"):
        ParallelPlan(tp=4, global_batch_size=4).check_model(m)


def test_linear_attention_has_no_s_squared_term():
    a = small([Layer(GDN, DenseMLP())], s=1024)
    b = small([Layer(GDN, DenseMLP())], s=2048)
    fa = layer_work(a, LayerRun(1), layer=a.layers[0]).flops()
    fb = layer_work(b, LayerRun(1), layer=b.layers[0]).flops()
    assert fb == pytest.approx(2 * fa, rel=1e-9)


# ---------------------------------------------------------------- pipeline balance
def test_layer_split_auto_balances_mixed_layers_by_cost():
    # at 64K tokens a full-attention layer (its s² term) outweighs a Mamba-2 one several times
    # (a causal flash kernel does half the s² work: sim.inputs.hardware.causal_work_fraction)
    layers = [Layer(MAMBA, None)] * 6 + [Layer(FullAttention(), DenseMLP())] * 2
    m = small(layers, s=65536)
    plan = ParallelPlan(pp=2, global_batch_size=4, layer_split="auto")
    per_layer, _, _ = layer_costs(m, plan, H100)
    assert per_layer[-1] > 1.5 * per_layer[0]  # each layer priced by its kinds
    split = auto_layer_split(m, plan, H100).layer_split
    even = (4, 4)

    def worst(sp):
        return max(sum(per_layer[:sp[0]]), sum(per_layer[sp[0]:]))

    assert split != even and worst(split) < worst(even)


# ------------------------------------------------------------------------ presets
# Each family's counts against its publisher's. Where a card quotes whole billions, the
# preset must land within the rounding of the quoted figure (the project's precedent,
# tests/test_moe_model.py); where it quotes more digits, within 1%.
def test_gpt_oss_counts():
    # OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (2025), Table 1: 116.83B total, 5.13B active;
    # 20.91B total, 3.61B active. Its active count leaves out the input embedding (a lookup).
    for name, total, active in (("gpt-oss-120b", 116.83e9, 5.13e9), ("gpt-oss-20b", 20.91e9, 3.61e9)):
        m = preset(name)
        assert near(m.num_params, total), name
        assert near(m.active_params - m.vocab_size * m.hidden_size, active), name


def _llama4_vision_params() -> int:
    # The Llama 4 vision encoder (meta-llama/Llama-4-Scout-17B-16E config.json vision_config:
    # 34 layers of width 1408, MLP 5632, biases) that Meta's totals include and trainsim does
    # not model: per layer 4·1408² + 2·1408·5632 weights; the patch embedding and projector
    # (~20M) left out, well inside the tolerance
    return 34 * (4 * 1408 ** 2 + 2 * 1408 * 5632)


def test_llama4_counts():
    # Meta, Llama 4 model cards (2025-04-05): Scout 109B total, Maverick 400B total, both 17B
    # active (text and vision together for the totals)
    scout, mav = preset("llama4-scout"), preset("llama4-maverick")
    assert near(scout.num_params + _llama4_vision_params(), 109e9)
    assert near(mav.num_params + _llama4_vision_params(), 400e9)
    for m in (scout, mav):
        assert abs(m.active_params - 17e9) < 0.5e9  # "17B": whole billions
    assert sum(lay.is_moe for lay in mav.layers) == 24 and all(lay.is_moe for lay in scout.layers)
    assert sum(isinstance(lay.mixer, ChunkedAttention) for lay in scout.layers) == 36


def test_gemma3_27b_counts():
    # Gemma 3 technical report (2025), Table 1: 27B = 1,416M embedding + 25,600M non-embedding
    # parameters (the 417M vision encoder apart)
    m = preset("gemma3-27b")
    assert near(m.embedding_params, 1416e6)
    assert near(m.num_params - m.embedding_params, 25600e6)
    assert sum(isinstance(lay.mixer, SlidingWindowAttention) for lay in m.layers) == 52


def test_nemotron_h_56b_counts():
    # Nemotron-H report (arXiv 2504.03624): 56B; 54 Mamba-2, 10 attention and 54 MLP layers
    m = preset("nemotron-h-56b")
    assert near(m.num_params, 56e9) and m.active_params == m.num_params
    kinds = [type(lay.mixer or lay.mlp) for lay in m.layers]
    assert (kinds.count(Mamba2), kinds.count(FullAttention), kinds.count(DenseMLP)) == (54, 10, 54)


def test_qwen3_next_counts():
    # Qwen3-Next-80B-A3B model card (Qwen/Qwen3-Next-80B-A3B-Instruct): "80B in total and 3B
    # activated"; whole billions. The active figure is the non-embedding one.
    m = preset("qwen3-next-80b-a3b")
    assert abs(m.num_params - 80e9) < 0.5e9
    non_embedding = m.active_params - m.embedding_params - m.vocab_size * m.hidden_size
    assert abs(non_embedding - 3e9) < 0.5e9
    assert sum(isinstance(lay.mixer, GatedDeltaNet) for lay in m.layers) == 36
    assert all(lay.is_moe for lay in m.layers)


def test_glm45_counts():
    # GLM-4.5 report (arXiv 2508.06471) and zai-org/GLM-4.5 model card: 355B total, 32B active
    # (whole billions; the active count without the embedding and output matrices)
    m = preset("glm4.5")
    assert near(m.num_params, 355e9)
    assert abs(m.active_params - m.embedding_params - m.vocab_size * m.hidden_size - 32e9) < 0.5e9


@pytest.mark.parametrize("name", ["llama4-scout", "llama4-maverick", "gpt-oss-20b", "gpt-oss-120b", "gemma3-27b",
                                  "nemotron-h-56b", "qwen3-next-80b-a3b", "glm4.5"])
def test_each_new_preset_builds_a_layer_and_its_model_flops(name):
    m = preset(name)
    assert model_flops_per_sequence(m) > 0
    lay = m.layer(m.num_layers - 1)
    moe = MoeShape(1, 1, m.seq_length * m.moe_router_topk) if lay.is_moe else None
    assert layer_work(m, LayerRun(1), layer=lay if m.layers is not None else None, moe=moe).flops() > 0
