"""NCCL's per-collective base latency (``baseLatencies`` in NVIDIA/nccl src/graph/tuning.cc):
every NCCL collective pays it once before its first transfer, the tuner counts it, and
Transformer Engine's userbuffers chunks and point-to-point transfers do not."""

import contextlib
import io
import json
import math
from dataclasses import replace

import pytest

from sim.cli import main
from sim.studies.collective import CollectiveOptions, run_collective
from sim.engine.algorithms import build
from sim.engine.core import simulate
from sim.engine.nccl import NcclModel, TunerRequest, rate_caps
from sim.engine.tuner import alone_time, estimate
from sim.errors import InputError
from sim.inputs.hardware import HardwareProfile, load_profile
from sim.inputs.model import ModelSpec
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.program.actions import Action, Program
from sim.program.tp import TP_COMM_STREAM, ItemReader, add_tp_collectives, overlapped_layer
from sim.program.training import build_program
from sim.program.workload import Comm, Op
from sim.inputs.schema import SimulationSettings
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
EFF, MODEL = H100.link_efficiencies(), NcclModel.from_profile(H100)
# NCCL's table (µs), as tuning.cc writes it: {LL, LL128, Simple} per algorithm
NCCL_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0)}
PROTOS = ("ll", "ll128", "simple")


def _table(scale: float = 1.0, **over) -> dict:
    """NCCL's table in seconds (times ``scale``), with some algorithms' rows replaced."""
    out = {a: {p: v * 1e-6 * scale for p, v in zip(PROTOS, us)} for a, us in NCCL_US.items()}
    out.update(over)
    return out


def _time(op, n, S, topo, algo, protocol, profile=H100):
    model = NcclModel.from_profile(profile)
    return run_collective(op, S, n, topo, CollectiveOptions(algo=algo, link_efficiency=profile.link_efficiencies(), protocol=protocol, nccl=model))[1]


def test_presets_carry_nccls_table_with_its_source():
    for name in ("a100-80gb", "h100-sxm", "h200"):
        p = load_profile(name)
        assert {(a, q): v for a, row in p.nccl_base_latency_s.items() for q, v in row.items()} == \
            pytest.approx({(a, q): v for a, row in _table().items() for q, v in row.items()}, rel=1e-12)
        assert "baseLatencies" in p.sources["nccl_base_latency_s"] and "tuning.cc" in p.sources["nccl_base_latency_s"]
    # left out, a profile takes NCCL's table; written out, it reads back the same
    bare = replace(H100, nccl_base_latency_s=None)
    assert NcclModel.from_profile(bare).base_latency_s == H100.nccl_base_latency_s
    assert "nccl_base_latency_s" not in bare.to_dict()
    assert HardwareProfile.from_dict(H100.to_dict()).nccl_base_latency_s == H100.nccl_base_latency_s


def test_small_ring_ll_allreduce_on_one_dgx_h100_is_the_base_plus_the_hops():
    # 4 KiB over the 8 GPUs of one node, ring under LL: NCCL's base latency 6.6 us, then
    # 2(n-1) steps, each at LL's NVLink ring latency, 0.6 us (hwLatencies[NVLINK][RING][LL]),
    # and S/n bytes doubled by LL's flags, at the NVLink rate times the profile's efficiency,
    # on the one channel of 24 NCCL runs for it (4 KiB < 2 channels x 512 threads x 8 B x 8
    # ranks, topoGetAlgoInfo), under LL's 141 GB/s bus cap (llMaxBws, Hopper, one node).
    topo = load_topology("dgx-h100")
    g = topo.graph
    hop = 0.6e-6
    B = g.edges[topo.gpu(0), "node0/nvswitch"]["bandwidth_Bps"] * H100.links["nvlink"].efficiency
    n, S = 8, 4096
    wire_rate = min(B / 24, 141e9 / 0.5)
    want = 6.6e-6 + 2 * (n - 1) * (hop + (S / n) / 0.5 / wire_rate)
    s = _time("allreduce", n, S, topo, "ring", "ll")
    assert s["time_s"] == pytest.approx(want, rel=1e-9)
    assert s["base_latency_s"] == pytest.approx(6.6e-6, rel=1e-12)
    # the tuner picks ring LL for it, and the steps model agrees with the flows
    assert _time("allreduce", n, S, topo, "auto", "auto")["time_s"] == pytest.approx(want, rel=1e-9)
    steps = run_collective("allreduce", S, n, topo, CollectiveOptions(algo="ring", link_efficiency=EFF, collective_model="steps", protocol="ll", nccl=MODEL))[1]
    assert steps["time_s"] == pytest.approx(want, rel=1e-9)


def test_tree_across_nodes_pays_trees_base():
    # An empty buffer, so only latencies count: the tree's 2((g-1) a_intra + log2(N) a_inter)
    # (sim.engine.algorithms_nccl) at NCCL's tree latencies under LL (hwLatencies[NVLINK][TREE]
    # 0.6 us, [NET][TREE] 5.0 us), after tree's base latency under LL, 6.8 us (ring's is 6.6 us):
    # ncclTopoTuneModel's 2 * ((nRanks/nNodes - 1) * intraLat + log2i(nNodes) * interLat).
    topo = load_topology("dgx-h100", nodes=4)
    g, N = 8, 4
    lat = 2 * ((g - 1) * 0.6e-6 + int(math.log2(N)) * 5.0e-6)
    s = _time("allreduce", g * N, 0, topo, "tree", "ll")
    assert s["time_s"] == pytest.approx(6.8e-6 + lat, rel=1e-9)
    # and the base is the profile's: another figure moves the time by exactly the difference
    other = replace(H100, nccl_base_latency_s=_table(tree={"ll": 20e-6, "ll128": 0.0, "simple": 0.0}))
    assert _time("allreduce", g * N, 0, topo, "tree", "ll", other)["time_s"] == pytest.approx(20e-6 + lat, rel=1e-9)


def test_nvls_pays_no_base_latency():
    # NVLS all-reduce on 8 H100s: nvls_latency_s + S(n+1)/n / (B_line · nvls_efficiency)
    # (the switch-reduction closed form), and NCCL's base latency for NVLS is 0.
    topo = load_topology("dgx-h100")
    n, S = 8, 2**30
    B_line = topo.graph.edges[topo.gpu(0), "node0/nvswitch"]["bandwidth_Bps"]
    # NVLS's chunked pipeline (calcCollChunking): 1 GiB is not under 64 rounds of 16 channels
    # x 8 heads x 128 KiB chunks, so the chunks stay 128 KiB and the way back starts after
    # one round, 16 x 8 x 128 KiB = 16 MiB, has gone to the switch
    lead = 16 * 8 * 128 * 1024
    want = H100.nvls_latency_s + (S * (n + 1) / n + lead) / (B_line * H100.nvls_efficiency)
    s = _time("allreduce", n, S, topo, "nvls", "simple")
    assert s["time_s"] == pytest.approx(want, rel=1e-9) and s["base_latency_s"] == 0.0


def test_hierarchical_pays_rings_base_once_per_phase():
    # Hierarchical all-reduce is three NCCL ring calls (reduce-scatter in each node, all-reduce
    # across nodes, all-gather in each node): 3 ring bases; inside one node, two.
    for nodes, calls in ((2, 3), (1, 2)):
        topo = load_topology("dgx-h100", nodes=nodes)
        zero = replace(H100, nccl_base_latency_s=_table(0.0))
        with_base = _time("allreduce", 8 * nodes, 2**20, topo, "hierarchical", "simple")["time_s"]
        without = _time("allreduce", 8 * nodes, 2**20, topo, "hierarchical", "simple", zero)["time_s"]
        assert with_base - without == pytest.approx(calls * 8.4e-6, rel=1e-6)


def test_point_to_point_pays_no_base_latency():
    # an all-to-all (grouped sends) inside a node: alpha + (n-1) S / (n B), as before
    topo = load_topology("dgx-h100")
    n, S = 8, 2**20
    alpha, B = topo.path_latency_s(0, 1), topo.bottleneck_Bps(0, 1)
    _, s = run_collective("alltoall", S, n, topo)
    assert s["time_s"] == pytest.approx(alpha + (n - 1) * S / (n * B), rel=1e-9) and s["base_latency_s"] == 0.0
    _, s = run_collective("sendrecv", S, 2, topo)
    assert s["time_s"] == pytest.approx(alpha + S / B, rel=1e-9)


@pytest.mark.parametrize("nodes,n", [(1, 8), (1, 4), (2, 16), (4, 32)])
@pytest.mark.parametrize("op", ["allreduce", "allgather", "reducescatter"])
@pytest.mark.parametrize("S", [4096, 2**20, 2**28])
def test_tuner_estimate_equals_the_simulated_time(nodes, n, op, S):
    # uncontended, the flow model's time is the tuner's estimate, base latency included
    # (NVLS-tree's estimate chains its phases where the flows overlap them: not compared)
    topo = load_topology("dgx-h100", nodes=nodes)
    s = _time(op, n, S, topo, "auto", "auto")
    if s["algo"] == "nvls_tree":
        pytest.skip("NVLS-tree: the estimate does not overlap its phases")
    est = alone_time(op, tuple(range(n)), S, topo, EFF, MODEL.forcing("auto", "auto"))
    assert s["time_s"] == pytest.approx(est, rel=1e-9)
    assert s["time_s"] > s["base_latency_s"] >= 0


def _bad(**field):
    d = H100.to_dict()
    d.update(field)
    with pytest.raises(InputError) as e:
        HardwareProfile.from_dict(d)
    msg = str(e.value)
    assert "\n" not in msg and "nccl_base_latency_s" in msg and "expected" in msg
    return msg


def test_bad_base_latencies_are_one_line_errors():
    assert "ring, tree, nvls, nvls_tree" in _bad(nccl_base_latency_s=5e-6)
    assert "ring, tree, nvls, nvls_tree" in _bad(nccl_base_latency_s={"ring": _table()["ring"]})
    assert "pat" in _bad(nccl_base_latency_s={**_table(), "pat": _table()["ring"]})
    assert "ll, ll128, simple" in _bad(nccl_base_latency_s=_table(ring={"ll": 1e-6, "simple": 1e-6}))
    for x in (-1e-6, "6.6us", True, float("nan"), float("inf"), None):
        msg = _bad(nccl_base_latency_s=_table(tree={"ll": x, "ll128": 0.0, "simple": 0.0}))
        assert "nccl_base_latency_s.tree.ll" in msg and repr(x) in msg and ">= 0 (seconds)" in msg
    with pytest.raises(InputError, match="nccl_base_latency_s.ring.simple: got -1"):
        replace(H100, nccl_base_latency_s=_table(ring={"ll": 0, "ll128": 0, "simple": -1}))


def test_collective_cli_prints_the_time_with_the_base():
    # the 4 KiB all-reduce of the brief on one DGX H100: ring LL, 6.6 us + the hops (above)
    topo = load_topology("dgx-h100")
    hop, B = 0.6e-6, 450e9 * H100.links["nvlink"].efficiency  # hwLatencies[NVLINK][RING][LL]
    want = 6.6e-6 + 14 * (hop + 512 / 0.5 / min(B / 24, 141e9 / 0.5))  # one channel of 24, LL's cap
    assert topo.path_latency_s(0, 1) == 2e-6 and topo.bottleneck_Bps(0, 1) == 450e9
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["collective", "--op", "allreduce", "--size", "4096", "--gpus", "8"]) == 0
    text = out.getvalue()
    assert f"time   {want * 1e6:.2f} us   (NCCL base latency 6.60 us included)" in text
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["collective", "--op", "allreduce", "--size", "4096", "--gpus", "8", "--json"]) == 0
    s = json.loads(out.getvalue())
    assert s["time_s"] == pytest.approx(want, rel=1e-9) and s["base_latency_s"] == pytest.approx(6.6e-6)


# ---------------------------------------------------------------- what is not NCCL


def _gemm(name, flops, shape=(4, 2, 2)):
    return Op(name, "F", "gemm", float(flops), 0.0, 0.0, 0.0, shape)


def _memory(name, flops):
    return Op(name, "F", "memory", float(flops), 0.0, 0.0, 0.0)


OPS = {"all_gather": "allgather", "reduce_scatter": "reducescatter", "all_reduce": "allreduce"}


def test_tp_overlap_chunks_pay_no_base_latency_and_a_plain_allreduce_does(make_star):
    # On a star of 1 B/s links, over 2 ranks: norm 1 s; an all-gather of 8 B in 2
    # userbuffers chunks (2 s each) beside a GEMM of 12 s in 2 chunks; the projection GEMM
    # 2 s; an all-reduce of 4 B, an NCCL kernel (not overlapped): 8.4 us (ring, Simple) +
    # 2 x 2 s; the residual 1 s. norm [0,1], gather0 [1,3], gemm0 [3,9] beside gather1
    # [3,5], gemm1 [9,15], proj [15,17], all-reduce [17, 21 + base], residual.
    items = [_memory("attn.norm", 1), Comm("attn.all_gather", "F", "all_gather", 8.0), _gemm("attn.qkv", 12),
             _gemm("attn.proj", 2), Comm("attn.all_reduce", "F", "all_reduce", 4.0), _memory("attn.residual", 1)]
    segs = overlapped_layer(items, 0, 2, ItemReader(lambda op: op.flops, lambda it: isinstance(it, Comm),
                                                    lambda c: OPS[c.collective]))
    prog = add_tp_collectives(Program({r: [Action("0F0", category="F")] for r in range(2)}), lambda r, a: segs,
                              lambda r: (0, 1))
    colls = [a for a in prog.actions[0] if a.kind == "collective"]
    assert [(a.op, a.stream, a.transport, a.slows_compute) for a in colls] == [
        ("allgather", TP_COMM_STREAM, "direct", False), ("allgather", TP_COMM_STREAM, "direct", False),
        ("allreduce", "compute", "nccl", True)]
    tr = simulate(prog, make_star([1.0, 1.0]))
    base = 8.4e-6
    spans = sorted((s.stream, s.start_s, s.end_s) for s in tr.spans if s.rank == 0)
    side = [(a, b) for st, a, b in spans if st == TP_COMM_STREAM]
    assert side == [pytest.approx((1.0, 3.0), abs=1e-12), pytest.approx((3.0, 5.0), abs=1e-12)]
    ar = next(s for s in tr.spans if s.rank == 0 and s.name == colls[-1].name)
    assert (ar.start_s, ar.end_s) == (pytest.approx(17.0, abs=1e-12), pytest.approx(21.0 + base, abs=1e-12))
    assert tr.end_s == pytest.approx(22.0 + base, abs=1e-12)


TINY = ModelSpec(name="tiny", num_layers=2, hidden_size=1024, num_attention_heads=16, vocab_size=32000,
                 ffn_hidden_size=4096, seq_length=1024)


def test_a_tp_overlap_plan_marks_exactly_its_userbuffers_chunks():
    # tp 8 with sequence parallelism and the overlap in each of two nodes, dp 2 across them:
    # the overlapped chunks (tensor-parallel, on the side stream) are userbuffers; the
    # data-parallel gradient all-reduces and anything else stay NCCL collectives
    topo = load_topology("dgx-h100", nodes=2)
    plan = ParallelPlan(tp=8, dp=2, sequence_parallel=True, tp_comm_overlap=True, global_batch_size=2)
    run = simulate_training(Job(TINY, plan, H100, topo), SimulationSettings(fidelity="full"))
    colls = [a for acts in run.program.actions.values() for a in acts if a.kind == "collective"]
    ub = [a for a in colls if a.transport == "direct"]
    assert ub and all(a.stream == TP_COMM_STREAM and a.category == "tp" and len(a.group) == 8 for a in ub)
    assert all(not (a.stream == TP_COMM_STREAM and a.category == "tp") for a in colls if a.transport == "nccl")
    assert any(a.category == "dp" for a in colls if a.transport == "nccl")
    # with NCCL's base doubled the NCCL collectives take longer, but the chunks' spans keep
    # their lengths (nothing else crosses NVLink: data parallelism is across the nodes)
    assert run.trace.end_s < simulate_training(Job(TINY, plan, replace(H100, nccl_base_latency_s=_table(2.0)), topo),
                                               SimulationSettings(fidelity="full")).trace.end_s
    doubled = replace(H100, nccl_base_latency_s=_table(2.0))
    run2 = simulate_training(Job(TINY, plan, doubled, topo), SimulationSettings(fidelity="full"))
    side = lambda r: sorted(round(s.end_s - s.start_s, 12) for s in r.trace.spans  # noqa: E731
                            if s.stream == TP_COMM_STREAM and s.rank == 0)
    assert side(run) == side(run2)


def test_coalesced_tp_collectives_pay_the_base_once_as_the_engine_does():
    # tp 8 inside one node, no overlap: the coalesced program prices each TP collective alone
    # (base included) and ends where the uncoalesced one does; also on the closed-form path
    # (no NCCL model: the engine's default, ring under Simple)
    topo = load_topology("dgx-h100")
    plan = ParallelPlan(tp=8, global_batch_size=1)
    on = simulate_training(Job(TINY, plan, H100, topo))
    off = simulate_training(Job(TINY, plan, H100, topo), coalesce_tp=False)
    assert any(a.kind == "comm" for a in on.program.actions[0])
    assert on.trace.end_s == pytest.approx(off.trace.end_s, rel=1e-9)
    _, closed = build_program(TINY, plan, H100, topology=topo)
    _, plain = build_program(TINY, plan, H100, topology=topo, coalesce_tp=False)
    assert any(a.kind == "comm" for a in closed.actions[0])
    n_tp = sum(a.kind == "collective" for a in plain.actions[0])
    t_closed = simulate(closed, topo, link_efficiency=EFF).end_s
    t_plain = simulate(plain, topo, link_efficiency=EFF).end_s
    assert n_tp > 0 and t_closed == pytest.approx(t_plain, rel=1e-9)
    # and the base is in both: without it each of the n_tp collectives is 8.4 us shorter
    # (both under the links alone, no architecture: the engine's default model)
    assert t_plain - simulate(plain, topo, link_efficiency=EFF,
                              nccl=replace(NcclModel.from_profile(replace(H100, nccl_base_latency_s=_table(0.0))),
                                           arch=None).forcing(None, None)).end_s == pytest.approx(n_tp * 8.4e-6, rel=1e-6)


def test_a_userbuffers_chunk_is_priced_and_chosen_without_the_base():
    # An 8 MiB all-gather over 8 A100s: as an NCCL collective the tuner weighs each
    # protocol's transfers plus its base latency (LL128's 14 us against Simple's 8.4 us);
    # as a userbuffers chunk nothing pays a base, so it runs whichever moves the bytes fastest.
    a100 = load_profile("a100-80gb")
    topo = load_topology("dgx-a100")
    model, eff = NcclModel.from_profile(a100).forcing("auto", "auto"), a100.link_efficiencies()
    n, S = 8, 8 * 2**20
    steps = build("allgather", range(n), S, topo, "ring", fluid=True)
    # (the links alone: not an NCCL kernel, base False)
    direct = {p: TunerRequest("allgather", range(n), S, topo, eff, model, "ring", p, base=False) for p in PROTOS}
    hops = {p: estimate(steps, direct[p]) for p in PROTOS}
    base = {p: v * 1e-6 for p, v in zip(PROTOS, NCCL_US["ring"])}

    def run(ub: bool) -> float:
        prog = Program({r: [Action("ag", kind="collective", op="allgather", group=tuple(range(n)), nbytes=S,
                                   algo="auto", protocol="auto", transport="direct" if ub else "nccl")]
                         for r in range(n)})
        return simulate(prog, topo, link_efficiency=eff, nccl=model).end_s

    assert run(True) == pytest.approx(min(hops.values()), rel=1e-9)
    # as an NCCL collective its steps pay NCCL's per-step latencies and its protocol caps too
    # (sim.engine.nccl_tuning; 8 MiB keeps all channels)
    kernel = {p: TunerRequest("allgather", range(n), S, topo, eff, model, "ring", p) for p in PROTOS}
    nccl = {p: estimate(steps, kernel[p], base[p], rate_caps(steps, kernel[p], 1)) for p in PROTOS}
    assert run(False) == pytest.approx(min(nccl.values()), rel=1e-9)
    # (LL128 moves the bytes fastest on the links alone; as an NCCL kernel LL128 wins too, its
    # 14 us base against Simple's 8.4 us made up by 7 steps at 1.9 us against 3.4 us)
    assert min(hops, key=hops.get) == "ll128" and min(nccl, key=nccl.get) == "ll128"
