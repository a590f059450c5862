"""Flows with ``release="sketch"``: accounting identical to the points release, one sketch per step, the
non-private sketch flow reaches its target, checkpoints, the class-conditional flow, and bad arguments."""
import inspect
import math

import numpy as np
import pytest
import scipy.optimize
import torch

import fastdpot.privacy as privacy
from fastdpot.flows import ClassConditionalFlow, DPSlicedWassersteinFlow
from fastdpot.privacy.sketch import QuantileSketch, sketch_quantile_table

from ._crash import Kill, crash_in_step


def _gen(s):
    return torch.Generator().manual_seed(s)


# flows whose privacy draws can be secret OS randomness take secure_mode; replay tests need the seeded generator
_REPLAY = ({"secure_mode": False} if "secure_mode" in inspect.signature(DPSlicedWassersteinFlow).parameters
           else {})


def test_sketch_table_is_scipys_weighted_isotonic_fit():
    g = _gen(0)
    means = torch.randn(6, 5, generator=g, dtype=torch.float64)
    sizes = torch.tensor([3.0, 2.0, 2.0, 2.0, 3.0], dtype=torch.float64)
    levels = torch.tensor([0.1, 0.3, 0.5, 0.7, 0.9], dtype=torch.float64)
    table, lv = sketch_quantile_table(QuantileSketch(means, levels, sizes))
    assert table.shape == (6, 5) and table.dtype == torch.float64
    assert bool((table[:, 1:] >= table[:, :-1]).all())
    for j in range(6):
        want = scipy.optimize.isotonic_regression(means[j].numpy(), weights=sizes.numpy(), increasing=True).x
        np.testing.assert_allclose(table[j].numpy(), want, rtol=0, atol=1e-15)
    # the weighted mean of each row is kept (pooled bins average with their sizes)
    torch.testing.assert_close(table @ sizes, means @ sizes, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lv, levels, rtol=0, atol=0)
    sorted_means = torch.sort(means, dim=1).values
    torch.testing.assert_close(sketch_quantile_table(QuantileSketch(sorted_means, levels, sizes))[0], sorted_means,
                               rtol=0, atol=0)


@pytest.mark.parametrize("directions", ["orthogonal", "uniform"])
def test_sketch_flow_spends_exactly_the_points_flows_epsilon(directions, monkeypatch):
    n, d, k, B, T, z = 400, 6, 12, 40, 8, 1.3
    data = torch.randn(n, d, generator=_gen(1))
    calls = []
    real = privacy.sliced_quantile_sketch

    def counting(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(privacy, "sliced_quantile_sketch", counting)
    kw = dict(noise_multiplier=z, batch_size=B, steps=T, directions=directions, delta=1e-5)
    pts = DPSlicedWassersteinFlow(64, d, k, 0.5, generator=_gen(2), **kw)
    sk = DPSlicedWassersteinFlow(64, d, k, 0.5, generator=_gen(2), release="sketch", sketch_bins=5, **kw)
    pts.run(data, progress=False)
    assert not calls
    sk.run(data, progress=False)
    assert sk.steps_taken == pts.steps_taken == T
    assert len(calls) == T  # one sketch release per step, no more
    assert sk.sensitivity == pts.sensitivity and sk.noise_std == pts.noise_std == z * pts.sensitivity
    for args, kwargs in calls:  # the mechanism gets the step's batch, its k directions, L and σ = z·Δ
        assert args[0].shape == (B, d) and args[1].shape == (k, d) and args[2] == 5
        assert args[3] == pytest.approx(z * sk.sensitivity)
        assert kwargs["clip_radius"] == 1.0 and kwargs["normalize"] is False
    assert sk.epsilon() == pts.epsilon() and math.isfinite(sk.epsilon()) and sk.epsilon() > 0
    assert bool(torch.isfinite(sk.particles).all())


def _sliced_w2(a, b, theta):
    pa = torch.sort(a @ theta.t(), dim=0).values
    pb = torch.sort(b @ theta.t(), dim=0).values
    return float(((pa - pb) ** 2).mean().sqrt())


def test_non_private_sketch_flow_with_one_bin_per_row_reaches_the_target():
    # σ = 0 and L = B = n: the sketch is every sorted projection, so the flow transports onto the data
    g = _gen(5)
    target = torch.randn(200, 2, generator=g, dtype=torch.float64) @ torch.tensor([[0.6, 0.0], [0.3, 0.2]],
                                                                                  dtype=torch.float64)
    target = target + torch.tensor([0.4, -0.3], dtype=torch.float64)
    flow = DPSlicedWassersteinFlow(200, 2, 8, 1.0, batch_size=200, release="sketch", sketch_bins=200,
                                   init=torch.randn(200, 2, generator=g, dtype=torch.float64), clip_radius=10.0,
                                   generator=_gen(6), directions="orthogonal")
    theta = torch.nn.functional.normalize(torch.randn(64, 2, generator=g, dtype=torch.float64), dim=1)
    before = _sliced_w2(flow.particles, target, theta)
    flow.run(target, steps=60, progress=False)
    after = _sliced_w2(flow.particles, target, theta)
    assert flow.epsilon() == math.inf and flow.noise_std == 0.0
    assert after < 0.05 * before, (before, after)
    torch.testing.assert_close(flow.particles.mean(0), target.mean(0), rtol=0, atol=0.02)
    torch.testing.assert_close(torch.cov(flow.particles.t()), torch.cov(target.t()), rtol=0, atol=0.02)


def test_sketch_step_uses_no_particle_smoothing_noise(monkeypatch):
    import fastdpot.ops.flow as F  # the flow calls op flow_step, which dispatches here

    seen = []
    real = F.dispatch

    def spy(op, backend, device, size, needs=()):
        name, fn = real(op, backend, device, size, needs)

        def wrapped(*args, **kwargs):
            seen.append(kwargs)
            return fn(*args, **kwargs)
        return name, wrapped

    monkeypatch.setattr(F, "dispatch", spy)
    f = DPSlicedWassersteinFlow(32, 4, 8, 0.5, noise_multiplier=2.0, batch_size=20, steps=2, release="sketch",
                                sketch_bins=4, generator=_gen(7))
    f.run(torch.randn(100, 4, generator=_gen(8)), progress=False)
    assert len(seen) == 2
    for kw in seen:
        assert kw["noise_std"] == 0.0 and kw["sketch"][0].shape == (8, 4) and kw["sketch"][1].shape == (4,)
        assert bool((kw["sketch"][0][:, 1:] >= kw["sketch"][0][:, :-1]).all())  # the isotonic fit's table


@pytest.mark.parametrize("variant", ["resample", "presampled"])
def test_sketch_checkpoint_resume_equals_uninterrupted(tmp_path, variant):
    n, T = 300, 12
    data = torch.randn(n, 8, generator=_gen(16))
    kw = dict(noise_multiplier=1.0, batch_size=30, steps=T, variant=variant, release="sketch",
              sketch_bins=6, **_REPLAY)
    full = DPSlicedWassersteinFlow(64, 8, 16, 0.5, generator=_gen(17), **kw)
    full.run(data, progress=False)
    path = str(tmp_path / "flow.pt")
    part = DPSlicedWassersteinFlow(64, 8, 16, 0.5, generator=_gen(17), **kw)

    crash_in_step(part, 7)
    with pytest.raises(Kill):
        part.run(data, progress=False, checkpoint_path=path, checkpoint_every=4)
    resumed = DPSlicedWassersteinFlow.load(path)
    assert resumed.steps_taken == 4 and resumed.config.release == "sketch" and resumed.config.sketch_bins == 6
    resumed.run(data, progress=False, checkpoint_path=path)
    # the 4 releases in flight at the crash are counted (fastdpot.flows.checkpoint): T releases by step 8
    assert resumed.steps_taken == 8 and resumed.ledger.steps_spent == T
    short = DPSlicedWassersteinFlow(64, 8, 16, 0.5, generator=_gen(17), **kw)
    short.run(data, steps=8, progress=False)
    torch.testing.assert_close(resumed.particles, short.particles, rtol=0, atol=0)
    assert resumed.epsilon() == full.epsilon()


def test_class_conditional_sketch_flow(tmp_path):
    g = _gen(11)
    x = torch.cat([torch.randn(150, 2, generator=g) * 0.3 + 2, torch.randn(150, 2, generator=g) * 0.3 - 2])
    y = torch.cat([torch.zeros(150), torch.ones(150)]).long()
    kw = dict(clip_radius=4.0, batch_size=50, steps=10, noise_multiplier=1.0, directions="orthogonal",
              label_privacy="public")
    cc = ClassConditionalFlow(100, 2, 2, 1.0, generator=_gen(12), release="sketch", sketch_bins=5, **kw)
    cp = ClassConditionalFlow(100, 2, 2, 1.0, generator=_gen(12), **kw)
    path = str(tmp_path / "cc.pt")
    xs, ys = cc.run(x, y, progress=False, checkpoint_path=path)
    cp.run(x, y, progress=False)
    assert cc.epsilon() == cp.epsilon() and all(f.config.release == "sketch" for f in cc.flows)
    assert xs.shape == (100, 2) and bool(torch.isfinite(xs).all())
    back = ClassConditionalFlow.load(path)
    assert all(f.config.sketch_bins == 5 for f in back.flows)
    torch.testing.assert_close(back.samples()[0], xs, rtol=0, atol=0)


def test_a_points_checkpoint_does_not_load_into_a_sketch_flow():
    data = torch.randn(200, 4, generator=_gen(9))
    f = DPSlicedWassersteinFlow(32, 4, 8, 0.5, noise_multiplier=1.0, batch_size=20, steps=4, generator=_gen(10),
                                **_REPLAY)
    f.run(data, steps=2, progress=False)
    sk = DPSlicedWassersteinFlow(32, 4, 8, 0.5, noise_multiplier=1.0, batch_size=20, steps=4, generator=_gen(10),
                                 release="sketch", sketch_bins=3, **_REPLAY)
    with pytest.raises(ValueError, match="does not match"):
        sk.load_state_dict(f.state_dict())


@pytest.mark.parametrize("kwargs,match", [
    (dict(release="sketch"), "sketch_bins .* is required"),
    (dict(release="sketch", sketch_bins=0), "sketch_bins"),
    (dict(release="sketch", sketch_bins=2.5), "sketch_bins"),
    (dict(release="sketch", sketch_bins=21), "sketch_bins must be <= batch_size"),
    (dict(sketch_bins=3), "sketch_bins is only used with release='sketch'"),
    (dict(release="histogram", sketch_bins=3), "release"),
    (dict(release="sketch", sketch_bins=3, backend="triton", quantiles="grid"), "triton"),
])
def test_bad_release_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DPSlicedWassersteinFlow(32, 4, 8, 0.5, noise_multiplier=1.0, batch_size=20, steps=4, **kwargs)


def test_num_bins_above_the_resolved_batch_size():
    f = DPSlicedWassersteinFlow(32, 4, 8, 0.5, noise_multiplier=1.0, sample_rate=0.05, steps=4, release="sketch",
                                sketch_bins=11, generator=_gen(13))
    with pytest.raises(ValueError, match="sketch_bins must be <= the batch size B = 10"):
        f.run(torch.randn(200, 4, generator=_gen(14)), progress=False)
    g = DPSlicedWassersteinFlow(32, 4, 8, 0.5, noise_multiplier=1.0, steps=4, batch_size=20, release="sketch",
                                sketch_bins=11, generator=_gen(13))
    with pytest.raises(ValueError, match="sketch_bins must be <= the batch size"):
        g.step(torch.randn(10, 4, generator=_gen(15)))
    assert g.steps_taken == 0 and g.epsilon() == 0.0  # refused before anything was counted or released
