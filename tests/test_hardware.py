"""HardwareProfile: presets from REFERENCE.md, the GEMM efficiency model, strict JSON, costs."""

import json
import random
from dataclasses import replace

import pytest

from sim.program.costs import collective_time, op_time, transfer_time
from sim.errors import InputError
from sim.inputs.hardware import LINK_KINDS, PRESETS, HardwareProfile, LinkModel, load_profile
from sim.program.workload import Op


@pytest.fixture(params=PRESETS)
def profile(request):
    return load_profile(request.param)


def test_presets_carry_reference_figures():
    a100, h100, h200 = (load_profile(n) for n in ("a100-80gb", "h100-sxm", "h200"))
    # REFERENCE.md hardware table (datasheet peaks).
    assert (a100.peak("bf16"), a100.hbm_bandwidth_Bps) == (312e12, 2.039e12)
    assert (h100.peak("bf16"), h100.hbm_bandwidth_Bps) == (989e12, 3.35e12)
    assert (h200.peak("bf16"), h200.hbm_bandwidth_Bps) == (989e12, 4.8e12)
    assert a100.hbm_capacity_bytes >= 80e9 and h200.hbm_capacity_bytes >= 141e9
    # NVLink: per-direction line rate is half the datasheet total (600 / 900 GB/s) ...
    assert a100.link("nvlink").bandwidth_Bps == 600e9 / 2
    assert h100.link("nvlink").bandwidth_Bps == h200.link("nvlink").bandwidth_Bps == 900e9 / 2
    # ... and the efficiency turns it into what NCCL achieves: ~230 GB/s (A100), ~370 GB/s (H100).
    assert a100.link("nvlink").effective_Bps == pytest.approx(230e9, rel=0.002)
    assert h100.link("nvlink").effective_Bps == pytest.approx(370e9, rel=0.002)
    # InfiniBand: HDR ~24 GB/s per NIC; NDR 46-49 GB/s per NIC.
    assert a100.link("ib").effective_Bps == pytest.approx(24e9, rel=0.002)
    assert 46e9 <= h100.link("ib").effective_Bps <= 49e9
    # Measured best GEMM: 85.9% (A100), ~80% (H100, 792-795 of 989).
    assert a100.gemm_max_efficiency * 312 == pytest.approx(267.9, rel=0.001)
    assert 792 <= h100.gemm_max_efficiency * 989 <= 795


def test_every_field_cites_a_source(profile):
    cited = {k.split(".")[0] for k in profile.sources}
    cited |= {"links"} if all(f"links.{k}" in profile.sources for k in profile.links) else set()
    for field in profile.to_dict():
        if field not in ("name", "sources"):
            assert field in cited, field


def test_link_kinds_are_the_topology_kinds(profile):
    assert sorted(profile.links) == sorted(LINK_KINDS) == ["ethernet", "ib", "nvlink", "pcie"]
    assert profile.link_efficiencies() == {k: profile.link(k).efficiency for k in sorted(LINK_KINDS)}


def test_a100_gemm_6912x16384x2048_near_measured_best():
    # The benchmark times the kernel alone (sustained_compute_fraction 1); a training step
    # sustains the preset's fraction of it.
    a100 = load_profile("a100-80gb")
    alone = replace(a100, sustained_compute_fraction=1.0)
    tflops = alone.gemm_efficiency(6912, 16384, 2048) * a100.peak("bf16") / 1e12
    assert tflops == pytest.approx(267.9, rel=0.05)
    op = Op("g", "F", "gemm", 2 * 6912 * 16384 * 2048, 0, 0, 0, (6912, 16384, 2048))
    assert op.flops / (op_time(op, alone) - a100.kernel_launch_s) / 1e12 == pytest.approx(tflops, rel=1e-9)
    in_step = op.flops / (op_time(op, a100) - a100.kernel_launch_s) / 1e12
    assert in_step == pytest.approx(tflops * a100.sustained_compute_fraction, rel=1e-9)


def test_gemm_efficiency_monotone_on_the_diagonal_and_capped(profile):
    # The diagonal sweep of GEMM benchmarks: square sizes doubling, 32 .. 32768.
    sizes = [2**i for i in range(5, 16)]
    effs = [profile.gemm_efficiency(x, x, x) for x in sizes]
    assert all(b >= a for a, b in zip(effs, effs[1:])), effs
    # Every doubling sweep, whatever size it starts from: doubling m and n gives each tile
    # shape 4x the tiles (the partial last wave can only fill up: ceil(4T/S) <= 4 ceil(T/S))
    # at the same tile padding, and doubling k shrinks k0/(k+k0). Between doublings the
    # efficiency is a sawtooth on purpose: a size just past a full wave leaves SMs idle
    # (wave quantization, as real kernels show), so it is not monotone at every integer.
    for x in range(1, 3000):
        assert profile.gemm_efficiency(2 * x, 2 * x, 2 * x) >= profile.gemm_efficiency(x, x, x), x
    cap = profile.gemm_max_efficiency * profile.sustained_compute_fraction  # (in a training step)
    assert effs[-1] > 0.95 * cap
    rng = random.Random(3)
    for _ in range(2000):
        m, n, k = (rng.choice([1, 7, 64, 100, 128, 1000, 4096, 5120, 12288, 65536]) for _ in range(3))
        assert 0 < profile.gemm_efficiency(m, n, k, rng.choice([1, 3, 96])) <= cap


def _tiny(**kw):
    base = dict(name="tiny", peak_flops={"bf16": 100.0, "fp32": 10.0}, hbm_bandwidth_Bps=10.0,
                hbm_capacity_bytes=1e9, sm_count=4, gemm_tiles=((128, 128, 1.0),), gemm_k_overhead=0,
                gemm_max_efficiency=0.5, attention_max_efficiency=0.5, memory_efficiency=1.0,
                kernel_launch_s=0.0, links={"nvlink": LinkModel(1e-6, 100.0, 0.5)})
    base.update(kw)
    return HardwareProfile(**base)


def test_tile_and_wave_quantization_by_hand():
    p = _tiny()
    assert p.gemm_efficiency(256, 256, 64) == 0.5                  # 4 tiles on 4 SMs: one full wave
    assert p.gemm_efficiency(256, 384, 64) == 0.5 * 6 / 8          # 6 tiles: two waves, 6 of 8 slots busy
    assert p.gemm_efficiency(200, 256, 64) == 0.5 * (200 * 256) / (256 * 256)   # tile padding
    assert p.gemm_efficiency(128, 128, 64) == 0.5 / 4              # one tile, 3 SMs idle
    assert p.gemm_efficiency(128, 128, 64, batch=4) == 0.5         # batched: full wave
    q = _tiny(gemm_k_overhead=64)
    assert q.gemm_efficiency(256, 256, 64) == 0.5 * 64 / 128


def test_roofline_op_time_by_hand():
    p = _tiny(kernel_launch_s=1.0)
    compute_bound = Op("g", "F", "gemm", 2 * 256 * 256 * 64, 10, 10, 10, (256, 256, 64))
    assert op_time(compute_bound, p) == pytest.approx(2 * 256 * 256 * 64 / 50.0 + 1.0)
    memory_bound = Op("n", "F", "memory", 100.0, 300.0, 200.0, 200.0)
    assert op_time(memory_bound, p) == pytest.approx(500.0 / 10.0 + 1.0)


def test_bias_pass_without_a_gemm_epilogue_by_hand():
    # A linear layer's bias: free in a GPU's GEMM epilogue; on a CPU written into the
    # 40-byte output first and read back by the GEMM: 80 bytes at the framework's rate.
    p = _tiny(kernel_launch_s=1.0, framework_kernel_efficiency=0.5)  # 10 B/s x 0.5
    g = Op("g", "F", "gemm", 2 * 256 * 256 * 64, 10, 40, 40, (256, 256, 64), bias=True)
    plain = 2 * 256 * 256 * 64 / 50.0 + 1.0
    assert op_time(g, p) == pytest.approx(plain)
    assert op_time(g, replace(p, gemm_bias_epilogue=False)) == pytest.approx(plain + 80 / 5.0)
    no_bias = replace(g, bias=False)
    assert op_time(no_bias, replace(p, gemm_bias_epilogue=False)) == pytest.approx(plain)
    d = replace(p, gemm_bias_epilogue=False).to_dict()
    assert d["gemm_bias_epilogue"] is False and "gemm_bias_epilogue" not in p.to_dict()
    assert HardwareProfile.from_dict(d).gemm_bias_epilogue is False
    with pytest.raises(InputError, match="gemm_bias_epilogue: got 'no'; expected true or false"):
        HardwareProfile.from_dict({**d, "gemm_bias_epilogue": "no"})


def test_link_and_ring_closed_forms():
    p = _tiny()
    assert transfer_time(1000, "nvlink", p) == pytest.approx(1e-6 + 1000 / 50.0)
    n, S = 8, 8000.0
    # REFERENCE.md: ring all-reduce 2(n-1)(α + S/(nB)); all-gather/reduce-scatter (n-1)(...).
    assert collective_time("all_reduce", S, n, "nvlink", p) == pytest.approx(2 * (n - 1) * (1e-6 + S / (n * 50.0)))
    assert collective_time("all_gather", S, n, "nvlink", p) == pytest.approx((n - 1) * (1e-6 + S / (n * 50.0)))
    assert collective_time("reduce_scatter", S, 1, "nvlink", p) == 0.0
    with pytest.raises(InputError, match="ib"):
        transfer_time(10, "ib", p)


def test_json_round_trip(tmp_path, profile):
    path = tmp_path / "p.json"
    profile.save(path)
    again = load_profile(path)
    assert again == profile and again.sources == profile.sources
    assert again.to_dict() == json.loads(path.read_text())


def one_line(exc_info, *words):
    msg = str(exc_info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


def _write(tmp_path, data):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


def test_bad_profiles_are_one_line_errors(tmp_path):
    good = load_profile("a100-80gb").to_dict()
    cases = []
    d = dict(good); del d["sm_count"]; cases.append((d, ["missing key", "sm_count"]))
    d = dict(good, turbo=True); cases.append((d, ["unknown key", "turbo"]))
    d = json.loads(json.dumps(good)); d["links"]["ib"]["bandwidth_Bps"] = -25e9
    cases.append((d, ["links.ib.bandwidth_Bps", "-25"]))
    d = json.loads(json.dumps(good)); d["links"]["infiniband"] = d["links"].pop("ib")
    cases.append((d, ["unknown key", "infiniband", "nvlink, pcie, ib, ethernet"]))
    d = json.loads(json.dumps(good)); del d["links"]["nvlink"]["efficiency"]
    cases.append((d, ["links.nvlink", "missing key", "efficiency"]))
    d = json.loads(json.dumps(good)); d["links"]["nvlink"]["efficiency"] = 1.3
    cases.append((d, ["links.nvlink.efficiency", "1.3"]))
    d = dict(good, gemm_max_efficiency=0); cases.append((d, ["gemm_max_efficiency"]))
    d = dict(good, peak_flops={"bf17": 1e12}); cases.append((d, ["peak_flops", "bf17"]))
    d = dict(good, sources={"nonsense": "x"}); cases.append((d, ["sources", "nonsense"]))
    for data, words in cases:
        with pytest.raises(InputError) as info:
            load_profile(_write(tmp_path, data))
        one_line(info, "bad.json", *words)
    with pytest.raises(InputError) as info:
        load_profile("b300")
    one_line(info, "b300", "a100-80gb")
    with pytest.raises(InputError) as info:
        _tiny(hbm_bandwidth_Bps=-1.0)
    one_line(info, "tiny", "hbm_bandwidth_Bps", "-1")


def test_profiles_are_hashable_and_sources_do_not_matter(profile):
    again = HardwareProfile.from_dict({**profile.to_dict(), "sources": {}})
    assert again == profile and hash(again) == hash(profile)
    assert len({profile, again}) == 1


def test_equal_profiles_share_cache_entries_and_a_changed_one_does_not():
    # Caches (functools.lru_cache) key on a profile: two profiles of the same content, read
    # separately, are one entry; a profile changed in any field is another.
    from functools import lru_cache

    calls = []

    @lru_cache(maxsize=None)
    def cached(p):
        calls.append(p)
        return p.peak("bf16")

    a, b = load_profile("h100-sxm"), load_profile("h100-sxm")
    assert a is not b and a == b and hash(a) == hash(b)
    assert cached(a) == cached(b) and len(calls) == 1 and cached.cache_info().hits == 1
    for change in ({"gemm_max_efficiency": a.gemm_max_efficiency / 2}, {"sm_count": a.sm_count - 1},
                   {"peak_flops": {**a.peak_flops, "bf16": a.peak_flops["bf16"] / 2}}, {"name": "other"}):
        c = replace(a, **change)
        assert c != a and hash(c) != hash(a), change
        cached(c)
    assert len(calls) == 5


def test_a_profile_is_frozen_and_hashes_its_content_once(monkeypatch):
    import dataclasses
    import pickle

    p = load_profile("a100-80gb")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.sm_count = 1
    # Its tables, nested ones too, refuse changes in place: the content, hence the hash, is fixed.
    for change in (lambda: p.peak_flops.__setitem__("bf16", 1.0), lambda: p.peak_flops.update(bf16=1.0),
                   lambda: p.nccl_base_latency_s["ring"].pop("ll"), lambda: p.links.clear()):
        with pytest.raises(TypeError):
            change()
    serialised = []
    to_dict = HardwareProfile.to_dict
    monkeypatch.setattr(HardwareProfile, "to_dict", lambda self: serialised.append(self) or to_dict(self))
    first = hash(p)
    assert all(hash(p) == first for _ in range(100)) and len(serialised) == 1
    assert dataclasses.asdict(p) == dataclasses.asdict(load_profile("a100-80gb"))  # (the kept hash is no field)
    # A copy sent to another process hashes afresh there (a string's hash depends on the
    # process): the kept hash does not travel with it.
    again = pickle.loads(pickle.dumps(p))
    assert again == p and hash(again) == first and len(serialised) == 2


def test_a_bias_pass_does_not_make_a_gemm_memory_bound_in_explain():
    # explain's bound column judges the GEMM, not the pass in front of it.
    from sim.results.explain import _op_row

    p = replace(_tiny(kernel_launch_s=1.0), gemm_bias_epilogue=False)
    g = Op("g", "F", "gemm", 2 * 256 * 256 * 64, 10, 40, 40, (256, 256, 64), bias=True)
    row = _op_row(g, p)
    assert row["bound"] == "compute" and row["time_s"] == pytest.approx(2 * 256 * 256 * 64 / 50.0 + 80 / 10.0 + 1.0)


def test_a_causal_flash_kernel_is_priced_on_the_blocks_up_to_the_diagonal():
    # issue 50 (Llama 3 8B on 8 B200, seq 8192, 32 heads of 128, micro-batch 2): with 128-key
    # blocks query block i computes i + 1 of the T = 64 key blocks, so the kernel does
    # sum(i + 1) / T² = 65/128 of the non-causal count the FLOPs follow.
    from sim.inputs.hardware import causal_work_fraction

    assert causal_work_fraction(8192) == 65 / 128
    assert causal_work_fraction(128) == 1.0  # one block, the diagonal, computed whole
    assert causal_work_fraction(1_000_000) == pytest.approx(0.5, abs=1e-4)
    b200 = replace(load_profile("b200"), sustained_compute_fraction=1.0)
    tiles = 64 * 64  # 128-query tiles x (2 sequences x 32 heads)
    wave_q = tiles / (-(-tiles // 148) * 148)  # 4096 CTAs on 148 SMs: 28 waves of 148
    # (and the causal kernel's 0.95 of the non-causal one's throughput on its work, beyond the diagonal)
    # (the B200's cuDNN 9.13 kernel: cap 0.687, k0 1,103 keys; experiments/fit_attention_cudnn.py)
    by_hand = 0.687 * wave_q * 8192 / (8192 + 1103) / (65 / 128) * 0.95
    assert b200.attention_efficiency(8192, 8192, 128, 64) == pytest.approx(by_hand, rel=1e-12)
    # the forward kernel of one layer alone (4·s²·d per head on the FLOP count, 2.199 TFLOP):
    # 2.199 / (2,250 x 0.687 x 0.98842 x 0.88133 / 0.50781 x 0.95 = 2,519 TFLOP/s) = 0.8730 ms,
    # where pricing the whole square at the non-causal kernel's rate gives twice the blocks' work
    op = Op("attn.core", "F", "attention", 4 * 8192**2 * 128 * 64, 0.0, 0.0, 0.0, (8192, 8192, 128), 64)
    assert op_time(op, replace(b200, kernel_launch_s=0.0)) == pytest.approx(0.8730e-3, rel=1e-4)


def test_the_backward_and_causal_flash_kernels_run_below_the_non_causal_forward():
    # FlashAttention-3 paper, H100, head dim 128, 16k tokens: backward 561 TFLOP/s on 2.5x the
    # forward's count, non-causal forward 648, causal forward 616 on half the square
    h100 = replace(load_profile("h100-sxm"), sustained_compute_fraction=1.0, kernel_launch_s=0.0)
    assert h100.attention_backward_relative_efficiency == pytest.approx(561 * 2 / 2.5 / 648, abs=1e-3)
    assert h100.attention_causal_relative_efficiency == pytest.approx(616 / 648 / (0.5 / (0.5 + 64 / 16384)), abs=1e-2)
    fwd = h100.attention_efficiency(16384, 16384, 128, 16)
    assert h100.attention_efficiency(16384, 16384, 128, 16, backward=True) == pytest.approx(fwd * 0.692, rel=1e-12)
    # the backward op (8·s²·d per head, recomputation not counted) takes 2/0.692 = 2.890 of the
    # forward's time; a recomputed forward in the backward phase runs the forward kernel
    shape, batch, flops = (16384, 16384, 128), 16, 4 * 16384**2 * 128 * 16
    f = op_time(Op("attn.core", "F", "attention", flops, 0.0, 0.0, 0.0, shape, batch), h100)
    b = op_time(Op("attn.core", "B", "attention", 2 * flops, 0.0, 0.0, 0.0, shape, batch), h100)
    r = op_time(Op("attn.core", "B", "attention", flops, 0.0, 0.0, 0.0, shape, batch, recompute=True), h100)
    assert b / f == pytest.approx(2 / 0.692, rel=1e-12) and r == pytest.approx(f, rel=1e-12)
    # a profile that gives neither prices both passes as the non-causal forward (1)
    bare = replace(h100, attention_backward_relative_efficiency=None, attention_causal_relative_efficiency=None)
    assert bare.attention_efficiency(16384, 16384, 128, 16, backward=True) == pytest.approx(fwd / 0.95, rel=1e-12)


def test_a_flash_forward_at_other_head_widths_follows_its_exponentials():
    # Per score a flash forward runs 2·(d_qk + d_v) = 4d matmul FLOPs on the tensor cores and one
    # exponential on the special-function unit, one after the other; with ρ tensor FLOPs per
    # exponential its throughput on the FLOPs is 4d/(4d + ρ) of the tensor cores', relative to
    # the head of 128 that attention_max_efficiency was measured at.
    h100 = replace(load_profile("h100-sxm"), sustained_compute_fraction=1.0, kernel_launch_s=0.0)
    assert h100.tensor_flops_per_exp == 256  # FlashAttention-3 paper: 989 TFLOP/s matmul, 3.9 TFLOP/s exp
    assert 989 / 3.9 == pytest.approx(256, rel=0.01)
    assert h100.attention_head_factor(4 * 64) == pytest.approx((256 / 512) / (512 / 768), rel=1e-12)  # 0.75
    assert h100.attention_head_factor(4 * 128) == 1.0
    assert h100.attention_head_factor(4 * 256) == pytest.approx((1024 / 1280) / (512 / 768), rel=1e-12)  # 1.2
    # against the FlashAttention-3 paper's H100 figures (FP16 forward, non-causal; head 64, 128,
    # 256 at 8k and 16k tokens: 496, 646, 746 and 497, 648, 756 TFLOP/s), within 5%: not fitted
    for d, measured in ((64, (496 / 646, 497 / 648)), (256, (746 / 646, 756 / 648))):
        for m in measured:
            assert h100.attention_head_factor(4 * d) == pytest.approx(m, rel=0.05)
    # the efficiency and an op's time carry it: the forward only, the backward as at 128
    fwd128 = h100.attention_efficiency(16384, 16384, 128, 16)
    assert h100.attention_efficiency(16384, 16384, 64, 32) == pytest.approx(fwd128 * 0.75, rel=1e-12)
    assert h100.attention_efficiency(16384, 16384, 64, 32, backward=True) == pytest.approx(
        h100.attention_efficiency(16384, 16384, 128, 16, backward=True), rel=1e-12)
    shape, flops = (16384, 16384, 64), 4 * 16384**2 * 64 * 32  # the same FLOPs as 16 heads of 128
    f64 = op_time(Op("attn.core", "F", "attention", flops, 0.0, 0.0, 0.0, shape, 32), h100)
    f128 = op_time(Op("attn.core", "F", "attention", flops, 0.0, 0.0, 0.0, (16384, 16384, 128), 16), h100)
    assert f64 / f128 == pytest.approx(1 / 0.75, rel=1e-12)
    # a profile without ρ prices every head as 128 wide
    assert replace(h100, tensor_flops_per_exp=None).attention_efficiency(16384, 16384, 64, 32) == pytest.approx(fwd128)


def test_blackwell_prices_the_exponential_twice_as_dear_as_hopper_and_blackwell_ultra_as_hopper():
    # B200/GB200: 8,192 BF16 tensor FLOPs per clock per SM over 16 exponentials (FlashAttention-4
    # paper); GB300 (Blackwell Ultra) doubles the exponential unit (NVIDIA's Blackwell Ultra softmax note)
    b200, gb200, gb300 = (load_profile(g) for g in ("b200", "gb200", "gb300"))
    assert b200.tensor_flops_per_exp == gb200.tensor_flops_per_exp == 8192 / 16
    assert gb300.tensor_flops_per_exp == gb200.tensor_flops_per_exp / 2
    assert gb200.attention_head_factor(4 * 64) == pytest.approx((256 / 768) / (512 / 1024), rel=1e-12)  # 2/3
    # MLA (DeepSeek-V3: query/key 192, value 128): 2·(192 + 128) = 640 FLOPs a score, priced from
    # the op's FLOPs, not from its 192-wide shape: 640/1152 over 512/1024 = 1.111 of a head of 128
    g = replace(gb200, sustained_compute_fraction=1.0, kernel_launch_s=0.0)
    s, bh = 4096, 128
    mla = Op("attn.core", "F", "attention", 2 * (192 + 128) * s * s * bh, 0.0, 0.0, 0.0, (s, s, 192), bh)
    plain = Op("attn.core", "F", "attention", 4 * 128 * s * s * bh, 0.0, 0.0, 0.0, (s, s, 128), bh)
    # 1.25 times the FLOPs at 1/1.111 of the time per FLOP: 1.25 x 0.9 = 1.125
    assert op_time(mla, g) / op_time(plain, g) == pytest.approx(1.25 * 0.5 / (640 / 1152), rel=1e-12)


def test_a_bad_tensor_flops_per_exp_is_a_one_line_error(tmp_path):
    good = load_profile("h100-sxm").to_dict()
    with pytest.raises(InputError) as info:
        load_profile(_write(tmp_path, dict(good, tensor_flops_per_exp=0)))
    one_line(info, "bad.json", "tensor_flops_per_exp", "0")
