"""Reference (pure torch) of the sort-free histogram mode of the DP sliced-Wasserstein flow step.

Same step as :func:`fastdpot.reference.flow.flow_step` (Sebag et al., TMLR) except for the particle CDF. Exact mode puts
the particle of rank r at level ``r/(N-1)`` (needs a sort of each projected column); histogram mode reads the level
off a per-direction histogram of the noisy particle projections ``s_ij`` with ``B`` equal-width bins on
``[min_i s_ij, max_i s_ij]``:

.. math::

    t = \\frac{s - \\mathrm{lo}_j}{w_j} \\in [0, B],\\quad b = \\min(\\lfloor t \\rfloor, B-1),\\quad
    u = \\frac{C_{jb} + (t - b)\\, n_{jb}}{N},

with ``n_jb`` the particles in bin b and ``C_jb`` those in the bins below: the piecewise-linear interpolation of the
empirical CDF between bin edges (continuous in s, ``u = 0`` at the minimum, ``u = 1`` at the maximum). The target is
then the private quantile at level u, as in exact mode (linear interpolation at position ``u (M-1)`` of the sorted
noisy private projections).

Error against exact mode: the exact level ``r/(N-1)`` and ``u`` differ by at most ``(n_jb + 1)/N`` (the rank lies
among the ``n_jb`` particles of the bin; ``r/N`` and ``r/(N-1)`` differ by less than ``1/N``), so the transported
target of each particle moves by at most the variation of the private quantile function over that level interval.
For smooth particle densities the in-bin linear interpolation makes the typical error much smaller (O(1/B^2) in the
level); the Triton kernel (``kernels/histogram.py``) computes the same quantities in three passes without a sort.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .._validate import check_int
from .flow import step_with_transport

__all__ = ["flow_step_histogram", "histogram_levels", "histogram_bins"]


def histogram_bins(xp: torch.Tensor, lo: torch.Tensor, width: torch.Tensor, num_bins: int):
    """Bin index and position inside the bin of every entry of ``xp`` for the bins ``[lo + b width, lo + (b+1)
    width)``, b = 0 … num_bins − 1 (values below / above the range clamped into the first / last bin).

    Shape:
        xp any shape, ``lo`` / ``width`` broadcastable to it -> (int64 bin index, fraction in [0, 1] in xp's
        dtype), both of xp's shape.
    """
    t = ((xp - lo) / width).clamp(0, num_bins)
    b = t.to(torch.int64).clamp(max=num_bins - 1)  # t >= 0: truncation is floor
    return b, t - b.to(t.dtype)


def histogram_levels(xp: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Histogram-CDF level ``u`` in [0, 1] of every entry of the noisy particle projections.

    Shape:
        xp (N, k) -> (N, k), same dtype.
    """
    n, k = xp.shape
    lo = xp.amin(0)
    width = (xp.amax(0) - lo) / num_bins
    width = torch.where(width > 0, width, torch.ones_like(width))
    b, frac = histogram_bins(xp, lo, width, num_bins)
    counts = torch.zeros(k, num_bins, dtype=torch.int64, device=xp.device)
    counts.scatter_add_(1, b.t(), torch.ones_like(b.t()))
    below = torch.cumsum(counts, dim=1) - counts
    cnt = counts.gather(1, b.t()).t()
    blw = below.gather(1, b.t()).t()
    return (blw.to(xp.dtype) + frac * cnt.to(xp.dtype)) / n


def _target_at(sorted_target: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Linear interpolation of sorted columns (M, k) at positions u (M-1), u (N, k) in [0, 1]."""
    m = sorted_target.shape[0]
    pos = u * (m - 1)
    lo = pos.to(torch.int64).clamp(0, m - 1)
    hi = (lo + 1).clamp(max=m - 1)
    f = pos - lo.to(pos.dtype)
    a = sorted_target.gather(0, lo)
    return a + f * (sorted_target.gather(0, hi) - a)


def flow_step_histogram(particles: torch.Tensor, private: torch.Tensor, projections: torch.Tensor,
                        noise_particles: Optional[torch.Tensor], noise_private: Optional[torch.Tensor],
                        step_size: float, reg: float = 0.0, brownian: Optional[torch.Tensor] = None,
                        num_bins: int = 1024) -> Tuple[torch.Tensor, torch.Tensor]:
    """One flow step with the histogram CDF (sort-free mode), given all random draws.

    Args:
        particles: current particles x.
        private: private batch y, already clipped / normalised by the caller (this function releases nothing).
        projections: directions θ (rows).
        noise_particles: σ-scaled Gaussian noise added to the particle projections (None = no noise).
        noise_private: σ-scaled Gaussian noise added to the private projections (None = no noise).
        step_size: h > 0.
        reg: entropic regularisation λ >= 0 (Brownian term sqrt(2λh)·ξ).
        brownian: standard normals ξ; required when reg > 0.
        num_bins: B >= 1 bins per direction.

    Shape:
        particles (N, d); private (M, d); projections (k, d); noise_particles (N, k); noise_private (M, k);
        brownian (N, d). Returns ``(new_particles (N, d), drift (N, d))``; σ is a standard deviation in the unit
        of the projected values.

    Raises:
        ValueError: N < 2, mismatched shapes, non-finite inputs, step_size <= 0, reg < 0, reg > 0 without
            ``brownian``, num_bins < 1.

    Autograd: not meant for differentiation (bin indices are piecewise constant); the flow needs no gradients.

    References:
        Sebag et al., TMLR, Euler--Maruyama scheme and drift; the histogram CDF is fastdpot's
        sort-free approximation of the rank map, with the error bound stated in this module's docstring.
    """
    num_bins = check_int(num_bins, "num_bins", 1)
    return step_with_transport(particles, private, projections, noise_particles, noise_private, step_size, reg,
                               brownian, lambda xp, yp: _target_at(torch.sort(yp, dim=0).values,
                                                                   histogram_levels(xp, num_bins)))
