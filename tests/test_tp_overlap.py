"""Tensor-parallel communication overlapped with GEMMs (``--tp-comm-overlap``,
``sim.program.tp``): hand-computed timelines of the chunk pipelines, and what a training
step gains and never beats."""

import contextlib
import io

import pytest

import sim
from sim.cli import main
from sim.engine.core import simulate
from sim.program.actions import Action, Program
from sim.program.tp import TP_COMM_STREAM, ItemReader, add_tp_collectives, overlapped_layer
from sim.program.workload import Comm, Op

OPS = {"all_gather": "allgather", "reduce_scatter": "reducescatter", "all_reduce": "allreduce"}


def _gemm(name, flops, shape=(4, 2, 2)):
    return Op(name, "F", "gemm", float(flops), 0.0, 0.0, 0.0, shape)


def _memory(name, flops):
    return Op(name, "F", "memory", float(flops), 0.0, 0.0, 0.0)


def _run(items, star, tp=2, sigma=0.0):
    """The items as one step on each of ``tp`` ranks, an op taking its FLOPs in seconds,
    on a star of 1 B/s links (a collective of S bytes over 2 ranks: S/2 s); ``sigma``: the
    engine's overlap slowdown."""
    segs = overlapped_layer(items, 0, tp, ItemReader(lambda op: op.flops, lambda it: isinstance(it, Comm),
                                                     lambda c: OPS[c.collective]))
    prog = Program({r: [Action("0F0", category="F")] for r in range(tp)})
    out = add_tp_collectives(prog, lambda r, a: segs, lambda r: tuple(range(tp)))
    return simulate(out, star([1.0] * tp), overlap_slowdown=sigma)


def _spans(trace, rank=0, stream=None):
    """(stream, start, end) of a rank's spans, times to 1e-9 s."""
    return sorted((s.stream, round(s.start_s, 9), round(s.end_s, 9)) for s in trace.spans
                  if s.rank == rank and stream in (None, s.stream))


def test_all_gather_chunks_feed_the_gemm_chunks(make_star):
    # norm 1 s; gather 8 B in 2 chunks of 4 B (2 s each); GEMM 12 s in 2 chunks of 6 s.
    # Chunk 0 of the gather waits for the norm, GEMM chunk i for gather chunk i:
    # norm [0,1], gather0 [1,3], gemm0 [3,9] beside gather1 [3,5], gemm1 [9,15].
    items = [_memory("attn.norm", 1), Comm("attn.all_gather", "F", "all_gather", 8.0), _gemm("attn.qkv", 12)]
    tr = _run(items, make_star)
    assert tr.end_s == pytest.approx(15.0)
    assert _spans(tr) == [("compute", 0.0, 1.0), ("compute", 3.0, 9.0), ("compute", 9.0, 15.0),
                          (TP_COMM_STREAM, 1.0, 3.0), (TP_COMM_STREAM, 3.0, 5.0)]
    # Without overlap the same step is the chain 1 + 4 + 12 = 17 s.
    assert 1 + 8 / 2 + 12 == 17 > tr.end_s


def test_reduce_scatter_chunks_follow_the_gemm_chunks(make_star):
    # Transformer Engine pipelines a forward GEMM's reduce-scatter in 4 chunks whatever tp
    # is: GEMM 12 s in chunks of 3 s; scatter 8 B in chunks of 2 B (1 s over 2 ranks);
    # residual 1 s after the last chunk: gemm0 [0,3], rs0 [3,4] beside gemm1 [3,6], ...,
    # gemm3 [9,12], rs3 [12,13], residual [13,14].
    items = [_gemm("attn.proj", 12), Comm("attn.reduce_scatter", "F", "reduce_scatter", 8.0),
             _memory("attn.residual", 1)]
    tr = _run(items, make_star)
    assert tr.end_s == pytest.approx(14.0)
    assert _spans(tr, stream=TP_COMM_STREAM) == [(TP_COMM_STREAM, 3.0 * c + 3, 3.0 * c + 4) for c in range(4)]


def test_gathers_beside_a_gemm_hold_no_sms_and_scatters_do(make_star):
    # Transformer Engine moves the ring-exchange all-gather chunks with the copy engines and
    # gives the pipelined reduce-scatter SMs of its own: with σ = 0.5, the all-gather case
    # keeps its timeline (15 s, as above), while each of GEMM chunks 1-3 does 1/1.5 s of its
    # 3 s beside the scatter chunk before it (1 s), so takes 1 + (3 - 1/1.5) s: gemm0 3 s,
    # then three such chunks, the last scatter chunk 1 s and the residual 1 s.
    gather = [_memory("attn.norm", 1), Comm("attn.all_gather", "F", "all_gather", 8.0), _gemm("attn.qkv", 12)]
    assert _run(gather, make_star, sigma=0.5).end_s == pytest.approx(15.0)
    scatter = [_gemm("attn.proj", 12), Comm("attn.reduce_scatter", "F", "reduce_scatter", 8.0),
               _memory("attn.residual", 1)]
    assert _run(scatter, make_star, sigma=0.5).end_s == pytest.approx(3 + 3 * (1 + (3 - 1 / 1.5)) + 1 + 1)


def test_weight_gradient_gather_runs_whole_beside_the_input_gradient(make_star):
    # The gather of the wgrad's input (8 B: 4 s) starts with the step, beside the dgrad
    # GEMM (6 s); the wgrad (4 s) waits for both: 6 + 4 = 10 s instead of 6 + 4 + 4.
    items = [_gemm("mlp.up.dgrad", 6), Comm("mlp.up.all_gather.input", "W", "all_gather", 8.0),
             _gemm("mlp.up.wgrad", 4)]
    tr = _run(items, make_star)
    assert tr.end_s == pytest.approx(10.0)
    assert _spans(tr, stream=TP_COMM_STREAM) == [(TP_COMM_STREAM, 0.0, 4.0)]


def test_all_reduce_is_not_overlapped(make_star):
    items = [_gemm("attn.proj", 2), Comm("attn.all_reduce", "F", "all_reduce", 4.0), _memory("attn.residual", 1)]
    tr = _run(items, make_star)
    # A chain: GEMM 2 s, all-reduce of 4 B over 2 ranks (an NCCL kernel: NCCL's base latency
    # of a ring under Simple, 8.4 us, then 2(n-1) steps of S/n: 2 x 2 s), residual 1 s.
    assert tr.end_s == pytest.approx(2 + 8.4e-6 + 4 + 1, rel=1e-12)
    assert not any(s.stream == TP_COMM_STREAM for s in tr.spans)


_SMALL_175B = dict(num_layers=8, hidden_size=12288, num_attention_heads=96, vocab_size=51200, seq_length=4096,
                   gpus=16, tensor_model_parallel_size=8, pipeline_model_parallel_size=2, global_batch_size=8,
                   sequence_parallel=True, gpu="h100-sxm")


def test_overlap_hides_tp_time_and_never_beats_the_compute_bound():
    off = sim.run(**_SMALL_175B, fidelity="full")
    on = sim.run(**_SMALL_175B, tp_comm_overlap=True, fidelity="full")
    assert on.summary["exposed_comm_s"]["tp"] < 0.5 * off.summary["exposed_comm_s"]["tp"]
    for run in (on, off):  # no rank finishes before its own compute is done
        for r in {s.rank for s in run.trace.spans}:
            busy = sum(s.end_s - s.start_s for s in run.trace.spans if s.rank == r and s.stream == "compute")
            assert run.iteration_time_s >= busy
    reduced = sim.run(**_SMALL_175B, tp_comm_overlap=True, fidelity="reduced")
    assert reduced.iteration_time_s == pytest.approx(on.iteration_time_s, rel=0.01)


def test_tp_comm_overlap_needs_sequence_parallel():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["run", "--model", "llama2-7b", "--gpu", "h100-sxm", "--gpus", "8",
                     "--tensor-model-parallel-size", "8", "--tp-comm-overlap"])
    assert code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and "--tp-comm-overlap: got True; needs sequence_parallel" in lines[0]


def test_input_gradient_scatter_runs_whole_beside_the_weight_gradient(make_star):
    # A layer's backward with its weight gradients (1F1B's step): Transformer Engine runs the
    # MLP-up input gradient whole, then its reduce-scatter whole beside that layer's weight
    # gradient (bulk). dgrad 6 s; the wgrad input's gather (8 B: 4 s) is issued first on the
    # side stream [0, 4], so the scatter (8 B: 4 s) follows it there [6, 10]; the wgrad
    # (5 s) runs [6, 11]; the norm's gradient (1 s) waits for both: [11, 12].
    items = [_gemm("mlp.up.dgrad", 6), Comm("mlp.reduce_scatter.grad", "B", "reduce_scatter", 8.0),
             _memory("mlp.norm.grad", 1), Comm("mlp.up.all_gather.input", "W", "all_gather", 8.0),
             _gemm("mlp.up.wgrad", 5)]
    tr = _run(items, make_star)
    assert tr.end_s == pytest.approx(12.0)
    assert _spans(tr, stream=TP_COMM_STREAM) == [(TP_COMM_STREAM, 0.0, 4.0), (TP_COMM_STREAM, 6.0, 10.0)]
    assert _spans(tr, stream="compute") == [("compute", 0.0, 6.0), ("compute", 6.0, 11.0), ("compute", 11.0, 12.0)]
    # A zero-bubble input-gradient step has no weight gradient: the scatter stays pipelined
    # in 4 chunks (dgrad chunks of 1.5 s, scatter chunks of 1 s), then the norm.
    alone = _run(items[:3], make_star)
    assert alone.end_s == pytest.approx(4 * 1.5 + 1 + 1)
    assert len(_spans(alone, stream=TP_COMM_STREAM)) == 4


def test_te_order_moves_each_weight_gradient_after_its_input_gradient():
    from sim.inputs.model import gpt
    from sim.program.tp import te_order
    from sim.program.workload import LayerRun, layer_work

    w = layer_work(gpt("g", 2, 1024, 8, 1000, 64), LayerRun(1, tp=2, sequence_parallel=True))
    names = [it.name for it in te_order(list(w.phase("B") + w.phase("W")))]
    assert names == ["mlp.residual.grad", "mlp.all_gather.grad", "mlp.down.dgrad", "mlp.gelu.grad", "mlp.up.dgrad",
                     "mlp.reduce_scatter.grad", "mlp.up.all_gather.input", "mlp.up.wgrad", "mlp.norm.grad",
                     "attn.residual.grad", "attn.all_gather.grad", "attn.proj.dgrad", "attn.core.grad",
                     "attn.qkv.dgrad", "attn.reduce_scatter.grad", "attn.qkv.all_gather.input", "attn.qkv.wgrad",
                     "attn.norm.grad", "mlp.down.wgrad", "attn.proj.wgrad"]
    # nothing to move in a forward step, or in a backward step without its weight gradients
    for items in (list(w.phase("F")), list(w.phase("B"))):
        assert te_order(items) == items


def test_chunks_on_three_streams_share_their_waves():
    # Transformer Engine runs a chunked GEMM's chunks on 3 compute streams in turn, so the
    # tail wave of one fills with the next one's tiles. With a time of whole waves (84 tiles
    # per chunk on 132 SMs), one chunk alone takes a wave; three together 2 waves, 2/3 each.
    import math
    from dataclasses import replace

    from sim.program.tp import chunk_time

    def waves(op):
        return math.ceil(84 * op.batch / 132)

    chunk = _gemm("attn.qkv", 1.0)
    assert waves(chunk) == 1
    assert chunk_time(chunk, 8, waves) == pytest.approx(2 / 3)
    assert chunk_time(chunk, 2, waves) == pytest.approx(2 / 2)      # two chunks: 168 tiles, 2 waves
    assert chunk_time(chunk, 1, waves) == 1
    assert chunk_time(replace(chunk, batch=2), 3, waves) == pytest.approx(math.ceil(504 / 132) / 3)


# ---------------------------------------------------------------- --tp-comm-overlap-cfg
def _run_cfg(items, star, cfg, tp=2, sigma=0.0, sms=8, comm_s=0.0):
    """``_run`` with Transformer Engine's overlap per GEMM (``sim.inputs.tp_overlap``): a GEMM
    on all of a 16-SM GPU takes its FLOPs in seconds, on 16 − n SMs 16/(16 − n) times that;
    ``comm_s``: the estimate of a userbuffers kernel's time (``comm_of``)."""
    from sim.inputs.tp_overlap import overlaps

    read = ItemReader(lambda op, held=0: op.flops * 16 / (16 - held), lambda it: isinstance(it, Comm),
                      lambda c: OPS[c.collective], comm_of=lambda op, nbytes: comm_s)
    segs = overlapped_layer(items, 0, tp, read, cfg=overlaps(cfg))
    prog = Program({r: [Action("0F0", category="F")] for r in range(tp)})
    out = add_tp_collectives(prog, lambda r, a: segs, lambda r: tuple(range(tp)))
    return simulate(out, star([1.0] * tp), overlap_slowdown=sigma)


def test_pipeline_with_an_sm_margin_runs_its_gemm_on_the_sms_left(make_star):
    # proj_fprop by pipeline with 4 of 16 SMs and a margin: each of the 4 GEMM chunks (3 s
    # of FLOPs) runs on 12 SMs, 4 s; the scatter chunks (2 B: 1 s) hold no SMs the engine
    # counts, so σ = 0.5 changes nothing: 4 x 4 + 1 + residual 1 = 18 s.
    items = [_gemm("attn.proj", 12), Comm("attn.reduce_scatter", "F", "reduce_scatter", 8.0),
             _memory("attn.residual", 1)]
    for sigma in (0.0, 0.5):
        tr = _run_cfg(items, make_star, "proj_fprop=pipeline:4:margin", sigma=sigma)
        assert tr.end_s == pytest.approx(4 * 4 + 1 + 1)


def test_ring_exchange_scatter_sends_partials_and_sums_them(make_star):
    # proj_fprop by ring exchange over tp 2 (1 SM, no margin: the copy engines move it):
    # GEMM chunk 0 [0, 6], its partial (8/2 = 4 B to the peer: 4 s) beside chunk 1 [6, 12],
    # then the sum of the received partials (a memory op, 0 s here), then the residual.
    items = [_gemm("attn.proj", 12), Comm("attn.reduce_scatter", "F", "reduce_scatter", 8.0),
             _memory("attn.residual", 1)]
    tr = _run_cfg(items, make_star, "proj_fprop=ring_exchange:1", sigma=0.5)
    assert tr.end_s == pytest.approx(6 + 6 + 1)
    assert _spans(tr, stream=TP_COMM_STREAM) == [(TP_COMM_STREAM, 6.0, 10.0)]


def test_ring_exchange_gather_starts_on_the_local_shard(make_star):
    # qkv_fprop over tp 2: chunk 0 computes the rank's own shard at once [1, 7] while it
    # goes to the peer (4 B: 4 s, [1, 5]); chunk 1 waits for it: [7, 13]. With aggregate the
    # rank first swaps one shard [1, 5], then computes both in one chunk: [5, 17].
    items = [_memory("attn.norm", 1), Comm("attn.all_gather", "F", "all_gather", 8.0), _gemm("attn.qkv", 12)]
    assert _run_cfg(items, make_star, "qkv_fprop=ring_exchange:1").end_s == pytest.approx(13.0)
    assert _run_cfg(items, make_star, "qkv_fprop=ring_exchange:1:aggregate").end_s == pytest.approx(17.0)


def test_bulk_without_margin_slows_the_gemm_while_its_kernel_runs(make_star):
    # qkv_wgrad bulk with 8 of 16 SMs, no margin: the weight gradient (10 s on 16 SMs, 20 on
    # 8) runs at half speed while the scatter kernel runs (comm estimate 4 s: 2 s of work),
    # then at full speed: 4 + 8 = 12 s (gemm_beside), after the dgrad's 6 s: 18 s.
    items = [_gemm("attn.qkv.dgrad", 6), Comm("attn.reduce_scatter.grad", "B", "reduce_scatter", 8.0),
             _gemm("attn.qkv.wgrad", 10)]
    tr = _run_cfg(items, make_star, "qkv_wgrad=bulk:8", comm_s=4.0)
    assert tr.end_s == pytest.approx(6 + 4 + (10 - 4 * 10 / 20))


def test_a_margin_profile_scales_peak_and_waves_by_the_sms_left():
    # A large compute-bound GEMM on 148 − 24 SMs: time x 148/124 (its waves stay full to
    # within a percent on either count).
    from sim.inputs.hardware import load_profile
    from sim.inputs.tp_overlap import margin_profile
    from sim.program.costs import op_time

    b200 = load_profile("b200")
    op = Op("g", "F", "gemm", 2.0 * 16384 * 16384 * 16384, 0.0, 0.0, 0.0, (16384, 16384, 16384))
    ratio = op_time(op, margin_profile(b200, 24)) / op_time(op, b200)
    assert ratio == pytest.approx(148 / 124, rel=0.01)
    assert margin_profile(b200, 0) is b200


@pytest.mark.parametrize("args, message", [
    (["--tp-comm-overlap-cfg", "te-2"], "--tp-comm-overlap-cfg: got 'te-2'; needs tp_comm_overlap"),
    (["--tp-comm-overlap", "--tp-comm-overlap-cfg", "te-3"], "--tp-comm-overlap-cfg: got 'te-3'; allowed names: te-1"),
    (["--tp-comm-overlap", "--tp-comm-overlap-cfg", "qkv_fprop=pipeline:8"],
     "got 'qkv_fprop=pipeline:8'; qkv_fprop takes ring_exchange here"),
    (["--tp-comm-overlap", "--tp-comm-overlap-cfg", "te-1,fc2_fprop=pipeline:x"], "options after the method"),
])
def test_bad_overlap_configurations_get_one_line(args, message):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["run", "--model", "llama2-7b", "--gpu", "h100-sxm", "--gpus", "8", "--sequence-parallel",
                     "--tensor-model-parallel-size", "8", *args])
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], lines


def test_named_configurations_parse_to_their_sources_figures():
    from sim.inputs.tp_overlap import CONFIGS, GEMMS, Overlap, overlaps

    b200 = overlaps("userbuffers_fp8_b200_h16384_tp4_cp2_mbs1_seqlen8192")  # NeMo's userbuffers.py
    assert b200["proj_fprop"] == Overlap("ring_exchange", 1, True) and b200["proj_fprop"].sms_held == 1
    assert b200["qkv_wgrad"] == Overlap("bulk", 32) and b200["qkv_fprop"].aggregate
    te1, te2 = overlaps("te-1"), overlaps("te-2")
    assert te1["fc2_fprop"] == Overlap("pipeline", 16, False) and te2["fc2_fprop"] == Overlap("pipeline", 16, True)
    assert overlaps("te-1,fc2_fprop=pipeline:8:margin:splits=2")["fc2_fprop"] == Overlap("pipeline", 8, True, False, 2)
    assert all(set(overlaps(n)) == set(GEMMS) for n in CONFIGS)
