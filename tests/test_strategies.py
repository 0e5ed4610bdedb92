"""Strategies as objects (sim.inputs.strategies): each registry's behaviour checked against
what the rest of the simulator builds or the papers define, and the plan resolving its fields."""

from dataclasses import replace

import pytest

from sim.errors import InputError
from sim.inputs import strategies as st
from sim.inputs.plan import ATTENTION, RECOMPUTE, SCHEDULES, ZERO_STAGES, ParallelPlan
from sim.inputs.experts import DISPATCHERS
from sim.program.schedules import SCHEDULES as BUILT, build_schedule, in_flight


def test_the_plan_offers_exactly_the_registries_names():
    assert SCHEDULES == tuple(st.PIPELINE_SCHEDULES) and set(BUILT) | {"custom"} == set(SCHEDULES)
    assert DISPATCHERS == ("alltoall", "allgather", "flex")
    assert ATTENTION == ("flash", "unfused") and RECOMPUTE == ("none", "selective", "full")
    assert ZERO_STAGES == (0, 1, 2, 3)


@pytest.mark.parametrize("name", [n for n in BUILT if st.PIPELINE_SCHEDULES[n].one_chunk])
def test_one_chunk_schedules_split_and_hold_what_their_steps_say(name):
    """``split_backward`` and ``held_one_chunk`` against the steps ``sim.program.schedules``
    builds: a W step exists exactly when the backward is split, and each rank's peak of
    micro-batches in flight is the strategy's (1F1B p − r, ZB-H1 p, ZB-H2 2p − 1, GPipe m)."""
    p, m = 4, 16
    sched, strategy = build_schedule(name, p, m), st.PIPELINE_SCHEDULES[name]
    kinds = {step.kind for row in sched.ranks for step in row}
    assert ("W" in kinds) == strategy.split_backward
    assert strategy.one_chunk and not strategy.interleaved and not strategy.from_file
    assert in_flight(sched) == tuple(strategy.held_one_chunk(p, r, m) for r in range(p))


def test_looped_bfs_holds_what_its_steps_say_on_every_chunk():
    """The strategy's "m" (every forward before any backward), on each of the v chunks, against
    the steps ``sim.program.schedules.looped_bfs`` builds; one more schedule is one registry entry
    and its builder."""
    p, v, m = 4, 3, 8
    strategy = st.PIPELINE_SCHEDULES["looped-bfs"]
    assert not strategy.one_chunk and not strategy.interleaved and not strategy.from_file
    assert not strategy.split_backward and not strategy.periodic
    assert in_flight(build_schedule("looped-bfs", p, m, vpp=v)) == tuple(
        v * strategy.held_one_chunk(p, r, m) for r in range(p))
    plan = ParallelPlan(dp=1, pp=p, vpp=v, global_batch_size=m, schedule="looped-bfs")
    assert plan.pipeline is strategy and plan.vpp == v


def test_interleaved_and_custom_are_not_one_chunk():
    assert st.PIPELINE_SCHEDULES["interleaved"].interleaved and not st.PIPELINE_SCHEDULES["interleaved"].one_chunk
    assert st.PIPELINE_SCHEDULES["custom"].from_file and not st.PIPELINE_SCHEDULES["custom"].periodic


def test_each_dispatcher_exchanges_one_way():
    for d in st.TOKEN_DISPATCHERS.values():
        assert [d.gathers, d.deepep, d.exchanges_all_to_all].count(True) == 1
        assert d.needs_ep == (d.name != "alltoall")  # with ep 1 only alltoall (no exchange) applies
        assert d.overlappable == (d.name in ("alltoall", "flex"))  # Megatron-Core's TransformerConfig rule


def test_zero_stages_shard_as_the_zero_paper_says():
    """Rajbhandari et al. 2020: P_os (1), P_os+g (2), P_os+g+p (3)."""
    got = {s: (z.shards_optimizer, z.shards_grads, z.shards_params) for s, z in st.ZERO.items()}
    assert got == {0: (False, False, False), 1: (True, False, False), 2: (True, True, False), 3: (True, True, True)}
    assert [s for s, z in st.ZERO.items() if z.gathers_after_step] == [1, 2]
    assert [s for s, z in st.ZERO.items() if z.reduce_scatters_each_backward] == [2]


def test_the_plan_resolves_its_fields_once_to_the_registry_entries():
    plan = ParallelPlan(dp=2, pp=2, vpp=2, global_batch_size=8, recompute="full", zero_stage=2, attention="unfused")
    assert plan.pipeline is st.PIPELINE_SCHEDULES["interleaved"]
    assert plan.token_dispatcher is st.TOKEN_DISPATCHERS["alltoall"]
    assert plan.recompute_policy.whole_layer and not plan.recompute_policy.by_module
    assert not plan.attention_mode.fused
    assert plan.zero is st.ZERO[2]


def test_a_name_outside_a_registry_is_one_line_naming_the_field():
    with pytest.raises(InputError, match=r"^plan: moe_token_dispatcher_type: got 'deepep-ll'; allowed: "
                                         r"alltoall, allgather, flex$"):
        st.dispatcher_named("deepep-ll")
    with pytest.raises(InputError, match=r"^plan: schedule: got 'zb-v'"):
        ParallelPlan(pp=2, schedule="zb-v")


def test_the_flex_dispatcher_runs_on_its_backend():
    plan = ParallelPlan(dp=8, ep=8, global_batch_size=8, dispatcher="flex")
    assert plan.token_dispatcher is st.FLEX_BACKENDS["deepep"] is st.TOKEN_DISPATCHERS["flex"]
    hybrid = replace(plan, moe_flex_dispatcher_backend="hybridep").token_dispatcher
    assert hybrid is st.FLEX_BACKENDS["hybridep"]
    assert hybrid.deepep and hybrid.pads_expert_rows and not plan.token_dispatcher.pads_expert_rows
    assert (plan.token_dispatcher.num_sms, hybrid.num_sms) == (20, 16)


@pytest.mark.parametrize("field, value", [("moe_flex_dispatcher_backend", "hybridep"), ("moe_flex_num_sms", 32)])
def test_a_flex_setting_without_the_flex_dispatcher_is_refused(field, value):
    with pytest.raises(InputError, match=rf"^plan: {field}: got '?{value}'?; needs moe_token_dispatcher_type flex "
                                         r"\(got alltoall\)"):
        ParallelPlan(dp=8, ep=8, global_batch_size=8, **{field: value})


def test_a_flex_setting_on_the_command_line_is_one_line_and_exit_2(capsys):
    from sim.cli import main

    rc = main(["run", "--model", "mixtral-8x7b", "--gpus", "16", "--ep", "8", "--moe-flex-dispatcher-backend",
               "hybridep"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "needs moe_token_dispatcher_type flex" in err
