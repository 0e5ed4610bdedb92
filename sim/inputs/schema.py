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
from typing import Callable, ClassVar, Mapping

from sim.errors import InputError
from sim.inputs.plan import DDP_BUCKET_BYTES
from sim.inputs.topology_build import FABRICS, OVERSUBSCRIPTION
from sim.units import FRACTION, NONNEGATIVE_INT, POSITIVE_INT, Number

# Bounds shared with the modules that use the values.
DEFAULT_MAX_EVENTS = 100_000_000
"""Largest simulation attempted without ``--max-events``: about 10-20 minutes of
engine time and several GB of memory."""
FIDELITIES = ("auto", "full", "reduced")
AUTO_FULL_FIDELITY_EVENTS = 2_000_000
"""``fidelity = "auto"`` simulates every GPU when the estimated events of doing so
(``sim.program.limits``, a rough and usually high count) fit in this, which keeps a
default run to seconds; one GPU per pipeline stage otherwise."""
COLLECTIVE_MODELS = ("flows", "steps")
"""How the engine runs a ring collective: ``flows``, each hop of each channel one flow
carrying all its steps' bytes while the collective runs, every hop at once; or ``steps``,
2(n-1) lock-step rounds of n transfers (``sim.engine.algorithms``)."""
NCCL_ALGOS = ("auto", "ring", "tree", "nvls", "nvls_tree", "hierarchical")
"""What ``nccl_algo`` takes (``sim.engine.algorithms``, ``sim.engine.algorithms_nccl``)."""
NCCL_PROTOCOLS = ("auto", "ll", "ll128", "simple")
"""What ``nccl_protocol`` takes (``sim.engine.nccl``)."""


@dataclass(frozen=True)
class Field:
    """What the schema knows of one setting besides its name and default."""

    flag: str | None = None
    """The command-line flag (default: the name, ``--with-dashes``; Megatron-LM's spelling)."""
    help: str | Callable[[], str] | None = None
    """What it is and its unit (a callable when the text lists what is installed)."""
    type: Callable | None = None
    """How a command-line string becomes the value (a ``sim.units.Number``, ``int``, ...)."""
    choices: tuple | None = None
    kind: str = "value"
    """``value`` (takes one argument), ``switch`` (present = true) or ``bool`` (``--x``/``--no-x``)."""
    metavar: str | None = None
    group: str | None = None
    """The ``--help`` section it is listed in (default: its section's; None: the command's own options)."""
    tables: tuple[tuple[str, str], ...] | None = None
    """(experiment-file table, key) pairs it may be written under (default: its section's
    table, under its name; () for none)."""
    path: Callable[[str], bool] | None = None
    """For values that may name a file: which strings do (resolved against the experiment file)."""


_SECTION_GROUP = object()


def setting(default=None, *, help=None, type=None, choices=None, kind: str = "value", flag: str | None = None,
            metavar: str | None = None, group=_SECTION_GROUP, tables=None, path=None):
    """A dataclass field with its schema entry (``Field``) in the metadata."""
    return field(default=default, metadata={"schema": (Field(
        flag, help, type, tuple(choices) if choices is not None else None, kind, metavar, None,
        None if tables is None else tuple(tables), path), group)})


def _model_presets() -> str:
    from sim.inputs.model import PRESETS

    return ", ".join(PRESETS)


def _gpu_presets() -> str:
    from sim.inputs.hardware import PRESETS

    return ", ".join(PRESETS)


def _schedules() -> str:
    from sim.inputs.plan import SCHEDULES

    return ", ".join(s for s in SCHEDULES if s != "custom")


_DROPOUT = "dropout probability (default 0.1; > 0 adds the dropout kernels)"


@dataclass(frozen=True)
class ModelSettings:
    """Which model is trained: exactly one of a preset, a Hugging Face config.json, or
    Megatron-LM's shape flags (``num_layers``, ``hidden_size``, ...)."""

    TABLE: ClassVar[str | None] = "model"
    GROUP: ClassVar[str | None] = "model shape (Megatron-LM flags)"

    model: str | None = setting(help=lambda: f"one of: {_model_presets()}", metavar="PRESET", group="model (one of)",
                                tables=(("model", "preset"),))
    hf_config: str | None = setting(help="a Hugging Face config.json", metavar="PATH", group="model (one of)",
                                    path=lambda v: True)
    num_layers: int | None = setting(help="transformer layers", type=POSITIVE_INT)
    hidden_size: int | None = setting(help="model width (hidden size)", type=POSITIVE_INT)
    num_attention_heads: int | None = setting(help="attention heads", type=POSITIVE_INT)
    ffn_hidden_size: int | None = setting(help="default 4 x hidden size (GeLU) ", type=POSITIVE_INT)
    vocab_size: int | None = setting(help="vocabulary size (tokens)", type=POSITIVE_INT)
    seq_length: int | None = setting(help="tokens per sequence", type=POSITIVE_INT)
    max_position_embeddings: int | None = setting(
        help="positions learned position embeddings cover (default: the sequence length)", type=POSITIVE_INT)
    group_query_attention: bool = setting(False, help="grouped-query attention (with --num-query-groups)",
                                          kind="switch")
    num_query_groups: int | None = setting(help="key/value heads under grouped-query attention", type=POSITIVE_INT)
    swiglu: bool = setting(False, help="SwiGLU MLP (default GeLU)", kind="switch")
    normalization: str = setting("LayerNorm", help="normalization layer (default LayerNorm)",
                                 choices=("LayerNorm", "RMSNorm"))
    position_embedding_type: str = setting("learned_absolute", help="position embeddings (default learned_absolute)",
                                           choices=("learned_absolute", "rope"))
    untie_embeddings_and_output_weights: bool = setting(
        False, help="output layer with weights of its own (default: tied to the embedding)", kind="switch")
    disable_bias_linear: bool = setting(False, help="linear layers without biases", kind="switch")
    attention_dropout: float = setting(0.1, help="attention " + _DROPOUT, type=FRACTION)
    hidden_dropout: float = setting(0.1, help="hidden " + _DROPOUT, type=FRACTION)

    def __post_init__(self):
        _check_section(self)


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
        _check_section(self)

    def total_gpus(self) -> int | None:
        """``gpus``, or all GPUs of ``nodes`` nodes (None when neither is given)."""
        if self.gpus is not None:
            return self.gpus
        if self.nodes is not None:
            return self.nodes * self.gpus_per_node
        return None


_ZERO = "zero_optimization"  # DeepSpeed's table and names


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
    micro_batch_size: int = setting(1, help="sequences per micro-batch (default 1)", type=POSITIVE_INT)
    global_batch_size: int | None = setting(help="default micro-batch size x data-parallel size", type=POSITIVE_INT)
    recompute_granularity: str = setting("none", help="activation recomputation in backward (default none)",
                                         choices=("none", "selective", "full"))
    attention: str = setting("flash", help="how attention runs: flash (one fused kernel: FlashAttention or cuDNN, "
                                           "Megatron-Core with Transformer Engine; the default) or unfused "
                                           "(Megatron-LM without --use-flash-attn: QK^T and AV as batched GEMMs, "
                                           "softmax and dropout over the s x s scores in memory)",
                             choices=("flash", "unfused"))
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
    offload_optimizer: bool = setting(
        False, help="ZeRO-Offload: optimizer states in host memory, optimizer step on the CPU", kind="switch",
        tables=((_ZERO, "offload_optimizer"),))
    overlap_grad_reduce: bool = setting(
        True, help="overlap the data-parallel gradient all-reduce with backward (default on)", kind="bool")
    bucket_size: str | int | None = setting(
        help=f"gradient bucket size, e.g. 25MiB (default {DDP_BUCKET_BYTES // 2**20} MiB, PyTorch DDP's)",
        metavar="BYTES")

    def __post_init__(self):
        _check_section(self)


@dataclass(frozen=True)
class SimulationSettings:
    """How the iteration is simulated (written in an experiment file's [cluster] table)."""

    TABLE: ClassVar[str | None] = "cluster"
    GROUP: ClassVar[str | None] = None

    fidelity: str = setting("auto", help="full: every GPU; reduced: one GPU per pipeline stage, the others as "
                                         "shadows in its collectives (default auto: full when its estimated events "
                                         f"fit in {AUTO_FULL_FIDELITY_EVENTS:.0e}, else reduced)",
                            choices=FIDELITIES)
    collective_model: str = setting(
        "flows", help="flows: each ring hop one flow carrying its share of the bytes while the collective runs "
                      "(events grow with n); steps: 2(n-1) lock-step rounds of n transfers (default flows; reduced "
                      "fidelity always runs flows)", choices=COLLECTIVE_MODELS)
    nccl_algo: str = setting(
        "auto", help="NCCL algorithm of the training collectives, as NCCL_ALGO: auto (NCCL's tuner picks per "
                     "op, size, group and topology: sim.engine.tuner; the default), ring, tree, nvls (NVLink SHARP, "
                     "H100/H200 NVSwitch), nvls_tree or hierarchical; a collective the forced one cannot run "
                     "keeps the tuner's choice", choices=NCCL_ALGOS)
    nccl_protocol: str = setting(
        "auto", help="NCCL protocol of the training collectives, as NCCL_PROTO: auto (the tuner's choice by size; "
                     "the default), ll, ll128 or simple", choices=NCCL_PROTOCOLS)
    max_events: float = setting(
        DEFAULT_MAX_EVENTS, help="refuse a plan whose simulation would process more SimPy events than this, "
                                 f"estimated before anything is built (default {DEFAULT_MAX_EVENTS:.0e}, about half "
                                 "an hour; inf: no limit)", type=Number(float, above=0, allow_inf=True), metavar="N")

    def __post_init__(self):
        _check_section(self)

    @property
    def event_limit(self) -> float | None:
        """``max_events``, with None for no limit (inf)."""
        return None if self.max_events == float("inf") else self.max_events


@dataclass(frozen=True)
class OutputSettings:
    """Where results go (the command line and ``RunResult.save``; not experiment files)."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    json: bool = setting(False, help="print one JSON object", kind="switch")
    out: str | None = setting(help="directory for summary.json, trace.json, timeline.png and memory.png")
    kineto: str | None = setting(help="directory for PyTorch-profiler-shaped traces, trace_rank{r}.json per "
                                      "simulated GPU (for Holistic Trace Analysis)", metavar="DIR")

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


def _resolved(cls, f) -> Field:
    """A field's schema entry with its defaults filled in from its name and section."""
    meta, group = f.metadata["schema"]
    table = cls.TABLE
    return dataclasses.replace(
        meta, flag=meta.flag or "--" + f.name.replace("_", "-"),
        group=cls.GROUP if group is _SECTION_GROUP else group,
        tables=meta.tables if meta.tables is not None else (((table, f.name),) if table else ()))


FIELDS: dict[str, Field] = {f.name: _resolved(cls, f) for cls in SECTIONS.values() for f in dataclasses.fields(cls)}
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
