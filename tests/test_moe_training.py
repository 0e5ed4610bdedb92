"""Expert parallelism in a simulated iteration: the MoE layer's work against hand-computed
shapes, all-to-all bytes against their closed form, expert gradients on their own group,
expert states sharded over it, fidelity agreement and the routing report."""

import json

import pytest

from sim.inputs.experts import Folding
from sim.inputs.model import layer_param_split, llama
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.program.memory.states import stage_model_states, stage_param_split
from sim.program.training import build_program
from sim.program.workload import LayerRun, chunk_work, layer_work
from sim.program.workload_moe import MoeShape
from sim.inputs.hardware import load_profile
from sim.inputs.schema import SimulationSettings
from sim.session import Job, simulate_training

TINY = llama("tiny-moe", 4, 512, 8, 8, 1024, 2000, 256, num_experts=4, moe_router_topk=2,
             moe_ffn_hidden_size=512)


def _item(work, name):
    return next(i for i in work.items if i.name == name)


def test_balanced_dispatch_carries_every_routed_token_copy():
    # T = 256 tokens, k = 2: 512 copies of h = 512 in bf16 leave each rank's send buffer;
    # nccl-tests' all-to-all size is that buffer, of which (ep-1)/ep crosses links.
    w = layer_work(TINY, LayerRun(1), moe=MoeShape(ep=4, etp=1, load=256 * 2))
    for name in ("moe.dispatch", "moe.combine", "moe.dispatch.grad", "moe.combine.grad"):
        c = _item(w, name)
        assert (c.collective, c.group, c.nbytes) == ("all_to_all", "ep", 256 * 2 * 512 * 2)
    up = _item(w, "moe.experts.up")
    assert up.shape == (512, 2 * 512, 512) and up.batch == 1      # 4/4 = 1 local expert, all 512 copies
    assert not any(i.name.startswith("moe.dispatch") for i in layer_work(TINY, LayerRun(1), moe=MoeShape(1, 1, 512)).items)


def test_moe_layer_flops_are_the_active_parameters():
    # forward GEMM FLOPs per token: 2 x (attention weights + k experts + router), plus attention's s-terms
    w = layer_work(TINY, LayerRun(1), moe=MoeShape(1, 1, 256 * 2))
    gemm_f = sum(o.flops for o in w.ops("F") if o.kind == "gemm")
    h, f, E, k, s = 512, 512, 4, 2, 256
    weights = 4 * h * h + k * 3 * h * f + h * E
    assert gemm_f == pytest.approx(2 * s * weights)


def test_an_uneven_histogram_gives_the_busiest_rank_its_tokens(tmp_path):
    hist = tmp_path / "router.json"
    hist.write_text(json.dumps([1, 1, 2, 4]))         # experts 0-1 on rank 0, 2-3 on rank 1
    plan = ParallelPlan(dp=2, ep=2, moe_routing=str(hist))
    from sim.program.routing import Routing

    works = chunk_work(TINY, plan, 0, mb=0, routing=Routing(TINY, plan))
    layer = works[1]
    # 2 ranks x 256 tokens x top-2 = 1024 copies: experts get 128, 128, 256, 512 (512: every token);
    # rank 1 receives 768, which every rank of the group waits for
    assert _item(layer, "moe.dispatch").nbytes == 768 * 512 * 2
    assert _item(layer, "moe.experts.up").shape == (384, 1024, 512) and _item(layer, "moe.experts.up").batch == 2


def _run(plan, model=TINY, fidelity="full"):
    topo = load_topology("dgx-a100", nodes=max(1, plan.world_size // 8))
    return simulate_training(Job(model, plan, load_profile("a100-80gb"), topo), SimulationSettings(fidelity=fidelity))


def test_all_to_all_bytes_on_the_wire_match_the_closed_form():
    plan = ParallelPlan(dp=4, ep=4, global_batch_size=4)
    run = _run(plan)
    sent = sum(t.nbytes for t in run.trace.transfers if t.src == 0 and "alltoall" in t.label)
    per = 256 * 2 * 512 * 2 * 3 / 4                      # T·k·h·bytes·(ep-1)/ep
    assert sent == pytest.approx(4 * 4 * per)             # 4 MoE layers x (2 forward + 2 backward)


def test_expert_gradients_sync_over_the_expert_data_parallel_group():
    plan = ParallelPlan(dp=4, ep=2, global_batch_size=8)
    _, prog = build_program(TINY, plan, load_profile("a100-80gb"))
    f = Folding(plan)
    expert = [a for a in prog.actions[0] if a.name.startswith("expert grad bucket")]
    dense = [a for a in prog.actions[0] if a.name.startswith("grad bucket")]
    assert expert and {a.group for a in expert} == {f.edp_group(0)} == {(0, 2)}
    assert {a.group for a in dense} == {plan.dp_group(0)}
    per_layer = [2 * layer_param_split(TINY, i, 1, 2, 1)[1] for i in range(4)]
    assert sum(a.nbytes for a in expert) == pytest.approx(sum(per_layer))


def test_expert_states_are_sharded_over_their_own_group():
    plan = ParallelPlan(dp=8, ep=4, zero_stage=1)
    dense, experts = stage_param_split(TINY, plan, 0)
    st = stage_model_states(TINY, plan, 0)
    assert st.optimizer_bytes == pytest.approx(12 * dense / 8 + 12 * experts / 2)   # edp = 8 / 4
    assert st.params_bytes == pytest.approx(2 * (dense + experts))


def test_full_and_reduced_fidelity_agree_and_imbalance_costs_time():
    plan = ParallelPlan(dp=8, ep=4, global_batch_size=16)
    full = _run(plan).trace.end_s
    reduced = _run(plan, fidelity="reduced").trace.end_s
    assert reduced == pytest.approx(full, rel=0.01)
    skewed = _run(ParallelPlan(dp=8, ep=4, global_batch_size=16, moe_routing="zipf:1.5")).trace.end_s
    assert skewed > full


def test_run_reports_active_params_and_the_routing(tmp_path):
    from sim.api import run

    r = run(model="mixtral-8x7b", gpu="h100-sxm", gpus=16, expert_model_parallel_size=8,
            global_batch_size=16, seq_length=1024, moe_routing="dirichlet:2")
    s = r.summary
    assert s["params"] == pytest.approx(46.7e9, rel=0.01) and s["active_params"] == pytest.approx(12.9e9, rel=0.01)
    moe = s["moe"]
    assert moe["ep"] == 8 and moe["imbalance_max"] >= moe["imbalance_mean"] > 1
    assert moe["imbalance_cost_s"] == pytest.approx(s["iteration_time_s"] - moe["balanced_iteration_time_s"])


def test_moe_layer_activations_count_every_routed_copy():
    from sim.program.memory.activations import Storing, activation_bytes_per_layer, activation_terms

    dense = activation_terms(TINY, Storing.of(1))
    moe = activation_terms(TINY, Storing.of(1, experts=(2, 1)))
    T, k, h, f, E = 256, 2, 512, 512, 4
    R = T * k
    by_hand = 4 * T * E + 2 * R * h + 2 * R * f + 2 * R * h + 2 * 2 * R * f   # probs, up in, down in, out, gate+up
    mlp = {k_: v for k_, v in dense.items() if k_.startswith("mlp.") and k_ not in ("mlp.norm.input",
                                                                                    "mlp.dropout_mask")}
    assert sum(moe.values()) == pytest.approx(sum(dense.values()) - sum(mlp.values()) + by_hand)
    from sim.program.memory import chunk_activation_bytes, embedding_activation_bytes, head_activation_bytes

    per = activation_bytes_per_layer(TINY, Storing.of(1, experts=(2, 1)))
    stored = chunk_activation_bytes(TINY, ParallelPlan(dp=2, ep=2), 0)   # one stage: the 4 MoE layers, both ends
    assert stored == pytest.approx(4 * per + embedding_activation_bytes(TINY, 1) + head_activation_bytes(TINY, 1))


@pytest.mark.parametrize("routing", ["balanced", "zipf:1.5"])
def test_full_and_reduced_fidelity_agree_when_expert_parallelism_spans_nodes(routing):
    # ep 16 (etp 1) over four DGX A100 nodes (NICs shared by GPU pairs), tp 2, pp 2:
    # reduced fidelity simulates one GPU per stage, its expert-parallel peers shadows whose
    # sends still load the links of each all-to-all (one bundle of all 240 sends).
    # Every rank of a group is given the busiest one's work, so skewed routing keeps them alike.
    model = llama("moe-16", 4, 512, 8, 8, 1024, 2000, 256, num_experts=16, moe_router_topk=2,
                  moe_ffn_hidden_size=512)
    plan = ParallelPlan(dp=8, tp=2, ep=16, etp=1, pp=2, global_batch_size=32, sequence_parallel=True,
                        moe_routing=routing)
    topo = load_topology("dgx-a100", nodes=4)
    job = Job(model, plan, load_profile("a100-80gb"), topo)
    full, reduced = (simulate_training(job, SimulationSettings(fidelity=f)) for f in ("full", "reduced"))
    assert len(reduced.program.actions) == plan.pp < len(full.program.actions) == plan.world_size
    assert reduced.trace.end_s == pytest.approx(full.trace.end_s, rel=0.01)


def test_zero3_with_experts_simulates_alike_at_full_and_reduced_fidelity():
    # FSDP2 with EP: dense weights gathered over dp 8, experts over edp 2 (ep 4)
    plan = ParallelPlan(dp=8, ep=4, global_batch_size=16, zero_stage=3)
    full = _run(plan)
    reduced = _run(plan, fidelity="reduced")
    assert reduced.trace.end_s == pytest.approx(full.trace.end_s, rel=0.01)
    edp = Folding(plan).edp_group(0)
    gathers = {a.group for a in build_program(TINY, plan, load_profile("a100-80gb"))[1].actions[0]
               if a.name.startswith("gather experts of layer")}
    assert gathers == {edp} and len(edp) == 2
    # sharding the states costs the gathers' time: ZeRO-3 is slower than ZeRO-1 here
    assert full.trace.end_s > _run(ParallelPlan(dp=8, ep=4, global_batch_size=16, zero_stage=1)).trace.end_s


def test_gpt_oss_clamp_and_expert_bias_by_hand():
    # GPT-OSS's experts (Megatron-Core TEGroupedMLP at Megatron-LM cba6b0ed): the activation's
    # clamp runs as chunk + two clamps + cat, and fc2's bias is added per local expert as
    # t + b * p with FP32 router probabilities, then cat and cast back (_apply_bias).
    from dataclasses import replace

    oss = replace(TINY, activation_clamp=7.0, moe_expert_bias=True)
    shape = MoeShape(ep=2, etp=1, load=256 * 2)        # 4 experts over 2 ranks: 2 local, 512 copies
    w, plain = layer_work(oss, LayerRun(1), moe=shape), layer_work(TINY, LayerRun(1), moe=shape)
    n, f, h, local = 512, 512, 512, 2
    nf, N = n * f, n * h                               # 262144 elements each (f = h = 512 here)
    clamp, clamp_g = _item(w, "moe.experts.clamp"), _item(w, "moe.experts.clamp.grad")
    # forward: clamp(gate) and clamp(linear) read and write n·f bf16 each, cat 2n·f: 4 n·f·2 bytes each way
    assert (clamp.bytes_read, clamp.bytes_written, clamp.kernels) == (8 * nf, 8 * nf, 3) == (2097152, 2097152, 3)
    # backward: two clamp gradients read (grad, input) and write n·f; chunk's backward cats 2n·f
    assert (clamp_g.bytes_read, clamp_g.bytes_written, clamp_g.kernels) == (2 * 6 * nf, 2 * 4 * nf, 3)
    bias, bias_g = _item(w, "moe.experts.down.bias"), _item(w, "moe.experts.down.bias.grad")
    # forward per element: b*p writes 4; add reads 2 + 4, writes 4; cat reads 4, writes 4; .to reads 4,
    # writes 2: read 14, written 14 bytes, plus the n FP32 probabilities; 2 kernels per expert + cat + cast
    assert (bias.bytes_read, bias.bytes_written, bias.kernels) == (14 * N + 4 * n, 14 * N, 2 * local + 2)
    # backward per element: .to's 2 -> 4; cast 4 -> 2; two multiplies 4 -> 4 and two sums reading 4;
    # split's cat 2 -> 2: read 2 + 4·5 + 2 = 24, written 4 + 2 + 8 + 2 = 16; 5 kernels per expert + 2
    assert (bias_g.bytes_read, bias_g.bytes_written, bias_g.kernels) == (24 * N, 16 * N, 5 * local + 2)
    names = [i.name for i in w.items]
    assert names.index("moe.experts.clamp") < names.index("moe.experts.swiglu") < names.index("moe.experts.down") \
        < names.index("moe.experts.down.bias")
    assert names.index("moe.experts.down.bias.grad") < names.index("moe.experts.down.dgrad") \
        < names.index("moe.experts.swiglu.grad") < names.index("moe.experts.clamp.grad")
    # every other kernel is the plain model's
    extra = {"moe.experts.clamp", "moe.experts.clamp.grad", "moe.experts.down.bias", "moe.experts.down.bias.grad"}
    assert [i for i in w.items if i.name not in extra] == list(plain.items)
    # stored for backward: the clamped copy, 2n·f bf16, that the fused activation saves (the clamps keep
    # the up projection's output, stored already)
    from sim.program.memory.activations import moe_terms

    a, b = moe_terms(oss, 1, 1, False, (2, 1)), moe_terms(TINY, 1, 1, False, (2, 1))
    assert {k: v for k, v in a.items() if b.get(k) != v} == {"moe.experts.clamped": 2 * 2 * nf}
