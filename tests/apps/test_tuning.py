"""The public-only tuning protocol: the three-way split of the public part, the grid parser, and a tiny sweep."""
import json
import math

import pytest
import torch

from fastdpot.experiments.data import ImageData
from fastdpot.experiments.pipeline import PipelineConfig
from fastdpot.experiments.tuning import main, parse_grid, parse_settings, run_tuning, tuning_split


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


def test_parse_grid():
    g = parse_grid(["step_size=0.1,0.3", "epsilon=inf,10", "latent_dim=none,16", "center=public", "quick=true"])
    assert g == {"step_size": [0.1, 0.3], "epsilon": [math.inf, 10], "latent_dim": [None, 16],
                 "center": ["public"], "quick": [True]}
    for bad in (["step_size"], ["nope=1"], ["epochs="], ["epochs=1", "epochs=2"]):
        with pytest.raises(ValueError):
            parse_grid(bad)
    with pytest.raises(ValueError, match="select"):
        run_tuning(PipelineConfig(classifiers="logreg"), {"epochs": [1]}, "/nonexistent", select="accuracy_cnn")


@pytest.mark.slow  # two small pipeline runs with FID (about a minute on 2 cores)
def test_tiny_sweep_writes_a_ranked_table(tmp_path):
    from fastdpot.experiments.data import load_digits

    out = tmp_path / "tune"
    rc = main(["--out", str(out), "--set", "dataset=digits", "--set", "quick=true", "--set", "fid_samples=4",
               "--set", "fid_real=4", "--set", "num_particles=40", "--set", "classifiers=logreg",
               "--grid", "step_size=0.1,1", "--select", "accuracy_logreg", "--cache-dir", str(tmp_path / "c")])
    assert rc == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["settings"]["step_size"] for r in rows] == [0.1, 1]
    assert all(0 < r["epsilon_spent"] <= 10 + 1e-9 for r in rows)
    n_pub = len(load_digits("train")) // 2
    assert rows[0]["n_holdout"] == n_pub // 3  # the held-out part comes from the public half, not the test set
    table = (out / "table.md").read_text()
    assert "| rank | step_size |" in table and "held-out" in table


def test_grid_combinations_that_are_not_settings_are_skipped_and_listed(tmp_path, monkeypatch):
    import fastdpot.experiments.tuning as tuning

    ran = []

    def fake_run_pipeline(cfg, run_dir, progress=False, cache_dir=None, data=None):
        cfg.resolved()  # the real pipeline would raise here on an invalid point
        ran.append((cfg.release, cfg.sketch_bins, cfg.step_size))
        acc = 0.5 + 0.01 * len(ran)
        return dict(epsilon_spent=10.0, n_public=len(data["public"]), n_private=len(data["private"]),
                    n_test=len(data["test"]), fid=100.0, accuracy_logreg=acc,
                    seed_summary={"fid": {"mean": 100.0, "std": 0.0}, "accuracy_logreg": {"mean": acc, "std": 0.0}},
                    wall_time_s={"total": 1.0})

    monkeypatch.setattr(tuning, "run_pipeline", fake_run_pipeline)
    base = PipelineConfig(dataset="digits", classifiers="logreg")
    grid = {"release": ["points", "sketch"], "sketch_bins": [None, 5], "step_size": [0.1]}
    rows = run_tuning(base, grid, str(tmp_path / "t"), select="accuracy_logreg")
    # (points, 5) is not a setting; (sketch, None) is the sketch with its default L = 5
    assert ran == [("points", None, 0.1), ("sketch", 5, 0.1), ("sketch", 5, 0.1)]
    assert [r["settings"]["release"] for r in rows] == ["sketch", "sketch", "points"]  # ranked, best first
    table = (tmp_path / "t" / "table.md").read_text()
    assert "skipped" in table and '"release": "points", "sketch_bins": 5' in table
    assert '"release": "sketch", "sketch_bins": null' not in table
    with pytest.raises(ValueError, match="no point of the grid"):
        run_tuning(base, {"release": ["points"], "sketch_bins": [3]}, str(tmp_path / "u"), select="accuracy_logreg")
    assert len(ran) == 3
    # a grid over the release alone keeps the points release (the default L is not carried over to it)
    run_tuning(base, {"release": ["points", "sketch"]}, str(tmp_path / "v"), select="accuracy_logreg")
    assert ran[3:] == [("points", None, None), ("sketch", 5, None)]


def test_set_values_are_not_split_at_commas():
    # `--set classifiers=logreg,mlp` fixed classifiers="logreg" (the first grid value) before
    assert parse_settings(["classifiers=logreg,mlp", "epsilon=inf", "sketch_bins=none", "release=sketch"]) == {
        "classifiers": "logreg,mlp", "epsilon": math.inf, "sketch_bins": None, "release": "sketch"}
    for bad in (["epsilon"], ["nope=1"], ["epochs=1", "epochs=2"]):
        with pytest.raises(ValueError):
            parse_settings(bad)
    assert main(["--out", "/nonexistent/x", "--set", "classifiers=logreg,mlp", "--select", "accuracy_cnn"]) == 2
