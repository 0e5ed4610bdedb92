"""A first-order answer without simulation: per-GPU memory and step time of a plan.

This is the fast path for sweeps and the baseline the simulator must beat on fidelity.
It adds up, never overlaps:

    step = m·T + (p − 1)/v · T + pp_comm + dp_comm + optimizer

where T is the slowest pipeline stage's time for one micro-batch (its layers' F, B and W
op times from ``sim.costs`` plus their tensor-parallel collectives, the embedding on the
first stage and the output head on the last), m the micro-batches per step, p the
pipeline stages and v the chunks per stage ((p−1)/v·T is the 1F1B/interleaved bubble of
Narayanan et al. SC'21). Collectives use the ring closed forms over the slowest link the
group spans (``nvlink`` inside a node, ``ib`` across nodes, with Megatron's rank order
tp, then dp, then pp). Gradient sync is an all-reduce of the 16-bit gradients per step
for ZeRO-0/1, a reduce-scatter per micro-batch plus one all-gather for ZeRO-2, and two
all-gathers and a reduce-scatter per micro-batch for ZeRO-3 (the 1.5× of the ZeRO
paper). The optimizer step is memory-bound: 28 bytes moved per local parameter.

Model FLOPs are F + B + W of every GEMM and attention op without recomputation, which
for GPT shapes is Korthikanti et al.'s Eq. 7, 72·B·L·s·h²·(1 + s/(6h) + V/(12hL));
MFU = model FLOPs / (step · GPUs · peak). Hardware FLOPs add the recomputed work.
Memory is the worst stage's model states, activations and temporaries (``sim.memory``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sim.costs import collective_time, transfer_time, work_times
from sim.hardware import HardwareProfile
from sim.memory import (
    grad_bucket_bytes,
    layer_params_per_rank,
    model_state_bytes,
    stage_activation_bytes,
    stage_params_per_rank,
    zero3_gathered_param_bytes,
)
from sim.model import ModelSpec
from sim.plan import ParallelPlan
from sim.workload import embedding_work, head_work, layer_work, p2p_bytes

ADAM_BYTES_PER_PARAM = 28  # read fp32 weight, m, v (12) + 16-bit grad (2); write 12 + 16-bit weight (2)
_MATMUL = ("gemm", "attention")


@dataclass(frozen=True)
class Estimate:
    """Analytic per-GPU memory (bytes) and step time (seconds) of one plan."""

    model: str
    gpu: str
    plan: ParallelPlan
    num_params: int
    params_per_gpu: float
    worst_stage: int
    memory: dict
    """Worst stage, bytes: weights, gradients, optimizer, activations, temporaries, total."""
    memory_capacity_bytes: float
    fits: bool
    time: dict
    """Seconds: compute, tp_comm, pipeline_bubble, pp_comm, dp_comm, optimizer, step."""
    links: dict
    """Link kind each group's collectives are timed on: tp, dp, pp."""
    tokens_per_s: float
    model_flops_per_step: float
    hardware_flops_per_step: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float

    def to_dict(self) -> dict:
        d = asdict(self)
        d["plan"] = asdict(self.plan)
        return d


def _links(plan: ParallelPlan, gpus_per_node: int) -> dict:
    def kind(span: int) -> str:
        return "nvlink" if span <= gpus_per_node else "ib"
    return {"tp": kind(plan.tp), "dp": kind(plan.tp * plan.dp), "pp": kind(plan.world_size)}


def model_flops_per_sequence(model: ModelSpec, recompute: str = "none") -> float:
    """GEMM and attention FLOPs of forward and backward for one sequence (incl. recompute
    when given); the sum Korthikanti's Eq. 7 (none) and Megatron's Eq. 3 (full) close-form."""
    layer = layer_work(model, 1, recompute=recompute).flops(kinds=_MATMUL)
    return model.num_layers * layer + head_work(model, 1).flops(kinds=_MATMUL)


def estimate(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *,
             gpus_per_node: int = 8, dtype: str = "bf16", flash_attention: bool = True) -> Estimate:
    """Per-GPU memory and first-order step time of ``plan`` for ``model`` on ``profile``."""
    plan.check_model(model)
    links = _links(plan, gpus_per_node)
    b, t, p, v, m = plan.micro_batch_size, plan.tp, plan.pp, plan.vpp, plan.num_microbatches
    sp = plan.sequence_parallel
    layers_per_stage = model.num_layers // p

    def split(work):
        times = work_times(work, profile, t, links["tp"], dtype)
        return sum(c for c, _ in times.values()), sum(x for _, x in times.values())

    layer_c, layer_x = split(layer_work(model, b, t, sp, plan.recompute))
    emb_c, emb_x = split(embedding_work(model, b, t, sp))
    head_c, head_x = split(head_work(model, b, t, sp))
    stage_times = []
    for stage in range(p):
        c, x = layers_per_stage * layer_c, layers_per_stage * layer_x
        if stage == 0:
            c, x = c + emb_c, x + emb_x
        if stage == p - 1:
            c, x = c + head_c, x + head_x
        stage_times.append((c, x))
    compute_mb, tp_mb = max(stage_times, key=sum)
    per_mb = compute_mb + tp_mb

    pp_comm = m * 2 * v * transfer_time(p2p_bytes(model, b, t, sp), links["pp"], profile) if p > 1 else 0.0

    params = [stage_params_per_rank(model, plan, s) for s in range(p)]
    psi = max(params)
    grad_bytes = 2 * psi
    dp, z, dp_link = plan.dp, plan.zero_stage, links["dp"]
    if dp == 1:
        dp_comm = 0.0
    elif z <= 1:
        dp_comm = collective_time("all_reduce", grad_bytes, dp, dp_link, profile)
    elif z == 2:
        dp_comm = (m * collective_time("reduce_scatter", grad_bytes, dp, dp_link, profile)
                   + collective_time("all_gather", grad_bytes, dp, dp_link, profile))
    else:
        dp_comm = m * (2 * collective_time("all_gather", grad_bytes, dp, dp_link, profile)
                       + collective_time("reduce_scatter", grad_bytes, dp, dp_link, profile))
    local = psi / dp if z >= 1 else psi
    optimizer = ADAM_BYTES_PER_PARAM * local / (profile.hbm_bandwidth_Bps * profile.memory_efficiency)

    time = {
        "compute": m * compute_mb,
        "tp_comm": m * tp_mb,
        "pipeline_bubble": (p - 1) / v * per_mb,
        "pp_comm": pp_comm,
        "dp_comm": dp_comm,
        "optimizer": optimizer,
    }
    time["step"] = sum(time.values())

    memories = []
    for stage in range(p):
        states = model_state_bytes(params[stage], dp, z)
        temp = 0.0
        if z >= 1 and dp > 1:
            temp += grad_bucket_bytes(min(params[stage], 5e8))
        if z == 3 and dp > 1:
            temp += zero3_gathered_param_bytes(layer_params_per_rank(model, t))
        mem = {"weights": states.params_bytes, "gradients": states.grads_bytes,
               "optimizer": states.optimizer_bytes,
               "activations": stage_activation_bytes(model, plan, stage, flash_attention),
               "temporaries": temp}
        mem["total"] = sum(mem.values())
        memories.append(mem)
    worst = max(range(p), key=lambda s: memories[s]["total"])

    seqs = plan.global_batch_size
    model_flops = seqs * model_flops_per_sequence(model)
    hw_flops = seqs * model_flops_per_sequence(model, plan.recompute)
    step, world = time["step"], plan.world_size
    return Estimate(
        model=model.name, gpu=profile.name, plan=plan, num_params=model.num_params,
        params_per_gpu=params[worst], worst_stage=worst, memory=memories[worst],
        memory_capacity_bytes=profile.hbm_capacity_bytes,
        fits=memories[worst]["total"] <= profile.hbm_capacity_bytes, time=time, links=links,
        tokens_per_s=seqs * model.seq_length / step,
        model_flops_per_step=model_flops, hardware_flops_per_step=hw_flops,
        model_tflops_per_gpu=model_flops / step / world / 1e12,
        hardware_tflops_per_gpu=hw_flops / step / world / 1e12,
        mfu=model_flops / (step * world * profile.peak(dtype)))
