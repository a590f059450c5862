"""Baselines of the main job, in the same latent space and under the same (ε, δ) as the flow.

* :func:`dp_class_gaussians` — the DP Gaussian per class: each class's latents are clipped (scaled onto the unit
  sphere, or shifted by a public class centre and clipped to a ball of radius r, as the flow does), one Gaussian
  mechanism releases the class's sums Σ x and Σ x xᵀ at (ε, δ), and the noisy moments give a mean and a
  covariance projected onto the PSD cone. :func:`sample_class_gaussians` then draws labelled latents from them.
* :func:`public_only_samples` — what the public half gives with no private data at all: its own labelled latents.
* The non-private flow is the flow at ε = ∞ (``fastdpot flow --epsilon inf``).

Neighbouring relation (the flows' too): two data sets differ in one private image whose label is unchanged
(replace-one, labels public). The class counts n_c are therefore public and released without noise, and one
class's release depends on one partition only, so the releases of the C classes compose in parallel.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

from .._validate import check_delta, check_epsilon, check_int, check_positive, check_tensor
from ..privacy import clip_rows, gaussian_mechanism_sigma, normalize_rows

__all__ = ["moments_sensitivity", "dp_class_gaussians", "sample_class_gaussians", "public_only_samples",
           "particles_per_class"]


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


def _bounded_rows(latents, labels, clip_radius, normalize, centers):
    """The rows the mechanism sees: shifted by their class's public centre, then clipped / normalised (float64)."""
    x = latents.double()
    if centers is not None:
        x = x - centers.double()[labels]
    return normalize_rows(x) * clip_radius if normalize else clip_rows(x, clip_radius)


def dp_class_gaussians(latents: torch.Tensor, labels: torch.Tensor, epsilon: float, delta: float,
                       clip_radius: float = 1.0, normalize: bool = True, centers: Optional[torch.Tensor] = None,
                       num_classes: Optional[int] = None, generator: Optional[torch.Generator] = None,
                       return_noise: bool = False, *, secure_mode: bool = True) -> Dict[str, torch.Tensor]:
    r"""(ε, δ)-DP per-class mean and covariance of private latents: the Gaussian mechanism on (Σ x, Σ x xᵀ).

    For each class c with public count n_c, the rows y = bound(x − centre_c) (``normalize``: y = r·x/‖x‖, else
    y = x clipped to ‖y‖ ≤ r; the clipping happens here, inside the mechanism) give
    S_c = Σ y + V, Q_c = Σ y yᵀ + W with V, W i.i.d. N(0, σ²) entries, σ = σ_G(ε, δ)·Δ
    (:func:`fastdpot.privacy.gaussian_mechanism_sigma`, analytic calibration, Δ = :func:`moments_sensitivity`).
    Post-processing: Q_c is symmetrised, μ_c = S_c / n_c + centre_c, Σ_c = Q_c / n_c − (S_c/n_c)(S_c/n_c)ᵀ
    projected onto the PSD cone (negative eigenvalues set to 0).

    Privacy: one Gaussian mechanism per class on disjoint partitions (labels public, replace-one neighbours that
    keep the label) — by parallel composition the whole release is (ε, δ)-DP. The noise is drawn in float64.

    Args:
        latents: (n, d) private latents. labels: (n,) int64 public labels in [0, C).
        epsilon: ε > 0 (``inf``: no noise, the exact moments — not private). delta: δ in (0, 1).
        clip_radius: r > 0, the clipping radius (latent units). normalize: scale every row onto the sphere of radius r
            (the flow's default, r = 1) instead of clipping. centers: (C, d) public class centres, or None.
        num_classes: C (default: max label + 1). generator: torch.Generator of the noise, used only with
        ``secure_mode=False`` (replayable, no guarantee against whoever holds its seed); by default the noise is
        secret operating-system randomness (:class:`fastdpot.privacy.PrivacyRandomness`), float64 either way.
        return_noise: also return the noise draws ``noise_sum`` (C, d) and ``noise_second`` (C, d, d).

    Returns:
        dict with ``means`` (C, d) and ``covs`` (C, d, d) float64, ``counts`` (C,), ``noise_std`` σ (0 at ε = ∞),
        ``sensitivity`` Δ, ``epsilon``, ``delta``.

    Raises:
        ValueError / TypeError: bad latents, labels, ε, δ, r, centers, or a class with no private rows.

    References:
        Dwork & Roth, "The algorithmic foundations of differential privacy", 2014 (Gaussian mechanism, parallel
        composition); Balle & Wang, "Improving the Gaussian mechanism for differential privacy", ICML 2018
        (analytic σ).
    """
    check_tensor(latents, "latents", 2)
    if latents.shape[0] == 0:
        raise ValueError("latents is empty")
    if not isinstance(labels, torch.Tensor) or labels.dtype != torch.int64 or labels.shape != latents.shape[:1]:
        raise ValueError(f"labels must be an int64 tensor of shape ({latents.shape[0]},)")
    eps = check_epsilon(epsilon, "epsilon", allow_inf=True)
    delta = check_delta(delta)
    clip_radius = check_positive(clip_radius, "clip_radius")
    C = int(labels.max()) + 1 if num_classes is None else check_int(num_classes, "num_classes")
    if int(labels.min()) < 0 or int(labels.max()) >= C:
        raise ValueError(f"labels must lie in [0, {C})")
    counts = torch.bincount(labels, minlength=C)
    if bool((counts == 0).any()):
        raise ValueError(f"classes {torch.nonzero(counts == 0).flatten().tolist()} have no private rows")
    if centers is not None:
        check_tensor(centers, "centers", 2)
        if tuple(centers.shape) != (C, latents.shape[1]):
            raise ValueError(f"centers must be ({C}, {latents.shape[1]}), got {tuple(centers.shape)}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    from ..privacy.randomness import privacy_randomness

    rng = privacy_randomness(secure_mode, generator)
    d = latents.shape[1]
    y = _bounded_rows(latents, labels, clip_radius, normalize, centers)
    sums = torch.zeros(C, d, dtype=torch.float64).index_add_(0, labels, y)
    second = torch.zeros(C, d * d, dtype=torch.float64).index_add_(0, labels, (y[:, :, None] * y[:, None, :])
                                                                   .reshape(-1, d * d)).view(C, d, d)
    delta_f = moments_sensitivity(clip_radius)
    sigma = 0.0 if math.isinf(eps) else gaussian_mechanism_sigma(eps, delta, delta_f)
    nv = rng.normal((C, d)) * sigma
    nw = rng.normal((C, d, d)) * sigma
    s, q = sums + nv, second + nw
    q = 0.5 * (q + q.transpose(1, 2))
    n = counts.double()
    m = s / n[:, None]
    cov = q / n[:, None, None] - m[:, :, None] * m[:, None, :]
    evals, evecs = torch.linalg.eigh(cov)
    cov = (evecs * evals.clamp_min(0.0)[:, None, :]) @ evecs.transpose(1, 2)
    means = m + (centers.double() if centers is not None else 0.0)
    out = dict(means=means, covs=0.5 * (cov + cov.transpose(1, 2)), counts=counts, noise_std=sigma,
               sensitivity=delta_f, epsilon=eps, delta=delta)
    if return_noise:
        out.update(noise_sum=nv, noise_second=nw)
    return out


def particles_per_class(counts: torch.Tensor, num_particles: int) -> torch.Tensor:
    """Particles per class proportional to the (public) class counts, at least 2 each, summing to N
    (largest remainder; the allocation of ``ClassConditionalFlow(particles_per_class="proportional")``)."""
    C = counts.numel()
    num_particles = check_int(num_particles, "num_particles", 2 * C)
    spare = num_particles - 2 * C
    share = counts.double() / counts.double().sum() * spare
    base = share.floor().long()
    order = torch.argsort(share - base.double(), descending=True, stable=True)
    base[order[:spare - int(base.sum())]] += 1
    return base + 2


def sample_class_gaussians(means: torch.Tensor, covs: torch.Tensor, counts: torch.Tensor, num_particles: int,
                           generator: Optional[torch.Generator] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """N labelled latents, class c drawn from N(means[c], covs[c]) (post-processing of the release).

    Shape:
        means (C, d), covs (C, d, d) PSD, counts (C,) public class counts -> (samples (N, d) float32, labels (N,)).
    """
    sizes = particles_per_class(counts, num_particles)
    xs, ys = [], []
    for c in range(means.shape[0]):
        evals, evecs = torch.linalg.eigh(covs[c].double())
        root = evecs * evals.clamp_min(0.0).sqrt()[None, :]
        z = torch.randn(int(sizes[c]), means.shape[1], dtype=torch.float64, generator=generator)
        xs.append(means[c].double() + z @ root.T)
        ys.append(torch.full((int(sizes[c]),), c, dtype=torch.int64))
    return torch.cat(xs).float(), torch.cat(ys)


def public_only_samples(public_latents: torch.Tensor, public_labels: Optional[torch.Tensor], num_samples: int,
                        generator: Optional[torch.Generator] = None
                        ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``num_samples`` rows of the PUBLIC latents with their labels (without replacement while they last, the rest
    with replacement): the public-only baseline, no private data and no privacy cost.

    Shape:
        public_latents (M, d), public_labels (M,) or None -> ((N, d) float32, (N,) or None).
    """
    check_tensor(public_latents, "public_latents", 2)
    if public_latents.shape[0] == 0:
        raise ValueError("public_latents is empty")
    num_samples = check_int(num_samples, "num_samples")
    M = public_latents.shape[0]
    idx = torch.randperm(M, generator=generator)[:num_samples]
    if num_samples > M:
        idx = torch.cat([idx, torch.randint(M, (num_samples - M,), generator=generator)])
    return public_latents[idx].float(), None if public_labels is None else public_labels[idx]


def stage_baseline(cfg, ae: Dict, num_particles: int, seed: int, centers: Optional[torch.Tensor] = None,
                   clip_radius: Optional[float] = None) -> Dict:
    """The pipeline's generation stage for ``cfg.method`` in ("gaussian", "public") (same keys as
    :func:`fastdpot.experiments.flow_stage.stage_flow`: ``samples``, ``sample_labels``, ``epsilon``, ``privacy``,
    ``resumed``).

    "gaussian" bounds the rows as the flow would (unit sphere, or ``centers`` and ``clip_radius`` with
    ``cfg.center == "public"``) and needs labels; "public" uses ``ae["public_latents"]`` only (ε = 0).
    """
    gen = torch.Generator().manual_seed(int(seed))
    if cfg.method == "public":
        x, y = public_only_samples(ae["public_latents"], ae["public_labels"] if cfg.class_conditional else None,
                                   num_particles, generator=gen)
        return dict(samples=x, sample_labels=y, epsilon=0.0, resumed=False,
                    privacy=dict(method="public", private=True, uses_private_data=False))
    labels = ae["labels"]
    if labels is None or not cfg.class_conditional:
        raise ValueError("method='gaussian' needs labelled data and class_conditional=True")
    rel = dp_class_gaussians(ae["latents"], labels, cfg.epsilon, cfg.delta,
                             clip_radius=1.0 if centers is None else clip_radius, normalize=centers is None,
                             centers=centers, generator=gen if cfg.replayable_noise else None,
                             secure_mode=not cfg.replayable_noise)
    x, y = sample_class_gaussians(rel["means"], rel["covs"], rel["counts"], num_particles, generator=gen)
    private = not math.isinf(cfg.epsilon)
    return dict(samples=x, sample_labels=y, epsilon=cfg.epsilon if private else math.inf, resumed=False,
                privacy=dict(method="gaussian", private=private, uses_private_data=True, noise_std=rel["noise_std"],
                             sensitivity=rel["sensitivity"], counts=rel["counts"].tolist(),
                             center="none" if centers is None else "public",
                             clip_radius=1.0 if centers is None else clip_radius))


def baseline_privacy_md(cfg, result: Dict) -> str:
    """privacy.md of a baseline run (``cfg.method`` "gaussian" or "public")."""
    p = result["privacy"]
    head = ["# Privacy of this run", "",
            f"* Data: `{result['dataset']}` training set, split with seed {cfg.seed} into a public part "
            f"({result['n_public']} images) and a disjoint private part ({result['n_private']} images).",
            "* Public by assumption: the public part, the auto-encoder trained on it, the real test set (FID and "
            "classifiers), the labels and so the class counts."]
    if p["method"] == "public":
        return "\n".join(head + [
            "* **Public-only baseline (`--method public`)**: the samples are the public part's own latents with "
            "their labels, decoded. No private image is read: nothing is released about the private part (ε = 0).",
            ""])
    if not p["private"]:
        guarantee = ["* **Non-private (`--epsilon inf`)**: the exact per-class moments, no noise, no guarantee."]
    else:
        guarantee = [f"* Guarantee: (ε, δ) = ({cfg.epsilon}, {cfg.delta}) by the Gaussian mechanism (analytic "
                     f"calibration, Balle & Wang, ICML 2018) per class and parallel composition over the classes."]
    bound = ("each latent scaled onto the unit sphere (r = 1)" if p["center"] == "none" else
             f"each latent shifted by its class's PUBLIC mean latent and clipped to radius r = {p['clip_radius']:.4g}")
    return "\n".join(head + [
        "* **DP Gaussian baseline (`--method gaussian`)**: per class, " + bound + " inside the mechanism; one "
        "release of (Σ x, Σ x xᵀ) with i.i.d. N(0, σ²) noise on every entry (float64), σ = "
        f"{p['noise_std']:.6g}, sensitivity Δ = {p['sensitivity']:.6g} (replace-one neighbours that keep the "
        "label; proof in `fastdpot.baselines.moments_sensitivity`).",
        "* Post-processing (no privacy cost): mean and covariance from the noisy moments, covariance projected onto "
        "the PSD cone, samples drawn from the Gaussian of each class, decoded by the public decoder.",
        *guarantee,
        "* Not covered: an image that changes class; floating-point attacks on Gaussian sampling (Mironov 2012).",
        ""])
