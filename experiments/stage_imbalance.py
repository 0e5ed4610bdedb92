"""Question 8: pipeline stage imbalance, and the partition the simulator suggests.

Llama 3 8B (32 layers, a 128K-token vocabulary whose output layer and loss cost as much
as a few transformer layers) in a 4-stage 1F1B pipeline on one DGX H100, 16 micro-batches
of one 8192-token sequence. Two questions:

* a stage with more layers: the first stage gets 8 + 3j layers and the other three
  (32 − 8 − 3j)/3; how much does the slowest stage cost?
* the embedding and logit stages: with an even split (8, 8, 8, 8) the last stage also
  runs the output layer and loss; which split (Megatron-LM's
  ``--decoder-first/last-pipeline-num-layers``) does the simulator find fastest among
  those that fit in the GPU's memory? Under 1F1B stage i holds p − i micro-batches of
  activations, so layers moved onto the first stage cost the most memory: the suggested
  split is the fastest that fits, and the fastest overall is named when it does not.

Closed forms beside the simulation: with per-micro-batch stage times T_i (forward +
backward, read from the trace), the slowest stage must do m·max_i T_i of work (a lower
bound), and a pipeline whose slowest stage also waits for the others to fill and drain
takes Σ_i T_i + (m − 1)·max_i T_i (the classic estimate, an upper bound for 1F1B: a heavy
first stage fills its own idle time with warm-up forwards).

    .venv/bin/python experiments/stage_imbalance.py [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import dgx, md_table, parallel_map, parse_args, pyplot, run_summary, save, write_csv  # noqa: E402
from common import write_json, write_verdict  # noqa: E402

from sim.inputs.hardware import load_profile  # noqa: E402
from sim.results.memory_timeline import peak  # noqa: E402
from sim.inputs.model import llama, preset  # noqa: E402
from sim.inputs.plan import ParallelPlan  # noqa: E402

NAME = "stage_imbalance"
PROFILE = "h100-sxm"
PP = 4
MODEL = preset("llama3-8b")


def model_for(quick: bool):
    if quick:  # shorter sequences: the same shapes per token, 4× cheaper to compute
        m = MODEL
        return llama("llama3-8b-seq2048", m.num_layers, m.hidden_size, m.num_attention_heads, m.num_key_value_heads,
                     m.ffn_hidden_size, m.vocab_size, 2048)
    return MODEL


def micro_batches(quick: bool) -> int:
    return 8 if quick else 16


def simulate_point(point) -> dict:
    first, last, quick, kind = point
    model = model_for(quick)
    m = micro_batches(quick)
    plan = ParallelPlan(pp=PP, global_batch_size=m, schedule="1f1b", first_stage_layers=first,
                        last_stage_layers=last)
    s, run = run_summary(model, plan, load_profile(PROFILE), dgx("dgx-h100", 1), fidelity="full", keep_run=True)
    layers = plan.stage_layers(model)
    stage_t = []
    for st in range(PP):
        r = plan.rank(pp=st)
        stage_t.append(sum(sp.duration_s for sp in run.trace.spans_of(r)
                           if sp.kind == "compute" and sp.category in ("F", "B")) / m)
    t_opt = max(sum(sp.duration_s for sp in run.trace.spans_of(plan.rank(pp=st)) if sp.category == "opt")
                for st in range(PP))
    peaks = [peak(run.trace, plan.rank(pp=st)) for st in range(PP)]  # each stage's own peak
    closed = sum(stage_t) + (m - 1) * max(stage_t) + t_opt
    lower = m * max(stage_t) + t_opt
    return {"kind": kind, "split": "-".join(map(str, layers)), "first": first, "last": last,
            "layers": layers, "stage_s": stage_t, "max_stage_s": max(stage_t), "mean_stage_s": sum(stage_t) / PP,
            "iteration_s": s["iteration_time_s"], "closed_s": closed, "lower_s": lower, "bubble": s["bubble_fraction"],
            "tokens_per_s": s["tokens_per_s"], "peak_gb": s["memory"]["peak_bytes"] / 1e9, "fits": s["fits"],
            "capacity_gb": s["memory_capacity_bytes"] / 1e9,
            "stage_peak_gb": [pk.total_bytes / 1e9 for pk in peaks],
            "stage_act_gb": [pk.breakdown.get("activations", 0.0) / 1e9 for pk in peaks]}


def points(quick: bool) -> list:
    L = MODEL.num_layers
    pts = [(None, None, quick, "even")]
    for j in ((1, 2, 3) if quick else (-1, 1, 2, 3)):      # one stage with more (or fewer) layers
        f = 8 + 3 * j
        pts.append((f, None, quick, "first stage +%d" % (3 * j) if j > 0 else "first stage %d" % (3 * j)))
    pairs = [(f, l) for f in range(5, 12) for l in range(3, 11)
             if (L - f - l) % (PP - 2) == 0 and (L - f - l) // (PP - 2) >= 1 and (f, l) != (L // PP, L // PP)]
    if quick:
        pairs = [(9, 5), (8, 6), (10, 6), (9, 7)]
    pts += [(f, l, quick, "first/last split") for f, l in pairs]
    return pts


def suggestion(rows) -> tuple[dict | None, dict]:
    """(the fastest split that fits in memory or None, the fastest split overall)."""
    fastest = min(rows, key=lambda r: r["iteration_s"])
    fitting = [r for r in rows if r["fits"]]
    return (min(fitting, key=lambda r: r["iteration_s"]) if fitting else None), fastest


def memory_verdict(best, fastest, even) -> str:
    """What the suggestion is, in memory terms: the fastest split that fits, and the fastest
    overall with its peak against the capacity when that one does not fit."""
    cap = fastest["capacity_gb"]
    if best is None:
        return (f"No split fits: the lowest peak is above the {cap:.1f} GB capacity, so the simulator suggests "
                f"none (the fastest, {fastest['split']}, peaks at {fastest['peak_gb']:.1f} GB).")
    gain = (1 - best["iteration_s"] / even["iteration_s"]) * 100
    head = (f"The split the simulator suggests, the fastest that fits in memory, is {best['split']} "
            f"({gain:.1f}% {'faster' if gain >= 0 else 'slower'} than {even['split']}, slowest stage "
            f"{best['max_stage_s'] * 1e3:.0f} vs {even['max_stage_s'] * 1e3:.0f} ms; peak "
            f"{best['peak_gb']:.1f} of {cap:.1f} GB)")
    if fastest is best or fastest["split"] == best["split"]:
        return head + ", and it is also the fastest split overall."
    return (head + f"; the fastest overall, {fastest['split']} "
            f"({(best['iteration_s'] / fastest['iteration_s'] - 1) * 100:.1f}% faster still), does not fit: it "
            f"peaks at {fastest['peak_gb']:.1f} GB against {cap:.1f} GB.")


def slope(pairs) -> float:
    """Least-squares slope of y on x."""
    n = len(pairs)
    mx, my = sum(x for x, _ in pairs) / n, sum(y for _, y in pairs) / n
    sxx = sum((x - mx) ** 2 for x, _ in pairs)
    return sum((x - mx) * (y - my) for x, y in pairs) / sxx if sxx else float("nan")


STAGE_COLORS = ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b")


def plot(rows, path, quick) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(14, 10.5))
    even = next(r for r in rows if r["kind"] == "even")
    best, fastest = suggestion(rows)
    cap = rows[0]["capacity_gb"]
    ax = axes[0][0]
    w = 0.38
    shown = [(even, "#d62728", "even split")] + ([(best, "#2ca02c", "suggested split (fastest that fits)")]
                                                 if best is not None else [])
    for i, (r, c, lab) in enumerate(shown):
        xs = [k + (i - 0.5) * w for k in range(PP)]
        ax.bar(xs, [t * 1e3 for t in r["stage_s"]], w, color=c,
               label=f"{lab} {r['split']}, peak {r['peak_gb']:.1f} GB")
        for x, n in zip(xs, r["layers"]):
            ax.text(x, 1, f"{n}", ha="center", va="bottom", fontsize=8, color="white")
    ax.set_xticks(range(PP), ["stage 0\n(+embedding)", "stage 1", "stage 2", f"stage {PP - 1}\n(+output, loss)"])
    ax.set_ylabel("forward + backward per micro-batch (ms)")
    ax.set_ylim(0, max(max(r["stage_s"]) for r, _, _ in shown) * 1e3 * 1.3)
    ax.set_title("Per-stage time (layers on each bar)")
    ax.legend(loc="upper left")
    ax = axes[0][1]
    rs = sorted(rows, key=lambda r: r["max_stage_s"])
    xs = [r["max_stage_s"] * 1e3 for r in rs]
    ax.vlines(xs, [r["lower_s"] for r in rs], [r["closed_s"] for r in rs], color="gray", lw=1, alpha=0.6)
    ax.plot(xs, [r["closed_s"] for r in rs], "_", color="black", ms=12, mew=1.5,
            label="closed form Σ T_i + (m−1)·max T_i")
    ax.plot(xs, [r["lower_s"] for r in rs], "_", color="gray", ms=12, mew=1.5, label="lower bound m·max T_i")
    for kind, c, mk, ms, lab in (("first/last split", "#2ca02c", "s", 6, "first/last split (sim)"),
                                 ("even", "#d62728", "o", 8, "even (sim)"),
                                 ("first stage", "#1f77b4", "^", 7, "one heavier/lighter first stage (sim)")):
        sel = [r for r in rows if r["kind"].startswith(kind)]
        for ok in (True, False):
            part = [r for r in sel if r["fits"] == ok]
            if part:
                ax.plot([r["max_stage_s"] * 1e3 for r in part], [r["iteration_s"] for r in part], mk, ms=ms,
                        color=c, mfc=c if ok else "white", mew=1.5, zorder=5, label=lab if ok or
                        not any(r["fits"] for r in sel) else None)
    bad = [r for r in rows if not r["fits"]]
    if bad:
        ax.plot([r["max_stage_s"] * 1e3 for r in bad], [r["iteration_s"] for r in bad], "x", color="#c00000",
                ms=6, mew=1.5, zorder=6)
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], ls="", marker="s", mfc="white", mec="gray", mew=1.5, ms=7))
    handles[-1] = (handles[-1], Line2D([], [], ls="", marker="x", color="#c00000", ms=6, mew=1.5))
    labels.append(f"hollow + red ×: does not fit (peak > {cap:.1f} GB)")
    ax.legend(handles, labels, loc="upper left", fontsize=7.8)
    ax.set_xlabel("slowest stage, forward + backward per micro-batch (ms)")
    ax.set_ylabel("iteration time (s)")
    ax.set_title("The slowest stage sets the pace")
    ax = axes[1][0]
    sel = sorted((r for r in rows if r["kind"] in ("even", "first/last split")), key=lambda r: r["iteration_s"])
    colors = ["#2ca02c" if r is best else "#d62728" if r is even else "#9ecae1" if r["fits"] else "#e0e0e0"
              for r in sel]
    bars = ax.barh(range(len(sel)), [r["iteration_s"] for r in sel], color=colors,
                   edgecolor=["#c00000" if not r["fits"] else "none" for r in sel],
                   hatch=None, linewidth=1.0)
    for b, r in zip(bars, sel):
        if not r["fits"]:
            b.set_hatch("///")
    ax.set_yticks(range(len(sel)), [r["split"] for r in sel], fontsize=7)
    for t, r in zip(ax.get_yticklabels(), sel):
        if not r["fits"]:
            t.set_color("#c00000")
    ax.invert_yaxis()
    lo = min(r["iteration_s"] for r in sel)
    hi = max(r["iteration_s"] for r in sel)
    for k, r in enumerate(sel):
        ax.text(r["iteration_s"] + (hi - lo) * 0.01, k, f"{r['peak_gb']:.0f} GB" + ("" if r["fits"] else " ✗"),
                va="center", fontsize=6.5, color="black" if r["fits"] else "#c00000",
                fontweight="normal" if r["fits"] else "bold")
    ax.set_xlim(lo * 0.95, hi * 1.01 + (hi - lo) * 0.12)
    ax.set_xlabel("iteration time (s, simulated); peak memory per GPU at the bar's end")
    ax.set_ylabel("layers per stage")
    ax.set_title("Every first/last split, fastest first")
    legend = [Patch(color="#2ca02c", label="suggested: fastest that fits"), Patch(color="#d62728", label="even split"),
              Patch(color="#9ecae1", label="fits")]
    if not all(r["fits"] for r in sel):
        legend.append(Patch(facecolor="#e0e0e0", edgecolor="#c00000", hatch="///",
                            label=f"does not fit (> {cap:.1f} GB) ✗"))
    ax.legend(handles=legend, loc="upper right", fontsize=7.8)
    ax = axes[1][1]
    for st in range(PP):
        pts = sorted({(r["layers"][st], r["stage_peak_gb"][st]) for r in rows})
        ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", color=STAGE_COLORS[st], ms=4,
                label=f"stage {st}: holds {PP - st} micro-batch{'es' if PP - st > 1 else ''}, "
                      f"{slope(pts):.1f} GB per layer")
    ax.axhline(cap, color="#c00000", ls="--", lw=1.2, label=f"capacity {cap:.1f} GB")
    ax.set_xlabel("layers on the stage")
    ax.set_ylabel("the stage's peak memory per GPU (GB)")
    ax.set_title("1F1B: stage i holds p − i micro-batches of activations")
    ax.legend(loc="upper left", fontsize=7.8)
    fig.suptitle(f"Stage imbalance: {rows[0].get('model', MODEL.name)}, {PP}-stage 1F1B, "
                 f"m = {rows[0].get('m', '')} on one DGX H100" + (" (quick run)" if quick else ""), fontsize=12)
    fig.tight_layout()
    save(fig, path)


def main(argv=None) -> dict:
    args = parse_args(NAME, __doc__, argv)
    rows = parallel_map(simulate_point, points(args.quick), args.workers)
    model = model_for(args.quick)
    for r in rows:
        r["model"], r["m"] = model.name, micro_batches(args.quick)
    write_csv(args.out / f"{NAME}.csv", [{k: v for k, v in r.items() if k not in ("layers", "stage_s", "stage_peak_gb",
                                                                                   "stage_act_gb")}
                                         | {"stage_ms": " ".join(f"{t * 1e3:.1f}" for t in r["stage_s"]),
                                            "stage_peak_gb": " ".join(f"{g:.2f}" for g in r["stage_peak_gb"]),
                                            "stage_activations_gb": " ".join(f"{g:.2f}" for g in r["stage_act_gb"])}
                                         for r in rows])
    plot(rows, args.out / f"{NAME}.png", args.quick)
    even = next(r for r in rows if r["kind"] == "even")
    best, fastest = suggestion(rows)
    cap = even["capacity_gb"]
    err = max(abs(r["iteration_s"] / r["closed_s"] - 1) for r in rows)
    within = all(r["lower_s"] * 0.99 <= r["iteration_s"] <= r["closed_s"] * 1.01 for r in rows)
    heavy = [r for r in rows if r["kind"].startswith("first stage +")]
    # the output layer and loss in layers' worth: last stage minus a middle stage, per layer
    per_layer = even["stage_s"][1] / even["layers"][1]
    head_layers = (even["stage_s"][-1] - even["stage_s"][1]) / per_layer
    emb_layers = (even["stage_s"][0] - even["stage_s"][1]) / per_layer
    # memory: activations held at each stage's peak, per micro-batch the schedule keeps (p − i), per layer
    act_per_mb_layer = [even["stage_act_gb"][st] / (PP - st) / even["layers"][st] for st in range(PP - 1)]
    gb_per_layer = [slope(sorted({(r["layers"][st], r["stage_peak_gb"][st]) for r in rows})) for st in range(PP)]
    bad = [r for r in rows if not r["fits"]]
    k_bad = min((r["layers"][0] for r in bad), default=None)
    all_bad_from_k = k_bad is not None and all(not r["fits"] for r in rows if r["layers"][0] >= k_bad)
    roomy = min((r for r in rows if r["fits"] and r["peak_gb"] <= 0.9 * cap), key=lambda r: r["iteration_s"],
                default=None)
    results = {"rows": rows, "max_rel_error_vs_closed": err, "within_bounds": within,
               "best_split": best["split"] if best else None, "fastest_split": fastest["split"],
               "fastest_fits": fastest["fits"], "capacity_gb": cap, "even_split": even["split"],
               "speedup_best_over_even": even["iteration_s"] / best["iteration_s"] if best else None,
               "head_in_layers": head_layers, "embedding_in_layers": emb_layers,
               "activation_gb_per_micro_batch_layer": act_per_mb_layer, "peak_gb_per_layer": gb_per_layer}
    write_json(args.out / "results.json", results)
    m = micro_batches(args.quick)
    acts = ", ".join(f"{a:.1f}" for a in even["stage_act_gb"][:PP - 1])
    memory = (
        f" Memory moves the other way: under 1F1B stage i holds p − i micro-batches of activations (in the even "
        f"split the activations at the peaks of stages 0–{PP - 2} are {acts} GB, "
        f"{' : '.join(str(PP - st) for st in range(PP - 1))}), so a layer added to stage 0 raises its peak by "
        f"{gb_per_layer[0]:.1f} GB (its weights, gradients and optimizer states plus {PP} micro-batches of its "
        f"activations) against {gb_per_layer[-1]:.1f} GB on stage {PP - 1}; "
        + (f"{len(bad)} of the {len(rows)} rows {'does' if len(bad) == 1 else 'do'} not fit in the {cap:.1f} GB "
           f"an H100 has" + (f" (every row with {k_bad} or more layers on stage 0)" if all_bad_from_k else "")
           + ". " if bad else f"every row fits in the {cap:.1f} GB an H100 has. ")
        + memory_verdict(best, fastest, even)
        + (f" It leaves {cap - best['peak_gb']:.1f} GB free; if that is too tight, {roomy['split']} "
           f"({(roomy['iteration_s'] / best['iteration_s'] - 1) * 100:+.1f}% time, peak {roomy['peak_gb']:.1f} GB) "
           f"is the fastest split that leaves 10% free." if best is not None and roomy is not None and roomy is not best
           and best["peak_gb"] > 0.9 * cap else ""))
    answer = (
        f"The slowest stage sets the pace: across every split the simulated iteration lies "
        f"{'between' if within else 'near'} m·max T_i and Σ T_i + (m−1)·max T_i (the classic estimate is at "
        f"most {err * 100:.0f}% above the simulation), so time on the slowest stage is paid about m times "
        f"per iteration while time taken off the other stages buys almost nothing. Against the even split, "
        + "; ".join(f"{r['split']} ({r['kind']} layers) takes "
                    f"{(r['iteration_s'] / even['iteration_s'] - 1) * 100:+.0f}%"
                    + ("" if r["fits"] else f" and does not fit ({r['peak_gb']:.0f} GB)") for r in heavy)
        + f". The even split is itself unbalanced: the last stage also runs the output "
        f"layer and loss over the {model.vocab_size:,}-token vocabulary, worth {head_layers:.1f} transformer "
        f"layers here (the embedding lookup on stage 0: {emb_layers:.2f}), so stage {PP - 1} takes "
        f"{even['stage_s'][-1] / even['mean_stage_s']:.2f}× the mean; the remedy is fewer layers on the last "
        f"stage, as Megatron-LM's --decoder-last-pipeline-num-layers and Llama 3's \"one layer fewer on the first "
        f"and last stage\" do." + memory)

    def mark(r):
        tags = (["**suggested** (fastest that fits)"] if r is best else []) + \
               (["fastest overall"] if r is fastest and r is not best else [])
        return r["kind"] + "".join(f" — {t}" for t in tags)

    table = md_table([{**r, "case": mark(r), "it": r["iteration_s"], "cf": r["closed_s"], "lo": r["lower_s"],
                       "st": " / ".join(f"{t * 1e3:.0f}" for t in r["stage_s"]),
                       "pk": f"{r['peak_gb']:.1f}" if r["fits"] else f"**{r['peak_gb']:.1f}**",
                       "fit": "yes" if r["fits"] else "**✗ does not fit**",
                       "vs": (r["iteration_s"] / even["iteration_s"] - 1) * 100}
                      for r in sorted(rows, key=lambda r: r["iteration_s"])],
                     [("split", "layers per stage", ""), ("case", "case", ""), ("st", "stage F+B per micro-batch (ms)", ""),
                      ("it", "simulated (s)", ".3f"), ("lo", "m·max T_i (s)", ".3f"),
                      ("cf", "Σ T_i + (m−1)·max T_i (s)", ".3f"), ("vs", "vs even (%)", "+.1f"),
                      ("pk", "peak per GPU (GB)", ""), ("fit", f"fits in {cap:.1f} GB", "")])
    caveats = (
        "The seed answer's remedy (profile each layer, rebalance by hand or with Alpa) is right; what it leaves "
        "out is that the usual imbalance is not uneven layers but the embedding and, above all, the output "
        "layer with a large vocabulary, and that a rebalanced split must still fit. Megatron-LM's options here "
        "move whole layers; finer balance needs splitting the output layer or a different split of the "
        "vocabulary. Peak memory is the simulator's (model states with mixed-precision Adam, stored activations "
        "without recomputation, and the profile's reserve); recomputation or ZeRO would make the heavier first "
        "stages fit at a cost in time. Communication between stages is on NVLink here and small.")
    write_verdict(args, title="8. Pipeline stage imbalance", question=(
        "How much does the slowest pipeline stage cost when one stage has more layers or carries the "
        "embedding/logit layer, and what balanced partition does the simulator suggest?"),
        setup=(f"{model.name} (32 layers, vocabulary {model.vocab_size:,}, sequence {model.seq_length}), "
               f"{PP} pipeline stages on one DGX H100 (no tensor or data parallelism, {cap:.1f} GB per GPU), 1F1B, "
               f"m = {m} micro-batches of one sequence; uneven splits with Megatron-LM's first/last-stage layer "
               "counts. The suggested split is the fastest whose peak memory fits."),
        answer=answer, figures=[f"{NAME}.png"], body=table, caveats=caveats, headline=(
            f"The slowest stage is paid about m times per iteration; the {model.vocab_size // 1000}K-vocabulary "
            f"output layer is worth {head_layers:.1f} layers, so the even split {even['split']} is unbalanced; "
            + (f"the fastest split that fits in memory, {best['split']} ({best['peak_gb']:.1f} of {cap:.1f} GB), is "
               f"{(1 - best['iteration_s'] / even['iteration_s']) * 100:.0f}% faster"
               + ("" if fastest is best else f" (the fastest overall, {fastest['split']}, needs "
                  f"{fastest['peak_gb']:.1f} GB)") if best else "no split fits in memory")
            + f"; a layer moved onto the first stage costs the most memory ({PP} micro-batches of its activations)."))
    return results


if __name__ == "__main__":
    main()
    print(f"wrote experiments/out/{NAME}/")
