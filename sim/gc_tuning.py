"""Python's garbage collector tuned for simulations, where a process opts in.

Building and running a program allocates millions of small objects and almost no
reference cycles; with the cyclic collector on, its full passes walk every one of them
again and again. The remedy is to pause the collector while a simulation runs and to
freeze (``gc.freeze``) what is still alive afterwards, so that later passes skip it.
That changes the interpreter's state for the whole process, so library code never does
it on its own: ``sim.api``, ``sim.session.simulate_training`` and
``sim.engine.core.simulate`` leave the collector as they find it (enabled or not, its
thresholds, its frozen objects) unless the process has opted in:

- ``tuned()``, a context manager: simulations run inside the block pause the collector.
  The ``trainsim`` command (``sim.cli.main``) wraps each command in it; a Python caller
  that runs many simulations may do the same::

      from sim import api, gc_tuning
      with gc_tuning.tuned():
          results = [api.run(...) for ...]

  On the way out what the simulations froze is unfrozen (``unfreeze_on_exit``; the
  command leaves it frozen, as its process ends next and its last collection would walk
  it all), and the collector is as enabled as it was. Inside the block it owns
  ``gc.freeze``: what the caller froze before is unfrozen by the first simulation.
- ``tune_process()``: the same for the rest of the process, for processes trainsim
  starts and owns (its spawned sweep and fit workers, benchmark scripts).

Library code marks each simulation with ``simulation_pause()``, which does nothing unless
one of the two is in effect. While paused the collector is off; on the way out the
objects still alive are frozen, and reference counting still frees them as usual. On the
way in, what an earlier simulation froze is unfrozen, and collected once more than
``COLLECT_FROZEN`` objects were frozen since the last collection: a process that
simulates many plans (``trainsim fit``, a search worker) must let the collector free the
cycles runs leave, or they stay for good (7 MB per small run, gigabytes over a fit);
collecting after every small run would cost more than the runs (the test suite ran 1.5x
slower; 50 ms a point of a small search). A pause inside a pause does nothing.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager, nullcontext

COLLECT_FROZEN = 2_000_000
"""Objects frozen by earlier simulations (as ``simulation_pause`` counts them) above which
it collects them (about 200 MB; one large run, or a few dozen small ones)."""

_process_wide = False
"""``tune_process()`` was called: every simulation of this process pauses the collector."""

_open_blocks = 0
"""``tuned()`` blocks open in this process."""

_frozen_since_collect = 0
"""What ``simulation_pause`` froze since its last collection: the sum, over the
simulations, of the collector's count of objects allocated and not yet freed while it was
off (an upper bound on what a run leaves in reference cycles; ``gc.get_freeze_count``
walks the whole frozen list, 20 ms a call in a process that holds a million objects)."""


def active() -> bool:
    """Whether simulations pause the collector here: in a ``tuned()`` block, or after
    ``tune_process()``."""
    return _process_wide or _open_blocks > 0


@contextmanager
def tuned(*, unfreeze_on_exit: bool = True):
    """Simulations run inside the block pause the collector (the module's doc). On the way
    out, with ``unfreeze_on_exit``, the objects they froze go back to the collector
    (``gc.unfreeze``), once the outermost block ends."""
    global _open_blocks, _frozen_since_collect
    _open_blocks += 1
    try:
        yield
    finally:
        _open_blocks -= 1
        if not active() and unfreeze_on_exit:
            gc.unfreeze()
            _frozen_since_collect = 0


def tune_process() -> None:
    """Every simulation of this process pauses the collector from now on: for a process
    trainsim starts and owns (a worker, a benchmark's child), never for library code."""
    global _process_wide
    _process_wide = True


def simulation_pause():
    """The collector paused for one simulation where the process opted in (``tuned``,
    ``tune_process``); otherwise a context that changes nothing."""
    return _paused() if active() else nullcontext()


@contextmanager
def _paused():
    global _frozen_since_collect
    was = gc.isenabled()
    if was:
        gc.unfreeze()
        if _frozen_since_collect > COLLECT_FROZEN:
            gc.collect()
            _frozen_since_collect = 0
    gc.disable()
    try:
        yield
    finally:
        if was:
            _frozen_since_collect += gc.get_count()[0]
            gc.freeze()
            gc.enable()
