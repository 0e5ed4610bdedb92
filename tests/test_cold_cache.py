"""Kernel microbenchmarks time each call on operands out of cache, and a CPU profile's
per-kernel cost is the framework's, measured in a tiny training step."""

import pytest

from sim.calibrate.microbench import MAX_SETS, Operands, cache_sizes
from sim.calibrate.reference_model import FRAMEWORK_SHAPE


def _ctx():
    torch = pytest.importorskip("torch")
    from sim.calibrate.launch import Context

    return torch, Context(0, 1, 0, torch.device("cpu"), "gloo", 1)


def test_cache_sizes_read_linux_sysfs(tmp_path):
    for idx, (kind, size) in enumerate([("Data", "48K"), ("Instruction", "32K"), ("Unified", "2048K"),
                                        ("Unified", "266240K"), ("Unified", "bogus")]):
        d = tmp_path / f"index{idx}"
        d.mkdir()
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
    # instruction caches and unreadable sizes are skipped; K is 1024 bytes
    assert cache_sizes(str(tmp_path)) == [48 * 1024, 2048 * 1024, 266240 * 1024]
    assert cache_sizes(str(tmp_path / "missing")) == []


def test_operand_sets_tile_the_pool_without_overlap():
    torch, ctx = _ctx()
    pool = Operands(ctx, torch.float32, nbytes=2**20)  # 262,144 elements
    shapes = ((64, 32), (32, 16))  # 2,048 + 512 elements a set
    sets = pool.sets(*shapes)
    assert len(sets) == 262_144 // 2_560  # as many whole sets as the pool holds
    base, end = pool.buf.data_ptr(), pool.buf.data_ptr() + pool.buf.numel() * 4
    starts = []
    for a, b in sets:
        assert a.shape == shapes[0] and b.shape == shapes[1] and a.is_contiguous() and b.is_contiguous()
        assert base <= a.data_ptr() and b.data_ptr() + b.numel() * 4 <= end
        assert b.data_ptr() == a.data_ptr() + a.numel() * 4
        starts.append(a.data_ptr())
    # consecutive sets are consecutive, never overlapping, slices of the pool
    assert all(y - x == 2_560 * 4 for x, y in zip(starts, starts[1:]))
    cyc = pool.cycle(*shapes)
    first = [next(cyc)[0].data_ptr() for _ in range(len(sets) + 1)]
    assert first[0] == first[-1] and len(set(first[:-1])) == len(sets)  # round and round


def test_operand_sets_of_tiny_or_huge_kernels():
    torch, ctx = _ctx()
    pool = Operands(ctx, torch.float32, nbytes=2**20)
    assert len(pool.sets((4,))) == min(MAX_SETS, 262_144 // 4)
    (big,) = pool.sets((600, 600))  # larger than the pool: one set of its own tensors
    assert big[0].shape == (600, 600) and big[0].untyped_storage().data_ptr() != pool.buf.data_ptr()


def test_framework_step_counts_the_simulators_kernels():
    torch, ctx = _ctx()
    from sim.calibrate.reference_model import bench_framework

    fw = bench_framework(ctx, repeats=1, warmup=1)
    # Counted as validate simulates the reference: 2 layers of 24 kernels (10 forward, 10
    # input-gradient, 4 weight-gradient) and their 4 gradient-accumulation passes; the
    # embedding's lookup, and its gradient's zero-fill, scatter-add and accumulation; the
    # head's norm, logits and log-softmax, then nll_loss's zero-filled gradient, the
    # log-softmax, logit (input and weight) and norm gradients, and the logit weight's
    # accumulation pass
    assert FRAMEWORK_SHAPE["num_layers"] == 2 and fw["kernels"] == 2 * (24 + 4) + 4 + 9
    assert fw["step_s"] > 0 and fw["per_kernel_s"] == pytest.approx(fw["step_s"] / fw["kernels"])


def test_measure_many_samples_round_robin():
    # Every round takes one sample of each callable, so the calls interleave a, b, a, b
    # after each one's warm-up and sizing call.
    torch, ctx = _ctx()
    from sim.calibrate.launch import measure_many

    calls = []

    def make(tag):
        def fn():
            calls.append(tag)
            __import__("time").sleep(1e-3)  # longer than the 0.2 ms sample: one call a sample
        return fn

    times = measure_many(ctx, [make("a"), make("b")], warmup=1, repeats=3)
    assert calls == ["a", "a", "b", "b"] + ["a", "b"] * 3
    assert len(times) == 2 and all(t >= 1e-3 for t in times)


def test_measure_many_goes_on_for_min_total_s():
    torch, ctx = _ctx()
    import time

    from sim.calibrate.launch import measure_many

    calls = []

    def fn():
        calls.append(1)
        time.sleep(1e-3)

    t0 = time.perf_counter()
    measure_many(ctx, [fn], warmup=1, repeats=2, min_total_s=0.05)
    # warm-up and sizing, then rounds of one 1 ms sample until 50 ms have passed
    assert time.perf_counter() - t0 >= 0.05 and len(calls) - 2 >= 2 and len(calls) - 2 <= 60
