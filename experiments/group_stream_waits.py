"""Which data-parallel collectives of a row wait behind the one before them on their group's stream.

Since each process group's collectives run on one stream in issue order
(``sim.program.process_group_streams``), a gather can be held up by a reduce-scatter issued before
it, and the other way round. This script simulates rows of a measured-runs CSV as the fit does
(``sim.calibrate.fit_sims``) and, on the first simulated rank's group streams (``dp``, ``edp``),
counts the collectives that started when the one before them on the stream ended, later than
their own dependencies were met, with the seconds they waited, by operation:

    python experiments/group_stream_waits.py experiments/fit-data/fsdp_runs.csv 4,5

(the CSV's line numbers, as ``experiments/fit_rows.py`` prints them). docs/accuracy.md ("One NCCL
stream per process group") quotes its counts.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.calibrate.fit_sims import COLLECTIVE_MODEL, FIDELITY, prepare_rows  # noqa: E402
from sim.calibrate.runs_csv import read_runs  # noqa: E402
from sim.inputs.schema import SimulationSettings  # noqa: E402
from sim.program.process_group_streams import DENSE_STREAM, EXPERT_STREAM  # noqa: E402
from sim.session import Job, simulate_training  # noqa: E402


def waits(trace, program, rank: int, stream: str) -> tuple[int, dict[str, tuple[int, float]]]:
    """(collectives on ``stream`` of ``rank``, {op: (how many waited behind the one before, seconds)})."""
    acts = {a.name: a for a in program.actions[rank]}
    end = {s.name: s.end_s for s in trace.spans_of(rank)}
    spans = trace.spans_of(rank, stream)
    out: dict[str, list] = {}
    for prev, s in zip(spans, spans[1:]):
        a = acts[s.name]
        ready = max([end.get(d, 0.0) for d in a.deps if isinstance(d, str)] or [0.0])
        if s.start_s > ready and s.start_s == prev.end_s:
            w = out.setdefault(a.op, [0, 0.0])
            w[0] += 1
            w[1] += s.start_s - ready
    return len(spans), {op: (n, t) for op, (n, t) in sorted(out.items())}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path, lines = argv[0], {int(x) for x in argv[1].split(",")}
    for r in read_runs(path):
        if r.line not in lines:
            continue
        p = prepare_rows([r], r.gpu, path)[0]
        run = simulate_training(Job(p.model, p.plan, p.profile, p.topology, p.schedule),
                                SimulationSettings(fidelity=FIDELITY, collective_model=COLLECTIVE_MODEL,
                                                   max_events=p.settings.simulation.max_events))
        rank = min(run.program.actions)
        for stream in (DENSE_STREAM, EXPERT_STREAM):
            n, got = waits(run.trace, run.program, rank, stream)
            if n:
                said = ", ".join(f"{op} {k} ({t * 1e3:.1f} ms)" for op, (k, t) in got.items()) or "none"
                print(f"{Path(path).stem}:{r.line} {r.label()}: stream {stream}, {n} collectives; "
                      f"waited behind the one before: {said}; step {run.trace.end_s:.4f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
