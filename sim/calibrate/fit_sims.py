"""Simulating the rows of ``trainsim fit``: each row's iteration time per parameter vector.

``Simulations`` keeps every simulated time in memory (the fits that start from the same
point share their first evaluations) and, with a ``Store``, on disk: ``trainsim fit
--cache FILE`` appends one JSON line per simulation, so that a fit stopped part-way (a
fit of the H100 presets takes hours) and run again with the same file simulates only
what it had not. A stored time is used only for the same simulation: its key is a
SHA-256 over the row's settings, the whole hardware profile the fit starts from, the
parameters fitted, how rows are simulated, and the contents of every file of the
``sim`` package (any change to trainsim's code makes a new key, so a cache never
answers for other code); the parameter values are stored exactly (``repr`` round
trip). Lines that do not parse (a run killed mid-write) are skipped.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import fields, is_dataclass, replace
from functools import lru_cache
from pathlib import Path

from sim.errors import InputError
from sim.inputs.hardware import HardwareProfile

FIDELITY = "reduced"
COLLECTIVE_MODEL = "flows"


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """SHA-256 over the path and contents of every file of the ``sim`` package."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


class Store:
    """Simulated times on disk (JSON lines: {"key", "values", "time_s"}), by row and values."""

    def __init__(self, path, profile: HardwareProfile, params, runs):
        self.path = Path(path)
        base = {"code": code_fingerprint(), "profile": repr(profile), "params": [p.path for p in params],
                "fidelity": FIDELITY, "collective_model": COLLECTIVE_MODEL}
        self.keys = [hashlib.sha256(json.dumps({**base, "row": r.values}, sort_keys=True, default=str).encode())
                     .hexdigest() for r in runs]
        self.known: dict = {}
        if self.path.is_dir():
            raise InputError(f"--cache: got {str(path)!r}; it is a directory, expected a file")
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    d = json.loads(line)
                    self.known[(d["key"], tuple(float(v) for v in d["values"]))] = float(d["time_s"])
                except (ValueError, KeyError, TypeError):
                    continue
        elif not self.path.parent.is_dir():
            raise InputError(f"--cache: got {str(path)!r}; its folder {str(self.path.parent)!r} does not exist")

    def get(self, row: int, values: tuple) -> float | None:
        return self.known.get((self.keys[row], values))

    def put(self, row: int, values: tuple, time_s: float) -> None:
        key = (self.keys[row], values)
        if key in self.known:
            return
        self.known[key] = time_s
        with self.path.open("a") as f:
            f.write(json.dumps({"key": key[0], "values": list(values), "time_s": time_s}) + "\n")


def _set(obj, parts: list[str], value):
    if not parts:
        return value
    head, rest = parts[0], parts[1:]
    if isinstance(obj, dict):
        return {**obj, head: _set(obj[head], rest, value)}
    if is_dataclass(obj) and head in {f.name for f in fields(obj)}:
        return replace(obj, **{head: _set(getattr(obj, head), rest, value)})
    raise KeyError(head)


def with_values(profile: HardwareProfile, params, values) -> HardwareProfile:
    """``profile`` with each parameter's field set (``dataclasses.replace``)."""
    for p, v in zip(params, values):
        try:
            profile = _set(profile, p.path.split("."), float(v))
        except KeyError:
            raise InputError(f"--params: {p.path}: profile {profile.name} has no such field") from None
    return profile


class Simulations:
    """Each row's prepared run and its simulated iteration time per parameter vector
    (cached); ``pool``: an executor whose workers simulate rows (``worker_pool``), or None."""

    def __init__(self, profile: HardwareProfile, params, prepared: list, pool=None, store: "Store | None" = None):
        self.profile, self.params, self.prepared = profile, tuple(params), list(prepared)
        self.cache: dict = {}
        self.count, self.seconds, self.reused = 0, 0.0, 0
        self.pool = pool
        self.store = store

    def _recall(self, rows, key) -> None:
        """Take what ``store`` already holds for ``rows`` at ``key`` into the cache."""
        if self.store is None:
            return
        for i in rows:
            if (i, key) not in self.cache and (t := self.store.get(i, key)) is not None:
                self.cache[(i, key)] = t
                self.reused += 1

    def times(self, rows, values) -> list[float]:
        """``time_s`` of each of ``rows`` at ``values``, the missing ones in the pool's workers."""
        key = tuple(float(v) for v in values)
        self._recall(rows, key)
        missing = [i for i in rows if (i, key) not in self.cache]
        if self.pool is not None and len(missing) > 1:
            start = time.monotonic()
            for i, t in zip(missing, self.pool.map(_worker_time, [(i, key) for i in missing])):
                self.cache[(i, key)] = t
                if self.store is not None:
                    self.store.put(i, key, t)
            self.count += len(missing)
            self.seconds += time.monotonic() - start
        return [self.time_s(i, key) for i in rows]

    def time_s(self, row: int, values) -> float:
        from sim.session import simulate_training

        key = (row, tuple(float(v) for v in values))
        self._recall([row], key[1])
        if key not in self.cache:
            p = self.prepared[row]
            start = time.monotonic()
            run = simulate_training(p.model, p.plan, with_values(self.profile, self.params, key[1]), p.topology,
                                    p.schedule, fidelity=FIDELITY, max_events=p.settings.simulation.event_limit,
                                    collective_model=COLLECTIVE_MODEL)
            self.cache[key] = float(run.trace.end_s)
            if self.store is not None:
                self.store.put(row, key[1], self.cache[key])
            self.count += 1
            self.seconds += time.monotonic() - start
        return self.cache[key]


_WORKER: list = []
"""A worker process's own ``Simulations`` (``worker_pool``)."""


def _worker_init(gpu: str, params, runs, where: str) -> None:
    from sim.inputs.hardware import load_profile

    _WORKER[:] = [Simulations(load_profile(gpu, flag="--gpu"), params, prepare_rows(runs, gpu, where))]


def _worker_time(job) -> float:
    i, values = job
    return _WORKER[0].time_s(i, values)


def worker_pool(jobs: int, gpu: str, params, runs, where: str):
    """``jobs`` worker processes, each with the rows ``runs`` prepared for ``gpu`` (spawned,
    not forked: the parent may run a progress thread)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_worker_init, initargs=(gpu, tuple(params), list(runs), where))


def prepare_rows(runs, gpu: str, where: str = "RUNS.csv") -> list:
    """The session's ``Prepared`` run of each row on ``gpu`` (a preset or profile path);
    an error names the row's line."""
    from sim.inputs.schema import RunSettings
    from sim.session import prepare

    out = []
    for r in runs:
        try:
            out.append(prepare(RunSettings.from_values({**r.values, "gpu": gpu, "fidelity": FIDELITY})))
        except InputError as exc:
            raise InputError(f"{where}: line {r.line}: {exc}") from None
    return out


