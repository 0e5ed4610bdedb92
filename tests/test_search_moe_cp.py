"""search with mixtures of experts and long sequences: expert- and context-parallel sizes
are enumerated, and the pruning bound stays below the simulated time."""

import pytest

from sim.inputs.hardware import load_profile
from sim.inputs.model import llama
from sim.inputs.topology_build import load_topology
import math
from dataclasses import replace

from sim.inputs.plan import ParallelPlan
from sim.studies.search import (DEFAULT_MARGIN, SearchOptions, SearchSpace, candidates, enumerate_plans, extrapolate,
                                first_run_floor, plan_key, plan_margin, screen_sizes, screened_plans, search)
from sim.studies.sweep import Runner, make_context
from sim.inputs.schema import SimulationSettings
from sim.session import Job, simulate_training, summarize

H100 = load_profile("h100-sxm")
MOE = llama("tiny-moe", 4, 512, 8, 8, 1024, 2000, 512, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=512)
LONG = llama("tiny-long", 4, 512, 8, 2, 1024, 2000, 32768)
LONG_DENSE = llama("tiny-dense", 4, 512, 8, 8, 1024, 2000, 2048)


def test_every_valid_expert_parallel_size_is_enumerated():
    plans = enumerate_plans(MOE, 8, 8, SearchSpace(tp=(1, 2), pp=(1,), zero_stage=(1,), recompute=("none",)))
    by_fold = {}
    for p in plans:
        by_fold.setdefault((p.tp, p.etp_size), set()).add(p.ep)
        assert MOE.num_experts % p.ep == 0 and (p.tp * p.dp) % (p.ep * p.etp_size) == 0
        assert p.tp == 1 or p.sequence_parallel                      # Megatron's rule for MoE with tp
        assert p.etp is None or p.etp != p.tp                        # etp = tp is the plan's default
    # ep x etp must fold into tp x dp = 8; etp is 1 or tp
    assert by_fold == {(1, 1): {1, 2, 4, 8}, (2, 2): {1, 2, 4}, (2, 1): {1, 2, 4, 8}}


def test_the_dispatcher_is_a_dimension_where_it_applies():
    space = SearchSpace(tp=(1,), pp=(1,), zero_stage=(1,), recompute=("none",), micro_batch_size=(1,))
    plans = enumerate_plans(MOE, 8, 8, space)
    by_ep = {}
    for p in plans:
        by_ep.setdefault(p.ep, set()).add(p.dispatcher)
    assert by_ep == {1: {"alltoall"}, 2: {"alltoall", "allgather", "flex"}, 4: {"alltoall", "allgather", "flex"},
                     8: {"alltoall", "allgather", "flex"}}
    only = enumerate_plans(MOE, 8, 8, SearchSpace(**{**space.__dict__, "dispatcher": ("flex",)}))
    assert {(p.ep, p.dispatcher) for p in only} == {(2, "flex"), (4, "flex"), (8, "flex")}
    assert all("dispatcher=flex" in plan_key(p) for p in only)


def test_long_sequences_try_context_parallelism():
    plans = enumerate_plans(LONG, 8, 8, SearchSpace(tp=(1,), pp=(1,), zero_stage=(1,), recompute=("none",),
                                                    micro_batch_size=(1,)))
    assert {p.cp for p in plans} == {1, 2, 4, 8}
    assert all(p.dp * p.cp == 8 for p in plans)
    short = enumerate_plans(MOE, 8, 8, SearchSpace(tp=(1,), pp=(1,), zero_stage=(1,), recompute=("none",)))
    assert {p.cp for p in short} == {1}


def test_the_bound_never_exceeds_the_simulated_time_by_more_than_the_margin():
    topo = load_topology("dgx-h100")
    for model, space in ((MOE, SearchSpace(tp=(1,), pp=(1,), zero_stage=(1,), recompute=("none",),
                                           micro_batch_size=(1,))),
                         (LONG, SearchSpace(tp=(1,), pp=(1,), zero_stage=(1,), recompute=("none",),
                                            micro_batch_size=(1,), cp=(2, 4)))):
        for c in candidates(model, enumerate_plans(model, 8, 8, space), H100):
            simulated = simulate_training(Job(model, c.plan, H100, topo),
                                          SimulationSettings(fidelity="full")).trace.end_s
            assert c.bound_s / simulated <= DEFAULT_MARGIN, (c.key, c.bound_s, simulated)


def test_layers_that_do_not_divide_pp_get_the_balanced_split():
    odd = llama("tiny-moe-5", 5, 512, 8, 8, 1024, 2000, 512, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=512)
    space = SearchSpace(tp=(1,), zero_stage=(1,), recompute=("none",), micro_batch_size=(1,), ep=(2,))
    plans = enumerate_plans(odd, 8, 16, space)
    assert {p.pp for p in plans} == {1, 2, 4, 8} - {8}               # pp 8 > 5 layers: a stage would be empty
    uneven = [p for p in plans if p.pp > 1]
    assert uneven and all(p.layer_split == "auto" for p in uneven)
    # vpp for an uneven split: 2, 4, ... while pp x vpp <= 5 layers (and the interleaved rule m % pp == 0)
    assert {p.vpp for p in uneven if p.pp == 2} == {1, 2} and {p.vpp for p in uneven if p.pp == 4} == {1}
    for c in candidates(odd, uneven, H100):
        split = c.plan.layer_split
        assert isinstance(split, tuple) and sum(split) == 5 and len(split) in (c.plan.pp, c.plan.pp * c.plan.vpp)
        assert f"layer_split={split}" in c.key


def test_the_moe_bound_is_a_true_lower_bound_and_pruning_keeps_the_best():
    """Expert-parallel groups across two nodes (16 GPUs): every plan of the space simulated; the bound
    never exceeds the simulated time, so a search with margin 1 keeps the best plan and its runner-up."""
    from sim.studies.search import search
    from sim.studies.sweep import Runner, make_context

    topo = load_topology("dgx-h100", nodes=2)
    space = SearchSpace(tp=(1, 2), pp=(1, 2), zero_stage=(1,), recompute=("none",), micro_batch_size=(1,),
                        schedule=("1f1b",))
    # wide tokens, thin experts: the all-to-alls weigh as much as the compute (the case an estimate
    # that sent every byte over the network, or charged all-to-alls that hide under another
    # micro-batch's compute, put above the simulated time)
    model = llama("a2a-heavy", 3, 2048, 16, 16, 256, 1000, 2048, num_experts=16, moe_router_topk=8,
                  moe_ffn_hidden_size=64)
    cands = candidates(model, enumerate_plans(model, 16, 32, space), H100)
    assert {c.plan.ep for c in cands} >= {8, 16} and {c.plan.etp for c in cands} == {None, 1}
    assert {c.plan.dispatcher for c in cands if c.plan.ep > 1} == {"alltoall", "allgather", "flex"}
    assert {c.plan.dispatcher for c in cands if c.plan.ep == 1} == {"alltoall"}
    assert any(isinstance(c.plan.layer_split, tuple) for c in cands)      # pp 2 over 3 layers
    ctx = make_context(model, H100, topo)
    with Runner(0) as runner:
        full = search(cands, lambda plans: runner.run(ctx, plans), SearchOptions(margin=float("inf")))
        for c in full.candidates:
            if c.record is not None and c.record["status"] == "ok":
                assert c.bound_s <= c.record["summary"]["iteration_time_s"], c.key
        tight = search(cands, lambda plans: runner.run(ctx, plans), SearchOptions(margin=1.0, wave=2))
    assert tight.best["key"] == full.best["key"] and tight.ranked[1]["key"] == full.ranked[1]["key"]
    assert tight.counts["pruned_time"] > 0


def test_flex_with_one_rank_a_node_counts_each_inter_node_exchange():
    """flex with the expert-parallel group one rank a node (tp = etp = 8 over two nodes): no
    intra-node exchange runs beside the inter-node ones, so the dispatch's and the combine's each
    take their own time. The estimate and the bound's least time count both (not only the
    last), and the bound stays below the simulated time."""
    from sim.program.api import group_comm_time, moe_layer_groups
    from sim.studies.search import _ep_times

    topo = load_topology("dgx-h100", nodes=2)
    model = llama("a2a-heavy", 3, 2048, 16, 16, 256, 1000, 2048, num_experts=16, moe_router_topk=8,
                  moe_ffn_hidden_size=64)
    plan = ParallelPlan(dp=2, tp=8, pp=1, ep=2, dispatcher="flex", sequence_parallel=True, micro_batch_size=1,
                        global_batch_size=32, zero_stage=1)
    work, sizes, link = moe_layer_groups(model, plan, 8, True)
    assert (sizes["ep_rail"], sizes["ep_node"], link["ep_rail"]) == (2, 1, "ib")
    least = _ep_times(model, plan, H100, 8)
    for ph in ("F", "B"):
        rails = [group_comm_time(c, 2, "ib", H100) for c in work.comms(ph) if c.group == "ep_rail"]
        assert len(rails) == 2 and min(rails) > 0                # the dispatch and the combine (or their gradients)
        assert least[ph][1] == pytest.approx(sum(rails), rel=1e-12)
        assert least[ph][0] == pytest.approx(sum(rails), rel=1e-12)  # the estimate prices each too
    run = simulate_training(Job(model, plan, H100, topo), SimulationSettings(fidelity="full"))
    exchanges = [s.end_s - s.start_s for s in run.trace.spans if s.rank == 0 and s.category == "ep"]
    per_layer = (least["F"][1] + least["B"][1]) * plan.num_microbatches
    moe_layers = sum(map(model.is_moe_layer, range(model.num_layers)))
    assert sum(exchanges) >= moe_layers * per_layer * (1 - 1e-9)   # each ran at least its least time
    (c,) = candidates(model, [plan], H100)
    assert c.bound_s <= run.trace.end_s, (c.bound_s, run.trace.end_s)


def test_the_moe_bound_stays_a_lower_bound_with_the_all_to_all_overlap():
    """With --overlap-moe-expert-parallel-comm the slowest rank's all-to-alls may hide under another
    micro-batch's compute: the bound leaves them out, and stays at or below the simulated time."""
    from dataclasses import replace

    topo = load_topology("dgx-h100", nodes=2)
    model = llama("a2a-heavy-4", 4, 2048, 16, 16, 256, 1000, 2048, num_experts=16, moe_router_topk=8,
                  moe_ffn_hidden_size=64)
    space = SearchSpace(tp=(1,), pp=(1, 2), zero_stage=(1,), recompute=("none",), micro_batch_size=(1,),
                        schedule=("1f1b", "interleaved"))
    plans = [replace(p, overlap_moe_expert_parallel_comm=True) for p in enumerate_plans(model, 16, 32, space)
             if p.ep > 1 and (p.pp == 1 or p.schedule == "interleaved") and p.dispatcher != "allgather"]
    cands = candidates(model, plans, H100)
    assert {(c.plan.pp, c.plan.vpp) for c in cands} == {(1, 1), (2, 2)} and len({c.plan.ep for c in cands}) >= 3
    for c in cands:
        simulated = simulate_training(Job(model, c.plan, H100, topo), SimulationSettings(fidelity="full")).trace.end_s
        assert c.bound_s <= simulated, (c.key, c.bound_s, simulated)


def test_a_screened_time_is_the_full_simulation_extrapolated():
    # A mixture of experts over two nodes (expert all-to-alls across the network) with
    # pp = 2 under 1f1b, interleaving and zb-h1, and a dense model with ZeRO-3 (its
    # gathers run per micro-batch): 24 micro-batches, screened at pp·(vpp + 1) and 2·pp more.
    topo = load_topology("dgx-h100", nodes=2)
    cases = [ParallelPlan(dp=8, tp=1, pp=2, ep=8, micro_batch_size=1, global_batch_size=192, schedule=s, vpp=v,
                          zero_stage=1) for s, v in (("1f1b", 1), ("interleaved", 2), ("zb-h1", 1))]
    cases.append(ParallelPlan(dp=8, tp=1, pp=2, micro_batch_size=1, global_batch_size=192, zero_stage=3))
    for plan, sizes in zip(cases, [(4, 8), (6, 10), (4, 8), (4, 8)]):
        model = MOE if plan.ep > 1 else LONG_DENSE
        assert screen_sizes(plan) == sizes and plan.num_microbatches == 24

        def run(p):
            s = summarize(simulate_training(Job(model, p, H100, topo), SimulationSettings(fidelity="reduced")))
            return {"status": "ok", "summary": s}
        small = [run(p) for p in screened_plans(plan, sizes)]
        assert [r["summary"]["plan"]["global_batch_size"] for r in small] == [8 * m for m in sizes]
        rec = extrapolate(plan, sizes, small)
        full = run(plan)["summary"]
        assert rec["status"] == "screened" and rec["summary"]["fits"] == full["fits"]
        assert abs(rec["summary"]["iteration_time_s"] / full["iteration_time_s"] - 1) < 1e-3, plan
        assert full["memory"]["peak_bytes"] == small[1]["summary"]["memory"]["peak_bytes"]
    assert screen_sizes(replace(cases[0], schedule="gpipe")) is None       # gpipe's memory grows with m
    assert screen_sizes(replace(cases[0], global_batch_size=96)) is None   # 12 = 4 + 8 micro-batches: no saving


def test_a_screened_search_ranks_what_a_full_one_ranks():
    # Every plan either way (margin inf): screening changes how long the search takes, not
    # its answer; the plans it lists are simulated in full.
    model, space = MOE, SearchSpace(tp=(1,), pp=(1, 2), zero_stage=(1,), recompute=("none",), micro_batch_size=(1,),
                                    dispatcher=("alltoall",), ep=(4, 8), schedule=("1f1b", "interleaved"))
    cands = candidates(model, enumerate_plans(model, 16, 128, space), H100)
    ctx = make_context(model, H100, load_topology("dgx-h100", nodes=2))
    with Runner(workers=0, progress=False) as runner:
        full = search(cands, lambda ps: runner.run(ctx, ps), SearchOptions(margin=math.inf))
        screened = search(cands, lambda ps: runner.run(ctx, ps), SearchOptions(margin=math.inf, screen=True, final=2))
        # pruned at the default margin (1: the bound of a mixture of experts is a true lower bound),
        # screened plans cut on their first run where its floor passes the second best
        pruned = search(cands, lambda ps: runner.run(ctx, ps), SearchOptions(screen=True, final=2, wave=2))
        floors = {c.key: (first_run_floor(c, screen_sizes(c.plan), runner.run(ctx, screened_plans(
            c.plan, screen_sizes(c.plan)))[0], plan_margin(c, None))) for c in cands if screen_sizes(c.plan)}
        done = dict(runner.log.done)
    # the command's way: the screening runs' records hold only what the search reads of them
    # (a runner of its own, which has simulated nothing yet)
    with Runner(workers=0, progress=False) as own:
        light = search(cands, lambda ps, screening=(): own.run(ctx, ps, screening=screening),
                       SearchOptions(margin=math.inf, screen=True, final=2), screening_records=True)
        marked = {k: r for k, r in own.log.done.items() if r["summary"].get("screening")}
    assert [(c.key, c.status, c.record["summary"]["iteration_time_s"]) for c in light.candidates] == \
        [(c.key, c.status, c.record["summary"]["iteration_time_s"]) for c in screened.candidates]
    assert light.ranked == screened.ranked
    assert len(marked) == 2 * sum(1 for c in cands if screen_sizes(c.plan))   # (margin inf: every screening ran twice)
    for k, r in marked.items():  # the same time, fit and peak as the full summary's, and nothing else it costs
        full_summary = done[k]["summary"]
        assert (r["summary"]["iteration_time_s"], r["summary"]["fits"], r["summary"]["memory"]["peak_bytes"]) == \
            (full_summary["iteration_time_s"], full_summary["fits"], full_summary["memory"]["peak_bytes"])
        assert "energy_per_iteration_j" not in r["summary"] and "exposed_comm_s" not in r["summary"]
    assert all(c.lower_bound and plan_margin(c, None) == 1.0 and plan_margin(c, 1.1) == 1.1 for c in cands)
    assert [r["key"] for r in pruned.ranked[:2]] == [r["key"] for r in full.ranked[:2]]
    assert pruned.counts["simulations"] <= screened.counts["simulations"]
    for c in screened.candidates:  # the floor from a first run never exceeds the extrapolated time
        if c.status == "screened":
            assert floors[c.key] <= c.record["summary"]["iteration_time_s"], c.key
    assert full.counts["ok"] == len(cands) == 6
    assert [r["key"] for r in screened.ranked[:2]] == [r["key"] for r in full.ranked[:2]]
    # pp 1 (8 micro-batches) and pp 2 under 1f1b (16) are screened, interleaved (16 <= 6 + 10) is not;
    # of the screened, those among the best two are simulated again in full
    screenable = {c.key for c in cands if screen_sizes(c.plan)}
    assert len(screenable) == 4
    assert screened.counts["screened"] == len(screenable - {r["key"] for r in full.ranked[:2]})
    assert screened.ranked[:2] == full.ranked[:2]   # the same records: simulated in full
    by_key = {c.key: c.record["summary"]["iteration_time_s"] for c in full.candidates}
    for c in screened.candidates:
        assert abs(c.record["summary"]["iteration_time_s"] / by_key[c.key] - 1) < 2e-3


@pytest.mark.parametrize("seed", range(6))
def test_a_first_screening_run_prunes_without_losing_the_best_two(seed):
    # A simulator that keeps what pruning rests on, at random: each plan's time at m
    # micro-batches is T(m) = bound·f + (m - M)·slope·g, f >= 1 (never below the bound at its
    # own M) and 1 <= g <= f (a steady period never below the bound's growth per micro-batch;
    # T(a) > 0). Plans whose first run's floor passes the second best lose their second run,
    # and the best two are those of the exhaustive ranking.
    import random
    import re

    rng = random.Random(seed)
    model, space = MOE, SearchSpace(tp=(1, 2), pp=(1, 2), zero_stage=(1,), recompute=("none",),
                                    micro_batch_size=(1,), ep=(2, 4, 8), schedule=("1f1b",))
    cands = candidates(model, enumerate_plans(model, 16, 256, space), H100)
    assert all(c.lower_bound and c.slope_s > 0 for c in cands)
    by_key = {re.sub(r"-gbs\d+", "", c.key): c for c in cands}
    fg = {c.key: (f := rng.uniform(1.0, 1.5), rng.uniform(1.0, f)) for c in cands}
    ran = []

    def time_at(c, m):
        f, g = fg[c.key]
        return c.bound_s * f + (m - c.plan.num_microbatches) * c.slope_s * g

    def simulate(plans):
        ran.extend(plan_key(p) for p in plans)
        return [{"key": plan_key(p), "plan": {}, "status": "ok",
                 "summary": {"iteration_time_s": time_at(by_key[re.sub(r"-gbs\d+", "", plan_key(p))],
                                                         p.num_microbatches), "fits": True}} for p in plans]

    res = search(cands, simulate, SearchOptions(screen=True, final=2, wave=4))
    truth = sorted((c for c in cands if c.estimate.fits), key=lambda c: (time_at(c, c.plan.num_microbatches), c.key))
    assert [r["key"] for r in res.ranked[:2]] == [c.key for c in truth[:2]]
    cut = [c for c in res.candidates if c.status == "pruned: time" and screen_sizes(c.plan)
           and plan_key(screened_plans(c.plan, screen_sizes(c.plan))[0]) in ran]
    assert cut, "no plan was ruled out by its first screening run"
    for c in cut:  # rightly: its floor passes the second best, and the floor is below its time
        sizes = screen_sizes(c.plan)
        first = {"summary": {"iteration_time_s": time_at(c, sizes[0])}}
        floor = first_run_floor(c, sizes, first, 1.0)
        assert time_at(truth[1], truth[1].plan.num_microbatches) < floor <= time_at(c, c.plan.num_microbatches)
