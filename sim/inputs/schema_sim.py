"""The simulation and output sections of the settings (``sim.inputs.schema`` gathers the
sections)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sim.inputs.fields import check_section, setting
from sim.inputs.topology import DEFAULT_PXN_LEVEL, PXN_LEVELS
from sim.inputs.stragglers import SLOWDOWN_FORMS, Checked, normalized, parse_slowdown
from sim.units import NONNEGATIVE_INT, FRACTION, Number

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
COLLECTIVE_OPS = ("allreduce", "reducescatter", "allgather", "broadcast", "alltoall", "shift", "sendrecv")
"""Collective operations an action may name (``sim.engine.algorithms`` builds each;
``sim.program.actions.OPS``, ``trainsim collective --op``)."""
COLLECTIVE_ALGOS = ("ring", "hierarchical", "tree", "nvls", "nvls_tree", "auto")
"""Collective algorithms (``sim.engine.algorithms``, ``sim.engine.algorithms_nccl``); auto:
NCCL's choice (``sim.engine.nccl``; ``sim.program.actions.ALGOS``, ``trainsim collective --algo``)."""
COLLECTIVE_PROTOCOLS = ("ll", "ll128", "simple", "auto")
"""NCCL protocols (``sim.engine.nccl``); auto: NCCL's choice by size (``sim.program.actions.PROTOCOLS``)."""
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
                     "H100/H200/B200/GB200 NVSwitch), nvls_tree or hierarchical; a collective the forced one cannot run "
                     "keeps the tuner's choice", choices=NCCL_ALGOS)
    nccl_protocol: str = setting(
        "auto", help="NCCL protocol of the training collectives, as NCCL_PROTO: auto (the tuner's choice by size; "
                     "the default), ll, ll128 or simple", choices=NCCL_PROTOCOLS)
    nccl_pxn_disable: bool = setting(
        False, kind="bool",
        help="as NCCL_PXN_DISABLE=1: no PXN, every send to another node leaves by the sender's own NIC (a cross-rail "
             "send climbs to a spine of a rail fabric); default false: PXN as NCCL runs it (nccl_p2p_pxn_level)")
    nccl_p2p_pxn_level: int = setting(
        DEFAULT_PXN_LEVEL, type=int, choices=PXN_LEVELS,
        help="as NCCL_P2P_PXN_LEVEL, for all-to-alls, send/receive and the MoE dispatchers' exchanges on a fabric "
             "with rails: 0 each send on the sender's own NIC; 1 a send to another node goes over NVLink to the GPU "
             "whose NIC serves the destination's rail when the sender does not reach that NIC itself; 2 always "
             "through that NIC's first GPU (NCCL's default)")
    max_events: float = setting(
        DEFAULT_MAX_EVENTS, help="refuse a plan whose simulation would process more SimPy events than this, "
                                 f"estimated before anything is built (default {DEFAULT_MAX_EVENTS:.0e}, about half "
                                 "an hour; inf: no limit)", type=Number(float, above=0, allow_inf=True), metavar="N")
    slow_gpu: str | None = setting(
        help="slow GPUs: GPU=FACTOR[,...], each GPU's compute kernels taking FACTOR times as long (1.3: 30 "
             "percent slower; GPU: a device id such as node3/gpu5, or a rank); runs every GPU (full fidelity), "
             "and the ideal iteration too to report the cost", type=Checked("slow_gpu", link=False),
        metavar="GPU=FACTOR[,...]", tables=(("stragglers", "slow_gpu"),))
    degrade_link: str | None = setting(
        help="degraded links: LINK=FACTOR[,...], each link keeping FACTOR (0-1] of its bandwidth both ways "
             "(LINK: A-B, e.g. node0/gpu2-node0/nvswitch, or a device for all its links, e.g. node1/nic3)",
        type=Checked("degrade_link", link=True), metavar="LINK=FACTOR[,...]",
        tables=(("stragglers", "degrade_link"),))
    straggler_fraction: float | None = setting(
        help="draw this fraction of the plan's GPUs as slow (round(fraction x GPUs), at least 1), with "
             "--straggler-slowdown and --straggler-seed", type=FRACTION, tables=(("stragglers", "fraction"),))
    straggler_slowdown: str | None = setting(
        help=f"the drawn GPUs' compute slowdown factor: {SLOWDOWN_FORMS} (median x exp(sigma x Z))",
        type=Checked("straggler_slowdown"), metavar="DIST", tables=(("stragglers", "slowdown"),))
    straggler_seed: int = setting(0, help="seed of the drawn stragglers (numpy PCG64; default 0)",
                                  type=NONNEGATIVE_INT, tables=(("stragglers", "seed"),))

    def __post_init__(self):
        check_section(self)
        for name, link in (("slow_gpu", False), ("degrade_link", True)):
            value = getattr(self, name)
            if value is not None:  # (kept as one canonical string, whether given as a string or a list)
                object.__setattr__(self, name, normalized(value, name, link))
        if self.straggler_slowdown is not None:
            parse_slowdown(self.straggler_slowdown)

    @property
    def pxn_level(self) -> int:
        """The PXN level the run's sends follow (``sim.inputs.topology``): 0 under
        ``nccl_pxn_disable`` (NCCL reads ``NCCL_P2P_PXN_LEVEL`` as 0 then), else
        ``nccl_p2p_pxn_level``."""
        return 0 if self.nccl_pxn_disable else self.nccl_p2p_pxn_level

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
    export_chakra: str | None = setting(help="directory for Chakra execution traces of the program, trainsim.{r}.et "
                                             "per rank and comm_group.json (for ASTRA-sim; needs the protobuf "
                                             "package: pip install 'trainsim[chakra]')", metavar="DIR")

    def __post_init__(self):
        check_section(self)
