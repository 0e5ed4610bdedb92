"""Megatron-Core DDP's per-bucket kernels before the gradient collective (``sim.program.training.grad_prep``)."""

from types import SimpleNamespace

import pytest

from sim.inputs.hardware import load_profile
from sim.inputs.plan import ParallelPlan
from sim.program.training import grad_prep


def _prep(**kw):
    profile = load_profile("b200")
    plan = ParallelPlan(**{"dp": 8, "global_batch_size": 8, **kw})
    return profile, (lambda experts: grad_prep(SimpleNamespace(plan=plan, profile=profile), experts))


def test_megatron_lm_defaults_norm_and_scale_every_bucket():
    # Megatron-LM: the NaN check's norm (1 read) and the 1/dp scaling in place (read + write):
    # 3 bytes per gradient byte, two kernels.
    profile, prep = _prep()
    nb = 256e6
    rate = profile.hbm_bandwidth_Bps * profile.memory_efficiency
    assert prep(False)(nb) == pytest.approx(3 * nb / rate + 2 * profile.kernel_launch_s, rel=1e-12)


def test_average_in_collective_leaves_dense_buckets_the_norm_and_scales_experts_by_one_over_ep():
    profile, prep = _prep(ddp_average_in_collective=True, ep=4)
    nb = 100e6
    rate = profile.hbm_bandwidth_Bps * profile.memory_efficiency
    assert prep(False)(nb) == pytest.approx(nb / rate + profile.kernel_launch_s, rel=1e-12)
    assert prep(True)(nb) == pytest.approx(3 * nb / rate + 2 * profile.kernel_launch_s, rel=1e-12)
    # without experts parallel the experts' factor is 1: only the norm
    profile, prep = _prep(ddp_average_in_collective=True)
    assert prep(True)(nb) == pytest.approx(nb / rate + profile.kernel_launch_s, rel=1e-12)


def test_nothing_without_either_pass_or_outside_megatron_core_ddp():
    _, prep = _prep(ddp_average_in_collective=True, check_for_nan_in_grad=False)
    assert prep(False) is None
    _, prep = _prep(framework="torchtitan", zero_stage=3)
    assert prep(False) is None
    _, prep = _prep(zero_stage=3)  # Megatron-FSDP: another code path
    assert prep(False) is None
