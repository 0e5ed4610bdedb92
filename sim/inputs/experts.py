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


from sim.inputs.strategies import TOKEN_DISPATCHERS

PLAN_FIELDS = ("ep", "etp", "moe_routing", "moe_capacity_factor", "moe_seed", "dispatcher")
DISPATCHERS = tuple(TOKEN_DISPATCHERS)
"""Megatron-Core's token dispatchers (``--moe-token-dispatcher-type``; ``sim.program.dispatch``)."""


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

