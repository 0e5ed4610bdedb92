"""The plan's typed sections (``sim.inputs.plan_sections``): every field in exactly one,
each holding the plan's own values, hashable for the caches that key on them."""

import dataclasses

from sim.inputs.plan import ParallelPlan
from sim.inputs.plan_sections import SECTION_OF, SECTIONS, PlanSections


def test_every_plan_field_belongs_to_exactly_one_section():
    fields = [f.name for f in dataclasses.fields(ParallelPlan)]
    owned = [f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls)]
    assert sorted(owned) == sorted(fields)          # none left out, none twice
    assert len(set(owned)) == len(owned)
    assert list(SECTIONS) == [f.name for f in dataclasses.fields(PlanSections)]


def test_sections_hold_the_plans_values():
    plan = ParallelPlan(dp=2, tp=2, pp=2, vpp=2, sequence_parallel=True, global_batch_size=16, ep=2,
                        dispatcher="allgather", fp8_format="hybrid", zero_stage=1, recompute="selective",
                        tp_comm_overlap=True, framework="torchtitan")
    s = plan.sections
    for name, section in SECTIONS.items():
        part = getattr(s, name)
        assert isinstance(part, section)
        for f in dataclasses.fields(section):
            assert getattr(part, f.name) == getattr(plan, f.name), (name, f.name)
    # what the plan derives, each section derives the same from its own fields
    assert s.parallelism.sp is plan.sp is True
    assert s.parallelism.num_microbatches == plan.num_microbatches == 16 // (1 * 2)
    assert s.precision.precision == plan.precision
    assert s.zero.zero == plan.zero
    assert s.recompute.policy == plan.recompute_policy
    assert s.framework.attention_mode == plan.attention_mode


def test_equal_plans_have_equal_hashable_sections_and_a_change_touches_one_section():
    a, b = ParallelPlan(tp=2), ParallelPlan(tp=2)
    assert a.sections == b.sections and hash(a.sections) == hash(b.sections)
    c = dataclasses.replace(a, dispatcher="allgather", ep=2, dp=2, global_batch_size=2)
    changed = [n for n in SECTIONS if getattr(a.sections, n) != getattr(c.sections, n)]
    assert changed == ["parallelism", "moe"]          # dp is parallelism's, ep and dispatcher moe's
    assert {a.sections.moe: 1}[ParallelPlan(tp=2).sections.moe] == 1


def test_a_layers_own_recompute_is_the_section_with_that_granularity():
    r = ParallelPlan(recompute="selective").sections.recompute
    assert r.at(None) is r and r.at("selective") is r
    assert r.at("full") == dataclasses.replace(r, recompute="full")
    assert SECTION_OF["recompute_modules"] == "recompute" and SECTION_OF["tp"] == "parallelism"
