"""The memory model: every byte a GPU holds during a training iteration, in one place.

A rank's memory is its model states (weights, gradients, optimizer states, sharded by
ZeRO), the activations its in-flight micro-batches store for backward, and temporary
buffers (gradient buckets, ZeRO-3's gathered weights), plus a fixed reserve. Each part
is a pure function of the model, the plan and (for the reserve) the hardware profile:

- ``states``: model states under ZeRO stages 0-3 (Rajbhandari et al. SC'20), the
  parameters on each pipeline stage, and the 16-bit buffers that carry weights and
  gradients (per-layer gradients and gathered weights, the ZeRO-1/2 parameter
  all-gather, the ZeRO-Offload host copies, buckets);
- ``activations``: the tensors one layer, one model chunk and the embedding and the
  output layer store per micro-batch (Korthikanti et al. 2022, Table 2);
- ``inflight``: how many micro-batches each pipeline schedule keeps in flight, and so a
  stage's activation peak;
- ``rank``: the sums: what the simulator's memory pass starts each rank with, and the
  analytic estimate's per-stage peak.

The passes (``sim.program.passes``, ``sim.program.zero``) attach these numbers to the
program's actions as allocations and frees; ``sim.program.estimate`` adds them up.
"""

from sim.program.memory.activations import (
    Storing,
    activation_bytes_per_layer,
    activation_terms,
    chunk_activation_bytes,
    chunk_activation_parts,
    embedding_activation_bytes,
    head_activation_bytes,
    recompute_working_bytes,
)
from sim.program.memory.inflight import inflight_chunks, inflight_per_chunk, stage_activation_bytes
from sim.program.memory.rank import stage_memory_bytes, stage_resident_bytes, zero_temporary_bytes
from sim.program.memory.states import (
    DEEPSPEED_MAX_LIVE_PARAMETERS,
    DEEPSPEED_REDUCE_BUCKET_ELEMS,
    ModelStates,
    fp8_layer_weights,
    fp8_weight_copy_bytes,
    grad_bucket_bytes,
    layer_param_bytes,
    layer_params_per_rank,
    model_state_bytes,
    offload_copy_bytes,
    optimizer_shard_params,
    param_allgather_bytes,
    stage_param_split,
    stage_params_per_rank,
    sync_bucket_bytes,
    zero3_depth,
    zero3_gathered_param_bytes,
)

__all__ = [
    "DEEPSPEED_MAX_LIVE_PARAMETERS", "DEEPSPEED_REDUCE_BUCKET_ELEMS", "ModelStates", "Storing",
    "activation_bytes_per_layer", "activation_terms", "chunk_activation_bytes", "chunk_activation_parts",
    "embedding_activation_bytes",
    "fp8_layer_weights",
    "fp8_weight_copy_bytes",
    "grad_bucket_bytes", "head_activation_bytes", "inflight_chunks", "inflight_per_chunk", "layer_param_bytes",
    "layer_params_per_rank", "model_state_bytes", "offload_copy_bytes", "optimizer_shard_params",
    "param_allgather_bytes", "recompute_working_bytes", "stage_activation_bytes", "stage_memory_bytes",
    "stage_param_split", "stage_params_per_rank", "stage_resident_bytes", "sync_bucket_bytes", "zero3_depth",
    "zero3_gathered_param_bytes", "zero_temporary_bytes",
]
