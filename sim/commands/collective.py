"""``trainsim collective``: time one collective on a topology, as nccl-tests reports it.

Prints the time (with NCCL's base latency of the collective's algorithm and protocol,
``sim.engine.nccl``), the algorithm bandwidth (algbw = size / time) and the bus bandwidth
(busbw = algbw × 2(n−1)/n for all-reduce, × (n−1)/n for all-gather, reduce-scatter and
all-to-all, × 1 for broadcast and send/recv; nccl-tests' PERFORMANCE.md), plus the bytes
each kind of link carried. ``--out DIR`` also writes the Perfetto trace, a timeline PNG
and the summary JSON.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from sim.program.actions import Action, Program
from sim.engine.algorithms import ALGOS, OPS
from sim.engine.nccl import DEFAULT_MODEL, NcclModel, base_latency
from sim.engine.tuner import choose
from sim.program.actions import PROTOCOLS
from sim.engine.core import simulate
from sim.errors import InputError
from sim.inputs.schema import COLLECTIVE_MODELS
from sim.results.export import write_chrome, write_json_atomic
from sim.fileio import check_output_dir
from sim.inputs.topology_build import FABRICS, OVERSUBSCRIPTION, FabricSpec, load_topology
from sim.units import POSITIVE_INT, format_bytes, format_time, parse_size

NAME = "collective"
HELP = "Simulate one collective (all-reduce, all-gather, ...) and report time, algbw and busbw."

_ALIASES = {"all_reduce": "allreduce", "all-reduce": "allreduce", "all_gather": "allgather", "all-gather": "allgather",
            "reduce_scatter": "reducescatter", "reduce-scatter": "reducescatter", "all_to_all": "alltoall",
            "all-to-all": "alltoall", "p2p": "sendrecv"}


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for ``op`` on ``n`` ranks (nccl-tests' definitions)."""
    if n <= 1:
        return 1.0
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("allgather", "reducescatter", "alltoall"):
        return (n - 1) / n
    return 1.0


def add_arguments(p) -> None:
    p.add_argument("--op", default="allreduce", help=f"one of {', '.join(OPS)} (default allreduce)")
    p.add_argument("--size", default="1GiB", help="buffer size, e.g. 1GiB, 256MB, 4096 (default 1GiB)")
    p.add_argument("--gpus", type=POSITIVE_INT, default=None, help="GPUs taking part, ranks 0..N-1 (default: all)")
    p.add_argument("--topology", default="dgx-h100",
                   help="built-in name (dgx-a100, dgx-h100, dgx-h200, ...) or a TOML file (default dgx-h100)")
    p.add_argument("--nodes", type=POSITIVE_INT, default=None, help="number of nodes (default: enough for --gpus)")
    p.add_argument("--fabric", default=None, help=f"inter-node fabric: {' | '.join(FABRICS)} (default rail)")
    p.add_argument("--oversubscription", type=OVERSUBSCRIPTION, default=None, help="leaf uplink oversubscription (default 1)")
    p.add_argument("--algo", default="auto", help=f"{' | '.join(ALGOS)} (default auto: NCCL's tuner's choice, "
                                                  "as NCCL_ALGO overrides it)")
    p.add_argument("--protocol", default="auto", help=f"{' | '.join(PROTOCOLS)} (default auto: NCCL's choice by size)")
    p.add_argument("--sweep", default=None, metavar="MIN:MAX",
                   help="print nccl-tests style rows (all_reduce_perf columns) for sizes MIN..MAX in factor-2 steps")
    p.add_argument("--collective-model", choices=COLLECTIVE_MODELS, default="flows",
                   help="flows: each ring hop one flow for the whole collective; steps: 2(n-1) lock-step rounds "
                        "(default flows; the timeline shows each step with steps)")
    p.add_argument("--channels", type=POSITIVE_INT, default=None,
                   help="rings run at once by ring algorithms (default: GPUs per node when the group spans nodes, else 1)")
    p.add_argument("--gpu", default=None,
                   help="hardware profile whose link efficiencies apply (default: the topology's GPU, e.g. h100-sxm "
                        "for dgx-h100; none for hand-written graphs)")
    p.add_argument("--line-rate", action="store_true", help="ignore link efficiencies: links at their line rate")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--out", default=None, help="directory for trace.json, timeline.png and summary.json")


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
    return load_topology(args.topology, nodes=nodes, fabric=fabric, min_gpus=args.gpus, flag="--topology")


def run_collective(op: str, nbytes: int, gpus: int, topo, algo: str = "ring", channels: int | None = None,
                   link_efficiency: dict[str, float] | None = None, collective_model: str = "flows",
                   protocol: str = "simple", nccl: NcclModel | None = None):
    """Simulate one collective on ranks 0..gpus-1 of ``topo``; return (trace, summary dict).
    ``link_efficiency`` scales link kinds' line rates (a profile's achieved fractions);
    ``collective_model`` is "flows" or "steps" (``sim.engine.algorithms``); ``algo`` and
    ``protocol`` "auto" are NCCL's choice (``sim.engine.nccl``), reported in the summary."""
    if gpus > topo.num_gpus:
        raise InputError(f"--gpus: got {gpus}; topology {topo.name} has only {topo.num_gpus} GPUs")
    if op == "sendrecv":
        if gpus < 2:
            raise InputError(f"--gpus: got {gpus}; sendrecv needs at least 2 (it sends from rank 0 to rank N-1)")
        src, dst = 0, gpus - 1
        prog = Program({src: [Action("send", kind="send", peer=dst, nbytes=nbytes, category="send")],
                        dst: [Action("recv", kind="recv", peer=src, nbytes=nbytes, category="recv")]})
    else:
        if gpus < 2:
            raise InputError(f"--gpus: got {gpus}; {op} needs at least 2 GPUs (one GPU has nothing to exchange)")
        group = tuple(range(gpus))
        if channels is not None and channels < 1:
            raise InputError(f"--channels: got {channels}; expected an integer >= 1")
        if "auto" in (algo, protocol):
            algo, protocol = choose(op, group, nbytes, topo, link_efficiency, nccl, algo, protocol)
        prog = Program({r: [Action(op, kind="collective", op=op, group=group, nbytes=nbytes, algo=algo,
                                   protocol=protocol, channels=channels or 0)] for r in group})
    trace = simulate(prog, topo, link_efficiency=link_efficiency, fluid_collectives=collective_model == "flows",
                     nccl=nccl)
    t = trace.end_s
    base = 0.0 if op == "sendrecv" else base_latency(nccl or DEFAULT_MODEL, op, range(gpus), topo, algo, protocol)
    # A zero time happens only for an empty buffer on zero-latency links (or links of
    # infinite bandwidth): report no bandwidth rather than a division by zero.
    algbw = nbytes / t if t > 0 else (0.0 if nbytes == 0 else math.inf)
    n = 2 if op == "sendrecv" else gpus
    summary = {
        "op": op, "algo": algo, "protocol": protocol, "collective_model": collective_model, "size_bytes": nbytes, "gpus": gpus, "topology": topo.name,
        "nodes": topo.num_nodes, "time_s": t, "base_latency_s": base, "algbw_Bps": algbw,
        "busbw_Bps": algbw * bus_factor(op, n),
        "bytes_by_link_kind": trace.bytes_by_link_kind(), "transfers": len(trace.transfers),
        "link_efficiency": dict(link_efficiency or {}),
    }
    return trace, summary


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

        return print_sweep(args, op, gpus, topo, eff, nccl, run_collective)
    trace, summary = run_collective(op, nbytes, gpus, topo, args.algo, args.channels, eff, args.collective_model,
                                    args.protocol, nccl)
    if args.out:
        out = Path(args.out)
        from sim.results.plot import plot_timeline

        write_chrome(trace, out / "trace.json")
        plot_timeline(trace, out / "timeline.png", show_transfers=True, max_lanes=32,
                      title=f"{op} ({summary['algo']}) of {format_bytes(nbytes)} on {gpus} GPUs, {topo.name}")
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

        try:
            check_nvls(op, list(range(gpus)), topo, algo)
        except InputError as exc:
            raise InputError(f"--{exc}") from None
