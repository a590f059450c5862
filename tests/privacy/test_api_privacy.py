"""Privacy-relevant API: private rows by keyword only, visible budget exhaustion, ε spent by the DP-SW loss,
atomic and validated checkpoint loads."""
import math

import pytest
import torch

import fastdpot
from fastdpot.privacy import BudgetExceededError, PrivacyAccountant, split_delta


def _rows(n, d=3, seed=0, dtype=torch.float64):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ------------------------------------------------------------------------------------------ private side by keyword
def test_dp_sliced_wasserstein_refuses_private_rows_by_position():
    real, fake = _rows(20, seed=1), _rows(20, seed=2).requires_grad_()
    # the former (x_private, y, noise_std) order and PyTorch's (input, target) order: both refused, naming private=
    for args in ((real, fake, 0.5), (fake, real, 0.5), (fake, real)):
        with pytest.raises(TypeError, match="private=x_private"):
            fastdpot.dp_sliced_wasserstein(*args, num_projections=4)
    with pytest.raises(TypeError, match="private="):
        fastdpot.dp_sliced_wasserstein(fake, noise_std=0.5, num_projections=4)
    with pytest.raises(TypeError, match="noise_std"):
        fastdpot.dp_sliced_wasserstein(fake, private=real, num_projections=4)
    with pytest.raises(ValueError, match="same tensor"):
        fastdpot.dp_sliced_wasserstein(real, private=real, noise_std=0.5, num_projections=4)
    # both sides validated, by their names
    with pytest.raises(ValueError, match="generated"):
        fastdpot.dp_sliced_wasserstein(fake[:, :2], private=real, noise_std=0.5, num_projections=4, clip_radius=1.0)
    with pytest.raises(TypeError, match="private"):
        fastdpot.dp_sliced_wasserstein(fake, private=real.numpy(), noise_std=0.5, num_projections=4)
    with pytest.raises(ValueError, match="generated"):
        fastdpot.dp_sliced_wasserstein(torch.full((5, 3), math.nan), private=real, noise_std=0.5, num_projections=4,
                                       clip_radius=1.0)


def test_keyword_private_side_is_the_clipped_one():
    """The ``private=`` rows are the ones clipped to ``radius``: the loss equals the one on pre-clipped rows."""
    th = fastdpot.sliced.random_projections(6, 3, torch.Generator().manual_seed(0), dtype=torch.float64)
    real, fake = 5.0 * _rows(30, seed=3), _rows(25, seed=4)
    got = fastdpot.dp_sliced_wasserstein(fake, private=real, noise_std=0.0, projections=th, clip_radius=1.0)
    clipped = fastdpot.privacy.clip_rows(real, 1.0)
    want = fastdpot.sliced_wasserstein(clipped, fake, projections=th)
    assert float(got) == pytest.approx(float(want), rel=1e-12)
    # the generated side is never clipped: swapping the roles gives another value
    other = fastdpot.dp_sliced_wasserstein(real, private=fake, noise_std=0.0, projections=th, clip_radius=1.0)
    assert abs(float(other) - float(want)) > 1e-3


def test_loss_module_refuses_swapped_or_positional_private_rows():
    crit = fastdpot.DPSlicedWassersteinLoss.from_privacy(10.0, 1e-5, 10, 10, 3, 4, 3, 1.0)  # B = n: fast calibration
    real, fake = _rows(10, seed=5, dtype=torch.float32), _rows(10, seed=6, dtype=torch.float32).requires_grad_()
    with pytest.raises(TypeError, match="private="):
        crit(fake, real)  # nn.MSELoss(input, target) order
    with pytest.raises(TypeError, match="private="):
        crit(fake)
    assert crit.releases == 0  # refused before anything was released or counted
    crit(fake, private=real).backward()
    assert fake.grad is not None and crit.releases == 1


# ------------------------------------------------------------------------------------------ ε of the DP-SW loss
def test_loss_module_reports_epsilon_spent():
    eps, delta, B, n, T, k, d, r = 4.0, 1e-5, 10, 10, 3, 4, 3, 1.0  # B = n (q = 1): a fast calibration
    crit = fastdpot.DPSlicedWassersteinLoss.from_privacy(eps, delta, B, n, T, k, d, r)
    assert crit.epsilon() == 0.0 and crit.get_epsilon(1e-5) == 0.0
    real, fake = _rows(n, d, seed=7, dtype=torch.float32), _rows(B, d, seed=8, dtype=torch.float32)
    spent = []
    for t in range(T):
        crit(fake, private=real)
        spent.append(crit.epsilon())
    assert spent[0] < spent[1] < spent[2] <= eps * (1 + 1e-6)
    # the value is the RDP accountant of the releases so far, at δ − releases·δ_tail
    det = crit.privacy
    acc = PrivacyAccountant("rdp")
    acc.step(det["noise_multiplier"], B / n, num_steps=2, sampling="without_replacement", dataset_size=n,
             batch_size=B)
    _, d_tail = split_delta(delta, T)
    assert det["delta_tail"] == pytest.approx(d_tail)
    assert spent[1] == pytest.approx(acc.get_epsilon(delta - 2 * d_tail), rel=1e-12)
    assert crit.get_epsilon(1e-3) < crit.epsilon()  # larger δ, smaller ε
    with pytest.raises(BudgetExceededError):
        crit(fake, private=real[:B])
    with pytest.raises(ValueError, match="delta"):
        crit.epsilon(2.0)
    with pytest.raises(RuntimeError, match="from_privacy"):
        fastdpot.DPSlicedWassersteinLoss(0.5, 4, clip_radius=1.0).epsilon(1e-5)


# ------------------------------------------------------------------------------------------ visible budget stop
def _flow(**kw):
    args = dict(noise_multiplier=2.0, batch_size=60, steps=40, secure_mode=False,
                generator=torch.Generator().manual_seed(10))
    if "target_epsilon" in kw:  # z calibrated for the target (giving both is refused)
        args.pop("noise_multiplier")
    args.update(kw)
    return fastdpot.DPSlicedWassersteinFlow(32, 8, 40, 1.0, **args)


def test_run_stopped_by_the_budget_says_so_and_the_bar_shows_the_current_epsilon(caplog, capsys):
    data = _rows(300, 8, seed=9, dtype=torch.float32)
    f = _flow(target_epsilon=3.0)
    f.run(data, steps=1, progress=False)
    f.ledger._limit = 6  # as if the budget allowed 6 releases (the calibration fits all 40: forced here)
    with caplog.at_level("WARNING", logger="fastdpot.flow"):
        out = f.run(data, progress=True)
    assert out is f.particles  # run() still returns the particles
    res = f.last_run
    assert f.stop_reason == res.stop_reason == "budget" and res.stopped_early
    assert res.steps_run == 5 and f.steps_taken == 6 and res.steps_requested == 39
    assert res.epsilon == pytest.approx(f.epsilon()) and res.epsilon <= 3.0
    msgs = [r.getMessage() for r in caplog.records if r.name == "fastdpot.flow"]
    assert len(msgs) == 1 and "target_epsilon=3" in msgs[0] and "after 5 of 39" in msgs[0]
    shown = [part.split("=")[1].rstrip(",]") for part in capsys.readouterr().err.replace("\r", " ").split()
             if part.startswith("eps=")]
    assert shown and shown[-1] == f"{f.epsilon():.3g}"  # not a value from several steps back
    caplog.clear()
    with caplog.at_level("WARNING", logger="fastdpot.flow"):
        f.run(data, progress=False)  # nothing left: says so again, takes no step
    assert f.last_run.steps_run == 0 and f.stop_reason == "budget" and caplog.records


def test_run_stopped_by_the_planned_steps_says_so(caplog):
    data = _rows(300, 8, seed=9, dtype=torch.float32)
    f = _flow(steps=3)
    with caplog.at_level("WARNING", logger="fastdpot.flow"):
        f.run(data, steps=5, progress=False)
    assert f.stop_reason == "planned_steps" and f.last_run.steps_run == 3 and f.steps_taken == 3
    assert any("planned steps=3" in r.getMessage() for r in caplog.records)
    g = _flow(steps=3)
    caplog.clear()
    with caplog.at_level("WARNING", logger="fastdpot.flow"):
        g.run(data, progress=False)  # the whole plan: completed, no warning
    assert g.stop_reason == "completed" and not g.last_run.stopped_early and not caplog.records


# ------------------------------------------------------------------------------------------ atomic, validated loads
def _snapshot(flow):
    st = flow.state_dict()
    return (st["particles"].clone(), st["generator"].clone(), st["step"], st["mode"], flow.epsilon(),
            repr(st["accountant"]), repr(st["budget"]))


def _same(a, b):
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2:] == b[2:]


_BAD_STATES = [
    (lambda st: st.pop("particles"), "missing"),
    (lambda st: st.pop("budget"), "missing"),
    (lambda st: st.update(particles=torch.zeros(31, 8)), "shape"),
    (lambda st: st.update(particles=st["particles"].double()[:, :4]), "shape"),
    (lambda st: st.update(step=-5), "step"),
    (lambda st: st.update(step=999), "step"),
    (lambda st: st.update(step="3"), "step"),
    (lambda st: st.update(step=True), "step"),
    (lambda st: st.update(mode="bogus"), "mode"),
    (lambda st: st.update(budget=None, accountant=None), "reset the ε"),
    (lambda st: st.update(budget=None), "budget"),
    (lambda st: st.update(generator=torch.zeros(3)), "generator"),
    (lambda st: st.update(last_drift_norm="x"), "last_drift_norm"),
    (lambda st: st.update(bound_n=0), "bound_n"),
    (lambda st: st.update(noise_multiplier=-1.0), "noise_multiplier"),
    (lambda st: st["budget"].update(epsilon=10.0), "epsilon"),
    (lambda st: st["budget"]["accountant"].update(history=["garbage"]), "history"),
    (lambda st: st["budget"]["accountant"]["history"][0].update(num_steps=1), "release"),
    (lambda st: st.update(pool=torch.zeros(5, 8)), "pool"),
]


@pytest.fixture(scope="module")
def ran_flow_state():
    data = _rows(300, 8, seed=9, dtype=torch.float32)
    f = _flow(target_epsilon=50.0, steps=6)
    f.run(data, steps=3, progress=False)
    return f.state_dict()


@pytest.mark.parametrize("mutate,match", _BAD_STATES)
def test_flow_load_state_dict_validates_everything_before_assigning(ran_flow_state, mutate, match):
    import copy

    data = _rows(300, 8, seed=9, dtype=torch.float32)
    target = _flow(target_epsilon=50.0, steps=6, generator=torch.Generator().manual_seed(3))
    target.run(data, steps=2, progress=False)  # ε spent > 0: a bad load must not reset it
    before = _snapshot(target)
    assert before[4] > 0
    bad = copy.deepcopy(ran_flow_state)
    mutate(bad)
    with pytest.raises(ValueError, match=match):
        target.load_state_dict(bad)
    assert _same(_snapshot(target), before)
    with pytest.raises(ValueError):
        fastdpot.DPSlicedWassersteinFlow.from_state_dict(bad)
    target.load_state_dict(copy.deepcopy(ran_flow_state))  # the good state still loads
    assert target.steps_taken == 3


def test_accountant_and_budget_loads_are_atomic():
    acc = PrivacyAccountant("rdp")
    acc.step(1.0, 0.1, num_steps=5)
    good = acc.state_dict()
    before = acc.get_epsilon(1e-5)
    for bad in (dict(good, history=[dict(good["history"][0], num_steps="3")]),
                dict(good, history=good["history"] + [7]), dict(good, orders="garbage"), dict(good, history=None)):
        with pytest.raises(ValueError):
            acc.load_state_dict(bad)
        assert acc.steps == 5 and acc.get_epsilon(1e-5) == before
    b10 = fastdpot.PrivacyBudget(10.0, 1e-5)
    b10.spend(1.0, 0.1, num_steps=50)
    b1 = fastdpot.PrivacyBudget(1.0, 1e-5)
    with pytest.raises(ValueError, match="replace_budget"):
        b1.load_state_dict(b10.state_dict())
    assert (b1.epsilon, b1.steps) == (1.0, 0)
    with pytest.raises(ValueError, match="delta_tail_spent"):
        b10.load_state_dict(dict(b10.state_dict(), delta_tail_spent=1.0))
    assert b10.steps == 50 and b10.delta_tail_spent == 0.0
    assert fastdpot.PrivacyBudget.from_state_dict(b10.state_dict()).epsilon == 10.0


def test_corrupt_or_wrong_checkpoint_files_are_named(tmp_path):
    from fastdpot.flows import CheckpointError

    data = _rows(300, 8, seed=9, dtype=torch.float32)
    f = _flow(steps=4)
    path = tmp_path / "flow.pt"
    f.run(data, steps=1, progress=False, checkpoint_path=str(path))
    raw = path.read_bytes()
    for name, blob in (("truncated.pt", raw[: len(raw) // 2]), ("garbage.pt", b"\x80\x04not a checkpoint"),
                       ("empty.pt", b"")):
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(CheckpointError, match=f"{name}.*corrupt"):
            fastdpot.DPSlicedWassersteinFlow.load(str(tmp_path / name))
        with pytest.raises(CheckpointError, match=name):
            fastdpot.ClassConditionalFlow.load(str(tmp_path / name))
    with pytest.raises(CheckpointError, match="directory"):
        fastdpot.DPSlicedWassersteinFlow.load(str(tmp_path))
    with pytest.raises(CheckpointError, match="single-flow checkpoint"):
        fastdpot.ClassConditionalFlow.load(str(path))
    assert fastdpot.DPSlicedWassersteinFlow.load(str(path)).steps_taken == 1
    cc = fastdpot.ClassConditionalFlow(20, 8, 4, 1.0, num_classes=2, noise_multiplier=2.0, batch_size=20, steps=3,
                                       secure_mode=False, generator=torch.Generator().manual_seed(0))
    cc.save(str(tmp_path / "cc.pt"))
    with pytest.raises(CheckpointError, match="ClassConditionalFlow checkpoint; load it with"):
        fastdpot.DPSlicedWassersteinFlow.load(str(tmp_path / "cc.pt"))
    assert fastdpot.ClassConditionalFlow.load(str(tmp_path / "cc.pt")).flows == []
    st = torch.load(str(path), weights_only=False)
    st["step"] = 999
    torch.save(st, str(tmp_path / "bad_step.pt"))
    with pytest.raises(CheckpointError, match="bad_step.pt.*step"):
        fastdpot.DPSlicedWassersteinFlow.load(str(tmp_path / "bad_step.pt"))


def test_checkpoint_paths_are_checked_before_any_step(tmp_path):
    data = _rows(300, 8, seed=9, dtype=torch.float32)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for bad, match in ((str(tmp_path), "directory"), (str(blocker / "flow.pt"), "not a directory"), (3, "path")):
        f = _flow(steps=4)
        with pytest.raises((ValueError, TypeError), match=match):
            f.run(data, progress=False, checkpoint_path=bad)
        assert f.steps_taken == 0 and f.epsilon() == 0.0
        with pytest.raises((ValueError, TypeError), match=match):
            f.save(bad)
    labels = torch.arange(300) % 2
    cc = fastdpot.ClassConditionalFlow(20, 8, 4, 1.0, num_classes=2, noise_multiplier=2.0, batch_size=20, steps=3,
                                       secure_mode=False, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="directory"):
        cc.run(data, labels, progress=False, checkpoint_path=str(tmp_path))
    assert all(fl.steps_taken == 0 for fl in cc.flows)


@pytest.mark.parametrize("bad", ["label", "pixel"])
def test_dp_sinkhorn_refuses_out_of_range_private_values_without_echoing_them(bad):
    # issue 37: a public mechanism echoed an out-of-range private label ("index 10 is out of bounds"); DP-Sinkhorn
    # printed the range of the private labels and pixels
    from fastdpot.dp_sinkhorn import DPSinkhornConfig, train_dp_sinkhorn
    from fastdpot.experiments.papers.dp_sinkhorn import ConditionalDCGANGenerator

    g = torch.Generator().manual_seed(0)
    images, labels = torch.rand(20, 1, 28, 28, generator=g), torch.randint(0, 10, (20,), generator=g)
    if bad == "label":
        labels[3] = 7321
    else:
        images[2, 0, 5, 5] = 7.321
    cfg = DPSinkhornConfig(expected_batch_size=5, generated_batch_size=4, max_steps=1, accountant="rdp")
    with pytest.raises(ValueError, match="not shown") as info:
        train_dp_sinkhorn(images, labels, ConditionalDCGANGenerator(4, 10, 8), cfg)
    assert "7321" not in str(info.value) and "7.321" not in str(info.value)
