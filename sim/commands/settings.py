"""The run settings on the command line: which schema fields each command takes as
flags, and the settings a parsed command line (over an experiment file) stands for.

The flags themselves come from the schema (``sim.inputs.schema.add_arguments``): a
field's flag, help, type and choices are written once, there.
"""

from __future__ import annotations

import sys

from sim.fileio import check_output_dir
from sim.inputs.experiment import Setting, Where
from sim.inputs.flags import given
from sim.inputs.schema import RunSettings, fields_of

MODEL_FLAGS = fields_of("model")
HARDWARE_FLAGS = ["gpu", "gpus", "gpus_per_node", "power_limit_w"]
"""The GPUs: which, how many, how many a node holds, their power cap."""
NETWORK_FLAGS = ["topology", "fabric", "oversubscription", "pin_to_nvlink_domain"]
"""How the nodes are joined (``--nodes`` is listed by each command, where its help reads best)."""
ESTIMATE_FLAGS = [*MODEL_FLAGS, *HARDWARE_FLAGS, "nodes", *fields_of("plan"), "json"]
"""What ``trainsim estimate`` takes: the model, the GPUs (``--gpus`` or ``--nodes``, as on
every command that describes a cluster) and the plan."""
RUN_FLAGS = [*ESTIMATE_FLAGS, *NETWORK_FLAGS, "gpu_hour_price", *fields_of("simulation"), "out", "kineto"]
"""What ``trainsim run`` (and ``compare``) take: all of it."""


def typed(args) -> dict[str, Setting]:
    """The settings typed on the command line (no file, no line: errors about them are
    left as the flag's own)."""
    return {name: Setting(name, name, value, Where()) for name, value in given(args).items()}


def run_settings(args) -> RunSettings:
    """The settings a command line stands for, defaults filled in."""
    return RunSettings.from_values(given(args))


def say_defaults(model_settings) -> None:
    """Say on stderr a default the user may not expect, once, before the work: the sequence
    length a ``--hf-config`` model gets without ``--seq-length`` (``sim.inputs.hf_config``)."""
    if model_settings.hf_config and model_settings.seq_length is None:
        from sim.inputs.hf_config import seq_length_note

        print(f"trainsim: note: {seq_length_note(model_settings.hf_config)}", file=sys.stderr)


def analytic_inputs(args):
    """What the analytic commands (``estimate``, ``explain``) work on: the settings, the
    model, the plan and the GPU's profile of a command line."""
    from sim.inputs.resolve import model_from_settings, plan_from_settings, profile_from_settings

    settings = run_settings(args)
    model = model_from_settings(settings.model)
    say_defaults(settings.model)
    plan = plan_from_settings(settings.plan, settings.cluster.total_gpus(), model)
    profile = profile_from_settings(settings.cluster)
    if plan.layer_split == "auto":  # (balanced on the one GPU type, as ``sim.session.prepare`` does)
        from sim.program.stage_balance import auto_layer_split

        plan = auto_layer_split(model, plan, profile)
    return settings, model, plan, profile


def check_outputs(args) -> None:
    """``--out``, ``--kineto`` and ``--export-chakra`` must be folders that can be written:
    checked before any work."""
    check_output_dir(args.out, "--out")
    check_output_dir(args.kineto, "--kineto")
    check_output_dir(getattr(args, "export_chakra", None), "--export-chakra")
