"""Black-box privacy audit of one release: run M on neighbouring inputs, distinguish, bound ε from below.

For a mechanism M claimed (ε, δ)-DP and neighbouring inputs D, D′, every test that guesses "D′" from one output
has a false-positive rate FPR = P(guess D′ | D) and a false-negative rate FNR = P(guess D | D′) with

.. math::  FPR + e^{ε} FNR \\ge 1 − δ \\quad\\text{and}\\quad FNR + e^{ε} FPR \\ge 1 − δ,

so any upper confidence bounds FPR_hi, FNR_hi give the lower bound

.. math::  ε \\ge \\max\\Big(\\ln\\frac{1 − δ − FNR_{hi}}{FPR_{hi}},\\; \\ln\\frac{1 − δ − FPR_{hi}}{FNR_{hi}}\\Big).

The audit draws ``trials`` outputs on each input, fits the test on the first half (the statistic and its
threshold) and counts its errors on the second half only, so the Clopper–Pearson intervals are over outputs the
test never saw. Each rate gets a one-sided interval at level ``1 − (1 − confidence)/2`` (a union bound), so the
reported ``epsilon_lower`` is a lower bound on the mechanism's ε at δ with probability ≥ ``confidence``.

References:
    Jagielski, Ullman & Oprea, "Auditing Differentially Private Machine Learning: How Private is Private SGD?",
    NeurIPS 2020 (Clopper–Pearson bounds on FPR/FNR -> ε); Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski,
    Carlini & Terzis, "Tight Auditing of Differentially Private Machine Learning", USENIX Security 2023;
    Kairouz, Oh & Viswanath, "The Composition Theorem for Differential Privacy", ICML 2015 (the hypothesis-testing
    inequalities above); Clopper & Pearson, Biometrika 1934 (via ``scipy.stats.beta``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from numbers import Integral, Real
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from scipy.stats import beta as _beta

from .._random import make_generator
from .._validate import check_epsilon, check_int, check_probability

__all__ = ["AuditResult", "audit_mechanism", "clopper_pearson_upper", "epsilon_lower_bound", "STATISTICS"]

# statistics the default test chooses from (on the training half): "projection" = ⟨o, Σ̂⁻¹(μ̂′ − μ̂)⟩ with a diagonal
# Σ̂, the likelihood-ratio statistic of Gaussian outputs with independent coordinates; "tail" = the largest
# standardised deviation, in the direction of the mean shift, over the coordinates that carry most of the shift --
# a support test: it sees noise whose tails were cut (truncated normal), which the projection averages away.
STATISTICS = ("projection", "tail")
_MAX_CANDIDATES = 4000
_TAIL_CANDIDATES = 400


@dataclass(frozen=True)
class AuditResult:
    """Outcome of :func:`audit_mechanism`.

    Attributes:
        epsilon_lower: the audited lower bound on ε at ``delta`` (≥ 0; holds with probability ≥ ``confidence``).
        epsilon, delta: the claimed guarantee.
        violated: ``epsilon_lower > epsilon`` (the claim is refuted at this confidence).
        trials: outputs drawn on each of D and D′ (half fit the test, half are counted).
        false_positives: held-out outputs on D that the test called D′; out of ``negatives``.
        false_negatives: held-out outputs on D′ that the test called D; out of ``positives``.
        fpr_upper, fnr_upper: the Clopper–Pearson upper bounds used.
        threshold: the test's threshold ("D′" when statistic > threshold).
        statistic: name of the statistic the training half chose.
        confidence: the confidence level.
    """
    epsilon_lower: float
    epsilon: float
    delta: float
    violated: bool
    trials: int
    false_positives: int
    negatives: int
    false_negatives: int
    positives: int
    fpr_upper: float
    fnr_upper: float
    threshold: float
    statistic: str
    confidence: float

    def as_dict(self) -> Dict:
        """The result as a plain dict of its fields (dataclasses.asdict)."""
        return asdict(self)


def clopper_pearson_upper(count, total, level: float):
    """One-sided Clopper–Pearson upper bound at ``level`` on a rate observed as ``count`` of ``total``.

    Vectorised over ``count`` (array-like of integers in [0, total]); 1 where ``count == total``.

    Raises:
        ValueError: ``total`` not an integer >= 1, a ``count`` not an integer in [0, total], ``level`` outside
            (0, 1).
    """
    if isinstance(total, bool) or not isinstance(total, Integral) or total < 1:
        raise ValueError(f"total must be an integer >= 1, got {total!r}")
    level = check_probability(level, "level", low_open=True, high_open=True)
    raw = np.asarray(count)
    if raw.dtype == bool or not (np.issubdtype(raw.dtype, np.integer) or
                                 (np.issubdtype(raw.dtype, np.floating) and np.all(raw == np.floor(raw)))):
        raise ValueError(f"count must hold integers, got {count!r}")
    if raw.size and (raw.min() < 0 or raw.max() > total):
        raise ValueError(f"count must lie in [0, total={total}], got values in [{raw.min()}, {raw.max()}]")
    count = raw.astype(np.float64)
    out = _beta.ppf(level, count + 1.0, np.maximum(total - count, 1e-300))
    return np.where(count >= total, 1.0, out)


def epsilon_lower_bound(fpr_upper, fnr_upper, delta: float):
    """max(ln((1 − δ − FNR_hi)/FPR_hi), ln((1 − δ − FPR_hi)/FNR_hi), 0), vectorised (see the module docstring).

    Raises:
        ValueError: a rate outside [0, 1] or not finite, ``delta`` outside [0, 1).
    """
    fpr = np.asarray(fpr_upper, dtype=np.float64)
    fnr = np.asarray(fnr_upper, dtype=np.float64)
    for name, v in (("fpr_upper", fpr), ("fnr_upper", fnr)):
        if not np.all(np.isfinite(v)) or (v.size and (v.min() < 0 or v.max() > 1)):
            raise ValueError(f"{name} must be rates in [0, 1], got {v!r}")
    if isinstance(delta, bool) or not isinstance(delta, Real) or not 0.0 <= float(delta) < 1.0:
        raise ValueError(f"delta must be a real number in [0, 1), got {delta!r}")
    delta = float(delta)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fnr, 0.0) / fpr)
        b = np.log(np.maximum(1.0 - delta - fpr, 0.0) / fnr)
    out = np.maximum(np.nan_to_num(a, nan=0.0, neginf=0.0, posinf=np.inf),
                     np.nan_to_num(b, nan=0.0, neginf=0.0, posinf=np.inf))
    return np.maximum(out, 0.0)


def _draw(mechanism, data, n: int, generator, batched: bool, name: str) -> torch.Tensor:
    if batched:
        out = mechanism(data, generator, n)
        if not isinstance(out, torch.Tensor) or out.dim() < 1 or out.shape[0] != n:
            raise ValueError(f"a batched mechanism must return a tensor with {n} rows (one per trial) on {name}, "
                             f"got {type(out).__name__ if not isinstance(out, torch.Tensor) else tuple(out.shape)}")
        rows = out.reshape(n, -1)
    else:
        outs = []
        for _ in range(n):
            o = mechanism(data, generator)
            if not isinstance(o, torch.Tensor):
                raise TypeError(f"mechanism must return a torch.Tensor on {name}, got {type(o).__name__}")
            outs.append(o.detach().reshape(-1))
        shapes = {tuple(o.shape) for o in outs}
        if len(shapes) != 1:
            raise ValueError(f"mechanism returned outputs of different sizes on {name}: {sorted(shapes)}")
        rows = torch.stack(outs)
    rows = rows.detach().to(device="cpu", dtype=torch.float64)
    if rows.shape[1] == 0:
        raise ValueError(f"mechanism returned empty outputs on {name}")
    if not bool(torch.isfinite(rows).all()):
        raise ValueError(f"mechanism returned non-finite outputs on {name}")
    return rows


def _fit_statistics(a: np.ndarray, b: np.ndarray) -> Dict[str, Callable[[np.ndarray], np.ndarray]]:
    """The candidate statistics, fitted on the training outputs ``a`` (from D) and ``b`` (from D′)."""
    ma, mb = a.mean(0), b.mean(0)
    var = 0.5 * (a.var(0) + b.var(0))
    var = np.maximum(var, 1e-12 * max(float(var.max()), 1e-300))
    shift = mb - ma
    w = shift / var
    sd = np.sqrt(var)
    z = np.abs(shift) / sd
    keep = z >= 0.5 * z.max() if z.max() > 0 else np.ones_like(z, dtype=bool)
    sign = np.where(shift[keep] >= 0, 1.0, -1.0)
    mk, sk = ma[keep], sd[keep]
    return {
        "projection": lambda o: o @ w,
        "tail": lambda o: ((o[:, keep] - mk) / sk * sign).max(axis=1),
    }


def _candidates(sa: np.ndarray, sb: np.ndarray) -> np.ndarray:
    pooled = np.sort(np.concatenate([sa, sb]))
    n = pooled.size
    idx = np.unique(np.concatenate([np.linspace(0, n - 1, min(n, _MAX_CANDIDATES)).astype(np.int64),
                                    np.arange(min(n, _TAIL_CANDIDATES)),
                                    np.arange(max(0, n - _TAIL_CANDIDATES), n)]))
    return pooled[idx]  # the test says "D′" when statistic > t


def _errors(sa_sorted: np.ndarray, sb_sorted: np.ndarray, t: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    fp = sa_sorted.size - np.searchsorted(sa_sorted, t, side="right")   # D outputs with statistic > t
    fn = np.searchsorted(sb_sorted, t, side="right")                    # D′ outputs with statistic <= t
    return fp, fn


def audit_mechanism(mechanism: Callable, dataset, neighbour, epsilon: float, delta: float, trials: int,
                    generator: Optional[torch.Generator] = None, confidence: float = 0.95, *,
                    batched: bool = False,
                    statistic: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                    statistics: Sequence[str] = STATISTICS) -> AuditResult:
    """Empirical lower bound on the ε of ``mechanism`` at δ, from ``trials`` releases on each of two inputs.

    Runs ``mechanism(dataset, generator)`` and ``mechanism(neighbour, generator)`` ``trials`` times each, fits a
    distinguishing test on the first half of each (the statistic with the largest lower bound on that half, and
    its threshold), counts its false positives / negatives on the second half, and turns their Clopper–Pearson
    upper bounds into ``ε ≥ max(ln((1 − δ − FNR_hi)/FPR_hi), ln((1 − δ − FPR_hi)/FNR_hi))``.

    The bound is only as strong as the inputs and the test: pick neighbours that are worst case for the mechanism
    (see :mod:`fastdpot.audit.cases`) and a statistic that sees where the output laws differ. A bound below the
    claim is no proof of privacy; a bound above it (``violated``) refutes the claim at the given confidence.

    Args:
        mechanism: ``mechanism(data, generator) -> Tensor``, one release; with ``batched=True``,
            ``mechanism(data, generator, n) -> Tensor`` of n independent releases stacked on dim 0.
        dataset, neighbour: the inputs D and D′ (anything the mechanism accepts).
        epsilon, delta: the claimed guarantee, ε > 0, δ in [0, 1).
        trials: releases per input, ≥ 20 (half of them fit the test, half are counted).
        generator: the ``torch.Generator`` passed to every call (default: a fresh non-deterministic one).
        confidence: probability that ``epsilon_lower`` is a valid lower bound, in (0, 1).
        batched: the mechanism's batched calling convention (above).
        statistic: optional fixed statistic, outputs (n, F) float64 -> scores (n,); replaces ``statistics``.
            "D′" is guessed when the score is large.
        statistics: names from :data:`STATISTICS` the training half may choose from.

    Shape:
        every release is flattened to F values; outputs must all have the same number of elements.

    Returns:
        :class:`AuditResult`.

    Raises:
        TypeError: ``mechanism`` or ``statistic`` not callable, a non-tensor output.
        ValueError: ε <= 0, δ outside [0, 1), trials < 20, confidence outside (0, 1), unknown statistic names,
            outputs of inconsistent size, empty or non-finite outputs.

    References:
        Jagielski, Ullman & Oprea, NeurIPS 2020 (§3, Clopper–Pearson); Nasr et al., USENIX Security 2023.
    """
    if not callable(mechanism):
        raise TypeError(f"mechanism must be callable, got {type(mechanism).__name__}")
    if statistic is not None and not callable(statistic):
        raise TypeError(f"statistic must be callable or None, got {type(statistic).__name__}")
    epsilon = check_epsilon(epsilon)
    if isinstance(delta, bool) or not isinstance(delta, Real) or not (0.0 <= float(delta) < 1.0):
        raise ValueError(f"delta must be a real number in [0, 1), got {delta!r}")
    delta = float(delta)
    if isinstance(trials, bool) or not isinstance(trials, Integral):
        raise ValueError(f"trials must be an integer >= 20, got {trials!r}")
    trials = check_int(trials, "trials", 20)
    confidence = check_probability(confidence, "confidence", low_open=True, high_open=True)
    statistics = tuple(statistics)
    if statistic is None and (not statistics or any(s not in STATISTICS for s in statistics)):
        raise ValueError(f"statistics must be a non-empty subset of {STATISTICS}, got {statistics!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator is None:
        generator = make_generator(secure_mode=False)

    out0 = _draw(mechanism, dataset, trials, generator, batched, "dataset")
    out1 = _draw(mechanism, neighbour, trials, generator, batched, "neighbour")
    if out0.shape[1] != out1.shape[1]:
        raise ValueError(f"mechanism outputs on dataset and neighbour differ in size: {out0.shape[1]} vs "
                         f"{out1.shape[1]}")
    half = trials // 2
    a_fit, a_test = out0[:half].numpy(), out0[half:].numpy()
    b_fit, b_test = out1[:half].numpy(), out1[half:].numpy()

    if statistic is not None:
        def fixed(o):
            s = statistic(torch.from_numpy(o))
            s = s.detach().to(torch.float64).reshape(-1).cpu().numpy() if isinstance(s, torch.Tensor) else \
                np.asarray(s, dtype=np.float64).reshape(-1)
            if s.size != o.shape[0] or not np.isfinite(s).all():
                raise ValueError(f"statistic must return {o.shape[0]} finite scores, got {s.size} values")
            return s
        fitted = {"custom": fixed}
    else:
        allf = _fit_statistics(a_fit, b_fit)
        fitted = {k: allf[k] for k in statistics}

    alpha = 1.0 - confidence
    level = 1.0 - alpha / 2.0
    best = None
    for name, f in fitted.items():
        sa, sb = np.sort(f(a_fit)), np.sort(f(b_fit))
        t = _candidates(sa, sb)
        fp, fn = _errors(sa, sb, t)
        eps = epsilon_lower_bound(clopper_pearson_upper(fp, sa.size, level),
                                  clopper_pearson_upper(fn, sb.size, level), delta)
        i = int(np.argmax(eps))
        if best is None or eps[i] > best[0]:
            best = (float(eps[i]), name, float(t[i]))
    _, name, thr = best
    sa, sb = np.sort(fitted[name](a_test)), np.sort(fitted[name](b_test))
    fp, fn = _errors(sa, sb, np.array([thr]))
    fp, fn = int(fp[0]), int(fn[0])
    fpr_hi = float(clopper_pearson_upper(fp, sa.size, level))
    fnr_hi = float(clopper_pearson_upper(fn, sb.size, level))
    eps_lo = float(epsilon_lower_bound(fpr_hi, fnr_hi, delta))
    return AuditResult(epsilon_lower=eps_lo, epsilon=epsilon, delta=delta, violated=bool(eps_lo > epsilon),
                       trials=trials, false_positives=fp, negatives=int(sa.size), false_negatives=fn,
                       positives=int(sb.size), fpr_upper=fpr_hi, fnr_upper=fnr_hi, threshold=thr, statistic=name,
                       confidence=confidence)
