"""The loss and the embedding's backward, kernel by kernel, as the frameworks run them:
Megatron-LM's vocab-parallel cross entropy (megatron/core/tensor_parallel/cross_entropy.py),
its fused form (megatron/core/fusions/fused_cross_entropy.py, --cross-entropy-loss-fusion),
Transformer Engine's (transformer_engine/pytorch/triton/cross_entropy.py, --cross-entropy-fusion-impl te),
PyTorch's cross_entropy, and PyTorch's dense embedding backward."""

import pytest

from sim.errors import InputError
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.program.workload import embedding_work, head_work

V, S, H = 1000, 32, 64


def _loss(impl, tp=1, e=2):
    w = head_work(gpt("g", 2, H, 8, V, S), 1, tp=tp, dtype_bytes=e, cross_entropy=impl)
    ops = [o for o in w.ops() if o.name.startswith("head.loss")]
    comms = [c for c in w.comms() if c.name.startswith("head.loss")]
    return ops, comms


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_megatron_cross_entropy_moves_52_bytes_per_logit(tp):
    # Per logit, bf16 logits: cast to fp32 (2 read + 4 written), max (4), subtract in place
    # (4 + 4), exp in place (4 + 4), sum (4), divide in place (4 + 4) = 38 forward; backward
    # scales the kept softmax in place (4 + 4) and autograd casts it back to bf16 (4 + 2) = 14.
    # Per token: the max and the sum write one float each, the divide reads the sum.
    n_tok, v = S, V // tp
    ops, comms = _loss("megatron", tp)
    assert [o.name.split(".", 2)[-1] for o in ops] == ["float", "max", "sub", "exp", "sum", "div", "grad", "grad.cast"]
    assert sum(o.bytes_read + o.bytes_written for o in ops if o.phase == "F") == 38 * n_tok * v + 12 * n_tok
    assert sum(o.bytes_read + o.bytes_written for o in ops if o.phase == "B") == 14 * n_tok * v
    assert all(o.kind == "memory" and o.framework for o in ops)
    # three all-reduces of one float per token (max, the target's logit, the sum) when the vocabulary is split
    assert [c.nbytes for c in comms] == ([4 * n_tok] * 3 if tp > 1 else [])


@pytest.mark.parametrize("tp", [1, 8])
def test_fused_cross_entropy_moves_32_bytes_per_logit(tp):
    # Fused: cast with max (2 + 4), subtract-exp-sum (4 + 4), divide (4 + 4) = 22; backward
    # scale-and-cast reads the softmax, writes it back and writes bf16 (4 + 4 + 2) = 10.
    n_tok, v = S, V // tp
    ops, comms = _loss("megatron-fused", tp)
    assert len(ops) == 4
    assert sum(o.bytes_read + o.bytes_written for o in ops if o.phase == "F") == 22 * n_tok * v + 8 * n_tok
    assert sum(o.bytes_read + o.bytes_written for o in ops if o.phase == "B") == 10 * n_tok * v
    # the target's logit and the sum travel in one all-reduce
    assert [c.nbytes for c in comms] == ([4 * n_tok, 8 * n_tok] if tp > 1 else [])


@pytest.mark.parametrize("tp", [1, 4])
def test_transformer_engines_cross_entropy_moves_10_bytes_per_logit(tp):
    # TE 2.7's parallel_cross_entropy: online_softmax_kernel reads the bf16 logits (2) and writes the row's max,
    # sum and target logit (3 floats a token); cross_entropy_kernel reads the logits again (2), and the gathered
    # 3 floats of each of the tp ranks, and writes the gradient over them (2) and the token's loss (a float):
    # 6 forward; the backward's element_mul_kernel scales the gradient in place (2 + 2) = 4.
    n_tok, v = S, V // tp
    ops, comms = _loss("te", tp)
    assert [o.name for o in ops] == ["head.loss.online_softmax", "head.loss.grad_in_place", "head.loss.grad"]
    assert sum(o.bytes_read + o.bytes_written for o in ops if o.phase == "F") == 6 * n_tok * v + (12 + 12 * tp + 4) * n_tok
    assert sum(o.bytes_read + o.bytes_written for o in ops if o.phase == "B") == 4 * n_tok * v
    assert not any(o.framework for o in ops)  # TE's own kernels, at the library kernels' rate
    # the tp ranks all-gather each one's three floats per token
    assert [(c.collective, c.nbytes) for c in comms] == ([("all_gather", 12 * n_tok * tp)] if tp > 1 else [])


def test_the_fusion_impl_picks_the_kernels_of_the_fused_loss():
    fused = {"cross_entropy": "megatron-fused"}
    assert ParallelPlan(**fused, cross_entropy_impl="te").loss_kernels == "te"
    assert ParallelPlan(**fused).loss_kernels == "megatron-fused"
    assert ParallelPlan().loss_kernels == "megatron"
    assert ParallelPlan(**fused, cross_entropy_impl="te").sections.framework.loss_kernels == "te"


@pytest.mark.parametrize("e", [2, 4])
def test_pytorch_cross_entropy_in_the_training_dtype(e):
    # log_softmax (read, write), nll_loss's zero-filled gradient (write), log_softmax's
    # backward (read the gradient and the output, write): 6 element passes of e bytes.
    ops, comms = _loss("pytorch", 1, e)
    assert [o.name for o in ops] == ["head.loss.log_softmax", "head.loss.nll.grad", "head.loss.grad"]
    assert sum(o.bytes_read + o.bytes_written for o in ops) == 6 * e * S * V and comms == []


def test_bad_cross_entropy_is_one_line():
    with pytest.raises(InputError, match="plan: cross_entropy.*allowed: megatron, megatron-fused, te, pytorch"):
        ParallelPlan(cross_entropy="liger")
    with pytest.raises(InputError, match="cross_entropy_fusion_impl.*changes nothing without cross_entropy_loss_fusion"):
        ParallelPlan(cross_entropy_impl="te")
    with pytest.raises(InputError, match="plan: cross_entropy.*tp 1"):
        ParallelPlan(tp=2, cross_entropy="pytorch")
    with pytest.raises(InputError, match="cross_entropy"):
        head_work(gpt("g", 2, H, 8, V, S), 1, cross_entropy="fast")


@pytest.mark.parametrize("tp,learned", [(1, True), (4, True), (2, False)])
def test_embedding_backward_is_dense(tp, learned):
    # PyTorch's embedding backward zero-fills a gradient of the table's shape (2 bytes per
    # weight), and Megatron-LM's DDP hook adds it into the fp32 main gradient (2 + 4 read,
    # 4 written): 12 bytes per weight of the rank's tables, every micro-batch, whatever the
    # gradient-accumulation fusion (the lookup is no GEMM).
    m = gpt("g", 2, H, 8, V, S, position_embedding="learned" if learned else "rope")
    rows = V // tp + (m.max_position_embeddings if learned else 0)
    ops = {o.name: o for o in embedding_work(m, 1, tp=tp).ops()}
    assert ops["embed.wgrad.zero"].bytes_written == 2 * rows * H and ops["embed.wgrad.zero"].bytes_read == 0
    add = ops["embed.main_grad.add"]
    assert (add.bytes_read, add.bytes_written) == (6 * rows * H, 4 * rows * H)
    assert [n for n in ops if ops[n].phase == "W"] == ["embed.wgrad.zero", "embed.wgrad", "embed.main_grad.add"]


@pytest.mark.parametrize("fidelity", ["full", "reduced"])
def test_the_fusion_flag_shortens_the_step_by_the_kernels_it_saves(fidelity):
    # One GPU, four micro-batches: fusing the loss saves exactly four micro-batches of the
    # unfused kernels' time less the fused ones', in the simulator and in the estimate; the
    # setting reaches the plan.
    from sim.inputs.hardware import load_profile
    from sim.inputs.resolve import plan_from_settings
    from sim.inputs.schema import RunSettings
    from sim.inputs.topology_build import load_topology
    from sim.program.costs import op_time
    from sim.program.estimate import estimate
    from sim.program.workload import chunk_work
    from sim.inputs.schema import SimulationSettings
    from sim.session import Job, simulate_training

    model, prof, topo = gpt("g", 2, 512, 8, 32000, 256), load_profile("h100-sxm"), load_topology("dgx-h100")
    plans = [plan_from_settings(RunSettings.from_values(
        {"micro_batch_size": 1, "global_batch_size": 4, "cross_entropy_loss_fusion": f}).plan, 1, model) for f in (False, True)]
    assert [p.cross_entropy for p in plans] == ["megatron", "megatron-fused"]

    def loss_s(plan):
        return sum(op_time(o, prof) for w in chunk_work(model, plan, 0) for o in w.ops()
                   if o.name.startswith("head.loss"))

    saved = loss_s(plans[0]) - loss_s(plans[1])
    assert saved > 0
    sims = [simulate_training(Job(model, p, prof, topo),
                              SimulationSettings(fidelity=fidelity)).trace.end_s for p in plans]
    assert sims[0] - sims[1] == pytest.approx(4 * saved, rel=1e-9)
    est = [estimate(model, p, prof).time["compute"] for p in plans]
    assert est[0] - est[1] == pytest.approx(4 * saved, rel=1e-9)


def test_the_flag_is_megatrons():
    from sim.inputs.schema import FIELDS

    assert FIELDS["cross_entropy_loss_fusion"].flag == "--cross-entropy-loss-fusion"
