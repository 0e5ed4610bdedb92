"""The settings schema: every setting a run takes, as fields of frozen dataclasses.

A run is described by five sections, each a frozen dataclass whose fields carry their
own documentation (``help``, with the unit where there is one), their command-line flag
(Megatron-LM's spelling), their key in an experiment file (``[model]``, ``[cluster]``,
``[plan]``, and DeepSpeed's ``[zero_optimization]`` names), and what values they allow:

    ModelSettings       which model: a preset, a Hugging Face config.json, or its shape
    ClusterSettings     the GPU profile, how many GPUs, the nodes and the fabric
    ParallelPlan        parallel sizes, pipeline schedule and split, batch, recompute, ZeRO
                        (``sim.inputs.plan``: the plan the program builder reads; what a user
                        gave is its ``PlanRequest`` until the GPUs and the model fix dp and vpp)
    SimulationSettings  fidelity and the event limit
    OutputSettings      where the results go (command line and API only)

TOML files (``sim.inputs.experiment``), keyword arguments of ``sim.run`` and the
command line (``sim.inputs.flags`` builds the flags from the fields) all map straight onto
these fields, and ``check_value`` checks a value the same way whichever way it came:
an error names the field (as the user wrote it), the value and what is allowed.

Adding a setting is one field in its section (here, ``sim.inputs.schema_model`` or
``sim.inputs.schema_sim``; ``sim.inputs.fields.setting`` with its flag and help), then using it where the
run is built (``sim.session``), and a test.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

from sim.errors import InputError
from sim.inputs.cost import PRICE
from sim.inputs.fields import Field, check_section, fields_of_class, setting, why_not_field
from sim.inputs.plan import ParallelPlan
from sim.inputs.plan_sections import SECTION_OF as SECTION_OF_PLAN_FIELD, SECTIONS as PLAN_SECTIONS
from sim.inputs.schema_model import SPEC_SETTINGS, ModelSettings
from sim.inputs.schema_sim import (  # noqa: F401 (re-exported: the bounds the other modules use)
    AUTO_FULL_FIDELITY_EVENTS, COLLECTIVE_MODELS, DEFAULT_MAX_EVENTS, FIDELITIES, NCCL_ALGOS, NCCL_PROTOCOLS,
    OutputSettings, SimulationSettings)
from sim.inputs.topology_build import FABRICS, OVERSUBSCRIPTION
from sim.units import NONNEGATIVE_INT, POSITIVE_INT, Number

def _gpu_presets() -> str:
    from sim.inputs.hardware import PRESETS

    return ", ".join(PRESETS)


@dataclass(frozen=True)
class ClusterSettings:
    """The hardware and the cluster: a GPU profile, how many GPUs, and the nodes and
    fabric between them (default: the GPU's DGX node, rail-optimized)."""

    TABLE: ClassVar[str | None] = "cluster"
    GROUP: ClassVar[str | None] = "cluster"

    gpu: str = setting("a100-80gb", help=lambda: f"{_gpu_presets()} or a profile .json (default a100-80gb)",
                       group="hardware", path=lambda v: v.endswith(".json"))
    gpus: int | None = setting(help="total GPUs; data parallelism fills them (default tp x pp)", type=POSITIVE_INT,
                               group="hardware")
    gpus_per_node: int | None = setting(help="GPUs per node, the NVLink domain (default: the topology's; 8 on DGX "
                                              "nodes, 72 on gb200-nvl72)", type=POSITIVE_INT, group="hardware")
    power_limit_w: float | None = setting(help="cap every GPU's power at W watts (nvidia-smi -pl): compute-bound kernels "
                                               "run at the lower clock it allows (default: the profile's power_limit_w)",
                                          type=Number(float, above=0), metavar="W", group="hardware")
    pin_to_nvlink_domain: tuple[str, ...] | str | None = setting(
        kind="list", metavar="GROUP", group="hardware",
        help="parallel groups that must stay inside one NVLink domain (a node, or a GB200 NVL72 rack), space- or "
             "comma-separated: tp, cp, ep, etp; a plan where such a group crosses domains is refused, and search "
             "leaves it out (default: none pinned; the placement keeps them inside where their sizes allow)")
    gpu_hour_price: float | str | None = setting(
        help="US dollars per GPU-hour, for the cost per iteration and per million tokens: one price (2.5), or one "
             "per GPU type (h100-sxm=2.5,b200=4.0) (default: the profile's gpu_hour_price_usd; no preset has one)",
        type=PRICE, metavar="USD|GPU=USD,...", group="hardware")
    nodes: int | None = setting(help="nodes in the cluster (default: enough for the plan's GPUs)", type=POSITIVE_INT)
    topology: str | None = setting(help="node or cluster .toml, or a built-in name (default: the GPU's built-in node: its DGX, or gb200-nvl72)",
                                   path=lambda v: v.endswith(".toml"))
    fabric: str | None = setting(help="inter-node fabric (default rail)", choices=FABRICS)
    oversubscription: float | None = setting(help="fat-tree/leaf uplink oversubscription", type=OVERSUBSCRIPTION)

    def __post_init__(self):
        check_section(self)
        self.pinned()
        self.prices()

    def prices(self) -> dict[str | None, float] | None:
        """The GPU-hour prices (``sim.inputs.cost``), checked; None when none is given."""
        from sim.inputs.cost import parse_prices

        return None if self.gpu_hour_price is None else parse_prices(self.gpu_hour_price)

    def pinned(self) -> tuple[str, ...]:
        """The groups pinned inside one NVLink domain (``sim.inputs.pinning``), checked."""
        from sim.inputs.pinning import parse_pinned

        return parse_pinned(self.pin_to_nvlink_domain)

    def total_gpus(self) -> int | None:
        """``gpus``, or all GPUs of ``nodes`` nodes (None when neither is given)."""
        if self.gpus is not None:
            return self.gpus
        if self.nodes is not None:
            return self.nodes * self.node_gpus()
        return None

    def node_gpus(self) -> int:
        """``gpus_per_node``, or the GPUs per node of the topology (default: the GPU's
        built-in node, ``sim.inputs.topology_build.NODE_OF_GPU``), or 8 when there is none."""
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        from sim.inputs.topology_build import NODE_OF_GPU, load_topology

        name = self.topology or NODE_OF_GPU.get(self.gpu)
        return load_topology(name, flag="--topology").gpus_per_node if name else 8


@dataclass(frozen=True)
class PlanRequest:
    """The plan settings a user gave, by ``ParallelPlan`` attribute, each checked as its field
    is but not yet converted (``layer_split = "auto"`` stays a request): the plan before the
    cluster's GPUs fix ``dp`` and the model ``vpp``. ``sim.inputs.resolve.plan_from_settings``
    turns it into the ``ParallelPlan`` itself; the plan's own rules are checked there, once."""

    given: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self):
        for attr, value in self.given.items():
            f = _PLAN_ATTRS.get(attr)
            if f is None:
                raise InputError(f"plan: {attr}: unknown setting; allowed: {', '.join(sorted(_PLAN_ATTRS))}")
            why = why_not_field(f, value)
            if why is not None:
                raise InputError(field=f.name, value=value, allowed=why, setting=f.name)

    def get(self, attr: str, default=None):
        """What the user gave for the plan's attribute ``attr`` (``default`` when nothing)."""
        return self.given.get(attr, default)

    def __getattr__(self, name: str):  # by setting name too: request.tensor_model_parallel_size
        f = FIELDS.get(name) if name != "given" else None
        if f is None or f.section != "plan":
            raise AttributeError(name)
        return self.given.get(f.attr, DEFAULTS[name])


SECTIONS = {"model": ModelSettings, "cluster": ClusterSettings, "plan": ParallelPlan,
            "simulation": SimulationSettings, "output": OutputSettings}


@dataclass(frozen=True)
class RunSettings:
    """Everything one simulated iteration takes, section by section."""

    model: ModelSettings = field(default_factory=ModelSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    plan: PlanRequest = field(default_factory=PlanRequest)
    simulation: SimulationSettings = field(default_factory=SimulationSettings)
    output: OutputSettings = field(default_factory=OutputSettings)

    @classmethod
    def from_values(cls, values: Mapping[str, object]) -> "RunSettings":
        """Settings from values by field name (any section); the rest take their defaults."""
        unknown = sorted(set(values) - set(FIELDS))
        if unknown:
            raise InputError(f"{unknown[0]}: unknown setting; allowed: {', '.join(sorted(FIELDS))}")
        return cls(**{name: section_of(name, values) for name in SECTIONS})

    def values(self) -> dict[str, object]:
        """Every setting's value by name (the inverse of ``from_values``; the plan's as given)."""
        out = {}
        for name, f in FIELDS.items():
            if f.section == "plan":
                if f.attr in self.plan.given:
                    out[name] = self.plan.given[f.attr]
            else:
                out[name] = getattr(getattr(self, f.section), f.attr)
        return out


def section_of(section: str, values: Mapping[str, object]):
    """One section from values by setting name; others are ignored. The plan's is the
    ``PlanRequest`` of the values given (None is not given)."""
    mine = {f.attr: values[name] for name, f in FIELDS.items() if f.section == section and name in values}
    if section == "plan":
        return PlanRequest({a: v for a, v in mine.items() if v is not None})
    return SECTIONS[section](**mine)


def _settings(section: str, cls) -> list[Field]:
    """A section's settings, with their defaults filled in from their names and the section; a
    plan field that names no ``--help`` group of its own is listed in its plan section's
    (``sim.inputs.plan_sections``: parallelism and batch, pipeline, precision, ZeRO, ...)."""
    out = fields_of_class(cls, section, _PLAN_GROUP)
    if section != "plan":
        return out
    return [dataclasses.replace(f, group=PLAN_SECTIONS[SECTION_OF_PLAN_FIELD[f.attr]].TITLE)
            if f.group == _PLAN_GROUP and f.attr in SECTION_OF_PLAN_FIELD else f for f in out]


_PLAN_GROUP = "parallelism and batch (Megatron-LM flags)"
FIELDS: dict[str, Field] = {f.name: f for sec, cls in SECTIONS.items() for f in _settings(sec, cls)}
"""Every setting's schema entry, by setting name, in section order."""
_PLAN_ATTRS: dict[str, Field] = {f.attr: f for f in FIELDS.values() if f.section == "plan"}
DEFAULTS: dict[str, object] = {
    name: next(d.default for d in dataclasses.fields(SECTIONS[f.section]) if d.name == f.attr)
    for name, f in FIELDS.items()}
SECTION_OF: dict[str, str] = {name: f.section for name, f in FIELDS.items()}
BY_FLAG: dict[str, Field] = {f.flag: f for f in FIELDS.values()}


def setting_of(section: str, attr: str) -> Field | None:
    """The setting a section's attribute holds (``("plan", "tp")`` is ``tensor_model_parallel_size``)."""
    for f in FIELDS.values():
        if f.section == section and f.attr == attr:
            return f
    return None


def setting_field(setting: str) -> Field | None:
    """The schema entry an error's ``setting`` (or ``field``) names: a setting (``gpus``), its
    flag (``--gpus``), a plan attribute (``tp``) or a ``ModelSpec`` attribute; None for none."""
    return (FIELDS.get(setting) or BY_FLAG.get(setting) or _PLAN_ATTRS.get(setting)
            or FIELDS.get(SPEC_SETTINGS.get(setting, "")))


def fields_of(*sections: str) -> list[str]:
    """The setting names of the named sections, in order."""
    return [name for s in sections for name, f in FIELDS.items() if f.section == s]


def why_not(name: str, value) -> str | None:
    """Why ``value`` (a Python value, as from TOML or the API) is not allowed for the
    setting ``name`` (``got 0; expected an integer >= 1``), or None when it is."""
    allowed = why_not_field(FIELDS[name], value)
    return None if allowed is None else f"got {value!r}; {allowed}"


def tables() -> dict[str, dict[str, str]]:
    """Per experiment-file table, its keys and the field each stands for, in field order."""
    out: dict[str, dict[str, str]] = {}
    for name, f in FIELDS.items():
        for table, key in f.tables:
            out.setdefault(table, {})[key] = name
    return out
