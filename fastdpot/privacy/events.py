"""The events of the privacy accountant: one (subsampled) Gaussian release, validated, as dp-accounting sees it.

:func:`_make_event` validates a release's noise multiplier, sample rate and sampling; :class:`_Event` turns it into
dp-accounting's event; :func:`_event_rdp` is its RDP vector (cached). Shared by the accountant
(:mod:`fastdpot.privacy.accounting`) and the noise calibration (:mod:`fastdpot.privacy.calibration`); the public names
are re-exported by :mod:`fastdpot.privacy.accounting`, where they are documented.
"""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Tuple

import numpy as np

from .._validate import check_choice, check_int, check_positive, check_probability
from ._lazy import LazyModule

# dp-accounting costs about 1.2 s to import: it is imported on first use, so `import fastdpot` stays light
dp_accounting = LazyModule("dp_accounting")
dp_pld = LazyModule("dp_accounting.pld")
dp_rdp = LazyModule("dp_accounting.rdp")
_calibration = LazyModule("dp_accounting.mechanism_calibration")
_rdp_accountant = LazyModule("dp_accounting.rdp.rdp_privacy_accountant")

__all__ = ["SAMPLINGS", "ACCOUNTANTS", "ADD_REMOVE", "REPLACE_ONE", "PLD_MIN_NOISE_MULTIPLIER", "PLD_MAX_STEPS",
           "PLD_MIN_DISCRETIZATION", "PLD_MAX_EPSILON", "pld_min_noise_multiplier", "check_discretization", "quiet_dp_accounting"]

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
#: Largest ε (the RDP bound at the δ asked) the PLD method computes: beyond, one PLD evaluation takes seconds to
#: minutes (its loss distribution spreads over the whole range: z = 0.1, q = 0.01, 10^6 releases, ε ≈ 5·10^5, 100 s;
#: at RDP ε <= 100 it takes under 0.3 s) and a tighter value than RDP's tells nothing more.
PLD_MAX_EPSILON = 100.0
#: Finest ``value_discretization_interval`` an accountant takes: one PLD evaluation costs about 1/interval (z = 1,
#: q = 0.01, 10^6 releases: 0.14 s at 1e-3, 1.3 s at 1e-4, 24 s at 1e-5 on one core).
PLD_MIN_DISCRETIZATION = 1e-4
_PLD_REFERENCE_DISCRETIZATION = 1e-3


def pld_min_noise_multiplier(value_discretization_interval: float) -> float:
    """The smallest noise multiplier PLD accounts at this discretisation interval: :data:`PLD_MIN_NOISE_MULTIPLIER`
    at 1e-3 and coarser, ``0.1·sqrt(1e-3 / interval)`` finer (the cost of one evaluation grows as the privacy loss's
    span, about 1/(2z²), over the interval: the bound keeps it that of z = 0.1 at 1e-3, about 2 s at worst)."""
    return PLD_MIN_NOISE_MULTIPLIER * math.sqrt(max(1.0, _PLD_REFERENCE_DISCRETIZATION / value_discretization_interval))


def check_discretization(v, name: str = "value_discretization_interval") -> float:
    """A PLD discretisation interval in [:data:`PLD_MIN_DISCRETIZATION`, inf) (refused before any evaluation)."""
    v = check_positive(v, name)
    if v < PLD_MIN_DISCRETIZATION:
        raise ValueError(f"{name}={v!r} is finer than PLD_MIN_DISCRETIZATION = {PLD_MIN_DISCRETIZATION}: one PLD "
                         f"evaluation would take tens of seconds to hours; use an interval >= "
                         f"{PLD_MIN_DISCRETIZATION} (1e-3, the default, is within 0.002 of it in ε)")
    return v


class _NonConvergence(logging.Filter):
    """Drops dp-accounting's "failed to converge" warnings (logger ``absl``) and counts them."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "failed to converge" in str(record.msg):
            self.count += 1
            return False
        return True


@contextlib.contextmanager
def quiet_dp_accounting():
    """Every call into dp-accounting's RDP runs inside this: its absl WARNING "_compute_log_a_frac failed to
    converge ... Excluding this order from the epsilon computation" (one line per RDP order whose series does not
    converge: a small z with Poisson sampling at fractional orders near 1, 84 lines in one DP-Sinkhorn run) is
    dropped. Nothing is lost: dp-accounting then sets that order's RDP to inf, so ε is the minimum over the other
    orders, still a valid bound; how many were dropped goes to logger ``fastdpot.privacy`` at DEBUG level."""
    quiet = _NonConvergence()
    absl = logging.getLogger("absl")
    absl.addFilter(quiet)
    try:
        yield quiet
    finally:
        absl.removeFilter(quiet)
        if quiet.count:
            logging.getLogger("fastdpot.privacy").debug(
                "dp-accounting: %d RDP order(s) did not converge and were left out (ε is the minimum over the "
                "others, a valid bound)", quiet.count)


def _relation(name: str):
    """dp-accounting's NeighboringRelation of ``name``."""
    rel = dp_accounting.NeighboringRelation
    return {ADD_REMOVE: rel.ADD_OR_REMOVE_ONE, REPLACE_ONE: rel.REPLACE_ONE}[name]


@lru_cache(maxsize=None)
def _default_orders() -> Tuple[float, ...]:
    """dp-accounting's default RDP orders, extended below 1.1 and up to 4096 (cf. TF-privacy / DP-Sinkhorn:
    1.25..4096): ``fastdpot.privacy.accounting.DEFAULT_ORDERS``, computed on first access (it needs dp-accounting's
    list)."""
    return tuple([1.01, 1.02, 1.05] + list(_rdp_accountant.DEFAULT_RDP_ORDERS) + [2048, 4096])


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
    with quiet_dp_accounting():
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
