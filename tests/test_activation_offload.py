"""Activation offload to host memory (Megatron-Core ``cpu_offloading``, Transformer Engine's
``AsyncDoubleBufferGroupOffloadHandler``) and the GPU-host link it crosses: NVLink-C2C on
Grace superchips (GB200/GB300), PCIe on x86 nodes."""

import pytest

from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.inputs.schema import SimulationSettings
from sim.inputs.topology_build import load_topology
from sim.program.activation_offload import window_map
from sim.results.memory_timeline import timeline
from sim.session import Job, simulate_training

# s = 512, b = 2, h = 4096, a = 32, 8 layers, GeLU MLP of 4h
MODEL = gpt("small", 8, 4096, 32, 2048, 512)
S, B, H, A = 512, 2, 4096, 32
# Korthikanti et al. 2022 (Reducing Activation Recomputation), Table 2 without the s x s
# terms (flash attention): 34 s b h bytes per layer, plus FlashAttention's fp32 softmax
# statistics (logsumexp), 4 bytes per head per token.
LAYER_BYTES = 34 * S * B * H + 4 * A * S * B


def test_window_map_is_transformer_engines():
    # TE cpu_offload.py: w(i) = (L // N)(i + 1) - 1, shifted by the remainder's groups.
    assert window_map(80, 40) == [2 * i + 1 for i in range(40)]          # Llama 3 70B, 40 layers offloaded
    w = window_map(126, 95)                                              # Llama 3.1 405B, 95 layers offloaded
    assert w[:31] == [2 * i + 1 for i in range(31)] and w[31:] == [i + 31 for i in range(31, 95)]
    for L, N in ((8, 4), (80, 20), (126, 92), (7, 3)):
        w = window_map(L, N)
        assert w[-1] == L - 1 and all(w[i] < w[i + 1] for i in range(N - 1)) and all(w[i] > i for i in range(N))


def test_grace_superchip_copies_cross_nvlink_c2c_shared_by_its_two_gpus():
    t = load_topology("gb200-nvl72")
    r0, r1, r2 = t.host_route(0), t.host_route(1), t.host_route(2)
    assert len(r0) == 2 and r0[1] == r1[1] and r0[1] != r2[1]  # GPUs 0 and 1 share superchip 0's C2C
    for u, v in r0:
        e = t.graph.edges[u, v]
        assert (e["kind"], e["bandwidth_Bps"]) == ("nvlink", 450e9)  # 900 GB/s bidirectional
    assert t.host_route(0, to_host=False) == tuple((b, a) for a, b in reversed(r0))
    x86 = load_topology("dgx-b200").host_route(3)
    assert len(x86) == 1 and load_topology("dgx-b200").graph.edges[x86[0]]["kind"] == "pcie"


def _run(topo: str, gpu: str, n):
    plan = ParallelPlan(dp=4, global_batch_size=8, micro_batch_size=2, zero_stage=3, cpu_offloading_num_layers=n)
    return simulate_training(Job(MODEL, plan, load_profile(gpu), load_topology(topo)),
                             SimulationSettings(fidelity="reduced"))


@pytest.mark.parametrize("topo,gpu,bw", [("gb200-nvl72", "gb200", 450e9), ("dgx-b200", "b200", 63e9)])
def test_offload_moves_each_offloaded_layers_activations_both_ways_at_the_links_rate(topo, gpu, bw):
    run = _run(topo, gpu, 4)
    copies = [s for s in run.trace.spans if s.kind == "copy" and s.rank == 0]
    assert sorted(s.name for s in copies) == sorted(
        [f"offload layer {k} of 0F0" for k in range(4)] + [f"reload layer {k} for 0B0" for k in range(4)])
    eff = load_profile(gpu).links["nvlink" if bw == 450e9 else "pcie"].efficiency
    expected = 0.5e-6 + LAYER_BYTES / (bw * eff)  # one link's latency (the C2C hub-to-Grace link has none)
    for s in copies:
        assert s.end_s - s.start_s == pytest.approx(expected, rel=1e-9)


def test_offload_frees_the_offloaded_layers_until_their_backward():
    runs = {n: _run("gb200-nvl72", "gb200", n) for n in (None, 4)}

    def activations_at_backward_start(run):
        t0 = next(s.start_s for s in run.trace.spans if s.rank == 0 and s.name == "0B0.0")
        times, series = timeline(run.trace, 0)
        i = max(k for k, t in enumerate(times) if t <= t0)
        return series["activations"][i]

    assert activations_at_backward_start(runs[None]) - activations_at_backward_start(runs[4]) == \
        pytest.approx(4 * LAYER_BYTES, rel=1e-12)


def test_c2c_hides_the_copies_that_pcie_exposes():
    # The layers' forward/backward compute is about 1 ms; a layer's copy takes about 0.4 ms on
    # C2C (hidden behind the two layers of its window) and 2.8 ms on PCIe (exposed).
    gb = {n: _run("gb200-nvl72", "gb200", n).trace.end_s for n in (None, 4)}
    x86 = {n: _run("dgx-b200", "b200", n).trace.end_s for n in (None, 4)}
    assert gb[4] == pytest.approx(gb[None], rel=1e-9)
    assert x86[4] > x86[None] * 1.2


@pytest.mark.parametrize("kw,match", [
    (dict(pp=2, dp=2), "needs pp 1"),
    (dict(recompute="full"), "recompute_granularity none"),
])
def test_offload_refuses_what_megatron_core_refuses(kw, match):
    with pytest.raises(InputError, match=match):
        ParallelPlan(**{"dp": 4, "global_batch_size": 8, "cpu_offloading_num_layers": 2, **kw}).check_model(MODEL)


def test_offload_needs_fewer_layers_than_the_model():
    with pytest.raises(InputError, match="cpu_offloading_num_layers.*less than num_layers 8"):
        ParallelPlan(dp=4, global_batch_size=8, cpu_offloading_num_layers=8).check_model(MODEL)


def test_bad_offload_input_is_one_line_and_exit_2(tmp_path, capsys):
    from sim.cli import main

    base = ["run", "--model", "llama3-8b", "--gpus", "8", "--global-batch-size", "8"]
    bad = tmp_path / "pcie-node.toml"
    bad.write_text("[node]\ngpus = 8\nnvlink_bandwidth_GBps = 450\nhost_bandwidth_GBps = 100\n")
    for argv, text in ((["--pp", "2", "--cpu-offloading-num-layers", "4"], "--cpu-offloading-num-layers: got 4; needs pp 1"),
                       (["--cpu-offloading-num-layers", "32"], "got 32; must be less than num_layers 32"),
                       (["--topology", str(bad)], 'node.host_bandwidth_GBps: got 100; only with host_link = "c2c"')):
        assert main(base + argv) == 2
        err = capsys.readouterr().err
        assert text in err and err.count("\n") == 1 and "Traceback" not in err


def test_the_superchips_two_gpus_share_its_c2c():
    # full fidelity: GPUs 0 and 1 (one superchip) copy the same bytes at the same moments, so
    # each gets half of the 450 GB/s
    plan = ParallelPlan(dp=4, global_batch_size=8, micro_batch_size=2, zero_stage=3, cpu_offloading_num_layers=4)
    run = simulate_training(Job(MODEL, plan, load_profile("gb200"), load_topology("gb200-nvl72")),
                            SimulationSettings(fidelity="full"))
    eff = load_profile("gb200").links["nvlink"].efficiency
    first = {s.rank: s for s in run.trace.spans if s.name == "offload layer 0 of 0F0"}
    assert first[0].start_s == pytest.approx(first[1].start_s, rel=1e-9)
    assert first[0].end_s - first[0].start_s == pytest.approx(0.5e-6 + 2 * LAYER_BYTES / (450e9 * eff), rel=1e-6)
