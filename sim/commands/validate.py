"""``trainsim validate``: a real training run and its simulation, side by side.

Calibrates this machine (a quick sweep, its collectives extended to the largest data-parallel
message, plus the reference model's own GEMM shapes;
``--profile`` skips it), then for each configuration trains a small GPT for real across
``--procs`` local processes (data parallel, a GPipe or 1F1B pipeline, data × pipeline)
and simulates the same model, plan and schedule on the calibrated profile and a
topology of this machine (``sim.calibrate.validate``). Prints the table configuration |
measured | simulated | Δ% for the iteration time and each stage's compute and idle time
with the mean and max error, or one JSON object with ``--json`` (``rows`` of
``config``, ``measured_s``, ``simulated_s``, ``error``; ``mean_abs_error`` and
``max_abs_error`` over the iteration times, as fractions). ``--out DIR`` writes
``report.json``, ``table.txt``, the profile, each configuration's profiler traces and a
PNG per configuration with the measured timeline above the simulated one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sim.errors import InputError

NAME = "validate"
HELP = "Train a small GPT for real across local processes and compare it with its simulation."


def add_arguments(p) -> None:
    from sim.inputs.fields import defaults_of_class, fields_of_class
    from sim.inputs.flags import add_fields, add_section
    from sim.inputs.schema import FIELDS
    from sim.inputs.schema_commands import (VALIDATE_DEFAULTS, VALIDATE_HELPS, VALIDATE_MODEL, ValidateBatch,
                                            ValidateOptions, ValidateOutput)

    add_section(p, ValidateOptions)
    batch = [FIELDS[n] for n in VALIDATE_MODEL]  # the run's settings, in validate's own section
    add_fields(p, [*batch, *fields_of_class(ValidateBatch, "validate")],
               groups={f.group: ValidateBatch.GROUP for f in batch},
               defaults={**defaults_of_class(ValidateBatch), **VALIDATE_DEFAULTS}, helps=VALIDATE_HELPS)
    add_section(p, ValidateOutput)


def _positive(name: str, value) -> None:
    if value is not None and (not isinstance(value, int) or value < 1):
        raise InputError(f"--{name}: got {value!r}; expected an integer >= 1")


def run(args) -> int:
    from sim.calibrate import CalibrationError, require_torch
    from sim.calibrate.reference import Timing
    from sim.calibrate import validate as v
    from sim.calibrate.reference import check_supported
    from sim.fileio import check_output_dir, write_json_atomic, write_text_atomic
    from sim.inputs.hardware import load_profile

    for name in ("procs", "num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length",
                 "micro_batch_size", "num_microbatches", "iters"):
        _positive(name.replace("_", "-"), getattr(args, name))
    if args.warmup is not None and args.warmup < 0:
        raise InputError(f"--warmup: got {args.warmup}; expected an integer >= 0")
    from sim.calibrate.launch import torchrun_env

    job = torchrun_env()
    if job is not None:  # under torchrun the job's ranks are the processes
        args.procs = job[1]
    configs = [c.strip() for c in args.configs.split(",") if c.strip()] if args.configs else v.default_configs(args.procs)
    if not configs:
        raise InputError(f"--configs: got {args.configs!r}; allowed: {', '.join(v.CONFIGS)}")
    model = v.default_model(args.quick, num_layers=args.num_layers, hidden_size=args.hidden_size,
                            num_attention_heads=args.num_attention_heads, vocab_size=args.vocab_size,
                            seq_length=args.seq_length)
    m = args.num_microbatches or (2 if args.quick else 4)
    plans = {c: v.config_plan(c, args.procs, args.micro_batch_size, m) for c in configs}
    for plan in plans.values():  # every input error before anything runs
        plan.check_model(model)
        check_supported(model, plan)
    out = check_output_dir(args.out, "--out")
    given = load_profile(args.profile, flag="--profile") if args.profile else None
    require_torch()
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    iters = args.iters or (3 if args.quick else 5)
    tol = v.STEADY_TOLERANCE if args.probe_tolerance is None else args.probe_tolerance
    tol = None if tol == float("inf") else tol
    try:
        if given is not None:
            profile = given
        else:
            from sim.calibrate.profile import calibrate

            # The link fit covers the largest message the reference sends: a data-parallel
            # bucket can hold every gradient of the model (float32 on a CPU).
            up_to = model.num_params * 4 if any(p.dp > 1 for p in plans.values()) else None
            result = calibrate(model, plans[configs[0]], procs=args.procs, quick=True, link=args.link,
                               collective_up_to=up_to)
            if result is None:
                return _follow(model, plans, warmup, iters, out, tol)
            profile = result[0]
        load_before = os.getloadavg()
        report = v.run_validation(plans, profile=profile, model=model, timing=Timing(warmup, iters, tolerance=tol),
                                  out=out, link=args.link)
    except CalibrationError as exc:
        print(f"trainsim: validation failed: {exc}")
        return 1
    if report is None:
        return 0
    report["load_average"] = {"before": list(load_before), "after": list(os.getloadavg()),
                              "cpus": os.cpu_count()}
    report["profile_provenance"] = profile.provenance
    table = v.format_table(report["rows"], report)
    if out is not None:
        write_json_atomic(profile.to_dict(), out / "profile.json")
        write_json_atomic(report, out / "report.json")
        probes_line = v.format_probes(report["configs"])
        write_text_atomic(table + "\n" + (probes_line + "\n" if probes_line else ""), out / "table.txt")
    if args.json:
        print(json.dumps(report, sort_keys=True))
        return 0
    print(f"reference: {model.describe()}; {args.procs} processes, profile {profile.name}")
    print(table)
    probes = v.format_probes(report["configs"])
    if probes:
        print(probes)
    for line in v.format_unsteady(report["configs"], iters):
        print(line)
    la = report["load_average"]
    print(f"load average {la['before'][0]:.2f} before, {la['after'][0]:.2f} after, on {la['cpus']} CPUs "
          "(a busy machine makes the measured side noisy)")
    if out is not None:
        print(f"wrote {out / 'report.json'}, table.txt, profile.json, traces/ and "
              f"{', '.join(c + '.png' for c in configs)}")
    return 0


def _follow(model, plans: dict, warmup: int, iters: int, out: Path | None, tolerance: float | None) -> int:
    """A non-zero rank of a torchrun job: take part in the reference runs as rank 0 does (it has
    no profile, so its own probes do not gate; rank 0's do, and every rank follows its decision)."""
    from sim.calibrate.reference import Timing, run_reference

    from sim.calibrate.validate import probe_shape, probe_timing

    for config, plan in plans.items():
        run_reference(model, plan, probe_timing(Timing(warmup, iters, tolerance=tolerance), probe_shape(model, plan)),
                      trace_dir=(out / "traces" / config) if out is not None else None)
    return 0
