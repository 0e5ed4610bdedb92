"""What a mixture of experts' routing did in a simulated iteration: the load imbalance
over expert-parallel ranks, dropped tokens, the exposed expert-parallel communication, and
what the imbalance cost in time against the same iteration with balanced routing, and the
dispatch bytes per rank that leave its node (per MoE layer and micro-batch, bf16 tokens; per
copy as Megatron's all-to-all dispatcher sends them, and once per node reached as the
node-deduplicating flex dispatcher sends them: what group-limited routing bounds); and which
token dispatcher ran (``sim.program.dispatch``)."""

from __future__ import annotations

from sim.inputs.experts import Folding
from sim.program.api import Routing
from sim.units import format_time


def moe_report(run, summary: dict, balanced_time_s: float | None = None) -> dict:
    """The ``moe`` entry of a run's summary (``balanced_time_s``: the same plan's iteration
    time with balanced routing and no capacity, when the routing was not balanced)."""
    model, plan = run.model, run.plan
    routing = Routing(model, plan)
    layers = [i for i in range(model.num_layers) if model.is_moe_layer(i)]
    nodes = [run.topology.node_of(r) for r in Folding(plan).ep_group(0)]
    out = {"num_experts": model.num_experts, "topk": model.moe_router_topk, "moe_layers": len(layers),
           "ep": plan.ep, "etp": plan.etp_size, "dispatcher": plan.dispatcher, "total_params": model.num_params,
           "active_params": model.active_params, **routing.stats(layers, plan.num_microbatches, nodes, 2 * model.hidden_size),
           "exposed_ep_comm_s": summary["exposed_comm_s"].get("ep", 0.0)}
    if balanced_time_s is not None:
        cost = summary["iteration_time_s"] - balanced_time_s
        out.update(balanced_iteration_time_s=balanced_time_s, imbalance_cost_s=cost,
                   imbalance_cost_fraction=cost / balanced_time_s if balanced_time_s > 0 else 0.0)
    return out


def moe_lines(r: dict) -> list[str]:
    """The report as ``trainsim run`` prints it."""
    lines = [f"  mixture of experts: {r['num_experts']} experts top-{r['topk']} in {r['moe_layers']} layers, "
             f"ep {r['ep']}, etp {r['etp']}"
             + (f", {r['dispatcher']} dispatcher" if r.get("dispatcher", "alltoall") != "alltoall" else "")
             + f"; {r['active_params'] / 1e9:.2f}B of {r['total_params'] / 1e9:.2f}B "
             "parameters active (MFU counts active-parameter FLOPs)",
             f"    routing {r['routing']}: busiest expert rank / mean tokens {r['imbalance_mean']:.3f} on average, "
             f"{r['imbalance_max']:.3f} at worst; exposed expert-parallel comm {format_time(r['exposed_ep_comm_s'])}"]
    if r.get("router_num_groups"):
        lines.append(f"    group-limited: {r['router_group_topk']} of {r['router_num_groups']} expert groups per token")
    if r.get("dispatch_cross_node_bytes"):  # only when the expert-parallel group spans nodes
        lines.append(f"    dispatch leaving the node per rank, layer and micro-batch: "
                     f"{r['dispatch_cross_node_bytes'] / 1e6:.2f} MB as copies, "
                     f"{r['dispatch_cross_node_bytes_dedup'] / 1e6:.2f} MB once per node reached")
    if r["capacity_tokens_per_expert"] is not None:
        lines.append(f"    capacity {r['capacity_tokens_per_expert']} tokens per expert of each rank's: {r['dropped_tokens']:,} "
                     f"tokens dropped ({r['dropped_fraction'] * 100:.2f}% of those routed)")
    if "imbalance_cost_s" in r:
        lines.append(f"    imbalance cost {format_time(r['imbalance_cost_s'])} "
                     f"({r['imbalance_cost_fraction'] * 100:+.1f}%) against balanced routing "
                     f"({format_time(r['balanced_iteration_time_s'])})")
    return lines
