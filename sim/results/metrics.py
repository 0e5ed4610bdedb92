"""What an iteration's trace means: time, throughput, MFU, bubble and exposed communication.

Figures follow the definitions users already know:

- **MFU / HFU** (Korthikanti et al. 2022): model FLOPs per iteration (Eq. 7, forward and
  backward without recomputation) over iteration time × GPUs × peak; HFU counts the
  recomputed work too.
- **Time breakdown per rank** as Holistic Trace Analysis reports it on real traces:
  every instant is *compute* when the compute stream runs a kernel; otherwise *exposed
  communication* of the kinds (tp, pp, dp, ...) moving data at that instant (shared
  equally when several are); otherwise *idle*. Kinds: ``tp``, ``pp``, ``dp`` (gradient
  all-reduce or ZeRO's reduce-scatter), ``zero`` (ZeRO's parameter all-gathers),
  ``offload`` (ZeRO-Offload's PCIe copies; listed only when there are any), ``launch``
  (the GPU waiting for the host to launch kernels after a synchronisation,
  ``sim.program.launch``; listed only when there are any) and ``other``. A send, receive or collective counts only
  while data moves, not while it waits for its peers. *Overlap* is the share of a rank's
  communication time that runs under compute.
- **Critical rank**: the rank whose work ends last (ties: most compute, then lowest
  rank); its breakdown adds up to the iteration time.
- **Pipeline bubble**: the critical rank's idle time before its last pipeline compute
  (F/B/I/W), as a fraction of the iteration. With free communication and equal stages
  this is (p−1)/(m+p−1) for GPipe and 1F1B (Huang et al. 2019; Narayanan et al. 2021).
"""

from __future__ import annotations

from sim.program.api import LAUNCH_CATEGORY
from sim.results.trace import Trace

PIPELINE = ("F", "B", "I", "W")
COMM_KINDS = ("tp", "pp", "dp", "zero")
OPTIONAL_KINDS = ("offload", "ep", "cp", "amax", LAUNCH_CATEGORY)


def rank_breakdown(trace: Trace, rank: int) -> dict:
    """Seconds of compute, exposed communication by kind, overlap and idle on one rank."""
    spans = trace.spans_of(rank)
    comp = [(s.start_s, s.end_s) for s in spans
            if s.kind == "compute" and s.end_s > s.start_s and s.category != LAUNCH_CATEGORY]
    comm = [(s.busy_start_s if s.busy_start_s is not None else s.start_s, s.end_s,
             s.category if s.category in COMM_KINDS + OPTIONAL_KINDS else "other")
            for s in spans if (s.kind != "compute" or s.category == LAUNCH_CATEGORY) and s.end_s > s.start_s]
    pipe_end = max((s.end_s for s in spans if s.kind == "compute" and s.category in PIPELINE), default=0.0)
    end = trace.end_s
    events: list[tuple[float, int, int, str]] = []  # (time, +1/-1, is_compute, kind)
    for a, b in comp:
        events += [(a, 1, 1, ""), (b, -1, 1, "")]
    for a, b, k in comm:
        if b > a:
            events += [(a, 1, 0, k), (b, -1, 0, k)]
    events.append((end, 0, 0, ""))
    events.sort(key=lambda e: (e[0], e[1]))
    out = {"compute_s": 0.0, "idle_s": 0.0, "bubble_s": 0.0, "comm_s": 0.0, "overlap_s": 0.0,
           "exposed_comm_s": {k: 0.0 for k in COMM_KINDS + OPTIONAL_KINDS + ("other",)}}
    n_comp, active = 0, {}
    t = 0.0
    for time, delta, is_comp, kind in events:
        if time > t:
            dt = time - t
            kinds = [k for k, c in active.items() if c > 0]
            moving = any(k != LAUNCH_CATEGORY for k in kinds)  # (the host launching is not communication)
            if moving:
                out["comm_s"] += dt
            if n_comp > 0:
                out["compute_s"] += dt
                if moving:
                    out["overlap_s"] += dt
            elif kinds:
                for k in kinds:
                    out["exposed_comm_s"][k] += dt / len(kinds)
            else:
                out["idle_s"] += dt
                out["bubble_s"] += max(0.0, min(time, pipe_end) - t)
            t = time
        if is_comp:
            n_comp += delta
        elif delta:
            active[kind] = active.get(kind, 0) + delta
    seen = {k for _, _, k in comm}
    for k in OPTIONAL_KINDS:
        if k not in seen:
            del out["exposed_comm_s"][k]
    if out["exposed_comm_s"]["other"] == 0.0:
        del out["exposed_comm_s"]["other"]
    return out


def critical_rank(trace: Trace) -> int:
    """The rank whose last action ends last (ties: most compute, then lowest rank)."""
    last: dict[int, float] = {}
    busy: dict[int, float] = {}
    for s in trace.spans:
        last[s.rank] = max(last.get(s.rank, 0.0), s.end_s)
        if s.kind == "compute" and s.category != LAUNCH_CATEGORY:
            busy[s.rank] = busy.get(s.rank, 0.0) + s.duration_s
    return min(last, key=lambda r: (-round(last[r], 15), -round(busy.get(r, 0.0), 15), r))


def iteration_metrics(trace: Trace, *, tokens: float, model_flops: float, hardware_flops: float,
                      gpus: int, peak_flops: float) -> dict:
    """The headline figures of one iteration (SI units; fractions in 0..1)."""
    T = trace.end_s
    r = critical_rank(trace)
    br = rank_breakdown(trace, r)
    return {
        "iteration_time_s": T,
        "tokens_per_s": tokens / T if T > 0 else 0.0,
        "tflops_per_gpu": model_flops / T / gpus / 1e12 if T > 0 else 0.0,
        "hardware_tflops_per_gpu": hardware_flops / T / gpus / 1e12 if T > 0 else 0.0,
        "mfu": model_flops / (T * gpus * peak_flops) if T > 0 else 0.0,
        "hfu": hardware_flops / (T * gpus * peak_flops) if T > 0 else 0.0,
        "bubble_fraction": br["bubble_s"] / T if T > 0 else 0.0,
        "exposed_comm_s": br["exposed_comm_s"],
        "compute_s": br["compute_s"],
        "idle_s": br["idle_s"],
        "idle_fraction": br["idle_s"] / T if T > 0 else 0.0,
        "comm_overlap_fraction": br["overlap_s"] / br["comm_s"] if br["comm_s"] > 0 else 0.0,
        "critical_rank": r,
    }
