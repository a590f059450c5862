"""Checkpoints of a :class:`~fastdpot.privacy.ledger.PrivacyLedger`: the checks a saved state must pass before a ledger
loads it (:meth:`PrivacyLedger.load_state_dict <fastdpot.privacy.ledger.PrivacyLedger.load_state_dict>` lists them),
apart from the counting of releases in :mod:`fastdpot.privacy.ledger`.

:func:`checked_state` validates a whole state against a ledger's settings and returns what the ledger then assigns;
it assigns nothing itself (the ledger's own pending releases are recorded first, as for any read of its accounting).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .accounting import PrivacyAccountant, _make_event
from .budget import PrivacyBudget
from .calibration import calibration_tolerance

__all__ = ["checked_state"]

_EVENT_KEYS = ("sample_rate", "sampling", "dataset_size", "batch_size")
_CALIBRATION_TOL = 1e-3  # calibrate_noise_multiplier's default tolerance on z, the one the ledger's bind() uses


def _event_args(event: Dict[str, Any]):
    """``(sample_rate, sampling, dataset_size, batch_size)`` of an event dict (absent keys: their defaults)."""
    return (event.get("sample_rate", 1.0), event.get("sampling", "poisson"), event.get("dataset_size"),
            event.get("batch_size"))


def checked_state(ledger, state: Dict[str, Any]) -> Tuple[Optional[float], Optional[Dict[str, Any]],
                                                           Optional[PrivacyAccountant], Optional[PrivacyBudget]]:
    """``(z, event, accountant, budget)`` of a :meth:`PrivacyLedger.state_dict` that ``ledger`` may load: the whole
    state checked against the ledger's settings and history (the conditions and errors of
    :meth:`PrivacyLedger.load_state_dict`), new accountant and budget objects built from it.

    Raises:
        ValueError: as :meth:`PrivacyLedger.load_state_dict`.
    """
    from .._checkpoint import require_state, state_float

    require_state(state, ("noise_multiplier", "event", "accountant", "budget"), "PrivacyLedger", exact=True)
    z = state["noise_multiplier"]
    if z is not None:
        z = state_float(z, "noise_multiplier", positive=True)
    if ledger._configured_z is not None and z != ledger._configured_z:
        raise ValueError(f"state['noise_multiplier']={z!r} differs from the configured noise multiplier "
                         f"{ledger._configured_z!r}")
    event = state["event"]
    if event is not None:
        if not isinstance(event, dict) or not set(event) <= set(_EVENT_KEYS):
            raise ValueError(f"state['event'] must be None or a dict with keys among {list(_EVENT_KEYS)}, got "
                             f"{event!r}")
        event = dict(event)
        _make_event(1.0, *_event_args(event))  # validates the event
    if event is not None and z is None:
        raise ValueError("state['noise_multiplier'] is None but the accounting was bound: the calibrated noise "
                         "multiplier is missing")
    acc = budget = None
    if event is None:
        for key in ("accountant", "budget"):
            held = state[key] if key == "accountant" else (state[key] or {}).get("accountant")
            if isinstance(held, dict) and held.get("history"):
                raise ValueError(f"state['event'] is None (unbound) but state[{key!r}] holds releases")
    else:
        if state["accountant"] is None:
            raise ValueError("state['accountant'] is None but the accounting was bound: loading it would reset "
                             "the ε spent")
        acc = PrivacyAccountant.from_state_dict(state["accountant"])
        if ledger.target_epsilon is not None:
            if state["budget"] is None:
                raise ValueError("state['budget'] is None with a target_epsilon: loading it would reset the ε "
                                 "spent")
            budget = PrivacyBudget(ledger.target_epsilon, ledger._budget_delta(), accountant=acc)
            budget.load_state_dict(state["budget"])  # refuses another (ε, δ); acc takes the budget's history
        if acc.steps > ledger.steps:
            raise ValueError(f"state's accountant holds {acc.steps} release(s), more than the planned "
                             f"T = {ledger.steps}")
        _check_mechanism(ledger, z, event, acc)
    if ledger._accountant is not None and ledger._spent:  # a live ledger never moves backwards
        ledger.flush()
        if acc is None:
            raise ValueError(f"the state holds no releases but this ledger has counted {ledger._spent}: a live "
                             f"ledger never moves backwards")
        ledger._accountant.check_extended_by(acc, "state['accountant']['history']")
    return z, event, acc, budget


def _check_mechanism(ledger, z: float, event: Dict[str, Any], acc: PrivacyAccountant) -> None:
    """The loaded accounting must describe the ledger's mechanism (see :meth:`PrivacyLedger.load_state_dict`)."""
    if acc.accountant != ledger.accountant_kind:
        raise ValueError(f"state['accountant']['accountant']={acc.accountant!r} differs from this ledger's "
                         f"accountant kind {ledger.accountant_kind!r}")
    if ledger._given_budget is None:  # a ledger of its own: every release is one of its events
        expected = _make_event(z, *_event_args(event))
        for i, (e, n) in enumerate(acc._history):
            if e != expected:
                diff = {k: (v, getattr(e, k)) for k, v in vars(expected).items() if getattr(e, k) != v}
                raise ValueError(f"state['accountant']['history'][{i}] is not this ledger's mechanism "
                                 f"(field: (expected, state) {diff}): an inconsistent checkpoint")
    if ledger._configured_z is None:
        _check_calibrated(ledger, z, event)


def _check_calibrated(ledger, z: float, event: Dict[str, Any]) -> None:
    """z must be what :meth:`PrivacyLedger.bind` calibrates for the target ε: T releases meet it at z, not at
    z − 2·tol (tol = :func:`~fastdpot.privacy.calibration.calibration_tolerance` (z), 0.001 up to z = 100)."""
    def eps(zz):
        a = PrivacyAccountant(accountant=ledger.accountant_kind)
        a.step(zz, num_steps=ledger.steps, **event)
        return a.get_epsilon(ledger.delta_accountant, accountant=ledger.accountant_kind)

    if eps(z) > ledger.target_epsilon:
        raise ValueError(f"state['noise_multiplier']={z!r} does not meet target_epsilon={ledger.target_epsilon!r} "
                         f"over T = {ledger.steps} releases: not the calibrated noise multiplier")
    lower = z - 2 * calibration_tolerance(z, _CALIBRATION_TOL)
    if lower > 0 and eps(lower) <= ledger.target_epsilon:
        raise ValueError(f"state['noise_multiplier']={z!r} is above the calibrated noise multiplier for "
                         f"target_epsilon={ledger.target_epsilon!r} (z = {lower!r} already meets it): an "
                         f"inconsistent checkpoint")
