"""The reference GPT that ``trainsim validate`` trains for real and ``trainsim calibrate``
times at a tiny shape for the framework's per-kernel cost (``bench_framework``), and under
the PyTorch profiler for what the profiler costs per operator (``bench_profiler``): plain
PyTorch modules with the kernels trainsim's workload lists for a GPT
(``sim.program.workload``).
"""

from __future__ import annotations

from sim.calibrate import require_torch
from sim.calibrate.launch import Context, measure, training_dtype
from sim.inputs.model import ModelSpec, gpt
from sim.inputs.plan import ParallelPlan
from sim.program.workload import chunk_work


def reference_gpt(torch, model: ModelSpec, first: bool, last: bool, layers: int):
    """One pipeline stage of the reference GPT as a ``torch.nn.Module``: ``layers``
    pre-norm blocks (LayerNorm, QKV, causal ``scaled_dot_product_attention``, output
    projection, LayerNorm, GeLU MLP, residuals), the token and position embeddings on
    the ``first`` stage, the final norm and logit layer on the ``last``. Its forward
    takes token ids (first stage) or activations and returns activations or logits."""
    nn, F = torch.nn, torch.nn.functional
    h, bias = model.hidden_size, model.bias

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv = nn.Linear(h, 3 * h, bias=bias)
            self.proj = nn.Linear(h, h, bias=bias)
            self.up = nn.Linear(h, model.ffn_hidden_size, bias=bias)
            self.down = nn.Linear(model.ffn_hidden_size, h, bias=bias)

        def forward(self, x):
            b, s, _ = x.shape
            a, d = model.num_attention_heads, model.head_dim
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, a, d).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, s, h))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            if first:
                self.tok = nn.Embedding(model.vocab_size, h)
                self.pos = nn.Embedding(model.max_position_embeddings, h)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            if last:
                self.ln_f = nn.LayerNorm(h)
                self.out = nn.Linear(h, model.vocab_size, bias=False)

        def forward(self, x):
            if first:
                x = self.tok(x) + self.pos.weight[: x.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            return self.out(self.ln_f(x)) if last else x

    return Stage()


FRAMEWORK_SHAPE = dict(num_layers=2, hidden_size=16, num_attention_heads=2, vocab_size=32, seq_length=8)
"""The reference GPT at a size where every kernel's work is negligible (``bench_framework``)."""


def bench_framework(ctx: Context, repeats: int, warmup: int) -> dict:
    """The framework's fixed cost per kernel in a training step: forward and backward of
    one micro-batch of the reference GPT (``sim.calibrate.reference``, all layers on one
    stage) at ``FRAMEWORK_SHAPE``, divided by the kernels trainsim counts for it. What
    a step's operators cost beyond their work: Python, module calls, autograd's graph,
    dispatch, views and the small kernels trainsim does not list (copies, bias-gradient
    sums). Where the device is the host CPU, this is on the critical path of
    every kernel; a GPU's host runs ahead of its queue."""
    torch = require_torch()

    model = gpt("framework-probe", tied_embeddings=False, dropout=False, **FRAMEWORK_SHAPE)
    # counted as validate simulates the reference: PyTorch's cross entropy, and autograd adding
    # each weight's gradient into its standing buffer (``sim.calibrate.validate.config_plan``)
    plan = ParallelPlan(micro_batch_size=1, global_batch_size=1, cross_entropy="pytorch",
                        gradient_accumulation_fusion=False)
    kernels = sum(len(w.ops()) for w in chunk_work(model, plan, 0))
    gen = torch.Generator().manual_seed(5)
    stage = reference_gpt(torch, model, True, True, model.num_layers).to(ctx.device, training_dtype(ctx))
    for q in stage.parameters():  # accumulate as the reference run does, into standing buffers
        q.grad = torch.zeros_like(q)
    tok, tgt = (torch.randint(0, model.vocab_size, (1, model.seq_length), generator=gen).to(ctx.device)
                for _ in range(2))

    def step():
        y = stage(tok)
        torch.nn.functional.cross_entropy(y.float().view(-1, model.vocab_size), tgt.view(-1)).backward()

    t = measure(ctx, step, warmup=warmup, repeats=repeats)
    return {"model": dict(FRAMEWORK_SHAPE), "kernels": kernels, "step_s": t, "per_kernel_s": t / kernels}


PROFILER_BENCH_FLOPS = 5e10
"""Most FLOPs (6 x parameters x tokens) of the iteration ``bench_profiler`` times at the
model's own shape; a larger model is timed at ``FRAMEWORK_SHAPE`` (on a CPU, seconds per
sample)."""


PROFILER_BENCH_ROUNDS = 11
"""Iterations ``bench_profiler`` times each way, at least (7 until 2026-12-07). Under torch 2.13
on this project's 2-CPU EPYC the profiler's cost per event is below what these rounds resolve:
the profiled and the plain iteration of the test's model both took about 4 ms for 1,636 events,
their least times differing by either sign (−0.35 to +0.35 ms), so ``per_op_s`` may be 0."""


def bench_profiler(ctx: Context, model: ModelSpec | None, plan: ParallelPlan | None, repeats: int,
                   warmup: int) -> dict:
    """What the PyTorch profiler costs the host thread per operator it records, as
    ``trainsim validate``'s reference run profiles (``ProfilerActivity.CPU``,
    ``record_shapes=True``; ``sim.calibrate.reference``): a training iteration of the
    reference GPT on one process (all layers on one stage; ``plan``'s micro-batches, each
    forward and backward inside a ``record_function`` annotation as the reference run's
    steps are, then Adam's step), timed alternately without and under a profiler session of
    its own, ``PROFILER_BENCH_ROUNDS`` times each. The cost per event: the least CPU time the
    thread took under the profiler less the least it took without, over the events the
    profiler recorded in one iteration. The least of each, not a median of differences:
    on a shared machine the other work only ever adds to a thread's CPU time (its caches
    evicted), by tens of percent under a load of 15 on 2 CPUs, where the profiler adds a few.

    A whole iteration, not one operator or one step: the cost per event is not the same
    across a session (on this project's 2-vCPU EPYC, 2026-12-06, one forward and backward
    alone in a session measured 0.9 to 1.7 us per event, where the reference run's 1F1B
    iteration, profiled and not in turns in the same processes, took 3.8 to 5.0 us per
    event more). CPU time, not wall time: the profiler's callbacks run on the thread that
    runs the operators, so on a core of its own that is the wall time they add, and it does
    not move with what else the machine runs. At ``model``'s shape where it is small enough
    (``PROFILER_BENCH_FLOPS``), else at ``FRAMEWORK_SHAPE`` with one micro-batch of 1."""
    import time

    torch = require_torch()
    from torch.profiler import ProfilerActivity, profile, record_function

    mb, m = (plan.micro_batch_size, plan.num_microbatches) if plan is not None else (1, 1)
    if model is None or 6.0 * model.num_params * mb * m * model.seq_length > PROFILER_BENCH_FLOPS:
        model, mb, m = gpt("framework-probe", tied_embeddings=False, dropout=False, **FRAMEWORK_SHAPE), 1, 1
    gen = torch.Generator().manual_seed(7)
    stage = reference_gpt(torch, model, True, True, model.num_layers).to(ctx.device, training_dtype(ctx))
    for q in stage.parameters():  # (gradients accumulate into standing buffers, as the reference run's)
        q.grad = torch.zeros_like(q)
    opt = torch.optim.Adam(stage.parameters(), lr=1e-4)
    data = [tuple(torch.randint(0, model.vocab_size, (mb, model.seq_length), generator=gen).to(ctx.device)
                  for _ in range(2)) for _ in range(m)]

    def iteration() -> float:
        t0 = time.thread_time()
        for i, (tok, tgt) in enumerate(data):
            with record_function(f"F{i}"):
                loss = torch.nn.functional.cross_entropy(stage(tok).float().view(-1, model.vocab_size), tgt.view(-1))
            with record_function(f"B{i}"):
                loss.backward()
        with record_function("optimizer"):
            opt.step()
            for q in stage.parameters():
                q.grad.zero_()
        ctx.sync()
        return time.thread_time() - t0

    for _ in range(max(1, warmup)):
        iteration()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True):  # (the profiler's own first start)
        iteration()
    events, plain, traced = 0, [], []
    for _ in range(max(PROFILER_BENCH_ROUNDS, repeats)):
        plain.append(iteration())
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            traced.append(iteration())
        events = len(prof.events())
    extra = min(traced) - min(plain)
    per_op = max(0.0, extra / events) if events else 0.0
    return {"model": {"num_layers": model.num_layers, "hidden_size": model.hidden_size,
                      "seq_length": model.seq_length, "vocab_size": model.vocab_size},
            "micro_batch_size": mb, "microbatches": m, "events": events, "iteration_cpu_s": min(plain),
            "traced_cpu_s": min(traced), "extra_cpu_s": extra, "per_op_s": per_op,
            "rounds_cpu_s": {"plain": plain, "traced": traced}}
