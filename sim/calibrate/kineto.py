"""Importer for PyTorch profiler (Kineto) traces: per-op times and a measured timeline.

A Kineto trace is Chrome trace JSON (``{"traceEvents": [...]}``, complete events
``ph: "X"`` with ``ts``/``dur`` in microseconds) plus ``distributedInfo`` (rank,
world size, backend); ``.json.gz`` files (what ``tensorboard_trace_handler`` writes) are
read as well. GPU kernels have ``cat: "kernel"`` (args ``stream``, ``device``);
NCCL kernels are named ``ncclKernel_*``/``ncclDevKernel_*`` and carry ``Collective
name``; host-side operators are ``cat: "cpu_op"``; ``torch.profiler.record_function``
ranges are ``user_annotation`` (and ``gpu_user_annotation`` on the GPU timeline).
Needs no torch: this reads files.

``op_times`` aggregates per name: count, total and *self* seconds (a CPU operator's own
time without the operators nested in it on its thread, so ``aten::linear`` and the
``aten::addmm`` inside it are not counted twice); GPU kernels never nest.

``trace_from_kineto`` turns one trace per rank into a ``sim.results.trace.Trace`` that the
timeline plot draws like a simulated one. What becomes a span (``level``):

- ``kernels``: every GPU kernel; NCCL kernels on a ``comm`` stream as collectives
  (category from the collective's name: p2p ``pp``, others ``dp``), the rest on
  ``compute``;
- ``annotations``: the ``record_function`` ranges (as the GPU ran them when the trace
  has ``gpu_user_annotation`` events, else on the main CPU thread): the reference run's
  steps (``1F0``: compute, category F), ``pp ...`` (p2p), ``dp ...`` (gradient
  all-reduce) and ``optimizer``;
- ``auto``: kernels when the trace has any, else annotations, else top-level CPU ops.

Time zero is the earliest span over all ranks (ranks of one host share a clock; across
hosts the clocks must be synchronised for the alignment to mean anything). Ranks come
from ``distributedInfo.rank``, else from the order of the files.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib

from sim.errors import InputError
from sim.inputs.schema_commands import KINETO_LEVELS
from sim.program.schedules import Step
from sim.results.trace import Span, Trace

LEVELS = KINETO_LEVELS  # (declared with --level, sim.inputs.schema_commands)
_NCCL = re.compile(r"^nccl(Dev)?Kernel_", re.I)


def load_kineto(source) -> dict:
    """A trace dict from a path or a dict, checked: an ``InputError`` names what is wrong."""
    if isinstance(source, dict):
        data, where = source, "trace"
    else:
        from sim.fileio import read_bytes

        where = str(source)
        raw = read_bytes(source, "trace")
        if raw[:2] == b"\x1f\x8b":
            try:
                raw = gzip.decompress(raw)
            except EOFError:
                raise InputError(f"{where}: a truncated gzip file; export the trace again") from None
            except (OSError, zlib.error) as exc:
                raise InputError(f"{where}: a damaged gzip file ({exc}); export the trace again") from None
        # A stray byte that is not UTF-8 (in a kernel name, say) is replaced rather than
        # costing the whole trace; a file that is not JSON still fails below.
        text = raw.decode("utf-8", "replace")
        if not text.strip():
            raise InputError(f"{where}: the file is empty; expected Chrome trace JSON from torch.profiler")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not valid JSON (line {exc.lineno}: {exc.msg}); "
                             "a truncated profiler trace? export it again") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if isinstance(data, dict) and "traceEvents" in data and not isinstance(data["traceEvents"], list):
        raise InputError(f"{where}: traceEvents: got {type(data['traceEvents']).__name__}; expected a list of "
                         "events")
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise InputError(f"{where}: traceEvents: missing; expected Chrome trace JSON "
                         "({\"traceEvents\": [...]}) as torch.profiler's export_chrome_trace writes")
    for i, e in enumerate(data["traceEvents"]):
        if not isinstance(e, dict):
            raise InputError(f"{where}: traceEvents[{i}]: got {e!r}; expected an event object")
        if e.get("ph") == "X":
            if not isinstance(e.get("name"), str):
                raise InputError(f"{where}: traceEvents[{i}]: name: got {e.get('name')!r}; expected a string "
                                 "(a complete event, ph 'X', needs a name)")
            for key in ("ts", "dur"):
                v = e.get(key)
                if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                        or (key == "dur" and v < 0)):
                    raise InputError(f"{where}: traceEvents[{i}] ({e.get('name')!r}): {key}: got {v!r}; "
                                     f"expected a finite number of microseconds{' >= 0' if key == 'dur' else ''}")
    info = data.get("distributedInfo")
    if info is not None:
        if not isinstance(info, dict):
            raise InputError(f"{where}: distributedInfo: got {info!r}; expected an object (rank, world_size, ...)")
        r = info.get("rank")
        if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 0):
            raise InputError(f"{where}: distributedInfo.rank: got {r!r}; expected an integer >= 0")
    data.setdefault("_where", where)
    return data


def _complete(data: dict, cats) -> list[dict]:
    return [e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") in cats]


def op_times(source) -> dict:
    """Per op name: ``count``, ``total_s``, ``self_s`` and ``mean_s`` (kernels if the
    trace has GPU kernels, else CPU operators), sorted by self time."""
    data = load_kineto(source)
    events = _complete(data, ("kernel",))
    kind = "kernel"
    if not events:
        events, kind = _complete(data, ("cpu_op",)), "cpu_op"
    self_us = _self_times(events) if kind == "cpu_op" else [e["dur"] for e in events]
    out: dict[str, dict] = {}
    for e, own in zip(events, self_us):
        row = out.setdefault(e["name"], {"count": 0, "total_s": 0.0, "self_s": 0.0})
        row["count"] += 1
        row["total_s"] += e["dur"] * 1e-6
        row["self_s"] += own * 1e-6
    for row in out.values():
        row["mean_s"] = row["total_s"] / row["count"]
    return {"kind": kind, "ops": dict(sorted(out.items(), key=lambda kv: (-kv[1]["self_s"], kv[0])))}


def _self_times(events: list[dict]) -> list[float]:
    """Duration minus the durations of directly nested events on the same thread."""
    idx = sorted(range(len(events)), key=lambda i: (events[i].get("pid"), events[i].get("tid"),
                                                    events[i]["ts"], -events[i]["dur"]))
    own = [float(e["dur"]) for e in events]
    stack: list[int] = []
    last_thread = None
    for i in idx:
        e = events[i]
        thread = (e.get("pid"), e.get("tid"))
        if thread != last_thread:
            stack, last_thread = [], thread
        while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= e["ts"]:
            stack.pop()
        if stack:
            own[stack[-1]] -= e["dur"]
        stack.append(i)
    return [max(0.0, x) for x in own]


def _rank(data: dict, default: int) -> int:
    info = data.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    return default


def _annotation_span(e: dict, rank: int, t0: float) -> Span | None:
    name = e["name"]
    a, z = (e["ts"] - t0) * 1e-6, (e["ts"] + e["dur"] - t0) * 1e-6
    step = _step(name)
    if step is not None:
        return Span(rank, "compute", name, "compute", step.kind, a, z)
    if name == "optimizer":
        return Span(rank, "compute", name, "compute", "opt", a, z)
    if name.startswith("pp "):
        return Span(rank, "pp", name, "recv", "pp", a, z)
    if name.startswith("dp "):
        return Span(rank, "dp", name, "collective", "dp", a, z)
    return None


def _step(name: str) -> Step | None:
    try:
        return Step.parse(name)
    except InputError:
        return None


def _kernel_span(e: dict, rank: int, t0: float) -> Span:
    a, z = (e["ts"] - t0) * 1e-6, (e["ts"] + e["dur"] - t0) * 1e-6
    args = e.get("args") or {}
    if _NCCL.match(e["name"]):
        coll = str(args.get("Collective name", e["name"]))
        cat = "pp" if any(k in coll.lower() for k in ("send", "recv")) else "dp"
        return Span(rank, "comm", coll, "collective", cat, a, z)
    return Span(rank, "compute", e["name"], "compute", "compute", a, z)


def trace_from_kineto(sources, level: str = "auto") -> Trace:
    """One ``Trace`` from the traces of several ranks (paths or dicts); see the module doc."""
    if level not in LEVELS:
        raise InputError(f"level: got {level!r}; allowed: {', '.join(LEVELS)}")
    datas = [load_kineto(s) for s in sources]
    if not datas:
        raise InputError("trace: no files given")
    picked = []
    for i, data in enumerate(datas):
        rank = _rank(data, i)
        kernels = _complete(data, ("kernel",))
        lvl = level
        if lvl == "auto":
            lvl = "kernels" if kernels else ("annotations" if any(
                _annotation_span(e, 0, 0.0) for e in _complete(data, ("user_annotation",))) else "cpu_ops")
        if lvl == "kernels":
            events = kernels
        elif lvl == "annotations":
            # On a GPU the ranges as the GPU ran them; on a CPU the main thread's.
            events = _complete(data, ("gpu_user_annotation",))
            if not events:
                main = {e.get("pid") for e in data["traceEvents"] if e.get("ph") == "X"}
                events = [e for e in _complete(data, ("user_annotation",)) if e.get("tid") in main]
        else:
            events = _top_level(_complete(data, ("cpu_op",)))
        picked.append((rank, lvl, events))
    ranks = [r for r, _, _ in picked]
    if len(set(ranks)) != len(ranks):
        dup = next(r for r in ranks if ranks.count(r) > 1)
        files = [d["_where"] for d, (r, _, _) in zip(datas, picked) if r == dup]
        raise InputError(f"trace: ranks {ranks}: two files claim the same rank {dup} ({', '.join(files)}); "
                         "give one trace per rank")
    starts = [e["ts"] for _, _, ev in picked for e in ev]
    if not starts:
        raise InputError(f"{datas[0]['_where']}: no events at level {level!r}: nothing to draw")
    t0 = min(starts)
    spans = []
    for rank, lvl, events in picked:
        for e in events:
            if lvl == "kernels":
                spans.append(_kernel_span(e, rank, t0))
            elif lvl == "annotations":
                sp = _annotation_span(e, rank, t0)
                if sp is not None:
                    spans.append(sp)
            else:
                a, z = (e["ts"] - t0) * 1e-6, (e["ts"] + e["dur"] - t0) * 1e-6
                spans.append(Span(rank, "compute", e["name"], "compute", "compute", a, z))
    spans.sort(key=lambda s: (s.rank, s.stream, s.start_s, s.end_s))
    return Trace(spans, [], {}, {}, ranks={r: {"node": 0, "device": f"rank{r}"} for r in sorted(ranks)},
                 topology="measured (PyTorch profiler)")


def _top_level(events: list[dict]) -> list[dict]:
    """CPU operators not nested in another operator of the same thread."""
    out, ends = [], {}
    for e in sorted(events, key=lambda e: (e.get("pid"), e.get("tid"), e["ts"], -e["dur"])):
        thread = (e.get("pid"), e.get("tid"))
        if e["ts"] >= ends.get(thread, float("-inf")):
            out.append(e)
            ends[thread] = e["ts"] + e["dur"]
    return out
