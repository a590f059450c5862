"""Batch samplers that do exactly what the accountant assumes.

* :class:`PoissonSampler` — each of the n rows is included independently with probability q (the
  ``sampling="poisson"`` events of :class:`~fastdpot.privacy.PrivacyAccountant`, add/remove neighbours);
* :class:`FixedSizeSampler` — a uniformly random subset of exactly B of the n rows, drawn afresh at every call
  (the ``sampling="without_replacement"`` events, substitution neighbours).

Neither ever replays an epoch or cycles over a DataLoader (the ``itertools.cycle`` bug of the DPSWflow authors' code).

Every ``sample()`` is bounded (about a second at most on one core): the sizes whose draw would take longer are
refused when the sampler is built, naming the range (:data:`MAX_POISSON_ROWS`, :data:`MAX_FIXED_BATCH`,
:data:`MAX_REPLAYABLE_ROWS`).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .._validate import check_int, check_probability
from .randomness import PrivacyRandomness, privacy_randomness

__all__ = ["PoissonSampler", "FixedSizeSampler", "MAX_POISSON_ROWS", "MAX_FIXED_BATCH", "MAX_REPLAYABLE_ROWS"]

_BITS = 53
#: Most rows a Poisson batch is drawn from: one 53-bit inclusion test per row and per call (2^24 rows: about 1 s
#: from the OS, 0.15 s replayable, 128 MiB of draws).
MAX_POISSON_ROWS = 2 ** 24
#: Largest fixed-size batch in secure mode: a partial Fisher--Yates shuffle, one ``secrets.randbelow`` per row
#: (2^20 rows: about 1.5 s).
MAX_FIXED_BATCH = 2 ** 20
#: Most rows of a replayable fixed-size sampler: ``randperm(n)`` draws a permutation of all n rows per call.
MAX_REPLAYABLE_ROWS = 2 ** 24


def _check_size(v: int, limit: int, name: str, why: str) -> int:
    if v > limit:
        raise ValueError(f"{name}={v} is beyond what one sample() draws in bounded time ({why}): {name} must be in "
                         f"[1, {limit}] (2^{limit.bit_length() - 1}); subsample the data set first, or split it")
    return v


def _source(generator, secure_mode) -> PrivacyRandomness:
    """The sampler's randomness: a :class:`PrivacyRandomness` given as ``generator`` is used as is; otherwise the
    rule of :func:`~fastdpot.privacy.randomness.privacy_randomness` (a ``torch.Generator`` needs
    ``secure_mode=False``)."""
    if isinstance(generator, PrivacyRandomness):
        return generator
    return privacy_randomness(secure_mode, generator)


class PoissonSampler:
    """Poisson subsampling: row i is in the batch with probability q, independently of every other row and step.

    The inclusion test is ``U_i < floor(q·2^53)`` on integers ``U_i`` uniform in ``[0, 2^53)``, so the inclusion
    probability is exactly ``floor(q·2^53)/2^53 ∈ (q − 2^-53, q]`` — never above the rate the accountant is told
    (a float32 ``rand() < q`` can exceed q by up to 2^-24).

    Args:
        num_samples: n ≥ 1, the size of the private data set.
        sample_rate: q in (0, 1].
        generator: ``None``, a :class:`~fastdpot.privacy.randomness.PrivacyRandomness`, or (with
            ``secure_mode=False`` only) a ``torch.Generator`` that makes the batches replayable.
        secure_mode: True (default): the inclusion tests use OS randomness (secret, not replayable).

    Shape:
        ``sample()`` -> LongTensor (|B|,) of sorted row indices, |B| ~ Binomial(n, q) (possibly empty).

    Raises:
        ValueError: n < 1 or n > :data:`MAX_POISSON_ROWS` (2^24), q outside (0, 1], generator not a torch.Generator,
            a generator with secure_mode=True.
    """

    def __init__(self, num_samples: int, sample_rate: float, generator: Optional[torch.Generator] = None, *,
                 secure_mode: bool = True):
        self.num_samples = _check_size(check_int(num_samples, "num_samples", 1), MAX_POISSON_ROWS, "num_samples",
                                       "one inclusion test per row")
        self.sample_rate = check_probability(sample_rate, "sample_rate")
        self._rng = _source(generator, secure_mode)
        self._threshold = math.floor(self.sample_rate * 2 ** _BITS)
        if self._threshold == 0:
            raise ValueError(f"sample_rate must be >= 2^-53, got {sample_rate!r}")

    @property
    def expected_batch_size(self) -> float:
        """n·q, the expected number of rows per Poisson batch."""
        return self.num_samples * self.sample_rate

    def sample(self) -> torch.Tensor:
        """A fresh Poisson batch (indices into the data set)."""
        if self.sample_rate == 1.0:
            return torch.arange(self.num_samples)
        u = self._rng.uniform_int53(self.num_samples)
        return torch.nonzero(u < self._threshold, as_tuple=False).flatten()

    def __iter__(self):
        while True:
            yield self.sample()


class FixedSizeSampler:
    """Uniform sampling of exactly B of the n rows without replacement, fresh at every call.

    Each call draws a new uniformly random B-subset (:meth:`PrivacyRandomness.subset`), independent of all previous
    calls — the "sampled without replacement" event of dp-accounting (Wang, Balle & Kasiviswanathan 2019), which is
    accounted with substitution (replace-one) neighbours. ``sample_rate = B/n``.

    Args:
        num_samples: n ≥ 1.
        batch_size: 1 ≤ B ≤ n.
        generator: ``None``, a :class:`~fastdpot.privacy.randomness.PrivacyRandomness`, or (with
            ``secure_mode=False`` only) a ``torch.Generator`` that makes the batches replayable.
        secure_mode: True (default): the subsets come from OS randomness (secret, not replayable).

    Shape:
        ``sample()`` -> LongTensor (B,) of distinct row indices in random order.

    Raises:
        ValueError: n < 1, B outside [1, n], B > :data:`MAX_FIXED_BATCH` (2^20) in secure mode, n >
            :data:`MAX_REPLAYABLE_ROWS` (2^24) in replayable mode, generator not a torch.Generator, a generator with
            secure_mode=True.
    """

    def __init__(self, num_samples: int, batch_size: int, generator: Optional[torch.Generator] = None, *,
                 secure_mode: bool = True):
        self.num_samples = check_int(num_samples, "num_samples", 1)
        self.batch_size = check_int(batch_size, "batch_size", 1)
        if self.batch_size > self.num_samples:
            raise ValueError(f"batch_size must be <= num_samples = {self.num_samples}, got {batch_size!r}")
        self._rng = _source(generator, secure_mode)
        if self._rng.secure_mode:
            _check_size(self.batch_size, MAX_FIXED_BATCH, "batch_size", "one secret draw per batch row")
        else:
            _check_size(self.num_samples, MAX_REPLAYABLE_ROWS, "num_samples",
                        "a replayable batch is a prefix of a permutation of every row")

    @property
    def sample_rate(self) -> float:
        """q = B/n, the sample rate the accountant is given for this fixed-size sampler."""
        return self.batch_size / self.num_samples

    def sample(self) -> torch.Tensor:
        """A fresh uniformly random subset of size B."""
        return self._rng.subset(self.num_samples, self.batch_size)

    def __iter__(self):
        while True:
            yield self.sample()
