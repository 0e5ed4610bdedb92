"""Question: DeepSeek-V3 on 1,024 H100: which EP, PP and dispatcher, and what does node-limited routing save?

DeepSeek-V3 (61 layers, 58 of them MoE with 256 routed experts, top-8, and one shared
expert) on 128 DGX H100 nodes (1,024 GPUs, rail-optimized InfiniBand), tp 2 with sequence
parallelism, etp 1, ZeRO-1 (Megatron's distributed optimizer), micro-batches of one
4,096-token sequence, balanced routing, global batch ``GBS`` sequences; the layers that do
not divide pp are split by ``--layer-split auto`` (the balanced split). A grid over the
expert-parallel size (8, 16, 32, 64), the pipeline depth (4, 8, 16) and Megatron-Core's
token dispatcher (``--moe-token-dispatcher-type``: alltoall, allgather, flex = DeepEP;
``sim.program.dispatch``) gives each plan's iteration time, exposed expert-parallel
communication and peak memory per GPU. Then, on the fastest plan whose expert-parallel
group spans more nodes than a token may reach, the alltoall and flex dispatchers run again
without DeepSeek-V3's group-limited routing (the preset's ``--moe-router-num-groups 8
--moe-router-group-topk 4``: each token's 8 experts come from at most 4 of 8 expert groups;
without it, top-8 of all 256).

What group-limited routing changes (``sim.program.routing``): with ep ranks spread over
nodes, a token's k copies land on up to k nodes; limited to M groups, and a group's experts
living on one node once ep spans the groups, it reaches at most M nodes. The run summary's
``moe.dispatch_cross_node_bytes`` counts the dispatch bytes per rank, MoE layer and
micro-batch that leave the rank's node as copies (what the alltoall dispatcher sends: one
copy per routed expert), ``..._dedup`` once per node reached (what flex sends over
InfiniBand). Under balanced routing every expert is equally likely, so the copies leaving
the node are T·k·(1 − n_local/E) of T tokens whichever way the groups limit them (the closed
form the test checks); only the deduplicated bytes fall, and only flex's time sees it.

    .venv/bin/python experiments/moe_layout.py [--quick]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import GB, dgx, md_table, parallel_map, parse_args, pyplot, run_summary, save  # noqa: E402
from common import write_csv, write_json, write_verdict  # noqa: E402
from report import number_of  # noqa: E402

from sim.inputs.experts import Folding  # noqa: E402
from sim.inputs.hardware import load_profile  # noqa: E402
from sim.inputs.model import preset  # noqa: E402
from sim.inputs.plan import ParallelPlan  # noqa: E402
from sim.program.stage_balance import auto_layer_split  # noqa: E402
from sim.results.moe_report import moe_report  # noqa: E402

NAME = "moe_layout"
PROFILE = "h100-sxm"
TP = 2
GBS = 2048
DISPATCHERS = ("alltoall", "allgather", "flex")
DISPATCHER_COLORS = {"alltoall": "#1f77b4", "allgather": "#7f7f7f", "flex": "#d62728"}
PP_MARKERS = {2: "s", 4: "o", 8: "^", 16: "D"}


def setup(quick: bool) -> dict:
    """The model, cluster and grid: DeepSeek-V3 on 1,024 GPUs, or in ``--quick`` a 7-layer
    DeepSeek-V3 with 64 experts on 64 GPUs (8 nodes), still group-limited 4 of 8 groups."""
    m = preset("deepseek-v3")
    if quick:
        m = replace(m, name="deepseek-v3-7layers-64experts", num_layers=7, num_experts=64, mtp_num_layers=0)
        return {"model": m, "nodes": 8, "gbs": 64, "eps": (8, 16), "pps": (2, 4), "dispatchers": DISPATCHERS}
    return {"model": m, "nodes": 128, "gbs": GBS, "eps": (8, 16, 32, 64), "pps": (4, 8, 16), "dispatchers": DISPATCHERS}


def ungrouped(model):
    """The model routed top-k over all its experts (no group limit)."""
    return replace(model, name=f"{model.name}-ungrouped", moe_router_num_groups=None, moe_router_group_topk=None)


def simulate_point(point) -> dict:
    ep, pp, quick, grouped, dispatcher = point
    cfg = setup(quick)
    model = cfg["model"] if grouped else ungrouped(cfg["model"])
    profile = load_profile(PROFILE)
    gpus = 8 * cfg["nodes"]
    plan = ParallelPlan(dp=gpus // (TP * pp), tp=TP, pp=pp, ep=ep, etp=1, sequence_parallel=True, zero_stage=1,
                        global_batch_size=cfg["gbs"], layer_split="auto", dispatcher=dispatcher)
    plan = auto_layer_split(model, plan, profile)
    s, run = run_summary(model, plan, profile, dgx("dgx-h100", cfg["nodes"]), fidelity="reduced", keep_run=True)
    moe = moe_report(run, s)
    nodes = [run.topology.node_of(r) for r in Folding(run.plan).ep_group(0)]
    return {"ep": ep, "pp": pp, "dispatcher": dispatcher, "grouped": grouped, "model": model.name, "gpus": gpus, "dp": plan.dp,
            "m": plan.num_microbatches, "layer_split": "-".join(map(str, plan.layer_split)),
            "iteration_s": s["iteration_time_s"], "compute_s": s["compute_s"], "mfu": s["mfu"],
            "bubble_fraction": s["bubble_fraction"], "exposed_ep_s": s["exposed_comm_s"].get("ep", 0.0),
            "exposed_tp_s": s["exposed_comm_s"].get("tp", 0.0), "peak_gb": s["memory"]["peak_bytes"] / GB,
            "capacity_gb": s["memory_capacity_bytes"] / GB, "fits": s["fits"],
            "ep_nodes": len(set(nodes)),
            "cross_node_bytes": moe.get("dispatch_cross_node_bytes", 0.0),
            "cross_node_bytes_dedup": moe.get("dispatch_cross_node_bytes_dedup", 0.0),
            "tokens_per_rank": plan.micro_batch_size * model.seq_length // TP, "topk": model.moe_router_topk,
            "experts": model.num_experts, "hidden": model.hidden_size}


def closed_copies_bytes(r: dict) -> float:
    """Balanced routing's dispatch bytes per rank leaving its node, as copies: T·k tokens, each
    copy to an expert off the node with probability 1 − (experts on the rank's node)/E."""
    local = r["experts"] // r["ep"] * (r["ep"] // r["ep_nodes"])
    return r["tokens_per_rank"] * r["topk"] * (1 - local / r["experts"]) * 2 * r["hidden"]


def _log_seconds(ax) -> None:
    """A log-scale y axis of seconds, labelled as plain numbers."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7.5)


def plot(rows, res, path, quick) -> None:
    plt = pyplot()
    grid = [r for r in rows if r["grouped"]]
    eps = sorted({r["ep"] for r in grid})
    pps = sorted({r["pp"] for r in grid})
    ds = [d for d in DISPATCHERS if any(r["dispatcher"] == d for r in grid)]
    by = {(r["ep"], r["pp"], r["dispatcher"]): r for r in grid}
    fig, axes = plt.subplots(2, 2, figsize=(14, 10.5))
    ax = axes[0][0]
    for d in ds:
        for pp in pps:
            rs = [by[(ep, pp, d)] for ep in eps]
            ax.plot(eps, [r["iteration_s"] for r in rs], "-", color=DISPATCHER_COLORS[d], lw=1, alpha=0.6)
            for r in rs:
                ax.plot(r["ep"], r["iteration_s"], PP_MARKERS[pp], color=DISPATCHER_COLORS[d], ms=6,
                        mfc=DISPATCHER_COLORS[d] if r["fits"] else "white")
    best = res["best"]
    ax.annotate(f"fastest that fits: {best['dispatcher']},\nep {best['ep']}, pp {best['pp']}, {best['iteration_s']:.2f} s",
                xy=(best["ep"], best["iteration_s"]), xytext=(0.97, 0.04), textcoords="axes fraction", fontsize=8.5,
                ha="right", arrowprops={"arrowstyle": "->", "lw": 0.8})
    ax.set_xscale("log", base=2)
    _log_seconds(ax)
    ax.set_xticks(eps, [str(e) for e in eps])
    ax.set_xlabel("expert-parallel size")
    ax.set_ylabel("iteration time (s, log scale)")
    ax.set_title(f"Iteration time (hollow: over the {grid[0]['capacity_gb']:.0f} GB of a GPU)")
    from matplotlib.lines import Line2D

    ax.legend(handles=[Line2D([], [], color=DISPATCHER_COLORS[d], lw=2, label=d) for d in ds]
              + [Line2D([], [], marker=PP_MARKERS[pp], color="black", ls="", label=f"pp {pp}") for pp in pps],
              loc="upper left", ncol=2, fontsize=8.5)
    ax = axes[0][1]
    for d in ds:
        rs = [min((by[(ep, pp, d)] for pp in pps), key=lambda r: r["iteration_s"]) for ep in eps]
        ax.plot(eps, [r["exposed_ep_s"] for r in rs], "o-", color=DISPATCHER_COLORS[d], label=d)
    ax.set_xscale("log", base=2)
    _log_seconds(ax)
    ax.set_xticks(eps, [str(e) for e in eps])
    ax.set_xlabel("expert-parallel size")
    ax.set_ylabel("exposed expert-parallel communication (s, log scale)")
    ax.set_title("Exposed token exchange per iteration (each at its best pp)")
    ax.legend(loc="best")
    ax = axes[1][0]
    g, u = res["routing"]["grouped"], res["routing"]["ungrouped"]
    labels = ["copies\n(alltoall)", "once per node\n(flex, DeepEP)"]
    vals_u = [u["cross_node_bytes"] / 1e6, u["cross_node_bytes_dedup"] / 1e6]
    vals_g = [g["cross_node_bytes"] / 1e6, g["cross_node_bytes_dedup"] / 1e6]
    x = range(2)
    ax.bar([i - 0.2 for i in x], vals_u, 0.38, color="#7f7f7f", label=f"top-{u['topk']} of all {u['experts']} experts")
    ax.bar([i + 0.2 for i in x], vals_g, 0.38, color="#2ca02c", label="group-limited: 4 of 8 groups")
    for i in x:
        ax.text(i - 0.2, vals_u[i], f"{vals_u[i]:.1f}", ha="center", va="bottom", fontsize=8)
        ax.text(i + 0.2, vals_g[i], f"{vals_g[i]:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("dispatch MB leaving the node\nper rank, MoE layer and micro-batch")
    ax.set_title(f"Node-limited routing: bytes, ep {g['ep']} × pp {g['pp']} (ep group over {g['ep_nodes']} nodes)")
    ax.set_ylim(0, max(vals_u + vals_g) * 1.2)
    ax.legend(loc="upper right")
    ax = axes[1][1]
    pairs = [(d, res["routing_time"][d]) for d in ("alltoall", "flex")]
    for i, (d, t) in enumerate(pairs):
        ax.bar(i - 0.2, t["ungrouped"], 0.38, color="#7f7f7f", label="top-8 of all experts" if i == 0 else None)
        ax.bar(i + 0.2, t["grouped"], 0.38, color="#2ca02c", label="group-limited: 4 of 8 groups" if i == 0 else None)
        ax.text(i + 0.2, t["grouped"], f"{(t['grouped'] - t['ungrouped']) * 1e3:+.0f} ms", ha="center", va="bottom",
                fontsize=8.5)
    times = [v for _, t in pairs for v in t.values()]
    lo, hi = min(times), max(times)
    ax.set_ylim(lo - (hi - lo) * 1.5 - 1e-3, hi + (hi - lo) * 0.6 + 1e-3)
    ax.set_xticks(range(len(pairs)), [d for d, _ in pairs])
    ax.set_ylabel("iteration time (s)")
    ax.set_title(f"Node-limited routing: time, ep {g['ep']} × pp {g['pp']}\n(axis cut at {ax.get_ylim()[0]:.2f} s)")
    ax.legend(loc="upper right")
    r0 = grid[0]
    fig.suptitle(f"{r0['model']} on {r0['gpus']} H100: tp {TP}, etp 1, ZeRO-1, global batch {setup(quick)['gbs']} "
                 f"× 4096 tokens, balanced routing, layers split by --layer-split auto" + (" (quick run)" if quick else ""),
                 fontsize=11.5)
    fig.tight_layout()
    save(fig, path)


def main(argv=None) -> dict:
    args = parse_args(NAME, __doc__, argv)
    quick = args.quick
    cfg = setup(quick)
    grid = [(ep, pp, quick, True, d) for pp in cfg["pps"] for ep in cfg["eps"] for d in cfg["dispatchers"]]
    rows = parallel_map(simulate_point, grid, args.workers)
    fitting = [r for r in rows if r["fits"]] or rows
    best = min(fitting, key=lambda r: (r["iteration_s"], r["ep"], r["pp"], r["dispatcher"]))
    # node-limited routing can only bind where the expert-parallel group spans more nodes than
    # a token may reach: the comparison runs on the fastest such ep x pp (the best one when it does),
    # with the alltoall and flex dispatchers
    limit = cfg["model"].moe_router_group_topk
    wide = min((r for r in fitting if r["ep_nodes"] > limit), key=lambda r: (r["iteration_s"], r["ep"], r["pp"]),
               default=best)
    grouped = {d: next(r for r in rows if (r["ep"], r["pp"], r["dispatcher"]) == (wide["ep"], wide["pp"], d))
               for d in ("alltoall", "flex")}
    plain = dict(zip(("alltoall", "flex"), parallel_map(
        simulate_point, [(wide["ep"], wide["pp"], quick, False, d) for d in ("alltoall", "flex")], args.workers)))
    rows += plain.values()
    for r in rows:
        r["closed_cross_node_bytes"] = closed_copies_bytes(r)
    g, u = grouped["alltoall"], plain["alltoall"]
    res = {"rows": rows, "best": best, "routing": {"grouped": g, "ungrouped": u},
           "routing_time": {d: {"grouped": grouped[d]["iteration_s"], "ungrouped": plain[d]["iteration_s"]}
                            for d in grouped},
           "dedup_saving": 1 - g["cross_node_bytes_dedup"] / u["cross_node_bytes_dedup"],
           "time_change_s": g["iteration_s"] - u["iteration_s"],
           "flex_time_change_s": grouped["flex"]["iteration_s"] - plain["flex"]["iteration_s"]}
    write_json(args.out / "results.json", res)
    write_csv(args.out / f"{NAME}.csv", rows)
    plot(rows, res, args.out / f"{NAME}.png", quick)
    _verdict(args, rows, res, cfg)
    return res


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _verdict(args, rows, res, cfg) -> None:
    grid = [r for r in rows if r["grouped"]]
    best, g, u = res["best"], res["routing"]["grouped"], res["routing"]["ungrouped"]
    fits = [r for r in grid if r["fits"]]
    worst = max(fits, key=lambda r: r["iteration_s"], default=None)
    no_fit = sorted({f"ep {r['ep']} × pp {r['pp']}" for r in grid if not r["fits"]})

    def name(r):
        return f"{r['dispatcher']}, ep {r['ep']} × pp {r['pp']}"

    by_d = {d: min((r for r in fits if r["dispatcher"] == d), key=lambda r: r["iteration_s"], default=None)
            for d in cfg["dispatchers"]}
    t = res["routing_time"]
    answer = (
        f"The fastest plan that fits is {name(best)} ({best['iteration_s']:.2f} s per iteration, MFU "
        f"{best['mfu'] * 100:.1f}%, peak {best['peak_gb']:.1f} GB per GPU"
        + (f"; the slowest that fits, {name(worst)}, takes {worst['iteration_s']:.2f} s" if worst else "") + "). "
        + _capital("; ".join(f"the best with {d} is ep {r['ep']} × pp {r['pp']} ({r['iteration_s']:.2f} s, exposed "
                             f"token exchange {r['exposed_ep_s']:.2f} s)" for d, r in by_d.items() if r)) + ". "
        + (f"{', '.join(no_fit)} do not fit in the GPU's {best['capacity_gb']:.0f} GB. " if no_fit else "")
        + f"On ep {g['ep']} × pp {g['pp']} (the expert-parallel group over {g['ep_nodes']} nodes), group-limited "
        f"routing (4 of 8 groups) leaves the dispatch bytes that cross nodes as copies where they were "
        f"({g['cross_node_bytes'] / 1e6:.1f} MB per rank, layer and micro-batch, against "
        f"{u['cross_node_bytes'] / 1e6:.1f} MB ungrouped: balanced routing spreads the copies over all experts "
        f"either way) but cuts them, counted once per node reached, from {u['cross_node_bytes_dedup'] / 1e6:.1f} "
        f"to {g['cross_node_bytes_dedup'] / 1e6:.1f} MB ({res['dedup_saving'] * 100:.0f}% less). With the alltoall "
        f"dispatcher, which sends every copy, the iteration time moves by {res['time_change_s'] * 1e3:+.1f} ms; with "
        f"flex (DeepEP), which crosses once per node, by {res['flex_time_change_s'] * 1e3:+.1f} ms "
        f"({t['flex']['ungrouped']:.2f} to {t['flex']['grouped']:.2f} s).")
    cols = [("dispatcher", "dispatcher", ""), ("ep", "ep", ""), ("pp", "pp", ""), ("layer_split", "layer split", ""),
            ("iteration_s", "iteration (s)", ".2f"), ("exposed_ep_s", "exposed EP (s)", ".2f"),
            ("bubble_fraction", "bubble", ".2f"), ("mfu", "MFU", ".3f"), ("peak_gb", "peak GB", ".1f"),
            ("fits", "fits", "")]
    body = "Every grid point (group-limited routing):\n\n" + md_table(grid, cols)
    caveats = (
        "Balanced routing: every expert receives the mean, so the exposed exchange is the floor; a skewed router "
        "adds the busiest rank's excess (see moe_imbalance). The exchanges are not overlapped with compute "
        "(no DualPipe or `--overlap-moe-expert-parallel-comm`). flex is DeepEP's normal kernels as "
        "`sim.program.dispatch` models them: its inter-node and intra-node exchanges at once, tokens in BF16 "
        "(DeepEP's FP8 dispatch is not modelled), no NCCL base latency, its buffers' memory not counted; the "
        "allgather dispatcher gathers every token of the tp x ep group, which is why it trails at large ep. tp 2, "
        f"etp 1, ZeRO-1 and the global batch ({cfg['gbs']} sequences) are fixed; `trainsim search` varies them.")
    write_verdict(args, title=f"{number_of(NAME)}. DeepSeek-V3 on 1,024 H100: expert and pipeline parallelism, "
                              "and the token dispatcher",
                  question="DeepSeek-V3 on 1,024 H100: which EP, PP and dispatcher, and what does node-limited "
                           "routing save?",
                  setup=(f"{best['model']} on {best['gpus']} H100 ({cfg['nodes']} DGX nodes), tp {TP} with sequence "
                         f"parallelism, etp 1, ZeRO-1, micro-batch 1, global batch {cfg['gbs']} × 4096 tokens, "
                         f"balanced routing; ep {', '.join(map(str, cfg['eps']))} × pp "
                         f"{', '.join(map(str, cfg['pps']))} × dispatcher {', '.join(cfg['dispatchers'])}, layers "
                         "split by `--layer-split auto`; on the fastest ep × pp whose expert group spans more than 4 "
                         "nodes, alltoall and flex also without group-limited routing."),
                  answer=answer, figures=[f"{NAME}.png"], body=body, caveats=caveats,
                  headline=(f"{name(best)} is fastest ({best['iteration_s']:.2f} s); node-limited routing cuts the "
                            f"per-node dispatch bytes {res['dedup_saving'] * 100:.0f}%, which changes the iteration "
                            f"by {res['flex_time_change_s'] * 1e3:+.0f} ms with flex and "
                            f"{res['time_change_s'] * 1e3:+.0f} ms with alltoall (it sends every copy)."))


if __name__ == "__main__":
    main()
    print(f"wrote experiments/out/{NAME}/")
