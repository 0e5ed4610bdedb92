"""Shared helpers for the tests: tiny hand-made topologies.

Debug mode is on for the whole suite: every simulation any test runs (worker
processes of sweeps included, they inherit the environment) checks the invariants of
``sim.engine.invariants`` during and after the run.
"""

import os

os.environ.setdefault("TRAINSIM_DEBUG", "1")

import networkx as nx  # noqa: E402
import pytest  # noqa: E402

from sim.inputs.topology import Topology


def star(bandwidths_Bps, latency_s=0.0, kind="nvlink"):
    """GPUs 0..n-1, each on its own link (of the given bandwidth) to one switch."""
    g = nx.Graph()
    g.add_node("sw", kind="nvswitch")
    for i, bw in enumerate(bandwidths_Bps):
        g.add_node(f"gpu{i}", kind="gpu", rank=i, node=0)
        g.add_edge(f"gpu{i}", "sw", kind=kind, bandwidth_Bps=float(bw), latency_s=latency_s)
    return Topology(g, "star")


@pytest.fixture
def make_star():
    return star
