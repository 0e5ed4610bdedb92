"""Simulating the rows of ``trainsim fit``: each row's iteration time per parameter vector.

``Simulations`` keeps every simulated time in memory (the fits that start from the same
point share their first evaluations) and, with a ``Store``, on disk: ``trainsim fit
--cache FILE`` appends one JSON line per simulation, so that a fit stopped part-way (a
fit of the H100 presets takes hours) and run again with the same file simulates only
what it had not. A stored time is used only for the same simulation: its key is a
SHA-256 over the row's settings, the whole hardware profile the fit starts from, the
parameters fitted, how rows are simulated, and the contents of every file of the
``sim`` package but the fit's own (any change to the simulator makes a new key, so a
cache never answers for other code; the fit's files only choose what to simulate); the parameter values are stored exactly (``repr`` round
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
from sim.inputs.frameworks import OVERHEAD_FRAMEWORKS, framework_name
from sim.inputs.hardware import HardwareProfile

FIDELITY = "reduced"
COLLECTIVE_MODEL = "flows"
SLOPE_REUSE = 2e-3
"""A row's slopes are taken again from its last probes while what it sees has moved by
less than this fraction since (``Simulations.slopes``): over that a row's time, close to
a + b/f in the compute fraction f, changes its slope by under 0.4%, and the residuals
the fit steps on stay exact."""


FITTING_FILES = ("calibrate/fit_runs.py", "calibrate/fit_sims.py", "calibrate/fit_surrogate.py", "commands/fit.py")
"""The fit's own code: it chooses which simulations to run, not what they give."""


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """SHA-256 over the path and contents of every file of the ``sim`` package but the
    fit's own (``FITTING_FILES``) and the preset profiles (``profiles/``: the profile a fit
    starts from is in each key whole, and another GPU's preset changes no row of this one)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                    and p.relative_to(root).as_posix() not in FITTING_FILES
                    and p.relative_to(root).parts[0] != "profiles"):
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
        with self.path.open("ab") as f:
            # after a run killed mid-write the file may end in a torn line: start a new one
            torn = f.tell() > 0 and self._last_byte() != b"\n"
            f.write((("\n" if torn else "") + json.dumps({"key": key[0], "values": list(values),
                                                          "time_s": time_s}) + "\n").encode())

    def _last_byte(self) -> bytes:
        with self.path.open("rb") as f:
            f.seek(-1, 2)
            return f.read(1)


FRAMEWORK_OVERHEAD = "framework_kernel_overhead_s"
"""The profile's mapping of per-framework kernel overheads (``sim.inputs.frameworks``): a
parameter ``framework_kernel_overhead_s.NAME`` is seen only by NAME's rows."""


def _set(obj, parts: list[str], value):
    if not parts:
        return value
    head, rest = parts[0], parts[1:]
    if obj is None and parts[:-1] == [] and head in OVERHEAD_FRAMEWORKS:  # the unset mapping of FRAMEWORK_OVERHEAD
        obj = {}
    if isinstance(obj, dict):
        if head not in obj and not (rest == [] and head in OVERHEAD_FRAMEWORKS):
            raise KeyError(head)
        return {**obj, head: _set(obj.get(head), rest, value)}
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


MOE_RATE = "moe_memory_relative_efficiency"
"""The MoE block's memory rate, which rows of models without experts never read (``Simulations.seen``)."""


class Simulations:
    """Each row's prepared run and its simulated iteration time per parameter vector
    (cached); ``pool``: an executor whose workers simulate rows (``worker_pool``), or None.

    A row is simulated at the values its simulation actually sees (``seen``): the GPU speed
    spread folded into the compute fraction as the simulator folds it
    (``sim.inputs.pacing.paced``: fraction x (1 − σ·e(N)) on the row's N GPUs, then no
    spread), the FP8 GEMM cap held at the profile's value on rows that do not train in
    FP8 (they never read it), the MoE block's memory rate (``moe_memory_relative_efficiency``)
    held the same way on rows of models without experts (only a mixture-of-experts block's
    kernels read it: ``sim.program.costs.in_moe_block``), and a framework's kernel overhead
    (``framework_kernel_overhead_s.NAME``) held at the profile's value (or 0) on rows of
    other frameworks. Vectors the simulation cannot tell apart share one
    simulation, and ``slopes`` differentiates only along what a row sees, by the chain
    rule: one simulation per seen direction instead of one per parameter. Rows of the same
    settings (``prepare_rows`` gives them one ``Prepared``: a run two sources published) share
    each simulation (``shared``, under the first such row, ``canon``), while each row keeps
    its own entries in ``cache`` as if simulated for it."""

    def __init__(self, profile: HardwareProfile, params, prepared: list, pool=None, store: "Store | None" = None):
        self.profile, self.params, self.prepared = profile, tuple(params), list(prepared)
        self.cache: dict = {}
        first: dict = {}
        self.canon = [first.setdefault(id(p), i) for i, p in enumerate(self.prepared)]
        """Each row's first row of the same ``Prepared`` run."""
        self.shared: dict = {}  # (canon row, values) -> simulated time
        self.count, self.seconds, self.reused = 0, 0.0, 0
        self.phase = "fit"
        """What the simulations run now are for (``by_phase``: the report's ``simulations_by_phase``)."""
        self.by_phase: dict = {}
        self._probed: dict = {}  # row -> (seen values, {seen direction: d time / d seen value}) of its last probes
        self.pool = pool
        self.store = store
        names = [q.path for q in self.params]
        self._f = names.index("sustained_compute_fraction") if "sustained_compute_fraction" in names else None
        self._sigma = names.index("gpu_speed_spread") if "gpu_speed_spread" in names else None
        self._fp8 = names.index("fp8_gemm_max_efficiency") if "fp8_gemm_max_efficiency" in names else None
        self._moe = names.index(MOE_RATE) if MOE_RATE in names else None
        self._frameworks = [(j, n.split(".", 1)[1]) for j, n in enumerate(names)
                            if n.startswith(FRAMEWORK_OVERHEAD + ".")]

    def seen(self, row: int, values) -> tuple:
        """``values`` as row ``row``'s simulation sees them (see the class doc)."""
        from sim.inputs.pacing import slowest_speed

        out = [float(v) for v in values]
        plan = self.prepared[row].plan
        if self._f is not None and self._sigma is not None:
            out[self._f] = out[self._f] * slowest_speed(out[self._sigma], plan.world_size)
            out[self._sigma] = 0.0
        if self._fp8 is not None and plan.precision is None:
            held = self.profile.fp8_gemm_max_efficiency
            out[self._fp8] = float(held) if held is not None else self.params[self._fp8].low
        if self._moe is not None and not self.prepared[row].model.num_moe_layers:
            held = self.profile.moe_memory_relative_efficiency
            out[self._moe] = float(held) if held is not None else self.params[self._moe].low
        for j, name in self._frameworks:  # another framework's overhead: held where the profile has it
            if framework_name(plan) != name:
                held = (self.profile.framework_kernel_overhead_s or {}).get(name)
                out[j] = float(held) if held is not None else self.params[j].low
        return tuple(out)

    def sensitive(self, rows, values) -> list[bool]:
        """Per parameter, whether the simulation of any of ``rows`` sees it move (``seen``)."""
        out = []
        for j, p in enumerate(self.params):
            y = [float(v) for v in values]
            y[j] += (p.high - p.low) / 2 if y[j] < (p.low + p.high) / 2 else -(p.high - p.low) / 2
            out.append(any(self.seen(i, y) != self.seen(i, values) for i in rows))
        return out

    def ensure(self, jobs) -> None:
        """Simulate the (row, seen values) ``jobs`` not yet known: from ``store``, else in the
        pool's workers (longest rows first), else here."""
        todo = []
        for job in dict.fromkeys(jobs):
            if job in self.cache:
                continue
            if self.store is not None and (t := self.store.get(*job)) is not None:
                self.cache[job] = t
                self.reused += 1
            else:
                todo.append(job)
        if self.pool is None or len(todo) < 2:
            for row, key in todo:
                self.time_s(row, key)
            return
        todo.sort(key=lambda j: -self.prepared[j[0]].plan.world_size)
        need = list(dict.fromkeys(c for c in ((self.canon[i], z) for i, z in todo) if c not in self.shared))
        start = time.monotonic()
        for job, t in zip(need, self.pool.map(_worker_time, need)):
            self.shared[job] = t
        for row, z in todo:
            self._keep((row, z), self.shared[(self.canon[row], z)])
        self.count += len(need)
        self.by_phase[self.phase] = self.by_phase.get(self.phase, 0) + len(need)
        self.seconds += time.monotonic() - start

    def _keep(self, job, t: float) -> None:
        self.cache[job] = t
        if self.store is not None:
            self.store.put(job[0], job[1], t)

    def times(self, rows, values) -> list[float]:
        """The simulated iteration time of each of ``rows`` at ``values``."""
        jobs = [(i, self.seen(i, values)) for i in rows]
        self.ensure(jobs)
        return [self.cache[j] for j in jobs]

    def slopes(self, rows, values, steps) -> list[list[float]]:
        """d time / d value of each of ``rows`` (one list per row, one entry per parameter),
        by forward differences of ``steps`` (per parameter) along each direction the row
        sees, chained through ``seen`` (itself differenced exactly: it is linear in each
        value). A row whose seen values moved less than ``SLOPE_REUSE`` since its last
        probes reuses their differences instead of simulating new ones."""
        x = [float(v) for v in values]
        n = len(x)
        chains, jobs = [], []
        for i in rows:
            z = self.seen(i, x)
            d = []  # d[k][j] = d seen_k / d x_j
            for j in range(n):
                y = list(x)
                y[j] += steps[j]
                zj = self.seen(i, y)
                d.append([(zj[k] - z[k]) / steps[j] for k in range(n)])
            d = [[d[j][k] for j in range(n)] for k in range(n)]
            moved = [k for k in range(n) if any(d[k])]
            last = self._probed.get(i)
            if last is not None and set(moved) <= set(last[1]) and _close(z, last[0]):
                chains.append(((i, z), d, None, dict(last[1])))
                continue
            probes = []
            for k in moved:
                zk = list(z)
                zk[k] += steps[k]
                probes.append((k, (i, tuple(zk))))
            chains.append(((i, z), d, probes, None))
            jobs += [(i, z)] + [job for _, job in probes]
        self.ensure(jobs)
        out = []
        for base, d, probes, reused in chains:
            if reused is None:
                reused = {k: (self.cache[job] - self.cache[base]) / steps[k] for k, job in probes}
                self._probed[base[0]] = (base[1], reused)
            grad = [0.0] * n
            for k, ds in reused.items():
                for j in range(n):
                    grad[j] += ds * d[k][j]
            out.append(grad)
        return out

    def time_s(self, row: int, values) -> float:
        """Row ``row`` simulated at exactly ``values`` (cached; no ``seen``)."""
        key = (row, tuple(float(v) for v in values))
        if key not in self.cache and self.store is not None and (t := self.store.get(*key)) is not None:
            self.cache[key] = t
            self.reused += 1
        if key not in self.cache:
            one = (self.canon[row], key[1])
            if one not in self.shared:
                start = time.monotonic()
                self.shared[one] = row_time_s(self.prepared[row], with_values(self.profile, self.params, key[1]))
                self.count += 1
                self.by_phase[self.phase] = self.by_phase.get(self.phase, 0) + 1
                self.seconds += time.monotonic() - start
            self._keep(key, self.shared[one])
        return self.cache[key]


def row_time_s(p, profile: HardwareProfile) -> float:
    """Seconds of one iteration of the prepared row ``p`` on ``profile``, simulated as every fit
    simulates its rows (``FIDELITY``, ``COLLECTIVE_MODEL``)."""
    from sim.inputs.schema import SimulationSettings
    from sim.session import Job, simulate_training

    run = simulate_training(Job(p.model, p.plan, profile, p.topology, p.schedule),
                            SimulationSettings(fidelity=FIDELITY, collective_model=COLLECTIVE_MODEL,
                                               max_events=p.settings.simulation.max_events))
    return float(run.trace.end_s)


def _close(z, z0) -> bool:
    """Whether every seen value of ``z`` is within ``SLOPE_REUSE`` (relative) of ``z0``'s."""
    return all(a == b or abs(a - b) <= SLOPE_REUSE * abs(b) for a, b in zip(z, z0))


_WORKER: list = []
"""A worker process's own ``Simulations`` (``worker_pool``)."""


def _worker_init(gpu: str, params, runs, where: str) -> None:
    from sim.gc_tuning import tune_process
    from sim.inputs.hardware import load_profile

    tune_process()  # (a worker is trainsim's own process: sim.gc_tuning)
    _WORKER[:] = [Simulations(load_profile(gpu, flag="--gpu"), params, prepare_rows(runs, gpu, where))]


def _worker_time(job) -> float:
    i, values = job
    return _WORKER[0].time_s(i, values)


def worker_pool(jobs: int, gpu: str, params, runs, where: str):
    """``jobs`` worker processes, each with the rows ``runs`` prepared for ``gpu`` (spawned,
    not forked: the parent may run a progress thread), tied to this process
    (``sim.workers``), in a ``with`` block that kills them on any exception."""
    from sim.workers import ending_pool, process_pool

    return ending_pool(process_pool(jobs, "spawn", initializer=_worker_init,
                                    initargs=(gpu, tuple(params), list(runs), where)))


def prepare_rows(runs, gpu: str, where: str = "RUNS.csv") -> list:
    """The session's ``Prepared`` run of each row on ``gpu`` (a preset or profile path);
    an error names the row's line."""
    from sim.inputs.schema import RunSettings
    from sim.session import prepare

    out = []
    same: dict = {}  # a row's settings -> its Prepared (rows of the same settings share one: ``Simulations``)
    for r in runs:
        key = tuple(sorted((k, repr(v)) for k, v in r.values.items()))
        if key in same:
            out.append(same[key])
            continue
        try:
            out.append(same.setdefault(key, prepare(RunSettings.from_values({**r.values, "gpu": gpu,
                                                                              "fidelity": FIDELITY}))))
        except InputError as exc:
            raise InputError(f"{r.file or where}: line {r.line}: {exc}") from None
    return out


