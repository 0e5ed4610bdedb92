"""NeMo AutoModel's eager rope in its own MoE models (``sim.program.eager_rope``): the kernels
its ``MLA.forward`` and ``apply_rotary_emb`` run, counted by hand on a tiny MLA layer (4 heads,
no-rope width 8, rope width 4, 16 tokens), and those of the rotate-half ``_apply_rotary_emb`` of
its Qwen3-MoE on a tiny GQA layer (4 query heads, 2 key heads of width 8, 16 tokens); where they
go in the layer's work, and that only AutoModel's models with routed experts get them."""

from dataclasses import replace

import pytest

from sim.inputs.model import llama
from sim.inputs.plan import ParallelPlan
from sim.program.ops import Op
from sim.program.workload import plan_layer_work

MOE = dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=64)
TINY_MLA = replace(llama("tiny-mla", 2, 64, 4, 4, 128, 1000, 16, **MOE), q_lora_rank=16, kv_lora_rank=8,
                   qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=8)
TINY_GQA = replace(llama("tiny-gqa", 2, 32, 4, 2, 128, 1000, 16, **MOE), qk_layernorm=True)  # head width 8
DENSE = llama("tiny", 2, 64, 4, 4, 128, 1000, 16)


def _rope(work, phase=None):
    return [(o.name, o.phase, o.bytes_read, o.bytes_written, o.flops, o.recompute) for o in work.items
            if isinstance(o, Op) and "_rope" in o.name and (phase is None or o.phase == phase)]


def test_the_forward_kernels_by_hand():
    # q_pe: 16 tokens x 4 heads x rope 4 = 256 elements; k_pe: 16 x 4 = 64; each rotation also reads
    # freqs_cis, 16 tokens x 2 complex64 = 4 B a token's rope element (16 x 4 x 4 B); q is 16 x 4 x (8 + 4)
    w = plan_layer_work(TINY_MLA, ParallelPlan(framework="automodel"))
    assert _rope(w, "F") == [
        ("attn.q_rope.upcast", "F", 2 * 256, 4 * 256, 0.0, False),             # x.float()
        ("attn.q_rope.rotate", "F", 4 * 256 + 4 * 16 * 4, 4 * 256, 3 * 256, False),  # x * freqs_cis
        ("attn.q_rope.downcast", "F", 4 * 256, 2 * 256, 0.0, False),           # .to(bf16)
        ("attn.q_rope.cat", "F", 2 * 64 * 12, 2 * 64 * 12, 0.0, False),         # torch.cat([q_nope, q_pe])
        ("attn.k_rope.upcast", "F", 2 * 64, 4 * 64, 0.0, False),
        ("attn.k_rope.rotate", "F", 4 * 64 + 4 * 16 * 4, 4 * 64, 3 * 64, False),
        ("attn.k_rope.downcast", "F", 4 * 64, 2 * 64, 0.0, False),
    ]
    names = [o.name for o in w.items if o.phase == "F"]
    assert names.index("attn.q_rope.upcast") == names.index("attn.q_up") + 1   # right after the query's up-projection
    assert names.index("attn.k_rope.downcast") < names.index("attn.core")


def test_the_backward_mirrors_it_and_full_recompute_runs_the_forward_again():
    w = plan_layer_work(TINY_MLA, ParallelPlan(framework="automodel", recompute="full"))
    back = [r for r in _rope(w, "B") if not r[5]]
    assert back == [
        ("attn.q_rope.grad.downcast", "B", 2 * 256, 4 * 256, 0.0, False),     # .to(bf16)'s backward: to fp32
        ("attn.q_rope.grad.rotate", "B", 4 * 256 + 4 * 16 * 4, 4 * 256, 3 * 256, False),  # grad * conj(freqs)
        ("attn.q_rope.grad.upcast", "B", 4 * 256, 2 * 256, 0.0, False),       # .float()'s backward: to bf16
        ("attn.q_rope.grad.split_cat", "B", 2 * 64 * 12, 2 * 64 * 12, 0.0, False),  # split's backward: a cat
        ("attn.k_rope.grad.downcast", "B", 2 * 64, 4 * 64, 0.0, False),
        ("attn.k_rope.grad.rotate", "B", 4 * 64 + 4 * 16 * 4, 4 * 64, 3 * 64, False),
        ("attn.k_rope.grad.upcast", "B", 4 * 64, 2 * 64, 0.0, False),
    ]
    names = [o.name for o in w.items if o.phase == "B"]
    assert names.index("attn.k_rope.grad.upcast") + 1 == names.index("attn.q_up.dgrad")
    recomputed = [r[:5] for r in _rope(w, "B") if r[5]]
    assert recomputed == [(n, "B", *rest) for n, _, *rest in (r[:5] for r in _rope(w, "F"))]


@pytest.mark.parametrize("framework", ["megatron", "torchtitan", "llm-foundry", "deepspeed"])
def test_other_frameworks_keep_megatrons_fused_rope(framework):
    assert _rope(plan_layer_work(TINY_MLA, ParallelPlan(framework=framework))) == []


def test_a_dense_model_is_unchanged():
    # AutoModel's dense models are Hugging Face's with Liger's fused rope
    assert _rope(plan_layer_work(DENSE, ParallelPlan(framework="automodel"))) == []
    assert plan_layer_work(DENSE, ParallelPlan(framework="automodel")).items == \
        plan_layer_work(DENSE, ParallelPlan(framework="megatron")).items


def test_the_rotate_half_kernels_by_hand():
    # q: 16 tokens x 4 heads x 8 = 512 elements, k: 16 x 2 x 8 = 256; cos and sin: 16 x 4 fp32 each, cast to
    # bf16 per call; each product reads half the tensor and the (bf16) angles and writes half; sub and add read
    # both halves and write one; cat reads and writes the tensor; 2 bytes an element
    w = plan_layer_work(TINY_GQA, ParallelPlan(framework="automodel"))
    q = [r[:5] for r in _rope(w, "F") if r[0].startswith("attn.q_rope")]
    a = 16 * 4
    half = (2 * (256 + a), 2 * 256, 256)
    assert q == [("attn.q_rope.cos.cast", "F", 4 * a, 2 * a, 0.0), ("attn.q_rope.sin.cast", "F", 4 * a, 2 * a, 0.0),
                 ("attn.q_rope.mul0", "F", *half), ("attn.q_rope.mul1", "F", *half),
                 ("attn.q_rope.sub", "F", 2 * 512, 2 * 256, 256),
                 ("attn.q_rope.mul2", "F", *half), ("attn.q_rope.mul3", "F", *half),
                 ("attn.q_rope.add", "F", 2 * 512, 2 * 256, 256), ("attn.q_rope.cat", "F", 2 * 512, 2 * 512, 0.0)]
    k = [r[:5] for r in _rope(w, "F") if r[0].startswith("attn.k_rope")]
    assert k[-1] == ("attn.k_rope.cat", "F", 2 * 256, 2 * 256, 0.0) and len(k) == 9
    back = [r[:5] for r in _rope(w, "B") if r[0].startswith("attn.q_rope")]
    assert back == [("attn.q_rope.grad.mul2", "B", *half), ("attn.q_rope.grad.mul3", "B", *half),
                    ("attn.q_rope.grad.neg", "B", 2 * 256, 2 * 256, 256),
                    ("attn.q_rope.grad.mul0", "B", *half), ("attn.q_rope.grad.mul1", "B", *half),
                    ("attn.q_rope.grad.sum0", "B", 2 * 512, 2 * 256, 256),
                    ("attn.q_rope.grad.sum1", "B", 2 * 512, 2 * 256, 256),
                    ("attn.q_rope.grad.chunk_cat", "B", 2 * 512, 2 * 512, 0.0)]
    names = [o.name for o in w.items]
    assert names.index("attn.q_rope.cos.cast") == names.index("attn.qk_norm") + 1      # after the per-head norms
    assert names.index("attn.k_rope.grad.chunk_cat") + 1 == names.index("attn.qk_norm.grad")


def test_heads_split_over_tensor_parallel_ranks():
    w = plan_layer_work(TINY_MLA, ParallelPlan(framework="automodel", tp=2))
    assert _rope(w, "F")[0] == ("attn.q_rope.upcast", "F", 2 * 128, 4 * 128, 0.0, False)   # 2 heads of 4
