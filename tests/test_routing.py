"""Routing draws (``sim.program.routing``): every token picks k distinct experts (a property
over any popularity, expert count, k, group limit and token count), capacity drops by
Megatron-Core's rule against a hand count, group-limited routing's dispatch bytes leaving a
node against a hand count, and its settings' bad input."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from _hypothesis_profiles import examples
from sim.errors import InputError
from sim.inputs.model import llama, preset
from sim.inputs.plan import ParallelPlan
from sim.program.routing import Routing, inclusion, systematic_cells


def _routing(E, k, tokens, ep, weights=None, groups=None, group_topk=None, routing="zipf:1", cf=None, seed=0):
    model = SimpleNamespace(num_experts=E, moe_router_topk=k, moe_router_num_groups=groups,
                            moe_router_group_topk=group_topk, seq_length=tokens, num_layers=1,
                            is_moe_layer=lambda i: True)
    plan = SimpleNamespace(ep=ep, micro_batch_size=1, cp=1, tp=1, sp=False, moe_routing=routing, moe_seed=seed,
                           moe_capacity_factor=cf)
    r = Routing(model, plan)
    if weights is not None:
        w = np.asarray(weights, dtype=float)
        r._popularity = lambda layer: w / w.sum()
    return r


@st.composite
def _cases(draw):
    ep = draw(st.sampled_from([1, 2, 4]))
    E = ep * draw(st.integers(1, 16))
    divisors = [g for g in range(1, E + 1) if E % g == 0]
    groups = draw(st.sampled_from(divisors))
    group_topk = draw(st.integers(1, groups))
    k = draw(st.integers(1, group_topk * (E // groups)))
    weights = draw(st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1e6)), min_size=E, max_size=E))
    if not any(weights):
        weights[0] = 1.0
    tokens = draw(st.integers(1, 20000))
    return E, k, tokens, ep, weights, (groups, group_topk) if groups > 1 else (None, None), draw(st.integers(0, 9))


@examples(60)
@given(_cases())
def test_every_token_picks_k_distinct_experts(case):
    E, k, tokens, ep, weights, (groups, group_topk), mb = case
    r = _routing(E, k, tokens, ep, weights, groups, group_topk)
    routed = r.copies(0, mb)                                        # per rank × expert
    assert routed.sum() == ep * tokens * k                          # every token k copies
    assert routed.max() <= tokens                                   # an expert gets a rank's token at most once
    counts, dropped = r.counts(0, mb)
    assert dropped == 0 and counts.sum() == r.N and counts.max() <= ep * tokens
    assert r.rank_loads(0, mb).max() / (r.N / ep) <= E / k + 1e-9  # busiest rank / mean <= E/k


@examples(40)
@given(st.lists(st.floats(0, 1e3), min_size=1, max_size=40), st.integers(1, 40))
def test_inclusion_chances_are_capped_and_sum_to_k(weights, k):
    w = np.array(weights)
    if not w.any() or k > len(w):
        return
    pi = inclusion(w, k)
    assert pi.sum() == pytest.approx(k) and pi.max() <= 1 + 1e-12 and pi.min() >= 0
    probs, sets = systematic_cells(pi, k)
    assert probs.sum() == pytest.approx(1) and all(len(set(s)) == k for s in sets)
    hit = np.zeros(len(w))
    np.add.at(hit, sets.ravel(), np.repeat(probs, k))
    assert hit == pytest.approx(pi, abs=1e-9)                       # systematic sampling keeps the chances


def test_a_seed_gives_the_same_draws_and_another_seed_others():
    a, b = _routing(16, 2, 4096, 4, routing="zipf:1.2", seed=3), _routing(16, 2, 4096, 4, routing="zipf:1.2", seed=3)
    other = _routing(16, 2, 4096, 4, routing="zipf:1.2", seed=4)
    assert np.array_equal(a.counts(0, 5)[0], b.counts(0, 5)[0])
    assert not np.array_equal(a.counts(0, 5)[0], other.counts(0, 5)[0])


def test_capacity_drops_each_ranks_copies_over_ceil_of_its_share(tmp_path):
    # E = 4, k = 2, 2 ranks of T = 256 tokens; popularity 1:1:2:4 makes each rank send 64, 64,
    # 128 and 256 copies. Capacity ⌈(T·k/E)·c⌉ = ⌈128·c⌉ per expert of each rank's tokens.
    hist = tmp_path / "router.json"
    hist.write_text(json.dumps([1, 1, 2, 4]))
    for cf, cap in ((1.0, 128), (1.1, 141), (1.5, 192), (2.0, 256)):
        r = _routing(4, 2, 256, 2, routing=str(hist), cf=cf)
        counts, dropped = r.counts(0, 0)
        assert r.capacity == cap
        per_rank = np.minimum([64, 64, 128, 256], cap)
        assert list(counts) == list(2 * per_rank)
        assert dropped == 2 * (256 - min(256, cap))
        s = r.stats([0], 1)
        assert s["dropped_tokens"] == dropped and s["dropped_fraction"] == pytest.approx(dropped / (2 * 256 * 2))


def test_group_limited_routing_keeps_a_tokens_copies_on_one_node_by_hand():
    # E = 8 experts on 4 ranks (2 each), ranks 0-1 on node 0 and 2-3 on node 1, k = 2, balanced.
    # Copies: half of a rank's T·k copies go to the other node, with groups or without (the
    # all-to-all dispatcher sends every copy). Once per node reached: G = 2, M = 1 sends a token
    # off its node only when it picked the other group (1/2); without groups a token misses the
    # other node only when both picks are on its own: C(4,2)/C(8,2) = 6/28, so it reaches it 22/28.
    T, h = 1000, 64
    nodes = [0, 0, 1, 1]
    grouped = _routing(8, 2, T, 4, groups=2, group_topk=1, routing="balanced")
    free = _routing(8, 2, T, 4, routing="balanced")
    assert grouped.leaving_node(0, nodes) == pytest.approx((T * 2 / 2, T / 2))
    assert free.leaving_node(0, nodes) == pytest.approx((T * 2 / 2, T * 22 / 28))
    s = grouped.stats([0], 1, nodes, token_bytes=2 * h)
    assert s["dispatch_cross_node_bytes"] == pytest.approx(T * 2 / 2 * 2 * h)
    assert s["dispatch_cross_node_bytes_dedup"] == pytest.approx(T / 2 * 2 * h)
    assert s["imbalance_max"] == 1.0 and s["router_num_groups"] == 2 and s["router_group_topk"] == 1
    # a drawn micro-batch: every token's two copies within the one group it picked
    skewed = _routing(8, 2, T, 4, groups=2, group_topk=1, routing="zipf:1")
    for mb in range(5):
        routed = skewed.copies(0, mb)
        for rank in range(4):
            per_group = routed[rank].reshape(2, 4).sum(axis=1)
            assert per_group.sum() == 2 * T and np.all(per_group % 2 == 0)


def test_group_settings_bad_input_is_one_line():
    def tiny(**kw):
        return llama("tiny-moe", 2, 256, 4, 4, 512, 1000, 128, num_experts=8, moe_router_topk=2, **kw)

    with pytest.raises(InputError, match=r"moe_router_group_topk: got 3; must be <= moe_router_num_groups 2"):
        tiny(moe_router_num_groups=2, moe_router_group_topk=3)
    with pytest.raises(InputError, match=r"moe_router_num_groups: got 3; must divide num_experts 8"):
        tiny(moe_router_num_groups=3, moe_router_group_topk=1)
    with pytest.raises(InputError, match=r"moe_router_group_topk: got 1; needs moe_router_num_groups"):
        tiny(moe_router_group_topk=1)
    with pytest.raises(InputError, match=r"at least moe_router_topk 2 experts"):
        llama("t", 2, 256, 4, 4, 512, 1000, 128, num_experts=8, moe_router_topk=2,
              moe_router_num_groups=8, moe_router_group_topk=1)


def test_cli_refuses_group_topk_above_the_groups_in_one_line(capsys):
    from sim.cli import main

    code = main(["run", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "8",
                 "--expert-model-parallel-size", "8", "--moe-router-num-groups", "2", "--moe-router-group-topk", "4"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.splitlines() == [err] and "moe_router_group_topk: got 4" in err, repr(err)


def test_deepseek_v3_routes_within_4_of_8_groups():
    m = preset("deepseek-v3")    # n_group 8, topk_group 4 (deepseek-ai/DeepSeek-V3 config.json)
    assert (m.moe_router_num_groups, m.moe_router_group_topk) == (8, 4)
    r = Routing(m, ParallelPlan(dp=64, ep=64, moe_routing="zipf:1.2"))
    routed = r.copies(3, 0)
    per_group = (routed > 0).reshape(64, 8, 32).any(axis=2).sum(axis=1)
    assert routed.sum() == r.N and math.isclose(r.rank_loads(3, 0).sum(), r.N)
    assert per_group.max() <= 8


def test_round_robin_routing_sends_a_token_to_consecutive_experts_by_hand():
    # AutoModel's fake balanced gate: token i takes experts k·i .. k·i+k-1 (mod E). E = 8 on 4 ranks
    # (2 each; ranks 0-1 on node 0, 2-3 on node 1), k = 2: token i's two experts are both on rank
    # i mod 4, so tokens 2, 3, 6, 7 (of T = 8) leave node 0: 4 tokens, 8 copies; once per node, 4.
    r = _routing(8, 2, 8, 4, routing="round-robin")
    mult, sets = r.round_robin_sets()
    assert sets.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]] and mult.tolist() == [2, 2, 2, 2]
    assert r.leaving_node(0, [0, 0, 1, 1]) == pytest.approx((8.0, 4.0))
    # every expert gets T·k/E copies from each of the 4 ranks: as balanced
    assert r.counts(0, 0)[0].tolist() == [8.0] * 8 and r.max_load(0, 0) == 16
    # balanced routing scatters the same copies: a token reaches the other node unless both of its
    # experts are on its own, 1 - C(4,2)/C(8,2) = 22/28 of the time
    assert _routing(8, 2, 8, 4, routing="balanced").leaving_node(0, [0, 0, 1, 1])[1] == pytest.approx(8 * 22 / 28)
    # the gate replaces the router: DeepSeek-V3's group limits do not apply to it
    assert _routing(8, 2, 8, 4, groups=2, group_topk=1, routing="round-robin").groups == 1
