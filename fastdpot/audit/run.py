"""Run the audit cases of :mod:`fastdpot.audit.cases` (one, or the table of all)."""
from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

from .._validate import check_choice, check_int
from .core import AuditResult, audit_mechanism

__all__ = ["run_case", "backend_status"]

_OPS = {"flow_step": "flow_step", "flow_step_particles": "flow_step", "dpswd_private": "sliced_wasserstein"}


def backend_status(name: str, backend: str) -> Tuple[bool, Optional[str]]:
    """Whether case ``name`` can run on ``backend`` here: ``(True, None)`` or ``(False, reason)``."""
    from .cases import CASES

    case = CASES[check_choice(name, "name", tuple(CASES))]
    check_choice(backend, "backend", case.backends)
    if backend == "reference":
        return True, None
    from .._dispatch import available_backends
    import fastdpot.ops, fastdpot.sliced  # noqa: E401,F401  (register the ops)

    ok, reason = available_backends(_OPS[name]).get(backend, (False, f"no {backend!r} backend"))
    if ok and backend == "triton" and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return False, "Triton needs CUDA or TRITON_INTERPRET=1 (CPU interpreter)"
    return ok, reason


def run_case(name: str, backend: str = "reference", variant: str = "correct", trials: Optional[int] = None,
             seed: int = 0, confidence: float = 0.95) -> AuditResult:
    """Audit case ``name`` of :data:`fastdpot.audit.cases.CASES` on ``backend`` (variant: ``"correct"`` or a
    deliberately broken one), with ``trials`` releases per input (default: the case's) from a generator seeded
    with ``seed``.

    Raises:
        ValueError: unknown case, backend or variant; trials < 20.
        fastdpot.BackendUnavailableError: the backend is not available here.
    """
    from .cases import CASES

    case = CASES[check_choice(name, "name", tuple(CASES))]
    check_choice(backend, "backend", case.backends)
    check_choice(variant, "variant", case.variants)
    trials = case.default_trials(backend) if trials is None else check_int(trials, "trials", 20)
    ok, reason = backend_status(name, backend)
    if not ok:
        from .._ext import BackendUnavailableError
        raise BackendUnavailableError(f"backend {backend!r} for audit case {name!r} is unavailable: {reason}")
    setup = case.build(backend, variant)
    g = torch.Generator().manual_seed(int(seed))
    return audit_mechanism(setup.mechanism, setup.dataset, setup.neighbour, setup.epsilon, setup.delta, trials,
                           generator=g, confidence=confidence, batched=True, statistic=setup.statistic)
