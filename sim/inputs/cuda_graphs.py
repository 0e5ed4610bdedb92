"""CUDA graphs: which parts of a layer the host launches as one graph instead of kernel by kernel.

Megatron-Core captures per-layer CUDA graphs (``--cuda-graph-impl local`` or
``transformer_engine``; the older ``--enable-cuda-graph``) over the parts named by
``--cuda-graph-modules`` (formerly ``--cuda-graph-scope``), or the whole iteration
(``--cuda-graph-impl full_iteration``). Here ``cuda_graph`` lists the scopes, with
Megatron-Core's names (``megatron/core/transformer/cuda_graph_config.py`` and the help of
``--cuda-graph-modules`` in ``megatron/training/arguments.py``):

    full            the whole transformer layer (Megatron-Core's empty module list)
    attn            ``TransformerLayer._forward_attention``
    mlp             a dense layer's MLP
    moe             an MoE layer's whole MLP block (router, dispatch, experts, combine)
    moe_router      an MoE block up to ``MoELayer.router()``
    moe_preprocess  the dispatcher's preprocess (with ``moe_router`` only)
    full_iteration  forward and backward of the whole iteration

What a graph removes in trainsim is the host's per-kernel launch cost where it binds:
after the host synchronisation in each MoE layer's forward (``sim.program.launch``), the
host issues the rest of the block kernel by kernel unless a graph covers it. A dropless
MoE block cannot be captured (its token counts go to the host mid-block), so every scope
that covers it (``moe``, ``full``, ``full_iteration``) needs drop-padding MoE; the router
scopes are allowed with dropless MoE but cover only kernels before the synchronisation,
which the host has issued long before the GPU needs them, so they change nothing here.

The rules, from ``TransformerConfig.__post_init__`` (Megatron-Core), each a one-line refusal:
``moe`` and ``moe_router`` need an MoE model and not both; ``moe_preprocess`` needs
``moe_router`` and is refused for the alltoall dispatcher with a capacity factor (its
preprocess copies token counts to the host); ``mlp`` needs a dense layer; ``moe`` (and here
``full`` and ``full_iteration`` on an MoE model, which capture the block too) needs
drop-padding MoE (``moe_expert_capacity_factor``, shapes padded to the capacity); full
recompute needs ``full_iteration``; ``full_iteration`` stands alone.
"""

from __future__ import annotations

from sim.inputs.fields import name_list

FIELD = "cuda_graph"
SCOPES = ("full", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "full_iteration")
COVERS_MOE = ("full", "moe", "full_iteration")


def parse_cuda_graph(value) -> tuple[str, ...] | None:
    """The scopes as a tuple in ``SCOPES`` order, each once: from a list of names or a string
    of names separated by commas or spaces. Refused: an empty list or an unknown name."""
    return name_list(value, SCOPES, FIELD, "scope")


class CudaGraphs:
    """The plan's CUDA-graph scopes (module doc); an empty one when none are set."""

    def __init__(self, scopes: tuple[str, ...] | None):
        self.scopes = tuple(scopes or ())

    def covers_moe_block(self) -> bool:
        """Whether a graph covers a whole MoE block, so that its kernels cost the host nothing."""
        return any(s in self.scopes for s in COVERS_MOE)

    def __bool__(self) -> bool:
        return bool(self.scopes)

