"""The parts of a layer's work that mixtures of experts and MLA change (``sim.program.workload``
builds the rest and calls these).

MoE block (Megatron-Core's ``MoELayer``, ``megatron/core/transformer/moe/``), on a rank
that routes T tokens (b·s, or b·s/tp under sequence parallelism; Megatron-LM requires
sequence parallelism for MoE with tp > 1) to k experts each, R = T·k copies:

    forward   shared experts as a tensor-parallel MLP on every token (before the router,
              or beside the exchanges with ``--moe-shared-expert-overlap``); router: score
              GEMM (T × E × h), score function, top-k and load-balancing loss (``_router``);
              permute (copy the R token copies into expert order, ``_permute``); dispatch
              all-to-all over the expert-parallel group; [all-gather over the
              expert-tensor-parallel group]; the received copies sorted by local expert
              (``_sort_chunks``); the rank's E/ep experts as grouped GEMMs (up, activation,
              down) on the L tokens it received (× etp after the gather), one GEMM launched
              per local expert; the copies sorted back; [reduce-scatter over etp]; combine
              all-to-all; unpermute (the k copies of each token weighted and summed,
              ``_unpermute``)
    backward  the same in reverse, input gradients only (B)
    weights   the experts' grouped weight GEMMs, the shared experts' and the router's (W)

The allgather and flex dispatchers exchange differently (``_exchange``; the allgather one
permutes the rows it gathered, the flex one the tokens each rank received:
``_received_tokens``). ``--moe-permute-fusion`` prices the permutations as Transformer
Engine's fused kernels; the shared experts beside DeepEP's exchanges run on the
SMs DeepEP's kernels leave (``DEEPEP_SMS``). Each op carries the kernels the host launches
for it and where the host synchronises with the GPU (``Op.kernels``, ``Op.host_sync``:
``sim.program.launch``), unless a CUDA graph covers the block (``MoeShape.graphed``).

L is the tokens the busiest rank of the group receives (``sim.program.routing``): R when
routing is balanced. Every rank is given the busiest one's expert work, since the combine
all-to-all cannot finish before it, and the all-to-alls move L·h per rank (the busiest
rank's receive, what its links must carry): nccl-tests' all-to-all size, the send buffer,
is L·h·bytes, so a balanced all-to-all of ep ranks moves T·k·h·bytes·(ep−1)/ep over the
links of each. Grouped GEMMs are priced as E/ep GEMMs of L/(E/ep) rows each (one
op; the per-expert spread of the counts is not), run as Transformer Engine runs them: one
cuBLAS kernel per expert, four streams taking them in turn (``GROUPED_GEMM_STREAMS``).

MLA (DeepSeek-V2/V3, ``sim.inputs.moe``): the query and key/value projections are the
real down- and up-projections with their RMSNorms; the down-projections are replicated
on every tensor-parallel rank and run on all b·s tokens (the gathered sequence), the
up-projections split by head. The attention core multiplies queries and keys of
qk + rope = 192 wide and values of 128 (DeepSeek-V3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sim.inputs.moe import mla_projections
from sim.inputs.strategies import TOKEN_DISPATCHERS, TokenDispatcher

_ACT_FLOPS = {"gelu": 10, "swiglu": 6}


@dataclass(frozen=True)
class MoeShape:
    """How one MoE layer runs on a rank: expert-parallel size, expert tensor-parallel size,
    and the tokens the busiest rank of the expert-parallel group receives."""

    ep: int
    etp: int
    load: int
    dispatcher: TokenDispatcher = TOKEN_DISPATCHERS["alltoall"]
    """``sim.program.dispatch``: alltoall, allgather or flex (``sim.inputs.strategies``)."""
    rail: float = 0.0
    """flex: tokens per rank of the inter-node exchange (the engine's all-to-all buffer)."""
    node: float = 0.0
    """flex: tokens per rank of the intra-node exchange."""
    permute_fusion: bool = False
    """``--moe-permute-fusion``: Transformer Engine's permute kernels (``_permute``)."""
    shared_overlap: bool = False
    """``--moe-shared-expert-overlap``: the shared experts beside the exchanges (``_shared``)."""
    graphed: bool = False
    """A CUDA graph covers the block (``sim.inputs.cuda_graphs``): no host synchronisation in it."""
    dropless: bool = True
    """No capacity factor (where the alltoall dispatcher synchronises, ``_sync_on_exchange``)."""
    capacity_factor: float | None = None
    """``--moe-expert-capacity-factor`` (None: dropless): the router's token dropping (``_capacity``)."""
    sms: int = 0
    """flex: SMs its dispatch and combine kernels hold while they run (``DEEPEP_SMS`` by default)."""
    quant_align: int = 0
    """Under FP8 or FP4: the multiple of rows each expert's split must have for Transformer Engine's
    quantized grouped GEMM (``quant_align``), which ``TEGroupedMLP`` pads its input to (``_quant_pad``);
    0 in BF16."""


def attention_widths(m) -> tuple[int, int, int, int]:
    """(width of Q, K and V together, width of the attention output, query/key head
    width, value head width), over all heads."""
    if m.mla:
        d_qk, d_v = m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
        heads = m.num_attention_heads
        return heads * (2 * d_qk + d_v), heads * d_v, d_qk, d_v
    return m.q_dim + 2 * m.kv_dim, m.q_dim, m.head_dim, m.head_dim


QK_NORM_FLOPS = 5
"""FLOPs per element of an RMSNorm forward (square, sum, scale by 1/rms, by the weight; as the
layer norms, ``sim.program.workload._NORM_FLOPS``)."""


def _qk_norm(w, m, n_tok: int, t: int, grad: bool) -> None:
    """``--qk-layernorm`` (``ModelSpec.qk_layernorm``): Megatron-Core's ``SelfAttention`` runs
    ``q_layernorm`` on the query [s, b, heads, d] and ``k_layernorm`` on the key [s, b, groups, d]
    (``get_query_key_value_tensors``), each a Transformer Engine RMSNorm over rows of d = head
    width: one kernel each forward, which reads the e-byte input and writes the e-byte output (and
    one fp32 1/rms per row); backward TE's ``rmsnorm_bwd`` reads the gradient, the input and the
    1/rms and writes the input's gradient and per-block partial sums of the weight's gradient,
    which a second kernel reduces: two kernels each. Elements per rank: the token count times the
    query width, and the key width, over the tensor-parallel size (heads are split)."""
    e = w.e
    rows_q, rows_k = n_tok * m.num_attention_heads // t, n_tok * max(1, m.num_key_value_heads // t)
    n = (rows_q + rows_k) * m.head_dim
    rows = rows_q + rows_k
    if grad:
        w.mem("attn.qk_norm.grad", 2 * e * n + 4 * rows, e * n, 2 * QK_NORM_FLOPS * n, output=e * n, kernels=4)
    else:
        w.mem("attn.qk_norm", e * n, e * n + 4 * rows, QK_NORM_FLOPS * n, output=e * n, kernels=2)


def qkv_forward(w, m, n_tok: int, t: int) -> None:
    """The query/key/value projections: one GEMM, or MLA's projections and norms; then
    Qwen3's per-head query and key norms (``_qk_norm``)."""
    if not m.mla:
        w.gemm("attn.qkv", n_tok, attention_widths(m)[0] // t, m.hidden_size, bias=m.bias)
        if m.qk_layernorm:
            _qk_norm(w, m, n_tok, t, grad=False)
        return
    for name, i, o, split in mla_projections(m):
        w.gemm(name, n_tok, o // t if split else o, i)
        if name.endswith("down"):
            rank = o if name == "attn.q_down" else m.kv_lora_rank
            w.mem(f"{name}.norm", w.e * n_tok * rank, w.e * n_tok * rank, 5 * n_tok * rank)


def qkv_dgrad(w, m, n_tok: int, t: int) -> None:
    """Input gradients of the projections, in reverse."""
    if not m.mla:
        if m.qk_layernorm:
            _qk_norm(w, m, n_tok, t, grad=True)
        w.gemm("attn.qkv.dgrad", n_tok, m.hidden_size, attention_widths(m)[0] // t)
        return
    for name, i, o, split in reversed(mla_projections(m)):
        if name.endswith("down"):
            rank = o if name == "attn.q_down" else m.kv_lora_rank
            w.mem(f"{name}.norm.grad", 2 * w.e * n_tok * rank, w.e * n_tok * rank, 10 * n_tok * rank)
        w.gemm(f"{name}.dgrad", n_tok, i, o // t if split else o)


def qkv_wgrads(w, m, n_tok: int, t: int, regather: bool) -> None:
    """Weight gradients of the projections (their sequence-parallel input gathered again)."""
    if regather:
        w.comm("attn.qkv.all_gather.input", "all_gather", w.e * n_tok * m.hidden_size)
    if not m.mla:
        w.gemm("attn.qkv.wgrad", m.hidden_size, attention_widths(m)[0] // t, n_tok)
        return
    for name, i, o, split in mla_projections(m):
        w.gemm(f"{name}.wgrad", i, o // t if split else o, n_tok)


def _tokens(m, b: int, t: int, sp: bool) -> int:
    n_tok = b * m.seq_length
    return n_tok // t if sp and t > 1 else n_tok


def _expert_rows(m, shape: MoeShape) -> tuple[int, int, int, int]:
    """(tokens per local expert, local experts, expert width on this rank, up width)."""
    local = m.num_experts // shape.ep
    f = m.moe_ffn_hidden_size // shape.etp
    rows = max(1, -(-shape.load * shape.etp // local))
    return rows, local, f, (2 if m.mlp == "swiglu" else 1) * f


def quant_align(recipe: str | None) -> int:
    """Rows per expert split that Transformer Engine's quantized grouped GEMM needs, by recipe
    name (None: BF16, no padding): ``Fp8Padding``'s ``align_size``, "32 for MXFP8 and 16 for
    others" (transformer_engine/pytorch/module/fp8_padding.py at TE v2.9, the NeMo 25.11
    container's, and v2.7: ``32 if FP8GlobalStateManager.get_fp8_recipe().mxfp8() else 16``)."""
    if recipe is None:
        return 0
    return 32 if recipe == "mxfp8" else 16


def quant_pad_rows(shape: MoeShape, rows: int) -> float:
    """Rows ``TEGroupedMLP`` adds to each local expert's split before its quantized grouped GEMM
    (0: none, and no padding kernel runs). Megatron-Core's ``TEGroupedMLP.forward``
    (megatron/core/transformer/moe/experts.py at Megatron-LM cba6b0ed, Megatron-Bridge r0.2.0's)
    calls ``Fp8Padding`` under ``config.fp8 or config.fp4``, which returns its input untouched
    when every split is already a multiple of the alignment ("no padding needed"). With a
    capacity factor (drop-and-pad) every local expert receives the same ``rows``: padded by
    (−rows) mod align, usually 0. Dropless, the splits are the routed counts, which the
    dispatcher does not align (Megatron-Core's ``moe_router_padding_for_quantization``, which
    would, is off in the recipes and not a trainsim setting) and which even forced load
    balancing draws at random (``RandomSTE``: normal logits per rank, moe_utils.py): a split's
    residue modulo align is then about uniform, so (align − 1)/2 rows per expert on average.
    The flex dispatcher's HybridEP backend aligns them in its own permutation (``pad_multiple``,
    ``TokenDispatcher.pads_expert_rows``): none."""
    a = shape.quant_align
    if not a or shape.dispatcher.pads_expert_rows:  # HybridEP's permutation pads them (FLEX_BACKENDS)
        return 0.0
    if not shape.dropless:
        return float(-rows % a)
    return (a - 1) / 2


def _quant_pad(w, m, n: int, local: int, pad: float, what: str, after=None) -> None:
    """``TEGroupedMLP``'s padding of the grouped GEMMs' rows (``quant_pad_rows``; ``n`` rows of
    the local experts, ``local`` of them, ``pad`` rows added to each), as Transformer Engine runs
    it (transformer_engine/pytorch/module/fp8_padding.py and fp8_unpadding.py, TE v2.9): one
    ``tex.fused_multi_row_padding`` kernel copies the [n, h] input into a new [n', h] tensor with
    every split padded (n' = n + local·pad rows), and another pads the router probabilities
    [n, 1] (FP32, ``PROBS_BYTES``); after the down projection ``Fp8Unpadding``'s
    ``fused_multi_row_unpadding`` copies [n', h] back to [n, h]. Backward, each the other way
    round: the output gradient padded before the down projection's input gradient, the input's
    gradient and the probabilities' unpadded after the up projection's. ``what``: 'pad',
    'unpad', 'unpad.grad' (the unpadding's backward, a padding) or 'pad.grad'."""
    e, h, p = w.e, m.hidden_size, PROBS_BYTES
    n2 = n + local * pad
    if what == "pad":
        w.mem("moe.experts.pad", e * n * h + p * n, e * n2 * h + p * n2, output=e * n2 * h, kernels=2, after=after)
    elif what == "unpad":
        w.mem("moe.experts.unpad", e * n2 * h, e * n * h, kernels=1)
    elif what == "unpad.grad":
        w.mem("moe.experts.unpad.grad", e * n * h, e * n2 * h, kernels=1, after=after)
    else:
        w.mem("moe.experts.pad.grad", e * n2 * h + p * n2, e * n * h + p * n, output=e * n * h, kernels=2)


PROBS_BYTES = 4
"""The router's probabilities, FP32 (Megatron-Core's ``TEGroupedMLP._apply_bias`` casts ``t + b * p``
back to the activations' dtype because the product with them is FP32)."""


def _clamp(w, n: int, f: int, grad: bool) -> None:
    """GPT-OSS's clamp before its gated activation (``ModelSpec.activation_clamp``). Megatron-Core
    (``megatron/core/fusions/fused_bias_geglu.py``, ``weighted_bias_quick_geglu_impl``, at the
    Megatron-LM commit cba6b0ed of Megatron-Bridge r0.2.0, NeMo 25.11) runs it eagerly outside
    the fused activation: ``chunk`` the [n, 2f] up projection, ``clamp`` each half (two kernels,
    each reading and writing n·f), ``torch.cat`` them back (2n·f read and written); the fused
    activation then reads the copy. Backward: the two clamps' gradients (each reads the
    gradient and its saved input, writes n·f; ``cat``'s backward is views) and ``chunk``'s
    backward, a ``cat`` of the two halves' gradients (2n·f read and written)."""
    e = w.e
    if grad:
        w.mem("moe.experts.clamp.grad", e * 6 * n * f, e * 4 * n * f, 2 * n * f, kernels=3)
    else:
        w.mem("moe.experts.clamp", e * 4 * n * f, e * 4 * n * f, 2 * n * f, kernels=3)


def _down_bias(w, n: int, h: int, local: int, grad: bool, after=None) -> None:
    """The experts' down-projection bias (``ModelSpec.moe_expert_bias``). Megatron-Core's
    ``TEGroupedMLP`` builds ``linear_fc2`` with ``skip_bias_add=True`` and adds the bias itself,
    weighted by each copy's router probability, in ``_apply_bias`` (``megatron/core/transformer/
    moe/experts.py`` at Megatron-LM cba6b0ed): a Python loop over the local experts of
    ``t + b * p`` on each expert's rows (the product FP32, ``PROBS_BYTES``: one kernel writing
    it, one adding), ``torch.cat`` of the FP32 pieces and ``.to`` the activations' dtype. Over
    all n copies of width h (N = n·h elements, e bytes each): read (e + 12)·N, written (e + 12)·N,
    2·local + 2 kernels. Backward (PyTorch autograd of the same ops): ``.to``'s (read e·N,
    write 4·N), then per expert the add's cast of the gradient to ``t``'s dtype (read 4, write
    e per element), the product's two gradients, each a multiply (read 4, write 4) and a
    sum (read 4: the bias's over the rows, the probability's over the width), then ``split``'s
    backward, a ``cat`` of the pieces (read and write e): read (20 + 2e)·N, written
    (12 + 2e)·N, 5·local + 2 kernels. The bias gradient comes out of these sums; there is no
    weight-gradient GEMM for it."""
    e, N, p = w.e, n * h, PROBS_BYTES
    if grad:
        w.mem("moe.experts.down.bias.grad", (5 * p + 2 * e) * N, (3 * p + 2 * e) * N, 4 * N,
              kernels=5 * local + 2, after=after)
    else:
        w.mem("moe.experts.down.bias", (e + 3 * p) * N + p * n, (e + 3 * p) * N, 2 * N, kernels=2 * local + 2)


GROUPED_GEMM_STREAMS = 4
"""Streams Transformer Engine's grouped GEMM (Megatron-Core's ``TEGroupedMLP``, ``--moe-grouped-gemm``:
``te.pytorch.GroupedLinear`` -> ``general_grouped_gemm`` -> ``nvte_multi_stream_cublas_gemm``) puts
its one-cuBLAS-GEMM-per-expert kernels on, in turn: ``num_compute_streams`` = 4
(transformer_engine/common/util/multi_stream.h); priced by ``sim.program.costs.gemm_compute_time``."""

DEEPEP_SMS = TOKEN_DISPATCHERS["flex"].num_sms
"""SMs DeepEP's dispatch and combine kernels hold while they run, 20: ``deep_ep.Buffer.num_sms``'s
default (DeepEP's README sets it with ``Buffer.set_num_sms``; Megatron-Core's ``moe_deepep_num_sms``
keeps it). HybridEP's are Megatron-Core's ``moe_hybridep_num_sms``, 16 (``FLEX_BACKENDS``); a
plan's ``moe_flex_num_sms`` sets either (``MoeShape.sms``)."""


def _router(w, m, T: int, grad: bool, shape: MoeShape | None = None, after=None) -> None:
    """The router after its score GEMM (Megatron-Core ``TopKRouter.routing``, unfused): the
    score function (softmax, or DeepSeek-V3's sigmoid: the same pass) over the T × E logits in
    fp32, top-k, the routing map (1 byte) and the probabilities (fp32) scattered into T × E,
    and the load-balancing loss (``switch_load_balancing_loss_func``: tokens and probabilities
    summed per expert, then a dot product); kernels as PyTorch launches them (a cast and the
    score function; top-k, two zero-fills and two scatters; about six reductions and scalar ops)."""
    e, E, k = w.e, m.num_experts, m.moe_router_topk
    R, TE = T * k, T * E
    if not grad:
        w.mem("moe.router.scores", e * TE, 4 * TE, 8 * TE, framework=True, kernels=2)
        w.mem("moe.router.topk", 4 * TE, 5 * TE + 12 * R, 8 * TE, framework=True, kernels=5)
        if shape is not None and shape.capacity_factor is not None:
            _capacity(w, m, T, shape.capacity_factor, grad=False)
        w.mem("moe.router.aux_loss", 5 * TE, 8 * E, 2 * TE, framework=True, kernels=6)
        return
    w.mem("moe.router.aux_loss.grad", 4 * TE, 4 * TE, TE, framework=True, kernels=4, after=after)
    if shape is not None and shape.capacity_factor is not None:
        _capacity(w, m, T, shape.capacity_factor, grad=True)
    w.mem("moe.router.topk.grad", 4 * TE + 12 * R, 4 * TE, 2 * TE, framework=True, kernels=3)
    w.mem("moe.router.scores.grad", 8 * TE, e * TE, 8 * TE, framework=True, kernels=2)


TOPK_RADIX_PASSES = 4
"""Passes over its input of PyTorch's multi-block radix select (``torch.topk`` on CUDA,
aten/src/ATen/native/cuda/TensorTopK.cu, namespace ``mbtopk``: ``RADIX_BITS = 8``, so 32/8 = 4
digit passes over FP32 values, each ``radixFindKthValues`` reading every element), which
``should_use_multiblock`` picks for the router's [T, E] probabilities along the tokens (E slices,
80-200 of them of at least 5,000 elements, or 200-800 of at least 3,000: PyTorch PR 74267's
heuristic); ``gatherTopK`` then reads them once more to write the k values and indices."""
TOPK_KERNELS = 10
"""Kernels of that ``torch.topk`` (TensorTopK.cu, ``mbtopk::launch``): per digit pass
``radixFindKthValues`` and ``computeDigitCumSum`` (8), then ``computeBlockwiseWithinKCounts``
and ``gatherTopK``; its CUB prefix scans (``inclusive_sum_by_key``) and fills are left out."""


def _capacity(w, m, T: int, cf: float, grad: bool) -> None:
    """The router's token dropping under a capacity factor (Megatron-Core
    ``moe_utils.apply_router_token_dropping``, called by ``TopKRouter.routing`` when
    ``moe_expert_capacity_factor`` is set; the same at core_r0.14.0, NeMo 25.09's, and Megatron-LM
    cba6b0ed, 25.11's): each expert keeps the C = ⌈T·k/E · cf⌉ tokens of highest probability
    (``get_capacity``), found by ``torch.topk(routing_probs, k=C, dim=0)`` over the FP32 [T, E]
    probabilities (``TOPK_RADIX_PASSES`` + 1 reads of them, C·E values and int64 indices
    written, ``TOPK_KERNELS``); then ``zeros_like(probs).scatter(0, indices, 1).bool()`` (a
    zero-fill of T·E FP32; the out-of-place scatter, a copy of it and the C·E ones written from
    the indices; the cast to bool) and, padding to capacity as ``apply_moe_token_drop`` sets, ``probs * mask`` (reads both,
    writes FP32). Backward: the product's gradient, the output gradient times the mask."""
    E, k = m.num_experts, m.moe_router_topk
    TE = T * E
    CE = math.ceil(T * k / E * cf) * E
    if grad:
        w.mem("moe.router.capacity.grad", 4 * TE + TE, 4 * TE, TE, framework=True, kernels=1)
        return
    w.mem("moe.router.capacity.topk", (TOPK_RADIX_PASSES + 1) * 4 * TE, 12 * CE, 0, framework=True,
          kernels=TOPK_KERNELS)
    # zeros_like (write 4TE); the out-of-place scatter: a copy (4TE each way), then the ones (read the
    # 8-byte indices, write 4CE); .bool() (read 4TE, write TE); probs * mask (read 4TE + TE, write 4TE)
    w.mem("moe.router.capacity.mask", 4 * TE + 8 * CE + 4 * TE + 5 * TE, 4 * TE + 4 * TE + 4 * CE + TE + 4 * TE, TE,
          framework=True, kernels=5)


def _permute(w, m, rows: int, copies: int, experts: int, shape: MoeShape, grad: bool, **first) -> None:
    """Permutation of the routed copies into expert order (Megatron-Core ``moe_utils.permute``)
    over a routing map of ``rows`` tokens × ``experts`` experts holding ``copies`` copies:
    unfused, the routing map transposed and turned into token indices (``masked_select``), the
    probabilities likewise, then ``index_select`` gathers every copy (about ten PyTorch ops);
    fused (``--moe-permute-fusion``, Transformer Engine's ``moe_permute_with_probs``), a row-id
    map built from the routing map in a few kernels, then one kernel that reads each token once
    and writes its copies. Backward: the copies' gradients summed back into the ``rows``.
    ``first``: the first kernel's own ``Op`` fields (``after``, ``host_sync``)."""
    e, h = w.e, m.hidden_size
    R, TE = copies, rows * experts
    fused = shape.permute_fusion
    if not grad:
        if fused:
            w.mem("moe.permute.map", TE, 8 * TE, TE, framework=True, kernels=3, **first)
            w.mem("moe.permute", e * rows * h + 12 * TE, e * R * h + 4 * R, 0, output=e * R * h, kernels=1)
        else:
            w.mem("moe.permute.map", 19 * TE, 5 * TE + 12 * R, TE, framework=True, kernels=9, **first)
            w.mem("moe.permute", e * R * h + 8 * R, e * R * h, output=e * R * h, framework=True, kernels=1)
        return
    if fused:
        w.mem("moe.permute.grad", e * R * h + 12 * TE, e * rows * h, R * h, kernels=1, **first)
    else:
        w.mem("moe.permute.grad", e * R * h + 8 * R, 2 * e * rows * h, R * h, output=e * rows * h, framework=True,
              kernels=3, **first)


def _received_tokens(shape: MoeShape) -> float:
    """The tokens a rank receives from the flex dispatcher's exchange, each once whatever the
    number of its local experts it reaches (``MoeShape.node``: T·D_rank when balanced), which
    Megatron-Core permutes into local-expert order after the dispatch and back before the
    combine: DeepEP's backend with Transformer Engine's permutation
    (``_DeepepManager.get_permuted_hidden_states_by_experts`` / ``get_restored_hidden_states_by_experts``,
    token_dispatcher.py at Megatron-LM cba6b0ed), HybridEP's with its own permute and unpermute
    kernels around its exchange (``dispatch_with_permute``, ``combine_with_unpermute``). The
    combine kernel sums the ranks' returned rows of each token."""
    return shape.node


def _unpermute(w, m, rows: int, copies: int, shape: MoeShape, grad: bool, after=None) -> None:
    """The expert outputs of each token weighted by their probabilities and summed back into
    its row (``moe_utils.unpermute``), ``copies`` of them into ``rows``: unfused a zero-fill,
    the weighting and a ``scatter_add``; fused one Transformer Engine kernel
    (``moe_unpermute``). Backward: each row's gradient copied to its slots and the
    probabilities' gradient (a dot product per copy)."""
    e, h, R = w.e, m.hidden_size, copies
    if not grad:
        if shape.permute_fusion:
            w.mem("moe.unpermute", e * R * h + 4 * R, e * rows * h, 2 * R * h, kernels=1, after=after)
        else:
            w.mem("moe.unpermute", 2 * e * R * h + 12 * R, e * R * h + 2 * e * rows * h, 2 * R * h,
                  output=e * rows * h, framework=True, kernels=4, after=after)
        return
    if shape.permute_fusion:
        w.mem("moe.unpermute.grad", e * rows * h + 2 * e * R * h + 4 * R, e * R * h + 4 * R, 2 * R * h,
              kernels=1, after=after)
    else:
        w.mem("moe.unpermute.grad", e * rows * h + 3 * e * R * h + 4 * R, 2 * e * R * h + 4 * R, 2 * R * h,
              output=e * R * h, framework=True, kernels=4, after=after)


def _sort_chunks(w, m, shape: MoeShape, name: str, after=None) -> None:
    """The alltoall dispatcher's second permutation (``sort_chunks_by_idxs``): the L received
    copies, grouped by source rank, regrouped by local expert (``torch.split`` and
    ``torch.cat``, or the fused ``fused_sort_chunks_by_index``): one pass over them and their
    probabilities. Only with more than one local expert and an exchange."""
    e, h, L = w.e, m.hidden_size, shape.load * shape.etp
    w.mem(name, e * L * h + 4 * L, e * L * h + 4 * L, 0, output=e * L * h, framework=not shape.permute_fusion,
          kernels=2, after=after)


def _sorts(m, shape: MoeShape) -> bool:
    return shape.dispatcher.exchanges_all_to_all and m.num_experts // shape.ep > 1 and shape.ep * shape.etp > 1


def _sync_on_exchange(shape: MoeShape) -> bool:
    """Whether the host synchronisation of the forward (``sim.program.launch``) comes with the
    exchange (dropless alltoall with an exchange: "before_ep_alltoall"; flex: DeepEP's dispatch
    waits on the host for the received count) rather than elsewhere (allgather: after its gather;
    no exchange: the grouped GEMM's counts) or nowhere (a capacity factor, run as drop-and-pad:
    "no_sync", see ``moe_forward``)."""
    if shape.graphed:
        return False
    if shape.dispatcher.deepep:
        return True
    return shape.dispatcher.exchanges_all_to_all and shape.dropless and shape.ep * shape.etp > 1


COUNTS_OP = "moe.dispatch.counts"
"""The token-count all-gather (``_gathers_counts``). Under ``--overlap-moe-expert-parallel-comm``
it stays on the compute stream (``sim.program.ep_overlap``): Megatron-Core's combined 1F1B runs
"pre mlp layernorm->router->dispatch preprocess" (the counts and the permutation) in the attention
node, on the compute stream (``build_transformer_layer_callables``'s ``submodule_attn_forward``,
megatron/core/models/gpt/fine_grained_callables.py); only the dispatch and combine nodes'
all-to-alls go to the communication stream."""

COUNT_BYTES = 8
"""Bytes of one token count (int64: ``routing_map.sum(dim=0).long()``)."""


def _gathers_counts(shape: MoeShape) -> bool:
    """Whether the forward gathers every rank's token counts per expert before its permutation:
    the dropless alltoall dispatcher with an exchange (Megatron-Core
    ``MoEAlltoAllTokenDispatcher.preprocess``: ``num_global_tokens_per_expert =
    gather_from_sequence_parallel_region(num_local_tokens_per_expert, group=self.tp_ep_group)``,
    E int64 counts from each of the etp·ep ranks, from which it takes the all-to-all's splits and
    the local experts' counts that it copies to the host). A blocking ``all_gather_into_tensor``: the
    compute stream waits for it (PyTorch's ProcessGroupNCCL), so the permutation after it does
    too; a few kilobytes, so its time is the collective's latency. Priced over the expert-parallel
    group (with etp > 1 Megatron-Core gathers over etp·ep ranks; the bytes stay as small). None
    with a capacity factor (drop-and-pad returns before it), in the flex dispatcher (DeepEP
    exchanges its counts inside its own dispatch) or in the allgather one (it gathers the
    routing map itself)."""
    return (shape.dropless and shape.dispatcher.exchanges_all_to_all and not shape.dispatcher.deepep
            and not shape.dispatcher.gathers and shape.ep > 1)


def moe_forward(w, m, b: int, t: int, sp: bool, shape: MoeShape) -> str | tuple | None:
    """An MoE block's forward between its norm and its residual add (module doc); returns the
    side collective the residual add must wait for (flex's combine, whose received rows its own
    kernel sums), or None."""
    e, h, E, k = w.e, m.hidden_size, m.num_experts, m.moe_router_topk
    T = _tokens(m, b, t, sp)
    overlap = bool(shape.shared_overlap and m.moe_shared_expert_intermediate_size)
    sms = shape.sms
    if overlap:
        _shared(w, m, b, t, sp, "F.in")
    else:
        _shared(w, m, b, t, sp, "F")
    w.gemm("moe.router", T, E, h)
    _router(w, m, T, grad=False, shape=shape)
    gathered = shape.dispatcher.gathers
    received = shape.dispatcher.deepep  # flex permutes the tokens it received (``_received_tokens``)
    group = shape.etp * shape.ep
    copies = shape.load * shape.etp if gathered or received else T * k  # the copies this rank permutes
    if gathered:  # the allgather dispatcher permutes after its gather, the rows of its whole group
        _exchange(w, m, shape, T, "dispatch")
        _permute(w, m, T * group, shape.load * shape.etp, E // shape.ep, shape, grad=False, host_sync=not shape.graphed)
        after = None
    else:
        # No synchronisation at the permutation: dropless, it is the exchange's (``_sync_on_exchange``);
        # with a capacity factor, which the simulator runs as drop-and-pad (Megatron-Core's
        # ``moe_pad_expert_input_to_capacity``, as Megatron-Bridge's ``apply_moe_token_drop`` sets it
        # and as the CUDA-graph rule assumes), ``MoEAlltoAllTokenDispatcher.preprocess`` knows every
        # count from the capacity (``torch.full`` on the host) and returns before any device-to-host
        # copy: its ``cuda_sync_point`` stays "no_sync" (megatron/core/transformer/moe/
        # token_dispatcher.py). Its "before_permutation_1" is drop without padding, not simulated.
        if _gathers_counts(shape):
            w.comm(COUNTS_OP, "all_gather", COUNT_BYTES * E * group, group="ep")
        if not received:
            _permute(w, m, T, T * k, E, shape, grad=False)
        after = _exchange(w, m, shape, T, "dispatch", sync=_sync_on_exchange(shape),
                          beside=(lambda: _shared(w, m, b, t, sp, "F.up", sms_held=sms)) if overlap else None)
        if received:
            _permute(w, m, _received_tokens(shape), copies, E // shape.ep, shape, grad=False, after=after)
            after = None
    if _sorts(m, shape):
        _sort_chunks(w, m, shape, "moe.sort_chunks", after=after)
        after = None
    rows, local, f, f_up = _expert_rows(m, shape)
    pad = quant_pad_rows(shape, rows)
    if pad:
        _quant_pad(w, m, rows * local, local, pad, "pad", after=after)
        after = None
    lone = not shape.graphed and shape.dropless and group == 1  # no exchange: the grouped GEMM's m_splits to the host
    w.gemm("moe.experts.up", rows, f_up, h, batch=local, after=after, kernels=local, streams=GROUPED_GEMM_STREAMS)
    if lone:
        w.items[-1] = replace(w.items[-1], host_sync=True)
    n = rows * local
    if m.activation_clamp is not None:
        _clamp(w, n, f, grad=False)
    read = (2 if m.mlp == "swiglu" else 1) * n * f
    w.mem(f"moe.experts.{m.mlp}", e * read, e * n * f, _ACT_FLOPS[m.mlp] * n * f, framework=True)
    w.gemm("moe.experts.down", rows, h, f, batch=local, kernels=local, streams=GROUPED_GEMM_STREAMS)
    if pad:
        _quant_pad(w, m, n, local, pad, "unpad")
    if m.moe_expert_bias:
        _down_bias(w, n, h, local, grad=False)
    if _sorts(m, shape):
        _sort_chunks(w, m, shape, "moe.unsort_chunks")
    if received:
        _unpermute(w, m, _received_tokens(shape), copies, shape, grad=False)
    after = None if gathered else _exchange(
        w, m, shape, T, "combine",
        beside=(lambda: _shared(w, m, b, t, sp, "F.down", sms_held=sms)) if overlap else None)
    if not received:
        _unpermute(w, m, T * group if gathered else T, copies, shape, grad=False, after=after)
        after = None
    if gathered:
        _exchange(w, m, shape, T, "combine")
    if overlap:
        _shared(w, m, b, t, sp, "F.out")
    return after


def moe_backward(w, m, b: int, t: int, sp: bool, shape: MoeShape) -> None:
    """An MoE block's input gradients, between its residual's and its norm's."""
    e, h, E, k = w.e, m.hidden_size, m.num_experts, m.moe_router_topk
    T = _tokens(m, b, t, sp)
    overlap = bool(shape.shared_overlap and m.moe_shared_expert_intermediate_size)
    sms = shape.sms
    if overlap:
        _shared(w, m, b, t, sp, "B.out")
    else:
        _shared(w, m, b, t, sp, "B")
    gathered = shape.dispatcher.gathers
    received = shape.dispatcher.deepep
    group = shape.etp * shape.ep
    copies = shape.load * shape.etp if gathered or received else T * k
    if gathered:
        _exchange(w, m, shape, T, "combine.grad")
    if not received:
        _unpermute(w, m, T * group if gathered else T, copies, shape, grad=True)
    after = None if gathered else _exchange(
        w, m, shape, T, "combine.grad", beside=(lambda: _shared(w, m, b, t, sp, "B.down", sms_held=sms))
        if overlap else None)
    if received:
        _unpermute(w, m, _received_tokens(shape), copies, shape, grad=True, after=after)
        after = None
    if _sorts(m, shape):
        _sort_chunks(w, m, shape, "moe.unsort_chunks.grad", after=after)
        after = None
    rows, local, f, f_up = _expert_rows(m, shape)
    n = rows * local
    pad = quant_pad_rows(shape, rows)
    if m.moe_expert_bias:
        _down_bias(w, n, h, local, grad=True, after=after)
        after = None
    if pad:
        _quant_pad(w, m, n, local, pad, "unpad.grad", after=after)
        after = None
    w.gemm("moe.experts.down.dgrad", rows, f, h, batch=local, after=after, kernels=local,
           streams=GROUPED_GEMM_STREAMS)
    read = (3 if m.mlp == "swiglu" else 2) * n * f
    wrote = (2 if m.mlp == "swiglu" else 1) * n * f
    w.mem(f"moe.experts.{m.mlp}.grad", e * read, e * wrote, 2 * _ACT_FLOPS[m.mlp] * n * f, framework=True)
    if m.activation_clamp is not None:
        _clamp(w, n, f, grad=True)
    w.gemm("moe.experts.up.dgrad", rows, h, f_up, batch=local, kernels=local, streams=GROUPED_GEMM_STREAMS)
    if pad:
        _quant_pad(w, m, n, local, pad, "pad.grad")
    if _sorts(m, shape):
        _sort_chunks(w, m, shape, "moe.sort_chunks.grad")
    if received:
        _permute(w, m, _received_tokens(shape), copies, E // shape.ep, shape, grad=True)
    after = None if gathered else _exchange(
        w, m, shape, T, "dispatch.grad", beside=(lambda: _shared(w, m, b, t, sp, "B.up", sms_held=sms))
        if overlap else None)
    if gathered:
        _permute(w, m, T * group, copies, E // shape.ep, shape, grad=True)
    elif not received:
        _permute(w, m, T, copies, E, shape, grad=True, after=after)
        after = None
    if gathered:
        _exchange(w, m, shape, T, "dispatch.grad")
    _router(w, m, T, grad=True, shape=shape, after=after)
    w.gemm("moe.router.dgrad", T, h, E)
    if overlap:
        _shared(w, m, b, t, sp, "B.in")


ROUTING_MAP_OP = "moe.dispatch.routing_map"
"""HybridEP's gather of every rank's routing map before its forward dispatch (``_routing_map``)."""


def _routing_map(w, m, shape: MoeShape, T: int) -> None:
    """HybridEP's forward dispatch before its exchange (``HybridEPBuffer.dispatch_with_permute``
    without a handle, DeepEP's hybrid-ep branch at 1dddd19, 2025-11-18, and after): the [T, E]
    boolean routing map of every rank of the expert-parallel group all-gathered
    (``torch.distributed.all_gather_into_tensor``, 1 byte a flag, T·ep·E bytes gathered) and
    its metadata-preprocessing kernel (``Executor::metadata_preprocessing``), which reads the
    gathered map and writes the token-to-rank map (int32, T·ep) and each received token's
    local-expert map (T·ep × E/ep flags). The backward's exchanges reuse this handle; DeepEP's
    own backend counts inside its dispatch instead."""
    E, group = m.num_experts, shape.ep * shape.etp
    w.comm(ROUTING_MAP_OP, "all_gather", T * group * E, group="ep")
    w.mem("moe.dispatch.metadata", T * group * E, 4 * T * group + T * E, 0.0)


def _exchange(w, m, shape: MoeShape, T: int, what: str, sync: bool = False, beside=None) -> str | tuple | None:
    """The collectives that move the tokens to the experts (``what``: dispatch, combine,
    dispatch.grad or combine.grad) as ``shape.dispatcher`` runs them (``sim.program.dispatch``);
    returns the name of a side collective the next op must wait for (flex's inter-node
    exchange, which runs beside its intra-node one; both, with ``beside``), or None. ``sync``: the host waits for
    the GPU before launching the first (``sim.program.launch``). ``beside``: work to run
    beside the exchange (the shared experts, ``--moe-shared-expert-overlap``), called after
    the exchange is issued on its own stream: flex's inter-node exchange, or the alltoall
    dispatcher's all-to-all when no expert-tensor-parallel gather must follow it."""
    e, h, L = w.e, m.hidden_size, shape.load
    stem, _, grad = what.partition(".")
    suffix = ".grad" if grad else ""
    gather = "all_gather" if what in ("dispatch", "combine.grad") else "reduce_scatter"  # towards the experts
    if shape.dispatcher.gathers:
        n = shape.etp * shape.ep
        if stem == "dispatch":  # the routing map (1 byte a flag, no gradient) and the probabilities
            w.comm(f"moe.dispatch.allgather.routing{suffix}", gather,
                   T * n * m.num_experts * (e + (0 if grad else 1)), group="tpep")
        w.comm(f"moe.{stem}.allgather{suffix}", gather, e * T * n * h, group="tpep")
        return None
    if shape.dispatcher.deepep:
        if what == "dispatch" and shape.dispatcher.gathers_routing_map:
            _routing_map(w, m, shape, T)
        rail, node = f"moe.{stem}.rdma{suffix}", f"moe.{stem}.nvl{suffix}"
        w.comm(rail, "all_to_all", e * shape.rail * h, group="ep_rail", side=True, host_sync=sync)
        if beside is None:
            w.comm(node, "all_to_all", e * shape.node * h, group="ep_node")
            return rail
        w.comm(node, "all_to_all", e * shape.node * h, group="ep_node", side=True)  # both beside the work
        beside()
        return (rail, node)
    steps = {"dispatch": (("moe.dispatch", "ep"), ("moe.all_gather", "etp")),
             "combine": (("moe.reduce_scatter", "etp"), ("moe.combine", "ep")),
             "combine.grad": (("moe.combine.grad", "ep"), ("moe.all_gather.grad", "etp")),
             "dispatch.grad": (("moe.reduce_scatter.grad", "etp"), ("moe.dispatch.grad", "ep"))}[what]
    live = [(name, group) for name, group in steps if getattr(shape, group) > 1]
    side = beside is not None and len(live) == 1 and live[0][1] == "ep"
    for i, (name, group) in enumerate(live):
        if group == "ep":
            w.comm(name, "all_to_all", e * L * h, group="ep", side=side, host_sync=sync and i == 0)
        else:
            w.comm(name, gather, e * L * shape.etp * h, group="etp", host_sync=sync and i == 0)
    if beside is not None:
        beside()
    return live[0][0] if side else None


def moe_wgrads(w, m, b: int, t: int, sp: bool, shape: MoeShape) -> None:
    """An MoE block's weight gradients: experts (grouped), shared experts, router."""
    h, E = m.hidden_size, m.num_experts
    rows, local, f, f_up = _expert_rows(m, shape)
    w.gemm("moe.experts.down.wgrad", f, h, rows, batch=local, kernels=local, streams=GROUPED_GEMM_STREAMS)
    w.gemm("moe.experts.up.wgrad", h, f_up, rows, batch=local, kernels=local, streams=GROUPED_GEMM_STREAMS)
    _shared(w, m, b, t, sp, "W")
    w.gemm("moe.router.wgrad", h, E, _tokens(m, b, t, sp))


def _shared(w, m, b: int, t: int, sp: bool, phase: str, sms_held: int = 0) -> None:
    """The shared experts: one tensor-parallel MLP of their total width on every token.
    ``phase``: F, B or W whole, or a part of F or B as ``--moe-shared-expert-overlap`` runs
    them beside the exchanges (Megatron-Core's ``SharedExpertMLP``: the input gathered
    before the dispatch (F.in), up-projection and activation beside the dispatch (F.up),
    down-projection beside the combine (F.down), output reduce-scattered after it (F.out);
    backward the reverse: B.out, B.down beside the combine's gradient, B.up beside the
    dispatch's, B.in). ``sms_held``: SMs a kernel beside them holds (DeepEP's)."""
    width = m.moe_shared_expert_intermediate_size
    if not width:
        return
    e, h = w.e, m.hidden_size
    n_tok = b * m.seq_length
    f = width // t
    f_up = (2 if m.mlp == "swiglu" else 1) * f
    gather = t > 1 and sp
    rs = "reduce_scatter" if sp else "all_reduce"
    parts = {"F": ("F.in", "F.up", "F.down", "F.out"), "B": ("B.out", "B.down", "B.up", "B.in")}.get(phase, (phase,))
    for part in parts:
        if part == "F.in" and gather:
            w.comm("moe.shared.all_gather", "all_gather", e * n_tok * h)
        elif part == "F.up":
            w.gemm("moe.shared.up", n_tok, f_up, h, sms_held=sms_held)
            w.mem(f"moe.shared.{m.mlp}", e * (f_up * n_tok), e * n_tok * f, _ACT_FLOPS[m.mlp] * n_tok * f,
                  framework=True, sms_held=sms_held)
        elif part == "F.down":
            w.gemm("moe.shared.down", n_tok, h, f, sms_held=sms_held)
        elif part == "F.out" and t > 1:
            w.comm("moe.shared.reduce_scatter", rs, e * n_tok * h)
        elif part == "B.out" and gather:
            w.comm("moe.shared.all_gather.grad", "all_gather", e * n_tok * h)
        elif part == "B.down":
            w.gemm("moe.shared.down.dgrad", n_tok, f, h, sms_held=sms_held)
            w.mem(f"moe.shared.{m.mlp}.grad", e * (f_up + f) * n_tok, e * f_up * n_tok,
                  2 * _ACT_FLOPS[m.mlp] * n_tok * f, framework=True, sms_held=sms_held)
        elif part == "B.up":
            w.gemm("moe.shared.up.dgrad", n_tok, h, f_up, sms_held=sms_held)
        elif part == "B.in" and t > 1:
            w.comm("moe.shared.reduce_scatter.grad", rs, e * n_tok * h)
        elif part == "W":
            w.gemm("moe.shared.down.wgrad", f, h, n_tok)
            if gather:
                w.comm("moe.shared.all_gather.input", "all_gather", e * n_tok * h)
            w.gemm("moe.shared.up.wgrad", h, f_up, n_tok)
