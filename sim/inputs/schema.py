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

Adding a setting is one field here (with its flag and help), then using it where the
run is built (``sim.session``), and a test.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Mapping

from sim.errors import InputError
from sim.inputs.plan import DDP_BUCKET_BYTES
from sim.inputs.topology_build import FABRICS, OVERSUBSCRIPTION
from sim.units import FRACTION, NONNEGATIVE_INT, POSITIVE_INT, Number

# Bounds shared with the modules that use the values.
DEFAULT_MAX_EVENTS = 100_000_000
"""Largest simulation attempted without ``--max-events``: about 10-20 minutes of
engine time and several GB of memory."""
FIDELITIES = ("auto", "full", "reduced")


@dataclass(frozen=True)
class Field:
    """What the schema knows of one setting besides its name and default."""

    flag: str
    """The command-line flag (Megatron-LM's spelling where Megatron has it)."""
    help: str | Callable[[], str] | None = None
    """What it is and its unit (a callable when the text lists what is installed)."""
    type: Callable | None = None
    """How a command-line string becomes the value (a ``sim.units.Number``, ``int``, ...)."""
    choices: tuple | None = None
    kind: str = "value"
    """``value`` (takes one argument), ``switch`` (present = true) or ``bool`` (``--x``/``--no-x``)."""
    metavar: str | None = None
    group: str | None = None
    """The ``--help`` section it is listed in (None: the command's own options)."""
    tables: tuple[tuple[str, str], ...] = ()
    """(experiment-file table, key) pairs it may be written under."""
    path: Callable[[str], bool] | None = None
    """For values that may name a file: which strings do (resolved against the experiment file)."""


def setting(default=None, *, flag: str, help: str | None = None, type=None, choices=None, kind: str = "value",
            metavar: str | None = None, group: str | None = None, tables=(), path=None):
    """A dataclass field with its schema entry (``Field``) in the metadata."""
    return field(default=default, metadata={"schema": Field(
        flag, help, type, tuple(choices) if choices is not None else None, kind, metavar, group, tuple(tables), path)})


_MODEL_SRC = "model (one of)"
_SHAPE = "model shape (Megatron-LM flags)"
_HW = "hardware"
_PAR = "parallelism and batch (Megatron-LM flags)"
_CLUSTER = "cluster"


def _model_presets() -> str:
    from sim.inputs.model import PRESETS

    return ", ".join(PRESETS)


def _gpu_presets() -> str:
    from sim.inputs.hardware import PRESETS

    return ", ".join(PRESETS)


def _schedules() -> str:
    from sim.inputs.plan import SCHEDULES

    return ", ".join(s for s in SCHEDULES if s != "custom")


def _m(key: str | None = None):
    return (("model", key),) if key else ()


@dataclass(frozen=True)
class ModelSettings:
    """Which model is trained: exactly one of a preset, a Hugging Face config.json, or
    Megatron-LM's shape flags (``num_layers``, ``hidden_size``, ...)."""

    model: str | None = setting(flag="--model", metavar="PRESET", group=_MODEL_SRC, tables=(("model", "preset"),),
                                help=lambda: f"one of: {_model_presets()}")
    hf_config: str | None = setting(flag="--hf-config", metavar="PATH", group=_MODEL_SRC, tables=_m("hf_config"),
                                    help="a Hugging Face config.json", path=lambda v: True)
    num_layers: int | None = setting(flag="--num-layers", type=POSITIVE_INT, group=_SHAPE, tables=_m("num_layers"))
    hidden_size: int | None = setting(flag="--hidden-size", type=POSITIVE_INT, group=_SHAPE, tables=_m("hidden_size"))
    num_attention_heads: int | None = setting(flag="--num-attention-heads", type=POSITIVE_INT, group=_SHAPE,
                                              tables=_m("num_attention_heads"))
    ffn_hidden_size: int | None = setting(flag="--ffn-hidden-size", type=POSITIVE_INT, group=_SHAPE,
                                          tables=_m("ffn_hidden_size"), help="default 4 x hidden size (GeLU) ")
    vocab_size: int | None = setting(flag="--vocab-size", type=POSITIVE_INT, group=_SHAPE, tables=_m("vocab_size"))
    seq_length: int | None = setting(flag="--seq-length", type=POSITIVE_INT, group=_SHAPE, tables=_m("seq_length"))
    """Tokens per sequence."""
    max_position_embeddings: int | None = setting(flag="--max-position-embeddings", type=POSITIVE_INT, group=_SHAPE,
                                                  tables=_m("max_position_embeddings"))
    group_query_attention: bool = setting(False, flag="--group-query-attention", kind="switch", group=_SHAPE,
                                          tables=_m("group_query_attention"))
    num_query_groups: int | None = setting(flag="--num-query-groups", type=POSITIVE_INT, group=_SHAPE,
                                           tables=_m("num_query_groups"))
    swiglu: bool = setting(False, flag="--swiglu", kind="switch", group=_SHAPE, tables=_m("swiglu"))
    normalization: str = setting("LayerNorm", flag="--normalization", choices=("LayerNorm", "RMSNorm"), group=_SHAPE,
                                 tables=_m("normalization"))
    position_embedding_type: str = setting("learned_absolute", flag="--position-embedding-type",
                                           choices=("learned_absolute", "rope"), group=_SHAPE,
                                           tables=_m("position_embedding_type"))
    untie_embeddings_and_output_weights: bool = setting(False, flag="--untie-embeddings-and-output-weights",
                                                        kind="switch", group=_SHAPE,
                                                        tables=_m("untie_embeddings_and_output_weights"))
    disable_bias_linear: bool = setting(False, flag="--disable-bias-linear", kind="switch", group=_SHAPE,
                                        tables=_m("disable_bias_linear"))
    attention_dropout: float = setting(0.1, flag="--attention-dropout", type=FRACTION, group=_SHAPE,
                                       tables=_m("attention_dropout"))
    hidden_dropout: float = setting(0.1, flag="--hidden-dropout", type=FRACTION, group=_SHAPE,
                                    tables=_m("hidden_dropout"))

    def __post_init__(self):
        _check_section(self)


def _c(key: str):
    return (("cluster", key),)


@dataclass(frozen=True)
class ClusterSettings:
    """The hardware and the cluster: a GPU profile, how many GPUs, and the nodes and
    fabric between them (default: the GPU's DGX node, rail-optimized)."""

    gpu: str = setting("a100-80gb", flag="--gpu", group=_HW, tables=_c("gpu"), path=lambda v: v.endswith(".json"),
                       help=lambda: f"{_gpu_presets()} or a profile .json (default a100-80gb)")
    gpus: int | None = setting(flag="--gpus", type=POSITIVE_INT, group=_HW, tables=_c("gpus"),
                               help="total GPUs; data parallelism fills them (default tp x pp)")
    gpus_per_node: int = setting(8, flag="--gpus-per-node", type=POSITIVE_INT, group=_HW, tables=_c("gpus_per_node"))
    nodes: int | None = setting(flag="--nodes", type=POSITIVE_INT, group=_CLUSTER, tables=_c("nodes"),
                                help="nodes in the cluster (default: enough for the plan's GPUs)")
    topology: str | None = setting(flag="--topology", group=_CLUSTER, tables=_c("topology"),
                                   path=lambda v: v.endswith(".toml"),
                                   help="node or cluster .toml, or a built-in name (default: the GPU's DGX node)")
    fabric: str | None = setting(flag="--fabric", choices=FABRICS, group=_CLUSTER, tables=_c("fabric"),
                                 help="inter-node fabric (default rail)")
    oversubscription: float | None = setting(flag="--oversubscription", type=OVERSUBSCRIPTION, group=_CLUSTER,
                                             tables=_c("oversubscription"),
                                             help="fat-tree/leaf uplink oversubscription")

    def __post_init__(self):
        _check_section(self)

    def total_gpus(self) -> int | None:
        """``gpus``, or all GPUs of ``nodes`` nodes (None when neither is given)."""
        if self.gpus is not None:
            return self.gpus
        if self.nodes is not None:
            return self.nodes * self.gpus_per_node
        return None


def _p(key: str):
    return (("plan", key),)


def _z(key: str):
    return (("zero_optimization", key),)


@dataclass(frozen=True)
class PlanSettings:
    """How the model is trained on the GPUs: parallel sizes (data parallelism fills the
    GPUs), the pipeline schedule and layer split, batch, recompute and ZeRO."""

    tensor_model_parallel_size: int = setting(1, flag="--tensor-model-parallel-size", type=POSITIVE_INT, group=_PAR,
                                              tables=_p("tensor_model_parallel_size"))
    pipeline_model_parallel_size: int = setting(1, flag="--pipeline-model-parallel-size", type=POSITIVE_INT,
                                                group=_PAR, tables=_p("pipeline_model_parallel_size"))
    num_layers_per_virtual_pipeline_stage: int | None = setting(
        flag="--num-layers-per-virtual-pipeline-stage", type=POSITIVE_INT, group=_PAR,
        tables=_p("num_layers_per_virtual_pipeline_stage"))
    num_virtual_stages_per_pipeline_rank: int | None = setting(
        flag="--num-virtual-stages-per-pipeline-rank", type=POSITIVE_INT, group=_PAR,
        tables=_p("num_virtual_stages_per_pipeline_rank"),
        help="model chunks per pipeline rank (vpp), Megatron-LM's alternative to the flag above")
    schedule: str | None = setting(flag="--schedule", metavar="NAME|CSV", group=_PAR, tables=_p("schedule"),
                                   path=lambda v: v.endswith(".csv"),
                                   help=lambda: f"pipeline schedule: {_schedules()}, or a schedule .csv file "
                                                "(default 1f1b, interleaved when vpp > 1)")
    decoder_first_pipeline_num_layers: int | None = setting(
        flag="--decoder-first-pipeline-num-layers", type=POSITIVE_INT, metavar="N", group=_PAR,
        tables=_p("decoder_first_pipeline_num_layers"),
        help="transformer layers on the first pipeline stage (the rest split evenly)")
    decoder_last_pipeline_num_layers: int | None = setting(
        flag="--decoder-last-pipeline-num-layers", type=POSITIVE_INT, metavar="N", group=_PAR,
        tables=_p("decoder_last_pipeline_num_layers"),
        help="transformer layers on the last pipeline stage (the rest split evenly)")
    account_for_embedding_in_pipeline_split: bool = setting(
        False, flag="--account-for-embedding-in-pipeline-split", kind="switch", group=_PAR,
        tables=_p("account_for_embedding_in_pipeline_split"),
        help="count the embedding as one layer when splitting layers over stages")
    account_for_loss_in_pipeline_split: bool = setting(
        False, flag="--account-for-loss-in-pipeline-split", kind="switch", group=_PAR,
        tables=_p("account_for_loss_in_pipeline_split"),
        help="count the output layer and loss as one layer when splitting layers over stages")
    placement: str = setting("tp-pp-dp", flag="--placement", group=_PAR, tables=_p("placement"),
                             help="order of tp, pp, dp from innermost (consecutive ranks) to outermost "
                                  "(default tp-pp-dp; Megatron-LM's order is tp-dp-pp)")
    sequence_parallel: bool = setting(False, flag="--sequence-parallel", kind="switch", group=_PAR,
                                      tables=_p("sequence_parallel"))
    micro_batch_size: int = setting(1, flag="--micro-batch-size", type=POSITIVE_INT, group=_PAR,
                                    tables=_p("micro_batch_size"))
    """Sequences per micro-batch."""
    global_batch_size: int | None = setting(flag="--global-batch-size", type=POSITIVE_INT, group=_PAR,
                                            tables=_p("global_batch_size"),
                                            help="default micro-batch size x data-parallel size")
    recompute_granularity: str = setting("none", flag="--recompute-granularity", choices=("none", "selective", "full"),
                                         group=_PAR, tables=_p("recompute_granularity"))
    zero: int = setting(0, flag="--zero", type=int, choices=(0, 1, 2, 3), group=_PAR,
                        tables=(("plan", "zero"), ("zero_optimization", "stage")), help="ZeRO stage (default 0)")
    zero3_prefetch_depth: int | None = setting(flag="--zero3-prefetch-depth", type=NONNEGATIVE_INT, metavar="N",
                                               group=_PAR, tables=_p("zero3_prefetch_depth"),
                                               help="ZeRO-3: layers whose parameters are gathered ahead (default 1)")
    zero3_prefetch_bucket_size: float | None = setting(
        flag="--zero3-prefetch-bucket-size", type=Number(float, minimum=0), metavar="PARAMS", group=_PAR,
        tables=_z("stage3_prefetch_bucket_size"),
        help="ZeRO-3: parameters gathered ahead, as DeepSpeed's stage3_prefetch_bucket_size "
             "(sets the depth in whole layers)")
    zero3_max_live_parameters: float | None = setting(
        flag="--zero3-max-live-parameters", type=Number(float, above=0), metavar="PARAMS", group=_PAR,
        tables=_z("stage3_max_live_parameters"),
        help="ZeRO-3: most gathered parameters alive at once (DeepSpeed stage3_max_live_parameters)")
    zero_bucket_size: str | int | None = setting(
        flag="--zero-bucket-size", metavar="BYTES", group=_PAR, tables=_p("zero_bucket_size"),
        help="ZeRO-2/3 gradient reduce-scatter bucket, e.g. 500MB (default: --bucket-size)")
    offload_optimizer: bool = setting(False, flag="--offload-optimizer", kind="switch", group=_PAR,
                                      tables=_z("offload_optimizer"),
                                      help="ZeRO-Offload: optimizer states in host memory, optimizer step on the CPU")
    overlap_grad_reduce: bool = setting(True, flag="--overlap-grad-reduce", kind="bool", group=_PAR,
                                        tables=_p("overlap_grad_reduce"),
                                        help="overlap the data-parallel gradient all-reduce with backward (default on)")
    bucket_size: str | int | None = setting(
        flag="--bucket-size", metavar="BYTES", group=_PAR, tables=_p("bucket_size"),
        help=f"gradient bucket size, e.g. 25MiB (default {DDP_BUCKET_BYTES // 2**20} MiB, PyTorch DDP's)")

    def __post_init__(self):
        _check_section(self)


@dataclass(frozen=True)
class SimulationSettings:
    """How the iteration is simulated (written in an experiment file's [cluster] table)."""

    fidelity: str = setting("auto", flag="--fidelity", choices=FIDELITIES, tables=_c("fidelity"),
                            help="full: every GPU; reduced: one GPU per pipeline stage, the others as shadows in its "
                                 "collectives (default auto: reduced above 256 GPUs)")
    max_events: float = setting(DEFAULT_MAX_EVENTS, flag="--max-events",
                                type=Number(float, above=0, allow_inf=True), metavar="N", tables=_c("max_events"),
                                help="refuse a plan whose simulation would process more SimPy events than this, "
                                     f"estimated before anything is built (default {DEFAULT_MAX_EVENTS:.0e}, about "
                                     "half an hour; inf: no limit)")

    def __post_init__(self):
        _check_section(self)

    @property
    def event_limit(self) -> float | None:
        """``max_events``, with None for no limit (inf)."""
        return None if self.max_events == float("inf") else self.max_events


@dataclass(frozen=True)
class OutputSettings:
    """Where results go (the command line and ``RunResult.save``; not experiment files)."""

    json: bool = setting(False, flag="--json", kind="switch", help="print one JSON object")
    out: str | None = setting(flag="--out", help="directory for summary.json, trace.json, timeline.png and memory.png")
    kineto: str | None = setting(flag="--kineto", metavar="DIR",
                                 help="directory for PyTorch-profiler-shaped traces, trace_rank{r}.json per "
                                      "simulated GPU (for Holistic Trace Analysis)")

    def __post_init__(self):
        _check_section(self)


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


FIELDS: dict[str, Field] = {f.name: f.metadata["schema"] for cls in SECTIONS.values() for f in dataclasses.fields(cls)}
"""Every setting's schema entry, by field name, in section order."""
DEFAULTS: dict[str, object] = {f.name: f.default for cls in SECTIONS.values() for f in dataclasses.fields(cls)}
SECTION_OF: dict[str, str] = {f.name: sec for sec, cls in SECTIONS.items() for f in dataclasses.fields(cls)}


def fields_of(*sections: str) -> list[str]:
    """The field names of the named sections, in order."""
    return [f.name for s in sections for f in dataclasses.fields(SECTIONS[s])]


def _check_section(obj) -> None:
    for f, value in _items(obj):
        if value is not None and value != f.default:
            why = why_not(f.name, value)
            if why is not None:
                raise InputError(f"{f.name}: {why}")


def why_not(name: str, value) -> str | None:
    """Why ``value`` (a Python value, as from TOML or the API) is not allowed for the
    field ``name``, or None when it is."""
    f = FIELDS[name]
    if f.kind in ("switch", "bool"):
        return None if isinstance(value, bool) else f"got {value!r}; expected true or false"
    if isinstance(f.type, Number):  # the field's own bounds (> 0, finite, ...)
        why = f.type.check(value)
        if why is not None:
            return why
    if f.type is int and (isinstance(value, bool) or not isinstance(value, int)):
        return f"got {value!r}; expected an integer"
    if f.type is None and not isinstance(value, (str, int)) or isinstance(value, bool):
        return f"got {value!r}; expected a string"
    if f.choices is not None and value not in f.choices:
        return f"got {value!r}; allowed: {', '.join(map(str, f.choices))}"
    return None


def tables() -> dict[str, dict[str, str]]:
    """Per experiment-file table, its keys and the field each stands for, in field order."""
    out: dict[str, dict[str, str]] = {}
    for name, f in FIELDS.items():
        for table, key in f.tables:
            out.setdefault(table, {})[key] = name
    return out
