"""Mechanisms: clipping / normalisation / ℓ1 projection, the Gaussian projection mechanism, local mechanisms."""
import math

import pytest
import torch
from dp_accounting import get_epsilon_gaussian
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fastdpot.privacy import (clip_rows, gaussian_local_mechanism, gaussian_mechanism_sigma,
                              gaussian_projection_mechanism, laplace_local_mechanism, ldp_gaussian_sigma,
                              make_generator, normalize_rows, project_l1_ball)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _data(n=37, d=5, scale=3.0, seed=0, dtype=torch.float64):
    return scale * torch.randn(n, d, generator=_gen(seed), dtype=dtype)


# ---------------------------------------------------------------- geometry
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-14), (torch.float32, 4e-7)])
def test_clip_rows(dtype, tol):
    x = _data().to(dtype)
    r = 6.0
    y = clip_rows(x, r)
    nx, ny = x.double().norm(dim=1), y.double().norm(dim=1)
    inside = nx <= r
    assert inside.any() and (~inside).any()
    assert torch.equal(y[inside], x[inside])  # untouched
    assert torch.all(ny <= r * (1 + tol))
    assert torch.allclose(ny[~inside], torch.full_like(ny[~inside], r), rtol=tol, atol=0)
    cos = (x.double()[~inside] * y.double()[~inside]).sum(1) / (nx[~inside] * ny[~inside])
    assert torch.allclose(cos, torch.ones_like(cos), atol=10 * tol)  # same direction


def test_normalize_rows_and_zero_row():
    x = _data()
    x[3] = 0.0
    y = normalize_rows(x)
    assert torch.allclose(y.norm(dim=1), torch.ones(len(x), dtype=x.dtype), atol=1e-14)
    assert torch.equal(y[3], torch.tensor([1.0, 0, 0, 0, 0], dtype=x.dtype))
    assert torch.allclose(y[0], x[0] / x[0].norm(), atol=1e-15)


def _l1_projection_by_bisection(v, r):
    """Independent projection onto the ℓ1 ball: bisection on the soft threshold τ."""
    if v.abs().sum() <= r:
        return v.clone()
    lo, hi = 0.0, float(v.abs().max())
    for _ in range(200):
        tau = (lo + hi) / 2
        if (v.abs() - tau).clamp(min=0).sum() > r:
            lo = tau
        else:
            hi = tau
    return torch.sign(v) * (v.abs() - hi).clamp(min=0)


@pytest.mark.parametrize("d", [1, 2, 7, 33])
def test_project_l1_ball_matches_bisection(d):
    x = _data(n=25, d=d, scale=2.0, seed=d)
    r = 3.0
    y = project_l1_ball(x, r)
    ref = torch.stack([_l1_projection_by_bisection(v, r) for v in x])
    assert torch.allclose(y, ref, atol=1e-12)
    assert torch.all(y.abs().sum(1) <= r * (1 + 1e-14))
    inside = x.abs().sum(1) <= r
    assert torch.equal(y[inside], x[inside])
    # nearest point of the ball: no random point of the ball is closer
    z = project_l1_ball(10 * torch.randn(500, d, generator=_gen(1), dtype=torch.float64), r)
    for i in range(len(x)):
        assert (x[i] - y[i]).norm() <= (x[i] - z).norm(dim=1).min() + 1e-12


# ---------------------------------------------------------------- Gaussian mechanism σ
@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0])
def test_gaussian_sigma_classic_for_eps_le_1(eps):
    assert gaussian_mechanism_sigma(eps, 1e-5, 2.0) == pytest.approx(
        math.sqrt(2 * math.log(1.25 / 1e-5)) * 2.0 / eps, rel=1e-12)


@pytest.mark.parametrize("eps", [0.3, 1.0, 2.0, 5.0, 10.0, 35.0])
@pytest.mark.parametrize("delta", [1e-2, 1e-5, 1e-8])
def test_gaussian_sigma_is_always_a_valid_guarantee(eps, delta):
    sigma = gaussian_mechanism_sigma(eps, delta, 1.0)
    assert get_epsilon_gaussian(sigma, delta) <= eps * (1 + 1e-9)  # exact analytic ε of that σ


def test_gaussian_sigma_classic_formula_is_not_valid_at_eps_10():
    classic = math.sqrt(2 * math.log(1.25 / 1e-5)) / 10.0
    assert get_epsilon_gaussian(classic, 1e-5) > 10.0  # why fastdpot does not return it there
    assert gaussian_mechanism_sigma(10.0, 1e-5, 1.0) > classic


@pytest.mark.parametrize("args,match", [((0.0, 1e-5, 1.0), "epsilon"), ((1.0, 0.0, 1.0), "delta"),
                                        ((1.0, 1e-5, 0.0), "sensitivity"), ((float("inf"), 1e-5, 1.0), "epsilon")])
def test_gaussian_sigma_validation(args, match):
    with pytest.raises(ValueError, match=match):
        gaussian_mechanism_sigma(*args)


# ---------------------------------------------------------------- local mechanisms
def test_ldp_gaussian_sigma_eq5_and_validity():
    for eps in (0.5, 1.0, 5.0, 35.0):
        for delta in (1e-2, 1e-4, 1e-6):
            c2 = math.log(2 / (math.sqrt(16 * delta + 1) - 1))
            expect = (math.sqrt(c2) + math.sqrt(c2 + eps)) / (eps * math.sqrt(2)) * 3.0
            sigma = ldp_gaussian_sigma(eps, delta, 3.0)
            assert sigma == pytest.approx(expect, rel=1e-12)
            assert get_epsilon_gaussian(sigma / 3.0, delta) <= eps  # eq. 5 is a valid (ε, δ) calibration
    with pytest.raises(ValueError, match="delta"):
        ldp_gaussian_sigma(1.0, 0.6, 1.0)


def test_gaussian_local_mechanism():
    x = _data(n=4000, d=3, scale=4.0)
    eps, delta, r = 5.0, 1e-4, 2.0
    y, sigma = gaussian_local_mechanism(x, eps, delta, r, secure_mode=False, generator=_gen(3))
    assert sigma == pytest.approx(ldp_gaussian_sigma(eps, delta, 2 * r), rel=1e-12)  # Δ = diameter 2r
    # the noise is added to the clipped data: replay the same draw on a zero input
    y0, _ = gaussian_local_mechanism(torch.zeros_like(x), eps, delta, r, secure_mode=False, generator=_gen(3))
    assert torch.allclose(y - y0, clip_rows(x, r), atol=1e-12)
    assert torch.all((y - y0).norm(dim=1) <= r * (1 + 1e-12))
    noise = (y0 / sigma).flatten().numpy()
    assert stats.kstest(noise, "norm").pvalue > 1e-3
    assert abs(noise.mean()) < 4 / math.sqrt(noise.size) and abs(noise.std() - 1) < 0.03
    assert not torch.equal(y0, gaussian_local_mechanism(torch.zeros_like(x), eps, delta, r, _gen(4),
                                                        secure_mode=False)[0])


def test_laplace_local_mechanism():
    x = _data(n=4000, d=3, scale=4.0)
    eps, r = 2.0, 1.5
    y, scale = laplace_local_mechanism(x, eps, r, secure_mode=False, generator=_gen(5))
    assert scale == pytest.approx(2 * r / eps, rel=1e-15)  # ℓ1 diameter of the ball over ε
    y0, _ = laplace_local_mechanism(torch.zeros_like(x), eps, r, secure_mode=False, generator=_gen(5))
    assert torch.allclose(y - y0, project_l1_ball(x, r), atol=1e-12)
    assert torch.all((y - y0).abs().sum(1) <= r * (1 + 1e-12))
    noise = (y0 / scale).flatten().numpy()
    assert stats.kstest(noise, "laplace").pvalue > 1e-3
    assert abs(noise.mean()) < 5 * math.sqrt(2 / noise.size) and abs(noise.var() - 2) < 0.1
    assert abs(float(abs(noise).mean()) - 1) < 0.03  # E|L| = b


def test_laplace_privacy_loss_is_exactly_epsilon_for_worst_pair():
    """log p(y|x) − log p(y|x') <= ε for the farthest pair of the ball, with equality: the scale uses 2r."""
    eps, r, d = 1.0, 1.0, 2
    _, b = laplace_local_mechanism(torch.zeros(1, d, dtype=torch.float64), eps, r, secure_mode=False, generator=_gen(0))
    x, xp = torch.tensor([r, 0.0]), torch.tensor([-r, 0.0])
    grid = torch.linspace(-4, 4, 801)
    ys = torch.stack(torch.meshgrid(grid, grid, indexing="ij"), -1).reshape(-1, d)
    loss = ((ys - xp).abs().sum(1) - (ys - x).abs().sum(1)) / b
    assert float(loss.max()) == pytest.approx(eps, rel=1e-6)


@pytest.mark.parametrize("call,match", [
    (lambda x: laplace_local_mechanism(x, 0.0, 1.0), "epsilon"),
    (lambda x: laplace_local_mechanism(x, 1.0, -1.0), "clip_radius"),
    (lambda x: laplace_local_mechanism(x[0], 1.0, 1.0), "x"),
    (lambda x: gaussian_local_mechanism(x, 1.0, 0.0, 1.0), "delta"),
    (lambda x: gaussian_local_mechanism(x, 1.0, 1e-5, 0.0), "clip_radius"),
    (lambda x: gaussian_local_mechanism(x.clone().fill_(float("nan")), 1.0, 1e-5, 1.0), "x"),
    (lambda x: gaussian_local_mechanism(x, 1.0, 1e-5, 1.0, secure_mode=False, generator=3), "generator"),
    (lambda x: clip_rows(x, 0.0), "clip_radius"),
    (lambda x: project_l1_ball(x.long(), 1.0), "x"),
])
def test_local_mechanism_validation(call, match):
    with pytest.raises(ValueError, match=match):
        call(_data(n=5, d=3))


# ---------------------------------------------------------------- Gaussian projection mechanism
def _theta(k, d, seed, dtype=torch.float64):
    th = torch.randn(k, d, generator=_gen(seed), dtype=dtype)
    return th / th.norm(dim=1, keepdim=True)


@pytest.mark.parametrize("normalize", [False, True])
def test_projection_mechanism_enforces_geometry(normalize):
    x, th, r, sigma = _data(n=31, d=6), _theta(11, 6, 1), 1.3, 0.7
    out = gaussian_projection_mechanism(x, th, sigma, r, normalize=normalize, secure_mode=False, generator=_gen(9))
    noise_only = gaussian_projection_mechanism(torch.zeros_like(x), th, sigma, r, secure_mode=False, generator=_gen(9))
    xr = r * x / x.norm(dim=1, keepdim=True) if normalize else clip_rows(x, r)
    assert out.shape == (31, 11)
    assert torch.allclose(out - noise_only, xr @ th.T, atol=1e-12)
    if not normalize:  # a zero row stays zero when clipping
        assert torch.allclose(noise_only, gaussian_projection_mechanism(torch.zeros_like(x), th, sigma, r,
                                                                        secure_mode=False, generator=_gen(9)))


def test_projection_mechanism_noise_statistics_and_replay():
    x, th, sigma = torch.zeros(2000, 4, dtype=torch.float64), _theta(9, 4, 2), 0.35
    out = gaussian_projection_mechanism(x, th, sigma, 1.0, secure_mode=False, generator=_gen(11))
    z = (out / sigma).flatten().numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-3 and abs(z.std() - 1) < 0.02
    assert torch.equal(out, gaussian_projection_mechanism(x, th, sigma, 1.0, secure_mode=False, generator=_gen(11)))
    assert not torch.equal(out, gaussian_projection_mechanism(x, th, sigma, 1.0, secure_mode=False, generator=_gen(12)))


def test_projection_mechanism_float32_and_gradient_to_directions():
    x = _data(n=20, d=5, dtype=torch.float32)
    th = _theta(7, 5, 3, dtype=torch.float32).requires_grad_(True)
    out = gaussian_projection_mechanism(x, th, 0.5, 2.0, secure_mode=False, generator=_gen(1))
    assert out.dtype == torch.float32
    out.sum().backward()
    assert torch.allclose(th.grad, clip_rows(x, 2.0).sum(0).expand(7, 5), atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(projections=2 * _theta(4, 5, 0)), "unit-norm"),
    (dict(projections=_theta(4, 6, 0)), "projections"),
    (dict(noise_std=0.0), "noise_std"),
    (dict(clip_radius=float("inf")), "clip_radius"),
    (dict(normalize=1), "normalize"),
    (dict(x_private=torch.ones(3, 5, dtype=torch.int64)), "x_private"),
])
def test_projection_mechanism_validation(kwargs, match):
    args = dict(x_private=_data(n=6, d=5), projections=_theta(4, 5, 0), noise_std=1.0, clip_radius=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        gaussian_projection_mechanism(**args)


# ---------------------------------------------------------------- secure mode
def test_secure_mode_generators():
    a, b = make_generator(secure_mode=True), make_generator(secure_mode=True)
    assert a.initial_seed() != b.initial_seed()
    with pytest.raises(ValueError, match="seed"):
        make_generator(3, secure_mode=True)
    g1, g2 = make_generator(5), make_generator(5)
    assert torch.equal(torch.randn(4, generator=g1), torch.randn(4, generator=g2))


# ---------------------------------------------------------------- properties over shapes and scales
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), d=st.integers(1, 17), scale=st.floats(1e-3, 1e3), radius=st.floats(1e-2, 1e2),
       seed=st.integers(0, 2 ** 31))
def test_geometry_properties(n, d, scale, radius, seed):
    x = scale * torch.randn(n, d, generator=_gen(seed), dtype=torch.float64)
    c, p = clip_rows(x, radius), project_l1_ball(x, radius)
    assert torch.all(c.norm(dim=1) <= radius * (1 + 1e-12))
    assert torch.all(p.abs().sum(1) <= radius * (1 + 1e-12))
    # idempotent, and the identity inside the ball
    assert torch.allclose(clip_rows(c, radius), c, rtol=1e-12, atol=0)
    assert torch.allclose(project_l1_ball(p, radius), p, rtol=1e-12, atol=1e-300)
    # ℓ1 projection keeps signs and shrinks magnitudes
    assert torch.all(p * x >= 0) and torch.all(p.abs() <= x.abs() * (1 + 1e-12))
    assert torch.allclose(normalize_rows(x).norm(dim=1), torch.ones(n, dtype=x.dtype), atol=1e-14)
