"""Context parallelism's plan checks (``ParallelPlan``; the work it changes is in
``sim.program.context_parallel``)."""

from __future__ import annotations



CP_COMM_TYPES = ("p2p", "all-gather")

