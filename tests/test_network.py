"""The flow-level network: fair sharing, full duplex, bottlenecks, latency."""

import math

import networkx as nx
import pytest

from sim.program.actions import Action, Program
from sim.engine.core import simulate
from sim.inputs.topology import Topology


def _p2p(pairs, nbytes):
    """A program where each (src, dst) pair moves nbytes at time 0."""
    acts = {}
    for i, (s, d) in enumerate(pairs):
        acts.setdefault(s, []).append(Action(f"send{i}", kind="send", peer=d, nbytes=nbytes, stream=f"s{i}"))
        acts.setdefault(d, []).append(Action(f"recv{i}", kind="recv", peer=s, nbytes=nbytes, stream=f"s{i}"))
    return Program(acts)


def _span_end(trace, name):
    return next(s.end_s for s in trace.spans if s.name == name)


def test_one_flow_takes_latency_plus_bytes_over_bottleneck(make_star):
    t = make_star([100.0, 40.0], latency_s=0.5)
    tr = simulate(_p2p([(0, 1)], 400), t)
    assert tr.end_s == pytest.approx(2 * 0.5 + 400 / 40.0, rel=1e-12)


def test_two_flows_on_one_link_take_twice_as_long(make_star):
    t = make_star([10.0, 10.0, 10.0])
    one = simulate(_p2p([(0, 1)], 100), t).end_s
    two = simulate(_p2p([(0, 1), (0, 2)], 100), t).end_s  # share gpu0's uplink
    assert one == pytest.approx(10.0, rel=1e-12)
    assert two == pytest.approx(2 * one, rel=1e-12)


def test_opposite_directions_do_not_contend(make_star):
    t = make_star([10.0, 10.0])
    one = simulate(_p2p([(0, 1)], 100), t).end_s
    both = simulate(_p2p([(0, 1), (1, 0)], 100), t).end_s
    assert both == pytest.approx(one, rel=1e-12)


def test_max_min_fair_sharing_hand_computed():
    # gpu0 -L1(10)- sw -(100)- gpu1 ; sw -L2(2)- gpu2.
    # Flow A: 0->1 (80 B), flow B: 0->2 (4 B). Max-min: B is limited to 2 by L2, so A
    # gets 10 - 2 = 8 on L1. B ends at t = 4/2 = 2; A has 80 - 16 = 64 left, now at 10:
    # A ends at 2 + 6.4 = 8.4. (Equal split would give B 2 and A 5 -> different times.)
    g = nx.Graph()
    g.add_node("sw", kind="switch")
    for i in range(3):
        g.add_node(f"gpu{i}", kind="gpu", rank=i, node=0)
    g.add_edge("gpu0", "sw", kind="nvlink", bandwidth_Bps=10.0, latency_s=0.0)
    g.add_edge("gpu1", "sw", kind="nvlink", bandwidth_Bps=100.0, latency_s=0.0)
    g.add_edge("gpu2", "sw", kind="nvlink", bandwidth_Bps=2.0, latency_s=0.0)
    prog = Program({
        0: [Action("A", kind="send", peer=1, nbytes=80, stream="a"), Action("B", kind="send", peer=2, nbytes=4, stream="b")],
        1: [Action("rA", kind="recv", peer=0, nbytes=80)],
        2: [Action("rB", kind="recv", peer=0, nbytes=4)],
    })
    tr = simulate(prog, Topology(g))
    assert _span_end(tr, "B") == pytest.approx(2.0, rel=1e-12)
    assert _span_end(tr, "A") == pytest.approx(8.4, rel=1e-12)


def test_late_flow_resharing_hand_computed(make_star):
    # One link of 10 B/s. A (100 B) starts at 0, B (20 B) at t=5 (after a 5 s compute).
    # 0..5: A alone at 10 -> 50 left. Then both at 5: B needs 4 s (ends 9); A moved 20,
    # has 30 left at 10 B/s -> ends at 12.
    t = make_star([10.0, 1000.0, 1000.0])
    prog = Program({
        0: [Action("A", kind="send", peer=1, nbytes=100, stream="a"),
            Action("wait", duration_s=5.0),
            Action("B", kind="send", peer=2, nbytes=20, stream="b", deps=("wait",))],
        1: [Action("rA", kind="recv", peer=0)],
        2: [Action("rB", kind="recv", peer=0)],
    })
    tr = simulate(prog, t)
    assert _span_end(tr, "B") == pytest.approx(9.0, rel=1e-12)
    assert _span_end(tr, "A") == pytest.approx(12.0, rel=1e-12)


def test_link_efficiency_scales_capacity(make_star):
    t = make_star([10.0, 10.0], kind="ib")
    full = simulate(_p2p([(0, 1)], 100), t).end_s
    half = simulate(_p2p([(0, 1)], 100), t, link_efficiency={"ib": 0.5}).end_s
    assert half == pytest.approx(2 * full, rel=1e-12)


def test_infinite_bandwidth_costs_only_latency():
    g = nx.Graph()
    g.add_node("gpu0", kind="gpu", rank=0, node=0)
    g.add_node("gpu1", kind="gpu", rank=1, node=0)
    g.add_edge("gpu0", "gpu1", kind="nvlink", bandwidth_Bps=math.inf, latency_s=3e-6)
    tr = simulate(_p2p([(0, 1)], 10**12), Topology(g))
    assert tr.end_s == pytest.approx(3e-6, rel=1e-12)


def test_every_byte_sent_is_carried(make_star):
    t = make_star([10.0, 10.0, 10.0])
    tr = simulate(_p2p([(0, 1), (0, 2), (2, 1)], 100), t)
    assert sum(r.nbytes for r in tr.transfers) == 300
    # each transfer crosses two links of the star
    assert sum(tr.link_bytes.values()) == pytest.approx(600)


def _progressive_filling(flows, capacity):
    """Max-min rates by the textbook progressive filling (Bertsekas & Gallager 6.5.2),
    written independently of the engine: raise every unfrozen flow's rate together, freeze
    the flows of the link that fills first (its flows one by one in a fixed order), repeat."""
    left = dict(enumerate(capacity))
    rate = {}
    unfrozen = sorted(flows, key=lambda f: (f.start, f.src, f.dst, f.label, f.nbytes))
    while unfrozen:
        on = {l: [f for f in unfrozen if l in f.links] for l in left}
        share, l = min((left[l] / len(fs), l) for l, fs in on.items() if fs)
        for f in on[l]:
            rate[f] = share
            for m in f.links:
                left[m] -= share
        unfrozen = [f for f in unfrozen if f not in rate]
    return rate


def _engine_rates(flows, capacity):
    """The engine's max-min rates of ``flows`` (``_max_min_rates``) on links of ``capacity``."""
    from sim.engine.network import _max_min_rates

    flows_on = [set() for _ in capacity]
    for f in flows:
        for l in f.links:
            flows_on[l].add(f)
    got = _max_min_rates(set(flows), {l for f in flows for l in f.links}, capacity, flows_on)
    return {f: got[f] for f in flows}


def _filling_rates(flows, capacity):
    """Plain progressive filling's rates of ``flows`` over the links they cross."""
    links = {l for f in flows for l in f.links}
    return _progressive_filling(flows, [c if l in links else math.inf for l, c in enumerate(capacity)])


def test_max_min_rates_match_progressive_filling_bit_for_bit():
    # Random flows over random links (no bundle): the engine's heap, which freezes a
    # bottleneck's flows in no particular order, gives exactly the rates of plain
    # progressive filling in a fixed order (each flow takes the same share off each link).
    import random

    from sim.engine.network import _Flow

    rnd = random.Random(55)
    for trial in range(40):
        capacity = [rnd.choice([25e9, 50e9, 100e9, 400e9]) * rnd.uniform(0.5, 1.0) for _ in range(12)]
        flows = [_Flow((tuple(rnd.sample(range(12), rnd.randint(1, 4))), 0.0, "ib", 0.0, None), 1e6, None, None, k,
                       k + 1, 0.0, f"f{k}") for k in range(rnd.randint(2, 30))]
        assert _engine_rates(flows, capacity) == _filling_rates(flows, capacity), trial


def test_max_min_rates_with_links_of_their_own_match_progressive_filling():
    # Each flow crosses links no other flow crosses (a GPU's own NIC links, some tighter
    # than the shared ones, some tied with them or with each other) and a few shared ones:
    # the engine, which keeps only each flow's tightest own link, gives exactly the rates
    # of plain progressive filling over every link.
    import random

    from sim.engine.network import _Flow

    rnd = random.Random(56)
    for trial in range(60):
        shared = 4
        capacity = [rnd.choice([50e9, 100e9, 200e9]) for _ in range(shared)]
        flows = []
        for k in range(rnd.randint(2, 12)):
            mine = []
            for _ in range(rnd.randint(1, 3)):  # links of its own, capacities that often tie
                mine.append(len(capacity))
                capacity.append(rnd.choice([25e9, 50e9, 100e9, 400e9]))
            links = tuple(rnd.sample(range(shared), rnd.randint(0, 2))) + tuple(mine)
            flows.append(_Flow((links, 0.0, "ib", 0.0, None), 1e6, None, None, k, k + 1, 0.0, f"f{k}"))
        assert _engine_rates(flows, capacity) == _filling_rates(flows, capacity), trial


def test_components_met_again_take_their_kept_rates(make_star, monkeypatch):
    # Three rounds of the same contention (the hand-computed case above, on a star: A 0->1
    # shares gpu0's uplink with B 0->2, B limited by gpu2's link), each round's sends after
    # the round before: the second and third rounds meet the components of the first, and
    # take the rates kept from it (``Network.RECENT``). The run is the same, to the bit, as
    # one that keeps none, and each round takes the hand-computed 8.4 s.
    import sim.engine.network as network
    from sim.engine.network import Network

    t = make_star([10.0, 100.0, 2.0])
    acts = {0: [], 1: [], 2: []}
    for k in range(3):
        after = (f"A{k - 1}", f"B{k - 1}") if k else ()
        acts[0] += [Action(f"A{k}", kind="send", peer=1, nbytes=80, stream="a", deps=after),
                    Action(f"B{k}", kind="send", peer=2, nbytes=4, stream="b", deps=after)]
        acts[1].append(Action(f"rA{k}", kind="recv", peer=0, nbytes=80, stream="a"))
        acts[2].append(Action(f"rB{k}", kind="recv", peer=0, nbytes=4, stream="b"))
    prog = Program(acts)
    met = []
    rates = Network._rates

    def counting(self, flows, links):
        met.append(frozenset(f.links for f in flows))
        return rates(self, flows, links)

    filled = []
    fill = network._max_min_rates

    def filling(*args):
        filled.append(1)
        return fill(*args)

    monkeypatch.setattr(Network, "_rates", counting)
    monkeypatch.setattr(network, "_max_min_rates", filling)
    kept = [(s.rank, s.name, s.start_s, s.end_s) for s in simulate(prog, t).spans]
    assert len(met) > len(set(met)) and len(filled) == len(set(met))  # (met again: rates kept, not filled again)
    monkeypatch.setattr(Network, "RECENT", 0)
    filled.clear()
    assert [(s.rank, s.name, s.start_s, s.end_s) for s in simulate(prog, t).spans] == kept
    assert len(filled) > len(set(met))
    ends = {name: e for _, name, _, e in kept}
    assert [ends[f"A{k}"] for k in range(3)] == pytest.approx([8.4, 16.8, 25.2], rel=1e-12)


def test_kept_rates_are_told_by_route_tuple(make_star, monkeypatch):
    # The hand-computed case above three times, 10 s apart, flows started on the network
    # directly: A 0->1 (80 B) and B 0->2 (4 B) meet on gpu0's uplink, B ends 2 s after
    # the round starts and A 8.4 s after. In the second round A's route is a tuple of its
    # own with the same links: a component not met before (``Network._rates`` tells
    # routes by their tuples), so its rates are filled again, the same; the third round
    # is the first again, and takes the kept rates.
    import sim.engine.network as network
    from sim.engine.kernel import Environment
    from sim.engine.network import Network

    env = Environment()
    net = Network(env, make_star([10.0, 100.0, 2.0]))
    filled = []
    fill = network._max_min_rates
    monkeypatch.setattr(network, "_max_min_rates", lambda *args: filled.append(1) or fill(*args))
    ends = {}

    def round_(k):
        a, b = net.route(0, 1), net.route(0, 2)
        if k == 1:
            a = (tuple(list(a[0])),) + a[1:]
            assert a[0] == net.route(0, 1)[0] and a[0] is not net.route(0, 1)[0]
        net.start(a, 0, 1, 80, "A", 1, lambda key: ends.__setitem__(key, env.now), ("A", k))
        net.start(b, 0, 2, 4, "B", 1, lambda key: ends.__setitem__(key, env.now), ("B", k))

    for k in range(3):
        net.calls.at(10.0 * k, round_, k)
    env.run()
    for k in range(3):
        assert ends[("B", k)] - 10.0 * k == pytest.approx(2.0, rel=1e-12)
        assert ends[("A", k)] - 10.0 * k == pytest.approx(8.4, rel=1e-12)
    assert len(filled) == 2  # rounds 0 and 1; round 2 took round 0's


def test_components_with_bundles_met_again_take_their_kept_rates(monkeypatch):
    # A training step of a small mixture of experts over 2 DGX H100 nodes (ep 16, dp 16): each
    # all-to-all is one bundle of flows, and its components come back layer after layer and
    # micro-batch after micro-batch. ``Network._bundled_rates`` keeps their rates; the step is
    # the same, to the bit (every span, every link's bytes), as one that fills every
    # component again, and fills fewer of them.
    import sim.engine.network as network
    from sim.engine.network import Network
    from sim.inputs.hardware import load_profile
    from sim.inputs.model import llama
    from sim.inputs.plan import ParallelPlan
    from sim.inputs.schema import SimulationSettings
    from sim.inputs.topology_build import load_topology
    from sim.session import Job, simulate_training

    model = llama("moe-16", 2, 512, 8, 8, 1024, 2000, 256, num_experts=16, moe_router_topk=2,
                  moe_ffn_hidden_size=512)
    job = Job(model, ParallelPlan(dp=16, ep=16, global_batch_size=64), load_profile("h100-sxm"),
              load_topology("dgx-h100", nodes=2))
    filled = []
    fill = network._max_min_rates
    monkeypatch.setattr(network, "_max_min_rates", lambda *args: filled.append(1) or fill(*args))

    def run():
        filled.clear()
        trace = simulate_training(job, SimulationSettings(fidelity="full", collective_model="flows")).trace
        return [(s.rank, s.name, s.start_s, s.end_s) for s in trace.spans], sorted(trace.link_bytes.items())

    kept, kept_filled = run(), len(filled)
    calls = []
    monkeypatch.setattr(Network, "_bundled_rates", lambda self, flows: calls.append(1) or list(
        map(network._max_min_rates(flows, network._links_of(flows), self.capacity, self._flows_on).__getitem__,
            flows)))
    assert run() == kept
    assert len(filled) == len(calls) > 2 * kept_filled > 0



def test_a_bundles_meeting_links_are_those_another_flow_crosses():
    # ``_reallocate`` reaches out from a bundle only over the links where it meets another
    # flow, kept as flows join and finish (``_Flow.meets``) rather than read off its hundreds
    # of links. Two all-to-all bundles over the same 2 x 8 GPUs, of different sizes, a plain
    # flow across their nodes, and a bundle over other GPUs start together: at every event
    # each live bundle's kept sets are their definitions, its links that another flow crosses
    # and the flows on them (a plain flow keeps the bundles it meets), and the rates are
    # max-min fair (debug mode checks every link's capacity).
    import simpy

    from sim.engine.network import Network
    from sim.inputs.topology_build import load_topology

    env = simpy.Environment()
    net = Network(env, load_topology("dgx-h100", nodes=4), check=True)
    group = [(s, d) for s in range(16) for d in range(16) if s != d]
    a, b = net.bundle(group), net.bundle(group)
    c = net.bundle([(s, d) for s in range(16, 24) for d in range(16, 24) if s != d])
    plain = net.route(3, 12)
    net.seal()
    done = []
    for bundle, nbytes in ((a, 4e6), (b, 2e6), (c, 3e6)):
        net.start_bundle(bundle, nbytes, "a2a", done.append, bundle)
    net.start(plain, 3, 12, 8e6, "p2p", 1, done.append, "plain")
    seen, plain_met = [], []
    while env.peek() < float("inf"):
        env.step()
        for f in {f for fl in net._flows_on for f in fl}:
            others = {o for l in f.links for o in net._flows_on[l]} - {f}
            if f.bundle is None:
                assert f.meets is None
                assert (f.peers or set()) == {o for o in others if o.bundle is not None}
                plain_met.append(bool(f.peers))
            else:
                assert f.meets == {l for l in f.links if len(net._flows_on[l]) > 1}
                assert f.peers == others  # (the flows it meets: what _component reaches)
                seen.append((f.bundle is c, len(f.meets)))
    assert len(done) == 4 and not any(net._flows_on)
    assert any(n == len(a.links) == 96 for is_c, n in seen if not is_c)  # (a and b meet on every link they cross)
    assert all(n == 0 for is_c, n in seen if is_c)  # (c's nodes carry nothing else)
    assert any(plain_met)  # (the plain flow crosses a's and b's links)
