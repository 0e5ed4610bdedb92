"""Inputs: what a user describes, checked and in SI units.

The model (``model``), the parallel plan (``plan``, with rank ``placement``), the
hardware profile (``hardware``), the cluster (``topology``, built from TOML by
``topology_build``), and the typed settings schema that TOML files, the Python API and
the command line all map onto (``schema``, read from files by ``experiment``).
Nothing here knows about programs, the engine or results.
"""
