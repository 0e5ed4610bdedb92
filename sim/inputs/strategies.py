"""Strategies as objects: what a plan's named choices mean to the rest of the code.

A plan keeps what users give as they gave it (``ParallelPlan.schedule`` "1f1b",
``dispatcher`` "flex", ``recompute`` "selective", ``attention`` "flash", ``zero_stage`` 2);
each kind of choice has one registry here that finds its strategy by name, a small frozen
dataclass with the behaviour the simulator asks of it (whether a schedule splits the
backward, whether a dispatcher gathers, what a ZeRO stage shards). The plan resolves its
fields here once (``ParallelPlan.pipeline``, ``.token_dispatcher``, ``.attention_mode``,
``.recompute_policy``, ``.zero``), and no other module compares those fields with names.

A new strategy is one entry in its registry (and, where it runs differently, the code that
asks its new property), plus its tests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.errors import require

__all__ = ["PipelineSchedule", "TokenDispatcher", "AttentionMode", "RecomputePolicy", "ZeroStage",
           "PIPELINE_SCHEDULES", "TOKEN_DISPATCHERS", "FLEX_BACKENDS", "ATTENTION_MODES", "RECOMPUTE_POLICIES", "ZERO",
           "schedule_named", "dispatcher_named", "attention_named", "recompute_named", "zero_stage_of"]


# ------------------------------------------------------------------ pipeline schedules
@dataclass(frozen=True)
class PipelineSchedule:
    """A pipeline schedule (``sim.program.schedules`` builds its steps by name)."""

    name: str
    chunks: str
    """"one": one model chunk per rank (vpp = 1); "many": vpp > 1 (Megatron-LM's interleaved
    1F1B); "any": as many as vpp says."""
    bubble_weight_passes: int = 0
    """Zero Bubble (Qi et al., ICLR 2024, §3): the weight-gradient passes each stage's bubble
    is filled with, (p − 1)·max(0, F + B − k·W); 0: the bubble is (p − 1)/v·(F + B + W)."""
    in_flight_one_chunk: str = "p - stage"
    """Micro-batches a stage of one chunk holds at its peak: "p - stage" (1F1B), "p" (ZB-H1,
    its paper's §3.1: the same memory as 1F1B's first stage on every stage), "2p - 1"
    (ZB-H2, §3.1), "m" (GPipe, looped BFS: every forward before any backward; each chunk holds m)."""
    pipedream_flush: bool = False
    """1F1B (PipeDream-Flush, Narayanan et al. 2021): a rank's first backward waits for the
    later ranks' forward and backward of micro-batch 0."""
    periodic: bool = True
    """From a few pipeline depths of micro-batches on, each more adds one steady-state period
    and no memory (not GPipe or looped BFS, whose memory grows with them; not a user's file)."""
    from_file: bool = False
    """A user's schedule .csv (``ParallelPlan.schedule_file``)."""
    searched: bool = True
    """``trainsim search`` tries it without being asked (``--schedule`` names the others)."""
    waits_for_sends: bool = False
    """Megatron-Core's own implementation waits for each pipeline send before the rank's next step
    (``forward_backward_pipelining_without_interleaving``: ``p2p_communication._communicate`` with
    ``wait_on_reqs=True``); its interleaved schedule overlaps them (``overlap_p2p_comm``). Applies
    where the framework runs Megatron-Core's schedules (``sim.inputs.frameworks.p2p_blocks``)."""

    @property
    def split_backward(self) -> bool:
        """The backward runs as an input-gradient and a separate weight-gradient step (B, W)."""
        return self.bubble_weight_passes > 0

    @property
    def one_chunk(self) -> bool:
        """One model chunk per rank (vpp = 1)."""
        return self.chunks == "one"

    @property
    def interleaved(self) -> bool:
        """Megatron-LM's interleaved 1F1B: vpp > 1, micro-batches in groups of pp."""
        return self.chunks == "many"

    def held_one_chunk(self, pp: int, stage: int, microbatches: int) -> int:
        """``in_flight_one_chunk`` for ``pp`` stages and ``microbatches``."""
        return {"p - stage": pp - stage, "p": pp, "2p - 1": 2 * pp - 1, "m": microbatches}[self.in_flight_one_chunk]


PIPELINE_SCHEDULES: dict[str, PipelineSchedule] = {s.name: s for s in (
    PipelineSchedule("gpipe", "one", in_flight_one_chunk="m", periodic=False),  # GPipe (Huang et al. 2019)
    PipelineSchedule("1f1b", "one", pipedream_flush=True, waits_for_sends=True),
    PipelineSchedule("interleaved", "many"),  # Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, §2.2)
    PipelineSchedule("zb-h1", "one", bubble_weight_passes=1, in_flight_one_chunk="p"),
    PipelineSchedule("zb-h2", "one", bubble_weight_passes=2, in_flight_one_chunk="2p - 1"),
    # breadth-first (Lamy-Poirier, MLSys 2023; PyTorch's ScheduleLoopedBFS, torchtitan's LoopedBFS): each
    # chunk's forwards for every micro-batch, then the backwards; every chunk holds all m micro-batches
    # (not searched unless asked: the same bubble as interleaved 1F1B with m·v activations held)
    PipelineSchedule("looped-bfs", "any", in_flight_one_chunk="m", periodic=False, searched=False),
    PipelineSchedule("custom", "any", periodic=False, from_file=True, searched=False),
)}
"""Every pipeline schedule a plan may name ("custom": set from ``--schedule FILE.csv``)."""


def _named(registry: dict, cls: type, name, field: str, setting: str):
    """``registry``'s strategy called ``name`` (``name`` itself when it is one already); an
    unknown name is refused naming the plan's ``field`` and what is allowed."""
    if isinstance(name, cls):
        return name
    require(name in registry, f"plan: {field}", name, f"allowed: {', '.join(registry)}", setting=setting)
    return registry[name]


def schedule_named(name: str | PipelineSchedule) -> PipelineSchedule:
    """The strategy of this name (itself, given one)."""
    return _named(PIPELINE_SCHEDULES, PipelineSchedule, name, "schedule", "schedule")


# ------------------------------------------------------------------ token dispatchers
@dataclass(frozen=True)
class TokenDispatcher:
    """How tokens reach their experts: Megatron-Core's ``--moe-token-dispatcher-type``
    (``sim.program.dispatch``, ``sim.program.workload_moe``)."""

    name: str
    gathers: bool = False
    """allgather: the tokens all-gathered over the tp × ep group, the outputs
    reduce-scattered back; the permutation runs after the gather."""
    deepep: bool = False
    """flex (DeepEP's normal kernels, Megatron-Core ``fused_a2a.py``; HybridEP exchanges the
    same way): each token crosses InfiniBand once per node it reaches, then NVLink; kernels on
    SMs of their own; the host waits for the received count; the same GPUs on every node of
    the group."""
    needs_ep: bool = False
    """Refused without expert parallelism (ep > 1)."""
    backend: str = ""
    """flex: Megatron-Core's ``--moe-flex-dispatcher-backend`` (``FLEX_BACKENDS``)."""
    num_sms: int = 0
    """flex: SMs its dispatch and combine kernels hold by default (Megatron-Core's
    ``moe_deepep_num_sms`` / ``moe_hybridep_num_sms``; ``ParallelPlan.moe_flex_num_sms`` sets them)."""
    gathers_routing_map: bool = False
    """Its forward dispatch all-gathers every rank's routing map and runs a metadata kernel on
    it before the exchange (HybridEP; ``sim.program.workload_moe._routing_map``)."""
    pads_expert_rows: bool = False
    """Its permutation writes each local expert's rows padded to the quantized grouped GEMM's
    multiple (HybridEP's ``pad_multiple``), so under FP8 or FP4 ``TEGroupedMLP`` finds the splits
    aligned and runs no padding kernels of its own (``sim.program.workload_moe.quant_pad_rows``)."""

    @property
    def exchanges_all_to_all(self) -> bool:
        """An all-to-all over the expert-parallel group, every routed copy sent (alltoall):
        its received copies are sorted by local expert (``sort_chunks_by_idxs``)."""
        return not (self.gathers or self.deepep)

    @property
    def overlappable(self) -> bool:
        """Megatron-Core runs ``--overlap-moe-expert-parallel-comm`` and
        ``--moe-shared-expert-overlap`` with the alltoall and flex dispatchers only."""
        return not self.gathers


TOKEN_DISPATCHERS: dict[str, TokenDispatcher] = {d.name: d for d in (
    TokenDispatcher("alltoall"),
    TokenDispatcher("allgather", gathers=True, needs_ep=True),
    TokenDispatcher("flex", deepep=True, needs_ep=True, backend="deepep", num_sms=20),
)}
"""Megatron-Core's token dispatchers (``megatron/core/transformer/moe/token_dispatcher.py``)."""

FLEX_BACKENDS: dict[str, TokenDispatcher] = {
    "deepep": TOKEN_DISPATCHERS["flex"],
    "hybridep": replace(TOKEN_DISPATCHERS["flex"], backend="hybridep", num_sms=16, pads_expert_rows=True,
                        gathers_routing_map=True),
}
"""The flex dispatcher's backends (Megatron-Core's ``--moe-flex-dispatcher-backend``;
``_DeepepManager`` and ``_HybridEPManager`` in ``token_dispatcher.py`` at Megatron-LM cba6b0ed,
the Megatron-Core of Megatron-Bridge 25.11). deepep, the default: DeepEP's normal kernels, then
Transformer Engine's permutation of the received tokens (``moe_permute``), which
``TEGroupedMLP`` pads under FP8 itself; 20 SMs (``moe_deepep_num_sms``). hybridep: DeepEP's
hybrid-ep branch (``HybridEPBuffer.dispatch_with_permute`` / ``combine_with_unpermute``), its own
permute kernel after the exchange writing each local expert's rows padded to ``pad_multiple``
(Megatron-Core passes the FP8 recipe's alignment, ``get_fp8_align_size``) and its unpermute
before the combine, and before its forward exchange a gather of every rank's routing map with a
metadata kernel on it; 16 SMs (``moe_hybridep_num_sms``). Megatron-Core's only backend for a
multi-node NVLink domain (NVL72). Both exchange the same way (``sim.program.dispatch``) and
price their permutations as Transformer Engine's."""


def dispatcher_named(name: str | TokenDispatcher, backend: str = "deepep") -> TokenDispatcher:
    """The strategy of this name (itself, given one); flex runs on ``backend`` (``FLEX_BACKENDS``)."""
    d = _named(TOKEN_DISPATCHERS, TokenDispatcher, name, "moe_token_dispatcher_type", "dispatcher")
    if not d.backend or isinstance(name, TokenDispatcher):
        return d
    return _named(FLEX_BACKENDS, TokenDispatcher, backend, "moe_flex_dispatcher_backend", "moe_flex_dispatcher_backend")


# ------------------------------------------------------------------ attention
@dataclass(frozen=True)
class AttentionMode:
    """How attention runs (``ParallelPlan.attention``)."""

    name: str
    fused: bool
    """One fused kernel (FlashAttention, cuDNN): no s × s scores in memory; False: QKᵀ and AV
    as batched GEMMs with the softmax and dropout over the scores in memory."""


ATTENTION_MODES: dict[str, AttentionMode] = {a.name: a for a in (AttentionMode("flash", True),
                                                           AttentionMode("unfused", False))}


def attention_named(name: str | AttentionMode) -> AttentionMode:
    """The strategy of this name (itself, given one)."""
    return _named(ATTENTION_MODES, AttentionMode, name, "attention", "attention")


# ------------------------------------------------------------------ activation recomputation
@dataclass(frozen=True)
class RecomputePolicy:
    """Megatron-LM's ``--recompute-granularity`` (``sim.inputs.recompute``)."""

    name: str
    whole_layer: bool = False
    """full: each layer's forward re-run in backward from its checkpointed input."""
    by_module: bool = False
    """selective: the modules of ``recompute_modules`` re-run (default the attention core)."""

    @property
    def recomputes(self) -> bool:
        return self.whole_layer or self.by_module


RECOMPUTE_POLICIES: dict[str, RecomputePolicy] = {r.name: r for r in (
    RecomputePolicy("none"), RecomputePolicy("selective", by_module=True), RecomputePolicy("full", whole_layer=True))}


def recompute_named(name: str | RecomputePolicy) -> RecomputePolicy:
    """The strategy of this name (itself, given one)."""
    return _named(RECOMPUTE_POLICIES, RecomputePolicy, name, "recompute", "recompute")


# ------------------------------------------------------------------ ZeRO stages
@dataclass(frozen=True)
class ZeroStage:
    """What a ZeRO stage shards over the data-parallel group (Rajbhandari et al. 2020):
    1 optimizer states, 2 + gradients, 3 + parameters."""

    stage: int

    @property
    def shards_optimizer(self) -> bool:
        return self.stage >= 1

    @property
    def shards_grads(self) -> bool:
        """Gradients reduce-scattered as the backward makes them, not all-reduced at the end."""
        return self.stage >= 2

    @property
    def shards_params(self) -> bool:
        """Each layer's parameters all-gathered before each use (ZeRO-3, FSDP)."""
        return self.stage >= 3

    @property
    def gathers_after_step(self) -> bool:
        """ZeRO-1/2: the updated parameter shards all-gathered once after the optimizer step."""
        return self.shards_optimizer and not self.shards_params

    @property
    def reduce_scatters_each_backward(self) -> bool:
        """ZeRO-2: a reduce-scatter per layer in each backward step (not once at the end, as
        all-reduce does; ZeRO-3's come with its gathers)."""
        return self.shards_grads and not self.shards_params


ZERO: dict[int, ZeroStage] = {s: ZeroStage(s) for s in (0, 1, 2, 3)}


def zero_stage_of(stage: int | ZeroStage) -> ZeroStage:
    """The ZeRO stage of this number (itself, given one)."""
    if isinstance(stage, ZeroStage):
        return stage
    require(stage in ZERO and not isinstance(stage, bool), "zero_stage", stage, "allowed: 0, 1, 2, 3")
    return ZERO[stage]
