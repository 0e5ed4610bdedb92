"""Context parallelism's plan checks (``ParallelPlan``; the work it changes is in
``sim.program.context_parallel``)."""

from __future__ import annotations

from sim.errors import require


CP_COMM_TYPES = ("p2p", "all-gather")


def check_context_plan(plan) -> None:
    """The context-parallel fields on their own (``ParallelPlan.__post_init__``)."""
    require(isinstance(plan.cp, int) and not isinstance(plan.cp, bool) and plan.cp > 0, "plan: cp", plan.cp,
            "expected an integer > 0")
    require(plan.cp_comm_type in CP_COMM_TYPES, "plan: cp_comm_type", plan.cp_comm_type,
            f"allowed: {', '.join(CP_COMM_TYPES)}")
    if plan.cp > 1:
        require(plan.attention == "flash", "plan: attention", plan.attention,
                "context parallelism needs flash attention (Megatron-LM runs it through Transformer Engine)")


def check_context_model(plan, model) -> None:
    """Checks of context parallelism that need the model."""
    if plan.cp == 1:
        return
    chunk = 2 * plan.cp  # Megatron's causal load balancing cuts each sequence in 2·cp chunks
    require(model.seq_length % chunk == 0, "plan: context_parallel_size", plan.cp,
            f"2 x cp = {chunk} must divide seq_length {model.seq_length} (causal load balancing cuts 2 x cp chunks)")
    local = plan.micro_batch_size * model.seq_length // plan.cp
    require(not plan.sp or local % plan.tp == 0, "plan: context_parallel_size", plan.cp,
            f"the {local} tokens of a micro-batch on one cp rank must split over tp = {plan.tp}")
