"""The private-only protocol's representations: the non-private PCA basis against numpy's eigendecomposition, the
one recorded release, the stand-in's noise scaled to the real run's size, the DCT maps, and the cache of a release
(never across secure and replayable modes, nor across runs). The mechanism (Analyze Gauss) is tested in
tests/privacy/test_moments.py."""
import math

import numpy as np
import pytest
import torch

from fastdpot.experiments.mainjob import representation as R
from fastdpot.privacy.composition import ComposedLedger


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


def test_a_cached_representation_is_a_release_recorded_again_and_stays_with_its_owner(tmp_path):
    images = (torch.rand(200, 1, 28, 28, generator=torch.Generator().manual_seed(4)) * 255).to(torch.uint8)
    labels = torch.zeros(200, dtype=torch.long)
    cfg = R.RepresentationConfig(kind="pca", latent_dim=4, share=0.5)

    def fit(owner, secure=True, led=None):
        led = led or ComposedLedger(3.0, 1e-5)
        return (*R.train_dp_representation(images, labels, cfg, led, num_classes=10, seed=0, progress=False,
                                           cache_dir=str(tmp_path), owner=owner, secure_mode=secure), led)

    m1, i1, first = fit("run-a")
    m2, i2, second = fit("run-a")  # the same run, resumed: its own release, recorded again in its ledger
    assert not i1["cached"] and i2["cached"] and torch.equal(m1.basis, m2.basis) and i2["cache_owner"] == "run-a"
    assert second.stages == first.stages and second.epsilon() == first.epsilon()
    m3, i3, _ = fit("run-b")  # another secure run never reuses run-a's secret release: it draws its own
    assert not i3["cached"] and not torch.equal(m3.basis, m1.basis)
    _, i4, _ = fit(None)  # secure without an owner: nothing is cached
    _, i5, _ = fit(None)
    assert not i4["cached"] and not i5["cached"]
    r1, j1, _ = fit("replayable:seed0", secure=False)  # replayable releases (rebuildable from the seed) are shared
    r2, j2, _ = fit("replayable:seed0", secure=False)
    assert not j1["cached"] and j2["cached"] and torch.equal(r1.basis, r2.basis)
    _, j3, _ = fit("replayable:seed0")  # ... but never read by a secure run, whatever the owner
    assert not j3["cached"] and j3["secure_mode"] and not j2["secure_mode"]
