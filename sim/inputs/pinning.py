"""Parallel groups a user pins inside one NVLink domain (``--pin-to-nvlink-domain tp,ep``).

An NVLink domain is a node: eight GPUs in a DGX, or a whole GB200 NVL72 rack. The placement
(``sim.inputs.placement``) keeps tensor parallelism innermost, so tp, cp and ep groups stay
inside a domain wherever their sizes allow; where they do not (tp 16 on racks of 72 GPUs: the
fifth group straddles two racks) the run still goes ahead, over InfiniBand. A user who knows
that a group must never leave NVLink pins it: ``run`` then refuses a plan where one of its
groups crosses domains, and ``search`` leaves such plans out.

Node k holds ranks k·g … (k+1)·g − 1 for g GPUs a node, as every built topology numbers them.
"""

from __future__ import annotations

from sim.errors import InputError

PINNABLE = ("tp", "cp", "ep", "etp")
"""The groups that can be pinned: tensor, context, expert and expert-tensor parallelism."""

FLAG = "--pin-to-nvlink-domain"


def parse_pinned(value) -> tuple[str, ...]:
    """The pinned groups in ``PINNABLE`` order, each once, from a list of names or a string
    of names separated by commas or spaces (None: none pinned)."""
    if value is None:
        return ()
    words = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if words is None or not all(isinstance(w, str) for w in words):
        raise InputError(field=FLAG, value=value, allowed=f"expected group names, of {', '.join(PINNABLE)}",
                         setting="pin_to_nvlink_domain")
    names = [n for w in words for n in w.replace(",", " ").split()]
    for n in names:
        if n not in PINNABLE:
            raise InputError(field=FLAG, value=n, allowed=f"allowed: {', '.join(PINNABLE)}", setting="pin_to_nvlink_domain")
    if not names:
        raise InputError(field=FLAG, value=value, allowed=f"expected at least one of {', '.join(PINNABLE)}",
                         setting="pin_to_nvlink_domain")
    return tuple(d for d in PINNABLE if d in names)


def _group_of(plan, dim: str):
    """``rank -> its dim group`` for ``plan`` (None when the plan has no such group)."""
    if dim == "tp":
        return plan.tp_group
    if dim == "cp":
        return plan.cp_group
    from sim.inputs.experts import Folding

    fold = Folding(plan)
    return fold.ep_group if dim == "ep" else fold.etp_group


def _size(plan, dim: str) -> int:
    return {"tp": plan.tp, "cp": plan.cp, "ep": plan.ep, "etp": plan.etp_size}[dim]


def crossing(plan, dims, gpus_per_node: int) -> tuple[str, tuple[int, ...]] | None:
    """The first pinned group of ``plan`` that spans more than one node of ``gpus_per_node``
    GPUs, as ``(dim, ranks)``; None when every group of ``dims`` stays inside one."""
    key = (plan.tp, plan.pp, plan.dp, plan.cp, plan.ep, plan.etp_size, plan.placement)
    return _crossing(key, tuple(dims), gpus_per_node, plan)


_CACHE: dict = {}


def _crossing(key, dims, gpus_per_node, plan):
    """``crossing`` for the layout ``key`` (plans that differ only in batch, recompute or
    schedule share it; a search asks of thousands of them)."""
    memo = (key, dims, gpus_per_node)
    if memo not in _CACHE:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        _CACHE[memo] = _first_crossing(plan, dims, gpus_per_node)
    return _CACHE[memo]


def _first_crossing(plan, dims, gpus_per_node):
    for dim in dims:
        if _size(plan, dim) <= 1:
            continue
        group_of, seen = _group_of(plan, dim), set()
        for rank in range(plan.world_size):
            if rank in seen:
                continue
            group = tuple(group_of(rank))
            seen.update(group)
            if len({r // gpus_per_node for r in group}) > 1:
                return dim, tuple(sorted(group))
    return None


def _ranks(group: tuple[int, ...]) -> str:
    if group == tuple(range(group[0], group[-1] + 1)):
        return f"ranks {group[0]}-{group[-1]}"
    shown = ", ".join(map(str, group[:4]))
    return f"ranks {shown}{', ...' if len(group) > 4 else ''}"


def check_pinned(plan, dims, gpus_per_node: int, where: str) -> None:
    """Refuse ``plan`` when a group of ``dims`` crosses NVLink domains of ``gpus_per_node``
    GPUs (``where`` names the cluster in the message)."""
    found = crossing(plan, dims, gpus_per_node) if dims else None
    if found is None:
        return
    dim, group = found
    nodes = sorted({r // gpus_per_node for r in group})
    spans = f"domains {nodes[0]} and {nodes[1]}" if len(nodes) == 2 else f"{len(nodes)} domains"
    raise InputError(f"{FLAG}: got {','.join(dims)}; {dim} {_size(plan, dim)} puts {_ranks(group)} on {spans} "
                     f"({gpus_per_node} GPUs each {where}); allowed: {dim} groups inside one domain (sizes "
                     f"whose groups divide {gpus_per_node}, or fewer GPUs a domain with --gpus-per-node)",
                     setting="pin_to_nvlink_domain")
