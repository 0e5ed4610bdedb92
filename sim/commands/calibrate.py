"""``trainsim calibrate``: measure this machine with real kernels and write a profile.

Runs the microbenchmarks (GEMMs of the given model and plan plus a grid, attention,
norms, activations, softmax, a large copy) on ``--procs`` processes at once and the
collective sweep between them, fits the profile's models and writes a HardwareProfile
JSON that ``--gpu PROFILE.json`` accepts (``sim.calibrate.profile`` explains what is
measured and what is taken from a base profile). Works unchanged on a CPU machine (gloo
over loopback, float32) and a GPU node (NCCL, bf16); started under ``torchrun`` on
several nodes it measures across them (rank 0 writes the file). Needs the
``trainsim[calibrate]`` extra (torch).
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.errors import InputError
from sim.inputs.flags import add_arguments as add_schema_arguments, add_section, given
from sim.inputs.schema import RunSettings
from sim.inputs.schema_commands import CALIBRATE_SETTINGS, CalibrateMeasurement, CalibrateOutput

NAME = "calibrate"
HELP = "Measure this machine with real kernels and collectives; write a hardware profile JSON."


def add_arguments(p) -> None:
    add_schema_arguments(p, CALIBRATE_SETTINGS, groups={
        "model (one of)": "model whose GEMM shapes to measure (optional; one of)",
        "parallelism and batch (Megatron-LM flags)": "plan (what changes the GEMM shapes)"})
    add_section(p, CalibrateMeasurement)
    add_section(p, CalibrateOutput)


def _model_and_plan(args):
    from sim.inputs.plan import ParallelPlan
    from sim.inputs.resolve import has_model, model_from_settings

    settings = RunSettings.from_values({k: v for k, v in given(args).items() if k in CALIBRATE_SETTINGS})
    if not has_model(settings.model):
        if settings.model.seq_length is not None:
            raise InputError("--seq-length: given without a model; add --model, --hf-config or Megatron shape flags")
        return None, None
    model = model_from_settings(settings.model)
    p = settings.plan
    plan = ParallelPlan(tp=p.tensor_model_parallel_size, micro_batch_size=p.micro_batch_size,
                        sequence_parallel=p.sequence_parallel)
    plan.check_model(model)
    return model, plan


def run(args) -> int:
    from sim.calibrate import CalibrationError, require_torch
    from sim.fileio import check_output_file, write_json_atomic
    from sim.inputs.hardware import load_profile

    # Every input error before torch is imported and anything is measured.
    model, plan = _model_and_plan(args)
    out = check_output_file(args.out, "--out", suffix=".json")
    check_output_file(args.measurements, "--measurements")
    if args.base is not None:
        load_profile(args.base, flag="--base")
    require_torch()
    from sim.calibrate.launch import default_procs, torchrun_env
    from sim.calibrate.profile import calibrate

    procs = args.procs if args.procs is not None else default_procs()
    try:
        result = calibrate(model, plan, procs=procs, quick=args.quick, name=args.name, base=args.base, link=args.link)
    except CalibrationError as exc:
        print(f"trainsim: calibration failed: {exc}")
        return 1
    if result is None:  # a non-zero rank of a torchrun job: rank 0 reports
        return 0
    profile, fits, meas = result
    write_json_atomic(profile.to_dict(), out)
    if args.measurements:
        write_json_atomic({"measurements": meas, "fits": fits}, args.measurements)
    if args.json:
        print(json.dumps(profile.to_dict(), indent=2))
        return 0
    _print(profile, fits, meas, out, torchrun_env() is not None)
    return 0


def _print(profile, fits, meas, out: Path, job: bool) -> None:
    prov = profile.provenance
    print(f"calibrated {prov.get('device')} ({prov.get('backend')}, {prov.get('dtype')}), "
          f"{prov.get('processes')} process(es) x {prov.get('threads_per_process')} thread(s)"
          f"{' in a torchrun job' if job else ''}; torch {prov.get('torch')}, {prov.get('date')}")
    micro = meas["micro"]
    print(f"  peak               {profile.peak() / 1e12:10.3f} TFLOP/s  ({profile.sources['peak_flops'].split(':')[0]})")
    g = fits["gemm"]
    print(f"  GEMM efficiency    best {g['gemm_max_efficiency']:.3f}, k0 {g['gemm_k_overhead']:.0f}, "
          f"{len(micro['gemm'])} shapes, RMS log error {g['rms_log_error']:.3f}")
    a = fits["attention"]
    print(f"  attention          best {a['attention_max_efficiency']:.3f}, RMS log error {a['rms_log_error']:.3f}"
          f"{' (capped at 1)' if a['clipped'] else ''}")
    mem = fits["memory"]
    print(f"  memory             {profile.hbm_bandwidth_Bps / 1e9:8.2f} GB/s x efficiency {profile.memory_efficiency:.3f} "
          f"(copy {micro['copy']['bandwidth_Bps'] / 1e9:.2f} GB/s), RMS error {mem['rms_rel_error']:.1%}")
    print(f"  kernel overhead    {profile.kernel_launch_s * 1e6:8.2f} us")
    if "link" in fits:
        lf = fits["link"]
        print(f"  link {lf['kind']:<13} alpha {lf['latency_s'] * 1e6:.1f} us, B {lf['bandwidth_Bps'] / 1e9:.2f} GB/s "
              f"(largest message busbw {lf['largest_busbw_Bps'] / 1e9:.2f} GB/s), RMS error {lf['rms_rel_error']:.1%}")
    print(f"wrote {out}; use it with --gpu {out}")
