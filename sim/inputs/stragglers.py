"""Stragglers and degraded links: slow GPUs and slow links in one iteration.

Real clusters are not symmetric: a GPU that runs hot clocks down, a NIC trains at half
its line rate, a cable flaps. Two kinds of per-device effect are described here and
resolved against a topology before anything is simulated:

- a **slow GPU** runs every compute kernel ``f`` times as long (f > 0; 1.3 is 30% slower,
  below 1 faster than its profile), written ``GPU=FACTOR`` where GPU is a device id of
  the topology (``node3/gpu5``), ``rankN`` or a plain rank number;
- a **degraded link** carries ``f`` times its bandwidth (0 < f <= 1) in both directions,
  written ``A-B=FACTOR`` for the link between devices A and B
  (``node0/gpu2-node0/nvswitch``), or ``DEVICE=FACTOR`` for every link of a device (a
  NIC's uplink and its PCIe links, a GPU's NVLink and PCIe links, a switch's ports).

Several are separated by commas (``node0/gpu1=1.3,node1/gpu4=1.1``); an experiment
file's ``[stragglers]`` table may give a list of strings instead. Slow GPUs may also be
**drawn**: ``fraction`` of the plan's GPUs (round(fraction x GPUs), at least one when
fraction > 0), chosen uniformly without replacement by a seeded generator (numpy's
PCG64), each with a factor from ``slowdown``: a number (every drawn GPU that slow),
``uniform:LO:HI`` or ``lognormal:MEDIAN:SIGMA`` (median x exp(sigma x Z), Z standard
normal). The same seed gives the same GPUs and factors; a GPU named explicitly keeps its
explicit factor.

The engine applies both (``sim.engine.gpu_speed``, and a topology whose links carry
less: ``degrade``); ``sim.results.stragglers`` reports who set the pace.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from sim.errors import InputError
from sim.inputs.topology import Topology

DISTRIBUTIONS = ("uniform", "lognormal")
"""Slowdown distributions of drawn stragglers (besides a plain number)."""
SLOWDOWN_FORMS = "FACTOR, uniform:LO:HI or lognormal:MEDIAN:SIGMA"


def _number(text: str):
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _items(value) -> list[str]:
    """A comma-separated string, or a list of strings (each may hold commas), as items."""
    parts = value if isinstance(value, (list, tuple)) else [value]
    return [p.strip() for part in parts for p in str(part).split(",") if p.strip()]


def parse_factors(value, field_name: str, link: bool) -> list[tuple[str, float]]:
    """``NAME=FACTOR`` items of a setting (a comma-separated string or a list of strings),
    each checked: a name, and a factor > 0 (in (0, 1] for links)."""
    allowed = ("expected LINK=FACTOR items (LINK: A-B or a device; FACTOR in (0, 1]: the bandwidth kept)"
               if link else "expected GPU=FACTOR items (GPU: a device id such as node0/gpu3, or a rank; "
                            "FACTOR > 0: how many times longer its compute takes)")
    if isinstance(value, (list, tuple)):
        if not all(isinstance(v, str) for v in value):
            raise InputError(field=field_name, value=value, allowed=f"{allowed}, as a string or a list of strings")
    elif not isinstance(value, str):
        raise InputError(field=field_name, value=value, allowed=f"{allowed}, as a string or a list of strings")
    out = []
    items = _items(value)
    if not items:
        raise InputError(field=field_name, value=value, allowed=allowed)
    for item in items:
        name, eq, factor = item.rpartition("=")
        f = _number(factor) if eq else None
        if not name.strip() or f is None:
            raise InputError(field=field_name, value=item, allowed=allowed)
        if not f > 0 or (link and f > 1):
            why = "a bandwidth factor in (0, 1]" if link else "a slowdown factor > 0 (1.3: 30% slower)"
            raise InputError(field=field_name, value=item, allowed=f"expected {why}")
        out.append((name.strip(), f))
    return out


def parse_slowdown(value, field_name: str = "straggler_slowdown") -> tuple[str, tuple[float, ...]]:
    """A drawn straggler's slowdown: ``("fixed", (f,))``, ``("uniform", (lo, hi))`` or
    ``("lognormal", (median, sigma))``."""
    text = str(value).strip() if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    bad = InputError(field=field_name, value=value, allowed=f"expected {SLOWDOWN_FORMS} (factors > 0, LO <= HI, SIGMA >= 0)")
    if text is None:
        raise bad
    kind, _, rest = text.partition(":")
    if not rest:
        f = _number(text)
        if f is None or not f > 0:
            raise bad
        return "fixed", (f,)
    params = [_number(p) for p in rest.split(":")]
    if kind not in DISTRIBUTIONS or len(params) != 2 or None in params:
        raise bad
    a, b = params
    if kind == "uniform" and not 0 < a <= b or kind == "lognormal" and not (a > 0 and b >= 0):
        raise bad
    return kind, (a, b)


def normalized(value, field_name: str, link: bool) -> str:
    """The canonical string of a factors setting (checked): ``name=factor`` items joined
    by commas, as the settings keep it (a string, whatever form it was given in)."""
    return ",".join(f"{n}={f:g}" for n, f in parse_factors(value, field_name, link))


class Checked:
    """An argparse ``type=`` for ``--slow-gpu``, ``--degrade-link`` and
    ``--straggler-slowdown``: the value checked as an experiment file's is (names are
    checked against the topology later), kept as the string given (factors in canonical form)."""

    def __init__(self, field_name: str, link: bool | None = None):
        self.field_name, self.link = field_name, link
        self.__name__ = "value"

    def __call__(self, text: str) -> str:
        if self.link is None:
            parse_slowdown(text, self.field_name)
            return text
        return normalized(text, self.field_name, self.link)


# ------------------------------------------------------------------ against a topology
@dataclass(frozen=True)
class Stragglers:
    """Slow GPUs and degraded links of one run, resolved against its topology."""

    slow: dict[int, float] = field(default_factory=dict)
    """Rank -> compute slowdown factor."""
    links: dict[tuple[str, str], float] = field(default_factory=dict)
    """Link (its two devices, sorted) -> the fraction of its bandwidth it keeps."""
    drawn: tuple[int, ...] = ()
    """The ranks whose factor was drawn (``fraction``, ``slowdown``, ``seed``)."""
    draw: dict | None = None
    """What was drawn from: fraction, slowdown, seed (None: nothing drawn)."""

    def __bool__(self) -> bool:
        return bool(self.slow or self.links)


def resolve_stragglers(s, topology: Topology, world: int) -> Stragglers | None:
    """The ``Stragglers`` that simulation settings ``s`` (``SimulationSettings``) describe on
    ``topology`` for a plan of ``world`` GPUs (ranks 0..world-1), or None when none."""
    slow: dict[int, float] = {}
    if s.straggler_fraction:
        if s.straggler_slowdown is None:
            raise InputError(f"straggler_fraction: got {s.straggler_fraction!r}; drawn stragglers need "
                             f"straggler_slowdown ({SLOWDOWN_FORMS})")
        slow = draw_slow_gpus(world, s.straggler_fraction, parse_slowdown(s.straggler_slowdown), s.straggler_seed)
    drawn = tuple(sorted(slow))
    named: dict[int, str] = {}
    if s.slow_gpu:
        for name, f in parse_factors(s.slow_gpu, "slow_gpu", link=False):
            r = gpu_rank(topology, name, world)
            if r in named:
                raise InputError(f"slow_gpu: got {name!r} and {named[r]!r}, both rank {r}; name each GPU once")
            named[r] = name
            slow[r] = f
    links: dict[tuple[str, str], float] = {}
    if s.degrade_link:
        for name, f in parse_factors(s.degrade_link, "degrade_link", link=True):
            for edge in links_named(topology, name):
                links[edge] = min(f, links.get(edge, 1.0))  # (named twice: the lower factor)
    if not slow and not links:
        return None
    draw = None
    if s.straggler_fraction:
        draw = {"fraction": s.straggler_fraction, "slowdown": str(s.straggler_slowdown), "seed": s.straggler_seed,
                "gpus": len(drawn)}
    return Stragglers(dict(sorted(slow.items())), dict(sorted(links.items())),
                      tuple(r for r in drawn if r not in named), draw)


def draw_slow_gpus(world: int, fraction: float, slowdown: tuple[str, tuple[float, ...]], seed: int) -> dict[int, float]:
    """round(fraction x world) ranks (at least one when fraction > 0), each with a factor
    from ``slowdown`` (``parse_slowdown``), drawn with numpy's PCG64 seeded by ``seed``."""
    import numpy as np

    k = min(world, max(1, round(fraction * world))) if fraction > 0 else 0
    rng = np.random.default_rng(seed)
    ranks = np.sort(rng.choice(world, size=k, replace=False)).tolist()
    kind, p = slowdown
    if kind == "fixed":
        factors = [p[0]] * k
    elif kind == "uniform":
        factors = rng.uniform(p[0], p[1], size=k).tolist()
    else:
        factors = (p[0] * np.exp(p[1] * rng.standard_normal(k))).tolist()
    return dict(zip(ranks, factors))


def gpu_rank(topology: Topology, name: str, world: int) -> int:
    """The rank of GPU ``name``: a device id of ``topology``, ``rankN`` or ``N``; it must
    be one of the plan's ``world`` GPUs."""
    g = topology.graph
    m = re.fullmatch(r"(?:rank)?(\d+)", name)
    if name in g and g.nodes[name].get("kind") == "gpu":
        r = g.nodes[name]["rank"]
    elif m and name not in g:
        r = int(m.group(1))
    else:
        raise InputError(f"slow_gpu: got {name!r}; not a GPU of topology {topology.name}: expected "
                         f"{_gpu_names(topology, world)}")
    if r >= world:
        raise InputError(f"slow_gpu: got {name!r} (rank {r}); the plan runs on ranks 0..{world - 1}: expected "
                         f"{_gpu_names(topology, world)}")
    return r


def _gpu_names(topology: Topology, world: int) -> str:
    return f"{topology.gpu(0)} .. {topology.gpu(world - 1)}, rankN or N (0..{world - 1})"


def links_named(topology: Topology, name: str) -> list[tuple[str, str]]:
    """The links ``name`` stands for: every link of a device, or the link ``A-B``
    (a name with several dashes is split where both sides are devices joined by a link)."""
    g = topology.graph
    if name in g:
        return sorted(tuple(sorted((name, v))) for v in g.neighbors(name))
    found = []
    for m in re.finditer("-", name):
        a, b = name[:m.start()], name[m.end():]
        if a in g and b in g and g.has_edge(a, b):
            found.append(tuple(sorted((a, b))))
    if len(found) == 1:
        return found
    if len(found) > 1:
        raise InputError(f"degrade_link: got {name!r}; it names {len(found)} links "
                         f"({', '.join('-'.join(e) for e in found)}); rename the devices")
    raise InputError(f"degrade_link: got {name!r}; not a device or link of topology {topology.name}: expected "
                     f"DEVICE or DEVICE-DEVICE (two devices joined by a link), devices such as "
                     f"{', '.join(device_patterns(topology))}")


def device_patterns(topology: Topology, most: int = 8) -> list[str]:
    """The topology's device ids with each number written N (``nodeN/gpuN``, ``spineN``), with
    one example each: what names look like, for error messages."""
    seen: dict[str, str] = {}
    for n in sorted(map(str, topology.graph.nodes)):
        seen.setdefault(re.sub(r"\d+", "N", n), n)
    shown = [p if p == ex else f"{p} (e.g. {ex})" for p, ex in sorted(seen.items())]
    return shown[:most] + ([f"... ({len(shown) - most} more kinds)"] if len(shown) > most else [])


def degrade(topology: Topology, links: dict[tuple[str, str], float]) -> Topology:
    """A copy of ``topology`` whose ``links`` carry their factor of their bandwidth (both
    directions); routes, the network and NCCL's tuner then see the slower links."""
    if not links:
        return topology
    g = topology.graph.copy()
    for (a, b), f in links.items():
        g.edges[a, b]["bandwidth_Bps"] = g.edges[a, b]["bandwidth_Bps"] * f
    return Topology(g, topology.name, topology.pxn_level)


def per_gpu_fidelity(fidelity: str, what: str = "slow GPUs and degraded links") -> tuple[str, str]:
    """The fidelity a run with per-GPU effects (``what``: stragglers, GPUs of several types)
    takes, and why: every GPU, since those effects are not shared by the GPUs reduced
    fidelity lets one of them stand for."""
    if fidelity == "reduced":
        raise InputError(f"fidelity: got 'reduced'; {what} are per-GPU effects that reduced fidelity (one GPU "
                         "per stage standing for the others) cannot show: use full or auto")
    if fidelity == "auto":
        return "full", f"auto: {what} need every GPU simulated"
    return fidelity, f"asked for ({fidelity})"
