"""``trainsim fit --cache FILE``: simulated times kept on disk and reused (sim.calibrate.fit_sims)."""

import contextlib
import csv
import io
import json
from pathlib import Path

import pytest

from sim.calibrate.fit_runs import parameter, prepare_rows
from sim.calibrate.fit_sims import Simulations, Store, code_fingerprint
from sim.calibrate.runs_csv import read_runs
from sim.cli import main
from sim.errors import InputError
from sim.inputs.hardware import load_profile

ROW = dict(source="test a", gpu="a100-80gb", precision="bf16", num_layers=2, hidden_size=512, num_attention_heads=8,
           vocab_size=32000, seq_length=1024, activation="gelu", tensor_model_parallel_size=2,
           pipeline_model_parallel_size=1, sequence_parallel="false", needs="")


def _csv(path: Path) -> Path:
    rows = [dict(ROW, gpus=8, global_batch_size=16, measured_iteration_time_s="0.05"),
            dict(ROW, gpus=16, global_batch_size=32, measured_iteration_time_s="0.052"),
            dict(ROW, source="test b", hidden_size=1024, gpus=8, global_batch_size=16,
                 measured_iteration_time_s="0.11"),
            dict(ROW, source="test b", hidden_size=1024, gpus=16, global_batch_size=32,
                 measured_iteration_time_s="0.115")]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def _fit(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["fit", *argv, "--gpu", "a100-80gb", "--json"])
    return code, json.loads(out.getvalue()) if code == 0 else None


def test_a_second_fit_with_the_same_cache_simulates_nothing_and_reports_the_same(tmp_path):
    data, cache = _csv(tmp_path / "runs.csv"), tmp_path / "sims.jsonl"
    code, first = _fit([str(data), "--cache", str(cache)])
    assert code == 0 and first["simulations"] > 0 and first["reused"] == 0
    assert len(cache.read_text().splitlines()) == first["simulations"]  # one line per simulation
    code, again = _fit([str(data), "--cache", str(cache)])
    assert code == 0 and again["simulations"] == 0 and again["reused"] == first["simulations"]
    # every simulation is counted under what it was for; the second fit simulated nothing
    assert sum(first["simulations_by_phase"].values()) == first["simulations"] and again["simulations_by_phase"] == {}
    assert first["simulations_by_phase"]["start and its probes"] > 0 and first["simulations_by_phase"]["held-out rows"] > 0
    for k in ("wall_s", "simulations", "reused", "simulations_by_phase"):
        first.pop(k), again.pop(k)
    assert again == first
    # a fit killed mid-write leaves a broken last line: it is skipped, the rest reused
    lines = cache.read_text().splitlines()
    cache.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    code, partial = _fit([str(data), "--cache", str(cache)])
    assert code == 0 and partial["simulations"] == 1 and partial["reused"] == len(lines) - 1


def test_a_stored_time_answers_only_for_the_same_row_profile_and_code(tmp_path):
    runs = read_runs(_csv(tmp_path / "runs.csv"))
    a100 = load_profile("a100-80gb")
    params = (parameter("sustained_compute_fraction"),)
    store = Store(tmp_path / "c.jsonl", a100, params, runs)
    assert len(set(store.keys)) == len(runs)  # every row its own key
    store.put(0, (0.8,), 1.25)
    again = Store(tmp_path / "c.jsonl", a100, params, runs)
    assert again.get(0, (0.8,)) == 1.25 and again.get(0, (0.8000001,)) is None and again.get(1, (0.8,)) is None
    other = Store(tmp_path / "c.jsonl", load_profile("h100-sxm"), params, runs)
    assert other.get(0, (0.8,)) is None  # another profile to start from
    more = Store(tmp_path / "c.jsonl", a100, params + (parameter("kernel_launch_s"),), runs)
    assert more.get(0, (0.8,)) is None
    assert len(code_fingerprint()) == 64
    # Simulations takes a stored time instead of simulating
    sims = Simulations(a100, params, prepare_rows(runs[:1], "a100-80gb"), store=again)
    assert sims.times([0], [0.8]) == [1.25] and sims.count == 0 and sims.reused == 1


def test_a_cache_that_is_a_folder_or_in_a_missing_folder_is_refused(tmp_path):
    runs = read_runs(_csv(tmp_path / "runs.csv"))
    params = (parameter("sustained_compute_fraction"),)
    with pytest.raises(InputError, match="--cache: .* is a directory"):
        Store(tmp_path, load_profile("a100-80gb"), params, runs)
    with pytest.raises(InputError, match="--cache: .* does not exist"):
        Store(tmp_path / "no" / "c.jsonl", load_profile("a100-80gb"), params, runs)


def _sims(tmp_path, names):
    runs = read_runs(_csv(tmp_path / "runs.csv"))
    h100 = load_profile("h100-sxm")
    params = tuple(parameter(n) for n in names)
    return Simulations(h100, params, prepare_rows(runs, "h100-sxm")), h100


def test_a_row_is_simulated_at_what_it_sees_and_differentiated_by_the_chain_rule(tmp_path):
    from sim.inputs.pacing import expected_max_normal

    names = ("sustained_compute_fraction", "gpu_speed_spread", "fp8_gemm_max_efficiency")
    sims, h100 = _sims(tmp_path, names)
    f, sigma, cap = 0.9, 0.03, 0.75
    # the spread folds into the fraction as the simulator paces it; a BF16 row never reads the FP8 cap
    e16 = expected_max_normal(16)
    assert sims.seen(1, (f, sigma, cap)) == (f * (1 - sigma * e16), 0.0, h100.fp8_gemm_max_efficiency)
    assert sims.time_s(1, (f, sigma, cap)) == sims.time_s(1, sims.seen(1, (f, sigma, cap)))
    assert sims.time_s(1, (f, 0.0, 0.6)) == sims.time_s(1, (f, 0.0, 0.9))
    # slopes against plain forward differences in each parameter (the same step)
    steps = (4e-4, 5e-5, 4.5e-4)
    before = sims.count
    [grad] = sims.slopes([1], (f, sigma, cap), steps)
    assert sims.count - before == 1  # one step along the fraction it sees (the row at what it sees ran above)
    base = sims.time_s(1, (f, sigma, cap))
    for j in range(3):
        x = [f, sigma, cap]
        x[j] += steps[j]
        plain = (sims.times([1], x)[0] - base) / steps[j]
        assert grad[j] == pytest.approx(plain, rel=0.02, abs=1e-9 * base)
    assert grad[2] == 0.0 and grad[0] < 0 < grad[1]  # faster GPUs, shorter step; more spread, longer


def test_a_row_without_experts_never_sees_the_moe_blocks_rate(tmp_path):
    # only a mixture-of-experts block's kernels read moe_memory_relative_efficiency
    # (sim.program.costs.in_moe_block): a dense row's simulation is one at any rate, so it is
    # simulated once and its slope along the rate is 0 without a difference; an MoE row sees it
    moe = dict(ROW, source="test moe", sequence_parallel="true", num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=256,
               expert_model_parallel_size=4, gpus=8, global_batch_size=16, measured_iteration_time_s="0.08")
    path = tmp_path / "runs.csv"
    with open(path, "w", newline="") as fh:
        rows = [dict(ROW, gpus=8, global_batch_size=16, measured_iteration_time_s="0.05"), moe]
        w = csv.DictWriter(fh, fieldnames=list(moe))
        w.writeheader()
        w.writerows([{k: r.get(k, "") for k in moe} for r in rows])
    a100 = load_profile("a100-80gb")
    params = (parameter("sustained_compute_fraction"), parameter("moe_memory_relative_efficiency"))
    sims = Simulations(a100, params, prepare_rows(read_runs(path), "a100-80gb"))
    assert sims.seen(0, (0.8, 0.5)) == sims.seen(0, (0.8, 0.9)) == (0.8, params[1].low)
    assert sims.seen(1, (0.8, 0.5)) == (0.8, 0.5)
    assert sims.sensitive([0], (0.8, 0.5)) == [True, False] and sims.sensitive([1], (0.8, 0.5)) == [True, True]
    [dense, routed] = sims.slopes([0, 1], (0.8, 0.5), (4e-4, 8e-4))
    assert dense[1] == 0.0 and dense[0] < 0 and routed[1] < 0  # a slower MoE block, a longer step
    assert sims.count == 2 + 3  # the dense row at its point and one step; the MoE row at its point and two
    # the held value is the dense row's time at any rate, simulated
    assert sims.times([0], (0.8, 0.5)) == [sims.time_s(0, (0.8, 0.9))]


def test_a_parameter_no_row_sees_is_found_out_without_simulating(tmp_path):
    # the held-out fits start such a parameter from the profile, not from the fit that saw the held-out rows
    names = ("sustained_compute_fraction", "fp8_gemm_max_efficiency", "gpu_speed_spread")
    sims, h100 = _sims(tmp_path, names)
    x = (0.9, 0.7, 0.02)
    assert sims.sensitive([0, 1, 2, 3], x) == [True, False, True]  # BF16 rows never read the FP8 cap
    assert sims.count == 0
    only_f = Simulations(h100, (parameter("gpu_speed_spread"),), sims.prepared)
    assert only_f.sensitive([0], (0.02,)) == [True]  # the spread alone still moves what a row sees


def test_a_row_that_barely_moved_reuses_its_last_probes_and_one_that_moved_probes_again(tmp_path):
    from sim.calibrate.fit_sims import SLOPE_REUSE

    names = ("sustained_compute_fraction", "gpu_speed_spread")
    sims, _ = _sims(tmp_path, names)
    steps = (4e-4, 5e-5)
    [first] = sims.slopes([1], (0.9, 0.02), steps)
    count = sims.count
    assert count == 2  # the row at what it sees, and one step along the fraction it sees
    # moved by a tenth of the reuse limit: nothing simulated (the fit's residuals simulate the new point)
    near = (0.9 * (1 + SLOPE_REUSE / 10), 0.02)
    [again] = sims.slopes([1], near, steps)
    assert sims.count == count and again == pytest.approx(first, rel=SLOPE_REUSE)  # (chained at the new point)
    # moved by twice the limit: probed again, and the slope is the plain difference there
    far = (0.9 * (1 + 2 * SLOPE_REUSE), 0.02)
    [fresh] = sims.slopes([1], far, steps)
    assert sims.count == count + 2
    x = list(far)
    x[0] += steps[0]
    plain = (sims.times([1], x)[0] - sims.times([1], far)[0]) / steps[0]
    assert fresh[0] == pytest.approx(plain, rel=0.02)
    assert fresh != first


def test_a_held_out_fit_keeps_a_parameter_none_of_its_rows_reads_where_it_started(tmp_path):
    rows = [dict(ROW, gpu="h100-sxm", gpus=8, global_batch_size=16, measured_iteration_time_s="0.03"),
            dict(ROW, gpu="h100-sxm", source="test b", hidden_size=1024, gpus=8, global_batch_size=16,
                 measured_iteration_time_s="0.06"),
            dict(ROW, gpu="h100-sxm", source="test c", precision="fp8", hidden_size=1024, gpus=8,
                 global_batch_size=16, measured_iteration_time_s="0.045")]
    data = tmp_path / "runs.csv"
    with open(data, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["fit", str(data), "--gpu", "h100-sxm", "--json",
                     "--params", "sustained_compute_fraction,fp8_gemm_max_efficiency"])
    assert code == 0
    report = json.loads(out.getvalue())
    # where the fit starts: the preset's cap, or the profile's ceiling for it where that is lower
    cap = min(load_profile("h100-sxm").fp8_gemm_max_efficiency,
              load_profile("h100-sxm").efficiency_ceilings["fp8_gemm_max_efficiency"])
    assert {p["name"]: p["initial"] for p in report["parameters"]}["fp8_gemm_max_efficiency"] == cap
    fitted = {p["name"]: p["fitted"] for p in report["parameters"]}
    assert fitted["fp8_gemm_max_efficiency"] != pytest.approx(cap, rel=1e-3)  # the FP8 row pulls it in the full fit
    [fp8] = [g for g in report["groups"] if g["precision"] == "fp8"]
    assert fp8["held_out_fit"]["fp8_gemm_max_efficiency"] == cap  # held out, no row reads it: it stays put
    assert fp8["held_out_fit"]["sustained_compute_fraction"] != fitted["sustained_compute_fraction"]


def test_a_cache_torn_by_a_kill_keeps_its_whole_lines_and_the_next_time_starts_a_line_of_its_own(tmp_path):
    # issue 56: a fit killed while writing leaves a torn last line; the next fit with the same
    # file reads every whole line, and what it appends is not glued to the torn one
    runs = read_runs(_csv(tmp_path / "runs.csv"))
    profile, params = load_profile("a100-80gb"), [parameter("sustained_compute_fraction")]
    cache = tmp_path / "sims.jsonl"
    store = Store(cache, profile, params, runs)
    store.put(0, (0.8,), 0.05)
    store.put(1, (0.8,), 0.06)
    whole = cache.read_text()
    cache.write_text(whole + '{"key": "ab')  # killed mid-line
    again = Store(cache, profile, params, runs)
    assert again.get(0, (0.8,)) == 0.05 and again.get(1, (0.8,)) == 0.06
    again.put(2, (0.8,), 0.07)
    assert Store(cache, profile, params, runs).get(2, (0.8,)) == 0.07
    assert cache.read_text().splitlines()[:3] == [*whole.splitlines(), '{"key": "ab']
