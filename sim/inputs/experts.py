"""Expert parallelism: where a mixture of experts' routed experts live.

Megatron-Core's "MoE parallel folding" (Liu et al. 2025): attention and the dense parts
run on each pipeline stage's tp × dp GPUs as usual, and the same GPUs are folded again
for the routed experts as etp × ep × edp, expert tensor parallelism innermost:

    x = tp_index + tp · dp_index                  (the GPU's place in its stage)
    etp_index = x mod etp
    ep_index  = (x div etp) mod ep
    edp_index = x div (etp · ep)

so with etp = tp (Megatron's default) each expert-parallel group is ep consecutive
data-parallel replicas at one tp index. Each rank of an ep group holds num_experts / ep
experts, each split over its etp group; the experts' gradients are reduced over the
edp group (tp · dp / (etp · ep) ranks that hold the same experts), the dense ones over
the data-parallel group. Under ZeRO-3 (FSDP2 with EP, as torchtitan and NeMo AutoModel run
it) the experts' parameters are sharded over the edp group and gathered over it before each
use, the dense ones over the data-parallel group (``check_sharded_experts`` says when the
experts split evenly).

``Folding`` gives the groups and ``moved``, the bijection ``passes.expand`` needs to copy a
stage's program from its first GPU onto the others (each digit added modulo its size,
which maps every tp, dp, ep, etp and edp group onto one of the same kind as long as the
sizes nest: each of tp, etp, etp·ep divides the next of them in size order).
"""

from __future__ import annotations

import math

from sim.errors import require

PLAN_FIELDS = ("ep", "etp", "moe_routing", "moe_capacity_factor", "moe_seed", "dispatcher")
DISPATCHERS = ("alltoall", "allgather", "flex")
"""Megatron-Core's token dispatchers (``--moe-token-dispatcher-type``; ``sim.program.dispatch``)."""


def _pos(field: str, value) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0, f"plan: {field}", value,
            "expected an integer > 0")


def check_expert_plan(plan) -> None:
    """The expert-parallel fields on their own (``ParallelPlan.__post_init__``)."""
    _pos("ep", plan.ep)
    if plan.etp is not None:
        _pos("etp", plan.etp)
    require(isinstance(plan.moe_routing, str) and plan.moe_routing, "plan: moe_routing", plan.moe_routing,
            "expected balanced, zipf:S, dirichlet:A or a histogram file")
    cf = plan.moe_capacity_factor
    if cf is not None:
        require(isinstance(cf, (int, float)) and not isinstance(cf, bool) and math.isfinite(cf) and cf > 0,
                "plan: moe_capacity_factor", cf, "expected a finite number > 0 (leave it unset for dropless)")
    require(isinstance(plan.moe_seed, int) and not isinstance(plan.moe_seed, bool), "plan: moe_seed", plan.moe_seed,
            "expected an integer")
    require(plan.dispatcher in DISPATCHERS, "plan: moe_token_dispatcher_type", plan.dispatcher,
            f"allowed: {', '.join(DISPATCHERS)}", setting="dispatcher")
    require(plan.dispatcher == "alltoall" or plan.ep > 1, "plan: moe_token_dispatcher_type", plan.dispatcher,
            f"needs expert parallelism (expert_model_parallel_size > 1, got {plan.ep}); with ep 1 the experts are "
            "local and only alltoall (no exchange) applies", setting="dispatcher")
    folded = plan.ep * plan.etp_size
    require((plan.tp * plan.dp_cp) % folded == 0, "plan: expert_model_parallel_size", plan.ep,
            f"ep x etp = {plan.ep} x {plan.etp_size} must divide the tp x dp x cp = {plan.tp} x {plan.dp} x "
            f"{plan.cp} GPUs of each pipeline stage")
    sizes = sorted({1, plan.tp, plan.tp * plan.cp, plan.tp * plan.dp_cp, plan.etp_size, folded})
    require(all(b % a == 0 for a, b in zip(sizes, sizes[1:])), "plan: expert_tensor_parallel_size", plan.etp_size,
            f"tp {plan.tp}, tp x cp {plan.tp * plan.cp}, etp {plan.etp_size} and etp x ep {folded} must each "
            "divide the next larger of them")


def check_ep_overlap_plan(plan) -> None:
    """What Megatron-Core's ``TransformerConfig`` refuses with ``overlap_moe_expert_parallel_comm``
    (``sim.program.ep_overlap``), as far as the plan alone tells: expert parallelism, pipelining
    only when interleaved, no full recompute."""
    if not plan.overlap_moe_expert_parallel_comm:
        return
    where, value, field = "plan: overlap_moe_expert_parallel_comm", True, "overlap_moe_expert_parallel_comm"
    require(plan.ep > 1, where, value, f"needs expert parallelism (got ep {plan.ep}): it hides the "
            "expert-parallel all-to-alls", setting=field)
    require(plan.pp == 1 or plan.schedule == "interleaved", where, value,
            f"with pp {plan.pp} > 1 it needs the interleaved schedule (vpp > 1; got {plan.schedule}): Megatron-Core "
            "runs the combined 1F1B only without pipelining or with virtual pipeline stages", setting=field)
    require(plan.pp > 1 or plan.schedule == "1f1b", where, value,
            f"with pp 1 it runs its own 1F1B order (got schedule {plan.schedule}); leave the schedule at 1f1b",
            setting=field)
    require(plan.recompute != "full", where, value,
            "not with recompute_granularity full (Megatron-Core refuses it: a checkpointed layer cannot be "
            "interleaved with another micro-batch's)", setting=field)
    require(plan.dispatcher in ("alltoall", "flex"), where, value,
            f"needs the alltoall or flex token dispatcher (got {plan.dispatcher}), as Megatron-Core does",
            setting=field)
    require("moe" not in (plan.recompute_modules or ()), where, value,
            "not with --recompute-modules moe (Megatron-Core refuses it: the recomputed MoE block's all-to-alls "
            "cannot be split across the interleaved micro-batches)", setting=field)


def check_shared_overlap(plan, model) -> None:
    """``moe_shared_expert_overlap``: Megatron-Core's rules (``TransformerConfig``): the
    alltoall or flex dispatcher, shared experts to overlap, and not with the shared experts
    recomputed."""
    if not plan.moe_shared_expert_overlap:
        return
    where, field = "plan: moe_shared_expert_overlap", "moe_shared_expert_overlap"
    require(bool(model.moe and model.moe_shared_expert_intermediate_size), where, True,
            f"{model.name} has no shared experts (moe_shared_expert_intermediate_size)", setting=field)
    require(plan.dispatcher in ("alltoall", "flex"), where, True,
            f"needs the alltoall or flex token dispatcher (got {plan.dispatcher}), as Megatron-Core does",
            setting=field)
    require("shared_experts" not in (plan.recompute_modules or ()), where, True,
            "not with --recompute-modules shared_experts (Megatron-Core's rule)", setting=field)


def check_expert_model(plan, model) -> None:
    """Checks that need the model (``ParallelPlan.check_model``)."""
    check_shared_overlap(plan, model)
    if not model.moe:
        require(not plan.overlap_moe_expert_parallel_comm, "plan: overlap_moe_expert_parallel_comm", True,
                f"{model.name} has no experts (it hides the expert-parallel all-to-alls of an MoE model)",
                setting="overlap_moe_expert_parallel_comm")
        require(plan.ep == 1 and plan.etp is None, "plan: expert_model_parallel_size", plan.ep,
                f"{model.name} has no experts (expert parallelism needs --num-experts)")
        require(plan.dispatcher == "alltoall", "plan: moe_token_dispatcher_type", plan.dispatcher,
                f"{model.name} has no experts (a token dispatcher needs --num-experts)", setting="dispatcher")
        return
    require(not plan.overlap_moe_expert_parallel_comm or model.mtp_num_layers <= 1,
            "plan: overlap_moe_expert_parallel_comm", True,
            f"supports at most one multi-token-prediction layer (Megatron-Core's rule; {model.name} has "
            f"{model.mtp_num_layers})", setting="overlap_moe_expert_parallel_comm")
    require(model.num_experts % plan.ep == 0, "plan: expert_model_parallel_size", plan.ep,
            f"must divide num_experts {model.num_experts} of {model.name}")
    etp = plan.etp_size
    for field in ("moe_ffn_hidden_size", "moe_shared_expert_intermediate_size"):
        width = getattr(model, field)
        if width is not None:
            require(width % (etp if field == "moe_ffn_hidden_size" else plan.tp) == 0,
                    "plan: expert_tensor_parallel_size" if field == "moe_ffn_hidden_size" else "plan: tp",
                    etp if field == "moe_ffn_hidden_size" else plan.tp, f"must divide {field} {width} of {model.name}")
    require(plan.tp == 1 or plan.sequence_parallel, "plan: sequence_parallel", False,
            "a mixture of experts with tp > 1 needs --sequence-parallel (Megatron-LM's rule)")
    if plan.zero_stage == 3:
        check_sharded_experts(plan, model)


def check_sharded_experts(plan, model) -> None:
    """ZeRO-3 / FSDP with experts (FSDP2 with EP, as torchtitan and NeMo AutoModel run it):
    a rank's num_experts/ep experts are sharded over the edp ranks that hold the same ones,
    whole experts per rank when edp divides them (FSDP2's Shard(0) on the experts' dimension),
    else each expert's rows split evenly (torchtitan's Shard(1) when edp·ep > num_experts),
    which needs edp to be a multiple of the local experts and the rest of it to divide one
    expert's width on its etp rank."""
    local, edp = model.num_experts // plan.ep, plan.tp * plan.dp_cp // (plan.ep * plan.etp_size)
    if edp == 1 or local % edp == 0:
        return
    width = model.moe_ffn_hidden_size // plan.etp_size
    require(edp % local == 0 and width % (edp // local) == 0, "plan: expert_model_parallel_size", plan.ep,
            f"ZeRO-3 shards each rank's {local} experts (num_experts {model.num_experts} / ep {plan.ep}) over the "
            f"{edp} expert data-parallel ranks (tp x dp x cp / (ep x etp)): the experts must divide edp's shards "
            f"evenly (edp a divisor of the local experts, or a multiple of them whose quotient divides the expert "
            f"width {width} per etp rank)", setting="expert_model_parallel_size")


class Folding:
    """The expert groups of a plan (see the module doc)."""

    def __init__(self, plan):
        self.plan = plan
        self.tp, self.dp = plan.tp, plan.dp_cp
        self.etp, self.ep = plan.etp_size, plan.ep
        self.edp = plan.tp * plan.dp_cp // (self.etp * self.ep)
        bounds = sorted({1, self.tp, self.tp * plan.cp, self.etp, self.etp * self.ep, self.tp * self.dp})
        self.radix = [(a, b // a) for a, b in zip(bounds, bounds[1:])]  # (place value, digit size)
        self._coords = plan.coords
        self._rank = plan.rank

    def local(self, rank: int) -> tuple[int, int]:
        """(index within the stage, pipeline stage) of a global rank."""
        d, p, t = self._coords(rank)
        return t + self.tp * d, p

    def glob(self, x: int, p: int) -> int:
        return self._rank(dp=x // self.tp, pp=p, tp=x % self.tp)

    def _group(self, rank: int, stride: int, size: int) -> tuple[int, ...]:
        x, p = self.local(rank)
        base = x - (x // stride % size) * stride
        return tuple(sorted(self.glob(base + i * stride, p) for i in range(size)))

    def ep_group(self, rank: int) -> tuple[int, ...]:
        """The ranks that share ``rank``'s layer's routed experts between them."""
        return self._group(rank, self.etp, self.ep)

    def etp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks that split ``rank``'s experts (its tp group when etp = tp)."""
        return self._group(rank, 1, self.etp)

    def tp_ep_group(self, rank: int) -> tuple[int, ...]:
        """The etp × ep ranks of ``rank``'s expert-parallel group and their expert
        tensor-parallel peers (Megatron-Core's ``tp_ep_group``: the allgather dispatcher's)."""
        return self._group(rank, 1, self.etp * self.ep)

    def edp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks that hold the same experts: their gradients are reduced together."""
        return self._group(rank, self.etp * self.ep, self.edp)

    def moved(self, x: int, g: int) -> int:
        """The rank that plays for g the part x plays for the first GPU of g's stage: each
        digit of x's place in its stage plus g's, modulo the digit's size."""
        xl, p = self.local(x)
        gl, _ = self.local(g)
        y = 0
        for value, size in self.radix:
            y += ((xl // value % size + gl // value % size) % size) * value
        return self.glob(y, p)

