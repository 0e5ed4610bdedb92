"""Worker processes that end with the process that started them.

Every process pool trainsim starts (``fit --jobs``, the local workers of ``search`` and
``sweep``, the experiments' pools, the Dask workers of ``--dask local``, the calibration's
ranks) is tied to its parent here, so that a parent killed by a time limit, a notebook
restart or ``kill -9`` leaves no worker eating the machine:

- ``tie_to_parent(parent_pid)``, run first in every worker: on Linux
  ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (through ``ctypes``), so the kernel kills the worker
  the moment its parent dies, however it dies; and everywhere a daemon *watchdog* thread that
  sees ``os.getppid()`` change (the parent died and the worker was handed to another) and
  ends the worker (``os._exit``). The watchdog also covers a parent that died before the
  worker reached ``prctl``. (The kernel sends the signal when the *thread* that started the
  worker ends: trainsim starts workers from its main thread, or, for Dask, from the
  cluster's event-loop thread, which lives as long as the cluster.) Dask's workers are
  tied by ``dask_setup``, a preload the ``LocalCluster`` runs in each.
- ``process_pool(workers, ...)``: a ``ProcessPoolExecutor`` whose workers are tied so
  (``_start_worker``), ignore SIGINT (Ctrl-C on a terminal reaches the whole process group;
  the parent alone decides what it means) and take SIGTERM at its default (a forked worker
  would otherwise inherit the parent's handler), then run the pool's own initializer.
- ``end_pool(pool, kill)``: wait for the running calls, or with ``kill`` cancel the queued
  ones and terminate the workers; ``ending_pool`` does that on the way out of a ``with``
  block, killing on any exception (a Ctrl-C included).
- ``sigterm_as_interrupt()``: the command line's SIGTERM raises ``Terminated`` (a
  ``KeyboardInterrupt``) in the main thread, so everything that cleans up on Ctrl-C (pools
  ended, results kept, the best so far printed) cleans up on SIGTERM too, and the pools'
  semaphores are released rather than reported leaked.

SIGKILL cannot be caught: the workers die with the parent (above), and Python's resource
tracker (a process of its own, which ends once the workers are gone) unlinks the pools'
semaphores (``quiet_resource_tracker`` starts it without its warning that they were
"leaked": it is the one cleaning them up); output files are written whole or not at all
(``sim.fileio``), and results logs and caches are appended a line at a time, a torn last
line being dropped when read.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
import signal
import sys
import threading
import time

WATCH_S = 0.5
"""How often a worker's watchdog looks at its parent, in seconds."""

_PR_SET_PDEATHSIG = 1


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C is (``sigterm_as_interrupt``)."""


def _exit_now() -> None:
    os._exit(1)


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCH_S)
    _exit_now()


def tie_to_parent(parent_pid: int) -> None:
    """End this process when ``parent_pid`` (its parent) ends: the kernel's parent-death
    signal on Linux, and a watchdog thread everywhere (see the module doc)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        _exit_now()
    threading.Thread(target=_watch, args=(parent_pid,), name="trainsim-parent-watchdog", daemon=True).start()


def _start_worker(parent_pid: int, initializer, initargs) -> None:
    """A pool worker's start: tied to its parent, Ctrl-C left to the parent, SIGTERM at its
    default, then the pool's own initializer."""
    tie_to_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if initializer is not None:
        initializer(*initargs)


TRACKER_FILTER = "ignore:resource_tracker:UserWarning"
"""The warning filter Python's resource tracker runs under when a pool of trainsim starts it."""


def quiet_resource_tracker() -> None:
    """Start Python's resource tracker (if it is not running yet) without its warning about
    semaphores "leaked": it gives it only when this process died without ending its pools,
    which nothing can prevent under SIGKILL, and it then unlinks them itself (the tests check
    that nothing is left in /dev/shm). Spawned pools need it; forked ones unlink their
    semaphores at once and never start it."""
    from multiprocessing import resource_tracker

    added = TRACKER_FILTER not in sys.warnoptions
    if added:
        sys.warnoptions.append(TRACKER_FILTER)  # read only when the tracker's command line is built
    try:
        resource_tracker.ensure_running()
    finally:
        if added:
            sys.warnoptions.remove(TRACKER_FILTER)


def process_pool(workers: int, method: str = "spawn", initializer=None, initargs: tuple = ()):
    """A ``ProcessPoolExecutor`` of ``workers`` processes started by ``method`` (spawn or
    fork), each tied to this process (``_start_worker``)."""
    import multiprocessing

    if method != "fork":
        quiet_resource_tracker()
    ctx = multiprocessing.get_context(method)
    return cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker,
                                  initargs=(os.getpid(), initializer, tuple(initargs)))


MANAGER_GONE_S = 10.0
"""How long a killed pool's manager thread is waited for (it ends once it sees the workers gone)."""


def worker_pids(pool) -> list[int]:
    """The process ids of a local pool's workers (started so far)."""
    return sorted((getattr(pool, "_processes", None) or {}).keys())


def end_pool(pool, kill: bool) -> None:
    """End a ``ProcessPoolExecutor``: cancel the queued calls and wait for the running ones,
    or with ``kill`` terminate its workers (waiting a few seconds for each to go) and leave
    what was queued or running to fail with the broken pool.

    The pool's manager thread fails every call it still holds with ``BrokenProcessPool``
    once the workers are gone; a call whose future was cancelled meanwhile (``Executor.map``
    cancels what is left when an exception, a Ctrl-C, leaves it) makes that thread raise
    ``InvalidStateError`` and print its traceback (``concurrent.futures.process``, Python
    3.11). So those calls are dropped first, the workers go next, and the pool shuts down
    without cancelling anything.

    The pool's manager thread is then waited for (a few seconds): it closes the pool's wakeup
    pipe as it ends, and if it were still ending when the interpreter exits, the exit hook
    of ``concurrent.futures.process`` could write to that pipe as it closes and print a
    ``Bad file descriptor`` traceback (a race seen under load, Python 3.11)."""
    if pool is None:
        return
    if not kill:
        pool.shutdown(wait=True, cancel_futures=True)
        return
    held = getattr(pool, "_pending_work_items", None)
    if held is not None:
        for work_id, item in list(held.items()):
            if item.future.done():
                held.pop(work_id, None)
    procs = list((getattr(pool, "_processes", None) or {}).values())
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(1)
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False)
    if manager is not None and manager.is_alive():
        manager.join(MANAGER_GONE_S)


@contextlib.contextmanager
def ending_pool(pool):
    """``with ending_pool(process_pool(...)) as pool:``: on the way out the pool ends,
    waiting for its calls, or killed when an exception (a Ctrl-C, a SIGTERM) leaves."""
    try:
        yield pool
    except BaseException:
        end_pool(pool, kill=True)
        raise
    end_pool(pool, kill=False)


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Meanwhile SIGTERM raises ``Terminated`` in the main thread (from another thread, or
    where SIGTERM is ignored, nothing changes)."""
    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
            yield
            return
        old = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


DASK_PARENT_ENV = "TRAINSIM_DASK_PARENT"
"""Names the process a ``LocalCluster``'s workers are tied to (``dask_setup``)."""


def dask_setup(worker=None) -> None:
    """Dask's preload hook (``LocalCluster(preload=["sim.workers"])``): each worker of a
    cluster trainsim started, restarted ones included, is tied to the process named in
    ``DASK_PARENT_ENV``, the one that runs the cluster's nannies and so is its parent."""
    parent = os.environ.get(DASK_PARENT_ENV)
    if parent and parent.isdigit():
        tie_to_parent(int(parent))
