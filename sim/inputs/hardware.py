"""What one GPU and its links can do: the calibrated hardware profile.

A ``HardwareProfile`` holds the numbers every cost in trainsim comes from: peak FLOP/s
per dtype, HBM bandwidth and capacity, a GEMM efficiency model, the efficiency of
memory-bound kernels, a fixed per-kernel overhead, and per link kind (``nvlink``,
``pcie``, ``ib``, ``ethernet``, the ``kind`` strings of topology edges) an α-β model
with an efficiency factor: a transfer of n bytes takes ``latency_s + n /
(bandwidth_Bps · efficiency)``, where ``bandwidth_Bps`` is the per-direction line rate
(what a topology edge carries) and ``efficiency`` the fraction NCCL achieves on it.

GEMM efficiency (fraction of peak) of an m × n × k product, batched ``batch`` times, is

    best · max over tiles (r_tile · tile_q · wave_q) · k / (k + k0)

where ``best`` is the measured best large-GEMM efficiency (Bekman's "maximum achievable
matmul FLOPS": 267.9 TFLOP/s on A100 SXM), each candidate output tile (tm × tn, either
orientation, with a relative efficiency r_tile, as cuBLAS picks among kernels
``..._256x128_...``, ``..._128x128_...``) loses

    tile_q = m·n / (⌈m/tm⌉·tm · ⌈n/tn⌉·tn)             (tile quantization)
    wave_q = T / (⌈T / SMs⌉ · SMs),  T = ⌈m/tm⌉⌈n/tn⌉·batch   (wave quantization)

and k0 is a prologue/epilogue cost in units of k. It never exceeds ``best``. Calibration
(a later issue) fits the same fields from measured kernels and writes a profile JSON
that loads into this type; presets live in ``sim/profiles/*.json`` with a ``sources``
entry naming where each number comes from.

Each field's type says what it may be (``sim.inputs.profile_checks``: a fraction in (0, 1],
an integer > 0, ...), and pydantic checks every profile when it is made, read from JSON
(``from_dict``, ``load_profile``) or built in Python (``dataclasses.replace`` too); a bad
value is a one-line ``InputError`` naming the profile, the field's path and the value.
"""

import json
import math
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Annotated

import pydantic
from pydantic import TypeAdapter, ValidationError, with_config

from sim.errors import InputError
from sim.inputs.profile_checks import (
    ATTENTION_KERNEL_SPEEDS, BASE_LATENCY_TABLE, BYTE_RATE, COUNT, EFFICIENCY_CEILINGS, FLAG, FRACTION, FRAMEWORK_OVERHEADS, GEMM_TILES,
    LINK_KINDS, MAX_SPREAD, IDLE_WATTS, NAME, NCCL_PROTOCOL_TABLE, PEAK_FLOPS, PROVENANCE, SECONDS, SOURCES, STRICT_KEYS, WATTS, Allowed,
    json_object, number, one_line_error)

PRESETS = ("a100-80gb", "h100-sxm", "h200", "b200", "gb200", "gb300")

CAUSAL_KEY_BLOCK = 128
"""Keys per block a flash-attention kernel's inner loop takes (FlashAttention-2/3's kBlockN
for head dim 128 on Hopper and Blackwell, FlashAttention-4's 128x128 tiles; cuDNN's fused
attention tiles alike)."""


ATTENTION_REFERENCE_HEAD_DIM = 128
"""The head width of the flash-attention benchmarks the profiles' ``attention_max_efficiency``
comes from (FlashAttention-3's H100 figures, cuDNN's SDPA training benchmark on the Blackwell
GPUs: head dim 128); ``HardwareProfile.attention_head_factor`` is 1 there."""


def causal_work_fraction(seq_k: int) -> float:
    """The share of the project's attention FLOP count (non-causal, the papers' convention:
    every query against all ``seq_k`` keys) that a causal flash kernel computes. The kernel
    stops each query block's loop over key blocks at the diagonal (Dao-AILab/flash-attention
    csrc/flash_attn/src/flash_fwd_kernel.h: ``n_block_max = min(n_block_max, ceil_div((m_block
    + 1) * kBlockM + seqlen_k - seqlen_q, kBlockN))`` when ``Is_causal``; hopper/block.h
    ``get_n_block_min_max`` the same; the backward likewise), computing the diagonal block
    whole: with T = seq_k / 128 blocks, query block i computes i + 1 of them, (T + 1) / 2T of
    the T² = 1/2 + 64/seq_k. The kernels' published throughputs (FlashAttention's
    benchmarks/benchmark_flash_attention.py ``flops``: 4·b·s²·h·d // (2 if causal else 1);
    the FlashAttention-3 and -4 papers, cuDNN's) count the work done, which is what
    ``attention_max_efficiency`` is. Context parallelism's off-diagonal ring steps (whole
    half blocks, no diagonal) are priced the same, 64/seq_k slow."""
    return min(1.0, 0.5 + CAUSAL_KEY_BLOCK / (2.0 * seq_k))



@with_config(STRICT_KEYS)
@dataclass(frozen=True)
class LinkModel:
    """α-β model of one link kind: per-direction line rate, achieved fraction, latency.
    Its values are checked as part of a profile (``HardwareProfile.links``)."""

    latency_s: SECONDS
    bandwidth_Bps: BYTE_RATE
    efficiency: FRACTION

    @property
    def effective_Bps(self) -> float:
        return self.bandwidth_Bps * self.efficiency

    def time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` over one link of this kind (no contention)."""
        return self.latency_s + nbytes / self.effective_Bps


LINKS = Annotated[json_object("Links", dict.fromkeys(LINK_KINDS, LinkModel), total=False),
                  Allowed(f"an object of link kind ({', '.join(LINK_KINDS)}) -> {{latency_s, bandwidth_Bps, efficiency}}")]
"""A profile's links; none is allowed (one GPU alone), and ``calibrate`` starts from none."""


class FrozenDict(dict):
    """A profile's table (``peak_flops``, ``links``, ``nccl_protocols``, ...): a dict that
    refuses changes in place, so that a profile's content, and the hash it keeps, never
    change. A changed profile is a new one (``dataclasses.replace``)."""

    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise TypeError("a profile's tables cannot be changed in place; make a changed profile with "
                        "dataclasses.replace(profile, field=...)")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self):
        return FrozenDict, (dict(self),)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


def _frozen(value):
    """``value`` with every dict in it a ``FrozenDict``."""
    if isinstance(value, dict):
        return FrozenDict({k: _frozen(v) for k, v in value.items()})
    return value


def _one_line_errors(cls):
    """``cls`` whose construction (``cls(...)``, ``dataclasses.replace``) raises a one-line
    ``InputError`` naming the profile, where pydantic would raise its ``ValidationError``."""
    check = cls.__init__

    def __init__(self, *args, **kwargs):
        try:
            check(self, *args, **kwargs)
        except ValidationError as exc:
            raise one_line_error(exc, cls, f"profile {kwargs.get('name', args[0] if args else None)!r}") from None

    cls.__init__ = __init__
    return cls


@_one_line_errors
@pydantic.dataclasses.dataclass(frozen=True, config=STRICT_KEYS)
class HardwareProfile:
    """One GPU model and the links around it, in SI units. Each field's type declares what
    it may be (``sim.inputs.profile_checks``); pydantic checks it whenever a profile is made."""

    name: NAME
    peak_flops: PEAK_FLOPS
    """Dense peak FLOP/s per dtype (keys from DTYPES); 'fp32' is the non-tensor-core rate."""
    hbm_bandwidth_Bps: BYTE_RATE
    hbm_capacity_bytes: number("a number > 0 (bytes)", gt=0)
    sm_count: COUNT
    gemm_tiles: GEMM_TILES
    """Candidate output tiles as (tile_m, tile_n, relative efficiency)."""
    gemm_k_overhead: number("a number >= 0 (units of k)", ge=0)
    """k0: fixed per-tile cost (prologue/epilogue) in units of the k dimension."""
    gemm_max_efficiency: FRACTION
    """Measured best dense GEMM throughput as a fraction of peak (the model's cap)."""
    attention_max_efficiency: FRACTION
    """Best fused (flash) attention throughput as a fraction of peak."""
    memory_efficiency: FRACTION
    """Fraction of hbm_bandwidth_Bps that memory-bound kernels reach."""
    kernel_launch_s: SECONDS
    """Fixed cost added to every kernel."""
    links: LINKS
    """Link kind -> LinkModel."""
    memory_reserve_bytes: number("a number >= 0 (bytes)", ge=0) = 0.0
    """HBM no tensor can use: CUDA context, communication buffers, allocator fragmentation."""
    host_memory_bandwidth_Bps: number("a number >= 0 (bytes/s)", ge=0) = 0.0
    """Host (CPU) memory bandwidth of the node, shared by its GPUs: bounds the CPU optimizer
    step under ZeRO-Offload. 0 means unknown (offload then cannot be simulated)."""
    framework_kernel_efficiency: FRACTION | None = None
    """Fraction of hbm_bandwidth_Bps that the training framework's own elementwise
    kernels reach (Megatron-LM's torch.compile fusions: bias-GeLU, bias-SwiGLU,
    bias-dropout-add; PyTorch's eager ops in the cross-entropy and the embedding), which
    run well below tuned library kernels (norms, flash attention: ``memory_efficiency``).
    None: the same as ``memory_efficiency``."""
    framework_kernel_overhead_s: FRAMEWORK_OVERHEADS | None = None
    """PyTorch-native framework (``sim.inputs.frameworks.OVERHEAD_FRAMEWORKS``) -> seconds
    each of its kernels costs on this GPU over Megatron-Core's (the eager path and FSDP's
    hooks between kernels, ``sim.inputs.frameworks``), fitted per framework by ``trainsim
    fit --params framework_kernel_overhead_s.NAME``. None, or a framework it does not
    list: 0."""

    sustained_compute_fraction: FRACTION = 1.0
    """Fraction of the microbenchmark throughput of compute-bound kernels (GEMMs and
    attention: ``gemm_max_efficiency``, ``attention_max_efficiency``, measured on kernels
    run alone for a short while) that a GPU sustains through whole training steps. Under
    a whole model's continuous power draw the SM clock settles below the boost clock a
    short benchmark runs at (the HBM clock does not move: memory-bound kernels keep
    ``memory_efficiency``), and each kernel shares L2 with its neighbours. 1: the
    microbenchmark's. Fitted to published runs (``trainsim fit``)."""

    overlap_compute_slowdown: number("a number >= 0", ge=0) = 0.0
    """σ: while an NCCL kernel (a send, receive or collective on another stream) runs on a
    GPU, the GPU's compute kernels take (1 + σ) times as long: NCCL holds some SMs (one
    thread block per channel) and HBM bandwidth. 0: overlap is free."""

    nccl_protocols: NCCL_PROTOCOL_TABLE | None = None
    """NCCL protocol -> {bandwidth_fraction, hop_latency_nvlink_s, hop_latency_net_s}
    (``sim.engine.nccl``: LL and LL128 relative to Simple). None: NCCL's tuning constants."""
    nvls_efficiency: FRACTION | None = None
    """Fraction of the NVLink line rate a GPU's NVLS (NVLink SHARP) traffic reaches. None: 1."""
    nvls_latency_s: SECONDS | None = None
    """Latency of one NVLS collective. None: NCCL's tuning constant (25 µs)."""
    nccl_base_latency_s: BASE_LATENCY_TABLE | None = None
    """NCCL algorithm (ring, tree, nvls, nvls_tree) -> protocol (ll, ll128, simple) ->
    seconds every NCCL collective pays once before its first transfer (kernel launch and
    setup: ``sim.engine.nccl``). None: NCCL's tuning constants (``baseLatencies``)."""
    fp8_gemm_max_efficiency: FRACTION | None = None
    """Best dense FP8 GEMM throughput as a fraction of the fp8 peak: the cap of FP8 GEMMs
    (``gemm_efficiency(..., dtype="fp8")``), measured on a kernel alone, or fitted to FP8
    training runs (``trainsim fit``), which sustain less of it than BF16 runs do of theirs.
    None: the same as ``gemm_max_efficiency``."""
    gemm_kernel_fixed_s: SECONDS | None = None
    """A GEMM kernel's fixed seconds beyond its tiles' work (``gemm_efficiency``): the launch,
    the first tiles' pipeline fill and the last ones' drain that no k0 per tile accounts for,
    paid once per kernel (once per round of a grouped GEMM on several streams:
    ``sim.program.costs.fixed_time``). None: ``kernel_launch_s``, every kernel's cost."""
    attention_k_overhead: number("a number >= 0 (units of keys)", ge=0) | None = None
    """The attention kernel's k0: its fixed cost per query tile in units of the keys the tile
    loops over (``attention_efficiency``: s / (s + k0)). None: ``gemm_k_overhead``."""
    efficiency_ceilings: EFFICIENCY_CEILINGS | None = None
    """Efficiency field (``gemm_max_efficiency``, ``fp8_gemm_max_efficiency``,
    ``attention_max_efficiency``) -> the most this GPU's own measurements say a kernel of
    that kind achieves alone (the best GEMM of a Maximum Achievable Matmul FLOPS search, the
    best published flash-attention kernel), each with its source in ``sources``. No kernel
    in a training step beats the best one measured alone, so ``trainsim fit`` bounds each
    field by it (``sim.calibrate.fit_runs.ceiling``) and its report says where a fit ended
    there. None, or a field it does not list: only the fit's own physical bounds."""
    gemm_bias_epilogue: FLAG = True
    """A linear layer's bias is added in its GEMM's epilogue, at no cost (cuBLASLt,
    Transformer Engine). False: a pass first writes the bias into the output, which the
    GEMM then reads back (PyTorch's addmm on a CPU: its profiler shows ``aten::copy_``
    under ``aten::addmm``)."""
    gpu_speed_spread: number(f"a fraction in [0, {MAX_SPREAD}]", ge=0, le=MAX_SPREAD) = 0.0
    """σ: GPU-to-GPU spread of sustained compute speed (standard deviation over the mean)
    among GPUs of this type. A synchronous step waits for its slowest GPU, so a job on N
    GPUs runs its compute-bound kernels at the expected slowest speed, 1 − σ·E[max of N
    standard normals] (``sim.inputs.pacing``). 0: every GPU alike."""
    mx_block_scaling: FLAG = False
    """The tensor cores multiply MX block-scaled operands, reading one E8M0 scale per 32
    elements themselves (OCP Microscaling Formats v1.0; Blackwell's block-scaled MMA):
    ``--fp8-recipe mxfp8`` runs only where this is true (``sim.program.fp8``)."""
    fp8_gemm_any_layout: FLAG = False
    """The FP8 GEMMs take their operands in any layout. False (Hopper, Ada): cuBLASLt runs FP8
    GEMMs in the TN layout only ("A must be transposed and B non-transposed", cublasLtMatmul's FP8
    requirements), so Transformer Engine keeps a transposed FP8 copy of every operand a GEMM
    reads the other way; True (Blackwell, SM 10.x): it reads the one copy either way, and TE
    from 2.0 makes no transposed copies of per-tensor FP8 (``sim.inputs.precision.NON_TN_FP8_SINCE``,
    ``sim.program.fp8``)."""
    mxfp8_gemm_relative_efficiency: FRACTION | None = None
    """An MXFP8 GEMM's throughput over a per-tensor-scaled FP8 GEMM's of the same shapes
    (``gemm_efficiency(..., dtype="mxfp8")`` caps at ``fp8_gemm_max_efficiency`` times
    this): the block-scaled kernels also load and apply the scales. None: 1."""
    nvfp4_gemm_relative_efficiency: FRACTION | None = None
    """An NVFP4 GEMM's fraction of the ``fp4`` peak over an MXFP8 GEMM's fraction of the
    ``fp8`` peak (``gemm_efficiency(..., dtype="nvfp4")`` caps at the MXFP8 cap times this):
    the FP4 kernels reach less of their peak than the FP8 ones. None: 1."""
    moe_memory_relative_efficiency: FRACTION | None = None
    """The rate the memory-bound kernels of a mixture-of-experts block (from its router to its
    combine: the router's elementwise ops, the token permutation and its inverse, the chunk
    sorts, the experts' padding, casts and activation; ``sim.program.costs.in_moe_block``)
    stream at, over the rate the profile's other memory-bound kernels of their kind reach
    (``memory_rate(..., moe=True)``); the block's GEMMs take it in their rooflines' memory term
    too, which binds only the router's small GEMM. None: 1 (priced as any memory-bound kernel)."""
    attention_backward_relative_efficiency: FRACTION | None = None
    """A flash-attention backward kernel's throughput on the project's count of its work
    (8·s·seq_k·d per head, twice the forward's: ``sim.program.workload``) over the forward
    kernel's on its own, at the same shapes (``attention_efficiency(..., backward=True)``
    takes this times the forward's): the backward runs five matmuls to the forward's two,
    with the dQ accumulation and softmax recomputation between, and reaches less of the peak
    (FlashAttention-2 and -3 papers). None: 1 (priced as the forward)."""
    attention_causal_relative_efficiency: FRACTION | None = None
    """A causal flash-attention kernel's throughput on the work it does over the non-causal
    kernel's (``attention_max_efficiency``), beyond the whole diagonal blocks it computes
    (``causal_work_fraction``, priced apart): the masking of the diagonal blocks and the
    query blocks' unequal loops, the tail of the last wave. None: 1."""
    tensor_flops_per_exp: number("a number > 0 (tensor-core FLOPs per exponential)", gt=0) | None = None
    """BF16 tensor-core FLOPs per clock per SM over the exponentials per clock per SM of the
    special-function unit (``MUFU.EX2``), one number per GPU generation: a flash-attention
    forward computes one exponential per score and 2·(d_qk + d_v) matmul FLOPs per score, so
    the smaller the head, the larger the softmax's share of the kernel's time
    (``attention_head_factor``). None: no head-width term (every head priced as 128 wide)."""
    attention_kernel_speed: ATTENTION_KERNEL_SPEEDS | None = None
    """Attention kernel (``sim.inputs.frameworks``: 'fa2', 'triton') -> its forward and
    backward speed as a fraction of the kernel ``attention_max_efficiency`` stands for
    ('te'), measured at the same shapes. A kernel it does not list cannot be priced on this
    GPU (``attention_speed``). None: none listed."""
    power_limit_w: WATTS | None = None
    """The board's power limit (TDP, the datasheet's maximum thermal design power), watts:
    what a GPU draws at most, and what it draws under sustained compute-bound kernels
    (GEMMs, attention), whose clock settles where the draw meets it. None: not given (no
    energy figures; ``sim.results.energy``)."""
    idle_power_w: IDLE_WATTS | None = None
    """Watts the GPU draws while it waits (no kernel running, clocks up, HBM powered).
    None: not given (no energy figures)."""
    memory_bound_power_fraction: FRACTION | None = None
    """Fraction of ``power_limit_w`` the GPU draws under memory-bound kernels (norms,
    elementwise fusions, the optimizer step): HBM streams at full rate while the tensor
    cores rest. None: no energy figures."""
    communication_power_fraction: FRACTION | None = None
    """Fraction of ``power_limit_w`` the GPU draws while only NCCL kernels move data (a few
    SMs, one thread block per channel, copy and reduce through HBM, NVLink and NIC busy).
    None: no energy figures."""
    power_clock_exponent: number("a number >= 1", ge=1) = 3.0
    """α of the power a compute-bound kernel draws at SM clock f: idle + (limit − idle)·(f/f₀)^α,
    f₀ the clock it sustains at ``power_limit_w`` (``sim.inputs.power``)."""
    power_cap_w: WATTS | None = None
    """A power limit set below ``power_limit_w`` (``nvidia-smi -pl``, ``--power-limit-w``):
    compute-bound kernels draw it, at the lower clock it allows (``sim.inputs.power.capped``
    lowers ``sustained_compute_fraction`` to match). None: the board's own limit."""
    gpu_hour_price_usd: number("a number > 0 (US dollars per GPU-hour)", gt=0) | None = None
    """What an hour of this GPU costs, US dollars (a rental price, or the purchase and running
    cost amortized): the run's cost per iteration and per million tokens (``sim.inputs.cost``;
    ``--gpu-hour-price`` overrides it). None: not given (no cost figures; no preset gives one)."""
    profiler_op_overhead_s: SECONDS | None = None
    """Seconds the PyTorch profiler adds to the host thread for each operator or annotation
    it records (``torch.profiler.profile(activities=[CPU], record_shapes=True)``, as
    ``trainsim validate``'s reference run traces): its callbacks at each operator's start and
    end. ``trainsim replay`` takes it off a CPU trace's host time, once per event recorded
    there (``sim.replay.cpu``), so that the replay is of the job without the profiler.
    Measured by ``trainsim calibrate`` on a CPU (``reference_model.bench_profiler``). None:
    not measured (the replay keeps the traced host time)."""

    def memory_rate(self, framework: bool = False, moe: bool = False) -> float:
        """Bytes/s a memory-bound kernel moves: a tuned library kernel's, or with
        ``framework`` one of the framework's own (``framework_kernel_efficiency``); with
        ``moe`` one of a mixture-of-experts block's, times ``moe_memory_relative_efficiency``."""
        eff = self.framework_kernel_efficiency if framework and self.framework_kernel_efficiency else \
            self.memory_efficiency
        if moe and self.moe_memory_relative_efficiency is not None:
            eff *= self.moe_memory_relative_efficiency
        return self.hbm_bandwidth_Bps * eff
    sources: SOURCES = field(default_factory=dict, compare=False)
    """Field -> where its number comes from (datasheet, measurement, assumption)."""
    provenance: PROVENANCE = field(default_factory=dict, compare=False)
    """How a measured profile was made (machine, library versions, date; written by
    ``trainsim calibrate``). Empty, and left out of the JSON, for presets."""

    def __hash__(self):
        """Of the content (``sources`` and ``provenance`` aside, as ``==``): computed once,
        at the first call, and kept on the profile. A profile is frozen and its tables are
        read-only (``FrozenDict``; a changed profile is a new one: ``dataclasses.replace``),
        so the many ``lru_cache``s keyed on a profile pay a lookup, not a serialisation."""
        try:
            return self.__dict__["_content_hash"]
        except KeyError:
            d = self.to_dict()
            d.pop("sources")
            d.pop("provenance", None)
            h = hash(json.dumps(d, sort_keys=True))
            object.__setattr__(self, "_content_hash", h)  # (not a field: not compared, copied or written)
            return h

    def __getstate__(self):
        """Pickled without the kept hash: a string's hash differs from process to process
        (``PYTHONHASHSEED``), so a worker hashes the profile it receives afresh."""
        state = dict(self.__dict__)
        state.pop("_content_hash", None)
        state.pop("_paced", None)  # (``sim.inputs.pacing.paced``'s copies, made again where needed)
        return state

    def __post_init__(self):
        """The rules between fields (each field's own are its type's). The tables that make
        the profile's content (all but ``sources`` and ``provenance``) become read-only."""
        for f in fields(self):
            if f.compare and isinstance(getattr(self, f.name), dict):
                object.__setattr__(self, f.name, _frozen(getattr(self, f.name)))
        if self.fp8_gemm_max_efficiency is not None and "fp8" not in self.peak_flops:
            raise InputError(field="fp8_gemm_max_efficiency", value=self.fp8_gemm_max_efficiency,
                             allowed="peak_flops has no fp8 entry (give the GPU's fp8 peak, or leave the field out)")
        if self.nvfp4_gemm_relative_efficiency is not None and "fp4" not in self.peak_flops:
            raise InputError(field="nvfp4_gemm_relative_efficiency", value=self.nvfp4_gemm_relative_efficiency,
                             allowed="peak_flops has no fp4 (give its fp4 peak, or leave the field out)")
        if self.mxfp8_gemm_relative_efficiency is not None and not self.mx_block_scaling:
            raise InputError(field="mxfp8_gemm_relative_efficiency", value=self.mxfp8_gemm_relative_efficiency,
                             allowed="mx_block_scaling is false (set it true, or leave the field out)")
        if self.idle_power_w is not None and self.power_limit_w is not None and \
                not self.idle_power_w < self.power_limit_w:
            raise InputError(field="idle_power_w", value=self.idle_power_w,
                             allowed=f"a number below power_limit_w ({self.power_limit_w} W)")
        if self.power_limit_w is not None and self.idle_power_w is not None:
            for key in ("memory_bound_power_fraction", "communication_power_fraction"):
                v = getattr(self, key)
                if v is not None and not v * self.power_limit_w >= self.idle_power_w:
                    raise InputError(field=key, value=v, allowed=f"a fraction of power_limit_w ({self.power_limit_w} W) "
                                     f"at or above the idle power ({self.idle_power_w} W)")
        if self.power_cap_w is not None and not (self.power_limit_w is not None and self.idle_power_w is not None
                                                 and self.idle_power_w < self.power_cap_w <= self.power_limit_w):
            raise InputError(field="power_cap_w", value=self.power_cap_w,
                             allowed=f"watts above idle_power_w ({self.idle_power_w}) and at most power_limit_w "
                                     f"({self.power_limit_w})")
        names = [f.name for f in fields(self)]
        for key in self.sources:
            if key.split(".")[0] not in names:
                raise InputError(field="sources", value=key, allowed=f"expected keys naming fields: {', '.join(names)}")

    # ----------------------------------------------------------------- queries
    def peak(self, dtype: str = "bf16") -> float:
        if dtype not in self.peak_flops:
            raise InputError(f"profile {self.name}: peak_flops: no entry for dtype {dtype!r}; "
                             f"has {', '.join(sorted(self.peak_flops))}")
        return self.peak_flops[dtype]

    def link(self, kind: str) -> LinkModel:
        """The α-β model of a link kind (``nvlink``, ``pcie``, ``ib``, ``ethernet``)."""
        if kind not in self.links:
            raise InputError(f"profile {self.name}: links: no entry for kind {kind!r}; "
                             f"has {', '.join(sorted(self.links))}")
        return self.links[kind]

    def link_efficiencies(self) -> dict:
        """Link kind -> achieved fraction of line rate (what the network model scales by)."""
        return {kind: link.efficiency for kind, link in sorted(self.links.items())}

    def gemm_efficiency(self, m: int, n: int, k: int, batch: int = 1, dtype: str = "bf16") -> float:
        """Fraction of peak an m×n×k GEMM (``batch`` of them) reaches; see the module doc.
        ``dtype="fp8"``: capped at ``fp8_gemm_max_efficiency``, with k0 longer by the
        fp8/bf16 peak ratio (the per-tile prologue and epilogue take the same time while
        the main loop over k runs that much faster); ``dtype="mxfp8"``: the same, its cap
        times ``mxfp8_gemm_relative_efficiency``; ``dtype="nvfp4"``: MXFP8's cap times
        ``nvfp4_gemm_relative_efficiency``, k0 longer by the fp4/bf16 peak ratio."""
        if min(m, n, k, batch) <= 0:
            raise InputError(f"gemm shape: got {m}x{n}x{k} (batch {batch}); expected positive sizes")
        sms = self.sm_count
        best_q = 0.0
        for tm, tn, rel in self.gemm_tiles:
            for a, b in ((tm, tn), (tn, tm)):
                tiles_m, tiles_n = math.ceil(m / a), math.ceil(n / b)
                tiles = tiles_m * tiles_n * batch
                tile_q = (m * n) / (tiles_m * a * tiles_n * b)
                wave_q = tiles / (math.ceil(tiles / sms) * sms)
                best_q = max(best_q, rel * tile_q * wave_q)
        best, k0 = self.gemm_max_efficiency, self.gemm_k_overhead
        if dtype in ("fp8", "mxfp8", "nvfp4"):
            best = self.fp8_gemm_max_efficiency or best
            if dtype in ("mxfp8", "nvfp4"):
                best *= self.mxfp8_gemm_relative_efficiency or 1.0
            if dtype == "nvfp4":
                best *= self.nvfp4_gemm_relative_efficiency or 1.0
            k0 *= self.peak("fp4" if dtype == "nvfp4" else "fp8") / self.peak("bf16")
        return best * self.sustained_compute_fraction * min(1.0, best_q) * k / (k + k0)

    def attention_efficiency(self, seq_q: int, seq_k: int, head_dim: int, batch_heads: int,
                             backward: bool = False, mma_flops_per_score: float | None = None) -> float:
        """Fraction of peak a causal flash-attention kernel reaches on the project's FLOP
        count (the papers' non-causal 4·s·seq_k·d per head, twice the causal work:
        ``sim.program.workload``): one CTA per 128 query rows of one (sequence, head),
        wave-quantized over the SMs, a k0 cost per tile in units of the keys it loops over
        (``attention_keys_overhead``),
        capped at ``attention_max_efficiency`` (times the ``sustained_compute_fraction`` of a
        training step), which is the kernel's throughput on the work it does, and divided
        by the share of that count the kernel computes (``causal_work_fraction``): it skips
        the key blocks above the diagonal. Times ``attention_causal_relative_efficiency``
        (a causal kernel's throughput on its work over the non-causal one's), and for the
        ``backward`` kernel ``attention_backward_relative_efficiency``; the forward times
        ``attention_head_factor`` (``mma_flops_per_score``: its matmul FLOPs per score,
        2·(d_qk + d_v); None: 4·``head_dim``)."""
        head = 1.0 if backward else self.attention_head_factor(
            4.0 * head_dim if mma_flops_per_score is None else mma_flops_per_score)
        tiles = math.ceil(seq_q / 128) * batch_heads
        tile_q = seq_q / (math.ceil(seq_q / 128) * 128)
        wave_q = tiles / (math.ceil(tiles / self.sm_count) * self.sm_count)
        return (self.attention_max_efficiency * self.sustained_compute_fraction * tile_q * wave_q
                * seq_k / (seq_k + self.attention_keys_overhead)) / causal_work_fraction(seq_k) \
            * (self.attention_causal_relative_efficiency or 1.0) \
            * ((self.attention_backward_relative_efficiency or 1.0) if backward else 1.0) * head

    @property
    def gemm_fixed_s(self) -> float:
        """A GEMM kernel's fixed seconds: ``gemm_kernel_fixed_s``, else ``kernel_launch_s``."""
        return self.kernel_launch_s if self.gemm_kernel_fixed_s is None else self.gemm_kernel_fixed_s

    @property
    def attention_keys_overhead(self) -> float:
        """The attention kernel's k0 in keys: ``attention_k_overhead``, else ``gemm_k_overhead``."""
        return self.gemm_k_overhead if self.attention_k_overhead is None else self.attention_k_overhead

    def attention_head_factor(self, mma_flops_per_score: float) -> float:
        """A flash-attention forward's throughput at ``mma_flops_per_score`` matmul FLOPs per
        score (4·d for a head d wide; 2·(d_qk + d_v) under MLA) over its throughput at
        ``ATTENTION_REFERENCE_HEAD_DIM``, the head width ``attention_max_efficiency`` was
        measured at. Per score the kernel runs F matmul FLOPs on the tensor cores and one
        exponential on the special-function unit, F/ρ and 1 of the unit's clocks
        (ρ = ``tensor_flops_per_exp``), one after the other (BMM1, softmax, BMM2: the
        FlashAttention-3 and -4 papers' and NVIDIA's Blackwell Ultra softmax note's
        pipeline), so its throughput on the FLOPs is F/(F + ρ) of the tensor cores'. 1 where
        the profile gives no ρ. The backward is left as measured at head 128: FlashAttention-4
        finds it bound by shared-memory traffic, which grows with the head like its FLOPs."""
        rho = self.tensor_flops_per_exp
        if rho is None:
            return 1.0
        ref = 4.0 * ATTENTION_REFERENCE_HEAD_DIM
        return (mma_flops_per_score / (mma_flops_per_score + rho)) / (ref / (ref + rho))

    def attention_speed(self, kernel: str, backward: bool) -> float:
        """Speed of attention ``kernel``'s forward (or ``backward``) pass relative to the
        profile's own kernel ('te': 1), from ``attention_kernel_speed``."""
        if kernel == "te":
            return 1.0
        got = (self.attention_kernel_speed or {}).get(kernel)
        if got is None:
            raise InputError(field="attention_kernel", value=kernel,
                             allowed=f"one whose speed profile {self.name} gives (its attention_kernel_speed: "
                                     f"{', '.join(['te', *sorted(self.attention_kernel_speed or {})])}); "
                                     "--attention-kernel te runs the profile's own", setting="attention_kernel")
        return got["backward" if backward else "forward"]

    # ---------------------------------------------------------------- files
    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "links":
                v = {k: {"latency_s": l.latency_s, "bandwidth_Bps": l.bandwidth_Bps,
                         "efficiency": l.efficiency} for k, l in v.items()}
            elif f.name == "gemm_tiles":
                v = [list(t) for t in v]
            elif isinstance(v, dict):
                v = dict(v)
            out[f.name] = v
        if not out["provenance"]:
            del out["provenance"]
        for key in ("framework_kernel_efficiency", "framework_kernel_overhead_s", "attention_kernel_speed", "nccl_protocols", "nvls_efficiency",
                    "nvls_latency_s", "nccl_base_latency_s", "fp8_gemm_max_efficiency", "efficiency_ceilings", "attention_backward_relative_efficiency",
                    "attention_causal_relative_efficiency", "attention_k_overhead", "gemm_kernel_fixed_s", "tensor_flops_per_exp", "power_limit_w", "idle_power_w",
                    "mxfp8_gemm_relative_efficiency", "nvfp4_gemm_relative_efficiency", "moe_memory_relative_efficiency", "memory_bound_power_fraction", "communication_power_fraction",
                    "power_cap_w", "gpu_hour_price_usd", "profiler_op_overhead_s"):
            if out[key] is None:
                del out[key]
        if out["gemm_bias_epilogue"]:
            del out["gemm_bias_epilogue"]
        for flag in ("mx_block_scaling", "fp8_gemm_any_layout"):
            if not out[flag]:
                del out[flag]
        return out

    @classmethod
    def from_dict(cls, d: dict, where: str = "profile") -> "HardwareProfile":
        """A profile from plain data, strictly: unknown or missing keys are errors."""
        if not isinstance(d, dict):
            raise InputError(f"{where}: got {type(d).__name__}; expected a JSON object")
        try:
            return _READ.validate_python(d)
        except ValidationError as exc:
            raise one_line_error(exc, cls, where) from None

    def save(self, path: str | Path) -> None:
        """Write the profile as indented JSON, through a temporary file and a rename."""
        from sim.fileio import write_json_atomic

        write_json_atomic(self.to_dict(), path, indent=2, sort_keys=False)


_READ = TypeAdapter(HardwareProfile)


def load_profile(name_or_path: str | Path, flag: str = "gpu") -> HardwareProfile:
    """A preset by name (``PRESETS``: ``a100-80gb``, ``h100-sxm``, ``h200``, ``b200``, ``gb200``, ``gb300``) or a
    profile JSON file.
    ``flag`` names the setting in errors about the name itself (``--base``, ``--profile``)."""
    from sim.fileio import read_json

    text = str(name_or_path)
    if text in PRESETS:
        data = resources.files("sim").joinpath("profiles", f"{text}.json").read_text()
        return HardwareProfile.from_dict(json.loads(data), where=f"profile {text}")
    path = Path(text)
    if not path.suffix == ".json" and not path.exists():
        raise InputError(f"{flag}: got {text!r}; allowed: {', '.join(PRESETS)} or a profile .json file")
    return HardwareProfile.from_dict(read_json(path, flag), where=text)
