"""A training campaign over days: SimPy simulates the job's life between failures.

Processes:

- one *arrival* process per cause draws failures as a Poisson process at the job's rate
  of that cause (its rate per device-hour times the job's devices of that kind), each
  cause from its own seeded stream, so that two campaigns with the same seed and the same
  causes see the same failures whatever their checkpoint interval (common random
  numbers: interval comparisons are not blurred by different luck);
- the *job* moves through ``train`` (iterations and periodic checkpoint saves, as
  ``sim.engine.checkpoint_cycle`` computes them: the only events are interruptions),
  ``detect``, ``wait`` (for a hot spare), ``restart`` and, for a planned interruption,
  ``save`` (a final checkpoint before stopping); detection and restart are one event
  when no spare is awaited;
- with a finite pool of hot spares, a failed node goes to *repair* and returns to the
  pool ``repair_s`` later; a failure that takes a node out (``replace``) needs a spare
  before the job can restart, and the job waits when none is free. Without a limit
  (``spares=None``) a spare is always there.

An unexpected failure during training loses the work since the last durable checkpoint.
Failures keep arriving while the job is down (it holds its nodes while it restarts); one
that strikes during detection, a wait or a restart starts the recovery again from its own
detection, as in Daly's model (Daly 2006: a failure during restart restarts it). A planned
interruption that arrives while the job is down changes nothing and is not counted.

Every second of the horizon is accounted for once: useful training, checkpoint stalls,
and per cause the lost (rolled back) work, detection, waiting for a spare, restarting
(relaunch plus reading the checkpoint back) and planned saves. Work done since the last
durable checkpoint when the horizon ends counts as useful (the job would save it).
Goodput = useful training time / horizon.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import simpy

from sim.errors import InputError
from sim.engine.checkpoint_cycle import Cycle

MAX_FAILURES = 2_000_000
"""Expected failures in one campaign above which it is refused (memory and minutes)."""
LOSS_KINDS = ("lost_work", "detect", "wait", "restart", "save")


@dataclass(frozen=True)
class CampaignConfig:
    """What one campaign simulates (SI units)."""

    horizon_s: float
    step_time_s: float
    interval_s: float
    """Training work between checkpoint saves, rounded to whole iterations (at least one)."""
    stall_s: float
    """Training stalled per save: the whole write (synchronous) or the copy to host memory."""
    write_s: float
    """Asynchronous saves: the background write after the stall (0 for synchronous saves)."""
    planned_save_s: float
    """A planned stop's final, synchronous save."""
    load_s: float
    """Reading the checkpoint back at a restart."""
    causes: tuple[tuple[object, float], ...]
    """(cause, the job's failures per second of it). A cause is anything with ``name``,
    ``planned``, ``replace``, ``detect_s``, ``restart_s`` and ``repair_s`` (a
    ``sim.studies.goodput.Cause``)."""
    spares: int | None = None
    """Hot spare nodes (None: always one at hand)."""

    def __post_init__(self):
        for name in ("horizon_s", "step_time_s", "interval_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(f"{name}: got {v!r}; expected a finite number > 0")
        for name in ("stall_s", "write_s", "planned_save_s", "load_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InputError(f"{name}: got {v!r}; expected a finite number >= 0")
        if self.spares is not None and (isinstance(self.spares, bool) or not isinstance(self.spares, int)
                                        or self.spares < 0):
            raise InputError(f"--hot-spares: got {self.spares!r}; expected an integer >= 0 or 'unlimited'")
        for cause, rate in self.causes:
            if not (math.isfinite(rate) and rate >= 0):
                raise InputError(f"failure rate of {cause.name}: got {rate!r}; expected a finite number >= 0")
        expected = self.horizon_s * sum(r for _, r in self.causes)
        if expected > MAX_FAILURES:
            raise InputError(f"--days: got {self.horizon_s / 86400:g}; about {expected:,.0f} failures expected over "
                             f"the horizon, more than the {MAX_FAILURES:,} one campaign simulates: shorten it")

    @property
    def interval_steps(self) -> int:
        return max(1, int(round(self.interval_s / self.step_time_s)))

    @property
    def cycle(self) -> Cycle:
        return Cycle(self.interval_steps * self.step_time_s, self.stall_s, self.write_s)


@dataclass
class Campaign:
    """What a campaign's horizon was spent on, per cause, and (when recorded) its timeline."""

    horizon_s: float
    interval_s: float
    useful_s: float = 0.0
    checkpoint_s: float = 0.0
    saves_durable: int = 0
    interruptions: dict[str, int] = field(default_factory=dict)
    unexpected: int = 0
    lost: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per cause: seconds of each of LOSS_KINDS."""
    activities: list = field(default_factory=list)
    """(kind, cause or "", start, end, extra) when recorded: kind "train" has extra
    (Cycle, time after which its work was rolled back or None)."""
    failures: list = field(default_factory=list)
    """(time, cause name, planned) of every counted interruption, when recorded."""

    @property
    def goodput(self) -> float:
        return self.useful_s / self.horizon_s

    def lost_total_s(self, cause: str) -> float:
        return sum(self.lost.get(cause, {}).values())

    def accounted_s(self) -> float:
        """Useful + checkpoint + every loss: the horizon, up to rounding."""
        return self.useful_s + self.checkpoint_s + sum(sum(v.values()) for v in self.lost.values())


def simulate_campaign(cfg: CampaignConfig, seed: int = 0, record: bool = False) -> Campaign:
    """Simulate one campaign of ``cfg`` with failures drawn from ``seed``."""
    return _Life(cfg, seed, record).run()


class _Life:
    def __init__(self, cfg: CampaignConfig, seed: int, record: bool):
        self.cfg, self.record = cfg, record
        self.env = simpy.Environment()
        self.cycle = cfg.cycle
        self.out = Campaign(cfg.horizon_s, self.cycle.interval_s)
        for cause, _ in cfg.causes:
            self.out.interruptions[cause.name] = 0
            self.out.lost[cause.name] = dict.fromkeys(LOSS_KINDS, 0.0)
        self.pool = simpy.Container(self.env, init=cfg.spares) if cfg.spares is not None else None
        self.need = 0  # replacement nodes the job still needs before it can restart
        self.req = None
        self.progress = self.durable = 0.0
        self.mode, self.cause, self.since, self.until = "train", None, 0.0, math.inf
        self.never = self.env.event()
        self.job = self.env.process(self._life())
        for i, (cause, rate) in enumerate(cfg.causes):
            if rate > 0:
                self.env.process(self._arrivals(cause, rate, np.random.default_rng([seed, i])))

    def run(self) -> Campaign:
        self.env.run(until=self.cfg.horizon_s)
        self._close(self.cfg.horizon_s, None)
        self.out.useful_s = self.progress
        return self.out

    # ------------------------------------------------------------------ processes
    def _arrivals(self, cause, rate: float, rng):
        mean, timeout, interrupt = 1.0 / rate, self.env.timeout, self.job.interrupt
        while True:  # drawn in blocks: the same numbers as one draw at a time, fewer calls
            for gap in rng.exponential(mean, 256).tolist():
                yield timeout(gap)
                interrupt(cause)

    def _repair(self, repair_s: float):
        yield self.env.timeout(repair_s)
        yield self.pool.put(1)

    def _life(self):
        while True:
            try:
                if self.mode == "train":
                    yield self.never
                elif self.mode == "wait":
                    if self.req is None:
                        self.req = self.pool.get(1)
                    yield self.req
                    self.req = None
                    self.need -= 1
                    if self.need == 0:
                        self._begin("restart", self.cause, self.cause.restart_s + self.cfg.load_s)
                    else:
                        self._begin("wait", self.cause)
                else:
                    yield self.env.timeout(self.until - self.env.now)
                    self._finished()
            except simpy.Interrupt as stop:
                self._interrupted(stop.cause)

    # ------------------------------------------------------------------ transitions
    def _begin(self, mode: str, cause, duration: float = math.inf, lose: object | None = None) -> None:
        """Close the activity under way (``lose``: the failure that ends it, rolling back the
        work since the last durable checkpoint) and start ``mode`` for ``duration``."""
        now = self.env.now
        self._close(now, lose)
        self.mode, self.cause, self.since, self.until = mode, cause, now, now + duration

    def _finished(self) -> None:
        """The timed activity under way ended: what comes next."""
        if self.mode == "save":  # a planned stop's final checkpoint is written
            self.durable = self.progress
            self._begin("restart", self.cause, self.cause.restart_s + self.cfg.load_s)
        elif self.mode == "detect":
            if self.need > 0:
                self._begin("wait", self.cause)
            else:
                self._begin("restart", self.cause, self.cause.restart_s + self.cfg.load_s)
        elif self.mode in ("restart", "down"):
            self._begin("train", None)

    def _interrupted(self, cause) -> None:
        now = self.env.now
        if cause.planned:
            if self.mode != "train":
                return  # the job is already down: the maintenance costs nothing more
            self._count(cause, now)
            self._begin("save", cause, self.cfg.planned_save_s)
            return
        self._count(cause, now)
        if cause.replace and self.pool is not None:
            self.need += 1
            self.env.process(self._repair(cause.repair_s))
        if self.need:
            self._begin("detect", cause, cause.detect_s, lose=cause)
        else:  # detection then restart, one event (split again when the time is booked)
            self._begin("down", cause, cause.detect_s + cause.restart_s + self.cfg.load_s, lose=cause)

    def _count(self, cause, now: float) -> None:
        self.out.interruptions[cause.name] += 1
        if not cause.planned:
            self.out.unexpected += 1
        if self.record:
            self.out.failures.append((now, cause.name, cause.planned))

    def _close(self, now: float, lose: object | None) -> None:
        """End the activity under way at ``now``; ``lose``: the failure that ends it (None
        at the horizon or at a planned transition), which loses the undurable work."""
        mode, since = self.mode, self.since
        if mode == "train":
            st = self.cycle.state_at(now - since)
            self.out.checkpoint_s += st.stall_s
            self.out.saves_durable += st.saves_durable
            base = self.progress
            self.progress = base + st.work_s
            if st.saves_durable:
                self.durable = base + st.durable_work_s
            cut = None
            if lose is not None:
                cut = self._cut_time(since, st.saves_durable)
                self._lose(lose)
            if self.record:
                self.out.activities.append(("train", "", since, now, (self.cycle, cut)))
        else:
            if mode == "wait" and self.req is not None:
                if self.req.triggered:  # the spare was handed over at this very instant
                    self.need -= 1
                else:
                    self.req.cancel()
                self.req = None
            if mode == "save" and lose is not None:
                self._lose(lose)
            parts = [(mode, since, now)]
            if mode == "down":
                split = min(now, since + self.cause.detect_s)
                parts = [("detect", since, split), ("restart", split, now)]
            for kind, a, b in parts:
                self.out.lost[self.cause.name][kind] += b - a
                if self.record and b > a:
                    self.out.activities.append((kind, self.cause.name, a, b, None))

    def _lose(self, cause) -> None:
        self.out.lost[cause.name]["lost_work"] += self.progress - self.durable
        self.progress = self.durable

    def _cut_time(self, since: float, durable_saves: int) -> float:
        """When the work of the phase's last durable checkpoint ended (later work is lost)."""
        if durable_saves == 0:
            return since
        c = self.cycle
        return since + c.interval_s + (durable_saves - 1) * c.period_s
