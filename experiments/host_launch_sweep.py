"""How the Megatron-Bridge MoE rows whose host waits move with the host's time per kernel.

After a dispatcher's synchronisation the host launches the rest of the MoE layer onto an idle
GPU, ``sim.program.launch.HOST_LAUNCH_S`` seconds a kernel (6.71 µs, measured without
Transformer Engine's Python: a lower bound). This analysis simulates rows of
``experiments/fit-data/megatron_bridge_runs.csv`` at their GPU's preset with that cost set to
each of a few values, to see what host time per kernel each row would need to come out right.
It changes the constant for this process only; no preset or default moves.

    python experiments/host_launch_sweep.py 6.71,20,40,80 b200:27 gb200:18 ...

Each argument after the values is GPU:LINE. A row takes 1 to 60 seconds a value.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import sim.program.launch as launch  # noqa: E402
import sim.program.segments as segments  # noqa: E402
from sim.calibrate.fit_sims import prepare_rows, row_time_s  # noqa: E402
from sim.calibrate.runs_csv import read_runs  # noqa: E402
from sim.inputs.hardware import load_profile  # noqa: E402

DATA = ROOT / "experiments" / "fit-data" / "megatron_bridge_runs.csv"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    values_s = [float(v) * 1e-6 for v in argv[0].split(",")]
    runs = {r.line: r for r in read_runs(DATA)}
    for spec in argv[1:]:
        gpu, line = spec.split(":")
        run = runs[int(line)]
        profile = load_profile(gpu)
        cells = []
        for c in values_s:
            launch.HOST_LAUNCH_S = segments.HOST_LAUNCH_S = c  # (segments imported the name)
            t = row_time_s(prepare_rows([run], gpu)[0], profile)
            cells.append(f"{c * 1e6:5.1f} us {t / run.measured_s - 1:+6.1%}")
        print(f"{gpu}:{line} {run.group[1]} ({run.precision}): " + "   ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
