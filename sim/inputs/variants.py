"""The plans a comparison runs: a file's ``[[plans]]``, a list given to ``sim.compare``,
and every schedule or ZeRO stage asked for with ``--schedules`` / ``--zero-stages``
(which alone vary one base plan). ``sim.api.compare`` and ``trainsim compare`` simulate them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.errors import InputError
from sim.inputs.experiment import Experiment, Setting, settings_from_values


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
