"""DP-Sinkhorn: the image-gradient sanitiser enforces the sensitivity it claims; training stops at the budget;
the caller's generator is trained, the global RNG left alone; the command line documents every option."""
import math

import pytest
import torch

from fastdpot.dp_sinkhorn import (DPSinkhornConfig, dp_sinkhorn_step, sanitize_image_gradient, sensitivity_factor,
                                  train_dp_sinkhorn)
from fastdpot.experiments.papers.dp_sinkhorn import ConditionalDCGANGenerator
from fastdpot.privacy import PrivacyAccountant, PrivacyBudget

F64 = torch.float64


def _generator(seed=0, latent_dim=4, channels=8):
    """A small conditional DCGAN with initial weights from ``seed`` (the global RNG left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ConditionalDCGANGenerator(latent_dim, 10, channels)


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
    with pytest.raises(ValueError, match="clip_radius"):
        sanitize_image_gradient(grad, 3, 0.0, 1.0)


def _tiny_data(n=120, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_step_releases_only_sanitised_gradient():
    # the generator's parameter gradient is the backpropagation of the sanitised image gradient: with z = 0 a
    # tiny clip norm makes it tiny, a huge clip norm does not -- the clip is what bounds what reaches the generator
    x, y = _tiny_data()
    cfg = DPSinkhornConfig(generated_batch_size=16, ratio=0.25, clip_radius=1e-3, blur=2.0)
    gen = _generator()
    labels = torch.arange(16) % 10
    g = torch.Generator().manual_seed(3)
    norm, sigma = dp_sinkhorn_step(gen, x[:20].flatten(1), y[:20], labels, cfg, 0.0, g)
    grads = [p.grad.clone() for p in gen.parameters()]
    # what the step returns is the norm of the released rows (here z = 0: the clipped gradient, norm <= C)
    assert 0 < norm <= cfg.clip_radius * (1 + 1e-5) and sigma == 0.0
    total = math.sqrt(sum(float(t.pow(2).sum()) for t in grads))
    gen.zero_grad()
    cfg_big = DPSinkhornConfig(**{**cfg.__dict__, "clip_radius": 1e3})
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
                           noise_multiplier=1.0, max_steps=10_000, ratio=0.25, accountant="rdp", blur=2.0)
    budget = PrivacyBudget(cfg.target_epsilon, cfg.delta, PrivacyAccountant("rdp"))
    model = _generator()
    res = train_dp_sinkhorn(x, y, model, cfg, budget=budget)
    assert res.generator is model and not model.training  # trained in place, left in eval mode
    assert res.stopped_by_budget and res.steps == budget.steps > 0
    assert res.epsilon <= cfg.target_epsilon
    assert not budget.can_spend(1.0, 20 / 200, sampling="poisson")
    # the reported ε is the accountant's, recomputed independently
    acc = PrivacyAccountant("rdp")
    acc.step(1.0, 20 / 200, num_steps=res.steps, sampling="poisson")
    assert acc.get_epsilon(1e-5) == pytest.approx(res.epsilon, rel=1e-6)
    assert res.sigma == pytest.approx(2 * cfg.clip_radius * 1.0)
    assert len(res.released_norms) == res.steps and all(math.isfinite(v) and v > 0 for v in res.released_norms)
    assert not hasattr(res, "losses")  # the unnoised loss on the private batch is not published


def test_calibrated_run_and_bad_input():
    x, y = _tiny_data(n=100)
    cfg = DPSinkhornConfig(target_epsilon=8.0, expected_batch_size=10, generated_batch_size=8, max_steps=3,
                           accountant="rdp", clipping="per_sample", blur=2.0)
    res = train_dp_sinkhorn(x, y, _generator(), cfg)
    assert res.steps == 3 and res.epsilon <= 8.0
    assert res.sigma == pytest.approx(res.noise_multiplier * cfg.clip_radius * 2 * math.sqrt(8))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        train_dp_sinkhorn(x * 2, y, _generator(), cfg)
    with pytest.raises(ValueError, match="clipping"):
        DPSinkhornConfig(clipping="none")
    cfg.clipping = "none"  # a field set after construction is checked when training starts
    with pytest.raises(ValueError, match="clipping"):
        train_dp_sinkhorn(x, y, _generator(), cfg)


class _Unconditional(torch.nn.Module):
    latent_dim = 4

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 784)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(model="dcgan"), TypeError, "model must be a torch.nn.Module"),
    (dict(model=_Unconditional()), ValueError, "num_classes"),
    (dict(model=ConditionalDCGANGenerator(4, 10, 8).requires_grad_(False)), ValueError, "no trainable"),
    (dict(model=ConditionalDCGANGenerator(4, 5, 8)), ValueError, r"labels must lie in \[0, model.num_classes"),
    (dict(labels=torch.rand(40)), ValueError, "labels must be an integer tensor"),
    (dict(labels=torch.zeros(39, dtype=torch.long)), ValueError, r"labels must have shape \(40,\)"),
    (dict(images=torch.rand(40, 1, 14, 14)), ValueError, r"rows of shape \(2, 196\), got \(2, 784\)"),
    (dict(images=torch.rand(40, 784, 1)), ValueError, "images must be"),
    (dict(config=dict(max_steps=1)), ValueError, "config must be a DPSinkhornConfig"),
    (dict(progress="yes"), ValueError, "progress"),
    (dict(budget=3.0), ValueError, "budget must be a PrivacyBudget"),
])
def test_training_refuses_bad_arguments_before_the_first_release(monkeypatch, kwargs, error, match):
    import fastdpot.dp_sinkhorn as mod

    def released(*a, **kw):
        raise AssertionError("a release was computed before the arguments were checked")

    monkeypatch.setattr(mod, "dp_sinkhorn_step", released)
    x, y = _tiny_data(n=40)
    call = dict(images=x, labels=y, model=_generator(), config=DPSinkhornConfig(
        expected_batch_size=10, generated_batch_size=8, max_steps=2, noise_multiplier=1.0, accountant="rdp"))
    call.update(kwargs)
    with pytest.raises(error, match=match):
        train_dp_sinkhorn(**call)


@pytest.mark.parametrize("field, value", [("target_epsilon", 0.0), ("delta", 1.0), ("expected_batch_size", 0),
                                          ("ratio", 1.5), ("clip_radius", -1.0), ("noise_multiplier", 0.0),
                                          ("max_steps", 0), ("lr", 0.0), ("blur", 0.0), ("scaling", 1.0),
                                          ("l1_weight", -1.0), ("accountant", "gdp"), ("seed", -1),
                                          ("secure_mode", 1)])
def test_config_is_validated_at_construction(field, value):
    with pytest.raises(ValueError, match=field):
        DPSinkhornConfig(**{field: value})


def test_config_takes_opacus_max_grad_norm_for_clip_radius():
    cfg = DPSinkhornConfig(max_grad_norm=1.5, target_delta=1e-6)
    assert cfg.clip_radius == 1.5 and cfg.delta == 1e-6 and cfg.max_grad_norm is None and cfg.target_delta is None
    with pytest.raises(ValueError, match="clip_radius or its alias max_grad_norm"):
        DPSinkhornConfig(clip_radius=2.0, max_grad_norm=1.0)


class _DropoutGenerator(torch.nn.Module):
    """A conditional generator that draws from the global RNG while training (dropout)."""

    def __init__(self):
        super().__init__()
        self.inner = _generator()
        self.latent_dim, self.num_classes = self.inner.latent_dim, self.inner.num_classes
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, z, labels):
        return self.drop(self.inner(z, labels))


@pytest.mark.parametrize("secure_mode", [True, False])
@pytest.mark.parametrize("dropout", [False, True])
def test_training_leaves_the_global_rng_as_the_caller_had_it(secure_mode, dropout):
    x, y = _tiny_data(n=60)
    cfg = DPSinkhornConfig(expected_batch_size=10, generated_batch_size=8, max_steps=2, noise_multiplier=1.0,
                           accountant="rdp", blur=2.0, secure_mode=secure_mode)
    model = _DropoutGenerator() if dropout else _generator()
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    res = train_dp_sinkhorn(x, y, model, cfg)
    assert res.steps == 2
    assert torch.equal(torch.get_rng_state(), before)


def test_replayable_run_depends_on_the_seed_and_the_initial_weights_only():
    x, y = _tiny_data(n=60)
    cfg = DPSinkhornConfig(expected_batch_size=10, generated_batch_size=8, max_steps=2, noise_multiplier=1.0,
                           accountant="rdp", blur=2.0, secure_mode=False, seed=3)
    a = train_dp_sinkhorn(x, y, _generator(0), cfg)
    torch.manual_seed(99)  # the global RNG plays no part
    b = train_dp_sinkhorn(x, y, _generator(0), cfg)
    assert a.released_norms == b.released_norms
    for p, q in zip(a.generator.parameters(), b.generator.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_command_line_help_describes_every_option(capsys):
    from fastdpot.experiments.papers.dp_sinkhorn import _parser, main

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "python -m fastdpot.experiments.papers.dp_sinkhorn" in text
    actions = [a for a in _parser()._actions if a.dest != "help"]
    assert len(actions) >= 14
    for action in actions:
        assert action.help and len(action.help) > 15, f"{action.option_strings} has no help"
        for opt in action.option_strings:
            assert opt in text
    assert "max_grad_norm" in text


def test_command_line_refuses_a_bad_option_value(capsys):
    from fastdpot.experiments.papers.dp_sinkhorn import main

    with pytest.raises(SystemExit) as exc:
        main(["--ratio", "2"])
    assert exc.value.code == 2 and "ratio" in capsys.readouterr().err
