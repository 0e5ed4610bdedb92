"""Checks of a hardware profile's numbers (``sim.inputs.hardware``): each bad value is a
one-line error naming the field, the value and what is allowed."""

from __future__ import annotations

import math

from sim.errors import InputError

LINK_KINDS = ("nvlink", "pcie", "ib", "ethernet")
"""Link kinds a profile prices (the ``kind`` strings of topology edges)."""
MAX_SPREAD = 0.1
"""Largest ``gpu_speed_spread``: at σ = 0.1 the slowest of 16,384 GPUs would run 39% below
the mean, past the outliers of large clusters (1.5x slower than the median, but a few of
thousands: Sinha et al., SC'22)."""


def is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def require_num(where: str, value, ok: bool, allowed: str) -> None:
    if not (is_num(value) and ok):
        raise InputError(f"{where}: got {value!r}; expected {allowed}")


def check_profile(p) -> None:
    if not isinstance(p.name, str) or not p.name:
        raise InputError(f"name: got {p.name!r}; expected a non-empty string")
    for dtype, v in p.peak_flops.items():
        require_num(f"peak_flops.{dtype}", v, is_num(v) and v > 0, "a number > 0 (FLOP/s)")
    for name, unit in (("hbm_bandwidth_Bps", "bytes/s"), ("hbm_capacity_bytes", "bytes")):
        v = getattr(p, name)
        require_num(name, v, is_num(v) and v > 0, f"a number > 0 ({unit})")
    sm = p.sm_count
    if isinstance(sm, bool) or not isinstance(sm, int) or sm <= 0:
        raise InputError(f"sm_count: got {sm!r}; expected an integer > 0")
    for tm, tn, rel in p.gemm_tiles:
        if tm <= 0 or tn <= 0 or not 0 < rel <= 1:
            raise InputError(f"gemm_tiles: got {[tm, tn, rel]!r}; expected tile sizes > 0 and a "
                             "relative efficiency in (0, 1]")
    for name in ("gemm_max_efficiency", "attention_max_efficiency", "memory_efficiency",
                 "framework_kernel_efficiency", "sustained_compute_fraction"):
        v = getattr(p, name)
        if v is None and name == "framework_kernel_efficiency":
            continue
        require_num(name, v, is_num(v) and 0 < v <= 1, "a fraction in (0, 1]")
    sigma = p.gpu_speed_spread
    require_num("gpu_speed_spread", sigma, is_num(sigma) and 0 <= sigma <= MAX_SPREAD,
                f"a fraction in [0, {MAX_SPREAD}]")
    if p.nvls_efficiency is not None:
        require_num("nvls_efficiency", p.nvls_efficiency, is_num(p.nvls_efficiency) and 0 < p.nvls_efficiency <= 1,
                     "a fraction in (0, 1]")
    if p.fp8_gemm_max_efficiency is not None:
        require_num("fp8_gemm_max_efficiency", p.fp8_gemm_max_efficiency,
                     is_num(p.fp8_gemm_max_efficiency) and 0 < p.fp8_gemm_max_efficiency <= 1, "a fraction in (0, 1]")
        if "fp8" not in p.peak_flops:
            raise InputError(f"fp8_gemm_max_efficiency: got {p.fp8_gemm_max_efficiency!r}; peak_flops has no fp8 "
                             "entry (give the GPU's fp8 peak, or leave the field out)")
    if p.nvls_latency_s is not None:
        require_num("nvls_latency_s", p.nvls_latency_s, is_num(p.nvls_latency_s) and p.nvls_latency_s >= 0,
                     "a number >= 0 (seconds)")
    if p.nccl_base_latency_s is not None:
        check_base_latencies(p.nccl_base_latency_s, "nccl_base_latency_s")
    if not isinstance(p.gemm_bias_epilogue, bool):
        raise InputError(f"gemm_bias_epilogue: got {p.gemm_bias_epilogue!r}; expected true or false")
    for name in ("gemm_k_overhead", "kernel_launch_s", "memory_reserve_bytes", "host_memory_bandwidth_Bps",
                 "overlap_compute_slowdown"):
        v = getattr(p, name)
        require_num(name, v, is_num(v) and v >= 0, "a number >= 0")
    for kind, link in p.links.items():
        if kind not in LINK_KINDS:
            raise InputError(f"links: unknown key {kind!r}; allowed: {', '.join(LINK_KINDS)}")
        require_num(f"links.{kind}.bandwidth_Bps", link.bandwidth_Bps,
                     is_num(link.bandwidth_Bps) and link.bandwidth_Bps > 0, "a number > 0 (bytes/s)")
        require_num(f"links.{kind}.latency_s", link.latency_s,
                     is_num(link.latency_s) and link.latency_s >= 0, "a number >= 0 (seconds)")
        require_num(f"links.{kind}.efficiency", link.efficiency,
                     is_num(link.efficiency) and 0 < link.efficiency <= 1, "a fraction in (0, 1]")


NCCL_PROTOCOLS = ("ll", "ll128", "simple")
_PROTOCOL_KEYS = ("bandwidth_fraction", "hop_latency_nvlink_s", "hop_latency_net_s")


def check_protocols(d, where: str) -> dict:
    """A profile's ``nccl_protocols``, checked strictly (one-line errors)."""
    if not isinstance(d, dict) or set(d) != set(NCCL_PROTOCOLS):
        raise InputError(f"{where}: got {d!r}; expected an object with keys {', '.join(NCCL_PROTOCOLS)}")
    for p, v in d.items():
        if not isinstance(v, dict) or set(v) != set(_PROTOCOL_KEYS):
            raise InputError(f"{where}.{p}: got {v!r}; expected keys {', '.join(_PROTOCOL_KEYS)}")
        for k, x in v.items():
            ok = not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x) and x > 0
            if not ok or (k == "bandwidth_fraction" and x > 1):
                raise InputError(f"{where}.{p}.{k}: got {x!r}; expected a number > 0"
                                 + (" and <= 1" if k == "bandwidth_fraction" else ""))
    return {p: {k: float(x) for k, x in v.items()} for p, v in d.items()}


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


def check_base_latencies(d, where: str) -> dict:
    """A profile's ``nccl_base_latency_s`` (algorithm -> protocol -> seconds), checked
    strictly (one-line errors)."""
    if not isinstance(d, dict) or set(d) != set(BASE_LATENCY_ALGOS):
        raise InputError(f"{where}: got {d!r}; expected an object with keys {', '.join(BASE_LATENCY_ALGOS)}")
    for a, v in d.items():
        if not isinstance(v, dict) or set(v) != set(NCCL_PROTOCOLS):
            raise InputError(f"{where}.{a}: got {v!r}; expected an object with keys {', '.join(NCCL_PROTOCOLS)}")
        for p, x in v.items():
            if not is_num(x) or x < 0:
                raise InputError(f"{where}.{a}.{p}: got {x!r}; expected a number >= 0 (seconds)")
    return {a: {p: float(x) for p, x in v.items()} for a, v in d.items()}
