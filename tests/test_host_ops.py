"""experiments/host_ops.py, the measurement behind ``sim.program.launch.HOST_LAUNCH_S``."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))

torch = pytest.importorskip("torch")


def test_the_counting_mode_counts_each_aten_op_once_and_views_apart():
    # Hand-counted: mm is one op, t() one view op, add one op, sum one op.
    import host_ops

    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with host_ops._counting_mode() as c:
        torch.mm(a, b.t()).add(a).sum()
    assert (c.ops, c.views) == (4, 1)


def test_the_moe_block_runs_forward_and_backward_and_its_op_count_is_fixed():
    # The block's ops do not depend on the data (balanced or not, each expert's chunk is one
    # GEMM pair): two runs dispatch the same ops, so a per-op figure is well defined.
    import host_ops

    args = host_ops._inputs()
    host_ops.moe_block(*args).backward()  # (the first backward creates the gradients; later ones add)
    counts = []
    for _ in range(2):
        with host_ops._counting_mode() as c:
            host_ops.moe_block(*args).backward()
        counts.append((c.ops, c.views))
    assert counts[0] == counts[1]
    ops, views = counts[0]
    # at least the per-expert work: two GEMMs forward and four backward per expert
    assert ops - views >= 6 * host_ops.E
    assert all(p.grad is not None for p in args)


def test_the_committed_measurement_is_what_the_launch_constant_says():
    # HOST_LAUNCH_S is the committed measurement's forward figure (median of its runs), not
    # a value of its own; and each run's figure is its best round over its launching ops.
    from sim.program.launch import HOST_LAUNCH_S

    data = json.loads((ROOT / "experiments" / "measured" / "host-ops-2026-12-06.json").read_text())
    assert HOST_LAUNCH_S == pytest.approx(data["median"]["forward"]["per_launching_op_s"], rel=5e-3)
    for run in data["runs"]:
        f = run["forward"]
        assert f["per_launching_op_s"] == pytest.approx(f["best_s"] / (f["aten_ops"] - f["view_ops"]), rel=1e-12)
