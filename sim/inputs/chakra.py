"""Chakra execution traces in: one ET per rank, read into a per-rank dependency graph.

A Chakra ET (``sim.inputs.chakra_schema`` has the format) lists a rank's nodes: compute
(``COMP_NODE``), collectives (``COMM_COLL_NODE``), point-to-point sends and receives
(``COMM_SEND_NODE`` / ``COMM_RECV_NODE``), memory loads and stores, and metadata. Each node
names the nodes it waits for: ``data_deps`` (what simulators schedule by: ASTRA-sim's ET
feeder runs a node once all of them are done) and ``ctrl_deps`` (Chakra's PyTorch converter
puts the calling CPU operator there; ``sim.results.export_chakra`` the node issued before
it on its stream). ``read_ets`` checks each file strictly and returns, per rank, an
``EtRank`` of ``EtNode``s: kind, duration in seconds, collective operation, bytes, the
communicator group's ranks, peer and tag, stream, and both dependency lists. It knows
nothing of trainsim's programs; an adapter turns the graph into one.

Conventions followed, as Chakra's tools and ASTRA-sim write and read them:

- a file ``NAME.<r>.et`` is rank r's (ASTRA-sim's ``--workload-configuration NAME``);
  files without that number take their place in the list given;
- ``duration_micros`` is whole microseconds (``trainsim_duration_s``, which trainsim's
  exporter adds, is the exact value in seconds and wins when present);
- ``comm_size`` is bytes: the buffer as nccl-tests sizes it (ASTRA-sim's 1 MB all-gather
  microbenchmark has ``comm_size`` 1,048,576 on every rank);
- ``pg_name`` names a group of a comm-group file, a JSON object ``{"1": [0, 1], ...}``
  (ASTRA-sim's ``--comm-group-configuration``); an empty ``pg_name``, or ``"0"``, is every rank;
- a send's ``comm_src`` and a receive's ``comm_dst`` default to the file's own rank
  (ASTRA-sim's feeder does the same; its custom-collective ETs leave them out);
- a communication node with ``is_cpu_op`` true is the host side of a collective (Chakra's
  older PyTorch converter writes ``c10d::allreduce_`` so, beside the kernel's node): CPU
  time, with no size or group required.

Refused, each in one line naming the file: a file that is not a stream of length-prefixed
Chakra messages (a JSON file, random bytes), a truncated one, a node whose type is not in
the schema, a repeated node id, a data dependency on a node the file lacks, a cycle of
data dependencies, a
collective (on the GPU) without ``comm_type`` or ``comm_size``, a send or receive without its peer, a
``pg_name`` the comm-group file lacks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from sim.errors import InputError
from sim.inputs.chakra_schema import COMM_TYPES, NODE_TYPES, FramingError, iter_stream, messages

KINDS = {"COMP_NODE": "compute", "COMM_COLL_NODE": "collective", "COMM_SEND_NODE": "send",
         "COMM_RECV_NODE": "recv", "MEM_LOAD_NODE": "mem_load", "MEM_STORE_NODE": "mem_store",
         "METADATA_NODE": "metadata", "INVALID_NODE": "invalid"}
"""Chakra node type -> the graph's node kind."""
OPS = {"ALL_REDUCE": "allreduce", "ALL_GATHER": "allgather", "REDUCE_SCATTER": "reducescatter",
       "BROADCAST": "broadcast", "ALL_TO_ALL": "alltoall", "REDUCE": "reduce", "GATHER": "gather",
       "SCATTER": "scatter", "REDUCE_SCATTER_BLOCK": "reducescatter_block", "BARRIER": "barrier"}
"""Chakra ``CollectiveCommType`` -> operation name (the first five are trainsim's own
names, ``sim.program.actions.OPS``; the rest have no trainsim equivalent)."""
_TYPE_NAMES = {v: k for k, v in NODE_TYPES.items()}
_COMM_NAMES = {v: k for k, v in COMM_TYPES.items()}
_RANK_IN_NAME = re.compile(r"\.(\d+)\.et(\.gz)?$")


@dataclass(frozen=True)
class EtNode:
    """One node of a rank's execution trace, in SI units."""

    id: int
    name: str
    kind: str
    """compute, collective, send, recv, mem_load, mem_store, metadata or invalid (``KINDS``)."""
    duration_s: float = 0.0
    data_deps: tuple[int, ...] = ()
    ctrl_deps: tuple[int, ...] = ()
    op: str = ""
    """A collective's operation (``OPS``)."""
    nbytes: float = 0.0
    """Bytes: ``comm_size`` of a communication node, ``tensor_size`` of a compute or memory node."""
    flops: float = 0.0
    """``num_ops`` of a compute node."""
    group: tuple[int, ...] = ()
    """A collective's ranks, in the order the comm-group file lists them."""
    pg_name: str = ""
    src: int | None = None
    dst: int | None = None
    tag: int = 0
    stream: int | None = None
    is_cpu_op: bool = False
    attrs: dict = field(default_factory=dict, compare=False, hash=False)
    """Every attribute of the node by name, as written (Chakra's units)."""

    @property
    def peer(self) -> int | None:
        """The other rank of a send (its destination) or receive (its source)."""
        return self.dst if self.kind == "send" else self.src if self.kind == "recv" else None


@dataclass(frozen=True)
class EtRank:
    """One rank's execution trace: its nodes in file order and its global metadata."""

    rank: int
    path: str
    version: str
    nodes: tuple[EtNode, ...]
    metadata: dict = field(default_factory=dict, compare=False, hash=False)
    dropped_ctrl_deps: int = 0
    """Control dependencies on nodes the file does not hold (Chakra's converter leaves
    some, to operators it removed); left out of ``ctrl_deps``."""


def attr_value(attr):
    """An ``AttributeProto``'s value: a number, bool, string or bytes, or a list of them."""
    which = attr.WhichOneof("value")
    if which is None:
        return None
    v = getattr(attr, which)
    return list(v.values) if which.endswith("_list") else v


def read_comm_groups(path: str | Path) -> dict[str, tuple[int, ...]]:
    """A comm-group file: a JSON object from group id (a string of digits) to its list of
    ranks, as ASTRA-sim reads it."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: not a comm-group file: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{p}: not a comm-group file: got a JSON {type(doc).__name__}; "
                         "expected an object {\"<group id>\": [rank, ...]}")
    groups = {}
    for key, ranks in doc.items():
        if not key.isdigit():
            raise InputError(f"{p}: group {key!r}: expected a group id of digits, as ASTRA-sim reads it")
        if not isinstance(ranks, list) or not ranks or not all(
                isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
            raise InputError(f"{p}: group {key}: got {ranks!r}; expected a non-empty list of ranks >= 0")
        if len(set(ranks)) != len(ranks):
            raise InputError(f"{p}: group {key}: got {ranks!r}; a rank appears twice")
        groups[key] = tuple(ranks)
    return groups


def read_ets(paths, comm_groups: str | Path | dict | None = None, *, world_size: int | None = None
             ) -> dict[int, EtRank]:
    """Each rank's ``EtRank`` from its ET file, by rank. ``comm_groups``: a comm-group file
    (or its ``read_comm_groups`` dict); None looks for ``comm_group.json`` beside the first
    ET. ``world_size`` (default: the number of files) sizes the group of every rank, which
    a collective with no ``pg_name`` runs over."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise InputError("chakra: no execution traces given; expected one .et file per rank")
    ranks: dict[int, Path] = {}
    for i, p in enumerate(paths):
        m = _RANK_IN_NAME.search(p.name)
        r = int(m.group(1)) if m else i
        if r in ranks:
            raise InputError(f"{p}: rank {r}: {ranks[r]} is rank {r} too; give one execution trace per rank")
        ranks[r] = p
    world = world_size if world_size is not None else max(len(ranks), max(ranks) + 1)
    where = "the comm groups given"
    if comm_groups is None:
        beside = paths[0].parent / "comm_group.json"
        comm_groups = beside if beside.is_file() else {}
        if not comm_groups:
            where = f"a comm-group file ({beside} does not exist)"
    groups = read_comm_groups(comm_groups) if isinstance(comm_groups, (str, Path)) else dict(comm_groups)
    if isinstance(comm_groups, (str, Path)):
        where = str(comm_groups)
    return {r: _read_one(ranks[r], r, groups, where, world) for r in sorted(ranks)}


def _read_one(path: Path, rank: int, groups: dict, groups_from: str, world: int) -> EtRank:
    M = messages()
    from google.protobuf.message import DecodeError

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    not_et = f"{path}: not a Chakra execution trace"
    if not data:
        raise InputError(f"{not_et}: the file is empty (expected a GlobalMetadata message, then Node messages)")

    def parse(i: int, body: bytes, cls):
        msg = cls()
        try:
            msg.ParseFromString(body)
        except DecodeError as exc:
            raise InputError(f"{not_et}: message {i} is not a Chakra {cls.DESCRIPTOR.name} ({exc})") from None
        unknown = _unknown_fields(msg)
        if unknown:
            raise InputError(f"{not_et}: message {i} has fields {unknown} that the {cls.DESCRIPTOR.name} "
                             "of et_def.proto does not define")
        return msg

    meta, raw = None, []
    try:
        for i, body in enumerate(iter_stream(data)):
            if i == 0:
                meta = parse(0, body, M.GlobalMetadata)
                if not meta.version and not len(meta.attr):
                    raise InputError(f"{not_et}: message 0 is not a GlobalMetadata (it has no version and no "
                                     "attributes)")
            else:
                raw.append(parse(i, body, M.Node))
    except FramingError as exc:
        raise InputError(f"{not_et}: {exc.detail}") from None
    metadata = {a.name: attr_value(a) for a in meta.attr}
    ids = set()
    for i, n in enumerate(raw, 1):
        if n.type not in _TYPE_NAMES:
            raise InputError(f"{path}: node {n.id} ({n.name!r}): type: got {n.type}; allowed: "
                             f"{', '.join(f'{k} ({v})' for k, v in NODE_TYPES.items())}")
        if n.id in ids:
            raise InputError(f"{path}: node id {n.id} appears twice (message {i}); node ids must be unique")
        ids.add(n.id)
    nodes, dropped = [], 0
    for n in raw:
        for d in n.data_deps:
            if d not in ids:
                raise InputError(f"{path}: node {n.id} ({n.name!r}): data_deps: node {d} is not in the file")
        ctrl = tuple(d for d in n.ctrl_deps if d in ids)
        dropped += len(n.ctrl_deps) - len(ctrl)
        nodes.append(_node(path, rank, n, ctrl, groups, groups_from, world))
    _check_acyclic(path, nodes)
    return EtRank(rank, str(path), meta.version, tuple(nodes), metadata, dropped)


def _unknown_fields(msg) -> list[int]:
    try:
        from google.protobuf.unknown_fields import UnknownFieldSet
    except ImportError:  # (older protobuf: no check)
        return []
    return sorted({f.field_number for f in UnknownFieldSet(msg)})


def _node(path: Path, rank: int, n, ctrl: tuple, groups: dict, groups_from: str, world: int) -> EtNode:
    attrs = {a.name: attr_value(a) for a in n.attr}
    type_name = _TYPE_NAMES[n.type]
    kind = KINDS[type_name]
    exact = attrs.get("trainsim_duration_s")
    duration = float(exact) if isinstance(exact, float) and exact >= 0 else n.duration_micros * 1e-6
    where = f"{path}: node {n.id} ({n.name!r})"

    def number(key: str, default=None):
        v = attrs.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise InputError(f"{where}: {key}: got {v!r}; expected a number >= 0")
        return v

    kw: dict = {}
    if attrs.get("is_cpu_op") and kind in ("collective", "send", "recv"):
        # The host side of a communication (Chakra's older PyTorch converter types the
        # c10d::allreduce_ operator so, beside its GPU kernel's node): CPU time, with
        # whatever size it gives; the checks below are for the GPU's node.
        kw["nbytes"] = float(number("comm_size", 0))
        return EtNode(id=n.id, name=n.name, kind=kind, duration_s=duration, data_deps=tuple(n.data_deps),
                      ctrl_deps=ctrl, is_cpu_op=True, attrs=attrs, **kw)
    if kind in ("collective", "send", "recv"):
        size = number("comm_size")
        if size is None:
            raise InputError(f"{where}: comm_size: missing; a {type_name} needs its size in bytes")
        kw["nbytes"] = float(size)
        kw["tag"] = int(number("comm_tag", 0))
    if kind == "collective":
        ct = attrs.get("comm_type")
        if ct is None:
            raise InputError(f"{where}: comm_type: missing; a COMM_COLL_NODE names its collective "
                             f"({', '.join(f'{k} ({v})' for k, v in COMM_TYPES.items())})")
        if ct not in _COMM_NAMES:
            raise InputError(f"{where}: comm_type: got {ct!r}; allowed: "
                             f"{', '.join(f'{k} ({v})' for k, v in COMM_TYPES.items())}")
        kw["op"] = OPS[_COMM_NAMES[ct]]
        pg = attrs.get("pg_name", "")
        pg = "" if pg is None else str(pg)
        if pg in ("", "0"):
            kw["group"] = tuple(range(world))
        elif pg in groups:
            kw["group"] = groups[pg]
        else:
            have = f" (groups: {', '.join(sorted(groups, key=int))})" if groups else ""
            raise InputError(f"{where}: pg_name: got {pg!r}; not a group of {groups_from}{have}; "
                             "give the comm-group file the ETs were written with (--comm-group FILE)")
        kw["pg_name"] = pg
    elif kind == "send":
        kw["src"] = int(number("comm_src", rank))
        dst = number("comm_dst")
        if dst is None:
            raise InputError(f"{where}: comm_dst: missing; a COMM_SEND_NODE names the rank it sends to")
        kw["dst"] = int(dst)
    elif kind == "recv":
        src = number("comm_src")
        if src is None:
            raise InputError(f"{where}: comm_src: missing; a COMM_RECV_NODE names the rank it receives from")
        kw["src"] = int(src)
        kw["dst"] = int(number("comm_dst", rank))
    elif kind in ("compute", "mem_load", "mem_store"):
        kw["nbytes"] = float(number("tensor_size", 0))
        kw["flops"] = float(number("num_ops", 0))
    stream = attrs.get("stream")
    return EtNode(id=n.id, name=n.name, kind=kind, duration_s=duration, data_deps=tuple(n.data_deps), ctrl_deps=ctrl,
                  stream=stream if isinstance(stream, int) and not isinstance(stream, bool) else None,
                  is_cpu_op=bool(attrs.get("is_cpu_op", False)), attrs=attrs, **kw)


def _check_acyclic(path: Path, nodes: list[EtNode]) -> None:
    """Refuse a cycle of data dependencies: no order could run it. (Control dependencies
    are not checked: in PyTorch-converted ETs they point to the calling operator, which may
    itself wait for its callees' data.)"""
    waits = {n.id: set(n.data_deps) for n in nodes}
    users: dict[int, list[int]] = {}
    for nid, deps in waits.items():
        for d in deps:
            users.setdefault(d, []).append(nid)
    left = {nid: len(deps) for nid, deps in waits.items()}
    ready = [nid for nid, k in left.items() if k == 0]
    done = 0
    while ready:
        nid = ready.pop()
        done += 1
        for u in users.get(nid, ()):
            left[u] -= 1
            if left[u] == 0:
                ready.append(u)
    if done < len(nodes):
        stuck = sorted(nid for nid, k in left.items() if k > 0)
        raise InputError(f"{path}: dependencies form a cycle among nodes {stuck[:8]}"
                         f"{' ...' if len(stuck) > 8 else ''}; no order can run them")
