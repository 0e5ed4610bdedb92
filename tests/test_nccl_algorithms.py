"""NCCL algorithms (tree, NVLS, NVLS-tree), protocols and the tuner (issue 23)."""

import math

import pytest

from sim.cli import main
from sim.studies.collective import CollectiveOptions, run_collective
from sim.engine.nccl import NcclModel, TunerRequest
from sim.engine.tuner import choose
from sim.inputs.hardware import load_profile
from sim.inputs.topology_build import load_topology

H100 = load_profile("h100-sxm")
BASE_S = {("ring", "ll"): 6.6e-6, ("ring", "ll128"): 14.0e-6, ("ring", "simple"): 8.4e-6,
          ("tree", "ll"): 6.8e-6, ("tree", "ll128"): 14.0e-6, ("tree", "simple"): 8.4e-6}
"""NCCL's base latency of a collective: baseLatencies in NVIDIA/nccl src/graph/tuning.cc (µs:
Tree 6.8/14.0/8.4, Ring 6.6/14.0/8.4 for LL/LL128/Simple)."""
EFF, MODEL = H100.link_efficiencies(), NcclModel.from_profile(H100)


def _busbw(topo, algo, size, gpus=None, protocol="simple", eff=EFF, model=MODEL):
    _, s = run_collective("allreduce", size, gpus or topo.num_gpus, topo, CollectiveOptions(algo=algo, link_efficiency=eff, protocol=protocol, nccl=model))
    return s


def test_nvls_busbw_by_gpu_count_matches_nccl_1455():
    # REFERENCE.md (NVIDIA/nccl #1455): ~370 GB/s up to 4 GPUs, then ~420/440/460/480 at 5-8;
    # NCCL runs NVLS or ring, whichever is faster: the figure is the better of the two.
    topo = load_topology("dgx-h100")
    published = {2: 370, 3: 370, 4: 370, 5: 420, 6: 440, 7: 460, 8: 480}
    for n, want in published.items():
        best = max(_busbw(topo, a, 8 * 2**30, n)["busbw_Bps"] for a in ("ring", "nvls"))
        assert best / 1e9 == pytest.approx(want, rel=0.05), n


def test_nvls_is_the_switch_reduction_closed_form():
    # Line rate, no profile: each GPU sends S(n+1)/n to the switch and receives as much.
    topo = load_topology("dgx-h100")
    S, B, n = 2**30, 450e9, 8
    s = _busbw(topo, "nvls", S, eff=None, model=None)
    assert s["time_s"] == pytest.approx(25e-6 + S * (n + 1) / n / B, rel=1e-6)


def test_tree_uncontended_equals_latency_and_bandwidth_closed_form():
    topo = load_topology("dgx-h100", nodes=4)
    a_intra, a_inter = topo.path_latency_s(0, 1), topo.path_latency_s(0, 8)
    g, N = 8, 4
    lat = BASE_S["tree", "simple"] + 2 * ((g - 1) * a_intra + int(math.log2(N)) * a_inter)
    s0 = _busbw(topo, "tree", 0, eff=None, model=None)
    assert s0["time_s"] == pytest.approx(lat, rel=1e-9)


def test_protocols_change_alpha_and_beta_as_nccl_constants_say():
    topo = load_topology("dgx-h100")
    # the hops' latency, after each protocol's base latency
    small = {p: _busbw(topo, "ring", 8, protocol=p, eff=None, model=None)["time_s"] - BASE_S["ring", p]
             for p in ("ll", "ll128", "simple")}
    assert small["ll"] / small["simple"] == pytest.approx(0.6 / 3.4, rel=1e-3)
    assert small["ll128"] / small["simple"] == pytest.approx(1.9 / 3.4, rel=1e-3)
    S = 8 * 2**30
    big = {p: _busbw(topo, "ring", S, protocol=p, eff=None, model=None)["time_s"] for p in ("ll", "simple")}
    assert big["ll"] / big["simple"] == pytest.approx(2.0, rel=1e-3)


def test_auto_picks_nccl_like_choices():
    one = load_topology("dgx-h100")
    assert choose(TunerRequest("allreduce", range(8), 8, one, EFF, MODEL))[1] == "ll"
    assert choose(TunerRequest("allreduce", range(8), 8 * 2**30, one, EFF, MODEL)) == ("nvls", "simple")
    a100 = load_topology("dgx-a100")
    assert choose(TunerRequest("allreduce", range(8), 8 * 2**30, a100))[0] != "nvls"
    assert choose(TunerRequest("allgather", range(8), 2**30, one, EFF, MODEL))[0] in ("ring", "nvls")


def test_ring_plateau_on_h100_is_370():
    topo = load_topology("dgx-h100")
    assert _busbw(topo, "ring", 8 * 2**30)["busbw_Bps"] / 1e9 == pytest.approx(370, rel=0.05)


def test_nvls_on_a100_is_a_one_line_error(capsys):
    assert main(["collective", "--topology", "dgx-a100", "--algo", "nvls"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "nvlink_sharp" in err and "allowed" in err


def test_sweep_prints_nccl_tests_columns(capsys):
    assert main(["collective", "--sweep", "8:64", "--algo", "ring"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if l and not l.startswith("#")]
    assert [int(l.split()[0]) for l in lines] == [8, 16, 32, 64]
    assert all(len(l.split()) == 13 for l in lines)
