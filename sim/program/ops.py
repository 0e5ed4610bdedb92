"""The pieces a layer's work is made of: kernels (``Op``), collectives (``Comm``), and the
``Work`` that lists them in execution order (``sim.program.workload`` builds them)."""

from __future__ import annotations

from dataclasses import dataclass, replace

PHASES = ("F", "B", "W")
OP_KINDS = ("gemm", "attention", "memory")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "shift")
"""``shift``: every rank of the group sends its buffer to the next in the ring and receives
the previous one's (ring attention's exchange of key/value chunks)."""
GROUPS = ("tp", "ep", "etp", "cp", "tpep", "ep_rail", "ep_node")
"""Which of the rank's groups a ``Comm`` runs over: tensor-parallel, expert-parallel
(token dispatch and combine), expert tensor-parallel (``sim.inputs.experts``),
context-parallel (``sim.program.context_parallel``), or the token dispatchers' own
(``sim.program.dispatch.DISPATCH_GROUPS``)."""


@dataclass(frozen=True)
class Op:
    """One kernel: what it computes and what it moves, for one micro-batch on one rank."""

    name: str
    phase: str
    kind: str
    """'gemm', 'attention' (fused flash) or 'memory' (elementwise, norm, embedding, loss)."""
    flops: float
    bytes_read: float
    bytes_written: float
    output_bytes: float
    shape: tuple = ()
    """GEMM (m, n, k); attention (seq_q, seq_k, head_dim)."""
    batch: int = 1
    """Independent GEMMs (or sequences × heads for attention) in the kernel."""
    recompute: bool = False
    framework: bool = False
    """A memory-bound kernel of the framework's own (Megatron-LM's torch.compile fusions,
    PyTorch eager ops), not a tuned library kernel: it streams at the profile's
    ``framework_kernel_efficiency``."""
    after: str | tuple | None = None
    """The name of a side collective (``Comm.side``) this op waits for, or a tuple of names."""
    dtype: str = "bf16"
    """What a GEMM's operands are: 'bf16', or 'fp8' (``sim.program.fp8``: the profile's FP8 peak)."""
    bias: bool = False
    """A linear layer's forward GEMM that adds a bias (``HardwareProfile.gemm_bias_epilogue``)."""
    kernel: str = "te"
    """An attention op's kernel (``sim.inputs.frameworks.ATTENTION_KERNELS``; 'te', the
    profile's own, unless ``with_attention_kernel`` says otherwise)."""
    kernels: int = 1
    """How many kernels the host launches for it (a grouped GEMM that Transformer Engine
    runs as one cuBLAS GEMM per local expert, PyTorch's several small ops of an unfused
    permutation; ``sim.program.launch``)."""
    host_sync: bool = False
    """The host waits for the GPU to finish everything before this op before it launches it
    (a device-to-host copy of token counts; ``sim.program.launch``)."""
    sms_held: int = 0
    """SMs another kernel holds while this one runs beside it (DeepEP's, ``sim.program.workload_moe``):
    priced on the rest (``sim.inputs.tp_overlap.margin_profile``)."""
    streams: int = 0
    """A GEMM's ``batch`` run as separate kernels, one per GEMM, taken in turn by this many
    streams (Transformer Engine's grouped GEMM, ``sim.program.costs.gemm_compute_time``); 0:
    one batched kernel."""


@dataclass(frozen=True)
class Comm:
    """A collective over the tensor-parallel group. ``nbytes`` follows nccl-tests: the
    full buffer on one rank (the tensor all-reduced, the gathered output of an
    all-gather, the unreduced input of a reduce-scatter)."""

    name: str
    phase: str
    collective: str
    nbytes: float
    recompute: bool = False
    group: str = "tp"
    """``GROUPS``: the tensor-parallel group, or the expert- or context-parallel ones."""
    side: bool = False
    """Runs beside the compute stream (ring attention's exchanges), from the work before
    it; the op that needs it names it in ``Op.after``."""
    host_sync: bool = False
    """The host waits for the GPU to finish everything before this collective before it
    launches it (``Op.host_sync``)."""


@dataclass(frozen=True)
class Work:
    """Ops and collectives of one piece of the model, in execution order (F, then B, then W)."""

    name: str
    items: tuple

    def ops(self, phase: str | None = None, recompute: bool = True) -> tuple:
        return tuple(i for i in self.items if isinstance(i, Op) and (phase is None or i.phase == phase)
                     and (recompute or not i.recompute))

    def comms(self, phase: str | None = None, recompute: bool = True) -> tuple:
        return tuple(i for i in self.items if isinstance(i, Comm) and (phase is None or i.phase == phase)
                     and (recompute or not i.recompute))

    def flops(self, phase: str | None = None, recompute: bool = True, kinds=OP_KINDS) -> float:
        return sum(o.flops for o in self.ops(phase, recompute) if o.kind in kinds)

    def phase(self, phase: str) -> tuple:
        return tuple(i for i in self.items if i.phase == phase)


MAIN_GRAD_BYTES = 4
"""Megatron-LM keeps the gradients it accumulates and reduces in fp32 under bf16 training
(``--accumulate-allreduce-grads-in-fp32``, which ``--bf16`` turns on)."""


def accumulate_wgrads(work: Work, fused: bool = True) -> Work:
    """``work``, where unless ``fused`` each weight-gradient GEMM (phase W, name ending in
    ``wgrad``) is followed by the pass that adds its output into the fp32 main gradient:
    Megatron-LM's ``main_grad.add_(grad)`` under ``--no-gradient-accumulation-fusion``, plain
    PyTorch's ``AccumulateGrad``. It reads the gradient the GEMM wrote and the main
    gradient, and writes the main gradient. Fused (Megatron-LM's default), the GEMM
    accumulates into the main gradient itself."""
    if fused:
        return work
    items = []
    for it in work.items:
        items.append(it)
        if isinstance(it, Op) and it.kind == "gemm" and it.phase == "W" and it.name.endswith("wgrad"):
            n = it.shape[0] * it.shape[1] * it.batch
            items.append(Op(f"{it.name}.accumulate", "W", "memory", float(n), it.output_bytes + MAIN_GRAD_BYTES * n,
                            float(MAIN_GRAD_BYTES * n), float(MAIN_GRAD_BYTES * n), framework=True))
    return Work(work.name, tuple(items))


def with_attention_kernel(work: Work, kernel: str = "te") -> Work:
    """``work`` with its attention ops run by ``kernel`` (``sim.inputs.frameworks``); as it
    is for 'te', the profile's own."""
    if kernel == "te":
        return work
    return Work(work.name, tuple(replace(it, kernel=kernel) if isinstance(it, Op) and it.kind == "attention" else it
                                 for it in work.items))


class Builder:
    """Appends ops and collectives to a ``Work`` under construction, phase by phase."""

    def __init__(self, name: str, e: int):
        self.name, self.e, self.items, self.phase = name, e, [], "F"

    # ``**op``: the appended ``Op``'s own optional fields by name (``bias``, ``after``,
    # ``kernels``, ``host_sync``, ``sms_held``, ``streams``, ``framework``), as ``Op`` declares them.
    def gemm(self, name, m, n, k, batch=1, **op):
        """An ``m x k`` by ``k x n`` GEMM (``batch`` of them): 2mnk FLOPs, its operands read once."""
        e = self.e
        self.items.append(Op(name, self.phase, "gemm", 2.0 * m * n * k * batch,
                             e * (m * k + k * n) * batch, e * m * n * batch, e * m * n * batch,
                             (m, n, k), batch, **{**op, "bias": bool(op.get("bias", False))}))

    def mem(self, name, read, written, flops=0.0, output=None, **op):
        """A memory-bound kernel; ``output``: the bytes it leaves for the next op (default ``written``)."""
        self.items.append(Op(name, self.phase, "memory", float(flops), float(read), float(written),
                             float(written if output is None else output), **op))

    def attention(self, name, flops, read, written, output, shape, batch, after=None):
        """An attention core; ``shape``: (query length, key length, head dim), ``batch``: b x heads."""
        self.items.append(Op(name, self.phase, "attention", float(flops), float(read), float(written),
                             float(output), tuple(shape), batch, after=after))

    def comm(self, name, collective, nbytes, group="tp", side=False, host_sync=False):
        self.items.append(Comm(name, self.phase, collective, float(nbytes), group=group, side=side,
                               host_sync=host_sync))

    def build(self) -> Work:
        return Work(self.name, tuple(self.items))


