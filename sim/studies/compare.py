"""Several plans of one model on one cluster, side by side: ``sim.compare``'s result.

A ``Comparison`` holds one ``sim.api.RunResult`` per plan, the rows of the table
``trainsim compare`` prints (iteration time split into compute, exposed communication
and bubble; peak memory by kind), the best plan, and writes it all (``save``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from sim.errors import InputError


@dataclass
class Comparison:
    """Several plans simulated on the same model and cluster.

    Iterating gives the ``RunResult``s in order; ``rows`` the table ``trainsim compare``
    prints, as dicts; ``best`` the plan that ranks first among those that fit: the most
    tokens/s, with ``rank_by="tokens-per-joule"`` the most tokens per joule, or with
    ``rank_by="cost"`` the fewest dollars per million tokens (``sim.inputs.cost``).
    """

    results: list
    title: str = ""
    """The chart's title (default: the model, the GPUs and the number of plans)."""
    rank_by: str = "throughput"
    """``throughput``, ``tokens-per-joule`` or ``cost`` (``sim.studies.sweep_results.RANK_BY``)."""

    def __post_init__(self):
        from sim.studies.sweep_results import RANK_BY

        if self.rank_by not in RANK_BY:
            raise InputError(field="rank_by", value=self.rank_by, allowed=f"allowed: {', '.join(RANK_BY)}")
        if self.rank_by == "tokens-per-joule":
            for r in self.results:
                if r.summary.get("energy_per_token_j") is None:
                    raise InputError(field="rank_by", value=self.rank_by, setting="rank_by",
                                     allowed=f"plan {r.name or 1}: its GPU's profile ({r.summary['gpu']}) gives no "
                                             "power figures: rank by throughput")
        if self.rank_by == "cost":
            for r in self.results:
                if r.summary.get("cost_per_million_tokens_usd") is None:
                    raise InputError(field="rank_by", value=self.rank_by, setting="rank_by",
                                     allowed=f"plan {r.name or 1}: its GPUs ({r.summary['gpu']}) have no price: give "
                                             "--gpu-hour-price USD (gpu_hour_price), or gpu_hour_price_usd in the "
                                             "profile")
        if not self.title:
            self.title = _title(self.results)

    def __iter__(self):
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, key: int | str):
        if isinstance(key, str):
            for r in self.results:
                if r.name == key:
                    return r
            raise KeyError(key)
        return self.results[key]

    @property
    def best(self):
        """The fitting plan with the most tokens/s, the most tokens per joule, or the fewest
        dollars per million tokens (``rank_by``; ties: the first listed); None if none fits."""
        fitting = [r for r in self.results if r.fits]
        if self.rank_by == "tokens-per-joule":
            return min(fitting, key=lambda r: r.summary["energy_per_token_j"]) if fitting else None
        if self.rank_by == "cost":
            return min(fitting, key=lambda r: r.summary["cost_per_million_tokens_usd"]) if fitting else None
        return max(fitting, key=lambda r: r.tokens_per_s) if fitting else None

    @property
    def rows(self) -> list[dict]:
        """One dict per plan: the figures of the table and of the chart (SI units), named as
        ``RunResult`` and the run summary name them (``peak_memory_bytes``,
        ``memory_capacity_bytes``); ``peak_bytes`` and ``capacity_bytes``, the rows' names
        before, stay as aliases with the same values for scripts that read them."""
        best = self.best
        return [_row(r, r is best) for r in self.results]

    def to_dict(self) -> dict:
        best = self.best
        return {"title": self.title, "best": best.name if best else None, "rank_by": self.rank_by, "rows": self.rows,
                "plans": [{"name": r.name, "description": r.description, "summary": r.summary}
                          for r in self.results]}

    def to_json(self) -> str:
        """``trainsim compare --json``'s output: the rows, the best plan's name and every summary."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def save(self, out: str | Path, *, kineto: bool = False) -> Path:
        """Write each plan's outputs into ``out/<plan>/``, plus ``compare.png`` (iteration
        time split into compute, exposed communication and bubble, and peak memory) and
        ``compare.json``; returns ``out``."""
        from sim.results.export import write_json_atomic
        from sim.results.plot import plot_compare

        out = Path(out)
        for r, d in zip(self.results, plan_dirs([r.name for r in self.results])):
            r.save(out / d, kineto=kineto)
        plot_compare(self.rows, out / "compare.png", title=self.title)
        write_json_atomic(self.to_dict(), out / "compare.json")
        return out

    def __repr__(self) -> str:
        best = self.best
        return f"Comparison({len(self.results)} plans, best: {best.name if best else 'none fits'})"


def plan_dirs(names: list[str]) -> list[str]:
    """A folder name per plan: lower case, runs of other characters as '-', unique."""
    out: list[str] = []
    for n in names:
        base = re.sub(r"[^a-z0-9._]+", "-", n.lower()).strip("-.") or "plan"
        d, k = base, 2
        while d in out:
            d, k = f"{base}-{k}", k + 1
        out.append(d)
    return out


def _row(r, best: bool) -> dict:
    s = r.summary
    T = s["iteration_time_s"]
    bubble = s["bubble_fraction"] * T
    m = s["memory"]
    parts = {"parameters": m["parameters_bytes"], "gradients": m["gradients_bytes"],
             "optimizer": m["optimizer_bytes"], "activations": m["activations_bytes"]}
    parts["other"] = max(0.0, m["peak_bytes"] - sum(parts.values()))
    return {"name": r.name, "description": r.description, "best": best, "iteration_time_s": T,
            "tokens_per_s": s["tokens_per_s"], "mfu": s["mfu"], "bubble_fraction": s["bubble_fraction"],
            "compute_s": s["compute_s"], "exposed_comm_s": dict(s["exposed_comm_s"]), "bubble_s": bubble,
            "other_idle_s": max(0.0, s["idle_s"] - bubble), "idle_s": s["idle_s"],
            "peak_memory_bytes": m["peak_bytes"], "memory_bytes": parts,
            "memory_capacity_bytes": s["memory_capacity_bytes"], "fits": s["fits"], "gpus": s["gpus"],
            # the names before 2026-12 (trainsim 0.x): kept for scripts that read compare.json, same values
            "peak_bytes": m["peak_bytes"], "capacity_bytes": s["memory_capacity_bytes"],
            "energy_per_iteration_j": s.get("energy_per_iteration_j"), "energy_per_token_j": s.get("energy_per_token_j"),
            "cost_per_iteration_usd": s.get("cost_per_iteration_usd"),
            "cost_per_million_tokens_usd": s.get("cost_per_million_tokens_usd"),
            "schedule": s["schedule"], "zero_stage": s["plan"]["zero_stage"]}




def _title(results: list) -> str:
    if not results:
        return ""
    s = results[0].summary
    return f"{s['model']} on {s['gpus']} x {s['gpu']} ({s['topology']}): {len(results)} plans"
