"""Studies: many runs to answer one question.

``compare`` sets several plans side by side, ``search`` enumerates and prunes parallel
plans, ``sweep`` simulates every combination of an experiment's values (locally or on a
Dask cluster): ``sweep_point`` simulates one point, ``sweep_executors`` runs points on
worker processes, Dask or this process, ``sweep_results`` keeps a sweep's results file.
``collective`` times one collective as nccl-tests does (the unit of ``trainsim
collective``'s size sweeps and of the NCCL experiments).
"""
