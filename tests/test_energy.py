"""Energy per iteration (``sim.results.energy``) and the power cap (``sim.inputs.power``).

A hand-computed GPU timeline gives exact joules; every simulated GPU's energy lies between
idle power and its power limit over the iteration; reduced fidelity weighs its simulated
GPUs so that it agrees with full fidelity; a power cap lowers compute-bound throughput by
the closed form of ``sim.inputs.power``, monotonically; ranking by tokens per joule picks
the plan with the least energy per token, and search's energy floor never prunes it.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

import sim
from sim.cli import main
from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.inputs.power import capped, clock_ratio
from sim.program.costs import op_time
from sim.program.ops import Op
from sim.results.energy import PowerStates, compute_bound, gpu_energy, iteration_energy
from sim.results.trace import Span, Trace
from sim.studies.search import (DEFAULT_MARGIN, SearchOptions, SearchSpace, candidates, enumerate_plans, plan_key,
                                search)

H100 = load_profile("h100-sxm")
TINY = {"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 8192, "seq_length": 512}
TINY_FLAGS = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "8192",
              "--seq-length", "512", "--gpu", "h100-sxm"]


def _span(kind, start, end, stream="compute", busy=None, category="F", name="0F0"):
    return Span(0, stream, name, kind, category, start, end, busy_start_s=busy)


def test_a_hand_computed_timeline_gives_exact_joules():
    p = PowerStates.of(H100)
    # the preset's figures: 700 W limit, 10% idle, 0.6 of the limit memory-bound, 0.3 communicating
    assert (p.compute_bound_w, p.memory_bound_w, p.communication_w, p.idle_w) == (700, 420, 210, 70)
    spans = [
        _span("compute", 0.0, 1.0),                                   # all GEMMs: 1 s at 700 W
        _span("send", 0.2, 0.6, stream="pp>1", busy=0.2),             # under compute: still 700 W
        _span("collective", 1.0, 2.0, stream="dp", busy=1.5),         # waits 0.5 s (idle), moves 0.5 s
        _span("compute", 2.0, 2.5, category="opt", name="optimizer"),  # memory-bound: 0.5 s at 420 W
        _span("compute", 2.5, 3.0, stream="cpu", category="opt", name="cpu step"),  # on the host: idle
    ]
    fraction = {"0F0": 1.0, "optimizer": 0.0}
    e = gpu_energy(spans, 3.5, p, lambda s: fraction[s.name])
    expected = {"compute_bound": 1.0 * 700, "memory_bound": 0.5 * 420, "communication": 0.5 * 210,
                "idle": (0.5 + 0.5 + 0.5) * 70}                       # the wait, the host step, 3.0..3.5
    assert e == pytest.approx(expected, rel=1e-12)
    # half the step in GEMMs, half memory-bound: the mean of the two powers over the span
    assert gpu_energy(spans[:1], 1.0, p, lambda s: 0.5)["compute_bound"] == pytest.approx(350)
    assert gpu_energy(spans[:1], 1.0, p, lambda s: 0.5)["memory_bound"] == pytest.approx(210)

    trace = Trace(spans=spans, transfers=[], link_bytes={}, link_kind={})
    plan = ParallelPlan(tp=1, pp=1, dp=1, global_batch_size=1)
    out = iteration_energy(trace, plan, lambda r: p, lambda r: lambda s: fraction[s.name], tokens=1000)
    total = sum(expected.values())                                    # 1,330 J over 3 s (the trace ends at 3.0)
    assert out["energy_per_iteration_j"] == pytest.approx(total - 0.5 * 70)
    assert out["energy_per_token_j"] == pytest.approx(out["energy_per_iteration_j"] / 1000)
    assert out["average_power_w"] == pytest.approx(out["energy_per_iteration_j"] / 3.0)


@pytest.fixture(scope="module")
def runs():
    """A tiny model on 8 H100s (dp 2 x tp 2 x pp 2), at full and reduced fidelity, and capped."""
    kw = dict(model=TINY, gpu="h100-sxm", gpus=8, tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
              global_batch_size=8)
    return {"full": sim.run(**kw, fidelity="full"), "reduced": sim.run(**kw, fidelity="reduced"),
            "capped": sim.run(**kw, fidelity="full", power_limit_w=450.0)}


@pytest.mark.parametrize("which", ["full", "reduced", "capped"])
def test_energy_lies_between_every_gpu_idle_and_every_gpu_at_its_limit(runs, which):
    s = runs[which].summary
    T, n = s["iteration_time_s"], s["gpus"]
    limit = 450.0 if which == "capped" else H100.power_limit_w
    e = s["energy_per_iteration_j"]
    assert n * H100.idle_power_w * T < e < n * limit * T
    assert sum(s["energy_by_state_j"].values()) == pytest.approx(e, rel=1e-12)
    assert s["average_power_per_gpu_w"] == pytest.approx(e / T / n)
    assert s["energy_per_token_j"] == pytest.approx(e / (8 * 512))


def test_reduced_fidelity_weighs_each_simulated_gpu_by_the_gpus_it_stands_for(runs):
    full, reduced = runs["full"].summary, runs["reduced"].summary
    assert reduced["simulated_gpus"] < full["simulated_gpus"] == 8
    assert reduced["iteration_time_s"] == pytest.approx(full["iteration_time_s"], rel=1e-9)
    assert reduced["energy_per_iteration_j"] == pytest.approx(full["energy_per_iteration_j"], rel=1e-9)


def test_the_cap_lowers_the_compute_clock_by_its_closed_form():
    idle, limit, s0 = H100.idle_power_w, H100.power_limit_w, H100.sustained_compute_fraction
    assert capped(H100, limit).sustained_compute_fraction == pytest.approx(s0)
    for cap in (600.0, 450.0, 300.0):
        p = capped(H100, cap)
        ratio = ((cap - idle) / (limit - idle)) ** (1 / 3)   # P = idle + (limit - idle)(f/f0)^3
        assert clock_ratio(H100, cap) == pytest.approx(ratio)
        assert p.sustained_compute_fraction == pytest.approx(s0 * ratio)
        assert PowerStates.of(p).compute_bound_w == cap
        # a compute-bound GEMM's time grows by 1/ratio; a memory-bound op's does not move
        gemm = Op("fc1", "F", "gemm", 2 * 8192 ** 3, 3 * 2 * 8192 ** 2, 2 * 8192 ** 2, 2 * 8192 ** 2, (8192,) * 3)
        norm = Op("norm", "F", "memory", 0.0, 2 ** 30, 2 ** 30, 2 ** 30)
        assert compute_bound(gemm, H100) and not compute_bound(norm, H100)
        launch = H100.kernel_launch_s
        assert (op_time(gemm, p) - launch) == pytest.approx((op_time(gemm, H100) - launch) / ratio)
        assert op_time(norm, p) == op_time(norm, H100)
    # a second cap is relative to the board's limit, not to the first cap
    assert capped(capped(H100, 450.0), 600.0).sustained_compute_fraction == pytest.approx(
        capped(H100, 600.0).sustained_compute_fraction)


def test_a_lower_cap_never_runs_faster(runs):
    times = [sim.run(model=TINY, gpu="h100-sxm", gpus=1, global_batch_size=2, power_limit_w=w).iteration_time_s
             for w in (700.0, 500.0, 300.0, 150.0)]
    assert times == sorted(times) and times[0] < times[-1]
    assert runs["capped"].iteration_time_s > runs["full"].iteration_time_s


def test_the_cap_applies_to_every_gpu_type():
    for name in ("a100-80gb", "h200", "b200", "gb200"):
        p = load_profile(name)
        cap = (p.idle_power_w + p.power_limit_w) / 2
        assert capped(p, cap).sustained_compute_fraction < p.sustained_compute_fraction
        assert PowerStates.of(capped(p, cap)).compute_bound_w == cap


@pytest.mark.parametrize("cap", [701.0, 70.0, 10.0])
def test_a_cap_outside_idle_and_the_limit_is_refused(cap):
    with pytest.raises(InputError, match=r"--power-limit-w: got .*\(70, 700\]"):
        capped(H100, cap)


def test_a_profile_without_power_figures_has_no_energy_and_cannot_be_capped():
    bare = replace(H100, power_limit_w=None, idle_power_w=None)
    assert PowerStates.of(bare) is None
    with pytest.raises(InputError, match="no power_limit_w"):
        capped(bare, 500.0)


def test_compare_ranks_by_tokens_per_joule(capsys):
    c = sim.compare(model=TINY, gpu="h100-sxm", gpus=8, pipeline_model_parallel_size=4, global_batch_size=16,
                    zero_stages=[0, 1], rank_by="tokens-per-joule")
    assert c.best is min(c, key=lambda r: r.summary["energy_per_token_j"])
    assert main(["compare", *TINY_FLAGS, "--gpus", "8", "--pipeline-model-parallel-size", "4",
                 "--global-batch-size", "16", "--zero-stages", "0,1", "--rank-by", "tokens-per-joule"]) == 0
    out = capsys.readouterr().out
    assert "tokens/J" in out and f"* best: {c.best.name} (the most tokens per joule" in out


@pytest.fixture(scope="module")
def cands():
    """A small search's candidates: an 8-layer model on 8 H100s, every plan without recompute."""
    model = gpt("tiny", 8, 512, 8, 4096, 256)
    space = SearchSpace(sequence_parallel=(False,), recompute=("none",))
    return candidates(model, enumerate_plans(model, 8, 16, space), H100)


@pytest.mark.parametrize("seed", range(4))
def test_search_by_energy_never_prunes_the_best_two(cands, seed):
    # Simulated times anywhere from bound / margin to 3 x bound; each GPU's average power
    # anywhere from idle to the limit: the energy floor (every GPU idle for bound / margin) holds.
    rng = random.Random(seed)
    time_f = {c.key: rng.uniform(1 / DEFAULT_MARGIN, 3.0) for c in cands}
    watts = {c.key: rng.uniform(H100.idle_power_w, H100.power_limit_w) for c in cands}
    bound = {c.key: c.bound_s for c in cands}

    def simulate(plans):
        out = []
        for p in plans:
            k = plan_key(p)
            t = bound[k] * time_f[k]
            e = p.world_size * watts[k] * t
            out.append({"key": k, "status": "ok", "summary": {"iteration_time_s": t, "fits": True,
                                                             "energy_per_iteration_j": e, "energy_per_token_j": e}})
        return out

    res = search(cands, simulate, SearchOptions(rank_by="tokens-per-joule", idle_power_w=H100.idle_power_w, wave=4))
    fits = [c for c in cands if c.estimate.fits]
    truth = sorted(fits, key=lambda c: (watts[c.key] * bound[c.key] * time_f[c.key], c.key))
    assert [r["key"] for r in res.ranked[:2]] == [c.key for c in truth[:2]]
    assert res.counts["pruned_time"] > 0  # the floor prunes the slowest plans


def test_search_cli_ranks_by_tokens_per_joule(capsys):
    argv = ["search", *TINY_FLAGS, "--gpus", "8", "--global-batch-size", "8", "--tp", "1,2", "--pp", "1,2",
            "--micro-batch-size", "1", "--zero", "0", "--recompute", "none", "--sequence-parallel", "off",
            "--schedule", "1f1b", "--workers", "0", "--json", "--rank-by", "tokens-per-joule", "--margin", "inf"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    energies = [t["energy_per_token_j"] for t in out["top"]]
    assert out["rank_by"] == "tokens-per-joule" and out["evaluated"] == 4
    assert energies == sorted(energies) and out["best"]["energy_per_token_j"] == energies[0]
