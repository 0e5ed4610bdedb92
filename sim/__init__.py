"""trainsim: a discrete-event simulator of LLM training on GPU clusters.

The package is laid out as one data flow (see DESIGN.md): specs (model, plan,
hardware, topology) become a per-rank ``Program`` of actions, passes add
communication, ``sim.engine.core.simulate`` runs it on a SimPy model of the cluster and
returns a ``Trace``, from which metrics, Perfetto JSON and PNG timelines are made.
"""

__version__ = "0.1.0"

# The Python API (sim.run, sim.compare), imported on first use so that ``import sim``
# stays light (no SimPy, no matplotlib until something is simulated or drawn).
_API = ("run", "compare", "RunResult", "Comparison")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from sim import api

        return getattr(api, name)
    raise AttributeError(f"module 'sim' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))
