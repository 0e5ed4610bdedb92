"""Routing: how many tokens each expert receives, per MoE layer and micro-batch.

In one expert-parallel group of ``ep`` ranks, each rank routes its T tokens (b·s/cp, or
b·s/(cp·tp) under sequence parallelism) to k *distinct* experts each, so N = ep·T·k token
copies go to the E experts per layer and micro-batch. Rank r holds experts r·E/ep ..
(r+1)·E/ep − 1 (Megatron's contiguous assignment) and receives the copies routed to them.
An expert receives a token at most once, so it gets at most ep·T copies and the busiest
rank at most E/k times the mean.

Routing models (``--moe-routing``) give each layer's experts a popularity w:

- ``balanced``: every expert gets N/E (the router's auxiliary loss at its ideal);
- ``zipf:S``: popularity ∝ rank^−S, in an order drawn once per layer;
- ``dirichlet:A``: popularity drawn once per layer from a symmetric Dirichlet of
  concentration A (large A: nearly balanced; A = 1: uniform over the simplex);
- ``round-robin``: token i of every rank takes experts k·i, k·i+1, ..., k·i+k−1 (mod E): the
  benchmarks' stand-in for an ideal router (NeMo AutoModel's ``FakeBalancedGate``:
  ``arange(T·k).view(-1, k) % E``). Every expert gets N/E when E divides T·k, as balanced,
  but a token's k experts are consecutive, so they sit on one or two ranks (k·ep/E of them
  when E/ep ≥ k) of one node, where balanced routing scatters them over the group: a
  dispatcher that sends a token once per rank or node it reaches (DeepEP) moves far less.
  It replaces the router, so the model's group limits do not apply;
- a histogram file: tokens (or fractions) per expert measured from a real router, a JSON
  list of E numbers or of one list per MoE layer (or a CSV with one such row per line);
  the same every micro-batch (expected counts, no draws).

A token's k experts. Popularity becomes the chance π_e that a token picks expert e,
π_e = min(1, c·w_e) with c such that Σπ = k (sampling proportional to size without
replacement, "πps"; an expert popular enough to want more than every token gets every
token, the rest share what is left in proportion). The k experts are then drawn by
systematic sampling (Madow 1949): lay the π_e end to end on [0, k) in a fixed order (drawn
once per layer), draw one u ~ U[0, 1) per token and take the experts under u, u+1, ...,
u+k−1. Each token gets exactly k distinct experts (every π_e ≤ 1) and expert e exactly with
chance π_e. The experts a u selects change only where some cumulative sum's fractional part
lies, so [0, 1) falls into at most E+1 cells, each one fixed k-set of experts, and a
micro-batch's draw is one multinomial of the tokens over the cells: O(E) work whatever the
token count (about 20 µs for E = 256; a per-token Gumbel-top-k would be O(ep·T·E)).
Marginals are exact (each expert's count is Binomial(ep·T, π_e)); the pairs an order puts
together are fixed within a layer, an approximation of which experts share a token.

Device- or node-limited routing (DeepSeek-V3; Megatron-LM's ``--moe-router-num-groups`` G
and ``--moe-router-group-topk`` M, model settings): the experts fall into G equal groups of
consecutive experts; each token first picks M distinct groups (the same sampling on the
groups' total popularity), then its k experts among the experts of those groups. A token's
copies therefore reach at most M groups: with one group per node, at most M nodes.

Capacity (``--moe-expert-capacity-factor`` c, Megatron-Core's ``get_capacity`` and
``apply_router_token_dropping``): each rank routes its own tokens and keeps, per expert, at
most ⌈(T·k/E)·c⌉ of them, dropping the rest before the dispatch; dropless without c.
Draws are seeded by (seed, layer, micro-batch), so a run is deterministic; every
expert-parallel group sees the same draws (the template GPU's).

The slowest rank of the group sets the pace: its experts' GEMMs and the all-to-alls
bringing its tokens (``max_load``); ``stats`` reports max/mean tokens per rank, drops and,
given where the group's ranks sit, how many dispatched tokens leave their node: per copy
(Megatron's all-to-all dispatcher sends every copy, so limiting groups does not change
these bytes in expectation) and once per node reached (a dispatcher that deduplicates per
node before crossing it, as DeepSeek-V3's and DeepEP's do: what node-limited routing bounds).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from sim.errors import InputError, require

_EPS = 1e-12


def parse_routing(spec: str) -> tuple[str, float | None]:
    """(``balanced`` | ``zipf`` | ``dirichlet`` | ``file``, parameter or None)."""
    where = "--moe-routing"
    if spec in ("balanced", "round-robin"):
        return spec, None
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
            "allowed: balanced, round-robin, zipf:S, dirichlet:A or a histogram .json/.csv file")
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


def inclusion(weights: np.ndarray, picks: int) -> np.ndarray:
    """π_i = min(1, c·w_i) with Σπ = ``picks``: the chance that one of ``picks`` distinct
    draws proportional to ``weights`` takes item i (the module doc). Items of weight 0
    share what the positive ones cannot take (when fewer than ``picks`` are positive)."""
    w = np.asarray(weights, dtype=float)
    positive = w > 0
    if positive.sum() <= picks:
        return np.where(positive, 1.0, (picks - positive.sum()) / max(1, (~positive).sum()))
    order = np.argsort(-w, kind="stable")
    ws = w[order]
    rest = np.cumsum(ws[::-1])[::-1]                    # Σ of the j-th largest onwards
    j = np.arange(len(ws))
    ok = (picks - j) * ws <= rest + _EPS * rest         # capping the j largest leaves the rest ≤ 1
    capped = int(np.argmax(ok[:picks + 1])) if ok[:picks + 1].any() else picks
    pi = np.empty_like(ws)
    pi[:capped] = 1.0
    pi[capped:] = np.minimum(1.0, (picks - capped) * ws[capped:] / rest[capped])
    out = np.empty_like(pi)
    out[order] = pi
    return out


def systematic_cells(pi: np.ndarray, picks: int) -> tuple[np.ndarray, np.ndarray]:
    """(cell probabilities, the ``picks`` items each cell selects) of systematic sampling
    on ``pi`` laid end to end in index order (the module doc)."""
    edges = np.concatenate(([0.0], np.cumsum(pi)))
    edges[-1] = picks                                   # Σπ is picks; no float drift past the end
    cuts = np.unique(np.concatenate(([0.0, 1.0], edges[1:-1] % 1.0)))
    cuts = cuts[np.concatenate(([True], np.diff(cuts) > _EPS))]
    cuts[-1] = 1.0
    mids = (cuts[:-1] + cuts[1:]) / 2
    points = mids[:, None] + np.arange(picks)[None, :]
    sets = np.searchsorted(edges, points, side="right") - 1
    return np.diff(cuts), np.clip(sets, 0, len(pi) - 1)


class Routing:
    """Tokens per expert and per expert-parallel rank (see the module doc)."""

    def __init__(self, model, plan):
        self.E, self.k = model.num_experts, model.moe_router_topk
        self.ep = plan.ep
        tokens = plan.micro_batch_size * model.seq_length // plan.cp
        self.tokens_per_rank = tokens // plan.tp if plan.sp else tokens
        self.N = self.ep * self.tokens_per_rank * self.k
        self.groups = getattr(model, "moe_router_num_groups", None) or 1
        self.group_topk = getattr(model, "moe_router_group_topk", None) or 1
        self.kind, self.param = parse_routing(plan.moe_routing)
        self.seed = plan.moe_seed
        self.cf = plan.moe_capacity_factor
        self.capacity = (math.ceil((self.tokens_per_rank * self.k / self.E) * self.cf)
                         if self.cf is not None else None)
        """Tokens each expert keeps of one rank's (Megatron-Core's get_capacity), None: dropless."""
        self._moe_layers = [i for i in range(model.num_layers) if model.is_moe_layer(i)]
        self._hist = (read_histogram(plan.moe_routing, self.E, len(self._moe_layers))
                      if self.kind == "file" else None)
        if self.kind == "round-robin":  # the fake gate replaces the router, its group limits too
            self.groups = self.group_topk = 1
        self.counts = lru_cache(maxsize=None)(self._counts)
        self._cells = lru_cache(maxsize=None)(self._layer_cells)

    @property
    def balanced(self) -> bool:
        """Whether every rank always gets the mean (no draws needed)."""
        return self.kind == "balanced" and (self.capacity is None or self.capacity * self.E >= self.N / self.ep)

    def _popularity(self, layer: int) -> np.ndarray:
        if self.kind in ("balanced", "round-robin"):
            return np.full(self.E, 1.0 / self.E)
        if self.kind == "file":
            return self._hist[0] if len(self._hist) == 1 else self._hist[self._moe_layers.index(layer)]
        rng = np.random.default_rng([self.seed, layer])
        if self.kind == "zipf":
            p = np.arange(1, self.E + 1, dtype=float) ** -self.param
            p = p[rng.permutation(self.E)]
        else:
            p = rng.dirichlet(np.full(self.E, self.param))
        return p / p.sum()

    def _layer_cells(self, layer: int) -> tuple:
        """Per cell of the group draw: (its probability, the experts of its groups, and the
        systematic cells of the k experts among them as (probabilities, expert ids))."""
        p = self._popularity(layer)
        per = self.E // self.groups
        order = (np.random.default_rng([self.seed, layer, 2]).permutation(self.E)
                 if self.kind in ("zipf", "dirichlet") else np.arange(self.E))
        group_w = p.reshape(self.groups, per).sum(axis=1)
        g_prob, g_sets = systematic_cells(inclusion(group_w, self.group_topk), self.group_topk)
        out = []
        for prob, gs in zip(g_prob, g_sets):
            members = np.concatenate([np.arange(g * per, (g + 1) * per) for g in sorted(gs)])
            members = members[np.argsort(np.argsort(order)[members], kind="stable")]   # the layer's order
            e_prob, e_sets = systematic_cells(inclusion(p[members], self.k), self.k)
            out.append((float(prob), members, e_prob, members[e_sets]))
        return tuple(out)

    def marginals(self, layer: int) -> np.ndarray:
        """The chance that a token picks each expert (Σ = k)."""
        pi = np.zeros(self.E)
        for prob, members, e_prob, e_sets in self._cells(layer):
            np.add.at(pi, e_sets.ravel(), np.repeat(prob * e_prob, self.k))
        return pi

    def copies(self, layer: int, mb: int, per_rank: bool = True) -> np.ndarray:
        """Token copies each rank of the group routes to each expert (ep × E), before any
        capacity: a draw, or the expectation for balanced and histogram routing
        (``per_rank`` False: one row, the group's total, drawn at once)."""
        T = self.tokens_per_rank
        rows = self.ep if per_rank else 1
        if self.kind in ("balanced", "file"):
            return np.tile(T * (self.ep // rows) * self.marginals(layer), (rows, 1))
        rng = np.random.default_rng([self.seed, layer, mb, 1 if per_rank else 3])
        cells = self._cells(layer)
        per_group = rng.multinomial(np.full(rows, T * (self.ep // rows)), [c[0] for c in cells])
        out = np.zeros((rows, self.E))
        for (_, _, e_prob, e_sets), n in zip(cells, per_group.T):
            drawn = rng.multinomial(n, e_prob)                     # rows × cells
            where = (np.arange(rows)[:, None, None] * self.E + e_sets[None]).ravel()
            out += np.bincount(where, np.repeat(drawn, self.k, axis=1).ravel(), minlength=rows * self.E
                               ).reshape(rows, self.E)
        return out

    def _counts(self, layer: int, mb: int) -> tuple[np.ndarray, int]:
        """(tokens kept per expert, tokens dropped) for ``layer`` and micro-batch ``mb``."""
        if self.kind == "balanced" and self.capacity is None:
            return np.full(self.E, self.N / self.E), 0
        if self.kind == "round-robin":
            per_rank = np.bincount(np.arange(self.tokens_per_rank * self.k) % self.E, minlength=self.E)
            kept = per_rank if self.capacity is None else np.minimum(per_rank, self.capacity)
            return self.ep * kept.astype(float), int(self.ep * (per_rank - kept).sum())
        if self.kind == "file" and self.groups == 1 and self.capacity is None:
            row = self._popularity(layer)
            if row.max() * self.k <= 1:                           # a histogram a router can produce
                return self.N * row, 0
        routed = self.copies(layer, mb, per_rank=self.capacity is not None)
        if self.capacity is None:
            return routed.sum(axis=0), 0
        kept = np.minimum(routed, self.capacity)
        return kept.sum(axis=0), int(round(float((routed - kept).sum())))

    def rank_loads(self, layer: int, mb: int) -> np.ndarray:
        """Tokens each rank of the group receives (its experts' counts)."""
        counts, _ = self.counts(layer, mb)
        return counts.reshape(self.ep, self.E // self.ep).sum(axis=1)

    def max_load(self, layer: int, mb: int) -> int:
        """Tokens the busiest rank of the group receives (what the layer waits for)."""
        if self.balanced:
            return self.tokens_per_rank * self.k
        return int(math.ceil(float(self.rank_loads(layer, mb).max()) - 1e-9))

    def reach(self, layer: int, owner_of_expert) -> dict:
        """The chance that a token reaches each owner (a node, a rank: ``owner_of_expert``
        gives each expert's) with at least one of its k experts. A cell's chance of missing
        an owner is the hypergeometric one, C(A, k)/C(S, k) for A of its S experts elsewhere,
        with A taken in proportion to popularity (exact when the experts are equally popular)."""
        owner = np.asarray(owner_of_expert)
        if self.kind == "round-robin":  # counted exactly over the token patterns: every rank's are alike
            mult, sets = self.round_robin_sets()
            owners = owner[sets]
            return {o: float((mult * (owners == o).any(axis=1)).sum()) / self.tokens_per_rank
                    for o in np.unique(owner).tolist()}
        p = self._popularity(layer)
        out = {o: 0.0 for o in np.unique(owner).tolist()}
        for prob, members, _, _ in self._cells(layer):
            mass = p[members].sum()
            S = len(members)
            for o in out:
                on = owner[members] == o
                away = S * (p[members][~on].sum() / mass if mass > 0 else float((~on).mean()))
                miss = np.prod([max(0.0, (away - j) / (S - j)) for j in range(self.k)])
                out[o] += prob * (1.0 - miss)
        return out

    def leaving_node(self, layer: int, node_of_rank) -> tuple[float, float]:
        """Expected (token copies, tokens counted once per node reached) that one rank's
        dispatch sends off its node, averaged over the group's ranks; ``node_of_rank``: the
        node of each rank of the group (``reach`` gives the chance of reaching each node)."""
        nodes = np.asarray(node_of_rank)
        expert_node = np.repeat(nodes, self.E // self.ep)
        pi = self.marginals(layer)
        reach = self.reach(layer, expert_node)
        T = self.tokens_per_rank
        copies = float(np.mean([T * pi[expert_node != n].sum() for n in nodes]))
        dedup = float(np.mean([T * sum(v for m, v in reach.items() if m != n) for n in nodes.tolist()]))
        return copies, dedup

    def round_robin_sets(self) -> tuple[np.ndarray, np.ndarray]:
        """Round-robin routing's token patterns: (tokens of one rank with each pattern,
        the k experts of each pattern). Token i's experts repeat with period E/gcd(k, E)."""
        period = self.E // math.gcd(self.k, self.E)
        i = np.arange(min(period, self.tokens_per_rank))
        mult = np.array([len(range(j, self.tokens_per_rank, period)) for j in i], dtype=float)
        return mult, (self.k * i[:, None] + np.arange(self.k)[None, :]) % self.E

    def stats(self, layers, microbatches: int, node_of_rank=None, token_bytes: float = 0.0) -> dict:
        """Imbalance (max/mean tokens per rank, averaged and worst over layers and
        micro-batches) and dropped tokens, over the given MoE layers; with ``node_of_rank``
        (the node of each rank of the group) the dispatch bytes per rank, per MoE layer and
        micro-batch, that leave the node (``leaving_node`` times ``token_bytes``)."""
        ratios, dropped = [], 0
        mean = self.N / self.ep
        for layer in layers:
            for mb in range(microbatches):
                loads = self.rank_loads(layer, mb)
                ratios.append(float(loads.max()) / mean)
                dropped += self.counts(layer, mb)[1]
        routed = self.N * len(ratios)
        out = {"routing": self.kind if self.kind != "file" else "histogram", "experts": self.E, "topk": self.k,
               "ep": self.ep, "imbalance_mean": float(np.mean(ratios)) if ratios else 1.0,
               "imbalance_max": max(ratios) if ratios else 1.0, "dropped_tokens": dropped,
               "dropped_fraction": dropped / routed if routed else 0.0,
               "capacity_tokens_per_expert": self.capacity,
               "router_num_groups": self.groups if self.groups > 1 else None,
               "router_group_topk": self.group_topk if self.groups > 1 else None}
        if node_of_rank is not None and layers:
            both = np.mean([self.leaving_node(layer, node_of_rank) for layer in layers], axis=0)
            out.update(dispatch_cross_node_bytes=float(both[0]) * token_bytes,
                       dispatch_cross_node_bytes_dedup=float(both[1]) * token_bytes)
        return out
