"""``trainsim replay``: run a traced job (PyTorch profiler traces) on the simulated cluster.

Reads one Kineto trace per traced rank (``.json`` or ``.json.gz``; a subset of the ranks
will do: the others are cloned), builds each rank's dependency graph (``sim.replay``),
and replays one step on the engine: kernels at their measured durations, collectives and
send/recv priced by the network model. Prints the replayed step beside the traced one
and the critical path by category; ``--json`` prints one object, ``--out DIR`` writes
summary.json, trace.json (Perfetto) and timeline.png. What-ifs: ``--topology``,
``--fabric``, ``--oversubscription``, ``--nodes`` (another network), ``--data-parallel-size``
(more or fewer replicas) and ``--gpu`` (another GPU).
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.inputs.flags import add_arguments as add_schema_arguments
from sim.units import POSITIVE_INT, format_time

NAME = "replay"
HELP = "Replay PyTorch profiler (Kineto) traces of a real job on the simulated cluster, and ask what-ifs."
FLAGS = ["gpu", "topology", "nodes", "gpus_per_node", "fabric", "oversubscription", "json", "out"]
_HELPS = {
    "gpu": "GPU profile to replay on (default: the trace's deviceProperties); another GPU scales the kernels "
           "by class (GEMM and attention by sustained FLOP/s, the rest by sustained HBM bandwidth)",
    "out": "directory for summary.json, trace.json (Perfetto) and timeline.png",
}


def add_arguments(p) -> None:
    from sim.units import NONNEGATIVE_INT

    p.add_argument("traces", nargs="+", metavar="TRACE", help="Kineto trace files (.json, .json.gz), one per traced rank")
    p.add_argument("--step", type=_number(NONNEGATIVE_INT, "--step"), metavar="N",
                   help="replay ProfilerStep#N (default: the traces' last step, or the whole window without steps)")
    p.add_argument("--data-parallel-size", type=_number(POSITIVE_INT, "--data-parallel-size"), metavar="N",
                   help="what-if: N data-parallel replicas (each rank's kernels kept, gradient collectives over the "
                        "new groups)")
    add_schema_arguments(p, FLAGS, helps=_HELPS)


def _number(kind, flag):
    import argparse

    def convert(text):
        try:
            v = kind.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"got {text!r}; expected {kind.describe()}") from None
        why = kind.allowed(v)
        if why is not None:
            raise argparse.ArgumentTypeError(f"got {text}; {why}")
        return v

    convert.__name__ = flag
    return convert


def run(args) -> int:
    from sim.fileio import check_output_dir
    from sim.replay.kineto import read_kineto
    from sim.replay.run import replay

    check_output_dir(args.out, "--out")
    graphs = [read_kineto(path, args.step, default_rank=i) for i, path in enumerate(args.traces)]
    result = replay(graphs, gpu=args.gpu, topology=args.topology, fabric=args.fabric,
                    oversubscription=args.oversubscription, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                    data_parallel_size=args.data_parallel_size)
    s = result.summary
    s["files"] = [str(p) for p in args.traces]
    if args.out:
        write_outputs(result, Path(args.out))
    if args.json:
        print(json.dumps(s, sort_keys=True))
        return 0
    _print(s)
    if args.out:
        print(f"\nwrote {Path(args.out) / 'summary.json'}, trace.json, timeline.png")
    return 0


def write_outputs(result, out: Path) -> None:
    from sim.results.export import write_chrome, write_json_atomic
    from sim.results.plot import plot_timeline

    s = result.summary
    ranks = sorted(result.trace.streams())[:4]
    write_chrome(result.trace, out / "trace.json")
    plot_timeline(result.trace, out / "timeline.png", ranks=set(ranks),
                  title=f"replay of step {s['step'] if s['step'] is not None else '(whole window)'} on "
                        f"{s['world_size']} x {s['gpu']}: {s['iteration_time_s'] * 1e3:.2f} ms "
                        f"(traced {s['traced_step_s'] * 1e3:.2f} ms)")
    write_json_atomic(s, out / "summary.json")


def _print(s: dict) -> None:
    step = f"ProfilerStep#{s['step']}" if s["step"] is not None else "the whole window"
    print(f"replay of {step}: {len(s['traced_ranks'])} traced rank(s) {s['traced_ranks'][:8]}"
          f"{'...' if len(s['traced_ranks']) > 8 else ''}, {s['cloned_ranks']} cloned, "
          f"{s['world_size']} x {s['gpu']} on {s['topology']}")
    T, M = s["iteration_time_s"], s["traced_step_s"]
    print()
    print(f"  iteration time     {format_time(T):>12}")
    err = f"   ({(T - M) / M * 100:+.1f}%)" if M else ""
    print(f"  traced step        {format_time(M):>12}{err}")
    t = s["rank_times"]
    print(f"  on rank {s['critical_rank']} (the last to finish):")
    print(f"    kernels          {format_time(t['kernel_s']):>12}  {t['kernel_s'] / T * 100:5.1f}%")
    print(f"    communication    {format_time(t['comm_s']):>12}  {t['comm_s'] / T * 100:5.1f}%   "
          f"exposed {format_time(t['exposed_comm_s'])}")
    print(f"    GPU idle         {format_time(t['gpu_idle_s']):>12}  {t['gpu_idle_s'] / T * 100:5.1f}%")
    if s["comm_measured"] or s["comm_unmatched"]:
        print(f"  communication at its measured duration: {s['comm_measured']} kernel(s) without size or partners "
              f"in the trace, {s['comm_unmatched']} without a matching partner")
    print("  critical path:")
    for cat, v in s["critical_path"]["by_category_s"].items():
        print(f"    {cat:<16} {format_time(v):>12}  {v / T * 100:5.1f}%")
    print("  longest on it:")
    for item in s["critical_path"]["top"][:5]:
        print(f"    {item['category']:<10} {item['name'][:60]:<60} {format_time(item['seconds']):>12}")
