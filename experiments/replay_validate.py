"""``trainsim validate``'s real runs replayed (``trainsim replay`` of a CPU job's traces).

For each configuration of a validate output directory (``validate --out DIR``), replays
every rank's profiler trace with the profile that run calibrated, and prints the replayed
iteration beside the traced one (the profiled iteration's ``ProfilerStep#0``, the slowest
rank's) and validate's measured iteration (the median of its timed iterations), with the
load average validate recorded. The replay takes the profiler's cost per recorded event off
(the profile's ``profiler_op_overhead_s``); the row also gives the replay with it kept, and
how much longer the profiled iteration took than the measured one (validate's
``traced_iteration_s``, where the report has it):

    trainsim validate --procs 2 --iters 3 --warmup 1 --out DIR
    python experiments/replay_validate.py DIR [--json]

The table in docs/replay.md ("How close") was made so, on 2026-12-06.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rows(out: Path) -> list[dict]:
    from sim.replay.kineto import read_kineto
    from sim.replay.run import WhatIf, replay

    from dataclasses import replace

    from sim.inputs.hardware import load_profile

    report = json.loads((out / "report.json").read_text())
    profile = out / "profile.json"
    # (the same replay with the profiler's cost kept: a copy of the profile without it)
    kept = Path(tempfile.mkdtemp(prefix="replay-validate-")) / "profile-profiler-kept.json"
    replace(load_profile(profile), profiler_op_overhead_s=None).save(kept)
    result = []
    for config, d in report["configs"].items():
        files = sorted((out / "traces" / config).glob("trace_rank*.json"))
        graphs = [read_kineto(str(f)) for f in files]
        s = replay(graphs, WhatIf(gpu=str(profile))).summary
        with_prof = replay(graphs, WhatIf(gpu=str(kept))).summary["iteration_time_s"]
        measured, traced, replayed = d["measured"]["iteration_s"], s["traced_step_s"], s["iteration_time_s"]
        profiled = d.get("traced_iteration_s")  # (validate's own timing of the profiled iteration)
        result.append({"config": config, "ranks": len(files), "measured_s": measured, "traced_s": traced,
                       "replay_s": replayed, "replay_vs_traced": (replayed - traced) / traced,
                       "replay_vs_measured": (replayed - measured) / measured,
                       "replay_profiler_kept_s": with_prof,
                       "replay_profiler_kept_vs_measured": (with_prof - measured) / measured,
                       "profiler_op_overhead_s": s.get("profiler_op_overhead_s"),
                       "profiler_removed_s": s.get("profiler_removed_s"),
                       "profiled_iteration_s": profiled,
                       "profiled_vs_measured": (profiled - measured) / measured if profiled else None,
                       "measured_iterations_s": d["measured_iterations_s"],
                       "load_average": report.get("load_average")})
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="a trainsim validate --out directory")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = rows(args.out)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    for r in result:
        la = r["load_average"] or {}
        load = f"load {la['before'][0]:.1f} -> {la['after'][0]:.1f}" if la else ""
        prof = (f"  profiled iteration {r['profiled_vs_measured'] * 100:+5.1f}% on measured"
                if r["profiled_vs_measured"] is not None else "")
        print(f"{r['config']:6} {r['ranks']} ranks  measured {r['measured_s'] * 1e3:8.1f} ms  traced "
              f"{r['traced_s'] * 1e3:8.1f} ms  replay {r['replay_s'] * 1e3:8.1f} ms  "
              f"vs traced {r['replay_vs_traced'] * 100:+5.1f}%  vs measured {r['replay_vs_measured'] * 100:+6.1f}%  "
              f"(profiler's cost kept: {r['replay_profiler_kept_vs_measured'] * 100:+6.1f}%){prof}  {load}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
