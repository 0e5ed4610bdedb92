"""NCCL's algorithms in training steps (issue 23): ``nccl_algo`` / ``nccl_protocol`` run
every collective of an iteration with the tuner's choice or the forced one."""

import pytest

from sim.engine.nccl import NcclModel, TunerRequest
from sim.engine.tuner import choose
from sim.inputs.hardware import load_profile
from sim.inputs.model import ModelSpec
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.engine.nccl_tuning import nvls_lead_bytes
from sim.program.costs import nvls_time
from sim.inputs.schema import SimulationSettings
from sim.session import Job, simulate_training

H100, A100 = load_profile("h100-sxm"), load_profile("a100-80gb")
# s·h·2 bytes = 2048·4096·2 = 16 MiB per TP all-reduce: large enough for NVLS on 8 H100s
MODEL = ModelSpec(name="tp8", num_layers=2, hidden_size=4096, num_attention_heads=32, vocab_size=32000, ffn_hidden_size=16384,
                  seq_length=2048)
TP8 = ParallelPlan(tp=8, global_batch_size=1)
RING_SIMPLE_BASE_S, NVLS_BASE_S = 8.4e-6, 0.0
"""NCCL's base latency of a collective: baseLatencies[Ring][Simple] = 8.4 µs, NVLS 0
(NVIDIA/nccl src/graph/tuning.cc)."""


def _tp_collectives(run):
    return [a for a in run.program.actions[0] if a.kind == "collective" and len(a.group) == 8]


def _ring(op, S, n, alpha, B):
    return (2 if op == "allreduce" else 1) * (n - 1) * (alpha + S / (n * B))


def _nvls(op, S, n, model, B_line):
    # the switch-reduction closed form (sim.engine.algorithms_nccl): all-reduce moves S(n+1)/n
    # each way per GPU, reduce-scatter and all-gather S on their busier direction
    k = (n + 1) / n if op == "allreduce" else 1.0
    t = model.nvls_latency_s + S * k / (B_line * model.nvls_efficiency)
    assert nvls_time(op, S, n, model.nvls_latency_s, B_line, model.nvls_efficiency) == pytest.approx(t, rel=1e-12)
    if op == "allreduce" and model.arch is not None:  # the way back after NVLS's first round of chunks
        t += nvls_lead_bytes(S, n, S * k) / (B_line * model.nvls_efficiency)
    return t


def test_tp8_allreduce_in_an_h100_step_runs_nvls_and_saves_what_the_closed_forms_say():
    topo = load_topology("dgx-h100")
    model = NcclModel.from_profile(H100)
    eff = H100.link_efficiencies()
    alpha, B_line = 3.4e-6, topo.bottleneck_Bps(0, 1)  # a ring step: hwLatencies[NVLINK][RING][Simple]
    B = B_line * eff["nvlink"]
    runs = {a: simulate_training(Job(MODEL, TP8, H100, topo),
                                 SimulationSettings(fidelity="full", nccl_algo=a, nccl_protocol="simple"),
                                 coalesce_tp=False)
            for a in ("auto", "ring")}
    colls = _tp_collectives(runs["auto"])
    assert colls and all(a.op == "allreduce" for a in colls)
    picks = {a.nbytes: choose(TunerRequest(a.op, a.group, a.nbytes, topo, eff, model, protocol="simple"))[0]
             for a in colls}
    assert picks[2048 * 4096 * 2] == "nvls"  # each layer's activations (s·h 16-bit values)
    # ring Simple runs nc of NCCL's 24 channels (topoGetAlgoInfo): one below 2 x 512 threads x
    # 64 B (the 8 KiB ones), all 24 from 24 x 512 x 64 B = 768 KiB (the 16 MiB ones)
    assert {a.nbytes for a in colls} == {8192, 2048 * 4096 * 2}
    nc = {8192: 1, 2048 * 4096 * 2: 24}
    saved = sum((RING_SIMPLE_BASE_S + _ring(a.op, a.nbytes, 8, alpha, B * nc[a.nbytes] / 24))
                - (NVLS_BASE_S + _nvls(a.op, a.nbytes, 8, model, B_line))
                for a in colls if picks[a.nbytes] == "nvls")
    assert saved > 0
    got = runs["ring"].trace.end_s - runs["auto"].trace.end_s
    assert got == pytest.approx(saved, rel=1e-6)
    # the coalesced program (TP collectives priced outside the network) agrees with the engine
    for a in ("auto", "ring"):
        co = simulate_training(Job(MODEL, TP8, H100, topo),
                               SimulationSettings(fidelity="full", nccl_algo=a, nccl_protocol="simple"))
        assert co.trace.end_s == pytest.approx(runs[a].trace.end_s, rel=1e-9)


def test_a100_never_picks_nvls():
    for nodes in (1, 2, 4):
        topo = load_topology("dgx-a100", nodes=nodes)
        for op in ("allreduce", "allgather", "reducescatter"):
            for n in {2, 8, 8 * nodes}:
                for S in (8, 2**16, 2**22, 2**28, 2**33):
                    assert not choose(TunerRequest(op, range(n), S, topo, A100.link_efficiencies(),
                                                   NcclModel.from_profile(A100)))[0].startswith("nvls")
    # and a training step on A100 under auto equals one that rules NVLS out (ring or tree)
    topo = load_topology("dgx-a100")
    runs = [simulate_training(Job(MODEL, TP8, A100, topo),
                              SimulationSettings(fidelity="full", nccl_algo=a)).trace.end_s for a in ("auto", "ring")]
    assert runs[0] <= runs[1]


def test_auto_is_deterministic_and_full_and_reduced_agree():
    topo = load_topology("dgx-h100", nodes=4)
    plan = ParallelPlan(dp=4, tp=8, global_batch_size=4)
    a = simulate_training(Job(MODEL, plan, H100, topo), SimulationSettings(fidelity="full"))
    b = simulate_training(Job(MODEL, plan, H100, topo), SimulationSettings(fidelity="full"))
    assert a.trace.end_s == b.trace.end_s
    red = simulate_training(Job(MODEL, plan, H100, topo), SimulationSettings(fidelity="reduced"))
    assert red.trace.end_s == pytest.approx(a.trace.end_s, rel=0.01)
    for algo in ("tree", "nvls_tree"):  # all their steps kept under reduced fidelity
        full = simulate_training(Job(MODEL, plan, H100, topo), SimulationSettings(fidelity="full", nccl_algo=algo))
        red = simulate_training(Job(MODEL, plan, H100, topo), SimulationSettings(fidelity="reduced", nccl_algo=algo))
        assert red.trace.end_s == pytest.approx(full.trace.end_s, rel=0.01), algo


def test_forced_algorithm_an_op_cannot_run_keeps_the_tuners_choice():
    # tree runs all-reduce only (as in NCCL): the sequence-parallel all-gathers and
    # reduce-scatters keep what auto picks, so the run goes through
    topo = load_topology("dgx-h100", nodes=2)
    plan = ParallelPlan(dp=2, tp=8, global_batch_size=2, sequence_parallel=True)
    assert simulate_training(Job(MODEL, plan, H100, topo),
                             SimulationSettings(fidelity="full", nccl_algo="tree")).trace.end_s > 0


def test_experiment_file_takes_nccl_algo(tmp_path, capsys):
    from sim.cli import main

    f = tmp_path / "e.toml"
    f.write_text('[model]\nnum_layers = 2\nhidden_size = 4096\nnum_attention_heads = 32\nvocab_size = 32000\n'
                 'seq_length = 2048\n[cluster]\ngpu = "h100-sxm"\nnccl_algo = "ring"\nnccl_protocol = "simple"\n'
                 '[plan]\ntensor_model_parallel_size = 8\nglobal_batch_size = 1\n')
    import json

    assert main(["run", str(f), "--json"]) == 0
    ring = json.loads(capsys.readouterr().out)["iteration_time_s"]
    assert main(["run", str(f), "--json", "--nccl-algo", "auto"]) == 0
    auto = json.loads(capsys.readouterr().out)["iteration_time_s"]
    assert auto < ring
