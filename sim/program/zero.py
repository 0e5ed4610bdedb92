"""ZeRO and memory passes: who holds what, and the traffic sharding costs.

ZeRO (Rajbhandari et al. SC'20) shards the model states of mixed-precision Adam over
the Nd data-parallel ranks. The passes here make each stage's traffic and memory
explicit in the program, so the simulator times it and the memory timeline shows it:

- ZeRO-1 (P_os): gradients are reduce-scattered after the last micro-batch instead of
  all-reduced, each rank updates its 1/Nd of the optimizer states, and the updated
  16-bit parameters are all-gathered (``add_param_allgather``), or, overlapped, during
  the next step's forward ahead of each bucket's first use (``add_param_allgather_ahead``).
- ZeRO-2 (P_os+g): gradients are reduce-scattered bucket by bucket during every
  micro-batch's backward, and the full-size bucket is freed when its reduce-scatter
  ends; parameters are all-gathered after the step as in ZeRO-1.
- ZeRO-3 (P_os+g+p): parameters are sharded too. Each layer's parameters are
  all-gathered before each use (forward, and again backward) and freed after it
  (``add_param_gathers``), up to ``depth`` layers ahead (prefetch); gradients are
  reduce-scattered per layer in backward. Per step it moves 1.5× ZeRO-2's bytes. With
  expert parallelism (FSDP2 with EP) an MoE layer's experts are sharded over their own
  data-parallel group and gathered over it right after the layer's dense weights.

``add_resident`` puts each rank's resident model states (and the profile's reserve) in
memory at the start; ``add_activation_memory`` allocates each (stage, micro-batch)'s
stored activations layer by layer as its forward runs (each layer's as that layer's work
starts) and frees them layer by layer as its last backward step (B, or W when backward
is split) runs, so GPipe's m, 1F1B's p and the zero-bubble schedules' counts come out of
the schedule itself, and a rank's peak falls where its last forward before a backward
ends, not at the start of the iteration.

The passes only place allocations, frees and transfers on the actions: every byte
count (resident states, stored activations, gathered weights, offload copies) and the
CPU optimizer's time arrive as functions of the rank, which ``sim.program.training``
builds from ``sim.program.memory`` and ``sim.program.costs``.
"""

from __future__ import annotations

import math
from typing import Callable

from sim.program.actions import Action, Program
from sim.program.passes import last_of_each_stream, layer_uses, pack_units

PIPELINE = ("F", "B", "I", "W")


def add_resident(prog: Program, resident: Callable[[int], dict]) -> Program:
    """Each rank starts holding ``resident(rank)`` bytes per category."""
    out = {}
    for r, acts in prog.actions.items():
        mem = tuple(("start", cat, float(b)) for cat, b in sorted(resident(r).items()) if b)
        out[r] = [Action("resident memory", duration_s=0.0, category="mem", stream="memory", mem=mem), *acts]
    return prog.with_actions(out)


def _steps(acts) -> dict[str, tuple[int, int]]:
    """First and last index of each pipeline step's pieces (named ``2F0``, ``2F0.1``...)."""
    where: dict[str, list[int]] = {}
    for i, a in enumerate(acts):
        if a.kind == "compute" and a.category in PIPELINE:
            step = a.name.split(".")[0]
            w = where.setdefault(step, [i, i])
            w[1] = i
    return {k: (v[0], v[1]) for k, v in where.items()}


def add_activation_memory(prog: Program, stored: Callable[[int, str], float | dict],
                          transient: Callable[[int, str], float] | None = None) -> Program:
    """Stored activations of step ``2F0`` (``stored(rank, "2F0")`` bytes) from the start
    of that forward to the end of its last backward step (``2B0``, or ``2W0``); and
    ``transient(rank, step)`` bytes for the duration of each backward step (the one
    layer recomputed at a time under full recomputation).

    When ``stored`` gives a dict (layer id -> bytes, ``sim.program.memory.chunk_activation_parts``)
    each layer's bytes are allocated as the layer's work in the forward starts and freed
    as its work in the last backward step ends (at the step's start and end for a layer
    the step does not name)."""
    out = {}
    ends: dict[str, tuple] = {}  # per forward step: its stage, and the names of its backward steps
    made: dict[tuple, Action] = {}  # (id of an action, its additions) -> the action with them
    for r, acts in prog.actions.items():
        lst = list(acts)
        steps = _steps(lst)
        layers: dict[str, dict[int, tuple[int, int]]] = {}  # per step: layer -> its first and last index
        add: dict[int, list[tuple]] = {}
        for step, (first, last) in steps.items():
            got = ends.get(step)
            if got is None:
                stage, kind, mb = _split(step)
                got = ends[step] = (kind, f"{stage}W{mb}", f"{stage}B{mb}", f"{stage}I{mb}")
            kind = got[0]
            if kind == "F":
                nbytes = stored(r, step)
                if not nbytes:
                    continue
                back = next((b for b in got[1:] if b in steps), None)
                if back is None:
                    raise ValueError(f"rank {r}: forward {step} has no backward step")
                if not isinstance(nbytes, dict):
                    nbytes = {None: nbytes}
                elif not layers:
                    for s, layer, i, j in layer_uses(lst, PIPELINE):
                        i0, j0 = layers.setdefault(s, {}).get(layer, (i, j))
                        layers[s][layer] = (min(i, i0), max(j, j0))
                fwd, bwd = layers.get(step, {}), layers.get(back, {})
                for layer, nb in nbytes.items():
                    add.setdefault(fwd.get(layer, (first,))[0], []).append(("start", "activations", nb))
                    add.setdefault(bwd.get(layer, (None, steps[back][1]))[1], []).append(("end", "activations", -nb))
            elif kind in ("B", "I") and transient is not None:
                t = transient(r, step)
                if t:
                    add.setdefault(first, []).append(("start", "activations", t))
                    add.setdefault(last, []).append(("end", "activations", -t))
        for i, more in add.items():
            # Actions shared by several ranks (tensor-parallel peers' pieces) get one copy.
            a, more = lst[i], tuple(more)
            key = (id(a), more)
            b = made.get(key)
            if b is None:
                b = made[key] = a.evolve(mem=a.mem + more)
            lst[i] = b
        out[r] = lst
    return prog.with_actions(out)


def _split(step: str) -> tuple[int, str, int]:
    for i, ch in enumerate(step):
        if ch.isalpha():
            return int(step[:i]), ch, int(step[i + 1:])
    raise ValueError(f"not a step name: {step!r}")


def add_param_gathers(prog: Program, layer_bytes: Callable[[int, int], float],
                      dp_group: Callable[[int], tuple[int, ...]], depth: int,
                      label: str = "gather layer", backward_depth: int | None = None,
                      reshard_after_forward: bool = True, kept_layers: frozenset | None = None,
                      window: int | None = None) -> Program:
    """ZeRO-3: all-gather a layer's parameters (stream ``zero``) before each use and free
    them after it. The gather for the i-th use may start once use i − depth − 1 is done,
    so ``depth`` layers are fetched ahead while earlier ones compute; in backward steps
    ``backward_depth`` ahead when given (FSDP1's BACKWARD_POST: 1, the host one layer ahead
    under ``limit_all_gathers``, ``sim.inputs.frameworks``; 0 would be a host in step with the
    GPU, the gather issued once the layer used before it is done). Without
    ``reshard_after_forward`` (FSDP1's SHARD_GRAD_OP) a layer gathered for a micro-batch's
    forward stays gathered until that micro-batch's backward of it is done, and backward
    gathers nothing; with ``kept_layers`` only those layers are kept so (DeepSpeed's
    ``stage3_max_reuse_distance``, ``sim.inputs.frameworks.deepspeed_kept_layers``). With
    ``window`` (FSDP2 under pipelining, ``ParallelPlan.sharding.pp_sync_window``: torch's
    ``backward_maybe_with_nosync`` sets ``reshard_after_backward`` False on every backward but
    the stage's last of the schedule call) a layer's first backward use of each ``window``
    micro-batches gathers and the gathered parameters stay until its last backward use of
    the window; without ``reshard_after_forward`` its first forward use of the window gathers
    and they stay till then (one gather per layer per window). Layers of ``layer_bytes`` 0 (a dense layer's experts) get no gather;
    ``label`` names the gathers (``{label} {layer} for {step}``). Called again with the
    experts' bytes and group, a layer's expert gather follows its dense one on the same
    stream, as FSDP2 issues each module's all-gather on one stream."""
    out = {}
    for r, acts in prog.actions.items():
        group = dp_group(r)
        lst = list(acts)
        if len(group) < 2:
            out[r] = lst
            continue
        uses = layer_uses(lst, PIPELINE)  # (step, layer, first, last)
        if window:
            kept = _kept_through_window(uses, window, reshard_after_forward)
        else:
            kept = _kept_until_backward(uses) if not reshard_after_forward else \
                _kept_until_backward(uses, kept_layers) if kept_layers else {}
        before: dict[int, list[Action]] = {}
        extra_deps: dict[int, list[str]] = {}
        frees: dict[int, list[tuple]] = {}
        for k, (step, layer, first, last) in enumerate(uses):
            nb = layer_bytes(r, layer)
            if not nb or kept.get(k) == -1:
                continue
            name = f"{label} {layer} for {step}"
            ahead = depth if backward_depth is None or _split(step)[1] == "F" else backward_depth
            last = uses[kept[k]][3] if k in kept else last
            deps = (lst[uses[k - ahead - 1][3]].name,) if k - ahead - 1 >= 0 else ()
            g = Action.new(name, kind="collective", op="allgather", group=group, nbytes=nb, category="zero",
                       stream="zero", deps=deps, mem=(("start", "gathered", nb),))
            before.setdefault(first, []).append(g)
            extra_deps.setdefault(first, []).append(name)
            frees.setdefault(last, []).append(("end", "gathered", -nb))
        new = []
        for i, a in enumerate(lst):
            new.extend(before.get(i, ()))
            if i in extra_deps or i in frees:
                a = a.evolve(deps=a.deps + tuple(extra_deps.get(i, ())), mem=a.mem + tuple(frees.get(i, ())))
            new.append(a)
        out[r] = new
    return prog.with_actions(out)


def _kept_until_backward(uses, layers: frozenset | None = None) -> dict[int, int]:
    """Without reshard after forward: index of each forward use (in ``uses``) -> the index
    of the last backward use of the same layer, chunk and micro-batch (where its gathered
    parameters are freed), and each such backward use -> -1 (it gathers nothing); only of
    the ``layers`` given, when given."""
    forward: dict[tuple, int] = {}
    out: dict[int, int] = {}
    for k, (step, layer, _first, _last) in enumerate(uses):
        if layers is not None and layer not in layers:
            continue
        stage, kind, mb = _split(step)
        key = (stage, mb, layer)
        if kind == "F":
            forward[key] = k
        elif key in forward:
            out[forward[key]] = k
            out[k] = -1
    return out


def _kept_through_window(uses, window: int, reshard_after_forward: bool) -> dict[int, int]:
    """FSDP2 under pipelining (``add_param_gathers``' ``window``): index of each use (in
    ``uses``) that gathers -> the index of the use after which the parameters are freed, and
    each use that finds them gathered -> -1. Per layer and window of ``window`` micro-batches
    (of its virtual stage): its first backward use gathers and keeps them to its last one of
    the window; without ``reshard_after_forward`` its first forward use does, for every use
    of the window. Forward uses under ``reshard_after_forward`` gather and free as usual."""
    groups: dict[tuple, list[int]] = {}
    for k, (step, layer, _first, _last) in enumerate(uses):
        stage, kind, mb = _split(step)
        if reshard_after_forward and kind == "F":
            continue
        groups.setdefault((stage, layer, mb // window), []).append(k)
    out: dict[int, int] = {}
    for ks in groups.values():
        out.update({k: -1 for k in ks[1:]})
        out[ks[0]] = ks[-1]
    return out


def add_param_allgather_ahead(prog: Program, layer_bytes: Callable[[int, int], float],
                              dp_group: Callable[[int], tuple[int, ...]], bucket_bytes: float,
                              label: str = "param allgather", stream: Callable[[int], str] | None = None,
                              unit: Callable[[int, int], tuple[int, float]] | None = None) -> Program:
    """ZeRO-1/2 with the parameter all-gather overlapped (Megatron-LM
    ``--overlap-param-gather``): the previous step's updated parameters are all-gathered
    during this step's forward. Layers (``layer_bytes(rank, layer)``, 0 for none) are packed
    in the order of their first forward use into buckets of at least ``bucket_bytes`` (with
    ``unit``, each unit's layers on their own at its size: ``sim.program.passes.pack_units``,
    the buckets in the order of their first use). Bucket 0 is gathered at the start of the
    step; bucket k + 1 is dispatched when the forward reaches bucket k (Megatron's forward
    pre-hook waits for a bucket and dispatches the next), and a bucket's first use waits for
    its gather. Stream ``dp``, category
    ``zero`` (``stream(rank)`` instead of ``dp`` when given: the stream of the group's process
    group, ``sim.program.process_group_streams``). In steady state this is the same traffic as
    ``add_param_allgather``, moved from the end of one step into the next one's forward."""
    out = {}
    for r, acts in prog.actions.items():
        group = dp_group(r)
        lst = list(acts)
        if len(group) < 2:
            out[r] = lst
            continue
        on = stream(r) if stream is not None else "dp"
        first: dict[int, int] = {}  # layer -> index of its first forward use
        for _step, layer, start, _end in layer_uses(lst, ("F",)):
            first.setdefault(layer, start)
        order = sorted(first.items(), key=lambda kv: kv[1])
        unit_of = None if unit is None else (lambda kv, r=r: unit(r, kv[0]))
        buckets = [(nb, [start for _, start in members])
                   for nb, members in pack_units(order, lambda kv: layer_bytes(r, kv[0]), bucket_bytes,
                                                 unit_of=unit_of, by_first=True)]
        before: dict[int, list[Action]] = {}
        waits: dict[int, list[str]] = {}
        for k, (nb, members) in enumerate(buckets):
            name = f"{label} {k}"
            # dispatched when the forward reaches the previous bucket (at the start for the first)
            at = buckets[k - 1][1][0] if k else 0
            deps = ()
            if k:  # the work the forward did just before it reached that bucket (its own stream)
                j = at - 1
                while j >= 0 and lst[j].stream != lst[at].stream:
                    j -= 1
                deps = (lst[j].name,) if j >= 0 else ()
            before.setdefault(at, []).append(Action(name, kind="collective", op="allgather", group=group, nbytes=nb,
                                                    category="zero", stream=on, deps=deps))
            for i in members:
                waits.setdefault(i, []).append(name)
        new = []
        for i, a in enumerate(lst):
            new.extend(before.get(i, ()))
            if i in waits:
                a = a.evolve(deps=a.deps + tuple(waits[i]))
            new.append(a)
        out[r] = new
    return prog.with_actions(out)


def add_offloaded_optimizer(prog: Program, shard_bytes: Callable[[int], float], cpu_s: Callable[[int], float]) -> Program:
    """ZeRO-Offload (Ren et al. 2021): once a rank's gradients are reduced, its 16-bit
    gradient shard (``shard_bytes(rank)``) is copied to the host over PCIe, the CPU runs
    the Adam step (``cpu_s(rank)`` seconds, stream ``cpu``), and the updated 16-bit
    parameter shard comes back. The last copy is named ``params to GPU``."""
    out = {}
    for r, acts in prog.actions.items():
        lst = list(acts)
        deps = last_of_each_stream(lst)
        nb = shard_bytes(r)
        lst += [Action("grads to host", kind="copy", op="d2h", nbytes=nb, category="offload", stream="pcie", deps=deps),
                Action("optimizer (CPU)", duration_s=cpu_s(r), category="opt", stream="cpu", deps=("grads to host",)),
                Action("params to GPU", kind="copy", op="h2d", nbytes=nb, category="offload", stream="pcie",
                       deps=("optimizer (CPU)",))]
        out[r] = lst
    return prog.with_actions(out)


def add_param_allgather(prog: Program, param_bytes: Callable[[int], float], dp_group: Callable[[int], tuple[int, ...]],
                        bucket_bytes: float, after: str = "optimizer",
                        max_buckets: Callable[[int], int] | None = None, label: str = "param allgather",
                        stream: Callable[[int], str] | None = None) -> Program:
    """ZeRO-1/2: after the optimizer step (action ``after``), all-gather the updated
    16-bit parameters (``param_bytes(rank)`` in all) over the dp group in buckets
    (stream ``dp``, category ``zero``: ZeRO's parameter traffic, reported apart from the
    gradient sync). At most ``max_buckets(rank)`` buckets (a bucket holds whole parameter
    tensors, so no more buckets than the rank has layers), however small ``bucket_bytes``;
    on ``stream(rank)`` instead of ``dp`` when given (``sim.program.process_group_streams``)."""
    out = {}
    for r, acts in prog.actions.items():
        group = dp_group(r)
        lst = list(acts)
        total = param_bytes(r)
        if len(group) < 2 or total <= 0:
            out[r] = lst
            continue
        n = max(1, int(min(total // bucket_bytes, max_buckets(r) if max_buckets else math.inf)))
        on = stream(r) if stream is not None else "dp"
        for k in range(n):
            nb = total / n
            lst.append(Action(f"{label} {k}", kind="collective", op="allgather", group=group, nbytes=nb,
                              category="zero", stream=on, deps=(after,)))
        out[r] = lst
    return prog.with_actions(out)
