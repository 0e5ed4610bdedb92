"""``trainsim demo``: the built-in demonstration, run by ``make run``.

Two questions answered end to end on built-in DGX H100 clusters:

1. Which pipeline schedule trains Llama 2 7B fastest on 16 GPUs (dp 2 x tp 2 x pp 4,
   16 micro-batches)? One simulated iteration per schedule (GPipe, 1F1B, interleaved,
   ZB-H1, ZB-H2): a table, and a timeline PNG and Perfetto trace of each.
2. How long does a gradient all-reduce take on 4 nodes with a flat ring versus a
   hierarchical algorithm, from 1 MiB to 4 GiB? A table, a bandwidth chart, and the
   timelines and traces of the 1 GiB case.
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.studies.collective import CollectiveOptions, run_collective
from sim.results.export import write_chrome, write_json_atomic
from sim.inputs.topology_build import load_topology
from sim.units import format_bytes, format_microbatches, format_time

NAME = "demo"
HELP = ("Run the built-in demo (Llama 2 7B under each pipeline schedule on 16 GPUs, then a flat ring vs "
        "hierarchical all-reduce on 4 DGX H100 nodes) and write its plots.")

SIZES = [2**20 * 4**k for k in range(7)]  # 1 MiB .. 4 GiB


def add_arguments(p) -> None:
    from sim.inputs.flags import add_section
    from sim.inputs.schema_commands import DemoOptions

    add_section(p, DemoOptions)


def _training(out: Path) -> list[dict]:
    from sim.session import summarize, write_outputs
    from sim.inputs.hardware import load_profile
    from sim.inputs.model import preset
    from sim.inputs.plan import ParallelPlan
    from sim.session import Job, simulate_training

    model, profile = preset("llama2-7b"), load_profile("h100-sxm")
    topo = load_topology("dgx-h100", nodes=2)
    rows = []
    for schedule, vpp in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-h2", 1)):
        plan = ParallelPlan(dp=2, tp=2, pp=4, vpp=vpp, global_batch_size=32, schedule=schedule)
        run_ = simulate_training(Job(model, plan, profile, topo))
        s = summarize(run_)
        write_outputs(run_, s, out / f"train-{schedule}")
        rows.append(s)
    print(f"One training iteration of {model.describe()}")
    print(f"on {topo.num_gpus} GPUs of {topo.name}: dp 2 x tp 2 x pp 4, global batch {plan.global_batch_size}: "
          f"{format_microbatches(plan.num_microbatches, plan.micro_batch_size, model.seq_length)} per replica")
    print(f"{'schedule':>12} | {'iteration':>10} {'tokens/s':>10} {'MFU':>6} {'bubble':>7} | peak memory")
    best = min(rows, key=lambda r: r["iteration_time_s"])
    for r in rows:
        mark = "  <- fastest" if r is best else ""
        print(f"{r['schedule']:>12} | {format_time(r['iteration_time_s']):>10} {r['tokens_per_s']:>10,.0f} "
              f"{r['mfu'] * 100:5.1f}% {r['bubble_fraction'] * 100:6.1f}% | {format_bytes(r['memory']['peak_bytes'])}{mark}")
    print(f"Wrote {out}/train-<schedule>/timeline.png, trace.json, summary.json")
    print()
    return rows


def run(args) -> int:
    from sim.errors import InputError

    from sim.fileio import check_output_dir

    nodes = args.nodes
    if args.gpus is not None:  # --gpus or --nodes, as on every command that describes a cluster
        if args.gpus % 8:
            raise InputError(f"--gpus: got {args.gpus}; expected a multiple of 8 (whole DGX H100 nodes)")
        if nodes is not None and nodes * 8 != args.gpus:
            raise InputError(f"--gpus: got {args.gpus}; with --nodes {nodes} expected {nodes * 8} (or leave one out)")
        nodes = args.gpus // 8
    nodes = 4 if nodes is None else nodes
    out = check_output_dir(args.out, "--out")
    training = _training(out) if not args.json else []
    topo = load_topology("dgx-h100", nodes=nodes)
    gpus = topo.num_gpus
    from sim.inputs.hardware import load_profile
    from sim.results.plot import TimelineView, plot_busbw, plot_timeline

    eff = load_profile("h100-sxm").link_efficiencies()  # achieved fractions of line rate
    rows = []
    for size in SIZES:
        row = {"size_bytes": size}
        for algo in ("ring", "hierarchical"):
            trace, s = run_collective("allreduce", size, gpus, topo,
                                      CollectiveOptions(algo=algo, link_efficiency=eff))
            row[algo] = {"time_s": s["time_s"], "busbw_Bps": s["busbw_Bps"], "ib_bytes": s["bytes_by_link_kind"].get("ib", 0.0)}
            if size == 2**30:
                write_chrome(trace, out / f"allreduce-{algo}.trace.json")
                plot_timeline(trace, out / f"allreduce-{algo}.png", TimelineView(
                    show_transfers=True, max_lanes=32, title=f"all-reduce ({algo}) of 1 GiB on {gpus} GPUs, {topo.name}"))
        rows.append(row)
    plot_busbw(rows, out / "allreduce-busbw.png", topo.name, gpus)
    result = {"topology": topo.name, "gpus": gpus, "rows": rows}
    write_json_atomic(result, out / "demo.json")
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    print(f"All-reduce on {topo.describe()}")
    print(f"{'size':>10} | {'ring time':>11} {'busbw':>11} | {'hier. time':>11} {'busbw':>11} | speed-up")
    for row in rows:
        r, h = row["ring"], row["hierarchical"]
        print(f"{format_bytes(row['size_bytes']):>10} | {format_time(r['time_s']):>11} {r['busbw_Bps'] / 1e9:>6.1f} GB/s |"
              f" {format_time(h['time_s']):>11} {h['busbw_Bps'] / 1e9:>6.1f} GB/s | {r['time_s'] / h['time_s']:6.2f}x")
    r, h = rows[-1]["ring"], rows[-1]["hierarchical"]
    print("busbw is nccl-tests' bus bandwidth (GB = 1e9 bytes). Small messages: the flat ring pays 2(n-1) latency steps,")
    print("hierarchical 2(g-1) NVLink steps plus 2(N-1) InfiniBand steps. Large messages: hierarchical moves"
          f" {r['ib_bytes'] / h['ib_bytes']:.2f}x fewer bytes over InfiniBand.")
    print(f"Wrote {out}/allreduce-ring.png, allreduce-hierarchical.png, allreduce-busbw.png, *.trace.json, demo.json")
    return 0
