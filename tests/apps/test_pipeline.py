"""The main job end to end on small real data (a --quick run of the CLI), its stages, and the CelebA path."""
import json
import math
import struct

import pytest
import torch

from fastdpot.experiments.data import load_digits
from fastdpot.experiments.data.datasets import load_fashion_mnist, load_fashion_mnist_available
from fastdpot.experiments.mainjob import MainJobConfig, cli
from fastdpot.experiments.mainjob.codes import calibrate_spread, decode_codes, public_centers
from fastdpot.experiments.mainjob.generation import generate_flow, generate_public
from fastdpot.experiments.mainjob.protocols import load_data, stage_representation
from fastdpot.experiments.mainjob.report import samples_grid

from ._celeba import write_random_celeba


def Cfg(**kw):
    """The main job's settings from leaf names (the old flat spelling of the tests)."""
    for leaf in ("epochs", "batch_size", "clip_radius"):
        if leaf in kw:
            kw[f"generation.{leaf}"] = kw.pop(leaf)
    return MainJobConfig().with_settings(**kw)


def stage_flow(cfg, codes, labels, n, progress=False, seed=None, **kw):
    return generate_flow(cfg, codes, labels, n, cfg.seed + 1 if seed is None else seed, progress=progress, **kw)


def _write_idx(path, arr):
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 8, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(">u1").tobytes())


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
    """A small MNIST-format folder of real images of two classes (Fashion-MNIST trousers/bags, else digits 0/1)."""
    d = tmp_path_factory.mktemp("idx")
    if load_fashion_mnist_available():
        out = {}
        for split, n in (("train", 200), ("test", 40)):
            x, y = load_fashion_mnist(split)
            keep = torch.nonzero((y == 1) | (y == 8)).flatten()[:n]
            out[split] = (x[keep].numpy(), (y[keep] == 8).long().numpy())
    else:
        out = {}
        for split, n in (("train", 200), ("test", 40)):
            dd = load_digits(split)
            keep = torch.nonzero(dd.labels < 2).flatten()[:n]
            out[split] = (dd.images[keep, 0].numpy(), dd.labels[keep].numpy())
    for split, stem in (("train", "train"), ("test", "t10k")):
        _write_idx(str(d / f"{stem}-images-idx3-ubyte"), out[split][0])
        _write_idx(str(d / f"{stem}-labels-idx1-ubyte"), out[split][1])
    return str(d)


def _args(idx_dir, tmp_path, *extra):
    return ["flow", "--quick", "--dataset", "idx", "--data-dir", idx_dir, "--runs-dir", str(tmp_path / "runs"),
            "--cache-dir", str(tmp_path / "cache"), "--fid-samples", "4", "--fid-real", "4", "--num-particles", "40",
            "--no-progress", "--name", "r", *extra]


def test_quick_run_end_to_end_and_resume(idx_dir, tmp_path, capsys):
    # the per-class flows (--labels public); the default, label-private run: the next test
    assert cli.main(_args(idx_dir, tmp_path, "--labels", "public")) == 0
    run = tmp_path / "runs" / "r"
    for f in ("samples.png", "epsilon.png", "metrics.json", "privacy.md", "config.json", "private/flow_checkpoint.pt",
              "private/flows.json"):
        assert (run / f).is_file(), f
    assert not (run / "quantiles.png").exists()  # the one-shot method's picture only
    assert not (run / "flow_checkpoint.pt").exists()  # the checkpoint (a private artefact) is kept apart
    m = json.loads((run / "metrics.json").read_text())
    assert m["private"] and m["class_conditional"] and m["n_public"] + m["n_private"] == 200
    assert m["epsilon_spent"] == 10.0 and m["epsilon_spent_is_bound"] and m["delta"] == 1e-5
    assert m["steps_taken"] == [m["steps"]] * 2
    # nothing computed from the private class sizes: no per-class z, σ, q = B/n_c
    for key in ("noise_multiplier", "noise_multipliers_per_flow", "noise_std_per_flow", "sample_rates",
                "sample_rate"):
        assert key not in m, key
    assert m["noise"].startswith("secret") and "label unchanged" in m["neighbouring_relation"]
    flows = json.loads((run / "private" / "flows.json").read_text())
    assert len(flows) == 2 and all(f["noise_multiplier"] > 0 and 0 < f["epsilon"] <= 10.0 + 1e-9 for f in flows)
    assert m["num_particles"] == 40 and m["fid_generated_samples"] == 4 and m["fid_real_samples"] == 4
    assert math.isfinite(m["fid"]) and m["fid"] > 0
    assert 0 <= m["accuracy_logreg"] <= 1 and 0 <= m["accuracy_mlp"] <= 1
    # the CNN's checkpoint is chosen on public images of the public half (public-half protocol), never the test set
    assert "the public part (100 images)" in m["cnn_selection"] and m["cnn_selected_epoch"] == 1
    assert set(m["wall_time_s"]) == {"data", "representation", "generation", "decode", "metrics", "total"}
    d = Cfg().resolved().generation  # the public-half defaults, resolved
    assert m["spread"] == d.spread == "flow" and m["spread_scales"] is None
    assert m["init"] == d.init == "gaussian_scaled" and m["init_scale"] == d.init_scale == 0.3
    text = (run / "privacy.md").read_text()
    assert f"initialisation `{m['init']}`" in text and "independently of the data (no privacy cost)" in text
    assert "ε spent" in text and "public by assumption" in text and "without replacement" in text
    assert "operating system" in text and "LABEL UNCHANGED" in text and "NO privacy guarantee" not in text
    for f in flows:  # the private per-class values are not in the published page
        assert f"{f['sample_rate']:.5g}"[:6] not in text
    # default directions: orthogonal blocks, deterministic Δ = 2·sqrt(⌈k/d⌉), all of δ to the accountant
    assert "orthogonal directions" in text and "no tail is spent" in text
    from PIL import Image

    assert Image.open(run / "samples.png").size[0] > 50
    # a second call resumes from the checkpoint: the flow takes no further steps, nothing more is spent
    assert cli.main(_args(idx_dir, tmp_path, "--labels", "public")) == 0
    m2 = json.loads((run / "metrics.json").read_text())
    assert m2["resumed"] and m2["autoencoder"]["cached"] and m2["fid_real_stats_cached"]
    assert m2["steps_taken"] == m["steps_taken"] and m2["epsilon_spent"] == pytest.approx(m["epsilon_spent"])
    # another config in the same run folder is refused (the checkpoint belongs to the first one)
    assert cli.main(_args(idx_dir, tmp_path, "--labels", "public", "--epsilon", "5")) == 2
    err = capsys.readouterr().err
    assert "holds a run of other settings" in err and "epsilon (10.0 there, 5.0 now)" in err


def test_quick_run_default_is_label_private_and_resumes(idx_dir, tmp_path):
    # secure by default: one flow on [latent, c·onehot(label)], labels and class sizes protected
    assert cli.main(_args(idx_dir, tmp_path)) == 0
    run = tmp_path / "runs" / "r"
    m = json.loads((run / "metrics.json").read_text())
    assert m["labels"] == "private" and "label free to change" in m["neighbouring_relation"]
    assert 0 < m["epsilon_spent"] <= 10.0 + 1e-9 and m["delta"] == 1e-5
    assert "sample_rates" not in m and "noise_multipliers_per_flow" not in m
    text = (run / "privacy.md").read_text()
    assert "ITS LABEL FREE TO CHANGE" in text and "LABEL UNCHANGED" not in text
    from ..test_plot import _picture_ok

    _picture_ok(str(run / "epsilon.png"))  # issue 46: how the ε was spent (the flow's stage and its steps)
    assert [s["epsilon"] for s in m["epsilon_stages"]] == pytest.approx([m["epsilon_spent"]], rel=1e-12)
    assert cli.main(_args(idx_dir, tmp_path)) == 0  # resumes: nothing more is spent
    m2 = json.loads((run / "metrics.json").read_text())
    assert m2["resumed"] and m2["epsilon_spent"] == pytest.approx(m["epsilon_spent"])


def test_stages_non_private(idx_dir, tmp_path):
    cfg = Cfg(dataset="idx", data_dir=idx_dir, epsilon=math.inf, quick=True, labels="public").resolved()
    data = load_data(cfg)
    assert len(data["public"]) + len(data["private"]) == 200
    assert not set(data["public_index"].tolist()) & set(data["private_index"].tolist())
    ae = stage_representation(cfg, data, progress=False, cache_dir=str(tmp_path))
    assert ae["codes"].shape == (len(data["private"]), 16)  # default AE: convbn, d = 16
    assert ae["config"]["arch"] == "convbn"
    torch.testing.assert_close(ae["codes"].norm(dim=1), torch.ones(len(data["private"])), rtol=1e-5, atol=1e-5)
    fl = stage_flow(cfg, ae["codes"], ae["labels"], 30, progress=False)
    assert fl["epsilon"] == math.inf and not fl["privacy"]["private"]
    assert fl["samples"].shape == (30, 16) and torch.isfinite(fl["samples"]).all()
    assert sorted(fl["sample_labels"].unique().tolist()) == [0, 1]
    imgs = decode_codes(ae["model"], fl["samples"])
    assert imgs.shape == (30, 1, 28, 28) and float(imgs.min()) >= 0 and float(imgs.max()) <= 1
    # decoding on the sphere ignores the particles' norms
    torch.testing.assert_close(decode_codes(ae["model"], 3.0 * fl["samples"]), imgs, rtol=1e-5, atol=1e-5)
    s = fl["samples"]
    with torch.no_grad():  # on the sphere: the decoder sees s/|s|; off it: the raw particles
        torch.testing.assert_close(imgs, ae["model"].decode(s / s.norm(dim=1, keepdim=True)), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(decode_codes(ae["model"], 3.0 * s, on_sphere=False), ae["model"].decode(3.0 * s),
                                   rtol=1e-5, atol=1e-6)


def _sphere_rms(x):
    u = x.double() / x.double().norm(dim=1, keepdim=True)
    return float(((u - u.mean(0)) ** 2).sum(1).mean().sqrt())


def test_calibrate_spread_matches_the_reference_per_class():
    g = torch.Generator().manual_seed(0)
    d, means = 8, torch.eye(8)[:3]
    ref_y = torch.arange(3).repeat_interleave(200)
    ref = means[ref_y] + 0.1 * torch.randn(600, d, generator=g, dtype=torch.float64).float()
    ref = ref / ref.norm(dim=1, keepdim=True)
    y = torch.arange(3).repeat_interleave(50)[torch.randperm(150, generator=g)]  # interleaved classes
    x = 0.8 * means[y] + torch.randn(150, d, generator=g)                      # far too wide, like the flow's
    out, scales = calibrate_spread(x, y, ref, ref_y)
    assert out.shape == x.shape and len(scales) == 3 and all(0 < s < 1 for s in scales)
    for c in range(3):
        assert _sphere_rms(out[y == c]) == pytest.approx(_sphere_rms(ref[ref_y == c]), rel=1e-6)
        torch.testing.assert_close(out[y == c].mean(0), x[y == c].mean(0), rtol=0, atol=1e-5)  # mean kept
        dev_in, dev_out = x[y == c] - x[y == c].mean(0), out[y == c] - out[y == c].mean(0)
        torch.testing.assert_close(dev_out, scales[c] * dev_in, rtol=1e-4, atol=1e-5)  # a pure rescaling
    # one group when unlabelled; a narrower cloud is widened (s > 1)
    tight = 0.8 * means[0] + 0.01 * torch.randn(40, d, generator=g)
    out1, (s1,) = calibrate_spread(tight, None, ref[ref_y == 0], None)
    assert s1 > 1 and _sphere_rms(out1) == pytest.approx(_sphere_rms(ref[ref_y == 0]), rel=1e-6)
    with pytest.raises(ValueError, match="both"):
        calibrate_spread(x, y, ref, None)
    with pytest.raises(ValueError, match="agree in d"):
        calibrate_spread(x[:, :4], y, ref, ref_y)
    with pytest.raises(ValueError, match="reference rows"):
        calibrate_spread(x, y, ref[ref_y != 2], ref_y[ref_y != 2])


def test_celeba_folder_stages(tmp_path):
    folder = write_random_celeba(tmp_path, 8)
    cfg = Cfg(celeba_dir=folder, epsilon=10.0, batch_size=2, epochs=1.0, ae_epochs=1).resolved()
    data = load_data(cfg)
    assert data["dataset"] == "celeba" and data["public"].images.shape[1:] == (3, 64, 64)
    ae = stage_representation(cfg, data, progress=False, cache_dir="")
    assert ae["codes"].shape[1] == 48 and ae["labels"] is None  # DCGAN auto-encoder, d = 48 (Sebag et al., TMLR)
    fl = stage_flow(cfg, ae["codes"], None, 12, progress=False)
    assert not fl["privacy"]["class_conditional"] and fl["samples"].shape == (12, 48)
    assert 0 < fl["epsilon"] <= 10.0 + 1e-9 and fl["privacy"]["num_projections"] == 300
    assert decode_codes(ae["model"], fl["samples"]).shape == (12, 3, 64, 64)


def test_samples_grid_rows_are_classes():
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 2])
    imgs = (labels.float() / 10).view(-1, 1, 1, 1).expand(-1, 1, 3, 3).contiguous()
    grid = samples_grid(imgs, labels, per_class=3)
    assert grid.shape == (1, 9, 9)
    for c in range(3):
        assert torch.all(grid[0, 3 * c:3 * c + 3] == c / 10)
    g2 = samples_grid(imgs, None, per_class=3)
    assert g2.shape == (1, 9, 9)


def test_config_errors():
    for bad in [dict(epsilon=-1.0), dict(delta=1.5), dict(device="tpu"), dict(batch_size=0), dict(diffusion=-1.0),
                dict(spread="test"), dict(directions="sobol"), dict(init="uniform"), dict(init=None),
                dict(init_scale=0.0), dict(init_scale=-1.0), dict(ae_width=0), dict(ae_arch="conv", ae_width=16)]:
        with pytest.raises(ValueError):
            Cfg(**bad).resolved()
    with pytest.raises(SystemExit):
        cli.main(["flow", "--epsilon", "nan"])
    with pytest.raises(SystemExit):
        cli.main(["flow", "--init", "uniform"])


def test_uniform_directions_spend_a_tail(idx_dir, tmp_path):
    assert cli.main(_args(idx_dir, tmp_path, "--directions", "uniform", "--spread", "public")) == 0
    run = tmp_path / "runs" / "r"
    text = (run / "privacy.md").read_text()
    assert "uniform directions" in text and "δ_tail" in text and "chernoff" in text
    assert "spread on the unit sphere equals that of the PUBLIC half" in text
    m = json.loads((run / "metrics.json").read_text())
    assert m["spread"] == "public" and len(m["spread_scales"]) == 2 and all(v > 0 for v in m["spread_scales"])
    assert 0 < m["epsilon_spent"] <= 10.0 + 1e-9


@pytest.mark.parametrize("init", ["gaussian", "sphere", "gaussian_scaled"])
def test_init_option_reaches_the_flow_and_the_outputs(idx_dir, tmp_path, init):
    cfg = Cfg(dataset="idx", data_dir=idx_dir, quick=True, init=init, num_particles=30,
                         labels="public").resolved()
    data = load_data(cfg)
    ae = stage_representation(cfg, data, progress=False, cache_dir=str(tmp_path))
    fl = stage_flow(cfg, ae["codes"], ae["labels"], 30, progress=False)
    assert fl["privacy"]["init"] == init and fl["flow"].init == init
    assert fl["samples"].shape == (30, 16) and bool(torch.isfinite(fl["samples"]).all())
    assert 0 < fl["epsilon"] <= 10.0 + 1e-9  # data-independent start: the accounting does not change


def test_init_cli_records_it_and_old_run_folders_resume(idx_dir, tmp_path):
    assert cli.main(_args(idx_dir, tmp_path, "--init", "sphere", "--init-scale", "0.5")) == 0
    run = tmp_path / "runs" / "r"
    m = json.loads((run / "metrics.json").read_text())
    assert m["init"] == "sphere" and m["init_scale"] == 0.5
    assert "initialisation `sphere` (uniform on the sphere of radius 0.5)" in (run / "privacy.md").read_text()
    # a checkpoint of another init in the same folder is refused
    assert cli.main(_args(idx_dir, tmp_path, "--init", "sphere")) == 2
    # a run folder whose config.json lacks a setting (an older version's) holds a checkpoint of another config:
    # refused, nothing resumed
    assert cli.main(_args(idx_dir, tmp_path, "--name", "old", "--init", "gaussian")) == 0
    cfg_path = tmp_path / "runs" / "old" / "config.json"
    old = json.loads(cfg_path.read_text())
    del old["generation.init"]
    cfg_path.write_text(json.dumps(old))
    assert cli.main(_args(idx_dir, tmp_path, "--name", "old", "--init", "gaussian")) == 2


def test_public_centers_are_public_class_means_and_median_radius():
    g = torch.Generator().manual_seed(0)
    z = torch.nn.functional.normalize(torch.randn(300, 6, generator=g), dim=1)
    y = torch.arange(300) % 3
    c, r = public_centers(z, y)
    assert c.shape == (3, 6)
    for k in range(3):
        torch.testing.assert_close(c[k], z[y == k].mean(0), rtol=1e-5, atol=1e-6)
    dist = (z - c[y]).norm(dim=1)
    assert r == pytest.approx(float(dist.median()), rel=1e-5)
    c1, r1 = public_centers(z, None, clip_radius=0.25)
    torch.testing.assert_close(c1, z.mean(0, keepdim=True), rtol=1e-5, atol=1e-6)
    assert r1 == 0.25
    with pytest.raises(ValueError, match="no public rows"):
        public_centers(z, y, num_classes=4)
    for bad in (dict(clip_radius=0.0), dict(clip_radius=-1.0)):
        with pytest.raises(ValueError):
            public_centers(z, y, **bad)
    with pytest.raises(ValueError):
        public_centers(z[:0], None)
    with pytest.raises(ValueError):
        public_centers(torch.full((4, 6), float("nan")), None)


def test_centered_flow_clips_to_r_and_adds_the_centres_back(idx_dir, tmp_path):
    cfg = Cfg(dataset="idx", data_dir=idx_dir, quick=True, num_particles=30, center="public",
                         labels="public", replayable_noise=True).resolved()  # the translation check replays the noise
    data = load_data(cfg)
    ae = stage_representation(cfg, data, progress=False, cache_dir=str(tmp_path))
    assert ae["public_codes"] is not None  # center="public" needs them
    c, r = public_centers(ae["public_codes"], ae["public_labels"])
    assert 0 < r < 2
    fl = stage_flow(cfg, ae["codes"], ae["labels"], 30, progress=False, centers=c, clip_radius=r)
    for f in fl["flow"].flows:
        assert f.config.clip_radius == r and not f.config.normalize
        assert f.sensitivity == pytest.approx(2 * r)  # one orthogonal block of k = d directions
    assert fl["privacy"]["center"] == "public" and fl["privacy"]["clip_radius"] == r
    assert 0 < fl["epsilon"] <= 10.0 + 1e-9
    # translating latents and centres together moves the samples by exactly that: the flow runs on y − c
    v = torch.linspace(-1, 1, c.shape[1])
    fl2 = stage_flow(cfg, ae["codes"] + v, ae["labels"], 30, progress=False, centers=c + v, clip_radius=r)
    torch.testing.assert_close(fl2["samples"], fl["samples"] + v, rtol=1e-5, atol=1e-5)
    assert torch.equal(fl2["sample_labels"], fl["sample_labels"])
    # without centres: the authors' unit sphere (Δ = 2)
    fl0 = stage_flow(cfg, ae["codes"], ae["labels"], 30, progress=False)
    assert all(f.config.normalize and f.sensitivity == pytest.approx(2.0) for f in fl0["flow"].flows)
    assert fl0["privacy"]["center"] == "none"
    with pytest.raises(ValueError, match="clip_radius"):
        stage_flow(cfg, ae["codes"], ae["labels"], 30, progress=False, centers=c)
    with pytest.raises(ValueError, match="centers must be"):
        stage_flow(cfg, ae["codes"], ae["labels"], 30, progress=False, centers=c[:, :3], clip_radius=r)
    with pytest.raises(ValueError, match="has no centre"):
        stage_flow(cfg, ae["codes"], ae["labels"], 30, progress=False, centers=c[:1], clip_radius=r)


def test_center_cli_and_privacy_md(idx_dir, tmp_path):
    assert cli.main(_args(idx_dir, tmp_path, "--center", "public", "--clip-radius", "0.3", "--labels", "public")) == 0
    run = tmp_path / "runs" / "r"
    m = json.loads((run / "metrics.json").read_text())
    assert m["center"] == "public" and m["clip_radius"] == 0.3
    assert m["sensitivity"] == pytest.approx(0.6)
    text = (run / "privacy.md").read_text()
    assert "shifted by the PUBLIC half's mean latent of its class" in text and "r = 0.3" in text
    assert "Δ = 2r (r = 0.3)·sqrt(⌈k/d⌉) = 0.6" in text
    assert cli.main(_args(idx_dir, tmp_path, "--name", "none", "--labels", "public")) == 0  # the papers' unit sphere
    m0 = json.loads((tmp_path / "runs" / "none" / "metrics.json").read_text())
    assert m0["center"] == Cfg().generation.center == "none" and m0["clip_radius"] is None and m0["sensitivity"] == pytest.approx(2.0)
    assert "scaled onto the unit sphere inside the flow step" in (tmp_path / "runs" / "none" / "privacy.md").read_text()
    # a run folder whose config.json lacks `center` (an older version's) is refused, not resumed
    cfg_path = tmp_path / "runs" / "none" / "config.json"
    old = json.loads(cfg_path.read_text())
    del old["generation.center"], old["generation.clip_radius"]
    cfg_path.write_text(json.dumps(old))
    assert cli.main(_args(idx_dir, tmp_path, "--name", "none", "--center", "none", "--labels", "public")) == 2
    with pytest.raises(SystemExit):
        cli.main(["flow", "--center", "private"])
    for bad in (dict(center="x"), dict(center="public", clip_radius=0.0), dict(center="public", clip_radius=-0.5),
                dict(clip_radius=0.5)):  # a radius without center="public" would be silently ignored
        with pytest.raises(ValueError):
            Cfg(**bad).resolved()


def test_sketch_release_reaches_the_flows_and_privacy_md(monkeypatch):
    # fast: the CLI's options reach PipelineConfig; stage_flow on small synthetic latents builds sketch flows
    # whose privacy record and privacy.md text name the release
    import fastdpot.experiments.mainjob.pipeline as pl
    from fastdpot.experiments.mainjob.privacy_report import _flow_md

    def _privacy_md(cfg, result):
        return "\n".join(x for x in _flow_md(cfg, result) if x is not None)

    seen = {}
    monkeypatch.setattr(pl, "run_pipeline", lambda cfg, *a, **kw: seen.setdefault("cfg", cfg) and {})
    assert cli.main(["flow", "--release", "sketch", "--sketch-bins", "4", "--no-progress"]) == 0
    assert seen["cfg"].generation.release == "sketch" and seen["cfg"].generation.sketch_bins == 4
    g = torch.Generator().manual_seed(0)
    lat = torch.nn.functional.normalize(torch.randn(120, 4, generator=g), dim=1)
    cfg = Cfg(release="sketch", sketch_bins=4, epochs=1.0, batch_size=20, latent_dim=4).resolved()
    fl = stage_flow(cfg, lat, None, 20, progress=False)  # one flow (no labels): one noise calibration
    assert fl["flow"].config.release == "sketch" and fl["flow"].config.sketch_bins == 4
    assert fl["privacy"]["release"] == "sketch" and fl["privacy"]["sketch_bins"] == 4
    text = _privacy_md(cfg, dict(privacy=fl["privacy"], dataset="synthetic", n_public=0, n_private=120,
                                 latent_dim=4, epsilon=fl["epsilon"]))
    assert "sliced quantile sketch" in text and "L = 4 rank bins" in text and "Y Θᵀ + V" not in text
    cfg0 = Cfg(release="points", epochs=1.0, batch_size=20, latent_dim=4).resolved()
    fl0 = stage_flow(cfg0, lat, None, 20, progress=False)
    assert fl0["flow"].config.release == "points" and fl0["privacy"]["release"] == "points"
    assert "Y Θᵀ + V" in _privacy_md(cfg0, dict(privacy=fl0["privacy"], dataset="synthetic", n_public=0,
                                                n_private=120, latent_dim=4, epsilon=fl0["epsilon"]))
    assert fl["epsilon"] == fl0["epsilon"]  # the same z, Δ and sampler: the same ε
    with pytest.raises(SystemExit):
        cli.main(["flow", "--release", "bins"])
    # the default, chosen by the public-only sweep (docs/mainjob/tuning.md): the sketch with L = min(5, B)
    d = Cfg().resolved().generation
    assert (d.release, d.sketch_bins, Cfg(batch_size=3).resolved().generation.sketch_bins) == ("sketch", 5, 3)
    assert Cfg(release="points").resolved().generation.sketch_bins is None
    for bad in (dict(release="sketch", sketch_bins=0), dict(release="sketch", sketch_bins=101),
                dict(release="points", sketch_bins=5), dict(release="x")):
        with pytest.raises(ValueError, match="sketch_bins|release"):
            Cfg(**bad).resolved()


@pytest.mark.slow
def test_sketch_release_cli_records_it(idx_dir, tmp_path):
    assert cli.main(_args(idx_dir, tmp_path, "--release", "sketch", "--sketch-bins", "4")) == 0
    run = tmp_path / "runs" / "r"
    m = json.loads((run / "metrics.json").read_text())
    assert m["release"] == "sketch" and m["sketch_bins"] == 4
    assert json.loads((run / "config.json").read_text())["generation.release"] == "sketch"
    assert 0 < m["epsilon_spent"] <= 10.0 + 1e-9
    text = (run / "privacy.md").read_text()
    assert "sliced quantile sketch" in text and "L = 4 rank bins" in text and "Y Θᵀ + V" not in text


@pytest.mark.slow  # ~100 s on a loaded 2-core machine (auto-encoder, two FID passes, CNN)
def test_gaussian_baseline_flow_seeds_and_public_size_cli(idx_dir, tmp_path):
    args = _args(idx_dir, tmp_path, "--method", "gaussian", "--flow-seeds", "2", "--public-size", "120",
                 "--classifiers", "logreg,cnn")
    assert cli.main(args) == 0
    run = tmp_path / "runs" / "r"
    m = json.loads((run / "metrics.json").read_text())
    assert m["method"] == "gaussian" and m["n_public"] == 120 and m["n_private"] == 80
    assert m["sensitivity"] == pytest.approx(math.sqrt(4.5)) and m["noise_std"] > 0
    # two seeds' Gaussian releases on the same private half, each at σ·√2: together exactly the run's ε
    assert m["epsilon_spent"] == pytest.approx(10.0, rel=1e-3) and m["epsilon_per_seed"] < 10.0
    assert [s["flow_seed"] for s in m["seeds"]] == [1, 2]
    assert set(m["seed_summary"]) == {"fid", "accuracy_logreg", "accuracy_cnn"}
    vals = [s["accuracy_cnn"] for s in m["seeds"]]
    assert m["seed_summary"]["accuracy_cnn"]["mean"] == pytest.approx(sum(vals) / 2)
    assert m["accuracy_cnn"] == vals[0] and "accuracy_mlp" not in m
    text = (run / "privacy.md").read_text()
    assert "DP Gaussian baseline" in text and "parallel composition" in text
    assert not (run / "flow_checkpoint.pt").exists()


def test_public_only_and_seeded_flow_stages(idx_dir, tmp_path):
    cfg = Cfg(dataset="idx", data_dir=idx_dir, quick=True, method="public").resolved()
    data = load_data(cfg)
    ae = stage_representation(cfg, data, progress=False, cache_dir=str(tmp_path))
    out = generate_public(cfg, ae["codes"], ae["labels"], 30, 1, public_codes=ae["public_codes"],
                          public_labels=ae["public_labels"])
    assert out["epsilon"] == 0.0 and out["samples"].shape == (30, 16)
    pub = ae["public_codes"]
    assert all(bool((pub == r).all(1).any()) for r in out["samples"])  # rows of the public half, nothing else
    # the flow's generator seed is an argument: with replayable noise the same seed replays, another seed differs
    cfg = Cfg(dataset="idx", data_dir=idx_dir, quick=True, replayable_noise=True, labels="public").resolved()
    a = stage_flow(cfg, ae["codes"], ae["labels"], 30, progress=False, seed=5)["samples"]
    b = stage_flow(cfg, ae["codes"], ae["labels"], 30, progress=False, seed=5)["samples"]
    c = stage_flow(cfg, ae["codes"], ae["labels"], 30, progress=False, seed=6)["samples"]
    assert torch.equal(a, b) and not torch.equal(a, c)
    for bad in (dict(method="diffusion"), dict(flow_seeds=0), dict(classifiers="logreg,svm"), dict(public_size=-1),
                dict(public_size=0, labels="public"), dict(public_size=0, method="public"), dict(method="decoded"),
                dict(public_size=0, share=1.0)):
        with pytest.raises(ValueError):
            Cfg(**bad).resolved()
    po = Cfg(public_size=0).resolved()  # the private-only protocol: labels private, δ from N at run time
    assert po.generation.labels == "private" and po.delta is None
