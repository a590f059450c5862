"""Sensitivity of the random-direction projection and the RDP -> DP conversion of the projection mechanism.

The projection mechanism releases ``X Θᵀ + V`` for a data matrix X (M, d), directions Θ (k, d) with rows uniform on
the sphere S^{d-1}, and V with i.i.d. N(0, σ²) entries. Its sensitivity is random (it depends on Θ); this module
gives the high-probability bound w(k, δ_t) of Rakotomamonjy & Ralaivola (ICML 2021, Lemma 2 and its CLT variant) and
the honest ways of spending the DP δ on that tail.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

from .._validate import check_choice, check_delta, check_int, check_positive, check_probability
from ._lazy import LazyModule

# scipy.optimize / scipy.stats cost about 1 s to import: imported on first use
_optimize = LazyModule("scipy.optimize")
_special = LazyModule("scipy.special")
_stats = LazyModule("scipy.stats")

__all__ = ["sliced_sensitivity", "sliced_sensitivity_sq", "orthogonal_sliced_sensitivity", "split_delta",
           "projection_mechanism_epsilon", "CLT_MIN_PROJECTIONS", "BOUNDS"]

BOUNDS = ("clt", "bernstein", "chernoff")

# The CLT form is an approximation; the DP-SWD paper only uses it for k > 30 (the authors' code switches to the
# Bernstein bound below that).
CLT_MIN_PROJECTIONS = 31


def _chernoff_w(k: int, d: int, log_inv_delta: float) -> float:
    """Chernoff bound with the exact moment generating function of (θᵀu)² ~ Beta(1/2, (d−1)/2).

    For every t > 0, P(S ≥ w) ≤ exp(−t w) M(t)^k with M(t) = ₁F₁(1/2; d/2; t) (Kummer's function, the MGF of that
    Beta law), so w(t) = (k ln M(t) + ln(1/δ))/t is a valid bound for *any* t; the numerical minimisation over t only
    decides how tight it is, never whether it holds.
    """
    def w_of(t):
        return (k * math.log(_special.hyp1f1(0.5, d / 2.0, t)) + log_inv_delta) / t

    res = _optimize.minimize_scalar(w_of, bounds=(1e-6, 600.0), method="bounded", options={"xatol": 1e-10})
    return float(min(w_of(float(res.x)), w_of(1.0)))


def sliced_sensitivity_sq(num_projections: int, dim: int, delta: float, bound: str = "chernoff") -> float:
    """The squared-norm bound ``w(k, δ_t)`` for a unit-norm difference (see :func:`sliced_sensitivity`)."""
    k = check_int(num_projections, "num_projections", 1)
    d = check_int(dim, "dim", 1)
    delta = check_delta(delta, "delta")
    check_choice(bound, "bound", BOUNDS)
    mean = k / d
    if d == 1:
        # Θ = ±1: ‖(x - x')Θᵀ‖² = k ‖x - x'‖² exactly, no tail at all.
        return float(k)
    log_term = math.log(1.0 / delta)
    if bound == "chernoff":
        w = _chernoff_w(k, d, log_term)
    elif bound == "bernstein":
        w = mean + (2.0 / 3.0) * log_term + (2.0 / d) * math.sqrt(k * (d - 1) / (d + 2) * log_term)
    else:
        if k < CLT_MIN_PROJECTIONS:
            raise ValueError(f"num_projections must be >= {CLT_MIN_PROJECTIONS} for bound='clt' (the CLT "
                             f"approximation of DP-SWD is only stated for k > 30), got {k}; use bound='bernstein'")
        z = float(_stats.norm.isf(delta))  # z_{1-δ}
        w = mean + (z / d) * math.sqrt(2.0 * k * (d - 1) / (d + 2))
    # ‖(x - x')Θᵀ‖² never exceeds k‖x - x'‖² (each |θ_jᵀu| <= ‖u‖), so w can be capped at k.
    return float(min(w, float(k)))


def sliced_sensitivity(num_projections: int, dim: int, delta: float, bound: str = "chernoff",
                       diameter: float = 1.0) -> float:
    r"""ℓ2 sensitivity of ``X ↦ X Θᵀ`` that holds with probability ≥ 1 − δ over the directions Θ.

    For rows that differ by ``‖x_i − x'_i‖ ≤ diameter`` and Θ (k, d) with rows i.i.d. uniform on S^{d-1}:

    .. math::
        P_Θ\big(‖(X − X')Θᵀ‖_F^2 > \mathrm{diameter}^2 \, w(k, δ)\big) ≤ δ, \qquad
        Δ = \mathrm{diameter}\,\sqrt{w(k, δ)}

    with

    * ``"chernoff"`` (a proven bound, any k; the tightest proven one here): the Chernoff bound with the exact moment
      generating function of :math:`(θ^\top u)^2 \sim \mathrm{Beta}(1/2, (d−1)/2)`,
      :math:`w = \min_{t>0} \big(k \ln {}_1F_1(1/2; d/2; t) + \ln(1/δ)\big)/t`;
    * ``"bernstein"`` (a proven bound, any k; paper Lemma 2):
      :math:`w = k/d + \tfrac23 \ln(1/δ) + \tfrac2d \sqrt{k (d−1)/(d+2) \ln(1/δ)}`;
    * ``"clt"`` (a normal approximation, k ≥ 31 only, **not a guarantee**):
      :math:`w = k/d + \tfrac{z_{1−δ}}{d} \sqrt{2k(d−1)/(d+2)}`. The sum is right-skewed, so the true tail exceeds
      δ, increasingly so for small δ: for k = 70, d = 8 the exact tail (numerical convolution of the Beta law) is
      about 1.4 δ at δ = 1e-2, 11–13 δ at 1e-6 and roughly 90 δ at 1.2e-9 (= 1e-5/(2·4199), the per-step tail of a
      DPSWflow-r run). Prefer ``"chernoff"`` whenever the (ε, δ) is reported as a guarantee; there it costs about
      6 % more noise than CLT and about 23 % less than Bernstein.

    Both are capped at k (the deterministic bound). ``delta`` here is the *tail probability over Θ*, not the DP δ:
    a release that uses this sensitivity is (ε, δ_DP + δ)-DP where (ε, δ_DP) is what the Gaussian mechanism gives
    for sensitivity Δ. How fastdpot spends the DP δ:

    * a single projection release (DP-SWD, :func:`projection_mechanism_epsilon`): δ/2 for the tail, δ/2 for the
      RDP → DP conversion (Proposition 2 of the paper);
    * T releases with fresh Θ (flows, DP-SWD training): :func:`split_delta` — δ_acc for the accountant and
      δ_tail = (δ − δ_acc)/T per release (union bound over the T draws of Θ).

    Neighbouring relations: rows on the unit sphere replaced by another give ``diameter = 2`` (substitution);
    clipping to radius R gives ``diameter = 2R``; add/remove of a row clipped to R gives ``diameter = R``.

    Shape:
        scalar; k = ``num_projections``, d = ``dim``.

    Returns:
        Δ, in the unit of the data (a bound on the Frobenius norm of the change of the (M, k) projected matrix).

    Raises:
        ValueError: k < 1, d < 1, δ outside (0, 1), unknown ``bound``, ``diameter`` <= 0, or k < 31 with
        ``bound="clt"``.

    Note:
        The default is ``"chernoff"``, a proven tail bound, because fastdpot reports (ε, δ) as a guarantee.
        ``"clt"`` reproduces the paper and the authors' code; it is an approximation (see above), so the δ it
        reports is not enforced.

    References:
        Rakotomamonjy & Ralaivola, "Differentially Private Sliced Wasserstein Distance", ICML 2021, Lemma 2 and the
        CLT variant (Rakotomamonjy & Ralaivola, ICML 2021); Chernoff bound: Boucheron, Lugosi & Massart, "Concentration Inequalities", §2.2;
        the MGF of the Beta law: Abramowitz & Stegun 13.2.1.
    """
    diameter = check_positive(diameter, "diameter")
    return diameter * math.sqrt(sliced_sensitivity_sq(num_projections, dim, delta, bound))


def orthogonal_sliced_sensitivity(num_projections: int, dim: int, diameter: float = 1.0) -> float:
    r"""ℓ2 sensitivity of ``X ↦ X Θᵀ`` for directions in blocks of orthonormal rows -- deterministic, no tail.

    Θ (k, d) made of ``⌈k/d⌉`` blocks, each block ``min(d, rows left)`` orthonormal rows (a block of d rows is an
    orthogonal matrix; :func:`fastdpot._random.random_projections` with ``orthogonal=True`` draws each block as a
    Haar-random rotation, so every direction is still marginally uniform on S^{d-1}). For a row difference u:

    .. math::  ‖Θ u‖^2 = \sum_b ‖Θ_b u‖^2 \le ⌈k/d⌉\,‖u‖^2, \qquad Δ = \mathrm{diameter}\,\sqrt{⌈k/d⌉},

    with equality when every block is full (k a multiple of d). The bound holds for every Θ of that form, so no
    tail probability is spent: a release with this Δ is (ε, δ)-DP with the accountant's δ alone. Compared with
    i.i.d. uniform directions (:func:`sliced_sensitivity`, whose Δ² ≈ (k/d)(1 + tail) at a small tail δ) it is
    smaller whenever the blocks are full: for k = 72, d = 8, Δ = 3·diameter against 4.3·diameter (Chernoff,
    δ_tail = 1.2e-9).

    Shape:
        scalar; k = ``num_projections``, d = ``dim``.

    Returns:
        Δ, in the unit of the data (a bound on the Frobenius norm of the change of the (M, k) projected matrix).

    Raises:
        ValueError: k < 1, d < 1, ``diameter`` <= 0.

    References:
        Orthogonal random projections for sliced Wasserstein: Rowland et al., "Orthogonal Estimation of
        Wasserstein Distances", AISTATS 2019; the bound is ‖Θ‖₂² ≤ Σ_b ‖Θ_b‖₂² with ‖Θ_b‖₂ = 1.
    """
    k = check_int(num_projections, "num_projections", 1)
    d = check_int(dim, "dim", 1)
    diameter = check_positive(diameter, "diameter")
    return diameter * math.sqrt(float(-(-k // d)))


def split_delta(delta: float, num_releases: int, tail_fraction: float = 0.5) -> Tuple[float, float]:
    """Split the DP δ of T releases whose sensitivity holds only with probability 1 − δ_tail over Θ.

    Returns ``(delta_accountant, delta_tail_per_release)`` with
    ``delta_accountant = (1 − tail_fraction)·δ`` and ``delta_tail_per_release = tail_fraction·δ / T``, so that
    ``delta_accountant + T·delta_tail_per_release = δ``: with probability ≥ 1 − T·δ_tail every one of the T draws of
    Θ satisfies the sensitivity bound (union bound), and on that event the accountant's (ε, δ_accountant) holds.

    Raises:
        ValueError: δ outside (0, 1), T < 1, tail_fraction outside (0, 1).
    """
    delta = check_delta(delta, "delta")
    t = check_int(num_releases, "num_releases", 1)
    f = check_probability(tail_fraction, "tail_fraction", low_open=True, high_open=True)
    return (1.0 - f) * delta, f * delta / t


def projection_mechanism_epsilon(noise_std: float, num_projections: int, dim: int, delta: float,
                                 diameter: float = 1.0, bound: str = "chernoff",
                                 orders: Optional[Sequence[float]] = None) -> Tuple[float, float]:
    r"""ε of one release ``X Θᵀ + V`` (Proposition 2 of DP-SWD), δ split δ/2 tail + δ/2 conversion.

    .. math::
        ε = \min_{α > 1} \; \frac{α \,\mathrm{diameter}^2\, w(k, δ/2)}{2σ^2} + \frac{\ln(2/δ)}{α − 1}

    i.e. the Gaussian mechanism's RDP ``α Δ²/(2σ²)`` at sensitivity ``Δ² = diameter²·w(k, δ/2)`` (holding with
    probability 1 − δ/2 over Θ), converted to (ε, δ/2)-DP, plus δ/2 for the tail. With ``orders=None`` the minimum
    over real α > 1 is taken in closed form (α* = 1 + sqrt(ln(2/δ)/a), a = Δ²/(2σ²)); otherwise over ``orders``.

    Args:
        noise_std: σ, the standard deviation of the noise added to each projected value (unit of the data).
        num_projections, dim: k and d.
        delta: the total DP δ of the release.
        diameter: bound on ‖x_i − x'_i‖ for neighbouring data sets (2·radius under substitution).
        bound: ``"clt"``, ``"bernstein"`` or ``"chernoff"`` (see :func:`sliced_sensitivity`).
        orders: optional RDP orders α > 1 to minimise over.

    Returns:
        ``(epsilon, best_order)``.

    Raises:
        ValueError: invalid argument (named in the message).

    References:
        Rakotomamonjy & Ralaivola, ICML 2021, Proposition 2; Mironov, "Rényi Differential Privacy", CSF 2017
        (Proposition 3, RDP → DP).
    """
    sigma = check_positive(noise_std, "noise_std")
    delta = check_delta(delta, "delta")
    w = sliced_sensitivity_sq(num_projections, dim, delta / 2.0, bound)
    diameter = check_positive(diameter, "diameter")
    a = diameter ** 2 * w / (2.0 * sigma ** 2)
    b = math.log(2.0 / delta)
    if orders is None:
        alpha = 1.0 + math.sqrt(b / a)
        return a * alpha + b / (alpha - 1.0), alpha
    orders = list(orders)
    if not orders:
        raise ValueError("orders must be a non-empty sequence of RDP orders > 1, got []")
    best = (math.inf, float("nan"))
    for alpha in orders:
        alpha = check_positive(alpha, "orders[i]")
        if not alpha > 1.0:
            raise ValueError(f"orders must all be > 1, got {alpha!r}")
        eps = a * alpha + b / (alpha - 1.0)
        if eps < best[0]:
            best = (eps, alpha)
    return best
