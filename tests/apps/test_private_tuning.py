"""Tuning the private-only protocol on the validation split's stand-in: the grid, the stand-in split (inside the
validation split, never the sensitive set), and one scored setting calibrated to the real run's size."""
import pytest
import torch

import fastdpot.experiments.private_tuning as T
from fastdpot.experiments.config import PipelineConfig
from fastdpot.experiments.data.datasets import load_fashion_mnist_available
from fastdpot.experiments.private_only import private_split


def test_grid_is_the_product_of_its_axes():
    g = T._grid(["latent_dim=16,32", "representation_share=0.3,0.6", "rep_kind=pca"])
    assert len(g) == 4 and g[0] == dict(latent_dim=16, representation_share=0.3, rep_kind="pca")
    assert T._grid([]) == [{}] and T._grid(["num_projections=none"]) == [dict(num_projections=None)]
    with pytest.raises(ValueError, match="FIELD"):
        T._grid(["not_a_field=1"])


def test_stand_in_split_is_seeded_and_disjoint():
    a, b = T.stand_in_split(5000, 4000, seed=0)
    assert len(a) == 4000 and len(b) == 1000 and not set(a.tolist()) & set(b.tolist())
    assert torch.equal(a, T.stand_in_split(5000, 4000, seed=0)[0])
    with pytest.raises(ValueError, match="stand_in_size"):
        T.stand_in_split(100, 100, seed=0)


@pytest.mark.skipif(not load_fashion_mnist_available(), reason="needs the dataset-fashion-mnist package")
def test_a_setting_is_scored_on_the_validation_split_only(monkeypatch):
    import fastdpot.experiments.private_tuning as mod

    seen = {}
    real = mod.generate

    def spy(cfg, images, labels, ledger, **kw):
        seen["images"], seen["kw"] = images.clone(), kw
        return real(cfg, images, labels, ledger, **kw)

    monkeypatch.setattr(mod, "generate", spy)
    cfg = PipelineConfig(dataset="fashion-mnist", public_size=0, epsilon=5.0, max_train=1500, validation_size=300,
                         epochs=0.5, batch_size=50, latent_dim=8, classifiers="cnn", cnn_epochs=1)
    feats = []  # Inception stubbed: the FID compares the generated images with the HELD-OUT validation images

    def features(images, **kw):
        feats.append(images.clone())
        return images.flatten(1)[:, :16].double() + torch.linspace(0, 1, 16, dtype=torch.float64)

    import fastdpot.experiments.metrics as metrics

    monkeypatch.setattr(metrics, "inception_features", features)
    row = T.score_setting(cfg, stand_in_size=200, num_particles=300, fid_samples=50)
    from fastdpot.experiments.data import load_dataset

    train = load_dataset("fashion-mnist", "train", None, None, 1500)
    sens, val = private_split(1500, 300, seed=0)
    stand, _ = T.stand_in_split(300, 200, seed=0)
    assert torch.equal(seen["images"], train.images[val[stand]])  # validation images only
    assert seen["kw"]["calibration_size"] == len(sens) == row["calibration_size"] == 1200
    assert 0.0 <= row["accuracy_cnn"] <= 1.0 and 4.8 < row["epsilon"] <= 5.0 * (1 + 1e-9)
    assert row["latent_dim"] == 8 and row["held_out"] == 100
    _, held = T.stand_in_split(300, 200, seed=0)
    assert torch.equal(feats[0], train.images[val[held]].float() / 255) and feats[1].shape[0] == 50
    assert row["fid_samples"] == 50 and row["fid_held_out"] >= 0
