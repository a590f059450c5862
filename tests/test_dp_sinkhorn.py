"""DP-Sinkhorn: the image-gradient sanitiser enforces the sensitivity it claims; training stops at the budget."""
import math

import pytest
import torch

from fastdpot.dp_sinkhorn import (ConditionalDCGANGenerator, DPSinkhornConfig, dp_sinkhorn_step,
                                  sanitize_image_gradient, sensitivity_factor, train_dp_sinkhorn)
from fastdpot.privacy import PrivacyAccountant, PrivacyBudget

F64 = torch.float64


@pytest.mark.parametrize("clipping", ["joint", "per_sample"])
def test_clipped_release_difference_within_sensitivity(clipping):
    # two arbitrary gradients (neighbouring datasets can change every row): the clipped private blocks differ by
    # at most Δ = C·sensitivity_factor, attained by opposite rows
    B, D, C = 6, 5, 0.5
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        g1, g2 = 10 * torch.randn(B + 2, D, generator=g, dtype=F64), 10 * torch.randn(B + 2, D, generator=g, dtype=F64)
        s1, _ = sanitize_image_gradient(g1, B, C, 0.0, clipping)
        s2, _ = sanitize_image_gradient(g2, B, C, 0.0, clipping)
        assert float((s1[:B] - s2[:B]).norm()) <= C * sensitivity_factor(clipping, B) + 1e-12
    u = torch.zeros(B + 2, D, dtype=F64)
    u[:, 0] = 1.0
    s1, _ = sanitize_image_gradient(u, B, C, 0.0, clipping)
    s2, _ = sanitize_image_gradient(-u, B, C, 0.0, clipping)
    assert float((s1[:B] - s2[:B]).norm()) == pytest.approx(C * sensitivity_factor(clipping, B))
    assert sensitivity_factor("joint", B) == 2.0 and sensitivity_factor("per_sample", B) == pytest.approx(
        2 * math.sqrt(B))


def test_sanitiser_clip_noise_and_debias_rows():
    B, k, D, C, z = 40, 10, 50, 1.0, 0.7
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(B + k, D, generator=g, dtype=F64)
    grad[B:] *= 5.0
    grad[:3] *= 0.01  # small rows are untouched by per-sample clipping
    out, sigma, noise = sanitize_image_gradient(grad, B, C, z, "per_sample",
                                                secure_mode=False, generator=g, return_noise=True)
    assert sigma == pytest.approx(z * C * 2 * math.sqrt(B))
    clipped = out[:B] - noise
    assert torch.allclose(clipped[:3], grad[:3]) and float(clipped.norm(dim=1).max()) <= C + 1e-12
    # debiasing rows: clipped per row, no noise
    assert torch.allclose(out[B:], grad[B:] / grad[B:].norm(dim=1, keepdim=True) * C)
    # the noise is N(0, σ²): mean and standard deviation over B·D = 2000 entries
    assert abs(float(noise.mean())) < 4 * sigma / math.sqrt(B * D)
    assert float(noise.std()) == pytest.approx(sigma, rel=0.08)
    # joint clipping: the whole private block to Frobenius norm C, σ = 2Cz
    out, sigma, noise = sanitize_image_gradient(grad, B, C, z, "joint",
                                                secure_mode=False, generator=g, return_noise=True)
    assert sigma == pytest.approx(2 * C * z)
    assert float((out[:B] - noise).norm()) == pytest.approx(C)


def test_sanitiser_bad_input():
    grad = torch.randn(5, 3)
    with pytest.raises(ValueError, match="clipping"):
        sanitize_image_gradient(grad, 3, 1.0, 1.0, "rowwise")
    with pytest.raises(ValueError, match="num_private_rows"):
        sanitize_image_gradient(grad, 6, 1.0, 1.0)
    with pytest.raises(ValueError, match="clip_norm"):
        sanitize_image_gradient(grad, 3, 0.0, 1.0)


def _tiny_data(n=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_step_releases_only_sanitised_gradient():
    # the generator's parameter gradient is the backpropagation of the sanitised image gradient: with z = 0 a
    # tiny clip norm makes it tiny, a huge clip norm does not -- the clip is what bounds what reaches the generator
    x, y = _tiny_data()
    cfg = DPSinkhornConfig(generated_batch_size=16, ratio=0.25, clip_norm=1e-3, channels=8, latent_dim=4, blur=2.0)
    gen = ConditionalDCGANGenerator(cfg.latent_dim, 10, cfg.channels)
    labels = torch.arange(16) % 10
    g = torch.Generator().manual_seed(3)
    norm, sigma = dp_sinkhorn_step(gen, x[:20].flatten(1), y[:20], labels, cfg, 0.0, g)
    grads = [p.grad.clone() for p in gen.parameters()]
    # what the step returns is the norm of the released rows (here z = 0: the clipped gradient, norm <= C)
    assert 0 < norm <= cfg.clip_norm * (1 + 1e-5) and sigma == 0.0
    total = math.sqrt(sum(float(t.pow(2).sum()) for t in grads))
    gen.zero_grad()
    cfg_big = DPSinkhornConfig(**{**cfg.__dict__, "clip_norm": 1e3})
    dp_sinkhorn_step(gen, x[:20].flatten(1), y[:20], labels, cfg_big, 0.0, torch.Generator().manual_seed(3))
    total_big = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in gen.parameters()))
    assert total < 1e-2 * total_big
    # an empty Poisson batch still releases (noise only on the private rows), no crash
    gen.zero_grad()
    dp_sinkhorn_step(gen, x[:0].flatten(1), y[:0], labels, cfg, 1.0, g)
    assert all(torch.isfinite(p.grad).all() for p in gen.parameters() if p.grad is not None)


def test_training_stops_at_target_epsilon():
    x, y = _tiny_data(n=200)
    cfg = DPSinkhornConfig(target_epsilon=3.0, delta=1e-5, expected_batch_size=20, generated_batch_size=16,
                           noise_multiplier=1.0, max_steps=10_000, channels=8, latent_dim=4, ratio=0.25,
                           accountant="rdp", blur=2.0)
    budget = PrivacyBudget(cfg.target_epsilon, cfg.delta, PrivacyAccountant("rdp"))
    res = train_dp_sinkhorn(x, y, cfg, budget=budget)
    assert res.stopped_by_budget and res.steps == budget.steps > 0
    assert res.epsilon <= cfg.target_epsilon
    assert not budget.can_spend(1.0, 20 / 200, sampling="poisson")
    # the reported ε is the accountant's, recomputed independently
    acc = PrivacyAccountant("rdp")
    acc.step(1.0, 20 / 200, num_steps=res.steps, sampling="poisson")
    assert acc.get_epsilon(1e-5) == pytest.approx(res.epsilon, rel=1e-6)
    assert res.sigma == pytest.approx(2 * cfg.clip_norm * 1.0)
    assert len(res.released_norms) == res.steps and all(math.isfinite(v) and v > 0 for v in res.released_norms)
    assert not hasattr(res, "losses")  # the unnoised loss on the private batch is not published


def test_calibrated_run_and_bad_input():
    x, y = _tiny_data(n=100)
    cfg = DPSinkhornConfig(target_epsilon=8.0, expected_batch_size=10, generated_batch_size=8, max_steps=3,
                           channels=8, latent_dim=4, accountant="rdp", clipping="per_sample", blur=2.0)
    res = train_dp_sinkhorn(x, y, cfg)
    assert res.steps == 3 and res.epsilon <= 8.0
    assert res.sigma == pytest.approx(res.noise_multiplier * cfg.clip_norm * 2 * math.sqrt(8))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        train_dp_sinkhorn(x * 2, y, cfg)
    with pytest.raises(ValueError, match="clipping"):
        train_dp_sinkhorn(x, y, DPSinkhornConfig(clipping="none"))
