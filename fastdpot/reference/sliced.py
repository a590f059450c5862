"""Pure-torch reference of the (DP) sliced Wasserstein distance — Rakotomamonjy & Ralaivola, ICML 2021.

Differentiable by autograd, any floating dtype, any device. It is the baseline the C++ (``csrc/sliced.cpp``) and
Triton kernels are tested and benchmarked against, and it is itself checked against POT
(``ot.sliced_wasserstein_distance``, ``ot.wasserstein_1d``) in ``tests/test_sliced_reference.py``.
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["sliced_wasserstein", "quantile_levels"]


def quantile_levels(n: int, m: int, device=None):
    """Merged quantile levels of two empirical measures with ``n`` and ``m`` equal-weight atoms.

    The 1-D quantile function of an ``n``-atom empirical measure is constant on ((i-1)/n, i/n]. Merging the
    breakpoints {i/n} ∪ {j/m} gives intervals on which both quantile functions are constant. Breakpoints are
    computed exactly in integers on the common grid 1/(n·m).

    Returns:
        (weights, ix, iy): interval lengths (float64, sum 1) and, per interval, the sorted index of the atom of
        each measure that is the quantile on that interval. Length at most n + m - 1.
    """
    if n == m:
        idx = torch.arange(n, device=device)
        return torch.full((n,), 1.0 / n, dtype=torch.float64, device=device), idx, idx
    bx = torch.arange(1, n + 1, device=device, dtype=torch.int64) * m
    by = torch.arange(1, m + 1, device=device, dtype=torch.int64) * n
    b = torch.unique(torch.cat([bx, by]))  # sorted, ends at n*m
    lo = torch.cat([b.new_zeros(1), b[:-1]])
    weights = (b - lo).to(torch.float64) / float(n * m)
    # the interval (lo, b] lies inside atom floor(lo / m) of x and floor(lo / n) of y
    return weights, torch.div(lo, m, rounding_mode="floor"), torch.div(lo, n, rounding_mode="floor")


def sliced_wasserstein(x: torch.Tensor, y: torch.Tensor, projections: torch.Tensor, p: int = 2,
                       noise_x: Optional[torch.Tensor] = None, noise_y: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""(DP) sliced Wasserstein distance SW_p^p between two point clouds, by sorting.

    .. math::
        \mathrm{SW}_p^p = \frac{1}{k}\sum_{j=1}^k W_p^p\Big(\frac1N\sum_i \delta_{\theta_j^\top x_i + v_{ij}},
        \frac1M\sum_i \delta_{\theta_j^\top y_i + v'_{ij}}\Big),\qquad
        W_p^p(\mu,\nu) = \int_0^1 |F_\mu^{-1}(u) - F_\nu^{-1}(u)|^p\,du

    With ``noise_x``/``noise_y`` given this is DP-SW_p^p of Rakotomamonjy & Ralaivola, ICML 2021;
    without, the plain Monte-Carlo sliced Wasserstein distance with the given directions.

    Args:
        x: (N, d) first point cloud (the private side in the DP use).
        y: (M, d) second point cloud.
        projections: (k, d) directions θ_j (rows; unit norm is the caller's business here).
        p: 1 or 2 (any p >= 1 works in this reference).
        noise_x: optional (N, k) values added to the projected x (already scaled: a standard deviation σ is the
            caller's), same unit as x.
        noise_y: optional (M, k), likewise for y.

    Shape:
        x (N, d), y (M, d), projections (k, d), noise_x (N, k), noise_y (M, k) -> 0-d tensor.

    Returns:
        SW_p^p (not its p-th root; POT's ``sliced_wasserstein_distance`` returns the p-th root).

    Autograd: differentiable w.r.t. x, y, projections and the noises (sort's gradient is the permutation; at tied
    projected values it picks one of the equally valid sub-gradients).
    """
    n, m = x.shape[0], y.shape[0]
    px = x @ projections.T  # (N, k)
    py = y @ projections.T  # (M, k)
    if noise_x is not None:
        px = px + noise_x
    if noise_y is not None:
        py = py + noise_y
    sx = torch.sort(px, dim=0).values
    sy = torch.sort(py, dim=0).values
    w, ix, iy = quantile_levels(n, m, device=x.device)
    diff = sx[ix] - sy[iy]  # (L, k)
    cost = diff.abs() if p == 1 else diff.abs() ** p
    k = projections.shape[0]
    return (w.to(cost.dtype)[:, None] * cost).sum() / k
