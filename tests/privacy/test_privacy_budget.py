"""PrivacyBudget refuses before recording, tracks sensitivity tails, and survives checkpointing."""
import io
import json

import pytest
import torch

from fastdpot.privacy import BudgetExceededError, PrivacyAccountant, PrivacyBudget, split_delta

Q, Z, T = 250 / 29999, 1.0, 4199


def test_spend_within_budget_records_and_reports():
    b = PrivacyBudget(4.0, 1e-5)
    eps = b.spend(Z, Q, T)
    assert b.steps == T and eps <= 4.0
    assert b.epsilon_spent == pytest.approx(3.112, abs=0.01)  # the PLD value is reported
    assert b.epsilon_remaining == pytest.approx(4.0 - b.epsilon_spent)


def test_pld_accepts_what_rdp_alone_would_refuse():
    b = PrivacyBudget(3.2, 1e-5)  # RDP gives 3.41 > 3.2, PLD 3.11 <= 3.2
    b.spend(Z, Q, T)
    assert b.epsilon_spent <= 3.2 < b.accountant.get_epsilon(1e-5, accountant="rdp")
    rdp_only = PrivacyBudget(3.2, 1e-5, PrivacyAccountant("rdp"))
    with pytest.raises(BudgetExceededError):
        rdp_only.spend(Z, Q, T)


def test_exceeding_raises_before_anything_is_recorded():
    b = PrivacyBudget(3.0, 1e-5)
    b.spend(Z, Q, 1000)
    before = (b.accountant.state_dict(), b.delta_tail_spent, b.epsilon_spent)
    assert not b.can_spend(Z, Q, T)
    with pytest.raises(BudgetExceededError, match="nothing was recorded"):
        b.spend(Z, Q, T)
    assert (b.accountant.state_dict(), b.delta_tail_spent, b.epsilon_spent) == before
    assert b.steps == 1000


def test_budget_shares_the_callers_accountant():
    acc = PrivacyAccountant("rdp")
    b = PrivacyBudget(10.0, 1e-5, acc)
    b.spend(1.0, 0.01, 10)
    assert acc.steps == 10 and b.accountant is acc


def test_max_steps_is_the_exact_frontier():
    b = PrivacyBudget(2.0, 1e-5, PrivacyAccountant("rdp"))
    m = b.max_steps(Z, 0.01)
    assert m > 0 and b.can_spend(Z, 0.01, m) and not b.can_spend(Z, 0.01, m + 1)
    b.spend(Z, 0.01, m)
    with pytest.raises(BudgetExceededError):
        b.spend(Z, 0.01)
    assert b.max_steps(Z, 0.01) == 0


def test_sensitivity_tails_are_charged_to_delta():
    delta, steps = 1e-5, 200
    d_acc, d_tail = split_delta(delta, steps)
    b = PrivacyBudget(50.0, delta, PrivacyAccountant("rdp"))
    b.spend(2.0, num_steps=steps, sampling="without_replacement", dataset_size=1000, batch_size=50,
            delta_tail=d_tail)
    assert b.delta_tail_spent == pytest.approx(delta / 2) and b.delta_accountant == pytest.approx(d_acc)
    assert b.epsilon_spent == pytest.approx(b.accountant.get_epsilon(d_acc))
    # the tails alone can exhaust δ: refused, nothing recorded
    with pytest.raises(BudgetExceededError, match="delta"):
        b.spend(2.0, num_steps=1, sampling="without_replacement", dataset_size=1000, batch_size=50,
                delta_tail=delta / 2)
    assert b.steps == steps and b.delta_tail_spent == pytest.approx(delta / 2)


@pytest.mark.parametrize("via", ["json", "torch"])
def test_state_dict_round_trip(via):
    b = PrivacyBudget(6.0, 1e-5)
    b.spend(Z, Q, 2000, delta_tail=1e-10)
    state = b.state_dict()
    if via == "json":
        state = json.loads(json.dumps(state))
    else:
        buf = io.BytesIO()
        torch.save({"budget": state}, buf)
        buf.seek(0)
        state = torch.load(buf, weights_only=True)["budget"]
    with pytest.raises(ValueError, match="replace_budget"):  # another (ε, δ): refused, nothing changed
        PrivacyBudget(1.0, 0.5).load_state_dict(state)
    c = PrivacyBudget(1.0, 0.5)
    c.load_state_dict(state, replace_budget=True)
    assert PrivacyBudget.from_state_dict(state).epsilon_spent == pytest.approx(b.epsilon_spent, rel=1e-12)
    assert (c.epsilon, c.delta, c.steps) == (6.0, 1e-5, 2000)
    assert c.delta_tail_spent == pytest.approx(2000 * 1e-10)
    assert c.epsilon_spent == pytest.approx(b.epsilon_spent, rel=1e-12)
    for n in (100, 100000):
        assert c.can_spend(Z, Q, n) == b.can_spend(Z, Q, n) == (n == 100)


@pytest.mark.parametrize("call,match", [
    (lambda: PrivacyBudget(0.0, 1e-5), "epsilon"),
    (lambda: PrivacyBudget(1.0, 1.0), "delta"),
    (lambda: PrivacyBudget(1.0, 1e-5, accountant="pld"), "accountant"),
    (lambda: PrivacyBudget(1.0, 1e-5).spend(1.0, 0.1, delta_tail=-1e-9), "delta_tail"),
    (lambda: PrivacyBudget(1.0, 1e-5).spend(1.0, 0.1, num_steps=0), "num_steps"),
    (lambda: PrivacyBudget(1.0, 1e-5).spend(0.0, 0.1), "noise_multiplier"),
    (lambda: PrivacyBudget(1.0, 1e-5).load_state_dict([1, 2]), "state"),
    (lambda: PrivacyBudget(1.0, 1e-5).load_state_dict({"epsilon": 1.0}), "missing"),
    (lambda: PrivacyAccountant().load_state_dict({"accountant": "pld"}), "missing"),
    (lambda: PrivacyAccountant().load_state_dict(dict(PrivacyAccountant().state_dict(), history=[
        dict(noise_multiplier=-1.0, sample_rate=0.1, sampling="poisson", dataset_size=None, batch_size=None,
             num_steps=1)])), "noise_multiplier"),
])
def test_budget_validation(call, match):
    with pytest.raises(ValueError, match=match):
        call()
