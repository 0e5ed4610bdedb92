"""Routing: how many tokens each expert receives, per MoE layer and micro-batch.

In one expert-parallel group of ``ep`` ranks, each rank routes its T tokens (b·s/cp, or
b·s/(cp·tp) under sequence parallelism) to k experts each, so N = ep·T·k token copies go to
the E experts per layer and micro-batch. Rank r holds experts r·E/ep .. (r+1)·E/ep − 1
(Megatron's contiguous assignment) and receives the tokens routed to them.

Routing models (``--moe-routing``):

- ``balanced``: every expert gets N/E (the router's auxiliary loss at its ideal);
- ``zipf:S``: a layer's experts have popularity ∝ rank^−S, in an order drawn once per
  layer; each micro-batch's counts are a multinomial draw of N from it;
- ``dirichlet:A``: a layer's popularity is drawn from a symmetric Dirichlet of
  concentration A (large A: nearly balanced; A = 1: uniform over the simplex); counts
  are a multinomial draw per micro-batch;
- a histogram file: tokens (or fractions) per expert measured from a real router, a JSON
  list of E numbers or of one list per MoE layer (or a CSV with one such row per line);
  each layer's counts are N times its fractions, the same every micro-batch.

With a capacity factor c, an expert keeps at most ⌈c·N/E⌉ tokens and drops the rest
(GShard/Switch); dropless otherwise. Draws are seeded by (seed, layer, micro-batch), so a
run is deterministic; every expert-parallel group sees the same draws (the template GPU's).

The slowest rank of the group sets the pace: its experts' GEMMs and the all-to-alls
bringing its tokens (``max_load``); ``stats`` reports max/mean tokens per rank and drops.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from sim.errors import InputError, require


def parse_routing(spec: str) -> tuple[str, float | None]:
    """(``balanced`` | ``zipf`` | ``dirichlet`` | ``file``, parameter or None)."""
    where = "--moe-routing"
    if spec == "balanced":
        return "balanced", None
    for kind in ("zipf", "dirichlet"):
        if spec.startswith(kind + ":"):
            text = spec.split(":", 1)[1]
            try:
                value = float(text)
            except ValueError:
                raise InputError(f"{where}: got {spec!r}; {kind}:X needs a number X") from None
            ok = math.isfinite(value) and (value >= 0 if kind == "zipf" else value > 0)
            require(ok, where, spec, f"{kind}:X needs a finite X {'>= 0' if kind == 'zipf' else '> 0'}")
            return kind, value
    require(spec.endswith((".json", ".csv")), where, spec,
            "allowed: balanced, zipf:S, dirichlet:A or a histogram .json/.csv file")
    return "file", None


def read_histogram(path: str, num_experts: int, num_moe_layers: int) -> np.ndarray:
    """Fractions per expert, one row per MoE layer (a single row is used for every layer)."""
    where = f"--moe-routing {path}"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"{where}: cannot read ({exc.strerror})") from None
    try:
        if path.endswith(".json"):
            rows = json.loads(text)
            rows = rows if rows and isinstance(rows[0], list) else [rows]
        else:
            rows = [[float(x) for x in line.split(",")] for line in text.splitlines() if line.strip()]
        arr = np.array(rows, dtype=float)
    except (ValueError, TypeError, IndexError, json.JSONDecodeError):
        raise InputError(f"{where}: expected a list of tokens per expert (or one list per MoE layer)") from None
    require(arr.ndim == 2 and arr.shape[1] == num_experts, where, f"{arr.shape[-1] if arr.ndim else 0} experts",
            f"expected {num_experts} numbers per row (the model's experts)")
    require(arr.shape[0] in (1, num_moe_layers), where, f"{arr.shape[0]} rows",
            f"expected 1 row or one per MoE layer ({num_moe_layers})")
    require(bool(np.all(np.isfinite(arr)) and np.all(arr >= 0) and np.all(arr.sum(axis=1) > 0)), where,
            "the counts", "expected finite numbers >= 0 with a positive sum in every row")
    return arr / arr.sum(axis=1, keepdims=True)


class Routing:
    """Tokens per expert and per expert-parallel rank (see the module doc)."""

    def __init__(self, model, plan):
        self.E, self.k = model.num_experts, model.moe_router_topk
        self.ep = plan.ep
        tokens = plan.micro_batch_size * model.seq_length // plan.cp
        self.tokens_per_rank = tokens // plan.tp if plan.sp else tokens
        self.N = self.ep * self.tokens_per_rank * self.k
        self.kind, self.param = parse_routing(plan.moe_routing)
        self.seed = plan.moe_seed
        self.cf = plan.moe_capacity_factor
        self.capacity = math.ceil(self.cf * self.N / self.E) if self.cf is not None else None
        self._moe_layers = [i for i in range(model.num_layers) if model.is_moe_layer(i)]
        self._hist = (read_histogram(plan.moe_routing, self.E, len(self._moe_layers))
                      if self.kind == "file" else None)
        self.counts = lru_cache(maxsize=None)(self._counts)

    @property
    def balanced(self) -> bool:
        """Whether every rank always gets the mean (no draws needed)."""
        return self.kind == "balanced" and (self.capacity is None or self.capacity * self.E >= self.N)

    def _popularity(self, layer: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, layer])
        if self.kind == "zipf":
            p = np.arange(1, self.E + 1, dtype=float) ** -self.param
            p = p[rng.permutation(self.E)]
        else:
            p = rng.dirichlet(np.full(self.E, self.param))
        return p / p.sum()

    def _counts(self, layer: int, mb: int) -> tuple[np.ndarray, int]:
        """(tokens kept per expert, tokens dropped) for ``layer`` and micro-batch ``mb``."""
        if self.kind == "balanced":
            counts = np.full(self.E, self.N / self.E)
        elif self.kind == "file":
            row = self._hist[0] if len(self._hist) == 1 else self._hist[self._moe_layers.index(layer)]
            counts = self.N * row
        else:
            rng = np.random.default_rng([self.seed, layer, mb, 1])
            counts = rng.multinomial(self.N, self._popularity(layer)).astype(float)
        dropped = 0
        if self.capacity is not None:
            kept = np.minimum(counts, self.capacity)
            dropped = int(round(float((counts - kept).sum())))
            counts = kept
        return counts, dropped

    def rank_loads(self, layer: int, mb: int) -> np.ndarray:
        """Tokens each rank of the group receives (its experts' counts)."""
        counts, _ = self.counts(layer, mb)
        return counts.reshape(self.ep, self.E // self.ep).sum(axis=1)

    def max_load(self, layer: int, mb: int) -> int:
        """Tokens the busiest rank of the group receives (what the layer waits for)."""
        if self.balanced:
            return self.tokens_per_rank * self.k
        return int(math.ceil(float(self.rank_loads(layer, mb).max()) - 1e-9))

    def stats(self, layers, microbatches: int) -> dict:
        """Imbalance (max/mean tokens per rank, averaged and worst over layers and
        micro-batches) and dropped tokens, over the given MoE layers."""
        ratios, dropped = [], 0
        mean = self.N / self.ep
        for layer in layers:
            for mb in range(microbatches):
                loads = self.rank_loads(layer, mb)
                ratios.append(float(loads.max()) / mean)
                dropped += self.counts(layer, mb)[1]
        routed = self.N * len(ratios)
        return {"routing": self.kind if self.kind != "file" else "histogram", "experts": self.E, "topk": self.k,
                "ep": self.ep, "imbalance_mean": float(np.mean(ratios)) if ratios else 1.0,
                "imbalance_max": max(ratios) if ratios else 1.0, "dropped_tokens": dropped,
                "dropped_fraction": dropped / routed if routed else 0.0,
                "capacity_tokens_per_expert": self.capacity}
