"""Python's garbage collector: library calls leave it as they find it; the ``trainsim``
command, and a caller that opts in (``sim.gc_tuning``), pause it around each simulation."""

import gc
import io
from contextlib import contextmanager, redirect_stdout

import pytest

import sim
from sim import gc_tuning
from sim.cli import main
from sim.engine.core import simulate
from sim.inputs.topology_build import load_topology
from sim.program.actions import Action, Program

TINY = {"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 8192, "seq_length": 512}
FLAGS = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--vocab-size", "8192",
         "--seq-length", "512", "--gpu", "h100-sxm", "--gpus", "8", "--tensor-model-parallel-size", "2",
         "--pipeline-model-parallel-size", "2"]


def _state():
    return gc.isenabled(), gc.get_freeze_count(), gc.get_threshold()


@contextmanager
def _caller(state: str):
    """The collector as a caller may have set it up: as Python starts, off, or with its
    own thresholds and objects it froze."""
    was = gc.isenabled(), gc.get_threshold()
    gc.unfreeze()
    try:
        if state == "off":
            gc.disable()
        elif state == "tuned by the caller":
            gc.set_threshold(50_000, 20, 20)
            gc.freeze()
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*was[1])
        (gc.enable if was[0] else gc.disable)()


def _engine_run():
    acts = {r: [Action.new(f"c{i}", stream="compute", duration_s=1e-3, deps=(f"c{i - 1}",) if i else ())
                for i in range(50)] for r in range(4)}
    return simulate(Program(acts), load_topology("dgx-h100", nodes=1))


@pytest.mark.parametrize("state", ["as Python starts", "off", "tuned by the caller"])
def test_library_simulations_leave_the_collector_as_they_find_it(state):
    assert not gc_tuning.active()
    with _caller(state):
        before = _state()
        r = sim.run(model=TINY, gpu="h100-sxm", gpus=8, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
        assert r.summary["iteration_time_s"] > 0
        assert _state() == before
        assert _engine_run().end_s > 0
        assert _state() == before


def _collector_during_simulations(monkeypatch) -> list[bool]:
    """Whether the collector was on when each simulation's engine started."""
    import sim.session

    seen = []

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return simulate(*args, **kwargs)

    monkeypatch.setattr(sim.session, "simulate", watched)
    return seen


def test_the_command_pauses_the_collector_around_each_simulation_and_library_calls_do_not(monkeypatch):
    seen = _collector_during_simulations(monkeypatch)
    gc.unfreeze()
    before = _state()
    with redirect_stdout(io.StringIO()):
        assert main(["run", *FLAGS, "--json"]) == 0
    assert seen == [False]  # the trainsim command: paused
    # and on again once the command is done, with its thresholds (what was alive stays
    # frozen: the process ends next)
    assert gc.isenabled() and gc.get_threshold() == before[2] and not gc_tuning.active()
    gc.unfreeze()
    sim.run(model=TINY, gpu="h100-sxm", gpus=8, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    assert seen == [False, True]  # the Python API: left alone


def test_a_caller_opts_in_for_a_block(monkeypatch):
    seen = _collector_during_simulations(monkeypatch)
    gc.unfreeze()
    before = _state()
    with gc_tuning.tuned():
        assert gc_tuning.active()
        for _ in range(2):
            sim.run(model=TINY, gpu="h100-sxm", gpus=8, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
            assert gc.isenabled() and gc.get_freeze_count() > 0  # on between runs; what was alive, frozen
        with gc_tuning.tuned():  # (nested: the outer block still holds)
            pass
        assert gc_tuning.active()
    assert seen == [False, False]
    assert not gc_tuning.active() and _state() == before


def test_a_pause_leaves_a_collector_the_caller_turned_off_off():
    with _caller("off"), gc_tuning.tuned():
        assert _engine_run().end_s > 0
        assert not gc.isenabled() and gc.get_freeze_count() == 0
