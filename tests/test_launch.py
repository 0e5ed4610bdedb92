"""Worker launching: a rank that fails is reported with its own error, never a hang, and
a rank that dies in library teardown after writing a complete result does not turn a
finished measurement into a failure (a gloo worker can abort with "terminate called
without an active exception" after its work is done)."""

import pickle
import time

import pytest

pytest.importorskip("torch")

from sim.calibrate import CalibrationError  # noqa: E402
from sim.calibrate.launch import _wait, run_workers  # noqa: E402


def _fail_on_rank_1(ctx, payload):
    if ctx.rank == 1:
        raise ValueError("rank one is broken on purpose")
    return ctx.rank


def _rank_and_world(ctx, payload):
    return (ctx.rank, ctx.world, payload)


def test_results_come_back_in_rank_order():
    assert run_workers(_rank_and_world, 2, "x") == [(0, 2, "x"), (1, 2, "x")]


def test_a_failing_rank_is_reported_with_its_error():
    t0 = time.monotonic()
    with pytest.raises(CalibrationError, match="rank 1 failed: ValueError: rank one is broken on purpose"):
        run_workers(_fail_on_rank_1, 2)
    assert time.monotonic() - t0 < 120  # reported, not left to a collective timeout


class _Exited:
    """A finished process as ``_wait`` sees one."""

    def __init__(self, exitcode):
        self.exitcode = exitcode

    def is_alive(self):
        return False

    def terminate(self):
        raise AssertionError("a finished process is never terminated")

    def join(self, timeout=None):
        pass


def _write(outdir, rank, ok):
    (outdir / f"rank{rank}.pkl").write_bytes(pickle.dumps({"ok": ok, "result": rank, "error": "e"}))


def test_a_crash_after_a_complete_result_is_not_a_failure(tmp_path):
    _write(tmp_path, 0, True)
    _write(tmp_path, 1, True)
    assert _wait([_Exited(0), _Exited(-6)], str(tmp_path), 10) is None


def test_a_crash_without_a_result_names_the_signal(tmp_path):
    _write(tmp_path, 0, True)
    assert _wait([_Exited(0), _Exited(-6)], str(tmp_path), 10) == "process 1 terminated with signal SIGABRT"
    assert _wait([_Exited(0), _Exited(3)], str(tmp_path), 10) == "process 1 terminated with exit code 3"
