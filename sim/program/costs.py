"""How long things take: every time formula of the program, as pure functions of a
``HardwareProfile``.

Kernels. An op's time is a roofline with measured efficiencies plus a fixed kernel
overhead (``op_time``):

    t = max(flops / (peak · eff), bytes / (hbm_bandwidth · mem_eff)) + launch

where ``eff`` is the profile's shape-dependent GEMM efficiency (``gemm_efficiency``) for
GEMMs (an FP8 GEMM, ``Op.dtype == "fp8"`` from ``sim.program.fp8``, against the fp8 peak with
the profile's FP8 efficiency), its flash-attention efficiency (``attention_efficiency``) for attention, and 1
against the non-tensor-core (``fp32``) peak for elementwise kernels, which in practice
are bound by the second term. ``mem_eff`` is the profile's ``memory_efficiency`` for
tuned library kernels (norms, flash attention) and its ``framework_kernel_efficiency``
for the framework's own (Megatron-LM's torch.compile fusions and PyTorch's eager ops:
``Op.framework``), which stream at little more than half the HBM peak
(``hbm_bandwidth_Bps``, the efficiencies and ``kernel_launch_s`` are profile fields,
measured by ``sim.calibrate`` or named in the preset's sources).

Links and collectives. A transfer of n bytes over one link of a kind takes
``α + n / (β · efficiency)`` (the profile's ``LinkModel``). The ring closed forms of
collectives without contention, used by the analytic estimate, by the coalesced
tensor-parallel collectives (``sim.program.coalesce``) and by tests of the network
model, are (n ranks, S the nccl-tests buffer size, per-step latency α, effective
bandwidth B; nccl-tests' bus-bandwidth factors 2(n−1)/n and (n−1)/n count the same
steps)

    all-reduce                 2(n−1)·(α + S/(n·B))
    all-gather, reduce-scatter  (n−1)·(α + S/(n·B))

NCCL's other algorithms and protocols (``sim.engine.nccl``, ``sim.engine.algorithms_nccl``),
which the simulator runs where NCCL's tuner picks them (``nccl_algo = "auto"``, the
default) or where they are forced, have these uncontended times (``nvls_time``; the
protocols scale α by hop_latency[p]/hop_latency[simple] and B by bandwidth_fraction[p]):

    NVLS all-reduce            α_nvls + S·(n+1)/n / (B_line·nvls_efficiency)
    NVLS all-gather, reduce-scatter  α_nvls + S / (B_line·nvls_efficiency)
    tree all-reduce            2((g−1)α_intra + ⌊log2 N⌋α_inter) + busiest link's bytes / B

The coalesced tensor-parallel collectives (``sim.program.coalesce``) are priced as the
engine runs them, algorithm and protocol included. Where it does not agree: the analytic
estimate (``sim.program.estimate``: ``trainsim estimate``, ``explain``) prices every
collective as a Simple ring (``collective_time``: NCCL's ring/Simple base latency, then
the closed form), as NCCL_ALGO=ring NCCL_PROTO=simple would run it; with NVLS on an
H100/H200 node its TP all-reduce time is ring/NVLS = 2(n−1)/(n+1)·nvls_efficiency/(NVLink
efficiency) times the simulator's for large S (the busbw ratio 480/370 ≈ 1.3 at n = 8 on
H100).

Optimizer step. Mixed-precision Adam (ZeRO, Rajbhandari et al. SC'20: a 16-bit weight
and gradient and K = 12 bytes of fp32 weight, momentum and variance per parameter) is
memory-bound: per local parameter it reads the 12 bytes of fp32 states and the 2-byte
gradient and writes back the 12 bytes and the 2-byte weight, ``ADAM_BYTES_PER_PARAM``
= 28 bytes. Megatron-LM's optimizer step also passes over the parameters three more
times, each a multi-tensor kernel over the rank's shard: the gradient norm reads the
fp32 gradients (4 bytes; ``clip_grads.get_grad_norm_fp32``), clipping scales them in
place every step (read and write, 8 bytes; ``clip_grad_by_total_norm_fp32``), and the
updated fp32 weights are copied to the 16-bit model weights (read 4, write 2: 6 bytes;
``distrib_optimizer._copy_main_params_to_model_params``), so on the GPU

    t_opt = 46·Ψ_local / (hbm_bandwidth · memory_efficiency)     (``OPTIMIZER_STEP_BYTES_PER_PARAM``)

with Ψ_local the parameters whose states the rank updates (``sim.program.memory``).
With the optimizer offloaded (ZeRO-Offload, Ren et al., USENIX ATC 2021) the same step
runs on the host CPU out of host memory, whose bandwidth (the profile's
``host_memory_bandwidth_Bps``) the G GPUs of a node share:

    t_cpu = 28·Ψ_local / (host_memory_bandwidth · memory_efficiency / G)

Analytic step terms (``sim.program.estimate``; the simulator gets them from the schedule
and the network instead). The pipeline bubble for p stages, v chunks per stage and the
slowest stage's per-micro-batch phase times T_F, T_B, T_W (T their sum):

    gpipe, 1f1b   (p − 1)·T                        (GPipe; Narayanan et al. SC'21)
    interleaved   (p − 1)·T / v                    (Narayanan et al. SC'21)
    zb-h1         (p − 1)·max(0, T_F + T_B − T_W)  (Qi et al., Zero Bubble PP, ICLR 2024)
    zb-h2         (p − 1)·max(0, T_F + T_B − 2T_W) (same paper)

('custom' is costed as 1F1B, or interleaved when v > 1.) Gradient synchronization of
the 16-bit gradients G = 2Ψ over Nd data-parallel ranks and m micro-batches follows the
ZeRO paper's communication volumes: one all-reduce per step for ZeRO-0/1 (2Ψ), a
reduce-scatter per micro-batch plus one all-gather of the updated parameters for
ZeRO-2, and per micro-batch two all-gathers (forward and backward) and a
reduce-scatter for ZeRO-3 (3Ψ, 1.5× the others). Pipeline point-to-point traffic is one
activation forward and one gradient back per micro-batch and chunk.

Nothing here knows about topology or contention: that is the network model's job.
"""

from __future__ import annotations

from sim.errors import InputError, require
from sim.inputs.hardware import HardwareProfile
from sim.inputs.strategies import PipelineSchedule, schedule_named, zero_stage_of
from sim.inputs.profile_checks import NCCL_BASE_LATENCY_S
from sim.program.fp8 import gemm_kernel
from sim.program.workload import PHASES, Op, Work

ADAM_BYTES_PER_PARAM = 28
"""Adam's own pass: read fp32 weight, momentum, variance and the gradient, write the three states and the weight."""
GRAD_NORM_BYTES_PER_PARAM = 4
"""The gradient norm reads each fp32 gradient once (Megatron-LM ``clip_grads.get_grad_norm_fp32``)."""
GRAD_CLIP_BYTES_PER_PARAM = 8
"""Clipping scales each fp32 gradient in place, every step on Transformer Engine's path
(``clip_grad_by_total_norm_fp32`` with a clamped coefficient)."""
PARAM_COPY_BYTES_PER_PARAM = 6
"""The fp32 weight copied to the 16-bit model weight (Megatron-LM's distributed optimizer)."""
OPTIMIZER_STEP_BYTES_PER_PARAM = (ADAM_BYTES_PER_PARAM + GRAD_NORM_BYTES_PER_PARAM + GRAD_CLIP_BYTES_PER_PARAM
                                  + PARAM_COPY_BYTES_PER_PARAM)
"""Bytes mixed-precision Adam moves per local parameter: read the fp32 weight, momentum
and variance (12) and the 16-bit gradient (2); write the 12 and the 16-bit weight (2)."""
COMPOSER_ADAMW_BYTES_PER_PARAM = 84
"""Composer's ``DecoupledAdamW`` (mosaicml/composer v0.16.4, composer/optim/
decoupled_weight_decay.py ``adamw``, llm-foundry's MPT benchmark optimizer): one eager
in-place op after another on each parameter's fp32 tensors, none fused, with the fp32
sharded gradient FSDP1 leaves: ``exp_avg.mul_`` (read 4, write 4), ``.add_(grad)`` (8, 4),
``exp_avg_sq.mul_`` (4, 4), ``.addcmul_(grad, grad)`` (12, 4), ``exp_avg_sq.sqrt()`` (4, 4),
``/ sqrt(bias_correction2)`` (4, 4), ``.add_(eps)`` (4, 4), ``param.addcdiv_(exp_avg,
denom)`` (12, 4): 84 bytes; ``param.mul_`` only with weight decay, 0 in the MPT yamls
(scripts/train/yamls/pretrain/mpt-*.yaml @ v0.3.0). The fp32 weight is what FSDP1 gathers
from (its bf16 cast is the gather's copy-in, ``sim.program.fsdp``): no weight copy."""
FSDP1_CLIP_BYTES_PER_PARAM = 12
"""FSDP1's ``clip_grad_norm_`` (torch 2.1 fully_sharded_data_parallel.py; Composer's
``gradient_clipping`` algorithm, ``clipping_type: norm`` in the MPT yamls, calls it after
every batch): ``torch.linalg.vector_norm`` of each fp32 gradient (read 4), then
``grad.mul_(clip_coef_clamped)`` (read 4, write 4)."""
OPTIMIZER_BYTES_PER_PARAM = {"megatron": OPTIMIZER_STEP_BYTES_PER_PARAM,
                             "composer": COMPOSER_ADAMW_BYTES_PER_PARAM + FSDP1_CLIP_BYTES_PER_PARAM}
"""Bytes per local parameter of each framework's optimizer step (``sim.inputs.frameworks.Framework.optimizer``)."""

_RING_FACTOR = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1,
                "allreduce": 2, "allgather": 1, "reducescatter": 1}


# ----------------------------------------------------------------------- kernels
def op_time(op: Op, profile: HardwareProfile, dtype: str = "bf16") -> float:
    """Seconds one op takes on one GPU of ``profile`` (the roofline of the module doc)."""
    if op.kind == "gemm":
        m, n, k = op.shape
        kernel = dtype
        if op.dtype != "bf16":  # an FP8 or FP4 GEMM: sim.program.fp8
            dtype, kernel = gemm_kernel(op.dtype, profile)
            if dtype not in profile.peak_flops:
                raise InputError(f"precision: GPU {profile.name} has no {dtype.upper()} peak (peak_flops has "
                                 f"{', '.join(sorted(profile.peak_flops))}); {op.dtype} GEMMs need one")
        if op.streams and op.batch > 1:  # one kernel per GEMM on a few streams
            compute, _ = gemm_compute_time(op, profile, dtype, kernel)
            memory = (op.bytes_read + op.bytes_written) / profile.memory_rate(op.framework, in_moe_block(op))
            return max(compute, memory) + bias_pass_time(op, profile) + fixed_time(op, profile)
        rate = profile.peak(dtype) * profile.gemm_efficiency(m, n, k, op.batch, kernel)
    elif op.kind == "attention":
        sq, sk, d = op.shape
        backward = op.phase == "B" and not op.recompute  # (a recomputed forward runs the forward kernel)
        rate = profile.peak(dtype) * profile.attention_efficiency(sq, sk, d, op.batch, backward=backward,
                                                                  mma_flops_per_score=mma_flops_per_score(op))
        if op.kernel != "te":  # another kernel than the profile's own (sim.inputs.frameworks)
            rate *= profile.attention_speed(op.kernel, backward=backward)
    else:
        rate = profile.peak("fp32") if "fp32" in profile.peak_flops else profile.peak(dtype)
    compute = op.flops / rate if op.flops else 0.0
    memory = (op.bytes_read + op.bytes_written) / profile.memory_rate(op.framework, in_moe_block(op))
    return max(compute, memory) + bias_pass_time(op, profile) + fixed_time(op, profile)


MOE_BLOCK_PREFIX = "moe."
"""The name every op of a mixture-of-experts block carries (``sim.program.workload_moe``: the
router, the dispatch and combine, the experts, the shared experts)."""


def in_moe_block(op: Op) -> bool:
    """Whether ``op`` is a kernel of a mixture-of-experts block (``MOE_BLOCK_PREFIX``): its
    memory-bound kernels stream at the profile's ``memory_rate(..., moe=True)``."""
    return op.name.startswith(MOE_BLOCK_PREFIX)


def fixed_time(op: Op, profile: HardwareProfile) -> float:
    """The fixed seconds ``op`` pays beside its roofline: ``launches`` times the profile's
    per-kernel cost, a GEMM's ``gemm_fixed_s`` (the GEMM kernel's own, measured on Blackwell),
    any other kernel's ``kernel_launch_s``."""
    return launches(op) * (profile.gemm_fixed_s if op.kind == "gemm" else profile.kernel_launch_s)


def mma_flops_per_score(op: Op) -> float | None:
    """An attention op's matmul FLOPs per (query, key) score on the project's count (the
    forward's 2·(d_qk + d_v); ``sim.program.workload``), None where it has none."""
    sq, sk, _ = op.shape
    return op.flops / (op.batch * sq * sk) if op.flops and op.batch and sq and sk else None


def launches(op: Op) -> int:
    """How many times ``op`` pays the profile's fixed per-kernel cost (``kernel_launch_s``, "added
    to every kernel"): a memory-bound op once per kernel it is made of, one after another on its
    stream (``Op.kernels``: PyTorch's ops of an unfused router or permutation, Transformer
    Engine's per-expert casts); a GEMM or attention op once (a grouped GEMM on several streams:
    once per round, ``gemm_compute_time``)."""
    if op.kind == "gemm" and op.streams and op.batch > 1:
        return -(-op.batch // min(op.batch, op.streams))
    return op.kernels if op.kind == "memory" else 1


def gemm_compute_time(op: Op, profile: HardwareProfile, dtype: str, kernel: str) -> tuple[float, int]:
    """(compute seconds, rounds) of a GEMM op whose ``batch`` GEMMs run as separate kernels
    taken in turn by ``op.streams`` streams: Transformer Engine's grouped GEMM
    (``general_grouped_gemm`` -> ``nvte_multi_stream_cublas_gemm``, transformer_engine/common/
    gemm/cublaslt_gemm.cu) launches one cuBLAS GEMM per local expert, the i-th on compute stream
    i mod ``num_compute_streams`` = 4 (transformer_engine/common/util/multi_stream.h). At most
    ``streams`` of them run at once, so a round of c concurrent GEMMs fills the SMs with the
    tiles of c GEMMs, not of the whole batch (``gemm_efficiency`` at batch c), and each round
    starts with a kernel launch; ``batch`` GEMMs take ceil(batch / streams) rounds, the last
    with the remainder."""
    m, n, k = op.shape
    c = max(1, min(op.batch, op.streams))
    full, rest = divmod(op.batch, c)
    per = 2.0 * m * n * k
    t = full * c * per / (profile.peak(dtype) * profile.gemm_efficiency(m, n, k, c, kernel))
    if rest:
        t += rest * per / (profile.peak(dtype) * profile.gemm_efficiency(m, n, k, rest, kernel))
    return t, full + (1 if rest else 0)


def bias_pass_time(op: Op, profile: HardwareProfile) -> float:
    """Seconds of the pass that writes a biased GEMM's bias into its output, which the GEMM
    then reads back, where the profile has no bias epilogue (``gemm_bias_epilogue``); else 0."""
    if op.bias and not profile.gemm_bias_epilogue:
        return 2.0 * op.output_bytes / profile.memory_rate(True)
    return 0.0


def work_times(work: Work, profile: HardwareProfile, tp: int = 1, tp_link: str = "nvlink",
               dtype: str = "bf16") -> dict:
    """Per phase ``(compute_s, tp_comm_s)`` of ``work`` on one rank of a tp group of ``tp``
    GPUs whose collectives run over ``tp_link`` without overlap."""
    out = {}
    for phase in PHASES:
        compute = sum(op_time(o, profile, dtype) for o in work.ops(phase))
        comm = sum(collective_time(c.collective, c.nbytes, tp, tp_link, profile)
                   for c in work.comms(phase)) if tp > 1 else 0.0
        out[phase] = (compute, comm)
    return out


# --------------------------------------------------------- links and collectives
def transfer_time(nbytes: float, kind: str, profile: HardwareProfile) -> float:
    """Seconds to send ``nbytes`` over one uncontended link of ``kind``: α + n/(β·efficiency)."""
    require(nbytes >= 0, "transfer bytes", nbytes, "expected a size >= 0")
    return profile.link(kind).time(nbytes)


def ring_time(collective: str, nbytes: float, ranks: int, latency_s: float, bandwidth_Bps: float) -> float:
    """The ring closed form of the module doc: 2(n−1)·(α + S/(n·B)) for an all-reduce,
    (n−1)·(α + S/(n·B)) for an all-gather or a reduce-scatter (``collective`` spelled
    ``all_reduce`` or ``allreduce`` alike), S = ``nbytes``, n = ``ranks``."""
    steps = _RING_FACTOR[collective] * (ranks - 1)
    return steps * (latency_s + nbytes / (ranks * bandwidth_Bps))


def nvls_time(collective: str, nbytes: float, ranks: int, latency_s: float, line_Bps: float,
              nvls_efficiency: float, lead_bytes: float = 0.0) -> float:
    """NVLS (NVLink SHARP) inside one node, the switch-reduction closed form of the module
    doc: α_nvls + S·k/(B_line·nvls_efficiency), k = (n+1)/n for an all-reduce, 1 for an
    all-gather or a reduce-scatter (``sim.engine.algorithms_nccl``). ``lead_bytes``: what a
    GPU sends to the switch before the first chunk comes back (NVLS's chunked pipeline,
    ``sim.engine.nccl_tuning.nvls_lead_bytes``): the way back, S/n or S·k, starts that late,
    so the time is α_nvls + max(out, lead + back)/(B_line·nvls_efficiency)."""
    n = ranks
    if _RING_FACTOR[collective] == 2:
        out = back = nbytes * (n + 1) / n
    elif collective in ("reduce_scatter", "reducescatter"):
        out, back = nbytes, nbytes / n
    else:
        out, back = nbytes / n, nbytes
    return latency_s + max(out, lead_bytes + back) / (line_Bps * nvls_efficiency)


def collective_time(collective: str, nbytes: float, ranks: int, kind: str,
                    profile: HardwareProfile, channels: int = 1) -> float:
    """Ring closed form of a collective over ``ranks`` GPUs whose slowest hop is ``kind``,
    after NCCL's base latency for ring/Simple (``nccl_base_latency``; none for send_recv).

    ``channels`` rings run at once (NCCL's channels), each over its own link of that kind
    (one NIC per GPU), so the bandwidth term divides by it; it never beats NVLink."""
    require(collective in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"),
            "collective", collective, "allowed: all_reduce, all_gather, reduce_scatter, send_recv")
    require(isinstance(ranks, int) and ranks > 0, "ranks", ranks, "expected an integer > 0")
    if collective == "send_recv":
        return transfer_time(nbytes, kind, profile)
    if ranks == 1:
        return 0.0
    link = profile.link(kind)
    bw = link.effective_Bps * max(1, channels)
    if channels > 1 and "nvlink" in profile.links:
        bw = min(bw, profile.link("nvlink").effective_Bps)
    return nccl_base_latency(profile) + ring_time(collective, nbytes, ranks, link.latency_s, bw)


def nccl_base_latency(profile: HardwareProfile, algo: str = "ring", protocol: str = "simple") -> float:
    """Seconds an NCCL collective of ``algo``/``protocol`` pays once before its first
    transfer: the profile's ``nccl_base_latency_s``, or NCCL's own (tuning.cc) without it."""
    return (profile.nccl_base_latency_s or NCCL_BASE_LATENCY_S)[algo][protocol]


# ---------------------------------------------------------------- optimizer step
def optimizer_step_time(local_params: float, profile: HardwareProfile,
                        bytes_per_param: float = OPTIMIZER_STEP_BYTES_PER_PARAM) -> float:
    """Seconds of the memory-bound optimizer step over ``local_params`` parameters on the
    GPU (Adam, the gradient norm, clipping and the weight copy):
    46·Ψ_local / (hbm_bandwidth · memory_efficiency), or ``bytes_per_param`` for another
    framework's optimizer (``OPTIMIZER_BYTES_PER_PARAM``)."""
    return bytes_per_param * local_params / (profile.hbm_bandwidth_Bps * profile.memory_efficiency)


def cpu_optimizer_step_time(local_params: float, profile: HardwareProfile, gpus_per_host: int) -> float:
    """Seconds of the offloaded Adam step over ``local_params`` parameters on the host CPU
    (ZeRO-Offload), whose memory bandwidth ``gpus_per_host`` GPUs share:
    28·Ψ_local / (host_memory_bandwidth · memory_efficiency / G)."""
    if profile.host_memory_bandwidth_Bps <= 0:
        raise InputError(f"profile {profile.name}: host_memory_bandwidth_Bps is not set; "
                         "optimizer offload needs it to time the CPU optimizer step")
    return ADAM_BYTES_PER_PARAM * local_params / (profile.host_memory_bandwidth_Bps * profile.memory_efficiency
                                                  / gpus_per_host)


# ------------------------------------------------------------ analytic step terms
def pipeline_bubble_time(schedule: PipelineSchedule | str, pp: int, vpp: int, t_f: float, t_b: float, t_w: float) -> float:
    """Pipeline bubble of one step for the slowest stage's per-micro-batch phase times
    (the table of the module doc)."""
    p, v, k = pp, vpp, schedule_named(schedule).bubble_weight_passes
    if k:
        return (p - 1) * max(0.0, t_f + t_b - k * t_w)
    return (p - 1) / v * (t_f + t_b + t_w)


def pipeline_p2p_time(nbytes: float, microbatches: int, pp: int, vpp: int, kind: str,
                      profile: HardwareProfile) -> float:
    """Point-to-point time of one step on a stage: an activation forward and its gradient
    back (``nbytes`` each) per micro-batch and chunk, over one link of ``kind``."""
    return microbatches * 2 * vpp * transfer_time(nbytes, kind, profile) if pp > 1 else 0.0


GRAD_REDUCE_BYTES = {False: 2, True: 4}
"""Bytes per parameter a data-parallel gradient reduction moves: 16-bit gradients, or the
fp32 main gradients (Megatron-LM with bf16: ``--accumulate-allreduce-grads-in-fp32``, on
by default since "bfloat16 requires gradient accumulation and all-reduce to be done in
fp32", megatron/arguments.py; its local DDP all-reduces the fp32 gradient buffer)."""


def grad_reduce_scale(plan, moe: bool = False, experts: bool = False) -> float:
    """How many times a 16-bit gradient's bytes the plan's gradient reductions move (fp32
    as given, else as the framework's FSDP reduces: ``ParallelPlan.sharding.reduce_fp32``; ``moe``
    a model with routed experts, ``experts`` the routed experts' gradients)."""
    return GRAD_REDUCE_BYTES[plan.sharding.reduce_fp32(moe, experts)] / GRAD_REDUCE_BYTES[False]


def grad_sync_time(zero_stage: int, grad_bytes: float, dp: int, microbatches: int, kind: str,
                   profile: HardwareProfile, channels: int = 1, reduce_scale: float = 1.0) -> float:
    """Data-parallel traffic of one step under ZeRO stage ``zero_stage`` (the ZeRO paper's
    volumes, see the module doc), ring closed forms over ``dp`` ranks on ``kind`` links
    with ``channels`` rings at once; ``grad_bytes`` the rank's 16-bit gradients, whose
    reductions (all-reduce, reduce-scatter) move ``reduce_scale`` times as many bytes
    (2: reduced in fp32, ``ParallelPlan.grad_reduce_fp32``; parameter gathers stay 16-bit)."""
    if dp == 1:
        return 0.0
    m = microbatches

    def ring(collective: str) -> float:
        scale = reduce_scale if collective in ("all_reduce", "reduce_scatter") else 1.0
        return collective_time(collective, scale * grad_bytes, dp, kind, profile, channels=channels)

    zero = zero_stage_of(zero_stage)
    if not zero.shards_grads:
        return ring("all_reduce")
    if zero.reduce_scatters_each_backward:
        return m * ring("reduce_scatter") + ring("all_gather")
    return m * (2 * ring("all_gather") + ring("reduce_scatter"))
