"""Cases of the accounting benchmark: the suite ``accounting`` of ``bench/test_accounting.py``.

:class:`fastdpot.privacy.PrivacyBudget` (PLD accountant, the default) at (ε, δ) = (10, 1e-5), Poisson sampling at
q = 0.01, the noise multiplier z calibrated so that T releases spend the budget:

* ``spend`` -- T calls of ``budget.spend(z, q)`` on a fresh budget (the whole run, its last steps at the budget's
  edge), T = 20 000 at the full size (the privacy core's example);
* ``spend_edge`` -- one ``spend(z, q)`` on a budget that already holds T − 1 steps: the release that RDP alone would
  refuse and PLD accepts;
* ``refuse`` -- ``PrivacyBudget(3, 1e-5).spend(1e-3, sample_rate=0.5)``: a refused release of a tiny noise
  multiplier (must be refused at once).

impl ``fastdpot`` only (the accounting itself is dp-accounting's).
"""
from __future__ import annotations

from bench.harness import Case, suite_main

SUITE = "accounting"
ANCHORS = []
EPSILON, DELTA, RATE = 10.0, 1e-5, 0.01
SIZES = {"quick": dict(T=1_000), "2e4": dict(T=20_000)}


def _calibrated(T):
    from fastdpot import privacy as P

    return P.calibrate_noise_multiplier(EPSILON, DELTA, sample_rate=RATE, steps=T)


def spend_case(impl, T):
    """T spends on a fresh budget (forward only)."""
    from fastdpot import privacy as P

    def setup():
        return dict(z=_calibrated(T))

    def forward(s):
        budget = P.PrivacyBudget(EPSILON, DELTA)
        for _ in range(T):
            budget.spend(s["z"], sample_rate=RATE)
        return budget

    return Case(setup=setup, forward=forward)


def spend_edge_case(impl, T):
    """The T-th spend of a budget holding T − 1 steps (a fresh such budget before every round, untimed)."""
    from fastdpot import privacy as P

    def setup():
        return dict(z=_calibrated(T))

    def round_setup(s):
        s["budget"] = P.PrivacyBudget(EPSILON, DELTA)
        s["budget"].spend(s["z"], sample_rate=RATE, num_steps=T - 1)

    def forward(s):
        return s["budget"].spend(s["z"], sample_rate=RATE)

    return Case(setup=setup, forward=forward, round_setup=round_setup)


def refuse_case(impl, T=None):
    """A refused spend of z = 1e-3 at q = 0.5 on a (3, 1e-5) budget."""
    from fastdpot import privacy as P

    def forward(s):
        try:
            P.PrivacyBudget(3.0, DELTA).spend(1e-3, sample_rate=0.5)
        except P.BudgetExceededError:
            return None
        raise AssertionError("the spend was accepted")

    return Case(setup=dict, forward=forward)


CASES = {"spend": spend_case, "spend_edge": spend_edge_case, "refuse": refuse_case}


def main(argv=None):
    """``python -m bench.accounting [--quick] [--sizes ..] [--impls ..]``: :func:`bench.harness.suite_main`."""
    return suite_main("bench.test_accounting", argv)


if __name__ == "__main__":
    raise SystemExit(main())
