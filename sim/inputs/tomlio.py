"""Strict reading of TOML input files.

TOML is where users describe topologies and experiments. Reading is strict: an unknown
key, a wrong type or a missing field is an ``InputError`` naming the file, the key, the
line where it appears (found by a scan of the text, since ``tomllib`` keeps no
positions) and what is allowed.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

from sim.errors import InputError
from sim.fileio import read_text


class TomlFile:
    """A parsed TOML file that remembers its text, to point errors at lines."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.text = read_text(self.path)  # missing, a folder, empty, not UTF-8: one line naming the file
        try:
            self.data = tomllib.loads(self.text)
        except tomllib.TOMLDecodeError as exc:
            # tomllib's own message: Python 3.14 gives the line as ``lineno``, 3.11-3.13 only
            # inside the text (the only message read back here, and it is the library's)
            msg = str(exc)
            m = re.search(r"\(at line (\d+), column \d+\)$", msg)
            line = getattr(exc, "lineno", None) or (int(m.group(1)) if m else None)
            if line is None:  # "(at end of document)": the last line
                line = max(1, len(self.text.rstrip("\n").split("\n")))
                msg += "; the file looks truncated"
            raise InputError(f"{self.path}:{line}: not valid TOML ({msg})", path=str(self.path), line=line) from None

    def table(self, data: dict, key: str, prefix: str = "", default=None) -> dict:
        """``data[key]`` checked to be a table (``{}`` or ``default`` when absent)."""
        if key not in data:
            return {} if default is None else default
        value = data[key]
        if not isinstance(value, dict):
            raise self.error(f"{prefix}{key}", f"got {value!r}; expected a table [{prefix}{key}]")
        return value

    def tables(self, data: dict, key: str) -> list[dict]:
        """``data[key]`` checked to be an array of tables (``[[key]]``), each a dict."""
        value = data.get(key, [])
        if isinstance(value, dict):
            raise self.error(key, f"got a single table [{key}]; expected an array of tables: write [[{key}]]")
        if not isinstance(value, list):
            raise self.error(key, f"got {value!r}; expected an array of tables ([[{key}]])")
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise self.error(f"{key}[{i}]", f"got {item!r}; expected a table ([[{key}]])")
        return value

    def line(self, key: str) -> int | None:
        """The line where ``key`` (its last dotted part) is first written, or None."""
        leaf = key.rsplit(".", 1)[-1].split("[")[0]
        pat = re.compile(rf"^\s*(\[\[?\s*)?{re.escape(leaf)}\s*(=|\]|\.)")
        for i, line in enumerate(self.text.splitlines(), start=1):
            if pat.match(line):
                return i
        return None

    def where(self, key: str) -> str:
        """``'file.toml:12: key'`` where the key is first written, or ``'file.toml: key'``."""
        line = self.line(key)
        return f"{self.path}:{line}: {key}" if line is not None else f"{self.path}: {key}"

    def error(self, key: str, message: str) -> InputError:
        """The error ``'file.toml:12: key: message'``, with the file, line and key recorded."""
        return InputError(f"{self.where(key)}: {message}", field=key, path=str(self.path), line=self.line(key))

    def missing(self, key: str) -> InputError:
        """A required key that is not there: ``'file.toml: key: missing required field'``."""
        return InputError(f"{self.path}: {key}: missing required field", field=key, path=str(self.path))

    def check_keys(self, table: dict, allowed: set[str] | dict, prefix: str, required=()) -> None:
        """Unknown keys and missing required keys are errors naming the key."""
        if not isinstance(table, dict):
            name = prefix.rstrip(".") or "file"
            raise self.error(name, f"got {table!r}; expected a table [{name}]")
        for key in table:
            if key not in allowed:
                raise self.error(
                    f"{prefix}{key}", f"unknown key; allowed keys are {', '.join(sorted(allowed))}"
                )
        for key in required:
            if key not in table:
                raise self.missing(f"{prefix}{key}")

    def number(self, table: dict, key: str, prefix: str, *, positive=False, default=None,
               integer=False, minimum=None) -> float:
        """A finite number (int or float in TOML) at ``table[key]``, checked."""
        if key not in table:
            if default is None:
                raise self.missing(f"{prefix}{key}")
            return default
        value = table[key]
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            what = "an integer" if integer else "a number"
            raise self.error(f"{prefix}{key}", f"got {value!r}; expected {what}")
        if not math.isfinite(value):
            raise self.error(f"{prefix}{key}", f"got {value!r}; expected a finite number")
        if positive and value <= 0:
            raise self.error(f"{prefix}{key}", f"got {value!r}; expected a number > 0")
        if minimum is not None and value < minimum:
            raise self.error(f"{prefix}{key}", f"got {value!r}; expected a number >= {minimum}")
        return value

    def string(self, table: dict, key: str, prefix: str, *, choices=None, default=None) -> str:
        if key not in table:
            if default is None:
                raise self.missing(f"{prefix}{key}")
            return default
        value = table[key]
        if not isinstance(value, str):
            raise self.error(f"{prefix}{key}", f"got {value!r}; expected a string")
        if choices is not None and value not in choices:
            raise self.error(f"{prefix}{key}", f"got {value!r}; allowed: {', '.join(choices)}")
        return value


# Where a key was written: the line of a key inside a table (or an array of tables'
# n-th copy), for errors that point at a value checked after the file was parsed.
_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\-]+)\s*\]\]?\s*(#.*)?$")


def table_spans(text: str) -> list[tuple[str, int, int, int]]:
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


def line_of(f: TomlFile, table: str, key: str | None, occurrence: int = 0) -> int | None:
    """The line of ``key`` inside table ``table`` (its ``occurrence``-th copy for an array of
    tables), or of the table's header when ``key`` is None or not found there."""
    lines = f.text.splitlines()
    pat = re.compile(rf"^\s*{re.escape(key)}\s*=") if key else None
    sections = table_spans(f.text)
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


def where_line(f: TomlFile, key: str) -> int | None:
    return f.line(key)
