"""A program out as Chakra execution traces: one ET per rank, for ASTRA-sim and Chakra's tools.

``write_chakra`` writes ``trainsim.<r>.et`` for every rank of a ``Program`` and a
``comm_group.json`` beside them, so that ASTRA-sim runs them as

    astra-sim ... --workload-configuration DIR/trainsim --comm-group-configuration DIR/comm_group.json

Each file is what Chakra's ``protolib`` writes: length-prefixed protobuf messages of
``et_def.proto`` (``sim.inputs.chakra_schema``), a ``GlobalMetadata`` first (version
"0.0.4", as ASTRA-sim's example ETs have it; trainsim's rank, world size, stream names),
then one ``Node`` per action:

- ``compute`` -> ``COMP_NODE`` with ``duration_micros`` (rounded to whole microseconds, the
  schema's unit; ``trainsim_duration_s`` keeps the exact value), ``num_ops`` (FLOPs) and
  ``tensor_size`` (bytes moved);
- ``collective`` -> ``COMM_COLL_NODE`` with ``comm_type``, ``comm_size`` (bytes, the
  buffer as nccl-tests sizes it, as trainsim's ``nbytes`` is) and ``pg_name``, the id of
  its group in ``comm_group.json`` (ids from 1: ASTRA-sim takes "0" for every rank);
  its duration is 0, for the simulator to price;
- ``comm`` (communication priced outside the network model) -> the same, with its
  duration and ``trainsim_priced`` true; a ``comm`` without a group or a collective type
  (what ``trainsim replay`` could only time in a trace) -> a ``COMP_NODE`` of its duration
  with ``trainsim_comm`` true;
- ``send`` / ``recv`` -> ``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` with ``comm_src``,
  ``comm_dst``, ``comm_size`` and ``comm_tag`` (trainsim's tags numbered in sorted order
  from 1, untagged 0: the n-th send from a to b with a tag still meets the n-th receive);
- a ``shift`` (each rank's buffer to the next rank of the group, ring attention's
  exchange), which Chakra has no collective for, -> a send to the next rank and a
  receive from the previous one, both of its size, the receive on a stream of its own
  (``<stream> (shift recv)``) so that the two overlap as the shift's transfers do;
- ``copy`` -> ``MEM_STORE_NODE`` (device to host) or ``MEM_LOAD_NODE`` (host to device)
  with ``tensor_size``, and the duration the run simulated for it when the run's trace is
  given (``write_chakra_files``; a program alone leaves copies to the PCIe link's model).

Every node has ``is_cpu_op`` false, its ``stream`` (an index into the metadata's
``trainsim_streams``) and ``trainsim_category``; a collective whose claim is not an NCCL kernel's default (``Action.transport``,
``Action.slows_compute``) has ``trainsim_transport`` (e.g. ``direct``: moved outside NCCL,
as the tensor-parallel overlap's chunks are) and ``trainsim_slows_compute`` false where it
leaves the compute beside it its SMs (on a shift's send and receive, and on a send or
receive, too). Dependencies: ``ctrl_deps`` holds the
node issued just before it on its stream (CUDA-stream order); ``data_deps`` holds that
and every same-rank action it waits for, since simulators schedule by ``data_deps``
alone (ASTRA-sim's ET feeder does). A program's dependencies on another rank's actions
have no form in Chakra (ranks meet only through communication nodes) and are left out;
``ChakraExport.cross_rank_deps`` counts them. Nodes are written in an order where every
node comes after those it waits for; a node's id is its action's position in the
rank's list (a shift's receive takes the next free id after the last action).

The program must hold every rank: a reduced-fidelity program (whose shadows are not
simulated) is refused, as ASTRA-sim needs each rank's trace.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from pathlib import Path

from sim.errors import InputError
from sim.fileio import atomic_path
from sim.inputs.chakra_schema import COMM_TYPES, NODE_TYPES, encode_stream, messages

VERSION = "0.0.4"
"""``GlobalMetadata.version``, as ASTRA-sim's example ETs carry it."""
PREFIX = "trainsim"
"""ET files are ``PREFIX.<rank>.et`` (ASTRA-sim's ``--workload-configuration DIR/PREFIX``)."""
COMM_GROUP_FILE = "comm_group.json"
COMM_TYPE_OF = {"allreduce": "ALL_REDUCE", "allgather": "ALL_GATHER", "reducescatter": "REDUCE_SCATTER",
                "broadcast": "BROADCAST", "alltoall": "ALL_TO_ALL"}
"""trainsim collective -> Chakra ``CollectiveCommType`` (``shift`` becomes a send and a receive)."""


@dataclass(frozen=True)
class ChakraExport:
    """What ``chakra_files`` made: each file's bytes by name, and what it could not carry."""

    files: dict[str, bytes]
    comm_groups: dict[str, list[int]]
    cross_rank_deps: int
    """Dependencies on other ranks' actions, which Chakra cannot express (left out)."""


def chakra_files(program, *, world_size: int | None = None, device_name: str = "",
                 iteration_time_s: float | None = None, trace=None) -> ChakraExport:
    """Every rank's ET (and the comm-group file) as bytes, by file name, built in memory
    so that nothing is written when something is refused. ``device_name`` (the GPU
    profile) and ``iteration_time_s`` (the simulated iteration) go into the metadata, for
    ``trainsim replay`` of the files. ``trace``: the run's, whose spans give each host copy
    its duration (the program leaves copies to the PCIe link's model)."""
    if program.shadows:
        n, world = len(program.actions), len(program.actions) + len(program.shadows)
        raise InputError(f"--export-chakra: the run simulated {n} of its {world} GPUs (reduced fidelity); "
                         "Chakra needs every rank's trace: add --fidelity full")
    M = messages()
    world = world_size if world_size is not None else program.max_rank() + 1
    groups: dict[tuple, int] = {}
    tags: set[str] = set()
    for acts in program.actions.values():
        for a in acts:
            if a.kind in ("collective", "comm") and a.op in COMM_TYPE_OF and a.group:  # (as _rank_nodes: below)
                groups.setdefault(tuple(a.group), 0)
            if a.kind in ("send", "recv") or a.op == "shift":
                tags.add(a.tag)
    for i, g in enumerate(sorted(groups, key=lambda g: (len(g), g)), 1):
        groups[g] = i
    tag_ids = {t: i for i, t in enumerate(sorted(tags - {""}), 1)}
    tag_ids[""] = 0
    files, cross = {}, 0
    copies = {}
    if trace is not None:
        copies = {(sp.rank, sp.name): sp.end_s - sp.start_s for sp in trace.spans if sp.kind == "copy"}
    for r, acts in program.actions.items():
        nodes, dropped, streams = _rank_nodes(M, r, acts, groups, tag_ids, copies)
        cross += dropped
        meta = M.GlobalMetadata(version=VERSION, attr=[
            M.AttributeProto(name="schema", string_val=f"trainsim-{VERSION}"),
            M.AttributeProto(name="rank", int64_val=r),
            M.AttributeProto(name="world_size", int64_val=world),
            M.AttributeProto(name="trainsim_streams", string_list=M.StringList(values=streams)),
            *([M.AttributeProto(name="device_name", string_val=device_name)] if device_name else []),
            *([M.AttributeProto(name="trainsim_iteration_time_s", double_val=float(iteration_time_s))]
              if iteration_time_s is not None else [])])
        files[f"{PREFIX}.{r}.et"] = encode_stream([meta, *nodes])
    comm_groups = {str(i): list(g) for g, i in sorted(groups.items(), key=lambda kv: kv[1])}
    files[COMM_GROUP_FILE] = (json.dumps(comm_groups, indent=1) + "\n").encode()
    return ChakraExport(files, comm_groups, cross)


def write_chakra(program, out_dir: str | Path, **kw) -> ChakraExport:
    """Write ``chakra_files`` (``kw`` its keywords) into ``out_dir``, each file through a
    temporary and a rename."""
    export = chakra_files(program, **kw)
    out = Path(out_dir)
    for name, data in export.files.items():
        with atomic_path(out / name) as tmp:
            Path(tmp).write_bytes(data)
    return export


def chakra_line(export: ChakraExport, out_dir) -> str:
    """What ``--export-chakra`` wrote, in a line (and what it left out)."""
    ranks = sum(name.endswith(".et") for name in export.files)
    left = (f"; {export.cross_rank_deps} dependencies on other ranks' actions have no Chakra form and were left out"
            if export.cross_rank_deps else "")
    return (f"wrote {Path(out_dir)}/{PREFIX}.<r>.et for {ranks} ranks and {COMM_GROUP_FILE} "
            f"({len(export.comm_groups)} communicator groups; Chakra execution traces){left}")


def _rank_nodes(M, rank: int, acts, groups: dict, tag_ids: dict, copies: dict):
    """One rank's ``Node`` messages in a dependency order, the number of cross-rank
    dependencies left out, and the stream names by index."""
    Attr = M.AttributeProto
    index = {a.name: i for i, a in enumerate(acts)}
    streams: list[str] = []
    stream_of: dict[str, int] = {}
    last_on: dict[str, int] = {}  # stream -> the index of the last action on it
    ends: dict[int, list[int]] = {}  # action index -> its node ids (a shift has two)
    next_id = len(acts)
    built = []  # (action index, [Node])
    cross = 0
    # The ids of each action's nodes first, so dependencies can name them in any order.
    for i, a in enumerate(acts):
        if a.op == "shift" and a.kind in ("collective", "comm"):
            ends[i] = [i, next_id]
            next_id += 1
        else:
            ends[i] = [i]
    waits: dict[int, set[int]] = {}
    on_gpu = Attr(name="is_cpu_op", bool_val=False)  # (attributes every node shares, made once)
    stream_attr: dict[int, object] = {}
    category_attr: dict[str, object] = {}
    for i, a in enumerate(acts):
        s = stream_of.setdefault(a.stream, len(stream_of))
        if s == len(streams):
            streams.append(a.stream)
        before = last_on.get(a.stream)
        last_on[a.stream] = i
        waits[i] = set() if before is None else {before}
        for d in a.deps:
            if d.__class__ is not str:
                if d[0] != rank:
                    cross += 1
                    continue
                d = d[1]
            waits[i].add(index[d])
        ctrl = [] if before is None else ends[before]
        data = [nid for j in waits[i] for nid in ends[j]]
        common = [on_gpu, stream_attr[s] if s in stream_attr else stream_attr.setdefault(
                      s, Attr(name="stream", int64_val=s)),
                  category_attr[a.category] if a.category in category_attr else category_attr.setdefault(
                      a.category, Attr(name="trainsim_category", string_val=a.category))]
        dur = [Attr(name="trainsim_duration_s", double_val=float(a.duration_s))]
        micros = round(a.duration_s * 1e6)
        made = []

        def node(nid: int, name: str, type_: str, attrs: list, duration: int = 0, own=common):
            n = M.Node(id=nid, name=name, type=NODE_TYPES[type_], ctrl_deps=sorted(ctrl), data_deps=sorted(data),
                       duration_micros=duration, attr=[*own, *attrs])
            made.append(n)

        size = [Attr(name="comm_size", int64_val=round(a.nbytes))]
        if a.kind == "compute":
            node(i, a.name, "COMP_NODE", [*dur, Attr(name="num_ops", int64_val=round(a.flops)),
                                          Attr(name="tensor_size", uint64_val=round(a.nbytes))], micros)
        elif a.kind == "comm" and not (a.group and (a.op in COMM_TYPE_OF or a.op == "shift")):
            node(i, a.name, "COMP_NODE", [*dur, Attr(name="trainsim_comm", bool_val=True)], micros)
        elif a.kind in ("collective", "comm") and a.op in COMM_TYPE_OF:
            priced = [*dur, Attr(name="trainsim_priced", bool_val=True)] if a.kind == "comm" else []
            pg = [Attr(name="pg_name", string_val=str(groups[tuple(a.group)]))] if a.group else []
            ub = [Attr(name="trainsim_transport", string_val=a.transport)] if a.transport != "nccl" else []
            if not a.slows_compute:
                ub.append(Attr(name="trainsim_slows_compute", bool_val=False))
            node(i, a.name, "COMM_COLL_NODE",
                 [Attr(name="comm_type", int64_val=COMM_TYPES[COMM_TYPE_OF[a.op]]), *size, *pg, *priced, *ub],
                 micros if a.kind == "comm" else 0)
        elif a.kind in ("collective", "comm") and a.op == "shift":
            order = sorted(a.group)
            k = order.index(rank)
            nxt, prev = order[(k + 1) % len(order)], order[k - 1]
            tag = [Attr(name="comm_tag", int32_val=tag_ids[a.tag])]
            priced = [*dur, Attr(name="trainsim_priced", bool_val=True)] if a.kind == "comm" else []
            t = micros if a.kind == "comm" else 0
            priced += [] if a.slows_compute else [Attr(name="trainsim_slows_compute", bool_val=False)]
            node(ends[i][0], f"{a.name} (shift: send)", "COMM_SEND_NODE",
                 [Attr(name="comm_src", int32_val=rank), Attr(name="comm_dst", int32_val=nxt), *size, *tag, *priced], t)
            # the receive on a stream of its own, so that the halves overlap as the shift's transfers do
            lane = f"{a.stream} (shift recv)"
            rs = stream_of.setdefault(lane, len(stream_of))
            if rs == len(streams):
                streams.append(lane)
            node(ends[i][1], f"{a.name} (shift: recv)", "COMM_RECV_NODE",
                 [Attr(name="comm_src", int32_val=prev), Attr(name="comm_dst", int32_val=rank), *size, *tag, *priced], t,
                 own=[common[0], Attr(name="stream", int64_val=rs), *common[2:]])
        elif a.kind in ("send", "recv"):
            src, dst = (rank, a.peer) if a.kind == "send" else (a.peer, rank)
            node(i, a.name, "COMM_SEND_NODE" if a.kind == "send" else "COMM_RECV_NODE",
                 [Attr(name="comm_src", int32_val=src), Attr(name="comm_dst", int32_val=dst), *size,
                  Attr(name="comm_tag", int32_val=tag_ids[a.tag]),
                  *([] if a.slows_compute else [Attr(name="trainsim_slows_compute", bool_val=False)])])
        elif a.kind == "copy":
            t = copies.get((rank, a.name), a.duration_s)
            node(i, a.name, "MEM_STORE_NODE" if a.op == "d2h" else "MEM_LOAD_NODE",
                 [Attr(name="trainsim_duration_s", double_val=float(t)), Attr(name="tensor_size", uint64_val=round(a.nbytes))],
                 round(t * 1e6))
        else:
            raise InputError(f"--export-chakra: rank {rank}: action {a.name!r}: kind {a.kind!r} with op {a.op!r} "
                             "has no Chakra node type")
        built.append(made)
    return [n for i in _dependency_order(waits) for n in built[i]], cross, streams



def _dependency_order(waits: dict[int, set[int]]) -> list[int]:
    """Action indices in an order where each comes after those it waits for, the lowest
    index first among those ready (the program's own order when it already is one)."""
    users: dict[int, list[int]] = {}
    left = {}
    for i, deps in waits.items():
        deps = deps - {i}
        left[i] = len(deps)
        for d in deps:
            users.setdefault(d, []).append(i)
    ready = [i for i, k in left.items() if k == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        i = heapq.heappop(ready)
        out.append(i)
        for u in users.get(i, ()):
            left[u] -= 1
            if left[u] == 0:
                heapq.heappush(ready, u)
    if len(out) < len(waits):  # (a cycle: the engine would have reported a deadlock; keep the rest in list order)
        out += sorted(set(waits) - set(out))
    return out
