"""Audit cases: every release of fastdpot with its worst-case neighbours, its claimed (ε, δ) and broken variants.

Each case builds an :class:`AuditSetup` for ``(backend, variant)``: a batched mechanism (n independent releases
per call, drawn from the caller's generator), two neighbouring inputs, and the (ε, δ) that fastdpot's own
calibration claims for that release. ``variant="correct"`` goes through the public API unchanged; the broken
variants are the negative controls the audit must catch:

* ``"sensitivity_2x"``: the noise is calibrated to half the true sensitivity (σ/2, or the Laplace scale of the
  ball's radius instead of its diameter -- the slip of the locally private paper);
* ``"truncated"``: noise from a normal (Laplace) cut at ``TRUNCATION`` = 3 standard deviations (scales). A cut only
  matters where it removes mass: the output on D′ lands beyond everything D can produce with probability P(Z > c −
  μ) (μ = Δ/σ); when that exceeds δ the claim is false, and the audit sees it with a threshold just past the largest
  output of D (zero false positives on D's half, a positive rate on D′'s). At c = 3 and μ ≈ 0.5–0.7 the mass is 6e-3
  to 1e-2 ≫ δ = 1e-3, so 1e5 releases catch it; ``tl.randn``'s clamp (c = 5.7) or a 32-bit Box–Muller (c ≈ 6.7)
  leave ≈ 1e-7 or less: they add that much to δ, far below what a sampling audit can resolve. (``flow_step`` and
  the sanitisers clamp their own normals at 3σ instead of cutting: the same support argument);
* ``"no_clip"``: the norm bound is not enforced (rows / gradients are not clipped or projected).

The audited APIs run with ``secure_mode=False`` and the audit's own seeded generator, so that an audit is
repeatable; their noise then has the same law as in the default secure mode (the same float64 wide-tail normals),
only its source differs.

Every case puts its neighbours *outside* the declared ball (3× the radius / clipping norm), so the correct variant
also checks that clipping happens inside the mechanism. Adding a mechanism is one entry of :data:`CASES` (the local
and gradient releases' builders are in :mod:`fastdpot.audit.local_cases`, the one-shot release's (the class sketch
and the class means) in :mod:`fastdpot.audit.release_cases`; the shared types and geometry in
``fastdpot/audit/_common.py``).

Claims use δ = 1e-3 (Gaussian releases): an audit with n releases per input resolves rates down to ~1/n, and the
lower bound can only exceed ε when the distinguishing event has probability well above δ.
"""
from __future__ import annotations

from typing import Dict

import torch

from .. import privacy as _p
from .._random import draw_seed
from ._common import (_F64, _OUT, DELTA, EPSILON, RADIUS, VARIANTS, AuditCase, AuditSetup, _check_variant,
                      _chunked, _device, _projection_geometry, _sigma_for)
from ._noise import TRUNCATION, truncated_normal
from .local_cases import composition, gaussian_local, laplace_local, sanitizer
from .release_cases import class_means, class_sketch

__all__ = ["AuditSetup", "AuditCase", "CASES", "VARIANTS", "EPSILON", "DELTA", "RADIUS"]


# ---------------------------------------------------------------------------------------------------------- cases
def _gaussian_projection(backend: str, variant: str) -> AuditSetup:
    """Gaussian projection mechanism ``clip(X)Θᵀ + V`` (Rakotomamonjy & Ralaivola, ICML 2021, §4), one row.

    Worst case: with Θ fixed, the change of the release is ``Θ(x − x′)``, largest for x − x′ along the top right
    singular vector v₁ of Θ; under clipping to R the largest difference is x = −R v₁, x′ = R v₁ (‖Θ(x − x′)‖ =
    2R s₁(Θ)); Θ is the worst draw the claim covers (:func:`_projection_geometry`). Claim:
    :func:`fastdpot.privacy.projection_mechanism_epsilon` at ``diameter = 2R``, k = 2, d = 3.
    """
    _check_variant(variant, VARIANTS)
    k, d = 2, 3
    theta, x, x2 = _projection_geometry()
    sigma = _sigma_for(EPSILON, lambda s: _p.projection_mechanism_epsilon(s, k, d, DELTA, 2 * RADIUS)[0])

    def mech(data, g, n):
        rows = data.expand(n, d)
        if variant == "truncated":
            return _p.clip_rows(rows, RADIUS) @ theta.t() + sigma * truncated_normal((n, k), g)
        s = sigma / 2 if variant == "sensitivity_2x" else sigma
        r = 1e6 if variant == "no_clip" else RADIUS
        return _p.gaussian_projection_mechanism(rows, theta, s, r, generator=g, secure_mode=False)

    return AuditSetup(mech, x, x2, EPSILON, DELTA)


def _random_theta(backend: str, variant: str) -> AuditSetup:
    """The Gaussian projection mechanism with Θ drawn AT RANDOM for every release (k = 2 directions in d = 3,
    i.i.d. uniform, :func:`fastdpot.random_projections`), as the flows and the DP-SW loss draw them: the claim's
    sensitivity bound ``2R·sqrt(w(k, δ/2))`` holds only with probability 1 − δ/2 over Θ, and this case is where that
    tail bound is exercised (the fixed-Θ cases audit one good draw).

    The release is published with its directions (an auditor who knows Θ is stronger than one who does not), and
    the statistic is the exact log-likelihood ratio given Θ, ``(‖o − Θx‖² − ‖o − Θx′‖²)/(2σ²)``, the most powerful
    test of x against x′ for every Θ (Neyman–Pearson). Neighbours: x = −R e₁, x′ = R e₁ (given at ∓3R: clipped
    inside). Claim: :func:`fastdpot.privacy.projection_mechanism_epsilon`, k = 2, d = 3, on the mixture over Θ.
    Broken variant: ``"no_clip"`` (caught: ε ≥ 3.1 at 400 000 trials). What this case cannot see: over random Θ the
    privacy loss is that of ‖Θ(x − x′)‖, usually far below the bound (E‖Θv‖² = k/d), so σ/2 or a σ calibrated to
    the mean k/d instead of the tail bound give only ε ≥ 1.8 and 1.5 at 400 000 trials, inside the claim of 2: the
    fixed worst Θ (``gaussian_projection``) is what resolves a 2× sensitivity.
    """
    _check_variant(variant, ("correct", "no_clip"))
    from .._random import random_projections

    k, d = 2, 3
    x = torch.zeros(1, d, dtype=_F64)
    x[0, 0] = -_OUT * RADIUS
    x2 = -x
    sigma = _sigma_for(EPSILON, lambda s: _p.projection_mechanism_epsilon(s, k, d, DELTA, 2 * RADIUS)[0])
    r = 1e6 if variant == "no_clip" else RADIUS
    xc, x2c = _p.clip_rows(x, r)[0], _p.clip_rows(x2, r)[0]  # what the auditor knows the rows become

    def mech(data, g, n):
        theta = random_projections(n * k, d, g).reshape(n, k, d)
        rows = data.expand(n, d)
        out = torch.einsum("nkd,nd->nk", theta, rows if variant == "no_clip" else _p.clip_rows(rows, RADIUS))
        out = out + sigma * _p.PrivacyRandomness(False, g).normal((n, k))
        return torch.cat([theta.reshape(n, k * d), out], dim=1)

    def llr(o):
        theta, out = o[:, : k * d].reshape(-1, k, d), o[:, k * d:]
        a = out - torch.einsum("nkd,d->nk", theta, xc)
        b = out - torch.einsum("nkd,d->nk", theta, x2c)
        return ((a * a).sum(1) - (b * b).sum(1)) / (2 * sigma ** 2)

    return AuditSetup(mech, x, x2, EPSILON, DELTA, statistic=llr)


def _flow_step(backend: str, variant: str) -> AuditSetup:
    """One flow step's private release, the noisy projections ``clip(y)Θᵀ + V`` of DPSWflow-r (Sebag et al.,
    TMLR), through :func:`fastdpot.ops.flow_step` on ``backend``.

    The release is read back with ``return_noise=True`` (the exact draws of the kernel, which the replay tests
    show are the ones its update uses); each of the n private rows is an independent one-row release. Rows are
    clipped as :class:`fastdpot.flows.DPSlicedWassersteinFlow` does before the step (flow_step itself releases and
    clips nothing). Worst case and claim as for the Gaussian projection mechanism.
    """
    _check_variant(variant, VARIANTS)
    from ..ops import flow_step

    k, d = 2, 3
    theta, x, x2 = _projection_geometry()
    sigma = _sigma_for(EPSILON, lambda s: _p.projection_mechanism_epsilon(s, k, d, DELTA, 2 * RADIUS)[0])
    dtype = _F64 if backend == "reference" else torch.float32
    dev = _device(backend)
    particles = torch.tensor([[0.5, -0.25, 0.0], [-0.5, 0.25, 0.125]], dtype=dtype, device=dev)
    chunk = 1024 if backend == "triton" and dev == "cpu" else 1 << 16

    def mech(data, g, n):
        def one(m):
            rows = data.expand(m, d)
            rows = rows if variant == "no_clip" else _p.clip_rows(rows, RADIUS)
            rows = rows.to(dtype)
            s = sigma / 2 if variant == "sensitivity_2x" else sigma
            _, _, noise = flow_step(particles, rows.to(dev), theta.to(dev, dtype), noise_std=s, step_size=0.5,
                                    seed=draw_seed(g), return_noise=True, backend=backend)
            v = noise["private"].double().cpu()
            if variant == "truncated":   # the kernel's normals clamped at 3σ (a clamp like tl.randn's, but visible)
                v = v.clamp(-TRUNCATION * s, TRUNCATION * s)
            return rows.double() @ theta.t() + v
        return _chunked(one, n, chunk)

    return AuditSetup(mech, x, x2, EPSILON, DELTA)


def _flow_step_particles(backend: str, variant: str) -> AuditSetup:
    """One flow step audited end to end through the particles it releases (no ``return_noise``).

    With one private row y the target quantile of every particle on direction j is the single noisy value
    ``θ_jᵀy + v_j``, so the mean of the N updated particles is ``x̄ − (h/k) Θᵀ(Θx̄ + ū − Θy − v)`` (ū: the mean particle
    noise, variance σ²/N). Since ΘΘᵀ is invertible, ``Θy + v − ū = Θx̄ − (k/h)(ΘΘᵀ)⁻¹Θ(x̄ − x̄_new)`` is read from the
    released particles (post-processing): the private release plus a small extra noise ū (N = 64), through
    whatever noise the kernel's update really used. One release per call (≈ 0.3 ms on the C++ backend, so only
    that one is listed; the reference and the Triton interpreter are much slower); worst case and claim as for
    :func:`_flow_step`.
    """
    _check_variant(variant, ("correct", "sensitivity_2x", "no_clip"))
    from ..ops import flow_step

    k, d, n_part, h = 2, 3, 64, 0.5
    theta, x, x2 = _projection_geometry()
    sigma = _sigma_for(EPSILON, lambda s: _p.projection_mechanism_epsilon(s, k, d, DELTA, 2 * RADIUS)[0])
    dtype = _F64 if backend == "reference" else torch.float32
    dev = _device(backend)
    particles = torch.randn(n_part, d, generator=torch.Generator().manual_seed(3), dtype=_F64)
    xbar = particles.mean(0)
    solve = torch.linalg.solve(theta @ theta.t(), theta)           # (ΘΘᵀ)⁻¹Θ
    part, th = particles.to(dev, dtype), theta.to(dev, dtype)

    def mech(data, g, n):
        rows = data if variant == "no_clip" else _p.clip_rows(data, RADIUS)
        rows = rows.to(dev, dtype)
        s = sigma / 2 if variant == "sensitivity_2x" else sigma
        out = torch.empty(n, k, dtype=_F64)
        for i in range(n):
            new, _, _ = flow_step(part, rows, th, noise_std=s, step_size=h, seed=draw_seed(g), backend=backend)
            out[i] = theta @ xbar - (k / h) * (solve @ (xbar - new.double().cpu().mean(0)))
        return out

    return AuditSetup(mech, x, x2, EPSILON, DELTA)


def _dpswd_private_side(backend: str, variant: str) -> AuditSetup:
    """The DP-SWD loss's private-side release ``clip(x)θᵀ + v`` (Rakotomamonjy & Ralaivola, ICML 2021), read
    end to end from the gradient of :func:`fastdpot.sliced.dp_sliced_wasserstein` (p = 2, ``clip_radius`` = R: the
    function clips inside).

    With k = 1 direction, M = N rows and p = 2 the loss is ``(1/N) Σ_r (xs_(r) − ys_(r))²`` over the sorted noisy
    projections, so ``∂/∂y_i = (2/N)(yp_i − xs_(rank yp_i)) θ``: the sorted private releases are
    ``xs_(r) = yp_i − (N/2) θ·∂/∂y_i``, with the public side's noisy projections yp known from ``return_noise``
    (revealing public-side noise only helps the auditor). The n private rows are n i.i.d. one-row releases whose
    sorted values are shuffled back into i.i.d. order. Worst case: x = −Rθ, x′ = Rθ. Claim:
    :func:`fastdpot.privacy.projection_mechanism_epsilon` with k = 1 (its sensitivity bound is the exact 2R).
    """
    _check_variant(variant, ("correct", "sensitivity_2x", "no_clip"))
    from ..sliced import dp_sliced_wasserstein

    k, d = 1, 2
    theta = torch.tensor([[0.6, 0.8]], dtype=_F64)
    x, x2 = -_OUT * RADIUS * theta, _OUT * RADIUS * theta
    sigma = _sigma_for(EPSILON, lambda s: _p.projection_mechanism_epsilon(s, k, d, DELTA, 2 * RADIUS)[0])
    dev = _device(backend)
    chunk = 2048 if backend == "triton" and dev == "cpu" else 1 << 15

    def mech(data, g, n):
        def one(m):
            rows = data.expand(m, d).clone().to(dev)
            y = torch.zeros(m, d, dtype=_F64, device=dev, requires_grad=True)
            s = sigma / 2 if variant == "sensitivity_2x" else sigma
            loss, _, noise_y = dp_sliced_wasserstein(y, private=rows, noise_std=s, p=2, projections=theta.to(dev),
                                                     generator=g,
                                                     secure_mode=False, backend=backend, return_noise=True,
                                                     clip_radius=1e6 if variant == "no_clip" else RADIUS)
            (grad,) = torch.autograd.grad(loss, y)
            grad, noise_y = grad.cpu(), noise_y.cpu()
            yp = (torch.zeros(m, d, dtype=_F64) @ theta.t() + noise_y.double()).squeeze(1)
            xs = yp - 0.5 * m * (grad.double() @ theta.t()).squeeze(1)   # xs_(rank of yp_i)
            return xs[torch.randperm(m, generator=g)].unsqueeze(1)   # the same values in i.i.d. order
        return _chunked(one, n, chunk)

    return AuditSetup(mech, x, x2, EPSILON, DELTA)


def _sketch(sketch_bins: int):
    """Audit case of the sliced quantile sketch with L = ``sketch_bins`` bins of a batch of B = 3 rows."""
    return lambda backend, variant: _sketch_case(backend, variant, sketch_bins)


def _sketch_case(backend: str, variant: str, sketch_bins: int) -> AuditSetup:
    """The sliced quantile sketch of a batch (:func:`fastdpot.privacy.sliced_quantile_sketch`): k·L noisy bin sums.

    Worst case: an extreme sorted rank. The batch holds B = 3 rows, two fixed at the origin; the third is
    x = −R·v₁ in D (the lowest projected value along both directions, since θ_jᵀv₁ > 0) and x′ = +R·v₁ in D′ (the
    highest), with v₁ the top right singular vector of the worst covered Θ (:func:`_projection_geometry`): the row
    that crosses every rank of every direction, moving the most mass between bins. With L = B every rank is its own
    bin: the change (a_j, 0, a_j) per direction has ℓ2 norm ‖Θ(x − x′)‖/√2, below the bound, so a 2× understated
    sensitivity is not visible there; with L = 1 the bin sum moves by exactly θ_jᵀ(x − x′), the bound is attained,
    and every negative control is caught. The claim is that of the per-point release at the same σ (the sketch's
    bin sums move by at most ‖Θ(x − x′)‖, the mechanism's docstring). The n releases of one call are n blocks of the same Θ stacked as n·k
    directions (every (direction, bin) gets its own noise draw), read back as bin sums (means × sizes).
    """
    _check_variant(variant, VARIANTS)
    k, d, b, L = 2, 3, 3, sketch_bins
    theta, x, x2 = _projection_geometry()
    sigma = _sigma_for(EPSILON, lambda s: _p.projection_mechanism_epsilon(s, k, d, DELTA, 2 * RADIUS)[0])
    others = torch.zeros(b - 1, d, dtype=_F64)

    def mech(data, g, n):
        rows = torch.cat([others, data])
        th = theta.repeat(n, 1)
        if variant == "truncated":
            sk = _p.sliced_quantile_sketch(rows, th, L, 0.0, clip_radius=RADIUS)
            sums = sk.means * sk.sizes.double() + sigma * truncated_normal(sk.means.shape, g)
        else:
            s = sigma / 2 if variant == "sensitivity_2x" else sigma
            r = 1e6 if variant == "no_clip" else RADIUS
            sk = _p.sliced_quantile_sketch(rows, th, L, s, clip_radius=r, generator=g, secure_mode=False)
            sums = sk.means * sk.sizes.double()
        return sums.reshape(n, k * L)

    return AuditSetup(mech, x, x2, EPSILON, DELTA)


_ALL = ("reference",)
_KERNELS = ("reference", "cpu", "triton")
CASES: Dict[str, AuditCase] = {c.name: c for c in (
    AuditCase("gaussian_projection", _gaussian_projection, _ALL, VARIANTS, 400_000),
    AuditCase("random_theta", _random_theta, _ALL, ("correct", "no_clip"), 400_000),
    AuditCase("sketch_ranks", _sketch(3), _ALL, ("correct", "truncated", "no_clip"), 400_000),
    AuditCase("sketch_one_bin", _sketch(1), _ALL, VARIANTS, 400_000),
    AuditCase("flow_step", _flow_step, _KERNELS, VARIANTS, 400_000,
              (("triton", 8192),)),
    AuditCase("flow_step_particles", _flow_step_particles, ("cpu",), ("correct", "sensitivity_2x", "no_clip"),
              60_000),
    AuditCase("dpswd_private", _dpswd_private_side, _KERNELS, ("correct", "sensitivity_2x", "no_clip"), 100_000,
              (("triton", 8192),)),
    AuditCase("sanitizer_joint", sanitizer("joint"), _ALL, VARIANTS, 40_000),
    AuditCase("sanitizer_per_sample", sanitizer("per_sample"), _ALL, VARIANTS, 40_000),
    AuditCase("laplace_local", laplace_local, _ALL, VARIANTS, 200_000),
    AuditCase("gaussian_local", gaussian_local, _ALL, VARIANTS, 200_000),
    AuditCase("composition", composition, _ALL, ("correct", "sensitivity_2x", "no_sampling"), 200_000),
    AuditCase("class_sketch", class_sketch, _ALL, VARIANTS, 100_000),
    AuditCase("class_means", class_means, _ALL, VARIANTS, 400_000),
)}
