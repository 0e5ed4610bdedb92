"""Actions and programs: what each rank does, as data.

A ``Program`` maps each rank to its list of ``Action``s. An action runs on one of its
rank's *streams* (like a CUDA stream: ``compute``, ``comm``, or any other name); actions
on one stream run one at a time, in list order, and actions on different streams
overlap. An action may also wait for other actions, on its own rank or another, named
in ``deps``.

Kinds of action:

- ``compute``: busy its stream for ``duration_s`` (costs come from outside: the engine
  knows no hardware figures). ``flops`` and ``nbytes`` are carried for metrics.
- ``send`` / ``recv``: a point-to-point transfer of ``nbytes`` to / from ``peer``. They
  rendezvous as NCCL does: the transfer starts once both sides have reached their
  action, and both actions end when it arrives. The n-th send from a to b with a given
  ``tag`` (or none) matches the n-th recv on b from a with the same tag.
- ``comm``: communication priced outside the network model: it busies its stream for
  ``duration_s`` like compute, but counts as communication. Used when collectives that
  provably have their links to themselves are coalesced (``sim.program.training``). With a
  ``group`` of two or more simulated ranks, it is a meeting: each member's action of the
  same name starts when the last member is ready to start its own.
- ``copy``: ``nbytes`` between the GPU and its host CPU (``op`` "d2h" or "h2d") over
  their host route: PCIe, or NVLink-C2C on a Grace superchip (optimizer and activation offload).
- ``collective``: ``op`` over ``group`` with ``nbytes`` (see ``sim.engine.algorithms``).
  Every rank of the group runs the same action; it starts when all have arrived, and
  each rank's action ends when its own part of the transfers is done. The n-th untagged
  collective on a group matches the n-th on each member. An NCCL collective first pays
  NCCL's base latency (``sim.engine.nccl``); one whose ``transport`` is ``direct`` does not.

What a collective takes from its GPU beside its links is its claim, two fields in the
engine's own terms, which passes map their libraries' settings onto (``sim.program.tp``
maps Transformer Engine's tensor-parallel overlap): ``transport``, what moves its bytes
(``TRANSPORTS``: an NCCL kernel, with NCCL's base latency, per-step latencies and rate caps,
or ``direct`` peer-to-peer writes, by copy engines or a kernel outside NCCL, priced on the
links alone), and ``slows_compute``, whether it (or a send's transfer) holds SMs that the compute beside it is
not already priced without (then the engine's overlap slowdown, ``sim.engine.slowdown``,
applies while it moves data).

Names are unique per rank; a dependency is a name on the same rank or ``(rank, name)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import wraps

from sim.errors import InputError
from sim.inputs.schema_sim import COLLECTIVE_ALGOS, COLLECTIVE_OPS, COLLECTIVE_PROTOCOLS

OPS = COLLECTIVE_OPS
"""Collective operations an action may name (``sim.engine.algorithms`` builds each)."""
ALGOS = COLLECTIVE_ALGOS
"""Collective algorithms (``sim.engine.algorithms``, ``sim.engine.algorithms_nccl``); auto:
NCCL's choice (``sim.engine.nccl``)."""
PROTOCOLS = COLLECTIVE_PROTOCOLS
"""NCCL protocols (``sim.engine.nccl``); auto: NCCL's choice by size."""
FLOW_PIECES = 4
"""Transfers a ring hop's flow is cut into under the ``flows`` collective model (each pays
its share of the steps' latencies; ``sim.engine.algorithms``)."""
KINDS = ("compute", "comm", "send", "recv", "collective", "copy")
TRANSPORTS = ("nccl", "direct")
"""What moves a collective's bytes (``Action.transport``): ``nccl``, an NCCL kernel (NCCL's
base latency, per-step latencies and rate caps; the tuner's choice counts them); ``direct``,
peer-to-peer writes outside NCCL (copy engines, or a library's own kernel), priced on the
links alone, with no base latency."""

Ref = tuple[int, str]


@dataclass(slots=True, unsafe_hash=True)
class _ActionFields:
    """What an action holds; ``Action`` (below) is the class every action has.

    Not a frozen dataclass, for speed: passes build millions of actions, and a frozen
    dataclass sets each field through ``object.__setattr__``, several times slower than
    the plain stores of this class's ``__init__``. Actions are still never changed once
    made (one action object is shared by every GPU whose program holds it, after
    ``sim.program.passes.expand``): a pass makes a changed copy with ``Action.evolve``.
    Equality and hashing go by the fields, as a frozen dataclass's do."""

    name: str
    kind: str = "compute"
    stream: str = ""
    """Default: ``compute`` for compute and comm actions, ``comm`` for the others."""
    duration_s: float = 0.0
    flops: float = 0.0
    nbytes: float = 0
    peer: int | None = None
    group: tuple[int, ...] = ()
    op: str = ""
    algo: str = "ring"
    protocol: str = "simple"
    channels: int = 0
    """Rings a ring collective runs at once; 0 picks ``sim.inputs.topology.default_channels``."""
    tag: str = ""
    category: str = ""
    """What the action is for, used for colours and metrics (e.g. F, B, W, tp, pp, dp)."""
    layer: int | None = None
    """The model layer a compute action works on (-1 embedding, num_layers the output
    head), for passes that act per layer (gradient buckets, ZeRO-3 gathers)."""
    mem: tuple = ()
    """Memory changes of this rank's GPU as (when, category, bytes): when is "start" or
    "end" of the action, bytes > 0 allocates and < 0 frees (see ``sim.results.memory_timeline``)."""
    deps: tuple = field(default=())
    """Names of actions on this rank, or (rank, name) pairs, that must finish first."""
    transport: str = "nccl"
    """What moves a collective's bytes (one of ``TRANSPORTS``): ``nccl`` pays NCCL's base
    latency (``sim.engine.nccl.base_latency``), per-step latencies and rate caps;
    ``direct`` (copy engines or a kernel outside NCCL) is priced on its links alone."""
    slows_compute: bool = True
    """Whether a collective (or a send/recv pair, by its send's) holds SMs that the compute
    beside it on its GPU is not already priced without: while it moves data, the engine's
    overlap slowdown (``sim.engine.slowdown``) applies. False: its bytes move by copy
    engines, or the compute's durations already leave it its SMs."""


_fill = _ActionFields.__init__
"""dataclasses' ``__init__`` of the fields: sets each from its argument or its declared
default, in one straight line of attribute stores, and checks nothing."""
_new_object = object.__new__


class Action(_ActionFields):
    """One step of one rank's work. ``Action(...)`` checks what it is given (the user
    boundary); ``Action.new`` and ``Action.evolve`` (what passes call, millions of times,
    on values already checked) do not."""

    __slots__ = ()

    @wraps(_fill)  # (its signature: the fields)
    def __init__(self, *args, **kwargs):
        _fill(self, *args, **kwargs)
        if self.kind not in KINDS:
            raise InputError(f"action {self.name!r}: kind: got {self.kind!r}; allowed: {', '.join(KINDS)}")
        for key in ("duration_s", "flops", "nbytes"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v < math.inf):
                raise InputError(f"action {self.name!r}: {key}: got {v!r}; expected a finite number >= 0")
        if self.kind in ("send", "recv") and (self.peer is None or self.peer < 0):
            raise InputError(f"action {self.name!r}: peer: got {self.peer!r}; a {self.kind} needs a peer rank >= 0")
        if self.kind == "copy" and self.op not in ("d2h", "h2d"):
            raise InputError(f"action {self.name!r}: op: got {self.op!r}; a copy is 'd2h' or 'h2d'")
        if self.kind == "collective":
            if self.op not in OPS or self.op == "sendrecv":
                raise InputError(f"action {self.name!r}: op: got {self.op!r}; allowed: {', '.join(o for o in OPS if o != 'sendrecv')}")
            if self.algo not in ALGOS:
                raise InputError(f"action {self.name!r}: algo: got {self.algo!r}; allowed: {', '.join(ALGOS)}")
            if self.transport not in TRANSPORTS:
                raise InputError(f"action {self.name!r}: transport: got {self.transport!r}; allowed: {', '.join(TRANSPORTS)}")
            if self.protocol not in PROTOCOLS:
                raise InputError(f"action {self.name!r}: protocol: got {self.protocol!r}; allowed: {', '.join(PROTOCOLS)}")
            self.group = tuple(self.group)
        if not self.stream:
            self.stream = "compute" if self.kind in ("compute", "comm") else "comm"
        self.deps = tuple(d if isinstance(d, str) else (int(d[0]), str(d[1])) for d in self.deps)
        for m in self.mem:
            if len(m) != 3 or m[0] not in ("start", "end") or not isinstance(m[1], str) \
                    or isinstance(m[2], bool) or not isinstance(m[2], (int, float)) or not math.isfinite(m[2]):
                raise InputError(f"action {self.name!r}: mem: got {m!r}; expected (\"start\"|\"end\", category, bytes)")

    def evolve(self, **changes) -> "Action":
        """A copy with some fields changed, for passes (whose inputs were checked when
        first built): skips the checks, which matter at the user boundary and cost time
        on programs of millions of actions. ``deps`` must already be normalized."""
        a = _copy(self)
        for key, value in changes.items():
            setattr(a, key, value)
        return a

    @staticmethod
    def new(name: str, **fields_) -> "Action":
        """An action built by a pass from values already checked: the same fields and
        defaults as ``Action(...)`` without the checks (``deps`` a tuple of names or
        (rank, name) pairs, numbers finite and >= 0)."""
        a = _new_object(Action)
        _fill(a, name, **fields_)
        if not a.stream:
            a.stream = "compute" if a.kind in ("compute", "comm") else "comm"
        return a


def with_peer(action: Action, peer: int) -> Action:
    """``action.evolve(peer=peer)``, for the passes that copy millions of sends and receives."""
    a = _copy(action)
    a.peer = peer
    return a


def _copy(action: Action) -> Action:
    """A new ``Action`` with ``action``'s fields: the plain stores a copy takes (every
    field, in declaration order; ``tests/test_actions.py`` checks that none is missed)."""
    a = _new_object(Action)
    a.name = action.name
    a.kind = action.kind
    a.stream = action.stream
    a.duration_s = action.duration_s
    a.flops = action.flops
    a.nbytes = action.nbytes
    a.peer = action.peer
    a.group = action.group
    a.op = action.op
    a.algo = action.algo
    a.protocol = action.protocol
    a.channels = action.channels
    a.tag = action.tag
    a.category = action.category
    a.layer = action.layer
    a.mem = action.mem
    a.deps = action.deps
    a.transport = action.transport
    a.slows_compute = action.slows_compute
    return a


class Program:
    """Per-rank action lists, checked for consistency when built.

    ``shadows`` are ranks of the cluster that are not simulated because they do exactly
    what a simulated rank does (data-parallel replicas, under reduced fidelity). They may
    be members of collectives: each is taken to arrive with the simulated members, and
    its transfers still cross the network.
    """

    def __init__(self, actions: dict[int, list[Action]], shadows=(), check: bool = True,
                 like: dict[int, int] | None = None):
        self.actions: dict[int, tuple[Action, ...]] = {int(r): tuple(a) for r, a in sorted(actions.items())}
        self.shadows = frozenset(int(r) for r in shadows) - set(self.actions)
        self.like = like or {}
        """Rank g -> rank t when g's actions are t's with other ranks renamed: at every
        position the same name, kind, stream, duration, memory changes, same-rank
        dependencies and every other field; only peers, groups and the ranks of
        dependencies differ (what
        ``sim.program.passes.expand`` makes). The engine then indexes t's structure once
        for all of them. Ranks not listed are indexed on their own."""
        self.checked = False
        if check:
            self.check()

    @property
    def ranks(self) -> list[int]:
        return list(self.actions)

    def __len__(self) -> int:
        return sum(len(a) for a in self.actions.values())

    def resolve(self, rank: int, dep) -> Ref:
        return (rank, dep) if isinstance(dep, str) else dep

    def check(self) -> None:
        """Names unique per rank, dependencies and peers exist, collective groups valid.
        Runs once per program; passes build intermediate programs unchecked and the
        engine checks the final one."""
        if self.checked:
            return
        names: dict[int, set[str]] = {}
        for r, acts in self.actions.items():
            seen = {a.name for a in acts}
            if len(seen) != len(acts):  # find the first repeat, in order
                seen = set()
                for a in acts:
                    if a.name in seen:
                        raise InputError(f"program: rank {r}: action name {a.name!r} appears twice; names must be unique per rank")
                    seen.add(a.name)
            names[r] = seen
        groups_seen: set[tuple] = set()
        for r, acts in self.actions.items():
            mine = names[r]
            for a in acts:
                for d in a.deps:
                    if d.__class__ is str and d in mine:
                        continue
                    dr, dn = self.resolve(r, d)
                    if dn not in names.get(dr, ()):
                        raise InputError(f"program: rank {r}: action {a.name!r}: dependency {dr}:{dn} is not an action in the program")
                kind = a.kind
                if kind == "compute":
                    continue
                if kind in ("send", "recv") and (a.peer not in self.actions or a.peer == r):
                    raise InputError(f"program: rank {r}: action {a.name!r}: peer: got {a.peer}; expected another rank of the program")
                if kind == "collective":
                    if r not in a.group:
                        raise InputError(f"program: rank {r}: action {a.name!r}: group {list(a.group)} does not include rank {r}")
                    if a.group not in groups_seen:
                        missing = [g for g in a.group if g not in self.actions and g not in self.shadows]
                        if missing:
                            raise InputError(f"program: rank {r}: action {a.name!r}: group ranks {missing} have no actions in the program")
                        groups_seen.add(a.group)
        self.checked = True

    def max_rank(self) -> int:
        return max([*self.actions, *self.shadows], default=-1)

    def with_actions(self, actions: dict[int, list[Action]]) -> "Program":
        """A program with new action lists and the same shadows (what passes return);
        checked when simulated."""
        return Program(actions, self.shadows, check=False)
