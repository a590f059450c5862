"""Privacy accounting of (subsampled) Gaussian releases, delegated to Google's dp-accounting.

Events (one ``step`` call = ``num_steps`` identical releases):

* ``sampling="poisson"``: each row enters the batch independently with probability q (:class:`PoissonSampler`);
  add/remove-one neighbours; the noise multiplier is z = σ/Δ with Δ the add/remove sensitivity. PLD
  (``dp_accounting.pld``) and RDP (``dp_accounting.rdp``) both support it. ``sample_rate=1.0`` is the plain
  Gaussian mechanism.
* ``sampling="without_replacement"``: a fresh uniformly random batch of exactly B of n rows
  (:class:`FixedSizeSampler`); substitution (replace-one) neighbours; z = σ/Δ with Δ the replace-one sensitivity
  (``2·radius·sqrt(w)`` for per-row projection releases). Only RDP supports it (Wang, Balle & Kasiviswanathan,
  AISTATS 2019, as implemented by dp-accounting).

The two relations differ, so one accountant holds events of one relation only (fixed by its first event).
Different z and q across steps compose (heterogeneous composition).
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._validate import check_choice, check_delta, check_int, check_positive
from .calibration import calibrate_noise_multiplier
# the events live in .events, the calibration in .calibration; their names stay importable from here
from .events import (ACCOUNTANTS, ADD_REMOVE, PLD_MAX_EPSILON, PLD_MAX_STEPS, PLD_MIN_DISCRETIZATION,  # noqa: F401
                     PLD_MIN_NOISE_MULTIPLIER, SAMPLINGS, _default_orders, _Event, _event_rdp, _make_event,
                     _rdp_accountant, _relation, _relation_of, _RELATION_NAMES, check_discretization, dp_pld, pld_min_noise_multiplier,
                     quiet_dp_accounting)

__all__ = ["PrivacyAccountant", "calibrate_noise_multiplier", "DEFAULT_ORDERS", "SAMPLINGS", "ACCOUNTANTS",
           "PLD_MIN_NOISE_MULTIPLIER", "PLD_MAX_STEPS", "PLD_MIN_DISCRETIZATION", "PLD_MAX_EPSILON"]


def __getattr__(name):  # PEP 562: DEFAULT_ORDERS without importing dp-accounting at import time
    if name == "DEFAULT_ORDERS":
        return _default_orders()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_HISTORY_KEYS = ("noise_multiplier", "sample_rate", "sampling", "dataset_size", "batch_size", "num_steps")


class PrivacyAccountant:
    """Accountant for compositions of (subsampled) Gaussian releases (Opacus-style interface).

    Args:
        accountant: ``"pld"`` (default; privacy-loss distributions, the tightest numerical bound, used for the
            reported ε whenever every event supports it and the history is within PLD's range,
            :meth:`pld_in_range`: z >= :data:`PLD_MIN_NOISE_MULTIPLIER` (more at intervals below 1e-3), at most
            :data:`PLD_MAX_STEPS` releases; RDP otherwise, so every evaluation is bounded) or ``"rdp"`` (Rényi DP).
            RDP is always available alongside via ``get_epsilon(delta, accountant="rdp")``.
        orders: RDP orders (default :data:`DEFAULT_ORDERS`).
        value_discretization_interval: PLD discretisation of the privacy loss, >= :data:`PLD_MIN_DISCRETIZATION`
            (1e-4: finer, one evaluation takes tens of seconds; dp-accounting's pessimistic discretisation gives a
            valid upper bound for any interval; 1e-3 costs about 0.002 in ε against 1e-4 and is about 10x faster).
        neighboring_relation: ``None`` (fixed by the first subsampled event), ``"add_or_remove_one"`` or
            ``"replace_one"``.

    Attributes (read-only):
        steps: total number of releases composed so far.
        history: list of ``(event dict, num_steps)`` in order (consecutive identical events are merged).
        A live accountant changes only by :meth:`step` and by loading a state that extends its history.

    Example::

        acc = PrivacyAccountant()
        acc.step(noise_multiplier=1.0, sample_rate=250 / 29999, num_steps=4199)
        acc.get_epsilon(1e-5)                      # PLD: 3.11
        acc.get_epsilon(1e-5, accountant="rdp")    # RDP: 3.41

    References:
        dp-accounting (github.com/google/differential-privacy/python/dp_accounting); Mironov, Talwar & Zhang,
        "Rényi differential privacy of the sampled Gaussian mechanism", 2019; Koskela et al. / Doroshenko et al.,
        "Connect the dots: tighter discrete approximations of privacy loss distributions", PETS 2022; Wang, Balle &
        Kasiviswanathan, "Subsampled Rényi differential privacy and analytical moments accountant", AISTATS 2019.
    """

    def __init__(self, accountant: str = "pld", orders: Optional[Sequence[float]] = None,
                 value_discretization_interval: float = 1e-3, neighboring_relation: Optional[str] = None):
        self.accountant = check_choice(accountant, "accountant", ACCOUNTANTS)
        if orders is None:
            orders = _default_orders()
        orders = [float(check_positive(a, "orders[i]")) for a in orders]
        if not orders or min(orders) <= 1.0:
            raise ValueError(f"orders must be a non-empty list of RDP orders > 1, got {orders!r}")
        self.orders = tuple(orders)
        self.value_discretization_interval = check_discretization(value_discretization_interval)
        if neighboring_relation is not None:
            check_choice(neighboring_relation, "neighboring_relation", _RELATION_NAMES)
        self._relation = neighboring_relation
        self._history: List[Tuple[_Event, int]] = []
        self._rdp: Optional[np.ndarray] = None  # Σ count·rdp(event), under self._rdp_relation
        self._rdp_built_relation = None
        self._cache: Dict[Tuple, float] = {}

    # ------------------------------------------------------------------ recording
    @property
    def neighboring_relation(self) -> Optional[str]:
        """The neighbouring relation of the recorded events (add/remove or replace-one), None before the first."""
        return self._relation

    @property
    def steps(self) -> int:
        """Total number of releases recorded (the sum of every event's ``num_steps``)."""
        return sum(n for _, n in self._history)

    @property
    def history(self) -> List[Tuple[dict, int]]:
        """The recorded events as (event settings dict, num_steps) pairs, oldest first (a copy)."""
        return [(asdict(e), n) for e, n in self._history]

    def _check_relation(self, event: _Event) -> Optional[str]:
        rel = _relation_of(event)
        if rel is not None and self._relation is not None and rel != self._relation:
            raise ValueError(
                f"sampling={event.sampling!r} implies {rel!r} neighbours but this accountant already uses "
                f"{self._relation!r}; account releases under different neighbouring relations separately")
        return rel or self._relation

    def step(self, noise_multiplier: float, sample_rate: float = 1.0, num_steps: int = 1,
             sampling: str = "poisson", dataset_size: Optional[int] = None,
             batch_size: Optional[int] = None) -> None:
        """Record ``num_steps`` releases of a Gaussian mechanism with noise multiplier z = σ/Δ.

        Args:
            noise_multiplier: z > 0, noise standard deviation divided by the sensitivity under this event's
                neighbouring relation.
            sample_rate: q in (0, 1]; 1.0 = the whole data set (plain Gaussian mechanism).
            num_steps: number of identical releases ≥ 1.
            sampling: ``"poisson"`` (:class:`PoissonSampler`) or ``"without_replacement"``
                (:class:`FixedSizeSampler`; needs ``dataset_size`` and ``batch_size``, q = B/n).

        Raises:
            ValueError: any invalid argument, or a relation that conflicts with earlier events.
        """
        event = _make_event(noise_multiplier, sample_rate, sampling, dataset_size, batch_size)
        count = check_int(num_steps, "num_steps", 1)
        self._record(event, count)

    def _record(self, event: _Event, count: int) -> None:
        self._relation = self._check_relation(event)
        if self._history and self._history[-1][0] == event:
            self._history[-1] = (event, self._history[-1][1] + count)
        else:
            self._history.append((event, count))
        self._cache.clear()
        if self._rdp is not None and self._rdp_relation_name() == self._rdp_built_relation:
            self._rdp = self._rdp + count * _event_rdp(event, self._rdp_built_relation, self.orders)
        else:
            self._rdp = None  # rebuilt lazily (relation changed from the default)

    # ------------------------------------------------------------------ epsilon
    def _rdp_relation_name(self) -> str:
        return self._relation or ADD_REMOVE

    def _rdp_relation(self):
        return _relation(self._rdp_relation_name())

    def _rdp_vector(self, history=None) -> np.ndarray:
        rel = self._rdp_relation_name()
        if history is not None:
            return sum((n * _event_rdp(e, rel, self.orders) for e, n in history), np.zeros(len(self.orders)))
        if self._rdp is None or self._rdp_built_relation != rel:
            self._rdp = self._rdp_vector(self._history)
            self._rdp_built_relation = rel
        return self._rdp

    def pld_supported(self) -> bool:
        """Whether every recorded event has a PLD (Poisson-subsampled or full-batch Gaussian)."""
        return all(not e.subsampled or e.sampling == "poisson" for e, _ in self._history)

    def pld_in_range(self) -> bool:
        """Whether the PLD method accounts this history in bounded time: every noise multiplier >=
        :data:`PLD_MIN_NOISE_MULTIPLIER` (``0.1·sqrt(1e-3/interval)`` at discretisation intervals below 1e-3:
        :func:`~fastdpot.privacy.events.pld_min_noise_multiplier`) and at most :data:`PLD_MAX_STEPS` releases (one
        evaluation then takes at most about a second; outside, :meth:`get_epsilon` reports RDP, also a valid
        bound)."""
        z_min = pld_min_noise_multiplier(self.value_discretization_interval)
        return self.steps <= PLD_MAX_STEPS and all(e.noise_multiplier >= z_min for e, _ in self._history)

    def epsilon_method(self, accountant: Optional[str] = None, delta: Optional[float] = None) -> str:
        """The method :meth:`get_epsilon` uses: the requested one, or RDP when PLD does not support an event, the
        history lies outside PLD's range (:meth:`pld_in_range`) or, given ``delta``, the RDP ε there exceeds
        :data:`PLD_MAX_EPSILON` (100: a PLD evaluation would take seconds to minutes for no useful gain).

        Raises:
            ValueError: ``accountant="pld"`` with a without-replacement event, outside PLD's range, or (given
                ``delta``) above :data:`PLD_MAX_EPSILON`.
        """
        if accountant is None:
            use_pld = self.accountant == "pld" and self.pld_supported() and self.pld_in_range()
            return "pld" if use_pld and not self._beyond_pld_epsilon(delta) else "rdp"
        check_choice(accountant, "accountant", ACCOUNTANTS)
        if accountant == "pld" and not self.pld_supported():
            raise ValueError("accountant='pld' does not support sampling='without_replacement' events "
                             "(dp-accounting has no PLD for them); use accountant='rdp'")
        if accountant == "pld" and not self.pld_in_range():
            z_min = pld_min_noise_multiplier(self.value_discretization_interval)
            raise ValueError(f"accountant='pld' accounts at most PLD_MAX_STEPS = {PLD_MAX_STEPS} releases with noise "
                             f"multipliers >= PLD_MIN_NOISE_MULTIPLIER = {PLD_MIN_NOISE_MULTIPLIER} ({z_min:.3g} at "
                             f"value_discretization_interval={self.value_discretization_interval!r}; beyond, one "
                             f"evaluation takes minutes and its discretisation error exceeds the RDP bound); this "
                             f"history has {self.steps} releases and smallest z = "
                             f"{min(e.noise_multiplier for e, _ in self._history):.4g}: use accountant='rdp'")
        if accountant == "pld" and self._beyond_pld_epsilon(delta):
            raise ValueError(f"accountant='pld' computes ε up to PLD_MAX_EPSILON = {PLD_MAX_EPSILON:g} (beyond, one "
                             f"evaluation takes seconds to minutes); this history's RDP ε at delta={delta!r} is "
                             f"{self._compute('rdp', delta, self._history):.4g}: use accountant='rdp'")
        return accountant

    def _beyond_pld_epsilon(self, delta: Optional[float]) -> bool:
        """Whether the RDP ε at ``delta`` (None: not asked) exceeds :data:`PLD_MAX_EPSILON` (an incremental RDP
        evaluation: milliseconds)."""
        return delta is not None and bool(self._history) and self._compute("rdp", delta, self._history) > PLD_MAX_EPSILON

    def get_epsilon(self, delta: float, accountant: Optional[str] = None) -> float:
        """ε of everything recorded so far, at ``delta``.

        Args:
            delta: δ in (0, 1).
            accountant: ``None`` (this accountant's method, falling back to RDP for events PLD cannot account),
                ``"pld"`` or ``"rdp"``.

        Returns:
            ε ≥ 0 (0 when nothing was recorded). With ``accountant=None`` and the PLD method, a δ so small that the
            discretised PLD gives ε = inf (δ below the mass it puts at infinity, e.g. δ = 1e-300) falls back to the
            RDP ε, which is finite and also a valid bound; ``accountant="pld"`` returns PLD's inf as it is.

        The default method reports RDP where PLD would not answer in bounded time (:meth:`epsilon_method`: outside
        PLD's range, or an RDP ε above :data:`PLD_MAX_EPSILON`); every call takes at most about a second.

        Raises:
            ValueError: δ outside (0, 1); ``accountant="pld"`` with a without-replacement event, outside PLD's
                range or above :data:`PLD_MAX_EPSILON`.
        """
        delta = check_delta(delta)
        method = self.epsilon_method(accountant, delta)
        if not self._history:
            return 0.0
        key = (method, delta, accountant is None)
        if key not in self._cache:
            value = self._compute(method, delta, self._history)
            if accountant is None and method == "pld" and math.isinf(value):
                value = self._compute("rdp", delta, self._history)  # both are upper bounds: keep the finite one
            self._cache[key] = value
        return self._cache[key]

    def get_epsilon_and_order(self, delta: float) -> Tuple[float, float]:
        """RDP ε at ``delta`` and the RDP order α that attains it."""
        delta = check_delta(delta)
        if not self._history:
            return 0.0, float("nan")
        eps, order = _rdp_accountant.compute_epsilon(list(self.orders), self._rdp_vector(), delta)
        return float(eps), float(order)

    def _compute(self, method: str, delta: float, history) -> float:
        if method == "rdp":
            vec = self._rdp_vector() if history is self._history else self._rdp_vector(history)
            return float(_rdp_accountant.compute_epsilon(list(self.orders), vec, delta)[0])
        acc = dp_pld.PLDAccountant(neighboring_relation=self._rdp_relation(),
                                   value_discretization_interval=self.value_discretization_interval)
        with quiet_dp_accounting():
            for e, n in history:
                acc.compose(e.dp_event(), n)
            return float(acc.get_epsilon(delta))

    def copy(self) -> "PrivacyAccountant":
        """An independent deep copy (settings and history): what-if accounting without touching this one."""
        return copy.deepcopy(self)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        """A plain-Python (JSON- and torch.save-able) snapshot: settings and the event history."""
        return {
            "accountant": self.accountant,
            "orders": list(self.orders),
            "value_discretization_interval": self.value_discretization_interval,
            "neighboring_relation": self._relation,
            "history": [dict(asdict(e), num_steps=n) for e, n in self._history],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` (replaces this accountant's settings and history).

        The whole state is checked on a fresh accountant first: on any error this accountant is unchanged. A live
        accountant never moves backwards: the state's history must extend the one recorded here (every event
        recorded so far, in order, with at least its count), so a state saved earlier, one with an edited event or
        an empty history is refused once releases were recorded. (:meth:`from_state_dict` builds a new accountant:
        it has no history to compare with, see docs/privacy.md, "Checkpoints: threat model".)

        The state must be of this accountant's kind (``"pld"`` or ``"rdp"``): a PLD state loaded into an RDP
        accountant would report the PLD ε. Its RDP orders and discretisation interval replace this accountant's.
        :meth:`from_state_dict` takes the state's kind too.

        Raises:
            ValueError: not a dict, a key missing or unknown, a setting or a history entry invalid (the message names
                it), a state of another accountant kind, a history that does not extend this accountant's.
        """
        fresh = self._from_state(state)
        if fresh.accountant != self.accountant:
            raise ValueError(f"state['accountant']={fresh.accountant!r} is the state of another kind of accountant "
                             f"than this {self.accountant!r} one (it would report the {fresh.accountant.upper()} ε); "
                             f"load it into PrivacyAccountant({fresh.accountant!r}), or with "
                             f"PrivacyAccountant.from_state_dict(state)")
        self.check_extended_by(fresh, "state['history']")
        self.__dict__.update(fresh.__dict__)

    def check_extended_by(self, other: "PrivacyAccountant", what: str = "the state's history") -> None:
        """Raise ValueError unless ``other``'s history starts with every release recorded here, in order (a
        live accountant never moves backwards).

        Raises:
            ValueError: ``other`` lacks a release recorded here, or records a different event in its place.
        """
        mine, theirs = self._history, other._history
        for i, (event, count) in enumerate(mine):
            last = i == len(mine) - 1
            ok = i < len(theirs) and theirs[i][0] == event and (theirs[i][1] >= count if last else
                                                                  theirs[i][1] == count)
            if not ok:
                got = f"{asdict(theirs[i][0])} x {theirs[i][1]}" if i < len(theirs) else "nothing"
                raise ValueError(
                    f"{what} is behind or different from the {self.steps} release(s) already recorded (event {i}: "
                    f"recorded {asdict(event)} x {count}, state has {got}); a live accountant never moves backwards "
                    f"(load an older or edited state into a new object only, see docs/privacy.md)")
        if self._relation is not None and other._relation not in (None, self._relation):
            raise ValueError(f"{what} uses {other._relation!r} neighbours, this accountant {self._relation!r}")

    @classmethod
    def from_state_dict(cls, state: dict) -> "PrivacyAccountant":
        """A new accountant restored from :meth:`state_dict` (same checks as :meth:`load_state_dict`)."""
        return cls._from_state(state)

    @staticmethod
    def _from_state(state) -> "PrivacyAccountant":
        from .._checkpoint import require_state, state_int

        require_state(state, ("accountant", "orders", "value_discretization_interval", "neighboring_relation",
                              "history"), "PrivacyAccountant", exact=True)
        if not isinstance(state["orders"], (list, tuple)):
            raise ValueError(f"state['orders'] must be a list of RDP orders, got {state['orders']!r}")
        if not isinstance(state["history"], (list, tuple)):
            raise ValueError(f"state['history'] must be a list of events, got {type(state['history']).__name__}")
        fresh = PrivacyAccountant(state["accountant"], state["orders"], state["value_discretization_interval"],
                                  state["neighboring_relation"])
        for i, h in enumerate(state["history"]):
            if not isinstance(h, dict):
                raise ValueError(f"state['history'][{i}] must be a dict, got {type(h).__name__}")
            unknown = sorted(str(k) for k in h if k not in _HISTORY_KEYS)
            if unknown:
                raise ValueError(f"state['history'][{i}] has unknown key(s) {unknown} (an event has "
                                 f"{list(_HISTORY_KEYS)})")
            n = state_int(h.get("num_steps"), f"history[{i}].num_steps", 1)
            fresh._record(_make_event(h.get("noise_multiplier"), h.get("sample_rate"), h.get("sampling"),
                                      h.get("dataset_size"), h.get("batch_size")), n)
        return fresh

    def __repr__(self):
        return (f"PrivacyAccountant(accountant={self.accountant!r}, steps={self.steps}, "
                f"relation={self._relation!r}, events={len(self._history)})")
