"""Names PyTorch's profiler writes for communication, shared by the Kineto readers
(``sim.replay.kineto`` for GPU traces, ``sim.replay.cpu`` for CPU ones): element sizes of
its ``dtype`` names, its ``Collective name`` values, and its lists of process-group ranks."""

from __future__ import annotations

import ast

DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
               "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "char": 1, "int8": 1,
               "byte": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
"""Bytes per element of the ``dtype`` names PyTorch writes (``Float``, ``BFloat16``, ...)."""
COLLECTIVE_NAMES = {"allreduce": "allreduce", "all_reduce": "allreduce", "allreduce_coalesced": "allreduce",
                    "allgather": "allgather", "all_gather": "allgather", "_allgather_base": "allgather",
                    "all_gather_into_tensor": "allgather", "allgather_into_tensor_coalesced": "allgather",
                    "reduce_scatter": "reducescatter", "_reduce_scatter_base": "reducescatter",
                    "reduce_scatter_tensor": "reducescatter", "reduce_scatter_tensor_coalesced": "reducescatter",
                    "reducescatter": "reducescatter", "broadcast": "broadcast", "all_to_all": "alltoall",
                    "all_to_allv": "alltoall", "alltoall": "alltoall", "alltoall_base": "alltoall",
                    "send": "send", "recv": "recv"}
"""PyTorch's ``Collective name`` values -> trainsim's ops (send/recv: point-to-point)."""


def ranks_of(text) -> tuple[int, ...] | None:
    """A ``Process Group Ranks`` value (a list, or its text) as a tuple; None when it is not one."""
    if isinstance(text, (list, tuple)):
        vals = text
    elif isinstance(text, str) and text.strip().startswith("["):
        try:
            vals = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            return None
    else:
        return None
    if not isinstance(vals, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        return None
    return tuple(vals)
