"""The private-only protocol (fastdpot flow --public-size 0): a quick end-to-end run on real Fashion-MNIST whose
composed ε is recomputed with dp-accounting, δ = 1/(N ln N), the sensitive rows handed only to the accounted
mechanisms; the split, the label map and the label-private Gaussian's sensitivity."""
import math

import dp_accounting
import pytest
import torch

import fastdpot.experiments.private_only as P
from fastdpot.experiments.config import PipelineConfig
from fastdpot.experiments.data.datasets import load_fashion_mnist_available
from fastdpot.privacy import DEFAULT_ORDERS
from fastdpot.privacy.composition import ComposedLedger


def test_protocol_delta_and_split():
    assert P.protocol_delta(55_000) == pytest.approx(1 / (55_000 * math.log(55_000)))
    assert 1.65e-6 < P.protocol_delta(55_000) < 1.67e-6
    s, v = P.private_split(60_000, 5_000, seed=3)
    assert len(s) == 55_000 and len(v) == 5_000 and not set(s.tolist()) & set(v.tolist())
    s2, v2 = P.private_split(60_000, 5_000, seed=3)
    assert torch.equal(s, s2) and torch.equal(v, v2)
    with pytest.raises(ValueError, match="validation_size"):
        P.private_split(100, 100, seed=0)


def test_labels_outside_the_public_domain_are_mapped_before_any_mechanism():
    y = torch.tensor([0, 9, 10, -1, 3])
    assert P._domain_labels(y).tolist() == [0, 9, 0, 0, 3]


def test_label_private_gaussian_sensitivity_by_monte_carlo():
    # the per-class (count, Σy, Σyyᵀ) vector moves by at most sqrt(6) when one record (y on the unit sphere, label c)
    # is replaced by any other (y', c'), the label free to change; attained with c != c'
    g = torch.Generator().manual_seed(0)
    d, C, worst = 3, P.NUM_CLASSES, 0.0

    def stats(y, lab):
        n = y.shape[0]
        out = torch.zeros(C, 1 + d + d * d, dtype=torch.float64)
        out.index_add_(0, lab, torch.cat([torch.ones(n, 1, dtype=torch.float64), y,
                                          (y[:, :, None] * y[:, None, :]).reshape(n, -1)], 1))
        return out

    for _ in range(200):
        y = torch.nn.functional.normalize(torch.randn(8, d, generator=g, dtype=torch.float64), dim=1)
        lab = torch.randint(0, C, (8,), generator=g)
        y2, lab2 = y.clone(), lab.clone()
        y2[0] = torch.nn.functional.normalize(torch.randn(d, generator=g, dtype=torch.float64), dim=0)
        lab2[0] = int(torch.randint(0, C, (1,), generator=g))
        worst = max(worst, float((stats(y, lab) - stats(y2, lab2)).norm()))
    assert worst <= math.sqrt(6.0) * (1 + 1e-12) and worst > math.sqrt(6.0) * 0.999


def _independent_epsilon(stages, delta):
    acc = dp_accounting.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS),
                                          neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    for s in stages:
        e = s["event"]
        gauss = dp_accounting.GaussianDpEvent(s["noise_multiplier"])
        ev = gauss if e["batch_size"] == e["dataset_size"] else \
            dp_accounting.SampledWithoutReplacementDpEvent(e["dataset_size"], e["batch_size"], gauss)
        acc.compose(ev, s["releases"])
    return acc.get_epsilon(delta)


def test_the_label_private_gaussian_records_its_one_release():
    led = ComposedLedger(2.0, 1e-5)
    lat = torch.nn.functional.normalize(torch.randn(300, 4, generator=torch.Generator().manual_seed(1)), dim=1)
    lab = torch.arange(300) % P.NUM_CLASSES
    x, y, info = P.dp_gaussian_label_private(lat, lab, led, 500, torch.Generator().manual_seed(2))
    assert x.shape == (500, 4) and y.shape == (500,) and info["sensitivity"] == pytest.approx(math.sqrt(6))
    assert led.stages[0]["releases"] == 1 and led.stages[0]["event"]["batch_size"] == 300
    assert led.epsilon() == pytest.approx(_independent_epsilon(led.stages, 1e-5), rel=1e-9) and led.epsilon() <= 2.0


@pytest.mark.skipif(not load_fashion_mnist_available(), reason="needs the dataset-fashion-mnist package")
@pytest.mark.parametrize("kind", ["pca", "autoencoder"])
def test_quick_private_only_run_on_fashion_mnist(tmp_path, monkeypatch, kind):
    import fastdpot.dpsgd as dpsgd
    import fastdpot.experiments.dp_representation as R
    import fastdpot.flows.class_conditional as cc

    handed = {}
    real_train, real_moment, real_run = dpsgd.train_dp_sgd, R.dp_second_moment, cc.ClassConditionalFlow.run

    def train_spy(model, data, loss_fn, **kw):
        handed["representation"] = (data.clone(), kw["ledger"])
        return real_train(model, data, loss_fn, **kw)

    def moment_spy(rows, noise_std, rng):
        handed["representation"] = (rows.clone(), noise_std)
        return real_moment(rows, noise_std, rng)

    def run_spy(self, private_data, labels, **kw):
        handed["flow"] = (private_data.clone(), labels.clone())
        return real_run(self, private_data, labels, **kw)

    monkeypatch.setattr(dpsgd, "train_dp_sgd", train_spy)
    monkeypatch.setattr(R, "dp_second_moment", moment_spy)
    monkeypatch.setattr(cc.ClassConditionalFlow, "run", run_spy)
    cfg = PipelineConfig(dataset="fashion-mnist", public_size=0, epsilon=8.0, max_train=1200, max_test=300,
                         validation_size=200, rep_epochs=0.5, rep_batch_size=100, epochs=1.0, batch_size=50,
                         num_particles=200, fid_samples=50, fid_real=50, classifiers="cnn", cnn_epochs=1,
                         latent_dim=6, ae_width=4, rep_kind=kind)
    m = P.run_private_only(cfg, str(tmp_path / "run"), progress=False, cache_dir=str(tmp_path / "cache"))
    n = m["n_sensitive"]
    assert n == 1000 and m["n_validation"] == 200
    assert m["delta"] == pytest.approx(1 / (n * math.log(n)))
    assert [s["stage"] for s in m["stages"]] == ["representation", "flow"]
    assert m["stages"][0]["releases"] == (1 if kind == "pca" else 5)
    assert m["epsilon"] == pytest.approx(_independent_epsilon(m["stages"], m["delta"]), rel=1e-9)
    assert 7.9 < m["epsilon"] <= 8.0 * (1 + 1e-9)  # the flow takes the rest of the composed budget
    # the sensitive rows reach only the accounted mechanisms: the representation's mechanism gets the sensitive
    # images, the flow the codes of the same images; nothing else is handed private rows for training
    from fastdpot.experiments.data import load_dataset

    train = load_dataset("fashion-mnist", "train", None, None, 1200)
    sens, _ = P.private_split(1200, 200, seed=0)
    data, noise = handed["representation"]
    if kind == "pca":  # images scaled by 1/S, the noise z·sqrt(2) of the stage's recorded multiplier
        assert torch.equal(data, train.images[sens].flatten(1).double() / (255.0 * 16.0))
        assert noise == pytest.approx(m["stages"][0]["noise_multiplier"] * math.sqrt(2))
    else:
        assert torch.equal(data, train.images[sens].float() / 255.0) and noise is not None
    lat, lab = handed["flow"]
    assert lat.shape == (n, 6) and torch.equal(lab, train.labels[sens])
    assert set(m) >= {"accuracy_cnn", "fid", "label_fidelity", "wall_time_s"}
    assert 0.0 <= m["label_fidelity"] <= 1.0
    assert f"({m['epsilon']:.4g}," in (tmp_path / "run" / "privacy.md").read_text()


def test_summary_groups_runs_by_method_epsilon_and_dimension(tmp_path):
    import json

    def run(name, method, eps, d, acc, composed):
        (tmp_path / name).mkdir()
        m = dict(method=method, epsilon_target=eps, epsilon=composed, labels_from="flow",
                 representation=dict(latent_dim=d), accuracy_cnn=acc, fid=50.0, fid_test=55.0, label_fidelity=0.8,
                 wall_time_s=dict(total=600.0))
        (tmp_path / name / "metrics.json").write_text(json.dumps(m))

    run("a", "flow", 10.0, 32, 0.70, 9.99)
    run("b", "flow", 10.0, 32, 0.80, 9.98)
    run("c", "decoded", "inf", 32, 0.84, "inf")  # metrics.json spells ∞ "inf"
    run("d", "decoded", "inf", 16, 0.79, "inf")
    run("e", "flow", "inf", 32, 0.75, "inf")
    (tmp_path / "not_a_run").mkdir()
    rows = [r for r in P.summarize(str(tmp_path)).splitlines()[2:]]
    assert len(rows) == 4  # the two ε = 10 seeds pooled into one row; the caps at d = 32 and d = 16 apart
    assert "| flow | ∞ | ∞ (not private) |" in next(r for r in rows if "75.0" in r)
    for method, eps in (("flow", "inf"), ("decoded", "inf"), ("decoded", 10.0)):
        text = P._privacy_md(dict(method=method, epsilon="inf", epsilon_target=eps))
        assert "no differential-privacy guarantee" in text
    flow = next(r for r in rows if r.startswith("| flow | 10 |"))
    assert "| 2 | 75.0 ± 7.1 |" in flow and "| 32 |" in flow
    assert sum(r.startswith("| decoded") for r in rows) == 2
