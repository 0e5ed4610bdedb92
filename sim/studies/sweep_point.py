"""One point of a sweep: the context every point shares, and simulating one point.

A sweep simulates many ``ParallelPlan``\\ s of one model on one GPU profile and cluster.
What they share travels once as a ``Context`` (a worker process rebuilds the cluster's
``Topology`` from it once and keeps it), and ``evaluate(ctx, plan)`` simulates one plan
in whichever process runs it and returns a *record*, a plain JSON-able dict::

    {"key": plan key, "plan": {plan fields}, "status": "ok" | "error" | "crashed",
     "error": null | "InputError: ...", "summary": trainsim run --json's object | null}

A record depends only on the context and the plan, never on where it ran, so a sweep's
results are the same whichever executor ran them (``sim.studies.sweep``). A plan whose
simulation raises is recorded with ``status: "error"`` and the exception in one line,
and the sweep goes on.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import networkx as nx

from sim.inputs.hardware import HardwareProfile
from sim.inputs.model import ModelSpec
from sim.inputs.plan import ParallelPlan
from sim.studies.search import plan_key


@dataclass(frozen=True, eq=False)
class Context:
    """What every point of a sweep shares: the model, the GPU profile and the cluster.

    The topology travels as its networkx graph and name (a ``Topology`` keeps caches
    that do not pickle); workers rebuild it once per context and keep it."""

    model: ModelSpec
    profile: HardwareProfile
    graph: nx.Graph
    topology_name: str
    token: str
    """Identifies the context inside a worker's cache (set by ``make_context``)."""

    def topology(self):
        return _topology(self)


def make_context(model: ModelSpec, profile: HardwareProfile, topology) -> Context:
    """A ``Context`` for a built ``sim.inputs.topology.Topology``."""
    token = f"{os.getpid()}-{id(topology)}-{time.time_ns()}"
    ctx = Context(model, profile, topology.graph, topology.name, token)
    _TOPOLOGIES[token] = topology
    return ctx


_TOPOLOGIES: dict = {}


def _topology(ctx: Context):
    topo = _TOPOLOGIES.get(ctx.token)
    if topo is None:
        from sim.inputs.topology import Topology

        if len(_TOPOLOGIES) > 8:
            _TOPOLOGIES.clear()
        topo = _TOPOLOGIES[ctx.token] = Topology(ctx.graph, ctx.topology_name)
    return topo


def evaluate(ctx: Context, plan: ParallelPlan, screening: bool = False) -> dict:
    """Simulate one point, at the fidelity ``trainsim run`` would choose (``auto``), and
    return its record (never raises for a bad plan). ``screening``: a search's screening run,
    whose record's summary is only what the search reads of it
    (``sim.results.summary.screening_summary``: the time, the fit and the peak), not the
    full summary (its breakdowns and energy cost about 6% of a simulation)."""
    from sim.session import summarize
    from sim.inputs.schema import SimulationSettings
    from sim.results.summary import screening_summary
    from sim.session import Job, simulate_training

    rec = {"key": plan_key(plan), "plan": asdict(plan), "status": "ok", "error": None, "summary": None}
    try:
        job = Job(ctx.model, plan, ctx.profile, ctx.topology())
        run = simulate_training(job, SimulationSettings(fidelity="auto"))
        rec["summary"] = screening_summary(run) if screening else summarize(run)
    except Exception as exc:  # recorded, and the sweep goes on
        rec["status"] = "error"
        rec["error"] = one_line(exc)
    # In a worker (``sweep_executors.init_worker`` opts into ``sim.gc_tuning``) what a
    # simulation leaves alive is frozen for the collector's sake, and a little of it (1-3
    # thousand objects a small point) sits in reference cycles that only the collector
    # frees. ``sim.gc_tuning`` collects them once more than ``COLLECT_FROZEN`` have piled
    # up, so a worker that runs point after point stays bounded; collecting after every
    # point instead cost 50 ms a point, half of a small point's time.
    return rec


def one_line(exc: BaseException) -> str:
    """``exc`` as a record's ``error``: its type, the first line of its message and
    where it was raised, at most 500 characters."""
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" (at {Path(where[0].filename).name}:{where[0].lineno})" if where else ""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{at}"[:500]
