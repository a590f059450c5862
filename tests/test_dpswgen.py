"""DPSWgen on real data: training lowers the (held-out) loss, ε ≤ target, the budget is enforced."""
import math

import pytest
import torch

from fastdpot.dpswgen import ConvGenerator, MLPGenerator, evaluate_sw, train_dpswgen
from fastdpot.sliced import dp_sliced_wasserstein_noise_std


def _fashion_latents(n_public=5000, n_private=30000, dim=8):
    """Fashion-MNIST rows: a PCA 'encoder' fitted on a disjoint public part, latents on the unit sphere."""
    from fastdpot.mainjob.data.datasets import load_fashion_mnist

    try:
        imgs, _ = load_fashion_mnist("train")
    except FileNotFoundError as err:
        pytest.skip(f"Fashion-MNIST not installed: {err}")
    x = imgs.reshape(len(imgs), -1).float() / 255.0
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    pub, priv = x[perm[:n_public]], x[perm[n_public:n_public + n_private]]
    mu = pub.mean(0)
    v = torch.linalg.svd(pub - mu, full_matrices=False).Vh[:dim]

    def enc(a):
        return torch.nn.functional.normalize((a - mu) @ v.T, dim=1)

    return enc(pub), enc(priv)


def test_dpswgen_fashion_mnist_lowers_loss_within_budget():
    zpub, zpriv = _fashion_latents()
    torch.manual_seed(0)
    init = MLPGenerator(8, 8)
    before = evaluate_sw(init, zpub, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)  # same initial weights as `init`
    res = train_dpswgen(zpriv, 10.0, 1e-5, steps=150, batch_size=250, num_projections=40, latent_dim=8,
                        secure_mode=False, generator=torch.Generator().manual_seed(1), lr=2e-3, budget_checks=2)
    after = evaluate_sw(res, zpub, generator=torch.Generator().manual_seed(5))
    assert res.steps == 150 and res.details["steps_recorded"] == 150 and not res.stopped_by_budget
    assert res.epsilon <= 10.0 and res.epsilon > 9.0  # calibrated: spends (almost) all of the budget
    # δ: accountant part + T per-step sensitivity tails = δ
    assert res.details["delta_accountant_final"] + res.details["delta_tail_spent"] == pytest.approx(1e-5)
    assert res.noise_std == pytest.approx(res.details["noise_multiplier"] * res.details["sensitivity"])
    assert after < 0.9 * before, (before, after)


def test_dpswgen_stops_when_budget_is_spent():
    g = torch.Generator().manual_seed(0)
    data = torch.nn.functional.normalize(torch.randn(2000, 4, generator=g), dim=1)
    # σ calibrated for 40 steps; a run with a smaller σ must be refused by the budget before step 40
    sigma, det = dp_sliced_wasserstein_noise_std(2.0, 1e-5, 100, 2000, 40, 35, 4, 1.0)
    res2 = train_dpswgen(data, 2.0, 1e-5, steps=40, batch_size=100, num_projections=35, latent_dim=4,
                         secure_mode=False, generator=g, noise_std=0.75 * sigma, budget_checks=4)
    assert res2.details["noise_multiplier"] == pytest.approx(0.75 * det["noise_multiplier"])
    assert res2.stopped_by_budget and 0 < res2.steps < 40
    assert res2.epsilon <= 2.0 and res2.details["steps_recorded"] == res2.steps


def test_conv_generator_non_private_digits():
    from sklearn.datasets import load_digits

    x = torch.tensor(load_digits().data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    torch.manual_seed(0)
    init = ConvGenerator(8, (1, 8, 8))
    before = evaluate_sw(init, x, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    res = train_dpswgen(x, math.inf, 1e-5, steps=60, batch_size=200, num_projections=50, latent_dim=8,
                        model="conv", radius=8.0, secure_mode=False, generator=torch.Generator().manual_seed(2),
                        lr=5e-3)
    assert math.isinf(res.epsilon) and res.noise_std == 0.0
    assert res.sample(5).shape == (5, 1, 8, 8)
    assert evaluate_sw(res, x, generator=torch.Generator().manual_seed(3)) < 0.5 * before


def test_dpswgen_bad_input():
    data = torch.randn(50, 3)
    with pytest.raises(ValueError, match="batch_size"):
        train_dpswgen(data, 1.0, 1e-5, steps=2, batch_size=51)
    with pytest.raises(ValueError, match="epsilon"):
        train_dpswgen(data, -1.0, 1e-5, steps=2, batch_size=5)
    with pytest.raises(ValueError, match="delta"):
        train_dpswgen(data, 1.0, 1.5, steps=2, batch_size=5)
    with pytest.raises(ValueError, match="model"):
        train_dpswgen(data, 1.0, 1e-5, steps=2, batch_size=5, model="gan")
    with pytest.raises(ValueError, match="radius"):
        train_dpswgen(data, 1.0, 1e-5, steps=2, batch_size=5, radius=0.0)
    with pytest.raises(ValueError, match=r"\(n, C, H, W\)"):
        train_dpswgen(data, 1.0, 1e-5, steps=2, batch_size=5, model="conv")


def test_replayable_run_gives_the_same_losses_and_weights():
    # secure_mode=False with a seeded generator: initial weights, latents, batches, directions and noise all replay
    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(0))

    def go(seed):
        return train_dpswgen(x, 10.0, 1e-5, steps=4, batch_size=50, num_projections=8, secure_mode=False,
                             generator=torch.Generator().manual_seed(seed), progress=False)

    a, b, c = go(1), go(1), go(2)
    assert a.losses == b.losses and a.losses != c.losses
    for p, q in zip(a.generator.parameters(), b.generator.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
