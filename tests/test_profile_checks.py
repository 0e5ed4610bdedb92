"""A hardware profile's values are declared once (``sim.inputs.profile_checks``) and checked
the same way whether the profile is read from JSON or built in Python; a number is checked,
never converted; every bad value is one line naming the path, the value and what is allowed."""

import dataclasses
import json
import pickle
import typing

import pytest

from sim.errors import InputError
from sim.inputs.hardware import PRESETS, HardwareProfile, LinkModel, load_profile
from sim.inputs.profile_checks import Allowed

H100 = load_profile("h100-sxm")

# (path in the JSON, a bad value, what the error must say is allowed)
BAD = [
    ("sm_count", 132.5, "an integer > 0"),
    ("sm_count", True, "an integer > 0"),
    ("hbm_bandwidth_Bps", "3e12", "a number > 0 (bytes/s)"),
    ("hbm_capacity_bytes", float("inf"), "a number > 0 (bytes)"),
    ("peak_flops.bf16", False, "a number > 0 (FLOP/s)"),
    ("gemm_max_efficiency", 1.01, "a fraction in (0, 1]"),
    ("gemm_k_overhead", -1, "a number >= 0 (units of k)"),
    ("kernel_launch_s", float("nan"), "a number >= 0 (seconds)"),
    ("links.nvlink.efficiency", 0, "a fraction in (0, 1]"),
    ("links.ib.latency_s", -1e-6, "a number >= 0 (seconds)"),
    ("nccl_protocols.ll.bandwidth_fraction", 1.5, "a fraction in (0, 1]"),
    ("nccl_protocols.simple.hop_latency_net_s", 0, "a number > 0 (seconds)"),
    ("nccl_base_latency_s.ring.simple", -1, "a number >= 0 (seconds)"),
    ("gpu_speed_spread", 0.11, "a fraction in [0, 0.1]"),
    ("gemm_bias_epilogue", 1, "true or false"),
    ("profiler_op_overhead_s", -2e-6, "a number >= 0 (seconds)"),
    ("name", "", "a non-empty string"),
]


def _set(d: dict, path: str, value) -> dict:
    d = json.loads(json.dumps(d))
    *head, last = path.split(".")
    inner = d
    for key in head:
        inner = inner[key]
    inner[last] = value
    return d


def _replaced(d: dict) -> dict:
    """``d`` (a profile's JSON) as keywords of ``dataclasses.replace``: links as LinkModels."""
    return {**d, "links": {k: LinkModel(**v) for k, v in d["links"].items()},
            "gemm_tiles": tuple(tuple(t) for t in d["gemm_tiles"])}


@pytest.mark.parametrize("path, value, allowed", BAD, ids=[f"{p}={v!r}" for p, v, _ in BAD])
def test_a_bad_value_is_the_same_one_line_error_from_json_and_from_python(path, value, allowed):
    d = _set(H100.to_dict(), path, value)
    with pytest.raises(InputError) as read:
        HardwareProfile.from_dict(d, where="gpu.json")
    with pytest.raises(InputError) as built:
        dataclasses.replace(H100, **_replaced(d))
    expected = f"{path}: got {value!r}; expected {allowed}"
    assert str(read.value) == f"gpu.json: {expected}"
    assert str(built.value) == f"profile {d['name']!r}: {expected}"


def test_numbers_are_checked_not_converted():
    # A JSON integer stays an integer (the presets' byte counts), a float a float, and a
    # preset written back is the same text it was read from.
    for name in PRESETS:
        p = load_profile(name)
        again = HardwareProfile.from_dict(json.loads(json.dumps(p.to_dict())))
        assert json.dumps(again.to_dict()) == json.dumps(p.to_dict())
    a100 = load_profile("a100-80gb")
    assert type(a100.hbm_capacity_bytes) is int and a100.hbm_capacity_bytes == 80 * 2**30
    assert type(a100.hbm_bandwidth_Bps) is float and type(a100.sm_count) is int
    assert dataclasses.replace(a100, gemm_k_overhead=0).gemm_k_overhead == 0
    assert type(dataclasses.replace(a100, gemm_k_overhead=0).gemm_k_overhead) is int
    # lists from JSON become the tuples a profile holds
    assert a100.gemm_tiles[0] == (256, 128, 1.0) and isinstance(a100.gemm_tiles, tuple)


def test_keys_are_named_with_what_is_allowed():
    d = H100.to_dict()
    cases = {
        "unknown key 'turbo'; expected one of name, peak_flops, ": {**d, "turbo": 1},
        "links: unknown key 'wifi'; expected one of nvlink, pcie, ib, ethernet":
            _set(d, "links.wifi", d["links"]["ib"]),
        "links.ib: missing key 'efficiency'; expected keys latency_s, bandwidth_Bps, efficiency":
            {**d, "links": {**d["links"], "ib": {"latency_s": 0, "bandwidth_Bps": 1}}},
        "peak_flops: unknown key 'fp6'; expected one of fp32, tf32, bf16, fp16, fp8, fp4": _set(d, "peak_flops.fp6", 1.0),
        "nccl_protocols: missing key 'll128'; expected keys ll, ll128, simple":
            {**d, "nccl_protocols": {k: v for k, v in d["nccl_protocols"].items() if k != "ll128"}},
        "gemm_tiles[1]: got [128, 128]; expected [tile_m, tile_n, relative_efficiency]":
            {**d, "gemm_tiles": [[256, 128, 1.0], [128, 128]]},
        "gemm_tiles[0][1]: got 'x'; expected an integer > 0": {**d, "gemm_tiles": [[256, "x", 1.0]]},
        "sources: got 'colour'; expected keys naming fields: name, ": _set(d, "sources.colour", "x"),
        "fp8_gemm_max_efficiency: got 0.5; peak_flops has no fp8 entry":
            {**d, "peak_flops": {"bf16": 1e15}, "fp8_gemm_max_efficiency": 0.5},
        # a ceiling is for one of the three efficiency fields trainsim fit bounds, and is a fraction
        "efficiency_ceilings: unknown key 'gemm_k_overhead'; expected one of gemm_max_efficiency, "
        "fp8_gemm_max_efficiency, attention_max_efficiency": _set(d, "efficiency_ceilings.gemm_k_overhead", 0.5),
        "efficiency_ceilings.gemm_max_efficiency: got 1.5; expected a fraction in (0, 1]":
            _set(d, "efficiency_ceilings.gemm_max_efficiency", 1.5),
    }
    for says, data in cases.items():
        with pytest.raises(InputError) as e:
            HardwareProfile.from_dict(data, where="gpu.json")
        assert str(e.value).startswith(f"gpu.json: {says}") and "\n" not in str(e.value), str(e.value)


def test_a_positional_argument_is_named_by_its_field():
    with pytest.raises(InputError, match=r"^profile 'x': peak_flops\.bf16: got -1; expected a number > 0"):
        HardwareProfile("x", {"bf16": -1}, 1.0, 1.0, 1, ((1, 1, 1.0),), 0, 1, 1, 1, 0, {})


def test_every_value_declares_what_it_allows():
    # Each leaf of the declarations (a number, a string, a flag) carries its Allowed text,
    # which is the end of its error: a new field cannot fall back to pydantic's wording.
    def leaves(tp, path):
        meta = []
        while typing.get_origin(tp) is typing.Annotated or type(None) in typing.get_args(tp):
            if typing.get_origin(tp) is typing.Annotated:
                meta += tp.__metadata__
                tp = tp.__origin__
            else:
                tp = next(a for a in typing.get_args(tp) if a is not type(None))
        hints = typing.get_type_hints(tp, include_extras=True) if isinstance(tp, type) and (
            dataclasses.is_dataclass(tp) or hasattr(tp, "__required_keys__")) else None
        if hints is not None:
            for key, sub in hints.items():
                yield from leaves(sub, f"{path}.{key}")
        elif typing.get_origin(tp) in (tuple, dict):
            for sub in typing.get_args(tp)[-1:] if typing.get_origin(tp) is dict else typing.get_args(tp):
                if sub is not Ellipsis:
                    yield from leaves(sub, f"{path}[]")
        else:
            yield path, tp, [m.text for m in meta if isinstance(m, Allowed)]

    found = list(leaves(HardwareProfile, "profile"))
    assert len(found) > 40
    missing = [path for path, tp, texts in found if not texts and tp is not typing.Any]
    assert missing == []


def test_a_profile_pickles_and_compares_as_before():
    p = dataclasses.replace(H100, sources={}, provenance={"host": "x"})
    assert pickle.loads(pickle.dumps(p)) == p == H100 and hash(p) == hash(H100)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.sm_count = 1
