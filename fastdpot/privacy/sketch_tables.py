"""Post-processing of a released quantile sketch into the tables op ``flow_step`` reads: shrinkage of the noisy bin
means towards a smooth quantile function, isotonic regression, and the piecewise-linear tables
(:meth:`fastdpot.privacy.class_sketch.ClassSketchRelease.quantile_tables`). Everything here reads released values
only: no privacy cost."""
from __future__ import annotations

import torch

__all__ = ["isotonic_rows", "shrink_quantiles", "piecewise_linear"]


def isotonic_rows(values: torch.Tensor) -> torch.Tensor:
    r"""The least-squares non-decreasing fit of every row (equal weights), all rows at once:

    .. math::  \hat y_i = \max_{a \le i} \min_{b \ge i} \frac{1}{b - a + 1} \sum_{t=a}^{b} y_t ,

    the max-min formula of isotonic regression (Robertson, Wright & Dykstra, "Order Restricted Statistical Inference",
    1988, Thm. 1.4.4), the same fit as pool-adjacent-violators (``scipy.optimize.isotonic_regression``); O(L³) per
    row, for the small L of a sketch.

    Shape: (k, L) -> (k, L), float64.
    """
    y = values.to(torch.float64)
    k, L = y.shape
    cs = torch.cat([torch.zeros(k, 1, dtype=torch.float64), torch.cumsum(y, 1)], 1)
    a = torch.arange(L)
    width = (a[None, :] - a[:, None] + 1).to(torch.float64)  # [a, b]
    means = (cs[:, None, 1:] - cs[:, :L, None]) / width.clamp_min(1.0)  # (k, a, b)
    means = means.masked_fill((a[None, :] < a[:, None])[None], float("inf"))
    suffix_min = torch.flip(torch.cummin(torch.flip(means, [2]), 2).values, [2])  # min over b >= i, (k, a, i)
    suffix_min = suffix_min.masked_fill((a[None, :] < a[:, None])[None], -float("inf"))  # a <= i only
    return suffix_min.max(1).values


def shrink_quantiles(m: torch.Tensor, s: torch.Tensor, levels: torch.Tensor, degree: int = 3) -> torch.Tensor:
    r"""Positive-part James–Stein shrinkage of noisy quantile rows towards a smooth quantile function of their own.

    Row j of ``m`` holds L noisy bin means of one direction at the levels u_l, each with noise std s_j (known: σ·L/ñ_c
    for a release). With L <= 5 the target is the least-squares Gaussian quantile function a + b·Φ⁻¹(u) (b >= 0, b²
    reduced by its own noise variance); with L >= 6 it is the least-squares polynomial Σ_{i<=q} a_i·Φ⁻¹(u)^i of
    degree q = min(``degree``, L − 4) — a Cornish–Fisher-like quantile function with skew and tails (Cornish &
    Fisher, "Moments and cumulants in the specification of distributions", Revue de l'ISI, 1938). The residual
    r = m − fit (L − q − 1 >= 3 free dimensions) is shrunk by max(0, 1 − (L − q − 3)·s²/‖r‖²) (James & Stein, "Estimation
    with quadratic loss", Berkeley Symposium 1961). Post-processing of released values: no privacy cost.

    Shape: m (k, L), s (k,), levels (L,) -> (k, L) float64.
    """
    k, L = m.shape
    if L == 1:
        return m
    zq = torch.distributions.Normal(0.0, 1.0).icdf(levels.float()).double()
    q = min(int(degree), L - 4)
    if L >= 6 and q >= 2:
        A = torch.stack([zq ** i for i in range(q + 1)], 1)
        fit = (A @ torch.linalg.lstsq(A, m.t()).solution).t()
        dev = m - fit
        free = L - q - 1
        f = (1.0 - (free - 2) * (s * s)[:, None] / dev.pow(2).sum(1, keepdim=True).clamp_min(1e-300)).clamp_min(0.0)
        return fit + f * dev
    A = torch.stack([torch.ones(L, dtype=torch.float64), zq], 1)
    coef = torch.linalg.lstsq(A, m.t()).solution  # (2, k): location, scale
    b = coef[1].clamp_min(0.0)
    var_b = s * s / float(((zq - zq.mean()) ** 2).sum())
    b = b * (1.0 - var_b / (b * b).clamp_min(1e-300)).clamp_min(0.0).sqrt()
    fit = coef[0][:, None] + b[:, None] * zq[None, :]
    if L <= 2:
        return fit
    dev = m - fit
    f = (1.0 - (L - 2) * (s * s)[:, None] / dev.pow(2).sum(1, keepdim=True).clamp_min(1e-300)).clamp_min(0.0)
    return fit + f * dev


def piecewise_linear(values: torch.Tensor, levels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Rows through (levels, values), linear between them and extended with the end segments, read at ``grid``."""
    k, L = values.shape
    if L == 1:
        return values.expand(k, grid.numel()).clone()
    i = (torch.searchsorted(levels, grid, right=True) - 1).clamp(0, L - 2)
    x0, x1 = levels[i], levels[i + 1]
    y0, y1 = values[:, i], values[:, i + 1]
    return y0 + (grid - x0) * (y1 - y0) / (x1 - x0)
