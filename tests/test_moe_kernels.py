"""The MoE layer's own kernels (``sim.program.workload_moe``) and the host's launches after the
forward's synchronisation (``sim.program.launch``): a layer computed by hand on 2 x 8 GPUs,
the permutation fused or not, the shared experts beside DeepEP's exchanges, the launch bound
and the CUDA graph that removes it, and what ``trainsim explain`` lists."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.cli import main
from sim.inputs.hardware import load_profile
from sim.inputs.model import llama, preset
from sim.inputs.plan import ParallelPlan
from sim.inputs.schema import SimulationSettings
from sim.inputs.topology_build import load_topology
from sim.inputs.tp_overlap import margin_profile
from sim.program.build import BuildContext
from sim.program.costs import op_time
from sim.program.dispatch import moe_shape
from sim.program.launch import HOST_LAUNCH_S, HOST_STREAM, LAUNCH_CATEGORY, issue_bound
from sim.program.workload import Comm, Op, plan_layer_work
from sim.program.workload_moe import DEEPEP_SMS
from sim.session import Job, simulate_training

H100 = load_profile("h100-sxm")
QUIET = replace(H100, overlap_compute_slowdown=0.0)
# one MoE layer: h 1024, 32 experts of width 512, top-4, 1024 tokens per micro-batch
MOE = llama("moe-2x8", 1, 1024, 8, 8, 4096, 2048, 1024, num_experts=32, moe_router_topk=4, moe_ffn_hidden_size=512)


def _layer(model, plan):
    shape = moe_shape(model, plan, 0, model.seq_length * plan.micro_batch_size * model.moe_router_topk)
    return plan_layer_work(model, plan, shape)


def _items(work, phase="F"):
    return {i.name: i for i in work.items if i.phase == phase and not i.recompute}


def test_issue_bound_closed_form():
    # kernels of 1, 1, 1 s launched every 2 s: the last is issued at 6 s and ends at 7 s
    assert issue_bound([1.0, 1.0, 1.0], 2.0) == pytest.approx(7.0)
    # a 5 s kernel first, launched at 1 s: the GPU is the bound, 1 + 5 + 1 + 1 = 8 s
    assert issue_bound([5.0, 1.0, 1.0], 1.0) == pytest.approx(8.0)
    # launches free: the sum
    assert issue_bound([0.5, 0.25], 0.0) == pytest.approx(0.75)


def test_a_moe_layer_on_2x8_gpus_by_hand():
    """dp = ep = 16 over two DGX H100, alltoall dispatcher, dropless, balanced: each rank
    routes T = 1024 tokens to k = 4 experts (R = 4096 copies) and holds 32 / 16 = 2 experts,
    which receive L = 4096 copies, 2048 rows per expert."""
    plan = ParallelPlan(dp=16, ep=16, global_batch_size=16)
    work = _layer(MOE, plan)
    f = _items(work)
    e, h, T, E, k, R = 2, 1024, 1024, 32, 4, 4096
    # router: the T x E score GEMM, then the score function, top-k and the aux loss over T x E
    assert f["moe.router"].shape == (T, E, h) and f["moe.router"].flops == 2 * 1024 * 32 * 1024 == 67_108_864
    assert (f["moe.router.scores"].bytes_read, f["moe.router.scores"].bytes_written) == (e * T * E, 4 * T * E)
    assert f["moe.router.topk"].bytes_written == 5 * 32_768 + 12 * 4096
    assert f["moe.router.aux_loss"].bytes_read == 5 * 32_768
    # permutation (unfused: index_select gathers every copy; its indices 8 bytes each)
    assert f["moe.permute"].bytes_read == 2 * 4096 * 1024 + 8 * 4096 == 8_421_376
    assert f["moe.permute"].bytes_written == 8_388_608 and f["moe.permute"].framework
    assert f["moe.permute.map"].kernels == 9 and f["moe.permute"].kernels == 1
    # dispatch: one all-to-all of the L copies over the ep group; the host waits for the GPU before it
    d = f["moe.dispatch"]
    assert isinstance(d, Comm) and d.group == "ep" and d.collective == "all_to_all"
    assert d.nbytes == e * 4096 * h == 8_388_608 and d.host_sync
    # the received copies regrouped by local expert, and back before the combine
    assert f["moe.sort_chunks"].bytes_read == f["moe.unsort_chunks"].bytes_read == 8_388_608 + 4 * 4096
    # grouped GEMMs: 2 experts x 2048 rows, one cuBLAS GEMM (one launch) per expert
    up, down = f["moe.experts.up"], f["moe.experts.down"]
    assert (up.shape, up.batch, up.kernels) == ((2048, 2 * 512, 1024), 2, 2)
    assert (down.shape, down.batch, down.kernels) == ((2048, 1024, 512), 2, 2)
    assert up.flops == 2 * 2048 * 1024 * 1024 * 2 == 8_589_934_592
    # its time: the roofline with the profile's GEMM efficiency at that shape
    eff = H100.gemm_efficiency(2048, 1024, 1024, 2)
    moved = e * (2048 * 1024 + 1024 * 1024) * 2 + e * 2048 * 1024 * 2
    assert up.bytes_read + up.bytes_written == moved
    expect = max(up.flops / (H100.peak("bf16") * eff), moved / H100.memory_rate(False)) + H100.kernel_launch_s
    assert op_time(up, H100) == pytest.approx(expect, rel=1e-12)
    # unpermute: the weighted copies scattered back into the T rows (zero-fill, multiply, scatter_add)
    u = f["moe.unpermute"]
    assert u.bytes_read == 2 * e * R * h + 12 * R and u.bytes_written == e * R * h + 2 * e * T * h
    assert f["moe.combine"].nbytes == 8_388_608 and not f["moe.combine"].host_sync

    # simulated: the host resumes when the GPU reaches the dispatch, then launches the dispatch,
    # sort_chunks (2), up (2), swiglu (1), down (2), unsort_chunks (2): 10 launches
    tr = simulate_training(Job(MOE, plan, QUIET, load_topology("dgx-h100", nodes=2)),
                           SimulationSettings(fidelity="full")).trace
    spans = sorted((s for s in tr.spans if s.rank == 0 and s.name.split(".")[0] == "0F0"), key=lambda s: s.start_s)
    host = [s for s in spans if s.category == LAUNCH_CATEGORY]
    assert host and all(s.stream == HOST_STREAM for s in host)
    assert host[0].end_s - host[0].start_s == pytest.approx(10 * HOST_LAUNCH_S, rel=1e-9)
    dispatch = next(s for s in spans if s.name.endswith("moe.dispatch"))
    before = max(s.end_s for s in spans if s.end_s <= dispatch.start_s and s.stream == "compute")
    assert host[0].start_s == pytest.approx(before, abs=1e-12)
    # the experts' segment: its kernels' times in all, the last one waiting for the host
    comb = next(s for s in spans if s.name.endswith("moe.combine"))
    experts = [s for s in spans if s.stream == "compute" and s.start_s >= dispatch.end_s - 1e-12
               and s.end_s <= comb.start_s + 1e-12]
    names = ("moe.sort_chunks", "moe.experts.up", "moe.experts.swiglu", "moe.experts.down", "moe.unsort_chunks")
    paced = BuildContext.create(MOE, plan, QUIET).profile  # (the GEMMs at the slowest of 16 GPUs' speed)
    assert sum(s.end_s - s.start_s for s in experts) == pytest.approx(sum(op_time(f[n], paced) for n in names),
                                                                      rel=1e-9)
    body, tail = experts
    assert tail.start_s == pytest.approx(max(body.end_s, host[0].end_s), abs=1e-12)


def test_launches_bind_after_the_synchronisation_and_a_graph_removes_them():
    """One node, 128 experts of width 128 over ep 8 (16 local experts), 256 tokens: with the
    dispatch the host launches 1 + 2 + 16 + 1 + 16 + 2 = 38 kernels (190 us), more than the GPU
    needs for them, so the experts' last kernel starts when the host has launched it. With a
    capacity factor (drop-and-pad: a factor of 1 drops nothing under balanced routing) the host
    never waits (Megatron-Core's "no_sync"), nor with --cuda-graph moe besides (one graph): no host
    pieces, and the step is shorter than the dropless one."""
    model = llama("moe-launch", 1, 512, 8, 8, 2048, 2048, 256, num_experts=128, moe_router_topk=8,
                  moe_ffn_hidden_size=128)
    topo = load_topology("dgx-h100", nodes=1)
    dropless = ParallelPlan(dp=8, ep=8, global_batch_size=8)
    tr = simulate_training(Job(model, dropless, QUIET, topo), SimulationSettings(fidelity="full")).trace
    spans = sorted((s for s in tr.spans if s.rank == 0 and s.name.split(".")[0] == "0F0"), key=lambda s: s.start_s)
    host = [s for s in spans if s.category == LAUNCH_CATEGORY]
    assert host[0].end_s - host[0].start_s == pytest.approx(38 * HOST_LAUNCH_S, rel=1e-9)
    dispatch = next(s for s in spans if s.name.endswith("moe.dispatch"))
    comb = next(s for s in spans if s.name.endswith("moe.combine"))
    body, tail = [s for s in spans if s.stream == "compute" and dispatch.end_s - 1e-12 <= s.start_s < comb.start_s]
    assert host[0].end_s > body.end_s                                   # the host binds
    assert tail.start_s == pytest.approx(host[0].end_s, abs=1e-12)
    assert comb.start_s == pytest.approx(tail.end_s, abs=1e-12)
    # a capacity factor, run as drop-and-pad: Megatron-Core's preprocess knows every count from the
    # capacity and never copies one to the host ("no_sync"), so no op waits and the host runs ahead
    capped = replace(dropless, moe_capacity_factor=1.0)
    assert not any(getattr(i, "host_sync", False) for i in _layer(model, capped).items)
    tc = simulate_training(Job(model, capped, QUIET, topo), SimulationSettings(fidelity="full")).trace
    assert not [s for s in tc.spans if s.category == LAUNCH_CATEGORY]
    assert tc.end_s < tr.end_s
    graphed = replace(capped, cuda_graph=("moe",))
    assert not any(getattr(i, "host_sync", False) for i in _layer(model, graphed).items)
    tg = simulate_training(Job(model, graphed, QUIET, topo), SimulationSettings(fidelity="full")).trace
    assert not [s for s in tg.spans if s.category == LAUNCH_CATEGORY]
    assert tg.end_s < tr.end_s


def test_the_allgather_dispatcher_permutes_the_gathered_rows():
    """allgather over the 16 ranks: each rank holds T·16 = 16,384 gathered tokens, keeps the
    L = 4096 copies routed to its 2 experts (a 16,384 x 2 local map), scatters their outputs
    back into the 16,384 rows and reduce-scatters them, once."""
    plan = ParallelPlan(dp=16, ep=16, global_batch_size=16, dispatcher="allgather")
    items = [i for i in _layer(MOE, plan).items if i.phase == "F"]
    f = {i.name: i for i in items}
    e, h, rows, L = 2, 1024, 1024 * 16, 4096
    assert f["moe.permute.map"].bytes_read == 19 * rows * 2 and f["moe.permute.map"].host_sync
    assert f["moe.permute"].bytes_written == e * L * h
    assert f["moe.unpermute"].bytes_read == 2 * e * L * h + 12 * L
    assert f["moe.unpermute"].bytes_written == e * L * h + 2 * e * rows * h
    names = [i.name for i in items]
    assert names.count("moe.combine.allgather") == 1
    assert names.index("moe.unpermute") < names.index("moe.combine.allgather")
    assert names.index("moe.dispatch.allgather") < names.index("moe.permute.map")


def test_fused_permutation_reads_each_token_once():
    plan = ParallelPlan(dp=16, ep=16, global_batch_size=16)
    plain, fused = _items(_layer(MOE, plan)), _items(_layer(MOE, replace(plan, moe_permute_fusion=True)))
    e, h, T, E, R = 2, 1024, 1024, 32, 4096
    assert fused["moe.permute"].bytes_read == e * T * h + 12 * T * E         # each token once, the row-id map
    assert fused["moe.permute"].bytes_written == e * R * h + 4 * R           # its k copies and their probabilities
    assert fused["moe.permute.map"].kernels + fused["moe.permute"].kernels == 4 < \
        plain["moe.permute.map"].kernels + plain["moe.permute"].kernels == 10
    assert fused["moe.unpermute"].bytes_read == e * R * h + 4 * R and fused["moe.unpermute"].bytes_written == e * T * h
    assert fused["moe.unpermute"].kernels == 1 and plain["moe.unpermute"].kernels == 4
    assert sum(op_time(o, H100) for o in fused.values() if isinstance(o, Op)) < \
        sum(op_time(o, H100) for o in plain.values() if isinstance(o, Op))


def test_shared_experts_beside_deepeps_exchanges_run_on_the_sms_it_leaves():
    model = replace(MOE, moe_shared_expert_intermediate_size=1024)
    plan = ParallelPlan(dp=16, ep=16, global_batch_size=16, dispatcher="flex", moe_shared_expert_overlap=True)
    items = [i for i in _layer(model, plan).items if i.phase == "F"]
    names = [i.name for i in items]
    # up-projection and activation beside both exchanges (issued on their own stream), which the experts wait for
    # flex permutes the tokens it received, after the dispatch, and restores them before the combine,
    # whose own kernel sums each token's returned rows: the residual add is what waits for it
    assert names.index("moe.dispatch.nvl") < names.index("moe.shared.up") < names.index("moe.permute.map") \
        < names.index("moe.experts.up")
    assert names.index("moe.unpermute") < names.index("moe.combine.nvl") < names.index("moe.shared.down") \
        < names.index("mlp.residual")
    f = {i.name: i for i in items}
    assert f["moe.dispatch.rdma"].side and f["moe.dispatch.nvl"].side
    assert f["moe.permute.map"].after == ("moe.dispatch.rdma", "moe.dispatch.nvl")
    assert f["mlp.residual"].after == ("moe.combine.rdma", "moe.combine.nvl")
    assert names.index("moe.shared.up") > names.index("moe.router")           # after the router, not before it
    shared = [i for i in items if i.name.startswith("moe.shared.") and isinstance(i, Op)]
    assert shared and all(i.sms_held == DEEPEP_SMS == 20 for i in shared)
    up = next(i for i in shared if i.name == "moe.shared.up")
    slow = op_time(up, margin_profile(H100, DEEPEP_SMS))
    assert slow > op_time(up, H100)
    # without the overlap the shared experts run first, on every SM
    plain = [i for i in _layer(model, replace(plan, moe_shared_expert_overlap=False)).items if i.phase == "F"]
    pn = [i.name for i in plain]
    assert pn.index("moe.shared.up") < pn.index("moe.router")
    assert all(i.sms_held == 0 for i in plain if isinstance(i, Op))


def test_explain_lists_the_moe_kernels_and_the_host_bound(capsys):
    rc = main(["explain", "--num-layers", "2", "--hidden-size", "1024", "--num-attention-heads", "8",
               "--vocab-size", "2048", "--seq-length", "1024", "--swiglu", "--num-experts", "32", "--moe-router-topk", "4",
               "--moe-ffn-hidden-size", "512", "--gpu", "h100-sxm", "--gpus", "16", "--global-batch-size", "16",
               "--expert-model-parallel-size", "16"])
    out = capsys.readouterr().out
    assert rc in (0, None)
    for kernel in ("moe.router ", "moe.router.scores", "moe.router.topk", "moe.router.aux_loss", "moe.permute.map",
                   "moe.permute ", "moe.dispatch", "moe.sort_chunks", "moe.experts.up", "moe.experts.down",
                   "moe.unsort_chunks", "moe.combine", "moe.unpermute", "moe.permute.grad"):
        assert kernel in out, kernel
    # from the dispatch: 10 launches to the combine (test above), the combine and the unpermutation's 4
    assert "host: from moe.dispatch" in out and f"launches 15 kernels in {15 * HOST_LAUNCH_S * 1e6:.2f} us" in out


def test_shared_experts_overlap_the_exchange_in_the_trace():
    """One node, flex (DeepEP: only its NVLink exchange inside a node), one shared expert of width
    2048: with the overlap the shared up-projection runs while the dispatch moves, on the SMs
    DeepEP leaves, and the forward ends earlier than with the shared experts run first."""
    model = replace(MOE, moe_shared_expert_intermediate_size=2048)
    topo = load_topology("dgx-h100", nodes=1)
    plan = ParallelPlan(dp=8, ep=8, global_batch_size=8, dispatcher="flex", moe_shared_expert_overlap=True)
    over = simulate_training(Job(model, plan, QUIET, topo), SimulationSettings(fidelity="full")).trace
    plain = simulate_training(Job(model, replace(plan, moe_shared_expert_overlap=False), QUIET, topo),
                              SimulationSettings(fidelity="full")).trace

    def forward(tr):
        return sorted((s for s in tr.spans if s.rank == 0 and s.name.split(".")[0] == "0F0"), key=lambda s: s.start_s)

    f = forward(over)
    nvl = next(s for s in f if s.name.endswith("moe.dispatch.nvl"))
    beside = [s for s in f if s.stream == "compute" and s.start_s < nvl.end_s and s.end_s > nvl.start_s]
    assert beside                                                    # compute runs while the dispatch moves
    span = lambda spans: max(s.end_s for s in spans) - min(s.start_s for s in spans)  # noqa: E731
    assert span(f) < span(forward(plain))


def test_grouped_gemm_runs_one_kernel_per_expert_on_four_streams():
    """Transformer Engine's grouped GEMM launches one cuBLAS GEMM per local expert on 4 streams
    in turn (``GROUPED_GEMM_STREAMS``): by hand on a GPU of 100 SMs with one 128 x 128 tile, no
    k overhead and no caps, 10 experts of 256 x 256 x 4096 (4 tiles each) run as rounds of 4, 4
    and 2 GEMMs: 16 tiles fill 0.16 of the SMs, 8 tiles 0.08; one batched kernel would fill 0.40."""
    from sim.program.costs import gemm_compute_time
    from sim.program.ops import Op
    from sim.program.workload_moe import GROUPED_GEMM_STREAMS

    assert GROUPED_GEMM_STREAMS == 4
    gpu = replace(H100, sm_count=100, gemm_tiles=((128, 128, 1.0),), gemm_k_overhead=0.0, gemm_max_efficiency=1.0,
                  sustained_compute_fraction=1.0, gpu_speed_spread=0.0)
    m = n = 256
    k, b, e = 4096, 10, 2
    one = 2.0 * m * n * k
    op = Op("g", "F", "gemm", one * b, e * (m * k + k * n) * b, e * m * n * b, e * m * n * b, (m, n, k), b,
            kernels=b, streams=4)
    peak = gpu.peak("bf16")
    compute, rounds = gemm_compute_time(op, gpu, "bf16", "bf16")
    assert rounds == 3
    assert compute == pytest.approx(8 * one / (peak * 0.16) + 2 * one / (peak * 0.08), rel=1e-12)  # 75 one/peak
    memory = (op.bytes_read + op.bytes_written) / gpu.memory_rate(False)
    assert compute > memory
    assert op_time(op, gpu) == pytest.approx(compute + 3 * gpu.kernel_launch_s, rel=1e-12)
    batched = replace(op, streams=0)  # the same GEMMs as one batched kernel: 40 tiles, 0.40 of the SMs
    assert op_time(batched, gpu) == pytest.approx(max(10 * one / (peak * 0.40), memory) + gpu.kernel_launch_s,
                                                  rel=1e-12)
    # the MoE layer's expert GEMMs, forward, input and weight gradients, all run so
    plan = ParallelPlan(dp=16, ep=16, global_batch_size=16)
    work = _layer(MOE, plan)
    experts = [i for i in work.items if i.name.startswith("moe.experts.") and getattr(i, "kind", "") == "gemm"]
    assert len(experts) == 6 and all(i.streams == 4 and i.kernels == i.batch == 2 for i in experts)


def test_qwen3_query_and_key_norms_by_hand():
    """--qk-layernorm (Qwen3): Megatron-Core's q_layernorm over the query's 32 heads of 128 and
    k_layernorm over the key's 4 groups of 128, after the QKV GEMM. tp 2, 1024 tokens: each rank
    norms 1024 x 16 query rows and 1024 x 2 key rows of 128 (18,432 rows, 2,359,296 elements):
    forward reads them (bf16) and writes them and one fp32 1/rms per row, in two kernels;
    backward reads the gradient and the input and the 1/rms, writes the input's gradient, in two
    kernels each (the weight gradient's partial sums reduced by a second). A model without the
    flag has neither."""
    m = llama("qk", 1, 2048, 32, 4, 4096, 2048, 1024, kv_channels=128, qk_layernorm=True)
    plan = ParallelPlan(tp=2, dp=1, global_batch_size=1)
    work = plan_layer_work(m, plan, None)
    rows = 1024 * 16 + 1024 * 2
    n = rows * 128
    f, b = _items(work)["attn.qk_norm"], _items(work, "B")["attn.qk_norm.grad"]
    assert (f.bytes_read, f.bytes_written, f.flops, f.kernels) == (2 * n, 2 * n + 4 * rows, 5 * n, 2)
    assert (b.bytes_read, b.bytes_written, b.flops, b.kernels) == (4 * n + 4 * rows, 2 * n, 10 * n, 4)
    names = [i.name for i in work.items if i.phase == "F"]
    assert names.index("attn.qk_norm") == names.index("attn.qkv") + 1
    plain = plan_layer_work(replace(m, qk_layernorm=False), plan, None)
    assert not [i for i in plain.items if "qk_norm" in i.name]
    assert preset("qwen3-30b-a3b").qk_layernorm and preset("qwen3-235b-a22b").qk_layernorm
    assert not preset("deepseek-v3").qk_layernorm


def test_the_alltoall_dispatcher_gathers_the_token_counts_before_permuting():
    """Dropless alltoall over ep 16: each rank's 32 int64 counts per expert gathered from the 16
    (Megatron-Core's preprocess, gather_from_sequence_parallel_region over the tp-ep group),
    32 x 8 x 16 = 4,096 bytes, on the expert-parallel group, before the permutation; the forward
    only. None with a capacity factor (drop-and-pad returns first), with flex (DeepEP's dispatch
    exchanges its counts) or allgather (it gathers the routing map)."""
    plan = ParallelPlan(dp=16, ep=16, global_batch_size=16)
    work = _layer(MOE, plan)
    names = [i.name for i in work.items if i.phase == "F"]
    c = _items(work)["moe.dispatch.counts"]
    assert (c.collective, c.nbytes, c.group, c.side, c.host_sync) == ("all_gather", 32 * 8 * 16, "ep", False, False)
    assert names.index("moe.dispatch.counts") == names.index("moe.permute.map") - 1
    assert not [i for i in work.items if i.phase != "F" and "counts" in i.name]
    for other in (replace(plan, moe_capacity_factor=1.0), replace(plan, dispatcher="flex"),
                  replace(plan, dispatcher="allgather")):
        assert not [i for i in _layer(MOE, other).items if "counts" in i.name]


def test_token_dropping_router_kernels_by_hand():
    """--moe-expert-capacity-factor 1.0: Megatron-Core's apply_router_token_dropping keeps each
    expert's C = ceil(T*k/E * cf) tokens of highest probability. T = 1024 tokens, E = 32, k = 4:
    C = 128, C*E = 4096. torch.topk(probs, C, dim=0) over the FP32 [1024, 32] probabilities: 4
    radix passes and a gather read them (5 x 4 x 32,768 bytes), the C*E values (FP32) and
    indices (int64) are written, in 10 kernels; the mask: zeros_like, the out-of-place scatter
    (a copy, then the ones), .bool(), probs * mask; backward the product's gradient. Each a
    framework kernel: its bytes at the profile's framework rate plus its launches. Dropless:
    none of them."""
    plan = ParallelPlan(ep=8, dp=8, micro_batch_size=1, global_batch_size=8, moe_capacity_factor=1.0)
    T, E = 1024, 32
    TE, CE = T * E, 128 * E
    f, b = _items(_layer(MOE, plan)), _items(_layer(MOE, plan), "B")
    topk, mask, grad = f["moe.router.capacity.topk"], f["moe.router.capacity.mask"], b["moe.router.capacity.grad"]
    assert (topk.bytes_read, topk.bytes_written, topk.kernels) == (5 * 4 * TE, 12 * CE, 10)
    assert (mask.bytes_read, mask.bytes_written, mask.kernels) == (13 * TE + 8 * CE, 13 * TE + 4 * CE, 5)
    assert (grad.bytes_read, grad.bytes_written, grad.kernels) == (5 * TE, 4 * TE, 1)
    # in the MoE block: at its own relative rate (moe_memory_relative_efficiency, 1 when unset)
    rate = (H100.hbm_bandwidth_Bps * (H100.framework_kernel_efficiency or H100.memory_efficiency)
            * (H100.moe_memory_relative_efficiency or 1))
    for op in (topk, mask, grad):
        assert op_time(op, H100) == pytest.approx((op.bytes_read + op.bytes_written) / rate
                                                  + op.kernels * H100.kernel_launch_s, rel=1e-12), op.name
    names = [i.name for i in _layer(MOE, plan).items if i.phase == "F"]
    assert names.index("moe.router.capacity.topk") == names.index("moe.router.topk") + 1
    dropless = _layer(MOE, replace(plan, moe_capacity_factor=None))
    assert not [i for i in dropless.items if "capacity" in i.name]


def test_the_moe_blocks_memory_kernels_stream_at_their_own_relative_rate():
    """``moe_memory_relative_efficiency`` r: a memory-bound kernel of the MoE block moves its
    bytes at hbm x memory_efficiency x r (a framework kernel at its own rate x r); the dense
    part of the layer, the GEMMs and an unset r (None) price as before."""
    plan = ParallelPlan(dp=16, ep=16, global_batch_size=16)
    f = _items(_layer(MOE, plan))
    slow = replace(H100, moe_memory_relative_efficiency=0.5)
    assert slow.memory_rate(False, moe=True) == pytest.approx(H100.hbm_bandwidth_Bps * H100.memory_efficiency * 0.5)
    assert slow.memory_rate(True, moe=True) == pytest.approx(H100.memory_rate(True) * 0.5)
    unset = replace(H100, moe_memory_relative_efficiency=None)
    assert unset.memory_rate(False, moe=True) == unset.memory_rate(False)
    # the unfused permutation's gather (a framework kernel, one launch): bytes / (rate x r) + launch
    p = f["moe.permute"]
    moved = p.bytes_read + p.bytes_written
    assert op_time(p, slow) == pytest.approx(moved / (H100.memory_rate(True) * 0.5) + p.kernels * H100.kernel_launch_s,
                                             rel=1e-12)
    # not the block's: the attention's norm, and the experts' GEMM (compute-bound here) keep their time
    dense = next(i for i in _layer(MOE, plan).items if isinstance(i, Op) and i.kind == "memory"
                 and not i.name.startswith("moe."))
    assert op_time(dense, slow) == op_time(dense, unset)
    assert op_time(f["moe.experts.up"], slow) == op_time(f["moe.experts.up"], unset)
    # the profile keeps the field through its JSON form, and drops it when unset
    assert slow.to_dict()["moe_memory_relative_efficiency"] == 0.5
    assert "moe_memory_relative_efficiency" not in unset.to_dict()


def test_explain_reports_the_rate_the_moe_blocks_kernels_stream_at():
    from sim.results.explain import explain
    plan = ParallelPlan(dp=16, ep=16, global_batch_size=16)
    rows = {r["name"]: r for part in explain(MOE, plan, replace(H100, moe_memory_relative_efficiency=0.5),
                                             gpus_per_node=8)["parts"].values() for r in part["rows"]}
    # (unfused, the router's ops, the permutation and the chunk sorts are PyTorch's own kernels:
    # the framework rate; the norm is Transformer Engine's: the library rate)
    for name in ("moe.router.scores", "moe.permute", "moe.sort_chunks"):
        assert rows[name]["efficiency"] == pytest.approx(H100.framework_kernel_efficiency * 0.5)
    assert rows["attn.norm"]["efficiency"] == pytest.approx(H100.memory_efficiency)


def test_flex_permutes_the_tokens_each_rank_received_by_hand():
    """Megatron-Core's flex dispatcher sends each token once to every rank holding one of its experts and
    permutes on the receiving rank (``_DeepepManager.get_permuted_hidden_states_by_experts``): the fused
    permutation reads each received token once and writes its local copies; the unpermutation before the
    combine sums them back into the received rows. 32 experts over ep 16 (2 local), top-4, 1,024 tokens:
    a token reaches D = 16 (1 - C(30,4)/C(32,4)) distinct ranks on average (equally popular experts), so a
    rank receives T·D tokens and, balanced, T·k = 4,096 copies."""
    from math import comb

    plan = ParallelPlan(dp=16, ep=16, global_batch_size=16, dispatcher="flex", moe_permute_fusion=True)
    f, b = _items(_layer(MOE, plan)), _items(_layer(MOE, plan), "B")
    e, h, T, local, R = 2, 1024, 1024, 2, 4096
    recv = T * 16 * (1 - comb(30, 4) / comb(32, 4))
    assert f["moe.permute"].bytes_read == pytest.approx(e * recv * h + 12 * recv * local)
    assert f["moe.permute"].bytes_written == e * R * h + 4 * R
    assert f["moe.unpermute"].bytes_read == e * R * h + 4 * R
    assert f["moe.unpermute"].bytes_written == pytest.approx(e * recv * h)
    assert b["moe.permute.grad"].bytes_written == pytest.approx(e * recv * h)
    # the alltoall dispatcher permutes its own tokens' copies before sending them: T rows read
    a = _items(_layer(MOE, replace(plan, dispatcher="alltoall")))
    assert a["moe.permute"].bytes_read == e * T * h + 12 * T * 32
