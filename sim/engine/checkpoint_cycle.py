"""Training with periodic checkpoints, between two interruptions, as arithmetic.

Between a restart and the next interruption a job repeats one cycle: train for ``τ``
seconds of work (a whole number of iterations), then save a checkpoint. A save stalls
training for ``stall_s``, and becomes *durable* (usable for a restart) ``write_s``
after the stall ends:

- synchronous save: the stall is the whole write to storage (``write_s`` = 0);
- asynchronous save: the stall is the copy of each GPU's shard to host memory, and the
  write to storage runs in the background during the next τ of training. A save that
  falls due while the previous write is still running waits for it (as PyTorch's
  distributed checkpoint ``async_save`` and Megatron-LM's ``--async-save`` do: one
  write in flight at a time).

So, counting time from the phase's start, the first save falls due at τ, and from then
on the pattern repeats with period ``L = stall + max(τ, write)``: stall, train τ,
wait ``max(0, write − τ)``. Save ``i`` (from 0) becomes durable at
``τ + i·L + stall + write`` and holds ``(i + 1)·τ`` of work. ``Cycle.state_at`` turns an
elapsed time into work done, stall time and durable work, so the campaign simulation
needs no event per iteration or per checkpoint: only interruptions are events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CycleState:
    """Where a running phase is, ``elapsed`` seconds after it started."""

    work_s: float
    """Training work done since the phase started (seconds of iterations)."""
    stall_s: float
    """Time spent saving checkpoints or waiting for a previous write."""
    durable_work_s: float
    """Work held by the last durable checkpoint of this phase (0: none yet)."""
    saves_started: int
    saves_durable: int


@dataclass(frozen=True)
class Cycle:
    """The checkpoint cycle: ``interval_s`` of work, a ``stall_s`` stall, a background ``write_s``."""

    interval_s: float
    stall_s: float
    write_s: float = 0.0

    def __post_init__(self):
        if not (self.interval_s > 0 and self.stall_s >= 0 and self.write_s >= 0):
            raise ValueError(f"cycle: interval {self.interval_s} s must be > 0, stall {self.stall_s} s and write "
                             f"{self.write_s} s >= 0")

    @property
    def period_s(self) -> float:
        """Wall time of one cycle after the first save falls due: stall + max(τ, write)."""
        return self.stall_s + max(self.interval_s, self.write_s)

    @property
    def wait_s(self) -> float:
        """Per cycle, the wait for the previous asynchronous write: max(0, write − τ)."""
        return max(0.0, self.write_s - self.interval_s)

    def state_at(self, elapsed_s: float) -> CycleState:
        tau, c, w, L = self.interval_s, self.stall_s, self.wait_s, self.period_s
        if elapsed_s < tau:
            return CycleState(elapsed_s, 0.0, 0.0, 0, 0)
        u = elapsed_s - tau
        j = math.floor(u / L)
        r = u - j * L
        stall = j * (c + w)
        if r < c:  # saving checkpoint j
            work, stall = (j + 1) * tau, stall + r
        elif r < c + tau:  # training after it
            work, stall = (j + 1) * tau + (r - c), stall + c
        else:  # waiting for its write before saving the next
            work, stall = (j + 2) * tau, stall + c + (r - c - tau)
        d = u - c - self.write_s
        durable = math.floor(d / L) + 1 if d >= 0 else 0
        return CycleState(work, stall, durable * tau, j + 1, durable)

    def spans(self, start_s: float, end_s: float, lo_s: float, hi_s: float) -> list[tuple[str, float, float]]:
        """The phase's ("train" | "checkpoint", start, end) pieces that meet [lo, hi], for
        pictures; the phase ran from ``start_s`` to ``end_s``."""
        out: list[tuple[str, float, float]] = []
        lo, hi = max(lo_s, start_s), min(hi_s, end_s)
        if lo >= hi:
            return out

        def add(kind, a, b):
            a, b = max(a, lo), min(b, hi)
            if b > a:
                out.append((kind, a, b))

        first_due = start_s + self.interval_s
        add("train", start_s, first_due)
        L, c, tau = self.period_s, self.stall_s, self.interval_s
        j = max(0, math.floor((lo - first_due) / L)) if lo > first_due else 0
        while True:
            t0 = first_due + j * L
            if t0 >= hi:
                break
            add("checkpoint", t0, t0 + c)
            add("train", t0 + c, t0 + c + tau)
            add("checkpoint", t0 + c + tau, t0 + L)  # waiting for the write counts as checkpoint time
            j += 1
        return out
