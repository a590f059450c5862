"""The one ledger of a multi-stage private run: every stage's releases composed in one accountant.

A private pipeline releases several things computed from the same sensitive set: a representation trained with
DP-SGD, a flow's per-step releases, a DP statistic. Each stage is a (subsampled) Gaussian mechanism under the same
neighbouring relation (replace one record by any other, its label free to change), so their Rényi-DP curves add
order by order (Mironov, "Rényi Differential Privacy", IEEE CSF 2017, Prop. 1, adaptive composition): the run is
(ε, δ)-DP with ε the accountant's value at δ for the composed curve. :class:`ComposedLedger` keeps that accountant
(:class:`fastdpot.privacy.PrivacyAccountant`, RDP), records every stage's releases before they happen, and
calibrates a stage's noise multiplier so that the composition of everything recorded so far *and* the stage's
planned releases meets a given ε.

Every stage here has a deterministic sensitivity (per-sample clipping; orthogonal directions for the flows), so all
of δ goes to the accountant; a stage with a sensitivity tail (uniform directions) must not be composed here.

Accountant (``accountant="auto"``, the default): when every release recorded (and planned, in a calibration) is a
Gaussian mechanism on the whole data set, their composition is itself a Gaussian mechanism of noise multiplier
(Σ z_i⁻²)^(−1/2), whose exact (ε, δ) the PLD accountant gives (dp-accounting; Balle & Wang's analytic calibration);
as soon as one release is subsampled, RDP composes them all. ``accountant="rdp"`` always uses RDP.

The dp-accounting calls, exactly (``fastdpot.experiments.mainjob.privacy_report.ACCOUNTANT_CALLS`` writes them into a
run's privacy.md):

* PLD: ``dp_accounting.pld.PLDAccountant(neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
  value_discretization_interval=1e-3)``, one ``GaussianDpEvent(z)`` per release, ``get_epsilon(δ)``. The relation
  is add/remove although the neighbours are replace-one, and that is right: z = σ/Δ with Δ the replace-one
  sensitivity, so a replacement moves a release's mean by at most one unit of z, the pair N(0, z²), N(1, z²) of a
  Gaussian event under ADD_OR_REMOVE_ONE. dp-accounting's REPLACE_ONE takes the event's unit for an add/remove
  sensitivity and moves the mean by two ("the same privacy loss distribution with twice the sensitivity"): with
  this Δ it would count the replacement twice (ε = 23.8 instead of 9.98 for the one-shot run at ε = 10).
* RDP: ``dp_accounting.rdp.RdpAccountant(orders=DEFAULT_ORDERS, neighboring_relation=NeighboringRelation.
  REPLACE_ONE)``, one ``SampledWithoutReplacementDpEvent(n, B, GaussianDpEvent(z))`` per release on a batch of B of
  the n records and one ``GaussianDpEvent(z)`` per release on all of them, ``get_epsilon(δ)``: replace-one is the
  relation of sampling without replacement, and its bound (Wang, Balle & Kasiviswanathan) takes the base
  Gaussian's α/(2z²), one unit of z per replacement; a whole-data-set Gaussian event has that RDP under either
  relation.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from .._validate import check_delta, check_epsilon, check_int, check_positive
from .accounting import PrivacyAccountant
from .budget import BudgetExceededError

__all__ = ["ComposedLedger"]

_SAMPLINGS = ("without_replacement", "full")


class ComposedLedger:
    """Every release of one run, composed (replace-one neighbours; PLD or RDP: the module docstring names the exact
    dp-accounting calls), against one (ε, δ).

    Releases are recorded per stage with :meth:`record` before they happen (a release that would exceed ε is refused
    and nothing is recorded). Each event is a Gaussian mechanism of noise multiplier z = σ/Δ (Δ the replace-one
    sensitivity of the stage's release), either on a batch of exactly B of the n records drawn uniformly without
    replacement (``sampling="without_replacement"``, :class:`fastdpot.privacy.FixedSizeSampler`) or on all of them
    (``"full"``).

    Args:
        epsilon: ε > 0 of the whole run (``inf``: a non-private run; nothing is recorded, :meth:`epsilon` is inf).
        delta: δ in (0, 1) of the whole run, all of it for the accountant.
        accountant: ``"auto"`` (PLD while every release is a full-batch Gaussian, RDP otherwise: module docstring) or
            ``"rdp"``.

    Raises:
        ValueError: ε <= 0, δ outside (0, 1), another accountant.

    References:
        Mironov, "Rényi Differential Privacy", IEEE CSF 2017 (composition); Wang, Balle & Kasiviswanathan,
        "Subsampled Rényi Differential Privacy and Analytical Moments Accountant", AISTATS 2019 (sampling without
        replacement, as implemented by dp-accounting).
    """

    def __init__(self, epsilon: float, delta: float, accountant: str = "auto"):
        self.target_epsilon = check_epsilon(epsilon, "epsilon", allow_inf=True)
        self.delta = check_delta(delta)
        if accountant not in ("auto", "rdp"):
            raise ValueError(f"accountant must be 'auto' or 'rdp', got {accountant!r}")
        self.accountant = accountant
        self._events: List[tuple] = []  # (z, event, count) of every release recorded
        self._stages: List[Dict[str, Any]] = []

    def _accountant_of(self, events) -> PrivacyAccountant:
        """The accountant of a list of releases: PLD when all are full-batch Gaussians (and ``accountant="auto"``),
        else RDP."""
        full = self.accountant == "auto" and all(e["sample_rate"] == 1.0 for _, e, _ in events)
        acc = PrivacyAccountant("pld" if full else "rdp")
        for z, e, count in events:
            if full:
                acc.step(z, sample_rate=1.0, num_steps=count)
            else:
                acc.step(z, num_steps=count, **e)
        return acc

    @property
    def accountant_used(self) -> str:
        """``"pld"`` or ``"rdp"``: the accountant of what is recorded now."""
        full = self.accountant == "auto" and all(e["sample_rate"] == 1.0 for _, e, _ in self._events)
        return "pld" if full else "rdp"

    @property
    def private(self) -> bool:
        return self.target_epsilon != float("inf")

    @property
    def stages(self) -> List[Dict[str, Any]]:
        """Per stage: name, noise multiplier, event (sampling, n, B), releases recorded (a copy)."""
        return [dict(s) for s in self._stages]

    @staticmethod
    def _event(sampling: str, dataset_size: int, batch_size: Optional[int]) -> Dict[str, Any]:
        if sampling not in _SAMPLINGS:
            raise ValueError(f"sampling must be one of {list(_SAMPLINGS)}, got {sampling!r}")
        n = check_int(dataset_size, "dataset_size", 1)
        if sampling == "full":
            return dict(sample_rate=1.0, sampling="without_replacement", dataset_size=n, batch_size=n)
        b = check_int(batch_size, "batch_size", 1)
        if b > n:
            raise ValueError(f"batch_size must be <= dataset_size = {n}, got {b}")
        return dict(sample_rate=b / n, sampling="without_replacement", dataset_size=n, batch_size=b)

    def epsilon(self, delta: Optional[float] = None) -> float:
        """ε of everything recorded so far at δ (default: the run's δ); 0.0 before any release, inf non-private."""
        if not self.private:
            return float("inf")
        delta = self.delta if delta is None else check_delta(delta)
        return 0.0 if not self._events else float(self._accountant_of(self._events).get_epsilon(delta))

    def _epsilon_with(self, z: float, event: Dict[str, Any], steps: int) -> float:
        return float(self._accountant_of(self._events + [(z, event, steps)]).get_epsilon(self.delta))

    def calibrate(self, steps: int, *, sampling: str = "without_replacement", dataset_size: int,
                  batch_size: Optional[int] = None, epsilon: Optional[float] = None, tol: float = 1e-3) -> float:
        """The smallest noise multiplier z (within ``tol``, rounded up) such that the releases recorded so far and
        ``steps`` more of this event compose to at most ``epsilon`` (default: the run's ε). Records nothing.

        Raises:
            ValueError: a bad event, ε beyond the run's, a target already exceeded by what is recorded, or no
                z <= 1e4 reaching it.
        """
        if not self.private:
            raise ValueError("a non-private run (epsilon=inf) has no noise to calibrate")
        steps = check_int(steps, "steps", 1)
        event = self._event(sampling, dataset_size, batch_size)
        eps = self.target_epsilon if epsilon is None else check_epsilon(epsilon, "epsilon")
        if eps > self.target_epsilon:
            raise ValueError(f"epsilon={eps!r} exceeds the run's epsilon {self.target_epsilon!r}")
        if self.epsilon() >= eps:
            raise ValueError(f"the releases recorded so far already spend ε = {self.epsilon():.4g} >= {eps!r}")
        tol = check_positive(tol, "tol")
        lo, hi = 1e-2, 1.0
        while self._epsilon_with(hi, event, steps) > eps:
            lo, hi = hi, hi * 2.0
            if hi > 1e4:
                raise ValueError(f"no noise multiplier <= 1e4 keeps {steps} more releases within ε = {eps!r}")
        if self._epsilon_with(lo, event, steps) <= eps:
            raise ValueError(f"ε = {eps!r} is met even at z = {lo} (no privacy to speak of): raise the steps or "
                             f"lower ε")
        while hi - lo > tol:
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if self._epsilon_with(mid, event, steps) > eps else (lo, mid)
        return hi

    def record(self, stage: str, noise_multiplier: float, num_steps: int = 1, *,
               sampling: str = "without_replacement", dataset_size: int, batch_size: Optional[int] = None) -> None:
        """Record ``num_steps`` releases of ``stage`` BEFORE they happen.

        Raises:
            BudgetExceededError: they would exceed the run's ε (nothing is recorded: release nothing).
            ValueError: a bad noise multiplier or event.
        """
        if not self.private:
            return
        z = check_positive(noise_multiplier, "noise_multiplier")
        num_steps = check_int(num_steps, "num_steps", 1)
        event = self._event(sampling, dataset_size, batch_size)
        after = self._epsilon_with(z, event, num_steps)
        if after > self.target_epsilon * (1 + 1e-9):
            raise BudgetExceededError(f"{num_steps} more release(s) of {stage!r} (z = {z:.4g}) would bring ε to "
                                      f"{after:.4g} > {self.target_epsilon!r}; nothing was released")
        self._events.append((z, event, num_steps))
        for s in self._stages:
            if s["stage"] == stage and s["noise_multiplier"] == z and s["event"] == event:
                s["releases"] += num_steps
                return
        self._stages.append(dict(stage=stage, noise_multiplier=z, event=event, releases=num_steps))

    def epsilon_by_stage(self, delta: Optional[float] = None) -> List[float]:
        """How the run's ε was spent: for each stage of :attr:`stages` (in the order first recorded), the composed ε
        at δ (default: the run's δ) of that stage and every stage before it, in the accountant of the whole run
        (:attr:`accountant_used`); the last is :meth:`epsilon`. The differences are each stage's increment of the
        composed ε, not its ε alone (ε does not add up under composition).

        Returns:
            one float per stage, non-decreasing ([] before any release; inf each for a non-private run).
        """
        if not self.private:
            return [float("inf")] * len(self._stages)
        delta = self.delta if delta is None else check_delta(delta)
        full = self.accountant_used == "pld"
        acc, out = PrivacyAccountant("pld" if full else "rdp"), []
        for s in self._stages[:-1]:
            if full:
                acc.step(s["noise_multiplier"], sample_rate=1.0, num_steps=s["releases"])
            else:
                acc.step(s["noise_multiplier"], num_steps=s["releases"], **s["event"])
            out.append(float(acc.get_epsilon(delta)))
        return out + [self.epsilon(delta)] if self._stages else []

    def state_dict(self) -> Dict[str, Any]:
        """The run's ε, δ, stages and accountant (plain Python types)."""
        return dict(epsilon=self.target_epsilon, delta=self.delta, stages=self.stages,
                    accountant=self.accountant_used)
