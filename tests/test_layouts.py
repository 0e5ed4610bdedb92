"""Layouts (issue 40 item 4): ``--layer-split`` for any layer count, with virtual stages;
``--layer-split auto`` over dense and MoE layers; Megatron-LM's
``--pipeline-model-parallel-layout``; DeepSeek-V3's multi-token prediction on the last stage."""

from dataclasses import replace

import pytest

from sim.cli import main
from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.layer_split import parse_layout
from sim.inputs.model import gpt, preset
from sim.inputs.plan import ParallelPlan
from sim.program.memory.states import stage_params_per_rank
from sim.program.stage_balance import auto_layer_split, balanced_split, layer_costs, stage_profiles, stage_time_s
from sim.program.ops import OP_KINDS
from sim.program.workload import LayerRun, chunk_work, head_work, layer_work

H100 = load_profile("h100-sxm")
MATMUL = ("gemm", "attention")


def model(layers: int, **kw):
    return gpt("m", layers, 512, 8, 8192, 512, **kw)


# ------------------------------------------------------------------ --layer-split
def test_61_layers_on_pp_8_given_per_rank_and_per_virtual_stage():
    m = model(61)
    plan = ParallelPlan(pp=8, layer_split=(8, 8, 8, 8, 8, 8, 8, 5))
    assert plan.stage_layers(m) == (8, 8, 8, 8, 8, 8, 8, 5)
    assert plan.layer_range(m, 7) == range(56, 61)
    # vpp 2, one entry per rank: each split over its 2 chunks, the earlier one more (7 -> 4, 3; 5 -> 3, 2)
    plan = ParallelPlan(pp=8, vpp=2, global_batch_size=8, layer_split=(8, 8, 8, 8, 8, 8, 7, 6))
    assert plan.stage_layers(m) == (4, 4, 4, 4, 4, 4, 4, 3) + (4, 4, 4, 4, 4, 4, 3, 3)
    # rank 6 holds virtual stages 6 and 14: layers 24..27 and 55..57
    assert plan.layer_range(m, 6) == range(24, 28) and plan.layer_range(m, 14) == range(55, 58)
    # one entry per virtual stage, as given
    per_vs = (4,) * 13 + (3, 3, 3)
    assert ParallelPlan(pp=8, vpp=2, global_batch_size=8, layer_split=per_vs).stage_layers(m) == per_vs


def _feasible(costs: list[float], extra: list[float], limit: float) -> bool:
    """Whether layers of these times fit in len(extra) contiguous stages of >= 1 layer,
    each within ``limit``: fill each stage as far as it goes (an independent check of the DP)."""
    i, n, k = 0, len(costs), len(extra)
    for s in range(k):
        t, took = extra[s], 0
        while i < n and n - i > k - s - 1 and t + costs[i] <= limit:
            t, i, took = t + costs[i], i + 1, took + 1
        if took == 0:
            return False
    return i == n


def test_auto_on_deepseek_v3_pp_8_is_the_least_slowest_stage():
    ds = preset("deepseek-v3")
    plan = ParallelPlan(dp=32, tp=2, pp=8, ep=64, etp=1, sequence_parallel=True, global_batch_size=4096,
                        zero_stage=1, layer_split="auto")
    plan.check_model(ds)  # 61 layers on pp 8: refused before issue 40 (divisibility)
    auto = auto_layer_split(ds, plan, H100)
    split = auto.layer_split
    assert len(split) == 8 and sum(split) == 61 and min(split) >= 1
    per_layer, emb, head = layer_costs(ds, plan, stage_profiles(plan, H100)[0][0])  # (as the job paces H100)
    assert per_layer[0] < per_layer[3] and per_layer[0] == per_layer[2] and per_layer[3] == per_layer[60]
    times = stage_time_s(split, ds, plan, stage_profiles(plan, H100))
    extra = [emb] + [0.0] * 6 + [head]
    assert _feasible(per_layer, extra, max(times) * (1 + 1e-12))
    assert not _feasible(per_layer, extra, max(times) * (1 - 1e-9))
    # the three dense layers are cheaper: the first stage takes more layers than the MoE-only middle ones
    assert split[0] > min(split[1:7])


def test_auto_is_optimal_by_brute_force_on_a_tiny_moe_model():
    import itertools

    m = gpt("moe", 9, 512, 8, 8192, 512, num_experts=4, moe_router_topk=2, moe_first_k_dense=3)
    plan = ParallelPlan(pp=3, global_batch_size=4, layer_split="auto")
    stages = stage_profiles(plan, H100)
    split = balanced_split(m, plan, stages)
    best = min(max(stage_time_s(c, m, plan, stages)) for c in itertools.product(range(1, 10), repeat=3)
               if sum(c) == 9)
    assert max(stage_time_s(split, m, plan, stages)) == pytest.approx(best, rel=1e-12)


def test_auto_with_virtual_stages_gives_one_count_per_virtual_stage():
    m = model(13)
    plan = ParallelPlan(pp=2, vpp=2, global_batch_size=4, layer_split="auto")
    assert plan.stage_layers(m) == (4, 3, 3, 3)  # as even as possible until balanced
    split = auto_layer_split(m, plan, H100).layer_split
    assert len(split) == 4 and sum(split) == 13 and min(split) >= 1
    # the last virtual stage carries the head: it never holds more layers than the others
    assert split[-1] <= min(split[:-1])


def test_auto_with_context_and_tensor_parallelism_prices_layers_as_the_estimate_does():
    # a dense layer under cp > 1 holds ring attention's exchanges (over cp, not tp): the split
    # once priced them as tensor-parallel collectives and refused their 'shift' (Llama 3 405B,
    # tp 8 x cp 2 x pp 8, issue 41 item 7)
    from sim.program.estimate import layer_phase_times

    m = model(7)
    plan = ParallelPlan(dp=2, tp=2, cp=2, pp=2, sequence_parallel=True, global_batch_size=4, layer_split="auto")
    split = auto_layer_split(m, plan, H100).layer_split
    assert len(split) == 2 and sum(split) == 7 and min(split) >= 1
    per_layer, _, _ = layer_costs(m, plan, H100)
    priced = sum(c + x for c, x in layer_phase_times(m, plan, H100, "nvlink", 8, "bf16", False).values())
    assert per_layer == [pytest.approx(priced, rel=1e-12)] * 7


# ------------------------------------------------------------------ layouts
def test_megatron_layout_strings_parse_as_megatron_does():
    # Megatron-LM's docstring example (pipeline_parallel_layer_layout.py)
    stages = parse_layout("Ettt|(tt|)*29,m|L")
    assert stages == ("Ettt",) + ("tt",) * 29 + ("m", "L")
    assert parse_layout("Et*3|t*4|t,t|ttL") == ("Ettt", "tttt", "tt", "ttL")
    assert parse_layout("(E|)*1t*2") == ("E", "tt")


def test_a_layout_sets_each_virtual_stage_and_vpp():
    ds = replace(preset("deepseek-v3"), mtp_num_layers=1)
    plan = ParallelPlan(pp=8, global_batch_size=16, pipeline_layout="Et*3|(t*4|)*14,t*2mL")
    assert plan.vpp == 2 and plan.schedule == "interleaved"
    assert plan.stage_layers(ds) == (3,) + (4,) * 14 + (2,)
    assert plan.layer_range(ds, 8) == range(31, 35)  # chunk 1 of rank 0
    # a stage may hold only the embedding or only the loss
    plan = ParallelPlan(pp=4, global_batch_size=4, pipeline_layout="E|ttt|ttt|L")
    assert plan.stage_layers(model(6)) == (0, 3, 3, 0)
    names = [w.name for w in chunk_work(model(6), plan, 0)]
    assert names == ["embedding"] and [w.name for w in chunk_work(model(6), plan, 3)] == ["head"]


TINY = ["--num-layers", "6", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "8192",
        "--seq-length", "512", "--gpu", "h100-sxm", "--global-batch-size", "8"]


@pytest.mark.parametrize("flags, needles", [
    (["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Ett|tttL"],
     ["--pipeline-model-parallel-layout", "has 5 transformer layers (t)", "num_layers 6"]),
    (["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "tEtt|tttL"],
     ["--pipeline-model-parallel-layout", "E (the embedding) must come first"]),
    (["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Ettt|ttLt"],
     ["--pipeline-model-parallel-layout", "L (the loss) must come last"]),
    (["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Et|tt|ttL"],
     ["--pipeline-model-parallel-layout", "has 3 stages", "multiple of pp = 2"]),
    (["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Ettt|tttL", "--layer-split", "3,3"],
     ["cannot be combined with", "--layer-split"]),
    (["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Ettt|tttL",
      "--decoder-first-pipeline-num-layers", "3"], ["cannot be combined with", "--decoder-first-pipeline-num-layers"]),
    (["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Ettt|tttxL"], ["'x'", "allowed: E"]),
    (["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Ettt|tttL", "--mtp-num-layers", "1"],
     ["has 0 MTP layers (m)", "mtp_num_layers 1"]),
    (["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Ettt|ttt|m|L", "--mtp-num-layers",
      "1"], ["m (MTP) layers must all be in the last stage"]),
    (["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Ettt|tttL",
      "--num-virtual-stages-per-pipeline-rank", "2"], ["vpp", "make vpp 1"]),
    (["--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2", "--layer-split", "3,2,1"],
     ["--layer-split", "has 3 entries", "one per virtual stage (pp x vpp = 4)"]),
    (["--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2", "--layer-split", "5,1"],
     ["--layer-split", "each entry must be >= 2"]),
    (["--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "2", "--layer-split", "auto"],
     ["--layer-split", "num_layers 6", "pp x vpp = 4 x 2"]),
    (["--pipeline-model-parallel-size", "2", "--mtp-num-layers", "-1"], ["--mtp-num-layers", "-1"]),
])
def test_bad_layouts_are_one_line_errors(flags, needles, capsys, tmp_path):
    gpus = ["--gpus", flags[1]]
    assert main(["estimate", *TINY, *gpus, *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("trainsim: error: "), err
    for n in needles:
        assert n in err, (n, err)


def test_even_split_refusal_names_the_new_ways_out():
    with pytest.raises(InputError, match="--layer-split N,N,...|auto, --pipeline-model-parallel-layout"):
        ParallelPlan(pp=8).check_model(model(61))


# ------------------------------------------------------------------ multi-token prediction
def test_mtp_adds_the_hand_counted_flops_and_params_on_the_last_stage():
    b, s, h, V = 1, 512, 512, 8192
    base, mtp = model(4), model(4, mtp_num_layers=1)
    plan = ParallelPlan(pp=2, global_batch_size=2)
    def flops(m, vs):
        return sum(w.flops(kinds=MATMUL) for w in chunk_work(m, plan, vs))
    assert flops(mtp, 0) == flops(base, 0)
    # one more transformer layer, the projection M (2h -> h) forward, dgrad and wgrad, one more output head
    n = b * s
    want = layer_work(base, LayerRun(b)).flops(kinds=MATMUL) + 3 * (2 * n * h * 2 * h) + head_work(base, b).flops(kinds=MATMUL)
    assert flops(mtp, 1) - flops(base, 1) == pytest.approx(want, rel=1e-12)
    assert head_work(base, b).flops(kinds=MATMUL) == 3 * 2 * n * V * h  # (logits forward, dgrad, wgrad)
    # parameters: the layer, 2h·h of projection, three LayerNorms (2h each); tied and shared embedding
    extra = base.params_per_layer + 2 * h * h + 3 * 2 * h
    assert mtp.mtp_params == extra and mtp.num_params == base.num_params
    assert stage_params_per_rank(mtp, plan, 1) - stage_params_per_rank(base, plan, 1) == extra
    assert stage_params_per_rank(mtp, plan, 0) == stage_params_per_rank(base, plan, 0)


def test_deepseek_v3_mtp_module_is_an_moe_layer_and_a_projection():
    ds = preset("deepseek-v3")
    assert ds.mtp_num_layers == 0  # flag-driven, as Megatron-LM (the HF config's num_nextn_predict_layers=1 aside)
    v3 = replace(ds, mtp_num_layers=1)
    # DeepSeek-V3: 14B of MTP weights with the shared embedding and head copies (2 x V·h = 1.85B)
    assert v3.mtp_params == v3.layer_params(61) + 2 * 7168 ** 2 + 3 * 7168
    assert 13.0e9 < v3.mtp_params + 2 * 129280 * 7168 < 14.5e9


def test_a_run_with_mtp_and_a_layout_simulates(capsys):
    flags = ["--gpus", "2", "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Et|tt|t|ttmL",
             "--mtp-num-layers", "1", "--json"]
    assert main(["run", *TINY, *flags]) == 0
    import json

    with_mtp = json.loads(capsys.readouterr().out)
    assert main(["run", *TINY, *flags[:5], "Et|tt|t|ttL", "--json"]) == 0
    without = json.loads(capsys.readouterr().out)
    assert with_mtp["plan"]["vpp"] == 2 and with_mtp["plan"]["pipeline_layout"] == "Et|tt|t|ttmL"
    assert with_mtp["iteration_time_s"] > without["iteration_time_s"]
