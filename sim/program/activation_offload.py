"""Activation offload to host memory: Megatron-Core's ``cpu_offloading`` with
``cpu_offloading_num_layers`` N, activations only (``cpu_offloading_weights`` False), as
Megatron-Bridge's GB200/GB300 performance recipes set it (scripts/performance/utils/helpers.py:
``recipe.model.cpu_offloading = True``, ``cpu_offloading_weights = False``,
``cpu_offloading_num_layers = N``; Megatron-Bridge fa0315ae2684 and r0.2.0 @ 0465189601951).

Megatron-Core hands the layers to Transformer Engine's ``get_cpu_offload_context``
(megatron/core/transformer/transformer_block.py), whose ``AsyncDoubleBufferGroupOffloadHandler``
(transformer_engine/pytorch/cpu_offload.py, TE v2.8) does the work, one group per transformer
layer (a group is committed at each layer's output):

- **Which tensors.** Those TE's modules mark with ``mark_activation_offload``: the saved
  inputs of LayerNormLinear / Linear / LayerNormMLP (and the norm output and statistics),
  attention's saved q, k, v, output and softmax statistics: in a Megatron-Core TE layer,
  the layer's saved activations. Here: the layer's stored activation bytes
  (``sim.program.memory.chunk_activation_parts``), every layer of group 0..N-1, i.e. the
  first N layers (``tensor_push`` offloads while ``current_group < num_offload_group``).
- **When, on which stream (forward).** A window map spreads the groups over the layers:
  ``w(i) = (L // N)(i + 1) - 1`` plus the remainder's shift (``layer_window_map``, here
  ``window_map``). Group 0's D2H copy is issued on the offload handler's own ``d2h_stream``
  after layer 0's forward; at the end of layer ``w(k)``'s forward the compute stream waits
  for the D2H stream (group k's copy done), group k's GPU memory is freed, and group k+1's
  copy is issued. The copies overlap the forward compute of the layers in between.
- **Backward.** At the start of layer ``w(k)``'s backward the compute stream waits for the
  ``h2d_stream`` (group k+1's reload done) and group k's reload is issued there (its GPU
  buffer allocated); before layer 0's backward the compute waits for every reload.
- **Memory saved.** Each offloaded layer's activations live on the GPU only from its
  forward to the sync at ``w(k)``, and again from its reload to its backward.

The copies are ``copy`` actions over the GPU's host route (``Topology.host_route``): PCIe on
x86 nodes, NVLink-C2C on Grace superchips. Copies run on copy engines: no SMs taken.
Megatron-Core allows it only with pp 1, no recomputation and no CUDA graphs
(``sim.inputs.rules``)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from sim.program.actions import Action, Program
from sim.program.passes import layer_uses

D2H_STREAM = "offload d2h"
H2D_STREAM = "offload h2d"


def window_map(num_layers: int, num_offload: int) -> list[int]:
    """TE's ``layer_window_map``: the layer at whose forward end group i's offload is waited
    on (and, in backward, at whose start group i's reload is issued)."""
    out, constant = [], 0
    for i in range(num_offload):
        w = (num_layers // num_offload) * (i + 1) - 1
        if i < num_layers % num_offload:
            w += i + 1
            constant = i + 1
        else:
            w += constant
        out.append(w)
    return out


def add_activation_offload(prog: Program, num_layers: int, num_offload: int, layer_bytes: dict) -> Program:
    """Each rank's program with the offload copies of ``num_offload`` layers (module doc);
    ``layer_bytes``: layer id -> the bytes its activations take per micro-batch."""
    win = window_map(num_layers, num_offload)
    out = {}
    for r, acts in prog.actions.items():
        lst = list(acts)
        uses = layer_uses(lst, ("F", "B"))
        span: dict[tuple[str, int], tuple[int, int]] = {(s, l): (i, j) for s, l, i, j in uses}
        steps = sorted({s for s, _, _, _ in uses})
        after: dict[int, list[Action]] = {}
        before: dict[int, list[Action]] = {}
        extra_deps: dict[int, list] = {}
        extra_mem: dict[int, list] = {}
        compute = [i for i, a in enumerate(lst) if a.stream == "compute" or (not a.stream and a.kind in ("compute", "comm"))]

        def nxt(i: int) -> int:  # the first compute-stream action after index i
            return compute[bisect_right(compute, i)]

        def prv(i: int) -> int:  # the last compute-stream action before index i
            return compute[bisect_left(compute, i) - 1]
        for step in steps:
            if "F" not in step:  # (steps are named <stage><kind><micro-batch>: 0F3, 0B3)
                continue
            back = step.replace("F", "B", 1)
            nb = [float(layer_bytes.get(k, 0.0)) for k in range(num_offload)]
            d2h = [f"offload layer {k} of {step}" for k in range(num_offload)]
            h2d = [f"reload layer {k} for {back}" for k in range(num_offload)]
            # forward: group 0 after layer 0; group k+1 after layer w(k), behind group k
            after.setdefault(span[(step, 0)][1], []).append(
                Action(d2h[0], kind="copy", op="d2h", nbytes=nb[0], category="offload", stream=D2H_STREAM,
                       deps=(lst[span[(step, 0)][1]].name,)))
            for k in range(num_offload):
                end = span[(step, win[k])][1]
                follow = nxt(end)  # the compute after layer w(k): waits for group k's copy, frees its memory
                extra_deps.setdefault(follow, []).append(d2h[k])
                extra_mem.setdefault(follow, []).append(("start", "activations", -nb[k]))
                if k + 1 < num_offload:
                    after.setdefault(end, []).append(
                        Action(d2h[k + 1], kind="copy", op="d2h", nbytes=nb[k + 1], category="offload",
                               stream=D2H_STREAM, deps=(lst[end].name, d2h[k])))
            # backward: at layer w(k)'s start, wait for group k+1's reload, then issue group k's
            for k in reversed(range(num_offload)):
                first = span[(back, win[k])][0]
                if k + 1 < num_offload:
                    extra_deps.setdefault(first, []).append(h2d[k + 1])
                deps = (lst[prv(first)].name,) + ((h2d[k + 1],) if k + 1 < num_offload else ())
                before.setdefault(first, []).append(
                    Action(h2d[k], kind="copy", op="h2d", nbytes=nb[k], category="offload", stream=H2D_STREAM,
                           deps=deps, mem=(("start", "activations", nb[k]),)))
                extra_deps.setdefault(span[(back, k)][0], []).append(h2d[k])  # (its tensors back before its backward)
        new = []
        for i, a in enumerate(lst):
            new += before.get(i, [])
            if i in extra_deps or i in extra_mem:
                deps = tuple(dict.fromkeys(tuple(a.deps) + tuple(extra_deps.get(i, ()))))
                a = a.evolve(deps=deps, mem=tuple(a.mem) + tuple(extra_mem.get(i, ())))
            new.append(a)
            new += after.get(i, [])
        out[r] = new
    return prog.with_actions(out)
