"""What does an NVL72 rack buy over 8-GPU nodes?

Llama 3 405B (dense, 126 layers, 8,192 tokens) and DeepSeek-V3 (671B mixture of experts,
256 routed experts, 4,096 tokens) in BF16 on 512 GPUs of three systems:

- **H100**: 64 DGX H100 nodes (8 GPUs on NVLink 4 each, 8 x 400G InfiniBand);
- **B200**: 64 DGX B200 nodes (8 GPUs on NVLink 5 each, 8 x 400G InfiniBand);
- **GB200 NVL72**: 8 racks, each one 72-GPU NVLink 5 domain, joined by InfiniBand (one
  400G NIC per GPU). The job uses 64 GPUs of each rack (``--gpus 512 --gpus-per-node 64``),
  so that groups of 16, 32 or 64 GPUs never straddle two racks; ``--gpus 512`` alone would
  fill 7 racks and put 8 GPUs on an eighth, and groups of 64 would straddle racks (the
  script counts how many for the GB200 winner's groups and prints it).

Tokens per step are the same on every system: 8,388,608 per step for both models. Llama 3
405B runs 1,024 sequences of 8,192 tokens, the batch Meta used after its first ramp-up
(8M tokens of 8,192, Llama 3 paper §3.4.1). DeepSeek-V3 runs 2,048 sequences of 4,096
tokens, the same 8M tokens (below the 3,072 sequences DeepSeek started at, V3 report §4.2;
it keeps the simulation at 32-256 micro-batches a replica).

**Best plan.** The project's own search, ``sim.studies.search`` (``candidates`` then
``search``, as ``trainsim search`` runs it), over a hand-picked candidate space rather than
every plan: a full search of one model on 512 GPUs takes about ten minutes on this
two-core machine, and an exhaustive one hours. Every system gets the same candidates:
Megatron-LM's layout (micro-batch 1, the distributed optimizer = ZeRO-1, sequence
parallelism with tp > 1, Megatron's rank order ``tp-cp-ep-dp-pp``, here placement
``tp-dp-pp``, layers split by ``--layer-split auto`` where pp does not divide them, no
recompute unless named):

- Llama 3 405B: tp 8 x cp 2 x pp 8 (NVIDIA's H100 benchmark layout, with pp 8 for its 9;
  16 GPUs carry a layer's tp and cp traffic), tp 8 x cp 2 x pp 4, tp 8 x pp 8, tp 4 x cp 2 x
  pp 8 (NeMo's B200 layout), tp 8 x pp 8 with full recompute (which fits an H100 without
  cp); all interleaved (4 virtual stages a rank). Its 8 query groups cap tp at 8, so the
  rack's larger domain can hold tp x cp, data-parallel and pipeline groups, not a wider tp.
- DeepSeek-V3: expert parallelism 8 (one DGX node), 16, 32 and 64 (on GB200 one rack;
  on DGX 2 to 8 nodes over InfiniBand) with tp 1, 2 or 4, pp 8 or 16, expert tp 1,
  DeepEP's dispatcher (flex).

The search estimates each candidate's memory (those that do not fit the GPU are not
simulated), simulates the rest at reduced fidelity, each first at two small micro-batch
counts with its time extrapolated (*screening*, within 0.1% of a full run), prunes
candidates whose analytic bound cannot beat the best two (margin 1.1), and simulates the two
fastest in full: the best is the fastest of those, with its MFU, tokens/s per GPU, energy
per token and average power per GPU from ``trainsim run --json``'s summary (GPU boards
only). ``--quick`` runs only DeepSeek-V3 with three candidates.

    .venv/bin/python experiments/nvl72.py [--quick]
"""

from __future__ import annotations

import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import md_table, parse_args, pyplot, save, write_csv, write_json, write_verdict  # noqa: E402

from sim.inputs.experts import Folding  # noqa: E402
from sim.inputs.hardware import load_profile  # noqa: E402
from sim.inputs.model import preset  # noqa: E402
from sim.inputs.plan import ParallelPlan  # noqa: E402
from sim.inputs.topology_build import load_topology  # noqa: E402
from sim.studies.search import DEFAULT_MARGIN, SearchOptions, candidates, search  # noqa: E402
from sim.studies.sweep import evaluate, make_context  # noqa: E402

NAME = "nvl72"
GPUS = 512
SYSTEMS = {  # label: (GPU profile, node file, GPUs used per node)
    "H100": ("h100-sxm", "dgx-h100", 8),
    "B200": ("b200", "dgx-b200", 8),
    "GB200 NVL72": ("gb200", "gb200-nvl72", 64),
}
RACK = 72
"""GPUs in one NVL72 rack: ``--gpus 512`` without ``--gpus-per-node`` fills racks of 72."""
DENSE = "llama3-405b"
MOE = "deepseek-v3"
BATCH = {DENSE: 1024, MOE: 2048}
"""Global batch in sequences: 8,388,608 tokens a step for both (module doc)."""
CANDIDATES = {
    DENSE: [dict(tp=8, cp=2, pp=8, vpp=4), dict(tp=8, cp=2, pp=4, vpp=4),
            dict(tp=8, pp=8, vpp=4), dict(tp=4, cp=2, pp=8, vpp=4), dict(tp=8, pp=8, vpp=4, recompute="full")],
    MOE: [dict(tp=4, pp=16, vpp=2, ep=8), dict(tp=2, pp=8, ep=8), dict(tp=2, pp=16, vpp=2, ep=16),
          dict(tp=4, pp=16, vpp=2, ep=32), dict(tp=4, pp=8, vpp=2, ep=64), dict(tp=2, pp=8, vpp=2, ep=64),
          dict(tp=1, pp=8, vpp=2, ep=64)],
}
QUICK_CANDIDATES = {MOE: [dict(tp=4, pp=16, vpp=2, ep=8), dict(tp=2, pp=8, ep=8), dict(tp=4, pp=8, vpp=2, ep=64)]}
QUICK_BATCH = {MOE: 512}
"""``--quick``: DeepSeek-V3 alone, three candidates, a quarter of the batch."""
WAVE = 4
"""Candidates simulated between the search's pruning checks (``search``'s ``wave``)."""
PLACEMENT = "tp-dp-pp"
"""Megatron-LM's rank order (``tp-cp-ep-dp-pp``): tp innermost, cp next (inside dp), pp outermost."""
LABELS = {DENSE: "Llama 3 405B", MOE: "DeepSeek-V3"}
COLORS = {"H100": "#7f7f7f", "B200": "#1f77b4", "GB200 NVL72": "#2ca02c"}


def make_plan(model_name: str, c: dict, batch: int) -> ParallelPlan:
    """One candidate as a plan on ``GPUS`` GPUs at a global batch of ``batch`` sequences
    (module doc: Megatron-LM's layout)."""
    tp, pp, cp, ep, vpp = c["tp"], c["pp"], c.get("cp", 1), c.get("ep", 1), c.get("vpp", 1)
    layers = preset(model_name).num_layers
    return ParallelPlan(dp=GPUS // (tp * pp * cp), tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=1 if ep > 1 else None,
                        dispatcher="flex" if ep > 1 else "alltoall", micro_batch_size=1,
                        global_batch_size=batch, zero_stage=1, sequence_parallel=tp > 1,
                        recompute=c.get("recompute", "none"), placement=PLACEMENT,
                        schedule="interleaved" if vpp > 1 else "1f1b",
                        layer_split="auto" if layers % pp else None)


def plan_label(plan: ParallelPlan) -> str:
    parts = [f"tp {plan.tp}"] + ([f"cp {plan.cp}"] if plan.cp > 1 else [])
    parts.append(f"pp {plan.pp}" + (f" (v{plan.vpp})" if plan.vpp > 1 else ""))
    if plan.ep > 1:
        parts.append(f"ep {plan.ep}")
    parts.append(f"dp {plan.dp}")
    text = " x ".join(parts)
    return text + (f", {plan.recompute} recompute" if plan.recompute != "none" else "")


# ------------------------------------------------------------ where the groups live
def layer_group(plan: ParallelPlan, rank: int) -> set:
    """The GPUs a layer's tensor-, context- and expert-parallel traffic of ``rank`` runs
    over: its tp x cp block and, for a mixture of experts, its expert-parallel group."""
    out = {x for c in plan.cp_group(rank) for x in plan.tp_group(c)}
    if plan.ep > 1:
        out |= set(Folding(plan).ep_group(rank))
    return out


def group_layout(plan: ParallelPlan, gpus_per_node: int) -> dict:
    """How many GPUs a layer's group holds, and the most nodes (racks) any such group
    touches when the nodes hold ``gpus_per_node`` consecutive ranks; also which of the
    plan's dimensions stay inside one node."""
    spans, straddling = 0, 0
    size = max(plan.tp * plan.cp, plan.ep * (plan.etp or plan.tp))
    for r in range(plan.world_size):
        nodes = {x // gpus_per_node for x in layer_group(plan, r)}
        spans = max(spans, len(nodes))
        straddling += len(nodes) > 1
    inside = [d for d in ("tp", "pp", "dp") if plan.max_nodes_spanned(d, gpus_per_node) == 1]
    return {"layer_group_gpus": size, "layer_group_nodes": spans, "ranks_whose_group_straddles": straddling,
            "dims_inside_one_node": ",".join(inside) or "-"}


# ------------------------------------------------------------ simulation
_CONTEXTS: dict = {}


def _context(system: str, model_name: str):
    """The sweep context (model, profile, topology) of one system and model; built once per
    process (forked workers inherit the parent's)."""
    key = (system, model_name)
    if key not in _CONTEXTS:
        gpu, node, per_node = SYSTEMS[system]
        topo = load_topology(node, min_gpus=GPUS, gpus_per_node=per_node)
        _CONTEXTS[key] = make_context(preset(model_name), load_profile(gpu), topo)
    return _CONTEXTS[key]


def _evaluate(job) -> dict:
    system, model_name, plan = job
    return evaluate(_context(system, model_name), plan)


def _noop(_=None):
    return None


def search_one(system: str, model_name: str, specs: list[dict], batch: int, pool) -> dict:
    """``sim.studies.search`` over ``specs`` on one system: every candidate with its status
    and time, and the best plan's record."""
    gpu, _, per_node = SYSTEMS[system]
    model, profile = preset(model_name), load_profile(gpu)
    cands = candidates(model, [make_plan(model_name, s, batch) for s in specs], profile, per_node)

    def simulate(plans):
        jobs = [(system, model_name, p) for p in plans]
        return list(pool.map(_evaluate, jobs)) if pool else [_evaluate(j) for j in jobs]

    t0 = time.monotonic()
    result = search(cands, simulate, SearchOptions(margin=DEFAULT_MARGIN, wave=WAVE, screen=True, final=2))
    print(f"nvl72: {model_name} on {system}: {result.counts['evaluated']} of {len(cands)} candidates evaluated "
          f"in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    rows, records = [], {}
    for i, c in enumerate(result.candidates):  # in the order of ``specs``
        s = c.record["summary"] if c.record and c.record.get("summary") else {}
        if c.status == "ok":
            records[i] = (c.plan, s)
        row = {"system": system, "model": model_name, "candidate": i, "plan": plan_label(c.plan), "key": c.key,
               "status": c.status,
               "iteration_time_s": s.get("iteration_time_s", math.nan), "fits": s.get("fits", c.estimate.fits),
               "estimate_peak_gib": c.estimate.memory["total"] / 2**30, "bound_s": c.bound_s,
               "error": c.record.get("error") if c.record else None, **group_layout(c.plan, per_node)}
        rows.append(row)
    best = result.best
    index = next((i for i, c in enumerate(result.candidates) if best and c.key == best["key"]), None)
    return {"system": system, "model": model_name, "rows": rows, "best": best, "counts": result.counts,
            "best_index": index, "best_plan": result.candidates[index].plan if best else None, "records": records,
            "plans": [c.plan for c in result.candidates]}


# ------------------------------------------------------------ outputs
PARTS = {"compute": ("compute_s",), "bubble and waiting": ("idle_s",), "exposed tp + cp": ("tp", "cp"),
         "exposed ep (token exchange)": ("ep",), "exposed dp + ZeRO-1 gather": ("dp", "zero"), "exposed pp": ("pp",)}
"""Where a step goes: the summary's compute and idle time and its exposed communication by
kind (together the iteration time)."""
PART_COLORS = ["#4c72b0", "#c7c7c7", "#dd8452", "#c44e52", "#8172b3", "#937860"]


def parts(summary: dict) -> dict:
    exposed = summary["exposed_comm_s"]
    out = {name: sum(summary[k] if k.endswith("_s") else exposed.get(k, 0.0) for k in keys)
           for name, keys in PARTS.items()}
    known = {k for keys in PARTS.values() for k in keys}
    out["exposed other"] = sum(v for k, v in exposed.items() if k not in known)
    return out


def result_row(system: str, model_name: str, plan: ParallelPlan, s: dict) -> dict:
    """One simulated plan as a table row (``s``: ``trainsim run --json``'s summary)."""
    per_node = SYSTEMS[system][2]
    tokens = plan.global_batch_size * preset(model_name).seq_length
    return {"system": system, "model": model_name, "best_plan": plan_label(plan),
            "iteration_time_s": s["iteration_time_s"], "mfu": s["mfu"], "mfu_pct": 100 * s["mfu"],
            "tokens_per_step": tokens, "tokens_per_s": s["tokens_per_s"],
            "tokens_per_s_per_gpu": s["tokens_per_s"] / GPUS,
            "energy_per_token_j": s["energy_per_token_j"], "energy_per_iteration_j": s["energy_per_iteration_j"],
            "average_power_w": s["average_power_w"], "average_power_per_gpu_w": s["average_power_per_gpu_w"],
            "power_limit_w": load_profile(SYSTEMS[system][0]).power_limit_w,
            "peak_memory_gib": s["memory"]["peak_bytes"] / 2**30,
            "memory_capacity_gib": s["memory_capacity_bytes"] / 2**30,
            "fits": s["fits"], "fidelity": s["fidelity"], "gpus": s["gpus"],
            **{f"{k}_s": v for k, v in parts(s).items()}, **group_layout(plan, per_node)}


def chip_ceiling(system: str) -> float:
    """The GPU's BF16 GEMM ceiling: its dense peak times its measured best GEMM's share of it."""
    p = load_profile(SYSTEMS[system][0])
    return p.peak_flops["bf16"] * p.gemm_max_efficiency


def draw(best: list[dict], models: list[str], path: Path) -> None:
    plt = pyplot()
    fig = plt.figure(figsize=(12, 4.4 + 0.45 * len(best) + 1.2), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[4.4, 0.45 * len(best) + 1.2])
    axes = [*top.subplots(1, 2), bottom.subplots()]
    systems = list(SYSTEMS)
    width = 0.8 / len(systems)
    by = {(b["system"], b["model"]): b for b in best}
    panels = [("tokens_per_s_per_gpu", "Throughput per GPU (higher is better)",
               "x H100 (labels: tokens/s per GPU)", lambda b: f"{b['tokens_per_s_per_gpu']:,.0f}"),
              ("energy_per_token_j", "GPU energy per token (lower is better)",
               "x H100 (labels: J per token, W per GPU)",
               lambda b: f"{b['energy_per_token_j']:.2f} J\n{b['average_power_per_gpu_w']:.0f} W")]
    for ax, (key, title, ylabel, fmt) in zip(axes, panels):
        for i, system in enumerate(systems):
            pts = [(j, by[(system, m)]) for j, m in enumerate(models) if (system, m) in by]
            xs = [j + (i - (len(systems) - 1) / 2) * width for j, _ in pts]
            ys = [b[key] / by[("H100", b["model"])][key] for _, b in pts]
            bars = ax.bar(xs, ys, width * 0.92, color=COLORS[system], label=system)
            ax.bar_label(bars, [fmt(b) for _, b in pts], fontsize=7.5, padding=2)
        ax.set_xticks(range(len(models)), [LABELS[m] for m in models])
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylim(0, max(ax.get_ylim()[1], 1.0) * 1.18)
    axes[0].legend(loc="upper left")
    ax = axes[2]  # where each best plan's step goes
    labels, ys, y = [], [], 0.0
    for m in models:
        for system in systems:
            b = by.get((system, m))
            if b is None:
                continue
            left = 0.0
            for name, color in zip([*PARTS, "exposed other"], [*PART_COLORS, "#000000"]):
                share = b[f"{name}_s"] / b["iteration_time_s"]
                ax.barh(y, share, left=left, color=color, label=name if not ys else None, height=0.75)
                left += share
            labels.append(f"{LABELS[m]}, {system}: {b['best_plan']}")
            ys.append(y)
            y += 1
        y += 0.5
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the iteration time")
    ax.set_title("Where each best plan's iteration goes (exposed: communication no compute hides)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    what = " and ".join(LABELS[m] for m in models)
    fig.suptitle(f"{what} on {GPUS} GPUs, BF16, each system's best plan "
                 f"(H100 and B200: 8-GPU DGX nodes; GB200 NVL72: 8 racks, 64 GPUs used in each)", fontsize=10.5)
    save(fig, path)


def text_table(best: list[dict]) -> str:
    head = (f"{'system':<12} {'model':<12} {'best plan':<34} {'time s':>7} {'MFU':>6} {'tok/s/GPU':>10} "
            f"{'J/token':>8} {'W/GPU':>6}")
    lines = [head]
    for b in best:
        lines.append(f"{b['system']:<12} {b['model']:<12} {b['best_plan']:<34} {b['iteration_time_s']:>7.2f} "
                     f"{b['mfu_pct']:>5.1f}% {b['tokens_per_s_per_gpu']:>10,.0f} {b['energy_per_token_j']:>8.3f} "
                     f"{b['average_power_per_gpu_w']:>6.0f}")
    return "\n".join(lines)


def _pct(a: float, b: float) -> float:
    """How much larger ``a`` is than ``b``, in percent."""
    return 100 * (a / b - 1)


def _dp(b: dict) -> float:
    return b["exposed dp + ZeRO-1 gather_s"]


def _speedup(before_s: float, after_s: float) -> str:
    """'x1.12 faster' or 'x1.02 slower' (a ratio above 1 either way)."""
    r = before_s / after_s
    return f"x{r:.2f} faster" if r >= 1 else f"x{1 / r:.2f} slower"


def answer_lines(best: list[dict], same: dict, rows: list[dict], models: list[str]) -> list[str]:
    """The answer, from the results: per model GB200's gain over B200 and H100, the B200's
    best plan on GB200 (chip and rack, the same plan), what re-planning for the rack adds,
    and the energy."""
    by = {(b["system"], b["model"]): b for b in best}
    gb, b2, h1 = "GB200 NVL72", "B200", "H100"
    out = [f"Per GPU the GB200's BF16 GEMM ceiling (peak x measured cap) is x{chip_ceiling(gb) / chip_ceiling(b2):.3f} "
           f"the B200's and x{chip_ceiling(gb) / chip_ceiling(h1):.2f} the H100's."]
    for m in models:
        g, b, h = by[(gb, m)], by[(b2, m)], by[(h1, m)]
        x = same[m]  # the B200's best plan simulated on GB200
        where = ("a stage's data-parallel group inside one rack, across DGX nodes on B200"
                 if "dp" in x["dims_inside_one_node"] and "dp" not in b["dims_inside_one_node"] else
                 f"groups inside one node: {x['dims_inside_one_node']} on GB200, {b['dims_inside_one_node']} on B200")
        text = (f"{LABELS[m]}: GB200 NVL72 {g['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, "
                f"x{g['tokens_per_s_per_gpu'] / b['tokens_per_s_per_gpu']:.2f} B200 and "
                f"x{g['tokens_per_s_per_gpu'] / h['tokens_per_s_per_gpu']:.2f} H100. "
                f"B200's best plan ({b['best_plan']}) runs {_speedup(b['iteration_time_s'], x['iteration_time_s'])} "
                f"on GB200: compute {b['compute_s']:.2f} -> {x['compute_s']:.2f} s, exposed data-parallel "
                f"traffic {_dp(b):.2f} -> {_dp(x):.2f} s ({where})")
        if preset(m).moe:
            text += (f", exposed token exchange {b['exposed ep (token exchange)_s']:.2f} -> "
                     f"{x['exposed ep (token exchange)_s']:.2f} s")
        text += "."
        if g["candidate"] != b["candidate"]:
            mine = next(r for r in rows if r["system"] == b2 and r["model"] == m and r["candidate"] == g["candidate"])
            on_b200 = (f"{mine['iteration_time_s']:.2f} s, its layer groups over {mine['layer_group_nodes']} nodes"
                       if not math.isnan(mine["iteration_time_s"]) else mine["status"])
            text += (f" GB200's own best, {g['best_plan']} (layer groups of {g['layer_group_gpus']} GPUs in "
                     f"{g['layer_group_nodes']} rack), is {_pct(x['iteration_time_s'], g['iteration_time_s']):.1f}% "
                     f"faster still (on B200: {on_b200}).")
        else:
            text += " It is GB200's best plan too."
        wider = [r for r in rows if r["system"] == gb and r["model"] == m and r["layer_group_gpus"] > 8
                 and r["layer_group_nodes"] == 1 and r["fits"] and not math.isnan(r["iteration_time_s"])]
        if g["layer_group_gpus"] <= 8 and wider:
            w = min(wider, key=lambda r: r["iteration_time_s"])
            text += (f" Its best candidate with a wider layer group inside one rack, {w['plan']} "
                     f"({w['layer_group_gpus']} GPUs), is {_pct(w['iteration_time_s'], g['iteration_time_s']):.1f}% "
                     f"slower.")
        text += (f" Energy per token {g['energy_per_token_j']:.3f} J against B200's {b['energy_per_token_j']:.3f} J "
                 f"({_pct(g['energy_per_token_j'], b['energy_per_token_j']):+.0f}%) and H100's "
                 f"{h['energy_per_token_j']:.3f} J ({_pct(g['energy_per_token_j'], h['energy_per_token_j']):+.0f}%), "
                 f"at {g['average_power_per_gpu_w']:.0f} W per GPU against {b['average_power_per_gpu_w']:.0f} W "
                 f"(limits {g['power_limit_w']:.0f} and {b['power_limit_w']:.0f} W).")
        out.append(text)
    return out


def _simulate_all(jobs: list, workers: int, specs: dict, batch: dict):
    """The searches of ``jobs`` ((system, model) pairs), on ``workers`` forked processes
    shared by one thread per search, then the B200's best plan of each model on GB200."""
    pool = None
    if workers > 1:
        from sim.workers import process_pool

        pool = process_pool(workers, "fork")  # tied to this process (sim.workers)
        pool.submit(_noop).result()  # a fork pool starts all its workers now, before any thread runs
    try:
        if pool:
            with ThreadPoolExecutor(len(jobs)) as threads:
                results = list(threads.map(lambda j: search_one(j[0], j[1], specs[j[1]], batch[j[1]], pool), jobs))
        else:
            results = [search_one(system, m, specs[m], batch[m], None) for system, m in jobs]
        missing = [f"{r['model']} on {r['system']}" for r in results if r["best"] is None]
        if missing:
            raise RuntimeError(f"no candidate ran and fit: {', '.join(missing)}")
        by = {(r["system"], r["model"]): r for r in results}
        same, todo = {}, []
        for m in specs:
            i, gb = by[("B200", m)]["best_index"], by[("GB200 NVL72", m)]
            if i in gb["records"]:
                same[m] = gb["records"][i]
            else:
                todo.append((m, gb["plans"][i]))
        recs = (list(pool.map(_evaluate, [("GB200 NVL72", m, p) for m, p in todo])) if pool
                else [_evaluate(("GB200 NVL72", m, p)) for m, p in todo])
        for (m, plan), rec in zip(todo, recs):
            if rec["status"] != "ok":
                raise RuntimeError(f"{m}: B200's best plan on GB200: {rec['error']}")
            same[m] = (plan, rec["summary"])
    except BaseException:  # a Ctrl-C, a SIGTERM, an error: the workers go at once
        if pool:
            from sim.workers import end_pool

            end_pool(pool, kill=True)
        raise
    if pool:
        pool.shutdown()
    return results, same


def main(argv=None) -> dict:
    args = parse_args(NAME, __doc__, argv)
    start = time.monotonic()
    specs = QUICK_CANDIDATES if args.quick else CANDIDATES
    batch = QUICK_BATCH if args.quick else BATCH
    models = list(specs)
    jobs = [(system, m) for m in models for system in SYSTEMS]
    for system, m in jobs:  # built before the workers fork, so they inherit them
        _context(system, m)
    results, same_runs = _simulate_all(jobs, args.workers, specs, batch)
    rows = [row for r in results for row in r["rows"]]
    best = [result_row(r["system"], r["model"], r["best_plan"], r["best"]["summary"]) for r in results]
    for b, r in zip(best, results):
        b["key"], b["candidate"] = r["best"]["key"], r["best_index"]
        if b["system"] == "GB200 NVL72":  # what --gpus 512 on all 72 GPUs of each rack would do with it
            full = group_layout(r["best_plan"], RACK)
            b["layer_group_racks_if_72_per_rack"] = full["layer_group_nodes"]
            b["ranks_straddling_if_72_per_rack"] = full["ranks_whose_group_straddles"]
    same = {m: result_row("GB200 NVL72", m, *same_runs[m]) for m in models}
    write_csv(args.out / f"{NAME}.csv", best)
    write_csv(args.out / "candidates.csv", rows)
    draw(best, models, args.out / f"{NAME}.png")

    table = text_table(best)
    answer = answer_lines(best, same, rows, models)
    gbest = [b for b in best if b["system"] == "GB200 NVL72"]
    racks = (f"On all 72 GPUs of each rack (plain --gpus {GPUS}) the best GB200 plans would put "
             + " and ".join(f"{b['ranks_straddling_if_72_per_rack']} ({LABELS[b['model']]})" for b in gbest)
             + f" of {GPUS} GPUs in a layer group that straddles two racks")
    evaluated = ", ".join(f"{r['model']} on {r['system']} {r['counts']['evaluated']}/{r['counts']['plans']}"
                          for r in results)
    md = md_table(best, [("system", "system", ""), ("model", "model", ""), ("best_plan", "best plan", ""),
                         ("iteration_time_s", "time s", ".2f"), ("mfu_pct", "MFU %", ".1f"),
                         ("tokens_per_s_per_gpu", "tokens/s/GPU", ",.0f"), ("energy_per_token_j", "J/token", ".3f"),
                         ("average_power_per_gpu_w", "W/GPU", ".0f")])
    ratio = {b["model"]: b["tokens_per_s_per_gpu"] / next(x["tokens_per_s_per_gpu"] for x in best
                                                          if x["system"] == "B200" and x["model"] == b["model"])
             for b in best if b["system"] == "GB200 NVL72"}
    write_verdict(args, title="What an NVL72 rack buys over 8-GPU nodes", question=__doc__.split("\n\n")[0],
                  setup=f"{GPUS} GPUs of H100 (DGX), B200 (DGX) and GB200 NVL72 (64 of each rack's 72), BF16, "
                        f"{', '.join(f'{LABELS[m]} {batch[m]:,} x {preset(m).seq_length:,} tokens' for m in models)}; "
                        f"each system's best of a hand-picked candidate space by sim.studies.search (candidates "
                        f"evaluated: {evaluated})",
                  answer=" ".join(answer), figures=[f"{NAME}.png"], body=md,
                  caveats=("GPU boards only (no CPUs, NICs, switches, cooling). The GB200's efficiencies are the "
                           "B200's fit (no GB200 training run is in the fit data): under GEMMs it draws its 1,200 W "
                           "limit for a GEMM ceiling a few percent above the B200's at 1,000 W, which sets the energy "
                           "comparison. Its NVLS efficiency on 72 GPUs is fitted on 8, its NCCL channel counts are "
                           f"Hopper's. The job leaves 8 GPUs of each rack idle and uncounted. {racks}. MFU counts a "
                           "mixture of experts' active parameters."),
                  headline=" ".join(f"{LABELS[m]}: GB200 NVL72 x{v:.2f} B200 per GPU." for m, v in ratio.items()))
    results_json = {"best": best, "candidates": rows, "same_plan_on_gb200": same,
                    "counts": {f"{r['model']} on {r['system']}": r["counts"] for r in results},
                    "gpus": GPUS, "batch": {m: batch[m] for m in models},
                    "chip_ceiling_flops": {s: chip_ceiling(s) for s in SYSTEMS}, "answer": answer}
    write_json(args.out / "results.json", results_json)
    print(table)
    print()
    print("\n".join(answer))
    print(racks + ".")
    print(f"nvl72: {time.monotonic() - start:.0f} s", file=sys.stderr)
    return results_json


if __name__ == "__main__":
    main()
