"""A tuning stand-in (n public rows standing in for the n_real private ones, ``calibration_size``) is released at
its own noise multiplier z·n/n_real, the real run's noise relative to its sums, through the public releases' own
arguments: no public release takes a ``noise_scale`` below 1, which would state (or be accounted at) an ε its noise
does not give. Issue 46."""
import pytest
import torch

import fastdpot.experiments.mainjob.oneshot as oneshot_mod
import fastdpot.privacy.class_sketch as class_sketch
import fastdpot.privacy.moments as moments
from fastdpot.experiments.mainjob import MainJobConfig
from fastdpot.experiments.mainjob.generation import generate_gaussian
from fastdpot.privacy.composition import ComposedLedger

N, N_REAL = 300, 55_000


class _Stop(Exception):
    pass


def _spy(monkeypatch, module, name, calls, stop=False):
    real = getattr(module, name)

    def spy(*args, **kwargs):
        z = kwargs["noise_multiplier"] if "noise_multiplier" in kwargs else args[3]
        calls[name] = (z, kwargs.get("noise_scale", 1.0))
        if stop:
            raise _Stop  # the flows after the release are not what this test is about
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)


def test_the_one_shot_stand_in_releases_at_its_own_noise_multiplier(monkeypatch):
    calls = {}
    _spy(monkeypatch, moments, "release_class_means", calls)
    _spy(monkeypatch, class_sketch, "class_quantile_sketch", calls, stop=True)
    g = torch.Generator().manual_seed(0)
    images, labels = torch.rand(N, 784, generator=g), torch.arange(N) % 10
    cfg = MainJobConfig(epsilon=4.0, replayable_noise=True).with_settings(public_size=0,
                                                                         sketch_blocks="28/0/0").resolved()
    led = ComposedLedger(4.0, 1e-5)
    with pytest.raises(_Stop):
        oneshot_mod.generate_oneshot(cfg, images, labels, 50, 1, ledger=led, num_classes=10, image_shape=(1, 28, 28),
                                     calibration_size=N_REAL, noise_multiplier=3.0)  # z given: no calibration
    stages = {s["stage"]: s for s in led.stages}
    assert set(calls) == {"release_class_means", "class_quantile_sketch"} == {
        {"means": "release_class_means", "sketch": "class_quantile_sketch"}[k] for k in stages}
    for stage, fn in (("means", "release_class_means"), ("sketch", "class_quantile_sketch")):
        z, scale = calls[fn]
        assert scale >= 1.0, (fn, scale)
        assert stages[stage]["event"]["dataset_size"] == N_REAL  # the ledger accounts the real run's z
        assert z * scale == pytest.approx(stages[stage]["noise_multiplier"] * N / N_REAL, rel=1e-12)


def test_the_gaussian_stand_in_releases_at_its_own_noise_multiplier(monkeypatch):
    calls = {}
    _spy(monkeypatch, moments, "release_class_moments", calls)
    lat = torch.nn.functional.normalize(torch.randn(N, 4, generator=torch.Generator().manual_seed(1)), dim=1)
    cfg = MainJobConfig(epsilon=2.0).with_settings(public_size=0, method="gaussian").resolved()
    led = ComposedLedger(2.0, 1e-5)
    generate_gaussian(cfg, lat, torch.arange(N) % 10, 100, 2, ledger=led, num_classes=10, calibration_size=N_REAL,
                      noise_multiplier=3.0)
    z, scale = calls["release_class_moments"]
    assert scale >= 1.0
    assert z * scale == pytest.approx(led.stages[0]["noise_multiplier"] * N / N_REAL, rel=1e-12)
