"""Slow GPUs in the engine: each compute kernel of a slow GPU takes its factor times as
long (``sim.inputs.stragglers``). Only compute on GPU streams is scaled (the actions the
program index marks ``slowable``); host work (the ``cpu`` stream) and communication keep
their times, and its neighbours then wait for the slow GPU wherever they meet it."""

from __future__ import annotations

import numpy as np


def slow_down(dur: list, slowable: bytearray, rank_of: list[int], factors: dict[int, float]) -> int:
    """Multiply ``dur[i]`` by ``factors[rank_of[i]]`` for every slowable action of a rank
    in ``factors`` (in place); returns how many actions were scaled."""
    if not factors:
        return 0
    ranks = np.asarray(rank_of, dtype=np.int64)
    mask = np.isin(ranks, np.fromiter(factors, dtype=np.int64, count=len(factors)))
    mask &= np.frombuffer(bytes(slowable), dtype=np.uint8).astype(bool)
    hit = np.flatnonzero(mask).tolist()
    for i in hit:
        d = dur[i]
        if d is not None:
            dur[i] = d * factors[rank_of[i]]
    return len(hit)
