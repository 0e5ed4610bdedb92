"""A CPU-only Kineto trace (a job on CPUs with ``gloo``, as ``trainsim validate``'s reference
run writes on a machine without GPUs) as a ``RankGraph``.

Such a trace has no GPU kernels: the compute is the ``cpu_op`` events of the rank's main
thread (the thread that holds the step's span, else the one with the most operators), and
the communication is gloo's. Read from what PyTorch 2.x's profiler writes for gloo:

- each collective or point-to-point call is a ``c10d::`` operator on the main thread
  (``c10d::allreduce_``, ``c10d::send``, ``c10d::recv_``, ``c10d::barrier``, ...): where the
  host posted it. With ``record_shapes`` its ``Input Dims`` give the tensors' sizes; a
  send's or receive's peer is its third ``Concrete Inputs`` value (the rank in the
  default group; the reference run's point-to-point uses the default group);
- gloo's work is a ``gloo:<op>`` event (a collective on one of the process group's
  ``pt_gloo_runloop`` threads, lasting while it ran; a send or receive on the main thread,
  lasting until the host's ``wait()`` saw it complete), carrying the element type
  (``Input type``) and the sizes; the n-th ``gloo:<op>`` of the step belongs to the n-th
  ``c10d::<op>``;
- a ``record_param_comms`` operator, where the trace has one with the c10d operator's
  ``External id``, gives the size, type and group as it does for NCCL kernels.

The host's ``wait()`` on a work is not an operator of its own. It is placed where the trace
shows the host blocked: when the work completed (its ``gloo:`` event's end) in a gap between
the main thread's operators, the host waited from the end of the last operator before that
gap until the completion; when it completed while an operator was running, the host did not
block, and the wait is put after that operator.

Nodes, on lane ``cpu <tid>`` in the host's order: the host's time between calls, a node
per outermost operator or annotation of the main thread (its part of the interval; the
time between operators goes with the next), kept as measured less the time blocked in a
wait; each call's own time as measured, split where gloo's work began; each call's
communication (a collective on lane ``gloo``, a send or receive on a lane of its peer and
direction, so that a batch of sends and receives runs at once, as gloo's unbound buffers
do), depending on the host up to where gloo's work began; each wait, a zero-length node on
the host lane depending on the communication; the host's time from the last call to the
step's end. A collective's group: ``record_param_comms``' ``Process Group Ranks``, else the
only process group of ``distributedInfo.pg_config`` besides the default one that holds
this rank (the default one when there is no other), else the collective stays at its
measured duration (``comm``, counted in ``meta["unpriced_comm"]``). A barrier is an
all-reduce of its one byte.

The profiler's own cost: each operator and annotation it records costs the thread that runs
it a little (its callbacks at the start and end; with ``record_shapes``, the inputs' shapes
too), so the traced iteration ran slower than the same iteration unprofiled. Each host node
counts the events that began in it (``Node.recorded_ops``); ``sim.replay.run.replay`` takes
``HardwareProfile.profiler_op_overhead_s`` (measured by ``trainsim calibrate``) off per
event (``without_profiler``).

Not modelled: the CPU time the processes take from each other (ranks of one machine share
its cores; the replay gives each rank its own), and the compute's slowdown while gloo's
threads move data beside it (the measured operators already ran so).
"""

from __future__ import annotations

import bisect
import math
import re

from sim.errors import InputError
from sim.replay.graph import Node, RankGraph
from sim.replay.pytorch_names import COLLECTIVE_NAMES as _OPS, DTYPE_BYTES, ranks_of as _ranks

_C10D = re.compile(r"^c10d::(\w+)$")
_GLOO = re.compile(r"^gloo:(\w+)$")
_C10D_OPS = {"allreduce_": "allreduce", "allreduce_coalesced_": "allreduce", "allgather_": "allgather",
             "_allgather_base_": "allgather", "allgather_into_tensor_coalesced_": "allgather",
             "reduce_scatter_": "reducescatter", "_reduce_scatter_base_": "reducescatter",
             "reduce_scatter_tensor_coalesced_": "reducescatter", "broadcast_": "broadcast",
             "alltoall_base_": "alltoall", "alltoall_": "alltoall", "send": "send", "recv_": "recv",
             "barrier": "barrier"}
"""PyTorch's ``c10d::`` operators -> trainsim's ops (``barrier``: an all-reduce of one byte)."""
_GLOO_OF = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "broadcast": "broadcast", "alltoall": "all_to_all", "send": "send", "recv": "recv", "barrier": "barrier"}
"""trainsim's op -> the name of gloo's work event (``gloo:all_reduce``, ...)."""


def is_cpu_trace(data: dict) -> bool:
    """A trace without GPU work whose ranks talked through gloo (``c10d::`` operators or
    ``distributedInfo.backend`` gloo)."""
    info = data.get("distributedInfo") or {}
    if isinstance(info, dict) and str(info.get("backend", "")).lower() == "gloo":
        return True
    return any(e.get("ph") == "X" and isinstance(e.get("name"), str) and e["name"].startswith("c10d::")
               for e in data["traceEvents"])


def _nelems(dims) -> int | None:
    """Elements of a ``c10d::`` operator's first input (a tensor list) or a ``gloo:`` event's."""
    if not isinstance(dims, list) or not dims:
        return None
    first = dims[0]
    tensors = first if first and all(isinstance(t, list) for t in first) else [first]
    total = 0
    for t in tensors:
        if not isinstance(t, list) or not all(isinstance(v, int) and v >= 0 for v in t):
            return None
        total += math.prod(t)
    return total


def read_cpu(data: dict, events: list, steps: dict, step: int | None, rank: int, info: dict) -> RankGraph:
    """One rank's graph from a CPU-only trace (see the module doc); ``events`` are its
    complete (``ph`` X) events, ``steps`` its ``ProfilerStep#N`` spans."""
    where = data["_where"]
    ops = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    if not ops:
        raise InputError(f"{where}: no GPU kernels and no CPU operators (events with cat 'cpu_op'); "
                         "replay needs a trace recorded with ProfilerActivity.CUDA, or a CPU job's with "
                         "ProfilerActivity.CPU")
    if step is not None and step not in steps:
        have = ", ".join(map(str, sorted(steps))) or "none (the trace has no ProfilerStep spans)"
        raise InputError(f"{where}: --step: got {step}; the trace's ProfilerStep numbers: {have}")
    chosen = step if step is not None else (max(steps) if steps else None)
    counts: dict = {}
    for e in ops:
        if e.get("cat") == "cpu_op":
            counts[e.get("tid")] = counts.get(e.get("tid"), 0) + 1
    if chosen is not None:
        span = steps[chosen]
        main = span.get("tid")
        t0, t1 = float(span["ts"]), float(span["ts"]) + float(span["dur"])
    else:
        main = max(counts, key=lambda t: (counts[t], str(t))) if counts else ops[0].get("tid")
        mine = [e for e in ops if e.get("tid") == main]
        t0 = min(float(e["ts"]) for e in mine)
        t1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in mine)
    host = sorted((e for e in ops if e.get("tid") == main and e.get("cat") == "cpu_op" and t0 <= e["ts"] < t1),
                  key=lambda e: (e["ts"], -e.get("dur", 0)))
    busy: list[list[float]] = []  # the main thread inside an operator: merged intervals
    for e in host:
        a, z = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        if busy and a <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], z)
        else:
            busy.append([a, z])
    comm_args = {e["args"]["External id"]: e["args"] for e in events
                 if e.get("name") == "record_param_comms" and isinstance(e.get("args"), dict)
                 and e["args"].get("External id") is not None}
    work: dict[str, list] = {}
    for e in sorted(events, key=lambda e: e["ts"]):
        m = _GLOO.match(str(e.get("name", "")))
        if m and e["ts"] + e.get("dur", 0) >= t0 and e["ts"] < t1:
            work.setdefault(m.group(1), []).append(e)
    calls, ended = [], -1.0
    for e in host:
        m = _C10D.match(e["name"])
        if not m or e["ts"] < ended:  # (not one, or nested in one)
            continue
        op = _C10D_OPS.get(m.group(1))
        if op is None:
            continue
        ended = e["ts"] + e.get("dur", 0)
        calls.append((e, op))
    spans = [e for e in ops if e.get("tid") == main and t0 <= e["ts"] < t1 and not _GLOO.match(e["name"])
             and not e["name"].startswith("ProfilerStep#") and not _C10D.match(e["name"])]

    top, reach = [], -1.0  # the main thread's outermost operators and annotations, in order
    for e in sorted(spans, key=lambda e: (e["ts"], -e.get("dur", 0))):
        if e["ts"] >= reach:
            top.append(e)
            reach = e["ts"] + e.get("dur", 0)

    def host_time(a: float, z: float) -> None:
        """The host's time in [a, z]: a node per outermost operator or annotation in it (its
        part inside), in thread order; the time between them goes with the next one."""
        start = a
        for e in top:
            ea, ez = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
            if ez <= a or ea >= z:
                continue
            end = min(z, ez)
            b.host(e["name"], start, end)
            start = end
        if z > start:
            b.host("host", start, z)

    groups = _groups(info, rank)
    used: dict[str, int] = {}
    b = _Builder(rank, main, sorted(float(e["ts"]) for e in ops if e.get("tid") == main))
    anchor = t0
    pending = []  # (wait time, resume time, order, comm node)
    for order, (e, op) in enumerate(calls):
        cs, ce = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        anchor = b.waits_before(pending, cs, anchor, host_time)
        gname = _GLOO_OF[op]
        k = used.get(gname, 0)
        candidates = [w for w in work.get(gname, ())[k:] if w["ts"] >= cs - 1.0]
        w = candidates[0] if candidates else None
        if w is not None:
            used[gname] = work[gname].index(w) + 1
        done = float(w["ts"]) + float(w.get("dur", 0)) if w is not None else ce
        host_time(anchor, cs)
        # gloo's work starts where its event does, within the call (a collective's on a
        # runloop thread once the call queued it; a send's or receive's when the call returns)
        ws = min(max(float(w["ts"]), cs), ce) if w is not None else ce
        post = b.host(e["name"], max(anchor, cs), ws)
        fields = _fields(e, w, op, comm_args, groups, rank)
        measured = (done - cs) * 1e-6
        if fields["kind"] == "comm":
            b.unpriced += 1
        lane = {"send": f"gloo send {fields.get('peer')}", "recv": f"gloo recv {fields.get('peer')}"}.get(
            fields["kind"], "gloo")
        node = b.add(e["name"].removeprefix("c10d::"), lane=lane, duration_s=measured, category="comm",
                     ctrl=(post,), **fields)
        b.host(e["name"], max(anchor, ws), ce)  # (the rest of the call: kept as measured)
        anchor = max(anchor, ce)
        # Where the host waited for it (see the module doc).
        inside = next((iv for iv in busy if iv[0] < done < iv[1]), None)
        if inside is not None:
            wait_at, resume = inside[1], inside[1]
        else:
            before = [iv[1] for iv in busy if iv[1] <= done]
            wait_at, resume = (max(before) if before else done), done
        pending.append((max(wait_at, ce), resume, order, node))
    anchor = b.waits_before(pending, float("inf"), anchor, host_time)
    host_time(anchor, t1)
    return RankGraph(rank, tuple(b.nodes), where, (t1 - t0) * 1e-6,
                     {"unpriced_comm": b.unpriced, "cpu_trace": True})


def without_profiler(graph: RankGraph, per_op_s: float) -> RankGraph:
    """``graph`` with each host node's time less ``per_op_s`` for every operator or annotation
    the profiler recorded in it (``Node.recorded_ops``; not below zero): the job as it runs
    without the profiler, whose callbacks at each recorded operator's start and end run on
    the thread that runs the operators (``HardwareProfile.profiler_op_overhead_s``). The
    time taken off is ``meta["profiler_removed_s"]``."""
    nodes, removed = [], 0.0
    for n in graph.nodes:
        if n.recorded_ops and n.category == "cpu":
            d = max(0.0, n.duration_s - n.recorded_ops * per_op_s)
            removed += n.duration_s - d
            n = n._replace(duration_s=d)
        nodes.append(n)
    return RankGraph(graph.rank, tuple(nodes), graph.source, graph.traced_step_s,
                     {**graph.meta, "profiler_removed_s": removed,
                      "recorded_ops": sum(n.recorded_ops for n in graph.nodes)})


class _Builder:
    def __init__(self, rank: int, main, starts: list):
        self.rank, self.lane = rank, f"cpu {main}"
        self.starts = starts  # (the main thread's recorded events' start times, sorted)
        self.nodes: list[Node] = []
        self.prev: int | None = None
        self.unpriced = 0

    def add(self, name, *, lane, duration_s, category, ctrl=(), data=(), kind="compute", **kw) -> int:
        i = len(self.nodes)
        self.nodes.append(Node(i, name, kind, lane, duration_s, category, ctrl_deps=tuple(ctrl),
                               data_deps=tuple(data), **kw))
        return i

    def host(self, name: str, a_us: float, z_us: float, data=()) -> int:
        """The host's time from ``a_us`` to ``z_us`` (the trace's microseconds), with the
        profiler's events that began in it."""
        n = bisect.bisect_left(self.starts, z_us) - bisect.bisect_left(self.starts, a_us) if z_us > a_us else 0
        i = self.add(name, lane=self.lane, duration_s=max(0.0, (z_us - a_us) * 1e-6), category="cpu",
                     ctrl=() if self.prev is None else (self.prev,), data=data, recorded_ops=n)
        self.prev = i
        return i

    def waits_before(self, pending: list, limit: float, anchor: float, host_time) -> float:
        """The waits due before host time ``limit``, in time order; the new anchor."""
        due = sorted((p for p in pending if p[0] <= limit), key=lambda p: (p[0], p[2]))
        for p in due:
            pending.remove(p)
            wait_at, resume, _, node = p
            host_time(anchor, wait_at)
            self.host(f"wait for {self.nodes[node].name}", 0.0, 0.0, data=(node,))
            anchor = max(anchor, resume, wait_at)
        return anchor


def _groups(info: dict, rank: int) -> tuple[list[tuple], tuple | None]:
    """The process groups of ``pg_config`` that hold ``rank`` (and more): the others, and the default one."""
    others, default = [], None
    for pg in info.get("pg_config") or ():
        if not isinstance(pg, dict) or not isinstance(pg.get("ranks"), list):
            continue
        ranks = tuple(r for r in pg["ranks"] if isinstance(r, int))
        if rank in ranks and len(ranks) > 1:
            if pg.get("pg_desc") == "default_pg" or str(pg.get("pg_name")) == "0":
                default = ranks
            else:
                others.append(ranks)
    return others, default


def _fields(e: dict, w: dict | None, op: str, comm_args: dict, groups: tuple, rank: int) -> dict:
    """A call's communication fields (``Node``'s), or ``{"kind": "comm"}`` when the trace does
    not tell its size or partners (see the module doc)."""
    a = e.get("args") or {}
    wa = (w or {}).get("args") or {}
    types = wa.get("Input type") if isinstance(wa.get("Input type"), list) else []
    size = DTYPE_BYTES.get(str(types[0]).strip().lower()) if types else None
    nel = _nelems(wa.get("Input Dims")) if wa.get("Input Dims") is not None else _nelems(a.get("Input Dims"))
    meta = comm_args.get(a.get("External id"))
    if meta is not None:  # record_param_comms, as for NCCL
        op = _OPS.get(str(meta.get("Collective name", "")).strip().lower(), op)
        n = [v for v in (meta.get("In msg nelems"), meta.get("Out msg nelems")) if isinstance(v, int)]
        nel = max(n) if n else nel
        size = DTYPE_BYTES.get(str(meta.get("dtype", "")).strip().lower(), size)
    if op == "barrier":
        op, nel, size = "allreduce", 1, 1
    if nel is None or size is None:
        return {"kind": "comm", "op": op}
    nbytes = float(nel * size)
    if op in ("send", "recv"):
        peer = meta.get("dst rank" if op == "send" else "src rank") if meta is not None else None
        conc = a.get("Concrete Inputs")
        if not isinstance(peer, int) and isinstance(conc, list) and len(conc) > 2 and str(conc[2]).isdigit():
            peer = int(conc[2])
        if not isinstance(peer, int) or peer == rank or peer < 0:
            return {"kind": "comm", "op": op}
        return {"kind": op, "peer": peer, "nbytes": nbytes}
    group = _ranks(meta.get("Process Group Ranks")) if meta is not None else None
    others, default = groups
    if group is None:
        if e["name"] == "c10d::barrier" or not others:
            group = default  # (dist.barrier() without a group, or no other group: the default one)
        elif len(others) == 1:
            group = others[0]
    if group is None or rank not in group or len(group) < 2:
        return {"kind": "comm", "op": op}
    return {"kind": "collective", "op": op, "group": tuple(sorted(group)), "nbytes": nbytes}
