"""PyTorch eager's CPU cost per op, measured on an MoE block's ops: the host side of a launch.

``sim.program.launch.HOST_LAUNCH_S`` is the CPU time PyTorch eager spends per kernel it
launches. Part of it can be measured without a GPU: the Python call, the autograd
recording (forward) and replay (backward), the ATen dispatcher and the op's own argument
handling are the same code whatever the device, and only the last step differs (a CPU
kernel here, the CUDA caching allocator and ``cudaLaunchKernel`` on a GPU).

This script runs the ops of one Megatron-Core-like MoE block, unfused, in eager PyTorch on
tiny CPU tensors (16 tokens, hidden 32, 16 experts, top-4, so that each CPU kernel's own
arithmetic is a few hundred floating-point operations): the router (score GEMM in fp32,
softmax, top-k, the routing map and probabilities, the auxiliary loss,
``megatron/core/transformer/moe/moe_utils.py``'s ``topk_softmax_with_capacity`` and
``switch_load_balancing_loss_func``), the permutation (``permute``: transposed map, token
indices by ``masked_select``, ``index_select``), the token counts copied to the host
(``tolist``), one GEMM pair and SwiGLU per expert (a grouped GEMM as per-expert kernels),
and the unpermutation (probabilities times outputs, ``scatter_add``). It counts the ATen
ops that run (a ``TorchDispatchMode``; view ops such as ``t``, ``select`` and ``split``
launch no kernel on a GPU and are counted apart) and times forward, forward without
autograd, and forward plus backward with the calling thread's CPU clock
(``time.thread_time``: time the thread ran, so other processes on a shared machine do not
count; the best of 9 rounds of 50 calls).

What it measures: CPU seconds per kernel-launching op of the eager path above the CUDA
driver, plus a CPU kernel of a few hundred flops (``torch.add`` of two 16 × 32 tensors
costs 1.3 µs in all, call included). What it does not: the CUDA caching allocator and
``cudaLaunchKernel`` (no GPU here), Transformer Engine's and Megatron-Core's Python around
their modules, and the CPU of a DGX (this machine's, printed by ``lscpu``). It is a lower
bound on the host cost of a launched kernel on such a CPU.

    python experiments/host_ops.py [--runs 5] [--out FILE.json]

Each run measures afresh (a new process state is not needed: the rounds already repeat);
the summary is the median over runs of each run's best round.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time

T, H, E, K = 16, 32, 16, 4
"""Tokens, hidden size, experts, top-k: tiny, so that the ops' own arithmetic is negligible."""
REPS, ROUNDS = 50, 9
CASES = ("forward", "forward_no_grad", "forward_backward")


def _counting_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        """Counts the ATen ops dispatched, and those that are views (no kernel on a GPU)."""

        def __init__(self):
            super().__init__()
            self.ops = 0
            self.views = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            self.views += bool(getattr(func, "is_view", False))
            return func(*args, **(kwargs or {}))

    return Count()


def moe_block(x, w_router, w1, w2):
    """One MoE block's ops, unfused, as Megatron-Core's eager path runs them (module doc)."""
    import torch
    import torch.nn.functional as F

    logits = F.linear(x.float(), w_router.float())
    scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    probs, top = torch.topk(scores, K, dim=1)
    routing_map = torch.zeros_like(logits).int().scatter(1, top, 1).bool()
    routing_probs = torch.zeros_like(logits).scatter(1, top, probs)
    tokens_per_expert = routing_map.sum(dim=0)
    aux = torch.sum(scores.sum(dim=0) * tokens_per_expert) * (E * 1e-3 / (K * T * T))
    rmap = routing_map.T.contiguous()
    idx = torch.arange(T).unsqueeze(0).expand(E, -1).masked_select(rmap)
    pprobs = routing_probs.T.contiguous().masked_select(rmap)
    permuted = x.index_select(0, idx)
    outs = []
    for e, chunk in enumerate(torch.split(permuted, tokens_per_expert.tolist())):
        a, b = torch.mm(chunk, w1[e]).chunk(2, dim=-1)
        outs.append(torch.mm(F.silu(a) * b, w2[e]))
    y = torch.cat(outs) * pprobs.unsqueeze(-1).to(x.dtype)
    out = torch.zeros_like(x).scatter_add(0, idx.unsqueeze(1).expand(-1, H), y)
    return out.sum() + aux


def _inputs():
    import torch

    g = torch.Generator().manual_seed(0)
    return (torch.randn(T, H, generator=g).requires_grad_(), torch.randn(E, H, generator=g).requires_grad_(),
            torch.randn(E, H, 2 * H, generator=g).requires_grad_(), torch.randn(E, H, H, generator=g).requires_grad_())


def _cpu_seconds(fn) -> tuple[float, float]:
    """(best, median) over ``ROUNDS`` rounds of the thread's CPU seconds per call of ``fn``."""
    for _ in range(10):
        fn()
    per = []
    for _ in range(ROUNDS):
        t0 = time.thread_time()
        for _ in range(REPS):
            fn()
        per.append((time.thread_time() - t0) / REPS)
    return min(per), statistics.median(per)


def _cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    keys = ("Model name", "CPU family", "Model", "Hypervisor vendor", "CPU(s)")
    return ", ".join(f"{k} {fields[k].strip()}" for k in keys if k in fields)


def measure() -> dict:
    import torch

    torch.set_num_threads(1)
    args = _inputs()

    def forward_backward():
        moe_block(*args).backward()

    forward_backward()  # (the first backward creates the gradients, later ones add to them: count those)
    with _counting_mode() as fwd:
        moe_block(*args)
    with _counting_mode() as both:
        forward_backward()

    def no_grad():
        with torch.no_grad():
            moe_block(*args)

    a, b = torch.randn(T, H), torch.randn(T, H)
    cases = {"forward": (lambda: moe_block(*args), fwd), "forward_no_grad": (no_grad, fwd),
             "forward_backward": (forward_backward, both)}
    out = {"torch": torch.__version__, "python": platform.python_version(), "cpu": _cpu_name(),
           "clock": "time.thread_time", "reps": REPS, "rounds": ROUNDS, "shape": {"T": T, "H": H, "E": E, "K": K}}
    for name, (fn, count) in cases.items():
        best, median = _cpu_seconds(fn)
        launching = count.ops - count.views
        out[name] = {"aten_ops": count.ops, "view_ops": count.views, "best_s": best, "median_s": median,
                     "per_launching_op_s": best / launching, "per_aten_op_s": best / count.ops}
    best, median = _cpu_seconds(lambda: torch.add(a, b))
    out["tiny_add"] = {"best_s": best, "median_s": median}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="measurements to take the median of (default 5)")
    ap.add_argument("--out", default=None, help="write the figures as JSON to this file")
    args = ap.parse_args(argv)
    runs = [measure() for _ in range(max(1, args.runs))]
    r = runs[0]
    print(f"torch {r['torch']}, python {r['python']}; {r['cpu']}; {len(runs)} runs")
    print(f"{'case':<18} {'aten ops':>8} {'views':>6} {'CPU/call':>10} {'per launching op (each run)':>40}")
    summary = {}
    for name in CASES:
        each = [x[name]["per_launching_op_s"] for x in runs]
        summary[name] = {"aten_ops": r[name]["aten_ops"], "view_ops": r[name]["view_ops"],
                         "best_s": statistics.median(x[name]["best_s"] for x in runs),
                         "per_launching_op_s": statistics.median(each)}
        c = summary[name]
        print(f"{name:<18} {c['aten_ops']:>8} {c['view_ops']:>6} {c['best_s'] * 1e6:>8.0f}us "
              f"{c['per_launching_op_s'] * 1e6:>8.2f}us ({', '.join(f'{v * 1e6:.2f}' for v in each)})")
    add = statistics.median(x["tiny_add"]["best_s"] for x in runs)
    print(f"torch.add of two {T}x{H} tensors: {add * 1e6:.2f} us")
    out = {k: r[k] for k in ("torch", "python", "cpu", "clock", "reps", "rounds", "shape")}
    out.update(median=summary, tiny_add_s=add, runs=runs)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    return out


if __name__ == "__main__":
    main()
