"""Question: what does expert load imbalance cost, and at what skew does adding EP stop paying?

Mixtral 8x7B (8 experts, top-2; 4 of its 32 layers in ``--quick``) on two DGX H100 nodes,
16 GPUs, no tensor or pipeline parallelism, ZeRO-1 (Megatron's distributed optimizer),
micro-batches of one 4,096-token sequence, full activation recomputation (without it the
experts' activations do not fit beside the model states; the verdict says by how much). The router's skew is swept with trainsim's
routing models: ``zipf:S`` (expert popularity ∝ rank^−S, counts drawn per micro-batch) for
S from 0 to 1.5, and a few ``dirichlet:A`` draws; ``balanced`` is the reference. Two ways of
placing the experts:

* **split 8 ways, same memory** (ep × etp = 8): each GPU holds 1/8 of every layer's expert
  weights either as whole experts (expert parallelism, ep) or as slices of every expert
  (expert tensor parallelism, etp; Megatron-Core's "parallel folding" with tp = 1). This is
  the fair comparison: the memory is the same, only the communication and the load differ.
* **replicated** (etp = 1, dp fills the GPUs): ep = 1, 2, 4, 8 with 8/ep copies of every
  expert; fewer GPUs per copy, more memory per GPU.

How the imbalance costs (``sim.program.routing``, ``sim.program.workload_moe``): each
expert-parallel rank receives the tokens routed to its experts; every rank of the group waits
for the busiest one (its expert GEMMs on L tokens, and the all-to-alls that carry them), so a
layer costs about (L/L̄ − 1) × its expert time more than balanced routing. An etp group
shares every expert, so it sees no imbalance; a single ep rank holds all 8 experts and none
either. With balanced routing a dispatch or combine all-to-all moves
T·k·h·bytes·(ep−1)/ep per rank (T tokens routed to k experts each, width h) — the closed form
the test checks against the bytes on the wire — and for ``zipf:S`` with one expert per rank
(ep = E) the busiest rank gets E/H(E, S) times the mean, H(E, S) = Σ_{r=1..E} r^−S.

    .venv/bin/python experiments/moe_imbalance.py [--quick]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import GB, dgx, md_table, parallel_map, parse_args, pyplot, run_summary, save  # noqa: E402
from common import write_csv, write_json, write_verdict  # noqa: E402
from report import number_of  # noqa: E402

from sim.inputs.hardware import load_profile  # noqa: E402
from sim.inputs.model import preset  # noqa: E402
from sim.inputs.plan import ParallelPlan  # noqa: E402
from sim.results.moe_report import moe_report  # noqa: E402

NAME = "moe_imbalance"
PROFILE = "h100-sxm"
NODES = 2
EPS = (1, 2, 4, 8)
RECOMPUTE = "full"
SPLIT, REPL = "split", "replicated"
FAMILY_LABEL = {SPLIT: "experts split 8 ways (ep × etp = 8, same memory)",
                REPL: "experts replicated (etp = 1, 8/ep copies)"}
EP_COLORS = {1: "#7f7f7f", 2: "#1f77b4", 4: "#2ca02c", 8: "#d62728"}


def model_for(quick: bool):
    m = preset("mixtral-8x7b")
    return replace(m, num_layers=4, name="mixtral-8x7b-4layers") if quick else m


def global_batch(quick: bool) -> int:
    return 32 if quick else 128  # sequences: 2 or 8 micro-batches per data-parallel replica


def zipf_skews(quick: bool) -> tuple:
    return (0.0, 0.1, 0.3, 1.0) if quick else (0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5)


def dirichlets(quick: bool) -> tuple:
    return (3.0,) if quick else (30.0, 10.0, 3.0, 1.0)


def routings(quick: bool) -> list[str]:
    return (["balanced"] + [f"zipf:{s:g}" for s in zipf_skews(quick)]
            + [f"dirichlet:{a:g}" for a in dirichlets(quick)])


def placements() -> list[tuple[str, int, int]]:
    """(family, ep, etp); ep 8 with etp 1 belongs to both families and is simulated once."""
    return [(SPLIT, ep, 8 // ep) for ep in EPS] + [(REPL, ep, 1) for ep in EPS]


def zipf_closed_imbalance(experts: int, s: float) -> float:
    """Busiest / mean expert popularity under zipf:S, E/H(E, S): the expected imbalance when
    each expert-parallel rank holds one expert (noise of the per-micro-batch draw aside)."""
    return experts / sum(r ** -s for r in range(1, experts + 1))


def simulate_point(point) -> dict:
    ep, etp, routing, quick, recompute = point
    model = model_for(quick)
    profile = load_profile(PROFILE)
    gpus = 8 * NODES
    plan = ParallelPlan(dp=gpus, ep=ep, etp=etp, zero_stage=1, global_batch_size=global_batch(quick),
                        moe_routing=routing, recompute=recompute)
    s, run = run_summary(model, plan, profile, dgx("dgx-h100", NODES), fidelity="reduced", keep_run=True)
    moe = moe_report(run, s)
    a2a = sum(t.nbytes for t in run.trace.transfers if t.src == 0 and "alltoall" in t.label)
    kind, _, param = routing.partition(":")
    exposed = s["exposed_comm_s"]
    return {"ep": ep, "etp": etp, "routing": routing, "kind": kind, "param": float(param) if param else None,
            "model": model.name, "m": plan.num_microbatches, "gpus": gpus, "recompute": recompute,
            "iteration_s": s["iteration_time_s"], "compute_s": s["compute_s"],
            "exposed_ep_s": exposed.get("ep", 0.0), "exposed_dp_s": exposed["dp"] + exposed["zero"],
            "imbalance_mean": moe["imbalance_mean"], "imbalance_max": moe["imbalance_max"],
            "a2a_bytes_rank0": a2a, "tokens_per_rank": plan.micro_batch_size * model.seq_length,
            "topk": model.moe_router_topk, "experts": model.num_experts, "hidden": model.hidden_size,
            "moe_layers": moe["moe_layers"], "peak_gb": s["memory"]["peak_bytes"] / GB,
            "capacity_gb": s["memory_capacity_bytes"] / GB, "fits": s["fits"]}


def points(quick: bool) -> list:
    unique = sorted({(ep, etp) for _, ep, etp in placements()}, key=lambda p: (-p[0], p[1]))
    return [(ep, etp, r, quick, RECOMPUTE) for ep, etp in unique for r in routings(quick)]


def family_rows(rows, family: str) -> dict:
    """{(ep, routing): row} of one family."""
    want = {(ep, etp) for f, ep, etp in placements() if f == family}
    return {(r["ep"], r["routing"]): r for r in rows if (r["ep"], r["etp"]) in want}


def crossover(fam: dict, small: int, big: int, skews) -> dict:
    """The zipf S at which ep = ``big`` stops beating ep = ``small`` (linear between swept S),
    with ep = big's imbalance there."""
    diff = [(s, fam[(big, f"zipf:{s:g}")]["iteration_s"] - fam[(small, f"zipf:{s:g}")]["iteration_s"],
             fam[(big, f"zipf:{s:g}")]["imbalance_mean"]) for s in skews]
    if diff[0][1] > 0:
        return {"small": small, "big": big, "s": 0.0, "imbalance": diff[0][2], "where": "below"}
    for (s0, d0, i0), (s1, d1, i1) in zip(diff, diff[1:]):
        if d1 > 0:
            x = -d0 / (d1 - d0)
            return {"small": small, "big": big, "s": s0 + x * (s1 - s0), "imbalance": i0 + x * (i1 - i0),
                    "where": "at"}
    return {"small": small, "big": big, "s": skews[-1], "imbalance": diff[-1][2], "where": "above"}


def expert_share(model) -> float:
    """Share of the model's FLOPs per token in the routed experts (closed form from the shape,
    forward; backward keeps the ratios): 2·k·3·h·f per MoE layer for the k SwiGLU experts,
    against the attention projections, the attention core's 4·s·h (no causal halving, as
    trainsim counts it) and the router in every layer, and the output layer's 2·h·V."""
    h, f, k, E, s = model.hidden_size, model.moe_ffn_hidden_size, model.moe_router_topk, model.num_experts, \
        model.seq_length
    experts = 2 * k * 3 * h * f
    layer = experts + 2 * (h * (model.q_dim + 2 * model.kv_dim) + model.q_dim * h) + 4 * s * model.q_dim + 2 * h * E
    moe = model.num_moe_layers
    return moe * experts / (moe * layer + 2 * h * model.vocab_size)


def _skew_axis(ax, skews) -> None:
    ax.set_xticks(range(len(skews) + 1), ["balanced"] + [f"{s:g}" for s in skews], fontsize=8)
    ax.axvline(0.5, color="black", lw=0.6, ls=":")
    ax.set_xlabel("router skew: zipf S, expert popularity ∝ rank^−S (swept values, evenly spaced)")


def _ep_label(r) -> str:
    return f"ep {r['ep']}" + (f" × etp {r['etp']}" if r["etp"] > 1 else "")


def _skew_x(s: float, skews) -> float:
    """Where zipf S falls on the evenly spaced axis (linear between swept values)."""
    for i, (a, b) in enumerate(zip(skews, skews[1:])):
        if a <= s <= b:
            return 1 + i + (s - a) / (b - a)
    return float(len(skews))


def plot(rows, res, path, quick) -> None:
    plt = pyplot()
    skews = zipf_skews(quick)
    fig, axes = plt.subplots(2, 2, figsize=(14, 11))
    for ax, family in ((axes[0][0], SPLIT), (axes[0][1], REPL)):
        fam = family_rows(rows, family)
        lo = min(r["iteration_s"] for r in fam.values())
        top = lo * 1.55  # the small skews are the question; the rest runs off the top (the table has it)
        xs = range(len(skews) + 1)
        handles = []
        for ep in EPS:
            rs = [fam[(ep, "balanced")]] + [fam[(ep, f"zipf:{s:g}")] for s in skews]
            fits = rs[0]["fits"]
            label = _ep_label(rs[0]) + ("" if fits else f" — does not fit ({rs[0]['peak_gb']:.0f} GB per GPU)")
            handles += ax.plot(xs, [r["iteration_s"] for r in rs], "o-" if fits else "o--", color=EP_COLORS[ep],
                               ms=4.5, mfc=EP_COLORS[ep] if fits else "white", label=label)
            if rs[-1]["iteration_s"] > top:
                ax.annotate(f"{_ep_label(rs[0])}: {rs[-1]['iteration_s']:.1f} s at S = {skews[-1]:g} ↑",
                            xy=(len(skews), top), xytext=(len(skews) - 0.1, top * (0.985 - 0.025 * (8 - ep) / 2)),
                            ha="right", va="top", fontsize=7, color=EP_COLORS[ep],
                            bbox={"fc": "white", "ec": "none", "alpha": 0.85, "pad": 1})
        for c in res["crossovers"][family]:
            if c["where"] == "at":
                x = _skew_x(c["s"], skews)
                handles.append(ax.axvline(x, color=EP_COLORS[c["big"]], lw=1.0, ls=":",
                                          label=f"ep {c['big']} faster than ep {c['small']} up to S ≈ {c['s']:.2f} "
                                                f"(ep {c['big']}'s imbalance {c['imbalance']:.2f})"))
        _skew_axis(ax, skews)
        ax.set_ylim(lo * 0.97, top)
        ax.set_ylabel("iteration time (s)")
        ax.set_title(f"Step time vs skew, {FAMILY_LABEL[family]}\n"
                     "(dotted: the skew where doubling ep stops making the step faster)")
        ax.legend(handles=handles, loc="upper left", title="expert placement", title_fontsize=8, fontsize=7.4)
    ax = axes[1][0]
    split = family_rows(rows, SPLIT)
    for ep in EPS[1:]:
        ax.plot(skews, [split[(ep, f"zipf:{s:g}")]["imbalance_mean"] for s in skews], "o-", color=EP_COLORS[ep],
                ms=5, lw=0.8, label=f"ep {ep}, zipf draws (simulated)")
    E = rows[0]["experts"]
    fine = [i / 50 for i in range(0, int(max(skews) * 50) + 1)]
    ax.plot(fine, [zipf_closed_imbalance(E, s) for s in fine], "--", color="black", lw=1,
            label=f"closed form E/H(E, S) for one expert per rank (ep = E = {E})")
    ax.axhline(1, color="black", lw=0.6)
    ax.set_xlabel("router skew: zipf S (expert popularity ∝ rank^−S)")
    ax.set_ylabel("busiest expert-parallel rank / mean tokens\n(mean over layers and micro-batches)")
    ax.set_title("Load imbalance grows with the skew, and with ep (ep 1: always 1)")
    ax.legend(loc="upper left")
    ax = axes[1][1]
    for ep in EPS[1:]:
        for kind, mk in (("zipf", "o"), ("dirichlet", "^")):
            rs = sorted((r for (e, _), r in split.items() if e == ep and r["kind"] == kind),
                        key=lambda r: r["imbalance_mean"])
            ax.plot([r["imbalance_mean"] for r in rs], [r["cost_fraction"] * 100 for r in rs], mk, color=EP_COLORS[ep],
                    ms=5.5 if mk == "o" else 7, mfc=EP_COLORS[ep] if mk == "o" else "white", mew=1.3,
                    label=f"{_ep_label(rs[0])}, {kind}:{'S' if kind == 'zipf' else 'A'}")
    imax = max(r["imbalance_mean"] for r in split.values())
    est = res["expert_share"]
    ax.plot([1, imax], [0, (imax - 1) * est * 100], "--", color="black", lw=1,
            label=f"FLOPs estimate: (imbalance − 1) × the experts' {est * 100:.0f}% of the model's FLOPs")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xlabel("busiest expert-parallel rank / mean tokens")
    ax.set_ylabel("imbalance cost (% of the same placement's balanced iteration)")
    ax.set_title("What the imbalance costs: about linear in it, whatever the router model\n"
                 "(experts split 8 ways; ep 1 × etp 8 has none)")
    ax.legend(loc="upper left", fontsize=7.4)
    r0 = rows[0]
    fig.suptitle(f"Expert load imbalance: {r0['model']} (8 experts, top-2) on {r0['gpus']} H100 in {NODES} DGX nodes, "
                 f"tp 1, dp {r0['gpus']}, ZeRO-1, full recompute, {r0['m']} micro-batches of 4096 tokens per GPU"
                 + (" (quick run)" if quick else ""), fontsize=12)
    fig.tight_layout()
    save(fig, path)


def main(argv=None) -> dict:
    args = parse_args(NAME, __doc__, argv)
    quick = args.quick
    pts = points(quick)
    without = [(8, 1, "balanced", quick, "none"), (1, 8, "balanced", quick, "none")]
    *rows, ep8, etp8 = parallel_map(simulate_point, pts + without, args.workers)
    model = model_for(quick)
    bal = {(r["ep"], r["etp"]): r for r in rows if r["routing"] == "balanced"}
    for r in rows:
        b = bal[(r["ep"], r["etp"])]
        r["balanced_iteration_s"] = b["iteration_s"]
        r["cost_s"] = r["iteration_s"] - b["iteration_s"]
        r["cost_fraction"] = r["cost_s"] / b["iteration_s"]
        # T·k·h·bytes·(ep−1)/ep per all-to-all; dispatch and combine, forward and backward (and the
        # forward again under full recomputation)
        r["a2a_closed_balanced_bytes"] = ((4 + 2 * (r["recompute"] == "full")) * r["moe_layers"] * r["m"] * r["tokens_per_rank"] * r["topk"]
                                          * r["hidden"] * 2 * (r["ep"] - 1) / r["ep"])
        r["zipf_closed_imbalance"] = (zipf_closed_imbalance(r["experts"], r["param"]) if r["kind"] == "zipf"
                                      else None)
    skews = zipf_skews(quick)
    pairs = [(4, 8), (2, 4), (1, 2)]
    crossovers = {f: [crossover(family_rows(rows, f), a, b, skews) for a, b in pairs] for f in (SPLIT, REPL)}
    best = {}
    for f in (SPLIT, REPL):
        fam = family_rows(rows, f)
        best[f] = {rt: min((r for (e, x), r in fam.items() if x == rt), key=lambda r: r["iteration_s"])["ep"]
                   for rt in routings(quick)}
    results = {"rows": rows, "crossovers": crossovers, "best_ep": best, "expert_share": expert_share(model),
               "families": {f: [[ep, etp] for g, ep, etp in placements() if g == f] for f in (SPLIT, REPL)},
               "zipf_skews": list(skews),
               "without_recompute": {"ep 8": {k: ep8[k] for k in ("peak_gb", "fits", "iteration_s")},
                                     "ep 1 x etp 8": {k: etp8[k] for k in ("peak_gb", "fits", "iteration_s")}}}
    write_json(args.out / "results.json", results)
    write_csv(args.out / f"{NAME}.csv", rows)
    plot(rows, results, args.out / f"{NAME}.png", quick)
    _verdict(args, rows, results, model)
    return results


def _cross_text(c) -> str:
    if c["where"] == "below":
        return (f"ep {c['big']} is slower than ep {c['small']} already at S = 0 (the draws' noise alone, "
                f"imbalance {c['imbalance']:.2f})")
    if c["where"] == "above":
        return f"ep {c['big']} stays faster than ep {c['small']} up to S = {c['s']:g}"
    return (f"ep {c['big']} beats ep {c['small']} up to S ≈ {c['s']:.2f} (busiest of its ranks "
            f"{c['imbalance']:.2f}× the mean)")


def _verdict(args, rows, res, model) -> None:
    split, repl = family_rows(rows, SPLIT), family_rows(rows, REPL)
    skews = res["zipf_skews"]
    t = {f: {ep: fam[(ep, "balanced")]["iteration_s"] for ep in EPS} for f, fam in ((SPLIT, split), (REPL, repl))}
    big = skews[-1]
    worst = split[(8, f"zipf:{big:g}")]
    peaks = ", ".join(f"{repl[(ep, 'balanced')]['peak_gb']:.0f}" for ep in EPS)
    fits = [ep for ep in EPS if repl[(ep, "balanced")]["fits"]]
    cap = repl[(8, "balanced")]["capacity_gb"]
    same = [split[(ep, "balanced")]["peak_gb"] for ep in EPS]
    wo = res["without_recompute"]
    share = res["expert_share"]
    slope = [r["cost_fraction"] / (r["imbalance_mean"] - 1) for r in split.values()
             if r["ep"] > 1 and r["imbalance_mean"] > 1.05]
    last_best = {f: max((s for s in skews if res["best_ep"][f][f"zipf:{s:g}"] == 8), default=None)
                 for f in (SPLIT, REPL)}
    no_ep = min((s for s in skews if res["best_ep"][SPLIT][f"zipf:{s:g}"] == 1), default=None)
    answer = (
        f"Imbalance costs about (L/L̄ − 1) × the experts' share of the step: every rank of an expert-parallel "
        f"group waits for the busiest one, so the cost per unit of imbalance is "
        f"{min(slope) * 100:.0f}–{max(slope) * 100:.0f}% of the balanced iteration (the routed experts are "
        f"{share * 100:.0f}% of the model's FLOPs; bigger expert GEMMs run a little more efficiently, and the "
        f"optimizer and gradient sync do not grow), the same for zipf and Dirichlet routers; at zipf "
        f"S = {big:g} the busiest of 8 ranks gets {worst['imbalance_mean']:.2f}× the mean and the step takes "
        f"{worst['cost_fraction'] * 100:+.0f}%. With the experts split 8 ways in the same memory (peak "
        + (f"{min(same):.1f} GB per GPU for each" if max(same) - min(same) < 0.05 else
           f"{min(same):.1f}–{max(same):.1f} GB per GPU") + "), balanced routing "
        f"favours expert parallelism (ep 8: {t[SPLIT][8]:.2f} s, ep 1 × etp 8: {t[SPLIT][1]:.2f} s: all-to-alls "
        f"move 1/etp of what expert-TP's gathers do), but the advantage is thin and the imbalance eats it "
        f"early: " + "; ".join(_cross_text(c) for c in res["crossovers"][SPLIT]) + ". "
        + (f"Of the swept skews ep 8 is the fastest placement only up to S = {last_best[SPLIT]:g}"
           + (" (where only the draws' noise unbalances it)" if last_best[SPLIT] == 0 else "")
           if last_best[SPLIT] is not None else "Of the swept skews ep 8 is never the fastest placement")
        + (f", and from S = {no_ep:g} splitting every expert (etp 8, no EP) is fastest. " if no_ep is not None else ". ")
        + f"Replicating experts instead (etp 1, dp filling the GPUs), EP barely changes the balanced step "
        f"(ep 1 {t[REPL][1]:.2f} s, ep 8 {t[REPL][8]:.2f} s: each GPU computes the same tokens' experts either way; "
        f"EP saves only gradient and optimizer traffic) and "
        + "; ".join(_cross_text(c) for c in res["crossovers"][REPL][:1])
        + f"; what EP buys there is memory (peaks of ep 1, 2, 4, 8: {peaks} GB per GPU against {cap:.0f} GB: "
        + ("all fit" if len(fits) == len(EPS) else
           f"only ep {', '.join(map(str, fits))} fit{'s' if len(fits) == 1 else ''}" if fits else "none fits")
        + "). "
        + ("Full recomputation is what makes the split placements fit: without it" if not wo["ep 8"]["fits"] else
           "Without recomputation") + f" the peak is {wo['ep 8']['peak_gb']:.0f} GB at ep 8 and "
        f"{wo['ep 1 x etp 8']['peak_gb']:.0f} GB at ep 1 × etp 8 (expert TP holds the tokens it gathers), and the "
        f"balanced step takes {wo['ep 8']['iteration_s']:.2f} s instead of {t[SPLIT][8]:.2f} s.")
    table_rows = []
    for rt in routings(args.quick):
        row = {"routing": rt, "imb8": split[(8, rt)]["imbalance_mean"]}
        for f, fam in ((SPLIT, split), (REPL, repl)):
            b = res["best_ep"][f][rt]
            for ep in EPS:
                v = fam[(ep, rt)]["iteration_s"]
                row[f"{f}{ep}"] = f"**{v:.2f}**" if ep == b else f"{v:.2f}"
        table_rows.append(row)
    cols = [("routing", "routing", ""), ("imb8", "imbalance at ep 8", ".2f")]
    cols += [(f"{SPLIT}{ep}", f"ep {ep} × etp {8 // ep} (s)", "") for ep in EPS]
    cols += [(f"{REPL}{ep}", f"ep {ep}, replicated (s)", "") for ep in EPS]
    body = ("Iteration time (s); the fastest placement of each family in bold. Exposed expert-parallel "
            "communication, imbalance cost, memory and all-to-all bytes per row are in the CSV.\n\n"
            + md_table(table_rows, cols))
    zero = max((r for r in rows if r["routing"] == "zipf:0"), key=lambda r: r["cost_fraction"])
    caveats = (
        f"Balanced routing gives every expert exactly N/E tokens, grouped GEMMs whose rows fill the GEMM "
        f"tiles exactly; any draw breaks that, so part of the cost at S = 0 (at most "
        f"{zero['cost_fraction'] * 100:.1f}%, {_ep_label(zero)}{'' if zero['etp'] > 1 else ', replicated' if zero['ep'] < 8 else ''}, "
        f"imbalance {zero['imbalance_mean']:.3f}) is trainsim's tile quantization rather than imbalance; the "
        "crossovers compare zipf draws only. "
        "Skew here is a model of a router, not a measurement: zipf:S gives a fixed popularity per layer and "
        "Dirichlet draws one, with multinomial counts per micro-batch; a trained router with an auxiliary loss "
        "(or DeepSeek-V3's bias balancing) sits near the left of these curves, and a histogram of real counts "
        "(`--moe-routing FILE`) can be simulated the same way. The grouped expert GEMMs are priced as equal "
        "GEMMs (the spread of counts between one rank's experts is not), the all-to-alls are not overlapped "
        "with compute (no DeepEP, no shared-expert overlap), and there is no token dropping (dropless; a "
        "capacity factor would cap the cost and drop tokens instead). Mixtral has 8 experts, so ep ≤ 8 and "
        "every expert-parallel group sits inside one node's NVLink; across nodes the all-to-alls would cost "
        "more and EP would stop paying earlier.")
    r0 = rows[0]
    write_verdict(args, title=f"{number_of(NAME)}. Expert load imbalance and expert parallelism", question=(
        "What does expert load imbalance cost, and at what skew does adding expert parallelism stop paying?"),
        setup=(f"{r0['model']} (8 experts, top-2, {r0['moe_layers']} MoE layers) on {r0['gpus']} H100 "
               f"({NODES} DGX nodes), tp 1, dp {r0['gpus']}, ZeRO-1, full recomputation, {r0['m']} micro-batches "
               "of one 4096-token "
               "sequence per GPU; the router's skew swept as zipf:S (S = " + ", ".join(f"{s:g}" for s in skews)
               + ") and Dirichlet draws; experts split 8 ways (ep × etp = 8, the same memory) or replicated "
               "(etp 1, ep = 1, 2, 4, 8)."),
        answer=answer, figures=[f"{NAME}.png"], body=body, caveats=caveats, headline=(
            f"Imbalance costs about (busiest/mean − 1) × the experts' share of the step ({share * 100:.0f}% of "
            f"the model's FLOPs; +{worst['cost_fraction'] * 100:.0f}% at zipf S = {big:g}); at equal memory "
            + _cross_text(res["crossovers"][SPLIT][0])
            + (f", and from S = {no_ep:g} no EP (expert TP only) is fastest" if no_ep is not None else "")
            + "; with replicated experts EP pays in memory, not time."))


if __name__ == "__main__":
    main()
    print(f"wrote experiments/out/{NAME}/")
