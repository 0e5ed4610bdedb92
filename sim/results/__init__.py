"""Results: what a simulated run produced, and the views of it.

``trace`` (spans, transfers, memory events: plain data, no SimPy), ``metrics`` and
``memory_timeline`` (figures computed from a trace), ``export`` and ``export_kineto``
(Perfetto and PyTorch-profiler JSON), ``plot`` and ``plot_validate`` (PNG pictures; the
only matplotlib users).
"""
