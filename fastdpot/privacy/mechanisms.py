"""Noise mechanisms: the Gaussian mechanism's σ, row clipping / normalisation, the Gaussian projection mechanism,
and the local (per-user) Laplace and Gaussian mechanisms.

Every mechanism enforces its data-norm bound *inside* (private rows are clipped or projected before release) and
draws its noise from :class:`~fastdpot.privacy.randomness.PrivacyRandomness`: by default (``secure_mode=True``)
from the operating system's CSPRNG, secret and not replayable; with ``secure_mode=False`` from the ``torch.Generator``
you pass (replayable: no guarantee against anyone who holds its seed). Gaussian noise is always drawn in float64
with wide tails and then cast (never float32 ``torch.randn``, whose Box--Muller stops at 5.77σ). Floating-point
caveat (all mechanisms): the noise is sampled in floating point, whose low-order bits can leak information about
the noiseless value (Mironov, "On significance of the least significant bits for differential privacy", CCS 2012);
secure mode makes the noise unpredictable but does not close that channel (the same caveat as Opacus'
``secure_mode``).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .._validate import check_delta, check_epsilon, check_positive, check_tensor
from ._lazy import LazyModule
from .randomness import privacy_randomness

_dp_accounting = LazyModule("dp_accounting")  # imported on first use

__all__ = ["gaussian_mechanism_sigma", "ldp_gaussian_sigma", "clip_rows", "normalize_rows", "project_l1_ball",
           "gaussian_projection_mechanism", "laplace_local_mechanism", "gaussian_local_mechanism"]




def gaussian_mechanism_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    r"""Noise standard deviation of the plain Gaussian mechanism for one (ε, δ)-DP release.

    .. math::  σ = \sqrt{2 \ln(1.25/δ)}\; Δ / ε

    (Dwork & Roth 2014, Theorem A.1). That formula is only proven for ε ≤ 1, and for larger ε it can be too small
    (ε = 10, δ = 1e-5 gives a mechanism that is really (10.39, 1e-5)-DP). This function therefore returns
    ``max(classic σ, analytic σ)``, where the analytic σ is the exact calibration of Balle & Wang (ICML 2018,
    computed by dp-accounting's ``get_sigma_gaussian``): the classic value for ε ≤ 1 and whenever it is valid, a
    valid σ otherwise.

    Args:
        epsilon: ε > 0.
        delta: δ in (0, 1).
        sensitivity: ℓ2 sensitivity Δ > 0 (same unit as the released values).

    Returns:
        σ, a standard deviation in the unit of the released values.

    Raises:
        ValueError: ε <= 0, δ outside (0, 1), Δ <= 0.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    sensitivity = check_positive(sensitivity, "sensitivity")
    classic = math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
    if epsilon <= 1.0:
        return classic * sensitivity
    analytic = float(_dp_accounting.get_sigma_gaussian(epsilon, delta))
    return max(classic, analytic) * sensitivity


def ldp_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    r"""σ of paper eq. 5 (Reshetova et al.; Zhao et al. 2019) for an (ε, δ)-DP Gaussian release, δ < 1/2.

    .. math::  σ = \frac{c + \sqrt{c^2 + ε}}{ε\sqrt2}\,Δ, \qquad c^2 = \ln\frac{2}{\sqrt{16δ + 1} − 1}

    Raises:
        ValueError: ε <= 0, δ outside (0, 1/2), Δ <= 0.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    if not delta < 0.5:
        raise ValueError(f"delta must be < 0.5 for the σ of eq. 5 (c² would be <= 0), got {delta!r}")
    sensitivity = check_positive(sensitivity, "sensitivity")
    c = math.sqrt(math.log(2.0 / (math.sqrt(16.0 * delta + 1.0) - 1.0)))
    return (c + math.sqrt(c * c + epsilon)) / (epsilon * math.sqrt(2.0)) * sensitivity


def clip_rows(x: torch.Tensor, clip_radius: float) -> torch.Tensor:
    """Rows with ℓ2 norm > ``clip_radius`` scaled onto the sphere of that radius; other rows untouched.

    Shape:
        x: (N, d) -> (N, d).

    The scale factor is computed in float64, so a clipped row's norm exceeds ``clip_radius`` by at most the rounding of
    the output dtype (a relative 2^-24 in float32).

    Raises:
        TypeError / ValueError: x not a finite floating (N, d) tensor, clip_radius <= 0.
    """
    check_tensor(x, "x", 2)
    clip_radius = check_positive(clip_radius, "clip_radius")
    norms = torch.linalg.vector_norm(x.double(), dim=1, keepdim=True)
    scale = torch.clamp(clip_radius / torch.clamp(norms, min=clip_radius), max=1.0)
    return torch.where(norms > clip_radius, (x.double() * scale).to(x.dtype), x)


def normalize_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows divided by their ℓ2 norm (onto the unit sphere S^{d-1}).

    A zero row has no direction; it is mapped to the first basis vector e_1, so that every output row lies on the
    sphere (the bound ``‖x − x'‖ ≤ 2`` holds for any input) without raising on — and thereby revealing — a private
    zero row.

    Shape:
        x: (N, d) -> (N, d).

    Raises:
        TypeError / ValueError: x not a finite floating (N, d) tensor.
    """
    check_tensor(x, "x", 2)
    xd = x.double()
    norms = torch.linalg.vector_norm(xd, dim=1, keepdim=True)
    out = xd / torch.where(norms > 0, norms, torch.ones_like(norms))
    e1 = torch.zeros_like(xd[:1])
    e1[0, 0] = 1.0
    out = torch.where(norms > 0, out, e1)
    return out.to(x.dtype)


def project_l1_ball(x: torch.Tensor, clip_radius: float) -> torch.Tensor:
    """Euclidean projection of each row onto the ℓ1 ball of ``clip_radius`` (rows inside are returned unchanged).

    Sort-based algorithm (Duchi, Shalev-Shwartz, Singer & Chandra, ICML 2008, Fig. 1): soft-threshold ``|x|`` at
    the τ ≥ 0 for which ``‖max(|x| − τ, 0)‖₁ = radius``. Computed in float64.

    Shape:
        x: (N, d) -> (N, d).

    Raises:
        TypeError / ValueError: x not a finite floating (N, d) tensor, clip_radius <= 0.
    """
    check_tensor(x, "x", 2)
    clip_radius = check_positive(clip_radius, "clip_radius")
    xd = x.double()
    a = xd.abs()
    outside = a.sum(dim=1) > clip_radius
    u, _ = torch.sort(a, dim=1, descending=True)
    css = torch.cumsum(u, dim=1) - clip_radius
    j = torch.arange(1, x.shape[1] + 1, dtype=xd.dtype, device=x.device)
    cond = (u - css / j) > 0
    # rho = largest index j (1-based) with u_j > (sum_{i<=j} u_i - r)/j; cond is true for j=1 when outside.
    rho = (cond * j).amax(dim=1).clamp(min=1).long()
    tau = css.gather(1, (rho - 1).unsqueeze(1)) / rho.unsqueeze(1).to(xd.dtype)
    proj = torch.sign(xd) * torch.clamp(a - tau.clamp(min=0), min=0)
    out = torch.where(outside.unsqueeze(1), proj, xd)
    # guard the rounding of the threshold: never leave a row above the radius
    l1 = out.abs().sum(dim=1, keepdim=True)
    out = torch.where(l1 > clip_radius, out * (clip_radius / l1), out)
    return out.to(x.dtype)


def gaussian_projection_mechanism(x_private: torch.Tensor, projections: torch.Tensor, noise_std: float,
                                  clip_radius: float, normalize: bool = False,
                                  generator: Optional[torch.Generator] = None, *,
                                  secure_mode: bool = True) -> torch.Tensor:
    r"""Release ``clip(X) Θᵀ + V`` — the Gaussian mechanism on random-direction projections (DP-SWD, flows).

    The private rows are first forced into the declared geometry: clipped to ℓ2 norm ≤ ``clip_radius``
    (``normalize=False``) or put on the sphere of that radius (``normalize=True``: ``radius · x/‖x‖``). Under
    substitution of one row the change of ``X Θᵀ`` is then at most ``2·radius·sqrt(w(k, δ_t))`` with probability
    1 − δ_t over Θ (:func:`~fastdpot.privacy.sliced_sensitivity` with ``diameter = 2·radius``); the noise
    multiplier of this release is ``noise_std / that sensitivity``. The directions must have unit-norm rows and be
    drawn independently of the data (uniform on the sphere) for that bound to hold.

    Shape:
        x_private: (M, d); projections Θ: (k, d), unit rows; output: (M, k).

    Args:
        noise_std: σ, standard deviation of the Gaussian noise on each projected value (unit of the data).
        clip_radius: the declared data-norm bound R > 0.
        normalize: put rows on the sphere of radius R instead of clipping.
        generator: source of the noise with ``secure_mode=False`` (``None``: a freshly seeded one).
        secure_mode: True (default): the noise comes from the operating system (secret, not replayable); passing a
            ``generator`` then raises. False: from ``generator`` (replayable; no guarantee against anyone who holds
            its seed).

    Raises:
        TypeError / ValueError: non-finite or wrongly shaped inputs, mismatched d, rows of Θ not of unit norm,
        ``noise_std`` <= 0, ``clip_radius`` <= 0, a ``generator`` with ``secure_mode=True``.

    Autograd: gradients flow to ``projections`` (the noise is additive); none should flow into private data.

    References:
        Rakotomamonjy & Ralaivola, ICML 2021, §4 (the mechanism XΘᵀ + V); Sebag et al., TMLR.
    """
    check_tensor(x_private, "x_private", 2)
    check_tensor(projections, "projections", 2)
    if projections.shape[1] != x_private.shape[1]:
        raise ValueError(f"projections must have shape (k, d) with d = x_private.shape[1] = {x_private.shape[1]}, "
                         f"got {tuple(projections.shape)}")
    rn = torch.linalg.vector_norm(projections.detach().double(), dim=1)
    tol = 1e-5 if projections.dtype == torch.float64 else 1e-3
    if bool(((rn - 1.0).abs() > tol).any()):
        raise ValueError(f"projections must have unit-norm rows (the sensitivity bound assumes θ on the sphere), "
                         f"got row norms in [{float(rn.min()):.6g}, {float(rn.max()):.6g}]")
    sigma = check_positive(noise_std, "noise_std")
    clip_radius = check_positive(clip_radius, "clip_radius")
    rng = privacy_randomness(secure_mode, generator)
    if not isinstance(normalize, bool):
        raise ValueError(f"normalize must be a bool, got {normalize!r}")
    x = x_private.detach()
    x = normalize_rows(x) * clip_radius if normalize else clip_rows(x, clip_radius)
    x = x.to(projections.dtype)
    proj = x @ projections.transpose(0, 1)
    noise = rng.normal(proj.shape, dtype=proj.dtype, device=proj.device)
    return proj + sigma * noise


def laplace_local_mechanism(x: torch.Tensor, epsilon: float, clip_radius: float,
                            generator: Optional[torch.Generator] = None, *,
                            secure_mode: bool = True) -> Tuple[torch.Tensor, float]:
    r"""ε-local-DP release of each row: project onto the ℓ1 ball of ``clip_radius``, add Laplace noise per coordinate.

    Any two inputs of the ℓ1 ball differ by at most its diameter ``2·radius`` in ℓ1 norm, so the Laplace scale is
    ``b = 2·radius/ε`` (Dwork et al. 2006). Note: the paper (Reshetova et al., §5 "Data privatization") uses
    ``radius/ε``, i.e. the radius as sensitivity, which only gives 2ε-LDP; fastdpot uses the diameter.

    Shape:
        x: (N, d) -> x_priv (N, d).

    Args:
        generator, secure_mode: the noise source: the operating system by default (secret; a ``generator`` then
            raises), ``generator`` with ``secure_mode=False`` (replayable; no guarantee against its holder). The
            exponentials are drawn in float64 (reach 45b) and cast.

    Returns:
        ``(x_priv, scale)`` with ``scale = b`` (Laplace scale; the noise standard deviation is ``b·√2``).

    Raises:
        TypeError / ValueError: x not a finite floating (N, d) tensor, ε <= 0, clip_radius <= 0, a generator with
        ``secure_mode=True``.

    References:
        Reshetova, Chen & Özgür, "Training generative models from privatized data via entropic optimal transport",
        §2 (Laplace mechanism) and Corollary 1; Dwork, McSherry, Nissim & Smith, TCC 2006.
    """
    check_tensor(x, "x", 2)
    epsilon = check_epsilon(epsilon)
    clip_radius = check_positive(clip_radius, "clip_radius")
    rng = privacy_randomness(secure_mode, generator)
    scale = 2.0 * clip_radius / epsilon
    xb = project_l1_ball(x.detach(), clip_radius)
    # Laplace(b) = b (E1 - E2) with E1, E2 i.i.d. Exp(1): never produces ±inf (unlike the inverse-cdf form at u=0).
    e1 = rng.exponential(xb.shape)
    e2 = rng.exponential(xb.shape)
    return xb + (scale * (e1 - e2)).to(dtype=xb.dtype, device=xb.device), scale


def gaussian_local_mechanism(x: torch.Tensor, epsilon: float, delta: float, clip_radius: float,
                             generator: Optional[torch.Generator] = None, *,
                             secure_mode: bool = True) -> Tuple[torch.Tensor, float]:
    r"""(ε, δ)-local-DP release of each row: clip to the ℓ2 ball of ``clip_radius``, add N(0, σ² I).

    σ is paper eq. 5 (:func:`ldp_gaussian_sigma`) with sensitivity ``Δ = 2·radius``, the ℓ2 diameter of the ball
    (any two users' inputs may differ by that much; the paper's experiments use the radius, which is too small
    by a factor 2). The entropic loss that denoises this release uses λ = 2σ² (p = 2).

    Shape:
        x: (N, d) -> x_priv (N, d).

    Args:
        generator, secure_mode: the noise source: the operating system by default (secret; a ``generator`` then
            raises), ``generator`` with ``secure_mode=False`` (replayable; no guarantee against its holder). Noise
            drawn in float64 (wide tails) and cast to x's dtype.

    Returns:
        ``(x_priv, sigma)``, σ the noise standard deviation per coordinate.

    Raises:
        TypeError / ValueError: x not a finite floating (N, d) tensor, ε <= 0, δ outside (0, 1/2), clip_radius <= 0,
        a generator with ``secure_mode=True``.

    References:
        Reshetova, Chen & Özgür, eq. 5 and Corollary 2; Zhao et al., "Reviewing and improving the
        Gaussian mechanism for differential privacy", 2019.
    """
    check_tensor(x, "x", 2)
    clip_radius = check_positive(clip_radius, "clip_radius")
    sigma = ldp_gaussian_sigma(epsilon, delta, 2.0 * clip_radius)
    rng = privacy_randomness(secure_mode, generator)
    xb = clip_rows(x.detach(), clip_radius)
    noise = rng.normal(xb.shape, dtype=torch.float64)
    return xb + (sigma * noise).to(dtype=xb.dtype, device=xb.device), sigma
