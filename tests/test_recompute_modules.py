"""Selective recomputation by module (``--recompute-modules``, Megatron-Core's names): each
module's forward runs again at the start of backward, costing what its forward costs, and its
stored activations drop to what the recompute needs, by hand on tiny models; the default
(selective = the attention core) is unchanged; bad modules are refused in one line."""

from __future__ import annotations

from dataclasses import replace

import pytest

import sim
from sim.errors import InputError
from sim.inputs.hardware import load_profile
from sim.inputs.model import llama
from sim.inputs.plan import ParallelPlan
from sim.inputs.recompute import parse_recompute_modules
from sim.program.costs import op_time
from sim.program.estimate import estimate, model_flops_per_sequence
from sim.program.memory import Storing, activation_bytes_per_layer, recompute_working_bytes
from sim.program.workload import Comm, LayerRun, layer_work
from sim.program.workload_moe import MoeShape

H100 = load_profile("h100-sxm")
# s 16, h 64, 8 heads over 2 K/V groups, SwiGLU of 160, no dropout
DENSE = llama("t", 2, 64, 8, 2, 160, 100, 16)
# 4 routed experts of 96 (top-2) and shared experts of 64 in every layer
MOE = llama("m", 2, 64, 8, 8, 160, 100, 16, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=96,
            moe_shared_expert_intermediate_size=64)
# MLA: queries through a rank-32 projection, keys and values through rank 16, heads of 16 + 8 (RoPE), values 16
MLA = llama("mla", 2, 64, 4, 4, 160, 100, 16, q_lora_rank=32, kv_lora_rank=16, qk_head_dim=16,
            qk_pos_emb_head_dim=8, v_head_dim=16)


def _recomputed(work):
    return [i for i in work.items if i.recompute]


# ------------------------------------------------------------------------------------ costs
def test_mlp_recompute_runs_the_mlp_forward_again():
    b, t = 2, 2
    base = layer_work(DENSE, LayerRun(b, t, True, "selective"))
    mlp = layer_work(DENSE, LayerRun(b, t, True, "selective", modules=("core_attn", "mlp")))
    extra = [i for i in _recomputed(mlp) if i not in _recomputed(base)]
    # the MLP block between its norm and its residual: gather, up (gate and up), SwiGLU, down, reduce-scatter
    assert [i.name for i in extra] == ["mlp.all_gather", "mlp.up", "mlp.swiglu", "mlp.down", "mlp.reduce_scatter"]
    assert all(i.phase == "B" for i in extra)
    n, f, h = b * 16, 160 // t, 64
    gemm_flops = 2 * n * (2 * f) * h + 2 * n * h * f                      # up (gate+up) and down, by hand
    assert sum(i.flops for i in extra if not isinstance(i, Comm) and i.kind == "gemm") == gemm_flops
    assert sum(i.flops for i in extra if not isinstance(i, Comm)) == gemm_flops + 6 * n * f   # + SwiGLU
    assert [c.nbytes for c in extra if isinstance(c, Comm)] == [2 * n * h] * 2
    # the forward's own kernels, so the same time
    fwd = [i for i in mlp.phase("F") if i.name in {e.name for e in extra}]
    assert extra == [replace(i, phase="B", recompute=True) for i in fwd]


def test_mlp_recompute_adds_the_mlp_forward_time_to_the_iteration():
    """One GPU, 2 layers x 2 micro-batches: the iteration grows by 4 MLP forwards (simulated and estimated)."""
    kw = dict(model=DENSE, gpu="h100-sxm", gpus=1, global_batch_size=2, recompute_granularity="selective")
    base = sim.run(**kw)
    mlp = sim.run(**kw, recompute_modules=["core_attn", "mlp"])
    profile = base.run.profile
    ops = [i for i in layer_work(DENSE, LayerRun(1)).phase("F") if i.name in ("mlp.up", "mlp.swiglu", "mlp.down")]
    one = sum(op_time(o, profile) for o in ops)
    assert one > 0
    assert mlp.iteration_time_s - base.iteration_time_s == pytest.approx(2 * 2 * one, rel=1e-9)
    plan = ParallelPlan(global_batch_size=2, recompute="selective")
    grown = estimate(DENSE, ParallelPlan(global_batch_size=2, recompute="selective",
                                         recompute_modules=("core_attn", "mlp")), profile).time["step"]
    assert grown - estimate(DENSE, plan, profile).time["step"] == pytest.approx(2 * 2 * one, rel=1e-9)
    # hardware FLOPs count the recomputed GEMMs: 2 layers x (up + down) per sequence
    f = 160
    assert model_flops_per_sequence(DENSE, "selective", ("core_attn", "mlp")) - \
        model_flops_per_sequence(DENSE, "selective") == pytest.approx(2 * (2 * 16 * 2 * f * 64 + 2 * 16 * 64 * f))


def test_each_module_recomputes_its_own_kernels():
    shape = MoeShape(ep=2, etp=1, load=2 * 16 * 2)                     # b 2, s 16, top-2, balanced
    names = lambda work: [i.name for i in _recomputed(work)]  # noqa: E731
    assert names(layer_work(DENSE, LayerRun(1, recompute="selective", modules=("layernorm",)))) == ["attn.norm", "mlp.norm"]
    assert names(layer_work(MOE, LayerRun(2, recompute="selective", modules=("moe_act",)), moe=shape)) == \
        ["moe.experts.swiglu"]
    shared = names(layer_work(MOE, LayerRun(2, recompute="selective", modules=("shared_experts",)), moe=shape))
    assert shared == ["moe.shared.up", "moe.shared.swiglu", "moe.shared.down"]
    # moe reruns the whole block, its dispatch and combine all-to-alls over the ep group included, and the
    # dropless alltoall dispatcher's token-count all-gather before the dispatch (Megatron-Core's preprocess
    # runs again when the block is recomputed)
    moe = layer_work(MOE, LayerRun(2, recompute="selective", modules=("moe",)), moe=shape)
    fwd_block = [i for i in moe.phase("F") if i.name.startswith("moe.")]
    assert names(moe) == [i.name for i in fwd_block]
    assert [c.name for c in _recomputed(moe) if isinstance(c, Comm) and c.group == "ep"] == \
        ["moe.dispatch.counts", "moe.dispatch", "moe.combine"]
    # mla_up_proj: the per-head up-projections (not the replicated down-projections)
    up = _recomputed(layer_work(MLA, LayerRun(1, recompute="selective", modules=("mla_up_proj",))))
    assert [i.name for i in up] == ["attn.q_up", "attn.kv_up"]
    assert [i.flops for i in up] == [2 * 16 * (4 * (16 + 8)) * 32, 2 * 16 * (4 * (16 + 16)) * 16]
    # mlp leaves MoE layers alone; core_attn alone is the default selective
    assert names(layer_work(MOE, LayerRun(2, recompute="selective", modules=("mlp",)), moe=shape)) == []
    assert layer_work(DENSE, LayerRun(1, recompute="selective", modules=("core_attn",))) == \
        layer_work(DENSE, LayerRun(1, recompute="selective"))


# ----------------------------------------------------------------------------------- memory
def _freed(model, b, t, sp, modules, experts=None, base=("core_attn",)):
    def stored(mods):
        return activation_bytes_per_layer(model, Storing.of(b, t, sp, "selective", True, None, experts, mods))
    return stored(base) - stored(base + modules)


def test_dense_modules_free_their_closed_forms():
    b, t = 2, 2                                                       # sequence parallel: norms on s/t
    sbh, sbf = 16 * b * 64, 16 * b * 160
    assert _freed(DENSE, b, t, True, ("layernorm",)) == 2 * sbh / t + 2 * sbh / t   # QKV's and MLP-up's inputs
    assert _freed(DENSE, b, t, True, ("mlp",)) == 3 * 2 * sbf / t     # gate, up, down input (keeps its input)
    assert _freed(DENSE, b, t, True, ("layernorm", "mlp")) == 2 * sbh / t * 2 + 3 * 2 * sbf / t
    # core_attn: flash stores only its fp32 log-sum-exp per query row and head beyond Q, K, V
    assert _freed(DENSE, b, t, True, ("core_attn",), base=()) == 4 * 8 * 16 * b / t


def test_mla_up_proj_frees_q_k_v():
    sbh = 16 * 1 * 64
    assert _freed(MLA, 1, 1, False, ("mla_up_proj",)) == 2 * sbh + 2 * 2 * sbh       # Q, and K and V (MHA)


def test_expert_modules_free_their_closed_forms():
    b, T, k, E, h, f, fs = 2, 2 * 16, 2, 4, 64, 96, 64
    R = T * k                                                         # token copies entering the experts (etp 1)
    ex = (2, 1)
    assert _freed(MOE, b, 1, False, ("moe_act",), ex) == 2 * R * f   # the activation's output, the down input
    assert _freed(MOE, b, 1, False, ("shared_experts",), ex) == 4 * T * fs + 2 * T * fs   # SwiGLU in, down input
    block = (4 * T * E                   # router probabilities (fp32)
             + 2 * R * h + 2 * R * f + 2 * 2 * R * f + 2 * R * h     # expert input, down input, gate+up, outputs
             + 2 * T * h + 4 * T * fs + 2 * T * fs)                   # shared experts: input, SwiGLU in, down input
    assert _freed(MOE, b, 1, False, ("moe",), ex) == block - 2 * T * h   # keeps the block's input
    assert _freed(MOE, b, 1, False, ("layernorm",), ex) == 2 * T * h + 2 * T * h   # QKV's and the block's input
    # what moe regenerates is held while the layer's backward runs
    plan = ParallelPlan(dp=2, ep=2, etp=1, micro_batch_size=2, global_batch_size=4, recompute="selective",
                        recompute_modules=("core_attn", "moe"))
    assert recompute_working_bytes(MOE, plan) == block - 2 * T * h


def test_default_selective_is_unchanged():
    kw = dict(model=MOE, gpu="h100-sxm", gpus=2, expert_model_parallel_size=2, global_batch_size=4,
              recompute_granularity="selective")
    default, core = sim.run(**kw), sim.run(**kw, recompute_modules="core_attn")
    assert default.iteration_time_s == core.iteration_time_s
    assert default.peak_memory_bytes == core.peak_memory_bytes
    assert "recompute_modules" not in default.summary["plan"]
    assert recompute_working_bytes(MOE, default.plan) == 0.0
    # moe_act: the same time plus the activation kernel again, less memory
    act = sim.run(**kw, recompute_modules="moe_act,core_attn")
    assert act.iteration_time_s > default.iteration_time_s and act.peak_memory_bytes < default.peak_memory_bytes
    assert list(act.summary["plan"]["recompute_modules"]) == ["core_attn", "moe_act"]


# ------------------------------------------------------------------------------ bad inputs
def test_the_flag_parses_as_megatron_takes_it():
    assert parse_recompute_modules(["moe_act", "layernorm"]) == ("layernorm", "moe_act")
    assert parse_recompute_modules("moe_act,layernorm moe_act") == ("layernorm", "moe_act")


@pytest.mark.parametrize("plan,model,mentions", [
    (dict(recompute="selective", recompute_modules=("attn",)), DENSE, ["recompute_modules", "'attn'", "allowed"]),
    (dict(recompute="selective", recompute_modules=()), DENSE, ["recompute_modules", "at least one"]),
    (dict(recompute="full", recompute_modules=("mlp",)), DENSE, ["recompute_modules", "selective", "full"]),
    (dict(recompute="none", recompute_modules=("mlp",)), DENSE, ["recompute_modules", "selective", "none"]),
    (dict(recompute="selective", recompute_modules=("moe_act",)), DENSE, ["recompute_modules", "moe_act", "no experts"]),
    (dict(recompute="selective", recompute_modules=("moe",)), DENSE, ["recompute_modules", "'moe'", "no experts"]),
    (dict(recompute="selective", recompute_modules=("mla_up_proj",)), DENSE, ["mla_up_proj", "MLA"]),
    (dict(recompute="selective", recompute_modules=("shared_experts",), dp=2, ep=2),
     llama("x", 2, 64, 8, 8, 160, 100, 16, num_experts=4), ["shared_experts", "no shared experts"]),
    (dict(recompute="selective", recompute_modules=("mlp",), dp=2, ep=2),
     llama("x", 2, 64, 8, 8, 160, 100, 16, num_experts=4), ["'mlp'", "every layer", "MoE"]),
    (dict(recompute="selective", recompute_modules=("layernorm",), fp8_format="hybrid"), DENSE,
     ["recompute_modules", "layernorm", "delayed"]),
])
def test_bad_modules_are_refused_in_one_line(plan, model, mentions):
    with pytest.raises(InputError) as exc:
        ParallelPlan(**plan).check_model(model)
    msg = str(exc.value)
    assert "\n" not in msg and all(m in msg for m in mentions), msg


@pytest.mark.parametrize("recipe", ["tensorwise", "mxfp8", "blockwise"])
def test_fp8_recipes_other_than_delayed_recompute_moe_act_and_layernorm(recipe):
    # Megatron-Core core_v0.14.0 transformer_config.py refuses moe_act / layernorm recompute under FP8 only
    # when fp8_recipe == 'delayed'
    plan = ParallelPlan(dp=2, ep=2, recompute="selective", recompute_modules=("layernorm", "moe_act"),
                        fp8_format="e4m3", fp8_recipe=recipe)
    plan.check_model(llama("x", 2, 64, 8, 8, 160, 100, 16, num_experts=4))
    assert plan.recompute_modules == ("layernorm", "moe_act")


def test_the_search_bound_counts_the_recompute_and_stays_below_the_simulated_time():
    """The all-to-all-heavy MoE of tests/test_search_moe_cp.py over two nodes: recomputing the
    MoE block reruns its all-to-alls, which the bound counts, and it stays a lower bound."""
    from sim.inputs.schema import SimulationSettings
    from sim.inputs.topology_build import load_topology
    from sim.session import Job, simulate_training
    from sim.studies.search import candidates

    topo = load_topology("dgx-h100", nodes=2)
    model = llama("a2a-heavy", 3, 2048, 16, 16, 256, 1000, 2048, num_experts=16, moe_router_topk=8,
                  moe_ffn_hidden_size=64)
    base = dict(dp=16, ep=16, etp=1, global_batch_size=32, zero_stage=1, recompute="selective")
    plans = [ParallelPlan(**base), ParallelPlan(**base, recompute_modules=("core_attn", "moe")),
             ParallelPlan(**base, recompute_modules=("layernorm", "moe_act"))]
    cands = candidates(model, plans, H100)
    assert cands[1].bound_s > cands[0].bound_s                       # the block and its all-to-alls again
    for c in cands:
        simulated = simulate_training(Job(model, c.plan, H100, topo), SimulationSettings(fidelity="full")).trace.end_s
        assert c.bound_s <= simulated, (c.key, c.bound_s, simulated)
