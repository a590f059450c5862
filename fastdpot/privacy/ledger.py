"""The privacy ledger of one run: noise calibration, δ split, budget and the count of every release.

A :class:`PrivacyLedger` is the single place where a private method (the flows, DPSWgen, DP-Sinkhorn) turns "one
more release" into accounting. It holds, for the whole run,

* the planned number of releases T and the δ split ``δ = δ_acc + T·δ_tail`` (``δ_tail`` per release: the
  probability over the random directions that a sliced release's sensitivity bound fails; 0 for deterministic
  sensitivities),
* the sampling event of every release (fixed once, at :meth:`PrivacyLedger.bind`) and the noise multiplier z = σ/Δ,
  given or calibrated at bind time for a target ε,
* the :class:`~fastdpot.privacy.PrivacyAccountant` and, with a target ε, the
  :class:`~fastdpot.privacy.PrivacyBudget` that refuses releases before they would exceed it.

The checks a checkpointed state must pass before a ledger loads it live in ``fastdpot/privacy/_ledger_state.py``.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .._validate import (check_bool, check_choice, check_delta, check_epsilon, check_int, check_nonnegative,
                         check_positive)
from ._ledger_state import checked_state
from .accounting import ACCOUNTANTS, PrivacyAccountant, _make_event, calibrate_noise_multiplier
from .budget import BudgetExceededError, PrivacyBudget
from .sensitivity import split_delta

__all__ = ["PrivacyLedger", "TAIL_CHARGES"]

#: How a ledger charges the sensitivity tails δ_tail to δ (see :class:`PrivacyLedger`).
TAIL_CHARGES = ("planned", "spent")

_CALIBRATED: Dict[Tuple, float] = {}  # the calibrations done in this process (at most _MAX_CALIBRATED, oldest out)
_MAX_CALIBRATED = 64


def _calibrate(epsilon: float, delta: float, steps: int, accountant: str, event: tuple, progress: bool = True,
               progress_delay: float = 1.0) -> float:
    """:func:`calibrate_noise_multiplier` (a deterministic function of its arguments) remembered, so that runs of
    the same settings (flow seeds, class flows of equal size, resumed runs) calibrate once."""
    key = (epsilon, delta, steps, accountant, event)
    if key not in _CALIBRATED:
        if len(_CALIBRATED) >= _MAX_CALIBRATED:
            _CALIBRATED.pop(next(iter(_CALIBRATED)))
        _CALIBRATED[key] = float(calibrate_noise_multiplier(epsilon, delta, steps=steps, accountant=accountant,
                                                            progress=progress, progress_delay=progress_delay,
                                                            **dict(event)))
    return _CALIBRATED[key]


class PrivacyLedger:
    """The privacy bookkeeping of one run of T identical (subsampled) Gaussian releases.

    Use: build it with the run's (ε, δ, T), :meth:`bind` the sampling event before the first release (this
    calibrates z for a target ε), then count every release *before* computing it, with :meth:`spend` (counted at
    once against the plan, recorded in the accountant later in one call by :meth:`flush`: identical events compose
    in one accountant call) or :meth:`record` (recorded now, through the budget: for callers that spend in blocks
    or one release at a time). A release that does not fit raises :class:`~fastdpot.privacy.BudgetExceededError`
    and nothing is counted: the caller must not release. :meth:`epsilon` answers the ε spent; :meth:`state_dict`
    and :meth:`load_state_dict` checkpoint the accounting.

    The plan (:attr:`limit`) is the number of releases, in total, that :meth:`spend` accepts: min(T, what the ε
    budget allows). It is asked of the budget once, when first needed after :meth:`bind` or a load (the events are
    identical, so one evaluation answers for every step: an RDP evaluation of the sampled-without-replacement
    Gaussian costs about 0.5 s).

    Args:
        delta: δ in (0, 1), the total δ of the run's guarantee.
        steps: T >= 1, the planned number of releases (the δ split and the calibration use it; no more than T
            releases are accepted).
        delta_tail: δ_tail >= 0 per release. None (default): :func:`~fastdpot.privacy.split_delta` ``(δ, T)``, i.e.
            δ_acc = δ/2 and δ_tail = δ/(2T); 0: a deterministic sensitivity, δ_acc = δ; another value: δ_acc =
            δ − T·δ_tail (must be > 0).
        tails: ``"planned"`` (default; the flows): all T tails are charged up front: the budget is checked at
            δ_acc and :meth:`epsilon` (δ) is the accountant's ε at ``δ − T·δ_tail``. ``"spent"`` (DPSWgen): only
            the tails of the releases recorded so far are charged: the budget (at the total δ) is passed
            ``delta_tail=`` with every release and ε is the accountant's at ``δ − (tails recorded)``
            (:class:`~fastdpot.privacy.PrivacyBudget`), never a smaller δ for the accountant than ``"planned"``.
        target_epsilon: ε > 0: z is calibrated for it at :meth:`bind` and a budget of ε refuses releases beyond it;
            or None (no calibration; no budget unless ``budget`` is given: only T limits the releases).
        noise_multiplier: z = σ/Δ > 0 given (with no ``target_epsilon``: a fixed z whose ε a ``budget`` may cap),
            or None to calibrate it at :meth:`bind` for ``target_epsilon`` (or the ``budget``'s ε).
        accountant: kind of the :class:`~fastdpot.privacy.PrivacyAccountant` (``"rdp"`` or ``"pld"``), also the
            method the calibration targets.
        budget: an existing :class:`~fastdpot.privacy.PrivacyBudget` to spend through (its accountant may already
            hold releases, e.g. a budget shared by several runs; or a new one that caps a fixed ``noise_multiplier``
            at its ε); its ε is the target ε and its δ must be the one the ledger checks the budget at (δ_acc with
            ``"planned"``, δ with ``"spent"``).
        name: how refusal messages name the run (``"the flow"``, ``"the run"``).

    Units: z is the noise standard deviation divided by the sensitivity of one release under the event's
    neighbouring relation (add/remove for Poisson sampling, replace-one for sampling without replacement).

    Raises:
        ValueError: invalid δ, T, δ_tail (δ_acc <= 0), ``tails``, ε, z, accountant kind; a ``budget`` whose ε or
            δ disagrees with the ledger's; neither ``noise_multiplier`` nor ``target_epsilon`` (nor ``budget``); both
            ``noise_multiplier`` and ``target_epsilon`` (a target ε calibrates z: give one; a fixed z capped at an ε
            is ``noise_multiplier`` with ``budget=PrivacyBudget(ε, δ_checked)``).

    References:
        dp-accounting (Google's differential-privacy library: RDP and PLD accountants, used by
        :class:`~fastdpot.privacy.PrivacyAccountant`); Mironov, "Rényi Differential Privacy", IEEE CSF 2017
        (composition); Wang, Balle & Kasiviswanathan, "Subsampled Rényi Differential Privacy and Analytical
        Moments Accountant", AISTATS 2019 (sampling without replacement); Rakotomamonjy & Ralaivola,
        "Differentially Private Sliced Wasserstein Distance", ICML 2021 (the tail δ_tail of the sliced
        sensitivity, union bound over the T draws).
    """

    def __init__(self, delta: float, steps: int, *, delta_tail: Optional[float] = None, tails: str = "planned",
                 target_epsilon: Optional[float] = None, noise_multiplier: Optional[float] = None,
                 accountant: str = "rdp", budget: Optional[PrivacyBudget] = None, name: str = "the run"):
        self.delta = check_delta(delta)
        self.steps = check_int(steps, "steps", 1)
        self.tails = check_choice(tails, "tails", TAIL_CHARGES)
        if target_epsilon is not None and noise_multiplier is not None:
            raise ValueError(f"give noise_multiplier or target_epsilon, not both (got noise_multiplier="
                             f"{noise_multiplier!r}, target_epsilon={target_epsilon!r}): a target ε calibrates the "
                             f"noise multiplier; to cap a fixed noise multiplier at an ε, pass budget=PrivacyBudget(ε, δ)")
        if delta_tail is None:
            self.delta_accountant, self.delta_tail = split_delta(self.delta, self.steps)
        else:
            tail = check_nonnegative(delta_tail, "delta_tail")
            acc = self.delta if tail == 0 else self.delta - self.steps * tail
            if not acc > 0:
                raise ValueError(f"delta_tail={tail!r} leaves nothing to the accountant: T·δ_tail = "
                                 f"{self.steps * tail!r} >= delta = {self.delta!r}")
            self.delta_accountant, self.delta_tail = acc, tail
        if budget is not None:
            if not isinstance(budget, PrivacyBudget):
                raise ValueError(f"budget must be a PrivacyBudget or None, got {type(budget).__name__}")
            if target_epsilon is not None and check_epsilon(target_epsilon, "target_epsilon") != budget.epsilon:
                raise ValueError(f"target_epsilon={target_epsilon!r} differs from the budget's epsilon "
                                 f"{budget.epsilon!r}")
            if budget.delta != self._budget_delta():
                raise ValueError(f"the budget's delta {budget.delta!r} must be the δ the ledger checks it at "
                                 f"({self._budget_delta()!r}, tails={self.tails!r})")
            target_epsilon = budget.epsilon
        self.target_epsilon = None if target_epsilon is None else check_epsilon(target_epsilon, "target_epsilon")
        self._configured_z = None if noise_multiplier is None else check_positive(noise_multiplier,
                                                                                   "noise_multiplier")
        if self._configured_z is None and self.target_epsilon is None:
            raise ValueError("give noise_multiplier or target_epsilon (the noise is calibrated for it)")
        self.accountant_kind = check_choice(accountant, "accountant", ACCOUNTANTS)
        self.name = str(name)
        self._given_budget = budget
        self._reset(self._configured_z, None, None, None, 0)

    def _reset(self, z, event, accountant, budget, spent):
        self._z: Optional[float] = z
        self._event: Optional[Dict[str, Any]] = event
        self._accountant: Optional[PrivacyAccountant] = accountant
        self._budget: Optional[PrivacyBudget] = budget
        self._spent = spent  # releases this ledger counted (recorded or pending)
        self._pending = 0  # releases counted (and released) but not yet recorded in the accountant
        self._limit: Optional[int] = None  # the plan, computed when first needed

    def _budget_delta(self) -> float:
        return self.delta_accountant if self.tails == "planned" else self.delta

    def _tail_kw(self) -> dict:
        return dict(delta_tail=self.delta_tail) if self.tails == "spent" else {}

    # ------------------------------------------------------------------ state (read-only: changed by counting
    # releases and by loading a later state only)
    @property
    def noise_multiplier(self) -> Optional[float]:
        """z = σ/Δ: the configured one, or the one calibrated at :meth:`bind` (None before)."""
        return self._z

    @property
    def event(self) -> Optional[Dict[str, Any]]:
        """The bound sampling event (keyword arguments of :meth:`PrivacyAccountant.step`), None before :meth:`bind`
        (a copy)."""
        return None if self._event is None else dict(self._event)

    @property
    def accountant(self) -> Optional[PrivacyAccountant]:
        """The :class:`~fastdpot.privacy.PrivacyAccountant` the releases are recorded in (None before :meth:`bind`)."""
        return self._accountant

    @property
    def budget(self) -> Optional[PrivacyBudget]:
        """The :class:`~fastdpot.privacy.PrivacyBudget` that checks every release (None without a target ε)."""
        return self._budget

    @property
    def delta_split(self):
        """``(δ_acc, δ_tail)``: δ = δ_acc + T·δ_tail."""
        return self.delta_accountant, self.delta_tail

    @property
    def bound(self) -> bool:
        """Whether :meth:`bind` fixed the event (and z)."""
        return self._event is not None

    @property
    def steps_spent(self) -> int:
        """Releases this ledger counted so far (recorded in the accountant or pending)."""
        return self._spent

    @property
    def limit(self) -> int:
        """Releases (in total) :meth:`spend` accepts: min(T, what the ε budget allows); T before :meth:`bind`."""
        if self._event is None:
            return self.steps
        if self._limit is None:
            self._plan()
        return self._limit

    # ------------------------------------------------------------------ binding
    def bind(self, sample_rate: float = 1.0, sampling: str = "poisson", dataset_size: Optional[int] = None,
             batch_size: Optional[int] = None, *, progress: bool = True, progress_delay: float = 1.0) -> float:
        """Fix the sampling event of every release (arguments as :meth:`PrivacyAccountant.step`) and return z.

        The first call calibrates z = σ/Δ for the target ε when none was given
        (:func:`~fastdpot.privacy.calibrate_noise_multiplier` at δ_acc over T releases, bounded: an unreachable
        target is refused naming the reachable range; ``progress``: its progress line, from ``progress_delay`` s on)
        and creates the accountant and the budget. Binding again with the same event does nothing.

        Raises:
            ValueError: an invalid event, or another event than the bound one (one ledger accounts one kind of
                release); the calibration's errors (an unreachable target ε).
        """
        check_bool(progress, "progress")
        event = dict(sample_rate=sample_rate, sampling=sampling, dataset_size=dataset_size, batch_size=batch_size)
        event = {k: v for k, v in event.items() if v is not None}
        if self._event is not None:
            if event != self._event:
                raise ValueError(f"this ledger is bound to the event {self._event}; got {event}")
            return self._z
        _make_event(1.0 if self._z is None else self._z, sample_rate, sampling,
                    dataset_size, batch_size)  # validates the event
        z = self._z
        if z is None:
            z = _calibrate(self.target_epsilon, self.delta_accountant, self.steps, self.accountant_kind,
                           tuple(sorted(event.items())), progress, progress_delay)
        if self._given_budget is not None:
            acc, budget = self._given_budget.accountant, self._given_budget
        else:
            acc = PrivacyAccountant(accountant=self.accountant_kind)
            budget = None if self.target_epsilon is None else PrivacyBudget(self.target_epsilon,
                                                                            self._budget_delta(), accountant=acc)
        self._reset(z, event, acc, budget, 0)
        return z

    def _require_bound(self):
        if self._event is None:
            raise RuntimeError("bind() the ledger's sampling event before counting releases")

    # ------------------------------------------------------------------ spending
    def max_steps(self, limit: int) -> int:
        """Largest n <= ``limit`` of further releases the ε budget accepts now (``limit`` itself when they fit:
        one check; ``limit`` without a budget). The planned T is not applied here.

        Raises:
            ValueError: ``limit`` < 1. RuntimeError: not bound.
        """
        self._require_bound()
        limit = check_int(limit, "limit", 1)
        if self._budget is None:
            return limit
        self.flush()
        z, ev = self._z, dict(self._event, **self._tail_kw())
        if self._budget.can_spend(z, num_steps=limit, **ev):
            return limit
        return 0 if limit == 1 else self._budget.max_steps(z, limit=limit, **ev)

    def _plan(self):
        left = self.steps - self.steps_spent
        self._limit = self.steps if self._budget is None or left <= 0 else self.steps_spent + self.max_steps(left)

    def can_spend(self, num_steps: int = 1) -> bool:
        """Whether :meth:`spend` of ``num_steps`` would be accepted (always True before :meth:`bind`)."""
        return self._event is None or self.steps_spent + num_steps <= self.limit

    def _refuse(self, num_steps: int, within: int):
        """Raise :class:`BudgetExceededError` if ``num_steps`` more releases exceed ``within`` (nothing counted)."""
        done = self.steps_spent
        if done + num_steps <= within:
            return
        if done + num_steps <= self.steps:
            raise BudgetExceededError(
                f"step {done + 1} would exceed target_epsilon={self.target_epsilon!r} "
                f"(noise_multiplier={self._z!r}); nothing was released")
        raise BudgetExceededError(
            f"{self.name} has taken its planned {self.steps} private steps; more would break the δ split "
            f"δ = δ_acc + T·δ_tail")

    def spend(self, num_steps: int = 1) -> None:
        """Count ``num_steps`` releases BEFORE they are computed, against the plan (:attr:`limit`); they are
        recorded in the accountant by :meth:`flush` (or :meth:`epsilon`, :meth:`state_dict`), in one call.

        Raises:
            BudgetExceededError: the releases would exceed the target ε or the planned T (nothing is counted:
                release nothing). RuntimeError: not bound.
        """
        self._require_bound()
        num_steps = check_int(num_steps, "num_steps", 1)
        self._refuse(num_steps, self.limit)
        self._pending += num_steps
        self._spent += num_steps

    def record(self, num_steps: int = 1) -> None:
        """Count and record ``num_steps`` releases now, BEFORE they are computed: through the budget's check when
        there is one (:meth:`PrivacyBudget.spend`), within the planned T.

        Raises:
            BudgetExceededError: the releases would exceed the planned T, or the budget refuses them (its message;
                nothing is recorded: release nothing). RuntimeError: not bound.
        """
        self._require_bound()
        num_steps = check_int(num_steps, "num_steps", 1)
        self._refuse(num_steps, self.steps)
        self.flush()
        self._record(num_steps)
        self._spent += num_steps
        self._limit = None  # the budget changed: re-plan when asked

    def record_lost(self, num_steps: int) -> None:
        """Count ``num_steps`` releases that were MADE but whose results were lost (a run that died after its last
        checkpoint, resumed from it): recorded in the accountant (and the budget's tails) without the budget's
        check, since they happened and refusing cannot undo them. They use up the plan like any release.

        Raises:
            ValueError: ``num_steps`` < 1, or more releases than the planned T in all. RuntimeError: not bound.
        """
        self._require_bound()
        num_steps = check_int(num_steps, "num_steps", 1)
        if self.steps_spent + num_steps > self.steps:
            raise ValueError(f"{num_steps} lost release(s) after {self.steps_spent} exceed the planned T = {self.steps}")
        self.flush()
        self._accountant.step(self._z, num_steps=num_steps, **self._event)
        if self._budget is not None and self.tails == "spent":
            self._budget._delta_tail_spent += num_steps * self.delta_tail
        if self._budget is not None:
            self._budget._frontier = None
        self._spent += num_steps
        self._limit = None

    def _record(self, n: int):
        if self._budget is not None:
            self._budget.spend(self._z, num_steps=n, **self._event, **self._tail_kw())
        else:
            self._accountant.step(self._z, num_steps=n, **self._event)

    def flush(self) -> None:
        """Record the pending releases in the accountant / budget (identical events compose in one call)."""
        if self._pending:
            self._record(self._pending)
            self._pending = 0

    # ------------------------------------------------------------------ epsilon
    def epsilon(self, delta: Optional[float] = None) -> float:
        """ε spent so far at total δ = ``delta`` (default: the ledger's δ); 0.0 before the first release.

        ``"planned"`` tails: the accountant is asked at ``delta − T·δ_tail`` (the tails of the planned T releases
        are charged in full). ``"spent"``: at ``delta`` minus the tails of the releases recorded (the budget's
        ``delta_tail_spent`` when there is one).

        Raises:
            ValueError: ``delta`` not in (0, 1), or not above the tails charged.
        """
        delta = self.delta if delta is None else check_delta(delta)
        if self.tails == "planned":
            charged, what = self.steps * self.delta_tail, "T·δ_tail"
        else:
            self.flush()
            charged = (self._budget.delta_tail_spent if self._budget is not None else
                       (0 if self._accountant is None else self._accountant.steps) * self.delta_tail)
            what = "the tails spent"
        rest = delta - charged
        if not rest > 0:
            raise ValueError(f"delta must exceed {what} = {charged!r}, got {delta!r}")
        if self._accountant is None or (self._accountant.steps == 0 and not self._pending):
            return 0.0
        self.flush()
        return float(self._accountant.get_epsilon(rest))

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> Dict[str, Any]:
        """The accounting to checkpoint (pending releases are recorded first): ``noise_multiplier`` (z or None),
        ``event`` (the bound event's keyword arguments, or None), ``accountant`` and ``budget`` (their state
        dicts, or None). The settings (δ, T, δ_tail, ε, accountant kind) are the constructor's, not saved here."""
        self.flush()
        return dict(noise_multiplier=self._z,
                    event=None if self._event is None else dict(self._event),
                    accountant=None if self._accountant is None else self._accountant.state_dict(),
                    budget=None if self._budget is None else self._budget.state_dict())

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` into a ledger built with the same settings (resume a run).

        Atomic: the whole state is checked before anything is assigned; on any error this ledger is unchanged.
        The accountant and budget are new objects (a ``budget`` given to the constructor is not reused).

        What a state must satisfy (anything else is an inconsistent checkpoint, refused naming the field): the
        noise multiplier is the configured one, or, with a target ε, the one the calibration gives (:meth:`bind`:
        the target is met at z and missed at z − 2·tol, twice the calibration's tolerance); every event of the
        accountant's history is the bound mechanism's (z, n, B, sampling, hence the neighbouring relation) and the
        accountant is of the configured kind; at most T releases; a budget with the ledger's (ε, δ) and the same
        history. A ledger that has counted releases never moves backwards: the state must extend its history.

        Raises:
            ValueError: not a dict, a key missing or invalid (the message names it); a noise multiplier other than
                the configured or calibrated one, or missing while the event is bound; the accountant (or, with a
                target ε, the budget) missing from a bound state, or releases in an unbound one (loading it would
                reset the ε spent); a history event or accountant kind other than this ledger's mechanism; a budget
                of another (ε, δ); more releases recorded than the planned T; a state behind this ledger's releases.
        """
        z, event, acc, budget = checked_state(self, state)
        self._reset(z, event, acc, budget, 0 if acc is None else acc.steps)

    def __repr__(self):
        return (f"PrivacyLedger(delta={self.delta!r}, steps={self.steps}, target_epsilon={self.target_epsilon!r}, "
                f"noise_multiplier={self._z!r}, spent={self.steps_spent}, tails={self.tails!r})")
