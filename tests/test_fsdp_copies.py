"""PyTorch FSDP's own copies (``sim.program.fsdp``): each copy's bytes and time on a small
layer by hand, where they sit in the program, and the plans they must leave alone
(Megatron-Core's, and ZeRO-1/2 under any framework)."""

import pytest

from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.program.fsdp import COPY_IN_STREAM, REDUCE_STREAM, copy_time, fsdp_copies
from sim.program.training import build_program

H100 = load_profile("h100-sxm")
H = 256
TINY = gpt("tiny", 3, H, 4, 512, 256)  # 3 layers of width 256, vocabulary 512, 256 tokens; LayerNorm, biases, tied
LAYER = 12 * H * H + 13 * H  # a GPT layer's elements: QKV, projection, MLP up and down, their biases, 2 norms


def _copies(fsdp, fp32):
    return {(c.when, c.stream): c for c in fsdp_copies(fsdp, fp32)}


def test_each_copy_of_a_small_layer_moves_the_bytes_pytorch_reads_and_writes():
    # a layer of 1,000 elements over 4 ranks: shard 250. fp32 masters, bf16 gathered weights and
    # gradients. Rate 1,000 B/s and 1 s a kernel, so a copy's seconds are its kB plus its kernels.
    u, n, rate, launch = 1000, 4, 1000.0, 1.0
    f1 = fsdp_copies("fsdp1", True)
    got = {c.what: (c.nbytes(u, n), copy_time(c, u, n, rate, launch)) for c in f1}
    assert got == {
        "_use_low_precision_shard (fp32 shard -> bf16)": (250 * (4 + 2), 1.5 + 1),   # read 4S, write 2S
        "split backward: cat of the views' gradients": (1000 * (2 + 2), 4.0 + 1),    # read 2U, write 2U
        "_post_backward_hook grad.to(reduce_dtype)": (1000 * (2 + 4), 6.0 + 1),      # read 2U, write 4U
        # _reduce_grad's _div_if_needed: the fp32 unsharded gradient before the reduce-scatter, the shard after
        "_reduce_grad _div_if_needed (gradient pre-divide)": (1000 * (4 + 4), 8.0 + 1),
        "_reduce_grad _div_if_needed (gradient post-divide)": (250 * (4 + 4), 2.0 + 1),
        "_accumulate_sharded_grad (+=)": (250 * (8 + 4), 3.0 + 1),                  # fp32: read 2 shards, write 1
    }
    # FSDP1 reducing in bf16 (Composer's PURE): no unsharded cast, the divides in bf16; the reduced
    # shard cast to fp32 after the post-divide
    pure = {c.what: (c.when, c.stream, c.nbytes(u, n)) for c in fsdp_copies("fsdp1", False)}
    assert [w for w, (when, _, _) in pure.items() if when in ("reduce", "after_reduce")] == [
        "split backward: cat of the views' gradients", "_reduce_grad _div_if_needed (gradient pre-divide)",
        "_reduce_grad _div_if_needed (gradient post-divide)", "_cast_grad_to_param_dtype"]
    # (the unsharded pre-divide priced on the compute stream, as the fp32 cast: sim.program.fsdp)
    assert pure["_reduce_grad _div_if_needed (gradient pre-divide)"] == ("reduce", "compute", 1000 * (2 + 2))
    assert pure["_cast_grad_to_param_dtype"] == ("after_reduce", "reduce", 250 * (2 + 4))
    assert pure["_accumulate_sharded_grad (+=)"] == ("accumulate", "reduce", 250 * (4 + 2))
    f2 = fsdp_copies("fsdp2", True)
    got = {c.what: (c.when, c.stream, c.nbytes(u, n)) for c in f2}
    assert got == {
        "_get_param_all_gather_inputs _foreach_copy_ (fp32 -> bf16)": ("gather", "copy_in", 250 * (4 + 2)),
        "all_gather_copy_in _foreach_copy_": ("gather", "copy_in", 250 * (2 + 2)),
        "foreach_all_gather_copy_out split_with_sizes_copy": ("gather", "compute", 1000 * (2 + 2)),
        "foreach_reduce_scatter_copy_in _chunk_cat": ("reduce", "compute", 1000 * (2 + 4)),
        "foreach_reduce grad += (accumulate)": ("accumulate", "reduce", 250 * (8 + 4)),
    }
    assert _copies("fsdp2", False)[("reduce", "compute")].nbytes(u, n) == 1000 * (2 + 2)
    assert fsdp_copies("", True) == ()


def _program(**kw):
    # 2 micro-batches; under ZeRO-2/3 a reduce-scatter per layer (buckets of 1 byte: each layer closes its own)
    plan = ParallelPlan(dp=2, global_batch_size=4, micro_batch_size=1, zero_bucket_size_bytes=1, **kw)
    _, prog = build_program(TINY, plan, H100, fidelity="reduced")
    return prog.actions[0]


def test_fsdp1_copies_sit_on_their_streams_around_each_gather_and_reduce_scatter():
    acts = _program(zero_stage=3, framework="llm-foundry")
    by = {a.name: a for a in acts}
    rate = H100.memory_rate()
    gathers = [a for a in acts if a.kind == "collective" and a.op == "allgather"]
    scatters = [a for a in acts if a.kind == "collective" and a.op == "reducescatter"]
    copies = [a for a in acts if a.category == "fsdp"]
    # each gather waits for its shard's cast on the pre-unshard stream; a layer of LAYER elements
    # over 2 ranks: read 4, write 2 bytes of each of LAYER/2 elements
    layer_gathers = [g for g in gathers if g.name.startswith("gather layer 1 ")]
    assert len(layer_gathers) == 4  # forward and backward, 2 micro-batches
    for g in layer_gathers:
        cast = by[g.deps[-1]]
        assert cast.stream == COPY_IN_STREAM and cast.nbytes == 6 * LAYER / 2
        assert cast.duration_s == pytest.approx(6 * LAYER / 2 / rate + H100.kernel_launch_s, rel=1e-12)
    # each reduce-scatter moves fp32 gradients (Composer's DEFAULT) and waits for the cast, which waits
    # for the views' gradient cat; FSDP runs the cast on its post-backward stream, but a kernel over the
    # whole unsharded gradient takes the SMs the backward's GEMMs would use: priced on the compute
    # stream (sim.program.fsdp); the reduce-scatter runs on the data-parallel group's NCCL stream
    # (sim.program.process_group_streams)
    layer_rs = [s for s in scatters if "(layers 1..1)" in s.name]
    assert len(layer_rs) == 2 and all(s.nbytes == 4 * LAYER for s in layer_rs)
    for s in layer_rs:
        # (then the in-place pre-divide of the fp32 gradient: 2 ranks, factor 2; no post-divide, factor 2/2 = 1)
        divide = by[s.deps[-1]]
        cast = by[divide.deps[0]]
        cat = by[cast.deps[0]]
        assert (divide.stream, divide.nbytes) == ("compute", 8 * LAYER) and "pre-divide" in divide.name
        assert (cast.stream, s.stream, cast.nbytes) == ("compute", "dp", 6 * LAYER)
        assert cat.stream == "compute" and cat.nbytes == 4 * LAYER and cat.deps == s.deps[:1]
    assert not [a for a in copies if "post-divide" in a.name]
    # the shard accumulation follows the second micro-batch's reduce-scatters only
    acc = [a for a in copies if a.name.startswith("fsdp _accumulate_sharded_grad")]
    assert acc and all(" of 0B1" in a.name for a in acc) and all(a.stream == REDUCE_STREAM for a in acc)
    assert len(acc) == len([s for s in scatters if " of 0B1" in s.name])


def test_fsdp2_copies_out_on_the_compute_stream_before_the_layers_first_kernel():
    acts = _program(zero_stage=3, framework="torchtitan")
    index = {a.name: i for i, a in enumerate(acts)}
    outs = [a for a in acts if a.name.startswith("fsdp foreach_all_gather_copy_out")]
    gathers = [a for a in acts if a.kind == "collective" and a.op == "allgather"]
    assert len(outs) == len(gathers)
    for o in outs:
        user = acts[index[o.name] + 1]  # the kernel right after it waits for it
        assert o.stream == "compute" and o.name in user.deps and o.deps[0].startswith("gather ")
    copy_ins = [a for a in acts if a.stream == COPY_IN_STREAM]
    assert len(copy_ins) == 2 * len(gathers)


@pytest.mark.parametrize("kw", [dict(zero_stage=3), dict(zero_stage=3, framework="megatron"),
                                dict(zero_stage=1, framework="llm-foundry"), dict(zero_stage=2, framework="torchtitan"),
                                dict(zero_stage=2, framework="automodel"), dict(zero_stage=3, framework="deepspeed")])
def test_plans_without_pytorch_fsdp_get_no_copies_and_reduce_in_16_bits(kw):
    acts = _program(**kw)
    assert not [a for a in acts if a.category == "fsdp" or a.stream == COPY_IN_STREAM]
    if kw.get("framework") == "deepspeed":  # (its own buckets and persistent parameters: test_deepspeed.py)
        return
    # the gradient reductions move 2 bytes a parameter: the same as Megatron-Core's plan of that stage
    reduce = [a.nbytes for a in acts if a.kind == "collective" and a.op in ("reducescatter", "allreduce")]
    megatron = _program(zero_stage=kw["zero_stage"])
    assert reduce and reduce == [a.nbytes for a in megatron
                                 if a.kind == "collective" and a.op in ("reducescatter", "allreduce")]

def test_a_given_reduce_dtype_wins_over_the_frameworks():
    fp32 = _program(zero_stage=3, framework="llm-foundry")
    bf16 = _program(zero_stage=3, framework="llm-foundry", grad_reduce_fp32=False)
    rs = lambda acts: [a.nbytes for a in acts if a.kind == "collective" and a.op == "reducescatter"]  # noqa: E731
    assert rs(fp32) == [2 * n for n in rs(bf16)]
    assert not [a for a in bf16 if a.name.startswith("fsdp _post_backward_hook")]
    assert [a for a in bf16 if a.name.startswith("fsdp _cast_grad_to_param_dtype")]


def _torch_divide_factors(n):
    """torch 2.1's ``DefaultState._get_gradient_predivide_factor`` and ``_init_core_state``'s
    post-divide n / f, written out again for the check."""
    f = 1
    while n % f == 0 and n / f > f:
        f *= 2
    return f, n / f


@pytest.mark.parametrize("ranks", [2, 3, 4, 8, 64, 128])
def test_fsdp1_divides_where_torchs_factors_are_over_one(ranks):
    pre, post = _torch_divide_factors(ranks)  # 2: (2, 1); 4: (2, 2); 8: (4, 2); 64: (8, 8); 128: (16, 8)
    f1 = {c.what: c for c in fsdp_copies("fsdp1", True)}
    runs = lambda what: ranks >= f1[f"_reduce_grad _div_if_needed (gradient {what})"].min_ranks  # noqa: E731
    assert (runs("pre-divide"), runs("post-divide")) == (pre > 1, post > 1)
