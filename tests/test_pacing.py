"""The slowest GPU paces a synchronous step (sim.inputs.pacing, HardwareProfile.gpu_speed_spread)."""

import json
import math
from dataclasses import replace

import pytest

import sim
from sim.cli import main
from sim.errors import InputError
from sim.inputs.hardware import HardwareProfile, load_profile
from sim.inputs.pacing import expected_max_normal, paced, slowest_speed

H100 = replace(load_profile("h100-sxm"), gpu_speed_spread=0.0)
"""The H100 preset without its fitted spread: the tests add their own spread to it."""


def test_the_expected_largest_of_n_normals_matches_its_closed_forms():
    # e(1) = 0, e(2) = 1/sqrt(pi), e(3) = 3/(2 sqrt(pi)); e(4) = 1.029375, e(5) = 1.162965
    # (the tabulated expected maxima of normal samples, Tippett 1925 / Harter 1961)
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)
    assert expected_max_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-9)
    assert expected_max_normal(4) == pytest.approx(1.029375, abs=1e-6)
    assert expected_max_normal(5) == pytest.approx(1.162965, abs=1e-6)


def test_the_expected_largest_grows_with_n_and_stays_under_its_bound():
    # E[max of n] <= sqrt(2 ln n) for standard normals, and it grows with n
    ns = [2, 8, 64, 128, 1000, 2048, 16384, 100000]
    e = [expected_max_normal(n) for n in ns]
    assert all(a < b for a, b in zip(e, e[1:]))
    assert all(x <= math.sqrt(2 * math.log(n)) for x, n in zip(e, ns))
    assert e[-1] > 0.9 * math.sqrt(2 * math.log(ns[-1])) - 1  # (it approaches the bound slowly)


def test_a_paced_profile_runs_compute_at_the_slowest_gpus_speed():
    p = replace(H100, gpu_speed_spread=0.02)
    assert paced(p, 1) is p and paced(H100, 2048) is H100  # one GPU, or no spread: unchanged
    q = paced(p, 2048)
    assert q.sustained_compute_fraction == pytest.approx(H100.sustained_compute_fraction * (1 - 0.02 * 3.4418),
                                                         rel=1e-4)
    assert slowest_speed(0.02, 2048) == pytest.approx(1 - 0.02 * expected_max_normal(2048), rel=1e-12)
    assert q.gpu_speed_spread == 0 and paced(q, 2048) == q  # applied once, not again
    assert q.memory_efficiency == p.memory_efficiency and q.kernel_launch_s == p.kernel_launch_s


@pytest.mark.parametrize("fidelity", ["full", "reduced"])
def test_a_step_with_a_spread_is_the_step_at_the_slowest_gpus_fraction(fidelity, tmp_path):
    # the closed form: a spread sigma on N GPUs is the same step as no spread at the
    # fraction times (1 - sigma e(N)); on one GPU it changes nothing
    spread, scaled, plain = tmp_path / "spread.json", tmp_path / "scaled.json", tmp_path / "plain.json"
    replace(H100, gpu_speed_spread=0.03).save(spread)
    H100.save(plain)
    replace(H100, sustained_compute_fraction=H100.sustained_compute_fraction * slowest_speed(0.03, 16)).save(scaled)
    shape = dict(num_layers=4, hidden_size=1024, num_attention_heads=16, vocab_size=32000, seq_length=1024)
    kw = dict(shape, tensor_model_parallel_size=2, pipeline_model_parallel_size=2, gpus=16, global_batch_size=32,
              micro_batch_size=1, fidelity=fidelity)
    a, b, c = (sim.run(**kw, gpu=g).iteration_time_s for g in (str(spread), str(scaled), str(plain)))
    assert a == pytest.approx(b, rel=1e-12) and a > c * 1.01  # (GEMMs 5.6% slower, a small model's step less)
    one = dict(shape, gpus=1, global_batch_size=2, micro_batch_size=1, fidelity=fidelity)
    assert sim.run(**one, gpu=str(spread)).iteration_time_s == sim.run(**one, gpu=str(plain)).iteration_time_s


def test_the_estimate_and_explain_price_the_same_pace():
    from sim.inputs.model import preset
    from sim.inputs.plan import ParallelPlan
    from sim.program.estimate import estimate
    from sim.results.explain import explain

    model = preset("llama2-7b")
    plan = ParallelPlan(dp=16, tp=2, pp=2, micro_batch_size=1, global_batch_size=64)
    p = replace(H100, gpu_speed_spread=0.03)
    q = replace(H100, sustained_compute_fraction=H100.sustained_compute_fraction * slowest_speed(0.03, 64))
    assert estimate(model, plan, p).time == pytest.approx(estimate(model, plan, q).time, rel=1e-12)
    assert estimate(model, plan, p).time["step"] > estimate(model, plan, H100).time["step"] * 1.02
    a, b = explain(model, plan, p), explain(model, plan, q)
    assert a["estimate"] == pytest.approx(b["estimate"], rel=1e-12)
    assert [r["time_s"] for r in a["parts"]["layer"]["rows"]] == \
        pytest.approx([r["time_s"] for r in b["parts"]["layer"]["rows"]], rel=1e-12)


@pytest.mark.parametrize("bad", [-0.01, 0.2, "x", float("nan")])
def test_a_bad_spread_is_a_one_line_error(bad, tmp_path, capsys):
    d = H100.to_dict()
    d["gpu_speed_spread"] = bad
    with pytest.raises(InputError, match=r"gpu_speed_spread: got .*; expected a fraction in \[0, 0.1\]"):
        HardwareProfile.from_dict(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    code = main(["run", "--gpu", str(path), "--model", "llama2-7b", "--gpus", "8", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "gpu_speed_spread" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_a_profile_without_the_field_has_no_spread():
    d = H100.to_dict()
    del d["gpu_speed_spread"]
    assert HardwareProfile.from_dict(d).gpu_speed_spread == 0.0


def test_explain_says_at_what_pace_it_prices_the_kernels():
    from sim.inputs.model import preset
    from sim.inputs.plan import ParallelPlan
    from sim.results.explain import explain, render

    model = preset("llama2-7b")
    plan = ParallelPlan(dp=16, tp=2, pp=2, micro_batch_size=1, global_batch_size=64)
    report = explain(model, plan, replace(H100, gpu_speed_spread=0.03))
    assert report["pace"] == {"gpus": 64, "gpu_speed_spread": 0.03, "slowest_speed": slowest_speed(0.03, 64)}
    speed = 1 - 0.03 * expected_max_normal(64)
    assert f"run at {speed:.3f} of the mean GPU's speed: the expected slowest of 64 GPUs" in render(report)
    assert "mean GPU's speed" not in render(explain(model, plan, H100))
