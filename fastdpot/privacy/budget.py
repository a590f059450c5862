"""A declared (ε, δ) budget that refuses a release before it would be exceeded."""
from __future__ import annotations

from typing import Optional

from .._validate import check_delta, check_epsilon, check_int, check_nonnegative
from .accounting import PrivacyAccountant

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

    The check first uses the RDP bound (cheap, incremental, always ≥ the PLD value) and computes the PLD value only
    when RDP alone would refuse.

    Args:
        epsilon: ε > 0.
        delta: δ in (0, 1).
        accountant: a :class:`PrivacyAccountant` (default: a fresh PLD one); may already hold earlier releases.

    Raises:
        ValueError: invalid ε or δ, accountant of the wrong type.
    """

    def __init__(self, epsilon: float, delta: float, accountant: Optional[PrivacyAccountant] = None):
        self.epsilon = check_epsilon(epsilon)
        self.delta = check_delta(delta)
        if accountant is None:
            accountant = PrivacyAccountant()
        if not isinstance(accountant, PrivacyAccountant):
            raise ValueError(f"accountant must be a PrivacyAccountant or None, got {type(accountant).__name__}")
        self.accountant = accountant
        self.delta_tail_spent = 0.0

    # ------------------------------------------------------------------ state
    @property
    def delta_accountant(self) -> float:
        """The δ left for the accountant: δ minus the sensitivity tails spent so far."""
        return self.delta - self.delta_tail_spent

    @property
    def steps(self) -> int:
        """Releases recorded in the budget's accountant."""
        return self.accountant.steps

    @property
    def epsilon_spent(self) -> float:
        """ε of everything released so far, at :attr:`delta_accountant`."""
        return self.accountant.get_epsilon(self.delta_accountant)

    @property
    def epsilon_remaining(self) -> float:
        """ε left before the declared budget is reached: max(ε − ε spent, 0)."""
        return max(self.epsilon - self.epsilon_spent, 0.0)

    # ------------------------------------------------------------------ checks
    def _trial(self, noise_multiplier, sample_rate, num_steps, sampling, dataset_size, batch_size, delta_tail):
        delta_tail = check_nonnegative(delta_tail, "delta_tail")
        num_steps = check_int(num_steps, "num_steps", 1)
        trial = self.accountant.copy()
        trial.step(noise_multiplier, sample_rate, num_steps, sampling, dataset_size, batch_size)
        tail_after = self.delta_tail_spent + num_steps * delta_tail
        delta_acc = self.delta - tail_after
        if not delta_acc > 0:
            return trial, tail_after, False, float("inf")
        eps_rdp = trial.get_epsilon(delta_acc, accountant="rdp")
        if eps_rdp <= self.epsilon:
            # the reported value (PLD when available) is never above the RDP bound used for the check
            return trial, tail_after, True, eps_rdp
        if trial.epsilon_method() == "rdp":
            return trial, tail_after, False, eps_rdp
        eps = trial.get_epsilon(delta_acc)
        return trial, tail_after, eps <= self.epsilon, eps

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
        random directions that the sensitivity bound fails (0 for deterministic sensitivities).

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
        self.delta_tail_spent = tail_after
        return eps

    def _adopt(self, trial: PrivacyAccountant) -> None:
        # keep the caller's accountant object (it may be shared); take over the trial's recorded state
        self.accountant.__dict__.update(trial.__dict__)

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
        return {"epsilon": self.epsilon, "delta": self.delta, "delta_tail_spent": self.delta_tail_spent,
                "accountant": self.accountant.state_dict()}

    def load_state_dict(self, state: dict, *, replace_budget: bool = False) -> None:
        """Restore a :meth:`state_dict`: the tails spent and the accountant's history (into this budget's accountant
        object, which may be shared).

        The whole state is checked before anything is assigned: on any error this budget and its accountant are
        unchanged. A state whose declared (ε, δ) differ from this budget's is refused unless
        ``replace_budget=True`` (then this budget takes the state's ε and δ): restoring an ε = 10 run into a
        ``PrivacyBudget(1.0, ...)`` must not silently turn it into an ε = 10 budget. :meth:`from_state_dict`
        builds a budget with the state's own (ε, δ).

        Raises:
            ValueError: not a dict, a key missing or invalid, ``delta_tail_spent`` >= δ, the accountant's state
                invalid, or (ε, δ) differing from this budget's without ``replace_budget=True``.
        """
        eps, delta, tail, acc = self._check_state(state)
        if not replace_budget and (eps != self.epsilon or delta != self.delta):
            raise ValueError(f"the state is a budget of (epsilon={eps!r}, delta={delta!r}) but this budget is "
                             f"(epsilon={self.epsilon!r}, delta={self.delta!r}); pass replace_budget=True to adopt "
                             f"the state's budget, or use PrivacyBudget.from_state_dict(state)")
        self.epsilon, self.delta, self.delta_tail_spent = eps, delta, tail
        self.accountant.__dict__.update(acc.__dict__)

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

        require_state(state, ("epsilon", "delta", "delta_tail_spent", "accountant"), "PrivacyBudget")
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
