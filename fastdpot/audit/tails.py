"""A tail test on the privacy noise itself: does each of fastdpot's Gaussian noise sources put the normal law's mass
beyond 3, 3.5, 4 and 4.5 standard deviations?

A release audit (:func:`fastdpot.audit.audit_mechanism`) bounds ε from below through the outputs of a mechanism; a
noise source whose tails were cut (a truncated or clamped normal) only shows there when the cut removes more than δ
of mass near the neighbours' shift. This test looks at the noise directly: it draws n standard normals from a source
and, for each threshold t, compares the count of ``|Z| > t`` with Binomial(n, 2Φ(−t)). A source that truncates,
clamps or under-scales its noise puts too little mass there; the one-sided p-value P(Binomial ≤ observed) is
Bonferroni-corrected over the thresholds and the source is flagged below ``alpha``.

Its resolution is the draws: with n = 10^6 the expected counts are 2700, 465, 63 and 6.8 beyond 3, 3.5, 4 and 4.5σ,
so a cut at or below 4σ is flagged, and one at 5.7σ (float32 ``torch.randn``, tail mass 1.2e-8) or 8.9σ (the C++
kernels' single-precision ``fill_normal_fast``) is far beyond any sampling test: those reaches are argued in
docs/privacy.md, not tested here. The secure sources are drawn in secure mode (secret OS keys): this test, unlike
the release audit, needs no replay.

References:
    Clopper & Pearson, Biometrika 1934 (exact binomial tails, via ``scipy.stats.binom``); Mironov, "On significance
    of the least significant bits for differential privacy", CCS 2012 (why the noise's support matters).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

import torch
from scipy.stats import binom

from .._validate import check_int, check_probability

__all__ = ["TailResult", "tail_test", "NOISE_SOURCES", "TAIL_THRESHOLDS", "run_tail_case"]

TAIL_THRESHOLDS = (3.0, 3.5, 4.0, 4.5)
_TRUNCATION = 3.0  # the broken variant's cut, as the release audit's (fastdpot.audit._noise.TRUNCATION)


@dataclass(frozen=True)
class TailResult:
    """Outcome of :func:`tail_test`.

    Attributes:
        source, variant: what was drawn. draws: n. thresholds: t (standard deviations).
        observed, expected: counts of |Z| > t and their expectation n·2Φ(−t).
        p_value: the smallest Bonferroni-corrected one-sided p-value P(Binomial(n, 2Φ(−t)) <= observed).
        alpha: the level. flagged: ``p_value < alpha`` (too little tail mass: truncated, clamped or under-scaled).
        max_abs: the largest |Z| drawn.
    """
    source: str
    variant: str
    draws: int
    thresholds: Tuple[float, ...]
    observed: Tuple[int, ...]
    expected: Tuple[float, ...]
    p_value: float
    alpha: float
    flagged: bool
    max_abs: float


def tail_test(z: torch.Tensor, alpha: float = 1e-4, thresholds: Tuple[float, ...] = TAIL_THRESHOLDS,
              source: str = "custom", variant: str = "correct") -> TailResult:
    """Tail test of draws ``z`` that should be standard normal (module docstring).

    Shape:
        z: any shape, n = z.numel() >= 1000 draws (flattened; float64 recommended).

    Raises:
        ValueError: fewer than 1000 draws, non-finite draws, ``alpha`` outside (0, 1), an empty or non-positive
            threshold list.
    """
    z = torch.as_tensor(z).detach().reshape(-1).to("cpu", torch.float64)
    n = z.numel()
    if n < 1000:
        raise ValueError(f"tail_test needs at least 1000 draws, got {n}")
    if not bool(torch.isfinite(z).all()):
        raise ValueError("tail_test draws must be finite")
    alpha = check_probability(alpha, "alpha", low_open=True, high_open=True)
    if not thresholds or any(not t > 0 for t in thresholds):
        raise ValueError(f"thresholds must be positive standard deviations, got {thresholds!r}")
    a = z.abs()
    obs = tuple(int((a > t).sum()) for t in thresholds)
    probs = [math.erfc(t / math.sqrt(2.0)) for t in thresholds]  # P(|Z| > t) = 2Φ(−t)
    pv = min(min(1.0, len(thresholds) * float(binom.cdf(o, n, p))) for o, p in zip(obs, probs))
    return TailResult(source, variant, n, tuple(float(t) for t in thresholds), obs, tuple(n * p for p in probs),
                      pv, alpha, pv < alpha, float(a.max()))


def _python_source(n: int) -> torch.Tensor:
    """:meth:`fastdpot.privacy.randomness.PrivacyRandomness.normal` in secure mode: the noise of every Python
    mechanism (projection, local, DP-Sinkhorn's sanitiser, the DP-SW reference, the sharded flow's release)."""
    from ..privacy.randomness import PrivacyRandomness

    return PrivacyRandomness(True).normal((n,))


def _flow_step_source(backend: str) -> Callable[[int], torch.Tensor]:
    """The private rows' noise of op ``flow_step`` on ``backend`` (C++ ``fill_normal_fast``, the reference's keyed
    Philox normals), read back with ``return_noise=True`` from one call on n/k rows with a secret OS key."""
    def draw(n: int) -> torch.Tensor:
        from ..ops import flow_step
        from ..privacy.randomness import PrivacyRandomness

        k, d = 8, 3
        m = -(-n // k)
        dtype = torch.float64 if backend == "reference" else torch.float32
        theta = torch.nn.functional.normalize(torch.randn(k, d, generator=torch.Generator().manual_seed(0),
                                                          dtype=torch.float64), dim=1).to(dtype)
        parts = torch.zeros(2, d, dtype=dtype)
        rows = torch.zeros(m, d, dtype=dtype)
        _, _, noise = flow_step(parts, rows, theta, noise_std=1.0, step_size=0.5, seed=PrivacyRandomness(True).seed(),
                                return_noise=True, backend=backend)
        return noise["private"].double().reshape(-1)[:n]
    return draw


#: name -> (backend the source needs, draw(n) -> n standard normals)
NOISE_SOURCES: Dict[str, Tuple[str, Callable[[int], torch.Tensor]]] = {
    "privacy_normal": ("reference", _python_source),
    "flow_step_reference": ("reference", _flow_step_source("reference")),
    "flow_step_cpu": ("cpu", _flow_step_source("cpu")),
}


def run_tail_case(source: str, variant: str = "correct", draws: int = 10 ** 6, alpha: float = 1e-4) -> TailResult:
    """Draw ``draws`` normals from ``source`` (:data:`NOISE_SOURCES`) and test their tails; ``variant="truncated"``
    cuts them at 3σ first (the negative control: it must be flagged).

    Raises:
        ValueError: unknown source or variant, draws < 1000.
        fastdpot.BackendUnavailableError: the source's backend is not available here.
    """
    from .._validate import check_choice

    check_choice(source, "source", tuple(NOISE_SOURCES))
    check_choice(variant, "variant", ("correct", "truncated"))
    draws = check_int(draws, "draws", 1000)
    backend, draw = NOISE_SOURCES[source]
    if backend != "reference":
        from .._dispatch import available_backends
        from .._ext import BackendUnavailableError
        import fastdpot.ops  # noqa: F401  (registers op flow_step)

        ok, reason = available_backends("flow_step").get(backend, (False, f"no {backend!r} backend"))
        if not ok:
            raise BackendUnavailableError(f"noise source {source!r} needs the {backend!r} backend: {reason}")
    z = draw(draws)
    if variant == "truncated":
        z = z[z.abs() <= _TRUNCATION]  # conditioned on |Z| <= 3: a cut, as the release audit's broken variant
        z = torch.cat([z, z[: draws - z.numel()]]) if z.numel() < draws else z
    return tail_test(z, alpha=alpha, source=source, variant=variant)
