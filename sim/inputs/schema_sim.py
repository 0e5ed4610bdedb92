"""The simulation and output sections of the settings (``sim.inputs.schema`` gathers the
sections)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sim.inputs.fields import check_section, setting
from sim.units import Number

# Bounds shared with the modules that use the values.
DEFAULT_MAX_EVENTS = 100_000_000
"""Largest simulation attempted without ``--max-events``: about 10-20 minutes of
engine time and several GB of memory."""
FIDELITIES = ("auto", "full", "reduced")
AUTO_FULL_FIDELITY_EVENTS = 2_000_000
"""``fidelity = "auto"`` simulates every GPU when the estimated events of doing so
(``sim.program.limits``, a rough and usually high count) fit in this, which keeps a
default run to seconds; one GPU per pipeline stage otherwise."""
COLLECTIVE_MODELS = ("flows", "steps")
"""How the engine runs a ring collective: ``flows``, each hop of each channel one flow
carrying all its steps' bytes while the collective runs, every hop at once; or ``steps``,
2(n-1) lock-step rounds of n transfers (``sim.engine.algorithms``)."""
NCCL_ALGOS = ("auto", "ring", "tree", "nvls", "nvls_tree", "hierarchical")
"""What ``nccl_algo`` takes (``sim.engine.algorithms``, ``sim.engine.algorithms_nccl``)."""
NCCL_PROTOCOLS = ("auto", "ll", "ll128", "simple")
"""What ``nccl_protocol`` takes (``sim.engine.nccl``)."""


@dataclass(frozen=True)
class SimulationSettings:
    """How the iteration is simulated (written in an experiment file's [cluster] table)."""

    TABLE: ClassVar[str | None] = "cluster"
    GROUP: ClassVar[str | None] = None

    fidelity: str = setting("auto", help="full: every GPU; reduced: one GPU per pipeline stage, the others as "
                                         "shadows in its collectives (default auto: full when its estimated events "
                                         f"fit in {AUTO_FULL_FIDELITY_EVENTS:.0e}, else reduced)",
                            choices=FIDELITIES)
    collective_model: str = setting(
        "flows", help="flows: each ring hop one flow carrying its share of the bytes while the collective runs "
                      "(events grow with n); steps: 2(n-1) lock-step rounds of n transfers (default flows; reduced "
                      "fidelity always runs flows)", choices=COLLECTIVE_MODELS)
    nccl_algo: str = setting(
        "auto", help="NCCL algorithm of the training collectives, as NCCL_ALGO: auto (NCCL's tuner picks per "
                     "op, size, group and topology: sim.engine.tuner; the default), ring, tree, nvls (NVLink SHARP, "
                     "H100/H200 NVSwitch), nvls_tree or hierarchical; a collective the forced one cannot run "
                     "keeps the tuner's choice", choices=NCCL_ALGOS)
    nccl_protocol: str = setting(
        "auto", help="NCCL protocol of the training collectives, as NCCL_PROTO: auto (the tuner's choice by size; "
                     "the default), ll, ll128 or simple", choices=NCCL_PROTOCOLS)
    max_events: float = setting(
        DEFAULT_MAX_EVENTS, help="refuse a plan whose simulation would process more SimPy events than this, "
                                 f"estimated before anything is built (default {DEFAULT_MAX_EVENTS:.0e}, about half "
                                 "an hour; inf: no limit)", type=Number(float, above=0, allow_inf=True), metavar="N")

    def __post_init__(self):
        check_section(self)

    @property
    def event_limit(self) -> float | None:
        """``max_events``, with None for no limit (inf)."""
        return None if self.max_events == float("inf") else self.max_events


@dataclass(frozen=True)
class OutputSettings:
    """Where results go (the command line and ``RunResult.save``; not experiment files)."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    json: bool = setting(False, help="print one JSON object", kind="switch")
    out: str | None = setting(help="directory for summary.json, trace.json, timeline.png and memory.png")
    kineto: str | None = setting(help="directory for PyTorch-profiler-shaped traces, trace_rank{r}.json per "
                                      "simulated GPU (for Holistic Trace Analysis)", metavar="DIR")

    def __post_init__(self):
        check_section(self)
