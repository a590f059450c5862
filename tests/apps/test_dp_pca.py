"""The DP-PCA representation of the private-only protocol: the second-moment release's sensitivity sqrt(2) by Monte
Carlo (attained), the non-private basis against numpy's eigendecomposition, the one recorded release, and the
stand-in's noise scaled to the real run's size."""
import math

import numpy as np
import pytest
import torch

from fastdpot.experiments import dp_representation as R
from fastdpot.privacy.composition import ComposedLedger


def _triu(m):
    i = torch.triu_indices(m.shape[0], m.shape[1])
    return m[i[0], i[1]]


def test_second_moment_sensitivity_by_monte_carlo():
    # replacing one row (clipped to the unit ball) moves the released upper triangle by at most sqrt(2)
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for trial in range(400):
        x = torch.randn(6, 5, generator=g, dtype=torch.float64) * (0.2 + 3 * torch.rand(1, generator=g).item())
        x2 = x.clone()
        x2[0] = torch.randn(5, generator=g, dtype=torch.float64) * 2
        d = _triu(R.dp_second_moment(x, 0.0, None) - R.dp_second_moment(x2, 0.0, None))
        worst = max(worst, float(d.norm()))
    assert worst <= math.sqrt(2) * (1 + 1e-12)
    e = torch.eye(5, dtype=torch.float64)  # attained by orthogonal unit rows
    d = _triu(R.dp_second_moment(e[:1], 0.0, None) - R.dp_second_moment(e[1:2], 0.0, None))
    assert float(d.norm()) == pytest.approx(math.sqrt(2))


def test_second_moment_noise_is_symmetric_with_the_stated_std():
    from fastdpot.privacy.randomness import privacy_randomness

    rng = privacy_randomness(False, torch.Generator().manual_seed(3))
    x = torch.zeros(1, 60, dtype=torch.float64)
    m = R.dp_second_moment(x, 0.5, rng)
    assert torch.equal(m, m.t())
    assert float(_triu(m).std()) == pytest.approx(0.5, rel=0.05)
    with pytest.raises(ValueError, match="finite"):
        R.dp_second_moment(torch.tensor([[float("nan"), 1.0]]), 0.0, None)
    with pytest.raises(ValueError, match="non-empty"):
        R.dp_second_moment(torch.zeros(0, 3), 0.0, None)


def test_nonprivate_basis_is_the_top_eigenvectors_and_decode_inverts_encode():
    g = torch.Generator().manual_seed(1)
    images = (torch.rand(300, 1, 28, 28, generator=g) * 255).to(torch.uint8)
    led = ComposedLedger(float("inf"), 1e-5)
    cfg = R.RepresentationConfig(kind="pca", latent_dim=20, scale=30.0)
    model, info = R.train_dp_representation(images, torch.zeros(300, dtype=torch.long), cfg, led, num_classes=10,
                                            seed=0, progress=False)
    x = images.flatten(1).double().numpy() / (255.0 * 30.0)
    w, v = np.linalg.eigh(x.T @ x)
    top = v[:, ::-1][:, :20]
    overlap = np.abs(top.T @ model.basis.double().numpy())
    assert np.allclose(np.diag(overlap), 1.0, atol=1e-4)  # the same subspace, column by column (up to sign)
    full = R.DPPCARepresentation(torch.eye(784), 30.0)  # d = p: decoding inverts encoding exactly
    f = images[:5].float() / 255
    assert torch.allclose(full.decode(full.encode(f)), f, atol=1e-5)
    assert not model.on_sphere and info["noise_multiplier"] is None and led.stages == []


def test_private_pca_records_one_release_and_the_stand_in_scales_its_noise():
    images = (torch.rand(400, 1, 28, 28, generator=torch.Generator().manual_seed(2)) * 255).to(torch.uint8)
    labels = torch.zeros(400, dtype=torch.long)
    cfg = R.RepresentationConfig(kind="pca", latent_dim=8, share=0.5)
    led = ComposedLedger(4.0, 1e-5)
    _, info = R.train_dp_representation(images, labels, cfg, led, num_classes=10, seed=0, progress=False,
                                        secure_mode=False)
    (stage,) = led.stages
    assert stage["releases"] == 1 and stage["event"]["batch_size"] == 400 == stage["event"]["dataset_size"]
    assert led.epsilon() <= 2.0 * (1 + 1e-9) and led.epsilon() > 1.9
    assert info["noise_std"] == pytest.approx(stage["noise_multiplier"] * math.sqrt(2))
    stand = ComposedLedger(4.0, 1e-5)  # a stand-in of 400 calibrated for 4000: the real run's relative noise
    _, info2 = R.train_dp_representation(images, labels, cfg, stand, num_classes=10, seed=0, progress=False,
                                         secure_mode=False, calibration_size=4000)
    assert stand.stages[0]["event"]["dataset_size"] == 4000
    assert info2["noise_std"] == pytest.approx(stand.stages[0]["noise_multiplier"] * math.sqrt(2) * 400 / 4000)
    with pytest.raises(ValueError, match="calibration_size"):
        R.train_dp_representation(images, labels, cfg, ComposedLedger(4.0, 1e-5), num_classes=10, seed=0,
                                  progress=False, calibration_size=100)


def test_dct_lowpass_matrix_is_the_orthonormal_2d_dct():
    from scipy.fft import dctn

    L = R.dct_lowpass_matrix(28)
    assert torch.allclose(L @ L.t(), torch.eye(784, dtype=torch.float64), atol=1e-12)  # K = side: orthogonal
    img = torch.rand(28, 28, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    want = torch.from_numpy(dctn(img.numpy(), type=2, norm="ortho"))
    assert torch.allclose((L @ img.flatten()).view(28, 28), want, atol=1e-12)
    L7 = R.dct_lowpass_matrix(7)
    assert L7.shape == (49, 784) and torch.allclose(L7, L.view(28, 28, 784)[:7, :7].reshape(49, 784))
    with pytest.raises(ValueError, match="size"):
        R.dct_lowpass_matrix(29)


def test_lowpass_pca_releases_the_low_frequencies_only_and_its_basis_is_orthonormal(monkeypatch):
    images = (torch.rand(300, 1, 28, 28, generator=torch.Generator().manual_seed(6)) * 255).to(torch.uint8)
    seen = []
    real = R.dp_second_moment
    monkeypatch.setattr(R, "dp_second_moment", lambda rows, std, rng: seen.append(rows) or real(rows, std, rng))
    cfg = R.RepresentationConfig(kind="pca", latent_dim=12, lowpass=6, share=0.5)
    led = ComposedLedger(2.0, 1e-5)
    model, _ = R.train_dp_representation(images, torch.zeros(300, dtype=torch.long), cfg, led, num_classes=10,
                                         seed=0, progress=False, secure_mode=False)
    (rows,) = seen  # the one release reads the 36 lowest DCT coefficients of the scaled images, nothing else
    L = R.dct_lowpass_matrix(6)
    assert rows.shape == (300, 36)
    assert torch.allclose(rows, images.flatten(1).double() / (255 * cfg.scale) @ L.t(), atol=1e-12)
    assert len(led.stages) == 1 and led.stages[0]["releases"] == 1
    b = model.basis.double()
    assert torch.allclose(b.t() @ b, torch.eye(12, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(L.t() @ (L @ b), b, atol=1e-5)  # every basis image lies in the low frequencies
    with pytest.raises(ValueError, match="lowpass"):
        R.RepresentationConfig(kind="pca", latent_dim=40, lowpass=6)
    with pytest.raises(ValueError, match="lowpass"):
        R.RepresentationConfig(kind="autoencoder", latent_dim=16, lowpass=6)


def test_dct_representation_is_public_and_releases_nothing(monkeypatch):
    monkeypatch.setattr(R, "dp_second_moment", lambda *a: pytest.fail("the DCT representation reads no image"))
    led = ComposedLedger(1.0, 1e-5)
    images = torch.full((20, 1, 28, 28), 255, dtype=torch.uint8)
    model, info = R.train_dp_representation(images, torch.zeros(20, dtype=torch.long),
                                            R.RepresentationConfig(kind="dct", latent_dim=16, lowpass=4), led,
                                            num_classes=10, seed=0, progress=False)
    assert led.stages == [] and info["steps"] == 0 and info["noise_multiplier"] is None
    assert torch.allclose(model.basis.double(), R.dct_lowpass_matrix(4).t(), atol=1e-7)
    flat = torch.full((1, 1, 28, 28), 0.5)  # a constant image is the DC coefficient alone: decoded exactly
    assert torch.allclose(model.decode(model.encode(flat)), flat, atol=1e-5)
    with pytest.raises(ValueError, match="dct"):
        R.RepresentationConfig(kind="dct", latent_dim=16, lowpass=5)


def test_representation_config_rejects_bad_settings():
    with pytest.raises(ValueError, match="kind"):
        R.RepresentationConfig(kind="vae")
    with pytest.raises(ValueError, match="784"):
        R.RepresentationConfig(kind="pca", latent_dim=785)
    with pytest.raises(ValueError, match="scale"):
        R.RepresentationConfig(scale=0.0)


def test_a_cached_representation_is_a_release_recorded_again(tmp_path):
    images = (torch.rand(200, 1, 28, 28, generator=torch.Generator().manual_seed(4)) * 255).to(torch.uint8)
    labels = torch.zeros(200, dtype=torch.long)
    cfg = R.RepresentationConfig(kind="pca", latent_dim=4, share=0.5)
    first, second = ComposedLedger(3.0, 1e-5), ComposedLedger(3.0, 1e-5)
    m1, i1 = R.train_dp_representation(images, labels, cfg, first, num_classes=10, seed=0, progress=False,
                                       cache_dir=str(tmp_path))
    m2, i2 = R.train_dp_representation(images, labels, cfg, second, num_classes=10, seed=0, progress=False,
                                       cache_dir=str(tmp_path))
    assert not i1["cached"] and i2["cached"] and torch.equal(m1.basis, m2.basis)
    assert second.stages == first.stages and second.epsilon() == first.epsilon()
