r"""The sliced quantile sketch: sort, bin, sum, then noise — an aggregate release of a batch's projected law.

The per-point release of the DP sliced-Wasserstein methods publishes every projected private value with noise of
standard deviation σ: when σ is much larger than a class's spread along a direction, each release holds the class
mean and little of its shape. The sketch releases, per direction, the SUMS of the sorted projected values over L
contiguous rank bins, each with one Gaussian draw of the same σ. The sensitivity of the sums is no larger than that
of the per-point release (proof in :func:`sliced_quantile_sketch`), so the same σ buys the same (ε, δ), while the
bin MEANS carry noise σ/m_l (m_l = the bin's size): a coarse but far less noisy quantile function.

Bins depend only on the batch size B and L (never on the data): ``sizes = bin_sizes(B, L)`` gives the first
``B mod L`` bins ⌈B/L⌉ ranks and the others ⌊B/L⌋, in rank order. The level of a bin is the mean rank level
``r/(B−1)`` of its ranks — the convention of the flows' exact rank map F(x_(r)) = r/(N−1) — and 0.5 when B = 1.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .._validate import check_bool, check_int, check_nonnegative, check_positive, check_tensor
from .mechanisms import clip_rows, normalize_rows
from .randomness import PrivacyRandomness, privacy_randomness

__all__ = ["QuantileSketch", "sliced_quantile_sketch", "bin_sizes", "bin_levels", "bin_index", "sketch_quantile_table",
           "quantile_table_eval"]


class QuantileSketch(NamedTuple):
    """One sketch release (indexable like a tuple: ``means, levels, sizes, noise = sketch``).

    Attributes:
        means: (k, L) float64, the noisy bin means (noisy bin sum / bin size), one row per direction.
        levels: (L,) float64, each bin's centre rank level in [0, 1] (strictly increasing).
        sizes: (L,) int64, the number of ranks in each bin (sum B; they depend only on B and L).
        noise: (k, L) float64 Gaussian noise added to the bin SUMS (only with ``return_noise=True``, else None).
    """

    means: torch.Tensor
    levels: torch.Tensor
    sizes: torch.Tensor
    noise: Optional[torch.Tensor] = None


def bin_sizes(batch_size: int, sketch_bins: int) -> torch.Tensor:
    """Sizes of the L contiguous rank bins of a batch of B values: the first ``B mod L`` bins hold ⌈B/L⌉ ranks,
    the others ⌊B/L⌋ (a function of B and L only).

    Shape: returns (L,) int64 summing to B.

    Raises:
        ValueError: B < 1, L < 1 or L > B.
    """
    b = check_int(batch_size, "batch_size", 1)
    L = check_int(sketch_bins, "sketch_bins", 1)
    if L > b:
        raise ValueError(f"sketch_bins must be at most the batch size {b}, got {L}")
    sizes = torch.full((L,), b // L, dtype=torch.int64)
    sizes[: b % L] += 1
    return sizes


def bin_levels(sizes: torch.Tensor) -> torch.Tensor:
    """Centre rank level of each bin: the mean of r/(B−1) over the bin's ranks r (0.5 when B = 1).

    Shape: sizes (L,) -> (L,) float64 in [0, 1], strictly increasing.
    """
    sizes = torch.as_tensor(sizes, dtype=torch.int64)
    b = int(sizes.sum())
    if b == 1:
        return torch.full((1,), 0.5, dtype=torch.float64, device=sizes.device)
    starts = torch.cumsum(sizes, 0) - sizes
    return (starts.double() + (sizes.double() - 1.0) / 2.0) / (b - 1)


def bin_index(sizes: torch.Tensor) -> torch.Tensor:
    """The bin of every rank 0..B−1: (B,) int64 on ``sizes``' device, non-decreasing (``repeat_interleave`` of the
    bin numbers)."""
    sizes = torch.as_tensor(sizes, dtype=torch.int64)
    return torch.repeat_interleave(torch.arange(sizes.numel(), device=sizes.device), sizes)


def sliced_quantile_sketch(x_private: torch.Tensor, projections: torch.Tensor, sketch_bins: int, noise_std: float,
                           clip_radius: float = 1.0, normalize: bool = False,
                           generator: Optional[torch.Generator] = None, return_noise: bool = False, *,
                           secure_mode: bool = True) -> QuantileSketch:
    r"""Release the sliced quantile sketch of a private batch: per direction θ_j, the noisy means of the sorted
    projected rows over L contiguous rank bins.

    For each direction j: clip (or normalise) the rows inside, project, sort the B values
    :math:`s_{j,(0)} \le \dots \le s_{j,(B-1)}`, sum them over the rank bins :math:`I_1, \dots, I_L` of
    :func:`bin_sizes` (sizes :math:`m_l`, a function of B and L only), add independent
    :math:`\mathcal N(0, \sigma^2)` to every bin sum, and return the means

    .. math::  \hat q_{j,l} = \frac{1}{m_l}\Big(\sum_{r \in I_l} s_{j,(r)} + v_{j,l}\Big),
               \qquad v_{j,l} \sim \mathcal N(0, \sigma^2)\ \text{i.i.d.}

    Sensitivity (replace-one neighbours, fixed batch size B). Let X, X′ be batches of B rows that differ in row i
    only (after clipping, ‖x_i‖, ‖x′_i‖ ≤ r), and fix a direction θ. Let a = Xθ, a′ = X′θ, which differ only in
    entry i, say a′_i = a_i + t with t ≥ 0 (else swap X and X′). Every order statistic is non-decreasing in every
    entry (:math:`s_{(r)} = \min_{|S| = r+1} \max_{j \in S} a_j`, ranks from 0: the smallest maximum over sets of
    r+1 entries), so sort(a′) ≥ sort(a) entrywise, and therefore

    .. math::  \lVert \mathrm{sort}(a') - \mathrm{sort}(a) \rVert_1 = \sum_r (s'_{(r)} - s_{(r)})
               = \sum_j a'_j - \sum_j a_j = t = |\theta^\top (x_i - x'_i)| .

    The bin sums are sums of disjoint groups of those entries, so the vector of the L bin sums moves by at most the
    same ℓ1 amount (exactly, since every entry moves the same way), and ℓ2 ≤ ℓ1. Over the k directions,

    .. math::  \lVert f(X) - f(X') \rVert_2^2 = \sum_j \lVert S_j - S'_j \rVert_2^2
               \le \sum_j (\theta_j^\top (x_i - x'_i))^2 = \lVert \Theta (x_i - x'_i) \rVert_2^2 ,

    which is the change of the per-point release :math:`X\Theta^\top` under the same substitution. Hence the
    sensitivity bound of the per-point release applies unchanged: :math:`\Delta = 2r\sqrt{\lceil k/d\rceil}` for
    blocks of orthonormal directions (:func:`~fastdpot.privacy.orthogonal_sliced_sensitivity`) and
    :math:`2r\sqrt{w(k, \delta_t)}` with probability 1 − δ_t over uniform directions
    (:func:`~fastdpot.privacy.sliced_sensitivity`). The release is a Gaussian mechanism of noise multiplier σ/Δ on
    the bin sums, composed and subsampled (fixed-size batches without replacement) exactly as the per-point release;
    dividing by the public sizes m_l is post-processing, so bin l's mean carries noise of std σ/m_l.
    The argument needs the bins to be the same for X and X′: it holds for a fixed batch size (substitution), not
    for add/remove neighbours (where B changes by one and the bins move).

    Args:
        x_private: (B, d) private rows; clipped to the ℓ2 ball of ``clip_radius`` (or, with ``normalize=True``, scaled
            onto the sphere of that radius) inside.
        projections: Θ, (k, d) with unit-norm rows, drawn independently of the data.
        sketch_bins: L, 1 <= L <= B. L = 1 releases each direction's mean; L = B every sorted value.
        noise_std: σ >= 0, the standard deviation of the noise on each bin SUM (a length in the data's unit); 0 is
            the noiseless sketch (no privacy).
        clip_radius: r > 0, the clipping radius (neighbouring rows differ by at most 2r).
        normalize: put the rows on the sphere of radius r instead of clipping.
        generator: ``torch.Generator`` of the noise, used only with ``secure_mode=False`` (replayable); or a
            :class:`~fastdpot.privacy.PrivacyRandomness` (then ``secure_mode`` is its own).
        return_noise: also return the noise added to the bin sums (to replay the release in tests).
        secure_mode: True (default): the noise comes from the operating system's CSPRNG
            (:class:`~fastdpot.privacy.PrivacyRandomness`); False: from ``generator``, replayable, with no guarantee
            against anyone who holds its seed. Either way the normals are drawn in float64 (wide tails).

    Shape:
        x_private (B, d); projections (k, d) -> :class:`QuantileSketch` with means (k, L) float64, levels (L,)
        float64, sizes (L,) int64, noise (k, L) float64 or None.

    Raises:
        ValueError / TypeError: non-tensor, empty, non-finite or mis-shaped inputs, mismatched d, rows of Θ not of
            unit norm, ``sketch_bins`` < 1 or > B, ``noise_std`` < 0 or not finite, ``clip_radius`` <= 0,
            ``generator`` not a torch.Generator, or given with ``secure_mode=True``.

    References:
        Rakotomamonjy & Ralaivola, "Differentially Private Sliced Wasserstein Distance", ICML 2021 (the projected
        Gaussian mechanism and its sensitivity); Sebag et al., "Differentially Private Gradient Flow based on the
        Sliced Wasserstein Distance", TMLR (the flows that consume the released quantiles).
    """
    check_tensor(x_private, "x_private", 2)
    check_tensor(projections, "projections", 2)
    b, d = x_private.shape
    if projections.shape[1] != d:
        raise ValueError(f"projections must have shape (k, d) with d = x_private.shape[1] = {d}, got "
                         f"{tuple(projections.shape)}")
    sketch_bins = check_int(sketch_bins, "sketch_bins", 1)
    if sketch_bins > b:
        raise ValueError(f"sketch_bins must be at most the batch size B = {b} (one rank per bin at most), got "
                         f"{sketch_bins}")
    sigma = check_nonnegative(noise_std, "noise_std")
    clip_radius = check_positive(clip_radius, "clip_radius")
    check_bool(normalize, "normalize")
    check_bool(return_noise, "return_noise")  # one rule for flags: 'no' would be read as True
    rng = generator if isinstance(generator, PrivacyRandomness) else privacy_randomness(secure_mode, generator)
    th = projections.detach().to(torch.float64)
    rn = torch.linalg.vector_norm(th, dim=1)
    tol = 1e-10 if projections.dtype == torch.float64 else 1e-6 if projections.dtype == torch.float32 else 1e-3
    if bool(((rn - 1.0).abs() > tol).any()):
        raise ValueError(f"projections must have unit-norm rows (the sensitivity bound assumes θ on the sphere), "
                         f"got row norms in [{float(rn.min()):.9g}, {float(rn.max()):.9g}]")
    x = x_private.detach().to(torch.float64)
    x = normalize_rows(x) * clip_radius if normalize else clip_rows(x, clip_radius)
    k = th.shape[0]
    sizes = bin_sizes(b, sketch_bins)
    # (B, k) projections, sorted per direction; bin sums by one index_add over the rank axis
    s = torch.sort(x @ th.transpose(0, 1), dim=0).values
    sums = torch.zeros(sketch_bins, k, dtype=torch.float64, device=s.device)
    sums.index_add_(0, bin_index(sizes).to(s.device), s)
    noise = rng.normal((k, sketch_bins), torch.float64, s.device) * sigma
    means = (sums.transpose(0, 1) + noise) / sizes.to(s.device, torch.float64)
    levels = bin_levels(sizes).to(s.device)
    return QuantileSketch(means, levels, sizes.to(s.device), noise if return_noise else None)


def sketch_quantile_table(sketch: QuantileSketch):
    """Post-process a released sketch into a monotone quantile table: per direction, the weighted isotonic
    (non-decreasing) fit of the noisy bin means, weights the bin sizes. Post-processing: no privacy cost.

    The target quantile function of direction j is then :func:`quantile_table_eval` of row j: piecewise linear
    through ``(levels[l], table[j, l])``.

    Shape:
        sketch.means (k, L) -> (table (k, L) float64, levels (L,) float64), on the sketch's device.

    References:
        ``scipy.optimize.isotonic_regression`` (pool adjacent violators).
    """
    from scipy.optimize import isotonic_regression

    means = sketch.means.detach().to("cpu", torch.float64).numpy()
    w = sketch.sizes.detach().to("cpu", torch.float64).numpy()
    fit = torch.stack([torch.from_numpy(isotonic_regression(row, weights=w, increasing=True).x.copy())
                       for row in means])
    return fit.to(sketch.means.device), sketch.levels.detach().to(sketch.means.device, torch.float64)


def quantile_table_eval(table: torch.Tensor, levels: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Q_j(u): piecewise linear through ``(levels[l], table[j, l])``, extended on [0, levels[0]] and
    [levels[-1], 1] with the slope of the first / last segment, constant for L = 1; u is clamped to [0, 1].

    Shape:
        table (k, L); levels (L,) strictly increasing; u (k, n) or (n,) levels -> (k, n), in ``table``'s dtype.
    """
    k, L = table.shape
    u = u.to(table.dtype).clamp(0.0, 1.0)
    if u.dim() == 1:
        u = u.unsqueeze(0).expand(k, -1)
    if L == 1:
        return table[:, :1].expand(-1, u.shape[1])
    lv = levels.to(table.dtype)
    s = (torch.searchsorted(lv.contiguous(), u.contiguous(), right=True) - 1).clamp(0, L - 2)
    u0, u1 = lv[s], lv[s + 1]
    t0, t1 = table.gather(1, s), table.gather(1, s + 1)
    return t0 + (u - u0) * ((t1 - t0) / (u1 - u0))
