"""How long things take: pure cost functions of a ``HardwareProfile``.

An op's time is a roofline with measured efficiencies plus a fixed kernel overhead:

    t = max(flops / (peak · eff), bytes / (hbm_bandwidth · memory_efficiency)) + launch

where ``eff`` is the profile's shape-dependent GEMM efficiency for GEMMs, its
flash-attention efficiency for attention, and 1 against the non-tensor-core (``fp32``)
peak for elementwise kernels, which in practice are bound by the second term.

A transfer of n bytes over one link of a kind takes ``α + n / (β · efficiency)`` (the
profile's ``LinkModel``). The ring closed forms for collectives without contention,
used by the analytic estimate and by tests of the network model, are (n ranks, S the
nccl-tests buffer size, per-step latency α, effective bandwidth B)

    all-reduce                 2(n−1)·(α + S/(n·B))
    all-gather, reduce-scatter  (n−1)·(α + S/(n·B))

Nothing here knows about topology or contention: that is the network model's job.
"""

from __future__ import annotations

from sim.errors import require
from sim.inputs.hardware import HardwareProfile
from sim.program.workload import PHASES, Op, Work


def op_time(op: Op, profile: HardwareProfile, dtype: str = "bf16") -> float:
    """Seconds one op takes on one GPU of ``profile``."""
    if op.kind == "gemm":
        m, n, k = op.shape
        rate = profile.peak(dtype) * profile.gemm_efficiency(m, n, k, op.batch)
    elif op.kind == "attention":
        sq, sk, d = op.shape
        rate = profile.peak(dtype) * profile.attention_efficiency(sq, sk, d, op.batch)
    else:
        rate = profile.peak("fp32") if "fp32" in profile.peak_flops else profile.peak(dtype)
    compute = op.flops / rate if op.flops else 0.0
    memory = (op.bytes_read + op.bytes_written) / (profile.hbm_bandwidth_Bps * profile.memory_efficiency)
    return max(compute, memory) + profile.kernel_launch_s


def transfer_time(nbytes: float, kind: str, profile: HardwareProfile) -> float:
    """Seconds to send ``nbytes`` over one uncontended link of ``kind``."""
    require(nbytes >= 0, "transfer bytes", nbytes, "expected a size >= 0")
    return profile.link(kind).time(nbytes)


def collective_time(collective: str, nbytes: float, ranks: int, kind: str,
                    profile: HardwareProfile, channels: int = 1) -> float:
    """Ring closed form of a collective over ``ranks`` GPUs whose slowest hop is ``kind``.

    ``channels`` rings run at once (NCCL's channels), each over its own link of that kind
    (one NIC per GPU), so the bandwidth term divides by it; it never beats NVLink."""
    require(collective in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"),
            "collective", collective, "allowed: all_reduce, all_gather, reduce_scatter, send_recv")
    require(isinstance(ranks, int) and ranks > 0, "ranks", ranks, "expected an integer > 0")
    if collective == "send_recv":
        return transfer_time(nbytes, kind, profile)
    if ranks == 1:
        return 0.0
    link = profile.link(kind)
    bw = link.effective_Bps * max(1, channels)
    if channels > 1 and "nvlink" in profile.links:
        bw = min(bw, profile.link("nvlink").effective_Bps)
    steps = 2 * (ranks - 1) if collective == "all_reduce" else ranks - 1
    return steps * (link.latency_s + nbytes / (ranks * bw))


def work_times(work: Work, profile: HardwareProfile, tp: int = 1, tp_link: str = "nvlink",
               dtype: str = "bf16") -> dict:
    """Per phase ``(compute_s, tp_comm_s)`` of ``work`` on one rank of a tp group of ``tp``
    GPUs whose collectives run over ``tp_link`` without overlap."""
    out = {}
    for phase in PHASES:
        compute = sum(op_time(o, profile, dtype) for o in work.ops(phase))
        comm = sum(collective_time(c.collective, c.nbytes, tp, tp_link, profile)
                   for c in work.comms(phase)) if tp > 1 else 0.0
        out[phase] = (compute, comm)
    return out

