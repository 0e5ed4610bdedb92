"""Trace export in the PyTorch profiler's (Kineto's) shape, one file per rank.

Tools built for real ``torch.profiler`` traces, Holistic Trace Analysis (HTA) first,
read these files as they read a real run's, so a simulated plan and a measured one go
through the same analysis. Each rank's file (``trace_rank{r}.json``) holds:

- ``schemaVersion``, ``distributedInfo`` (``rank``, ``world_size``, ``backend: "nccl"``)
  and ``deviceProperties``, before ``traceEvents`` (HTA reads the metadata up to there).
  HTA finds a file's rank by the text ``"rank": N``, so the JSON keeps ``": "``.
- A GPU kernel per simulated action, ``cat: "kernel"``, ``pid`` = the local GPU index,
  ``tid`` = the CUDA stream, with args ``device``, ``stream``, ``correlation``, ``grid``,
  ``block`` and ``External id``. Streams follow PyTorch's numbering: 7 is the default
  (compute) stream, communication streams get higher numbers, one per simulated stream.
- Communication as NCCL kernels, named as NCCL 2.19+ names them
  (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``, ``ncclDevKernel_AllGather_RING_LL``,
  ``ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL``, ``ncclDevKernel_SendRecv``), with the
  args PyTorch's ``record_param_comms`` attaches: ``Collective name``, ``In msg nelems``,
  ``Out msg nelems``, ``Group size``, ``dtype``, ``Process Group Ranks`` and ``Process Group
  Description`` (Megatron-LM's group name: ``DATA_PARALLEL_GROUP``, ...); a collective whose
  claim is not an NCCL kernel's default (``Action.transport``, ``Action.slows_compute``) has
  it in the args ``trainsim transport`` and ``trainsim slows compute``, which ``trainsim
  replay`` reads back (the kernel keeps NCCL's name, so that HTA counts it as
  communication). An NCCL kernel
  spans the time data moves; the time the action waited for its peers before that is in
  the arg ``trainsim wait (us)`` (``wait=True`` makes it kernel time instead, as on a real
  GPU, where an NCCL kernel spins until its peers arrive; but the simulator posts
  receives earlier than Megatron-LM does, so that waiting would not be the real one).
- GPU/host copies (optimizer offload) as ``cat: "gpu_memcpy"`` ``Memcpy DtoH``/``HtoD``.
- For every kernel a ``cuda_runtime`` launch (``cudaLaunchKernel``, ``cudaMemcpyAsync``)
  on the host thread with the same ``correlation``, and an ``ac2g`` flow from launch to
  kernel. The simulator has no CPU model: launches are placed one after another on one
  thread, each before its kernel and as early as that allows (the CPU running ahead of
  the GPU, as in a GPU-bound run), so HTA's kernel-launch statistics mean little, while
  everything measured on the GPU side does.
- For each dependency of an action on an action of another stream of its rank (the
  program's cross-stream edges), a ``cudaEventRecord`` after the awaited kernel's launch,
  a ``cudaStreamWaitEvent`` before the waiting kernel's launch and a zero-length
  ``cuda_sync`` ``Stream Wait Event`` (``wait_on_stream``,
  ``wait_on_cuda_event_record_corr_id``), as PyTorch records them: ``trainsim replay``
  rebuilds the program's dependencies from them.
- One ``ProfilerStep#0`` annotation over the iteration; a ``gpu_user_annotation`` per
  pipeline step (``1F0``, ...) on the compute stream; the host optimizer step of ZeRO-
  Offload as a ``cpu_op``; memory allocations as ``[memory]`` instant events.

Times are whole microseconds (``ts``, ``dur``), as Kineto wrote them before PyTorch 2.4.
HTA rounds finer timestamps to whole microseconds anyway (ceil of the start, floor of
the end), which would open a 1 µs gap between back-to-back kernels; rounding both ends
to the nearest microsecond here keeps adjacent kernels adjacent and every error under
0.5 µs per boundary.

What HTA then reports is what ``sim.results.metrics.rank_breakdown`` reports for the
rank: its *compute* time is the union of the compute kernels (trainsim's ``compute_s``),
its *non-compute* time the communication and copies not under compute (the sum of
``exposed_comm_s``), its *idle* time the rest between the rank's first and last kernel,
and its compute/communication overlap the share of NCCL-kernel time under compute
(``comm_overlap_fraction``); the tests check this with HTA itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sim.fileio import write_json_atomic
from sim.results.trace import Span, Trace

COMPUTE_STREAM = 7
"""PyTorch's default CUDA stream id in Kineto traces."""
_HOST_PID_BASE = 100000
_OFFSET_US = 1_000_000
"""Kernel ``ts`` = simulated time in µs + a whole number of seconds (``trainsim.time_offset_us``)."""
_LAUNCH_US = 4
"""Width of a simulated cudaLaunchKernel on the host thread (µs)."""
_BYTES_PER_ELEMENT = 2  # bf16 activations and gradients
_CBID = {"cudaLaunchKernel": 211, "cudaLaunchKernelExC": 430, "cudaMemcpyAsync": 41}
_NCCL = {
    "allreduce": ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "allreduce"),
    "reducescatter": ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "_reduce_scatter_base"),
    "allgather": ("ncclDevKernel_AllGather_RING_LL", "_allgather_base"),
    "broadcast": ("ncclDevKernel_Broadcast_RING_LL", "broadcast"),
    "alltoall": ("ncclDevKernel_SendRecv", "all_to_all"),
    "shift": ("ncclDevKernel_SendRecv", "batch_isend_irecv"),
}
_GROUP_DESC = {"dp": "DATA_PARALLEL_GROUP", "zero": "DATA_PARALLEL_GROUP", "tp": "TENSOR_MODEL_PARALLEL_GROUP",
               "pp": "PIPELINE_MODEL_PARALLEL_GROUP", "cp": "CONTEXT_PARALLEL_GROUP", "ep": "EXPERT_MODEL_PARALLEL_GROUP"}
"""A communication span's category -> the ``Process Group Description`` (Megatron-LM's group names)."""
_KIND_NAMES = {"F": "forward", "B": "backward", "I": "backward_input", "W": "backward_weight",
               "opt": "optimizer_step"}


def _us(t_s: float) -> int:
    return int(round(t_s * 1e6))


def _nccl(span: Span, group_size: int) -> tuple[str, dict]:
    """Kernel name and record_param_comms-style args of a communication span."""
    n = int(span.nbytes // _BYTES_PER_ELEMENT)
    if span.kind in ("send", "recv"):
        name, coll = "ncclDevKernel_SendRecv", span.kind
        in_n = out_n = n
        group_size = 2
    else:
        name, coll = _NCCL.get(span.op, (f"ncclDevKernel_{span.op or 'Unknown'}", span.op))
        g = max(group_size, 1)
        in_n, out_n = n, n
        if span.op == "allgather":
            in_n = n // g
        elif span.op == "reducescatter":
            out_n = n // g
    return name, {"Collective name": coll, "In msg nelems": in_n, "Out msg nelems": out_n,
                  "Group size": group_size, "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]"}


@dataclass(frozen=True)
class KinetoRun:
    """What the Kineto traces of a run say beyond its spans: the job (world size, the GPU's
    name and memory) and, per rank, what its program knows (``collective_groups``,
    ``rank_names``, ``cross_stream_waits``, ``collective_claims``)."""

    world_size: int | None = None
    """None: the trace's ranks."""
    device_name: str = ""
    memory_bytes: float = 0.0
    groups: Mapping[int, Mapping[str, tuple]] = field(default_factory=dict)
    names: Mapping[int, str] = field(default_factory=dict)
    waits: Mapping[int, Mapping[str, tuple]] = field(default_factory=dict)
    claims: Mapping[int, Mapping[str, tuple]] = field(default_factory=dict)


def to_kineto(trace: Trace, rank: int, run: KinetoRun = KinetoRun(), *, wait: bool = False,
              offset_us: int | None = None) -> dict:
    """Rank ``rank`` of ``trace`` as a Kineto trace dict (see the module doc), with what
    ``run`` says of that rank.

    ``run.groups[rank]`` maps a collective's span name to its process group (ranks), for the
    ``Group size`` and ``Process Group Ranks`` args; without it the group size is 0.
    ``wait=True`` starts communication kernels when their action was issued rather than
    when data started to move (the time spent waiting for peers is then kernel time).
    ``offset_us`` is added to every time (default: whole seconds, enough to keep the
    launches placed before time zero positive); ranks of one run must share it.
    ``run.waits[rank]`` maps a span's name to the names of the actions of this rank on other
    streams it waited for (``cross_stream_waits``): each becomes a ``cudaEventRecord``
    after the awaited kernel's launch, a ``cudaStreamWaitEvent`` before the waiting
    kernel's launch, and a ``cuda_sync`` ``Stream Wait Event`` on the waiting stream, as
    PyTorch records them. ``run.claims[rank]`` maps a collective's span name to its claim where it is
    not the default (``collective_claims``), written to the kernel's args.
    """
    world_size, device_name, memory_bytes = run.world_size, run.device_name, run.memory_bytes
    name, waits = run.names.get(rank, ""), run.waits.get(rank)
    info = trace.ranks.get(rank, {})
    device = str(info.get("device", ""))
    local = int(device.rsplit("gpu", 1)[-1]) if "gpu" in device and device.rsplit("gpu", 1)[-1].isdigit() else 0
    world = world_size if world_size is not None else max(len(trace.ranks), rank + 1)
    host_pid = _HOST_PID_BASE + rank
    host_tid = host_pid
    cpu_tid = host_pid + 1
    spans = [s for s in trace.spans_of(rank) if s.stream != "memory"]
    stream_ids: dict[str, int] = {"compute": COMPUTE_STREAM}
    for st in sorted({s.stream for s in spans if s.stream not in ("compute", "cpu")}):
        stream_ids[st] = COMPUTE_STREAM + 6 + 4 * len(stream_ids)  # 13, 17, 21, ... like NCCL's streams
    groups = run.groups.get(rank) or {}
    claims = run.claims.get(rank) or {}
    gpu: list[dict] = []
    cpu_ops: list[dict] = []
    for sp in spans:
        begin = sp.start_s if wait or sp.busy_start_s is None else sp.busy_start_s
        ts, end = _us(begin), _us(sp.end_s)
        if sp.stream == "cpu":  # ZeRO-Offload's optimizer step on the host
            cpu_ops.append({"ph": "X", "cat": "cpu_op", "name": sp.name, "pid": host_pid, "tid": cpu_tid,
                            "ts": ts, "dur": end - ts, "args": {"External id": 0}})
            continue
        stream = stream_ids[sp.stream]
        args = {"device": local, "stream": stream}
        if sp.kind == "compute":
            label = _KIND_NAMES.get(sp.category, sp.category or "kernel")
            layer = f"_layer{sp.layer}" if sp.layer is not None else ""
            kname, cat, launch = f"trainsim_{label}{layer}_kernel", "kernel", "cudaLaunchKernel"
            args.update(grid=[132, 1, 1], block=[256, 1, 1])
            if sp.flops:
                args["flops"] = sp.flops
        elif sp.kind == "copy":
            kname = "Memcpy DtoH (Device -> Pinned)" if sp.op == "d2h" else "Memcpy HtoD (Pinned -> Device)"
            cat, launch = "gpu_memcpy", "cudaMemcpyAsync"
            args["bytes"] = int(sp.nbytes)
            if end > ts:
                args["memory bandwidth (GB/s)"] = sp.nbytes / ((end - ts) * 1e-6) / 1e9
        else:
            group = tuple(groups.get(sp.name, ()))
            kname, extra = _nccl(sp, len(group))
            cat, launch = "kernel", "cudaLaunchKernelExC"
            args.update(grid=[8, 1, 1], block=[640, 1, 1], **extra)
            if group:
                args["Process Group Ranks"] = str(list(group))
            if sp.category in _GROUP_DESC:
                args["Process Group Description"] = _GROUP_DESC[sp.category]
            if sp.peer is not None:
                args["dst rank" if sp.kind == "send" else "src rank"] = sp.peer
            claim = claims.get(sp.name)
            if claim is not None:
                args["trainsim transport"], args["trainsim slows compute"] = claim
        if sp.kind != "compute" and sp.busy_start_s is not None:
            args["trainsim wait (us)"] = round((sp.busy_start_s - sp.start_s) * 1e6, 3)
        gpu.append({"ph": "X", "cat": cat, "name": kname, "pid": local, "tid": stream, "ts": ts, "_span": sp.name,
                    "dur": end - ts, "args": args, "_launch": launch, "_step": sp.name.split(".")[0],
                    "_pipeline": sp.kind == "compute" and sp.category in ("F", "B", "I", "W")})
    gpu.sort(key=lambda e: (e["ts"], e["tid"], e["dur"]))
    # Launches: one after another on the host thread, each ending before its kernel starts.
    launches: list[int] = [0] * len(gpu)
    nxt = None
    for i in range(len(gpu) - 1, -1, -1):
        t = gpu[i]["ts"] - _LAUNCH_US - 1
        if nxt is not None:
            t = min(t, nxt - _LAUNCH_US)
        launches[i] = nxt = t
    # ... and as early as that allows: back to back from the first, the host running ahead
    # of the GPU as in a GPU-bound run (what the GPU waited for is in the stream waits).
    for i in range(1, len(gpu)):
        launches[i] = min(launches[i], launches[i - 1] + _LAUNCH_US)
    events: list[dict] = []
    index = {e["_span"]: i for i, e in enumerate(gpu)}
    syncs: list[dict] = []
    next_corr = len(gpu) + 1
    for i, e in enumerate(gpu):
        corr, ext = i + 1, i + 1
        e["args"]["correlation"] = corr
        e["args"]["External id"] = ext
        launch = e.pop("_launch")
        for dep in (waits or {}).get(e.pop("_span"), ()):
            j = index.get(dep)
            if j is None or j >= i or gpu[j]["tid"] == e["tid"]:
                continue
            rec, wt = next_corr, next_corr + 1
            next_corr += 2
            syncs.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaEventRecord", "pid": host_pid,
                          "tid": host_tid, "ts": launches[j] + _LAUNCH_US, "dur": 0,
                          "args": {"cbid": 135, "correlation": rec, "External id": j + 1}})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "pid": host_pid,
                           "tid": host_tid, "ts": launches[i], "dur": 0,
                           "args": {"cbid": 147, "correlation": wt, "External id": ext}})
            events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": e["pid"], "tid": e["tid"],
                           "ts": e["ts"], "dur": 0,
                           "args": {"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": gpu[j]["tid"],
                                    "wait_on_cuda_event_record_corr_id": rec, "stream": e["tid"], "correlation": wt,
                                    "device": e["pid"], "External id": ext}})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": launch, "pid": host_pid, "tid": host_tid,
                       "ts": launches[i], "dur": _LAUNCH_US,
                       "args": {"cbid": _CBID[launch], "correlation": corr, "External id": ext}})
        events.append({"ph": "s", "id": corr, "pid": host_pid, "tid": host_tid, "ts": launches[i],
                       "cat": "ac2g", "name": "ac2g"})
        events.append({"ph": "f", "id": corr, "pid": e["pid"], "tid": e["tid"], "ts": e["ts"],
                       "cat": "ac2g", "name": "ac2g", "bp": "e"})
    # One annotation per pipeline step on the compute stream, around its kernels.
    steps: dict[str, list[int]] = {}
    for e in gpu:
        if e.pop("_pipeline"):
            a, b = e["ts"], e["ts"] + e["dur"]
            lo_hi = steps.setdefault(e["_step"], [a, b])
            lo_hi[0], lo_hi[1] = min(lo_hi[0], a), max(lo_hi[1], b)
        e.pop("_step")
    annotations = [{"ph": "X", "cat": "gpu_user_annotation", "name": step, "pid": local, "tid": COMPUTE_STREAM,
                    "ts": a, "dur": b - a, "args": {"External id": 0}}
                   for step, (a, b) in sorted(steps.items(), key=lambda kv: (kv[1][0], kv[0]))]
    first = min([launches[0]] if launches else [0])
    last = max([e["ts"] + e["dur"] for e in gpu] + [e["ts"] + e["dur"] for e in cpu_ops] + [0])
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": host_pid, "tid": host_tid,
            "ts": first - 1, "dur": last - first + 2, "args": {"External id": 0}}
    meta = [
        {"ph": "M", "name": "process_name", "pid": host_pid, "tid": 0, "args": {"name": f"python3 (rank {rank})"}},
        {"ph": "M", "name": "process_labels", "pid": host_pid, "tid": 0, "args": {"labels": "CPU"}},
        {"ph": "M", "name": "thread_name", "pid": host_pid, "tid": host_tid, "args": {"name": "thread 0 (python3)"}},
        {"ph": "M", "name": "process_name", "pid": local, "tid": 0, "args": {"name": f"GPU {local}"}},
        {"ph": "M", "name": "process_labels", "pid": local, "tid": 0,
         "args": {"labels": name or f"GPU {local} (rank {rank})"}},
        {"ph": "M", "name": "process_sort_index", "pid": local, "tid": 0, "args": {"sort_index": 5000000 + local}},
    ]
    if cpu_ops:
        meta.append({"ph": "M", "name": "thread_name", "pid": host_pid, "tid": cpu_tid,
                     "args": {"name": "thread 1 (cpu optimizer)"}})
    for st, sid in stream_ids.items():
        label = "stream 7 (compute)" if st == "compute" else f"stream {sid} (nccl: {st})"
        meta.append({"ph": "M", "name": "thread_name", "pid": local, "tid": sid, "args": {"name": label}})
    memory = _memory_events(trace, rank, local, host_pid, host_tid)
    timed = [step] + syncs + events + gpu + annotations + cpu_ops + memory
    if offset_us is None:
        offset_us = _offset([timed])
    for e in timed:
        e["ts"] += offset_us
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "deviceProperties": [{"id": local, "name": device_name or "simulated GPU",
                              "totalGlobalMem": int(memory_bytes)}],
        "traceName": f"trainsim rank {rank}",
        "displayTimeUnit": "ms",
        "traceEvents": meta + timed,
        "trainsim": {"generator": "trainsim", "topology": trace.topology, "time_offset_us": offset_us,
                     "note": "simulated; host-side launch times are placed, not modelled"},
    }


def _offset(event_lists) -> int:
    """Whole seconds (in µs) that make every ``ts`` of the lists positive."""
    low = min((e["ts"] for events in event_lists for e in events), default=0)
    return _OFFSET_US * max(1, -(low // _OFFSET_US) + 1)


def _memory_events(trace: Trace, rank: int, local: int, pid: int, tid: int) -> list[dict]:
    """Kineto's ``[memory]`` instant events: one per allocation or free, with the total."""
    out, total = [], 0.0
    for t, r, cat, b in trace.memory:
        if r != rank or not b:
            continue
        total += b
        out.append({"ph": "i", "s": "t", "cat": "cpu_instant_event", "name": "[memory]", "pid": pid, "tid": tid,
                    "ts": _us(t), "args": {"Device Type": 1, "Device Id": local, "Addr": 0, "Bytes": int(b),
                                           "Total Allocated": int(total), "Total Reserved": int(total),
                                           "category": cat}})
    return out


def collective_groups(program) -> dict[int, dict[str, tuple]]:
    """Per rank, each collective action's group by action name (from the ``Program``)."""
    return {r: {a.name: tuple(a.group) for a in acts if a.kind == "collective"}
            for r, acts in program.actions.items()}


def collective_claims(program) -> dict[int, dict[str, tuple[str, bool]]]:
    """Per rank, each collective action's claim ``(transport, slows_compute)`` by action
    name, for the collectives whose claim is not an NCCL kernel's default (the rest)."""
    return {r: {a.name: (a.transport, a.slows_compute) for a in acts
                if a.kind == "collective" and (a.transport != "nccl" or not a.slows_compute)}
            for r, acts in program.actions.items()}


def cross_stream_waits(program) -> dict[int, dict[str, tuple]]:
    """Per rank, each action's dependencies on actions of the same rank on another stream
    (what a trace records as CUDA event waits), by action name."""
    out = {}
    for r, acts in program.actions.items():
        stream = {a.name: a.stream for a in acts}
        mine = {}
        for a in acts:
            deps = tuple(d for d in a.deps if d.__class__ is str and stream.get(d, a.stream) != a.stream)
            if deps:
                mine[a.name] = deps
        out[r] = mine
    return out


def write_kineto(trace: Trace, out_dir: str | Path, run: KinetoRun = KinetoRun(), *, ranks=None,
                 wait: bool = False) -> list[Path]:
    """Write ``trace_rank{r}.json`` for each rank (default every simulated rank) into
    ``out_dir`` (``to_kineto``); each file is written through a temporary file and a rename."""
    out = Path(out_dir)
    chosen = sorted(trace.streams()) if ranks is None else sorted(ranks)
    docs = [(r, to_kineto(trace, r, run, wait=wait, offset_us=0)) for r in chosen]
    # One clock for all ranks, as on one cluster with synchronised hosts.
    timed = [[e for e in doc["traceEvents"] if e.get("ph") != "M"] for _, doc in docs]
    offset = _offset(timed)
    for (_, doc), events in zip(docs, timed):
        for e in events:
            e["ts"] += offset
        doc["trainsim"]["time_offset_us"] = offset
    return [_write(doc, out / f"trace_rank{r}.json") for r, doc in docs]


def _write(obj: dict, path: Path) -> Path:
    # default separators ('"rank": 3', which HTA looks for) and key order, atomically
    return write_json_atomic(obj, path, sort_keys=False, compact=False)
