"""PyTorch FSDP's own memory-bound copies around its ZeRO-3 collectives.

Megatron-Core's rows, which the presets are fitted to, gather and reduce straight from and
into their buffers; PyTorch's two FSDPs copy the bytes on the way, and each copy is a
memory-bound kernel of its own. What each copies, when and on which stream, read from
PyTorch's source (pytorch/pytorch, torch/distributed/fsdp/; FSDP1 in ``_flat_param.py`` and
``_runtime_utils.py``, FSDP2 in ``_fully_shard/_fsdp_collectives.py`` and
``_fsdp_param_group.py``), with the parameters kept in fp32 and gathered in bf16
(``param_dtype``) as every framework here runs them, and the gradients reduced in the
framework's ``reduce_dtype`` (``sim.inputs.frameworks.Framework.reduce_fp32``). U is a
layer's unsharded elements, S = U/n its shard on one of the n ranks of the group.

FSDP1 (``FullyShardedDataParallel``, one flat parameter per wrapped block):

- before each all-gather, ``FlatParamHandle.pre_unshard`` -> ``_use_low_precision_shard``:
  ``_mp_shard.copy_(flat_param._local_shard)``, the fp32 shard cast to bf16 (read 4S, write
  2S), on the pre-unshard stream (``_unshard(state, handle, unshard_stream,
  pre_unshard_stream)``), a side stream the all-gather's stream waits for. The all-gather
  then reads that shard and writes the padded unsharded flat parameter directly; the
  parameters are views of it (``_use_unsharded_views``: ``split`` and ``view``): no copy-in,
  no copy-out.
- in backward, autograd's gradient of those views: the views come from ``torch.split`` of
  the flat parameter (``_get_unflat_views_aligned`` / ``_unaligned``), whose backward
  concatenates every view's gradient into one unsharded flat gradient (read 2U, write 2U),
  on the compute stream, before the flat parameter's post-backward hook runs.
- ``_post_backward_hook``: on the post-backward stream, ``flat_param.grad.to(reduce_dtype)``
  when that is fp32 (read 2U, write 4U); ``_reduce_grad`` then divides the unsharded gradient
  in place by the pre-divide factor, ``_div_if_needed(padded_unsharded_grad,
  _gradient_predivide_factor)`` (``tensor.div_``: read and write U elements of
  ``reduce_dtype``), and issues the reduce-scatter from the same stream (the simulator's ``REDUCE_STREAM``; the collective runs on the
  process group's NCCL stream, ``sim.program.process_group_streams``). ``_get_reduce_scatter_tensors`` pads with
  ``F.pad`` (a copy) only when U is not a multiple of n, which ``use_orig_params``
  (``_init_flat_param_and_metadata``: "Pad to be divisible by world size to avoid a copy for
  the post-backward reduce-scatter") and the rows' layer sizes rule out: not modelled.
  These two unsharded kernels are priced on the compute stream, where the backward's
  kernels run, not beside them: each is an elementwise kernel over the layer's whole
  gradient, thousands of thread blocks, and a block runs only on an SM with registers and
  shared memory to spare (CUDA C++ Programming Guide, "Concurrent Kernel Execution": kernels
  of different streams run at once only as resources allow). A block of a Hopper GEMM takes
  an SM's registers whole (CUTLASS 3's warp-specialized kernels,
  ``sm90_gemm_tma_warpspecialized_cooperative.hpp``: 232 registers for each of 256 MMA
  threads and 40 for 128 load threads, 64,512 of the 65,536, and most of the shared memory
  for its pipeline stages; cuBLAS's Hopper kernels are taken to be alike: an assumption),
  so the copy's blocks and the backward's take turns on the SMs and the copy costs the
  backward its own time. The shard-sized copies (1/n of these) stay on their streams.
- after it, ``_div_if_needed(new_sharded_grad, _gradient_postdivide_factor)`` divides the
  reduced shard (read and write S elements). The factors (``_init_core_state``, torch 2.1
  ``_init_utils.py``; ``DefaultState._get_gradient_predivide_factor``): the pre-divide factor
  f doubles from 1 while n is a multiple of f and n/f > f, the post-divide is n/f, and each
  divides only when its factor is over 1: the pre-divide on every group of 2 ranks or more,
  the post-divide from 3 ranks on (n = 2: f = 2, n/f = 1; n = 64: 8 and 8).
- then ``_accumulate_sharded_grad``: ``_saved_grad_shard += sharded_grad`` from the
  second micro-batch of a step on (read 2 shards, write one, in ``reduce_dtype``); with a
  bf16 ``reduce_dtype``, ``_cast_grad_to_param_dtype`` casts the reduced shard to fp32
  (read 2S, write 4S). Both on the post-backward stream.
- not a copy: ``limit_all_gathers`` makes the CPU wait for the all-gather two blocks back
  (``_free_event_queue``), and the unsharded buffer's ``_alloc_storage`` / ``_free_storage``
  resize a storage through the caching allocator: no kernel either.

FSDP2 (``fully_shard``, one DTensor per parameter):

- copy-in, on ``all_gather_copy_in_stream`` (``FSDPCommContext.get_all_gather_streams``: a
  stream of its own in the forward and pre-backward hooks): ``_get_param_all_gather_inputs``
  casts the fp32 shards into one bf16 buffer with ``torch._foreach_copy_`` (read 4S, write
  2S), and ``all_gather_copy_in`` copies that into the all-gather's input slice of its
  output (``torch._foreach_copy_``, read 2S, write 2S).
- copy-out, ``foreach_all_gather_copy_out`` from ``FSDPParamGroup.wait_for_unshard`` on the
  current (compute) stream: ``split_with_sizes_copy`` of the gathered buffer into each
  parameter's unsharded storage (read 2U, write 2U).
- ``foreach_reduce``: ``foreach_reduce_scatter_copy_in`` (``torch._chunk_cat``) of the
  bf16 gradients into the reduce-scatter's input in ``reduce_dtype`` (read 2U, write 2U or
  4U) on the current (compute) stream, which the reduce-scatter stream then waits for;
  after the reduce-scatter, on the stream it is issued from (``reduce_scatter_stream``),
  ``_to_dtype_if_needed`` casts a bf16 result to the fp32 parameters' dtype (read 2S, write
  4S; none when reduced in fp32), and from the second micro-batch on ``sharded_param.grad._local_tensor += new_sharded_grad`` (fp32:
  read 8S, write 4S).

Under the deferred gradient sync (NeMo AutoModel's ``defer_fsdp_grad_sync``,
``sim.inputs.frameworks`` module doc) each layer's reduce-scatter and its reduce-side copies
come once per step, after the last micro-batch's backward, with no sharded accumulation;
instead, on the compute stream right after each backward of the layer
(``deferred_accumulations``): FSDP2's ``FSDPParamGroup.post_backward`` ->
``FSDPParam.to_accumulated_grad_if_needed`` after the first micro-batch when reduced in fp32
(``unsharded_grad.to(reduce_dtype)``: read 2U, write 4U), and from the second micro-batch
on the add into the held unsharded gradients: in bf16 autograd's ``AccumulateGrad``
(``grad += new_grad``: read 2U + 2U, write 2U), in fp32
``accumulate_unsharded_grad_if_needed`` (``unsharded_accumulated_grad += grad``: read
4U + 2U, write 4U).

Parameters whose data-parallel group has one rank are not under FSDP at all, and autograd
accumulates their gradients across micro-batches just the same (``alone`` in
``add_deferred_accumulations``): NeMo AutoModel's MoE parallelizer
(components/moe/parallelizer.py ``apply_fsdp`` @ 89e3a9fdd604) shards the grouped experts only
when the expert-shard mesh has more than one rank (``ep_shard_enabled``), and otherwise passes
them to the block's ``fully_shard`` as ``ignored_params``; their gradients then stay in the
parameters' dtype (bf16, no mixed-precision policy) and from the second micro-batch on
``AccumulateGrad`` adds each new one into ``.grad`` (read 2U + 2U, write 2U) after the layer's
backward, every micro-batch of the step (no sync window: nothing is reduced).

Each copy is priced as a memory-bound library kernel: bytes read and written at the
profile's ``memory_rate()`` (``hbm_bandwidth_Bps · memory_efficiency``) plus
``kernel_launch_s`` per kernel (``copy_time``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.program.actions import Action, Program

PARAM_BYTES, GATHER_BYTES, GRAD_BYTES = 4, 2, 2
"""fp32 parameters (the sharded masters), bf16 gathered parameters (``param_dtype``), bf16
gradients (computed in the gathered parameters' dtype)."""

WHEN = ("gather", "reduce", "after_reduce", "accumulate")
"""When a copy runs: before each all-gather (its input) or after it (its output, before the
layer's first kernel); before each reduce-scatter; after it; after it from a step's second
micro-batch on."""
STREAMS = ("copy_in", "compute", "reduce")
"""Where: FSDP's side stream before the all-gather (FSDP1's pre-unshard stream, FSDP2's
all-gather copy-in stream), the compute stream, or the stream FSDP issues the
reduce-scatter from (``REDUCE_STREAM``)."""
COPY_IN_STREAM = "fsdp_copy_in"
"""The simulator's name of FSDP's copy-in side stream."""
REDUCE_STREAM = "fsdp_reduce"
"""The simulator's name of the stream FSDP issues its reduce-scatters from and runs the copies
around them on (FSDP1's ``_post_backward_stream``, FSDP2's ``reduce_scatter_stream``): a CUDA
stream of FSDP's own; the reduce-scatter itself runs on its process group's NCCL stream
(``sim.program.process_group_streams``), which waits for it."""


@dataclass(frozen=True)
class Copy:
    """One of FSDP's copies: the function that makes it, when it runs (``WHEN``), on which
    stream (``STREAMS``), the bytes read and written per element of the shard or of the
    unsharded layer (``of``), and its kernels."""

    what: str
    when: str
    stream: str
    of: str  # "shard" or "unsharded"
    read: float
    written: float
    kernels: int = 1
    min_ranks: int = 2
    """It runs only where the group has at least this many ranks (FSDP1's post-divide: 3)."""

    def nbytes(self, unsharded: float, ranks: int) -> float:
        """Bytes read and written for a layer of ``unsharded`` elements sharded over ``ranks``."""
        n = unsharded if self.of == "unsharded" else unsharded / ranks
        return (self.read + self.written) * n


def fsdp_copies(fsdp: str, reduce_fp32: bool) -> tuple[Copy, ...]:
    """FSDP1's or FSDP2's copies (module doc), with gradients reduced in fp32 or in bf16."""
    r = 4 if reduce_fp32 else GRAD_BYTES
    if fsdp == "fsdp1":
        out = [Copy("_use_low_precision_shard (fp32 shard -> bf16)", "gather", "copy_in", "shard",
                    PARAM_BYTES, GATHER_BYTES),
               Copy("split backward: cat of the views' gradients", "reduce", "compute", "unsharded",
                    GRAD_BYTES, GRAD_BYTES)]
        # (the unsharded ones on the post-backward stream priced on the compute stream: module doc)
        if reduce_fp32:
            out.append(Copy("_post_backward_hook grad.to(reduce_dtype)", "reduce", "compute", "unsharded",
                            GRAD_BYTES, r))
        out += [Copy("_reduce_grad _div_if_needed (gradient pre-divide)", "reduce", "compute", "unsharded", r, r),
                Copy("_reduce_grad _div_if_needed (gradient post-divide)", "after_reduce", "reduce", "shard", r, r,
                     min_ranks=3)]
        if not reduce_fp32:
            out.append(Copy("_cast_grad_to_param_dtype", "after_reduce", "reduce", "shard", GRAD_BYTES, PARAM_BYTES))
        out.append(Copy("_accumulate_sharded_grad (+=)", "accumulate", "reduce", "shard", 2 * r, r))
        return tuple(out)
    if fsdp == "fsdp2":
        out = [Copy("_get_param_all_gather_inputs _foreach_copy_ (fp32 -> bf16)", "gather", "copy_in", "shard",
                    PARAM_BYTES, GATHER_BYTES),
               Copy("all_gather_copy_in _foreach_copy_", "gather", "copy_in", "shard", GATHER_BYTES, GATHER_BYTES),
               Copy("foreach_all_gather_copy_out split_with_sizes_copy", "gather", "compute", "unsharded",
                    GATHER_BYTES, GATHER_BYTES),
               Copy("foreach_reduce_scatter_copy_in _chunk_cat", "reduce", "compute", "unsharded", GRAD_BYTES, r)]
        if not reduce_fp32:
            out.append(Copy("foreach_reduce _to_dtype_if_needed", "after_reduce", "reduce", "shard",
                            GRAD_BYTES, PARAM_BYTES))
        out.append(Copy("foreach_reduce grad += (accumulate)", "accumulate", "reduce", "shard",
                        2 * PARAM_BYTES, PARAM_BYTES))
        return tuple(out)
    return ()


def copy_time(copy: Copy, unsharded: float, ranks: int, rate_Bps: float, launch_s: float) -> float:
    """Seconds of ``copy`` for a layer of ``unsharded`` elements over ``ranks``: its bytes
    at ``rate_Bps`` plus ``launch_s`` per kernel."""
    return copy.nbytes(unsharded, ranks) / rate_Bps + copy.kernels * launch_s


def _microbatch(name: str) -> int | None:
    """The micro-batch of a per-micro-batch bucket's name (``... of 2B3`` -> 3)."""
    _, sep, step = name.rpartition(" of ")
    if not sep:
        return None
    digits = ""
    for ch in reversed(step):
        if not ch.isdigit():
            break
        digits = ch + digits
    return int(digits) if digits else None


def _by_when(copies: tuple[Copy, ...]) -> dict[str, list[Copy]]:
    out: dict[str, list[Copy]] = {}
    for c in copies:
        out.setdefault(c.when, []).append(c)
    return out


def add_fsdp_copies(prog: Program, copies: tuple[Copy, ...], reduce_bytes: float, rate_Bps: float,
                    launch_s: float, experts: tuple[str, tuple[Copy, ...], float] | None = None) -> Program:
    """FSDP's copies (``fsdp_copies``) around each ZeRO-3 parameter all-gather (category
    ``zero`` on stream ``zero``, ``sim.program.zero.add_param_gathers``: 2 bytes an element)
    and each gradient reduce-scatter (category ``dp``, ``sim.program.passes.add_grad_sync``:
    ``reduce_bytes`` an element). Copy-in copies run on ``COPY_IN_STREAM`` and the all-gather
    waits for them; a gather's compute copy (its copy-out) runs on the stream of the first
    action that waits for the gather, just before it; a reduce-scatter's copies run after
    the backward it waits for (compute) and on ``REDUCE_STREAM`` (reduce), and the
    reduce-scatter waits for them; the after-reduce and accumulate copies follow it on
    ``REDUCE_STREAM``. With ``experts`` (a name prefix, copies, bytes an element) the
    reduce-scatters whose names start with that prefix take those copies and bytes instead
    (the routed experts reduced in another dtype). Category ``fsdp``; names ``fsdp <what>
    for <collective>``."""
    if not copies:
        return prog
    by_when = _by_when(copies)
    prefix, e_when, e_bytes = (experts[0], _by_when(experts[1]), experts[2]) if experts else ("", by_when,
                                                                                              reduce_bytes)

    def act(c: Copy, target: Action, unsharded: float, stream: str, deps: tuple) -> Action:
        return Action.new(f"fsdp {c.what} for {target.name}", duration_s=copy_time(c, unsharded, len(target.group),
                                                                                   rate_Bps, launch_s),
                          nbytes=c.nbytes(unsharded, len(target.group)), category="fsdp", stream=stream, deps=deps)

    out = {}
    for r, acts in prog.actions.items():
        lst = list(acts)
        stream_of = {a.name: a.stream for a in lst}
        copy_outs: dict[str, tuple] = {}  # gather name -> (gather, elements, its output copies): before its first user
        new: list[Action] = []
        for a in lst:
            if a.kind == "collective" and a.op == "allgather" and a.category == "zero" and a.stream == "zero":
                u = a.nbytes / GATHER_BYTES
                deps, pre = a.deps, []
                for c in by_when.get("gather", ()):
                    if c.stream == "copy_in":
                        pre.append(act(c, a, u, COPY_IN_STREAM, deps))
                        deps = (pre[-1].name,)
                new.extend(pre)
                a = a.evolve(deps=a.deps + (pre[-1].name,)) if pre else a
                new.append(a)
                outs = [c for c in by_when.get("gather", ()) if c.stream != "copy_in"]
                if outs:
                    copy_outs[a.name] = (a, u, outs)
                continue
            if a.kind == "collective" and a.op == "reducescatter" and a.category == "dp":
                when, nb = (e_when, e_bytes) if prefix and a.name.startswith(prefix) else (by_when, reduce_bytes)
                u = a.nbytes / nb
                anchor = a.deps[0] if a.deps else None
                deps, pre = a.deps, []
                for c in when.get("reduce", ()):
                    if len(a.group) < c.min_ranks:
                        continue
                    stream = stream_of.get(anchor, "compute") if c.stream == "compute" else REDUCE_STREAM
                    pre.append(act(c, a, u, stream, deps))
                    deps = (pre[-1].name,)
                new.extend(pre)
                new.append(a.evolve(deps=a.deps + tuple(p.name for p in pre[-1:])) if pre else a)
                prev = a.name
                mb = _microbatch(a.name)
                for c in when.get("after_reduce", []) + (when.get("accumulate", []) if mb else []):
                    if len(a.group) < c.min_ranks:
                        continue
                    new.append(act(c, a, u, REDUCE_STREAM, (prev,)))
                    prev = new[-1].name
                continue
            waits = [d for d in a.deps if isinstance(d, str) and d in copy_outs]
            for g in waits:
                gather, u, cs = copy_outs.pop(g)
                prev = g
                for c in cs:
                    new.append(act(c, gather, u, a.stream, (prev,)))
                    prev = new[-1].name
                a = a.evolve(deps=a.deps + (prev,))
            new.append(a)
        out[r] = new
    return prog.with_actions(out)


def deferred_accumulations(reduce_fp32: bool) -> tuple[Copy | None, Copy]:
    """Under the deferred gradient sync (module doc): the copy after a layer's first backward
    of the step (None in bf16) and the add after each later one, on the compute stream."""
    if reduce_fp32:
        return (Copy("to_accumulated_grad_if_needed (bf16 -> fp32)", "first_backward", "compute", "unsharded",
                     GRAD_BYTES, 4),
                Copy("accumulate_unsharded_grad_if_needed (+=)", "later_backward", "compute", "unsharded",
                     4 + GRAD_BYTES, 4))
    return None, Copy("AccumulateGrad grad += (unsharded)", "later_backward", "compute", "unsharded",
                      2 * GRAD_BYTES, GRAD_BYTES)


def _step_microbatch(step: str) -> tuple[str, int]:
    """A pipeline step's stage and micro-batch (``2B3`` -> ("2", 3))."""
    for i, ch in enumerate(step):
        if ch.isalpha():
            return step[:i], int(step[i + 1:])
    raise ValueError(f"not a step name: {step!r}")


def add_deferred_accumulations(prog: Program, first: Copy | None, later: Copy, elements, dp_group, rate_Bps: float,
                               launch_s: float, label: str = "layer", window: int | None = None,
                               alone: Copy | None = None) -> Program:
    """The deferred gradient sync's copies (``deferred_accumulations``): after each layer's
    last backward piece of each micro-batch (its W step under a split backward), on that
    piece's stream, ``first`` for the layer's first micro-batch of the step, ``later`` for
    the others; ``elements(rank, layer)`` the layer's unsharded elements (0: none), on ranks
    whose ``dp_group`` has two ranks or more (where the gradients are reduce-scattered); nothing
    for a layer with one micro-batch (that one syncs at once). With ``window`` the gradients
    sync once per ``window`` micro-batches (one pipeline-schedule call,
    ``ParallelPlan.sharding.pp_sync_window``): each window starts afresh (``first``, then
    ``later``). With ``alone`` (autograd's add, module doc), on ranks whose group has one rank
    that add after each of the layer's backwards but its first of the step, whatever the window.
    Category ``fsdp``; names ``fsdp <what> for {label} <layer> of <step>``."""
    from sim.program.passes import layer_uses

    out = {}
    for r, acts in prog.actions.items():
        lst = list(acts)
        single = len(dp_group(r)) < 2
        if single and alone is None:
            out[r] = lst
            continue
        if single:  # outside FSDP: autograd's add from the step's second micro-batch, nothing reduced
            first, later, window = None, alone, None
        last: dict[tuple, tuple] = {}  # (layer, stage, micro-batch) -> (step, index of its last piece)
        for step, layer, _i, j in layer_uses(lst, ("B", "W")):
            stage, mb = _step_microbatch(step.split(".")[0])
            key = (layer, stage, mb)
            if key not in last or j > last[key][1]:
                last[key] = (step, j)
        seen: set = set()
        count: dict = {}
        for layer, _stage, mb in last:
            key = (layer, mb // window if window else 0)
            count[key] = count.get(key, 0) + 1
        after: dict[int, list[Action]] = {}
        for (layer, _stage, mb), (step, j) in sorted(last.items(), key=lambda kv: kv[1][1]):
            n = elements(r, layer)
            key = (layer, mb // window if window else 0)  # the layer in its sync window
            c = later if key in seen else first
            seen.add(key)
            if not n or c is None or count[key] == 1:  # (a window's only backward reduces at once: no upcast)
                continue
            a = lst[j]
            after.setdefault(j, []).append(Action.new(
                f"fsdp {c.what} for {label} {layer} of {step}", duration_s=copy_time(c, n, 1, rate_Bps, launch_s),
                nbytes=c.nbytes(n, 1), category="fsdp", stream=a.stream, deps=(a.name,)))
        new = []
        for i, a in enumerate(lst):
            new.append(a)
            new.extend(after.get(i, ()))
        out[r] = new
    return prog.with_actions(out)
