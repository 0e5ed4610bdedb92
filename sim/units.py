"""Parsing and printing quantities at the user boundary.

Inside trainsim everything is SI (bytes, seconds, FLOP/s, bytes/s). Users type sizes
like ``1GiB`` or ``512MB``; these helpers convert once, strictly, and print back.
"""

from __future__ import annotations

import math
import re

from sim.errors import InputError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,  # nccl-tests style -b 8 -e 8G
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int | float, field: str = "size") -> int:
    """Bytes from ``'1GiB'``, ``'512MB'``, ``'8G'`` (binary, as nccl-tests), ``'4096'``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = _SIZE_RE.match(str(text))
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise InputError(
                f"{field}: got {text!r}; expected a non-negative number of bytes with an "
                "optional unit B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB, K, M, G, T (powers of 1024)"
            )
        value, unit = float(m.group(1)), m.group(2).lower()
    nbytes = value * _SIZE_UNITS[unit]
    if not math.isfinite(nbytes) or nbytes < 0:
        raise InputError(f"{field}: got {text!r}; expected a finite, non-negative size")
    return int(round(nbytes))


def format_bytes(nbytes: float) -> str:
    """``1073741824`` -> ``'1.00 GiB'``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


def format_time(seconds: float) -> str:
    """Seconds printed in the unit that reads best (s, ms or us)."""
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"
