"""The per-rank dependency graph that every replayed trace becomes.

A reader of a trace format (``sim.replay.kineto`` for PyTorch profiler traces; a
Chakra execution-trace reader the same way) turns each traced rank into a ``RankGraph``:
its ``Node``s and the edges between them. ``sim.replay.program`` then turns the graphs
into the ``Program`` the engine already runs, so replaying a trace is the same engine,
network model and outputs as ``trainsim run``: a new input path is a new room, not a new
branch.

A node is one thing a rank did:

- ``compute``: busy its ``lane`` for ``duration_s`` (a GPU kernel, a memory copy, or host
  time on a CPU thread);
- ``collective``: ``op`` (one of ``sim.program.actions.OPS``) over ``group`` (global
  ranks) of ``nbytes`` (the larger of the input and output buffers, as ``Action.nbytes``:
  an all-gather's output, a reduce-scatter's input), with its claim on the GPU
  (``transport``, ``slows_compute``: ``Action``'s fields of those names, where the trace
  records them; by default an NCCL kernel);
- ``send`` / ``recv``: ``nbytes`` to / from ``peer``; the n-th send from a to b matches
  the n-th recv on b from a;
- ``comm``: communication whose size or partners the trace does not tell: replayed at its
  measured ``duration_s``, counted as communication.

Edges: nodes of one ``lane`` (a CUDA stream ``"stream 7"``, a CPU thread ``"cpu 1234"``)
run one at a time in the order of ``RankGraph.nodes``, which is a topological order (no
node depends on a later one). Beyond that order a node waits for every node in
``ctrl_deps`` (control: a kernel's launch, the host order of a synchronisation) and
``data_deps`` (data: a cross-stream event wait, a host sync on a stream's work). Both are
ids of nodes of the same rank; the engine treats them alike, the difference is kept for
readers and writers of other formats (Chakra's ET has the same two lists).

``category`` says what a node is for the critical-path report and for ``--gpu``'s
scaling: ``gemm``, ``attention``, ``memory`` (memory-bound kernels, copies),
``kernel`` (another kernel), ``comm`` (communication), ``cpu`` (host time) or
``carry`` (work of an earlier step still on a stream when the chosen step began).
``duration_s`` of a communication node is what the trace measured (kept for reports and
for ``comm`` nodes); collectives and send/recv are priced by the network model.

Times are seconds (SI), converted once by the reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from sim.errors import InputError
from sim.program.actions import OPS, TRANSPORTS

NODE_KINDS = ("compute", "collective", "send", "recv", "comm")
CATEGORIES = ("gemm", "attention", "memory", "kernel", "comm", "cpu", "carry")
COLLECTIVE_OPS = tuple(o for o in OPS if o not in ("sendrecv", "shift"))


class Node(NamedTuple):
    """One thing a rank did (see the module doc). A named tuple: graphs hold millions of
    them; ``node._replace(field=value)`` makes a changed copy."""

    id: int
    """Unique within its rank's graph."""
    name: str
    kind: str
    lane: str
    """Where it runs: nodes of one lane run one at a time, in graph order."""
    duration_s: float = 0.0
    """Measured duration (compute; and what communication took in the trace)."""
    category: str = "kernel"
    op: str = ""
    nbytes: float = 0.0
    group: tuple = ()
    peer: int | None = None
    ctrl_deps: tuple = ()
    data_deps: tuple = ()
    flops: float = 0.0
    """FLOPs the trace records for a kernel, if any (0: unknown)."""
    pg_name: str = ""
    """The process group's name or description, when the trace gives it (``DATA_PARALLEL_GROUP``)."""
    shape: tuple = ()
    """When the trace records its operator's input shapes (``record_shapes``): a GEMM
    kernel's ``(m, n, k, batch, dtype)`` (``dtype`` a key of ``HardwareProfile.peak_flops``),
    an attention kernel's ``(seq_q, seq_k, head_dim, batch x heads)``."""
    transport: str = "nccl"
    """A collective's transport (``sim.program.actions.TRANSPORTS``): ``nccl``, an NCCL
    kernel, or ``direct``, moved outside NCCL (no NCCL base latency), as ``Action.transport``."""
    slows_compute: bool = True
    """Whether a collective holds SMs the compute beside it is not priced without
    (``Action.slows_compute``)."""
    recorded_ops: int = 0
    """Host time of a CPU trace (``sim.replay.cpu``): how many operators and annotations the
    profiler recorded on the thread within it, each of which cost the thread
    ``HardwareProfile.profiler_op_overhead_s`` more than without the profiler."""

    @property
    def deps(self) -> tuple:
        return self.ctrl_deps + self.data_deps

    @property
    def is_comm(self) -> bool:
        return self.kind != "compute"


@dataclass(frozen=True)
class RankGraph:
    """One rank's nodes in a topological order (see the module doc)."""

    rank: int
    nodes: tuple[Node, ...]
    source: str = ""
    """The file it was read from (named in errors)."""
    traced_step_s: float | None = None
    """The step as the trace measured it (first node's start to last node's end)."""
    meta: dict = field(default_factory=dict)
    """What the reader knows beside the nodes: ``world_size``, ``device_name``, ``step``;
    ``costed``: true where the compute durations are a simulator's costs, before the slowdown
    that communication overlapping compute causes (trainsim's own Chakra ETs), rather than
    measured kernels (``sim.replay.run.replay`` applies that slowdown to them)."""

    def check(self) -> "RankGraph":
        """Ids unique, every dependency an earlier node of this graph, kinds and fields valid:
        an ``InputError`` naming the source, the node and what is allowed."""
        seen: set[int] = set()
        where = self.source or f"rank {self.rank}"
        kinds, cats = set(NODE_KINDS), set(CATEGORIES)
        inf = float("inf")
        for n in self.nodes:
            if (n.id in seen or n.kind not in kinds or n.category not in cats or not 0 <= n.duration_s < inf
                    or not 0 <= n.nbytes < inf or (n.kind != "compute" and self._bad_comm(n))
                    or any(d not in seen for d in n.ctrl_deps) or any(d not in seen for d in n.data_deps)):
                self._refuse(n, seen, where)
            seen.add(n.id)
        return self

    def _bad_comm(self, n: Node) -> bool:
        if n.kind == "collective":
            return (n.op not in COLLECTIVE_OPS or self.rank not in n.group or len(set(n.group)) != len(n.group)
                    or n.transport not in TRANSPORTS)
        if n.kind in ("send", "recv"):
            return n.peer is None or n.peer == self.rank or n.peer < 0
        return False

    def _refuse(self, n: Node, seen: set, where: str):
        what = f"{where}: node {n.id} ({n.name!r})"
        if n.id in seen:
            raise InputError(f"{what}: id appears twice; ids must be unique per rank")
        if n.kind not in NODE_KINDS:
            raise InputError(f"{what}: kind: got {n.kind!r}; allowed: {', '.join(NODE_KINDS)}")
        if n.category not in CATEGORIES:
            raise InputError(f"{what}: category: got {n.category!r}; allowed: {', '.join(CATEGORIES)}")
        if not (0 <= n.duration_s < float("inf")) or not (0 <= n.nbytes < float("inf")):
            raise InputError(f"{what}: duration_s {n.duration_s!r}, nbytes {n.nbytes!r}: expected finite numbers >= 0")
        if n.kind == "collective":
            if n.op not in COLLECTIVE_OPS:
                raise InputError(f"{what}: op: got {n.op!r}; allowed: {', '.join(COLLECTIVE_OPS)}")
            if n.transport not in TRANSPORTS:
                raise InputError(f"{what}: transport: got {n.transport!r}; allowed: {', '.join(TRANSPORTS)}")
            raise InputError(f"{what}: group {list(n.group)}: expected distinct ranks including rank {self.rank}")
        if n.kind in ("send", "recv") and (n.peer is None or n.peer == self.rank or n.peer < 0):
            raise InputError(f"{what}: peer: got {n.peer!r}; a {n.kind} needs another rank >= 0")
        bad = next(d for d in n.deps if d not in seen)
        raise InputError(f"{what}: dependency {bad} is not an earlier node of this graph")

    def by_id(self) -> dict[int, Node]:
        return {n.id: n for n in self.nodes}
