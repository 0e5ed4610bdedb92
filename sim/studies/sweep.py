"""Running many simulations: local worker processes or a Dask cluster, resumable.

A sweep is a list of *points*, each a ``ParallelPlan`` to simulate in one shared
``Context`` (model, hardware profile, topology); ``evaluate`` simulates one point and
returns its *record*, a plain JSON-able dict (``sim.studies.sweep_point``).

``Runner`` hands points to an executor and gathers the records:

- **Executors** (``sim.studies.sweep_executors``). Local worker processes (spawned,
  ``workers`` of them, default the cores this process may use; 0 runs in this process),
  or a Dask cluster through ``distributed.Client(...).get_executor()``
  (``dask="tcp://HOST:8786"``, or ``"local"`` to start a ``LocalCluster`` of ``workers``
  single-threaded processes). Records depend only on the point, so they are identical
  whichever executor ran them; callers sort them by key.
- **Results as they finish.** Each record is appended to a JSON Lines file
  (``sim.studies.sweep_results``) the moment it arrives, so a sweep interrupted by
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
- **Progress.** On stderr: on a terminal, a bar with the count, rate and ETA; otherwise
  a plain line every few seconds (``sim.progress.ProgressBar``).

Only a bounded number of points is in flight at a time (twice the workers), so Ctrl-C
stops quickly: queued points are cancelled and worker processes are terminated. Workers
never see the terminal's Ctrl-C themselves (local ones start with SIGINT blocked, Dask
LocalCluster ones with it ignored), so only this process decides.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import time
from collections import deque
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict

from sim.errors import InputError, require
from sim.inputs.plan import ParallelPlan
from sim.progress import ProgressBar as Progress
from sim.studies.search import plan_key
from sim.studies.sweep_executors import (InlineExecutor, StartupLog, TimeBudgetSpent, dask_client, exit_codes,
                                         local_pool, shutdown, sigint_blocked, why_workers_died)
from sim.studies.sweep_point import Context, evaluate, make_context, one_line
from sim.studies.sweep_results import ResultsLog

__all__ = ["RESULTS_FILE", "Context", "Progress", "ResultsLog", "Runner", "TimeBudgetSpent", "WorkerStartError",
           "evaluate", "make_context"]

RESULTS_FILE = "results.jsonl"


class WorkerStartError(InputError):
    """Local worker processes die while starting, before they can run any plan."""


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
        self._startup_log: StartupLog | None = None
        self.startup_failures = 0
        """Local pools in a row whose workers all died before finishing start-up."""
        self._screening: frozenset = frozenset()  # the keys ``run`` runs as screenings
        self.deadline: float | None = None
        """A ``time.monotonic()`` time after which ``run`` raises ``TimeBudgetSpent`` (points
        still running are left to ``close(kill=True)``; those finished are in the log)."""

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
            self._pool = InlineExecutor()
        else:
            if self._startup_log is None:
                self._startup_log = StartupLog()
            self._pool, self._started = local_pool(self.workers)

    def _dask_executor(self):
        self._client, self._cluster = dask_client(self.dask, self.workers)
        if self._cluster is None:  # a remote scheduler: its workers' threads
            self.workers = max(1, sum(self._client.nthreads().values()))
        return self._client.get_executor(pure=False)

    def _restart_pool(self) -> None:
        self.close(kill=True, keep_dask=True)
        self._start()

    def close(self, kill: bool = False, keep_dask: bool = False) -> None:
        pool = self._pool
        self._pool = None
        shutdown(pool, kill)
        if not keep_dask:
            if self._startup_log is not None:
                self._startup_log.close()
                self._startup_log = None
            if self._client is not None:
                self._client.close()
                self._client = None
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None
        self.log.close()

    # -- running
    def run(self, ctx: Context, plans: list[ParallelPlan], label: str = "", progress: Progress | None = None,
            start: float | None = None, screening=()) -> list[dict]:
        """Records for ``plans`` in the same order: from the results file where finished
        there, else simulated (and appended as they finish). ``label`` names the progress
        display, ``start`` is when the command's work began (its elapsed time counts from
        there); a caller that runs several batches (the search's waves) passes its own
        ``progress`` instead, which this counts on and leaves open. ``screening``: the keys
        of plans that are a search's screening runs (``evaluate(..., screening=True)``: a
        record with only what the search reads)."""
        self._screening = frozenset(screening)
        keys = [plan_key(p) for p in plans]
        todo = [(k, p) for k, p in zip(keys, plans) if k not in self.log.done]
        todo = list({k: (k, p) for k, p in todo}.values())
        resumed = len(set(keys)) - len(todo)  # finished in an earlier run (--resume)
        if progress is not None and resumed:
            progress.step(resumed)
        if todo:
            own = progress is None
            self.progress = Progress(len(todo), self.progress_enabled, label=label, start=start) if own else progress
            try:
                self._drive(ctx, todo)
            finally:
                if own:
                    self.progress.close()
        return [self.log.done[k] for k in keys]

    def map(self, fn, items: list) -> list:
        """``[fn(item) for item in items]`` on the workers, in order (the search's estimates
        before its simulations). ``fn`` must be a module-level function; an exception in one
        call is raised here."""
        if not items:
            return []
        if isinstance(self._pool, cf.ProcessPoolExecutor):
            with sigint_blocked():
                futures = [self._pool.submit(fn, item) for item in items]
        else:
            futures = [self._pool.submit(fn, item) for item in items]
        return [f.result() for f in futures]

    def _submit(self, ctx, plan, key: str = ""):
        extra = {"screening": True} if key in self._screening else {}
        if isinstance(self._pool, cf.ProcessPoolExecutor):  # it may start a worker: see sigint_blocked
            with sigint_blocked():
                return self._pool.submit(self.fn, ctx, plan, **extra)
        return self._pool.submit(self.fn, ctx, plan, **extra)

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
            self._check_deadline()
            if suspects:  # after a worker died: one at a time, so a death points at its point
                if not inflight:
                    k, p = item = suspects.popleft()
                    inflight[self._submit(ctx, p, k)] = item
            else:
                while queue and len(inflight) < limit:
                    item = queue.popleft()
                    inflight[self._submit(ctx, item[1], item[0])] = item
            left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            done, _ = cf.wait(inflight, timeout=left, return_when=cf.FIRST_COMPLETED)
            if not done:
                self._check_deadline()
                continue
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
                    self._record({"key": k, "plan": asdict(p), "status": "crashed", "error": one_line(exc),
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

    def _check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise TimeBudgetSpent()

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
        codes = exit_codes(self._pool)
        why = why_workers_died(self._startup_log.lines() if self._startup_log is not None else [])
        exits = f" (exit code {', '.join(map(str, codes))})" if codes else ""
        self.close(kill=True, keep_dask=True)
        raise WorkerStartError(f"sweep: the local worker processes died while starting{exits}, "
                               f"{self.startup_failures} pools in a row, before running any plan "
                               f"({len(self.log.done)} recorded so far, kept); {why}")
