"""What a deadlocked run reports: per blocked rank, the action each of its stuck streams
waits on and what that action waits for (a dependency, a collective's missing members, a
send's or receive's missing partner)."""

from __future__ import annotations


def explain_deadlock(engine, unfinished: list[int]) -> dict[int, str]:
    """``unfinished``: the engine's streams (indices into ``engine._streams``) whose last
    action never finished. Returns rank -> one line naming each stuck action and why."""
    e = engine  # (the engine's run state, read after the loop stopped)
    out: dict[int, list[str]] = {}
    resolve = e.program.resolve
    for sid in unfinished:
        rank, stream = e._streams[sid]
        i = next(j for j in e._members[sid] if e._end[j] < 0)
        a = e._acts[i]
        if e._pending[i] > 0:
            pending = [f"{r}:{n}" for r, n in (resolve(rank, d) for d in a.deps)
                       if e._end[e._ids[(r, n)]] < 0]
            why = f"waits for {', '.join(pending)}"
        elif a.kind == "collective":
            rv = e._coll.waiting(e._key_of[i])
            missing = [g for g in a.group if (rv is None or g not in rv.posted) and g not in e.program.shadows]
            why = f"{a.op} over ranks {list(a.group)} waits for ranks {missing} to join"
        elif e._barrier_of[i] is not None:
            here = {e._rank_of[j] for j in e._barrier_of[i][1]}
            missing = [g for g in a.group if g not in here and g not in e.program.shadows]
            why = f"{a.op or 'comm'} over ranks {list(a.group)} waits for ranks {missing} to reach it"
        elif a.kind == "send":
            why = f"waits for rank {a.peer} to post the matching recv"
        elif a.kind == "recv":
            why = f"waits for rank {a.peer} to post the matching send"
        else:
            why = "did not finish"
        out.setdefault(rank, []).append(f"{a.kind} {a.name!r} on stream {stream} {why}")
    return {r: " | ".join(v) for r, v in sorted(out.items())}

