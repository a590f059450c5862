"""What every audit case shares: the claim's constants, the case types, the worst-case projection geometry.

:class:`AuditSetup` (what :func:`fastdpot.audit.audit_mechanism` needs for one case) and :class:`AuditCase` (a
mechanism to audit) are re-exported by :mod:`fastdpot.audit.cases`, which documents the cases and their variants.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import torch
from scipy.optimize import brentq

from .. import privacy as _p

__all__ = ["AuditSetup", "AuditCase", "VARIANTS", "EPSILON", "DELTA", "RADIUS"]

EPSILON = 2.0
DELTA = 1e-3
RADIUS = 1.0
_OUT = 3.0  # neighbours sit at 3× the radius: clipping must bring them back
VARIANTS = ("correct", "sensitivity_2x", "truncated", "no_clip")
_F64 = torch.float64


@dataclass(frozen=True)
class AuditSetup:
    """What :func:`fastdpot.audit.audit_mechanism` needs for one case (``mechanism`` is batched)."""
    mechanism: Callable
    dataset: Any
    neighbour: Any
    epsilon: float
    delta: float
    statistic: Optional[Callable] = None


@dataclass(frozen=True)
class AuditCase:
    """A mechanism to audit: ``build(backend, variant) -> AuditSetup``; ``trials`` releases per input by default
    (``trials_by_backend`` overrides it, e.g. for the slow Triton interpreter)."""
    name: str
    build: Callable[[str, str], AuditSetup]
    backends: Tuple[str, ...]
    variants: Tuple[str, ...]
    trials: int
    trials_by_backend: Tuple[Tuple[str, int], ...] = ()

    def default_trials(self, backend: str) -> int:
        """Releases per input on ``backend``: ``trials_by_backend``'s entry, else ``trials``."""
        return dict(self.trials_by_backend).get(backend, self.trials)


def _device(backend: str) -> str:
    """CUDA for the Triton backend when a GPU is there (and the interpreter is off), else CPU."""
    if backend == "triton" and torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return "cuda"
    return "cpu"


def _chunked(fn, n: int, chunk: int) -> torch.Tensor:
    return torch.cat([fn(min(chunk, n - i)) for i in range(0, n, chunk)])


def _sigma_for(epsilon: float, eps_of_sigma: Callable[[float], float]) -> float:
    """The σ whose claimed ε is ``epsilon`` (ε(σ) is decreasing)."""
    return float(brentq(lambda s: eps_of_sigma(s) - epsilon, 1e-3, 1e3, xtol=1e-12))


def _projection_geometry():
    """Directions Θ (2, 3) and the worst-case neighbours for them.

    Θ = [e₁; (0.96, 0.28, 0)] (unit rows, exactly) has s₁(Θ)² = 1 + 0.96 = 1.96, just inside the bound
    w(2, 3, δ/2) = 1.967 that the claim charges δ/2 for: a direction draw in the bound's good event, and the worst
    one (a Θ with larger s₁² lies in the tail event the claim already pays for). On that event the release is
    (ε, δ/2)-DP, so auditing it against the full (ε, δ) is conservative.
    """
    theta = torch.tensor([[1.0, 0.0, 0.0], [0.96, 0.28, 0.0]], dtype=_F64)
    svd = torch.linalg.svd(theta, full_matrices=False)
    w = _p.sliced_sensitivity_sq(2, 3, DELTA / 2)
    if not float(svd.S[0]) ** 2 <= w:  # the audit must stay inside what the claim covers
        raise RuntimeError(f"s1(Θ)² = {float(svd.S[0]) ** 2} exceeds the claimed bound w = {w}")
    v1 = svd.Vh[0]
    return theta, -_OUT * RADIUS * v1.unsqueeze(0), _OUT * RADIUS * v1.unsqueeze(0)


def _check_variant(variant, allowed):
    if variant not in allowed:
        raise ValueError(f"variant must be one of {allowed}, got {variant!r}")
