"""Experiment files: a model, a cluster and a plan in TOML, read strictly.

An experiment file uses the command line's names with underscores, in three tables:

    [model]    preset = "gpt3-175b"   (or hf_config = "...", or num_layers = ..., ...)
    [cluster]  gpu = "a100-80gb", nodes = 128, fabric = "rail", ...
    [plan]     tensor_model_parallel_size = 8, pipeline_model_parallel_size = 16,
               micro_batch_size = 1, global_batch_size = 1536, schedule = "1f1b", ...

Each key is a field of the settings schema (``sim.inputs.schema``), checked as that
field is checked wherever it comes from: unknown keys, wrong types and unknown tables
are errors naming the file, line and key. Flags typed on the command line after a file
override it, field by field.

The plan's keys may also be written in the table of their section (``sim.inputs.plan_sections``),
a sub-table of [plan] named for it, each key once, in one place or the other:

    [plan.parallelism]  tensor_model_parallel_size = 8, micro_batch_size = 1, ...
    [plan.pipeline]     pipeline_model_parallel_size = 16, schedule = "interleaved", ...
    [plan.moe]          expert_model_parallel_size = 8, moe_token_dispatcher_type = "flex", ...
    [plan.precision]    fp8_format = "hybrid", ...   (also zero, recompute, overlap, framework)

A file for ``trainsim compare`` also lists several plans, each a ``[[plans]]`` table
with a ``name`` (unique), an optional ``description``, any [plan] key and an optional
``[plans.zero_optimization]`` sub-table; a plan's keys override the file's [plan]:

    [plan]     pipeline_model_parallel_size = 4, global_batch_size = 64
    [[plans]]  name = "gpipe", schedule = "gpipe"
    [[plans]]  name = "1f1b", schedule = "1f1b"

``read_experiment`` checks all of it up front, so an error in the third plan is
reported (with its line) before anything is simulated.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from sim.errors import InputError
from sim.inputs import schema
from sim.inputs.plan_sections import SECTION_OF as _SECTION_OF
from sim.inputs.tomlio import TomlFile, line_of, where_line

TABLES = {table: {field: key for key, field in keys.items()} for table, keys in schema.tables().items()}
"""Per table, the fields it may set and the key each is written as: ``[model]`` ``preset``
is the field ``model``; DeepSpeed's ``[zero_optimization]`` names (``stage``,
``stage3_prefetch_bucket_size``, ...) stand for plan fields."""
TOP_KEYS = {"name", "description", *TABLES}
"""What may stand at the top of an experiment file (with ``plans``, the ``[[plans]]`` tables)."""
MODEL_FIELDS = frozenset(schema.fields_of("model"))


def key_of(field: str, table: str) -> str:
    """The key a field is written as in ``table`` (``model`` is ``preset`` in [model])."""
    return TABLES[table][field]


def resolve_path(base: Path, field: str, value):
    """A value that names a file (``hf_config``, ``topology``, ``schedule``, ``gpu``), relative
    to the experiment file's folder when it is relative and the file exists there."""
    is_path = schema.FIELDS[field].path
    if is_path is not None and isinstance(value, str) and is_path(value):
        p = Path(value)
        if not p.is_absolute() and (base.parent / p).exists():
            return str(base.parent / p)
    return value


class Setting(NamedTuple):
    """One value an experiment sets: its schema field, its name in the file, where it was written."""

    dest: str
    key: str
    value: object
    where: "Where"


class Where:
    """Where a value was written (a file and line, or nothing for values given in Python),
    so that every error names it."""

    def __init__(self, f: TomlFile | None = None, line: int | None = None):
        self.f, self.line = f, line

    def error(self, key: str, message: str, cause: InputError | None = None) -> InputError:
        """The error about ``key`` written here; ``cause``: the error it restates (its
        value, what is allowed and its setting are kept)."""
        keep = {} if cause is None else {"value": cause.value, "allowed": cause.allowed, "setting": cause.setting,
                                         "shown": cause.shown}
        if self.f is None:
            return InputError(f"{key}: {message}", field=key, **keep)
        line = self.line if self.line is not None else self.f.line(key)  # (not given: where the key is written)
        place = f"{self.f.path}:{line}: " if line is not None else f"{self.f.path}: "
        return InputError(f"{place}{key}: {message}", field=key, path=str(self.f.path), line=line, **keep)


@dataclass
class PlanEntry:
    """One ``[[plans]]`` table: a name and the plan keys it sets over the file's [plan]."""

    name: str
    description: str
    line: int | None
    settings: dict[str, Setting]


@dataclass
class Experiment:
    """An experiment file, read and checked: the settings of its tables and its plans."""

    path: Path
    name: str
    description: str
    settings: dict[str, Setting]
    """By field: what [model], [cluster], [plan] and [zero_optimization] set."""
    plans: list[PlanEntry] = field(default_factory=list)

    def plan_settings(self, entry: PlanEntry | None = None) -> dict[str, Setting]:
        """The file's settings with one plan's keys over them."""
        return {**self.settings, **(entry.settings if entry else {})}

    def plan(self, name: str) -> PlanEntry:
        for p in self.plans:
            if p.name == name:
                return p
        raise InputError(f"{self.path}: plans: no plan named {name!r}; the file has "
                         f"{', '.join(repr(p.name) for p in self.plans) or 'no [[plans]]'}", path=str(self.path))

    @property
    def has_model(self) -> bool:
        return any(d in MODEL_FIELDS for d in self.settings)


def _table_settings(f: TomlFile, where_of, table: str, values: dict, prefix: str) -> dict[str, Setting]:
    """The settings of one table's values, each checked as its field is."""
    keys = {key: field for field, key in TABLES[table].items()}
    out = {}
    for key, value in values.items():
        field = keys[key]
        where = where_of(key)
        value = resolve_path(f.path, field, value)
        check(where, f"{prefix}{key}", field, value)  # now, with the line
        out[field] = Setting(field, f"{prefix}{key}", value, where)
    return out


OFFLOAD_DEVICES = {"cpu": True, "none": False}
"""DeepSpeed's ``offload_optimizer.device`` values that are modelled: on (host memory) or off."""
OFFLOAD_KEYS = ("device", "pin_memory")


def _offload_table(f: TomlFile, z: dict, prefix: str, at, sub: str, occurrence: int = 0) -> dict:
    """``z`` (a zero_optimization table) with DeepSpeed's object form of ``offload_optimizer``
    (``{device = "cpu", pin_memory = true}``) turned into the boolean it stands for:
    device "cpu" is on, "none" (DeepSpeed's default) off; ``pin_memory`` is accepted and
    not modelled. ``at(key)`` is where the key ``offload_optimizer`` is written; ``sub`` the
    name of its sub-table (``zero_optimization.offload_optimizer``) when written as one."""
    value = z.get("offload_optimizer")
    if not isinstance(value, dict):
        if "offload_optimizer" in z and not isinstance(value, bool):
            raise at("offload_optimizer").error(
                f"{prefix}offload_optimizer",
                f"got {value!r}; expected true, false or a table such as {{device = \"cpu\"}}")
        return z

    def where(key):  # the key's line in a [...offload_optimizer] sub-table, else the offload_optimizer line
        line = line_of(f, sub, key, occurrence)
        return Where(f, line) if line is not None else at("offload_optimizer")

    name = f"{prefix}offload_optimizer."
    _unknown(where, name, value, OFFLOAD_KEYS)
    pin = value.get("pin_memory", False)
    if not isinstance(pin, bool):
        raise where("pin_memory").error(f"{name}pin_memory", f"got {pin!r}; expected true or false")
    device = value.get("device", "none")
    if not isinstance(device, str) or device not in OFFLOAD_DEVICES:
        why = " (offload to NVMe is not modelled)" if device == "nvme" else ""
        raise where("device").error(f"{name}device", f"got {device!r}; allowed: {', '.join(OFFLOAD_DEVICES)}{why}")
    return {**z, "offload_optimizer": OFFLOAD_DEVICES[device]}


PLAN_SECTION_KEYS: dict[str, dict[str, str]] = {}
"""Per plan section (``sim.inputs.plan_sections``), the keys its [plan.SECTION] table may hold and
the field each is: the plan keys of that section's fields."""
for _field, _key in TABLES["plan"].items():  # (a field in no section yet is a key of [plan] alone)
    if schema.FIELDS[_field].attr in _SECTION_OF:
        PLAN_SECTION_KEYS.setdefault(_SECTION_OF[schema.FIELDS[_field].attr], {})[_key] = _field
del _field, _key


def _section_tables(f: TomlFile, table: dict, prefix: str, where_of) -> tuple[dict, dict[str, Setting]]:
    """A [plan] (or [[plans]]) table's keys besides its section sub-tables ([plan.moe], ...; a
    key named like a section but not a table, ``zero = 3``, is the plan key), and the settings
    of those sub-tables, each checked as its field is; ``where_of(section, key)`` is where a
    sub-table's key is written. A key given in a sub-table and its parent table too is refused."""
    rest, out = {}, {}
    for name, value in table.items():
        if name not in PLAN_SECTION_KEYS or not isinstance(value, dict):
            rest[name] = value
            continue
        at = lambda k, name=name: where_of(name, k)  # noqa: E731
        for k in value:
            other = next((sec for sec, keys in PLAN_SECTION_KEYS.items() if k in keys), name)
            if other != name:
                raise at(k).error(f"{prefix}{name}.{k}", f"a key of the {other} section: write it in "
                                                         f"{prefix}{other} or {prefix[:-1]}, not {prefix}{name}")
        _unknown(at, f"{prefix}{name}.", value, PLAN_SECTION_KEYS[name])
        out.update(_table_settings(f, at, "plan", value, f"{prefix}{name}."))
    for dest, setting in out.items():
        key = key_of(dest, "plan")
        if key in rest:
            raise setting.where.error(setting.key, f"given twice: also as {prefix}{key}; give it once")
    return rest, out


def _unknown(where, prefix: str, table: dict, allowed) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise where(key).error(f"{prefix}{key}", f"unknown key{hint}; allowed keys are {', '.join(sorted(allowed))}")


PLAN_KEYS = ("name", "description", *TABLES["plan"].values(), "zero_optimization")
"""What a ``[[plans]]`` table may hold: its name, a description, any [plan] key, and a
``[plans.zero_optimization]`` sub-table."""


def read_experiment(path: str | Path) -> Experiment:
    """Read and check an experiment file: every key known, every value of its field's type,
    plans named uniquely. Errors name the file, the line and the key."""
    f = TomlFile(path)
    data = f.data
    if not data:
        raise InputError(f"{f.path}: empty: no tables, only comments; expected [model], [cluster] and [plan] "
                         "tables, or [[plans]]", path=str(f.path))
    f.check_keys(data, TOP_KEYS | {"plans"}, "")
    settings: dict[str, Setting] = {}
    for table in TABLES:
        t = data.get(table, {})
        if not isinstance(t, dict):
            raise f.error(table, f"got {t!r}; expected a table [{table}]")
        keys = {key: field for field, key in TABLES[table].items()}
        if table == "plan":  # the sections' sub-tables, [plan.moe] ...
            t, sub = _section_tables(f, t, "plan.", lambda sec, k: Where(f, line_of(f, f"plan.{sec}", k)
                                                                         or where_line(f, f"plan.{sec}.{k}")))
            settings.update(sub)
        _unknown(lambda k, table=table: Where(f, line_of(f, table, k) or where_line(f, f"{table}.{k}")),
                 f"{table}.", t, keys)
        if table == "zero_optimization":
            t = _offload_table(f, t, f"{table}.", lambda k: Where(f, line_of(f, table, k)
                                                                  or where_line(f, f"{table}.{k}")),
                               "zero_optimization.offload_optimizer")
        settings.update(_table_settings(  # (a key written as a sub-table: its header's line)
            f, lambda k, table=table: Where(f, line_of(f, table, k) or line_of(f, f"{table}.{k}", None)
                                            or where_line(f, f"{table}.{k}")),
            table, t, f"{table}."))
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise f.error(key, f"got {data[key]!r}; expected a string")
    plans = _read_plans(f, data.get("plans")) if "plans" in data else []
    return Experiment(f.path, data.get("name", ""), data.get("description", ""), settings, plans)


def _read_plans(f: TomlFile, plans) -> list[PlanEntry]:
    if isinstance(plans, dict):
        raise f.error("plans", "got a single table [plans]; expected an array of tables: write [[plans]] "
                               "(double brackets) before each plan")
    if not isinstance(plans, list):
        raise f.error("plans", f"got {plans!r}; expected an array of tables, one [[plans]] per plan")
    if not plans:
        raise f.error("plans", "got an empty array; give at least one [[plans]] table")
    out: list[PlanEntry] = []
    plan_keys = {key: field for field, key in TABLES["plan"].items()}
    zero_keys = {key: field for field, key in TABLES["zero_optimization"].items()}
    allowed = {"name", "description", "zero_optimization", *plan_keys}
    for i, entry in enumerate(plans):
        head = line_of(f, "plans", None, i)
        at = lambda k, i=i, head=head: Where(f, line_of(f, "plans", k, i) if k else head)  # noqa: E731
        if not isinstance(entry, dict):
            raise at(None).error(f"plans[{i}]", f"got {entry!r}; expected a table with a name and plan keys")
        entry, sub = _section_tables(  # [plans.moe] ...
            f, entry, f"plans[{i}].", lambda sec, k, i=i, head=head: Where(f, line_of(f, f"plans.{sec}", k, i) or head))
        _unknown(at, f"plans[{i}].", entry, allowed)
        name = entry.get("name")
        if name is None:
            raise at(None).error(f"plans[{i}].name", "missing; every [[plans]] table needs a name")
        if not isinstance(name, str) or not name.strip():
            raise at("name").error(f"plans[{i}].name", f"got {name!r}; expected a non-empty string")
        for other in out:
            if other.name == name:
                raise at("name").error(f"plans[{i}].name", f"got {name!r} again (first at line {other.line}); "
                                                           "plan names must be unique")
        desc = entry.get("description", "")
        if not isinstance(desc, str):
            raise at("description").error(f"plans[{i}].description", f"got {desc!r}; expected a string")
        values = {k: v for k, v in entry.items() if k in plan_keys}
        settings = {**_table_settings(f, at, "plan", values, f"plans[{i}]."), **sub}
        z = entry.get("zero_optimization", {})
        zat = lambda k, i=i, head=head: Where(f, line_of(f, "plans.zero_optimization", k, i) or head)  # noqa: E731
        if not isinstance(z, dict):
            raise at("zero_optimization").error(f"plans[{i}].zero_optimization",
                                                f"got {z!r}; expected a table [plans.zero_optimization]")
        _unknown(zat, f"plans[{i}].zero_optimization.", z, zero_keys)
        z = _offload_table(f, z, f"plans[{i}].zero_optimization.", zat, "plans.zero_optimization.offload_optimizer", i)
        settings.update(_table_settings(f, zat, "zero_optimization", z, f"plans[{i}].zero_optimization."))
        out.append(PlanEntry(name, desc, head, settings))
    return out


SETTABLE = frozenset(field for keys in TABLES.values() for field in keys)
"""The fields a file, or a keyword of ``sim.run``, may set."""


def settings_from_values(values: dict, prefix: str = "") -> dict[str, Setting]:
    """Settings from Python values keyed by field (``tensor_model_parallel_size=2``), as
    ``sim.run`` takes them; checked like a file's values."""
    out = {}
    for field, value in values.items():
        if field not in SETTABLE:
            raise InputError(f"{prefix}{field}: unknown setting; allowed: {', '.join(sorted(SETTABLE))}")
        if value is None:
            continue
        check(Where(), f"{prefix}{field}", field, value)
        out[field] = Setting(field, f"{prefix}{field}", value, Where())
    return out


def values_of(settings: dict[str, Setting]) -> dict[str, object]:
    """The values of ``settings``, by field."""
    return {field: s.value for field, s in settings.items()}


def check(where, key: str, field: str, value) -> None:
    """Raise the error ``where`` makes (file, line and ``key``) unless ``value`` is allowed for ``field``."""
    why = schema.why_not(field, value)
    if why is not None:
        raise where.error(key, why)


def named_in(exc: InputError, settings: dict[str, Setting]) -> InputError:
    """An error about a setting, naming it as ``settings`` wrote it: the key and line of a
    file, or the keyword given in Python (``tensor_model_parallel_size``, not the plan's
    ``tp``); the error as it is when the setting is not among them."""
    f = schema.setting_field(exc.setting or exc.field or "") if exc.allowed is not None else None
    s = settings.get(f.name) if f is not None else None
    return s.where.error(s.key, exc.detail, exc) if s is not None else exc


def blame(exc: InputError, path, settings: dict[str, Setting], skip=frozenset()) -> InputError:
    """An error met while using an experiment file's values, pointed at the value it is
    about (``exc.setting``): ``exp.toml:9: cluster.gpus: got 8; must be ...``. A file that a
    value names and that failed to load is reported at that value. An error about no value
    of the file gets the file's name in front. ``skip``: settings given elsewhere (flags
    typed after the file), whose errors are left as they are."""
    if _names_file(exc, path):
        return exc
    f = schema.setting_field(exc.setting or exc.field or "")
    if f is not None and exc.allowed is not None:
        if f.name in skip:
            return exc
        if f.name in settings:
            return named_in(exc, settings)
    for dest, s in settings.items():  # a file named by a value (hf_config, topology, schedule, gpu) failed to load
        is_path = schema.FIELDS[dest].path
        if dest not in skip and is_path is not None and isinstance(s.value, str) and is_path(s.value) \
                and s.where.f is not None and (_names_file(exc, s.value) or exc.value == s.value):
            return s.where.error(s.key, f"{s.value}: {exc.allowed}" if exc.value == s.value and exc.allowed
                                 else str(exc))
    return exc.in_file(path)


def _names_file(exc: InputError, path) -> bool:
    """Whether ``exc`` is about a value read from the file ``path`` (and names it)."""
    return exc.path is not None and Path(exc.path) == Path(path)
