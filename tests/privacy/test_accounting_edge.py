"""Accounting at the edge of a budget (issue 31): every accounting call is bounded by the algorithm, not by the
machine. A refused spend with little noise is decided without a PLD; identical spends past the RDP frontier cost a
handful of PLD evaluations in all (the frontier is found once); PLD is used only within a documented range. The
wall-clock bounds below are loose (a loaded 2-core machine); the counts of PLD evaluations are the guarantee."""
import time

import pytest

from fastdpot.privacy import BudgetExceededError, PrivacyAccountant, PrivacyBudget, calibrate_noise_multiplier
from fastdpot.privacy.accounting import PLD_MAX_STEPS, PLD_MIN_NOISE_MULTIPLIER


@pytest.fixture
def pld_calls(monkeypatch):
    """Counts the budget's PLD evaluations (the only expensive step of a spend)."""
    calls = []
    orig = PrivacyBudget._pld_epsilon

    def counted(self, *a):
        calls.append(a[-1])
        return orig(self, *a)

    monkeypatch.setattr(PrivacyBudget, "_pld_epsilon", counted)
    return calls


@pytest.mark.parametrize("z", [1e-3, 0.02])
def test_a_refused_spend_with_little_noise_answers_at_once(z, pld_calls):
    t0 = time.perf_counter()
    b = PrivacyBudget(3.0, 1e-5)
    with pytest.raises(BudgetExceededError, match="nothing was recorded"):
        b.spend(z, sample_rate=0.5)
    assert pld_calls == [] and b.steps == 0  # decided by RDP (>> 2ε + 1): no PLD of so little noise
    assert time.perf_counter() - t0 < 10


def test_spends_past_the_rdp_frontier_find_the_pld_frontier_once(pld_calls):
    # the privacy-core example's regime: RDP alone refuses from about step 11 000, PLD accepts up to ~20 000
    q, z = 50 / 60000, 0.43746918260957524
    b = PrivacyBudget(10.0, 1e-5)
    b.spend(z, sample_rate=q, num_steps=11000)
    assert b.accountant.get_epsilon(b.delta_accountant, accountant="rdp") > 9.5 and pld_calls == []
    n = 11000
    while True:
        try:
            b.spend(z, sample_rate=q)
        except BudgetExceededError:
            break
        n += 1
    assert len(pld_calls) <= 12  # not one PLD per spend (there were ~9000 of them)
    # the frontier is PLD's own: n releases fit, n + 1 do not
    for m, fits in ((n, True), (n + 1, False)):
        a = PrivacyAccountant()
        a.step(z, q, m)
        assert (a.get_epsilon(1e-5) <= 10.0) == fits
    assert b.epsilon_spent <= 10.0 and n > 19000
    calls = len(pld_calls)
    t0 = time.perf_counter()
    for _ in range(3):  # at the edge: refused from the known frontier, no new PLD
        with pytest.raises(BudgetExceededError):
            b.spend(z, sample_rate=q)
    assert len(pld_calls) == calls and time.perf_counter() - t0 < 1.0


def test_pld_is_used_only_within_its_documented_range():
    big = PrivacyAccountant()
    big.step(1.0, 0.01, 10 ** 9)
    t0 = time.perf_counter()
    assert big.epsilon_method() == "rdp" and 0 < big.get_epsilon(1e-5) < float("inf")
    with pytest.raises(ValueError, match="PLD_MAX_STEPS"):
        big.get_epsilon(1e-5, accountant="pld")
    small = PrivacyAccountant()
    small.step(PLD_MIN_NOISE_MULTIPLIER / 2, 0.5)
    assert small.epsilon_method() == "rdp"
    with pytest.raises(ValueError, match="PLD_MIN_NOISE_MULTIPLIER"):
        small.get_epsilon(1e-5, accountant="pld")
    inside = PrivacyAccountant()
    inside.step(1.0, 0.01, PLD_MAX_STEPS)
    assert inside.epsilon_method() == "pld"
    assert time.perf_counter() - t0 < 10


def test_calibration_over_a_huge_number_of_steps_answers_in_seconds():
    t0 = time.perf_counter()
    z = calibrate_noise_multiplier(3.0, 1e-5, 0.01, 10 ** 12)  # beyond PLD's range: the RDP calibration
    assert time.perf_counter() - t0 < 30
    acc = PrivacyAccountant()
    acc.step(z, 0.01, 10 ** 12)
    assert acc.epsilon_method() == "rdp" and 2.9 < acc.get_epsilon(1e-5) <= 3.0
    with pytest.raises(ValueError, match="PLD_MAX_STEPS"):
        calibrate_noise_multiplier(3.0, 1e-5, 0.01, 10 ** 12, accountant="pld")
