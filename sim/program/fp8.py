"""FP8 training as Transformer Engine runs it: which GEMMs go to FP8, the casts and
transposes around them, and what stays in BF16.

``fp8_layer_work`` turns one transformer layer's ``Work`` (``sim.program.workload``) into
what Megatron-Core with Transformer Engine (TE) runs under ``--fp8-format``: the layer's
four weight GEMMs (QKV, attention projection, MLP up and down) and their input-gradient
(B) and weight-gradient (W) GEMMs take FP8 operands (1 byte) and run at the profile's FP8
peak with its own efficiency (``HardwareProfile.gemm_efficiency(..., dtype="fp8")``),
writing BF16 outputs; memory-bound cast and transpose kernels with their real bytes move
the tensors into FP8 around them. What follows is TE 1.13's code path
(``transformer_engine/pytorch/module/linear.py``, ``layernorm_linear.py``, ``base.py``),
with QKV and MLP-up as ``LayerNormLinear`` (TELayerNormColumnParallelLinear) and the
projection and MLP-down as row-parallel ``Linear`` (TERowParallelLinear). With G elements
of a tensor (bf16 in 2 bytes, fp8 out 1 byte):

Forward
- QKV and MLP-up: the norm before them writes FP8 directly (``layernorm_fwd_fp8``: the
  cast is fused into the norm, whose output shrinks from 2 to 1 byte per element), and
  under sequence parallelism the all-gather of that output carries FP8 (1 byte).
- Projection and MLP-down: their BF16 input is cast, read 2G write 1G
  (``cast_to_fp8``) under sequence parallelism, or cast and transposed at once for the
  weight gradient, read 2G write 2G (``fp8_cast_transpose_fused``) without it.
- Weights: each FP8 weight and its transpose are cast from the BF16 weight (read 2,
  write 2 bytes per parameter) on the first micro-batch of a step only: Megatron-Core
  passes ``is_first_microbatch`` and TE caches the FP8 copies (``get_fp8_workspace``,
  ``update_workspace = is_first_microbatch is None or is_first_microbatch``) for the
  other micro-batches. The program gives every micro-batch the same work, so each
  forward carries 1/m of that cast (m micro-batches): the same bytes per step, spread
  (the kernel's launch cost, a few microseconds, is then charged m times instead of once).
  Recomputed forwards reuse the cached copies.
Backward (B)
- Gradient of a row-parallel GEMM (projection, MLP-down) under sequence parallelism:
  the local shard is cast (read 2G/t, write G/t) before its all-gather, which carries
  FP8, and the gathered FP8 gradient is transposed for the weight gradient (read G,
  write G: ``grad_output_preprocess`` casts, gathers, then ``fp8_transpose``).
- Every other gradient (column-parallel GEMMs, or no sequence parallelism): one fused
  cast-transpose (with the bias gradient), read 2G write 2G
  (``fp8_cast_transpose_bgrad_fused``).
Weight gradient (W)
- QKV and MLP-up transpose their saved FP8 input (re-gathered in FP8 under sequence
  parallelism) for the weight GEMM, read G write G (``fp8_transpose``); the projection and
  MLP-down do the same under sequence parallelism (without it their input was transposed
  in the forward cast).

The kernels are named after the GEMM they serve: ``mlp.down.to_fp8`` (a cast),
``mlp.down.to_fp8_t`` (a cast with its transpose), ``mlp.down.weight_to_fp8_t``,
``mlp.down.dgrad.to_fp8_t``, ``mlp.down.wgrad.transpose``. Transposes that TE runs before
the GEMM they feed are placed right after the GEMM beside them: on one stream the order inside a phase does not change its time, and each
all-gather stays next to the GEMM it feeds (``sim.program.tp`` overlaps such pairs).

Routed experts: Megatron-Core builds each expert's two linears from TE modules
(SequentialMLP's TEColumnParallelLinear and TERowParallelLinear, TEGroupedMLP's
GroupedLinear; ``megatron/core/models/gpt/gpt_layer_specs.py``), so under ``fp8_autocast``
``moe.experts.up`` and ``moe.experts.down`` and their input and weight gradients run in
FP8 as well. Their input comes from the token dispatcher (BF16, not a norm) and TE runs
them without sequence parallelism, so each forward input is cast and transposed at once
(``to_fp8_t``, read 2G write 2G), each output gradient too, and the weight gradients need
no transpose of their own. The shared experts (``moe.shared.*``) and the router stay BF16
here.

Amax: TE's cast kernels record each tensor's absolute maximum as they write it, so the
scaling statistics cost no pass of their own. Their reduction across the stage (one small
blocking all-reduce after each chunk's forward and one after its backward, over the
tensor-, data- and context-parallel ranks) is ``sim.program.amax``'s pass; the scale
update kernel after it is left out.

What stays BF16: the attention core (flash attention in BF16; TE's FP8 attention is not
the default), norms' inputs and their backward, activations (GeLU/SwiGLU), residuals and
dropout, the embedding and the output layer (LM head) with the loss, the reduce-scatters
and all-reduces of tensor parallelism (they carry the GEMMs' BF16 outputs) and the
data-parallel gradient sync. The two formats cost the same: 'e4m3' (every tensor E4M3)
and 'hybrid' (E4M3 forward, E5M2 gradients, what NeMo's recipes use) differ in range
and precision, which matter for convergence, not for time.

FP8 primary weights (``--fp8-param-gather``, NeMo's ``fp8_params``; ``fp8_params`` here):
the model keeps the four GEMMs' weights in FP8 only (the optimizer's FP32 master weights
are cast into them after each step, a 1/dp shard per rank, left out), so each step's
weight kernel is the FP8 transpose alone (read 1, write 1 byte per parameter,
``weight_transpose``), the distributed optimizer all-gathers those weights in FP8
(``sim.program.training``'s ``param_gather`` pass), and a rank holds 1 byte of weight and 1 of transpose per such
parameter instead of the BF16 weight and the FP8 copy and transpose
(``sim.program.memory.rank``).

Not modelled: userbuffers' atomic GEMMs, FP8 attention and the per-tensor
current-scaling and MXFP8 recipes of TE 2.x.
"""

from __future__ import annotations

from dataclasses import replace

from sim.errors import InputError, require

FP8_FORMATS = ("e4m3", "hybrid")
BF16_BYTES = 2
FP8_BYTES = 1

FP8_GEMMS = ("attn.qkv", "attn.proj", "mlp.up", "mlp.down")
"""The forward GEMMs a transformer layer runs in FP8 (the weight GEMMs of TE's linear modules)."""
NORM_FUSED = {"attn.qkv": "attn.norm", "mlp.up": "mlp.norm"}
"""LayerNormLinear GEMMs and the norm that writes their FP8 input."""
ROW_PARALLEL = ("attn.proj", "mlp.down")
EXPERT_GEMMS = ("moe.experts.up", "moe.experts.down")
"""The routed experts' GEMMs (module doc): FP8, inputs cast and transposed as a row-parallel
GEMM's without sequence parallelism."""
FP8_GATHERS = {"attn.all_gather": "attn.qkv", "mlp.all_gather": "mlp.up",
               "attn.all_gather.grad": "attn.proj", "mlp.all_gather.grad": "mlp.down",
               "attn.qkv.all_gather.input": "attn.qkv", "mlp.up.all_gather.input": "mlp.up"}
"""Sequence-parallel all-gathers that carry FP8, and the GEMM each feeds."""


def precision(fp8_format: str | None) -> str:
    """The run's precision as reported: 'bf16', 'fp8-e4m3' or 'fp8-hybrid'."""
    return "bf16" if fp8_format is None else f"fp8-{fp8_format}"


def check_fp8_support(fp8_format: str | None, profile, flag: str = "--fp8-format") -> None:
    """A one-line error when ``fp8_format`` is set and the GPU has no FP8 peak (A100)."""
    if fp8_format is None or "fp8" in profile.peak_flops:
        return
    from sim.inputs.hardware import PRESETS, load_profile

    able = [n for n in PRESETS if "fp8" in load_profile(n).peak_flops]
    raise InputError(f"{flag}: got {fp8_format!r}; GPU {profile.name} has no FP8 tensor cores (its profile's "
                     f"peak_flops has {', '.join(sorted(profile.peak_flops))}, no fp8); allowed on {profile.name}: "
                     f"leave it unset (BF16); {' or '.join(FP8_FORMATS)} need a GPU with an fp8 peak "
                     f"({', '.join(able)})")


def _role(name: str) -> tuple[str | None, str | None]:
    """(forward GEMM, role) of an op name: ('mlp.down', 'dgrad') for 'mlp.down.dgrad'."""
    for base in FP8_GEMMS + EXPERT_GEMMS:
        if name == base:
            return base, "fwd"
        if name in (f"{base}.dgrad", f"{base}.wgrad"):
            return base, name.rsplit(".", 1)[1]
    return None, None


def _memory(op, suffix: str, read: float, written: float):
    """A memory-bound TE kernel that serves GEMM ``op`` (same phase and recompute flag)."""
    return replace(op, name=f"{op.name}.{suffix}", kind="memory", flops=0.0, bytes_read=float(read),
                   bytes_written=float(written), output_bytes=float(written), shape=(), batch=1, dtype="bf16",
                   framework=False)


def _as_fp8(op):
    """The GEMM with FP8 operands (1 byte each) and its BF16 output."""
    m, n, k = op.shape
    return replace(op, dtype="fp8", bytes_read=float(FP8_BYTES * (m * k + k * n) * op.batch))


def _insert_before(out: list, items: list) -> None:
    """Put ``items`` at the end of ``out``, ahead of an all-gather that ends it (so the
    gather stays next to the GEMM that follows)."""
    at = len(out)
    if out and getattr(out[-1], "collective", None) == "all_gather":
        at -= 1
    out[at:at] = items


def fp8_layer_work(work, fp8_format: str | None, tp: int = 1, sequence_parallel: bool = False,
                   microbatches: int = 1, fp8_params: bool = False):
    """One transformer layer's ``Work`` as TE runs it in FP8 (the module doc); ``work``
    itself when ``fp8_format`` is None. ``sequence_parallel``: in effect (tp > 1);
    ``microbatches``: the m that share each step's weight casts; ``fp8_params``: the
    weights are kept in FP8 (``--fp8-param-gather``), so each step only transposes them."""
    if fp8_format is None:
        return work
    require(fp8_format in FP8_FORMATS, "fp8_format", fp8_format, f"allowed: {', '.join(FP8_FORMATS)}")
    require(isinstance(microbatches, int) and microbatches > 0, "microbatches", microbatches,
            "expected an integer > 0")
    sp = sequence_parallel and tp > 1
    norms = set(NORM_FUSED.values())
    out: list = []
    for it in work.items:
        if not hasattr(it, "kind"):  # a tensor-parallel collective
            if it.name in FP8_GATHERS and it.collective == "all_gather":
                it = replace(it, nbytes=it.nbytes * FP8_BYTES / BF16_BYTES)
            out.append(it)
            continue
        if it.name in norms:  # the norm writes the FP8 input of the GEMM after it
            out.append(replace(it, bytes_written=it.bytes_written * FP8_BYTES / BF16_BYTES,
                               output_bytes=it.output_bytes * FP8_BYTES / BF16_BYTES))
            continue
        base, role = _role(it.name)
        if role is None or it.kind != "gemm":
            out.append(it)
            continue
        m, n, k = it.shape
        gemm = _as_fp8(it)
        expert = base in EXPERT_GEMMS
        gsp = sp and not expert  # sequence parallelism as this GEMM's TE module runs it
        if role == "fwd":
            pre = []
            if base in ROW_PARALLEL or expert:
                x = m * k * it.batch
                pre.append(_memory(it, "to_fp8" if gsp else "to_fp8_t", BF16_BYTES * x,
                                   FP8_BYTES * x * (1 if gsp else 2)))
            if not it.recompute:
                w = k * n * it.batch / microbatches
                if fp8_params:  # the FP8 weight is the parameter: only its transpose is made
                    pre.append(_memory(it, "weight_transpose", FP8_BYTES * w, FP8_BYTES * w))
                else:
                    pre.append(_memory(it, "weight_to_fp8_t", BF16_BYTES * w, 2 * FP8_BYTES * w))
            _insert_before(out, pre)
            out.append(gemm)
        elif role == "dgrad":
            g = m * k * it.batch  # the output gradient, tokens x the forward GEMM's outputs
            if base in ROW_PARALLEL and gsp:  # the local shard cast before its all-gather; transposed once gathered
                _insert_before(out, [_memory(it, "to_fp8", BF16_BYTES * g / tp, FP8_BYTES * g / tp)])
                out += [gemm, _memory(it, "transpose", FP8_BYTES * g, FP8_BYTES * g)]
            else:
                _insert_before(out, [_memory(it, "to_fp8_t", BF16_BYTES * g, 2 * FP8_BYTES * g)])
                out.append(gemm)
        else:  # wgrad
            out.append(gemm)
            if base in NORM_FUSED or gsp:
                x = m * k * it.batch  # the saved FP8 input, inputs x tokens
                out.append(_memory(it, "transpose", FP8_BYTES * x, FP8_BYTES * x))
    return replace(work, items=tuple(out))

