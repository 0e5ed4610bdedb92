"""Collectives and point-to-point transfers measured through ``torch.distributed``.

Run inside the calibration workers (``sim.calibrate.launch``): NCCL between GPUs, gloo
between CPU processes over loopback. For each size of a sweep, every rank runs the op
back to back (as nccl-tests does: warm-up, then a timed loop whose length all ranks
agree on), the per-op time is the slowest rank's, and the least of a few such samples
is kept: a sample is only ever lengthened by other work on the machine (a gloo rank that
loses its core mid-loop), never shortened, so the least is the op's own cost (the reason
Python's ``timeit`` documentation gives for taking the minimum). With the median, two of
three samples slowed at one size could leave the sweep not growing with size, and the
α-β fit refused it. Sizes follow nccl-tests: S is the buffer on one rank (the all-reduced tensor,
the all-gather output, the reduce-scatter input) and ``algbw = S / t``, ``busbw =
algbw × factor`` with factor 2(n−1)/n for all-reduce, (n−1)/n for all-gather and
reduce-scatter and 1 for send/recv. Send/recv is a ping-pong between ranks 0 and 1;
half the round trip is one transfer.

``fit_link`` then fits α and β of the link kind the ranks talk over (``sim.calibrate.fit``).
"""

from __future__ import annotations

import time
import warnings

from sim.calibrate import require_torch
from sim.calibrate.fit import BUSBW_FACTOR, fit_alpha_beta
from sim.calibrate.launch import Context, measure, training_dtype

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
QUICK_SIZES = tuple(2**p for p in range(12, 23, 2))        # 4 KiB .. 4 MiB
FULL_SIZES = tuple(2**p for p in range(10, 27))            # 1 KiB .. 64 MiB
GPU_SIZES = tuple(2**p for p in range(10, 31, 2))          # 1 KiB .. 1 GiB


def sweep_sizes(quick: bool, cuda: bool, up_to: int | None = None) -> tuple[int, ...]:
    """The sizes to sweep; with ``up_to``, doubled beyond the sweep until one reaches it
    (``validate`` passes the largest message its reference run sends, so the link fit
    covers it instead of extrapolating)."""
    sizes = (GPU_SIZES[:8] if quick else GPU_SIZES) if cuda else (QUICK_SIZES if quick else FULL_SIZES)
    extra = []
    while up_to is not None and (extra or sizes)[-1] < up_to:
        extra.append(2 * (extra or sizes)[-1])
    return tuple(sizes) + tuple(extra)


def _op(torch, dist, ctx: Context, op: str, nbytes: int):
    """A no-argument callable running ``op`` once on an S-byte buffer (nccl-tests' S)."""
    dt = training_dtype(ctx)
    e = torch.tensor([], dtype=dt).element_size()
    n = ctx.world
    count = max(n, (nbytes // e) // n * n)   # a multiple of the ranks
    dev = ctx.device
    if op == "all_reduce":
        x = torch.ones(count, device=dev, dtype=dt)
        return lambda: dist.all_reduce(x), count * e
    if op == "all_gather":
        inp = torch.ones(count // n, device=dev, dtype=dt)
        out = torch.empty(count, device=dev, dtype=dt)
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: fn(out, inp), count * e
    if op == "reduce_scatter":
        inp = torch.ones(count, device=dev, dtype=dt)
        out = torch.empty(count // n, device=dev, dtype=dt)
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: fn(out, inp), count * e
    x = torch.ones(count, device=dev, dtype=dt)
    if ctx.rank == 0:
        def ping():
            dist.send(x, 1)
            dist.recv(x, 1)
    elif ctx.rank == 1:
        def ping():
            dist.recv(x, 0)
            dist.send(x, 0)
    else:
        ping = None
    return ping, count * e


def _agree_max(torch, dist, ctx: Context, value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def bench_collectives(ctx: Context, sizes, repeats: int = 5, ops=OPS) -> list[dict]:
    """Records ``{op, ranks, bytes, time_s, algbw_Bps, busbw_Bps}`` for each op and size."""
    torch = require_torch()
    import torch.distributed as dist

    n = ctx.world
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated *_into_tensor names on new torch
        for op in ops:
            for size in sizes:
                fn, nbytes = _op(torch, dist, ctx, op, size)
                # Agree on the loop length (every rank must run the same number of ops).
                dist.barrier()
                t0 = time.perf_counter()
                if fn is not None:
                    fn()
                ctx.sync()
                one = _agree_max(torch, dist, ctx, time.perf_counter() - t0)
                inner = max(1, min(50, int(2e-3 / max(one, 1e-7))))
                samples = []
                for _ in range(repeats):
                    dist.barrier()
                    t = measure(ctx, fn, warmup=1, repeats=1, inner=inner) if fn is not None else 0.0
                    samples.append(_agree_max(torch, dist, ctx, t))
                t = min(samples)  # the least-disturbed sample (module doc)
                if op == "send_recv":
                    t /= 2.0  # a ping-pong is two transfers
                algbw = nbytes / t
                out.append({"op": op, "ranks": n if op != "send_recv" else 2, "bytes": nbytes, "time_s": t,
                            "algbw_Bps": algbw, "busbw_Bps": algbw * BUSBW_FACTOR[op](n if op != "send_recv" else 2)})
    return out


def fit_link(records, base_s: float = 0.0) -> dict:
    """α-β of the link from collective records (all ops together), each time less
    ``base_s`` (the base latency the simulator adds, ``sim.calibrate.fit.fit_alpha_beta``),
    plus the largest message's bus bandwidth for comparison."""
    fit = fit_alpha_beta([(r["op"], r["ranks"], r["bytes"], r["time_s"]) for r in records], base_s)
    largest = max(records, key=lambda r: (r["bytes"], r["op"] == "all_reduce"))
    fit["largest_busbw_Bps"] = max(r["busbw_Bps"] for r in records if r["bytes"] == largest["bytes"])
    return fit
