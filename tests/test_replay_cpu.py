"""``trainsim replay`` of a CPU job's traces (gloo, no GPU kernels: ``sim.replay.cpu``).

A hand-built two-rank trace checks where the host waits for gloo's work: the replayed step
is computed by hand from the trace's times and the closed-form price of the transfer, and
comes out shorter if the wait's edge were missing. The traces ``trainsim validate`` wrote
for a data-parallel and a 1F1B run (``tests/data/replay-cpu``, README there) are read into
the dependency structure their reference run makes (counted by hand from its schedule),
and replay within 5% of the step they measured.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from sim.cli import main
from sim.inputs.hardware import load_profile
from sim.replay.kineto import read_kineto
from sim.replay.run import WhatIf, replay

DATA = Path(__file__).parent / "data" / "replay-cpu"
PROFILE = str(DATA / "profile.json")
US = 1e-6


def _trace(rank: int, events: list) -> dict:
    pg = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}]
    return {"schemaVersion": 1, "deviceProperties": [], "traceEvents": [
        {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": 7, "ts": ts, "dur": dur, "args": args}
        for cat, name, ts, dur, args in events],
        "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2, "pg_config": pg}}


def _p2p(rank: int, peer: int, op: str, ts: float, dur: float, elems: int) -> tuple:
    return ("cpu_op", f"c10d::{op}", ts, dur, {"Input Dims": [[[elems]], [], [], []],
                                              "Concrete Inputs": ["", "", str(peer), "0"]})


def _work(op: str, ts: float, dur: float, elems: int) -> tuple:
    return ("user_annotation", f"gloo:{op}", ts, dur, {"Input type": ["float"], "Input Dims": [[elems]]})


def _pair(elems: int = 1000):
    """Rank 0 computes 300 us, sends (the call 10 us), works on 190 us, waits for the send
    and steps 100 us; rank 1 posts its receive at once and waits for it (until 400 us in the
    trace), then computes 500 us."""
    step0 = ("user_annotation", "ProfilerStep#0", 0, 700, {})
    r0 = _trace(0, [step0, ("cpu_op", "F", 0, 300, {}), _p2p(0, 1, "send", 300, 10, elems),
                    _work("send", 310, 290, elems), ("cpu_op", "tail", 320, 180, {}), ("cpu_op", "opt", 600, 100, {})])
    step1 = ("user_annotation", "ProfilerStep#0", 0, 900, {})
    r1 = _trace(1, [step1, _p2p(1, 0, "recv_", 0, 5, elems), _work("recv", 5, 395, elems),
                    ("cpu_op", "B", 400, 500, {})])
    return r0, r1


def test_a_receive_waits_for_the_send_priced_on_the_fitted_link():
    r0, r1 = _pair()
    g0, g1 = read_kineto(r0), read_kineto(r1)
    assert g0.meta["cpu_trace"] and g1.traced_step_s == pytest.approx(900 * US)
    [send] = [n for n in g0.nodes if n.kind == "send"]
    [recv] = [n for n in g1.nodes if n.kind == "recv"]
    assert (send.peer, recv.peer, send.nbytes, recv.nbytes) == (1, 0, 4000.0, 4000.0)
    [wait] = [n for n in g1.nodes if recv.id in n.data_deps]
    assert wait.lane == "cpu 7" and wait.duration_s == 0
    # Rank 1 after the wait: 500 us of B (its blocked time, 5..400 us, is the replay's to work out).
    assert sum(n.duration_s for n in g1.nodes if n.id > wait.id) == pytest.approx(500 * US)
    r = replay([g0, g1], WhatIf(gpu=PROFILE))
    # The send starts when rank 0's call does (310 us: gloo's event), and a transfer
    # between two processes costs alpha + S/B on the fitted link (sim.calibrate.validate's
    # machine topology: two links of alpha/2 each).
    link = load_profile(PROFILE).links["ethernet"]
    spans = {s.name.split(" #")[0]: s for s in r.trace.spans if s.rank == 1}
    assert spans["recv_"].start_s == pytest.approx(5 * US)  # (posted at once; it waits for the send)
    transfer = spans["recv_"].end_s - 310 * US
    assert transfer == pytest.approx(link.latency_s + 4000 / link.bandwidth_Bps, rel=1e-9)
    assert r.summary["iteration_time_s"] == pytest.approx(310 * US + transfer + 500 * US, rel=1e-9)
    # Without the wait's edge rank 1 would end at 5 + 500 us, rank 0 at 700 us.
    assert r.summary["iteration_time_s"] > 810 * US + link.latency_s


def test_the_profilers_cost_comes_off_each_event_it_recorded(tmp_path):
    """With the profile's cost per recorded event c, each host node is shorter by c for every
    operator or annotation that began in it. In ``_pair`` (with N operators nested in rank
    0's F and M in rank 1's B) rank 1 finishes last: its B follows the transfer, which
    starts when rank 0's send call reaches gloo. So the step is shorter by c x (the events
    rank 0 recorded before gloo's send began: its step span, F, the N nested and the
    send call) + c x (rank 1's B and the M nested)."""
    from dataclasses import replace

    c, n_f, m_b = 2 * US, 20, 10
    r0, r1 = _pair()
    r0["traceEvents"] += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 10 + 10 * i,
                           "dur": 5, "args": {}} for i in range(n_f)]
    r1["traceEvents"] += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 410 + 20 * i,
                           "dur": 5, "args": {}} for i in range(m_b)]
    g = [read_kineto(r0), read_kineto(r1)]
    assert [n.recorded_ops for n in g[0].nodes if n.name == "F"] == [n_f + 2]  # (with ProfilerStep#0)
    kept = replay(g, WhatIf(gpu=PROFILE)).summary
    assert "profiler_removed_s" not in kept or not kept["profiler_op_overhead_s"]
    path = tmp_path / "profile.json"
    replace(load_profile(PROFILE), profiler_op_overhead_s=c).save(path)
    off = replay(g, WhatIf(gpu=str(path))).summary
    expected = kept["iteration_time_s"] - c * (n_f + 3) - c * (m_b + 1)
    assert off["iteration_time_s"] == pytest.approx(expected, rel=1e-9)
    assert off["traced_step_s"] == kept["traced_step_s"]  # (what the trace measured stays)
    assert off["profiler_events"]["1"] >= m_b + 1
    assert off["profiler_removed_s"]["1"] == pytest.approx(c * off["profiler_events"]["1"])


def test_a_collective_waits_for_the_slower_rank():
    """Both ranks all-reduce; rank 1 reaches it 200 us later, so rank 0 waits."""
    def rank(r, before):
        step = ("user_annotation", "ProfilerStep#0", 0, 800, {})
        call = ("cpu_op", "c10d::allreduce_", before, 10, {"Input Dims": [[[2500]], [], [], []]})
        work = ("user_annotation", "gloo:all_reduce", before + 5, 800 - 100 - before - 5,
                {"Input type": ["float"], "Input Dims": [[2500]]})
        return _trace(r, [step, ("cpu_op", "bwd", 0, before, {}), call, work, ("cpu_op", "opt", 700, 100, {})])

    g = [read_kineto(rank(0, 100)), read_kineto(rank(1, 300))]
    [c] = [n for n in g[0].nodes if n.kind == "collective"]
    assert (c.op, c.group, c.nbytes) == ("allreduce", (0, 1), 10000.0)
    r = replay(g, WhatIf(gpu=PROFILE))
    spans = [s for s in r.trace.spans if s.rank == 0 and s.name.startswith("allreduce_")]
    assert spans[0].start_s == pytest.approx(105 * US)  # (rank 0's gloo work: 5 us into its call)
    # It moves data only once rank 1's starts (305 us): it ends later.
    assert spans[0].busy_start_s == pytest.approx(305 * US) and spans[0].end_s > 305 * US
    # Each rank then steps (100 us): without the wait, rank 0 would end at 110 + 100 us.
    assert r.summary["iteration_time_s"] == pytest.approx(spans[0].end_s + 100 * US, rel=1e-9)


def _validate_traces(config):
    return [read_kineto(str(DATA / config / f"trace_rank{r}.json.gz")) for r in (0, 1)]


def test_validate_1f1b_trace_structure():
    """The reference's 1F1B with 2 stages and 2 micro-batches: stage 0 sends 2 activations
    and receives 2 gradients, stage 1 the reverse; each message is micro-batch x sequence x
    hidden float32 (2 x 64 x 128 x 4 bytes); every send and receive is waited on once."""
    g0, g1 = _validate_traces("1f1b")
    for g, peer, sends, recvs in ((g0, 1, 2, 2), (g1, 0, 2, 2)):
        p2p = [n for n in g.nodes if n.kind in ("send", "recv")]
        assert [n.kind for n in p2p].count("send") == sends and [n.kind for n in p2p].count("recv") == recvs
        assert {n.peer for n in p2p} == {peer} and {n.nbytes for n in p2p} == {2 * 64 * 128 * 4.0}
        for n in p2p:
            assert len([m for m in g.nodes if n.id in m.data_deps]) == 1
        assert not [n for n in g.nodes if n.kind in ("collective", "comm")]
    # stage 0 sends first (its first forward's activation), stage 1 receives first
    assert next(n for n in g0.nodes if n.kind != "compute").kind == "send"
    assert next(n for n in g1.nodes if n.kind != "compute").kind == "recv"


def test_validate_dp_trace_structure():
    """Data parallel over 2 processes: one all-reduce per rank over both, of every gradient
    of the quick reference GPT in float32 (one bucket)."""
    h, f, v, s, layers = 128, 512, 1024, 64, 2
    per_layer = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    params = v * h + s * h + layers * per_layer + 2 * h + h * v  # embeddings, layers, final norm, output layer
    assert params == 667136
    for g in _validate_traces("dp"):
        comm = [n for n in g.nodes if n.kind != "compute"]
        assert [(n.kind, n.op, n.group, n.nbytes) for n in comm] == [("collective", "allreduce", (0, 1), params * 4.0)]


@pytest.mark.parametrize("config", ["dp", "1f1b"])
def test_validate_traces_replay_their_own_step(config):
    r = replay(_validate_traces(config), WhatIf(gpu=PROFILE))
    s = r.summary
    assert s["traced_step_s"] > 0.1
    assert abs(s["iteration_time_s"] - s["traced_step_s"]) <= 0.05 * s["traced_step_s"]


def test_cli_cpu_traces_need_the_machines_profile(capsys):
    files = [str(DATA / "1f1b" / f"trace_rank{r}.json.gz") for r in (0, 1)]
    assert main(["replay", *files]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--gpu" in err and "PROFILE.json" in err
    assert main(["replay", *files, "--gpu", PROFILE, "--topology", "dgx-h100"]) == 2
    assert "--topology" in capsys.readouterr().err
    gpu_trace = str(Path(__file__).parent / "data" / "replay-dp2" / "trace_rank1.json.gz")
    assert main(["replay", files[0], gpu_trace, "--gpu", PROFILE]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "trace_rank1.json.gz" in err and "mixed" in err
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["replay", *files, "--gpu", PROFILE, "--json"]) == 0
    s = json.loads(out.getvalue())
    assert s["world_size"] == 2 and s["step"] == 0 and s["comm_measured"] == 0


def test_experiment_replays_a_validate_directory(tmp_path):
    """experiments/replay_validate.py on a validate --out layout (the committed 1F1B run;
    validate measured 186.4 ms for its timed iteration, README in tests/data/replay-cpu)."""
    import gzip
    import shutil
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from replay_validate import rows

    (tmp_path / "traces" / "1f1b").mkdir(parents=True)
    for r in (0, 1):
        with gzip.open(DATA / "1f1b" / f"trace_rank{r}.json.gz", "rb") as f:
            (tmp_path / "traces" / "1f1b" / f"trace_rank{r}.json").write_bytes(f.read())
    shutil.copy(PROFILE, tmp_path / "profile.json")
    (tmp_path / "report.json").write_text(json.dumps({"configs": {"1f1b": {
        "measured": {"iteration_s": 0.18637510700136772}, "measured_iterations_s": [0.18637510700136772]}}}))
    [row] = rows(tmp_path)
    assert row["config"] == "1f1b" and row["ranks"] == 2
    assert row["replay_vs_traced"] == pytest.approx((row["replay_s"] - row["traced_s"]) / row["traced_s"])
    assert abs(row["replay_vs_traced"]) < 0.05
    assert row["replay_vs_measured"] == pytest.approx((row["replay_s"] - 0.18637510700136772) / 0.18637510700136772)
