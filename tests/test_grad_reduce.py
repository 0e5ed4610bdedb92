"""Gradients reduced in fp32 (``--accumulate-allreduce-grads-in-fp32``, ParallelPlan.grad_reduce_fp32):
Megatron-LM's default for bf16, twice the bytes of a 16-bit reduction; parameter gathers stay 16-bit."""

import pytest

from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt, preset
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.program.costs import collective_time
from sim.program.estimate import estimate
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
A100 = load_profile("a100-80gb")
TINY = gpt("tiny", 2, 256, 4, 1000, 128)


def _dp_spans(plan):
    run = simulate_training(Job(TINY, plan, H100, load_topology("dgx-h100", nodes=2)))
    return [s for s in run.trace.spans_of(0) if s.category == "dp"]


def test_fp32_reduction_moves_four_bytes_a_parameter_in_the_same_buckets():
    half = _dp_spans(ParallelPlan(dp=16, global_batch_size=16, dp_overlap=False))
    full = _dp_spans(ParallelPlan(dp=16, global_batch_size=16, dp_overlap=False, grad_reduce_fp32=True))
    # tp = pp = 1: every rank holds every parameter; 2 bytes each in 16 bit, 4 in fp32 (the same buckets)
    assert sum(s.nbytes for s in half) == pytest.approx(2 * TINY.num_params)
    assert sum(s.nbytes for s in full) == pytest.approx(4 * TINY.num_params)
    assert [2 * s.nbytes for s in half] == [s.nbytes for s in full]


@pytest.mark.parametrize("zero", [0, 2])
def test_the_estimate_doubles_only_the_reductions(zero):
    m = preset("gpt-175b")
    kw = dict(dp=16, tp=8, pp=12, global_batch_size=1536, recompute="full", zero_stage=zero)
    half = estimate(m, ParallelPlan(**kw), A100, dp_channels=1)
    full = estimate(m, ParallelPlan(**kw, grad_reduce_fp32=True), A100, dp_channels=1)
    s, n, mb = 2 * half.params_per_gpu, 16, 1536 // 16  # 16-bit gradient bytes of the worst stage's rank

    def ring(op, nbytes):
        return collective_time(op, nbytes, n, "ib", A100)

    if zero == 0:  # one all-reduce of the fp32 gradients: 2(n-1)/n x 4 bytes a parameter over the link
        assert full.time["dp_comm"] == pytest.approx(ring("all_reduce", 2 * s), rel=1e-9)
        assert half.time["dp_comm"] == pytest.approx(ring("all_reduce", s), rel=1e-9)
    else:  # ZeRO-2: each micro-batch's reduce-scatter in fp32, the parameters gathered in 16 bit
        assert full.time["dp_comm"] == pytest.approx(mb * ring("reduce_scatter", 2 * s) + ring("all_gather", s),
                                                     rel=1e-9)
    assert full.time["compute"] == half.time["compute"]


@pytest.mark.parametrize("zero", [0, 1])
def test_without_overlap_the_gradients_are_one_bucket(zero):
    # Megatron-LM sets the bucket size to infinity when overlap_grad_reduce is off: one
    # reduction of all the rank's gradients after the backward; with overlap, 25 MiB ... here
    # 64 KiB buckets as they become ready. The bytes are the same either way.
    small = dict(dp=16, global_batch_size=16, zero_stage=zero, bucket_size_bytes=64 * 2**10)
    one = [s for s in _dp_spans(ParallelPlan(**small, dp_overlap=False)) if "grad" in s.name]
    many = [s for s in _dp_spans(ParallelPlan(**small)) if "grad" in s.name]
    assert len(one) == 1 and len(many) > 1
    assert one[0].nbytes == pytest.approx(sum(s.nbytes for s in many))
    assert one[0].nbytes == pytest.approx(2 * TINY.num_params)  # (a reduce-scatter names its input size)
