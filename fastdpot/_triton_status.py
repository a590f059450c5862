"""Availability of the GPU backends ``triton`` and ``cuda``: ``(available, reason)`` pairs, nothing imported that
the check does not need.

Imported by :mod:`fastdpot.ops._triton` (which registers the backends' rows) and by the ``kernels/`` package
(shipped as ``fastdpot.kernels``), so that neither side imports the other: the op modules load the kernels on first
use, and the kernels import nothing from the op modules.
"""
from __future__ import annotations

import torch

from ._ext import triton_interpret, triton_status

__all__ = ["triton_available", "cuda_available"]


def triton_available():
    """``(available, reason)``: Triton importable and either a CUDA device or ``TRITON_INTERPRET=1`` (CPU tensors)."""
    ok, reason = triton_status()
    if not ok:
        return False, reason
    if torch.cuda.is_available() or triton_interpret():
        return True, None
    return False, ("no CUDA device; the Triton kernels run on CUDA tensors, or on CPU tensors under "
                   "TRITON_INTERPRET=1 (Triton's interpreter, for testing only)")


def cuda_available():
    """``(available, reason)`` of the ``cuda`` backend: Triton importable, ``fastdpot._C_cuda_flow`` built, a CUDA
    device visible."""
    ok, reason = triton_status()
    if not ok:
        return False, reason
    from ._cuda_prims import cuda_status

    return cuda_status()
