"""nccl-tests logs that say which algorithm ran (NCCL_ALGO / NCCL_PROTO) fit that algorithm's
parameters (``sim.calibrate.nccl_tests_algos``, ``trainsim import-nccl-tests``).

The logs are made by the simulator itself (``trainsim collective --sweep``, nccl-tests'
columns) from a profile whose parameters are set here, then fitted back: the expectations
are the parameters put in, not numbers read from the code under test.
"""

from __future__ import annotations

import json

from sim.calibrate.nccl_tests import parse_text
from sim.cli import main
from sim.inputs.hardware import load_profile


def _profile(tmp_path, **changes) -> str:
    d = load_profile("h100-sxm").to_dict()
    d.update(changes)
    d["name"] = "h100-test"
    path = tmp_path / "h100-test.json"
    path.write_text(json.dumps(d))
    return str(path)


def _sweep(capsys, tmp_path, name: str, env: list[str], argv: list[str]) -> str:
    capsys.readouterr()
    assert main(["collective", *argv]) == 0
    body = capsys.readouterr().out
    path = tmp_path / name
    path.write_text("".join(f"{line}\n" for line in env) + "# Collective test starting: all_reduce_perf\n" + body)
    return str(path)


def _import(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main(["import-nccl-tests", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_nvls_log_fits_nvls_efficiency_and_latency_back(tmp_path, capsys):
    prof = _profile(tmp_path, nvls_efficiency=0.6, nvls_latency_s=20e-6)
    log = _sweep(capsys, tmp_path, "nvls.log", ["# NCCL_ALGO=NVLS", "# NCCL_PROTO=Simple"],
                 ["--gpus", "8", "--algo", "nvls", "--gpu", prof, "--sweep", "8:1G"])
    out = _import(capsys, [log, "--ranks", "8", "--profile", prof, "--topology", "dgx-h100"])
    fitted = {f["parameter"]: f for f in out["fitted"]}
    assert abs(fitted["nvls_efficiency"]["value"] / 0.6 - 1) < 0.02
    assert abs(fitted["nvls_latency_s"]["value"] / 20e-6 - 1) < 0.02
    assert fitted["nvls_efficiency"]["logs"] == [log]
    assert "links.ib" not in fitted and "links.nvlink" not in fitted  # an NVLS log says nothing of the links
    # written into the profile with a source naming the log
    assert main(["import-nccl-tests", log, "--ranks", "8", "--profile", "h100-sxm", "--out",
                 str(tmp_path / "out.json")]) == 0
    text = capsys.readouterr().out
    assert "fitted nvls_efficiency" in text and log in text
    p = load_profile(str(tmp_path / "out.json"))
    assert abs(p.nvls_efficiency / 0.6 - 1) < 0.02 and abs(p.nvls_latency_s / 20e-6 - 1) < 0.02
    assert log in p.sources["nvls_efficiency"] and log in p.sources["nvls_latency_s"]
    assert p.links == load_profile("h100-sxm").links


def test_ring_log_fits_the_link_back_and_says_so(tmp_path, capsys):
    eff = 0.7
    prof = load_profile("h100-sxm").to_dict()
    prof["links"]["nvlink"]["efficiency"] = eff
    prof_path = tmp_path / "ring.json"
    prof_path.write_text(json.dumps(prof))
    argv = ["--gpus", "8", "--algo", "ring", "--protocol", "simple", "--gpu", str(prof_path), "--sweep", "1M:1G"]
    named = _sweep(capsys, tmp_path, "ring.log", ["NCCL INFO NCCL_ALGO set by environment to Ring",
                                                  "NCCL INFO NCCL_PROTO set by environment to Simple"], argv)
    plain = _sweep(capsys, tmp_path, "plain.log", [], argv)
    a = _import(capsys, [named, "--ranks", "8", "--link", "nvlink", "--profile", str(prof_path)])
    b = _import(capsys, [plain, "--ranks", "8", "--link", "nvlink", "--profile", str(prof_path)])
    line_rate = load_profile(str(prof_path)).links["nvlink"].bandwidth_Bps
    assert abs(a["bandwidth_Bps"] / (line_rate * eff) - 1) < 0.02
    assert abs(a["link_model"]["efficiency"] / eff - 1) < 0.02
    assert [f["parameter"] for f in a["fitted"]] == ["links.nvlink"] and a["fitted"][0]["logs"] == [named]
    assert a["runs"][0]["algo"] == "ring" and a["runs"][0]["protocol"] == "simple"
    # a log that names no algorithm fits as before, to the same numbers
    assert b["runs"][0]["algo"] is None
    for key in ("latency_s", "bandwidth_Bps", "link_model", "points"):
        assert a[key] == b[key]


def test_a_log_that_names_no_algorithm_is_unchanged(tmp_path, capsys):
    text = ("# Collective test starting: all_reduce_perf\n#       size         count      type   redop    root     time"
            "   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
            "     1048576        262144     float     sum      -1    20.00   52.43   91.75      0    20.00   52.43"
            "   91.75      0\n")
    r = parse_text(text, "x.log", ranks=8)
    assert (r.algo, r.protocol) == (None, None)
    r = parse_text("NCCL_ALGO=Ring,Tree NCCL_PROTO=^LL\n" + text, "x.log", ranks=8)
    assert (r.algo, r.protocol) == (None, None)  # a list or an exclusion: the tuner still chose
    r = parse_text("host:1:1 [0] NCCL INFO NCCL_ALGO set by environment to NVLSTree\n" + text, "x.log", ranks=8)
    assert r.algo == "nvls_tree"


def test_tree_log_is_reported_not_fitted(tmp_path, capsys):
    log = _sweep(capsys, tmp_path, "tree.log", ["# NCCL_ALGO=Tree"], ["--gpus", "16", "--algo", "tree", "--sweep",
                                                                       "1M:64M"])
    assert main(["import-nccl-tests", log, "--ranks", "16", "--profile", "h100-sxm"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tree has no parameter of its own" in err


def test_an_algorithm_the_topology_cannot_run_is_a_one_line_error(tmp_path, capsys):
    log = _sweep(capsys, tmp_path, "nvls.log", ["# NCCL_ALGO=NVLS"], ["--gpus", "8", "--algo", "nvls", "--sweep",
                                                                     "1M:64M"])
    for argv in ([log, "--ranks", "8", "--profile", "a100-80gb"], [log, "--ranks", "16", "--topology", "dgx-h100"]):
        assert main(["import-nccl-tests", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert "NCCL_ALGO: got nvls" in err and "cannot run it" in err
    bad = tmp_path / "collnet.log"
    bad.write_text("# NCCL_ALGO=CollnetDirect\n" + open(log).read())
    assert main(["import-nccl-tests", str(bad), "--ranks", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "NCCL_ALGO: got 'CollnetDirect'" in err and "allowed" in err
