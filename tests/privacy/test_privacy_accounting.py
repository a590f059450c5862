"""PrivacyAccountant / calibrate_noise_multiplier, pinned against independent computations:

* a from-scratch RDP of the Poisson-subsampled Gaussian at integer orders (Mironov, Talwar & Zhang 2019, §3.3),
  with the classic (Mironov 2017) and the improved (Balle et al. 2020 / Canonne et al. 2020) RDP -> DP conversions;
* a from-scratch RDP of the Gaussian sampled without replacement (Wang, Balle & Kasiviswanathan 2019, Thm 9);
* opacus' RDP accountant and Microsoft's prv-accountant (independent numerical PLD/PRV composition);
* the exact ε of a composition of plain Gaussians (Balle & Wang 2018 analytic formula).
"""
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.special import gammaln, logsumexp
from scipy.stats import norm

from fastdpot.privacy import PrivacyAccountant, calibrate_noise_multiplier

INT_ORDERS = list(range(2, 257))


# ---------------------------------------------------------------- independent computations (test-only)
def _log_comb(n, k):
    return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


def scratch_rdp_poisson(q, z, alpha):
    """RDP at integer alpha of the Poisson-subsampled Gaussian (add/remove), MTZ19 §3.3 binomial expansion."""
    k = np.arange(alpha + 1)
    terms = _log_comb(alpha, k) + (alpha - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * z * z)
    return logsumexp(terms) / (alpha - 1)


def scratch_rdp_wor(q, z, alpha):
    """RDP at integer alpha of the Gaussian on a batch sampled without replacement (replace-one), WBK19 Thm 9."""
    eps = lambda j: j / (2 * z * z)  # RDP of the Gaussian at order j (sensitivity 1 under replace-one)
    terms = [0.0, 2 * math.log(q) + _log_comb(alpha, 2) + min(math.log(4) + math.log(math.expm1(eps(2))),
                                                                eps(2) + math.log(2))]
    for j in range(3, alpha + 1):
        terms.append(j * math.log(q) + _log_comb(alpha, j) + (j - 1) * eps(j) + math.log(2))
    return logsumexp(terms) / (alpha - 1)


def classic_conversion(rdp, orders, delta):
    orders = np.asarray(orders, float)
    return float(np.min(rdp + math.log(1 / delta) / (orders - 1)))


def improved_conversion(rdp, orders, delta):
    a = np.asarray(orders, float)
    return float(np.min(rdp + np.log1p(-1 / a) - (math.log(delta) + np.log(a)) / (a - 1)))


def exact_gaussian_epsilon(mu, delta):
    """ε of a Gaussian mechanism with sensitivity/σ = mu (Balle & Wang 2018, Thm 8), by root finding."""
    d = lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - delta
    if d(0.0) <= 0:
        return 0.0
    return brentq(d, 0.0, 500.0, xtol=1e-12)


# ---------------------------------------------------------------- the DPSWflow-r setting (Sebag et al., TMLR)
Q_FLOW, Z_FLOW, T_FLOW, DELTA = 250 / 29999, 1.0, 4199, 1e-5


def test_flow_setting_scratch_rdp_classic_conversion_gives_3_93():
    """Correct per-order accounting with the moments-accountant conversion gives 3.93 (the authors print 5.52)."""
    rdp = np.array([T_FLOW * scratch_rdp_poisson(Q_FLOW, Z_FLOW, a) for a in INT_ORDERS])
    eps = classic_conversion(rdp, INT_ORDERS, DELTA)
    assert eps == pytest.approx(3.9266, abs=5e-4)
    assert abs(eps - 3.93) < 0.01 and eps < 5.52


def test_flow_setting_rdp_matches_scratch_at_integer_orders():
    acc = PrivacyAccountant("rdp", orders=INT_ORDERS)
    acc.step(Z_FLOW, Q_FLOW, T_FLOW)
    rdp = np.array([T_FLOW * scratch_rdp_poisson(Q_FLOW, Z_FLOW, a) for a in INT_ORDERS])
    assert acc.get_epsilon(DELTA) == pytest.approx(improved_conversion(rdp, INT_ORDERS, DELTA), rel=1e-7)
    assert acc.get_epsilon(DELTA) == pytest.approx(3.4243, abs=5e-4)


def test_flow_setting_pld_pinned_against_prv_accountant():
    from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant

    acc = PrivacyAccountant()  # PLD by default
    acc.step(Z_FLOW, Q_FLOW, T_FLOW)
    eps = acc.get_epsilon(DELTA)
    prv = PRVAccountant(prvs=[PoissonSubsampledGaussianMechanism(sampling_probability=Q_FLOW,
                                                                 noise_multiplier=Z_FLOW)],
                        max_self_compositions=[T_FLOW], eps_error=0.01, delta_error=1e-10)
    lo, est, hi = prv.compute_epsilon(delta=DELTA, num_self_compositions=[T_FLOW])
    assert lo - 1e-3 <= eps <= hi + 5e-3  # pessimistic PLD discretisation may add ~2e-3
    assert eps == pytest.approx(3.112, abs=0.01)
    # RDP alongside, and the reported value is never above it
    assert acc.get_epsilon(DELTA, accountant="rdp") == pytest.approx(3.4145, abs=1e-3)
    assert eps <= acc.get_epsilon(DELTA, accountant="rdp")


@pytest.mark.parametrize("q,z,steps,delta", [
    (Q_FLOW, Z_FLOW, T_FLOW, 1e-5),
    (50 / 60000, 1.1, 20000, 1e-5),  # DP-Sinkhorn-like (B = 50 of MNIST)
    (0.05, 2.0, 500, 1e-6),
])
def test_rdp_matches_opacus(q, z, steps, delta):
    from opacus.accountants.analysis import rdp as opacus_rdp

    orders = [1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 32.0, 64.0, 128.0]
    acc = PrivacyAccountant("rdp", orders=orders)
    acc.step(z, q, steps)
    ours = acc.get_epsilon(delta)
    rdp = opacus_rdp.compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=orders)
    theirs, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    assert ours == pytest.approx(float(theirs), rel=1e-6)


@pytest.mark.parametrize("z,steps", [(1.0, 1), (2.0, 10), (5.0, 400)])
def test_full_batch_gaussian_composition_matches_exact(z, steps):
    """T Gaussian releases with multiplier z = one Gaussian with multiplier z/sqrt(T): exact ε in closed form."""
    acc = PrivacyAccountant()
    acc.step(z, 1.0, steps)
    exact = exact_gaussian_epsilon(math.sqrt(steps) / z, 1e-5)
    eps = acc.get_epsilon(1e-5)
    assert exact - 1e-9 <= eps <= exact + 5e-3
    # RDP is a valid, looser bound
    assert acc.get_epsilon(1e-5, accountant="rdp") >= exact - 1e-9


def test_heterogeneous_composition():
    acc = PrivacyAccountant(orders=INT_ORDERS)
    plan = [(1.0, 0.01, 300), (2.0, 0.05, 200), (1.0, 0.01, 100)]
    for z, q, t in plan:
        acc.step(z, q, t)
    assert acc.steps == 600 and len(acc.history) == 3
    rdp = sum(np.array([t * scratch_rdp_poisson(q, z, a) for a in INT_ORDERS]) for z, q, t in plan)
    assert acc.get_epsilon(1e-5, accountant="rdp") == pytest.approx(improved_conversion(rdp, INT_ORDERS, 1e-5),
                                                                     rel=1e-7)
    from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant

    prv = PRVAccountant(prvs=[PoissonSubsampledGaussianMechanism(sampling_probability=0.01, noise_multiplier=1.0),
                              PoissonSubsampledGaussianMechanism(sampling_probability=0.05, noise_multiplier=2.0)],
                        max_self_compositions=[400, 200], eps_error=0.01, delta_error=1e-10)
    lo, _, hi = prv.compute_epsilon(delta=1e-5, num_self_compositions=[400, 200])
    assert lo - 1e-3 <= acc.get_epsilon(1e-5) <= hi + 5e-3


def test_consecutive_identical_steps_merge():
    a, b = PrivacyAccountant("rdp"), PrivacyAccountant("rdp")
    for _ in range(50):
        a.step(1.2, 0.02)
    b.step(1.2, 0.02, num_steps=50)
    assert a.history == b.history and a.steps == 50
    assert a.get_epsilon(1e-5) == pytest.approx(b.get_epsilon(1e-5), rel=1e-12)


def test_without_replacement_matches_scratch_and_uses_rdp():
    n, bsz, z, t = 29999, 250, 1.0, T_FLOW
    acc = PrivacyAccountant(orders=list(range(2, 65)))
    acc.step(z, num_steps=t, sampling="without_replacement", dataset_size=n, batch_size=bsz)
    assert acc.neighboring_relation == "replace_one"
    assert acc.epsilon_method() == "rdp"  # PLD has no such event: the reported value is RDP
    rdp = np.array([t * scratch_rdp_wor(bsz / n, z, a) for a in range(2, 65)])
    assert acc.get_epsilon(1e-5) == pytest.approx(improved_conversion(rdp, range(2, 65), 1e-5), rel=1e-6)
    with pytest.raises(ValueError, match="accountant='pld'"):
        acc.get_epsilon(1e-5, accountant="pld")
    # substitution neighbours cost more than add/remove at the same q and z
    poisson = PrivacyAccountant("rdp", orders=list(range(2, 65)))
    poisson.step(z, bsz / n, t)
    assert acc.get_epsilon(1e-5) > poisson.get_epsilon(1e-5)


def test_relations_cannot_be_mixed_but_full_batch_fits_both():
    acc = PrivacyAccountant()
    acc.step(3.0)  # full batch: no relation forced
    assert acc.neighboring_relation is None
    acc.step(1.0, 0.01)
    assert acc.neighboring_relation == "add_or_remove_one"
    with pytest.raises(ValueError, match="neighbouring relation"):
        acc.step(1.0, sampling="without_replacement", dataset_size=100, batch_size=10)
    assert acc.steps == 2


def test_state_dict_round_trip_json():
    acc = PrivacyAccountant()
    acc.step(1.0, 0.01, 100)
    acc.step(0.8, 0.02, 10)
    state = json.loads(json.dumps(acc.state_dict()))
    other = PrivacyAccountant("pld", orders=[2.0, 3.0])  # the state's orders replace these
    other.load_state_dict(state)
    assert other.accountant == "pld" and other.steps == 110 and other.history == acc.history
    assert other.get_epsilon(1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)
    other.step(1.0, 0.01, 5)  # keeps accounting after a reload
    assert other.get_epsilon(1e-5) > acc.get_epsilon(1e-5)


@pytest.mark.parametrize("saved,into", [("pld", "rdp"), ("rdp", "pld")])
def test_a_state_of_another_accountant_kind_is_refused_on_load(saved, into):
    # issue 37: a PLD accountant's state loaded into PrivacyAccountant("rdp") then reported the PLD ε
    acc = PrivacyAccountant(saved)
    acc.step(1.0, 0.01, 100)
    other = PrivacyAccountant(into)
    other.step(2.0, 0.01, 1)
    before = other.state_dict()
    with pytest.raises(ValueError, match=f"state\\['accountant'\\]='{saved}' is the state of another kind"):
        other.load_state_dict(acc.state_dict())
    assert other.state_dict() == before and other.accountant == into  # unchanged
    assert PrivacyAccountant.from_state_dict(acc.state_dict()).accountant == saved  # a new one takes its kind


@pytest.mark.parametrize("where", ["top", "history"])
def test_a_state_with_an_unknown_key_is_refused(where):
    acc = PrivacyAccountant()
    acc.step(1.0, 0.01, 100)
    state = acc.state_dict()
    (state if where == "top" else state["history"][0])["noise_std"] = 3.0
    with pytest.raises(ValueError, match="unknown key.*noise_std"):
        PrivacyAccountant.from_state_dict(state)


def test_a_discretisation_finer_than_pld_evaluates_in_bounded_time_is_refused():
    from fastdpot.privacy.accounting import PLD_MIN_DISCRETIZATION

    with pytest.raises(ValueError, match=r"value_discretization_interval=1e-06 is finer than.*>= 0.0001"):
        PrivacyAccountant(value_discretization_interval=1e-6)
    with pytest.raises(ValueError, match="PLD_MIN_DISCRETIZATION"):
        calibrate_noise_multiplier(3.0, 1e-5, 0.01, 100, value_discretization_interval=1e-6)
    acc = PrivacyAccountant(value_discretization_interval=PLD_MIN_DISCRETIZATION)
    acc.step(0.2, 0.01, 1000)  # z = 0.2 is within PLD's range at 1e-3, not at 1e-4 (0.1·sqrt(10) = 0.32)
    assert not acc.pld_in_range() and acc.epsilon_method() == "rdp"


def test_empty_accountant_is_zero():
    assert PrivacyAccountant().get_epsilon(1e-5) == 0.0


@pytest.mark.parametrize("kwargs,match", [
    (dict(noise_multiplier=0.0), "noise_multiplier"),
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(noise_multiplier=float("nan")), "noise_multiplier"),
    (dict(noise_multiplier=1.0, sample_rate=0.0), "sample_rate"),
    (dict(noise_multiplier=1.0, sample_rate=1.5), "sample_rate"),
    (dict(noise_multiplier=1.0, num_steps=0), "num_steps"),
    (dict(noise_multiplier=1.0, num_steps=2.5), "num_steps"),
    (dict(noise_multiplier=1.0, sampling="shuffle"), "sampling"),
    (dict(noise_multiplier=1.0, sampling="without_replacement"), "dataset_size"),
    (dict(noise_multiplier=1.0, sampling="without_replacement", dataset_size=10, batch_size=11), "batch_size"),
    (dict(noise_multiplier=1.0, sample_rate=0.5, sampling="without_replacement", dataset_size=10, batch_size=2),
     "sample_rate"),
    (dict(noise_multiplier=1.0, sample_rate=0.5, batch_size=4), "batch_size"),
])
def test_step_validation(kwargs, match):
    acc = PrivacyAccountant()
    with pytest.raises(ValueError, match=match):
        acc.step(**kwargs)
    assert acc.steps == 0


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, float("nan")])
def test_get_epsilon_validates_delta(delta):
    with pytest.raises(ValueError, match="delta"):
        PrivacyAccountant().get_epsilon(delta)


def test_constructor_validation():
    with pytest.raises(ValueError, match="accountant"):
        PrivacyAccountant("moments")
    with pytest.raises(ValueError, match="orders"):
        PrivacyAccountant(orders=[0.5, 2.0])
    with pytest.raises(ValueError, match="neighboring_relation"):
        PrivacyAccountant(neighboring_relation="swap")


# ---------------------------------------------------------------- calibration
@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_calibrate_round_trip(accountant):
    target, q, t = 3.0, 0.01, 1000
    z = calibrate_noise_multiplier(target, 1e-5, q, t, accountant=accountant)
    acc = PrivacyAccountant(accountant)
    acc.step(z, q, t)
    assert acc.get_epsilon(1e-5) <= target
    tighter = PrivacyAccountant(accountant)
    tighter.step(z - 3e-3, q, t)
    assert tighter.get_epsilon(1e-5) > target  # within tolerance of the smallest feasible z


def test_calibrate_pld_needs_less_noise_than_rdp():
    z_rdp = calibrate_noise_multiplier(5.0, 1e-5, Q_FLOW, T_FLOW, accountant="rdp")
    z_pld = calibrate_noise_multiplier(5.0, 1e-5, Q_FLOW, T_FLOW, accountant="pld")
    assert z_pld < z_rdp < Z_FLOW  # ε = 5 > 3.41 needs less noise than z = 1


def test_calibrate_without_replacement_defaults_to_rdp():
    kw = dict(sampling="without_replacement", dataset_size=5000, batch_size=100)
    z = calibrate_noise_multiplier(8.0, 1e-5, 1.0, 500, **kw)  # accountant=None: RDP for this event
    acc = PrivacyAccountant("rdp")
    acc.step(z, num_steps=500, **kw)
    assert acc.get_epsilon(1e-5) <= 8.0
    tighter = PrivacyAccountant("rdp")
    tighter.step(z - 3e-3, num_steps=500, **kw)
    assert tighter.get_epsilon(1e-5) > 8.0
    with pytest.raises(ValueError, match="pld"):
        calibrate_noise_multiplier(8.0, 1e-5, 1.0, 500, accountant="pld", **kw)


@pytest.mark.parametrize("args,match", [
    ((0.0, 1e-5, 0.01, 10), "target_epsilon"),
    ((1.0, 1.0, 0.01, 10), "delta"),
    ((1.0, 1e-5, 0.0, 10), "sample_rate"),
    ((1.0, 1e-5, 0.01, 0), "steps"),
])
def test_calibrate_validation(args, match):
    with pytest.raises(ValueError, match=match):
        calibrate_noise_multiplier(*args)


def test_incremental_rdp_equals_dp_accounting_composed_directly():
    """The cached per-event RDP vectors, summed step by step, equal dp-accounting composing the same events."""
    import dp_accounting
    from dp_accounting import rdp

    orders = list(range(2, 33))
    acc = PrivacyAccountant("rdp", orders=orders)
    ref = rdp.RdpAccountant(orders=orders,
                            neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    for i in range(12):
        z, bsz = (1.0, 250) if i % 3 else (1.5, 400)
        acc.step(z, num_steps=1 + i % 4, sampling="without_replacement", dataset_size=29999, batch_size=bsz)
        ref.compose(dp_accounting.SampledWithoutReplacementDpEvent(29999, bsz, dp_accounting.GaussianDpEvent(z)),
                    1 + i % 4)
    assert acc.get_epsilon(1e-5) == pytest.approx(ref.get_epsilon(1e-5), rel=1e-10)
    eps, order = acc.get_epsilon_and_order(1e-5)
    assert (eps, order) == pytest.approx(ref.get_epsilon_and_optimal_order(1e-5), rel=1e-10)
    assert order in orders
    reloaded = PrivacyAccountant("rdp")
    reloaded.load_state_dict(acc.state_dict())
    assert reloaded.get_epsilon(1e-5) == pytest.approx(eps, rel=1e-10)


@settings(max_examples=30, deadline=None)
@given(z=st.floats(0.5, 5.0), q=st.floats(1e-3, 0.5), steps=st.integers(1, 5000))
def test_rdp_epsilon_monotone(z, q, steps):
    """More steps or a larger rate never lowers ε; more noise never raises it."""
    def eps(z_, q_, t_):
        acc = PrivacyAccountant("rdp", orders=range(2, 64))
        acc.step(z_, q_, t_)
        return acc.get_epsilon(1e-5)

    base = eps(z, q, steps)
    assert eps(z, q, steps + 1) >= base - 1e-12
    assert eps(z, min(1.0, 1.5 * q), steps) >= base - 1e-12
    assert eps(1.2 * z, q, steps) <= base + 1e-12


def test_huge_targets_are_refused_quickly_under_pld_and_served_by_rdp():
    # ε = 1e4 used to hang for minutes inside the PLD root search; it is refused at once, and RDP serves it
    import time

    from fastdpot.privacy.accounting import PLD_MIN_NOISE_MULTIPLIER

    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="accountant='rdp'"):
        calibrate_noise_multiplier(1e4, 1e-5, 0.01, 100, accountant="pld")
    z = calibrate_noise_multiplier(1e4, 1e-5, 0.01, 100, accountant="rdp")
    assert 0 < z < PLD_MIN_NOISE_MULTIPLIER and time.perf_counter() - t0 < 60
    # accountant=None: what a default accountant reports there (RDP: z is outside PLD's range)
    assert calibrate_noise_multiplier(1e4, 1e-5, 0.01, 100) == z
    for acc in (PrivacyAccountant("rdp"), PrivacyAccountant()):
        acc.step(z, 0.01, num_steps=100)
        assert acc.epsilon_method() == "rdp" and acc.get_epsilon(1e-5) <= 1e4
