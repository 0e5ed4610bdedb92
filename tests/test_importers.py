"""Importers: nccl-tests logs (text and JSON) and PyTorch profiler traces.

The fixtures (tests/data, see make_fixtures.py): an 8-GPU all_reduce_perf log written
from a known α-β model (α 2.5 µs, B 370 GB/s) and rounded as nccl-tests prints, its JSON
form, rccl-tests JSON lines, hand-made edge cases, a real gloo all-reduce sweep and real
profiler traces of a 2-process 1F1B iteration made on this machine.
"""

import gzip
import json
from pathlib import Path

import pytest

from sim.calibrate.fit import BUSBW_FACTOR
from sim.calibrate.kineto import load_kineto, op_times, trace_from_kineto
from sim.calibrate.nccl_tests import apply_to_profile, fit_link, load_nccl_tests, parse_text, to_text
from sim.cli import main
from sim.errors import InputError
from sim.inputs.hardware import load_profile

DATA = Path(__file__).resolve().parent / "data"
ALPHA, B = 2.5e-6, 370e9  # what make_fixtures.py wrote the 8-GPU logs from


def test_text_log_parses_and_fits_the_model_it_was_written_from():
    res = load_nccl_tests(DATA / "nccl_all_reduce_8gpu.txt")
    assert (res.op, res.ranks, res.complete) == ("all_reduce", 8, True)
    sizes = [r["bytes"] for r in res.rows]
    assert sizes == sorted(sizes) and len(sizes) == 14 and sizes[0] == 8
    # busbw = algbw x 2(n-1)/n (REFERENCE.md) in every row, to print precision
    for r in res.rows:
        if r["algbw_Bps"] >= 10e9:
            assert r["busbw_Bps"] / r["algbw_Bps"] == pytest.approx(BUSBW_FACTOR["all_reduce"](8), rel=1e-3)
        assert not r["in_place"]
    fit = fit_link([res])
    assert fit["latency_s"] == pytest.approx(ALPHA, rel=0.01)
    assert fit["bandwidth_Bps"] == pytest.approx(B, rel=0.01)
    assert res.avg_busbw_Bps == pytest.approx(sum(r["busbw_Bps"] for r in res.rows) / 14, rel=1e-3)


@pytest.mark.parametrize("name", ["nccl_all_reduce_8gpu.json", "rccl_all_reduce.jsonl"])
def test_json_forms_give_the_same_fit(name):
    res = load_nccl_tests(DATA / name)
    assert (res.op, res.ranks, len(res.rows)) == ("all_reduce", 8, 14)
    fit = fit_link([res])
    assert fit["latency_s"] == pytest.approx(ALPHA, rel=1e-6)
    assert fit["bandwidth_Bps"] == pytest.approx(B, rel=1e-6)


def test_missing_footer_is_noted_not_fatal():
    res = load_nccl_tests(DATA / "nccl_no_footer.txt")
    assert not res.complete and res.avg_busbw_Bps is None and len(res.rows) == 14


def test_in_place_columns_only():
    res = load_nccl_tests(DATA / "nccl_inplace_only.txt")
    assert all(r["in_place"] for r in res.rows) and len(res.rows) == 14
    # the in-place times are 1% slower in the fixture
    assert fit_link([res])["bandwidth_Bps"] == pytest.approx(B / 1.01, rel=0.01)


def test_truncated_file_is_a_one_line_error_naming_the_line(capsys):
    with pytest.raises(InputError, match=r"line 31: .*truncated"):
        load_nccl_tests(DATA / "nccl_truncated.txt")
    assert main(["import-nccl-tests", str(DATA / "nccl_truncated.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "truncated" in err and "Traceback" not in err


def test_older_layout_without_root_and_with_error_column():
    res = load_nccl_tests(DATA / "nccl_old_all_gather.txt")
    assert (res.op, res.ranks, len(res.rows), res.complete) == ("all_gather", 4, 4, True)
    fit = fit_link([res])
    largest = max(r["busbw_Bps"] for r in res.rows)
    assert largest <= fit["bandwidth_Bps"] < 1.2 * largest


def test_op_and_ranks_come_from_arguments_when_the_log_has_neither(tmp_path):
    rows = "\n".join(line for line in (DATA / "nccl_all_reduce_8gpu.txt").read_text().splitlines()
                     if not line.startswith("#"))
    path = tmp_path / "run.log"
    path.write_text(rows + "\n")
    with pytest.raises(InputError, match="op"):
        load_nccl_tests(path)
    res = load_nccl_tests(path, op="allreduce")
    assert res.ranks == 8  # from busbw / algbw
    assert load_nccl_tests(path, op="all_reduce", ranks=16).ranks == 16
    with pytest.raises(InputError, match="no result rows"):
        parse_text("# only comments\n", "empty.log", op="all_reduce")


def test_real_gloo_sweep_in_nccl_tests_layout_round_trips():
    res = load_nccl_tests(DATA / "gloo_all_reduce_perf.txt")
    assert (res.op, res.ranks) == ("all_reduce", 2)
    fit = fit_link([res])
    largest = max(r["busbw_Bps"] for r in res.rows)
    # The fitted bandwidth is within a factor of what the largest messages showed.
    assert largest / 5 < fit["bandwidth_Bps"] < largest * 5
    assert fit["latency_s"] >= 0
    again = parse_text(to_text([{"op": "all_reduce", **r} for r in res.rows], "all_reduce", 2), "again")
    assert [r["bytes"] for r in again.rows] == [r["bytes"] for r in res.rows]
    assert [r["time_s"] for r in again.rows] == pytest.approx([r["time_s"] for r in res.rows], rel=1e-3)


def test_import_command_writes_a_profile_that_loads(tmp_path, capsys):
    out = tmp_path / "h100-measured.json"
    assert main(["import-nccl-tests", str(DATA / "nccl_all_reduce_8gpu.txt"), "--profile", "h100-sxm",
                 "--link", "nvlink", "--out", str(out)]) == 0
    prof = load_profile(out)
    link = prof.link("nvlink")
    assert link.bandwidth_Bps == load_profile("h100-sxm").link("nvlink").bandwidth_Bps  # line rate kept
    assert link.effective_Bps == pytest.approx(B, rel=0.01)
    # the log's times are 14 alpha + S-term on 8 ranks; the simulator adds ring/Simple's base
    # latency (8.4 us) to every all-reduce, so the link's alpha carries the rest
    assert link.latency_s == pytest.approx(ALPHA - 8.4e-6 / 14, rel=0.01)
    assert "nccl-tests" in prof.sources["links.nvlink"]
    assert "370" in capsys.readouterr().out
    # B spread over 8 NICs per rank across nodes
    ib = apply_to_profile(load_profile("h100-sxm"), "ib", fit_link([load_nccl_tests(DATA / "nccl_all_reduce_8gpu.txt")]),
                          ["x"], links_per_rank=8).link("ib")
    assert ib.effective_Bps == pytest.approx(B / 8, rel=0.01)


def test_import_command_errors_are_one_line(tmp_path, capsys):
    for argv in (["import-nccl-tests", str(DATA / "nccl_all_reduce_8gpu.txt"), "--out", str(tmp_path / "x.json")],
                 ["import-nccl-tests", str(DATA / "nccl_all_reduce_8gpu.txt"), "--link", "wifi"],
                 ["import-nccl-tests", str(tmp_path / "missing.log")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("trainsim: error: ") and err.count("\n") == 1
    assert not (tmp_path / "x.json").exists()


# ---------------------------------------------------------------------- Kineto
def _ranks():
    return [DATA / "kineto_rank0.json.gz", DATA / "kineto_rank1.json.gz"]


def test_profiler_trace_from_a_real_gloo_run():
    data = load_kineto(_ranks()[1])
    assert data["distributedInfo"]["backend"] == "gloo" and data["distributedInfo"]["world_size"] == 2
    times = op_times(_ranks()[0])
    assert times["kind"] == "cpu_op"
    ops = times["ops"]
    assert "aten::mm" in ops or "aten::addmm" in ops
    for row in ops.values():
        assert row["count"] >= 1 and 0 <= row["self_s"] <= row["total_s"] + 1e-12
    selfs = [row["self_s"] for row in ops.values()]
    assert selfs == sorted(selfs, reverse=True)


def test_measured_timeline_has_the_schedule_steps():
    trace = trace_from_kineto(_ranks())
    steps = {(s.rank, s.name) for s in trace.spans if s.kind == "compute" and s.category in "FB"}
    # the 1F1B iteration of 2 micro-batches on 2 stages (make_fixtures.py)
    assert steps == {(r, f"{r}{k}{mb}") for r in (0, 1) for k in "FB" for mb in (0, 1)}
    assert {s.category for s in trace.spans} >= {"F", "B", "opt", "pp"}
    assert min(s.start_s for s in trace.spans) == 0.0 and trace.end_s > 0
    for r in (0, 1):  # a rank's compute steps never overlap
        comp = sorted((s.start_s, s.end_s) for s in trace.spans_of(r, "compute"))
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(comp, comp[1:]))
    kernels_or_ops = trace_from_kineto(_ranks()[:1], level="cpu_ops")
    assert kernels_or_ops.spans and all(s.rank == 0 for s in kernels_or_ops.spans)


def test_gpu_kernels_and_nccl_kernels_become_compute_and_comm(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "ts": 100.0, "dur": 50.0, "pid": 0, "tid": 7,
         "args": {"stream": 7, "device": 0}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ts": 140.0, "dur": 30.0,
         "pid": 0, "tid": 20, "args": {"stream": 20, "Collective name": "allreduce", "In msg nelems": 1024,
                                       "Group size": 8, "dtype": "BFloat16"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 90.0, "dur": 5.0, "pid": 1, "tid": 1},
    ]
    path = tmp_path / "gpu.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 3}}).encode()))
    trace = trace_from_kineto([path])
    assert [(s.rank, s.stream, s.category, s.start_s, s.end_s) for s in trace.spans] == [
        (3, "comm", "dp", pytest.approx(40e-6), pytest.approx(70e-6)),
        (3, "compute", "compute", 0.0, pytest.approx(50e-6))]
    assert list(op_times(path)["ops"]) == ["sm90_xmma_gemm_bf16", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]
    # record_function ranges as the GPU ran them win over the CPU thread's
    events += [{"ph": "X", "cat": "user_annotation", "name": "0F0", "ts": 80.0, "dur": 15.0, "pid": 1, "tid": 1},
               {"ph": "X", "cat": "gpu_user_annotation", "name": "0F0", "ts": 100.0, "dur": 50.0, "pid": 0, "tid": 7}]
    ann = trace_from_kineto([{"traceEvents": events}], level="annotations")
    assert [(s.name, s.category, s.end_s - s.start_s) for s in ann.spans] == [("0F0", "F", pytest.approx(50e-6))]


def test_bad_traces_are_clear_errors(tmp_path):
    cut = tmp_path / "cut.json"
    cut.write_text(gzip.decompress(_ranks()[0].read_bytes()).decode()[:5000])
    with pytest.raises(InputError, match="truncated"):
        load_kineto(cut)
    gz = tmp_path / "cut.json.gz"
    gz.write_bytes(_ranks()[0].read_bytes()[:3000])
    with pytest.raises(InputError, match="truncated"):
        load_kineto(gz)
    (tmp_path / "no.json").write_text('{"events": []}')
    with pytest.raises(InputError, match="traceEvents"):
        load_kineto(tmp_path / "no.json")
    (tmp_path / "bad.json").write_text('{"traceEvents": [{"ph": "X", "name": "k", "ts": "soon", "dur": 1}]}')
    with pytest.raises(InputError, match="ts"):
        load_kineto(tmp_path / "bad.json")
    with pytest.raises(InputError, match="same rank"):
        trace_from_kineto([_ranks()[0], _ranks()[0]])


def test_import_trace_command(tmp_path, capsys):
    assert main(["import-trace", *map(str, _ranks()), "--top", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cpu ops by time" in out and "timeline:" in out
    assert (tmp_path / "timeline.png").stat().st_size > 0
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


def test_the_alpha_beta_fit_takes_the_base_latency_off_so_base_plus_fit_gives_the_measured_time():
    # times made as base + ring closed form: the fit recovers alpha and B, and the
    # simulator's collective (base + closed form with the fitted link) is the measured one
    from sim.calibrate.fit import fit_alpha_beta, ring_coefficients

    base, alpha, B, n = 8.4e-6, 2e-6, 40e9, 8
    pts = [("all_reduce", n, s, base + ring_coefficients("all_reduce", n)[0] * alpha
            + ring_coefficients("all_reduce", n)[1] * s / B) for s in (1e3, 1e5, 1e7, 1e9)]
    fit = fit_alpha_beta(pts, base)
    assert fit["latency_s"] == pytest.approx(alpha, rel=1e-6) and fit["bandwidth_Bps"] == pytest.approx(B, rel=1e-6)
    plain = fit_alpha_beta(pts)  # without it, alpha absorbs the base: 2(n-1) alpha' = 2(n-1) alpha + base
    assert plain["latency_s"] > alpha * 1.2
