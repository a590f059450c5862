"""What a :meth:`fastdpot.flow.DPSlicedWassersteinFlow.run` call reports: its result, its log line, its progress bar.

:class:`FlowRunResult` and :data:`STOP_REASONS` are re-exported by :mod:`fastdpot.flow`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, Optional

__all__ = ["STOP_REASONS", "FlowRunResult", "progress_postfix", "report_run"]

_log = logging.getLogger("fastdpot.flow")  # the flows' logger (documented in run())

#: Why a :meth:`DPSlicedWassersteinFlow.run` call stopped.
STOP_REASONS = ("completed", "budget", "planned_steps")


@dataclass(frozen=True)
class FlowRunResult:
    """What one :meth:`DPSlicedWassersteinFlow.run` call did (``flow.last_run``).

    Attributes:
        steps_requested: the steps asked for in this call (``steps``, or what was left of the planned T).
        steps_run: the steps taken in this call (<= ``steps_requested``).
        steps_taken: the flow's total after the call.
        stop_reason: ``"completed"`` (every requested step taken), ``"budget"`` (the next step would have
            exceeded ``target_epsilon``; nothing more was released) or ``"planned_steps"`` (the planned T private
            steps are used up: the δ split δ = δ_acc + T·δ_tail covers no more).
        epsilon: ε spent after the call at the configured δ (``inf`` non-private; None when the call was told not
            to compute it, as class flows are).
    """

    steps_requested: int
    steps_run: int
    steps_taken: int
    stop_reason: str
    epsilon: Optional[float]

    @property
    def stopped_early(self) -> bool:
        """Whether fewer steps than requested were taken."""
        return self.stop_reason != "completed"


def progress_postfix(flow, show_epsilon: bool) -> Dict[str, Any]:
    """The bar's fields, ε recomputed now (the RDP vector is composed incrementally: a cheap evaluation)."""
    fields = dict(step=flow.steps_taken)
    if show_epsilon:
        fields["eps"] = f"{flow.epsilon():.3g}"
    fields["drift"] = f"{flow.last_drift_norm:.3g}"
    return fields


def report_run(flow, requested: int, ran: int, stop: str, with_epsilon: bool) -> FlowRunResult:
    """Log why a run() call stopped (a warning when it stopped early) and build its :class:`FlowRunResult`."""
    eps = flow.epsilon() if with_epsilon else None
    c = flow.config
    spent = "" if eps is None else f"; ε spent {eps:.4g} at δ={c['delta']:g}"
    if stop == "budget":
        _log.warning("DP-SW flow stopped after %d of %d requested steps (%d in total): the next step would "
                     "exceed target_epsilon=%g%s; nothing more was released", ran, requested, flow.steps_taken,
                     c["target_epsilon"], spent)
    elif stop == "planned_steps":
        _log.warning("DP-SW flow stopped after %d of %d requested steps: the planned steps=%d private steps "
                     "are used up (the δ split δ = δ_acc + T·δ_tail covers no more)%s", ran, requested,
                     c["steps"], spent)
    else:
        _log.info("DP-SW flow ran %d steps (%d in total)%s", ran, flow.steps_taken, spent)
    return FlowRunResult(requested, ran, flow.steps_taken, stop, eps)
