"""Passes: pure functions Program -> Program that turn a schedule into training.

A pipeline schedule (``sim.program.schedules``) gives one compute action per step (``2F0``) on
each *pipeline* rank, with data dependencies between ranks as plain cross-rank deps
(communication for free). The passes below, applied in order, make it a full iteration
on every GPU:

1. ``replicate``: copy each pipeline rank's actions onto GPUs of that stage (data- and
   tensor-parallel replicas), rewiring deps to the matching replica. Training keeps one
   GPU per stage here (dp 0, tp 0) and runs the passes below on those alone.
2. ``add_tp_collectives``: cut each step into its per-layer compute segments and the
   Megatron tensor-parallel collectives between them (all-reduce, or all-gather /
   reduce-scatter with sequence parallelism), which block the compute that follows.
3. ``add_p2p``: replace every cross-stage dependency by a send on the producer and a
   receive on the consumer (activations forward, gradients backward), on one stream per
   peer and direction, posted in the producer's order so streams never cross-wait.
4. ``add_grad_sync``: DDP-style gradient buckets, filled in the order gradients become
   final (the last micro-batch's backward), each all-reduced over the data-parallel group
   as soon as it is full, overlapping the rest of backward (or all after backward).
5. ``add_optimizer``: the optimizer step after the rank's gradient syncs.
6. ``expand`` (after ``sim.program.zero``'s passes): copy each stage's program onto every
   GPU of the stage, moving peers, groups and cross-rank deps to that GPU's.

Sizes and durations come in as functions of the rank (and layer): the passes decide
where actions go and what they wait for, ``sim.program.memory`` and
``sim.program.costs`` (through ``sim.program.training``) how many bytes and seconds.

Action names are kept: the last action of a step keeps the step's name (``2F0``), so
dependencies on a step mean "the step is complete".
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from typing import Callable

from sim.program.actions import Action, Program, with_peer
from sim.program.tp import Segment, add_tp_collectives  # noqa: F401 (the pass, re-exported)


consume = partial(deque, maxlen=0)  # runs an iterator (a map of a setter) to its end


def replicate(prog: Program, world_size: int, coords: Callable[[int], tuple], rank_of: Callable[..., int],
              keep: Callable[[int], bool] | None = None) -> Program:
    """Copy pipeline rank p's actions to every GPU g with coords(g) = (dp, p, tp).

    With ``keep``, only the GPUs it accepts are simulated; the others become shadows
    (they do the same as a kept replica; see ``Program``)."""
    out: dict[int, list[Action]] = {}
    shadows = []
    cross: dict[int, list[int]] = {}  # per pipeline rank: where its actions wait on another rank
    for p, template in prog.actions.items():
        cross[p] = [k for k, a in enumerate(template) if any(dep.__class__ is not str for dep in a.deps)]
    for g in range(world_size):
        if keep is not None and not keep(g):
            shadows.append(g)
            continue
        d, p, t = coords(g)
        template = prog.actions.get(p, ())
        acts = list(template)
        peer: dict[int, int] = {}
        for k in cross.get(p, ()):
            a = template[k]
            deps = []
            for dep in a.deps:
                if dep.__class__ is not str:
                    q = peer.get(dep[0])
                    if q is None:
                        q = peer[dep[0]] = rank_of(dp=d, pp=dep[0], tp=t)
                    dep = (q, dep[1])
                deps.append(dep)
            acts[k] = a.evolve(deps=tuple(deps))
        out[g] = acts
    return Program(out, shadows)


def expand(template: Program, world_size: int, rep_of: Callable[[int], int], moved: Callable[[int, int], int],
           keep: Callable[[int], bool] | None = None,
           groups_of: Callable[[int], dict[tuple, tuple]] | None = None) -> Program:
    """Copy a template program onto every GPU: GPU g does what template rank ``rep_of(g)``
    does, with every other rank x that action names (a peer, a group member, the rank of
    a dependency) replaced by ``moved(x, g)``, the rank that plays for g the part x plays
    for ``rep_of(g)``. ``moved(., g)`` must be a bijection of the cluster that maps
    ``rep_of(g)`` to g and each of its groups onto g's; groups come out in rank order
    (the plan's order); ``groups_of(g)``, if given, maps some template groups to g's
    directly. With ``keep``, only the GPUs it accepts are simulated; the others become
    shadows.

    The passes then run once per pipeline stage instead of once per GPU, and the actions
    that name no other rank (compute, memory, the optimizer step) are one object shared
    by every GPU of the stage; actions whose group moves the same way on several GPUs
    (a tensor-parallel group's pieces, on its members) are shared by them."""
    template.check()
    # Per template rank, the actions that name other ranks, sorted by what they name:
    # sends and receives by peer, actions with a group and nothing else by group, the rest.
    by_peer: dict[int, dict[int, tuple[list, list]]] = {}
    by_group: dict[int, dict[tuple, tuple[list, list]]] = {}
    other: dict[int, list[tuple[int, Action, bool]]] = {}  # (position, action, whether it has cross-rank deps)
    for r, lst in template.actions.items():
        peers, grouped, rest = by_peer[r], by_group[r], other[r] = {}, {}, []
        for k, a in enumerate(lst):
            cross = any(d.__class__ is not str for d in a.deps)
            if a.peer is not None and not a.group and not cross:
                ks, acts = peers.setdefault(a.peer, ([], []))
            elif a.group and a.peer is None and not cross:
                ks, acts = grouped.setdefault(a.group, ([], []))
            elif cross or a.peer is not None or a.group:
                rest.append((k, a, cross))
                continue
            else:
                continue
            ks.append(k)
            acts.append(a)
    out: dict[int, list[Action]] = {}
    shadows = []
    shared: dict[tuple, list[Action]] = {}  # (template rank, group, its moved group) -> the moved actions
    evolve = Action.evolve
    for g in range(world_size):
        if keep is not None and not keep(g):
            shadows.append(g)
            continue
        rep = rep_of(g)
        lst = template.actions.get(rep, ())
        if g == rep:
            out[g] = list(lst)
            continue
        groups: dict[tuple, tuple] = dict(groups_of(g)) if groups_of is not None else {}

        def group_of(group: tuple) -> tuple:
            got = groups.get(group)
            if got is None:
                got = groups[group] = tuple(sorted(moved(x, g) for x in group))
            return got

        acts = list(lst)
        for peer, (ks, these) in by_peer[rep].items():  # a send or receive
            consume(map(acts.__setitem__, ks, map(with_peer, these, repeat(moved(peer, g)))))
        for group, (ks, these) in by_group[rep].items():  # the same on every GPU the group moves to
            grp = group_of(group)
            key = (rep, group, grp)
            made = shared.get(key)
            if made is None:
                made = shared[key] = [evolve(a, group=grp) for a in these]
            consume(map(acts.__setitem__, ks, made))
        for k, a, cross in other[rep]:  # (evolve's copy, its fields set straight: no dict of changes)
            b = evolve(a) if a.peer is None else with_peer(a, moved(a.peer, g))
            if a.group:
                b.group = group_of(a.group)
            if cross:
                b.deps = tuple([d if d.__class__ is str else (moved(d[0], g), d[1]) for d in a.deps])
            acts[k] = b
        out[g] = acts
    prog = Program(out, shadows, check=False, like={g: rep_of(g) for g in out})
    # Names, same-rank dependencies and groups' sizes are the template's; peers, groups and
    # dependencies moved by a bijection stay in the cluster. With every GPU simulated,
    # they all name simulated ranks or shadows, so the copy is as valid as the template.
    prog.checked = keep is None
    return prog


def add_p2p(prog: Program, nbytes: Callable[[Action], float],
            quiet: Callable[[int, int], bool] | None = None, blocking: bool = False) -> Program:
    """Replace each cross-rank dependency by a send after the producer and a receive before
    the consumer (``nbytes(consumer)`` bytes, category ``pp``). A producer's output crosses
    to a rank once: when several actions there depend on it (the pieces of a step that
    ``add_tp_collectives`` split, say the layer norm and the sequence-parallel all-gather that
    both read the stage's input), they share the one receive, as Megatron-Core's
    ``p2p_communication`` sends one tensor per stage boundary and micro-batch. ``quiet(src,
    dst)``: the transfers whose NCCL kernels leave the SMs to the compute beside them
    (``Action.slows_compute`` false, ``sim.engine.slowdown``). ``blocking``: what a rank runs after a
    send, up to and with its next compute action, waits for that send to finish (Megatron-Core's
    non-interleaved 1F1B, ``sim.inputs.frameworks.p2p_blocks``; ``_wait_for_sends``); otherwise a
    send runs beside what follows it."""
    acts = {r: list(a) for r, a in prog.actions.items()}
    pos_of: dict[int, dict[str, int]] = {}  # per rank: name -> position, made when first needed

    def positions(r: int) -> dict[str, int]:
        got = pos_of.get(r)
        if got is None:
            got = pos_of[r] = {a.name: i for i, a in enumerate(acts[r])}
        return got

    sends: dict[int, dict[str, list[Action]]] = {r: {} for r in acts}
    recvs: dict[int, list[tuple[int, Action]]] = {r: [] for r in acts}
    received: dict[tuple[int, int, str], str] = {}  # (rank, source, producer) -> its one receive's name
    for r, lst in acts.items():
        for i, a in enumerate(lst):
            if not a.deps:
                continue
            for d in a.deps:
                if d.__class__ is not str and d[0] != r:
                    break
            else:
                continue  # no dependency on another rank
            deps = []
            for d in a.deps:
                if isinstance(d, str) or d[0] == r:
                    deps.append(d)
                    continue
                src, producer = d
                got = received.get((r, src, producer))
                if got is not None:  # the tensor is on this rank already: another piece of the step took it
                    deps.append(got)
                    continue
                tag = f"{producer}>{a.name}"
                size = nbytes(a)
                slows = quiet is None or not quiet(src, r)
                send = Action.new(f"send {producer} for {a.name}", kind="send", peer=r, nbytes=size, tag=tag,
                                  category="pp", stream=f"pp>{r}", deps=(producer,), slows_compute=slows)
                recv = Action.new(f"recv {producer} for {a.name}", kind="recv", peer=src, nbytes=size,
                                  tag=tag, category="pp", stream=f"pp<{src}", slows_compute=slows)
                got = sends[src].get(producer)
                if got is None:
                    sends[src][producer] = [send]
                else:
                    got.append(send)
                recvs[r].append((positions(src)[producer], recv))
                received[(r, src, producer)] = recv.name
                deps.append(recv.name)
            lst[i] = a.evolve(deps=tuple(deps))
    out: dict[int, list[Action]] = {}
    for r, lst in acts.items():
        # Receives in the producer's order, so each pp stream matches its peer's order.
        new = [rv for _, rv in sorted(recvs[r], key=lambda x: (x[1].peer, x[0]))]
        mine = sends[r]
        prev = 0
        if mine:  # each producer's sends right after it
            where = positions(r)
            for k in sorted(where[name] for name in mine):
                new += lst[prev:k + 1]
                new += mine[lst[k].name]
                prev = k + 1
        new += lst[prev:]
        out[r] = _wait_for_sends(new) if blocking else new
    return prog.with_actions(out)


def _wait_for_sends(actions: list[Action]) -> list[Action]:
    """``actions`` with each send's name added to the dependencies of every action after it up
    to and with the first compute action (``add_p2p``'s ``blocking``): the next step's
    collectives on streams of their own (TE's overlapped tensor-parallel chunks) wait too."""
    out, pending = [], []
    for a in actions:
        if a.kind == "send":
            pending.append(a.name)
        elif pending and a.kind != "recv":
            a = a.evolve(deps=tuple(a.deps) + tuple(pending))
            if a.kind == "compute":
                pending = []
        out.append(a)
    return out


def step_kind(name: str) -> str:
    """The kind letter of a pipeline step name (``"2B0.3"`` -> ``"B"``), or ``""``."""
    head = name.split(".")[0]
    letters = [ch for ch in head if ch.isalpha()]
    return letters[0] if len(letters) == 1 and head[0].isdigit() and head[-1].isdigit() else ""


def layer_uses(acts, kinds) -> list[tuple[str, int, int, int]]:
    """(step, layer, first index, last index) of each layer's stretch of work (compute and
    the tensor-parallel collectives between it) within each pipeline step whose kind is in
    ``kinds``, in program order (of first indices). A layer whose work another step's
    interleaves (``sim.program.ep_overlap``) is one stretch, from its first piece to its last."""
    uses: list[list] = []
    at: dict[tuple, list] = {}  # (step, layer) -> its entry
    kind_of: dict[str, str] = {}  # step -> its kind (``step_kind`` reads only the name's part before a dot)
    for i, a in enumerate(acts):
        if a.layer is None or a.kind not in ("compute", "comm", "collective"):
            continue
        step = a.name.split(".")[0]
        kind = a.category
        if kind not in ("F", "B", "I", "W"):
            kind = kind_of.get(step)
            if kind is None:
                kind = kind_of[step] = step_kind(step)
        if kind not in kinds:
            continue
        if uses and uses[-1][0] == step and uses[-1][1] == a.layer:
            uses[-1][3] = i
            continue
        got = at.get((step, a.layer))
        if got is not None:
            got[3] = i
        else:
            uses.append(at.setdefault((step, a.layer), [step, a.layer, i, i]))
    return [tuple(u) for u in uses]


PREP_CATEGORY = "grad_prep"
"""The category of the kernels a gradient bucket runs before its collective (``GradSync.prep_s``)."""


@dataclass(frozen=True)
class GradSync:
    """How the gradients are bucketed and reduced (``add_grad_sync`` says what each does):
    DDP's buckets by default, DeepSpeed's with ``at_most`` and ``on_compute``."""

    bucket_bytes: float
    overlap: bool = True
    backward: tuple[str, ...] = ("B", "W")
    op: str = "allreduce"
    every_microbatch: bool = False
    bucket_memory: bool = False
    label: str = "grad bucket"
    at_most: bool = False
    on_compute: bool = False
    held_from_first: bool = False
    after_step: bool = False
    window: int | None = None
    prep_s: Callable[[float], float] | None = None
    """Seconds of the kernels that run over a bucket of ``nb`` bytes on the compute stream right
    before its collective is issued (Megatron-Core's ``start_grad_sync``: the NaN check's norm, the
    in-place gradient scaling; ``sim.program.training.grad_prep``); None: none."""
    unit: Callable[[int, int], tuple[int, float]] | None = None
    """(rank, layer) -> (its bucketing unit, that unit's bucket bytes): buckets never span two
    units, each packed to its own size (Megatron-Core's DDP, one per model chunk, a later
    stage's and chunk's a single bucket: ``sim.inputs.frameworks.GRAD_BUCKETS``); None: every
    layer in one unit of ``bucket_bytes``."""


def add_grad_sync(prog: Program, grad_bytes: Callable[[int, int], float], dp_group: Callable[[int], tuple[int, ...]],
                  sync: GradSync) -> Program:
    """Gradient buckets over the data-parallel group (stream ``dp``), as ``sync`` says.

    Per rank, the layers' gradients (``grad_bytes(rank, layer)``) are packed, in the order
    they become ready, into buckets of at least ``bucket_bytes``; each bucket's ``op``
    (all-reduce for DDP, reduce-scatter for ZeRO) starts once its last layer's backward is
    done (``overlap``), or after all backward. By default only the last micro-batch's
    backward syncs (gradient accumulation, DDP's ``no_sync``); ``every_microbatch`` syncs
    each micro-batch's gradients (ZeRO-2/3 reduce-scatter into the sharded gradients).
    With ``bucket_memory`` the bucket's full-size gradients are counted (category
    ``buckets``) from its first layer's backward until its collective ends. Layers with no
    gradient of the kind (``grad_bytes`` 0: a dense layer's experts) are left out; ``label``
    names the buckets. With ``held_from_first`` (and not ``every_microbatch``: FSDP's
    deferred gradient sync, ``ParallelPlan.sharding.defer_grad_sync``) the
    bucket's memory is counted from its layers' first backward of the step, where their
    unsharded gradients start to accumulate; with ``after_step`` a bucket starts only once the
    whole backward step of its last layer is done (PyTorch pipelining's
    ``backward_maybe_with_nosync``: FSDP's post-backward run for the whole stage after its
    last backward). With ``window`` (not ``every_microbatch``) the gradients sync once per
    ``window`` micro-batches (0..window-1, then the next ``window``: one call of the
    pipeline schedule each, ``ParallelPlan.sharding.pp_sync_window``), after each layer's
    last backward of the window, held from its first backward of the window. DeepSpeed's buckets (``at_most``) hold at most ``bucket_bytes``
    (``pack_buckets``); with ``on_compute`` each runs on the stream of the backward that
    fills it, which waits for it (DeepSpeed without ``overlap_comm``). With ``unit`` the layers of
    each unit are packed on their own, at the unit's size (``GradSync.unit``). With ``prep_s`` each
    bucket's collective waits for a kernel of that many seconds on the stream of the backward it
    follows, issued right after that backward (``GradSync.prep_s``).
    """
    bucket_bytes, overlap, op, label = sync.bucket_bytes, sync.overlap, sync.op, sync.label
    every_microbatch, bucket_memory, at_most, on_compute = (sync.every_microbatch, sync.bucket_memory,
                                                            sync.at_most, sync.on_compute)
    out: dict[int, list[Action]] = {}
    for r, acts in prog.actions.items():
        group = dp_group(r)
        lst = list(acts)
        uses = layer_uses(lst, sync.backward)
        if len(group) < 2 or not uses:
            out[r] = lst
            continue
        last_backward = max(u[3] for u in uses)
        if every_microbatch:
            rounds: dict[str, list] = {}
            for u in uses:
                rounds.setdefault(u[0], []).append(u)
            groups = list(rounds.values())
        else:
            final: dict[tuple, tuple] = {}
            for u in uses:
                final[(_window(u[0], sync.window), u[1])] = u  # the last use of each layer: its gradient is final
            by_window: dict[int, list] = {}
            for (w, _layer), u in final.items():
                by_window.setdefault(w, []).append(u)
            groups = [sorted(us, key=lambda u: (u[3], -u[1])) for _w, us in sorted(by_window.items())]
        after: dict[int, list[Action]] = {}
        mem_start: dict[int, list[tuple]] = {}
        first_use: dict[tuple, int] = {}  # (window, layer) -> index of its first backward use
        for u in uses:
            first_use.setdefault((_window(u[0], sync.window), u[1]), u[2])
        step_end: dict[str, int] = {}  # backward step -> index of its last piece
        for u in uses:
            step_end[u[0]] = max(step_end.get(u[0], u[3]), u[3])
        k = 0
        unit = None if sync.unit is None else (lambda u, r=r: sync.unit(r, u[1]))
        for grp in groups:
            for nb, members in pack_units(grp, lambda u: grad_bytes(r, u[1]), bucket_bytes, at_most, unit):
                anchor = (step_end[members[-1][0]] if sync.after_step else members[-1][3]) if overlap \
                    else last_backward
                layers = [u[1] for u in members]
                tag = f" of {members[0][0]}" if every_microbatch else ""
                name = f"{label} {k} (layers {layers[0]}..{layers[-1]}){tag}"
                dep = lst[anchor].name
                if sync.prep_s is not None:
                    prep = Action(f"ddp prep for {name}", duration_s=sync.prep_s(nb), category=PREP_CATEGORY,
                                  stream=lst[anchor].stream, deps=(dep,))
                    after.setdefault(anchor, []).append(prep)
                    dep = prep.name
                act = Action(name, kind="collective", op=op,
                             group=group, nbytes=nb, category="dp",
                             stream=lst[anchor].stream if on_compute else "dp", deps=(dep,),
                             mem=(("end", "buckets", -nb),) if bucket_memory else ())
                after.setdefault(anchor, []).append(act)
                if bucket_memory:
                    start = min(first_use[(_window(u[0], sync.window), u[1])] for u in members) \
                        if sync.held_from_first else members[0][2]
                    mem_start.setdefault(start, []).append(("start", "buckets", nb))
                k += 1
        new = []
        for i, a in enumerate(lst):
            if i in mem_start:
                a = a.evolve(mem=a.mem + tuple(mem_start[i]))
            new.append(a)
            new.extend(after.get(i, ()))
        out[r] = new
    return prog.with_actions(out)


def _window(step: str, window: int | None) -> int:
    """The sync window of a pipeline step (``2B5`` -> micro-batch 5 // ``window``); 0 without one."""
    if not window:
        return 0
    name = step.split(".")[0]
    i = len(name)
    while i and name[i - 1].isdigit():
        i -= 1
    return int(name[i:]) // window


def pack_buckets(items, size_of: Callable, bucket_bytes: float, at_most: bool = False) -> list[tuple[float, list]]:
    """``items`` in their order, packed into (bytes, members) buckets of at least
    ``bucket_bytes`` (the last may hold less); items of ``size_of`` 0 are left out. With
    ``at_most`` (DeepSpeed's: a bucket is reduced when the next gradient would overflow it)
    a bucket closes before the item that would take it over ``bucket_bytes``; an item
    larger than that is a bucket of its own."""
    buckets, size, members = [], 0.0, []
    for item in items:
        nb = size_of(item)
        if not nb:
            continue
        if at_most and members and size + nb > bucket_bytes:
            buckets.append((size, members))
            size, members = 0.0, []
        size += nb
        members.append(item)
        if size >= bucket_bytes:
            buckets.append((size, members))
            size, members = 0.0, []
    if members:
        buckets.append((size, members))
    return buckets


def pack_units(items, size_of: Callable, bucket_bytes: float, at_most: bool = False,
               unit_of: Callable | None = None, by_first: bool = False) -> list[tuple[float, list]]:
    """``pack_buckets`` within each unit: ``unit_of(item)`` -> (unit, its bucket bytes); the
    items of a unit, in their order, packed to that unit's size (no bucket spans two units),
    and the buckets of all units in the order of their last item (``by_first``: their first)
    in ``items``. Without ``unit_of``, ``pack_buckets`` of all the items at ``bucket_bytes``."""
    if unit_of is None:
        return pack_buckets(items, size_of, bucket_bytes, at_most)
    parts: dict = {}
    for i, item in enumerate(items):
        parts.setdefault(unit_of(item), []).append((i, item))
    packed = [(nb, members) for (_unit, nbytes), part in parts.items()
              for nb, members in pack_buckets(part, lambda p: size_of(p[1]), nbytes, at_most)]
    packed.sort(key=lambda b: b[1][0][0] if by_first else b[1][-1][0])
    return [(nb, [item for _i, item in members]) for nb, members in packed]


def last_of_each_stream(acts) -> tuple[str, ...]:
    """The names of the last action on each stream of ``acts``, streams in sorted order:
    what a step that needs everything before it (the optimizer) waits for."""
    last: dict[str, str] = {}
    for a in acts:
        last[a.stream] = a.name
    return tuple(last[s] for s in sorted(last))


def add_optimizer(prog: Program, duration: Callable[[int], float]) -> Program:
    """One optimizer step per rank (category ``opt``) after all its other actions."""
    out: dict[int, list[Action]] = {}
    for r, acts in prog.actions.items():
        lst = list(acts)
        # The step needs every gradient: wait for the last action of each stream.
        deps = last_of_each_stream(lst)
        lst.append(Action("optimizer", duration_s=duration(r), category="opt", deps=deps))
        out[r] = lst
    return prog.with_actions(out)
