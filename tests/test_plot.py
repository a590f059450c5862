"""Pictures (issue 40.6, :mod:`fastdpot.plot`, matplotlib as an optional extra): particles against data in two chosen
directions, ε against steps for an accountant, a ledger, a flow and the DP loss (the curve's numbers replayed from
their public state and pinned to their own ``epsilon``), the audit's lower bounds against the claimed ε (also written
by ``python -m fastdpot.audit``), and the gallery's quick mode (``scripts/figures.py --quick``). Pictures are checked
for existence, size and non-blankness, not pixel by pixel; ``import fastdpot`` never imports matplotlib."""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import fastdpot
from fastdpot import plot
from fastdpot.privacy import PrivacyAccountant, PrivacyLedger

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _picture_ok(path, min_bytes=5_000):
    """A PNG that exists, has some size, and is not blank: more than a handful of distinct colours, and its
    pixels vary."""
    import matplotlib.image as mpimg

    assert os.path.isfile(path), path
    assert os.path.getsize(path) >= min_bytes, (path, os.path.getsize(path))
    img = mpimg.imread(path)[..., :3]
    assert img.shape[0] >= 100 and img.shape[1] >= 100
    colours = np.unique((img.reshape(-1, 3) * 255).round().astype(np.uint8), axis=0).shape[0]
    assert colours >= 8 and float(img.std()) > 0.02, (path, colours, float(img.std()))


def test_importing_fastdpot_does_not_import_matplotlib():
    code = "import sys, fastdpot, fastdpot.plot; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_without_matplotlib_the_first_picture_says_how_to_install_it():
    code = ("import sys; sys.modules['matplotlib'] = None; sys.modules['matplotlib.pyplot'] = None\n"
            "import torch, fastdpot.plot as P\n"
            "try:\n    P.particles(torch.randn(5, 2))\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "fastdpot[plot]" in out


def test_particles_against_data_in_two_chosen_directions(tmp_path):
    g = torch.Generator().manual_seed(0)
    data, parts = torch.randn(500, 4, generator=g), torch.randn(200, 4, generator=g) * 0.5
    for i, directions in enumerate((None, (1, 3), torch.tensor([[1.0, 1.0, 0, 0], [0, 0, 2.0, 0]]))):
        path = str(tmp_path / f"p{i}.png")
        ax = plot.particles(parts, data, directions, path=path)
        _picture_ok(path)
        assert ax.get_xlabel() in ("coordinate 0", "coordinate 1", "θ₁ᵀx")
    # the picture's points are the projections on the normalised directions
    fig, ax = matplotlib.pyplot.subplots()
    plot.particles(parts, None, np.array([[3.0, 0, 0, 0], [0, 0, 0, -1.0]]), ax=ax)
    xy = ax.collections[-1].get_offsets()
    np.testing.assert_allclose(np.asarray(xy), parts.double().numpy()[:, [0, 3]] * [1, -1], rtol=1e-12)
    matplotlib.pyplot.close(fig)
    with pytest.raises(ValueError, match="share d"):
        plot.particles(parts, data[:, :3])
    with pytest.raises(ValueError, match="out of range"):
        plot.particles(parts, None, (0, 4))
    with pytest.raises(ValueError, match="d < 2|d = 1"):
        plot.particles(parts[:, :1])


def test_epsilon_curve_of_an_accountant_is_its_epsilon_after_t_releases():
    acc = PrivacyAccountant("rdp")
    acc.step(1.1, 0.01, num_steps=30)
    acc.step(0.9, 0.02, num_steps=20)
    t, eps, spent = plot.epsilon_curve(acc, 1e-5, points=6)
    assert spent == 50 and t[0] == 1 and t[-1] == 50 and np.all(np.diff(eps) > 0)
    assert eps[-1] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)
    i = int(np.flatnonzero(t > 30)[0])  # a grid point inside the second event
    part = PrivacyAccountant("rdp")
    part.step(1.1, 0.01, num_steps=30)
    part.step(0.9, 0.02, num_steps=int(t[i]) - 30)
    assert t[i] < 50 and eps[i] == pytest.approx(part.get_epsilon(1e-5), rel=1e-12)
    with pytest.raises(ValueError, match="delta"):
        plot.epsilon_curve(acc)


def test_epsilon_curve_of_a_ledger_flow_and_loss_ends_at_their_own_epsilon(tmp_path):
    ledger = PrivacyLedger(1e-5, 12, noise_multiplier=1.3, delta_tail=1e-8)
    with pytest.raises(ValueError, match="not bound"):
        plot.epsilon_curve(ledger)
    ledger.bind(0.1, "poisson")
    ledger.record(5)
    t, eps, spent = plot.epsilon_curve(ledger, points=12)
    assert spent == 5 and list(t) == list(range(1, 13))
    assert eps[4] == pytest.approx(ledger.epsilon(), rel=1e-12)  # planned tails: all 12 charged up front
    data = torch.randn(200, 2, generator=torch.Generator().manual_seed(1))
    flow = fastdpot.DPSlicedWassersteinFlow(40, 2, 2, 0.5, noise_multiplier=2.0, batch_size=50, steps=8,
                                            secure_mode=False, generator=torch.Generator().manual_seed(2))
    flow.run(data, steps=3, progress=False)
    t, eps, spent = plot.epsilon_curve(flow)
    assert spent == 3 and t[-1] == 8 and eps[t == 3][0] == pytest.approx(flow.epsilon(), rel=1e-12)
    crit = fastdpot.DPSlicedWassersteinLoss.from_privacy(5.0, 1e-5, 20, 200, 6, 4, 2, clip_radius=1.0,
                                                         secure_mode=False, generator=torch.Generator())
    for _ in range(2):
        crit(torch.randn(20, 2), private=torch.randn(20, 2))
    t, eps, spent = plot.epsilon_curve(crit)
    assert spent == 2 and eps[t == 2][0] == pytest.approx(crit.epsilon(), rel=1e-12)
    assert eps[-1] <= 5.0 + 1e-9  # the calibrated target
    fig, ax = matplotlib.pyplot.subplots()
    for source, label in ((flow, "flow"), (crit, "loss"), (ledger, "ledger")):
        plot.epsilon(source, ax=ax, label=label)
    path = str(tmp_path / "eps.png")
    fig.savefig(path, dpi=100)
    matplotlib.pyplot.close(fig)
    _picture_ok(path)
    with pytest.raises(ValueError, match="non-private"):
        plot.epsilon_curve(fastdpot.DPSlicedWassersteinFlow(10, 2, 2, 0.5))
    with pytest.raises(ValueError, match="from_privacy"):
        plot.epsilon_curve(fastdpot.DPSlicedWassersteinLoss(0.5, 4, clip_radius=1.0))


def test_epsilon_curve_of_a_composed_ledger_ends_at_its_epsilon():
    from fastdpot.privacy.composition import ComposedLedger

    def ledger(*stages):
        led = ComposedLedger(8.0, 1e-5)
        for name, z, n, b in stages:
            led.record(name, z, n, **(dict(sampling="full") if b is None else dict(batch_size=b)), dataset_size=1000)
        return led

    rep, flow = ("representation", 2.0, 5, 100), ("flow", 3.0, 20, 50)
    led = ledger(rep, flow)  # subsampled stages: RDP
    t, eps, spent = plot.epsilon_curve(led, points=30)
    assert spent == 25 and list(t) == list(range(1, 26)) and np.all(np.diff(eps) > 0)
    assert eps[-1] == pytest.approx(led.epsilon(), rel=1e-9)
    assert eps[4] == pytest.approx(ledger(rep).epsilon(), rel=1e-9)  # after the representation's 5 releases
    full = ledger(("means", 9.0, 1, None), ("sketch", 3.0, 1, None))  # full-batch Gaussians: PLD, exact
    t, eps, _ = plot.epsilon_curve(full)
    assert full.accountant_used == "pld" and list(t) == [1, 2]
    assert eps[0] == pytest.approx(ledger(("means", 9.0, 1, None)).epsilon(), rel=1e-6)
    assert eps[1] == pytest.approx(full.epsilon(), rel=1e-6)
    with pytest.raises(ValueError, match="non-private"):
        plot.epsilon_curve(ComposedLedger(float("inf"), 1e-5))


def test_epsilon_stages_draws_each_stages_composed_epsilon(tmp_path):
    from fastdpot.privacy.composition import ComposedLedger

    led = ComposedLedger(8.0, 1e-5)
    led.record("representation", 2.0, 5, dataset_size=1000, batch_size=100)
    led.record("flow", 3.0, 40, dataset_size=1000, batch_size=50)
    path = str(tmp_path / "stages.png")
    ax = plot.epsilon_stages(led, path=path)
    _picture_ok(path)
    grey, blue = ax.patches[:2], ax.patches[2:4]  # the ε before each stage, and what the stage added
    tops, spent = [b.get_y() + b.get_height() for b in blue], led.epsilon_by_stage()
    np.testing.assert_allclose(tops, spent, rtol=1e-12)
    np.testing.assert_allclose([g.get_height() for g in grey], [0.0, spent[0]], rtol=1e-12)
    assert ax.get_ylabel() == "composed ε at δ = 1e-05"
    assert [t.get_text().split("\n")[0] for t in ax.get_xticklabels()] == ["representation", "flow"]
    assert any(line.get_label() == "target ε = 8" for line in ax.lines)
    ax = plot.epsilon_stages([("a", 1.0), ("b", 2.5)], delta=1e-6)  # a caller's own composition
    assert ax.get_ylabel() == "composed ε at δ = 1e-06"
    matplotlib.pyplot.close("all")
    for bad, kw, match in (([("a", 1.0)], {}, "delta"), ([], dict(delta=1e-5), "non-empty"),
                           ([("a", 2.0), ("b", 1.0)], dict(delta=1e-5), "cannot decrease"),
                           ([("a", float("inf"))], dict(delta=1e-5), "finite"),
                           (ComposedLedger(float("inf"), 1e-5), {}, "non-private"),
                           (ComposedLedger(1.0, 1e-5), {}, "no stage")):
        with pytest.raises(ValueError, match=match):
            plot.epsilon_stages(bad, **kw)


def _one_shot(C=2, n=400, seed=0):
    from fastdpot.flows import ClassConditionalFlow
    from fastdpot.flows.directions import patch_dct_blocks
    from fastdpot.privacy.class_sketch import class_quantile_sketch

    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 64, generator=g, dtype=torch.float64) ** 2
    y = torch.arange(n) % C
    blocks = patch_dct_blocks(8, 8, 1, ((8, 0, 0), (4, 0, 0)))  # fast blocks, as the one-shot method's
    release = class_quantile_sketch(x, y, blocks, num_classes=C, sketch_bins=4, noise_multiplier=1.0,
                                    clip_radius=4.0, centers=torch.full((64,), 0.5, dtype=torch.float64),
                                    generator=g, secure_mode=False)
    flows = ClassConditionalFlow.from_release(release, 120, domain=(0.0, 1.0), generator=g)
    return release, *flows.run(steps=4)


def test_quantiles_of_a_release_against_the_generated_particles(tmp_path):
    release, samples, labels = _one_shot()
    path = str(tmp_path / "q.png")
    ax = plot.quantiles(release, samples, labels, class_index=1, direction=66, path=path)  # block 1, row 2
    _picture_ok(path)
    lines = {line.get_label(): line for line in ax.lines}
    mine = samples[labels == 1].double()
    proj = np.sort(((mine - release.centers[1]) @ release.projections[66]).numpy())  # the dense reference
    empirical = next(v for k, v in lines.items() if k.startswith("generated (") and k.endswith("empirical"))
    np.testing.assert_allclose(empirical.get_ydata(), proj, rtol=1e-10, atol=1e-12)  # the particles' own
    table, grid = release.quantile_tables()[1]
    released = lines["released (post-processed)"]
    np.testing.assert_allclose(released.get_xdata(), grid.numpy())
    np.testing.assert_allclose(released.get_ydata(), table[66].numpy(), rtol=1e-12)
    L = int(release.bins[66])
    means = [c for c in ax.containers if hasattr(c, "lines")][0].lines[0]  # the error bars' markers
    np.testing.assert_allclose(means.get_ydata(), release.bin_means()[1, 66, :L].numpy(), rtol=1e-12)
    matplotlib.pyplot.close("all")
    for kw, err, match in ((dict(class_index=2), ValueError, "class_index"),
                           (dict(direction=release.projections.shape[0]), ValueError, "direction"),
                           (dict(shrink="no"), ValueError, "shrink")):
        with pytest.raises(err, match=match):
            plot.quantiles(release, samples, labels, **kw)
    with pytest.raises(ValueError, match="columns"):
        plot.quantiles(release, samples[:, :10], labels)
    with pytest.raises(ValueError, match="one entry per particle"):
        plot.quantiles(release, samples, labels[:-1])
    with pytest.raises(ValueError, match="no particle of class 1"):
        plot.quantiles(release, samples[labels == 0], labels[labels == 0], class_index=1)
    with pytest.raises(TypeError, match="ClassSketchRelease"):
        plot.quantiles(object(), samples, labels)


def test_audit_picture_and_the_cli_writes_it(tmp_path, capsys):
    from fastdpot.audit import run_case
    from fastdpot.audit.__main__ import main as audit_main

    results = {"gaussian_local": run_case("gaussian_local", trials=2000, seed=1),
               "gaussian_local, no_clip": run_case("gaussian_local", variant="no_clip", trials=2000, seed=1)}
    path = str(tmp_path / "a.png")
    ax = plot.audit(results, path=path)
    _picture_ok(path)
    assert [p.get_facecolor()[:3] for p in ax.patches][0] != [p.get_facecolor()[:3] for p in ax.patches][1]
    with pytest.raises(ValueError, match="no audit results"):
        plot.audit({})
    cli = str(tmp_path / "cli.png")
    rc = audit_main(["--cases", "laplace_local", "gaussian_local", "--trials", "2000", "--tail-draws", "0",
                     "--no-progress", "--plot", cli])
    assert rc == 0 and f"wrote {cli}" in capsys.readouterr().out
    _picture_ok(cli)
    # `python -m fastdpot.audit` writes audit.png in the working directory by default
    proc = subprocess.run([sys.executable, "-m", "fastdpot.audit", "--cases", "laplace_local", "--trials", "2000",
                           "--tail-draws", "0", "--no-progress"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and "wrote audit.png" in proc.stdout, proc.stderr[-2000:]
    _picture_ok(str(tmp_path / "audit.png"))


def test_arguments_that_would_draw_nothing_are_refused():
    # issue 46: max_points=0 drew two empty clouds and points=1 was read as 2; both are refused, naming the argument
    parts = torch.randn(20, 2)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_points"):
            plot.particles(parts, max_points=bad)
    acc = PrivacyAccountant("rdp")
    acc.step(1.1, 0.01, num_steps=5)
    for bad in (1, 0, 2.5):
        with pytest.raises(ValueError, match="points"):
            plot.epsilon_curve(acc, 1e-5, points=bad)
        with pytest.raises(ValueError, match="points"):
            plot.epsilon(acc, 1e-5, points=bad)
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="steps"):
            plot.epsilon_curve(acc, 1e-5, steps=bad)
    t, _, _ = plot.epsilon_curve(acc, 1e-5, points=2)
    assert list(t) == [1, 5]


def _integer_ticks(ax):
    lo, hi = ax.get_xlim()
    ticks = [float(v) for v in ax.get_xticks() if lo <= v <= hi]
    return len(ticks) >= 2 and all(v == round(v) for v in ticks)  # tick positions are exact small integers


def test_epsilon_picture_names_delta_and_counts_releases_in_whole_steps():
    # issue 46: the y axis named no δ ("at the source's δ") and a short plan had ticks at 1.25, 1.5, ... releases
    acc = PrivacyAccountant("rdp")
    acc.step(1.1, 0.01, num_steps=3)
    ax = plot.epsilon(acc, 1e-5)
    assert ax.get_ylabel() == "ε at δ = 1e-05" and _integer_ticks(ax)
    matplotlib.pyplot.close(ax.figure)
    ledger = PrivacyLedger(2e-5, 4, noise_multiplier=1.3)
    ledger.bind(0.1, "poisson")
    ledger.record(2)
    ax = plot.epsilon(ledger)  # δ from the source itself
    assert ax.get_ylabel() == "ε at δ = 2e-05" and _integer_ticks(ax)
    plot.epsilon(acc, 1e-5, ax=ax, label="acc")  # two δ on one axes: the legend names each curve's δ
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "δ" in ax.get_ylabel() and any(lab.endswith("δ = 2e-05") for lab in labels)
    assert any(lab.startswith("acc") and lab.endswith("δ = 1e-05") for lab in labels)
    matplotlib.pyplot.close(ax.figure)


def test_audit_legend_covers_no_bar():
    # issue 46: the legend sat in the upper right of the axes, over the tallest bars
    from types import SimpleNamespace

    items = {f"case {i}": SimpleNamespace(epsilon_lower=lower, epsilon=1.0, violated=lower > 1.0, confidence=0.95)
             for i, lower in enumerate((0.5, 0.9, 3.0, 3.1))}
    ax = plot.audit(items)
    fig = ax.figure
    fig.tight_layout()
    fig.canvas.draw()
    legend, frame = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.y0 >= frame.y1 - 1  # above the axes, not over them
    title = ax.title.get_window_extent()
    assert title.y0 >= legend.y1 - 1  # and under the title, not over it
    matplotlib.pyplot.close(fig)


def test_the_gallerys_quick_mode_draws_every_picture(tmp_path):
    spec = importlib.util.spec_from_file_location("figures", os.path.join(ROOT, "scripts", "figures.py"))
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    assert figures.main(["--quick", "--out", str(tmp_path)]) == 0
    names = [f.__name__ for f in figures.FIGURES]
    assert {"particles_vs_data", "epsilon_steps", "audit_bounds"} <= set(names)
    for name in names:
        _picture_ok(str(tmp_path / f"{name}.png"))
        assert os.path.isfile(os.path.join(ROOT, "docs", "gallery", f"{name}.png")), f"docs/gallery lacks {name}"
    with open(os.path.join(ROOT, "docs", "gallery.md")) as f:
        page = f.read()
    for name in names:
        assert f"gallery/{name}.png" in page, f"docs/gallery.md does not show {name}"


def test_quantiles_projects_the_rows_a_block_at_a_time_without_a_float64_copy_of_them():
    """plot.quantiles' projections θᵀ(x − m) of one class's rows, computed a block of rows at a time in float64
    from rows kept in their own dtype (a CelebA-size run's 10⁵ × 12 288 float32 samples, copied whole to float64,
    ran the machine out of memory), equal the whole float64 computation."""
    from fastdpot.plot._common import _row_tensor
    from fastdpot.plot._release import _projections

    g = torch.Generator().manual_seed(0)
    x = torch.rand(300, 1 << 16, generator=g)  # d = 2^16: blocks of 32 rows
    theta = torch.randn(1 << 16, generator=g, dtype=torch.float64)
    center = torch.rand(1 << 16, generator=g, dtype=torch.float64)
    keep = torch.arange(1, 300, 3)
    rows = _row_tensor(x, "particles")
    assert rows.dtype == torch.float32 and rows.data_ptr() == x.data_ptr()  # no copy
    want = ((x.double()[keep] - center) @ theta).numpy()
    np.testing.assert_allclose(_projections(rows, keep, theta, center), want, rtol=0, atol=1e-9)
    np.testing.assert_allclose(_projections(rows, None, theta, center), ((x.double() - center) @ theta).numpy(),
                               rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="at least one row"):
        _row_tensor(torch.empty(0, 4), "particles")
