"""What a hardware profile's values may be (``sim.inputs.hardware``), declared once for
pydantic, and its errors as one line each.

Every value's type and bounds are a pydantic type, written once here and put on the
profile's own fields (``HardwareProfile``, ``LinkModel``): a finite number (never a bool,
never text such as ``"132"``), an integer (``132.5`` is not one), a key from a fixed set.
Each carries an ``Allowed`` text that says in words what it accepts, units included. The
same declarations check a profile read from JSON and one built in Python
(``dataclasses.replace(profile, gpu_speed_spread=0.2)``). Numbers are checked, not
converted: a JSON integer stays an integer, as it was given.

``one_line_error`` turns pydantic's first structured error (its path, input, type) into
an ``InputError`` that names the file, the dotted path (``links.nvlink.efficiency``,
``gemm_tiles[0][1]``), the value given and the ``Allowed`` text found at that path in the
declarations; pydantic's own message text is never read.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any

import typing_extensions
from pydantic import ConfigDict, Field, Strict, ValidationError, WrapValidator, with_config
from typing_extensions import TypedDict

from sim.errors import InputError
from sim.inputs.frameworks import KERNEL_OVERHEAD_MAX_S, OVERHEAD_FRAMEWORKS

LINK_KINDS = ("nvlink", "pcie", "ib", "ethernet")
"""Link kinds a profile prices (the ``kind`` strings of topology edges)."""
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
"""Dtypes a profile may give a peak for (``fp4``: Blackwell's FP4 tensor cores, a datasheet figure
no cost uses yet)."""
MAX_SPREAD = 0.1
"""Largest ``gpu_speed_spread``: at σ = 0.1 the slowest of 16,384 GPUs would run 39% below
the mean, past the outliers of large clusters (1.5x slower than the median, but a few of
thousands: Sinha et al., SC'22)."""
NCCL_PROTOCOLS = ("ll", "ll128", "simple")
BASE_LATENCY_ALGOS = ("ring", "tree", "nvls", "nvls_tree")
"""NCCL algorithms with a base latency in a profile (``nccl_base_latency_s``)."""
NCCL_BASE_LATENCY_S = {
    "ring": {"ll": 6.6e-6, "ll128": 14.0e-6, "simple": 8.4e-6},
    "tree": {"ll": 6.8e-6, "ll128": 14.0e-6, "simple": 8.4e-6},
    "nvls": {"ll": 0.0, "ll128": 0.0, "simple": 0.0},
    "nvls_tree": {"ll": 0.0, "ll128": 0.0, "simple": 0.0},
}
"""NCCL's per-collective base latency (kernel launch and setup) by algorithm and protocol:
``baseLatencies`` in NVIDIA/nccl src/graph/tuning.cc (µs: Tree 6.8/14.0/8.4, Ring
6.6/14.0/8.4 for LL/LL128/Simple, NVLS and NVLS Tree 0), in seconds."""


@dataclass(frozen=True)
class Allowed:
    """What a value may be, in words (``a fraction in (0, 1]``): the end of its error."""

    text: str


STRICT_KEYS = ConfigDict(extra="forbid", revalidate_instances="always")
"""An object's keys are exactly its fields (unknown ones are errors), and an object given
as an instance is checked again as part of its profile."""


def _as_given(value, check):
    """``value`` checked as its declared type, but kept as given (an int stays an int)."""
    check(value)
    return value


def number(allowed: str, **bounds):
    """A finite int or float (not a bool, not text) within ``bounds``, kept as given."""
    return Annotated[float, Strict(), Field(allow_inf_nan=False, **bounds), WrapValidator(_as_given), Allowed(allowed)]


FLOP_RATE = number("a number > 0 (FLOP/s)", gt=0)
BYTE_RATE = number("a number > 0 (bytes/s)", gt=0)
FRACTION = number("a fraction in (0, 1]", gt=0, le=1)
SECONDS = number("a number >= 0 (seconds)", ge=0)
WATTS = number("a number > 0 (watts)", gt=0)
IDLE_WATTS = number("a number >= 0 (watts)", ge=0)
POSITIVE_SECONDS = number("a number > 0 (seconds)", gt=0)
COUNT = Annotated[int, Strict(), Field(gt=0), Allowed("an integer > 0")]
NAME = Annotated[str, Strict(), Field(min_length=1), Allowed("a non-empty string")]
TEXT = Annotated[str, Strict(), Allowed("a string")]
FLAG = Annotated[bool, Strict(), Allowed("true or false")]
GEMM_TILES = Annotated[
    tuple[Annotated[tuple[COUNT, COUNT, FRACTION], Allowed("[tile_m, tile_n, relative_efficiency]")], ...],
    Field(min_length=1), Allowed("a non-empty list of [tile_m, tile_n, relative_efficiency]")]
SOURCES = Annotated[dict[str, TEXT], Allowed("an object of field -> text")]
PROVENANCE = Annotated[dict[TEXT, Any], Allowed("an object of name -> value")]


def json_object(name: str, fields: dict, total: bool = True):
    """A JSON object with exactly these keys (or some of them, unless ``total``), each of its type."""
    return with_config(ConfigDict(extra="forbid"))(TypedDict(name, fields, total=total))


PEAK_FLOPS = Annotated[json_object("PeakFlops", dict.fromkeys(DTYPES, FLOP_RATE), total=False), Field(min_length=1),
                       Allowed(f"an object of dtype -> FLOP/s with one or more of {', '.join(DTYPES)}")]
NCCL_PROTOCOL_TABLE = json_object("NcclProtocols", dict.fromkeys(NCCL_PROTOCOLS, json_object("NcclProtocol", {
    "bandwidth_fraction": FRACTION, "hop_latency_nvlink_s": POSITIVE_SECONDS, "hop_latency_net_s": POSITIVE_SECONDS})))
BASE_LATENCY_TABLE = json_object("NcclBaseLatencies", dict.fromkeys(
    BASE_LATENCY_ALGOS, json_object("NcclBaseLatency", dict.fromkeys(NCCL_PROTOCOLS, SECONDS))))
ATTENTION_KERNEL_SPEEDS = Annotated[json_object("AttentionKernelSpeeds", dict.fromkeys(
    ("fa2", "triton"), json_object("AttentionKernelSpeed", {"forward": FRACTION, "backward": FRACTION})), total=False),
    Allowed("an object of kernel (fa2, triton) -> {forward, backward} fractions in (0, 1]")]

CEILING_FIELDS = ("gemm_max_efficiency", "fp8_gemm_max_efficiency", "attention_max_efficiency")
"""The efficiency fields a profile may give a ceiling for (``HardwareProfile.efficiency_ceilings``)."""
EFFICIENCY_CEILINGS = Annotated[json_object("EfficiencyCeilings", dict.fromkeys(CEILING_FIELDS, FRACTION), total=False),
    Allowed(f"an object of field ({', '.join(CEILING_FIELDS)}) -> a fraction in (0, 1]")]

FRAMEWORK_OVERHEADS = Annotated[json_object("FrameworkKernelOverheads", dict.fromkeys(
    OVERHEAD_FRAMEWORKS, number(f"a number in [0, {KERNEL_OVERHEAD_MAX_S:g}] (seconds)", ge=0,
                                le=KERNEL_OVERHEAD_MAX_S)), total=False),
    Allowed(f"an object of framework ({', '.join(OVERHEAD_FRAMEWORKS)}) -> seconds per kernel in "
            f"[0, {KERNEL_OVERHEAD_MAX_S:g}]")]



# ------------------------------------------------------------------ errors
def one_line_error(exc: ValidationError, declared, where: str) -> InputError:
    """pydantic's first error in checking ``declared`` (a dataclass), as an ``InputError``
    naming ``where``, the path, the value given and what is allowed there."""
    err = exc.errors(include_url=False)[0]
    loc, kind, value = err["loc"], err["type"], err["input"]
    names = [f.name for f in dataclasses.fields(declared)]
    if loc and isinstance(loc[0], int) and loc[0] < len(names):  # a positional argument: name its field
        loc = (names[loc[0]], *loc[1:])
    if kind == "value_error" and isinstance(err["ctx"]["error"], InputError):  # a cross-field rule
        inner = err["ctx"]["error"]
        return InputError(f"{where}: {inner}", field=f"{where}: {inner.field}", value=inner.value, allowed=inner.allowed)
    if kind in ("missing", "missing_argument", "unexpected_keyword_argument", "extra_forbidden") \
            and not isinstance(loc[-1], int):
        parent, key = loc[:-1], loc[-1]
        container = _strip(_declared(declared, parent))[0]
        known = "missing" in kind
        keys = _keys(container, required=known)
        prefix = f"{where}: {_path(parent)}: " if parent else f"{where}: "
        return InputError(f"{prefix}{'missing' if known else 'unknown'} key {key!r}; expected "
                          f"{'keys' if known else 'one of'} {', '.join(keys)}",
                          field=f"{where}: {_path(loc)}", value=None if known else value)
    if kind == "missing":  # a list too short: the list is wrong
        loc = loc[:-1]
    tp, meta = _strip(_declared(declared, loc))
    texts = [m.text for m in meta if isinstance(m, Allowed)]
    allowed = texts[0] if texts else f"an object with keys {', '.join(_keys(tp))}" if _is_object(tp) else \
        kind.replace("_", " ")
    return InputError(field=f"{where}: {_path(loc)}", value=value, allowed=f"expected {allowed}")


def _path(loc) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc if p != "[key]").lstrip(".")


def _declared(tp, loc):
    """The type declared at ``loc`` (a pydantic error's path) under ``tp``."""
    for i, part in enumerate(loc):
        if part == "[key]":  # the key before it, not its value, is wrong
            continue
        tp = _strip(tp)[0]
        args = typing.get_args(tp)
        if typing.get_origin(tp) is dict:
            tp = args[0] if loc[i + 1:i + 2] == ("[key]",) else args[1]
        elif typing.get_origin(tp) is tuple:
            tp = args[0] if args[-1] is Ellipsis else args[part]
        elif isinstance(part, str) and _is_object(tp):
            tp = typing.get_type_hints(tp, include_extras=True).get(part, Any)
        else:  # not a place the declarations have (a positional argument too many)
            return Any
    return tp


def _strip(tp) -> tuple[Any, list]:
    """``tp`` without its ``Annotated`` layers and ``None`` option, and their metadata."""
    meta = []
    while True:
        if typing.get_origin(tp) is Annotated:
            meta += tp.__metadata__
            tp = tp.__origin__
        elif typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        else:
            return tp, meta


def _is_object(tp) -> bool:
    return dataclasses.is_dataclass(tp) or typing_extensions.is_typeddict(tp)


def _keys(tp, required: bool = False) -> list[str]:
    """The keys of an object type (a dataclass or a TypedDict): all, or those it needs."""
    if dataclasses.is_dataclass(tp):
        return [f.name for f in dataclasses.fields(tp) if not required or (
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)]
    return [k for k in typing.get_type_hints(tp) if not required or k in tp.__required_keys__]
