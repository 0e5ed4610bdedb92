"""Topologies: built-in nodes and fabrics, routing, files and their errors."""

import networkx as nx
import pytest

from sim.errors import InputError
from sim.inputs.topology_build import FabricSpec, build_cluster, builtin_names, load_node_spec, load_topology


@pytest.mark.parametrize("name,nvlink_GBps,nic_GBps", [
    # Datasheets: NVLink 600 / 900 GB/s both directions; HDR 200 Gb/s, NDR 400 Gb/s per NIC.
    ("dgx-a100", 600 / 2, 200 / 8),
    ("dgx-h100", 900 / 2, 400 / 8),
    ("dgx-h200", 900 / 2, 400 / 8),
])
def test_builtin_nodes_have_datasheet_links(name, nvlink_GBps, nic_GBps):
    t = load_topology(name)
    kinds = [d["kind"] for _, d in t.graph.nodes(data=True)]
    assert kinds.count("gpu") == 8 and kinds.count("nic") == 8 and kinds.count("nvswitch") == 1
    for u, v, d in t.graph.edges(data=True):
        if d["kind"] == "nvlink":
            assert d["bandwidth_Bps"] == pytest.approx(nvlink_GBps * 1e9)
    spec = load_node_spec(name)
    assert spec.nic_bandwidth_Bps == pytest.approx(nic_GBps * 1e9)


def test_rail_fabric_connects_nic_i_of_every_node_to_leaf_of_rail_i():
    t = load_topology("dgx-h100", nodes=4)
    assert t.num_gpus == 32 and t.num_nodes == 4
    for n in range(4):
        for i in range(8):
            leaves = [x for x in t.graph.neighbors(f"node{n}/nic{i}") if t.graph.nodes[x]["kind"] == "switch"]
            assert leaves == [f"rail{i}/leaf0"]
    # Same local index on two nodes: one leaf hop, never a spine.
    route = t.route(3, 8 + 3)
    assert [x for x, _ in route[1:]] == ["node0/nic3", "rail3/leaf0", "node1/nic3"]


def test_fat_tree_oversubscription_divides_uplink_bandwidth():
    spec = load_node_spec("dgx-a100")
    for over in (1.0, 2.0, 4.0):
        t = build_cluster(spec, 8, FabricSpec(type="fat-tree", nodes_per_leaf=2, spines=4, oversubscription=over))
        down = 2 * 8 * spec.nic_bandwidth_Bps  # 2 nodes x 8 NICs under each leaf
        up = sum(d["bandwidth_Bps"] for _, v, d in t.graph.edges("leaf0", data=True) if v.startswith("spine"))
        assert up == pytest.approx(down / over)


def test_routes_never_transit_through_another_gpu_without_pxn_and_are_deterministic():
    a = load_topology("dgx-h100", nodes=4).with_pxn(0)
    b = load_topology("dgx-h100", nodes=4).with_pxn(0)
    for src, dst in [(0, 9), (5, 30), (17, 2), (0, 1)]:
        ra = a.route(src, dst)
        assert ra == b.route(src, dst)
        inner = [u for u, _ in ra[1:]]
        assert not any(a.graph.nodes[x]["kind"] == "gpu" for x in inner)
        assert ra[0][0] == a.gpu(src) and ra[-1][1] == a.gpu(dst)


def test_pxn_routes_transit_only_the_relay_on_the_destinations_rail():
    # NCCL's PXN (default level 2): rank 0 (node 0, GPU 0) to rank 9 (node 1, GPU 1) goes over
    # NVLink to node 0's GPU 1, then out of NIC 1 on rail 1 into node 1's NIC 1: no spine.
    t = load_topology("dgx-h100", nodes=4)
    assert t.pxn_level == 2 and t.has_rails()
    assert t.route(0, 9) == (("node0/gpu0", "node0/nvswitch"), ("node0/nvswitch", "node0/gpu1"),
                             ("node0/gpu1", "node0/nic1"), ("node0/nic1", "rail1/leaf0"),
                             ("rail1/leaf0", "node1/nic1"), ("node1/nic1", "node1/gpu1"))
    for src, dst in [(0, 9), (5, 30), (17, 2), (0, 1), (3, 11)]:
        r = t.route(src, dst)
        assert r == load_topology("dgx-h100", nodes=4).route(src, dst)
        inner = [u for u, _ in r[1:]]
        gpus = [x for x in inner if t.graph.nodes[x]["kind"] == "gpu"]
        assert not any(x.startswith("spine") for x in inner)
        if src // 8 == dst // 8 or src % 8 == dst % 8:  # same node, or already on the destination's rail
            assert gpus == [] and t.relay(src, dst) is None
        else:
            assert gpus == [t.gpu(8 * (src // 8) + dst % 8)] == [t.gpu(t.relay(src, dst))]
        assert r[0][0] == t.gpu(src) and r[-1][1] == t.gpu(dst)


def test_ecmp_spreads_pairs_over_spines():
    t = load_topology("dgx-h100", nodes=4).with_pxn(0)  # (cross-rail pairs climb to the spines without PXN)
    spines = {x for s, d in [(i, 8 + (i + 1) % 8) for i in range(8)] + [(i, 16 + (i + 3) % 8) for i in range(8)]
              for x, _ in t.route(s, d) if x.startswith("spine")}
    assert len(spines) > 1


def test_graphml_export_round_trips(tmp_path):
    t = load_topology("dgx-a100", nodes=2)
    t.write_graphml(tmp_path / "t.graphml")
    g = nx.read_graphml(tmp_path / "t.graphml")
    assert g.number_of_nodes() == t.graph.number_of_nodes()
    assert g.number_of_edges() == t.graph.number_of_edges()


def test_every_builtin_file_loads():
    for name in builtin_names():
        assert load_topology(name).num_gpus >= 2


def test_custom_graph_file(tmp_path):
    t = load_topology("example-custom")
    assert t.num_gpus == 2 and t.route_kinds(0, 1) == ("nvlink",)
    assert t.bottleneck_Bps(0, 1) == pytest.approx(100e9)
    assert t.path_latency_s(0, 1) == pytest.approx(1e-6)


@pytest.mark.parametrize("body,needle", [
    ("[node]\ngpus = 8\nnvlink_bandwidth_GBps = 300\ncolour = 'red'\n", "node.colour: unknown key"),
    ("[node]\ngpus = 8\n", "node.nvlink_bandwidth_GBps: missing required field"),
    ("[node]\ngpus = 8\nnvlink_bandwidth_GBps = -3\n", "expected a number > 0"),
    ("[node]\ngpus = 'eight'\nnvlink_bandwidth_GBps = 3\n", "node.gpus"),
    ("[node\ngpus = 8\n", "not valid TOML"),
    ("[[device]]\nid = 'g'\nkind = 'gpu'\nrank = 0\n[[link]]\na = 'g'\nb = 'nowhere'\nkind = 'nvlink'\nbandwidth_GBps = 1\n",
     "not a declared device id"),
    ("[[device]]\nid = 'g'\nkind = 'gpu'\nrank = 1\n", "expected each of 0..0 exactly once"),
    ("[[device]]\nid = 'g'\nkind = 'toaster'\n", "device[0].kind"),
])
def test_malformed_files_give_one_line_errors(tmp_path, body, needle):
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(InputError) as e:
        load_topology(str(f))
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and "bad.toml" in msg


def test_unknown_key_error_names_the_line(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[node]\ngpus = 8\nnvlink_bandwidth_GBps = 300\n\nnic_speed = 5\n")
    with pytest.raises(InputError, match=r"bad.toml:5: node.nic_speed"):
        load_topology(str(f))


def test_unknown_topology_name_lists_choices():
    with pytest.raises(InputError, match="dgx-h100"):
        load_topology("dgx-z900")



@pytest.mark.parametrize("name,nodes,fabric", [
    ("dgx-h100", 4, None),
    ("dgx-a100", 6, FabricSpec(type="fat-tree", nodes_per_leaf=2, spines=3, oversubscription=2.0)),
    ("a100-fattree-8nodes-2to1", None, None),
    ("dgx-h100", 12, FabricSpec(type="rail", nodes_per_leaf=4, spines=2)),
])
def test_routes_are_shortest_paths_with_gpus_as_endpoints_only(name, nodes, fabric):
    # Independent check with networkx on the whole graph: drop every GPU and CPU but the
    # two ends, and the route must be as short as the shortest path left, link by link.
    # Under PXN (the default) a route through a relay GPU is two such paths end to end.
    pxn = load_topology(name, nodes=nodes, fabric=fabric)
    t = pxn.with_pxn(0)
    endpoints_only = {n for n, d in t.graph.nodes(data=True) if d["kind"] in ("gpu", "cpu")}
    n = t.num_gpus

    def check(src, dst, route):
        s, d = t.gpu(src), t.gpu(dst)
        transit = t.graph.subgraph(set(t.graph) - endpoints_only | {s, d})
        assert len(route) == nx.shortest_path_length(transit, s, d), (src, dst, route)
        assert route[0][0] == s and route[-1][1] == d
        assert all(a[1] == b[0] for a, b in zip(route, route[1:]))
        assert all(transit.has_edge(u, v) for u, v in route)

    for src in (0, 5, n - 1):
        for dst in range(n):
            if dst == src:
                continue
            check(src, dst, t.route(src, dst))
            via = pxn.relay(src, dst)
            if via is None:
                assert pxn.route(src, dst) == t.route(src, dst)
            else:
                assert pxn.route(src, dst) == t.route(src, via) + t.route(via, dst)
                check(src, via, t.route(src, via))
                check(via, dst, t.route(via, dst))


@pytest.mark.parametrize("name,nodes,fabric", [
    ("dgx-h100", 24, FabricSpec(type="rail", nodes_per_leaf=4, spines=2)),
    ("dgx-a100", 9, FabricSpec(type="fat-tree", nodes_per_leaf=2, spines=3)),
])
def test_hops_kept_per_twin_class_are_each_pairs_shortest_path_length(name, nodes, fabric):
    # A rail fabric's leaves all reach the same spines (false twins), and NICs on one leaf
    # too: hops are searched once per pair of twin classes (Topology._core_hops). Each pair
    # must still get its own shortest path length in the transit graph (networkx, all pairs).
    t = load_topology(name, nodes=nodes, fabric=fabric)
    core = t._core_graph()
    lengths = dict(nx.all_pairs_shortest_path_length(core))
    devices = sorted(core)
    switches = [x for x in devices if t.graph.nodes[x]["kind"] == "switch"]
    for a in switches + devices[::11]:
        for b in switches + devices[::13]:
            assert t._core_hops(a, b) == lengths[a].get(b), (a, b)


@pytest.mark.parametrize("name,nodes,fabric", [
    ("dgx-h100", 16, FabricSpec(type="rail", nodes_per_leaf=4, spines=2)),
    ("dgx-a100", 9, FabricSpec(type="fat-tree", nodes_per_leaf=2, spines=3)),
    ("a100-fattree-8nodes-2to1", None, None),
])
def test_routes_between_devices_on_switches_are_the_searched_ones(name, nodes, fabric, monkeypatch):
    # Ends that hang off switches (NICs on their leaves) take the half-way node kept per
    # pair of switches (Topology._hung_path) instead of the hop-by-hop search (_mids,
    # _walk_to): every pair's route, PXN's relays included, must be the one the search
    # gives, ECMP choice and all.
    fast = load_topology(name, nodes=nodes, fabric=fabric)
    searched = load_topology(name, nodes=nodes, fabric=fabric)
    monkeypatch.setattr(searched, "_hung_path", lambda *args: None)
    shortcuts = []
    hung = fast._hung_path
    monkeypatch.setattr(fast, "_hung_path", lambda *args: shortcuts.append(hung(*args)) or shortcuts[-1])
    n = fast.num_gpus
    for src in range(n):
        for dst in range(n):
            assert fast.route(src, dst) == searched.route(src, dst), (src, dst)
    assert sum(p is not None for p in shortcuts) > n  # (the shortcut was taken)
