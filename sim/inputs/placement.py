"""Which GPU does what: global ranks laid out over the tp, pp and dp dimensions.

A 3D plan cuts ``world = tp · pp · dp`` GPUs into a grid. A *placement* is the order of
the three dimensions from innermost (consecutive global ranks) to outermost, written
like ``"tp-pp-dp"``. With sizes ``(n₀, n₁, n₂)`` in that order, rank r has coordinates

    c₀ = r mod n₀,   c₁ = ⌊r / n₀⌋ mod n₁,   c₂ = ⌊r / (n₀·n₁)⌋

so the innermost dimension's groups are blocks of n₀ consecutive ranks, the middle one's
are strided by n₀, the outermost's by n₀·n₁. Because cluster nodes own blocks of
consecutive ranks (GPUs 0–7 on node 0, ...), the innermost dimension is the one that
stays on NVLink: with ``tp`` innermost and tp ≤ GPUs per node (and dividing it), every
tensor-parallel group lives inside one node.

Megatron-LM builds its groups from the order string ``"tp-cp-ep-dp-pp"`` (tp innermost,
then dp, then pp outermost: ``RankGenerator`` in ``megatron/core/parallel_state.py``);
trainsim's default is ``"tp-pp-dp"`` (pipeline stages of a replica next to each other,
replicas outermost), and any of the six permutations can be asked for.

Everything here is a pure function of the placement string and the sizes; ``ParallelPlan``
exposes it as ``coords``, ``rank`` and ``tp_group``/``pp_group``/``dp_group``.
"""

from __future__ import annotations

from functools import lru_cache

from sim.errors import require

DIMS = ("tp", "pp", "dp")
DEFAULT_PLACEMENT = "tp-pp-dp"


def parse_placement(text) -> tuple[str, ...]:
    """``"tp-pp-dp"`` -> ``("tp", "pp", "dp")``: the dimensions innermost first."""
    order = tuple(text.split("-")) if isinstance(text, str) else ()
    require(sorted(order) == sorted(DIMS), "plan: placement", text,
            "expected tp, pp and dp in some order, innermost first, joined by '-' "
            "(e.g. tp-pp-dp, tp-dp-pp)")
    return order


def _strides(order: tuple, sizes: dict) -> dict:
    out, stride = {}, 1
    for dim in order:
        out[dim] = stride
        stride *= sizes[dim]
    return out


def _check_rank(rank, sizes: dict) -> None:
    world = sizes["tp"] * sizes["pp"] * sizes["dp"]
    require(isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < world, "rank", rank,
            f"expected 0..{world - 1} (world = dp x pp x tp = {sizes['dp']} x {sizes['pp']} x {sizes['tp']})")


def coords(rank: int, order: tuple, sizes: dict) -> dict:
    """``{"tp": i, "pp": j, "dp": k}`` of global ``rank``."""
    _check_rank(rank, sizes)
    strides = _strides(order, sizes)
    return {d: rank // strides[d] % sizes[d] for d in DIMS}


def rank_of(index: dict, order: tuple, sizes: dict) -> int:
    """The global rank at ``index`` (``{"tp": i, "pp": j, "dp": k}``)."""
    for d in DIMS:
        v = index[d]
        require(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < sizes[d], d, v,
                f"expected a {d} index 0..{sizes[d] - 1}")
    strides = _strides(order, sizes)
    return sum(index[d] * strides[d] for d in DIMS)


def group(rank: int, dim: str, order: tuple, sizes: dict) -> tuple:
    """Global ranks that share every coordinate of ``rank`` but ``dim``, by ``dim`` index."""
    require(dim in DIMS, "dim", dim, f"allowed: {', '.join(DIMS)}")
    c = coords(rank, order, sizes)
    stride = _strides(order, sizes)[dim]
    base = rank - c[dim] * stride
    return tuple(base + i * stride for i in range(sizes[dim]))


def groups(dim: str, order: tuple, sizes: dict) -> tuple:
    """Every group along ``dim``, ordered by its first member."""
    world = sizes["tp"] * sizes["pp"] * sizes["dp"]
    stride = _strides(order, sizes)[dim]
    firsts = [r for r in range(world) if r // stride % sizes[dim] == 0]
    return tuple(group(r, dim, order, sizes) for r in firsts)


def max_nodes_spanned(dim: str, order: tuple, sizes: dict, gpus_per_node: int) -> int:
    """The most nodes any ``dim`` group touches when node k holds ranks
    k·gpus_per_node … (k+1)·gpus_per_node − 1 (1: every group stays inside a node)."""
    require(isinstance(gpus_per_node, int) and gpus_per_node > 0, "gpus_per_node", gpus_per_node,
            "expected an integer > 0")
    return _max_nodes_spanned(dim, order, tuple(sorted(sizes.items())), gpus_per_node)


@lru_cache(maxsize=1024)
def _max_nodes_spanned(dim: str, order: tuple, sizes: tuple, gpus_per_node: int) -> int:
    """``max_nodes_spanned`` of a layout, remembered: a search asks it of thousands of plans
    that share a few layouts, and it walks every group."""
    return max(len({r // gpus_per_node for r in g}) for g in groups(dim, order, dict(sizes)))
