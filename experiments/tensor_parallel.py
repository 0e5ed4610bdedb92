"""Question 3: tensor parallelism inside NVLink vs across InfiniBand.

One GPT layer stack (Megatron's 22B shape: 48 layers, hidden 6144, 64 heads) split over
TP = 1, 2, 4, 8, 16 H100s, pipeline and data parallelism off, in two clusters:

* **NVLink**: DGX H100 nodes, the tensor-parallel group on consecutive GPUs, so TP ≤ 8
  stays inside a node's NVSwitch (370 GB/s effective per GPU) and TP = 16 spans two nodes
  (rings through their 8 NDR NICs);
* **InfiniBand**: one H100 per node with one NDR NIC (47.5 GB/s effective), so every
  tensor-parallel collective crosses the network.

Megatron's column/row split all-reduces the layer's activations twice in forward and
twice in backward: 4 all-reduces of S = 2·b·s·h bytes per layer and micro-batch, each
2(t−1)·(α + S/(t·B)) on a ring (closed form beside the simulation). They sit on the
critical path (the next GEMM needs them), so they add to the compute, which shrinks as
1/t; the communication per GPU grows as (t−1)/t · b·s·h — with the batch and sequence,
not only with the hidden size.

    .venv/bin/python experiments/tensor_parallel.py [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import GB, dgx, md_table, parallel_map, parse_args, pyplot, run_summary, save  # noqa: E402
from common import write_csv, write_json, write_verdict  # noqa: E402

from sim.inputs.hardware import load_profile  # noqa: E402
from sim.inputs.model import gpt, preset  # noqa: E402
from sim.inputs.plan import ParallelPlan  # noqa: E402

NAME = "tensor_parallel"
PROFILE = "h100-sxm"
FABRICS = ("NVLink (DGX H100)", "InfiniBand (1 GPU per node)")


def model_for(quick: bool):
    m = preset("gpt-22b")
    if quick:  # the same layer, 8 of the 48 layers
        return gpt("gpt-22b-8layers", 8, m.hidden_size, m.num_attention_heads, m.vocab_size, m.seq_length)
    return m


def topology(fabric: str, tp: int):
    if fabric == FABRICS[0]:
        return dgx("dgx-h100", max(1, tp // 8))
    return dgx("dgx-h100", tp, gpus=1, nics=1, name="h100-1gpu-ndr")


def closed_tp_seconds(model, tp: int, fabric: str, mb: int, m: int, profile) -> float:
    """4 ring all-reduces of 2·b·s·h bytes per layer per micro-batch (Megatron's f/g operators),
    each after NCCL's base latency of a ring under Simple (8.4 µs, ``baseLatencies`` in
    NVIDIA/nccl src/graph/tuning.cc), each of its 2(t−1) steps at NCCL's ring/Simple step
    latency (``hwLatencies``: 3.4 µs on NVLink, 14 µs across the network; a ring over N nodes
    has 2(N−1) network steps)."""
    if tp == 1:
        return 0.0
    e = profile.link_efficiencies()
    S = 2 * mb * model.seq_length * model.hidden_size
    steps, nvlink_s, net_s = 2 * (tp - 1), 3.4e-6, 14e-6
    if fabric == FABRICS[0] and tp <= 8:
        b, alpha = 450e9 * e["nvlink"], nvlink_s
    elif fabric == FABRICS[0]:  # 8 rings (one per NIC); a GPU's NVLink port carries all of them
        inter = 2 * (tp // 8 - 1)
        b = min(450e9 * e["nvlink"], 8 * min(63e9 * e["pcie"], 50e9 * e["ib"]))
        alpha = ((steps - inter) * nvlink_s + inter * net_s) / steps
    else:
        b, alpha = min(63e9 * e["pcie"], 50e9 * e["ib"]), net_s
    ar = 8.4e-6 + 2 * (tp - 1) * (alpha + S / (tp * b))  # NCCL's ring/Simple base latency + the ring
    return 4 * model.num_layers * m * ar


def tp_buffer_bytes(program, rank: int) -> float:
    """Bytes of every tensor-parallel collective buffer on ``rank`` in one iteration (from
    the program, so it holds whether the simulator runs them as transfers or prices them)."""
    return sum(a.nbytes for a in program.actions[rank] if a.category == "tp")


def simulate_point(point) -> dict:
    fabric, tp, mb, m, quick = point
    model = model_for(quick)
    profile = load_profile(PROFILE)
    plan = ParallelPlan(tp=tp, micro_batch_size=mb, global_batch_size=mb * m)
    s, run = run_summary(model, plan, profile, topology(fabric, tp), fidelity="reduced", keep_run=True,
                         nccl_algo="ring", nccl_protocol="simple")  # (the ring closed forms checked here)
    tokens = plan.global_batch_size * model.seq_length
    return {"fabric": fabric, "tp": tp, "micro_batch": mb, "m": m, "model": model.name,
            "iteration_s": s["iteration_time_s"], "compute_s": s["compute_s"],
            "exposed_tp_s": s["exposed_comm_s"]["tp"], "closed_tp_s": closed_tp_seconds(model, tp, fabric, mb, m, profile),
            "tokens_per_s_per_gpu": tokens / s["iteration_time_s"] / tp, "mfu": s["mfu"],
            "tp_bytes": tp_buffer_bytes(run.program, 0), "peak_memory_bytes": s["memory"]["peak_bytes"],
            "fits": s["fits"]}


def points(quick: bool) -> list:
    m = 2 if quick else 4
    tps = (1, 2, 8, 16) if quick else (1, 2, 4, 8, 16)
    pts = [(f, tp, 1, m, quick) for f in FABRICS for tp in tps if not (tp == 1 and f == FABRICS[1])]
    pts.append((FABRICS[0], 8, 2, m, quick))  # the batch dependence of the TP bytes
    return sorted(pts, key=lambda p: -p[1])


def plot(rows, path, quick) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    base = [r for r in rows if r["micro_batch"] == 1]
    t1 = next(r for r in base if r["tp"] == 1)
    colors = {FABRICS[0]: "#2ca02c", FABRICS[1]: "#d62728"}
    ax = axes[0]
    width = 0.38
    tps = sorted({r["tp"] for r in base})
    for i, f in enumerate(FABRICS):
        rs = {r["tp"]: r for r in base if r["fabric"] == f or r["tp"] == 1}
        xs = [k + (i - 0.5) * width for k in range(len(tps))]
        comp = [rs[t]["compute_s"] * 1e3 for t in tps]
        tp_ = [rs[t]["exposed_tp_s"] * 1e3 for t in tps]
        other = [max(0.0, (rs[t]["iteration_s"] - rs[t]["compute_s"] - rs[t]["exposed_tp_s"])) * 1e3 for t in tps]
        ax.bar(xs, comp, width, color="#8c8c8c", edgecolor="white", label="compute" if i == 0 else None)
        ax.bar(xs, tp_, width, bottom=comp, color=colors[f], label=f"exposed TP comm, {f}")
        ax.bar(xs, other, width, bottom=[a + b for a, b in zip(comp, tp_)], color="#c7c7c7", edgecolor="white",
               label="other (idle, optimizer)" if i == 0 else None)
    ax.set_xticks(range(len(tps)), [str(t) for t in tps])
    ax.set_ylim(0, max(r["iteration_s"] for r in base) * 1e3 * 1.45)
    ax.set_xlabel("tensor-parallel size t (GPUs)")
    ax.set_ylabel("iteration time (ms)")
    ax.set_title("Where the iteration goes\n(left bar NVLink, right bar InfiniBand)")
    ax.legend(loc="upper right")
    ax = axes[1]
    for f in FABRICS:
        rs = sorted((r for r in base if r["fabric"] == f or r["tp"] == 1), key=lambda r: r["tp"])
        ax.plot([r["tp"] for r in rs], [r["exposed_tp_s"] / r["iteration_s"] * 100 for r in rs], "o", color=colors[f],
                label=f"{f} (sim)")
        ax.plot([r["tp"] for r in rs], [r["closed_tp_s"] / r["iteration_s"] * 100 for r in rs], "--",
                color=colors[f], lw=1, label="closed form 4L·m·2(t−1)(α+S/(tB))")
    ax.set_xscale("log", base=2)
    ax.set_xticks(tps, [str(t) for t in tps])
    ax.set_xlabel("tensor-parallel size t (GPUs)")
    ax.set_ylabel("exposed TP communication (% of iteration)")
    ax.set_title("TP communication on the critical path")
    ax.legend(loc="upper left")
    ax = axes[2]
    for f in FABRICS:
        rs = sorted((r for r in base if r["fabric"] == f or r["tp"] == 1), key=lambda r: r["tp"])
        ax.plot([r["tp"] for r in rs], [r["tokens_per_s_per_gpu"] / t1["tokens_per_s_per_gpu"] * 100 for r in rs],
                "o-", color=colors[f], label=f)
    ax.axhline(100, color="black", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(tps, [str(t) for t in tps])
    ax.set_ylim(0, 110)
    ax.set_xlabel("tensor-parallel size t (GPUs)")
    ax.set_ylabel("throughput per GPU (% of TP = 1)")
    ax.set_title("Scaling efficiency of tensor parallelism")
    ax.legend(loc="lower left")
    fig.suptitle(f"Tensor parallelism of {t1['model']} on H100, micro-batch 1 × {t1['m']}"
                 + (" (quick run)" if quick else ""), fontsize=12)
    fig.tight_layout()
    save(fig, path)


def main(argv=None) -> dict:
    args = parse_args(NAME, __doc__, argv)
    rows = parallel_map(simulate_point, points(args.quick), args.workers)
    rows.sort(key=lambda r: (r["micro_batch"], r["fabric"], r["tp"]))
    for r in rows:
        r["exposed_tp_fraction"] = r["exposed_tp_s"] / r["iteration_s"]
    write_csv(args.out / f"{NAME}.csv", rows)
    plot(rows, args.out / f"{NAME}.png", args.quick)
    base = [r for r in rows if r["micro_batch"] == 1]
    t1 = next(r for r in base if r["tp"] == 1)
    nv = {r["tp"]: r for r in base if r["fabric"] == FABRICS[0]}
    ib = {r["tp"]: r for r in base if r["fabric"] == FABRICS[1]}
    mb2 = next(r for r in rows if r["micro_batch"] == 2)
    eff = {f: {t: r["tokens_per_s_per_gpu"] / t1["tokens_per_s_per_gpu"] for t, r in d.items()}
           for f, d in ((FABRICS[0], nv), (FABRICS[1], ib))}
    results = {"rows": rows, "efficiency": {f: {str(t): v for t, v in d.items()} for f, d in eff.items()},
               "tp_bytes_ratio_mb2_over_mb1": mb2["tp_bytes"] / nv[8]["tp_bytes"]}
    write_json(args.out / "results.json", results)
    top = max(nv)
    answer = (
        f"Inside NVLink, exposed TP communication grows from "
        f"{nv[2]['exposed_tp_fraction'] * 100:.0f}% of the iteration at t = 2 to "
        f"{nv[8]['exposed_tp_fraction'] * 100:.0f}% at t = 8, and per-GPU throughput falls to "
        f"{eff[FABRICS[0]][8] * 100:.0f}% of TP = 1 at t = 8 — the communication, and compute that does not "
        f"shrink as 1/t (t = 8 computes {nv[8]['compute_s'] / (t1['compute_s'] / 8):.2f}× the ideal 1/8: "
        f"smaller GEMMs, and norms and dropout replicated on every TP rank without sequence parallelism). "
        f"Across InfiniBand the same collectives take "
        f"{ib[2]['exposed_tp_fraction'] * 100:.0f}% of the iteration already at t = 2 and "
        f"{ib[8]['exposed_tp_fraction'] * 100:.0f}% at t = 8 (efficiency {eff[FABRICS[1]][2] * 100:.0f}% and "
        f"{eff[FABRICS[1]][8] * 100:.0f}%): a GPU's NVLink port is about 8× its NIC. So \"TP ≤ 8\" holds, "
        f"because 8 is the NVLink domain of a DGX node, not because of a property of TP: at t = {top} the group "
        f"spans two nodes and exposed TP is {nv[top]['exposed_tp_fraction'] * 100:.0f}% "
        f"(efficiency {eff[FABRICS[0]][top] * 100:.0f}%); on H100 with 8 NDR NICs per node NCCL-style rings "
        f"through all 8 NICs keep almost the NVLink bandwidth, so what grows is the 2(t−1) latency steps and "
        f"the fraction of communication: compute per GPU falls as 1/t while each GPU's bytes stay "
        f"2(t−1)/t·S. The TP bytes double when the micro-batch doubles (×{results['tp_bytes_ratio_mb2_over_mb1']:.2f} "
        f"at t = 8): TP traffic is proportional to b·s·h.")
    table = md_table([{**r, "eff": r["tokens_per_s_per_gpu"] / t1["tokens_per_s_per_gpu"] * 100,
                       "it_ms": r["iteration_s"] * 1e3, "tp_ms": r["exposed_tp_s"] * 1e3, "cf_ms": r["closed_tp_s"] * 1e3,
                       "mem": r["peak_memory_bytes"] / GB} for r in rows],
                     [("fabric", "fabric", ""), ("tp", "t", ""), ("micro_batch", "b", ""),
                      ("it_ms", "iteration (ms)", ".1f"), ("tp_ms", "exposed TP (ms)", ".1f"),
                      ("cf_ms", "closed-form TP (ms)", ".1f"), ("eff", "throughput/GPU vs t=1 (%)", ".0f"),
                      ("mem", "peak memory (GB)", ".0f"), ("fits", "fits 80 GB", "")])
    caveats = (
        "The seed answer's \"TP communication is proportional to hidden_size, not batch_size\" is wrong: each "
        "all-reduce moves the layer's activations, b·s·h elements, so it scales with the micro-batch and the "
        "sequence too (the simulation's TP bytes double with b). TP = 1 does not fit this model's "
        "16 bytes/parameter on an 80 GB GPU — TP is chosen for memory first — but its time is the reference "
        "for efficiency. The simulator runs TP collectives as rings without overlap with compute; real "
        "Megatron overlaps some TP communication (sequence-parallel all-gathers with GEMMs), which helps the "
        "NVLink case more than the InfiniBand one. GEMM efficiency at t = 16 (smaller shards) is part of the "
        "loss. The 1-GPU-per-node cluster is a thought experiment for \"TP across IB\"; across two DGX nodes "
        "the 8 NICs hide most of it on H100 (on A100 with HDR the NICs, 8×24 GB/s, are slower than NVLink).")
    write_verdict(args, title="3. Tensor parallelism: NVLink vs InfiniBand", question=(
        "How do iteration time and exposed TP communication change for TP = 1, 2, 4, 8, 16 of a fixed model, "
        "with the group inside NVLink and across InfiniBand — does \"TP ≤ 8\" hold, and why?"),
        setup=(f"{t1['model']} (hidden 6144, 64 heads, sequence 2048), micro-batch 1 × {t1['m']} micro-batches, "
               "no pipeline or data parallelism, H100 profile; classic Megatron TP (all-reduces, no sequence "
               "parallelism), no recompute."),
        answer=answer, figures=[f"{NAME}.png"], body=table, caveats=caveats, headline=(
            f"\"TP ≤ 8\" holds because 8 GPUs share a node's NVLink: at t = 8 exposed TP communication is "
            f"{nv[8]['exposed_tp_fraction'] * 100:.0f}% of the iteration inside NVLink vs "
            f"{ib[8]['exposed_tp_fraction'] * 100:.0f}% across InfiniBand (per-GPU throughput "
            f"{eff[FABRICS[0]][8] * 100:.0f}% vs {eff[FABRICS[1]][8] * 100:.0f}% of TP = 1); TP bytes scale with "
            f"b·s·h (×{results['tp_bytes_ratio_mb2_over_mb1']:.1f} for 2× micro-batch)."))
    return results


if __name__ == "__main__":
    main()
    print(f"wrote experiments/out/{NAME}/")
