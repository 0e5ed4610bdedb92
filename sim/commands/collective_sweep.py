"""``trainsim collective --sweep MIN:MAX``: nccl-tests style output.

Rows in the columns of nccl-tests' ``all_reduce_perf -b MIN -e MAX -f 2``: size (bytes),
count (elements), type, redop, root, then time (us), algbw and busbw (GB/s) and #wrong,
out-of-place and in-place (the simulator times both alike), and the footer
``# Avg bus bandwidth``. A user can diff it against their own log (or import it:
the rows keep nccl-tests' columns). The algorithm and protocol NCCL's tuner chose for each
size follow as comment lines (one per run of sizes with the same choice). With ``--out DIR``
it also writes ``busbw.png``, bus bandwidth against size on a log axis: the tuner's choice,
and each protocol forced (as ``NCCL_PROTO``) dashed, and ``busbw.csv`` with those numbers.
"""

from __future__ import annotations

from pathlib import Path

from sim.engine.nccl import PROTOCOLS
from sim.engine.tuner import runnable
from sim.errors import InputError
from sim.studies.collective import CollectiveOptions, run_collective
from sim.units import format_bytes, parse_size

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
    chosen = []
    how = CollectiveOptions(algo=args.algo, channels=args.channels, link_efficiency=eff,
                            collective_model=args.collective_model, protocol=args.protocol, nccl=nccl)
    for size in sizes:
        size -= size % _TYPE_BYTES if size >= _TYPE_BYTES else 0
        _, s = run_collective(op, size, gpus, topo, how)
        t_us = s["time_s"] * 1e6
        algbw, busbw = s["algbw_Bps"] / 1e9, s["busbw_Bps"] / 1e9
        total += busbw
        chosen.append((size, s["busbw_Bps"], f"{s['algo']}/{s['protocol']}"))
        count = size // _TYPE_BYTES
        root = 0 if op in ("broadcast",) else -1
        cols = f"{t_us:8.2f} {algbw:7.2f} {busbw:7.2f} {0:6d}"
        print(f"{size:12d}  {count:12d}  {'float':>8}  {_REDOP[op]:>6}  {root:6d}  {cols}  {cols}")
    print("# Out of bounds values : 0 OK")
    print(f"# Avg bus bandwidth    : {total / len(sizes):.4f} ")
    print("#")
    for lo, hi, choice in _runs(chosen):
        print(f"# {format_bytes(lo):>10} .. {format_bytes(hi):>10}: {choice}")
    if args.out:
        _write_picture(args, op, gpus, topo, eff, nccl, chosen)
    return 0


def _runs(chosen: list[tuple]) -> list[tuple]:
    """(first size, last size, choice) for each run of sizes with the same choice."""
    out: list[list] = []
    for size, _, choice in chosen:
        if out and out[-1][2] == choice:
            out[-1][1] = size
        else:
            out.append([size, size, choice])
    return [tuple(r) for r in out]


def _write_picture(args, op: str, gpus: int, topo, eff, nccl, chosen: list[tuple]) -> None:
    """``busbw.png`` and ``busbw.csv`` under ``args.out`` (module doc)."""
    from sim.fileio import write_text_atomic
    from sim.results.plot import plot_busbw_curves

    out = Path(args.out)
    sizes = [c[0] for c in chosen]
    auto = "NCCL's choice" if (args.algo, args.protocol) == ("auto", "auto") else f"{args.algo}/{args.protocol}"
    curves = {auto: (sizes, [c[1] for c in chosen])}
    if args.protocol == "auto":
        for p in PROTOCOLS:
            if args.algo != "auto" and (args.algo.startswith("nvls") and p != "simple"
                                        or not runnable(op, range(gpus), topo, args.algo)):
                continue
            how = CollectiveOptions(algo=args.algo, channels=args.channels, link_efficiency=eff,
                                    collective_model=args.collective_model, protocol=p, nccl=nccl)
            runs = [run_collective(op, n, gpus, topo, how)[1] for n in sizes]
            curves[f"{p} forced ({runs[-1]['algo']} at {format_bytes(sizes[-1])})"] = (sizes, [r["busbw_Bps"]
                                                                                            for r in runs])
    title = f"{op} bus bandwidth on {gpus} GPUs of {topo.describe()}"
    plot_busbw_curves(curves, out / "busbw.png", title, notes={auto: [c[2] for c in chosen]})
    lines = ["size_bytes," + ",".join(f"busbw_Bps {k}" for k in curves) + ",choice"]
    for i, (n, _, choice) in enumerate(chosen):
        lines.append(f"{n}," + ",".join(f"{v[1][i]:.6g}" for v in curves.values()) + f",{choice}")
    write_text_atomic("\n".join(lines) + "\n", out / "busbw.csv")
    print(f"# wrote {out / 'busbw.png'}, busbw.csv")
