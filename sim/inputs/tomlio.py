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
            msg = str(exc)
            m = re.search(r"\(at line (\d+), column \d+\)$", msg)
            if m:
                line = int(m.group(1))
            else:  # "(at end of document)": the last line
                line = max(1, len(self.text.rstrip("\n").split("\n")))
                msg += "; the file looks truncated"
            raise InputError(f"{self.path}:{line}: not valid TOML ({msg})") from None

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

    def where(self, key: str) -> str:
        """``'file.toml:12: key'`` where the key is first written, or ``'file.toml: key'``."""
        leaf = key.rsplit(".", 1)[-1].split("[")[0]
        pat = re.compile(rf"^\s*(\[\[?\s*)?{re.escape(leaf)}\s*(=|\]|\.)")
        for i, line in enumerate(self.text.splitlines(), start=1):
            if pat.match(line):
                return f"{self.path}:{i}: {key}"
        return f"{self.path}: {key}"

    def error(self, key: str, message: str) -> InputError:
        return InputError(f"{self.where(key)}: {message}")

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
                raise InputError(f"{self.path}: {prefix}{key}: missing required field")

    def number(self, table: dict, key: str, prefix: str, *, positive=False, default=None,
               integer=False, minimum=None) -> float:
        """A finite number (int or float in TOML) at ``table[key]``, checked."""
        if key not in table:
            if default is None:
                raise InputError(f"{self.path}: {prefix}{key}: missing required field")
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
                raise InputError(f"{self.path}: {prefix}{key}: missing required field")
            return default
        value = table[key]
        if not isinstance(value, str):
            raise self.error(f"{prefix}{key}", f"got {value!r}; expected a string")
        if choices is not None and value not in choices:
            raise self.error(f"{prefix}{key}", f"got {value!r}; allowed: {', '.join(choices)}")
        return value
