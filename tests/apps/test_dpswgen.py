"""DPSWgen on real data: training lowers the (held-out) loss, ε ≤ target, ε pinned against the accountant; the
caller's generator module is trained in place; every argument is refused before the first release."""
import math

import pytest
import torch

from fastdpot.dpswgen import train_dpswgen
from fastdpot.experiments.papers.dpswgen import ConvGenerator, MLPGenerator, evaluate_sw
from fastdpot.privacy import PrivacyAccountant


@pytest.fixture
def one_thread():
    """Small dense problems: one thread avoids OpenMP contention on a shared machine (10x on 2 busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _seeded(cls, seed, *args):
    """``cls(*args)`` with initial weights from ``seed``; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return cls(*args)


def _fashion_latents(n_public=5000, n_private=30000, dim=8):
    """Fashion-MNIST rows: a PCA 'encoder' fitted on a disjoint public part, latents on the unit sphere."""
    from fastdpot.experiments.data.datasets import load_fashion_mnist

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


def test_dpswgen_fashion_mnist_lowers_loss_within_budget(one_thread):
    zpub, zpriv = _fashion_latents()
    model = _seeded(MLPGenerator, 0, 8, 8)
    before = evaluate_sw(model, zpub, generator=torch.Generator().manual_seed(5))
    res = train_dpswgen(zpriv, model, 10.0, 1e-5, steps=150, batch_size=250, num_projections=40, secure_mode=False,
                        generator=torch.Generator().manual_seed(1), lr=2e-3, budget_checks=2, progress=False)
    after = evaluate_sw(res, zpub, generator=torch.Generator().manual_seed(5))
    assert res.generator is model  # trained in place, as Opacus trains the caller's model
    assert res.steps == 150 and res.details["steps_recorded"] == 150 and not res.stopped_by_budget
    assert res.epsilon <= 10.0 and res.epsilon > 9.0  # calibrated: spends (almost) all of the budget
    # δ: accountant part + T per-step sensitivity tails = δ
    assert res.details["delta_accountant_final"] + res.details["delta_tail_spent"] == pytest.approx(1e-5)
    assert res.noise_std == pytest.approx(res.details["noise_multiplier"] * res.details["sensitivity"])
    assert after < 0.9 * before, (before, after)


def test_dpswgen_with_noise_std_runs_every_step_and_reports_the_epsilon_spent(one_thread):
    # Opacus' make_private(noise_multiplier=...): σ fixed, all T steps run, the ε they spent is reported
    g = torch.Generator().manual_seed(0)
    n, B, T, delta = 2000, 100, 12, 1e-5
    data = torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=1)
    res = train_dpswgen(data, _seeded(MLPGenerator, 0, 4, 4), noise_std=2.0, delta=delta, steps=T, batch_size=B,
                        num_projections=35, secure_mode=False, generator=g, budget_checks=3, progress=False)
    assert res.steps == T and res.details["steps_recorded"] == T and not res.stopped_by_budget
    assert res.target_epsilon is None and res.noise_std == 2.0 and len(res.losses) == T
    z = res.details["noise_multiplier"]
    assert z == pytest.approx(2.0 / res.details["sensitivity"])
    # the ε reported is the accountant's at δ minus the T sensitivity tails, recomputed independently
    acc = PrivacyAccountant("rdp")
    acc.step(z, B / n, num_steps=T, sampling="without_replacement", dataset_size=n, batch_size=B)
    assert res.epsilon == pytest.approx(acc.get_epsilon(delta - T * res.details["delta_tail"]), rel=1e-9)
    assert 0 < res.epsilon < math.inf


def test_conv_generator_non_private_digits(one_thread):
    from sklearn.datasets import load_digits

    x = torch.tensor(load_digits().data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    model = _seeded(ConvGenerator, 0, 8, (1, 8, 8))
    before = evaluate_sw(model, x, generator=torch.Generator().manual_seed(3))
    res = train_dpswgen(x, model, math.inf, 1e-5, steps=60, batch_size=200, num_projections=50, clip_radius=8.0,
                        secure_mode=False, generator=torch.Generator().manual_seed(2), lr=5e-3, progress=False)
    assert math.isinf(res.epsilon) and res.noise_std == 0.0
    assert res.sample(5).shape == (5, 1, 8, 8)
    assert evaluate_sw(res, x, generator=torch.Generator().manual_seed(3)) < 0.5 * before


class _NoLatent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 3)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(batch_size=51), ValueError, "batch_size"),
    (dict(epsilon=-1.0), ValueError, "^epsilon must be > 0"),
    (dict(delta=1.5), ValueError, "delta"),
    (dict(clip_radius=0.0), ValueError, "clip_radius"),
    (dict(epsilon=1.0, noise_std=1.0), ValueError, "epsilon .* or noise_std .* not both"),
    (dict(epsilon=None, target_epsilon=1.0, noise_std=1.0), ValueError, "target_epsilon .* not both"),
    (dict(epsilon=math.inf, noise_std=1.0), ValueError, "not both"),
    (dict(epsilon=None), TypeError, "epsilon= .* or noise_std="),
    (dict(delta=None), TypeError, "delta="),
    (dict(steps=None), TypeError, "steps="),
    (dict(noise_std=0.0, epsilon=None), ValueError, "noise_std"),
    (dict(num_projections=0), ValueError, "num_projections"),
    (dict(p=3), ValueError, "^p must be"),
    (dict(lr=-1e-3), ValueError, "lr"),
    (dict(bound="hoeffding"), ValueError, "bound"),
    (dict(accountant="gdp"), ValueError, "accountant"),
    (dict(backend="cuda-fast"), ValueError, "backend"),
    (dict(budget_checks=0), ValueError, "budget_checks"),
    (dict(log_every=-1), ValueError, "log_every"),
    (dict(secure_mode="yes"), ValueError, "secure_mode"),
    (dict(progress=None), ValueError, "progress"),
    (dict(generator=7), TypeError, "generator"),
    (dict(release="histogram"), ValueError, "release"),
    (dict(release="sketch", sketch_bins=6), ValueError, "sketch_bins must be at most"),
    (dict(model="mlp"), TypeError, "model must be a torch.nn.Module"),
    (dict(model=_NoLatent()), ValueError, "latent_dim"),
    (dict(model=MLPGenerator(2, 4)), ValueError, r"rows of shape \(2, 3\), got \(2, 4\)"),
    (dict(model=MLPGenerator(2, 3).double()), ValueError, "torch.float64 but the data are torch.float32"),
    (dict(model=MLPGenerator(2, 3).requires_grad_(False)), ValueError, "no trainable parameter"),
])
def test_dpswgen_refuses_every_bad_argument_before_the_first_release(monkeypatch, kwargs, error, match):
    import fastdpot.dpswgen as mod

    def released(*args, **kw):
        raise AssertionError("a release was computed before the arguments were checked")

    monkeypatch.setattr(mod, "dp_sliced_wasserstein", released)
    monkeypatch.setattr(mod, "dp_sliced_wasserstein_noise_std", released)
    data = torch.randn(50, 3)
    model = MLPGenerator(2, 3)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    call = dict(model=model, epsilon=1.0, delta=1e-5, steps=2, batch_size=5, progress=False)
    call.update(kwargs)
    with pytest.raises(error, match=match):
        train_dpswgen(data, **call)
    for k, v in model.state_dict().items():  # nothing trained
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)


def test_dpswgen_refuses_data_of_another_shape_than_the_model_makes():
    with pytest.raises(ValueError, match=r"rows of shape \(2, 1, 8, 8\), got \(2, 64\)"):
        train_dpswgen(torch.rand(20, 1, 8, 8), MLPGenerator(2, 64), 1.0, 1e-5, steps=1, batch_size=5,
                      progress=False)
    with pytest.raises(ValueError, match=r"\(n, d\)"):
        train_dpswgen(torch.rand(20), MLPGenerator(2, 1), 1.0, 1e-5, steps=1, batch_size=5, progress=False)


def test_replayable_run_gives_the_same_losses_and_weights(one_thread):
    # secure_mode=False, a seeded generator and the same initial weights: latents, batches, directions and noise
    # all replay
    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(0))

    def go(seed):
        return train_dpswgen(x, _seeded(MLPGenerator, 0, 2, 4), noise_std=0.5, delta=1e-5, steps=4, batch_size=50,
                             num_projections=8, secure_mode=False, generator=torch.Generator().manual_seed(seed),
                             progress=False, budget_checks=1)

    a, b, c = go(1), go(1), go(2)
    assert a.losses == b.losses and a.losses != c.losses
    for p, q in zip(a.generator.parameters(), b.generator.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_sketch_release_takes_the_compiled_backend_with_the_reference_losses(one_thread):
    # the sketch is fused in the C++ kernel with the same keyed noise: backend="cpu" replays the reference's losses
    x = torch.randn(300, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def go(backend):
        return train_dpswgen(x, _seeded(MLPGenerator, 0, 2, 4).double(), noise_std=0.5, delta=1e-5, steps=3,
                             batch_size=50, num_projections=8, secure_mode=False, release="sketch", sketch_bins=5,
                             generator=torch.Generator().manual_seed(1), progress=False, budget_checks=1,
                             backend=backend)

    torch.testing.assert_close(torch.tensor(go("cpu").losses), torch.tensor(go("reference").losses),
                               rtol=1e-9, atol=1e-12)


def test_evaluate_sw_refuses_bad_data():
    model = MLPGenerator(2, 3)
    with pytest.raises(ValueError, match="data contains non-finite"):
        evaluate_sw(model, torch.tensor([[0.0, float("nan"), 1.0]]))
    with pytest.raises(ValueError, match="data must not be empty"):
        evaluate_sw(model, torch.zeros(0, 3))
