"""Tensor-parallel pieces of a step: compute segments and the collectives between them,
and their overlap with the GEMMs beside them (``--tp-comm-overlap``).

Without overlap (Megatron-LM's default) each step is a chain on the compute stream:
compute, collective, compute, ...; the NCCL kernels block the compute that follows.

With ``tp_comm_overlap`` (Megatron-LM ``--tp-comm-overlap``, Transformer Engine's
userbuffers; it needs sequence parallelism), each sequence-parallel collective runs beside
a GEMM, as Transformer Engine's default configuration overlaps them
(``transformer_engine/pytorch/module/base.py``, ``initialize_ub``; the DGX Cloud
benchmarks' NeMo configurations keep these methods and split counts):

- all-gather then GEMM (``ring_exchange``: the QKV and MLP-up forward GEMMs, the
  projection and MLP-down input gradients): both cut into ``tp`` chunks along the tokens;
  chunk i of the GEMM waits for chunk i of the gather, which runs on a stream of its own
  (``TP_COMM_STREAM``) while chunk i − 1 computes;
- GEMM then reduce-scatter in the forward (``pipeline``: the projection and MLP-down
  forward GEMMs): both cut into ``PIPELINE_SPLITS`` = 4 chunks; chunk i of the scatter
  waits for chunk i of the GEMM and runs while chunk i + 1 computes; what follows the
  scatter waits for its last chunk;
- an input gradient's reduce-scatter in the backward (``bulk``, QKV and MLP-up): the
  input-gradient GEMM runs whole, then its reduce-scatter whole beside the same linear
  layer's weight-gradient GEMM, which the layer's backward runs next (where the step has
  it: a zero-bubble schedule's input-gradient step does not, and keeps the pipelined
  chunks); what follows waits for the scatter;
- the all-gather of a weight gradient's input (it needs nothing of the backward step) is
  issued whole at the start of the layer's backward, beside the input-gradient GEMMs, and
  the weight-gradient GEMM waits for it (``bulk``).

So a pair takes about max(GEMM, collective) plus one chunk of the other, instead of their
sum; the engine slows the GEMMs that overlap a reduce-scatter in flight
(``overlap_compute_slowdown``: Transformer Engine's reduce-scatters hold 2-24 SMs), but not
those beside an all-gather chunk, which the copy engines move (``claim``: the chunk's
``Action.slows_compute``). Each chunk is a collective of its share of the
bytes, priced by the network like any other (so it pays the collective's latency per
chunk, where TE's ring exchange pays one hop per chunk: a few microseconds more per chunk
on NVLink), but not NCCL's base latency: userbuffers are not NCCL kernels
(``Segment.userbuffers``, whose ``claim`` is ``Action.transport`` ``direct``). Transformer Engine issues chunk i's GEMM on compute stream i mod
``UB_STREAMS`` (3, ``_NUM_MAX_UB_STREAMS``), so up to three chunks whose inputs are ready
share the SMs at once and the tail wave of one fills with the next one's tiles: each chunk
is priced as a third of its shape batched three times (``chunk_time``), wave quantization
taken over the three together. All-reduces (no sequence parallelism) and collectives with
no GEMM beside them are not overlapped.

With ``--tp-comm-overlap-cfg`` (Transformer Engine's method and SMs per GEMM,
``sim.inputs.tp_overlap``) the pairs run as that configuration says instead: a ring-exchange
all-gather as TE's ``split_overlap_ag`` (the first GEMM chunk on the rank's own shard, tp − 1
shard-sized shifts to the next rank, each beside a chunk; ``aggregate``: one shard swapped
first, then tp/2 chunks of two, ``ring_shifts``); a ring-exchange reduce-scatter as its
``split_overlap_rs`` P2P (tp GEMM chunks, chunk c − 1's partial sent beside chunk c, the
received partials summed on the main stream); a pipelined one in ``num_splits`` chunks. Each
GEMM beside an overlap is priced on the SMs its method leaves it (``gemm_beside``), and the
chunks do not also slow it in the engine (``Segment.sms_priced``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from sim.program.actions import Action, Program
from sim.program.launch import HOST_STREAM, LAUNCH_CATEGORY
from sim.program.ops import Op

_CATEGORY = {"etp": "ep", "tpep": "ep", "ep_rail": "ep", "ep_node": "ep"}
"""The trace category of a collective by its group (expert-TP collectives and the token
dispatchers' exchanges count as expert-parallel)."""
PIPELINE_SPLITS = 4
"""Chunks of a pipelined GEMM → reduce-scatter (Transformer Engine's ``num_splits`` for the
``pipeline`` method; ``tp`` for ``ring_exchange``)."""
UB_STREAMS = 3
"""Compute streams a chunked GEMM's chunks take in turn (Transformer Engine's ``_NUM_MAX_UB_STREAMS``)."""
TE_GEMMS = {"attn.qkv": "qkv_fprop", "mlp.up": "fc1_fprop", "attn.proj.dgrad": "proj_dgrad",
            "mlp.down.dgrad": "fc2_dgrad", "attn.proj": "proj_fprop", "mlp.down": "fc2_fprop",
            "attn.qkv.dgrad": "qkv_dgrad", "mlp.up.dgrad": "fc1_dgrad", "attn.qkv.wgrad": "qkv_wgrad",
            "mlp.up.wgrad": "fc1_wgrad"}
"""A layer's GEMMs by Transformer Engine's names for their overlaps (``sim.inputs.tp_overlap``):
an input-gradient GEMM's name stands for the bulk all-gather beside it, a weight gradient's
for the bulk reduce-scatter beside it. Other GEMMs (the output layer, experts, MLA's
projections) keep the model without a configuration."""
TP_COMM_STREAM = "tp-comm"
"""The stream overlapped tensor-parallel chunks run on (Transformer Engine's userbuffers
communicate on their own CUDA stream)."""


@dataclass(frozen=True)
class Segment:
    """A piece of a step: a compute stretch of one layer, or a tensor-parallel collective."""

    kind: str  # "compute", "collective", "comm" (a collective priced outside the network) or "host" (launches)
    duration_s: float = 0.0
    flops: float = 0.0
    op: str = ""  # allreduce / allgather / reducescatter
    nbytes: float = 0.0
    layer: int | None = None
    side: bool = False
    """Runs on ``TP_COMM_STREAM`` beside the step's stream (an overlapped chunk)."""
    waits: tuple[int, ...] = ()
    """Earlier segments of the same step (by position) it waits for, besides the one before
    it on its own stream."""
    group: str = "tp"
    """Which of the rank's groups a collective runs over (``sim.program.ops.GROUPS``)."""
    userbuffers: bool = False
    """An overlapped tensor-parallel chunk that Transformer Engine's userbuffers move, not
    an NCCL kernel (``claim``: no NCCL base latency)."""
    sms_priced: bool = False
    """A userbuffers chunk whose SMs the GEMMs beside it are priced without (``claim``)."""
    label: str = ""
    """What the collective is, appended to its action's name (the token dispatchers'
    exchanges, ``sim.program.segments``); empty: the name is the step's and the piece's number."""


def claim(s: Segment) -> dict:
    """What collective segment ``s`` takes from its GPU, as the engine's claim fields
    (``sim.program.actions``: ``transport``, ``slows_compute``). An NCCL collective (not
    ``userbuffers``) is an NCCL kernel that holds SMs. A userbuffers chunk is not an NCCL
    kernel: ``direct``, no NCCL base latency. Its SMs: an all-gather chunk overlapped with a
    GEMM leaves them to the GEMM, since Transformer Engine's userbuffers move it with the
    copy engines (ring exchange, ``use_ce``: its default configuration in
    ``transformer_engine/pytorch/module/base.py``; the bulk all-gather beside an
    input-gradient GEMM takes 2-8 SMs of 132 in NeMo's configurations); its reduce-scatter
    chunks hold 16-24 SMs and do slow the GEMM. Collectives of other groups on the side
    stream (context parallelism's all-gathers) are NCCL kernels. Under
    ``--tp-comm-overlap-cfg`` every chunk leaves them (``sms_priced``): the GEMMs beside it
    are priced on the SMs its method leaves them (``gemm_beside``, ``sim.inputs.tp_overlap``)."""
    if not s.userbuffers:
        return {}
    return {"transport": "direct", "slows_compute": not (s.op == "allgather" or s.sms_priced)}


@dataclass(frozen=True)
class ItemReader:
    """How ``overlapped_layer`` reads a layer's items: ``time_of(op)`` prices an op,
    ``is_comm(item)`` tells a collective, ``op_of(comm)`` its engine op (allgather,
    reducescatter, allreduce), ``group_of(comm)`` the group it runs over (only tensor-parallel
    ones overlap), ``label_of(comm)`` its ``Segment.label``. Under a Transformer Engine overlap
    configuration ``time_of(op, sms_held)`` prices a GEMM on the SMs an overlap leaves it, and
    ``comm_of(op, nbytes)`` estimates the seconds a userbuffers kernel without an SM margin
    runs beside it (``gemm_beside``)."""

    time_of: Callable
    is_comm: Callable
    op_of: Callable
    group_of: Callable = lambda c: "tp"
    label_of: Callable = lambda c: ""
    comm_of: Callable | None = None


def overlapped_layer(items, layer, tp: int, read: ItemReader, base: int = 0,
                     cfg: dict | None = None) -> list[Segment]:
    """One layer's ``items`` (ops and collectives of one phase, in order, read as ``read``
    says) as segments with each all-gather → GEMM and GEMM → reduce-scatter pair cut into
    ``tp`` overlapped chunks (see the module doc). ``base``: how many segments of the step
    come before these (``Segment.waits`` counts in the whole step). ``cfg``: Transformer
    Engine's overlap per GEMM (``sim.inputs.tp_overlap.overlaps``; None: the model without
    one, module doc)."""
    time_of, is_comm, op_of = read.time_of, read.is_comm, read.op_of
    group_of, label_of, comm_of = read.group_of, read.label_of, read.comm_of
    items = te_order(items)

    def overlap(op):
        """The configured overlap of GEMM ``op`` (None: none configured for it)."""
        return None if cfg is None else cfg.get(TE_GEMMS.get(op.name))

    def beside(o, comm: str = "", nbytes: float = 0.0, streams: int = 1) -> Callable:
        """Prices a GEMM (or ``streams`` chunks of it at once) beside overlap ``o`` moving
        ``nbytes`` per chunk by ``comm`` (``gemm_beside``)."""
        if o is None or not o.sms_held:
            return time_of
        comm_s = 0.0 if o.set_sm_margin else streams * comm_of(comm, nbytes)
        return lambda op: gemm_beside(time_of(op), time_of(op, o.sms_held), comm_s, o.set_sm_margin)

    tp_comm = is_comm
    is_comm = lambda it: tp_comm(it) and group_of(it) == "tp"  # noqa: E731
    out: list[Segment] = []
    dur = flops = 0.0
    pending: list[int] = []  # side chunks the next piece on the main stream must wait for
    last_main = base - 1  # the step's latest piece on its own stream (a layer ends on it)

    def main(seg: Segment) -> None:
        nonlocal pending, last_main
        if pending:
            seg = replace(seg, waits=seg.waits + tuple(dict.fromkeys(pending)))
            pending = []
        last_main = base + len(out)
        out.append(seg)

    def flush() -> None:
        nonlocal dur, flops
        if dur:
            main(Segment("compute", dur, flops, layer=layer))
            dur = flops = 0.0

    def gemm(it) -> bool:
        return it is not None and not tp_comm(it) and it.kind == "gemm"

    side: dict[str, int] = {}  # collectives beside the compute (ring attention's shifts) by name

    n = len(items)
    # A weight gradient's input all-gather needs nothing of this step: it goes first, whole,
    # beside the input-gradient GEMMs (Transformer Engine's bulk overlap).
    bulk: dict[int, int] = {}
    gathered: dict[str, float] = {}  # input-gradient GEMM -> the bytes of the bulk all-gather beside it
    for i, it in enumerate(items):
        nxt = items[i + 1] if i + 1 < n else None
        if is_comm(it) and op_of(it) == "allgather" and gemm(nxt) and nxt.name.endswith("wgrad"):
            bulk[i] = base + len(out)
            dgrad = replace(nxt, name=nxt.name[:-len("wgrad")] + "dgrad")
            out.append(Segment("collective", op="allgather", nbytes=it.nbytes, layer=layer, side=True,
                               userbuffers=True, sms_priced=overlap(dgrad) is not None))
            gathered[nxt.name[:-len("wgrad")] + "dgrad"] = it.nbytes
    i = 0
    while i < n:
        it = items[i]
        nxt = items[i + 1] if i + 1 < n else None
        if i in bulk:
            flush()
            main(Segment("compute", time_of(nxt), nxt.flops, layer=layer, waits=(bulk[i],)))
            i += 2
            continue
        if is_comm(it) and op_of(it) == "allgather" and gemm(nxt):
            flush()
            o = overlap(nxt)
            before = (last_main,) if last_main >= 0 else ()  # the gather's input: what the stream made last
            if o is not None:  # TE's ring exchange (``ring_shifts``)
                parts, shifts = ring_shifts(tp, it.nbytes, o.aggregate)
                chunk = _chunk(nxt, parts)
                t = chunk_time(chunk, parts, beside(o))
                first = base + len(out)
                for k, nb in enumerate(shifts):
                    out.append(Segment("collective", op="shift", nbytes=nb, layer=layer, side=True,
                                       userbuffers=True, waits=before if k == 0 else (), sms_priced=True))
                lead = len(shifts) - (parts - 1)  # shifts the first GEMM chunk waits for (aggregate: 1)
                for c in range(parts):
                    need = c + lead - 1
                    main(Segment("compute", t, chunk.flops, layer=layer, waits=(first + need,) if need >= 0 else ()))
                i += 2
                continue
            chunk = _chunk(nxt, tp)
            t = chunk_time(chunk, tp, time_of)
            for c in range(tp):
                out.append(Segment("collective", op="allgather", nbytes=it.nbytes / tp, layer=layer, side=True,
                                   userbuffers=True, waits=before if c == 0 else ()))
                main(Segment("compute", t, chunk.flops, layer=layer, waits=(base + len(out) - 1,)))
            i += 2
            continue
        if gemm(it) and nxt is not None and is_comm(nxt) and op_of(nxt) == "reducescatter":
            flush()
            w = _weight_gradient(items, i)
            if w is not None:  # bulk: the input gradient whole, its scatter beside the weight gradient
                wgrad = items[w]
                o = overlap(it) if it.name in gathered else None
                main(Segment("compute", beside(o, "allgather", gathered.get(it.name, 0.0))(it), it.flops, layer=layer))
                scatter = base + len(out)
                o = overlap(wgrad)
                out.append(Segment("collective", op="reducescatter", nbytes=nxt.nbytes, layer=layer, side=True,
                                   userbuffers=True, waits=(last_main,), sms_priced=o is not None))
                main(Segment("compute", beside(o, "reducescatter", nxt.nbytes)(wgrad), wgrad.flops, layer=layer,
                             waits=(bulk[w - 1],) if w - 1 in bulk else ()))
                pending = [scatter]
                i = w + 1
                continue
            o = overlap(it)
            if o is not None and o.method == "ring_exchange":
                # TE's ring exchange: tp GEMM chunks, chunk c − 1's partial result sent to its
                # owner beside chunk c (the last chunk is the rank's own), then the received
                # partials summed on the main stream (``reduce_bf16``)
                chunk = _chunk(it, tp)
                t = chunk_time(chunk, tp, beside(o))
                for c in range(tp):
                    main(Segment("compute", t, chunk.flops, layer=layer))
                    if c < tp - 1:
                        out.append(Segment("collective", op="shift", nbytes=nxt.nbytes / tp, layer=layer, side=True,
                                           userbuffers=True, waits=(last_main,), sms_priced=True))
                pending = [base + len(out) - 2] if tp > 1 else []
                red = Op(f"{it.name}.reduce", it.phase, "memory", 0.0, nxt.nbytes, nxt.nbytes / tp, nxt.nbytes / tp)
                main(Segment("compute", time_of(red), 0.0, layer=layer))
                i += 2
                continue
            parts = PIPELINE_SPLITS if o is None else o.num_splits
            chunk = _chunk(it, parts)
            t = chunk_time(chunk, parts, beside(o, "reducescatter", nxt.nbytes / parts, min(parts, UB_STREAMS)))
            for c in range(parts):
                main(Segment("compute", t, chunk.flops, layer=layer))
                out.append(Segment("collective", op="reducescatter", nbytes=nxt.nbytes / parts, layer=layer,
                                   side=True, userbuffers=True, waits=(base + len(out) - 1,),
                                   sms_priced=o is not None))
            pending = [base + len(out) - 1]
            i += 2
            continue
        if tp_comm(it) and getattr(it, "side", False):  # issued now on the side stream, from the main one
            flush()
            side[it.name] = base + len(out)
            out.append(Segment("collective", op=op_of(it), nbytes=it.nbytes, layer=layer, group=group_of(it),
                               side=True, waits=(last_main,) if last_main >= 0 else (), label=label_of(it)))
        elif tp_comm(it):
            flush()
            main(Segment("collective", op=op_of(it), nbytes=it.nbytes, layer=layer, group=group_of(it),
                         label=label_of(it)))
        else:
            after = getattr(it, "after", None)
            needs = [side[n] for n in (after if isinstance(after, tuple) else (after,)) if n in side]
            if needs:  # needs those side collectives: a new piece waits for them
                flush()
                pending += needs
            dur += time_of(it)
            flops += it.flops
        i += 1
    flush()
    if pending or not out or out[-1].side:  # the layer ends on its own stream, after every chunk
        main(Segment("compute", 0.0, 0.0, layer=layer))
    return out


def te_order(items) -> list:
    """``items`` of a layer's backward with each weight-gradient GEMM (and the all-gather of
    its input) moved up to right after its linear layer's input-gradient GEMM and that
    GEMM's reduce-scatter, the order Transformer Engine's linear layers run their backward
    in, so the scatter can run beside the weight gradient (``bulk``). Items without a
    reduce-scatter after the input gradient, or without the weight gradient in the step,
    keep their place."""
    names = {getattr(it, "name", None): k for k, it in enumerate(items)}
    out, moved = [], set()
    for k, it in enumerate(items):
        if k in moved:
            continue
        out.append(it)
        prev = items[k - 1] if k else None
        if (getattr(it, "collective", None) == "reduce_scatter" and getattr(prev, "kind", None) == "gemm"
                and prev.name.endswith(".dgrad")):
            w = names.get(prev.name[:-len("dgrad")] + "wgrad")
            if w is not None and w > k:
                gather = w - 1 if getattr(items[w - 1], "collective", None) == "all_gather" else None
                for j in ((gather, w) if gather is not None else (w,)):
                    out.append(items[j])
                    moved.add(j)
    return out


def _weight_gradient(items, i: int) -> int | None:
    """Where the weight gradient of the input-gradient GEMM ``items[i]`` follows its
    reduce-scatter (``te_order``): i + 2, or i + 3 after the all-gather of its input; None
    if it does not."""
    op = items[i]
    if not op.name.endswith(".dgrad"):
        return None
    want = op.name[:-len("dgrad")] + "wgrad"
    for w in (i + 2, i + 3):
        if w < len(items) and getattr(items[w], "name", None) == want:
            return w
    return None


def chunk_time(chunk, parts: int, time_of: Callable) -> float:
    """Seconds one of ``parts`` GEMM chunks takes when Transformer Engine runs them on
    ``UB_STREAMS`` streams in turn: min(parts, UB_STREAMS) chunks share the SMs at once, so
    the chunk is priced as its share of that many batched together."""
    s = min(parts, UB_STREAMS)
    if s == 1:
        return time_of(chunk)
    group = replace(chunk, flops=chunk.flops * s, bytes_read=chunk.bytes_read * s,
                    bytes_written=chunk.bytes_written * s, output_bytes=chunk.output_bytes * s,
                    batch=chunk.batch * s)
    return time_of(group) / s


def gemm_beside(full_s: float, slow_s: float, comm_s: float, margin: bool) -> float:
    """Seconds a GEMM takes beside a userbuffers kernel holding some SMs: ``full_s`` on all
    the SMs, ``slow_s`` on those the kernel leaves. With an SM margin it is launched on the
    latter (``slow_s``); without one it runs at the slow rate while the kernel runs
    (``comm_s``) and at the full rate after: comm_s + full_s·(1 − comm_s/slow_s), at most slow_s."""
    if margin or comm_s >= slow_s:
        return slow_s
    return comm_s + full_s * (1.0 - comm_s / slow_s)


def ring_shifts(tp: int, nbytes: float, aggregate: bool) -> tuple[int, list[float]]:
    """Transformer Engine's ring-exchange all-gather of ``nbytes`` (the gathered buffer) over
    ``tp`` ranks (``CommOverlapP2PBase::split_overlap_ag``): the GEMM chunks and the bytes
    each rank sends to the next rank per step. Without ``aggregate``: tp chunks, the first on
    the rank's own shard, and tp − 1 shifts of a shard, shift c beside chunk c and chunk c + 1
    waiting for it. With it: one shard exchanged first (the first chunk waits for it), then
    tp/2 chunks of two shards each, beside shifts of two shards."""
    shard = nbytes / tp
    if aggregate:
        parts = max(1, tp // 2)
        return parts, [shard] + [2 * shard] * (parts - 1)
    return tp, [shard] * (tp - 1)


def _chunk(op, parts: int):
    """One of ``parts`` equal pieces of GEMM ``op`` cut along the tokens: the rows (m) of
    a forward or input-gradient GEMM, the reduction (k) of a weight gradient."""
    m, n, k = op.shape
    shape = (m, n, max(1, k // parts)) if op.name.endswith("wgrad") else (max(1, m // parts), n, k)
    return replace(op, flops=op.flops / parts, bytes_read=op.bytes_read / parts,
                   bytes_written=op.bytes_written / parts, output_bytes=op.output_bytes / parts, shape=shape)


def add_tp_collectives(prog: Program, segments: Callable[[int, Action], list[Segment] | None],
                       tp_group: Callable[[int], tuple[int, ...]],
                       other_groups: Callable[[int], dict[str, tuple[int, ...]]] | None = None) -> Program:
    """Expand each action for which ``segments(rank, action)`` returns a list into its
    compute segments and collectives over the rank's tp group, on the action's stream: as
    in Megatron-LM, tensor-parallel NCCL kernels run on the compute stream and block it.
    Overlapped chunks (``Segment.side``) run on ``TP_COMM_STREAM`` instead. A piece waits
    for the one before it on its stream (the first on each stream takes the action's
    deps) and for its ``waits``; the last piece takes the action's name. A ``comm`` piece
    (a collective priced outside the network) carries its ``group``: the engine starts it
    when every simulated member of the group can start its own. A segment whose ``group`` is
    not "tp" runs over ``other_groups(rank)[group]`` (the expert-parallel groups), category ``ep``."""
    out: dict[int, list[Action]] = {}
    shared: dict[tuple, tuple[list[Action], tuple[int, ...]]] = {}  # tensor-parallel peers build the same pieces
    for r, acts in prog.actions.items():
        group = {"tp": tp_group(r), **(other_groups(r) if other_groups is not None else {})}
        new: list[Action] = []
        for a in acts:
            segs = segments(r, a)
            if not segs:
                new.append(a)
                continue
            key = (tuple(group.items()), a.name, a.stream, a.category, tuple(segs))
            got = shared.get(key)
            if got is not None:  # the same but for the pieces that take the action's deps
                pieces, firsts = got
                new.extend(p.evolve(deps=a.deps) if k in firsts else p for k, p in enumerate(pieces))
                continue
            pieces, firsts = _pieces(a, segs, group)
            if pieces[-1].name != a.name:  # a trailing collective was dropped (tp = 1): rename the last piece
                pieces[-1] = pieces[-1].evolve(name=a.name)
            if len(group["tp"]) > 1:
                shared[key] = (pieces, firsts)
            new.extend(pieces)
        out[r] = new
    return prog.with_actions(out)


def _pieces(a: Action, segs, groups: dict) -> tuple[list[Action], tuple[int, ...]]:
    """Action ``a``'s pieces, and the positions of those that took ``a``'s deps."""
    pieces: list[Action] = []
    firsts: list[int] = []
    name_of: dict[int, str] = {}
    last_on: dict[str, str] = {}
    for i, s in enumerate(segs):
        group = groups[s.group]
        if s.kind in ("collective", "comm") and len(group) < 2:
            continue
        name = a.name if i == len(segs) - 1 else f"{a.name}.{i} {s.label}" if s.label else f"{a.name}.{i}"
        stream = HOST_STREAM if s.kind == "host" else TP_COMM_STREAM if s.side else a.stream
        prev = last_on.get(stream)
        deps = (a.deps if prev is None else (prev,)) + tuple(name_of[j] for j in s.waits if j in name_of)
        if prev is None:
            firsts.append(len(pieces))
        if s.kind == "host":  # the host launching kernels (sim.program.launch)
            act = Action.new(name, duration_s=s.duration_s, category=LAUNCH_CATEGORY, stream=stream, deps=deps,
                             layer=s.layer)
        elif s.kind == "collective":
            act = Action.new(name, kind="collective", op=s.op, group=group, nbytes=s.nbytes,
                             category=_CATEGORY.get(s.group, s.group), deps=deps, stream=stream, layer=s.layer,
                             **claim(s))
        elif s.kind == "comm":
            act = Action.new(name, kind="comm", op=s.op, duration_s=s.duration_s, nbytes=s.nbytes, group=group,
                             category="tp", deps=deps, stream=stream, layer=s.layer)
        else:
            act = Action.new(name, duration_s=s.duration_s, flops=s.flops, category=a.category, stream=stream,
                             deps=deps, layer=s.layer)
        pieces.append(act)
        name_of[i] = last_on[stream] = name
    return pieces, tuple(firsts)
