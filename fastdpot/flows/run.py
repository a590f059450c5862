"""The one run loop of the flows (single-process and sharded), and what a ``run()`` call reports.

:func:`run_flow` asks the flow, through a few hooks, for what differs between one process and a sharded group (the
sharded flow overrides them: the data rank decides and releases, every rank moves its shard):

* ``_prepare_run(private_data, steps, checkpoint_path)``: validate every argument and bind the sampling before
  anything is released; returns ``(steps, sampler)`` (on every rank of a group, errors raised on every rank);
* ``_stop_reason()``: None while one more step may be taken, else ``"budget"`` / ``"planned_steps"``;
* ``_run_step(private_data, sampler)``: count the release, sample the batch, take the step;
* ``save(path)``: the checkpoint; ``_finish_run()``: record pending releases, share ε with every rank;
* ``_save_after_callback_error(path)``: the checkpoint of the step a raising callback saw (one process; a sharded
  group cannot run a collective from one rank's exception, so it writes none);
* ``_shows_progress()``: whether this process draws the progress bar.

A callback that raises (a ``KeyboardInterrupt`` included) after a step leaves a checkpoint of that step: the step
and its release are complete, so the checkpoint and the releases charged agree, and a resumed run takes the steps
left. A crash inside a step (or of the process) leaves the last checkpoint, whose releases in flight a resumed run
counts as spent (:mod:`fastdpot.flows.checkpoint`); such a run then stops at the planned T releases with fewer steps,
and says so (``stop_reason="planned_steps"``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, Optional

from .._checkpoint import check_checkpoint_every
from .._progress import progress_bar
from .._validate import check_bool

__all__ = ["STOP_REASONS", "FlowRunResult", "run_flow"]

_log = logging.getLogger("fastdpot.flow")  # the flows' logger (documented in run())

#: Why a ``run()`` call stopped.
STOP_REASONS = ("completed", "budget", "planned_steps")


@dataclass(frozen=True)
class FlowRunResult:
    """What one ``run()`` call did (``flow.last_run``).

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


def _postfix(flow, show_epsilon: bool) -> Dict[str, Any]:
    """The bar's fields, ε recomputed now (the RDP vector is composed incrementally: a cheap evaluation)."""
    fields = dict(step=flow.steps_taken)
    if show_epsilon:
        fields["eps"] = f"{flow.epsilon():.3g}"
    fields["drift"] = f"{flow.last_drift_norm:.3g}"
    return fields


def _report(flow, requested: int, ran: int, stop: str, with_epsilon: bool) -> FlowRunResult:
    """Log why a run() call stopped (a warning when it stopped early) and build its :class:`FlowRunResult`."""
    eps = flow.epsilon() if with_epsilon else None
    c = flow.config
    spent = "" if eps is None else f"; ε spent {eps:.4g} at δ={c.delta:g}"
    if not flow._shows_progress():  # a sharded flow logs on its data rank only
        pass
    elif stop == "budget":
        _log.warning("DP-SW flow stopped after %d of %d requested steps (%d in total): the next step would "
                     "exceed target_epsilon=%g%s; nothing more was released", ran, requested, flow.steps_taken,
                     c.target_epsilon, spent)
    elif stop == "planned_steps":
        lost = getattr(flow, "_releases_lost", 0)
        lost = (f"; {lost} of them were made by a run that stopped before its next checkpoint (counted as spent, "
                f"their steps lost)") if lost else ""
        _log.warning("DP-SW flow stopped after %d of %d requested steps (%d in total): the planned steps=%d "
                     "private releases are used up (the δ split δ = δ_acc + T·δ_tail covers no more)%s%s", ran,
                     requested, flow.steps_taken, c.steps, lost, spent)
    else:
        _log.info("DP-SW flow ran %d steps (%d in total)%s", ran, flow.steps_taken, spent)
    return FlowRunResult(requested, ran, flow.steps_taken, stop, eps)


def _reserve(flow, left: int, every: Optional[int]) -> None:
    """Set ``flow._in_flight``: the releases this run may still make before its next checkpoint (at the next
    multiple of ``every`` steps; without ``every``, every step left), within the ledger's plan. A checkpoint written
    meanwhile records them, and resuming from it counts them as spent (:mod:`fastdpot.flows.checkpoint`)."""
    led = flow.ledger
    if led is None or not led.bound:
        flow._in_flight = 0
        return
    n = left if every is None else min(left, every - flow.steps_taken % every)
    flow._in_flight = max(0, min(n, led.limit - led.steps_spent))


def _save_after_callback_error(flow, path) -> None:
    """The checkpoint of the step a raising callback saw (its own error is the one that propagates)."""
    try:
        flow._save_after_callback_error(path)
    except Exception as err:  # noqa: BLE001 - reported, and the callback's exception is raised by the caller
        _log.warning("DP-SW flow: the checkpoint of step %d could not be written after the callback raised: %s",
                     flow.steps_taken, err)


def run_flow(flow, private_data, steps, progress, checkpoint_path, checkpoint_every, callback, progress_epsilon):
    """The loop of ``run()`` (arguments, returns and errors there): validate everything and bind the sampling,
    then per step count the release in the flow's ledger, sample a fresh batch, take the step, checkpoint."""
    check_bool(progress, "progress")
    check_bool(progress_epsilon, "progress_epsilon")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable(flow) or None, got {type(callback).__name__}")
    checkpoint_every = check_checkpoint_every(checkpoint_every, checkpoint_path, needs_path=callback is None)
    steps, sampler = flow._prepare_run(private_data, steps, checkpoint_path)
    bar = progress_bar(total=steps, disable=not (progress and flow._shows_progress()),
                       desc="DP-SW flow" if flow.private else "SW flow")
    start, stop = flow.steps_taken, "completed"
    if steps == 0:  # nothing to run: say why when nothing is left
        stop = flow._stop_reason() or stop
    try:
        for i in range(steps):
            reason = flow._stop_reason()  # the planned T reached, or the next step would exceed the ε budget
            if reason is not None:
                stop = reason
                break
            _reserve(flow, steps - i, checkpoint_every)
            flow._run_step(private_data, sampler)
            _reserve(flow, steps - i - 1, checkpoint_every)  # what a checkpoint written now leaves in flight
            if callback is not None:
                try:
                    callback(flow)
                except BaseException:  # the step is complete: checkpoint it, so that the releases charged agree
                    flow._in_flight = 0
                    if checkpoint_path is not None:
                        _save_after_callback_error(flow, checkpoint_path)
                    raise
            if checkpoint_path is not None and checkpoint_every is not None and \
                    flow.steps_taken % checkpoint_every == 0:
                flow.save(checkpoint_path)
            if progress:
                bar.update(1)
                if flow._shows_progress():
                    bar.set_postfix(**_postfix(flow, progress_epsilon))
    finally:
        bar.close()
        flow._in_flight = 0  # the run is over: nothing more is released by it
        flow._finish_run()
    if checkpoint_path is not None:
        flow.save(checkpoint_path)
    flow.last_run = _report(flow, steps, flow.steps_taken - start, stop, progress_epsilon)
    return flow.particles
