"""``trainsim explain``: where one micro-batch's time goes, kernel by kernel.

Takes the model, cluster and plan flags of ``trainsim estimate`` and prints, for one GPU
of the plan, every kernel the simulator charges for one transformer layer, the embedding
and the output head (shape, FLOPs, bytes, time, bound, rate, efficiency), the
tensor-parallel collectives between them, totals per phase, and the per-iteration terms
of the first-order estimate (``sim.results.explain``). ``--json`` prints the same as one
object.
"""

from __future__ import annotations

import json

from sim.commands.settings import ESTIMATE_FLAGS, analytic_inputs
from sim.inputs.flags import add_arguments as add_schema_arguments
from sim.results.explain import explain, render

NAME = "explain"
HELP = "Where one micro-batch's time goes on one GPU, kernel by kernel (what the simulator charges)."


def add_arguments(p) -> None:
    add_schema_arguments(p, ESTIMATE_FLAGS)


def run(args) -> int:
    settings, model, plan, profile = analytic_inputs(args)
    report = explain(model, plan, profile, gpus_per_node=settings.cluster.node_gpus())
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 0
