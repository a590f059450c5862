"""Registration of an op's GPU launchers (``kernels/<module>.py``, shipped as ``fastdpot.kernels``): the ``triton``
backend, and the ``cuda`` backend (the same launchers with the compiled CUDA primitives of
:mod:`fastdpot._cuda_prims`).

The launcher module is imported the first time the backend is asked for, not with ``import fastdpot``: Triton costs
about 0.3 s to import and most sessions never use it. Without Triton the backend is still registered, with an
availability check that names the missing install, so ``backend="triton"`` fails with an actionable error.
"""
from __future__ import annotations

import importlib

from .._dispatch import register, set_auto
from .._triton_status import cuda_available, triton_available

__all__ = ["register_triton", "register_cuda", "triton_available", "cuda_available"]


def register_triton(op: str, module: str, function: str) -> None:
    """Register ``fastdpot.kernels.<module>.<function>`` as the ``triton`` backend of ``op``, preferred on CUDA.

    The launcher is resolved when the backend is first dispatched to (after its availability check passed).
    """
    register(op, "triton", available=triton_available)(_lazy(op, module, function))
    set_auto(op, "cuda", [("triton", 0)])


def register_cuda(op: str, module: str, function: str) -> None:
    """Register ``fastdpot.kernels.<module>.<function>`` as the ``cuda`` backend of ``op``; on CUDA tensors
    ``backend="auto"`` then prefers it, and falls back to ``triton`` where the CUDA extension is not built."""
    register(op, "cuda", available=cuda_available)(_lazy(op, module, function))
    set_auto(op, "cuda", [("cuda", 0), ("triton", 0)])


def _lazy(op: str, module: str, function: str):
    """A launcher that imports ``fastdpot.kernels.<module>`` on its first call."""
    cache = {}

    def launch(*args, **kwargs):
        fn = cache.get("fn")
        if fn is None:
            fn = cache["fn"] = getattr(importlib.import_module(f"fastdpot.kernels.{module}"), function)
        return fn(*args, **kwargs)

    launch.__name__ = launch.__qualname__ = f"{function}_lazy"
    launch.__doc__ = f"GPU backend of op {op!r}: ``fastdpot.kernels.{module}.{function}``, imported on first use."
    return launch
