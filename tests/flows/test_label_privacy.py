"""Label-private class-conditional flows (fastdpot.label_flow, ClassConditionalFlow(label_privacy="private")):
the sensitivity of the embedded rows [clip_r(x), c·e_y] by Monte Carlo (per-point and sketch releases, random and
adversarial neighbours with a label change), nothing published from the private class counts, recovery of the
labels and class-conditional shape on a small labelled mixture, and the state-dict round trip."""
from __future__ import annotations

import math

import pytest
import torch

from fastdpot._random import random_projections
from fastdpot.flows import ClassConditionalFlow
from fastdpot.flows.allocation import allocate_particles
from fastdpot.flows.labelled import LabelledRowsFlow, embed_labelled_rows, label_rows, labelled_rows_diameter
from fastdpot.privacy import orthogonal_sliced_sensitivity, sliced_quantile_sketch


def _gen(s):
    return torch.Generator().manual_seed(s)


def _pairs(num, d, C, r, gen):
    """Raw neighbouring rows (v, v') in R^{d+C}: random ones (unbounded features, garbage label blocks) and
    adversarial ones (x' = −x on the sphere of radius r, label changed), every pair with y != y'."""
    v = torch.randn(num, d + C, generator=gen, dtype=torch.float64) * 5.0
    w = torch.randn(num, d + C, generator=gen, dtype=torch.float64) * 5.0
    x = torch.randn(num, d, generator=gen, dtype=torch.float64)
    x = x / x.norm(dim=1, keepdim=True) * r
    y = torch.randint(0, C, (num,), generator=gen)
    y2 = (y + 1 + torch.randint(0, C - 1, (num,), generator=gen)) % C
    oh = torch.nn.functional.one_hot
    adv = torch.cat([x, oh(y, C).double()], 1), torch.cat([-x, oh(y2, C).double()], 1)
    return torch.cat([v, adv[0]]), torch.cat([w, adv[1]])


def test_diameter_and_sensitivity_formula():
    assert labelled_rows_diameter(1.0, 1.0) == pytest.approx(math.sqrt(6.0), rel=1e-15)
    f = LabelledRowsFlow(8, 7, 14, 0.5, num_classes=3, label_scale=2.0, clip_radius=0.5, noise_multiplier=1.0,
                         batch_size=4, steps=3, directions="orthogonal", secure_mode=False, generator=_gen(0))
    # Δ = sqrt(4r² + 2c²)·sqrt(⌈k/D⌉) with D = d + C = 7, k = 14: two blocks
    assert f.sensitivity == pytest.approx(math.sqrt(4 * 0.25 + 2 * 4.0) * math.sqrt(2.0), rel=1e-14)
    assert f.feature_dim == 4 and f.noise_std == pytest.approx(f.sensitivity, rel=1e-14)
    # the uniform directions' tail bound at dimension D with the same diameter
    u = LabelledRowsFlow(8, 7, 14, 0.5, num_classes=3, label_scale=2.0, clip_radius=0.5, noise_multiplier=1.0,
                         batch_size=4, steps=3, secure_mode=False, generator=_gen(0))
    plain = __import__("fastdpot").privacy.sliced_sensitivity(14, 7, u.delta_split[1], diameter=u.row_diameter)
    assert u.sensitivity == pytest.approx(plain, rel=1e-14)


@pytest.mark.parametrize("normalize", [False, True])
def test_embedded_rows_monte_carlo_per_point_and_sketch(normalize):
    """Orthogonal directions: the release's change never exceeds Δ, and adversarial neighbours reach it (so the
    features-only diameter 2r would be violated: the label term is needed)."""
    d, C, r, c, k, B, L = 3, 4, 0.7, 1.3, 7, 12, 4
    D = d + C
    g = _gen(1)
    f = LabelledRowsFlow(8, D, k, 0.5, num_classes=C, label_scale=c, clip_radius=r, normalize=normalize,
                         noise_multiplier=1.0, batch_size=B, steps=2, directions="orthogonal", secure_mode=False,
                         generator=_gen(2))
    delta = f.sensitivity
    assert delta == pytest.approx(orthogonal_sliced_sensitivity(k, D, diameter=math.sqrt(4 * r * r + 2 * c * c)))
    v, w = _pairs(60, d, C, r, g)
    pp, sk = [], []
    for i in range(v.shape[0]):
        theta = random_projections(k, D, g, orthogonal=True, dtype=torch.float64)
        batch = torch.randn(B, D, generator=g, dtype=torch.float64) * 3.0
        j = int(torch.randint(0, B, (1,), generator=g))
        b1, b2 = batch.clone(), batch.clone()
        b1[j], b2[j] = v[i], w[i]
        e1, e2 = f._clip(b1), f._clip(b2)  # the flow's in-mechanism row map
        pp.append(float(((e1 - e2) @ theta.T).norm()))
        s1, s2 = (sliced_quantile_sketch(e, theta, L, 0.0, clip_radius=math.sqrt(r * r + c * c), secure_mode=False,
                                         generator=_gen(0)) for e in (e1, e2))
        sums = [s.means * s.sizes.double() for s in (s1, s2)]
        sk.append(float((sums[0] - sums[1]).norm()))
    pp, sk = torch.tensor(pp, dtype=torch.float64), torch.tensor(sk, dtype=torch.float64)
    tol = 1e-9 * delta
    assert float(pp.max()) <= delta + tol and float(sk.max()) <= delta + tol
    # the adversarial half reaches Δ (one full orthogonal block: ‖Θu‖ = ‖u‖), above the features-only bound 2r
    assert float(pp[60:].min()) == pytest.approx(delta, rel=1e-9)
    assert float(sk[60:].max()) > 2 * r * 1.05
    # every embedded row: feature block within r, label block c·e_j
    e = embed_labelled_rows(v, d, r, c, normalize)
    assert bool((e[:, :d].norm(dim=1) <= r * (1 + 1e-12)).all())
    assert torch.equal(torch.sort(e[:, d:], dim=1).values[:, :-1], torch.zeros(e.shape[0], C - 1, dtype=e.dtype))
    assert torch.allclose(e[:, d:].sum(1), torch.full((e.shape[0],), c, dtype=e.dtype))


def test_embedded_rows_monte_carlo_uniform_tail():
    """Uniform directions: the adversarial pair exceeds Δ (tail bound at dimension D with the rows' diameter) with
    frequency at most about δ_tail, while a features-only bound 2r·sqrt(w) would be exceeded almost always."""
    d, C, r, c, k = 2, 3, 1.0, 1.0, 6
    D = d + C
    f = LabelledRowsFlow(8, D, k, 0.5, num_classes=C, label_scale=c, clip_radius=r, noise_multiplier=1.0,
                         batch_size=4, steps=1, delta=0.1, secure_mode=False, generator=_gen(3))
    tail = f.delta_split[1]
    assert tail == pytest.approx(0.05)
    u = torch.zeros(1, D, dtype=torch.float64)
    u[0, 0], u[0, d], u[0, d + 1] = 2 * r, c, -c  # x' = −x, label 0 -> 1: ‖u‖ = sqrt(4r² + 2c²)
    g = _gen(4)
    m = 4000
    norms = torch.tensor([float((u @ random_projections(k, D, g, dtype=torch.float64).T).norm()) for _ in range(m)],
                         dtype=torch.float64)
    over = float((norms > f.sensitivity).double().mean())
    assert over <= tail + 4 * math.sqrt(tail * (1 - tail) / m)
    assert float((norms > f.sensitivity * 2 * r / f.row_diameter).double().mean()) > 0.1


def _three_classes(n, props, gen):
    means = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    lab = torch.multinomial(torch.tensor(props), n, replacement=True, generator=gen)
    return means[lab] + 0.3 * torch.randn(n, 2, generator=gen), lab, means


def test_private_mode_recovers_labels_and_class_shape():
    """A 3-class 2-D mixture with proportions 0.6/0.3/0.1: particles start in equal thirds; the sketch flow at
    z = 1.3 (ε ≈ 10 at δ = 1e-5 for these n, B, T) moves them to the private proportions and class means (no
    private count is read)."""
    x, lab, means = _three_classes(2000, [0.6, 0.3, 0.1], _gen(1))
    cc = ClassConditionalFlow(300, 2, 5, 1.0, num_classes=3, label_scale=2.0, clip_radius=3.0, batch_size=200, steps=100,
                              directions="orthogonal", noise_multiplier=1.3, release="sketch", sketch_bins=10,
                              secure_mode=False, generator=_gen(5))
    cc._build_private()
    assert torch.bincount(cc.samples()[1]).tolist() == [100, 100, 100]
    xs, ys = cc.run(x, lab, progress=False)
    assert xs.shape == (300, 2) and ys.shape == (300,) and len(cc.flows) == 1
    props = torch.bincount(ys, minlength=3).double() / 300
    assert (props - torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)).abs().max() < 0.05
    for k in range(3):  # the class means are >= 3.4 apart; the rare class's 30 particles carry the sketch's noise
        assert float((xs[ys == k].mean(0) - means[k]).norm()) < 0.6
        assert float(xs[ys == k].std(0).mean()) < 0.9


def _meta(cc):
    f = cc.flows[0]
    return dict(config=f.config, z=f.noise_multiplier, sigma=f.noise_std, delta=f.sensitivity, eps=f.epsilon(),
                steps=f.steps_taken, split=f.delta_split, n=f._bound_n, batch=f._bound_batch,
                particles=cc.num_particles)


def test_private_mode_publishes_nothing_from_class_counts():
    """Two data sets with the same features and n but different class sizes: the label-private mode's metadata
    (config, z, σ, Δ, ε, B, T, initial particles) are identical; the per-class mode's differ (so this test fails on
    the old behaviour)."""
    g = _gen(7)
    x = torch.randn(600, 2, generator=g)
    lab_a = torch.cat([torch.zeros(400), torch.ones(150), torch.full((50,), 2)]).long()
    lab_b = torch.cat([torch.zeros(100), torch.ones(200), torch.full((300,), 2)]).long()
    kw = dict(num_classes=3, clip_radius=2.0, batch_size=40, steps=4, noise_multiplier=2.0, directions="orthogonal",
              secure_mode=False)
    starts, metas = [], []
    for lab in (lab_a, lab_b):
        cc = ClassConditionalFlow(60, 2, 5, 0.5, generator=_gen(3), **kw)
        cc._build_private()
        starts.append(cc.samples()[0].clone())
        cc.run(x, lab, progress=False)
        metas.append(_meta(cc))
    assert metas[0] == metas[1] and torch.equal(starts[0], starts[1])
    pub = []
    for lab in (lab_a, lab_b):
        cc = ClassConditionalFlow(60, 2, 5, 0.5, generator=_gen(3), label_privacy="public",
                                  particles_per_class="equal", **kw)
        cc.run(x, lab, progress=False)
        pub.append([f.config.batch_size / f._bound_n for f in cc.flows])  # q_c = B/n_c, accounted and shown
    assert pub[0] != pub[1]


def test_private_mode_state_dict_round_trip_and_resume(tmp_path):
    x, lab, _ = _three_classes(400, [0.5, 0.3, 0.2], _gen(2))
    kw = dict(num_classes=3, label_scale=1.5, clip_radius=3.0, batch_size=50, steps=6, noise_multiplier=1.0,
              release="sketch", sketch_bins=5, secure_mode=False, particles_per_class=[10, 12, 14])
    full = ClassConditionalFlow(36, 2, 5, 0.5, generator=_gen(4), **kw)
    xf, yf = full.run(x, lab, progress=False)
    path = str(tmp_path / "cc.pt")
    part = ClassConditionalFlow(36, 2, 5, 0.5, generator=_gen(4), **kw)
    part.run(x, lab, steps=3, progress=False, checkpoint_path=path)
    back = ClassConditionalFlow.load(path)
    assert back.label_privacy == "private" and back.label_scale == 1.5 and isinstance(back.flows[0], LabelledRowsFlow)
    torch.testing.assert_close(back.samples()[0], part.samples()[0], rtol=0, atol=0)
    assert back.flows[0].sensitivity == full.flows[0].sensitivity
    xr, yr = back.run(x, lab, progress=False)
    torch.testing.assert_close(xr, xf, rtol=0, atol=0)
    assert torch.equal(yr, yf) and back.epsilon() == full.epsilon() and xr.shape == (36, 2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(), "num_classes is required"),
    (dict(num_classes=3, particles_per_class="proportional"), "proportional"),
    (dict(num_classes=3, label_scale=0.0), "label_scale"),
    (dict(num_classes=3, label_privacy="public", label_scale=2.0), "label_scale is only used"),
    (dict(num_classes=3, label_privacy="hidden"), "label_privacy"),
])
def test_private_mode_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ClassConditionalFlow(30, 2, 4, 0.5, **kwargs)


def test_private_mode_bad_labels_change_nothing():
    cc = ClassConditionalFlow(30, 2, 4, 0.5, num_classes=3, noise_multiplier=1.0, batch_size=5, steps=2)
    x = torch.randn(20, 2, generator=_gen(0))
    with pytest.raises(ValueError, match="integer"):
        cc.run(x, (torch.arange(20) % 3).float(), progress=False)
    assert cc.flows == []
    with pytest.raises(ValueError, match="num_classes must be < dim"):
        LabelledRowsFlow(4, 3, 2, 0.5, num_classes=3)
    with pytest.raises(ValueError, match="class_particles"):
        LabelledRowsFlow(4, 5, 2, 0.5, num_classes=3, class_particles=[1, 1, 1])
    assert allocate_particles(10, "equal", 3, minimum=1) == [4, 3, 3]
    assert allocate_particles(10, [0, 1, 3], 3, minimum=1) == [1, 3, 6]
    assert label_rows(x[:3], torch.tensor([2, 0, 1]), 3)[:, 2:].argmax(1).tolist() == [2, 0, 1]


@pytest.mark.parametrize("label_privacy", ["private", "public"])
def test_checkpoint_every_without_a_path_is_refused_before_any_release(label_privacy):
    cc = ClassConditionalFlow(30, 2, 4, 0.5, num_classes=3, noise_multiplier=1.0, batch_size=5, steps=2,
                              label_privacy=label_privacy)
    x = torch.randn(30, 2, generator=_gen(0))
    with pytest.raises(ValueError, match="checkpoint_every=1 needs checkpoint_path"):
        cc.run(x, torch.arange(30) % 3, progress=False, checkpoint_every=1)
    assert cc.flows == [] and cc.epsilon() == 0.0


@pytest.mark.slow
def test_main_job_label_private_mode_publishes_nothing_from_class_counts(monkeypatch):
    """generate_flow with labels='private' on two label vectors with the same n and different class sizes: the
    privacy record and privacy.md are identical and name the relation; the per-class mode's record differs."""
    import fastdpot.experiments.mainjob.pipeline as pl
    from fastdpot.experiments.mainjob import MainJobConfig, cli
    from fastdpot.experiments.mainjob.generation import generate_flow
    from fastdpot.experiments.mainjob.privacy_report import _flow_md

    def _privacy_md(cfg, result):
        return "\n".join(x for x in _flow_md(cfg, result) if x is not None)

    def Cfg(**kw):
        return MainJobConfig().with_settings(**kw)

    seen = {}
    monkeypatch.setattr(pl, "run_pipeline", lambda cfg, *a, **kw: seen.setdefault("cfg", cfg) and {})
    assert cli.main(["flow", "--labels", "private", "--label-scale", "2", "--no-progress"]) == 0
    assert seen["cfg"].generation.labels == "private" and seen["cfg"].generation.label_scale == 2.0
    assert Cfg().resolved().generation.labels == "private"  # secure by default
    assert Cfg(method="gaussian").resolved().generation.labels == "public"
    g = _gen(0)
    lat = torch.nn.functional.normalize(torch.randn(120, 4, generator=g), dim=1)
    lab_a = torch.cat([torch.zeros(70), torch.ones(25), torch.full((25,), 2)]).long()
    lab_b = torch.cat([torch.zeros(25), torch.ones(40), torch.full((55,), 2)]).long()
    pub = torch.arange(90) % 3
    out = {}
    for mode in ("private", "public"):
        cfg = MainJobConfig(replayable_noise=True, epsilon=10.0 if mode == "private" else math.inf).with_settings(
            labels=mode, latent_dim=4, **{"generation.epochs": 1.0, "generation.batch_size": 20}).resolved()
        for name, lab in (("a", lab_a), ("b", lab_b)):
            fl = generate_flow(cfg, lat, lab, 30, 3, progress=False, public_labels=pub)
            text = _privacy_md(cfg, dict(privacy=fl["privacy"], dataset="synthetic", n_public=90, n_private=120,
                                         latent_dim=4, epsilon=fl["epsilon"]))
            out[mode, name] = fl, text
    (fa, ta), (fb, tb) = out["private", "a"], out["private", "b"]
    assert fa["privacy"] == fb["privacy"] and ta == tb and fa["epsilon"] == fb["epsilon"]
    assert fa["privacy"]["flows"][0]["n"] == 120 and fa["privacy"]["num_projections"] == 4 + 3
    assert "ITS LABEL FREE TO CHANGE" in ta and "sqrt(4r² + 2c²)" in ta and "ASSUMED PUBLIC" not in ta
    assert fa["samples"].shape == (30, 4) and fa["sample_labels"].shape == (30,)
    assert out["public", "a"][0]["privacy"]["flows"] != out["public", "b"][0]["privacy"]["flows"]
    with pytest.raises(ValueError, match="public_labels"):
        generate_flow(Cfg(labels="private", latent_dim=4).resolved(), lat, lab_a, 30, 1, progress=False)
    with pytest.raises(ValueError, match="labels"):
        Cfg(labels="hidden").resolved()


def test_private_mode_refuses_a_process_group_clearly():
    import torch.distributed as dist

    with pytest.raises(ValueError, match="process_group is not supported with label_privacy='private'"):
        ClassConditionalFlow(10, 3, 4, 0.5, num_classes=2, process_group=object())
    assert not dist.is_initialized()


def test_distributed_main_job_refuses_the_label_private_default(capsys):
    # the sharded main job runs the per-class flows only: the default (label-private) stops before any work, naming
    # the flag that states the weaker relation
    from fastdpot.experiments.mainjob import cli

    assert cli.main(["flow", "--distributed", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--labels public" in err and "not sharded" in err
