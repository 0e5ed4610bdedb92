"""Compute slowed by concurrent NCCL kernels (the engine's ``overlap_slowdown``).

An NCCL kernel holds some of the GPU's SMs (one thread block per channel) and streams
through its HBM, so compute kernels that overlap it run slower: Lee et al. 2025
("Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
Learning", arXiv 2507.03114) measure 18.9% on average (40% at most) on A100 and H100.
The engine counts, per rank, the sends, receives and collectives that are moving data,
and a compute action (any stream but ``cpu``) progresses at 1/(1 + σ) of its speed while
that count is above 0. A send or receive counts from the moment both sides have arrived
(a receive posted early and waiting holds nothing worth modelling), a collective from the
moment its last member joins, each until it ends.
"""

from __future__ import annotations
class Slowdown:
    """Compute slowed by concurrent NCCL kernels: per rank, how many sends, receives and
    collectives are running (``busy``), and the compute actions running on it, each with
    its remaining work at full speed. A compute action that starts while ``busy`` runs at
    1/(1 + σ); when a rank's ``busy`` goes from 0 to 1 or back, each of its running compute
    actions is re-timed: the work done since its last re-timing is taken off at the old
    rate, and its end is called again at the new rate (the earlier call, now stale, is
    skipped by its generation number)."""

    def __init__(self, acts: list, rank_of: list, env, finish, at, sigma: float):
        self.factor = 1.0 + sigma
        self.slowable = bytearray(a.kind == "compute" and a.stream != "cpu" for a in acts)
        self.nccl = bytearray(a.kind in ("send", "recv", "collective") for a in acts)
        self.rank_of, self.env = rank_of, env
        self.busy: dict[int, int] = {}
        self.running: dict[int, dict[int, list]] = {}  # rank -> action -> [remaining s, since, generation]
        self._finish, self._at = finish, at

    def start(self, i: int, d: float, now: float) -> None:
        r = self.rank_of[i]
        state = [d, now, 0]
        self.running.setdefault(r, {})[i] = state
        self._at(now + d * (self.factor if self.busy.get(r) else 1.0), self._ended, (i, 0))

    def _ended(self, arg) -> None:
        i, gen = arg
        r = self.rank_of[i]
        mine = self.running.get(r)
        state = mine.get(i) if mine else None
        if state is None or state[2] != gen:
            return  # re-timed since: a later call ends it
        del mine[i]
        self._finish(i)

    def _retime(self, r: int, now: float, was_busy: bool) -> None:
        old, new = (self.factor, 1.0) if was_busy else (1.0, self.factor)
        for i, state in (self.running.get(r) or {}).items():
            state[0] = max(0.0, state[0] - (now - state[1]) / old)
            state[1] = now
            state[2] += 1
            self._at(now + state[0] * new, self._ended, (i, state[2]))

    def nccl_started(self, r: int, now: float) -> None:
        b = self.busy.get(r, 0)
        self.busy[r] = b + 1
        if b == 0:
            self._retime(r, now, False)

    def finish(self, i, bstart=None, lid=None) -> None:
        if self.nccl[i]:
            r = self.rank_of[i]
            b = self.busy[r] - 1
            self.busy[r] = b
            if b == 0:
                self._retime(r, self.env.now, True)
        self._finish(i, bstart, lid)

