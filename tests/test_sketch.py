"""The sliced quantile sketch (fastdpot.privacy.sketch): bins, levels, noise replay, bad input, and its
sensitivity — the bin sums never move by more than the per-point release ‖Θ(x_i − x′_i)‖₂ — by Monte Carlo over
random and adversarial neighbouring batches."""
import math

import pytest
import torch

from fastdpot._random import random_directions
from fastdpot.privacy import (bin_levels, bin_sizes, clip_rows, orthogonal_sliced_sensitivity,
                              sliced_quantile_sketch)
from fastdpot.privacy.sketch import bin_index


def _sums(x, th, L, radius=1.0):
    """Noiseless bin SUMS (k, L) of the sketch (means × sizes)."""
    sk = sliced_quantile_sketch(x, th, L, 0.0, radius=radius)
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
        with pytest.raises(ValueError, match="num_bins"):
            bin_sizes(b, L)


def test_sketch_is_binned_sorted_projections_and_noise_replays():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(23, 5, generator=g, dtype=torch.float64) * 0.3
    th = random_directions(7, 5, torch.Generator().manual_seed(1))
    sk = sliced_quantile_sketch(x, th, 4, 0.5, radius=10.0, generator=torch.Generator().manual_seed(2),
                                return_noise=True)
    assert sk.means.shape == (7, 4) and sk.levels.shape == (4,) and sk.sizes.tolist() == [6, 6, 6, 5]
    s = torch.sort(x @ th.t(), dim=0).values.t()  # (k, B)
    sums = torch.stack([c.sum(1) for c in s.split(sk.sizes.tolist(), dim=1)], dim=1)
    torch.testing.assert_close(sk.means, (sums + sk.noise) / sk.sizes.double(), rtol=1e-12, atol=1e-12)
    again = sliced_quantile_sketch(x, th, 4, 0.5, radius=10.0, generator=torch.Generator().manual_seed(2))
    assert torch.equal(again.means, sk.means) and again.noise is None
    # the noise is N(0, σ²) on the sums, drawn in float64
    big = sliced_quantile_sketch(x, th.repeat(300, 1), 4, 2.0, radius=10.0,
                                 generator=torch.Generator().manual_seed(3), return_noise=True).noise
    assert big.dtype == torch.float64 and abs(big.std().item() - 2.0) < 0.1 and abs(big.mean().item()) < 0.1


def test_l1_is_the_mean_and_l_equal_b_the_sorted_values():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(9, 3, generator=g, dtype=torch.float64) * 0.2
    th = random_directions(4, 3, g)
    one = sliced_quantile_sketch(x, th, 1, 0.0)
    torch.testing.assert_close(one.means[:, 0], (x @ th.t()).mean(0))
    full = sliced_quantile_sketch(x, th, 9, 0.0)
    torch.testing.assert_close(full.means, torch.sort(x @ th.t(), dim=0).values.t())
    torch.testing.assert_close(full.levels, torch.linspace(0, 1, 9, dtype=torch.float64))


def test_rows_are_clipped_or_normalised_inside():
    x = torch.tensor([[3.0, 4.0], [0.3, 0.0]], dtype=torch.float64)
    th = torch.eye(2, dtype=torch.float64)
    clipped = sliced_quantile_sketch(x, th, 2, 0.0, radius=1.0).means
    torch.testing.assert_close(clipped, torch.tensor([[0.3, 0.6], [0.0, 0.8]], dtype=torch.float64))
    normed = sliced_quantile_sketch(x, th, 2, 0.0, radius=2.0, normalize=True).means
    torch.testing.assert_close(normed, torch.tensor([[1.2, 2.0], [0.0, 1.6]], dtype=torch.float64))


@pytest.mark.parametrize("bad, match", [
    (dict(num_bins=0), "num_bins"), (dict(num_bins=11), "num_bins"), (dict(num_bins=2.5), "num_bins"),
    (dict(noise_std=-1.0), "noise_std"), (dict(noise_std=float("nan")), "noise_std"),
    (dict(radius=0.0), "radius"), (dict(generator=0), "generator"), (dict(normalize=1), "normalize"),
])
def test_bad_arguments_name_themselves(bad, match):
    x = torch.randn(10, 3, dtype=torch.float64)
    th = random_directions(4, 3, torch.Generator().manual_seed(0))
    kw = dict(num_bins=2, noise_std=1.0, radius=1.0)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        sliced_quantile_sketch(x, th, **kw)


def test_bad_tensors_are_refused():
    th = random_directions(4, 3, torch.Generator().manual_seed(0))
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
        th = random_directions(k, d, g, orthogonal=orthogonal)
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
