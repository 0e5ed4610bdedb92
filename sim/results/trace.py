"""What a simulation leaves behind: spans, transfers and per-link traffic.

A ``Span`` is one action as it ran: rank, stream, start and end in seconds, and what it
moved or computed. A ``TransferRecord`` is one point-to-point transfer the network
carried (collective steps included). The ``Trace`` holds every span sorted by (rank,
stream, start), every transfer, and the bytes each directed link carried, so questions
like "how much crossed InfiniBand, and on which links" are answered from the trace, not
from a formula.

The trace owns these records: they are plain data, and the engine (``sim.engine``)
imports them from here to fill them in. Reading a trace (metrics, exports, plots)
therefore needs no SimPy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import NamedTuple



class Span(NamedTuple):
    """One action as it ran on one rank's stream (times in seconds). A named tuple:
    traces hold millions of them."""

    rank: int
    stream: str
    name: str
    kind: str
    category: str
    start_s: float
    end_s: float
    nbytes: float = 0.0
    flops: float = 0.0
    peer: int | None = None
    op: str = ""
    link_id: int | None = None
    """Shared by a send and its matching recv (flow arrows in the Perfetto trace)."""
    busy_start_s: float | None = None
    """When data started to move (all parties had arrived); before it the action waited.
    Equal to ``start_s`` for compute."""
    layer: int | None = None

    @property
    def busy_s(self) -> float:
        """Time spent moving data or computing, without waiting for the other parties."""
        return self.end_s - (self.start_s if self.busy_start_s is None else self.busy_start_s)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


class TransferRecord(NamedTuple):
    """One completed point-to-point transfer (times in seconds). A named tuple: traces
    hold millions of them."""

    src: int
    dst: int
    nbytes: int
    start_s: float  # when it was issued (before the latency)
    end_s: float
    label: str  # what it belongs to, e.g. "allreduce ar hier inter allreduce rail 0 step 2"
    medium: str  # the slowest class of link crossed: "ib" or "ethernet", else "pcie", else "nvlink"


class MemoryLog(Sequence):
    """``Trace.memory`` as the engine records it: for each start or end of an action that
    changes memory, its time, its rank and the action's changes (a tuple of (category,
    bytes) pairs, one object shared by every action with the same changes), one after the
    other in the flat list ``flat``. Three list slots per start or end instead of a
    4-tuple per change: at 16,384 GPUs, 4.75 million changes took about 380 MB at the
    run's peak as tuples. It reads as the list of (time_s, rank, category, bytes) it
    stands for, in the same order: iterate it, take its length, index or slice it (a
    slice is a list), compare it with a list or tuple."""

    def __init__(self, flat: list):
        self._flat = flat
        self._len: int | None = None

    def __iter__(self):
        flat = self._flat
        for t, r, changes in zip(islice(flat, 0, None, 3), islice(flat, 1, None, 3), islice(flat, 2, None, 3)):
            for c, b in changes:
                yield (t, r, c, b)

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(map(len, islice(self._flat, 2, None, 3)))
        return self._len

    def __getitem__(self, k):
        if isinstance(k, slice):
            if (k.start or 0) >= 0 and (k.stop is None or k.stop >= 0) and (k.step or 1) > 0:
                return list(islice(self, k.start, k.stop, k.step))
            return list(self)[k]
        n = len(self)
        j = k + n if k < 0 else k
        if not 0 <= j < n:
            raise IndexError(f"memory change {k} of {n}")
        return next(islice(self, j, None))

    def __eq__(self, other) -> bool:
        if isinstance(other, (MemoryLog, list, tuple)):
            return len(self) == len(other) and all(map(_same, self, other))
        return NotImplemented

    __hash__ = None  # (compared by value, as a list is)

    def __repr__(self) -> str:
        return f"MemoryLog({list(self)!r})"


def _same(a, b) -> bool:
    return a == b


@dataclass
class Trace:
    """Everything one simulated run produced."""

    spans: list[Span]
    transfers: list[TransferRecord]
    link_bytes: dict[tuple[str, str], float]
    """Bytes carried by each directed link (from device, to device) that carried any."""
    link_kind: dict[tuple[str, str], str]
    ranks: dict[int, dict] = field(default_factory=dict)
    """Per rank: ``node`` (host index) and ``device`` (topology GPU id)."""
    topology: str = ""
    memory: list | MemoryLog = field(default_factory=list)
    """Memory changes as (time_s, rank, category, bytes), in the order they happened
    (see ``sim.results.memory_timeline``): a list, or from the engine a ``MemoryLog``,
    which reads as one."""
    stats: dict = field(default_factory=dict)
    """How big the simulation was and what it cost: ``events`` (SimPy events processed:
    every timed call counts, though calls due at one instant mostly share one of the
    ``queue_entries``, see ``sim.engine.kernel.Calls``), ``actions``, ``transfers``,
    ``simulated_gpus``; ``engine_setup_s`` (indexing, routing and collective planning
    before the clock starts), ``engine_loop_s`` (the event loop) and ``engine_wall_s``
    (the event loop and the assembly of this trace)."""

    _end: tuple | None = field(default=None, init=False, repr=False, compare=False)
    """``end_s`` kept with the span list it was read from and that list's length: a
    summary reads the makespan several times, each a pass over every span (1.3 million at
    16,384 GPUs, about 0.1 s each). Spans are immutable tuples, so the same list at the same
    length has the same latest end; a list replaced or grown is read again."""

    @property
    def end_s(self) -> float:
        """When the last action finished (the makespan)."""
        kept = self._end
        if kept is not None and kept[0] is self.spans and kept[1] == len(self.spans):
            return kept[2]
        end = max((s.end_s for s in self.spans), default=0.0)
        self._end = (self.spans, len(self.spans), end)
        return end

    def known_end_s(self, end_s: float) -> None:
        """Keep ``end_s`` as the makespan of the spans as they are now, for a maker that
        already has every span's end at hand (the engine: its per-action list, one pass in
        C where reading it back from the spans took about 0.5 s at 16,384 GPUs). It must be
        the latest ``end_s`` of the spans (``tests/test_engine.py`` checks the engine's)."""
        self._end = (self.spans, len(self.spans), end_s)

    def spans_of(self, rank: int, stream: str | None = None) -> list[Span]:
        return [s for s in self.spans if s.rank == rank and (stream is None or s.stream == stream)]

    def streams(self) -> dict[int, list[str]]:
        """Each rank's streams, compute first, then others by name."""
        out: dict[int, set[str]] = {}
        for s in self.spans:
            out.setdefault(s.rank, set()).add(s.stream)
        return {r: sorted(v, key=lambda x: (x != "compute", x)) for r, v in sorted(out.items())}

    def bytes_by_link_kind(self) -> dict[str, float]:
        """Total bytes over all directed links of each kind (a byte crossing 3 IB links counts 3 times)."""
        out: dict[str, float] = {}
        for link, b in self.link_bytes.items():
            k = self.link_kind[link]
            out[k] = out.get(k, 0.0) + b
        return dict(sorted(out.items()))

    def busiest_link(self, kind: str) -> tuple[tuple[str, str] | None, float]:
        """The directed link of ``kind`` that carried the most bytes, and how many."""
        best, most = None, 0.0
        for link in sorted(self.link_bytes):
            if self.link_kind[link] == kind and self.link_bytes[link] > most:
                best, most = link, self.link_bytes[link]
        return best, most

    def links_used(self, kind: str) -> int:
        """How many directed links of ``kind`` carried any bytes."""
        return sum(1 for l, b in self.link_bytes.items() if b > 0 and self.link_kind[l] == kind)
