"""Locally privatised data (Reshetova, Chen & Özgür): the entropic loss W_{2,2σ²} denoises, the others fit the noise."""

import pytest
import torch

from fastdpot.ldp import half_circle, half_circle_experiment, train_generator, wasserstein2
from fastdpot.sinkhorn import entropic_regularization_for_noise


def test_half_circle_and_w2():
    g = torch.Generator().manual_seed(0)
    x = half_circle(300, g)
    assert x.shape == (300, 2)
    assert torch.allclose(x.norm(dim=1), torch.ones(300), atol=1e-6) and bool((x[:, 1] >= 0).all())
    # exact W2 of a translation is the translation length
    assert wasserstein2(x, x + torch.tensor([0.3, 0.4])) == pytest.approx(0.5, abs=1e-6)


def test_entropic_loss_recovers_clean_half_circle_better():
    # reduced size: 300 privatised points, eps = 5, delta = 1e-4 Gaussian local mechanism (sigma ~ 1.8)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny dense problems: one thread avoids contention on a shared machine
    try:
        res = half_circle_experiment(num_points=300, steps=100, eval_points=300, backend="tensorized", lr=1e-2,
                                     tiny_blur=0.05, seed=0)
    finally:
        torch.set_num_threads(threads)
    assert res["reg"] == pytest.approx(2 * res["sigma"] ** 2)
    w2 = res["w2"]
    assert w2["entropic"] < 0.7 * w2["unregularized"], w2
    assert w2["entropic"] < 0.7 * w2["debiased"], w2
    # the losses that fit the noise end about as far from the clean data as the privatised data themselves
    assert w2["unregularized"] > 0.5 * res["w2_privatized"]


def test_bad_input():
    with pytest.raises(ValueError, match="loss"):
        train_generator(torch.randn(10, 2), 1.0, loss="mmd")
    with pytest.raises(ValueError, match="sigma"):
        train_generator(torch.randn(10, 2), 0.0)
    with pytest.raises(ValueError, match="sigma"):
        entropic_regularization_for_noise(-1.0)
