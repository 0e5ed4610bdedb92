"""Which framework ran (``sim.inputs.frameworks``): FSDP1 against FSDP2 gathers, the attention
kernel, and Megatron-Core's default unchanged."""

import pytest

from sim.errors import InputError
from sim.inputs.frameworks import p2p_blocks
from sim.inputs.hardware import load_profile
from sim.inputs.model import gpt
from sim.inputs.plan import ParallelPlan
from sim.inputs.topology_build import load_topology
from sim.program.costs import op_time
from sim.program.training import build_program
from sim.program.workload import plan_layer_work
from sim.results.memory_timeline import timeline
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
A100 = load_profile("a100-80gb")
H = 256
TINY = gpt("tiny", 3, H, 4, 512, 256)  # 3 layers of width 256, vocabulary 512, 256 tokens; LayerNorm, biases, tied
LAYER_BYTES = 2 * (12 * H * H + 13 * H)  # 16-bit weights of a GPT layer: QKV, projection, MLP up and down, 2 norms
EMBEDDING_BYTES = 2 * (512 * H + 256 * H)  # tied word embedding and learned positions
HEAD_BYTES = 2 * 2 * H  # the final LayerNorm (the output layer is the tied embedding)


def _plan(**kw):
    return ParallelPlan(dp=2, global_batch_size=2, zero_stage=3, **kw)


def _gathers(plan, rank=0):
    _, prog = build_program(TINY, plan, H100, fidelity="reduced")
    return [a for a in prog.actions[rank] if a.kind == "collective" and a.op == "allgather"]


def test_fsdp2_gathers_every_layer_twice_a_step_and_shard_grad_op_once():
    # one micro-batch: FULL_SHARD / FSDP2 gather the embedding, 3 layers and the head for
    # forward and again for backward; SHARD_GRAD_OP (no reshard after forward) for forward only
    one_pass = EMBEDDING_BYTES + 3 * LAYER_BYTES + HEAD_BYTES
    full = _gathers(_plan())
    kept = _gathers(_plan(reshard_after_forward=False))
    assert (len(full), len(kept)) == (2 * 5, 5)
    assert sum(a.nbytes for a in full) == pytest.approx(2 * one_pass, rel=1e-12)
    assert sum(a.nbytes for a in kept) == pytest.approx(one_pass, rel=1e-12)
    assert all(" for 0F" in a.name for a in kept)


def test_without_reshard_after_forward_every_layer_stays_gathered_until_its_backward():
    topo = load_topology("dgx-h100")
    peaks = {}
    for reshard in (True, False):
        run = simulate_training(Job(TINY, _plan(reshard_after_forward=reshard), H100, topo))
        peaks[reshard] = max(timeline(run.trace, 0)[1]["gathered"])
    # reshard after forward (depth 1): the layer in use and the one fetched ahead; kept: at the end of
    # the forward the whole model is gathered at once
    assert peaks[True] == pytest.approx(2 * LAYER_BYTES, rel=1e-9)
    assert peaks[False] == pytest.approx(EMBEDDING_BYTES + 3 * LAYER_BYTES + HEAD_BYTES, rel=1e-9)


def test_backward_post_issues_each_backward_gather_as_the_layer_after_it_starts_its_backward():
    def deps(plan):
        _, prog = build_program(TINY, plan, H100, fidelity="reduced")
        acts = prog.actions[0]
        names = {a.name: i for i, a in enumerate(acts)}
        out = {}
        def waits_for(d):  # (FSDP's copy-in before a gather waits for what the gather waited for: sim.program.fsdp)
            b = acts[names[d]]
            return [x for e in b.deps for x in waits_for(e)] if b.category == "fsdp" else [b.layer]

        for a in acts:
            if a.kind == "collective" and a.op == "allgather" and " for 0B" in a.name:
                layer = int(a.name.split()[2])
                out[layer] = sorted({x for d in a.deps for x in waits_for(d)})
        return out

    # backward runs the head (layer 3), then layers 2, 1, 0, then the embedding (-1). BACKWARD_PRE
    # (depth 1): layer 1's gather may start once layer 3's backward is done, under layer 2's.
    # BACKWARD_POST (Composer's default, llm-foundry's framework): issued in layer 2's post-backward
    # hook, which limit_all_gathers lets the host reach once the GPU has finished layer 3's backward
    # (its wait on the free event two reshards back): the same, under layer 2's. A deeper prefetch
    # moves BACKWARD_PRE's gathers earlier (depth 2: layer 0's once layer 3's backward is done),
    # never BACKWARD_POST's
    pre = deps(_plan())
    post = deps(_plan(backward_prefetch="backward_post"))
    assert pre[1] == [3] and pre[0] == [2] and pre[-1] == [1]
    assert post[1] == [3] and post[0] == [2] and post[-1] == [1]
    assert deps(_plan(framework="llm-foundry")) == post
    assert deps(_plan(framework="torchtitan")) == pre
    deep = deps(_plan(zero3_prefetch_depth=2))
    assert deep[0] == [3] and deep[-1] == [2]
    assert deps(_plan(backward_prefetch="backward_post", zero3_prefetch_depth=2)) == post


def test_backward_post_runs_as_backward_pre_one_layer_ahead():
    # with the host one layer ahead (limit_all_gathers) BACKWARD_POST's gathers start where BACKWARD_PRE's
    # one layer ahead do, behind the same reduce-scatters: the same step to the last bit; with two layers
    # ahead BACKWARD_PRE's start earlier (sim.inputs.frameworks; the timeline by hand:
    # test_process_group_streams.test_fsdp1_backward_post_with_the_host_one_layer_ahead_by_hand)
    topo = load_topology("dgx-h100")
    times = {p: simulate_training(Job(TINY, _plan(backward_prefetch=p), H100, topo)).trace.end_s
             for p in ("backward_pre", "backward_post")}
    assert times["backward_post"] == times["backward_pre"]


@pytest.mark.parametrize("gpu, kernel, forward, backward", [
    # FlashAttention-3 paper, H100 SXM5, head dim 128, 2k tokens: FA2 362 and 298 (causal) against FA3's 625
    # and 521 forward, 291 against 501 backward
    ("h100-sxm", "fa2", (362 / 625 + 298 / 521) / 2, 291 / 501),
    # FlashAttention-2 paper, A100: FA2 1.3-1.5x the Triton kernel's forward, 2x its backward (times FA2's on H100)
    ("h100-sxm", "triton", (362 / 625 + 298 / 521) / 2 / 1.4, 291 / 501 / 2),
    ("a100-80gb", "triton", 1 / 1.4, 1 / 2),
    ("a100-80gb", "fa2", 1.0, 1.0),
])
def test_an_attention_kernel_runs_at_its_published_speed_relative_to_the_profiles_own(gpu, kernel, forward, backward):
    profile = {"h100-sxm": H100, "a100-80gb": A100}[gpu]
    model = gpt("att", 2, 4096, 32, 512, 2048)
    te = plan_layer_work(model, ParallelPlan(micro_batch_size=4))
    other = plan_layer_work(model, ParallelPlan(micro_batch_size=4, attention_kernel=kernel))
    for name, speed in (("attn.core", forward), ("attn.core.grad", backward)):
        a, b = (next(o for o in w.ops() if o.name == name) for w in (te, other))
        assert b.kernel == kernel and a.kernel == "te"
        # compute-bound at these shapes: the kernel's time less the launch cost scales by 1/speed
        ratio = (op_time(a, profile) - profile.kernel_launch_s) / (op_time(b, profile) - profile.kernel_launch_s)
        assert ratio == pytest.approx(speed, abs=2e-3)
    # nothing else changes
    assert [op_time(o, profile) for o in te.ops() if o.kind != "attention"] == \
           [op_time(o, profile) for o in other.ops() if o.kind != "attention"]


def test_megatron_named_or_not_is_the_same_simulation():
    topo = load_topology("dgx-h100")
    base = simulate_training(Job(TINY, _plan(), H100, topo))
    named = simulate_training(Job(TINY, _plan(framework="megatron", attention_kernel="te",
                                              backward_prefetch="backward_pre", reshard_after_forward=True),
                                  H100, topo))
    assert named.trace.spans == base.trace.spans
    assert "framework" not in _plan().summary() and "reshard_after_forward" not in _plan().summary()


def test_a_kernel_the_profile_has_no_speed_for_is_refused():
    b200 = load_profile("b200")
    model = gpt("att", 1, 512, 8, 512, 512)
    work = plan_layer_work(model, ParallelPlan(framework="torchtitan"))
    op = next(o for o in work.ops() if o.kind == "attention")
    with pytest.raises(InputError, match=r"attention_kernel: got 'fa2'.*profile b200.*attention_kernel_speed: te\)"):
        op_time(op, b200)


def test_llm_foundry_steps_composers_unfused_adamw_and_fsdp1s_clipping():
    # Composer's DecoupledAdamW, one eager op after another on fp32 tensors (84 bytes a parameter, no
    # weight decay), and FSDP1's clip_grad_norm_ (a norm, read 4, and a scale, read and write 4): 96
    # bytes a local parameter against Megatron-Core's 46 (Adam 28, norm 4, clipping 8, weight copy 6)
    def step_s(framework):
        _, prog = build_program(TINY, _plan(framework=framework), H100, fidelity="reduced")
        (opt,) = [a for a in prog.actions[0] if a.name == "optimizer"]
        return opt.duration_s

    local = (3 * (12 * H * H + 13 * H) + 512 * H + 256 * H + 2 * H) / 2  # ZeRO-3 over 2 ranks
    rate = H100.hbm_bandwidth_Bps * H100.memory_efficiency
    assert step_s("llm-foundry") == pytest.approx(96 * local / rate, rel=1e-12)
    assert step_s("megatron") == pytest.approx(46 * local / rate, rel=1e-12)
    assert step_s("torchtitan") == step_s("megatron")


@pytest.mark.parametrize("kw, blocks", [
    (dict(pp=2, global_batch_size=4), True),                               # Megatron-Core's 1F1B
    (dict(pp=2, vpp=2, global_batch_size=4), False),                       # interleaved: overlap_p2p_comm
    (dict(pp=2, global_batch_size=4, framework="torchtitan"), False),      # torch.distributed.pipelining
    (dict(pp=1, global_batch_size=4), False),                              # no pipeline
    (dict(pp=2, global_batch_size=4, schedule="zb-h1"), False),            # not Megatron-Core's 1F1B
])
def test_only_megatron_cores_non_interleaved_1f1b_waits_for_its_pipeline_sends(kw, blocks):
    assert p2p_blocks(ParallelPlan(**kw)) is blocks


def test_a_megatron_1f1b_rank_starts_no_step_before_its_last_send_is_done():
    # Two DGX H100 nodes, one stage each (pp 2 over InfiniBand): every compute action after a
    # send starts once that send has finished; the interleaved schedule's sends run beside.
    model, profile = gpt("pp-test", 4, 1024, 8, 32000, 2048), H100
    topo = load_topology("dgx-h100", nodes=2)

    def sends_then_steps(plan):
        run = simulate_training(Job(model, plan, profile, topo))
        spans = sorted((s for s in run.trace.spans if s.rank == 0), key=lambda s: s.start_s)
        gaps = []
        for i, s in enumerate(spans):
            if s.kind == "send":
                nxt = next((t for t in spans[i + 1:] if t.kind == "compute" and t.start_s >= s.start_s), None)
                if nxt is not None:
                    gaps.append(nxt.start_s - s.end_s)
        return gaps

    blocking = sends_then_steps(ParallelPlan(tp=8, pp=2, global_batch_size=8))
    assert blocking and min(blocking) >= -1e-12
    beside = sends_then_steps(ParallelPlan(tp=8, pp=2, vpp=2, global_batch_size=8))
    assert beside and min(beside) < 0
