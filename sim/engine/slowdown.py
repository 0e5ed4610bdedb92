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

Lazily, so that the common case costs little: each rank keeps the total time it has
been busy so far, and a compute action its start time, the rank's busy total then and
its work left. Its end is called when it would end at its current rate; the call works
out the work done since from the busy time in between and, if some is left (the rank
became busy meanwhile), calls again for the rest at the rank's rate now. Only actions
called at the slow rate must be called earlier when their rank stops being busy; they
are kept per rank, and a superseded call is told by its time.
"""

from __future__ import annotations


class Slowdown:
    """See the module doc. ``start(i, d, now)`` begins a compute action of ``d`` seconds at
    full speed (one of ``slowable``, the index's); ``nccl_started(rank, now)`` and
    ``nccl_finish`` (the engine's finish, wrapped: for collectives) count a rank's NCCL
    kernels, and ``p2p_join`` makes the engine's send/recv join that counts both ranks'.
    The hot paths are closures over local lists."""

    def __init__(self, slowable: bytearray, rank_of: list, env, finish, at, sigma: float):
        n = len(slowable)
        factor, k = 1.0 + sigma, sigma / (1.0 + sigma)
        self.slowable = slowable
        ranks = max(rank_of, default=-1) + 1
        busy, since, total = [0] * ranks, [0.0] * ranks, [0.0] * ranks
        t0, c0, left_of, due = [0.0] * n, [0.0] * n, [0.0] * n, [-1.0] * n
        slowed: dict[int, set] = {}  # rank -> actions called at the slow rate
        self._state = (busy, since, total, t0, c0, left_of, due, slowed)

        def call(i: int, r: int, now: float, left: float) -> None:
            """Call ``is_due(i)`` when ``left`` seconds of work at the rank's rate now are done."""
            b = busy[r]
            t0[i] = now
            c0[i] = total[r] + (now - since[r] if b else 0.0)
            left_of[i] = left
            if b:
                slowed.setdefault(r, set()).add(i)
                t = now + left * factor
            else:
                t = now + left
            due[i] = t
            at(t, is_due, i)

        def start(i: int, d: float, now: float) -> None:
            r = rank_of[i]
            if busy[r]:
                call(i, r, now, d)
                return
            t0[i] = now  # (the common case, inline)
            c0[i] = total[r]
            left_of[i] = d
            t = due[i] = now + d
            at(t, is_due, i)

        def is_due(i: int) -> None:
            now = env.now
            if now != due[i]:
                return  # superseded by an earlier call
            r = rank_of[i]
            b = busy[r]
            tot = total[r] + (now - since[r] if b else 0.0)
            if tot == c0[i] and not b:  # never busy meanwhile: done
                due[i] = -1.0
                finish(i)
                return
            left = left_of[i] - ((now - t0[i]) - (tot - c0[i]) * k)
            mine = slowed.get(r)
            if mine:
                mine.discard(i)
            if left <= 1e-9 * left_of[i] or now + left <= now:  # (done, or less than the clock can tell)
                due[i] = -1.0
                finish(i)
            else:  # the rank was busy for part of the time: the rest, at its rate now
                call(i, r, now, left)

        def nccl_started(r: int, now: float) -> None:
            if not busy[r]:
                since[r] = now
            busy[r] += 1

        def sooner(r: int, now: float, mine: set) -> None:
            """Rank ``r``'s last NCCL kernel has ended (its busy total is brought up to
            ``now``): ``mine``, called at the slow rate, sooner."""
            for j in sorted(mine):
                done = (now - t0[j]) - (total[r] - c0[j]) * k
                call(j, r, now, max(0.0, left_of[j] - done))

        def nccl_finish(i, bstart=None, lid=None) -> None:
            r = rank_of[i]
            busy[r] -= 1
            if not busy[r]:  # (the rank's last NCCL kernel has ended: inline, as in delivered below)
                now = env.now
                total[r] += now - since[r]
                if r in slowed:
                    sooner(r, now, slowed.pop(r))
            finish(i, bstart, lid)

        def p2p_join(start, partner, pair_link):
            """The engine's ``join_p2p`` (``_Engine._p2p_join``), with both ranks' counts inline."""

            def delivered(pair):
                si, ri, src, dst, began, lid = pair
                now = env.now
                busy[src] -= 1
                if not busy[src]:  # (its last NCCL kernel has ended: its busy total, then what it slowed)
                    total[src] += now - since[src]
                    if src in slowed:
                        sooner(src, now, slowed.pop(src))
                finish(si, began, lid)
                busy[dst] -= 1
                if not busy[dst]:
                    total[dst] += now - since[dst]
                    if dst in slowed:
                        sooner(dst, now, slowed.pop(dst))
                finish(ri, began, lid)

            def join_p2p(i: int, pair: tuple) -> None:
                si, ri, src, dst, nbytes, label, route = pair
                now = env.now
                if not busy[src]:
                    since[src] = now
                busy[src] += 1
                if not busy[dst]:
                    since[dst] = now
                busy[dst] += 1
                start(route, src, dst, nbytes, label, 1, delivered, (si, ri, src, dst, now, pair_link[partner[i]]))

            return join_p2p

        self.start, self.nccl_started, self.nccl_finish, self.p2p_join = start, nccl_started, nccl_finish, p2p_join

    def release(self) -> None:
        """Empty the per-action state (the closures above hold it)."""
        for part in self._state:
            part.clear()
        self.__dict__.clear()
