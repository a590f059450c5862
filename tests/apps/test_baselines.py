"""Baselines of the main job (the DP Gaussian's sampling, the public-only samples) and the downstream CNN; the
mechanisms themselves are tested in tests/privacy/test_moments.py."""
import math

import pytest
import torch

from fastdpot.experiments.mainjob import MainJobConfig
from fastdpot.experiments.mainjob.generation import generate_public
from fastdpot.experiments.metrics import cnn_accuracy, downstream_accuracy
from fastdpot.flows.allocation import allocate_particles, sample_class_gaussians
from fastdpot.privacy.moments import dp_class_gaussians


def _data(n=300, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 3
    x = torch.randn(n, d, generator=g) * 0.2 + torch.eye(3)[labels][:, :d]
    return x, labels


def test_gaussian_sampling_and_the_public_only_baseline():
    x, y = _data(3000)
    rel = dp_class_gaussians(x, y, math.inf, 1e-5)
    s, sl = sample_class_gaussians(rel["means"], rel["covs"], rel["counts"], 6000,
                                   generator=torch.Generator().manual_seed(0), minimum=2)
    assert s.shape == (6000, 3) and s.dtype == torch.float32
    assert torch.bincount(sl).tolist() == allocate_particles(6000, rel["counts"], 3, minimum=2) == [2000] * 3
    for c in range(3):
        torch.testing.assert_close(s[sl == c].double().mean(0), rel["means"][c], atol=0.01, rtol=0)
    cfg = MainJobConfig().with_settings(method="public", labels="public").resolved()
    out = generate_public(cfg, None, None, 50, 0, public_codes=x, public_labels=y)
    assert out["samples"].shape == (50, 3) and out["sample_labels"].shape == (50,) and out["epsilon"] == 0.0
    assert all(any(torch.equal(r, q) for q in x) for r in out["samples"][:5])
    assert generate_public(cfg, None, None, 25, 0, public_codes=x[:10], public_labels=y[:10])["samples"].shape == \
        (25, 3)
    with pytest.raises(ValueError, match="public codes are empty"):
        generate_public(cfg, None, None, 5, 0, public_codes=x[:0], public_labels=None)


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
    from fastdpot.experiments.classifiers import _shift_flip

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
    assert MainJobConfig().with_settings(cnn_augment=True).resolved().evaluation.cnn_augment is True
    with pytest.raises(ValueError, match="cnn_augment"):
        MainJobConfig().with_settings(cnn_augment="yes").resolved()


def test_dropout_cnn_shape_learns_and_checks_inputs():
    from fastdpot.experiments.classifiers import _cnn

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
    assert MainJobConfig().with_settings(cnn_arch="dropout").resolved().evaluation.cnn_arch == "dropout"
    with pytest.raises(ValueError, match="cnn_arch"):
        MainJobConfig().with_settings(cnn_arch="wide").resolved()


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
