"""Configuration search: enumeration, pruning that never drops the winner, explanation, CLI."""

import itertools
from dataclasses import asdict, replace
import json
import math
import random
import re

import pytest

from sim.cli import main
from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt, preset
from sim.inputs.plan import RECOMPUTE, SCHEDULES, ParallelPlan
from sim.inputs.strategies import schedule_named
from sim.studies.search import (
    DEFAULT_MARGIN,
    SearchOptions,
    SearchSpace,
    candidates,
    enumerate_plans,
    measure_margin,
    plan_key,
    recompute_family,
    search,
)
from sim.studies.search_explain import explain
from sim.units import format_time
from sim.studies.sweep import Runner, make_context
from sim.inputs.topology_build import load_topology

H100 = load_profile("h100-sxm")
TINY = gpt("tiny", 4, 512, 8, 4096, 256)
TINY_FLAGS = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "4096",
              "--seq-length", "256", "--gpu", "h100-sxm"]
SPACE = SearchSpace(tp=(1, 2), pp=(1, 2, 4), micro_batch_size=(1, 2), zero_stage=(0, 3),
                    schedule=("1f1b", "zb-h1", "interleaved"), recompute=("none",), sequence_parallel=(False,))


def _brute_force(model, gpus, gbs, max_tp=8, schedules=tuple(s for s in SCHEDULES if schedule_named(s).searched)):
    """Every plan ParallelPlan and check_model accept, by trying every combination; the
    search's conventions: sp only with tp > 1, ZeRO only with dp > 1, no schedule choice
    without a pipeline, tp within a node."""
    out = set()
    divs = [d for d in range(1, gpus + 1) if gpus % d == 0]
    for tp, pp in itertools.product(divs, divs):
        if gpus % (tp * pp) or tp > max_tp:
            continue
        dp = gpus // (tp * pp)
        for vpp, mbs, z, sched, rec, sp in itertools.product(range(1, 9), range(1, gbs + 1), range(4),
                                                            schedules, RECOMPUTE,
                                                            (False, True)):
            if (sp and tp == 1) or (z and dp == 1) or (pp == 1 and sched != "1f1b"):
                continue
            try:
                plan = ParallelPlan(dp=dp, tp=tp, pp=pp, vpp=vpp, micro_batch_size=mbs, global_batch_size=gbs,
                                    zero_stage=z, schedule=sched, recompute=rec, sequence_parallel=sp)
                plan.check_model(model)
            except InputError:
                continue
            out.add(plan_key(plan))
    return out


def test_enumeration_is_every_plan_the_plan_validation_accepts():
    model = gpt("enum", 4, 512, 8, 4096, 256)
    plans = enumerate_plans(model, 8, 8)
    keys = [plan_key(p) for p in plans]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert set(keys) == _brute_force(model, 8, 8)
    # Every dimension a search varies takes each of its values.
    for field, want in (("tp", {1, 2, 4, 8}), ("pp", {1, 2, 4}), ("vpp", {1, 2}), ("zero_stage", {0, 1, 2, 3}),
                        ("recompute", set(RECOMPUTE)), ("sequence_parallel", {False, True}),
                        ("schedule", {"gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved"})):
        assert {getattr(p, field) for p in plans} == want, field
    assert {p.micro_batch_size for p in plans if p.dp == 1} == {1, 2, 4, 8}


def test_a_schedule_searched_only_when_asked_is_enumerated_at_every_plan_it_runs():
    """Looped BFS (``strategies.PipelineSchedule.searched`` False): absent from the default
    space, and where ``--schedule`` names it, every plan the validation accepts with it."""
    model = gpt("enum", 4, 512, 8, 4096, 256)
    assert "looped-bfs" not in {p.schedule for p in enumerate_plans(model, 8, 8)}
    asked = enumerate_plans(model, 8, 8, SearchSpace(schedule=("1f1b", "looped-bfs")))
    got = {plan_key(p) for p in asked if p.schedule == "looped-bfs"}
    assert got and got == _brute_force(model, 8, 8, schedules=("looped-bfs",))
    assert {p.vpp for p in asked if p.schedule == "looped-bfs"} == {1, 2}


def test_space_narrows_and_checks_its_values():
    plans = enumerate_plans(TINY, 16, 16, SPACE)
    assert {p.tp for p in plans} == {1, 2} and {p.zero_stage for p in plans} == {0, 3}
    assert all(p.recompute == "none" and not p.sequence_parallel for p in plans)
    with pytest.raises(InputError, match="search: schedule: got 'zb-h3'"):
        SearchSpace(schedule=("zb-h3",))
    with pytest.raises(InputError, match="search: zero_stage"):
        SearchSpace(zero_stage=(4,))


def test_search_finds_the_winner_of_an_exhaustive_simulation():
    # 44 plans of a small GPT on 16 H100s (2 nodes): dp, tp, pp, vpp, micro-batch, ZeRO and
    # schedule vary. Simulate all of them, then search with pruning, asking the simulator
    # only for the plans the search picks (the records are the exhaustive run's, which is
    # what a second simulation gives: the simulator is deterministic).
    plans = enumerate_plans(TINY, 16, 16, SPACE)
    assert len(plans) == 44
    ctx = make_context(TINY, H100, load_topology("dgx-h100", nodes=2))
    cands = candidates(TINY, plans, H100)
    with Runner(workers=2, progress=False) as runner:
        full = search(cands, lambda ps: runner.run(ctx, ps), SearchOptions(margin=math.inf))
    assert full.counts["evaluated"] == full.counts["ok"] == 44
    by_key = {c.key: c.record for c in full.candidates}
    asked = []

    def simulate(ps):
        asked.extend(ps)
        return [by_key[plan_key(p)] for p in ps]

    pruned = search(cands, simulate, SearchOptions(wave=4))
    assert pruned.best["key"] == full.best["key"]
    assert pruned.ranked[1]["key"] == full.ranked[1]["key"]  # the runner-up is exact too
    assert 0 < pruned.counts["evaluated"] == len(asked) < 44
    assert pruned.counts["pruned_time"] == 44 - len(asked)
    # What makes it safe: on these plans the bound never exceeds the simulated time by
    # more than the margin.
    m = measure_margin(full.candidates)
    assert m["plans"] == 44 and m["max"] <= DEFAULT_MARGIN


def test_search_over_every_valid_plan_finds_the_exhaustive_winner():
    # No narrowing: every plan enumerate_plans finds (dp x tp x pp, micro-batch, ZeRO 0-3,
    # every schedule, recompute none/selective/full, sequence parallel on/off) for a
    # 4-layer GPT on 16 H100s (2 nodes), global batch 2: 240 plans, each simulated.
    model = gpt("tiny-4l-256", 4, 256, 4, 1024, 128)
    plans = enumerate_plans(model, 16, 2)
    assert len(plans) == 240
    for field in ("tp", "pp", "zero_stage", "schedule", "recompute", "sequence_parallel"):
        assert len({getattr(p, field) for p in plans}) > 1, field
    ctx = make_context(model, H100, load_topology("dgx-h100", nodes=2))
    cands = candidates(model, plans, H100)
    with Runner(workers=0, progress=False) as runner:
        full = search(cands, lambda ps: runner.run(ctx, ps), SearchOptions(margin=math.inf))
        assert full.counts["evaluated"] == full.counts["ok"] == 240
        by_key = {c.key: c.record for c in full.candidates}
        exhaustive = sorted((r for r in by_key.values() if r["summary"]["fits"]),
                            key=lambda r: (r["summary"]["iteration_time_s"], r["key"]))
        asked = []

        def simulate(ps):
            asked.extend(ps)
            return [by_key[plan_key(p)] for p in ps]

        # What skipping a plan that recomputes more than one that ran and fit rests on: within
        # a recompute family (the same plan but for its recompute), the simulated time never
        # falls as the recompute grows.
        families = {}
        for c in cands:
            family, weight = recompute_family(c.plan)
            families.setdefault(family, []).append((weight, by_key[c.key]["summary"]["iteration_time_s"]))
        assert sum(len(f) > 1 for f in families.values()) > 50
        for members in families.values():
            members.sort()
            assert all(a[1] <= b[1] * (1 + 1e-12) for a, b in zip(members, members[1:])), members
        pruned = search(cands, simulate)
        assert pruned.best["key"] == exhaustive[0]["key"] == full.best["key"]
        assert pruned.ranked[1]["key"] == _undominated(exhaustive)[1]["key"]
        assert pruned.counts["pruned_time"] + pruned.counts["pruned_dominated"] == 240 - len(asked)
        assert pruned.counts["pruned_time"] > 0 and pruned.counts["pruned_dominated"] > 0
        # The records looked up are what simulating again gives (the simulator is deterministic).
        winners = [p for p in plans if plan_key(p) in (exhaustive[0]["key"], exhaustive[1]["key"])]
        assert runner.run(ctx, winners) == [by_key[plan_key(p)] for p in winners]


def _undominated(records):
    """``records`` (ranked, every one fits) less those with more recompute than a faster one
    of their family: the plans a search may rank (``recompute_family``)."""
    lightest = {}
    for r in records:
        family, weight = recompute_family(ParallelPlan(**r["plan"]))
        lightest[family] = min(weight, lightest.get(family, weight))
    return [r for r in records if lightest[recompute_family(ParallelPlan(**r["plan"]))[0]]
            == recompute_family(ParallelPlan(**r["plan"]))[1]]


def _monotone(cands, factor):
    """``factor`` made to respect what the search assumes of the simulator: within a
    recompute family, a plan with more recompute is never faster than one with less."""
    t = {c.key: c.bound_s * factor(c.key) for c in cands}
    families = {}
    for c in cands:
        family, weight = recompute_family(c.plan)
        families.setdefault(family, []).append((weight, c.key))
    for members in families.values():
        slowest = 0.0
        for _, key in sorted(members):
            slowest = t[key] = max(slowest, t[key])
    return {c.key: t[c.key] / c.bound_s for c in cands}


def _fake_simulator(cands, factor):
    """Records whose iteration time is bound x factor(key): a simulator the estimate is off from."""
    bound = {c.key: c.bound_s for c in cands}

    def simulate(ps):
        return [{"key": plan_key(p), "status": "ok",
                 "summary": {"iteration_time_s": bound[plan_key(p)] * factor(plan_key(p)), "fits": True}}
                for p in ps]
    return simulate


@pytest.fixture(scope="module")
def big():
    """Llama 2 70B on 64 H100s: hundreds of plans, about half of which do not fit."""
    model = preset("llama2-70b")
    space = SearchSpace(recompute=("none", "full"), zero_stage=(0, 3), sequence_parallel=(False,),
                        schedule=("1f1b", "interleaved"), micro_batch_size=(1, 2))
    return candidates(model, enumerate_plans(model, 64, 128, space), H100)


@pytest.mark.parametrize("seed", range(8))
def test_pruning_never_drops_the_best_two_while_the_margin_holds(big, seed):
    # Simulated times anywhere from bound / margin to 3 x bound, at random.
    rng = random.Random(seed)
    # (Never faster with more recompute, which the search assumes; tested on real simulations above.)
    f = _monotone(big, {c.key: rng.uniform(1 / DEFAULT_MARGIN, 3.0) for c in big}.get)
    res = search(big, _fake_simulator(big, f.get))
    fits = [c for c in big if c.estimate.fits]
    truth = sorted(({"key": c.key, "plan": asdict(c.plan), "t": c.bound_s * f[c.key]} for c in fits),
                   key=lambda r: (r["t"], r["key"]))
    assert [r["key"] for r in res.ranked[:2]] == [r["key"] for r in _undominated(truth)[:2]]
    assert res.counts["pruned_memory"] == len(big) - len(fits) > len(big) // 4
    assert res.counts["pruned_time"] > len(fits) // 2
    assert all(c.status == "pruned: memory" for c in res.candidates if not c.estimate.fits)
    assert all(c.status == "pending" for c in big if c.estimate.fits)  # the input is left alone


def test_a_simulator_faster_than_the_margin_allows_can_be_missed(big):
    # The guarantee rests on the margin: a plan that simulates far below its bound / margin
    # (and is ranked late by its bound) is pruned and lost. This is why the margin is measured.
    fits = [c for c in big if c.estimate.fits]
    hidden = max(fits, key=lambda c: c.bound_s).key
    sim = _fake_simulator(big, lambda k: 0.01 if k == hidden else 1.0)
    assert search(big, sim).best["key"] != hidden
    assert search(big, sim, SearchOptions(margin=math.inf)).best["key"] == hidden


def test_explain_names_what_makes_the_difference():
    def rec(key, compute, dp, idle, act):
        mem = {"parameters_bytes": 1e9, "activations_bytes": act, "peak_bytes": 1e9 + act}
        return {"key": key, "summary": {
            "plan": {"dp": 4, "tp": 2, "pp": 2, "vpp": 1, "schedule": "1f1b", "micro_batch_size": 1,
                     "zero_stage": 0, "recompute": "none", "sequence_parallel": False},
            "iteration_time_s": compute + dp + idle, "compute_s": compute, "idle_s": idle,
            "exposed_comm_s": {"dp": dp, "tp": 0.0}, "memory": mem}}
    lines = explain(rec("a", 0.010, 0.001, 0.002, 2e9), rec("b", 0.010, 0.004, 0.0025, 1e9))
    text = "\n".join(lines)
    assert "3.500 ms (21.2%) faster" in text
    assert "3.000 ms less exposed dp, 500.00 us less idle" in text
    assert "953.67 MiB more memory" in text
    assert any(line.startswith("  activations") for line in lines)


def test_negative_differences_are_scaled_like_positive_ones_and_set_apart():
    # issue 44: "exposed tp ... 1.712 s -77858.28 us", "idle ... 839.957 ms-101427.42 us"
    assert format_time(-0.07785828) == "-77.858 ms" and format_time(0.07785828) == "77.858 ms"
    assert format_time(-1.5) == "-1.500 s" and format_time(-2e-6) == "-2.00 us"

    def rec(key, compute, tp, idle):
        return {"key": key, "summary": {
            "plan": {"dp": 4, "tp": 2, "pp": 2, "vpp": 1, "schedule": "1f1b", "micro_batch_size": 1,
                     "zero_stage": 0, "recompute": "none", "sequence_parallel": False},
            "iteration_time_s": compute + tp + idle, "compute_s": compute, "idle_s": idle,
            "exposed_comm_s": {"tp": tp}, "memory": {"peak_bytes": 1e9}}}
    best, runner_up = rec("a", 0.5, 1.712, 0.839957), rec("b", 2.7, 1.634142, 0.73853)
    lines = explain(best, runner_up)
    tp_row = next(line for line in lines if line.lstrip().startswith("exposed tp"))
    idle_row = next(line for line in lines if line.lstrip().startswith("idle"))
    assert tp_row.split()[-4:] == ["1.634", "s", "-77.858", "ms"]
    assert idle_row.split()[-6:] == ["839.957", "ms", "738.530", "ms", "-101.427", "ms"]


def test_search_cli_json_best_is_what_trainsim_run_reports(capsys, tmp_path):
    argv = ["search", *TINY_FLAGS, "--gpus", "8", "--global-batch-size", "8", "--tp", "1,2", "--pp", "1,2",
            "--micro-batch-size", "1", "--zero", "0", "--recompute", "none", "--sequence-parallel", "off",
            "--schedule", "1f1b", "--workers", "0", "--top", "3", "--json", "--out", str(tmp_path / "s")]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"best", "top", "evaluated", "pruned", "failed"} <= set(out)
    assert out["evaluated"] + out["pruned"] == out["plans"] == 4 and out["failed"] == 0
    assert out["top"][0] == out["best"] and len(out["top"]) == min(3, out["evaluated"])
    times = [t["iteration_time_s"] for t in out["top"]]
    assert times == sorted(times)
    best = out["best"]
    plan = best["plan"]
    run_argv = ["run", *TINY_FLAGS, "--gpus", "8", "--global-batch-size", "8", "--json",
                "--tensor-model-parallel-size", str(plan["tp"]), "--pipeline-model-parallel-size", str(plan["pp"]),
                "--micro-batch-size", str(plan["micro_batch_size"])]
    assert main(run_argv) == 0
    ran = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in best.items() if k != "key"} == ran
    d = tmp_path / "s"
    rows = (d / "results.csv").read_text().splitlines()
    assert rows[0].startswith("key,status,dp,tp,pp") and len(rows) == 5
    assert len((d / "results.jsonl").read_text().splitlines()) == out["evaluated"]
    assert (d / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((d / "search.json").read_text()) == out


def test_search_cli_prints_the_top_and_why(capsys):
    argv = ["search", *TINY_FLAGS, "--gpus", "8", "--global-batch-size", "8", "--tp", "1,2", "--pp", "1",
            "--micro-batch-size", "1,2", "--zero", "0", "--recompute", "none,full", "--sequence-parallel", "off",
            "--workers", "0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "6 plans: 0 do not fit in memory" in out
    assert "  1  dp " in out and "runner-up dp" in out and "why: the best is" in out


def test_search_reports_progress_off_a_terminal_and_its_whole_wall_time(capsys, tmp_path, monkeypatch):
    # issue 44: nothing on stderr for minutes when it is not a terminal, and "in 220.5 s"
    # printed for a 262 s run (the count left out the estimates and the outputs)
    import time

    import sim.commands.search as search_command
    import sim.progress

    monkeypatch.setattr(sim.progress, "LINE_EVERY_S", 0.05)
    write = search_command.write_outputs

    def slow_write(*a, **k):
        time.sleep(0.5)
        return write(*a, **k)

    monkeypatch.setattr(search_command, "write_outputs", slow_write)
    import sim.session

    simulate = sim.session.simulate_training

    def slow_simulate(*a, **k):  # (each a few ms: slower than the lines, so some are written)
        time.sleep(0.1)
        return simulate(*a, **k)

    monkeypatch.setattr(sim.session, "simulate_training", slow_simulate)
    argv = ["search", *TINY_FLAGS, "--gpus", "8", "--global-batch-size", "8", "--tp", "1,2", "--pp", "1",
            "--micro-batch-size", "1,2", "--zero", "0", "--recompute", "none", "--sequence-parallel", "off",
            "--workers", "0", "--out", str(tmp_path / "s")]
    t0 = time.monotonic()
    assert main(argv) == 0
    wall = time.monotonic() - t0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    plans, no_fit = map(int, re.search(r"(\d+) plans: (\d+) do not fit in memory", out).groups())
    fit = plans - no_fit  # the most the search may simulate (none has enough micro-batches to be screened)
    # issue 54: while it enumerates and estimates, lines name that; then the count of the
    # simulations the search will run (every plan that fits here: the first wave holds them all)
    phases = ["enumerating the plans of 8 GPUs", f"estimating the memory and time of {plans} plans"]
    counts = [x for x in lines if not re.fullmatch(rf"search: ({'|'.join(phases)}), \d+\.\d s elapsed", x)]
    assert counts and all(re.fullmatch(rf"search: \d/{fit} simulations, \d+\.\d s elapsed", x) for x in counts), err
    reported = float(re.search(r"simulated \(0 failed\) in ([\d.]+) s \(wall time\)", out).group(1))
    assert 0.5 <= reported <= wall + 0.05  # the outputs' time is in it


def test_pareto_title_counts_what_it_shows_and_what_the_text_calls_simulated(capsys, tmp_path, monkeypatch):
    # issue 44: pareto.png was titled "104 plans simulated" where the text said 112 (the
    # plot shows the simulated plans that ran and fit; the text counts every simulated one)
    import sim.results.plot_pareto

    drawn = {}
    monkeypatch.setattr(sim.results.plot_pareto, "plot_pareto", lambda pts, path, title, capacity_bytes: drawn.update(
        points=pts, title=title, capacity=capacity_bytes))
    argv = ["search", *TINY_FLAGS, "--gpus", "8", "--global-batch-size", "8", "--tp", "1,2", "--pp", "1,2",
            "--micro-batch-size", "1", "--zero", "0", "--recompute", "none", "--sequence-parallel", "off",
            "--workers", "0", "--out", str(tmp_path / "s")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    plans, simulated = map(int, re.search(r"(\d+) plans: .* (\d+) simulated \(", out).groups())
    ok = [json.loads(x) for x in (tmp_path / "s" / "results.jsonl").read_text().splitlines()]
    shown = sum(r["status"] == "ok" and r["summary"]["fits"] for r in ok)
    assert len(drawn["points"]) == shown
    assert drawn["title"].endswith(f"{shown} plans that ran and fit, of {simulated} simulated ({plans} considered)")


@pytest.mark.parametrize("extra,message", [
    (["--tp", "1,x"], "--tp: got 'x'"),
    (["--margin", "0.5"], "--margin: got 0.5"),
    (["--sequence-parallel", "maybe"], "--sequence-parallel: got 'maybe'"),
    (["--tp", "3"], "search: got '8 GPUs, global batch 8'; no valid plan"),
    (["--workers", "-1"], "--workers: got -1"),
])
def test_search_cli_input_errors_are_one_line_and_write_nothing(capsys, tmp_path, extra, message):
    argv = ["search", *TINY_FLAGS, "--gpus", "8", "--global-batch-size", "8", "--out", str(tmp_path / "o"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainsim: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_the_bound_charges_unfused_gradient_accumulation_in_every_layer():
    # --no-gradient-accumulation-fusion adds main_grad.add_ after each weight gradient: 10 B per local weight
    # (read the bf16 gradient and the fp32 main gradient, write the main gradient), in the layers as in the head
    from sim.program.workload import LayerRun, layer_work
    from sim.studies.search import _phases

    model, profile = gpt("acc", 4, 1024, 16, 32000, 1024), load_profile("h100-sxm")
    plan = ParallelPlan(tp=2, sequence_parallel=True, global_batch_size=4)  # m = 4

    def phases(p):
        s = p.sections
        return _phases(model, profile, "nvlink", s.parallelism, s.recompute, s.precision, s.framework)

    fused, unfused = phases(plan), phases(replace(plan, gradient_accumulation_fusion=False))
    wgrads = [o for o in layer_work(model, LayerRun(1, 2, True, "none")).ops("W") if o.kind == "gemm"]
    # one framework (PyTorch) elementwise kernel per weight gradient: 10 B and one add per weight, plus its launch
    weights = [o.shape[0] * o.shape[1] for o in wgrads]
    extra = sum(max(n / profile.peak("fp32"), 10 * n / profile.memory_rate(True)) + profile.kernel_launch_s
                for n in weights)
    w = {ph[0]: ph for ph in fused}["W"], {ph[0]: ph for ph in unfused}["W"]
    assert w[1][1] - w[0][1] == pytest.approx(extra, rel=1e-9)


def test_the_bound_prices_the_layer_the_plan_runs_even_with_unfused_attention():
    # the bound's per-layer phases are the simulator's layer (plan_layer_work) priced kernel by kernel:
    # unfused attention (softmax and its score matrices in HBM) must not be priced as flash attention
    from sim.program.costs import work_times
    from sim.program.workload import plan_layer_work
    from sim.studies.search import _phases

    model, profile = gpt("att", 4, 1024, 16, 32000, 1024), load_profile("h100-sxm")
    plans = [ParallelPlan(tp=2, sequence_parallel=True, micro_batch_size=1, global_batch_size=4, attention=a)
             for a in ("flash", "unfused")]
    layers = []
    for plan in plans:
        s = plan.sections
        ph = _phases(model, profile, "nvlink", s.parallelism, s.recompute, s.precision, s.framework)
        expect = work_times(plan_layer_work(model, plan), profile, 2, "nvlink")
        for name, layer_s, *_ in ph:
            assert layer_s == pytest.approx(sum(expect[name]), rel=1e-12)
        layers.append(sum(p[1] for p in ph))
    assert layers[1] > layers[0]
