"""Shared helpers for the experiment scripts: arguments, clusters, simulation, outputs, charts.

Every experiment is a script ``experiments/<name>.py`` with a ``main(argv) -> dict`` that
simulates, writes ``<name>.png``, ``<name>.csv``, ``verdict.md`` and ``results.json``
under ``experiments/out/<name>/`` (or ``--out DIR``), and returns the results it wrote.
``--quick`` runs a reduced version (fewer points, smaller models) that the tests use.

Experiments are scripts, not the package: matplotlib is imported here (``pyplot()``),
never from ``sim/`` outside ``sim/plot.py``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sim.program.actions import Action, Program  # noqa: E402
from sim.engine.core import simulate  # noqa: E402
from sim.fileio import atomic_path, write_text_atomic  # noqa: E402
from sim.inputs.topology_build import NodeSpec, build_cluster, load_node_spec, load_topology  # noqa: E402

OUT = ROOT / "experiments" / "out"
GB = 1e9
GiB = 2**30
MiB = 2**20


# ----------------------------------------------------------------- arguments
def parse_args(name: str, doc: str, argv=None) -> argparse.Namespace:
    """``--quick`` (reduced size, for tests), ``--out DIR``, ``--workers N``."""
    p = argparse.ArgumentParser(prog=f"experiments/{name}.py", description=(doc or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a reduced version (fewer points, smaller models)")
    p.add_argument("--out", default=None, help=f"output folder (default experiments/out/{name})")
    p.add_argument("--workers", type=int, default=None,
                   help="processes for independent simulations (default: the CPU count; 1: in this process)")
    args = p.parse_args(argv)
    args.out = Path(args.out) if args.out else OUT / name
    args.out.mkdir(parents=True, exist_ok=True)
    args.name = name
    if args.workers is None:
        args.workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return args


def parallel_map(fn, items, workers: int = 1) -> list:
    """``[fn(x) for x in items]``, on ``workers`` forked processes when more than one.

    ``fn`` must be a module-level function; results come back in the order of ``items``
    (simulations are deterministic, so the answer does not depend on ``workers``)."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    from sim.gc_tuning import tune_process
    from sim.workers import ending_pool, process_pool

    # tied to this process (sim.workers): they die with it, and Ctrl-C kills them at once;
    # the workers are ours, so their simulations pause the collector (sim.gc_tuning)
    with ending_pool(process_pool(min(workers, len(items)), "fork", initializer=tune_process)) as pool:
        return list(pool.map(fn, items))


# ----------------------------------------------------------------- clusters
def free_cluster(nodes: int = 1, gpus: int = 8, profile: str = "h100-sxm"):
    """Links infinitely fast with no latency: communication is free, only the schedule
    and the compute remain (the setting the closed forms assume)."""
    spec = NodeSpec("free", gpus, profile, math.inf, 0.0, math.inf, 0.0, gpus, "ib", math.inf, 0.0)
    return build_cluster(spec, nodes)


def dgx(node: str, nodes: int, **node_changes):
    """``nodes`` DGX nodes (``dgx-a100``, ``dgx-h100``...) on the rail-optimized fabric,
    optionally with node fields changed (e.g. ``nics=1``)."""
    if not node_changes:
        return load_topology(node, nodes=nodes)
    spec = replace(load_node_spec(node), **node_changes)
    suffix = "-".join(f"{k}{v}" for k, v in sorted(node_changes.items()) if k != "name")
    spec = replace(spec, name=node_changes.get("name", f"{spec.name}-{suffix}"))
    return build_cluster(spec, nodes)


def ethernet_cluster(node: str, nodes: int, gbit_per_s: float = 25.0):
    """DGX nodes whose only link between nodes is one ``gbit_per_s`` Ethernet port per node
    (default 25 Gb/s, as on many cloud instances), instead of 8 InfiniBand NICs.

    Built as 8 NICs of ``gbit_per_s / 8`` each, one per GPU: for ring collectives (whose
    channels, one per GPU of a node, would all cross the single port) the bytes per node
    and per second are the same, and full-fidelity simulations agree exactly. It has to be
    built this way because reduced fidelity drops ring hops between two shadow ranks, so
    on a single shared NIC the simulated ranks would not see the shadows' traffic (see
    ``single_nic_reduced_fidelity_gap`` in the experiments' README)."""
    spec = load_node_spec(node)
    return dgx(node, nodes, nic_kind="ethernet", nic_bandwidth_Bps=gbit_per_s * 1e9 / 8 / spec.nics,
               nic_latency_s=5e-6, name=f"{node}-{gbit_per_s:g}GbE")


def one_nic_per_ring_cluster(node: str, nodes: int):
    """DGX nodes where a ring collective across nodes gets one NIC's bandwidth in all
    (as if NCCL ran one channel, or all channels crossed one NIC): each of the 8 NICs at
    1/8 of its line rate. Built per NIC for the reason given in ``ethernet_cluster``."""
    spec = load_node_spec(node)
    return dgx(node, nodes, nic_bandwidth_Bps=spec.nic_bandwidth_Bps / spec.nics, name=f"{node}-1nic-per-ring")


# ----------------------------------------------------------------- simulation
def run_summary(model, plan, profile, topology, fidelity: str = "auto", keep_run: bool = False, **nccl):
    """Simulate one iteration and return ``trainsim run --json``'s summary (and the run);
    ``nccl``: ``nccl_algo``, ``nccl_protocol`` (default auto, as ``trainsim run``)."""
    from sim.session import summarize
    from sim.inputs.schema import SimulationSettings
    from sim.session import Job, simulate_training

    run = simulate_training(Job(model, plan, profile, topology), SimulationSettings(fidelity=fidelity, **nccl))
    s = summarize(run)
    return (s, run) if keep_run else s


def comm_bytes(trace, kinds=("dp", "zero")) -> float:
    """Bytes the transfers of collectives of these kinds moved (from the trace; a
    collective's transfers are labelled with its category first)."""
    return sum(t.nbytes for t in trace.transfers if t.label.split()[0] in kinds)


def step_seconds(trace, rank: int, categories) -> float:
    """Total duration of the compute spans of ``categories`` on ``rank``."""
    return sum(s.duration_s for s in trace.spans_of(rank) if s.kind == "compute" and s.category in categories)


def time_collective(op: str, nbytes: float, gpus: int, topology, profile, algo: str = "ring",
                    channels: int | None = None, fluid: bool = True) -> float:
    """Seconds one collective of ``nbytes`` over ranks 0..gpus-1 takes on ``topology``,
    links derated by the profile's achieved efficiency (as in training runs).

    ``fluid`` prices each ring hop as one transfer of all its steps (``sim.engine.algorithms``);
    on uncontended rings that is exactly the step-by-step time, and far cheaper."""
    group = tuple(range(gpus))
    prog = Program({r: [Action(op, kind="collective", op=op, group=group, nbytes=nbytes, algo=algo,
                               channels=channels or 0)] for r in group})
    return simulate(prog, topology, link_efficiency=profile.link_efficiencies(), fluid_collectives=fluid).end_s


# ----------------------------------------------------------------- outputs
def write_csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> None:
    """Write ``rows`` as CSV through a temporary file and a rename (as every output here)."""
    cols = columns or list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\r\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: _csv_value(r.get(k)) for k in cols})
    write_text_atomic(buf.getvalue(), path)


def _csv_value(v):
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def write_json(path: Path, obj) -> None:
    write_text_atomic(json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n", path)


def md_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A markdown table: ``columns`` are (key, header, format spec or '' for str)."""
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    sep = "|" + "|".join("---:" if f else "---" for _, _, f in columns) + "|"
    lines = [head, sep]
    for r in rows:
        cells = []
        for k, _, f in columns:
            v = r.get(k)
            if v is None or (isinstance(v, float) and math.isnan(v)):
                cells.append("–")
            elif f:
                cells.append(format(v, f))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_verdict(args, *, title: str, question: str, answer: str, figures: list[str], body: str = "",
                  caveats: str = "", setup: str = "", headline: str = "") -> Path:
    """``verdict.md``: question, setup, picture(s), answer, numbers, caveats (one short
    section of the report; ``report.py`` stitches them together), and ``headline.md``,
    the one-line answer for the report's summary table."""
    if headline:
        write_text_atomic(headline.strip() + "\n", args.out / "headline.md")
    parts = [f"## {title}", "", f"**Question.** {question}", ""]
    if setup:
        parts += [f"**Setup.** {setup}", ""]
    for fig in figures:
        parts += [f"![{title}]({fig})", ""]
    parts += [f"**Answer.** {answer}", ""]
    if body:
        parts += [body.strip(), ""]
    if caveats:
        parts += [f"**Caveats.** {caveats}", ""]
    mode = "reduced (`--quick`)" if args.quick else "full"
    parts += [f"*Simulated with trainsim ({mode} run) by `experiments/{args.name}.py`; "
              f"data in `{args.name}.csv`.*", ""]
    path = args.out / "verdict.md"
    write_text_atomic("\n".join(parts), path)
    return path


# ----------------------------------------------------------------- charts
def pyplot():
    """matplotlib's pyplot on the Agg backend, with a readable default style."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "font.size": 9.5, "axes.titlesize": 10.5, "axes.grid": True,
                         "grid.alpha": 0.3, "legend.fontsize": 8.2, "legend.framealpha": 0.85,
                         "savefig.bbox": "tight"})
    return plt


def save(fig, path: Path) -> None:
    """Save ``fig`` (format from the suffix) through a temporary file and a rename."""
    import matplotlib.pyplot as plt

    try:
        with atomic_path(path, suffix=Path(path).suffix) as tmp:
            fig.savefig(tmp)
    finally:
        plt.close(fig)


COLORS = {"gpipe": "#1f77b4", "1f1b": "#ff7f0e", "interleaved v=2": "#2ca02c", "interleaved v=4": "#17becf",
          "zb-h1": "#d62728", "zb-h2": "#9467bd"}


def fmt_bytes(b: float) -> str:
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(b) >= div:
            return f"{b / div:.3g} {unit}"
    return f"{b:.0f} B"


def pct(x: float) -> str:
    return f"{x * 100:.1f}%"
