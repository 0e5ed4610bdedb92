"""One MoE layer's time, measured against simulated: where a measured MoE run's step goes per layer.

For each row of a measured-runs CSV (``experiments/fit-data/megatron_bridge_runs.csv``) with a
mixture of experts, prints what the measured step implies for one MoE layer on one micro-batch,
beside what ``trainsim explain`` charges for it (``sim.results.explain``: the row's plan as the
fit builds it, ``sim.calibrate.fit_sims.prepare_rows``), the latter split into all-to-alls and
other collectives, the attention core, the routed experts' GEMMs, the other GEMMs and the
memory-bound kernels. It tells which rows a missing MoE-layer cost would have to explain, and
how large it is per layer, without a simulation of the whole step.

The measured-implied layer: a rank of the first pipeline stage runs m micro-batches of L layers
plus the embedding, and the last stage's the output head and loss; with the interleaved
schedule's bubble, a fraction (pp − 1)/(vpp·m) of the steady state (Megatron-LM's, Narayanan et
al. 2021, Sec. 2.2), the step is about (1 + bubble) · m · (L · t_layer + t_edges), so

    t_layer = (step / (1 + bubble) − m · t_edges) / (L · m)

with t_edges the embedding's and head's time as ``explain`` charges them (both counted: an
upper bound on what one stage runs, so t_layer is, if anything, low). The optimizer step, the
data-parallel gradient reduction left exposed and dense layers are not taken out: for the
single-stage rows of the Megatron-Bridge tables they are a few percent of the step.

    python experiments/moe_layer_gap.py experiments/fit-data/megatron_bridge_runs.csv [--lines 18,48,59]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CATEGORIES = ("a2a/comm", "attention", "expert gemm", "other gemm", "memory")


def category(row: dict) -> str:
    """Which of ``CATEGORIES`` one ``explain`` row (kernel or collective) falls in."""
    if row["kind"].endswith(" comm"):
        return "a2a/comm"
    if row["kind"] == "attention":
        return "attention"
    if row["kind"] == "gemm":
        return "expert gemm" if row["name"].startswith("moe.experts.") else "other gemm"
    return "memory"


def implied_layer_s(step_s: float, microbatches: int, layers: int, edges_s: float, pp: int = 1,
                    vpp: int = 1) -> float:
    """Seconds of one layer on one micro-batch that a measured step implies (module doc)."""
    bubble = (pp - 1) / (vpp * microbatches) if pp > 1 else 0.0
    return (step_s / (1 + bubble) - microbatches * edges_s) / (layers * microbatches)


def layer_gap(run) -> dict | None:
    """One MoE row's measured-implied and simulated layer (seconds), the latter by category;
    None for a row without a mixture of experts."""
    from sim.calibrate.fit_sims import prepare_rows
    from sim.results.explain import explain

    p = prepare_rows([run], run.gpu)[0]
    if not p.model.moe:
        return None
    rep = explain(p.model, p.plan, p.profile, gpus_per_node=p.settings.cluster.node_gpus())
    part = rep["parts"].get("moe layer") or next(v for v in rep["parts"].values() if v.get("moe"))  # (a layer pattern's)
    by = dict.fromkeys(CATEGORIES, 0.0)
    for row in part["rows"]:
        by[category(row)] += row["time_s"]
    edges = rep["parts"]["head"]["total_s"] + rep["parts"]["embedding"]["total_s"]
    plan = p.plan
    return {"line": run.line, "label": run.group[1] if isinstance(run.group, tuple) and run.group[1] else run.label(), "gpu": run.gpu, "micro_batch_size": plan.micro_batch_size,
            "microbatches": plan.num_microbatches, "layers": rep["layers_per_stage"][0],
            "measured_s": run.measured_s, "simulated_layer_s": part["total_s"], "by_category_s": by,
            "implied_layer_s": implied_layer_s(run.measured_s, plan.num_microbatches, rep["layers_per_stage"][0],
                                               edges, plan.pp, plan.vpp)}


def main(argv=None) -> int:
    from sim.calibrate.runs_csv import read_runs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", metavar="RUNS.csv")
    ap.add_argument("--lines", default="", help="only these CSV lines (comma-separated)")
    args = ap.parse_args(argv)
    lines = {int(x) for x in args.lines.split(",") if x.strip()}
    print(f"{'line':>4} {'row':<44} {'mbs':>3} {'implied':>9} {'simulated':>9} {'gap':>7}  "
          + "  ".join(f"{c:>11}" for c in CATEGORIES))
    for r in read_runs(args.runs):
        if (lines and r.line not in lines) or r.skip is not None:
            continue
        g = layer_gap(r)
        if g is None:
            continue
        gap = g["implied_layer_s"] - g["simulated_layer_s"]
        print(f"{g['line']:>4} {g['label'][:44]:<44} {g['micro_batch_size']:>3} {g['implied_layer_s'] * 1e3:>7.2f}ms "
              f"{g['simulated_layer_s'] * 1e3:>7.2f}ms {gap * 1e3:>+5.2f}ms  "
              + "  ".join(f"{g['by_category_s'][c] * 1e3:>9.2f}ms" for c in CATEGORIES), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
