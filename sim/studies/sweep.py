"""Running many simulations: local worker processes or a Dask cluster, resumable.

A sweep is a list of *points*, each a ``ParallelPlan`` to simulate in one shared
``Context`` (model, hardware profile, topology). ``evaluate`` simulates one point in a
worker and returns a *record*, a plain JSON-able dict::

    {"key": plan key, "plan": {plan fields}, "status": "ok" | "error" | "crashed",
     "error": null | "InputError: ...", "summary": trainsim run --json's object | null}

``Runner`` hands points to an executor and gathers the records:

- **Executors.** Local worker processes (``concurrent.futures.ProcessPoolExecutor``,
  spawned, ``workers`` of them, default the core count; 0 runs in this process), or a
  Dask cluster through ``distributed.Client(...).get_executor()`` (``dask="tcp://HOST:8786"``,
  or ``"local"`` to start a ``LocalCluster`` of ``workers`` single-threaded processes).
  Records depend only on the point, so they are identical whichever executor ran them;
  callers sort them by key.
- **Results as they finish.** Each record is appended to a JSON Lines file (one
  ``write`` of a whole line, flushed) the moment it arrives, so a sweep interrupted by
  Ctrl-C, a kill or a crash leaves a valid file; ``resume=True`` reads it back (dropping
  a torn last line) and skips the points already there.
- **Failures.** A point whose simulation raises is recorded with ``status: "error"`` and
  the exception, and the sweep goes on. When a local worker process dies, the points
  that were running are retried one at a time on a fresh pool, so the one that killed it
  is found; after ``max_retries`` retries it is recorded as ``"crashed"``. Workers that
  die while *starting* (before any of them could take a plan: a spawned worker first
  imports the main module, so a script that starts a sweep without an
  ``if __name__ == "__main__":`` guard, or whose import fails, kills every worker) are not
  a plan's fault: after two fresh pools in a row die that way the sweep stops at once with
  a ``WorkerStartError`` naming the likely cause and the worker's own exception, and
  records nothing for the plans that never ran (the results file stays valid). (Dask's
  scheduler retries tasks of a dead worker elsewhere by itself; a task that kills its
  workers too often comes back as ``KilledWorker`` and is recorded as ``"crashed"``. A
  task the cluster cancels, as it does when a worker dies, is submitted again, up to
  ``max_retries`` times, with the context scattered to the workers again: the dead worker
  may have held its only copy.)
- **Progress.** On a terminal, a bar with the count, rate and ETA on stderr; silent
  otherwise.

Only a bounded number of points is in flight at a time (twice the workers), so Ctrl-C
stops quickly: queued points are cancelled and worker processes are terminated. Workers
never see the terminal's Ctrl-C themselves (local ones start with SIGINT blocked, Dask
LocalCluster ones with it ignored), so only this process decides.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import traceback
from collections import deque
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from pathlib import Path

import networkx as nx

from sim.errors import InputError, require
from sim.inputs.hardware import HardwareProfile
from sim.inputs.model import ModelSpec
from sim.inputs.plan import ParallelPlan
from sim.progress import ProgressBar as Progress
from sim.studies.search import plan_key
from sim.studies.sweep_results import ResultsLog

RESULTS_FILE = "results.jsonl"


class WorkerStartError(InputError):
    """Local worker processes die while starting, before they can run any plan."""


# A spawned worker imports the main module before it can take work; if sim.studies.sweep is
# imported there (the script imports it) and that import fails, the worker also writes
# its exception to the file the sweep named in this variable, so the sweep can say why.
_STARTUP_ENV = "TRAINSIM_SWEEP_STARTUP_LOG"


def _brief(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:600] if text else type(exc).__name__


def _report_startup_failure() -> None:
    path = os.environ.get(_STARTUP_ENV)
    if not path or not getattr(multiprocessing.current_process(), "_inheriting", False):
        return  # not a local sweep worker still importing the main module
    previous = sys.excepthook

    def hook(kind, exc, tb):
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as fh:
            fh.write(_brief(exc) + "\n")
        previous(kind, exc, tb)

    sys.excepthook = hook


_report_startup_failure()


@dataclass(frozen=True, eq=False)
class Context:
    """What every point of a sweep shares: the model, the GPU profile and the cluster.

    The topology travels as its networkx graph and name (a ``Topology`` keeps caches
    that do not pickle); workers rebuild it once per context and keep it."""

    model: ModelSpec
    profile: HardwareProfile
    graph: nx.Graph
    topology_name: str
    token: str
    """Identifies the context inside a worker's cache (set by ``make_context``)."""

    def topology(self):
        return _topology(self)


def make_context(model: ModelSpec, profile: HardwareProfile, topology) -> Context:
    """A ``Context`` for a built ``sim.inputs.topology.Topology``."""
    token = f"{os.getpid()}-{id(topology)}-{time.time_ns()}"
    ctx = Context(model, profile, topology.graph, topology.name, token)
    _TOPOLOGIES[token] = topology
    return ctx


_TOPOLOGIES: dict = {}


def _topology(ctx: Context):
    topo = _TOPOLOGIES.get(ctx.token)
    if topo is None:
        from sim.inputs.topology import Topology

        if len(_TOPOLOGIES) > 8:
            _TOPOLOGIES.clear()
        topo = _TOPOLOGIES[ctx.token] = Topology(ctx.graph, ctx.topology_name)
    return topo


def evaluate(ctx: Context, plan: ParallelPlan) -> dict:
    """Simulate one point and return its record (never raises for a bad plan)."""
    from sim.session import summarize
    from sim.session import simulate_training

    rec = {"key": plan_key(plan), "plan": asdict(plan), "status": "ok", "error": None, "summary": None}
    try:
        rec["summary"] = summarize(simulate_training(ctx.model, plan, ctx.profile, ctx.topology()))
    except Exception as exc:  # recorded, and the sweep goes on
        rec["status"] = "error"
        rec["error"] = _one_line(exc)
    return rec


def _one_line(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" (at {Path(where[0].filename).name}:{where[0].lineno})" if where else ""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{at}"[:500]


# ---------------------------------------------------------------- executors
def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _init_worker(started) -> None:
    """A local worker's start: Ctrl-C is for the sweep to handle, and the sweep learns
    that this worker got through start-up (``started``, shared memory)."""
    _ignore_sigint()
    started.value = 1


@contextlib.contextmanager
def _sigint_ignored():
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
def _sigint_blocked():
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


class _Inline(cf.Executor):
    """Runs each call at submit time, in this process (``workers=0``)."""

    def submit(self, fn, *args, **kwargs):
        f = cf.Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            f.set_exception(exc)
        return f


class Runner:
    """Runs points on local processes or Dask and appends their records to a ``ResultsLog``.

    Use as a context manager; ``run(ctx, plans)`` may be called several times (the search
    calls it once per wave) and reuses the same workers."""

    def __init__(self, workers: int | None = None, dask: str | None = None, log: ResultsLog | None = None,
                 progress: bool | None = None, max_retries: int = 2, fn=evaluate):
        if workers is not None:
            require(isinstance(workers, int) and workers >= 0, "--workers", workers,
                    "expected an integer >= 0 (0: run in this process)")
        require(isinstance(max_retries, int) and max_retries >= 0, "max_retries", max_retries,
                "expected an integer >= 0")
        self.dask, self.fn, self.max_retries = dask, fn, max_retries
        self.workers = workers if workers is not None else (os.cpu_count() or 1)
        if dask is None and workers is None:
            self.workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else self.workers
        self.log = log or ResultsLog(None)
        self.progress_enabled = progress
        self.progress: Progress | None = None
        self._pool = self._client = self._cluster = None
        self.retried = 0
        self._started = None  # set to 1 by a local pool's first worker through start-up
        self._startup_log: str | None = None
        self._env_before: str | None = None
        self.startup_failures = 0
        """Local pools in a row whose workers all died before finishing start-up."""

    # -- executor lifecycle
    def __enter__(self):
        self._start()
        return self

    def __exit__(self, *exc):
        self.close(kill=exc[0] is not None)
        return False

    def _start(self) -> None:
        if self.dask is not None:
            self._pool = self._dask_executor()
        elif self.workers == 0:
            self._pool = _Inline()
        else:
            mp = multiprocessing.get_context("spawn")
            if self._startup_log is None:
                fd, self._startup_log = tempfile.mkstemp(prefix="trainsim-sweep-start-", suffix=".log")
                os.close(fd)
                self._env_before = os.environ.get(_STARTUP_ENV)
                os.environ[_STARTUP_ENV] = self._startup_log  # inherited by the workers
            self._started = mp.RawValue("b", 0)
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp, initializer=_init_worker,
                                                initargs=(self._started,))

    def _dask_executor(self):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise InputError("--dask: needs dask[distributed]; install it with pip install 'trainsim[sweep]'") from None
        import logging

        if self.dask == "local":
            # Workers started while SIGINT is ignored keep ignoring it (Python installs its
            # handler only over the default), so Ctrl-C stops this process alone, cleanly.
            # (They start on Dask's own thread, so blocking the signal here would not reach
            # them; a Ctrl-C during these few seconds of start-up is dropped.)
            with _sigint_ignored():
                # Bound to loopback: a scheduler runs whatever pickled task it is sent,
                # so it must not listen where other machines can reach it.
                self._cluster = LocalCluster(n_workers=max(1, self.workers), threads_per_worker=1,
                                             processes=True, host="127.0.0.1", dashboard_address=None,
                                             silence_logs=logging.ERROR)
            self._client = Client(self._cluster)
        else:
            require(self.dask.startswith(("tcp://", "tls://", "ucx://", "inproc://")), "--dask", self.dask,
                    "expected 'local' or a scheduler address such as tcp://HOST:8786")
            try:
                self._client = Client(self.dask, timeout=30)
            except OSError as exc:
                raise InputError(f"--dask: got {self.dask!r}; cannot reach the scheduler ({exc})") from None
            self.workers = max(1, sum(self._client.nthreads().values()))
        return self._client.get_executor(pure=False)

    def _restart_pool(self) -> None:
        self.close(kill=True, keep_dask=True)
        self._start()

    def close(self, kill: bool = False, keep_dask: bool = False) -> None:
        pool = self._pool
        self._pool = None
        if isinstance(pool, cf.ProcessPoolExecutor):
            procs = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=not kill, cancel_futures=True)
            if kill:
                for p in procs:
                    if p.is_alive():
                        p.terminate()
                for p in procs:
                    p.join(5)
        elif pool is not None and not isinstance(pool, _Inline):
            pool.shutdown(wait=not kill)
        if not keep_dask:
            if self._startup_log is not None:
                if os.environ.get(_STARTUP_ENV) == self._startup_log:
                    if self._env_before is None:
                        os.environ.pop(_STARTUP_ENV, None)
                    else:
                        os.environ[_STARTUP_ENV] = self._env_before
                with contextlib.suppress(OSError):
                    os.unlink(self._startup_log)
                self._startup_log = None
            if self._client is not None:
                self._client.close()
                self._client = None
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None
        self.log.close()

    # -- running
    def run(self, ctx: Context, plans: list[ParallelPlan], label: str = "") -> list[dict]:
        """Records for ``plans`` in the same order: from the results file where finished
        there, else simulated (and appended as they finish). ``label`` prefixes the
        progress bar."""
        keys = [plan_key(p) for p in plans]
        todo = [(k, p) for k, p in zip(keys, plans) if k not in self.log.done]
        todo = list({k: (k, p) for k, p in todo}.values())
        if todo:
            self.progress = Progress(len(todo), self.progress_enabled, label=label)
            try:
                self._drive(ctx, todo)
            finally:
                self.progress.close()
        return [self.log.done[k] for k in keys]

    def _submit(self, ctx, plan):
        if isinstance(self._pool, cf.ProcessPoolExecutor):  # it may start a worker: see _sigint_blocked
            with _sigint_blocked():
                return self._pool.submit(self.fn, ctx, plan)
        return self._pool.submit(self.fn, ctx, plan)

    def _record(self, rec: dict) -> None:
        self.log.append(rec)
        self.progress.step()

    def _shared(self, ctx: Context):
        """``ctx`` as the workers take it: for Dask, scattered to every worker once, not
        sent with each plan."""
        return ctx if self._client is None else self._client.scatter(ctx, broadcast=True, hash=False)

    def _drive(self, context: Context, todo: list) -> None:
        """Run ``todo``. A plan the Dask cluster cancels may have lost the scattered
        context with a dead worker, so it is scattered again before the plan goes back."""
        ctx = self._shared(context)
        queue, suspects = deque(todo), deque()
        strikes: dict[str, int] = {}
        inflight: dict[cf.Future, tuple] = {}
        limit = 2 * max(1, self.workers)
        while queue or suspects or inflight:
            if suspects:  # after a worker died: one at a time, so a death points at its point
                if not inflight:
                    k, p = item = suspects.popleft()
                    inflight[self._submit(ctx, p)] = item
            else:
                while queue and len(inflight) < limit:
                    item = queue.popleft()
                    inflight[self._submit(ctx, item[1])] = item
            done, _ = cf.wait(inflight, return_when=cf.FIRST_COMPLETED)
            broken, cancelled = [], False
            for f in sorted(done, key=lambda f: inflight[f][0]):
                k, p = item = inflight.pop(f)
                try:
                    self._record(f.result())
                except BrokenProcessPool:
                    broken.append(item)
                except cf.CancelledError:  # the executor dropped it (Dask, when its worker died): again
                    if self._strike(strikes, k, p, "the executor cancelled this plan {n} times"):
                        cancelled = True
                        queue.appendleft(item)
                except Exception as exc:  # noqa: BLE001 - e.g. Dask's KilledWorker
                    self._record({"key": k, "plan": asdict(p), "status": "crashed", "error": _one_line(exc),
                                  "summary": None})
            if cancelled:
                ctx = self._shared(context)
            if broken:
                broken += list(inflight.values())
                inflight.clear()
                self._check_start()
                self._restart_pool()
                for k, p in sorted(broken, key=lambda it: it[0]):
                    if self._strike(strikes, k, p, "worker process died {n} times running this plan"):
                        suspects.append((k, p))

    def _strike(self, strikes: dict, k: str, p, why: str) -> bool:
        """One more failed attempt at plan ``p``: True if it may run again, else it is
        recorded as crashed with ``why`` (``{n}``: the attempts)."""
        strikes[k] = strikes.get(k, 0) + 1
        if strikes[k] > self.max_retries:
            self._record({"key": k, "plan": asdict(p), "status": "crashed", "summary": None,
                          "error": why.format(n=strikes[k])})
            return False
        self.retried += 1
        return True

    def _check_start(self) -> None:
        """After a local pool broke: if none of its workers got through start-up, twice in a
        row, stop with the reason instead of retrying plans that never ran."""
        if self._started is None or self._started.value:
            self.startup_failures = 0
            return
        self.startup_failures += 1
        if self.startup_failures < 2:
            return
        pool = self._pool
        codes = sorted({p.exitcode for p in (getattr(pool, "_processes", None) or {}).values()
                        if p.exitcode is not None})
        said = []
        with contextlib.suppress(OSError, TypeError):
            said = [x for x in Path(self._startup_log).read_text(encoding="utf-8").splitlines() if x.strip()]
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        guard = (f"spawned workers import the main module{f' ({main})' if main else ''} again, so a script "
                 "that starts a sweep must do it under `if __name__ == \"__main__\":`")
        if said:
            why = f"the worker said: {said[-1]}"
            if "bootstrapping phase" in said[-1]:
                why += f"; likely cause: {guard}"
        else:
            why = (f"likely cause: {guard}, or the worker could not import what the sweep's function needs "
                   "(its traceback is on stderr above)")
        exits = f" (exit code {', '.join(map(str, codes))})" if codes else ""
        self.close(kill=True, keep_dask=True)
        raise WorkerStartError(f"sweep: the local worker processes died while starting{exits}, "
                               f"{self.startup_failures} pools in a row, before running any plan "
                               f"({len(self.log.done)} recorded so far, kept); {why}")
