"""Where the Megatron-Bridge rows' error lives: each row's simulated time split by kind of work,
and which kind the misses follow (issue 50).

Two steps. ``--simulate CSV --out JSON`` simulates every row of the file that a fit would use
(``trainsim fit``'s rows, fidelity and collective model) at its GPU's preset and writes, per row,
the measured and simulated step and the simulated seconds of each kind of work on the critical
rank (about 15 minutes on two cores for the 56 rows of megatron_bridge_runs.csv):

- ``compute``: GEMMs and attention, the work the preset's sustained fraction scales;
- ``memory``: every memory-bound kernel, and of them ``moe_memory`` the MoE block's
  (``sim.program.costs.in_moe_block``), split into ``moe_memory_bytes`` (bytes over the kernel's
  rate) and ``moe_memory_fixed`` (its launches);
- ``moe_gather``: the MoE block's token-moving kernels (permutation and its inverse, chunk sorts,
  padding), ``moe_act``: its activation, router and bias kernels, ``moe_cast``: its casts;
- ``moe_gemm``: the experts' GEMMs; ``ep``: exposed expert-parallel communication.

Then, from the JSON (fast): for each candidate kind of work, the least-squares fit of the
misses (measured − simulated, weighted by 1/measured, i.e. on relative errors) by a per-GPU
scale of ``compute`` (what refitting each GPU's fraction could absorb) plus one coefficient on
that kind, shared by the GPUs or one per GPU. A kind whose coefficient explains the misses on
every GPU alike is where the simulator's missing time is.

    python experiments/moe_residuals.py --simulate experiments/fit-data/megatron_bridge_runs.csv \\
        --out experiments/fit-cache/moe-residuals-2026-12-07.json
    python experiments/moe_residuals.py experiments/fit-cache/moe-residuals-2026-12-07.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GATHER = ("permute", "unpermute", "sort_chunks", "unsort_chunks", "pad", "unpad")
CAST = ("quantize", "amax", "to_fp8", "to_fp8_t", "swizzle", "weight_quantize", "weight_transpose")
LEFT_OUT = (25, 27)
"""Rows left out of the regression: B200 GPT-OSS 120B (25.11) publishes half the GB200 row's
throughput per token at a smaller layout, and B200 Qwen3-235B-A22B (25.11) is 25% slower than the
same model and GPU in 25.09 (the tables' own inconsistencies, as line 26's; their misses, 47% and
35%, would set any coefficient alone). Line 25 ran the table's EP 8 when
moe-residuals-2026-12-07.json was simulated; the row runs its recipe's EP 64 since (its notes), which
explains its throughput (B200 -9.7% at the preset, was -47%), so a new ``--simulate`` run may keep it."""


def family(name: str) -> str:
    """A MoE-block op's family: the part of its name that says what it does."""
    parts = name.split(".")
    if len(parts) > 2 and parts[1] == "experts":
        return parts[-2] if parts[-1] == "grad" else parts[-1]
    return parts[1] if len(parts) > 1 else parts[0]


def simulate(csv: str) -> list[dict]:
    from sim.calibrate.fit_sims import COLLECTIVE_MODEL, FIDELITY, prepare_rows
    from sim.calibrate.runs_csv import read_runs
    from sim.inputs.schema import SimulationSettings
    from sim.program.costs import MOE_BLOCK_PREFIX
    from sim.results.explain import explain
    from sim.results.metrics import critical_rank, rank_breakdown
    from sim.session import Job, simulate_training

    out = []
    for r in read_runs(csv):
        if r.skip is not None:
            continue
        p = prepare_rows([r], r.gpu, csv)[0]
        m, plan, prof = p.model, p.plan, p.profile
        rep = explain(m, plan, prof, gpus_per_node=p.settings.cluster.node_gpus())
        n_moe = sum(1 for i in range(m.num_layers) if m.is_moe_layer(i)) if m.moe else 0
        kinds: dict = defaultdict(float)
        for name, part in rep["parts"].items():
            if name in ("embedding", "head"):
                continue
            count = part.get("count")
            if count is None:
                count = n_moe if name == "moe layer" else m.num_layers - n_moe
            weight = count / plan.pp * plan.num_microbatches  # layers of the critical stage x micro-batches
            for row in part["rows"]:
                t = row["time_s"] * weight
                if row["kind"] in ("gemm", "attention"):
                    kinds["compute"] += t
                    if row["kind"] == "gemm" and row["name"].startswith("moe.experts"):
                        kinds["moe_gemm"] += t
                elif row["kind"] == "memory":
                    kinds["memory"] += t
                    if row["name"].startswith(MOE_BLOCK_PREFIX):  # (sim.program.costs.in_moe_block's rule)
                        kinds["moe_memory"] += t
                        stream = row["bytes"] / (prof.hbm_bandwidth_Bps * row["efficiency"]) * weight
                        kinds["moe_memory_bytes"] += min(stream, t)
                        kinds["moe_memory_fixed"] += max(0.0, t - stream)
                        fam = family(row["name"])
                        kinds["moe_gather" if fam in GATHER else "moe_cast" if fam in CAST else "moe_act"] += t
        run = simulate_training(Job(m, plan, prof, p.topology, p.schedule),
                                SimulationSettings(fidelity=FIDELITY, collective_model=COLLECTIVE_MODEL,
                                                   max_events=p.settings.simulation.max_events))
        brk = rank_breakdown(run.trace, critical_rank(run.trace))
        kinds["ep"] = brk["exposed_comm_s"].get("ep", 0.0)
        d = {"line": r.line, "gpu": r.gpu, "row": r.label(), "moe": bool(m.moe), "measured_s": r.measured_s,
             "simulated_s": run.trace.end_s, **{k: kinds[k] for k in sorted(kinds)}}
        out.append(d)
        print(f"line {r.line}: {r.label()} {r.gpu} {100 * (d['simulated_s'] / r.measured_s - 1):+.1f}%",
              file=sys.stderr, flush=True)
    return out


def regress(rows: list[dict], kind: str | None, per_gpu: bool) -> tuple[dict, np.ndarray]:
    gpus = sorted({d["gpu"] for d in rows})

    def features(d):
        f = [d.get("compute", 0.0) if d["gpu"] == g else 0.0 for g in gpus]
        if kind:
            f += [d.get(kind, 0.0) if d["gpu"] == g else 0.0 for g in gpus] if per_gpu else [d.get(kind, 0.0)]
        return f

    x = np.array([features(d) for d in rows])
    m = np.array([d["measured_s"] for d in rows])
    y = m - np.array([d["simulated_s"] for d in rows])
    coef, *_ = np.linalg.lstsq(x / m[:, None], y / m, rcond=None)
    names = [f"scale {g}" for g in gpus] + ([f"{kind} {g}" for g in gpus] if per_gpu else [kind] if kind else [])
    return dict(zip(names, coef)), (y - x @ coef) / m


BOOTSTRAP = 2000
"""Resamplings of the rows (with replacement, numpy's default generator, seed 0) behind the
joint fit's ranges."""


def regress_joint(rows: list[dict], kinds: tuple[str, ...]) -> tuple[dict, np.ndarray]:
    """As ``regress``, with one shared coefficient for each of ``kinds`` at once."""
    gpus = sorted({d["gpu"] for d in rows})
    x = np.array([[d.get("compute", 0.0) if d["gpu"] == g else 0.0 for g in gpus] + [d.get(k, 0.0) for k in kinds]
                  for d in rows])
    m = np.array([d["measured_s"] for d in rows])
    y = m - np.array([d["simulated_s"] for d in rows])
    coef, *_ = np.linalg.lstsq(x / m[:, None], y / m, rcond=None)
    return dict(zip(kinds, coef[len(gpus):])), (y - x @ coef) / m


def bootstrap(rows: list[dict], kinds: tuple[str, ...]) -> tuple[dict, dict]:
    """The 5th and 95th percentiles of ``regress_joint``'s coefficients over ``BOOTSTRAP``
    resamplings of ``rows``."""
    rng = np.random.default_rng(0)
    draws = np.array([[c[k] for k in kinds] for c in (
        regress_joint([rows[i] for i in rng.integers(0, len(rows), len(rows))], kinds)[0]
        for _ in range(BOOTSTRAP))])
    low, high = np.percentile(draws, [5, 95], axis=0)
    return dict(zip(kinds, low)), dict(zip(kinds, high))


def report(rows: list[dict]) -> None:
    kept = [d for d in rows if d["line"] not in LEFT_OUT]
    print(f"{len(kept)} rows ({len(rows) - len(kept)} left out: lines "
          f"{', '.join(str(x) for x in LEFT_OUT)}); misses as the presets simulate them:")
    rel = np.array([d["simulated_s"] / d["measured_s"] - 1 for d in kept])
    moe = np.array([d["moe"] for d in kept])
    print(f"  dense rows {100 * rel[~moe].mean():+.1f}% on average, MoE rows {100 * rel[moe].mean():+.1f}%")
    print()
    print(f"{'the misses fitted by':<42}{'rms':>7}{'mean':>7}{'max':>7}  coefficient of the kind (per GPU)")
    for kind in (None, "memory", "moe_memory_bytes", "moe_gather", "moe_act", "moe_cast", "moe_gemm", "ep"):
        coef, res = regress(kept, kind, per_gpu=False)
        label = f"per-GPU compute scale + {kind}" if kind else "per-GPU compute scale alone"
        shared = f"{coef[kind]:5.2f}" if kind else "     "
        per = ""
        if kind:
            cg, _ = regress(kept, kind, per_gpu=True)
            per = " (" + ", ".join(f"{k.split()[1]} {v:.2f}" for k, v in cg.items() if k.startswith(kind)) + ")"
        print(f"{label:<42}{100 * np.sqrt(np.mean(res ** 2)):6.1f}%{100 * np.mean(abs(res)):6.1f}%"
              f"{100 * np.max(abs(res)):6.1f}%  {shared}{per}")
    print()
    families = ("moe_gather", "moe_act", "moe_cast")
    coef, res = regress_joint(kept, families)
    low, high = bootstrap(kept, families)
    print(f"the block's three families fitted together ({100 * np.sqrt(np.mean(res ** 2)):.1f}% rms), with the "
          f"5-95% range of {BOOTSTRAP} resamplings of the rows:")
    for k in families:
        print(f"  {k:<12}{coef[k]:6.2f}   ({low[k]:.2f} to {high[k]:.2f})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="?", help="a file written by --simulate")
    ap.add_argument("--simulate", metavar="CSV", help="simulate the rows of CSV")
    ap.add_argument("--out", metavar="JSON", help="with --simulate: where to write the rows")
    a = ap.parse_args(argv)
    if a.simulate:
        rows = simulate(a.simulate)
        if a.out:
            Path(a.out).write_text(json.dumps({"csv": a.simulate, "rows": rows}, indent=1) + "\n")
    elif a.json:
        rows = json.loads(Path(a.json).read_text())["rows"]
    else:
        ap.error("give a JSON file, or --simulate CSV")
    report(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
