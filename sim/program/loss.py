"""The loss's kernels over the logits, as the frameworks run them: Megatron-LM's
vocab-parallel cross entropy, unfused or fused (``--cross-entropy-loss-fusion``), and
PyTorch's ``cross_entropy`` (``sim.inputs.plan.CROSS_ENTROPY``). Bytes per logit element
with bf16 logits, forward + backward: 38 + 14 = 52 unfused, 22 + 10 = 32 fused, 6 + 4 = 10
for Transformer Engine's, and 2e + 4e in the training dtype's e bytes for PyTorch's."""

from __future__ import annotations

from sim.program.ops import Builder


def loss_forward(w: Builder, impl: str, n_tok: int, v: int, t: int) -> None:
    """The loss's forward kernels over the n_tok × v logits (bf16 in, fp32 inside).

    Megatron-LM's ``_VocabParallelCrossEntropy`` (``megatron/core/tensor_parallel/
    cross_entropy.py``) casts the logits to fp32, takes the row max, subtracts it in place,
    exponentiates in place, sums, and divides in place to keep the softmax for backward:
    six kernels, 38 bytes per logit at bf16, and three all-reduces of one float per token
    over the tp group (max, target logit, sum). Fused (``fused_cross_entropy.py``, its
    helpers under ``torch.compile``): cast with max, subtract-exp-sum, divide: 22 bytes,
    and two all-reduces (the target logit and the sum travel together). PyTorch's
    ``cross_entropy`` in the training dtype: one log-softmax kernel reading the logits and
    writing the log-probabilities (the nll_loss gather is per token)."""
    e, n, f = w.e, n_tok * v, 4

    def all_reduce(name: str, floats_per_token: int) -> None:
        if t > 1:
            w.comm(f"head.loss.all_reduce.{name}", "all_reduce", floats_per_token * f * n_tok)

    if impl == "pytorch":
        w.mem("head.loss.log_softmax", e * n, e * n, 4 * n, framework=True)
        return
    if impl == "te":
        # Transformer Engine's parallel_cross_entropy (transformer_engine/pytorch/triton/cross_entropy.py, TE 2.7):
        # online_softmax_kernel reads each row once for its max, sum and target logit (3 floats a token), the tp
        # ranks all-gather those, and cross_entropy_kernel reads the row again and writes the gradient over the
        # logits in their dtype, so the backward only scales it (library kernels: memory_efficiency)
        w.mem("head.loss.online_softmax", e * n, 3 * f * n_tok, 3 * n)
        if t > 1:
            w.comm("head.loss.all_gather.max_sum", "all_gather", 3 * f * n_tok * t)
        w.mem("head.loss.grad_in_place", e * n + 3 * f * n_tok * t, e * n + f * n_tok, 3 * n, output=e * n)
        return
    if impl == "megatron-fused":
        w.mem("head.loss.max", e * n, f * n + f * n_tok, n, output=f * n, framework=True)  # the cast with the max
        all_reduce("max", 1)
        w.mem("head.loss.exp", f * n, f * n, 3 * n, framework=True)  # subtract, exp, sum
        all_reduce("sum", 2)  # the target's logit with the sum
    else:
        w.mem("head.loss.float", e * n, f * n, framework=True)
        w.mem("head.loss.max", f * n, f * n_tok, n, framework=True)
        all_reduce("max", 1)
        w.mem("head.loss.sub", f * n, f * n, n, framework=True)
        w.mem("head.loss.exp", f * n, f * n, n, framework=True)
        w.mem("head.loss.sum", f * n, f * n_tok, n, framework=True)
        all_reduce("target", 1)
        all_reduce("sum", 1)
    w.mem("head.loss.div", f * n + f * n_tok, f * n, n, framework=True)


def loss_backward(w: Builder, impl: str, n_tok: int, v: int) -> None:
    """The loss's backward kernels, giving the logits' gradient in the training dtype.

    Megatron-LM: subtract one at each target (per token), scale the kept softmax by the
    loss's gradient in place, and (unfused) cast the fp32 gradient to the logits' dtype in
    a separate kernel, as autograd does for a function whose input was bf16: 14 bytes per
    logit unfused, 10 fused (scale and cast in one kernel that also writes the fp32 buffer
    back, since it updates it in place). PyTorch: nll_loss's backward zero-fills a
    gradient of the logits' shape and scatters −1/n at the targets, then log-softmax's
    backward reads it and the log-probabilities and writes the gradient."""
    e, n, f = w.e, n_tok * v, 4
    if impl == "te":  # cross_entropy_backward: element_mul_kernel scales the gradient the forward wrote, in place
        w.mem("head.loss.grad", e * n, e * n, n, output=e * n)
    elif impl == "pytorch":
        w.mem("head.loss.nll.grad", 0, e * n, framework=True)
        w.mem("head.loss.grad", 2 * e * n, e * n, 3 * n, framework=True)
    elif impl == "megatron-fused":
        w.mem("head.loss.grad", f * n, (f + e) * n, n, output=e * n, framework=True)
    else:
        w.mem("head.loss.grad", f * n, f * n, n, framework=True)
        w.mem("head.loss.grad.cast", f * n, e * n, framework=True)
