"""Empirical privacy audit (fastdpot.audit): the statistics of the bound, input validation, and for every release
of fastdpot (a) the audited lower bound stays below the claimed ε and (b) the audit catches deliberately broken
variants (sensitivity understated 2×, truncated / clamped noise, clipping skipped, sampling not done)."""
import math

import pytest
import torch

from fastdpot.audit import audit_mechanism, clopper_pearson_upper, epsilon_lower_bound, run_case
from fastdpot.audit.__main__ import main as audit_main
from fastdpot.audit.cases import CASES
from fastdpot.audit.run import backend_status

_F64 = torch.float64


# ----------------------------------------------------------------------------------------------- the bound itself
def test_clopper_pearson_upper_closed_forms():
    # 0 of n: the upper bound solves (1 - p)^n = 1 - level; n of n: 1
    for n, level in ((10, 0.975), (1000, 0.95)):
        assert clopper_pearson_upper(0, n, level) == pytest.approx(1 - (1 - level) ** (1 / n), rel=1e-10)
        assert clopper_pearson_upper(n, n, level) == 1.0
    # k of n: P(Binom(n, p_hi) <= k) = 1 - level
    from scipy.stats import binom
    p = float(clopper_pearson_upper(7, 200, 0.975))
    assert binom.cdf(7, 200, p) == pytest.approx(0.025, rel=1e-8)


def test_epsilon_lower_bound_formula():
    assert epsilon_lower_bound(0.01, 0.5, 0.0) == pytest.approx(math.log(0.5 / 0.01))
    assert epsilon_lower_bound(0.5, 0.01, 0.1) == pytest.approx(math.log(0.4 / 0.01))
    assert epsilon_lower_bound(0.5, 0.5, 0.0) == 0.0           # a coin flip proves nothing
    assert epsilon_lower_bound(0.0, 0.0, 0.0) == math.inf      # a perfect test refutes every finite ε
    assert epsilon_lower_bound(0.2, 0.9, 0.05) == 0.0          # numerators <= 0: no bound, never negative


def _gauss(shift):
    def mech(data, g, n):
        return data + shift * torch.randn(n, 1, generator=g, dtype=_F64)
    return mech


def test_identical_inputs_give_no_evidence():
    """D = D′: no test beats chance, so the bound must stay near 0 (the audit cannot invent evidence)."""
    x = torch.zeros(1, dtype=_F64)
    r = audit_mechanism(_gauss(1.0), x, x, 0.1, 0.0, 20000, torch.Generator().manual_seed(3), batched=True)
    assert r.epsilon_lower < 0.1 and not r.violated
    assert r.negatives == r.positives == 10000


def test_audit_is_near_tight_for_the_gaussian_mechanism():
    """Gaussian outputs N(0, 1) vs N(μ, 1): the true ε at δ is ε(μ, δ) of Balle & Wang; the audit's bound must stay
    below it and, with 4e5 releases at δ = 1e-2, come within 0.6 of it."""
    mu, delta = 1.0, 1e-2
    from dp_accounting import get_epsilon_gaussian
    true_eps = float(get_epsilon_gaussian(1.0 / mu, delta))
    r = audit_mechanism(_gauss(1.0), torch.zeros(1, dtype=_F64), torch.full((1,), mu, dtype=_F64), true_eps, delta,
                        400000, torch.Generator().manual_seed(0), batched=True)
    assert r.epsilon_lower <= true_eps
    assert r.epsilon_lower > true_eps - 0.6


def test_unbatched_mechanism_and_custom_statistic():
    """A user's own mechanism, one release per call (Laplace, ε = 1 exactly): no violation of ε = 1, violation of a
    claim of ε = 0.3; a custom statistic is used as given."""
    def lap(data, g):
        e = torch.empty(2, 1, dtype=_F64).exponential_(1.0, generator=g)
        return data + (e[0] - e[1])          # Laplace(1): sensitivity 1 -> ε = 1
    x0, x1 = torch.zeros(1, dtype=_F64), torch.ones(1, dtype=_F64)
    ok = audit_mechanism(lap, x0, x1, 1.0, 0.0, 6000, torch.Generator().manual_seed(1), confidence=0.99)
    assert not ok.violated and ok.epsilon_lower > 0.3
    bad = audit_mechanism(lap, x0, x1, 0.3, 0.0, 6000, torch.Generator().manual_seed(1),
                          statistic=lambda o: o[:, 0])
    assert bad.violated and bad.statistic == "custom"


def test_audit_mechanism_validation():
    m, x = _gauss(1.0), torch.zeros(1, dtype=_F64)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(TypeError, match="mechanism"):
        audit_mechanism("not callable", x, x, 1.0, 1e-3, 100, g)
    for kw, match in ((dict(epsilon=0.0), "epsilon"), (dict(epsilon=math.nan), "epsilon"),
                      (dict(delta=1.0), "delta"), (dict(delta=-0.1), "delta"), (dict(trials=10), "trials"),
                      (dict(trials=100.5), "trials"), (dict(confidence=1.0), "confidence"),
                      (dict(statistics=("lr",)), "statistics")):
        args = dict(epsilon=1.0, delta=1e-3, trials=100)
        args.update(kw)
        with pytest.raises(ValueError, match=match):
            audit_mechanism(m, x, x, generator=g, batched=True, **args)
    with pytest.raises(ValueError, match="non-finite"):
        audit_mechanism(lambda d, g, n: torch.full((n, 1), math.nan), x, x, 1.0, 1e-3, 100, g, batched=True)
    with pytest.raises(ValueError, match="rows"):
        audit_mechanism(lambda d, g, n: torch.zeros(n + 1, 1), x, x, 1.0, 1e-3, 100, g, batched=True)
    with pytest.raises(ValueError, match="different sizes"):
        sizes = iter(range(1, 10 ** 6))
        audit_mechanism(lambda d, g: torch.zeros(next(sizes) % 2 + 1), x, x, 1.0, 1e-3, 100, g)
    with pytest.raises(ValueError, match="generator"):
        audit_mechanism(m, x, x, 1.0, 1e-3, 100, generator=0, batched=True)


# ----------------------------------------------------------------------------------- fastdpot's own releases
# (case, backend, variant, trials, seed); trials None = the case's default. Broken variants must be caught.
FAST = [(n, "reference", v, None) for n in ("gaussian_projection", "sketch_ranks", "sketch_one_bin", "flow_step",
                                             "laplace_local", "gaussian_local")
        for v in CASES[n].variants]
FAST += [("dpswd_private", "reference", v, None) for v in CASES["dpswd_private"].variants]
FAST += [("composition", "reference", v, None) for v in CASES["composition"].variants]
FAST += [("flow_step", "cpu", v, None) for v in CASES["flow_step"].variants]
FAST += [("dpswd_private", "cpu", v, None) for v in CASES["dpswd_private"].variants]
FAST += [("sanitizer_joint", "reference", v, 10000) for v in ("correct", "sensitivity_2x", "no_clip")]
FAST += [("sanitizer_per_sample", "reference", v, 10000) for v in ("correct", "no_clip")]
FAST += [("flow_step", "triton", v, 4096) for v in ("correct", "no_clip")]
FAST += [("flow_step_particles", "cpu", "no_clip", 3000)]
FAST += [("random_theta", "reference", v, 200_000) for v in CASES["random_theta"].variants]
# the one-shot release (fastdpot.audit.release_cases): the class means in full; the class sketch (one block at a time,
# about 0.4 ms a release) correct and its 2x sensitivity at few trials (caught: 2.36 > 2), its other controls SLOW
FAST += [("class_means", "reference", v, 20000) for v in CASES["class_means"].variants]
FAST += [("class_sketch", "reference", "correct", 2000), ("class_sketch", "reference", "sensitivity_2x", 4000)]
SLOW = [("sanitizer_per_sample", "reference", "sensitivity_2x", 10000),
        ("flow_step_particles", "cpu", "correct", 60000), ("flow_step_particles", "cpu", "sensitivity_2x", 200000),
        ("sanitizer_joint", "reference", "truncated", 40000), ("sanitizer_per_sample", "reference", "truncated", 40000),
        ("flow_step", "triton", "sensitivity_2x", 65536), ("flow_step", "triton", "truncated", 16384),
        ("dpswd_private", "triton", "correct", 8192), ("dpswd_private", "triton", "no_clip", 8192),
        ("class_sketch", "reference", "no_clip", 20000), ("class_sketch", "reference", "truncated", 100_000)]


def _check(name, backend, variant, trials):
    ok, reason = backend_status(name, backend)
    if not ok:
        pytest.skip(reason)
    # 95 % confidence: for a correct mechanism the bound exceeds the true ε with probability <= 5 % over the seed
    r = run_case(name, backend, variant, trials=trials, seed=0, confidence=0.95)
    if variant == "correct":
        assert not r.violated, f"{name}/{backend}: audited ε >= {r.epsilon_lower:.3f} > claimed {r.epsilon:.3f}"
        assert r.epsilon_lower <= r.epsilon
    else:
        assert r.violated, (f"{name}/{backend}/{variant} not caught: audited ε >= {r.epsilon_lower:.3f}, "
                            f"claimed {r.epsilon:.3f}")


@pytest.mark.parametrize("name,backend,variant,trials", FAST, ids=lambda v: str(v))
def test_audit_case(name, backend, variant, trials):
    _check(name, backend, variant, trials)


@pytest.mark.slow
@pytest.mark.parametrize("name,backend,variant,trials", SLOW, ids=lambda v: str(v))
def test_audit_case_slow(name, backend, variant, trials):
    _check(name, backend, variant, trials)


def test_every_case_variant_is_tested():
    covered = {(n, b, v) for n, b, v, _ in FAST + SLOW}
    for name, case in CASES.items():
        for v in case.variants:
            assert (name, "reference", v) in covered or any((name, b, v) in covered for b in case.backends), \
                (name, v)


def test_truncation_is_caught_by_the_tail_not_the_projection():
    """The clamped-noise flow step is refuted through the support test: zero false positives on D's held-out half.
    The projection statistic alone (which sums the 2 coordinates of the release and averages the cut away) does not
    see it on the same releases."""
    from fastdpot.audit.cases import _flow_step
    s = _flow_step("reference", "truncated")
    args = (s.mechanism, s.dataset, s.neighbour, s.epsilon, s.delta, 100000)
    full = audit_mechanism(*args, torch.Generator().manual_seed(5), batched=True)
    assert full.violated and full.statistic == "tail" and full.false_positives == 0
    proj = audit_mechanism(*args, torch.Generator().manual_seed(5), batched=True, statistics=("projection",))
    assert not proj.violated and proj.epsilon_lower < full.epsilon_lower - 1.0


def test_run_case_errors():
    with pytest.raises(ValueError, match="name"):
        run_case("nope")
    with pytest.raises(ValueError, match="variant"):
        run_case("composition", variant="truncated")
    with pytest.raises(ValueError, match="backend"):
        run_case("laplace_local", backend="cpu")


def test_cli_table_and_exit_status(capsys):
    rc = audit_main(["--cases", "laplace_local", "gaussian_local", "--trials", "20000", "--seed", "1",
                     "--tail-draws", "0", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "| laplace_local" in out and "| gaussian_local" in out and "audited ε ≥" in out and "VIOLATED" not in out
    rc = audit_main(["--cases", "laplace_local", "--variant", "no_clip", "--trials", "20000", "--no-progress"])
    assert rc == 1 and "VIOLATED" in capsys.readouterr().out
