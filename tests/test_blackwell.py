"""Blackwell GPUs (b200, gb200), the DGX B200 node and GB200 NVL72 racks (issue 41, items 1-3).

Profile figures are checked against the datasheet numbers their sources quote; collectives
inside a 72-GPU NVLink domain against the closed forms; placement against the rack a rank's
GPU sits in."""

import dataclasses
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from sim.cli import main
from sim.engine.core import simulate
from sim.engine.nccl import NcclModel, TunerRequest
from sim.engine.tuner import choose
from sim.errors import InputError
from sim.inputs.experts import Folding
from sim.inputs.hardware import PRESETS, load_profile
from sim.inputs.pinning import crossing
from sim.inputs.plan import ParallelPlan
from sim.inputs.resolve import NODE_OF_GPU
from sim.inputs.topology_build import load_topology
from sim.program.actions import Action, Program
from sim.studies.collective import CollectiveOptions, run_collective
from sim.studies.search import SearchSpace, enumerate_plans
from sim.inputs.model import preset

B200, GB200 = load_profile("b200"), load_profile("gb200")
ROOT = Path(__file__).resolve().parent.parent
RING_BASE_S = 8.4e-6
"""NCCL's base latency of a ring collective under Simple: baseLatencies[Ring][Simple] = 8.4 µs
(NVIDIA/nccl src/graph/tuning.cc)."""


# ------------------------------------------------------------------ profiles
def test_b200_profile_holds_the_hgx_b200_datasheet_figures():
    # NVIDIA's Blackwell table, HGX B200 column, per GPU, with sparsity: FP4 18, FP8 9,
    # BF16 4.5 PFLOPS; dense is half. 180 GB HBM3E at 7.7 TB/s, TDP up to 1,000 W.
    assert B200.peak("bf16") == B200.peak("fp16") == 4.5e15 / 2
    assert (B200.peak("fp8"), B200.peak("fp4")) == (9e15 / 2, 18e15 / 2)
    assert B200.hbm_bandwidth_Bps == 7.7e12 and B200.hbm_capacity_bytes >= 180e9
    assert (B200.sm_count, B200.power_limit_w) == (148, 1000)
    # NVLink 5: 1.8 TB/s both directions = 900 GB/s per direction; ConnectX-7 400 Gb/s
    assert B200.link("nvlink").bandwidth_Bps == 1.8e12 / 2 and B200.link("ib").bandwidth_Bps == 400e9 / 8


def test_gb200_profile_holds_the_gb200_nvl72_datasheet_figures():
    # GB200 NVL72 column, per GPU, with sparsity: FP4 20, FP8 10, BF16 5 PFLOPS; 186 GB at
    # 8 TB/s; TDP configurable up to 1,200 W. The rack: 72 x 5 PF = 360 PF BF16 sparse.
    assert (GB200.peak("bf16"), GB200.peak("fp8"), GB200.peak("fp4")) == (5e15 / 2, 10e15 / 2, 20e15 / 2)
    assert 72 * GB200.peak("bf16") * 2 == pytest.approx(360e15)
    assert GB200.hbm_bandwidth_Bps == 8e12 and GB200.hbm_capacity_bytes >= 186e9
    assert GB200.power_limit_w == 1200 and GB200.link("nvlink").bandwidth_Bps == 900e9


def test_gemm_caps_are_the_measured_best_kernels():
    # Maximum Achievable Matmul FLOPS (stas00/ml-engineering): B200 BF16 1,745.0 and FP8
    # 3,432.5 TFLOP/s; GB200 1,822.0 and 3,615.6.
    assert B200.gemm_max_efficiency == pytest.approx(1745.0 / 2250, abs=5e-4)
    assert GB200.gemm_max_efficiency == pytest.approx(1822.0 / 2500, abs=5e-4)
    # The FP8 cap and the sustained fraction of each Blackwell preset are its own fit (the report of
    # record): GB200 and GB300 to their Megatron-Bridge rows (with the MoE block's memory-bound kernels'
    # own rate, moe_memory_relative_efficiency, fitted beside), B200 to its NeMo 25.02 and
    # Megatron-Bridge rows with the GB200's rate (the same die); the B200 and GB200 caps stay at or
    # below the best FP8 kernel measured alone (the profile's ceiling, that measurement to three digits).
    assert B200.moe_memory_relative_efficiency == GB200.moe_memory_relative_efficiency
    for p, name in ((B200, "b200-fit-report-2026-12-07-mla-fp8.json"),
                    (GB200, "gb200-fit-report-2026-12-07-mla-fp8.json"),
                    (load_profile("gb300"), "gb300-fit-report-2026-12-07-mla-fp8.json")):
        report = json.loads((ROOT / "experiments/fit-cache" / name).read_text())
        assert report["gpu"] == p.name
        fitted = {q["name"]: q["fitted"] for q in report["parameters"]}
        assert p.fp8_gemm_max_efficiency == pytest.approx(fitted["fp8_gemm_max_efficiency"], abs=1e-6)
        assert p.sustained_compute_fraction == pytest.approx(fitted["sustained_compute_fraction"], abs=1e-5)
        if "moe_memory_relative_efficiency" in fitted:
            assert p.moe_memory_relative_efficiency == pytest.approx(fitted["moe_memory_relative_efficiency"], abs=1e-6)
        assert report["data_sha256"] in p.sources["sustained_compute_fraction"]
    for p, mamf in ((B200, 3432.5 / 4500), (GB200, 3615.6 / 5000)):
        ceiling = p.efficiency_ceilings["fp8_gemm_max_efficiency"]
        assert ceiling == pytest.approx(mamf, abs=5e-4) and p.fp8_gemm_max_efficiency <= ceiling
    # a large square GEMM reaches the cap times the sustained fraction, no more
    for p in (B200, GB200):
        assert p.gemm_efficiency(8192, 8192, 8192) <= p.gemm_max_efficiency * p.sustained_compute_fraction


@pytest.mark.parametrize("gpu, times", [
    # cuDNN 9.13.0's SDPA on one GPU, batch 1, 128 query and 8 key/value heads, head dim 128, causal, BF16
    # (NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_<GPU>.csv
    # @ bb37575d): tokens -> (forward, backward) ms of one call between CUDA events
    ("b200", {4096: (0.642, 1.960), 8192: (1.877, 5.833), 16384: (6.602, 20.460)}),
    ("gb300", {4096: (0.480, 1.540), 8192: (1.470, 4.865), 16384: (5.167, 17.345)}),
])
def test_attention_is_cudnns_kernel_plus_a_constant_call_time(gpu, times):
    # Each measured call is its kernel plus the call's host time before the kernel starts, the same at every
    # length: the kernel the profile prices (at a benchmark's full clock) leaves that constant, 0.1-0.2 ms
    # forward and 0.3-0.5 ms backward (PyTorch's SDPA dispatch; autograd's for the backward), at every length.
    p = dataclasses.replace(load_profile(gpu), sustained_compute_fraction=1.0)
    rest = {"F": [], "B": []}
    for s, (fwd_ms, bwd_ms) in times.items():
        count = 4.0 * s * s * 128 * 128  # trainsim's forward count; the backward twice it
        kf = count / (p.peak("bf16") * p.attention_efficiency(s, s, 128, 128, mma_flops_per_score=4 * 128))
        kb = 2 * count / (p.peak("bf16") * p.attention_efficiency(s, s, 128, 128, backward=True))
        rest["F"].append(fwd_ms - kf * 1e3)
        rest["B"].append(bwd_ms - kb * 1e3)
    assert all(0.1 <= r <= 0.2 for r in rest["F"]), rest
    assert all(0.3 <= r <= 0.5 for r in rest["B"]), rest
    # the GB200 takes the B200's kernel: the same SM and cuDNN release
    gb200 = load_profile("gb200")
    if gpu == "b200":
        assert (gb200.attention_max_efficiency, gb200.attention_k_overhead,
                gb200.attention_backward_relative_efficiency) == (p.attention_max_efficiency, p.attention_k_overhead,
                                                                  p.attention_backward_relative_efficiency)


def test_a_blackwell_gemm_is_its_tiles_work_plus_a_fixed_kernel_time():
    # XLA's cuBLAS kernel throughputs for the B200 (openxla/xla xla/service/gpu/model/
    # default_matmul_perf_table.txtpb @ 336bb15c, entry sm_100_B200, BF16, b = 1), TFLOP/s by (m, n, k)
    points = {(2048, 2048, 256): 276.097, (4096, 4096, 256): 514.706, (4096, 2048, 512): 652.334,
              (4096, 1024, 1024): 715.649, (2048, 4096, 2048): 1172.847, (2048, 2048, 4096): 1208.488,
              (4096, 4096, 4096): 1416.867}
    p = dataclasses.replace(B200, sustained_compute_fraction=1.0)
    work = {s: 2.0 * s[0] * s[1] * s[2] / (p.peak("bf16") * p.gemm_efficiency(*s)) for s in points}
    measured = {s: 2.0 * s[0] * s[1] * s[2] / (v * 1e12) for s, v in points.items()}

    def worst(fixed_s):
        # the table's own clock: one scale of the priced work, least squares on the relative error (closed form)
        a = (sum(work[s] / measured[s] * (1 - fixed_s / measured[s]) for s in points)
             / sum((work[s] / measured[s]) ** 2 for s in points))
        return max(abs((a * work[s] + fixed_s) / measured[s] - 1) for s in points)

    # the profile's k0 and tiles with its GEMM kernel's fixed time give every shape within 3%, from 8 us to 97 us;
    # with only the 3 us every kernel pays, the small shapes are 10% or more off
    assert B200.gemm_fixed_s == pytest.approx(4.82e-6) and GB200.gemm_fixed_s == B200.gemm_fixed_s
    assert worst(B200.gemm_fixed_s) < 0.03
    assert worst(B200.kernel_launch_s) > 0.10


def test_explain_charges_a_blackwell_gemm_its_own_fixed_time():
    # each kernel's row is its roofline plus its fixed time: a GEMM's own on Blackwell, any other kernel's launch cost
    from sim.inputs.model import preset
    from sim.results.explain import explain, render

    rep = explain(preset("llama3-8b"), ParallelPlan(micro_batch_size=1, global_batch_size=8), GB200, gpus_per_node=8)
    rows = rep["parts"]["layer"]["rows"]
    gemm = next(r for r in rows if r["kind"] == "gemm" and r["bound"] == "compute")
    norm = next(r for r in rows if r["kind"] == "memory")
    assert gemm["time_s"] - gemm["flops"] / (GB200.peak("bf16") * gemm["efficiency"]) == pytest.approx(4.82e-6)
    assert norm["time_s"] - norm["bytes"] / (GB200.hbm_bandwidth_Bps * norm["efficiency"]) == pytest.approx(3e-6)
    assert "3.00 us launch cost; a GEMM, 4.82 us instead" in render(rep)


def test_nvls_efficiency_reproduces_the_8_gpu_measurements():
    # busbw = 2(n-1)/(n+1) * 900 GB/s * eff at n = 8: 830 GB/s on 8 B200 (NVIDIA/nccl#1807),
    # 811 GB/s on 8 GB200 over two trays (multi-node NVLink)
    for p, measured in ((B200, 830e9), (GB200, 811e9)):
        assert 2 * 7 / 9 * 900e9 * p.nvls_efficiency == pytest.approx(measured, rel=1e-3)


@pytest.mark.parametrize("name,tdp", [("a100-80gb", 400), ("h100-sxm", 700), ("h200", 700), ("b200", 1000),
                                      ("gb200", 1200)])
def test_every_preset_has_its_datasheet_power_limit_and_an_idle_power_below_it(name, tdp):
    p = load_profile(name)
    assert p.power_limit_w == tdp and 0 <= p.idle_power_w < p.power_limit_w
    assert {"power_limit_w", "idle_power_w"} <= set(p.sources)


def test_every_blackwell_figure_names_its_source():
    for p in (B200, GB200):
        given = {k for k, v in p.to_dict().items() if v is not None and k not in ("name", "sources")}
        named = {k.split(".")[0] for k in p.sources}
        assert given - {"nccl_protocols"} <= named | {"links"}, given - named
        assert {f"links.{k}" for k in p.links} <= set(p.sources)


def test_power_fields_are_optional_and_checked():
    h100 = load_profile("h100-sxm")
    bare = replace(h100, power_limit_w=None, idle_power_w=None)
    assert "power_limit_w" not in bare.to_dict() and "idle_power_w" not in bare.to_dict()
    with pytest.raises(InputError, match="idle_power_w"):
        replace(h100, idle_power_w=800)
    with pytest.raises(InputError, match="power_limit_w"):
        replace(h100, power_limit_w=-1)


def test_presets_and_default_nodes():
    assert {"b200", "gb200"} <= set(PRESETS)
    assert (NODE_OF_GPU["b200"], NODE_OF_GPU["gb200"]) == ("dgx-b200", "gb200-nvl72")


# ------------------------------------------------------------------ topologies
def test_dgx_b200_is_eight_gpus_on_nvlink_5_with_eight_rail_nics():
    t = load_topology("dgx-b200", nodes=2)
    g = t.graph
    assert (t.num_gpus, t.gpus_per_node) == (16, 8)
    for r in range(16):
        gpu = t.gpu(r)
        links = {g.nodes[v]["kind"]: d for v, d in g[gpu].items() if g.nodes[v]["kind"] in ("nvswitch", "nic")}
        assert links["nvswitch"]["bandwidth_Bps"] == 900e9
    nics = [n for n, d in g.nodes(data=True) if d["kind"] == "nic"]
    assert len(nics) == 16 and all(g.nodes[f"node0/nvswitch"]["nvlink_sharp"] for _ in nics[:1])
    assert {d["bandwidth_Bps"] for u, v, d in g.edges(data=True) if d["kind"] == "ib"
            and "nic" in (u + v)} == {50e9}


@pytest.mark.parametrize("gpus", [1, 72, 73, 100, 144, 576])
def test_gb200_nvl72_builds_ceil_n_over_72_racks_of_one_nvlink_domain(gpus):
    t = load_topology("gb200-nvl72", min_gpus=gpus)
    racks = math.ceil(gpus / 72)
    assert (t.num_nodes, t.num_gpus, t.gpus_per_node) == (racks, 72 * racks, 72)
    g = t.graph
    for rack in range(racks):
        sw = f"node{rack}/nvswitch"
        assert g.nodes[sw]["nvlink_sharp"]  # NVLS-capable switch trays
        members = [r for r in range(t.num_gpus) if t.node_of(r) == rack]
        assert members == list(range(72 * rack, 72 * (rack + 1)))
        # every GPU on the rack's switching layer at 900 GB/s per direction
        assert all(g.edges[t.gpu(r), sw]["bandwidth_Bps"] == 900e9 for r in members)
        # one NIC per GPU
        assert sum(1 for n, d in g.nodes(data=True) if d["kind"] == "nic" and d["node"] == rack) == 72


def test_nvl36x2_is_one_72_gpu_domain_too():
    t = load_topology("gb200-nvl36x2", min_gpus=144)
    assert (t.num_nodes, t.gpus_per_node) == (2, 72)


def test_part_of_each_domain_and_too_many_gpus_per_node():
    t = load_topology("gb200-nvl72", min_gpus=128, gpus_per_node=64)
    assert (t.num_nodes, t.gpus_per_node, t.num_gpus) == (2, 64, 128)
    with pytest.raises(InputError, match="gpus-per-node: got 80; node gb200-nvl72 has 72 GPUs"):
        load_topology("gb200-nvl72", gpus_per_node=80, flag="--topology")


# ------------------------------------------------------------------ collectives
def _ring(n, nbytes, topo):
    prog = Program({r: [Action("allreduce", kind="collective", op="allreduce", group=tuple(range(n)),
                               nbytes=nbytes, algo="ring")] for r in range(n)})
    return simulate(prog, topo).end_s


@pytest.mark.parametrize("n", [8, 72])
def test_ring_allreduce_inside_one_nvl72_domain_matches_closed_form(n):
    # NCCL's base latency + 2(n-1)(alpha + S/(nB)), B = 900 GB/s NVLink 5 (line rate)
    t = load_topology("gb200-nvl72")
    S = 2**30
    alpha, B = t.path_latency_s(0, 1), t.bottleneck_Bps(0, 1)
    assert B == 900e9 and alpha == pytest.approx(2e-6)
    assert _ring(n, S, t) == pytest.approx(RING_BASE_S + 2 * (n - 1) * (alpha + S / (n * B)), rel=1e-9)


def test_nvls_inside_the_rack_is_the_switch_reduction_closed_form():
    # line rate, no profile: each of the 72 GPUs sends and receives S(n+1)/n through the switch
    t = load_topology("gb200-nvl72")
    S, n = 2**30, 72
    _, s = run_collective("allreduce", S, n, t, CollectiveOptions(algo="nvls", protocol="simple"))
    assert s["time_s"] == pytest.approx(25e-6 + S * (n + 1) / n / 900e9, rel=1e-6)


def test_tuner_runs_nvls_in_a_rack_and_nvls_tree_across_racks():
    eff, model = GB200.link_efficiencies(), NcclModel.from_profile(GB200)
    one, two = load_topology("gb200-nvl72"), load_topology("gb200-nvl72", min_gpus=144)
    S = 8 * 2**30
    assert choose(TunerRequest("allreduce", range(72), S, one, eff, model)) == ("nvls", "simple")
    assert choose(TunerRequest("allreduce", range(144), S, two, eff, model))[0] == "nvls_tree"
    # a small all-reduce on 72 GPUs: a ring's 2 x 71 hops cost more than NVLS's 25 us
    assert choose(TunerRequest("allreduce", range(72), 8, one, eff, model)) == ("nvls", "simple")
    # on 8 GPUs of a DGX B200 the ring's LL protocol wins at small sizes, as on an H100 node
    dgx = load_topology("dgx-b200")
    assert choose(TunerRequest("allreduce", range(8), 8, dgx, B200.link_efficiencies(),
                               NcclModel.from_profile(B200)))[1] == "ll"


def test_a_group_across_racks_is_ib_limited():
    # one GPU in each of two racks: one NIC each way, 50 GB/s at 95% (ConnectX-7)
    t = load_topology("gb200-nvl72", min_gpus=144)
    eff, model = GB200.link_efficiencies(), NcclModel.from_profile(GB200)
    inside = run_collective("allreduce", 2**30, 2, t, CollectiveOptions(algo="ring", link_efficiency=eff, protocol="simple", nccl=model))[1]
    across = t.bottleneck_Bps(0, 72) * eff["ib"]
    assert t.bottleneck_Bps(0, 72) == 50e9
    prog = Program({r: [Action("x", kind="collective", op="allreduce", group=(0, 72), nbytes=2**30, algo="ring")]
                    for r in (0, 72)})
    t_across = simulate(prog, t, link_efficiency=eff).end_s
    alpha = t.path_latency_s(0, 72)
    assert t_across == pytest.approx(RING_BASE_S + 2 * (alpha + 2**30 / (2 * across)), rel=1e-6)
    assert t_across > inside["time_s"]


@pytest.mark.parametrize("gpus", [72, 144])
def test_collective_command_sweeps_a_rack(capsys, gpus):
    assert main(["collective", "--topology", "gb200-nvl72", "--gpus", str(gpus), "--sweep", "64M:8G"]) == 0
    rows = [l.split() for l in capsys.readouterr().out.splitlines() if l.strip() and not l.startswith("#")]
    busbw = [float(r[7]) for r in rows]
    assert len(rows) == 8 and busbw == sorted(busbw)  # grows with size
    # large sizes: near NVLink 5's NVLS bus bandwidth 2(n-1)/(n+1) * 900 * eff (GB/s)
    n = 72
    assert busbw[-1] == pytest.approx(2 * (n - 1) / (n + 1) * 900 * GB200.nvls_efficiency, rel=0.03)


def test_collective_json_on_gb200_reports_busbw(capsys):
    assert main(["collective", "--topology", "gb200-nvl72", "--gpus", "72", "--size", "1GiB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["algo"] == "nvls" and out["busbw_Bps"] > 900e9 * GB200.link("nvlink").efficiency


# ------------------------------------------------------------------ placement and search
def test_tp16_and_ep64_groups_stay_inside_one_rack_when_they_fit():
    t = load_topology("gb200-nvl72", min_gpus=144)
    plan = ParallelPlan(dp=9, tp=16, pp=1)  # 144 GPUs: 16 does not divide 72
    crossing = [g for g in (plan.tp_group(r) for r in range(144)) if len({t.node_of(x) for x in g}) > 1]
    assert crossing  # so on all 72 GPUs of each rack a group of 16 straddles racks ...
    used = load_topology("gb200-nvl72", min_gpus=128, gpus_per_node=64)  # ... and on 64 of each it never does
    plan = ParallelPlan(dp=8, tp=16, pp=1)
    assert all(len({used.node_of(x) for x in plan.tp_group(r)}) == 1 for r in range(128))
    assert plan.max_nodes_spanned("tp", used.gpus_per_node) == 1
    moe = ParallelPlan(dp=128, tp=1, pp=1, ep=64)
    ep = Folding(moe)
    assert all(len({used.node_of(x) for x in ep.ep_group(r)}) == 1 for r in range(128))
    assert all(len(ep.ep_group(r)) == 64 for r in range(128))
    assert moe.max_nodes_spanned("dp", used.gpus_per_node) == 2  # data parallelism crosses racks


def test_search_enumerates_tp_up_to_the_nvlink_domain():
    model = preset("llama3-405b")  # 128 heads, 8 KV heads: tp up to 8
    wide = replace(model, num_key_value_heads=None)
    # every tp x pp layout of the 144 GPUs; one micro-batch size, ZeRO stage and recompute (the
    # dimensions that do not touch tp: the whole space is ~28,000 plans, 5 s to enumerate)
    space = SearchSpace(micro_batch_size=(1,), zero_stage=(1,), recompute=("none",))
    on_dgx = {p.tp for p in enumerate_plans(wide, 144, 144, space, gpus_per_node=8)}
    on_rack = {p.tp for p in enumerate_plans(wide, 144, 144, space, gpus_per_node=72)}
    assert max(on_dgx) == 8 and max(on_rack) == 16 and {16} <= on_rack - on_dgx


# ------------------------------------------------------------------ runs and bad input
def _run_json(capsys, argv):
    assert main(["run", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


TINY = ["--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16", "--vocab-size", "8192",
        "--seq-length", "1024", "--global-batch-size", "16"]


def test_gb200_defaults_to_its_rack_and_b200_to_its_dgx(capsys):
    # tensor-parallel all-reduces of 64 MiB (4096 tokens x hidden 8192 x 2 bytes): bandwidth-bound
    wide = ["--num-layers", "2", "--hidden-size", "8192", "--num-attention-heads", "64", "--vocab-size", "8192",
            "--seq-length", "4096", "--global-batch-size", "1", "--tensor-model-parallel-size", "16"]
    gb = _run_json(capsys, [*wide, "--gpu", "gb200", "--gpus", "16"])
    b = _run_json(capsys, [*wide, "--gpu", "b200", "--gpus", "16"])
    assert gb["topology"].startswith("gb200-nvl72") and b["topology"].startswith("dgx-b200")
    # tp 16 is one NVLink domain on the rack, two DGX B200 nodes on InfiniBand otherwise
    assert gb["iteration_time_s"] < b["iteration_time_s"]


@pytest.mark.parametrize("argv,words", [
    (["--gpu", "gb200", "--gpus", "128", "--gpus-per-node", "80"], ["--gpus-per-node", "80", "72"]),
    (["--gpu", "gb200", "--topology", "gb200-nvl72", "--gpus", "300", "--nodes", "2"], ["--gpus", "300"]),
    # each Grace serves two GPUs: not the node-shared host the offload model times
    (["--gpu", "gb200", "--gpus", "8", "--zero", "2", "--offload-optimizer"], ["gb200", "host_memory_bandwidth_Bps"]),
])
def test_bad_blackwell_input_is_one_line(capsys, argv, words):
    assert main(["run", *TINY, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(w in err for w in words), err


# ------------------------------------------------------------------ pinned groups
def test_crossing_finds_the_group_that_straddles_two_domains():
    # tp 16 on racks of 72: groups 0-15, ..., 48-63 fit; 64-79 holds ranks 64-71 of rack 0
    # and 72-79 of rack 1
    assert crossing(ParallelPlan(dp=9, tp=16, pp=1), ("tp",), 72) == ("tp", tuple(range(64, 80)))
    assert crossing(ParallelPlan(dp=8, tp=16, pp=1), ("tp",), 64) is None
    # cp 8 under tp 2 (cp next to tp, Megatron's order): a cp group strides by 2 over 16 ranks
    cp = ParallelPlan(dp=1, tp=2, pp=1, cp=8, placement="tp-dp-pp")
    assert crossing(cp, ("cp",), 8) == ("cp", tuple(range(0, 16, 2)))
    assert crossing(cp, ("tp",), 8) is None  # tp pairs stay inside a node
    # ep 16 (etp 1) on 144 GPUs of 72: the expert groups are 16 consecutive ranks, as tp's were
    assert crossing(ParallelPlan(dp=144, tp=1, pp=1, ep=16), ("ep",), 72)[1] == tuple(range(64, 80))
    assert crossing(ParallelPlan(dp=144, tp=1, pp=1, ep=8), ("tp", "ep"), 72) is None


@pytest.mark.parametrize("argv,words", [
    (["--tensor-model-parallel-size", "16"], ["got tp", "tp 16", "ranks 64-79", "domains 0 and 1", "72 GPUs each"]),
    (["--num-experts", "64", "--expert-model-parallel-size", "16"], ["got ep", "ep 16", "ranks 64-79"]),
])
def test_a_pinned_group_that_crosses_racks_is_refused_in_one_line(capsys, argv, words):
    def on(gpus, *extra):
        return ["run", *TINY[:-1], str(gpus), "--gpu", "gb200", "--gpus", str(gpus), *argv, *extra]

    assert main(on(144, "--pin-to-nvlink-domain", words[0].split()[1])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("trainsim: error: --pin-to-nvlink-domain") \
        and all(w in err for w in words), err
    # not pinned, the same plan runs (its straddling group goes over InfiniBand); on 64 GPUs
    # a rack every group of 16 stays inside one
    assert main(on(144, "--json")) == 0
    capsys.readouterr()
    assert main(on(128, "--gpus-per-node", "64", "--pin-to-nvlink-domain", "tp,ep", "--json")) == 0


def test_search_leaves_out_plans_whose_pinned_groups_cross_domains(capsys):
    # Which plans cross a rack is their groups' layout on the 144 GPUs, whatever the batch: a global
    # batch of 36 (2 and 4 micro-batches a replica at tp 8 and 16) keeps both plans valid and
    # simulates each once, where 144 (8 and 16) also screened them (6 simulations, not 2; issue 55)
    argv = ["search", *TINY[:-1], "36", "--gpu", "gb200", "--gpus", "144", "--tp", "8,16", "--pp", "1",
            "--micro-batch-size", "1", "--zero", "1", "--recompute", "none", "--sequence-parallel", "off",
            "--workers", "1", "--json"]
    assert main(argv) == 0
    free = json.loads(capsys.readouterr().out)
    assert main([*argv, "--pin-to-nvlink-domain", "tp"]) == 0
    pinned = json.loads(capsys.readouterr().out)
    assert (free["plans"], free["crossing_domains"]) == (2, 0)
    assert (pinned["plans"], pinned["crossing_domains"]) == (1, 1)
    assert pinned["best"]["plan"]["tp"] == 8
