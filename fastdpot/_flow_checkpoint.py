"""Checkpoints of :class:`fastdpot.flow.DPSlicedWassersteinFlow`: its state dict, the validation of a state before
anything is assigned, and rebuilding a flow from a state or a file.

State layout (unchanged since the flows' first checkpoints; older states get defaults for newer config keys):
``config``, ``particles`` (N, d), ``generator``, ``secure_mode``, ``step``, ``pool``, ``noise_multiplier``,
``mode``, ``bound_n``, ``bound_batch``, ``last_drift_norm``, ``accountant``, ``budget``. The accounting keys are
the flow's :class:`fastdpot.privacy.PrivacyLedger` state (its ``event`` is rebuilt from ``mode``, ``bound_n`` and
``bound_batch``).
"""
from __future__ import annotations

from typing import Any, Dict

import torch

from ._checkpoint import (CheckpointError, generator_state, load_checkpoint, require_state, state_choice,
                          state_float, state_int)
from ._flow_config import accounting_event
from ._validate import check_finite_tensor

__all__ = ["flow_state_dict", "check_flow_state", "flow_from_state_dict", "load_flow"]

_KEYS = ("config", "particles", "generator", "step", "pool", "noise_multiplier", "mode", "bound_n",
         "last_drift_norm", "accountant", "budget")


def flow_state_dict(flow) -> Dict[str, Any]:
    """:meth:`DPSlicedWassersteinFlow.state_dict` (pending releases are recorded in the accountant first)."""
    led = flow._ledger.state_dict() if flow._ledger is not None else dict(noise_multiplier=None, accountant=None,
                                                                          budget=None)
    return dict(
        config=dict(flow._config), particles=flow._particles.detach().cpu().clone(),
        generator=flow._generator.get_state(), secure_mode=flow.secure_mode, step=flow._step,
        pool=None if flow._pool is None else flow._pool.cpu().clone(), noise_multiplier=led["noise_multiplier"],
        mode=flow._mode, bound_n=flow._bound_n, bound_batch=flow._bound_batch,
        last_drift_norm=flow._last_drift_norm, accountant=led["accountant"], budget=led["budget"])


def check_flow_state(flow, state) -> tuple:
    """Validate a :meth:`DPSlicedWassersteinFlow.state_dict` against ``flow``; return the values to assign
    ``(particles, generator state, step, pool, last_drift_norm, mode, bound_n, bound_batch, ledger)`` (nothing
    is assigned here; ``ledger`` is a new, loaded ledger, None for a non-private flow).

    Raises:
        ValueError: as :meth:`DPSlicedWassersteinFlow.load_state_dict`.
    """
    require_state(state, _KEYS, "DPSlicedWassersteinFlow")
    if not isinstance(state["config"], dict):
        raise ValueError(f"state['config'] must be a dict, got {type(state['config']).__name__}")
    c = flow._config
    # checkpoints older than `directions` / `release` / `num_bins` get their defaults
    if {"directions": "uniform", "release": "points", "num_bins": None, **state["config"]} != c:
        raise ValueError(f"state config {state['config']} does not match this flow's config {c}")
    parts = state["particles"]
    if not isinstance(parts, torch.Tensor) or not parts.is_floating_point():
        raise ValueError(f"state['particles'] must be a floating-point tensor, got {type(parts).__name__}")
    if tuple(parts.shape) != (c["num_particles"], c["dim"]):
        raise ValueError(f"state['particles'] must have shape ({c['num_particles']}, {c['dim']}), got "
                         f"{tuple(parts.shape)}")
    check_finite_tensor(parts, "state['particles']")
    gen_state = generator_state(state["generator"])
    step = state_int(state["step"], "step", 0, c["steps"] if flow.private else None)
    pool = state["pool"]
    if flow._pool is None:
        if pool is not None:
            raise ValueError(f"state['pool'] must be None for variant={c['variant']!r}, got a "
                             f"{type(pool).__name__}")
    else:
        if not isinstance(pool, torch.Tensor) or tuple(pool.shape) != tuple(flow._pool.shape):
            raise ValueError(f"state['pool'] must be a tensor of shape {tuple(flow._pool.shape)}, got "
                             f"{tuple(pool.shape) if isinstance(pool, torch.Tensor) else type(pool).__name__}")
        check_finite_tensor(pool, "state['pool']")
        pool = pool.clone().to(flow._particles.dtype)
    drift = state_float(state["last_drift_norm"], "last_drift_norm", nan_ok=True)
    mode = state_choice(state["mode"], "mode", (None, "sampled", "full"))
    if mode is None and step > 0:
        raise ValueError(f"state['mode'] is None but state['step']={step}: steps without accounting mode")
    n = b = None
    if mode == "sampled":
        n = state_int(state["bound_n"], "bound_n", 1)
        b = flow._resolve_batch(n)
        if state.get("bound_batch", b) != b:
            raise ValueError(f"state['bound_batch']={state.get('bound_batch')!r} disagrees with the config's "
                             f"batch size for n={n} ({b})")
    elif state["bound_n"] is not None:
        raise ValueError(f"state['bound_n'] must be None for mode={mode!r}, got {state['bound_n']!r}")
    ledger = None
    if flow.private:
        ledger = flow._make_ledger()  # the accounting: checked (and loaded) by a fresh ledger
        ledger.load_state_dict(dict(noise_multiplier=state["noise_multiplier"],
                                    event=accounting_event(mode, n, b), accountant=state["accountant"],
                                    budget=state["budget"]))
        if mode is not None and ledger.steps_spent != step:
            raise ValueError(f"state's accountant holds {ledger.steps_spent} release(s) but state['step']={step}")
    elif state["noise_multiplier"] is not None:
        state_float(state["noise_multiplier"], "noise_multiplier", positive=True)
    return parts.clone().to(flow.device), gen_state, step, pool, drift, mode, n, b, ledger


def flow_from_state_dict(cls, state: Dict[str, Any], *, device="cpu", backend="auto"):
    """:meth:`DPSlicedWassersteinFlow.from_state_dict` of the flow class ``cls``."""
    if isinstance(state, dict) and "flows" in state and "config" not in state:
        raise ValueError("this is a ClassConditionalFlow state; use ClassConditionalFlow.load / its state")
    require_state(state, ("config", "particles"), "DPSlicedWassersteinFlow")
    if not isinstance(state["config"], dict):
        raise ValueError(f"state['config'] must be a dict, got {type(state['config']).__name__}")
    gen = torch.Generator(device="cpu")
    # checkpoints older than secure mode were replayable
    try:
        flow = cls(**state["config"], init=state["particles"], generator=gen, device=device, backend=backend,
                   secure_mode=bool(state.get("secure_mode", False)))
    except TypeError as err:  # an unknown config key
        raise ValueError(f"state['config'] is not a DPSlicedWassersteinFlow config: {err}") from None
    flow.load_state_dict(state)
    return flow


def load_flow(cls, path: str, *, device="cpu", backend="auto"):
    """:meth:`DPSlicedWassersteinFlow.load` of the flow class ``cls``."""
    state = load_checkpoint(path, "DPSlicedWassersteinFlow")
    if isinstance(state, dict) and "flows" in state and "config" not in state:
        raise CheckpointError(f"{path!r} is a ClassConditionalFlow checkpoint; load it with "
                              f"ClassConditionalFlow.load")
    try:
        return cls.from_state_dict(state, device=device, backend=backend)
    except ValueError as err:
        raise CheckpointError(f"DPSlicedWassersteinFlow checkpoint {path!r} is invalid: {err}") from err
