"""``trainsim collective``: time one collective on a topology, as nccl-tests reports it.

Prints what ``sim.studies.collective.run_collective`` measures: the time (with NCCL's base
latency of the collective's algorithm and protocol), the algorithm bandwidth (algbw = size
/ time) and the bus bandwidth (nccl-tests' busbw), plus the bytes each kind of link
carried. ``--out DIR`` also writes the Perfetto trace, a timeline PNG and the summary JSON.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from sim.engine.algorithms import ALGOS, OPS
from sim.engine.nccl import NcclModel
from sim.program.actions import PROTOCOLS
from sim.errors import InputError
from sim.results.export import write_chrome, write_json_atomic
from sim.fileio import check_output_dir
from sim.inputs.topology_build import FABRICS, FabricSpec, load_topology
from sim.studies.collective import CollectiveOptions, run_collective
from sim.units import format_bytes, format_time, parse_size

NAME = "collective"
HELP = "Simulate one collective (all-reduce, all-gather, ...) and report time, algbw and busbw."

PXN_FLAGS = ["nccl_pxn_disable", "nccl_p2p_pxn_level"]
"""The run settings (``sim.inputs.schema_sim``) this command takes as they are: PXN's."""

_ALIASES = {"all_reduce": "allreduce", "all-reduce": "allreduce", "all_gather": "allgather", "all-gather": "allgather",
            "reduce_scatter": "reducescatter", "reduce-scatter": "reducescatter", "all_to_all": "alltoall",
            "all-to-all": "alltoall", "p2p": "sendrecv"}


def add_arguments(p) -> None:
    from sim.inputs.flags import add_arguments as add_setting_flags, add_section
    from sim.inputs.schema_commands import CollectiveOptions, CollectiveOutput

    add_section(p, CollectiveOptions)
    add_setting_flags(p, PXN_FLAGS)
    add_section(p, CollectiveOutput)


def _topology(args):
    fabric = None
    if args.fabric is not None or args.oversubscription is not None:
        if args.fabric is not None and args.fabric not in FABRICS:
            raise InputError(f"--fabric: got {args.fabric!r}; allowed: {', '.join(FABRICS)}")
        fabric = FabricSpec(type=args.fabric or "rail", oversubscription=args.oversubscription or 1.0)
    nodes = args.nodes
    if nodes is not None and nodes < 1:
        raise InputError(f"--nodes: got {nodes}; expected an integer >= 1")
    if args.gpus is not None and args.gpus < 1:
        raise InputError(f"--gpus: got {args.gpus}; expected an integer >= 1")
    topo = load_topology(args.topology, nodes=nodes, fabric=fabric, min_gpus=args.gpus, flag="--topology")
    from sim.inputs.schema_sim import SimulationSettings
    from sim.inputs.topology import check_pxn

    pxn = SimulationSettings(**{k: v for k in PXN_FLAGS if (v := getattr(args, k, None)) is not None})
    check_pxn(topo, pxn_disable=pxn.nccl_pxn_disable, pxn_level=pxn.nccl_p2p_pxn_level, flag="--")
    return topo.with_pxn(pxn.pxn_level)


def run(args) -> int:
    op = _ALIASES.get(args.op, args.op)
    if op not in OPS:
        raise InputError(f"--op: got {args.op!r}; allowed: {', '.join(OPS)}")
    if args.algo not in ALGOS:
        raise InputError(f"--algo: got {args.algo!r}; allowed: {', '.join(ALGOS)}")
    if args.protocol not in PROTOCOLS:
        raise InputError(f"--protocol: got {args.protocol!r}; allowed: {', '.join(PROTOCOLS)}")
    if args.algo in ("hierarchical", "tree") and op != "allreduce":
        raise InputError(f"--algo: got {args.algo!r} with --op {op}; {args.algo} is implemented for allreduce only")
    nbytes = parse_size(args.size, "--size")
    check_output_dir(args.out, "--out")
    topo = _topology(args)
    gpus = args.gpus if args.gpus is not None else topo.num_gpus
    eff, nccl = None, None
    gpu = args.gpu or topo.graph.graph.get("gpu_profile")
    if gpu and not args.line_rate:
        from sim.inputs.hardware import load_profile

        profile = load_profile(gpu, flag="--gpu")
        eff, nccl = profile.link_efficiencies(), NcclModel.from_profile(profile)
    _check_algo(args.algo, op, gpus, topo)
    if args.sweep:
        from sim.commands.collective_sweep import print_sweep

        return print_sweep(args, op, gpus, topo, eff, nccl)
    how = CollectiveOptions(algo=args.algo, channels=args.channels, link_efficiency=eff,
                            collective_model=args.collective_model, protocol=args.protocol, nccl=nccl)
    trace, summary = run_collective(op, nbytes, gpus, topo, how)
    if args.out:
        out = Path(args.out)
        from sim.results.plot import TimelineView, plot_timeline

        write_chrome(trace, out / "trace.json")
        plot_timeline(trace, out / "timeline.png", TimelineView(
            show_transfers=True, max_lanes=32,
            title=f"{op} ({summary['algo']}) of {format_bytes(nbytes)} on {gpus} GPUs, {topo.name}"))
        write_json_atomic(summary, out / "summary.json")
    if args.json:
        # strict JSON: a non-finite bandwidth (zero time) is null, never Infinity
        print(json.dumps({k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                          for k, v in summary.items()}, sort_keys=True))
        return 0
    print(f"{op} ({summary['algo']}, {summary['protocol']}, {args.collective_model}) of {format_bytes(nbytes)} on {gpus} GPUs of {topo.describe()}")
    print("  links at " + (", ".join(f"{k} {v:.0%}" for k, v in sorted(eff.items())) + f" of line rate ({gpu})"
                           if eff else "line rate"))
    print(f"  time   {format_time(summary['time_s'])}"
          + (f"   (NCCL base latency {format_time(summary['base_latency_s'])} included)"
             if summary["base_latency_s"] else ""))
    print(f"  algbw  {summary['algbw_Bps'] / 1e9:.2f} GB/s")
    print(f"  busbw  {summary['busbw_Bps'] / 1e9:.2f} GB/s   (nccl-tests definition, GB = 1e9 bytes)")
    for kind, b in summary["bytes_by_link_kind"].items():
        busiest, most = trace.busiest_link(kind)
        print(f"  {kind:<8} {format_bytes(b):>12} over {trace.links_used(kind)} directed links, "
              f"busiest {busiest[0]} -> {busiest[1]}: {format_bytes(most)}")
    if args.out:
        print(f"  wrote {Path(args.out) / 'trace.json'}, timeline.png, summary.json")
    return 0


def _check_algo(algo: str, op: str, gpus: int, topo) -> None:
    """``--algo nvls`` / ``nvls_tree`` where they cannot run: a one-line error."""
    if algo in ("nvls", "nvls_tree") and op != "sendrecv" and 2 <= gpus <= topo.num_gpus:
        from sim.engine.algorithms_nccl import check_nvls

        check_nvls(op, list(range(gpus)), topo, algo, field="--algo")
