"""The plans a comparison runs: a file's ``[[plans]]``, a list given to ``sim.compare``,
and every schedule or ZeRO stage asked for with ``--schedules`` / ``--zero-stages``
(which alone vary one base plan). ``sim.api.compare`` and ``trainsim compare`` simulate them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.errors import InputError
from sim.inputs.experiment import Experiment, Setting, settings_from_values
from sim.inputs.strategies import PIPELINE_SCHEDULES


def plan_settings(plan) -> tuple[dict[str, Setting], object]:
    """Settings from a plan given as a dict of [plan] keys, or the ParallelPlan itself."""
    from sim.inputs.plan import ParallelPlan

    if plan is None or isinstance(plan, str):
        return {}, None
    if isinstance(plan, ParallelPlan):
        return {}, plan
    if isinstance(plan, dict):
        values = {("zero" if k == "stage" else k): v for k, v in plan.items() if k not in ("name", "description")}
        return settings_from_values(values, "plan."), None
    raise InputError(f"plan: got {plan!r}; expected a dict of [plan] keys, a sim.inputs.plan.ParallelPlan, "
                     "or the name of one of the experiment file's [[plans]]")


@dataclass
class Variant:
    """One plan of a comparison, before it is simulated."""

    name: str
    description: str = ""
    settings: dict = field(default_factory=dict)
    """The plan's own settings (a [[plans]] table's, or a dict's)."""
    axis: dict = field(default_factory=dict)
    """Settings from --schedules / --zero-stages (applied last)."""
    plan: object = None
    """A ParallelPlan to use as it is."""
    line: int | None = None
    from_file: bool = False


def variants_of(exp: Experiment | None, plans, schedules=None, zero_stages=None) -> list[Variant]:
    """The plans to simulate: the file's [[plans]] or ``plans``, times every schedule and
    ZeRO stage given (which alone vary one base plan)."""
    from sim.inputs.plan import ParallelPlan

    out: list[Variant] = []
    if plans is not None:
        if exp is not None and exp.plans:
            raise InputError(f"plans: given, and {exp.path} has [[plans]] too; use one or the other")
        if not isinstance(plans, (list, tuple)) or not plans:
            raise InputError(f"plans: got {plans!r}; expected a non-empty list of dicts or ParallelPlans")
        for i, p in enumerate(plans):
            if isinstance(p, ParallelPlan):
                out.append(Variant(f"plan {i + 1}", plan=p))
            elif isinstance(p, dict):
                name = p.get("name")
                if not isinstance(name, str) or not name.strip():
                    raise InputError(f"plans[{i}].name: got {name!r}; every plan needs a name (a non-empty string)")
                sets, _ = plan_settings(p)
                out.append(Variant(name, str(p.get("description", "")), sets))
            else:
                raise InputError(f"plans[{i}]: got {p!r}; expected a dict of [plan] keys with a name, or a ParallelPlan")
            if any(v.name == out[-1].name for v in out[:-1]):
                raise InputError(f"plans[{i}].name: got {out[-1].name!r} again; plan names must be unique")
    elif exp is not None and exp.plans:
        out = [Variant(p.name, p.description, p.settings, line=p.line, from_file=True) for p in exp.plans]
    axes = []
    if schedules:
        axes.append([(str(s), {"schedule": str(s)}) for s in schedules])
    if zero_stages:
        axes.append([(f"zero-{z}", {"zero": z}) for z in zero_stages])
    if not out and not axes:
        where = f"{exp.path}: " if exp else ""
        raise InputError(f"{where}plans: nothing to compare; list [[plans]] in the file, or give "
                         "--schedules gpipe,1f1b,... or --zero-stages 0,1,2,3")
    if not out:
        out = [Variant("", from_file=True)]
    for axis in axes:
        grown = []
        for v in out:
            if v.plan is not None:
                raise InputError("schedules / zero_stages: cannot vary a ParallelPlan; give the plans as dicts")
            for label, values in axis:
                extra = settings_from_values(values, "plan.")
                grown.append(Variant(f"{v.name}, {label}" if v.name else label, v.description, v.settings,
                                     {**v.axis, **extra}, None, v.line, v.from_file))
        out = grown
    return out


VPP_SETTINGS = ("num_virtual_stages_per_pipeline_rank", "num_layers_per_virtual_pipeline_stage")
"""The settings that give a plan model chunks per pipeline rank (vpp > 1)."""
INTERLEAVED_VPP = 2
"""The model chunks per pipeline rank an interleaved plan of a ``--schedules`` list gets when
none is given (Megatron-LM's smallest interleaving; ``trainsim demo`` runs the same)."""


def fit_vpp_to_schedule(v: Variant, settings: dict[str, Setting], num_layers) -> dict[str, Setting]:
    """A plan of a ``--schedules`` list with the model chunks its schedule needs: the
    interleaved plan takes the vpp given (``--num-virtual-stages-per-pipeline-rank`` or
    ``--num-layers-per-virtual-pipeline-stage``), or ``INTERLEAVED_VPP`` where the layers
    split evenly into pp x that many chunks; every other named schedule runs one chunk per
    rank (vpp 1), so that one vpp does not refuse the other schedules of the list.
    ``num_layers()``: the model's transformer layers (called only when needed). A plan not
    varied by ``--schedules``, or one with a Megatron layout or a custom schedule, is
    returned as it is."""
    axis = v.axis.get("schedule")
    if axis is None or "pipeline_model_parallel_layout" in settings:
        return settings
    schedule = axis.value
    out = dict(settings)
    strategy = PIPELINE_SCHEDULES.get(schedule)  # (None: a schedule file)
    if strategy is not None and strategy.interleaved:
        vpp = out.get("num_virtual_stages_per_pipeline_rank")
        if (vpp is None or vpp.value == 1) and "num_layers_per_virtual_pipeline_stage" not in out:
            pp = out["pipeline_model_parallel_size"].value if "pipeline_model_parallel_size" in out else 1
            if pp > 1 and num_layers() % (pp * INTERLEAVED_VPP) == 0:
                out["num_virtual_stages_per_pipeline_rank"] = Setting(
                    "num_virtual_stages_per_pipeline_rank", "num_virtual_stages_per_pipeline_rank", INTERLEAVED_VPP,
                    axis.where)
    elif strategy is not None and strategy.one_chunk:
        for key in VPP_SETTINGS:
            out.pop(key, None)
    return out
