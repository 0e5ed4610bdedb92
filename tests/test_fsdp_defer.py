"""FSDP2's deferred gradient sync (NeMo AutoModel's ``defer_fsdp_grad_sync``,
``sim.inputs.frameworks``): per micro-batch the reduce-scatters and their bytes, the
unsharded gradient adds, the gradients held, by hand on a small model; one micro-batch and
the other frameworks unchanged."""

import dataclasses
from pathlib import Path

import pytest

from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.program.memory import stage_memory_bytes, stage_params_per_rank
from sim.program.memory.states import DEEPSPEED_REDUCE_BUCKET_ELEMS, grad_bucket_bytes
from sim.program.training import build_program

H100 = load_profile("h100-sxm")
H = 256
TINY = gpt("tiny", 3, H, 4, 512, 256)  # 3 layers of width 256, vocabulary 512, 256 tokens; LayerNorm, biases, tied
LAYER = 12 * H * H + 13 * H  # a GPT layer's elements: QKV, projection, MLP up and down, their biases, 2 norms


def _program(gbs=4, **kw):
    # dp 2, gbs 4: 2 micro-batches; buckets of 1 byte: each layer's gradients a reduce-scatter of their own
    plan = ParallelPlan(dp=2, global_batch_size=gbs, micro_batch_size=1, zero_bucket_size_bytes=1, zero_stage=3, **kw)
    _, prog = build_program(TINY, plan, H100, fidelity="reduced")
    return prog.actions[0]


def _layer1_scatters(acts):
    return [a for a in acts if a.kind == "collective" and a.op == "reducescatter" and "(layers 1..1)" in a.name]


def test_automodel_defers_by_default_and_a_given_setting_wins():
    assert ParallelPlan(dp=2, zero_stage=3, framework="automodel").sharding.defer_grad_sync
    given_off = ParallelPlan(dp=2, zero_stage=3, framework="automodel", defer_fsdp_grad_sync=False)
    assert not given_off.sharding.defer_grad_sync
    assert ParallelPlan(dp=2, zero_stage=3, framework="torchtitan", defer_fsdp_grad_sync=True).sharding.defer_grad_sync
    assert not ParallelPlan(dp=2, zero_stage=3, framework="torchtitan").sharding.defer_grad_sync
    assert not ParallelPlan(dp=2, zero_stage=2, framework="automodel").sharding.defer_grad_sync


@pytest.mark.parametrize("kw", [dict(), dict(framework="megatron"), dict(framework="llm-foundry"),
                                dict(framework="deepspeed"), dict(framework="automodel", zero_stage=2)])
def test_the_setting_is_refused_where_no_fsdp2_runs_zero3(kw):
    kw = dict(dict(zero_stage=3), **kw)
    with pytest.raises(InputError, match="defer_fsdp_grad_sync"):
        ParallelPlan(dp=2, defer_fsdp_grad_sync=True, **kw)


def test_two_micro_batches_by_hand():
    deferred, every = _program(framework="automodel"), _program(framework="automodel", defer_fsdp_grad_sync=False)
    # every micro-batch: a reduce-scatter of layer 1's bf16 gradients (2 bytes an element) per micro-batch,
    # each after its own copy-in; deferred: one, after the last micro-batch's backward of the layer
    assert [(a.name.rpartition(" of ")[2], a.nbytes) for a in _layer1_scatters(every)] == [("0B0", 2 * LAYER),
                                                                                        ("0B1", 2 * LAYER)]
    (rs,) = _layer1_scatters(deferred)
    assert rs.nbytes == 2 * LAYER
    by = {a.name: a for a in deferred}
    index = {a.name: i for i, a in enumerate(deferred)}
    assert by[rs.deps[0]].name.startswith("0B1")  # anchored on the last micro-batch's backward
    copy_in = [a for a in deferred if a.name.startswith("fsdp foreach_reduce_scatter_copy_in")]
    assert len(copy_in) == len([a for a in deferred if a.op == "reducescatter"])
    assert len([a for a in every if a.name.startswith("fsdp foreach_reduce_scatter_copy_in")]) == 2 * len(copy_in)
    # no sharded accumulation; one unsharded bf16 add per layer after its second backward: read 2U + 2U, write 2U
    assert not [a for a in deferred if a.name.startswith("fsdp foreach_reduce grad +=")]
    adds = [a for a in deferred if a.name.startswith("fsdp AccumulateGrad")]
    (add1,) = [a for a in adds if " layer 1 of " in a.name]
    assert add1.name.endswith(" of 0B1") and add1.stream == "compute" and add1.nbytes == 6 * LAYER
    assert add1.duration_s == pytest.approx(6 * LAYER / H100.memory_rate() + H100.kernel_launch_s, rel=1e-12)
    # on the compute stream after the backward, before the reduce-scatter's copy-in that the
    # reduce-scatter waits for (the reduce-scatter itself sits right after its anchor, on the
    # group's stream: sim.program.process_group_streams)
    (cat1,) = [a for a in copy_in if a.name.endswith(f" for {rs.name}")]
    assert index[add1.deps[0]] < index[add1.name] < index[cat1.name] and cat1.name in rs.deps
    assert add1.stream == cat1.stream == "compute"
    assert not [a for a in every if a.name.startswith("fsdp AccumulateGrad")]
    # the layer's unsharded gradients (2 bytes an element) are held from its first backward (0B0) to the
    # reduce-scatter's end
    starts = [a for a in deferred if ("start", "buckets", 2.0 * LAYER) in a.mem]
    assert len(starts) == 3 and any(a.name.startswith("0B0") and a.layer == 1 for a in starts)
    assert ("end", "buckets", -2.0 * LAYER) in rs.mem


def test_fp32_reduction_upcasts_after_the_first_backward_and_adds_in_fp32():
    acts = _program(framework="automodel", grad_reduce_fp32=True)
    up = [a for a in acts if a.name.startswith("fsdp to_accumulated_grad_if_needed") and " layer 1 of " in a.name]
    add = [a for a in acts if a.name.startswith("fsdp accumulate_unsharded_grad_if_needed") and " layer 1 " in a.name]
    assert [(a.name[-3:], a.nbytes) for a in up] == [("0B0", 6 * LAYER)]    # read 2U, write 4U
    assert [(a.name[-3:], a.nbytes) for a in add] == [("0B1", 10 * LAYER)]  # read 4U + 2U, write 4U
    assert [a.nbytes for a in _layer1_scatters(acts)] == [4 * LAYER]


def _signature(acts):
    return [(a.name, a.nbytes, a.stream, a.deps, a.mem) for a in acts]


@pytest.mark.parametrize("framework", ["automodel", "torchtitan"])
def test_one_micro_batch_is_the_same_with_or_without_deferral(framework):
    on = _program(gbs=2, framework=framework, defer_fsdp_grad_sync=True)
    off = _program(gbs=2, framework=framework, defer_fsdp_grad_sync=False)
    # the same collectives, bytes and copies; only the reduce-scatters' names lose their micro-batch
    strip = lambda acts: [(a.name.split(" of 0B0")[0], a.nbytes, a.stream) for a in acts]  # noqa: E731
    assert strip(on) == strip(off)


@pytest.mark.parametrize("kw", [dict(framework="megatron"), dict(framework="llm-foundry"),
                                dict(framework="torchtitan"), dict(framework="deepspeed"), dict()])
def test_other_frameworks_are_unchanged(kw):
    acts = _program(**kw)
    assert not [a for a in acts if "AccumulateGrad" in a.name or "accumulated_grad" in a.name]
    assert len(_layer1_scatters(acts)) == 2 or kw.get("framework") == "deepspeed"


def test_the_estimate_holds_the_unsharded_gradients_across_micro_batches():
    kw = dict(dp=2, global_batch_size=8, micro_batch_size=1, zero_stage=3, framework="automodel")
    on, off = ParallelPlan(**kw), ParallelPlan(**kw, defer_fsdp_grad_sync=False)
    params = stage_params_per_rank(TINY, on, 0)
    diff = stage_memory_bytes(TINY, on, 0)["temporaries"] - stage_memory_bytes(TINY, off, 0)["temporaries"]
    assert diff == pytest.approx(2 * params - grad_bucket_bytes(min(params, float(DEEPSPEED_REDUCE_BUCKET_ELEMS))))
    one = dict(kw, global_batch_size=2)  # one micro-batch: nothing held across micro-batches
    assert stage_memory_bytes(TINY, ParallelPlan(**one), 0) == \
        stage_memory_bytes(TINY, ParallelPlan(**one, defer_fsdp_grad_sync=False), 0)


def test_under_pipelining_the_stage_reduces_after_its_last_backward():
    # pp 2 over 4 GPUs (dp 2), 2 micro-batches: torch pipelining runs FSDP's post-backward for the whole
    # stage once its last backward is done, so each reduce-scatter waits for the end of that step
    plan = ParallelPlan(dp=2, pp=2, global_batch_size=4, micro_batch_size=1, zero_bucket_size_bytes=1, zero_stage=3,
                        framework="automodel")
    _, prog = build_program(gpt("tiny4", 4, H, 4, 512, 256), plan, H100, fidelity="reduced")
    for acts in prog.actions.values():
        scatters = [a for a in acts if a.kind == "collective" and a.op == "reducescatter"]
        assert scatters
        backward = [a for a in acts if a.kind == "compute" and a.category in ("B", "W")]
        last = {}
        for a in backward:
            last[a.name.split(".")[0]] = a.name
        for s in scatters:
            assert s.deps[0] in last.values() and s.deps[0].split(".")[0].endswith("B1")


def test_the_70b_rows_yaml_says_deferral_runs_out_of_memory_and_so_does_the_estimate():
    # fsdp_runs.csv's AutoModel row ran defer_fsdp_grad_sync False: "Must be False with GA>1: True ->
    # delayed resharding -> OOM" (its yaml). Deferred, its 70B unsharded bf16 gradients (140 GB) are held.
    from sim.calibrate.fit_sims import prepare_rows
    from sim.calibrate.runs_csv import read_runs

    (row,) = [r for r in read_runs(Path(__file__).parent.parent / "experiments/fit-data/fsdp_runs.csv") if r.values.get("framework") == "automodel"]
    assert row.values["defer_fsdp_grad_sync"] is False
    (p,) = prepare_rows([row], "h100-sxm")
    hbm = p.profile.hbm_capacity_bytes
    off = stage_memory_bytes(p.model, p.plan, 0)["total"]
    on = stage_memory_bytes(p.model, dataclasses.replace(p.plan, defer_fsdp_grad_sync=None), 0)["total"]
    assert off < hbm < on
