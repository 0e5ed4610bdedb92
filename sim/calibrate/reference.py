"""The real reference run: a small GPT trained across N local processes.

Every process is one GPU of a ``ParallelPlan`` with tp = 1 (``plan.coords`` places it
exactly as the simulator does). Each holds its pipeline stage of a GPT built from the
same ``ModelSpec`` the simulator reads: token and learned position embeddings (first
stage), pre-norm blocks of LayerNorm, fused QKV projection, causal
``scaled_dot_product_attention``, output projection, LayerNorm, GeLU MLP (last stage:
final LayerNorm, an untied output layer and the cross-entropy loss). Biases follow
``model.bias``; there is no dropout (build the spec with ``dropout=False``).

An iteration runs the rank's steps of the *simulator's own schedule*
(``sim.program.schedules.build_schedule``: GPipe or 1F1B), so both sides execute the
same order.
Pipeline communication is torch.distributed point-to-point written here: after each
step, its sends (activations forward, input gradients backward) are posted together
with the receives the next step needs, as one ``batch_isend_irecv`` (what Megatron-LM's
``send_forward_recv_backward`` does, and what keeps NCCL from deadlocking when both
neighbours send at once); the rank waits only for the receives before computing, and for
its sends at the end of the iteration. After the last backward the gradients are
all-reduced over the data-parallel group in DDP-sized buckets (after backward, not
overlapped: the simulated plan says ``dp_overlap=False``), then Adam steps. Each
bucket's gradients are views of one flat buffer, as in Megatron-LM's DDP, so the
all-reduce has no packing or copy-back around it (the scaling by 1/dp is one pass over
the buffer, which the simulator does not cost).

Timing: a barrier starts each iteration; every step, wait and all-reduce is bracketed
(``perf_counter`` on CPU, CUDA events on GPU) relative to that start, and an
iteration's time is the slowest rank's. A probe GEMM timed on every rank before each
timed iteration (outside its timing) tells how fast the machine was meanwhile (a shared
machine's other work shows there). Iterations after the warm-up are timed; one more
runs under ``torch.profiler`` (``record_shapes``: the communication's sizes) and each rank
writes its Chrome trace (``trace_rank{r}.json``) when a trace directory is given; its timed
span (from the barrier's end to the iteration's) is the trace's ``ProfilerStep#0``, which ``trainsim replay`` replays.
That iteration's own timing is the result's ``traced`` (as an entry of ``iterations``): it
runs slower than the others by the profiler's cost per recorded operator
(``HardwareProfile.profiler_op_overhead_s``), which the replay takes off.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from sim.calibrate import require_torch
from sim.calibrate.launch import Context, run_workers, training_dtype
from sim.calibrate.reference_model import reference_gpt
from sim.errors import InputError
from sim.inputs.model import ModelSpec
from sim.program.memory.states import ddp_bucket_bytes
from sim.inputs.plan import ParallelPlan
from sim.program.schedules import build_schedule

SCHEDULES = ("gpipe", "1f1b")


def check_supported(model: ModelSpec, plan: ParallelPlan) -> None:
    """What the reference implements; an ``InputError`` naming the field otherwise."""
    if plan.tp != 1:
        raise InputError(f"plan: tp: got {plan.tp}; the reference run implements data and pipeline parallelism (tp = 1)")
    if plan.schedule not in SCHEDULES or plan.vpp != 1:
        raise InputError(f"plan: schedule: got {plan.schedule!r}; the reference run implements {', '.join(SCHEDULES)}")
    if plan.recompute_policy.recomputes or plan.zero.shards_optimizer or plan.sequence_parallel:
        raise InputError("plan: the reference run implements recompute 'none', ZeRO-0 and no sequence parallelism")
    if model.mlp != "gelu" or model.norm != "layernorm" or model.position_embedding != "learned":
        raise InputError(f"model {model.name}: the reference run builds GPT layers (gelu, layernorm, learned positions)")
    if model.dropout or model.tied_embeddings:
        raise InputError(f"model {model.name}: build it with dropout=False, tied_embeddings=False for the reference run")


def p2p_groups(schedule, rank: int) -> list[tuple[str | None, list, list]]:
    """Rank ``rank``'s communication, in order: ``(step before which it happens or None
    at the end, sends, receives)``. Sends are ``(peer, 'act'|'grad', stage, mb)`` posted
    after the previous step; receives are what the next step consumes."""
    last = schedule.num_stages - 1
    groups, pending = [], []
    for st in schedule.ranks[rank]:
        recvs = []
        if st.kind == "F" and st.stage > 0:
            recvs.append((schedule.owner(st.stage - 1), "act", st.stage - 1, st.mb))
        if st.kind == "B" and st.stage < last:
            recvs.append((schedule.owner(st.stage + 1), "grad", st.stage + 1, st.mb))
        if pending or recvs:
            groups.append((str(st), pending, recvs))
        pending = []
        if st.kind == "F" and st.stage < last:
            pending.append((schedule.owner(st.stage + 1), "act", st.stage, st.mb))
        if st.kind == "B" and st.stage > 0:
            pending.append((schedule.owner(st.stage - 1), "grad", st.stage, st.mb))
    if pending:
        groups.append((None, pending, []))
    return groups


class _Clock:
    """Marks on the device's timeline, read back as seconds after the iteration start."""

    def __init__(self, torch, ctx: Context):
        self.torch, self.cuda = torch, ctx.is_cuda
        self.marks = []

    def mark(self):
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, start, mark) -> float:
        return start.elapsed_time(mark) * 1e-3 if self.cuda else mark - start


def _buckets(params, bucket_bytes: float) -> list[list]:
    """Gradients in reverse order (the order backward makes them final), packed into
    buckets of at least ``bucket_bytes`` (as the simulator's DDP pass packs them)."""
    out, cur, size = [], [], 0
    for p in reversed(list(params)):
        cur.append(p)
        size += p.numel() * p.element_size()
        if size >= bucket_bytes:
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return out


def _worker(ctx: Context, payload: dict) -> dict:
    torch = require_torch()
    import torch.distributed as dist

    model, plan = payload["model"], payload["plan"]
    d, p, _ = plan.coords(ctx.rank)
    dp_group = None
    for grp in plan.groups("dp"):  # every rank creates every group, in the same order
        g = dist.new_group(list(grp)) if plan.dp > 1 else None
        if ctx.rank in grp:
            dp_group = g
    sched = build_schedule(plan.schedule, plan.pp, plan.num_microbatches)
    first, last = p == 0, p == plan.pp - 1
    torch.manual_seed(1234 + p)  # identical stage weights in every data-parallel replica
    dt = training_dtype(ctx)
    stage = reference_gpt(torch, model, first, last, len(plan.layer_range(model, p))).to(ctx.device, dt)
    opt = torch.optim.Adam(stage.parameters(), lr=1e-4)
    b, s, h, m = plan.micro_batch_size, model.seq_length, model.hidden_size, plan.num_microbatches
    gen = torch.Generator().manual_seed(99 + d)
    tokens = [torch.randint(0, model.vocab_size, (b, s), generator=gen).to(ctx.device) for _ in range(m)]
    targets = [torch.randint(0, model.vocab_size, (b, s), generator=gen).to(ctx.device) for _ in range(m)]
    groups = {g[0]: g for g in p2p_groups(sched, p)}
    rank_of = {q: plan.rank(dp=d, pp=q) for q in range(plan.pp)}
    # Gradients live in one flat buffer per bucket (each parameter's .grad a view of it,
    # as Megatron-LM's DDP keeps them): backward accumulates straight into the buffers,
    # and the all-reduce needs no packing or copy-back.
    flats = []
    # (Megatron-Core's DDP puts a later pipeline stage's gradients in one bucket: sim.inputs.frameworks.GRAD_BUCKETS)
    for bucket in _buckets(stage.parameters(), plan.sharding.grad_buckets.unit_bytes(p, 0, ddp_bucket_bytes(plan))):
        flat = torch.zeros(sum(q.numel() for q in bucket), device=ctx.device, dtype=dt)
        off = 0
        for q in bucket:
            q.grad = flat[off: off + q.numel()].view_as(q)
            off += q.numel()
        flats.append(flat)
    clock = _Clock(torch, ctx)

    def post(sends, recvs, bufs, saved):
        ops, rbufs = [], []
        for peer, what, st, mb in sends:
            t = saved[(st, mb)][1].detach() if what == "act" else saved[(st, mb)][0].grad
            ops.append(dist.P2POp(dist.isend, t.contiguous(), rank_of[peer]))
        for peer, what, st, mb in recvs:
            buf = torch.empty(b, s, h, device=ctx.device, dtype=dt)
            ops.append(dist.P2POp(dist.irecv, buf, rank_of[peer]))
            rbufs.append(((what, st, mb), buf))
        works = dist.batch_isend_irecv(ops) if ops else []
        if len(works) != len(ops):  # coalesced (NCCL): one work for the group, waited as a whole
            return [], works, rbufs
        return works[: len(sends)], works[len(sends):], rbufs

    def iteration(record):
        spans, saved, got, send_works, losses = [], {}, {}, [], []
        dist.barrier() if ctx.world > 1 else None
        ctx.sync()
        t0w = time.perf_counter()
        t0 = clock.mark()
        steal0, busy0, own0 = host_steal_s(), host_busy_s(), time.process_time()
        step = record("ProfilerStep#0")  # (the timed iteration, as the trace's step: trainsim replay's --step 0)
        step.__enter__()

        def span(name, kind, cat, a, z):
            spans.append((name, kind, cat, a, z))

        for st in sched.ranks[p]:
            key = str(st)
            if key in groups:
                _, sends, recvs = groups[key]
                a = clock.mark()
                with record("pp wait " + key):
                    sw, rw, rbufs = post(sends, recvs, None, saved)
                    for w in rw:
                        w.wait()
                send_works += sw
                for k, buf in rbufs:
                    got[k] = buf
                span(f"pp before {key}", "recv", "pp", a, clock.mark())
            a = clock.mark()
            with record(key):
                if st.kind == "F":
                    x = tokens[st.mb] if first else got.pop(("act", st.stage - 1, st.mb)).requires_grad_()
                    y = stage(x)
                    if last:
                        y = torch.nn.functional.cross_entropy(y.float().view(-1, model.vocab_size),
                                                              targets[st.mb].view(-1)) / m
                        losses.append(y.detach())
                    saved[(st.stage, st.mb)] = (x, y)
                else:
                    x, y = saved[(st.stage, st.mb)]
                    if last:
                        y.backward()
                    else:
                        y.backward(got.pop(("grad", st.stage + 1, st.mb)))
                    if first:
                        saved.pop((st.stage, st.mb))
            span(key, "compute", st.kind, a, clock.mark())
            if st.kind == "B" and not first:  # keep x until its gradient is sent
                saved[(st.stage, st.mb)] = (saved[(st.stage, st.mb)][0], None)
        if None in groups:
            sw, _, _ = post(groups[None][1], [], None, saved)
            send_works += sw
        a = clock.mark()
        with record("pp sends"):
            for w in send_works:
                w.wait()
        span("pp sends", "send", "pp", a, clock.mark())
        if dp_group is not None:
            a = clock.mark()
            with record("dp all-reduce"):
                for flat in flats:
                    dist.all_reduce(flat, group=dp_group)
                    flat /= plan.dp
            span("dp all-reduce", "collective", "dp", a, clock.mark())
        a = clock.mark()
        with record("optimizer"):
            opt.step()
            for flat in flats:  # the views stay; the buffers start the next iteration at zero
                flat.zero_()
        span("optimizer", "compute", "opt", a, clock.mark())
        ctx.sync()
        total = time.perf_counter() - t0w
        step.__exit__(None, None, None)
        spans = [(n, k, c, clock.seconds(t0, x), clock.seconds(t0, z)) for n, k, c, x, z in spans]
        loss = float(sum(losses)) if losses else math.nan
        steal1, busy1, own1 = host_steal_s(), host_busy_s(), time.process_time()
        stolen = steal1 - steal0 if steal0 is not None and steal1 is not None else None
        busy = busy1 - busy0 if busy0 is not None and busy1 is not None else None
        return {"time_s": total, "spans": spans, "loss": loss, "steal_s": stolen, "host_busy_s": busy,
                "own_cpu_s": own1 - own0}

    from contextlib import nullcontext

    no_record = lambda name: nullcontext()  # noqa: E731
    for _ in range(payload["warmup"]):
        iteration(no_record)
    # Timed iterations, each between two probes (untimed). With a tolerance, an iteration
    # counts only if every rank's probes on both sides ran as the profile predicts and the
    # hypervisor took little CPU meanwhile; iterations run until ``iters`` count or
    # ``max_iters`` ran. Every rank takes the same decision (all-reduced).
    want, most = payload["iters"], payload.get("max_iters") or payload["iters"]
    predicted, tol = payload.get("probe_predicted_s"), payload.get("tolerance")
    iters, probe = [], [_probe(torch, ctx, payload.get("probe"))]
    while len(iters) < most and sum(it["steady"] for it in iters) < want:
        it = iteration(no_record)
        probe.append(_probe(torch, ctx, payload.get("probe")))
        own = it["own_cpu_s"]
        if ctx.world > 1 and tol is not None:  # every rank's CPU time: the job's share of the host's
            t = torch.tensor([own], dtype=torch.float64, device=ctx.device)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            own = t.item()
        it["others_cpu_s"] = max(0.0, it["host_busy_s"] - own) if it["host_busy_s"] is not None else None
        ok = machine_as_calibrated(probe[-2], probe[-1], predicted, tol, it["steal_s"], it["time_s"],
                                   others_s=it["others_cpu_s"])
        if ctx.world > 1 and tol is not None:
            flag = torch.tensor([1.0 if ok else 0.0], dtype=torch.float64, device=ctx.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            ok = bool(flag.item())
        it["steady"] = ok
        iters.append(it)
    trace_file, traced = None, None
    if payload.get("trace_dir"):
        from torch.profiler import ProfilerActivity, profile, record_function

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.is_cuda else [])
        with profile(activities=acts, record_shapes=True) as prof:
            traced = iteration(record_function)
        trace_file = str(Path(payload["trace_dir"]) / f"trace_rank{ctx.rank}.json")
        prof.export_chrome_trace(trace_file)
    timed = iters + ([traced] if traced is not None else [])
    if ctx.world > 1:  # an iteration takes as long as its slowest rank
        t = torch.tensor([it["time_s"] for it in timed], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        for it, v in zip(timed, t.tolist()):
            it["iteration_s"] = v
    else:
        for it in timed:
            it["iteration_s"] = it["time_s"]
    return {"rank": ctx.rank, "coords": (d, p), "iterations": iters, "trace_file": trace_file, "traced": traced,
            "probe_s": [t for t in probe if t is not None]}


STEAL_TOLERANCE = 0.02
"""Most of an iteration's CPU time (wall time x CPUs) the hypervisor may take for it to count
as measured on the machine as calibrated: validate's run U of 2026-12-02 lost 5.6 % to it on its
1F1B row and came out 17 % slower than simulated with the probe at 0.99x."""


OTHERS_TOLERANCE = 0.10
"""Most of an iteration's CPU time (wall time x CPUs) other processes of this machine may use for
it to count: a short probe GEMM rarely loses its core to them (the scheduler's slice is
milliseconds), an iteration does (with a fit running beside it on 2 CPUs the probe read 1.00x and
the iteration took 3.7x its simulation). /proc/stat counts in 10 ms ticks: 5 % of a 0.2 s
iteration on 2 CPUs is one tick at each end; the bound sits above that."""


def machine_as_calibrated(before_s, after_s, predicted_s, tolerance, steal_s, time_s, cpus: int | None = None,
                          others_s: float | None = None) -> bool:
    """Whether an iteration ran on the machine as calibrated: the probe GEMM timed just before
    and just after it both within ``tolerance`` (a fraction) of the profile's prediction, either
    way; at most ``STEAL_TOLERANCE`` of its CPU time stolen by the hypervisor and at most
    ``OTHERS_TOLERANCE`` used by other processes (``others_s``: the host's busy CPU time less
    the job's own). ``tolerance`` None: always (no gate). A missing reading does not count
    against it."""
    import os

    if tolerance is None:
        return True
    if predicted_s:
        for t in (before_s, after_s):
            if t is not None and not (1 / (1 + tolerance) <= t / predicted_s <= 1 + tolerance):
                return False
    cpu_s = time_s * (cpus or os.cpu_count() or 1)
    if cpu_s > 0:
        if steal_s is not None and steal_s / cpu_s > STEAL_TOLERANCE:
            return False
        if others_s is not None and others_s / cpu_s > OTHERS_TOLERANCE:
            return False
    return True


def host_busy_s(stat: str = "/proc/stat") -> float | None:
    """Seconds of CPU time every process of this machine has run since boot, all CPUs together:
    user, nice, system, irq and softirq of ``/proc/stat``'s ``cpu`` line (guest time is in user;
    idle, iowait and steal are not running). None where there is no such file."""
    import os

    try:
        with open(stat) as fh:
            fields = fh.readline().split()
        if fields[0] != "cpu" or len(fields) < 8:
            return None
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
        return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def host_steal_s(stat: str = "/proc/stat") -> float | None:
    """Seconds of CPU time the hypervisor has taken from this (virtual) machine since boot,
    all CPUs together: the ``steal`` column of ``/proc/stat``'s ``cpu`` line (proc(5)), in
    clock ticks of ``SC_CLK_TCK``. None where there is no such file (not Linux) or no
    such column. Read before and after an iteration, it says how much of the iteration's
    wall time the machine was not running this job's processes at all."""
    import os

    try:
        with open(stat) as fh:
            fields = fh.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" and len(fields) > 8 else None
    except (OSError, ValueError, IndexError):
        return None


def _probe(torch, ctx: Context, shape) -> float | None:
    """Seconds of one GEMM of ``shape`` (m, n, k, layout) right now, every rank at once:
    how fast the machine is during the run, to set beside what the profile predicts."""
    if not shape:
        return None
    from sim.calibrate.microbench import bench_gemms

    if ctx.world > 1:
        require_torch().distributed.barrier()
    m, n, k, layout = shape
    return bench_gemms(ctx, [(m, n, k, 1, layout)], repeats=3, warmup=1, sweep=False)[0]["time_s"]


@dataclass(frozen=True)
class Timing:
    """How the reference run times its iterations (``run_reference``)."""

    warmup: int = 2
    iters: int = 5
    """Timed iterations (after ``warmup``)."""
    probe: tuple | None = None
    """(m, n, k, layout): a GEMM every rank also times before each timed iteration and after
    the last (``probe_s``: one more than the iterations)."""
    probe_predicted_s: float | None = None
    tolerance: float | None = None
    """With it (and the probe's ``probe_predicted_s``), an iteration is ``steady`` only if
    ``machine_as_calibrated``, and iterations run until ``iters`` are steady or ``max_iters``
    (None: ``iters``) ran."""
    max_iters: int | None = None


def run_reference(model: ModelSpec, plan: ParallelPlan, timing: Timing = Timing(), *,
                  trace_dir: str | Path | None = None) -> list | None:
    """Train ``timing.iters`` timed iterations (after ``timing.warmup``) on ``plan.world_size``
    processes, as ``timing`` says; each rank's result (None on a torchrun job's other ranks)."""
    check_supported(model, plan)
    if trace_dir is not None:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
    payload = {"model": model, "plan": plan, "warmup": timing.warmup, "iters": timing.iters,
               "trace_dir": str(trace_dir) if trace_dir else None, "probe": timing.probe,
               "probe_predicted_s": timing.probe_predicted_s, "tolerance": timing.tolerance,
               "max_iters": timing.max_iters}
    return run_workers(_worker, plan.world_size, payload)
