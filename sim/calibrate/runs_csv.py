"""Measured training runs from a CSV file: the input of ``trainsim fit``.

One row per run. The columns are the settings of ``trainsim run`` by their field names
(Megatron-LM's flags with underscores: ``num_layers``, ``hidden_size``,
``tensor_model_parallel_size``, ``global_batch_size``, ... and ``gpus``), plus

    measured_iteration_time_s   the measured time of one whole iteration (required)
    model                       a preset (``trainsim run --model``): its shape, so the shape columns
                                may be blank (a filled one overrides the preset's, as a flag does)
    activation                  gelu | swiglu | squared-relu (the MLP)
    context_parallel_size       context parallelism (``sim.program.context_parallel``; ring attention)
    gpu                         the profile the run was measured on; other GPUs are left out
    precision                   bf16 or fp8; rows of any other precision are skipped
    needs                       the capabilities the run needs, separated by commas: fp8 and
                                context_parallel are simulated, rows that need anything else are skipped
    group                       rows of one source with the same text form one group, whatever their
                                precision and model (blank: the source, precision and model's group)
    source, notes               free text (``source`` also names the row's group)

The framework that ran is the ``framework`` setting's column (megatron, torchtitan, automodel,
llm-foundry; ``sim.inputs.frameworks``; blank: megatron), and with it ``attention_kernel``,
``backward_prefetch`` and ``reshard_after_forward`` where a row ran otherwise than its
framework's defaults; errors are reported per framework.

An ``fp8`` row trains its layers' GEMMs in FP8 (``fp8_format``: its own column, or
``FP8_FORMAT``'s value when that is blank); a ``bf16`` row cannot set ``fp8_format``.

The shape columns (``SHAPE_REQUIRED``) are required unless the row names a preset.
Mixtures of experts take their settings as ``trainsim run`` does: the model's
(``num_experts``, ``moe_ffn_hidden_size``, ... or a preset) and the plan's
(``expert_model_parallel_size``, ``expert_tensor_parallel_size``, ``moe_routing``), and
FSDP is ``zero`` 3.

Any other column is an error, and so is a cell the column does not allow: one line
naming the file, the line, the column, the value and what is allowed.

**Blank cells** (a value the source did not publish) take the values in ``BLANKS``, the
one place those choices are made, each with the reason, unless ``BY_SOURCE`` knows what
that source ran. Settings that have no column take
trainsim's defaults, which are Megatron-LM's (LayerNorm, learned positions, biases,
dropout 0.1, tied embeddings); add the column to say otherwise.

**Groups.** Rows of one model (the preset, the shape columns and the activation) from one source at
one precision form a group (or, where the ``group`` column is filled, the rows of one source with the
same text there: a table whose groups are one model on one system in one release, BF16 and FP8
alike): a weak-scaling table's rows are near copies of each other,
so held-out fitting leaves out a whole group at a time (``sim.calibrate.fit_runs``).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

from sim.errors import InputError
from sim.inputs.fields import why_not_field
from sim.inputs.frameworks import DEFAULT_FRAMEWORK
from sim.inputs.flags import value_of_text
from sim.inputs.schema import FIELDS, fields_of

MEASURED = "measured_iteration_time_s"
SETTING_COLUMNS = tuple(n for n in fields_of("model", "plan") if n != "hf_config") + ("gpus", "gpus_per_node")
"""Schema fields a column may set (the model, as a preset or its shape, and the plan; the cluster is
the GPU's default one, with ``gpus_per_node`` GPUs in each NVLink domain where the column says so: a
job spread over NVL72 racks 64 to a rack)."""
EXTRA_COLUMNS = ("activation", "context_parallel_size", "gpu", "precision", "needs", "group", "source", "notes")
ACTIVATIONS = {"gelu": False, "swiglu": True, "squared-relu": False}
"""MLP activation -> whether it is gated (``swiglu``). Squared ReLU (Nemotron-4, Megatron's
``--squared-relu``) is non-gated with GeLU's GEMM shapes; trainsim times its elementwise
kernel as GeLU's (both read and write the same bytes)."""
SHAPE_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length")
"""The shape columns a row without a preset (``model``) must fill."""
REQUIRED = (MEASURED, "gpus") + SHAPE_REQUIRED
SHAPE = ("model", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "vocab_size",
         "seq_length", "activation")
"""The columns that say which model a row trains (with ``source`` and ``precision``, its group)."""


def _sequence_parallel_default(row: dict) -> bool:
    return (row.get("tensor_model_parallel_size") or 1) > 1


BLANKS = {
    # column: (value, or a function of the row's other values; why)
    "precision": ("bf16", "the precision trainsim simulates; every published row states it"),
    "activation": ("gelu", "Megatron-LM's default MLP (non-gated GeLU) when no activation flag is given"),
    "num_query_groups": (None, "no grouped-query attention (Megatron-LM's default): as many key/value heads as "
                               "attention heads"),
    "ffn_hidden_size": (None, "Megatron-LM's default, 4 x hidden_size"),
    "num_virtual_stages_per_pipeline_rank": (
        None, "not interleaved: Megatron-LM's 1F1B without the flag"),
    "context_parallel_size": (1, "no context parallelism (Megatron-LM's default)"),
    "micro_batch_size": (1, "Megatron-LM's default"),
    "recompute_granularity": ("none", "no recomputation: Megatron-LM's default, and what the DGX Cloud benchmarks' "
                                      "GPT-3 175B and Llama 3.1 configurations set (NVIDIA/dgxc-benchmarking v25.02: "
                                      "gpt3_175b_hydra.yaml, llama3.1_8b.yaml, llama3.1_405b.yaml: "
                                      "activations_checkpoint_granularity null); Nemotron-4 340B's is in BY_SOURCE"),
    "sequence_parallel": (_sequence_parallel_default,
                          "on when tensor-parallel (tp > 1): NeMo 2.0's GPT-3 175B and Nemotron-4 340B recipes set "
                          "sequence_parallel=True with tp > 1; off at tp 1 (Megatron-LM's default)"),
}
"""Blank cell -> the value taken and why. The one place these choices are made."""

PRECISIONS = ("bf16", "fp8")
FP8_FORMAT = ("hybrid", "the format of NeMo 2.0's FP8 recipe (bf16_with_fp8_mixed: fp8='hybrid', E4M3 forward and "
                        "E5M2 gradients, delayed scaling), which the DGX Cloud benchmarks' FP8 rows run")
"""What an fp8 row with a blank ``fp8_format`` trains in, and why."""
SIMULATED_NEEDS = ("fp8", "context_parallel")
"""Capabilities in the ``needs`` column that trainsim simulates (other rows are skipped)."""
CONSISTENT_DATA = "consistent_data"
"""A ``needs`` entry for a row whose published figure disagrees with the same layout's in
another release of the same table, by more than any setting of the recipes explains (the
row's notes say which): it is left out of a fit until the discrepancy is explained, and
said so, not counted as a capability trainsim lacks."""

SC21_LAYERS_PER_VIRTUAL_STAGE = {96: 2, 105: 1}
"""Megatron-LM's ``--num-layers-per-virtual-pipeline-stage`` in the SC'21 paper's own run
scripts (NVIDIA/Megatron-LM examples/sc21): 2 for the 96-layer 175B model at tp 8, pp 12
(run_figure_12.sh, the interleaved case), 1 for the 105-layer 530B model at tp 8, pp 35
(run_table_1.sh), by the row's ``num_layers``."""


def _sc21_layers_per_virtual_stage(row: dict) -> int | None:
    return SC21_LAYERS_PER_VIRTUAL_STAGE.get(row.get("num_layers"))


BY_SOURCE = (
    # (text the row's source contains, settings it has no column for, why); a setting's value may be a
    # function of the row's other values (None: not set)
    ("Narayanan et al. SC'21", {"attention": "unfused", "num_layers_per_virtual_pipeline_stage": _sc21_layers_per_virtual_stage,
                                "overlap_grad_reduce": False, "accumulate_allreduce_grads_in_fp32": True,
                                "check_for_nan_in_grad": False},
     "Megatron-LM in 2021 had no fused attention kernel (FlashAttention, Dao et al., came in 2022; Megatron-LM's "
     "--use-flash-attn later): its core attention wrote the s x s scores (QK^T, fused scale-mask-softmax, dropout, AV); "
     "the paper's run scripts (NVIDIA/Megatron-LM examples/sc21) run these models interleaved "
     "(--num-layers-per-virtual-pipeline-stage 2 for 175B at tp 8, pp 12 in run_figure_12.sh; 1 for 530B at tp 8, "
     "pp 35 in run_table_1.sh) with DDP=local: Megatron-LM's local DDP all-reduces the gradient buffer after the "
     "whole backward (megatron/training.py train_step: allreduce_gradients() after forward_backward_func), in fp32 "
     "for bf16 (megatron/arguments.py: 'bfloat16 requires gradient accumulation and all-reduce to be done in fp32'); "
     "it divides the buffer by the data-parallel size in place before its all-reduce (megatron/model/distributed.py "
     "allreduce_gradients: buffer_.data /= dp, the scaling pass of sim.program.training.grad_prep) and checks no "
     "NaN before it (DDP's check_for_nan_in_grad came in 2023)"),
    ("Nemotron-4 340B", {"position_embedding_type": "rope", "disable_bias_linear": True,
                         "untie_embeddings_and_output_weights": True, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                         "recompute_granularity": "selective", "cross_entropy_loss_fusion": True,
                         "tp_comm_overlap": True},
     "the Nemotron-4 architecture (Nemotron-4 15B and 340B technical reports, NVIDIA 2024): rotary position "
     "embeddings, no bias terms, untied input and output embeddings, dropout 0; and the benchmark's configuration "
     "(NVIDIA/dgxc-benchmarking v25.02 nemotron/nemotron4-340b-synth.yaml: activations_checkpoint_granularity "
     "selective, which its configure.sh does not override): the core attention recomputed in backward; and "
     "cross_entropy_loss_fusion: true in the same file; its configure.sh sets model.ub_tp_comm_overlap=True"),
    ("Llama 3.1", {"normalization": "RMSNorm", "position_embedding_type": "rope", "disable_bias_linear": True,
                   "untie_embeddings_and_output_weights": True, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                   "cross_entropy_loss_fusion": True},
     "the Llama 3 architecture (Dubey et al. 2024, The Llama 3 Herd of Models: RMSNorm, rotary positions, no bias "
     "terms, untied input and output embeddings) as the benchmark configures it (NVIDIA/dgxc-benchmarking v25.02 "
     "llama3.1/llama3.1_8b.yaml and llama3.1_405b.yaml: normalization rmsnorm, position_embedding_type rope, bias "
     "false, share_embeddings_and_output_weights false, hidden_dropout and attention_dropout 0.0, "
     "cross_entropy_loss_fusion true)"),
    ("Nemotron-4 15B", {"position_embedding_type": "rope", "disable_bias_linear": True,
                        "untie_embeddings_and_output_weights": True, "hidden_dropout": 0.0, "attention_dropout": 0.0},
     "the Nemotron-4 architecture (Nemotron-4 15B technical report, Parmar et al. 2024: rotary position embeddings, "
     "no bias terms, untied input and output embeddings, no dropout; squared-ReLU MLP: the activation column)"),
    ("nemotron/README_15b", {"tp_comm_overlap": True},
     "the v25.02 benchmark's configuration (NVIDIA/dgxc-benchmarking nemotron/nemotron4-15b-synth.yaml: "
     "ub_tp_comm_overlap: True, sequence_parallel: true)"),
    ("mosaicml/llm-foundry", {"hidden_dropout": 0.0, "attention_dropout": 0.0},
     "MPT's defaults (llm-foundry MPTConfig: attn_pdrop, resid_pdrop and emb_pdrop 0.0; learned positions, biases, "
     "LayerNorm and tied embeddings as trainsim's defaults; the benchmark's NumParams, 6,658,859,008 for MPT-7B at "
     "2048 tokens, counts the biases and the learned positions)"),
    ("nemotron/README_15b.md @ 8f5cbb3799ea", {"grad_buckets": "megatron-core"},
     "the v25.02 Nemotron-4 15B benchmark alone runs Megatron-Core's distributed optimizer (NVIDIA/dgxc-benchmarking "
     "v25.02 nemotron/nemotron4-15b-synth.yaml: optim name mcore_distributed_optim; v25.01 had "
     "distributed_fused_adam), which NeMo 1.0 wraps in Megatron-Core's DDP (NeMo v2.2.0 megatron_gpt_model.py "
     "setup_mcore_distributed_parallel: bucket_size from optim.ddp_bucket_size, unset, so Megatron-Core's default; "
     "disable_bucketing for every model chunk after the first): sim.inputs.frameworks.GRAD_BUCKETS megatron-core"),
    ("nemotron/README.md @ 1f6d9f40e411", {"grad_buckets": "megatron-core"},
     "v25.05.04 ran NeMo 2.0 (NeMo 25.04), whose MegatronStrategy wraps every model chunk in Megatron-Core's DDP "
     "(sim.inputs.frameworks.GRAD_BUCKETS megatron-core; the bucket left at Megatron-Core's default, not checked "
     "against a MegatronCommOverlapCallback's 128M parameters)"),
    ("NVIDIA/dgxc-benchmarking", {"zero": 1, "overlap_param_gather": True, "check_for_nan_in_grad": False,
                                  "ddp_average_in_collective": True, "grad_buckets": "apex"},
     "every DGX Cloud benchmark's configuration shards the optimizer (NVIDIA/dgxc-benchmarking v25.02: "
     "gpt3_175b_hydra.yaml, nemotron4-340b-synth.yaml, llama3.1_8b.yaml and llama3.1_405b.yaml: optim name "
     "distributed_fused_adam with overlap_grad_sync and overlap_param_sync true, grad_sync_dtype bf16): the "
     "gradients are reduce-scattered during the last micro-batch's backward, each rank updates its shard, and the "
     "updated parameters are all-gathered during the next step's forward (ZeRO-1 with the gather overlapped); "
     "distributed_fused_adam is NeMo 1.0's Apex optimizer, not Megatron-Core's DDP (megatron_base_model.py: "
     "use_mcore_dist_optim only for optim name mcore_distributed_optim), whose bucket reduce-scatter averages in "
     "the collective (ReduceOp.AVG with average_grad_sync) with no NaN check or scaling pass before it "
     "(NVIDIA/apex apex/contrib/optimizers/distributed_fused_adam.py _start_bucket_grad_sync): no per-bucket "
     "kernels (check_for_nan_in_grad off, ddp_average_in_collective on, sim.program.training.grad_prep); and its "
     "buckets are Apex's as NeMo 1.0 groups them: one effective bucket a model chunk under interleaving (GPT-3 "
     "175B, Nemotron-4 340B, Llama 3.1 405B), else a transformer layer (Llama 3.1 8B), the embedding and the head "
     "with the stage's first (NeMo v2.2.0 megatron_gpt_model.py configure_optimizers: init_params_bucket per "
     "virtual stage or layer), not Megatron-Core DDP's (grad_buckets apex, sim.inputs.frameworks.GRAD_BUCKETS); "
     "each group's Apex buckets of bucket_cap_mb (v25.02: 220 MiB GPT-3 175B, 50 Nemotron-4 340B, 75 Llama 3.1 "
     "8B, 125 405B) start together, which trainsim runs as one collective"),
    ("nemo_megatron/README_175b", {"tp_comm_overlap": True, "tp_comm_overlap_cfg": "dgxc-25.02-gpt3-175b"},
     "the benchmark's configuration (NVIDIA/dgxc-benchmarking v25.02 nemo_megatron/gpt3_175b_hydra.yaml: "
     "ub_tp_comm_overlap: true, which its configure.sh does not override; BF16 and FP8 rows alike; and its "
     "ub_tp_comm_overlap_cfg, each GEMM's method and SMs: sim.inputs.tp_overlap's dgxc-25.02-gpt3-175b)"),
    ("llama3.1/README_405b", {"tp_comm_overlap": True, "tp_comm_overlap_cfg": "dgxc-25.02-llama3.1-405b"},
     "the benchmark's configuration (NVIDIA/dgxc-benchmarking v25.02 llama3.1/llama3.1_405b.yaml: "
     "ub_tp_comm_overlap: true and its ub_tp_comm_overlap_cfg, sim.inputs.tp_overlap's dgxc-25.02-llama3.1-405b; "
     "llama3.1_8b.yaml, tp 1, has it false)"),
    ("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md",
     {"zero": 1, "overlap_param_gather": True, "overlap_grad_reduce": True, "cross_entropy_loss_fusion": True,
      "cross_entropy_fusion_impl": "te", "accumulate_allreduce_grads_in_fp32": False, "check_for_nan_in_grad": False,
      "ddp_average_in_collective": True},
     "Megatron-Bridge's performance recipes of releases 25.09 (fa0315ae) and 25.11 (branch r0.2.0): every model "
     "recipe's optimizer is distributed_fused_adam with DistributedDataParallelConfig(overlap_grad_reduce=True, "
     "overlap_param_gather=True, use_distributed_optimizer=True) (src/megatron/bridge/recipes/llama/llama3.py, "
     "deepseek/deepseek_v3.py, qwen/qwen3_moe.py), the scripts set grad_reduce_in_fp32 False (set_*_common_configs, "
     "the 25.09 yamls) and cross_entropy_fusion_impl 'te' (set_common_perf_overrides; the 25.09 yamls): Transformer "
     "Engine's fused loss (sim.program.loss); the recipes' DDP configs set check_for_nan_in_grad=True and "
     "average_in_collective=True (llama3.py, qwen3_moe.py, deepseek_v3.py), and the performance scripts turn the "
     "NaN check off (25.11: set_common_perf_overrides, recipe.ddp.check_for_nan_in_grad = False; 25.09: every "
     "model's yaml, ddp: check_for_nan_in_grad: false) and average_in_collective off only for Megatron-FSDP "
     "(utils/helpers.py): the experts' 1/ep scaling before the reduce and no norm (sim.program.training.grad_prep); "
     "the DDP buckets "
     "are Megatron-Core's (sim.inputs.frameworks.GRAD_BUCKETS: one a chunk on later stages and chunks), of the "
     "size each row's bucket_size cell gives (the file's notes: 128M parameters where the recipe passes a "
     "CommOverlapConfig); a row's own "
     "cell wins (Megatron-FSDP rows: zero 3; the recipes that turn a gather or reduce overlap off)"),
    ("NeMo 25.02, DGX-B200", {"zero": 1, "overlap_param_gather": True, "cross_entropy_loss_fusion": True,
                              "bucket_size": 128 * 2**20 * 2, "check_for_nan_in_grad": True,
                              "ddp_average_in_collective": True, "transformer_engine": "1.14"},
     "NeMo 2.0's performance scripts as the B200 table ran them (NVIDIA/NeMo scripts/performance @ d3f25b121048, "
     "2025-03-08, the first commit whose model_configs_b200.csv has every row's layout, Llama 3.1 405B's 128 GPUs "
     "among them): every recipe's optimizer is distributed_fused_adam with overlap_grad_reduce and "
     "overlap_param_gather (nemo/collections/llm/recipes/*.py), and MegatronCommOverlapCallback sets a DDP "
     "bucket_size of 128 * 1024 * 1024 parameters when dp > 1 (megatron_comm_overlap.py), 256 MiB of the BF16 "
     "gradients the scripts reduce (grad_reduce_in_fp32 = False); GPTConfig's cross_entropy_loss_fusion defaults "
     "to True (nemo/collections/llm/gpt/model/base.py); each recipe's DistributedDataParallelConfig has "
     "check_for_nan_in_grad=True and average_in_collective=True (llama3_8b.py, llama3_70b.py, llama31_405b.py, "
     "mixtral_8x7b.py, mixtral_8x22b.py trainer()), which Megatron-Core 791b70e0's DDP runs as a norm over each "
     "bucket and, for the experts' buckets, a 1/ep scaling pass before the reduce-scatter "
     "(sim.program.training.grad_prep); pretrain_mixtral_8x22b.py turns average_in_collective off where etp != tp "
     "(the row's own cell); and the container's Transformer Engine: NeMo r2.2.0's "
     "requirements/manifest.json builds on nvcr.io/nvidia/pytorch:25.01-py3, whose Transformer Engine is 1.14.0 "
     "(the release_v1.14 branch: no non-TN FP8 path, so per-tensor FP8 casts write their transposes on Blackwell "
     "as on Hopper; TE 2.0, the first release without them there, came out in February 2025, and NeMo's fix "
     "for running it, 'Fix for te v2.0' #12273 of 2025-03-04, is not in v2.2.0); not confirmed from the "
     "container itself"),
)
"""Settings a source's rows take where the file has no column or a blank cell: the
framework or model facts of that source, each with the reason. A filled cell wins; a
source's setting wins over ``BLANKS``."""
FP8_BY_SOURCE = (
    ("nemo_megatron/README_175b", {"fp8_param_gather": True},
     "the benchmark's FP8 configuration keeps the GEMM weights in FP8 (NVIDIA/dgxc-benchmarking v25.02 "
     "nemo_megatron/gpt3_175b_hydra.yaml: fp8_params: true, NeMo's name for Megatron-LM's --fp8-param-gather): "
     "the distributed optimizer gathers them in FP8 and each step transposes them instead of casting BF16 ones"),
    ("NeMo 25.02, DGX-B200", {"fp8_param_gather": True},
     "the FP8 scripts' precision plugin (NVIDIA/NeMo @ d3f25b121048 nemo/collections/llm/recipes/precision/"
     "mixed_precision.py bf16_with_fp8_mixed: fp8 'hybrid', amax history 1024, 'max', fp8_params True, which "
     "nemo/lightning/pytorch/plugins/mixed_precision.py turns into fp8_param_gather with TE's DelayedScaling "
     "recipe)"),
)
"""Like ``BY_SOURCE``, for a source's FP8 rows only (recorded as "<text> (fp8 rows)")."""
FP8_ROWS = " (fp8 rows)"


@dataclass(frozen=True)
class MeasuredRun:
    """One row of the file, checked."""

    line: int
    """The file's line the row starts on (the header is line 1)."""
    values: dict
    """Settings by schema field name (``RunSettings.from_values``), the GPU left out."""
    measured_s: float
    gpu: str | None
    group: tuple
    """(source, precision, shape), or (source, the ``group`` column's text, ()) where it is filled: rows with
    the same key form one group."""
    source: str = ""
    framework: str = "megatron"
    """The ``framework`` setting the row ran (``sim.inputs.frameworks``)."""
    file: str = ""
    """The file the row was read from."""
    skip: str | None = None
    """Why the row is not simulated (None: it is)."""
    filled: tuple = field(default=())
    """The columns that were blank and took ``BLANKS``'s value."""
    by_source: tuple = field(default=())
    """The ``BY_SOURCE`` entries (their source text) whose settings the row took."""
    precision: str = "bf16"
    """The row's ``precision`` (bf16, fp8, ...)."""
    missing: tuple = field(default=())
    """The capabilities of its ``needs`` cell that trainsim does not simulate yet (the row is skipped)."""

    def label(self) -> str:
        v = self.values
        shape = v["model"] if "num_layers" not in v else f"{v['num_layers']}L h{v['hidden_size']}"
        return f"{shape}, {v['gpus']} GPUs"


def read_runs(path: str | Path) -> list[MeasuredRun]:
    """Every row of ``path``, checked (rows to skip carry ``skip``)."""
    from sim.fileio import read_text

    text = read_text(path, "RUNS.csv")
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise InputError(f"{path}: empty; expected a header line with {MEASURED} and the run's settings") from None
    _check_header(path, header)
    runs, start = [], reader.line_num + 1
    for cells in reader:
        line, start = start, reader.line_num + 1
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise InputError(f"{path}: line {line}: got {len(cells)} cells; the header has {len(header)} columns")
        runs.append(_run(path, line, dict(zip(header, (c.strip() for c in cells)))))
    if not runs:
        raise InputError(f"{path}: no rows; expected one run per line under the header")
    return runs


def _check_header(path, header: list[str]) -> None:
    allowed = SETTING_COLUMNS + EXTRA_COLUMNS + (MEASURED,)
    for name in header:
        if name not in allowed:
            raise InputError(f"{path}: line 1: unknown column {name!r}; allowed: {', '.join(allowed)}")
    dup = sorted({n for n in header if header.count(n) > 1})
    if dup:
        raise InputError(f"{path}: line 1: column {dup[0]!r} appears more than once")
    missing = [n for n in (REQUIRED if "model" not in header else REQUIRED[:2]) if n not in header]
    if missing:
        raise InputError(f"{path}: line 1: missing column {missing[0]!r}; required: {', '.join(REQUIRED)}")


def _bad(path, line: int, column: str, text: str, allowed: str) -> InputError:
    return InputError(f"{path}: line {line}: column {column}: got {text!r}; {allowed}")


def _setting(path, line: int, name: str, text: str):
    """A cell of a schema field as the field's Python value (checked like a flag)."""
    f = FIELDS[name]
    if f.kind in ("switch", "bool"):
        low = text.lower()
        if low not in ("true", "false", "1", "0", "yes", "no"):
            raise _bad(path, line, name, text, "expected true or false")
        return low in ("true", "1", "yes")
    try:
        value = value_of_text(f, text)
    except InputError as exc:
        if exc.allowed is None:
            raise
        raise _bad(path, line, name, text, exc.allowed) from None
    allowed = why_not_field(f, value)
    if allowed is not None:
        raise _bad(path, line, name, text, allowed)
    return value


def _positive_float(path, line: int, name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise _bad(path, line, name, text, "expected a number of seconds > 0")
    return value


def _run(path, line: int, cells: dict) -> MeasuredRun:
    preset = cells.get("model", "")
    for name in REQUIRED[:2] if preset else REQUIRED:
        if not cells[name]:
            raise _bad(path, line, name, "", "a run needs it; the cell is blank" if name in REQUIRED[:2] else
                       "a run needs it unless the model column names a preset; the cell is blank")
    values = {name: _setting(path, line, name, cells[name]) for name in SETTING_COLUMNS if cells.get(name)}
    filled = []

    def blank(name: str):
        filled.append(name)
        fill = BLANKS[name][0]
        return fill(values) if callable(fill) else fill

    by_source = []  # (before the blanks: what a source is known to have run beats a general default)

    def take(table, suffix: str = "") -> None:
        for text, settings, _ in table:
            if text in cells.get("source", ""):
                by_source.append(text + suffix)
                for name, value in settings.items():
                    if name not in values and (value := value(values) if callable(value) else value) is not None:
                        values[name] = value  # (a filled cell wins)

    take(BY_SOURCE)
    shape_blanks = () if preset else ("num_query_groups", "ffn_hidden_size")   # a preset has its own shape
    for name in shape_blanks + ("num_virtual_stages_per_pipeline_rank", "micro_batch_size", "recompute_granularity",
                                "sequence_parallel"):
        if name == "num_virtual_stages_per_pipeline_rank" and "num_layers_per_virtual_pipeline_stage" in values:
            continue  # (the source's interleaving, by layers per virtual stage)
        if name not in values and (fill := blank(name)) is not None:
            values[name] = fill
    activation = cells.get("activation") or ("" if preset else blank("activation"))
    if activation and activation not in ACTIVATIONS:
        raise _bad(path, line, "activation", activation, f"allowed: {', '.join(ACTIVATIONS)}")
    if activation and ACTIVATIONS[activation]:
        values["swiglu"] = True
    cp_text = cells.get("context_parallel_size") or str(blank("context_parallel_size"))
    cp = int(cp_text) if cp_text.isdigit() else 0
    if cp < 1:
        raise _bad(path, line, "context_parallel_size", cp_text, "expected an integer >= 1")
    if cp > 1:
        values["context_parallel_size"] = cp
    if "num_query_groups" in values and values.get("num_query_groups") == values.get("num_attention_heads"):
        del values["num_query_groups"]
    elif "num_query_groups" in values:
        values["group_query_attention"] = True
    measured = _positive_float(path, line, MEASURED, cells[MEASURED])
    precision = cells.get("precision") or blank("precision")
    if precision == "fp8":
        values.setdefault("fp8_format", FP8_FORMAT[0])
        take(FP8_BY_SOURCE, FP8_ROWS)
    elif "fp8_format" in values:
        raise _bad(path, line, "fp8_format", cells["fp8_format"], f"the row's precision is {precision}; an FP8 "
                                                                  "format needs precision fp8")
    needs = [n.strip() for n in cells.get("needs", "").split(",") if n.strip()]
    missing = [n for n in needs if n not in SIMULATED_NEEDS + (CONSISTENT_DATA,)]
    skip = (f"needs {', '.join(missing)} (not simulated yet)" if missing
            else "left out: its published figure disagrees with the same layout in another release (notes)"
            if CONSISTENT_DATA in needs
            else f"precision {precision}: trainsim simulates {' and '.join(PRECISIONS)}" if precision not in PRECISIONS
            else None)
    source = cells.get("source", "")
    shape = tuple(values.get(n) for n in SHAPE if n != "activation") + (activation,)
    group = (source, cells["group"], ()) if cells.get("group") else (source, precision, shape)
    return MeasuredRun(line, values, measured, cells.get("gpu") or None, group, source,
                       values.get("framework") or DEFAULT_FRAMEWORK, str(path), skip, tuple(filled), tuple(by_source),
                       precision, tuple(missing))
