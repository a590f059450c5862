"""Audit cases of the local and gradient releases: the Laplace and Gaussian local mechanisms, DP-Sinkhorn's sanitised
image gradient (joint and per-sample clipping) and a composition of subsampled Gaussian releases.

Each builds an :class:`~fastdpot.audit.cases.AuditSetup` for ``(backend, variant)``; the variants and the claims are
those of :mod:`fastdpot.audit.cases`, whose :data:`~fastdpot.audit.cases.CASES` lists them.
"""
from __future__ import annotations

import math

import torch

from .. import privacy as _p
from ._common import _F64, _OUT, DELTA, EPSILON, RADIUS, VARIANTS, AuditSetup, _check_variant
from ._noise import TRUNCATION, truncated_laplace, truncated_normal

__all__ = ["sanitizer", "laplace_local", "gaussian_local", "composition"]


def sanitizer(clipping: str):
    """The audit case builder of DP-Sinkhorn's sanitiser with ``clipping`` ("joint" or "per_sample")."""

    def build(backend: str, variant: str) -> AuditSetup:
        from ..dp_sinkhorn import sanitize_image_gradient, sensitivity_factor

        _check_variant(variant, VARIANTS)
        b, extra, dim, c = 2, 1, 3, 1.0
        z = 1.45  # noise multiplier (σ/Δ); the claim is what the accountant says it buys (≈ 2 at δ = 1e-3)
        acc = _p.PrivacyAccountant("pld")
        acc.step(z)
        eps = float(acc.get_epsilon(DELTA))
        g0 = torch.zeros(b + extra, dim, dtype=_F64)
        if clipping == "joint":
            g0[0, 0] = _OUT * c             # the whole private block at 3C: clipped to the norm C
        else:
            g0[:b, 0] = _OUT * c            # every private row at 3C: each clipped to C
        g0[b:, 1] = 0.5
        g1 = g0.clone()
        g1[:b] = -g0[:b]

        def mech(data, g, n):
            outs = []
            for _ in range(n):
                if variant == "no_clip":
                    sigma = z * c * sensitivity_factor(clipping, b)
                    noise = torch.randn(b, dim, generator=g, dtype=_F64) * sigma
                    outs.append(torch.cat([data[:b] + noise, data[b:]]))
                elif variant == "truncated":   # the sanitiser's own noise clamped at 3σ
                    out, sigma, noise = sanitize_image_gradient(data, b, c, z, clipping=clipping, generator=g,
                                                                secure_mode=False, return_noise=True)
                    out[:b] += noise.clamp(-TRUNCATION * sigma, TRUNCATION * sigma) - noise
                    outs.append(out)
                else:
                    zz = z / 2 if variant == "sensitivity_2x" else z
                    outs.append(sanitize_image_gradient(data, b, c, zz, clipping=clipping, generator=g,
                                                          secure_mode=False)[0])
            return torch.stack(outs)

        return AuditSetup(mech, g0, g1, eps, DELTA)

    build.__doc__ = (f"DP-Sinkhorn's sanitised image gradient (Cao et al., NeurIPS 2021), clipping='{clipping}'.\n\n"
                     "Worst case: neighbouring real batches may move the clipped gradient anywhere in the clipping set,"
                     " so the two gradients are opposite points at the clipping norm C (the whole block for 'joint',"
                     " every private row for 'per_sample'; given at 3C so the clipping inside is exercised). Claim: "
                     "the PLD accountant's ε for one unsampled release at noise multiplier z = 1.45.")
    return build


def laplace_local(backend: str, variant: str) -> AuditSetup:
    """Laplace local mechanism (ℓ1 ball of radius R, scale 2R/ε), ε-LDP (δ = 0).

    Worst case: opposite corners x = −R e₁, x′ = R e₁ of the ℓ1 ball (ℓ1 distance 2R, the diameter the scale
    is calibrated to); given at 3R so the projection onto the ball is exercised. The likelihood ratio is exactly
    e^ε on {o₁ ≥ R}, so the audit can come close to the claim.
    """
    _check_variant(variant, VARIANTS)
    eps, d = 1.0, 2
    x = torch.zeros(1, d, dtype=_F64)
    x[0, 0] = -_OUT * RADIUS
    x2 = -x

    def mech(data, g, n):
        rows = data.expand(n, d)
        if variant == "sensitivity_2x":   # scale R/ε: the radius taken as the sensitivity
            return _p.laplace_local_mechanism(rows, 2.0 * eps, RADIUS, generator=g, secure_mode=False)[0]
        if variant == "truncated":
            return _p.project_l1_ball(rows, RADIUS) + 2 * RADIUS / eps * truncated_laplace((n, d), g)
        if variant == "no_clip":
            lap = torch.empty(2, n, d, dtype=_F64).exponential_(1.0, generator=g)
            return rows + 2 * RADIUS / eps * (lap[0] - lap[1])
        return _p.laplace_local_mechanism(rows, eps, RADIUS, generator=g, secure_mode=False)[0]

    return AuditSetup(mech, x, x2, eps, 0.0)


def gaussian_local(backend: str, variant: str) -> AuditSetup:
    """Gaussian local mechanism (ℓ2 ball of radius R, σ of eq. 5 of Reshetova, Chen & Özgür at Δ = 2R).

    Worst case: opposite points x = −R e₁, x′ = R e₁ of the ball (distance 2R, the diameter); given at 3R so the
    clipping is exercised.
    """
    _check_variant(variant, VARIANTS)
    d = 2
    x = torch.zeros(1, d, dtype=_F64)
    x[0, 0] = -_OUT * RADIUS
    x2 = -x
    sigma = _p.ldp_gaussian_sigma(EPSILON, DELTA, 2.0 * RADIUS)

    def mech(data, g, n):
        rows = data.expand(n, d)
        if variant == "sensitivity_2x":   # σ for Δ = R: the radius taken as the sensitivity
            return _p.clip_rows(rows, RADIUS) + _p.ldp_gaussian_sigma(EPSILON, DELTA, RADIUS) * \
                torch.randn(n, d, generator=g, dtype=_F64)
        if variant == "truncated":
            return _p.clip_rows(rows, RADIUS) + sigma * truncated_normal((n, d), g)
        if variant == "no_clip":
            return rows + sigma * torch.randn(n, d, generator=g, dtype=_F64)
        return _p.gaussian_local_mechanism(rows, EPSILON, DELTA, RADIUS, generator=g, secure_mode=False)[0]

    return AuditSetup(mech, x, x2, EPSILON, DELTA)


def composition(backend: str, variant: str) -> AuditSetup:
    """T = 4 subsampled releases: each step draws B = 1 of n = 4 rows uniformly without replacement and releases
    it through the Gaussian projection mechanism (d = k = 1, Θ = [1]) with noise multiplier z = 1.75 (σ = 2Rz);
    claim: the RDP accountant's ε for those T ``"without_replacement"`` events (substitution neighbours).

    Worst case: every row of D at −R, the substituted row of D′ at +R (given at ∓3R: clipped inside). The test
    statistic is the exact log-likelihood ratio Σ_t ln(1 − q + (q/B) Σ_i exp(2R v_ti/σ²)) (q = B/n), the most
    powerful test of D against D′ (Neyman–Pearson). Batches are drawn as the first B entries of a uniformly random
    permutation, the law of :class:`fastdpot.privacy.FixedSizeSampler`, vectorised over trials. Broken variants:
    ``"no_sampling"`` (the batch is always the first rows, so the claimed amplification does not exist) and
    ``"sensitivity_2x"``.
    """
    _check_variant(variant, ("correct", "sensitivity_2x", "no_sampling"))
    n_rows, b, steps = 4, 1, 4
    q = b / n_rows
    z = 1.75  # noise multiplier (σ/Δ); the claim is what the accountant says it buys (≈ 2 at δ = 1e-3)
    acc = _p.PrivacyAccountant("rdp")
    acc.step(z, sample_rate=q, num_steps=steps, sampling="without_replacement", dataset_size=n_rows, batch_size=b)
    eps = float(acc.get_epsilon(DELTA))
    sigma = z * 2 * RADIUS
    theta = torch.ones(1, 1, dtype=_F64)
    d0 = torch.full((n_rows, 1), -_OUT * RADIUS, dtype=_F64)
    d1 = d0.clone()
    d1[0] = _OUT * RADIUS

    def mech(data, g, n):
        if variant == "no_sampling":
            idx = torch.arange(b).expand(n, steps, b)
        else:
            idx = torch.argsort(torch.rand(n, steps, n_rows, generator=g), dim=-1)[..., :b]
        rows = data[idx.reshape(-1)]
        s = sigma / 2 if variant == "sensitivity_2x" else sigma
        return _p.gaussian_projection_mechanism(rows, theta, s, RADIUS, generator=g,
                                                 secure_mode=False).reshape(n, steps * b)

    def llr(out):
        v = out.reshape(out.shape[0], steps, b)
        lse = torch.logsumexp(2 * RADIUS * v / sigma ** 2, dim=-1) + math.log(q / b)
        return torch.logaddexp(torch.full_like(lse, math.log1p(-q)), lse).sum(dim=1)

    return AuditSetup(mech, d0, d1, eps, DELTA, statistic=llr)
