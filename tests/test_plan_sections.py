"""The plan's typed sections (``sim.inputs.plan_sections``): every field in exactly one,
each holding the plan's own values, hashable for the caches that key on them."""

import dataclasses

import pytest

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


# ------------------------------------------------------------ TOML tables and --help groups
from sim.errors import InputError  # noqa: E402
from sim.inputs.experiment import PLAN_SECTION_KEYS, read_experiment  # noqa: E402
from sim.inputs.schema import FIELDS  # noqa: E402

_FLAT = """[model]
preset = "mixtral-8x7b"
[plan]
zero = 1
tensor_model_parallel_size = 2
sequence_parallel = true
pipeline_model_parallel_size = 2
expert_model_parallel_size = 4
recompute_granularity = "selective"
recompute_modules = ["moe_act"]
"""
_SECTIONED = """[model]
preset = "mixtral-8x7b"
[plan]
zero = 1
[plan.parallelism]
tensor_model_parallel_size = 2
sequence_parallel = true
[plan.pipeline]
pipeline_model_parallel_size = 2
[plan.moe]
expert_model_parallel_size = 4
[plan.recompute]
recompute_granularity = "selective"
recompute_modules = ["moe_act"]
"""


def _values(exp) -> dict:
    return {k: s.value for k, s in exp.settings.items()}


def test_a_plan_key_may_be_written_in_its_sections_table_with_the_same_settings(tmp_path):
    (tmp_path / "flat.toml").write_text(_FLAT)
    (tmp_path / "sections.toml").write_text(_SECTIONED)
    flat, sectioned = (read_experiment(tmp_path / n) for n in ("flat.toml", "sections.toml"))
    assert _values(flat) == _values(sectioned)
    assert sectioned.settings["expert_model_parallel_size"].key == "plan.moe.expert_model_parallel_size"
    assert sectioned.settings["expert_model_parallel_size"].where.line == 11  # its own line, for errors
    # ``zero = 1`` under [plan] stays the plan key: a section's table is a table, a key is not
    assert flat.settings["zero"].value == sectioned.settings["zero"].value == 1


@pytest.mark.parametrize("extra, message", [
    ("[plan.moe]\ntensor_model_parallel_size = 4\n",
     "bad.toml:7: plan.moe.tensor_model_parallel_size: a key of the parallelism section: write it in "
     "plan.parallelism or plan, not plan.moe"),
    ("[plan.moe]\nexpert_model_parallel_size = 0\n", "bad.toml:7: plan.moe.expert_model_parallel_size: got 0; "
                                                     "expected an integer >= 1"),
    ("[plan.parallelism]\ntensor_model_parallel_size = 4\n",
     "bad.toml:7: plan.parallelism.tensor_model_parallel_size: given twice: also as "
     "plan.tensor_model_parallel_size; give it once"),
    ("[plan.moe]\nexpert_model_paralel_size = 4\n", "bad.toml:7: plan.moe.expert_model_paralel_size: unknown key "
                                                    "(did you mean 'expert_model_parallel_size'?)"),
])
def test_a_bad_key_in_a_sections_table_names_file_line_and_table(tmp_path, extra, message):
    f = tmp_path / "bad.toml"
    f.write_text('[model]\npreset = "mixtral-8x7b"\n[plan]\ntensor_model_parallel_size = 2\n\n' + extra)
    with pytest.raises(InputError) as e:
        read_experiment(f)
    assert str(e.value).startswith(str(f.parent / message))


def test_a_plans_entry_takes_section_tables_too(tmp_path):
    f = tmp_path / "plans.toml"
    f.write_text('[model]\npreset = "llama2-7b"\n[[plans]]\nname = "a"\nzero = 1\n'
                 '[[plans]]\nname = "b"\n[plans.zero]\nzero = 3\n[plans.recompute]\nrecompute_granularity = "full"\n')
    a, b = read_experiment(f).plans
    assert {k: s.value for k, s in a.settings.items()} == {"zero": 1}
    assert {k: s.value for k, s in b.settings.items()} == {"zero": 3, "recompute_granularity": "full"}
    assert b.settings["zero"].key == "plans[1].zero.zero"


def test_the_help_groups_and_the_tables_follow_the_sections():
    for name, f in FIELDS.items():
        if f.section == "plan":
            section = SECTIONS[SECTION_OF[f.attr]]
            assert f.group == section.TITLE, name       # one --help group per section
            if "plan" in dict(f.tables):  # (DeepSpeed's keys are [zero_optimization]'s alone)
                assert PLAN_SECTION_KEYS[SECTION_OF[f.attr]][dict(f.tables)["plan"]] == name
    assert len({cls.TITLE for cls in SECTIONS.values()}) == len(SECTIONS)


# ------------------------------------------------------------ bounds declared once
@pytest.mark.parametrize("attr, setting, bad", [
    ("tp", "tensor_model_parallel_size", 0), ("ep", "expert_model_parallel_size", -2),
    ("cp", "context_parallel_size", 1.5), ("moe_capacity_factor", "moe_expert_capacity_factor", 0.0),
    ("zero_stage", "zero", 4), ("zero3_max_live_parameters", "zero3_max_live_parameters", float("inf")),
    ("zero3_param_persistence_threshold", "zero3_param_persistence_threshold", -1),
    ("fp8_format", "fp8_format", "e5m2"), ("dispatcher", "moe_token_dispatcher_type", "deepep-ll"),
    ("overlap_comm", "overlap_comm", "yes"), ("sequence_parallel", "sequence_parallel", 1),
])
def test_a_plan_built_in_python_is_refused_by_its_fields_one_declaration(attr, setting, bad):
    # the bound lives in the schema alone: the plan's refusal says what the flag's says
    from sim.inputs.schema import why_not

    with pytest.raises(InputError) as e:
        ParallelPlan(**{attr: bad})
    assert e.value.setting == attr and e.value.value == bad
    assert f"got {bad!r}; {e.value.allowed}" == why_not(setting, bad)
    assert str(e.value).startswith(f"plan: {'moe_token_dispatcher_type' if attr == 'dispatcher' else attr}: ")
