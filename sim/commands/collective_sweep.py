"""``trainsim collective --sweep MIN:MAX``: nccl-tests style output.

Rows in the columns of nccl-tests' ``all_reduce_perf -b MIN -e MAX -f 2``: size (bytes),
count (elements), type, redop, root, then time (us), algbw and busbw (GB/s) and #wrong,
out-of-place and in-place (the simulator times both alike), and the footer
``# Avg bus bandwidth``. A user can diff it against their own log.
"""

from __future__ import annotations

from sim.errors import InputError
from sim.studies.collective import run_collective
from sim.units import parse_size

_TYPE_BYTES = 4  # float, nccl-tests' default -d float
_REDOP = {"allreduce": "sum", "reducescatter": "sum", "allgather": "none", "broadcast": "none", "alltoall": "none",
          "sendrecv": "none"}


def sweep_sizes(text: str) -> list[int]:
    """Sizes from ``MIN:MAX`` in factor-2 steps (as ``-b MIN -e MAX -f 2``)."""
    parts = text.split(":")
    if len(parts) != 2:
        raise InputError(f"--sweep: got {text!r}; expected MIN:MAX, e.g. 8:8G")
    lo, hi = (parse_size(p if p[-1:].isdigit() or p[-1:] == "B" else p + "iB", "--sweep") for p in parts)
    if lo < 1 or hi < lo:
        raise InputError(f"--sweep: got {text!r}; expected 1 <= MIN <= MAX")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 2
    return out


def print_sweep(args, op: str, gpus: int, topo, eff, nccl) -> int:
    """Print the rows, one ``run_collective`` per size."""
    sizes = sweep_sizes(args.sweep)
    print(f"# trainsim collective: {op} on {gpus} GPUs of {topo.describe()}, algo {args.algo}, protocol {args.protocol}")
    print("#")
    print("#                                                              out-of-place                       in-place")
    print("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong")
    print("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)")
    total = 0.0
    for size in sizes:
        size -= size % _TYPE_BYTES if size >= _TYPE_BYTES else 0
        _, s = run_collective(op, size, gpus, topo, args.algo, args.channels, eff, args.collective_model,
                              args.protocol, nccl)
        t_us = s["time_s"] * 1e6
        algbw, busbw = s["algbw_Bps"] / 1e9, s["busbw_Bps"] / 1e9
        total += busbw
        count = size // _TYPE_BYTES
        root = 0 if op in ("broadcast",) else -1
        cols = f"{t_us:8.2f} {algbw:7.2f} {busbw:7.2f} {0:6d}"
        print(f"{size:12d}  {count:12d}  {'float':>8}  {_REDOP[op]:>6}  {root:6d}  {cols}  {cols}")
    print(f"# Out of bounds values : 0 OK")
    print(f"# Avg bus bandwidth    : {total / len(sizes):.4f} ")
    print("#")
    return 0
