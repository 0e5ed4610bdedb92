"""One collective on a topology, timed as nccl-tests reports it.

``run_collective`` builds the smallest program there is, one collective action on ranks
0..N-1 (or one send and its receive), lets NCCL's tuner (``sim.engine.tuner``) pick the
algorithm and protocol where asked ("auto"), and simulates it on the topology. Its summary
holds the time (with NCCL's base latency of the algorithm and protocol,
``sim.engine.nccl``), the algorithm bandwidth (algbw = size / time) and the bus bandwidth:
busbw = algbw × 2(n−1)/n for all-reduce, × (n−1)/n for all-gather, reduce-scatter and
all-to-all, × 1 for broadcast and send/recv (nccl-tests' PERFORMANCE.md), plus the bytes
each kind of link carried. ``trainsim collective`` prints it; the demo and the
experiments sweep it over sizes and algorithms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from sim.engine.core import simulate
from sim.engine.nccl import DEFAULT_MODEL, NcclModel, TunerRequest, base_latency
from sim.engine.tuner import choose
from sim.errors import InputError
from sim.program.api import Action, Program


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for ``op`` on ``n`` ranks (nccl-tests' definitions)."""
    if n <= 1:
        return 1.0
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class CollectiveOptions:
    """How ``run_collective`` runs its collective: NCCL's ``algo``, ``protocol`` ("auto" for
    either: NCCL's choice, ``sim.engine.nccl``, reported in the summary) and ``channels``
    (None: the algorithm's own); ``link_efficiency`` scales link kinds' line rates (a
    profile's achieved fractions); ``collective_model`` is "flows" or "steps"
    (``sim.engine.algorithms``); ``nccl``: the tuning model (None: the default one)."""

    algo: str = "ring"
    channels: int | None = None
    link_efficiency: Mapping[str, float] | None = None
    collective_model: str = "flows"
    protocol: str = "simple"
    nccl: NcclModel | None = None


def run_collective(op: str, nbytes: int, gpus: int, topo, options: CollectiveOptions = CollectiveOptions()):
    """Simulate one collective on ranks 0..gpus-1 of ``topo``, as ``options`` say; return
    (trace, summary dict)."""
    algo, channels, link_efficiency = options.algo, options.channels, options.link_efficiency
    collective_model, protocol, nccl = options.collective_model, options.protocol, options.nccl
    if gpus > topo.num_gpus:
        raise InputError(f"--gpus: got {gpus}; topology {topo.name} has only {topo.num_gpus} GPUs")
    if op == "sendrecv":
        if gpus < 2:
            raise InputError(f"--gpus: got {gpus}; sendrecv needs at least 2 (it sends from rank 0 to rank N-1)")
        src, dst = 0, gpus - 1
        prog = Program({src: [Action("send", kind="send", peer=dst, nbytes=nbytes, category="send")],
                        dst: [Action("recv", kind="recv", peer=src, nbytes=nbytes, category="recv")]})
    else:
        if gpus < 2:
            raise InputError(f"--gpus: got {gpus}; {op} needs at least 2 GPUs (one GPU has nothing to exchange)")
        group = tuple(range(gpus))
        if channels is not None and channels < 1:
            raise InputError(f"--channels: got {channels}; expected an integer >= 1")
        if "auto" in (algo, protocol):
            algo, protocol = choose(TunerRequest(op, group, nbytes, topo, link_efficiency, nccl, algo, protocol))
        prog = Program({r: [Action(op, kind="collective", op=op, group=group, nbytes=nbytes, algo=algo,
                                   protocol=protocol, channels=channels or 0)] for r in group})
    trace = simulate(prog, topo, link_efficiency=link_efficiency, fluid_collectives=collective_model == "flows",
                     nccl=nccl)
    t = trace.end_s
    base = 0.0 if op == "sendrecv" else base_latency(nccl or DEFAULT_MODEL, op, range(gpus), topo, algo, protocol)
    # A zero time happens only for an empty buffer on zero-latency links (or links of
    # infinite bandwidth): report no bandwidth rather than a division by zero.
    algbw = nbytes / t if t > 0 else (0.0 if nbytes == 0 else math.inf)
    n = 2 if op == "sendrecv" else gpus
    summary = {
        "op": op, "algo": algo, "protocol": protocol, "collective_model": collective_model, "size_bytes": nbytes, "gpus": gpus, "topology": topo.name,
        "nodes": topo.num_nodes, "time_s": t, "base_latency_s": base, "algbw_Bps": algbw,
        "busbw_Bps": algbw * bus_factor(op, n),
        "bytes_by_link_kind": trace.bytes_by_link_kind(), "transfers": len(trace.transfers),
        "link_efficiency": dict(link_efficiency or {}),
    }
    return trace, summary
