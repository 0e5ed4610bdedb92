"""Full recomputation of some layers (Megatron-Core's ``--recompute-granularity full
--recompute-method block|uniform --recompute-num-layers N``, ``sim.inputs.recompute``): the
recomputed forward FLOPs and the stored activation bytes by hand on a tiny model, per model
chunk as Megatron-Core counts them; the iteration grows by the recomputed layers' forwards;
what Megatron-Core refuses is refused in one line."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

import sim
from sim.errors import InputError
from sim.inputs.model import llama
from sim.inputs.plan import ParallelPlan
from sim.program.costs import op_time
from sim.program.estimate import model_flops_per_sequence, plan_flops_per_sequence
from sim.program.memory import Storing, activation_bytes_per_layer, chunk_activation_bytes, recompute_working_bytes
from sim.program.workload import LayerRun, chunk_work, layer_work

# s 16, h 64, 8 heads (head dim 8) over 2 K/V groups, SwiGLU of 160, vocab 100, no dropout
S, H, F, KV = 16, 64, 160, 2 * 8


def model(layers: int, **kw):
    return llama("t", layers, H, 8, 2, F, 100, S, **kw)


def layer_forward_flops(b: int = 1) -> float:
    """One layer's forward GEMM and attention FLOPs by hand: QKV (h -> h + 2 K/V heads' width),
    QKᵀ and AV (2·s²·h each), the output projection, SwiGLU's gate+up and down."""
    n = b * S
    return 2 * n * H * (H + 2 * KV) + 4 * b * S * S * H + 2 * n * H * H + 2 * n * H * 2 * F + 2 * n * F * H


def _recomputing_layers(m, plan, vs):
    """Positions (in the chunk) of the layer works that carry recomputed items."""
    works = [w for w in chunk_work(m, plan, vs) if w.name not in ("embedding", "head")]
    return [pos for pos, w in enumerate(works) if any(i.recompute for i in w.items)]


# ------------------------------------------------------------------------------------ which layers
def test_block_recomputes_the_first_n_layers_of_each_chunk():
    m = model(8)
    plan = ParallelPlan(pp=2, vpp=2, global_batch_size=4, recompute="full", recompute_method="block",
                        recompute_num_layers=1)
    for vs in range(4):  # 4 chunks of 2 layers: the first of each recomputes
        assert _recomputing_layers(m, plan, vs) == [0]
    plan3 = ParallelPlan(pp=2, global_batch_size=4, recompute="full", recompute_method="block",
                         recompute_num_layers=3)
    assert _recomputing_layers(m, plan3, 0) == [0, 1, 2] and _recomputing_layers(m, plan3, 1) == [0, 1, 2]


def test_uniform_recomputes_every_layer():
    m = model(4)
    plan = ParallelPlan(global_batch_size=1, recompute="full", recompute_method="uniform", recompute_num_layers=2)
    assert _recomputing_layers(m, plan, 0) == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------ FLOPs
@pytest.mark.parametrize("pp,vpp,n,recomputed", [(1, 1, 3, 3), (2, 1, 1, 2), (2, 2, 1, 4), (2, 2, 2, 8)])
def test_block_hardware_flops_add_one_forward_per_recomputed_layer(pp, vpp, n, recomputed):
    m = model(8)
    plan = ParallelPlan(pp=pp, vpp=vpp, global_batch_size=2 * pp, recompute="full", recompute_method="block",
                        recompute_num_layers=n)
    extra = plan_flops_per_sequence(m, plan) - model_flops_per_sequence(m)
    assert extra == pytest.approx(recomputed * layer_forward_flops())


def test_uniform_hardware_flops_recompute_every_layer():
    m = model(4)
    plan = ParallelPlan(global_batch_size=1, recompute="full", recompute_method="uniform", recompute_num_layers=2)
    assert plan_flops_per_sequence(m, plan) - model_flops_per_sequence(m) == pytest.approx(4 * layer_forward_flops())


def test_block_recomputed_gemm_flops_in_the_workload():
    m = model(4)
    plan = ParallelPlan(global_batch_size=1, recompute="full", recompute_method="block", recompute_num_layers=1)
    works = chunk_work(m, plan, 0)
    recomputed = sum(o.flops for w in works for o in w.ops("B") if o.recompute and o.kind in ("gemm", "attention"))
    assert recomputed == pytest.approx(layer_forward_flops())


def test_block_adds_the_recomputed_forwards_to_the_iteration():
    """One GPU, 4 layers, 2 micro-batches: block with 1 layer adds 2 forwards of a layer; with 4 it is full."""
    m = model(4)
    kw = dict(model=m, gpu="h100-sxm", gpus=1, global_batch_size=2)
    none = sim.run(**kw)
    one = sim.run(**kw, recompute_granularity="full", recompute_method="block", recompute_num_layers=1)
    full = sim.run(**kw, recompute_granularity="full")
    every = sim.run(**kw, recompute_granularity="full", recompute_method="block", recompute_num_layers=4)
    profile = none.run.profile
    fwd = sum(op_time(o, profile) for o in layer_work(m, LayerRun(1)).ops("F"))
    assert fwd > 0
    assert one.iteration_time_s - none.iteration_time_s == pytest.approx(2 * fwd, rel=1e-6)
    assert every.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-12)


# ------------------------------------------------------------------------------------ memory
def _bytes(m, plan, vs=0):
    return chunk_activation_bytes(m, plan, vs) - (chunk_activation_bytes(m, ParallelPlan(
        pp=plan.pp, vpp=plan.vpp, global_batch_size=plan.global_batch_size, recompute="full"), vs)
        - len(plan.layer_range(m, vs)) * 2 * S * H)   # the embedding's and head's bytes, the same in both


def test_block_stores_inputs_of_the_recomputed_layers_and_everything_of_the_rest():
    m = model(6)
    plan = ParallelPlan(global_batch_size=1, recompute="full", recompute_method="block", recompute_num_layers=2)
    everything = activation_bytes_per_layer(m, Storing.of(1))  # a layer without recompute
    assert everything > 2 * S * H
    assert _bytes(m, plan) == pytest.approx(2 * (2 * S * H) + 4 * everything)   # the 2sbh input (bf16) of 2
    assert recompute_working_bytes(m, plan) == pytest.approx(everything)        # one layer re-run at a time


@pytest.mark.parametrize("layers,n", [(6, 2), (6, 4), (5, 5), (4, 1)])
def test_uniform_stores_one_input_per_group(layers, n):
    m = model(layers)
    plan = ParallelPlan(global_batch_size=1, recompute="full", recompute_method="uniform", recompute_num_layers=n)
    assert _bytes(m, plan) == pytest.approx(math.ceil(layers / n) * 2 * S * H)
    assert recompute_working_bytes(m, plan) == pytest.approx(n * activation_bytes_per_layer(m, Storing.of(1)))


def test_full_without_a_method_is_unchanged():
    m = model(4)
    plan = ParallelPlan(global_batch_size=1, recompute="full")
    same = ParallelPlan(global_batch_size=1, recompute="full", recompute_method="uniform", recompute_num_layers=1)
    assert chunk_activation_bytes(m, plan, 0) == chunk_activation_bytes(m, same, 0)
    assert plan_flops_per_sequence(m, plan) == plan_flops_per_sequence(m, same) == \
        model_flops_per_sequence(m, "full")
    assert recompute_working_bytes(m, plan) == recompute_working_bytes(m, same)


# ------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("kw,mentions", [
    (dict(recompute="selective", recompute_method="block", recompute_num_layers=1), "recompute_granularity full"),
    (dict(recompute="none", recompute_num_layers=2), "recompute_method"),
    (dict(recompute="full", recompute_num_layers=2), "recompute_method"),
    (dict(recompute="full", recompute_method="uniform"), "recompute_num_layers"),
])
def test_megatron_refusals(kw, mentions):
    with pytest.raises(InputError, match=mentions):
        ParallelPlan(global_batch_size=1, **kw)


def test_more_layers_than_a_pipeline_rank_holds_is_refused():
    plan = ParallelPlan(pp=2, global_batch_size=2, recompute="full", recompute_method="block", recompute_num_layers=3)
    with pytest.raises(InputError, match="num_layers_per_pipeline_rank: 2"):
        plan.check_model(model(4))


def test_uniform_over_several_layers_with_mtp_is_refused():
    plan = ParallelPlan(global_batch_size=1, recompute="full", recompute_method="uniform", recompute_num_layers=2)
    with pytest.raises(InputError, match="must be 1"):
        plan.check_model(model(4, mtp_num_layers=1))
    ParallelPlan(global_batch_size=1, recompute="full", recompute_method="uniform",
                 recompute_num_layers=1).check_model(model(4, mtp_num_layers=1))


def test_the_cli_refuses_in_one_line_with_exit_2():
    r = subprocess.run([sys.executable, "-m", "sim", "run", "--model", "llama2-7b", "--gpu", "h100-sxm",
                        "--gpus", "8", "--recompute-granularity", "selective", "--recompute-method", "block",
                        "--recompute-num-layers", "2"], capture_output=True, text=True)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--recompute-method" in lines[0] and "block" in lines[0] and "full" in lines[0]


def test_uniform_groups_stop_at_the_chunk():
    """pp 2 x vpp 2 over 8 layers: chunks of 2, so a uniform group of 2 (the most a pipeline rank's 4 allow
    past a chunk) re-runs 2 layers at once, and each chunk keeps one input."""
    m = model(8)
    plan = ParallelPlan(pp=2, vpp=2, global_batch_size=4, recompute="full", recompute_method="uniform",
                        recompute_num_layers=4)
    assert recompute_working_bytes(m, plan) == pytest.approx(2 * activation_bytes_per_layer(m, Storing.of(1)))
    assert _bytes(m, plan, 1) == pytest.approx(2 * S * H)


def test_block_leaves_the_mtp_layers_unrecomputed_and_uniform_one_recomputes_them():
    """Megatron-Core's MTP layer: block skips its recompute; uniform (N = 1) checkpoints it."""
    from sim.program.workload import mtp_works
    m = model(4, mtp_num_layers=1)
    block = ParallelPlan(global_batch_size=1, recompute="full", recompute_method="block", recompute_num_layers=2)
    uniform = ParallelPlan(global_batch_size=1, recompute="full", recompute_method="uniform", recompute_num_layers=1)
    assert not any(i.recompute for i in mtp_works(m, block, 0)[1].items)
    assert any(i.recompute for i in mtp_works(m, uniform, 0)[1].items)
