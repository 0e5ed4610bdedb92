"""The settings schema: every setting a run takes, as fields of frozen dataclasses.

A run is described by five sections, each a frozen dataclass whose fields carry their
own documentation (``help``, with the unit where there is one), their command-line flag
(Megatron-LM's spelling), their key in an experiment file (``[model]``, ``[cluster]``,
``[plan]``, and DeepSpeed's ``[zero_optimization]`` names), and what values they allow:

    ModelSettings       which model: a preset, a Hugging Face config.json, or its shape
    ClusterSettings     the GPU profile, how many GPUs, the nodes and the fabric
    PlanSettings        parallel sizes, pipeline schedule and split, batch, recompute, ZeRO
    SimulationSettings  fidelity and the event limit
    OutputSettings      where the results go (command line and API only)

TOML files (``sim.inputs.experiment``), keyword arguments of ``sim.run`` and the
command line (``sim.inputs.flags`` builds the flags from the fields) all map straight onto
these fields, and ``check_value`` checks a value the same way whichever way it came:
an error names the field (as the user wrote it), the value and what is allowed.

Adding a setting is one field in its section (here, ``sim.inputs.schema_model`` or
``sim.inputs.schema_sim``; ``sim.inputs.fields.setting`` with its flag and help), then using it where the
run is built (``sim.session``), and a test.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

from sim.errors import InputError
from sim.inputs.fields import SECTION_GROUP, Field, check_section, setting, why_not_field
from sim.inputs.plan import DDP_BUCKET_BYTES
from sim.inputs.schema_model import ModelSettings
from sim.inputs.schema_sim import (  # noqa: F401 (re-exported: the bounds the other modules use)
    AUTO_FULL_FIDELITY_EVENTS, COLLECTIVE_MODELS, DEFAULT_MAX_EVENTS, FIDELITIES, NCCL_ALGOS, NCCL_PROTOCOLS,
    OutputSettings, SimulationSettings)
from sim.inputs.topology_build import FABRICS, OVERSUBSCRIPTION
from sim.units import NONNEGATIVE_INT, POSITIVE_INT, Number

def _gpu_presets() -> str:
    from sim.inputs.hardware import PRESETS

    return ", ".join(PRESETS)


def _schedules() -> str:
    from sim.inputs.plan import SCHEDULES

    return ", ".join(s for s in SCHEDULES if s != "custom")


@dataclass(frozen=True)
class ClusterSettings:
    """The hardware and the cluster: a GPU profile, how many GPUs, and the nodes and
    fabric between them (default: the GPU's DGX node, rail-optimized)."""

    TABLE: ClassVar[str | None] = "cluster"
    GROUP: ClassVar[str | None] = "cluster"

    gpu: str = setting("a100-80gb", help=lambda: f"{_gpu_presets()} or a profile .json (default a100-80gb)",
                       group="hardware", path=lambda v: v.endswith(".json"))
    gpus: int | None = setting(help="total GPUs; data parallelism fills them (default tp x pp)", type=POSITIVE_INT,
                               group="hardware")
    gpus_per_node: int = setting(8, help="GPUs per node (default 8)", type=POSITIVE_INT, group="hardware")
    nodes: int | None = setting(help="nodes in the cluster (default: enough for the plan's GPUs)", type=POSITIVE_INT)
    topology: str | None = setting(help="node or cluster .toml, or a built-in name (default: the GPU's DGX node)",
                                   path=lambda v: v.endswith(".toml"))
    fabric: str | None = setting(help="inter-node fabric (default rail)", choices=FABRICS)
    oversubscription: float | None = setting(help="fat-tree/leaf uplink oversubscription", type=OVERSUBSCRIPTION)

    def __post_init__(self):
        check_section(self)

    def total_gpus(self) -> int | None:
        """``gpus``, or all GPUs of ``nodes`` nodes (None when neither is given)."""
        if self.gpus is not None:
            return self.gpus
        if self.nodes is not None:
            return self.nodes * self.gpus_per_node
        return None


_ZERO = "zero_optimization"  # DeepSpeed's table and names
_EXPERTS = "mixture of experts: parallelism and routing"


@dataclass(frozen=True)
class PlanSettings:
    """How the model is trained on the GPUs: parallel sizes (data parallelism fills the
    GPUs), the pipeline schedule and layer split, batch, recompute and ZeRO."""

    TABLE: ClassVar[str | None] = "plan"
    GROUP: ClassVar[str | None] = "parallelism and batch (Megatron-LM flags)"

    tensor_model_parallel_size: int = setting(1, help="tensor-parallel size: GPUs that split each layer (default 1)",
                                              type=POSITIVE_INT)
    pipeline_model_parallel_size: int = setting(
        1, help="pipeline-parallel size: stages the layers are split into (default 1)", type=POSITIVE_INT)
    num_layers_per_virtual_pipeline_stage: int | None = setting(
        help="layers per model chunk (interleaved schedule; sets vpp)", type=POSITIVE_INT)
    num_virtual_stages_per_pipeline_rank: int | None = setting(
        help="model chunks per pipeline rank (vpp), Megatron-LM's alternative to the flag above", type=POSITIVE_INT)
    schedule: str | None = setting(
        help=lambda: f"pipeline schedule: {_schedules()}, or a schedule .csv file (default 1f1b, interleaved when "
                     "vpp > 1)", metavar="NAME|CSV", path=lambda v: v.endswith(".csv"))
    decoder_first_pipeline_num_layers: int | None = setting(
        help="transformer layers on the first pipeline stage (the rest split evenly)", type=POSITIVE_INT, metavar="N")
    decoder_last_pipeline_num_layers: int | None = setting(
        help="transformer layers on the last pipeline stage (the rest split evenly)", type=POSITIVE_INT, metavar="N")
    layer_split: str | None = setting(
        help="transformer layers per pipeline stage, first to last, e.g. 10,10,12 (uneven stages, as on GPUs "
             "of different speeds), or auto: the split that balances the stages' estimated times on their GPUs",
        metavar="N,N,...|auto")
    account_for_embedding_in_pipeline_split: bool = setting(
        False, help="count the embedding as one layer when splitting layers over stages", kind="switch")
    account_for_loss_in_pipeline_split: bool = setting(
        False, help="count the output layer and loss as one layer when splitting layers over stages", kind="switch")
    placement: str = setting("tp-pp-dp", help="order of tp, pp, dp from innermost (consecutive ranks) to outermost "
                                              "(default tp-pp-dp; Megatron-LM's order is tp-dp-pp)")
    sequence_parallel: bool = setting(False, help="Megatron-LM sequence parallelism in the tensor-parallel group",
                                      kind="switch")
    tp_comm_overlap: bool = setting(False, help="overlap tensor-parallel all-gathers and reduce-scatters with the "
                                    "GEMMs beside them, in tp chunks (Megatron-LM/Transformer Engine; needs "
                                    "--sequence-parallel)", kind="switch")
    context_parallel_size: int = setting(
        1, help="context-parallel size: GPUs each sequence is split over (ring attention or an all-gather of keys "
                "and values; inside the data-parallel dimension, cp innermost; default 1)", type=POSITIVE_INT)
    cp_comm_type: str = setting("p2p", help="how context-parallel attention gets the other chunks' keys and values: "
                                            "p2p (ring attention, overlapped with compute; the default) or "
                                            "all-gather (Llama 3's)", choices=("p2p", "all-gather"))
    expert_model_parallel_size: int = setting(
        1, help="expert-parallel size: GPUs each MoE layer's routed experts are spread over, folded out of each "
                "stage's tp x dp GPUs (default 1)", type=POSITIVE_INT, group=_EXPERTS)
    expert_tensor_parallel_size: int | None = setting(
        help="GPUs each expert is split over (default: the tensor-parallel size)", type=POSITIVE_INT, group=_EXPERTS)
    moe_routing: str = setting(
        "balanced", help="tokens per expert: balanced, zipf:S (expert popularity by rank^-S), dirichlet:A "
                         "(popularity drawn from a Dirichlet of concentration A) or a histogram .json/.csv of "
                         "tokens per expert measured from a router (default balanced)",
        metavar="MODEL|FILE", group=_EXPERTS, path=lambda v: v.endswith((".json", ".csv")))
    moe_expert_capacity_factor: float | None = setting(
        help="expert capacity as a multiple of the balanced load; tokens above it are dropped (default: dropless)",
        type=Number(float, above=0), group=_EXPERTS)
    moe_routing_seed: int = setting(0, help="seed of the routing draws (default 0)", type=int, group=_EXPERTS)
    micro_batch_size: int = setting(1, help="sequences per micro-batch (default 1)", type=POSITIVE_INT)
    global_batch_size: int | None = setting(help="default micro-batch size x data-parallel size", type=POSITIVE_INT)
    recompute_granularity: str = setting("none", help="activation recomputation in backward (default none)",
                                         choices=("none", "selective", "full"))
    attention: str = setting("flash", help="how attention runs: flash (one fused kernel: FlashAttention or cuDNN, "
                                           "Megatron-Core with Transformer Engine; the default) or unfused "
                                           "(Megatron-LM without --use-flash-attn: QK^T and AV as batched GEMMs, "
                                           "softmax and dropout over the s x s scores in memory)",
                             choices=("flash", "unfused"))
    fp8_format: str | None = setting(help="train the transformer layers' GEMMs in FP8 with Transformer Engine: e4m3 "
                                          "(all tensors E4M3) or hybrid (E4M3 forward, E5M2 gradients); needs a GPU "
                                          "with an FP8 peak (H100, H200); default off (BF16)",
                                     choices=("e4m3", "hybrid"))
    zero: int = setting(0, help="ZeRO stage (default 0)", type=int, choices=(0, 1, 2, 3),
                        tables=(("plan", "zero"), (_ZERO, "stage")))
    zero3_prefetch_depth: int | None = setting(help="ZeRO-3: layers whose parameters are gathered ahead (default 1)",
                                               type=NONNEGATIVE_INT, metavar="N")
    zero3_prefetch_bucket_size: float | None = setting(
        help="ZeRO-3: parameters gathered ahead, as DeepSpeed's stage3_prefetch_bucket_size (sets the depth in "
             "whole layers)", type=Number(float, minimum=0), metavar="PARAMS",
        tables=((_ZERO, "stage3_prefetch_bucket_size"),))
    zero3_max_live_parameters: float | None = setting(
        help="ZeRO-3: most gathered parameters alive at once (DeepSpeed stage3_max_live_parameters)",
        type=Number(float, above=0), metavar="PARAMS", tables=((_ZERO, "stage3_max_live_parameters"),))
    zero_bucket_size: str | int | None = setting(
        help="ZeRO-2/3 gradient reduce-scatter bucket, e.g. 500MB (default: --bucket-size)", metavar="BYTES")
    fp8_param_gather: bool = setting(
        False, help="with --fp8-format and a sharded optimizer (--zero 1 or 2): keep the GEMM weights in FP8 and "
                    "all-gather them in FP8 (Megatron-LM's flag, NeMo's fp8_params; default off)", kind="switch")
    overlap_param_gather: bool = setting(
        False, help="ZeRO-1/2: all-gather the updated parameters bucket by bucket during the next step's forward, "
                    "ahead of their first use, instead of after the optimizer step (Megatron-LM's flag, with "
                    "--use-distributed-optimizer; default off)", kind="switch")
    offload_optimizer: bool = setting(
        False, help="ZeRO-Offload: optimizer states in host memory, optimizer step on the CPU", kind="switch",
        tables=((_ZERO, "offload_optimizer"),))
    gradient_accumulation_fusion: bool = setting(
        True, help="weight-gradient GEMMs accumulate into the fp32 main gradients (default on, Megatron-LM's); "
                   "--no-gradient-accumulation-fusion adds each micro-batch's in a separate pass, as plain PyTorch "
                   "does", kind="bool")
    cross_entropy_loss_fusion: bool = setting(
        False, help="the loss's vocab-parallel cross entropy in Megatron-LM's fused kernels (torch.compile: 32 "
                    "bytes per logit over forward and backward, against 52 unfused; default off, as in Megatron-LM)",
        kind="switch")
    overlap_grad_reduce: bool = setting(
        True, help="overlap the data-parallel gradient all-reduce with backward (default on)", kind="bool")
    bucket_size: str | int | None = setting(
        help=f"gradient bucket size, e.g. 25MiB (default {DDP_BUCKET_BYTES // 2**20} MiB, PyTorch DDP's)",
        metavar="BYTES")

    def __post_init__(self):
        check_section(self)


SECTIONS = {"model": ModelSettings, "cluster": ClusterSettings, "plan": PlanSettings,
            "simulation": SimulationSettings, "output": OutputSettings}


@dataclass(frozen=True)
class RunSettings:
    """Everything one simulated iteration takes, section by section."""

    model: ModelSettings = field(default_factory=ModelSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    plan: PlanSettings = field(default_factory=PlanSettings)
    simulation: SimulationSettings = field(default_factory=SimulationSettings)
    output: OutputSettings = field(default_factory=OutputSettings)

    @classmethod
    def from_values(cls, values: Mapping[str, object]) -> "RunSettings":
        """Settings from values by field name (any section); the rest take their defaults."""
        unknown = sorted(set(values) - set(FIELDS))
        if unknown:
            raise InputError(f"{unknown[0]}: unknown setting; allowed: {', '.join(sorted(FIELDS))}")
        return cls(**{name: section_of(sec, values) for name, sec in SECTIONS.items()})

    def values(self) -> dict[str, object]:
        """Every field's value by name (the inverse of ``from_values``)."""
        return {f.name: v for sec in SECTIONS for f, v in _items(getattr(self, sec))}


def _items(obj):
    return [(f, getattr(obj, f.name)) for f in dataclasses.fields(obj)]


def section_of(cls, values: Mapping[str, object]):
    """One section (``PlanSettings``, ...) from values by field name; others are ignored."""
    return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values})


def _resolved(cls, f) -> Field:
    """A field's schema entry with its defaults filled in from its name and section."""
    meta, group = f.metadata["schema"]
    table = cls.TABLE
    return dataclasses.replace(
        meta, flag=meta.flag or "--" + f.name.replace("_", "-"),
        group=cls.GROUP if group is SECTION_GROUP else group,
        tables=meta.tables if meta.tables is not None else (((table, f.name),) if table else ()))


FIELDS: dict[str, Field] = {f.name: _resolved(cls, f) for cls in SECTIONS.values() for f in dataclasses.fields(cls)}
"""Every setting's schema entry, by field name, in section order."""
DEFAULTS: dict[str, object] = {f.name: f.default for cls in SECTIONS.values() for f in dataclasses.fields(cls)}
SECTION_OF: dict[str, str] = {f.name: sec for sec, cls in SECTIONS.items() for f in dataclasses.fields(cls)}


def fields_of(*sections: str) -> list[str]:
    """The field names of the named sections, in order."""
    return [f.name for s in sections for f in dataclasses.fields(SECTIONS[s])]


def why_not(name: str, value) -> str | None:
    """Why ``value`` (a Python value, as from TOML or the API) is not allowed for the
    field ``name``, or None when it is."""
    return why_not_field(FIELDS[name], value)


def tables() -> dict[str, dict[str, str]]:
    """Per experiment-file table, its keys and the field each stands for, in field order."""
    out: dict[str, dict[str, str]] = {}
    for name, f in FIELDS.items():
        for table, key in f.tables:
            out.setdefault(table, {})[key] = name
    return out
