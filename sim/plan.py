"""How a model is spread over GPUs: the parallel plan.

A ``ParallelPlan`` is the execution half of the three inputs (model, hardware, plan),
kept apart as Calculon keeps them: data-parallel (``dp``), tensor-parallel (``tp``,
Megatron's column/row split) and pipeline-parallel (``pp``) degrees with
``dp · tp · pp = world_size``, virtual pipeline chunks per GPU (``vpp``, interleaved
1F1B), Megatron sequence parallelism, micro-batching, activation recomputation and the
ZeRO stage. Like torchtitan's ``ParallelDims``, it checks itself on construction and a
bad value is a one-line error naming the factor; checks that need the model (heads
divisible by tp, layers by pp·vpp) live in ``check_model``.

Later issues extend the plan (rank placement, schedule choice, uneven stages) by adding
fields with defaults, so existing callers keep working.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import require

RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)


def _pos(field: str, value) -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
            f"plan: {field}", value, "expected an integer > 0")


@dataclass(frozen=True)
class ParallelPlan:
    """Parallel degrees, batching, recompute and ZeRO stage of one training run."""

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
    micro_batch_size: int = 1
    """Sequences per micro-batch per data-parallel replica (b)."""
    global_batch_size: int | None = None
    """Sequences per optimizer step over all replicas (B); None means micro_batch_size·dp."""
    recompute: str = "none"
    """Activation recomputation: 'none', 'selective' (attention core) or 'full' (whole layer)."""
    zero_stage: int = 0
    """ZeRO stage over the dp group: 0 none, 1 optimizer states, 2 +gradients, 3 +parameters."""

    def __post_init__(self):
        for f in ("dp", "tp", "pp", "vpp", "micro_batch_size"):
            _pos(f, getattr(self, f))
        if self.global_batch_size is None:
            object.__setattr__(self, "global_batch_size", self.micro_batch_size * self.dp)
        _pos("global_batch_size", self.global_batch_size)
        require(isinstance(self.sequence_parallel, bool), "plan: sequence_parallel",
                self.sequence_parallel, "expected true or false")
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
            require(self.num_microbatches % self.pp == 0, "plan: global_batch_size",
                    self.global_batch_size,
                    f"interleaved 1F1B needs the number of micro-batches ({self.num_microbatches}) "
                    f"to be a multiple of pp = {self.pp}")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per replica (m)."""
        return self.global_batch_size // (self.micro_batch_size * self.dp)

    @property
    def sp(self) -> bool:
        """Whether sequence parallelism is in effect (requested and tp > 1)."""
        return self.sequence_parallel and self.tp > 1

    def layers_per_chunk(self, model) -> int:
        """Layers in each model chunk (a stage holds vpp chunks)."""
        self.check_model(model)
        return model.num_layers // (self.pp * self.vpp)

    @classmethod
    def for_world(cls, world_size: int, **kw) -> "ParallelPlan":
        """A plan whose dp fills ``world_size`` given tp and pp (each must divide it)."""
        _pos("world_size", world_size)
        tp, pp = kw.get("tp", 1), kw.get("pp", 1)
        _pos("tp", tp)
        _pos("pp", pp)
        require(world_size % (tp * pp) == 0, "plan: world_size", world_size,
                f"must be a multiple of tp x pp = {tp} x {pp} = {tp * pp}")
        return cls(dp=world_size // (tp * pp), **kw)

    def check_model(self, model) -> None:
        """Checks that need the model: each factor must split the layer it cuts."""
        require(model.num_layers % (self.pp * self.vpp) == 0, "plan: pp x vpp",
                f"{self.pp} x {self.vpp}",
                f"must divide num_layers {model.num_layers} of {model.name}")
        for field, value in (("num_attention_heads", model.num_attention_heads),
                             ("num_key_value_heads", model.num_key_value_heads),
                             ("ffn_hidden_size", model.ffn_hidden_size)):
            require(value % self.tp == 0, "plan: tp", self.tp,
                    f"must divide {field} {value} of {model.name}")
