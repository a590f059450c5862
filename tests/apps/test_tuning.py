"""The one tuning harness (fastdpot.experiments.mainjob.tuning) for both protocols: the stand-in splits (inside the
public part, or inside the validation split: never the private data or the test set), the one settings parser, the
skipped grid points, a tiny sweep, and a private-only point calibrated to the real run's size."""
import json
import math

import pytest
import torch

from fastdpot.experiments.data import ImageData
from fastdpot.experiments.data.datasets import load_fashion_mnist_available
from fastdpot.experiments.mainjob import MainJobConfig, parse_settings
from fastdpot.experiments.mainjob.protocols import private_split
from fastdpot.experiments.mainjob.tuning import main, run_tuning, stand_in_data, stand_in_split, tuning_split


def _public(n=90):
    return ImageData(torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 4, 4).contiguous(),
                     torch.arange(n) % 3, "toy")


def test_tuning_split_is_disjoint_seeded_and_covers_the_public_part():
    pub = _public()
    s = tuning_split(pub, seed=3)
    idx = [s["holdout_index"], s["standin_public_index"], s["standin_private_index"]]
    assert [len(i) for i in idx] == [30, 30, 30]
    assert sorted(torch.cat(idx).tolist()) == list(range(90))
    assert len(s["test"]) == 30 and len(s["public"]) == 30 and len(s["private"]) == 30
    torch.testing.assert_close(s["test"].images[:, 0, 0, 0].long(), s["holdout_index"])  # rows of P, nothing else
    assert s["dataset"] == "toy:tuning"
    assert torch.equal(tuning_split(pub, seed=3)["holdout_index"], s["holdout_index"])
    assert not torch.equal(tuning_split(pub, seed=4)["holdout_index"], s["holdout_index"])
    t = tuning_split(pub, seed=0, holdout_size=10, standin_public_size=20)
    assert (len(t["test"]), len(t["public"]), len(t["private"])) == (10, 20, 60)
    with pytest.raises(ValueError, match="stand-in"):
        tuning_split(pub, holdout_size=10, standin_public_size=79)


def test_stand_in_split_is_seeded_and_disjoint():
    a, b = stand_in_split(5000, 4000, seed=0)
    assert len(a) == 4000 and len(b) == 1000 and not set(a.tolist()) & set(b.tolist())
    assert torch.equal(a, stand_in_split(5000, 4000, seed=0)[0])
    with pytest.raises(ValueError, match="stand_in_size"):
        stand_in_split(100, 100, seed=0)


def test_one_parser_for_grids_and_fixed_settings():
    g = parse_settings(["step_size=0.1,0.3", "epsilon=inf,10", "latent_dim=none,16", "center=public", "quick=true"],
                       grid=True)
    assert g == {"generation.step_size": [0.1, 0.3], "epsilon": [math.inf, 10],
                 "representation.latent_dim": [None, 16], "generation.center": ["public"], "quick": [True]}
    # a fixed value is not split at commas; dotted names and unique leaf names both work
    assert parse_settings(["classifiers=logreg,mlp", "epsilon=inf", "generation.sketch_bins=none"]) == {
        "evaluation.classifiers": "logreg,mlp", "epsilon": math.inf, "generation.sketch_bins": None}
    for bad in (["step_size"], ["nope=1"], ["batch_size=3"], ["share=0.1", "representation.share=0.2"]):
        with pytest.raises(ValueError):
            parse_settings(bad)
    with pytest.raises(ValueError, match="ambiguous"):
        parse_settings(["epochs=1"])
    assert main(["--out", "/nonexistent/x", "--set", "classifiers=logreg,mlp", "--select", "accuracy_cnn"]) == 2


@pytest.mark.slow  # two small pipeline runs with FID (about a minute on 2 cores)
def test_tiny_sweep_writes_a_ranked_table(tmp_path):
    from fastdpot.experiments.data import load_digits

    out = tmp_path / "tune"
    rc = main(["--out", str(out), "--set", "dataset=digits", "--set", "quick=true", "--set", "fid_samples=4",
               "--set", "fid_real=4", "--set", "num_particles=40", "--set", "classifiers=logreg",
               "--grid", "step_size=0.1,1", "--select", "accuracy_logreg", "--cache-dir", str(tmp_path / "c")])
    assert rc == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["settings"]["generation.step_size"] for r in rows] == [0.1, 1]
    assert all(0 < r["epsilon_spent"] <= 10 + 1e-9 for r in rows)
    n_pub = len(load_digits("train")) // 2
    assert rows[0]["n_holdout"] == n_pub // 3  # the held-out part comes from the public half, not the test set
    table = (out / "table.md").read_text()
    assert "| rank | generation.step_size |" in table and "held-out" in table


def test_grid_combinations_that_are_not_settings_are_skipped_and_listed(tmp_path, monkeypatch):
    import fastdpot.experiments.mainjob.pipeline as pipeline
    import fastdpot.experiments.mainjob.tuning as tuning

    ran = []

    def fake_run_pipeline(cfg, run_dir, progress=False, cache_dir=None, data=None, calibration_size=None):
        g = cfg.resolved().generation  # the real pipeline would raise here on an invalid point
        ran.append((g.release, g.sketch_bins, g.step_size))
        acc = 0.5 + 0.01 * len(ran)
        return dict(epsilon_spent=10.0, n_private=len(data["private"]), n_test=len(data["test"]), fid=100.0,
                    accuracy_logreg=acc, wall_time_s={"total": 1.0},
                    seed_summary={"fid": {"mean": 100.0, "std": 0.0}, "accuracy_logreg": {"mean": acc, "std": 0.0}})

    monkeypatch.setattr(pipeline, "run_pipeline", fake_run_pipeline)
    monkeypatch.setattr(tuning, "stand_in_data", lambda base, *a: (tuning_split(_public(), 0), None))
    base = MainJobConfig().with_settings(dataset="digits", classifiers="logreg")
    grid = parse_settings(["release=points,sketch", "sketch_bins=none,5", "step_size=0.1"], grid=True)
    rows = run_tuning(base, grid, str(tmp_path / "t"), select="accuracy_logreg")
    # (points, 5) is not a setting; (sketch, None) is the sketch with its default L = 5
    assert ran == [("points", None, 0.1), ("sketch", 5, 0.1), ("sketch", 5, 0.1)]
    assert [r["settings"]["generation.release"] for r in rows] == ["sketch", "sketch", "points"]  # best first
    table = (tmp_path / "t" / "table.md").read_text()
    assert "skipped" in table and '"generation.release": "points", "generation.sketch_bins": 5' in table
    with pytest.raises(ValueError, match="no point of the grid"):
        run_tuning(base, {"generation.release": ["points"], "generation.sketch_bins": [3]}, str(tmp_path / "u"),
                   select="accuracy_logreg")
    with pytest.raises(ValueError, match="select"):
        run_tuning(base, {"generation.release": ["points"]}, str(tmp_path / "w"), select="accuracy_cnn")
    assert not (tmp_path / "w").exists()  # refused before anything ran


@pytest.mark.skipif(not load_fashion_mnist_available(), reason="needs the dataset-fashion-mnist package")
def test_a_private_only_point_runs_on_the_validation_split_only(tmp_path, monkeypatch):
    import fastdpot.experiments.mainjob.pipeline as pipeline

    seen = {}
    real = pipeline.run_pipeline

    def spy(cfg, run_dir, data=None, calibration_size=None, **kw):
        seen["data"], seen["calibration"] = data, calibration_size
        return real(cfg, run_dir, data=data, calibration_size=calibration_size, **kw)

    monkeypatch.setattr(pipeline, "run_pipeline", spy)
    base = MainJobConfig(epsilon=5.0).with_settings(
        dataset="fashion-mnist", public_size=0, method="flow", max_train=1500, validation_size=300, latent_dim=8,
        num_particles=300,
        classifiers="cnn", cnn_epochs=1, fid_samples=0, **{"generation.epochs": 0.5, "generation.batch_size": 50})
    rows = run_tuning(base, {"representation.share": [0.3]}, str(tmp_path / "t"), stand_in_size=200,
                      select="label_fidelity")
    from fastdpot.experiments.data import load_dataset

    train = load_dataset("fashion-mnist", "train", None, None, 1500)
    sens, val = private_split(1500, 300, seed=0)
    stand, held = stand_in_split(300, 200, seed=0)
    assert torch.equal(seen["data"]["private"].images, train.images[val[stand]])  # validation images only
    # the held-out part's two disjoint halves: the stand-in's validation split (selects the CNN) and its test set
    assert torch.equal(seen["data"]["validation"].images, train.images[val[held[:50]]])
    assert torch.equal(seen["data"]["test"].images, train.images[val[held[50:]]])
    assert seen["calibration"] == len(sens) == 1200
    (row,) = rows
    assert 0.0 <= row["accuracy_cnn"] <= 1.0 and 4.8 < row["epsilon_spent"] <= 5.0 * (1 + 1e-9)
    assert row["n_holdout"] == 50 and row["n_standin_private"] == 200
    with pytest.raises(ValueError, match="held-out part needs >= 4"):
        stand_in_data(base, stand_in_size=297)


def test_fold_split_scores_every_validation_image_once_and_never_the_stand_in():
    from fastdpot.experiments.mainjob.tuning import fold_split

    scored, selected = [], []
    for k in range(3):
        stand, sel, score = fold_split(300, 3, k, seed=1)
        assert stand.numel() == 200 and sel.numel() == score.numel() == 50
        assert not set(stand.tolist()) & set(sel.tolist()) | set(score.tolist()) & set(stand.tolist())
        scored += score.tolist()
        selected += sel.tolist()
    assert sorted(scored + selected) == list(range(300))  # every image held out once, half of it scored
    assert torch.equal(fold_split(300, 3, 1, seed=1)[0], fold_split(300, 3, 1, seed=1)[0])  # seeded
    with pytest.raises(ValueError, match="folds"):
        fold_split(300, 1, 0, seed=0)
    with pytest.raises(ValueError, match="fold must be"):
        fold_split(300, 2, 2, seed=0)


def test_cross_fitted_points_run_every_fold_and_seed_and_report_the_spread(tmp_path, monkeypatch):
    import fastdpot.experiments.mainjob.pipeline as pipeline

    calls = []

    def fake(cfg, run_dir, data=None, calibration_size=None, **kw):  # a point's metric = its seed + fold offset
        calls.append((cfg.seed, data["dataset"], data["private"].images.shape[0], data["test"].images.shape[0]))
        acc = 0.5 + 0.01 * cfg.seed + (0.1 if data["dataset"].endswith("fold1of2") else 0.0)
        return dict(accuracy_cnn=acc, epsilon_spent=10.0, n_private=data["private"].images.shape[0],
                    n_test=data["test"].images.shape[0], wall_time_s=dict(total=1.0))

    monkeypatch.setattr(pipeline, "run_pipeline", fake)
    base = MainJobConfig(epsilon=10.0).with_settings(dataset="fashion-mnist", public_size=0, max_train=1500,
                                                     validation_size=300, classifiers="cnn", fid_samples=0)
    rows = run_tuning(base, {"sketch_radius": [5.0, 7.0]}, str(tmp_path / "t"), folds=2, seeds=[1, 2])
    assert len(calls) == 8 and {c[0] for c in calls} == {1, 2} and {c[2] for c in calls} == {150}
    assert {c[1].rsplit(":", 1)[1] for c in calls} == {"fold0of2", "fold1of2"}
    row = rows[0]
    vals = [0.51, 0.52, 0.61, 0.62]
    assert row["seed_means"]["accuracy_cnn"] == pytest.approx(sum(vals) / 4)
    assert row["seed_stds"]["accuracy_cnn"] == pytest.approx(float(torch.tensor(vals).std()))
    assert row["n_holdout"] == 150 and len(row["runs"]) == 4  # 75 scored per fold, both folds
    assert "2-fold cross-fitting" in (tmp_path / "t" / "table.md").read_text()
