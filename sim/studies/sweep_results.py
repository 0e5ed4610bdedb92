"""The results file of a sweep: JSON Lines, one record per point, appended as each point
finishes (one ``write`` of a whole line, flushed), so an interrupted sweep leaves a valid
file; resuming reads it back, dropping a torn last line (see ``sim.studies.sweep``)."""

from __future__ import annotations

import json
from pathlib import Path

from sim.errors import InputError


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
