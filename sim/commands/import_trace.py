"""``trainsim import-trace``: per-op times and a timeline from PyTorch profiler traces.

Reads one Kineto (``torch.profiler``) Chrome trace per rank and prints the ops that took
the most time (GPU kernels, or CPU operators with their self time when there are no
kernels). ``--out DIR`` also writes the measured timeline as a PNG (drawn like a
simulated one) and as a Perfetto trace. No torch needed.
"""

from __future__ import annotations

import json
from pathlib import Path

NAME = "import-trace"
HELP = "Per-op times and a timeline PNG from PyTorch profiler (Kineto) traces, one per rank."


def add_arguments(p) -> None:
    from sim.inputs.flags import add_section
    from sim.inputs.schema_commands import ImportTraceOptions

    add_section(p, ImportTraceOptions)


def run(args) -> int:
    from sim.calibrate.kineto import op_times, trace_from_kineto
    from sim.fileio import check_output_dir

    check_output_dir(args.out, "--out")
    trace = trace_from_kineto(args.traces, level=args.level)
    per_file = [(str(path), op_times(path)) for path in args.traces]
    if args.out:
        from sim.results.export import write_chrome
        from sim.results.plot import TimelineView, plot_timeline

        out = Path(args.out)
        write_chrome(trace, out / "trace.json")
        plot_timeline(trace, out / "timeline.png", TimelineView(title=f"measured: {len(args.traces)} rank(s), "
                                                                      f"{trace.end_s * 1e3:.2f} ms"))
    if args.json:
        print(json.dumps({"end_s": trace.end_s, "spans": len(trace.spans),
                          "files": {p: t for p, t in per_file}}, sort_keys=True))
        return 0
    for path, t in per_file:
        print(f"{path}: top {min(args.top, len(t['ops']))} of {len(t['ops'])} {t['kind'].replace('_', ' ')}s by time")
        print(f"  {'op':<60} {'calls':>6} {'total':>10} {'self':>10}")
        for name, row in list(t["ops"].items())[: args.top]:
            print(f"  {name[:60]:<60} {row['count']:>6} {row['total_s'] * 1e3:>7.2f} ms {row['self_s'] * 1e3:>7.2f} ms")
    print(f"timeline: {len(trace.spans)} spans on {len(trace.streams())} rank(s), {trace.end_s * 1e3:.2f} ms")
    if args.out:
        print(f"wrote {Path(args.out) / 'timeline.png'} and trace.json")
    return 0
