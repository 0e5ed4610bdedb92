"""How a model is spread over GPUs: the parallel plan.

A ``ParallelPlan`` is the execution half of the three inputs (model, hardware, plan),
kept apart as Calculon keeps them: data-parallel (``dp``), tensor-parallel (``tp``,
Megatron's column/row split) and pipeline-parallel (``pp``) degrees with
``dp · tp · pp = world_size``, virtual pipeline chunks per GPU (``vpp``), the pipeline
schedule, Megatron sequence parallelism, micro-batching, activation recomputation, the
ZeRO stage, DDP's gradient buckets, where ranks sit (``placement``, see
``sim.inputs.placement``) and how layers are split over pipeline stages. Like torchtitan's
``ParallelDims``, it checks itself on construction and a bad value is a one-line
``InputError`` naming the factor; checks that need the model (heads divisible by tp,
layers splittable over the stages) live in ``check_model``.

Layer split (Megatron-LM's ``get_num_layers_to_build`` and
``get_transformer_layer_offset``). Virtual stage ``c·pp + r`` is model chunk c of
pipeline rank r, so the model runs through rank 0..pp−1 with chunk 0, then again with
chunk 1, and so on. By default the ``num_layers`` split evenly over the ``pp·vpp``
virtual stages. Two ways to balance unevenly, which Megatron-LM will not combine:

* ``first_stage_layers`` / ``last_stage_layers`` (``--decoder-first-pipeline-num-layers``,
  ``--decoder-last-pipeline-num-layers``) fix the layers on the first / last pipeline
  rank; the remaining layers split evenly over the middle ranks, and every rank's layers
  split evenly over its vpp chunks.
* ``account_for_embedding`` / ``account_for_loss`` (``--account-for-embedding-in-pipeline-split``,
  ``--account-for-loss-in-pipeline-split``) count the embedding and the output layer with
  its loss as one transformer layer each: the ``num_layers + 1 (+1)`` "layers" split
  evenly over the virtual stages and the first (last) virtual stage builds one real layer
  fewer. Llama 3 405B's 126 layers on 16 stages become 7, 8 × 14, 7 (Llama 3 paper,
  §3.3.2; the Zero Bubble paper balances the same way).

The embedding always runs on virtual stage 0 and the output layer and loss on the last
virtual stage, whichever split is used.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

from sim.inputs import placement as _pl
from sim.inputs.context import check_context_model, check_context_plan
from sim.inputs.experts import check_expert_model, check_expert_plan
from sim.inputs.layer_split import FIRST, LAST, check_layer_split, split_layers
from sim.errors import require

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "unfused")
FP8_FORMATS = ("e4m3", "hybrid")
"""Transformer Engine's FP8 formats (Megatron-LM ``--fp8-format``): all tensors E4M3, or E4M3
forward and E5M2 gradients."""
CROSS_ENTROPY = ("megatron", "megatron-fused", "pytorch")
"""How the loss is computed over the logits (``sim.program.workload.head_work``):
Megatron-LM's vocab-parallel cross entropy (its default), the same fused by
``--cross-entropy-loss-fusion``, or ``torch.nn.functional.cross_entropy`` in the training
dtype (tp 1 only; what ``trainsim validate``'s reference runs)."""
ZERO_STAGES = (0, 1, 2, 3)
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "custom")
DDP_BUCKET_BYTES = 25 * 2**20
"""PyTorch DDP's default bucket: ``bucket_cap_mb=25``, i.e. 25 MiB (torch.nn.parallel.DistributedDataParallel)."""



def _pos(field: str, value) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
            f"plan: {field}", value, "expected an integer > 0")


def _bool(field: str, value) -> None:
    require(isinstance(value, bool), f"plan: {field}", value, "expected true or false")


@dataclass(frozen=True)
class ParallelPlan:
    """Parallel degrees, schedule, batching, recompute, ZeRO stage and rank placement of one run."""

    dp: int = 1
    """Data-parallel replicas (each replica is tp·pp GPUs)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron column/row split of every layer)."""
    pp: int = 1
    """Pipeline stages."""
    vpp: int = 1
    """Model chunks per pipeline stage (interleaved 1F1B when > 1)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms, dropout and residuals split over the tp group.
    A no-op when tp = 1 (as in Megatron-LM)."""
    tp_comm_overlap: bool = False
    """Overlap tensor-parallel all-gathers and reduce-scatters with the GEMMs beside them,
    in tp chunks (Megatron-LM ``--tp-comm-overlap``, Transformer Engine's userbuffers;
    needs sequence parallelism; ``sim.program.tp``)."""
    gradient_accumulation_fusion: bool = True
    """Weight-gradient GEMMs accumulate into the fp32 main gradients themselves (Megatron-LM's
    default); False adds each micro-batch's weight gradients in a separate pass
    (``--no-gradient-accumulation-fusion``, plain PyTorch; ``sim.program.ops.accumulate_wgrads``)."""
    cross_entropy: str = "megatron"
    """``CROSS_ENTROPY``: the loss's kernels over the b·s × V/t logits."""
    micro_batch_size: int = 1
    """Sequences per micro-batch per data-parallel replica (b)."""
    global_batch_size: int | None = None
    """Sequences per optimizer step over all replicas (B); None means micro_batch_size·dp."""
    recompute: str = "none"
    """Activation recomputation: 'none', 'selective' (attention core) or 'full' (whole layer)."""
    attention: str = "flash"
    """'flash': attention is one fused kernel that never writes the s×s scores
    (FlashAttention, cuDNN); 'unfused': Megatron-LM's original core attention (batched
    GEMMs around a fused scale-mask-softmax and dropout over the scores in memory)."""
    fp8_format: str | None = None
    """FP8 training with Transformer Engine (``sim.program.fp8``): 'e4m3' or 'hybrid'
    (Megatron-LM ``--fp8-format``); the transformer layers' GEMMs run in FP8. None: BF16."""
    zero_stage: int = 0
    """ZeRO stage over the dp group: 0 none, 1 optimizer states, 2 +gradients, 3 +parameters."""
    schedule: str | None = None
    """Pipeline schedule: 'gpipe', '1f1b' (PipeDream-Flush), 'interleaved' (interleaved
    1F1B, needs vpp > 1 and micro-batches a multiple of pp, Megatron-LM's rule), 'zb-h1',
    'zb-h2' (Zero Bubble, Qi et al. ICLR 2024) or 'custom' (a user's schedule CSV). gpipe,
    1f1b and zb-* run one chunk per stage (vpp = 1). None picks '1f1b', or 'interleaved'
    when vpp > 1 (what Megatron-LM runs for the same flags); after construction it is
    always one of the names."""
    dp_overlap: bool = True
    """Overlap the data-parallel gradient sync with backward (DDP buckets are reduced as
    soon as their gradients are ready); False syncs after the whole backward."""
    bucket_size_bytes: int = DDP_BUCKET_BYTES
    """DDP gradient bucket size in bytes; default PyTorch DDP's ``bucket_cap_mb=25`` (25 MiB)."""
    placement: str = _pl.DEFAULT_PLACEMENT
    """Order of the parallel dimensions from innermost (consecutive global ranks) to
    outermost, a permutation of tp, pp, dp joined by '-'. Default 'tp-pp-dp': TP inside a
    node, then the pipeline stages of a replica, then the replicas. (Megatron-LM's own
    default order is tp-dp-pp, i.e. 'tp-dp-pp' here.)"""
    first_stage_layers: int | None = None
    """Transformer layers on the first pipeline rank (Megatron-LM
    ``--decoder-first-pipeline-num-layers``); None: an even share. A multiple of vpp."""
    last_stage_layers: int | None = None
    """Transformer layers on the last pipeline rank (``--decoder-last-pipeline-num-layers``);
    None: an even share. A multiple of vpp."""
    layer_split: tuple[int, ...] | None = None
    """Transformer layers on each pipeline rank, first to last (``--layer-split``; pp entries,
    each a multiple of vpp, split evenly over the rank's chunks); None: the split above."""
    account_for_embedding: bool = False
    """Count the embedding as one layer when splitting layers over stages
    (``--account-for-embedding-in-pipeline-split``): the first virtual stage gets one fewer."""
    account_for_loss: bool = False
    """Count the output layer and loss as one layer when splitting
    (``--account-for-loss-in-pipeline-split``): the last virtual stage gets one fewer."""
    zero3_prefetch_depth: int = 1
    """ZeRO-3: layers whose parameters are all-gathered ahead of the one computing
    (0: each gather waits until its layer is needed). DeepSpeed sets the same thing in
    parameters with ``stage3_prefetch_bucket_size``."""
    zero_bucket_size_bytes: int | None = None
    """ZeRO-2/3 gradient reduce-scatter bucket (DeepSpeed ``reduce_bucket_size``, in bytes
    here); None uses ``bucket_size_bytes``."""
    zero3_max_live_parameters: float | None = None
    """ZeRO-3: most gathered parameters alive at once (DeepSpeed
    ``stage3_max_live_parameters``); caps the prefetch depth. None: no cap."""
    fp8_param_gather: bool = False
    """FP8 weights, all-gathered in FP8 (Megatron-LM ``--fp8-param-gather``; ``sim.program.fp8``)."""
    param_gather_overlap: bool = False
    """ZeRO-1/2: the updated parameters all-gathered in the next step's forward, ahead of
    each bucket's first use (Megatron-LM ``--overlap-param-gather``), not after the step."""
    offload_optimizer: bool = False
    """ZeRO-Offload: optimizer states live in host memory and the optimizer step runs on
    the CPU; gradients go to the host and updated parameters come back over PCIe."""
    cp: int = 1
    """Context-parallel size: GPUs each sequence is split over (``sim.program.context``).
    They sit inside the data-parallel dimension, cp innermost (each replica's cp GPUs
    consecutive along it), and reduce gradients with it: ``dp_group`` has dp·cp ranks."""
    cp_comm_type: str = "p2p"
    """How context-parallel attention gets the other chunks' keys and values: 'p2p'
    (ring attention, Megatron's default) or 'all-gather' (Llama 3's)."""
    ep: int = 1
    """Expert-parallel size: the GPUs a layer's routed experts are spread over, carved out
    of each stage's tp × dp GPUs (``sim.inputs.experts``)."""
    etp: int | None = None
    """Expert tensor-parallel size (each expert split over etp GPUs); None means tp."""
    moe_routing: str = "balanced"
    """Tokens per expert: 'balanced', 'zipf:S', 'dirichlet:A' or a histogram file (``sim.program.routing``)."""
    moe_capacity_factor: float | None = None
    """Expert capacity as a multiple of the balanced load (tokens above it are dropped); None: dropless."""
    moe_seed: int = 0
    """Seed of the routing draws."""

    def __post_init__(self):
        for f in ("dp", "tp", "pp", "vpp", "micro_batch_size"):
            _pos(f, getattr(self, f))
        if self.global_batch_size is None:
            object.__setattr__(self, "global_batch_size", self.micro_batch_size * self.dp)
        _pos("global_batch_size", self.global_batch_size)
        for f in ("sequence_parallel", "dp_overlap", "account_for_embedding", "account_for_loss", "tp_comm_overlap",
                  "gradient_accumulation_fusion", "param_gather_overlap", "fp8_param_gather", "offload_optimizer"):
            _bool(f, getattr(self, f))
        require(not self.tp_comm_overlap or self.tp == 1 or self.sequence_parallel, "plan: tp_comm_overlap", True,
                "it needs sequence_parallel (Megatron-LM's --tp-comm-overlap overlaps the sequence-parallel "
                "all-gathers and reduce-scatters)")
        require(self.cross_entropy in CROSS_ENTROPY, "plan: cross_entropy", self.cross_entropy,
                f"allowed: {', '.join(CROSS_ENTROPY)}")
        require(self.cross_entropy != "pytorch" or self.tp == 1, "plan: cross_entropy", self.cross_entropy,
                "pytorch's cross entropy needs the whole vocabulary on one GPU (tp 1); use megatron or megatron-fused")
        require(self.attention in ATTENTION, "plan: attention", self.attention, f"allowed: {', '.join(ATTENTION)}")
        require(self.fp8_format is None or self.fp8_format in FP8_FORMATS, "plan: fp8_format", self.fp8_format,
                f"allowed: {', '.join(FP8_FORMATS)}, or None for BF16")
        require(self.recompute in RECOMPUTE, "plan: recompute", self.recompute,
                f"allowed: {', '.join(RECOMPUTE)}")
        require(self.zero_stage in ZERO_STAGES and not isinstance(self.zero_stage, bool),
                "plan: zero_stage", self.zero_stage, "allowed: 0, 1, 2, 3")
        per_step = self.micro_batch_size * self.dp
        require(self.global_batch_size % per_step == 0, "plan: global_batch_size",
                self.global_batch_size,
                f"must be a multiple of micro_batch_size x dp = {self.micro_batch_size} x {self.dp} = {per_step}")
        if self.vpp > 1:
            require(self.pp > 1, "plan: vpp", self.vpp, "interleaving needs pp > 1")
        self._check_schedule()
        _pos("bucket_size_bytes", self.bucket_size_bytes)
        require(isinstance(self.zero3_prefetch_depth, int) and not isinstance(self.zero3_prefetch_depth, bool)
                and self.zero3_prefetch_depth >= 0, "plan: zero3_prefetch_depth", self.zero3_prefetch_depth,
                "expected an integer >= 0")
        if self.zero_bucket_size_bytes is not None:
            _pos("zero_bucket_size_bytes", self.zero_bucket_size_bytes)
        if self.zero3_max_live_parameters is not None:
            require(isinstance(self.zero3_max_live_parameters, (int, float))
                    and not isinstance(self.zero3_max_live_parameters, bool)
                    and math.isfinite(self.zero3_max_live_parameters) and self.zero3_max_live_parameters > 0,
                    "plan: zero3_max_live_parameters", self.zero3_max_live_parameters,
                    "expected a finite number > 0 (leave it unset for no cap)")
        require(not self.param_gather_overlap or self.zero_stage in (1, 2), "plan: param_gather_overlap", True,
                f"needs ZeRO stage 1 or 2 (got {self.zero_stage}): it overlaps the sharded optimizer's parameter "
                "all-gather (ZeRO-3 gathers every layer before each use anyway)")
        require(not self.fp8_param_gather or (self.fp8_format is not None and self.zero_stage in (1, 2)),
                "plan: fp8_param_gather", True, "needs fp8_format and ZeRO stage 1 or 2 (the weights it gathers in "
                f"FP8 are the sharded optimizer's; got fp8_format {self.fp8_format}, zero_stage {self.zero_stage})")
        require(not (self.param_gather_overlap and self.offload_optimizer), "plan: param_gather_overlap", True,
                "not with offload_optimizer (the parameters come back from the host)")
        require(not self.offload_optimizer or self.zero_stage >= 1, "plan: offload_optimizer", True,
                "needs ZeRO stage 1, 2 or 3 (the optimizer states offloaded are the sharded ones)")
        _pl.parse_placement(self.placement)
        self._check_uneven()
        check_expert_plan(self)
        check_context_plan(self)

    def _check_schedule(self) -> None:
        if self.schedule is None:
            object.__setattr__(self, "schedule", "interleaved" if self.vpp > 1 else "1f1b")
        s = self.schedule
        require(s in SCHEDULES, "plan: schedule", s, f"allowed: {', '.join(SCHEDULES)}")
        if self.vpp > 1:
            require(s in ("interleaved", "custom"), "plan: vpp", self.vpp,
                    f"schedule {s!r} runs one model chunk per stage (vpp = 1); "
                    "use schedule 'interleaved' (or 'custom') for vpp > 1")
        elif s == "interleaved":
            require(self.pp == 1, "plan: schedule", s,
                    "interleaved 1F1B needs vpp > 1 model chunks per stage "
                    "(--num-layers-per-virtual-pipeline-stage)")
        if s == "interleaved":
            require(self.num_microbatches % self.pp == 0, "plan: global_batch_size",
                    self.global_batch_size,
                    f"interleaved 1F1B needs the number of micro-batches ({self.num_microbatches}) "
                    f"to be a multiple of pp = {self.pp} (Megatron-LM's rule)")

    def _check_uneven(self) -> None:
        if self.layer_split is not None:
            check_layer_split(self)
        for field, value in ((FIRST, self.first_stage_layers), (LAST, self.last_stage_layers)):
            if value is None:
                continue
            _pos(field, value)
            require(self.pp > 1, f"plan: {field}", value, "an uneven first/last stage needs pp > 1")
            require(value % self.vpp == 0, f"plan: {field}", value,
                    f"must be a multiple of vpp = {self.vpp} (each of the stage's chunks gets the same layers)")
            require(not (self.account_for_embedding or self.account_for_loss), f"plan: {field}", value,
                    "cannot be combined with account_for_embedding / account_for_loss "
                    "(Megatron-LM rejects the combination too)")

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def dp_cp(self) -> int:
        """Ranks a stage's parameters are replicated over, and its gradients reduced and ZeRO
        states sharded over: data × context parallel (Megatron's data-parallel group with CP)."""
        return self.dp * self.cp

    def cp_group(self, rank: int) -> tuple:
        """Global ranks of ``rank``'s context-parallel group (consecutive along dp), by cp index."""
        d, p, t = self.coords(rank)
        base = d - d % self.cp
        return tuple(self.rank(dp=base + i, pp=p, tp=t) for i in range(self.cp))

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per replica (m)."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def sp(self) -> bool:
        """Whether sequence parallelism is in effect (requested and tp > 1)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def num_virtual_stages(self) -> int:
        """pp · vpp: the model chunks the layers are split into."""
        return self.pp * self.vpp

    @property
    def uneven(self) -> bool:
        """Whether any of the uneven-split options is set."""
        return (self.first_stage_layers is not None or self.last_stage_layers is not None
                or self.layer_split is not None
                or self.account_for_embedding or self.account_for_loss)

    # ------------------------------------------------------------- placement
    def _sizes(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp * self.cp}

    @property
    def placement_order(self) -> tuple:
        """The dimensions innermost first, e.g. ('tp', 'pp', 'dp')."""
        return _pl.parse_placement(self.placement)

    def coords(self, rank: int) -> tuple:
        """``(dp_index, pp_index, tp_index)`` of global ``rank`` under ``placement``; with
        context parallelism the dp index runs over dp·cp, the cp index innermost."""
        c = _pl.coords(rank, self.placement_order, self._sizes())
        return c["dp"], c["pp"], c["tp"]

    def rank(self, dp: int = 0, pp: int = 0, tp: int = 0) -> int:
        """The global rank with these indices (the inverse of ``coords``)."""
        return _pl.rank_of({"dp": dp, "pp": pp, "tp": tp}, self.placement_order, self._sizes())

    def tp_group(self, rank: int) -> tuple:
        """Global ranks of ``rank``'s tensor-parallel group, by tp index."""
        return _pl.group(rank, "tp", self.placement_order, self._sizes())

    def pp_group(self, rank: int) -> tuple:
        """Global ranks of ``rank``'s pipeline, by stage."""
        return _pl.group(rank, "pp", self.placement_order, self._sizes())

    def dp_group(self, rank: int) -> tuple:
        """Global ranks of ``rank``'s data-parallel group, by replica."""
        return _pl.group(rank, "dp", self.placement_order, self._sizes())

    def groups(self, dim: str) -> tuple:
        """Every group along ``dim`` ('tp', 'pp' or 'dp'), ordered by first member."""
        return _pl.groups(dim, self.placement_order, self._sizes())

    def max_nodes_spanned(self, dim: str, gpus_per_node: int) -> int:
        """The most nodes a ``dim`` group touches (1: all stay inside a node)."""
        return _pl.max_nodes_spanned(dim, self.placement_order, self._sizes(), gpus_per_node)

    # ----------------------------------------------------------- layer split
    def stage_layers(self, model) -> tuple:
        """Transformer layers of each virtual stage; index ``chunk·pp + pp_rank``."""
        return split_layers(model.num_layers, self.pp, self.vpp, self.first_stage_layers,
                            self.last_stage_layers, self.account_for_embedding,
                            self.account_for_loss, getattr(model, "name", "the model"), self.layer_split)

    def layer_range(self, model, virtual_stage: int) -> range:
        """Global indices of the transformer layers of ``virtual_stage``."""
        n = self.num_virtual_stages
        require(isinstance(virtual_stage, int) and 0 <= virtual_stage < n, "virtual_stage", virtual_stage,
                f"expected 0..{n - 1} (pp x vpp = {self.pp} x {self.vpp})")
        layers = self.stage_layers(model)
        start = sum(layers[:virtual_stage])
        return range(start, start + layers[virtual_stage])

    def layers_per_chunk(self, model) -> int:
        """Layers in each model chunk when the split is even (a stage holds vpp chunks)."""
        layers = set(self.stage_layers(model))
        require(len(layers) == 1, "plan: layer split", self.stage_layers(model),
                "chunks differ in size; use stage_layers(model) for an uneven split")
        return layers.pop()

    @classmethod
    def for_world(cls, world_size: int, **kw) -> "ParallelPlan":
        """A plan whose dp fills ``world_size`` given tp and pp (each must divide it)."""
        _pos("world_size", world_size)
        tp, pp, cp = kw.get("tp", 1), kw.get("pp", 1), kw.get("cp", 1)
        _pos("tp", tp)
        _pos("pp", pp)
        _pos("cp", cp)
        names, sizes = ("tp x pp", f"{tp} x {pp}") if cp == 1 else ("tp x pp x cp", f"{tp} x {pp} x {cp}")
        require(world_size % (tp * pp * cp) == 0, "plan: world_size", world_size,
                f"must be a multiple of {names} = {sizes} = {tp * pp * cp}")
        return cls(dp=world_size // (tp * pp * cp), **kw)

    def check_model(self, model) -> None:
        """Checks that need the model: each factor must split the layer it cuts, and the
        layers must split over the (virtual) pipeline stages."""
        self.stage_layers(model)
        for field, value in (("num_attention_heads", model.num_attention_heads),
                             ("num_key_value_heads", model.num_key_value_heads),
                             ("ffn_hidden_size", model.ffn_hidden_size)):
            require(value % self.tp == 0, "plan: tp", self.tp,
                    f"must divide {field} {value} of {model.name}")
        check_expert_model(self, model)
        check_context_model(self, model)

    @property
    def etp_size(self) -> int:
        """Expert tensor-parallel size in effect (``etp``, default tp)."""
        return self.tp if self.etp is None else self.etp
