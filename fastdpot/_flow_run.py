"""What a :meth:`fastdpot.flow.DPSlicedWassersteinFlow.run` call reports: its result, its log line, its progress bar.

:class:`FlowRunResult` and :data:`STOP_REASONS` are re-exported by :mod:`fastdpot.flow`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, Optional

__all__ = ["STOP_REASONS", "FlowRunResult", "progress_postfix", "report_run", "run_flow"]

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


def run_flow(flow, private_data, steps, progress, checkpoint_path, checkpoint_every, callback, progress_epsilon):
    """The loop of :meth:`DPSlicedWassersteinFlow.run` (arguments, returns and errors there): bind the sampling,
    then per step count the release in the flow's ledger, sample a fresh batch, take the step, checkpoint."""
    from . import privacy
    from ._flow_config import is_sampled
    from ._progress import progress_bar as tqdm  # bounded redraw rate, no per-step redraw off a terminal
    from ._validate import check_int

    flow._check_batch(private_data, "private_data")
    n = private_data.shape[0]
    c = flow._config
    sampled = is_sampled(c)
    if steps is None:
        if c["steps"] is None:
            raise ValueError("steps is required: this flow has no planned number of steps")
        steps = c["steps"] - flow._step
    else:
        steps = check_int(steps, "steps", 0)
    if checkpoint_every is not None:
        checkpoint_every = check_int(checkpoint_every, "checkpoint_every", 1)
    if checkpoint_path is not None:  # before any step is spent
        from ._checkpoint import check_checkpoint_path

        checkpoint_path = check_checkpoint_path(checkpoint_path)
    if sampled:
        flow._bind("sampled", n)
        sampler = privacy.FixedSizeSampler(n, flow._bound_batch, generator=flow._rng)
    else:  # non-private flow without a batch size: the whole data set every step
        flow._bind("full", None)
        sampler = None
    bar = tqdm(total=steps, disable=not progress, desc="DP-SW flow" if flow.private else "SW flow")
    start, stop = flow._step, "completed"
    if steps == 0 and flow.private and not flow.can_step():  # nothing left to run: say why
        stop = "budget" if flow._step < c["steps"] else "planned_steps"
    try:
        for _ in range(steps):
            if flow.private:
                if not flow.can_step():  # planned T reached, or the next step would exceed the ε budget
                    stop = "budget" if flow._step < c["steps"] else "planned_steps"
                    break
                flow._ledger.spend()  # counted before the batch is drawn
            batch = private_data if sampler is None else private_data[sampler.sample().to(private_data.device)]
            flow._take_step(batch, spent=True)
            if callback is not None:
                callback(flow)
            if checkpoint_path is not None and checkpoint_every is not None and flow._step % checkpoint_every == 0:
                flow.save(checkpoint_path)
            if progress:
                bar.update(1)
                bar.set_postfix(**progress_postfix(flow, progress_epsilon))
    finally:
        bar.close()
        if flow.private:
            flow._ledger.flush()
    if checkpoint_path is not None:
        flow.save(checkpoint_path)
    flow.last_run = report_run(flow, steps, flow._step - start, stop, progress_epsilon)
    return flow._particles
