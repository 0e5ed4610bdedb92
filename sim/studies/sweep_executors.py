"""Where a sweep's points run: local worker processes, a Dask cluster, or this process.

``sim.studies.sweep.Runner`` hands points to a ``concurrent.futures`` executor; this
module makes and ends those executors, and keeps Ctrl-C for the sweep alone:

- **Local worker processes** (``local_pool``): a ``ProcessPoolExecutor`` of spawned
  processes, each tied to this one (``sim.workers``: it dies when this process dies,
  however it dies). A worker may start whenever a point is submitted, so submission happens
  with SIGINT blocked (``sigint_blocked``): the worker inherits the blocked signal, and
  its ``init_worker`` then ignores it, so Ctrl-C on the terminal never reaches it; the
  sweep's own process gets a Ctrl-C that came in meanwhile as soon as the block ends.
  ``shutdown`` with ``kill`` cancels queued points and terminates the workers, so an
  interrupted sweep stops quickly.
- **Start-up failures.** A spawned worker imports the main module before it can take a
  point, so a script that starts a sweep without an ``if __name__ == "__main__":``
  guard, or whose import fails, kills every worker. Importing this module in such a
  worker installs a hook that appends the worker's exception to a ``StartupLog`` (a
  temporary file named in ``STARTUP_ENV``, which workers inherit), and
  ``why_workers_died`` turns what it says into the likely cause.
- **Dask** (``dask_client``): a scheduler at an address, or ``"local"`` for a
  ``LocalCluster`` bound to loopback whose workers start with SIGINT ignored (they start
  on Dask's own thread, where blocking the signal here would not reach them) and are tied
  to this process (``sim.workers.dask_setup``, a preload); a user's own scheduler and its
  workers are left alone.
- **In this process** (``InlineExecutor``, ``workers=0``): each point runs when it is
  submitted.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import signal
import sys
import tempfile

from sim.errors import InputError, require
from sim.workers import DASK_PARENT_ENV, end_pool, process_pool, quiet_resource_tracker

STARTUP_ENV = "TRAINSIM_SWEEP_STARTUP_LOG"
"""Names the file where a local worker whose start-up fails writes its exception."""


def _brief(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:600] if text else type(exc).__name__


def _report_startup_failure() -> None:
    path = os.environ.get(STARTUP_ENV)
    if not path or not getattr(multiprocessing.current_process(), "_inheriting", False):
        return  # not a local sweep worker still importing the main module
    previous = sys.excepthook

    def hook(kind, exc, tb):
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as fh:
            fh.write(_brief(exc) + "\n")
        previous(kind, exc, tb)

    sys.excepthook = hook


_report_startup_failure()


class StartupLog:
    """The temporary file where local workers that fail to start write why, named in the
    environment (``STARTUP_ENV``) for as long as it is open."""

    def __init__(self):
        fd, self.path = tempfile.mkstemp(prefix="trainsim-sweep-start-", suffix=".log")
        os.close(fd)
        self._env_before = os.environ.get(STARTUP_ENV)
        os.environ[STARTUP_ENV] = self.path  # inherited by the workers

    def lines(self) -> list[str]:
        """What the workers wrote, one exception a line."""
        with contextlib.suppress(OSError):
            with open(self.path, encoding="utf-8") as fh:
                return [x for x in fh.read().splitlines() if x.strip()]
        return []

    def close(self) -> None:
        """Put the environment back and delete the file."""
        if os.environ.get(STARTUP_ENV) == self.path:
            if self._env_before is None:
                os.environ.pop(STARTUP_ENV, None)
            else:
                os.environ[STARTUP_ENV] = self._env_before
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def why_workers_died(said: list[str]) -> str:
    """The likely cause of local workers dying while starting, from what they said."""
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    guard = (f"spawned workers import the main module{f' ({main})' if main else ''} again, so a script "
             "that starts a sweep must do it under `if __name__ == \"__main__\":`")
    if said:
        why = f"the worker said: {said[-1]}"
        if "bootstrapping phase" in said[-1]:
            why += f"; likely cause: {guard}"
        return why
    return (f"likely cause: {guard}, or the worker could not import what the sweep's function needs "
            "(its traceback is on stderr above)")


class TimeBudgetSpent(Exception):
    """The run's time budget (``Runner.deadline``, ``trainsim search --max-time``) is spent."""


# ---------------------------------------------------------------- SIGINT
def init_worker(started) -> None:
    """A local worker's start (after ``sim.workers`` tied it to the sweep's process and left
    Ctrl-C to the sweep): the sweep learns that this worker got through start-up
    (``started``, shared memory). The worker is trainsim's own process: its simulations
    pause the collector (``sim.gc_tuning``)."""
    from sim.gc_tuning import tune_process

    tune_process()
    started.value = 1


@contextlib.contextmanager
def sigint_ignored():
    """Ignore SIGINT meanwhile (processes started meanwhile keep ignoring it: Python
    installs its own handler only over the default)."""
    try:
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def sigint_blocked():
    """Hold SIGINT back while a local worker may be started: the worker inherits the
    blocked signal (so Ctrl-C on the terminal never reaches it), and this process gets a
    Ctrl-C that came in meanwhile as soon as the block ends (nothing is lost)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# ---------------------------------------------------------------- executors
def local_pool(workers: int):
    """``workers`` spawned worker processes, tied to this one (``sim.workers``), and the
    shared flag the first of them sets once through start-up (``init_worker``)."""
    import multiprocessing

    started = multiprocessing.get_context("spawn").RawValue("b", 0)
    return process_pool(workers, "spawn", initializer=init_worker, initargs=(started,)), started


def exit_codes(pool) -> list[int]:
    """The exit codes of a local pool's worker processes that have ended."""
    return sorted({p.exitcode for p in (getattr(pool, "_processes", None) or {}).values()
                   if p.exitcode is not None})


def dask_client(address: str, workers: int):
    """``(client, cluster)`` for ``--dask``: ``"local"`` starts a ``LocalCluster`` of
    ``workers`` single-threaded processes (``cluster`` is it), an address such as
    ``tcp://HOST:8786`` connects to that scheduler (``cluster`` is None)."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise InputError("--dask: needs dask[distributed]; install it with pip install 'trainsim[sweep]'") from None
    import logging

    if address == "local":
        # Workers started while SIGINT is ignored keep ignoring it, so Ctrl-C stops this
        # process alone, cleanly (a Ctrl-C during these few seconds of start-up is dropped).
        with sigint_ignored():
            # Bound to loopback: a scheduler runs whatever pickled task it is sent,
            # so it must not listen where other machines can reach it.
            # Its workers are this process's children, tied to it (sim.workers.dask_setup).
            os.environ[DASK_PARENT_ENV] = str(os.getpid())
            quiet_resource_tracker()
            cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=True,
                                   host="127.0.0.1", dashboard_address=None, silence_logs=logging.ERROR,
                                   preload=["sim.workers"])
        return Client(cluster), cluster
    require(address.startswith(("tcp://", "tls://", "ucx://", "inproc://")), "--dask", address,
            "expected 'local' or a scheduler address such as tcp://HOST:8786")
    try:
        return Client(address, timeout=30), None
    except OSError as exc:
        raise InputError(f"--dask: got {address!r}; cannot reach the scheduler ({exc})") from None


class InlineExecutor(cf.Executor):
    """Runs each call at submit time, in this process (``workers=0``)."""

    def submit(self, fn, *args, **kwargs):
        f = cf.Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            f.set_exception(exc)
        return f


def shutdown(pool, kill: bool) -> None:
    """End an executor: wait for its running points, or with ``kill`` cancel the queued
    ones and terminate a local pool's worker processes (``sim.workers.end_pool``)."""
    if isinstance(pool, cf.ProcessPoolExecutor):
        end_pool(pool, kill)
    elif pool is not None and not isinstance(pool, InlineExecutor):
        pool.shutdown(wait=not kill)
