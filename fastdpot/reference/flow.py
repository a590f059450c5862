r"""Reference (pure torch) step of the DP sliced-Wasserstein particle flow -- Sebag et al., TMLR.

One Euler--Maruyama step of the smoothed sliced-Wasserstein gradient flow with diffusion coefficient λ (the
papers' entropic regularisation):

.. math::

    x_i \leftarrow x_i - h\, v(x_i) + \sqrt{2 \lambda h}\, \xi_i, \qquad
    v(x_i) = \frac1k \sum_{j=1}^k \big(s_{ij} - Q_j(u_{ij})\big)\, \theta_j,

with :math:`s_{ij} = \theta_j^\top x_i + \sigma\zeta_{ij}` the noisy projected particles, :math:`u_{ij}` the level of
:math:`s_{ij}` among the particles of direction j, and :math:`Q_j` the target quantile function.

The particle level u (``quantiles``):

* ``"exact"`` (sort-based quantile transport): the particle of rank r (0-based, stable) sits at ``r/(N-1)``;
* ``"grid"`` (the authors' code, ilanasebag/dpswgf): the particles' quantiles on ``linspace(0, 1, Q)``
  (Q = ``num_quantiles``, default N), then ``u = interp(s; particle quantiles -> levels)`` (``numpy.interp``);
* ``"histogram"`` (sort-free): ``B`` = ``histogram_bins`` equal bins on ``[min_i s_ij, max_i s_ij]``;
  ``t = (s − lo)/w``, ``b = min(⌊t⌋, B−1)``, ``u = (C_jb + (t − b) n_jb)/N`` (``n_jb`` particles in bin b, ``C_jb``
  below it): the piecewise-linear empirical CDF between bin edges. Against the exact level it errs by at most
  ``(n_jb + 1)/N``; for smooth densities the in-bin interpolation makes the typical error O(1/B²).

The target Q_j:

* points (``private`` rows): the sorted noisy private projections ``θ_jᵀy_m + σ ν_mj``, read by linear
  interpolation at position ``u (M-1)``; in grid mode the authors' rule ``T = interp(u; levels -> private
  quantiles on the grid)``;
* a released quantile table (``sketch=(table, levels)``, e.g. the post-processed
  :func:`fastdpot.privacy.sliced_quantile_sketch`): ``Q_j`` piecewise linear through ``(levels[l], table[j, l])``,
  the end segments extended, u clamped to [0, 1], constant when L = 1 (:func:`table_quantiles`).

Sharding (``shard``): the rows given are rows ``[offset, offset + n)`` of N particles held by several processes;
``shard`` (duck-typed as :class:`fastdpot.ops.Shard`: ``offset``, ``num_particles``,
``all_reduce(tensor, op)`` with op ``"sum"``/``"max"`` in place, ``all_gather(tensor)`` returning every process's
rows in global order) makes the levels global: histogram mode all-reduces each direction's extremes and its (k, B)
counts (O(k·B) per step, independent of N), exact and grid modes all-gather the (N, k) projections. Everything else
is per particle, so the shards together compute what one process computes on all N rows.

This module is the baseline that the fused C++ (``csrc/flow.cpp``, ``csrc/flow_histogram.cpp``), Triton and CUDA
steps are tested and benchmarked against; the noise is given (the op's reference backend draws it from the keyed
streams of :mod:`fastdpot.reference.philox`).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .._validate import check_choice, check_int, check_nonnegative, check_positive, check_same_dim, check_tensor

__all__ = ["flow_step", "particle_levels", "histogram_bins", "histogram_levels", "target_at", "table_quantiles",
           "check_sketch_target", "check_quantile_sizes", "quantiles_sorted", "interp", "QUANTILE_MODES"]

#: The particle-level modes of the step.
QUANTILE_MODES = ("exact", "grid", "histogram")


def check_quantile_sizes(quantiles: str, num_quantiles: Optional[int] = None,
                         histogram_bins: Optional[int] = None) -> Tuple[Optional[int], Optional[int]]:
    """The one check of the particle-level mode and its size keywords (the op :func:`fastdpot.ops.flow_step`, this
    module's :func:`flow_step` and :class:`fastdpot.flows.FlowConfig` call it); returns ``(num_quantiles,
    histogram_bins)`` as ints, or None where not given.

    Args:
        quantiles: one of :data:`QUANTILE_MODES`.
        num_quantiles: Q >= 2, the ``"grid"`` mode's grid size (None: N); only with ``quantiles="grid"``.
        histogram_bins: B >= 1, the ``"histogram"`` mode's bins per direction; required there, refused elsewhere.

    Raises:
        ValueError: an unknown mode; ``num_quantiles`` outside grid mode or < 2; ``histogram_bins`` missing in
            histogram mode, given outside it, or < 1.
    """
    check_choice(quantiles, "quantiles", QUANTILE_MODES)
    if num_quantiles is not None:
        if quantiles != "grid":
            raise ValueError(f"num_quantiles is the size of the 'grid' mode's quantile grid; got "
                             f"num_quantiles={num_quantiles!r} with quantiles={quantiles!r}")
        num_quantiles = check_int(num_quantiles, "num_quantiles", 2)
    if quantiles == "histogram":
        if histogram_bins is None:
            raise ValueError("histogram_bins (B, the histogram's bins per direction) is required for "
                             "quantiles='histogram'")
        histogram_bins = check_int(histogram_bins, "histogram_bins", 1)
    elif histogram_bins is not None:
        raise ValueError(f"histogram_bins is only used with quantiles='histogram', got histogram_bins="
                         f"{histogram_bins!r}")
    return num_quantiles, histogram_bins


# ------------------------------------------------------------------------------------------------------------
# interpolation helpers
# ------------------------------------------------------------------------------------------------------------
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


def target_at(sorted_target: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Linear interpolation of sorted columns (M, k) at positions ``u (M-1)``, u (N, k) in [0, 1] -> (N, k)."""
    m = sorted_target.shape[0]
    pos = u * (m - 1)
    lo = pos.to(torch.int64).clamp(0, m - 1)
    hi = (lo + 1).clamp(max=m - 1)
    f = pos - lo.to(pos.dtype)
    a = sorted_target.gather(0, lo)
    return a + f * (sorted_target.gather(0, hi) - a)


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
    """``Q_j(u_ij)`` of a quantile table (module docstring: end segments extended, u clamped to [0, 1]).

    Shape:
        table (k, L); levels (L,) strictly increasing; u (N, k) -> (N, k), in the table's dtype.
    """
    from ..privacy.sketch import quantile_table_eval

    return quantile_table_eval(table, levels, u.t()).t().clone()


# ------------------------------------------------------------------------------------------------------------
# particle levels
# ------------------------------------------------------------------------------------------------------------
def histogram_bins(xp: torch.Tensor, lo: torch.Tensor, width: torch.Tensor, histogram_bins: int):
    """Bin index and position inside the bin of every entry of ``xp`` for the B = ``histogram_bins`` bins
    ``[lo + b width, lo + (b+1) width)``, b = 0 … B − 1 (values below / above the range clamped into the first /
    last bin).

    Shape:
        xp any shape, ``lo`` / ``width`` broadcastable to it -> (int64 bin index, fraction in [0, 1] in xp's
        dtype), both of xp's shape.
    """
    t = ((xp - lo) / width).clamp(0, histogram_bins)
    b = t.to(torch.int64).clamp(max=histogram_bins - 1)  # t >= 0: truncation is floor
    return b, t - b.to(t.dtype)


def _histogram_levels(s: torch.Tensor, bins: int, shard) -> torch.Tensor:
    k = s.shape[1]
    lo, hi = s.amin(0), s.amax(0)
    n = s.shape[0]
    if shard is not None:  # the global extremes: one MAX over (hi, −lo), exact in float64
        ext = torch.cat([hi, -lo]).double()
        shard.all_reduce(ext, "max")
        lo, hi = (-ext[k:]).to(s.dtype), ext[:k].to(s.dtype)
        n = shard.num_particles
    width = (hi - lo) / bins
    width = torch.where(width > 0, width, torch.ones_like(width))
    b, frac = histogram_bins(s, lo, width, bins)
    counts = torch.zeros(k, bins, dtype=torch.int64, device=s.device)
    counts.scatter_add_(1, b.t(), torch.ones_like(b.t()))
    if shard is not None:
        shard.all_reduce(counts, "sum")
    below = torch.cumsum(counts, dim=1) - counts
    cnt = counts.gather(1, b.t()).t()
    blw = below.gather(1, b.t()).t()
    return (blw.to(s.dtype) + frac * cnt.to(s.dtype)) / n


def histogram_levels(xp: torch.Tensor, histogram_bins: int) -> torch.Tensor:
    """Histogram-CDF level ``u`` in [0, 1] of every entry of the noisy particle projections (module docstring).

    Shape:
        xp (N, k) -> (N, k), same dtype.
    """
    return _histogram_levels(xp, check_int(histogram_bins, "histogram_bins", 1), None)


def _rank_levels(s: torch.Tensor) -> torch.Tensor:
    n, k = s.shape
    order = torch.argsort(s.t().contiguous(), dim=1, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(n, device=s.device).expand(k, n).contiguous())
    return ranks.t().to(torch.float64) / (n - 1)  # float64: a table target reads the exact level


def _grid_levels(s: torch.Tensor, full: torch.Tensor, q: int) -> torch.Tensor:
    levels = torch.linspace(0, 1, q, dtype=torch.float64, device=s.device)
    xq = quantiles_sorted(torch.sort(full.t().contiguous(), dim=1).values.t(), levels)
    lv = levels.to(s.dtype).unsqueeze(1).expand(-1, s.shape[1])
    return interp(s, xq, lv)


def particle_levels(s: torch.Tensor, quantiles: str, num_quantiles: Optional[int] = None,
                    histogram_bins: Optional[int] = None, shard=None) -> torch.Tensor:
    """The level u in [0, 1] of every noisy particle projection among all N particles (module docstring).

    Shape:
        s (n, k): this process's rows (all N without ``shard``) -> (n, k), float64 in exact mode (r/(N-1) exactly),
        else in s's dtype.
    """
    if quantiles == "histogram":
        return _histogram_levels(s, histogram_bins, shard)
    full = s if shard is None else shard.all_gather(s)
    lo = 0 if shard is None else shard.offset
    if quantiles == "exact":
        return _rank_levels(full)[lo:lo + s.shape[0]]
    return _grid_levels(s, full, full.shape[0] if num_quantiles is None else num_quantiles)


# ------------------------------------------------------------------------------------------------------------
# the step
# ------------------------------------------------------------------------------------------------------------
def _targets(u, s, yp, sketch, quantiles, num_quantiles, n_total):
    """Q_j at the levels u (n, k): from the noisy private projections ``yp`` (M, k) or the table ``sketch``."""
    if sketch is not None:
        table, levels = sketch
        return table_quantiles(table.to(s.device).double(), levels.to(s.device).double(), u.double()).to(s.dtype)
    ys = torch.sort(yp, dim=0).values
    u = u.to(s.dtype)
    if quantiles == "grid":
        q = n_total if num_quantiles is None else num_quantiles
        levels = torch.linspace(0, 1, q, dtype=torch.float64, device=s.device)
        tq = quantiles_sorted(ys, levels)
        return interp(u, levels.to(s.dtype).unsqueeze(1).expand(-1, s.shape[1]), tq)
    return target_at(ys, u)


def flow_step(particles: torch.Tensor, private: Optional[torch.Tensor], projections: torch.Tensor,
              noise_particles: Optional[torch.Tensor], noise_private: Optional[torch.Tensor], step_size: float,
              diffusion: float = 0.0, brownian: Optional[torch.Tensor] = None, quantiles: str = "exact",
              num_quantiles: Optional[int] = None, histogram_bins: Optional[int] = None,
              sketch: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
              shard=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """One step of the (DP) sliced-Wasserstein particle flow, Sebag et al., TMLR, given all random draws.

    Args:
        particles: current particles x (this process's rows when sharded).
        private: private batch y, already clipped by the caller (this function releases nothing); None with a
            ``sketch``.
        projections: directions θ (rows; unit norm in the flow, any rows accepted here).
        noise_particles: σ-scaled Gaussian noise added to the particle projections (None = no noise).
        noise_private: σ-scaled Gaussian noise added to the private projections (None = no noise).
        step_size: h > 0.
        diffusion: λ >= 0, the coefficient of the Brownian term sqrt(2λh)·ξ.
        brownian: standard normals ξ; required when λ > 0.
        quantiles: one of :data:`QUANTILE_MODES`.
        num_quantiles: Q >= 2, the size of the ``"grid"`` mode's quantile grid (default N).
        histogram_bins: B >= 1, the ``"histogram"`` mode's bins per direction (required there).
        sketch: None, or ``(table (k, L), levels (L,))`` with ``private=None``: the target is the table.
        shard: None, or the process's place among sharded rows (module docstring).

    Shape:
        particles (n, d); private (M, d); projections (k, d); noise_particles (n, k); noise_private (M, k);
        brownian (n, d). Returns ``(new_particles (n, d), drift (n, d))``. σ and table values are in the unit of the
        projected values (the unit of x).

    Raises:
        ValueError: N < 2, mismatched shapes, non-finite inputs, step_size <= 0, λ < 0, λ > 0 without
            ``brownian``, a bad mode or size (:func:`check_quantile_sizes`), both or neither of ``private`` and
            ``sketch``, a bad table (:func:`check_sketch_target`).

    Autograd: not meant for differentiation (ranks and bins are piecewise constant); the flow needs no gradients.

    References:
        Sebag et al., "Differentially private gradient flow based on the sliced Wasserstein distance", TMLR
        (Euler--Maruyama scheme and drift; the authors' DPSWflow code for the grid procedure).
    """
    check_choice(quantiles, "quantiles", QUANTILE_MODES)
    check_tensor(particles, "particles", 2)
    check_tensor(projections, "projections", 2)
    d = check_same_dim(particles, projections, "particles", "projections")
    if (private is None) == (sketch is None):
        raise ValueError("give exactly one target: private rows, or a quantile table (private=None, sketch=...)")
    if private is not None:
        check_tensor(private, "private", 2)
        check_same_dim(particles, private, "particles", "private")
    else:
        check_sketch_target(sketch[0], sketch[1], projections.shape[0])
    n, m, k = particles.shape[0], 0 if private is None else private.shape[0], projections.shape[0]
    n_total = n if shard is None else int(shard.num_particles)
    if n_total < 2:
        raise ValueError(f"particles must have at least 2 rows (N >= 2), got N={n_total}")
    h = check_positive(step_size, "step_size")
    lam = check_nonnegative(diffusion, "diffusion")
    num_quantiles, histogram_bins = check_quantile_sizes(quantiles, num_quantiles, histogram_bins)
    for t, name, rows in ((noise_particles, "noise_particles", n), (noise_private, "noise_private", m)):
        if t is not None:
            check_tensor(t, name, 2)
            if tuple(t.shape) != (rows, k):
                raise ValueError(f"{name} must have shape ({rows}, {k}), got {tuple(t.shape)}")
    if private is None and noise_private is not None:
        raise ValueError("noise_private must be None when there are no private rows (private=None)")
    if lam > 0:
        if brownian is None:
            raise ValueError(f"brownian must be given when diffusion > 0, got diffusion={lam!r} and brownian=None")
        check_tensor(brownian, "brownian", 2)
        if tuple(brownian.shape) != (n, d):
            raise ValueError(f"brownian must have shape ({n}, {d}), got {tuple(brownian.shape)}")

    s = particles @ projections.t()
    if noise_particles is not None:
        s = s + noise_particles
    yp = None
    if private is not None:
        yp = private.to(particles.dtype) @ projections.t()
        if noise_private is not None:
            yp = yp + noise_private
    u = particle_levels(s, quantiles, num_quantiles, histogram_bins, shard)
    target = _targets(u, s, yp, sketch, quantiles, num_quantiles, n_total)
    drift = (s - target) @ projections / k
    new = particles - h * drift
    if lam > 0:
        new = new + math.sqrt(2.0 * lam * h) * brownian
    return new, drift
