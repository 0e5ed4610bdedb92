"""The precision of the layers' GEMMs as one object: a format and a recipe, found by name.

A run trains its transformer layers' GEMMs in BF16 (``ParallelPlan.precision`` is None), in
FP8 (``--fp8-format`` e4m3 or hybrid, scaled by ``--fp8-recipe``) or in NVFP4
(``--fp4-recipe nvfp4``, or Megatron-LM's ``--fp4-format e2m1``, whose default recipe that is).
Each recipe is a ``Recipe`` in ``RECIPES`` with what the rest of the code asks of it: the
bytes of an element and of its block scales, the ``Op.dtype`` of its GEMMs and the GPU
feature they need, which kernels make the quantized copies (``sim.program.fp8`` builds them),
whether it keeps an amax history, and how FP8 weights are gathered. This module is the only
place that reads the plan's precision fields by value; everything else asks
``plan.precision``.

Names: Megatron-LM's ``--fp8-recipe`` choices (``megatron/training/arguments.py``: delayed,
tensorwise, mxfp8, blockwise; TE's DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling,
Float8BlockScaling). ``current-scaling`` is an alias of ``tensorwise``: Transformer Engine
calls that recipe "FP8 current scaling" (``Float8CurrentScaling``, its docs page "FP8 Current
Scaling") and Megatron-Bridge's mixed-precision recipe ``bf16_with_fp8_current_scaling_mixed``
sets ``fp8_recipe = "tensorwise"``; Megatron-LM itself has no such choice, so the plan keeps
the canonical name.

NVFP4 (``nvfp4``: Transformer Engine's ``NVFP4BlockScaling``, TE's "NVFP4" page; NVIDIA,
"Pretraining Large Language Models with NVFP4", arXiv 2509.25149): E2M1 elements (half a
byte), one E4M3 scale per 16 consecutive elements and one FP32 scale per tensor (from the
tensor's amax, an extra read: TE's ``NVFP4Quantizer`` runs ``nvte_hadamard_transform_amax``
or ``nvte_compute_amax`` before quantizing); weights in 16x16 blocks (``fp4_2d_quantization``);
a 16-point random Hadamard transform on the weight gradient's operands (the column-wise
copies of the input and of the output gradient, ``nvte_hadamard_transform_cast_fusion_columnwise``,
a kernel of its own); stochastic rounding of gradients (inside the quantize kernel: no bytes).
Its fprop, dgrad and wgrad GEMMs all run in FP4 (TE's recipe quantizes all three GEMMs'
operands), at the profile's ``fp4`` peak.

The Transformer Engine release (``transformer_engine``, a plan setting: "2.9", "1.14.0"; default
``CURRENT_TE``, the newest release) decides two things. Whether the recipe exists in it (each
``Recipe.since``: TE's ``transformer_engine/common/recipe/__init__.py`` first defines
``MXFP8BlockScaling`` in 2.0, ``Float8CurrentScaling`` in 2.2, ``Float8BlockScaling`` in 2.3 and
``NVFP4BlockScaling`` in 2.8; ``DelayedScaling`` is older than every release trainsim models). And
whether a per-tensor recipe makes transposed FP8 copies on a GPU whose FP8 GEMMs take any operand
layout (``HardwareProfile.fp8_gemm_any_layout``: Blackwell): from TE 2.0 (``NON_TN_FP8_SINCE``) it
does not (``Precision.makes_fp8_transposes``; the kernels are ``sim.program.fp8``'s).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.errors import InputError, require

BF16_BYTES = 2
FP8_BYTES = 1
FP4_BYTES = 0.5
"""An E2M1 element: 4 bits."""
AMAX_BYTES = 4
"""An amax or a per-tensor scale is one FP32."""

FP8_FORMATS = ("e4m3", "hybrid")
"""Transformer Engine's FP8 formats (Megatron-LM ``--fp8-format``): all tensors E4M3, or E4M3
forward and E5M2 gradients; they cost the same."""
FP4_FORMAT = "e2m1"
"""Megatron-LM's ``--fp4-format`` (its only choice)."""
MX_BLOCK = 32
"""MXFP8: elements per E8M0 scale (OCP Microscaling Formats (MX) v1.0, Table 1: MXFP8 k = 32)."""
FP8_BLOCK = 128
"""Blockwise: elements per FP32 scale along a row (1x128); weights 128x128 (TE's Float8BlockScaling)."""
NVFP4_BLOCK = 16
"""NVFP4: elements per E4M3 scale (TE's NVFP4 page; arXiv 2509.25149 §2); weights 16x16."""
CURRENT_TE = "2.18"
"""The Transformer Engine release a plan runs when it names none (``transformer_engine``): the
newest release, NVIDIA/TransformerEngine's tag v2.18. Only ``NON_TN_FP8_SINCE`` and the recipes'
``since`` tell releases apart here, so any release from 2.8 on runs the same."""
NON_TN_FP8_SINCE = (2, 0)
"""The first Transformer Engine release whose per-tensor FP8 tensors hold no transposed copy on a
GPU whose FP8 GEMMs take any layout. TE 2.0 (transformer_engine/pytorch/utils.py
``non_tn_fp8_gemm_supported``: compute capability >= 10.0) allocates a ``Float8Quantizer``'s
column-wise data only where the GEMMs need TN operands (csrc/extensions/quantizer.cpp:
``create_transpose = columnwise_usage && !non_tn_fp8_gemm_supported()``), never makes the
transpose on demand there (tensor/float8_tensor.py ``update_usage``), and its GEMM reads the
row-wise data with the layout flag flipped (common/gemm/cublaslt_gemm.cu: only ``arch < 100``
swaps in the column-wise data). From 2.3 the check is the C API's
``nvte_is_non_tn_fp8_gemm_supported()`` (common/transformer_engine.cpp: SM 10.x and >= 13.0),
and ``Float8CurrentScalingQuantizer`` follows it as ``Float8Quantizer`` does (2.7's and 2.9's
csrc/quantizer.cpp: ``with_transpose = columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported()``).
TE 1.x (1.13, 1.14) has no such check: every FP8 copy is cast and transposed as on Hopper."""


@dataclass(frozen=True)
class Recipe:
    """How a recipe quantizes the GEMMs' operands, as the kernels around them see it
    (``sim.program.fp8``'s module doc has the kernels)."""

    name: str
    block: int
    """Consecutive elements of an activation or gradient sharing one scale; 0: one per tensor."""
    weight_block: int
    """Elements of a weight sharing one scale; 0: one per tensor."""
    scale_bytes: int
    """Bytes of one block scale (E8M0 or E4M3: 1; FP32: 4)."""
    gemm_dtype: str
    """``Op.dtype`` of its GEMMs."""
    element_bytes: float = FP8_BYTES
    """Bytes of one quantized element (FP8 1, FP4 0.5)."""
    flag: str = "--fp8-recipe"
    """The flag that chooses it (Megatron-LM's): ``--fp8-recipe`` (with ``--fp8-format``) or ``--fp4-recipe``."""
    needs: str = "fp8"
    """What the GPU's profile must have: 'fp8' (an fp8 peak), 'mx' (``mx_block_scaling``) or
    'fp4' (an fp4 peak)."""
    history: bool = False
    """Delayed scaling's amax history, reduced over the stage (``sim.program.amax``); the
    norms then write the FP8 input of the GEMM after them."""
    amax_pass: bool = False
    """Each cast of a BF16 tensor reads it once more for its per-tensor amax first."""
    amax_kernels: int = 1
    """GPU operations of one amax pass over one tensor (one expert's split of a grouped GEMM's
    operand): per-tensor current scaling's ``nvte_compute_amax`` (Transformer Engine,
    transformer_engine/common/recipe/current_scaling.cu, ``launch_amax_kernel``) first zeroes
    the FP32 amax it then updates with atomic maxima ("Zero out amax so we can update with
    atomic max": ``cudaMemsetAsync(amax, 0, sizeof(float), stream)`` in TE 2.x, a
    ``zero_amax_kernel<<<1, 1>>>`` in later releases), then runs ``amax_kernel``: two, each
    paying the profile's fixed per-kernel cost. NVFP4 computes its amax otherwise
    (``nvte_hadamard_transform_amax`` with the random Hadamard transform): one, not checked."""
    norm_amax: bool = False
    """The norm kernel computes its output's amax as it writes it (no amax pass for the
    LayerNormLinear GEMMs' inputs: TE's ``FUSED_NORM_AMAX_FP8``)."""
    both_copies: bool = False
    """Row- and column-wise copies quantized from BF16 (no FP8 transposes)."""
    hadamard_wgrad: bool = False
    """The column-wise copies of inputs and output gradients (the weight gradient's operands)
    go through a random Hadamard transform, fused in a quantize kernel of their own."""
    gathered_weight_bytes: float | None = None
    """Bytes per parameter a parameter all-gather moves with FP8 weights
    (``--fp8-param-gather``); None: FP8 weights not modelled with this recipe."""
    zero3_weights: bool = True
    """FP8 weights modelled under ZeRO-3 (Megatron-FSDP)."""
    offload_weights: bool = False
    """FP8 weights allowed with the optimizer's CPU offload."""
    since: tuple = (0,)
    """The first Transformer Engine release that has the recipe (the module doc)."""
    swizzled_scales: bool = False
    """Before each of its GEMMs, both operands' block scales are copied into the layout the
    block-scaled tensor cores read (``sim.program.fp8``'s ``swizzle``): Transformer Engine
    2.7 and 2.9 (Megatron-Bridge 25.09's and 25.11's) quantize MXFP8 scales in plain row-major
    order and swizzle them inside every GEMM call (``swizzle_scaling_factors`` in
    ``te_general_gemm``, ``multi_tensor_swizzle_scaling_factors`` in ``te_general_grouped_gemm``,
    transformer_engine/pytorch/csrc/extensions/gemm.cpp and csrc/util.cpp)."""

    def copy_bytes(self, weight: bool = False) -> float:
        """Bytes per element of one quantized copy with its block scales: element + scale/block."""
        block = self.weight_block if weight else self.block
        return self.element_bytes + self.scale_bytes / block if block else self.element_bytes


RECIPES = {
    "delayed": Recipe("delayed", 0, 0, AMAX_BYTES, "fp8", history=True, gathered_weight_bytes=FP8_BYTES,
                      offload_weights=True),
    "tensorwise": Recipe("tensorwise", 0, 0, AMAX_BYTES, "fp8", amax_pass=True, amax_kernels=2, norm_amax=True,
                         gathered_weight_bytes=FP8_BYTES, since=(2, 2)),
    # MXFP8 weights are gathered in BF16 through the gradient buffer (sim.program.fp8's doc)
    "mxfp8": Recipe("mxfp8", MX_BLOCK, MX_BLOCK, 1, "mxfp8", needs="mx", both_copies=True,
                    gathered_weight_bytes=BF16_BYTES, zero3_weights=False, swizzled_scales=True, since=(2, 0)),
    "blockwise": Recipe("blockwise", FP8_BLOCK, FP8_BLOCK * FP8_BLOCK, AMAX_BYTES, "fp8_block", both_copies=True,
                        since=(2, 3)),
    "nvfp4": Recipe("nvfp4", NVFP4_BLOCK, NVFP4_BLOCK * NVFP4_BLOCK, 1, "nvfp4", element_bytes=FP4_BYTES,
                    needs="fp4", flag="--fp4-recipe", amax_pass=True, both_copies=True, hadamard_wgrad=True,
                    since=(2, 8)),
}
"""Every recipe by name (FP8's and FP4's)."""
FP8_RECIPES = tuple(n for n, r in RECIPES.items() if r.flag == "--fp8-recipe")
"""``--fp8-recipe``'s recipes (Megatron-LM's choices, less 'custom')."""
FP4_RECIPES = tuple(n for n, r in RECIPES.items() if r.flag == "--fp4-recipe")
"""``--fp4-recipe``'s (Megatron-LM's choices)."""
ALIASES = {"current-scaling": "tensorwise"}
"""Other names of a recipe (module doc)."""
FP8_RECIPE_CHOICES = FP8_RECIPES + tuple(ALIASES)


@dataclass(frozen=True)
class Precision:
    """The GEMMs' low precision: a format and a recipe (hashable: caches key on it)."""

    format: str
    recipe: Recipe
    given: tuple = field(default=(), compare=False)
    """(flag, value) the user chose it with, for messages (not compared: the same precision either way)."""
    transformer_engine: tuple = field(default=None)
    """The Transformer Engine release that runs it, as numbers ((2, 9)); None: ``CURRENT_TE``."""

    def __post_init__(self):
        if self.transformer_engine is None:
            object.__setattr__(self, "transformer_engine", te_version(CURRENT_TE))

    def makes_fp8_transposes(self, any_layout: bool) -> bool:
        """Whether Transformer Engine makes transposed FP8 copies of the GEMMs' operands (casts
        that write two copies, transposes of gathered tensors and of weights) on a GPU whose
        FP8 GEMMs take any operand layout (``any_layout``: ``HardwareProfile.fp8_gemm_any_layout``)
        or only TN ones: a per-tensor recipe does unless the GPU takes any layout and the release
        is ``NON_TN_FP8_SINCE`` or later (module doc); the block-scaled recipes make no transposes
        (their column-wise copies are quantized from BF16: ``Recipe.both_copies``)."""
        if self.recipe.both_copies:
            return False
        return not (any_layout and self.transformer_engine >= NON_TN_FP8_SINCE)

    @property
    def label(self) -> str:
        """As reported: 'fp8-e4m3', 'fp8-hybrid' (delayed scaling), 'fp8-e4m3-mxfp8', 'nvfp4'."""
        if self.recipe.flag == "--fp4-recipe":
            return self.recipe.name
        return f"fp8-{self.format}" if self.recipe.history else f"fp8-{self.format}-{self.recipe.name}"


def label(precision: Precision | None) -> str:
    """'bf16' without low precision, else ``Precision.label``."""
    return "bf16" if precision is None else precision.label


_TE_FORM = ("a release number such as 2.9 or 1.14.0 (MAJOR.MINOR[.PATCH], a 'v' before it and a '+local' part "
            "after it allowed)")


def te_version(text) -> tuple:
    """A Transformer Engine release as numbers: '2.9' -> (2, 9), 'v1.14.0+87fbe81' -> (1, 14, 0)
    (a tag's 'v' and a build's '+local' part dropped); anything else is an ``InputError``
    naming ``transformer_engine`` (a number is refused: written as one, 2.10 reads 2.1)."""
    parts = None
    if isinstance(text, str):
        core = text.strip()
        core = core[1:] if core[:1] in ("v", "V") else core
        core = core.split("+", 1)[0]
        pieces = core.split(".")
        if 2 <= len(pieces) <= 3 and all(p.isdigit() and p.isascii() for p in pieces):
            parts = tuple(int(p) for p in pieces)
    if parts is None:
        raise InputError(field="plan: transformer_engine", value=text, setting="transformer_engine",
                         allowed=f"expected {_TE_FORM}" + ("" if isinstance(text, str) else
                                                          ", as a string (a number reads 2.10 as 2.1)"))
    return parts


class _TeVersion:
    """The ``transformer_engine`` setting's type: the flag's text as is; ``allowed(value)`` what a
    value from a file or the API is refused for (None when allowed)."""

    def __call__(self, text: str) -> str:
        return text

    def allowed(self, value) -> str | None:
        try:
            te_version(value)
        except InputError as exc:
            return exc.allowed
        return None


TE_VERSION = _TeVersion()


def precision_of(plan) -> Precision | None:
    """The plan's precision from its fields (``ParallelPlan.precision``); None: BF16."""
    te = te_version(plan.transformer_engine or CURRENT_TE)
    if plan.fp4_recipe is not None:
        return Precision(FP4_FORMAT, RECIPES[plan.fp4_recipe], ("--fp4-recipe", plan.fp4_recipe), te)
    if plan.fp4_format is not None:
        return Precision(FP4_FORMAT, RECIPES[FP4_RECIPES[0]], ("--fp4-format", plan.fp4_format), te)
    if plan.fp8_format is None:
        return None
    return Precision(plan.fp8_format, RECIPES[ALIASES.get(plan.fp8_recipe, plan.fp8_recipe)], transformer_engine=te)


def fp8_precision(fp8_format: str | None, recipe: str = "delayed") -> Precision | None:
    """FP8 in ``fp8_format`` under ``recipe`` (None: BF16), for a setting outside a plan (a search's formats)."""
    return None if fp8_format is None else Precision(fp8_format, RECIPES[canonical_fp8_recipe(recipe)])


def canonical_fp8_recipe(name: str) -> str:
    """The recipe an alias stands for (``ALIASES``); any other name unchanged."""
    return ALIASES.get(name, name)


def check_precision_plan(plan) -> None:
    """The precision fields on their own and with the other plan fields (``ParallelPlan.__post_init__``)."""
    def check(cond, field, value, allowed):
        require(cond, f"plan: {field}", value, allowed, setting=field)

    # (each field's choices are its declaration's: ``sim.inputs.plan._check_fields``)
    check(plan.fp4_format is None or plan.fp8_format is None, "fp4_format", plan.fp4_format,
          f"not with fp8_format {plan.fp8_format}: the GEMMs run in FP8 or in FP4 (Megatron-LM: '--fp4-format and "
          "--fp8-format cannot be used simultaneously'); leave one unset")
    check(plan.fp4_recipe is None or plan.fp8_format is None, "fp4_recipe", plan.fp4_recipe,
          f"not with fp8_format {plan.fp8_format}: the GEMMs run in FP8 or in FP4 (Megatron-LM: '--fp4-format and "
          "--fp8-format cannot be used simultaneously'); leave one unset")
    check(plan.fp8_recipe == "delayed" or plan.fp8_format is not None, "fp8_recipe", plan.fp8_recipe,
          "needs fp8_format (e4m3 or hybrid): a recipe scales FP8 tensors; leave it unset in BF16")
    recipe = RECIPES[canonical_fp8_recipe(plan.fp8_recipe)]
    low = (RECIPES[plan.fp4_recipe or FP4_RECIPES[0]] if plan.fp4_recipe or plan.fp4_format
           else recipe if plan.fp8_format else None)
    te_text = plan.transformer_engine or CURRENT_TE
    if low is not None and te_version(te_text) < low.since:
        since = ".".join(map(str, low.since))
        check(False, "transformer_engine", te_text,
              f"{low.name} needs Transformer Engine {since} or later (the release that added it); give "
              f"{since} or later, or another recipe")
    if plan.fp8_param_gather:
        able = [n for n in FP8_RECIPES if RECIPES[n].gathered_weight_bytes is not None]
        check(recipe.gathered_weight_bytes is not None, "fp8_param_gather", True,
              f"not modelled with fp8_recipe {plan.fp8_recipe} (allowed with {', '.join(able[:-1])} or {able[-1]})")


def check_precision_weights(plan) -> None:
    """FP8 weights with the ZeRO stage and the optimizer offload (after ``check_precision_plan``)."""
    if not plan.fp8_param_gather:
        return
    recipe = RECIPES[canonical_fp8_recipe(plan.fp8_recipe)]
    require(plan.fp8_format is not None and plan.zero.shards_optimizer, "plan: fp8_param_gather", True,
            f"needs fp8_format and zero 1, 2 or 3 (got {plan.fp8_format or 'BF16'}, zero {plan.zero_stage}): it keeps "
            "the sharded optimizer's weights in FP8 (Megatron-LM: distributed optimizer or FSDP only)",
            setting="fp8_param_gather")
    require(recipe.zero3_weights or not plan.zero.shards_params, "plan: fp8_param_gather", True,
            f"not modelled with zero 3 and fp8_recipe {recipe.name} (allowed under zero 3: delayed or tensorwise; "
            "Megatron-FSDP gathers MXFP8 weights without the gradient buffer)", setting="fp8_param_gather")
    require(recipe.offload_weights or not plan.offload_optimizer, "plan: fp8_param_gather", True,
            f"with offload_optimizer needs fp8_recipe delayed (got {plan.fp8_recipe}; Megatron-LM refuses the "
            "optimizer CPU offload with FP8 weights of other recipes)", setting="fp8_param_gather")


def check_support(precision: Precision | None, profile, flag: str = "--fp8-format") -> None:
    """A one-line error when the GPU lacks what the recipe's GEMMs need: an FP8 peak (A100
    has none), MX block-scaled tensor cores (``HardwareProfile.mx_block_scaling``: Hopper and
    Ampere lack them) or an FP4 peak (only Blackwell's profiles give one). ``flag``: the
    setting that chose FP8, as the caller names it."""
    if precision is None:
        return
    from sim.inputs.hardware import PRESETS, load_profile

    r = precision.recipe
    if r.needs == "fp4":
        if "fp4" not in profile.peak_flops:
            able = [n for n in PRESETS if "fp4" in load_profile(n).peak_flops]
            flag, value = precision.given or (r.flag, r.name)
            raise InputError(field=flag, value=value, setting=flag.lstrip("-").replace("-", "_"), allowed=(
                f"GPU {profile.name} has no FP4 tensor cores (its profile's peak_flops has "
                f"{', '.join(sorted(profile.peak_flops))}, no fp4); allowed on {profile.name}: leave it unset (BF16, "
                f"or FP8 with --fp8-format); {r.name} needs a GPU with an fp4 peak ({', '.join(able)})"))
        return
    if "fp8" not in profile.peak_flops:
        able = [n for n in PRESETS if "fp8" in load_profile(n).peak_flops]
        raise InputError(field=flag, value=precision.format, setting="fp8_format", allowed=(
            f"GPU {profile.name} has no FP8 tensor cores (its profile's peak_flops has "
            f"{', '.join(sorted(profile.peak_flops))}, no fp8); allowed on {profile.name}: leave it unset (BF16); "
            f"{' or '.join(FP8_FORMATS)} need a GPU with an fp8 peak ({', '.join(able)})"))
    if r.needs == "mx" and not profile.mx_block_scaling:
        able = [n for n in PRESETS if load_profile(n).mx_block_scaling]
        here = [n for n in FP8_RECIPES if RECIPES[n].needs != "mx"]
        raise InputError(field="--fp8-recipe", value=r.name, setting="fp8_recipe", allowed=(
            f"GPU {profile.name} has no MX block-scaled tensor cores (its profile's mx_block_scaling is false); "
            f"allowed on {profile.name}: {', '.join(here)}; {r.name} needs a GPU with mx_block_scaling "
            f"({', '.join(able)})"))
