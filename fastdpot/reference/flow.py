"""Reference (pure torch) step of the DP sliced-Wasserstein particle flow -- Sebag et al., TMLR.

One Euler--Maruyama step of the smoothed sliced-Wasserstein gradient flow with entropic regularisation λ:

.. math::

    x_i \\leftarrow x_i - h\\, v(x_i) + \\sqrt{2 \\lambda h}\\, \\xi_i, \\qquad
    v(x_i) = \\frac1k \\sum_{j=1}^k \\big(s_{ij} - F^{-1}_{\\nu_j}(F_{\\mu_j}(s_{ij}))\\big)\\, \\theta_j,

with :math:`s_{ij} = \\theta_j^\\top x_i + u_{ij}` the noisy projected particles, :math:`\\mu_j` their empirical law,
and :math:`\\nu_j` the empirical law of the noisy projected private rows :math:`\\theta_j^\\top y_m + v_{mj}`.

Two ways of evaluating :math:`F^{-1}_{\\nu_j}\\circ F_{\\mu_j}`:

* ``"exact"`` (sort-based quantile transport): sort column j of the noisy particle projections; the particle of rank
  r (0-based) sits at level ``r/(N-1)``; its target is the private quantile at that level, read by linear
  interpolation at position ``r/(N-1)·(M-1)`` of the sorted noisy private projections.
* ``"grid"`` (the authors' code, ilanasebag/dpswgf): Q levels ``linspace(0, 1, Q)``; particle and private quantiles on
  that grid (linear interpolation, level u at position ``u(n-1)``); ``cdf = interp(s; xq -> levels)`` and
  ``T = interp(cdf; levels -> tq)`` with ``numpy.interp`` semantics. With Q = N this equals ``"exact"``.

This module is the baseline that the fused C++ step (``csrc/flow.cpp``) is tested and benchmarked against.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .._validate import check_choice, check_int, check_nonnegative, check_positive, check_same_dim, check_tensor

__all__ = ["flow_step", "quantiles_sorted", "interp", "transport_exact", "transport_grid"]


def quantiles_sorted(sorted_vals: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Linear-interpolation quantiles (``numpy.quantile(method="linear")``) of pre-sorted columns.

    Shape:
        sorted_vals (n, k) sorted along dim 0; levels (L,) in [0, 1] -> (L, k).
    """
    n = sorted_vals.shape[0]
    pos = levels.to(sorted_vals.dtype) * (n - 1)
    lo = pos.floor().clamp(0, n - 1).long()
    hi = (lo + 1).clamp(max=n - 1)
    frac = (pos - lo.to(pos.dtype)).unsqueeze(1)
    a = sorted_vals.index_select(0, lo)
    b = sorted_vals.index_select(0, hi)
    return a + frac * (b - a)


def interp(x: torch.Tensor, xp: torch.Tensor, fp: torch.Tensor) -> torch.Tensor:
    """Column-wise ``numpy.interp(x[:, j], xp[:, j], fp[:, j])`` (xp non-decreasing; clamped outside its range).

    Shape:
        x (n, k); xp (L, k); fp (L, k) -> (n, k).
    """
    L = xp.shape[0]
    xpt, xt = xp.t().contiguous(), x.t().contiguous()
    j = torch.searchsorted(xpt, xt, right=True) - 1  # xp[j] <= x < xp[j+1]
    j = j.clamp(0, L - 1)
    j1 = (j + 1).clamp(max=L - 1)
    fpt = fp.t().contiguous()
    x0, x1 = xpt.gather(1, j), xpt.gather(1, j1)
    f0, f1 = fpt.gather(1, j), fpt.gather(1, j1)
    den = x1 - x0
    safe = torch.where(den > 0, den, torch.ones_like(den))
    slope = torch.where(den > 0, (f1 - f0) / safe, torch.zeros_like(den))
    out = f0 + slope * (xt - x0)
    # below the first knot numpy returns fp[0]; x == xp[-1] (or above) returns fp[-1]
    out = torch.where(xt < xpt[:, :1], fpt[:, :1], out)
    out = torch.where(xt >= xpt[:, -1:], fpt[:, -1:], out)
    return out.t()


def transport_exact(xp: torch.Tensor, yp: torch.Tensor) -> torch.Tensor:
    """Sort-based quantile transport: target value of every noisy particle projection.

    Shape:
        xp (N, k) noisy particle projections; yp (M, k) noisy private projections -> (N, k).
    """
    n = xp.shape[0]
    ys, _ = torch.sort(yp, dim=0)
    # sort each direction's column in a contiguous (k, N) layout (torch sorts a strided dim several times slower)
    order = torch.argsort(xp.t().contiguous(), dim=1, stable=True)
    ranks = torch.arange(n, dtype=torch.float64, device=xp.device)
    levels = ranks / (n - 1)
    tq = quantiles_sorted(ys, levels).t().contiguous()  # (k, N): target of the particle of rank r
    out = torch.empty(xp.shape[1], n, dtype=xp.dtype, device=xp.device)
    out.scatter_(1, order, tq.to(xp.dtype))
    return out.t()


def transport_grid(xp: torch.Tensor, yp: torch.Tensor, num_quantiles: int) -> torch.Tensor:
    """The authors' Q-level grid transport (Sebag et al., TMLR). Shape: xp (N, k); yp (M, k) -> (N, k)."""
    levels = torch.linspace(0, 1, num_quantiles, dtype=torch.float64, device=xp.device)
    xq = quantiles_sorted(torch.sort(xp.t().contiguous(), dim=1).values.t(), levels)
    tq = quantiles_sorted(torch.sort(yp, dim=0).values, levels)
    lv = levels.to(xp.dtype).unsqueeze(1).expand(-1, xp.shape[1])
    cdf = interp(xp, xq, lv)
    return interp(cdf, lv, tq)


def flow_step(particles: torch.Tensor, private: torch.Tensor, projections: torch.Tensor,
              noise_particles: Optional[torch.Tensor], noise_private: Optional[torch.Tensor], step_size: float,
              reg: float = 0.0, brownian: Optional[torch.Tensor] = None, quantiles: str = "exact",
              num_quantiles: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """One step of the (DP) sliced-Wasserstein particle flow, Sebag et al., TMLR, given all random draws.

    Args:
        particles: current particles x.
        private: private batch y, already clipped / normalised by the caller (this function releases nothing).
        projections: directions θ (rows; unit norm in the flow, any rows accepted here).
        noise_particles: σ-scaled Gaussian noise added to the particle projections (None = no noise).
        noise_private: σ-scaled Gaussian noise added to the private projections (None = no noise).
        step_size: h > 0.
        reg: entropic regularisation λ >= 0 (Brownian term sqrt(2λh)·ξ).
        brownian: standard normals ξ; required when reg > 0.
        quantiles: ``"exact"`` (sort-based, rank r -> level r/(N-1)) or ``"grid"`` (the authors' Q-level grid).
        num_quantiles: Q for ``"grid"`` (default N).

    Shape:
        particles (N, d); private (M, d); projections (k, d); noise_particles (N, k); noise_private (M, k);
        brownian (N, d). Returns ``(new_particles (N, d), drift (N, d))``.
        Noise is a standard deviation in the unit of the projected values (same unit as x).

    Raises:
        ValueError: N < 2, mismatched shapes, non-finite inputs, step_size <= 0, reg < 0, reg > 0 without
            ``brownian``, unknown ``quantiles``.

    Autograd: differentiable almost everywhere through the noisy projections (sort and interpolation are
    piecewise linear); the flow itself never needs gradients.

    References:
        Sebag et al., "Differentially private gradient flow based on the sliced Wasserstein distance", TMLR,
        Euler--Maruyama scheme and drift (Sebag et al., TMLR); the authors' DPSWflow code for the grid procedure.
    """
    check_choice(quantiles, "quantiles", ("exact", "grid"))
    if quantiles == "exact":
        transport = transport_exact
    else:
        q = None if num_quantiles is None else check_int(num_quantiles, "num_quantiles", 2)
        transport = lambda xp, yp: transport_grid(xp, yp, xp.shape[0] if q is None else q)  # noqa: E731
    return step_with_transport(particles, private, projections, noise_particles, noise_private, step_size, reg,
                               brownian, transport)


def step_with_transport(particles, private, projections, noise_particles, noise_private, step_size, reg, brownian,
                        transport) -> Tuple[torch.Tensor, torch.Tensor]:
    """The step shared by every quantile mode: validate, project, add the given noise, ``target = transport(xp, yp)``
    ((N, k) target quantiles for the (N, k) noisy particle and (M, k) noisy private projections; ``private`` may
    be None, then ``yp`` is None and the transport carries its own target), drift
    ``(xp − target) Θ / k`` and the Euler--Maruyama update. Arguments and shapes as in :func:`flow_step`."""
    check_tensor(particles, "particles", 2)
    if private is not None:  # None: the target is not private rows (sketch mode, fastdpot.reference.flow_sketch)
        check_tensor(private, "private", 2)
        check_same_dim(particles, private, "particles", "private")
    check_tensor(projections, "projections", 2)
    d = check_same_dim(particles, projections, "particles", "projections")
    n, m, k = particles.shape[0], 0 if private is None else private.shape[0], projections.shape[0]
    if n < 2:
        raise ValueError(f"particles must have at least 2 rows (N >= 2), got N={n}")
    h = check_positive(step_size, "step_size")
    lam = check_nonnegative(reg, "reg")
    for t, name, rows in ((noise_particles, "noise_particles", n), (noise_private, "noise_private", m)):
        if t is not None:
            check_tensor(t, name, 2)
            if tuple(t.shape) != (rows, k):
                raise ValueError(f"{name} must have shape ({rows}, {k}), got {tuple(t.shape)}")
    if lam > 0:
        if brownian is None:
            raise ValueError(f"brownian must be given when reg > 0, got reg={lam!r} and brownian=None")
        check_tensor(brownian, "brownian", 2)
        if tuple(brownian.shape) != (n, d):
            raise ValueError(f"brownian must have shape ({n}, {d}), got {tuple(brownian.shape)}")

    if private is None and noise_private is not None:
        raise ValueError("noise_private must be None when there are no private rows (private=None)")
    xp = particles @ projections.t()
    yp = None if private is None else private.to(particles.dtype) @ projections.t()
    if noise_particles is not None:
        xp = xp + noise_particles
    if noise_private is not None:
        yp = yp + noise_private
    target = transport(xp, yp)
    drift = (xp - target) @ projections / k
    new = particles - h * drift
    if lam > 0:
        new = new + math.sqrt(2.0 * lam * h) * brownian
    return new, drift
