"""`--flow-seeds S` runs the generation stage S times on the same private half. The user's ε binds: each seed is
calibrated for its share, so that metrics.json and privacy.md state the ε of all of them, within the ε asked for,
recomputed here independently with dp-accounting; `--each-seed-at-epsilon` is the explicit way to compose S runs of
ε each (the total then exceeds ε, and says so).

The public stages (auto-encoder, decoding, FID and classifiers) are replaced by stand-ins so that the pipeline's own
wiring (the seed loop, the budget, the outputs) runs in seconds; the private stage is the real one.
"""
import json
import math

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import pld, rdp

import fastdpot.experiments.mainjob.evaluation as evaluation
import fastdpot.experiments.mainjob.pipeline as pl
import fastdpot.experiments.mainjob.protocols as protocols
from fastdpot.experiments.mainjob import MainJobConfig
from fastdpot.privacy import PrivacyAccountant


class _Images:
    """A stand-in image set: n blank 4 x 4 images with two classes."""

    def __init__(self, n):
        self.images, self.labels = torch.zeros(n, 1, 4, 4, dtype=torch.uint8), torch.arange(n) % 2

    def __len__(self):
        return self.images.shape[0]


def _stand_ins(monkeypatch, n_private=240, n_public=120, d=4):
    g = torch.Generator().manual_seed(0)
    codes = torch.nn.functional.normalize(torch.randn(n_private, d, generator=g), dim=1)
    public = torch.nn.functional.normalize(torch.randn(n_public, d, generator=g), dim=1)
    labels, public_labels = torch.arange(n_private) % 2, torch.arange(n_public) % 2
    rep = dict(model=None, info=dict(cached=True, train_loss=0.0, train_loss_per_epoch=[0.0]), codes=codes,
               labels=labels, public_codes=public, public_labels=public_labels, config=dict(arch="stand-in"),
               recon_mse=0.0, normalize=True, num_classes=None)
    test = type("Test", (), {"__len__": lambda self: 10, "class_names": None})()
    data = dict(public=_Images(n_public), private=_Images(n_private), test=test, dataset="stand-in")
    monkeypatch.setattr(protocols, "stage_representation", lambda cfg, data, ledger=None, **kw: rep)
    monkeypatch.setattr(pl, "_decode", lambda cfg, rep, run: (torch.zeros(run["samples"].shape[0], 1, 4, 4),
                                                             run["sample_labels"], None))
    monkeypatch.setattr(evaluation, "evaluate", lambda cfg, images, labels, data, **kw: dict(fid=1.0,
                                                                                             accuracy_mlp=0.5))
    return data


def _run(monkeypatch, tmp_path, **settings):
    data = _stand_ins(monkeypatch)
    c = MainJobConfig(quick=True).with_settings(num_particles=20, **settings)
    run = tmp_path / "run"
    m = pl.run_pipeline(c, str(run), progress=False, data=data, cache_dir=str(tmp_path / "cache"))
    return m, json.loads((run / "metrics.json").read_text()), (run / "privacy.md").read_text()


def _spent(tmp_path, m):
    """The run folder's picture of how ε was spent (issue 46: run folders held samples.png only), and its numbers:
    one stage per seed, the last the run's ε."""
    from ..test_plot import _picture_ok

    _picture_ok(str(tmp_path / "run" / "epsilon.png"))
    stages = m["epsilon_stages"]
    assert stages[-1]["epsilon"] == pytest.approx(m["epsilon_spent"], rel=1e-12)
    assert all(b["epsilon"] >= a["epsilon"] for a, b in zip(stages, stages[1:]))
    return [s["epsilon"] for s in stages], [s["stage"] for s in stages]


def _rdp_epsilon(n, b, z, steps, delta):
    """dp-accounting directly: RDP of `steps` sampled-without-replacement Gaussian releases, replace-one."""
    acc = rdp.RdpAccountant(orders=list(PrivacyAccountant().orders),
                            neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.SampledWithoutReplacementDpEvent(n, b, dpa.GaussianDpEvent(z)), steps)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("seeds", [1, 2, 3])
def test_label_private_flow_seeds_share_the_budget(monkeypatch, tmp_path, seeds):
    _, m, text = _run(monkeypatch, tmp_path, flow_seeds=seeds)
    assert m["labels"] == "private" and m["flow_seeds"] == seeds
    n, b, z, T = m["n_private"], m["batch_size"], m["noise_multiplier"], m["steps"]
    assert m["steps_taken"] == [T]
    assert m["epsilon_per_seed"] == pytest.approx(_rdp_epsilon(n, b, z, T, 1e-5), rel=1e-9)
    # every seed released T steps of the same mechanism on the same private half: S·T steps composed, within ε
    assert m["epsilon_spent"] == pytest.approx(_rdp_epsilon(n, b, z, seeds * T, 1e-5), rel=1e-9)
    assert 9.9 < m["epsilon_spent"] <= 10.0 + 1e-9
    assert m["delta"] == 1e-5 and not m["epsilon_spent_is_bound"]  # orthogonal directions: no tail
    assert len(m["seeds"]) == seeds
    values, names = _spent(tmp_path, m)  # seed i: the RDP composition of the first i seeds' steps
    for i, v in enumerate(values):
        assert v == pytest.approx(_rdp_epsilon(n, b, z, (i + 1) * T, 1e-5), rel=1e-9)
        assert names[i].startswith(f"flow, {T} steps × z = ") and (seeds == 1 or names[i].endswith(f"seed {i + 1}"))
    if seeds == 1:
        assert m["epsilon_spent"] == m["epsilon_per_seed"] and "Seeds: the ε" not in text
    else:
        assert m["epsilon_per_seed"] < m["epsilon_spent"] - 1.0
        assert "calibrated for its share" in text and f"{m['epsilon_spent']:.4f}" in text


def test_each_seed_at_epsilon_is_explicit_and_states_the_composition(monkeypatch, tmp_path):
    _, m, text = _run(monkeypatch, tmp_path, flow_seeds=2, each_seed_at_epsilon=True)
    n, b, z, T = m["n_private"], m["batch_size"], m["noise_multiplier"], m["steps"]
    assert m["epsilon_per_seed"] == pytest.approx(_rdp_epsilon(n, b, z, T, 1e-5), rel=1e-9)
    assert 9.9 < m["epsilon_per_seed"] <= 10.0 + 1e-9
    assert m["epsilon_spent"] == pytest.approx(_rdp_epsilon(n, b, z, 2 * T, 1e-5), rel=1e-9)
    assert m["epsilon_spent"] > 10.5
    assert "--each-seed-at-epsilon" in text and "more than the ε asked for" in text
    assert _spent(tmp_path, m)[0][0] == pytest.approx(m["epsilon_per_seed"], rel=1e-12)


def test_uniform_directions_charge_every_seeds_tails_within_the_budget(monkeypatch, tmp_path):
    _, m, _ = _run(monkeypatch, tmp_path, flow_seeds=2, directions="uniform")
    # each seed at (ε/2, δ/2), its flow's δ/2 = δ_acc + T·δ_tail: the two compose (RDP over 2·T steps at δ_acc, plus
    # 2·T tails; or basic composition, whichever is smaller) within (ε, δ)
    assert m["delta"] <= 1e-5 * (1 + 1e-12) and m["epsilon_spent"] <= 10.0 + 1e-9
    assert len(_spent(tmp_path, m)[0]) == 2


def test_per_class_flows_publish_a_bound_within_the_budget(monkeypatch, tmp_path):
    _, m, text = _run(monkeypatch, tmp_path, flow_seeds=2, labels="public")
    assert m["epsilon_spent"] == 10.0 and m["delta"] == 1e-5 and m["epsilon_spent_is_bound"]
    assert m["epsilon_per_seed"] == 5.0 and "basic composition" in m["epsilon_composition"]
    assert "(10.0000, 1e-05) (an upper bound)" in text
    values, names = _spent(tmp_path, m)  # the bound, seed by seed: no per-class value (it would read n_c)
    assert values == pytest.approx([5.0, 10.0]) and names == [f"per-class flows, seed {i}, ε ≤ 5 each" for i in (1, 2)]


def test_gaussian_baseline_seeds_compose_exactly_to_the_budget(monkeypatch, tmp_path):
    _, m, text = _run(monkeypatch, tmp_path, flow_seeds=3, method="gaussian")
    z = m["noise_std"] / m["sensitivity"]  # σ/Δ, Δ the moments' sensitivity

    def eps(count):  # dp-accounting's Gaussian of std z at sensitivity 1
        acc = pld.PLDAccountant(neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
                                value_discretization_interval=1e-3)
        acc.compose(dpa.GaussianDpEvent(z), count)
        return acc.get_epsilon(1e-5)

    assert eps(3) == pytest.approx(10.0, abs=0.02)  # three seeds at σ·√3: one release at the analytic σ
    assert m["epsilon_spent"] == pytest.approx(eps(3), rel=1e-9)
    assert m["epsilon_per_seed"] < 10.0 and "Seeds: the ε of everything this run releases" in text
    values, _ = _spent(tmp_path, m)  # the first i seeds: one Gaussian of noise σ/√i
    assert values == pytest.approx([eps(1), eps(2), eps(3)], rel=1e-9)


@pytest.mark.parametrize("settings", [dict(method="public", labels="public"), dict(epsilon=math.inf)])
def test_a_run_that_spends_no_epsilon_says_so_in_its_picture(monkeypatch, tmp_path, settings):
    _run(monkeypatch, tmp_path, **settings)
    from ..test_plot import _picture_ok

    _picture_ok(str(tmp_path / "run" / "epsilon.png"), min_bytes=2_000)
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["epsilon_stages"] == []


def test_privacy_md_names_the_settings_chosen_on_private_data(monkeypatch, tmp_path):
    _, _, text = _run(monkeypatch, tmp_path)
    assert "Settings chosen on private data (not covered)" in text
    for name in ('init="gaussian_scaled"', "init_scale=0.3", 'directions="orthogonal"', "k = d (+C) rule",
                 'center="none"'):
        assert name in text, name
    _, _, text = _run(monkeypatch, tmp_path / "b", init="gaussian", init_scale=1.0, num_projections=6,
                      directions="uniform", center="public")
    assert "Settings chosen on private data" not in text
    assert math.isfinite(json.loads((tmp_path / "b" / "run" / "metrics.json").read_text())["epsilon_spent"])
