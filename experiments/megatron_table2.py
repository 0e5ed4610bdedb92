"""Question 7: reproduce Megatron-LM SC'21 Table 2 (PTD-P vs ZeRO-3).

Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC'21), Table 2 (numbers in ``../shared/REFERENCE.md``): A100-80GB, 8 per
DGX node, 8 × HDR InfiniBand; sequence 2048, vocabulary 51200.

* 174.6B (96 layers, h 12288, 96 heads), batch 1536: ZeRO-3 without model parallelism on
  384 / 768 / 1536 GPUs (micro-batch 4 / 2 / 1): 144 / 88 / 44 TFLOP/s per GPU; PTD-P with
  TP · PP = 96 (TP 8 × PP 12), micro-batch 1: 153 / 149 / 141.
* 529.6B (105 layers, h 20480, 128 heads), batch 2240: ZeRO-3 on 1120 / 2240 GPUs
  (micro-batch 2 / 1): 98 / 48; PTD-P with TP · PP = 280 (TP 8 × PP 35) on 560 / 1120 /
  2240 GPUs: 171 / 167 / 159.

TFLOP/s per GPU are the paper's (Eq. 3, full recompute counted):
F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) over the simulated iteration time and the GPUs.
Both schemes use full activation recompute; PTD-P runs the 1F1B schedule (its bubble
(p−1)/(m+p−1) explains the published decline with GPU count at fixed batch).

ZeRO-3 is simulated three ways, to find out why the default disagrees with the paper:
with NCCL-style rings (one ring per NIC, 8 per node) and one layer of prefetch; with one
NIC's bandwidth per ring; and with one NIC per ring and no prefetch (every gather exposed).
The analytic estimate (``sim.program.estimate``, which adds communication to compute without
overlap) is shown with 8 channels and with one (``dp_channels=1``).

    .venv/bin/python experiments/megatron_table2.py [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import dgx, md_table, one_nic_per_ring_cluster, parallel_map, parse_args, pyplot, run_summary, save  # noqa: E402,E501
from common import write_csv, write_json, write_verdict  # noqa: E402

from sim.program.estimate import estimate  # noqa: E402
from sim.inputs.hardware import load_profile  # noqa: E402
from sim.inputs.model import gpt, preset  # noqa: E402
from sim.inputs.plan import ParallelPlan  # noqa: E402

NAME = "megatron_table2"
PROFILE = "a100-80gb"
BUCKET = 4 * 10**9
# (model, scheme, GPUs, micro-batch, published TFLOP/s): Megatron-LM SC'21 Table 2 (REFERENCE.md)
PUBLISHED = [("175B", "ZeRO-3", 384, 4, 144), ("175B", "ZeRO-3", 768, 2, 88), ("175B", "ZeRO-3", 1536, 1, 44),
             ("175B", "PTD-P", 384, 1, 153), ("175B", "PTD-P", 768, 1, 149), ("175B", "PTD-P", 1536, 1, 141),
             ("530B", "ZeRO-3", 1120, 2, 98), ("530B", "ZeRO-3", 2240, 1, 48),
             ("530B", "PTD-P", 560, 1, 171), ("530B", "PTD-P", 1120, 1, 167), ("530B", "PTD-P", 2240, 1, 159)]
BATCH = {"175B": 1536, "530B": 2240}
PIPE = {"175B": (8, 12), "530B": (8, 35)}  # (TP, PP): TP·PP = 96 and 280
VARIANTS = ("8 NICs per ring, prefetch 1", "1 NIC per ring, prefetch 1", "1 NIC per ring, no prefetch")


def model_for(name: str, quick: bool):
    m = preset("gpt-175b" if name == "175B" else "gpt-530b")
    if quick:  # one layer per pipeline stage of the PTD-P plan: 12 of the 96 layers
        return gpt(f"{m.name}-12layers", 12, m.hidden_size, m.num_attention_heads, m.vocab_size, m.seq_length)
    return m


def megatron_flops(model, batch: int) -> float:
    """Megatron-LM SC'21 Eq. 3: FLOPs of one iteration with full recompute."""
    B, s, l, h, V = batch, model.seq_length, model.num_layers, model.hidden_size, model.vocab_size
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def plan_for(name: str, scheme: str, gpus: int, mb: int, depth: int = 1) -> ParallelPlan:
    if scheme == "ZeRO-3":
        return ParallelPlan(dp=gpus, micro_batch_size=mb, global_batch_size=BATCH[name], zero_stage=3,
                            recompute="full", bucket_size_bytes=BUCKET, zero3_prefetch_depth=depth)
    t, p = PIPE[name]
    return ParallelPlan(dp=gpus // (t * p), tp=t, pp=p, micro_batch_size=mb, global_batch_size=BATCH[name],
                        recompute="full", schedule="1f1b", bucket_size_bytes=BUCKET)


def simulate_point(point) -> dict:
    name, scheme, gpus, mb, published, variant, quick = point
    model = model_for(name, quick)
    profile = load_profile(PROFILE)
    nodes = gpus // 8
    depth = 0 if variant == VARIANTS[2] else 1
    plan = plan_for(name, scheme, gpus, mb, depth)
    topo = dgx("dgx-a100", nodes) if variant == VARIANTS[0] else one_nic_per_ring_cluster("dgx-a100", nodes)
    s = run_summary(model, plan, profile, topo, fidelity="reduced")
    T = s["iteration_time_s"]
    flops = megatron_flops(model, BATCH[name])
    row = {"model": name, "scheme": scheme, "gpus": gpus, "micro_batch": mb, "variant": variant,
           "published_tflops": published, "iteration_s": T, "sim_tflops": flops / T / gpus / 1e12,
           "bubble": s["bubble_fraction"], "exposed_zero_s": s["exposed_comm_s"]["zero"],
           "exposed_dp_s": s["exposed_comm_s"]["dp"], "exposed_tp_s": s["exposed_comm_s"]["tp"],
           "compute_s": s["compute_s"], "peak_memory_gb": s["memory"]["peak_bytes"] / 1e9, "fits": s["fits"]}
    row["delta_pct"] = (row["sim_tflops"] / published - 1) * 100
    if variant == VARIANTS[0]:
        for ch, key in ((None, "estimate_tflops"), (1, "estimate_1ch_tflops")):
            e = estimate(model, plan, profile, dp_channels=ch)
            row[key] = flops / e.time["step"] / gpus / 1e12
        if scheme == "PTD-P":
            p, m = plan.pp, plan.num_microbatches
            row["closed_bubble"] = (p - 1) / (m + p - 1)
    return row


def points(quick: bool) -> list:
    pts = []
    for name, scheme, gpus, mb, pub in PUBLISHED:
        if quick and name != "175B":
            continue
        variants = VARIANTS if scheme == "ZeRO-3" else VARIANTS[:1]
        pts += [(name, scheme, gpus, mb, pub, v, quick) for v in variants]
    return sorted(pts, key=lambda p: (p[1] != "PTD-P", -p[2]))


def plot(rows, path, quick) -> None:
    plt = pyplot()
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6.8 * max(2, len(models)), 5.6), squeeze=False)
    for ax, name in zip(axes[0], models):
        rs = [r for r in rows if r["model"] == name]
        for scheme, color in (("PTD-P", "#2ca02c"), ("ZeRO-3", "#d62728")):
            pub = sorted({(r["gpus"], r["published_tflops"]) for r in rs if r["scheme"] == scheme})
            ax.plot([g for g, _ in pub], [v for _, v in pub], "*-", color="black" if scheme == "PTD-P" else "gray",
                    ms=11, lw=1.5, label=f"{scheme} published")
            styles = {VARIANTS[0]: ("o-", 1.0), VARIANTS[1]: ("s--", 0.8), VARIANTS[2]: ("D:", 0.8)}
            for v, (st, alpha) in styles.items():
                sr = sorted((r for r in rs if r["scheme"] == scheme and r["variant"] == v), key=lambda r: r["gpus"])
                if sr:
                    ax.plot([r["gpus"] for r in sr], [r["sim_tflops"] for r in sr], st, color=color, alpha=alpha,
                            label=f"{scheme} sim, {v}" if scheme == "ZeRO-3" else f"{scheme} sim")
            est = sorted((r for r in rs if r["scheme"] == scheme and "estimate_1ch_tflops" in r),
                         key=lambda r: r["gpus"])
            if scheme == "ZeRO-3":
                ax.plot([r["gpus"] for r in est], [r["estimate_1ch_tflops"] for r in est], "x", color=color, ms=8,
                        mew=2, label="ZeRO-3 analytic estimate, 1 channel")
        gpus = sorted({r["gpus"] for r in rs})
        ax.set_xscale("log", base=2)
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.minorticks_off()
        ax.set_ylim(0, 300)
        ax.set_xlabel("GPUs (A100-80GB)")
        ax.set_ylabel("TFLOP/s per GPU (Megatron Eq. 3)")
        ax.set_title(f"{rs[0]['model']} model, batch {BATCH[name]}")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8.5, bbox_to_anchor=(0.5, -0.01))
    fig.suptitle("Megatron-LM SC'21 Table 2: PTD-P vs ZeRO-3, published (stars) vs simulated"
                 + (" (quick run: 12-layer models)" if quick else ""), fontsize=12)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    save(fig, path)


def _join(by_gpus: dict, key: str) -> str:
    return ", ".join(f"{by_gpus[g][key]:.0f}" for g in sorted(by_gpus))


def main(argv=None) -> dict:
    args = parse_args(NAME, __doc__, argv)
    rows = parallel_map(simulate_point, points(args.quick), args.workers)
    rows.sort(key=lambda r: (r["model"], r["scheme"], r["gpus"], VARIANTS.index(r["variant"])))
    write_csv(args.out / f"{NAME}.csv", rows)
    plot(rows, args.out / f"{NAME}.png", args.quick)

    def sel(scheme, variant):
        return [r for r in rows if r["scheme"] == scheme and r["variant"] == variant]

    stats = {}
    for scheme, variant in (("PTD-P", VARIANTS[0]),) + tuple(("ZeRO-3", v) for v in VARIANTS):
        d = [r["delta_pct"] for r in sel(scheme, variant)]
        stats[f"{scheme}: {variant}"] = {"mean_abs_delta_pct": sum(abs(x) for x in d) / len(d),
                                         "max_abs_delta_pct": max(abs(x) for x in d)}
    est1 = [(r["estimate_1ch_tflops"] / r["published_tflops"] - 1) * 100 for r in sel("ZeRO-3", VARIANTS[0])]
    stats["ZeRO-3: analytic estimate, 1 channel"] = {"mean_abs_delta_pct": sum(map(abs, est1)) / len(est1),
                                                      "max_abs_delta_pct": max(map(abs, est1))}
    crossover = {}
    for name in sorted({r["model"] for r in rows}):
        for v in VARIANTS:
            z = {r["gpus"]: r["sim_tflops"] for r in rows if r["model"] == name and r["scheme"] == "ZeRO-3"
                 and r["variant"] == v}
            p = {r["gpus"]: r["sim_tflops"] for r in rows if r["model"] == name and r["scheme"] == "PTD-P"}
            common = sorted(set(z) & set(p))
            crossover[f"{name}, {v}"] = [g for g in common if p[g] > z[g]]
    results = {"rows": rows, "stats": stats, "ptdp_wins_at": crossover}
    write_json(args.out / "results.json", results)

    # Why ZeRO-3 at fixed batch: per-GPU bytes per step are 3 x 2*Psi whatever the GPU count.
    implied = []
    for name, _, gpus, mb, pub in PUBLISHED:
        if _ != "ZeRO-3" or (args.quick and name != "175B"):
            continue
        model = model_for(name, args.quick)
        T_pub = megatron_flops(model, BATCH[name]) / (pub * 1e12 * gpus)
        implied.append({"model": name, "gpus": gpus, "published_s": T_pub,
                        "implied_GBps": 3 * 2 * model.num_params / T_pub / 1e9})
    z175 = {r["gpus"]: r for r in sel("ZeRO-3", VARIANTS[0]) if r["model"] == "175B"}
    z175b = {r["gpus"]: r for r in sel("ZeRO-3", VARIANTS[2]) if r["model"] == "175B"}
    p175 = {r["gpus"]: r for r in sel("PTD-P", VARIANTS[0]) if r["model"] == "175B"}
    lo, hi = min(p175), max(p175)
    st = stats
    answer = (
        f"PTD-P's trend reproduces, its level is high: simulated {_join(p175, 'sim_tflops')} TFLOP/s "
        f"per GPU for the 175B on {', '.join(str(g) for g in sorted(p175))} GPUs against the published "
        f"{_join(p175, 'published_tflops')} "
        f"(mean |Δ| {st['PTD-P: ' + VARIANTS[0]]['mean_abs_delta_pct']:.0f}% over every PTD-P row, nearly the "
        f"same in every row: the compute model, see the caveats); the decline with GPUs at fixed batch is the "
        f"1F1B bubble, (p−1)/(m+p−1) = {p175[lo]['closed_bubble'] * 100:.1f}% → "
        f"{p175[hi]['closed_bubble'] * 100:.1f}% (simulated {p175[lo]['bubble'] * 100:.1f}% → "
        f"{p175[hi]['bubble'] * 100:.1f}%). ZeRO-3 does not, with the simulator's default network: NCCL-style "
        f"rings through all 8 NICs hide the gathers under compute and give "
        f"{_join(z175, 'sim_tflops')} TFLOP/s for the 175B "
        f"(mean |Δ| {st['ZeRO-3: ' + VARIANTS[0]]['mean_abs_delta_pct']:.0f}%), nearly flat in the GPU count. "
        f"The published ZeRO-3 numbers say something else: at a fixed batch, ZeRO-3's bytes per GPU per step "
        f"(3 × 2Ψ) do not depend on the GPU count while the compute per GPU halves, and the published time per "
        f"iteration is {implied[1]['published_s']:.0f} s at 768 and {implied[2]['published_s']:.0f} s at 1536 "
        f"GPUs — communication-bound, at about {implied[2]['implied_GBps']:.0f} GB/s per GPU, less than one HDR "
        f"NIC (24 GB/s), where NCCL's rings reach 8 × 24. With one NIC's bandwidth per ring and no prefetch "
        f"(every gather exposed, as the estimate assumes) the simulator gives "
        f"{_join(z175b, 'sim_tflops')} "
        f"(mean |Δ| {st['ZeRO-3: ' + VARIANTS[2]]['mean_abs_delta_pct']:.0f}% over every ZeRO-3 row; the "
        f"analytic estimate with one channel {st['ZeRO-3: analytic estimate, 1 channel']['mean_abs_delta_pct']:.0f}%), "
        f"and the published trend. Crossover: with that ZeRO-3, PTD-P wins at "
        + "; ".join(f"{k.split(',')[0]}: {', '.join(map(str, v)) or 'no'} GPUs" for k, v in crossover.items()
                    if VARIANTS[2] in k)
        + " (published: PTD-P wins everywhere, by 6% at 384 GPUs and about 2× at 768 and more).")
    cols = [("model", "model", ""), ("scheme", "scheme", ""), ("gpus", "GPUs", ""), ("micro_batch", "b", ""),
            ("variant", "simulated network", ""), ("published_tflops", "published", ".0f"),
            ("sim_tflops", "simulated", ".0f"), ("delta_pct", "Δ%", "+.0f"),
            ("estimate_tflops", "estimate", ".0f"), ("estimate_1ch_tflops", "estimate 1 ch.", ".0f"),
            ("iteration_s", "iteration (s)", ".1f"), ("peak_memory_gb", "peak GB", ".0f")]
    body = (md_table(rows, cols) + "\n\nTime per iteration implied by the published ZeRO-3 numbers, and the "
            "per-GPU bandwidth it takes to move 3 × 2Ψ bytes in that time:\n\n"
            + md_table(implied, [("model", "model", ""), ("gpus", "GPUs", ""), ("published_s", "iteration (s)", ".1f"),
                                 ("implied_GBps", "3·2Ψ / iteration (GB/s per GPU)", ".1f")]))
    caveats = (
        "PTD-P's simulated TFLOP/s come out about 20% above the published ones in every row because the A100 profile's GEMM model is "
        "calibrated to the best large GEMM (86% of peak) and its elementwise kernels to 85% of HBM bandwidth; "
        "Megatron's measured kernels, launch gaps and the p2p scatter/gather are not in it. For ZeRO-3 the "
        "simulator's default (8 concurrent rings, prefetch overlapping gathers with compute) is what NCCL and "
        "a well-overlapped implementation could reach on this hardware; DeepSpeed's ZeRO-3 of 2021 evidently "
        "did not (per-parameter gathers, little overlap, one channel's worth of bandwidth), and the simulator "
        "cannot tell which of these it was. The 'one NIC per ring' runs give each of the 8 NICs 1/8 of its "
        "line rate (the same for ring traffic as one ring through one NIC). The paper does not say how "
        "many channels NCCL used or how DeepSpeed was configured, so these variants bracket, rather than "
        "identify, the cause.")
    write_verdict(args, title="7. Megatron-LM Table 2: PTD-P vs ZeRO-3", question=(
        "Can the simulator reproduce Megatron-LM SC'21 Table 2 (PTD-P vs ZeRO-3 for the 175B and 530B models "
        "on 384–2240 A100s): TFLOP/s per GPU beside the published ones, Δ% per row, and where the two cross?"),
        setup=("Table 2's configurations on DGX A100 clusters (8 × HDR per node, rail-optimized), full recompute, "
               "PTD-P with 1F1B; one GPU per pipeline stage simulated, the other data-parallel ranks shadow it "
               "in its collectives. TFLOP/s per GPU by the paper's Eq. 3 over the simulated iteration."),
        answer=answer, figures=[f"{NAME}.png"], body=body, caveats=caveats, headline=(
            f"PTD-P's bubble-driven decline reproduces, {st['PTD-P: ' + VARIANTS[0]]['mean_abs_delta_pct']:.0f}% "
            f"high in level; ZeRO-3 does "
            f"not with NCCL-style 8-NIC rings and prefetch (mean |Δ| "
            f"{st['ZeRO-3: ' + VARIANTS[0]]['mean_abs_delta_pct']:.0f}%), and does with one NIC per ring and no "
            f"overlap (mean |Δ| {st['ZeRO-3: ' + VARIANTS[2]]['mean_abs_delta_pct']:.0f}%): the published ZeRO-3 "
            f"is communication-bound at ~{implied[2]['implied_GBps']:.0f} GB/s per GPU."))
    return results


if __name__ == "__main__":
    main()
    print(f"wrote experiments/out/{NAME}/")
