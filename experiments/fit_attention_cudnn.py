"""Fit the Blackwell profiles' attention kernel to cuDNN's own SDPA benchmark.

The profiles price Transformer Engine's fused attention, which on these GPUs is cuDNN's
SDPA kernel. NVIDIA's cudnn-frontend repository publishes that kernel's training-shape
throughput per GPU (``benchmark/sdpa_benchmark_training/artifacts/
sdpa_bf16_benchmark_results_NVIDIA_<GPU>.csv``, with the run's log beside it): batch 1, 128
query heads, 8 key/value heads, head dim 128, causal, BF16, forward and backward, sequence
length 512 to 131,072, TFLOP/s on the work done (the forward 2·s²·h·d, the backward 2.5
times it). The B200 and GB300 runs used cuDNN 9.13.0 (PyTorch 25.09 container,
``pyt_cudnn``), the version of the Megatron-Bridge 25.09 and 25.11 containers (9.13.x); the
GB200 run used 9.17.0 (``cudnn_fe``), a later and faster release, and is shown only for
comparison. The B200's earlier run of the same benchmark (the file @ cb560b92: PyTorch 25.06,
cuDNN 9.10.2) is within 2.2% of 9.13.0's at every length, forward and backward: the Blackwell
kernel did not change between those releases.

Each time is one call between two CUDA events on an idle GPU (``benchmark_single_sdpa.py``:
``start_event.record()``, the call, ``end_event.record()``, the median of 15 calls), so it
holds the call's host time before its kernel starts (PyTorch's SDPA dispatch and cuDNN graph
lookup; for the backward, autograd's) besides the kernel. A training step's host runs ahead
of its GPU, so that part is not the kernel's: each direction's time is fitted as a constant
t0 plus the kernel trainsim prices.

trainsim's attention model (``HardwareProfile.attention_efficiency``): the cap
``attention_max_efficiency`` times s / (s + k0), k0 = ``attention_k_overhead`` keys, over
the causal share of the work, times the causal and (backward) the backward relative
efficiency. This script fits the cap, k0, the backward's relative efficiency and the two t0
(the causal relative efficiency, 0.95, stays: a causal-only benchmark cannot separate it
from the cap) by least squares on the log of the time, over 2,048-32,768 tokens (training
lengths; beyond them the measured throughput falls again), and prints each point.

    python experiments/fit_attention_cudnn.py
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

SOURCE = ("NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/artifacts/"
          "sdpa_bf16_benchmark_results_NVIDIA_{gpu}.csv")
HEADS, HEAD_DIM = 128, 128
MEASURED = {  # GPU -> (cuDNN, commit, {tokens: (forward, backward) TFLOP/s on the work done})
    "b200": ("9.13.0", "bb37575d", {2048: (478.921, 371.486), 4096: (855.678, 701.265), 8192: (1171.278, 942.509),
                                    16384: (1332.415, 1074.776), 32768: (1419.000, 1108.688)}),
    "gb300": ("9.13.0", "bb37575d", {2048: (593.514, 487.345), 4096: (1144.867, 892.572),
                                     8192: (1495.674, 1130.076), 16384: (1702.463, 1267.827),
                                     32768: (1795.879, 1319.161)}),
    "gb200": ("9.17.0", "d48a60eb", {2048: (1069.0, 655.0), 4096: (1386.0, 1054.0), 8192: (1584.0, 1211.0),
                                     16384: (1668.0, 1304.0), 32768: (1681.0, 1348.0)}),
}


def kernel_s(profile, s: int) -> tuple[float, float]:
    """(forward, backward) seconds of the kernels ``profile`` prices for the benchmark's shape at
    the benchmark's clock (sustained fraction 1)."""
    p = dataclasses.replace(profile, sustained_compute_fraction=1.0)
    count = 4.0 * s * s * HEADS * HEAD_DIM  # trainsim's count (sim.program.workload); the backward twice it
    fwd = count / (p.peak("bf16") * p.attention_efficiency(s, s, HEAD_DIM, HEADS, mma_flops_per_score=4 * HEAD_DIM))
    bwd = 2 * count / (p.peak("bf16") * p.attention_efficiency(s, s, HEAD_DIM, HEADS, backward=True))
    return fwd, bwd


def measured_s(s: int, fwd_tflops: float, bwd_tflops: float) -> tuple[float, float]:
    """The benchmark's (forward, backward) seconds from its TFLOP/s on the work done."""
    work = 2.0 * s * s * HEADS * HEAD_DIM  # causal forward, as the benchmark counts it
    return work / (fwd_tflops * 1e12), 2.5 * work / (bwd_tflops * 1e12)


def fit(gpu: str) -> dict:
    base = load_profile(gpu)
    points = MEASURED[gpu][2]

    def with_(x):
        cap, k0, back = (float(v) for v in x[:3])
        return dataclasses.replace(base, attention_max_efficiency=cap, attention_k_overhead=k0,
                                   attention_backward_relative_efficiency=back)

    def residuals(x):
        p, t0 = with_(x), (x[3] * 1e-6, x[4] * 1e-6)
        out = []
        for s, (f, b) in points.items():
            kf, kb = kernel_s(p, s)
            mf, mb = measured_s(s, f, b)
            out += [math.log((kf + t0[0]) / mf), math.log((kb + t0[1]) / mb)]
        return np.array(out)

    res = least_squares(residuals, x0=[0.7, 500.0, 0.65, 50.0, 50.0],
                        bounds=([0.3, 0.0, 0.3, 0.0, 0.0], [1.0, 20000.0, 1.0, 1000.0, 1000.0]))
    cap, k0, back, t0f, t0b = (float(v) for v in res.x)
    return {"cap": cap, "k0": k0, "back": back, "t0": (t0f, t0b), "profile": with_(res.x),
            "rms": float(np.sqrt(np.mean(res.fun ** 2)))}


def main() -> None:
    for gpu, (cudnn, commit, points) in MEASURED.items():
        got = fit(gpu)
        t0f, t0b = got["t0"]
        print(f"{gpu} (cuDNN {cudnn}, {SOURCE.format(gpu=gpu.upper())} @ {commit}): attention_max_efficiency "
              f"{got['cap']:.4f}, attention_k_overhead {got['k0']:.0f}, attention_backward_relative_efficiency "
              f"{got['back']:.4f}; per-call t0 {t0f:.0f} us forward, {t0b:.0f} us backward; rms log error "
              f"{got['rms']:.3f}")
        now = load_profile(gpu)
        for s, (f, b) in points.items():
            mf, mb = measured_s(s, f, b)
            kf, kb = kernel_s(got["profile"], s)
            pf, pb = kernel_s(now, s)
            print(f"  {s:>6} tokens: forward {mf * 1e3:7.3f} ms measured, {(kf + t0f * 1e-6) * 1e3:7.3f} fitted "
                  f"(kernel {kf * 1e3:.3f}, profile {pf * 1e3:.3f}); backward {mb * 1e3:7.3f}, "
                  f"{(kb + t0b * 1e-6) * 1e3:7.3f} (kernel {kb * 1e3:.3f}, profile {pb * 1e3:.3f})")


if __name__ == "__main__":
    main()
