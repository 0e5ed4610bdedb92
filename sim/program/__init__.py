"""Program building: from model, plan and hardware to a per-rank ``Program``.

``workload`` lists each layer's ops (FLOPs, bytes, tensor sizes); ``costs`` holds every
time formula (kernels, collectives, the optimizer step, the analytic step terms);
``memory`` holds every byte formula (model states, activations in flight, ZeRO and
offload buffers, what each rank holds); ``schedules`` generates the pipeline schedule
as per-rank actions (``actions``). ``build`` holds the ``BuildContext`` every pass reads
(model, plan, topology, the profile paced once for the job, the build options);
``training`` is the pipeline of named passes over it (``training.PASSES``: limits,
schedule, stages, layers, fp8_amax, p2p, grad_sync, zero3_gather, optimizer, offload,
param_gather, memory, activation_offload, expand), each adding one thing with the numbers from ``costs``
and ``memory`` through the program passes of ``passes``, ``zero`` and ``amax``;
``segments`` cuts a step into its layers and their collectives; ``limits`` estimates
the events a simulation would take and refuses an absurd one; ``estimate`` is the
analytic (closed-form) twin, priced on the same context. Pure functions: no SimPy, no
matplotlib.
"""
