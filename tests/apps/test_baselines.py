"""Baselines of the main job: the DP Gaussian per class (sensitivity by Monte Carlo, noise replay, exactness at
ε = ∞) and the public-only samples; the downstream CNN."""
import math

import pytest
import torch

from fastdpot.experiments.baselines import (dp_class_gaussians, moments_sensitivity, particles_per_class,
                                        public_only_samples, sample_class_gaussians)
from fastdpot.experiments.metrics import cnn_accuracy, downstream_accuracy
from fastdpot.privacy import gaussian_mechanism_sigma


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
    with pytest.raises(ValueError, match="clip_radius"):
        moments_sensitivity(0.0)


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
    # covariances are PSD after the projection, and the noise's scale is σ
    assert float(torch.linalg.eigvalsh(rel["covs"]).min()) >= -1e-12
    assert float(rel["noise_second"].std()) == pytest.approx(rel["noise_std"], rel=0.5)


def test_gaussian_release_clips_inside_with_public_centres():
    x, y = _data()
    centers = torch.eye(3)
    far = x.clone()
    far[0] = far[0] * 100.0  # an outlier changes the release by at most Δ: it is clipped inside
    a = dp_class_gaussians(x, y, math.inf, 1e-5, clip_radius=0.3, normalize=False, centers=centers)
    b = dp_class_gaussians(far, y, math.inf, 1e-5, clip_radius=0.3, normalize=False, centers=centers)
    n0 = float(a["counts"][0])
    shift = float((a["means"][0] - b["means"][0]).norm()) * n0
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


def test_sampling_and_public_only():
    x, y = _data(3000)
    rel = dp_class_gaussians(x, y, math.inf, 1e-5)
    s, sl = sample_class_gaussians(rel["means"], rel["covs"], rel["counts"], 6000,
                                   generator=torch.Generator().manual_seed(0))
    assert s.shape == (6000, 3) and s.dtype == torch.float32
    assert torch.bincount(sl).tolist() == particles_per_class(rel["counts"], 6000).tolist() == [2000] * 3
    for c in range(3):
        torch.testing.assert_close(s[sl == c].double().mean(0), rel["means"][c], atol=0.01, rtol=0)
    p, pl = public_only_samples(x, y, 50, generator=torch.Generator().manual_seed(0))
    assert p.shape == (50, 3) and pl.shape == (50,)
    assert all(any(torch.equal(r, q) for q in x) for r in p[:5])
    p, pl = public_only_samples(x[:10], y[:10], 25)
    assert p.shape == (25, 3)
    with pytest.raises(ValueError, match="public_latents"):
        public_only_samples(x[:0], None, 5)


def _blobs(n, seed):
    """Two classes of 8×8 images: a bright left or right half, with noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.rand(n, 1, 8, 8, generator=g) * 0.3
    x[y == 0, :, :, :4] += 0.6
    x[y == 1, :, :, 4:] += 0.6
    return x.clamp(0, 1), y


def test_cnn_learns_a_separable_task_and_checks_inputs():
    xtr, ytr = _blobs(200, 0)
    xte, yte = _blobs(100, 1)
    assert cnn_accuracy(xtr, ytr, xte, yte, epochs=3) >= 0.95
    # labels shuffled against the images: nothing to learn, chance level
    assert cnn_accuracy(xtr, ytr[torch.randperm(200, generator=torch.Generator().manual_seed(0))], xte, yte,
                        epochs=3) < 0.8
    acc = downstream_accuracy(xtr, ytr, xte, yte, classifiers=("logreg", "cnn"), cnn_epochs=2)
    assert set(acc) == {"logreg", "cnn"}
    with pytest.raises(ValueError, match="cnn"):
        downstream_accuracy(xtr.flatten(1), ytr, xte.flatten(1), yte, classifiers=("cnn",))
    with pytest.raises(ValueError, match="classifiers"):
        downstream_accuracy(xtr, ytr, xte, yte, classifiers=("svm",))
    with pytest.raises(ValueError, match="2 classes"):
        cnn_accuracy(xtr, torch.zeros(200, dtype=torch.long), xte, yte)


def test_cnn_augmentation_shifts_and_mirrors_each_image_and_still_learns():
    from fastdpot.experiments.metrics import _shift_flip

    x = torch.rand(64, 2, 6, 5, generator=torch.Generator().manual_seed(3)) * 2 - 1
    out = _shift_flip(x, torch.Generator().manual_seed(4), max_shift=2, fill=-1.0)
    assert out.shape == x.shape
    flips = 0
    for i in range(x.shape[0]):   # each image is one of the 5×5 shifts of itself (or of its mirror), filled with -1
        padded = torch.nn.functional.pad(x[i:i + 1], (2, 2, 2, 2), value=-1.0)[0]
        cands = [(f, padded[:, dy:dy + 6, dx:dx + 5]) for dy in range(5) for dx in range(5) for f in (False, True)]
        match = [f for f, c in cands if torch.equal(out[i], c.flip(-1) if f else c)]
        assert match, i
        flips += match[0]
    assert 10 < flips < 54                                       # about half mirrored
    assert torch.equal(out, _shift_flip(x, torch.Generator().manual_seed(4), max_shift=2, fill=-1.0))
    # a task that survives shifts and mirroring (bright top vs bottom half) is still learnt with augmentation
    def blobs_tb(n, seed):
        x, y = _blobs(n, seed)
        return x.transpose(-1, -2).contiguous(), y
    xtr, ytr = blobs_tb(200, 0)
    xte, yte = blobs_tb(100, 1)
    assert cnn_accuracy(xtr, ytr, xte, yte, epochs=3, augment=True) >= 0.95
    from fastdpot.experiments.config import PipelineConfig

    assert PipelineConfig(cnn_augment=True).resolved().cnn_augment is True
    with pytest.raises(ValueError, match="cnn_augment"):
        PipelineConfig(cnn_augment="yes").resolved()


def test_dropout_cnn_shape_learns_and_checks_inputs():
    from fastdpot.experiments.config import PipelineConfig
    from fastdpot.experiments.metrics import _cnn

    # DPImageBench's F-MNIST shape: 28 px -> 26 -> 13 -> 11 -> 5 -> 3 (128·3·3 = 1152 features); 32 px -> 2048
    for side, feats in ((28, 1152), (32, 2048), (18, 128)):
        net = _cnn("dropout", 1, side, side, 10)
        assert net[-3].in_features == feats and net(torch.zeros(2, 1, side, side)).shape == (2, 10)
    assert sum(isinstance(m, torch.nn.Dropout) and m.p == 0.5 for m in _cnn("dropout", 3, 28, 28, 4)) == 2
    # learns the left/right task at 20 px (enlarged blobs); labels shuffled: chance level
    xtr, ytr = _blobs(300, 0)
    xte, yte = _blobs(100, 1)
    up = lambda x: torch.nn.functional.interpolate(x, size=20)  # noqa: E731
    assert cnn_accuracy(up(xtr), ytr, up(xte), yte, epochs=4, arch="dropout") >= 0.95
    shuffled = ytr[torch.randperm(300, generator=torch.Generator().manual_seed(0))]
    assert cnn_accuracy(up(xtr), shuffled, up(xte), yte, epochs=4, arch="dropout") < 0.8
    with pytest.raises(ValueError, match="18 x 18"):
        cnn_accuracy(xtr, ytr, xte, yte, arch="dropout")
    with pytest.raises(ValueError, match="arch"):
        cnn_accuracy(xtr, ytr, xte, yte, arch="resnet")
    assert downstream_accuracy(up(xtr), ytr, up(xte), yte, classifiers=("cnn",), cnn_epochs=4,
                               cnn_arch="dropout")["cnn"] >= 0.95
    assert PipelineConfig(cnn_arch="dropout").resolved().cnn_arch == "dropout"
    with pytest.raises(ValueError, match="cnn_arch"):
        PipelineConfig(cnn_arch="wide").resolved()


def test_cnn_cosine_schedule_decays_the_learning_rate_and_still_learns(monkeypatch):
    import math

    seen = []
    real_step = torch.optim.Adam.step

    def spy(self, *a, **k):
        seen.append(self.param_groups[0]["lr"])
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.Adam, "step", spy)
    xtr, ytr = _blobs(200, 0)
    xte, yte = _blobs(100, 1)
    assert cnn_accuracy(xtr, ytr, xte, yte, epochs=3, batch_size=50, lr=2e-3, schedule="cosine") >= 0.95
    total = 3 * 4
    assert len(seen) == total
    assert seen == pytest.approx([1e-3 * (1 + math.cos(math.pi * t / total)) for t in range(total)])
    seen.clear()
    cnn_accuracy(xtr, ytr, xte, yte, epochs=1, batch_size=50, lr=2e-3)
    assert seen == [2e-3] * 4                                     # constant: lr unchanged
    with pytest.raises(ValueError, match="schedule"):
        cnn_accuracy(xtr, ytr, xte, yte, schedule="step")
