"""Stragglers and degraded links (issue 24 item 1): slow GPUs and slow links in an
iteration, checked against the closed forms of a data-parallel ring, seeded draws and
the one-line errors of bad names and factors."""

import dataclasses
import json

import pytest

from sim.cli import main
from sim.engine.core import simulate
from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.inputs.schema_sim import SimulationSettings
from sim.inputs.stragglers import (Stragglers, degrade, draw_slow_gpus, links_named, parse_slowdown,
                                   resolve_stragglers)
from sim.inputs.topology_build import load_topology
from sim.program.actions import Action, Program
from sim.program.costs import ring_time
from sim.results.stragglers import plotted_stragglers, waits
from sim.session import Job, simulate_training

A100 = load_profile("a100-80gb")
QUIET = dataclasses.replace(A100, overlap_compute_slowdown=0.0)  # compute never slowed by NCCL kernels
SMALL = gpt("small", 4, 1024, 16, 1024, 512)
RING_FULL, RING_AUTO = (SimulationSettings(fidelity=f, nccl_algo="ring", nccl_protocol="simple")
                        for f in ("full", "auto"))
TINY = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--vocab-size", "1024",
        "--seq-length", "256", "--gpus", "4", "--global-batch-size", "4"]


def _pair(plan, profile=A100, slow=None, links=None):
    job = Job(SMALL, plan, profile, load_topology("dgx-a100"))
    return (simulate_training(job, RING_FULL),
            simulate_training(dataclasses.replace(job, stragglers=Stragglers(slow or {}, links or {})), RING_AUTO))


def _gpu_compute(trace, rank):
    return sum(s.duration_s for s in trace.spans_of(rank) if s.kind == "compute" and s.stream != "cpu")


def test_one_slow_gpu_without_overlap_slows_the_step_by_its_extra_compute():
    # dp 4, gradients all-reduced after backward: T = C_fb + AR + C_opt on every rank, and a
    # GPU f times slower ends last at f*C_fb + AR + f*C_opt: the step grows by (f-1)*C.
    f = 1.3
    ideal, slow = _pair(ParallelPlan(dp=4, global_batch_size=8, dp_overlap=False), slow={3: f})
    C = _gpu_compute(ideal.trace, 3)
    assert slow.trace.end_s - ideal.trace.end_s == pytest.approx((f - 1) * C, rel=1e-9)
    assert slow.fidelity == "full" and "every GPU" in slow.fidelity_reason
    # The three others each wait (f-1)*C_fb at the first bucket, all of it for rank 3.
    first = min(s.start_s for s in ideal.trace.spans_of(3, "dp"))
    C_fb = sum(s.duration_s for s in ideal.trace.spans_of(3, "compute") if s.end_s <= first)
    waited, waited_on, by = waits(slow.trace, slow.program)
    assert set(waited_on) == {3} and waited_on[3] == pytest.approx(3 * (f - 1) * C_fb, rel=1e-9)
    assert by[3] == pytest.approx({r: (f - 1) * C_fb for r in (0, 1, 2)}, rel=1e-9)
    assert waited.get(3, 0.0) == 0.0


def test_one_slow_gpu_with_overlap_delays_each_bucket_by_the_max_plus_closed_form():
    # Buckets overlap backward. Rank 3's compute runs back to back from t = 0, so f times
    # slower it makes bucket k's gradients ready at f * ready_k; each all-reduce starts when
    # they are and the one before it is done: e_k = max(f * ready_k, e_(k-1)) + d_k, with d_k
    # its ideal duration (nothing contends); the optimizer starts after the last one and
    # after its own dependencies, and takes f times as long.
    f = 1.25
    ideal, slow = _pair(ParallelPlan(dp=4, global_batch_size=8), profile=QUIET, slow={3: f})
    end = {s.name: s.end_s for s in ideal.trace.spans_of(3)}
    acts = {a.name: a for a in ideal.program.actions[3]}
    e = 0.0
    buckets = ideal.trace.spans_of(3, "dp")
    assert len(buckets) >= 2
    for b in buckets:
        ready = f * max(end[d] for d in acts[b.name].deps)
        e = max(ready, e) + (b.end_s - b.busy_start_s)
    opt = next(s for s in ideal.trace.spans_of(3, "compute") if s.name == "optimizer")
    opt_ready = max([e] + [f * end[d] for d in acts["optimizer"].deps if d not in {b.name for b in buckets}])
    assert slow.trace.end_s == pytest.approx(opt_ready + f * opt.duration_s, rel=1e-9)
    assert slow.trace.end_s > ideal.trace.end_s


def test_a_slow_gpu_keeps_its_tensor_parallel_peer_waiting_for_its_extra_compute():
    # tp 2: the peers meet at every tensor-parallel collective (priced outside the network,
    # started on both at once), so the step grows by (f-1) x rank 1's compute, and rank 0
    # waits (f-1) x the compute rank 1 does before their last meeting, all of it on rank 1.
    f = 1.2
    ideal, slow = _pair(ParallelPlan(tp=2, global_batch_size=2), profile=QUIET, slow={1: f})
    spans = ideal.trace.spans_of(1)
    assert {s.kind for s in spans} >= {"comm"}
    assert slow.trace.end_s - ideal.trace.end_s == pytest.approx((f - 1) * _gpu_compute(ideal.trace, 1), rel=1e-9)
    last = max(s.start_s for s in spans if s.kind in ("comm", "collective"))
    before = sum(s.duration_s for s in spans if s.kind == "compute" and s.end_s <= last)
    waited, waited_on, by = waits(slow.trace, slow.program)
    assert waited == pytest.approx({0: (f - 1) * before}, rel=1e-9)
    assert waited_on == pytest.approx({1: (f - 1) * before}, rel=1e-9) and set(by) == {1}


def test_a_degraded_link_on_a_ring_takes_the_closed_form_of_its_slowest_hop(make_star):
    # Ring all-reduce of S bytes over 4 GPUs on one switch, GPU 2's link at half its
    # bandwidth: NCCL's base latency (ring, Simple: 8.4 us, baseLatencies in NVIDIA/nccl
    # src/graph/tuning.cc) + 2(n-1)(alpha + S/(n*B/2)), alpha the 2-link route's latency.
    B, lat, S, n = 100e9, 1e-6, 64 * 2**20, 4
    topo = make_star([B] * n, latency_s=lat)
    slow_topo = degrade(topo, {tuple(sorted(("gpu2", "sw"))): 0.5})
    group = tuple(range(n))
    prog = Program({r: [Action("ar", kind="collective", op="allreduce", group=group, nbytes=S)] for r in group})
    for fluid in (True, False):
        assert simulate(prog, topo, fluid_collectives=fluid).end_s == pytest.approx(
            8.4e-6 + ring_time("allreduce", S, n, 2 * lat, B), rel=1e-9)
        assert simulate(prog, slow_topo, fluid_collectives=fluid).end_s == pytest.approx(
            8.4e-6 + ring_time("allreduce", S, n, 2 * lat, B / 2), rel=1e-9)
    assert topo.link("gpu2", "sw")["bandwidth_Bps"] == B  # the original is left as it was


def test_a_degraded_nvlink_slows_each_data_parallel_all_reduce_by_the_ring_closed_form():
    # In a training step the ring's latency terms cancel: each bucket's all-reduce takes
    # 2(n-1)S/(n B eff) (1/f - 1) longer, B eff the NVLink bandwidth the profile sustains.
    f, n = 0.5, 4
    link = ("node0/gpu1", "node0/nvswitch")
    ideal, slow = _pair(ParallelPlan(dp=n, global_batch_size=8, dp_overlap=False), links={link: f})
    topo = load_topology("dgx-a100")
    B = topo.link(*link)["bandwidth_Bps"] * A100.link_efficiencies()["nvlink"]
    sizes = {a.name: a.nbytes for a in ideal.program.actions[0] if a.kind == "collective"}
    for a, b in zip(ideal.trace.spans_of(0, "dp"), slow.trace.spans_of(0, "dp")):
        extra = 2 * (n - 1) * sizes[a.name] / (n * B) * (1 / f - 1)
        assert b.busy_s - a.busy_s == pytest.approx(extra, rel=1e-6)


def test_a_nic_name_degrades_its_links_and_a_pair_names_one_link():
    topo = load_topology("dgx-a100", nodes=2)
    assert links_named(topo, "node1/nic3") == [("node1/gpu3", "node1/nic3"), ("node1/nic3", "rail3/leaf0")]
    assert links_named(topo, "node0/gpu2-node0/nvswitch") == [("node0/gpu2", "node0/nvswitch")]
    assert links_named(topo, "node0/nvswitch-node0/gpu2") == [("node0/gpu2", "node0/nvswitch")]
    st = resolve_stragglers(SimulationSettings(degrade_link="node1/nic3=0.5,node1/gpu3-node1/nic3=0.25"), topo, 16)
    assert st.links == {("node1/gpu3", "node1/nic3"): 0.25, ("node1/nic3", "rail3/leaf0"): 0.5}
    slow = degrade(topo, st.links)
    assert slow.link("node1/nic3", "rail3/leaf0")["bandwidth_Bps"] == topo.link("node1/nic3", "rail3/leaf0")[
        "bandwidth_Bps"] * 0.5


def test_slow_gpus_by_device_id_or_rank():
    topo = load_topology("dgx-a100", nodes=2)
    st = resolve_stragglers(SimulationSettings(slow_gpu="node1/gpu5=1.3,rank2=1.1,4=2"), topo, 16)
    assert st.slow == {2: 1.1, 4: 2.0, 13: 1.3}
    assert resolve_stragglers(SimulationSettings(), topo, 16) is None


def test_the_same_seed_draws_the_same_stragglers_and_another_seed_others():
    a = draw_slow_gpus(1024, 0.02, parse_slowdown("lognormal:1.2:0.1"), seed=7)
    b = draw_slow_gpus(1024, 0.02, parse_slowdown("lognormal:1.2:0.1"), seed=7)
    c = draw_slow_gpus(1024, 0.02, parse_slowdown("lognormal:1.2:0.1"), seed=8)
    assert a == b and a != c
    assert len(a) == len(c) == round(0.02 * 1024)
    assert draw_slow_gpus(64, 0.25, parse_slowdown("1.5"), 0) == dict.fromkeys(draw_slow_gpus(64, 0.25,
                                                                                  ("fixed", (9.0,)), 0), 1.5)
    u = draw_slow_gpus(1000, 1.0, parse_slowdown("uniform:1.1:1.4"), 3)
    assert sorted(u) == list(range(1000)) and all(1.1 <= x <= 1.4 for x in u.values())
    assert len(draw_slow_gpus(8, 0.01, ("fixed", (1.2,)), 0)) == 1  # at least one when fraction > 0


def test_a_seeded_run_gives_identical_results(capsys, tmp_path):
    args = ["run", *TINY, "--straggler-fraction", "0.5", "--straggler-slowdown", "uniform:1.1:1.6",
            "--straggler-seed", "5", "--json"]
    out = []
    for seed in ("5", "5", "6"):
        assert main([*args[:-2], seed, "--json"]) == 0
        out.append(json.loads(capsys.readouterr().out))
    assert out[0] == out[1]
    a, c = out[0]["stragglers"], out[2]["stragglers"]
    assert a["drawn"] == {"fraction": 0.5, "slowdown": "uniform:1.1:1.6", "seed": 5, "gpus": 2}
    assert [e["factor"] for e in a["slow_gpus"]] != [e["factor"] for e in c["slow_gpus"]]
    assert a["cost_s"] == pytest.approx(a["iteration_time_s"] - a["ideal_iteration_time_s"])


def test_run_names_the_rank_that_set_the_pace_and_plots_it(capsys, tmp_path):
    # dp 8 of a tiny model: the timeline shows dp 0..3 by default; the slow rank 6 is added.
    argv = ["run", *TINY[:-4], "--gpus", "8", "--global-batch-size", "8", "--slow-gpu", "node0/gpu6=1.5",
            "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "rank 6 (node0/gpu6, slow x1.5): others waited" in text
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    st = summary["stragglers"]
    assert st["pace_setters"][0]["rank"] == 6 and st["cost_s"] > 0
    assert {w["rank"] for w in st["pace_setters"][0]["waiters"]} <= {0, 1, 2, 3, 4, 5, 7}

    class Run:  # what plotted_stragglers reads of a run
        plan = ParallelPlan(dp=8, global_batch_size=8)
        stragglers = Stragglers({6: 1.5})
    ranks, names = plotted_stragglers(Run, summary, [0, 1, 2, 3], {r: f"dp {r}" for r in range(4)})
    assert ranks == [0, 1, 2, 3, 6] and names[6].endswith("slow x1.5")
    trace = json.loads((tmp_path / "o" / "trace.json").read_text())
    assert any(e.get("args", {}).get("name", "").endswith("slow x1.5)") for e in trace["traceEvents"]
               if e["ph"] == "M" and e["name"] == "process_name")


def test_an_experiment_file_takes_a_stragglers_table(tmp_path, capsys):
    exp = tmp_path / "exp.toml"
    exp.write_text('[model]\nnum_layers = 2\nhidden_size = 256\nnum_attention_heads = 4\nvocab_size = 1024\n'
                   'seq_length = 256\n[cluster]\ngpus = 4\n[plan]\nglobal_batch_size = 4\n'
                   '[stragglers]\nslow_gpu = ["node0/gpu1=1.2", "node0/gpu2=1.4"]\n'
                   'degrade_link = "node0/gpu0-node0/nvswitch=0.5"\n')
    assert main(["run", str(exp), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)["stragglers"]
    assert [(e["rank"], e["factor"]) for e in st["slow_gpus"]] == [(1, 1.2), (2, 1.4)]
    (link,) = st["degraded_links"]
    assert link["link"] == "node0/gpu0-node0/nvswitch" and link["bytes_carried"] > 0 and link["factor"] == 0.5
    exp.write_text(exp.read_text().replace('"node0/gpu2=1.4"', '"node0/gpu9=1.4"'))
    assert main(["run", str(exp), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"trainsim: error: {exp}:") and "node0/gpu9" in err and "\n" not in err


@pytest.mark.parametrize("flags, needle", [
    (["--slow-gpu", "node0/gpu9=1.3"], "slow_gpu: got 'node0/gpu9'; not a GPU of topology"),
    (["--slow-gpu", "node0/gpu3=0"], "--slow-gpu: got 'node0/gpu3=0'; expected a slowdown factor > 0"),
    (["--slow-gpu", "node0/gpu3=-1.2"], "expected a slowdown factor > 0"),
    (["--slow-gpu", "node0/gpu3"], "expected GPU=FACTOR items"),
    (["--slow-gpu", "node0/gpu5=1.3"], "the plan runs on ranks 0..3"),
    (["--slow-gpu", "node0/gpu1=1.3,rank1=1.2"], "both rank 1; name each GPU once"),
    (["--degrade-link", "node0/nic9=0.5"], "degrade_link: got 'node0/nic9'; not a device or link of topology"),
    (["--degrade-link", "node0/gpu0-node0/gpu1=0.5"], "not a device or link"),
    (["--degrade-link", "node0/nic0=1.5"], "expected a bandwidth factor in (0, 1]"),
    (["--straggler-fraction", "0.5"], "straggler_fraction: got 0.5; drawn stragglers need straggler_slowdown"),
    (["--straggler-fraction", "0.5", "--straggler-slowdown", "gamma:1:2"], "--straggler-slowdown: got"),
    (["--straggler-fraction", "0.5", "--straggler-slowdown", "uniform:1.5:1.1"], "LO <= HI"),
    (["--straggler-fraction", "1.5", "--straggler-slowdown", "1.2"], "--straggler-fraction: got 1.5"),
    (["--slow-gpu", "1=1.3", "--fidelity", "reduced"], "fidelity: got 'reduced'; slow GPUs and degraded links"),
])
def test_bad_straggler_input_is_one_line(flags, needle, capsys, tmp_path):
    assert main(["run", *TINY, *flags, "--out", str(tmp_path / "o")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("trainsim: error: ")
    assert needle in err, err
    assert not (tmp_path / "o").exists()


def test_the_python_api_refuses_bad_names_and_factors_as_the_cli_does():
    with pytest.raises(InputError, match=r"^slow_gpu: got 'gpu3=0\.0'"):
        SimulationSettings(slow_gpu=["gpu3=0.0"])
    with pytest.raises(InputError, match="expected LINK=FACTOR items"):
        SimulationSettings(degrade_link=5)
    assert SimulationSettings(slow_gpu=["a=1.30", "b=2"]).slow_gpu == "a=1.3,b=2"
    with pytest.raises(InputError, match=r"^degrade_link: got 'x-y'; not a device or link of topology dgx-a100"):
        resolve_stragglers(SimulationSettings(degrade_link="x-y=0.5"), load_topology("dgx-a100"), 8)
