"""Where does an MoE layer's time go, per token dispatcher, on H100 and GB200?

One DeepSeek-V3 MoE layer (h 7,168, 256 routed experts of width 2,048, top-8, one shared
expert of width 2,048, multi-head latent attention) for one micro-batch of one 4,096-token
sequence on one GPU of 16: tp 1, expert parallelism 16 (16 local experts), balanced
routing, dropless, Megatron-Core's defaults (``--moe-permute-fusion`` off, the shared
experts not overlapped, no CUDA graphs). On H100 the 16 GPUs are two DGX H100 nodes
(rail-optimised InfiniBand between them); on GB200 they sit in one NVL72 rack (one NVLink
domain). Per dispatcher (``alltoall``, ``allgather``, ``flex`` = DeepEP) the MoE block's
kernels, forward, input gradient and weight gradient together, as ``trainsim explain``
prices them (``sim.results.explain``: each kernel's ``op_time`` on the paced profile, each
exchange's time alone over its group's slowest link), are summed into:

    router        the score GEMM, score function, top-k, aux loss and their gradients
    permutation   permute / unpermute (and the alltoall dispatcher's sort by local expert)
    experts       the grouped GEMMs and the activation (the routed experts)
    shared        the shared expert's GEMMs and activation
    exchange      the dispatch and combine collectives (nothing overlaps them here)
    host launch   the forward's launch bound beyond the GPU's time after the dispatcher's host
                  synchronisation, launched one by one onto an idle GPU (``sim.program.launch``;
                  an upper bound: the simulator lets the host catch up during the exchanges)

Prints the table, writes ``moe_kernels.png`` (stacked bars, one panel per GPU),
``moe_kernels.csv`` and ``results.json`` under ``experiments/out/moe_kernels/``. About ten
seconds.

    python experiments/moe_kernels.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import parse_args, pyplot, save, write_csv, write_json  # noqa: E402
from sim.inputs.hardware import load_profile  # noqa: E402
from sim.inputs.model import preset  # noqa: E402
from sim.inputs.plan import ParallelPlan  # noqa: E402
from sim.results.explain import explain  # noqa: E402

NAME = "moe_kernels"
GPUS = (("H100", "h100-sxm", 8), ("GB200", "gb200", 72))  # (label, profile, GPUs per NVLink domain)
DISPATCHERS = ("alltoall", "allgather", "flex")
PARTS = ("router", "permutation", "experts", "shared", "exchange", "host launch")
COLORS = {"router": "#8c564b", "permutation": "#ff7f0e", "experts": "#1f77b4", "shared": "#17becf",
          "exchange": "#d62728", "host launch": "#7f7f7f"}


def _part_of(row: dict) -> str | None:
    name = row["name"]
    if not name.startswith("moe."):
        return None
    if row["kind"].endswith(" comm"):
        return "shared" if name.startswith("moe.shared.") else "exchange"
    if name.startswith("moe.router"):
        return "router"
    if name.startswith("moe.shared."):
        return "shared"
    if name.startswith("moe.experts."):
        return "experts"
    return "permutation"


def breakdown(gpu: str, dispatcher: str, gpus_per_domain: int) -> dict:
    """Seconds per part of one MoE layer (F + B + W) on one GPU (module doc)."""
    model = preset("deepseek-v3")
    plan = ParallelPlan(dp=16, ep=16, global_batch_size=16, dispatcher=dispatcher)
    report = explain(model, plan, load_profile(gpu), gpus_per_node=gpus_per_domain)
    part = report["parts"]["moe layer"]
    out = dict.fromkeys(PARTS, 0.0)
    for row in part["rows"]:
        p = _part_of(row)
        if p is not None:
            out[p] += row["time_s"]
    launch = part["launch"]
    out["host launch"] = max(0.0, launch["issue_bound_s"] - launch["gpu_s"]) if launch else 0.0
    return out


def main(argv=None) -> dict:
    args = parse_args(NAME, __doc__, argv)
    rows = []
    for label, gpu, domain in GPUS:
        for d in DISPATCHERS:
            b = breakdown(gpu, d, domain)
            rows.append({"gpu": label, "dispatcher": d, **{f"{p}_ms": b[p] * 1e3 for p in PARTS},
                         "total_ms": sum(b.values()) * 1e3})
    head = f"{'gpu':<7}{'dispatcher':<11}" + "".join(f"{p:>13}" for p in PARTS) + f"{'total':>10}"
    print("one DeepSeek-V3 MoE layer, one 4,096-token micro-batch, ep 16, ms per GPU (forward + backward)")
    print(head)
    for r in rows:
        print(f"{r['gpu']:<7}{r['dispatcher']:<11}" + "".join(f"{r[p + '_ms']:>13.3f}" for p in PARTS)
              + f"{r['total_ms']:>10.3f}")
    write_csv(args.out / f"{NAME}.csv", rows)
    write_json(args.out / "results.json", {"rows": rows})
    plt = pyplot()
    fig, axes = plt.subplots(1, len(GPUS), figsize=(11, 3.6), sharex=True)
    for ax, (label, _, _) in zip(axes, GPUS):
        mine = [r for r in rows if r["gpu"] == label]
        left = [0.0] * len(mine)
        ys = list(range(len(mine)))[::-1]
        for p in PARTS:
            widths = [r[p + "_ms"] for r in mine]
            ax.barh(ys, widths, left=left, color=COLORS[p], label=p)
            left = [a + w for a, w in zip(left, widths)]
        ax.set_yticks(ys, [r["dispatcher"] for r in mine])
        ax.set_title(f"{label} ({'2 DGX nodes' if label == 'H100' else 'one NVL72 rack'})", fontsize=10)
        ax.set_xlabel("ms per MoE layer and micro-batch (F + B + W)")
    axes[-1].legend(loc="center right", fontsize=8)  # the GB200 panel has the room
    fig.suptitle("DeepSeek-V3 MoE layer on 16 GPUs, ep 16: where the time goes per token dispatcher", fontsize=11)
    save(fig, args.out / f"{NAME}.png")
    return {"rows": rows}


if __name__ == "__main__":
    main()
