"""``trainsim replay``: run a traced job (PyTorch profiler traces or Chakra ETs) on the simulated cluster.

Reads one Kineto trace per traced rank (``.json`` or ``.json.gz``; a subset of the ranks
will do: the others are cloned), builds each rank's dependency graph (``sim.replay``),
and replays one step on the engine: kernels at their measured durations, collectives and
send/recv priced by the network model. Prints the replayed step beside the traced one
and the critical path by category; ``--json`` prints one object, ``--out DIR`` writes
summary.json, trace.json (Perfetto) and timeline.png. Chakra execution traces
(``NAME.<r>.et``, one per rank, ``sim.replay.chakra``) replay the same way, told from
Kineto traces by extension or content; ``--export-chakra DIR`` writes the replayed
program as Chakra ETs (``sim.results.export_chakra``). What-ifs: ``--topology``,
``--fabric``, ``--oversubscription``, ``--nodes`` (another network), ``--data-parallel-size``
or ``--gpus`` (more or fewer replicas, told in replicas or in GPUs) and ``--gpu`` (another GPU).
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.inputs.flags import add_arguments as add_schema_arguments, add_section
from sim.inputs.schema_commands import REPLAY_HELPS, REPLAY_SETTINGS, ReplayOptions
from sim.units import format_time

NAME = "replay"
HELP = "Replay PyTorch profiler (Kineto) traces or Chakra execution traces of a real job on the simulated cluster, and ask what-ifs."


def add_arguments(p) -> None:
    add_section(p, ReplayOptions)
    add_schema_arguments(p, REPLAY_SETTINGS, helps=REPLAY_HELPS)


def run(args) -> int:
    from sim.fileio import check_output_dir
    from sim.replay.run import WhatIf, replay

    check_output_dir(args.out, "--out")
    check_output_dir(args.export_chakra, "--export-chakra")
    graphs = _read(args)
    result = replay(graphs, WhatIf(gpu=args.gpu, topology=args.topology, fabric=args.fabric,
                                   oversubscription=args.oversubscription, nodes=args.nodes,
                                   gpus_per_node=args.gpus_per_node, data_parallel_size=args.data_parallel_size,
                                   gpus=args.gpus))
    s = result.summary
    s["files"] = [str(p) for p in args.traces]
    chakra = None
    if args.export_chakra:
        from sim.results.export_chakra import write_chakra

        chakra = write_chakra(result.replayed.program, args.export_chakra, world_size=s["world_size"],
                              device_name=result.profile.name, iteration_time_s=s["iteration_time_s"])
    if args.out:
        write_outputs(result, Path(args.out))
    if args.json:
        print(json.dumps(s, sort_keys=True))
        return 0
    _print(s)
    if args.out:
        print(f"\nwrote {Path(args.out) / 'summary.json'}, trace.json, timeline.png")
    if chakra is not None:
        from sim.results.export_chakra import chakra_line

        print(chakra_line(chakra, args.export_chakra))
    return 0


def _read(args) -> list:
    """The traces' graphs: Chakra ETs or Kineto traces (not both), told apart by
    ``sim.replay.chakra.is_chakra``."""
    from sim.errors import InputError
    from sim.replay.chakra import chakra_graphs, is_chakra
    from sim.replay.kineto import read_kineto

    chakra = [is_chakra(p) for p in args.traces]
    if any(chakra) and not all(chakra):
        k, c = chakra.index(False), chakra.index(True)
        raise InputError(f"{args.traces[k]}: a Kineto trace, and {args.traces[c]} a Chakra execution trace; "
                         "give traces of one format")
    if all(chakra):
        if args.step is not None:
            raise InputError(f"--step: got {args.step}; Chakra execution traces hold one iteration, with no steps")
        return chakra_graphs(args.traces, args.comm_group)
    if args.comm_group is not None:
        raise InputError(f"--comm-group: got {args.comm_group!r}; it is for Chakra execution traces, and "
                         f"{args.traces[0]} is a Kineto trace")
    return [read_kineto(path, args.step, default_rank=i) for i, path in enumerate(args.traces)]


def write_outputs(result, out: Path) -> None:
    from sim.results.export import write_chrome, write_json_atomic
    from sim.results.plot import TimelineView, plot_timeline

    s = result.summary
    ranks = sorted(result.trace.streams())[:4]
    write_chrome(result.trace, out / "trace.json")
    plot_timeline(result.trace, out / "timeline.png", TimelineView(
        ranks=frozenset(ranks),
        title=f"replay of step {s['step'] if s['step'] is not None else '(whole window)'} on "
              f"{s['world_size']} x {s['gpu']}: {s['iteration_time_s'] * 1e3:.2f} ms "
              f"(traced {s['traced_step_s'] * 1e3:.2f} ms)"))
    write_json_atomic(s, out / "summary.json")


def _print(s: dict) -> None:
    step = f"ProfilerStep#{s['step']}" if s["step"] is not None else "the whole window"
    if s["what_if"]:
        print("what-if: " + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in s["what_if"].items()))
    print(f"replay of {step}: {len(s['traced_ranks'])} traced rank(s) {s['traced_ranks'][:8]}"
          f"{'...' if len(s['traced_ranks']) > 8 else ''}, {s['cloned_ranks']} cloned, "
          f"{s['world_size']} x {s['gpu']} on {s['topology']}")
    T, M = s["iteration_time_s"], s["traced_step_s"]
    print()
    print(f"  iteration time     {format_time(T):>12}")
    change = "what-if" if s["what_if"] else "replay"
    err = f"   ({change} {(T - M) / M * 100:+.1f}% on it)" if M else ""
    print(f"  traced step        {format_time(M):>12}{err}" if M else
          "  traced step        (none in these traces)")
    t = s["rank_times"]
    if s.get("cpu_trace"):  # (no GPU: the host's threads are the compute, in the critical path below)
        print(f"  on rank {s['critical_rank']} (the last to finish): a CPU job, its compute on the host")
        r = str(s["critical_rank"])
        if s.get("profiler_op_overhead_s") and r in s.get("profiler_removed_s", {}):
            print(f"  profiler's cost taken off: {format_time(s['profiler_removed_s'][r])} on rank {r} "
                  f"({s['profiler_events'][r]} recorded events x {s['profiler_op_overhead_s'] * 1e6:.2f} us)")
    else:
        _print_gpu_times(s, t, T)
    if s["comm_measured"] or s["comm_unmatched"]:
        print(f"  communication at its measured duration: {s['comm_measured']} kernel(s) without size or partners "
              f"in the trace, {s['comm_unmatched']} without a matching partner")
    print("  critical path:")
    for cat, v in s["critical_path"]["by_category_s"].items():
        print(f"    {cat:<16} {format_time(v):>12}  {v / T * 100:5.1f}%")
    print("  longest on it:")
    for item in s["critical_path"]["top"][:5]:
        print(f"    {item['category']:<10} {item['name'][:60]:<60} {format_time(item['seconds']):>12}")


def _print_gpu_times(s: dict, t: dict, T: float) -> None:
    print(f"  on rank {s['critical_rank']} (the last to finish):")
    print(f"    kernels          {format_time(t['kernel_s']):>12}  {t['kernel_s'] / T * 100:5.1f}%")
    print(f"    communication    {format_time(t['comm_s']):>12}  {t['comm_s'] / T * 100:5.1f}%   "
          f"exposed {format_time(t['exposed_comm_s'])}")
    print(f"    GPU idle         {format_time(t['gpu_idle_s']):>12}  {t['gpu_idle_s'] / T * 100:5.1f}%")
