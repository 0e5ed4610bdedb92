"""Calibration with real kernels, importers for what users already measured, and a real
reference run to check the simulator against.

Everything that needs torch lives here (and in the ``calibrate``/``validate`` commands);
the rest of trainsim imports without it. The pieces, each in its own module:

- ``launch``: start N worker processes (``torch.multiprocessing``, gloo on CPU, NCCL on
  GPUs) or join a ``torchrun`` job, and time code on the device (CUDA events on GPU);
- ``microbench``: GEMMs (the shapes a model and plan run, plus a grid), attention
  (``scaled_dot_product_attention``), norms, activations, softmax and a large copy,
  each timed with its operands out of cache; and on a CPU the framework's fixed cost per
  kernel, from a tiny training step;
- ``collectives``: all-reduce, all-gather, reduce-scatter and send/recv over a size sweep
  through ``torch.distributed``;
- ``fit``: the profile's efficiency models and per-link α-β fitted from those numbers;
- ``nccl_tests`` and ``kineto``: importers for nccl-tests logs and PyTorch profiler traces;
- ``reference_model``, ``reference`` and ``validate``: a small GPT trained for real across local processes
  (data parallel and GPipe / 1F1B pipelines) and its simulation side by side.

Modules that need torch import it through ``require_torch``, so a missing install is a
one-line error naming the ``trainsim[calibrate]`` extra, not a traceback.
"""

from __future__ import annotations

from sim.errors import InputError


class CalibrationError(RuntimeError):
    """A measurement could not be made (a worker process failed, a backend is missing)."""


def require_torch():
    """The ``torch`` module, or an ``InputError`` saying how to install it."""
    try:
        import torch
    except ImportError:
        raise InputError("torch: not installed; calibration and validation run real kernels. "
                         "Install the extra: pip install 'trainsim[calibrate]' "
                         "(on a CPU-only machine pick the CPU build of torch)") from None
    return torch
