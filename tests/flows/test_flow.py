"""DPSlicedWassersteinFlow / ClassConditionalFlow: privacy accounting vs an independent dp-accounting computation,
noise calibration, budget stop, checkpoint/resume, a 2-D toy target, clipping inside the mechanism, bad input."""
import math

import dp_accounting
import pytest
import torch
from dp_accounting.rdp import RdpAccountant
from scipy.stats import norm

import fastdpot
from fastdpot.flows import INIT_KINDS, ClassConditionalFlow, DPSlicedWassersteinFlow, NonFiniteParticlesError, draw_init
from fastdpot.privacy import DEFAULT_ORDERS, BudgetExceededError
from fastdpot.reference.sliced import sliced_wasserstein

from ._crash import Kill, crash_in_step


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _mixture(n, seed=0):
    g = _gen(seed)
    centers = torch.tensor([[2.0, 2.0], [-2.0, -2.0], [2.0, -2.0]])
    lab = torch.randint(0, 3, (n,), generator=g)
    return centers[lab] + 0.3 * torch.randn(n, 2, generator=g), lab


def _sw2(a, b):
    th = torch.randn(200, a.shape[1], generator=_gen(99), dtype=torch.float64)
    th = th / th.norm(dim=1, keepdim=True)
    return float(sliced_wasserstein(a.double(), b.double(), th, p=2))


def _independent_epsilon(z, n, batch, steps, delta):
    acc = RdpAccountant(orders=list(DEFAULT_ORDERS), neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.SampledWithoutReplacementDpEvent(n, batch, dp_accounting.GaussianDpEvent(z))
    acc.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return acc.get_epsilon(delta)


def _bernstein_w(k, d, delta_t):
    # Rakotomamonjy & Ralaivola, ICML 2021, transcribed independently of fastdpot.privacy
    L = math.log(1 / delta_t)
    return k / d + (2 / 3) * L + (2 / d) * math.sqrt(k * (d - 1) / (d + 2) * L)


# ------------------------------------------------------------------------------------------------ privacy
def test_epsilon_and_noise_match_independent_computation():
    n, B, T, z, k, d, delta, r = 600, 50, 30, 1.3, 40, 8, 1e-5, 1.5
    data = torch.randn(n, d, generator=_gen(1))
    f = DPSlicedWassersteinFlow(64, d, k, 1.0, noise_multiplier=z, delta=delta, clip_radius=r, batch_size=B, steps=T,
                                bound="bernstein", secure_mode=False, generator=_gen(2))
    delta_tail = delta / (2 * T)
    assert f.delta_split == pytest.approx((delta / 2, delta_tail))
    assert f.sensitivity == pytest.approx(2 * r * math.sqrt(_bernstein_w(k, d, delta_tail)), rel=1e-12)
    assert f.noise_std == pytest.approx(z * f.sensitivity, rel=1e-12)
    assert f.epsilon() == 0.0
    f.run(data, progress=False)
    assert f.steps_taken == T
    assert f.epsilon() == pytest.approx(_independent_epsilon(z, n, B, T, delta / 2), rel=1e-9)
    # at a larger total δ only the accountant part grows: δ' − T·δ_tail
    assert f.epsilon(1e-4) == pytest.approx(_independent_epsilon(z, n, B, T, 1e-4 - delta / 2), rel=1e-9)
    with pytest.raises(ValueError, match="delta"):
        f.epsilon(delta / 4)


def test_clt_sensitivity_and_sample_rate():
    k, d, T, delta = 70, 8, 20, 1e-5
    f = DPSlicedWassersteinFlow(32, d, k, 1.0, noise_multiplier=2.0, delta=delta, sample_rate=0.1, steps=T,
                                bound="clt", secure_mode=False, generator=_gen(3))
    dt = delta / (2 * T)
    w = k / d + (norm.isf(dt) / d) * math.sqrt(2 * k * (d - 1) / (d + 2))
    assert f.sensitivity == pytest.approx(2 * math.sqrt(w), rel=1e-9)
    data = torch.randn(333, d, generator=_gen(4))
    f.run(data, progress=False)
    # batch size = round(q·n) = 33; accounted without replacement at q = 33/333
    assert f.epsilon() == pytest.approx(_independent_epsilon(2.0, 333, 33, T, delta / 2), rel=1e-9)


def test_default_bound_is_the_proven_chernoff_bound():
    from fastdpot.privacy import sliced_sensitivity

    k, d, T, delta = 70, 8, 20, 1e-5
    flows = {b: DPSlicedWassersteinFlow(32, d, k, 1.0, noise_multiplier=1.0, delta=delta, batch_size=5, steps=T,
                                        bound=b, secure_mode=False, generator=_gen(3))
             for b in ("clt", "bernstein", "chernoff")}
    default = DPSlicedWassersteinFlow(32, d, k, 1.0, noise_multiplier=1.0, delta=delta, batch_size=5, steps=T,
                                      secure_mode=False, generator=_gen(3))
    dt = delta / (2 * T)
    assert default.sensitivity == flows["chernoff"].sensitivity == sliced_sensitivity(k, d, dt, "chernoff", 2.0)
    assert flows["clt"].sensitivity < flows["chernoff"].sensitivity < flows["bernstein"].sensitivity


@pytest.mark.parametrize("variant", ["resample", "presampled"])
def test_orthogonal_directions_deterministic_sensitivity(variant):
    n, B, T, z, k, d, delta, r = 400, 40, 10, 1.1, 20, 8, 1e-5, 1.0
    data = torch.randn(n, d, generator=_gen(21))
    kw = dict(pool_size=30) if variant == "presampled" else {}
    f = DPSlicedWassersteinFlow(64, d, k, 1.0, noise_multiplier=z, delta=delta, clip_radius=r, batch_size=B, steps=T,
                                directions="orthogonal", variant=variant, secure_mode=False, generator=_gen(22), **kw)
    # ⌈20/8⌉ = 3 blocks: Δ = 2r·sqrt(3) for every draw, no tail -- the accountant gets all of δ
    assert f.sensitivity == pytest.approx(2 * r * math.sqrt(3), rel=1e-12)
    assert f.delta_split == (delta, 0.0)
    for _ in range(5):
        th = f._directions().double()
        assert th.shape == (k, d)
        torch.testing.assert_close(th.norm(dim=1), torch.ones(k, dtype=torch.float64), rtol=0, atol=1e-6)
        # the worst row difference (top right singular vector of Θ) stays within the bound
        assert float(torch.linalg.matrix_norm(th, 2)) ** 2 <= 3 + 1e-5
        for b in range(2):  # full blocks are orthonormal
            blk = th[b * d:(b + 1) * d]
            torch.testing.assert_close(blk @ blk.T, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-5)
    if variant == "presampled":
        assert f._pool.shape == (32, d)  # whole blocks: ⌈30/8⌉ = 4
    f.run(data, progress=False)
    assert f.epsilon() == pytest.approx(_independent_epsilon(z, n, B, T, delta), rel=1e-9)


def test_orthogonal_directions_are_marginally_uniform():
    from fastdpot._random import random_projections

    th = random_projections(6000, 3, _gen(23), orthogonal=True)
    # uniform on S²: each coordinate is U(-1, 1) (Archimedes), so mean 0 and variance 1/3
    assert float(th.mean(0).abs().max()) < 0.03
    torch.testing.assert_close(th.pow(2).mean(0), torch.full((3,), 1 / 3, dtype=torch.float64), rtol=0, atol=0.02)
    from scipy.stats import kstest
    assert kstest(th[:, 0].numpy(), "uniform", args=(-1, 2)).pvalue > 1e-4


def test_presampled_variant_composes_every_step():
    n, B, T, z = 500, 50, 25, 1.0
    data = torch.randn(n, 8, generator=_gen(5))
    f = DPSlicedWassersteinFlow(64, 8, 40, 1.0, noise_multiplier=z, batch_size=B, steps=T, variant="presampled",
                                pool_size=100, secure_mode=False, generator=_gen(6))
    assert f._pool.shape == (100, 8)
    f.run(data, progress=False)
    eps = f.epsilon()
    assert eps > 0 and eps == pytest.approx(_independent_epsilon(z, n, B, T, 0.5e-5), rel=1e-9)


def test_target_epsilon_calibrates_and_spends_the_budget():
    n, B, T = 400, 40, 15
    data = torch.randn(n, 8, generator=_gen(7))
    f = DPSlicedWassersteinFlow(64, 8, 40, 1.0, target_epsilon=4.0, batch_size=B, steps=T,
                                secure_mode=False, generator=_gen(8))
    assert f.noise_multiplier is None  # calibrated at the first run(), when n is known
    f.run(data, progress=False)
    assert f.steps_taken == T
    z = f.noise_multiplier
    assert f.noise_std == pytest.approx(z * f.sensitivity)
    eps = _independent_epsilon(z, n, B, T, 0.5e-5)
    assert f.epsilon() == pytest.approx(eps, rel=1e-9)
    assert 3.8 < eps <= 4.0
    f.run(data, progress=False)  # the planned T steps are done: nothing more happens
    assert f.steps_taken == T


def test_a_failed_first_run_binds_nothing_and_can_be_retried():
    # a batch larger than the data (or a calibration that fails) must not leave the flow half-bound
    f = DPSlicedWassersteinFlow(32, 8, 16, 1.0, target_epsilon=4.0, batch_size=40, steps=5,
                                secure_mode=False, generator=_gen(10))
    with pytest.raises(ValueError, match="batch size"):
        f.run(torch.randn(20, 8, generator=_gen(11)), progress=False)
    assert f.steps_taken == 0 and f.noise_multiplier is None and f.epsilon() == 0.0
    f.run(torch.randn(200, 8, generator=_gen(12)), progress=False)  # the retry binds n = 200, B = 40
    assert f.steps_taken == 5 and 0 < f.epsilon() <= 4.0


def test_noise_multiplier_and_target_epsilon_together_are_refused():
    with pytest.raises(ValueError, match="not both"):
        DPSlicedWassersteinFlow(32, 8, 40, 1.0, noise_multiplier=2.0, target_epsilon=3.0, batch_size=10, steps=5)


def test_run_stops_when_the_ledger_refuses_and_releases_nothing_more():
    n, B, T = 300, 60, 40
    data = torch.randn(n, 8, generator=_gen(9))
    f = DPSlicedWassersteinFlow(32, 8, 40, 1.0, target_epsilon=3.0, batch_size=B, steps=T,
                                secure_mode=False, generator=_gen(10))
    f.run(data, steps=3, progress=False)
    f.ledger._limit = 5  # as if the budget allowed 5 releases (the calibration fits all T: forced here)
    f.run(data, progress=False)
    assert f.steps_taken == 5 and f.last_run.stop_reason == "budget" and f.last_run.steps_run == 2
    assert not f.can_step()
    before = f.particles.clone()
    f.run(data, progress=False)
    assert f.steps_taken == 5 and torch.equal(f.particles, before) and f.last_run.stop_reason == "budget"


def test_direct_step_is_accounted_without_amplification_and_the_plan_raises():
    f = DPSlicedWassersteinFlow(32, 8, 40, 1.0, noise_multiplier=5.0, steps=6, batch_size=10,
                                secure_mode=False, generator=_gen(11))
    batch = torch.randn(10, 8, generator=_gen(12))
    for _ in range(6):
        f.step(batch)
    with pytest.raises(BudgetExceededError, match="planned"):
        f.step(batch)
    acc = RdpAccountant(orders=list(DEFAULT_ORDERS))
    acc.compose(dp_accounting.GaussianDpEvent(5.0), 6)
    assert f.steps_taken == 6
    assert f.epsilon() == pytest.approx(acc.get_epsilon(0.5e-5), rel=1e-9)
    with pytest.raises(ValueError, match="mixing"):
        f.run(torch.randn(100, 8), progress=False)


def test_non_private_flow_says_so():
    f = DPSlicedWassersteinFlow(16, 2, 3, 0.5, secure_mode=False, generator=_gen(13))
    assert not f.private and f.noise_std == 0.0 and f.noise_multiplier == 0.0
    assert f.epsilon() == math.inf
    g = DPSlicedWassersteinFlow(16, 2, 3, 0.5, target_epsilon=math.inf, secure_mode=False, generator=_gen(13))
    assert not g.private and g.epsilon() == math.inf
    with pytest.raises(ValueError, match="steps is required"):
        f.run(torch.randn(20, 2), progress=False)


# ------------------------------------------------------------------------------------------------ clipping
@pytest.mark.parametrize("normalize", [False, True])
def test_private_rows_are_clipped_inside(normalize):
    data = torch.randn(200, 8, generator=_gen(14)) * 5
    norms = data.norm(dim=1, keepdim=True)
    pre = data / norms * 1.5 if normalize else data * torch.clamp(1.5 / norms, max=1.0)
    out = []
    for x in (data, pre):
        f = DPSlicedWassersteinFlow(64, 8, 40, 1.0, noise_multiplier=1.0, clip_radius=1.5, normalize=normalize,
                                    batch_size=20, steps=3, secure_mode=False, generator=_gen(15))
        out.append(f.run(x, progress=False).clone())
    torch.testing.assert_close(out[0], out[1], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ checkpoint
@pytest.mark.parametrize("variant,reg", [("resample", 0.0), ("presampled", 0.05)])
def test_checkpoint_resume_equals_uninterrupted(tmp_path, variant, reg):
    n, T = 300, 12
    data = torch.randn(n, 8, generator=_gen(16))
    kw = dict(noise_multiplier=1.0, batch_size=30, steps=T, variant=variant, diffusion=reg)
    full = DPSlicedWassersteinFlow(64, 8, 40, 0.5, secure_mode=False, generator=_gen(17), **kw)
    full.run(data, progress=False)

    path = str(tmp_path / "flow.pt")
    part = DPSlicedWassersteinFlow(64, 8, 40, 0.5, secure_mode=False, generator=_gen(17), **kw)

    crash_in_step(part, 7)
    with pytest.raises(Kill):
        part.run(data, progress=False, checkpoint_path=path, checkpoint_every=4)
    # the killed run made releases 5..7 after the step-4 checkpoint, which reserved the 4 releases up to its next
    # checkpoint: the resumed flow counts them as spent (conservative: they may have been published) and redoes the
    # lost steps with fresh draws, within the planned T releases; it says it stopped at the plan, 4 of 8 steps short
    resumed = DPSlicedWassersteinFlow.load(path)
    assert resumed.steps_taken == 4 and resumed.ledger.steps_spent == 8
    resumed.run(data, progress=False, checkpoint_path=path)
    assert resumed.steps_taken == 8 and resumed.ledger.steps_spent == T and resumed.stop_reason == "planned_steps"
    assert (resumed.last_run.steps_requested, resumed.last_run.steps_run) == (8, 4)
    assert resumed.epsilon() == full.epsilon()  # T releases of the same mechanism, however they were spent
    short = DPSlicedWassersteinFlow(64, 8, 40, 0.5, secure_mode=False, generator=_gen(17), **kw)
    short.run(data, steps=8, progress=False)  # the replayed draws: the resumed particles are those of step 8
    torch.testing.assert_close(resumed.particles, short.particles, rtol=0, atol=0)
    again = DPSlicedWassersteinFlow.load(path)  # written at the end of the run: nothing in flight
    assert again.steps_taken == 8 and again.epsilon() == full.epsilon()


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, RuntimeError])
def test_an_exception_in_a_callback_leaves_a_checkpoint_of_the_step_it_saw(tmp_path, interrupt):
    # issue 37: a KeyboardInterrupt in a callback with checkpoint_every=1 left the checkpoint at step 2 with 3
    # releases charged; the resumed run then stopped at 5 of the 6 steps and said "completed"
    data = torch.randn(200, 3, generator=_gen(1))
    kw = dict(noise_multiplier=1.0, batch_size=20, steps=6, secure_mode=False)
    path = str(tmp_path / "flow.pt")
    f = DPSlicedWassersteinFlow(16, 3, 4, 0.5, generator=_gen(2), **kw)

    def stop(flow):
        if flow.steps_taken == 3:
            raise interrupt()

    with pytest.raises(interrupt):
        f.run(data, progress=False, checkpoint_path=path, checkpoint_every=1, callback=stop)
    back = DPSlicedWassersteinFlow.load(path)
    assert back.steps_taken == 3 == back.ledger.steps_spent  # the checkpoint and the releases charged agree
    torch.testing.assert_close(back.particles, f.particles, rtol=0, atol=0)
    back.run(data, progress=False)
    res = back.last_run
    assert (res.steps_requested, res.steps_run, res.steps_taken, res.stop_reason) == (3, 3, 6, "completed")
    assert back.ledger.steps_spent == 6


def test_run_arguments_that_would_be_ignored_or_misread_are_refused(tmp_path):
    data = torch.randn(50, 3, generator=_gen(1))
    f = DPSlicedWassersteinFlow(8, 3, 4, 0.5, noise_multiplier=1.0, batch_size=10, steps=4, generator=_gen(2))
    for kw, match in [(dict(checkpoint_every=1), "checkpoint_every=1 needs checkpoint_path"),
                      (dict(progress="no"), "progress must be a bool"),
                      (dict(progress_epsilon=1), "progress_epsilon must be a bool"),
                      (dict(checkpoint_path=str(tmp_path / "missing" / "f.pt")), "folder that does not exist")]:
        with pytest.raises(ValueError, match=match):
            f.run(data, **kw)
        assert f.steps_taken == 0 and f.ledger.steps_spent == 0  # refused before any release
    assert not (tmp_path / "missing").exists()  # no folder was created


def test_a_state_with_an_unknown_key_is_refused(tmp_path):
    f = DPSlicedWassersteinFlow(8, 3, 4, 0.5, noise_multiplier=1.0, batch_size=10, steps=4, generator=_gen(2))
    f.run(torch.randn(50, 3, generator=_gen(1)), steps=1, progress=False)
    state = f.state_dict()
    state["learning_rate"] = 0.1
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['learning_rate'\]"):
        DPSlicedWassersteinFlow.from_state_dict(state)
    before = f.steps_taken
    with pytest.raises(ValueError, match="unknown key"):
        f.load_state_dict(state)
    assert f.steps_taken == before


def test_sizes_and_dtypes_are_checked_before_anything_is_allocated():
    with pytest.raises(ValueError, match=r"num_particles=1000000000000 needs about .* GiB .* available"):
        DPSlicedWassersteinFlow(10 ** 12, 3, 4, 0.5)
    for dtype in (torch.float16, torch.bfloat16):
        with pytest.raises(ValueError, match=r"init must have dtype in \['torch.float32', 'torch.float64'\]"):
            DPSlicedWassersteinFlow(8, 3, 4, 0.5, init=torch.zeros(8, 3, dtype=dtype))
        f = DPSlicedWassersteinFlow(8, 3, 4, 0.5, noise_multiplier=1.0, batch_size=10, steps=4)
        with pytest.raises(ValueError, match=r"private_data must have dtype in"):
            f.run(torch.randn(50, 3).to(dtype), progress=False)
        with pytest.raises(ValueError, match=r"private_batch must have dtype in"):
            f.step(torch.randn(10, 3).to(dtype))
        assert f.steps_taken == 0


def test_nan_particles_stop_with_last_good_checkpoint_intact(tmp_path):
    path = str(tmp_path / "flow.pt")
    f = DPSlicedWassersteinFlow(50, 3, 5, step_size=1e15, clip_radius=100.0, secure_mode=False, generator=_gen(0))
    data = torch.randn(200, 3, generator=_gen(1)) * 50
    with pytest.raises(NonFiniteParticlesError, match="non-finite"):
        f.run(data, steps=10, progress=False, checkpoint_path=path, checkpoint_every=1)
    assert bool(torch.isfinite(f.particles).all())
    good = DPSlicedWassersteinFlow.load(path)
    assert good.steps_taken == f.steps_taken - 1
    torch.testing.assert_close(good.particles, f.particles, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------ toy target
def test_toy_mixture_non_private_and_dp():
    data, _ = _mixture(2000)
    init = torch.randn(500, 2, generator=_gen(3))
    assert _sw2(init, data) > 1.0
    f = DPSlicedWassersteinFlow(500, 2, 20, 1.0, clip_radius=4.0, batch_size=500, steps=100, init=init,
                                secure_mode=False, generator=_gen(1))
    f.run(data, progress=False)
    assert _sw2(f.particles, data) < 0.08
    dp = DPSlicedWassersteinFlow(500, 2, 20, 1.0, noise_multiplier=0.03, clip_radius=4.0, batch_size=500, steps=100,
                                 bound="bernstein", init=init, secure_mode=False, generator=_gen(1))
    assert dp.noise_std > 0.9
    dp.run(data, progress=False)
    assert _sw2(dp.particles, data) < 0.3


@pytest.mark.parametrize("quantiles,size", [("grid", dict(num_quantiles=64)), ("histogram", dict(histogram_bins=256))])
def test_toy_mixture_other_transports(quantiles, size):
    data, _ = _mixture(2000)
    init = torch.randn(500, 2, generator=_gen(3))
    f = DPSlicedWassersteinFlow(500, 2, 20, 1.0, clip_radius=4.0, batch_size=500, steps=60, init=init,
                                quantiles=quantiles, secure_mode=False, generator=_gen(1), **size)
    f.run(data, progress=False)
    assert _sw2(f.particles, data) < 0.1


def test_class_conditional_flow(tmp_path):
    data, lab = _mixture(1500, seed=4)
    path = str(tmp_path / "cc.pt")
    cc = ClassConditionalFlow(300, 2, 20, 1.0, clip_radius=4.0, batch_size=100, steps=40, noise_multiplier=0.02,
                              bound="bernstein", secure_mode=False, generator=_gen(5), label_privacy="public")
    x, y = cc.run(data, lab, progress=False, checkpoint_path=path)
    counts = torch.bincount(lab, minlength=3).double()
    got = torch.bincount(y, minlength=3)
    assert int(got.sum()) == 300 and x.shape == (300, 2)
    assert (got.double() - 300 * counts / counts.sum()).abs().max() <= 2
    for c in range(3):
        assert (x[y == c].mean(0) - data[lab == c].mean(0)).norm() < 0.3
    # parallel composition: the release's ε is the common per-class ε
    eps = [f.epsilon() for f in cc.flows]
    assert cc.epsilon() == max(eps) and eps[0] > 0
    loaded = ClassConditionalFlow.load(path)
    torch.testing.assert_close(loaded.samples()[0], x, rtol=0, atol=0)
    assert loaded.epsilon() == cc.epsilon()


def test_class_conditional_flow_checks_every_class_batch_before_any_step():
    data, lab = _mixture(600, seed=4)
    lab[lab == 2] = 1
    lab[:30] = 2  # class 2 is tiny: 30 rows < B = 50
    cc = ClassConditionalFlow(90, 2, 8, 1.0, clip_radius=4.0, batch_size=50, steps=5, noise_multiplier=1.0,
                              secure_mode=False, generator=_gen(5), label_privacy="public")
    with pytest.raises(ValueError, match="class 2 has fewer private rows than the batch size") as err:
        cc.run(data, lab, progress=False)
    assert "30" not in str(err.value)  # the private class size is not in the message
    assert all(f.steps_taken == 0 and f.epsilon() == 0.0 for f in cc.flows)  # nothing released


def test_class_conditional_particles_as_given():
    data, lab = _mixture(600, seed=6)
    with pytest.raises(ValueError, match="sum to num_particles = 20, got 21"):
        ClassConditionalFlow(20, 2, 4, 1.0, particles_per_class=[5, 7, 9], label_privacy="public")
    cc = ClassConditionalFlow(21, 2, 4, 1.0, particles_per_class=[5, 7, 9], clip_radius=4.0,
                              secure_mode=False, generator=_gen(7), label_privacy="public")
    x, y = cc.run(data, lab, steps=2, progress=False)
    assert torch.bincount(y).tolist() == [5, 7, 9]
    with pytest.raises(ValueError, match="labels"):
        cc.run(data, lab.float(), steps=1, progress=False)


# ------------------------------------------------------------------------------------------------ init kinds
def test_init_kinds_shapes_norms_and_generator():
    n, d = 4000, 8
    x = {k: draw_init(k, n, d, _gen(21)) for k in INIT_KINDS}
    for k, v in x.items():
        assert v.shape == (n, d) and v.dtype == torch.float32 and bool(torch.isfinite(v).all()), k
    # every kind is a deterministic map of the same N·d normals (the generator advances identically)
    z = torch.randn(n, d, generator=_gen(21))
    torch.testing.assert_close(x["gaussian"], z, rtol=0, atol=0)
    torch.testing.assert_close(x["sphere"], z / z.norm(dim=1, keepdim=True), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x["gaussian_scaled"], z / math.sqrt(d), rtol=0, atol=0)
    torch.testing.assert_close(x["sphere"].norm(dim=1), torch.ones(n), rtol=1e-5, atol=1e-5)
    assert abs(float((x["gaussian_scaled"] ** 2).sum(1).mean()) - 1.0) < 0.05
    assert abs(float((x["gaussian"] ** 2).sum(1).mean()) - d) < 0.4
    # uniform on the sphere: mean ≈ 0, covariance ≈ I/d
    s = x["sphere"].double()
    assert float(s.mean(0).abs().max()) < 0.03
    torch.testing.assert_close(s.T @ s / n, torch.eye(d, dtype=torch.float64) / d, rtol=0, atol=0.02)
    # scale: a length (sphere radius, Gaussian standard deviation), applied to the same draw
    torch.testing.assert_close(draw_init("sphere", 10, d, _gen(2), scale=3.0).norm(dim=1), torch.full((10,), 3.0))
    for k in INIT_KINDS:
        torch.testing.assert_close(draw_init(k, n, d, _gen(21), scale=0.3), 0.3 * x[k], rtol=1e-6, atol=1e-7)
    # the flow's particles are the draw from its generator; None is the default "gaussian" (unchanged stream)
    for k in INIT_KINDS:
        f = DPSlicedWassersteinFlow(n, d, 4, 0.5, init=k, secure_mode=False, generator=_gen(21))
        torch.testing.assert_close(f.particles, x[k], rtol=0, atol=0)
        small = DPSlicedWassersteinFlow(n, d, 4, 0.5, init=k, init_scale=0.3, secure_mode=False, generator=_gen(21))
        torch.testing.assert_close(small.particles, 0.3 * x[k], rtol=1e-6, atol=1e-7)
        again = DPSlicedWassersteinFlow(n, d, 4, 0.5, init=k, secure_mode=False, generator=_gen(21))
        torch.testing.assert_close(again.particles, f.particles, rtol=0, atol=0)
    torch.testing.assert_close(DPSlicedWassersteinFlow(n, d, 4, 0.5,
                                                       secure_mode=False, generator=_gen(21)).particles, x["gaussian"],
                               rtol=0, atol=0)


def test_class_conditional_init_kinds_and_resume(tmp_path, monkeypatch):
    data, lab = _mixture(900, seed=8)
    kw = dict(clip_radius=4.0, batch_size=30, steps=10, noise_multiplier=1.0, directions="orthogonal",
              normalize=True, label_privacy="public")
    starts = {}
    for k in INIT_KINDS:
        cc = ClassConditionalFlow(120, 2, 2, 0.5, init=k, init_scale=4.0, secure_mode=False, generator=_gen(9), **kw)
        cc._build_public(torch.bincount(lab))
        starts[k] = cc.samples()[0]
        # each class flow starts from its own generator's draw: same seeds, so same normals under every kind
        same = ClassConditionalFlow(120, 2, 2, 0.5, init=k, init_scale=4.0, secure_mode=False, generator=_gen(9), **kw)
        same._build_public(torch.bincount(lab))
        torch.testing.assert_close(same.samples()[0], starts[k], rtol=0, atol=0)
    torch.testing.assert_close(starts["sphere"].norm(dim=1), torch.full((120,), 4.0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(starts["sphere"], 4.0 * starts["gaussian"] / starts["gaussian"].norm(dim=1, keepdim=True),
                               rtol=1e-5, atol=1e-5)
    # checkpoint / resume with a non-default init is bit-equal to an uninterrupted run
    full = ClassConditionalFlow(120, 2, 2, 0.5, init="sphere", init_scale=0.5,
                                secure_mode=False, generator=_gen(9), **kw)
    xf, _ = full.run(data, lab, progress=False)
    path = str(tmp_path / "cc.pt")
    part = ClassConditionalFlow(120, 2, 2, 0.5, init="sphere", init_scale=0.5,
                                secure_mode=False, generator=_gen(9), **kw)
    orig = DPSlicedWassersteinFlow.run

    def run_then_kill(self, *args, callback=None, **kwargs):  # stop in the second class flow after its 5th step
        def cb(flow):
            callback(flow)
            if flow is part.flows[1] and flow.steps_taken == 5:
                raise Kill()
        return orig(self, *args, callback=cb, **kwargs)

    monkeypatch.setattr(DPSlicedWassersteinFlow, "run", run_then_kill)
    with pytest.raises(Kill):
        part.run(data, lab, progress=False, checkpoint_path=path, checkpoint_every=4)
    monkeypatch.undo()
    resumed = ClassConditionalFlow.load(path)
    assert resumed.init == "sphere" and resumed.init_scale == 0.5 and [f.steps_taken for f in resumed.flows] == [10, 4, 0]
    xr, yr = resumed.run(data, lab, progress=False, checkpoint_path=path)
    # class 1 died at step 5 after its step-4 checkpoint, which reserved releases 5..8: counted as spent, so it
    # finishes its planned 10 releases at step 6 (the other classes are bit-equal to the uninterrupted run)
    assert [f.steps_taken for f in resumed.flows] == [10, 6, 10]
    assert [f.ledger.steps_spent for f in resumed.flows] == [10, 10, 10]
    keep = yr != 1
    torch.testing.assert_close(xr[keep], xf[keep], rtol=0, atol=0)
    assert resumed.epsilon() == full.epsilon()


@pytest.mark.parametrize("init", ["uniform", "Sphere", "", 3])
def test_bad_init_kinds(init):
    with pytest.raises(ValueError, match="init must be one of"):
        DPSlicedWassersteinFlow(16, 3, 4, 0.5, init=init) if isinstance(init, str) else draw_init(init, 16, 3, _gen(0))
    with pytest.raises(ValueError, match="init of ClassConditionalFlow"):
        ClassConditionalFlow(16, 3, 4, 0.5, init=init)


def test_class_conditional_refuses_tensor_init():
    with pytest.raises(ValueError, match="init of ClassConditionalFlow.*Tensor"):
        ClassConditionalFlow(16, 3, 4, 0.5, init=torch.zeros(16, 3))


@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_bad_init_scale(scale):
    with pytest.raises(ValueError, match="init_scale"):
        DPSlicedWassersteinFlow(16, 3, 4, 0.5, init="sphere", init_scale=scale)
    with pytest.raises(ValueError, match="init_scale"):
        ClassConditionalFlow(16, 3, 4, 0.5, init="sphere", init_scale=scale)
    with pytest.raises(ValueError, match="init_scale"):
        draw_init("sphere", 16, 3, _gen(0), scale=scale)


def test_tensor_init_refuses_init_scale():
    with pytest.raises(ValueError, match="init_scale only applies"):
        DPSlicedWassersteinFlow(16, 3, 4, 0.5, init=torch.zeros(16, 3), init_scale=2.0)


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kwargs,match", [
    (dict(step_size=0.0), "step_size"), (dict(step_size=-2.0), "step_size"), (dict(diffusion=-1.0), "diffusion"),
    (dict(num_projections=0), "num_projections"), (dict(num_particles=1), "num_particles"),
    (dict(noise_multiplier=1.0), "steps"), (dict(noise_multiplier=1.0, steps=5), "batch_size"),
    (dict(target_epsilon=math.inf, noise_multiplier=1.0), "non-private"), (dict(quantiles="grid", num_quantiles=1),
                                                                          "num_quantiles"),
    (dict(quantiles="histogram"), "histogram_bins"), (dict(quantiles="histogram", histogram_bins=4, num_quantiles=5), "grid"),
    (dict(histogram_bins=5), "histogram_bins"), (dict(variant="fresh"), "variant"),
    (dict(pool_size=10), "pool_size"), (dict(variant="presampled", pool_size=2), "pool_size"),
    (dict(delta=0.0), "delta"), (dict(clip_radius=0.0), "clip_radius"), (dict(batch_size=4, sample_rate=0.1), "not both"),
    (dict(directions="sobol"), "directions"),
])
def test_bad_constructor_arguments(kwargs, match):
    args = dict(num_particles=16, dim=3, num_projections=4, step_size=0.5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        DPSlicedWassersteinFlow(**args)


def test_bad_data():
    f = DPSlicedWassersteinFlow(16, 3, 4, 0.5, batch_size=5, secure_mode=False, generator=_gen(0))
    bad = torch.randn(20, 3)
    bad[2, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        f.run(bad, steps=1, progress=False)
    with pytest.raises(ValueError, match="d=3"):
        f.run(torch.randn(20, 4), steps=1, progress=False)
    init = torch.randn(16, 3)
    init[0, 0] = float("inf")
    with pytest.raises(ValueError, match="init"):
        DPSlicedWassersteinFlow(16, 3, 4, 0.5, init=init)
    g = DPSlicedWassersteinFlow(16, 3, 4, 0.5, batch_size=50, secure_mode=False, generator=_gen(0))
    with pytest.raises(ValueError, match="batch size"):
        g.run(torch.randn(20, 3), steps=1, progress=False)


def test_exported():
    assert fastdpot.DPSlicedWassersteinFlow is DPSlicedWassersteinFlow
    assert fastdpot.ClassConditionalFlow is ClassConditionalFlow
