"""A recorded campaign as plain data for pictures: spans in a window, and progress over time.

``simulate_campaign(..., record=True)`` keeps each activity of the job (training phases
with their checkpoint cycle, detection, waits, restarts, planned saves) and each counted
interruption. These helpers unfold them:

- ``window_spans``: (kind, cause, start, end) inside a time window, a training phase cut
  into ``train``, ``checkpoint`` and ``lost`` (training whose work a failure rolled back);
- ``progress_points``: (time, useful work so far) at every phase boundary, a rollback
  showing as a drop;
- ``busiest_window``: where a window of a given length holds the most interruptions.
"""

from __future__ import annotations

import bisect


def window_spans(camp, lo_s: float, hi_s: float) -> list[tuple[str, str, float, float]]:
    """The campaign's spans that meet [lo_s, hi_s], clipped to it."""
    out = []
    for kind, cause, start, end, extra in camp.activities:
        if end <= lo_s or start >= hi_s:
            continue
        if kind != "train":
            out.append((kind, cause, max(start, lo_s), min(end, hi_s)))
            continue
        cycle, cut = extra
        for piece, a, b in cycle.spans(start, end, lo_s, hi_s):
            if cut is not None and piece == "train" and b > cut:
                if a < cut:
                    out.append(("train", "", a, cut))
                out.append(("lost", "", max(a, cut), b))
            else:
                out.append((piece, "", a, b))
    return out


def progress_points(camp) -> list[tuple[float, float]]:
    """(time, useful work done so far) at the start and end of every training phase, and
    after each rollback."""
    pts = [(0.0, 0.0)]
    work = 0.0
    for kind, _, start, end, extra in camp.activities:
        if kind != "train":
            continue
        cycle, cut = extra
        st = cycle.state_at(end - start)
        pts.append((start, work))
        pts.append((end, work + st.work_s))
        if cut is not None:
            work += st.durable_work_s
            pts.append((end, work))
        else:
            work += st.work_s
    pts.append((camp.horizon_s, work))
    return pts


def busiest_window(times: list[float], length_s: float, horizon_s: float) -> float:
    """The start of the window of ``length_s`` (within the horizon) that holds the most of
    ``times``, starting a little before the first of them; 0 when there are none."""
    times = sorted(times)
    if not times or length_s >= horizon_s:
        return 0.0
    best, start = -1, 0.0
    for i, t in enumerate(times):
        n = bisect.bisect_right(times, t + 0.9 * length_s) - i
        if n > best:
            best, start = n, t
    return min(max(0.0, start - 0.05 * length_s), horizon_s - length_s)
