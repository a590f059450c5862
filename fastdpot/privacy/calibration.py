"""Noise calibration: the smallest noise multiplier z whose T releases stay within a target (ε, δ).

:func:`calibrate_noise_multiplier` searches z with dp-accounting's calibration (Brent's method) on the events of
:mod:`fastdpot.privacy.events`, so that an accountant (:class:`fastdpot.privacy.PrivacyAccountant`) recording those
releases reports at most the target. Re-exported by :mod:`fastdpot.privacy.accounting` and :mod:`fastdpot.privacy`.
"""
from __future__ import annotations

from typing import Optional

from .._validate import check_choice, check_delta, check_epsilon, check_int, check_positive
from .events import (ACCOUNTANTS, ADD_REMOVE, PLD_MAX_STEPS, PLD_MIN_NOISE_MULTIPLIER, _calibration, _default_orders,
                     _Event, _make_event, _relation, _relation_of, dp_accounting, dp_pld, dp_rdp)

__all__ = ["calibrate_noise_multiplier"]


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
