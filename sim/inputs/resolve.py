"""From settings to the objects a run is built from: the model, the plan, the cluster.

Each function takes a section of ``sim.inputs.schema`` and returns the checked object
(``ModelSpec``, ``ParallelPlan``, ``Topology``), or raises ``InputError`` naming the
setting by its flag (an experiment file's errors are pointed at its key and line by
``sim.inputs.experiment.blame``).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from sim.errors import InputError, require
from sim.inputs.frameworks import framework_named
from sim.inputs.hf_config import model_from_hf_config
from sim.inputs.megatron_model import model_from_megatron_settings, pattern_layout
from sim.inputs.model import PRESETS, ModelSpec, layer_params_per_rank, preset, with_seq_length
from sim.inputs.placement import DEFAULT_PLACEMENT
from sim.inputs.plan import SCHEDULES, ParallelPlan
from sim.inputs.flags import add_arguments, did_you_mean, given
from sim.inputs.schema import FIELDS, ClusterSettings, ModelSettings, PlanRequest, fields_of
from sim.inputs.schema_model import MEGATRON_ONLY, PRESET_OVERRIDES, SHAPE
from sim.inputs.topology import Topology
from sim.inputs.topology_build import NODE_OF_GPU  # noqa: F401 (re-exported)

PLAN_FIELDS = {f.attr: f for f in FIELDS.values() if f.section == "plan"}
"""The plan's settings by ``ParallelPlan`` attribute."""

def has_model(m: ModelSettings) -> bool:
    """Whether the settings name a model at all (a preset, a config.json or a shape)."""
    return bool(m.model or m.hf_config or any(getattr(m, k) is not None for k in SHAPE))


def model_from_settings(m: ModelSettings) -> ModelSpec:
    """The ModelSpec the settings describe (exactly one source)."""
    megatron = any(getattr(m, k) is not None for k in SHAPE)
    chosen = [n for n, on in (("--model", m.model), ("--hf-config", m.hf_config),
                              ("Megatron shape flags", megatron)) if on]
    if len(chosen) != 1:
        raise InputError(f"model: got {', '.join(chosen) or 'nothing'}; give exactly one of --model PRESET, "
                         "--hf-config PATH or Megatron flags (--num-layers --hidden-size ...)")
    if not megatron:
        for f in MEGATRON_ONLY:
            require(getattr(m, f) is None, FIELDS[f].flag, getattr(m, f),
                    "describes a model given by Megatron shape flags (--num-layers --hidden-size ...), not a "
                    "preset or a config.json", setting=f)
    if m.model:
        require(m.model in PRESETS, "--model", m.model, f"allowed presets: {', '.join(PRESETS)}")
        model = preset(m.model)
        model = with_seq_length(model, m.seq_length) if m.seq_length else model
    elif m.hf_config:
        model = model_from_hf_config(m.hf_config, seq_length=m.seq_length)
    else:
        return model_from_megatron_settings(m)
    return with_moe_settings(model, m)


def with_moe_settings(model: ModelSpec, m: ModelSettings) -> ModelSpec:
    """A preset's or config.json's model with the MoE/MLA flags given on top (``--num-experts 16``,
    ``--moe-router-topk 1``, ...: ``sim.inputs.schema_model.PRESET_OVERRIDES``); an error names the flag."""
    changes = {f: getattr(m, f) for f in PRESET_OVERRIDES if getattr(m, f) is not None}
    if not changes:
        return model
    try:
        return replace(model, **changes)
    except InputError as exc:
        raise (exc.renamed(FIELDS[exc.setting].flag) if exc.setting in changes else exc) from None


class _StrictParser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: D401 - argparse API: one line, no usage dump
        raise InputError(" ".join(message.split()))

    def parse_args(self, args=None, namespace=None):  # a misspelled flag gets "did you mean", as on the command line
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            known = [o for a in self._actions for o in a.option_strings]
            raise InputError(f"unrecognized arguments: {' '.join(extras)}{did_you_mean(extras, known)}")
        return ns


MEGATRON_SHAPE_FIELDS = tuple(n for n in fields_of("model") if n not in ("model", "hf_config"))
"""The Megatron-LM model-shape settings (``--num-layers``, ``--hidden-size``, ...)."""


def model_from_megatron_args(argv: Sequence[str], name: str = "megatron") -> ModelSpec:
    """A spec from a Megatron-LM argument list, e.g. ``['--num-layers', '96', ...]``."""
    parser = _StrictParser(prog="megatron-args", add_help=False, allow_abbrev=False, exit_on_error=False)
    add_arguments(parser, MEGATRON_SHAPE_FIELDS)
    try:
        ns = parser.parse_args(list(argv))
    except argparse.ArgumentError as exc:
        raise InputError(f"{exc.argument_name}: {exc.message}") from None
    return model_from_megatron_settings(ModelSettings(**given(ns)), name)


def plan_from_settings(p: PlanRequest, gpus: int | None, model: ModelSpec) -> ParallelPlan:
    """The ``ParallelPlan`` of the plan settings ``p`` on ``gpus`` GPUs (None: tp x pp x cp),
    checked against the model. What the plan cannot know alone is filled in here: ``dp`` from
    the GPUs, ``vpp`` from ``--num-layers-per-virtual-pipeline-stage`` and the ZeRO-3 prefetch
    depth from DeepSpeed's bucket size (both need the model's layers), the schedule file, and the
    pipeline layout that the ``|`` of the model's hybrid pattern set
    (``sim.inputs.megatron_model.pattern_layout``) unless the plan splits the layers another way;
    every other value goes to the plan as its field's ``convert`` makes it, and the plan checks
    its own rules."""
    given = dict(p.given)
    pattern = model.hybrid_override_pattern
    layout = pattern_layout(pattern)
    if layout is not None:
        other = [a for a in ("pipeline_layout", "layer_split", "first_stage_layers", "last_stage_layers",
                             "account_for_embedding", "account_for_loss") if given.get(a)]
        require(not other, "--hybrid-override-pattern", pattern,
                "its | already places the layers on the pipeline stages; cannot be combined with "
                + ", ".join(f"--{PLAN_FIELDS[a].name.replace('_', '-')}" for a in other),
                setting="hybrid_override_pattern")
        given["pipeline_layout"] = layout
    tp, pp, cp = given.get("tp", 1), given.get("pp", 1), given.get("cp", 1)
    gpus = gpus if gpus is not None else tp * pp * cp
    require(gpus > 0 and gpus % (tp * pp * cp) == 0, "--gpus", gpus,
            f"must be a positive multiple of tensor x pipeline x context parallel size = {tp} x {pp} x {cp}",
            setting="gpus")
    values = {}
    for attr, value in given.items():
        convert = PLAN_FIELDS[attr].convert
        values[attr] = convert(value) if convert is not None else value
    per, chunks = values.get("layers_per_virtual_stage"), values.get("vpp")
    if per is not None:
        _plan_require(chunks is None, "vpp", chunks, "give it or --num-layers-per-virtual-pipeline-stage, not both")
        uneven = any(values.get(a) for a in ("first_stage_layers", "last_stage_layers", "account_for_embedding",
                                              "account_for_loss"))
        _plan_require(not uneven, "layers_per_virtual_stage", per,
                      "assumes an even split; with uneven stages give --num-virtual-stages-per-pipeline-rank")
        _plan_require(model.num_layers % (pp * per) == 0, "layers_per_virtual_stage", per,
                      f"must divide num_layers / pp = {model.num_layers} / {pp}")
        values["vpp"] = model.num_layers // (pp * per)
    schedule = values.get("schedule")
    builtin = [s for s in SCHEDULES if s != "custom"]
    if schedule is not None and schedule not in builtin:
        for cond, allowed in ((schedule.endswith(".csv"), f"allowed: {', '.join(builtin)}, or a path to a schedule "
                                                          ".csv"),
                              (not Path(schedule).is_dir(), "is a directory; expected a schedule .csv file"),
                              (Path(schedule).is_file(), "no such schedule file")):
            _plan_require(cond, "schedule", schedule, allowed)
        values.update(schedule="custom", schedule_file=schedule)
    bucket = values.get("zero3_prefetch_bucket_size")
    framework = framework_named(values.get("framework"))
    if framework is not None and framework.deepspeed:  # DeepSpeed's prefetch is its own (sim.inputs.frameworks)
        _plan_require("zero3_prefetch_depth" not in values, "zero3_prefetch_depth", values.get("zero3_prefetch_depth"),
                      "not a setting of framework deepspeed: DeepSpeed prefetches by elements, not layers: give "
                      "--zero3-prefetch-bucket-size")
    elif bucket is not None:
        _plan_require("zero3_prefetch_depth" not in values, "zero3_prefetch_bucket_size", bucket,
                      "give it or --zero3-prefetch-depth, not both")
        values["zero3_prefetch_depth"] = math.ceil(bucket / layer_params_per_rank(model, tp))
    if cp > 1 and values.get("placement", DEFAULT_PLACEMENT) == DEFAULT_PLACEMENT:
        values["placement"] = "tp-dp-pp"  # Megatron-LM's order: tp, cp, dp, pp from innermost
    plan = ParallelPlan(dp=gpus // (tp * pp * cp), **values)
    plan.check_model(model)
    return plan


def _plan_require(cond: bool, attr: str, value, allowed: str) -> None:
    require(cond, PLAN_FIELDS[attr].flag, value, allowed, setting=attr)


def profile_from_settings(c: ClusterSettings):
    """The GPU's ``HardwareProfile`` (a preset or a profile .json), under ``power_limit_w``'s
    cap when one is given (``sim.inputs.power.capped``), at the GPU-hour price given
    (``sim.inputs.cost.priced``)."""
    from sim.inputs.cost import priced
    from sim.inputs.hardware import load_profile
    from sim.inputs.power import capped

    return priced(capped(load_profile(c.gpu, flag="--gpu"), c.power_limit_w), c.prices())


def topology_from_settings(c: ClusterSettings, world: int, profile_name: str) -> Topology:
    """The cluster: ``c.topology`` (default: the GPU's DGX node) times ``c.nodes`` (default:
    enough for ``world`` GPUs) on ``c.fabric``; checked to hold ``world`` GPUs."""
    from sim.inputs.topology_build import FabricSpec, load_topology

    topo_name = c.topology or NODE_OF_GPU.get(profile_name)
    if topo_name is None:
        raise InputError(f"--topology: not given, and GPU profile {profile_name!r} has no built-in node; "
                         f"give --topology NODE.toml (built-in GPUs: {', '.join(NODE_OF_GPU)})")
    fabric = None
    if c.fabric or c.oversubscription:
        fabric = FabricSpec(type=c.fabric or "rail", oversubscription=c.oversubscription or 1.0)
    topo = load_topology(topo_name, nodes=c.nodes, fabric=fabric, min_gpus=world, flag="--topology",
                         gpus_per_node=c.gpus_per_node)
    if topo.num_gpus < world:
        raise InputError(field="--gpus", value=world, setting="gpus" if c.gpus == world else None,
                         allowed=f"topology {topo.name} has {topo.num_gpus} GPUs"
                         + (f" (--nodes {c.nodes})" if c.nodes is not None else ""))
    if c.gpus_per_node is not None and topo.gpus_per_node != c.gpus_per_node:
        raise InputError(field="--gpus-per-node", value=c.gpus_per_node, setting="gpus_per_node",
                         allowed=f"topology {topo.name} has {topo.gpus_per_node} GPUs per node")
    return topo
