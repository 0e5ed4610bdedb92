"""Explaining a search's result: the best plan against the runner-up, part by part
(``sim.studies.search`` finds them)."""

from __future__ import annotations

from sim.units import format_bytes, format_time


def describe_plan(plan: dict) -> str:
    """``dp 4 x tp 2 x pp 2 (vpp 2), interleaved, mb 2, ZeRO-1, recompute none, sp, fp8 hybrid``
    (``split 4,3,3`` after the schedule for a plan with a given layer split);
    for a mixture of experts also ``ep 8 (etp 1), flex``: the expert-parallel size, the expert
    tensor-parallel size when it is not tp, and the token dispatcher."""
    s = f"dp {plan['dp']} x tp {plan['tp']} x pp {plan['pp']}"
    if plan["vpp"] > 1:
        s += f" (vpp {plan['vpp']})"
    if plan["pp"] > 1:
        s += f", {plan['schedule']}"
    if isinstance(plan.get("layer_split"), (list, tuple)):  # uneven: the layers of each (virtual) stage
        s += f", split {','.join(map(str, plan['layer_split']))}"
    s += f", mb {plan['micro_batch_size']}, ZeRO-{plan['zero_stage']}, recompute {plan['recompute']}"
    if plan["sequence_parallel"] and plan["tp"] > 1:
        s += ", sp"
    if plan.get("fp8_format"):
        s += f", fp8 {plan['fp8_format']}"
    if plan.get("cp", 1) > 1:
        s += f", cp {plan['cp']} ({plan.get('cp_comm_type', 'p2p')})"
    if plan.get("ep", 1) > 1:
        s += f", ep {plan['ep']}" + (f" (etp {plan['etp']})" if plan.get("etp") is not None else "")
        s += f", {plan.get('dispatcher', 'alltoall')}"
    return s


def time_parts(summary: dict) -> dict:
    """The critical rank's time by part (seconds): compute, exposed comm by kind, idle."""
    parts = {"compute": summary["compute_s"]}
    parts.update({f"exposed {k}": v for k, v in summary["exposed_comm_s"].items()})
    parts["idle (bubble, waiting)"] = summary["idle_s"]
    return parts


def _row(name: str, best: str, runner_up: str, difference: str) -> str:
    """One line of the side-by-side table: the name, then the three cells right-aligned,
    each after at least one space (so a wide or negative value never runs into the next)."""
    return f"{name:<23} {best:>11} {runner_up:>11} {difference:>12}"


def explain(best: dict, runner_up: dict | None) -> list[str]:
    """Lines saying why ``best`` beats ``runner_up`` (records with ``summary``): the time
    parts and memory parts side by side and the parts that make the difference."""
    b = best["summary"]
    if runner_up is None:
        return [f"only one plan ran: {describe_plan(b['plan'])}"]
    r = runner_up["summary"]
    tb, tr = b["iteration_time_s"], r["iteration_time_s"]
    lines = [f"best      {describe_plan(b['plan'])}",
             f"runner-up {describe_plan(r['plan'])}",
             _row("", "best", "runner-up", "difference"),
             _row("iteration time", format_time(tb), format_time(tr), format_time(tr - tb))]
    pb, pr = time_parts(b), time_parts(r)
    for k in sorted(set(pb) | set(pr), key=lambda k: list({**pb, **pr}).index(k)):
        x, y = pb.get(k, 0.0), pr.get(k, 0.0)
        if x or y:
            lines.append(_row(f"  {k}", format_time(x), format_time(y), format_time(y - x)))
    mb, mr = b["memory"], r["memory"]
    parts = [k for k, v in mb.items() if k.endswith("_bytes") and k != "peak_bytes" and isinstance(v, (int, float))
             and k in mr and not k.startswith(("analytic", "breakdown"))]
    for k in parts + ["peak_bytes"]:
        name = "peak memory" if k == "peak_bytes" else "  " + k.removesuffix("_bytes")
        lines.append(_row(name, format_bytes(mb[k]), format_bytes(mr[k]), format_bytes(mr[k] - mb[k])))
    gain = {k: pr.get(k, 0.0) - pb.get(k, 0.0) for k in set(pb) | set(pr)}
    why = [f"{format_time(v)} less {k}" for k, v in sorted(gain.items(), key=lambda kv: (-kv[1], kv[0])) if v > 0][:2]
    cost = [f"{format_time(-v)} more {k}" for k, v in sorted(gain.items(), key=lambda kv: (kv[1], kv[0])) if v < 0][:1]
    pct = (tr - tb) / tr * 100 if tr else 0.0
    verdict = f"why: the best is {format_time(tr - tb)} ({pct:.1f}%) faster per iteration"
    if why:
        verdict += ": " + ", ".join(why)
    if cost:
        verdict += "; it pays " + cost[0]
    dm = mb["peak_bytes"] - mr["peak_bytes"]
    verdict += f"; it needs {format_bytes(abs(dm))} {'more' if dm > 0 else 'less'} memory per GPU"
    lines.append(verdict)
    return lines
