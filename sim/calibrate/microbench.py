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

Every rank of the calibration group runs the same benchmarks at the same time, and the
per-record median over ranks is kept: on a GPU node each process owns its GPU, so this
is just robustness; on a CPU the processes share cores and memory as a training run's
processes do, so the numbers are the ones a rank sees under load.
"""

from __future__ import annotations

import statistics

from sim.calibrate import require_torch
from sim.calibrate.launch import Context, measure
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


def training_dtype(ctx: Context):
    """bf16 on a GPU, float32 on a CPU."""
    torch = require_torch()
    return torch.bfloat16 if ctx.is_cuda else torch.float32


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


def bench_gemms(ctx: Context, shapes, repeats: int, warmup: int) -> list[dict]:
    torch = require_torch()
    dt = training_dtype(ctx)
    out = []
    for m, n, k, batch, layout in shapes:
        lead = (batch,) if batch > 1 else ()
        a = torch.randn(*lead, *((k, m) if layout[0] == "t" else (m, k)), device=ctx.device, dtype=dt)
        b = torch.randn(*lead, *((n, k) if layout[1] == "t" else (k, n)), device=ctx.device, dtype=dt)
        a = a.transpose(-1, -2) if layout[0] == "t" else a
        b = b.transpose(-1, -2) if layout[1] == "t" else b
        fn = (lambda a=a, b=b: torch.bmm(a, b)) if batch > 1 else (lambda a=a, b=b: torch.mm(a, b))
        t = measure(ctx, fn, warmup=warmup, repeats=repeats)
        out.append({"m": m, "n": n, "k": k, "batch": batch, "layout": layout, "flops": 2.0 * m * n * k * batch,
                    "time_s": t})
    return out


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
    torch = require_torch()
    import torch.nn.functional as F

    dt = training_dtype(ctx)
    out = []
    for b, h, s, d in shapes:
        q, k, v = (torch.randn(b, h, s, d, device=ctx.device, dtype=dt, requires_grad=True) for _ in range(3))
        fwd = measure(ctx, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                      warmup=warmup, repeats=repeats)
        grad = torch.randn(b, h, s, d, device=ctx.device, dtype=dt)

        def fwd_bwd():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(grad)
            q.grad = k.grad = v.grad = None

        both = measure(ctx, fwd_bwd, warmup=warmup, repeats=repeats)
        out.append({"batch": b, "heads": h, "seq": s, "head_dim": d, "causal": True,
                    "flops_forward": 4.0 * b * s * s * h * d, "forward_s": fwd, "backward_s": max(both - fwd, 0.0)})
    return out


def _memory_kernels(torch, F, n: int, dt, device):
    """(name, callable, bytes moved) for memory-bound kernels over about ``n`` elements."""
    e = torch.tensor([], dtype=dt).element_size()
    h = 1024 if n >= 1024 * 4 else 64
    rows = max(1, n // h)
    x = torch.randn(rows, h, device=device, dtype=dt)
    y = torch.randn(rows, h, device=device, dtype=dt)
    w = torch.randn(h, device=device, dtype=dt)
    bias = torch.randn(h, device=device, dtype=dt)
    elems = rows * h
    rms = getattr(F, "rms_norm", None)
    kernels = [
        ("layernorm", lambda: F.layer_norm(x, (h,), w, bias), 2 * elems * e),
        ("gelu", lambda: F.gelu(x), 2 * elems * e),
        ("swiglu", lambda: F.silu(x) * y, 3 * elems * e),
        ("softmax", lambda: torch.softmax(x, dim=-1), 2 * elems * e),
        ("add", lambda: x + y, 3 * elems * e),
    ]
    if rms is not None:
        kernels.append(("rmsnorm", lambda: rms(x, (h,), w), 2 * elems * e))
    return elems, kernels


def bench_memory(ctx: Context, sizes, repeats: int, warmup: int) -> list[dict]:
    torch = require_torch()
    import torch.nn.functional as F

    dt = training_dtype(ctx)
    out = []
    with torch.no_grad():
        for n in sizes:
            elems, kernels = _memory_kernels(torch, F, n, dt, ctx.device)
            for name, fn, nbytes in kernels:
                t = measure(ctx, fn, warmup=warmup, repeats=repeats)
                out.append({"kernel": name, "elements": elems, "bytes": float(nbytes), "time_s": t})
    return out


def bench_copy(ctx: Context, nbytes: int, repeats: int, warmup: int) -> dict:
    torch = require_torch()
    src = torch.empty(nbytes // 4, device=ctx.device, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    t = measure(ctx, lambda: dst.copy_(src), warmup=warmup, repeats=repeats)
    moved = 2.0 * src.numel() * 4
    return {"bytes": moved, "time_s": t, "bandwidth_Bps": moved / t}


def run_microbenchmarks(ctx: Context, model: ModelSpec | None, plan: ParallelPlan | None, quick: bool) -> dict:
    """All benchmarks on this rank's device; plain data."""
    p = _plan(ctx, quick)
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
    return out
