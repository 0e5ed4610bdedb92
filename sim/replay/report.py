"""What a replay reports: the replayed step against the traced one, time per rank, and the
critical path by category.

The critical path is walked back from the span that ended last: at each span, the
predecessor is whichever of its lane's previous span, its dependencies and (for
communication) its partners' predecessors ended last; the span is charged the time from
that predecessor's end to its own end. The charges add up to the replayed step.
Categories: ``gemm``, ``attention``, ``memory``, ``kernel`` (other kernels), ``host``
(CPU time between CUDA calls: a launch-bound step), ``earlier step`` (work carried over
on a stream), and communication by op (``allreduce``, ``p2p``, ..., ``comm (measured)``
for communication replayed at its measured duration).
"""

from __future__ import annotations

from sim.replay.program import Replayed


def _union(intervals) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _exposed(comm, comp) -> float:
    """Time of ``comm``'s union not covered by ``comp``'s union."""
    both = _union(comm + comp)
    return both - _union(comp)


def _by_rank(trace) -> dict:
    out: dict = {}
    for s in trace.spans:
        out.setdefault(s.rank, []).append(s)
    return out


def rank_times(trace, rank: int, spans=None) -> dict:
    spans = [s for s in (trace.spans_of(rank) if spans is None else spans) if s.stream.startswith("stream")]
    comp = [(s.start_s, s.end_s) for s in spans if s.kind == "compute" and s.end_s > s.start_s]
    comm = [(s.busy_start_s if s.busy_start_s is not None else s.start_s, s.end_s) for s in spans
            if s.kind != "compute" and s.end_s > s.start_s]
    gpu = _union(comp + comm)
    return {"kernel_s": _union(comp), "comm_s": _union(comm), "exposed_comm_s": _exposed(comm, comp),
            "gpu_idle_s": max(0.0, trace.end_s - gpu)}


def _category(span, node) -> str:
    if node is None:
        return "other"
    if node.kind == "compute":
        return {"cpu": "host", "carry": "earlier step"}.get(node.category, node.category)
    if span.kind == "comm":
        return "comm (measured)"
    if node.kind in ("send", "recv"):
        return "p2p"
    return node.op


def critical_path(trace, replayed: Replayed, per_rank=None) -> dict:
    """Seconds of the replayed step charged to each category, and the longest items."""
    if not trace.spans:
        return {"by_category_s": {}, "top": []}
    by_name = {}
    lane_prev = {}
    for r, spans in sorted((per_rank or _by_rank(trace)).items()):
        last = {}
        for s in spans:  # (the trace's order: by stream, then start)
            by_name[(r, s.name)] = s
            lane_prev[(r, s.name)] = last.get(s.stream)
            last[s.stream] = s
    acts = {r: {a.name: a for a in acts} for r, acts in replayed.program.actions.items()}
    # partners: the k-th collective on a group, the n-th send a->b with the n-th recv
    partner_key = {}
    members: dict = {}
    count: dict = {}
    for r, lst in replayed.program.actions.items():
        for a in lst:
            if a.kind == "collective":
                key = ("c", a.group, count.setdefault(("c", a.group, r), [0])[0])
                count[("c", a.group, r)][0] += 1
            elif a.kind in ("send", "recv"):
                pair = (r, a.peer) if a.kind == "send" else (a.peer, r)
                c = count.setdefault(("p", pair, a.kind), [0])
                key = ("p", pair, c[0])
                c[0] += 1
            else:
                continue
            partner_key[(r, a.name)] = key
            members.setdefault(key, []).append((r, a.name))

    def preds(r, name):
        out = []
        p = lane_prev.get((r, name))
        if p is not None:
            out.append((r, p.name))
        a = acts[r].get(name)
        if a is not None:
            out += [(r, d) if isinstance(d, str) else d for d in a.deps]
        return out

    end_span = max(trace.spans, key=lambda s: (s.end_s, -s.rank, s.name))
    cur = (end_span.rank, end_span.name)
    charged: dict[str, float] = {}
    items: dict[tuple, float] = {}
    seen = set()
    while cur is not None and cur not in seen:
        seen.add(cur)
        span = by_name[cur]
        cand = preds(*cur)
        key = partner_key.get(cur)
        if key is not None:
            for m in members.get(key, []):
                if m != cur:
                    cand += preds(*m)
        best = None
        for c in cand:
            s = by_name.get(c)
            if s is not None and s.end_s <= span.end_s and (best is None or s.end_s > by_name[best].end_s):
                best = c
        start = by_name[best].end_s if best is not None else 0.0
        node = replayed.nodes.get(cur[0], {}).get(cur[1])
        cat = _category(span, node)
        dt = max(0.0, span.end_s - start)
        charged[cat] = charged.get(cat, 0.0) + dt
        label = (cat, node.name if node is not None else span.name)
        items[label] = items.get(label, 0.0) + dt
        cur = best
    top = sorted(items.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    return {"by_category_s": dict(sorted(charged.items(), key=lambda kv: (-kv[1], kv[0]))),
            "top": [{"category": c, "name": n, "seconds": v} for (c, n), v in top]}


def summarize_replay(trace, replayed: Replayed, graphs, profile, topology) -> dict:
    T = trace.end_s
    traced = max((g.traced_step_s or 0.0) for g in graphs)
    per_rank = _by_rank(trace)
    last = max(per_rank, key=lambda r: (max(s.end_s for s in per_rank[r]), -r))
    unpriced = sum(int(g.meta.get("unpriced_comm", 0)) for g in graphs)
    return {
        "iteration_time_s": T,
        "traced_step_s": traced,
        "error_vs_traced": (T - traced) / traced if traced > 0 else None,
        "step": graphs[0].meta.get("step"),
        "world_size": len(replayed.program.actions),
        "traced_ranks": sorted(g.rank for g in graphs),
        "cloned_ranks": len(replayed.cloned),
        "gpu": profile.name,
        "topology": topology.describe(),
        "kernels": sum(1 for n in graphs[0].nodes if n.lane.startswith("stream")),
        "comm_measured": unpriced,
        "comm_unmatched": replayed.unmatched,
        "critical_rank": last,
        "rank_times": rank_times(trace, last, per_rank[last]),
        "critical_path": critical_path(trace, replayed, per_rank),
    }
