"""The settings of the commands that take more than a run's (``sim.inputs.schema``): what
``trainsim search`` searches, ``trainsim collective`` times and ``trainsim validate``
measures; what ``calibrate``, ``fit``, ``import-nccl-tests``, ``import-trace``, ``replay`` and
``goodput`` read (their positional arguments too), and which run settings each takes. Each
is a frozen dataclass of ``setting(...)`` fields, as the run's sections are, and the
command's parser is built from it (``sim.inputs.flags.add_section``): a flag, its help,
type, choices and default are written once, here. They are not run settings: no
experiment-file table, no keyword of ``sim.run``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from sim.errors import require

from sim.inputs.experts import DISPATCHERS
from sim.inputs.fields import setting
from sim.inputs.plan import RECOMPUTE, SCHEDULES
from sim.inputs.profile_checks import LINK_KINDS
from sim.inputs.schema import FIELDS
from sim.inputs.schema_sim import COLLECTIVE_ALGOS, COLLECTIVE_MODELS, COLLECTIVE_OPS, COLLECTIVE_PROTOCOLS
from sim.inputs.topology_nodes import FABRICS, OVERSUBSCRIPTION
from sim.units import NONNEGATIVE_INT, POSITIVE_INT, Duration, Number, parse_size

DEFAULT_MARGIN = 1.1
"""The estimate's error factor for pruning (``sim.studies.search``): how far below its bound
a plan's simulated time may come (bound / simulated ≤ margin). Measured with
``experiments/bench_sweep.py`` (seed 1): over 180 valid plans (120 of an 8-layer GPT on
16 H100s, 60 of an 8-layer Llama-style model with grouped-query attention on 32),
bound / simulated time ranged 0.22–0.943, median 0.82; 1.1 leaves about 17% above the
largest. A larger value prunes less and is safer; ``math.inf`` simulates every plan that
fits."""
LONG_SEQUENCE = 16384
"""From this sequence length on, ``enumerate_plans`` tries context parallelism by default
(shorter sequences rarely need it, and it multiplies the plans)."""


def searched(setting_name: str, help: str):
    """A searched plan setting: a comma-separated list under the run setting's flags, its
    short alias first (``--tp``), then the flag ``trainsim run`` takes
    (``--tensor-model-parallel-size``), so that both names work on every command."""
    f = FIELDS[setting_name]
    flags = (*f.aliases, f.flag)
    return setting(help=help, flag=flags[0], aliases=flags[1:])


@dataclass(frozen=True)
class SearchBatch:
    """The batch ``trainsim search`` plans for."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = "batch"

    global_batch_size: int | None = setting(type=POSITIVE_INT, required=True, help="sequences per optimizer step")


@dataclass(frozen=True)
class SearchSpaceOptions:
    """What ``trainsim search`` searches (``sim.studies.search.SearchSpace``, from these
    comma-separated lists) and how it prunes."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = "search space (comma-separated lists; default every valid value)"

    tp: str | None = searched("tensor_model_parallel_size", "tensor-parallel sizes (default: divisors up to --max-tp)")
    max_tp: int | None = setting(type=POSITIVE_INT, help="largest tensor-parallel size (default --gpus-per-node)")
    pp: str | None = searched("pipeline_model_parallel_size", "pipeline-parallel sizes")
    vpp: str | None = searched("num_virtual_stages_per_pipeline_rank", "model chunks per pipeline stage")
    micro_batch_size: str | None = setting(help="micro-batch sizes")
    zero: str | None = setting(help="ZeRO stages, of 0,1,2,3")
    schedule: str | None = setting(help=f"pipeline schedules, of {','.join(x for x in SCHEDULES if x != 'custom')}")
    recompute: str | None = searched("recompute_granularity", f"recompute granularities, of {','.join(RECOMPUTE)}")
    sequence_parallel: str | None = setting(help="on, off or on,off")
    ep: str | None = searched("expert_model_parallel_size",
                              "expert-parallel sizes (default: every divisor of the experts that folds into a "
                              "pipeline stage's GPUs)")
    etp: str | None = searched("expert_tensor_parallel_size",
                               "expert tensor-parallel sizes (default: 1 and the plan's tp for a mixture of experts)")
    dispatcher: str | None = searched("moe_token_dispatcher_type",
                                      f"MoE token dispatchers, of {','.join(DISPATCHERS)} (default: every one for a "
                                      "plan with ep > 1, alltoall otherwise)")
    cp: str | None = searched("context_parallel_size",
                              f"context-parallel sizes (default 1,2,4,8 from {LONG_SEQUENCE} tokens on, else 1)")
    fp8_format: str | None = setting(help="precisions: off (BF16), e4m3, hybrid, e.g. off,hybrid to compare BF16 with "
                                          "FP8 (default off; FP8 needs a GPU with an fp8 peak)")
    margin: float | None = setting(type=Number(float, minimum=1, allow_inf=True),
                                   help=f"the estimate's error factor: a plan is simulated unless its estimated bound / "
                                        f"margin exceeds the second-best simulated time (default {DEFAULT_MARGIN}, and 1 "
                                        "for a mixture of experts, whose bound is a true lower bound; inf: no time "
                                        "pruning)")
    wave: int = setting(16, type=POSITIVE_INT, help="plans simulated between pruning checks (default 16)")
    max_time: float | None = setting(
        type=Duration(), metavar="DURATION",
        help="stop the simulations after this long (from the command's start: 90s, 10m, 1h30m) and report "
             "the best plan so far (default: no limit; Ctrl-C and SIGTERM also stop with the best so far)")
    screen: str = setting("on", choices=("on", "off"),
                          help="on: a plan with at least 6 x pp micro-batches (not gpipe) is first simulated at 2 x pp "
                               "and 4 x pp and its time extrapolated; the plans listed are simulated in full (default "
                               "on); off: every plan in full")


SEARCH_SPACE_ATTR = {"zero": "zero_stage"}
"""``SearchSpace`` attributes named otherwise than their option (``--zero`` fills ``zero_stage``)."""


@dataclass(frozen=True)
class CollectiveOptions:
    """What ``trainsim collective`` times: one collective on a topology, as nccl-tests runs it."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    op: str = setting("allreduce", help=f"one of {', '.join(COLLECTIVE_OPS)} (default allreduce)")
    size: str = setting("1GiB", help="buffer size, e.g. 1GiB, 256MB, 4096 (default 1GiB)")
    gpus: int | None = setting(type=POSITIVE_INT, help="GPUs taking part, ranks 0..N-1 (default: all)")
    topology: str = setting("dgx-h100", help="built-in name (dgx-a100, dgx-h100, dgx-h200, ...) or a TOML file "
                                             "(default dgx-h100)")
    nodes: int | None = setting(type=POSITIVE_INT, help="number of nodes (default: enough for --gpus)")
    fabric: str | None = setting(help=f"inter-node fabric: {' | '.join(FABRICS)} (default rail)")
    oversubscription: float | None = setting(type=OVERSUBSCRIPTION, help="leaf uplink oversubscription (default 1)")
    algo: str = setting("auto", help=f"{' | '.join(COLLECTIVE_ALGOS)} (default auto: NCCL's tuner's choice, "
                                     "as NCCL_ALGO overrides it)")
    protocol: str = setting("auto", help=f"{' | '.join(COLLECTIVE_PROTOCOLS)} (default auto: "
                                         "NCCL's choice by size)")
    sweep: str | None = setting(metavar="MIN:MAX", help="print nccl-tests style rows (all_reduce_perf columns) for "
                                                        "sizes MIN..MAX in factor-2 steps")
    collective_model: str = setting("flows", choices=COLLECTIVE_MODELS,
                                    help="flows: each ring hop one flow for the whole collective; steps: 2(n-1) "
                                         "lock-step rounds (default flows; the timeline shows each step with steps)")
    channels: int | None = setting(type=POSITIVE_INT, help="rings run at once by ring algorithms (default: GPUs per "
                                                           "node when the group spans nodes, else 1)")
    gpu: str | None = setting(help="hardware profile whose link efficiencies apply (default: the topology's GPU, "
                                   "e.g. h100-sxm for dgx-h100; none for hand-written graphs)")
    line_rate: bool = setting(False, kind="switch", help="ignore link efficiencies: links at their line rate")


@dataclass(frozen=True)
class CollectiveOutput:
    """Where ``trainsim collective`` reports."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    json: bool = setting(False, kind="switch", help="print one JSON object instead of a table")
    out: str | None = setting(help="directory for trace.json, timeline.png and summary.json (with --sweep: "
                                   "busbw.png, busbw.csv)")


@dataclass(frozen=True)
class ValidateOptions:
    """What ``trainsim validate`` runs for real and compares with its simulation."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    procs: int = setting(2, type=POSITIVE_INT, help="processes (GPUs) of the reference run (default 2)")
    configs: str | None = setting(help="comma-separated, from dp, gpipe, 1f1b, dp-pp "
                                       "(default all that fit: dp-pp needs --procs 4 or more)")
    profile: str | None = setting(metavar="PROFILE.json", help="use this profile instead of calibrating now")
    link: str | None = setting(choices=LINK_KINDS, metavar="LINK",
                               help="link kind joining the processes in the simulated topology "
                                    "(default: the one the profile's calibration fitted)")
    quick: bool = setting(False, kind="switch", help="a smaller model and fewer iterations (for tests)")


VALIDATE_MODEL = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length", "micro_batch_size")
"""The run settings ``trainsim validate`` takes for its reference model and batch, listed
with ``ValidateBatch`` (defaults: the reference model's, ``sim.calibrate.validate``, and
``VALIDATE_DEFAULTS``)."""
VALIDATE_DEFAULTS = {"micro_batch_size": 2}
"""Where ``trainsim validate``'s default differs from a run's (2 sequences a micro-batch)."""
VALIDATE_HELPS = {"micro_batch_size": "sequences per micro-batch (default 2)"}
"""Their help, which says so."""


@dataclass(frozen=True)
class ValidateBatch:
    """How long ``trainsim validate``'s reference run trains."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = "reference model and batch (defaults: a 4-layer, 256-wide GPT; smaller with --quick)"

    num_microbatches: int | None = setting(type=POSITIVE_INT, help="per replica (default 4; 2 with --quick)")
    warmup: int | None = setting(type=NONNEGATIVE_INT, help="untimed iterations first (default 2; 1 with --quick)")
    iters: int | None = setting(type=POSITIVE_INT, help="timed iterations (default 5; 3 with --quick)")


@dataclass(frozen=True)
class ValidateOutput:
    """How ``trainsim validate`` counts iterations and where it reports."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    probe_tolerance: float | None = setting(
        type=Number(float, above=0, allow_inf=True), metavar="FRACTION",
        help="count only timed iterations between which the probe GEMM ran within this fraction of the "
             "profile's prediction on every rank, with at most 2%% of the CPU stolen, running up to 4x "
             "--iters to find them (default 0.1; inf counts every iteration): a shared machine's slow "
             "spells then do not show up as error")
    out: str | None = setting(metavar="DIR", help="write report.json, table.txt, profile.json, traces and PNGs here")
    json: bool = setting(False, kind="switch", help="print one JSON object")


RANK_BY = ("throughput", "tokens-per-joule", "cost")
"""What ``search``, ``sweep`` and ``compare`` rank plans by (``--rank-by``): tokens/s (the
fastest first; the batch is the same, so the shortest iteration), tokens per joule (the
least energy per token first, ``sim.results.energy``), or cost (the fewest US dollars per
million tokens first at the GPU-hour price given, ``sim.inputs.cost``; on GPUs of one price
the same order as throughput, on a mixed cluster the price of each type counts)."""


@dataclass(frozen=True)
class ExecutorOptions:
    """Where ``trainsim search`` and ``trainsim sweep`` run their simulations and what they report."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = "execution and output"

    workers: int | None = setting(type=NONNEGATIVE_INT, help="local worker processes (default: the core count; 0 runs "
                                                             "in this process)")
    dask: str | None = setting(metavar="ADDRESS", help="run on a Dask cluster: tcp://HOST:8786, or 'local' to start a "
                                                       "LocalCluster of --workers processes (needs trainsim[sweep])")
    out: str | None = setting(metavar="DIR", help="write results.jsonl, results.csv, pareto.png and a JSON summary "
                                                  "here")
    resume: bool = setting(False, kind="switch", help="continue the sweep in --out, skipping finished plans")
    top: int = setting(5, type=POSITIVE_INT, help="plans to list (default 5)")
    rank_by: str = setting("throughput", choices=RANK_BY,
                           help="rank plans by tokens/s (throughput, the default), by tokens per joule of GPU energy, "
                                "or by cost: dollars per million tokens (needs --gpu-hour-price, or a price in the "
                                "profile)")
    json: bool = setting(False, kind="switch", help="print one JSON object")


def comma_list(kind):
    """An option's type: a comma-separated list of ``kind`` (``str`` or ``int``); refused, what
    argparse reports under the flag: ``got 'x'; expected a comma-separated list of integers``."""
    import argparse

    what = f"a comma-separated list of {'integers' if kind is int else 'names'}"

    def parse(text: str):
        items = [t.strip() for t in text.split(",") if t.strip()]
        try:
            if items:
                return [kind(t) for t in items]
        except ValueError:
            pass
        raise argparse.ArgumentTypeError(f"got {text!r}; expected {what}")
    parse.__name__ = "list"
    return parse


@dataclass(frozen=True)
class CompareOptions:
    """What ``trainsim compare`` compares besides an experiment file's ``[[plans]]``."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = "what to compare"

    experiment: str | None = setting(kind="argument", metavar="FILE", group=None,
                                     help="an experiment .toml, usually with [[plans]] (flags after it override it "
                                          "for every plan)")

    schedules: list | None = setting(
        type=comma_list(str), metavar="LIST",
        help=f"pipeline schedules to compare, e.g. gpipe,1f1b ({', '.join(s for s in SCHEDULES if s != 'custom')}); "
             "interleaved takes --num-virtual-stages-per-pipeline-rank (default 2 where the layers split "
             "evenly into pp x 2 chunks), the others one chunk per rank")
    zero_stages: list | None = setting(type=comma_list(int), metavar="LIST", help="ZeRO stages to compare, e.g. 0,1,2,3")
    rank_by: str = setting("throughput", choices=RANK_BY,
                           help="what marks the best plan: tokens/s (throughput, the default), tokens per joule of GPU "
                                "energy, or cost: the fewest dollars per million tokens (needs --gpu-hour-price)")


@dataclass(frozen=True)
class DemoOptions:
    """What ``trainsim demo`` runs: a small training step and an all-reduce on DGX H100 nodes."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    out: str = setting("out/demo", help="output directory (default out/demo)")
    nodes: int | None = setting(type=POSITIVE_INT, help="DGX H100 nodes of the all-reduce (default 4)")
    gpus: int | None = setting(type=POSITIVE_INT, help="GPUs of the all-reduce, whole DGX H100 nodes of 8 (default: "
                                                       "all GPUs of --nodes)")
    json: bool = setting(False, kind="switch", help="print the results as one JSON object")


@dataclass(frozen=True)
class ExperimentFile:
    """The experiment file ``trainsim run`` and ``trainsim goodput`` may start from."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    experiment: str | None = setting(kind="argument", metavar="FILE",
                                     help="an experiment .toml (flags after it override it)")


@dataclass(frozen=True)
class SweepFile:
    """The experiment file ``trainsim sweep`` expands."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    experiment: str | None = setting(kind="argument", required=True, metavar="FILE",
                                     help="an experiment .toml whose plan fields may be lists")


CALIBRATE_SETTINGS = [*(n for n, f in FIELDS.items() if f.section == "model"), "tensor_model_parallel_size",
                      "micro_batch_size", "sequence_parallel"]
"""The run settings ``trainsim calibrate`` takes: the model and what changes its GEMM shapes."""


@dataclass(frozen=True)
class CalibrateMeasurement:
    """What ``trainsim calibrate`` measures, on how many processes, over which link."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = "measurement"

    procs: int | None = setting(type=POSITIVE_INT, help="processes to start (default: one per GPU, 2 on CPU; under "
                                                        "torchrun the job's ranks)")
    quick: bool = setting(False, kind="switch", help="a short sweep (seconds on a CPU)")
    base: str | None = setting(metavar="PROFILE", help="profile to take peak FLOP/s, tiles and unmeasured links from "
                                                       "(default: the preset matching the GPU's name; none on CPU)")
    link: str | None = setting(choices=LINK_KINDS, metavar="LINK",
                               help="link kind the processes talk over (default nvlink on one GPU node, ib across "
                                    "nodes, ethernet for CPU processes)")
    name: str | None = setting(help="profile name (default calibrated-<device>)")


@dataclass(frozen=True)
class CalibrateOutput:
    """Where ``trainsim calibrate`` writes the profile."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    out: str = setting("calibrated.json", help="profile JSON to write (default calibrated.json)")
    measurements: str | None = setting(metavar="FILE", help="also write every raw measurement and fit as JSON")
    json: bool = setting(False, kind="switch", help="print the profile as JSON instead of a summary")


@dataclass(frozen=True)
class FitOptions:
    """What ``trainsim fit`` fits, to which runs, and where it reports."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    runs: tuple | None = setting(kind="arguments", metavar="RUNS.csv",
                                 help="measured runs: trainsim run's settings as columns plus "
                                      "measured_iteration_time_s (several files: read as one table)")
    gpu: str | None = setting(required=True, metavar="PROFILE",
                              help="preset (a100-80gb, h100-sxm, h200, b200, gb200, gb300) or profile .json to fit; "
                                   "rows of other GPUs are left out")
    out: str | None = setting(metavar="FITTED.json", help="write the fitted profile here")
    params: str | None = setting(metavar="A,B", help="profile fields to fit, by dotted path (default: "
                                                     "sustained_compute_fraction, attention_max_efficiency, "
                                                     "memory_efficiency, kernel_launch_s, fewer than the groups); "
                                                     "framework_kernel_overhead_s.NAME fits a PyTorch-native "
                                                     "framework's per-kernel cost from its rows alone")
    json: bool = setting(False, kind="switch", help="print one JSON object")
    cache: str | None = setting(metavar="FILE", help="keep every simulated time in FILE (JSON lines) and reuse what "
                                                     "it holds: a fit stopped part-way and run again with the same "
                                                     "file simulates only what it had not (any change to trainsim, "
                                                     "the profile or a row makes new entries)")
    jobs: int = setting(1, type=POSITIVE_INT, metavar="N",
                        help="simulate N rows at once in worker processes (default 1; the report is the same)")
    loss: str = setting("squares", choices=("squares", "absolute"), metavar="LOSS",
                        help="what the fit makes least: squares (default), the squared relative errors; absolute, "
                             "their absolute values (the mean |error| the report gives), so that a few rows the "
                             "model cannot match (two measurements of one job far apart) pull it less")


@dataclass(frozen=True)
class ImportNcclTestsOptions:
    """What ``trainsim import-nccl-tests`` reads, fits and writes."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    logs: tuple | None = setting(kind="arguments", metavar="LOG", help="nccl-tests output files (text or JSON)")
    op: str | None = setting(help="collective, when the log does not say (all_reduce, all_gather, reduce_scatter, "
                                   "alltoall, broadcast, reduce, send_recv)")
    ranks: int | None = setting(type=POSITIVE_INT, help="ranks of the run, when the log does not say")
    min_size: str = setting("0", help="leave out smaller messages from the fit (e.g. 1MiB)")
    link: str = setting("ib", choices=LINK_KINDS, metavar="LINK", help="link kind the fit describes (default ib)")
    links_per_rank: int = setting(1, type=POSITIVE_INT, help="links (NICs) one rank's traffic is spread over; B is "
                                                             "divided among them (default 1)")
    profile: str | None = setting(metavar="IN", help="profile (preset name or .json) to update")
    out: str | None = setting(metavar="OUT.json", help="write the updated profile here (needs --profile)")
    topology: str | None = setting(help="topology the logs ran on, to check the algorithm a log names (default: the "
                                        "built-in DGX node of --profile's GPU)")
    json: bool = setting(False, kind="switch", help="print one JSON object")


KINETO_LEVELS = ("auto", "kernels", "annotations", "cpu_ops")
"""What becomes a span of a Kineto trace (``sim.calibrate.kineto``): GPU kernels, record_function
annotations or top-level CPU operators; auto: kernels where there are any."""


@dataclass(frozen=True)
class ImportTraceOptions:
    """What ``trainsim import-trace`` reads and reports."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    traces: tuple | None = setting(kind="arguments", metavar="TRACE",
                                   help="Chrome trace JSON files from torch.profiler")
    level: str = setting("auto", choices=KINETO_LEVELS,
                         help="what becomes a span: GPU kernels, record_function annotations or top-level CPU ops")
    top: int = setting(15, type=POSITIVE_INT, help="ops to list (default 15)")
    out: str | None = setting(metavar="DIR", help="write timeline.png and trace.json (Perfetto) here")
    json: bool = setting(False, kind="switch", help="print one JSON object")


@dataclass(frozen=True)
class ReplayOptions:
    """What ``trainsim replay`` replays (its what-ifs of the cluster are run settings)."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = None

    traces: tuple | None = setting(kind="arguments", metavar="TRACE",
                                   help="Kineto trace files (.json, .json.gz), one per traced rank; or Chakra "
                                        "execution traces (NAME.<r>.et, one per rank; comm_group.json beside them "
                                        "is read)")
    comm_group: str | None = setting(metavar="FILE", help="Chakra ETs' comm-group file (default: comm_group.json "
                                                          "beside the first ET)")
    step: int | None = setting(type=NONNEGATIVE_INT, metavar="N",
                               help="replay ProfilerStep#N (default: the traces' last step, or the whole window "
                                    "without steps)")
    data_parallel_size: int | None = setting(type=POSITIVE_INT, metavar="N",
                                             help="what-if: N data-parallel replicas (each rank's kernels kept, "
                                                  "gradient collectives over the new groups)")


REPLAY_SETTINGS = ["gpu", "gpus", "topology", "nodes", "gpus_per_node", "fabric", "oversubscription", "json", "out",
                   "export_chakra"]
"""The run settings ``trainsim replay`` takes: another GPU or cluster to replay on, and its outputs."""
REPLAY_HELPS = {
    "gpu": "GPU profile to replay on (default: the trace's deviceProperties); another GPU scales the kernels "
           "by class (GEMM and attention by sustained FLOP/s, the rest by sustained HBM bandwidth)",
    "gpus": "what-if: the traced job on N GPUs, grown or shrunk by whole data-parallel replicas (N a multiple of "
            "one replica's GPUs; --data-parallel-size N/that says the same) (default: the traced world size)",
    "out": "directory for summary.json, trace.json (Perfetto) and timeline.png",
    "export_chakra": "directory for the replayed program as Chakra execution traces, trainsim.{r}.et per rank and "
                     "comm_group.json (every rank of the job, clones included)",
}
"""Their help where replay reads them otherwise than ``trainsim run``."""

DEFAULT_STORAGE_BPS = 2e12
"""Checkpoint storage, aggregate bytes/s: 2 TB/s, the sustained throughput of Meta's
Tectonic file system that stored Llama 3's checkpoints (Dubey et al. 2024, "The Llama 3
Herd of Models", section 3.3.1; 7 TB/s peak). A typical cluster's file system is slower."""
def _checkpoint_interval(text: str) -> float | None:
    """``--checkpoint-interval``: training seconds > 0, or auto (None: the best interval)."""
    if text == "auto":
        return None
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    require(v > 0 and math.isfinite(v), "--checkpoint-interval", text, "expected a number of seconds > 0 or auto")
    return v


def _hot_spares(text: str) -> int | None:
    """``--hot-spares``: spare nodes >= 0, or unlimited (None)."""
    if text == "unlimited":
        return None
    require(text.isdigit(), "--hot-spares", text, "expected an integer >= 0 or unlimited")
    return int(text)


def _storage_bandwidth(text: str) -> float:
    """``--storage-bandwidth``: aggregate bytes/s > 0, with a unit as sizes take them (``500GB``)."""
    v = float(parse_size(text, "--storage-bandwidth"))
    require(v > 0, "--storage-bandwidth", text, "expected a bandwidth > 0 bytes/s")
    return v


MAX_DAYS = 36500
"""The longest campaign ``trainsim goodput`` takes (100 years: it steps from interruption to
interruption, so only the count of interruptions costs time)."""


@dataclass(frozen=True)
class GoodputCampaign:
    """The training campaign ``trainsim goodput`` simulates: how long, what fails, how it saves."""

    TABLE: ClassVar[str | None] = None
    GROUP: ClassVar[str | None] = "campaign"

    failures: str = setting("llama3", metavar="PRESET|FILE.toml",
                            help="failure rates per device-hour and costs: {presets} or a TOML file (default llama3: "
                                 "the Llama 3 paper's interruption table)")
    days: float = setting(54.0, type=Number(float, above=0, maximum=MAX_DAYS),
                          help="wall-clock length of the campaign, days (default 54; up to 36,500: the campaign "
                               "steps from interruption to interruption, never iteration by iteration)")
    checkpoint_interval: float | None = setting("auto", type=_checkpoint_interval, metavar="S|auto",
                                       help="training seconds between checkpoint saves, rounded to whole "
                                            "iterations; auto: the interval with the best simulated goodput "
                                            "(default auto)")
    seed: int = setting(0, type=NONNEGATIVE_INT, help="seed of the failure draws (default 0)")
    hot_spares: int | None = setting("unlimited", type=_hot_spares, metavar="N|unlimited",
                              help="spare nodes that replace a failed one at once; a failed node returns after its "
                                   "repair time; with none free the job waits (default unlimited)")
    async_save: bool = setting(False, kind="switch",
                               help="asynchronous checkpoint saves: training stalls only for the copy to host "
                                    "memory, the write runs in the background (Megatron-LM --async-save)")
    storage_bandwidth: float | None = setting(type=_storage_bandwidth, metavar="BYTES",
                                            help="checkpoint storage's aggregate bandwidth per second, shared by all "
                                                 "writers, e.g. 500GB (default "
                                                 f"{DEFAULT_STORAGE_BPS / 1e12:g}TB: Llama 3's Tectonic, sustained)")
    step_time_s: float | None = setting(type=Number(float, above=0), metavar="S",
                                        help="seconds per training iteration; skips the iteration's simulation")
