"""FP8 weights gathered in FP8 (Megatron-LM ``--fp8-param-gather``, NeMo's ``fp8_params``)."""

import contextlib
import io

import pytest

from sim.cli import main
from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.inputs.precision import fp8_precision
from sim.program.fp8 import fp8_layer_work
from sim.program.memory import fp8_weight_copy_bytes, stage_memory_bytes
from sim.program.workload import LayerRun, layer_work
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
H, L = 1024, 8
SMALL = gpt("small", L, H, 16, 1024, 512)
GEMM_WEIGHTS = 12 * H * H  # QKV 3h^2, projection h^2, MLP 8h^2 per layer (tp 1)


def _gathers(run):
    return [s for s in run.trace.spans_of(0) if s.name.startswith("param allgather")]


@pytest.mark.parametrize("overlap", [False, True])
def test_the_gemm_weights_are_gathered_in_one_byte(overlap):
    topo = load_topology("dgx-h100")
    runs = {}
    for fp8_params in (False, True):
        plan = ParallelPlan(dp=8, micro_batch_size=2, global_batch_size=32, zero_stage=1, fp8_format="hybrid",
                            fp8_param_gather=fp8_params, param_gather_overlap=overlap)
        runs[fp8_params] = simulate_training(Job(SMALL, plan, H100, topo))
    bf16_weights = sum(s.nbytes for s in _gathers(runs[False]))
    assert bf16_weights == pytest.approx(2 * SMALL.num_params, rel=1e-12)  # 2 bytes each (tp = pp = 1)
    # 1 byte for each GEMM weight, 2 for the rest (norms, biases, embedding)
    assert sum(s.nbytes for s in _gathers(runs[True])) == pytest.approx(bf16_weights - L * GEMM_WEIGHTS, rel=1e-12)
    assert runs[True].trace.end_s <= runs[False].trace.end_s


def test_each_step_transposes_the_fp8_weights_instead_of_casting_them():
    m = 4
    work = layer_work(SMALL, LayerRun(1, 1, False))
    cast = {it.name: it for it in fp8_layer_work(work, fp8_precision("hybrid"), microbatches=m).items if hasattr(it, "kind")}
    kept = {it.name: it for it in fp8_layer_work(work, fp8_precision("hybrid"), microbatches=m, fp8_params=True).items
            if hasattr(it, "kind")}
    for gemm, w in (("attn.qkv", 3 * H * H), ("attn.proj", H * H), ("mlp.up", 4 * H * H), ("mlp.down", 4 * H * H)):
        a, b = cast[f"{gemm}.weight_to_fp8_t"], kept[f"{gemm}.weight_transpose"]
        assert (a.bytes_read, a.bytes_written) == pytest.approx((2 * w / m, 2 * w / m))  # bf16 in, fp8 + its transpose
        assert (b.bytes_read, b.bytes_written) == pytest.approx((w / m, w / m))  # fp8 in, its transpose out
        assert f"{gemm}.weight_to_fp8_t" not in kept
    assert set(cast) - {n for n in cast if "weight_to_fp8_t" in n} == set(kept) - {n for n in kept if "weight_transpose" in n}


def test_a_rank_holds_the_fp8_weight_and_its_transpose_in_place_of_the_bf16_weight():
    plan = ParallelPlan(dp=2, pp=2, global_batch_size=8, zero_stage=1, fp8_format="hybrid")
    kept = ParallelPlan(dp=2, pp=2, global_batch_size=8, zero_stage=1, fp8_format="hybrid", fp8_param_gather=True)
    bf16 = ParallelPlan(dp=2, pp=2, global_batch_size=8, zero_stage=1)
    assert fp8_weight_copy_bytes(SMALL, plan, 0) == 2 * (L // 2) * GEMM_WEIGHTS
    assert fp8_weight_copy_bytes(SMALL, kept, 0) == 0
    assert stage_memory_bytes(SMALL, kept, 0)["weights"] == stage_memory_bytes(SMALL, bf16, 0)["weights"]


def test_it_needs_fp8_and_a_sharded_optimizer():
    for kw in (dict(zero_stage=1), dict(fp8_format="hybrid"), dict(fp8_format="hybrid", zero_stage=0),
               dict(fp8_format="e4m3", fp8_recipe="blockwise", zero_stage=1),
               dict(fp8_format="e4m3", fp8_recipe="mxfp8", zero_stage=3),
               dict(fp8_format="hybrid", fp8_recipe="tensorwise", zero_stage=1, offload_optimizer=True)):
        with pytest.raises(InputError, match="fp8_param_gather"):
            ParallelPlan(dp=8, fp8_param_gather=True, **kw)
    for kw in (dict(fp8_format="hybrid", zero_stage=3),
               dict(fp8_format="hybrid", fp8_recipe="tensorwise", zero_stage=3),
               dict(fp8_format="e4m3", fp8_recipe="mxfp8", zero_stage=1),
               dict(fp8_format="hybrid", zero_stage=1, offload_optimizer=True)):
        assert ParallelPlan(dp=8, fp8_param_gather=True, **kw).fp8_param_gather
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["run", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--fp8-param-gather",
                     "--zero", "1"])
    assert code == 2 and err.getvalue().count("\n") == 1
    assert "--fp8-param-gather: got True; needs fp8_format and zero 1, 2 or 3 (got BF16, zero 1)" in err.getvalue()


# a GPT layer's parameters (tp 1): QKV 3h^2 + 3h, projection h^2 + h, MLP 4h^2 + 4h and 4h^2 + h, two LayerNorms 4h
LAYER_PARAMS = 12 * H * H + 13 * H


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_zero3_gathers_each_layers_gemm_weights_in_one_byte(recipe):
    topo = load_topology("dgx-h100")
    runs = {}
    for fp8_params in (False, True):
        plan = ParallelPlan(dp=8, micro_batch_size=2, global_batch_size=32, zero_stage=3, fp8_format="hybrid",
                            fp8_recipe=recipe, fp8_param_gather=fp8_params)
        runs[fp8_params] = simulate_training(Job(SMALL, plan, H100, topo))
    sizes = {}
    for fp8_params, run in runs.items():
        for s in run.trace.spans_of(0):
            if s.name.startswith("gather layer "):
                sizes.setdefault((fp8_params, int(s.name.split()[2])), []).append(s.nbytes)
    for lid in range(L):  # every gather of a layer, forward and backward: 2 bytes a parameter, 1 for the GEMM weights
        assert len(sizes[(True, lid)]) == len(sizes[(False, lid)]) >= 2
        assert sizes[(False, lid)] == pytest.approx([2 * LAYER_PARAMS] * len(sizes[(False, lid)]), rel=1e-12)
        assert sizes[(True, lid)] == pytest.approx([2 * LAYER_PARAMS - GEMM_WEIGHTS] * len(sizes[(True, lid)]),
                                                   rel=1e-12)
    for lid in (-1, L):  # the embedding and the head stay BF16
        assert sizes[(True, lid)] == sizes[(False, lid)]
    assert runs[True].trace.end_s <= runs[False].trace.end_s


def test_mxfp8_weights_are_gathered_in_bf16_and_quantized_after():
    """Megatron-Core's reuse_grad_buf_for_mxfp8_param_ag: the BF16 gather through the gradient
    buffer, both MXFP8 copies quantized from it once a step, no persistent BF16 weight."""
    b200 = load_profile("b200")
    topo = load_topology("dgx-b200")
    runs = {}
    for fp8_params in (False, True):
        plan = ParallelPlan(dp=8, micro_batch_size=2, global_batch_size=32, zero_stage=1, fp8_format="e4m3",
                            fp8_recipe="mxfp8", fp8_param_gather=fp8_params)
        runs[fp8_params] = simulate_training(Job(SMALL, plan, b200, topo))
    assert sum(s.nbytes for s in _gathers(runs[True])) == pytest.approx(2 * SMALL.num_params, rel=1e-12)
    assert sum(s.nbytes for s in _gathers(runs[False])) == pytest.approx(2 * SMALL.num_params, rel=1e-12)
    work = layer_work(SMALL, LayerRun(1, 1, False))
    cast = [(it.name, it.bytes_read, it.bytes_written) for it in fp8_layer_work(work, fp8_precision("e4m3", "mxfp8"),
                                                                                microbatches=4).items]
    kept = [(it.name, it.bytes_read, it.bytes_written) for it in fp8_layer_work(work, fp8_precision("e4m3", "mxfp8"),
                                                                                microbatches=4, fp8_params=True).items]
    assert kept == cast and any(n.endswith("weight_quantize") for n, *_ in kept)
    mx = dict(dp=2, pp=2, global_batch_size=8, zero_stage=1, fp8_format="e4m3", fp8_recipe="mxfp8")
    # both copies, 1 byte plus one E8M0 byte per 32 (OCP MX v1.0), in place of the BF16 weight's 2
    assert fp8_weight_copy_bytes(SMALL, ParallelPlan(fp8_param_gather=True, **mx), 0) == pytest.approx(
        (2 * (1 + 1 / 32) - 2) * (L // 2) * GEMM_WEIGHTS, rel=1e-12)
    assert fp8_weight_copy_bytes(SMALL, ParallelPlan(**mx), 0) == pytest.approx(
        2 * (1 + 1 / 32) * (L // 2) * GEMM_WEIGHTS, rel=1e-12)
