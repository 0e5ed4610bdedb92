"""Refusing absurd simulations up front.

A typo such as ``--global-batch 1000000000`` asks for a billion micro-batches; building
that program would exhaust memory and simulating it would take years. Before any
schedule or program is built, ``check_size`` estimates how many SimPy events the
simulation would process and refuses, with the estimate and what drives it, when that
is above the limit (``DEFAULT_MAX_EVENTS``, raised with ``--max-events`` or the
``max_events`` argument).

The estimate counts, per simulated GPU, what the passes create: a compute segment per
layer and pipeline step, the tensor-parallel collectives of each layer, the pipeline
sends and receives (coalesced tensor-parallel collectives: one timer shared by the
group's simulated GPUs), ZeRO-3's parameter gathers, ZeRO-2's per-micro-batch
reduce-scatters and the data-parallel gradient buckets; each collective costs about
three events per ring hop of the rank. A mixture of experts adds its all-to-alls, about
three events each under the flow model (one bundle of flows for the whole group,
``sim.engine.network``), shared by the group's simulated GPUs, or three per send of the
rank under lock-step ``steps``; its expert-tensor-parallel rings; and its gradient
buckets count the rank's own parameters (experts split over ep), the experts' synced over
their own data-parallel group. It is a rough guide, not a promise: tests check
it stays within a factor of four of the events real runs process (coalescing of
isolated tensor-parallel collectives makes it high, collectives over many GPUs make it
low). A simulation processes roughly 80-200 thousand events per second end to end,
building its program included (``experiments/bench_scale.py`` measures it), so the
default limit is roughly ten to twenty minutes of simulation.
"""

from __future__ import annotations

import math

from sim.errors import InputError
from sim.inputs.schema import DEFAULT_MAX_EVENTS
from sim.inputs.topology import default_channels
from sim.program.actions import FLOW_PIECES
from sim.program.memory.states import ddp_bucket_bytes

_EVENTS_PER_HOP = 3  # a transfer's latency, its finish and its completion (plus re-allocations if shared)
_EVENTS_PER_COMPUTE = 1  # its timeout
_EVENTS_PER_P2P = 3  # one transfer: the two sides meet without an event
_EVENTS_PER_BUNDLE = 3  # an all-to-all's bundle: its latency, its finish, a re-allocation
# (across nodes an all-to-all is one bundle per route latency, 3 between DGX nodes: counted
# as one here, a small share of a layer's events)


def _ring_hops(n: int, op: str, flows: bool = True) -> int:
    """Transfers one rank sends during a ring collective over ``n`` ranks: one per step
    (2(n-1) for all-reduce, n-1 otherwise), or as flows at most ``FLOW_PIECES``."""
    if n <= 1:
        return 0
    steps = 2 * (n - 1) if op == "allreduce" else n - 1
    return min(steps, FLOW_PIECES) if flows else steps


def estimate_events(model, plan, fidelity: str = "full", topology=None, coalesced: bool | None = None,
                    collective_model: str = "flows") -> dict:
    """The estimate and its parts: ``events``, ``simulated_gpus``, ``steps_per_gpu``,
    ``events_per_step``, ``sync_events_per_gpu``. With the ``topology``, collectives
    count their rings (NCCL channels) and tensor-parallel collectives that will be
    coalesced count as one action (``sim.program.coalesce``; ``coalesced`` says so when the
    caller knows already). Reduced fidelity always runs rings as flows."""
    reduced = fidelity == "reduced"
    flows = collective_model == "flows" or reduced
    gpus = plan.pp if reduced else plan.world_size
    m, vpp = plan.num_microbatches, plan.vpp
    kinds = 3 if plan.pipeline.split_backward else 2
    steps = m * vpp * kinds
    layers = model.num_layers / (plan.pp * vpp) + 1  # + embedding or head on the end stages
    fits = topology is not None and plan.world_size <= topology.num_gpus
    dp_rings = 1
    if fits:
        from sim.program.coalesce import isolated_tp_pricer

        dp_rings = default_channels(topology, plan.groups("dp")[0]) if plan.dp_cp > 1 else 1
        if coalesced is None:
            coalesced = isolated_tp_pricer(plan, topology, {}) is not None
    coalesced = bool(coalesced)
    # A coalesced collective is a priced comm action on each member of its tensor-parallel
    # group; the simulated members start together and share one timer (sim.engine.core's
    # barriers). Reduced fidelity simulates one member (the others are shadows).
    comm = _EVENTS_PER_COMPUTE / (1 if reduced else plan.tp)
    per_layer = _EVENTS_PER_COMPUTE
    if plan.tp > 1 and not coalesced:  # two collectives per layer and step
        per_layer += 2 * _ring_hops(plan.tp, "allreduce", flows) * _EVENTS_PER_HOP
    elif plan.tp > 1 and plan.dp_cp > 1 and plan.zero.shards_grads:  # coalesced, but per layer
        per_layer += comm
    if plan.dp_cp > 1 and plan.zero.shards_params:
        per_layer += _ring_hops(plan.dp_cp, "allgather", flows) * dp_rings * _EVENTS_PER_HOP
        if model.moe:  # an MoE layer's experts gathered over their own data-parallel group as well
            edp = plan.tp * plan.dp_cp // (plan.ep * plan.etp_size)
            per_layer += (_ring_hops(edp, "allgather", flows) * dp_rings * _EVENTS_PER_HOP
                          * model.num_moe_layers / model.num_layers)
    if plan.dp_cp > 1 and plan.zero.reduce_scatters_each_backward:  # a reduce-scatter per layer in each backward step
        per_layer += _ring_hops(plan.dp_cp, "reducescatter", flows) * dp_rings * _EVENTS_PER_HOP / kinds
    if coalesced and not (plan.dp_cp > 1 and plan.zero.shards_grads):  # a step is one compute and one comm
        per_step = _EVENTS_PER_COMPUTE + comm + layers * (per_layer - _EVENTS_PER_COMPUTE)
    else:
        per_step = layers * per_layer + (_EVENTS_PER_COMPUTE if coalesced else 0)
    per_step += 2 * _EVENTS_PER_P2P if plan.pp > 1 else 0
    if model.moe:
        per_step += _moe_events_per_step(model, plan, layers, flows, reduced)
    sync = 0.0
    if model.moe:
        sync = _moe_sync_events(model, plan, flows, dp_rings)
    elif plan.dp_cp > 1:
        grad_bytes = 2.0 * model.num_params / (plan.tp * plan.pp)
        buckets = max(1.0, grad_bytes / max(ddp_bucket_bytes(plan), 1)) if plan.dp_overlap else 1.0  # (one bucket)
        sync = buckets * _ring_hops(plan.dp_cp, "allreduce", flows) * dp_rings * _EVENTS_PER_HOP
    events = gpus * (steps * per_step + sync)
    return {"events": events, "simulated_gpus": gpus, "steps_per_gpu": steps, "events_per_step": per_step,
            "sync_events_per_gpu": sync}


def _moe_events_per_step(model, plan, layers: float, flows: bool, reduced: bool) -> float:
    """A pipeline step's events for its MoE layers' collectives on one simulated GPU: two
    all-to-alls over ep per forward or backward (``sim.program.workload_moe``), and the
    expert-tensor-parallel all-gather and reduce-scatter beside each when etp > 1, and the dropless
    alltoall dispatcher's token-count all-gather over ep in each forward (``COUNTS_OP``), averaged
    over the step kinds."""
    moe_layers = layers * model.num_moe_layers / model.num_layers
    per_layer = 0.0
    if plan.ep > 1:
        simulated = 1 if reduced else plan.ep  # GPUs of a group that share its bundle's events
        per_layer += 2 * (_EVENTS_PER_BUNDLE / simulated if flows else (plan.ep - 1) * _EVENTS_PER_HOP)
    if plan.etp_size > 1:
        per_layer += 2 * _ring_hops(plan.etp_size, "allgather", flows) * _EVENTS_PER_HOP
    d = plan.token_dispatcher
    if (plan.ep > 1 and plan.moe_capacity_factor is None and d.exchanges_all_to_all and not d.deepep
            and not d.gathers):  # the dropless alltoall dispatcher's token-count all-gather, forward only
        per_layer += _ring_hops(plan.ep, "allgather", flows) * _EVENTS_PER_HOP / (3 if plan.pipeline.split_backward
                                                                                else 2)
    return moe_layers * per_layer


def _moe_sync_events(model, plan, flows: bool, rings: int) -> float:
    """Gradient buckets of one GPU of the largest stage: its dense parameters over dp·cp,
    its experts over the expert data-parallel group (``sim.program.memory.states``)."""
    from sim.program.memory.states import expert_data_parallel, stage_param_split

    dense, experts = max(stage_param_split(model, plan, s) for s in range(plan.pp))
    events = 0.0
    pieces = max(plan.stage_layers(model)) * plan.vpp + 2  # ZeRO-1/2's gather after the step: a piece a tensor
    for params, group in ((dense, plan.dp_cp), (experts, expert_data_parallel(plan))):
        if group > 1 and params:
            buckets = max(1.0, 2.0 * params / max(ddp_bucket_bytes(plan), 1))
            events += buckets * _ring_hops(group, "allreduce", flows) * rings * _EVENTS_PER_HOP
            if plan.zero.gathers_after_step:  # the updated parameters' all-gather, over the buckets when overlapped
                gathers = buckets if plan.param_gather_overlap else pieces
                events += gathers * _ring_hops(group, "allgather", flows) * rings * _EVENTS_PER_HOP
    return events


def check_size(model, plan, fidelity: str = "full", max_events: float | None = DEFAULT_MAX_EVENTS,
               topology=None, coalesced: bool | None = None, collective_model: str = "flows") -> dict:
    """Raise ``InputError`` when the simulation would exceed ``max_events`` (None: no
    limit); otherwise return the estimate."""
    if max_events is not None and (isinstance(max_events, bool) or not isinstance(max_events, (int, float))
                                   or math.isnan(max_events) or max_events <= 0):
        raise InputError(f"max_events: got {max_events!r}; expected a number > 0")
    est = estimate_events(model, plan, fidelity, topology, coalesced, collective_model)
    if max_events is not None and est["events"] > max_events:
        raise InputError(
            f"plan: this simulation would process about {est['events']:.2g} events "
            f"({est['simulated_gpus']} simulated GPUs x {est['steps_per_gpu']:,} pipeline steps each, "
            f"{plan.num_microbatches:,} micro-batches), over the limit of {max_events:.2g}; check the batch sizes, "
            f"use --fidelity reduced, or raise the limit with --max-events"
        )
    return est
