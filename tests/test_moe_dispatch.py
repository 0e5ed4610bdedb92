"""Token dispatchers (``--moe-token-dispatcher-type``, ``sim.program.dispatch``): bytes per
rank and across nodes by hand on 2 nodes x 2 GPUs, 4 experts, top-2 (balanced and
node-limited), the simulated time of DeepEP's exchanges against their closed form, full
against reduced fidelity, and the trace naming which dispatcher ran."""

from dataclasses import replace

import pytest

from sim.inputs.hardware import load_profile
from sim.inputs.model import llama
from sim.inputs.plan import ParallelPlan
from sim.inputs.schema import SimulationSettings
from sim.inputs.topology_build import load_topology
from sim.program.dispatch import EpLayout, dispatch_groups, ep_layout, moe_shape
from sim.inputs.experts import Folding
from sim.program.workload import LayerRun, layer_work
from sim.session import Job, simulate_training

T, H, E2 = 256, 512, 2                       # tokens per rank, hidden size, bytes per element
TINY = llama("tiny-moe", 4, H, 8, 8, 1024, 2000, T, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=512)
GROUPED = replace(TINY, moe_router_num_groups=2, moe_router_group_topk=1)   # one group per node, one node a token
TWO_BY_TWO = EpLayout((0, 0, 1, 1))          # ep 4: ranks 0, 1 on node 0; 2, 3 on node 1


def _plan(dispatcher, **kw):
    return ParallelPlan(dp=4, ep=4, global_batch_size=4, dispatcher=dispatcher, **kw)


def _comms(model, dispatcher, load=T * 2):
    shape = moe_shape(model, _plan(dispatcher), 0, load, TWO_BY_TWO)
    return {c.name: c for c in layer_work(model, LayerRun(1), moe=shape).comms()}


def test_alltoall_sends_every_copy_so_half_of_them_cross_nodes():
    # T tokens x k = 2 copies, each to an expert on the other node with chance 2/4:
    # 2T copies in the send buffer, T of them cross; node-limited routing does not change it.
    for model in (TINY, GROUPED):
        c = _comms(model, "alltoall")
        # and the forward's all-gather of each rank's int64 count per expert (sim.program.workload_moe)
        assert set(c) == {"moe.dispatch.counts", "moe.dispatch", "moe.combine", "moe.dispatch.grad", "moe.combine.grad"}
        assert c["moe.dispatch.counts"].nbytes == 8 * model.num_experts * 4
        assert c["moe.dispatch"].nbytes == 2 * T * H * E2
        assert c["moe.dispatch"].nbytes * 2 / 4 == T * H * E2      # the other node's 2 ranks' shares


def test_flex_crosses_once_per_node_reached_by_hand():
    # A token's 2 experts are 2 of 4, equally likely: it misses the other node (both of its
    # experts on the sender's node) with chance C(2,2)/C(4,2) = 1/6, so 5/6 of the tokens
    # cross, once each. Distinct nodes per token: 2 x 5/6; distinct ranks: 4 x (1 - C(3,2)/C(4,2)) = 2.
    c = _comms(TINY, "flex")
    assert set(c) == {f"moe.{s}.{p}{g}" for s in ("dispatch", "combine") for p in ("rdma", "nvl") for g in ("", ".grad")}
    rdma, nvl = c["moe.dispatch.rdma"], c["moe.dispatch.nvl"]
    assert (rdma.group, rdma.collective, rdma.side) == ("ep_rail", "all_to_all", True)
    assert rdma.nbytes == pytest.approx(T * 2 * 5 / 6 * H * E2)
    assert rdma.nbytes / 2 == pytest.approx(5 / 6 * T * H * E2)             # what crosses (the other member's share)
    assert (nvl.group, nvl.nbytes) == ("ep_node", pytest.approx(2 * T * H * E2))
    assert nvl.nbytes / 2 == pytest.approx(T * H * E2)                       # forwarded to the node's other GPU
    for name in ("moe.combine.rdma", "moe.dispatch.rdma.grad", "moe.combine.rdma.grad"):
        assert c[name].nbytes == rdma.nbytes


def test_flex_with_node_limited_routing_crosses_at_most_once():
    # One group per node and group-topk 1: both experts of a token on one node, the other
    # with chance 1/2: T/2 tokens cross (the all-to-all still sends T copies across).
    c = _comms(GROUPED, "flex")
    assert c["moe.dispatch.rdma"].nbytes / 2 == pytest.approx(T / 2 * H * E2)
    assert c["moe.dispatch.nvl"].nbytes == pytest.approx(2 * T * H * E2)    # both ranks of the chosen node


def test_allgather_gathers_every_token_of_the_tp_ep_group():
    # 4 ranks x T tokens gathered (3T received), plus the routing map (1 byte) and the
    # probabilities (2 bytes) of each token and expert; the outputs reduce-scattered back.
    c = _comms(TINY, "allgather")
    assert (c["moe.dispatch.allgather"].collective, c["moe.dispatch.allgather"].group) == ("all_gather", "tpep")
    assert c["moe.dispatch.allgather"].nbytes == 4 * T * H * E2
    assert c["moe.dispatch.allgather.routing"].nbytes == 4 * T * 4 * (1 + E2)
    assert (c["moe.combine.allgather"].collective, c["moe.combine.allgather"].nbytes) == ("reduce_scatter", 4 * T * H * E2)
    assert c["moe.combine.allgather.grad"].collective == "all_gather"
    assert c["moe.dispatch.allgather.grad"].collective == "reduce_scatter"
    assert c["moe.dispatch.allgather.routing.grad"].nbytes == 4 * T * 4 * E2          # no gradient for the map
    assert not any(n.startswith(("moe.all_gather", "moe.reduce_scatter")) for n in c)  # etp is inside tpep


def test_dispatch_groups_follow_the_nodes():
    plan = ParallelPlan(dp=8, ep=8, dispatcher="flex")
    node_of = lambda r: r // 2                                    # noqa: E731  4 nodes of 2 GPUs
    assert ep_layout(plan, node_of) == EpLayout((0, 0, 1, 1, 2, 2, 3, 3))
    g = dispatch_groups(Folding(plan), 5, node_of)
    assert g == {"tpep": tuple(range(8)), "ep_rail": (1, 3, 5, 7), "ep_node": (4, 5)}


def _two_gpu_nodes(tmp_path, nodes=2):
    node = tmp_path / "two.toml"
    node.write_text("[node]\ngpus = 2\nnvlink_bandwidth_GBps = 100\nnvlink_latency_us = 1\n"
                    "nics = 2\nnic_kind = \"ib\"\nnic_bandwidth_GBps = 10\nnic_latency_us = 1\n")
    return load_topology(str(node), nodes=nodes)


def _run(plan, topo, model=TINY, fidelity="full"):
    return simulate_training(Job(model, plan, load_profile("h100-sxm"), topo), SimulationSettings(fidelity=fidelity))


def test_flex_bytes_on_the_wire_and_its_exchange_time_match_the_closed_form(tmp_path):
    topo = _two_gpu_nodes(tmp_path)
    eff = load_profile("h100-sxm").link_efficiencies()
    run = _run(_plan("flex"), topo)
    ib = sum(t.nbytes for t in run.trace.transfers if t.src == 0 and t.medium == "ib" and "rdma" in t.label)
    assert ib == pytest.approx(4 * 4 * 5 / 6 * T * H * E2)                  # 4 MoE layers x 4 exchanges
    assert not any("rdma" in t.label and t.medium != "ib" for t in run.trace.transfers)
    # The first forward dispatch, alone on the links: latency + bytes / (line rate x efficiency).
    rdma = next(s for s in run.trace.spans if s.rank == 0 and s.name.endswith("moe.dispatch.rdma"))
    nvl = next(s for s in run.trace.spans if s.rank == 0 and s.name.endswith("moe.dispatch.nvl"))
    alpha, B = topo.path_latency_s(0, 2), topo.bottleneck_Bps(0, 2) * eff["ib"]
    assert rdma.busy_s == pytest.approx(alpha + 5 / 6 * T * H * E2 / B, rel=1e-6)
    alpha, B = topo.path_latency_s(0, 1), topo.bottleneck_Bps(0, 1) * eff["nvlink"]
    assert nvl.busy_s == pytest.approx(alpha + T * H * E2 / B, rel=1e-6)
    assert abs(rdma.start_s - nvl.start_s) < 1e-12                          # DeepEP runs both at once


def test_each_dispatcher_is_named_in_the_trace_and_flex_crosses_less(tmp_path):
    topo = _two_gpu_nodes(tmp_path)
    ib = {}
    for d, names in (("alltoall", {"moe.dispatch", "moe.combine"}),
                     ("allgather", {"moe.dispatch.allgather", "moe.combine.allgather"}),
                     ("flex", {"moe.dispatch.rdma", "moe.dispatch.nvl", "moe.combine.rdma", "moe.combine.nvl"})):
        run = _run(_plan(d), topo)
        got = {s.name.split(" ", 1)[1] for s in run.trace.spans if s.rank == 0 and s.category == "ep"}
        assert names <= got
        ib[d] = sum(t.nbytes for t in run.trace.transfers if t.src == 0 and t.medium == "ib" and " moe." in t.label
                    and "counts" not in t.label)
        if d == "alltoall":  # its token counts cross too: a few bytes per layer, apart from the copies
            counts = sum(t.nbytes for t in run.trace.transfers if t.src == 0 and t.medium == "ib"
                         and "moe.dispatch.counts" in t.label)
            assert 0 < counts <= 4 * 8 * TINY.num_experts * 4                # 4 layers, at most the gathered bytes
    assert ib["alltoall"] == pytest.approx(4 * 4 * T * H * E2)              # T copies cross per exchange
    assert ib["flex"] == pytest.approx(ib["alltoall"] * 5 / 6)


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather", "flex"])
def test_full_and_reduced_fidelity_agree_for_each_dispatcher(dispatcher):
    model = llama("moe16", 4, H, 8, 8, 1024, 2000, T, num_experts=16, moe_router_topk=4, moe_ffn_hidden_size=512)
    plan = ParallelPlan(dp=16, ep=16, global_batch_size=32, dispatcher=dispatcher)
    topo = load_topology("dgx-h100", nodes=2)
    full = _run(plan, topo, model).trace.end_s
    assert _run(plan, topo, model, fidelity="reduced").trace.end_s == pytest.approx(full, rel=0.01)
    skewed = replace(plan, moe_routing="zipf:1.5")
    assert _run(skewed, topo, model, fidelity="reduced").trace.end_s == pytest.approx(
        _run(skewed, topo, model).trace.end_s, rel=0.01)
