"""Experiment files: a model, a cluster and a plan in TOML, read strictly.

An experiment file uses the command line's names with underscores, in three tables:

    [model]    preset = "gpt3-175b"   (or hf_config = "...", or num_layers = ..., ...)
    [cluster]  gpu = "a100-80gb", nodes = 128, fabric = "rail", ...
    [plan]     tensor_model_parallel_size = 8, pipeline_model_parallel_size = 16,
               micro_batch_size = 1, global_batch_size = 1536, schedule = "1f1b", ...

Each key is checked against the flag it stands for: unknown keys, wrong types and
unknown tables are errors naming the file, line and key. The file becomes the flags it
stands for, and flags typed on the command line after it override it, so a file and
the CLI can never disagree about what a key means.

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

import argparse
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from sim.errors import InputError
from sim.inputs.tomlio import TomlFile
from sim.units import Number

# Which flags (by argparse dest) each table may set.
TABLES = {
    "model": {"model": "preset", "hf_config": None, "num_layers": None, "hidden_size": None,
              "num_attention_heads": None, "ffn_hidden_size": None, "vocab_size": None, "seq_length": None,
              "max_position_embeddings": None, "group_query_attention": None, "num_query_groups": None,
              "swiglu": None, "normalization": None, "position_embedding_type": None,
              "untie_embeddings_and_output_weights": None, "disable_bias_linear": None,
              "attention_dropout": None, "hidden_dropout": None},
    "cluster": {"gpu": None, "gpus": None, "gpus_per_node": None, "nodes": None, "topology": None,
                "fabric": None, "oversubscription": None, "fidelity": None, "max_events": None},
    "plan": {"tensor_model_parallel_size": None, "pipeline_model_parallel_size": None,
             "num_layers_per_virtual_pipeline_stage": None, "num_virtual_stages_per_pipeline_rank": None,
             "schedule": None, "decoder_first_pipeline_num_layers": None, "decoder_last_pipeline_num_layers": None,
             "account_for_embedding_in_pipeline_split": None, "account_for_loss_in_pipeline_split": None,
             "placement": None, "sequence_parallel": None, "micro_batch_size": None, "global_batch_size": None,
             "recompute_granularity": None, "zero": None, "overlap_grad_reduce": None, "bucket_size": None,
             "zero3_prefetch_depth": None, "zero_bucket_size": None},
    # DeepSpeed's names (its JSON config's "zero_optimization" object).
    "zero_optimization": {"zero": "stage", "offload_optimizer": None,
                          "zero3_prefetch_bucket_size": "stage3_prefetch_bucket_size",
                          "zero3_max_live_parameters": "stage3_max_live_parameters"},
}
_TOP = {"name", "description", *TABLES}
# Values that may be file paths, resolved against the experiment file's folder.
_PATHS = {"hf_config": lambda v: True, "topology": lambda v: v.endswith(".toml"),
          "schedule": lambda v: v.endswith(".csv"), "gpu": lambda v: v.endswith(".json")}


def _key_of(dest: str, table: str) -> str:
    """The TOML key for a flag's dest (``--model`` is ``preset`` in [model])."""
    return TABLES[table][dest] or dest


class Setting(NamedTuple):
    """One value an experiment sets: its flag's dest, its name in the file, where it was written."""

    dest: str
    key: str
    value: object
    where: "Where"


class Where:
    """Where a value was written (a file and line, or nothing for values given in Python),
    so that every error names it."""

    def __init__(self, f: TomlFile | None = None, line: int | None = None):
        self.f, self.line = f, line

    def error(self, key: str, message: str) -> InputError:
        if self.f is None:
            return InputError(f"{key}: {message}")
        if self.line is None:
            return self.f.error(key, message)
        return InputError(f"{self.f.path}:{self.line}: {key}: {message}")


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
    """By flag dest: what [model], [cluster], [plan] and [zero_optimization] set."""
    plans: list[PlanEntry] = field(default_factory=list)

    def plan_settings(self, entry: PlanEntry | None = None) -> dict[str, Setting]:
        """The file's settings with one plan's keys over them."""
        return {**self.settings, **(entry.settings if entry else {})}

    def plan(self, name: str) -> PlanEntry:
        for p in self.plans:
            if p.name == name:
                return p
        raise InputError(f"{self.path}: plans: no plan named {name!r}; the file has "
                         f"{', '.join(repr(p.name) for p in self.plans) or 'no [[plans]]'}")

    @property
    def has_model(self) -> bool:
        return any(d in TABLES["model"] for d in self.settings)


_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\-]+)\s*\]\]?\s*(#.*)?$")


def _sections(text: str) -> list[tuple[str, int, int, int]]:
    """Table headers of a TOML text: (name, occurrence of that array table, first line,
    last line), lines counted from 1."""
    heads, seen = [], {}
    lines = text.splitlines()
    for i, line in enumerate(lines, start=1):
        m = _HEADER.match(line)
        if m:
            name = m.group(2)
            k = seen.get(name, 0) if m.group(1) == "[[" else 0
            if m.group(1) == "[[":
                seen[name] = k + 1
            heads.append((name, k, i))
    out = []
    for j, (name, k, i) in enumerate(heads):
        last = heads[j + 1][2] - 1 if j + 1 < len(heads) else len(lines)
        out.append((name, k, i, last))
    return out


def _line_of(f: TomlFile, table: str, key: str | None, occurrence: int = 0) -> int | None:
    """The line of ``key`` inside table ``table`` (its ``occurrence``-th copy for an array of
    tables), or of the table's header when ``key`` is None or not found there."""
    lines = f.text.splitlines()
    pat = re.compile(rf"^\s*{re.escape(key)}\s*=") if key else None
    sections = _sections(f.text)
    parent = table.split(".")[0]
    if "." in table:  # a sub-table of the occurrence-th [[parent]]: look between it and the next
        starts = [first for name, _, first, _ in sections if name == parent]
        lo = starts[occurrence] if occurrence < len(starts) else 0
        hi = starts[occurrence + 1] if occurrence + 1 < len(starts) else len(lines) + 1
        sections = [(n, 0, a, b) for n, _, a, b in sections if lo < a < hi]
        occurrence = 0
    for name, k, first, last in sections:
        if name == table and k == occurrence:
            if pat is None:
                return first
            for i in range(first, last + 1):
                if pat.match(lines[i - 1]):
                    return i
            return first
    return None


def _table_settings(f: TomlFile, where_of, table: str, values: dict, prefix: str, actions: dict) -> dict[str, Setting]:
    """The settings of one table's values, each checked against its flag."""
    dests = TABLES[table]
    keys = {_key_of(d, table): d for d in dests if d in actions}
    out = {}
    for key, value in values.items():
        dest = keys[key]
        where = where_of(key)
        if dest in _PATHS and isinstance(value, str) and _PATHS[dest](value):
            p = Path(value)
            if not p.is_absolute() and (f.path.parent / p).exists():
                value = str(f.path.parent / p)  # relative to the experiment file
        _flag(where, f"{prefix}{key}", actions[dest], value)  # check the type now, with the line
        out[dest] = Setting(dest, f"{prefix}{key}", value, where)
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
        line = _line_of(f, sub, key, occurrence)
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


def _unknown(where, prefix: str, table: dict, allowed) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise where(key).error(f"{prefix}{key}", f"unknown key{hint}; allowed keys are {', '.join(sorted(allowed))}")


PLAN_KEYS = ("name", "description", *TABLES["plan"], "zero_optimization")
"""What a ``[[plans]]`` table may hold: its name, a description, any [plan] key, and a
``[plans.zero_optimization]`` sub-table."""


def read_experiment(path: str | Path, parser: argparse.ArgumentParser) -> Experiment:
    """Read and check an experiment file: every key known, every value of its flag's type,
    plans named uniquely. Errors name the file, the line and the key."""
    f = TomlFile(path)
    data = f.data
    if not data:
        raise InputError(f"{f.path}: empty: no tables, only comments; expected [model], [cluster] and [plan] "
                         "tables, or [[plans]]")
    f.check_keys(data, _TOP | {"plans"}, "")
    actions = {a.dest: a for a in parser._actions}
    settings: dict[str, Setting] = {}
    for table in TABLES:
        t = data.get(table, {})
        if not isinstance(t, dict):
            raise f.error(table, f"got {t!r}; expected a table [{table}]")
        keys = {_key_of(d, table): d for d in TABLES[table] if d in actions}
        _unknown(lambda k, table=table: Where(f, _line_of(f, table, k) or _where_line(f, f"{table}.{k}")),
                 f"{table}.", t, keys)
        if table == "zero_optimization":
            t = _offload_table(f, t, f"{table}.", lambda k: Where(f, _line_of(f, table, k)
                                                                  or _where_line(f, f"{table}.{k}")),
                               "zero_optimization.offload_optimizer")
        settings.update(_table_settings(  # (a key written as a sub-table: its header's line)
            f, lambda k, table=table: Where(f, _line_of(f, table, k) or _line_of(f, f"{table}.{k}", None)
                                            or _where_line(f, f"{table}.{k}")),
            table, t, f"{table}.", actions))
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise f.error(key, f"got {data[key]!r}; expected a string")
    plans = _read_plans(f, data.get("plans"), actions) if "plans" in data else []
    return Experiment(f.path, data.get("name", ""), data.get("description", ""), settings, plans)


def _where_line(f: TomlFile, key: str) -> int | None:
    m = re.match(r".*:(\d+): ", f.where(key) + " ")
    return int(m.group(1)) if m else None


def _read_plans(f: TomlFile, plans, actions: dict) -> list[PlanEntry]:
    if isinstance(plans, dict):
        raise f.error("plans", "got a single table [plans]; expected an array of tables: write [[plans]] "
                               "(double brackets) before each plan")
    if not isinstance(plans, list):
        raise f.error("plans", f"got {plans!r}; expected an array of tables, one [[plans]] per plan")
    if not plans:
        raise f.error("plans", "got an empty array; give at least one [[plans]] table")
    out: list[PlanEntry] = []
    plan_keys = {_key_of(d, "plan"): d for d in TABLES["plan"] if d in actions}
    zero_keys = {_key_of(d, "zero_optimization"): d for d in TABLES["zero_optimization"] if d in actions}
    allowed = {"name", "description", "zero_optimization", *plan_keys}
    for i, entry in enumerate(plans):
        head = _line_of(f, "plans", None, i)
        at = lambda k, i=i, head=head: Where(f, _line_of(f, "plans", k, i) if k else head)  # noqa: E731
        if not isinstance(entry, dict):
            raise at(None).error(f"plans[{i}]", f"got {entry!r}; expected a table with a name and plan keys")
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
        settings = _table_settings(f, at, "plan", values, f"plans[{i}].", actions)
        z = entry.get("zero_optimization", {})
        zat = lambda k, i=i, head=head: Where(f, _line_of(f, "plans.zero_optimization", k, i) or head)  # noqa: E731
        if not isinstance(z, dict):
            raise at("zero_optimization").error(f"plans[{i}].zero_optimization",
                                                f"got {z!r}; expected a table [plans.zero_optimization]")
        _unknown(zat, f"plans[{i}].zero_optimization.", z, zero_keys)
        z = _offload_table(f, z, f"plans[{i}].zero_optimization.", zat, "plans.zero_optimization.offload_optimizer", i)
        settings.update(_table_settings(f, zat, "zero_optimization", z, f"plans[{i}].zero_optimization.", actions))
        out.append(PlanEntry(name, desc, head, settings))
    return out


def settings_argv(settings: dict[str, Setting], parser: argparse.ArgumentParser) -> list[str]:
    """The flags that ``settings`` stand for, in table order."""
    actions = {a.dest: a for a in parser._actions}
    order = [d for t in TABLES.values() for d in t]
    argv: list[str] = []
    for dest in sorted(settings, key=lambda d: order.index(d) if d in order else len(order)):
        s = settings[dest]
        argv += _flag(s.where, s.key, actions[dest], s.value)
    return argv


def settings_from_values(values: dict, parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, Setting]:
    """Settings from Python values keyed by flag dest (``tensor_model_parallel_size=2``), as
    ``sim.run`` takes them; checked like a file's values."""
    actions = {a.dest: a for a in parser._actions}
    known = {d for t in TABLES.values() for d in t if d in actions}
    out = {}
    for dest, value in values.items():
        if dest not in known:
            raise InputError(f"{prefix}{dest}: unknown setting; allowed: {', '.join(sorted(known))}")
        if value is None:
            continue
        _flag(Where(), f"{prefix}{dest}", actions[dest], value)
        out[dest] = Setting(dest, f"{prefix}{dest}", value, Where())
    return out


def experiment_argv(path: str, parser: argparse.ArgumentParser, plan: str | None = None) -> list[str]:
    """The flags an experiment file stands for, in the order a user would type them
    (with ``plan``, those of the named ``[[plans]]`` table over the file's [plan])."""
    exp = read_experiment(path, parser)
    if plan is not None:
        return settings_argv(exp.plan_settings(exp.plan(plan)), parser)
    if exp.plans:
        raise InputError(f"{exp.path}: plans: the file lists {len(exp.plans)} plans "
                         f"({', '.join(p.name for p in exp.plans)}); `trainsim run` simulates one: "
                         f"compare them with `trainsim compare {path}`")
    return settings_argv(exp.settings, parser)


def _flag(f: TomlFile, key: str, action: argparse.Action, value) -> list[str]:
    opt = action.option_strings[0]
    if isinstance(action, argparse.BooleanOptionalAction):
        if not isinstance(value, bool):
            raise f.error(key, f"got {value!r}; expected true or false")
        return [opt] if value else [next(o for o in action.option_strings if o.startswith("--no-"))]
    if action.nargs == 0:  # store_true
        if not isinstance(value, bool):
            raise f.error(key, f"got {value!r}; expected true or false")
        return [opt] if value else []
    if isinstance(action.type, Number):  # the flag's own bounds (> 0, finite, ...)
        why = action.type.check(value)
        if why is not None:
            raise f.error(key, why)
    if action.type is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise f.error(key, f"got {value!r}; expected an integer")
    if action.type is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise f.error(key, f"got {value!r}; expected a number")
    if action.type is None and not isinstance(value, (str, int)) or isinstance(value, bool):
        raise f.error(key, f"got {value!r}; expected a string")
    if action.choices is not None and value not in action.choices:
        raise f.error(key, f"got {value!r}; allowed: {', '.join(map(str, action.choices))}")
    return [opt, str(value)]


# What a message calls a field, when it is not the flag's dest (ParallelPlan's and ModelSpec's names).
_ALIASES = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
            "vpp": "num_virtual_stages_per_pipeline_rank", "zero_stage": "zero", "recompute": "recompute_granularity",
            "first_stage_layers": "decoder_first_pipeline_num_layers",
            "last_stage_layers": "decoder_last_pipeline_num_layers", "num_key_value_heads": "num_query_groups",
            "bucket_size_bytes": "bucket_size", "zero_bucket_size_bytes": "zero_bucket_size", "sp": "sequence_parallel",
            "dp_overlap": "overlap_grad_reduce", "mlp": "swiglu", "preset": "model"}


def blame(exc: InputError, path, settings: dict[str, Setting], skip=frozenset()) -> InputError:
    """An error met while using an experiment file's values, pointed at the value it is
    about: ``--gpus: got 8; must be ...`` becomes ``exp.toml:9: cluster.gpus: got 8; must
    be ...``, and a file a value names that failed to load is reported at that value. An
    error about no value of the file gets the file's name in front. ``skip``: dests set
    elsewhere (flags typed after the file), whose errors are left as they are."""
    msg = str(exc)
    if msg.startswith(str(path)):
        return exc
    first = msg.split("\n", 1)[0]
    for dest, s in settings.items():  # a file named by a value: hf_config, topology, schedule, gpu
        if dest not in skip and dest in _PATHS and isinstance(s.value, str) and _PATHS[dest](s.value) \
                and s.where.f is not None \
                and (first.startswith(s.value) or f": got {s.value!r}" in first or f"{s.value}: " in first):
            for flag in (f"--{dest.replace('_', '-')}: ", f"{dest}: "):  # the key says it already
                msg = msg.removeprefix(flag)
            return s.where.error(s.key, msg)
    parts = first.split(": ")
    for i, part in enumerate(parts[:-1]):
        if parts[i + 1].startswith("got "):
            name = part.split()[-1].lstrip("-").replace("-", "_") if part.split() else ""
            dest = _ALIASES.get(name, name)
            if dest in skip:
                return exc
            s = settings.get(dest)
            if s is not None and s.where.f is None:  # a value given in Python, not in the file
                return exc
            if s is not None:
                return s.where.error(s.key, ": ".join(parts[i + 1:]) + msg[len(first):])
            break
    return InputError(f"{path}: {msg}")


def given_dests(argv, parser: argparse.ArgumentParser) -> set[str]:
    """The dests of the flags typed in ``argv``."""
    out = set()
    for a in parser._actions:
        for opt in a.option_strings:
            if any(t == opt or t.startswith(opt + "=") for t in argv):
                out.add(a.dest)
    return out
