"""What GPU time costs: a price per GPU-hour, for one GPU type or each, and the cost of a
run's iterations and tokens at that price.

The price comes from ``--gpu-hour-price`` (``gpu_hour_price`` in ``[cluster]``): one
number in US dollars for every GPU (``2.5``), or one per GPU type
(``h100-sxm=2.5,b200=4.0``, by profile name), or from the GPU profile's own
``gpu_hour_price_usd``; the flag wins. Rental and amortized prices vary too much for a
preset to carry one, so none does. With every GPU of the run priced, the summary gives

    cost per iteration      = iteration time / 3600 s x sum over GPUs of their price per hour
    cost per million tokens = cost per iteration / tokens per iteration x 1e6

and ``compare --rank-by cost`` (and ``search``'s, ``sweep``'s) ranks plans by the second.
"""

from __future__ import annotations

from dataclasses import replace

from sim.errors import InputError

ALLOWED = ("expected US dollars per GPU-hour > 0 (e.g. 2.5), or a price per GPU type "
           "(e.g. h100-sxm=2.5,b200=4.0)")


def parse_prices(value, field: str = "gpu_hour_price") -> dict[str | None, float]:
    """``{None: price}`` for one price for every GPU, or ``{gpu name: price}``; a value that is
    neither is an ``InputError`` naming ``field``, the value and what is allowed."""
    def refuse():
        return InputError(field=field, value=value, allowed=ALLOWED, setting="gpu_hour_price")

    if isinstance(value, bool):
        raise refuse()
    if isinstance(value, (int, float)):
        if not 0 < value < float("inf"):
            raise refuse()
        return {None: float(value)}
    if not isinstance(value, str) or not value.strip():
        raise refuse()
    out: dict[str | None, float] = {}
    for part in value.split(","):
        name, eq, price = part.strip().rpartition("=")
        if eq and not name.strip():
            raise refuse()
        try:
            usd = float(price.strip().lstrip("$"))
        except ValueError:
            raise refuse() from None
        if not 0 < usd < float("inf"):
            raise refuse()
        key = name.strip() if eq else None
        if key in out or (key is None and len(value.split(",")) > 1):
            raise refuse()
        out[key] = usd
    return out


class _PriceText:
    """The setting's type: ``PRICE(text)`` is the flag's value (a number stays a number, a list
    of prices stays text); ``PRICE.allowed(value)`` what a value from a file or the API is
    refused for (None when allowed), so that an experiment file's line is named."""

    def __call__(self, text: str):
        try:
            return float(text)
        except ValueError:
            return text

    def allowed(self, value) -> str | None:
        try:
            parse_prices(value)
        except InputError as exc:
            return exc.allowed
        return None


PRICE = _PriceText()


def priced(profile, prices: dict[str | None, float] | None, field: str = "--gpu-hour-price"):
    """``profile`` with the price ``prices`` give its GPU type (its own ``gpu_hour_price_usd``
    when they give none). Per-type prices that name no price for it, where the profile has
    none either, are an ``InputError`` naming the type."""
    if not prices:
        return profile
    usd = prices.get(profile.name, prices.get(None))
    if usd is None:
        if profile.gpu_hour_price_usd is not None:
            return profile
        listed = ", ".join(f"{k}={v:g}" for k, v in prices.items())
        raise InputError(field=field, value=listed, setting="gpu_hour_price", shown=listed,
                         allowed=f"no price for {profile.name}, a GPU of this run (add {profile.name}=USD)")
    return replace(profile, gpu_hour_price_usd=usd)


def run_cost(profiles_and_counts, iteration_time_s: float, tokens: float) -> dict:
    """``cost_per_iteration_usd`` and ``cost_per_million_tokens_usd`` of an iteration on GPUs
    given as (profile, how many) pairs; both None unless every GPU has a price."""
    prices = [(p.gpu_hour_price_usd, n) for p, n in profiles_and_counts]
    if not prices or any(usd is None for usd, _ in prices):
        return {"cost_per_iteration_usd": None, "cost_per_million_tokens_usd": None}
    per_iteration = iteration_time_s / 3600.0 * sum(usd * n for usd, n in prices)
    return {"cost_per_iteration_usd": per_iteration,
            "cost_per_million_tokens_usd": per_iteration / tokens * 1e6 if tokens else None}


def cost_line(summary: dict) -> str | None:
    """The cost line ``trainsim run`` prints (None when the GPUs have no price)."""
    c = summary.get("cost_per_iteration_usd")
    if c is None:
        return None
    return f"  cost               {_usd(c):>12}   {cost_text(summary, first=False)}"


def cost_text(summary: dict, first: bool = True) -> str | None:
    """``$X per iteration; $Y per million tokens (Z GPU-hours per iteration)`` of a summary's
    cost figures (``trainsim estimate``'s line; without ``$X`` when not ``first``), None
    when the GPUs have no price."""
    c = summary.get("cost_per_iteration_usd")
    if c is None:
        return None
    return (f"{_usd(c) + ' ' if first else ''}per iteration; {_usd(summary['cost_per_million_tokens_usd'])} per "
            f"million tokens ({summary['gpu_hours_per_iteration']:.4g} GPU-hours per iteration)")


def _usd(x: float) -> str:
    return f"${x:,.2f}" if x >= 1 else f"${x:.4g}"
