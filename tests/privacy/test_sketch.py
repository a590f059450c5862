"""The sliced quantile sketch (fastdpot.privacy.sketch): bins, levels, noise replay, bad input, and its
sensitivity — the bin sums never move by more than the per-point release ‖Θ(x_i − x′_i)‖₂ — by Monte Carlo over
random and adversarial neighbouring batches."""
import math

import pytest
import torch

import fastdpot
from fastdpot._random import random_projections
from fastdpot.privacy import (bin_levels, bin_sizes, clip_rows, orthogonal_sliced_sensitivity,
                              sliced_quantile_sketch)
from fastdpot.privacy.sketch import bin_index


def _sums(x, th, L, radius=1.0):
    """Noiseless bin SUMS (k, L) of the sketch (means × sizes)."""
    sk = sliced_quantile_sketch(x, th, L, 0.0, clip_radius=radius)
    return sk.means * sk.sizes.double()


def test_bin_sizes_and_levels():
    assert bin_sizes(10, 3).tolist() == [4, 3, 3]
    assert bin_sizes(7, 7).tolist() == [1] * 7
    assert bin_sizes(5, 1).tolist() == [5]
    lv = bin_levels(bin_sizes(10, 3))  # ranks 0-3, 4-6, 7-9 over 9
    torch.testing.assert_close(lv, torch.tensor([1.5 / 9, 5 / 9, 8 / 9], dtype=torch.float64))
    torch.testing.assert_close(bin_levels(bin_sizes(5, 5)), torch.linspace(0, 1, 5, dtype=torch.float64))
    assert bin_levels(bin_sizes(1, 1)).tolist() == [0.5]
    assert bin_index(bin_sizes(5, 2)).tolist() == [0, 0, 0, 1, 1]
    for b, L in [(1, 2), (3, 4)]:
        with pytest.raises(ValueError, match="sketch_bins"):
            bin_sizes(b, L)


def test_sketch_is_binned_sorted_projections_and_noise_replays():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(23, 5, generator=g, dtype=torch.float64) * 0.3
    th = random_projections(7, 5, torch.Generator().manual_seed(1))
    sk = sliced_quantile_sketch(x, th, 4, 0.5, clip_radius=10.0, generator=torch.Generator().manual_seed(2),
                                return_noise=True, secure_mode=False)
    assert sk.means.shape == (7, 4) and sk.levels.shape == (4,) and sk.sizes.tolist() == [6, 6, 6, 5]
    s = torch.sort(x @ th.t(), dim=0).values.t()  # (k, B)
    sums = torch.stack([c.sum(1) for c in s.split(sk.sizes.tolist(), dim=1)], dim=1)
    torch.testing.assert_close(sk.means, (sums + sk.noise) / sk.sizes.double(), rtol=1e-12, atol=1e-12)
    again = sliced_quantile_sketch(x, th, 4, 0.5, clip_radius=10.0, generator=torch.Generator().manual_seed(2),
                                   secure_mode=False)
    assert torch.equal(again.means, sk.means) and again.noise is None
    # by default the noise is secret (OS randomness): two releases differ, and a generator is refused
    a, b = (sliced_quantile_sketch(x, th, 4, 0.5, clip_radius=10.0).means for _ in range(2))
    assert not torch.equal(a, b)
    with pytest.raises(ValueError, match="secure_mode=False"):
        sliced_quantile_sketch(x, th, 4, 0.5, generator=torch.Generator().manual_seed(2))
    # the noise is N(0, σ²) on the sums, drawn in float64
    big = sliced_quantile_sketch(x, th.repeat(300, 1), 4, 2.0, clip_radius=10.0, return_noise=True).noise
    assert big.dtype == torch.float64 and abs(big.std().item() - 2.0) < 0.1 and abs(big.mean().item()) < 0.1


def test_l1_is_the_mean_and_l_equal_b_the_sorted_values():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(9, 3, generator=g, dtype=torch.float64) * 0.2
    th = random_projections(4, 3, g)
    one = sliced_quantile_sketch(x, th, 1, 0.0)
    torch.testing.assert_close(one.means[:, 0], (x @ th.t()).mean(0))
    full = sliced_quantile_sketch(x, th, 9, 0.0)
    torch.testing.assert_close(full.means, torch.sort(x @ th.t(), dim=0).values.t())
    torch.testing.assert_close(full.levels, torch.linspace(0, 1, 9, dtype=torch.float64))


def test_rows_are_clipped_or_normalised_inside():
    x = torch.tensor([[3.0, 4.0], [0.3, 0.0]], dtype=torch.float64)
    th = torch.eye(2, dtype=torch.float64)
    clipped = sliced_quantile_sketch(x, th, 2, 0.0, clip_radius=1.0).means
    torch.testing.assert_close(clipped, torch.tensor([[0.3, 0.6], [0.0, 0.8]], dtype=torch.float64))
    normed = sliced_quantile_sketch(x, th, 2, 0.0, clip_radius=2.0, normalize=True).means
    torch.testing.assert_close(normed, torch.tensor([[1.2, 2.0], [0.0, 1.6]], dtype=torch.float64))


@pytest.mark.parametrize("bad, match", [
    (dict(sketch_bins=0), "sketch_bins"), (dict(sketch_bins=11), "sketch_bins"), (dict(sketch_bins=2.5), "sketch_bins"),
    (dict(noise_std=-1.0), "noise_std"), (dict(noise_std=float("nan")), "noise_std"),
    (dict(clip_radius=0.0), "clip_radius"), (dict(generator=0), "generator"), (dict(normalize=1), "normalize"),
    (dict(return_noise="no"), "return_noise must be a bool"),  # issue 40: read by truthiness before
])
def test_bad_arguments_name_themselves(bad, match):
    x = torch.randn(10, 3, dtype=torch.float64)
    th = random_projections(4, 3, torch.Generator().manual_seed(0))
    kw = dict(sketch_bins=2, noise_std=1.0, clip_radius=1.0)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        sliced_quantile_sketch(x, th, **kw)


def test_bad_tensors_are_refused():
    th = random_projections(4, 3, torch.Generator().manual_seed(0))
    x = torch.randn(10, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="x_private"):
        sliced_quantile_sketch(torch.full((10, 3), float("nan")), th, 2, 1.0)
    with pytest.raises(ValueError, match="x_private"):
        sliced_quantile_sketch(torch.empty(0, 3), th, 1, 1.0)
    with pytest.raises(ValueError, match="projections"):
        sliced_quantile_sketch(x, th[:, :2], 2, 1.0)
    with pytest.raises(ValueError, match="unit-norm"):
        sliced_quantile_sketch(x, 2 * th, 2, 1.0)
    with pytest.raises(TypeError, match="x_private"):
        sliced_quantile_sketch(x.numpy(), th, 2, 1.0)


# ------------------------------------------------------------------------------------------ sensitivity (Monte Carlo)
def _ratio(x, x2, i, th, L, radius):
    """‖sums(X) − sums(X′)‖₂ / ‖Θ(clip(x_i) − clip(x′_i))‖₂ for batches that differ in row i."""
    num = (_sums(x, th, L, radius) - _sums(x2, th, L, radius)).norm().item()
    den = (th @ (clip_rows(x[i:i + 1], radius) - clip_rows(x2[i:i + 1], radius)).t()).norm().item()
    return num, den


@pytest.mark.parametrize("b, L", [(1, 1), (2, 1), (7, 1), (7, 7), (10, 3), (25, 4), (64, 5), (100, 100)])
@pytest.mark.parametrize("orthogonal", [False, True])
def test_sensitivity_never_exceeds_the_per_point_release(b, L, orthogonal):
    d, k, radius = 4, 8, 0.7
    g = torch.Generator().manual_seed(100 * b + L + orthogonal)
    worst = 0.0
    for trial in range(60):
        th = random_projections(k, d, g, orthogonal=orthogonal)
        kind = trial % 4
        if kind == 3:  # ties: integer rows (many equal projections along the axis-free directions too)
            x = torch.randint(-1, 2, (b, d), generator=g).double() * 0.2
        else:
            x = torch.randn(b, d, generator=g, dtype=torch.float64) * (0.3 if kind else 2.0)  # some rows clipped
        x2 = x.clone()
        i = int(torch.randint(0, b, (1,), generator=g))
        if kind == 0:  # random replacement
            x2[i] = torch.randn(d, generator=g, dtype=torch.float64)
        elif kind == 1:  # adversarial: the top right-singular vector of Θ, at ±radius (maximises ‖Θ(x − x′)‖)
            v = torch.linalg.svd(th).Vh[0]
            x[i], x2[i] = radius * v, -radius * v
        elif kind == 2:  # extreme ranks: move the lowest value of direction 0 to far above the highest
            j = int(torch.argmin(x @ th[0]))
            i = j
            x2[j] = th[0] * radius
            x[j] = -th[0] * radius
        else:  # a tied row replaced by another tied value
            x2[i] = x[(i + 1) % b]
        num, den = _ratio(x, x2, i, th, L, radius)
        assert num <= den * (1 + 1e-12) + 1e-13, (trial, num, den)
        if orthogonal:  # and never above the flows' Δ for clipped rows
            assert num <= orthogonal_sliced_sensitivity(k, d, diameter=2 * radius) * (1 + 1e-12)
        if den > 0:
            worst = max(worst, num / den)
    assert worst <= 1 + 1e-12
    if L == 1 or b == 1:  # one bin: the sum moves by exactly θ_jᵀ(x_i − x′_i) per direction (equality)
        assert worst > 1 - 1e-9


def test_single_entry_change_moves_sorted_values_by_exactly_its_size():
    # the ℓ1 identity behind the proof: ‖sort(a′) − sort(a)‖₁ = |a_i − a′_i|, every order statistic moving one way
    g = torch.Generator().manual_seed(9)
    for _ in range(200):
        a = torch.randn(15, generator=g, dtype=torch.float64)
        a2 = a.clone()
        i = int(torch.randint(0, 15, (1,), generator=g))
        a2[i] += torch.randn((), generator=g, dtype=torch.float64) * 3
        diff = torch.sort(a2).values - torch.sort(a).values
        assert math.isclose(diff.abs().sum().item(), abs((a2[i] - a[i]).item()), rel_tol=1e-12, abs_tol=1e-12)
        assert bool((diff >= -1e-15).all()) or bool((diff <= 1e-15).all())


# ------------------------------------------------------------------------------------------ DP-SWD with the sketch
def _dpsw_sketch(x, y, th, sigma, L, seed=0, p=2, **kw):
    return fastdpot.dp_sliced_wasserstein(y, private=x, noise_std=sigma, projections=th, p=p, release="sketch",
                                          sketch_bins=L, clip_radius=1e6,
                                          generator=torch.Generator().manual_seed(seed), secure_mode=False, **kw)


def test_sketch_loss_is_zero_on_the_private_batch_itself():
    g = torch.Generator().manual_seed(20)
    x = torch.randn(40, 3, generator=g, dtype=torch.float64) * 0.4
    th = random_projections(6, 3, g)
    for L in (40, 7, 1):
        loss = _dpsw_sketch(x, x.clone(), th, 0.0, L)
        assert loss.item() < 1e-24, (L, loss.item())
    assert _dpsw_sketch(x, x + 0.3, th, 0.0, 5).item() > 1e-3


def test_sketch_loss_equals_a_direct_computation_with_the_replayed_noise():
    from fastdpot.privacy.sketch import quantile_table_eval
    from scipy.optimize import isotonic_regression

    g = torch.Generator().manual_seed(21)
    x = torch.randn(30, 4, generator=g, dtype=torch.float64) * 0.5
    y = torch.randn(25, 4, generator=g, dtype=torch.float64) * 0.5 + 0.2
    th = random_projections(5, 4, g)
    for p in (1, 2):
        loss, noise, none = _dpsw_sketch(x, y, th, 0.7, 4, seed=3, p=p, return_noise=True)
        assert none is None and noise.shape == (5, 4)
        # by hand: private bin sums + noise -> means -> weighted isotonic fit -> Q_j at the generated bins' levels
        xs = torch.sort(x @ th.t(), dim=0).values.t()
        mx = torch.tensor([8, 8, 7, 7])
        means = (torch.stack([c.sum(1) for c in xs.split(mx.tolist(), 1)], 1) + noise) / mx
        fit = torch.stack([torch.tensor(isotonic_regression(r.numpy(), weights=mx.double().numpy()).x)
                           for r in means])
        lv_x = bin_levels(mx)
        ys = torch.sort(y @ th.t(), dim=0).values.t()
        my = torch.tensor([7, 6, 6, 6])
        gm = torch.stack([c.mean(1) for c in ys.split(my.tolist(), 1)], 1)
        target = quantile_table_eval(fit, lv_x, bin_levels(my))
        want = ((gm - target).abs() ** p * (my.double() / 25)).sum(1).mean()
        torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-14)


def test_sketch_loss_gradient_reaches_the_generated_side():
    g = torch.Generator().manual_seed(22)
    x = torch.randn(12, 3, generator=g, dtype=torch.float64)
    th = random_projections(4, 3, g)
    y = (torch.randn(10, 3, generator=g, dtype=torch.float64) * 2.0).requires_grad_(True)
    torch.autograd.gradcheck(lambda yy: _dpsw_sketch(x, yy, th, 0.3, 3, seed=5), (y,))
    loss = _dpsw_sketch(x.requires_grad_(True), y, th, 0.3, 3)
    loss.backward()
    assert y.grad is not None and x.grad is None  # the release is not differentiable w.r.t. the private rows


def test_table_extension_rule():
    from fastdpot.privacy.sketch import quantile_table_eval

    table = torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.0, 2.0]], dtype=torch.float64)
    levels = torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64)
    u = torch.tensor([0.0, 0.25, 0.375, 0.75, 1.0, 1.5], dtype=torch.float64)
    out = quantile_table_eval(table, levels, u)
    # linear through the centres, extended with the end segments' slopes, u clamped to [0, 1]
    torch.testing.assert_close(out[0], torch.tensor([-1.0, 0.0, 0.5, 3.0, 5.0, 5.0], dtype=torch.float64))
    torch.testing.assert_close(out[1], torch.full((6,), 2.0, dtype=torch.float64))
    one = quantile_table_eval(table[:, :1], levels[:1], u)  # L = 1: constant
    assert bool((one[0] == 0.0).all()) and bool((one[1] == 2.0).all())


@pytest.mark.parametrize("kw, match", [
    (dict(release="sketch"), "sketch_bins"), (dict(release="points", sketch_bins=3), "sketch_bins"),
    (dict(release="bins", sketch_bins=3), "release"), (dict(release="sketch", sketch_bins=0), "sketch_bins"),
    (dict(release="sketch", sketch_bins=50), "sketch_bins"), (dict(release="sketch", sketch_bins=3, backend="gpu"), "backend"),
])
def test_sketch_loss_bad_arguments(kw, match):
    x, y = torch.randn(20, 3, dtype=torch.float64), torch.randn(30, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=match):
        fastdpot.dp_sliced_wasserstein(y, private=x, noise_std=0.5, num_projections=4, clip_radius=1.0, **kw)


def test_sketch_loss_module_and_dpswgen():
    from fastdpot.dpswgen import train_dpswgen

    g = torch.Generator().manual_seed(23)
    data = torch.randn(600, 2, generator=g) * 0.3
    mod = fastdpot.DPSlicedWassersteinLoss.from_privacy(10.0, 1e-5, 100, 600, 5, 8, 2, 1.0, release="sketch",
                                                        sketch_bins=5)
    y = torch.randn(100, 2, requires_grad=True)
    mod(y, private=data[:100]).backward()
    assert y.grad is not None and mod.releases == 1 and "release='sketch'" in repr(mod)
    from fastdpot.experiments.papers.dpswgen import MLPGenerator

    res = train_dpswgen(data, MLPGenerator(2, 2), 10.0, 1e-5, steps=5, batch_size=100, num_projections=8,
                        release="sketch", sketch_bins=5, generator=torch.Generator().manual_seed(1))
    assert res.steps == 5 and all(math.isfinite(v) for v in res.losses)
    with pytest.raises(ValueError, match="sketch_bins"):
        train_dpswgen(data, MLPGenerator(2, 2), 10.0, 1e-5, steps=5, batch_size=100, release="sketch",
                      sketch_bins=101)


def test_isotonic_table_is_scipys_weighted_fit_and_monotone():
    from scipy.optimize import isotonic_regression

    from fastdpot.privacy.sketch import quantile_table_eval, sketch_quantile_table

    g = torch.Generator().manual_seed(24)
    x = torch.randn(23, 4, dtype=torch.float64, generator=g)
    th = random_projections(6, 4, g)
    sk = sliced_quantile_sketch(x, th, 5, 2.0, clip_radius=3.0, generator=torch.Generator().manual_seed(4),
                                secure_mode=False)
    assert sk.sizes.tolist() == [5, 5, 5, 4, 4]
    fit, levels = sketch_quantile_table(sk)
    assert fit.shape == (6, 5) and fit.dtype == torch.float64 and torch.equal(levels, sk.levels)
    assert bool((fit[:, 1:] >= fit[:, :-1]).all())
    for j in range(6):
        want = isotonic_regression(sk.means[j].numpy(), weights=sk.sizes.double().numpy()).x
        assert torch.equal(fit[j], torch.from_numpy(want))
    assert not torch.equal(fit, sk.means)  # σ = 2 (bin-mean noise 0.4-0.5) puts some means out of order
    sk0 = sliced_quantile_sketch(x, th, 5, 0.0, clip_radius=3.0)  # noiseless: already sorted, the fit is the identity
    assert torch.equal(sketch_quantile_table(sk0)[0], sk0.means)
    # per-direction levels (k, N); L = B: the exact rank levels r/(B-1) map onto the table itself
    z = torch.arange(6, dtype=torch.float64).unsqueeze(0) ** 2
    lv = bin_levels(bin_sizes(6, 6))
    assert torch.equal(quantile_table_eval(z, lv, lv), z)
    tab = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 4.0]], dtype=torch.float64)
    uk = torch.tensor([[0.0, 1.0], [0.75, 0.5]], dtype=torch.float64)
    assert quantile_table_eval(tab, torch.tensor([0.25, 0.5, 1.0], dtype=torch.float64), uk).tolist() == \
        [[0.0, 3.0], [2.0, 0.0]]
