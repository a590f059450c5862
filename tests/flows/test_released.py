"""Flows that read only a one-shot release (fastdpot.flows.released): without noise they match the released
marginals (and the data's, as well as the sketch allows), they take no private data, report the release's ε, keep
to the public domain, and start from the release's marginals; the release's (ε, δ) calibration."""
import math

import pytest
import torch

from fastdpot.flows import ClassConditionalFlow, ReleasedClassFlows, ReleasedTargetFlow
from fastdpot.privacy import calibrate_noise_multiplier
from fastdpot.privacy.class_sketch import class_quantile_sketch, release_class_sketch


def _blocks(d, B, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0].t()
                      for _ in range(B)])


def _data(n=3000, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.tensor([1.0, 0.5, 0.2, 0.1]) + 3.0 * y[:, None]
    x[:, 0] += (torch.rand(n, generator=g, dtype=torch.float64) < 0.5) * 2.0  # bimodal: not a Gaussian
    return x, y


def test_noiseless_flows_match_each_class_on_the_released_directions():
    x, y = _data()
    th = _blocks(4, 3)
    rel = class_quantile_sketch(x, y, th, num_classes=2, sketch_bins=32, noise_multiplier=0.0, clip_radius=50.0,
                                block_size=4)
    flows = ClassConditionalFlow.from_release(rel, 2000, step_size=1.0, generator=torch.Generator().manual_seed(1),
                                              dtype=torch.float64)
    X, Y = flows.run(steps=30)
    assert X.shape == (2000, 4) and torch.bincount(Y).tolist() == [1000, 1000]  # released counts 1500 / 1500
    for c in range(2):
        for j in range(th.shape[0]):
            got = torch.sort(X[Y == c] @ th[j]).values
            want = torch.quantile(x[y == c] @ th[j], torch.linspace(0, 1, got.numel(), dtype=torch.float64))
            assert float((got - want)[50:-50].abs().max()) < 0.15  # the sketch's resolution (32 bins)
        torch.testing.assert_close(X[Y == c].mean(0), x[y == c].mean(0), atol=0.05, rtol=0)


def test_flows_on_a_release_take_no_private_data_and_report_its_epsilon():
    x, y = _data(400)
    th = _blocks(4, 1)
    rel = release_class_sketch(x, y, th, epsilon=2.0, delta=1e-6, num_classes=2, sketch_bins=4, clip_radius=5.0,
                               generator=torch.Generator().manual_seed(2), secure_mode=False)
    assert rel.noise_multiplier == pytest.approx(calibrate_noise_multiplier(2.0, 1e-6, 1.0, 1, accountant="pld"))
    assert (rel.epsilon, rel.delta) == (2.0, 1e-6)
    flows = ClassConditionalFlow.from_release(rel, 40)
    assert flows.epsilon() == 2.0 and flows.epsilon(1e-6) == 2.0
    flows.run(steps=5)
    assert flows.epsilon() == 2.0  # any number of steps: post-processing
    with pytest.raises(ValueError, match="reads only the release|read only the release"):
        flows.run(x, y)
    with pytest.raises(ValueError, match="another δ"):
        flows.epsilon(1e-5)
    one = ReleasedTargetFlow(rel, 1, 30)
    with pytest.raises(ValueError, match="reads only the release"):
        one.run(x)
    exact = class_quantile_sketch(x, y, th, num_classes=2, sketch_bins=4, noise_multiplier=0.0, clip_radius=5.0)
    with pytest.raises(ValueError, match="states no"):
        ReleasedTargetFlow(exact, 0, 10).epsilon()


def test_domain_box_marginal_start_and_bad_arguments():
    x, y = _data(600)
    x = x.clamp(-1, 4)
    th = _blocks(4, 2)
    rel = class_quantile_sketch(x, y, th, num_classes=2, sketch_bins=8, noise_multiplier=3.0, clip_radius=5.0,
                                block_size=4, generator=torch.Generator().manual_seed(0), secure_mode=False)
    f = ReleasedTargetFlow(rel, 0, 500, domain=(-1.0, 4.0), generator=torch.Generator().manual_seed(3))
    p0 = f.particles
    assert float(p0.min()) >= -1.0 and float(p0.max()) <= 4.0
    out = f.run(steps=6)
    assert f.steps_taken == 6 and float(out.min()) >= -1.0 and float(out.max()) <= 4.0
    init = torch.zeros(10, 4)
    torch.testing.assert_close(ReleasedTargetFlow(rel, 1, 10, init=init).particles, init)
    for bad, match in ((dict(class_index=2), "class_index"), (dict(step_size=1.5), "step_size"),
                       (dict(init="noise"), "init"), (dict(domain=(1.0, 0.0)), "domain"),
                       (dict(init_block=5), "init_block"), (dict(init=torch.zeros(3, 4)), "shape")):
        kw = dict(dict(class_index=0, num_particles=10), **bad)
        with pytest.raises(ValueError, match=match):
            ReleasedTargetFlow(rel, kw.pop("class_index"), kw.pop("num_particles"), **kw)
    with pytest.raises(ValueError, match="num_particles or particles_per_class"):
        ClassConditionalFlow.from_release(rel)
    assert math.isfinite(float(out.sum()))


# ---------------------------------------------------------------------------- issue 46: one set of conventions
def _release():
    x, y = _data(200)
    return class_quantile_sketch(x, y, _blocks(4, 1), num_classes=2, sketch_bins=4, noise_multiplier=0.0,
                                 clip_radius=5.0)


@pytest.mark.parametrize("bad", ["release", {"num_classes": 2}, None, 3])
def test_a_wrong_object_as_the_release_is_a_type_error(bad):
    for build in (lambda: ReleasedTargetFlow(bad, 0, 10), lambda: ReleasedClassFlows(bad, 10),
                  lambda: ClassConditionalFlow.from_release(bad, 10)):
        with pytest.raises(TypeError, match="^release must be a fastdpot.privacy.class_sketch.ClassSketchRelease"):
            build()


@pytest.mark.parametrize("domain", [(0.0,), (0.0, 1.0, 2.0), 3, "ab", ("a", "b"), (0.0, math.nan), (True, 2),
                                    (1.0, 1.0), (0.0, math.inf)])
def test_a_malformed_domain_is_refused_naming_it(domain):
    with pytest.raises(ValueError, match="^domain must be None or a pair"):
        ReleasedTargetFlow(_release(), 0, 10, domain=domain)


def test_half_precision_start_flags_and_generators_are_refused():
    rel = _release()
    for dtype in (torch.float16, torch.bfloat16):
        with pytest.raises(ValueError, match=rf"^init must have dtype in .*got {dtype}"):
            ReleasedTargetFlow(rel, 0, 10, init=torch.zeros(10, 4, dtype=dtype))
    for build in (lambda: ReleasedTargetFlow(rel, 0, 10, shrink="no"), lambda: ReleasedClassFlows(rel, 10, shrink=1)):
        with pytest.raises(ValueError, match="^shrink must be a bool"):
            build()
    for build in (lambda: ReleasedTargetFlow(rel, 0, 10, generator=3),
                  lambda: ReleasedClassFlows(rel, 10, generator=3)):
        with pytest.raises(TypeError, match="^generator must be a torch.Generator"):
            build()
    with pytest.raises(ValueError, match="^progress must be a bool"):
        ReleasedTargetFlow(rel, 0, 10).run(steps=1, progress="no")


def test_num_particles_beyond_memory_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^num_particles=1000000000000 needs about .* GiB"):
        ReleasedTargetFlow(_release(), 0, 10 ** 12)


def test_particles_per_class_must_agree_with_num_particles():
    rel = _release()
    with pytest.raises(ValueError, match="^num_particles=100 contradicts particles_per_class, whose sum is 10"):
        ReleasedClassFlows(rel, 100, particles_per_class=[5, 5])
    flows = ReleasedClassFlows(rel, 10, particles_per_class=[4, 6])  # both given, agreeing
    assert [f.num_particles for f in flows.flows] == [4, 6]
