"""`--flow-seeds S` releases S flows (or baseline draws) on the same private half: metrics.json and privacy.md state
the ε of all of them, composed, recomputed here independently with dp-accounting (issue 29).

The public stages (auto-encoder, decoding, FID and classifiers) are replaced by stand-ins so that the pipeline's own
wiring (the seed loop, the composition, the outputs) runs in seconds; the private stage is the real one.
"""
import json
import math

import dp_accounting as dpa
import pytest
import torch
from dp_accounting import pld, rdp

import fastdpot.experiments.pipeline as pl
from fastdpot.experiments.config import PipelineConfig
from fastdpot.privacy import PrivacyAccountant


def _stand_ins(monkeypatch, n_private=240, n_public=120, d=4):
    g = torch.Generator().manual_seed(0)
    latents = torch.nn.functional.normalize(torch.randn(n_private, d, generator=g), dim=1)
    public = torch.nn.functional.normalize(torch.randn(n_public, d, generator=g), dim=1)
    labels, public_labels = torch.arange(n_private) % 2, torch.arange(n_public) % 2
    ae = dict(model=None, info=dict(cached=True, train_loss=0.0, train_loss_per_epoch=[0.0]), latents=latents,
              labels=labels, public_latents=public, public_labels=public_labels, config=dict(arch="stand-in"),
              recon_mse=0.0)
    test = type("Test", (), {"__len__": lambda self: 10, "class_names": None})()
    data = dict(public=list(range(n_public)), private=list(range(n_private)), test=test, dataset="stand-in")
    monkeypatch.setattr(pl, "stage_autoencoder", lambda cfg, data, **kw: ae)
    monkeypatch.setattr(pl, "stage_decode", lambda model, x, **kw: torch.zeros(x.shape[0], 1, 4, 4))
    monkeypatch.setattr(pl, "stage_metrics", lambda cfg, images, labels, test, **kw: dict(fid=1.0, accuracy_mlp=0.5))
    return data


def _run(monkeypatch, tmp_path, **cfg):
    data = _stand_ins(monkeypatch)
    c = PipelineConfig(quick=True, num_particles=20, **cfg)
    run = tmp_path / "run"
    m = pl.run_pipeline(c, str(run), progress=False, data=data, cache_dir=str(tmp_path / "cache"))
    return m, json.loads((run / "metrics.json").read_text()), (run / "privacy.md").read_text()


def _rdp_epsilon(n, b, z, steps, delta):
    """dp-accounting directly: RDP of `steps` sampled-without-replacement Gaussian releases, replace-one."""
    acc = rdp.RdpAccountant(orders=list(PrivacyAccountant().orders),
                            neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.SampledWithoutReplacementDpEvent(n, b, dpa.GaussianDpEvent(z)), steps)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("seeds", [1, 2])
def test_label_private_flow_seeds_compose(monkeypatch, tmp_path, seeds):
    _, m, text = _run(monkeypatch, tmp_path, flow_seeds=seeds)
    assert m["labels"] == "private" and m["flow_seeds"] == seeds
    n, b, z, T = m["n_private"], m["batch_size"], m["noise_multiplier"], m["steps"]
    assert m["steps_taken"] == [T]
    one = _rdp_epsilon(n, b, z, T, 1e-5)
    assert m["epsilon_per_seed"] == pytest.approx(one, rel=1e-9) and one <= 10.0 + 1e-9
    # every seed released T steps of the same mechanism on the same private half: S·T steps composed
    assert m["epsilon_spent"] == pytest.approx(_rdp_epsilon(n, b, z, seeds * T, 1e-5), rel=1e-9)
    assert m["delta"] == 1e-5 and not m["epsilon_spent_is_bound"]  # orthogonal directions: no tail
    assert len(m["seeds"]) == seeds
    if seeds == 1:
        assert m["epsilon_spent"] == m["epsilon_per_seed"] and "Seeds: the ε" not in text
    else:
        assert m["epsilon_spent"] > m["epsilon_per_seed"] + 0.5
        assert f"This run released {seeds} flows" in text and f"{m['epsilon_spent']:.4f}" in text
        assert "Seeds: the ε of everything this run releases" in text and "not a release of one run" in text


def test_uniform_directions_charge_every_seeds_tails(monkeypatch, tmp_path):
    _, m, _ = _run(monkeypatch, tmp_path, flow_seeds=2, directions="uniform")
    T = m["steps"]
    # each flow: δ = δ_acc + T·δ_tail with δ_acc = δ_tail·T = δ/2; two flows: δ_acc + 2·T·δ_tail = 1.5 δ
    assert m["delta"] == pytest.approx(1.5e-5, rel=1e-12)
    z, n, b = m["noise_multiplier"], m["n_private"], m["batch_size"]
    assert m["epsilon_spent"] == pytest.approx(_rdp_epsilon(n, b, z, 2 * T, 1e-5 - T * (1e-5 / (2 * T))), rel=1e-9)


def test_per_class_flows_publish_a_bound_that_reads_no_class_size(monkeypatch, tmp_path):
    _, m, text = _run(monkeypatch, tmp_path, flow_seeds=2, labels="public")
    assert m["epsilon_spent"] == 20.0 and m["delta"] == 2e-5 and m["epsilon_spent_is_bound"]
    assert m["epsilon_per_seed"] == 10.0 and "basic composition" in m["epsilon_composition"]
    assert "(20.0000, 2e-05) (an upper bound)" in text


def test_gaussian_baseline_seeds_compose_exactly(monkeypatch, tmp_path):
    _, m, text = _run(monkeypatch, tmp_path, flow_seeds=3, method="gaussian")
    z = m["noise_std"] / m["sensitivity"]  # σ/Δ, Δ the moments' sensitivity: a Gaussian of privacy loss mean 1/(2z²)

    def eps(count):  # dp-accounting's Gaussian of std z at sensitivity 1 (its add/remove convention)
        acc = pld.PLDAccountant(neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
                                value_discretization_interval=1e-3)
        acc.compose(dpa.GaussianDpEvent(z), count)
        return acc.get_epsilon(1e-5)

    assert eps(1) == pytest.approx(10.0, abs=0.02)  # one seed: the analytic σ at (10, 1e-5)
    assert m["epsilon_spent"] == pytest.approx(eps(3), rel=1e-9)
    assert m["epsilon_per_seed"] == 10.0 < m["epsilon_spent"] < 30.0
    assert "Seeds: the ε of everything this run releases" in text


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
