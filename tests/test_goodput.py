"""``trainsim goodput``: a training campaign with failures, checkpoints and restarts.

Checked against independent expectations: Daly's closed form of the expected goodput and
his optimum interval (exponential failures, fixed costs, long horizons); a plain
iteration-by-iteration replay of the same failure draws; hand-computed checkpoint cycles;
Poisson statistics of the interruptions per cause; the Llama 3 table's counts; and
accounting (every second of the horizon booked once)."""

import contextlib
import io
import json
import math

import numpy as np
import pytest

from sim.cli import main
from sim.studies.goodput import Cause, CampaignConfig, Study, checkpoint_of, daly_goodput, daly_interval_s, \
    load_failures, run_study, search_interval, simulate_campaign, young_interval_s
from sim.engine.checkpoint_cycle import Cycle

DAY = 86400.0


def _cause(mtbf_s, detect_s=300.0, restart_s=300.0, **kw):
    return Cause("x", "job", 1.0 / mtbf_s, detect_s, restart_s, kw.pop("repair_s", 0.0),
                 kw.pop("replace", False), **kw)


def _config(cause, interval_s, horizon_s, stall_s=60.0, step_s=1.0, write_s=0.0, spares=None, rate=None):
    return CampaignConfig(horizon_s, step_s, interval_s, stall_s, write_s, planned_save_s=stall_s, load_s=0.0,
                          causes=((cause, cause.rate_per_device_s if rate is None else rate),), spares=spares)


# ----------------------------------------------------------------- the cycle, by hand
def test_a_synchronous_cycle_by_hand():
    c = Cycle(10.0, 2.0)  # train 10, save 2 (durable at its end), ...
    assert c.period_s == 12.0
    s = c.state_at(11.0)  # saving the first checkpoint
    assert (s.work_s, s.stall_s, s.durable_work_s) == (10.0, 1.0, 0.0)
    s = c.state_at(12.0)
    assert (s.work_s, s.stall_s, s.durable_work_s, s.saves_durable) == (10.0, 2.0, 10.0, 1)
    s = c.state_at(100.0)  # 8 whole cycles (96 s) and 4 s of training
    assert (s.work_s, s.stall_s, s.durable_work_s) == (84.0, 16.0, 80.0)


def test_an_asynchronous_cycle_by_hand():
    # copy 1 s, write 15 s in the background, 10 s of training between saves: each save after
    # the first waits 5 s for the previous write; the pattern after the first save is
    # copy 1, train 10, wait 5 (period 16)
    c = Cycle(10.0, 1.0, 15.0)
    assert (c.period_s, c.wait_s) == (16.0, 5.0)
    s = c.state_at(11.0)  # copy done at 11: not durable until 26
    assert (s.work_s, s.stall_s, s.durable_work_s) == (10.0, 1.0, 0.0)
    s = c.state_at(25.0)  # 14 s of training after the copy, then waiting since 21
    assert (s.work_s, s.stall_s, s.durable_work_s) == (20.0, 5.0, 0.0)
    s = c.state_at(26.0)  # the first write lands; the second save's copy starts
    assert (s.work_s, s.stall_s, s.durable_work_s) == (20.0, 6.0, 10.0)
    s = c.state_at(27.5)  # second copy done at 27, training again
    assert (s.work_s, s.stall_s) == (20.5, 7.0)


def test_a_campaign_without_failures_is_its_checkpoint_cycle():
    cause = _cause(1e9)
    out = simulate_campaign(_config(cause, 10.0, 100.0, stall_s=2.0, rate=0.0))
    assert (out.useful_s, out.checkpoint_s, out.saves_durable, out.unexpected) == (84.0, 16.0, 8, 0)


# ----------------------------------------------------------------- against Daly (2006)
@pytest.mark.parametrize("interval_s", [400.0, 1100.0, 3000.0])
def test_goodput_matches_dalys_closed_form_over_a_long_horizon(interval_s):
    m, delta, r = 3 * 3600.0, 60.0, 600.0
    cause = _cause(m, detect_s=200.0, restart_s=400.0)
    out = simulate_campaign(_config(cause, interval_s, 2000 * m, stall_s=delta), seed=1)
    assert out.goodput == pytest.approx(daly_goodput(interval_s, delta, m, r), rel=0.01)
    assert out.accounted_s() == pytest.approx(out.horizon_s, rel=1e-9)


def test_the_simulated_optimum_interval_matches_dalys():
    m, delta, r = 2 * 3600.0, 120.0, 600.0
    cause = _cause(m, detect_s=300.0, restart_s=300.0)
    best = search_interval(lambda t: _config(cause, t, DAY, stall_s=delta), daly_interval_s(delta, m),
                           min_failures=12000)
    daly = daly_interval_s(delta, m)
    assert best.best_interval_s == pytest.approx(daly, rel=0.02)
    assert best.best_goodput == pytest.approx(daly_goodput(daly, delta, m, r), rel=0.02)
    # Young's first-order form lies above Daly's by about δ(1 - ...): both near, Daly closer
    assert young_interval_s(delta, m) > daly


# ----------------------------------------------------------------- an independent replay
def _replay(m, detect, restart, delta, steps_per_save, step, horizon, seed):
    """Iteration by iteration, the same failure draws as the campaign's first cause."""
    gaps = np.random.default_rng([seed, 0]).exponential(m, 100000)
    fails = iter(np.cumsum(gaps).tolist())
    nf = next(fails)
    t = work = durable = lost = 0.0
    since = 0
    while t < horizon:
        if since == steps_per_save:  # a save
            end = t + delta
            if nf < end and nf < horizon:
                t = nf
            else:
                if end >= horizon:
                    break
                t, durable, since = end, work, 0
                continue
        else:
            end = t + step
            if nf < end and nf < horizon:
                work += nf - t
                t = nf
            else:
                if end >= horizon:
                    work += horizon - t
                    break
                work, t, since = work + step, end, since + 1
                continue
        lost += work - durable  # a failure at t: roll back, detect, restart (again on each new failure)
        work = durable
        back = t + detect + restart
        nf = next(fails)
        while nf < back:
            back = nf + detect + restart
            nf = next(fails)
        t, since = back, 0
    return work, lost


def test_the_campaign_equals_an_iteration_by_iteration_replay():
    m, detect, restart, delta, step = 5000.0, 120.0, 180.0, 40.0, 7.0
    for seed in (0, 3):
        out = simulate_campaign(_config(_cause(m, detect, restart), 7 * 60, 20 * DAY, stall_s=delta, step_s=step),
                                seed=seed)
        work, lost = _replay(m, detect, restart, delta, 60, step, 20 * DAY, seed)
        assert out.useful_s == pytest.approx(work, rel=1e-9)
        assert out.lost["x"]["lost_work"] == pytest.approx(lost, rel=1e-9)


# ----------------------------------------------------------------- seeds and rates
def _llama_study(days=54.0, spares=None, asynchronous=False):
    devices = {"gpu": 16384, "node": 2048, "nic": 16384, "switch": 520, "job": 1}
    ck = checkpoint_of(405e9, 16384, 2e12, 50e9, asynchronous)
    return Study(13.0, ck, load_failures("llama3"), devices, days * DAY, spares)


def test_llama3_rates_give_back_the_tables_counts():
    model = load_failures("llama3")
    observed = {"gpu": 16384, "node": 2048, "nic": 16384, "job": 1}
    rates = model.rates_per_s(observed)
    expected = {"faulty_gpu": 148, "gpu_hbm3": 72, "software_bug": 54, "network_switch_cable": 35,
                "host_maintenance": 32, "planned_maintenance": 47}  # Dubey et al. 2024, Table 5 and text
    for name, count in expected.items():
        assert rates[name] * 54 * DAY == pytest.approx(count)
    assert sum(rates.values()) * 54 * DAY == pytest.approx(466)  # 419 unexpected + 47 planned
    assert model.mtbf_s({**observed, "switch": 1}) == pytest.approx(54 * DAY / 419)


def test_a_seed_gives_identical_results_and_another_seed_others():
    a, _ = run_study(_llama_study(days=10), 600.0, seed=7, record=False, min_failures=500)
    b, _ = run_study(_llama_study(days=10), 600.0, seed=7, record=False, min_failures=500)
    c, _ = run_study(_llama_study(days=10), 600.0, seed=8, record=False, min_failures=500)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert a["interruptions_by_cause"] != c["interruptions_by_cause"]


def test_interruptions_per_cause_match_the_rates_within_poisson_error():
    study = _llama_study(days=540)
    out = simulate_campaign(study.config(600.0), seed=11)
    rates = study.rates_per_s()
    for cause in study.failures.causes:
        expected = rates[cause.name] * study.horizon_s
        got = out.interruptions[cause.name]
        if cause.planned:  # a planned stop that finds the job down is not one
            assert got <= expected + 4 * math.sqrt(expected)
        else:  # Poisson: variance = mean
            assert abs(got - expected) <= 4 * math.sqrt(expected) + 1, (cause.name, got, expected)
    assert out.accounted_s() == pytest.approx(study.horizon_s, rel=1e-9)


# ----------------------------------------------------------------- spares, async saves
def test_without_spares_each_failure_waits_for_the_repair():
    # failures 50 days apart on average, a repair of 2 h: the job waits repair - detect
    cause = _cause(50 * DAY, detect_s=600.0, restart_s=300.0, repair_s=7200.0, replace=True)
    none = simulate_campaign(_config(cause, 3600.0, 2000 * DAY, spares=0), seed=2)
    one = simulate_campaign(_config(cause, 3600.0, 2000 * DAY, spares=1), seed=2)
    n = none.interruptions["x"]
    assert n > 20
    assert none.lost["x"]["wait"] == pytest.approx(n * (7200.0 - 600.0), rel=1e-9)
    assert one.lost["x"]["wait"] == 0.0 and one.goodput > none.goodput
    for out in (none, one):
        assert out.accounted_s() == pytest.approx(out.horizon_s, rel=1e-9)


def test_with_k_spares_the_job_runs_while_at_most_k_nodes_are_in_repair():
    # Failures take nodes out at rate λ for a repair of D: the nodes in repair are Poisson with
    # mean m = λ·D (Palm's theorem, an M/G/∞ queue), and with k hot spares the job can run only
    # while at most k are out, so goodput(k) ≈ goodput(∞)·P(N ≤ k) when detection and restart
    # are short against the repair
    m = 3.0
    cause = _cause(DAY / m, detect_s=30.0, restart_s=30.0, repair_s=DAY, replace=True)
    runs = {k: simulate_campaign(_config(cause, 600.0, 4000 * DAY, stall_s=5.0, spares=k), seed=5).goodput
            for k in (None, 0, 1, 3, 6)}
    for k in (0, 1, 3, 6):  # over 4,000 days the ratio's spread is about 0.005 (8 seeds)
        cdf = sum(math.exp(-m) * m ** i / math.factorial(i) for i in range(k + 1))
        assert runs[k] / runs[None] == pytest.approx(cdf, abs=0.025), (k, runs[k] / runs[None], cdf)


def test_asynchronous_saves_stall_less_and_become_durable_later():
    cause = _cause(4 * 3600.0)
    sync = simulate_campaign(_config(cause, 900.0, 300 * DAY, stall_s=120.0), seed=4)
    asyn = simulate_campaign(_config(cause, 900.0, 300 * DAY, stall_s=2.0, write_s=120.0), seed=4)
    assert asyn.checkpoint_s < sync.checkpoint_s / 30
    assert asyn.lost["x"]["lost_work"] > sync.lost["x"]["lost_work"]  # the last save lands 2 min later
    assert asyn.goodput > sync.goodput


def test_checkpoint_bytes_are_weights_and_optimizer_states():
    # ZeRO (Rajbhandari et al. 2020): 2 bytes of 16-bit weights + K = 12 of optimizer states per
    # parameter (gradients are not saved), each shard written once
    ck = checkpoint_of(1e9, 8, storage_Bps=1e9, host_copy_Bps=1e9)
    assert (ck.bytes, ck.per_gpu_bytes, ck.write_s, ck.copy_s, ck.stall_s) == (14e9, 1.75e9, 14.0, 1.75, 14.0)
    ck = checkpoint_of(1e9, 8, 1e9, 1e9, asynchronous=True)
    assert (ck.stall_s, ck.background_s, ck.load_s) == (1.75, 14.0, 14.0)


# ----------------------------------------------------------------- the command line
TINY = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "8192",
        "--seq-length", "512", "--gpu", "h100-sxm", "--gpus", "16"]


def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["goodput", *argv])
    return code, out.getvalue(), err.getvalue()


def test_cli_json_has_the_issue_keys_and_writes_pictures(tmp_path):
    code, out, _ = _cli(*TINY, "--step-time-s", "2", "--days", "20", "--json", "--out", str(tmp_path / "g"))
    assert code == 0
    rep = json.loads(out)
    for key in ("goodput", "unexpected_interruptions", "interruptions_by_cause", "best_checkpoint_interval_s",
                "young_daly_interval_s"):
        assert key in rep
    assert rep["devices"]["gpu"] == 16 and rep["devices"]["node"] == 2 and rep["devices"]["nic"] == 16
    assert 0 < rep["goodput"] < 1
    for name in ("goodput.json", "goodput_timeline.png", "goodput_interval.png"):
        assert (tmp_path / "g" / name).stat().st_size > 0


def test_cli_simulates_the_step_when_not_given():
    code, out, _ = _cli(*TINY, "--days", "2", "--failures", "llama3", "--checkpoint-interval", "300")
    assert code == 0
    assert "step time" in out and "(simulated iteration)" in out and "goodput" in out


@pytest.mark.parametrize("argv, needle", [
    (["--days", "-1"], "--days"),
    (["--days", "1e9"], "--days"),
    (["--checkpoint-interval", "soon"], "--checkpoint-interval"),
    (["--checkpoint-interval", "-5"], "--checkpoint-interval"),
    (["--hot-spares", "-1"], "--hot-spares"),
    (["--failures", "nosuch"], "--failures"),
    (["--storage-bandwidth", "fast"], "--storage-bandwidth"),
    (["--step-time-s", "0"], "--step-time-s"),
])
def test_cli_bad_input_is_one_line(tmp_path, argv, needle):
    code, out, err = _cli(*TINY, "--step-time-s", "1", *argv, "--out", str(tmp_path / "o"))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("text, needle", [
    ('[causes.a]\ndevice = "gpu"\nrate_per_device_hour = 1e-6\ncolour = "red"\n', "causes.a.colour: unknown key"),
    ('[causes.a]\ndevice = "rack"\nrate_per_device_hour = 1e-6\n', "causes.a.device: got 'rack'"),
    ('[causes.a]\ndevice = "gpu"\nrate_per_device_hour = -1e-6\n', "causes.a.rate_per_device_hour: got -1e-06"),
    ('[causes.a]\ndevice = "gpu"\ncount = 3\n', "needs observed.hours"),
    ('[causes.a]\ndevice = "gpu"\ncount = 3\nrate_per_device_hour = 1e-6\n', "exactly one of count"),
    ('[observed]\nhours = 10\ngpus = 8\n[causes.a]\ndevice = "gpu"\ncount = 3\n', "observed.gpus: unknown key"),
    ('[defaults]\ndetect_s = -5\n[causes.a]\ndevice = "gpu"\nrate_per_device_hour = 1\n', "defaults.detect_s"),
])
def test_failure_files_are_checked_strictly(tmp_path, text, needle):
    path = tmp_path / "f.toml"
    path.write_text(text)
    code, _, err = _cli(*TINY, "--step-time-s", "1", "--failures", str(path))
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_a_failure_file_with_rates_runs():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "mine.toml"
        path.write_text('[defaults]\nrestart_s = 120\n[causes.gpu]\ndevice = "gpu"\nrate_per_device_hour = 1e-4\n'
                        '[causes.net]\ndevice = "switch"\nrate_per_device_hour = 1e-4\nrestart_s = 60\n')
        code, out, _ = _cli(*TINY, "--step-time-s", "1", "--days", "30", "--failures", str(path), "--json")
    rep = json.loads(out)
    assert code == 0 and set(rep["interruptions_by_cause"]) == {"gpu", "net"}
    # a GPU cause scales with the job's 16 GPUs: 1e-4 per GPU-hour
    assert rep["expected_interruptions_by_cause"]["gpu"] == pytest.approx(1e-4 * 16 * 30 * 24)


# ----------------------------------------------------------------- the docs' example
def test_the_documented_failure_file_parses(tmp_path):
    # (docs/stragglers-goodput.md quotes the campaign's output; tests/test_docs.py runs it)
    import re
    import tomllib
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "stragglers-goodput.md").read_text()
    # the failure file example parses, with the key names the text gives
    toml = re.search(r"A failure file lists causes.*?```toml\n(.*?)```", page, re.S).group(1)
    path = tmp_path / "example.toml"
    path.write_text(toml)
    tomllib.loads(toml)
    model = load_failures(str(path))
    assert [c.name for c in model.causes] == ["gpu_xid", "rack_power"] and model.causes[0].detect_s == 60
