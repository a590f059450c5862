"""Audit cases of the one-shot release (labels private): the class sketch
(:func:`fastdpot.privacy.class_sketch.class_quantile_sketch`) and the class means
(:func:`fastdpot.privacy.moments.release_class_means`), each a Gaussian mechanism on the whole data set.

Neighbours replace one labelled record (x, y) by (x′, y′) with y′ ≠ y: the record leaves one class and joins
another, the largest change both sensitivity proofs allow for. The claim is what fastdpot states for one such
release: the noise multiplier z that :func:`fastdpot.privacy.class_sketch.release_class_sketch` calibrates to
(ε, δ) = (``EPSILON``, ``DELTA``) (PLD, one Gaussian), so the release is claimed (ε, δ)-DP. The variants and their
meaning are those of :mod:`fastdpot.audit.cases` (``sensitivity_2x``: z/2; ``truncated``: the noise cut at 3σ;
``no_clip``: the rows not clipped, at the claimed σ), which lists both in :data:`~fastdpot.audit.cases.CASES`.

n independent releases per call, through the public API with ``secure_mode=False`` and the audit's generator:

* the sketch's sums depend on a direction block only through that block's projections, and its noise is drawn per
  (class, direction, bin): n copies of the one block Θ stacked as n blocks give n independent releases of the sums
  in one call, with the noise multiplier scaled so that σ is that of the one-block release
  (z·Δ(B = 1) / Δ(B = n): :func:`~fastdpot.privacy.class_sketch.class_sketch_sensitivity` grows with B). The counts
  are drawn once per call, so the audited output is the n releases' bin sums: a post-processing of each release,
  whose lower bound can only be lower than the whole release's. The sketch visits its blocks one at a time (about
  0.2 ms a block on one core), hence the case's 10⁵ releases by default;
* the means' sensitivity does not depend on the number of classes C: n releases of C classes each are one release of
  n·C classes, trial t's records in classes t·C … t·C + C − 1. The release is read back as the raw Gaussian outputs
  (w·ñ_c, S̃_c), which the published means and counts determine: S̃_c = (mean_c − centre)·max(ñ_c, 1).
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

from ..privacy.calibration import calibrate_noise_multiplier
from ..privacy.class_sketch import class_quantile_sketch, class_sketch_sensitivity
from ..privacy.moments import release_class_means
from ._common import _F64, _OUT, DELTA, EPSILON, RADIUS, VARIANTS, AuditSetup, _chunked, _check_variant
from ._noise import truncated_normal

__all__ = ["class_sketch", "class_means"]

_CHUNK = 1 << 12  # releases per call


@lru_cache(maxsize=None)
def _claimed_z() -> float:
    """z of one full-batch Gaussian release at (EPSILON, DELTA), as ``release_class_sketch`` calibrates it."""
    return float(calibrate_noise_multiplier(EPSILON, DELTA, 1.0, 1, accountant="pld", progress=False))


def class_sketch(backend: str, variant: str) -> AuditSetup:
    """The one-shot class sketch: C = 2 classes, one block Θ of p = d = 2 orthonormal directions, L = 8 bins.

    Worst case: 8 rows of each class at −R·θ₁ (given at −3R·θ₁: clipped inside), and the record that changes class
    at +R·θ₁ (given at +3R·θ₁): in D it is the top row of class 0, in D′ of class 1, so it crosses every rank bin of
    θ₁ in both classes (at least L rows a class: no fractional bin). The bin sums then move by
    √(2((L − 1)/L² + (2 − 1/L)²))·R = 0.96·Δ (Δ = :func:`fastdpot.privacy.class_sketch.class_sketch_sensitivity`
    with r = R, B = 1, L = 8, w = R/4: √(2β_L + 2w²)·R, β_L = 2 + 2√(1 − 1/L); the ratio tends to 1 as L grows,
    0.98 at L = 16). Statistic: the exact log-likelihood ratio ⟨o, μ′ − μ⟩ of the Gaussian
    sums (μ, μ′ the noise-free sums of D and D′ at the variant's clipping), the most powerful test; the
    ``truncated`` variant keeps the audit's own statistics (its ``tail`` test sees the cut).
    """
    _check_variant(variant, VARIANTS)
    m, bins, w = 8, 8, RADIUS / 4.0
    theta = torch.tensor([[0.6, 0.8], [-0.8, 0.6]], dtype=_F64)
    u = theta[0]
    rows = torch.cat([(-_OUT * RADIUS) * u.expand(2 * m, 2), (_OUT * RADIUS) * u[None]])
    labels = torch.tensor([0] * m + [1] * m + [0], dtype=torch.int64)
    moved = labels.clone()
    moved[-1] = 1
    z = _claimed_z()
    sens = class_sketch_sensitivity(RADIUS, 1, bins, w)

    def mech(lab, g, n):
        def one(t):
            th = theta.repeat(t, 1)  # t blocks: t independent releases of the sums
            r = 1e6 if variant == "no_clip" else RADIUS
            if variant == "truncated":
                rel = class_quantile_sketch(rows, lab, th, num_classes=2, sketch_bins=bins, noise_multiplier=0.0,
                                               clip_radius=RADIUS, count_weight=w)
                sums = rel.sums + z * sens * truncated_normal(rel.sums.shape, g)
            else:
                zz = z / 2 if variant == "sensitivity_2x" else z
                zz = zz * sens / class_sketch_sensitivity(r, t, bins, w)  # σ of the one-block release
                sums = class_quantile_sketch(rows, lab, th, num_classes=2, sketch_bins=bins, noise_multiplier=zz,
                                                clip_radius=r, count_weight=w, generator=g, secure_mode=False).sums
            return sums.reshape(2, t, 2, bins).permute(1, 0, 2, 3).reshape(t, -1)
        return _chunked(one, n, _CHUNK)

    def exact(lab):
        return class_quantile_sketch(rows, lab, theta, num_classes=2, sketch_bins=bins, noise_multiplier=0.0,
                                     clip_radius=1e6 if variant == "no_clip" else RADIUS, count_weight=w).sums
    shift = (exact(moved) - exact(labels)).reshape(-1)
    llr = None if variant == "truncated" else (lambda o: o @ shift)
    return AuditSetup(mech, labels, moved, EPSILON, DELTA, statistic=llr)


def class_means(backend: str, variant: str) -> AuditSetup:
    """The one-shot release's class means: every class's (w·n_c, Σ(x − c)) with i.i.d. N(0, σ²), C = 2, d = 2,
    w = 1, r = R, c = 0.

    Worst case: the record x = R·e₁ (given at 3R·e₁: clipped inside) in class 0 in D and in class 1 in D′, beside one
    record at the centre in each class: class 0 moves by (−w, −x) and class 1 by (w, x), a change of
    √(2(w² + R²)) = Δ exactly (the bound of :func:`fastdpot.privacy.moments.release_class_means` is attained).
    """
    _check_variant(variant, VARIANTS)
    C, w = 2, 1.0
    base = torch.zeros(3, 2, dtype=_F64)
    base[2, 0] = _OUT * RADIUS
    labels = torch.tensor([0, 1, 0], dtype=torch.int64)
    moved = torch.tensor([0, 1, 1], dtype=torch.int64)
    z = _claimed_z()
    sigma = z * max(math.sqrt(2.0 * (w * w + RADIUS * RADIUS)), 2.0 * RADIUS)

    def mech(lab, g, n):
        def one(t):
            rows = base.repeat(t, 1)
            y = (lab[None, :] + C * torch.arange(t)[:, None]).reshape(-1)  # trial s: classes s·C, s·C + 1
            r = 1e6 if variant == "no_clip" else RADIUS
            if variant == "truncated":
                rel = release_class_means(rows, y, C * t, 0.0, clip_radius=RADIUS, count_weight=w)
            else:
                zz = z / 2 if variant == "sensitivity_2x" else z
                zz = zz * sigma / (z * max(math.sqrt(2.0 * (w * w + r * r)), 2.0 * r))  # the claimed σ at any r
                rel = release_class_means(rows, y, C * t, zz, clip_radius=r, count_weight=w, generator=g,
                                                     secure_mode=False)
            counts = rel["counts"]
            sums = rel["means"] * counts.clamp_min(1.0)[:, None]  # the centre is 0
            out = torch.cat([w * counts[:, None], sums], dim=1)  # (C·t, 1 + d): the raw Gaussian outputs
            if variant == "truncated":
                out = out + sigma * truncated_normal(out.shape, g)
            return out.reshape(t, -1)
        return _chunked(one, n, _CHUNK)

    return AuditSetup(mech, labels, moved, EPSILON, DELTA)
