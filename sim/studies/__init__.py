"""Studies: many runs to answer one question.

``search`` enumerates and prunes parallel plans, ``sweep`` simulates every combination
of an experiment's values (locally or on a Dask cluster), ``sweep_results`` keeps a
sweep's results file.
"""
