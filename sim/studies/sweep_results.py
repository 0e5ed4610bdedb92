"""The results of a sweep or a search, and the file they are kept in.

The file is JSON Lines, one record per point, appended as each point finishes (one
``write`` of a whole line, flushed), so an interrupted sweep leaves a valid file; resuming
reads it back, dropping a torn last line (see ``sim.studies.sweep``). A record is
``{"key", "status", "plan", "summary", "error"}``: ``rank`` orders the records that ran
and fit, ``pareto`` keeps those no other beats on both tokens/s and peak memory, and
``csv_text`` lays every record out as one CSV row (``results.csv``).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from sim.errors import InputError
from sim.inputs.schema_commands import RANK_BY as _RANK_BY
from sim.studies.search import PLAN_COLUMNS


class ResultsLog:
    """The JSON Lines file records are appended to as they finish (see the module doc)."""

    def __init__(self, path: str | Path | None, resume: bool = False):
        self.path = Path(path) if path is not None else None
        self.done: dict[str, dict] = {}
        self._fh = None
        if self.path is None:
            return
        if self.path.exists() and not resume:
            raise InputError(f"--out: {self.path} already exists; pass --resume to continue that sweep "
                             "or give another directory")
        if resume and self.path.exists():
            self._load()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _load(self) -> None:
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        keep = len(data)
        if lines and lines[-1] != b"":  # a torn last line: drop it
            keep -= len(lines[-1])
            lines = lines[:-1]
        lines = lines[:-1] if lines and lines[-1] == b"" else lines
        for i, raw in enumerate(lines, start=1):
            try:
                rec = json.loads(raw)
                key = rec["key"]
            except (ValueError, KeyError, TypeError):
                if i == len(lines):  # the last complete line may still be torn inside
                    keep -= len(raw) + 1
                    break
                raise InputError(f"{self.path}:{i}: not a results record; delete the file or fix the line") from None
            self.done[key] = rec
        if keep != len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(keep)

    def append(self, rec: dict) -> None:
        self.done[rec["key"]] = rec
        if self.path is None:
            return
        if self._fh is None:
            self._fh = open(self.path, "a", encoding="utf-8")
        self._fh.write(json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n")
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


RANK_BY = _RANK_BY
"""What plans are ranked by (``sim.inputs.schema_commands.RANK_BY``, where ``--rank-by`` is declared)."""
RANK_KEY = {"throughput": "iteration_time_s", "tokens-per-joule": "energy_per_token_j",
            "cost": "cost_per_million_tokens_usd"}
"""The summary figure each ranking sorts by, smallest first."""


def tokens_per_joule(summary: dict) -> float | None:
    """Tokens per joule of GPU energy (None when the profile gives no power figures)."""
    e = summary.get("energy_per_token_j")
    return 1.0 / e if e else None


def rank_key(summary: dict, by: str = "throughput") -> float:
    """Smaller is better: the iteration time, the joules per token, or the dollars per million tokens."""
    return summary[RANK_KEY[by]]


def rank(records: list[dict], by: str = "throughput") -> list[dict]:
    """Records that ran and fit, best first by ``by`` (``RANK_BY``; ties by key)."""
    ok = [r for r in records if r["status"] == "ok" and r["summary"].get("fits", True)]
    return sorted(ok, key=lambda r: (rank_key(r["summary"], by), r["key"]))


def pareto(records: list[dict]) -> list[dict]:
    """The records no other beats on both tokens/s and peak memory, by memory."""
    pts = sorted(records, key=lambda r: (r["summary"]["memory"]["peak_bytes"], -r["summary"]["tokens_per_s"], r["key"]))
    front, best = [], -math.inf
    for r in pts:
        if r["summary"]["tokens_per_s"] > best:
            front.append(r)
            best = r["summary"]["tokens_per_s"]
    return front


CSV_METRICS = ("iteration_time_s", "tokens_per_s", "mfu", "tflops_per_gpu", "bubble_fraction", "compute_s", "idle_s")


def csv_text(rows: list[dict]) -> str:
    """CSV of rows ``{"key", "status", "plan", "summary", "error", ...extra}`` sorted by key."""
    extra_plan = sorted({k for r in rows for k in r["plan"]} - set(PLAN_COLUMNS))
    extras = sorted({k for r in rows for k in r.get("extra", {})})
    kinds = sorted({k for r in rows if r.get("summary") for k in r["summary"]["exposed_comm_s"]})
    head = (["key", "status", *PLAN_COLUMNS, "num_microbatches", *CSV_METRICS, *(f"exposed_{k}_s" for k in kinds),
             "peak_memory_bytes", "fits", *extras, *extra_plan, "error"])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for r in sorted(rows, key=lambda r: r["key"]):
        s, p = r.get("summary"), r["plan"]
        m = p["global_batch_size"] // (p["micro_batch_size"] * p["dp"]) if p else ""
        row = [r["key"], r["status"], *(p.get(k, "") for k in PLAN_COLUMNS), m]
        row += [s[k] if s else "" for k in CSV_METRICS]
        row += [s["exposed_comm_s"].get(k, 0.0) if s else "" for k in kinds]
        row += [s["memory"]["peak_bytes"] if s else "", s["fits"] if s else ""]
        row += [r.get("extra", {}).get(k, "") for k in extras]
        row += [p.get(k, "") for k in extra_plan] + [r.get("error") or ""]
        w.writerow(row)
    return buf.getvalue()
