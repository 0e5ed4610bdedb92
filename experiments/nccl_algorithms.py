"""Which NCCL algorithm runs when: all-reduce busbw against message size, per algorithm.

``trainsim collective``'s own functions (``sim.studies.collective.run_collective``, the
tuner ``sim.engine.tuner.choose``) over message sizes 8 B .. 8 GiB in factor-2 steps, for
each algorithm that can run the all-reduce on the cluster (ring, tree, NVLS inside one
node, NVLS-tree across nodes, hierarchical; each with the protocol the tuner picks for
it) and for ``auto`` (the tuner's algorithm and protocol), on 8 H100s in one node, 2 and
16 DGX H100 nodes and 2 DGX A100 nodes, links derated by the profiles' achieved
efficiency. The picture (one panel per cluster, ``auto``'s pick marked at every size) is
also copied to ``docs/img/busbw-by-algorithm.png`` by a full run; ``auto_table.md`` is
the tuner's choice by op, size, GPU count and topology, as size ranges (README's
"Which NCCL algorithm runs when" pastes it; a ``--quick`` run's table has its 8 sizes only).

    .venv/bin/python experiments/nccl_algorithms.py [--quick]
"""

from __future__ import annotations

import shutil
import sys
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import GB, ROOT, fmt_bytes, parallel_map, parse_args, pyplot, save, write_csv, write_json  # noqa: E402
from common import write_verdict  # noqa: E402

from sim.studies.collective import CollectiveOptions, run_collective  # noqa: E402
from sim.engine.nccl import NcclModel, TunerRequest  # noqa: E402
from sim.engine.tuner import choose, runnable  # noqa: E402
from sim.inputs.hardware import load_profile  # noqa: E402
from sim.inputs.topology_build import load_topology  # noqa: E402

NAME = "nccl_algorithms"
CLUSTERS = {"8 H100, one node": ("dgx-h100", "h100-sxm", 1), "16 H100, 2 nodes": ("dgx-h100", "h100-sxm", 2),
            "128 H100, 16 nodes": ("dgx-h100", "h100-sxm", 16), "16 A100, 2 nodes": ("dgx-a100", "a100-80gb", 2)}
ALGOS = ("ring", "tree", "nvls", "nvls_tree", "hierarchical", "auto")
COLOR = {"ring": "#1f77b4", "tree": "#2ca02c", "nvls": "#d62728", "nvls_tree": "#9467bd", "hierarchical": "#8c564b",
         "auto": "black"}
MARK = {"ll": "v", "ll128": "s", "simple": "o"}
TABLE_OPS = ("allreduce", "allgather", "reducescatter")
DOCS_PNG = ROOT / "docs" / "img" / "busbw-by-algorithm.png"


@lru_cache(maxsize=None)
def _setup(cluster: str):
    node, prof_name, nodes = CLUSTERS[cluster]
    topo = load_topology(node, nodes=nodes)
    prof = load_profile(prof_name)
    return topo, prof.link_efficiencies(), NcclModel.from_profile(prof)


def algos_for(cluster: str, op: str = "allreduce") -> list[str]:
    """The algorithms NCCL could run ``op`` with on the whole cluster (the tuner's rules)."""
    topo, _, _ = _setup(cluster)
    return [a for a in ALGOS if runnable(op, range(topo.num_gpus), topo, a)]


def simulate_point(point) -> dict:
    cluster, algo, nbytes = point
    topo, eff, nccl = _setup(cluster)
    _, s = run_collective("allreduce", nbytes, topo.num_gpus, topo,
                          CollectiveOptions(algo=algo, link_efficiency=eff, protocol="auto", nccl=nccl))
    return {"cluster": cluster, "algo": algo, "size_bytes": nbytes, "ran_algo": s["algo"], "protocol": s["protocol"],
            "time_s": s["time_s"], "busbw_GBps": s["busbw_Bps"] / GB}


def auto_table(sizes: list[int]) -> list[dict]:
    """The tuner's (algorithm, protocol) by op, cluster and size, merged into size ranges."""
    rows = []
    for op in TABLE_OPS:
        for cluster in CLUSTERS:
            topo, eff, nccl = _setup(cluster)
            ranks = tuple(range(topo.num_gpus))
            picks = [(s, choose(TunerRequest(op, ranks, s, topo, eff, nccl))) for s in sizes]
            start = 0
            for i in range(1, len(picks) + 1):
                if i == len(picks) or picks[i][1] != picks[start][1]:
                    a, p = picks[start][1]
                    rows.append({"op": op, "cluster": cluster, "gpus": topo.num_gpus, "nodes": topo.num_nodes,
                                 "from_bytes": picks[start][0], "to_bytes": picks[i - 1][0], "algo": a, "protocol": p})
                    start = i
    return rows


def _proto(p: str) -> str:
    return {"ll": "LL", "ll128": "LL128", "simple": "Simple"}[p]


def table_markdown(rows: list[dict]) -> str:
    """One row per cluster, one column per op; each cell the size ranges and their picks."""
    lines = ["| cluster | " + " | ".join(TABLE_OPS) + " |", "|---|" + "---|" * len(TABLE_OPS)]
    for cluster in CLUSTERS:
        cells = []
        for op in TABLE_OPS:
            rs = [r for r in rows if r["op"] == op and r["cluster"] == cluster]
            parts = []
            for i, r in enumerate(rs):
                lo, hi = fmt_bytes(r["from_bytes"]), fmt_bytes(r["to_bytes"])
                span = (f"≤ {hi}" if i == 0 and len(rs) > 1 else f"≥ {lo}" if i == len(rs) - 1 and len(rs) > 1
                        else "all sizes" if len(rs) == 1 else lo if lo == hi else f"{lo}–{hi}")
                parts.append(f"{r['algo']}/{_proto(r['protocol'])} {span}")
            cells.append(", ".join(parts))
        lines.append(f"| {cluster} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _tick_label(b: int) -> str:
    return fmt_bytes(b).replace(".0", "").replace(" ", "\u2009")


def plot(rows: list[dict], path: Path, quick: bool) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.4), sharex=True)
    ticks = [2**k for k in range(3, 34, 5)]  # 8 B, 256 B, 8 KiB, 256 KiB, 8 MiB, 256 MiB, 8 GiB
    for ax, cluster in zip(axes.flat, CLUSTERS):
        for algo in algos_for(cluster):
            rs = sorted((r for r in rows if r["cluster"] == cluster and r["algo"] == algo), key=lambda r: r["size_bytes"])
            xs, ys = [r["size_bytes"] for r in rs], [r["busbw_GBps"] for r in rs]
            if algo == "auto":
                ax.plot(xs, ys, "-", color="black", lw=3.5, alpha=0.18, zorder=1, label="auto (NCCL's tuner; markers)")
                for r in rs:
                    ax.plot(r["size_bytes"], r["busbw_GBps"], MARK[r["protocol"]], ms=5.5, zorder=3,
                            color=COLOR[r["ran_algo"]], mec="black", mew=0.5)
            else:
                ax.plot(xs, ys, "-" if algo != "hierarchical" else "--", color=COLOR[algo], lw=1.3, zorder=2,
                        label=algo.replace("_", "-"))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ticks, [_tick_label(t) for t in ticks])
        ax.minorticks_off()
        ax.set_ylim(0.001, 1000)
        ax.set_title(f"{cluster} (DGX {CLUSTERS[cluster][0].split('-')[1].upper()}, {CLUSTERS[cluster][1]} profile)")
        ax.set_ylabel("all-reduce bus bandwidth (GB/s, log)")
        ax.legend(loc="upper left", title="algorithm (line)", title_fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("message size (bytes per GPU, log scale)")
        ax.tick_params(labelbottom=True)
    from matplotlib.lines import Line2D

    keys = [Line2D([], [], ls="", marker=MARK[p], color="grey", mec="black", mew=0.5, ms=6,
                   label=_proto(p)) for p in MARK]
    fig.legend(handles=keys, loc="lower center", ncol=3, bbox_to_anchor=(0.5, -0.035), frameon=False,
               title="auto's pick at each size: marker colour = algorithm (as the lines), shape = protocol",
               title_fontsize=9)
    fig.suptitle("All-reduce busbw by NCCL algorithm, as trainsim simulates it (nccl-tests busbw = algbw·2(n−1)/n)"
                 + (" (quick run)" if quick else ""), fontsize=12)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    save(fig, path)


def main(argv=None) -> dict:
    args = parse_args(NAME, __doc__, argv)
    sizes = [2**k for k in (range(3, 34, 4) if args.quick else range(3, 34))]
    pts = [(c, a, s) for c in CLUSTERS for a in algos_for(c) for s in sizes]
    pts.sort(key=lambda p: (-CLUSTERS[p[0]][2], p))  # biggest clusters first, so the pool ends together
    rows = parallel_map(simulate_point, pts, args.workers)
    rows.sort(key=lambda r: (list(CLUSTERS).index(r["cluster"]), ALGOS.index(r["algo"]), r["size_bytes"]))
    write_csv(args.out / f"{NAME}.csv", rows)
    plot(rows, args.out / f"{NAME}.png", args.quick)
    if not args.quick:
        DOCS_PNG.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(args.out / f"{NAME}.png", DOCS_PNG)
    # the tuner's table over every size (README pastes it); a quick run tabulates its own sizes only,
    # the full table being three quarters of a quick run's time
    table = auto_table(sizes if args.quick else [2**k for k in range(3, 34)])
    md = table_markdown(table)
    (args.out / "auto_table.md").write_text(md + "\n")
    print(md)
    best = {}
    for c in CLUSTERS:
        big = [r for r in rows if r["cluster"] == c and r["size_bytes"] == sizes[-1]]
        best[c] = {r["algo"]: r["busbw_GBps"] for r in big}
    results = {"rows": rows, "auto_table": table, "busbw_at_largest_GBps": best, "sizes": sizes}
    write_json(args.out / "results.json", results)
    lines = [f"{c}: " + ", ".join(f"{a} {v:.0f}" for a, v in b.items()) + " GB/s" for c, b in best.items()]
    write_verdict(args, title="Which NCCL algorithm runs when", question=(
        "Which all-reduce algorithm and protocol does NCCL's tuner pick at each message size, one node and "
        "across nodes, and what busbw does each algorithm reach?"),
        setup=("All-reduce over every GPU of the cluster, links derated by the profile's efficiencies, each "
               "algorithm with the protocol the tuner picks for it; auto = the tuner's algorithm and protocol."),
        answer=f"At {fmt_bytes(sizes[-1])}: " + "; ".join(lines) + ".", figures=[f"{NAME}.png"],
        body="The tuner's choice by op, cluster and size:\n\n" + md,
        caveats="Tree is all-reduce only; NVLS-tree across nodes has no efficiency factor of its own; "
                "estimate and explain still price rings.",
        headline="auto = " + ", ".join(f"{c}: {r['algo']}/{r['protocol']} from {fmt_bytes(r['from_bytes'])}"
                                       for c in CLUSTERS for r in table
                                       if r["op"] == "allreduce" and r["cluster"] == c and r["to_bytes"] == 2**33))
    return results


if __name__ == "__main__":
    main()
    print(f"wrote experiments/out/{NAME}/")
