"""The one-shot class sketch (fastdpot.privacy.class_sketch): its sensitivity by Monte Carlo over random and
adversarial neighbouring pairs (class changes, empty and tiny classes, one bin), the fractional bins against sorted
sums, the noise's law and secrecy, the post-processing into the op's tables, and bad input refused before any draw."""
import math

import pytest
import torch

from fastdpot.privacy.calibration import calibrate_noise_multiplier
from fastdpot.privacy.class_sketch import (check_orthonormal_blocks, class_quantile_sketch, class_sketch_sensitivity,
                                           fractional_bin_sums, release_class_sketch)
from fastdpot.privacy.randomness import PrivacyRandomness


def _blocks(d, B, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0].t()
                      for _ in range(B)])


def _release_vector(rel, w):
    return torch.cat([w * rel.counts, rel.sums.flatten()])


def _f(x, y, th, C, bins, r, w, centers=None):
    rel = class_quantile_sketch(x, y, th, num_classes=C, sketch_bins=bins, noise_multiplier=0.0, clip_radius=r,
                                count_weight=w, centers=centers)
    return _release_vector(rel, w)


def test_fractional_bins_are_sorted_sums_when_they_divide_and_sum_to_the_total():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(12, 3, generator=g, dtype=torch.float64)
    s = torch.sort(v, 0).values
    torch.testing.assert_close(fractional_bin_sums(v, 4), s.view(4, 3, 3).sum(1))
    odd = fractional_bin_sums(v[:7], 3)
    torch.testing.assert_close(odd.sum(0), v[:7].sum(0))
    # bin 1 of 7 rows in 3 bins: rank 0, 1 and a third of rank 2
    torch.testing.assert_close(odd[0], s_ := torch.sort(v[:7], 0).values[0] + torch.sort(v[:7], 0).values[1]
                               + torch.sort(v[:7], 0).values[2] / 3)
    assert fractional_bin_sums(v[:0], 2).abs().sum() == 0 and s_.shape == (3,)


@pytest.mark.parametrize("bins", [1, 2, 5, [1, 3, 2, 4, 4, 1, 2, 3]])
def test_sensitivity_holds_over_random_and_adversarial_neighbours(bins):
    d, B, C, r, w = 4, 2, 3, 1.5, 0.7
    th = _blocks(d, B)
    Lmax = bins if isinstance(bins, int) else max(bins)
    D = class_sketch_sensitivity(r, B, Lmax, w)
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    for trial in range(300):
        n = int(torch.randint(1, 9, (1,), generator=g))
        x = torch.randn(n, d, generator=g, dtype=torch.float64) * float(torch.rand(1, generator=g) * 3)
        y = torch.randint(0, C, (n,), generator=g)
        x2, y2 = x.clone(), y.clone()
        i = int(torch.randint(0, n, (1,), generator=g))
        kind = trial % 4
        if kind == 0:  # any replacement
            x2[i] = torch.randn(d, generator=g, dtype=torch.float64) * 5
            y2[i] = int(torch.randint(0, C, (1,), generator=g))
        elif kind == 1:  # the class changes, the row goes to the far side of the ball
            x2[i] = -x[i] / x[i].norm().clamp_min(1e-12) * 10
            y2[i] = (y[i] + 1) % C
        elif kind == 2:  # into a class that was empty, from a class of one
            y[:] = 0
            y[i] = 1
            y2 = y.clone()
            y2[i] = 2
            x2[i] = torch.randn(d, generator=g, dtype=torch.float64) * 10
        else:  # the same class, extreme rows
            x2[i] = -x[i] * 100
        bl = bins if isinstance(bins, int) else torch.tensor(bins)
        if isinstance(bins, int) and bins > n:
            continue
        if not isinstance(bins, int) and int(bl.max()) > n:
            continue
        diff = float((_f(x, y, th, C, bl, r, w) - _f(x2, y2, th, C, bl, r, w)).norm())
        worst = max(worst, diff / D)
    assert worst <= 1.0 + 1e-9
    assert worst > 0.3  # not vacuous (L = 1: a same-class replacement moves a block by up to 2r, the bound's 2r)


def _design(n, L, r):
    """The rows (n, n) and the joining row (n,) in block coordinates that attain the join bound (the docstring of
    class_sketch_sensitivity, "Tight"): row i is nonzero on the directions j with (i - j) mod n >= (n + 1)/L - 1,
    its nonzero entries equal and positive, norm r; v = -r(1, ..., 1)/sqrt(n)."""
    z = (n + 1) // L - 1
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    a = ((i - j) % n >= z).double()
    return r * a / a.norm(dim=1, keepdim=True), -r * torch.ones(n, dtype=torch.float64) / math.sqrt(n)


def _join_bound(n, L, r):
    """r^2 (gamma + sqrt(n/(n + 1)))^2 + r^2/L: the proof's bound ||v||^2 + 2 gamma ||v|| rho + rho^2 at ||v|| = r
    and rho^2 = r^2 n/(n + 1)."""
    return r * r * ((math.sqrt(1 - 1 / L) + math.sqrt(n / (n + 1))) ** 2 + 1 / L)


@pytest.mark.parametrize("n, L", [(1, 2), (3, 2), (7, 2), (2, 3), (8, 3), (3, 4), (11, 4)])
def test_a_class_change_attains_the_join_bound_in_a_block(n, L):
    # a class change that moves a row from class 1 (the design rows and the row) to class 0 (the design rows): each
    # class's block moves by the proof's bound for a class of n rows, to rounding, and the release by at most Delta
    r, w = 1.5, 0.7
    th = _blocks(n, 1, seed=n)  # one block of p = d = n orthonormal directions
    a, v = _design(n, L, r)
    x = torch.cat([a, a, v[None]]) @ th
    y = torch.tensor([0] * n + [1] * n + [1])
    y2 = y.clone()
    y2[-1] = 0
    f1, f2 = _f(x, y, th, 2, L, r, w), _f(x, y2, th, 2, L, r, w)
    per_block = float(((f1 - f2)[2:] ** 2).sum()) / 2  # the two classes' sums move by the same amount
    assert per_block == pytest.approx(_join_bound(n, L, r), rel=1e-9)
    beta = 2 + 2 * math.sqrt(1 - 1 / L)
    assert per_block <= beta * r * r * (1 + 1e-12)
    assert per_block >= (4 - 3 / L) * r * r * (1 - 1e-12)  # the one-direction extreme: equal at n = L - 1 only
    D = class_sketch_sensitivity(r, 1, L, w)
    diff = float((f1 - f2).norm())
    assert diff <= D * (1 + 1e-12)
    assert diff ** 2 == pytest.approx(2 * _join_bound(n, L, r) + 2 * w * w, rel=1e-9)
    if n >= 7:
        assert diff >= 0.93 * D  # close to the supremum beta_L r^2 that the bound uses


@pytest.mark.parametrize("L", [2, 3, 4, 8])
def test_the_one_direction_extreme_attains_four_minus_three_over_l(L):
    # all of a class at -r on one direction, the new row at +r on it: (4 - 3/L) r^2, below beta_L r^2
    r, n = 2.0, 3 * L
    th = _blocks(3, 1)
    x = torch.cat([-r * th[:1].expand(n, 3), r * th[:1]])
    old = class_quantile_sketch(x[:n], torch.zeros(n, dtype=torch.long), th, num_classes=1, sketch_bins=L,
                                noise_multiplier=0.0, clip_radius=r).sums
    new = class_quantile_sketch(x, torch.zeros(n + 1, dtype=torch.long), th, num_classes=1, sketch_bins=L,
                                noise_multiplier=0.0, clip_radius=r).sums
    moved = float(((new - old) ** 2).sum())
    assert moved == pytest.approx((4 - 3 / L) * r * r, rel=1e-9)
    assert moved < (2 + 2 * math.sqrt(1 - 1 / L)) * r * r


def test_the_release_takes_delta_at_the_largest_bin_count():
    # beta_L grows with L: a direction with 4 bins among directions with 1 must set Delta. A class change in that
    # direction moves the release by sqrt(2 (4 - 3/4) r^2 + 2 w^2), more than Delta at L = 1 allows
    r, w, n = 1.0, 0.25, 3
    th = _blocks(2, 1)
    x = torch.cat([-r * th[1:].expand(2 * n, 2), r * th[1:]])
    y = torch.tensor([0] * n + [1] * n + [1])
    y2 = y.clone()
    y2[-1] = 0
    rel = class_quantile_sketch(x, y, th, num_classes=2, sketch_bins=[1, 4], noise_multiplier=0.0, clip_radius=r,
                                count_weight=w)
    assert rel.sensitivity == pytest.approx(class_sketch_sensitivity(r, 1, 4, w), rel=1e-12)
    diff = float((_f(x, y, th, 2, [1, 4], r, w) - _f(x, y2, th, 2, [1, 4], r, w)).norm())
    assert diff == pytest.approx(math.sqrt(2 * 3.25 + 2 * w * w) * r, rel=1e-9)
    assert class_sketch_sensitivity(r, 1, 1, w) < diff <= rel.sensitivity * (1 + 1e-12)


def test_sensitivity_values():
    r, B, w = 2.0, 3, 0.5
    for L, beta in [(2, 2 + math.sqrt(2)), (4, 2 + math.sqrt(3)), (100, 2 + 2 * math.sqrt(0.99))]:
        assert class_sketch_sensitivity(r, B, L, w) == pytest.approx(math.sqrt(2 * B * beta * r * r + 2 * w * w),
                                                                     rel=1e-12)
    # L = 1: a block moves by r on a join; the same-class replacement's 2r per block is the larger unless w is
    assert class_sketch_sensitivity(r, B, 1, w) == pytest.approx(2 * r * math.sqrt(B), rel=1e-12)
    assert class_sketch_sensitivity(r, B, 1, 10.0) == pytest.approx(math.sqrt(2 * B * r * r + 200), rel=1e-12)
    with pytest.raises(ValueError, match="max_bins"):
        class_sketch_sensitivity(r, B, 0, w)


def test_the_same_class_bound_2r_per_block_is_attained():
    d, r = 3, 2.0
    th = _blocks(d, 1)
    x = torch.zeros(4, d, dtype=torch.float64)
    x[0] = th[0] * r
    x2 = x.clone()
    x2[0] = -th[0] * r
    y = torch.zeros(4, dtype=torch.long)
    diff = float((_f(x, y, th, 2, 1, r, 1.0) - _f(x2, y, th, 2, 1, r, 1.0)).norm())  # one bin: the class sum
    assert diff == pytest.approx(2 * r, rel=1e-12) and diff <= class_sketch_sensitivity(r, 1, 1, 1.0)


def test_noise_law_secrecy_replay_and_centres():
    d, C = 3, 2
    th = _blocks(d, 1)
    x = torch.randn(400, d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    y = torch.arange(400) % C
    kw = dict(num_classes=C, sketch_bins=4, noise_multiplier=0.8, clip_radius=3.0, return_noise=True)
    a = class_quantile_sketch(x, y, th, generator=torch.Generator().manual_seed(5), secure_mode=False, **kw)
    b = class_quantile_sketch(x, y, th, generator=torch.Generator().manual_seed(5), secure_mode=False, **kw)
    assert torch.equal(a.sums, b.sums) and torch.equal(a.counts, b.counts)  # replayable from its seed
    assert a.noise_std == pytest.approx(0.8 * a.sensitivity) and a.noise.dtype == torch.float64
    big = class_quantile_sketch(x, torch.arange(400) % 8, th, num_classes=8, sketch_bins=50, noise_multiplier=1.0,
                                clip_radius=3.0, generator=PrivacyRandomness(False, torch.Generator().manual_seed(1)),
                                return_noise=True)
    assert float(big.noise.std()) == pytest.approx(big.noise_std, rel=0.06)  # 1 200 draws: sd of the std ~2 %
    assert float(big.noise.mean()).__abs__() < 0.1 * big.noise_std
    s1 = class_quantile_sketch(x, y, th, **kw)  # secure: fresh OS noise each call
    s2 = class_quantile_sketch(x, y, th, **kw)
    assert not torch.equal(s1.noise, s2.noise)
    exact = class_quantile_sketch(x, y, th, num_classes=C, sketch_bins=4, noise_multiplier=0.0, clip_radius=3.0,
                                  centers=torch.ones(d, dtype=torch.float64))
    xc = x[y == 1] - 1.0
    xc = xc * (3.0 / xc.norm(dim=1, keepdim=True).clamp_min(3.0))  # clipped about the centre, inside
    torch.testing.assert_close(exact.sums[1].sum(1), (xc @ th.t()).sum(0))
    assert exact.counts.tolist() == [200.0, 200.0]


def test_tables_are_monotone_on_one_grid_and_exact_without_noise():
    d = 4
    th = _blocks(d, 2)
    x = torch.randn(2000, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y = torch.zeros(2000, dtype=torch.long)
    bins = torch.tensor([8] * 4 + [2] * 4)
    exact = class_quantile_sketch(x, y, th, num_classes=1, sketch_bins=bins, noise_multiplier=0.0, clip_radius=10.0,
                                  block_size=4)
    (table, grid), = exact.quantile_tables()
    assert grid.tolist() == sorted(set(((torch.arange(8) + 0.5) / 8).tolist() + [0.25, 0.75]))
    m = exact.bin_means()
    torch.testing.assert_close(table[0, [grid.tolist().index(v) for v in ((torch.arange(8) + 0.5) / 8).tolist()]],
                               m[0, 0, :8])
    assert bool((table[:, 1:] >= table[:, :-1] - 1e-12).all())
    noisy = class_quantile_sketch(x, y, th, num_classes=1, sketch_bins=bins, noise_multiplier=2.0, clip_radius=10.0,
                                  block_size=4)
    (t2, _), = noisy.quantile_tables()
    assert bool((t2[:, 1:] >= t2[:, :-1] - 1e-12).all()) and torch.isfinite(t2).all()


def test_bad_input_is_refused_before_any_draw():
    th = _blocks(3, 1)
    x = torch.randn(10, 3, dtype=torch.float64)
    y = torch.arange(10) % 2
    kw = dict(num_classes=2, sketch_bins=2, noise_multiplier=1.0, clip_radius=1.0)
    skew = th.clone()
    skew[1] = (th[0] + th[1]) / math.sqrt(2)
    with pytest.raises(ValueError, match="orthonormal"):
        class_quantile_sketch(x, y, skew, **kw)
    with pytest.raises(ValueError, match="whole blocks"):
        check_orthonormal_blocks(th[:2], 3)
    with pytest.raises(ValueError, match="no more bins than rows"):
        class_quantile_sketch(x, y, th, **dict(kw, sketch_bins=11))
    with pytest.raises(ValueError, match="integer"):
        class_quantile_sketch(x, y.double(), th, **kw)
    bad = x.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="x_private"):
        class_quantile_sketch(bad, y, th, **kw)
    with pytest.raises(ValueError, match="clip_radius"):
        class_quantile_sketch(x, y, th, **dict(kw, clip_radius=0.0))
    # labels outside [0, C): mapped to class 0, no error, no value in any message
    out = class_quantile_sketch(x, torch.tensor([0, 1, 7, -3, 0, 1, 0, 1, 0, 1]), th,
                                **dict(kw, noise_multiplier=0.0))
    assert out.counts.tolist() == [6.0, 4.0]


def test_isotonic_rows_is_scipys_isotonic_regression():
    import numpy as np
    from scipy.optimize import isotonic_regression

    from fastdpot.privacy.class_sketch import isotonic_rows

    g = torch.Generator().manual_seed(7)
    for L in (2, 3, 8, 16):
        y = torch.randn(300, L, generator=g, dtype=torch.float64) * 2 + torch.linspace(0, 1, L, dtype=torch.float64)
        want = np.stack([isotonic_regression(r.numpy(), increasing=True).x for r in y])
        torch.testing.assert_close(isotonic_rows(y), torch.from_numpy(want), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------- issue 46: one set of conventions
def _small():
    x = torch.randn(12, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    return x, torch.arange(12) % 2, _blocks(3, 1), dict(num_classes=2, sketch_bins=2, noise_multiplier=1.0,
                                                       clip_radius=1.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rows_are_refused_naming_them(dtype):
    x, y, th, kw = _small()
    with pytest.raises(ValueError, match=rf"^x_private must have dtype in .*got {dtype}"):
        class_quantile_sketch(x.to(dtype), y, th, **kw)
    with pytest.raises(ValueError, match="^x_private must have dtype"):
        release_class_sketch(x.to(dtype), y, th, epsilon=1.0, delta=1e-5, num_classes=2, sketch_bins=2,
                             clip_radius=1.0)


@pytest.mark.parametrize("bins", [2.0, [2.0, 2, 2], [2.5, 2, 2], torch.tensor([2.0, 2.0, 2.0]),
                                  torch.tensor([True, True, True]), True, "2"])
def test_sketch_bins_must_be_integers_never_truncated(bins):
    x, y, th, kw = _small()
    with pytest.raises(ValueError, match="^sketch_bins must"):
        class_quantile_sketch(x, y, th, **dict(kw, sketch_bins=bins))


def test_integer_sketch_bins_in_every_form_give_the_same_release():
    import numpy as np

    x, y, th, kw = _small()
    kw = dict(kw, noise_multiplier=0.0)
    want = class_quantile_sketch(x, y, th, **dict(kw, sketch_bins=[2, 3, 2])).sums
    for bins in ((2, 3, 2), torch.tensor([2, 3, 2]), np.array([2, 3, 2]), [np.int64(2), 3, 2]):
        torch.testing.assert_close(class_quantile_sketch(x, y, th, **dict(kw, sketch_bins=bins)).sums, want)


def test_flags_are_strict_bools():
    x, y, th, kw = _small()
    with pytest.raises(ValueError, match="^return_noise must be a bool"):
        class_quantile_sketch(x, y, th, **kw, return_noise=1)
    rel = class_quantile_sketch(x, y, th, **kw)
    with pytest.raises(ValueError, match="^shrink must be a bool"):
        rel.quantile_tables(shrink="no")


def test_a_generator_is_refused_as_the_other_releases_refuse_it():
    x, y, th, kw = _small()
    with pytest.raises(ValueError, match="generator"):
        class_quantile_sketch(x, y, th, **kw, generator=torch.Generator())  # secure mode: it would be unused
    with pytest.raises(ValueError, match="generator"):
        class_quantile_sketch(x, y, th, **kw, generator=3, secure_mode=False)


def test_num_classes_beyond_memory_is_refused_naming_it():
    x, y, th, kw = _small()
    with pytest.raises(ValueError, match=r"^num_classes=1000000000000 needs about .* GiB"):
        class_quantile_sketch(x, y, th, **dict(kw, num_classes=10 ** 12))


def test_noise_scale_below_one_is_refused_so_the_stated_epsilon_holds():
    """A noise_scale < 1 gave less noise than the stated ε needs (ε = 1 stated, the noise giving 14.4)."""
    x, y, th, kw = _small()
    for bad in (0.5, 1 - 1e-12, 0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="^noise_scale must"):
            class_quantile_sketch(x, y, th, **kw, noise_scale=bad)
        with pytest.raises(ValueError, match="^noise_scale must"):
            release_class_sketch(x, y, th, epsilon=1.0, delta=1e-5, num_classes=2, sketch_bins=2, clip_radius=1.0,
                                 noise_scale=bad)
    rel = release_class_sketch(x, y, th, epsilon=1.0, delta=1e-5, num_classes=2, sketch_bins=2, clip_radius=1.0,
                               noise_scale=2.0)
    z = calibrate_noise_multiplier(1.0, 1e-5, 1.0, 1, accountant="pld")
    # more noise than calibrated: the release records its real noise multiplier, and its ε stays below the stated 1
    assert rel.noise_multiplier == pytest.approx(2.0 * z, rel=1e-12)
    assert rel.noise_std == pytest.approx(rel.noise_multiplier * rel.sensitivity, rel=1e-12)
    assert rel.epsilon == 1.0 and _pld_epsilon(rel.noise_multiplier, 1e-5) < 1.0


def _pld_epsilon(z, delta):
    import dp_accounting

    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    return acc.compose(dp_accounting.GaussianDpEvent(z)).get_epsilon(delta)


def test_a_non_finite_private_row_is_refused_without_counting():
    x, y, th, kw = _small()
    x[1, 0], x[4, 2], x[5, 1] = math.nan, math.inf, -math.inf
    with pytest.raises(ValueError) as err:
        class_quantile_sketch(x, y, th, **kw)
    msg = str(err.value)
    assert msg.startswith("x_private contains non-finite values") and not any(c.isdigit() for c in msg), msg


def test_an_unreachable_delta_is_refused_in_the_functions_own_terms():
    x, y, th, _ = _small()
    for eps, delta in ((1.0, 1e-300), (1.0, 1e-20), (1e9, 1e-5)):
        with pytest.raises(ValueError) as err:
            release_class_sketch(x, y, th, epsilon=eps, delta=delta, num_classes=2, sketch_bins=2, clip_radius=1.0)
        msg = str(err.value)
        assert msg.startswith(f"release_class_sketch cannot calibrate epsilon={eps!r} at delta={delta!r}"), msg
        for foreign in ("target_epsilon", "value_discretization_interval", "accountant=", "steps"):
            assert foreign not in msg, (foreign, msg)  # arguments release_class_sketch does not take
