"""What every program-building pass reads: one ``BuildContext`` per job.

A program is built from four inputs and a few options. ``BuildContext`` holds them once,
frozen: the model, the plan, the topology (or None: priced without one), the hardware
profile *as the job runs it*, and the build options (fidelity, a custom schedule, GPUs
per node, whether isolated tensor-parallel collectives are coalesced, the event limit,
the collective model, and the NCCL pricer of coalesced collectives). The passes of
``sim.program.training`` and the analytic estimate (``sim.program.estimate``) price
everything on ``context.profile``.

**The profile is paced once, here.** A synchronous step on N GPUs runs its
compute-bound kernels at the expected slowest GPU's speed (``sim.inputs.pacing``).
``BuildContext.create`` (and ``job_profile``, for the GPU types of a mixed cluster) is
where the program layer applies that pace; a context's ``profile`` is already paced, so
nothing downstream paces again or can forget to. Pacing is idempotent (a paced profile
has no spread left), so a caller that paced before handing the profile over gets the
same numbers.

Derived values that several passes share (the coalescing pricer, the expert folding,
the copy maps of full fidelity) are computed once per context on first use.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable

from sim.errors import InputError
from sim.inputs.experts import Folding
from sim.inputs.frameworks import kernel_overhead_s
from sim.inputs.hardware import HardwareProfile
from sim.inputs.model import ModelSpec
from sim.inputs.pacing import paced
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology import Topology
from sim.program.coalesce import isolated_tp_pricer
from sim.program.limits import DEFAULT_MAX_EVENTS
from sim.program.schedules import Schedule

FIDELITIES = ("full", "reduced")


def job_profile(profile: HardwareProfile, plan: ParallelPlan) -> HardwareProfile:
    """``profile`` as the plan's job runs it: paced for its ``world_size`` GPUs
    (``sim.inputs.pacing``; the program layer's one call of ``paced``), and each kernel
    costing its framework's overhead over Megatron-Core's on top of ``kernel_launch_s``
    (``sim.inputs.frameworks.kernel_overhead_s``; the profile then lists none, so that this
    too is idempotent)."""
    extra = kernel_overhead_s(plan, profile)
    if extra:
        profile = replace(profile, kernel_launch_s=profile.kernel_launch_s + extra, framework_kernel_overhead_s=None)
    return paced(profile, plan.world_size)


@dataclass(frozen=True, eq=False)
class BuildContext:
    """The model, plan, topology, the job's (paced) profile and the build options."""

    model: ModelSpec
    plan: ParallelPlan
    profile: HardwareProfile
    """As the job runs it (``job_profile``; ``create`` paces the profile it is given)."""
    topology: Topology | None = None
    """None: no topology (no coalescing of tensor-parallel collectives; the event estimate
    assumes one)."""
    schedule: Schedule | None = None
    """A given (custom) schedule; None: the plan's, built by the ``schedule`` pass."""
    fidelity: str = "full"
    """"full": every GPU; "reduced": one GPU per pipeline stage (``sim.program.training``)."""
    gpus_per_node: int = 8
    coalesce_tp: bool = True
    """Price chains of isolated tensor-parallel collectives in closed form (``sim.program.coalesce``)."""
    max_events: float | None = DEFAULT_MAX_EVENTS
    """Refuse a simulation over this many events (``sim.program.limits``); None: no limit."""
    collective_model: str = "flows"
    nccl: Callable | None = field(default=None, repr=False)
    """(op, group, bytes) -> seconds of a collective alone (``sim.engine.tuner.alone_time``),
    for coalesced collectives and FP8's amax reductions; None: the closed forms."""

    def __post_init__(self):
        if self.fidelity not in FIDELITIES:
            raise InputError(f"fidelity: got {self.fidelity!r}; allowed: {', '.join(FIDELITIES)}")
        self.plan.check_model(self.model)

    @classmethod
    def create(cls, model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile,
               topology: Topology | None = None, **options) -> "BuildContext":
        """The context of ``plan``'s job, ``profile`` paced for its GPUs (``job_profile``);
        ``options`` are the build options (the fields after ``topology``)."""
        return cls(model, plan, job_profile(profile, plan), topology, **options)

    def on(self, profile: HardwareProfile) -> "BuildContext":
        """The same job priced on another GPU type (a mixed cluster's), paced as this one."""
        return replace(self, profile=job_profile(profile, self.plan))

    @cached_property
    def folding(self) -> Folding | None:
        """The expert groups of a mixture of experts (``sim.inputs.experts``); None without one."""
        return Folding(self.plan) if self.model.moe else None

    @cached_property
    def tp_price(self) -> Callable | None:
        """The closed-form price of isolated tensor-parallel collectives
        (``sim.program.coalesce``), or None where they are not coalesced: without a topology,
        under TP overlap (overlapped chunks are not a chain), or with expert or context
        groups (their collectives share links with other traffic)."""
        plan, model = self.plan, self.model
        expert_groups = plan.ep > 1 or (model.moe and plan.etp_size not in (1, plan.tp)) or plan.cp > 1
        if not self.coalesce_tp or self.topology is None or plan.tp_comm_overlap or expert_groups:
            return None
        return isolated_tp_pricer(plan, self.topology, self.profile.link_efficiencies(), self.nccl)
