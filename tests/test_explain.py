"""``trainsim explain``: the kernel-by-kernel report is the simulator's own costs."""

import json

import pytest

from sim.cli import main
from sim.inputs.hardware import load_profile
from sim.inputs.model import preset
from sim.inputs.plan import ParallelPlan
from sim.inputs.pacing import paced
from sim.program.costs import work_times
from sim.program.workload import LayerRun, layer_work
from sim.results.explain import explain, render


@pytest.fixture(scope="module")
def report():
    model = preset("gpt3-175b")
    plan = ParallelPlan(dp=4, tp=8, pp=12, micro_batch_size=1, global_batch_size=1536, recompute="full")
    return model, plan, load_profile("a100-80gb"), explain(model, plan, load_profile("a100-80gb"))


def test_layer_totals_are_what_the_cost_model_charges(report):
    model, plan, profile, rep = report
    # work_times sums every op and tp collective of the layer per phase (the estimate's path)
    # (on the profile as a synchronous job of the plan's size runs it: its slowest GPU's pace)
    expected = work_times(layer_work(model, LayerRun(1, 8, False, "full")), paced(profile, plan.world_size), tp=8,
                          tp_link="nvlink")
    phases = rep["parts"]["layer"]["phases"]
    for ph in ("F", "B", "W"):
        compute = phases[ph]["compute_s"] + (phases["R"]["compute_s"] if ph == "B" else 0.0)
        comm = phases[ph]["tp_comm_s"] + (phases["R"]["tp_comm_s"] if ph == "B" else 0.0)
        assert compute == pytest.approx(expected[ph][0], rel=1e-12)
        assert comm == pytest.approx(expected[ph][1], rel=1e-12)


def test_gemm_rows_carry_their_closed_form_flops_and_recompute_repeats_forward(report):
    _, _, profile, rep = report
    rows = rep["parts"]["layer"]["rows"]
    gemms = [r for r in rows if r["kind"] == "gemm"]
    assert len([r for r in gemms if r["phase"] != "R"]) == 12  # 4 GEMMs each for forward, dgrad and wgrad
    for r in gemms:
        m, n, k = r["shape"]
        assert r["flops"] == 2 * m * n * k * r["batch"]
        assert r["flops_per_s"] <= profile.peak() * profile.gemm_max_efficiency
    # GPT-3 175B, tp 8: the QKV GEMM of one 2048-token sequence is 2048 x 3h/8 x h
    assert [2048, 3 * 12288 // 8, 12288] in [r["shape"] for r in gemms if r["name"] == "attn.qkv"]
    fwd = [(r["name"], r["time_s"]) for r in rows if r["phase"] == "F"]
    again = [(r["name"], r["time_s"]) for r in rows if r["phase"] == "R"]
    assert fwd == again


def test_render_names_every_kernel(report):
    *_, rep = report
    text = render(rep)
    for part in rep["parts"].values():
        for r in part["rows"]:
            assert r["name"] in text
    assert "per iteration" in text


def test_cli_json_and_bad_input(capsys):
    assert main(["explain", "--model", "llama2-7b", "--gpu", "h100-sxm", "--gpus", "8",
                 "--tensor-model-parallel-size", "2", "--global-batch-size", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["parts"]) == {"layer", "embedding", "head"} and out["tp_link"] == "nvlink"
    assert main(["explain", "--model", "llama2-7b", "--gpu", "h100-sxm", "--gpus", "8",
                 "--tensor-model-parallel-size", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "3" in err


def test_unfused_accumulation_is_in_the_layer_as_the_simulator_charges_it():
    # --no-gradient-accumulation-fusion: every weight gradient is followed by main_grad.add_ (10 B per local
    # weight: read the 16-bit gradient and the fp32 main gradient, write the main gradient)
    from sim.program.workload import plan_layer_work

    model, profile = preset("llama2-7b"), load_profile("h100-sxm")
    plan = ParallelPlan(dp=4, tp=2, pp=1, micro_batch_size=1, global_batch_size=8, sequence_parallel=True,
                        gradient_accumulation_fusion=False)
    rows = explain(model, plan, profile)["parts"]["layer"]["rows"]
    adds = [r for r in rows if r["name"].endswith(".accumulate")]
    wgrads = [r for r in rows if r["name"].endswith(".wgrad")]
    assert len(adds) == len(wgrads) == 4
    for a in adds:
        w = next(r for r in wgrads if r["name"] == a["name"].removesuffix(".accumulate"))
        m, n, k = w["shape"]
        assert a["bytes"] == 10 * m * n * w["batch"]
    from sim.inputs.pacing import paced

    # (explain prices the job's pace, as the simulator does: the slowest of its 8 GPUs)
    expected = work_times(plan_layer_work(model, plan), paced(profile, plan.world_size), tp=2, tp_link="nvlink")
    phases = explain(model, plan, profile)["parts"]["layer"]["phases"]
    assert phases["W"]["compute_s"] == pytest.approx(expected["W"][0], rel=1e-12)


def test_the_kernel_and_shape_columns_fit_their_longest_cells(report):
    *_, rep = report
    lines = render(rep).splitlines()
    rows = [r for part in rep["parts"].values() for r in part["rows"]]
    longest = max(rows, key=lambda r: len(r["name"]))
    line = next(x for x in lines if f" {longest['name']} " in x)  # the name is followed by a space, not cut
    assert line.split()[1] == longest["name"]
    for comm in (r for r in rows if r["kind"].endswith(" comm")):  # the collective's cell whole, link included
        assert any(f"{comm['collective']} " in x and f"over {comm['ranks']} ({comm['link']})" in x for x in lines)


def test_a_layer_pattern_shows_one_part_per_distinct_layer_with_its_count_and_time():
    # Nemotron-H's stack: Mamba-2, MLP and attention layers (54 + 54 + 10 = 118, the preset's
    # pattern); each part is that layer as the estimate and --layer-split auto price it
    from sim.program.estimate import layer_phase_times
    model = preset("nemotron-h-56b")
    plan = ParallelPlan(dp=1, tp=8, pp=2, micro_batch_size=1, global_batch_size=8)
    profile = load_profile("h100-sxm")
    rep = explain(model, plan, profile)
    kinds = [n for n, p in rep["parts"].items() if "layer_kind" in p]
    assert "layer" not in rep["parts"] and "moe layer" not in rep["parts"]
    assert [rep["parts"][n]["layer_kind"] for n in kinds] == [lay.describe() for lay in model.layer_kinds]
    assert [rep["parts"][n]["count"] for n in kinds] == [54, 54, 10]
    paced_profile = paced(profile, plan.world_size)
    for name, lay in zip(kinds, model.layer_kinds):
        expected = layer_phase_times(model, plan, paced_profile, "nvlink", 8, "bf16", False, lay)
        assert rep["parts"][name]["total_s"] == pytest.approx(sum(c + x for c, x in expected.values()), rel=1e-9)
    text = render(rep)
    assert "layer 1 of 3: mamba2(" in text and "(54 of the 118 layers)" in text
    assert "layer 3 of 3: attention (10 of the 118 layers)" in text
