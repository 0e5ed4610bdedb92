"""A GPU under a power cap: ``--power-limit-w`` lowers the clock of compute-bound kernels.

A GPU's firmware holds its board power at or below the power limit by lowering the SM
clock (``nvidia-smi -pl`` sets the limit; NVML reports the throttling as "SW power cap").
Compute-bound kernels (GEMMs, attention) are the ones that reach the limit: at the
board's own limit (``power_limit_w``, the TDP) they sustain a clock f₀ at which their
draw meets it, and that clock is already inside the fitted ``sustained_compute_fraction``.

Dynamic CMOS power is C·V²·f, and across a GPU's DVFS range the voltage rises roughly in
step with the clock, so the power a compute-bound kernel draws at clock f is modelled as

    P(f) = P_idle + (P_limit − P_idle)·(f/f₀)^α        (α = ``power_clock_exponent``, 3)

(the cube law of dynamic power under voltage-frequency scaling; the idle power, clocks
up with no kernel, is the part that does not scale). Under a cap L between the idle
power and the limit, the clock settles where P(f) = L:

    f/f₀ = ((L − P_idle) / (P_limit − P_idle))^(1/α)

and compute-bound throughput scales with the clock, so ``capped`` multiplies
``sustained_compute_fraction`` by f/f₀. Memory-bound kernels follow the HBM clock, which
the cap does not move: they keep ``memory_efficiency``, and draw what they drew, at most
the cap (``sim.results.energy``). α = 3 is an assumption (the exponent is lower where
the voltage has reached its floor, at low clocks); a power-limit sweep of a GEMM
(throughput and ``power.draw`` at each ``nvidia-smi -pl``) measures it.
"""

from __future__ import annotations

from dataclasses import replace

from sim.inputs.hardware import HardwareProfile
from sim.inputs.rules import check_power_cap


def clock_ratio(profile: HardwareProfile, cap_w: float) -> float:
    """f/f₀: the SM clock of compute-bound kernels under a cap of ``cap_w`` watts relative to
    the clock at the board's limit (module doc); 1 at the limit."""
    idle, limit = profile.idle_power_w, profile.power_limit_w
    return ((cap_w - idle) / (limit - idle)) ** (1.0 / profile.power_clock_exponent)


def capped(profile: HardwareProfile, cap_w: float | None, flag: str = "--power-limit-w") -> HardwareProfile:
    """``profile`` under a power cap of ``cap_w`` watts (None: as it is): ``power_cap_w`` set and
    ``sustained_compute_fraction`` scaled by the clock ratio (relative to any cap it had).
    A cap above the board's limit or not above the idle power is a one-line ``InputError``."""
    if cap_w is None:
        return profile
    check_power_cap(profile, cap_w, flag)
    before = clock_ratio(profile, profile.power_cap_w) if profile.power_cap_w is not None else 1.0
    return replace(profile, power_cap_w=float(cap_w),
                   sustained_compute_fraction=profile.sustained_compute_fraction * clock_ratio(profile, cap_w) / before)
