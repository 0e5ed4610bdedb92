"""Token dispatchers: how an MoE layer's tokens reach their experts and come back
(Megatron-Core's ``--moe-token-dispatcher-type``).

A rank of an expert-parallel group of ep ranks routes its T tokens (``sim.program.routing``)
to k experts each; its E/ep experts receive L token copies (the busiest rank's load; T·k
when balanced). The three dispatchers move them differently:

- ``alltoall`` (``MoEAlltoAllTokenDispatcher``): the k copies of each token are permuted
  into expert order and sent with one all-to-all over the ep group (NCCL's grouped
  send/receive), then all-gathered over the expert-tensor-parallel group; the combine is
  the reverse. Every copy is sent, so a token bound for two experts of one node crosses
  the network twice. ``sim.program.workload_moe`` prices it.
- ``allgather`` (``MoEAllGatherTokenDispatcher``): the hidden states, the routing map and
  the routing probabilities are all-gathered over the etp × ep group (Megatron-Core's
  ``tp_ep_group``, n = etp·ep ranks), so every rank holds all T·n tokens of the group and
  keeps those routed to its local experts; the expert outputs are scattered back into the
  T·n rows (``unpermute``) and reduce-scattered over the same group. Backward mirrors it:
  the combine's gradient is all-gathered, the dispatch's reduce-scattered (the routing
  map has no gradient; the probabilities' gradient is reduce-scattered). Every rank
  receives (n−1)·T tokens whatever the routing, so it suits small ep (and tp-only expert
  sharding), not ep over nodes.
- ``flex`` (DeepEP's normal kernels, deepseek-ai/DeepEP, as Megatron-Core's
  ``MoEFlexTokenDispatcher`` runs them): a token crosses InfiniBand once per node it
  reaches, to the GPU of the same local index on that node (rail-aligned), which forwards
  it over NVLink to each GPU of that node hosting one or more of its experts (once per
  GPU); the combine is the reverse, each token's expert outputs summed on the GPU, then on
  the node, before it crosses back. So the cross-node bytes are tokens × distinct other
  nodes reached, not × k copies, and node-limited routing (``--moe-router-num-groups``,
  ``--moe-router-group-topk``, one group per node) bounds them. It is modelled as two
  all-to-alls that run at once, as DeepEP's one kernel pipelines its RDMA sends with its
  NVLink forwarding: an inter-node one among the group's ranks of one local index
  (``ep_rail``: one per node the group spans), carrying per rank T·D_node tokens with
  D_node the expected distinct nodes a token reaches (its own included: the engine's
  all-to-all keeps a member's own share, so (N−1)/N of it crosses), and an intra-node one
  among the group's ranks on one node (``ep_node``), carrying T·D_rank tokens, with D_rank
  the expected distinct ranks a token reaches (what each rank receives on average). Both
  come from ``Routing.reach`` (hypergeometric, exact for equally popular experts); under
  uneven routing both scale with the busiest rank's load over the mean (L / (T·k)), as
  the all-to-all's bytes do. What follows the dispatch waits for both: the permutation of
  the T·D_rank tokens the rank received into its local experts' order (Megatron-Core
  permutes after the exchange, and restores them before the combine, whose kernel sums each
  token's returned rows; ``sim.program.workload_moe``). Its backends (``--moe-flex-dispatcher-backend``,
  ``sim.inputs.strategies.FLEX_BACKENDS``) exchange alike: DeepEP's, and HybridEP's, whose
  permutation pads each local expert's rows for the quantized GEMMs. DeepEP's kernels
  are not NCCL's, and the engine's all-to-all pays no NCCL base latency anyway
  (``sim.engine.nccl.POINT_TO_POINT_OPS``); its per-hop latencies are the links'.

DeepEP's kernels hold ``DEEPEP_SMS`` SMs while they run (``sim.program.workload_moe``
prices the shared experts beside them on the rest; other compute beside them is slowed by
the engine's overlap slowdown, as beside NCCL). Assumed and not modelled: DeepEP's FP8
dispatch (tokens move in the activation dtype), the
dispatchers' metadata exchanges other than the allgather dispatcher's routing map and
probabilities (the token counts, a few bytes per expert), and the buffers' memory. Every
expert-parallel group is taken to sit on the nodes as the first one does (``EpLayout``),
each with the same number of its ranks on every node it spans.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from sim.errors import require
from sim.inputs.cuda_graphs import CudaGraphs
from sim.inputs.experts import Folding
from sim.inputs.frameworks import framework_of
from sim.program.routing import Routing
from sim.program.workload_moe import MoeShape, quant_align

DISPATCH_GROUPS = ("tpep", "ep_rail", "ep_node")
"""The groups the dispatchers add (``sim.program.ops.GROUPS``): the etp × ep group
(allgather), the ep group's ranks of one local index across its nodes and its ranks on one
node (flex)."""


@dataclass(frozen=True)
class EpLayout:
    """Where an expert-parallel group sits: the node of each of its ranks (numbered 0 ..
    nodes − 1 in order of first appearance), in the group's rank order."""

    node_of_rank: tuple[int, ...]

    @property
    def nodes(self) -> int:
        return len(set(self.node_of_rank))

    @property
    def per_node(self) -> int:
        return len(self.node_of_rank) // self.nodes


def ep_layout(plan, node_of) -> EpLayout:
    """The layout of the first expert-parallel group (global rank 0's); ``node_of(rank)``
    gives a global rank's node. Refused when the group has unequal numbers of ranks on its
    nodes (DeepEP's rail-aligned exchange needs the same local ranks on every node)."""
    group = Folding(plan).ep_group(0)
    seen: dict[int, int] = {}
    nodes = tuple(seen.setdefault(node_of(r), len(seen)) for r in group)
    counts = np.bincount(nodes)
    require(not plan.token_dispatcher.deepep or len(set(counts.tolist())) == 1, "plan: moe_token_dispatcher_type",
            plan.dispatcher, f"flex needs each expert-parallel group to have as many GPUs on every node it spans; "
            f"the first has {', '.join(map(str, counts.tolist()))}")
    return EpLayout(nodes)


def default_layout(plan, gpus_per_node: int = 8) -> EpLayout:
    """``ep_layout`` with global ranks filling nodes of ``gpus_per_node`` GPUs in order."""
    return ep_layout(plan, lambda r: r // gpus_per_node)


def group_sizes(plan, layout: EpLayout | None) -> dict[str, int]:
    """Ranks in each of ``DISPATCH_GROUPS`` (1 where the plan's dispatcher has no use for it)."""
    d = plan.token_dispatcher
    return {"tpep": plan.ep * plan.etp_size if d.gathers else 1,
            "ep_rail": layout.nodes if d.deepep and layout is not None else 1,
            "ep_node": layout.per_node if d.deepep and layout is not None else 1}


def dispatch_groups(folding: Folding, rank: int, node_of) -> dict[str, tuple[int, ...]]:
    """``rank``'s groups of ``DISPATCH_GROUPS``: its etp × ep group (etp innermost, so the
    ep·etp consecutive places of the folding), the ranks of its ep group on its node, and
    the ranks of its ep group at its own local index on every node the group spans."""
    ep = folding.ep_group(rank)
    by_node: dict[int, list[int]] = {}
    for r in ep:
        by_node.setdefault(node_of(r), []).append(r)
    mine = by_node[node_of(rank)]
    index = mine.index(rank)
    rail = tuple(sorted(v[index] for v in by_node.values() if len(v) > index))
    return {"tpep": folding.tp_ep_group(rank), "ep_rail": rail, "ep_node": tuple(mine)}


@lru_cache(maxsize=64)
def _balanced(model, plan) -> Routing:
    return Routing(model, replace(plan, moe_routing="balanced", moe_capacity_factor=None))


def flex_tokens(routing: Routing, layer: int, layout: EpLayout) -> tuple[float, float]:
    """(D_node, D_rank): the distinct nodes and distinct ranks of the group a token
    reaches, expected (``Routing.reach``; the module doc). Under balanced routing they
    depend only on the experts, k, the router's groups and the layout, which key them across
    plans (a search prices thousands of plans on a few layouts)."""
    if routing.kind != "balanced":
        return _flex_ratios(routing, layer, layout)
    key = (routing.E, routing.k, routing.ep, routing.groups, routing.group_topk, layout)
    if key not in _BALANCED_REACH:
        if len(_BALANCED_REACH) >= 4096:
            _BALANCED_REACH.clear()
        _BALANCED_REACH[key] = _flex_ratios(routing, -1, layout)
    return _BALANCED_REACH[key]


_BALANCED_REACH: dict = {}
"""``flex_tokens``' answers under balanced routing, by what they depend on."""


@lru_cache(maxsize=4096)
def _flex_ratios(routing: Routing, layer: int, layout: EpLayout) -> tuple[float, float]:
    per = routing.E // routing.ep
    layer = max(layer, 0)
    nodes = routing.reach(layer, np.repeat(np.asarray(layout.node_of_rank), per))
    ranks = routing.reach(layer, np.repeat(np.arange(routing.ep), per))
    return float(sum(nodes.values())), float(sum(ranks.values()))


def _quant_align(plan) -> int:
    """``MoeShape.quant_align`` of the plan: its recipe's (``workload_moe.quant_align``) where
    Megatron-Core's ``TEGroupedMLP`` runs the experts (the padding is its own), else 0."""
    if plan.precision is None or not framework_of(plan).pads_expert_splits:
        return 0
    return quant_align(plan.precision.recipe.name)


def moe_shape(model, plan, layer: int, load: int, layout: EpLayout | None = None,
              routing: Routing | None = None) -> MoeShape:
    """The MoE shape of ``layer`` as the plan's dispatcher runs it, for a busiest-rank
    ``load`` of token copies: flex's two exchanges in tokens per rank (the module doc),
    on ``layout`` (default: nodes of 8 GPUs) and ``routing`` (default: balanced)."""
    kernels = dict(permute_fusion=plan.moe_permute_fusion, shared_overlap=plan.moe_shared_expert_overlap,
                   graphed=CudaGraphs(plan.cuda_graph).covers_moe_block(), dropless=plan.moe_capacity_factor is None,
                   capacity_factor=plan.moe_capacity_factor, quant_align=_quant_align(plan))
    if not plan.token_dispatcher.deepep:
        return MoeShape(plan.ep, plan.etp_size, load, plan.token_dispatcher, **kernels)
    kernels["sms"] = plan.moe_flex_num_sms or plan.token_dispatcher.num_sms
    routing = routing if routing is not None else _balanced(model, plan)
    layout = layout if layout is not None else default_layout(plan)
    d_node, d_rank = flex_tokens(routing, layer, layout)
    scale = load / (routing.tokens_per_rank * routing.k)
    T = routing.tokens_per_rank
    return MoeShape(plan.ep, plan.etp_size, load, plan.token_dispatcher, T * d_node * scale, T * d_rank * scale, **kernels)
