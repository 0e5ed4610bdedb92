"""Trace export to Chrome/Perfetto JSON (opens in ui.perfetto.dev and chrome://tracing).

Layout: one process per GPU (``pid`` = rank), named ``node N / GPU M (rank R)`` through
``process_name`` metadata and sorted by rank; one thread per stream (``compute`` first,
then communication streams), named through ``thread_name``. Every span is a complete
event (``ph: "X"``) with times in microseconds; a send and its matching receive are
joined by a flow arrow (``ph: "s"`` on the send, ``ph: "f"`` with ``"bp": "e"`` on the
receive, sharing an ``id``). Output is deterministic: same trace, same bytes.
"""

from __future__ import annotations

from pathlib import Path

from sim.fileio import write_json_atomic, write_text_atomic  # noqa: F401  (re-exported: the writers live there)
from sim.results.trace import Trace

_US = 1e6


def _tids(trace: Trace) -> dict[tuple[int, str], int]:
    return {(r, s): i for r, streams in trace.streams().items() for i, s in enumerate(streams)}


def process_name(trace: Trace, rank: int) -> str:
    info = trace.ranks.get(rank, {})
    device = str(info.get("device", ""))
    local = device.rsplit("gpu", 1)[-1] if "gpu" in device else str(rank)
    return f"node {info.get('node', 0)} / GPU {local} (rank {rank})"


def to_chrome(trace: Trace, names: dict[int, str] | None = None) -> dict:
    """The trace as a Chrome trace-event dict ``{"traceEvents": [...], ...}``.

    ``names`` overrides process names per rank (e.g. with the stage, tp and dp index).
    """
    events: list[dict] = []
    tids = _tids(trace)
    for r, streams in trace.streams().items():
        pname = (names or {}).get(r) or process_name(trace, r)
        events.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": pname}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        for s in streams:
            tid = tids[(r, s)]
            events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": s}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": r, "tid": tid, "args": {"sort_index": tid}})
    for sp in trace.spans:
        args = {"kind": sp.kind}
        if sp.nbytes:
            args["bytes"] = sp.nbytes
        if sp.flops:
            args["flops"] = sp.flops
        if sp.peer is not None:
            args["peer"] = sp.peer
        if sp.op:
            args["op"] = sp.op
        tid = tids[(sp.rank, sp.stream)]
        events.append({
            "ph": "X", "name": sp.name, "cat": sp.category, "pid": sp.rank, "tid": tid,
            "ts": sp.start_s * _US, "dur": (sp.end_s - sp.start_s) * _US, "args": args,
        })
        if sp.link_id is not None:
            # Bind each end inside its slice: the send at its start, the receive just
            # before its end (both end when the data arrives).
            ts = sp.start_s * _US if sp.kind == "send" else (sp.end_s - min(sp.duration_s / 2, 1e-9)) * _US
            flow = {"name": "p2p", "cat": "p2p", "id": sp.link_id, "pid": sp.rank, "tid": tid, "ts": ts}
            if sp.kind == "send":
                flow["ph"] = "s"
            else:
                flow.update(ph="f", bp="e")
            events.append(flow)
    events.extend(_memory_counters(trace))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "trainsim", "topology": trace.topology},
    }


def _memory_counters(trace: Trace) -> list[dict]:
    """One counter track per rank: bytes held per category over time."""
    from sim.results.memory_timeline import timeline

    out = []
    for r in sorted({rank for _, rank, _, _ in trace.memory}):
        times, series = timeline(trace, r)
        for i, t in enumerate(times):
            out.append({"ph": "C", "name": "memory_bytes", "pid": r, "ts": t * _US,
                        "args": {c: s[i] for c, s in series.items()}})
    return out


def write_chrome(trace: Trace, path: str | Path, names: dict[int, str] | None = None) -> Path:
    """Write the Perfetto/Chrome trace JSON for ``trace`` to ``path``."""
    return write_json_atomic(to_chrome(trace, names), path)
