"""Gaussian mechanisms on moments (fastdpot.privacy.moments): every sensitivity by Monte Carlo over random and
adversarial neighbouring pairs (attained where the proof says so), the noise's law and replay, clipping inside, the
label map, and the post-processing into per-class Gaussians."""
import math

import pytest
import torch

from fastdpot.flows.allocation import sample_class_gaussians
from fastdpot.privacy import gaussian_mechanism_sigma
from fastdpot.privacy.moments import (class_gaussians, domain_labels, dp_class_gaussians, dp_second_moment,
                                      label_private_moments_sensitivity, moments_sensitivity, release_class_moments)
from fastdpot.privacy.randomness import privacy_randomness


def _moments(x):
    return torch.cat([x, (x[:, None] * x[None, :]).flatten()])


def _diff(x, y):
    return float((_moments(x) - _moments(y)).norm())


@pytest.mark.parametrize("r", [0.3, 0.5, 1 / math.sqrt(2), 0.9, 1.0, 1.7])
def test_moments_sensitivity_bounds_random_and_adversarial_pairs(r):
    g = torch.Generator().manual_seed(0)
    D = moments_sensitivity(r)
    worst = 0.0
    for d in (1, 2, 5, 16):
        x = torch.randn(4000, d, dtype=torch.float64, generator=g)
        x = x / x.norm(dim=1, keepdim=True) * r * torch.rand(4000, 1, dtype=torch.float64, generator=g) ** 0.2
        y = torch.randn(4000, d, dtype=torch.float64, generator=g)
        y = y / y.norm(dim=1, keepdim=True) * r * torch.rand(4000, 1, dtype=torch.float64, generator=g) ** 0.2
        second = (x[:, :, None] * x[:, None, :] - y[:, :, None] * y[:, None, :]).flatten(1)
        worst = max(worst, float(torch.cat([x - y, second], 1).norm(dim=1).max()) / D)
    # adversarial pairs: the maximisers of the proof (antipodal; or inner product -1/2 on the sphere of radius r)
    e1, e2 = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 1.0], dtype=torch.float64)
    adv = [(r * e1, -r * e1), (r * e1, torch.zeros(2, dtype=torch.float64))]
    if r * r >= 0.5:
        c = -0.5 / (r * r)
        adv.append((r * e1, r * (c * e1 + math.sqrt(1 - c * c) * e2)))
    ratios = [_diff(a, b) / D for a, b in adv]
    assert max(worst, *ratios) <= 1.0 + 1e-12
    assert max(ratios) == pytest.approx(1.0, abs=1e-12)  # the bound is attained: it cannot be lowered
    assert worst > 0.5


def test_moments_sensitivity_values_and_errors():
    assert moments_sensitivity(1.0) == pytest.approx(math.sqrt(4.5))
    assert moments_sensitivity(0.5) == pytest.approx(1.0)
    assert label_private_moments_sensitivity(1.0) == pytest.approx(math.sqrt(6.0))
    with pytest.raises(ValueError, match="clip_radius"):
        moments_sensitivity(0.0)


def _triu(m):
    i = torch.triu_indices(m.shape[0], m.shape[1])
    return m[i[0], i[1]]


@pytest.mark.parametrize("r", [1.0, 0.5, 2.0])
def test_second_moment_sensitivity_by_monte_carlo(r):
    # replacing one row (clipped to the ball of radius r inside) moves the released upper triangle by at most √2·r²
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for trial in range(400):
        x = torch.randn(6, 5, generator=g, dtype=torch.float64) * (0.2 + 3 * torch.rand(1, generator=g).item())
        x2 = x.clone()
        x2[0] = torch.randn(5, generator=g, dtype=torch.float64) * 2
        d = _triu(dp_second_moment(x, 0.0, clip_radius=r) - dp_second_moment(x2, 0.0, clip_radius=r))
        worst = max(worst, float(d.norm()))
    assert worst <= math.sqrt(2) * r * r * (1 + 1e-12)
    e = torch.eye(5, dtype=torch.float64) * r  # attained by orthogonal rows of norm r
    d = _triu(dp_second_moment(e[:1], 0.0, clip_radius=r) - dp_second_moment(e[1:2], 0.0, clip_radius=r))
    assert float(d.norm()) == pytest.approx(math.sqrt(2) * r * r)


def test_second_moment_noise_is_symmetric_with_the_stated_std_and_checks_inputs():
    rng = privacy_randomness(False, torch.Generator().manual_seed(3))
    m = dp_second_moment(torch.zeros(1, 60, dtype=torch.float64), 0.5, rng)
    assert torch.equal(m, m.t())
    assert float(_triu(m).std()) == pytest.approx(0.5, rel=0.05)
    with pytest.raises(ValueError, match="finite"):
        dp_second_moment(torch.tensor([[float("nan"), 1.0]]), 0.0)
    with pytest.raises(ValueError, match="empty"):
        dp_second_moment(torch.zeros(0, 3), 0.0)
    with pytest.raises(ValueError, match="noise_std"):
        dp_second_moment(torch.zeros(2, 3), -1.0)


def _data(n=300, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    x = torch.randn(n, d, generator=g) * 0.2 + torch.eye(3)[labels][:, :d]
    return x, labels


def test_gaussian_release_replays_its_noise_and_is_exact_without_noise():
    x, y = _data()
    exact = dp_class_gaussians(x, y, math.inf, 1e-5)
    u = x.double() / x.double().norm(dim=1, keepdim=True)  # the flow's default bound: the unit sphere
    for c in range(3):
        uc = u[y == c]
        torch.testing.assert_close(exact["means"][c], uc.mean(0))
        torch.testing.assert_close(exact["covs"][c], torch.cov(uc.T, correction=0))
    assert exact["noise_std"] == 0.0
    rel = dp_class_gaussians(x, y, 2.0, 1e-5, generator=torch.Generator().manual_seed(3), return_noise=True,
                             secure_mode=False)
    assert rel["noise_std"] == pytest.approx(gaussian_mechanism_sigma(2.0, 1e-5, math.sqrt(4.5)))
    assert rel["noise_sum"].dtype == torch.float64 and rel["noise_second"].dtype == torch.float64
    n = rel["counts"].double()
    s = torch.zeros(3, 3, dtype=torch.float64).index_add_(0, y, u) + rel["noise_sum"]
    torch.testing.assert_close(rel["means"], s / n[:, None])
    assert float(torch.linalg.eigvalsh(rel["covs"]).min()) >= -1e-12
    assert float(rel["noise_second"].std()) == pytest.approx(rel["noise_std"], rel=0.5)


def test_gaussian_release_clips_inside_with_public_centres():
    x, y = _data()
    centers = torch.eye(3)
    far = x.clone()
    far[0] = far[0] * 100.0  # an outlier changes the release by at most Δ: it is clipped inside
    a = dp_class_gaussians(x, y, math.inf, 1e-5, clip_radius=0.3, normalize=False, centers=centers)
    b = dp_class_gaussians(far, y, math.inf, 1e-5, clip_radius=0.3, normalize=False, centers=centers)
    shift = float((a["means"][0] - b["means"][0]).norm()) * float(a["counts"][0])
    assert shift <= 2 * 0.3 + 1e-9


def test_gaussian_release_errors():
    x, y = _data()
    with pytest.raises(ValueError, match="epsilon"):
        dp_class_gaussians(x, y, 0.0, 1e-5)
    with pytest.raises(ValueError, match="delta"):
        dp_class_gaussians(x, y, 1.0, 1.5)
    with pytest.raises(ValueError, match="labels"):
        dp_class_gaussians(x, y[:-1], 1.0, 1e-5)
    bad = x.clone()
    bad[1, 0] = float("nan")
    with pytest.raises(ValueError, match="latents"):
        dp_class_gaussians(bad, y, 1.0, 1e-5)
    with pytest.raises(ValueError, match="no private rows"):
        dp_class_gaussians(x, y, 1.0, 1e-5, num_classes=4)
    with pytest.raises(ValueError, match="centers"):
        dp_class_gaussians(x, y, 1.0, 1e-5, centers=torch.zeros(2, 3), normalize=False)


def _stats(y, lab, C):
    n, d = y.shape
    out = torch.zeros(C, 1 + d + d * d, dtype=torch.float64)
    out.index_add_(0, lab, torch.cat([torch.ones(n, 1, dtype=torch.float64), y,
                                      (y[:, :, None] * y[:, None, :]).reshape(n, -1)], 1))
    return out


@pytest.mark.parametrize("r", [1.0, 0.6])
def test_label_private_moments_sensitivity_by_monte_carlo_over_class_changes(r):
    # the per-class (count, Σy, Σyyᵀ) vector moves by at most Δ when one record is replaced by any other, the label
    # free to change; attained with c != c' and both rows on the sphere of radius r
    g = torch.Generator().manual_seed(0)
    d, C, worst = 3, 10, 0.0
    D = label_private_moments_sensitivity(r)
    for _ in range(300):
        y = torch.randn(8, d, generator=g, dtype=torch.float64) * r
        lab = torch.randint(0, C, (8,), generator=g)
        y2, lab2 = y.clone(), lab.clone()
        y2[0] = torch.randn(d, generator=g, dtype=torch.float64) * 3 * r
        lab2[0] = int(torch.randint(0, C, (1,), generator=g))
        a = release_class_moments(y, lab, C, 0.0, clip_radius=r)
        b = release_class_moments(y2, lab2, C, 0.0, clip_radius=r)
        fa = torch.cat([a["counts"][:, None], a["sums"], a["second"].flatten(1)], 1)
        fb = torch.cat([b["counts"][:, None], b["sums"], b["second"].flatten(1)], 1)
        worst = max(worst, float((fa - fb).norm()))
    assert worst <= D * (1 + 1e-12) and worst > D * 0.98
    assert torch.equal(release_class_moments(y, lab, C, 0.0, clip_radius=r)["counts"],
                       torch.bincount(lab, minlength=C).double())


def test_label_private_release_noise_maps_labels_and_post_processing():
    y = torch.randn(2000, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 0.1
    lab = torch.arange(2000) % 4
    lab[:3] = torch.tensor([7, -2, 100])  # outside [0, 4): class 0, no error, no value echoed
    rel = release_class_moments(y, lab, 4, 2.0, generator=torch.Generator().manual_seed(5), secure_mode=False)
    assert rel["noise_std"] == pytest.approx(2.0 * math.sqrt(6.0))
    exact = release_class_moments(y, lab, 4, 0.0)
    noise = torch.cat([(rel["counts"] - exact["counts"])[:, None], rel["sums"] - exact["sums"],
                       (rel["second"] - exact["second"]).flatten(1)], 1)
    assert float(noise.std()) == pytest.approx(rel["noise_std"], rel=0.15)
    assert exact["counts"].tolist() == [502, 499, 499, 500]  # records 1 and 2 (classes 1, 2) joined class 0
    m, cov = class_gaussians(exact["counts"], exact["sums"], exact["second"])
    torch.testing.assert_close(m[1], y[lab == 1].mean(0))
    x, lb = sample_class_gaussians(m, cov, exact["counts"], 400, torch.Generator().manual_seed(0))
    assert x.shape == (400, 2) and torch.bincount(lb).tolist() == [100, 100, 100, 100]
    assert domain_labels(torch.tensor([0, 9, 10, -1, 3]), 10).tolist() == [0, 9, 0, 0, 3]
    with pytest.raises(ValueError, match="integer"):
        domain_labels(torch.tensor([0.0, 1.0]), 10)


@pytest.mark.parametrize("r,w", [(1.0, 1.0), (2.0, 0.5), (0.5, 3.0)])
def test_class_means_sensitivity_by_monte_carlo_over_class_changes(r, w):
    from fastdpot.privacy.moments import release_class_means

    g = torch.Generator().manual_seed(3)
    D = max(math.sqrt(2 * (w * w + r * r)), 2 * r)
    worst = 0.0
    for trial in range(300):
        x = torch.randn(6, 3, generator=g, dtype=torch.float64) * 2 * r
        lab = torch.randint(0, 4, (6,), generator=g)
        x2, lab2 = x.clone(), lab.clone()
        x2[0] = -x[0] * 5 if trial % 2 else torch.randn(3, generator=g, dtype=torch.float64) * 3 * r
        lab2[0] = lab[0] if trial % 3 == 0 else (lab[0] + 1) % 4

        def f(xx, ll):
            out = release_class_means(xx, ll, 4, 0.0, clip_radius=r, count_weight=w)
            counts = out["counts"]
            return torch.cat([w * counts, ((out["means"] * counts.clamp_min(1.0)[:, None]) *
                                           (counts > 0).double()[:, None]).flatten()])

        worst = max(worst, float((f(x, lab) - f(x2, lab2)).norm()))
    assert worst <= D * (1 + 1e-9) and worst > 0.8 * D
    noisy = release_class_means(torch.zeros(4000, 2, dtype=torch.float64), torch.arange(4000) % 2, 2, 1.0,
                                clip_radius=1.0, generator=torch.Generator().manual_seed(1), secure_mode=False)
    assert noisy["noise_std"] == pytest.approx(2.0) and noisy["counts"].sub(2000).abs().max() < 20


# ---------------------------------------------------------------------------- issue 46: one set of conventions
def _rows(n=40, d=3):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(7), dtype=torch.float64), torch.arange(n) % 2


def _means(x, y, **kw):
    from fastdpot.privacy.moments import release_class_means

    return release_class_means(x, y, kw.pop("num_classes", 2), kw.pop("noise_multiplier", 1.0), clip_radius=1.0,
                               **kw)


def _moments_release(x, y, **kw):
    return release_class_moments(x, y, kw.pop("num_classes", 2), kw.pop("noise_multiplier", 1.0), **kw)


@pytest.mark.parametrize("release", [_means, _moments_release])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rows_are_refused_naming_them(release, dtype):
    x, y = _rows()
    with pytest.raises(ValueError, match=rf"^rows must have dtype in .*got {dtype}"):
        release(x.to(dtype), y)
    with pytest.raises(ValueError, match="^latents must have dtype"):
        dp_class_gaussians(x.to(dtype), y, 1.0, 1e-5)


@pytest.mark.parametrize("release", [_means, _moments_release])
def test_a_bad_generator_is_refused_not_ignored(release):
    """As class_quantile_sketch: in secure mode a generator would be silently unused; a non-generator is refused."""
    x, y = _rows()
    for gen in (3, "seed", torch.Generator()):
        with pytest.raises(ValueError, match="generator"):
            release(x, y, generator=gen)
    for gen in (3, "seed"):
        with pytest.raises(ValueError, match="generator"):
            release(x, y, generator=gen, secure_mode=False)
    a = release(x, y, generator=torch.Generator().manual_seed(1), secure_mode=False)
    b = release(x, y, generator=torch.Generator().manual_seed(1), secure_mode=False)
    torch.testing.assert_close(a["counts"], b["counts"], rtol=0, atol=0)  # replayable


@pytest.mark.parametrize("release", [_means, _moments_release])
def test_noise_scale_below_one_is_refused_and_above_one_adds_noise(release):
    x, y = _rows()
    for bad in (0.5, 1 - 1e-12, 0.0, math.nan):
        with pytest.raises(ValueError, match="^noise_scale must"):
            release(x, y, noise_scale=bad)
    one, two = release(x, y), release(x, y, noise_scale=2.0)
    assert two["noise_std"] == pytest.approx(2.0 * one["noise_std"], rel=1e-12)
    with pytest.raises(ValueError, match="^noise_scale must"):
        dp_class_gaussians(x, y, 1.0, 1e-5, noise_scale=0.5)


@pytest.mark.parametrize("release", [_means, _moments_release])
def test_num_classes_beyond_memory_is_refused_naming_it(release):
    x, y = _rows()
    with pytest.raises(ValueError, match=r"^num_classes=1000000000000 needs about .* GiB"):
        release(x, y, num_classes=10 ** 12)


@pytest.mark.parametrize("release", [_means, _moments_release])
def test_a_non_finite_private_row_is_refused_without_counting(release):
    x, y = _rows()
    x[0, 0], x[3, 1] = math.nan, math.inf
    for call, name in ((lambda: release(x, y), "rows"), (lambda: dp_class_gaussians(x, y, 1.0, 1e-5), "latents")):
        with pytest.raises(ValueError) as err:
            call()
        msg = str(err.value)
        assert msg.startswith(f"{name} contains non-finite values") and not any(c.isdigit() for c in msg), msg


def test_the_public_label_release_takes_strict_bools():
    x, y = _rows()
    with pytest.raises(ValueError, match="^normalize must be a bool"):
        dp_class_gaussians(x, y, 1.0, 1e-5, normalize="no")
    with pytest.raises(ValueError, match="^return_noise must be a bool"):
        dp_class_gaussians(x, y, 1.0, 1e-5, return_noise=1)
