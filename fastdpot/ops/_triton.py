"""Registration of an op's Triton launcher (``kernels/<module>.py``, shipped as ``fastdpot.kernels``).

The launcher module is imported the first time the backend is asked for, not with ``import fastdpot``: Triton costs
about 0.3 s to import and most sessions never use it. Without Triton the backend is still registered, with an
availability check that names the missing install, so ``backend="triton"`` fails with an actionable error.
"""
from __future__ import annotations

import importlib

import torch

from .._dispatch import register, set_auto
from .._ext import triton_interpret, triton_status


def triton_available():
    """``(available, reason)``: Triton importable and either a CUDA device or ``TRITON_INTERPRET=1`` (CPU tensors)."""
    ok, reason = triton_status()
    if not ok:
        return False, reason
    if torch.cuda.is_available() or triton_interpret():
        return True, None
    return False, ("no CUDA device; the Triton kernels run on CUDA tensors, or on CPU tensors under "
                   "TRITON_INTERPRET=1 (Triton's interpreter, for testing only)")


def register_triton(op: str, module: str, function: str) -> None:
    """Register ``fastdpot.kernels.<module>.<function>`` as the ``triton`` backend of ``op``, preferred on CUDA.

    The launcher is resolved when the backend is first dispatched to (after its availability check passed).
    """
    cache = {}

    def launch(*args, **kwargs):
        fn = cache.get("fn")
        if fn is None:
            fn = cache["fn"] = getattr(importlib.import_module(f"fastdpot.kernels.{module}"), function)
        return fn(*args, **kwargs)

    launch.__name__ = launch.__qualname__ = f"{function}_lazy"
    launch.__doc__ = f"Triton backend of op {op!r}: ``fastdpot.kernels.{module}.{function}``, imported on first use."
    register(op, "triton", available=triton_available)(launch)
    set_auto(op, "cuda", [("triton", 0)])
