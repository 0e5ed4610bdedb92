"""What grows with the GPU count when GPT-3 175B is strong-scaled from 256 to 12,288 A100s?

GPT-3 175B (96 layers, h 12288, 96 heads, sequence 2048, vocabulary 51200) at a fixed
global batch of 1,536 sequences on A100-80GB DGX nodes, as the Megatron-LM SC'21 paper's
scripts run it (NVIDIA/Megatron-LM examples/sc21): tp 8, micro-batch 1, full recompute,
interleaved with 2 layers per virtual stage, local DDP (the gradients all-reduced after
the whole backward, in fp32). Pipeline depth 8 (64 GPUs a replica) so that 256 GPUs is a
plan: data-parallel 4 .. 192, 384 .. 8 micro-batches per replica (a multiple of pp, as
Megatron-LM's interleaving needs). Per GPU count, one simulated iteration (reduced
fidelity) with the ``a100-80gb`` preset in three variants:

1. *before*: gradients reduced in 16 bit and overlapped with backward, no speed spread
   (trainsim's defaults before issue 42);
2. *+ Megatron's reduction*: fp32, after the backward (``--no-overlap-grad-reduce
   --accumulate-allreduce-grads-in-fp32``): a fixed cost a step, so its share grows as
   the compute per GPU shrinks;
3. *+ speed spread*: and the GPU speed spread σ (``gpu_speed_spread``; the A100 preset's, H100's fit of 2026-12-04):
   every synchronous step waits for the expected slowest of N GPUs, 1 − σ·e(N).

Throughput is the paper's TFLOP/s per GPU (Eq. 3, full recompute counted), so the fit
set's published A100 rows (../shared/fit-data/published_runs.csv: 175B, tp 8 × pp 12, 384,
768 and 1,536 GPUs; only these published points are drawn) sit on the same axis, each
simulated with its own plan beside it. The second panel splits variant 3's step into
compute, bubble (idle), exposed data-parallel traffic, other communication, and the
slowest GPU's pace, as shares of the step.

    .venv/bin/python experiments/strong_scaling.py [--quick]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import md_table, parallel_map, parse_args, pyplot, save, write_csv, write_json, write_verdict  # noqa: E402

import sim  # noqa: E402
from sim.calibrate.runs_csv import read_runs  # noqa: E402
from sim.calibrate.fit_sims import prepare_rows, row_time_s  # noqa: E402
from sim.inputs.hardware import load_profile  # noqa: E402
from sim.inputs.pacing import expected_max_normal, slowest_speed  # noqa: E402

NAME = "strong_scaling"
GPUS = (256, 512, 1024, 2048, 4096, 12288)
QUICK_GPUS = (256, 2048)
MODEL = dict(num_layers=96, hidden_size=12288, num_attention_heads=96, ffn_hidden_size=49152, vocab_size=51200,
             seq_length=2048)
PLAN = dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=8, num_layers_per_virtual_pipeline_stage=2,
            micro_batch_size=1, global_batch_size=1536, recompute_granularity="full", attention="unfused",
            sequence_parallel=False)
SPREAD_FROM = "a100-80gb"
"""The profile whose speed spread the third variant takes: the A100 preset's (H100's fit of 2026-12-04, carried
over as an assumption: the A100's fit groups allow one parameter)."""
VARIANTS = {
    "before": dict(overlap_grad_reduce=True, accumulate_allreduce_grads_in_fp32=False),
    "+ Megatron's reduction": dict(overlap_grad_reduce=False, accumulate_allreduce_grads_in_fp32=True),
    "+ speed spread": dict(overlap_grad_reduce=False, accumulate_allreduce_grads_in_fp32=True),
}
FIT_DATA = Path(__file__).resolve().parents[2] / "shared" / "fit-data" / "published_runs.csv"


def eq3_flops(batch: int, model: dict = MODEL) -> float:
    """Narayanan et al. SC'21 Eq. 3: 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per iteration."""
    s, l, h, v = model["seq_length"], model["num_layers"], model["hidden_size"], model["vocab_size"]
    return 96 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def _profile(variant: str, sigma: float, where: Path):
    path = where / f"a100-{'spread' if variant == '+ speed spread' else 'plain'}.json"
    if not path.exists():
        replace(load_profile("a100-80gb"), gpu_speed_spread=sigma if variant == "+ speed spread" else 0.0).save(path)
    return str(path)


def _point(job) -> dict:
    variant, gpus, profile = job
    r = sim.run(**MODEL, **PLAN, **VARIANTS[variant], gpu=profile, gpus=gpus, fidelity="reduced",
                collective_model="flows")
    d, t = r.summary, r.iteration_time_s
    exposed = d["exposed_comm_s"]
    return {"variant": variant, "gpus": gpus, "dp": r.plan.dp, "microbatches": 1536 // r.plan.dp,
            "iteration_time_s": t, "tflops_per_gpu": eq3_flops(1536) / t / gpus / 1e12,
            "compute_s": d["compute_s"], "idle_s": d["idle_s"], "dp_exposed_s": exposed["dp"],
            "other_comm_s": exposed["tp"] + exposed["pp"] + exposed["zero"]}


def _fit_rows(sigma: float, where: Path) -> list[dict]:
    """The fit set's 175B A100 rows: published, and simulated as the fit simulates them."""
    if not FIT_DATA.exists():
        return []
    runs = [r for r in read_runs(FIT_DATA) if r.gpu == "a100-80gb" and r.values["num_layers"] == 96]
    out = []
    for r, p in zip(runs, prepare_rows(runs, "a100-80gb", str(FIT_DATA))):
        row = {"gpus": r.values["gpus"], "published_tflops_per_gpu": eq3_flops(r.values["global_batch_size"])
               / r.measured_s / r.values["gpus"] / 1e12}
        for name, s in (("plain", 0.0), ("spread", sigma)):
            t = row_time_s(p, replace(p.profile, gpu_speed_spread=s))
            row[f"simulated_{name}_tflops_per_gpu"] = eq3_flops(r.values["global_batch_size"]) / t / r.values["gpus"] / 1e12
        out.append(row)
    return out


def main(argv=None) -> dict:
    args = parse_args(NAME, __doc__, argv)
    sigma = load_profile(SPREAD_FROM).gpu_speed_spread
    gpus = QUICK_GPUS if args.quick else GPUS
    jobs = [(v, n, _profile(v, sigma, args.out)) for v in VARIANTS for n in gpus]
    points = parallel_map(_point, jobs, args.workers)
    fit_rows = [] if args.quick else _fit_rows(sigma, args.out)
    for p in points:
        p["pace_loss_fraction"] = 1 - slowest_speed(sigma, p["gpus"]) if p["variant"] == "+ speed spread" else 0.0
        p["e_of_n"] = expected_max_normal(p["gpus"])
    write_csv(args.out / f"{NAME}.csv", points)

    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11.5, 4.2))
    for v, style in zip(VARIANTS, ("o:", "s--", "D-")):
        pts = [p for p in points if p["variant"] == v]
        ax.plot([p["gpus"] for p in pts], [p["tflops_per_gpu"] for p in pts], style, label=f"trainsim, {v}")
    if fit_rows:
        ax.plot([r["gpus"] for r in fit_rows], [r["published_tflops_per_gpu"] for r in fit_rows], "k*", ms=11,
                label="published (fit set: 175B, tp 8 x pp 12)")
        ax.plot([r["gpus"] for r in fit_rows], [r["simulated_spread_tflops_per_gpu"] for r in fit_rows], "kx", ms=8,
                label="those rows simulated (+ speed spread)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(gpus, [f"{n:,}" for n in gpus])
    ax.set_xlabel("A100 GPUs (global batch 1,536)")
    ax.set_ylabel("TFLOP/s per GPU (Eq. 3)")
    ax.set_title("GPT-3 175B strong scaling, tp 8 x pp 8, interleaved")
    ax.legend()
    last = [p for p in points if p["variant"] == "+ speed spread"]
    shares = {"compute": [], "bubble (idle)": [], "dp exposed": [], "tp/pp exposed": []}
    for p in last:
        t = p["iteration_time_s"]
        shares["compute"].append(p["compute_s"] / t)
        shares["bubble (idle)"].append(p["idle_s"] / t)
        shares["dp exposed"].append(p["dp_exposed_s"] / t)
        shares["tp/pp exposed"].append(p["other_comm_s"] / t)
    xs = [p["gpus"] for p in last]
    for k, ys in shares.items():
        bx.plot(xs, ys, "o-", label=k)
    bx.plot(xs, [p["pace_loss_fraction"] for p in last], "D--", label="slowest GPU's pace (σ·e(N))")
    bx.set_xscale("log", base=2)
    bx.set_xticks(gpus, [f"{n:,}" for n in gpus])
    bx.set_xlabel("A100 GPUs")
    bx.set_ylabel("share of the step")
    bx.set_title("where the step goes (+ speed spread)")
    bx.legend()
    save(fig, args.out / f"{NAME}.png")

    by = {(p["variant"], p["gpus"]): p for p in points}
    lo, hi = gpus[0], gpus[-1]
    drop = {v: 1 - by[(v, hi)]["tflops_per_gpu"] / by[(v, lo)]["tflops_per_gpu"] for v in VARIANTS}
    plain, spread = "+ Megatron's reduction", "+ speed spread"
    cost = {n: 1 - by[(spread, n)]["tflops_per_gpu"] / by[(plain, n)]["tflops_per_gpu"] for n in (lo, hi)}
    share = {n: by[(plain, n)]["dp_exposed_s"] / by[(plain, n)]["iteration_time_s"] for n in (lo, hi)}
    answer = (f"From {lo:,} to {hi:,} GPUs the throughput per GPU falls {100 * drop['before']:.0f}% with the "
              f"gradients reduced in 16 bit under the backward: the pipeline bubble grows as a replica gets fewer "
              f"micro-batches ({1536 // by[('before', lo)]['dp']} -> {1536 // by[('before', hi)]['dp']}). "
              f"Megatron's own reduction (fp32, after the whole backward) makes it {100 * drop[plain]:.0f}%: a fixed "
              f"cost a step, {100 * share[lo]:.1f}% of the step at {lo:,} GPUs and {100 * share[hi]:.1f}% at {hi:,}. "
              f"The speed spread (the slowest of N GPUs paces every step, e(N) {expected_max_normal(lo):.2f} -> "
              f"{expected_max_normal(hi):.2f}) costs {100 * cost[lo]:.1f}% at {lo:,} GPUs and {100 * cost[hi]:.1f}% at "
              f"{hi:,}: it slows only the compute, whose share of the step shrinks as fast as its pace falls, so it "
              f"lowers the curve more than it steepens it.")
    table = md_table([p for p in points], [("variant", "variant", ""), ("gpus", "GPUs", ","),
                                           ("microbatches", "micro-batches", "d"), ("iteration_time_s", "step s", ".2f"),
                                           ("tflops_per_gpu", "TFLOP/s/GPU", ".1f")])
    write_verdict(args, title="GPT-3 175B strong scaling on A100", question=__doc__.split("\n\n")[0],
                  setup=f"tp 8 x pp 8 interleaved (v 6), batch 1,536, σ = {sigma:.2%} (the {SPREAD_FROM} preset's)",
                  answer=answer, figures=[f"{NAME}.png"], body=table,
                  headline=f"175B on {lo:,} -> {hi:,} A100: {100 * drop[spread]:.0f}% less per GPU")
    results = {"points": points, "fit_rows": fit_rows, "sigma": sigma, "drop": drop, "spread_cost": cost,
               "dp_exposed_share": share}
    write_json(args.out / "results.json", results)
    print(answer)
    return results


if __name__ == "__main__":
    main()
