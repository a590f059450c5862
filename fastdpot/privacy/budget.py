"""A declared (ε, δ) budget that refuses a release before it would be exceeded."""
from __future__ import annotations

from typing import Optional

import math

from .._validate import check_delta, check_epsilon, check_int, check_nonnegative
from .accounting import PrivacyAccountant, _Event, _make_event

__all__ = ["PrivacyBudget", "BudgetExceededError"]


class BudgetExceededError(RuntimeError):
    """A release would take the run past its declared (ε, δ); nothing was recorded or released."""


class PrivacyBudget:
    """A run's declared (ε, δ), checked *before* every release and saved with every checkpoint.

    Call :meth:`spend` before computing a private release: it records the step(s) in the accountant only if the
    composed guarantee stays within (ε, δ), and otherwise raises :class:`BudgetExceededError` without recording
    anything (so the caller must not release).

    Releases whose sensitivity holds only with probability 1 − δ_tail over random directions (sliced releases) pass
    ``delta_tail=`` per step: the budget then tracks ``delta_tail_spent`` and checks ε at
    ``delta_accountant = δ − delta_tail_spent`` (union bound: the run is (ε_acc(δ_acc), δ_acc + Σ δ_tail)-DP).
    With ``split_delta(δ, T)`` that is ``δ_tail = δ/(2T)`` per step and ``δ_acc ≥ δ/2`` at the end.

    Cost of a check (every call is bounded; nothing is recomputed per step from scratch): the RDP bound first
    (incremental, always a valid bound: about 0.2 ms). Only when RDP alone would refuse, the accountant reports PLD
    (:meth:`PrivacyAccountant.epsilon_method`) and RDP is at most 2ε + 1, the PLD frontier is asked: the largest
    number of further releases of this event that PLD accepts, found once by doubling and bisection (O(log T) PLD
    evaluations of about 0.1 s) and reused by every later identical spend until the frontier is reached. A refusal
    with RDP above 2ε + 1 is immediate (the shortcut can only forgo a release PLD would allow, never the reverse).

    Args:
        epsilon: ε > 0.
        delta: δ in (0, 1).
        accountant: a :class:`PrivacyAccountant` (default: a fresh PLD one); may already hold earlier releases.

    Attributes (read-only): ``epsilon``, ``delta``, ``accountant``, ``delta_tail_spent``, ``steps``: a budget is
    changed only by :meth:`spend` and by loading a later state (:meth:`load_state_dict`).

    Raises:
        ValueError: invalid ε or δ, accountant of the wrong type.
    """

    def __init__(self, epsilon: float, delta: float, accountant: Optional[PrivacyAccountant] = None):
        self._epsilon = check_epsilon(epsilon)
        self._delta = check_delta(delta)
        if accountant is None:
            accountant = PrivacyAccountant()
        if not isinstance(accountant, PrivacyAccountant):
            raise ValueError(f"accountant must be a PrivacyAccountant or None, got {type(accountant).__name__}")
        self._accountant = accountant
        self._delta_tail_spent = 0.0
        self._frontier: Optional[_Frontier] = None

    # ------------------------------------------------------------------ state
    @property
    def epsilon(self) -> float:
        """The declared ε."""
        return self._epsilon

    @property
    def delta(self) -> float:
        """The declared δ."""
        return self._delta

    @property
    def accountant(self) -> PrivacyAccountant:
        """The :class:`PrivacyAccountant` every accepted release is recorded in (may be shared with the caller)."""
        return self._accountant

    @property
    def delta_tail_spent(self) -> float:
        """Σ δ_tail of the releases recorded through this budget."""
        return self._delta_tail_spent

    @property
    def delta_accountant(self) -> float:
        """The δ left for the accountant: δ minus the sensitivity tails spent so far."""
        return self._delta - self._delta_tail_spent

    @property
    def steps(self) -> int:
        """Releases recorded in the budget's accountant."""
        return self._accountant.steps

    @property
    def epsilon_spent(self) -> float:
        """ε of everything released so far, at :attr:`delta_accountant`."""
        return self._accountant.get_epsilon(self.delta_accountant)

    @property
    def epsilon_remaining(self) -> float:
        """ε left before the declared budget is reached: max(ε − ε spent, 0)."""
        return max(self._epsilon - self.epsilon_spent, 0.0)

    # ------------------------------------------------------------------ checks
    def _trial(self, noise_multiplier, sample_rate, num_steps, sampling, dataset_size, batch_size, delta_tail):
        """``(accountant with the releases recorded, tails after, accepted, ε bound)``; nothing is changed."""
        delta_tail = check_nonnegative(delta_tail, "delta_tail")
        num_steps = check_int(num_steps, "num_steps", 1)
        event = _make_event(noise_multiplier, sample_rate, sampling, dataset_size, batch_size)
        trial = self._accountant.copy()
        trial._record(event, num_steps)  # checks the neighbouring relation
        tail_after = self._delta_tail_spent + num_steps * delta_tail
        delta_acc = self._delta - tail_after
        if not delta_acc > 0:
            return trial, tail_after, False, float("inf")
        eps_rdp = trial.get_epsilon(delta_acc, accountant="rdp")
        if eps_rdp <= self._epsilon:
            return trial, tail_after, True, eps_rdp
        if trial.epsilon_method() == "rdp" or eps_rdp > 2.0 * self._epsilon + 1.0:
            return trial, tail_after, False, eps_rdp
        ok = self._pld_accepts(event, num_steps, delta_tail)
        # accepted: the PLD ε (the reported value) is <= the budget's ε, an upper bound returned without a new PLD
        return trial, tail_after, ok, min(eps_rdp, self._epsilon) if ok else eps_rdp

    def _pld_accepts(self, event: _Event, num_steps: int, delta_tail: float) -> bool:
        """Whether PLD accepts ``num_steps`` more releases of ``event`` (see the class docstring: the frontier of
        the current history's prefix before its trailing run of ``event`` is found once and reused)."""
        hist = self._accountant._history
        j = hist[-1][1] if hist and hist[-1][0] == event else 0
        prefix = tuple(hist[:-1]) if j else tuple(hist)
        tail0 = self._delta_tail_spent - j * delta_tail
        f = self._frontier
        if f is None or not f.matches(prefix, event, delta_tail, tail0):
            f = self._frontier = _Frontier(prefix, event, delta_tail, tail0, self._pld_epsilon, self._epsilon)
        return f.accepts(j + num_steps, gallop=j > 0)

    def _pld_epsilon(self, prefix, event, delta_tail, tail0, m) -> float:
        """PLD ε of ``prefix`` + m releases of ``event`` at δ − tail0 − m·δ_tail (inf outside PLD's range)."""
        acc = PrivacyAccountant(self._accountant.accountant, self._accountant.orders,
                                self._accountant.value_discretization_interval, self._accountant.neighboring_relation)
        for e, n in prefix:
            acc._record(e, n)
        acc._record(event, m)
        delta_acc = self._delta - tail0 - m * delta_tail
        if not delta_acc > 0 or acc.epsilon_method(delta=delta_acc) != "pld":
            return math.inf
        return acc.get_epsilon(delta_acc, accountant="pld")

    def can_spend(self, noise_multiplier: float, sample_rate: float = 1.0, num_steps: int = 1,
                  sampling: str = "poisson", dataset_size: Optional[int] = None,
                  batch_size: Optional[int] = None, delta_tail: float = 0.0) -> bool:
        """Whether :meth:`spend` with the same arguments would succeed (nothing is recorded)."""
        return self._trial(noise_multiplier, sample_rate, num_steps, sampling, dataset_size, batch_size,
                           delta_tail)[2]

    def spend(self, noise_multiplier: float, sample_rate: float = 1.0, num_steps: int = 1,
              sampling: str = "poisson", dataset_size: Optional[int] = None,
              batch_size: Optional[int] = None, delta_tail: float = 0.0) -> float:
        """Record ``num_steps`` releases if the budget allows them; return ε spent so far (an upper bound).

        Arguments as :meth:`PrivacyAccountant.step`, plus ``delta_tail`` ≥ 0: the per-release probability over
        random directions that the sensitivity bound fails (0 for deterministic sensitivities). The returned bound
        is the RDP ε, or the budget's ε when PLD accepted what RDP alone would refuse (the reported
        :attr:`epsilon_spent` is then the PLD value, at most that).

        Raises:
            BudgetExceededError: the releases would exceed (ε, δ); nothing is recorded.
            ValueError: invalid arguments (nothing is recorded).
        """
        trial, tail_after, ok, eps = self._trial(noise_multiplier, sample_rate, num_steps, sampling,
                                                 dataset_size, batch_size, delta_tail)
        if not ok:
            if not tail_after < self.delta:
                raise BudgetExceededError(
                    f"sensitivity tails would use delta_tail_spent={tail_after!r} >= delta={self.delta!r}")
            raise BudgetExceededError(
                f"releasing {num_steps} more step(s) (noise_multiplier={noise_multiplier!r}, "
                f"sample_rate={sample_rate!r}) would reach epsilon={eps:.4g} > budget epsilon={self.epsilon!r} "
                f"at delta_accountant={self.delta - tail_after:.3g}; nothing was recorded")
        self._adopt(trial)
        self._delta_tail_spent = tail_after
        return eps

    def _adopt(self, trial: PrivacyAccountant) -> None:
        # keep the caller's accountant object (it may be shared); take over the trial's recorded state
        self._accountant.__dict__.update(trial.__dict__)

    def max_steps(self, noise_multiplier: float, sample_rate: float = 1.0, sampling: str = "poisson",
                  dataset_size: Optional[int] = None, batch_size: Optional[int] = None,
                  delta_tail: float = 0.0, limit: int = 10 ** 7) -> int:
        """Largest number of identical steps :meth:`spend` would still accept now (0 if none; at most ``limit``).

        Useful to plan a run once instead of paying a PLD evaluation at every step near the end of the budget.
        """
        limit = check_int(limit, "limit", 1)

        def ok(n):
            return self.can_spend(noise_multiplier, sample_rate, n, sampling, dataset_size, batch_size, delta_tail)

        if not ok(1):
            return 0
        lo, hi = 1, 2
        while hi <= limit and ok(hi):
            lo, hi = hi, hi * 2
        if hi > limit:
            return limit if ok(limit) else self._bisect(ok, lo, limit)
        return self._bisect(ok, lo, hi)

    @staticmethod
    def _bisect(ok, lo, hi):  # ok(lo) is True, ok(hi) is False
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
        return lo

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        """Budget, tails spent and the accountant's history (save it with every checkpoint)."""
        return {"epsilon": self._epsilon, "delta": self._delta, "delta_tail_spent": self._delta_tail_spent,
                "accountant": self._accountant.state_dict()}

    def load_state_dict(self, state: dict, *, replace_budget: bool = False) -> None:
        """Restore a :meth:`state_dict`: the tails spent and the accountant's history (into this budget's accountant
        object, which may be shared).

        The whole state is checked before anything is assigned: on any error this budget and its accountant are
        unchanged. A live budget never moves backwards: the state's history must extend the accountant's (every
        release recorded, in order; an earlier state, an edited event or an empty history is refused) and its tails
        must be at least those spent. A state whose declared (ε, δ) differ from this budget's is refused unless
        ``replace_budget=True`` (then this budget takes the state's ε and δ): restoring an ε = 10 run into a
        ``PrivacyBudget(1.0, ...)`` must not silently turn it into an ε = 10 budget. :meth:`from_state_dict`
        builds a budget with the state's own (ε, δ).

        Raises:
            ValueError: not a dict, a key missing or invalid, ``delta_tail_spent`` >= δ, the accountant's state
                invalid, (ε, δ) differing from this budget's without ``replace_budget=True``, a state behind this
                budget's history or tails.
        """
        eps, delta, tail, acc = self._check_state(state)
        if not replace_budget and (eps != self._epsilon or delta != self._delta):
            raise ValueError(f"the state is a budget of (epsilon={eps!r}, delta={delta!r}) but this budget is "
                             f"(epsilon={self._epsilon!r}, delta={self._delta!r}); pass replace_budget=True to adopt "
                             f"the state's budget, or use PrivacyBudget.from_state_dict(state)")
        self._accountant.check_extended_by(acc, "state['accountant']['history']")  # never backwards
        if tail < self._delta_tail_spent:
            raise ValueError(f"state['delta_tail_spent']={tail!r} is behind this budget's {self._delta_tail_spent!r}: "
                             f"a live budget never moves backwards")
        self._epsilon, self._delta, self._delta_tail_spent = eps, delta, tail
        self._accountant.__dict__.update(acc.__dict__)
        self._frontier = None

    @classmethod
    def from_state_dict(cls, state: dict, accountant: Optional[PrivacyAccountant] = None) -> "PrivacyBudget":
        """A budget with the state's own (ε, δ), tails spent and history (into ``accountant`` when given).

        Raises:
            ValueError: as :meth:`load_state_dict`.
        """
        eps, delta, _, _ = cls._check_state(state)
        budget = cls(eps, delta, accountant=accountant)
        budget.load_state_dict(state)
        return budget

    @staticmethod
    def _check_state(state):
        from .._checkpoint import require_state

        require_state(state, ("epsilon", "delta", "delta_tail_spent", "accountant"), "PrivacyBudget", exact=True)
        eps = check_epsilon(state["epsilon"], "state['epsilon']")
        delta = check_delta(state["delta"], "state['delta']")
        tail = check_nonnegative(state["delta_tail_spent"], "state['delta_tail_spent']")
        if not tail < delta:
            raise ValueError(f"state['delta_tail_spent']={tail!r} must be < state['delta']={delta!r}")
        acc = PrivacyAccountant.from_state_dict(state["accountant"])
        return eps, delta, tail, acc

    def __repr__(self):
        return (f"PrivacyBudget(epsilon={self.epsilon!r}, delta={self.delta!r}, steps={self.steps}, "
                f"delta_tail_spent={self.delta_tail_spent:.3g})")


class _Frontier:
    """What PLD accepts after one history prefix: the releases m of one event known to fit (``ok``) or not
    (``bad``), refined on demand, so that repeated identical spends cost a few PLD evaluations in all. ε(m), the
    PLD ε of m releases after the prefix, is monotone in m (more releases and less δ for the accountant only raise
    it) and smooth, so the frontier is bracketed by doubling and then found by interpolating ε between the bracket's
    ends (a bisection step whenever that does not halve the bracket)."""

    def __init__(self, prefix, event, delta_tail, tail0, pld_epsilon, epsilon):
        self.key = (prefix, event, delta_tail)
        self.tail0 = tail0
        self._pld_epsilon = pld_epsilon
        self._epsilon = epsilon
        self.ok, self.bad = 0, None  # 0 releases always fit: the prefix was accepted
        self._eps = {}

    def matches(self, prefix, event, delta_tail, tail0) -> bool:
        return self.key == (prefix, event, delta_tail) and math.isclose(self.tail0, tail0, rel_tol=1e-9,
                                                                        abs_tol=1e-300)

    def _check(self, m: int) -> bool:
        prefix, event, delta_tail = self.key
        eps = self._eps[m] = self._pld_epsilon(prefix, event, delta_tail, self.tail0, m)
        if eps <= self._epsilon:
            self.ok = max(self.ok, m)
            return True
        self.bad = m if self.bad is None else min(self.bad, m)
        return False

    def _next(self, halve: bool) -> int:
        lo, hi = self.ok, self.bad
        e_lo, e_hi = self._eps.get(lo), self._eps.get(hi)
        if halve or e_lo is None or e_hi is None or not (math.isfinite(e_hi) and e_hi > e_lo):
            return (lo + hi) // 2
        m = lo + int((self._epsilon - e_lo) / (e_hi - e_lo) * (hi - lo))
        return min(max(m, lo + 1), hi - 1)

    def accepts(self, m: int, gallop: bool) -> bool:
        """Whether m releases (in all, after the prefix) fit; with ``gallop`` (a run of identical spends), a
        positive answer also finds the exact frontier, so that the next spends are answered from it."""
        if m <= self.ok:
            return True
        if self.bad is not None and m >= self.bad:
            return False
        if not self._check(m):
            return False
        if gallop:
            step = max(m // 2, 1)
            while self.bad is None and self._check(self.ok + step):
                step *= 2
            halve = False
            while self.bad is not None and self.bad - self.ok > 1:
                width = self.bad - self.ok
                self._check(self._next(halve))
                halve = self.bad - self.ok > width // 2  # interpolation did not halve the bracket: bisect next
        return True
