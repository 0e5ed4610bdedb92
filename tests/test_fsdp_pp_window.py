"""FSDP2 under pipeline parallelism (``ParallelPlan.sharding.pp_sync_window``): torch
pipelining keeps each stage's parameters gathered and its gradients unreduced across one call
of the schedule (``backward_maybe_with_nosync``), and NeMo AutoModel calls it once per
accumulation step (``pp_call_microbatches``). Per call, by hand on a tiny model: the
all-gathers and reduce-scatters of a layer, their bytes, the gathered memory held; GA 1 and
the non-pipelined and Megatron plans unchanged."""

import pytest

from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.program.training import build_program

H100 = load_profile("h100-sxm")
H = 256
TINY4 = gpt("tiny4", 4, H, 4, 512, 256)  # 4 layers of width 256: 2 per stage under pp 2
LAYER = 12 * H * H + 13 * H  # a GPT layer's elements: QKV, projection, MLP up and down, their biases, 2 norms


def _plan(gbs=8, **kw):
    # pp 2 x dp 2, micro-batch 1, gbs 8: 4 micro-batches per pipeline; 1-byte buckets: a reduce-scatter per layer
    kw = dict(dict(dp=2, pp=2, global_batch_size=gbs, micro_batch_size=1, zero_bucket_size_bytes=1, zero_stage=3,
                   framework="automodel"), **kw)
    return ParallelPlan(**kw)


def _acts(plan, rank=0):
    _, prog = build_program(TINY4, plan, H100, fidelity="reduced")
    return prog.actions[rank]


def _of_layer1(acts, op):
    return [a for a in acts if a.kind == "collective" and a.op == op and (" 1 for " in a.name or "(layers 1..1)" in a.name)]


def test_the_window_is_one_schedule_call():
    assert _plan().sharding.pp_sync_window == 4  # one call: all 4 micro-batches
    assert _plan(pp_call_microbatches=2).sharding.pp_sync_window == 2
    assert _plan(pp=1, dp=4).sharding.pp_sync_window is None  # no pipeline: FSDP's own hooks
    # torchtitan's FSDP2 is torch pipelining's too (backward_maybe_with_nosync), whatever the framework defers
    assert _plan(framework="torchtitan").sharding.pp_sync_window == 4
    assert _plan(framework="megatron").sharding.pp_sync_window is None


@pytest.mark.parametrize("kw, why", [(dict(pp_call_microbatches=3), "divisor"),
                                     (dict(pp_call_microbatches=2, framework="megatron"), "FSDP2"),
                                     (dict(pp_call_microbatches=2, pp=1, dp=4), "pp > 1")])
def test_bad_windows_are_refused(kw, why):
    with pytest.raises(InputError, match=f"pp_call_microbatches.*{why}"):
        _plan(**kw)


@pytest.mark.parametrize("calls", [1, 2, 4])
def test_per_call_one_reduce_scatter_and_one_gather_per_layer(calls):
    per_call = 4 // calls
    acts = _acts(_plan(pp_call_microbatches=per_call, reshard_after_forward=False))
    scatters = _of_layer1(acts, "reducescatter")
    gathers = _of_layer1(acts, "allgather")
    # layer 1's bf16 gradients (2 bytes an element, reduced over dp 2) once per call; its bf16 parameters
    # gathered once per call (first forward of the call) and kept to the call's last backward
    assert [a.nbytes for a in scatters] == [2 * LAYER] * calls
    assert [a.nbytes for a in gathers] == [2 * LAYER] * calls
    assert [g.name.rpartition(" for ")[2] for g in gathers] == [f"0F{c * per_call}" for c in range(calls)]
    # each reduce-scatter after the stage's last backward step of its call
    assert [s.deps[0].split(".")[0] for s in scatters] == [f"0B{(c + 1) * per_call - 1}" for c in range(calls)]
    # the gathered parameters held from the call's first forward to its last backward of the layer
    index = {a.name: i for i, a in enumerate(acts)}
    frees = [i for i, a in enumerate(acts) if ("end", "gathered", -2.0 * LAYER) in a.mem and a.layer == 1]
    assert len(frees) == calls
    for c, (g, f) in enumerate(zip(gathers, frees)):
        assert index[g.name] < f and acts[f].name.split(".")[0] == f"0B{(c + 1) * per_call - 1}"
    # the unsharded gradient adds: one per backward after the call's first
    adds = [a for a in acts if a.name.startswith("fsdp AccumulateGrad") and " layer 1 of " in a.name]
    assert len(adds) == calls * (per_call - 1)


def test_resharding_after_forward_gathers_each_forward_and_once_per_call_in_backward():
    acts = _acts(_plan(pp_call_microbatches=2))  # reshard_after_forward on (the plan's default)
    steps = [g.name.rpartition(" for ")[2] for g in _of_layer1(acts, "allgather")]
    # forward: every micro-batch; backward (reverse layer order, so layer 1 after layer 0 is not first):
    # the call's first backward gathers, kept through its second
    assert sorted(s for s in steps if "F" in s) == ["0F0", "0F1", "0F2", "0F3"]
    assert sorted(s for s in steps if "B" in s) == ["0B0", "0B2"]


def test_ga1_pipelined_plan_unchanged_by_its_own_window():
    # one call holding all the micro-batches is the default: the same program
    a, b = _acts(_plan()), _acts(_plan(pp_call_microbatches=4))
    assert [(x.name, x.nbytes, x.deps, x.mem) for x in a] == [(x.name, x.nbytes, x.deps, x.mem) for x in b]


@pytest.mark.parametrize("kw", [dict(framework="megatron"), dict(pp=1, dp=4), dict(pp=1, dp=4, framework="torchtitan")])
def test_other_plans_gather_per_use(kw):
    # Megatron and no pipeline (torchtitan's FSDP2 then reshards after forward): a gather per forward and
    # per backward use
    plan = _plan(**kw)
    assert len(_of_layer1(_acts(plan), "allgather")) == 2 * plan.num_microbatches  # (4 pipelined, 2 with dp 4)


def test_the_estimate_holds_the_stage_gathered_under_pipelining():
    from sim.program.memory import stage_memory_bytes, stage_params_per_rank
    from sim.program.memory.rank import zero3_layer_gather_params
    from sim.program.memory.states import zero3_gathered_param_bytes

    on, off = _plan(), _plan(framework="megatron")  # Megatron-Core's ZeRO-3: not deferred, no window
    params = stage_params_per_rank(TINY4, on, 0)  # stage 0: 2 layers and the embedding
    mem_on, mem_off = stage_memory_bytes(TINY4, on, 0), stage_memory_bytes(TINY4, off, 0)
    held_off = zero3_gathered_param_bytes(zero3_layer_gather_params(TINY4, off))
    # under the window the whole stage's bf16 weights are gathered instead of a layer and one ahead;
    # the other temporaries differ by the deferred gradients only (automodel: the stage's bf16 gradients)
    from sim.program.memory.states import DEEPSPEED_REDUCE_BUCKET_ELEMS, grad_bucket_bytes
    bucket = grad_bucket_bytes(min(params, float(DEEPSPEED_REDUCE_BUCKET_ELEMS)))
    assert mem_on["temporaries"] - mem_off["temporaries"] == pytest.approx((2 * params - held_off) + (2 * params - bucket))


def test_each_call_runs_the_schedule_with_its_own_fill_and_drain():
    # 1F1B on pp 2 with 2 micro-batches, rank 0: F0 F1 B0 B1 (one warm-up forward); two calls of it
    _, prog = build_program(TINY4, _plan(pp_call_microbatches=2, schedule="1f1b"), H100, fidelity="reduced")
    steps = []
    for a in prog.actions[0]:
        if a.kind == "compute" and a.category in ("F", "B"):
            st = a.name.split(".")[0]
            if not steps or steps[-1] != st:
                steps.append(st)
    assert steps == ["0F0", "0F1", "0B0", "0B1", "0F2", "0F3", "0B2", "0B3"]


def test_the_estimate_counts_a_fill_and_drain_per_call():
    from sim.program.estimate import estimate

    one, two = estimate(TINY4, _plan(), H100).time, estimate(TINY4, _plan(pp_call_microbatches=2), H100).time
    assert two["pipeline_bubble"] == pytest.approx(2 * one["pipeline_bubble"]) and one["pipeline_bubble"] > 0
    assert two["compute"] == one["compute"]


def test_torchtitan_under_pipelining_keeps_its_layers_gathered_through_the_call():
    # torchtitan's reshard_after_forward_policy "default" (not pp_enabled) and torch's pipeline stage: per
    # call one gather per layer at its first forward, one fp32 reduce-scatter after the stage's last backward
    acts = _acts(_plan(framework="torchtitan", pp_call_microbatches=2))
    gathers, scatters = _of_layer1(acts, "allgather"), _of_layer1(acts, "reducescatter")
    assert [g.name.rpartition(" for ")[2] for g in gathers] == ["0F0", "0F2"]
    assert [a.nbytes for a in gathers] == [2 * LAYER] * 2
    assert [a.nbytes for a in scatters] == [4 * LAYER] * 2  # torchtitan reduces in fp32
    assert [s.deps[0].split(".")[0] for s in scatters] == ["0B1", "0B3"]
    # resharding after forward given: every forward gathers again, backward once per call
    steps = [g.name.rpartition(" for ")[2] for g in _of_layer1(
        _acts(_plan(framework="torchtitan", pp_call_microbatches=2, reshard_after_forward=True)), "allgather")]
    assert sorted(s for s in steps if "F" in s) == ["0F0", "0F1", "0F2", "0F3"]
    assert sorted(s for s in steps if "B" in s) == ["0B0", "0B2"]


def test_fsdp2_grad_sync_under_pipelining_cannot_be_turned_off():
    with pytest.raises(InputError, match="defer_fsdp_grad_sync.*pipelining"):
        _plan(defer_fsdp_grad_sync=False)
    assert _plan(pp=1, dp=4, defer_fsdp_grad_sync=False).sharding.pp_sync_window is None  # without a pipeline: allowed
