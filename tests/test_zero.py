"""ZeRO stages and memory over time, against the ZeRO paper and Korthikanti's formulas."""

import math

import pytest

from sim.inputs.hardware import load_profile
from sim.results.memory_timeline import final, highest_peak, min_level, peak, timeline
from sim.inputs.model import gpt, preset
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import NodeSpec, build_cluster, load_topology
from sim.program.training import build_program
from sim.inputs.schema import SimulationSettings
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
RING = SimulationSettings(fidelity="full", nccl_algo="ring", nccl_protocol="simple")
A100 = load_profile("a100-80gb")
# Small vocabulary: the embedding is smaller than a layer, so layers dominate gathers.
SMALL = gpt("small", 8, 1024, 16, 1024, 512)


def _resident(prog, rank):
    act = next(a for a in prog.actions[rank] if a.name == "resident memory")
    return {cat: b for _, cat, b in act.mem}


@pytest.mark.parametrize("dp", [4, 16, 64, 256, 1024])
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_model_states_follow_the_zero_formulas_for_the_7_5b_shape(dp, zero):
    # ZeRO (Rajbhandari et al. SC'20): 2Ψ + 2Ψ + 12Ψ; P_os 4Ψ + 12Ψ/Nd; P_os+g 2Ψ + 14Ψ/Nd;
    # P_os+g+p 16Ψ/Nd; Ψ from the simulator's own parameter count.
    model = preset("zero-7.5b")
    psi = model.num_params
    expected = {0: 16 * psi, 1: 4 * psi + 12 * psi / dp, 2: 2 * psi + 14 * psi / dp, 3: 16 * psi / dp}[zero]
    plan = ParallelPlan(dp=dp, global_batch_size=dp, zero_stage=zero)
    _, prog = build_program(model, plan, A100, fidelity="reduced")
    res = _resident(prog, 0)
    states = res["parameters"] + res["gradients"] + res["optimizer"]
    assert states == pytest.approx(expected, rel=1e-12)
    assert res["reserve"] == A100.memory_reserve_bytes


def _dp_bytes(run):
    return sum(t.nbytes for t in run.trace.transfers if t.label.split()[0] in ("dp", "zero"))


def test_zero3_moves_one_and_a_half_times_the_bytes_of_zero2_counted_from_the_trace():
    topo = load_topology("dgx-h100")
    # the ZeRO paper's volumes are a Simple ring's (NVLS and LL move other wire bytes)
    runs = {z: simulate_training(Job(SMALL, ParallelPlan(dp=8, global_batch_size=8, zero_stage=z), H100, topo), RING)
            for z in (2, 3)}
    assert _dp_bytes(runs[3]) == pytest.approx(1.5 * _dp_bytes(runs[2]), rel=1e-9)
    # and ZeRO-0's all-reduce moves what ZeRO-2's reduce-scatter + all-gather move
    z0 = simulate_training(Job(SMALL, ParallelPlan(dp=8, global_batch_size=8), H100, topo), RING)
    assert _dp_bytes(z0) == pytest.approx(_dp_bytes(runs[2]), rel=1e-9)


def _zero3(depth, topo, model=SMALL, profile=H100):
    plan = ParallelPlan(dp=8, micro_batch_size=4, global_batch_size=32, zero_stage=3, zero3_prefetch_depth=depth)
    return simulate_training(Job(model, plan, profile, topo))


def _exposed_zero(run):
    from sim.results.metrics import rank_breakdown

    return rank_breakdown(run.trace, 0)["exposed_comm_s"]["zero"]


def test_prefetch_depth_zero_exposes_every_gather_and_depth_one_hides_them():
    # A node whose NVLink is fast enough for a layer's gather to take less than a
    # layer's compute (10x an H100's, 0.1 us per hop), and NCCL launching in no time (no
    # base latency: a fixed 6.6-14 us per gather would outlast this small model's layers).
    from dataclasses import replace

    fast = build_cluster(NodeSpec("fast", 8, "h100-sxm", 4.5e12, 1e-7, 63e9, 5e-7, 8, "ib", 50e9, 1e-6), 1)
    # (named as no GPU NCCL's tables know: no per-step latencies of NCCL's either, only the
    # links' own; sim.engine.nccl_tuning)
    free = replace(H100, name="links-only", nccl_base_latency_s={a: {p: 0.0 for p in ("ll", "ll128", "simple")}
                                                                 for a in ("ring", "tree", "nvls", "nvls_tree")})
    d0, d1 = _zero3(0, fast, profile=free), _zero3(1, fast, profile=free)
    gathers = [s for s in d0.trace.spans_of(0) if s.category == "zero"]
    compute = [s for s in d0.trace.spans_of(0) if s.kind == "compute" and s.duration_s > 0]
    # depth 0: no compute runs while any gather moves data (every gather is exposed)
    for g in gathers:
        assert not any(c.start_s < g.end_s - 1e-12 and c.end_s > g.busy_start_s + 1e-12 for c in compute)
    assert _exposed_zero(d0) > 0
    # depth 1 on NVLink: only the very first gather of the iteration is exposed
    first = min(gathers, key=lambda s: s.start_s)
    assert _exposed_zero(d1) <= first.busy_s * 1.000001
    assert d1.trace.end_s < d0.trace.end_s


def test_peak_gathered_memory_grows_with_depth_by_one_layer_each():
    from sim.program.memory import layer_params_per_rank

    topo = load_topology("dgx-h100")
    layer = 2 * layer_params_per_rank(SMALL, 1)
    peaks = []
    for depth in range(4):
        run = _zero3(depth, topo)
        _, series = timeline(run.trace, 0)
        assert max(series["gathered"]) == pytest.approx((depth + 1) * layer, rel=1e-9)
        peaks.append(peak(run.trace, 0).total_bytes)
    # one micro-batch: the rank's peak total grows by one gathered layer per layer of depth
    assert [b - a for a, b in zip(peaks, peaks[1:])] == pytest.approx([layer] * 3, rel=1e-9)


def test_gpipe_activations_grow_with_m_and_1f1b_stays_at_p():
    # Stage 1 of 4 (no embedding, no head): 2 layers of SMALL per stage.
    from sim.program.memory import Storing, activation_bytes_per_layer

    per_mb = 2 * activation_bytes_per_layer(SMALL, Storing.of(1))
    topo = load_topology("dgx-h100")
    for m in (4, 8, 16):
        acts = {}
        for sched in ("gpipe", "1f1b"):
            run = simulate_training(Job(SMALL, ParallelPlan(pp=4, global_batch_size=m, schedule=sched), H100, topo))
            _, series = timeline(run.trace, 1)
            acts[sched] = max(series["activations"])
        assert acts["gpipe"] == pytest.approx(m * per_mb, rel=1e-9)
        assert acts["1f1b"] == pytest.approx(min(m, 4 - 1) * per_mb, rel=1e-9)  # stage 1 holds p - 1


def test_recompute_shrinks_stored_activations_per_korthikanti():
    # Korthikanti et al. Table 2: full recompute stores 2sbh per layer; selective (with
    # tensor parallelism t) sbh(10 + 24/t); none stores more than selective.
    model = gpt("k", 8, 1024, 16, 1024, 512)
    s, b, h, a, t = 512, 1, 1024, 16, 2
    topo = load_topology("dgx-h100")
    level = {}
    for rc in ("none", "selective", "full"):
        run = simulate_training(Job(model, ParallelPlan(tp=t, pp=4, global_batch_size=4, recompute=rc), H100, topo))
        rank = run.plan.rank(dp=0, pp=1, tp=0)
        # the level right after stage 1's first forward: one micro-batch's 2 layers
        f0 = next(sp for sp in run.trace.spans_of(rank) if sp.name == "1F0")
        times, series = timeline(run.trace, rank)
        i = max(k for k, tt in enumerate(times) if tt <= f0.end_s)
        level[rc] = series["activations"][i] / 2
    sbh = s * b * h
    assert level["full"] == pytest.approx(2 * sbh, rel=1e-12)
    assert level["selective"] == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)
    assert level["none"] > level["selective"] > level["full"]


@pytest.mark.parametrize("zero,sched", [(0, "1f1b"), (1, "gpipe"), (2, "zb-h2"), (3, "1f1b")])
def test_memory_returns_to_the_resident_baseline_and_never_goes_negative(zero, sched):
    topo = load_topology("dgx-h100")
    plan = ParallelPlan(dp=2, pp=2, tp=2, global_batch_size=8, zero_stage=zero, schedule=sched)
    run = simulate_training(Job(SMALL, plan, H100, topo))
    for r in run.program.ranks:
        end = final(run.trace, r)
        assert _resident(run.program, r) == {k: v for k, v in end.items() if v}
        assert min_level(run.trace, r) >= -1e-6


def test_175b_plain_dp_does_not_fit_and_3d_with_zero1_fits():
    model = preset("gpt3-175b")
    # Plain data parallelism on 8 GPUs (one bucket: the timing is not the point here).
    dp = simulate_training(Job(model, ParallelPlan(dp=8, global_batch_size=8, bucket_size_bytes=2**42), A100,
                               load_topology("dgx-a100")))
    pk = highest_peak(dp.trace)
    assert pk.total_bytes > A100.hbm_capacity_bytes
    assert pk.breakdown["optimizer"] == pytest.approx(12 * model.num_params)
    # DP64 x TP8 x PP4 with ZeRO-1 on 2048 A100s (one replica simulated; the others shadow it)
    plan = ParallelPlan(dp=64, tp=8, pp=4, global_batch_size=64, zero_stage=1, bucket_size_bytes=4 * 10**9)
    run = simulate_training(Job(model, plan, A100, load_topology("dgx-a100", nodes=256)),
                            SimulationSettings(fidelity="reduced"))
    assert highest_peak(run.trace).total_bytes < A100.hbm_capacity_bytes


def test_run_json_reports_the_verdict_with_the_breakdown(capsys):
    import json

    from sim.cli import main

    assert main(["run", "--model", "gpt3-175b", "--gpu", "a100-80gb", "--gpus", "8", "--global-batch-size", "8",
                 "--bucket-size", "4TB", "--json"]) == 1  # does not fit: exit 1, the JSON printed all the same
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is False and out["iteration_time_s"] > 0
    mem = out["memory"]
    assert mem["peak_bytes"] > out["memory_capacity_bytes"]
    assert mem["optimizer_bytes"] == pytest.approx(12 * out["params"])


def test_full_and_reduced_fidelity_agree():
    topo = load_topology("dgx-h100", nodes=4)
    for plan in (ParallelPlan(dp=32, global_batch_size=32),
                 ParallelPlan(dp=4, tp=2, pp=4, global_batch_size=16),
                 ParallelPlan(dp=32, global_batch_size=32, zero_stage=3)):
        full = simulate_training(Job(SMALL, plan, H100, topo), SimulationSettings(fidelity="full"))
        red = simulate_training(Job(SMALL, plan, H100, topo), SimulationSettings(fidelity="reduced"))
        assert red.trace.end_s == pytest.approx(full.trace.end_s, rel=0.01)
        assert highest_peak(red.trace).total_bytes == highest_peak(full.trace).total_bytes
        assert len(red.program.actions) == plan.pp  # one GPU per pipeline stage


def test_optimizer_offload_moves_states_to_the_host_over_pcie():
    topo = load_topology("dgx-h100", nodes=1)
    base = dict(dp=8, global_batch_size=8, zero_stage=2)
    on = simulate_training(Job(SMALL, ParallelPlan(**base, offload_optimizer=True), H100, topo))
    off = simulate_training(Job(SMALL, ParallelPlan(**base), H100, topo))
    assert "optimizer" not in _resident(on.program, 0) or _resident(on.program, 0)["optimizer"] == 0
    assert _resident(off.program, 0)["optimizer"] == pytest.approx(12 * SMALL.num_params / 8)
    copies = [t for t in on.trace.transfers if t.label.startswith("offload")]
    # the 16-bit gradient shard goes to the host and the parameter shard comes back
    assert len(copies) == 2 * 8 and all(t.medium == "pcie" for t in copies)
    assert sum(t.nbytes for t in copies if t.src == 0) == pytest.approx(2 * 2 * SMALL.num_params / 8)
    cpu = [s for s in on.trace.spans_of(0) if s.stream == "cpu"]
    assert len(cpu) == 1 and cpu[0].duration_s > 0
    with pytest.raises(Exception, match="needs ZeRO stage"):
        ParallelPlan(offload_optimizer=True)


def test_memory_outputs(tmp_path, capsys):
    import json

    from sim.cli import main

    out = tmp_path / "o"
    assert main(["run", "--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size",
                 "1024", "--seq-length", "256", "--gpu", "h100-sxm", "--gpus", "4", "--pipeline-model-parallel-size",
                 "2", "--global-batch-size", "4", "--zero", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert (out / "memory.png").read_bytes()[:4] == b"\x89PNG"
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and {e["pid"] for e in counters} == {0, 1, 2, 3}
    assert all(set(e["args"]) >= {"parameters", "gradients", "optimizer"} for e in counters)


def test_zero_flags_and_deepspeed_toml_names(tmp_path, capsys):
    import json

    from sim.cli import main

    f = tmp_path / "ds.toml"
    f.write_text("[model]\nnum_layers = 4\nhidden_size = 512\nnum_attention_heads = 8\nvocab_size = 1024\n"
                 "seq_length = 256\n[cluster]\ngpu = 'h100-sxm'\ngpus = 4\n[plan]\nglobal_batch_size = 4\n"
                 "[zero_optimization]\nstage = 3\nstage3_prefetch_bucket_size = 1\nstage3_max_live_parameters = 1e9\n")
    assert main(["run", str(f), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["zero_stage"] == 3 and plan["zero3_prefetch_depth"] == 1 and plan["zero3_max_live_parameters"] == 1e9
    assert main(["run", str(f), "--zero3-prefetch-depth", "2", "--json"]) == 2  # both ways of saying it
    assert "not both" in capsys.readouterr().err
    f.write_text(f.read_text().replace("stage = 3", "stage = 5"))
    assert main(["run", str(f)]) == 2
    assert "zero_optimization.stage: got 5" in capsys.readouterr().err


def test_zero_parameter_allgathers_and_offload_copies_are_reported_by_kind():
    # ZeRO-1/2's all-gather of the updated 16-bit parameters runs after the optimizer step,
    # with nothing left to hide it: its whole busy time is exposed, as kind "zero"; the
    # gradient reduce-scatter stays "dp". ZeRO-Offload's PCIe copies are kind "offload".
    from sim.results.metrics import rank_breakdown

    topo = load_topology("dgx-h100")
    for z in (1, 2):
        run = simulate_training(Job(SMALL, ParallelPlan(dp=8, global_batch_size=8, zero_stage=z), H100, topo))
        spans = run.trace.spans_of(0)
        gathers = [s for s in spans if s.name.startswith("param allgather")]
        assert gathers and all(s.category == "zero" for s in gathers)
        assert sum(s.nbytes for s in gathers) == pytest.approx(2 * SMALL.num_params, rel=1e-12)  # 2Ψ, tp = pp = 1
        opt = next(s for s in spans if s.name == "optimizer")
        assert min(s.start_s for s in gathers) >= opt.end_s
        # one stream, one after another: exposed = the sum of their busy times
        exposed = rank_breakdown(run.trace, 0)["exposed_comm_s"]
        assert exposed["zero"] == pytest.approx(sum(s.end_s - s.busy_start_s for s in gathers), rel=1e-9)
        assert "offload" not in exposed
    off = simulate_training(Job(SMALL, ParallelPlan(dp=8, global_batch_size=8, zero_stage=2, offload_optimizer=True),
                                H100, topo))
    copies = [s for s in off.trace.spans_of(0) if s.category == "offload"]
    assert len(copies) == 2
    exposed = rank_breakdown(off.trace, 0)["exposed_comm_s"]
    assert exposed["offload"] == pytest.approx(sum(s.end_s - s.busy_start_s for s in copies), rel=1e-9)
    assert "other" not in exposed


def test_zero3_max_live_parameters_caps_the_gathered_layers():
    # DeepSpeed's stage3_max_live_parameters: at most that many gathered parameters alive,
    # whatever the prefetch depth asks for. Room for 2 layers: the layer in use + 1 ahead.
    from sim.program.memory import layer_params_per_rank

    per_layer = layer_params_per_rank(SMALL, 1)
    topo = load_topology("dgx-h100")
    for live_layers, depth, held in ((2, 4, 2), (3, 4, 3), (10, 2, 3)):
        plan = ParallelPlan(dp=8, micro_batch_size=4, global_batch_size=32, zero_stage=3, zero3_prefetch_depth=depth,
                            zero3_max_live_parameters=live_layers * per_layer)
        _, series = timeline(simulate_training(Job(SMALL, plan, H100, topo)).trace, 0)
        assert max(series["gathered"]) == pytest.approx(held * 2 * per_layer, rel=1e-9)


def test_zero_bucket_size_sets_the_reduce_scatters_per_micro_batch():
    # ZeRO-2 reduce-scatters every micro-batch's gradients: one bucket per micro-batch when
    # the bucket holds them all, one per layer (+ embedding and head) when it holds one byte.
    topo = load_topology("dgx-h100")
    m = 2
    for bucket, per_mb in ((2**40, 1), (1, SMALL.num_layers + 2)):
        plan = ParallelPlan(dp=8, global_batch_size=8 * m, zero_stage=2, zero_bucket_size_bytes=bucket)
        run = simulate_training(Job(SMALL, plan, H100, topo))
        rs = [s for s in run.trace.spans_of(0) if s.name.startswith("grad bucket")]
        assert len(rs) == m * per_mb
        assert sum(s.nbytes for s in rs) == pytest.approx(m * 2 * SMALL.num_params, rel=1e-12)
        # the parameter all-gather after the step: whole tensors per bucket, so at most one
        # bucket per layer (+ embedding and head), however small the bucket (was 2Ψ actions)
        ag = [s for s in run.trace.spans_of(0) if s.name.startswith("param allgather")]
        assert 1 <= len(ag) <= SMALL.num_layers + 2
        assert sum(s.nbytes for s in ag) == pytest.approx(2 * SMALL.num_params, rel=1e-12)


@pytest.mark.parametrize("schedule,vpp", [("1f1b", 1), ("zb-h1", 1), ("zb-h2", 1), ("interleaved", 2)])
def test_first_stage_activation_peak_follows_each_schedules_rule(schedule, vpp):
    # p = 4, m = 8 (m >= 2p - 1, so every schedule reaches its steady state). Chunk-micro-
    # batches held by the first stage at its peak: 1F1B p; ZB-H1 p, its peak equal to 1F1B's
    # (Qi et al. ICLR 2024: p·M_B); ZB-H2 2p - 1 ((2p-1)·M_B); interleaved with v chunks
    # p·v·(1 + (p-1)/(p·v)) (Korthikanti et al. 2022). No dropout, so the embedding stores
    # nothing and a chunk-micro-batch is its chunk's layers' activations. Measured on the
    # memory timeline of rank 0.
    from sim.program.memory import Storing, activation_bytes_per_layer

    p, m, v = 4, 8, vpp
    expected = {"1f1b": p, "zb-h1": p, "zb-h2": 2 * p - 1, "interleaved": p * v * (1 + (p - 1) / (p * v))}[schedule]
    model = gpt("nodrop", 8, 1024, 16, 1024, 512, dropout=False)
    plan = ParallelPlan(pp=p, vpp=v, global_batch_size=m, schedule=schedule)
    run = simulate_training(Job(model, plan, H100, load_topology("dgx-h100")))
    _, series = timeline(run.trace, plan.rank(pp=0))
    per_chunk_mb = model.num_layers // (p * v) * activation_bytes_per_layer(model, Storing.of(1))
    assert max(series["activations"]) == pytest.approx(expected * per_chunk_mb, rel=1e-12)


def test_the_program_takes_its_optimizer_times_and_offload_bytes_from_costs_and_memory():
    from dataclasses import replace

    from sim.errors import InputError
    from sim.program.costs import ADAM_BYTES_PER_PARAM, cpu_optimizer_step_time, optimizer_step_time
    from sim.program.memory import offload_copy_bytes, param_allgather_bytes, stage_params_per_rank

    plan = ParallelPlan(dp=8, global_batch_size=8, zero_stage=2, offload_optimizer=True)
    _, prog = build_program(SMALL, plan, H100)
    psi = stage_params_per_rank(SMALL, plan, 0)
    acts = {a.name: a for a in prog.actions[0]}
    # ZeRO-Offload: Adam moves 28 bytes per parameter of the rank's shard, at the host's
    # memory bandwidth shared by the node's 8 GPUs
    cpu = acts["optimizer (CPU)"].duration_s
    assert cpu == cpu_optimizer_step_time(psi / 8, H100, 8)
    assert cpu == pytest.approx(ADAM_BYTES_PER_PARAM * psi / 8
                                / (H100.host_memory_bandwidth_Bps * H100.memory_efficiency / 8), rel=1e-12)
    assert acts["grads to host"].nbytes == acts["params to GPU"].nbytes == offload_copy_bytes(psi, 8) == 2.0 * psi / 8
    with pytest.raises(InputError, match="host_memory_bandwidth_Bps is not set"):
        build_program(SMALL, plan, replace(H100, host_memory_bandwidth_Bps=0.0))

    plan = ParallelPlan(dp=8, global_batch_size=8, zero_stage=1)
    _, prog = build_program(SMALL, plan, H100)
    acts = {a.name: a for a in prog.actions[0]}
    assert acts["optimizer"].duration_s == optimizer_step_time(psi / 8, H100)
    gathers = [a for a in prog.actions[0] if a.name.startswith("param allgather")]
    assert sum(a.nbytes for a in gathers) == pytest.approx(param_allgather_bytes(psi), rel=1e-12)
