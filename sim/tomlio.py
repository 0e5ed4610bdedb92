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


class TomlFile:
    """A parsed TOML file that remembers its text, to point errors at lines."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError(f"{self.path}: file not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{self.path}: cannot read: {exc}") from None
        try:
            self.data = tomllib.loads(self.text)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"{self.path}: not valid TOML: {exc}") from None

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
