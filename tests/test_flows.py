"""Collectives as flows against collectives as lock-step rounds, and against closed forms.

Under the ``flows`` model each hop of each ring channel is one flow (in at most
``FLOW_PIECES`` transfers) that carries all its steps' bytes for as long as the
collective runs; under ``steps`` it is 2(n-1) rounds of n transfers. Where nothing else
contends the two give the same time, which is the ring's closed form.
"""

import pytest

from sim.studies.collective import CollectiveOptions, run_collective
from sim.engine.core import simulate
from sim.inputs.topology_build import load_topology
from sim.program.actions import FLOW_PIECES, Action, Program
from sim.inputs.schema import SimulationSettings
from sim.session import Job, simulate_training
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt, llama
from sim.inputs.plan import ParallelPlan

H100 = load_profile("h100-sxm")


@pytest.mark.parametrize("op", ["allreduce", "reducescatter", "allgather", "alltoall", "broadcast"])
@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64])  # one node over NVLink up to 8, then 2-8 nodes over IB
@pytest.mark.parametrize("size", [64 * 2**10, 256 * 2**20])
def test_flows_and_steps_agree_within_one_percent_when_nothing_contends(op, n, size):
    topo = load_topology("dgx-h100", nodes=max(1, n // 8))
    eff = H100.link_efficiencies()
    _, flows = run_collective(op, size, n, topo, CollectiveOptions(link_efficiency=eff, collective_model="flows"))
    _, steps = run_collective(op, size, n, topo, CollectiveOptions(link_efficiency=eff, collective_model="steps"))
    assert flows["time_s"] == pytest.approx(steps["time_s"], rel=0.01)
    if op in ("allreduce", "reducescatter", "allgather"):
        # events grow with n: each hop of each channel is at most FLOW_PIECES transfers
        channels = 8 if n > 8 else 1
        assert flows["transfers"] <= FLOW_PIECES * n * channels
        assert steps["transfers"] == (2 if op == "allreduce" else 1) * (n - 1) * n * channels


@pytest.mark.parametrize("n", [2, 4, 8])
def test_flows_match_the_ring_closed_form(n):
    # NCCL's base latency of a ring under Simple (8.4 us, baseLatencies in NVIDIA/nccl
    # src/graph/tuning.cc) + 2(n-1)(alpha + S/(nB)) (Patarasuk & Yuan 2009), alpha the path
    # latency, B the bottleneck
    t = load_topology("dgx-h100")
    S = 2**30
    alpha, B = t.path_latency_s(0, 1), t.bottleneck_Bps(0, 1)
    _, s = run_collective("allreduce", S, n, t, CollectiveOptions(collective_model="flows"))
    assert s["time_s"] == pytest.approx(8.4e-6 + 2 * (n - 1) * (alpha + S / (n * B)), rel=1e-9)


@pytest.mark.parametrize("model", ["flows", "steps"])
def test_a_ring_sharing_two_links_with_a_long_send_takes_the_hand_computed_time(model):
    # Four GPUs of a DGX node (each GPU one link up to the NVSwitch and one down), a ring
    # all-reduce over 0-1-2-3 and a large send 0 -> 2 that outlasts it. The send shares
    # GPU 0's uplink with the hop 0->1 and GPU 2's downlink with the hop 1->2: max-min
    # fair, each of those hops gets B/2. Each hop carries 2(n-1)/n S = 1.5 S and pays
    # 2(n-1) = 6 latencies, so the slowest hop ends at 6 alpha + 1.5 S / (B/2) = 6 alpha + 3 S/B
    # after the ring's start, NCCL's base latency (8.4 us for a ring under Simple, baseLatencies
    # in NVIDIA/nccl src/graph/tuning.cc) after the send's.
    S = 2**28
    trace, alpha, B = _beside_a_long_send(Action("ar", kind="collective", op="allreduce", group=tuple(range(4)),
                                                 nbytes=S, channels=1), 20 * S, model)
    ends = {s.rank: s.end_s for s in trace.spans if s.name == "ar"}
    assert max(ends.values()) == pytest.approx(8.4e-6 + 6 * alpha + 3 * S / B, rel=1e-9)


def _beside_a_long_send(collective: Action, bulk_bytes: float, model: str):
    """``collective`` on GPUs 0-3 of a DGX H100 and a send of ``bulk_bytes`` from 0 to 2
    beside it: (trace, path latency, link bandwidth)."""
    t = load_topology("dgx-h100")
    prog = {r: [collective] for r in collective.group}
    prog[0].append(Action("bulk", kind="send", peer=2, nbytes=bulk_bytes, stream="bulk"))
    prog[2].append(Action("bulk", kind="recv", peer=0, nbytes=bulk_bytes, stream="bulk"))
    trace = simulate(Program(prog), t, fluid_collectives=model == "flows")
    return trace, t.path_latency_s(0, 1), t.bottleneck_Bps(0, 1)


@pytest.mark.parametrize("model,plan", [
    # data parallelism over 2 nodes (16 GPUs), gradient buckets overlapping backward
    (gpt("small", 4, 1024, 16, 8192, 512), ParallelPlan(dp=16, global_batch_size=32)),
    # expert parallelism over 2 nodes (ep 16): each all-to-all one bundle (flows) or n(n-1) transfers (steps)
    (llama("moe-16", 2, 512, 8, 8, 1024, 2000, 256, num_experts=16, moe_router_topk=2, moe_ffn_hidden_size=512),
     ParallelPlan(dp=16, ep=16, global_batch_size=32)),
])
def test_a_training_step_agrees_between_the_models_and_flows_use_fewer_transfers(model, plan):
    topo = load_topology("dgx-h100", nodes=2)
    # (rings, which the two collective models run differently: NCCL_ALGO=ring)
    flows, steps = (simulate_training(Job(model, plan, H100, topo),
                                      SimulationSettings(fidelity="full", collective_model=collectives,
                                                         nccl_algo="ring", nccl_protocol="simple"))
                    for collectives in ("flows", "steps"))
    assert flows.trace.end_s == pytest.approx(steps.trace.end_s, rel=0.01)
    assert len(flows.trace.transfers) * 4 < len(steps.trace.transfers)
    assert (flows.collective_model, steps.collective_model) == ("flows", "steps")


# ---------------------------------------------------------------- all-to-all as one bundle
@pytest.mark.parametrize("model", ["flows", "steps"])
def test_alltoall_on_a_switch_takes_the_closed_form(model):
    # S bytes per rank over n ranks on one NVSwitch of per-direction bandwidth B: each
    # uplink carries n-1 sends of S/n, so (n-1)/n S/B + alpha (no base latency: NCCL runs
    # it as grouped sends and receives). Flows: one bundle, one record per source.
    t = load_topology("dgx-h100")
    n, S = 8, 2**30
    alpha, B = t.path_latency_s(0, 1), t.bottleneck_Bps(0, 1)
    trace, s = run_collective("alltoall", S, n, t, CollectiveOptions(collective_model=model))
    assert s["time_s"] == pytest.approx(alpha + (n - 1) / n * S / B, rel=1e-9)
    assert s["transfers"] == (n if model == "flows" else n * (n - 1))
    assert trace.bytes_by_link_kind()["nvlink"] == pytest.approx(2 * n * (n - 1) * S / n)  # up and down


@pytest.mark.parametrize("pxn", [0, 2])
@pytest.mark.parametrize("model", ["flows", "steps"])
def test_alltoall_across_two_nodes_takes_its_most_loaded_links_time(model, pxn):
    # 16 ranks on 2 DGX H100, rail-optimized. Without PXN (level 0) cross-rail sends go
    # through the spines, spread by ECMP; with it (NCCL's default, level 2) they go over
    # NVLink to the GPU on the destination's rail and stay on that rail. Every send of S/16
    # is issued at once and moves after its own route's latency, so the all-to-all ends when
    # the most loaded directed link has carried its sends, that link busy from its first
    # send's arrival on: the largest (earliest latency on a link + its bytes / bandwidth).
    # Without PXN that link is a spine's, whose sends all share one latency; with PXN a
    # NIC's, first reached by the one send already on its rail (2 NVLink hops shorter).
    t = load_topology("dgx-h100", nodes=2).with_pxn(pxn)
    n, S = 16, 2**28
    g = t.graph
    sends: dict = {}
    for r in range(n):
        for q in range(n):
            if q != r:
                for link in t.route(r, q):
                    sends.setdefault(link, []).append(t.path_latency_s(r, q))
    end = max(min(lat) + len(lat) * S / n / g.edges[link]["bandwidth_Bps"] for link, lat in sends.items())
    assert any(x.startswith("spine") for link in sends for x in link) == (pxn == 0)
    _, s = run_collective("alltoall", S, n, t, CollectiveOptions(collective_model=model))
    assert s["time_s"] == pytest.approx(end, rel=1e-9)


@pytest.mark.parametrize("model", ["flows", "steps"])
def test_an_alltoall_sharing_two_links_with_a_long_send_takes_the_hand_computed_time(model):
    # Four GPUs of a DGX node and a large send 0 -> 2 that outlasts the all-to-all. GPU 0's
    # uplink carries its 3 sends and the bulk send, GPU 2's downlink the 3 sends to it and
    # the bulk one: max-min gives each B/4 there. As one bundle, every send goes at that
    # pace (S/4 at B/4); as 12 flows, the sends over those two links do and the others end
    # sooner. Either way the all-to-all ends at alpha + (S/4) / (B/4) = alpha + S/B.
    S = 2**28
    trace, alpha, B = _beside_a_long_send(Action("a2a", kind="collective", op="alltoall", group=tuple(range(4)),
                                                 nbytes=S), 20 * S, model)
    ends = {s.rank: s.end_s for s in trace.spans if s.name == "a2a"}
    assert max(ends.values()) == pytest.approx(alpha + S / B, rel=1e-9)
    # the bulk send had B/4 until then, the whole link after: 20 S = (S/B)(B/4) + rest at B
    bulk = next(s for s in trace.spans if s.name == "bulk" and s.rank == 0)
    assert bulk.end_s == pytest.approx(alpha + S / B + (20 * S - S / 4) / B, rel=1e-9)


def test_two_alltoalls_of_one_group_at_once_share_its_links():
    # Two all-to-alls over the same 4 GPUs on two streams at once: each takes half of
    # every link it has to itself (a bundle's folded links are one link its flows share),
    # so both end at alpha + 2 (n-1)/n S/B.
    t = load_topology("dgx-h100")
    S, n = 2**28, 4
    alpha, B = t.path_latency_s(0, 1), t.bottleneck_Bps(0, 1)
    group = tuple(range(n))
    prog = {r: [Action("x", kind="collective", op="alltoall", group=group, nbytes=S, stream="a"),
                Action("y", kind="collective", op="alltoall", group=group, nbytes=S, stream="b")] for r in group}
    trace = simulate(Program(prog), t, fluid_collectives=True)
    for name in ("x", "y"):
        assert max(s.end_s for s in trace.spans if s.name == name) == pytest.approx(
            alpha + 2 * (n - 1) / n * S / B, rel=1e-9)

