"""What the layers above program/ (studies/, results/) may use of it: one public surface.

Program building's modules (``build``, ``workload``, ``estimate``, ``costs``...) change as
passes and formulas are added; studies and reports reach them only through the names
here, so that a change inside program/ shows up as a change to this list
(``tests/test_layout.py`` holds studies/ and results/ to it).

- ``context``: the priced job of a model, a plan and a GPU (the ``BuildContext`` every
  pass and the estimate read), and ``estimate_of``: its analytic step estimate.
- step pricing: per-layer phase times, group communication, transfers, kernel times.
- memory, schedules, launch and routing vocabulary the reports print.
"""

from __future__ import annotations

from sim.inputs.hardware import HardwareProfile
from sim.inputs.model import ModelSpec
from sim.inputs.plan import ParallelPlan
from sim.program.actions import Action, Program
from sim.program.build import BuildContext, job_profile
from sim.program.costs import (bias_pass_time, collective_time, fixed_time, gemm_compute_time, in_moe_block, launches, mma_flops_per_score, op_time,
                               transfer_time, work_times)
from sim.program.dispatch import default_layout, dispatch_groups, group_sizes, moe_shape
from sim.program.estimate import (Estimate, estimate, estimate_in, group_comm_time, layer_key, layer_phase_times,
                                  model_flops_per_sequence, moe_layer_groups, plan_flops_per_sequence)
from sim.program.fp8 import gemm_kernel
from sim.program.fsdp import copy_time, fsdp_copies
from sim.program.launch import HOST_LAUNCH_S, LAUNCH_CATEGORY, issue_bound
from sim.program.memory import layer_param_bytes, model_state_bytes
from sim.program.routing import Routing
from sim.program.schedules import Step
from sim.program.stage_balance import auto_layer_split, stage_profiles, stage_time_s
from sim.program.workload import (Comm, Op, Work, chunk_work, edge_works, fp8_any_layout, layer_as_run,
                                  local_sequence, plan_edge_works, plan_layer_work)


def context(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *,
            gpus_per_node: int = 8) -> BuildContext:
    """The priced job of ``plan`` (``profile`` paced for its GPUs): what the estimate and
    the kernel and collective prices below take."""
    return BuildContext.create(model, plan, profile, gpus_per_node=gpus_per_node)


def estimate_of(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *,
                gpus_per_node: int = 8) -> tuple[BuildContext, Estimate]:
    """The job's context and its analytic step estimate."""
    ctx = context(model, plan, profile, gpus_per_node=gpus_per_node)
    return ctx, estimate_in(ctx)


def fsdp_copy_rows(ctx: BuildContext) -> dict | None:
    """PyTorch FSDP's copies around one transformer layer's gather and reduce-scatter
    (``sim.program.fsdp``) as the simulator prices them on ``ctx``'s GPU: what, when, on
    which stream, bytes moved and seconds per occurrence; None when no FSDP runs the plan's
    ZeRO-3."""
    from sim.inputs.frameworks import framework_name
    plan, profile = ctx.plan, ctx.profile
    fsdp = plan.sharding.fsdp
    fp32 = plan.sharding.reduce_fp32(ctx.model.moe)  # a dense layer's (layer 0's) dtype
    copies = fsdp_copies(fsdp, fp32)
    ranks = len(plan.dp_group(0))
    if not copies or ranks < 2:
        return None
    elements = layer_param_bytes(ctx.model, plan.tp, 0) / 2
    rate = profile.memory_rate()
    rows = [{"copy": c.what, "when": c.when, "stream": c.stream, "of": c.of, "bytes": c.nbytes(elements, ranks),
             "time_s": copy_time(c, elements, ranks, rate, profile.kernel_launch_s)} for c in copies
            if ranks >= c.min_ranks]
    return {"fsdp": fsdp, "framework": framework_name(plan), "layer_elements": elements, "ranks": ranks,
            "reduce_fp32": fp32, "rows": rows}


__all__ = [
    "Action", "BuildContext", "Comm", "Estimate", "HOST_LAUNCH_S", "LAUNCH_CATEGORY", "Op",
    "Program", "Routing", "Step", "Work", "auto_layer_split", "bias_pass_time", "chunk_work", "collective_time",
    "context", "default_layout", "dispatch_groups", "edge_works", "estimate", "estimate_in", "estimate_of",
    "fixed_time", "fsdp_copy_rows", "in_moe_block", "fp8_any_layout", "gemm_compute_time", "gemm_kernel", "group_comm_time", "group_sizes", "issue_bound", "job_profile", "launches", "mma_flops_per_score", "layer_as_run",
    "layer_key", "layer_phase_times", "local_sequence", "model_flops_per_sequence", "model_state_bytes", "moe_layer_groups",
    "moe_shape", "op_time", "plan_edge_works", "plan_flops_per_sequence", "plan_layer_work",
    "stage_profiles", "stage_time_s", "transfer_time", "work_times",
]
