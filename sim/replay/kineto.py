"""A PyTorch profiler (Kineto) trace as a ``RankGraph``: what one rank did in one step, and
what waited for what.

The file is read and checked by ``sim.calibrate.kineto.load_kineto`` (``import-trace``'s
reader). The step is a ``ProfilerStep#N`` span (``step``; default the last one), or the
whole window when the trace has none. Time zero is the step's start.

Nodes:

- **Host threads.** Each CPU thread's CUDA runtime calls that matter (kernel and copy
  launches, event records, stream waits, synchronisations) are a chain of ``cpu`` nodes
  on lane ``cpu <tid>``. A call's node lasts from the previous call's start (or, after a
  blocking synchronisation, its end) to its own start: the host's own work between calls
  is kept as measured, the time it spent blocked in a synchronisation is not (on replay
  the sync waits for what it waited for).
- **GPU work.** Each kernel, memcpy and memset is a node on lane ``stream <id>`` at its
  measured duration, depending on its launch (``correlation``: the runtime call and the
  kernel share it). Nodes of one stream run in FIFO order.
- **Cross-stream waits.** A ``cudaStreamWaitEvent`` puts a zero-length node in the
  waiting stream's FIFO, after the work launched before it, depending on the last work
  launched on the recorded stream before the ``cudaEventRecord`` it waits for. The
  ``cuda_sync`` events (``Stream Wait Event``) name both streams
  (``wait_on_stream``, ``wait_on_cuda_event_record_corr_id``); traces without them (older
  PyTorch) are read as PyTorch issues these calls: the event was recorded on the stream
  of the last work launched on the same thread before the record, and the wait is for the
  stream of the next work launched on the thread after it; a wait with no record before
  it on its thread (traces that left the records out) waits for the latest work launched
  on another stream before it.
- **Host synchronisations.** A blocking ``cudaMemcpy`` waits for its copy;
  ``cudaDeviceSynchronize`` waits for the last work of every
  stream launched before it; ``cudaStreamSynchronize`` for its stream's (from its
  ``Stream Sync`` event, else the stream of the thread's last launch);
  ``cudaEventSynchronize`` for the recorded work (``Event Sync``, else the work launched
  before the thread's last ``cudaEventRecord``).
- **NCCL kernels** (``ncclKernel_*``, ``ncclDevKernel_*``) become collectives or
  send/recv from their args (``Collective name``, ``In msg nelems``, ``Out msg nelems``,
  ``dtype``, ``Process Group Ranks`` or ``Process Group Name`` with ``distributedInfo``'s
  ``pg_config``; else those of the ``record_param_comms`` op with the same ``External
  id``). A send/recv's peer is its ``dst rank``/``src rank``, else the other member of a
  two-rank group. One without size or group stays a ``comm`` node at its
  measured duration, and is counted in ``meta["unpriced_comm"]``. A collective's claim
  (``Node.transport``, ``Node.slows_compute``) comes from the kernel's args ``trainsim
  transport`` and ``trainsim slows compute`` where trainsim's export wrote them
  (``sim.results.export_kineto``), else it is an NCCL kernel's.
- **Carry-over.** Work launched in an earlier step and still running on a stream when the
  step began is a ``carry`` node at the head of that stream, as measured.
"""

from __future__ import annotations

import re
from functools import lru_cache

from sim.calibrate.kineto import load_kineto
from sim.errors import InputError
from sim.replay.cpu import is_cpu_trace, read_cpu
from sim.replay.graph import Node, RankGraph
from sim.replay.pytorch_names import COLLECTIVE_NAMES as _OPS, DTYPE_BYTES, ranks_of as _ranks

NCCL = re.compile(r"^nccl(Dev)?Kernel_", re.I)
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
_CHECKED_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cuda_sync", "cpu_op")
_ID_ARGS = ("correlation", "stream", "External id", "wait_on_stream", "wait_on_cuda_event_record_corr_id")
"""Args that identify a stream, a launch or an operator: compared and used as keys."""
_BLOCKING = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
_BLOCKING_COPIES = ("cudaMemcpy", "cudaMemcpy2D", "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol")
"""Copies the host waits for (not the ...Async ones)."""
_GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
_ATTENTION_OPS = {"aten::_scaled_dot_product_flash_attention": 0,
                  "aten::_scaled_dot_product_efficient_attention": 0,
                  "aten::_scaled_dot_product_cudnn_attention": 0,
                  "aten::_scaled_dot_product_flash_attention_backward": 1,
                  "aten::_scaled_dot_product_efficient_attention_backward": 1,
                  "aten::_scaled_dot_product_cudnn_attention_backward": 1}
"""PyTorch's fused attention operators -> the position of the query among their inputs
(``[batch, heads, seq, head_dim]``; the key follows it)."""
_GEMM_DTYPES = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "c10::Float8_e4m3fn": "fp8"}
"""Recorded input types -> ``HardwareProfile.peak_flops`` keys."""
_GEMM = re.compile(r"gemm|cutlass|xmma|cublas|wgrad|dgrad|matmul|_mma_|s\d+gemm", re.I)
_ATTN = re.compile(r"flash|fmha|attention|attn|sdpa", re.I)
_MEM = re.compile(r"elementwise|vectorized|reduce|copy|memcpy|memset|softmax|norm|dropout|adam|cat_|fill|index|"
                  r"gather|scatter|unrolled|where|embedding|loss|sum_|mean|mul|add|cast", re.I)


def gemm_shape(op: str, dims, types) -> tuple:
    """``(m, n, k, batch, dtype)`` of an ``aten::mm`` / ``addmm`` / ``bmm`` / ``baddbmm`` from
    its recorded ``Input Dims`` and ``Input type``; () when they do not say."""
    if not isinstance(dims, list) or not isinstance(types, list):
        return ()
    first = 1 if op in ("aten::addmm", "aten::baddbmm") else 0  # (the added tensor comes first)
    try:
        a, b = dims[first], dims[first + 1]
        dtype = _GEMM_DTYPES.get(str(types[first]))
        if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
            m, k, n, batch = a[0], a[1], b[1], 1
        elif len(a) == 3 and len(b) == 3 and a[2] == b[1] and a[0] == b[0]:
            batch, m, k, n = a[0], a[1], a[2], b[2]
        else:
            return ()
    except (IndexError, TypeError):
        return ()
    if dtype is None or not all(isinstance(v, int) and v > 0 for v in (m, n, k, batch)):
        return ()
    return (m, n, k, batch, dtype)


def attention_shape(op: str, dims) -> tuple:
    """``(seq_q, seq_k, head_dim, batch x heads)`` of a fused attention operator from its
    recorded ``Input Dims``; () when they do not say."""
    i = _ATTENTION_OPS[op]
    try:
        q, k = dims[i], dims[i + 1]
        if len(q) == 4 and len(k) == 4 and all(isinstance(v, int) and v > 0 for v in (*q, *k)):
            return (q[2], k[2], q[3], q[0] * q[1])
    except (IndexError, TypeError):
        pass
    return ()


@lru_cache(maxsize=65536)
def kernel_category(name: str, cat: str = "kernel") -> str:
    """``gemm``, ``attention``, ``memory`` or ``kernel`` from a kernel's name (memcpy and
    memset are ``memory``)."""
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memory"
    if _ATTN.search(name):
        return "attention"
    if _GEMM.search(name):
        return "gemm"
    if _MEM.search(name):
        return "memory"
    return "kernel"


def steps_of(data: dict) -> dict[int, dict]:
    """The ``ProfilerStep#N`` spans of a loaded trace, by N."""
    out = {}
    for e in data["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("user_annotation", "cpu_op"):
            m = _STEP.match(e["name"])
            if m:
                out.setdefault(int(m.group(1)), e)
    return out


def read_kineto(source, step: int | None = None, *, default_rank: int = 0) -> RankGraph:
    """One rank's graph from a Kineto trace (a path or a dict); see the module doc.
    ``step``: the ``ProfilerStep#N`` to take (None: the last one, or the whole window when
    the trace has none)."""
    data = load_kineto(source)
    where = data["_where"]
    info = data.get("distributedInfo") or {}
    rank = info.get("rank") if isinstance(info.get("rank"), int) else default_rank
    events = []
    for i, e in enumerate(data["traceEvents"]):
        if e.get("ph") != "X":
            continue
        if not isinstance(e.get("args"), dict):
            e["args"] = {}
        if e.get("cat") in _CHECKED_CATS:
            for key in ("pid", "tid"):
                v = e.get(key)
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, str))):
                    raise InputError(f"{where}: traceEvents[{i}] ({e['name']!r}): {key}: got {v!r}; "
                                     "expected an integer (a process or thread id)")
            for key in _ID_ARGS:
                v = e["args"].get(key)
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, str))):
                    raise InputError(f"{where}: traceEvents[{i}] ({e['name']!r}): args.{key}: got {v!r}; "
                                     "expected an integer (an id PyTorch's profiler writes)")
        events.append(e)
    gpu = [e for e in events if e.get("cat") in _GPU_CATS]
    world = info.get("world_size") if isinstance(info.get("world_size"), int) else None
    if not gpu:
        if is_cpu_trace(data):  # a CPU job's, communicating through gloo (sim.replay.cpu)
            graph = read_cpu(data, events, steps_of(data), step, rank, info)
            graph.meta.update(world_size=world, device_name="", step=step if step is not None else
                              (max(steps_of(data)) if steps_of(data) else None), steps=sorted(steps_of(data)),
                              pg_config=info.get("pg_config"), backend="gloo")
            return graph
        raise InputError(f"{where}: no GPU kernels (events with cat 'kernel', 'gpu_memcpy' or 'gpu_memset'); "
                         "replay needs a trace recorded with ProfilerActivity.CUDA, or a CPU job's "
                         "that communicates through gloo")
    steps = steps_of(data)
    if step is not None and step not in steps:
        have = ", ".join(map(str, sorted(steps))) or "none (the trace has no ProfilerStep spans)"
        raise InputError(f"{where}: --step: got {step}; the trace's ProfilerStep numbers: {have}")
    chosen = step if step is not None else (max(steps) if steps else None)
    runtime = [e for e in events if e.get("cat") in _RUNTIME_CATS]
    if chosen is not None:
        span = steps[chosen]
        t0, t1 = float(span["ts"]), float(span["ts"]) + float(span["dur"])
        runtime = [e for e in runtime if t0 <= e["ts"] < t1]
    else:
        t0 = min(float(e["ts"]) for e in runtime + gpu)
        t1 = float("inf")
    runtime.sort(key=lambda e: (e["ts"], e.get("dur", 0)))
    corr_of_launch = {}
    for e in runtime:
        c = (e.get("args") or {}).get("correlation")
        if c is not None:
            corr_of_launch[c] = e
    mine, carried = [], []
    for e in gpu:
        c = (e.get("args") or {}).get("correlation")
        if chosen is None or c in corr_of_launch or (c is None and t0 <= e["ts"] < t1):
            mine.append(e)
        elif e["ts"] < t1 and e["ts"] + e["dur"] > t0:
            carried.append(e)  # launched in an earlier step, still running in this one
    if not mine:
        raise InputError(f"{where}: ProfilerStep#{chosen}: no GPU work was launched in it (its CUDA calls launch no "
                         f"kernel of the trace); steps: {', '.join(map(str, sorted(steps)))}")
    syncs = {}
    for e in events:
        if e.get("cat") == "cuda_sync":
            a = e.get("args") or {}
            if a.get("correlation") is not None:
                syncs[a["correlation"]] = a
    comm_args, shapes = {}, {}
    for e in events:
        if e.get("cat") == "cpu_op":
            a = e["args"]
            if e["name"] == "record_param_comms" and a.get("External id") is not None:
                comm_args[a["External id"]] = a
            elif a.get("External id") is not None and (e["name"] in _GEMM_OPS or e["name"] in _ATTENTION_OPS):
                shape = (gemm_shape(e["name"], a.get("Input Dims"), a.get("Input type")) if e["name"] in _GEMM_OPS
                         else attention_shape(e["name"], a.get("Input Dims")))
                if shape:
                    shapes[a["External id"]] = shape
    builder = _Builder(rank, where, t0, info, comm_args, shapes)
    graph = builder.build(runtime, mine, carried, syncs)
    devices = data.get("deviceProperties") or []
    device_name = devices[0].get("name", "") if devices and isinstance(devices[0], dict) else ""
    graph.meta.update(world_size=world, device_name=device_name, step=chosen,
                      steps=sorted(steps), pg_config=info.get("pg_config"))
    return graph


class _Builder:
    """Builds one rank's nodes (see the module doc), in one pass over the host's calls in
    time order: a node is made when what it depends on exists, so graph order is a
    topological order."""

    def __init__(self, rank: int, where: str, t0: float, info: dict, comm_args: dict, shapes: dict):
        self.rank, self.where, self.t0, self.info, self.comm_args = rank, where, t0, info, comm_args
        self.shapes = shapes
        self.launch_ext: dict = {}  # launch correlation -> its operator's External id
        self.nodes: list[Node] = []
        self.unpriced = 0

    def _add(self, name, kind, lane, duration_s=0.0, category="kernel", ctrl=(), data=(), **kw) -> int:
        i = len(self.nodes)
        self.nodes.append(Node(i, name, kind, lane, duration_s, category, ctrl_deps=tuple(ctrl),
                               data_deps=tuple(data), **kw))
        return i

    def build(self, runtime, gpu, carried, syncs) -> RankGraph:
        us = 1e-6
        t0 = self.t0
        launch_corrs = set()
        for e in runtime:
            c = e["args"].get("correlation") if "args" in e else None
            if c is not None:
                launch_corrs.add(c)
        # GPU work per stream, in the order it ran.
        streams: dict[object, list[dict]] = {}
        launched_on: dict[object, object] = {}  # correlation -> stream
        for e in sorted(gpu, key=lambda e: (e["ts"], e["dur"])):
            a = e.get("args") or {}
            st = a.get("stream", e.get("tid"))
            streams.setdefault(st, []).append(e)
            c = a.get("correlation")
            if c is not None:
                launched_on[c] = st
        # Host calls that launch work or order it, in time order over all threads.
        calls = []
        for i, e in enumerate(runtime):
            c = e["args"].get("correlation") if "args" in e else None
            n = e["name"]
            if c in launched_on or n in _BLOCKING or n == "cudaStreamWaitEvent" or n == "cudaEventRecord":
                calls.append((e["ts"], i, e))
        calls.sort(key=lambda x: (x[0], x[1]))
        last_on_stream: dict[object, int] = {}
        waits_for_stream: dict[object, list] = {}
        carry_end: dict[object, float] = {}
        for e in carried:
            st = (e.get("args") or {}).get("stream", e.get("tid"))
            carry_end[st] = max(carry_end.get(st, t0), e["ts"] + e["dur"])
        for st in sorted(carry_end, key=str):
            last_on_stream[st] = self._add("earlier step's work", "compute", f"stream {st}",
                                           (carry_end[st] - t0) * us, "carry")
        pos = {st: 0 for st in streams}
        created: dict = {}  # launch correlation -> its host node
        record_target: dict = {}  # cudaEventRecord correlation -> {stream: last node launched on it}
        anchor: dict = {}
        prev_cpu: dict = {}
        last_launch_stream: dict = {}
        last_record: dict = {}
        fresh_record: dict = {}  # thread -> its last record that no wait has used yet
        pending_wait: dict = {}  # thread -> waits whose stream is that of the thread's next launch
        launch_seq: dict = {}
        seq = 0
        lanes = {st: f"stream {st}" for st in streams}

        def flush(st, limit_ts):
            """Nodes for stream ``st``'s work whose launch exists (or, never launched in
            the trace, that started by ``limit_ts``), in FIFO order."""
            q, i = streams[st], pos[st]
            while i < len(q):
                e = q[i]
                c = e["args"].get("correlation")
                if c in launch_corrs:
                    if c not in created:
                        break
                elif e["ts"] > limit_ts:
                    break
                for target in waits_for_stream.pop(st, ()):
                    self._add("cudaStreamWaitEvent (wait)", "compute", lanes[st], 0.0, "kernel", data=(target,))
                last_on_stream[st] = self._gpu_node(e, lanes[st], created.get(c))
                i += 1
            pos[st] = i

        def flush_all(ts):
            for st in streams:
                flush(st, ts)

        for ts, _, e in calls:
            tid = (e.get("pid"), e.get("tid"))
            name = e["name"]
            c = e["args"].get("correlation") if "args" in e else None
            p = prev_cpu.get(tid)
            cpu = self._add(name, "compute", f"cpu {tid[1]}", max(0.0, ts - anchor.get(tid, t0)) * us, "cpu",
                            ctrl=() if p is None else (p,))
            prev_cpu[tid] = cpu
            anchor[tid] = ts
            if c in launched_on:
                created[c] = cpu
                if self.shapes:
                    self.launch_ext[cpu] = e["args"].get("External id")
                st = launched_on[c]
                last_launch_stream[tid] = st
                seq += 1
                for kind, w in pending_wait.pop(tid, ()):
                    if kind == "record":
                        if w[0] != st and w[1] is not None:
                            waits_for_stream.setdefault(st, []).append(w[1])
                    else:  # the latest work launched on another stream before the wait
                        others = [v for k, v in w.items() if k != st]
                        if others:
                            waits_for_stream.setdefault(st, []).append(max(others)[1])
                flush(st, ts)
                launch_seq[st] = seq
                if name in _BLOCKING_COPIES and st in last_on_stream:  # the host waits for the copy
                    prev_cpu[tid] = self._add(f"{name} (wait)", "compute", f"cpu {tid[1]}", 0.0, "cpu", ctrl=(cpu,),
                                              data=(last_on_stream[st],))
                    anchor[tid] = ts + e.get("dur", 0)
                continue
            flush_all(ts)
            s = syncs.get(c) if c is not None else None
            if name == "cudaEventRecord":
                snapshot = dict(last_on_stream)
                st = last_launch_stream.get(tid)
                record_target[c] = snapshot
                last_record[tid] = fresh_record[tid] = (st, snapshot.get(st))
            elif name == "cudaStreamWaitEvent":
                if s is not None and s.get("wait_on_stream") not in (None, -1):
                    src, rc, dst = s.get("wait_on_stream"), s.get("wait_on_cuda_event_record_corr_id"), s.get("stream")
                    target = record_target[rc].get(src) if rc in record_target else last_on_stream.get(src)
                    if target is not None and dst != src:
                        waits_for_stream.setdefault(dst, []).append(target)
                elif tid in fresh_record:
                    pending_wait.setdefault(tid, []).append(("record", fresh_record.pop(tid)))
                else:  # no record in the trace: see the module doc
                    pending_wait.setdefault(tid, []).append(
                        ("latest", {k: (launch_seq.get(k, -1), v) for k, v in last_on_stream.items()}))
            else:  # a blocking synchronisation
                s = s or {}
                targets = []
                if name == "cudaDeviceSynchronize":
                    targets = list(last_on_stream.values())
                elif name == "cudaStreamSynchronize":
                    st = s.get("stream", last_launch_stream.get(tid))
                    if st in last_on_stream:
                        targets = [last_on_stream[st]]
                else:
                    rc, src = s.get("wait_on_cuda_event_record_corr_id"), s.get("wait_on_stream")
                    if rc in record_target and record_target[rc].get(src) is not None:
                        targets = [record_target[rc][src]]
                    elif tid in last_record and last_record[tid][1] is not None:
                        targets = [last_record[tid][1]]
                if targets:
                    prev_cpu[tid] = self._add(f"{name} (wait)", "compute", f"cpu {tid[1]}", 0.0, "cpu", ctrl=(cpu,),
                                              data=sorted(set(targets)))
                anchor[tid] = ts + e.get("dur", 0)
        flush_all(float("inf"))
        # The step as measured: its start to the last end of its work and host calls.
        end = max([e["ts"] + e["dur"] for e in gpu] + [e["ts"] + e.get("dur", 0) for _, _, e in calls]
                  + list(carry_end.values()))
        return RankGraph(self.rank, tuple(self.nodes), self.where, (end - t0) * us,
                         {"unpriced_comm": self.unpriced}).check()

    def _gpu_node(self, e, lane, launch) -> int:
        a = e["args"]
        ctrl = () if launch is None else (launch,)
        dur = float(e["dur"]) * 1e-6
        name = e["name"]
        if e.get("cat") == "kernel" and NCCL.match(name):
            fields = self._comm_fields(a)
            kind = fields.pop("kind")
            return self._add(_short(name), kind, lane, dur, "comm", ctrl=ctrl, **fields)
        flops = a.get("flops") or 0
        cat = kernel_category(name, e.get("cat"))
        if cat == "kernel" and flops > 0:
            cat = "gemm"  # a kernel the trace gives FLOPs for: compute-bound
        shape = ()
        if launch is not None and self.shapes:
            shape = self.shapes.get(self.launch_ext.get(launch), ())
            if len(shape) != {"gemm": 5, "attention": 4}.get(cat):  # (a shape of the other class's operator)
                shape = ()
        return self._add(_short(name), "compute", lane, dur, cat, ctrl=ctrl, flops=float(flops), shape=shape)

    def _comm_fields(self, a: dict) -> dict:
        meta = a if "Collective name" in a else self.comm_args.get(a.get("External id"), a)
        coll = str(meta.get("Collective name", "")).strip().lower()
        op = _OPS.get(coll)
        n_in, n_out = meta.get("In msg nelems"), meta.get("Out msg nelems")
        size = DTYPE_BYTES.get(str(meta.get("dtype", "")).strip().lower())
        group = _ranks(meta.get("Process Group Ranks"))
        if group is None and meta.get("Process Group Name") is not None:  # distributedInfo's pg_config names it
            pgs = self.info.get("pg_config")
            for pg in pgs if isinstance(pgs, list) else ():
                if isinstance(pg, dict) and str(pg.get("pg_name")) == str(meta["Process Group Name"]):
                    group = _ranks(pg.get("ranks"))
        world = self.info.get("world_size")
        if group is None and isinstance(meta.get("Group size"), int) and meta["Group size"] == world:
            group = tuple(range(world))
        nel = max([v for v in (n_in, n_out) if isinstance(v, (int, float)) and not isinstance(v, bool)] or [-1])
        if op is None or nel < 0 or size is None:
            self.unpriced += 1
            return {"kind": "comm", "op": coll}
        nbytes = float(nel) * size
        if op in ("send", "recv"):
            peer = meta.get("dst rank" if op == "send" else "src rank")
            if not isinstance(peer, int) and group is not None and len(group) == 2 and self.rank in group:
                peer = next(g for g in group if g != self.rank)
            if not isinstance(peer, int) or peer == self.rank:
                self.unpriced += 1
                return {"kind": "comm", "op": coll}
            return {"kind": op, "peer": peer, "nbytes": nbytes}
        if group is None or self.rank not in group or len(group) < 2:
            self.unpriced += 1
            return {"kind": "comm", "op": coll}
        out = {"kind": "collective", "op": op, "group": tuple(sorted(group)), "nbytes": nbytes,
               "pg_name": str(meta.get("Process Group Description") or meta.get("Process Group Name") or "")}
        if "trainsim transport" in a:
            out["transport"] = str(a["trainsim transport"])
        if "trainsim slows compute" in a:
            out["slows_compute"] = bool(a["trainsim slows compute"])
        return out


@lru_cache(maxsize=65536)
def _short(name: str) -> str:
    """A kernel's name without its C++ parameter list, at most 80 characters."""
    text = name[5:] if name.startswith("void ") else name
    text = text.replace("(anonymous namespace)::", "")
    base = text.split("(", 1)[0].split("<", 1)[0]
    return base[:80] or name[:80]
