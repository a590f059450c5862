"""Deliberately broken noise for the audit's negative controls (never used by a mechanism of fastdpot)."""
from __future__ import annotations

import math

import torch

__all__ = ["truncated_normal", "truncated_laplace", "TRUNCATION"]

# where the broken variants cut the noise, in standard deviations (normal) or scales (Laplace); see
# fastdpot.audit.cases for why a cut this close is what an audit of 1e5 releases can see at δ = 1e-3.
TRUNCATION = 3.0


def truncated_normal(shape, generator, dtype=torch.float64, c: float = TRUNCATION) -> torch.Tensor:
    """Standard normals conditioned on |Z| <= c (inverse-cdf sampling)."""
    lo = 0.5 * math.erfc(c / math.sqrt(2.0))
    u = torch.rand(shape, generator=generator, dtype=torch.float64) * (1.0 - 2.0 * lo) + lo
    return torch.special.ndtri(u).to(dtype)


def truncated_laplace(shape, generator, dtype=torch.float64, c: float = TRUNCATION) -> torch.Tensor:
    """Standard Laplace variables (scale 1) conditioned on |L| <= c (inverse-cdf sampling)."""
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    sign = torch.where(torch.rand(shape, generator=generator, dtype=torch.float64) < 0.5, -1.0, 1.0)
    mag = -torch.log1p(-u * (1.0 - math.exp(-c)))  # |L| given |L| <= c
    return (sign * mag).to(dtype)
