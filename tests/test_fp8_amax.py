"""FP8 delayed scaling's amax all-reduces (``sim.program.amax``): one after each chunk's
forward and one after its backward, over the stage's tensor-, data- and context-parallel
ranks, blocking the compute stream."""

from collections import Counter

import pytest

import sim.program.training as training
from sim.engine.nccl import NcclModel
from sim.engine.tuner import alone_time
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.inputs.schema import SimulationSettings
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
H, L = 1024, 8
SMALL = gpt("small", L, H, 16, 1024, 512)


def _amax(run, rank=0):
    return [s for s in run.trace.spans_of(rank) if s.category == "amax"]


def test_one_reduction_per_chunk_forward_and_backward_over_the_stage_with_its_maxima():
    topo = load_topology("dgx-h100")
    plan = ParallelPlan(tp=2, pp=2, dp=2, vpp=2, micro_batch_size=1, global_batch_size=8, sequence_parallel=True,
                        fp8_format="hybrid", schedule="interleaved")
    run = simulate_training(Job(SMALL, plan, H100, topo), SimulationSettings(fidelity="full"))
    m = plan.num_microbatches
    layers_per_chunk = L // (plan.pp * plan.vpp)
    for r in range(plan.world_size):
        spans = _amax(run, r)
        kinds = Counter(s.name.rstrip("0123456789")[-1] for s in spans)  # "3F1" -> F
        assert kinds == {"F": plan.vpp * m, "B": plan.vpp * m}
        pp = plan.coords(r)[1]
        stage = {g for g in range(plan.world_size) if plan.coords(g)[1] == pp}
        assert len(stage) == plan.tp * plan.dp
        for s in spans:
            per_gemm = 3 if "F" in s.name else 2  # fp32 maxima: input, weight, output / two gradients
            assert s.nbytes == 4 * per_gemm * 4 * layers_per_chunk  # four GEMMs a layer


def test_bf16_runs_and_stages_of_one_gpu_reduce_nothing():
    topo = load_topology("dgx-h100")
    bf16 = simulate_training(Job(SMALL, ParallelPlan(tp=2, dp=2, global_batch_size=8), H100, topo))
    assert not _amax(bf16)
    alone = simulate_training(Job(SMALL, ParallelPlan(pp=2, global_batch_size=8, fp8_format="hybrid"), H100, topo))
    assert not _amax(alone)


def test_zero_bubble_reduces_after_the_input_gradient_not_the_weight_gradient():
    topo = load_topology("dgx-h100")
    plan = ParallelPlan(pp=2, dp=2, global_batch_size=8, fp8_format="hybrid", schedule="zb-h1")
    spans = _amax(simulate_training(Job(SMALL, plan, H100, topo), SimulationSettings(fidelity="full")))
    kinds = Counter(s.name.rstrip("0123456789")[-1] for s in spans)
    assert kinds == {"F": plan.num_microbatches, "I": plan.num_microbatches}


def test_each_reduction_adds_the_collectives_time_alone_to_a_serial_step(monkeypatch):
    # One stage, tp 2 inside a node, no data parallelism: everything runs on the compute
    # stream, so the reductions add exactly their NCCL time (priced alone) per micro-batch.
    topo = load_topology("dgx-h100")
    plan = ParallelPlan(tp=2, global_batch_size=4, fp8_format="hybrid")
    with_amax = simulate_training(Job(SMALL, plan, H100, topo))
    monkeypatch.setattr(training, "add_amax_reductions", lambda prog, *a, **k: prog)
    without = simulate_training(Job(SMALL, plan, H100, topo))
    nccl = NcclModel.from_profile(H100).forcing("auto", None)
    group = (0, 1)
    per_mb = sum(alone_time("allreduce", group, 4 * k * 4 * L, topo, H100.link_efficiencies(), nccl) for k in (3, 2))
    m = plan.num_microbatches
    assert with_amax.trace.end_s - without.trace.end_s == pytest.approx(m * per_mb, rel=1e-9)
    assert sum(s.end_s - s.start_s for s in _amax(with_amax)) == pytest.approx(m * per_mb, rel=1e-9)


def test_the_next_stage_starts_its_forward_after_the_reduction():
    topo = load_topology("dgx-h100")
    plan = ParallelPlan(pp=2, dp=2, global_batch_size=4, fp8_format="hybrid")
    run = simulate_training(Job(SMALL, plan, H100, topo), SimulationSettings(fidelity="full"))
    first = {s.name: s for s in _amax(run, 0)}["0F0"]
    nxt = plan.rank(pp=1)
    f = min((s for s in run.trace.spans_of(nxt) if s.kind == "compute" and s.name.startswith("1F0")),
            key=lambda s: s.start_s)
    assert f.start_s >= first.end_s


def test_the_estimate_adds_each_chunks_two_reductions_per_micro_batch_as_ring_closed_forms():
    from sim.program.estimate import estimate

    plan = ParallelPlan(tp=2, pp=2, dp=2, vpp=2, micro_batch_size=1, global_batch_size=8, sequence_parallel=True,
                        fp8_format="hybrid", schedule="interleaved")
    est = estimate(SMALL, plan, H100)
    # a chunk of 2 layers runs 8 FP8 GEMMs: 8 x 3 fp32 maxima forward (96 bytes), 8 x 2 backward
    # (64 bytes); a ring over the stage's 4 GPUs on one node: base + 2(n-1)(a + S/(nB))
    n, link = 4, H100.link("nvlink")
    base = H100.nccl_base_latency_s["ring"]["simple"]
    ring = [base + 2 * (n - 1) * (link.latency_s + s / (n * link.effective_Bps)) for s in (96, 64)]
    assert est.time["amax"] == pytest.approx(plan.num_microbatches * plan.vpp * sum(ring), rel=1e-9)
    bf16 = estimate(SMALL, ParallelPlan(tp=2, pp=2, dp=2, vpp=2, micro_batch_size=1, global_batch_size=8,
                                        sequence_parallel=True, schedule="interleaved"), H100)
    assert bf16.time["amax"] == 0.0
    # a stage of one GPU reduces nothing
    assert estimate(SMALL, ParallelPlan(pp=2, global_batch_size=4, fp8_format="hybrid"), H100).time["amax"] == 0.0
    assert est.time["step"] == pytest.approx(sum(v for k, v in est.time.items() if k != "step"))
