"""Megatron-Core's gradient buckets (``sim.inputs.frameworks.GRAD_BUCKETS``): the default bucket of
max(40M, 1M x dp) parameters, one bucket per model chunk on pipeline stages after the first and
on chunks after the first, the distributed optimizer's all-gather over the same buckets; PyTorch
DDP's uniform 25 MiB elsewhere."""

import pytest

from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import DDP_BUCKET_BYTES, ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.program.memory.states import ddp_bucket_bytes, layer_param_bytes
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
MODEL = gpt("tiny", 8, 256, 4, 1000, 128)


@pytest.mark.parametrize("dp, params", [(8, 40_000_000), (40, 40_000_000), (64, 64_000_000), (512, 512_000_000)])
def test_the_megatron_core_default_bucket_grows_with_the_data_parallel_size(dp, params):
    # DistributedDataParallel: bucket_size = max(40000000, 1000000 * dp) parameters, 2 bytes each in bf16
    assert ddp_bucket_bytes(ParallelPlan(dp=dp, global_batch_size=dp)) == 2 * params


def test_a_given_bucket_and_other_frameworks_keep_their_size():
    assert ddp_bucket_bytes(ParallelPlan(dp=64, global_batch_size=64, bucket_size_bytes=2**20)) == 2**20
    assert ddp_bucket_bytes(ParallelPlan(dp=64, global_batch_size=64, grad_buckets="uniform")) == DDP_BUCKET_BYTES
    assert ParallelPlan(dp=64, global_batch_size=64).sharding.grad_buckets.name == "megatron-core"
    # FSDP and DeepSpeed bucket by their own rules: never Megatron-Core's
    assert ParallelPlan(dp=64, global_batch_size=64, zero_stage=3, framework="torchtitan").sharding.grad_buckets.name \
        == "uniform"


def test_a_bad_bucketing_is_refused_by_name():
    with pytest.raises(InputError, match="grad_buckets"):
        ParallelPlan(grad_buckets="per-layer")
    # FSDP buckets by its own rules: the setting would change nothing
    with pytest.raises(InputError, match="grad_buckets.*FSDP"):
        ParallelPlan(dp=8, global_batch_size=8, zero_stage=3, framework="torchtitan", grad_buckets="uniform")


def _buckets(plan, rank, label="grad bucket"):
    run = simulate_training(Job(MODEL, plan, H100, load_topology("dgx-h100", nodes=2)))
    return [s for s in run.trace.spans_of(rank) if s.kind == "collective" and s.name.startswith(label)]


def _per_rank(plan):
    return {r: _buckets(plan, r) for r in (0, plan.rank(dp=0, pp=1))}


LAYER = layer_param_bytes(MODEL, 1, 0)  # 16-bit bytes of one transformer layer's gradients (tp 1)


def test_later_stages_and_chunks_reduce_one_bucket_each():
    # 8 layers over pp 2 x vpp 2: chunks of 2 layers. A bucket of 0.9 layers' bytes: the first stage's first
    # chunk (embedding + layers 0, 1) packs at that size, a bucket a layer; every other chunk is one bucket of
    # all its gradients.
    plan = ParallelPlan(dp=8, pp=2, vpp=2, global_batch_size=16, bucket_size_bytes=int(0.9 * LAYER))
    got = _per_rank(plan)
    emb, head = layer_param_bytes(MODEL, 1, -1), layer_param_bytes(MODEL, 1, MODEL.num_layers)
    # stage 0: layer 1, layer 0, the embedding (chunk 0), and chunk 1 (layers 4, 5) whole
    assert sorted(s.nbytes for s in got[0]) == pytest.approx(sorted([LAYER, LAYER, emb, 2 * LAYER]))
    # stage 1: chunk 0 (layers 2, 3) and chunk 1 (layers 6, 7 and the head) one bucket each
    assert sorted(s.nbytes for s in got[plan.rank(dp=0, pp=1)]) == pytest.approx([2 * LAYER, 2 * LAYER + head])


def test_uniform_buckets_pack_every_stage_alike():
    plan = ParallelPlan(dp=8, pp=2, vpp=2, global_batch_size=16, bucket_size_bytes=int(0.9 * LAYER),
                        grad_buckets="uniform")
    head = layer_param_bytes(MODEL, 1, MODEL.num_layers)
    # stage 1 at 0.9 layers a bucket: the head with layer 7 (the head alone is under it), then layers 6, 3, 2
    assert sorted(s.nbytes for s in _buckets(plan, plan.rank(dp=0, pp=1))) == pytest.approx(
        sorted([LAYER + head, LAYER, LAYER, LAYER]))


def test_the_parameter_gather_follows_the_same_buckets():
    plan = ParallelPlan(dp=8, pp=2, global_batch_size=16, bucket_size_bytes=int(0.9 * LAYER), zero_stage=1,
                        param_gather_overlap=True)
    later = _buckets(plan, plan.rank(dp=0, pp=1), label="param allgather")
    head = layer_param_bytes(MODEL, 1, MODEL.num_layers)
    assert [s.nbytes for s in later] == [pytest.approx(4 * LAYER + head)]  # one gather of the whole stage
    emb = layer_param_bytes(MODEL, 1, -1)
    # stage 0 in the order of first use, 0.9 layers a bucket: the embedding with layer 0, then layers 1, 2, 3
    assert [s.nbytes for s in _buckets(plan, 0, label="param allgather")] == pytest.approx(
        [emb + LAYER, LAYER, LAYER, LAYER])


def test_apex_reduces_a_chunk_at_a_time_under_interleaving():
    # NeMo 1.0 + Apex DistributedFusedAdam: one effective bucket per model chunk, whatever the bucket size; 8
    # layers over pp 2 x vpp 2, chunks of 2 layers. Stage 0: chunk 0 (embedding, layers 0, 1), chunk 1 (4, 5);
    # stage 1: chunk 0 (2, 3), chunk 1 (6, 7 and the head). Reduced in backward order: the last chunk first.
    plan = ParallelPlan(dp=8, pp=2, vpp=2, global_batch_size=16, bucket_size_bytes=int(0.9 * LAYER),
                        grad_buckets="apex")
    emb, head = layer_param_bytes(MODEL, 1, -1), layer_param_bytes(MODEL, 1, MODEL.num_layers)
    got = _per_rank(plan)
    assert [s.nbytes for s in got[0]] == pytest.approx([2 * LAYER, 2 * LAYER + emb])
    assert [s.nbytes for s in got[plan.rank(dp=0, pp=1)]] == pytest.approx([2 * LAYER + head, 2 * LAYER])


def test_apex_reduces_a_layer_at_a_time_without_interleaving():
    # Without interleaving one effective bucket per layer; the parameters in no layer (the embedding on stage 0,
    # the head on stage 1) go with the stage's first layer, reduced last (NeMo's buckets[-1] after the reverse).
    plan = ParallelPlan(dp=8, pp=2, global_batch_size=16, grad_buckets="apex")
    emb, head = layer_param_bytes(MODEL, 1, -1), layer_param_bytes(MODEL, 1, MODEL.num_layers)
    got = _per_rank(plan)
    assert [s.nbytes for s in got[0]] == pytest.approx([LAYER, LAYER, LAYER, LAYER + emb])  # layers 3, 2, 1, 0
    assert [s.nbytes for s in got[plan.rank(dp=0, pp=1)]] == pytest.approx([LAYER, LAYER, LAYER, LAYER + head])
    # its default bucket: Apex's bucket_cap_mb=100 MiB
    assert ddp_bucket_bytes(plan) == 100 * 2**20
