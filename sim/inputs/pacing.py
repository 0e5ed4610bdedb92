"""The slowest GPU paces a synchronous step: ``HardwareProfile.gpu_speed_spread``.

GPUs of one type are not equally fast: manufacturing variability and power management
put their sustained clocks apart (Sinha et al., "Not All GPUs Are Created Equal", SC'22:
8% average performance variation, at most 22%, between GPUs of one SKU in one cluster,
outliers up to 1.5x slower than the median). A training step is synchronous: tensor-
parallel peers meet every layer, pipeline stages every micro-batch, data-parallel
replicas at the gradient reduction, so each step waits for its slowest GPU.

With each GPU's speed drawn from a normal distribution of mean 1 and spread σ (its
standard deviation over the mean), the slowest of N GPUs is expected to run at

    1 − σ·e(N),   e(N) = E[max of N independent standard normals]
                       = ∫ x·N·φ(x)·Φ(x)^(N−1) dx

(e(1) = 0, e(2) = 1/√π, e(3) = 3/(2√π); e(128) ≈ 2.6, e(2,048) ≈ 3.4, e(16,384) ≈ 3.9).
``paced`` gives a profile whose compute-bound kernels (GEMMs and attention, the kernels
the SM clock sets; memory-bound kernels follow the HBM clock, which does not move) run at
that speed: every GPU of the simulated job runs as fast as its expected slowest, the
others' waits being what a synchronous step would make of them. A one-GPU job is
unchanged, as is a profile with σ = 0. The spread is fitted to published runs of many
sizes (``trainsim fit --params gpu_speed_spread,...``), so it also takes in whatever else
slows a step as the maximum over its GPUs does (per-step jitter, a slow link).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from sim.inputs.hardware import HardwareProfile


@lru_cache(maxsize=1024)
def expected_max_normal(n: int) -> float:
    """e(n): the expected largest of ``n`` independent standard normal draws (0 for n = 1)."""
    if n < 1:
        raise ValueError(f"n: got {n!r}; expected an integer >= 1")
    if n == 1:
        return 0.0
    # E[max] = ∫_0^∞ (1 − Φ(x)^n) dx − ∫_−∞^0 Φ(x)^n dx, both integrands smooth and bounded
    from scipy import integrate, special  # (here: SciPy costs a third of a second to import)

    upper, _ = integrate.quad(lambda x: -special.expm1(n * special.log_ndtr(x)), 0.0, 40.0, limit=200)
    lower, _ = integrate.quad(lambda x: special.ndtr(x) ** n, -40.0, 0.0, limit=200)
    return upper - lower


def slowest_speed(sigma: float, gpus: int) -> float:
    """The expected slowest of ``gpus`` GPUs' speed relative to the mean one: 1 − σ·e(gpus)."""
    return 1.0 - sigma * expected_max_normal(gpus)


def paced(profile: HardwareProfile, gpus: int) -> HardwareProfile:
    """``profile`` as a synchronous job on ``gpus`` GPUs runs it: compute-bound kernels at the
    expected slowest GPU's speed (``sustained_compute_fraction`` times ``slowest_speed``), and
    no spread left to apply again."""
    if not profile.gpu_speed_spread or gpus <= 1:
        return profile
    # kept on the profile object (as its hash is, ``HardwareProfile.__hash__``): a search paces
    # one profile for thousands of plans, and each new copy would be validated and hashed afresh
    # by every cache keyed on a profile
    kept = profile.__dict__.setdefault("_paced", {})
    if gpus not in kept:
        kept[gpus] = replace(profile, sustained_compute_fraction=profile.sustained_compute_fraction
                             * slowest_speed(profile.gpu_speed_spread, gpus), gpu_speed_spread=0.0)
    return kept[gpus]
