"""A first-order answer without simulation: per-GPU memory and step time of a plan.

This is the fast path for sweeps and the baseline the simulator must beat on fidelity.
It adds up, never overlaps (``dp_overlap`` and the bucket size are the simulator's):

    step = m·T + bubble + pp_comm + dp_comm + optimizer

where T = T_F + T_B + T_W is the slowest pipeline stage's time for one micro-batch (the
F, B and W op times from ``sim.program.costs`` of the layers ``plan.stage_layers`` puts on it, over
all its chunks, plus their tensor-parallel collectives, the embedding on the first stage
and the output head on the last) and m the micro-batches per step. The bubble follows
the schedule, for p stages and v chunks per stage:

    gpipe, 1f1b   (p − 1)·T                        (GPipe; Narayanan et al. SC'21)
    interleaved   (p − 1)·T / v                    (Narayanan et al. SC'21)
    zb-h1         (p − 1)·(T_F + T_B − T_W)        (Qi et al., Zero Bubble PP, ICLR 2024)
    zb-h2         (p − 1)·max(0, T_F + T_B − 2T_W) (same paper)

('custom' is costed as 1F1B, or interleaved when v > 1.) Collectives use the ring closed
forms over the slowest link the group spans: ``nvlink`` when every group of that
dimension stays inside a node under the plan's ``placement``, else ``ib``. Gradient sync
is an all-reduce of the 16-bit gradients per step for ZeRO-0/1, a reduce-scatter per
micro-batch plus one all-gather for ZeRO-2, and two all-gathers and a reduce-scatter per
micro-batch for ZeRO-3 (the 1.5× of the ZeRO paper). The optimizer step is memory-bound:
28 bytes moved per local parameter.

Model FLOPs are F + B + W of every GEMM and attention op without recomputation, which
for GPT shapes is Korthikanti et al.'s Eq. 7, 72·B·L·s·h²·(1 + s/(6h) + V/(12hL));
MFU = model FLOPs / (step · GPUs · peak). Hardware FLOPs add the recomputed work.
Memory is the worst stage's model states, activations (in flight per the schedule,
``sim.program.memory``) and temporaries.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sim.program.costs import collective_time as _collective_time
from sim.program.costs import transfer_time, work_times
from sim.inputs.hardware import HardwareProfile
from sim.program.memory import (
    grad_bucket_bytes,
    layer_params_per_rank,
    model_state_bytes,
    stage_activation_bytes,
    stage_params_per_rank,
    zero3_gathered_param_bytes,
)
from sim.inputs.model import ModelSpec
from sim.inputs.plan import ParallelPlan
from sim.program.workload import embedding_work, head_work, layer_work, p2p_bytes

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
    """Link kind each dimension's groups use under the plan's placement."""
    return {d: "nvlink" if plan.max_nodes_spanned(d, gpus_per_node) == 1 else "ib"
            for d in ("tp", "dp", "pp")}


def _bubble(plan: ParallelPlan, t_f: float, t_b: float, t_w: float) -> float:
    """Pipeline bubble of one step for the slowest stage's per-micro-batch phase times."""
    p, v = plan.pp, plan.vpp
    if plan.schedule == "zb-h1":
        return (p - 1) * max(0.0, t_f + t_b - t_w)
    if plan.schedule == "zb-h2":
        return (p - 1) * max(0.0, t_f + t_b - 2 * t_w)
    return (p - 1) / v * (t_f + t_b + t_w)


def model_flops_per_sequence(model: ModelSpec, recompute: str = "none") -> float:
    """GEMM and attention FLOPs of forward and backward for one sequence (incl. recompute
    when given); the sum Korthikanti's Eq. 7 (none) and Megatron's Eq. 3 (full) close-form."""
    layer = layer_work(model, 1, recompute=recompute).flops(kinds=_MATMUL)
    return model.num_layers * layer + head_work(model, 1).flops(kinds=_MATMUL)


def estimate(model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *,
             gpus_per_node: int = 8, dtype: str = "bf16", flash_attention: bool = True,
             dp_channels: int | None = None) -> Estimate:
    """Per-GPU memory and first-order step time of ``plan`` for ``model`` on ``profile``.

    ``dp_channels``: rings a data-parallel collective across nodes runs at once, each
    through its own NIC; default one per group member on a node, as NCCL does (and as
    the simulator's network does); 1 models a single ring through one NIC."""
    plan.check_model(model)
    links = _links(plan, gpus_per_node)
    b, t, p, v, m = plan.micro_batch_size, plan.tp, plan.pp, plan.vpp, plan.num_microbatches
    sp = plan.sequence_parallel
    layers = plan.stage_layers(model)

    def phases(work):
        """Per phase (compute_s, tp_comm_s) of one micro-batch."""
        return work_times(work, profile, t, links["tp"], dtype)

    layer_t = phases(layer_work(model, b, t, sp, plan.recompute))
    emb_t, head_t = phases(embedding_work(model, b, t, sp)), phases(head_work(model, b, t, sp))
    stage_times = []          # per stage: {phase: (compute_s, tp_comm_s)}
    for stage in range(p):
        n = sum(layers[c * p + stage] for c in range(v))
        times = {}
        for ph in layer_t:
            c, x = n * layer_t[ph][0], n * layer_t[ph][1]
            if stage == 0:
                c, x = c + emb_t[ph][0], x + emb_t[ph][1]
            if stage == p - 1:
                c, x = c + head_t[ph][0], x + head_t[ph][1]
            times[ph] = (c, x)
        stage_times.append(times)
    slowest = max(stage_times, key=lambda st: sum(c + x for c, x in st.values()))
    compute_mb = sum(c for c, _ in slowest.values())
    tp_mb = sum(x for _, x in slowest.values())
    t_f, t_b, t_w = (sum(slowest[ph]) for ph in ("F", "B", "W"))

    pp_comm = m * 2 * v * transfer_time(p2p_bytes(model, b, t, sp), links["pp"], profile) if p > 1 else 0.0

    params = [stage_params_per_rank(model, plan, s) for s in range(p)]
    psi = max(params)
    grad_bytes = 2 * psi
    dp, z, dp_link = plan.dp, plan.zero_stage, links["dp"]
    # A dp group spanning nodes runs one ring per member on a node (NCCL channels), each
    # through its own NIC (sim.engine.algorithms.default_channels).
    spanned = plan.max_nodes_spanned("dp", gpus_per_node)
    ch = (max(1, dp // spanned) if dp_channels is None else dp_channels) if dp_link == "ib" else 1

    def collective_time(kind, nbytes, n, link, prof):
        return _collective_time(kind, nbytes, n, link, prof, channels=ch)

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
        "pipeline_bubble": _bubble(plan, t_f, t_b, t_w),
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
