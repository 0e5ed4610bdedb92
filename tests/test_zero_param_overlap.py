"""ZeRO-1/2 with the parameter all-gather overlapped with the next step's forward
(Megatron-LM ``--overlap-param-gather``, NeMo's ``overlap_param_sync``)."""

import pytest

from sim.cli import main
from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
SMALL = gpt("small", 8, 1024, 16, 1024, 512)


def _run(overlap, z=1, **kw):
    plan = ParallelPlan(dp=8, micro_batch_size=2, global_batch_size=64, zero_stage=z, param_gather_overlap=overlap,
                        **kw)
    return simulate_training(Job(SMALL, plan, H100, load_topology("dgx-h100")))


@pytest.mark.parametrize("z", [1, 2])
def test_each_bucket_is_gathered_before_its_first_forward_and_the_bytes_are_the_same(z):
    after, ahead = _run(False, z), _run(True, z)
    spans = ahead.trace.spans_of(0)
    gathers = [s for s in spans if s.name.startswith("param allgather")]
    # the same traffic as after the step (2Ψ, tp = pp = 1), moved into the forward
    before = [s for s in after.trace.spans_of(0) if s.name.startswith("param allgather")]
    assert sum(s.nbytes for s in gathers) == pytest.approx(2 * SMALL.num_params, rel=1e-12)
    assert sum(s.nbytes for s in gathers) == pytest.approx(sum(s.nbytes for s in before), rel=1e-12)
    # each layer's first forward starts after the gather holding it ends
    first_use = {}
    for s in spans:
        if s.category == "F" and s.layer is not None:
            first_use.setdefault(s.layer, s.start_s)
    ends = sorted(s.end_s for s in gathers)
    assert len(gathers) >= 2
    layers = sorted(first_use.items(), key=lambda kv: kv[1])
    assert layers[0][1] >= ends[0] - 1e-12  # nothing computes before the first bucket is in
    # and nothing is gathered after the optimizer step any more
    opt = next(s for s in spans if s.name == "optimizer")
    assert max(s.end_s for s in gathers) <= opt.start_s
    # hidden behind the forward but for the first bucket: the step is shorter
    assert ahead.trace.end_s < after.trace.end_s


def test_only_the_first_bucket_is_exposed_when_the_forward_outlasts_the_gathers():
    # Each later bucket is dispatched when the forward reaches the previous one; with a
    # forward much longer than a layer's gather (micro-batch 8, one layer per bucket) the
    # exposed parameter traffic is the first bucket's gather alone.
    from sim.results.metrics import rank_breakdown

    plan = ParallelPlan(dp=8, micro_batch_size=8, global_batch_size=64, zero_stage=1, param_gather_overlap=True)
    run = simulate_training(Job(SMALL, plan, H100, load_topology("dgx-h100")))
    gathers = sorted((s for s in run.trace.spans_of(0) if s.name.startswith("param allgather")),
                     key=lambda s: s.start_s)
    exposed = rank_breakdown(run.trace, 0)["exposed_comm_s"]["zero"]
    assert exposed == pytest.approx(gathers[0].end_s - gathers[0].start_s, rel=1e-6)


def test_the_plan_refuses_it_without_a_sharded_optimizer():
    for z in (0, 3):
        with pytest.raises(InputError, match="param_gather_overlap"):
            ParallelPlan(dp=8, zero_stage=z, param_gather_overlap=True)
    with pytest.raises(InputError, match="offload_optimizer"):
        ParallelPlan(dp=8, zero_stage=1, param_gather_overlap=True, offload_optimizer=True)


def test_the_cli_flag_needs_zero_1_or_2(capsys, tmp_path):
    out = tmp_path / "o"
    assert main(["run", "--model", "llama3-8b", "--gpus", "16", "--overlap-param-gather", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--overlap-param-gather: got True; needs zero 1 or 2 (got 0)" in err
    assert not out.exists()
