"""Resource limits: absurd plans are refused up front with the estimate; the estimate
tracks the events real runs process (within a factor of four, as sim/limits.py says)."""

import json
import time

import pytest

from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.program.limits import DEFAULT_MAX_EVENTS, check_size, estimate_events
from sim.inputs.model import gpt, llama, preset
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.inputs.schema import SimulationSettings
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
SMALL = gpt("small", 8, 1024, 16, 8192, 512)


@pytest.mark.parametrize("plan,nodes,fidelity", [
    (ParallelPlan(dp=4, tp=2, pp=2, micro_batch_size=1, global_batch_size=32, zero_stage=1), 2, "full"),
    (ParallelPlan(dp=8, pp=2, micro_batch_size=1, global_batch_size=32, zero_stage=3), 2, "full"),
    (ParallelPlan(dp=2, tp=8, micro_batch_size=1, global_batch_size=16), 2, "full"),
    (ParallelPlan(pp=4, vpp=2, global_batch_size=16, schedule="interleaved"), 1, "full"),
    (ParallelPlan(dp=2, pp=4, global_batch_size=16, schedule="zb-h1"), 1, "full"),
    (ParallelPlan(dp=16, micro_batch_size=1, global_batch_size=32, zero_stage=2), 2, "full"),
    (ParallelPlan(dp=8, tp=2, pp=2, micro_batch_size=1, global_batch_size=32), 4, "reduced"),
])
def test_estimate_is_within_a_factor_of_four_of_real_runs(plan, nodes, fidelity):
    topo = load_topology("dgx-h100", nodes=nodes)
    real = simulate_training(Job(SMALL, plan, H100, topo), SimulationSettings(fidelity=fidelity)).trace.stats["events"]
    est = estimate_events(SMALL, plan, fidelity, topo)["events"]
    assert real / 4 <= est <= real * 4


MOE = llama("moe-16", 8, 1024, 16, 16, 2048, 2000, 512, num_experts=16, moe_router_topk=2,
            moe_ffn_hidden_size=1024)


@pytest.mark.parametrize("plan,nodes,fidelity", [
    (ParallelPlan(dp=16, ep=16, global_batch_size=64, zero_stage=1), 2, "full"),
    (ParallelPlan(dp=8, tp=2, pp=2, ep=16, etp=1, global_batch_size=64, sequence_parallel=True), 4, "full"),
    (ParallelPlan(dp=8, tp=2, pp=2, ep=16, etp=1, global_batch_size=64, sequence_parallel=True), 4, "reduced"),
    (ParallelPlan(dp=8, tp=2, ep=4, etp=2, global_batch_size=32, sequence_parallel=True), 2, "full"),
    (ParallelPlan(dp=8, tp=2, ep=4, global_batch_size=32, sequence_parallel=True, moe_routing="zipf:1.5"), 2,
     "reduced"),
])
def test_estimate_of_a_mixture_of_experts_is_within_a_factor_of_four(plan, nodes, fidelity):
    # its all-to-alls (one bundle each under flows), expert rings and expert gradient buckets
    topo = load_topology("dgx-h100", nodes=nodes)
    real = simulate_training(Job(MOE, plan, H100, topo), SimulationSettings(fidelity=fidelity)).trace.stats["events"]
    est = estimate_events(MOE, plan, fidelity, topo)["events"]
    assert real / 4 <= est <= real * 4


def test_a_billion_micro_batches_is_refused_at_once():
    plan = ParallelPlan(dp=8, micro_batch_size=1, global_batch_size=8 * 10**9)
    t0 = time.perf_counter()
    with pytest.raises(InputError) as e:
        simulate_training(Job(preset("llama2-7b"), plan, H100, load_topology("dgx-h100", nodes=1)))
    assert time.perf_counter() - t0 < 5  # nothing was built
    msg = str(e.value)
    assert "\n" not in msg and "1,000,000,000 micro-batches" in msg and "--max-events" in msg
    # 8 GPUs x 2e9 steps x (33 layers x 1 event + nothing else) is about 5.3e11
    assert "5.3e+11 events" in msg


def test_the_limit_can_be_raised_or_lowered():
    plan = ParallelPlan(dp=2, micro_batch_size=1, global_batch_size=4)
    topo = load_topology("dgx-h100", nodes=1)
    with pytest.raises(InputError, match="over the limit of 10"):
        simulate_training(Job(SMALL, plan, H100, topo), SimulationSettings(fidelity="full", max_events=10))
    est = check_size(SMALL, plan, "full", None, topo)["events"]
    assert est < DEFAULT_MAX_EVENTS
    assert simulate_training(Job(SMALL, plan, H100, topo),
                             SimulationSettings(fidelity="full", max_events=float("inf"))).trace.end_s > 0
    for bad in (0, -5, float("nan"), True, "many"):
        with pytest.raises(InputError, match="max_events: got"):
            check_size(SMALL, plan, "full", bad)


def test_reduced_fidelity_counts_one_gpu_per_stage():
    plan = ParallelPlan(dp=64, tp=8, pp=4, micro_batch_size=1, global_batch_size=1024)
    full, red = estimate_events(SMALL, plan, "full"), estimate_events(SMALL, plan, "reduced")
    assert (full["simulated_gpus"], red["simulated_gpus"]) == (2048, 4)
    assert red["events"] * 2048 / 4 == pytest.approx(full["events"])


def _cli(capsys, *argv):
    from sim.cli import main

    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err.strip().splitlines()


def test_the_command_line_refuses_an_absurd_plan_with_the_estimate(capsys, tmp_path):
    rc, out, err = _cli(capsys, "run", "--model", "llama2-7b", "--gpu", "h100-sxm", "--nodes", "1",
                        "--global-batch-size", str(8 * 10**9), "--out", str(tmp_path / "o"))
    assert rc == 2 and out == "" and len(err) == 1
    # Absurd at any fidelity: auto falls back to reduced (one GPU: pp = 1), whose estimate is
    # 2e9 steps (1e9 micro-batches, forward and backward) x 33 compute events (32 layers and
    # the embedding or head) = 6.6e10, and refuses that.
    assert err[0].startswith("trainsim: error: plan: this simulation would process about 6.6e+10 events")
    assert not (tmp_path / "o").exists()


def test_max_events_flag_and_experiment_key(capsys, tmp_path):
    base = ("run", "--model", "gpt2-1.5b", "--gpu", "h100-sxm", "--nodes", "1", "--global-batch-size", "16")
    rc, _, err = _cli(capsys, *base, "--max-events", "1000")
    assert rc == 2 and "over the limit of 1e+03" in err[0]
    rc, _, err = _cli(capsys, *base, "--max-events", "-3")
    assert rc == 2 and err == ["trainsim: error: --max-events: got -3; expected a number > 0 (inf allowed)"]
    assert _cli(capsys, *base, "--max-events", "inf")[0] == 0
    exp = tmp_path / "e.toml"
    exp.write_text('[model]\npreset = "gpt2-1.5b"\n[cluster]\ngpu = "h100-sxm"\nnodes = 1\nmax_events = 500\n'
                   '[plan]\nglobal_batch_size = 16\n')
    rc, _, err = _cli(capsys, "run", str(exp))
    assert rc == 2 and len(err) == 1 and "over the limit of 5e+02" in err[0] and str(exp) in err[0]


def test_an_absurd_cluster_is_refused_before_it_is_built(capsys):
    from sim.inputs.topology_build import MAX_CLUSTER_GPUS
    from sim.inputs.topology_build import load_topology

    t0 = time.perf_counter()
    with pytest.raises(InputError, match=r"nodes: got 1,000,000 \(8,000,000 GPUs at 8 per node\)"):
        load_topology("dgx-h100", nodes=10**6)
    assert time.perf_counter() - t0 < 5
    assert MAX_CLUSTER_GPUS >= 16_384 * 8  # the largest published run fits, eight times over
    rc, _, err = _cli(capsys, "run", "--model", "llama2-7b", "--gpu", "h100-sxm", "--nodes", "1000000",
                      "--global-batch-size", "1000000", "--tensor-model-parallel-size", "8")
    assert rc == 2 and len(err) == 1 and "trainsim builds clusters of up to 131,072 GPUs" in err[0]


def test_the_zero_papers_7_5b_on_64_gpus_runs_with_default_flags_and_says_which_fidelity(capsys):
    # Plain data parallelism over 8 nodes: a ring of 64 ranks per bucket. As lock-step
    # rounds that was about 1.1e8 events and refused; as flows it is a few million.
    rc, out, err = _cli(capsys, "run", "--num-layers", "36", "--hidden-size", "4096", "--num-attention-heads", "32",
                        "--vocab-size", "51200", "--seq-length", "2048", "--gpu", "a100-80gb", "--nodes", "8",
                        "--global-batch-size", "64", "--zero", "1", "--json")
    assert rc == 0 and err == []
    s = json.loads(out)
    assert s["gpus"] == 64 and s["plan"]["dp"] == 64 and s["collective_model"] == "flows"
    assert s["fidelity"] in ("full", "reduced") and s["fidelity_reason"].startswith(f"auto: about ")


def test_auto_fidelity_is_chosen_by_the_estimated_events_not_the_gpu_count():
    from sim.inputs.schema import AUTO_FULL_FIDELITY_EVENTS
    from sim.session import choose_fidelity

    topo = load_topology("dgx-h100", nodes=64)
    small = ParallelPlan(dp=512, global_batch_size=512)  # 512 GPUs, one micro-batch each
    big = ParallelPlan(dp=8, global_batch_size=8 * 32768)  # 8 GPUs, 32,768 micro-batches each
    for plan, want in ((small, "full"), (big, "reduced")):
        events = estimate_events(SMALL, plan, "full", topo)["events"]
        assert (events <= AUTO_FULL_FIDELITY_EVENTS) == (want == "full"), (plan, events)
        fidelity, why = choose_fidelity(SMALL, plan, topo)
        assert fidelity == want and f"{events:.2g} events" in why
