"""The plan's sharding as one strategy object (``ParallelPlan.sharding``,
``sim.inputs.frameworks.ShardingStrategy``): each framework resolves to the values its
sources say (hand-written below, the source beside each row), a setting the plan gives wins
over the framework's, and the rules between them (FSDP only under ZeRO-3, FSDP2 under
pipelining always deferring) hold whatever is given."""

import re
from dataclasses import replace
from pathlib import Path

import pytest

from sim.errors import InputError
from sim.inputs.frameworks import (DEEPSPEED_MAX_LIVE_PARAMETERS, DEEPSPEED_MAX_REUSE_DISTANCE,
                                   DEEPSPEED_PERSISTENCE_THRESHOLD, DEEPSPEED_PREFETCH_BUCKET, FRAMEWORKS,
                                   ShardingStrategy)
from sim.inputs.plan import ParallelPlan

ROOT = Path(__file__).resolve().parents[1]


def _plan(framework, **kw):
    kw = {"dp": 4, "global_batch_size": 16, "zero_stage": 3, **kw}  # 4 micro-batches a step
    return ParallelPlan(framework=framework, **kw)


# framework: kind, reduce fp32 (dense model, MoE model's dense parts, its routed experts), defer, reshard after
# forward, backward prefetch -- under ZeRO-3 without pipelining
TABLE = {
    # Megatron-Core: its own distributed optimizer, bf16 grad_sync_dtype; no PyTorch FSDP
    "megatron": ("", False, False, False, False, True, "backward_pre"),
    # torchtitan: fully_shard with MixedPrecisionPolicy(reduce_dtype=float32) (training.mixed_precision_reduce),
    # one policy for every module; FSDP2 prefetches one layer ahead (backward_pre); no deferral of its own
    "torchtitan": ("fsdp2", True, True, True, False, True, "backward_pre"),
    # NeMo AutoModel: FSDP2Manager's bf16 reduce_dtype for dense models; its MoE parallelizer's default policy
    # reduces the dense parts in fp32 and the experts' policy-less fully_shard in bf16; defer_fsdp_grad_sync True
    "automodel": ("fsdp2", False, True, False, True, True, "backward_pre"),
    # llm-foundry on Composer FSDP1: "MP Mode DEFAULT" (reduce_dtype float32), BACKWARD_POST, FULL_SHARD
    "llm-foundry": ("fsdp1", True, True, True, False, True, "backward_post"),
    # DeepSpeed: its own ZeRO, 16-bit reductions, no FSDP deferral
    "deepspeed": ("deepspeed", False, False, False, False, True, "backward_pre"),
}


def test_the_table_covers_every_framework():
    assert set(TABLE) == set(FRAMEWORKS)


@pytest.mark.parametrize("framework", TABLE)
def test_each_framework_resolves_to_its_sources_values(framework):
    kind, dense, moe_dense, experts, defer, reshard, prefetch = TABLE[framework]
    s = _plan(framework).sharding
    assert isinstance(s, ShardingStrategy)
    assert s.kind == kind
    assert s.fsdp == (kind if kind.startswith("fsdp") else "")
    assert s.fsdp2 == (kind == "fsdp2") and s.deepspeed == (kind == "deepspeed")
    assert (s.reduce_fp32(), s.reduce_fp32(moe=True), s.reduce_fp32(moe=True, experts=True)) == \
        (dense, moe_dense, experts)
    assert (s.defer_grad_sync, s.reshard_after_forward, s.backward_prefetch) == (defer, reshard, prefetch)
    assert s.pp_sync_window is None and s.schedule_calls == 1  # no pipeline: one call, FSDP's own hooks


@pytest.mark.parametrize("framework", ["torchtitan", "automodel", "llm-foundry"])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_no_pytorch_fsdp_below_zero_3(framework, stage):
    """FSDP is the framework's ZeRO-3: below it the gradients are all-reduced or reduce-scattered
    in 16 bits (Megatron-Core's path) and nothing is deferred."""
    s = _plan(framework, zero_stage=stage).sharding
    assert (s.kind, s.fsdp, s.defer_grad_sync, s.pp_sync_window) == ("", "", False, None)
    assert {s.reduce_fp32(m, x) for m in (False, True) for x in (False, True)} == {False}


@pytest.mark.parametrize("framework", TABLE)
@pytest.mark.parametrize("given", [True, False])
def test_a_given_reduce_dtype_sets_every_part(framework, given):
    s = _plan(framework, grad_reduce_fp32=given).sharding
    assert {s.reduce_fp32(m, x) for m in (False, True) for x in (False, True)} == {given}


def test_given_fsdp_settings_win_over_the_frameworks():
    assert not _plan("automodel", defer_fsdp_grad_sync=False).sharding.defer_grad_sync
    assert _plan("torchtitan", defer_fsdp_grad_sync=True).sharding.defer_grad_sync
    # FSDP1's SHARD_GRAD_OP: llm-foundry with its gathered parameters kept for the backward
    sgo = _plan("llm-foundry", reshard_after_forward=False).sharding
    assert not sgo.reshard_after_forward and sgo.kind == "fsdp1"
    pre = _plan("llm-foundry", backward_prefetch="backward_pre").sharding
    assert pre.backward_prefetch == "backward_pre" and not pre.prefetch_after_backward
    assert _plan("torchtitan", backward_prefetch="backward_post").sharding.prefetch_after_backward


@pytest.mark.parametrize("framework", ["torchtitan", "automodel"])
def test_fsdp2_under_pipelining_defers_whatever_is_given(framework):
    """torch pipelining's ``backward_maybe_with_nosync``: every backward but the stage's last of
    the call runs without gradient sync; the sync window is the call's micro-batches."""
    pipelined = dict(dp=2, pp=2, global_batch_size=8)  # 4 micro-batches a step
    for given in (None, True):
        s = _plan(framework, defer_fsdp_grad_sync=given, **pipelined).sharding
        assert s.defer_grad_sync and s.pp_sync_window == 4 and s.schedule_calls == 1
    with pytest.raises(InputError, match="defer_fsdp_grad_sync"):
        _plan(framework, defer_fsdp_grad_sync=False, **pipelined)
    calls = _plan(framework, pp_call_microbatches=2, **pipelined).sharding
    assert calls.pp_sync_window == 2 and calls.schedule_calls == 2  # 4 micro-batches, 2 a call


def test_reshard_after_forward_under_pipelining():
    """torchtitan's ``reshard_after_forward_policy`` "default": ``not pp_enabled``; the other
    FSDPs reshard (FSDP's default) unless told not to."""
    pipelined = dict(dp=2, pp=2, global_batch_size=8)
    assert not _plan("torchtitan", **pipelined).sharding.reshard_after_forward
    assert _plan("torchtitan", reshard_after_forward=True, **pipelined).sharding.reshard_after_forward
    assert _plan("torchtitan").sharding.reshard_after_forward
    assert _plan("automodel", **pipelined).sharding.reshard_after_forward
    assert not _plan("automodel", reshard_after_forward=False, **pipelined).sharding.reshard_after_forward


def test_no_window_without_fsdp2():
    pipelined = dict(dp=2, pp=2, global_batch_size=8)
    assert _plan("megatron", **pipelined).sharding.pp_sync_window is None
    assert not _plan("megatron", **pipelined).sharding.defer_grad_sync


# DeepSpeed (deepspeed/runtime/zero/config.py defaults; stage_1_and_2.py setup_buckets, stage3.py buffers):
# stage, given overlap_comm / contiguous_gradients -> overlap_comm in effect, gradient bucket buffers
@pytest.mark.parametrize("stage, overlap, contiguous, want_overlap, buffers", [
    (0, None, None, False, 0),  # no ZeRO: the engine's all-reduce, no buffers
    (1, None, None, False, 1),  # overlap_comm off below ZeRO-3 (overlap_comm_valid): one buffer
    (1, True, None, True, 2),  # with overlap_comm, a second ("double buffers to avoid data access conflict")
    (2, None, None, False, 1),
    (2, True, None, True, 2),
    (2, None, False, False, 0),  # contiguous_gradients off: no buffers
    (3, None, None, True, 1),  # ZeRO-3: overlap_comm on, one buffer whatever overlap_comm says
    (3, False, None, False, 1),
])
def test_deepspeed_overlap_and_buckets(stage, overlap, contiguous, want_overlap, buffers):
    s = _plan("deepspeed", zero_stage=stage, overlap_comm=overlap, contiguous_gradients=contiguous).sharding
    assert s.deepspeed and s.kind == "deepspeed" and s.fsdp == ""
    assert (s.overlap_comm, s.bucket_buffers) == (want_overlap, buffers)


def test_deepspeed_element_settings_default_and_given():
    s = _plan("deepspeed").sharding
    assert (s.max_live_parameters, s.persistence_threshold, s.prefetch_bucket_size, s.max_reuse_distance) == \
        (1e9, 1e5, 5e7, 1e9)  # DeepSpeedZeroConfig's stage3_* defaults
    assert (DEEPSPEED_MAX_LIVE_PARAMETERS, DEEPSPEED_PERSISTENCE_THRESHOLD, DEEPSPEED_PREFETCH_BUCKET,
            DEEPSPEED_MAX_REUSE_DISTANCE) == (1e9, 1e5, 5e7, 1e9)
    given = _plan("deepspeed", zero3_max_live_parameters=3e5, zero3_param_persistence_threshold=1e3,
                  zero3_prefetch_bucket_size=1e4, zero3_max_reuse_distance=1e5).sharding
    assert (given.max_live_parameters, given.persistence_threshold, given.prefetch_bucket_size,
            given.max_reuse_distance) == (3e5, 1e3, 1e4, 1e5)


def test_outside_deepspeed_nothing_persists_and_the_live_cap_is_only_what_is_given():
    assert _plan("megatron").sharding.persistence_threshold is None
    assert _plan("megatron").sharding.max_live_parameters is None
    assert _plan("megatron", zero3_max_live_parameters=3e5).sharding.max_live_parameters == 3e5


def test_the_plan_resolves_it_once():
    plan = _plan("automodel")
    assert plan.sharding is plan.sharding
    other = replace(plan, defer_fsdp_grad_sync=False)
    assert other.sharding is not plan.sharding and not other.sharding.defer_grad_sync
    assert plan.sharding.defer_grad_sync  # the original's unchanged
    assert _plan("automodel") == plan  # (the cached strategy is not a field: equality and hashing by the fields)
    assert hash(_plan("automodel")) == hash(plan)


def test_no_module_but_the_frameworks_compares_a_framework_name():
    """DESIGN's third pass: no plan field is compared with a string outside its own module."""
    names = "|".join(re.escape(n) for n in FRAMEWORKS)
    compare = re.compile(rf"""[!=]=\s*["']({names})["']|["']({names})["']\s*[!=]=""")
    found = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "sim").rglob("*.py"))
             if p.name != "frameworks.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if compare.search(line)]
    assert found == []
