"""Mixed clusters: which GPU type each rank runs on.

A topology may hold GPUs of several types: a cluster file of several node kinds
(``sim.inputs.topology_mixed``) or a graph file whose GPU devices name a
``gpu_profile``. Each GPU's profile is its device's ``gpu_profile`` (a preset name or a
profile .json), or the run's ``--gpu`` where the device names none. When the plan's GPUs
are of more than one type, ``MixedGpus`` says which runs where; every GPU's compute is
then priced on its own profile (``sim.program.stage_balance``), every GPU is simulated, and
groups that span types (a data-parallel group across A100 and H100 nodes) wait for their
slowest member as any group waits for its last.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.inputs.hardware import HardwareProfile, load_profile
from sim.inputs.topology import Topology


@dataclass(frozen=True)
class MixedGpus:
    """The GPU types of a plan's ranks on a mixed cluster."""

    profiles: dict[str, HardwareProfile]
    """Each type's profile, by name, in the order first met (rank 0's first)."""
    of_rank: tuple[str, ...]
    """The type of each rank 0..world-1."""

    def counts(self) -> dict[str, int]:
        """GPUs of each type."""
        out = dict.fromkeys(self.profiles, 0)
        for name in self.of_rank:
            out[name] += 1
        return out

    def stage_types(self, plan) -> list[tuple[str, ...]]:
        """The types each pipeline stage's ranks run on (one, or several when a stage's
        tp x dp GPUs span node kinds)."""
        out: list[dict] = [{} for _ in range(plan.pp)]
        for r, name in enumerate(self.of_rank):
            out[plan.coords(r)[1]][name] = None
        return [tuple(s) for s in out]


def mixed_gpus(topology: Topology, world: int, default: HardwareProfile) -> MixedGpus | None:
    """The types of ranks 0..world-1 of ``topology`` (``default`` where a GPU names none),
    or None when they are all of one type."""
    nodes = topology.graph.nodes
    names = tuple(nodes[topology.gpu(r)].get("gpu_profile") or default.name for r in range(world))
    kinds = list(dict.fromkeys(names))
    if len(kinds) < 2:
        return None
    profiles = {n: default if n == default.name else load_profile(n, flag=f"topology {topology.name}: gpu_profile")
                for n in kinds}
    return MixedGpus(profiles, names)
