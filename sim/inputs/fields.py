"""How a setting is declared: ``setting(...)``, a dataclass field whose metadata carries its
schema entry (``Field``: flag, help, type, choices, experiment-file tables). The sections
that use it live in ``sim.inputs.schema`` (cluster and plan), ``sim.inputs.schema_model``
(the model) and ``sim.inputs.schema_sim`` (simulation and output)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from sim.errors import InputError
from sim.units import Number


@dataclass(frozen=True)
class Field:
    """What the schema knows of one setting besides its name and default."""

    flag: str | None = None
    """The command-line flag (default: the name, ``--with-dashes``; Megatron-LM's spelling)."""
    help: str | Callable[[], str] | None = None
    """What it is and its unit (a callable when the text lists what is installed)."""
    type: Callable | None = None
    """How a command-line string becomes the value (a ``sim.units.Number``, ``int``, ...)."""
    choices: tuple | None = None
    kind: str = "value"
    """``value`` (takes one argument), ``switch`` (present = true), ``bool`` (``--x``/``--no-x``),
    ``list`` (one or more arguments; a list or a string in a file or the API), or for a command's
    positional arguments ``arguments`` (one or more) and ``argument`` (one; optional unless
    ``required``)."""
    metavar: str | None = None
    group: str | None = None
    """The ``--help`` section it is listed in (default: its section's; None: the command's own options)."""
    tables: tuple[tuple[str, str], ...] | None = None
    """(experiment-file table, key) pairs it may be written under (default: its section's
    table, under its name; () for none)."""
    path: Callable[[str], bool] | None = None
    """For values that may name a file: which strings do (resolved against the experiment file)."""
    name: str | None = None
    """The setting's name (keyword of ``sim.run``, experiment-file key, flag with dashes) when it is
    not the attribute's: ``ParallelPlan.tp`` is the setting ``tensor_model_parallel_size``."""
    convert: Callable | None = None
    """How a user's value becomes the attribute's of what is built from it (the plan's: ``bucket_size``
    "25MiB" -> bytes; the ``ModelSpec``'s: ``swiglu`` True -> "swiglu"); None: as is."""
    attr: str | None = None
    """The attribute that holds it (filled in by ``sim.inputs.schema``)."""
    section: str | None = None
    """The section it belongs to (filled in by ``sim.inputs.schema``)."""
    aliases: tuple[str, ...] = ()
    """Short flags that stand for it on every command that takes it (``--tp`` for
    ``--tensor-model-parallel-size``); ``trainsim search`` takes the same names for its lists."""
    required: bool = False
    """A command's option that must be given (``trainsim search --global-batch-size``)."""
    spec: str | None = None
    """A model setting's ``sim.inputs.model.ModelSpec`` attribute, where it is not the setting's
    own name (``swiglu`` fills ``mlp``, through ``convert``); None: the attribute of its own name,
    or none (``sim.inputs.schema_model.MODEL_FIELDS`` fills it in, "" for none)."""


SECTION_GROUP = object()


def setting(default=None, *, help=None, type=None, choices=None, kind: str = "value", flag: str | None = None,
            metavar: str | None = None, group=SECTION_GROUP, tables=None, path=None, name: str | None = None,
            convert=None, aliases: tuple[str, ...] = (), required: bool = False, spec: str | None = None):
    """A dataclass field with its schema entry (``Field``) in the metadata."""
    return field(default=default, metadata={"schema": (Field(
        flag, help, type, tuple(choices) if choices is not None else None, kind, metavar, None,
        None if tables is None else tuple(tables), path, name, convert, aliases=tuple(aliases),
        required=required, spec=spec), group)})


def fields_of_class(cls, section: str, default_group: str | None = None) -> list[Field]:
    """The settings a section class declares (its fields that carry ``setting(...)``), with
    their name, flag (``--with-dashes``), ``--help`` section (the class's ``GROUP``, else
    ``default_group``) and experiment-file tables (the class's ``TABLE``) filled in."""
    out = []
    for f in dataclasses.fields(cls):
        if "schema" not in f.metadata:
            continue  # not a setting (ParallelPlan.dp: the GPUs fix it)
        meta, group = f.metadata["schema"]
        name = meta.name or f.name
        table = cls.TABLE if hasattr(cls, "TABLE") else section
        out.append(dataclasses.replace(
            meta, name=name, attr=f.name, section=section, flag=meta.flag or "--" + name.replace("_", "-"),
            group=(getattr(cls, "GROUP", default_group) if group is SECTION_GROUP else group),
            tables=meta.tables if meta.tables is not None else (((table, name),) if table else ())))
    return out


def defaults_of_class(cls) -> dict[str, object]:
    """A section class's defaults, by setting name."""
    return {(f.metadata["schema"][0].name or f.name): f.default for f in dataclasses.fields(cls)
            if "schema" in f.metadata}


def check_section(obj) -> None:
    """Check every field of a section that is set to something else than its default."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is not None and value != f.default:
            allowed = why_not_field(f.metadata["schema"][0], value)
            if allowed is not None:
                raise InputError(field=f.name, value=value, allowed=allowed, setting=f.name)


def why_not_field(f: Field, value) -> str | None:
    """What a field with schema entry ``f`` allows, when ``value`` (a Python value, as from
    TOML or the API) is not allowed for it; None when it is."""
    if f.kind in ("switch", "bool"):
        return None if isinstance(value, bool) else "expected true or false"
    if f.kind == "list":
        ok = isinstance(value, str) or isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        return None if ok else "expected a list of names"
    if isinstance(f.type, Number) or hasattr(f.type, "allowed"):  # the field's own bounds (> 0, finite, ...)
        why = f.type.allowed(value)
        if why is not None:
            return why
        if not isinstance(f.type, Number):  # a type with its own check (sim.inputs.cost.PRICE) says it all
            return None
    if f.type is int and (isinstance(value, bool) or not isinstance(value, int)):
        return "expected an integer"
    if f.type is None and not isinstance(value, (str, int)) or isinstance(value, bool):
        return "expected a string"
    if f.choices is not None and value not in f.choices:
        return f"allowed: {', '.join(map(str, f.choices))}"
    return None


def name_list(value, allowed: tuple[str, ...], field: str, noun: str) -> tuple[str, ...] | None:
    """A list setting of names (recompute modules, CUDA-graph scopes) as a tuple in
    ``allowed``'s order, each once: from a list of names (the flag's words, a file's list) or a
    string of names separated by commas or spaces; None stays None. Refused, naming ``field``
    (``plan: FIELD``): a value of another type, an empty list, or a name not in ``allowed``."""
    if value is None:
        return None

    def refuse(got, what: str) -> InputError:
        return InputError(field=f"plan: {field}", value=got, allowed=what, setting=field)

    words = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if words is None or not all(isinstance(w, str) for w in words):
        raise refuse(value, f"expected {noun} names, of {', '.join(allowed)}")
    names = [n for w in words for n in w.replace(",", " ").split()]
    if not names:
        raise refuse(value, f"expected at least one {noun}, of {', '.join(allowed)}")
    for n in names:
        if n not in allowed:
            raise refuse(n, f"allowed: {', '.join(allowed)}")
    return tuple(a for a in allowed if a in names)
