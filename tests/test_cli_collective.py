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
    (["collective", "--algo", "collnet"], "--algo"),
    (["collective", "--gpus", "12", "--algo", "hierarchical"], "same number of ranks on every node"),
    (["collective", "--fabric", "torus", "--nodes", "2"], "--fabric"),
    (["collective", "--gpus", "1"], "--gpus: got 1; allreduce needs at least 2 GPUs"),
    (["collective", "--topology", "example-custom", "--nodes", "2"], "--nodes: got 2"),
    (["collective", "--topology", "example-custom", "--fabric", "fat-tree"], "--fabric"),
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


def _json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("topology,gpus,published_GBps", [
    # REFERENCE.md: ~230 GB/s all-reduce busbw inside a DGX A100; 192 GB/s measured across
    # DGX A100 nodes with 8 HDR NICs; ~370 GB/s effective NVLink on 8 H100 (ring).
    ("dgx-a100", 8, 230), ("dgx-a100", 16, 192), ("dgx-h100", 8, 370),
])
def test_large_allreduce_busbw_near_published_measurements(capsys, topology, gpus, published_GBps):
    out = _json(capsys, ["collective", "--topology", topology, "--gpus", str(gpus), "--size", "8GiB", "--algo", "ring"])
    assert out["busbw_Bps"] / 1e9 == pytest.approx(published_GBps, rel=0.02)


def test_a_topology_file_written_by_the_user(tmp_path, capsys):
    # A node file: 4 GPUs on a 100 GB/s NVSwitch, 1 us per link (2 us GPU to GPU).
    node = tmp_path / "mynode.toml"
    node.write_text("[node]\ngpus = 4\nnvlink_bandwidth_GBps = 100\nnvlink_latency_us = 1\n"
                    "nic_bandwidth_GBps = 10\n")
    out = _json(capsys, ["collective", "--topology", str(node), "--size", "64MiB", "--line-rate"])
    n, S, alpha, B = 4, 64 * 2**20, 2e-6, 100e9
    # the tuner's ring under Simple: NCCL's base latency (8.4 us, baseLatencies in
    # NVIDIA/nccl src/graph/tuning.cc) + the ring's steps
    assert (out["algo"], out["protocol"], out["base_latency_s"]) == ("ring", "simple", 8.4e-6)
    assert out["gpus"] == n and out["time_s"] == pytest.approx(8.4e-6 + 2 * (n - 1) * (alpha + S / (n * B)), rel=1e-9)
    # A graph file, device by device: three GPUs in a line a - b - c (GPUs never carry
    # transit traffic, so a and c need the switch): a ring all-gather over 3 ranks.
    graph = tmp_path / "line.toml"
    graph.write_text("".join(f"[[device]]\nid = 'g{i}'\nkind = 'gpu'\nrank = {i}\nnode = 0\n\n" for i in range(3))
                     + "[[device]]\nid = 'sw'\nkind = 'switch'\n\n"
                     + "".join(f"[[link]]\na = 'g{i}'\nb = 'sw'\nkind = 'pcie'\nbandwidth_GBps = 20\nlatency_us = 3\n\n"
                               for i in range(3)))
    out = _json(capsys, ["collective", "--topology", str(graph), "--op", "allgather", "--size", "3MiB"])
    S = 3 * 2**20
    assert (out["algo"], out["protocol"]) == ("ring", "simple")
    assert out["time_s"] == pytest.approx(8.4e-6 + 2 * (6e-6 + S / (3 * 20e9)), rel=1e-9)
    assert out["bytes_by_link_kind"] == {"pcie": pytest.approx(2 * 2 * S)}   # 2 steps x 3 hops x 2 links x S/3


def test_same_command_twice_writes_identical_files(tmp_path, capsys):
    argv = ["collective", "--gpus", "16", "--algo", "hierarchical", "--size", "8MiB", "--fabric", "fat-tree"]
    assert main(argv + ["--out", str(tmp_path / "a")]) == 0
    assert main(argv + ["--out", str(tmp_path / "b")]) == 0
    for name in ("trace.json", "summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_timeline_png_has_ranks_on_y_time_on_x_and_colours_by_kind(tmp_path, capsys, monkeypatch):
    import matplotlib.colors as mcolors

    import sim.results.plot

    figs = []
    real_save = sim.results.plot.save_png
    monkeypatch.setattr(sim.results.plot, "save_png", lambda fig, path: (figs.append(fig), real_save(fig, path))[1])
    assert main(["collective", "--gpus", "16", "--size", "16MiB", "--out", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    (fig,) = figs
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    # ranks drawn alike are drawn once, "rank r ×N" (issue 44); together they are all 16
    drawn_ranks = [(int(x.split()[1]), int(x.split("×")[1].split()[0]) if "×" in x else 1)
                   for x in labels if x.endswith("· sends")]
    assert [x for x in labels if x.endswith("· comm")] == [x.replace("sends", "comm") for x in labels
                                                            if x.endswith("· sends")]
    assert sum(n for _, n in drawn_ranks) == 16 and drawn_ranks[0][0] == 0
    assert ax.get_xlabel() == "time (ms)"
    assert ax.get_xlim()[1] >= summary["time_s"] * 1e3
    # one colour per kind: the collective, and each kind of link a transfer crossed
    legend = {t.get_text(): mcolors.to_hex(h.get_facecolor()) for t, h in
              zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles)}
    assert set(legend) == {"allreduce", "transfer over NVLink", "transfer over InfiniBand"}
    assert len(set(legend.values())) == 3
    drawn = {mcolors.to_hex(c) for coll in ax.collections for c in coll.get_facecolors()}
    assert drawn == set(legend.values())
    # readable: at least 40 pixels per lane, tick labels of 8 pt
    height_px = fig.get_size_inches()[1] * fig.dpi
    assert height_px / len(labels) >= 40 and all(t.get_fontsize() >= 8 for t in ax.get_yticklabels())
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"
