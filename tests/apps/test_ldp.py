"""Locally privatised data (Reshetova, Chen & Özgür): the entropic loss W_{2,2σ²} denoises, the others fit the
noise; the caller's generator is trained with the global RNG left alone; W₂ refuses bad input."""

import pytest
import torch

from fastdpot.experiments.papers.ldp import MLPGenerator2D, half_circle, half_circle_experiment, wasserstein2
from fastdpot.ldp import train_generator
from fastdpot.sinkhorn import entropic_regularization_for_noise


def _model(seed=0, latent_dim=2):
    """An :class:`MLPGenerator2D` with initial weights from ``seed`` (the global RNG left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MLPGenerator2D(latent_dim)


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
        train_generator(_model(), torch.randn(10, 2), 1.0, loss="mmd")
    with pytest.raises(ValueError, match="sigma"):
        train_generator(_model(), torch.randn(10, 2), 0.0)
    with pytest.raises(ValueError, match="sigma"):
        entropic_regularization_for_noise(-1.0)


@pytest.mark.parametrize("args, kwargs, error, match", [
    (("mlp", torch.randn(10, 2), 1.0), {}, TypeError, "model must be a torch.nn.Module"),
    ((torch.nn.Linear(2, 2), torch.randn(10, 2), 1.0), {}, ValueError, "latent_dim"),
    ((MLPGenerator2D(), torch.randn(10, 3), 1.0), {}, ValueError, r"rows of shape \(2, 3\), got \(2, 2\)"),
    ((MLPGenerator2D(), torch.randn(10), 1.0), {}, ValueError, "data must have 2 dimensions"),
    ((MLPGenerator2D(), torch.full((10, 2), float("nan")), 1.0), {}, ValueError, "data contains non-finite"),
    ((MLPGenerator2D(), torch.randn(10, 2), 1.0), dict(backend="dense"), ValueError, "backend"),
    ((MLPGenerator2D(), torch.randn(10, 2), 1.0), dict(scaling=1.0), ValueError, "scaling"),
    ((MLPGenerator2D(), torch.randn(10, 2), 1.0), dict(lr=0.0), ValueError, "lr"),
    ((MLPGenerator2D(), torch.randn(10, 2), 1.0), dict(seed=-1), ValueError, "seed"),
])
def test_train_generator_refuses_bad_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        train_generator(*args, **kwargs)


@pytest.mark.parametrize("dropout", [False, True])
def test_train_generator_leaves_the_global_rng_as_the_caller_had_it(dropout):
    g = torch.Generator().manual_seed(0)
    data = half_circle(64, g) + 0.1 * torch.randn(64, 2, generator=g)
    model = _model()
    if dropout:  # a model that draws from the global RNG while training
        model.net.insert(1, torch.nn.Dropout(0.1))
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    info = {}
    out = train_generator(model, data, 0.5, steps=3, data_batch=32, backend="tensorized", info=info)
    assert out is model and info["steps_done"] == 3
    assert torch.equal(torch.get_rng_state(), before)


def test_train_generator_replays_from_the_seed_and_the_initial_weights():
    g = torch.Generator().manual_seed(0)
    data = half_circle(64, g) + 0.1 * torch.randn(64, 2, generator=g)
    a = train_generator(_model(3), data, 0.5, steps=3, data_batch=32, backend="tensorized", seed=5)
    torch.manual_seed(77)  # the global RNG plays no part
    b = train_generator(_model(3), data, 0.5, steps=3, data_batch=32, backend="tensorized", seed=5)
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_wasserstein2_refuses_bad_input():
    x = torch.randn(5, 2)
    with pytest.raises(ValueError, match="x contains non-finite"):
        wasserstein2(torch.tensor([[0.0, float("nan")]]), x)
    with pytest.raises(ValueError, match="y contains non-finite"):
        wasserstein2(x, torch.tensor([[float("inf"), 0.0]]))
    with pytest.raises(ValueError, match="x must not be empty"):
        wasserstein2(torch.zeros(0, 2), x)
    with pytest.raises(ValueError, match="y must not be empty"):
        wasserstein2(x, torch.zeros(0, 2))
    with pytest.raises(ValueError, match="x and y must have the same dimension d, got 2 and 3"):
        wasserstein2(x, torch.randn(5, 3))
    with pytest.raises(ValueError, match="y must have 2 dimensions"):
        wasserstein2(x, torch.randn(5))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        wasserstein2([[0.0, 1.0]], x)


# ------------------------------------------------------------------ devices, minibatches, W2 without POT, CLI
def test_experiment_checks_the_device():
    for bad in ("mps", "not-a-device", 3.5):
        with pytest.raises(ValueError, match="device"):
            half_circle_experiment(num_points=50, steps=1, eval_points=20, device=bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            half_circle_experiment(num_points=50, steps=1, eval_points=20, device="cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cli_cuda_without_cuda_is_a_clear_error(capsys):
    from fastdpot.experiments.papers.ldp import main

    with pytest.raises(SystemExit) as exc:
        main(["--device", "cuda", "--points", "50", "--steps", "1", "--eval-points", "20"])
    assert exc.value.code == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_cli_cpu_minibatches_and_out_file(tmp_path):
    import json

    from fastdpot.experiments.papers.ldp import main

    out = tmp_path / "sub" / "ldp.json"
    res = main(["--points", "400", "--steps", "3", "--data-batch", "64", "--eval-points", "50", "--device", "cpu",
                "--backend", "tensorized", "--replayable-noise", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["device"] == "cpu" and saved["data_batch"] == 64 and saved["num_points"] == 400
    assert saved["steps_done"] == {k: 3 for k in ("entropic", "unregularized", "debiased")}
    assert set(saved["w2"]) == {"entropic", "unregularized", "debiased"} and saved["w2"] == res["w2"]
    assert saved["w2_solver"] in ("pot", "assignment") and saved["total_seconds"] >= 0


def test_minibatch_training_budget_and_checks():
    g = torch.Generator().manual_seed(0)
    data = half_circle(200, g) + 0.1 * torch.randn(200, 2, generator=g)
    info = {}
    gen = train_generator(_model(), data, 0.5, "entropic", steps=7, data_batch=64, backend="tensorized", info=info)
    assert info["steps_done"] == 7 and gen.sample(5).shape == (5, 2)  # 3 epochs of 3 chunks: reshuffles
    info = {}
    train_generator(_model(), data, 0.5, "entropic", steps=10 ** 6, data_batch=64, backend="tensorized",
                    time_budget_s=0.05, info=info)
    assert 1 <= info["steps_done"] < 10 ** 6
    with pytest.raises(ValueError, match="data_batch"):
        train_generator(_model(), data, 0.5, data_batch=201)


def test_wasserstein2_without_pot_uses_the_exact_assignment(monkeypatch):
    import sys

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(150, 2, generator=g), torch.randn(150, 2, generator=g) + 0.5
    pytest.importorskip("ot")
    exact = wasserstein2(x, y, solver="pot")
    assert wasserstein2(x, y, solver="assignment") == pytest.approx(exact, rel=1e-9)
    monkeypatch.setitem(sys.modules, "ot", None)  # as on a machine without POT
    assert wasserstein2(x, y) == pytest.approx(exact, rel=1e-9)
    with pytest.raises(ValueError, match="as many points"):
        wasserstein2(x, y[:100])
    with pytest.raises(ValueError, match="solver"):
        wasserstein2(x, y, solver="sinkhorn")


@pytest.mark.cuda
def test_half_circle_experiment_on_cuda():
    res = half_circle_experiment(num_points=4000, steps=20, data_batch=512, eval_points=300, backend="tensorized",
                                 device="cuda", secure_mode=False, losses=("entropic",))
    assert res["device"].startswith("cuda") and res["steps_done"]["entropic"] == 20
    assert 0 < res["w2"]["entropic"] < 10


def test_cli_help_describes_every_option(capsys):
    from fastdpot.experiments.papers.ldp import _parser, main

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "python -m fastdpot.experiments.papers.ldp" in text
    actions = [a for a in _parser()._actions if a.dest != "help"]
    assert len(actions) >= 12
    for action in actions:
        assert action.help, f"{action.option_strings} has no help"
        for opt in action.option_strings:
            assert opt in text
