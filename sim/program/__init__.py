"""Program building: from model, plan and hardware to a per-rank ``Program``.

``workload`` lists each layer's ops (FLOPs, bytes, tensor sizes); ``costs`` holds every
time formula (kernels, collectives, the optimizer step, the analytic step terms);
``memory`` holds every byte formula (model states, activations in flight, ZeRO and
offload buffers, what each rank holds); ``schedules`` generates the pipeline schedule
as per-rank actions (``actions``); ``passes`` and ``zero`` add communication and memory
events, with the numbers from ``costs`` and ``memory``; ``training`` puts it all
together as ``build_program``, after ``limits`` has estimated the events its simulation
would take and refused an absurd one; ``estimate`` is the analytic (closed-form) twin.
Pure functions: no SimPy, no matplotlib.
"""
