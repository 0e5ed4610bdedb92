"""Fit the Blackwell GEMM model to XLA's cuBLAS throughput table for the B200.

OpenXLA keeps a table of cuBLAS GEMM throughputs per GPU for its cost model
(``xla/service/gpu/model/default_matmul_perf_table.txtpb``, entry ``sm_100_B200``, generated
by ``xla/tools/matmul_perf_table_gen``: each GEMM's kernel time on the GPU): FLOP/s for
b × m × n × k products with m, n, k in 256..4096, in BF16 (bf16 × bf16 -> bf16) and FP8
(e4m3 × e4m3 -> bf16). The H100 profile's k0 came from the same generator's sm_90 table
(``matmul_interpolator_data.h``); the Blackwell profiles took that k0 as an assumption. This
script fits the B200's own.

trainsim prices a GEMM (``sim.program.costs.op_time``) as its work at
``HardwareProfile.gemm_efficiency`` (the cap times the best tile's tile and wave quantization
times k / (k + k0)) plus a fixed time per kernel (``gemm_fixed_s``). It fits the cap, k0 and
the fixed time t0 by least squares on the log of the time over the table's shapes with
m·n >= 2048 × 2048 (b = 1; smaller outputs fill a fraction of the 148 SMs and are not the
shapes of training), then the cap and t0 with k0 held at the H100's 304, and prints each
shape's residual. With the fixed time free, the fitted k0 is the H100's within 5%; with it
held at the profiles' 3 µs per kernel (``kernel_launch_s``, an assumption), no k0 fits the
small shapes. The fitted cap is the table's own clock and kernels; the profiles keep the
best kernel measured alone (``gemm_max_efficiency``), and a training step's share of it is
fitted to runs (``sustained_compute_fraction``).

    python experiments/fit_gemm_xla.py
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from scipy.optimize import least_squares  # noqa: E402

from sim.inputs.hardware import load_profile  # noqa: E402

SOURCE = "openxla/xla xla/service/gpu/model/default_matmul_perf_table.txtpb @ 336bb15c, entry sm_100_B200, b = 1"
MEASURED = {  # (m, n, k) -> (BF16, FP8 e4m3) TFLOP/s
    (2048, 256, 256): (41.020, 52.093),
    (2048, 512, 256): (90.688, 88.505),
    (2048, 1024, 256): (165.267, 174.706),
    (2048, 2048, 256): (276.097, 293.613),
    (2048, 4096, 256): (406.105, 488.953),
    (2048, 256, 512): (86.467, 89.718),
    (2048, 512, 512): (162.099, 179.917),
    (2048, 1024, 512): (231.785, 329.672),
    (2048, 2048, 512): (470.115, 503.631),
    (2048, 4096, 512): (647.466, 818.323),
    (2048, 256, 1024): (150.090, 166.060),
    (2048, 512, 1024): (284.360, 314.235),
    (2048, 1024, 1024): (496.069, 504.519),
    (2048, 2048, 1024): (725.379, 970.614),
    (2048, 4096, 1024): (911.351, 1423.943),
    (2048, 256, 2048): (261.060, 305.735),
    (2048, 512, 2048): (466.034, 567.517),
    (2048, 1024, 2048): (760.373, 985.084),
    (2048, 2048, 2048): (985.763, 1427.730),
    (2048, 4096, 2048): (1172.847, 2035.168),
    (2048, 256, 4096): (397.094, 502.688),
    (2048, 512, 4096): (666.920, 855.997),
    (2048, 1024, 4096): (1017.704, 1484.735),
    (2048, 2048, 4096): (1208.488, 1955.814),
    (2048, 4096, 4096): (1342.544, 2491.280),
    (4096, 256, 256): (89.718, 84.520),
    (4096, 512, 256): (161.708, 169.413),
    (4096, 1024, 256): (271.113, 225.576),
    (4096, 2048, 256): (403.586, 487.123),
    (4096, 4096, 256): (514.706, 666.920),
    (4096, 256, 512): (160.884, 176.139),
    (4096, 512, 512): (287.944, 322.590),
    (4096, 1024, 512): (465.176, 538.892),
    (4096, 2048, 512): (652.334, 871.278),
    (4096, 4096, 512): (805.319, 1172.127),
    (4096, 256, 1024): (283.683, 312.816),
    (4096, 512, 1024): (490.573, 510.334),
    (4096, 1024, 1024): (715.649, 850.826),
    (4096, 2048, 1024): (913.823, 1332.186),
    (4096, 4096, 1024): (1075.624, 1895.396),
    (4096, 256, 2048): (458.766, 471.767),
    (4096, 512, 2048): (762.398, 979.468),
    (4096, 1024, 2048): (990.308, 1462.614),
    (4096, 2048, 2048): (1170.012, 1833.497),
    (4096, 4096, 2048): (1277.789, 2484.974),
    (4096, 256, 4096): (645.132, 861.751),
    (4096, 512, 4096): (991.451, 1484.992),
    (4096, 1024, 4096): (1204.928, 1951.814),
    (4096, 2048, 4096): (1343.542, 2499.435),
    (4096, 4096, 4096): (1416.867, 2764.982),}
H100_K0 = 304


def seconds(profile, m: int, n: int, k: int, dtype: str, fixed_s: float) -> float:
    """The kernel time trainsim prices for an m × n × k GEMM alone (sustained fraction 1)."""
    peak = profile.peak("fp8" if dtype == "fp8" else "bf16")
    return 2.0 * m * n * k / (peak * profile.gemm_efficiency(m, n, k, dtype=dtype)) + fixed_s


def fit(dtype: str, k0: float | None = None, fixed_s: float | None = None, min_output: int = 2048 * 2048) -> dict:
    """Least squares on log time over the shapes with m·n >= ``min_output``: the cap, and k0
    and the fixed time unless given."""
    base = dataclasses.replace(load_profile("b200"), sustained_compute_fraction=1.0)
    col = 0 if dtype == "bf16" else 1
    points = {s: 2.0 * s[0] * s[1] * s[2] / (v[col] * 1e12) for s, v in MEASURED.items() if s[0] * s[1] >= min_output}
    free = [name for name, given in (("k0", k0), ("t0", fixed_s)) if given is None]

    def unpack(x):
        got = dict(zip(["cap", *free], x))
        return got["cap"], got.get("k0", k0), got["t0"] * 1e-6 if "t0" in got else fixed_s

    def profile(cap, k0_):
        cap_field = "gemm_max_efficiency" if dtype == "bf16" else "fp8_gemm_max_efficiency"
        return dataclasses.replace(base, gemm_k_overhead=k0_, **{cap_field: cap})

    def residuals(x):
        cap, k0_, t0 = unpack(x)
        p = profile(cap, k0_)
        return np.array([math.log(seconds(p, *s, dtype, t0) / t) for s, t in points.items()])

    x0 = [0.75] + [{"k0": 300.0, "t0": 3.0}[f] for f in free]
    hi = [1.0] + [{"k0": 5000.0, "t0": 50.0}[f] for f in free]
    res = least_squares(residuals, x0=x0, bounds=([0.3] + [0.0] * len(free), hi))
    cap, k0_, t0 = unpack(res.x)
    return {"cap": cap, "k0": k0_, "t0": t0, "profile": profile(cap, k0_), "points": points,
            "rms": float(np.sqrt(np.mean(res.fun ** 2))), "max": float(np.max(np.abs(res.fun)))}


def main() -> None:
    print(f"{SOURCE}; shapes with m*n >= 2048 x 2048 (25), least squares on log time")
    ratio = load_profile("b200").peak("fp8") / load_profile("b200").peak("bf16")
    fixed_s = fit("bf16", k0=H100_K0)["t0"]
    print(f"  (FP8 k0 in FP8 k: the model's is BF16's k0 x the peak ratio, {ratio:.0f} x {H100_K0} = "
          f"{ratio * H100_K0:.0f})")
    for dtype in ("bf16", "fp8"):
        scale = ratio if dtype == "fp8" else 1.0
        for label, kw in (("k0 and fixed time free", {}), (f"k0 held at {scale * H100_K0:.0f}", {"k0": H100_K0}),
                          ("fixed time held at 3 us", {"fixed_s": 3e-6}),
                          (f"fixed time held at bf16's {fixed_s * 1e6:.2f} us", {"fixed_s": fixed_s})):
            if dtype == "bf16" and "bf16's" in label:
                continue
            got = fit(dtype, **kw)
            print(f"  {dtype} {label}: cap {got['cap']:.3f}, k0 {got['k0'] * scale:.0f}, fixed {got['t0'] * 1e6:.2f} us; "
                  f"rms {got['rms']:.3f}, max {got['max']:.3f}")
    got = fit("bf16", k0=H100_K0)
    print(f"bf16 at k0 {H100_K0}, fixed {got['t0'] * 1e6:.2f} us: measured / priced time per shape (m x n, by k)")
    for k in (256, 512, 1024, 2048, 4096):
        cells = [f"{m}x{n} {t / seconds(got['profile'], m, n, k, 'bf16', got['t0']):.2f}"
                 for (m, n, kk), t in got["points"].items() if kk == k]
        print(f"  k {k:>4}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
