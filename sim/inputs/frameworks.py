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

``kernel_overhead`` (the PyTorch-native frameworks): each kernel of the framework's
program costs the GPU ``o`` seconds more than the same kernel under Megatron-Core, whose
rows the preset's ``kernel_launch_s`` and compute fraction are fitted to. The mechanism
is the eager path between kernels: every op goes through Python, the autograd and ATen
dispatchers and the backend before ``cudaLaunchKernel`` (5-25 us of CPU per op,
``sim.program.launch.HOST_LAUNCH_S``'s source), and FSDP adds its module hooks to that
path (PyTorch ``torch/distributed/fsdp/_fully_shard/_fsdp_state.py``: ``_pre_forward`` /
``_post_forward`` / ``_pre_backward`` per wrapped module, which unshard, wait on the
all-gather's event and copy out; torchtitan ``parallelize_llama`` wraps every
transformer block). Where the host runs only a little ahead of the GPU (FSDP's
all-gather waits at each block, ``limit_all_gathers`` in FSDP1 making the CPU wait on the
all-gather two blocks back, the optimizer's ``foreach`` kernels launched in chunks of
tensor lists) part of that CPU time shows between kernels on the GPU. How much depends on
the framework and on the host, so it is a fitted number per GPU profile and framework:
``HardwareProfile.framework_kernel_overhead_s[name]`` (``trainsim fit --params
framework_kernel_overhead_s.torchtitan,...``), 0 where a profile gives none, between 0
(the host always ahead) and ``KERNEL_OVERHEAD_MAX_S`` (the whole eager path exposed at
every kernel). ``job_profile`` (``sim.program.build``) adds it to ``kernel_launch_s`` for
the plan's framework: k kernels in a step then cost k·o more. Megatron-Core has none:
its kernels are the ones ``kernel_launch_s`` is fitted to.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import require

ATTENTION_KERNELS = ("te", "fa2", "triton")
BACKWARD_PREFETCH = ("backward_pre", "backward_post")


@dataclass(frozen=True)
class Framework:
    """What one framework runs where it differs from Megatron-Core."""

    attention_kernel: str
    backward_prefetch: str
    what: str
    kernel_overhead: bool = False
    """Its kernels pay a fitted per-kernel overhead over Megatron-Core's (module doc)."""


KERNEL_OVERHEAD_MAX_S = 25e-6
"""The most a framework's kernel may cost over Megatron-Core's: the whole op-to-launch
path of eager PyTorch exposed on the GPU (5-25 us of CPU per op: Python ~1 us, pybind11
~1, autograd 1-3, ATen dispatch 1-2, backend 1-5, cudaLaunchKernel 1-3 on CUDA 12; the
source of ``sim.program.launch.HOST_LAUNCH_S``)."""

FRAMEWORKS = {
    "megatron": Framework("te", "backward_pre", "Megatron-Core / NeMo with Transformer Engine (the presets' fits)"),
    "torchtitan": Framework("fa2", "backward_pre", "torchtitan: FSDP2, SDPA attention (FlashAttention-2)", True),
    "automodel": Framework("te", "backward_pre", "NeMo AutoModel: FSDP2 with prefetch, Transformer Engine kernels",
                           True),
    "llm-foundry": Framework("triton", "backward_post",
                             "llm-foundry MPT on Composer FSDP1: Triton flash attention, BACKWARD_POST prefetch", True),
}
OVERHEAD_FRAMEWORKS = tuple(name for name, f in FRAMEWORKS.items() if f.kernel_overhead)
"""The frameworks whose kernels pay ``framework_kernel_overhead_s`` (module doc)."""
DEFAULT_FRAMEWORK = "megatron"


def framework_of(plan) -> Framework:
    """The plan's framework (Megatron-Core when none is given)."""
    return FRAMEWORKS[plan.framework or DEFAULT_FRAMEWORK]


def framework_name(plan) -> str:
    """The plan's framework's name (``DEFAULT_FRAMEWORK`` when none is given)."""
    return plan.framework or DEFAULT_FRAMEWORK


def kernel_overhead_s(plan, profile) -> float:
    """Seconds each kernel of the plan's framework costs over Megatron-Core's on ``profile``:
    the profile's fitted ``framework_kernel_overhead_s`` for it, 0 where it gives none or the
    framework pays none (module doc)."""
    name = framework_name(plan)
    if not FRAMEWORKS[name].kernel_overhead or not profile.framework_kernel_overhead_s:
        return 0.0
    return float(profile.framework_kernel_overhead_s.get(name, 0.0))


def attention_kernel_in_effect(plan) -> str:
    """The attention kernel the plan runs: the one given, else its framework's ('te' under
    unfused attention, which has no attention kernel to price)."""
    if plan.attention != "flash":
        return "te"
    return plan.attention_kernel or framework_of(plan).attention_kernel


def backward_prefetch_in_effect(plan) -> str:
    """How ZeRO-3 prefetches in backward: as given, else as its framework does."""
    return plan.backward_prefetch or framework_of(plan).backward_prefetch


def check_framework_plan(plan) -> None:
    """The plan's rules for these settings (``ParallelPlan.__post_init__``)."""
    for field, value, allowed in (("framework", plan.framework, tuple(FRAMEWORKS)),
                                  ("attention_kernel", plan.attention_kernel, ATTENTION_KERNELS),
                                  ("backward_prefetch", plan.backward_prefetch, BACKWARD_PREFETCH)):
        require(value is None or value in allowed, f"plan: {field}", value, f"allowed: {', '.join(allowed)}",
                setting=field)
    require(plan.attention_kernel is None or plan.attention == "flash", "plan: attention_kernel",
            plan.attention_kernel, "a fused kernel needs attention flash (unfused attention runs GEMMs and a "
            "softmax, no attention kernel)", setting="attention_kernel")
    require(isinstance(plan.reshard_after_forward, bool), "plan: reshard_after_forward", plan.reshard_after_forward,
            "expected true or false", setting="reshard_after_forward")
    for field, value, default in (("backward_prefetch", plan.backward_prefetch, None),
                                  ("reshard_after_forward", plan.reshard_after_forward, True)):
        require(value == default or plan.zero_stage == 3, f"plan: {field}", value,
                f"needs zero 3 (got {plan.zero_stage}): it says how FSDP / ZeRO-3 gathers the parameters",
                setting=field)
