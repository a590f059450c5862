"""The events of the privacy accountant: one (subsampled) Gaussian release, validated, as dp-accounting sees it.

:func:`_make_event` validates a release's noise multiplier, sample rate and sampling; :class:`_Event` turns it into
dp-accounting's event; :func:`_event_rdp` is its RDP vector (cached). Shared by the accountant
(:mod:`fastdpot.privacy.accounting`) and the noise calibration (:mod:`fastdpot.privacy.calibration`); the public names
are re-exported by :mod:`fastdpot.privacy.accounting`, where they are documented.
"""
from __future__ import annotations

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

__all__ = ["SAMPLINGS", "ACCOUNTANTS", "ADD_REMOVE", "REPLACE_ONE", "PLD_MIN_NOISE_MULTIPLIER", "PLD_MAX_STEPS"]

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
