"""Chakra execution traces as replay graphs: ``trainsim replay rank0.et rank1.et ...``.

``sim.inputs.chakra.read_ets`` reads and checks the files (one per rank, rank from the
``NAME.<r>.et`` file name; a comm-group file beside them); ``chakra_graphs`` turns each
rank's ET into the ``RankGraph`` every replay reader makes (``sim.replay.graph``):

- ``COMP_NODE`` -> ``compute`` at ``duration_micros`` (or trainsim's exact
  ``trainsim_duration_s``); its category from trainsim's (forward, backward and
  weight-gradient work counts as ``gemm``, the optimizer step as ``memory``) or else from
  the node's name (``sim.replay.kineto.kernel_category``); CPU operators (``is_cpu_op``)
  as ``cpu``. A node trainsim marked ``trainsim_comm`` (communication it could only time)
  is ``comm`` at that time;
- ``COMM_COLL_NODE`` -> ``collective`` of its ``comm_type`` over its ``pg_name``'s ranks,
  ``comm_size`` bytes, priced by the network model; one trainsim priced outside the
  network (``trainsim_priced``), or one whose type has no trainsim collective (REDUCE,
  GATHER, SCATTER, REDUCE_SCATTER_BLOCK, BARRIER), is ``comm`` at its ``duration_micros``
  (refused when that is 0: nothing would say how long it takes); its claim from trainsim's
  ``trainsim_transport`` and ``trainsim_slows_compute`` (``Node.transport``,
  ``Node.slows_compute``; ETs written before these name a ``direct`` transport
  ``trainsim_userbuffers``), else an NCCL kernel;
- ``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` -> ``send`` / ``recv`` with their peer (and
  ``trainsim_slows_compute``, as a collective's);
- ``MEM_LOAD_NODE`` / ``MEM_STORE_NODE`` -> ``compute`` (``memory``) at their duration;
- ``METADATA_NODE`` / ``INVALID_NODE`` -> zero-time ``compute`` (ASTRA-sim skips them too),
  kept so that dependencies through them hold.

Order and lanes: nodes are put in a dependency order (the file's order among those ready,
since Chakra does not require a topological file). Lanes: the node's ``stream`` attribute
(trainsim's stream names ride in the metadata's ``trainsim_streams``); without it, as
ASTRA-sim's hardware model runs a rank (one CPU operator, one GPU kernel and one
communication at a time): ``cpu 0``, ``stream compute`` and ``stream comm``, receives on
``stream recv`` (GPU lanes are named ``stream ...`` and CPU ones ``cpu ...``, as the Kineto
reader names them; CPU operators are always on ``cpu 0``).
Dependencies: ``data_deps``, what simulators schedule by (ASTRA-sim's ET feeder); in
ETs that trainsim did not write, a node that waits for a send waits for what the send
waited for (``_eager_sends``: ASTRA-sim's sends do not wait for their receive). A
``ctrl_deps`` entry that is also a data dependency is kept as a control dependency; the
others are not waited for: Chakra's PyTorch converter puts the calling CPU operator there,
which encloses its callee rather than coming before it.

A collective's process-group name is trainsim's category (``dp``, ``tp``, ``zero``, ...) for
ETs trainsim wrote, else the ``pg_name`` id: ``--data-parallel-size`` finds the
data-parallel groups by it (``sim.replay.run.data_parallel_groups``).

The replay's world size is the ETs' ``world_size`` metadata (trainsim's) or else the number
of files; its GPU is the metadata's ``device_name`` (trainsim's) or ``--gpu``. ``traced_step_s``
is the iteration time ``trainsim run`` simulated, for ETs it wrote; other ETs measure no step.
"""

from __future__ import annotations

import gzip
import heapq
from pathlib import Path

from sim.errors import InputError
from sim.inputs.chakra import EtNode, EtRank, read_ets
from sim.replay.graph import COLLECTIVE_OPS, Node, RankGraph
from sim.replay.kineto import kernel_category

_GEMM_WORK = {"F", "B", "W", "I", "R"}
"""trainsim's categories of forward, backward, weight-gradient and recompute work."""
_MEMORY_WORK = {"opt", "mem", "offload"}


def is_chakra(path: str | Path) -> bool:
    """A Chakra ET rather than a Kineto trace: by extension (``.et``, ``.et.gz`` vs
    ``.json``, ``.json.gz``), else by content (a Kineto trace is JSON, opening with ``{``)."""
    name = Path(path).name.lower()
    if name.endswith((".et", ".et.gz")):
        return True
    if name.endswith((".json", ".json.gz")):
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
        if head[:2] == b"\x1f\x8b":
            with gzip.open(path, "rb") as fh:
                head = fh.read(4096)
    except (OSError, EOFError):
        return False  # (the Kineto reader names what is wrong with it)
    return not head.lstrip()[:1] in (b"{", b"[")


def chakra_graphs(paths, comm_groups=None) -> list[RankGraph]:
    """The replay graph of each ET in ``paths`` (see the module doc), in rank order."""
    ets = read_ets(paths, comm_groups)
    world = _world_size(ets)
    return [_graph(et, world) for et in ets.values()]


def _world_size(ets: dict[int, EtRank]) -> int:
    sizes = {et.metadata.get("world_size") for et in ets.values()} - {None}
    if len(sizes) > 1:
        first = next(iter(ets.values()))
        other = next(et for et in ets.values() if et.metadata.get("world_size") != first.metadata.get("world_size"))
        raise InputError(f"{other.path}: world_size: got {other.metadata.get('world_size')!r}; {first.path} has "
                         f"{first.metadata.get('world_size')!r}: traces of different jobs are mixed")
    world = sizes.pop() if sizes else len(ets)
    top = max(ets)
    if top >= world:
        raise InputError(f"{ets[top].path}: rank {top}: the job's world size is {world} "
                         f"({'the metadata' if sizes else 'one ET per rank'})")
    return int(world)


def _graph(et: EtRank, world: int) -> RankGraph:
    streams = et.metadata.get("trainsim_streams") or []
    order = _dependency_order(et)
    ours = str(et.metadata.get("schema", "")).startswith("trainsim")
    waits = {n.id: n.data_deps for n in order} if ours else _eager_sends(order)
    nodes = tuple(_node(et, n, streams, waits[n.id]) for n in order)
    meta = {"world_size": world, "step": None, "format": "chakra"}
    if ours:  # (trainsim's durations are the program's costs, before the overlap slowdown)
        meta["costed"] = True
    if et.metadata.get("device_name"):
        meta["device_name"] = et.metadata["device_name"]
    step = et.metadata.get("trainsim_iteration_time_s")
    graph = RankGraph(et.rank, nodes, et.path, step if isinstance(step, float) else None, meta)
    return graph.check()


def _dependency_order(et: EtRank) -> list[EtNode]:
    """The nodes in an order where each follows its data dependencies (and the control
    dependencies kept), the file's order first among those ready."""
    pos = {n.id: i for i, n in enumerate(et.nodes)}
    users: dict[int, list[int]] = {}
    left = {}
    for i, n in enumerate(et.nodes):
        deps = set(n.data_deps)
        left[i] = len(deps)
        for d in deps:
            users.setdefault(pos[d], []).append(i)
    ready = [i for i, k in left.items() if k == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        i = heapq.heappop(ready)
        out.append(et.nodes[i])
        for u in users.get(i, ()):
            left[u] -= 1
            if left[u] == 0:
                heapq.heappush(ready, u)
    return out  # (read_ets refused cycles, so every node is here)


def _eager_sends(order: list[EtNode]) -> dict[int, tuple[int, ...]]:
    """Each node's data dependencies with a send's dependents waiting for what the send
    waited for instead: in ASTRA-sim a send completes without its receive being posted,
    while the engine's send meets its receive (NCCL's rendezvous). An MSCCL ring whose
    every rank first sends, then receives after its send, would otherwise never start."""
    of_send: dict[int, tuple[int, ...]] = {}
    out = {}
    for n in order:
        deps: list[int] = []
        for d in n.data_deps:
            for e in of_send.get(d, (d,)):
                if e not in deps:
                    deps.append(e)
        out[n.id] = tuple(deps)
        if n.kind == "send":
            of_send[n.id] = out[n.id]
    return out


def _lane(n: EtNode, streams: list) -> str:
    """``stream <name>`` for GPU work, ``cpu 0`` for CPU operators (the replay's convention)."""
    if n.is_cpu_op:
        return "cpu 0"
    if n.stream is not None:
        return f"stream {streams[n.stream] if 0 <= n.stream < len(streams) else n.stream}"
    if n.kind in ("collective", "send"):
        return "stream comm"
    return "stream recv" if n.kind == "recv" else "stream compute"


def _claim(n: EtNode) -> dict:
    """A collective node's claim (``Node.transport``, ``Node.slows_compute``) from trainsim's
    attributes; none: an NCCL kernel's defaults."""
    out = {}
    transport = n.attrs.get("trainsim_transport") or ("direct" if n.attrs.get("trainsim_userbuffers") else None)
    if transport is not None:
        out["transport"] = str(transport)
    if "trainsim_slows_compute" in n.attrs:
        out["slows_compute"] = bool(n.attrs["trainsim_slows_compute"])
    return out


def _node(et: EtRank, n: EtNode, streams: list, waits: tuple[int, ...]) -> Node:
    ctrl = tuple(d for d in n.ctrl_deps if d in waits)
    common = dict(id=n.id, name=n.name, lane=_lane(n, streams), duration_s=n.duration_s,
                  ctrl_deps=ctrl, data_deps=tuple(d for d in waits if d not in ctrl))
    where = f"{et.path}: node {n.id} ({n.name!r})"
    if n.is_cpu_op and n.kind != "compute":  # (host time: a c10d operator, a metadata node)
        return Node(kind="compute", category="cpu", **common)
    if n.kind == "collective":
        if n.attrs.get("trainsim_priced") or n.op not in COLLECTIVE_OPS:
            if n.duration_s <= 0 and n.op not in COLLECTIVE_OPS:
                raise InputError(f"{where}: comm_type {n.op.upper()}: trainsim prices "
                                 f"{', '.join(o for o in COLLECTIVE_OPS)} on the network; another collective is "
                                 "replayed at its duration_micros, which is 0 here")
            return Node(kind="comm", category="comm", op=n.op if n.op in COLLECTIVE_OPS else "", nbytes=n.nbytes,
                        **common)
        return Node(kind="collective", category="comm", op=n.op, group=n.group, nbytes=n.nbytes,
                    pg_name=str(n.attrs.get("trainsim_category") or n.pg_name), **_claim(n), **common)
    if n.kind in ("send", "recv"):
        own = n.src if n.kind == "send" else n.dst
        if own != et.rank:
            field = "comm_src" if n.kind == "send" else "comm_dst"
            raise InputError(f"{where}: {field}: got {own}; a {n.kind} in rank {et.rank}'s trace is rank {et.rank}'s")
        if n.attrs.get("trainsim_priced"):  # (half of a shift trainsim priced outside the network)
            return Node(kind="comm", category="comm", nbytes=n.nbytes, **common)
        return Node(kind=n.kind, category="comm", peer=n.peer, nbytes=n.nbytes, **_claim(n), **common)
    if n.kind == "compute" and n.attrs.get("trainsim_comm"):
        return Node(kind="comm", category="comm", **common)
    if n.kind == "compute":
        cat = n.attrs.get("trainsim_category")
        category = ("cpu" if n.is_cpu_op else "gemm" if cat in _GEMM_WORK else "memory" if cat in _MEMORY_WORK
                    else kernel_category(n.name))
        return Node(kind="compute", category=category, flops=n.flops, **common)
    if n.kind in ("mem_load", "mem_store"):
        return Node(kind="compute", category="memory", **common)
    return Node(kind="compute", category="cpu", **{**common, "duration_s": 0.0})
