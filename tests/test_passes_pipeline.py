"""Program building's passes one at a time (``sim.program.training``): each test runs the
pipeline up to a pass, then that pass alone on a tiny plan, and checks what it added
against a hand count or closed form."""

from dataclasses import replace

import pytest

from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt, llama
from sim.inputs.pacing import slowest_speed
from sim.inputs.plan import ParallelPlan
from sim.program import training
from sim.program.build import BuildContext
from sim.program.costs import optimizer_step_time
from sim.program.memory import layer_param_bytes, stage_resident_bytes
from sim.program.schedules import build_schedule
from sim.program.training import PASSES, Draft, build, build_program, run_passes

H100 = load_profile("h100-sxm")
H = 256
TWO = gpt("two", 2, H, 4, 1024, 128)  # 2 GPT layers, h = 256, biases, LayerNorm
LAYER_BYTES_TP2 = 2 * ((12 * H * H + 7 * H) / 2 + 6 * H)
"""A GPT layer's 16-bit weights on one of 2 tensor-parallel ranks: QKV, projection and MLP
weights (12h²) with the QKV and first MLP biases (3h + 4h) split in two; the projection's
and second MLP's biases and both LayerNorms (h + h + 4h) whole."""


def _ctx(fidelity="full", **plan):
    plan = ParallelPlan(**{"global_batch_size": 4, **plan})
    return BuildContext.create(TWO, plan, H100, fidelity=fidelity)


def _around(ctx, name):
    """The draft before pass ``name`` and after it."""
    before = run_passes(ctx, stop=name)
    return before, dict(training.PIPELINE)[name](ctx, before)


def _added(before, after, rank):
    old = {a.name for a in before.program.actions[rank]}
    return [a for a in after.program.actions[rank] if a.name not in old]


def test_the_pipeline_is_these_passes_in_this_order():
    assert PASSES == ("limits", "schedule", "stages", "layers", "ep_overlap", "fp8_amax", "p2p", "grad_sync",
                      "zero3_gather", "process_group_streams", "optimizer", "offload", "param_gather", "memory",
                      "activation_offload", "expand")
    with pytest.raises(InputError, match=r"^pass: got 'zero'; allowed: limits, schedule"):
        run_passes(_ctx(), stop="zero")


def test_build_program_is_the_passes_on_the_context():
    ctx = _ctx(dp=2, pp=2, zero_stage=1)
    sched, prog = build(ctx)
    sched2, prog2 = build_program(TWO, ctx.plan, H100)
    assert sched == sched2 and prog.actions == prog2.actions and prog.shadows == prog2.shadows


def test_the_context_paces_the_profile_once():
    spread = replace(H100, gpu_speed_spread=0.02)  # a spread to pace by (the preset's fitted one may be 0)
    ctx = BuildContext.create(TWO, ParallelPlan(dp=8, global_batch_size=8), spread, fidelity="full")
    assert ctx.profile.sustained_compute_fraction == spread.sustained_compute_fraction * slowest_speed(0.02, 8)
    assert ctx.profile.gpu_speed_spread == 0.0
    again = BuildContext.create(TWO, ctx.plan, ctx.profile)  # pacing a paced profile changes nothing
    assert again.profile == ctx.profile
    one = BuildContext.create(TWO, ParallelPlan(dp=1, global_batch_size=4), spread, fidelity="full")
    assert one.profile == spread  # one GPU: nothing to wait for
    other = replace(load_profile("a100-80gb"), gpu_speed_spread=0.03)  # a mixed cluster's other GPU type
    assert ctx.on(other).profile.sustained_compute_fraction == other.sustained_compute_fraction * slowest_speed(
        0.03, 8)
    assert ctx.on(other).plan is ctx.plan
    with pytest.raises(InputError, match=r"^fidelity: got 'high'; allowed: full, reduced$"):
        _ctx(fidelity="high")


def test_limits_refuses_before_anything_is_built():
    ctx = replace(_ctx(dp=2), max_events=10)
    with pytest.raises(InputError, match=r"^plan: this simulation would process about"):
        run_passes(ctx)
    assert training.limits(_ctx(dp=2), Draft()) == Draft()


def test_schedule_gives_one_compute_action_per_step():
    ctx = _ctx(pp=2)  # 1F1B, 4 micro-batches
    draft = run_passes(ctx, stop="stages")
    assert draft.schedule == build_schedule("1f1b", 2, 4)
    for r in (0, 1):
        assert [a.name for a in draft.program.actions[r]] == [str(s) for s in draft.schedule.ranks[r]]
        assert len(draft.program.actions[r]) == 2 * 4  # F and B of each micro-batch
    other = build_schedule("gpipe", 2, 2)
    with pytest.raises(InputError, match=r"^schedule gpipe: has pp=2, vpp=1, m=2; the plan needs pp=2, vpp=1, m=4$"):
        run_passes(replace(ctx, schedule=other))


def test_stages_keeps_one_template_gpu_per_pipeline_stage():
    ctx = _ctx(dp=2, tp=2, pp=2, global_batch_size=4)
    _, after = _around(ctx, "stages")
    plan = ctx.plan
    assert set(after.program.actions) == {plan.rank(dp=0, pp=0, tp=0), plan.rank(dp=0, pp=1, tp=0)}


def test_layers_cut_each_step_into_layers_with_two_tp_all_reduces_per_layer():
    ctx = _ctx(tp=2)  # Megatron TP without SP: one all-reduce after attention, one after the MLP
    before, after = _around(ctx, "layers")
    acts = after.program.actions[0]
    fwd = [a for a in acts if a.name.startswith("0F0")]
    reduces = [a for a in fwd if a.kind == "collective"]
    per_layer = {lid: sum(1 for a in reduces if a.layer == lid) for lid in (0, 1)}
    assert per_layer == {0: 2, 1: 2}
    assert all(a.group == ctx.plan.tp_group(0) and a.op == "allreduce" for a in reduces)
    # cutting keeps the step's name on its last piece, so the schedule's deps still hold
    assert [a.name for a in before.program.actions[0]] == [a.name for a in acts if "." not in a.name]
    # no tensor parallelism: no collectives
    _, plain = _around(_ctx(), "layers")
    assert not any(a.kind == "collective" for a in plain.program.actions[0])


def test_ep_overlap_moves_the_paired_all_to_alls_and_adds_nothing():
    from sim.program.ep_overlap import EP_STREAM

    before, after = _around(_ctx(), "ep_overlap")
    assert after is before                                                              # off: nothing to do
    moe = llama("two-moe", 2, H, 4, 4, 1024, 128, 128, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=H)
    plan = ParallelPlan(dp=4, ep=4, global_batch_size=12, overlap_moe_expert_parallel_comm=True)
    before, after = _around(BuildContext.create(moe, plan, H100), "ep_overlap")
    old, new = before.program.actions[0], after.program.actions[0]
    assert sorted(a.name for a in old) == sorted(a.name for a in new)                 # the same pieces
    # 3 micro-batches: F0, (F1, B0), (F2, B1), B2; 2 MoE layers x (2 forward + 2 backward) all-to-alls per pair
    moved = [a for a in new if a.stream == EP_STREAM]
    assert len(moved) == 2 * 2 * 4 and all(a.op == "alltoall" for a in moved)
    assert {a.name.split(".")[0] for a in moved} == {"0F1", "0B0", "0F2", "0B1"}


def test_fp8_amax_adds_a_reduction_after_each_forward_and_backward_only_in_fp8():
    before, after = _around(_ctx(dp=2), "fp8_amax")
    assert after is before  # BF16: nothing to add
    ctx = _ctx(dp=2, fp8_format="hybrid")
    before, after = _around(ctx, "fp8_amax")
    added = [a for a in after.program.actions[0] if a.category == "amax"]
    m = ctx.plan.num_microbatches
    assert len(added) == 2 * m and all(a.op == "allreduce" and a.group == (0, 1) for a in added)
    # 4 FP8 GEMMs a layer, 2 layers; fp32 maxima: 3 per GEMM forward, 2 backward
    assert sorted(a.nbytes for a in added) == [2 * 4 * 8] * m + [3 * 4 * 8] * m
    # each takes its step's name, so what waited for the step waits for the reduction
    steps = [a.name for a in before.program.actions[0] if "." not in a.name]
    assert [a.name for a in added] == steps


def test_p2p_sends_one_micro_batchs_activations_per_stage_boundary():
    ctx = _ctx(pp=2)
    before, after = _around(ctx, "p2p")
    m, act = ctx.plan.num_microbatches, 1 * 128 * H * 2  # b·s·h 16-bit values
    sends = {r: [a for a in _added(before, after, r) if a.kind == "send"] for r in (0, 1)}
    assert len(sends[0]) == m and len(sends[1]) == m  # activations forward, their gradients back
    assert all(a.nbytes == act for r in (0, 1) for a in sends[r])
    assert {a.peer for a in sends[0]} == {1} and {a.peer for a in sends[1]} == {0}


@pytest.mark.parametrize("zero, op, per_microbatch", [(0, "allreduce", False), (1, "reducescatter", False),
                                                      (2, "reducescatter", True)])
def test_grad_sync_moves_every_gradient_byte_once_per_sync(zero, op, per_microbatch):
    ctx = _ctx(dp=2, tp=2, zero_stage=zero)
    before, after = _around(ctx, "grad_sync")
    syncs = [a for a in _added(before, after, 0) if a.kind == "collective"]
    grads = sum(layer_param_bytes(TWO, 2, lid) for lid in (-1, 0, 1, 2))
    assert layer_param_bytes(TWO, 2, 0) == LAYER_BYTES_TP2
    times = ctx.plan.num_microbatches if per_microbatch else 1
    assert {a.op for a in syncs} == {op} and all(a.group == (0, 2) for a in syncs)
    assert sum(a.nbytes for a in syncs) == times * grads


def test_zero3_gathers_each_layer_before_each_use_and_nothing_else():
    ctx = _ctx(dp=2, tp=2, zero_stage=3)  # 2 micro-batches per rank
    before, after = _around(ctx, "zero3_gather")
    added = _added(before, after, 0)
    m, uses = ctx.plan.num_microbatches, (-1, 0, 1, 2)  # embedding, two layers, head
    assert len(added) == m * 2 * len(uses)  # forward and backward of each micro-batch
    assert all(a.op == "allgather" and a.group == (0, 2) and a.stream == "zero" for a in added)
    gathered = {lid: [a.nbytes for a in added if a.name.startswith(f"gather layer {lid} ")] for lid in uses}
    assert gathered[0] == gathered[1] == [LAYER_BYTES_TP2] * (2 * m)
    assert all(v == [layer_param_bytes(TWO, 2, lid)] * (2 * m) for lid, v in gathered.items())
    # (its reduce-scatters are grad_sync's: every micro-batch, as ZeRO-2's)
    before, after = _around(_ctx(dp=2, tp=2, zero_stage=2), "zero3_gather")
    assert after is before


MOE = llama("two-moe", 2, H, 4, 4, 512, 1024, 128, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=H)
"""2 MoE layers of 4 experts (h = f = 256, SwiGLU, no biases, RMSNorm, untied), for ZeRO-3 with EP."""


def test_zero3_with_experts_gathers_dense_over_dp_and_experts_over_edp():
    # dp 4, ep 2: each rank holds 2 of the 4 experts, shared with the one rank of the other
    # ep group at its ep index (edp = 4 / 2 = 2, ranks {0, 2}); the dense weights over all 4
    plan = ParallelPlan(dp=4, ep=2, global_batch_size=8, zero_stage=3)   # 2 micro-batches per rank
    ctx = BuildContext.create(MOE, plan, H100)
    before, after = _around(ctx, "zero3_gather")
    added = _added(before, after, 0)
    m = plan.num_microbatches
    experts = 2 * 2 * 3 * H * H                       # 16-bit, 2 local experts of 3 h x f matrices
    dense = 2 * (4 * H * H + 2 * H + H * 4)           # q, k, v, o; two RMSNorms; the router (h x E)
    ends = {-1: 2 * 1024 * H, 2: 2 * (H + 1024 * H)}  # embedding; final norm and the untied output layer
    assert all(a.op == "allgather" and a.stream == "zero" for a in added)
    dense_g = [a for a in added if a.name.startswith("gather layer ")]
    expert_g = [a for a in added if a.name.startswith("gather experts of layer ")]
    assert {a.group for a in dense_g} == {(0, 1, 2, 3)} and {a.group for a in expert_g} == {(0, 2)}
    # every use (forward and backward of each micro-batch) gathers what it computes with
    assert sorted(a.nbytes for a in expert_g) == [experts] * (2 * 2 * m)
    assert sum(a.nbytes for a in dense_g) == 2 * m * (2 * dense + ends[-1] + ends[2])
    # a layer's experts are gathered right after its dense weights, both before its compute
    acts = [a.name for a in after.program.actions[0]]
    i = acts.index("gather layer 0 for 0F0")
    assert acts[i + 1] == "gather experts of layer 0 for 0F0" and acts[i + 2].startswith("0F0")
    # the gradients: reduce-scattered every micro-batch (grad_sync), the experts' over edp
    before, after = _around(ctx, "grad_sync")
    syncs = [a for a in _added(before, after, 0) if a.kind == "collective"]
    assert {a.op for a in syncs} == {"reducescatter"}
    assert sum(a.nbytes for a in syncs if a.group == (0, 2)) == m * 2 * experts
    assert sum(a.nbytes for a in syncs if a.group == (0, 1, 2, 3)) == m * (2 * dense + ends[-1] + ends[2])


def test_zero3_with_experts_keeps_16_bytes_per_parameter_sharded_per_group():
    # resident model states: 16 Ψ_dense / N_dp + 16 Ψ_expert / N_edp (ZeRO-3 per group)
    plan = ParallelPlan(dp=4, ep=2, global_batch_size=8, zero_stage=3)
    ctx = BuildContext.create(MOE, plan, H100)
    before, after = _around(ctx, "memory")
    (resident,) = _added(before, after, 0)
    psi_e = 2 * 2 * 3 * H * H                        # 2 layers x 2 local experts x 3 h x f
    psi_d = 2 * (4 * H * H + 2 * H + 4 * H) + 1024 * H + H + 1024 * H
    got = {k: v for _, k, v in resident.mem}
    assert got["parameters"] + got["gradients"] + got["optimizer"] == pytest.approx(16 * psi_d / 4 + 16 * psi_e / 2)
    assert got["parameters"] == pytest.approx(2 * psi_d / 4 + 2 * psi_e / 2)
    # the estimate's gathered layer: the MoE layer's dense weights and its rank's experts;
    # with ep = dp (edp 1) the experts stay whole on their rank and only the dense ones are gathered
    from sim.program.memory.rank import zero3_layer_gather_params

    dense_layer = 4 * H * H + 2 * H + 4 * H
    assert zero3_layer_gather_params(MOE, plan) == dense_layer + 2 * 3 * H * H
    assert zero3_layer_gather_params(MOE, ParallelPlan(dp=4, ep=4, zero_stage=3)) == dense_layer


def test_optimizer_steps_on_the_gpu_or_offloads():
    ctx = _ctx(dp=2, zero_stage=1)
    before, after = _around(ctx, "optimizer")
    (step,) = _added(before, after, 0)
    params = TWO.num_params
    assert step.name == "optimizer" and step.duration_s == optimizer_step_time(params / 2, ctx.profile)
    before, after = _around(ctx, "offload")
    assert after is before
    off = _ctx(dp=2, zero_stage=1, offload_optimizer=True)
    before, after = _around(off, "optimizer")
    assert after is before
    before, after = _around(off, "offload")
    copies = [a for a in _added(before, after, 0) if a.kind == "copy"]
    assert {a.op for a in copies} == {"d2h", "h2d"}
    assert any(a.name == "params to GPU" for a in after.program.actions[0])


@pytest.mark.parametrize("fp8", [False, True])
def test_param_gather_gathers_the_updated_parameters_once(fp8):
    kw = dict(fp8_format="hybrid", fp8_param_gather=True) if fp8 else {}
    ctx = _ctx(dp=2, zero_stage=1, **kw)
    before, after = _around(ctx, "param_gather")
    gathers = [a for a in _added(before, after, 0) if a.op == "allgather"]
    assert gathers and all(a.group == (0, 1) for a in gathers)
    # FP8 weights of the two layers' GEMMs (12h² of them) travel in 1 byte instead of 2
    saved = 2 * 12 * H * H if fp8 else 0
    assert sum(a.nbytes for a in gathers) == 2 * TWO.num_params - saved
    before, after = _around(_ctx(dp=2, zero_stage=3), "param_gather")
    assert after is before


def test_memory_puts_the_resident_states_and_each_micro_batchs_activations_layer_by_layer():
    ctx = _ctx(pp=2)
    before, after = _around(ctx, "memory")
    for r in (0, 1):
        (resident,) = _added(before, after, r)  # the rest ride on the actions already there
        states = stage_resident_bytes(TWO, ctx.plan, r, H100.memory_reserve_bytes)
        assert sorted(resident.mem) == sorted(("start", k, v) for k, v in states.items() if v)
        acts = after.program.actions[r]
        allocs = [m[2] for a in acts for m in a.mem if m[1] == "activations" and m[2] > 0]
        # one allocation per stored piece (each layer's as it runs, sim.program.memory's
        # chunk_activation_parts) per micro-batch, adding up to the chunk's stored bytes
        from sim.program.memory import chunk_activation_bytes, chunk_activation_parts

        m = ctx.plan.num_microbatches
        assert len(allocs) == m * len(chunk_activation_parts(TWO, ctx.plan, r))
        assert sum(allocs) == pytest.approx(m * chunk_activation_bytes(TWO, ctx.plan, r), rel=1e-12)


def test_expand_copies_the_templates_onto_every_gpu():
    ctx = _ctx(dp=2, tp=2, pp=2, global_batch_size=4)
    _, full = _around(ctx, "expand")
    assert set(full.program.actions) == set(range(8)) and not full.program.shadows
    _, reduced = _around(replace(ctx, fidelity="reduced"), "expand")
    kept = {ctx.plan.rank(dp=0, pp=p, tp=0) for p in (0, 1)}
    assert set(reduced.program.actions) == kept and set(reduced.program.shadows) == set(range(8)) - kept
