r"""The one-shot release of a labelled data set: per class, the sliced quantile sketch of ALL its rows on a public set
of orthonormal directions, with the class histogram, in ONE Gaussian mechanism (labels private).

Every flow step after it is post-processing: particles of class c move towards class c's released quantiles
(:class:`fastdpot.flows.ReleasedTargetFlow`, :meth:`fastdpot.flows.ClassConditionalFlow.from_release`), at no further
privacy cost. Because the release reads each class once, in full, its noise per quantile falls like 1/n_c, where a
per-step release (DPSWflow-r) spends the budget on batches of B rows.

What is released (:func:`class_quantile_sketch`), for classes c < C, directions θ_j (rows of ``projections``, in
blocks of p orthonormal rows) and L_j bins per direction:

* the noisy count ñ_c = w·n_c + N(0, σ²) / w (``count_weight`` w),
* the noisy bin sums S̃_{c,j,l} = n_c ∫_{(l−1)/L_j}^{l/L_j} Q_{c,j}(u) du + N(0, σ²), l = 1 … L_j, where Q_{c,j} is
  the empirical quantile function of θ_jᵀ(x_i − m_c) over the rows of class c, clipped to ‖x_i − m_c‖ ≤ r inside
  (m_c a public centre). With n_c a multiple of L_j these are the sums of the sorted values over L_j equal rank bins;
  otherwise the bins split the boundary ranks fractionally (a function of the data set only).

Its sensitivity (:func:`class_sketch_sensitivity`, proof there): a row joining or leaving a class moves each block's
sums by at most √(2 + 2√(1 − 1/L))·r (L >= 2 the largest L_j; r if all L_j = 1), a bound that large blocks
and classes approach.

Post-processing (:meth:`ClassSketchRelease.quantile_tables`): bin means S̃ / (ñ_c / L_j) at the levels
(l − ½)/L_j, shrunk by their known noise (empirical Bayes pooled over the directions of one block and frequency
band, or James–Stein per direction), made non-decreasing (isotonic regression), and written on one level grid per
class for op ``flow_step``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral
from typing import List, Optional, Sequence, Tuple, Union

import torch

from .._blocks import DenseBlock, DirectionBlock, block_list
from .._validate import (COMPUTE_DTYPES, check_bool, check_int, check_memory, check_nonnegative, check_positive,
                         check_tensor)
from .mechanisms import clip_rows
from .moments import check_noise_scale, domain_labels
from .randomness import PrivacyRandomness, privacy_randomness
from .sketch_tables import (frequency_groups, isotonic_rows, piecewise_linear, pooled_locations, pooled_shrinkage,
                           shrink_quantiles)

__all__ = ["ClassSketchRelease", "class_quantile_sketch", "release_class_sketch", "class_sketch_sensitivity",
           "check_orthonormal_blocks", "direction_blocks", "fractional_bin_sums", "isotonic_rows", "SHRINKAGES",
           "check_shrinkage"]


def check_orthonormal_blocks(projections: torch.Tensor, block_size: int, name: str = "projections",
                             tol: Optional[float] = None) -> torch.Tensor:
    """Check that the rows of ``projections`` form blocks of ``block_size`` orthonormal rows (each block's Gram
    matrix is the identity within ``tol``: 1e-9 in float64, 1e-5 in float32); returns them in float64.

    Raises:
        ValueError: a row count that is not a multiple of the block size, a block larger than d, a block that is not
            orthonormal (the largest deviation is named).
    """
    check_tensor(projections, name, 2)
    k, d = projections.shape
    p = check_int(block_size, "block_size")
    if p > d or k % p:
        raise ValueError(f"{name} must hold whole blocks of block_size = {p} <= d = {d} rows, got {k} rows")
    th = projections.detach().to(torch.float64)
    tol = (1e-9 if projections.dtype == torch.float64 else 1e-5) if tol is None else tol
    blocks = th.view(k // p, p, d)
    gram = blocks @ blocks.transpose(1, 2)
    dev = float((gram - torch.eye(p, dtype=torch.float64)).abs().max())
    if dev > tol:
        raise ValueError(f"{name} must be blocks of {p} orthonormal rows (the sensitivity bound assumes it); the "
                         f"largest entry of Θ_bΘ_bᵀ − I is {dev:.3g}")
    return th


def direction_blocks(projections, d: int, block_size: Optional[int] = None) -> Tuple[DirectionBlock, ...]:
    """The release's directions as blocks, each checked orthonormal before anything is drawn: a (k, d) tensor of
    blocks of ``block_size`` rows (:func:`check_orthonormal_blocks`, then one
    :class:`fastdpot.flows.directions.DenseBlock` per block), or a sequence of
    :class:`fastdpot.flows.directions.DirectionBlock` of one size (a fast block is checked through its own transform
    by :meth:`DirectionBlock.check_orthonormal`: Θ(Θᵀu) = u for standard normal probes u, in float64).

    Raises:
        ValueError / TypeError: not orthonormal, blocks of another dimension than d or of different sizes, a
            ``block_size`` given with blocks.
    """
    if isinstance(projections, torch.Tensor):
        if projections.dim() != 2 or projections.shape[1] != d:
            raise ValueError(f"projections must be (k, {d}), got {tuple(projections.shape)}")
        p = d if block_size is None else check_int(block_size, "block_size")
        th = check_orthonormal_blocks(projections, p)
        return tuple(DenseBlock._checked(th[b * p:(b + 1) * p]) for b in range(th.shape[0] // p))
    if isinstance(projections, DirectionBlock):
        projections = [projections]
    if not isinstance(projections, (list, tuple)):
        raise TypeError(f"projections must be a (k, d) tensor or a sequence of DirectionBlock, got "
                        f"{type(projections).__name__}")
    blocks = block_list(projections, "projections")
    if block_size is not None:
        raise ValueError("block_size is the blocks' own size: give it only with a (k, d) tensor of directions")
    if blocks[0].dim != d:
        raise ValueError(f"projections must be blocks of R^{d}, got blocks of R^{blocks[0].dim}")
    for b in blocks:
        if type(b) is not DenseBlock:  # the base class's probe, whatever a subclass overrides
            DirectionBlock.check_orthonormal(b)
    return tuple(blocks)


def fractional_bin_sums(values: torch.Tensor, bins: int) -> torch.Tensor:
    """n·∫ Q over the L equal-probability bins of each column's empirical quantile function Q (the sums of the sorted
    values over L bins of n/L ranks each, boundary ranks split fractionally).

    Shape: values (n, k) -> (L, k) float64 (zeros for n = 0).
    """
    n, k = values.shape
    if n == 0:
        return torch.zeros(bins, k, dtype=torch.float64, device=values.device)
    # each column sorted as a contiguous row of the transpose (a strided sort along dim 0 is several times slower)
    s = torch.sort(values.to(torch.float64).t().contiguous(), dim=1).values
    cum = torch.cat([torch.zeros(k, 1, dtype=torch.float64, device=s.device), torch.cumsum(s, 1)], 1)
    edges = torch.arange(bins + 1, dtype=torch.float64, device=s.device) * (n / bins)
    lo = edges.floor().long().clamp(max=n)
    frac = edges - lo.double()
    lorenz = cum[:, lo] + frac * s[:, lo.clamp(max=n - 1)]  # the sum of the m smallest values, linear between ranks
    return (lorenz[:, 1:] - lorenz[:, :-1]).t()


def class_sketch_sensitivity(clip_radius: float, num_blocks: int, max_bins: int, count_weight: float) -> float:
    r"""ℓ2 sensitivity of the one-shot release (counts times w, bin sums) under the replacement of one labelled row
    (x, y) by any (x′, y′), the label free to change, rows clipped to ‖x − m_y‖ ≤ r:

    .. math::  Δ = \sqrt{\max\big(2B\,β_L\,r^2 + 2w^2,\ 4B\,r^2\big)},\qquad β_L = 2 + 2\sqrt{1 - 1/L}\ (L ≥ 2),
               \quad β_1 = 1,

    for B blocks of orthonormal directions and at most L = ``max_bins`` bins per direction: β_L grows with L, so the
    LARGEST L_j counts. For L ≥ 2 the first term is the larger. β_2 = 3.41, β_4 = 3.73, against (2 + 1/√L)² = 7.33
    and 6.25 for the earlier per-block bound (2 + 1/√L_min)r.

    Proof. S(·) are the L bin sums of a multiset of N values s_1 ≤ … ≤ s_N: with q(u) = s_i on (i − 1, i] and
    H(t) = ∫_0^t q, S_l = H(lN/L) − H((l − 1)N/L) = Σ_i W_{li}s_i, W_{li} = |(i − 1, i] ∩ [(l − 1)N/L, lN/L]| ≥ 0
    (:func:`fractional_bin_sums`). (M) Order statistics are nondecreasing in every entry: changing one entry by δ
    moves every s_i with δ's sign and their sum by δ, so S moves by a vector of δ's sign summing to δ (ℓ1 norm |δ|).

    (1) A row joins a class of n ≥ 0 rows (leaving is the same change negated). Fix a block P (orthonormal rows θ_j);
    a_i = Pu_i for the centred clipped rows u_i (Σ_j a_ij² ≤ ‖u_i‖² ≤ r²), v the new row's (‖v‖ ≤ r). Direction j
    (L_j bins) moves by D_j = S(a_j ∪ {v_j}) − S(a_j) = V_j + R_j, V_j = S(a_j ∪ {v_j}) − S(a_j ∪ {0}),
    R_j = S(a_j ∪ {0}) − S(a_j).
    (a) By (M), V_j has v_j's sign and sums to v_j: ‖V_j‖ ≤ |v_j|.
    (b) R_j sums to 0 (a 0 is added), R_j = 0 if n = 0 or L_j = 1, and ‖R_j‖² ≤ Σ_i a_ij²/(n + 1) (lemma below).
    (c) R_j ⊥ 1, so ⟨V_j, R_j⟩ = ⟨V_j − (v_j/L_j)1, R_j⟩, and ‖V_j − (v_j/L_j)1‖² = ‖V_j‖² − v_j²/L_j ≤ γ_j²v_j²,
    γ_j = √(1 − 1/L_j): ‖D_j‖² ≤ v_j² + 2γ_j|v_j|‖R_j‖ + ‖R_j‖². Sum over the block with ρ² = Σ_j ‖R_j‖² ≤
    Σ_i ‖a_i‖²/(n + 1) ≤ r²n/(n + 1), γ_j ≤ γ = √(1 − 1/L) and Σ_j |v_j|‖R_j‖ ≤ ‖v‖ρ (Cauchy–Schwarz):
    Σ_j ‖D_j‖² ≤ ‖v‖² + 2γ‖v‖ρ + ρ² ≤ (2 + 2γ)r² = β_L r². If L = 1, every R_j = 0 and Σ_j ‖D_j‖² = ‖v‖² ≤ r².

    Lemma: for a ∈ ℝⁿ, n ≥ 1, R(a) = S(a ∪ {0}) − S(a) has ‖R(a)‖² ≤ Σ_i a_i²/(n + 1).
    (i) Sorting commutes with x ↦ min(x, 0) and max(x, 0), so R(a) = R(a⁻) + R(a⁺); and S(−x)_l = −S(x)_{L+1−l}.
    (ii) a ≤ 0. Let h = −q on (0, n] (≥ 0, nonincreasing) and h = 0 on (n, n + 1] (the added 0 sorts last),
    T_l = l(n + 1)/L, λ = n/(n + 1) (the old edges are λT_l): R_l = −(φ(T_l) − φ(T_{l−1})), φ(x) = ∫_{λx}^x h.
    Layer cake: h = Σ_{m≤n} β_m 1_{(0,m]} with β_m ≥ 0, so φ = Σ_m β_mφ_m, φ_m(x) = |(λx, x] ∩ (0, m]| (a tent: slope
    1/(n + 1) up to m/(n + 1) at x = m, then down to 0 at m/λ ≤ n + 1), and Σ_i a_i² = ∫h² = Σ β_mβ_{m′}min(m, m′).
    With ρ_m the increments of φ_m between grid points, ‖R‖² = Σ β_mβ_{m′}⟨ρ_m, ρ_{m′}⟩, so it suffices that
    ⟨ρ_m, ρ_{m′}⟩ ≤ min(m, m′)/(n + 1). m = m′: the samples φ_m(T_l) rise to a maximum M and fall back to
    φ_m(T_L) = 0, each rise ≤ 1/L (slope ≤ 1/(n + 1) over a bin), each fall ≤ M, so ‖ρ_m‖² ≤ M/L + M² ≤ M, as
    M ≤ max_{l<L} T_l/(n + 1) = 1 − 1/L; and M ≤ m/(n + 1). m < m′: m/λ ≤ m + 1 ≤ m′, so φ_{m′} rises by exactly 1/L
    over every bin l < l₁, l₁ the bin holding m/λ, after which φ_m is 0: ⟨ρ_m, ρ_{m′}⟩ = φ_m(T_{l₁−1})(1/L −
    ρ_{m′,l₁}) ≤ (m/(n + 1))(1/L + φ_{m′}(T_{l₁−1})) ≤ (m/(n + 1))(1/L + T_{l₁−1}/(n + 1)) = (m/(n + 1))·l₁/L.
    (iii) Any a, with n⁻ negative and n⁺ positive entries: by (ii) and (i), R(a⁻) = −Δf and R(a⁺) = −Δe for grid
    samples f, e ≥ 0, f = 0 where T_l ≥ (n + 1)n⁻/n and e = 0 where T_l ≤ (n + 1)(n − n⁺)/n. So f is 0 wherever e is
    not, and before it: ⟨Δf, Δe⟩ = −f_{l*}e_{l*+1} ≤ 0 (l* the last l with f_l ≠ 0), and
    ‖R(a)‖² ≤ ‖R(a⁻)‖² + ‖R(a⁺)‖² ≤ Σ_i a_i²/(n + 1).

    (2) y′ ≠ y: class y loses a row and class y′ gains one (disjoint coordinates): each of the B blocks of each class
    moves by at most β_L r² in squared norm, and two counts by w. y′ = y: the count stays; by (M) direction j's sums
    move by |θ_jᵀ(u′ − u)| in ℓ1, a block by at most ‖P(u′ − u)‖ ≤ 2r. No step needs n_c ≥ L_j; empty classes
    (n = 0) are included. □

    Tight: the same-class 2r is attained; a row joining a class of n rows attains ‖v‖ = r, ρ² = r²n/(n + 1) and
    equality in (c) when p ≥ n and L divides n + 1 (row i nonzero on the directions j < n with (i − j) mod n ≥
    (n + 1)/L − 1, its nonzero entries equal and positive; v = −r(1, …, 1)/√n), which tends to β_L r² as n grows.
    The one-direction extreme (all rows at −r, v = r: (4 − 3/L)r², the n = L − 1 value) is exceeded for p ≥ 3:
    L = 2, n = p = 3 gives 2.97r² > 2.5r².

    Raises:
        ValueError: r <= 0, B < 1, L < 1, w < 0.
    """
    r = check_positive(clip_radius, "clip_radius")
    B = check_int(num_blocks, "num_blocks")
    L = check_int(max_bins, "max_bins")
    w = check_nonnegative(count_weight, "count_weight")
    beta = 2.0 + 2.0 * math.sqrt(1.0 - 1.0 / L) if L > 1 else 1.0
    return math.sqrt(max(2.0 * B * beta * r * r + 2.0 * w * w, 4.0 * B * r * r))


@dataclass(frozen=True)
class ClassSketchRelease:
    """What :func:`class_quantile_sketch` publishes (everything here is public; nothing in it is private).

    Attributes:
        counts: (C,) float64 noisy class sizes ñ_c (the released w·n_c + noise, divided by w).
        sums: (C, k, L_max) float64 noisy bin sums (entries beyond a direction's own L_j are 0).
        bins: (k,) int64, L_j per direction. blocks: the public directions, B blocks of ``block_size`` orthonormal
            rows (:class:`fastdpot.flows.directions.DirectionBlock`, direction j = row j mod p of block j // p;
            :attr:`projections` materialises them). centers: (C, d) float64, the public centres m_c the rows were
            taken about.
        noise_std: σ on each bin sum; count_noise_std: σ/w on each count. sensitivity: Δ. noise_multiplier: z = σ/Δ.
        clip_radius: r. block_size: p. noise: (C, k, L_max) the bin-sum noise (only with ``return_noise``).
        epsilon, delta: the (ε, δ) the release alone satisfies, when it was calibrated by
            :func:`release_class_sketch` (None when the caller accounts it, e.g. in a composed ledger).
    """
    counts: torch.Tensor
    sums: torch.Tensor
    bins: torch.Tensor
    blocks: Tuple[DirectionBlock, ...]
    centers: torch.Tensor
    noise_std: float
    count_noise_std: float
    sensitivity: float
    noise_multiplier: float
    clip_radius: float
    block_size: int
    noise: Optional[torch.Tensor] = None
    epsilon: Optional[float] = None
    delta: Optional[float] = None

    @property
    def num_classes(self) -> int:
        """C."""
        return int(self.counts.shape[0])

    @property
    def num_blocks(self) -> int:
        """B = k / p."""
        return len(self.blocks)

    @property
    def projections(self) -> torch.Tensor:
        """(k, d) float64, the directions materialised (k·d values: for references and small d)."""
        return torch.cat([b.matrix() for b in self.blocks])

    def bin_means(self) -> torch.Tensor:
        """(C, k, L_max) noisy bin means S̃ / (ñ_c / L_j) (ñ_c clamped to >= 1): post-processing."""
        n = self.counts.clamp_min(1.0)[:, None, None]
        return self.sums * self.bins.to(self.sums)[None, :, None] / n

    def mean_noise_std(self) -> torch.Tensor:
        """(C, k) the noise std of one bin mean, σ·L_j / ñ_c (from released quantities only)."""
        return self.noise_std * self.bins.to(self.sums)[None, :] / self.counts.clamp_min(1.0)[:, None]

    def quantile_tables(self, shrink: Union[bool, str] = True, degree: int = 3
                        ) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per class c, the target of op ``flow_step``: ``(table (k, G), levels (G,))`` on the union grid G of every
        direction's levels (l − ½)/L_j, in the centred coordinates x − m_c.

        Per direction: the noisy bin means, shrunk by their known noise (``shrink``), then made non-decreasing
        (:func:`isotonic_rows`), then written at every level of the grid: between its own levels it is linear,
        outside them extended with its end segments, exactly as the op reads a table. Post-processing: no privacy
        cost. The shrinkage:

        * ``"pooled"`` (or True, the default): :func:`fastdpot.privacy.sketch_tables.pooled_shrinkage`, the linear
          empirical-Bayes factor of each shape coordinate (scale, skew, …) estimated over the directions of one
          block and one spatial-frequency band (:func:`fastdpot.privacy.sketch_tables.frequency_groups`): a band
          whose shape is below the noise keeps its location only; and every direction's location (its bin means'
          mean) replaced by the generalised least-squares fit of all blocks' locations at once
          (:func:`fastdpot.privacy.sketch_tables.pooled_locations`: B blocks that each span the image pool B
          estimates of the class mean);
        * ``"stein"``: each direction alone, towards its least-squares fit by a polynomial of Φ⁻¹(level) of
          ``degree`` by the positive-part James–Stein factor of its residual
          (:func:`fastdpot.privacy.sketch_tables.shrink_quantiles`: a Gaussian a + b·Φ⁻¹ for L <= 5 bins);
        * False: none.

        Raises:
            ValueError: ``shrink`` not a bool, "pooled" or "stein"; ``degree`` not an integer >= 1.
        """
        kind = check_shrinkage(shrink)
        degree = check_int(degree, "degree")
        means, s = self.bin_means(), self.mean_noise_std()
        grid = torch.unique(torch.cat([(torch.arange(int(L)) + 0.5) / int(L) for L in self.bins.unique()]))
        grid = grid.to(torch.float64)
        noisy = self.noise_std > 0  # without noise every shrinkage leaves the bin means as they are
        if kind == "pooled" and noisy:  # the bands to pool over; every direction's location from all blocks at once
            groups = frequency_groups(self.blocks)
            L = self.bins.to(torch.float64)
            mask = torch.arange(means.shape[2])[None, :] < self.bins[:, None]
            locations = pooled_locations(self.blocks, (means * mask).sum(2) / L, s * s / L)
        out = []
        for c in range(self.num_classes):
            table = torch.empty(self.bins.numel(), grid.numel(), dtype=torch.float64)
            for L in self.bins.unique().tolist():
                idx = torch.nonzero(self.bins == L).flatten()
                lv = (torch.arange(L, dtype=torch.float64) + 0.5) / L
                m = means[c, idx, :L]
                if kind == "pooled" and noisy:
                    m = pooled_shrinkage(m, s[c, idx], lv, groups[idx])
                    m = m - m.mean(1, keepdim=True) + locations[c, idx, None]
                elif kind == "stein" and noisy:
                    m = shrink_quantiles(m, s[c, idx], lv, degree)
                m = isotonic_rows(m) if L > 1 else m
                table[idx] = piecewise_linear(m, lv, grid)
            out.append((table, grid.clone()))
        return out


#: the shrinkages of :meth:`ClassSketchRelease.quantile_tables` (True: the first)
SHRINKAGES = ("pooled", "stein")


def check_shrinkage(shrink) -> Optional[str]:
    """``shrink`` as one of :data:`SHRINKAGES` or None (False).

    Raises:
        ValueError: anything else (a string such as "no" is refused, never read as True).
    """
    if isinstance(shrink, bool):
        return SHRINKAGES[0] if shrink else None
    if isinstance(shrink, str) and shrink in SHRINKAGES:
        return shrink
    raise ValueError(f"shrink must be a bool or one of {SHRINKAGES}, got {shrink!r}")


def _check_bins(sketch_bins, k: int) -> torch.Tensor:
    """``sketch_bins`` as (k,) int64: one integer for every direction, or k integers (a sequence, or an integer
    tensor / array); a bool or a float (``4.0``, ``[4.5, ...]``) is refused, never truncated."""
    if isinstance(sketch_bins, Integral) and not isinstance(sketch_bins, bool):
        return torch.full((k,), check_int(sketch_bins, "sketch_bins"), dtype=torch.int64)
    if not isinstance(sketch_bins, torch.Tensor) and hasattr(sketch_bins, "__array__"):
        sketch_bins = torch.as_tensor(sketch_bins)  # a numpy array
    if isinstance(sketch_bins, torch.Tensor):
        if sketch_bins.dtype.is_floating_point or sketch_bins.dtype.is_complex or sketch_bins.dtype == torch.bool:
            raise ValueError(f"sketch_bins must hold integers, got a tensor of dtype {sketch_bins.dtype}")
        bins = sketch_bins.detach().cpu().long().flatten()
    elif isinstance(sketch_bins, (list, tuple)):
        bins = torch.tensor([check_int(b, "sketch_bins") for b in sketch_bins], dtype=torch.int64)
    else:
        raise ValueError(f"sketch_bins must be an integer, or one integer per direction ({k}), got {sketch_bins!r}")
    if bins.numel() != k:
        raise ValueError(f"sketch_bins must be an integer or one per direction ({k}), got {bins.numel()}")
    return bins


def class_quantile_sketch(x_private: torch.Tensor, labels: torch.Tensor, projections: torch.Tensor, *,
                          num_classes: int, sketch_bins: Union[int, Sequence[int], torch.Tensor],
                          noise_multiplier: float, clip_radius: float, block_size: Optional[int] = None,
                          centers: Optional[torch.Tensor] = None, count_weight: Optional[float] = None,
                          generator: Optional[torch.Generator] = None, secure_mode: bool = True,
                          noise_scale: float = 1.0, return_noise: bool = False) -> ClassSketchRelease:
    r"""Release, in one Gaussian mechanism, every class's sliced quantile sketch of all its rows and the class
    histogram (labels private: neighbours replace one (x, y) by any (x′, y′)).

    Rows are centred on their class's PUBLIC centre m_y (``centers``; default 0) and clipped to ‖x − m_y‖ ≤ r
    inside; labels outside [0, C) are mapped to class 0 record by record (:func:`fastdpot.privacy.moments.
    domain_labels`). Each count and each bin sum gets N(0, σ²), σ = z·Δ with Δ = :func:`class_sketch_sensitivity`
    (proof there), the counts first multiplied by w (default w = r·√B/4, a count noise far below the class sizes).
    Account it as ONE release of noise multiplier z on the whole data set (``sampling="full"`` in
    :class:`fastdpot.privacy.composition.ComposedLedger`).

    Args:
        x_private: (n, d) private rows. labels: (n,) integer private labels. num_classes: C (public).
        projections: (k, d) public directions, blocks of ``block_size`` orthonormal rows (default p = d), or a
            sequence of B :class:`fastdpot.flows.directions.DirectionBlock` of one size p (k = B·p; fast blocks project
            the rows by their own transform), drawn or chosen independently of the data (e.g.
            :func:`fastdpot.flows.directions.patch_dct_blocks`); :func:`direction_blocks` checks them.
        sketch_bins: L (int) for every direction, or (k,) per direction (a public choice, e.g. by frequency); each
            1 <= L_j <= n.
        noise_multiplier: z >= 0 (0: the exact sketch, not private). clip_radius: r > 0.
        centers: (C, d) or (d,) public centres, or None (0).
        count_weight: w > 0 (None: r·√B/4).
        generator, secure_mode: the noise's source (secret OS randomness by default; with ``secure_mode=False`` the
            replayable ``generator``, no guarantee against whoever holds its seed).
        noise_scale: s >= 1 multiplies σ (more noise than z calls for; the release records its real noise
            multiplier z·s). s < 1 is refused: the release would be less noisy than z says, and an ε stated or
            accounted for z would not hold. A stand-in run on a smaller public set (n rows standing in for n_real)
            passes its own noise multiplier z·n/n_real instead, which it is.
        return_noise: keep the bin-sum noise in the release (tests).

    Shape:
        x_private (n, d), labels (n,), projections (k, d) -> :class:`ClassSketchRelease`.

    Raises:
        ValueError / TypeError: non-finite or mis-shaped rows (or rows in float16 / bfloat16), labels that are not a
            1-D integer tensor of length n, projections that are not orthonormal blocks, bins that are not integers,
            a direction with more bins than rows (L_j > n) or fewer than 1, z < 0, r <= 0, noise_scale < 1, bad
            centres, a flag that is not a bool, a bad generator, C classes whose bin sums would not fit in memory —
            all before anything is drawn. The message never counts or locates non-finite private values.

    References:
        Rakotomamonjy & Ralaivola, "Differentially Private Sliced Wasserstein Distance", ICML 2021 (projected
        Gaussian mechanism); Sebag et al., "Differentially Private Gradient Flow based on the Sliced Wasserstein
        Distance", TMLR (DPSWflow: a pool of directions released once); Dwork & Roth, "The Algorithmic Foundations of
        Differential Privacy", 2014 (Gaussian mechanism).
    """
    check_tensor(x_private, "x_private", 2, dtypes=COMPUTE_DTYPES)
    n, d = x_private.shape
    if n == 0:
        raise ValueError("x_private is empty")
    C = check_int(num_classes, "num_classes")
    y = domain_labels(labels, C)
    if y.shape[0] != n:
        raise ValueError(f"labels must have shape ({n},), got {tuple(labels.shape)}")
    blocks = direction_blocks(projections, d, block_size)
    p = blocks[0].size
    k = p * len(blocks)
    bins = _check_bins(sketch_bins, k)
    if int(bins.min()) < 1 or int(bins.max()) > n:
        raise ValueError(f"sketch_bins must lie in [1, n = {n}] (no more bins than rows), got "
                         f"[{int(bins.min())}, {int(bins.max())}]")
    z = check_nonnegative(noise_multiplier, "noise_multiplier")
    r = check_positive(clip_radius, "clip_radius")
    scale = check_noise_scale(noise_scale)
    check_bool(return_noise, "return_noise")
    # the centres, the bin sums, their noise and the noisy sums: (C, d) + 3 (C, k, L_max) float64
    check_memory(8 * C * (d + 3 * k * int(bins.max())), "num_classes", C, "cpu",
                 f"the centres and bin sums of {C} classes ({k} directions, up to {int(bins.max())} bins)")
    if centers is None:
        cen = torch.zeros(C, d, dtype=torch.float64)
    else:
        check_tensor(centers, "centers")
        cen = centers.detach().to(torch.float64)
        cen = cen.expand(C, d).clone() if cen.dim() == 1 and cen.shape[0] == d else cen
        if tuple(cen.shape) != (C, d):
            raise ValueError(f"centers must be (C, d) = ({C}, {d}) or (d,), got {tuple(centers.shape)}")
    B = len(blocks)
    w = r * math.sqrt(B) / 4.0 if count_weight is None else check_positive(count_weight, "count_weight")
    sens = class_sketch_sensitivity(r, B, int(bins.max()), w)
    sigma = z * sens * scale
    rng = generator if isinstance(generator, PrivacyRandomness) else privacy_randomness(secure_mode, generator)
    rows = clip_rows(x_private.detach().to(torch.float64) - cen[y], r)
    Lmax = int(bins.max())
    sums = torch.zeros(C, k, Lmax, dtype=torch.float64)
    for c in range(C):
        rows_c = rows[y == c]
        for b, block in enumerate(blocks):
            proj = block.forward(rows_c) if rows_c.shape[0] else rows_c.new_zeros(0, p)
            cols = slice(b * p, (b + 1) * p)
            for L in bins[cols].unique().tolist():
                idx = torch.nonzero(bins[cols] == L).flatten()
                sums[c, b * p + idx, :L] = fractional_bin_sums(proj[:, idx], L).t()
    counts = torch.bincount(y, minlength=C)[:C].double()
    mask = (torch.arange(Lmax)[None, :] < bins[:, None]).double()  # noise on the released entries only
    noise = rng.normal((C, k, Lmax)) * sigma * mask
    count_noise = rng.normal((C,)) * sigma
    noisy_counts = counts + count_noise / w
    return ClassSketchRelease(counts=noisy_counts, sums=sums + noise, bins=bins, blocks=blocks, centers=cen,
                              noise_std=sigma, count_noise_std=sigma / w, sensitivity=sens,
                              noise_multiplier=z * scale, clip_radius=r, block_size=p,
                              noise=noise if return_noise else None)


def release_class_sketch(x_private: torch.Tensor, labels: torch.Tensor, projections: torch.Tensor, *,
                         epsilon: float, delta: float, **kwargs) -> ClassSketchRelease:
    """:func:`class_quantile_sketch` calibrated to (ε, δ) on its own: one Gaussian mechanism, z the smallest noise
    multiplier with ε(δ) <= ε by the PLD accountant (dp-accounting; exact for a Gaussian, the analytic calibration of
    Balle & Wang, ICML 2018); the release states its (ε, δ) (``release.epsilon``, ``release.delta``), which flows
    that read it report (:class:`fastdpot.flows.ReleasedClassFlows`).

    ``kwargs``: every other argument of :func:`class_quantile_sketch` except ``noise_multiplier``; a
    ``noise_scale`` s >= 1 adds noise beyond the calibration (the stated (ε, δ) still holds), s < 1 is refused.

    Raises:
        ValueError: ε <= 0 or not finite, δ outside (0, 1), ``noise_multiplier`` given, an (ε, δ) outside what the
            PLD calibration resolves (δ >= 1e-15, noise multipliers from 0.1 to 1e6: ε up to about 90 at
            δ = 1e-5); the errors of :func:`class_quantile_sketch` (all raised before any draw).
    """
    import dataclasses

    from .._validate import check_delta, check_epsilon
    from .calibration import calibrate_noise_multiplier

    if "noise_multiplier" in kwargs:
        raise ValueError("release_class_sketch calibrates the noise multiplier from (epsilon, delta): do not pass it")
    eps, dl = check_epsilon(epsilon), check_delta(delta)
    try:
        z = calibrate_noise_multiplier(eps, dl, 1.0, 1, accountant="pld")
    except ValueError:  # its advice names the calibration's own arguments, which this function does not take
        why = (f"delta={dl!r} is below the smallest delta it resolves (about 1e-15)" if dl < 1e-15 else
               f"the noise multiplier for epsilon={eps!r} at delta={dl!r} lies outside the range it accounts (0.1 "
               f"to 1e6; epsilon up to about 90 at delta = 1e-5)")
        raise ValueError(f"release_class_sketch cannot calibrate epsilon={eps!r} at delta={dl!r}: its one Gaussian "
                         f"release is calibrated by dp-accounting's PLD accountant, and {why}; use a larger delta "
                         f"or an epsilon in range, or release with class_quantile_sketch(noise_multiplier=z) and "
                         f"account z yourself") from None
    return dataclasses.replace(class_quantile_sketch(x_private, labels, projections, noise_multiplier=z, **kwargs),
                               epsilon=eps, delta=dl)
