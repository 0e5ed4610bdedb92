"""ParallelPlan: rank placement (coords, ranks, groups), schedule rules, Megatron-LM's
uneven layer split, and the one-line error of every invalid combination."""

import itertools

import numpy as np
import pytest

from sim.errors import InputError
from sim.inputs.model import llama, preset
from sim.inputs.plan import DDP_BUCKET_BYTES, ParallelPlan
from sim.program.workload import chunk_work

PERMS = ["-".join(p) for p in itertools.permutations(("tp", "pp", "dp"))]


def one_line(fn, *words):
    with pytest.raises(InputError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


def model(num_layers, name="m"):
    # heads, kv heads and ffn divisible by 8 so any tp <= 8 fits
    return llama(name, num_layers, 256, 8, 8, 512, 1000, 64)


# ------------------------------------------------------------------- placement
@pytest.mark.parametrize("placement", PERMS)
def test_coords_and_rank_are_a_bijection_matching_a_row_major_grid(placement):
    plan = ParallelPlan(dp=4, tp=2, pp=3, placement=placement)
    order = placement.split("-")                                   # innermost first
    sizes = {"tp": 2, "pp": 3, "dp": 4}
    # Independent layout: numpy's row-major grid with the outermost dimension first.
    grid = np.arange(24).reshape([sizes[d] for d in reversed(order)])
    seen = set()
    for r in range(24):
        dp, pp, tp = plan.coords(r)
        idx = {"dp": dp, "pp": pp, "tp": tp}
        assert grid[tuple(idx[d] for d in reversed(order))] == r
        assert plan.rank(dp=dp, pp=pp, tp=tp) == r
        seen.add((dp, pp, tp))
    assert seen == set(itertools.product(range(4), range(3), range(2)))


@pytest.mark.parametrize("placement", PERMS)
def test_groups_partition_the_world_and_vary_one_index(placement):
    plan = ParallelPlan(dp=4, tp=2, pp=3, placement=placement)
    for dim, size, axis in (("tp", 2, 2), ("pp", 3, 1), ("dp", 4, 0)):
        groups = plan.groups(dim)
        assert len(groups) == 24 // size
        assert sorted(r for g in groups for r in g) == list(range(24))
        for g in groups:
            assert len(g) == size
            cs = [plan.coords(r) for r in g]
            assert [c[axis] for c in cs] == list(range(size))        # sorted by that index
            others = {tuple(c[i] for i in range(3) if i != axis) for c in cs}
            assert len(others) == 1                                  # everything else shared
        for r in range(24):
            assert r in getattr(plan, f"{dim}_group")(r)
            assert getattr(plan, f"{dim}_group")(r) in groups


def test_sixteen_gpus_by_hand():
    # tp=2, pp=4, dp=2. tp-pp-dp: rank = tp + 2·pp + 8·dp.
    a = ParallelPlan(dp=2, tp=2, pp=4, placement="tp-pp-dp")
    assert a.groups("tp") == ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15))
    assert a.groups("pp") == ((0, 2, 4, 6), (1, 3, 5, 7), (8, 10, 12, 14), (9, 11, 13, 15))
    assert a.groups("dp") == ((0, 8), (1, 9), (2, 10), (3, 11), (4, 12), (5, 13), (6, 14), (7, 15))
    assert a.coords(13) == (1, 2, 1) and a.rank(dp=1, pp=2, tp=1) == 13
    assert a.pp_group(13) == (9, 11, 13, 15) and a.dp_group(13) == (5, 13) and a.tp_group(13) == (12, 13)
    # tp-dp-pp (Megatron-LM's order): rank = tp + 2·dp + 4·pp.
    b = ParallelPlan(dp=2, tp=2, pp=4, placement="tp-dp-pp")
    assert b.groups("tp") == a.groups("tp")
    assert b.groups("dp") == ((0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15))
    assert b.groups("pp") == ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15))
    assert b.coords(13) == (0, 3, 1) and b.rank(dp=0, pp=3, tp=1) == 13
    assert b.pp_group(13) == (1, 5, 9, 13) and b.dp_group(13) == (13, 15)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("pp,dp", [(1, 2), (4, 2), (3, 5)])
def test_default_placement_keeps_tp_inside_8_gpu_nodes(tp, pp, dp):
    plan = ParallelPlan(dp=dp, tp=tp, pp=pp)
    assert plan.placement == "tp-pp-dp"
    for g in plan.groups("tp"):
        assert len({r // 8 for r in g}) == 1, g
    assert plan.max_nodes_spanned("tp", 8) == 1


def test_tp_crosses_nodes_when_larger_than_a_node_or_not_innermost():
    assert ParallelPlan(tp=16).max_nodes_spanned("tp", 8) == 2
    assert ParallelPlan(dp=2, tp=8, placement="dp-tp-pp").max_nodes_spanned("tp", 8) == 2
    # tp=4, pp=2, dp=2: tp-pp-dp keeps pp inside a node, sends dp over IB; tp-dp-pp the other way.
    assert ParallelPlan(dp=2, tp=4, pp=2).max_nodes_spanned("pp", 8) == 1
    assert ParallelPlan(dp=2, tp=4, pp=2).max_nodes_spanned("dp", 8) == 2
    assert ParallelPlan(dp=2, tp=4, pp=2, placement="tp-dp-pp").max_nodes_spanned("dp", 8) == 1
    assert ParallelPlan(dp=2, tp=4, pp=2, placement="tp-dp-pp").max_nodes_spanned("pp", 8) == 2


# ------------------------------------------------------------------ layer split
def test_even_split_and_megatron_interleaved_ranges():
    plan = ParallelPlan(pp=2, vpp=2, global_batch_size=4)
    m = model(8)
    assert plan.stage_layers(m) == (2, 2, 2, 2)
    assert plan.layers_per_chunk(m) == 2
    # Megatron's comment: 8 layers, 2 stages, 2 chunks -> stage 0: [0, 1] [4, 5]; stage 1: [2, 3] [6, 7]
    assert [list(plan.layer_range(m, v)) for v in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert plan.layer_range(m, 2) == range(4, 6)       # chunk 1 of stage 0


def test_llama3_405b_split_accounts_for_embedding_and_loss():
    # Llama 3 (§3.3.2): 126 layers on 16 stages, the first and last one layer short.
    plan = ParallelPlan(pp=16, account_for_embedding=True, account_for_loss=True)
    m = model(126)
    layers = plan.stage_layers(m)
    assert layers == (7,) + (8,) * 14 + (7,)
    assert sum(layers) == 126
    assert plan.layer_range(m, 0) == range(0, 7) and plan.layer_range(m, 15) == range(119, 126)
    one_line(lambda: plan.layers_per_chunk(m), "uneven", "stage_layers")
    # only the embedding counted: 127 "layers" do not split over 16, 31 + 1 = 32 over 4 does
    assert ParallelPlan(pp=4, account_for_embedding=True).stage_layers(model(31)) == (7, 8, 8, 8)
    assert ParallelPlan(pp=4, account_for_loss=True).stage_layers(model(31)) == (8, 8, 8, 7)


def test_account_for_with_interleaving_is_per_virtual_stage():
    # 126 + 2 = 128 over pp·vpp = 8·2 = 16 virtual stages: 8 each, first and last virtual one fewer.
    plan = ParallelPlan(pp=8, vpp=2, global_batch_size=8, account_for_embedding=True, account_for_loss=True)
    m = model(126)
    assert plan.stage_layers(m) == (7,) + (8,) * 14 + (7,)
    # pipeline rank 0 holds virtual stages 0 and 8: layers 0..6 and 63..70
    assert plan.layer_range(m, 8) == range(63, 71)


def test_first_and_last_stage_layers():
    m = model(30)
    assert ParallelPlan(pp=4, first_stage_layers=6, last_stage_layers=6).stage_layers(m) == (6, 9, 9, 6)
    assert ParallelPlan(pp=4, first_stage_layers=5).stage_layers(model(32)) == (5, 9, 9, 9)
    assert ParallelPlan(pp=4, last_stage_layers=2).stage_layers(model(32)) == (10, 10, 10, 2)
    assert ParallelPlan(pp=2, first_stage_layers=10, last_stage_layers=22).stage_layers(model(32)) == (10, 22)
    # vpp = 3: each rank's layers split evenly over its chunks; index chunk·pp + rank
    plan = ParallelPlan(pp=4, vpp=3, global_batch_size=4, first_stage_layers=6, last_stage_layers=6)
    assert plan.stage_layers(m) == (2, 3, 3, 2) * 3
    assert plan.layer_range(m, 4) == range(10, 12)        # chunk 1 of rank 0
    for p in (plan, ParallelPlan(pp=4, first_stage_layers=5)):
        mm = m if p.vpp == 3 else model(32)
        assert sum(p.stage_layers(mm)) == mm.num_layers
        ranges = [p.layer_range(mm, v) for v in range(p.num_virtual_stages)]
        assert [i for r in ranges for i in r] == list(range(mm.num_layers))


def test_embedding_and_head_only_on_first_and_last_virtual_stage():
    m = preset("llama3-8b")                                 # 32 layers
    for plan in (ParallelPlan(pp=4, first_stage_layers=5),
                 ParallelPlan(pp=2, account_for_embedding=True, account_for_loss=True, global_batch_size=2),
                 ParallelPlan(pp=2, vpp=2, global_batch_size=4, last_stage_layers=12)):
        n = plan.num_virtual_stages
        layers = plan.stage_layers(m)
        for v in range(n):
            names = [w.name for w in chunk_work(m, plan, v)]
            assert names.count("layer") == layers[v]
            assert ("embedding" in names) == (v == 0) and ("head" in names) == (v == n - 1)
            if v == 0:
                assert names[0] == "embedding"
            if v == n - 1:
                assert names[-1] == "head"
        assert sum(layers) == 32


# -------------------------------------------------------------------- schedule
def test_schedule_defaults_and_fields():
    assert ParallelPlan().schedule == "1f1b"
    assert ParallelPlan(pp=4, vpp=2, global_batch_size=8).schedule == "interleaved"
    for s in ("gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved", "custom"):
        assert ParallelPlan(schedule=s).schedule == s        # pp = 1: any schedule degenerates
        assert ParallelPlan(pp=4, schedule=s, global_batch_size=4, vpp=2 if s == "interleaved" else 1)
    assert ParallelPlan(pp=4, vpp=2, schedule="custom", global_batch_size=3).vpp == 2
    p = ParallelPlan()
    assert p.dp_overlap is True and p.bucket_size_bytes is None and DDP_BUCKET_BYTES == 25 * 1024 * 1024  # (the framework's)


@pytest.mark.parametrize("kw,words", [
    (dict(schedule="pipedream"), ["plan: schedule", "pipedream", "gpipe", "zb-h2"]),
    (dict(pp=4, schedule="interleaved", global_batch_size=4), ["plan: schedule", "interleaved", "vpp > 1"]),
    (dict(pp=4, vpp=2, schedule="1f1b", global_batch_size=8), ["plan: vpp", "2", "'1f1b'", "interleaved"]),
    (dict(pp=4, vpp=2, schedule="gpipe", global_batch_size=8), ["plan: vpp", "'gpipe'"]),
    (dict(pp=4, vpp=2, schedule="zb-h1", global_batch_size=8), ["plan: vpp", "'zb-h1'"]),
    (dict(pp=4, vpp=2, global_batch_size=6), ["global_batch_size", "6", "multiple of pp = 4"]),
    (dict(vpp=2), ["plan: vpp", "pp > 1"]),
    (dict(bucket_size_bytes=0), ["plan: bucket_size_bytes", "0", "> 0"]),
    (dict(dp_overlap="yes"), ["plan: dp_overlap", "yes"]),
    (dict(placement="tp-tp-dp"), ["plan: placement", "tp-tp-dp", "tp-pp-dp"]),
    (dict(placement="tp,pp,dp"), ["plan: placement"]),
    (dict(pp=4, first_stage_layers=0), ["--decoder-first-pipeline-num-layers", "got 0", "> 0"]),
    (dict(first_stage_layers=4), ["--decoder-first-pipeline-num-layers", "4", "pp > 1"]),
    (dict(pp=2, vpp=2, global_batch_size=2, last_stage_layers=3),
     ["--decoder-last-pipeline-num-layers", "3", "multiple of vpp = 2"]),
    (dict(pp=4, first_stage_layers=4, account_for_embedding=True),
     ["--decoder-first-pipeline-num-layers", "cannot be combined", "account_for_embedding"]),
    (dict(account_for_loss=1), ["plan: account_for_loss", "true or false"]),
])
def test_invalid_plans_give_one_line_naming_the_factor(kw, words):
    one_line(lambda: ParallelPlan(**kw), *words)


@pytest.mark.parametrize("kw,layers,words", [
    (dict(pp=5), 32, ["plan: pp x vpp", "5 x 1", "num_layers 32", "2, 4, 8, 16, 32 would",
                       "--decoder-first-pipeline-num-layers", "--account-for-loss-in-pipeline-split"]),
    (dict(pp=4, first_stage_layers=6), 32,
     ["--decoder-first-pipeline-num-layers", "got 6", "remaining 26", "3 middle", "2, 5, 8, 11 would divide"]),
    (dict(pp=4, last_stage_layers=6, first_stage_layers=3), 32,
     ["--decoder-first-pipeline-num-layers", "remaining 23", "2 middle", "would divide"]),
    (dict(pp=4, first_stage_layers=20, last_stage_layers=20), 32, ["20 + 20 exceed num_layers 32"]),
    (dict(pp=2, first_stage_layers=10, last_stage_layers=20), 32, ["no middle stages", "add up to num_layers 32"]),
    (dict(pp=4, vpp=2, global_batch_size=4, first_stage_layers=4), 32,
     ["remaining 28", "x vpp 2 chunks", "multiple of 6"]),
    (dict(pp=16, account_for_embedding=True), 126,
     ["--account-for-embedding-in-pipeline-split", "126 + 1 = 127", "multiple of pp x vpp = 16 x 1 = 16",
      "127 would divide"]),
    (dict(pp=12, account_for_embedding=True, account_for_loss=True), 126,
     ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split", "128",
      "2, 4, 8, 16, 32, 64, 128 would divide"]),
])
def test_impossible_splits_name_the_flag_and_what_would_divide(kw, layers, words):
    plan = ParallelPlan(**kw)
    m = model(layers)
    one_line(lambda: plan.check_model(m), *words)
    one_line(lambda: plan.stage_layers(m), *words)


def test_rank_and_coords_out_of_range():
    plan = ParallelPlan(dp=2, tp=2, pp=2)
    one_line(lambda: plan.coords(8), "rank", "8", "0..7")
    one_line(lambda: plan.rank(tp=2), "tp", "2", "0..1")
    one_line(lambda: plan.layer_range(model(8), 2), "virtual_stage", "0..1")


def test_model_checks_name_tp_and_the_dimension_it_cuts():
    # tp must split the heads, the kv heads and the MLP (Megatron's column/row split)
    m = llama("m", 8, 256, 8, 2, 512, 1000, 64)       # 8 heads, 2 kv heads, ffn 512
    one_line(lambda: ParallelPlan(tp=3).check_model(m), "plan: tp", "3", "num_attention_heads 8")
    one_line(lambda: ParallelPlan(tp=4).check_model(m), "plan: tp", "4", "num_key_value_heads 2")
    ParallelPlan(tp=2).check_model(m)
    # dp x tp x pp must fill the GPUs: each factor named
    one_line(lambda: ParallelPlan.for_world(96, tp=8, pp=5), "world_size", "96", "tp x pp = 8 x 5 = 40")
    assert ParallelPlan.for_world(64, tp=8, pp=4).dp == 2


def test_a_huge_layer_count_that_pp_does_not_divide_is_refused_at_once():
    # Found by `make fuzz` (--num-layers 99999999999): the message lists the divisors that
    # would work, and finding them used to try every number up to the layer count.
    from dataclasses import replace

    from sim.inputs.plan import split_layers

    n = 99_999_999_999  # = 3^2 x 21649 x 513239
    with pytest.raises(InputError, match=r"3, 9, 21649, 64947, 194841, 513239, 1539717, 4619151") as e:
        split_layers(n, replace(ParallelPlan().sections.pipeline, pp=4))
    assert "\n" not in str(e.value)
    # every number listed divides n, and none in between is missed
    from sim.inputs.layer_split import divisors_text as _divisors

    for m in (36, 97, 1000, 2**20, 720720):
        listed = [int(x) for x in _divisors(m).split(", ")]
        assert listed == [d for d in range(2, m + 1) if m % d == 0][:8]
