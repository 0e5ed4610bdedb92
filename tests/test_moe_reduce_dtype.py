"""NeMo AutoModel's reduce dtype by parallelizer (``sim.inputs.frameworks``): a dense model's
gradients reduced in bf16 (FSDP2Manager's policy), an MoE model's dense parameters in fp32
and its routed experts in bf16 (the MoE parallelizer's ``apply_fsdp`` default policy and the
experts' policy-less ``fully_shard``). Checked by hand on a tiny MoE layer over dp 4, ep 2."""

import pytest

from sim.inputs.experts import Folding
from sim.inputs.hardware import load_profile
from sim.inputs.model import layer_param_split, llama
from sim.inputs.plan import ParallelPlan
from sim.program.memory import stage_param_split, zero_temporary_bytes
from sim.program.training import build_program

TINY = llama("tiny-moe", 4, 512, 8, 8, 1024, 2000, 256, num_experts=4, moe_router_topk=2,
             moe_ffn_hidden_size=512)
A100 = load_profile("a100-80gb")


def _plan(**kw):
    kw = dict(dp=4, ep=2, global_batch_size=8, zero_stage=3, framework="automodel", zero_bucket_size_bytes=1) | kw
    return ParallelPlan(**kw)


@pytest.mark.parametrize("framework, dense_model, moe_dense, experts", [
    ("automodel", False, True, False),     # FSDP2Manager bf16; MoE parallelizer fp32; experts' own unit bf16
    ("torchtitan", True, True, True),      # one policy (reduce fp32) for every unit
    ("llm-foundry", True, True, True),
    ("megatron", False, False, False),     # no PyTorch FSDP: 16-bit
])
def test_each_frameworks_reduce_dtype_by_part(framework, dense_model, moe_dense, experts):
    plan = _plan(framework=framework)
    assert plan.sharding.reduce_fp32() is dense_model
    assert plan.sharding.reduce_fp32(moe=True) is moe_dense
    assert plan.sharding.reduce_fp32(moe=True, experts=True) is experts


def test_a_given_reduce_dtype_sets_every_part():
    for given in (True, False):
        plan = _plan(grad_reduce_fp32=given)
        assert {plan.sharding.reduce_fp32(m, x) for m in (False, True) for x in (False, True)} == {given}


def _reductions(acts, prefix):
    return [a for a in acts if a.kind == "collective" and a.op == "reducescatter" and a.name.startswith(prefix)]


def test_automodel_moe_reduces_dense_grads_in_fp32_and_experts_in_bf16():
    _, prog = build_program(TINY, _plan(), A100, fidelity="reduced")
    acts = prog.actions[0]
    f = Folding(_plan())
    dense, expert = _reductions(acts, "grad bucket"), _reductions(acts, "expert grad bucket")
    assert dense and expert and {a.group for a in expert} == {f.edp_group(0)}
    # once a step (AutoModel defers the sync to the last of the 2 micro-batches), per layer: dense elements
    # x 4 bytes, expert elements x 2 bytes (layer_param_split: (dense, experts) elements of a rank at tp 1, ep 2)
    split = [layer_param_split(TINY, i, 1, 2, 1) for i in range(4)]
    assert sum(a.nbytes for a in expert) == pytest.approx(2 * sum(x for _d, x in split))
    # the dense buckets also carry the embedding and head: check against the same plan reduced in bf16
    bf16 = _reductions(build_program(TINY, _plan(grad_reduce_fp32=False), A100, fidelity="reduced")[1].actions[0],
                       "grad bucket")
    assert [a.nbytes for a in dense] == pytest.approx([2 * a.nbytes for a in bf16])
    # FSDP2's copies follow each dtype: the dense reduce-scatters' _chunk_cat writes fp32 (read 2, write 4
    # bytes an element) and nothing casts after them; the experts' writes bf16 and their shard is cast after
    names = [a.name for a in acts if a.category == "fsdp"]
    chunk = {a.name: a.nbytes for a in acts if a.name.startswith("fsdp foreach_reduce_scatter_copy_in _chunk_cat")}
    for a in dense:
        assert chunk[f"fsdp foreach_reduce_scatter_copy_in _chunk_cat for {a.name}"] == pytest.approx(a.nbytes / 4 * 6)
        assert f"fsdp foreach_reduce _to_dtype_if_needed for {a.name}" not in names
    for a in expert:
        assert chunk[f"fsdp foreach_reduce_scatter_copy_in _chunk_cat for {a.name}"] == pytest.approx(a.nbytes / 2 * 4)
        assert f"fsdp foreach_reduce _to_dtype_if_needed for {a.name}" in names


def test_a_dense_automodel_model_still_reduces_in_bf16():
    dense_model = llama("tiny", 4, 512, 8, 8, 1024, 2000, 256)
    plan = _plan(ep=1)
    fp32 = _plan(ep=1, grad_reduce_fp32=True)
    rs = lambda p: [a.nbytes for a in _reductions(build_program(dense_model, p, A100, fidelity="reduced")[1]  # noqa: E731
                                                  .actions[0], "grad bucket")]
    assert rs(fp32) == pytest.approx([2 * n for n in rs(plan)])


def test_deferred_gradients_held_in_each_parts_dtype():
    # AutoModel defers the sync: the estimate holds the stage's unsharded gradients, dense in fp32, experts in bf16
    plan = _plan()
    dense, experts = stage_param_split(TINY, plan, 0)
    params = dense + experts
    got = zero_temporary_bytes(TINY, plan, params, (dense, experts))
    held_fp32 = zero_temporary_bytes(TINY, _plan(grad_reduce_fp32=True), params, (dense, experts))
    assert held_fp32 - got == pytest.approx(2 * experts)   # the experts' 2 bytes less an element


def _expert_adds(acts):
    return [a for a in acts if a.name.startswith("fsdp AccumulateGrad") and "experts of layer" in a.name]


def test_experts_alone_on_their_rank_still_accumulate_in_autograd():
    # dp 2 = ep 2: edp 1, so AutoModel's MoE parallelizer leaves the experts out of FSDP (ignored_params) and
    # autograd adds each micro-batch's gradient into .grad from the second on: 3 micro-batches, 2 adds a layer
    # of the rank's 2 experts' 3 x 512 x 512 bf16 elements, each reading 2 + 2 and writing 2 bytes an element
    plan = _plan(dp=2, ep=2, global_batch_size=6)
    _, prog = build_program(TINY, plan, A100, fidelity="reduced")
    adds = _expert_adds(prog.actions[0])
    experts = 2 * 3 * 512 * 512
    assert [a.name.rpartition(" of ")[2] for a in adds if " layer 0 " in a.name] == ["0B1", "0B2"]
    assert len(adds) == 2 * TINY.num_layers
    assert {a.nbytes for a in adds} == {(2 + 2 + 2) * experts}
    # with edp 2 (dp 4) they are FSDP's: the same adds, as before, from the deferred sync
    _, sharded = build_program(TINY, _plan(global_batch_size=12), A100, fidelity="reduced")
    assert len(_expert_adds(sharded.actions[0])) == 2 * TINY.num_layers


def test_a_single_micro_batch_adds_nothing():
    _, prog = build_program(TINY, _plan(dp=2, ep=2, global_batch_size=2), A100, fidelity="reduced")
    assert _expert_adds(prog.actions[0]) == []
