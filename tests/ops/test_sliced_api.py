"""The sliced Wasserstein API's conventions (issue 31): POT's call form (positional order, numpy in and out, sample
weights, default k, seed, log), ``directions="orthogonal"`` for the DP loss and its calibration against an independent
dp-accounting computation, the DP loss module's state (counter and calibration in ``state_dict``, read-only),
arguments refused at construction (too many projections, non-bool flags), errors naming ``private``, and the flows'
first-run calibration notice."""
import logging
import math

import numpy as np
import ot
import pytest
import torch

import fastdpot
from fastdpot import sliced as S
from fastdpot._ext import cpp_status
from fastdpot.privacy import BudgetExceededError

#: a clipping bound above every row's norm in these tests: the rows are not changed by it
NO_CLIP = 1e6
needs_cpp = pytest.mark.skipif(not cpp_status("sliced")[0], reason="C++ extension fastdpot._C_sliced not built")


def _clouds(n, m, d, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randn(m, d, generator=g, dtype=torch.float64) * 1.3 + 0.4
    a = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    b = torch.rand(m, generator=g, dtype=torch.float64) + 0.1
    return x.to(dtype), y.to(dtype), (a / a.sum()).to(dtype), (b / b.sum()).to(dtype)


# ------------------------------------------------------------------------------------------------ POT's call form
def test_pot_positional_call_numpy_in_and_out_default_50_directions():
    x, y, _, _ = _clouds(40, 33, 5)
    X, Y = x.numpy(), y.numpy()
    val, log = S.sliced_wasserstein(X, Y, None, None, 50, 2, None, 7, True)  # POT's positional order, seed 7, log
    assert isinstance(val, np.floating) and val.dtype == np.float64
    assert log["projections"].shape == (50, 5) and log["projected_emds"].shape == (50,)
    pot, pot_log = ot.sliced_wasserstein_distance(X, Y, projections=log["projections"].T, log=True)
    assert abs(val ** 0.5 - pot) <= 1e-12 * pot  # POT's value is the p-th root of ours
    np.testing.assert_allclose(log["projected_emds"], pot_log["projected_emds"], rtol=1e-12, atol=1e-15)
    # the default k is POT's 50, the same seed draws the same directions, and log=False agrees with log=True
    plain = S.sliced_wasserstein(X, Y, seed=7)
    assert isinstance(plain, np.floating) and abs(plain - val) <= 1e-12 * val
    assert S.sliced_wasserstein(X.astype(np.float32), Y.astype(np.float32), seed=7).dtype == np.float32
    # integer arrays are read as float64 (POT accepts them)
    ints = S.sliced_wasserstein(np.arange(12).reshape(6, 2), np.arange(12).reshape(6, 2) + 1, seed=1)
    assert isinstance(ints, np.floating) and ints > 0


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_pot_with_and_without_weights(p, kind, weighted):
    x, y, a, b = _clouds(37, 52, 4, seed=p + 3 * weighted)
    th = S.random_projections(11, 4, torch.Generator().manual_seed(5), dtype=torch.float64)
    args = (x, y, a, b) if weighted else (x, y)
    if kind == "numpy":
        args = tuple(t.numpy() for t in args)
    ours = S.sliced_wasserstein(*args, projections=th.numpy() if kind == "numpy" else th, p=p)
    pot = ot.sliced_wasserstein_distance(*args, projections=th.T.numpy() if kind == "numpy" else th.T, p=p)
    assert type(ours) is type(pot) or (torch.is_tensor(ours) and torch.is_tensor(pot))
    assert abs(float(ours) - float(pot) ** p) <= 1e-12 * max(1.0, float(pot) ** p)


@pytest.mark.parametrize("p", [1, 2])
def test_weighted_gradient_matches_pots_autograd(p):
    x, y, a, b = _clouds(23, 31, 3, seed=11)
    th = S.random_projections(7, 3, torch.Generator().manual_seed(2), dtype=torch.float64)
    ours_in = [t.clone().requires_grad_(True) for t in (x, y, a, b)]
    pot_in = [t.clone().requires_grad_(True) for t in (x, y, a, b)]
    S.sliced_wasserstein(*ours_in, projections=th, p=p).backward()
    (ot.sliced_wasserstein_distance(*pot_in, projections=th.T, p=p) ** p).backward()
    for i, (mine, theirs) in enumerate(zip(ours_in, pot_in)):
        want = theirs.grad
        if i >= 2:  # ours normalises the weights (w / Σw, Σw = 1 here): the gradient loses its component along 1
            want = want - (want * pot_in[i].detach()).sum()
        torch.testing.assert_close(mine.grad, want, rtol=1e-9, atol=1e-12)


@needs_cpp
def test_uniform_weights_keep_the_fast_path_and_others_need_the_reference():
    x, y, a, b = _clouds(30, 30, 3, seed=4)
    th = S.random_projections(6, 3, torch.Generator().manual_seed(0), dtype=torch.float64)
    u = torch.full((30,), 1 / 30, dtype=torch.float64)
    # uniform weights are no weights: the cpu backend accepts them and gives the unweighted value
    assert float(S.sliced_wasserstein(x, y, u, 3 * u, projections=th, backend="cpu")) == pytest.approx(
        float(S.sliced_wasserstein(x, y, projections=th, backend="cpu")), rel=1e-13)
    with pytest.raises(ValueError, match="reference backend"):
        S.sliced_wasserstein(x, y, a, b, projections=th, backend="cpu")
    # unnormalised weights are normalised; doubling one side's weights changes nothing
    assert float(S.sliced_wasserstein(x, y, 2 * a, b, projections=th)) == pytest.approx(
        float(S.sliced_wasserstein(x, y, a, b, projections=th)), rel=1e-13)


def test_pot_form_bad_arguments():
    x, y, a, b = _clouds(10, 12, 3)
    sw = S.sliced_wasserstein
    with pytest.raises(TypeError, match="pass the number of directions as num_projections="):
        sw(x, y, 20)  # the former positional k lands on the weights a
    with pytest.raises(TypeError, match="both be torch tensors or both numpy"):
        sw(x.numpy(), y)
    for bad, match in ((-a, "nonnegative"), (a[:5], r"shape \(10,\)"), (a.float(), "dtype"),
                       (torch.full((10,), math.nan, dtype=torch.float64), "non-finite"), (0 * a, "positive sum")):
        with pytest.raises(ValueError, match=match):
            sw(x, y, bad, b)
    with pytest.raises(ValueError, match="POT's projections are"):  # POT's (d, k) layout, k != d
        sw(x, y, projections=S.random_projections(7, 3, torch.Generator().manual_seed(0),
                                                  dtype=torch.float64).T.contiguous())
    with pytest.raises(ValueError, match="log must be a bool"):
        sw(x, y, log="yes")
    # a numpy RandomState seed (POT's) is one integer drawn from it: replayable
    v1 = sw(x.numpy(), y.numpy(), seed=np.random.RandomState(3))
    assert v1 == sw(x.numpy(), y.numpy(), seed=np.random.RandomState(3))


# ------------------------------------------------------------------------------------ orthogonal directions, loss
def test_orthogonal_calibration_against_dp_accounting():
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting import rdp

    eps, delta, B, n, T, k, d, r = 3.0, 1e-5, 40, 400, 30, 16, 8, 1.5
    sigma, det = S.dp_sliced_wasserstein_noise_std(eps, delta, B, n, T, k, d, r, directions="orthogonal")
    assert det["delta_tail"] == 0.0 and det["delta_accountant"] == delta and det["directions"] == "orthogonal"
    assert det["sensitivity"] == pytest.approx(2 * r * math.sqrt(math.ceil(k / d)), rel=1e-15)
    z = sigma / (2 * r * math.sqrt(2))

    def spent(mult):  # independent: dp-accounting's RDP accountant, fixed-size batches without replacement
        acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        event = dp_accounting.SampledWithoutReplacementDpEvent(n, B, dp_accounting.GaussianDpEvent(mult))
        acc.compose(dp_accounting.SelfComposedDpEvent(event, T))
        return acc.get_epsilon(delta)

    assert spent(z) <= eps * (1 + 1e-6) and spent(z * 0.98) > eps  # within the calibration's tolerance
    # all of δ goes to the accountant and the block bound is below the uniform tail bound: less noise
    sigma_u, _ = S.dp_sliced_wasserstein_noise_std(eps, delta, B, n, T, k, d, r)
    assert sigma < sigma_u
    mod = S.DPSlicedWassersteinLoss.from_privacy(eps, delta, B, n, T, k, d, r, directions="orthogonal")
    assert mod.noise_std == sigma and mod.directions == "orthogonal" and "orthogonal" in repr(mod)


def test_orthogonal_loss_draws_orthonormal_blocks():
    x, y, _, _ = _clouds(20, 25, 4, seed=6)
    loss = S.DPSlicedWassersteinLoss(0.3, 10, clip_radius=NO_CLIP, directions="orthogonal", secure_mode=False,
                                     generator=torch.Generator().manual_seed(9), backend="reference")
    got = loss(y, private=x)
    g = torch.Generator().manual_seed(9)
    th = S.random_projections(10, 4, g, orthogonal=True, dtype=torch.float64)
    assert torch.allclose(th[:4] @ th[:4].T, torch.eye(4, dtype=torch.float64), atol=1e-12)
    want = S.dp_sliced_wasserstein(y, private=x, noise_std=0.3, clip_radius=NO_CLIP, projections=th, generator=g,
                                   secure_mode=False,
                                   backend="reference", directions="orthogonal")
    assert float(got) == float(want)
    with pytest.raises(ValueError, match="orthonormal"):  # given directions must be such blocks
        S.dp_sliced_wasserstein(y, private=x, noise_std=0.3, clip_radius=NO_CLIP,
                                projections=S.random_projections(8, 4, g),
                                directions="orthogonal")
    with pytest.raises(ValueError, match="directions"):
        S.DPSlicedWassersteinLoss(0.3, 10, directions="sobol")


# ------------------------------------------------------------------------------------------- the module's state
def _module(**kw):
    return S.DPSlicedWassersteinLoss.from_privacy(8.0, 1e-5, 10, 10, 2, 4, 3, 1.0, **kw)  # q = 1: fast


def test_state_dict_holds_the_counter_and_a_reload_does_not_reset_the_budget(tmp_path):
    x, y = torch.randn(10, 3), torch.randn(12, 3)
    crit = _module()
    crit(y, private=x)
    crit(y, private=x)
    path = tmp_path / "loss.pt"
    torch.save(crit.state_dict(), path)
    state = torch.load(path, weights_only=True)  # plain values: no code runs at load
    assert state["_extra_state"]["releases"] == 2
    fresh = _module()
    fresh.load_state_dict(state)
    assert fresh.releases == 2 and fresh.epsilon() == crit.epsilon()
    with pytest.raises(BudgetExceededError):  # 2 calibrated releases, both made before the checkpoint
        fresh(y, private=x)
    # a state behind the live count, an empty state, an edited noise: refused, the module unchanged
    with pytest.raises(ValueError, match="behind"):
        crit.load_state_dict(_module().state_dict())
    for bad in ({}, dict(state, _extra_state=None)):
        with pytest.raises((ValueError, RuntimeError)):
            _module().load_state_dict(bad)
    with pytest.raises(ValueError, match="_extra_state"):
        _module().load_state_dict({}, strict=False)
    edited = {"_extra_state": dict(state["_extra_state"], noise_std=state["_extra_state"]["noise_std"] / 4)}
    with pytest.raises(ValueError, match="noise_std"):
        _module().load_state_dict(edited)
    det = dict(state["_extra_state"]["privacy"], noise_multiplier=0.01)
    with pytest.raises(ValueError, match="privacy"):
        _module().load_state_dict({"_extra_state": dict(state["_extra_state"], privacy=det)})
    with pytest.raises(ValueError, match="releases"):
        _module().load_state_dict({"_extra_state": dict(state["_extra_state"], releases=3)})  # > steps
    assert crit.releases == 2


def test_counters_and_calibration_are_read_only():
    crit = _module()
    crit(torch.randn(12, 3), private=torch.randn(10, 3))
    for name, value in (("releases", 0), ("noise_std", 0.0), ("clip_radius", 100.0), ("num_projections", 1),
                        ("release", "sketch"), ("directions", "orthogonal")):
        with pytest.raises(AttributeError, match="read-only"):
            setattr(crit, name, value)
    crit.privacy["steps"] = 10 ** 6  # a copy
    assert crit.privacy["steps"] == 2 and crit.releases == 1


# ------------------------------------------------------------------------------------------------------ arguments
def test_too_many_projections_refused_at_construction():
    big = 10 ** 12
    with pytest.raises(ValueError, match=r"k·d <= 2\^31"):
        fastdpot.DPSlicedWassersteinFlow(10, 2, big, 0.5)
    with pytest.raises(ValueError, match="pool_size"):
        fastdpot.DPSlicedWassersteinFlow(10, 4, 2 ** 28, 0.5, variant="presampled")  # a 10·k pool does not fit
    with pytest.raises(ValueError, match=r"k·d <= 2\^31"):
        S.SlicedWassersteinLoss(big)
    with pytest.raises(ValueError, match=r"k·d <= 2\^31"):
        S.DPSlicedWassersteinLoss(0.5, big)
    with pytest.raises(ValueError, match=r"k <= 2147483648 for any d"):
        S.DPSlicedWassersteinLoss(0.5, 2 ** 31 + 1)
    with pytest.raises(ValueError, match=r"k <= 715827882 here"):
        S.dp_sliced_wasserstein_noise_std(1.0, 1e-5, 10, 100, 5, 2 ** 30, 3, 1.0)
    with pytest.raises(ValueError, match=r"k·d <= 2\^31"):
        S.dp_sliced_wasserstein(torch.randn(4, 3), private=torch.randn(4, 3), noise_std=1.0, clip_radius=NO_CLIP,
                                num_projections=big)


def test_sinkhorn_flags_must_be_bools():
    from fastdpot.sinkhorn import SinkhornLoss, sinkhorn, squared_euclidean

    x, y = torch.randn(6, 2), torch.randn(7, 2)
    for kw in (dict(debias="yes"), dict(debias=1), dict(debias=None), dict(return_potentials="no")):
        with pytest.raises(ValueError, match="must be a bool"):
            sinkhorn(x, y, **kw)
    with pytest.raises(ValueError, match="debias must be a bool"):
        sinkhorn(x[None], y[None], debias="yes")  # the batched path too
    with pytest.raises(ValueError, match="debias must be a bool"):
        SinkhornLoss(debias="yes")
    with pytest.raises(ValueError, match="half must be a bool"):
        squared_euclidean(half="yes")
    assert torch.isfinite(sinkhorn(x, y, debias=False))


@pytest.mark.parametrize("kw", [dict(), dict(clip_radius=1.0), dict(release="sketch", sketch_bins=2)])
def test_non_finite_private_rows_are_named_private(kw):
    bad = torch.randn(8, 3)
    bad[2, 1] = math.inf
    with pytest.raises(ValueError, match=r"^private contains non-finite"):
        S.dp_sliced_wasserstein(torch.randn(8, 3), private=bad, noise_std=0.1, num_projections=4, **kw)
    crit = S.DPSlicedWassersteinLoss(0.1, 4, clip_radius=1.0)
    with pytest.raises(ValueError, match=r"^private contains"):
        crit(torch.randn(8, 3), private=bad)
    assert crit.releases == 0


# --------------------------------------------------------------------------------------------------- flows
def test_first_run_says_it_calibrates(capsys, caplog):
    flow = fastdpot.DPSlicedWassersteinFlow(12, 2, 3, 0.5, target_epsilon=8.0, batch_size=20, steps=2,
                                            secure_mode=False, generator=torch.Generator().manual_seed(0))
    data = torch.randn(20, 2, generator=torch.Generator().manual_seed(1))  # q = 1: a fast calibration
    with caplog.at_level(logging.INFO, logger="fastdpot.flow"):
        flow.run(data, steps=1, progress=True)
    err = capsys.readouterr().err
    assert "calibrating the noise multiplier for ε=8" in err
    assert err.index("calibrating") < err.index("DP-SW flow: ", err.index("calibrating") + 1)  # before the steps
    assert any("z = " in r.getMessage() for r in caplog.records)
    flow.run(data, steps=1, progress=True)  # calibrated once: the second run says nothing of it
    assert "calibrating" not in capsys.readouterr().err
    quiet = fastdpot.DPSlicedWassersteinFlow(12, 2, 3, 0.5, target_epsilon=8.0, batch_size=20, steps=2)
    quiet.run(data, steps=1, progress=False)
    assert "calibrating" not in capsys.readouterr().err


# --------------------------------------------------------------------------- no release without a clipping bound
def test_a_private_loss_with_noise_needs_a_clipping_bound():
    """Issue 37.5: noise without a bound on the private rows protects nothing, so σ > 0 needs a finite clip_radius
    (or an explicit inf, which warns); σ = 0 (the non-private distance) needs none."""
    y, x = torch.randn(6, 3), torch.randn(5, 3) * 10
    with pytest.raises(ValueError, match="clip_radius"):
        S.dp_sliced_wasserstein(y, private=x, noise_std=0.5, num_projections=8)
    with pytest.raises(ValueError, match="clip_radius"):
        S.DPSlicedWassersteinLoss(0.5, 8)
    with pytest.raises(ValueError, match="clip_radius"):
        S.DPSlicedWassersteinLoss(0.5, 8, release="sketch", sketch_bins=2)
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="clip_radius"):
            S.dp_sliced_wasserstein(y, private=x, noise_std=0.5, num_projections=8, clip_radius=bad)
    # the explicit choice of no bound: released, with a warning that no guarantee holds
    g = torch.Generator().manual_seed(3)
    th = S.random_projections(8, 3, g)
    with pytest.warns(UserWarning, match="no differential-privacy guarantee"):
        got = S.dp_sliced_wasserstein(y, private=x, noise_std=0.5, projections=th, clip_radius=math.inf,
                                      secure_mode=False, generator=torch.Generator().manual_seed(1))
    want = S.dp_sliced_wasserstein(y, private=x, noise_std=0.5, projections=th, clip_radius=1e6,  # clips nothing
                                   secure_mode=False, generator=torch.Generator().manual_seed(1))
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    with pytest.warns(UserWarning, match="no differential-privacy guarantee"):
        crit = S.DPSlicedWassersteinLoss(0.5, 8, clip_radius=math.inf)
    assert crit.clip_radius == math.inf and crit.state_dict()["_extra_state"]["clip_radius"] == math.inf
    # a finite bound clips: the rows of norm ~17 are pulled onto the ball of radius 1
    small = S.dp_sliced_wasserstein(y, private=x, noise_std=0.0, projections=th, clip_radius=1.0)
    assert float(small) < float(S.dp_sliced_wasserstein(y, private=x, noise_std=0.0, projections=th))
    # σ = 0: the non-private distance needs no bound, and says nothing
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        S.dp_sliced_wasserstein(y, private=x, noise_std=0.0, num_projections=8)
        S.DPSlicedWassersteinLoss(0.0, 8)(y, private=x)
