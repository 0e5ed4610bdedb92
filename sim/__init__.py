"""trainsim: a discrete-event simulator of LLM training on GPU clusters.

The package is laid out as one data flow (see DESIGN.md): specs (model, plan,
hardware, topology) become a per-rank ``Program`` of actions, passes add
communication, ``sim.engine.simulate`` runs it on a SimPy model of the cluster and
returns a ``Trace``, from which metrics, Perfetto JSON and PNG timelines are made.
"""

__version__ = "0.1.0"
