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
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._validate import check_choice, check_delta, check_epsilon, check_int, check_positive, check_probability
from ._lazy import LazyModule

# dp-accounting costs about 1.2 s to import: it is imported on first use, so `import fastdpot` stays light
dp_accounting = LazyModule("dp_accounting")
dp_pld = LazyModule("dp_accounting.pld")
dp_rdp = LazyModule("dp_accounting.rdp")
_calibration = LazyModule("dp_accounting.mechanism_calibration")
_rdp_accountant = LazyModule("dp_accounting.rdp.rdp_privacy_accountant")

__all__ = ["PrivacyAccountant", "calibrate_noise_multiplier", "DEFAULT_ORDERS", "SAMPLINGS", "ACCOUNTANTS",
           "PLD_MIN_NOISE_MULTIPLIER", "PLD_MAX_STEPS"]

SAMPLINGS = ("poisson", "without_replacement")
ACCOUNTANTS = ("pld", "rdp")
ADD_REMOVE, REPLACE_ONE = "add_or_remove_one", "replace_one"
_RELATION_NAMES = (ADD_REMOVE, REPLACE_ONE)

#: Smallest noise multiplier the PLD method accounts (below it one PLD evaluation takes seconds to minutes: the
#: privacy loss of one release spans about 1/(2z²) nats, discretised at ``value_discretization_interval``).
PLD_MIN_NOISE_MULTIPLIER = 0.1
#: Most releases the PLD method accounts in one accountant (beyond, its pessimistic discretisation error, which
#: grows with the number of compositions, exceeds the RDP bound: z = 47, q = 0.01, T = 10^7 gives PLD ε = 5.9
#: against RDP 3.0; and one evaluation takes seconds).
PLD_MAX_STEPS = 10 ** 6


def _relation(name: str):
    """dp-accounting's NeighboringRelation of ``name``."""
    rel = dp_accounting.NeighboringRelation
    return {ADD_REMOVE: rel.ADD_OR_REMOVE_ONE, REPLACE_ONE: rel.REPLACE_ONE}[name]

# dp-accounting's default orders, extended below 1.1 and up to 4096 (cf. TF-privacy / DP-Sinkhorn: 1.25..4096).
# (a module attribute computed on first access, see __getattr__ below: it needs dp-accounting's list)
@lru_cache(maxsize=None)
def _default_orders() -> Tuple[float, ...]:
    return tuple([1.01, 1.02, 1.05] + list(_rdp_accountant.DEFAULT_RDP_ORDERS) + [2048, 4096])


def __getattr__(name):  # PEP 562: DEFAULT_ORDERS without importing dp-accounting at import time
    if name == "DEFAULT_ORDERS":
        return _default_orders()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class _Event:
    noise_multiplier: float
    sample_rate: float
    sampling: str
    dataset_size: Optional[int]
    batch_size: Optional[int]

    @property
    def subsampled(self) -> bool:
        return self.sample_rate < 1.0

    def dp_event(self) -> dp_accounting.DpEvent:
        gauss = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if not self.subsampled:
            return gauss
        if self.sampling == "poisson":
            return dp_accounting.PoissonSampledDpEvent(self.sample_rate, gauss)
        return dp_accounting.SampledWithoutReplacementDpEvent(self.dataset_size, self.batch_size, gauss)


def _make_event(noise_multiplier, sample_rate, sampling, dataset_size, batch_size) -> _Event:
    z = check_positive(noise_multiplier, "noise_multiplier")
    check_choice(sampling, "sampling", SAMPLINGS)
    if sampling == "poisson":
        q = check_probability(sample_rate, "sample_rate")
        if dataset_size is not None:
            check_int(dataset_size, "dataset_size", 1)
        if batch_size is not None:
            raise ValueError(f"batch_size must be None for sampling='poisson' (the batch size is random), "
                             f"got {batch_size!r}")
        return _Event(z, q, "poisson", None if dataset_size is None else int(dataset_size), None)
    if dataset_size is None or batch_size is None:
        raise ValueError("sampling='without_replacement' needs dataset_size and batch_size, got "
                         f"dataset_size={dataset_size!r}, batch_size={batch_size!r}")
    n = check_int(dataset_size, "dataset_size", 1)
    b = check_int(batch_size, "batch_size", 1)
    if b > n:
        raise ValueError(f"batch_size must be <= dataset_size = {n}, got {b}")
    q = check_probability(sample_rate, "sample_rate")
    if q != 1.0 and not math.isclose(q, b / n, rel_tol=1e-9):
        raise ValueError(f"sample_rate must equal batch_size/dataset_size = {b / n!r} for "
                         f"sampling='without_replacement' (or be left at 1.0), got {sample_rate!r}")
    return _Event(z, b / n, "without_replacement", n, b)


@lru_cache(maxsize=256)
def _event_rdp(event: _Event, relation: str, orders: Tuple[float, ...]) -> np.ndarray:
    """RDP vector (over ``orders``) of ONE release of ``event``, computed by dp-accounting and cached.

    RDP composes additively, so the accountant keeps ``Σ count·rdp(event)``: a step costs a vector addition instead
    of re-running dp-accounting's (for sampling without replacement, ~0.2 s) per-order computation.
    """
    acc = dp_rdp.RdpAccountant(orders=list(orders), neighboring_relation=_relation(relation))
    acc.compose(event.dp_event(), 1)
    vec = getattr(acc, "_rdp", None)  # dp-accounting keeps the composed RDP vector here (checked by the tests)
    if vec is None or len(vec) != len(orders):
        raise RuntimeError("dp_accounting.rdp.RdpAccountant no longer exposes its RDP vector; "
                           "fastdpot.privacy needs updating for this dp-accounting version")
    out = np.array(vec, dtype=np.float64)
    out.setflags(write=False)
    return out


def _relation_of(event: _Event) -> Optional[str]:
    """Neighbouring relation an event forces (None: a full-batch Gaussian fits either)."""
    if not event.subsampled:
        return None
    return ADD_REMOVE if event.sampling == "poisson" else REPLACE_ONE


class PrivacyAccountant:
    """Accountant for compositions of (subsampled) Gaussian releases (Opacus-style interface).

    Args:
        accountant: ``"pld"`` (default; privacy-loss distributions, the tightest numerical bound, used for the
            reported ε whenever every event supports it and the history is within PLD's range,
            :meth:`pld_in_range`: z >= :data:`PLD_MIN_NOISE_MULTIPLIER`, at most :data:`PLD_MAX_STEPS` releases;
            RDP otherwise, so every evaluation is bounded) or ``"rdp"`` (Rényi DP). RDP is always available alongside
            via ``get_epsilon(delta, accountant="rdp")``.
        orders: RDP orders (default :data:`DEFAULT_ORDERS`).
        value_discretization_interval: PLD discretisation of the privacy loss (dp-accounting's pessimistic
            discretisation gives a valid upper bound for any interval; 1e-3 costs about 0.002 in ε against 1e-4 and
            is about 10x faster).
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
        self.value_discretization_interval = check_positive(value_discretization_interval,
                                                            "value_discretization_interval")
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
        :data:`PLD_MIN_NOISE_MULTIPLIER` and at most :data:`PLD_MAX_STEPS` releases (one evaluation then takes
        well under a second; outside, :meth:`get_epsilon` reports RDP, also a valid bound)."""
        return self.steps <= PLD_MAX_STEPS and all(e.noise_multiplier >= PLD_MIN_NOISE_MULTIPLIER
                                                   for e, _ in self._history)

    def epsilon_method(self, accountant: Optional[str] = None) -> str:
        """The method :meth:`get_epsilon` uses: the requested one, or RDP when PLD does not support an event or
        the history lies outside PLD's range (:meth:`pld_in_range`).

        Raises:
            ValueError: ``accountant="pld"`` with a without-replacement event, or outside PLD's range.
        """
        if accountant is None:
            use_pld = self.accountant == "pld" and self.pld_supported() and self.pld_in_range()
            return "pld" if use_pld else "rdp"
        check_choice(accountant, "accountant", ACCOUNTANTS)
        if accountant == "pld" and not self.pld_supported():
            raise ValueError("accountant='pld' does not support sampling='without_replacement' events "
                             "(dp-accounting has no PLD for them); use accountant='rdp'")
        if accountant == "pld" and not self.pld_in_range():
            raise ValueError(f"accountant='pld' accounts at most PLD_MAX_STEPS = {PLD_MAX_STEPS} releases with noise "
                             f"multipliers >= PLD_MIN_NOISE_MULTIPLIER = {PLD_MIN_NOISE_MULTIPLIER} (beyond, one "
                             f"evaluation takes minutes and its discretisation error exceeds the RDP bound); this "
                             f"history has {self.steps} releases and smallest z = "
                             f"{min(e.noise_multiplier for e, _ in self._history):.4g}: use accountant='rdp'")
        return accountant

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

        Raises:
            ValueError: δ outside (0, 1); ``accountant="pld"`` with a without-replacement event.
        """
        delta = check_delta(delta)
        method = self.epsilon_method(accountant)
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

        Raises:
            ValueError: not a dict, a key missing, a setting or a history entry invalid (the message names it), a
                history that does not extend this accountant's.
        """
        fresh = self._from_state(state)
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
                              "history"), "PrivacyAccountant")
        if not isinstance(state["orders"], (list, tuple)):
            raise ValueError(f"state['orders'] must be a list of RDP orders, got {state['orders']!r}")
        if not isinstance(state["history"], (list, tuple)):
            raise ValueError(f"state['history'] must be a list of events, got {type(state['history']).__name__}")
        fresh = PrivacyAccountant(state["accountant"], state["orders"], state["value_discretization_interval"],
                                  state["neighboring_relation"])
        for i, h in enumerate(state["history"]):
            if not isinstance(h, dict):
                raise ValueError(f"state['history'][{i}] must be a dict, got {type(h).__name__}")
            n = state_int(h.get("num_steps"), f"history[{i}].num_steps", 1)
            fresh._record(_make_event(h.get("noise_multiplier"), h.get("sample_rate"), h.get("sampling"),
                                      h.get("dataset_size"), h.get("batch_size")), n)
        return fresh

    def __repr__(self):
        return (f"PrivacyAccountant(accountant={self.accountant!r}, steps={self.steps}, "
                f"relation={self._relation!r}, events={len(self._history)})")


def calibrate_noise_multiplier(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                               sampling: str = "poisson", accountant: Optional[str] = None,
                               dataset_size: Optional[int] = None, batch_size: Optional[int] = None,
                               tol: float = 1e-3, value_discretization_interval: float = 1e-3) -> float:
    """Smallest noise multiplier z (within ``tol``) such that ``steps`` releases stay within (ε, δ).

    The returned z always satisfies the target: ``get_epsilon(delta) <= target_epsilon`` for an accountant that
    records ``step(z, sample_rate, steps, sampling, ...)`` with the same ``accountant`` method (and, for PLD, the
    same ``value_discretization_interval``). The search is dp-accounting's ``calibrate_dp_mechanism`` (Brent's
    method on z); for PLD the bracket is first narrowed with the faster RDP calibration (RDP needs at least as much
    noise as PLD).

    Args:
        target_epsilon: ε > 0.
        delta: δ in (0, 1).
        sample_rate: q in (0, 1] (for ``"without_replacement"``, ignored in favour of ``batch_size/dataset_size``
            when left at 1.0).
        steps: number of releases T ≥ 1.
        sampling: ``"poisson"`` or ``"without_replacement"`` (the latter only with ``accountant="rdp"``).
        accountant: ``"pld"``, ``"rdp"`` or ``None`` (what a default :class:`PrivacyAccountant` reports: PLD for
            Poisson / full-batch events, RDP for sampling without replacement).
        tol: absolute tolerance on z.

    PLD is searched only within its range (:meth:`PrivacyAccountant.pld_in_range`): a target whose RDP-calibrated
    z is below :data:`PLD_MIN_NOISE_MULTIPLIER` (0.1; ε of several hundred and more for typical q and T), or more
    than :data:`PLD_MAX_STEPS` steps, is refused at once with ``accountant="pld"``; with ``accountant=None`` the RDP
    calibration is returned there (what a default accountant reports outside PLD's range). ``accountant="rdp"``
    serves any target in seconds.

    Raises:
        ValueError: any invalid argument; ``accountant="pld"`` with ``sampling="without_replacement"``; a PLD target
            that needs z < :data:`PLD_MIN_NOISE_MULTIPLIER` or more than :data:`PLD_MAX_STEPS` steps; an unreachable
            target, each named with the reason: no
            z <= 1e6 reaching it, a target already met at z = 0.01 (the search's lower end: no privacy to speak of),
            or a PLD target below what ``value_discretization_interval`` resolves.
    """
    eps = check_epsilon(target_epsilon, "target_epsilon")
    delta = check_delta(delta)
    steps = check_int(steps, "steps", 1)
    if accountant is not None:
        check_choice(accountant, "accountant", ACCOUNTANTS)
    accountant_arg = accountant
    tol = check_positive(tol, "tol")
    vdi = check_positive(value_discretization_interval, "value_discretization_interval")
    # validate the event with a placeholder z
    proto = _make_event(1.0, sample_rate, sampling, dataset_size, batch_size)
    rel = _relation(_relation_of(proto) or ADD_REMOVE)
    wor = proto.subsampled and proto.sampling == "without_replacement"
    if accountant is None:
        accountant = "rdp" if wor or steps > PLD_MAX_STEPS else "pld"
    if accountant == "pld" and wor:
        raise ValueError("accountant='pld' does not support sampling='without_replacement'; use accountant='rdp'")
    if accountant == "pld" and steps > PLD_MAX_STEPS:
        raise ValueError(f"accountant='pld' accounts at most PLD_MAX_STEPS = {PLD_MAX_STEPS} steps, got steps={steps}; "
                         f"use accountant='rdp' (or None)")

    def event_of(z):
        e = _Event(float(z), proto.sample_rate, proto.sampling, proto.dataset_size, proto.batch_size)
        return dp_accounting.SelfComposedDpEvent(e.dp_event(), steps)

    def fresh_rdp():
        return dp_rdp.RdpAccountant(orders=list(_default_orders()), neighboring_relation=rel)

    def fresh_pld():
        return dp_pld.PLDAccountant(neighboring_relation=rel, value_discretization_interval=vdi)

    def eps_of(fresh, z):
        acc = fresh()
        acc.compose(event_of(z))
        return acc.get_epsilon(delta)

    # bracket for RDP: grow the upper end until it satisfies the target
    lo, hi = 1e-2, 1.0
    eps_lo = eps_of(fresh_rdp, lo)
    if eps_lo <= eps:
        raise ValueError(f"target_epsilon={target_epsilon!r} is unreachable by the calibration: even the smallest "
                         f"noise multiplier it searches, z = {lo}, spends only ε = {eps_lo:.4g} <= target over "
                         f"{steps} steps at delta={delta!r}, so the target buys essentially no privacy; use a "
                         f"smaller target_epsilon or pass a noise multiplier directly")
    while eps_of(fresh_rdp, hi) > eps:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            raise ValueError(f"target_epsilon={target_epsilon!r} is unreachable: no noise multiplier <= 1e6 "
                             f"reaches it at delta={delta!r} over {steps} steps (ε grows without bound as the "
                             f"target shrinks); use a larger target_epsilon")
    z = _calibration.calibrate_dp_mechanism(fresh_rdp, event_of, eps, delta,
                                            bracket_interval=_calibration.ExplicitBracketInterval(lo, hi), tol=tol / 4)
    if eps_of(fresh_rdp, z) > eps:  # Brent returns a value within tol; make it feasible
        z += tol / 4
    if accountant == "rdp":
        return float(z)
    z_rdp = float(z)
    if z_rdp < PLD_MIN_NOISE_MULTIPLIER and accountant_arg is None:
        return z_rdp  # a default accountant reports RDP for such an event (outside PLD's range)
    if z_rdp < PLD_MIN_NOISE_MULTIPLIER:
        raise ValueError(
            f"target_epsilon={target_epsilon!r} needs a noise multiplier below {PLD_MIN_NOISE_MULTIPLIER} (RDP gives "
            f"z = {z_rdp:.4g}), where a PLD evaluation costs minutes; calibrate with accountant='rdp' (and account "
            f"with PrivacyAccountant('rdp')) for such large targets")
    eps_pld_hi = eps_of(fresh_pld, z_rdp)
    if eps_pld_hi > eps:  # RDP's z is feasible for exact PLD; only the PLD discretisation can exceed the target
        raise ValueError(
            f"target_epsilon={target_epsilon!r} is unreachable with accountant='pld' and "
            f"value_discretization_interval={vdi!r}: even at the RDP-calibrated z = {z_rdp:.4g} the discretised PLD "
            f"reports ε = {eps_pld_hi:.4g} (a target near or below the discretisation interval cannot be resolved); "
            f"pass a smaller value_discretization_interval or accountant='rdp'")
    lo = 0.8 * z_rdp
    while eps_of(fresh_pld, lo) <= eps:
        lo *= 0.8
        if lo < 1e-3:
            raise ValueError(f"could not bracket the PLD noise multiplier for target_epsilon={target_epsilon!r}")
    zp = _calibration.calibrate_dp_mechanism(fresh_pld, event_of, eps, delta,
                                             bracket_interval=_calibration.ExplicitBracketInterval(lo, z_rdp), tol=tol / 2)
    if eps_of(fresh_pld, zp) > eps:
        zp = min(zp + tol / 2, z_rdp)
    return float(zp)
