"""Experiment files: a model, a cluster and a plan in TOML, read strictly.

An experiment file uses the command line's names with underscores, in three tables:

    [model]    preset = "gpt3-175b"   (or hf_config = "...", or num_layers = ..., ...)
    [cluster]  gpu = "a100-80gb", nodes = 128, fabric = "rail", ...
    [plan]     tensor_model_parallel_size = 8, pipeline_model_parallel_size = 16,
               micro_batch_size = 1, global_batch_size = 1536, schedule = "1f1b", ...

Each key is checked against the flag it stands for: unknown keys, wrong types and
unknown tables are errors naming the file, line and key. The file becomes the flags it
stands for, and flags typed on the command line after it override it, so a file and
the CLI can never disagree about what a key means.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.tomlio import TomlFile

# Which flags (by argparse dest) each table may set.
TABLES = {
    "model": {"model": "preset", "hf_config": None, "num_layers": None, "hidden_size": None,
              "num_attention_heads": None, "ffn_hidden_size": None, "vocab_size": None, "seq_length": None,
              "max_position_embeddings": None, "group_query_attention": None, "num_query_groups": None,
              "swiglu": None, "normalization": None, "position_embedding_type": None,
              "untie_embeddings_and_output_weights": None, "disable_bias_linear": None,
              "attention_dropout": None, "hidden_dropout": None},
    "cluster": {"gpu": None, "gpus": None, "gpus_per_node": None, "nodes": None, "topology": None,
                "fabric": None, "oversubscription": None, "fidelity": None},
    "plan": {"tensor_model_parallel_size": None, "pipeline_model_parallel_size": None,
             "num_layers_per_virtual_pipeline_stage": None, "num_virtual_stages_per_pipeline_rank": None,
             "schedule": None, "decoder_first_pipeline_num_layers": None, "decoder_last_pipeline_num_layers": None,
             "account_for_embedding_in_pipeline_split": None, "account_for_loss_in_pipeline_split": None,
             "placement": None, "sequence_parallel": None, "micro_batch_size": None, "global_batch_size": None,
             "recompute_granularity": None, "zero": None, "overlap_grad_reduce": None, "bucket_size": None,
             "zero3_prefetch_depth": None, "zero_bucket_size": None},
    # DeepSpeed's names (its JSON config's "zero_optimization" object).
    "zero_optimization": {"zero": "stage", "offload_optimizer": None,
                          "zero3_prefetch_bucket_size": "stage3_prefetch_bucket_size",
                          "zero3_max_live_parameters": "stage3_max_live_parameters"},
}
_TOP = {"name", "description", *TABLES}
# Values that may be file paths, resolved against the experiment file's folder.
_PATHS = {"hf_config": lambda v: True, "topology": lambda v: v.endswith(".toml"),
          "schedule": lambda v: v.endswith(".csv"), "gpu": lambda v: v.endswith(".json")}


def _key_of(dest: str, table: str) -> str:
    """The TOML key for a flag's dest (``--model`` is ``preset`` in [model])."""
    return TABLES[table][dest] or dest


def experiment_argv(path: str, parser: argparse.ArgumentParser) -> list[str]:
    """The flags an experiment file stands for, in the order a user would type them."""
    f = TomlFile(path)
    data = f.data
    f.check_keys(data, _TOP, "")
    actions = {a.dest: a for a in parser._actions}
    argv: list[str] = []
    for table, dests in TABLES.items():
        t = data.get(table, {})
        if not isinstance(t, dict):
            raise f.error(table, f"got {t!r}; expected a table [{table}]")
        keys = {_key_of(d, table): d for d in dests if d in actions}
        f.check_keys(t, keys, f"{table}.")
        for key, value in t.items():
            dest = keys[key]
            if dest in _PATHS and isinstance(value, str) and _PATHS[dest](value):
                p = Path(value)
                if not p.is_absolute() and (f.path.parent / p).exists():
                    value = str(f.path.parent / p)  # relative to the experiment file
            argv += _flag(f, f"{table}.{key}", actions[dest], value)
    return argv


def _flag(f: TomlFile, key: str, action: argparse.Action, value) -> list[str]:
    opt = action.option_strings[0]
    if isinstance(action, argparse.BooleanOptionalAction):
        if not isinstance(value, bool):
            raise f.error(key, f"got {value!r}; expected true or false")
        return [opt] if value else [next(o for o in action.option_strings if o.startswith("--no-"))]
    if action.nargs == 0:  # store_true
        if not isinstance(value, bool):
            raise f.error(key, f"got {value!r}; expected true or false")
        return [opt] if value else []
    if action.type is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise f.error(key, f"got {value!r}; expected an integer")
    if action.type is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise f.error(key, f"got {value!r}; expected a number")
    if action.type is None and not isinstance(value, (str, int)) or isinstance(value, bool):
        raise f.error(key, f"got {value!r}; expected a string")
    if action.choices is not None and value not in action.choices:
        raise f.error(key, f"got {value!r}; allowed: {', '.join(map(str, action.choices))}")
    return [opt, str(value)]
