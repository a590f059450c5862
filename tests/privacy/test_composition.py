"""The composed ledger (fastdpot.privacy.composition): full-batch Gaussians compose exactly (PLD: one Gaussian of
noise multiplier (Σ z⁻²)^(-1/2)), a subsampled release switches the ledger to RDP, calibration meets the target."""
import math

import dp_accounting as dpa
import pytest

from fastdpot.privacy.composition import ComposedLedger


def _pld(z, delta):
    acc = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dpa.GaussianDpEvent(z))
    return acc.get_epsilon(delta)


def test_full_batch_gaussians_compose_exactly_by_pld():
    led = ComposedLedger(10.0, 1e-6)
    led.record("means", 3.0, 1, sampling="full", dataset_size=1000)
    z = led.calibrate(1, sampling="full", dataset_size=1000)
    led.record("sketch", z, 1, sampling="full", dataset_size=1000)
    assert led.accountant_used == "pld" and led.state_dict()["accountant"] == "pld"
    combined = (3.0 ** -2 + z ** -2) ** -0.5  # two Gaussians on the same data: one Gaussian
    assert led.epsilon() == pytest.approx(_pld(combined, 1e-6), rel=1e-6)
    assert 9.9 < led.epsilon() <= 10.0 * (1 + 1e-9)
    rdp = ComposedLedger(10.0, 1e-6, accountant="rdp")
    z_rdp = rdp.calibrate(1, sampling="full", dataset_size=1000)
    assert z_rdp > ComposedLedger(10.0, 1e-6).calibrate(1, sampling="full", dataset_size=1000)  # RDP is looser


def test_a_subsampled_release_makes_the_ledger_rdp():
    led = ComposedLedger(5.0, 1e-5)
    led.record("rep", 2.0, 1, sampling="full", dataset_size=1000)
    z = led.calibrate(100, dataset_size=1000, batch_size=10)
    led.record("flow", z, 100, dataset_size=1000, batch_size=10)
    assert led.accountant_used == "rdp" and 4.9 < led.epsilon() <= 5.0 * (1 + 1e-9)
    with pytest.raises(ValueError, match="accountant"):
        ComposedLedger(1.0, 1e-5, accountant="pld")
    assert math.isinf(ComposedLedger(float("inf"), 1e-5).epsilon())


def test_epsilon_by_stage_is_the_composition_of_each_stage_with_those_before():
    # issue 46: how a run's ε was spent, stage by stage (the run folder's epsilon.png)
    led = ComposedLedger(10.0, 1e-6)
    assert led.epsilon_by_stage() == []
    led.record("means", 3.0, 1, sampling="full", dataset_size=1000)
    led.record("sketch", 1.5, 1, sampling="full", dataset_size=1000)
    led.record("means", 3.0, 1, sampling="full", dataset_size=1000)  # a second seed joins the first stages
    first, both = led.epsilon_by_stage()
    assert [s["stage"] for s in led.stages] == ["means", "sketch"]
    assert first == pytest.approx(_pld(3.0 / math.sqrt(2), 1e-6), rel=1e-6)  # the two means releases alone
    assert both == pytest.approx(led.epsilon(), rel=1e-12)  # the last is the ledger's ε
    assert both == pytest.approx(_pld((2 / 9.0 + 1 / 1.5 ** 2) ** -0.5, 1e-6), rel=1e-6)
    rdp = ComposedLedger(5.0, 1e-5)
    rdp.record("rep", 2.0, 1, sampling="full", dataset_size=1000)
    rdp.record("flow", 3.0, 50, dataset_size=1000, batch_size=10)
    rep, total = rdp.epsilon_by_stage(1e-6)  # another δ; the run's accountant (RDP) for every stage
    alone = ComposedLedger(5.0, 1e-5, accountant="rdp")
    alone.record("rep", 2.0, 1, sampling="full", dataset_size=1000)
    assert rep == pytest.approx(alone.epsilon(1e-6), rel=1e-12) and total == pytest.approx(rdp.epsilon(1e-6), rel=1e-12)
    assert rep < total
    assert ComposedLedger(float("inf"), 1e-5).epsilon_by_stage() == []
