"""Who set the pace, and what the stragglers cost: the report of a run with slow GPUs or
degraded links (``sim.inputs.stragglers``), against the same iteration without them.

**Waiting.** A collective starts moving data when its last member arrives, and a
point-to-point transfer when the second of its send and receive does; every span records
when its action was posted (``start_s``) and when data started to move
(``busy_start_s``). The time in between is the rank's *wait*, and it is put down to the
member (or members, shared equally) that arrived last: the rank that *set the pace* of
that collective or transfer. Tensor-parallel collectives priced outside the network
(``comm`` actions) start on all members together; there a member's wait runs from when
it was ready (see ``waits``). Summed over an iteration, ``others_waited_s`` of a rank is
how long the others waited for it; ``waited_s`` how long it waited for others.

**Cost.** The ideal is the same plan simulated again on the same cluster with no slow
GPU and no degraded link, at the same (full) fidelity: ``cost_s`` is the difference of
the two iteration times. The ranks that set the pace are those whom the others waited on
longer than in the ideal, the longest first (a pipeline's stages wait on one another even
when every GPU is equal; that part is not the stragglers' doing).
"""

from __future__ import annotations

from itertools import groupby
from operator import attrgetter

PACE_SETTERS = 8
"""Ranks listed as setting the pace (the JSON lists every slow GPU besides)."""
WAITERS = 4
"""Ranks listed as waiting on each of them."""


def waits(trace, program) -> tuple[dict[int, float], dict[int, float], dict[int, dict[int, float]]]:
    """Per rank, seconds spent waiting for others (``waited``) and seconds others spent
    waiting for it (``waited_on``), and for each rank that was waited on, how long each
    other rank waited for it (``by``: setter -> waiter -> seconds; only waits > 0).

    A collective's or a transfer's members arrive when their spans start and meet when
    data starts to move (``busy_start_s``). A ``comm`` action shared by a group (tensor-
    parallel collectives priced outside the network) starts on every member at once, when
    the last is ready; a member is ready when the action before it on its stream and the
    actions it depends on on its own rank have ended."""
    meetings: dict[tuple, list[tuple[int, float, float]]] = {}  # key -> (rank, arrived, met)
    for r, spans in groupby(trace.spans, key=attrgetter("rank")):
        spans = list(spans)
        mine = {a.name: a for a in program.actions.get(r, ()) if a.kind in ("collective", "comm")}
        end_of = {sp.name: sp.end_s for sp in spans} if any(sp.kind == "comm" for sp in spans) else {}
        prev_stream, prev_end = None, 0.0
        for sp in spans:
            kind = sp.kind
            before = prev_end if sp.stream == prev_stream else 0.0
            prev_stream, prev_end = sp.stream, sp.end_s
            if kind == "collective":
                key = ("c", tuple(sorted(mine[sp.name].group)), sp.name, sp.busy_start_s)
                meetings.setdefault(key, []).append((r, sp.start_s, sp.busy_start_s))
            elif (kind == "send" or kind == "recv") and sp.link_id is not None:
                meetings.setdefault(("p", sp.link_id), []).append((r, sp.start_s, sp.busy_start_s))
            elif kind == "comm" and sp.name in mine and len(mine[sp.name].group) > 1:
                a = mine[sp.name]
                ready = max([before, *(end_of.get(d, 0.0) for d in a.deps if d.__class__ is str)])
                meetings.setdefault(("b", tuple(sorted(a.group)), sp.name), []).append((r, ready, sp.start_s))
    waited: dict[int, float] = {}
    waited_on: dict[int, float] = {}
    by: dict[int, dict[int, float]] = {}
    for members in meetings.values():
        last = max(arrived for _, arrived, _ in members)
        setters = sorted({r for r, arrived, _ in members if arrived == last})
        for r, arrived, met in members:
            w = met - arrived
            if w <= 0 or r in setters:
                continue
            waited[r] = waited.get(r, 0.0) + w
            share = w / len(setters)
            for s in setters:
                waited_on[s] = waited_on.get(s, 0.0) + share
                theirs = by.setdefault(s, {})
                theirs[r] = theirs.get(r, 0.0) + share
    return waited, waited_on, by


def gpu_compute_s(trace) -> dict[int, float]:
    """Per rank, seconds of compute on its GPU streams (host work on ``cpu`` left out)."""
    out: dict[int, float] = {}
    for s in trace.spans:
        if s.kind == "compute" and s.stream != "cpu":
            out[s.rank] = out.get(s.rank, 0.0) + s.end_s - s.start_s
    return out


def straggler_report(run, ideal) -> dict:
    """The ``stragglers`` part of the summary of ``run`` (a ``sim.session.TrainingRun`` with
    stragglers), against ``ideal`` (the same plan without them)."""
    st, topo = run.stragglers, run.topology
    T, T0 = run.trace.end_s, ideal.trace.end_s
    waited, on, by = waits(run.trace, run.program)
    waited0, on0, _ = waits(ideal.trace, ideal.program)
    comp, comp0 = gpu_compute_s(run.trace), gpu_compute_s(ideal.trace)
    most_on: dict[int, tuple[float, int]] = {}  # waiter -> (seconds, the rank it waited on longest)
    for setter, mine in sorted(by.items()):
        for w, sec in mine.items():
            if sec > most_on.get(w, (0.0, -1))[0]:
                most_on[w] = (sec, setter)

    def rank_entry(r: int) -> dict:
        waiters = sorted(by.get(r, {}).items(), key=lambda kv: (-kv[1], kv[0]))[:WAITERS]
        return {"rank": r, "device": topo.gpu(r), "factor": st.slow.get(r, 1.0), "drawn": r in st.drawn,
                "others_waited_s": on.get(r, 0.0), "ideal_others_waited_s": on0.get(r, 0.0),
                "waited_s": waited.get(r, 0.0), "ideal_waited_s": waited0.get(r, 0.0),
                "compute_s": comp.get(r, 0.0), "ideal_compute_s": comp0.get(r, 0.0),
                "waiters": [{"rank": w, "waited_s": s} for w, s in waiters],
                "waited_most_on": most_on[r][1] if r in most_on else None}

    extra = {r: on.get(r, 0.0) - on0.get(r, 0.0) for r in on}
    pace = sorted((r for r, x in extra.items() if x > 1e-12 * max(T, 1e-30)), key=lambda r: (-extra[r], r))
    carried = run.trace.link_bytes
    return {
        "compared_with": "the same plan without slow GPUs or degraded links, every GPU simulated",
        "ideal_iteration_time_s": T0,
        "iteration_time_s": T,
        "cost_s": T - T0,
        "cost_fraction": (T - T0) / T0 if T0 > 0 else 0.0,
        "ideal_tokens_per_s": run.plan.global_batch_size * run.model.seq_length / T0 if T0 > 0 else 0.0,
        "slow_gpus": [rank_entry(r) for r in st.slow],
        "drawn": st.draw,
        "degraded_links": [{"link": f"{a}-{b}", "factor": f, "bandwidth_Bps": topo.link(a, b)["bandwidth_Bps"],
                            "bytes_carried": carried.get((a, b), 0.0) + carried.get((b, a), 0.0)}
                           for (a, b), f in st.links.items()],
        "pace_setters": [rank_entry(r) for r in pace[:PACE_SETTERS]],
    }


def straggler_lines(report: dict) -> list[str]:
    """The report as the text ``trainsim run`` prints."""
    from sim.units import format_bytes, format_time

    slow, links = report["slow_gpus"], report["degraded_links"]
    T, T0 = report["iteration_time_s"], report["ideal_iteration_time_s"]
    sign = "+" if report["cost_s"] >= 0 else "-"
    out = ["  stragglers (against the same iteration without them, every GPU simulated):"]
    what = []
    if slow:
        shown = ", ".join(f"{e['device']} x{e['factor']:.3g}" for e in slow[:4])
        what.append(f"{len(slow)} slow GPU{'s' * (len(slow) > 1)} ({shown}{', ...' if len(slow) > 4 else ''})")
    if links:
        shown = ", ".join(f"{e['link']} x{e['factor']:.3g}" for e in links[:3])
        what.append(f"{len(links)} degraded link{'s' * (len(links) > 1)} ({shown}{', ...' if len(links) > 3 else ''})")
    if report["drawn"]:
        d = report["drawn"]
        what.append(f"{d['gpus']} drawn: fraction {d['fraction']:g}, slowdown {d['slowdown']}, seed {d['seed']}")
    out.append("    " + "; ".join(what))
    out.append(f"    iteration time {format_time(T)}, ideal {format_time(T0)}: {sign}{format_time(abs(T - T0))} "
               f"({report['cost_fraction'] * 100:+.1f}%)")
    for e in links[:3]:
        out.append(f"    link {e['link']}: {e['factor'] * 100:.0f}% of its bandwidth "
                   f"({e['bandwidth_Bps'] / 1e9:.3g} GB/s each way), carried {format_bytes(e['bytes_carried'])}")
    if report["pace_setters"]:
        out.append("    ranks that set the pace (others waited on them, beyond the ideal):")
        for e in report["pace_setters"]:
            slow_txt = f", slow x{e['factor']:.3g}" if e["factor"] != 1.0 else ""
            who = ", ".join(str(w["rank"]) for w in e["waiters"])
            more = e["others_waited_s"] - e["ideal_others_waited_s"]
            itself = e["waited_s"] - e["ideal_waited_s"]
            chain = (f"; it waited {format_time(itself)} more itself, most on rank {e['waited_most_on']}"
                     if itself > 0 and e["waited_most_on"] is not None else "")
            out.append(f"      rank {e['rank']} ({e['device']}{slow_txt}): others waited {format_time(more)} more"
                       f" in total (most: rank{'s' * (len(e['waiters']) > 1)} {who}){chain}")
    else:
        out.append("    no rank kept the others waiting longer than in the ideal")
    return out


def plotted_stragglers(run, summary: dict, ranks: list[int], names: dict[int, str],
                       most: int = 4) -> tuple[list[int], dict[int, str]]:
    """The timeline's ranks with the ranks that set the pace and the slow GPUs added (up to
    ``most`` more), so that the picture shows who waits on whom."""
    report = summary.get("stragglers")
    if not report:
        return ranks, names
    ranks, names = list(ranks), dict(names)
    wanted = [e["rank"] for e in report["pace_setters"]] + [e["rank"] for e in report["slow_gpus"]]
    added = 0
    for r in dict.fromkeys(wanted):
        if r in names or added >= most:
            continue
        d, p, t = run.plan.coords(r)
        names[r] = f"stage {p}, dp {d}, tp {t} (rank {r})"
        ranks.append(r)
        added += 1
    for r in ranks:
        f = run.stragglers.slow.get(r) if run.stragglers else None
        if f and "slow x" not in names[r]:
            names[r] += f" slow x{f:.3g}"
    return ranks, names
