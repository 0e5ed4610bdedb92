"""The traces users open in other tools: the Perfetto/Chrome trace (``trace.json``) is
structurally valid, and the Kineto-shaped traces (``--kineto DIR``) have what PyTorch
profiler traces have and give Holistic Trace Analysis's figures, which are trainsim's."""

import json
import math
import re
from pathlib import Path

import pytest

from sim.cli import main

TINY = ["--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "8", "--vocab-size", "8192",
        "--seq-length", "1024", "--gpu", "h100-sxm", "--gpus", "8", "--tensor-model-parallel-size", "2",
        "--pipeline-model-parallel-size", "2", "--global-batch-size", "16"]


def validate_events(events: list[dict], where: str = "trace") -> None:
    """Chrome trace-event rules: every X event has pid/tid/ts/dur (dur >= 0); slices on one
    (pid, tid) track nest, never partly overlap; every flow start has exactly one end, not
    before it; counters have numeric values."""
    tracks: dict[tuple, list[tuple[float, float, str]]] = {}
    starts, ends = {}, {}
    for i, e in enumerate(events):
        ph = e.get("ph")
        assert isinstance(ph, str), f"{where}: event {i} has no ph: {e}"
        if ph == "X":
            for k in ("pid", "tid", "ts", "dur", "name"):
                assert k in e, f"{where}: X event {i} ({e.get('name')}) has no {k}"
            assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)), e
            assert e["dur"] >= 0 and math.isfinite(e["ts"]) and math.isfinite(e["dur"]), e
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        elif ph in ("s", "f"):
            for k in ("id", "pid", "tid", "ts"):
                assert k in e, f"{where}: flow event {i} has no {k}"
            side = starts if ph == "s" else ends
            assert e["id"] not in side, f"{where}: flow id {e['id']} has two '{ph}' events"
            side[e["id"]] = e
        elif ph == "C":
            assert "pid" in e and "ts" in e and isinstance(e.get("args"), dict) and e["args"], e
            for k, v in e["args"].items():
                assert isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), (k, v)
    eps = 1e-6
    for track, slices in tracks.items():
        stack: list[tuple[float, float, str]] = []
        for a, b, name in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= a + eps:
                stack.pop()
            if stack:
                assert b <= stack[-1][1] + eps, (f"{where}: on track {track}, {name} [{a}, {b}] partly overlaps "
                                                 f"{stack[-1][2]} [{stack[-1][0]}, {stack[-1][1]}]")
            stack.append((a, b, name))
    assert set(starts) == set(ends), f"{where}: flows without an end: {sorted(set(starts) ^ set(ends))[:5]}"
    for fid, s in starts.items():
        assert ends[fid]["ts"] >= s["ts"] - eps, f"{where}: flow {fid} ends before it starts"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """One small 3D-parallel run (dp 2 x tp 2 x pp 2, ZeRO-1) with every output."""
    d = tmp_path_factory.mktemp("kineto")
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["run", *TINY, "--zero", "1", "--json", "--out", str(d / "out"), "--kineto", str(d / "k")]) == 0
    return d, json.loads(buf.getvalue())


def _load(d: Path) -> dict[int, dict]:
    docs = {}
    for p in sorted((d / "k").glob("trace_rank*.json")):
        text = p.read_text()
        assert re.search(r'"rank":\s+\d+', text), "HTA finds a file's rank by this text"
        doc = json.loads(text)
        docs[doc["distributedInfo"]["rank"]] = doc
    return docs


def test_perfetto_trace_is_structurally_valid(outputs):
    d, summary = outputs
    trace = json.loads((d / "out" / "trace.json").read_text())
    events = trace["traceEvents"]
    validate_events(events, "trace.json")
    assert any(e["ph"] == "s" for e in events) and any(e["ph"] == "C" for e in events)
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert "node 0 / GPU 0 (stage 0, tp 0, dp 0)" in names


def test_kineto_files_have_what_pytorch_profiler_traces_have(outputs):
    d, summary = outputs
    docs = _load(d)
    assert sorted(docs) == list(range(8))
    for rank, doc in docs.items():
        keys = list(doc)
        assert keys.index("distributedInfo") < keys.index("traceEvents")
        assert doc["distributedInfo"] == {"backend": "nccl", "rank": rank, "world_size": 8}
        events = doc["traceEvents"]
        validate_events(events, f"rank {rank}")
        kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")]
        launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"
                    and e["name"].startswith(("cudaLaunch", "cudaMemcpy"))}
        assert kernels and len(launches) == len(kernels)
        for k in kernels:
            a = k["args"]
            assert {"stream", "correlation", "device"} <= set(a)
            assert k["tid"] == a["stream"] and k["pid"] == a["device"]
            launch = launches[a["correlation"]]
            assert launch["ts"] + launch["dur"] <= k["ts"], "a kernel starts after its launch"
            assert isinstance(k["ts"], int) and isinstance(k["dur"], int)
        nccl = [k for k in kernels if k["name"].startswith("nccl")]
        assert {k["args"]["Collective name"] for k in nccl} >= {"allreduce", "send", "recv", "_allgather_base",
                                                                "_reduce_scatter_base"}
        for k in nccl:
            assert re.match(r"^ncclDevKernel_(AllReduce_Sum_bf16_RING_LL|AllGather_RING_LL|"
                            r"ReduceScatter_Sum_bf16_RING_LL|SendRecv)$", k["name"]), k["name"]
            a = k["args"]
            assert a["dtype"] == "BFloat16" and a["In msg nelems"] > 0 and a["Group size"] >= 2
            if a["Collective name"] == "allreduce":
                assert a["Group size"] == 2 and a["Process Group Ranks"].startswith("[")
        assert sum(1 for e in events if e["name"].startswith("ProfilerStep#")) == 1
        assert any(e.get("cat") == "gpu_user_annotation" and e["name"] == "0F0" or e["name"] == "1F0"
                   for e in events if e.get("cat") == "gpu_user_annotation")
        assert streams_named(events) >= {7}


def streams_named(events) -> set[int]:
    return {e["tid"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
            and "stream" in e["args"]["name"]}


def _union(intervals):
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _hta_like(doc: dict) -> dict:
    """HTA's definitions, computed here: kernel time from the first kernel's start to the
    last kernel's end; compute = union of compute kernels; idle = kernel time minus the
    union of all kernels; overlap = compute-under-NCCL time over NCCL-kernel time."""
    ks = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in doc["traceEvents"]
          if e.get("cat") in ("kernel", "gpu_memcpy")]
    comp = [(a, b) for a, b, n in ks if not n.startswith(("nccl", "Memcpy"))]
    comm = [(a, b) for a, b, n in ks if n.startswith("nccl")]
    span = max(b for _, b, _ in ks) - min(a for a, _, _ in ks)
    busy = _union([(a, b) for a, b, _ in ks])
    both = _union(comp) + _union(comm) - _union(comp + comm)
    return {"kernel_us": span, "compute_us": _union(comp), "idle_us": span - busy,
            "non_compute_us": busy - _union(comp), "overlap": both / _union(comm) if comm else 0.0}


def test_kineto_figures_are_trainsims(outputs):
    """HTA's temporal breakdown of the Kineto files equals trainsim's own breakdown of the
    critical rank (up to the whole-microsecond rounding of each kernel boundary)."""
    d, summary = outputs
    doc = _load(d)[summary["critical_rank"]]
    h = _hta_like(doc)
    T = summary["iteration_time_s"] * 1e6
    exposed = sum(summary["exposed_comm_s"].values()) * 1e6
    n = sum(1 for e in doc["traceEvents"] if e.get("cat") == "kernel")
    tol = n * 1.0  # at most 0.5 us per boundary
    assert h["kernel_us"] == pytest.approx(T, abs=1.0)
    assert h["compute_us"] == pytest.approx(summary["compute_s"] * 1e6, abs=tol)
    assert h["non_compute_us"] == pytest.approx(exposed, abs=tol)
    assert h["idle_us"] == pytest.approx(summary["idle_s"] * 1e6, abs=tol)
    assert abs(h["compute_us"] - summary["compute_s"] * 1e6) < 0.01 * T
    assert h["overlap"] == pytest.approx(summary["comm_overlap_fraction"], abs=0.01)


def test_kineto_round_trip_through_the_importer(outputs):
    """trainsim's own Kineto importer (for real profiler traces) reads the files back."""
    from sim.calibrate.kineto import op_times, trace_from_kineto

    d, summary = outputs
    files = sorted((d / "k").glob("trace_rank*.json"))
    trace = trace_from_kineto(files, level="kernels")
    assert sorted(trace.streams()) == list(range(8))
    assert trace.end_s == pytest.approx(summary["iteration_time_s"], abs=2e-6)
    ops = op_times(files[0])
    assert ops["kind"] == "kernel" and any(k.startswith("ncclDevKernel_AllReduce") for k in ops["ops"])


@pytest.mark.filterwarnings("ignore:The inplace keyword:Warning")  # HTA 0.5.0 on pandas 3
def test_hta_reads_the_kineto_traces(outputs):
    """Holistic Trace Analysis (if installed: pip install HolisticTraceAnalysis) loads the
    traces and reports the same breakdown and overlap as trainsim."""
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    d, summary = outputs
    analysis = TraceAnalysis(trace_dir=str(d / "k"))
    tb = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    ov = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    docs = _load(d)
    assert sorted(tb.index) == sorted(docs)
    for rank, doc in docs.items():
        mine = _hta_like(doc)
        row = tb.loc[rank]
        assert row["kernel_time(us)"] == pytest.approx(mine["kernel_us"], abs=1)
        assert row["compute_time(us)"] == pytest.approx(mine["compute_us"], abs=1)
        assert row["idle_time(us)"] == pytest.approx(mine["idle_us"], abs=1)
        assert ov.loc[rank, "comp_comm_overlap_pctg"] == pytest.approx(100 * mine["overlap"], abs=0.1)
    r = summary["critical_rank"]
    assert tb.loc[r, "idle_time(us)"] == pytest.approx(summary["idle_s"] * 1e6, rel=0.01, abs=5)
    assert ov.loc[r, "comp_comm_overlap_pctg"] == pytest.approx(100 * summary["comm_overlap_fraction"], abs=1)


def test_kineto_memory_and_offload(tmp_path, capsys):
    """ZeRO-Offload's copies are Memcpy kernels and its host optimizer a cpu_op."""
    assert main(["run", *TINY[:-6], "--gpus", "2", "--global-batch-size", "2", "--zero", "2",
                 "--offload-optimizer", "--kineto", str(tmp_path)]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "trace_rank0.json").read_text())
    events = doc["traceEvents"]
    validate_events(events, "offload")
    names = {e["name"] for e in events if e.get("cat") == "gpu_memcpy"}
    assert names == {"Memcpy DtoH (Device -> Pinned)", "Memcpy HtoD (Pinned -> Device)"}
    assert any(e.get("cat") == "cpu_op" and "optimizer" in e["name"] for e in events)
    mem = [e for e in events if e["name"] == "[memory]"]
    assert mem and all(e["args"]["Total Allocated"] >= 0 for e in mem)
