"""Synthetic Kineto traces of a data-parallel job, for replay's speed benchmark and tests.

``data_parallel_job(ranks, kernels)`` writes what ``torch.profiler`` would record on each
rank of a plain data-parallel step: ``kernels`` compute kernels on the default stream
(GEMMs and elementwise kernels in turn, durations varying by rank as real ones do), and
after every ``bucket`` kernels a gradient all-reduce over all ranks on an NCCL stream,
ordered by ``cudaEventRecord`` / ``cudaStreamWaitEvent`` with their ``cuda_sync``
events, and a final ``cudaDeviceSynchronize`` inside one ``ProfilerStep#0``. Durations
come from a seeded generator: the same arguments give the same files.
"""

from __future__ import annotations

import random


def rank_trace(rank: int, ranks: int, kernels: int, bucket: int = 100, bucket_bytes: int = 25 * 2**20,
               seed: int = 0, device: str = "NVIDIA H100 80GB HBM3") -> dict:
    """One rank's trace dict (see the module doc)."""
    rng = random.Random(seed * 1_000_003 + rank)
    ev: list[dict] = []
    host, gpu7, gpu_nccl = 0.0, 0.0, 0.0
    corr = 0
    pid, tid = 1000 + rank, 1000 + rank

    def runtime(name, ts, dur=4.0):
        nonlocal corr
        corr += 1
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
                   "args": {"correlation": corr, "External id": corr}})
        return corr

    for k in range(kernels):
        host += rng.uniform(3.0, 8.0)
        c = runtime("cudaLaunchKernel", host)
        dur = rng.uniform(20.0, 200.0) if k % 2 == 0 else rng.uniform(5.0, 30.0)
        name = "sm90_xmma_gemm_bf16bf16_bf16f32" if k % 2 == 0 else "at::native::vectorized_elementwise_kernel"
        start = max(gpu7, host + 2.0)
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": start, "dur": dur,
                   "args": {"stream": 7, "correlation": c, "device": 0}})
        gpu7 = start + dur
        if (k + 1) % bucket == 0:
            host += 2.0
            rec = runtime("cudaEventRecord", host, 2.0)
            host += 3.0
            wait = runtime("cudaStreamWaitEvent", host, 2.0)
            host += 3.0
            c = runtime("cudaLaunchKernelExC", host)
            start = max(gpu_nccl, gpu7, host + 2.0)
            dur = rng.uniform(300.0, 400.0)
            ev.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 20, "ts": start,
                       "dur": 0, "args": {"cuda_sync_kind": "Stream Wait Event", "stream": 20, "wait_on_stream": 7,
                                          "wait_on_cuda_event_record_corr_id": rec, "correlation": wait,
                                          "device": 0}})
            ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pid": 0,
                       "tid": 20, "ts": start, "dur": dur,
                       "args": {"stream": 20, "correlation": c, "device": 0, "Collective name": "allreduce",
                                "In msg nelems": bucket_bytes // 2, "Out msg nelems": bucket_bytes // 2,
                                "dtype": "BFloat16", "Group size": ranks,
                                "Process Group Ranks": str(list(range(ranks))),
                                "Process Group Description": "DATA_PARALLEL_GROUP"}})
            gpu_nccl = start + dur
    host += 5.0
    end = max(gpu7, gpu_nccl)
    c = runtime("cudaDeviceSynchronize", host, max(1.0, end - host))
    step_end = max(host + max(1.0, end - host), end) + 1.0
    ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": pid, "tid": tid, "ts": 0.0,
               "dur": step_end, "args": {}})
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": ranks},
            "deviceProperties": [{"id": 0, "name": device}], "traceEvents": ev}


def data_parallel_job(ranks: int, kernels: int, **kw) -> list[dict]:
    """Every rank's trace dict (see the module doc)."""
    return [rank_trace(r, ranks, kernels, **kw) for r in range(ranks)]
