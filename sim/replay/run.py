"""Replaying traced ranks on the simulated cluster, and the what-ifs on the replayed job.

``replay(graphs, ...)`` takes the traced ranks' graphs (from any reader), completes the
job with clones (``sim.replay.program``), applies the what-ifs, and runs the program on
the engine with the network model of the topology: the GPU profile and node come from
``gpu`` / ``topology`` / ``fabric`` / ``oversubscription`` (``trainsim run``'s settings),
else from the trace's device name and world size. It returns the trace and a summary
with ``iteration_time_s`` (the replayed step) beside ``traced_step_s`` (the step the trace
measured, on its slowest traced rank), and the critical path by category. Kernels run at
their given durations; where every graph's durations are costed rather than measured
(``RankGraph.meta["costed"]``: trainsim's own Chakra ETs), compute is slowed by the
communication beside it as ``trainsim run`` slows it (the profile's
``overlap_compute_slowdown``, for the collectives whose claim holds SMs:
``Node.slows_compute``), since a measured kernel already ran so and a costed one did not.

What-ifs:

- ``data_parallel_size=N``: the data-parallel groups are those of the all-reduce /
  reduce-scatter / all-gather collectives whose process group is named for data
  parallelism (``DATA_PARALLEL_GROUP``, ``dp``), else those of the group size that moves
  the most bytes (they must be evenly strided:
  ranks g, g+s, ..., g+(D-1)s); rank r = i + s·(d + D·o) becomes i + s·(d' + N·o) for each
  new replica d', which copies replica d' mod D. Each rank's kernels are kept; the
  gradient collectives run over the N-rank groups (the same bytes per rank), every other
  group and peer stays inside the replica.
- ``gpus=N``: the same what-if told in GPUs: N must be a whole number of the traced job's
  replicas (its world size / D GPUs each), and it is ``data_parallel_size`` = N / that
  (both given, they must agree); the cluster (``nodes``, ``gpus_per_node``) must hold N
  GPUs, as ``trainsim run``'s must hold ``--gpus``.
- ``gpu``: another GPU's profile. Kernels are scaled by class (``sim.replay.kineto.
  kernel_category``): a GEMM whose operator's shapes the trace recorded by the ratio of
  the two profiles' GEMM model (peak x ``gemm_efficiency(m, n, k, batch, dtype)``), an
  attention kernel whose operator's shapes it recorded by their attention model (peak x
  ``attention_efficiency``), other GEMMs and attention by the ratio of sustained dense BF16
  rates (peak x the profile's GEMM / attention efficiency cap), memory-bound and unclassified kernels by the ratio of
  sustained HBM bandwidths; host time is kept; communication is re-priced by the network
  model of the new GPU's node.

A CPU job's traces (``sim.replay.cpu``) replay less the profiler's cost: the profile's
``profiler_op_overhead_s`` per operator the profiler recorded on a host thread
(``sim.replay.cpu.without_profiler``), so that the replay is of the job unprofiled.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.errors import InputError
from sim.replay.graph import RankGraph
from sim.replay.program import Replayed, complete, is_data_parallel_name, to_program

GPU_OF_DEVICE = (("GB300", "gb300"), ("GB200", "gb200"), ("B200", "b200"), ("H200", "h200"), ("H100", "h100-sxm"),
                 ("A100", "a100-80gb"))
"""A trace's ``deviceProperties`` name (substring) -> the built-in GPU profile it runs as."""


@dataclass
class ReplayRun:
    trace: object
    summary: dict
    replayed: Replayed
    profile: object
    topology: object


def gpu_of_device(name: str) -> str | None:
    up = (name or "").upper()
    return next((p for key, p in GPU_OF_DEVICE if key in up), None)


def check_same_job(graphs: list[RankGraph]) -> None:
    """Traces of one job and one step: the same world size and step, distinct ranks."""
    first = graphs[0]
    seen: dict[int, str] = {}
    for g in graphs:
        if g.rank in seen:
            raise InputError(f"{g.source}: rank {g.rank}: {seen[g.rank]} claims the same rank; give one trace per rank")
        seen[g.rank] = g.source
        for key, what in (("world_size", "world size (distributedInfo.world_size)"),
                          ("step", "step (ProfilerStep#N)")):
            if g.meta.get(key) != first.meta.get(key):
                raise InputError(f"{g.source}: {what}: got {g.meta.get(key)!r}; {first.source} has "
                                 f"{first.meta.get(key)!r}: traces of different jobs or steps are mixed")




def _check_cpu(graphs: list[RankGraph], gpu, **network) -> None:
    """A CPU job's traces (``sim.replay.cpu``): all of them, replayed with the profile fitted on
    that machine (``--gpu PROFILE.json``) on the machine's own topology."""
    g = next(g for g in graphs if not g.meta.get("cpu_trace")) if not all(g.meta.get("cpu_trace") for g in graphs) \
        else None
    if g is not None:
        raise InputError(f"{g.source}: a GPU job's trace, mixed with CPU (gloo) traces: traces of different jobs")
    if gpu is None or not str(gpu).endswith(".json"):
        raise InputError(f"--gpu: got {gpu!r}; {graphs[0].source} is a CPU job's trace (gloo, no GPU kernels): give "
                         "the profile trainsim calibrate or validate fitted on that machine (PROFILE.json, validate "
                         "--out's profile.json)")
    given = [k for k, v in network.items() if v is not None]
    if given:
        raise InputError(f"--{given[0].replace('_', '-')}: got {network[given[0]]!r}; a CPU job's trace replays on "
                         "its own machine's topology (one process per device, joined by the profile's fitted link)")


def data_parallel_groups(graphs: dict[int, RankGraph], flag: str = "--data-parallel-size") -> tuple[int, int, list]:
    """(D, stride, groups) of the job's data-parallel groups (see the module doc); ``flag``
    is the what-if an error names."""
    colls = [n for g in graphs.values() for n in g.nodes
             if n.kind == "collective" and n.op in ("allreduce", "reducescatter", "allgather")]
    where = next(iter(graphs.values())).source if graphs else "replay"
    if not colls:
        raise InputError(f"{where}: {flag}: the trace has no all-reduce, reduce-scatter or all-gather "
                         "with its group and size; there are no gradient collectives to re-price")
    named = [n for n in colls if is_data_parallel_name(n.pg_name)]
    if named:
        groups = {n.group for n in named}
    else:  # the groups of the size that moves the most bytes
        by_size: dict[int, float] = {}
        for n in colls:
            by_size[len(n.group)] = by_size.get(len(n.group), 0.0) + n.nbytes
        size = max(by_size, key=lambda k: (by_size[k], k))
        groups = {n.group for n in colls if len(n.group) == size}
    size = max(len(g) for g in groups)
    big = sorted(g for g in groups if len(g) == size)
    strides = {g[1] - g[0] for g in big}
    if len(strides) != 1 or any(any(b - a != g[1] - g[0] for a, b in zip(g, g[1:])) for g in big):
        raise InputError(f"{where}: {flag}: the data-parallel groups {[list(g) for g in big[:3]]} "
                         "are not evenly strided; allowed: traces whose gradient groups are ranks g, g+s, ..., "
                         "g+(D-1)s")
    return size, strides.pop(), big


def scale_data_parallel(graphs: dict[int, RankGraph], world: int, new_dp: int) -> tuple[dict[int, RankGraph], int]:
    """The job with ``new_dp`` data-parallel replicas (see the module doc); returns the graphs
    and the new world size."""
    D, s, _ = data_parallel_groups(graphs)
    if world % (s * D):
        raise InputError(f"{next(iter(graphs.values())).source}: --data-parallel-size: world size {world} is not "
                         "a multiple of the data-parallel groups' "
                         f"size {D} x stride {s}")

    def split(r):
        return r % s, (r // s) % D, r // (s * D)

    def join(i, d, o):
        return i + s * (d + new_dp * o)

    outer = world // (s * D)
    out = {}
    for o in range(outer):
        for i in range(s):
            for d_new in range(new_dp):
                src = i + s * (d_new % D + D * o)
                g = graphs[src]

                def move(r, d_new=d_new):
                    ri, rd, ro = split(r)
                    return join(ri, d_new, ro)

                nodes = []
                for n in g.nodes:
                    if n.kind == "collective":
                        members = [split(r) for r in n.group]
                        if len(n.group) == D and len({(m[0], m[2]) for m in members}) == 1:
                            ri, _, ro = members[0]
                            n = n._replace(group=tuple(join(ri, d, ro) for d in range(new_dp)))
                        else:
                            n = n._replace(group=tuple(sorted(move(r) for r in n.group)))
                    elif n.kind in ("send", "recv"):
                        n = n._replace(peer=move(n.peer))
                    nodes.append(n)
                new_rank = join(i, d_new, o)
                out[new_rank] = RankGraph(new_rank, tuple(nodes), g.source, g.traced_step_s, dict(g.meta))
    return dict(sorted(out.items())), s * new_dp * outer


def replicas_of_gpus(graphs: dict[int, RankGraph], world: int, gpus: int, data_parallel_size: int | None) -> int:
    """The data-parallel replicas that make the traced job (``world`` GPUs) ``gpus`` GPUs:
    refused, naming ``--gpus``, unless ``gpus`` is a whole number of replicas and agrees with
    ``data_parallel_size`` where that is given too."""
    D, s, _ = data_parallel_groups(graphs, flag="--gpus")
    per = world // D if world % (s * D) == 0 else None
    if per is None:
        raise InputError(f"--gpus: got {gpus}; the traced world size {world} is not a multiple of the data-parallel "
                         f"groups' size {D} x stride {s}, so it cannot be grown by replicas")
    if gpus % per:
        raise InputError(f"--gpus: got {gpus}; expected a multiple of {per}, the GPUs of one data-parallel replica "
                         f"of the traced job ({world} GPUs as {D} replicas)")
    if data_parallel_size is not None and data_parallel_size != gpus // per:
        raise InputError(f"--gpus: got {gpus}; with --data-parallel-size {data_parallel_size} expected "
                         f"{data_parallel_size * per} ({per} GPU{'s' if per > 1 else ''} per replica), or leave one out")
    return gpus // per


def scale_gpu(graphs: dict[int, RankGraph], traced_profile, new_profile) -> dict[int, RankGraph]:
    """Kernels' durations on ``new_profile`` (see the module doc)."""
    def sustained(p, eff):
        return p.peak("bf16") * (eff or 1.0)

    compute = sustained(traced_profile, traced_profile.gemm_max_efficiency) / \
        sustained(new_profile, new_profile.gemm_max_efficiency)
    attn = sustained(traced_profile, traced_profile.attention_max_efficiency) / \
        sustained(new_profile, new_profile.attention_max_efficiency)
    memory = traced_profile.memory_rate() / new_profile.memory_rate()
    factor = {"gemm": compute, "attention": attn, "memory": memory, "kernel": memory}
    cache: dict = {}

    def shaped(shape) -> float:
        """A recorded GEMM's or attention's time ratio from the profiles' models."""
        if shape not in cache and len(shape) == 4:
            old, new = traced_profile, new_profile
            cache[shape] = (old.peak("bf16") * old.attention_efficiency(*shape)) / \
                (new.peak("bf16") * new.attention_efficiency(*shape))
        if shape not in cache:
            m, n, k, batch, dtype = shape
            if dtype not in traced_profile.peak_flops or dtype not in new_profile.peak_flops:
                dtype = "bf16"
            cache[shape] = (traced_profile.peak(dtype) * traced_profile.gemm_efficiency(m, n, k, batch, dtype)) / \
                (new_profile.peak(dtype) * new_profile.gemm_efficiency(m, n, k, batch, dtype))
        return cache[shape]

    out = {}
    for r, g in graphs.items():
        nodes = tuple(n._replace(duration_s=n.duration_s * (shaped(n.shape) if n.shape else factor[n.category]))
                      if n.kind == "compute" and n.category in factor else n for n in g.nodes)
        out[r] = RankGraph(r, nodes, g.source, g.traced_step_s, g.meta)
    return out


@dataclass(frozen=True)
class WhatIf:
    """What a replay changes of the traced job (each None: as traced; ``trainsim replay``'s
    flags of the same names): the GPU (a name or a profile .json), the cluster (``topology``,
    ``fabric``, ``oversubscription``, ``nodes``, ``gpus_per_node``) and the job's size
    (``data_parallel_size`` replicas, or ``gpus`` in all)."""

    gpu: str | None = None
    topology: str | None = None
    fabric: str | None = None
    oversubscription: float | None = None
    nodes: int | None = None
    data_parallel_size: int | None = None
    gpus_per_node: int | None = None
    gpus: int | None = None


def replay(graphs: list[RankGraph], what_if: WhatIf = WhatIf()) -> ReplayRun:
    """Replay the traced ranks ``graphs`` (see the module doc) as ``what_if`` says."""
    gpu, topology, fabric, oversubscription = what_if.gpu, what_if.topology, what_if.fabric, what_if.oversubscription
    nodes, data_parallel_size, gpus_per_node, gpus = (what_if.nodes, what_if.data_parallel_size,
                                                      what_if.gpus_per_node, what_if.gpus)
    from sim.engine.core import simulate
    from sim.engine.nccl import NcclModel
    from sim.inputs.resolve import profile_from_settings, topology_from_settings
    from sim.inputs.schema import RunSettings

    if not graphs:
        raise InputError("replay: no traces given")
    check_same_job(graphs)
    by_rank = {g.rank: g for g in graphs}
    world = graphs[0].meta.get("world_size") or (max(by_rank) + 1)
    if max(by_rank) >= world:
        g = by_rank[max(by_rank)]
        raise InputError(f"{g.source}: distributedInfo.rank: got {g.rank}; the job's world size is {world}")
    device = graphs[0].meta.get("device_name", "")
    traced_gpu = gpu_of_device(device)
    cpu = any(g.meta.get("cpu_trace") for g in graphs)
    if cpu:
        _check_cpu(graphs, gpu, topology=topology, fabric=fabric, oversubscription=oversubscription, nodes=nodes,
                   gpus_per_node=gpus_per_node)
    elif traced_gpu is None and gpu is None:
        raise InputError(f"{graphs[0].source}: deviceProperties: GPU {device or '(none)'!r} is not one trainsim has a "
                         "profile for; give --gpu (a100-80gb, h100-sxm, h200, b200, gb200, gb300 or a profile .json)")
    full, cloned = complete(by_rank, world)
    if gpus is not None and (gpus != world or data_parallel_size is not None):
        data_parallel_size = replicas_of_gpus(full, world, gpus, data_parallel_size)
    if data_parallel_size is not None:
        full, world = scale_data_parallel(full, world, data_parallel_size)
    values = {"gpu": gpu or traced_gpu}
    for key, v in (("topology", topology), ("fabric", fabric), ("oversubscription", oversubscription),
                   ("nodes", nodes), ("gpus_per_node", gpus_per_node)):
        if v is not None:
            values[key] = v
    settings = RunSettings.from_values(values)
    profile = profile_from_settings(settings.cluster)
    if gpu is not None and traced_gpu is not None and gpu != traced_gpu:
        traced_profile = profile_from_settings(RunSettings.from_values({"gpu": traced_gpu}).cluster)
        full = scale_gpu(full, traced_profile, profile)
    if cpu and profile.profiler_op_overhead_s:  # (the job without the profiler's cost per recorded op)
        from sim.replay.cpu import without_profiler

        full = {r: without_profiler(g, profile.profiler_op_overhead_s) for r, g in full.items()}
    if cpu:  # the machine as validate simulates it: a "gpu" per process, joined by the fitted link
        from sim.calibrate.validate import machine_topology, profile_link

        topo = machine_topology(world, profile, profile_link(profile))
    else:
        topo = topology_from_settings(settings.cluster, world, profile.name)
    replayed = to_program(full)
    replayed.cloned = cloned
    nccl = NcclModel.from_profile(profile).forcing("auto", "auto")
    # (measured kernels already ran slowed by the communication beside them; costed ones did not)
    sigma = profile.overlap_compute_slowdown if all(g.meta.get("costed") for g in graphs) else 0.0
    trace = simulate(replayed.program, topo, link_efficiency=profile.link_efficiencies(), fluid_collectives=True,
                     overlap_slowdown=sigma, nccl=nccl)
    from sim.replay.report import summarize_replay

    summary = summarize_replay(trace, replayed, graphs, profile, topo)
    summary["cpu_trace"] = cpu
    if cpu:  # (the profiler's cost taken off, on the traced ranks: sim.replay.cpu.without_profiler)
        traced_full = [full[g.rank] for g in graphs]
        summary["profiler_op_overhead_s"] = profile.profiler_op_overhead_s
        summary["profiler_removed_s"] = {str(g.rank): g.meta.get("profiler_removed_s", 0.0) for g in traced_full}
        summary["profiler_events"] = {str(g.rank): sum(n.recorded_ops for n in g.nodes) for g in traced_full}
    # (--gpu is a what-if only when the trace names its own GPU; else it is the GPU the trace ran on)
    scaled = gpu if traced_gpu is not None and gpu != traced_gpu else None
    summary["what_if"] = {k: v for k, v in (("gpu", scaled), ("gpus", gpus), ("topology", topology),
                                            ("nodes", nodes), ("gpus_per_node", gpus_per_node), ("fabric", fabric),
                                            ("oversubscription", oversubscription),
                                            ("data_parallel_size", data_parallel_size)) if v is not None}
    return ReplayRun(trace, summary, replayed, profile, topo)
