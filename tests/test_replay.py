"""``trainsim replay``: a profiler trace becomes each rank's dependency graph, and the
engine replays it.

Hand-built traces check each kind of dependency: every one is built so that the step
would come out shorter if the edge were missing, and the replayed step is computed by
hand. Communication is priced by the network model: the expected time of a collective or
a transfer is the engine's time for that one operation alone (a separate program of one
action per rank), and the replay must place it where the dependencies say. The what-ifs
are checked against hand-computed values and against ``trainsim run`` itself (its
``--kineto`` traces replayed: same plan within 1%, doubled data parallelism and a
fat-tree with oversubscription 4 within 3%). The real traces in ``../shared/traces``
(tests skip without them) replay within 5% of their measured step.
"""

from __future__ import annotations

import glob
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from sim.cli import main
from sim.program.actions import Action, Program
from sim.replay.graph import Node, RankGraph
from sim.replay.kineto import read_kineto
from sim.replay.run import WhatIf, replay

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
US = 1e-6
H100 = "NVIDIA H100 80GB HBM3"


# ---------------------------------------------------------------- hand-built traces

def rt(name, ts, corr, dur=2, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def launch(ts, corr, tid=1):
    return rt("cudaLaunchKernel", ts, corr, 2, tid)


def kern(ts, dur, corr, stream=7, name="sm90_xmma_gemm_bf16bf16_bf16f32", **args):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"stream": stream, "correlation": corr, "device": 0, **args}}


def cuda_sync(kind, corr, stream, ts=0, **args):
    return {"ph": "X", "cat": "cuda_sync", "name": kind, "pid": 0, "tid": stream, "ts": ts, "dur": 0,
            "args": {"cuda_sync_kind": kind, "stream": stream, "correlation": corr, "device": 0, **args}}


def doc(events, rank=0, world=1, device=H100):
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "deviceProperties": [{"id": 0, "name": device}], "traceEvents": events}


def replayed(*docs, **kw):
    return replay([read_kineto(d) for d in docs], WhatIf(**kw))


def span_end(result, rank, prefix):
    [s] = [s for s in result.trace.spans if s.rank == rank and s.name.startswith(prefix)]
    return s.end_s


def test_launch_edge_keeps_host_time():
    # The host works 500 us before launching B: B cannot start before its launch.
    t = doc([launch(0, 1), kern(10, 100, 1), launch(500, 2), kern(510, 100, 2, name="elementwise_kernel")])
    r = replayed(t)
    assert r.summary["iteration_time_s"] == pytest.approx(600 * US, abs=1e-12)
    assert r.summary["traced_step_s"] == pytest.approx(610 * US, abs=1e-12)
    assert r.summary["critical_path"]["by_category_s"]["host"] == pytest.approx(500 * US, abs=1e-12)


def test_stream_fifo():
    # Launched back to back, B waits for A on their stream: 300 + 100 us.
    t = doc([launch(0, 1), launch(5, 2), kern(10, 300, 1), kern(310, 100, 2)])
    assert replayed(t).summary["iteration_time_s"] == pytest.approx(400 * US, abs=1e-12)


def _event_wait(with_sync_event: bool, with_record: bool = True):
    """A (300 us, stream 7), then the event record, then C (1000 us, stream 7), then stream
    20 waits for the event and runs B (100 us): B waits for A, not for C."""
    ev = [launch(0, 1), kern(10, 300, 1)]
    if with_record:
        ev.append(rt("cudaEventRecord", 6, 2))
    ev += [launch(7, 5), kern(310, 1000, 5, name="other_gemm"), rt("cudaStreamWaitEvent", 8, 3),
           launch(10, 4), kern(310, 100, 4, stream=20, name="waiting_kernel")]
    if with_sync_event:
        ev.append(cuda_sync("Stream Wait Event", 3, 20, wait_on_stream=7, wait_on_cuda_event_record_corr_id=2))
    return doc(ev)


@pytest.mark.parametrize("with_sync_event", [True, False], ids=["cuda_sync event", "record and wait only"])
def test_cross_stream_event_wait(with_sync_event):
    r = replayed(_event_wait(with_sync_event))
    # B runs after A (300 us), not from its launch (10 us) and not after C
    assert span_end(r, 0, "waiting_kernel") == pytest.approx(400 * US, abs=1e-12)
    assert r.summary["iteration_time_s"] == pytest.approx(1300 * US, abs=1e-12)


def test_stream_wait_without_a_record_waits_for_the_latest_other_stream():
    # (traces that left the event records out: the 16-rank trace in ../shared)
    t = doc([launch(0, 1), kern(10, 300, 1), rt("cudaStreamWaitEvent", 8, 3), launch(10, 4),
             kern(310, 100, 4, stream=20, name="waiting_kernel")])
    r = replayed(t)
    assert span_end(r, 0, "waiting_kernel") == pytest.approx(400 * US, abs=1e-12)


def test_device_synchronize_waits_for_the_gpu():
    # The host blocks in the sync until A ends (300 us), works 20 us, then launches B on
    # another stream: 300 + 20 + 100 us. (Without the edge: B at 30 us, the step 300 us.)
    t = doc([launch(0, 1), kern(10, 300, 1), rt("cudaDeviceSynchronize", 10, 2, dur=300),
             launch(330, 3), kern(340, 100, 3, stream=20, name="after_sync")])
    assert replayed(t).summary["iteration_time_s"] == pytest.approx(420 * US, abs=1e-12)


def test_stream_synchronize_waits_for_its_own_stream():
    # The sync names stream 20 (A, 300 us), not the last launch's stream 7 (C, 10 us).
    t = doc([launch(0, 1), kern(10, 300, 1, stream=20), launch(5, 2), kern(15, 10, 2, name="small_kernel"),
             rt("cudaStreamSynchronize", 10, 3, dur=300), cuda_sync("Stream Sync", 3, 20),
             launch(320, 4), kern(330, 100, 4, name="after_sync")])
    assert replayed(t).summary["iteration_time_s"] == pytest.approx(410 * US, abs=1e-12)


def test_event_synchronize_waits_for_the_recorded_work():
    t = doc([launch(0, 1), kern(10, 300, 1, stream=20), rt("cudaEventRecord", 5, 2), launch(6, 3),
             kern(16, 10, 3, name="small_kernel"), rt("cudaEventSynchronize", 10, 4, dur=300),
             cuda_sync("Event Sync", 4, -1, wait_on_stream=20, wait_on_cuda_event_record_corr_id=2),
             launch(320, 5), kern(330, 100, 5, name="after_sync")])
    assert replayed(t).summary["iteration_time_s"] == pytest.approx(410 * US, abs=1e-12)


def test_each_host_thread_is_its_own_chain():
    # Thread 2 launches B after 400 us of its own work; thread 1 launched A at once.
    t = doc([launch(0, 1, tid=1), kern(10, 100, 1), rt("cudaLaunchKernel", 0, 9, tid=2),
             kern(10, 50, 9, stream=21, name="early_kernel"), launch(400, 2, tid=2),
             kern(410, 100, 2, stream=20, name="late_kernel")])
    r = replayed(t)
    assert span_end(r, 0, "late_kernel") == pytest.approx(500 * US, abs=1e-12)
    assert span_end(r, 0, "sm90") == pytest.approx(100 * US, abs=1e-12)


def test_profiler_step_window_and_carry_over():
    # Step 1 starts at 1000 us; kernel X launched in step 0 still runs until 1200 us on
    # stream 7, so step 1's kernel (launched at 1010 us) starts at 1200 us.
    t = doc([{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0,
              "dur": 1000},
             {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000,
              "dur": 300},
             launch(10, 1), kern(900, 300, 1, name="previous_step"), launch(1010, 2), kern(1200, 50, 2)])
    r = replayed(t)
    assert r.summary["step"] == 1
    assert r.summary["iteration_time_s"] == pytest.approx(250 * US, abs=1e-12)
    assert r.summary["critical_path"]["by_category_s"]["earlier step"] == pytest.approx(200 * US, abs=1e-12)
    r0 = replay([read_kineto(t, 0)])  # step 0: nothing in the trace holds X back from its launch at 10 us
    assert r0.summary["iteration_time_s"] == pytest.approx(10 * US + 300 * US, abs=1e-12)
    assert r0.summary["traced_step_s"] == pytest.approx(1200 * US, abs=1e-12)


# ---------------------------------------------------------------- communication

def _alone(actions: dict, gpu="h100-sxm", **cluster):
    """The engine's time for one program alone on the GPU's default node (or the cluster
    ``cluster`` describes: nodes, gpus_per_node, fabric, ...)."""
    from sim.engine.core import simulate
    from sim.engine.nccl import NcclModel
    from sim.inputs.resolve import profile_from_settings, topology_from_settings
    from sim.inputs.schema import RunSettings

    c = RunSettings.from_values({"gpu": gpu, **cluster}).cluster
    profile = profile_from_settings(c)
    topo = topology_from_settings(c, len(actions), profile.name)
    trace = simulate(Program(actions), topo, link_efficiency=profile.link_efficiencies(), fluid_collectives=True,
                     nccl=NcclModel.from_profile(profile).forcing("auto", "auto"))
    return trace.end_s


def allreduce_rank(rank, world, compute_us, nelems=2**20, dtype="Float", group=None, desc="DATA_PARALLEL_GROUP"):
    group = list(range(world)) if group is None else group
    meta = {"Collective name": "allreduce", "In msg nelems": nelems, "Out msg nelems": nelems, "dtype": dtype,
            "Group size": len(group), "Process Group Ranks": str(group), "Process Group Description": desc}
    return doc([launch(0, 1), kern(10, compute_us, 1), rt("cudaEventRecord", 4, 2), rt("cudaStreamWaitEvent", 6, 3),
                cuda_sync("Stream Wait Event", 3, 20, wait_on_stream=7, wait_on_cuda_event_record_corr_id=2),
                rt("cudaLaunchKernelExC", 8, 4), kern(10 + compute_us, 999, 4, stream=20,
                                                      name="ncclDevKernel_AllReduce_Sum_f32_RING_LL", **meta)],
               rank=rank, world=world)


def test_allreduce_priced_after_the_last_member_arrives():
    t_ar = _alone({r: [Action("ar", kind="collective", op="allreduce", group=(0, 1), nbytes=4 * 2**20)]
                   for r in range(2)})
    g = read_kineto(allreduce_rank(0, 2, 100))
    [coll] = [n for n in g.nodes if n.kind == "collective"]
    assert (coll.op, coll.group, coll.nbytes) == ("allreduce", (0, 1), 4 * 2**20)  # Float: 4 bytes an element
    r = replayed(allreduce_rank(0, 2, 100), allreduce_rank(1, 2, 500))
    assert r.summary["iteration_time_s"] == pytest.approx(500 * US + t_ar, rel=1e-9)
    assert r.summary["cloned_ranks"] == 0


def test_untraced_rank_is_cloned():
    t_ar = _alone({r: [Action("ar", kind="collective", op="allreduce", group=(0, 1), nbytes=4 * 2**20)]
                   for r in range(2)})
    r = replayed(allreduce_rank(0, 2, 100))
    assert r.summary["cloned_ranks"] == 1 and r.summary["world_size"] == 2
    assert r.summary["iteration_time_s"] == pytest.approx(100 * US + t_ar, rel=1e-9)


def test_send_matched_to_recv():
    meta = {"In msg nelems": 2**18, "Out msg nelems": 2**18, "dtype": "BFloat16", "Process Group Ranks": "[0, 1]"}
    sender = doc([launch(0, 1), kern(10, 100, 1), rt("cudaEventRecord", 2, 2), rt("cudaStreamWaitEvent", 4, 3),
                  cuda_sync("Stream Wait Event", 3, 20, wait_on_stream=7, wait_on_cuda_event_record_corr_id=2),
                  launch(6, 4), kern(110, 50, 4, stream=20, name="ncclDevKernel_SendRecv", **meta,
                                     **{"Collective name": "send"})], rank=0, world=2)
    receiver = doc([launch(0, 1), kern(10, 150, 1, stream=20, name="ncclDevKernel_SendRecv", **meta,
                                       **{"Collective name": "recv"}),
                    rt("cudaEventRecord", 2, 2), rt("cudaStreamWaitEvent", 4, 3),
                    cuda_sync("Stream Wait Event", 3, 7, wait_on_stream=20, wait_on_cuda_event_record_corr_id=2),
                    launch(6, 4), kern(160, 200, 4, name="after_recv")], rank=1, world=2)
    t_p2p = _alone({0: [Action("s", kind="send", peer=1, nbytes=2 * 2**18)],
                    1: [Action("r", kind="recv", peer=0, nbytes=2 * 2**18)]})
    r = replayed(sender, receiver)
    assert r.summary["comm_unmatched"] == 0
    assert span_end(r, 1, "after_recv") == pytest.approx(100 * US + t_p2p + 200 * US, rel=1e-9)


def test_collective_without_size_is_replayed_as_measured(capsys):
    t = doc([launch(0, 1), kern(10, 100, 1), rt("cudaEventRecord", 2, 2), rt("cudaStreamWaitEvent", 4, 3),
             launch(6, 4), kern(110, 250, 4, stream=20, name="ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t")])
    r = replayed(t)
    assert r.summary["comm_measured"] == 1
    assert r.summary["iteration_time_s"] == pytest.approx(350 * US, abs=1e-12)


# ---------------------------------------------------------------- what-ifs, hand-computed

def test_data_parallel_size_regroups_the_gradient_collective():
    t_ar4 = _alone({r: [Action("ar", kind="collective", op="allreduce", group=(0, 1, 2, 3), nbytes=4 * 2**20)]
                    for r in range(4)})
    r = replayed(allreduce_rank(0, 2, 100), allreduce_rank(1, 2, 300), data_parallel_size=4)
    assert r.summary["world_size"] == 4
    # replicas 2 and 3 copy replicas 0 and 1: the slowest still arrives at 300 us
    assert r.summary["iteration_time_s"] == pytest.approx(300 * US + t_ar4, rel=1e-9)
    groups = {a.group for acts in r.replayed.program.actions.values() for a in acts if a.kind == "collective"}
    assert groups == {(0, 1, 2, 3)}


def tp2_dp2_rank(r):
    """Rank r of 4: tp groups {0,1}, {2,3} (not named), dp groups {0,2}, {1,3} (named)."""
    tp = [r - r % 2, r - r % 2 + 1]
    dp = [r % 2, r % 2 + 2]
    ev = allreduce_rank(r, 4, 100, group=dp)["traceEvents"]
    meta = {"Collective name": "allreduce", "In msg nelems": 2**10, "Out msg nelems": 2**10, "dtype": "BFloat16",
            "Process Group Ranks": str(tp), "Process Group Description": "TENSOR_MODEL_PARALLEL_GROUP"}
    ev += [rt("cudaLaunchKernelExC", 9, 7), kern(2000, 5, 7, stream=20, name="ncclDevKernel_AllReduce", **meta)]
    return doc(ev, rank=r, world=4)


def test_data_parallel_size_keeps_model_parallel_groups_inside_a_replica():
    r = replayed(*[tp2_dp2_rank(k) for k in range(4)], data_parallel_size=4)
    assert r.summary["world_size"] == 8
    groups = {a.group for acts in r.replayed.program.actions.values() for a in acts if a.kind == "collective"}
    assert groups == {(0, 2, 4, 6), (1, 3, 5, 7), (0, 1), (2, 3), (4, 5), (6, 7)}


def test_gpus_is_the_world_size_in_whole_replicas():
    # issue 54: --gpus wherever a cluster is described. The tp 2 x dp 2 job on 8 GPUs is 4 replicas of 2 GPUs
    docs = [tp2_dp2_rank(k) for k in range(4)]
    by_replicas = replayed(*docs, data_parallel_size=4)
    by_gpus = replayed(*docs, gpus=8)
    assert by_gpus.summary["world_size"] == 8
    assert by_gpus.summary["iteration_time_s"] == by_replicas.summary["iteration_time_s"]
    groups = {a.group for acts in by_gpus.replayed.program.actions.values() for a in acts if a.kind == "collective"}
    assert groups == {(0, 2, 4, 6), (1, 3, 5, 7), (0, 1), (2, 3), (4, 5), (6, 7)}
    assert by_gpus.summary["what_if"]["gpus"] == 8
    assert replayed(*docs, gpus=6).summary["world_size"] == 6  # 3 replicas
    # both, agreeing, are the same what-if; the traced world size alone changes nothing
    assert replayed(*docs, gpus=8, data_parallel_size=4).summary["iteration_time_s"] == \
        by_replicas.summary["iteration_time_s"]
    assert replayed(*docs, gpus=4).summary["iteration_time_s"] == replayed(*docs).summary["iteration_time_s"]
    from sim.errors import InputError

    with pytest.raises(InputError, match=r"^--gpus: got 7; expected a multiple of 2, the GPUs of one data-parallel "
                                         r"replica of the traced job \(4 GPUs as 2 replicas\)$"):
        replayed(*docs, gpus=7)
    with pytest.raises(InputError, match=r"^--gpus: got 8; with --data-parallel-size 2 expected 4 \(2 GPUs per "
                                         r"replica\), or leave one out$"):
        replayed(*docs, gpus=8, data_parallel_size=2)


def test_cli_gpus_and_data_parallel_size_agree(capsys):
    traces = ["tests/data/replay-dp2/trace_rank0.json.gz", "tests/data/replay-dp2/trace_rank1.json.gz"]
    runs = []
    for flags in (["--gpus", "16"], ["--data-parallel-size", "16"], ["--gpus", "16", "--nodes", "2"]):
        assert main(["replay", *traces, *flags, "--json"]) == 0
        runs.append(json.loads(capsys.readouterr().out))
    assert {s["world_size"] for s in runs} == {16}
    assert runs[0]["iteration_time_s"] == runs[1]["iteration_time_s"] == runs[2]["iteration_time_s"]
    # inconsistent: one line, exit 2
    for flags, says in ((["--gpus", "16", "--nodes", "1"], "--gpus: got 16; topology dgx-h100x1-rail has 8 GPUs"),
                        (["--gpus", "16", "--data-parallel-size", "8"], "--gpus: got 16; with --data-parallel-size 8")):
        assert main(["replay", *traces, *flags]) == 2
        cap = capsys.readouterr()
        assert cap.out == "" and len(cap.err.splitlines()) == 1 and says in cap.err, cap.err


def test_network_what_if_reprices_the_collective():
    # The same two ranks, one GPU per node: the all-reduce crosses InfiniBand.
    ar = {r: [Action("ar", kind="collective", op="allreduce", group=(0, 1), nbytes=4 * 2**20)] for r in range(2)}
    t_nvlink, t_ib = _alone(ar), _alone(ar, nodes=2, gpus_per_node=1)
    assert t_ib > 2 * t_nvlink  # (the what-if has teeth)
    r = replayed(allreduce_rank(0, 2, 100), allreduce_rank(1, 2, 500), nodes=2, gpus_per_node=1)
    assert r.summary["iteration_time_s"] == pytest.approx(500 * US + t_ib, rel=1e-9)
    assert r.summary["what_if"] == {"nodes": 2, "gpus_per_node": 1}


def test_gpu_what_if_scales_kernels_by_class():
    from sim.inputs.hardware import load_profile

    t = doc([launch(0, 1), launch(1, 2), kern(5, 1000, 1, name="sm90_xmma_gemm_bf16"),
             kern(1005, 100, 2, name="at::native::vectorized_elementwise_kernel")])
    h100, h200 = load_profile("h100-sxm"), load_profile("h200")
    gemm = 1000 * US * (h100.peak("bf16") * h100.gemm_max_efficiency) / (h200.peak("bf16") * h200.gemm_max_efficiency)
    mem = 100 * US * h100.memory_rate() / h200.memory_rate()
    r = replayed(t, gpu="h200")
    assert r.summary["gpu"] == "h200"
    assert r.summary["iteration_time_s"] == pytest.approx(gemm + mem, rel=1e-12)
    assert mem < 100 * US  # (H200's HBM is faster: the check has teeth)


# ---------------------------------------------------------------- the graph API

def test_graph_check_refuses_a_forward_dependency():
    from sim.errors import InputError

    g = RankGraph(0, (Node(0, "a", "compute", "stream 7", 1e-3, ctrl_deps=(1,)), Node(1, "b", "compute", "stream 7")),
                  source="hand.json")
    with pytest.raises(InputError, match=r"hand.json: node 0 \('a'\): dependency 1 is not an earlier node"):
        g.check()


def test_graph_check_refuses_an_unknown_transport():
    from sim.errors import InputError

    g = RankGraph(0, (Node(0, "ag", "collective", "stream 20", op="allgather", nbytes=8.0, group=(0, 1),
                           transport="pigeon"),), source="hand.et")
    with pytest.raises(InputError, match=r"hand.et: node 0 \('ag'\): transport: got 'pigeon'; allowed: nccl, direct"):
        g.check()


def test_graph_from_code_replays():
    # What another reader (a Chakra ET) produces: two ranks, a collective between kernels.
    def rank(r):
        return RankGraph(r, (Node(0, "k", "compute", "stream 7", 200e-6 * (r + 1), "gemm"),
                             Node(1, "ar", "collective", "stream 20", 0.0, "comm", op="allreduce", nbytes=4 * 2**20,
                                  group=(0, 1), data_deps=(0,)),
                             Node(2, "k2", "compute", "stream 7", 50e-6, "gemm", data_deps=(1,))),
                         source=f"rank{r}.et", traced_step_s=1e-3, meta={"world_size": 2, "device_name": H100}).check()

    t_ar = _alone({r: [Action("ar", kind="collective", op="allreduce", group=(0, 1), nbytes=4 * 2**20)]
                   for r in range(2)})
    r = replay([rank(0), rank(1)])
    assert r.summary["iteration_time_s"] == pytest.approx(400e-6 + t_ar + 50e-6, rel=1e-9)


# ---------------------------------------------------------------- the command line

def run_json(argv):
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(argv) == 0
    return json.loads(buf.getvalue())


def test_cli_outputs(tmp_path, capsys):
    a, b = tmp_path / "rank0.json", tmp_path / "rank1.json.gz"
    a.write_text(json.dumps(allreduce_rank(0, 2, 100)))
    import gzip

    b.write_bytes(gzip.compress(json.dumps(allreduce_rank(1, 2, 500)).encode()))
    assert main(["replay", str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "iteration time" in text and "traced step" in text and "critical path" in text
    for f in ("summary.json", "trace.json", "timeline.png"):
        assert (tmp_path / "out" / f).stat().st_size > 0
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {"iteration_time_s", "traced_step_s", "critical_path"} <= set(s)
    assert set(s["critical_path"]["by_category_s"]) >= {"allreduce"}


# (bad inputs: tests/test_bad_inputs.py::test_bad_replay, listed in tests/BAD_INPUTS.md)


# ---------------------------------------------------------------- the simulator's own traces

TINY = ["--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "8", "--vocab-size", "8192",
        "--seq-length", "1024", "--gpu", "h100-sxm"]
SMALL = ["--num-layers", "2", "--hidden-size", "2048", "--num-attention-heads", "16", "--vocab-size", "32000",
         "--seq-length", "1024", "--gpu", "h100-sxm"]
PLANS = {
    "dp4 tp2 pp2": TINY + ["--gpus", "16", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                           "--global-batch-size", "16"],
    "dp8 tp2 zero-1": TINY + ["--gpus", "16", "--tensor-model-parallel-size", "2", "--global-batch-size", "16",
                              "--zero", "1"],
    "dp4 pp4": TINY + ["--gpus", "16", "--pipeline-model-parallel-size", "4", "--global-batch-size", "32"],
}


def _kineto(tmp_path_factory, argv):
    d = tmp_path_factory.mktemp("kineto")
    s = run_json(["run", *argv, "--json", "--kineto", str(d)])
    return s, sorted(glob.glob(str(d / "*.json")))


def _with(argv, **flags):
    out = list(argv)
    for flag, value in flags.items():
        f = "--" + flag.replace("_", "-")
        if f in out:
            out[out.index(f) + 1] = str(value)
        else:
            out += [f, str(value)]
    return out


@pytest.mark.parametrize("plan", sorted(PLANS))
def test_simulator_traces_replay_and_double_data_parallelism(tmp_path_factory, plan):
    argv = PLANS[plan]
    s, files = _kineto(tmp_path_factory, argv)
    rep = run_json(["replay", *files, "--json"])
    assert rep["iteration_time_s"] == pytest.approx(s["iteration_time_s"], rel=0.01)
    gpus, gbs = int(argv[argv.index("--gpus") + 1]), int(argv[argv.index("--global-batch-size") + 1])
    doubled = run_json(["run", *_with(argv, gpus=2 * gpus, global_batch_size=2 * gbs), "--json"])
    assert doubled["plan"]["dp"] == 2 * s["plan"]["dp"]
    what_if = run_json(["replay", *files, "--json", "--data-parallel-size", str(2 * s["plan"]["dp"])])
    assert what_if["world_size"] == 2 * gpus
    assert what_if["iteration_time_s"] == pytest.approx(doubled["iteration_time_s"], rel=0.03)
    assert doubled["iteration_time_s"] != pytest.approx(s["iteration_time_s"], rel=1e-3)  # (the check has teeth)


TP_OVERLAP = SMALL + ["--gpus", "8", "--tensor-model-parallel-size", "4", "--sequence-parallel", "--tp-comm-overlap",
                      "--global-batch-size", "4", "--fidelity", "full"]


def _claims_dropped(graphs):
    """``graphs`` with every collective taken for an NCCL kernel (the claim left unread)."""
    return [RankGraph(g.rank, tuple(n._replace(transport="nccl", slows_compute=True) for n in g.nodes), g.source,
                      g.traced_step_s, g.meta) for g in graphs]


def test_a_tp_overlap_runs_traces_carry_the_chunks_claims_and_replay_within_1_percent(tmp_path_factory):
    """``run --tp-comm-overlap --kineto``: the overlap's chunks (tensor-parallel, moved outside
    NCCL) carry their claim in their kernels' args, the reader puts it on their nodes, and
    the replay reproduces the run within 1%. The same graphs with the claims dropped (every
    chunk an NCCL kernel paying NCCL's base latency) replay over 10% slower."""
    s, files = _kineto(tmp_path_factory, TP_OVERLAP)
    events = [e for f in files for e in json.load(open(f))["traceEvents"] if "trainsim transport" in e.get("args", {})]
    assert events and {(e["args"]["Collective name"], e["args"]["trainsim transport"],
                        e["args"]["trainsim slows compute"]) for e in events} == \
        {("_allgather_base", "direct", False), ("_reduce_scatter_base", "direct", True)}
    graphs = [read_kineto(f) for f in files]
    colls = [n for g in graphs for n in g.nodes if n.kind == "collective"]
    direct = [n for n in colls if n.transport == "direct"]
    assert len(direct) == len(events) and all(len(n.group) == 4 for n in direct)
    assert {(n.op, n.slows_compute) for n in direct} == {("allgather", False), ("reducescatter", True)}
    assert any(n.transport == "nccl" and n.slows_compute for n in colls)  # (the data-parallel gradient sync)
    T = s["iteration_time_s"]
    assert run_json(["replay", *files, "--json"])["iteration_time_s"] == pytest.approx(T, rel=0.01)
    assert replay(_claims_dropped(graphs)).summary["iteration_time_s"] > 1.1 * T  # (the check has teeth)


@pytest.mark.parametrize("plan", [["--tensor-model-parallel-size", "8", "--global-batch-size", "8"],
                                  ["--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "2",
                                   "--global-batch-size", "16"]], ids=["tp8 dp8", "tp4 pp2 dp8"])
def test_simulator_traces_on_an_oversubscribed_fat_tree(tmp_path_factory, plan):
    argv = SMALL + ["--gpus", "64", *plan]
    s, files = _kineto(tmp_path_factory, argv)
    fat = ["--fabric", "fat-tree", "--oversubscription", "4"]
    direct = run_json(["run", *argv, *fat, "--json"])
    assert direct["iteration_time_s"] > 1.05 * s["iteration_time_s"]  # (the fabric matters here)
    rep = run_json(["replay", *files, *fat, "--json"])
    assert rep["iteration_time_s"] == pytest.approx(direct["iteration_time_s"], rel=0.03)
    assert run_json(["replay", *files, "--json"])["iteration_time_s"] == pytest.approx(s["iteration_time_s"], rel=0.01)


# ---------------------------------------------------------------- real traces

REAL = {
    "2 ranks, NCCL all-reduce": (["hta-nccl-allreduce-2ranks-rank0.json.gz"], []),
    "16 ranks, send/recv": (["hta-16ranks-rank0.json.gz"], []),
    "128 ranks, 2 traced": (["hta-128ranks-sampled-rank0.json.gz", "hta-128ranks-sampled-rank1.json.gz"],
                            ["--gpu", "a100-80gb"]),
    "event sync, 3 streams": (["hta-event-sync-multistream.json.gz"], []),
    "alexnet, 1 GPU": (["hta-alexnet-1gpu.json.gz"], []),
}


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent (real traces live in ../shared/traces)")
@pytest.mark.parametrize("case", sorted(REAL))
def test_real_trace_replays_within_5_percent(case):
    files, flags = REAL[case]
    s = run_json(["replay", *[str(SHARED / f) for f in files], *flags, "--json"])
    assert s["traced_step_s"] > 0
    assert abs(s["iteration_time_s"] - s["traced_step_s"]) <= 0.05 * s["traced_step_s"], s


def test_untraced_ranks_clone_a_traced_rank_of_their_data_parallel_group():
    # 4 ranks, dp groups {0, 2} and {1, 3} (tp pairs {0, 1}, {2, 3}): ranks 0 and 1 traced,
    # rank 1 slower. Rank 3 is rank 1's replica: it must copy rank 1, not rank 0 (nearest
    # below would give rank 1 too; rank 2 must copy rank 0, not rank 1).
    def rank_doc(r, compute):
        return allreduce_rank(r, 4, compute, group=[r % 2, r % 2 + 2])

    from sim.replay.program import complete

    graphs = {r: read_kineto(rank_doc(r, c)) for r, c in ((0, 100), (1, 700))}
    full, cloned = complete(graphs, 4)
    assert cloned == {2: 0, 3: 1}
    assert full[2].nodes[-1].group == (0, 2) and full[3].nodes[-1].group == (1, 3)
    t_ar = _alone({r: [Action("ar", kind="collective", op="allreduce", group=(0, 1), nbytes=4 * 2**20)]
                   for r in range(2)})
    r = replayed(rank_doc(0, 100), rank_doc(1, 700))
    assert span_end(r, 2, "ncclDevKernel") == pytest.approx(100 * US + t_ar, rel=1e-6)


def test_gpu_what_if_uses_the_gemm_model_for_recorded_shapes():
    from sim.inputs.hardware import load_profile

    mm = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10,
          "args": {"External id": 5, "Input Dims": [[4096, 1024], [1024, 8192]],
                   "Input type": ["c10::BFloat16", "c10::BFloat16"]}}
    start = launch(1, 1)
    start["args"]["External id"] = 5
    t = doc([mm, start, kern(5, 1000, 1, name="sm90_xmma_gemm_bf16")])
    [node] = [n for n in read_kineto(t).nodes if n.category == "gemm"]
    assert node.shape == (4096, 8192, 1024, 1, "bf16")
    h100, b200 = load_profile("h100-sxm"), load_profile("b200")
    ratio = (h100.peak("bf16") * h100.gemm_efficiency(4096, 8192, 1024)) / \
        (b200.peak("bf16") * b200.gemm_efficiency(4096, 8192, 1024))
    r = replayed(t, gpu="b200")
    # (time zero is the first CUDA call, the launch: the kernel starts at once)
    assert r.summary["iteration_time_s"] == pytest.approx(1000 * US * ratio, rel=1e-12)
    capped = h100.peak("bf16") * h100.gemm_max_efficiency / (b200.peak("bf16") * b200.gemm_max_efficiency)
    assert ratio != pytest.approx(capped, rel=1e-3)  # (the shape matters: the check has teeth)


def test_blocking_copy_waits_for_the_gpu():
    # A (300 us) then a blocking cudaMemcpy on the same stream (10 us), then 20 us of host
    # work and B on another stream: 300 + 10 + 20 + 100 us.
    copy = {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": 7,
            "ts": 310, "dur": 10, "args": {"stream": 7, "correlation": 2}}
    t = doc([launch(0, 1), kern(10, 300, 1), rt("cudaMemcpy", 5, 2, dur=315), copy,
             launch(340, 3), kern(350, 100, 3, stream=20, name="after_copy")])
    assert replayed(t).summary["iteration_time_s"] == pytest.approx(430 * US, abs=1e-12)


def test_group_from_the_process_group_name():
    t = allreduce_rank(0, 2, 100)
    t["distributedInfo"]["pg_config"] = [{"pg_name": "7", "pg_desc": "dp", "ranks": [0, 1]}]
    nccl = next(e for e in t["traceEvents"] if e["name"].startswith("nccl"))
    del nccl["args"]["Process Group Ranks"]
    nccl["args"]["Process Group Name"] = "7"
    [coll] = [n for n in read_kineto(t).nodes if n.kind == "collective"]
    assert coll.group == (0, 1)


def test_gpu_what_if_uses_the_attention_model_for_recorded_shapes():
    from sim.inputs.hardware import load_profile

    op = {"ph": "X", "cat": "cpu_op", "name": "aten::_scaled_dot_product_flash_attention", "pid": 1, "tid": 1,
          "ts": 0, "dur": 10, "args": {"External id": 9, "Input Dims": [[2, 16, 4096, 128], [2, 16, 4096, 128],
                                                                          [2, 16, 4096, 128], [], []]}}
    start = launch(1, 1)
    start["args"]["External id"] = 9
    t = doc([op, start, kern(5, 800, 1, name="pytorch_flash::flash_fwd_kernel")])
    [node] = [n for n in read_kineto(t).nodes if n.category == "attention"]
    assert node.shape == (4096, 4096, 128, 32)
    a100, h100 = load_profile("a100-80gb"), load_profile("h100-sxm")
    ratio = (h100.peak("bf16") * h100.attention_efficiency(4096, 4096, 128, 32)) / \
        (a100.peak("bf16") * a100.attention_efficiency(4096, 4096, 128, 32))
    r = replayed(t, gpu="a100-80gb")
    assert r.summary["iteration_time_s"] == pytest.approx(800 * US * ratio, rel=1e-12)
