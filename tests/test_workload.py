"""Per-layer ops: FLOPs against Zero Bubble's F/B/W, Megatron Eq. 3, Korthikanti Eq. 7/8;
tensor- and sequence-parallel splits; bytes of hand-computed tiny cases."""

import json

import pytest

from sim.errors import InputError
from sim.inputs.model import gpt, llama, preset
from sim.program.workload import LayerRun, Op, embedding_work, head_work, layer_work, p2p_bytes

MATMUL = ("gemm", "attention")


@pytest.mark.parametrize("name", ["gpt-22b", "gpt-175b", "gpt2-1.5b"])
@pytest.mark.parametrize("b", [1, 4])
def test_fbw_match_zero_bubble_table(name, b):
    # Qi et al. (ICLR 2024): F = sbh(24h+4s), B = sbh(24h+8s), W = sbh·24h per layer.
    m = preset(name)
    s, h = m.seq_length, m.hidden_size
    w = layer_work(m, LayerRun(b))
    assert w.flops("F", kinds=MATMUL) == pytest.approx(s * b * h * (24 * h + 4 * s), rel=1e-12)
    assert w.flops("B", kinds=MATMUL) == pytest.approx(s * b * h * (24 * h + 8 * s), rel=1e-12)
    assert w.flops("W", kinds=MATMUL) == pytest.approx(s * b * h * 24 * h, rel=1e-12)


@pytest.mark.parametrize("tp,sp", [(2, False), (8, False), (8, True)])
def test_tensor_parallel_splits_every_matmul(tp, sp):
    m = preset("gpt-175b")
    whole = layer_work(m, LayerRun(1))
    part = layer_work(m, LayerRun(1, tp=tp, sequence_parallel=sp))
    for phase in "FBW":
        assert part.flops(phase, kinds=MATMUL) * tp == pytest.approx(whole.flops(phase, kinds=MATMUL), rel=1e-12)


def test_megatron_eq3_full_recompute_gpt3_175b():
    # Narayanan et al. SC'21 Eq. 3: F = 96·B·s·l·h²·(1 + s/(6h) + V/(16lh)), per iteration.
    for name in ("gpt3-175b", "gpt-175b"):
        m = preset(name)
        B, s, l, h, V = 1536, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size
        eq3 = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        layer, head = layer_work(m, LayerRun(1, recompute="full")), head_work(m, 1)
        matmul = B * (l * layer.flops(kinds=MATMUL) + head.flops(kinds=MATMUL))
        everything = B * (l * layer.flops() + head.flops() + embedding_work(m, 1).flops())
        assert matmul == pytest.approx(eq3, rel=1e-12)        # the same sum, term by term
        assert everything == pytest.approx(eq3, rel=0.01)      # elementwise ops included: within 1%
        assert everything > eq3                                # Eq. 3 is a lower bound


@pytest.mark.parametrize("name", ["gpt-22b", "gpt-175b", "gpt-530b"])
def test_korthikanti_eq7_and_selective_recompute(name):
    m = preset(name)
    B, s, L, h, V = 1024, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    eq7 = 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    head = head_work(m, 1).flops(kinds=MATMUL)
    model_flops = B * (L * layer_work(m, LayerRun(1)).flops(kinds=MATMUL) + head)
    assert model_flops == pytest.approx(eq7, rel=1e-12)
    # Selective recompute re-runs the attention core's forward (4bs²h per layer) once.
    sel = B * (L * layer_work(m, LayerRun(1, recompute="selective")).flops(kinds=MATMUL) + head)
    assert sel - model_flops == pytest.approx(4 * B * L * s * s * h, rel=1e-9)
    # Eq. 8 (72BLsh²(1 + s/(3h) + V/(12hL))) charges 12BLs²h for it: the attention core's
    # forward *and* backward a second time. We charge only the forward that actually reruns.
    eq8 = 72 * B * L * s * h * h * (1 + s / (3 * h) + V / (12 * h * L))
    assert eq8 - eq7 == pytest.approx(3 * (sel - model_flops), rel=1e-9)


def test_full_recompute_reruns_the_forward_at_the_start_of_b():
    w = layer_work(preset("gpt-22b"), LayerRun(2, tp=4, recompute="full"))
    b_items = w.phase("B")
    fwd = w.phase("F")
    rerun = [i for i in b_items if i.recompute]
    assert [i.name for i in rerun] == [i.name for i in fwd]
    assert b_items[:len(rerun)] == tuple(rerun)
    assert all(i.phase == "B" for i in rerun)


def test_tp_collectives_and_sizes():
    m = preset("gpt-22b")
    b, t = 2, 8
    sbh2 = 2 * b * m.seq_length * m.hidden_size
    plain = layer_work(m, LayerRun(b, tp=t))
    assert [(c.phase, c.collective) for c in plain.comms()] == [
        ("F", "all_reduce"), ("F", "all_reduce"), ("B", "all_reduce"), ("B", "all_reduce")]
    assert all(c.nbytes == sbh2 for c in plain.comms())
    sp = layer_work(m, LayerRun(b, tp=t, sequence_parallel=True))
    kinds = [(c.phase, c.collective) for c in sp.comms()]
    assert kinds.count(("F", "all_gather")) == 2 and kinds.count(("F", "reduce_scatter")) == 2
    assert kinds.count(("B", "all_gather")) == 2 and kinds.count(("B", "reduce_scatter")) == 2
    assert kinds.count(("W", "all_gather")) == 2          # re-gather of sharded inputs for dW
    assert all(c.nbytes == sbh2 for c in sp.comms())
    assert layer_work(m, LayerRun(b, tp=1, sequence_parallel=True)).comms() == ()


def test_sequence_parallel_shrinks_norms_not_gemms():
    m = preset("gpt-22b")
    a = {o.name: o for o in layer_work(m, LayerRun(1, tp=8)).ops("F")}
    s = {o.name: o for o in layer_work(m, LayerRun(1, tp=8, sequence_parallel=True)).ops("F")}
    assert s["attn.norm"].output_bytes * 8 == a["attn.norm"].output_bytes
    assert s["mlp.residual"].output_bytes * 8 == a["mlp.residual"].output_bytes
    assert s["attn.qkv"].flops == a["attn.qkv"].flops


def test_tiny_layer_by_hand():
    # b=1, s=4, h=8, 2 heads, ffn 32, tp=1: hand-computed shapes and bytes.
    m = gpt("tiny", 1, 8, 2, 10, 4)
    ops = {o.name: o for o in layer_work(m, LayerRun(1)).ops()}
    qkv = ops["attn.qkv"]
    assert qkv.shape == (4, 24, 8) and qkv.flops == 2 * 4 * 24 * 8
    assert qkv.bytes_read == 2 * (4 * 8 + 8 * 24) and qkv.bytes_written == 2 * 4 * 24
    core = ops["attn.core"]
    assert core.flops == 4 * 1 * 4 * 4 * 8 and core.shape == (4, 4, 4) and core.batch == 2
    assert ops["mlp.up.wgrad"].shape == (8, 32, 4)          # dW = Xᵀ·dY, inner dim = tokens
    assert ops["mlp.down.dgrad"].shape == (4, 32, 8)
    assert ops["attn.residual"].bytes_written == 2 * 4 * 8 + 4 * 8   # output + 1-byte dropout mask


def test_llama_gqa_swiglu_shapes():
    m = preset("llama3-8b")
    ops = {o.name: o for o in layer_work(m, LayerRun(1, tp=8)).ops()}
    assert ops["attn.qkv"].shape == (8192, (4096 + 2 * 1024) // 8, 4096)
    assert ops["mlp.up"].shape == (8192, 2 * 14336 // 8, 4096)     # gate and up, fused
    assert ops["mlp.swiglu"].bytes_read == 2 * 2 * 8192 * 14336 // 8
    assert ops["mlp.residual"].bytes_written == 2 * 8192 * 4096    # no dropout mask in Llama
    m2 = llama("t", 1, 64, 8, 2, 128, 100, 16)
    f = layer_work(m2, LayerRun(1)).flops("F", kinds=MATMUL)
    s, h, kv, ff = 16, 64, 16, 128
    assert f == 2 * s * h * (h + 2 * kv) + 4 * s * s * h + 2 * s * h * h + 2 * s * h * 2 * ff + 2 * s * ff * h


def test_head_and_embedding():
    m = preset("gpt-175b")
    b, s, h, V = 2, m.seq_length, m.hidden_size, m.vocab_size
    head = head_work(m, b, tp=8)
    assert head.flops(kinds=MATMUL) * 8 == pytest.approx(6 * b * s * h * V, rel=1e-12)
    assert embedding_work(m, b).flops(kinds=MATMUL) == 0
    assert p2p_bytes(m, b) == 2 * b * s * h and p2p_bytes(m, b, 8, True) == 2 * b * s * h / 8
    assert all(isinstance(o, Op) for o in head.ops())


def test_bad_tp_is_one_line_error():
    with pytest.raises(InputError) as info:
        layer_work(preset("gpt2-1.5b"), LayerRun(1, tp=2))     # 25 heads
    assert "num_attention_heads 25" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(InputError, match="recompute"):
        layer_work(preset("gpt2-1.5b"), LayerRun(1, recompute="some"))


def test_chunk_work_places_embedding_and_head():
    from sim.inputs.plan import ParallelPlan
    from sim.program.workload import chunk_work
    m = preset("llama3-8b")
    plan = ParallelPlan(pp=4, vpp=2, global_batch_size=8)
    names = {v: [w.name for w in chunk_work(m, plan, v)] for v in range(8)}
    assert names[0] == ["embedding"] + ["layer"] * 4
    assert names[7] == ["layer"] * 4 + ["head"]
    assert all(names[v] == ["layer"] * 4 for v in range(1, 7))
    with pytest.raises(InputError, match="virtual_stage"):
        chunk_work(m, plan, 8)
    # first and last rank 4 layers, middle ranks (32 - 8) / 2 = 12; each over vpp = 2 chunks
    uneven = ParallelPlan(pp=4, vpp=2, global_batch_size=8, first_stage_layers=4, last_stage_layers=4)
    counts = [[w.name for w in chunk_work(m, uneven, v)].count("layer") for v in range(8)]
    assert counts == [2, 6, 6, 2] * 2 and sum(counts) == 32


def test_unfused_attention_has_flash_flops_and_moves_the_scores():
    """Megatron-LM's original core attention: the same matmul FLOPs as the flash kernel
    (4·b·s²·h/t forward, 8·b·s²·h/t backward), but the b·(a/t)·s² bf16 scores are written
    by QKᵀ, read and written by the softmax and read by AV."""
    from sim.inputs.model import preset
    from sim.program.workload import LayerRun, layer_work

    m = preset("gpt3-175b")
    b, t, s, h, a = 1, 8, m.seq_length, m.hidden_size, m.num_attention_heads
    flash = layer_work(m, LayerRun(b, t, attention="flash"))
    unfused = layer_work(m, LayerRun(b, t, attention="unfused"))
    for phase in ("F", "B", "W"):
        assert unfused.flops(phase, kinds=("gemm", "attention")) == pytest.approx(
            flash.flops(phase, kinds=("gemm", "attention")), rel=1e-12)
    assert unfused.flops("F", kinds=("gemm", "attention")) == pytest.approx(b * s * h * (24 * h + 4 * s) / t)
    scores = 2 * b * (a // t) * s * s  # bytes of the bf16 scores
    softmax = next(o for o in unfused.ops("F") if o.name == "attn.softmax")
    assert softmax.bytes_read == scores and softmax.bytes_written == scores
    qk = next(o for o in unfused.ops("F") if o.name == "attn.scores")
    assert qk.shape == (s, s, m.head_dim) and qk.batch == b * a // t and qk.bytes_written == scores
    assert not [o for o in unfused.ops() if o.kind == "attention"]
    # more bytes, so never faster on the same GPU
    from sim.inputs.hardware import load_profile
    from sim.program.costs import work_times

    prof = load_profile("a100-80gb")
    slow, fast = work_times(unfused, prof, t), work_times(flash, prof, t)
    assert slow["B"][0] > fast["B"][0] and slow["F"][0] > fast["F"][0]


def test_attention_flag_reaches_the_run(capsys):
    from sim.cli import main

    base = ["run", "--model", "gpt2-1.5b", "--gpu", "a100-80gb", "--gpus", "8", "--global-batch-size", "8", "--json"]
    assert main(base) == 0
    flash = json.loads(capsys.readouterr().out)
    assert main(base + ["--attention", "unfused"]) == 0
    unfused = json.loads(capsys.readouterr().out)
    assert unfused["iteration_time_s"] > flash["iteration_time_s"]
    assert unfused["memory"]["activations_bytes"] > flash["memory"]["activations_bytes"]
    assert main(base + ["--attention", "fused"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fused" in err and "unfused" in err


def test_forward_linear_gemms_carry_their_bias():
    # GPT's linear layers have biases (added in the forward GEMM), Llama's none; the
    # gradients' GEMMs never add one.
    gemms = [op for op in layer_work(gpt("g", 2, 64, 2, 256, 32), LayerRun(1)).ops() if op.kind == "gemm"]
    assert {op.name for op in gemms if op.bias} == {"attn.qkv", "attn.proj", "mlp.up", "mlp.down"}
    assert all(op.phase == "F" for op in gemms if op.bias)
    assert not any(op.bias for op in layer_work(llama("l", 2, 64, 2, 2, 256, 512, 32), LayerRun(1)).ops())


def test_unfused_gradient_accumulation_adds_a_pass_per_weight_gradient():
    # --no-gradient-accumulation-fusion: after each weight-gradient GEMM, the gradient
    # (2-byte) and the fp32 main gradient are read and the main gradient written: 10
    # bytes per local weight, the layer's 12h^2/t weights (biases and norms are not GEMMs).
    from sim.inputs.plan import ParallelPlan
    from sim.program.workload import accumulate_wgrads, chunk_work

    h, t = 64, 2
    layer = layer_work(gpt("g", 2, h, 2, 256, 32), LayerRun(1, tp=t))
    assert accumulate_wgrads(layer, fused=True) is layer
    extra = [o for o in accumulate_wgrads(layer, fused=False).ops() if o.name.endswith(".accumulate")]
    assert [o.name for o in extra] == [f"{n}.wgrad.accumulate" for n in ("mlp.down", "mlp.up", "attn.proj", "attn.qkv")]
    assert all(o.phase == "W" and o.kind == "memory" and o.framework for o in extra)
    assert sum(o.bytes_read + o.bytes_written for o in extra) == 10 * 12 * h * h / t
    # The plan's flag reaches every chunk, the logit layer's weight gradient included.
    model = gpt("g", 2, h, 2, 256, 32)
    plan = ParallelPlan(pp=1, gradient_accumulation_fusion=False)
    names = [o.name for w in chunk_work(model, plan, 0) for o in w.ops() if o.name.endswith(".accumulate")]
    assert len(names) == 2 * 4 + 1 and names[-1] == "head.logits.wgrad.accumulate"
    assert not any(o.name.endswith(".accumulate") for w in chunk_work(model, ParallelPlan(), 0) for o in w.ops())


@pytest.mark.parametrize("fidelity", ["full", "reduced"])
def test_unfused_accumulation_lengthens_the_step_by_its_passes(fidelity):
    # One GPU, four micro-batches, no communication: the step grows by exactly the
    # accumulation passes' time, four times over, in the simulation and in the estimate.
    from sim.inputs.hardware import load_profile
    from sim.inputs.plan import ParallelPlan
    from sim.inputs.topology_build import load_topology
    from sim.program.costs import op_time
    from sim.program.estimate import estimate
    from sim.program.workload import chunk_work
    from sim.inputs.schema import SimulationSettings
    from sim.session import Job, simulate_training

    model, prof, topo = gpt("g", 2, 512, 8, 1024, 256), load_profile("a100-80gb"), load_topology("dgx-a100")
    plans = [ParallelPlan(micro_batch_size=1, global_batch_size=4, gradient_accumulation_fusion=f) for f in (True, False)]
    passes = sum(op_time(o, prof) for w in chunk_work(model, plans[1], 0) for o in w.ops()
                 if o.name.endswith(".accumulate"))
    assert passes > 0
    sims = [simulate_training(Job(model, p, prof, topo),
                              SimulationSettings(fidelity=fidelity)).trace.end_s for p in plans]
    assert sims[1] - sims[0] == pytest.approx(4 * passes, rel=1e-9)
    est = [estimate(model, p, prof).time["compute"] for p in plans]
    assert est[1] - est[0] == pytest.approx(4 * passes, rel=1e-9)
