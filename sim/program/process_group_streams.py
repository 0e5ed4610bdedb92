"""One NCCL stream per process group: a rank's data-parallel collectives in issue order.

PyTorch runs every collective of one process group on one CUDA stream per device:
``ProcessGroupNCCL::collective()`` takes the stream from ``ncclStreams_`` by the device's key
(pytorch/pytorch, torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp; ``getNCCLComm`` makes
it once per communicator), makes it wait for the stream current at the call, and launches
the NCCL kernel there. A rank's collectives over one group therefore run one after the other
in the order the CPU issued them, whichever side stream the framework issued them from;
collectives over another process group (another communicator) run on that group's own
stream, beside them. Every framework here issues the data-parallel parameter all-gathers and
gradient reductions over one group:

- FSDP1 (llm-foundry, torch/distributed/fsdp/_runtime_utils.py): ``_unshard`` all-gathers
  and ``_reduce_grad`` reduce-scatters over ``state.process_group``, from the unshard and
  post-backward streams.
- FSDP2 (torchtitan, NeMo AutoModel; torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py):
  ``_all_gather_process_group`` and ``_reduce_scatter_process_group`` are both the mesh's
  ``shard_process_group``.
- DeepSpeed ZeRO-3 (deepspeed/runtime/zero/stage3.py ``__avg_scatter_grads``): the reduce
  goes over ``_get_param_partition_group`` (the parameters' ``ds_process_group``, which the
  fetch all-gathers over too); ``overlap_comm``'s ``reduce_and_partition_stream`` is only the
  stream it is issued from.
- Megatron-Core's distributed optimizer: the parameter all-gathers and the gradient
  reduce-scatters of a buffer over its data-parallel group (the experts' buffer over the
  expert data-parallel group, another process group).

So the pass ``put_on_group_streams`` puts every data-parallel collective (ZeRO-3 / FSDP
parameter gathers, category ``zero``; gradient buckets, category ``dp``; Megatron's
parameter all-gathers) of a rank on the stream of its group (``group_streams``: ``dp`` for
the dense data-parallel group, ``edp`` for the experts' one; a group of the same ranks as
another is taken for the same one) and orders it by its issue point: right after the action
it is issued after in the rank's list (its *anchor*: the first dependency the pass that made
it gave it, ``sim.program.zero.add_param_gathers``' use ``depth`` layers earlier, a gradient
bucket's last backward; followed back through FSDP's copies, ``sim.program.fsdp``, which
carry the same first dependency; none: issued at the start). The engine runs a stream's
actions in list order, so the stream then runs them in issue order, never two at once.

Two collectives issued at one anchor go in the order the framework's hook issues them:

- FSDP1 with ``backward_prefetch`` BACKWARD_POST: ``_post_backward_hook`` calls
  ``_post_backward_reshard`` (which prefetches: the next layer's all-gather) before
  ``_reduce_grad`` (the layer's reduce-scatter), but the host issues that gather only once
  the GPU has finished the layer before (``limit_all_gathers``, ``sim.inputs.frameworks``),
  so it shares its anchor with that layer's reduce-scatter, issued one hook earlier:
  reductions first. ``gathers_first`` is the order for a host that keeps in step with the
  GPU (the gather anchored at the layer whose hook issues it).
- FSDP2: the layer's ``post_backward`` (``FSDPParamGroup.post_backward`` -> ``foreach_reduce``,
  the reduce-scatter) runs from the autograd node on the layer's inputs, before the tensor
  hook on the previous layer's output runs its ``_pre_backward`` (``FSDPState._pre_backward``
  -> ``pre_backward`` -> the backward prefetch): reductions first.
- DeepSpeed: the bucket's reduce is issued from the gradient hooks during a module's backward
  (``reduce_partition_and_remove_grads``), before the next module's pre-backward hook fetches
  (``PartitionedParameterCoordinator.fetch_sub_module``): reductions first. Megatron's
  all-gathers (forward, after the step) and reductions (backward) never share an anchor.

Left where they are: collectives on the compute stream (DeepSpeed without ``overlap_comm``,
where the backward waits for each bucket) and everything that is not a collective, FSDP's
copies included: they stay on their own streams with their dependencies (the copy-in stream,
the compute stream, FSDP's reduce stream ``sim.program.fsdp.REDUCE_STREAM``).
"""

from __future__ import annotations

from itertools import count
from operator import attrgetter
from typing import Callable

from sim.program.actions import Action, Program

DENSE_STREAM, EXPERT_STREAM = "dp", "edp"
"""The streams of the dense data-parallel group's process group and the experts' one."""

MOVED_STREAMS = ("dp", "zero")
"""The streams the passes put the data-parallel collectives on before this one
(``sim.program.passes.add_grad_sync``, ``sim.program.zero``)."""


def group_streams(dense: Callable[[int], tuple], experts: Callable[[int], tuple] | None = None
                  ) -> Callable[[int], dict[tuple, str]]:
    """rank -> {group: its stream}: the dense data-parallel group on ``DENSE_STREAM``, the
    experts' (``experts``, when given) on ``EXPERT_STREAM`` unless it is the same ranks."""
    def of(rank: int) -> dict[tuple, str]:
        out = {tuple(dense(rank)): DENSE_STREAM}
        if experts is not None:
            out.setdefault(tuple(experts(rank)), EXPERT_STREAM)
        return out
    return of


MOVED_CATEGORIES = ("dp", "zero")
"""The categories of the data-parallel collectives (gradient buckets, parameter gathers)."""


def put_on_group_streams(prog: Program, streams: Callable[[int], dict[tuple, str]],
                         gathers_first: bool = False) -> Program:
    """Each rank's data-parallel collectives (module doc) on their group's stream
    (``streams(rank)``: group -> stream name), each right after its anchor in the list; at one
    anchor in their order in the list, all-gathers before reductions with ``gathers_first``,
    reductions before all-gathers without. A collective over a group ``streams`` does not name
    is left as it is."""
    out = {}
    name_of = attrgetter("name")
    for r, acts in prog.actions.items():
        mine = streams(r)
        lst = list(acts)
        # (one comprehension over the list: this runs over every action of every program a search builds)
        moving = [a for a in lst if a.kind == "collective" and a.category in MOVED_CATEGORIES
                  and a.stream in MOVED_STREAMS and a.group in mine]
        if not moving:
            out[r] = lst
            continue
        copies = {a.name: a for a in lst if a.category == "fsdp"}  # what an anchor is followed back through
        after: dict[str | None, list[tuple[int, int, Action]]] = {}
        for k, a in enumerate(moving):
            anchor = _anchor(a, copies)
            is_gather = a.op == "allgather"
            tie = (0 if is_gather else 1) if gathers_first else (1 if is_gather else 0)
            after.setdefault(anchor, []).append((tie, k, a.evolve(stream=mine[a.group])))
        for got in after.values():
            got.sort(key=lambda x: x[:2])
        # the list copied in slices between the positions that change: the moved collectives (left
        # out) and the anchors (each followed by what is issued after it)
        index = dict(zip(map(name_of, lst), count()))
        moved_at = {index[a.name] for a in moving}
        cuts = sorted(moved_at | {index[n] for n in after if n is not None and n in index})
        new: list[Action] = []
        _place(None, after, new)
        prev = 0
        for i in cuts:
            new.extend(lst[prev:i])
            prev = i + 1
            if i in moved_at:
                continue
            a = lst[i]
            new.append(a)
            _place(a.name, after, new)
        new.extend(lst[prev:])
        for name in list(after):  # an anchor that is not on this rank: those collectives last, in order
            _place(name, after, new)
        out[r] = new
    return prog.with_actions(out)


def _place(name: str | None, after: dict, new: list[Action]) -> None:
    """Append to ``new`` the collectives issued after ``name`` (taken out of ``after``), each
    followed by those issued after it (a loop, not a closure that calls itself: that would be a
    reference cycle keeping the actions alive until the collector runs)."""
    stack = list(reversed(after.pop(name, ())))
    while stack:
        c = stack.pop()[2]
        new.append(c)
        stack.extend(reversed(after.pop(c.name, ())))


def _anchor(a: Action, copies: dict[str, Action]) -> str | None:
    """The action ``a`` is issued after (module doc): its first same-rank dependency, followed
    back through FSDP's copies (``copies``: the rank's actions of category ``fsdp``, by name)
    to theirs; None for the start."""
    seen = set()
    while True:
        first = next((d for d in a.deps if d.__class__ is str), None)
        if first is None or first in seen:
            return None
        seen.add(first)
        dep = copies.get(first)
        if dep is None or dep.category != "fsdp":
            return first
        a = dep
