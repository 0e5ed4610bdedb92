"""How does goodput fall from 1K to 100K GPUs, and what checkpoint interval and spare count keep it above 90%?

Llama 3 405B (tp 8, pp 16, 16 micro-batches of one 8K sequence per data-parallel replica,
full recompute, sequence parallelism: weak scaling, so the step stays near 13 s) on
1,024 to 102,400 H100s in DGX H100 nodes. For each size trainsim simulates one iteration
(reduced fidelity) for the step time, counts the job's GPUs, hosts and NICs, and runs the
campaign of ``trainsim goodput`` with the ``llama3`` failure preset: the Llama 3 paper's
interruption counts (16,384 GPUs, 54 days) as rates per device-hour, so the job's rate
grows with its devices. Checkpoints: 16-bit weights + optimizer states (5.68 TB),
synchronous, at 2 TB/s (Llama 3's storage).

Three sweeps per size, each interval found by ``sim.studies.goodput.search_interval``:

1. goodput at the best interval with unlimited hot spares, beside Daly's closed form
   (unexpected failures only) and the best interval beside Young's and Daly's optima;
2. hot spares 0 .. 256 at that interval, a failed node coming back after a day's repair:
   how many spares keep the job from waiting, beside the closed-form mean of nodes in
   repair (rate of node-taking failures × repair time);
3. the recovery time per failure (detection + restart, half each; the preset's default is
   600 + 600 s) that keeps goodput at or above 90%.

    .venv/bin/python experiments/goodput_scale.py [--quick]
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import md_table, parallel_map, parse_args, pyplot, save, write_csv, write_json  # noqa: E402
from common import write_verdict  # noqa: E402

import sim  # noqa: E402
from sim.studies.goodput import FailureModel, Study, checkpoint_of, daly_goodput, daly_interval_s, device_counts, \
    load_failures, run_study, simulate_campaign, young_interval_s  # noqa: E402

NAME = "goodput_scale"
SIZES = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 102400)
QUICK_SIZES = (1024, 8192)
SPARES = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)
QUICK_SPARES = (0, 4, 16, 64)
RECOVERY_S = (60.0, 120.0, 300.0, 600.0, 1200.0)
QUICK_RECOVERY_S = (120.0, 1200.0)
TARGET = 0.90
DAYS = 54.0
SPARE_DAYS = 540.0
"""Horizon of each spare-count campaign (ten 54-day campaigns' worth of failures)."""


def _run_step(gpus: int):
    dp = gpus // 128
    r = sim.run(model="llama3-405b", gpu="h100-sxm", gpus=gpus, tensor_model_parallel_size=8,
                pipeline_model_parallel_size=16, global_batch_size=16 * dp, recompute_granularity="full",
                sequence_parallel=True, account_for_embedding_in_pipeline_split=True,
                account_for_loss_in_pipeline_split=True, fidelity="reduced")
    pcie = r.run.profile.links["pcie"]
    return (r.iteration_time_s, r.model.num_params, device_counts(r.run.topology, gpus),
            pcie.bandwidth_Bps * pcie.efficiency)


def _with_recovery(model: FailureModel, recovery_s: float) -> FailureModel:
    causes = tuple(replace(c, detect_s=recovery_s / 2, restart_s=recovery_s / 2) if not c.planned
                   else replace(c, restart_s=recovery_s / 2) for c in model.causes)
    return replace(model, causes=causes)


def simulate_size(point) -> dict:
    gpus, quick = point
    step, params, devices, host_Bps = _run_step(gpus)
    failures = load_failures("llama3")
    ck = checkpoint_of(params, gpus, 2e12, host_Bps)
    min_failures = 1500 if quick else 4000
    study = Study(step, ck, failures, devices, DAYS * 86400.0)
    rep, _ = run_study(study, None, seed=0, record=False, min_failures=min_failures)
    best = rep["best_checkpoint_interval_s"]
    m, r = study.mtbf_s, study.mean_restart_s
    row = {"gpus": gpus, "nodes": devices["node"], "step_s": step, "mtbf_h": m / 3600.0,
           "interruptions_per_day": 86400.0 / m, "best_interval_s": best, "daly_interval_s": daly_interval_s(ck.stall_s, m),
           "young_interval_s": young_interval_s(ck.stall_s, m), "goodput": rep["best_goodput"],
           "daly_goodput": daly_goodput(best, ck.stall_s, m, r), "campaign_goodput": rep["goodput"],
           "checkpoint_s": ck.stall_s, "mean_restart_s": r}
    # 2. spares at the best interval, a long horizon
    rates = study.rates_per_s()
    replace_rate = sum(rates[c.name] for c in failures.causes if c.replace)
    row["in_repair_mean"] = sum(rates[c.name] * c.repair_s for c in failures.causes if c.replace)
    row["node_failures_per_day"] = replace_rate * 86400.0
    spare_g = []
    for k in (QUICK_SPARES if quick else SPARES) + (None,):
        cfg = replace(study, spares=k, horizon_s=(DAYS if quick else SPARE_DAYS) * 86400.0).config(best)
        spare_g.append({"spares": k, "goodput": simulate_campaign(cfg, seed=1).goodput})
    row["by_spares"] = spare_g[:-1]
    row["unlimited_spares_goodput"] = unlimited = spare_g[-1]["goodput"]
    for pt in row["by_spares"]:  # nodes in repair: Poisson with mean rate x repair (an M/G/inf queue)
        pt["closed_form"] = unlimited * poisson_cdf(pt["spares"], row["in_repair_mean"])
    close = [p["spares"] for p in row["by_spares"] if p["goodput"] >= unlimited - 0.005]
    row["spares_within_half_point"] = min(close) if close else None
    # 3. recovery time per failure
    rec = []
    for rs in (QUICK_RECOVERY_S if quick else RECOVERY_S):
        s2 = replace(study, failures=_with_recovery(failures, rs))
        rep2, _ = run_study(s2, None, seed=0, record=False, min_failures=min_failures)
        rec.append({"recovery_s": rs, "goodput": rep2["best_goodput"],
                    "best_interval_s": rep2["best_checkpoint_interval_s"]})
    row["by_recovery"] = rec
    ok = [v["recovery_s"] for v in rec if v["goodput"] >= TARGET]
    row["max_recovery_for_target_s"] = max(ok) if ok else None
    return row


def poisson_cdf(k: int, mean: float) -> float:
    """P(N <= k) for N Poisson with ``mean``: the chance that at most k nodes are in repair, so
    that a job with k hot spares can run (Palm's theorem: an M/G/inf queue's occupancy is
    Poisson with mean arrival rate x service time)."""
    term = total = math.exp(-mean)
    for i in range(1, k + 1):
        term *= mean / i
        total += term
    return min(1.0, total)


def _frame(ax, xlabel: str, ylabel: str, title: str, target: bool = False, legend: float = 8) -> None:
    """Log x axis, labels, title, legend, and the 90% line where goodput is drawn."""
    if target:
        ax.axhline(TARGET * 100, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=legend)


def plot(rows, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
    n = [r["gpus"] for r in rows]
    ax = axes[0][0]
    ax.plot(n, [r["goodput"] * 100 for r in rows], "o-", color="#2ca02c", label="simulated, unlimited hot spares")
    ax.plot(n, [r["daly_goodput"] * 100 for r in rows], "--", color="#999999",
            label="Daly 2006 closed form (unexpected failures only)")
    for k, c in ((0, "#d62728"), (16, "#ff7f0e"), (64, "#9467bd")):
        ys = [next((p["goodput"] for p in r["by_spares"] if p["spares"] == k), None) for r in rows]
        if all(y is not None for y in ys):
            ax.plot(n, [y * 100 for y in ys], "s:", ms=4, color=c, label=f"simulated, {k} hot spares (1-day repair)")
    _frame(ax, "GPUs (H100)", "goodput (% of wall time on useful training)",
           "Goodput at the best checkpoint interval (10 min detection + 10 min restart)", target=True)
    ax = axes[0][1]
    ax.plot(n, [r["best_interval_s"] for r in rows], "o", color="#c44e52", label="simulated best")
    ax.plot(n, [r["daly_interval_s"] for r in rows], "--", color="black", label="Daly 2006")
    ax.plot(n, [r["young_interval_s"] for r in rows], ":", color="black", label="Young 1974")
    ax.set_yscale("log")
    _frame(ax, "GPUs (H100)", "checkpoint interval (s of training between saves)",
           "The interval that maximises goodput (checkpoint stall 2.84 s)")
    ax = axes[1][0]
    cmap = plt.get_cmap("viridis")
    for i, r in enumerate(rows):
        colour, ks = cmap(i / max(1, len(rows) - 1)), [max(p["spares"], 0.5) for p in r["by_spares"]]
        ax.plot(ks, [p["closed_form"] * 100 for p in r["by_spares"]], "--", lw=0.8, color=colour)
        ax.plot(ks, [p["goodput"] * 100 for p in r["by_spares"]], "o", ms=3.5, color=colour,
                label=f"{r['gpus']:,} GPUs (mean in repair {r['in_repair_mean']:.1f} nodes)")
    _frame(ax, "hot spare nodes (0 drawn at 0.5)", "goodput (%)",
           "Hot spares (a failed node back after 1 day): simulated (dots), and unlimited-spare\n"
           "goodput x P(nodes in repair <= spares), Poisson (dashed)", legend=7)
    ax = axes[1][1]
    for i, r in enumerate(rows):
        ax.plot([v["recovery_s"] / 60 for v in r["by_recovery"]], [v["goodput"] * 100 for v in r["by_recovery"]],
                "o-", ms=3, color=cmap(i / max(1, len(rows) - 1)), label=f"{r['gpus']:,} GPUs")
    _frame(ax, "recovery per failure: detection + restart (minutes)", "goodput at the best interval (%)",
           "What recovery time keeps goodput above 90%", target=True, legend=7)
    fig.suptitle("Llama 3 405B on H100s with the Llama 3 paper's failure rates per device (trainsim goodput)")
    fig.tight_layout()
    save(fig, path)


def main(argv=None) -> dict:
    args = parse_args(NAME, __doc__, argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    rows = parallel_map(simulate_size, [(g, args.quick) for g in sizes], args.workers)
    flat = [{k: v for k, v in r.items() if not isinstance(v, (dict, list))} for r in rows]
    write_csv(args.out / f"{NAME}.csv", flat)
    plot(rows, args.out / f"{NAME}.png")
    results = {"rows": rows, "target": TARGET}
    write_json(args.out / "results.json", results)
    first, last = rows[0], rows[-1]
    need = "; ".join(f"{r['gpus']:,}: {_spares(r)}" for r in rows)
    rec = "; ".join(f"{r['gpus']:,}: {_minutes(r['max_recovery_for_target_s'])}" for r in rows)
    answer = (
        f"With the Llama 3 paper's failure rates per device, 10 minutes to detect a failure and 10 to restart, "
        f"goodput at the best checkpoint interval falls from {first['goodput'] * 100:.1f}% on {first['gpus']:,} "
        f"GPUs (an interruption every {_every(first['mtbf_h'])}) to {last['goodput'] * 100:.1f}% on {last['gpus']:,} "
        f"(every {_every(last['mtbf_h'])}). {_above(rows)} At the best interval the checkpoints themselves cost "
        f"little ({last['checkpoint_s']:.2f} s per save at 2 TB/s): the loss is the recovery per failure. The "
        f"best interval shrinks as 1/√N, from {first['best_interval_s']:.0f} s to {last['best_interval_s']:.0f} s, "
        f"within {_max_err(rows):.1f}% of Daly's optimum (intervals are whole iterations of about 13 s; Young's "
        f"is a little longer). Hot spares: with a day's repair, the spares that bring goodput within half a point "
        f"of unlimited spares — {need}; the nodes in repair are Poisson with a mean of "
        f"{first['in_repair_mean']:.1f} to {last['in_repair_mean']:.1f}, and the job runs only while they are no "
        f"more than the spares (the simulated goodput follows that closed form within "
        f"{_spare_err(rows) * 100:.1f} points). Keeping 90% "
        f"needs a faster recovery per failure: the longest detection + restart tried (1 to 20 min) that keeps "
        f"it is {rec}.")
    table = md_table(flat, [("gpus", "GPUs", ",d"), ("mtbf_h", "MTBF h", ".2f"), ("step_s", "step s", ".2f"),
                            ("best_interval_s", "best interval s", ".0f"), ("daly_interval_s", "Daly s", ".0f"),
                            ("young_interval_s", "Young s", ".0f"), ("goodput", "goodput", ".3f"),
                            ("daly_goodput", "Daly goodput", ".3f"), ("in_repair_mean", "mean in repair", ".1f"),
                            ("spares_within_half_point", "spares (≤0.5 pt)", ""),
                            ("max_recovery_for_target_s", "max recovery for 90% (s)", ".0f")])
    write_verdict(args, title=f"{_number()}Goodput from 1K to 100K GPUs", question=(
        "How does goodput fall from 1K to 100K GPUs, and what checkpoint interval and spare count keep it above "
        "90%?"), setup=(
            "Llama 3 405B (tp 8, pp 16, 16 micro-batches of 8K tokens per data-parallel replica: weak scaling, a "
            "simulated step near 13 s) on DGX H100 nodes; failures: the `llama3` preset (the Llama 3 paper's "
            "interruption counts as rates per GPU, host, NIC and job); checkpoints of 5.68 TB (16-bit weights + "
            "optimizer states) written synchronously at 2 TB/s. Per size: the best interval by simulation with "
            "unlimited hot spares; 0–256 spares at that interval (a failed node back after a day); and the "
            "detection + restart time that keeps 90%."),
        answer=answer, figures=[f"{NAME}.png"], body=table, caveats=(
            "The rates are the Llama 3 paper's, per GPU, host and NIC, scaled linearly: a larger cluster of newer "
            "parts may fail less (or more) per device. Software bugs are charged per job, not per GPU (an "
            "assumption of the preset). Detection (PyTorch's 10-minute NCCL timeout), restart (10 minutes) and "
            "repair (a day) are assumptions, not measurements; Daly's closed form leaves out the planned "
            "maintenance stops, which the simulation includes. Storage at 2 TB/s is Meta's; slower storage "
            "lengthens the optimum interval as √δ."),
        headline=(f"goodput {first['goodput'] * 100:.1f}% at {first['gpus']:,} GPUs → {last['goodput'] * 100:.1f}% "
                  f"at {last['gpus']:,}; best interval {first['best_interval_s']:.0f} → {last['best_interval_s']:.0f} s "
                  f"(Daly within {_max_err(rows):.1f}%); 90% needs recovery ≤ {_minutes(last['max_recovery_for_target_s'])} "
                  f"per failure at {last['gpus']:,} GPUs"))
    return results


def _number() -> str:
    """This question's number in the report (its place in report.EXPERIMENTS), so that the
    summary table's link to the section resolves."""
    from report import EXPERIMENTS

    names = [n for n, _ in EXPERIMENTS]
    return f"{names.index(NAME) + 1}. " if NAME in names else ""


def _spares(r) -> str:
    k = r["spares_within_half_point"]
    return "none within the sweep" if k is None else f"{k}"


def _minutes(s) -> str:
    return "none of the recovery times tried" if s is None else f"{s / 60:g} min"


def _above(rows) -> str:
    """Up to which size the best interval keeps 90% (with unlimited spares)."""
    above = [r["gpus"] for r in rows if r["goodput"] >= TARGET]
    if len(above) == len(rows):
        return "The best interval keeps it above 90% at every size tried."
    if not above:
        return "No checkpoint interval keeps it above 90% at any size tried."
    return (f"The best interval keeps it above 90% up to {max(above):,} GPUs; beyond, no checkpoint interval and "
            "no number of spares does.")


def _spare_err(rows) -> float:
    return max(abs(p["goodput"] - p["closed_form"]) for r in rows for p in r["by_spares"])


def _every(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 2 else f"{hours * 60:.0f} min"


def _max_err(rows) -> float:
    return max(abs(r["best_interval_s"] / r["daly_interval_s"] - 1) for r in rows) * 100


if __name__ == "__main__":
    main()
