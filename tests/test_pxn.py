"""NCCL's PXN (``sim.inputs.topology``: a send to another node leaves by the NIC of the
destination's rail, reached over NVLink through the GPU that NIC is local to): routes by
hand, all-to-all and send/receive across nodes against their NIC-bound closed forms, the
three MoE dispatchers on two DGX H100 against the same, NCCL_PXN_DISABLE and
NCCL_P2P_PXN_LEVEL as settings, and their refusal where they change nothing.

Closed form (nothing else on the network): an all-to-all of S bytes a rank over N nodes of
g GPUs, each GPU with its own NIC of bandwidth B on its rail, sends S/(Ng) to each peer;
under PXN NIC j of a node carries what its node's g GPUs send to GPU j of the N − 1 other
nodes, g(N − 1)·S/(Ng) = S(N − 1)/N, so it ends at alpha + S(N − 1)/(N·B), alpha being
the latency of its first send (the one already on its rail), and nothing climbs to a
spine; nccl-tests' bus bandwidth is then S/t·(n − 1)/n with n = Ng.
"""

import pytest

from sim.engine.nccl import DEFAULT_MODEL, NcclModel, base_latency
from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import llama
from sim.inputs.plan import ParallelPlan
from sim.inputs.schema import SimulationSettings
from sim.inputs.topology import check_pxn
from sim.inputs.topology_build import FabricSpec, load_topology
from sim.session import Job, simulate_training
from sim.studies.collective import CollectiveOptions, run_collective

H100 = load_profile("h100-sxm")
EFF = H100.link_efficiencies()
NIC_BPS = 50e9 * EFF["ib"]  # dgx-h100.toml: ConnectX-7 NDR, 400 Gb/s = 50 GB/s a direction


def _spine_bytes(trace) -> float:
    return sum(b for link, b in trace.link_bytes.items() if any(x.startswith("spine") for x in link))


@pytest.mark.parametrize("nodes", [2, 4])
def test_alltoall_across_nodes_is_nic_bound_and_stays_off_the_spines(nodes):
    t = load_topology("dgx-h100", nodes=nodes)
    n, S = 8 * nodes, 2**28
    trace, s = run_collective("alltoall", S, n, t, CollectiveOptions(link_efficiency=EFF, nccl=NcclModel.from_profile(H100)))
    assert (s["algo"], s["protocol"]) == ("ring", "simple")          # (Simple: the bytes as they are)
    assert _spine_bytes(trace) == 0
    alpha = t.path_latency_s(0, 8)                                     # GPU 0 to GPU 0 of the next node
    time = alpha + S * (nodes - 1) / nodes / NIC_BPS
    assert s["time_s"] == pytest.approx(time, rel=1e-9)
    assert s["busbw_Bps"] == pytest.approx(S / time * (n - 1) / n, rel=1e-9)
    # every NIC carries S(N-1)/N out and in: 8 x 2 x nodes directed NIC links
    nic = {l: b for l, b in trace.link_bytes.items() if "/nic" in l[0] and "leaf" in l[1]}
    assert len(nic) == 8 * nodes and all(b == pytest.approx(S * (nodes - 1) / nodes) for b in nic.values())


def test_two_node_alltoall_climbs_to_the_spines_without_pxn():
    # NCCL_PXN_DISABLE: GPU i sends to GPU j of the other node from NIC i; for i != j that
    # is leaf i -> spine -> leaf j, and each leaf's 8 uplinks share its 2 x 50 GB/s of
    # downlinks (oversubscription 1): 12.5 GB/s each, spread by ECMP, so far below the NICs.
    t = load_topology("dgx-h100", nodes=2)
    S = 2**28
    on, with_pxn = run_collective("alltoall", S, 16, t, CollectiveOptions(link_efficiency=EFF))
    off, without = run_collective("alltoall", S, 16, t.with_pxn(0), CollectiveOptions(link_efficiency=EFF))
    assert _spine_bytes(on) == 0
    assert _spine_bytes(off) == pytest.approx(2 * 8 * 7 * S / 16 * 2)   # 112 cross-rail sends, up and down
    assert without["time_s"] > 4 * with_pxn["time_s"]


@pytest.mark.parametrize("level, relayed", [(0, False), (1, True), (2, True)])
def test_sendrecv_to_another_rail_goes_over_nvlink_then_the_destinations_rail(level, relayed):
    # Rank 0 (node 0, GPU 0) to rank 15 (node 1, GPU 7): under PXN over NVLink to node 0's
    # GPU 7, out of its NIC on rail 7; without, out of NIC 0 and through a spine.
    t = load_topology("dgx-h100", nodes=2).with_pxn(level)
    route = t.route(0, 15)
    assert (route[:2] == (("node0/gpu0", "node0/nvswitch"), ("node0/nvswitch", "node0/gpu7"))) == relayed
    assert any(x.startswith("spine") for link in route for x in link) != relayed
    S = 2**28
    bottleneck = min(t.graph.edges[l]["bandwidth_Bps"] * EFF[t.graph.edges[l]["kind"]] for l in route)
    _, s = run_collective("sendrecv", S, 16, t, CollectiveOptions(link_efficiency=EFF))
    assert s["time_s"] == pytest.approx(t.path_latency_s(0, 15) + S / bottleneck, rel=1e-9)
    if relayed:
        assert bottleneck == NIC_BPS                                     # the NIC, not NVLink or PCIe
    else:
        assert bottleneck == pytest.approx(2 * 50e9 / 8 * EFF["ib"])    # a leaf's uplink to one spine


def test_levels_differ_where_gpus_share_a_nic(tmp_path):
    # 4 GPUs and 2 NICs a node: GPUs 0 and 2 on NIC 0, 1 and 3 on NIC 1 (round-robin). GPU 2
    # sending to GPU 0 of the other node: its rail is NIC 0's, which GPU 2 reaches on its own
    # PCIe. Level 1 ("if needed") sends straight; level 2 goes through NIC 0's first GPU,
    # GPU 0 (NCCL's ncclTopoGetLocalGpu), over NVLink. Both leave by NIC 0.
    node = tmp_path / "four.toml"
    node.write_text("[node]\ngpus = 4\nnvlink_bandwidth_GBps = 100\nnics = 2\nnic_bandwidth_GBps = 10\n")
    t = load_topology(str(node), nodes=2)
    assert t.with_pxn(1).relay(2, 4) is None
    assert t.with_pxn(1).route(2, 4)[0] == ("node0/gpu2", "node0/nic0")
    assert t.with_pxn(2).relay(2, 4) == 0
    assert t.with_pxn(2).route(2, 4)[:3] == (("node0/gpu2", "node0/nvswitch"), ("node0/nvswitch", "node0/gpu0"),
                                             ("node0/gpu0", "node0/nic0"))
    # GPU 3 (NIC 1) to GPU 0: NIC 0 is not its own, so both levels relay through GPU 0
    assert t.with_pxn(1).relay(3, 4) == t.with_pxn(2).relay(3, 4) == 0


def test_pxn_changes_no_ring_tree_or_pipeline_hop():
    # Rings and trees join GPUs of one local index across nodes, pipeline stages talk to
    # the same local index: PXN has nothing to relay, and the times are the same.
    t = load_topology("dgx-h100", nodes=2)
    for op in ("allreduce", "allgather", "reducescatter"):
        a = run_collective(op, 2**28, 16, t, CollectiveOptions(link_efficiency=EFF))[1]["time_s"]
        assert run_collective(op, 2**28, 16, t.with_pxn(0), CollectiveOptions(link_efficiency=EFF))[1]["time_s"] == a
    assert all(t.relay(r, r + 8) is None for r in range(8))


# ---------------------------------------------------------------- MoE dispatchers
T, H, E2 = 1024, 2048, 2  # tokens per rank, hidden size, bytes per element (BF16)
MOE = llama("moe16", 2, H, 16, 16, 1024, 2000, T, num_experts=16, moe_router_topk=2, moe_ffn_hidden_size=512)


def _moe(dispatcher: str, disable: bool = False):
    plan = ParallelPlan(dp=16, ep=16, global_batch_size=16, dispatcher=dispatcher)
    return simulate_training(Job(MOE, plan, H100, load_topology("dgx-h100", nodes=2)),
                             SimulationSettings(fidelity="full", nccl_pxn_disable=disable))


def _first(run, suffix: str):
    """Rank 0's first forward span and action whose name ends with ``suffix``."""
    span = next(s for s in run.trace.spans if s.rank == 0 and s.name.endswith(suffix))
    action = next(a for a in run.program.actions[0] if a.name.endswith(suffix))
    return span, action


def test_alltoall_dispatcher_exchange_is_nic_bound_under_pxn():
    # EP 16 over 2 DGX H100: the dispatch all-to-all's buffer is T·k·h·2 bytes (balanced
    # routing), half of it to the other node: NIC-bound, as the all-to-all above.
    run = _moe("alltoall")
    span, a = _first(run, "moe.dispatch")
    assert (a.nbytes, a.protocol) == (T * 2 * H * E2, "simple")
    assert _spine_bytes(run.trace) == 0
    t = run.topology
    assert span.busy_s == pytest.approx(t.path_latency_s(0, 8) + a.nbytes / 2 / NIC_BPS, rel=1e-9)
    off = _moe("alltoall", disable=True)
    assert _spine_bytes(off.trace) > 0
    assert _first(off, "moe.dispatch")[0].busy_s > 4 * span.busy_s


def test_flex_dispatcher_is_rail_aligned_with_or_without_pxn():
    # DeepEP sends each token across once, to the GPU of its own local index (ep_rail: ranks
    # 0 and 8), which forwards it over NVLink: the same NIC-bound closed form for the half of
    # its buffer that crosses, nothing on the spines, and nothing for PXN to relay.
    run, off = _moe("flex"), _moe("flex", disable=True)
    span, a = _first(run, "moe.dispatch.rdma")
    assert a.group == (0, 8) and a.protocol == "simple"
    t = run.topology
    assert span.busy_s == pytest.approx(t.path_latency_s(0, 8) + a.nbytes / 2 / NIC_BPS, rel=1e-9)
    assert _spine_bytes(run.trace) == _spine_bytes(off.trace) == 0
    assert off.trace.end_s == run.trace.end_s


def test_allgather_dispatcher_rings_stay_on_their_rails_with_or_without_pxn():
    # The all-gather dispatcher gathers over the 16 ranks with NCCL's rings, whose hops
    # between nodes join GPUs of one local index: nothing on the spines either way, and PXN
    # changes nothing. Its ring across the nodes is NIC-bound too: channel c's hop between
    # the nodes carries 15/16 of the gathered buffer over 8 channels, paying 15 steps of its
    # route's latency (the ring's closed form under the flow model, at line rate), after
    # NCCL's base latency of ring/Simple.
    run, off = _moe("allgather"), _moe("allgather", disable=True)
    assert _spine_bytes(run.trace) == _spine_bytes(off.trace) == 0
    assert off.trace.end_s == run.trace.end_s
    _, a = _first(run, "moe.dispatch.allgather")
    t = load_topology("dgx-h100", nodes=2)
    _, s = run_collective("allgather", a.nbytes, 16, t, CollectiveOptions(algo="ring", protocol="simple", channels=8))
    base = base_latency(DEFAULT_MODEL, "allgather", range(16), t, "ring", "simple")
    assert s["time_s"] == pytest.approx(base + 15 * t.path_latency_s(7, 15) + 15 / 16 * a.nbytes / 8 / 50e9,
                                        rel=1e-9)


# ---------------------------------------------------------------- settings
def test_settings_map_to_levels_and_reach_the_routes():
    assert SimulationSettings().pxn_level == 2
    assert SimulationSettings(nccl_p2p_pxn_level=1).pxn_level == 1
    assert SimulationSettings(nccl_pxn_disable=True, nccl_p2p_pxn_level=1).pxn_level == 0
    with pytest.raises(InputError, match=r"^nccl_p2p_pxn_level: got 3; allowed: 0, 1, 2$"):
        SimulationSettings(nccl_p2p_pxn_level=3)


@pytest.mark.parametrize("topology, fabric", [("dgx-h100", None), ("dgx-h100", "fat-tree")])
def test_a_pxn_setting_without_rails_is_refused_as_changing_nothing(topology, fabric):
    t = load_topology(topology, nodes=2 if fabric else 1, fabric=FabricSpec(type=fabric) if fabric else None)
    assert not t.has_rails()
    with pytest.raises(InputError, match=r"^nccl_pxn_disable: got True; it changes nothing on topology"):
        check_pxn(t, pxn_disable=True, pxn_level=2)
    with pytest.raises(InputError, match=r"^--nccl-p2p-pxn-level: got 1; it changes nothing"):
        check_pxn(t, pxn_disable=False, pxn_level=1, flag="--")
    check_pxn(t, pxn_disable=False, pxn_level=2)  # NCCL's default: nothing to refuse
    check_pxn(load_topology("dgx-h100", nodes=2), pxn_disable=True, pxn_level=0)


def test_a_graph_files_nics_belong_to_their_gpus_nodes(tmp_path):
    # Two hosts of 2 GPUs, one NIC each on a leaf of its own, leaves joined by a spine: the
    # NICs sit on different switches, but no host has two, so there are no rails (the NICs
    # carry no "node" in a graph file: theirs is their GPUs').
    f = tmp_path / "g.toml"
    dev = [("h0g0", "gpu", 0, 0), ("h0g1", "gpu", 1, 0), ("h1g0", "gpu", 2, 1), ("h1g1", "gpu", 3, 1),
           ("sw0", "nvswitch"), ("sw1", "nvswitch"), ("nic0", "nic"), ("nic1", "nic"),
           ("leaf0", "switch"), ("leaf1", "switch"), ("spine", "switch")]
    links = [("h0g0", "sw0", "nvlink"), ("h0g1", "sw0", "nvlink"), ("h1g0", "sw1", "nvlink"), ("h1g1", "sw1", "nvlink"),
             ("h0g0", "nic0", "pcie"), ("h0g1", "nic0", "pcie"), ("h1g0", "nic1", "pcie"), ("h1g1", "nic1", "pcie"),
             ("nic0", "leaf0", "ib"), ("nic1", "leaf1", "ib"), ("leaf0", "spine", "ib"), ("leaf1", "spine", "ib")]
    text = "".join(f'[[device]]\nid = "{d[0]}"\nkind = "{d[1]}"\n' + (f"rank = {d[2]}\nnode = {d[3]}\n" if len(d) > 2 else "")
                   for d in dev)
    text += "".join(f'[[link]]\na = "{a}"\nb = "{b}"\nkind = "{k}"\nbandwidth_GBps = 10\n' for a, b, k in links)
    f.write_text(text)
    t = load_topology(str(f))
    assert t.num_nodes == 2 and not t.has_rails()
    assert t.relay(1, 2) is None
