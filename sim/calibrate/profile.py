"""``calibrate``: measure this machine and write a HardwareProfile from the measurements.

One group of worker processes (``sim.calibrate.launch``) runs the kernel
microbenchmarks on every rank at once (``sim.calibrate.microbench``), then the
collective sweep between the ranks (``sim.calibrate.collectives``). The parent merges
the ranks' timings (median per record), fits the profile's models
(``sim.calibrate.fit``) and assembles a ``HardwareProfile`` whose every field says in
``sources`` how it was obtained, and whose ``provenance`` records the machine, the
library versions and the date.

What is measured and what is taken from elsewhere:

- fitted: ``gemm_max_efficiency``, ``gemm_k_overhead``, the tiles' relative
  efficiencies, ``attention_max_efficiency``, ``memory_efficiency``,
  ``kernel_launch_s`` (on a GPU the intercept of the memory-bound kernels' fit; on a CPU,
  which runs the framework and the kernels on one thread, the fixed cost per kernel of a
  tiny training step, ``microbench.bench_framework``; the intercept is kept in
  ``provenance['kernel_launch_alone_s']``), ``hbm_bandwidth_Bps`` (a large copy), on a CPU
  ``profiler_op_overhead_s`` (``reference_model.bench_profiler``), and α-β of the link kind the
  processes talk over (``--link``; default ``nvlink`` between GPUs of one node,
  ``ib`` across nodes, ``ethernet`` for CPU processes over loopback TCP);
- from the device: SM count and memory capacity (on a CPU: threads per process and RAM);
- peak FLOP/s: the datasheet figure of a base profile when one is known (a GPU whose
  name matches a preset, or ``--base``), else the best GEMM rate measured, so that
  efficiencies are relative to what this machine showed it can do. On a CPU the
  training runs in float32 and the profile's ``bf16`` entry holds that float32 rate,
  because trainsim's costs read the training dtype's peak from ``bf16``.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

from sim.calibrate import collectives as coll
from sim.calibrate import fit, microbench
from sim.calibrate.launch import Context, machine_info, run_workers
from sim.errors import InputError
from sim.inputs.hardware import LINK_KINDS, HardwareProfile, LinkModel, load_profile

CPU_TILES = ((64, 64, 1.0), (32, 32, 1.0), (16, 16, 1.0))
"""Output blocks of CPU GEMM kernels (register/cache blocking); one thread per 'SM'."""
_GPU_PRESET = (("GB300", "gb300"), ("GB200", "gb200"), ("B200", "b200"), ("H200", "h200"), ("H100", "h100-sxm"), ("A100", "a100-80gb"))


def _worker(ctx: Context, payload: dict) -> dict:
    out = {"machine": machine_info(ctx)}
    out["micro"] = microbench.run_microbenchmarks(ctx, payload["model"], payload["plan"], payload["quick"])
    if ctx.is_cuda:
        import torch

        props = torch.cuda.get_device_properties(ctx.device)
        out["device"] = {"sm_count": props.multi_processor_count, "memory_bytes": float(props.total_memory),
                         "name": props.name}
    else:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        out["device"] = {"sm_count": ctx.threads, "memory_bytes": float(ram), "name": out["machine"]["device"]}
    if ctx.world > 1:
        import socket

        import torch.distributed as dist

        hosts = [None] * ctx.world
        dist.all_gather_object(hosts, socket.gethostname())
        out["hosts"] = sorted(set(hosts))
        sizes = coll.sweep_sizes(payload["quick"], ctx.is_cuda, payload.get("collective_up_to"))
        out["collectives"] = coll.bench_collectives(ctx, sizes, repeats=3 if payload["quick"] else 5)
    return out


def default_link_kind(cuda: bool, hosts: int) -> str:
    if hosts > 1:
        return "ib"
    return "nvlink" if cuda else "ethernet"


def base_profile(base: str | None, device_name: str, cuda: bool) -> HardwareProfile | None:
    """``--base`` if given, else the preset whose GPU name matches, else None."""
    if base:
        return load_profile(base)
    if cuda:
        for key, preset in _GPU_PRESET:
            if key in device_name:
                return load_profile(preset)
    return None


def measure(model=None, plan=None, *, procs: int, quick: bool = False, timeout_s: float = 1800.0,
            collective_up_to: int | None = None) -> dict | None:
    """Run the benchmarks on ``procs`` processes; the merged measurements (None on the
    non-zero ranks of a torchrun job). ``collective_up_to``: extend the collective sweep
    to at least this many bytes."""
    if not isinstance(procs, int) or procs < 1:
        raise InputError(f"--procs: got {procs!r}; expected an integer >= 1")
    payload = {"model": model, "plan": plan, "quick": quick, "collective_up_to": collective_up_to}
    per_rank = run_workers(_worker, procs, payload, timeout_s=timeout_s)
    if per_rank is None:
        return None
    first = per_rank[0]
    return {"machine": first["machine"], "device": first["device"], "hosts": first.get("hosts", [first["machine"]["host"]]),
            "micro": microbench.merge_ranks([r["micro"] for r in per_rank]),
            "collectives": first.get("collectives", []), "quick": quick}


def build_profile(meas: dict, *, name: str | None = None, base: str | None = None, link: str | None = None) -> tuple:
    """(HardwareProfile, fits) from ``measure``'s output."""
    micro, dev, machine = meas["micro"], meas["device"], meas["machine"]
    cuda = machine["backend"] == "nccl"
    basep = base_profile(base, dev["name"], cuda)
    how = (f"trainsim calibrate on {machine['device']} ({machine['backend']}, {micro['dtype']}, "
           f"{machine['processes']} process(es) x {machine['threads_per_process']} thread(s), torch {machine['torch']}, "
           f"{machine['date']}{', quick sweep' if meas['quick'] else ''})")
    fits: dict = {}
    mem = fit.fit_memory(micro["memory"], micro["copy"]["bandwidth_Bps"])
    fits["memory"] = mem
    launch = mem["kernel_launch_s"]
    framework = micro.get("framework")
    # On a CPU the framework runs each kernel on the same thread: its fixed cost per
    # kernel inside a training step is the profile's per-kernel cost. The fits below
    # still take the tight loop's intercept off each timing, as that is what it held.
    per_op = bool(framework) and not cuda
    step_launch = framework["per_kernel_s"] if per_op else launch
    src = {}
    if basep is not None:
        peak = dict(basep.peak_flops)
        src["peak_flops"] = f"datasheet, from base profile {basep.name}: " + basep.sources.get("peak_flops", "")
    else:
        best = fit.best_gemm_rate(micro["gemm"], launch)
        peak = {"fp32": best, "bf16": best} if not cuda else {"bf16": best}
        src["peak_flops"] = (f"measured: best GEMM rate of the sweep, {best / 1e9:.1f} GFLOP/s ({micro['dtype']}); "
                             "no datasheet figure is known for this device, so efficiencies are relative to it"
                             + ("; the 'bf16' entry is the float32 rate the CPU trains at" if not cuda else ""))
    tiles = basep.gemm_tiles if basep is not None else CPU_TILES
    start = HardwareProfile(
        name=name or _slug(f"calibrated-{dev['name']}"), peak_flops=peak,
        hbm_bandwidth_Bps=mem["hbm_bandwidth_Bps"], hbm_capacity_bytes=dev["memory_bytes"], sm_count=int(dev["sm_count"]),
        gemm_tiles=tuple(tiles), gemm_k_overhead=0.0, gemm_max_efficiency=1.0, attention_max_efficiency=1.0,
        memory_efficiency=mem["memory_efficiency"], kernel_launch_s=step_launch,
        links=dict(basep.links) if basep is not None else {}, gemm_bias_epilogue=cuda)
    g = fit.fit_gemm(micro["gemm"], start, launch)
    fits["gemm"] = g
    prof = replace(start, gemm_tiles=tuple(tuple(t) for t in g["gemm_tiles"]), gemm_k_overhead=g["gemm_k_overhead"],
                   gemm_max_efficiency=g["gemm_max_efficiency"])
    a = fit.fit_attention(micro["attention"], prof, launch)
    fits["attention"] = a
    prof = replace(prof, attention_max_efficiency=a["attention_max_efficiency"])
    src.update({
        "hbm_bandwidth_Bps": (f"measured: {micro['copy']['bytes'] / 2**20:.0f} MiB read+write copy at "
                              f"{micro['copy']['bandwidth_Bps'] / 1e9:.2f} GB/s; {how}"),
        "memory_efficiency": (f"fitted: t = launch + bytes/(bandwidth x efficiency) over {len(micro['memory'])} "
                              f"norm/activation/softmax/add kernels, RMS error {mem['rms_rel_error']:.1%}"
                              + (f"; they ran at {mem['kernel_rate_Bps'] / 1e9:.2f} GB/s, faster than the copy "
                                 "(cache-resident), so capped at 1" if mem["clipped"] else "") + f"; {how}"),
        "kernel_launch_s": (f"measured: forward and backward of the reference GPT at a tiny shape "
                            f"({', '.join(f'{k} {v}' for k, v in framework['model'].items())}; micro-batch 1) took "
                            f"{framework['step_s'] * 1e6:.0f} us for the {framework['kernels']} kernels trainsim counts "
                            f"in it: the framework's fixed cost per kernel in a training step (Python, autograd, "
                            f"dispatch, views, small copies), on the critical path where the device is the host CPU; "
                            f"timed alone in a tight loop a kernel's fixed cost is {launch * 1e6:.1f} us; {how}"
                            if per_op else f"fitted: intercept of the memory-bound kernel fit; {how}"),
        "gemm_max_efficiency": (f"fitted to {g['points']} GEMMs (the model's shapes and a grid), RMS log error "
                                f"{g['rms_log_error']:.3f}{', capped at 1' if g['clipped'] else ''}; {how}"),
        "gemm_k_overhead": f"fitted with gemm_max_efficiency (grid search); {how}",
        "gemm_tiles": ("tile shapes " + ("of the base profile" if basep is not None else "of CPU GEMM blocking")
                       + f"; relative efficiencies fitted by coordinate descent; {how}"),
        "attention_max_efficiency": (f"fitted to causal scaled_dot_product_attention forward and backward at "
                                     f"{a['points'] // 2} shapes, counted with the non-causal FLOPs trainsim uses "
                                     f"(4bs^2h forward, 8bs^2h backward) of which a causal kernel computes "
                                     f"causal_work_fraction (the blocks up to the diagonal), RMS log error {a['rms_log_error']:.3f}"
                                     + (f", capped at 1 (unclipped {a['unclipped']:.2f})" if a["clipped"] else "")
                                     + f"; {how}"),
        "sustained_compute_fraction": ("1: microbenchmarks time kernels alone, for a short while; `trainsim fit` "
                                       "sets it from measured training runs"),
        "gpu_speed_spread": ("0: microbenchmarks time one device; `trainsim fit` sets it from measured runs of "
                             "several sizes"),
        "gemm_bias_epilogue": ("cuBLASLt adds a linear layer's bias in the GEMM epilogue (PyTorch's CUDA addmm, "
                               "Transformer Engine)" if cuda else
                               "PyTorch's CPU addmm writes the bias into the output before its GEMM (the profiler "
                               "shows aten::copy_ of the output's shape under aten::addmm)"),
        "sm_count": ("device property (multiprocessors)" if cuda else
                     "threads per process: each is one independent 'SM' of the GEMM wave model"),
        "hbm_capacity_bytes": "device property (total memory)" if cuda else "physical RAM of the machine",
    })
    if meas["collectives"]:
        kind = link or default_link_kind(cuda, len(meas["hosts"]))
        from sim.calibrate.nccl_tests import base_latency_for

        lf = coll.fit_link(meas["collectives"], base_latency_for(basep))
        fits["link"] = {"kind": kind, **lf}
        line = basep.links[kind].bandwidth_Bps if basep is not None and kind in basep.links else None
        if line is not None and lf["bandwidth_Bps"] <= line:
            model = LinkModel(lf["latency_s"], line, lf["bandwidth_Bps"] / line)
            rate = f"line rate {line / 1e9:.1f} GB/s from {basep.name}, efficiency = fitted B / line rate"
        else:
            model = LinkModel(lf["latency_s"], lf["bandwidth_Bps"], 1.0)
            rate = "bandwidth_Bps is the fitted B (no line rate known), efficiency 1"
        prof = replace(prof, links={**prof.links, kind: model})
        ops = sorted({r["op"] for r in meas["collectives"]})
        src[f"links.{kind}"] = (f"fitted: ring closed forms over {lf['points']} timings of {', '.join(ops)} "
                                f"({meas['collectives'][0]['bytes']}..{meas['collectives'][-1]['bytes']} B) on "
                                f"{machine['processes']} ranks, each less the NCCL base latency the simulator adds "
                                f"({lf['base_latency_s'] * 1e6:.1f} us): alpha {lf['latency_s'] * 1e6:.1f} us, "
                                f"B {lf['bandwidth_Bps'] / 1e9:.2f} GB/s (largest message busbw "
                                f"{lf['largest_busbw_Bps'] / 1e9:.2f} GB/s), RMS error {lf['rms_rel_error']:.1%}; "
                                f"{rate}; {how}")
    elif not prof.links:
        raise InputError("--procs: got 1; a profile without a base needs the link fit: use --procs 2 or more, "
                         "or give --base PROFILE for its links")
    for kind in prof.links:
        if f"links.{kind}" not in src and basep is not None:
            src[f"links.{kind}"] = f"from base profile {basep.name}: " + basep.sources.get(f"links.{kind}", "")
    prov = {k: v for k, v in machine.items()}
    prov.update(tool="trainsim calibrate", hosts=meas["hosts"], quick_sweep=meas["quick"],
                base_profile=basep.name if basep is not None else None, dtype=micro["dtype"],
                element_bytes=micro["element_bytes"], kernel_launch_alone_s=launch)
    pr = micro.get("profiler")
    if pr and not cuda:  # (reference_model.bench_profiler: the profiler's callbacks on the host thread)
        prof = replace(prof, profiler_op_overhead_s=pr["per_op_s"])
        shape = ", ".join(f"{k} {v}" for k, v in pr["model"].items())
        ranks = ", ".join(f"{v * 1e6:.2f}" for v in pr.get("per_op_s_ranks", [pr["per_op_s"]]))
        src["profiler_op_overhead_s"] = (
            f"measured: a training iteration of the reference GPT on each process ({shape}; "
            f"{pr['microbatches']} micro-batch(es) of {pr['micro_batch_size']}, Adam; {pr['events']} events recorded), "
            f"the least of {len(pr['rounds_cpu_s']['plain'])} rounds of its thread's CPU time under torch.profiler "
            f"(CPU activity, record_shapes) less the least without it, over the events: {ranks} us per event on the "
            f"ranks (none below 0), their median; {how}")
    prof = replace(prof, sources=src, provenance=prov)
    return prof, fits


def calibrate(model=None, plan=None, *, procs: int, quick: bool = False, name: str | None = None,
              base: str | None = None, link: str | None = None, collective_up_to: int | None = None) -> tuple | None:
    """Measure and fit: (profile, fits, measurements), or None on a torchrun job's other ranks."""
    if link is not None and link not in LINK_KINDS:
        raise InputError(f"--link: got {link!r}; allowed: {', '.join(LINK_KINDS)}")
    meas = measure(model, plan, procs=procs, quick=quick, collective_up_to=collective_up_to)
    if meas is None:
        return None
    prof, fits = build_profile(meas, name=name, base=base, link=link)
    return prof, fits, meas


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "calibrated"
