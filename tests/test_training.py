"""One training iteration end to end: passes, DDP overlap, TP across nodes, metrics, CLI."""

import json
import math
from dataclasses import replace

import pytest

from sim.cli import main
from sim.inputs.hardware import load_profile
from sim.inputs.pacing import paced
from sim.results.metrics import iteration_metrics, rank_breakdown
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.program.schedules import build_schedule, to_program
from sim.engine.core import simulate
from sim.inputs.topology_build import NodeSpec, build_cluster, load_topology
from sim.program.segments import StepSegments
from sim.program.training import build_program
from sim.inputs.schema import SimulationSettings
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
TINY = gpt("tiny", 8, 1024, 16, 8192, 512)


def _free_cluster(nodes=1, gpus=8):
    """A cluster whose links are infinitely fast with no latency: communication is free."""
    spec = NodeSpec("free", gpus, "h100-sxm", math.inf, 0.0, math.inf, 0.0, gpus, "ib", math.inf, 0.0)
    return build_cluster(spec, nodes)


@pytest.mark.parametrize("schedule,vpp", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-h2", 1)])
def test_free_communication_gives_the_schedule_alone(schedule, vpp):
    # Through every pass on a free network, the pipeline ends exactly when the bare
    # schedule (steps priced the same, dependencies without transfers) ends.
    plan = ParallelPlan(pp=4, vpp=vpp, global_batch_size=8, schedule=schedule)
    run = simulate_training(Job(TINY, plan, H100, _free_cluster()))
    seg = StepSegments(TINY, plan, paced(H100, plan.world_size))  # (the job's pace, as the simulator prices it)
    sched = build_schedule(schedule, 4, 8, vpp)
    bare = simulate(to_program(sched, lambda st: sum(s.duration_s for s in seg._cache(st.stage, st.kind))),
                    _free_cluster())
    pipe_end = max(s.end_s for s in run.trace.spans if s.category in ("F", "B", "I", "W"))
    assert pipe_end == pytest.approx(bare.end_s, rel=1e-12)


def test_ddp_overlap_hides_more_with_more_buckets_and_all_on_a_free_network():
    # Exposed DP time is the sync still running when backward ends. One bucket exposes
    # the whole all-reduce; two expose about half; one bucket per layer only the last
    # layers'. (Counts in between are not strictly ordered: the size of the last bucket
    # decides, as with DDP.)
    model = gpt("ddp", 8, 1024, 16, 8192, 2048)
    topo = load_topology("dgx-h100", nodes=2)
    total = 2 * model.num_params

    def exposed(bucket):
        plan = ParallelPlan(dp=16, micro_batch_size=4, global_batch_size=64, bucket_size_bytes=bucket)
        return rank_breakdown(simulate_training(Job(model, plan, H100, topo)).trace, 0)["exposed_comm_s"]["dp"]

    one, two, per_layer = exposed(total + 1), exposed(total // 2 + 1), exposed(2**20)
    assert one > two > per_layer > 0
    for k in (3, 4, 5, 8):
        assert exposed(total // k + 1) < one
    # (a profile of no GPU NCCL's tables know, so no per-step latencies of NCCL's: the
    # links', here none; sim.engine.nccl_tuning)
    links_only = replace(H100, name="links-only")
    free = simulate_training(Job(model, ParallelPlan(dp=16, micro_batch_size=4, global_batch_size=64), links_only,
                                 _free_cluster(2)))
    # on a free network only the last bucket's NCCL base latency is left: the tuner's
    # cheapest, ring under LL, 6.6 us (baseLatencies in NVIDIA/nccl src/graph/tuning.cc)
    assert rank_breakdown(free.trace, 0)["exposed_comm_s"]["dp"] == pytest.approx(6.6e-6, rel=1e-9)


def test_no_overlap_exposes_the_whole_sync():
    topo = load_topology("dgx-h100", nodes=2)
    on = simulate_training(Job(TINY, ParallelPlan(dp=16, global_batch_size=16), H100, topo))
    off = simulate_training(Job(TINY, ParallelPlan(dp=16, global_batch_size=16, dp_overlap=False), H100, topo))
    assert off.trace.end_s > on.trace.end_s
    dp_off = [s for s in off.trace.spans_of(0) if s.category == "dp"]
    last_b = max(s.end_s for s in off.trace.spans_of(0) if s.category == "B")
    assert min(s.start_s for s in dp_off) >= last_b


def test_gradient_accumulation_syncs_once_per_step():
    topo = load_topology("dgx-h100", nodes=2)
    counts = {}
    for m in (1, 4):
        plan = ParallelPlan(dp=16, global_batch_size=16 * m)
        run = simulate_training(Job(TINY, plan, H100, topo))
        counts[m] = (len([s for s in run.trace.spans_of(0) if s.category == "dp"]),
                     sum(s.nbytes for s in run.trace.spans_of(0) if s.category == "dp"))
        assert len([s for s in run.trace.spans_of(0) if s.category == "B"]) > 0
    assert counts[1] == counts[4]
    # the synced bytes are the rank's gradients: 2 bytes per parameter (tp = pp = 1)
    assert counts[1][1] == pytest.approx(2 * TINY.num_params)


def test_tp_across_a_node_boundary_is_markedly_slower_and_the_trace_shows_infiniband():
    # Same 16 GPUs, same work per GPU: tp 8 x dp 2 against tp 16 across two nodes.
    model = gpt("tp-model", 4, 4096, 32, 32000, 2048)
    topo = load_topology("dgx-h100", nodes=2)
    # coalesce_tp=False keeps every tensor-parallel transfer in the trace; rings both
    # (NCCL_ALGO=ring), so that only where the ring runs differs
    ring = SimulationSettings(fidelity="full", nccl_algo="ring", nccl_protocol="simple")
    t8 = simulate_training(Job(model, ParallelPlan(tp=8, dp=2, global_batch_size=4), H100, topo), ring,
                           coalesce_tp=False)
    t16 = simulate_training(Job(model, ParallelPlan(tp=16, dp=1, global_batch_size=4), H100, topo), ring,
                            coalesce_tp=False)
    assert t16.trace.end_s > 1.3 * t8.trace.end_s
    exp8 = rank_breakdown(t8.trace, 0)["exposed_comm_s"]["tp"]
    exp16 = rank_breakdown(t16.trace, 0)["exposed_comm_s"]["tp"]
    assert exp16 > 3 * exp8
    # Why: tensor-parallel transfers cross InfiniBand only when tp spans two nodes.
    def tp_media(run):
        return {t.medium for t in run.trace.transfers if t.label.startswith("tp ")}
    assert tp_media(t8) == {"nvlink"}
    assert "ib" in tp_media(t16)


def test_metrics_are_consistent():
    plan = ParallelPlan(dp=2, tp=2, pp=2, global_batch_size=8)
    run = simulate_training(Job(TINY, plan, H100, load_topology("dgx-h100")))
    flops = 1e15
    met = iteration_metrics(run.trace, tokens=8 * 512, model_flops=flops, hardware_flops=flops, gpus=8,
                            peak_flops=H100.peak())
    T = run.trace.end_s
    assert met["tokens_per_s"] == pytest.approx(8 * 512 / T)
    assert met["mfu"] == pytest.approx(met["tflops_per_gpu"] * 1e12 / H100.peak())
    # The critical rank's breakdown adds up to the iteration time.
    parts = met["compute_s"] + met["idle_s"] + sum(met["exposed_comm_s"].values())
    assert parts == pytest.approx(T, rel=1e-9)
    assert 0 < met["bubble_fraction"] < 1


def test_program_counts_p2p_pairs():
    plan = ParallelPlan(pp=4, global_batch_size=8, schedule="1f1b")
    _, prog = build_program(TINY, plan, H100)
    sends = sum(1 for acts in prog.actions.values() for a in acts if a.kind == "send")
    # each of m micro-batches crosses p-1 boundaries forward and p-1 backward
    assert sends == 8 * 3 * 2


def _run_json(capsys, *argv):
    assert main(["run", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


ARGS = ["--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16", "--vocab-size", "8192",
        "--seq-length", "512", "--gpu", "h100-sxm"]


def test_run_json_has_the_promised_fields(capsys):
    out = _run_json(capsys, *ARGS, "--nodes", "1", "--tensor-model-parallel-size", "2",
                    "--pipeline-model-parallel-size", "2", "--global-batch-size", "8")
    for key in ("iteration_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "bubble_fraction", "exposed_comm_s",
                "params", "fits", "memory"):
        assert key in out
    assert set(out["memory"]) >= {"parameters_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                                  "peak_bytes"}
    assert set(out["exposed_comm_s"]) >= {"tp", "pp", "dp"}
    assert out["plan"]["dp"] == 2 and out["gpus"] == 8
    assert out["tokens_per_s"] == pytest.approx(8 * 512 / out["iteration_time_s"])


def test_run_is_deterministic_and_writes_outputs(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        assert main(["run", *ARGS, "--pipeline-model-parallel-size", "2", "--global-batch-size", "4",
                     "--out", str(d)]) == 0
    capsys.readouterr()
    for name in ("summary.json", "trace.json", "timeline.png"):
        assert (a / name).exists()
    assert (a / "summary.json").read_bytes() == (b / "summary.json").read_bytes()
    assert (a / "trace.json").read_bytes() == (b / "trace.json").read_bytes()
    names = [e["args"]["name"] for e in json.loads((a / "trace.json").read_text())["traceEvents"]
             if e.get("name") == "process_name"]
    assert "node 0 / GPU 1 (stage 1, tp 0, dp 0)" in names


@pytest.mark.parametrize("extra,needle", [
    (["--tensor-model-parallel-size", "3"], "--tensor-model-parallel-size: got 3"),
    (["--pipeline-model-parallel-size", "3"], "pp"),
    (["--gpus", "12", "--tensor-model-parallel-size", "8"], "--gpus"),
    (["--global-batch-size", "3", "--gpus", "2"], "--global-batch-size: got 3"),
    (["--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2",
      "--global-batch-size", "3"], "multiple of pp"),
    (["--schedule", "pipedream"], "--schedule"),
    (["--schedule", "nope.csv"], "no such schedule file"),
    (["--nodes", "1", "--gpus", "16"], "has 8"),
])
def test_invalid_plans_are_one_line_errors(capsys, extra, needle):
    assert main(["run", *ARGS, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_experiment_file_and_override(tmp_path, capsys):
    f = tmp_path / "exp.toml"
    f.write_text(
        "[model]\nnum_layers = 8\nhidden_size = 1024\nnum_attention_heads = 16\nvocab_size = 8192\nseq_length = 512\n"
        "[cluster]\ngpu = 'h100-sxm'\nnodes = 1\n"
        "[plan]\npipeline_model_parallel_size = 2\nglobal_batch_size = 8\nschedule = 'gpipe'\n"
    )
    out = _run_json(capsys, str(f))
    assert out["schedule"] == "gpipe" and out["plan"]["dp"] == 4
    over = _run_json(capsys, str(f), "--schedule", "1f1b")
    assert over["schedule"] == "1f1b"
    f.write_text(f.read_text() + "colour = 'red'\n")
    assert main(["run", str(f)]) == 2
    assert "exp.toml:14: plan.colour: unknown key" in capsys.readouterr().err
    f.write_text("[plan]\nglobal_batch_size = 'eight'\n")
    assert main(["run", str(f)]) == 2
    assert "plan.global_batch_size: got 'eight'; expected an integer" in capsys.readouterr().err


def test_custom_schedule_csv(tmp_path, capsys):
    from sim.program.schedule_io import to_csv

    # GPipe's steps as a file run as GPipe does (1F1B's would not: Megatron-Core's own 1F1B waits
    # for each pipeline send, sim.inputs.frameworks.p2p_blocks, and a user's file runs them beside)
    path = tmp_path / "mine.csv"
    path.write_text(to_csv(build_schedule("gpipe", 2, 4)))
    out = _run_json(capsys, *ARGS, "--pipeline-model-parallel-size", "2", "--gpus", "2", "--global-batch-size", "4",
                    "--schedule", str(path))
    ref = _run_json(capsys, *ARGS, "--pipeline-model-parallel-size", "2", "--gpus", "2", "--global-batch-size", "4",
                    "--schedule", "gpipe")
    assert out["iteration_time_s"] == ref["iteration_time_s"] and out["schedule"] == "mine"


@pytest.mark.parametrize("plan", [
    ParallelPlan(tp=8, dp=2, global_batch_size=8),
    ParallelPlan(tp=8, pp=2, dp=1, global_batch_size=8, schedule="1f1b"),
    ParallelPlan(tp=8, pp=2, dp=1, global_batch_size=8, schedule="zb-h1"),
    ParallelPlan(tp=8, dp=2, global_batch_size=8, zero_stage=3),
    ParallelPlan(tp=8, dp=2, global_batch_size=8, zero_stage=2, sequence_parallel=True),
])
def test_coalescing_isolated_tp_collectives_keeps_the_iteration_time(plan):
    from dataclasses import replace

    model = gpt("co", 4, 2048, 16, 8192, 1024)
    topo = load_topology("dgx-h100", nodes=2)
    # (without the compute slowdown under overlapped NCCL kernels, which the closed form
    # shifts a little: see tests/test_properties.py)
    prof = replace(H100, overlap_compute_slowdown=0.0)
    on = simulate_training(Job(model, plan, prof, topo))
    off = simulate_training(Job(model, plan, prof, topo), coalesce_tp=False)
    assert any(a.kind == "comm" for acts in on.program.actions.values() for a in acts)  # it did coalesce
    assert len(on.program) < len(off.program)
    assert on.trace.end_s == pytest.approx(off.trace.end_s, rel=1e-3)
    # the same time is spent communicating (how it splits between tp and dp where they
    # overlap depends on the order of the pieces inside a layer)
    b_on, b_off = rank_breakdown(on.trace, 0), rank_breakdown(off.trace, 0)
    assert sum(b_on["exposed_comm_s"].values()) == pytest.approx(sum(b_off["exposed_comm_s"].values()), rel=1e-3)
    assert b_on["compute_s"] == pytest.approx(b_off["compute_s"], rel=1e-9)


def test_no_coalescing_when_tp_shares_nvlink_with_other_traffic():
    from sim.program.coalesce import isolated_tp_pricer

    topo = load_topology("dgx-h100", nodes=2)
    eff = H100.link_efficiencies()
    assert isolated_tp_pricer(ParallelPlan(tp=8, dp=2, global_batch_size=8), topo, eff) is not None
    assert isolated_tp_pricer(ParallelPlan(tp=4, dp=4, global_batch_size=8), topo, eff) is None  # dp inside a node
    assert isolated_tp_pricer(ParallelPlan(tp=4, pp=2, dp=2, global_batch_size=8), topo, eff) is None  # pp inside
    assert isolated_tp_pricer(ParallelPlan(tp=16, global_batch_size=8), topo, eff) is None  # tp across nodes


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16)])
def test_bubble_fraction_metric_is_the_closed_form_for_1f1b(make_star, p, m):
    # With free communication and equal F/B times the metric (idle share of the iteration
    # on the critical rank) is (p-1)/(m+p-1) (Huang et al. 2019; Narayanan et al. SC'21).
    tr = simulate(to_program(build_schedule("1f1b", p, m), lambda st: 1.0 if st.kind == "F" else 2.0),
                  make_star([1.0] * p))
    met = iteration_metrics(tr, tokens=1, model_flops=1, hardware_flops=1, gpus=p, peak_flops=1)
    assert met["bubble_fraction"] == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)


def test_interleaved_p2p_crosses_every_virtual_stage_boundary():
    # v chunks per rank: each micro-batch crosses p·v - 1 boundaries forward and as many
    # backward, including the wrap from the last rank's chunk c to the first rank's c + 1
    # (v times the p2p traffic of 1F1B, Narayanan et al. SC'21).
    p, v, m = 4, 2, 8
    _, prog = build_program(TINY, ParallelPlan(pp=p, vpp=v, global_batch_size=m), H100)
    sends = [(r, a.peer) for r, acts in prog.actions.items() for a in acts if a.kind == "send"]
    assert len(sends) == m * (p * v - 1) * 2
    assert sum(1 for r, peer in sends if (r, peer) == (p - 1, 0)) == m * (v - 1)  # forward wrap-around


@pytest.mark.parametrize("sp", [False, True])
def test_megatron_tp_collectives_inside_each_layer(sp):
    # Megatron-LM (Shoeybi et al.; Korthikanti et al. for sequence parallelism): per layer
    # the forward all-reduces its attention and MLP outputs (2sbh bytes in 16-bit), the
    # backward its two input gradients; with sequence parallelism each all-reduce becomes
    # a reduce-scatter + all-gather pair, and backward re-gathers the two sharded inputs
    # of the weight-gradient GEMMs.
    model = gpt("tp", 2, 1024, 16, 8192, 512)
    _, prog = build_program(model, ParallelPlan(tp=2, global_batch_size=1, sequence_parallel=sp), H100)
    nbytes = 2 * 512 * 1 * 1024
    for layer in range(model.num_layers):
        ops = {}
        for a in prog.actions[0]:
            if a.kind == "collective" and a.layer == layer:
                ops.setdefault((a.name.split(".")[0][1], a.op), []).append(a.nbytes)
        expected = ({("F", "allgather"): 2, ("F", "reducescatter"): 2, ("B", "allgather"): 4,
                     ("B", "reducescatter"): 2} if sp else {("F", "allreduce"): 2, ("B", "allreduce"): 2})
        assert {k: len(v) for k, v in ops.items()} == expected
        assert all(b == nbytes for v in ops.values() for b in v)


def test_run_mfu_is_korthikanti_eq7_over_the_iteration(capsys):
    # MFU = 72·B·L·s·h²·(1 + s/(6h) + V/(12hL)) / (T · GPUs · peak) (Korthikanti Eq. 7),
    # with B the global batch, T the simulated iteration time, H100 peak 989 TFLOP/s.
    out = _run_json(capsys, *ARGS, "--gpus", "4", "--pipeline-model-parallel-size", "2", "--global-batch-size", "8")
    B, L, s, h, V = 8, 8, 512, 1024, 8192
    eq7 = 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    T = out["iteration_time_s"]
    assert out["mfu"] == pytest.approx(eq7 / (T * 4 * 989e12), rel=1e-9)
    assert out["tflops_per_gpu"] == pytest.approx(eq7 / T / 4 / 1e12, rel=1e-9)
    assert out["hfu"] == out["mfu"]  # nothing recomputed
