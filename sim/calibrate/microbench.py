"""Microbenchmarks with the real kernels: what one device does per op.

Each benchmark runs the kernel trainsim's cost model stands for, in the training dtype
(bf16 on a GPU, float32 on a CPU, which has no fast bf16 here), times it with
``launch.measure`` (warm-up, median of repeats, CUDA events on a GPU) and returns plain
records (dicts with SI units in the key names) that ``sim.calibrate.fit`` turns into a
profile:

- **GEMM**: every distinct (m, n, k, batch) the model and plan run (``workload_gemms``:
  forward, input-gradient and weight-gradient products of every layer, the embedding
  and the logit layer, read from ``sim.program.workload`` so the shapes are the
  simulator's own, each with the operand layout PyTorch gives it: ``x @ W.T``,
  ``dy @ W``, ``dy.T @ x``)
  plus a grid of squares and skinny shapes for the efficiency model's tile and k terms;
- **attention**: ``torch.nn.functional.scaled_dot_product_attention`` (causal, as a GPT
  runs it) forward, and forward + backward, at the model's shape and a few more;
- **memory-bound kernels**: LayerNorm, RMSNorm, GeLU, SwiGLU (silu(a)·b), softmax and a
  residual add over a range of sizes, with the bytes each reads and writes;
- **copy**: a large device-to-device copy (read + write bytes over time) for the memory
  bandwidth.

Every kernel is timed **with its operands out of cache**, as a training step runs it:
each call reads a different set of operands, views into one buffer of twice the
device's last-level cache (``Operands``; a GPU's L2, a CPU's L3), so by the time a set
comes round again it has been evicted. A step's GEMMs read weights last touched a
micro-batch ago and activations saved in the forward, and other kernels run between
them; timing one kernel over and over on the same inputs measures it out of cache, which
on the CPU this project is developed on made GEMMs 1.15-1.7x faster than with their
operands evicted (``experiments/cold_cache.py``), and the simulation as optimistic as that.

Every rank of the calibration group runs the same benchmarks at the same time, and the
per-record median over ranks is kept: on a GPU node each process owns its GPU, so this
is just robustness; on a CPU the processes share cores and memory as a training run's
processes do, so the numbers are the ones a rank sees under load.
"""

from __future__ import annotations

import glob
import itertools
import math
import os
import statistics

from sim.calibrate import require_torch
from sim.calibrate.launch import Context, measure, measure_many, training_dtype
from sim.calibrate.reference_model import bench_framework, bench_profiler
from sim.inputs.model import ModelSpec
from sim.inputs.plan import ParallelPlan
from sim.program.workload import chunk_work

QUICK = {"gemm_grid": (64, 256, 1024), "mem_elems": (2**12, 2**15, 2**18, 2**20), "copy_bytes": 64 * 2**20,
         "repeats": 5, "warmup": 2}
FULL = {"gemm_grid": (64, 128, 256, 512, 1024, 2048), "mem_elems": (2**12, 2**14, 2**16, 2**18, 2**20, 2**22),
        "copy_bytes": 256 * 2**20, "repeats": 9, "warmup": 3}
MAX_GEMM_FLOPS = {"cpu": 4e9, "cuda": 2e13}
GPU_GRID = (256, 512, 1024, 2048, 4096, 8192)
GPU_MEM = (2**16, 2**18, 2**20, 2**22, 2**24, 2**26)


POOL_MIN_BYTES, POOL_MAX_BYTES = 64 * 2**20, 2**30
"""Bounds of the operand pool (twice the last-level cache)."""
MAX_SETS = 8192
"""Most operand sets per kernel: tiny kernels rotate over fewer than the pool holds."""
ROUNDS_PER_REPEAT = 3
"""GEMMs and memory-bound kernels are sampled round-robin, this many rounds per repeat:
cheap (one sample of each per round), and the medians then span the whole sweep."""
CPU_SWEEP_S = {"gemm": 3.0, "memory": 1.0}
"""On a CPU the round-robin sweeps go on for at least this long: a shared virtual
machine's speed swings over fractions of a second, and a sweep of a few tenths of a
second took the GEMM rate of whichever spell it fell in (119-155 GFLOP/s in three
calibrations minutes apart, while the training step it predicts varied by 3%)."""


def last_level_cache_bytes(ctx: Context, sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The largest cache between the device's cores and its memory: a GPU's L2 (device
    property), a CPU's last level (``sysfs``, then ``sysconf``); 32 MiB when neither says."""
    if ctx.is_cuda:
        torch = require_torch()
        return int(getattr(torch.cuda.get_device_properties(ctx.device), "L2_cache_size", 0)) or 32 * 2**20
    sizes = cache_sizes(sysfs)
    for name in ("SC_LEVEL4_CACHE_SIZE", "SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            sizes.append(int(os.sysconf(name)))
        except (ValueError, OSError):
            pass
    return max([s for s in sizes if s > 0], default=32 * 2**20)


def cache_sizes(sysfs: str) -> list[int]:
    """Bytes of each data or unified cache listed under ``sysfs`` (Linux's
    ``cpu0/cache/index*/{type,size}``, sizes such as ``2048K``)."""
    sizes = []
    for d in sorted(glob.glob(os.path.join(sysfs, "index*"))):
        try:
            with open(os.path.join(d, "type")) as f:
                if f.read().strip() == "Instruction":
                    continue
            with open(os.path.join(d, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KkMmGg")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return sizes


class Operands:
    """Operand sets for timing kernels out of cache: views into one buffer of twice the
    last-level cache (bounded by ``POOL_MIN_BYTES``/``POOL_MAX_BYTES``), filled once."""

    def __init__(self, ctx: Context, dtype, nbytes: int | None = None):
        torch = require_torch()
        self.ctx, self.dtype = ctx, dtype
        if nbytes is None:
            nbytes = min(max(2 * last_level_cache_bytes(ctx), POOL_MIN_BYTES), POOL_MAX_BYTES)
        self.elements = nbytes // torch.tensor([], dtype=dtype).element_size()
        self.buf = torch.empty(self.elements, device=ctx.device, dtype=dtype).uniform_(-1.0, 1.0)

    def sets(self, *shapes) -> list[tuple]:
        """Tuples of tensors of ``shapes`` (contiguous), each tuple in a different part of
        the pool; operands larger than the pool are one set of fresh tensors (out of
        cache anyway)."""
        torch = require_torch()
        sizes = [math.prod(s) for s in shapes]
        per = sum(sizes)
        if per > self.elements:
            return [tuple(torch.empty(s, device=self.ctx.device, dtype=self.dtype).uniform_(-1.0, 1.0) for s in shapes)]
        out = []
        for i in range(max(1, min(MAX_SETS, self.elements // per))):
            off, views = i * per, []
            for s, n in zip(shapes, sizes):
                views.append(self.buf[off: off + n].view(s))
                off += n
            out.append(tuple(views))
        return out

    def cycle(self, *shapes):
        """``sets`` round and round, for ``next`` in a timed call."""
        return itertools.cycle(self.sets(*shapes))


_POOLS: dict = {}


def operands(ctx: Context, dtype) -> Operands:
    """This process's pool for ``dtype`` (made once: filling it takes a moment)."""
    key = (str(ctx.device), str(dtype))
    if key not in _POOLS:
        _POOLS[key] = Operands(ctx, dtype)
    return _POOLS[key]


def _layout(name: str) -> str:
    """How PyTorch lays the operands out: forward ``x @ W.T`` ("nt"), input gradient
    ``dy @ W`` ("nn"), weight gradient ``dy.T @ x`` ("tn")."""
    if name.endswith(".wgrad"):
        return "tn"
    return "nn" if name.endswith(".dgrad") else "nt"


def workload_gemms(model: ModelSpec, plan: ParallelPlan) -> list[tuple[int, int, int, int, str]]:
    """Distinct (m, n, k, batch, layout) of the GEMMs one rank runs for ``model`` under ``plan``."""
    shapes = set()
    for vs in range(plan.pp * plan.vpp):
        for work in chunk_work(model, plan, vs):
            for op in work.ops():
                if op.kind == "gemm":
                    m, n, k = op.shape
                    shapes.add((int(m), int(n), int(k), int(op.batch), _layout(op.name)))
    return sorted(shapes)


def grid_gemms(sizes) -> list[tuple[int, int, int, int, str]]:
    """Squares, and each size against a short and a long k (the k term of the model)."""
    out = set()
    small, big = min(sizes), max(sizes)
    for s in sizes:
        out.add((s, s, s, 1, "nn"))
        out.add((s, s, small, 1, "nn"))
        out.add((big, s, s, 1, "nn"))
    return sorted(out)


def _plan(ctx: Context, quick: bool) -> dict:
    p = dict(QUICK if quick else FULL)
    if ctx.is_cuda:
        p.update(gemm_grid=GPU_GRID[:4] if quick else GPU_GRID, mem_elems=GPU_MEM,
                 copy_bytes=(1 if quick else 4) * 2**30)
    return p


def bench_gemms(ctx: Context, shapes, repeats: int, warmup: int, sweep: bool = True) -> list[dict]:
    """Each GEMM of ``shapes`` on operands out of cache, sampled round-robin
    (``measure_many``) over ``ROUNDS_PER_REPEAT`` x ``repeats`` rounds (on a CPU for at
    least ``CPU_SWEEP_S`` unless not ``sweep``)."""
    torch = require_torch()
    dt = training_dtype(ctx)
    pool = operands(ctx, dt)
    fns = []
    for m, n, k, batch, layout in shapes:
        lead = (batch,) if batch > 1 else ()
        sets = pool.cycle((*lead, *((k, m) if layout[0] == "t" else (m, k))),
                          (*lead, *((n, k) if layout[1] == "t" else (k, n))))
        ta, tb = layout[0] == "t", layout[1] == "t"
        op = torch.bmm if batch > 1 else torch.mm

        def fn(sets=sets, ta=ta, tb=tb, op=op):
            a, b = next(sets)
            return op(a.transpose(-1, -2) if ta else a, b.transpose(-1, -2) if tb else b)

        fns.append(fn)
    times = measure_many(ctx, fns, warmup=warmup, repeats=ROUNDS_PER_REPEAT * repeats,
                         min_total_s=0.0 if ctx.is_cuda or not sweep else CPU_SWEEP_S["gemm"])
    return [{"m": m, "n": n, "k": k, "batch": batch, "layout": layout, "flops": 2.0 * m * n * k * batch, "time_s": t}
            for (m, n, k, batch, layout), t in zip(shapes, times)]


def attention_shapes(model: ModelSpec | None, plan: ParallelPlan | None, quick: bool, cuda: bool) -> list:
    """(batch, heads, seq, head_dim) to time: the model's, and a small sweep over seq."""
    shapes = set()
    if model is not None and plan is not None:
        shapes.add((plan.micro_batch_size, model.num_attention_heads // plan.tp, model.seq_length, model.head_dim))
    seqs = (128, 512, 2048, 4096) if cuda else ((64, 256) if quick else (64, 128, 256, 512))
    heads = 16 if cuda else 4
    for s in seqs:
        shapes.add((1 if cuda else 2, heads, s, 64 if not cuda else 128))
    return sorted(shapes)


def bench_attention(ctx: Context, shapes, repeats: int, warmup: int) -> list[dict]:
    require_torch()
    import torch.nn.functional as F

    dt = training_dtype(ctx)
    pool = operands(ctx, dt)
    out = []
    for b, h, s, d in shapes:
        fwd_sets = pool.cycle(*[(b, h, s, d)] * 3)

        def fwd_only(sets=fwd_sets):
            q, k, v = next(sets)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        fwd = measure(ctx, fwd_only, warmup=warmup, repeats=repeats)
        # Leaves that share the pool's storage, so backward has gradients to make.
        both_sets = itertools.cycle([tuple(x.detach().requires_grad_(i < 3) for i, x in enumerate(group))
                                     for group in pool.sets(*[(b, h, s, d)] * 4)])

        def fwd_bwd(sets=both_sets):
            q, k, v, grad = next(sets)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(grad)
            q.grad = k.grad = v.grad = None

        both = measure(ctx, fwd_bwd, warmup=warmup, repeats=repeats)
        out.append({"batch": b, "heads": h, "seq": s, "head_dim": d, "causal": True,
                    "flops_forward": 4.0 * b * s * s * h * d, "forward_s": fwd, "backward_s": max(both - fwd, 0.0)})
    return out


def _memory_kernels(torch, F, n: int, dt, pool: Operands):
    """(name, callable, bytes moved) for memory-bound kernels over about ``n`` elements,
    each call on operands from ``pool``."""
    e = torch.tensor([], dtype=dt).element_size()
    h = 1024 if n >= 1024 * 4 else 64
    rows = max(1, n // h)
    sets = pool.cycle((rows, h), (rows, h), (h,), (h,))
    elems = rows * h
    rms = getattr(F, "rms_norm", None)

    def on(body):
        return lambda: body(*next(sets))

    kernels = [
        ("layernorm", on(lambda x, y, w, bias: F.layer_norm(x, (h,), w, bias)), 2 * elems * e),
        ("gelu", on(lambda x, y, w, bias: F.gelu(x)), 2 * elems * e),
        ("swiglu", on(lambda x, y, w, bias: F.silu(x) * y), 3 * elems * e),
        ("softmax", on(lambda x, y, w, bias: torch.softmax(x, dim=-1)), 2 * elems * e),
        ("add", on(lambda x, y, w, bias: x + y), 3 * elems * e),
    ]
    if rms is not None:
        kernels.append(("rmsnorm", on(lambda x, y, w, bias: rms(x, (h,), w)), 2 * elems * e))
    return elems, kernels


def bench_memory(ctx: Context, sizes, repeats: int, warmup: int) -> list[dict]:
    torch = require_torch()
    import torch.nn.functional as F

    dt = training_dtype(ctx)
    pool = operands(ctx, dt)
    out = []
    with torch.no_grad():
        runs = [(elems, name, fn, nbytes) for n in sizes
                for elems, kernels in [_memory_kernels(torch, F, n, dt, pool)] for name, fn, nbytes in kernels]
        times = measure_many(ctx, [r[2] for r in runs], warmup=warmup, repeats=ROUNDS_PER_REPEAT * repeats,
                             min_total_s=0.0 if ctx.is_cuda else CPU_SWEEP_S["memory"])
    for (elems, name, _, nbytes), t in zip(runs, times):
        out.append({"kernel": name, "elements": elems, "bytes": float(nbytes), "time_s": t})
    return out


def bench_copy(ctx: Context, nbytes: int, repeats: int, warmup: int) -> dict:
    torch = require_torch()
    src = torch.empty(nbytes // 4, device=ctx.device, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    t = measure(ctx, lambda: dst.copy_(src), warmup=warmup, repeats=repeats)
    moved = 2.0 * src.numel() * 4
    return {"bytes": moved, "time_s": t, "bandwidth_Bps": moved / t}


BUSY_WARMUP_S = 5.0
"""Seconds of back-to-back large GEMMs before a GPU's first timing. An idle GPU clocks down
(an H200 read 345 MHz idle and 1,980 MHz busy with nvidia-smi, 2026-12-04) and takes a
while to come up: without this spell the expert GEMMs of ``experiments/expert_gemms.py``
timed 2-20% slower on one H200 (the 4096^3 square: 0.44 of peak against 0.52-0.54)."""


def busy_warmup(ctx: Context, seconds: float = BUSY_WARMUP_S) -> None:
    """Keep a GPU busy with large GEMMs for ``seconds`` so that what is timed next runs at the
    clocks of a busy GPU, as a training step does (nothing on a CPU)."""
    if not ctx.is_cuda or seconds <= 0:
        return
    import time

    torch = require_torch()
    a = torch.randn(8192, 8192, device=ctx.device, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        ctx.sync()


def run_microbenchmarks(ctx: Context, model: ModelSpec | None, plan: ParallelPlan | None, quick: bool) -> dict:
    """All benchmarks on this rank's device; plain data."""
    p = _plan(ctx, quick)
    busy_warmup(ctx)
    shapes = set(grid_gemms(p["gemm_grid"]))
    if model is not None and plan is not None:
        shapes |= set(workload_gemms(model, plan))
    # A CPU takes seconds over a large model's GEMMs; the efficiency model extrapolates.
    limit = MAX_GEMM_FLOPS["cuda" if ctx.is_cuda else "cpu"]
    shapes = {sh for sh in shapes if 2.0 * sh[0] * sh[1] * sh[2] * sh[3] <= limit}
    mem_sizes = set(p["mem_elems"])
    if model is not None and plan is not None:
        n_tok = plan.micro_batch_size * model.seq_length
        mem_sizes |= {n_tok * model.hidden_size, n_tok * model.ffn_hidden_size // plan.tp}
    r, w = p["repeats"], p["warmup"]
    torch = require_torch()
    return {
        "dtype": str(training_dtype(ctx)).removeprefix("torch."),
        "device": str(ctx.device),
        "gemm": bench_gemms(ctx, sorted(shapes), r, w),
        "attention": bench_attention(ctx, attention_shapes(model, plan, quick, ctx.is_cuda), r, w),
        "memory": bench_memory(ctx, sorted(mem_sizes), r, w),
        "copy": bench_copy(ctx, p["copy_bytes"], r, w),
        "framework": None if ctx.is_cuda else bench_framework(ctx, r, w),  # (sim.calibrate.reference_model)
        "profiler": None if ctx.is_cuda else bench_profiler(ctx, model, plan, r, w),
        "element_bytes": torch.tensor([], dtype=training_dtype(ctx)).element_size(),
    }


def merge_ranks(per_rank: list[dict]) -> dict:
    """One set of records: each timing is the median over the ranks that measured it."""
    first = per_rank[0]
    out = {k: v for k, v in first.items() if k not in ("gemm", "attention", "memory", "copy")}
    for key, fields in (("gemm", ("time_s",)), ("attention", ("forward_s", "backward_s")),
                        ("memory", ("time_s",))):
        rows = []
        for i, row in enumerate(first[key]):
            row = dict(row)
            for f in fields:
                row[f] = statistics.median(r[key][i][f] for r in per_rank)
            rows.append(row)
        out[key] = rows
    copy = dict(first["copy"])
    copy["time_s"] = statistics.median(r["copy"]["time_s"] for r in per_rank)
    copy["bandwidth_Bps"] = copy["bytes"] / copy["time_s"]
    out["copy"] = copy
    if first.get("framework"):
        fw = dict(first["framework"])
        fw["step_s"] = statistics.median(r["framework"]["step_s"] for r in per_rank)
        fw["per_kernel_s"] = fw["step_s"] / fw["kernels"]
        out["framework"] = fw
    if first.get("profiler"):
        pr = dict(first["profiler"])
        pr["per_op_s_ranks"] = [r["profiler"]["per_op_s"] for r in per_rank]
        pr["per_op_s"] = statistics.median(pr["per_op_s_ranks"])
        out["profiler"] = pr
    return out
