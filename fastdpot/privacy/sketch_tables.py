"""Post-processing of a released quantile sketch into the tables op ``flow_step`` reads: shrinkage of the noisy bin
means towards a smooth quantile function, isotonic regression, and the piecewise-linear tables
(:meth:`fastdpot.privacy.class_sketch.ClassSketchRelease.quantile_tables`). Everything here reads released values
only: no privacy cost."""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["isotonic_rows", "shrink_quantiles", "pooled_shrinkage", "pooled_locations", "frequency_groups",
           "piecewise_linear"]


def isotonic_rows(values: torch.Tensor) -> torch.Tensor:
    """The least-squares non-decreasing fit of every row (equal weights): pool-adjacent-violators,
    ``scipy.optimize.isotonic_regression`` (SciPy >= 1.12) row by row.

    Shape: (k, L) -> (k, L), float64, on the CPU.
    """
    from scipy.optimize import isotonic_regression  # on first use: scipy.optimize is heavy to import (~1 s)

    y = values.detach().to(device="cpu", dtype=torch.float64).numpy()
    return torch.from_numpy(np.stack([isotonic_regression(row).x for row in y]) if len(y)
                            else np.zeros(y.shape))


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


def _quantile_basis(levels: torch.Tensor) -> torch.Tensor:
    """(L, L) orthonormal columns: column 0 the constant 1/√L, column i the degree-i polynomial of z = Φ⁻¹(level)
    orthogonalised against the lower degrees (Gram–Schmidt by QR, z scaled to [−1, 1] first)."""
    L = levels.numel()
    z = torch.distributions.Normal(0.0, 1.0).icdf(levels.to(torch.float64))
    z = z / z.abs().max().clamp_min(1e-300)
    V = torch.stack([z ** i for i in range(L)], 1)
    U, R = torch.linalg.qr(V)
    return U * torch.sign(torch.diagonal(R))[None, :]  # column 0 positive: +1/√L


def frequency_groups(blocks) -> torch.Tensor:
    """The groups :func:`pooled_shrinkage` pools over: the directions of one block whose spatial frequencies round to
    the same whole number of cycles per image side (a block of directions without frequencies, e.g. a random
    rotation, is one group).

    Shape: a sequence of :class:`~fastdpot.flows.directions.DirectionBlock` -> (k,) int64 group ids, k the blocks'
    total size, in the blocks' order.
    """
    ids, at = [], 0
    for b in blocks:
        band = torch.floor(b.frequency.to(torch.float64) + 0.5).to(torch.int64)
        _, inv = torch.unique(band, return_inverse=True)
        ids.append(inv + at)
        at += int(inv.max()) + 1
    return torch.cat(ids)


def pooled_shrinkage(m: torch.Tensor, s: torch.Tensor, levels: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    r"""Empirical-Bayes shrinkage of noisy quantile rows, pooled over groups of directions alike a priori.

    Row j of ``m`` holds L noisy bin means of one direction at the levels u_l, m_j = q_j + e_j with
    e_j ~ N(0, s_j² I) (known s_j: σ·L/ñ_c for a release). In an orthonormal basis U of R^L whose first column is the
    constant and whose column i is the degree-i polynomial of Φ⁻¹(u) (location, scale, skew, … of a quantile
    function), the coordinates c_j = Uᵀ m_j carry the same independent noise: c_{j,i} = θ_{j,i} + N(0, s_j²). Each
    coordinate i >= 1 is multiplied by the factor w that minimises the mean squared error of w·c_{j,i} over the
    directions of its group G,

    .. math::  w_{j,i} = \frac{\tau^2_{G,i}}{\tau^2_{G,i} + s_j^2}, \qquad
               \hat\tau^2_{G,i} = \max\Big(0,\ \frac{1}{|G|}\sum_{j \in G} (c_{j,i}^2 - s_j^2)\Big),

    where τ²_{G,i} = mean over G of θ_{j,i}² is estimated without bias before the positive part (the linear
    empirical-Bayes rule of Efron & Morris, "Stein's estimation rule and its competitors — an empirical Bayes
    approach", JASA 1973; the Wiener factor per group). The location (i = 0) is kept. Where a group's shape is
    below its noise (a high spatial frequency at a small ε) its rows shrink to their location: the noise is not
    spread over the particles as texture. Post-processing of released values: no privacy cost.

    Shape:
        m (k, L), s (k,) >= 0, levels (L,) in (0, 1) increasing, groups (k,) int64 ids -> (k, L) float64.

    Raises:
        ValueError: mismatched shapes.
    """
    m = m.to(torch.float64)
    k, L = m.shape
    if s.shape != (k,) or groups.shape != (k,) or levels.shape != (L,):
        raise ValueError(f"pooled_shrinkage needs m (k, L), s (k,), groups (k,), levels (L,); got {tuple(m.shape)}, "
                         f"{tuple(s.shape)}, {tuple(groups.shape)}, {tuple(levels.shape)}")
    if L == 1 or k == 0:
        return m.clone()
    U = _quantile_basis(levels)
    c = m @ U
    s2 = s.to(torch.float64) ** 2
    _, inv = torch.unique(groups, return_inverse=True)
    G = int(inv.max()) + 1
    size = torch.zeros(G, dtype=torch.float64).index_add_(0, inv, torch.ones(k, dtype=torch.float64))
    excess = torch.zeros(G, L, dtype=torch.float64).index_add_(0, inv, c * c - s2[:, None])
    tau2 = (excess / size[:, None]).clamp_min(0.0)[inv]
    w = tau2 / (tau2 + s2[:, None]).clamp_min(1e-300)
    w[:, 0] = 1.0
    return (c * w) @ U.t()


def pooled_locations(blocks, loc: torch.Tensor, var: torch.Tensor, tol: float = 1e-12,
                     max_iter: int = 500) -> torch.Tensor:
    r"""The locations of every direction of several blocks, made consistent: the generalised least-squares point
    x* of R^D whose projections fit all blocks' noisy locations at once,

    .. math::  x^* = \arg\min_x \sum_j \frac{(\theta_j^\top x - \ell_j)^2}{v_j}, \qquad
               \hat\ell_j = \theta_j^\top x^* ,

    (Gauss–Markov: the minimum-variance unbiased combination of independent unbiased estimates of one vector's
    projections). Each block that is a basis of R^D holds a whole noisy estimate of a class's mean; B blocks pooled
    carry about 1/B of one block's noise variance. Solved by conjugate gradients on
    Σ_j θ_j θ_jᵀ x / v_j = Σ_j θ_j ℓ_j / v_j through the blocks' own transforms (Θ never formed); from x = 0 on a
    system whose directions do not span R^D it returns the least-squares point of least norm. Post-processing of
    released values: no privacy cost.

    Args:
        blocks: the release's :class:`~fastdpot.flows.directions.DirectionBlock` sequence (k directions in all).
        loc: (C, k) the noisy locations ℓ (one row per class). var: (C, k) > 0 their noise variances v.
        tol: relative residual at which CG stops. max_iter: its most iterations.

    Shape: returns (C, k) float64.

    Raises:
        ValueError: mismatched shapes or a variance <= 0.
    """
    loc = loc.to(torch.float64)
    var = var.to(torch.float64)
    k = sum(b.size for b in blocks)
    if loc.dim() != 2 or loc.shape[1] != k or var.shape != loc.shape:
        raise ValueError(f"pooled_locations needs loc and var of shape (C, {k}), got {tuple(loc.shape)} and "
                         f"{tuple(var.shape)}")
    if not bool((var > 0).all()):
        raise ValueError("pooled_locations needs variances > 0")
    at = [0]
    for b in blocks:
        at.append(at[-1] + b.size)
    w = 1.0 / var

    def project(x):  # (C, D) -> (C, k)
        return torch.cat([b.forward(x) for b in blocks], 1)

    def back(y):  # (C, k) -> (C, D), Σ_j θ_j y_j
        out = blocks[0].transpose(y[:, at[0]:at[1]].contiguous())
        for i, b in enumerate(blocks[1:], 1):
            out = out + b.transpose(y[:, at[i]:at[i + 1]].contiguous())
        return out

    rhs = back(loc * w)
    x = torch.zeros_like(rhs)
    r = rhs.clone()
    d = r.clone()
    rr = (r * r).sum(1)
    stop = tol ** 2 * rr.clamp_min(1e-300)
    for _ in range(max_iter):
        if bool((rr <= stop).all()):
            break
        Ad = back(project(d) * w)
        alpha = rr / (d * Ad).sum(1).clamp_min(1e-300)
        x = x + alpha[:, None] * d
        r = r - alpha[:, None] * Ad
        rr_new = (r * r).sum(1)
        d = r + (rr_new / rr.clamp_min(1e-300))[:, None] * d
        rr = rr_new
    return project(x)


def piecewise_linear(values: torch.Tensor, levels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Rows through (levels, values), linear between them and extended with the end segments, read at ``grid``."""
    k, L = values.shape
    if L == 1:
        return values.expand(k, grid.numel()).clone()
    i = (torch.searchsorted(levels, grid, right=True) - 1).clamp(0, L - 2)
    x0, x1 = levels[i], levels[i + 1]
    y0, y1 = values[:, i], values[:, i + 1]
    return y0 + (grid - x0) * (y1 - y0) / (x1 - x0)
