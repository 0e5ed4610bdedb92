"""Which training framework ran: what it does differently from Megatron-Core.

The presets are fitted to Megatron-Core runs (NeMo's and the DGX Cloud benchmarks'), so
trainsim's defaults are Megatron-Core's. PyTorch-native frameworks run the same model
with other kernels and another FSDP, and ``framework`` says which one ran; each setting
below it can also be given on its own (a given one wins over the framework's):

    framework     attention_kernel  backward_prefetch  what the sources say
    megatron      te                backward_pre       Transformer Engine's fused attention (cuDNN; FA3-class
                                                       on Hopper); ZeRO-3 as DeepSpeed: prefetch depth ahead
    torchtitan    fa2               backward_pre       F.scaled_dot_product_attention, whose flash backend is
                                                       FlashAttention-2; FSDP2 (fully_shard) prefetches one
                                                       layer ahead in forward and backward
    automodel     te                backward_pre       NeMo AutoModel: TE attention and linears ("TE kernels");
                                                       FSDP2 with enable_fsdp2_prefetch
    llm-foundry   triton            backward_post      MPT on Composer's FSDP1: llm-foundry's attn_impl triton
                                                       (benchmark script at b2a43a147 / v0.3.0); Composer 0.16
                                                       sets backward_prefetch BACKWARD_POST by default

``attention_kernel`` (``HardwareProfile.attention_kernel_speed``): 'te' is the kernel the
profile's ``attention_max_efficiency`` stands for (FlashAttention-3 / cuDNN on Hopper,
FlashAttention-2 on Ampere); 'fa2' is FlashAttention-2 (Dao 2023), which on Hopper uses
none of its new instructions (FlashAttention-3 paper, Shah et al. 2024: about 35% of the
H100's peak); 'triton' is "FlashAttention in Triton" (Dao's flash_attn_triton.py of 2022,
which llm-foundry copies as ``flash_attn_triton.py`` and runs on triton-pre-mlir). A
profile gives each kernel's forward and backward speed relative to its own.

``backward_prefetch`` is PyTorch FSDP1's (``torch.distributed.fsdp.BackwardPrefetch``):
with BACKWARD_PRE a layer's all-gather for backward is issued in the pre-backward hook of
the layer after it, so it runs under that layer's backward; with BACKWARD_POST it is
issued in that layer's post-backward hook (``_post_backward_reshard`` ->
``_prefetch_handle``), once its gradients are computed, so each layer's backward waits for
its own all-gather (overlapped only with the reduce-scatter beside it).
``reshard_after_forward`` is FSDP2's (``fully_shard(reshard_after_forward=...)``); False
is FSDP1's SHARD_GRAD_OP: a layer's parameters gathered in forward stay until its backward
is done, so backward gathers nothing (``sim.program.zero.add_param_gathers``).
"""

from __future__ import annotations

from dataclasses import dataclass


ATTENTION_KERNELS = ("te", "fa2", "triton")
BACKWARD_PREFETCH = ("backward_pre", "backward_post")


@dataclass(frozen=True)
class Framework:
    """What one framework runs where it differs from Megatron-Core."""

    attention_kernel: str
    backward_prefetch: str
    what: str


FRAMEWORKS = {
    "megatron": Framework("te", "backward_pre", "Megatron-Core / NeMo with Transformer Engine (the presets' fits)"),
    "torchtitan": Framework("fa2", "backward_pre", "torchtitan: FSDP2, SDPA attention (FlashAttention-2)"),
    "automodel": Framework("te", "backward_pre", "NeMo AutoModel: FSDP2 with prefetch, Transformer Engine kernels"),
    "llm-foundry": Framework("triton", "backward_post",
                             "llm-foundry MPT on Composer FSDP1: Triton flash attention, BACKWARD_POST prefetch"),
}
DEFAULT_FRAMEWORK = "megatron"


def framework_of(plan) -> Framework:
    """The plan's framework (Megatron-Core when none is given)."""
    return FRAMEWORKS[plan.framework or DEFAULT_FRAMEWORK]


def attention_kernel_in_effect(plan) -> str:
    """The attention kernel the plan runs: the one given, else its framework's ('te' under
    unfused attention, which has no attention kernel to price)."""
    if not plan.attention_mode.fused:
        return "te"
    return plan.attention_kernel or framework_of(plan).attention_kernel


def backward_prefetch_in_effect(plan) -> str:
    """How ZeRO-3 prefetches in backward: as given, else as its framework does."""
    return plan.backward_prefetch or framework_of(plan).backward_prefetch

