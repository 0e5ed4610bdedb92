"""NCCL's tuning model for small and mid-size messages (``sim.engine.nccl_tuning``), checked
against the formulas of NCCL's own model, computed here by hand for 8 H100s of one DGX node:

- latency (ncclTopoTuneModel): baseLatencies + 2(n−1) · hwLatencies[NVLINK][algo][proto];
  ring 6.6 + 14·0.6 = 15.0 µs (LL), 14.0 + 14·1.9 = 40.6 µs (LL128), 8.4 + 14·3.4 = 56.0 µs
  (Simple); NVLS 25 µs;
- bus bandwidth: the NVLink rate the profile reaches, B = 450 GB/s · 0.822 = 370 GB/s,
  under LL at most min(llMaxBws = 141, B·0.5), under LL128 min(0.92·B, nChannels · 36.7)
  with 12 search channels; all-reduce moves S·2(n−1)/n bytes of bus traffic;
- channels (topoGetAlgoInfo): nc of 24, dropping one while S < nc · threads · threshold.
"""

import pytest

from sim.engine.nccl import NcclModel, TunerRequest
from sim.engine.nccl_tuning import channels_used, nvls_chunk_bytes, tree_correction
from sim.engine.tuner import choose
from sim.inputs.hardware import load_profile
from sim.inputs.topology_build import load_topology
from sim.studies.collective import CollectiveOptions, run_collective

H100 = load_profile("h100-sxm")
MODEL = NcclModel.from_profile(H100)
EFF = H100.link_efficiencies()
TOPO = load_topology("dgx-h100")
N = 8
B = 450e9 * 0.822  # the profile's NVLink efficiency, ~370/450 (its sources)
BUS = 2 * (N - 1) / N  # all-reduce's bus traffic per byte
LAT = {"ll": 6.6e-6 + 14 * 0.6e-6, "ll128": 14.0e-6 + 14 * 1.9e-6, "simple": 8.4e-6 + 14 * 3.4e-6}
BUSBW = {"ll": min(141e9, 0.5 * B), "ll128": min(0.92 * B, 12 * 36.7e9), "simple": B}


def _time(S, algo, protocol):
    return run_collective("allreduce", S, N, TOPO, CollectiveOptions(algo=algo, link_efficiency=EFF, protocol=protocol, nccl=MODEL))[1]["time_s"]


def _ring_model(S, p, nc=24):
    """NCCL's estimate of a ring all-reduce, with nc of 24 channels running (NCCL's tuner
    prices all 24; the run uses nc)."""
    return LAT[p] + S * BUS / (BUSBW[p] if nc == 24 else min(BUSBW[p], B * (0.5 if p == "ll" else 1) * nc / 24))


def test_the_profile_is_the_one_the_hand_figures_assume():
    assert EFF["nvlink"] == 0.822 and TOPO.bottleneck_Bps(0, 1) == 450e9
    assert MODEL.arch == "hopper" and H100.nvls_latency_s == 25e-6


@pytest.mark.parametrize("S", [2**20, 2 * 2**20, 4 * 2**20, 16 * 2**20, 32 * 2**20, 64 * 2**20, 256 * 2**20])
def test_ring_picks_the_protocol_of_nccls_model_and_takes_its_time(S):
    # ring forced (as NCCL_ALGO=Ring): LL below ~3.5 MB, LL128 to ~37 MB, Simple above, as
    # the hand estimates cross (LL vs LL128: 25.6 us = S*1.75*(1/141 - 1/340.4) GB/s)
    est = {p: _ring_model(S, p) for p in LAT}
    want = min(est, key=est.get)
    assert choose(TunerRequest("allreduce", range(N), S, TOPO, EFF, MODEL, algo="ring")) == ("ring", want)
    assert _time(S, "ring", want) == pytest.approx(est[want], rel=1e-9)
    assert want == ("ll" if S <= 2 * 2**20 else "ll128" if S <= 32 * 2**20 else "simple")


def test_the_crossovers_lie_where_the_formulas_put_them():
    cross_ll = (LAT["ll128"] - LAT["ll"]) / (BUS / BUSBW["ll"] - BUS / BUSBW["ll128"])
    cross_simple = (LAT["simple"] - LAT["ll128"]) / (BUS / BUSBW["ll128"] - BUS / BUSBW["simple"])
    assert 3.4e6 < cross_ll < 3.6e6 and 37e6 < cross_simple < 38e6
    for S, p in ((cross_ll * 0.98, "ll"), (cross_ll * 1.02, "ll128"), (cross_simple * 0.98, "ll128"),
                 (cross_simple * 1.02, "simple")):
        assert choose(TunerRequest("allreduce", range(N), int(S), TOPO, EFF, MODEL, algo="ring"))[1] == p


def test_tiny_messages_cost_ncclls_latency():
    # 8 bytes, tuner's choice: ring LL, NCCL's 15.0 us (6.6 + 14 x 0.6), the bytes nothing
    t = run_collective("allreduce", 8, N, TOPO, CollectiveOptions(algo="auto", link_efficiency=EFF, protocol="auto", nccl=MODEL))[1]
    assert (t["algo"], t["protocol"]) == ("ring", "ll")
    assert t["time_s"] == pytest.approx(15.0e-6, rel=1e-3)


def test_channels_follow_topoGetAlgoInfo():
    # ring Simple: 512 threads x 64 B = 32 KiB per channel; ring LL on 8 ranks: 512 x 8 x 8;
    # LL128: 640 x 8 = 5 KiB; at least one, at most the communicator's 24 (16 across nodes)
    assert channels_used("ring", "simple", 100 * 1024, 8, 1) == (3, 24)
    assert channels_used("ring", "ll", 100 * 1024, 8, 1) == (3, 24)
    assert channels_used("ring", "ll", 100 * 1024, 16, 2) == (1, 16)  # 8 x 16 ranks: 64 KiB a channel
    assert channels_used("ring", "ll128", 100 * 1024, 8, 1) == (20, 24)
    assert channels_used("ring", "simple", 8, 8, 1) == (1, 24)
    assert channels_used("ring", "simple", 24 * 32768, 8, 1) == (24, 24)
    assert channels_used("tree", "simple", 10 * 32768, 16, 2) == (10, 16)
    assert channels_used("nvls", "simple", 8, 8, 1) == (16, 16)


@pytest.mark.parametrize("S,nc", [(256 * 1024, 8), (96 * 1024, 3), (768 * 1024, 24)])
def test_a_small_ring_runs_on_the_channels_its_size_keeps(S, nc):
    # ring Simple forced: each channel moves 1/24 of the links' rate, nc = S / 32 KiB of them
    assert _time(S, "ring", "simple") == pytest.approx(LAT["simple"] + S * BUS / (B * nc / 24), rel=1e-9)


def test_channel_scaling_slows_a_small_ll_ring_in_proportion():
    # two sizes on 1 and 2 channels: the bandwidth term doubles with the channels
    t1, t2 = (_time(S, "ring", "ll") - LAT["ll"] for S in (32 * 1024, 64 * 1024))
    assert t1 == pytest.approx(32 * 1024 * BUS / (0.5 * B / 24), rel=1e-9)
    assert t2 == pytest.approx(t1, rel=1e-9)  # twice the bytes on twice the channels


def test_nvls_pays_one_round_of_chunks_before_the_way_back():
    # 16 MiB on one node: NVLS chunks (calcCollChunking) 128 KiB -> 64 KiB (16 MiB < 64 rounds of
    # 16 channels x 8 heads x 128 KiB) -> 32 KiB (< 8 rounds of 64 KiB), not 16 KiB (not < 2 x
    # 128 x 32 KiB); the multicast back starts one round, 128 x 32 KiB = 4 MiB, after the
    # reduction starts; the switch path runs at nvls_efficiency of the 450 GB/s line
    S = 16 * 2**20
    assert nvls_chunk_bytes(S, 8) == 32 * 1024
    lead = 16 * 8 * 32 * 1024
    want = 25e-6 + (S * 9 / 8 + lead) / (450e9 * H100.nvls_efficiency)
    assert _time(S, "nvls", "simple") == pytest.approx(want, rel=1e-9)
    # and NCCL's choice for it: NVLS beats the ring's best (LL128 at 16 MiB)
    assert want < min(_ring_model(S, p) for p in LAT)
    assert choose(TunerRequest("allreduce", range(N), S, TOPO, EFF, MODEL)) == ("nvls", "simple")
    # chunk sizes at the ends: 16 KiB below 2 rounds of 32 KiB chunks, 128 KiB from 1 GiB
    assert nvls_chunk_bytes(8 * 2**20 - 1, 8) == 16 * 1024 and nvls_chunk_bytes(2**30, 8) == 128 * 1024


def test_tree_on_one_node_is_capped_as_nccl_caps_it():
    # tree forced, 256 MiB, one node: a chain, each GPU sending S up and S down over its one
    # link to the switch. Latency: base + 2 x 7 x hwLatencies[NVLINK][TREE].
    S = 256 * 2**20
    # Simple: the links bind (2S/B, a bus bandwidth of 0.875 B = 324 GB/s), under NCCL's caps,
    # 12 search channels x 38.7 GB/s (perChMaxTreeBws, Hopper N1) and 0.92 x the correction
    # factor (0.9 at 2^22 x 64 B) of the links per edge
    assert tree_correction("simple", S) == 0.9
    assert BUS * B / 2 < 12 * 38.7e9 and B / 2 < 0.92 * 0.9 * B
    assert _time(S, "tree", "simple") == pytest.approx(8.4e-6 + 14 * 4.0e-6 + 2 * S / B, rel=1e-9)
    # LL: NCCL's llMaxBws (141 GB/s bus) binds, below the links (B/2 per edge at 2 wire bytes
    # a byte) and the tree's LL factor (1/3.8 of the links' bus bandwidth, over LL's 0.5)
    assert tree_correction("ll", S) == 1.0 and 141e9 < 0.5 * B / 2 * BUS / 0.5
    assert _time(S, "tree", "ll") == pytest.approx(6.8e-6 + 14 * 0.6e-6 + S * BUS / 141e9, rel=1e-9)


def test_large_messages_keep_their_plateau():
    # 8 GiB on NVLS: the chunk round (16 MiB) is 0.2% of the bytes
    S = 8 * 2**30
    plain = 25e-6 + S * 9 / 8 / (450e9 * H100.nvls_efficiency)
    assert _time(S, "auto", "auto") == pytest.approx(plain, rel=3e-3)


def test_without_an_architecture_collectives_are_the_links_closed_forms():
    # a hand-written profile-less run (line rate, the default model): no channels, caps or chunks
    t = run_collective("allreduce", 4096, N, TOPO, CollectiveOptions(algo="ring", protocol="simple"))[1]["time_s"]
    alpha = TOPO.path_latency_s(0, 1)
    assert t == pytest.approx(8.4e-6 + 14 * (alpha + 4096 / N / 450e9), rel=1e-9)


def test_a_ring_across_nodes_pays_nccls_intra_and_inter_step_latencies():
    # an empty ring all-reduce on 2 DGX H100 nodes under Simple: 8.4 us base, then of its
    # 2(16-1) = 30 steps 2(2-1) = 2 cross the network at 14 us (hwLatencies[NET][RING]) and 28
    # stay on NVLink at 3.4 us (ncclTopoTuneModel's ring latency)
    topo = load_topology("dgx-h100", nodes=2)
    t = run_collective("allreduce", 0, 16, topo, CollectiveOptions(algo="ring", link_efficiency=EFF, protocol="simple", nccl=MODEL))[1]["time_s"]
    assert t == pytest.approx(8.4e-6 + 28 * 3.4e-6 + 2 * 14e-6, rel=1e-9)
    t = run_collective("allgather", 0, 16, topo, CollectiveOptions(algo="ring", link_efficiency=EFF, protocol="ll", nccl=MODEL))[1]["time_s"]
    assert t == pytest.approx(6.6e-6 + 14 * 0.6e-6 + 1 * 2.7e-6, rel=1e-9)


def test_the_sweep_prints_the_choices_draws_the_curve_and_stays_importable(tmp_path, capsys):
    from sim.calibrate.nccl_tests import parse_text
    from sim.cli import main

    assert main(["collective", "--gpus", "8", "--sweep", "8:16M", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    # the choice by size, as the tests above compute it: ring/LL to 1 MiB, NVLS from 2 MiB
    assert "#        8 B ..   1.00 MiB: ring/ll" in text and "#   2.00 MiB ..  16.00 MiB: nvls/simple" in text
    assert (tmp_path / "busbw.png").stat().st_size > 0
    rows = (tmp_path / "busbw.csv").read_text().splitlines()
    assert rows[0].split(",")[1] == "busbw_Bps NCCL's choice" and len(rows) == 1 + 22
    # the rows keep nccl-tests' columns: the importer reads them back, busbw as printed
    result = parse_text(text, "sweep", op="all_reduce", ranks=8)
    printed = {r["bytes"]: r for r in result.rows}
    for line in rows[1:]:
        size, auto = int(line.split(",")[0]), float(line.split(",")[1])
        assert printed[size]["busbw_Bps"] == pytest.approx(auto, abs=0.006e9)


def test_the_tuners_memo_answers_only_the_question_it_was_asked():
    # choose and alone_time are remembered with the topology (Topology.memo): asked again,
    # and asked with other efficiencies, another NCCL model or size, they answer as a fresh
    # topology does; a PXN level's copy is made once and keeps its own memo.
    from sim.engine.tuner import alone_time

    topo = load_topology("dgx-h100", nodes=2)
    slow_ib = {**EFF, "ib": 0.05}
    ll_only = MODEL.forcing(None, "ll")
    for eff, model in ((EFF, MODEL), (slow_ib, MODEL), (EFF, ll_only), (EFF, MODEL)):
        for size in (4096, 64 * 2**20):
            fresh = load_topology("dgx-h100", nodes=2)
            assert choose(TunerRequest("allreduce", range(16), size, topo, eff, model)) == \
                choose(TunerRequest("allreduce", range(16), size, fresh, eff, model))
            assert alone_time("allreduce", tuple(range(16)), size, topo, eff, model) == \
                alone_time("allreduce", tuple(range(16)), size, fresh, eff, model)
    assert alone_time("allreduce", tuple(range(16)), 64 * 2**20, topo, slow_ib, MODEL) > \
        alone_time("allreduce", tuple(range(16)), 64 * 2**20, topo, EFF, MODEL)
    other = 1 if topo.pxn_level != 1 else 0
    assert topo.with_pxn(other) is topo.with_pxn(other) and topo.with_pxn(other).memo is not topo.memo
    assert topo.with_pxn(other).with_pxn(topo.pxn_level) is topo



@pytest.mark.parametrize("protocol, S", [("simple", 2**17), ("ll", 2**14)])
def test_the_engines_rate_caps_from_its_link_ids_are_the_tuners_from_the_routes(protocol, S):
    # The engine hands rate_caps each step's route bottleneck from its network's link ids
    # (Collectives._capped); the tuner reads each route's links from the topology. A ring
    # all-reduce over 4 nodes at a size that keeps few channels, where the caps follow the
    # routes' bottlenecks (NVLink and IB steps, two caps): both give every step the same
    # cap, no more than its route's slowest link times that link kind's efficiency.
    from sim.engine.algorithms import build
    from sim.engine.collectives import Collectives
    from sim.engine.kernel import Environment
    from sim.engine.nccl import rate_caps
    from sim.engine.network import Network
    from sim.inputs.topology import default_channels
    from sim.program.actions import Action

    t = load_topology("dgx-h100", nodes=4)
    group = tuple(range(32))
    net = Network(Environment(0.0), t, EFF)
    coll = Collectives(net, (), True, [], {}, None, MODEL)
    steps = build("allreduce", group, S, t, "ring", fluid=True)
    args = coll._step_args(steps, protocol, "ring", 0.0)
    a = Action("ar", kind="collective", op="allreduce", group=group, nbytes=S, algo="ring", protocol=protocol)
    capped = coll._capped(args, steps, a, "ring", protocol)
    caps = rate_caps(steps, TunerRequest("allreduce", group, S, t, coll.efficiency(), MODEL, "ring", protocol),
                     default_channels(t, group))
    assert caps is not None and len(caps) == len(steps) and len(set(caps)) == 2
    assert all(len(r[0][0]) == len(b[0][0]) + 1 for r, b in zip(capped, args))  # (each capped: a link of its own)
    for (route, *_), cap, st in zip(capped, caps, steps):
        assert route[3] == cap
        slowest = min(t.link(u, v)["bandwidth_Bps"] * EFF.get(t.link(u, v)["kind"], 1.0)
                      for u, v in t.route(st.src, st.dst))
        assert cap < slowest
