"""Noise calibration: the smallest noise multiplier z whose T releases stay within a target (ε, δ).

:func:`calibrate_noise_multiplier` searches z in [:data:`Z_MIN`, :data:`Z_MAX`] on the events of
:mod:`fastdpot.privacy.events`, so that an accountant (:class:`fastdpot.privacy.PrivacyAccountant`) recording those
releases reports at most the target. Re-exported by :mod:`fastdpot.privacy.accounting` and :mod:`fastdpot.privacy`.

Bounded by construction: a target outside the reachable range (the ε of :data:`Z_MAX` and :data:`Z_MIN`) is refused
after at most three accountant evaluations, naming that range; a reachable one is found with a bounded number of
evaluations, and a search that lasts over a second shows a progress line (:mod:`fastdpot._progress`).

What an evaluation costs: one RDP evaluation of dp-accounting over the 161 default orders takes 0.04 s for Poisson
sampling and 0.2 s (quiet Intel core) to 0.7 s (2-core AMD EPYC) for sampling without replacement, almost all of it
in the per-order RDP (an integer order α costs O(α²) there, up to α = 256). So the RDP search runs on
:data:`_SEARCH_ORDERS`, 27 of the default orders up to 32 (about 1/25 of the cost), and every default order is
computed once, at the search's result z (:func:`_rdp_calibrate`): where no other order meets the target there, z is
the accountant's smallest z too; where some do, those predicted to meet it at the smallest z join the search, which
runs again (then once more on every order, the search of earlier versions, if that is not enough). ε is the minimum
over the orders of each order's own ε, and an order's RDP is the same number whatever the others, so a z found on a
subset of the orders meets the target for the accountant's orders too: privacy never rests on the subset, only the
search's speed does. The one full evaluation is of one release's RDP vector at z, which an accountant of the
calibrated releases reuses (:func:`fastdpot.privacy.events._event_rdp`, cached).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, Optional

from .._validate import (check_bool, check_choice, check_delta, check_epsilon, check_int, check_nonnegative,
                         check_positive)
from .events import (ACCOUNTANTS, ADD_REMOVE, PLD_MAX_EPSILON, PLD_MAX_STEPS, PLD_MIN_NOISE_MULTIPLIER, _calibration,
                     _default_orders, _Event, _event_rdp, _make_event, _relation, _relation_of, check_discretization,
                     dp_accounting, dp_pld, dp_rdp, pld_min_noise_multiplier, quiet_dp_accounting)

__all__ = ["calibrate_noise_multiplier", "calibration_tolerance", "Z_MIN", "Z_MAX"]

#: The noise multipliers the calibration searches: a target met already at ``Z_MIN`` buys no privacy, one missed
#: still at ``Z_MAX`` is unreachable; both are refused naming the reachable range of ε.
Z_MIN, Z_MAX = 1e-2, 1e6
#: Up to this z the search runs on the bracket [2^(k-1), 2^k] that doubling from 1 finds (hence z as in earlier
#: versions; the power is guessed first); above, on (64, ``Z_MAX``] (a handful of evaluations, not one per doubling).
_DOUBLING_END = 64.0
#: Relative tolerance on large z: ``tol`` is absolute up to z = tol / _REL_TOL (100 for the default tol).
_REL_TOL = 1e-5
#: The progress line appears when a calibration runs longer than this (seconds).
_PROGRESS_DELAY_S = 1.0
#: The RDP orders the search evaluates (module docstring): the three lowest (where ε drops to 0, the KL bound), then
#: spaced about 10 % to 25 % apart up to 32, where the optimal order of targets from about 1 to 10 lies at the usual
#: T (ε = 5 over 10^12 steps: 6; ε = 1 over 1000 steps at q = 0.01: 17; ε = 0.1 there: above 100). The others join
#: the search only where they meet the target at its result.
_SEARCH_ORDERS = (1.01, 1.02, 1.05, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0,
                  12, 14, 16, 20, 24, 28, 32)
#: Of the default orders that meet the target at the search's result, this many (those predicted to meet it at the
#: smallest z) join the search with their neighbours in the default orders, before it runs again.
_JOINING_ORDERS = 3


def calibration_tolerance(z: float, tol: float = 1e-3) -> float:
    """The precision of a calibrated z: ``max(tol, 1e-5·z)`` (``tol`` absolute below z = 100 with the default
    1e-3, relative above). The returned z meets the target; z − ``calibration_tolerance(z, tol)`` may too."""
    return max(float(tol), _REL_TOL * float(z))


class _Evaluations:
    """ε(z) of ``steps`` releases, each z computed once (dp-accounting's Brent asks for its bracket's ends and its
    root again), counted and shown on a progress line once the search has run for a second."""

    def __init__(self, fresh: Callable, event_of: Callable, delta: float, bar):
        self.fresh, self.event_of, self.delta, self.bar = fresh, event_of, delta, bar
        self.values: Dict[float, float] = {}

    def __call__(self, z: float) -> float:
        z = float(z)
        if z not in self.values:
            acc = self.fresh()
            acc.compose(self.event_of(z))
            self.values[z] = float(acc.get_epsilon(self.delta))
            self.bar.update(1)
            self.bar.set_postfix(z=f"{z:.6g}", eps=f"{self.values[z]:.4g}")
        return self.values[z]

    def accountant(self):
        """A fresh-accountant stand-in for dp-accounting's ``calibrate_dp_mechanism`` (its events are the z)."""
        return _MemoAccountant(self)


class _MemoAccountant:
    def __init__(self, evaluations: _Evaluations):
        self.ledger = dp_accounting.NoOpDpEvent()  # what calibrate_dp_mechanism checks: a fresh accountant
        self._evaluations, self._z = evaluations, None

    def compose(self, z, count: int = 1):
        self._z = z
        return self

    def get_epsilon(self, delta: float) -> float:
        return self._evaluations(self._z)


def _brent(evaluations: _Evaluations, eps: float, delta: float, lo: float, hi: float, tol: float) -> float:
    """dp-accounting's calibration (Brent's method) of z in [lo, hi] to absolute ``tol``, on ``evaluations``."""
    return float(_calibration.calibrate_dp_mechanism(evaluations.accountant, lambda z: z, eps, delta,
                                                     bracket_interval=_calibration.ExplicitBracketInterval(lo, hi),
                                                     tol=tol))


def _large_z_search(ev: Callable[[float], float], eps: float, lo: float, hi: float, tol: float,
                    zero_at: Callable[[float], bool]) -> float:
    """The smallest z in (lo, hi] with ``ev(z) <= eps``, to within :func:`calibration_tolerance`, given
    ``ev(lo) > eps >= ev(hi)``.

    For large z the releases' ε falls as c/z, so Brent's method (scipy's ``brentq``) on log ε against log z, nearly
    linear, takes a few evaluations. dp-accounting reports ε = 0 as soon as one RDP order is below δ² (the
    KL bound: the releases are (0, δ)-DP), a jump from a small positive ε: a target below that jump is met first at
    the jump, which ``zero_at`` (ε = 0 from the orders where the RDP is smallest: milliseconds) locates by
    bisection; the full ε is then asked on either side of it (and Brent runs as above if the jump is elsewhere).
    """
    from scipy import optimize

    if ev(hi) == 0:  # the target may be below the jump to ε = 0: find the jump first
        a, b = lo, hi
        while b - a > calibration_tolerance(b, tol):
            mid = math.sqrt(a * b) if b / a > 2.0 else 0.5 * (a + b)
            a, b = (a, mid) if zero_at(mid) else (mid, b)
        below = max(b - calibration_tolerance(b, tol), lo)
        if ev(b) <= eps and (below <= lo or ev(below) > eps):
            return b
        if ev(b) <= eps:
            hi = below  # the target is met below the jump, where ε is continuous
    ends = {math.log(lo): lo, math.log(hi): hi}  # the bracket's ends, known: not recomputed through exp(log z)

    def gap(u):
        return math.log(max(ev(ends.get(u, math.exp(u))), 1e-300) / eps)

    root = ends.get(u := optimize.brentq(gap, math.log(lo), math.log(hi), xtol=_REL_TOL / 2), math.exp(u))
    step = calibration_tolerance(root, tol)
    for z in (root, min(root + step, hi)):
        if ev(z) <= eps:
            return z
    lo = root + step  # the target is missed up to here: bisect to the feasible end
    while hi - lo > calibration_tolerance(hi, tol):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ev(mid) > eps else (lo, mid)
    return hi


def _rdp_calibrate(eps, delta, steps, proto, rel, event_of, tol, bar) -> float:
    """The RDP calibration: :func:`_rdp_search` on :data:`_SEARCH_ORDERS`, then every default order at its result z
    (and, where some meet the target there, at z less the tolerance); where some still meet it, the
    :data:`_JOINING_ORDERS` predicted to meet it at the smallest z join the search with their neighbours, and it runs
    again, and once more on every order if that is not enough (module docstring). Its refusals are made on every
    order."""
    orders = _default_orders()
    relation = _relation_of(proto) or ADD_REMOVE

    def evaluations(subset):
        return _Evaluations(lambda: dp_rdp.RdpAccountant(orders=list(subset), neighboring_relation=rel), event_of,
                            delta, bar)

    def meeting(z, candidates):
        """``{order: (T·RDP, ε)}`` of the ``candidates`` that meet the target at z: one release's RDP vector over
        them (over every order: the vector an accountant of these releases computes, and finds cached) times T."""
        one = _Event(float(z), proto.sample_rate, proto.sampling, proto.dataset_size, proto.batch_size)
        bar.update(1)
        rdp = steps * _event_rdp(one, relation, tuple(candidates))
        return {a: (r, e) for a, r in zip(candidates, rdp) if (e := _order_epsilon(a, r, delta)) <= eps}

    full = evaluations(orders)
    search = tuple(o for o in orders if o in _SEARCH_ORDERS)
    for _ in range(2):
        z = _rdp_search(evaluations(search), full, eps, delta, steps, tol, rel)
        found = {a: v for a, v in meeting(z, orders).items() if a not in search}
        predicted = {a: _predicted_z(a, *found[a], z, eps, delta) for a in found}
        below = z - calibration_tolerance(z, tol)
        if found and min(predicted.values()) >= below > 0:  # they may meet it within the tolerance only: ask them
            found = meeting(below, found)  # there (orders in (1, 2) share their RDP without replacement, e.g.)
            predicted = {a: _predicted_z(a, *found[a], below, eps, delta) for a in found}
        if not found:  # no other order meets the target below z (each order's ε falls with z): z is the smallest
            return z
        first = sorted(found, key=predicted.get)[:_JOINING_ORDERS]
        near = {orders[j] for a in first for j in range(orders.index(a) - 1, orders.index(a) + 2)
                if 0 <= j < len(orders)}
        search = tuple(o for o in orders if o in near or o in search)
    return _rdp_search(full, full, eps, delta, steps, tol, rel)


def _order_epsilon(order: float, rdp: float, delta: float) -> float:
    """ε of one RDP order at δ: dp-accounting's conversion (what its accountant minimises over the orders)."""
    return float(dp_rdp.compute_epsilon([order], [rdp], delta)[0])


def _predicted_z(order: float, rdp: float, epsilon: float, at: float, eps: float, delta: float) -> float:
    """Where ``order`` would meet the target ``eps``, predicted from its T·RDP ``rdp`` (and ε ``epsilon`` <= ``eps``)
    at z = ``at`` with RDP ∝ 1/z² (the Gaussian's, the large-z behaviour of the subsampled ones): bisection on log z,
    arithmetic only. Ranks the orders that join the search; nothing is released at a predicted z."""
    if not rdp > 0:  # ε = 0 at every z (dp-accounting reads a negative RDP, rounding's, as ε = 0, and warns)
        return Z_MIN
    lo, hi = math.log(Z_MIN), math.log(at)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if _order_epsilon(order, rdp * (at / math.exp(mid)) ** 2, delta) <= eps else (mid, hi)
    return math.exp(hi)


def _rdp_search(rdp: _Evaluations, full: _Evaluations, eps: float, delta: float, steps: int, tol: float,
                rel) -> float:
    """The smallest z (to :func:`calibration_tolerance`) whose ε on ``rdp``'s orders meets the target: doubling from
    1 and Brent's method up to z = 64, :func:`_large_z_search` above. ε on a subset of the orders is at least the
    accountant's (``full``: every default order), so a z found meets the target for the accountant too; a
    refusal, and the reachable range it names, are decided on ``full``: a target that ``rdp``'s orders cannot reach
    below :data:`Z_MAX` but the accountant's can returns :data:`Z_MAX` (the caller's check of every order widens
    the search).
    """
    where = f"at delta={delta!r} over {steps} steps"

    def reachable():
        """The reachable range, for the refusals (two more evaluations at most: known values are reused)."""
        return (f"the reachable targets for these settings are {full(Z_MAX):.4g} <= target_epsilon < "
                f"{full(Z_MIN):.4g} (noise multipliers {Z_MIN} to {Z_MAX:g})")

    # bracket: [2^(k-1), 2^k] with ε(2^(k-1)) > target >= ε(2^k), z = 1 and below as [Z_MIN, 1] (Z_MIN is
    # asked only when z = 1 meets the target); up to z = 64 Brent then runs on the bracket of doubling from 1
    lo, hi = Z_MIN, 1.0
    if rdp(hi) <= eps and rdp(lo) <= eps:  # on a subset of the orders: then on all of them too
        raise ValueError(f"target_epsilon={eps!r} is unreachable by the calibration: even the smallest noise "
                         f"multiplier it searches, z = {Z_MIN}, spends only ε = {full(lo):.4g} <= target {where}, so "
                         f"the target buys essentially no privacy; {reachable()}: use a smaller target_epsilon or "
                         f"pass a noise multiplier directly")
    if rdp(hi) > eps:  # z > 1: the power of 2 that brackets it, guessed from ε ∝ 1/z (an overestimate at small z)
        hi = 2.0 ** min(max(math.ceil(math.log2(rdp(1.0) / eps)), 1), round(math.log2(_DOUBLING_END)))
        while rdp(hi) > eps and hi < _DOUBLING_END:
            hi *= 2.0
        while rdp(hi) <= eps and hi > 2.0 and rdp(hi / 2.0) <= eps:
            hi /= 2.0
        lo = hi / 2.0  # ε(lo) > target >= ε(hi): the bracket of doubling from 1, with fewer evaluations
    if rdp(hi) > eps:  # z > 64: is the target reachable at all, then a search on log z
        if rdp(Z_MAX) > eps:
            if full(Z_MAX) > eps:
                raise ValueError(f"target_epsilon={eps!r} is unreachable: no noise multiplier <= {Z_MAX:g} reaches "
                                 f"it {where} (ε shrinks with the noise but not below {full(Z_MAX):.4g} at z = "
                                 f"{Z_MAX:g}); {reachable()}: use a larger target_epsilon or fewer steps")
            return Z_MAX  # reachable on other orders only
        low_orders = [_default_orders()[0], 2.0]  # where dp-accounting's RDP is smallest at large z (order 2:
        # the fractional orders' series stop at a floor there)

        def zero_at(z):  # ε = 0 from the low orders alone: where the jump to ε = 0 happens
            acc = dp_rdp.RdpAccountant(orders=low_orders, neighboring_relation=rel)
            return acc.compose(rdp.event_of(z)).get_epsilon(delta) == 0

        return _large_z_search(rdp, eps, hi, Z_MAX, tol, zero_at)
    z = _brent(rdp, eps, delta, lo, hi, tol / 4)
    if rdp(z) > eps:  # Brent returns a value within tol; make it feasible
        z += tol / 4
    return z


def calibrate_noise_multiplier(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                               sampling: str = "poisson", accountant: Optional[str] = None,
                               dataset_size: Optional[int] = None, batch_size: Optional[int] = None,
                               tol: float = 1e-3, value_discretization_interval: float = 1e-3,
                               progress: bool = True, progress_delay: float = _PROGRESS_DELAY_S) -> float:
    """Smallest noise multiplier z (within :func:`calibration_tolerance`) such that ``steps`` releases stay within
    (ε, δ).

    The returned z always satisfies the target: ``get_epsilon(delta) <= target_epsilon`` for an accountant that
    records ``step(z, sample_rate, steps, sampling, ...)`` with the same ``accountant`` method (and, for PLD, the
    same ``value_discretization_interval``). Up to z = 64 the search is dp-accounting's ``calibrate_dp_mechanism``
    (Brent's method on z, bracketed by doubling from 1); above, Brent's method on log z up to :data:`Z_MAX`; the RDP
    search runs on a subset of the orders first (module docstring). For PLD the bracket is first narrowed with the
    faster RDP calibration (RDP needs at least as much noise as PLD).

    Args:
        target_epsilon: ε > 0.
        delta: δ in (0, 1).
        sample_rate: q in (0, 1] (for ``"without_replacement"``, ignored in favour of ``batch_size/dataset_size``
            when left at 1.0).
        steps: number of releases T ≥ 1.
        sampling: ``"poisson"`` or ``"without_replacement"`` (the latter only with ``accountant="rdp"``).
        accountant: ``"pld"``, ``"rdp"`` or ``None`` (what a default :class:`PrivacyAccountant` reports: PLD for
            Poisson / full-batch events, RDP for sampling without replacement).
        tol: absolute tolerance on z (relative 1e-5 above z = tol/1e-5: :func:`calibration_tolerance`).
        progress: show the search's progress on stderr (a bar on a terminal, plain lines otherwise:
            :mod:`fastdpot._progress`), from ``progress_delay`` seconds on (default 1: a calibration that answers
            within a second shows nothing; the flows pass 0 when their run shows progress).

    Cost (module docstring): about 10 RDP evaluations over 27 search orders (each about 1/25 of one over the 161
    default orders: 0.04 s for Poisson, 0.2 s to 0.7 s for sampling without replacement, on one core) and one over
    every order, or twice that where the optimal order is not among the search's (e.g. 17 at ε = 1, T = 1000,
    q = 0.01); a target outside the reachable range is refused after at most three evaluations over every order.

    PLD is searched only within its range (:meth:`PrivacyAccountant.pld_in_range`): a target whose RDP-calibrated
    z is below :data:`PLD_MIN_NOISE_MULTIPLIER` (0.1; ε of several hundred and more for typical q and T), above
    :data:`PLD_MAX_EPSILON` (100), or more than :data:`PLD_MAX_STEPS` steps, is refused at once with
    ``accountant="pld"``; with ``accountant=None`` the RDP
    calibration is returned there (what a default accountant reports outside PLD's range). ``accountant="rdp"``
    serves any reachable target.

    Raises:
        ValueError: any invalid argument; ``accountant="pld"`` with ``sampling="without_replacement"``; a PLD target
            that needs z < :data:`PLD_MIN_NOISE_MULTIPLIER` or more than :data:`PLD_MAX_STEPS` steps; a target
            outside the reachable range, whose ends the message gives: already met at z = :data:`Z_MIN` (no privacy
            to speak of), or missed still at z = :data:`Z_MAX`; a PLD target below what
            ``value_discretization_interval`` resolves.
    """
    eps = check_epsilon(target_epsilon, "target_epsilon")
    delta = check_delta(delta)
    steps = check_int(steps, "steps", 1)
    if accountant is not None:
        check_choice(accountant, "accountant", ACCOUNTANTS)
    accountant_arg = accountant
    tol = check_positive(tol, "tol")
    vdi = check_discretization(value_discretization_interval)
    check_bool(progress, "progress")
    delay = check_nonnegative(progress_delay, "progress_delay")
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
    from .._progress import progress_bar

    what = (f"calibrating the noise multiplier for ε={eps:g}, δ={delta:g} over T={steps} releases "
            f"(q={proto.sample_rate:.4g}"
            f"{', ' + proto.sampling if proto.subsampled else ''}, {accountant.upper()})")
    bar = progress_bar(total=None, desc=what, unit=" evaluations", disable=not progress, delay=delay)
    with bar, quiet_dp_accounting():
        return _calibrate(eps, delta, steps, proto, rel, accountant, accountant_arg, tol, vdi, bar)


def _calibrate(eps, delta, steps, proto, rel, accountant, accountant_arg, tol, vdi, bar) -> float:
    def event_of(z):
        e = _Event(float(z), proto.sample_rate, proto.sampling, proto.dataset_size, proto.batch_size)
        return dp_accounting.SelfComposedDpEvent(e.dp_event(), steps)

    z = _rdp_calibrate(eps, delta, steps, proto, rel, event_of, tol, bar)
    if accountant == "rdp":
        return float(z)
    z_rdp, z_min = float(z), pld_min_noise_multiplier(vdi)
    if (z_rdp < z_min or eps > PLD_MAX_EPSILON) and accountant_arg is None:
        return z_rdp  # a default accountant reports RDP for such an event (outside PLD's range)
    if eps > PLD_MAX_EPSILON:
        raise ValueError(f"target_epsilon={eps!r} is above PLD_MAX_EPSILON = {PLD_MAX_EPSILON:g}, the largest ε the "
                         f"PLD method computes (beyond, an evaluation takes seconds to minutes); calibrate with "
                         f"accountant='rdp' (RDP gives z = {z_rdp:.4g})")
    if z_rdp < z_min:
        raise ValueError(
            f"target_epsilon={eps!r} needs a noise multiplier below {z_min:.3g}, the smallest PLD accounts "
            f"(PLD_MIN_NOISE_MULTIPLIER at value_discretization_interval={vdi!r}; RDP gives z = {z_rdp:.4g}), where a "
            f"PLD evaluation costs minutes; calibrate with accountant='rdp' (and account with "
            f"PrivacyAccountant('rdp')) for such large targets")
    pld = _Evaluations(lambda: dp_pld.PLDAccountant(neighboring_relation=rel, value_discretization_interval=vdi),
                       event_of, delta, bar)
    if pld(z_rdp) > eps:  # RDP's z is feasible for exact PLD; only the PLD discretisation can exceed the target
        raise ValueError(
            f"target_epsilon={eps!r} is unreachable with accountant='pld' and "
            f"value_discretization_interval={vdi!r}: even at the RDP-calibrated z = {z_rdp:.4g} the discretised PLD "
            f"reports ε = {pld(z_rdp):.4g} (a target near or below the discretisation interval cannot be resolved); "
            f"pass a smaller value_discretization_interval or accountant='rdp'")
    lo = 0.8 * z_rdp
    while pld(lo) <= eps:  # never below PLD's range: an accountant would report RDP there
        if lo <= z_min:
            return z_min
        lo = max(0.8 * lo, z_min)
    step = max(tol, _REL_TOL * z_rdp) / 2  # tol/2 up to z = 100 (as before), relative above
    zp = _brent(pld, eps, delta, lo, z_rdp, step)
    if pld(zp) > eps:
        zp = min(zp + step, z_rdp)
    return float(zp)
