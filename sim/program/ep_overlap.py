"""Expert-parallel all-to-alls hidden under another micro-batch's compute
(``--overlap-moe-expert-parallel-comm``: Megatron-Core's "combined 1F1B", the DualPipe-style
overlap of DeepSeek-V3).

Within one micro-batch an MoE layer is a chain: attention and router -> dispatch
all-to-all -> experts -> combine all-to-all -> the next layer; nothing of that micro-batch
can run while its all-to-all moves tokens. In 1F1B's steady state a rank runs a forward of
one micro-batch and then a backward of another, which do not depend on each other.
DeepSeek-V3 (Technical Report, Sec. 3.2.1, "DualPipe") runs such a forward and backward
chunk together: each is cut into attention, dispatch, MLP and combine, and the two are
interleaved so that one micro-batch's dispatch and combine run while the other's attention
or MLP computes. Megatron-Core does the same in its combined 1F1B schedule
(``megatron/core/pipeline_parallel/combined_1f1b.py``; per layer
``TransformerLayerSchedulePlan.run`` in ``models/common/model_chunk_schedule_plan.py``):
the paired forward and backward run layer by layer, the i-th layer of the forward beside
the i-th layer of the backward (the backward's in reverse), their all-to-alls on a
communication stream of their own, in this issue order per layer pair:

    compute stream  B.A0   F.A0   B.A1   F.A1   B.A2   F.A2
    comm stream        B.C1   F.C1   B.C2   F.C2

where a layer's work is cut at its expert-parallel collectives into compute runs A0, A1,
A2 and collective runs C1, C2: forward A0 attention, router and permute, C1 dispatch
(with the expert-tensor-parallel all-gather), A1 the experts, C2 combine (and the
reduce-scatter), A2 unpermute and shared experts; backward the same in reverse (the
combine's gradient first, the dispatch's second, A2 holding the attention backward and
the weight gradients). So B's combine gradient runs under F's attention, F's dispatch
under B's expert backward, B's dispatch gradient under F's experts and F's combine under
B's attention backward. A layer without experts (a dense layer, the embedding, the
output layer) is one compute run. With no contention and no slowdown a layer pair takes

    b0 + max(f0, cb1) + max(b1, cf1) + max(f1, cb2) + max(b2, cf2) + f2

(b, f the compute runs, cb, cf the all-to-alls of the backward and the forward), against
the sum of all ten unpaired; ``tests/test_ep_overlap.py`` checks it.

Which steps pair (``steady_pairs``): on each rank, a forward directly followed by a
backward of another (stage, micro-batch), which is exactly 1F1B's and interleaved 1F1B's
steady state (Megatron pairs forward k + warm-up with backward k). The warm-up forwards
and the cool-down backwards run alone, their all-to-alls exposed, as in Megatron. Without
pipelining Megatron runs micro-batch 0's forward alone, then each forward j + 1 beside
backward j, then the last backward alone (``combined_1f1b_schedule_for_no_pipelining``):
``overlap_schedule``, a 1F1B order with one warm-up forward, so two micro-batches'
activations are alive at once there (one more than without the overlap). With pipelining
Megatron requires interleaving and adds one warm-up forward on every rank
(``get_pp_rank_microbatches`` in ``pipeline_parallel/schedules.py``), without which the
last rank's first steady-state forward and backward would be the same chunk of the same
micro-batch: one more chunk-micro-batch of activations in flight, the price of the overlap.

The pass (``add_ep_overlap``) runs on the step pieces that ``sim.program.segments`` made
(after the ``layers`` pass, before the point-to-point one): it reorders each pair's pieces
as above and moves the expert-parallel collectives onto ``EP_STREAM``. Every piece already
waits for the piece before it in its own step, so the data dependencies stay; only the
order the streams take them in changes. Assumed: the communication stream is one stream,
so the pair's all-to-alls run one at a time, never two at once; the compute that overlaps
an all-to-all runs at the engine's overlap slowdown (``overlap_compute_slowdown``: NCCL's
all-to-all holds SMs; DeepSeek reserves 20 of 132 for it), nothing more; the schedule's
sends and receives are issued as 1F1B issues them (Megatron overlaps them with the pair
too); ``--delay-wgrad-compute`` (weight gradients moved under the next layer's forward) is
not modelled.
"""

from __future__ import annotations

from typing import Callable

from sim.program.actions import Action, Program
from sim.program.schedules import Schedule, Step, interleaved
from sim.program.workload_moe import COUNTS_OP

EP_STREAM = "ep-comm"
"""The stream the overlapped all-to-alls run on (Megatron-Core's communication stream)."""


def overlap_schedule(pp: int, vpp: int, m: int) -> Schedule:
    """The order Megatron runs with the overlap: without pipelining F0, then F(j+1) beside
    B(j), then B(m−1); with it, interleaved 1F1B with one more warm-up forward per rank."""
    if pp > 1:
        return interleaved(pp, vpp, m, extra_warmup=1)
    row = [Step(0, "F", 0)]
    for j in range(m):
        if j + 1 < m:
            row.append(Step(0, "F", j + 1))
        row.append(Step(0, "B", j))
    return Schedule("1f1b", 1, 1, m, (tuple(row),))


def steady_pairs(schedule: Schedule, pipeline_rank: int) -> list[tuple[str, str]]:
    """(forward, backward) step names that run together on ``pipeline_rank``: each forward
    directly followed by a full backward of another (stage, micro-batch)."""
    row = schedule.ranks[pipeline_rank]
    return [(str(f), str(b)) for f, b in zip(row, row[1:])
            if f.kind == "F" and b.kind == "B" and (f.stage, f.mb) != (b.stage, b.mb)]


def is_ep_collective(a: Action) -> bool:
    """An expert-parallel (or expert-tensor-parallel) collective of an MoE layer's dispatch or combine
    (not the token-count gather before the permutation, which Megatron runs on the compute
    stream: ``sim.program.workload_moe.COUNTS_OP``)."""
    return a.kind == "collective" and a.category == "ep" and not a.name.endswith(" " + COUNTS_OP)


def add_ep_overlap(prog: Program, pairs: Callable[[int], list[tuple[str, str]]],
                   is_comm: Callable[[Action], bool] = is_ep_collective) -> Program:
    """Each (forward, backward) pair of ``pairs(rank)`` whose steps sit next to each other in
    the rank's program, merged into one interleaved stretch, with ``is_comm`` collectives on
    ``EP_STREAM`` (see the module doc). Other steps are left as they are."""
    out: dict[int, list[Action]] = {}
    for r, acts in prog.actions.items():
        todo = dict(pairs(r))
        if not todo:
            out[r] = list(acts)
            continue
        blocks = _blocks(acts)
        new: list[Action] = []
        i = 0
        while i < len(blocks):
            step, pieces = blocks[i]
            back = todo.get(step)
            if back is not None and i + 1 < len(blocks) and blocks[i + 1][0] == back:
                new += _merge(pieces, blocks[i + 1][1], is_comm)
                i += 2
                continue
            new += pieces
            i += 1
        out[r] = new
    return prog.with_actions(out)


def _blocks(acts) -> list[tuple[str, list[Action]]]:
    """The rank's actions as runs of one step each (a piece is named ``<step>`` or ``<step>.<i>``)."""
    blocks: list[tuple[str, list[Action]]] = []
    for a in acts:
        step = a.name.split(".", 1)[0]
        if blocks and blocks[-1][0] == step:
            blocks[-1][1].append(a)
        else:
            blocks.append((step, [a]))
    return blocks


def _units(pieces: list[Action]) -> list[list[Action]]:
    """A step's pieces cut into its layers (runs of one ``layer`` value, in the step's order)."""
    units: list[list[Action]] = []
    for a in pieces:
        if units and units[-1][-1].layer == a.layer:
            units[-1].append(a)
        else:
            units.append([a])
    return units


def _runs(unit: list[Action], is_comm) -> tuple[list[list[Action]], list[list[Action]]]:
    """A layer's compute runs A0, A1, ... and the collective runs C1, C2, ... between them."""
    compute: list[list[Action]] = [[]]
    comm: list[list[Action]] = []
    for a in unit:
        if is_comm(a):
            if len(comm) < len(compute):
                comm.append([])
            comm[-1].append(a.evolve(stream=EP_STREAM))
        else:
            if len(compute) == len(comm):
                compute.append([])
            compute[-1].append(a)
    return compute, comm


def _merge(forward: list[Action], backward: list[Action], is_comm) -> list[Action]:
    """The pair's pieces in the combined order: layer i of the forward beside layer i of
    the backward, per layer pair B.A0 B.C1 F.A0 F.C1 B.A1 B.C2 F.A1 F.C2 ... (so the compute
    stream takes B.A0 F.A0 B.A1 F.A1 ... and the communication stream B.C1 F.C1 B.C2 F.C2 ...)."""
    fu, bu = _units(forward), _units(backward)
    out: list[Action] = []
    for i in range(max(len(fu), len(bu))):
        f = _runs(fu[i], is_comm) if i < len(fu) else ([], [])
        b = _runs(bu[i], is_comm) if i < len(bu) else ([], [])
        for k in range(max(len(f[0]), len(b[0]))):
            for compute, comm in (b, f):
                if k < len(compute):
                    out += compute[k]
                if k < len(comm):
                    out += comm[k]
    return out
