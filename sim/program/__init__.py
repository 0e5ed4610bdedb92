"""Program building: from model, plan and hardware to a per-rank ``Program``.

``workload`` lists each layer's ops (FLOPs, bytes, tensor sizes); ``costs`` prices them
on a hardware profile; ``memory`` holds the memory model (model states, activations,
ZeRO buffers); ``schedules`` generates the pipeline schedule as per-rank actions
(``actions``); ``passes`` and ``zero`` add communication and memory; ``training`` puts
it all together as ``build_program``; ``estimate`` is the analytic (closed-form) twin.
Pure functions: no SimPy, no matplotlib.
"""
