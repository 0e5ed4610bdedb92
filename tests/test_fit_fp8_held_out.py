"""experiments/fit_fp8_held_out.py: the FP8 group of a fit report predicted at an FP8 cap
measured outside the fit, from the fraction (and spread) its held-out fit found."""

import csv
import json
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"
sys.path.insert(0, str(EXPERIMENTS))


def _csv(path):
    cols = ["source", "gpu", "precision", "gpus", "num_layers", "hidden_size", "num_attention_heads", "vocab_size",
            "seq_length", "tensor_model_parallel_size", "global_batch_size", "fp8_format", "measured_iteration_time_s"]
    rows = [("a", "bf16", 2, 0.050), ("a", "bf16", 4, 0.052), ("b", "bf16", 2, 0.080), ("b", "bf16", 4, 0.083),
            ("c", "fp8", 2, 0.040), ("c", "fp8", 4, 0.042)]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for src, prec, gpus, t in rows:
            w.writerow({"source": src, "gpu": "h100-sxm", "precision": prec, "gpus": gpus, "num_layers": 2,
                        "hidden_size": 1024 if src == "b" else 512, "num_attention_heads": 8, "vocab_size": 4096,
                        "seq_length": 512, "tensor_model_parallel_size": 2, "global_batch_size": gpus,
                        "fp8_format": "hybrid" if prec == "fp8" else "", "measured_iteration_time_s": t})
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from sim.calibrate.fit_runs import fit_runs

    path = _csv(tmp_path_factory.mktemp("fp8ho") / "runs.csv")
    return fit_runs(path, "h100-sxm", ["sustained_compute_fraction", "fp8_gemm_max_efficiency"])


def test_at_the_held_out_fits_own_cap_it_gives_the_fits_held_out_times(report):
    import fit_fp8_held_out as mod

    fp8 = next(g for g in report["groups"] if g["precision"].startswith("fp8"))
    cap = fp8["held_out_fit"]["fp8_gemm_max_efficiency"]
    res = mod.held_out_at_cap(report, cap)
    (g,) = res["groups"]
    assert g["id"] == fp8["id"] and [r["line"] for r in g["rows"]] == fp8["lines"]
    by_line = {r["line"]: r for r in report["rows"]}
    for r in g["rows"]:
        assert r["simulated_s"] == pytest.approx(by_line[r["line"]]["held_out_s"], rel=1e-9)
        assert r["error"] == pytest.approx(r["simulated_s"] / r["measured_s"] - 1)
    # the fraction is the held-out fit's, the cap the one asked for
    assert g["values"]["sustained_compute_fraction"] == fp8["held_out_fit"]["sustained_compute_fraction"]
    assert g["mean_abs_error"] == pytest.approx(sum(abs(r["error"]) for r in g["rows"]) / len(g["rows"]))


def test_a_higher_cap_predicts_faster_fp8_rows_and_the_cli_writes_its_files(report, tmp_path):
    import fit_fp8_held_out as mod

    low = mod.held_out_at_cap(report, 0.6)["groups"][0]["rows"]
    src = tmp_path / "fit.json"
    src.write_text(json.dumps(report))
    high = mod.main([str(src), "--cap", "0.8", "--out", str(tmp_path / "out")])["groups"][0]["rows"]
    assert all(h["simulated_s"] < l["simulated_s"] for h, l in zip(high, low))
    assert json.loads((tmp_path / "out" / "results.json").read_text())["cap"] == 0.8
    assert "held out at the FP8 cap 0.8000" in (tmp_path / "out" / "verdict.md").read_text()
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"name": "h100-sxm"}))
    for args in ([str(src), "--cap", "1.5"], [str(src), "--data", str(tmp_path / "none.csv")],
                 [str(src), "--data", str(src)], [str(profile)]):
        with pytest.raises(SystemExit):
            mod.main([*args, "--out", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()
