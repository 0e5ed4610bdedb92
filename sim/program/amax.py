"""FP8 delayed scaling's amax reductions: two small blocking all-reduces per model chunk
and micro-batch.

With Transformer Engine's delayed scaling (its default recipe, the one ``--fp8-format``
models, ``sim.program.fp8``), every FP8 tensor's scale comes from the absolute maxima
(amax) its cast kernels recorded in earlier iterations, and those maxima must agree
across the ranks that hold pieces of the same tensors or copies of the same weights: the
tensor-, data- and context-parallel ranks of one pipeline stage (Megatron-Core's amax
reduction group, ``parallel_state.get_amax_reduction_group(with_context_parallel=True)``,
built over ``tp-dp-cp``). Transformer Engine reduces them

- in the forward, when the ``fp8_autocast`` region closes (``fp8_autocast`` exit ->
  ``FP8GlobalStateManager.reduce_and_update_fp8_tensors(forward=True)``); Megatron-Core's
  ``TransformerBlock.forward`` opens one region around a model chunk's layers, so there
  is one reduction per chunk and micro-batch, of 3 fp32 maxima per FP8 GEMM (input,
  weight, output: ``num_gemms * 3`` in TE's ``fp8_meta``);
- in the backward, at the end of the backward of the region's first FP8 module
  (``_prepare_backward`` -> ``reduce_and_update_fp8_tensors(forward=False)``), one per
  chunk and micro-batch, of 2 maxima per GEMM (output gradient, input gradient).

Each is ``torch.distributed.all_reduce(op=MAX)`` without ``async_op``: the compute stream
waits for it, so it is a meeting of the whole stage group on the critical path (tiny,
latency-bound: its time is NCCL's latency over tp·dp·cp ranks, which grows with the
nodes the group spans). What follows on the rank (the next step, and the send of the
chunk's output to the next stage, which PyTorch's NCCL stream orders after the compute
stream) waits for it.

Here each forward step (F) and each backward step that computes input gradients (B, or
I when the backward is split) is followed by one all-reduce over the stage's
tp·dp·cp ranks, on the compute stream, that takes over the step's name (so every action
that waited for the step waits for the reduction too). Simplifications: the reduction
closes the whole step, where Transformer Engine's forward region ends before the final
norm and the output layer, and its backward region before the embedding's backward (a
few kernels' difference in when it is issued, not in its cost); the scale-update kernel
after each reduction (a few microseconds, ``fused_amax_and_scale_update_after_reduction``)
and the host-side work are left out; the recompute of a checkpointed forward reduces
nothing (Transformer Engine reuses the saved scales).
"""

from __future__ import annotations

from typing import Callable

from sim.program.actions import Action, Program
from sim.program.passes import step_kind

FORWARD_MAXIMA_PER_GEMM = 3
"""fp32 maxima a GEMM adds to the forward reduction (input, weight, output)."""
BACKWARD_MAXIMA_PER_GEMM = 2
"""fp32 maxima a GEMM adds to the backward reduction (output gradient, input gradient)."""
AMAX_BYTES = 4
"""An amax is one fp32."""
STEP_KINDS = {"F": FORWARD_MAXIMA_PER_GEMM, "B": BACKWARD_MAXIMA_PER_GEMM, "I": BACKWARD_MAXIMA_PER_GEMM}
CATEGORY = "amax"
"""The trace category of the reductions (``sim.results.metrics``: exposed "amax")."""


def reduction_bytes(kind: str, fp8_gemms: int) -> float:
    """Bytes of the reduction after a step of ``kind`` whose chunk runs ``fp8_gemms`` FP8
    GEMMs (0 for kinds that reduce nothing: W)."""
    return float(STEP_KINDS.get(kind, 0) * fp8_gemms * AMAX_BYTES)


def add_amax_reductions(prog: Program, stage_group: Callable[[int], tuple[int, ...]],
                        gemms: Callable[[Action], int],
                        price: Callable[[str, tuple, float], float] | None = None) -> Program:
    """After each F, B and I step of each rank, one all-reduce of the step's maxima over
    ``stage_group(rank)`` on the compute stream (see the module doc). ``gemms(action)``:
    the FP8 GEMMs of the chunk whose step the action is (the step's last piece, which
    carries its name); steps with none, and groups of one rank, reduce nothing.

    Run it after the tensor-parallel pieces are in (``sim.program.tp``) and before the
    point-to-point pass: the reduction takes the step's name, the piece it follows is
    renamed ``<step>.fp8``, so cross-rank dependencies, and the sends made from them,
    wait for the reduction.

    With ``price`` (``sim.engine.tuner.alone_time`` bound to the run's topology and NCCL
    settings: op, ranks, bytes -> seconds) each reduction is a ``comm`` action of that
    duration, a meeting of the group's simulated ranks, instead of a collective on the
    network: a few hundred bytes contend with nothing that matters, and a collective
    over hundreds of ranks per chunk and micro-batch would cost the simulation far more
    events than the rest of the step (a 2,048-GPU plan ran 35 times longer)."""
    out: dict[int, list[Action]] = {}
    priced: dict[tuple, float] = {}
    for r, acts in prog.actions.items():
        group = stage_group(r)
        if len(group) < 2:
            out[r] = list(acts)
            continue
        new: list[Action] = []
        for a in acts:
            kind = step_kind(a.name) if "." not in a.name else ""
            nbytes = reduction_bytes(kind, gemms(a)) if kind in STEP_KINDS else 0.0
            if not nbytes:
                new.append(a)
                continue
            last = a.evolve(name=f"{a.name}.fp8")
            new.append(last)
            if price is None:
                new.append(Action.new(a.name, kind="collective", op="allreduce", group=group, nbytes=nbytes,
                                      category=CATEGORY, stream="compute", tag=f"amax {a.name}", deps=(last.name,)))
                continue
            t = priced.get((group, nbytes))
            if t is None:
                t = priced[(group, nbytes)] = price("allreduce", group, nbytes)
            new.append(Action.new(a.name, kind="comm", op="allreduce", duration_s=t, nbytes=nbytes, group=group,
                                  category=CATEGORY, stream="compute", deps=(last.name,)))
        out[r] = new
    return prog.with_actions(out)


def stage_groups(plan) -> Callable[[int], tuple[int, ...]]:
    """``rank`` -> the tensor-, data- and context-parallel ranks of its pipeline stage
    (Megatron-Core's amax reduction group), in rank order."""
    made: dict[int, tuple[int, ...]] = {}

    def group(rank: int) -> tuple[int, ...]:
        pp = plan.coords(rank)[1]
        got = made.get(pp)
        if got is None:
            got = made[pp] = tuple(sorted(plan.rank(dp=d, pp=pp, tp=t) for d in range(plan.dp_cp)
                                          for t in range(plan.tp)))
        return got

    return group


GEMMS_PER_LAYER = 4
"""FP8 GEMMs of a transformer layer: QKV, projection, MLP up and down (an MoE layer's
expert GEMMs are counted as its MLP's two: the bytes are a few hundred either way)."""


def chunk_gemms(model, plan) -> Callable[[Action], int]:
    """The FP8 GEMMs of the chunk a step's action belongs to (its transformer layers'),
    from the step's name (``2F0``: virtual stage 2)."""
    from sim.program.schedules import Step

    def gemms(a: Action) -> int:
        return GEMMS_PER_LAYER * len(plan.layer_range(model, Step.parse(a.name).stage))

    return gemms
