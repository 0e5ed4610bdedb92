"""Megatron-LM's split of the transformer layers over (virtual) pipeline stages
(``sim.inputs.plan`` explains the rules; ``ParallelPlan.stage_layers`` calls this)."""

from __future__ import annotations

import math

from sim.errors import InputError, require

FIRST = "first_stage_layers (--decoder-first-pipeline-num-layers)"
LAST = "last_stage_layers (--decoder-last-pipeline-num-layers)"
EMB = "account_for_embedding (--account-for-embedding-in-pipeline-split)"
LOSS = "account_for_loss (--account-for-loss-in-pipeline-split)"
SPLIT = "layer_split (--layer-split)"


def check_layer_split(plan) -> None:
    """``plan.layer_split``: pp integers >= 1, each a multiple of vpp, and no other uneven
    option beside it."""
    split = plan.layer_split
    text = ",".join(map(str, split)) if isinstance(split, (tuple, list)) else split
    require(isinstance(split, tuple) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                              for n in split), f"plan: {SPLIT}", text,
            "expected transformer layers per pipeline stage, integers >= 1 separated by commas")
    require(len(split) == plan.pp, f"plan: {SPLIT}", text,
            f"has {len(split)} entries; expected one per pipeline stage (pp = {plan.pp})")
    require(all(n % plan.vpp == 0 for n in split), f"plan: {SPLIT}", text,
            f"each stage's layers must be a multiple of vpp = {plan.vpp} (its chunks get the same layers)")
    others = [f for f, on in ((FIRST, plan.first_stage_layers is not None), (LAST, plan.last_stage_layers is not None),
                              (EMB, plan.account_for_embedding), (LOSS, plan.account_for_loss)) if on]
    require(not others, f"plan: {SPLIT}", text, f"cannot be combined with {', '.join(others)}")


def divisors_text(n: int, limit: int = 8) -> str:
    """The ``limit`` smallest divisors of ``n`` above 1, for messages: divisors up to
    sqrt(n) (at most a million tried, so a typo'd layer count of 1e11 does not hang)
    and their partners."""
    small = [d for d in range(2, min(math.isqrt(n), 10**6) + 1) if n % d == 0]
    large = sorted({n // d for d in small} | ({n} if n > 1 else set()))
    ds = sorted(set(small) | set(large))[:limit]
    return ", ".join(map(str, ds)) or "none"


def split_layers(num_layers: int, pp: int, vpp: int = 1, first: int | None = None,
                 last: int | None = None, account_for_embedding: bool = False,
                 account_for_loss: bool = False, name: str = "the model", split: tuple | None = None) -> tuple:
    """Layers per virtual stage (index ``chunk·pp + pp_rank``), Megatron-LM's split
    (see the module doc), or ``split`` (layers per pipeline rank, ``--layer-split``); an
    ``InputError`` naming the flag when it cannot be done."""
    L, p, v = num_layers, pp, vpp
    if split is not None:
        require(sum(split) == L, f"plan: {SPLIT}", ",".join(map(str, split)),
                f"adds up to {sum(split)}; the {p} stages must hold the {L} layers of {name}")
        return tuple(split[r] // v for _ in range(v) for r in range(p))
    if first is None and last is None and not (account_for_embedding or account_for_loss):
        require(L % (p * v) == 0, "plan: pp x vpp", f"{p} x {v}",
                f"must divide num_layers {L} of {name} (pp x vpp of {divisors_text(L)} would); or split "
                "unevenly with --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers "
                "or --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split")
        return (L // (p * v),) * (p * v)
    if first is None and last is None:
        extra = int(account_for_embedding) + int(account_for_loss)
        total = L + extra
        field = " and ".join(f for f, on in ((EMB, account_for_embedding), (LOSS, account_for_loss)) if on)
        require(total % (p * v) == 0, f"plan: {field}", True,
                f"num_layers {L} + {extra} = {total} must be a multiple of pp x vpp = {p} x {v} = {p * v}; "
                f"pp x vpp of {divisors_text(total)} would divide")
        layers = [total // (p * v)] * (p * v)
        if account_for_embedding:
            layers[0] -= 1
        if account_for_loss:
            layers[-1] -= 1
        require(min(layers) >= 0, f"plan: {field}", True,
                f"the first/last virtual stage has no layer to give up ({total} layers over {p * v} stages)")
        return tuple(layers)
    n_first, n_last = first or 0, last or 0
    rest = L - n_first - n_last
    middle = p - (first is not None) - (last is not None)
    flag = FIRST if first is not None else LAST
    given = first if first is not None else last
    require(rest >= 0, f"plan: {flag}", given,
            f"first + last stage layers {n_first} + {n_last} exceed num_layers {L} of {name}")
    if middle == 0:
        require(rest == 0, f"plan: {flag}", given,
                f"with pp = {p} there are no middle stages, so first + last stage layers "
                f"({n_first} + {n_last}) must add up to num_layers {L}")
        per_mid = 0
    else:
        if rest % (middle * v):
            fixed = n_last if first is not None else n_first
            ok = [n for n in range(v, L - fixed + 1, v) if (L - fixed - n) % (middle * v) == 0]
            ok = sorted(sorted(ok, key=lambda n: abs(n - given))[:4])
            raise InputError(
                f"plan: {flag}: got {given!r}; the remaining {rest} of {L} layers must split evenly over "
                f"the {middle} middle stage(s){f' x vpp {v} chunks' if v > 1 else ''} "
                f"(a multiple of {middle * v}); {', '.join(map(str, ok)) or 'no value'} would divide")
        per_mid = rest // middle
    per_rank = [per_mid] * p
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    return tuple(per_rank[r] // v for _ in range(v) for r in range(p))


def parse_layer_split(value) -> tuple[int, ...] | str | None:
    """``--layer-split``: "10,10,12" as a tuple; "auto" as it is (``sim.session`` balances the
    stages once it knows their GPUs: ``sim.program.mixed``)."""
    if value is None or value == "auto":
        return value
    parts = [p.strip() for p in str(value).split(",")]
    require(all(p.isdigit() for p in parts), "--layer-split", value, setting="layer_split", allowed=
            "expected transformer layers per pipeline stage, integers separated by commas (10,10,12), or auto")
    return tuple(int(p) for p in parts)
