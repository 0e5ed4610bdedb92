"""Mixed clusters (issue 24 item 2): nodes of different GPU types in one topology, each
GPU priced on its own profile, uneven layer splits given or balanced, data-parallel
groups across types running at their slowest member's pace."""

import itertools
import json

import pytest

from sim.cli import main
from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.mixed_gpus import mixed_gpus
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.program.stage_balance import balanced_split, stage_costs, stage_time_s
from sim.results.stragglers import waits
from sim.inputs.schema import SimulationSettings
from sim.session import Job, simulate_training

A100, H100 = load_profile("a100-80gb"), load_profile("h100-sxm")
SMALL = gpt("small", 4, 1024, 16, 1024, 512)
RING = {"nccl_algo": "ring", "nccl_protocol": "simple"}
TINY = ["--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16", "--vocab-size", "1024",
        "--seq-length", "512", "--global-batch-size", "4"]


@pytest.fixture
def mixed_file(tmp_path):
    path = tmp_path / "mixed.toml"
    path.write_text('[cluster]\nname = "a100-h100"\nnode = ["dgx-a100", "dgx-h100"]\nnodes = [1, 1]\n')
    return path


def test_a_cluster_file_of_two_node_kinds(mixed_file):
    topo = load_topology(str(mixed_file))
    g = topo.graph
    assert topo.num_gpus == 16 and topo.name == "a100-h100"
    assert [g.nodes[topo.gpu(r)]["gpu_profile"] for r in (0, 7, 8, 15)] == ["a100-80gb"] * 2 + ["h100-sxm"] * 2
    assert topo.node_of(7) == 0 and topo.node_of(8) == 1
    # each NIC at its own node's rate (topologies/dgx-*.toml: HDR 25 GB/s, NDR 50 GB/s)
    assert topo.link("node0/nic0", "rail0/leaf0")["bandwidth_Bps"] == 25e9
    assert topo.link("node1/nic0", "rail0/leaf0")["bandwidth_Bps"] == 50e9
    assert topo.link("node1/gpu0", "node1/nvswitch")["bandwidth_Bps"] == 450e9
    mx = mixed_gpus(topo, 16, A100)
    assert mx.counts() == {"a100-80gb": 8, "h100-sxm": 8}
    assert mx.stage_types(ParallelPlan(tp=8, pp=2)) == [("a100-80gb",), ("h100-sxm",)]
    assert mx.stage_types(ParallelPlan(tp=8, dp=2)) == [("a100-80gb", "h100-sxm")]
    assert mixed_gpus(topo, 8, A100) is None  # the plan's 8 GPUs are all A100s
    assert mixed_gpus(load_topology("dgx-a100", nodes=2), 16, H100) is None


def test_bad_mixed_cluster_files_are_one_line_errors(tmp_path, capsys):
    cases = {'node = ["dgx-a100", "dgx-h100"]\nnodes = [1]\n': "cluster.nodes: got [1]; expected a list of 2",
             'node = ["dgx-a100", "dgx-h9"]\nnodes = [1, 1]\n': "cluster.node[1]",
             'node = ["dgx-a100", 3]\nnodes = [1, 1]\n': "cluster.node: got ['dgx-a100', 3]"}
    for body, needle in cases.items():
        path = tmp_path / "bad.toml"
        path.write_text("[cluster]\n" + body)
        with pytest.raises(InputError, match=__import__("re").escape(needle)):
            load_topology(str(path))
    good = tmp_path / "good.toml"
    good.write_text('[cluster]\nnode = ["dgx-a100", "dgx-h100"]\nnodes = [1, 1]\n')
    assert main(["run", *TINY, "--topology", str(good), "--nodes", "2", "--gpus", "16",
                 "--tensor-model-parallel-size", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--nodes: got 2;" in err and "fixes its own size" in err


def test_a_data_parallel_group_across_types_runs_at_the_slowest_members_pace(mixed_file):
    # dp 2 x tp 8: one replica on the A100 node, one on the H100 node. The H100 replica
    # finishes each bucket first and waits; the step is the all-A100 cluster's to the bit
    # (the ring between them crosses an A100 NIC, as on two A100 nodes).
    mixed_topo = load_topology(str(mixed_file))
    mx = mixed_gpus(mixed_topo, 16, A100)
    for overlap in (False, True):
        plan = ParallelPlan(tp=8, dp=2, global_batch_size=4, dp_overlap=overlap)
        auto = SimulationSettings(fidelity="auto", **RING)
        mixed = simulate_training(Job(SMALL, plan, A100, mixed_topo, mixed=mx), auto, coalesce_tp=False)
        slow = simulate_training(Job(SMALL, plan, A100, load_topology("dgx-a100", nodes=2)), auto, coalesce_tp=False)
        assert mixed.fidelity == "full" and "several types" in mixed.fidelity_reason
        assert mixed.trace.end_s == pytest.approx(slow.trace.end_s, rel=1e-12)
        waited, waited_on, _ = waits(mixed.trace, mixed.program)
        assert set(waited_on) <= set(range(8)) and set(waited) == set(range(8, 16))


def test_each_rank_computes_at_its_own_gpus_prices(mixed_file):
    # pp 2 x tp 8: stage 0 on A100s, stage 1 on H100s; each stage's compute is what its
    # own GPU's program gives (the same plan on a cluster of that GPU alone).
    mixed_topo = load_topology(str(mixed_file))
    plan = ParallelPlan(tp=8, pp=2, global_batch_size=4)
    run = simulate_training(Job(SMALL, plan, A100, mixed_topo, mixed=mixed_gpus(mixed_topo, 16, A100)),
                            SimulationSettings(fidelity="full", **RING), coalesce_tp=False)
    for profile, rank in ((A100, 0), (H100, 8)):
        alone = simulate_training(Job(SMALL, plan, profile, load_topology("dgx-a100", nodes=2)),
                                  SimulationSettings(fidelity="full", **RING), coalesce_tp=False)
        want = [a.duration_s for a in alone.program.actions[rank] if a.kind == "compute"]
        assert [a.duration_s for a in run.program.actions[rank] if a.kind == "compute"] == want


def test_the_balanced_split_is_the_best_split_by_brute_force():
    model = gpt("m", 12, 1024, 16, 1024, 512)
    for profiles in ([A100, H100, A100], [H100, A100, A100, H100], [A100, A100]):
        plan = ParallelPlan(pp=len(profiles), global_batch_size=8)
        stages = [[p] for p in profiles]
        split = balanced_split(model, plan, stages)
        assert sum(split) == 12 and min(split) >= 1
        best = min(max(stage_time_s(c, model, plan, stages))
                   for c in itertools.product(range(1, 13), repeat=len(profiles)) if sum(c) == 12)
        assert max(stage_time_s(split, model, plan, stages)) == pytest.approx(best, rel=1e-12)
    # a stage across types is priced on its slowest; interleaved, the split is per virtual stage
    plan = ParallelPlan(pp=2, vpp=2, global_batch_size=8, schedule="interleaved")
    assert balanced_split(model, plan, [[A100, H100], [A100]]) == balanced_split(model, plan, [[A100], [A100]])
    split = balanced_split(model, plan, [[A100], [H100]])  # one entry per virtual stage, any count each
    assert len(split) == 4 and sum(split) == 12 and split[1] + split[3] > split[0] + split[2]
    t_a, t_h = stage_costs(model, plan, A100)[0], stage_costs(model, plan, H100)[0]
    assert t_h < t_a  # (the H100 profile is the faster one)


def test_auto_split_puts_more_layers_on_faster_gpus_and_shortens_the_step(mixed_file, capsys):
    # 2,048 tokens a sequence, so that compute, which the split balances, outweighs the tensor-
    # parallel collectives' fixed NCCL latencies (at TINY's 512 the two are alike)
    longer = [*TINY[:-4], "--seq-length", "2048", *TINY[-2:]]
    assert TINY[-4:-2] == ["--seq-length", "512"]
    argv = ["run", *longer, "--topology", str(mixed_file), "--gpus", "16", "--tensor-model-parallel-size", "4",
            "--pipeline-model-parallel-size", "2", "--placement", "tp-dp-pp", "--json"]
    assert main(argv) == 0
    even = json.loads(capsys.readouterr().out)
    assert main([*argv, "--layer-split", "auto"]) == 0
    auto = json.loads(capsys.readouterr().out)
    assert even["mixed"]["layer_split"] == [4, 4] and not even["mixed"]["layer_split_auto"]
    n0, n1 = auto["mixed"]["layer_split"]
    assert n1 > n0 and auto["mixed"]["layer_split_auto"]
    assert [s["gpu_types"] for s in auto["mixed"]["stages"]] == [["a100-80gb"], ["h100-sxm"]]
    assert auto["iteration_time_s"] < even["iteration_time_s"]
    assert auto["plan"]["layer_split"] == [n0, n1]
    peaks = 8 * A100.peak() + 8 * H100.peak()
    assert auto["mixed"]["mfu"] == pytest.approx(auto["mfu"] * 16 * A100.peak() / peaks, rel=1e-12)
    assert main([*argv[:-1], "--layer-split", "3,5"]) == 0
    text = capsys.readouterr().out
    assert "mixed cluster: 8 x a100-80gb, 8 x h100-sxm" in text and "layer split 3,5 (as given)" in text


@pytest.mark.parametrize("flags, needle", [
    (["--layer-split", "3,4"], "layer_split (--layer-split): got '3,4'; adds up to 7; the 2 stages must hold the 8"),
    (["--layer-split", "8"], "has 1 entries; expected one per pipeline stage (pp = 2)"),
    (["--layer-split", "4,x"], "--layer-split: got '4,x'; expected transformer layers per pipeline stage"),
    (["--layer-split", "0,8"], "integers >= 1"),
    (["--layer-split", "auto", "--decoder-first-pipeline-num-layers", "2"], "cannot be combined with first_stage"),
    (["--layer-split", "4,4", "--fidelity", "reduced"], "fidelity: got 'reduced'; GPUs of several types"),
])
def test_bad_layer_splits_are_one_line_errors(flags, needle, mixed_file, capsys, tmp_path):
    argv = ["run", *TINY, "--topology", str(mixed_file), "--gpus", "16", "--tensor-model-parallel-size", "8",
            "--pipeline-model-parallel-size", "2", *flags, "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "o").exists()


def test_a_graph_file_names_each_gpus_profile(tmp_path, capsys):
    # Two GPUs on one NVLink bridge, one of them an H100: dp 2 waits for the A100.
    dev = '[[device]]\nid = "{0}"\nkind = "gpu"\nrank = {1}\nnode = {1}\n{2}'
    text = "\n".join([dev.format("a", 0, ""), dev.format("b", 1, 'gpu_profile = "h100-sxm"\n'),
                      '[[link]]\na = "a"\nb = "b"\nkind = "nvlink"\nbandwidth_GBps = 100.0\n'])
    path = tmp_path / "two.toml"
    path.write_text(text)
    topo = load_topology(str(path))
    assert mixed_gpus(topo, 2, A100).of_rank == ("a100-80gb", "h100-sxm")
    assert main(["run", *TINY, "--topology", str(path), "--gpus", "2", "--gpus-per-node", "1", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["mixed"]["gpu_types"] == {"a100-80gb": 1, "h100-sxm": 1} and s["mixed"]["data_parallel_groups_span_types"]
