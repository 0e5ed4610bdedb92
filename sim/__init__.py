"""trainsim: a discrete-event simulator of LLM training on GPU clusters.

The package follows the data of one run (docs/architecture.md): ``sim.inputs`` (the
settings schema, model, plan, hardware, topology) -> ``sim.program`` (a per-rank
``Program`` of actions, with costs and memory) -> ``sim.engine`` (SimPy; returns a
``Trace``) -> ``sim.results`` (metrics, summary, Perfetto JSON, PNG timelines).
``sim.session`` runs those steps; ``sim.studies`` and ``sim.calibrate`` stand on it, and
the Python API (``sim.run``, ``sim.compare``) and the ``trainsim`` command on top.
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
