"""Replaying a traced job on the simulated cluster (``trainsim replay``).

A reader turns each traced rank into a ``RankGraph`` (``sim.replay.graph``: nodes with
durations, collectives and send/recv with op, bytes and group, ctrl and data edges):
``sim.replay.kineto`` reads PyTorch profiler traces. ``sim.replay.program`` makes the
engine's ``Program`` of them (untraced ranks cloned, partners matched), ``sim.replay.run``
replays it with the what-ifs, and ``sim.replay.report`` says what the step waited on.
"""

from sim.replay.graph import CATEGORIES, NODE_KINDS, Node, RankGraph

__all__ = ["Node", "RankGraph", "NODE_KINDS", "CATEGORIES"]
