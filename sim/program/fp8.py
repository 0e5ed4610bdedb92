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
no transpose of their own. The shared experts (``moe.shared.up`` and ``.down``) are TE
linears as well, run like the routed experts' (their input cast by their own module, no
sequence-parallel gather of their own), except that the up-projection keeps its BF16 input and
casts it again for its weight gradient (``SAVES_ORIGINAL_INPUT``). Multi-head latent attention's
five projections (``MLA_GEMMS``) run in FP8 too: the down-projections (and a query projection
without a low-rank query) cast their BF16 input, and the up-projections, ``LayerNormLinear``
modules that fuse the compressed query's and key/value's norms, take their input from that norm
as QKV does from its own. The router stays BF16 (a plain PyTorch linear).

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
(``sim.program.training``'s ``param_gather`` pass; ZeRO-3 / Megatron-FSDP's per-layer gathers
likewise, ``zero3_gather``), and a rank holds 1 byte of weight and 1 of transpose per such
parameter instead of the BF16 weight and the FP8 copy and transpose
(``sim.program.memory.rank``). The per-tensor scale is not gathered: TE's
``cast_master_weights_to_fp8`` (called by Megatron-Core's ``fp8_utils.quantize_param_shard``)
all-reduces each weight's amax over the data-parallel group, one FP32 per tensor, so every
rank computes the same scale (that small all-reduce is left out). Under ``mxfp8`` the
weights are MXFP8 tensors (``gathered_weight_bytes``): Megatron-Core cannot map their
row- and column-wise blocks into its contiguous parameter buffer, so the distributed
optimizer gathers them in BF16 through the gradient buffer
(``--reuse-grad-buf-for-mxfp8-param-ag``, which Megatron-Bridge's MXFP8 recipe sets;
``param_and_grad_buffer.py``: "The parameters are cast from bf16 to MXFP8 during copy")
and quantizes each into both MXFP8 copies once per step (``weight_quantize``, as without
FP8 weights); a rank then holds the two copies with their scales and no persistent BF16
weight (its gather lives in the gradient buffer), ``weight_copy_bytes`` − 2 more per
parameter than BF16 (``fp8_weight_copy_bytes``).

Recipes (``--fp8-recipe``, Megatron-LM's flag; TE 2.x's recipes, described in TE's
"Low precision training" pages, ``docs/features/low_precision_training/*.rst``, and taken
here from TE's code where a byte count depends on it). All of the above is ``delayed``
(``DelayedScaling``, the default): one FP32 scale per tensor from an amax history, which
the cast kernels record as they write and ``sim.program.amax`` reduces over the stage.
The others change the kernels around the same GEMMs (``sim.inputs.precision.RECIPES``, where
each recipe is one ``Recipe`` saying what this module asks of it):

- ``tensorwise`` (``Float8CurrentScaling``): one scale per tensor from the tensor's own
  amax. "Quantization is a memory-bound operation that requires reading the tensor twice"
  (TE's FP8 current scaling page): every cast of a BF16 tensor is preceded by an amax
  pass that reads it (``<gemm>.amax``, read 2G), except the norms' outputs, whose amax the
  norm kernel computes as it writes them in BF16 (``normalization.cpp``:
  ``FUSED_NORM_AMAX_FP8``), so QKV and MLP-up get a cast of their own (``to_fp8`` under
  sequence parallelism, ``to_fp8_t`` without). Tensors all-gathered under sequence
  parallelism (QKV and MLP-up inputs, the projection and MLP-down output gradients)
  all-reduce their amax over the tensor-parallel group before the cast
  (``<gemm>.amax.all_reduce``, one FP32: TE's ``amax_reduction_group``). No history: no
  stage-wide reductions (``sim.program.amax``). Transposes as in ``delayed``.
- ``mxfp8`` (``MXFP8BlockScaling``): an E8M0 scale (1 byte) per 32 consecutive elements
  (OCP Microscaling Formats spec v1.0; TE's MXFP8 page). Row- and column-wise blocks
  differ, so neither copy can be made from the other: every tensor is quantized from
  BF16 into both at once (``<gemm>.quantize``, read 2G, write 2·G·(1 + 1/32)), no FP8
  transposes, and the norms write BF16 (TE fuses the norm with MXFP8 quantization only
  through cuDNN, ``NVTE_NORM_FWD_USE_CUDNN``, off by default). Sequence-parallel
  all-gathers carry the quantized data with its scales: the forward input's row-wise copy
  (G·(1 + 1/32)), the output gradient's two copies, and in the backward the saved
  column-wise input. No amax reductions (each scale is local to its block). Its GEMMs
  run as block-scaled MMAs that read the scales (``Op.dtype`` "mxfp8"), natively only on
  a GPU whose profile has ``mx_block_scaling`` (Blackwell), at
  ``mxfp8_gemm_relative_efficiency`` of a per-tensor FP8 GEMM's speed.
- ``blockwise`` (``Float8BlockScaling``, DeepSeek-V3's scheme): an FP32 scale per 1x128
  elements of activations and gradients and per 128x128 of weights (TE's FP8 blockwise
  page). Kernels as ``mxfp8``'s (both copies quantized at once, G·(1 + 4/128) each;
  weights w·(1 + 4/16384) each). Its GEMMs (``Op.dtype`` "fp8_block") are software-
  emulated on Hopper (priced as FP8 GEMMs: no separate kernel figure) and run as MXFP8
  GEMMs on Blackwell ("the recipe is emulated with MXFP8").

- ``nvfp4`` (``--fp4-recipe nvfp4``, ``NVFP4BlockScaling``; ``sim.inputs.precision``'s doc has
  the format and its sources): E2M1 elements (1/2 byte) with an E4M3 scale per 16 (weights
  16x16) and an FP32 scale per tensor. Each BF16 tensor is read for its amax first
  (``<gemm>.amax``; the norms' outputs too, and all-reduced over the tensor-parallel group
  where the tensor is gathered, as under ``tensorwise``), then quantized row-wise
  (``<gemm>.quantize``, read 2G, write G·(1/2 + 1/16)) and column-wise through the random
  Hadamard transform (``<gemm>.hadamard_quantize``, read 2G again, write G·(1/2 + 1/16);
  TE's ``nvte_hadamard_transform_cast_fusion_columnwise``); weights get an amax pass and
  one kernel writing both copies. No transposes. Its GEMMs (``Op.dtype`` "nvfp4") run at the
  profile's fp4 peak (``HardwareProfile.gemm_efficiency(..., dtype="nvfp4")``). Every layer
  runs NVFP4: the BF16 layers of NVIDIA's recipe (Megatron-LM's ``--first-last-layers-bf16``)
  are not modelled, nor FP4 weights (``--fp4-param-gather``).

Scale swizzle (``mxfp8``): the tensor cores read block scales in a tiled, interleaved layout
(128 × 4 tiles), which Transformer Engine 2.7 and 2.9's quantize kernels do not write; each
GEMM call copies both operands' scales into it first (``<gemm>.swizzle``, one kernel per
operand reading and writing 1/32 of its elements in bytes: ``_swizzle``), the weights' on
every micro-batch too.

Not modelled: userbuffers' atomic GEMMs, FP8 attention, FP8 weights
(``fp8_param_gather``) under ``blockwise``, MXFP8 weights under ZeRO-3 (Megatron-FSDP turns
``reuse_grad_buf_for_mxfp8_param_ag`` off and gathers them otherwise), the other block-scaled
recipes' scale handling before their GEMMs (NVFP4's swizzle, blockwise's conversion to MXFP8
scales on Blackwell).

Blackwell (``any_layout``: the profile's ``fp8_gemm_any_layout``) under Transformer Engine 2.0 or
later (``Precision.makes_fp8_transposes``; the release and its sources are
``sim.inputs.precision``'s ``NON_TN_FP8_SINCE``): a per-tensor FP8 tensor is one row-wise copy,
which each GEMM reads in whichever layout it needs, so no FP8 transpose is made. Every cast above
writes the one copy (``to_fp8``, read 2G write G, where Hopper's ``to_fp8_t`` writes 2G; a
grouped GEMM's splits then cast one by one, TE's fused ``nvte_multi_cast_transpose`` wanting both
copies), the weights are cast into one copy (``weight_to_fp8``, read 2 write 1 byte per
parameter) or, kept in FP8 (``fp8_params``), used as they are, and the transposes of gathered
inputs and output gradients (``<gemm>.wgrad.transpose``, ``<gemm>.dgrad.transpose``) and of the
norms' FP8 outputs are not run; a rank holds one FP8 copy of each such weight, 1 byte a
parameter (``weight_copy_bytes``; with FP8 weights, the FP8 weight alone). Hopper, and TE 1.x
on any GPU, run the path above.
"""

from __future__ import annotations

from dataclasses import replace

from sim.errors import require
from sim.inputs.precision import AMAX_BYTES, BF16_BYTES, FP8_BYTES, Precision, Recipe
from sim.program.ops import Comm

MLA_GEMMS = ("attn.q", "attn.q_down", "attn.kv_down", "attn.q_up", "attn.kv_up")
"""Multi-head latent attention's projections (``sim.inputs.moe.mla_projections``), each a
Transformer Engine linear in Megatron-Core's MLA spec (``get_gpt_layer_with_transformer_engine_spec``,
megatron/core/models/gpt/gpt_layer_specs.py at Megatron-LM cba6b0ed: the down-projections
``backend.linear()`` = ``TELinear``, the up-projections ``TELayerNormColumnParallelLinear`` with
the query and key/value norms fused in, ``linear_q_proj`` ``TEColumnParallelLinear``), so FP8
under ``fp8_autocast`` (module doc)."""
SHARED_GEMMS = ("moe.shared.up", "moe.shared.down")
"""The shared experts' two linears (Megatron-Core's ``SharedExpertMLP``, an ``MLP`` of
``TEColumnParallelLinear`` and ``TERowParallelLinear``: ``get_moe_module_spec``,
megatron/core/models/gpt/moe_module_specs.py): FP8 too (module doc)."""
SP_GEMMS = ("attn.qkv", "attn.proj", "mlp.up", "mlp.down")
"""The dense layer's four GEMMs, whose TE modules gather their input or reduce-scatter their output
under sequence parallelism (the others' collectives, where they have any, stay BF16 and apart)."""
FP8_GEMMS = SP_GEMMS + MLA_GEMMS + SHARED_GEMMS
"""The forward GEMMs a transformer layer runs in FP8 (the weight GEMMs of TE's linear modules)."""
NORM_FUSED = {"attn.qkv": "attn.norm", "mlp.up": "mlp.norm",
              "attn.q_up": "attn.q_down.norm", "attn.kv_up": "attn.kv_down.norm"}
"""LayerNormLinear GEMMs and the norm that writes their FP8 input."""
ROW_PARALLEL = ("attn.proj", "mlp.down")
EXPERT_GEMMS = ("moe.experts.up", "moe.experts.down")
"""The routed experts' GEMMs (module doc): FP8, inputs cast and transposed as a row-parallel
GEMM's without sequence parallelism."""
CAST_INPUT = ROW_PARALLEL + EXPERT_GEMMS + ("attn.q", "attn.q_down", "attn.kv_down") + SHARED_GEMMS
"""GEMMs whose BF16 input their own TE module casts (no norm writes it quantized)."""
SAVES_ORIGINAL_INPUT = ("moe.shared.up",)
"""GEMMs whose module keeps its BF16 input for the weight gradient and quantizes it again there
(TE's ``save_original_input``): Megatron-Core's ``SharedExpertMLP`` sets it on ``linear_fc1``
under FP8 with Transformer Engine 2.6 or later, unless the shared experts are recomputed
(megatron/core/transformer/moe/shared_experts.py at cba6b0ed: ``set_save_original_input``), so
the forward casts the copy it multiplies and the weight gradient casts the other from BF16."""
FP8_GATHERS = {"attn.all_gather": "attn.qkv", "mlp.all_gather": "mlp.up",
               "attn.all_gather.grad": "attn.proj", "mlp.all_gather.grad": "mlp.down",
               "attn.qkv.all_gather.input": "attn.qkv", "mlp.up.all_gather.input": "mlp.up"}
"""Sequence-parallel all-gathers that carry FP8, and the GEMM each feeds."""
GRAD_GATHERS = ("attn.all_gather.grad", "mlp.all_gather.grad")
"""The output-gradient gathers: under the block-scaled recipes they carry both copies."""
GEMM_KERNELS = {"fp8": ("fp8", "fp8"), "mxfp8": ("fp8", "mxfp8"), "nvfp4": ("fp4", "nvfp4")}
"""``Op.dtype`` of a low-precision GEMM -> (the profile's peak it runs at, its kernel for
``HardwareProfile.gemm_efficiency``)."""


def weight_copy_bytes(recipe: Recipe, transposes: bool = True) -> float:
    """Bytes per GEMM weight parameter of TE's quantized weight copies under ``recipe``: the
    copy for the forward and the one for the input gradient (the transpose, or the
    column-wise copy), each with its block scales: 2 per-tensor, 2·(1 + 1/32) under
    MXFP8, 2·(1 + 4/16384) under 128x128 blocks, 2·(1/2 + 1/256) under NVFP4. A per-tensor
    weight without its transpose (``transposes`` False: ``Precision.makes_fp8_transposes``,
    Blackwell under TE 2.0 or later) is the one copy: 1."""
    copies = 2 if transposes or recipe.both_copies else 1
    return copies * recipe.copy_bytes(weight=True)


def gathered_weight_bytes(recipe: Recipe) -> float:
    """Bytes per FP8 GEMM weight parameter that a parameter all-gather moves when the
    weights are kept in FP8 (``fp8_params``, module doc): ``Recipe.gathered_weight_bytes``,
    1 under the per-tensor recipes (the scale is not gathered: each rank computes it from
    the amax all-reduced over the data-parallel group); 2 under ``mxfp8``, gathered in BF16
    through the gradient buffer and quantized after (Megatron-Core's
    ``reuse_grad_buf_for_mxfp8_param_ag``)."""
    require(recipe.gathered_weight_bytes is not None, "fp8_recipe", recipe.name,
            "FP8 weights are modelled with delayed, tensorwise or mxfp8")
    return recipe.gathered_weight_bytes


def saved_input_bytes(recipe: Recipe) -> float:
    """Bytes per element of the quantized copy of a GEMM input saved for the weight gradient
    (the column-wise copy with its scales under the block-scaled recipes)."""
    return recipe.copy_bytes()


def gemm_kernel(dtype: str, profile) -> tuple[str, str]:
    """(peak, kernel) a low-precision ``Op.dtype`` runs at on ``profile``: the profile's peak
    to price it with and its kernel for ``HardwareProfile.gemm_efficiency``. Blockwise GEMMs
    are emulated with MXFP8 where the tensor cores read block scales (TE's FP8 blockwise
    page), and priced as per-tensor FP8 GEMMs elsewhere."""
    if dtype == "fp8_block":
        return "fp8", "mxfp8" if profile.mx_block_scaling else "fp8"
    return GEMM_KERNELS[dtype]


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
                   framework=False, streams=0)


def _amax_all_reduce(op):
    """Current scaling: the amax of a tensor about to be all-gathered, all-reduced over the
    tensor-parallel group before its cast (one FP32)."""
    return Comm(name=f"{op.name}.amax.all_reduce", phase=op.phase, collective="all_reduce",
                nbytes=float(AMAX_BYTES), recompute=op.recompute)


def _as_low(op, recipe: Recipe):
    """The GEMM with quantized operands (``recipe.element_bytes`` each) and its BF16 output."""
    m, n, k = op.shape
    return replace(op, dtype=recipe.gemm_dtype, bytes_read=float(recipe.element_bytes * (m * k + k * n) * op.batch))


SWIZZLE_TENSORS_PER_KERNEL = 64
"""Tensors one multi-tensor swizzle kernel takes (``kMaxTensorsPerKernel`` in Transformer
Engine's transformer_engine/common/swizzle/swizzle.cu, 2.7 and 2.9: "Args must be <4 KB")."""


def _swizzle(op, gemm, recipe: Recipe) -> list:
    """The block scales of both operands of the low-precision GEMM ``gemm`` (shape m × n × k,
    ``batch`` of them; operands m × k and k × n) copied into the tensor cores' layout before it
    runs, under a recipe with ``swizzled_scales`` (``Recipe.swizzled_scales``): one memory-bound
    kernel per operand, reading its scales and writing them swizzled, (m·k + k·n) · batch ·
    scale_bytes / block bytes each way. A grouped GEMM (``batch`` local experts) swizzles each
    operand's splits in one multi-tensor kernel per ``SWIZZLE_TENSORS_PER_KERNEL``
    (``multi_tensor_swizzle_scaling_factors``); a single GEMM one kernel per operand
    (``swizzle_scaling_factors``). Recomputed GEMMs swizzle again (every GEMM call does)."""
    if not recipe.swizzled_scales:
        return []
    m, n, k = gemm.shape
    scales = (m * k + k * n) * gemm.batch * recipe.scale_bytes / recipe.block
    kernels = 2 * -(-gemm.batch // SWIZZLE_TENSORS_PER_KERNEL)
    return [replace(_memory(op, "swizzle", scales, scales), kernels=kernels)]


def _insert_before(out: list, items: list) -> None:
    """Put ``items`` at the end of ``out``, ahead of an all-gather that ends it (so the
    gather stays next to the GEMM that follows)."""
    at = len(out)
    if out and getattr(out[-1], "collective", None) == "all_gather":
        at -= 1
    out[at:at] = items


def _gather_bytes(name: str, recipe: Recipe) -> float:
    """Bytes per element a quantized all-gather carries: 1 under the per-tensor recipes; the
    block-scaled ones carry each copy with its scales, both copies for an output gradient."""
    if not recipe.both_copies:
        return FP8_BYTES
    return (2 if name in GRAD_GATHERS else 1) * recipe.copy_bytes()


def _cast(it, suffix: str, recipe: Recipe, read: float, elements: float, gathered: bool = False,
          amax_known: bool = False, usage: str = "both") -> list:
    """The kernels that make the quantized operand(s) of ``elements`` BF16 elements (``read``
    = 2·elements bytes) under ``recipe``: ``suffix`` is the per-tensor kernel ('to_fp8' one
    copy, 'to_fp8_t' with its transpose); block-scaled recipes quantize both copies instead
    (NVFP4: the column-wise one through the Hadamard transform, a kernel that reads the
    tensor again); recipes with a per-tensor scale from the tensor's own amax read it for
    that first (unless the kernel that wrote it computed it: ``amax_known``), and all-reduce
    it over the tensor-parallel group when the tensor is ``gathered``. ``usage`` 'row' or
    'column': one copy only, the forward's or the weight gradient's (a quantizer with one
    usage, ``SAVES_ORIGINAL_INPUT``; per-tensor, ``suffix`` then names a one-copy kernel)."""
    if recipe.both_copies and usage != "both":
        column = usage == "column" and recipe.hadamard_wgrad
        out = [_memory(it, "hadamard_quantize" if column else "quantize", read, recipe.copy_bytes() * elements)]
    elif recipe.both_copies:
        copy = recipe.copy_bytes() * elements
        if recipe.hadamard_wgrad:
            out = [_memory(it, "quantize", read, copy), _memory(it, "hadamard_quantize", read, copy)]
        else:
            out = [_memory(it, "quantize", read, 2 * copy)]
    else:
        copies = 2 if suffix.endswith("_t") else 1
        out = [_memory(it, suffix, read, copies * FP8_BYTES * elements)]
        if it.name.split(".")[:2] == ["moe", "experts"]:
            out[0] = replace(out[0], kernels=_expert_cast_kernels(it.kernels, suffix, recipe))
    if recipe.amax_pass:
        amax_known = amax_known and recipe.norm_amax
        amax = replace(_memory(it, "amax", read, 0.0), kernels=recipe.amax_kernels * it.kernels)  # per split
        out[:0] = ([] if amax_known else [amax]) + ([_amax_all_reduce(it)] if gathered else [])
    return out


def _expert_cast_kernels(experts: int, suffix: str, recipe: Recipe) -> int:
    """Kernels of the cast of a grouped GEMM's operand split over ``experts`` local experts
    (Transformer Engine's ``GroupedLinear``: ``tex.split_quantize`` -> ``multi_tensor_quantize_impl``,
    transformer_engine/pytorch/csrc/extensions/cast.cpp): delayed scaling with both copies runs
    one fused kernel for all (``nvte_multi_cast_transpose``, "only have fused kernel for FP8
    delayed scaling"); every other recipe quantizes each expert's split on its own, and
    current scaling's ``Float8CurrentScalingQuantizer::quantize`` (csrc/quantizer.cpp) runs
    ``nvte_compute_amax``, ``nvte_compute_scale_from_amax`` and ``nvte_quantize_v2`` per split:
    the amax pass (``<gemm>.amax``: per expert, as the GEMM op carries, the amax zeroed and
    the amax kernel, ``Recipe.amax_kernels``) and here the scale and the cast, two per expert. Block-scaled recipes: one kernel per expert."""
    if recipe.history:
        return 1 if suffix.endswith("_t") else experts
    return 2 * experts if recipe.amax_pass else experts


def fp8_layer_work(work, precision: Precision | None, tp: int = 1, sequence_parallel: bool = False,
                   microbatches: int = 1, fp8_params: bool = False, any_layout: bool = False):
    """One transformer layer's ``Work`` as TE runs it under ``precision`` (the module doc);
    ``work`` itself when it is None (BF16). ``sequence_parallel``: in effect (tp > 1);
    ``microbatches``: the m that share each step's weight casts; ``fp8_params``: the
    weights are kept in FP8 (``--fp8-param-gather``), so each step only transposes them
    (MXFP8 weights: gathered in BF16 and quantized into both copies, as without them);
    ``any_layout``: the GPU's FP8 GEMMs take any operand layout (``HardwareProfile.fp8_gemm_any_layout``),
    so that a per-tensor recipe under TE 2.0 or later makes no FP8 transposes (module doc)."""
    if precision is None:
        return work
    require(isinstance(microbatches, int) and microbatches > 0, "microbatches", microbatches,
            "expected an integer > 0")
    r = precision.recipe
    tr = precision.makes_fp8_transposes(any_layout)  # per-tensor copies cast with their transposes
    cast_t = "to_fp8_t" if tr else "to_fp8"  # a cast whose copy the weight gradient reads too
    sp = sequence_parallel and tp > 1
    norms = set(NORM_FUSED.values())
    out: list = []
    for it in work.items:
        if not hasattr(it, "kind"):  # a tensor-parallel collective
            if it.name in FP8_GATHERS and it.collective == "all_gather":
                it = replace(it, nbytes=it.nbytes * _gather_bytes(it.name, r) / BF16_BYTES)
            out.append(it)
            continue
        if it.name in norms and r.history:  # the norm writes the FP8 input of the GEMM after it
            out.append(replace(it, bytes_written=it.bytes_written * FP8_BYTES / BF16_BYTES,
                               output_bytes=it.output_bytes * FP8_BYTES / BF16_BYTES))
            continue
        base, role = _role(it.name)
        if role is None or it.kind != "gemm":
            out.append(it)
            continue
        m, n, k = it.shape
        gemm = _as_low(it, r)
        gsp = sp and base in SP_GEMMS  # sequence parallelism as this GEMM's TE module runs it
        if role == "fwd":
            pre = []
            x = m * k * it.batch
            if base in SAVES_ORIGINAL_INPUT:  # the forward's copy only; the weight gradient casts the other
                pre += _cast(it, "to_fp8", r, BF16_BYTES * x, x, usage="row")
            elif base in CAST_INPUT:
                pre += _cast(it, "to_fp8" if gsp else cast_t, r, BF16_BYTES * x, x)
            elif not r.history:  # the norm wrote BF16: the local shard is cast
                local = x / tp if gsp else x
                pre += _cast(it, "to_fp8" if gsp else cast_t, r, BF16_BYTES * local, local, gathered=gsp,
                             amax_known=True)
            if not it.recompute:
                w = k * n * it.batch / microbatches
                # each step's weight casts run in its first micro-batch (TE caches them: is_first_microbatch),
                # a grouped GEMM's one kernel per expert weight: per micro-batch, ceil(kernels / microbatches)
                wt = replace(it, kernels=-(-it.kernels // microbatches))
                if fp8_params and not r.both_copies:  # the FP8 weight is the parameter: only its transpose is made
                    if tr:
                        pre.append(_memory(wt, "weight_transpose", FP8_BYTES * w, FP8_BYTES * w))
                else:
                    if r.amax_pass:
                        pre.append(_memory(wt, "weight_amax", BF16_BYTES * w, 0.0))
                    if r.both_copies:
                        pre.append(_memory(wt, "weight_quantize", BF16_BYTES * w, 2 * r.copy_bytes(weight=True) * w))
                    else:
                        copies = 2 if tr else 1
                        pre.append(_memory(wt, f"weight_{cast_t}", BF16_BYTES * w, copies * FP8_BYTES * w))
            _insert_before(out, pre + _swizzle(it, gemm, r))
            out.append(gemm)
        elif role == "dgrad":
            g = m * k * it.batch  # the output gradient, tokens x the forward GEMM's outputs
            if base in ROW_PARALLEL and gsp:  # the local shard cast before its all-gather; transposed once gathered
                _insert_before(out, _cast(it, "to_fp8", r, BF16_BYTES * g / tp, g / tp, gathered=True)
                               + _swizzle(it, gemm, r))
                out.append(gemm)
                if tr:
                    out.append(_memory(it, "transpose", FP8_BYTES * g, FP8_BYTES * g))
            else:
                _insert_before(out, _cast(it, cast_t, r, BF16_BYTES * g, g) + _swizzle(it, gemm, r))
                out.append(gemm)
        else:  # wgrad
            if base in SAVES_ORIGINAL_INPUT:  # its saved BF16 input, inputs x tokens, cast for this GEMM
                x = m * k * it.batch
                _insert_before(out, _cast(it, "to_fp8", r, BF16_BYTES * x, x, usage="column"))
            _insert_before(out, _swizzle(it, gemm, r))
            out.append(gemm)
            if tr and ((base in NORM_FUSED and r.history) or gsp):
                x = m * k * it.batch  # the saved FP8 input, inputs x tokens
                out.append(_memory(it, "transpose", FP8_BYTES * x, FP8_BYTES * x))
    return replace(work, items=tuple(out))
