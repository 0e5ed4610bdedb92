"""ParallelPlan validation, the analytic estimate and ``trainsim estimate``."""

import json

import pytest

from sim.cli import main
from sim.inputs.pacing import paced
from sim.program.costs import op_time, work_times
from sim.errors import InputError
from sim.program.estimate import estimate, model_flops_per_sequence
from sim.inputs.hardware import load_profile
from sim.inputs.model import preset
from sim.inputs.plan import ParallelPlan
from sim.program.workload import LayerRun, embedding_work, head_work, layer_work

A100 = load_profile("a100-80gb")


# ------------------------------------------------------------------------ plan
def one_line(fn, *words):
    with pytest.raises(InputError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_plan_validation_names_each_factor():
    one_line(lambda: ParallelPlan(tp=0), "tp", "0")
    one_line(lambda: ParallelPlan(dp=2, micro_batch_size=3, global_batch_size=8), "global_batch_size", "8", "6")
    one_line(lambda: ParallelPlan(recompute="most"), "recompute", "most")
    one_line(lambda: ParallelPlan(zero_stage=4), "zero_stage", "4")
    one_line(lambda: ParallelPlan(vpp=2), "vpp", "pp > 1")
    one_line(lambda: ParallelPlan(pp=4, vpp=2, global_batch_size=6), "multiple of pp = 4")
    one_line(lambda: ParallelPlan.for_world(12, tp=8), "world_size", "12", "8")
    one_line(lambda: ParallelPlan(tp=8).check_model(preset("gpt2-1.5b")), "tp", "num_attention_heads 25")
    one_line(lambda: ParallelPlan(pp=5).check_model(preset("llama3-8b")), "pp x vpp", "num_layers 32")


def test_plan_derived_values():
    p = ParallelPlan.for_world(64, tp=4, pp=2, micro_batch_size=2, global_batch_size=512)
    assert (p.dp, p.world_size, p.num_microbatches) == (8, 64, 32)
    assert ParallelPlan(dp=4).global_batch_size == 4
    assert not ParallelPlan(sequence_parallel=True).sp and ParallelPlan(tp=2, sequence_parallel=True).sp


# -------------------------------------------------------------------- estimate
def test_the_analytic_terms_are_the_cost_formulas():
    from sim.program.costs import (
        collective_time,
        grad_sync_time,
        optimizer_step_time,
        pipeline_bubble_time,
        ring_time,
    )
    from sim.program.memory import stage_memory_bytes, stage_params_per_rank
    from sim.program.training import build_program

    # ring closed forms: 2(n-1)(α + S/(nB)) and (n-1)(α + S/(nB)); a collective adds NCCL's
    # base latency for ring/Simple once (tuning.cc: 8.4 us), a send/recv none
    link = A100.link("ib")
    base = A100.nccl_base_latency_s["ring"]["simple"]
    assert base == pytest.approx(8.4e-6)
    for op, steps in (("all_reduce", 14), ("all_gather", 7), ("reduce_scatter", 7)):
        closed = steps * (link.latency_s + 1e9 / (8 * link.effective_Bps))
        assert ring_time(op, 1e9, 8, link.latency_s, link.effective_Bps) == closed
        assert collective_time(op, 1e9, 8, "ib", A100) == pytest.approx(base + closed, rel=1e-12)
        assert ring_time(op.replace("_", ""), 1e9, 8, link.latency_s, link.effective_Bps) == closed
    assert collective_time("all_reduce", 1e9, 1, "ib", A100) == 0.0
    assert collective_time("send_recv", 1e9, 2, "ib", A100) == pytest.approx(link.latency_s + 1e9 / link.effective_Bps)
    ar, ag, rs = (collective_time(op, 1e9, 8, "ib", A100) for op in ("all_reduce", "all_gather", "reduce_scatter"))
    assert grad_sync_time(1, 1e9, 8, 4, "ib", A100) == ar
    assert grad_sync_time(2, 1e9, 8, 4, "ib", A100) == 4 * rs + ag
    assert grad_sync_time(3, 1e9, 8, 4, "ib", A100) == 4 * (2 * ag + rs)
    assert grad_sync_time(3, 1e9, 1, 4, "ib", A100) == 0.0
    # bubbles: (p-1)T, (p-1)T/v, (p-1)(T_F+T_B-T_W), (p-1)max(0, T_F+T_B-2T_W)
    assert pipeline_bubble_time("1f1b", 4, 1, 1.0, 2.0, 0.5) == 3 * 3.5
    assert pipeline_bubble_time("interleaved", 4, 2, 1.0, 2.0, 0.5) == 3 * 3.5 / 2
    assert pipeline_bubble_time("zb-h1", 4, 1, 1.0, 2.0, 0.5) == 3 * 2.5
    assert pipeline_bubble_time("zb-h2", 4, 1, 1.0, 1.0, 1.0) == 0.0

    # the simulator's optimizer step and the estimate's are one formula: 28 bytes per local parameter
    m = preset("gpt2-1.5b")
    plan = ParallelPlan(dp=4, zero_stage=1, micro_batch_size=2, global_batch_size=8)
    psi = stage_params_per_rank(m, plan, 0)
    est = estimate(m, plan, A100)
    opt = next(a for a in build_program(m, plan, A100)[1].actions[0] if a.name == "optimizer")
    assert opt.duration_s == est.time["optimizer"] == optimizer_step_time(psi / 4, A100)
    assert est.time["optimizer"] == pytest.approx(
        # Adam 28 B per parameter of the shard, the gradient norm 4, clipping 8 (read and
        # write), the fp32 -> bf16 weight copy 6 (Megatron-LM's distributed optimizer)
        (28 + 4 + 8 + 6) * psi / 4 / (A100.hbm_bandwidth_Bps * A100.memory_efficiency), rel=1e-12)
    assert est.memory == stage_memory_bytes(m, plan, est.worst_stage)


def test_single_gpu_step_is_the_sum_of_op_times():
    m = preset("gpt2-1.5b")
    plan = ParallelPlan(micro_batch_size=2, global_batch_size=8)
    est = estimate(m, plan, A100)
    ops = [*embedding_work(m, 2).ops(), *head_work(m, 2).ops()]
    per_mb = sum(op_time(o, A100) for o in ops) + m.num_layers * sum(op_time(o, A100) for o in layer_work(m, LayerRun(2)).ops())
    assert est.time["compute"] == pytest.approx(4 * per_mb, rel=1e-12)
    assert est.time["tp_comm"] == est.time["pipeline_bubble"] == est.time["dp_comm"] == 0
    parts = sum(v for k, v in est.time.items() if k != "step")
    assert est.time["step"] == pytest.approx(parts)
    assert est.tokens_per_s == pytest.approx(8 * 1024 / est.time["step"])
    # states 16Ψ on one GPU; activations for one micro-batch in flight
    assert est.memory["weights"] + est.memory["gradients"] + est.memory["optimizer"] == 16 * m.num_params
    assert est.memory["total"] == pytest.approx(sum(v for k, v in est.memory.items() if k != "total"))


def test_model_flops_are_korthikanti_eq7_and_mfu_follows():
    m = preset("gpt-175b")
    plan = ParallelPlan(dp=16, tp=8, pp=12, global_batch_size=1536, recompute="full")
    est = estimate(m, plan, A100)
    B, s, L, h, V = 1536, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    assert est.model_flops_per_step == pytest.approx(72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L)), rel=1e-12)
    assert est.hardware_flops_per_step == pytest.approx(96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)), rel=1e-12)
    assert est.mfu == pytest.approx(est.model_flops_per_step / (est.time["step"] * 1536 * 312e12))
    assert est.model_flops_per_step == B * model_flops_per_sequence(m)


def test_pipeline_bubble_fraction():
    # Narayanan et al.: bubble / ideal compute = (p-1)/(v·m) for equal stages.
    m = preset("llama3-8b")
    for p, v, mb in ((4, 1, 8), (4, 2, 8), (8, 4, 16)):
        est = estimate(m, ParallelPlan(pp=p, vpp=v, global_batch_size=mb), A100)
        busy = est.time["compute"] + est.time["tp_comm"]
        assert est.time["pipeline_bubble"] / busy == pytest.approx((p - 1) / (v * mb), rel=1e-12)


def test_zero_bubble_closed_forms():
    # Qi et al. (ICLR 2024): bubble 1F1B (p-1)(T_F+T_B+T_W), ZB-H1 (p-1)(T_F+T_B-T_W),
    # ZB-H2 (p-1)(T_F+T_B-2T_W), with T the slowest stage's per-micro-batch phase times.
    m = preset("gpt2-1.5b")
    p = 4
    est = {s: estimate(m, ParallelPlan(pp=p, global_batch_size=8, schedule=s), A100)
           for s in ("gpipe", "1f1b", "zb-h1", "zb-h2")}
    slowest = paced(A100, p)  # (4 GPUs: the expected slowest one's pace, gpu_speed_spread)
    layer, head, emb = (work_times(w, slowest) for w in (layer_work(m, LayerRun(1)), head_work(m, 1), embedding_work(m, 1)))
    n = m.num_layers // p
    stages = [{ph: n * layer[ph][0] + (emb[ph][0] if s == 0 else 0) + (head[ph][0] if s == p - 1 else 0)
               for ph in "FBW"} for s in range(p)]
    t = max(stages, key=lambda st: sum(st.values()))
    f, b, w = t["F"], t["B"], t["W"]
    assert est["1f1b"].time["pipeline_bubble"] == pytest.approx((p - 1) * (f + b + w), rel=1e-12)
    assert est["gpipe"].time["pipeline_bubble"] == est["1f1b"].time["pipeline_bubble"]
    assert est["zb-h1"].time["pipeline_bubble"] == pytest.approx((p - 1) * (f + b - w), rel=1e-12)
    assert est["zb-h2"].time["pipeline_bubble"] == pytest.approx((p - 1) * max(0, f + b - 2 * w), rel=1e-12)
    # Micro-batches stashed on stage i: GPipe all 8, 1F1B p - i; ZB-H1 p = 4 and ZB-H2
    # 2p - 1 = 7 on every stage, since a micro-batch's activations stay until its W (so the
    # last stage keeps p micro-batches' logits under ZB-H1 where 1F1B keeps one).
    from sim.program.memory import Storing, activation_bytes_per_layer, embedding_activation_bytes, head_activation_bytes
    held = {"gpipe": lambda i: 8, "1f1b": lambda i: p - i, "zb-h1": lambda i: p, "zb-h2": lambda i: 2 * p - 1}
    per_layer, on_first, on_last = (activation_bytes_per_layer(m, Storing.of(1)), embedding_activation_bytes(m, 1),
                                    head_activation_bytes(m, 1))
    for s, e in est.items():
        i = e.worst_stage
        per_mb = n * per_layer + (on_first if i == 0 else 0) + (on_last if i == p - 1 else 0)
        assert e.memory["activations"] == pytest.approx(held[s](i) * per_mb, rel=1e-12), s
    acts = {s: e.memory["activations"] for s, e in est.items()}
    assert acts["gpipe"] > acts["zb-h2"] > acts["zb-h1"] > acts["1f1b"]


def test_uneven_split_moves_the_worst_stage():
    from sim.program.memory import layer_params_per_rank
    m = preset("llama3-8b")
    even = estimate(m, ParallelPlan(pp=4, global_batch_size=8), A100)
    uneven = estimate(m, ParallelPlan(pp=4, global_batch_size=8, first_stage_layers=5), A100)   # 5, 9, 9, 9
    assert uneven.worst_stage == 1
    assert uneven.memory["weights"] == 2 * 9 * layer_params_per_rank(m)
    assert uneven.time["compute"] > even.time["compute"]       # 9 layers on the slowest stage instead of 8 + head


def test_links_follow_the_placement():
    m = preset("llama3-8b")
    kw = dict(dp=2, tp=4, pp=2, global_batch_size=4)
    assert estimate(m, ParallelPlan(**kw), A100).links == {"tp": "nvlink", "pp": "nvlink", "dp": "ib"}
    assert estimate(m, ParallelPlan(**kw, placement="tp-dp-pp"), A100).links == {"tp": "nvlink", "pp": "ib", "dp": "nvlink"}
    assert estimate(m, ParallelPlan(dp=2, tp=8, global_batch_size=2, placement="dp-tp-pp"), A100).links["tp"] == "ib"


def test_zero3_moves_one_and_a_half_times_the_bytes_of_dp():
    # ZeRO paper: DP 2Ψ per step (reduce-scatter + all-gather), ZeRO-3 3Ψ (1.5x); one micro-batch.
    m = preset("gpt2-1.5b")
    dp = estimate(m, ParallelPlan(dp=64, global_batch_size=64), A100).time["dp_comm"]
    z3 = estimate(m, ParallelPlan(dp=64, global_batch_size=64, zero_stage=3), A100).time["dp_comm"]
    # NCCL's base latency is per collective: one all-reduce against two all-gathers and a
    # reduce-scatter; the bytes' part keeps the paper's ratio
    base = A100.nccl_base_latency_s["ring"]["simple"]
    assert z3 - 3 * base == pytest.approx(1.5 * (dp - base), rel=1e-12)


def test_memory_shrinks_with_zero_and_recompute():
    m = preset("llama3-70b")
    base = dict(dp=8, tp=8, micro_batch_size=1, global_batch_size=64)
    mems = [estimate(m, ParallelPlan(**base, zero_stage=z), A100).memory for z in range(4)]
    states = [x["weights"] + x["gradients"] + x["optimizer"] for x in mems]
    assert states[0] > states[1] > states[2] > states[3]
    acts = [estimate(m, ParallelPlan(**base, recompute=r), A100).memory["activations"]
            for r in ("none", "selective", "full")]
    assert acts[0] > acts[1] > acts[2]
    assert not estimate(m, ParallelPlan(dp=64, global_batch_size=64), A100).fits   # 70B on one GPU: no


@pytest.mark.parametrize("kind,gpus,arg,published", [
    # Megatron-LM SC'21 Table 2 (REFERENCE.md): 174.6B, A100-80GB, batch 1536, TFLOP/s per GPU.
    ("ptd-p", 384, 4, 153), ("ptd-p", 768, 8, 149), ("ptd-p", 1536, 16, 141),
    ("zero-3", 384, 4, 144), ("zero-3", 768, 2, 88), ("zero-3", 1536, 1, 44),
])
def test_first_order_estimate_near_megatron_table2(kind, gpus, arg, published):
    """The first-order estimate is not a simulation: it ignores overlap and contention and
    assumes the best GEMM efficiency. We hold it to within 25% of the published figures.

    ZeRO-3's published figures are only reached if each data-parallel ring crosses nodes
    through one NIC (``dp_channels=1``): 60 s of exposed communication per step at 1536
    GPUs is about 1 TB per GPU at one HDR NIC's ~24 GB/s. With NCCL's one ring per NIC
    (the default, and the simulator's network; REFERENCE.md's 192 GB/s across DGX A100
    nodes) the estimate is far more optimistic than DeepSpeed's 2021 ZeRO-3 achieved;
    ``test_zero3_default_channels_are_optimistic`` pins that gap down."""
    m = preset("gpt-175b")
    if kind == "ptd-p":
        plan = ParallelPlan(dp=arg, tp=8, pp=12, global_batch_size=1536, recompute="full")
    else:
        plan = ParallelPlan(dp=gpus, micro_batch_size=arg, global_batch_size=1536, recompute="full", zero_stage=3)
    est = estimate(m, plan, A100, dp_channels=1)
    assert est.hardware_tflops_per_gpu == pytest.approx(published, rel=0.25)


def test_zero3_default_channels_are_optimistic_against_megatron_table2():
    # With all 8 NICs per node carrying the rings, ZeRO-3 at 1536 GPUs would be
    # compute-bound, far above the 44 TFLOP/s published: the published run did not get
    # NCCL's multi-NIC bandwidth. The default never predicts less than one NIC would.
    m = preset("gpt-175b")
    for gpus, mb, published in ((384, 4, 144), (768, 2, 88), (1536, 1, 44)):
        plan = ParallelPlan(dp=gpus, micro_batch_size=mb, global_batch_size=1536, recompute="full", zero_stage=3)
        default = estimate(m, plan, A100).hardware_tflops_per_gpu
        one_nic = estimate(m, plan, A100, dp_channels=1).hardware_tflops_per_gpu
        assert default > one_nic and default > 1.25 * published


# ------------------------------------------------------------------------- CLI
def test_cli_json(capsys):
    assert main(["estimate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16",
                 "--tensor-model-parallel-size", "2", "--global-batch-size", "64",
                 "--recompute-granularity", "selective", "--sequence-parallel", "--zero", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["dp"] == 8 and out["plan"]["tp"] == 2 and out["plan"]["sequence_parallel"]
    assert out["gpu"] == "h100-sxm" and out["num_params"] == 8_030_261_248
    assert set(out["memory"]) == {"weights", "gradients", "optimizer", "activations", "temporaries", "total"}


def test_cli_pipeline_flags(capsys):
    assert main(["estimate", "--model", "llama3-405b", "--gpus", "128", "--tensor-model-parallel-size", "8",
                 "--pipeline-model-parallel-size", "16", "--global-batch-size", "32", "--schedule", "zb-h1",
                 "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
                 "--placement", "tp-dp-pp", "--json"]) == 1  # 405B on 128 A100s does not fit: exit 1 (issue 54)
    out = json.loads(capsys.readouterr().out)
    plan = out["plan"]
    assert out["fits"] is False
    assert (plan["schedule"], plan["placement"], plan["account_for_embedding"], plan["account_for_loss"]) == \
        ("zb-h1", "tp-dp-pp", True, True)
    assert main(["estimate", "--model", "llama3-8b", "--pipeline-model-parallel-size", "4",
                 "--decoder-first-pipeline-num-layers", "5", "--global-batch-size", "8"]) == 0
    assert "layers per pipeline stage: 5 9 9 9" in capsys.readouterr().out
    assert main(["estimate", "--model", "llama3-8b", "--pipeline-model-parallel-size", "4",
                 "--decoder-first-pipeline-num-layers", "4", "--decoder-last-pipeline-num-layers", "4",
                 "--num-virtual-stages-per-pipeline-rank", "2", "--global-batch-size", "8", "--json"]) == 1  # 96 GiB
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is False and out["plan"]["vpp"] == 2 and out["plan"]["schedule"] == "interleaved"


def test_cli_table_and_model_sources(capsys, tmp_path):
    assert main(["estimate", "--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16",
                 "--vocab-size", "51200", "--seq-length", "2048", "--gpus", "8", "--global-batch-size", "32"]) == 0
    text = capsys.readouterr().out
    for word in ("memory per GPU", "total", "step time", "MFU", "dp 8 x tp 1 x pp 1"):
        assert word in text
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                               "vocab_size": 128256, "max_position_embeddings": 8192}))
    # 8B on one A100 does not fit: exit 1 (issue 54), the estimate printed all the same
    assert main(["estimate", "--hf-config", str(cfg), "--seq-length", "4096", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["num_params"] == 8_030_261_248 and out["fits"] is False


@pytest.mark.parametrize("argv,words", [
    (["--model", "gpt-9"], ["gpt-9"]),
    (["--model", "gpt-22b", "--hf-config", "x.json"], ["--model", "--hf-config", "exactly one"]),
    ([], ["nothing"]),
    (["--model", "gpt-22b", "--gpus", "12", "--tensor-model-parallel-size", "8"], ["--gpus", "12"]),
    (["--model", "gpt2-1.5b", "--tensor-model-parallel-size", "2"], ["num_attention_heads 25"]),
    (["--model", "gpt-22b", "--gpu", "b300"], ["b300"]),
    (["--model", "gpt-22b", "--zero", "5"], ["--zero"]),
    (["--model", "gpt-22b", "--schedule", "pipedream"], ["--schedule", "pipedream"]),
    (["--model", "gpt-22b", "--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "6",
      "--schedule", "1f1b", "--global-batch-size", "8"], ["--num-virtual-stages-per-pipeline-rank: got 2", "'1f1b'"]),
    (["--model", "llama3-8b", "--pipeline-model-parallel-size", "4", "--decoder-first-pipeline-num-layers", "6"],
     ["--decoder-first-pipeline-num-layers", "6", "would divide"]),
    (["--model", "llama3-8b", "--pipeline-model-parallel-size", "5", "--account-for-loss-in-pipeline-split"],
     ["--account-for-loss-in-pipeline-split", "33"]),
    (["--model", "llama3-8b", "--pipeline-model-parallel-size", "4", "--decoder-last-pipeline-num-layers", "8",
      "--num-layers-per-virtual-pipeline-stage", "2"], ["--num-virtual-stages-per-pipeline-rank"]),
    (["--model", "gpt-22b", "--placement", "dp-tp"], ["placement", "dp-tp"]),
])
def test_cli_errors_are_one_line_exit_2(capsys, argv, words):
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainsim: error:")
    for w in words:
        assert w in err[0], err[0]


SHAPE = ["--num-layers", "4", "--vocab-size", "8192", "--seq-length", "512"]


@pytest.mark.parametrize("command", ["estimate", "run"])
@pytest.mark.parametrize("argv,flag,value", [
    (["--hidden-size", "512", "--num-attention-heads", "7"], "--num-attention-heads", "7"),
    (["--hidden-size", "512", "--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "3"],
     "--num-query-groups", "3"),
    (["--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "1024",
      "--max-position-embeddings", "512"], "--seq-length", "1024"),
])
def test_shape_errors_name_the_megatron_flag_typed(capsys, command, argv, flag, value):
    # A shape given by flags that does not fit together is reported against the flag the
    # user typed, not against the ModelSpec field of a model called 'megatron'.
    assert main([command, *SHAPE, *argv, "--gpu", "h100-sxm"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"trainsim: error: {flag}: got {value};"), lines[0]
    assert "megatron" not in lines[0]
