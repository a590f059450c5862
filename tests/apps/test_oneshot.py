"""The private-only protocol's one-shot method (fastdpot flow --public-size 0, the default): the sensitive rows reach
only the two accounted mechanisms (a guarded tensor raises on any other read, flow steps included), the composed ε
is recomputed with dp-accounting, the ε table chooses the settings from the run's ε, and what the method ignores is
refused."""
import math

import dp_accounting
import pytest
import torch

import fastdpot.experiments.mainjob.oneshot as oneshot_mod
import fastdpot.privacy.class_sketch as class_sketch
import fastdpot.privacy.moments as moments
from fastdpot.experiments.data.datasets import load_fashion_mnist_available
from fastdpot.experiments.mainjob import MainJobConfig, run_pipeline
from fastdpot.experiments.mainjob.config import PRIVATE_ONLY_TABLE
from fastdpot.privacy.composition import ComposedLedger

from ._celeba import write_random_celeba

_OPEN = {"on": False}


class Guarded(torch.Tensor):
    """Sensitive rows: any torch operation on them outside an accounted mechanism raises."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if not _OPEN["on"] and func not in (torch.Tensor.shape.__get__, torch.Tensor.dim, torch.Tensor.size):
            raise AssertionError(f"sensitive rows read outside a mechanism: {getattr(func, '__name__', func)}")
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def _inside(fn):
    def wrapped(*a, **kw):
        _OPEN["on"] = True
        try:
            return fn(*a, **kw)
        finally:
            _OPEN["on"] = False
    return wrapped


def _pld(stages, delta):
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
    for s in stages:
        acc.compose(dp_accounting.GaussianDpEvent(s["noise_multiplier"]), s["releases"])
    return acc.get_epsilon(delta)


def test_the_sensitive_rows_reach_only_the_accounted_mechanisms(monkeypatch):
    monkeypatch.setattr(moments, "release_class_means", _inside(moments.release_class_means))
    monkeypatch.setattr(class_sketch, "class_quantile_sketch", _inside(class_sketch.class_quantile_sketch))
    g = torch.Generator().manual_seed(0)
    images = (torch.rand(600, 784, generator=g) ** 2).as_subclass(Guarded)
    labels = (torch.arange(600) % 10).as_subclass(Guarded)
    cfg = MainJobConfig(epsilon=4.0, replayable_noise=True).with_settings(
        public_size=0, sketch_blocks="28/0/0,7/0/0", sketch_rounds=2).resolved()
    led = ComposedLedger(4.0, 1e-5)
    out = oneshot_mod.generate_oneshot(cfg, images, labels, 200, 1, ledger=led, num_classes=10,
                                       image_shape=(1, 28, 28), calibration_size=55_000)
    assert out["samples"].shape == (200, 784) and float(out["samples"].min()) >= 0 and float(out["samples"].max()) <= 1
    assert [s["stage"] for s in led.stages] == ["means", "sketch"] and led.accountant_used == "pld"
    assert all(s["event"]["dataset_size"] == 55_000 and s["releases"] == 1 for s in led.stages)
    assert led.epsilon() == pytest.approx(_pld(led.stages, 1e-5), rel=1e-6) and 3.9 < led.epsilon() <= 4.0 + 1e-9
    z_m, z_s = (s["noise_multiplier"] for s in led.stages)
    share = cfg.generation.sketch_mean_share
    assert z_m ** -2 / (z_m ** -2 + z_s ** -2) == pytest.approx(share)  # the means' share of one Gaussian
    with pytest.raises(AssertionError, match="outside a mechanism"):
        images.sum()


def test_the_epsilon_table_chooses_the_settings_and_explicit_ones_win():
    r10 = MainJobConfig(epsilon=10.0).with_settings(public_size=0).resolved()
    r1 = MainJobConfig(epsilon=1.0).with_settings(public_size=0).resolved()
    r2 = MainJobConfig(epsilon=2.0).with_settings(public_size=0).resolved()  # nearer 1 than 10 in log ε
    for cfg, eps in ((r10, 10.0), (r1, 1.0), (r2, 1.0)):
        for k, v in PRIVATE_ONLY_TABLE[eps]["generation"].items():
            assert getattr(cfg.generation, k) == v, (eps, k)
        assert cfg.generation.method == "oneshot" and cfg.representation.kind == "pixels"
    assert MainJobConfig(epsilon=1.0).with_settings(public_size=0, sketch_radius=5.0).resolved() \
        .generation.sketch_radius == 5.0
    pca = MainJobConfig(epsilon=1.0).with_settings(public_size=0, method="gaussian").resolved().representation
    assert (pca.kind, pca.latent_dim, pca.share) == ("pca", 16, 0.6)  # `--epsilon 1` alone: the tuned ε = 1 DP-PCA
    assert math.isinf(MainJobConfig(epsilon=math.inf).with_settings(public_size=0).resolved().epsilon)
    for bad, match in ((dict(sketch_radius=3.0, method="flow"), "apply to method='oneshot'"),
                       (dict(latent_dim=8), "kind 'pixels'"), (dict(init_scale=1.0), "per-step flow"),
                       (dict(sketch_center="median"), "sketch_center"), (dict(sketch_plan="3-16"), "sketch_plan"),
                       (dict(kind="pca"), "pixel space")):
        with pytest.raises(ValueError, match=match):
            MainJobConfig().with_settings(public_size=0, **bad).resolved()
    with pytest.raises(ValueError, match="private-only protocol"):
        MainJobConfig().with_settings(method="oneshot").resolved()


def test_every_setting_of_the_epsilon_table_states_its_origin():
    """Each row's ``origins`` names where each of its settings came from, section by section, no more and no fewer
    (a re-tuned row must restate them); privacy.md writes them. The means' share, the passes and the step size were
    never swept (no sweep is recorded): the row and privacy.md say they were set by hand, not chosen on the
    validation split; the swept ones (blocks, bins, r, centre) name the validation split's sweep."""
    from fastdpot.experiments.mainjob.privacy_report import _settings_md
    from fastdpot.experiments.mainjob.settings import ONESHOT_SETTINGS

    for eps, row in PRIVATE_ONLY_TABLE.items():
        assert set(row["origins"]) == {"representation", "flow", "generation"}, eps
        for section in ("representation", "flow", "generation"):
            assert set(row["origins"][section]) == set(row[section]), (eps, section)
            assert all(isinstance(o, str) and o for o in row["origins"][section].values()), (eps, section)
        cfg = MainJobConfig(epsilon=eps).with_settings(public_size=0).resolved()
        lines = {ln.split("|")[1].strip(" `"): ln.split("|")[3] for ln in _settings_md(cfg, {}).splitlines()
                 if ln.startswith("| `")}
        for name in ("sketch_mean_share", "sketch_rounds", "step_size"):
            assert "set by hand" in lines[f"generation.{name}"] and "validation split" not in \
                lines[f"generation.{name}"], (eps, name)
        for name in ("sketch_blocks", "sketch_plan", "sketch_radius", "sketch_center"):
            assert "validation split" in lines[f"generation.{name}"], (eps, name)
        # every one-shot setting has its line (a new setting of the method joins privacy.md with it)
        assert {f"generation.{n}" for n in ONESHOT_SETTINGS} <= set(lines), eps
        assert "night round" in lines["generation.sketch_floor"] and "pooled" not in lines["generation.sketch_floor"]
        given = _settings_md(cfg, {"user_settings": {"generation.sketch_rounds": 2}})
        assert "| `generation.sketch_rounds` | 4 | given by the user for this run |" in given  # the user's choice wins


@pytest.mark.skipif(not load_fashion_mnist_available(), reason="needs the dataset-fashion-mnist package")
def test_quick_oneshot_run_on_fashion_mnist(tmp_path):
    cfg = MainJobConfig(epsilon=8.0).with_settings(
        dataset="fashion-mnist", public_size=0, max_train=1500, max_test=300, validation_size=200,
        num_particles=300, classifiers="cnn", cnn_epochs=1, fid_samples=0, sketch_blocks="28/0/0,7/0/0",
        sketch_rounds=2)
    m = run_pipeline(cfg, str(tmp_path / "run"), progress=False, cache_dir=str(tmp_path / "cache"))
    n = m["n_sensitive"]
    assert m["method"] == "oneshot" and n == 1300 and m["delta"] == pytest.approx(1 / (n * math.log(n)))
    assert [s["stage"] for s in m["stages"]] == ["means", "sketch"]
    assert m["epsilon"] == pytest.approx(_pld(m["stages"], m["delta"]), rel=1e-6) and m["epsilon"] <= 8.0 + 1e-9
    assert 0.0 <= m["accuracy_cnn"] <= 1.0 and 0.0 <= m["label_fidelity"] <= 1.0 and "fid" not in m
    text = (tmp_path / "run" / "privacy.md").read_text()
    assert "one-shot per-class sliced quantile sketches" in text and "`generation.sketch_plan`" in text
    assert "validation split: the ε table" in text and f"({m['epsilon']:.4g}," in text
    assert "privacy-loss-distribution accountant" in text and "Rényi" not in text  # the accountant the ledger used
    # issue 46: the run folder shows how ε was spent and the release against the generated images
    from ..test_plot import _picture_ok

    for picture in ("samples.png", "epsilon.png", "quantiles.png"):
        _picture_ok(str(tmp_path / "run" / picture))
    spent = m["epsilon_stages"]
    assert [s["stage"].split(",")[0] for s in spent] == ["means", "sketch"]
    assert spent[0]["epsilon"] == pytest.approx(_pld(m["stages"][:1], m["delta"]), rel=1e-6)  # the means alone
    assert spent[1]["epsilon"] == pytest.approx(m["epsilon"], rel=1e-12)


def test_the_same_code_runs_on_a_celeba_folder(tmp_path):
    # 64 x 64 x 3 unlabelled images (a CelebA folder the test writes): one class, blocks of the lowest frequencies
    from PIL import Image

    folder = write_random_celeba(tmp_path, 24)
    cfg = MainJobConfig(epsilon=5.0, replayable_noise=True).with_settings(
        celeba_dir=folder, public_size=0, validation_size=4, num_particles=12, fid_samples=0, classifiers="",
        sketch_blocks="64/0/0,16/8/8", sketch_block_directions=128, sketch_rounds=1, sketch_plan="inf:2")
    m = run_pipeline(cfg, str(tmp_path / "run"), progress=False, cache_dir=str(tmp_path / "cache"))
    assert m["method"] == "oneshot" and m["num_particles"] == 12 and m["generation"]["block_directions"] == 128
    assert [s["stage"] for s in m["stages"]] == ["means", "sketch"] and m["epsilon"] <= 5.0 + 1e-9
    assert "accuracy_cnn" not in m and "label_fidelity" not in m
    assert Image.open(tmp_path / "run" / "samples.png").size[0] > 64
    from ..test_plot import _picture_ok

    for picture in ("epsilon.png", "quantiles.png"):  # one class, colour images: the same pictures
        _picture_ok(str(tmp_path / "run" / picture))


def test_random_rotation_blocks_join_the_release_after_the_patch_blocks(tmp_path):
    from fastdpot.experiments.mainjob.oneshot import ROTATION_SEED, generate_oneshot
    from fastdpot.flows.directions import RandomHadamardBlock
    from fastdpot.privacy.composition import ComposedLedger

    cfg = MainJobConfig(epsilon=10.0, replayable_noise=True).with_settings(
        public_size=0, sketch_blocks="8/0/0", sketch_rotations=2, sketch_rotation_bins=3, sketch_plan="inf:2",
        sketch_rounds=1).resolved()
    g = torch.Generator().manual_seed(0)
    codes = torch.rand(200, 64, generator=g, dtype=torch.float64)
    labels = torch.arange(200) % 2
    out = generate_oneshot(cfg, codes, labels, 40, seed=1, ledger=ComposedLedger(10.0, 1e-5),
                           num_classes=2, image_shape=(1, 8, 8))
    rel = out["release"]
    assert rel.num_blocks == 3 and isinstance(rel.blocks[1], RandomHadamardBlock)
    assert [b.seed for b in rel.blocks[1:]] == [ROTATION_SEED, ROTATION_SEED + 1]
    assert rel.bins[:64].tolist() == [2] * 64 and rel.bins[64:].tolist() == [3] * 128
    assert out["privacy"]["rotations"] == 2 and out["samples"].shape == (40, 64)
    # one pass over the 3 blocks, then one more over the patch block: the flows end on it
    assert out["privacy"]["flow_steps"] == oneshot_mod.flow_steps(1, 2, 1) == 4
    assert oneshot_mod.flow_steps(4, 0, 4) == 16 and oneshot_mod.flow_steps(8, 8, 4) == 72
    with pytest.raises(ValueError, match="sketch_rotations"):
        MainJobConfig().with_settings(public_size=0, sketch_rotations=-1).resolved()


@pytest.mark.parametrize("shrink", ["pooled", "stein"])
def test_the_tables_shrinkage_is_a_setting_the_flows_take(shrink, monkeypatch):
    from fastdpot.experiments.mainjob.oneshot import generate_oneshot

    seen = []
    original = class_sketch.ClassSketchRelease.quantile_tables

    def spy(self, shrink=True, degree=3):
        seen.append(shrink)
        return original(self, shrink=shrink, degree=degree)

    monkeypatch.setattr(class_sketch.ClassSketchRelease, "quantile_tables", spy)
    cfg = MainJobConfig(epsilon=10.0, replayable_noise=True).with_settings(
        public_size=0, sketch_blocks="8/0/0", sketch_rotations=0, sketch_plan="inf:4", sketch_rounds=1,
        sketch_shrink=shrink).resolved()
    g = torch.Generator().manual_seed(0)
    out = generate_oneshot(cfg, torch.rand(200, 64, generator=g, dtype=torch.float64), torch.arange(200) % 2, 40,
                           seed=1, ledger=ComposedLedger(10.0, 1e-5), num_classes=2, image_shape=(1, 8, 8))
    assert seen == [shrink] and out["privacy"]["shrinkage"] == shrink
    with pytest.raises(ValueError, match="sketch_shrink"):
        MainJobConfig().with_settings(public_size=0, sketch_shrink="james-stein").resolved()
    # the setting's choices (settings.py reads no torch) are the library's names
    from fastdpot.experiments.mainjob.settings import SKETCH_SHRINKS
    assert SKETCH_SHRINKS == class_sketch.SHRINKAGES


def test_the_pixel_floor_thresholds_the_final_images_only():
    """sketch_floor t: the images' pixels below t become 0 and the rest are kept (post-processing of the flows'
    output: the same release, the same particles above t); bad values are refused."""
    from fastdpot.experiments.mainjob.oneshot import generate_oneshot

    x = torch.rand(200, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    outs = {}
    for floor in (0.0, 0.3):
        cfg = MainJobConfig(epsilon=10.0, replayable_noise=True).with_settings(
            public_size=0, sketch_blocks="8/0/0", sketch_rotations=0, sketch_plan="inf:4", sketch_rounds=1,
            sketch_floor=floor).resolved()
        outs[floor] = generate_oneshot(cfg, x, torch.arange(200) % 2, 40, seed=1, ledger=ComposedLedger(10.0, 1e-5),
                                       num_classes=2, image_shape=(1, 8, 8))
    raw, floored = outs[0.0]["samples"], outs[0.3]["samples"]
    assert outs[0.3]["privacy"]["floor"] == 0.3 and outs[0.0]["privacy"]["floor"] == 0.0
    assert bool(((raw > 0) & (raw < 0.3)).any())  # the case is not vacuous: some pixels lie below the floor
    torch.testing.assert_close(floored, torch.where(raw < 0.3, torch.zeros_like(raw), raw), rtol=0, atol=0)
    for bad in (-0.1, 1.0, True, "0.2"):
        with pytest.raises(ValueError, match="sketch_floor"):
            MainJobConfig().with_settings(public_size=0, sketch_floor=bad).resolved()
    # every row of the ε table sets it (its origin is checked with the others)
    from fastdpot.experiments.mainjob.settings import PRIVATE_ONLY_TABLE

    assert all(0 <= row["generation"]["sketch_floor"] < 1 for row in PRIVATE_ONLY_TABLE.values())


def test_photographs_do_not_inherit_the_tables_pixel_floor():
    """The ε table's floor is Fashion-MNIST's dark-background prior: a CelebA or LFW run has no floor unless it gives
    one, and privacy.md says why; a floor given explicitly is kept."""
    from fastdpot.experiments.mainjob.privacy_report import _settings_md
    from fastdpot.experiments.mainjob.settings import PHOTO_DATASETS

    for dataset in PHOTO_DATASETS:
        cfg = MainJobConfig(epsilon=10.0).with_settings(public_size=0, dataset=dataset).resolved()
        assert cfg.generation.sketch_floor == 0.0, dataset
        md = _settings_md(cfg, {})
        assert "| `generation.sketch_floor` | 0.0 | off for photographs" in md, dataset
        given = MainJobConfig(epsilon=10.0).with_settings(public_size=0, dataset=dataset, sketch_floor=0.1)
        assert given.resolved().generation.sketch_floor == 0.1
    auto = MainJobConfig(epsilon=10.0).with_settings(public_size=0, celeba_dir="/a/celeba/folder").resolved()
    assert auto.data.dataset == "auto" and auto.generation.sketch_floor == 0.0  # "auto" reads the CelebA folder
    fashion = MainJobConfig(epsilon=10.0).with_settings(public_size=0, dataset="fashion-mnist").resolved()
    assert fashion.generation.sketch_floor == PRIVATE_ONLY_TABLE[10.0]["generation"]["sketch_floor"] > 0
