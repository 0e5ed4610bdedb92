"""``trainsim collective`` and ``trainsim demo`` as a user runs them."""

import json
import subprocess
import sys

import pytest

from sim.cli import main


def test_json_output_has_nccl_tests_figures(capsys):
    assert main(["collective", "--op", "allreduce", "--size", "1GiB", "--gpus", "8", "--topology", "dgx-h100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"time_s", "algbw_Bps", "busbw_Bps"}
    assert out["algbw_Bps"] == pytest.approx(2**30 / out["time_s"])
    assert out["busbw_Bps"] == pytest.approx(out["algbw_Bps"] * 2 * 7 / 8)


def test_gpus_beyond_one_node_add_nodes(capsys):
    assert main(["collective", "--gpus", "16", "--size", "64MiB", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"] == 2


def test_out_writes_trace_png_and_summary(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["collective", "--gpus", "16", "--algo", "hierarchical", "--size", "32MiB", "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"trace.json", "timeline.png", "summary.json"}
    assert "busbw" in capsys.readouterr().out


@pytest.mark.parametrize("argv,needle", [
    (["collective", "--topology", "dgx-z9"], "topology: got 'dgx-z9'"),
    (["collective", "--size", "-1GiB"], "--size"),
    (["collective", "--size", "lots"], "--size"),
    (["collective", "--gpus", "64", "--nodes", "2"], "--gpus: got 64"),
    (["collective", "--gpus", "0"], "--gpus"),
    (["collective", "--op", "allsum"], "--op"),
    (["collective", "--algo", "tree"], "--algo"),
    (["collective", "--gpus", "12", "--algo", "hierarchical"], "same number of ranks on every node"),
    (["collective", "--fabric", "torus", "--nodes", "2"], "--fabric"),
])
def test_bad_input_is_one_line_with_exit_code_2(tmp_path, capsys, argv, needle):
    out = tmp_path / "never"
    assert main(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainsim: error:") and needle in err[0]
    assert not out.exists()


def test_malformed_topology_file_and_unknown_key(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[cluster]\nnode = 'dgx-h100'\nnodes = 2\nspeed = 3\n")
    assert main(["collective", "--topology", str(bad)]) == 2
    assert "cluster.speed: unknown key" in capsys.readouterr().err
    bad.write_text("this is = = not toml")
    assert main(["collective", "--topology", str(bad)]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_python_dash_m_sim_runs_without_traceback():
    r = subprocess.run([sys.executable, "-m", "sim", "collective", "--size", "-3"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_demo_writes_its_plots(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--nodes", "2"]) == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert {"allreduce-ring.png", "allreduce-hierarchical.png", "allreduce-busbw.png", "demo.json"} <= names
