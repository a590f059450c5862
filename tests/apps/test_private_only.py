"""The private-only protocol (fastdpot flow --public-size 0): a quick end-to-end run on real Fashion-MNIST whose
composed ε is recomputed with dp-accounting, δ = 1/(N ln N), the sensitive rows handed only to the accounted
mechanisms; the split and the label map; the seeds and the cache of a release inside the run's ε."""
import json
import math

import dp_accounting
import pytest
import torch

from fastdpot.experiments.data.datasets import load_fashion_mnist_available
from fastdpot.experiments.mainjob import MainJobConfig, run_pipeline
from fastdpot.experiments.mainjob.generation import generate_gaussian
from fastdpot.experiments.mainjob.privacy_report import _private_only_md
from fastdpot.experiments.mainjob.protocols import NUM_CLASSES, private_split, protocol_delta
from fastdpot.experiments.mainjob.report import summarize
from fastdpot.privacy import DEFAULT_ORDERS
from fastdpot.privacy.composition import ComposedLedger

needs_fmnist = pytest.mark.skipif(not load_fashion_mnist_available(), reason="needs the dataset-fashion-mnist package")


def test_protocol_delta_and_split():
    assert protocol_delta(55_000) == pytest.approx(1 / (55_000 * math.log(55_000)))
    assert 1.65e-6 < protocol_delta(55_000) < 1.67e-6
    s, v = private_split(60_000, 5_000, seed=3)
    assert len(s) == 55_000 and len(v) == 5_000 and not set(s.tolist()) & set(v.tolist())
    s2, v2 = private_split(60_000, 5_000, seed=3)
    assert torch.equal(s, s2) and torch.equal(v, v2)
    with pytest.raises(ValueError, match="validation_size"):
        private_split(100, 100, seed=0)


def _independent_epsilon(stages, delta, rdp=False):
    """dp-accounting directly: the PLD of the composed Gaussians when every stage releases the whole data set (their
    composition is one Gaussian), else (or with ``rdp``) RDP (replace-one, sampling without replacement)."""
    if not rdp and all(s["event"]["batch_size"] == s["event"]["dataset_size"] for s in stages):
        pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
        for s in stages:
            pld.compose(dp_accounting.GaussianDpEvent(s["noise_multiplier"]), s["releases"])
        return pld.get_epsilon(delta)
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
    lab = torch.arange(300) % NUM_CLASSES
    cfg = MainJobConfig(epsilon=2.0).with_settings(public_size=0, method="gaussian").resolved()
    out = generate_gaussian(cfg, lat, lab, 500, 2, ledger=led, num_classes=NUM_CLASSES)
    x, y, info = out["samples"], out["sample_labels"], out["privacy"]
    assert x.shape == (500, 4) and y.shape == (500,) and info["sensitivity"] == pytest.approx(math.sqrt(6))
    assert led.stages[0]["releases"] == 1 and led.stages[0]["event"]["batch_size"] == 300
    assert led.epsilon() == pytest.approx(_independent_epsilon(led.stages, 1e-5), rel=1e-9) and led.epsilon() <= 2.0


def _stated(text):
    """The (ε, δ) privacy.md states, and the noise multipliers, releases and batch / n of its stage table."""
    import re

    eps = float(re.search(r"\*\*\(([0-9.]+), [0-9.e+-]+\)-differentially private\*\*", text).group(1))
    delta = float(re.search(r"at δ = ([0-9.e+-]+)\. Why", text).group(1))
    rows = re.findall(r"^\| \w+ \| [^|]* \| ([0-9.e+-]+) \| (\d+) \| (\d+) / (\d+) \|$", text, re.M)
    return eps, delta, [(float(z), int(r), int(b), int(n)) for z, r, b, n in rows]


@pytest.mark.parametrize("kind", ["oneshot", "flow"])
def test_privacy_md_names_the_accountant_call_and_recomputing_it_gives_the_stated_epsilon(kind):
    """privacy.md names dp-accounting's exact call (class, event, neighbouring relation) and says why that relation;
    the call as named, on the table's numbers as printed, gives the stated ε (to the last printed digit). The
    one-shot run's full-batch Gaussians: PLD under ADD_OR_REMOVE_ONE (replace-one would state more: Δ already
    covers a replacement); the per-step flow's batches: RDP under REPLACE_ONE."""
    n, delta = 55_000, protocol_delta(55_000)
    led = ComposedLedger(10.0, delta)
    if kind == "oneshot":
        led.record("means", 1.6856113430172912, sampling="full", dataset_size=n)
        led.record("sketch", 0.5618704476724304, sampling="full", dataset_size=n)
    else:
        led.record("representation", 2.0, sampling="full", dataset_size=n)
        led.record("flow", 1.1, 400, dataset_size=n, batch_size=100)
    m = dict(method=kind, epsilon=led.epsilon(), epsilon_target=10.0, delta=delta, n_sensitive=n, n_validation=5000,
             representation=dict(kind="pixels" if kind == "oneshot" else "pca"), stages=led.stages,
             accountant=led.accountant_used, noise="secret (operating-system CSPRNG; not stored)")
    text = "\n".join(_private_only_md(m))
    assert "replace-one relation)" not in text  # the old words, which named the wrong relation for the PLD
    eps, d, rows = _stated(text)
    assert d == delta and len(rows) == 2 and "Why " in text
    nr = dp_accounting.NeighboringRelation
    if kind == "oneshot":
        assert ("`dp_accounting.pld.PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation."
                "ADD_OR_REMOVE_ONE, value_discretization_interval=1e-3)`") in text
        assert "`dp_accounting.GaussianDpEvent(z)` once per release" in text

        def recompute(relation):
            acc = dp_accounting.pld.PLDAccountant(neighboring_relation=relation, value_discretization_interval=1e-3)
            for z, releases, _, _ in rows:
                for _ in range(releases):
                    acc.compose(dp_accounting.GaussianDpEvent(z))
            return acc.get_epsilon(d)

        # the relation matters: dp-accounting's replace-one doubles Δ and states more than the noise gives
        assert recompute(nr.REPLACE_ONE) > 2 * eps
    else:
        assert ("`dp_accounting.rdp.RdpAccountant(orders=fastdpot.privacy.DEFAULT_ORDERS, neighboring_relation="
                "dp_accounting.NeighboringRelation.REPLACE_ONE)`") in text
        assert "`dp_accounting.SampledWithoutReplacementDpEvent(n, B, dp_accounting.GaussianDpEvent(z))`" in text

        def recompute(relation):
            acc = dp_accounting.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS), neighboring_relation=relation)
            for z, releases, b, size in rows:
                g = dp_accounting.GaussianDpEvent(z)
                acc.compose(g if b == size else dp_accounting.SampledWithoutReplacementDpEvent(size, b, g), releases)
            return acc.get_epsilon(d)
    # 4 significant digits printed: the recomputed ε must round to them (z printed to 6 digits moves ε by < 1e-4)
    assert abs(recompute(nr.ADD_OR_REMOVE_ONE if kind == "oneshot" else nr.REPLACE_ONE) - eps) <= 0.6 * 10 ** (
        math.floor(math.log10(eps)) - 3)


def _quick(tmp_path, **kw):
    settings = dict(dataset="fashion-mnist", public_size=0, max_train=1200, max_test=300, validation_size=200,
                    num_particles=200, fid_samples=50, fid_real=50, classifiers="cnn", cnn_epochs=1, latent_dim=6,
                    ae_width=4, **{"representation.epochs": 0.5, "representation.batch_size": 100})
    if kw.get("method") == "flow":  # the per-step flow's settings (another method refuses them: it would ignore them)
        settings.update({"generation.epochs": 1.0, "generation.batch_size": 50})
    return MainJobConfig(epsilon=8.0).with_settings(**dict(settings, **kw))


@needs_fmnist
@pytest.mark.parametrize("kind", ["pca", "autoencoder"])
def test_quick_private_only_run_on_fashion_mnist(tmp_path, monkeypatch, kind):
    import fastdpot.dpsgd as dpsgd
    import fastdpot.experiments.mainjob.representation as R
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
    cfg = _quick(tmp_path, kind=kind, method="flow")  # the per-step label-private flow (DPSWflow-r)
    m = run_pipeline(cfg, str(tmp_path / "run"), progress=False, cache_dir=str(tmp_path / "cache"))
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
    sens, _ = private_split(1200, 200, seed=0)
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
    text = (tmp_path / "run" / "privacy.md").read_text()
    assert f"({m['epsilon']:.4g}," in text and "Rényi-DP accountant" in text  # subsampled flow steps: RDP
    assert "one composed ledger (RDP" in m["epsilon_composition"]
    # issue 46: epsilon.png, and its numbers: the representation alone, then with the flow (the run's ε)
    from ..test_plot import _picture_ok

    _picture_ok(str(tmp_path / "run" / "epsilon.png"))
    assert not (tmp_path / "run" / "quantiles.png").exists()
    spent = m["epsilon_stages"]
    assert [s["stage"].split(",")[0] for s in spent] == ["representation", "flow"]
    rep = _independent_epsilon(m["stages"][:1], m["delta"], rdp=True)  # in the run's accountant (RDP)
    assert spent[0]["epsilon"] == pytest.approx(rep, rel=1e-9) and spent[0]["epsilon"] < spent[1]["epsilon"]
    assert spent[1]["epsilon"] == pytest.approx(m["epsilon"], rel=1e-12)
    # the CNN's checkpoint chosen on the validation split; the FID statistics of the sensitive set (and of the test
    # set) cached by content in the user's cache, said to be sensitive-derived, and absent from the run folder
    assert m["cnn_selected_epoch"] == 1 and len(m["cnn_validation_accuracy"]) == 1  # cnn_epochs=1
    assert "the validation split (200 images)" in m["cnn_selection"]
    stats = tmp_path / "cache" / "fid_real_stats"
    assert "sensitive-derived" in (stats / "README.txt").read_text() and len(list(stats.glob("*.npz"))) == 2
    assert not list((tmp_path / "run").rglob("*.npz"))
    assert "`fid_real_stats/` folder of the user's cache" in text and "sensitive-derived data" in text


def test_summary_groups_runs_by_method_epsilon_and_dimension(tmp_path):
    def run(name, method, eps, d, acc, composed, fid=True):
        (tmp_path / name).mkdir()
        m = dict(method=method, epsilon_target=eps, epsilon=composed, labels_from="flow",
                 representation=dict(latent_dim=d), accuracy_cnn=acc, label_fidelity=0.8, wall_time_s=dict(total=600.0))
        if fid:
            m.update(fid=50.0, fid_test=55.0, fid_generated_samples=10000, fid_real_samples=10000)
        (tmp_path / name / "metrics.json").write_text(json.dumps(m))

    run("a", "flow", 10.0, 32, 0.70, 9.99)
    run("b", "flow", 10.0, 32, 0.80, 9.98)
    run("b2", "flow", 10.0, 32, 0.75, 9.98, fid=False)  # a seed measured without FID: accuracy only
    run("c", "decoded", "inf", 32, 0.84, "inf")  # metrics.json spells ∞ "inf"
    run("d", "decoded", "inf", 16, 0.79, "inf")
    run("e", "flow", "inf", 32, 0.75, "inf")
    (tmp_path / "not_a_run").mkdir()
    rows = [r for r in summarize(str(tmp_path)).splitlines()[2:]]
    assert len(rows) == 4  # the two ε = 10 seeds pooled into one row; the caps at d = 32 and d = 16 apart
    assert "| flow | ∞ | ∞ (not private) |" in next(r for r in rows if "75.0" in r)
    for method, eps in (("flow", "inf"), ("decoded", "inf"), ("decoded", 10.0)):
        text = "\n".join(_private_only_md(dict(method=method, epsilon="inf", epsilon_target=eps)))
        assert "no differential-privacy guarantee" in text
    flow = next(r for r in rows if r.startswith("| flow | 10 |"))
    assert "| 3 | 75.0 ± 5.0 |" in flow and "| 32 |" in flow
    assert "| 50.0 ± 0.0 | 55.0 ± 0.0 | 2 × 10000 vs 10000 |" in flow  # FID over the two runs that measured it
    assert sum(r.startswith("| decoded") for r in rows) == 2


def test_summary_gives_one_shot_runs_off_their_row_a_row_of_their_own(tmp_path):
    from fastdpot.experiments.mainjob.settings import table_row

    row = table_row(10.0)["generation"]
    for name, plan in (("inf", row["sketch_plan"]), ("inf_best", "inf:32"), ("inf_best2", "inf:32")):
        (tmp_path / name).mkdir()
        m = dict(method="oneshot", epsilon_target="inf", epsilon="inf", labels_from="flow",
                 representation=dict(latent_dim=784), accuracy_cnn=0.8, label_fidelity=0.8, wall_time_s=dict(total=60.0))
        (tmp_path / name / "metrics.json").write_text(json.dumps(m))
        cfg = {f"generation.{k}": v for k, v in row.items()}
        (tmp_path / name / "config.json").write_text(json.dumps(dict(cfg, **{"generation.sketch_plan": plan})))
    rows = summarize(str(tmp_path)).splitlines()[2:]
    assert len(rows) == 2 and rows[0].startswith("| oneshot | ∞ |") and "| 1 |" in rows[0]
    assert rows[1].startswith("| oneshot (sketch_plan=inf:32) | ∞ |") and "| 2 |" in rows[1]


@needs_fmnist
def test_seeds_share_the_budget_and_a_secure_run_never_reads_another_runs_release(tmp_path):
    # two seeds of the Gaussian: the representation and BOTH seeds' releases compose to the run's ε
    cache = str(tmp_path / "cache")
    fast = dict(method="gaussian", fid_samples=0, classifiers="")  # no FID, no classifier: the releases only
    m = run_pipeline(_quick(tmp_path, flow_seeds=2, **fast), str(tmp_path / "two"), progress=False,
                     cache_dir=cache)
    assert [s["stage"] for s in m["stages"]] == ["representation", "gaussian"] and m["stages"][1]["releases"] == 2
    assert m["epsilon"] == pytest.approx(_independent_epsilon(m["stages"], m["delta"]), rel=1e-9)
    assert 7.9 < m["epsilon"] <= 8.0 * (1 + 1e-9) and len(m["seeds"]) == 2
    assert "calibrated for its share" in (tmp_path / "two" / "privacy.md").read_text()
    # a replayable run fills the shared cache; a secure run with the same seed draws its own release
    run_pipeline(_quick(tmp_path, replayable_noise=True, **fast), str(tmp_path / "rep"), progress=False,
                 cache_dir=cache)
    sec = run_pipeline(_quick(tmp_path, **fast), str(tmp_path / "sec"), progress=False, cache_dir=cache)
    assert not sec["representation"]["cached"] and sec["noise"].startswith("secret")
    assert "read from a cache" not in (tmp_path / "sec" / "privacy.md").read_text()
    again = run_pipeline(_quick(tmp_path, **fast), str(tmp_path / "sec"), progress=False, cache_dir=cache)
    assert again["representation"]["cached"]  # the same run resumed: its own release, and privacy.md says whose
    text = (tmp_path / "sec" / "privacy.md").read_text()
    assert "this run's own release" in text and again["representation"]["cache_owner"] in text
    assert json.loads((tmp_path / "sec" / "metrics.json").read_text())["epsilon"] == pytest.approx(sec["epsilon"])


def test_the_report_module_runs_as_a_script_without_a_double_import():
    """``python -m fastdpot.experiments.mainjob.report`` imports its package first: the package must not import the
    module itself (runpy's RuntimeWarning "found in sys.modules ... unpredictable behaviour")."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "fastdpot.experiments.mainjob.report",
                          "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr
