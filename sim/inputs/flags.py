"""The settings schema on the command line: argparse flags built from its fields.

``add_arguments`` adds the flags of the fields a command takes, each with the help,
type and choices its field declares (``sim.inputs.schema``), in the field's ``--help``
section. Defaults stay in the schema, so a parsed namespace holds None for every flag
not typed and ``given`` returns just what the user typed: typed flags override an
experiment file field by field, with no round trip through argument strings.
"""

from __future__ import annotations

import argparse
import difflib
from typing import Mapping

from sim.errors import InputError
from sim.inputs.fields import Field, defaults_of_class, fields_of_class
from sim.inputs.schema import FIELDS
from sim.units import Number


def help_of(name: str) -> str | None:
    """A field's help text (some list what is installed: presets, schedules)."""
    return _help(FIELDS[name])


def _help(f: Field) -> str | None:
    return f.help() if callable(f.help) else f.help


def add_arguments(parser: argparse.ArgumentParser, names, *, groups: Mapping[str, str] | None = None,
                  helps: Mapping[str, str] | None = None) -> None:
    """Add the flags of fields ``names`` to ``parser``, each in its ``--help`` section
    (``groups`` renames a section; ``helps`` replaces a field's help). Every flag's
    default is None, so that a parsed namespace says which flags were typed
    (``given``); the schema holds the defaults."""
    add_fields(parser, [FIELDS[name] for name in names], groups=groups, helps=helps)


def add_section(parser: argparse.ArgumentParser, cls, *, groups: Mapping[str, str] | None = None,
                formats: Mapping[str, str] | None = None) -> None:
    """Add the flags (and positional arguments) of a command's own options, declared as a section
    class of ``setting(...)`` fields (``sim.inputs.schema_commands``), with the class's defaults.
    ``formats``: what a help's ``{name}`` stands for, where it lists what a higher layer holds
    (``trainsim goodput``'s failure presets)."""
    add_fields(parser, fields_of_class(cls, cls.__name__), groups=groups, defaults=defaults_of_class(cls),
               formats=formats)


POSITIONAL = {"arguments": "+", "argument": "?"}
"""The kinds of a command's positional arguments, with their argparse ``nargs`` (an ``argument``
that is ``required`` is exactly one)."""


def add_fields(parser: argparse.ArgumentParser, fields, *, groups: Mapping[str, str] | None = None,
               helps: Mapping[str, str] | None = None, defaults: Mapping[str, object] | None = None,
               formats: Mapping[str, str] | None = None) -> None:
    """Add the flags of schema entries ``fields`` (see ``add_arguments``); ``defaults``:
    the parsed defaults by name (None for those not named); ``formats``: see ``add_section``."""
    sections: dict = {}
    for f in fields:
        name = f.name
        target = parser
        if f.group is not None:
            title = (groups or {}).get(f.group, f.group)
            if title not in sections:
                sections[title] = parser.add_argument_group(title)
            target = sections[title]
        text = (helps or {}).get(name, _help(f))
        text = text.format(**formats) if formats and text else text
        if f.kind in POSITIONAL:  # (a required ``argument``: exactly one)
            nargs = None if f.required and f.kind == "argument" else POSITIONAL[f.kind]
            target.add_argument(name, metavar=f.metavar, help=text,
                                **({"nargs": nargs} if nargs else {}),
                                **({"default": (defaults or {}).get(name)} if nargs == "?" else {}))
            continue
        kw: dict = {"dest": name, "default": (defaults or {}).get(name), "help": text}
        if f.required:
            kw["required"] = True
        if f.kind == "switch":
            kw["action"] = "store_true"
            kw["default"] = bool(kw["default"]) if defaults is not None else None
        elif f.kind == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = flag_type(f)
            if f.kind == "list":
                kw["nargs"] = "+"
            if f.metavar is not None:
                kw["metavar"] = f.metavar
            elif f.choices is not None:
                kw["metavar"] = "{" + ",".join(map(str, f.choices)) + "}"
        target.add_argument(f.flag, *f.aliases, **kw)


def value_of_text(f: Field, text: str):
    """A setting's value from its text (a flag's argument, a cell of a runs file): the
    field's type and choices applied. Refused: ``InputError`` naming the flag, the text and
    what the field allows."""
    def refuse(allowed: str, shown: str):
        return InputError(field=f.flag, value=text, allowed=allowed, setting=f.name, shown=shown)

    value = text
    if isinstance(f.type, Number) or f.type is int:
        kind = f.type.kind if isinstance(f.type, Number) else int
        what = f"expected {f.type.describe()}" if isinstance(f.type, Number) else "expected an integer"
        try:
            value = kind(text)
        except ValueError:
            raise refuse(what, repr(text)) from None
        allowed = f.type.allowed(value) if isinstance(f.type, Number) else None
        if allowed is not None:
            raise refuse(allowed, repr(text) if isinstance(value, str) else text.strip())
    elif f.type is not None:
        value = f.type(text)  # its own check (stragglers' factors): an InputError naming what it allows
        allowed = f.type.allowed(value) if hasattr(f.type, "allowed") else None  # (sim.inputs.cost.PRICE)
        if allowed is not None:
            raise refuse(allowed, repr(text) if isinstance(value, str) else text.strip())
    if f.choices is not None and value not in f.choices:
        raise refuse(f"allowed: {', '.join(map(str, f.choices))}", text)
    return value


def flag_type(f: Field):
    """An argparse ``type=`` for ``value_of_text``: a refused value is an
    ``ArgumentTypeError`` saying what the field allows, which argparse reports as an
    ``ArgumentError`` naming the flag (``sim.cli``)."""
    def convert(text: str):
        try:
            return value_of_text(f, text)
        except InputError as exc:
            raise argparse.ArgumentTypeError(exc.detail if exc.allowed is not None else str(exc)) from None

    convert.__name__ = f.name or "value"
    return convert


def given(ns: argparse.Namespace) -> dict[str, object]:
    """The schema fields a parsed command line typed, by field name."""
    return {name: v for name, v in vars(ns).items() if name in FIELDS and v is not None}


def flags_of(values: Mapping[str, object]) -> list[str]:
    """The command-line arguments that stand for ``values`` (settings by field name, as a
    parsed command line or a plan holds them): the inverse of parsing them. A list is its
    items, a tuple (a layer split) its items joined by commas."""
    out: list[str] = []
    for name, v in values.items():
        f = FIELDS[name]
        if f.kind == "switch":
            out += [f.flag] if v else []
        elif f.kind == "bool":
            out.append(f.flag if v else "--no-" + f.flag[2:])
        elif f.kind == "list":
            out += [f.flag, *map(str, v if isinstance(v, (list, tuple)) else [v])]
        else:
            out += [f.flag, ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)]
    return out


def did_you_mean(typed: list[str], known: list[str]) -> str:
    """`` (did you mean --x?)`` for the unknown flags among ``typed`` that are close to one of
    ``known`` (``difflib``'s closeness, as for an experiment file's keys); "" for none."""
    hints = []
    for word in typed:
        flag = word.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        close = difflib.get_close_matches(flag, [k for k in known if k.startswith("--")], n=1)
        if close:
            hints.append((flag, close[0]))
    if not hints:
        return ""
    if len(hints) == 1:
        return f" (did you mean {hints[0][1]}?)"
    return " (did you mean " + ", ".join(f"{k} for {f}" for f, k in hints) + "?)"


def settings_markdown() -> str:
    """Every setting as a Markdown table per section (``docs/settings.md``)."""
    from sim.inputs.schema import DEFAULTS, SECTIONS, fields_of

    out = ["# Settings", "",
           "Every setting a run takes, generated from `sim/inputs/schema.py` "
           "(`python -m sim.inputs.flags > docs/settings.md`). The same field is a command-line flag, "
           "a key of an experiment file (in the table shown) and a keyword of `sim.run` (the field name).", ""]
    for section, cls in SECTIONS.items():
        out += [f"## {cls.__name__}", "", " ".join((cls.__doc__ or "").split("\n\n")[0].split()), "",
                "| setting | flag | experiment file | default | what |", "|---|---|---|---|---|"]
        for name in fields_of(section):
            meta = FIELDS[name]
            keys = ", ".join(f"`[{t}] {k}`" for t, k in meta.tables) or "(command line and API only)"
            allowed = f" ({', '.join(map(str, meta.choices))})" if meta.choices else ""
            what = ((help_of(name) or "").strip() + allowed).replace("|", "\\|")
            flags = ", ".join(f"`{x}`" for x in (meta.flag, *meta.aliases))
            out.append(f"| `{name}` | {flags} | {keys} | `{DEFAULTS[name]!r}` | {what} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(settings_markdown(), end="")
