"""Mixtures of experts and MLA as model shapes: parameter counts against the published
sizes, config.json import, expert-parallel groups, routing draws and bad input."""

import json

import numpy as np
import pytest

from sim.errors import InputError
from sim.inputs.experts import Folding
from sim.inputs.hf_config import model_from_hf_config
from sim.inputs.model import layer_param_split, llama, preset
from sim.inputs.plan import ParallelPlan
from sim.inputs.resolve import model_from_megatron_args
from sim.program.routing import Routing


def near(value, published, rel=0.01):
    return abs(value - published) <= rel * published


def test_mixtral_8x7b_total_and_active_match_the_published_counts():
    # Mistral AI (Jiang et al. 2024): 46.7B parameters, 12.9B used per token.
    m = preset("mixtral-8x7b")
    assert near(m.num_params, 46.7e9) and near(m.active_params, 12.9e9)
    # by hand: 8 experts of 3·4096·14336, GQA attention, router 4096·8, two RMSNorms
    h, f = 4096, 14336
    attn = h * (h + 2 * 1024) + h * h
    layer = attn + 8 * 3 * h * f + h * 8 + 2 * h
    assert m.num_params == 32 * layer + 2 * 32000 * h + h


def test_deepseek_v3_total_and_active():
    # DeepSeek-V3 report: 671B total, 37B activated per token (the MTP module apart).
    m = preset("deepseek-v3")
    assert near(m.num_params, 671e9)
    # The 37B is a rounded figure whose convention (embedding lookup in or out) is not
    # stated: it lies between the count without the input embedding table and with it.
    assert m.active_params - m.embedding_params <= 37e9 <= m.active_params
    assert near(m.active_params, 37e9, 0.015)


@pytest.mark.parametrize("name,total,active", [("mixtral-8x22b", 141e9, 39e9), ("qwen3-235b-a22b", 235e9, 22e9),
                                               ("grok-1", 314e9, None)])
def test_other_presets_match_their_published_totals(name, total, active):
    m = preset(name)
    assert near(m.num_params, total)
    if active is not None:
        assert near(m.active_params, active, 0.02)  # published as whole billions


def test_kimi_k2_and_qwen3_30b_a3b_match_their_published_sizes():
    # Qwen3-30B-A3B: 30.5B total, 3.3B activated (Qwen3 report; whole tenths). The shape
    # leaves out its q/k layernorms (2 x 128 weights a layer, 12,288 in all).
    q = preset("qwen3-30b-a3b")
    assert near(q.num_params, 30.5e9, 0.005) and near(q.active_params, 3.3e9, 0.02)
    # by hand: 48 x (attention 2048 x (4096 + 2 x 512) + 4096 x 2048, 128 experts of 3 x 2048 x 768,
    # the router 2048 x 128, two norms) + untied 151936 x 2048 twice + the final norm
    h = 2048
    layer = h * (4096 + 1024) + 4096 * h + 128 * 3 * h * 768 + h * 128 + 2 * h
    assert q.num_params == 48 * layer + 2 * 151936 * h + h
    # Kimi-K2: "1.04 trillion total, 32 billion activated" (Moonshot AI). Its documented shape
    # (61 layers, 384 experts of 2048 in 60 of them, MLA with 64 heads, vocabulary 163840)
    # counts 1.026T, 1.3% under the headline: what the rest is, the sources do not say.
    # 32B activated lies, as DeepSeek-V3's 37B does, between the count without the input
    # embedding table and with it.
    k = preset("kimi-k2")
    assert near(k.num_params, 1.04e12, 0.015) and k.num_params < 1.04e12
    assert k.active_params - k.embedding_params <= 32e9 <= k.active_params
    d = preset("deepseek-v3")   # the same layout: 128 more experts in each of 2 more MoE layers, half the heads
    expert = 3 * 7168 * 2048
    assert k.num_moe_layers == 60 and d.num_moe_layers == 58
    assert k.num_params - k.embedding_params - k.output_params == pytest.approx(
        d.num_params - d.embedding_params - d.output_params + (60 * 384 - 58 * 256) * (expert + 7168)
        + 2 * 3 * 7168 * 2048 - 2 * 3 * 7168 * 18432      # 2 layers trade the dense MLP for the shared expert
        + 61 * (k.attention_params - d.attention_params), rel=1e-12)


def test_mla_attention_is_counted_from_its_projections():
    m = preset("deepseek-v3")
    h, n = 7168, 128
    by_hand = (h * 1536 + 1536 + 1536 * n * (128 + 64) + h * (512 + 64) + 512 + 512 * n * (128 + 128)
               + n * 128 * h)
    assert m.attention_params == by_hand
    assert m.head_dim == 192 and m.mla


def test_first_k_dense_and_layer_freq_choose_the_moe_layers():
    m = preset("deepseek-v3")
    assert [m.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert m.num_moe_layers == 58
    every_other = llama("x", 8, 256, 4, 4, 512, 1000, 128, num_experts=4, moe_layer_freq=2)
    assert [i for i in range(8) if every_other.is_moe_layer(i)] == [0, 2, 4, 6]


def test_layer_split_per_rank_sums_back_to_the_layer():
    m = preset("mixtral-8x7b")
    dense, experts = layer_param_split(m, 0, tp=1, ep=1)
    assert dense + experts == m.layer_params(0)
    d8, e8 = layer_param_split(m, 0, tp=2, ep=4, etp=1)
    assert e8 == experts / 4                     # 2 of 8 experts, whole
    assert d8 < dense and dense - d8 == pytest.approx((dense - 2 * 4096 - 4096 * 8) / 2)


def test_hf_configs_of_mixtral_qwen3_moe_and_deepseek_v3():
    mixtral = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
               "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2}
    assert model_from_hf_config(mixtral, seq_length=4096).num_params == preset("mixtral-8x7b").num_params
    qwen = {"model_type": "qwen3_moe", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 94,
            "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
            "max_position_embeddings": 40960, "num_experts": 128, "num_experts_per_tok": 8,
            "moe_intermediate_size": 1536, "decoder_sparse_step": 1, "mlp_only_layers": []}
    assert model_from_hf_config(qwen, seq_length=4096).num_params == preset("qwen3-235b-a22b").num_params
    # transformers' Qwen3 attention norms each query and key head (q_norm, k_norm); Mixtral's does not
    assert model_from_hf_config(qwen, seq_length=4096).qk_layernorm
    assert not model_from_hf_config(mixtral, seq_length=4096).qk_layernorm
    ds = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
          "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
          "max_position_embeddings": 163840, "n_routed_experts": 256, "n_shared_experts": 1,
          "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "moe_layer_freq": 1,
          "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
          "v_head_dim": 128}
    got = model_from_hf_config(ds, seq_length=4096)
    assert (got.num_params, got.active_params) == (preset("deepseek-v3").num_params, preset("deepseek-v3").active_params)


def test_megatron_moe_flags():
    m = model_from_megatron_args(["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
                                  "--vocab-size", "1000", "--seq-length", "128", "--swiglu", "--num-experts", "8",
                                  "--moe-router-topk", "2", "--moe-ffn-hidden-size", "128",
                                  "--disable-bias-linear"])
    assert m.moe and m.num_experts == 8 and m.moe_ffn_hidden_size == 128
    assert m.num_params - m.active_params == 4 * 6 * 3 * 256 * 128   # six experts a token skips, per layer


def test_bad_moe_input_is_one_line():
    with pytest.raises(InputError, match=r"moe_router_topk: got 9; must be <= num_experts 8"):
        llama("x", 2, 256, 4, 4, 512, 1000, 128, num_experts=8, moe_router_topk=9)
    m = preset("mixtral-8x7b")
    with pytest.raises(InputError, match=r"expert_model_parallel_size: got 3; must divide num_experts 8"):
        ParallelPlan(dp=6, ep=3).check_model(m)
    with pytest.raises(InputError, match=r"ep x etp = 16 x 1 must divide"):
        ParallelPlan(dp=8, ep=16)
    with pytest.raises(InputError, match=r"has no experts"):
        ParallelPlan(dp=2, ep=2).check_model(preset("llama3-8b"))
    with pytest.raises(InputError, match=r"needs --sequence-parallel"):
        ParallelPlan(dp=2, tp=2, ep=2).check_model(m)


def test_zero3_with_experts_needs_the_experts_to_split_evenly_over_edp():
    # FSDP2 with EP: a rank's num_experts/ep experts are sharded over edp = dp / ep ranks
    m = llama("x", 2, 256, 4, 4, 512, 1000, 128, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=96)
    ParallelPlan(dp=8, ep=4, zero_stage=3).check_model(m)     # 2 experts over edp 2: one each
    ParallelPlan(dp=16, ep=2, zero_stage=3).check_model(m)    # 4 over 8: each expert's 96 rows in 2 halves
    ParallelPlan(dp=4, ep=4, zero_stage=3).check_model(m)     # edp 1: nothing sharded
    with pytest.raises(InputError, match=r"^plan: expert_model_parallel_size: got 2; ZeRO-3 shards each rank's 4 "
                                         r"experts .* over the 3 expert data-parallel ranks") as e:
        ParallelPlan(dp=6, ep=2, zero_stage=3).check_model(m)  # 4 experts over 3 ranks
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match=r"over the 20 expert data-parallel ranks .* expert width 96"):
        ParallelPlan(dp=40, ep=2, zero_stage=3).check_model(m)  # 4 over 20: 96 rows in 5 parts
    ParallelPlan(dp=6, ep=2, zero_stage=2).check_model(m)     # ZeRO-2 shards no parameters


def test_folding_groups_partition_the_stage_and_moved_keeps_them():
    plan = ParallelPlan(dp=4, tp=2, pp=2, ep=4, etp=1, sequence_parallel=True, placement="tp-dp-pp")
    f = Folding(plan)
    stage0 = [g for g in range(plan.world_size) if plan.coords(g)[1] == 0]
    for kind in ("ep_group", "etp_group", "edp_group"):
        groups = {getattr(f, kind)(g) for g in stage0}
        assert sorted(r for grp in groups for r in grp) == sorted(stage0)   # a partition
    assert f.ep_group(0) == (0, 1, 2, 3) and f.edp_group(0) == (0, 4) and f.etp_group(0) == (0,)
    kinds = ("ep_group", "etp_group", "edp_group")
    for g in range(plan.world_size):
        rep = plan.rank(pp=plan.coords(g)[1])
        assert f.moved(rep, g) == g
        images = sorted(f.moved(x, g) for x in range(plan.world_size))
        assert images == list(range(plan.world_size))                     # a bijection
        for kind in kinds + ("tp",):
            grp = plan.tp_group(rep) if kind == "tp" else getattr(f, kind)(rep)
            moved = tuple(sorted(f.moved(x, g) for x in grp))
            assert moved == (plan.tp_group(g) if kind == "tp" else getattr(f, kind)(g))


def test_balanced_routing_gives_every_rank_the_mean():
    m = preset("mixtral-8x7b")
    r = Routing(m, ParallelPlan(dp=8, ep=8, micro_batch_size=1))
    assert r.balanced and r.max_load(0, 0) == 4096 * 2
    assert r.stats([0], 2)["imbalance_max"] == pytest.approx(1.0)


def test_zipf_routing_is_seeded_and_skewed_and_capacity_drops():
    m = preset("mixtral-8x7b")
    plan = ParallelPlan(dp=8, ep=8, moe_routing="zipf:1.2", moe_seed=3)
    a, b = Routing(m, plan), Routing(m, plan)
    assert np.array_equal(a.rank_loads(5, 2), b.rank_loads(5, 2))
    assert a.rank_loads(5, 2).sum() == a.N == 8 * 4096 * 2
    assert a.max_load(5, 2) > a.N / 8
    other = Routing(m, ParallelPlan(dp=8, ep=8, moe_routing="zipf:1.2", moe_seed=4))
    assert not np.array_equal(a.rank_loads(5, 2), other.rank_loads(5, 2))
    capped = Routing(m, ParallelPlan(dp=8, ep=8, moe_routing="zipf:1.2", moe_seed=3, moe_capacity_factor=1.0))
    counts, dropped = capped.counts(5, 2)
    raw = capped.copies(5, 2)                             # each rank's copies per expert
    assert capped.capacity == 4096 * 2 / 8                # ⌈(T·k/E)·1.0⌉ of each rank's tokens
    assert raw.sum() == a.N and counts.max() <= 8 * capped.capacity
    assert dropped == int((raw - np.minimum(raw, capped.capacity)).sum()) > 0


def test_histogram_file_sets_the_loads_and_a_wrong_length_is_one_line(tmp_path):
    m = llama("tiny-moe", 2, 256, 4, 4, 512, 1000, 128, num_experts=4, moe_router_topk=1)
    path = tmp_path / "hist.json"
    path.write_text(json.dumps([1, 1, 1, 5]))
    r = Routing(m, ParallelPlan(dp=2, ep=2, moe_routing=str(path)))
    # 2 ranks × 128 tokens × top-1 = 256 tokens: experts get 32, 32, 32, 160; ranks 64 and 192
    assert list(r.rank_loads(0, 0)) == [64, 192] and r.max_load(0, 0) == 192
    path.write_text(json.dumps([1, 2, 3]))
    with pytest.raises(InputError, match=r"expected 4 numbers per row"):
        Routing(m, ParallelPlan(dp=2, ep=2, moe_routing=str(path)))
