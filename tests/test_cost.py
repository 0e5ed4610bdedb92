"""Cost (issue 54 item 7): a price per GPU-hour (``--gpu-hour-price``, one for every GPU or
one per GPU type, or ``gpu_hour_price_usd`` in the profile) gives ``run`` its cost per
iteration and per million tokens, and ``--rank-by cost`` to compare and search.

The expected costs are computed here by hand from the run's own iteration time and batch:
dollars = seconds / 3600 x GPUs x price; per million tokens = that / tokens x 1e6.
"""

import contextlib
import io
import json
import re
from dataclasses import replace

import pytest

from sim.cli import main
from sim.errors import InputError
from sim.inputs.cost import parse_prices
from sim.inputs.hardware import load_profile

TINY = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "8192",
        "--seq-length", "512", "--gpu", "h100-sxm", "--gpus", "8", "--global-batch-size", "16"]


def _cli(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def test_run_gives_the_cost_per_iteration_and_per_million_tokens():
    code, out, _ = _cli(["run", *TINY, "--gpu-hour-price", "2.5", "--json"])
    s = json.loads(out)
    T, tokens = s["iteration_time_s"], 16 * 512
    assert code == 0
    assert s["cost_per_iteration_usd"] == pytest.approx(T / 3600 * 8 * 2.5, rel=1e-12)
    assert s["cost_per_million_tokens_usd"] == pytest.approx(T / 3600 * 8 * 2.5 / tokens * 1e6, rel=1e-12)
    assert s["gpu_hours_per_iteration"] == pytest.approx(T / 3600 * 8, rel=1e-12)
    code, text, _ = _cli(["run", *TINY, "--gpu-hour-price", "2.5"])
    line = next(x for x in text.splitlines() if x.strip().startswith("cost "))
    assert f"${s['cost_per_iteration_usd']:.4g}" in line and f"${s['cost_per_million_tokens_usd']:.4g} per million" in line
    # no price: no cost line, null figures; the time is the same
    code, out, _ = _cli(["run", *TINY, "--json"])
    plain = json.loads(out)
    assert plain["cost_per_iteration_usd"] is None and plain["iteration_time_s"] == T
    assert "cost " not in _cli(["run", *TINY])[1]


def test_a_price_per_gpu_type_and_in_the_profile(tmp_path):
    per_type = json.loads(_cli(["run", *TINY, "--gpu-hour-price", "a100-80gb=1.5,h100-sxm=3", "--json"])[1])
    assert per_type["cost_per_iteration_usd"] == pytest.approx(per_type["iteration_time_s"] / 3600 * 8 * 3.0)
    prof = tmp_path / "priced.json"
    replace(load_profile("h100-sxm"), gpu_hour_price_usd=4.0).save(prof)
    argv = [*TINY[:TINY.index("--gpu")], "--gpu", prof, *TINY[TINY.index("--gpu") + 2:]]
    own = json.loads(_cli(["run", *argv, "--json"])[1])
    assert own["cost_per_iteration_usd"] == pytest.approx(own["iteration_time_s"] / 3600 * 8 * 4.0)
    flag = json.loads(_cli(["run", *argv, "--gpu-hour-price", "1", "--json"])[1])  # the flag wins
    assert flag["cost_per_iteration_usd"] == pytest.approx(own["cost_per_iteration_usd"] / 4)


def test_a_mixed_cluster_prices_each_gpu_type(tmp_path):
    cluster = tmp_path / "mixed.toml"
    cluster.write_text('[cluster]\nnode = ["dgx-a100", "dgx-h100"]\nnodes = [1, 1]\n')
    argv = ["run", "--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16", "--vocab-size", "1024",
            "--seq-length", "512", "--global-batch-size", "4", "--topology", cluster, "--gpus", "16",
            "--tensor-model-parallel-size", "4", "--gpu", "a100-80gb", "--json"]
    s = json.loads(_cli([*argv, "--gpu-hour-price", "a100-80gb=1,h100-sxm=3"])[1])
    assert s["cost_per_iteration_usd"] == pytest.approx(s["iteration_time_s"] / 3600 * (8 * 1 + 8 * 3))
    code, _, err = _cli([*argv, "--gpu-hour-price", "a100-80gb=1"])
    assert code == 2 and "no price for h100-sxm" in err


def test_compare_ranks_by_cost_and_search_too():
    code, out, _ = _cli(["compare", *TINY, "--pp", "2", "--schedules", "gpipe,1f1b,interleaved", "--gpu-hour-price",
                         "2.5", "--rank-by", "cost", "--json"])
    data = json.loads(out)
    rows = [r for r in data["rows"] if r["fits"]]
    cheapest = min(rows, key=lambda r: r["cost_per_million_tokens_usd"])
    assert code == 0 and data["best"] == cheapest["name"] and data["rank_by"] == "cost"
    for r in rows:
        assert r["cost_per_million_tokens_usd"] == pytest.approx(
            r["iteration_time_s"] / 3600 * 8 * 2.5 / (16 * 512) * 1e6)
    code, out, _ = _cli(["search", *TINY, "--workers", "0", "--gpu-hour-price", "2.5", "--rank-by", "cost", "--top", "3",
                         "--json"])
    top = json.loads(out)["top"]
    costs = [t["cost_per_million_tokens_usd"] for t in top]
    assert code == 0 and costs == sorted(costs) and all(c > 0 for c in costs)


@pytest.mark.parametrize("command", ["compare", "search"])
def test_rank_by_cost_without_a_price_is_refused_before_any_simulation(command):
    extra = ["--schedules", "1f1b"] if command == "compare" else ["--workers", "0"]
    code, out, err = _cli([command, *TINY, *extra, "--rank-by", "cost"])
    assert code == 2 and out == ""
    assert err.strip() == ("trainsim: error: --rank-by: got 'cost'; h100-sxm has no price: give --gpu-hour-price USD, "
                           "or gpu_hour_price_usd in its profile")


@pytest.mark.parametrize("value", ["abc", "0", "-1", "h100-sxm=", "=2", "2,h100-sxm=3", "h100-sxm=1,h100-sxm=2", "inf"])
def test_a_bad_price_is_one_line_naming_what_is_allowed(value):
    code, out, err = _cli(["run", *TINY, f"--gpu-hour-price={value}"])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("trainsim: error: --gpu-hour-price: got ") and "US dollars per GPU-hour > 0" in err


def test_prices_parse_as_one_or_per_type():
    assert parse_prices(2.5) == {None: 2.5} and parse_prices("2.5") == {None: 2.5}
    assert parse_prices("h100-sxm=2.5, b200=$4") == {"h100-sxm": 2.5, "b200": 4.0}
    with pytest.raises(InputError, match="gpu_hour_price: got True"):
        parse_prices(True)


def test_an_experiment_file_sets_the_price_and_a_bad_one_names_its_line(tmp_path):
    body = ('[model]\nnum_layers = 4\nhidden_size = 512\nnum_attention_heads = 8\nvocab_size = 8192\nseq_length = 512\n'
            '\n[cluster]\ngpu = "h100-sxm"\ngpus = 8\ngpu_hour_price = {}\n\n[plan]\nglobal_batch_size = 16\n')
    good = tmp_path / "good.toml"
    good.write_text(body.format('"h100-sxm=2.5"'))
    s = json.loads(_cli(["run", good, "--json"])[1])
    assert s["cost_per_iteration_usd"] == pytest.approx(s["iteration_time_s"] / 3600 * 8 * 2.5)
    bad = tmp_path / "bad.toml"
    bad.write_text(body.format("-3"))
    code, out, err = _cli(["run", bad])
    assert code == 2 and err.startswith(f"trainsim: error: {bad}:11: cluster.gpu_hour_price: got -3; expected US dollars")


def _seconds(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit]


def test_estimate_gives_the_cost_of_its_estimated_iteration():
    # the dollars by hand from the step time estimate prints: seconds / 3600 x 8 GPUs x $2.5
    code, text, _ = _cli(["estimate", *TINY, "--gpu-hour-price", "2.5"])
    assert code == 0
    lines = text.splitlines()
    T = _seconds(next(x for x in lines if x.startswith("  step ")).split(None, 1)[1])
    line = next(x for x in lines if x.startswith("cost "))
    m = re.fullmatch(r"cost \$(\S+) per iteration; \$(\S+) per million tokens \((\S+) GPU-hours per iteration\)", line)
    assert m, line
    per_iteration, per_million, gpu_hours = (float(g) for g in m.groups())
    # (the printed time and dollars keep 4 significant digits)
    assert per_iteration == pytest.approx(T / 3600 * 8 * 2.5, rel=1e-3)
    assert per_million == pytest.approx(T / 3600 * 8 * 2.5 / (16 * 512) * 1e6, rel=1e-3)
    assert gpu_hours == pytest.approx(T / 3600 * 8, rel=1e-3)
    # --json: the same figures from the unrounded step time
    s = json.loads(_cli(["estimate", *TINY, "--gpu-hour-price", "2.5", "--json"])[1])
    step = s["time"]["step"]
    assert step == pytest.approx(T, abs=5e-7)
    assert s["cost_per_iteration_usd"] == pytest.approx(step / 3600 * 8 * 2.5, rel=1e-12)
    assert s["cost_per_million_tokens_usd"] == pytest.approx(step / 3600 * 8 * 2.5 / (16 * 512) * 1e6, rel=1e-12)
    assert s["gpu_hours_per_iteration"] == pytest.approx(step / 3600 * 8, rel=1e-12)
    # no price: no cost line, null figures
    plain = json.loads(_cli(["estimate", *TINY, "--json"])[1])
    assert plain["cost_per_iteration_usd"] is None and plain["cost_per_million_tokens_usd"] is None
    assert not any(x.startswith("cost ") for x in _cli(["estimate", *TINY])[1].splitlines())
    # a bad price: one line naming the field, the value and what is allowed, exit 2
    code, out, err = _cli(["estimate", *TINY, "--gpu-hour-price", "free"])
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "--gpu-hour-price" in err and "free" in err
