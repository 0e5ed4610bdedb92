"""Collectives from point-to-point steps, against the closed forms."""

import pytest

from sim.program.actions import Action, Program
from sim.engine.algorithms import build, ring_order
from sim.studies.collective import run_collective
from sim.engine.core import simulate
from sim.errors import InputError
from sim.inputs.topology_build import load_topology

RING_BASE_S = 8.4e-6
"""NCCL's base latency of a ring collective under Simple (the actions' default protocol):
baseLatencies[Ring][Simple] = 8.4 µs in NVIDIA/nccl src/graph/tuning.cc."""
TREE_BASE_S = 8.4e-6
"""baseLatencies[Tree][Simple] = 8.4 µs."""


def _time(op, n, nbytes, topo, algo="ring", channels=None):
    prog = Program({r: [Action(op, kind="collective", op=op, group=tuple(range(n)), nbytes=nbytes, algo=algo,
                               channels=channels or 0)] for r in range(n)})
    return simulate(prog, topo)


@pytest.mark.parametrize("node", ["dgx-a100", "dgx-h100"])
@pytest.mark.parametrize("n", [2, 3, 5, 8])
@pytest.mark.parametrize("nbytes", [8 * 2**10, 2**30])
def test_ring_allreduce_matches_closed_form(node, n, nbytes):
    # Ring all-reduce: NCCL's base latency + 2(n-1)(alpha + S/(nB)), alpha = path latency,
    # B = bottleneck bandwidth.
    t = load_topology(node)
    alpha, B = t.path_latency_s(0, 1), t.bottleneck_Bps(0, 1)
    expect = RING_BASE_S + 2 * (n - 1) * (alpha + nbytes / (n * B))
    assert _time("allreduce", n, nbytes, t).end_s == pytest.approx(expect, rel=1e-9)


@pytest.mark.parametrize("op", ["reducescatter", "allgather"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_reduce_scatter_and_all_gather_match_closed_form(op, n):
    t = load_topology("dgx-h100")
    S = 3 * 2**28
    alpha, B = t.path_latency_s(0, 1), t.bottleneck_Bps(0, 1)
    assert _time(op, n, S, t).end_s == pytest.approx(RING_BASE_S + (n - 1) * (alpha + S / (n * B)), rel=1e-9)


def test_channels_do_not_change_an_uncontended_node():
    t = load_topology("dgx-h100")
    one = _time("allreduce", 8, 2**30, t, channels=1).end_s
    four = _time("allreduce", 8, 2**30, t, channels=4).end_s
    assert four == pytest.approx(one, rel=1e-9)


def test_busbw_inside_one_dgx_h100_is_the_nvlink_bandwidth():
    t = load_topology("dgx-h100")
    S, n = 8 * 2**30, 8
    _, s = run_collective("allreduce", S, n, t)
    nvlink = t.bottleneck_Bps(0, 1)  # 450 GB/s per direction (900 GB/s both ways)
    alpha = t.path_latency_s(0, 1)
    # busbw = S/T · 2(n-1)/n with T = base + 2(n-1)(alpha + S/(n B)): B less what latency costs
    busbw = S / (RING_BASE_S + 2 * (n - 1) * (alpha + S / (n * nvlink))) * 2 * (n - 1) / n
    assert s["busbw_Bps"] == pytest.approx(busbw, rel=1e-9)
    assert s["busbw_Bps"] == pytest.approx(nvlink, rel=2e-3)
    assert s["busbw_Bps"] < nvlink


@pytest.mark.parametrize("n,S,c", [
    # c pieces of at least 1 MiB, at most 8(n-2) of them, at least one (worked by hand):
    (6, 2**30, 32),            # 1024 pieces of 1 MiB, capped at 8 x 4
    (8, 2**30, 48),            # capped at 8 x 6
    (8, 10.5 * 2**20, 11),     # ceil(10.5 MiB / 1 MiB)
    (8, 2**19, 1),             # below one piece: a plain chain
    (2, 2**30, 1),             # one hop: nothing to overlap, one transfer
])
def test_broadcast_pipelined_chain_closed_form(n, S, c):
    # c chunks along n-1 hops after NCCL's base latency: base + (n - 2 + c)(alpha + S/(cB)).
    t = load_topology("dgx-a100")
    alpha, B = t.path_latency_s(0, 1), t.bottleneck_Bps(0, 1)
    tr = _time("broadcast", n, S, t)
    assert len(tr.transfers) == c * (n - 1)
    assert tr.end_s == pytest.approx(RING_BASE_S + (n - 2 + c) * (alpha + S / (c * B)), rel=1e-9)


def test_large_broadcast_busbw_approaches_the_link_bandwidth():
    # nccl-tests: broadcast busbw = algbw (factor 1), which for large buffers approaches the
    # link bandwidth, as the pipelined chain's (n-1)alpha + S/B does. With c <= 8(n-2)
    # pieces the chain takes (n-2+c)alpha + S/B (1 + (n-2)/c): at most 9(n-2)alpha more
    # latency and 1/8 more transfer time than that, after NCCL's base latency.
    t = load_topology("dgx-h100")
    n, S = 8, 2**30
    alpha, B = t.path_latency_s(0, 1), t.bottleneck_Bps(0, 1)
    _, s = run_collective("broadcast", S, n, t)
    assert RING_BASE_S + (n - 1) * alpha + S / B < s["time_s"] <= RING_BASE_S + 9 * (n - 2) * alpha + 9 / 8 * S / B
    assert s["busbw_Bps"] > 0.85 * B          # was 0.57 B with a fixed 8 pieces


def test_alltoall_inside_a_node_closed_form():
    # Every rank sends S/n to each of n-1 peers at once: each uplink carries n-1 equal
    # flows, so the time is alpha + (n-1) S / (n B).
    t = load_topology("dgx-h100")
    n, S = 8, 2**30
    alpha, B = t.path_latency_s(0, 1), t.bottleneck_Bps(0, 1)
    assert _time("alltoall", n, S, t).end_s == pytest.approx(alpha + (n - 1) * S / (n * B), rel=1e-9)


def test_ring_order_keeps_inter_node_hops_on_one_rail():
    t = load_topology("dgx-h100", nodes=4)
    order = ring_order(t, range(32))
    assert sorted(order) == list(range(32))
    for i in range(32):
        a, b = order[i], order[(i + 1) % 32]
        if t.node_of(a) != t.node_of(b):
            assert a % 8 == b % 8, (a, b)  # same local index -> same rail leaf


@pytest.mark.parametrize("nodes", [4, 8])
def test_hierarchical_beats_flat_ring_across_nodes_and_the_trace_shows_why(nodes):
    t = load_topology("dgx-h100", nodes=nodes)
    n, g, S = 8 * nodes, 8, 2**30
    flat = _time("allreduce", n, S, t)
    hier = _time("allreduce", n, S, t, algo="hierarchical")
    assert hier.end_s < flat.end_s
    # Inter-node bytes: each flat-ring channel (k = g of them) sends 2(n-1)/n * S/k over
    # each node-crossing link; hierarchical sends 2(N-1)/N * S/g over each rail link.
    _, flat_ib = flat.busiest_link("ib")
    _, hier_ib = hier.busiest_link("ib")
    assert flat_ib == pytest.approx(2 * (n - 1) / n * S / g, rel=1e-9)
    assert hier_ib == pytest.approx(2 * (nodes - 1) / nodes * S / g, rel=1e-9)
    assert hier.bytes_by_link_kind()["ib"] < flat.bytes_by_link_kind()["ib"]
    assert hier.links_used("ib") >= flat.links_used("ib")


def test_hierarchical_is_much_faster_for_small_messages():
    t = load_topology("dgx-h100", nodes=4)
    flat = _time("allreduce", 32, 2**20, t).end_s
    hier = _time("allreduce", 32, 2**20, t, algo="hierarchical").end_s
    assert hier < flat / 2  # 2(g-1) + 2(N-1) latency steps instead of 2(n-1)


def test_step_counts():
    t = load_topology("dgx-h100")
    assert len(build("allreduce", range(8), 800, t, channels=1)) == 8 * 2 * 7
    assert len(build("allgather", range(8), 800, t, channels=1)) == 8 * 7
    assert len(build("alltoall", range(8), 800, t)) == 8 * 7
    assert build("allreduce", [3], 800, t) == []


def test_bad_collective_arguments():
    t = load_topology("dgx-h100")
    with pytest.raises(InputError, match="op"):
        build("allsum", range(4), 10, t)
    with pytest.raises(InputError, match="distinct"):
        build("allreduce", [0, 0, 1], 10, t)
    with pytest.raises(InputError, match="hierarchical"):
        build("allgather", range(4), 10, t, algo="hierarchical")
    t2 = load_topology("dgx-h100", nodes=2)
    with pytest.raises(InputError, match="same number of ranks on every node"):
        build("allreduce", [0, 1, 8], 10, t2, algo="hierarchical")


def test_broadcast_across_nodes_runs_one_chain_per_rail():
    # One chain crosses nodes through one NIC per hop; like NCCL, one chain per channel
    # (each on its own rail, 1/8 of the buffer) uses all eight NICs of a node.
    t = load_topology("dgx-h100", nodes=2)
    S = 2**28
    one = _time("broadcast", 16, S, t, channels=1)
    eight = _time("broadcast", 16, S, t)
    assert one.links_used("ib") == 2          # NIC -> leaf, leaf -> NIC on the one node-crossing hop
    # Channel c's chain leaves root 0 mid-ring, so (c > 0) it crosses to node 1 on rail c - 1
    # and back on rail c; no InfiniBand link carries two chains.
    assert eight.links_used("ib") == 2 * (1 + 7 * 2)
    assert eight.busiest_link("ib")[1] == pytest.approx(S / 8)
    nic = t.bottleneck_Bps(0, 8)              # one NDR NIC, 50 GB/s per direction
    assert S / one.end_s < nic
    assert S / eight.end_s > 5 * nic
    # every rank receives the whole buffer once: S bytes into each of the 15 non-roots
    into = {}
    for x in eight.transfers:
        into[x.dst] = into.get(x.dst, 0) + x.nbytes
    assert sorted(into) == list(range(1, 16)) and all(v == pytest.approx(S) for v in into.values())


def test_a_member_ends_after_its_own_transfers_when_nothing_has_latency():
    # A tree all-reduce on links with no latency: its zero-byte pipeline-fill steps finish
    # the moment they start, and so free their children at once. Each step must still run
    # once: a member's action ends when its last transfer (as sender or receiver) has, here
    # one hop on a slower link (the chain 0-1-2-3, link 1-2 at half the rate).
    import networkx as nx

    from sim.inputs.topology import Topology

    g = nx.Graph()
    for i in range(4):
        g.add_node(f"gpu{i}", kind="gpu", rank=i, node=0)
    for i in range(4):
        for j in range(i + 1, 4):
            g.add_edge(f"gpu{i}", f"gpu{j}", kind="nvlink", latency_s=0.0,
                       bandwidth_Bps=0.5e9 if (i, j) == (1, 2) else 1e9)
    trace = _time("allreduce", 4, 64.0, Topology(g, "mesh"), algo="tree")
    last = {}
    for t in trace.transfers:
        for r in (t.src, t.dst):
            last[r] = max(last.get(r, 0.0), t.end_s)
    ends = {s.rank: s.end_s for s in trace.spans}
    # one node, one tree: after NCCL's base latency every edge carries the 64 B up and down
    # at once; the slow hop takes twice as long
    assert last[1] == last[2] == pytest.approx(TREE_BASE_S + 64.0 / 0.5e9, rel=1e-12)
    for r in range(4):
        assert ends[r] == pytest.approx(last[r], rel=1e-12)
