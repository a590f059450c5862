r"""Gaussian mechanisms on moments: the second-moment matrix (Analyze Gauss, DP-PCA) and per-class (count, Σ x,
Σ x xᵀ), with labels public or private, and their post-processing into per-class Gaussians.

Every mechanism clips its rows inside, draws its noise from :class:`~fastdpot.privacy.randomness.PrivacyRandomness`
(secret OS randomness by default, float64) and proves its ℓ2 sensitivity in its docstring (each is checked by Monte
Carlo in ``tests/privacy/test_moments.py``). Accounting is the caller's: a single release of noise multiplier
z = σ/Δ on the whole data set (sampling ``"full"`` of :class:`fastdpot.privacy.composition.ComposedLedger`, or
:func:`fastdpot.privacy.gaussian_mechanism_sigma` for one (ε, δ) release).

Labels: with ``labels`` public (replace-one neighbours that keep the label) the class counts are public and the C
classes compose in parallel (:func:`dp_class_gaussians`); with labels private (replace one (x, y) by any (x′, y′))
the counts are released with the moments (:func:`release_class_moments`). Private labels outside the public domain
[0, C) are mapped to class 0 record by record (:func:`domain_labels`): a deterministic per-record map, which the
label-private relation already covers, so no label value can abort a release or appear in a message.
"""
from __future__ import annotations

import math
from typing import Dict, Optional

import torch

from .._validate import (COMPUTE_DTYPES, check_bool, check_delta, check_epsilon, check_int, check_memory,
                         check_nonnegative, check_positive, check_tensor)
from .mechanisms import clip_rows, gaussian_mechanism_sigma, normalize_rows
from .randomness import PrivacyRandomness, privacy_randomness

__all__ = ["domain_labels", "moments_sensitivity", "label_private_moments_sensitivity", "dp_second_moment",
           "dp_class_gaussians", "release_class_moments", "release_class_means", "class_gaussians"]


def domain_labels(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Labels as int64 in [0, C): every label outside the public domain is mapped to class 0 (record by record,
    before any mechanism; never an error that depends on a label's value).

    Shape: (n,) integer tensor -> (n,) int64.

    Raises:
        ValueError: ``labels`` not a 1-D integer tensor, C < 1 (public properties only).
    """
    C = check_int(num_classes, "num_classes", 1)
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or labels.dtype.is_floating_point or \
            labels.dtype == torch.bool:
        raise ValueError(f"labels must be a 1-D integer tensor, got {getattr(labels, 'dtype', type(labels))} of "
                         f"shape {tuple(getattr(labels, 'shape', ()))}")
    y = labels.long()
    return torch.where((y >= 0) & (y < C), y, torch.zeros_like(y))


def check_noise_scale(v, name: str = "noise_scale") -> float:
    """A factor s >= 1 on a mechanism's σ. s < 1 would give less noise than the noise multiplier (or the (ε, δ)) the
    release is accounted for, so the stated or accounted ε would not hold; a stand-in run on a smaller public set
    (n rows for n_real) passes its own noise multiplier z·n/n_real instead.

    Raises:
        ValueError: s not a finite real >= 1.
    """
    s = check_positive(v, name)
    if not s >= 1.0:
        raise ValueError(f"{name} must be >= 1, got {v!r}: less noise than the noise multiplier (or ε) the release is "
                         f"accounted for would break its stated guarantee; a stand-in on n public rows for n_real "
                         f"private ones passes its noise multiplier z·n/n_real instead")
    return s


def _check_private_rows(rows, name: str = "rows") -> int:
    """(n, d) float32 / float64 finite private rows, n >= 1; returns n (messages name nothing computed from them)."""
    check_tensor(rows, name, 2, dtypes=COMPUTE_DTYPES)
    if rows.shape[0] == 0:
        raise ValueError(f"{name} is empty")
    return int(rows.shape[0])


def _noise_source(secure_mode, generator):
    """The noise's source, with the rule of :func:`fastdpot.privacy.class_sketch.class_quantile_sketch`: a
    replayable ``generator`` only with ``secure_mode=False``, and a generator given in secure mode is refused (it
    would be silently unused), as is one that is not a ``torch.Generator``."""
    if isinstance(generator, PrivacyRandomness):
        return generator
    return privacy_randomness(secure_mode, generator)


def moments_sensitivity(clip_radius: float = 1.0) -> float:
    r"""ℓ2 sensitivity of f(X) = (Σᵢ xᵢ, Σᵢ xᵢxᵢᵀ) ∈ R^{d + d²} under replace-one, for rows in the ball ‖x‖ ≤ r.

    .. math::  Δ^2 = \begin{cases} 4r^2 & r^2 \le 1/2 \\ 2r^2 + 2r^4 + 1/2 & r^2 \ge 1/2 \end{cases}
               \qquad (Δ = \sqrt{4.5} ≈ 2.121 \text{ at } r = 1)

    Proof. Replacing x by x′ changes f by (x − x′, xxᵀ − x′x′ᵀ). With a = ‖x‖², b = ‖x′‖² (both ≤ r²) and
    t = ⟨x, x′⟩ (|t| ≤ √(ab)): ‖x − x′‖² = a + b − 2t and ‖xxᵀ − x′x′ᵀ‖_F² = a² + b² − 2t², so
    ‖f(X) − f(X′)‖² = a + b + a² + b² + g(t) with g(t) = −2t − 2t², a concave parabola with maximum 1/2 at
    t = −1/2. If r² ≥ 1/2: g ≤ 1/2 and a, b ≤ r² give Δ² ≤ 2r² + 2r⁴ + 1/2, attained by ‖x‖ = ‖x′‖ = r with
    ⟨x, x′⟩ = −1/2. If r² < 1/2: t ≥ −√(ab) > −1/2, where g decreases, so the maximum over t is at t = −√(ab):
    with u = √a, v = √b ∈ [0, r] the bound is h = (u + v)²(1 + (u − v)²). Write s = u + v ≤ 2r, so
    |u − v| ≤ min(s, 2r − s). For s ≤ r: h ≤ s²(1 + s²) ≤ r²(1 + r²) ≤ 4r². For s ∈ [r, 2r]:
    h ≤ H(s) = s² + s²(2r − s)², and H′(s) = 2s(1 − 2p(r − p)) with p = 2r − s ∈ [0, r], where
    2p(r − p) ≤ r²/2 < 1, so H increases and H ≤ H(2r) = 4r², attained by x′ = −x, ‖x‖ = r. Both cases meet at
    r² = 1/2 (Δ² = 2). □

    Raises:
        ValueError: r <= 0.
    """
    r2 = check_positive(clip_radius, "clip_radius") ** 2
    return math.sqrt(4.0 * r2 if r2 <= 0.5 else 2.0 * r2 + 2.0 * r2 * r2 + 0.5)


def label_private_moments_sensitivity(clip_radius: float = 1.0) -> float:
    r"""ℓ2 sensitivity of the per-class statistics F(D) = (n_c, Σ_{y_i = c} x_i, Σ_{y_i = c} x_i x_iᵀ)_{c < C} under
    the replacement of one record (x, y) by any (x′, y′), the label free to change, rows in the ball ‖x‖ ≤ r.

    .. math::  Δ = \max\Big(\sqrt{2(1 + r^2 + r^4)},\ Δ_{\text{moments}}(r)\Big) \qquad (= \sqrt 6 \text{ at } r = 1)

    Proof. If y′ ≠ y, class y loses (1, x, xxᵀ) and class y′ gains (1, x′, x′x′ᵀ): disjoint blocks, so
    ‖F(D) − F(D′)‖² = 1 + ‖x‖² + ‖xxᵀ‖_F² + 1 + ‖x′‖² + ‖x′x′ᵀ‖_F² ≤ 2(1 + r² + r⁴) (‖xxᵀ‖_F = ‖x‖²). If
    y′ = y the count is unchanged and the change is that of :func:`moments_sensitivity`. □

    Raises:
        ValueError: r <= 0.
    """
    r2 = check_positive(clip_radius, "clip_radius") ** 2
    return max(math.sqrt(2.0 * (1.0 + r2 + r2 * r2)), moments_sensitivity(clip_radius))


def dp_second_moment(rows: torch.Tensor, noise_std: float, rng=None, *, clip_radius: float = 1.0,
                     secure_mode: bool = True) -> torch.Tensor:
    r"""One Gaussian mechanism on the second-moment matrix Σ_i x_i x_iᵀ of rows clipped to the ball of radius r.

    Sensitivity (replace one row x by x′, both of norm ≤ r after clipping): the released vector is the upper
    triangle (diagonal included) of D = x xᵀ − x′ x′ᵀ, whose squared norm is at most
    ‖D‖_F² = ‖x‖⁴ + ‖x′‖⁴ − 2 (xᵀx′)² ≤ 2r⁴, so Δ₂ = sqrt(2)·r² (attained by orthogonal rows of norm r). The noise,
    one N(0, σ²) draw per upper-triangle entry, is mirrored below the diagonal (post-processing).

    Args:
        rows: (n, p) float, clipped here to norm ≤ r. noise_std: σ = z·sqrt(2)·r² for noise multiplier z (0: none).
        rng: a :class:`~fastdpot.privacy.randomness.PrivacyRandomness` (None: secret OS randomness, or with
            ``secure_mode=False`` an error: give a replayable one). clip_radius: r > 0.

    Returns:
        (p, p) float64 symmetric matrix.

    Raises:
        ValueError: rows not 2-D, empty or not finite; σ < 0; r <= 0.

    References:
        Dwork, Talwar, Thakurta & Zhang, "Analyze Gauss: optimal bounds for privacy-preserving principal component
        analysis", STOC 2014 (Algorithm 1).
    """
    check_tensor(rows, "rows", 2)
    if rows.shape[0] == 0:
        raise ValueError("rows is empty")
    sigma = check_nonnegative(noise_std, "noise_std")
    x = clip_rows(rows.double(), check_positive(clip_radius, "clip_radius"))
    m = x.t() @ x
    if sigma > 0:
        rng = privacy_randomness(secure_mode) if rng is None else rng
        e = torch.triu(rng.normal(m.shape).double()) * sigma
        m = m + e + torch.triu(e, 1).t()
    return m


def _bounded_rows(x, labels, clip_radius, normalize, centers):
    """The rows a moments mechanism sees: shifted by their class's public centre, then clipped / normalised."""
    x = x.double()
    if centers is not None:
        x = x - centers.double()[labels]
    return normalize_rows(x) * clip_radius if normalize else clip_rows(x, clip_radius)


def _class_sums(y: torch.Tensor, labels: torch.Tensor, C: int):
    d = y.shape[1]
    sums = torch.zeros(C, d, dtype=torch.float64).index_add_(0, labels, y)
    second = torch.zeros(C, d * d, dtype=torch.float64).index_add_(
        0, labels, (y[:, :, None] * y[:, None, :]).reshape(-1, d * d)).view(C, d, d)
    return sums, second


def class_gaussians(counts: torch.Tensor, sums: torch.Tensor, second: torch.Tensor):
    """Post-processing of (noisy) per-class moments into Gaussians: μ_c = S_c / n_c, Σ_c = sym(Q_c)/n_c − μ_cμ_cᵀ
    projected onto the PSD cone (negative eigenvalues set to 0); counts are clamped to >= 1.

    Shape: counts (C,), sums (C, d), second (C, d, d) -> (means (C, d), covs (C, d, d)) float64.
    """
    n = counts.double().clamp_min(1.0)
    q = 0.5 * (second + second.transpose(1, 2))
    m = sums / n[:, None]
    cov = q / n[:, None, None] - m[:, :, None] * m[:, None, :]
    evals, evecs = torch.linalg.eigh(cov)
    cov = (evecs * evals.clamp_min(0.0)[:, None, :]) @ evecs.transpose(1, 2)
    return m, 0.5 * (cov + cov.transpose(1, 2))


def dp_class_gaussians(latents: torch.Tensor, labels: torch.Tensor, epsilon: float, delta: float,
                       clip_radius: float = 1.0, normalize: bool = True, centers: Optional[torch.Tensor] = None,
                       num_classes: Optional[int] = None, generator: Optional[torch.Generator] = None,
                       return_noise: bool = False, *, secure_mode: bool = True,
                       noise_scale: float = 1.0) -> Dict[str, torch.Tensor]:
    r"""(ε, δ)-DP per-class mean and covariance of private rows, LABELS PUBLIC: the Gaussian mechanism on
    (Σ x, Σ x xᵀ) of each class.

    For each class c with public count n_c, the rows y = bound(x − centre_c) (``normalize``: y = r·x/‖x‖, else
    y = x clipped to ‖y‖ ≤ r; the clipping happens here, inside the mechanism) give
    S_c = Σ y + V, Q_c = Σ y yᵀ + W with V, W i.i.d. N(0, σ²) entries, σ = σ_G(ε, δ)·Δ
    (:func:`fastdpot.privacy.gaussian_mechanism_sigma`, analytic calibration, Δ = :func:`moments_sensitivity`).
    Post-processing (:func:`class_gaussians`): μ_c = S_c / n_c + centre_c, Σ_c = Q_c / n_c − (S_c/n_c)(S_c/n_c)ᵀ
    projected onto the PSD cone.

    Privacy: one Gaussian mechanism per class on disjoint partitions (labels public, replace-one neighbours that
    keep the label) — by parallel composition the whole release is (ε, δ)-DP. With private labels use
    :func:`release_class_moments`.

    Args:
        latents: (n, d) private rows. labels: (n,) int64 public labels in [0, C).
        epsilon: ε > 0 (``inf``: no noise, the exact moments — not private). delta: δ in (0, 1).
        clip_radius: r > 0. normalize: rows scaled onto the sphere of radius r instead of clipped.
        centers: (C, d) public class centres, or None. num_classes: C (default: max label + 1).
        generator: torch.Generator of the noise, used only with ``secure_mode=False`` (replayable, no guarantee
            against whoever holds its seed); by default secret operating-system randomness, float64 either way.
        return_noise: also return the noise draws ``noise_sum`` (C, d) and ``noise_second`` (C, d, d).
        noise_scale: s >= 1 multiplies σ. S releases of the same statistics, each at σ·√S, are together one release
            at σ (their mean is sufficient, the rest is independent of the data): pass s = √S to publish S of them
            within (ε, δ).

    Returns:
        dict with ``means`` (C, d) and ``covs`` (C, d, d) float64, ``counts`` (C,), ``noise_std`` σ (0 at ε = ∞),
        ``sensitivity`` Δ, ``epsilon``, ``delta``.

    Raises:
        ValueError / TypeError: bad rows, labels, ε, δ, r, centers, or a class with no private rows.

    References:
        Dwork & Roth, "The algorithmic foundations of differential privacy", 2014 (Gaussian mechanism, parallel
        composition); Balle & Wang, "Improving the Gaussian mechanism for differential privacy", ICML 2018
        (analytic σ).
    """
    _check_private_rows(latents, "latents")
    check_bool(normalize, "normalize")
    check_bool(return_noise, "return_noise")
    if not isinstance(labels, torch.Tensor) or labels.dtype != torch.int64 or labels.shape != latents.shape[:1]:
        raise ValueError(f"labels must be an int64 tensor of shape ({latents.shape[0]},)")
    eps = check_epsilon(epsilon, "epsilon", allow_inf=True)
    delta = check_delta(delta)
    clip_radius = check_positive(clip_radius, "clip_radius")
    C = int(labels.max()) + 1 if num_classes is None else check_int(num_classes, "num_classes")
    if int(labels.min()) < 0 or int(labels.max()) >= C:
        raise ValueError(f"labels must lie in [0, {C})")  # public labels: their range is no secret
    counts = torch.bincount(labels, minlength=C)
    if bool((counts == 0).any()):
        raise ValueError(f"classes {torch.nonzero(counts == 0).flatten().tolist()} have no private rows")
    if centers is not None:
        check_tensor(centers, "centers", 2)
        if tuple(centers.shape) != (C, latents.shape[1]):
            raise ValueError(f"centers must be ({C}, {latents.shape[1]}), got {tuple(centers.shape)}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    rng = privacy_randomness(secure_mode, generator)
    d = latents.shape[1]
    sums, second = _class_sums(_bounded_rows(latents, labels, clip_radius, normalize, centers), labels, C)
    delta_f = moments_sensitivity(clip_radius)
    check_noise_scale(noise_scale)
    sigma = 0.0 if math.isinf(eps) else gaussian_mechanism_sigma(eps, delta, delta_f) * noise_scale
    nv = rng.normal((C, d)) * sigma
    nw = rng.normal((C, d, d)) * sigma
    m, cov = class_gaussians(counts, sums + nv, second + nw)
    out = dict(means=m + (centers.double() if centers is not None else 0.0), covs=cov, counts=counts,
               noise_std=sigma, sensitivity=delta_f, epsilon=eps, delta=delta)
    if return_noise:
        out.update(noise_sum=nv, noise_second=nw)
    return out


def release_class_moments(rows: torch.Tensor, labels: torch.Tensor, num_classes: int, noise_multiplier: float, *,
                          clip_radius: float = 1.0, generator: Optional[torch.Generator] = None,
                          secure_mode: bool = True, noise_scale: float = 1.0) -> Dict[str, torch.Tensor]:
    r"""LABELS PRIVATE: one Gaussian mechanism on every class's (count, Σ y, Σ y yᵀ), rows y clipped to the ball of
    radius r, labels mapped into [0, C) by :func:`domain_labels`.

    The concatenated C·(1 + d + d²) vector gets i.i.d. N(0, σ²) noise, σ = z·Δ with
    Δ = :func:`label_private_moments_sensitivity` (√6 at r = 1; proof there): a Gaussian mechanism of noise
    multiplier z on the whole data set, for neighbours that replace one labelled record by any other (n public).
    Account it as one release of ``sampling="full"``.

    Args:
        rows: (n, d) private rows. labels: (n,) integer private labels. num_classes: C (public).
        noise_multiplier: z >= 0 (0: the exact statistics, not private).
        clip_radius: r > 0. generator, secure_mode: as :func:`dp_class_gaussians`.
        noise_scale: s >= 1 multiplies σ (default 1): the release is then at least as private as z states. s < 1
            is refused (:func:`check_noise_scale`): a stand-in run on a smaller public set (n rows for n_real) passes
            its own noise multiplier z·n/n_real, so that its noise relative to its sums is the real run's.

    Returns:
        dict with noisy ``counts`` (C,), ``sums`` (C, d), ``second`` (C, d, d) (float64), ``noise_std`` σ and
        ``sensitivity`` Δ.

    Raises:
        ValueError: bad rows (not (n, d), float16 / bfloat16, non-finite: the message never counts them) or labels
            shape, z < 0, r <= 0, noise_scale < 1, a generator in secure mode or not a ``torch.Generator``, C classes
            whose statistics would not fit in memory — all before anything is drawn.

    References:
        Dwork & Roth, "The algorithmic foundations of differential privacy", 2014 (Gaussian mechanism).
    """
    n, d = _check_private_rows(rows), rows.shape[1]
    y = domain_labels(labels, num_classes)
    if y.shape[0] != n:
        raise ValueError(f"labels must have shape ({n},), got {tuple(labels.shape)}")
    C = int(num_classes)
    z = check_nonnegative(noise_multiplier, "noise_multiplier")
    r = check_positive(clip_radius, "clip_radius")
    scale = check_noise_scale(noise_scale)
    rng = _noise_source(secure_mode, generator)
    # the statistics, their noise, the noisy sum and its copies out: 4 (C, 1 + d + d²) float64
    check_memory(32 * C * (1 + d + d * d), "num_classes", C, "cpu", f"the moments of {C} classes in dimension {d}")
    x = clip_rows(rows.double(), r)
    stats = torch.zeros(C, 1 + d + d * d, dtype=torch.float64)
    stats.index_add_(0, y, torch.cat([torch.ones(n, 1, dtype=torch.float64), x,
                                      (x[:, :, None] * x[:, None, :]).reshape(n, -1)], dim=1))
    sens = label_private_moments_sensitivity(r)
    sigma = z * sens * scale
    noisy = stats + rng.normal(stats.shape) * sigma
    q = noisy[:, 1 + d:].view(C, d, d)
    return dict(counts=noisy[:, 0].clone(), sums=noisy[:, 1:1 + d].clone(), second=q.clone(), noise_std=sigma,
                sensitivity=sens)


def release_class_means(rows: torch.Tensor, labels: torch.Tensor, num_classes: int, noise_multiplier: float, *,
                        clip_radius: float, center: Optional[torch.Tensor] = None, count_weight: float = 1.0,
                        generator: Optional[torch.Generator] = None, secure_mode: bool = True,
                        noise_scale: float = 1.0) -> Dict[str, torch.Tensor]:
    r"""LABELS PRIVATE: one Gaussian mechanism on every class's (w·n_c, Σ (x − c)) for rows clipped to
    ‖x − c‖ ≤ r about a public centre c, labels mapped into [0, C) (:func:`domain_labels`).

    Sensitivity: replacing (x, y) by (x′, y′) with y′ ≠ y moves class y by (−w, −(x − c)) and class y′ by
    (w, x′ − c), disjoint coordinates: ‖Δ‖² ≤ 2(w² + r²); with y′ = y only the sum moves, by ‖x − x′‖ ≤ 2r. Hence
    Δ = max(√(2(w² + r²)), 2r). σ = z·Δ on every entry. Account it as one release of ``sampling="full"``.
    Post-processing: the class means c + S̃_c / max(ñ_c, 1) with ñ_c = (noisy w·n_c)/w.

    Args:
        rows: (n, d) private rows. labels: (n,) integer private labels. num_classes: C. noise_multiplier: z >= 0.
        clip_radius: r > 0. center: (d,) public centre (default 0). count_weight: w > 0.
        generator, secure_mode, noise_scale: as :func:`release_class_moments`.

    Returns:
        dict with ``means`` (C, d) float64, noisy ``counts`` (C,), ``noise_std`` σ, ``sensitivity`` Δ.

    Raises:
        ValueError: bad rows (as :func:`release_class_moments`) or labels shape, z < 0, r <= 0, w <= 0,
            noise_scale < 1, a centre of the wrong shape, a bad generator, C classes whose means would not fit in
            memory — all before anything is drawn.
    """
    n, d = _check_private_rows(rows), rows.shape[1]
    y = domain_labels(labels, num_classes)
    if y.shape[0] != n:
        raise ValueError(f"labels must have shape ({n},), got {tuple(labels.shape)}")
    C = int(num_classes)
    z = check_nonnegative(noise_multiplier, "noise_multiplier")
    r = check_positive(clip_radius, "clip_radius")
    w = check_positive(count_weight, "count_weight")
    scale = check_noise_scale(noise_scale)
    if center is not None:
        check_tensor(center, "center")
    c0 = torch.zeros(d, dtype=torch.float64) if center is None else center.detach().to(torch.float64).flatten()
    if c0.shape != (d,):
        raise ValueError(f"center must have shape ({d},), got {tuple(center.shape)}")
    rng = _noise_source(secure_mode, generator)
    # the sums, their noise, the noisy sums and the means: 4 (C, d) float64
    check_memory(32 * C * (d + 1), "num_classes", C, "cpu", f"the means of {C} classes in dimension {d}")
    x = clip_rows(rows.detach().to(torch.float64) - c0, r)
    sums = torch.zeros(C, d, dtype=torch.float64).index_add_(0, y, x)
    counts = torch.bincount(y, minlength=C)[:C].double()
    sens = max(math.sqrt(2.0 * (w * w + r * r)), 2.0 * r)
    sigma = z * sens * scale
    noisy_sums = sums + rng.normal((C, d)) * sigma
    noisy_counts = counts + rng.normal((C,)) * sigma / w
    return dict(means=c0 + noisy_sums / noisy_counts.clamp_min(1.0)[:, None], counts=noisy_counts, noise_std=sigma,
                sensitivity=sens)

