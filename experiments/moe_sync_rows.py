"""The Megatron-Bridge MoE rows by what their host does, and how far off each class comes out.

Megatron-Core's token dispatchers copy the token counts to the host in every MoE forward when
they run dropless (the alltoall dispatcher before its all-to-all, HybridEP and DeepEP to size
their buffers), unless a CUDA graph covers the whole layer; with a capacity factor (drop and
pad) the host knows every count and never waits (``sim.program.launch``). After such a
synchronisation the host launches the rest of the layer onto an idle GPU. This script reads the
presets' committed fit reports (no simulation) and prints each MoE row of
``experiments/fit-data/megatron_bridge_runs.csv`` with its class, synchronising or not, and its
precision, then each class's mean fitted and held-out error:

    python experiments/moe_sync_rows.py
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "experiments" / "fit-data" / "megatron_bridge_runs.csv"
REPORTS = {gpu: ROOT / "experiments" / "fit-cache" / f"{gpu}-fit-report-2026-12-07-mla-fp8.json"
           for gpu in ("h100-sxm", "b200", "gb200", "gb300")}
"""The reports of the fits whose values the presets hold (docs/accuracy.md)."""
WHOLE_LAYER_GRAPHS = ("full", "full_iteration")
"""``cuda_graph`` cells whose graphs cover the whole layer, the dispatcher's copy included."""


def classify(row: dict) -> tuple[bool, str]:
    """(whether the row's host waits for the GPU in every MoE forward, its precision)."""
    drop = bool(row["moe_expert_capacity_factor"])
    return (not drop and row["cuda_graph"] not in WHOLE_LAYER_GRAPHS), row["precision"]


def main() -> int:
    table = {i + 2: r for i, r in enumerate(csv.DictReader(DATA.open()))}
    found = []
    for gpu, path in REPORTS.items():
        report = json.loads(path.read_text())
        for row in report["rows"]:
            if not row.get("file", str(DATA)).endswith(DATA.name):
                continue
            r = table[row["line"]]
            if not r["moe_token_dispatcher_type"]:
                continue
            found.append((classify(r), gpu, row["line"], r, row["fitted_error"], row["held_out_error"]))
    found.sort(key=lambda f: (f[0], f[1], f[2]))
    print(f"{'host waits':>10} {'prec':>4} {'gpu':>8} {'line':>4}  {'group':<34} {'dispatcher':<14} "
          f"{'graphs':<30} {'fitted':>7} {'held out':>8}")
    for (sync, prec), gpu, line, r, fit, held in found:
        disp = r["moe_token_dispatcher_type"] + (f"/{r['moe_flex_dispatcher_backend']}"
                                                 if r["moe_flex_dispatcher_backend"] else "")
        graphs = r["cuda_graph"] or ("-" if sync else "- (drop and pad)" if r["moe_expert_capacity_factor"] else "-")
        print(f"{'yes' if sync else 'no':>10} {prec:>4} {gpu:>8} {line:>4}  {r['group']:<34} {disp:<14} "
              f"{graphs:<30} {fit:+7.1%} {held:+8.1%}")
    print()
    for key in sorted({f[0] for f in found}):
        rows = [f for f in found if f[0] == key]
        fit = sum(f[4] for f in rows) / len(rows)
        held = sum(f[5] for f in rows) / len(rows)
        print(f"host waits: {'yes' if key[0] else 'no '}, {key[1]}: {len(rows):2} rows, mean error fitted {fit:+.1%}, "
              f"held out {held:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
