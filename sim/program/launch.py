"""Host-side kernel launches: where the CPU, not the GPU, sets the pace.

The host launches every kernel: PyTorch's eager path (Python, the autograd and ATen
dispatchers, the backend's algorithm choice, ``cudaLaunchKernel``) costs some
microseconds of CPU per op, ``HOST_LAUNCH_S``. Normally the host runs far ahead of the GPU
and the launches hide behind the kernels before them. They bind after a host
synchronisation: the host waits for the GPU to drain, then launches what follows one
kernel at a time, and a GPU whose kernels are shorter than their launches waits for each.
A mixture-of-experts layer has such a synchronisation in every forward (Megatron-Core's
token dispatchers copy the token counts to the host: the alltoall dispatcher before its
all-to-all, ``cuda_sync_point`` "before_ep_alltoall"; none with a capacity factor, which
the simulator runs as drop-and-pad, whose counts the host knows ("no_sync"); the allgather dispatcher's ``tokens_per_expert.cpu()`` after its
all-gather; DeepEP's dispatch, which waits on the host for the received count) and, after
it, many small kernels: Transformer Engine's grouped GEMM launches one cuBLAS GEMM per local
expert, and the unfused permutation a dozen PyTorch ops. Dense layers have no
synchronisation and are never bound here.

After a synchronisation that finds the GPU idle at time 0 the host issues kernel j at
j·c (c = ``HOST_LAUNCH_S``), and kernel j, g_j seconds on the GPU, starts when issued and
when kernel j − 1 is done:

    f_j = max(f_{j−1}, j·c) + g_j,   so   f_n = max over j of (j·c + g_j + ... + g_n)

(``issue_bound``). The program (``sim.program.segments``) puts the host on its own stream
(``HOST_STREAM``): from the synchronisation on, one host piece per compute segment lasts
its kernels' launches (a collective's launch counted in the piece after it), and the
segment's last kernel waits for its piece: the segment ends at max(its start + Σg, host
done + g_last), the j = n term of the closed form, the one that binds when launches are
slower than kernels. A CUDA graph over the MoE block (``sim.inputs.cuda_graphs``) removes
the synchronisation and the launches with it.
"""

from __future__ import annotations

HOST_LAUNCH_S = 6.71e-6
"""CPU seconds per kernel launched by PyTorch eager, measured: the median over five runs of
``experiments/host_ops.py`` (2026-12-06, torch 2.13.0 on CPU, one thread of an AMD EPYC
family 25 model 17 under KVM; ``experiments/measured/host-ops-2026-12-06.json``), which times
an unfused Megatron-Core-like MoE block's forward (router, permutation, per-expert GEMMs,
unpermutation) on tiny tensors with the thread's CPU clock: 6.71 µs per op that would launch
a kernel (its view ops, which launch none, counted in the time but not the ops). That is the
Python call, the autograd recording and the ATen dispatcher, plus a CPU kernel of a few
hundred flops (1.3 µs for a whole tiny ``torch.add``). Not in it: the CUDA caching allocator
and ``cudaLaunchKernel`` (1–3 µs on CUDA 12, "From PyTorch op to kernel launch",
jiahuanglin.xyz gpu_kernel_serving lesson 18), Transformer Engine's and Megatron-Core's
Python, and a DGX's own CPU. So a lower bound, measured, where the previous 5 µs was the low
end of that source's 5–25 µs, an assumption below what the measured part alone costs."""

HOST_STREAM = "cpu"
"""The stream host pieces run on (the host's, as ZeRO-Offload's optimizer step: not GPU
compute, so neither slowed nor counted as the GPU's compute)."""

LAUNCH_CATEGORY = "launch"
"""The category of host pieces (``sim.results.metrics`` leaves them out of compute)."""


def issue_bound(gpu_s, host_s: float) -> float:
    """Seconds from a synchronisation (GPU idle, host starting) until the last of kernels
    ``gpu_s`` (GPU seconds each, in order) is done when the host launches one every
    ``host_s``: max over j of (j·host_s + Σ_{i≥j} gpu_s[i]) (module doc)."""
    best, tail = 0.0, 0.0
    n = len(gpu_s)
    for j in range(n, 0, -1):
        tail += gpu_s[j - 1]
        best = max(best, j * host_s + tail)
    return best
