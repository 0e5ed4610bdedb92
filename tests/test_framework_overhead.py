"""A framework's per-kernel overhead over Megatron-Core's (``sim.inputs.frameworks``,
``HardwareProfile.framework_kernel_overhead_s``) and its fit (``trainsim fit --params
framework_kernel_overhead_s.NAME``)."""

from dataclasses import replace

import pytest

import sim
from sim.calibrate.fit_runs import Simulations, fit_runs, fitted_profile, parameter, prepare_rows, start_value
from sim.calibrate.runs_csv import read_runs
from sim.errors import InputError
from sim.inputs.hardware import HardwareProfile, load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.program.build import job_profile
from sim.program.workload import PHASES, plan_edge_works, plan_layer_work
from sim.session import Job, simulate_training
from tests.test_fit_runs import COLUMNS, _write

H100 = load_profile("h100-sxm")
TINY = gpt("tiny", 3, 256, 4, 512, 256)  # 3 layers of width 256, vocabulary 512, 256 tokens
ONE_GPU = dict(dp=1, global_batch_size=1, attention_kernel="te")  # one micro-batch, nothing to overlap with


def _step_s(plan, profile):
    return simulate_training(Job(TINY, plan, profile, load_topology("dgx-h100"))).trace.end_s


def _kernels(plan) -> int:
    """Kernels of one step of TINY on one GPU, counted from its works: 3 layers, the embedding, the head."""
    layer = plan_layer_work(TINY, plan)
    embedding, head = plan_edge_works(TINY, plan)
    count = [sum(len(list(w.ops(p))) for p in PHASES) for w in (layer, embedding, head)]
    return 3 * count[0] + count[1] + count[2]


def test_a_frameworks_overhead_adds_its_kernels_times_the_cost_to_a_step():
    plan = ParallelPlan(framework="torchtitan", **ONE_GPU)
    k = _kernels(plan)
    assert k == 3 * 24 + 4 + 13  # per layer 24 kernels forward and backward; 4 of the embedding, 13 of the head
    cost = 7e-6
    base = _step_s(plan, H100)
    slowed = _step_s(plan, replace(H100, framework_kernel_overhead_s={"torchtitan": cost}))
    # one GPU, one micro-batch: the kernels run back to back, each 7 us longer
    assert slowed - base == pytest.approx(k * cost, rel=1e-9)
    # the same as the GPU's own per-kernel cost raised by it
    assert slowed == pytest.approx(_step_s(plan, replace(H100, kernel_launch_s=H100.kernel_launch_s + cost)),
                                   rel=1e-12)


def test_megatron_and_other_frameworks_do_not_pay_it():
    profile = replace(H100, framework_kernel_overhead_s={"torchtitan": 7e-6})
    for framework in (None, "megatron", "automodel"):
        plan = ParallelPlan(framework=framework, **ONE_GPU)
        assert _step_s(plan, profile) == _step_s(plan, H100)
        assert job_profile(profile, plan).kernel_launch_s == H100.kernel_launch_s


def test_job_profile_adds_it_once():
    plan = ParallelPlan(framework="llm-foundry", **ONE_GPU)
    profile = replace(H100, framework_kernel_overhead_s={"llm-foundry": 3e-6})
    once = job_profile(profile, plan)
    assert once.kernel_launch_s == pytest.approx(H100.kernel_launch_s + 3e-6, rel=1e-15)
    assert job_profile(once, plan) == once


@pytest.mark.parametrize("value, expected", [
    ({"megatron": 1e-6}, "framework_kernel_overhead_s: unknown key 'megatron'"),
    ({"torchtitan": 1e-3}, "framework_kernel_overhead_s.torchtitan: got 0.001; expected a number in [0, 2.5e-05]"),
])
def test_a_bad_overhead_in_a_profile_is_one_line(value, expected):
    d = {**H100.to_dict(), "framework_kernel_overhead_s": value}
    with pytest.raises(InputError) as exc:
        HardwareProfile.from_dict(d)
    assert expected in str(exc.value) and "\n" not in str(exc.value)


def test_a_preset_lists_none_and_the_fit_starts_at_zero():
    assert "framework_kernel_overhead_s" not in H100.to_dict()
    p = parameter("framework_kernel_overhead_s.torchtitan")
    assert (p.low, p.high, start_value(H100, p)) == (0.0, 25e-6, 0.0)
    with pytest.raises(InputError, match="allowed"):
        parameter("framework_kernel_overhead_s.megatron")


# ------------------------------------------------------------------ the fit
FW_COLUMNS = COLUMNS + ["framework", "zero"]
SHAPES = {  # two Megatron-Core groups and two torchtitan groups, one row each (8 A100s)
    "a": dict(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=1024, framework=""),
    "b": dict(num_layers=4, hidden_size=2048, num_attention_heads=16, seq_length=2048, framework=""),
    "c": dict(num_layers=4, hidden_size=1024, num_attention_heads=16, seq_length=2048, framework="torchtitan"),
    "d": dict(num_layers=6, hidden_size=1536, num_attention_heads=12, seq_length=1024, framework="torchtitan"),
}
TRUTH = {"sustained_compute_fraction": 0.8, "framework_kernel_overhead_s": {"torchtitan": 6e-6}}


def _rows(truth_profile):
    rows = []
    for name, s in SHAPES.items():
        shape = {k: v for k, v in s.items() if k != "framework"}
        fw = {"framework": s["framework"]} if s["framework"] else {}
        r = sim.run(**shape, vocab_size=32000, gpus=8, global_batch_size=16, zero=3, gpu=str(truth_profile),
                    fidelity="reduced", **fw)
        rows.append({"source": f"test {name}", "gpu": "a100-80gb", "precision": "bf16", "gpus": 8, **shape,
                     "vocab_size": 32000, "activation": "gelu", "tensor_model_parallel_size": 1,
                     "pipeline_model_parallel_size": 1, "sequence_parallel": "false", "global_batch_size": 16,
                     "needs": "", "framework": s["framework"], "zero": 3,
                     "measured_iteration_time_s": repr(r.iteration_time_s)})
    return rows


def test_only_the_frameworks_rows_see_its_overhead(tmp_path):
    truth = tmp_path / "truth.json"
    replace(load_profile("a100-80gb"), **TRUTH).save(truth)
    data = _write(tmp_path / "runs.csv", _rows(truth), FW_COLUMNS)
    runs = read_runs(data)
    params = [parameter("sustained_compute_fraction"), parameter("framework_kernel_overhead_s.torchtitan")]
    sims = Simulations(load_profile("a100-80gb"), params, prepare_rows(runs, "a100-80gb"))
    x = (0.8, 6e-6)
    assert [sims.seen(i, x) for i in range(4)] == [(0.8, 0.0), (0.8, 0.0), x, x]
    assert sims.sensitive([0, 1], x) == [True, False] and sims.sensitive([2], x) == [True, True]

    report = fit_runs(data, "a100-80gb", ["sustained_compute_fraction", "framework_kernel_overhead_s.torchtitan"])
    fitted = {p["name"]: p["fitted"] for p in report["parameters"]}
    assert fitted["sustained_compute_fraction"] == pytest.approx(0.8, rel=0.01)
    assert fitted["framework_kernel_overhead_s.torchtitan"] == pytest.approx(6e-6, rel=0.05)
    assert report["mean_abs_error"] < 0.002 and report["initial_mean_abs_error"] > 0.05
    by_id = {g["id"]: g for g in report["groups"]}
    assert [by_id[f"g{k}"]["framework"] for k in (1, 2, 3, 4)] == ["megatron", "megatron", "torchtitan", "torchtitan"]
    saved = tmp_path / "fitted.json"
    fitted_profile(load_profile("a100-80gb"), report, "2026-12-06").save(saved)
    again = load_profile(saved)
    assert again.framework_kernel_overhead_s == {"torchtitan": fitted["framework_kernel_overhead_s.torchtitan"]}
    assert "leave-one-group-out" in again.sources["framework_kernel_overhead_s.torchtitan"]
    # each torchtitan group held out is predicted by the other's overhead: the data are the model's, so within 1%
    assert all(abs(r["held_out_error"]) < 0.01 for r in report["rows"])
