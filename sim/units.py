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
            raise InputError(field=field, value=text, allowed=(
                "expected a non-negative number of bytes with an optional unit B, KB, MB, GB, TB (powers of 1000) "
                "or KiB, MiB, GiB, TiB, K, M, G, T (powers of 1024)"))
        value, unit = float(m.group(1)), m.group(2).lower()
    nbytes = value * _SIZE_UNITS[unit]
    if not math.isfinite(nbytes) or nbytes < 0:
        raise InputError(field=field, value=text, allowed="expected a finite, non-negative size")
    return int(round(nbytes))


def format_bytes(nbytes: float) -> str:
    """``1073741824`` -> ``'1.00 GiB'``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


def format_time(seconds: float) -> str:
    """Seconds printed in the unit that reads best (s, ms or us); a negative time in the
    unit its size reads best in, ``-0.0779`` -> ``'-77.858 ms'``."""
    if seconds < 0:
        return "-" + format_time(-seconds)
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"


def format_microbatches(count: int, size: int, seq_length: int) -> str:
    """``16 micro-batches of 1 x 4096 tokens``: how many micro-batches, of how many
    sequences, of how many tokens (the one notation run, estimate and the demo print)."""
    return f"{count} micro-batch{'es' if count != 1 else ''} of {size} x {seq_length} tokens"


class Number:
    """An argparse ``type=`` for a bounded number, whose error says what is allowed.

    ``Number(int, minimum=1)`` parses ``'8'`` and refuses ``'-8'``, ``'4.5'`` and ``'x'``
    with ``got -8; expected an integer >= 1``; floats refuse ``nan`` and (unless
    ``allow_inf``) infinities. Experiment files check their values with ``check``, so a
    flag and its TOML key accept exactly the same numbers.
    """

    def __init__(self, kind=int, *, minimum=None, maximum=None, above=None, allow_inf: bool = False):
        self.kind, self.minimum, self.maximum, self.above, self.allow_inf = kind, minimum, maximum, above, allow_inf
        self.__name__ = "integer" if kind is int else "number"  # argparse's name for the type

    def describe(self) -> str:
        what = "an integer" if self.kind is int else "a finite number" if not self.allow_inf else "a number"
        bounds = []
        if self.above is not None:
            bounds.append(f"> {self.above:g}")
        if self.minimum is not None and self.maximum is not None:
            return f"{what} in [{self.minimum:g}, {self.maximum:g}]"
        if self.minimum is not None:
            bounds.append(f">= {self.minimum:g}")
        if self.maximum is not None:
            bounds.append(f"<= {self.maximum:g}")
        return " ".join([what, *bounds]) + (" (inf allowed)" if self.allow_inf else "")

    def allowed(self, value) -> str | None:
        """What is allowed (``expected an integer >= 1``) when ``value`` (already a Python
        number) is not, or None."""
        if isinstance(value, bool) or not isinstance(value, (int, float) if self.kind is float else int) \
                or math.isnan(value) or (math.isinf(value) and not self.allow_inf) \
                or (self.minimum is not None and value < self.minimum) \
                or (self.maximum is not None and value > self.maximum) \
                or (self.above is not None and value <= self.above):
            return f"expected {self.describe()}"
        return None

    def check(self, value) -> str | None:
        """Why ``value`` (already a Python number) is not allowed, or None."""
        allowed = self.allowed(value)
        return None if allowed is None else f"got {value!r}; {allowed}"

    def __call__(self, text: str):
        import argparse

        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"got {text!r}; expected {self.describe()}") from None
        why = self.check(value)
        if why is not None:
            raise argparse.ArgumentTypeError(f"got {str(text).strip()}; expected {self.describe()}")
        return value

    def __repr__(self) -> str:
        return f"Number({self.describe()})"


class Duration:
    """An argparse ``type=`` for a positive length of time, in seconds: ``90``, ``90s``,
    ``10m``, ``1.5h``, ``1h30m``, ``2m30s``. Its error says what is allowed."""

    _PART = re.compile(r"([0-9]*\.?[0-9]+)\s*([hms]?)")
    _SCALE = {"h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}
    __name__ = "duration"
    ALLOWED = "expected a duration > 0: seconds, or with units h, m, s (90, 90s, 10m, 1.5h, 1h30m)"

    def __call__(self, text: str) -> float:
        import argparse

        s = str(text).strip().lower()
        parts = self._PART.findall(s)
        units = [u for _, u in parts]
        ok = bool(parts) and "".join(v + u for v, u in parts) == s.replace(" ", "") \
            and len(set(units)) == len(units) and ("" not in units or len(parts) == 1)
        seconds = sum(float(v) * self._SCALE[u] for v, u in parts) if ok else 0.0
        if not ok or not math.isfinite(seconds) or seconds <= 0:
            raise argparse.ArgumentTypeError(f"got {str(text).strip()!r}; {self.ALLOWED}")
        return seconds


def format_duration(seconds: float) -> str:
    """``90`` -> ``'1m30s'``, ``3600`` -> ``'1h'``, ``2.5`` -> ``'2.5s'``."""
    h, rest = divmod(seconds, 3600)
    m, sec = divmod(rest, 60)
    out = (f"{int(h)}h" if h else "") + (f"{int(m)}m" if m else "") + (f"{sec:g}s" if sec or not (h or m) else "")
    return out


POSITIVE_INT = Number(int, minimum=1)
"""Counts and sizes: GPUs, nodes, layers, batch sizes, parallel sizes."""
NONNEGATIVE_INT = Number(int, minimum=0)
"""Counts that may be 0 (prefetch depth, warm-up iterations, workers)."""
FRACTION = Number(float, minimum=0, maximum=1)
"""Probabilities such as dropout."""
