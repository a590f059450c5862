"""DP-SGD with fixed-size batches (fastdpot.dpsgd) and the composed ledger of a multi-stage run
(fastdpot.privacy.composition): exact per-sample clipping, the released gradient replayed, the replace-one
sensitivity 2C checked by Monte Carlo over neighbouring batches, the ledger's ε recomputed with dp-accounting."""
import math

import dp_accounting
import pytest
import torch
from torch import nn

from fastdpot.dpsgd import clip_and_sum, train_dp_sgd
from fastdpot.privacy import BudgetExceededError
from fastdpot.privacy.composition import ComposedLedger


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, 2, 1), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))


def _loss(model, x, y):
    return nn.functional.cross_entropy(model(x), y, reduction="none")


def _data(n=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _per_sample_grads(model, x, y):
    out = []
    for i in range(x.shape[0]):
        loss = _loss(model, x[i:i + 1], y[i:i + 1]).sum()
        out.append(torch.autograd.grad(loss, list(model.parameters())))
    return [torch.stack([g[j] for g in out]) for j in range(len(out[0]))]


def test_clipping_is_exact_per_sample_over_all_parameters():
    x, y = _data(12)
    model = _model()
    gs = _per_sample_grads(model, x, y)
    C = 0.3
    got = clip_and_sum(gs, C)
    want = [torch.zeros_like(g[0]) for g in gs]
    for i in range(12):
        norm = math.sqrt(sum(float(g[i].double().pow(2).sum()) for g in gs))
        for w, g in zip(want, gs):
            w += g[i] * min(1.0, C / norm)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # every per-sample contribution has norm <= C (the sum of one sample's clipped grads)
    one = clip_and_sum([g[:1] for g in gs], C)
    assert math.sqrt(sum(float(t.double().pow(2).sum()) for t in one)) <= C * (1 + 1e-6)


def test_replace_one_sensitivity_is_2C_by_monte_carlo():
    # the clipped sum of a fixed-size batch moves by at most 2C when one record is replaced by any other
    g = torch.Generator().manual_seed(5)
    model, C, worst = _model(2), 0.05, 0.0
    for _ in range(30):
        x, y = _data(6, seed=int(torch.randint(0, 10 ** 6, (1,), generator=g)))
        x2, y2 = x.clone(), y.clone()
        x2[3] = torch.randn(1, 8, 8, generator=g) * 10
        y2[3] = (y[3] + 1) % 3
        a = clip_and_sum(_per_sample_grads(model, x, y), C)
        b = clip_and_sum(_per_sample_grads(model, x2, y2), C)
        worst = max(worst, math.sqrt(sum(float((u - v).double().pow(2).sum()) for u, v in zip(a, b))))
    assert worst <= 2 * C * (1 + 1e-5) and worst > 1.5 * C  # attained up to the directions' angle


def test_the_released_gradient_is_the_clipped_sum_plus_noise_replayed():
    from fastdpot.privacy import FixedSizeSampler
    from fastdpot.privacy.randomness import PrivacyRandomness

    x, y = _data(30)
    model, ref = _model(3), _model(3)
    C, z, B = 0.2, 1.3, 8
    seen = []

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            seen.append([p.grad.clone() for p in self.param_groups[0]["params"]])
            return super().step(closure)

    train_dp_sgd(model, x, _loss, targets=y, steps=1, batch_size=B, clip_radius=C, noise_multiplier=z,
                 optimizer=lambda ps: Spy(ps, lr=0.0), generator=torch.Generator().manual_seed(9), secure_mode=False)
    rng = PrivacyRandomness(False, torch.Generator().manual_seed(9))
    idx = FixedSizeSampler(30, B, generator=rng).sample()
    sums = clip_and_sum(_per_sample_grads(ref, x[idx], y[idx]), C)
    want = [(s + rng.normal(s.shape, dtype=s.dtype) * z * 2 * C) / B for s in sums]
    for a, b in zip(seen[0], want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_ledger_composes_stages_as_dp_accounting_does_and_refuses_beyond_epsilon():
    n = 500
    led = ComposedLedger(4.0, 1e-6)
    z1 = led.calibrate(40, dataset_size=n, batch_size=50, epsilon=2.0)
    led.record("representation", z1, 40, dataset_size=n, batch_size=50)
    assert led.epsilon() <= 2.0
    z2 = led.calibrate(30, dataset_size=n, batch_size=25, epsilon=3.5)
    led.record("flow", z2, 30, dataset_size=n, batch_size=25)
    z3 = led.calibrate(1, sampling="full", dataset_size=n)  # a DP statistic of all n records takes the rest
    led.record("mean", z3, 1, sampling="full", dataset_size=n)
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
                                          orders=list(__import__("fastdpot").privacy.DEFAULT_ORDERS))
    for s in led.stages:
        e = s["event"]
        gauss = dp_accounting.GaussianDpEvent(s["noise_multiplier"])
        ev = gauss if e["batch_size"] == e["dataset_size"] else \
            dp_accounting.SampledWithoutReplacementDpEvent(e["dataset_size"], e["batch_size"], gauss)
        acc.compose(ev, s["releases"])
    assert led.epsilon() == pytest.approx(acc.get_epsilon(1e-6), rel=1e-9)
    assert 3.9 < led.epsilon() <= 4.0 * (1 + 1e-9)
    with pytest.raises(BudgetExceededError, match="nothing was released"):
        led.record("flow", z2, 1000, dataset_size=n, batch_size=25)
    assert sum(s["releases"] for s in led.stages if s["stage"] == "flow") == 30


def test_train_dp_sgd_records_every_step_before_it_and_stops_at_the_budget():
    x, y = _data(40)
    led = ComposedLedger(1.0, 1e-5)
    z = led.calibrate(3, dataset_size=40, batch_size=10)
    res = train_dp_sgd(_model(), x, _loss, targets=y, steps=3, batch_size=10, clip_radius=1.0, noise_multiplier=z,
                       ledger=led, stage="ae")
    assert res.steps == 3 and led.stages[0]["releases"] == 3 and 0 < res.epsilon <= 1.0
    with pytest.raises(BudgetExceededError):
        train_dp_sgd(_model(), x, _loss, targets=y, steps=3, batch_size=10, clip_radius=1.0, noise_multiplier=z,
                     ledger=led, stage="ae")
    assert led.stages[0]["releases"] == 3  # the refused step released nothing and counted nothing


@pytest.mark.parametrize("kw,match", [
    (dict(batch_size=41), "batch_size"), (dict(clip_radius=0.0), "clip_radius"), (dict(noise_multiplier=-1.0),
                                                                                   "noise_multiplier"),
    (dict(steps=0), "steps"), (dict(loss_fn=lambda m, x, y: m(x).sum()), "one loss per sample"),
    (dict(progress="no"), "progress must be a bool"),  # issue 40: read by truthiness before (a bar shown)
])
def test_bad_arguments_are_refused_before_any_release(kw, match):
    x, y = _data(40)
    led = ComposedLedger(1.0, 1e-5)
    args = dict(steps=2, batch_size=10, clip_radius=1.0, noise_multiplier=1.0, ledger=led, targets=y)
    loss = kw.pop("loss_fn", _loss)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        train_dp_sgd(_model(), x, loss, **args)
    assert led.epsilon() == 0.0
