"""Sensitivity of the random-direction projection (Monte Carlo over Θ), δ split, Proposition 2."""
import math

import numpy as np
import pytest
import torch
from scipy.stats import beta, norm

from fastdpot.privacy import (projection_mechanism_epsilon, sliced_sensitivity, sliced_sensitivity_sq,
                              split_delta)


def _directions(n, k, d, g):
    th = torch.randn(n, k, d, generator=g, dtype=torch.float64)
    return th / torch.linalg.vector_norm(th, dim=2, keepdim=True)


def _tail_samples(n, k, d, seed, diameter=1.0):
    """n draws of ‖(x − x')Θᵀ‖² for a fresh Θ (k, d) and a fresh pair with ‖x − x'‖ = diameter."""
    g = torch.Generator().manual_seed(seed)
    th = _directions(n, k, d, g)
    u = torch.randn(n, d, generator=g, dtype=torch.float64)
    u = diameter * u / torch.linalg.vector_norm(u, dim=1, keepdim=True)
    return (torch.einsum("nkd,nd->nk", th, u) ** 2).sum(1)


N_MC = 20000


@pytest.mark.parametrize("k,d", [(70, 8), (40, 3), (100, 16)])
def test_monte_carlo_tail_bernstein_below_delta_clt_close_to_delta(k, d):
    delta = 0.02
    s = _tail_samples(N_MC, k, d, seed=k * 100 + d)
    p_bern = float((s > sliced_sensitivity_sq(k, d, delta, "bernstein")).double().mean())
    p_clt = float((s > sliced_sensitivity_sq(k, d, delta, "clt")).double().mean())
    p_chern = float((s > sliced_sensitivity_sq(k, d, delta, "chernoff")).double().mean())
    # Bernstein and Chernoff are proven bounds: the empirical tail is below δ (the MC sd is ≈ 1e-3)
    assert p_bern <= delta and p_chern <= delta
    # CLT is an approximation: the tail is near δ (empirically 1.0-1.4 δ here: skewed sum), not guaranteed below
    assert 0.5 * delta <= p_clt <= 2.0 * delta
    # the test can fail: the mean alone (no deviation term) is exceeded about half of the time
    assert float((s > k / d).double().mean()) > 10 * delta


def test_monte_carlo_tail_scales_with_diameter():
    k, d, delta, diam = 50, 5, 0.05, 2.0
    s = _tail_samples(N_MC, k, d, seed=7, diameter=diam)
    delta_bound = sliced_sensitivity(k, d, delta, "bernstein", diameter=diam)
    assert float((s > delta_bound ** 2).double().mean()) <= delta
    clt = sliced_sensitivity(k, d, delta, "clt", diameter=diam)
    assert 0.5 * delta <= float((s > clt ** 2).double().mean()) <= 2.0 * delta


def _exact_tail_bracket(k, d, w, h=1e-3):
    """Lower and upper bounds on P(‖uΘᵀ‖² > w) for unit u: S = Σ_j B_j, B_j ~ Beta(1/2, (d−1)/2) i.i.d.

    The Beta law is discretised on a grid of step h with each bin's mass put at its left end (S_left <= S) or its
    right end (S_right >= S); the k-fold convolutions are exact up to FFT rounding. Independent of fastdpot.
    """
    n = int(round(1 / h))
    pm = np.diff(beta.cdf(np.linspace(0, 1, n + 1), 0.5, (d - 1) / 2))
    size = 1 << int(np.ceil(np.log2(k * (n + 1) + 2)))
    conv = lambda m: np.clip(np.fft.irfft(np.fft.rfft(m, size) ** k, size)[: k * n + 1], 0, None)
    s_left, s_right = conv(pm), conv(np.concatenate([[0.0], pm]))
    grid = np.arange(k * n + 1) * h
    return float(s_left[grid > w].sum()), float(s_right[grid > w].sum())


def test_exact_tail_at_small_delta_chernoff_and_bernstein_hold_clt_does_not():
    k, d, delta = 70, 8, 1e-6
    for bound in ("chernoff", "bernstein"):
        _, upper = _exact_tail_bracket(k, d, sliced_sensitivity_sq(k, d, delta, bound))
        assert upper <= delta, bound
    lower, _ = _exact_tail_bracket(k, d, sliced_sensitivity_sq(k, d, delta, "clt"))
    assert lower > 3 * delta  # the CLT "bound" is exceeded several times more often than δ at this level
    # and Chernoff costs little over CLT, much less than Bernstein
    w_clt, w_ch, w_be = (sliced_sensitivity_sq(k, d, delta, b) for b in ("clt", "chernoff", "bernstein"))
    assert w_clt < w_ch < 0.75 * w_be


def test_closed_forms():
    k, d, delta = 70, 8, 5e-6
    L = math.log(1 / delta)
    bern = k / d + 2 / 3 * L + 2 / d * math.sqrt(k * (d - 1) / (d + 2) * L)
    clt = k / d + norm.ppf(1 - delta) / d * math.sqrt(2 * k * (d - 1) / (d + 2))
    assert sliced_sensitivity_sq(k, d, delta, "bernstein") == pytest.approx(bern, rel=1e-12)
    assert sliced_sensitivity_sq(k, d, delta, "clt") == pytest.approx(clt, rel=1e-12)
    assert sliced_sensitivity(k, d, delta, "clt", diameter=2.0) == pytest.approx(2 * math.sqrt(clt), rel=1e-12)
    # the default is the proven Chernoff bound (fastdpot reports (ε, δ) as a guarantee)
    assert sliced_sensitivity(k, d, delta) == sliced_sensitivity(k, d, delta, "chernoff")
    # capped by the deterministic bound ‖uΘᵀ‖² <= k
    assert sliced_sensitivity_sq(3, 2, 1e-9, "bernstein") == 3.0
    assert sliced_sensitivity_sq(40, 1, 1e-5, "clt") == 40.0


def test_bound_monotone_in_delta_and_k():
    ws = [sliced_sensitivity_sq(70, 8, dl, "clt") for dl in (1e-2, 1e-4, 1e-6)]
    assert ws[0] < ws[1] < ws[2]
    assert sliced_sensitivity_sq(100, 8, 1e-5) > sliced_sensitivity_sq(70, 8, 1e-5)


@pytest.mark.parametrize("call,match", [
    (lambda: sliced_sensitivity(0, 8, 1e-5), "num_projections"),
    (lambda: sliced_sensitivity(70, 0, 1e-5), "dim"),
    (lambda: sliced_sensitivity(70, 8, 0.0), "delta"),
    (lambda: sliced_sensitivity(70, 8, 1.0), "delta"),
    (lambda: sliced_sensitivity(70, 8, 1e-5, bound="hoeffding"), "bound"),
    (lambda: sliced_sensitivity(70, 8, 1e-5, diameter=0.0), "diameter"),
    (lambda: sliced_sensitivity(10, 8, 1e-5, bound="clt"), "num_projections"),
    (lambda: sliced_sensitivity(70.5, 8, 1e-5), "num_projections"),
])
def test_sensitivity_validation(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_split_delta():
    acc, tail = split_delta(1e-5, 4199)
    assert acc == pytest.approx(5e-6) and tail == pytest.approx(5e-6 / 4199)
    assert acc + 4199 * tail == pytest.approx(1e-5, rel=1e-12)
    acc, tail = split_delta(1e-6, 10, tail_fraction=0.1)
    assert acc == pytest.approx(0.9e-6) and acc + 10 * tail == pytest.approx(1e-6, rel=1e-12)
    for args, match in [((0.0, 3), "delta"), ((1e-5, 0), "num_releases"), ((1e-5, 3, 1.0), "tail_fraction"),
                        ((1e-5, 3, 0.0), "tail_fraction")]:
        with pytest.raises(ValueError, match=match):
            split_delta(*args)


def test_projection_mechanism_epsilon_proposition_2():
    sigma, k, d, delta, diam = 3.0, 70, 8, 1e-5, 2.0
    w = sliced_sensitivity_sq(k, d, delta / 2, "clt")  # δ/2 for the tail ...
    f = lambda a: a * diam ** 2 * w / (2 * sigma ** 2) + math.log(2 / delta) / (a - 1)  # ... δ/2 for conversion
    grid = [1 + i / 1000 for i in range(1, 200000)]
    brute = min(f(a) for a in grid)
    eps, order = projection_mechanism_epsilon(sigma, k, d, delta, diameter=diam, bound="clt")
    assert eps == pytest.approx(brute, rel=1e-6)
    assert f(order) == pytest.approx(eps, rel=1e-12)
    eps_o, order_o = projection_mechanism_epsilon(sigma, k, d, delta, diameter=diam, bound="clt",
                                                   orders=[2, 4, 8, 16, 32])
    assert order_o in (2, 4, 8, 16, 32) and eps_o == pytest.approx(min(f(a) for a in (2, 4, 8, 16, 32)))
    assert eps_o >= eps
    # more noise, less ε; Bernstein (a proven bound) costs more than CLT
    assert projection_mechanism_epsilon(2 * sigma, k, d, delta, diam, bound="clt")[0] < eps
    assert projection_mechanism_epsilon(sigma, k, d, delta, diam, bound="bernstein")[0] > eps


@pytest.mark.parametrize("kwargs,match", [
    (dict(noise_std=0.0), "noise_std"), (dict(delta=2.0), "delta"), (dict(orders=[1.0, 2.0]), "orders"),
    (dict(orders=[]), "orders"), (dict(diameter=-1.0), "diameter"),
])
def test_projection_mechanism_epsilon_validation(kwargs, match):
    args = dict(noise_std=1.0, num_projections=70, dim=8, delta=1e-5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        projection_mechanism_epsilon(**args)


def test_orthogonal_sliced_sensitivity_is_deterministic_and_tight():
    from fastdpot._random import random_projections
    from fastdpot.privacy import orthogonal_sliced_sensitivity

    g = torch.Generator().manual_seed(3)
    for k, d in [(1, 5), (5, 5), (7, 5), (72, 8), (300, 48)]:
        blocks = -(-k // d)
        assert orthogonal_sliced_sensitivity(k, d, diameter=2.0) == pytest.approx(2 * math.sqrt(blocks), rel=1e-15)
        th = random_projections(k, d, g, orthogonal=True)
        top = float(torch.linalg.matrix_norm(th, 2)) ** 2  # max over unit u of ‖Θu‖²
        assert top <= blocks + 1e-9
        if k % d == 0:
            assert top == pytest.approx(blocks, rel=1e-9)  # attained: the bound is tight for full blocks
    with pytest.raises(ValueError):
        orthogonal_sliced_sensitivity(0, 3)
    with pytest.raises(ValueError):
        orthogonal_sliced_sensitivity(3, 3, diameter=0.0)
