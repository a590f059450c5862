"""Empirical privacy audit of fastdpot's releases (lower bounds on ε from black-box runs).

:func:`audit_mechanism` audits any callable ``mechanism(data, generator) -> Tensor``; :func:`run_case` audits one
of fastdpot's own releases (:data:`CASES`) on a backend, correct or deliberately broken; :func:`tail_test` checks
the tails of every noise source itself (:mod:`fastdpot.audit.tails`); ``python -m fastdpot.audit`` prints the
tables of all of them and what they cannot detect. An audit gives a lower bound, not a proof of privacy.

References:
    Jagielski, Ullman & Oprea, "Auditing Differentially Private Machine Learning: How Private is Private SGD?",
    NeurIPS 2020; Nasr et al., "Tight Auditing of Differentially Private Machine Learning", USENIX Security 2023.
"""
from .core import STATISTICS, AuditResult, audit_mechanism, clopper_pearson_upper, epsilon_lower_bound
from .run import run_case
from .tails import TailResult, run_tail_case, tail_test

__all__ = ["audit_mechanism", "AuditResult", "clopper_pearson_upper", "epsilon_lower_bound", "STATISTICS",
           "run_case", "CASES", "tail_test", "run_tail_case", "TailResult"]


def __getattr__(name):
    if name == "CASES":
        from .cases import CASES
        return CASES
    raise AttributeError(name)
