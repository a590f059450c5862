"""Pure-torch references of the (DP) sliced Wasserstein distance — Rakotomamonjy & Ralaivola, ICML 2021.

Differentiable by autograd, any floating dtype, any device. They are the baselines the C++ (``csrc/sliced.cpp``) and
Triton (``kernels/dpswd.py``) kernels are tested and benchmarked against, and they are themselves checked against
POT (``ot.sliced_wasserstein_distance``, ``ot.wasserstein_1d``) in ``tests/ops/test_sliced.py`` and
``tests/ops/test_sliced_api.py``.

* :func:`sliced_wasserstein` / :func:`projected_wasserstein`: SW_p^p along given directions, equal-weight atoms
  (merged quantile levels, :func:`quantile_levels`) or weighted atoms (:func:`weighted_wasserstein_1d`), with
  optional noise on the projected values (the points release);
* :func:`sketch_sliced_wasserstein`: the loss of the sketch release (the private side released as the noisy bin
  sums of its sorted projections, fitted monotone; :mod:`fastdpot.privacy.sketch`).
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["sliced_wasserstein", "projected_wasserstein", "quantile_levels", "weighted_wasserstein_1d",
           "sketch_sliced_wasserstein"]


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


def weighted_wasserstein_1d(u: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                            p: float = 2) -> torch.Tensor:
    r"""W_p^p between the weighted 1-D measures ``Σ_i a_i δ_{u_ij}`` and ``Σ_i b_i δ_{v_ij}``, for every column j.

    .. math::  W_p^p = \int_0^1 |F_u^{-1}(t) - F_v^{-1}(t)|^p\,dt

    computed as POT's ``ot.wasserstein_1d``: sort each column, cumulate the weights, merge the two sets of
    cumulative levels, and read both quantile functions on every merged interval (here at its midpoint, so a
    level that two cumulative sums reach up to rounding picks the right atom).

    Args:
        u: (N, k) values. v: (M, k) values.
        a: (N,) nonnegative weights summing to 1. b: (M,) likewise (the caller normalises).
        p: exponent >= 1.

    Shape: u (N, k), v (M, k), a (N,), b (M,) -> (k,).

    Autograd: differentiable w.r.t. the values and the weights (a sub-gradient at ties).
    """
    su, iu = torch.sort(u, dim=0)
    sv, iv = torch.sort(v, dim=0)
    cu = torch.cumsum(a.to(u.dtype)[iu], dim=0)  # (N, k)
    cv = torch.cumsum(b.to(u.dtype)[iv], dim=0)
    qs = torch.sort(torch.cat([cu, cv], dim=0), dim=0).values  # (N + M, k) merged right ends
    lo = torch.cat([torch.zeros_like(qs[:1]), qs[:-1]], dim=0)
    mid = (0.5 * (lo + qs)).t().contiguous()  # (k, N + M)
    ju = torch.searchsorted(cu.t().contiguous().detach(), mid.detach()).clamp_(max=u.shape[0] - 1).t()
    jv = torch.searchsorted(cv.t().contiguous().detach(), mid.detach()).clamp_(max=v.shape[0] - 1).t()
    diff = (su.gather(0, ju) - sv.gather(0, jv)).abs()
    return ((qs - lo) * (diff if p == 1 else diff ** p)).sum(0)


def projected_wasserstein(x: torch.Tensor, y: torch.Tensor, projections: torch.Tensor, p: float = 2,
                          noise_x: Optional[torch.Tensor] = None, noise_y: Optional[torch.Tensor] = None,
                          a: Optional[torch.Tensor] = None, b: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""W_p^p between the projections of x and y on every direction θ_j (the terms of :func:`sliced_wasserstein`).

    Args:
        x: (N, d) first point cloud (the private side in the DP use).
        y: (M, d) second point cloud.
        projections: (k, d) directions θ_j (rows; unit norm is the caller's business here).
        p: 1 or 2 (any p >= 1 works in this reference).
        noise_x: optional (N, k) values added to the projected x (already scaled: a standard deviation σ is the
            caller's), same unit as x.
        noise_y: optional (M, k), likewise for y.
        a: optional (N,) weights of x's atoms (nonnegative, summing to 1; None: 1/N each).
        b: optional (M,) weights of y's atoms (None: 1/M each).

    Shape:
        x (N, d), y (M, d), projections (k, d), noise_x (N, k), noise_y (M, k), a (N,), b (M,) -> (k,).
    """
    n, m = x.shape[0], y.shape[0]
    px = x @ projections.T  # (N, k)
    py = y @ projections.T  # (M, k)
    if noise_x is not None:
        px = px + noise_x
    if noise_y is not None:
        py = py + noise_y
    if a is not None or b is not None:
        a = torch.full((n,), 1.0 / n, dtype=px.dtype, device=px.device) if a is None else a
        b = torch.full((m,), 1.0 / m, dtype=px.dtype, device=px.device) if b is None else b
        return weighted_wasserstein_1d(px, py, a, b, p)
    sx = torch.sort(px, dim=0).values
    sy = torch.sort(py, dim=0).values
    w, ix, iy = quantile_levels(n, m, device=x.device)
    diff = sx[ix] - sy[iy]  # (L, k)
    cost = diff.abs() if p == 1 else diff.abs() ** p
    return (w.to(cost.dtype)[:, None] * cost).sum(0)


def sliced_wasserstein(x: torch.Tensor, y: torch.Tensor, projections: torch.Tensor, p: float = 2,
                       noise_x: Optional[torch.Tensor] = None, noise_y: Optional[torch.Tensor] = None,
                       a: Optional[torch.Tensor] = None, b: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""(DP) sliced Wasserstein distance SW_p^p between two point clouds, by sorting.

    .. math::
        \mathrm{SW}_p^p = \frac{1}{k}\sum_{j=1}^k W_p^p\Big(\sum_i a_i\,\delta_{\theta_j^\top x_i + v_{ij}},
        \sum_i b_i\,\delta_{\theta_j^\top y_i + v'_{ij}}\Big),\qquad
        W_p^p(\mu,\nu) = \int_0^1 |F_\mu^{-1}(u) - F_\nu^{-1}(u)|^p\,du

    (a_i = 1/N, b_i = 1/M by default). With ``noise_x``/``noise_y`` given this is DP-SW_p^p of Rakotomamonjy &
    Ralaivola, ICML 2021; without, the plain Monte-Carlo sliced Wasserstein distance with the given directions.

    Arguments as :func:`projected_wasserstein`.

    Shape:
        x (N, d), y (M, d), projections (k, d), noise_x (N, k), noise_y (M, k), a (N,), b (M,) -> 0-d tensor.

    Returns:
        SW_p^p (not its p-th root; POT's ``sliced_wasserstein_distance`` returns the p-th root).

    Autograd: differentiable w.r.t. x, y, projections, the noises and the weights (sort's gradient is the
    permutation; at tied projected values it picks one of the equally valid sub-gradients).
    """
    return projected_wasserstein(x, y, projections, p, noise_x, noise_y, a, b).sum() / projections.shape[0]


def sketch_sliced_wasserstein(x_private: torch.Tensor, y: torch.Tensor, projections: torch.Tensor, sketch_bins: int,
                              p: float = 2, noise: Optional[torch.Tensor] = None) -> torch.Tensor:
    r"""The DP-SW_p^p loss of the sketch release (:func:`fastdpot.dp_sliced_wasserstein` with ``release="sketch"``).

    Per direction θ_j: the private side's sorted projections (float64) are summed over the L rank bins of
    :func:`fastdpot.privacy.sketch.bin_sizes` (sizes m_l for M rows), ``noise[j, l]`` is added to each bin SUM, the
    bin means are fitted non-decreasing (weighted isotonic regression, weights m_l:
    :func:`fastdpot.privacy.sketch.sketch_quantile_table`) into a table Q_j, read piecewise linearly at the levels
    u'_l of the generated side's bins (sizes m'_l for N rows; :func:`fastdpot.privacy.sketch.quantile_table_eval`).
    With ȳ_jl the generated side's bin means (no noise),

    .. math::  L = \frac1k\sum_j\sum_l \frac{m'_l}{N}\,|\bar y_{jl} - Q_j(u'_l)|^p .

    Args:
        x_private: (M, d) private rows, already clipped by the caller (used as given).
        y: (N, d) generated rows, the differentiable side.
        projections: (k, d) directions.
        sketch_bins: L, 1 <= L <= min(M, N).
        p: exponent >= 1.
        noise: optional (k, L) values added to the private bin sums (already scaled by σ; float64).

    Shape: x_private (M, d), y (N, d), projections (k, d), noise (k, L) -> 0-d tensor in y's dtype.

    Autograd: differentiable w.r.t. y only (the release is post-processing of the private side).
    """
    from ..privacy.sketch import (QuantileSketch, bin_index, bin_levels, bin_sizes, quantile_table_eval,
                                  sketch_quantile_table)

    m, n = x_private.shape[0], y.shape[0]
    dev = y.device
    th64 = projections.detach().to(torch.float64)
    s = torch.sort(x_private.detach().to(torch.float64) @ th64.t(), dim=0).values  # (M, k)
    sizes_x = bin_sizes(m, sketch_bins).to(dev)
    sums = torch.zeros(sketch_bins, s.shape[1], dtype=torch.float64, device=dev).index_add_(
        0, bin_index(sizes_x).to(dev), s).t()  # (k, L)
    if noise is not None:
        sums = sums + noise.to(device=dev, dtype=torch.float64)
    sk = QuantileSketch(sums / sizes_x.to(torch.float64), bin_levels(sizes_x).to(dev), sizes_x)
    table, levels = sketch_quantile_table(sk)
    th = projections.detach().to(y.dtype)
    yp = torch.sort(y @ th.t(), dim=0).values  # (N, k), differentiable w.r.t. y
    sizes = bin_sizes(n, sketch_bins).to(dev)
    gsums = torch.zeros(sketch_bins, th.shape[0], dtype=y.dtype, device=dev).index_add(0, bin_index(sizes).to(dev),
                                                                                      yp)
    gen_means = (gsums / sizes.to(y.dtype).unsqueeze(1)).t()  # (k, L)
    target = quantile_table_eval(table, levels, bin_levels(sizes).to(dev))
    w = sizes.to(y.dtype) / n
    diff = (gen_means - target.to(y.dtype)).abs()
    return ((diff if p == 1 else diff ** p) * w).sum(1).mean()
