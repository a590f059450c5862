"""Reference (pure torch) flow step towards a released quantile TABLE (sketch mode of op ``"flow_step"``).

In sketch mode the target of direction j is not a set of noisy private projections but a released, post-processed
quantile table: values ``table[j, l]`` at levels ``levels[l]`` (l = 0..L-1, strictly increasing in [0, 1]), e.g. the
isotonic fit of :func:`fastdpot.privacy.sliced_quantile_sketch`'s noisy bin means at the bins' centre levels. The
target quantile function is

.. math::

    Q_j(u) = t_{j,s} + (u - u_s)\\,\\frac{t_{j,s+1} - t_{j,s}}{u_{s+1} - u_s},\\qquad
    s = \\min(\\max(\\#\\{l : u_l \\le u\\} - 1, 0), L - 2),\\quad u \\leftarrow \\min(\\max(u, 0), 1),

i.e. piecewise linear through the points ``(u_l, t_{j,l})``, extended on ``[0, u_0]`` and ``[u_{L-1}, 1]`` with the
slope of the first / last segment (linear extrapolation, not a constant), and the constant ``t_{j,0}`` when L = 1.
A non-decreasing table row gives a non-decreasing Q_j.

The particle side is unchanged: the level of a noisy particle projection is ``r/(N-1)`` for its rank r (``"exact"``),
the authors' grid CDF (``"grid"``: ``interp(s; xq -> linspace(0, 1, Q))``) or the histogram CDF (``"histogram"``,
:func:`fastdpot.reference.flow_histogram.histogram_levels`); the target is ``Q_j(level)``. The fused C++ step
(``csrc/flow.cpp``, table path) is tested against this module with replayed noise.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .._validate import check_choice, check_int, check_tensor
from .flow import interp, quantiles_sorted, step_with_transport

__all__ = ["check_sketch_target", "table_quantiles", "transport_exact_table", "transport_grid_table",
           "flow_step_sketch"]


def check_sketch_target(table: torch.Tensor, levels: torch.Tensor, num_projections: Optional[int] = None,
                        name: str = "sketch"):
    """Validate a quantile table and its levels; returns them unchanged.

    Shape:
        table (k, L); levels (L,) strictly increasing in [0, 1].

    Raises:
        ValueError / TypeError: non-tensors, wrong dimensions or dtypes, NaN/Inf, empty, levels not strictly
            increasing or outside [0, 1], a table whose k differs from ``num_projections``.
    """
    check_tensor(table, f"{name} table", 2)
    check_tensor(levels, f"{name} levels", 1)
    if table.shape[1] != levels.shape[0]:
        raise ValueError(f"{name}: table (k, L) and levels (L,) disagree on L: {tuple(table.shape)} vs "
                         f"{tuple(levels.shape)}")
    if num_projections is not None and table.shape[0] != num_projections:
        raise ValueError(f"{name} table must have one row per direction (k={num_projections}), got shape "
                         f"{tuple(table.shape)}")
    lv = levels.detach().double()
    if bool((lv < 0).any()) or bool((lv > 1).any()):
        raise ValueError(f"{name} levels must lie in [0, 1], got min {float(lv.min())!r}, max {float(lv.max())!r}")
    if lv.numel() > 1 and not bool((lv[1:] > lv[:-1]).all()):
        raise ValueError(f"{name} levels must be strictly increasing")
    return table, levels


def table_quantiles(table: torch.Tensor, levels: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``Q_j(u_ij)`` of the piecewise-linear table rule of this module (end segments extended, u clamped to [0, 1]).

    Shape:
        table (k, L); levels (L,) strictly increasing; u (N, k) -> (N, k), in the table's dtype.
    """
    from ..privacy.sketch import quantile_table_eval

    return quantile_table_eval(table, levels, u.t()).t().clone()


def transport_exact_table(xp: torch.Tensor, table: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Rank transport onto the table: the particle of rank r (0-based, stable order) in direction j gets
    ``Q_j(r/(N-1))``. Shape: xp (N, k) -> (N, k)."""
    n, k = xp.shape
    order = torch.argsort(xp.t().contiguous(), dim=1, stable=True)
    lvl = (torch.arange(n, dtype=torch.float64, device=xp.device) / (n - 1)).unsqueeze(1).expand(n, k)
    tq = table_quantiles(table.double(), levels.double(), lvl).t().contiguous()  # (k, N): target of rank r
    out = torch.empty(k, n, dtype=xp.dtype, device=xp.device)
    out.scatter_(1, order, tq.to(xp.dtype))
    return out.t()


def transport_grid_table(xp: torch.Tensor, table: torch.Tensor, levels: torch.Tensor,
                         num_quantiles: int) -> torch.Tensor:
    """The authors' grid CDF of the particles (Q levels ``linspace(0, 1, Q)``, ``numpy.interp``), then the table:
    target ``Q_j(cdf)``. Shape: xp (N, k) -> (N, k)."""
    lv = torch.linspace(0, 1, num_quantiles, dtype=torch.float64, device=xp.device)
    xq = quantiles_sorted(torch.sort(xp.t().contiguous(), dim=1).values.t(), lv)
    cdf = interp(xp, xq, lv.to(xp.dtype).unsqueeze(1).expand(-1, xp.shape[1]))
    return table_quantiles(table.double(), levels.double(), cdf.double()).to(xp.dtype)


def flow_step_sketch(particles: torch.Tensor, table: torch.Tensor, levels: torch.Tensor,
                     projections: torch.Tensor, noise_particles: Optional[torch.Tensor], step_size: float,
                     reg: float = 0.0, brownian: Optional[torch.Tensor] = None, quantiles: str = "exact",
                     num_quantiles: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """One flow step towards a quantile table (sketch mode), given all random draws.

    Args:
        particles: current particles x.
        table: released target quantiles of each direction (already post-processed; this function releases
            nothing). Rows should be non-decreasing for a monotone transport (not required).
        levels: the table's levels, strictly increasing in [0, 1].
        projections: directions θ (rows), one per table row.
        noise_particles: σ-scaled Gaussian smoothing noise on the particle projections (None = none; the flows
            use none in sketch mode, see :class:`fastdpot.flow.DPSlicedWassersteinFlow`).
        step_size: h > 0. reg: λ >= 0. brownian: standard normals ξ (required when reg > 0).
        quantiles: particle level: ``"exact"`` (rank r -> r/(N-1)), ``"grid"`` (the authors' Q-level grid CDF,
            Q = ``num_quantiles``, default N) or ``"histogram"`` (``num_quantiles`` bins, required).

    Shape:
        particles (N, d); table (k, L); levels (L,); projections (k, d); noise_particles (N, k); brownian (N, d).
        Returns ``(new_particles (N, d), drift (N, d))``. Table values and σ are in the unit of the projected
        values.

    Raises:
        ValueError: as :func:`fastdpot.reference.flow.flow_step`, plus a bad table / levels
            (:func:`check_sketch_target`) or ``quantiles="histogram"`` without ``num_quantiles``.

    References:
        Sebag et al., "Differentially private gradient flow based on the sliced Wasserstein distance", TMLR
        (Euler--Maruyama scheme and drift); the table target is fastdpot's sliced quantile sketch.
    """
    check_choice(quantiles, "quantiles", ("exact", "grid", "histogram"))
    check_tensor(projections, "projections", 2)
    check_sketch_target(table, levels, projections.shape[0])
    if quantiles == "exact":
        def transport(xp, _):
            return transport_exact_table(xp, table, levels)
    elif quantiles == "grid":
        q = None if num_quantiles is None else check_int(num_quantiles, "num_quantiles", 2)

        def transport(xp, _):
            return transport_grid_table(xp, table, levels, xp.shape[0] if q is None else q)
    else:
        if num_quantiles is None:
            raise ValueError("num_quantiles (the number of histogram bins) is required for quantiles='histogram'")
        b = check_int(num_quantiles, "num_quantiles", 1)
        from .flow_histogram import histogram_levels

        def transport(xp, _):
            return table_quantiles(table.double(), levels.double(), histogram_levels(xp, b).double()).to(xp.dtype)
    return step_with_transport(particles, None, projections, noise_particles, None, step_size, reg, brownian,
                               transport)
