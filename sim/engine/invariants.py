"""Invariants every simulation must satisfy, checked in debug mode and in the tests.

Debug mode is on when the environment variable ``TRAINSIM_DEBUG`` is set to anything
but ``""`` or ``"0"`` (the test suite sets it for every test), or when ``simulate`` is
called with ``check_invariants=True``. It makes a simulation slower (by about a
quarter): the checks below are linear in the size of the trace, and the network's run
at each re-allocation.

Checked after the run, from the program and its trace (``check``):

- **every action ran exactly once**, with finite times and ``start <= end``;
- **a stream never runs two actions at once**: the spans of one (rank, stream) do not
  overlap, and they ran in program order;
- **dependencies are honoured**: no action started before each of its dependencies
  ended;
- **every byte sent is received**: each send has exactly one matching receive of the
  same size that ended no earlier than the send began, and every network transfer took
  at least its bytes over its route's bottleneck bandwidth;
- **memory never goes negative** in any category on any rank, and at the end of the
  iteration every category is back to what the ``resident memory`` action put there
  (parameters, gradients, optimizer states, reserve; zero for activations, gathered
  parameters and gradient buckets, except buffers allocated up front: DeepSpeed's
  contiguous-gradient bucket buffers, resident in ``buckets``).

Checked while the engine runs (``sim.engine.core`` and ``sim.engine.network`` call ``violation``):

- **simulated time never goes backwards** from one processed event to the next;
- **no link carries more than its capacity**: after every re-allocation the rates of the
  flows on each link sum to at most its usable bandwidth;
- **a flow delivers exactly its bytes**: when it finishes, what its rate history moved
  equals its size.

A violation raises ``InvariantError`` naming what broke, where and when. It is a bug in
trainsim, never the user's input, so it is not an ``InputError``.
"""

from __future__ import annotations

import math
import os

REL_TOL = 1e-9
"""Relative slack for floating-point sums (times, rates, bytes)."""

RESIDENT_ACTION = "resident memory"
"""The action the passes use to allocate the resident model states (``sim.program.zero``)."""


class InvariantError(AssertionError):
    """An invariant of the simulation was broken: a bug in trainsim, not in the input."""


def enabled() -> bool:
    """Whether debug mode is on (environment variable ``TRAINSIM_DEBUG``)."""
    return os.environ.get("TRAINSIM_DEBUG", "") not in ("", "0")


def violation(what: str) -> None:
    raise InvariantError(f"invariant broken: {what}")


def _close(a: float, b: float, scale: float) -> bool:
    return abs(a - b) <= REL_TOL * max(abs(scale), 1.0)


def check(program, trace, network=None) -> None:
    """Check the post-run invariants of ``trace`` (the result of running ``program``);
    with the engine's ``network``, also that no transfer beat its route's bottleneck.
    Raises ``InvariantError`` on the first violation."""
    spans = {}
    for s in trace.spans:
        if not (math.isfinite(s.start_s) and math.isfinite(s.end_s)) or s.end_s < s.start_s or s.start_s < 0:
            violation(f"span {s.name!r} on rank {s.rank} has times {s.start_s!r}..{s.end_s!r}")
        if s.busy_start_s is not None and not (s.start_s <= s.busy_start_s <= s.end_s):
            violation(f"span {s.name!r} on rank {s.rank} began moving data at {s.busy_start_s!r}, outside "
                      f"{s.start_s!r}..{s.end_s!r}")
        key = (s.rank, s.name)
        if key in spans:
            violation(f"action {s.name!r} on rank {s.rank} ran twice")
        spans[key] = s
    horizon = trace.end_s
    _check_actions(program, spans, horizon)
    _check_p2p(program, spans, horizon)
    _check_memory(program, trace)
    if network is not None:
        _check_transfers(trace, network)


def _check_actions(program, spans, horizon: float) -> None:
    resolve = program.resolve
    for r, acts in program.actions.items():
        last: dict[str, object] = {}
        for a in acts:
            s = spans.get((r, a.name))
            if s is None:
                violation(f"action {a.name!r} on rank {r} never ran")
            if s.stream != a.stream:
                violation(f"action {a.name!r} on rank {r} ran on stream {s.stream!r}, not {a.stream!r}")
            prev = last.get(a.stream)
            if prev is not None and s.start_s < prev.end_s - REL_TOL * max(horizon, 1.0):
                violation(f"stream {a.stream!r} on rank {r} ran {a.name!r} from {s.start_s!r} while "
                          f"{prev.name!r} was still running (until {prev.end_s!r})")
            last[a.stream] = s
            for d in a.deps:
                ref = resolve(r, d)
                ds = spans.get(ref)
                if ds is None:
                    violation(f"dependency {ref[0]}:{ref[1]} of {a.name!r} on rank {r} never ran")
                if s.start_s < ds.end_s - REL_TOL * max(horizon, 1.0):
                    violation(f"action {a.name!r} on rank {r} started at {s.start_s!r}, before its dependency "
                              f"{ref[0]}:{ref[1]} ended at {ds.end_s!r}")
    ran = sum(len(a) for a in program.actions.values())
    if len(spans) != ran:
        violation(f"the trace has {len(spans)} spans for a program of {ran} actions")


def _check_p2p(program, spans, horizon: float) -> None:
    """Sends and receives pair up one to one (by link id), with equal sizes."""
    pairs: dict[int, list] = {}
    for s in spans.values():
        if s.kind in ("send", "recv"):
            if s.link_id is None:
                violation(f"{s.kind} {s.name!r} on rank {s.rank} has no matching transfer")
            pairs.setdefault(s.link_id, []).append(s)
    for link, ss in pairs.items():
        kinds = sorted(x.kind for x in ss)
        if kinds != ["recv", "send"]:
            names = ", ".join(f"{x.kind} {x.name!r} on rank {x.rank}" for x in ss)
            violation(f"transfer {link} pairs {names}; expected one send and one recv")
        recv, send = sorted(ss, key=lambda x: x.kind)
        if (send.rank, recv.rank) != (recv.peer, send.peer):
            violation(f"send {send.name!r} on rank {send.rank} to {send.peer} met recv {recv.name!r} on rank "
                      f"{recv.rank} from {recv.peer}")
        if recv.nbytes and not _close(recv.nbytes, send.nbytes, send.nbytes):
            violation(f"send {send.name!r} on rank {send.rank} sent {send.nbytes} bytes but recv {recv.name!r} "
                      f"on rank {recv.rank} received {recv.nbytes}")
        if recv.end_s < send.busy_start_s - REL_TOL * max(horizon, 1.0):
            violation(f"recv {recv.name!r} on rank {recv.rank} ended before its send {send.name!r} began")


def _check_memory(program, trace) -> None:
    resident: dict[int, dict[str, float]] = {}
    for r, acts in program.actions.items():
        for a in acts:
            if a.name == RESIDENT_ACTION:
                for _, c, b in a.mem:
                    resident.setdefault(r, {})[c] = resident.get(r, {}).get(c, 0.0) + float(b)
    level: dict[tuple[int, str], float] = {}
    scale: dict[tuple[int, str], float] = {}
    for t, r, c, b in trace.memory:
        if not math.isfinite(b):
            violation(f"memory change of {b!r} bytes in {c!r} on rank {r} at t={t!r}")
        k = (r, c)
        v = level.get(k, 0.0) + b
        level[k] = v
        scale[k] = max(scale.get(k, 0.0), abs(b), abs(v))
        if v < -REL_TOL * max(scale[k], 1.0) - 1e-6:
            violation(f"memory in {c!r} on rank {r} went negative ({v:.6g} bytes) at t={t!r}")
    for (r, c), v in sorted(level.items()):
        want = resident.get(r, {}).get(c, 0.0)  # 0 for the transient ones unless allocated up front
        if abs(v - want) > REL_TOL * max(scale[(r, c)], 1.0) + 1e-6:
            violation(f"memory in {c!r} on rank {r} ends the iteration at {v:.6g} bytes, not the resident "
                      f"{want:.6g}")


def _check_transfers(trace, network) -> None:
    """No transfer finished sooner than its bytes over its route's bottleneck link."""
    bundled = getattr(network, "bundle_records", ())
    for k, rec in enumerate(trace.transfers):
        if rec.src == rec.dst or k in bundled:
            continue  # host copies are checked by the flow accounting, bundles when they finish
        links, latency, _, _, _ = network.route(rec.src, rec.dst)
        caps = [network.capacity[l] for l in links]
        bottleneck = min(caps, default=math.inf)
        fastest = rec.nbytes / bottleneck if bottleneck > 0 and not math.isinf(bottleneck) else 0.0
        took = rec.end_s - rec.start_s
        if took < fastest * (1 - 1e-6) - 1e-15:
            violation(f"transfer {rec.label!r} {rec.src}->{rec.dst} moved {rec.nbytes} bytes in {took:.6g} s, "
                      f"faster than its bottleneck allows ({fastest:.6g} s)")
