"""DeepSpeed's ZeRO (``sim.inputs.frameworks``, ``framework = "deepspeed"``) on a hand-counted
2-layer GPT on 2 GPUs: which tensors persist and are never all-gathered, how many
all-gathers a step issues, what stays gathered from forward to backward, the sizes of the
gradient buckets and the stream they run on; Megatron-Core's ZeRO unchanged beside it."""

import pytest

from sim.inputs.frameworks import (deepspeed_kept_layers, deepspeed_prefetch_depth, layer_tensors,
                                   persistent_params)
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt, layer_params_per_rank, preset
from sim.inputs.plan import ParallelPlan
from sim.program.training import build_program

H100 = load_profile("h100-sxm")
H, V, S = 256, 512, 256
TWO = gpt("two", 2, H, 4, V, S)  # 2 layers of width 256: LayerNorm, biases, GeLU MLP of 4h, learned positions, tied

# One layer's tensors by hand: 4 LayerNorm vectors of h; QKV h x 3h, projection h x h, MLP h x 4h and 4h x h;
# biases 3h, h, 4h, h. At DeepSpeed's default threshold 1e5 elements the vectors and the h x h projection
# (65,536) persist; QKV (196,608) and the MLP's matrices (262,144 each) are partitioned.
LAYER = 12 * H * H + 13 * H
LAYER_PERSISTENT = 4 * H + H * H + (3 * H + H + 4 * H + H)
LAYER_GATHERED = 3 * H * H + 2 * 4 * H * H
EMB_GATHERED = V * H  # the word table; the 256 x 256 learned positions (65,536) persist
HEAD = 2 * H  # the final LayerNorm, persistent (the output layer is the tied word table)


def _plan(**kw):
    kw.setdefault("zero_stage", 3)
    kw.setdefault("global_batch_size", 2)
    return ParallelPlan(dp=2, framework="deepspeed", **kw)


def _collectives(plan, op, model=TWO):
    _, prog = build_program(model, plan, H100, fidelity="reduced")
    return [a for a in prog.actions[0] if a.kind == "collective" and a.op == op]


def test_hand_counted_tensors_and_which_persist():
    assert LAYER_PERSISTENT + LAYER_GATHERED == LAYER
    assert sum(layer_tensors(TWO, 1)) == layer_params_per_rank(TWO, 1)
    plan = _plan()
    assert persistent_params(TWO, plan, 0) == LAYER_PERSISTENT
    assert persistent_params(TWO, plan, -1) == S * H
    assert persistent_params(TWO, plan, 2) == HEAD
    # threshold 0: nothing persists; outside DeepSpeed nothing does either
    assert persistent_params(TWO, _plan(zero3_param_persistence_threshold=0), 0) == 0
    assert persistent_params(TWO, ParallelPlan(dp=2, zero_stage=3), 0) == 0


def test_a_step_gathers_each_partitioned_layer_once_when_all_is_reused_within_the_distance():
    # the whole model is far below stage3_max_reuse_distance (1e9): what the forward gathers stays for the
    # backward right after it, so one micro-batch issues 3 all-gathers (embedding, 2 layers), none for the
    # head (all persistent), and one all-gather of the persistent tensors after the optimizer step
    gathers = _collectives(_plan(), "allgather")
    per_layer = [a for a in gathers if a.category == "zero" and a.name.startswith("gather layer")]
    assert sorted(a.name for a in per_layer) == ["gather layer -1 for 0F0", "gather layer 0 for 0F0",
                                                 "gather layer 1 for 0F0"]
    assert sum(a.nbytes for a in per_layer) == 2 * (EMB_GATHERED + 2 * LAYER_GATHERED)
    persistent = [a for a in gathers if a.name.startswith("persistent params allgather")]
    assert len(persistent) == 1 and persistent[0].nbytes == 2 * (2 * LAYER_PERSISTENT + S * H + HEAD)
    assert persistent[0].deps == ("optimizer",)


def test_max_reuse_distance_decides_what_backward_gathers_again():
    # from layer 1 the walk to its backward crosses the head twice (2 x 512 < 1e6): kept; from layer 0 it
    # crosses layer 1 and the head twice (2 x (789,760 + 512) >= 1e6): released, gathered again
    plan = _plan(zero3_max_reuse_distance=1e6)
    assert deepspeed_kept_layers(TWO, plan, [-1, 0, 1, 2]) == {1, 2}
    names = sorted(a.name for a in _collectives(plan, "allgather") if a.name.startswith("gather layer"))
    assert names == ["gather layer -1 for 0B0", "gather layer -1 for 0F0", "gather layer 0 for 0B0",
                     "gather layer 0 for 0F0", "gather layer 1 for 0F0"]
    # two micro-batches: each forward's gathers are kept for its own backward, none across micro-batches
    two = [a.name for a in _collectives(_plan(global_batch_size=4), "allgather") if a.name.startswith("gather layer")]
    assert sorted(two) == sorted(f"gather layer {lid} for 0F{mb}" for lid in (-1, 0, 1) for mb in (0, 1))
    # distance 0: nothing is kept, every partitioned layer is gathered for forward and again for backward
    assert len([a for a in _collectives(_plan(zero3_max_reuse_distance=0), "allgather")
                if a.name.startswith("gather layer")]) == 6


def test_reduce_scatter_buckets_hold_at_most_reduce_bucket_size():
    # backward order: head (1,024 B), layer 1 (1,579,520 B), layer 0 (1,579,520 B), embedding (393,216 B).
    # DeepSpeed reduces a bucket before the gradient that would overflow it: [head, layer 1], [layer 0,
    # embedding] under 2 MB. Megatron's ZeRO closes a bucket once it reaches the size: [head, 1, 0], [emb].
    head, layer, emb = 2 * HEAD, 2 * LAYER, 2 * (V + S) * H
    ds = _collectives(_plan(zero_bucket_size_bytes=2_000_000), "reducescatter")
    assert [a.nbytes for a in ds] == [head + layer, layer + emb]
    assert all(a.stream == "dp" for a in ds)  # overlap_comm: on by default under ZeRO-3
    mega = _collectives(ParallelPlan(dp=2, global_batch_size=2, zero_stage=3, zero_bucket_size_bytes=2_000_000),
                        "reducescatter")
    assert [a.nbytes for a in mega] == [head + 2 * layer, emb]
    # DeepSpeed's default bucket, 5e8 elements (1e9 bytes in 16 bits), holds the whole model
    assert [a.nbytes for a in _collectives(_plan(), "reducescatter")] == [head + 2 * layer + emb]


def test_without_overlap_comm_the_buckets_run_on_the_compute_stream():
    _, prog = build_program(TWO, _plan(overlap_comm=False), H100, fidelity="reduced")
    acts = prog.actions[0]
    (bucket,) = [a for a in acts if a.op == "reducescatter"]
    before = acts[acts.index(bucket) - 1]
    assert bucket.stream == before.stream != "dp" and before.kind == "compute"


def test_zero_1_and_2_all_reduce_their_buckets():
    # average_tensor with use_multi_rank_bucket_allreduce (on by default) all-reduces each bucket;
    # ZeRO-2 on the compute stream (overlap_comm off by default below ZeRO-3), every micro-batch;
    # ZeRO-1 once, after the last backward
    total = 2 * (HEAD + 2 * LAYER + (V + S) * H)
    for stage in (1, 2):
        plan = _plan(zero_stage=stage, global_batch_size=4)  # 2 micro-batches
        reduced = _collectives(plan, "allreduce")
        assert not _collectives(plan, "reducescatter")
        assert [a.nbytes for a in reduced] == [total] * (2 if stage == 2 else 1)
        assert all(a.stream != "dp" for a in reduced)
    # without ZeRO the engine all-reduces after backward (allreduce_gradients), 5e8 elements a bucket:
    # one bucket here, waiting for the whole backward (the embedding's, the last) even with 2 micro-batches
    _, prog = build_program(TWO, _plan(zero_stage=0, global_batch_size=4), H100, fidelity="reduced")
    acts = prog.actions[0]
    (bucket,) = [a for a in acts if a.op == "allreduce"]
    last_backward = [a for a in acts if a.kind == "compute" and a.category == "B"][-1]
    assert bucket.nbytes == total and bucket.deps == (last_backward.name,)
    # with overlap_comm the ZeRO-1 bucket is reduced on its own stream
    assert [a.stream for a in _collectives(_plan(zero_stage=1, overlap_comm=True), "allreduce")] == ["dp"]


def test_prefetch_depth_from_the_bucket_and_the_live_parameter_cap():
    # Llama 2 7B: 202,375,168 partitioned parameters a layer. Six fetches a layer of 5e7 elements outrun
    # it, so the lead is the cap's: floor(1e9 / 202,375,168) - 1 = 3 layers ahead; 3e7 a fetch does not
    # (1.8e8 < 2.02e8): one layer ahead; no bucket: none
    m = preset("llama2-7b")
    per_layer = layer_params_per_rank(m, 1) - 2 * m.hidden_size
    assert per_layer == 202_375_168
    plan = ParallelPlan(dp=8, zero_stage=3, framework="deepspeed")
    assert deepspeed_prefetch_depth(m, plan) == int(1e9 // per_layer) - 1 == 3
    assert deepspeed_prefetch_depth(m, ParallelPlan(dp=8, zero_stage=3, framework="deepspeed",
                                                    zero3_max_live_parameters=5e8)) == 1
    assert deepspeed_prefetch_depth(m, ParallelPlan(dp=8, zero_stage=3, framework="deepspeed",
                                                    zero3_prefetch_bucket_size=3e7)) == 1
    assert deepspeed_prefetch_depth(m, ParallelPlan(dp=8, zero_stage=3, framework="deepspeed",
                                                    zero3_prefetch_bucket_size=0)) == 0


def test_megatron_zero3_is_unchanged():
    # Megatron-Core's ZeRO-3 (the default framework): every tensor partitioned, gathered for forward and
    # again for backward, reduce-scattered, nothing persistent gathered after the step
    plan = ParallelPlan(dp=2, global_batch_size=2, zero_stage=3)
    gathers = _collectives(plan, "allgather")
    assert len(gathers) == 2 * 4  # embedding, 2 layers, head; forward and backward
    assert sum(a.nbytes for a in gathers) == pytest.approx(2 * 2 * ((V + S) * H + 2 * LAYER + HEAD), rel=1e-12)


def test_contiguous_gradients_buffers_are_resident_at_the_reduce_bucket_size():
    # stage3.py allocates one buffer of reduce_bucket_size elements (5e8, 1e9 bytes in 16 bits) however small
    # the model; stage_1_and_2.py one, and a second with overlap_comm. They hold the gradients being reduced,
    # so no bucket memory comes and goes beside them; without contiguous_gradients it does, and no buffer
    from sim.program.memory import stage_resident_bytes

    def resident_buckets(**kw):
        return stage_resident_bytes(TWO, _plan(**kw), 0, 0.0).get("buckets", 0.0)

    assert resident_buckets() == 1e9
    assert resident_buckets(zero_stage=2) == 1e9
    assert resident_buckets(zero_stage=2, overlap_comm=True) == 2e9
    assert resident_buckets(zero_stage=1, zero_bucket_size_bytes=4_000_000) == 4e6
    assert resident_buckets(contiguous_gradients=False) == 0.0
    assert resident_buckets(zero_stage=0) == 0.0

    def bucket_mem(**kw):
        return [m for a in _collectives(_plan(**kw), "reducescatter") for m in a.mem if m[1] == "buckets"]

    assert bucket_mem() == []
    assert bucket_mem(contiguous_gradients=False) == [("end", "buckets", -2 * (HEAD + 2 * LAYER + (V + S) * H))]
