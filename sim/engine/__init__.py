"""The engine: runs a ``Program`` on a SimPy model of the cluster and returns a ``Trace``.

``core`` walks each rank's actions; ``network`` shares link bandwidth among flows;
``algorithms`` turns a collective into its transfers, and ``collectives`` runs them;
``program_index`` flattens a program for the event loop; ``invariants`` checks a
finished run (debug mode). ``campaign`` is a second, separate SimPy model: a training job's
life over days (failures, restarts, checkpoint cycles from ``checkpoint_cycle``), for
``trainsim goodput``.
``kernel`` is the event loop and the timed calls on SimPy's event queue: the only module
that relies on how SimPy works inside. The only package that imports SimPy.
"""
