"""Worker processes and device timing for measurements.

``run_workers(fn, procs, payload)`` runs ``fn(ctx, payload)`` on every rank of a fresh
``torch.distributed`` group and returns each rank's result, in rank order. It starts
the processes itself with ``torch.multiprocessing`` (the ``spawn`` method, a rendezvous
on a free loopback port), or, when the calling process is already one rank of a
``torchrun`` job (``RANK``/``WORLD_SIZE`` in the environment), it runs ``fn`` right there
on the job's ranks and gathers the results onto rank 0 (other ranks get ``None``). The
backend is NCCL when CUDA is available (rank i on GPU ``LOCAL_RANK``), else gloo on CPU,
where each process gets ``cores // procs`` threads (at least one) so processes do not
fight over cores more than the machine forces them to, and glibc malloc keeps freed
memory (``CPU_MALLOC``) as a GPU's caching allocator does.

``measure`` times a callable the way a GPU needs it: warm-up calls first, then samples
of several back-to-back calls (enough for a sample to last ``min_sample_s``), bracketed
by CUDA events on a GPU and by ``perf_counter`` on CPU; the result is the median time of
one call. When CPU processes outnumber the cores (``Context.shared_cores``, e.g. 4 ranks
on 2 cores) a sample lasts at least ``SHARED_SAMPLE_S``, several scheduler time slices:
the median of sub-millisecond samples would pick the ones that ran on a core of their
own and report a whole core's speed, while a training step, long enough to take its
turns, runs at the share of a core each process gets. ``measure_many`` times several callables round-robin,
one sample of each per round, so their medians span the same stretch of time. A failing worker becomes a
``CalibrationError`` with the worker's last error line, never a hang: the parent waits
with a timeout.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sim.calibrate import CalibrationError, require_torch


CPU_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**30)}
"""glibc malloc settings for CPU workers: keep freed blocks instead of returning them to
the OS, so a new activation does not page-fault its way into fresh memory. PyTorch on a
GPU has a caching allocator that does the same (and CPU PyTorch deployments preload
jemalloc or tcmalloc for this reason); without it every step of the CPU reference run
pays page faults the kernel benchmarks never see. Values already in the environment win."""


@dataclass
class Context:
    """What a worker knows about itself."""

    rank: int
    world: int
    local_rank: int
    device: object
    """A ``torch.device`` (``cuda:i`` or ``cpu``)."""
    backend: str
    threads: int
    shared_cores: bool = False
    """More threads on this host than CPU cores (CPU processes only): the processes
    take turns on the cores, and ``measure`` times samples long enough to see that."""

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        if self.is_cuda:
            require_torch().cuda.synchronize(self.device)


def torchrun_env() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when this process is a rank of a torchrun job."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and not os.environ.get("TRAINSIM_WORKER"):
        world = int(os.environ["WORLD_SIZE"])
        if world > 1:
            return int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    return None


def default_procs() -> int:
    """Processes to start by default: one per GPU, or 2 on CPU."""
    torch = require_torch()
    if torch.cuda.is_available():
        return max(1, torch.cuda.device_count())
    return 2


def threads_per_proc(procs: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, procs))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup(rank: int, world: int, local_rank: int, procs_on_host: int, init: bool) -> Context:
    torch = require_torch()
    import torch.distributed as dist

    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    threads = threads_per_proc(procs_on_host)
    torch.set_num_threads(threads)
    if init and world > 1 and not dist.is_initialized():
        kw = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(minutes=5), **kw)
    shared = backend == "gloo" and procs_on_host * threads > (os.cpu_count() or 1)
    return Context(rank, world, local_rank, device, backend, threads, shared)


def _worker(rank: int, world: int, port: int, fn, payload, outdir: str, parent_pid: int | None = None) -> None:
    if parent_pid is not None:  # dies with the process that started it (sim.workers)
        from sim.workers import tie_to_parent

        tie_to_parent(parent_pid)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), TRAINSIM_WORKER="1")
    out = Path(outdir) / f"rank{rank}.pkl"
    _output_into(Path(outdir) / f"rank{rank}.log")
    try:
        ctx = _setup(rank, world, rank, world, init=True)
        result = fn(ctx, payload)
        data = {"ok": True, "result": result}
    except BaseException as exc:  # report every failure to the parent, then exit non-zero
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        data = {"ok": False, "error": last, "trace": traceback.format_exc()}
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(data))
    os.replace(tmp, out)  # the parent sees a whole result or none
    # Leave without the interpreter's teardown: C++ destructors of library threads
    # (the profiler's, the process group's) can abort a process that has finished its
    # work ("terminate called without an active exception"), which would turn a
    # complete measurement into a failure.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(0 if data["ok"] else 1)


def _output_into(path: Path) -> None:
    """Send this process's stdout and stderr, the C++ libraries' too (the PyTorch profiler
    prints ``USDT: ... profiler_start`` and ``profiler_stop`` at every trace, on every rank),
    to ``path``: a worker's results come back pickled, and the terminal stays the parent's.
    A rank that dies leaves its last line there for the parent's error (``_last_line``)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _last_line(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def run_workers(fn, procs: int, payload=None, *, timeout_s: float = 900.0) -> list | None:
    """``fn(ctx, payload)`` on every rank; the results in rank order (``None`` on the
    non-zero ranks of a torchrun job). ``fn`` must be a module-level function."""
    env = torchrun_env()
    if env is not None:
        return _run_in_job(fn, payload, *env)
    torch = require_torch()
    import torch.multiprocessing as mp

    if procs == 1:
        ctx = _setup(0, 1, 0, 1, init=False)
        return [fn(ctx, payload)]
    with tempfile.TemporaryDirectory(prefix="trainsim-workers-") as outdir:
        port = _free_port()
        saved = dict(os.environ)
        if not torch.cuda.is_available():
            os.environ.update({k: v for k, v in CPU_MALLOC.items() if k not in saved})
        try:
            ctx = mp.start_processes(_worker, args=(procs, port, fn, payload, outdir, os.getpid()), nprocs=procs,
                                     join=False, start_method="spawn")
        finally:
            os.environ.clear()
            os.environ.update(saved)
        failure = _wait(ctx.processes, outdir, timeout_s)
        results = []
        for r in range(procs):
            f = Path(outdir) / f"rank{r}.pkl"
            if not f.exists():
                results.append(None)
                continue
            data = pickle.loads(f.read_bytes())
            if not data["ok"]:
                raise CalibrationError(f"worker rank {r} failed: {data['error']}")
            results.append(data["result"])
        if any(r is None for r in results):
            rank = results.index(None)
            last = _last_line(Path(outdir) / f"rank{rank}.log")
            raise CalibrationError(f"worker processes failed: {failure or 'a rank left no result'}"
                                   + (f" (rank {rank}'s last output: {last})" if last else ""))
        return results


def _finished(outdir: str, rank: int) -> bool:
    f = Path(outdir) / f"rank{rank}.pkl"
    return f.exists() and pickle.loads(f.read_bytes())["ok"]


def _wait(processes, outdir: str, timeout_s: float) -> str | None:
    """Wait for every worker; None when all exited cleanly, else why not. A rank that
    died without a successful result stops the others (they would wait for it in a
    collective until their own timeout); one that died after writing a complete result
    (a crash in library teardown) does not."""
    deadline = time.monotonic() + timeout_s
    failure = None
    try:
        while any(p.is_alive() for p in processes):
            if time.monotonic() > deadline:
                failure = f"workers did not finish within {timeout_s:.0f} s"
                break
            bad = [r for r, p in enumerate(processes)
                   if p.exitcode not in (None, 0) and not _finished(outdir, r)]
            if bad:
                code = processes[bad[0]].exitcode
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                failure = f"process {bad[0]} terminated with {how}"
                break
            time.sleep(0.1)
    finally:  # on Ctrl-C and SIGTERM too: no rank outlives the wait
        for p in processes:
            if p.is_alive():
                p.terminate()
        for p in processes:
            p.join(timeout=10)
    if failure is None:
        bad = [r for r, p in enumerate(processes) if p.exitcode != 0 and not _finished(outdir, r)]
        if bad:
            code = processes[bad[0]].exitcode
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            failure = f"process {bad[0]} terminated with {how}"
    return failure


def _run_in_job(fn, payload, rank: int, world: int, local_rank: int) -> list | None:
    require_torch()
    import torch.distributed as dist

    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    ctx = _setup(rank, world, local_rank, local_world, init=True)
    result = fn(ctx, payload)
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(result, gathered, dst=0)
    return gathered


# ---------------------------------------------------------------------- timing
SHARED_SAMPLE_S = 0.05
"""Shortest sample on CPU processes that share cores (Linux gives a task a few ms at a time)."""


def measure(ctx: Context, fn, *, warmup: int = 2, repeats: int = 7, min_sample_s: float = 2e-4,
            inner: int | None = None) -> float:
    """Median seconds of one call of ``fn`` on ``ctx``'s device (see the module doc).
    ``inner`` fixes the calls per sample (collectives need the same count on every rank)."""
    if inner is None:
        inner = _prepare(ctx, fn, warmup, min_sample_s)
    else:
        for _ in range(max(1, warmup)):
            fn()
        ctx.sync()
    return statistics.median(_sample(ctx, fn, inner) for _ in range(max(1, repeats)))


def measure_many(ctx: Context, fns, *, warmup: int = 2, repeats: int = 7, min_sample_s: float = 2e-4,
                 min_total_s: float = 0.0) -> list[float]:
    """``measure`` of each of ``fns``, sampled round-robin: every round takes one sample of
    each, so that on a machine whose speed drifts (a shared virtual machine) every kernel's
    median is taken over the same spells, not one kernel's over a fast second and the
    next one's over a slow one. At least ``repeats`` rounds, and more until the rounds
    have lasted ``min_total_s``."""
    inners = [_prepare(ctx, fn, warmup, min_sample_s) for fn in fns]
    samples = [[] for _ in fns]
    start, rounds = time.perf_counter(), 0
    while rounds < max(1, repeats) or time.perf_counter() - start < min_total_s:
        for fn, inner, out in zip(fns, inners, samples):
            out.append(_sample(ctx, fn, inner))
        rounds += 1
    return [statistics.median(s) for s in samples]


def _prepare(ctx: Context, fn, warmup: int, min_sample_s: float) -> int:
    """Warm ``fn`` up; how many calls make one sample long enough to time well."""
    for _ in range(max(1, warmup)):
        fn()
    ctx.sync()
    if ctx.shared_cores:
        min_sample_s = max(min_sample_s, SHARED_SAMPLE_S)
    # Size on batches that double until one lasts min_sample_s: one call timed alone can be
    # slowed by a descheduling (a few ms on a loaded machine) and would size a short sample.
    calls = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        ctx.sync()
        took = max(time.perf_counter() - t0, 1e-7)
        if took >= min_sample_s or calls >= 1000:
            return max(1, min(1000, round(calls * min_sample_s / took)))
        calls *= 2


def _sample(ctx: Context, fn, inner: int) -> float:
    """Seconds per call over ``inner`` back-to-back calls."""
    if ctx.is_cuda:
        torch = require_torch()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / inner
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def training_dtype(ctx: Context):
    """The dtype a worker trains and benchmarks in: bf16 on a GPU, float32 on a CPU."""
    torch = require_torch()
    return torch.bfloat16 if ctx.is_cuda else torch.float32


def machine_info(ctx: Context) -> dict:
    """The machine, library versions and date, for a profile's provenance."""
    import platform
    from datetime import datetime, timezone

    import numpy

    torch = require_torch()
    info = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "backend": ctx.backend,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "processes": ctx.world,
        "threads_per_process": ctx.threads,
    }
    if ctx.is_cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        info.update(device=props.name, cuda=torch.version.cuda,
                    nccl=".".join(map(str, torch.cuda.nccl.version())), gpus=torch.cuda.device_count())
    else:
        info.update(device=_cpu_name(), cpus=os.cpu_count(),
                    malloc=" ".join(f"{k}={os.environ[k]}" for k in CPU_MALLOC if k in os.environ) or "glibc defaults")
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "cpu"
