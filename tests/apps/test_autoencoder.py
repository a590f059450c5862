"""Auto-encoders of the main job: shapes, unit-sphere latents, training on public data, the hashed cache."""
import pytest
import torch

from fastdpot.experiments.mainjob.autoencoder import (AutoEncoderConfig, BatchNormConvAutoEncoder, ConvAutoEncoder,
                                          DCGANAutoEncoder, build_autoencoder, data_hash, decode, encode,
                                          train_autoencoder)
from fastdpot.experiments.data import load_digits


@pytest.mark.parametrize("size", [28, 32])
def test_conv_autoencoder_shapes_and_sphere(size):
    torch.manual_seed(0)
    ae = ConvAutoEncoder(channels=1, image_size=size, latent_dim=8)
    x = torch.rand(5, 1, size, size)
    z = ae.encode(x)
    assert z.shape == (5, 8)
    torch.testing.assert_close(z.norm(dim=1), torch.ones(5), rtol=1e-6, atol=1e-6)
    y = ae.decode(z).detach()
    assert y.shape == (5, 1, size, size) and float(y.min()) >= 0 and float(y.max()) <= 1


@pytest.mark.parametrize("size,channels", [(28, 1), (32, 3)])
def test_batchnorm_conv_autoencoder_shapes_sphere_and_config(size, channels):
    torch.manual_seed(0)
    ae = build_autoencoder(AutoEncoderConfig(arch="convbn", latent_dim=8), channels, size).eval()
    assert isinstance(ae, BatchNormConvAutoEncoder)
    z = ae.encode(torch.rand(4, channels, size, size))
    assert z.shape == (4, 8)
    torch.testing.assert_close(z.norm(dim=1), torch.ones(4), rtol=1e-6, atol=1e-6)
    y = ae.decode(z).detach()
    assert y.shape == (4, channels, size, size) and float(y.min()) >= 0 and float(y.max()) <= 1
    with pytest.raises(ValueError, match="image_size"):
        BatchNormConvAutoEncoder(image_size=64)
    with pytest.raises(ValueError, match="width"):
        BatchNormConvAutoEncoder(width=0)


def test_batchnorm_conv_autoencoder_trains_on_public_digits(tmp_path):
    imgs = load_digits("train").images[:256]
    x = imgs.float() / 255
    torch.manual_seed(1)
    untrained = BatchNormConvAutoEncoder(1, 28, 8).eval()
    mse0 = float(((decode(untrained, encode(untrained, imgs)) - x) ** 2).mean())
    model, info = train_autoencoder(imgs, AutoEncoderConfig(arch="convbn", latent_dim=8, epochs=3, batch_size=32,
                                                            seed=1), cache_dir="", progress=False)
    assert not model.training and info["key"].startswith("ae_convbn_d8_")
    mse1 = float(((decode(model, encode(model, imgs)) - x) ** 2).mean())
    assert mse1 < 0.75 * mse0


def test_dcgan_autoencoder_shapes_and_sphere():
    torch.manual_seed(0)
    ae = DCGANAutoEncoder(channels=3, image_size=64, latent_dim=48, width=8).eval()
    z = ae.encode(torch.rand(3, 3, 64, 64))
    assert z.shape == (3, 48)
    torch.testing.assert_close(z.norm(dim=1), torch.ones(3), rtol=1e-6, atol=1e-6)
    assert ae.decode(z).shape == (3, 3, 64, 64)


def test_bad_arguments():
    with pytest.raises(ValueError, match="image_size"):
        ConvAutoEncoder(image_size=30)
    with pytest.raises(ValueError, match="arch"):
        AutoEncoderConfig(arch="vae").validate()
    with pytest.raises(ValueError, match="uint8"):
        train_autoencoder(torch.rand(4, 1, 28, 28), AutoEncoderConfig(epochs=1), cache_dir="")


def test_training_reduces_loss_and_cache_round_trip(tmp_path):
    imgs = load_digits("train").images[:256]
    cfg = AutoEncoderConfig(epochs=3, batch_size=32, seed=1)
    torch.manual_seed(1)
    untrained = ConvAutoEncoder(1, 28, 8)
    x = imgs.float() / 255
    mse0 = float(((decode(untrained, encode(untrained, imgs)) - x) ** 2).mean())
    model, info = train_autoencoder(imgs, cfg, cache_dir=str(tmp_path), progress=False)
    assert not info["cached"] and info["path"].startswith(str(tmp_path))
    mse1 = float(((decode(model, encode(model, imgs)) - x) ** 2).mean())
    assert mse1 < 0.75 * mse0  # 3 short epochs on 256 images: measured ratio about 0.6
    # the second call with the same data and config loads the cached weights
    again, info2 = train_autoencoder(imgs, cfg, cache_dir=str(tmp_path), progress=False)
    assert info2["cached"] and info2["key"] == info["key"]
    # one mean BCE per epoch, the last one is train_loss, kept through the cache
    assert len(info["train_loss_per_epoch"]) == 3 and info["train_loss_per_epoch"][-1] == info["train_loss"]
    assert info["train_loss_per_epoch"][-1] < info["train_loss_per_epoch"][0]
    assert info2["train_loss_per_epoch"] == info["train_loss_per_epoch"]
    for (k, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k
    # other data or another config: another key
    _, info3 = train_autoencoder(imgs[:128], cfg, cache_dir="", progress=False)
    assert info3["key"] != info["key"]
    _, info4 = train_autoencoder(imgs[:128], AutoEncoderConfig(epochs=1, batch_size=32, seed=2), cache_dir="",
                                 progress=False)
    assert info4["key"].split("_")[3] == info3["key"].split("_")[3]  # same data hash ...
    assert info4["key"] != info3["key"]                                # ... other config


def test_lr_schedule_validated_and_in_the_cache_key():
    with pytest.raises(ValueError, match="schedule"):
        AutoEncoderConfig(schedule="step").validate()
    imgs = load_digits("train").images[:64]
    cos = AutoEncoderConfig(epochs=1, batch_size=32, seed=3)
    assert cos.schedule == "cosine"
    m1, i1 = train_autoencoder(imgs, cos, cache_dir="", progress=False)
    m2, i2 = train_autoencoder(imgs, AutoEncoderConfig(epochs=1, batch_size=32, seed=3, schedule="constant"),
                               cache_dir="", progress=False)
    assert i1["key"] != i2["key"]
    # same first batch and learning rate, then the cosine run takes its second step at lr/2: other weights
    assert not all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))


def test_data_hash_sees_every_pixel():
    a = torch.zeros(3, 1, 8, 8, dtype=torch.uint8)
    b = a.clone()
    b[2, 0, 7, 7] = 1
    assert data_hash(a) != data_hash(b) and data_hash(a) == data_hash(a.clone())
    assert data_hash(a) != data_hash(a.view(3, 1, 4, 16))


def test_width_builds_the_network_and_enters_the_cache_key_only_when_set():
    from fastdpot.experiments.mainjob.autoencoder import _cache_key
    wide = build_autoencoder(AutoEncoderConfig(arch="convbn", latent_dim=8, width=12), 1, 28)
    assert wide.width == 12 and wide.enc[0].out_channels == 12 and wide.dec[-2].in_channels == 12
    assert build_autoencoder(AutoEncoderConfig(arch="convbn", latent_dim=8), 1, 28).width == 32
    assert build_autoencoder(AutoEncoderConfig(arch="dcgan", latent_dim=8, width=4), 3, 64).enc[0].out_channels == 4
    imgs = torch.zeros(2, 1, 28, 28, dtype=torch.uint8)
    base = AutoEncoderConfig(arch="convbn", latent_dim=8)
    assert _cache_key(imgs, base) != _cache_key(imgs, AutoEncoderConfig(arch="convbn", latent_dim=8, width=12))
    # a config without a width hashes as it did before the field existed (caches stay valid)
    import hashlib
    import json
    from dataclasses import asdict
    old = {k: v for k, v in asdict(base).items() if k != "width"}
    assert _cache_key(imgs, base).endswith(hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:12])
    with pytest.raises(ValueError, match="width"):
        AutoEncoderConfig(arch="conv", width=16).validate()
    with pytest.raises(ValueError, match="width"):
        AutoEncoderConfig(arch="convbn", width=0).validate()
