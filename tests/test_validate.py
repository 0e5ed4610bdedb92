"""Validation: the reference run's communication cannot deadlock, the simulated machine
has the measured α-β, the report's arithmetic is right, and a real 2-process validation
produces a complete report (structure only: never this machine's speed).
"""

import json

import pytest

from sim.program.actions import Action, Program
from sim.calibrate.reference import p2p_groups
from sim.calibrate.validate import (
    config_plan,
    default_configs,
    machine_topology,
    rows_for,
    sim_profile,
    summarize_errors,
)
from sim.cli import main
from sim.engine.core import simulate
from sim.errors import InputError
from sim.inputs.hardware import HardwareProfile, LinkModel
from sim.program.schedules import build_schedule


def _groups_complete(schedule) -> bool:
    """Run every rank's p2p groups under NCCL's rule (a group finishes only when the
    matching op of each of its sends and receives has been posted by the peer, and a
    rank posts its next group only after the previous one finished)."""
    groups = {r: p2p_groups(schedule, r) for r in range(schedule.pp)}
    pos = {r: 0 for r in groups}
    posted: dict[tuple, set] = {}

    def key(r, op, direction):
        peer, what, st, mb = op
        src, dst = (r, peer) if direction == "send" else (peer, r)
        return (src, dst, what, st, mb)

    progress = True
    while progress:
        progress = False
        for r, gs in groups.items():
            if pos[r] >= len(gs):
                continue
            _, sends, recvs = gs[pos[r]]
            mine = [(key(r, o, "send"), "send") for o in sends] + [(key(r, o, "recv"), "recv") for o in recvs]
            for k, d in mine:
                posted.setdefault(k, set()).add(d)
            if all(posted.get(k) == {"send", "recv"} for k, _ in mine):
                pos[r] += 1
                progress = True
    return all(pos[r] == len(g) for r, g in groups.items())


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp,m", [(2, 1), (2, 4), (3, 5), (4, 4), (4, 8)])
def test_reference_p2p_groups_never_deadlock(name, pp, m):
    sched = build_schedule(name, pp, m)
    assert _groups_complete(sched)
    # every activation and gradient is sent once and received once
    sends = [(r, o) for r in range(pp) for _, s, _ in p2p_groups(sched, r) for o in s]
    recvs = [(r, o) for r in range(pp) for _, _, rv in p2p_groups(sched, r) for o in rv]
    assert len(sends) == len(recvs) == 2 * (pp - 1) * m


def test_1f1b_pairs_a_send_with_the_next_receive_like_megatron():
    # Stage 0 of 1F1B (pp 2, m 2): after 0F1 it sends that activation and receives the
    # gradient 0B0 needs, in one group (Megatron's send_forward_recv_backward).
    groups = p2p_groups(build_schedule("1f1b", 2, 2), 0)
    assert groups[1] == ("0B0", [(1, "act", 0, 1)], [(1, "grad", 1, 0)])


def _profile(link=LinkModel(100e-6, 1e9, 1.0)):
    return HardwareProfile(name="cpu", peak_flops={"fp32": 5e10, "bf16": 5e10}, hbm_bandwidth_Bps=2e10,
                           hbm_capacity_bytes=8e9, sm_count=1, gemm_tiles=((16, 16, 1.0),), gemm_k_overhead=8.0,
                           gemm_max_efficiency=0.9, attention_max_efficiency=0.5, memory_efficiency=1.0,
                           kernel_launch_s=5e-6, links={"ethernet": link})


def test_machine_topology_carries_the_measured_alpha_beta():
    prof = _profile()
    topo = machine_topology(2, prof, "ethernet")
    S = 4e6
    prog = Program({0: [Action("s", kind="send", peer=1, nbytes=S)], 1: [Action("r", kind="recv", peer=0, nbytes=S)]})
    trace = simulate(prog, topo, link_efficiency=prof.link_efficiencies())
    assert trace.end_s == pytest.approx(100e-6 + S / 1e9, rel=1e-9)
    # a 2-rank ring all-reduce: NCCL's ring/Simple base latency (8.4 us, baseLatencies in
    # NVIDIA/nccl src/graph/tuning.cc) + 2(n-1)(α + S/(nB))
    group = (0, 1)
    prog = Program({r: [Action("ar", kind="collective", op="allreduce", group=group, nbytes=S, channels=1)]
                    for r in group})
    trace = simulate(prog, topo, link_efficiency=prof.link_efficiencies())
    assert trace.end_s == pytest.approx(8.4e-6 + 2 * (100e-6 + S / 2 / 1e9), rel=1e-9)


def test_float32_reference_halves_byte_rates_in_the_simulation():
    prof = _profile()
    half = sim_profile(prof, 4)
    assert half.hbm_bandwidth_Bps == prof.hbm_bandwidth_Bps / 2
    assert half.link("ethernet").bandwidth_Bps == 0.5e9 and half.link("ethernet").latency_s == 100e-6
    assert half.peak() == prof.peak() and sim_profile(prof, 2) is prof


def test_rows_and_errors():
    meas = {"iteration_s": 0.2, "stages": {0: {"compute_s": 0.1, "idle_s": 0.1}, 1: {"compute_s": 0.15, "idle_s": 0.05}}}
    sim = {"iteration_s": 0.22, "stages": {0: {"compute_s": 0.09, "idle_s": 0.13}, 1: {"compute_s": 0.15, "idle_s": 0.07}}}
    rows = rows_for("1f1b", meas, sim)
    assert [r["config"] for r in rows] == ["1f1b: iteration time", "1f1b: stage 0 compute", "1f1b: stage 0 idle",
                                           "1f1b: stage 1 compute", "1f1b: stage 1 idle"]
    assert [r["error"] for r in rows] == pytest.approx([0.1, -0.1, 0.3, 0.0, 0.4])
    more = rows + rows_for("dp", {"iteration_s": 0.1, "stages": {0: {"compute_s": 0.08, "idle_s": 0.02}}},
                           {"iteration_s": 0.07, "stages": {0: {"compute_s": 0.06, "idle_s": 0.01}}})
    err = summarize_errors(more)
    assert err["mean_abs_error"] == pytest.approx((0.1 + 0.3) / 2)
    assert err["max_abs_error"] == pytest.approx(0.3)
    assert err["breakdown_max_abs_error"] == pytest.approx(0.5)


def test_configurations():
    assert default_configs(2) == ["dp", "gpipe", "1f1b"]
    assert default_configs(4) == ["dp", "gpipe", "1f1b", "dp-pp"]
    p = config_plan("dp-pp", 4, 2, 4)
    assert (p.dp, p.pp, p.schedule, p.num_microbatches, p.dp_overlap) == (2, 2, "1f1b", 4, False)
    assert config_plan("gpipe", 2).schedule == "gpipe"
    with pytest.raises(InputError, match="dp-pp needs"):
        config_plan("dp-pp", 2)
    with pytest.raises(InputError, match="allowed"):
        config_plan("zero3", 2)


def test_validate_input_errors_are_one_line(tmp_path, capsys):
    pytest.importorskip("torch")
    for argv in (["validate", "--configs", "dp,zero3", "--out", str(tmp_path / "v")],
                 ["validate", "--procs", "2", "--configs", "dp-pp", "--out", str(tmp_path / "v")],
                 ["validate", "--procs", "2", "--num-layers", "3", "--configs", "gpipe", "--out", str(tmp_path / "v")],
                 ["validate", "--iters", "0", "--out", str(tmp_path / "v")]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("trainsim: error: ") and err.count("\n") == 1
    assert not (tmp_path / "v").exists()


def test_validate_on_two_processes(tmp_path, capfd):
    pytest.importorskip("torch")
    out = tmp_path / "validation"
    assert main(["validate", "--quick", "--procs", "2", "--configs", "dp,1f1b", "--json", "--out", str(out)]) == 0
    cap = capfd.readouterr()  # what reached the file descriptors, the workers' C++ libraries included
    report = json.loads(cap.out)
    # issue 54: the profiler's `USDT: ... profiler_start` lines flooded the terminal, from every rank
    assert "profiler_start" not in cap.out + cap.err and "USDT" not in cap.out + cap.err
    rows = report["rows"]
    assert [r["config"] for r in rows] == ["dp: iteration time", "dp: stage 0 compute", "dp: stage 0 idle",
                                           "1f1b: iteration time", "1f1b: stage 0 compute", "1f1b: stage 0 idle",
                                           "1f1b: stage 1 compute", "1f1b: stage 1 idle"]
    for r in rows:
        assert r["measured_s"] > 0 and r["simulated_s"] >= 0
        assert r["error"] == pytest.approx((r["simulated_s"] - r["measured_s"]) / r["measured_s"])
    its = [abs(r["error"]) for r in rows if r["metric"] == "iteration"]
    assert report["mean_abs_error"] == pytest.approx(sum(its) / len(its))
    assert report["max_abs_error"] == pytest.approx(max(its))
    assert report["element_bytes"] in (2, 4) and report["procs"] == 2
    for config in ("dp", "1f1b"):
        d = report["configs"][config]
        assert all(t > 0 for t in d["measured_iterations_s"])
        assert len(d["steal_s"]) == len(d["measured_iterations_s"]) and all(t is None or t >= 0 for t in d["steal_s"])
        # one probe before each timed iteration and one after the last, on each rank; the gate ran
        # at least the 3 iterations asked for and at most 4x as many, and says which were steady
        n = len(d["measured_iterations_s"])
        assert 3 <= n <= 12 and len(d["probe"]["measured_s"]) == 2 * (n + 1)
        assert d["probe"]["predicted_s"] > 0 and d["probe"]["slowdown"] > 0
        assert d["tolerance"] == 0.1 and set(d["steady_iterations"]) <= set(range(n))
        assert d["steady"] == (len(d["steady_iterations"]) >= 3) and (d["steady"] or n == 12)
        assert (out / f"{config}.png").stat().st_size > 0
        assert sorted(p.name for p in (out / "traces" / config).iterdir()) == ["trace_rank0.json", "trace_rank1.json"]
    saved = json.loads((out / "report.json").read_text())
    assert saved["rows"] == rows
    assert "iteration time: mean" in (out / "table.txt").read_text()
    assert main(["estimate", "--gpu", str(out / "profile.json"), "--num-layers", "2", "--hidden-size", "128",
                 "--num-attention-heads", "2", "--vocab-size", "1024", "--seq-length", "64"]) == 0


def test_host_steal_is_the_stat_files_steal_column_in_seconds(tmp_path):
    import os

    from sim.calibrate.reference import host_steal_s

    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice (proc(5))
    stat.write_text("cpu  4935268 150300 303572 3027346 9721 0 3077 34948 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    assert host_steal_s(str(stat)) == pytest.approx(34948 / os.sysconf("SC_CLK_TCK"))
    stat.write_text("cpu  1 2 3\n")
    assert host_steal_s(str(stat)) is None
    assert host_steal_s(str(tmp_path / "missing")) is None


def test_host_busy_is_user_nice_system_irq_softirq_in_seconds(tmp_path):
    import os

    from sim.calibrate.reference import host_busy_s

    stat = tmp_path / "stat"
    stat.write_text("cpu  4935268 150300 303572 3027346 9721 0 3077 34948 0 0\n")
    assert host_busy_s(str(stat)) == pytest.approx((4935268 + 150300 + 303572 + 0 + 3077) / os.sysconf("SC_CLK_TCK"))
    assert host_busy_s(str(tmp_path / "missing")) is None


def test_an_iteration_counts_only_with_the_machine_as_calibrated():
    from sim.calibrate.reference import STEAL_TOLERANCE, machine_as_calibrated as ok

    # probes on both sides within 10% of the prediction, either way (1/1.1 .. 1.1)
    assert ok(1.05e-3, 0.95e-3, 1e-3, 0.1, 0.0, 0.2, cpus=2)
    assert not ok(1.12e-3, 1.0e-3, 1e-3, 0.1, 0.0, 0.2, cpus=2)  # slow before
    assert not ok(1.0e-3, 0.90e-3, 1e-3, 0.1, 0.0, 0.2, cpus=2)  # 1/0.9 = 1.11x faster after
    assert ok(1.0e-3, 1 / 1.1 * 1e-3 + 1e-12, 1e-3, 0.1, 0.0, 0.2, cpus=2)
    # stolen CPU: 2% of 0.2 s x 2 CPUs = 8 ms
    assert ok(1e-3, 1e-3, 1e-3, 0.1, 0.2 * 2 * STEAL_TOLERANCE * 0.99, 0.2, cpus=2)
    assert not ok(1e-3, 1e-3, 1e-3, 0.1, 0.2 * 2 * STEAL_TOLERANCE * 1.01, 0.2, cpus=2)
    # no gate; a missing reading does not count against an iteration
    # other processes' CPU: 10% of 0.2 s x 2 CPUs = 40 ms
    assert ok(1e-3, 1e-3, 1e-3, 0.1, 0.0, 0.2, cpus=2, others_s=0.039)
    assert not ok(1e-3, 1e-3, 1e-3, 0.1, 0.0, 0.2, cpus=2, others_s=0.041)
    assert ok(5e-3, 5e-3, 1e-3, None, 1.0, 0.2, cpus=2, others_s=1.0)
    assert ok(None, 1e-3, 1e-3, 0.1, None, 0.2, cpus=2) and ok(5e-3, 5e-3, None, 0.1, 0.0, 0.2, cpus=2)


def test_the_measured_side_takes_the_steady_iterations():
    from sim.calibrate.validate import measured_breakdown, steady_indices

    plan = config_plan("dp", 2)

    def its(times, steady):
        return [{"iteration_s": t, "steady": s, "spans": [("f", "compute", "x", 0.0, t / 2)]} for t, s in zip(times, steady)]

    times, steady = [0.10, 0.30, 0.11, 0.50, 0.12], [True, False, True, False, True]
    results = [{"rank": r, "iterations": its(times, steady)} for r in (0, 1)]
    assert steady_indices(results) == [0, 2, 4]
    b = measured_breakdown(results, plan)
    assert b["iteration_s"] == pytest.approx(0.11)  # the median of 0.10, 0.11, 0.12
    assert b["stages"][0]["compute_s"] == pytest.approx(0.055) and b["stages"][0]["idle_s"] == pytest.approx(0.055)
    none = [{"rank": r, "iterations": its(times, [False] * 5)} for r in (0, 1)]
    assert steady_indices(none) == [0, 1, 2, 3, 4]  # none steady: all of them, and the report says so
    assert measured_breakdown(none, plan)["iteration_s"] == pytest.approx(0.12)
