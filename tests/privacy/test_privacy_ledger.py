"""PrivacyLedger: every release counted once and before it is computed, refused (nothing counted) when it does not
fit, the same ε as a PrivacyAccountant fed the same releases, and a checkpoint round trip that refuses corrupted
states without touching the ledger."""
import copy
import json

import pytest

from fastdpot.privacy import (BudgetExceededError, PrivacyAccountant, PrivacyBudget, PrivacyLedger,
                              calibrate_noise_multiplier, split_delta)

DELTA, T, N, B = 1e-5, 8, 1000, 50
EVENT = dict(sample_rate=B / N, sampling="without_replacement", dataset_size=N, batch_size=B)


def _ledger(**kw):
    """A ledger of z = 1.2; ``target_epsilon=`` caps that z with a budget of ε (a target ε with a given z is refused:
    it would calibrate z)."""
    args = dict(noise_multiplier=1.2, accountant="rdp")
    args.update(kw)
    eps = args.pop("target_epsilon", None)
    if eps is not None and args["noise_multiplier"] is not None:
        checked_at = DELTA if args.get("tails") == "spent" else split_delta(DELTA, T)[0]
        args["budget"] = PrivacyBudget(eps, checked_at, PrivacyAccountant(args["accountant"]))
    elif eps is not None:
        args["target_epsilon"] = eps
    return PrivacyLedger(DELTA, T, **args)


def test_split_and_unbound_ledger():
    led = _ledger()
    assert led.delta_split == split_delta(DELTA, T) and not led.bound
    assert _ledger(delta_tail=0.0).delta_split == (DELTA, 0.0)
    assert led.can_spend() and led.epsilon() == 0.0 and led.steps_spent == 0 and led.limit == T
    with pytest.raises(RuntimeError, match="bind"):
        led.spend()
    with pytest.raises(ValueError, match="noise_multiplier or target_epsilon"):
        PrivacyLedger(DELTA, T)
    with pytest.raises(ValueError, match="delta_tail"):
        PrivacyLedger(DELTA, T, noise_multiplier=1.0, delta_tail=DELTA / T)


def test_counts_once_and_flushes_identical_events_in_one_call():
    led = _ledger()
    assert led.bind(**EVENT) == 1.2 and led.bind(**EVENT) == 1.2  # binding again with the same event: nothing
    for i in range(5):
        led.spend()
        assert led.steps_spent == i + 1
    assert led.accountant.steps == 0  # counted, not yet recorded
    led.flush()
    assert led.accountant.history == [(dict(noise_multiplier=1.2, **EVENT), 5)] and led.steps_spent == 5
    with pytest.raises(ValueError, match="bound to the event"):
        led.bind(sample_rate=1.0)


def test_refuses_the_planned_steps_before_counting():
    led = _ledger(name="the flow")
    led.bind(**EVENT)
    led.spend(T)
    with pytest.raises(BudgetExceededError, match="the flow has taken its planned 8 private steps"):
        led.spend()
    with pytest.raises(BudgetExceededError, match="planned"):
        led.record()
    assert led.steps_spent == T and not led.can_spend()
    assert led.epsilon() > 0 and led.accountant.steps == T


def test_refuses_a_step_over_the_budget_before_counting():
    z = 1.5  # too little noise for T steps at ε = 1: the plan stops earlier (after 4)
    led = _ledger(noise_multiplier=z, target_epsilon=1.0)
    led.bind(**EVENT)
    allowed = led.limit
    assert 0 < allowed < T
    led.spend(allowed)
    with pytest.raises(BudgetExceededError, match=f"step {allowed + 1} would exceed target_epsilon=1.0.*nothing was "
                                                  "released"):
        led.spend()
    assert led.steps_spent == allowed and led.epsilon() <= 1.0
    # the plan is the budget's own answer
    budget = PrivacyBudget(1.0, split_delta(DELTA, T)[0], PrivacyAccountant("rdp"))
    assert budget.max_steps(z, limit=T, **EVENT) == allowed


def test_same_epsilon_as_a_direct_accountant():
    led = _ledger()
    led.bind(**EVENT)
    led.spend(3)
    led.spend(2)
    acc = PrivacyAccountant("rdp")
    acc.step(1.2, num_steps=5, **EVENT)
    d_acc, d_tail = split_delta(DELTA, T)
    assert led.epsilon() == acc.get_epsilon(DELTA - T * d_tail)
    assert led.epsilon(1e-3) == acc.get_epsilon(1e-3 - T * d_tail)
    with pytest.raises(ValueError, match="T·δ_tail"):
        led.epsilon(T * d_tail)


def test_calibration_at_bind_is_calibrate_noise_multiplier():
    led = PrivacyLedger(DELTA, T, target_epsilon=3.0, accountant="rdp")
    assert led.noise_multiplier is None
    z = led.bind(**EVENT)
    assert z == calibrate_noise_multiplier(3.0, split_delta(DELTA, T)[0], steps=T, accountant="rdp", **EVENT)
    assert led.noise_multiplier == z and led.limit == T  # calibrated for T steps: the budget allows all of them
    led.spend(T)
    assert led.epsilon() <= 3.0


def test_record_and_spent_tails_match_a_budget():
    """``record`` with ``tails="spent"`` is PrivacyBudget.spend(..., delta_tail=) step for step (DPSWgen's use)."""
    d_tail = split_delta(DELTA, T)[1]
    led = _ledger(tails="spent", target_epsilon=5.0)
    led.bind(**EVENT)
    budget = PrivacyBudget(5.0, DELTA, PrivacyAccountant("rdp"))
    for n in (3, 3, 2):
        assert led.max_steps(n) == n
        led.record(n)
        budget.spend(1.2, num_steps=n, delta_tail=d_tail, **EVENT)
    assert led.epsilon() == budget.epsilon_spent and led.budget.delta_tail_spent == budget.delta_tail_spent
    assert led.steps_spent == T == budget.steps


def test_given_budget_is_spent_through():
    budget = PrivacyBudget(1.0, DELTA, PrivacyAccountant("rdp"))
    led = PrivacyLedger(DELTA, 100, delta_tail=0.0, budget=budget, noise_multiplier=2.0, accountant="rdp")
    led.bind(sample_rate=0.05)  # 65 of the planned 100 releases fit in ε = 1
    done = 0
    with pytest.raises(BudgetExceededError, match="nothing was recorded"):  # the budget's own refusal
        while True:
            led.record()
            done += 1
    assert done == 65 == budget.steps == led.steps_spent and led.max_steps(1) == 0
    with pytest.raises(ValueError, match="delta"):
        PrivacyLedger(DELTA, 100, budget=budget, noise_multiplier=1.0)  # a budget at δ, checked at δ_acc = δ/2


def test_state_dict_round_trip():
    led = _ledger(target_epsilon=50.0)
    led.bind(**EVENT)
    led.spend(3)
    state = led.state_dict()
    assert set(state) == {"noise_multiplier", "event", "accountant", "budget"}
    state = json.loads(json.dumps(state))  # plain Python: JSON- and torch.save-able
    back = _ledger(target_epsilon=50.0)
    back.load_state_dict(state)
    assert back.bound and back.steps_spent == 3 and back.epsilon() == led.epsilon()
    assert back.limit == led.limit == T
    back.spend(T - 3)
    assert not back.can_spend()
    unbound = _ledger()
    fresh = _ledger()
    fresh.load_state_dict(unbound.state_dict())
    assert not fresh.bound and fresh.steps_spent == 0


_BAD = [
    (lambda st: st.pop("accountant"), "missing"),
    (lambda st: st.update(accountant=None), "reset the ε"),
    (lambda st: st.update(budget=None), "budget"),
    (lambda st: st.update(noise_multiplier=-1.0), "noise_multiplier"),
    (lambda st: st.update(noise_multiplier=2.0), "differs from the configured"),
    (lambda st: st.update(event="garbage"), "event"),
    (lambda st: st["event"].update(sampling="bogus"), "sampling"),
    (lambda st: st["budget"].update(epsilon=10.0), "epsilon"),
    (lambda st: st["budget"]["accountant"].update(history=["garbage"]), "history"),
    (lambda st: st["budget"]["accountant"]["history"][0].update(num_steps=T + 1), "more than the planned"),
    (None, "must be a dict"),  # not a state dict at all
]


@pytest.mark.parametrize("mutate,match", _BAD)
def test_corrupted_state_is_refused_and_the_ledger_unchanged(mutate, match):
    src = _ledger(target_epsilon=50.0)
    src.bind(**EVENT)
    src.spend(3)
    good = src.state_dict()
    target = _ledger(target_epsilon=50.0)
    target.bind(**EVENT)
    target.spend(2)
    before = (target.steps_spent, target.epsilon(), repr(target.state_dict()))
    bad = ["not", "a", "dict"] if mutate is None else copy.deepcopy(good)
    if mutate is not None:
        mutate(bad)
    with pytest.raises(ValueError, match=match):
        target.load_state_dict(bad)
    assert (target.steps_spent, target.epsilon(), repr(target.state_dict())) == before
    target.load_state_dict(good)
    assert target.steps_spent == 3
