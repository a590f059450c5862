"""Triton GPU kernels (shipped as the subpackage fastdpot.kernels; on CPU they run under TRITON_INTERPRET=1).

Importing this package registers the ``triton`` backend of ops ``"flow_step"`` (kernels/flow_step.py) and
``"sliced_wasserstein"`` (kernels/dpswd.py) and makes it the ``auto`` choice on CUDA tensors. Without Triton the
backends are still registered, as stubs whose availability check names the missing install, so that
``import fastdpot`` works everywhere and ``backend="triton"`` fails with an actionable error.
"""
from __future__ import annotations

import torch

from fastdpot import _dispatch
from fastdpot._ext import BackendUnavailableError, triton_interpret, triton_status

_OPS = ("flow_step", "sliced_wasserstein")


def triton_available():
    """(available, reason): Triton importable and either a CUDA device or TRITON_INTERPRET=1 (CPU tensors)."""
    ok, reason = triton_status()
    if not ok:
        return False, reason
    if torch.cuda.is_available() or triton_interpret():
        return True, None
    return False, ("no CUDA device; the Triton kernels run on CUDA tensors, or on CPU tensors under "
                   "TRITON_INTERPRET=1 (Triton's interpreter, for testing only)")


try:
    import triton  # noqa: F401
except ImportError as _err:  # optional dependency: register stubs that say how to fix the install
    _REASON = f"{_err}; install with `pip install triton` (CUDA machines)"

    def _missing(*args, **kwargs):
        raise BackendUnavailableError(f"the triton backend is unavailable: {_REASON}")

    for _op in _OPS:
        _dispatch.register(_op, "triton", available=lambda: (False, _REASON))(_missing)
else:
    from .dpswd import SlicedWassersteinTriton, sliced_wasserstein_triton  # noqa: F401
    from .flow_step import flow_step_triton  # noqa: F401

    _dispatch.register("flow_step", "triton", available=triton_available)(flow_step_triton)
    _dispatch.register("sliced_wasserstein", "triton", available=triton_available)(sliced_wasserstein_triton)
    for _op in _OPS:
        # prefer triton on CUDA tensors unless the op's owner already set a CUDA rule
        if "cuda" not in _dispatch._TABLE[_op].auto:
            _dispatch.set_auto(_op, "cuda", [("triton", 0)])
