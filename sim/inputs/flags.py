"""The settings schema on the command line: argparse flags built from its fields.

``add_arguments`` adds the flags of the fields a command takes, each with the help,
type and choices its field declares (``sim.inputs.schema``), in the field's ``--help``
section. Defaults stay in the schema, so a parsed namespace holds None for every flag
not typed and ``given`` returns just what the user typed: typed flags override an
experiment file field by field, with no round trip through argument strings.
"""

from __future__ import annotations

import argparse
from typing import Mapping

from sim.inputs.schema import FIELDS


def help_of(name: str) -> str | None:
    """A field's help text (some list what is installed: presets, schedules)."""
    h = FIELDS[name].help
    return h() if callable(h) else h


def add_arguments(parser: argparse.ArgumentParser, names, *, groups: Mapping[str, str] | None = None,
                  helps: Mapping[str, str] | None = None) -> None:
    """Add the flags of fields ``names`` to ``parser``, each in its ``--help`` section
    (``groups`` renames a section; ``helps`` replaces a field's help). Every flag's
    default is None, so that a parsed namespace says which flags were typed
    (``given``); the schema holds the defaults."""
    sections: dict = {}
    for name in names:
        f = FIELDS[name]
        target = parser
        if f.group is not None:
            title = (groups or {}).get(f.group, f.group)
            if title not in sections:
                sections[title] = parser.add_argument_group(title)
            target = sections[title]
        kw: dict = {"dest": name, "default": None, "help": (helps or {}).get(name, help_of(name))}
        if f.kind == "switch":
            kw["action"] = "store_true"
        elif f.kind == "bool":
            kw["action"] = argparse.BooleanOptionalAction
        else:
            if f.type is not None:
                kw["type"] = f.type
            if f.choices is not None:
                kw["choices"] = list(f.choices)
            if f.metavar is not None:
                kw["metavar"] = f.metavar
        target.add_argument(f.flag, **kw)


def given(ns: argparse.Namespace) -> dict[str, object]:
    """The schema fields a parsed command line typed, by field name."""
    return {name: v for name, v in vars(ns).items() if name in FIELDS and v is not None}


def settings_markdown() -> str:
    """Every setting as a Markdown table per section (``docs/settings.md``)."""
    import dataclasses

    from sim.inputs.schema import SECTIONS

    out = ["# Settings", "",
           "Every setting a run takes, generated from `sim/inputs/schema.py` "
           "(`python -m sim.inputs.flags > docs/settings.md`). The same field is a command-line flag, "
           "a key of an experiment file (in the table shown) and a keyword of `sim.run` (the field name).", ""]
    for name, cls in SECTIONS.items():
        out += [f"## {cls.__name__}", "", " ".join((cls.__doc__ or "").split()), "",
                "| field | flag | experiment file | default | what |", "|---|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            meta = FIELDS[f.name]
            keys = ", ".join(f"`[{t}] {k}`" for t, k in meta.tables) or "(command line and API only)"
            allowed = f" ({', '.join(map(str, meta.choices))})" if meta.choices else ""
            what = ((help_of(f.name) or "").strip() + allowed).replace("|", "\\|")
            out.append(f"| `{f.name}` | `{meta.flag}` | {keys} | `{f.default!r}` | {what} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(settings_markdown(), end="")
