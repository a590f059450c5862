"""Checkpoints of :class:`fastdpot.flow.DPSlicedWassersteinFlow` (the methods of :class:`FlowCheckpointing`, which the
flow class inherits): its state dict, the validation of a whole state before anything is assigned, atomic saves, and
rebuilding a flow from a state or a file.

State layout (unchanged since the flows' first checkpoints; older states get defaults for newer config keys):
``config``, ``particles`` (N, d), ``generator``, ``secure_mode``, ``step``, ``pool``, ``noise_multiplier``,
``mode``, ``bound_n``, ``bound_batch``, ``last_drift_norm``, ``accountant``, ``budget``. The accounting keys are
the flow's :class:`fastdpot.privacy.PrivacyLedger` state (its ``event`` is rebuilt from ``mode``, ``bound_n`` and
``bound_batch``).
"""
from __future__ import annotations

from typing import Any, Dict

import torch

from ._checkpoint import (CheckpointError, atomic_save, generator_state, load_checkpoint, require_state,
                          state_choice, state_float, state_int)
from ._flow_config import accounting_event
from ._validate import check_finite_tensor

__all__ = ["FlowCheckpointing"]

_KEYS = ("config", "particles", "generator", "step", "pool", "noise_multiplier", "mode", "bound_n",
         "last_drift_norm", "accountant", "budget")


class FlowCheckpointing:
    """The checkpoint methods of :class:`fastdpot.flow.DPSlicedWassersteinFlow` (a mixin: it reads the flow's
    config, particles, generator, step counter, pool, sampling binding and ledger)."""

    def state_dict(self) -> Dict[str, Any]:
        """Everything needed to resume: config, particles, generator state, step counter, accounting.

        Secure mode: ``generator`` is the public generator's state (it drew the initial particles); the privacy
        draws came from the OS and nothing of them is stored. Replayable mode: ``generator`` is the state of the
        privacy source itself, so the state dict (and every checkpoint) is a private artefact: keep it with the
        private data, never with the published outputs.

        The accounting keys (``noise_multiplier``, ``accountant``, ``budget``) are the state of the flow's
        :class:`fastdpot.privacy.PrivacyLedger` (pending releases are recorded first); ``mode``, ``bound_n`` and
        ``bound_batch`` give its sampling event.
        """
        led = self._ledger.state_dict() if self._ledger is not None else dict(noise_multiplier=None, accountant=None,
                                                                              budget=None)
        return dict(
            config=dict(self._config), particles=self._particles.detach().cpu().clone(),
            generator=self._generator.get_state(), secure_mode=self.secure_mode, step=self._step,
            pool=None if self._pool is None else self._pool.cpu().clone(), noise_multiplier=led["noise_multiplier"],
            mode=self._mode, bound_n=self._bound_n, bound_batch=self._bound_batch,
            last_drift_norm=self._last_drift_norm, accountant=led["accountant"], budget=led["budget"])

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` of a flow with the same config (resume a run).

        Atomic: the whole state — config, particles of shape (N, d), generator state, step counter in [0, T], mode,
        bound n, noise multiplier, accountant and budget (whose step counts must equal the step counter) — is
        checked before anything is assigned; on any error this flow is unchanged.

        Raises:
            ValueError: a key missing or invalid (the message names it), a config that does not match this flow's,
                or accounting missing from the state of a private flow that has taken steps (it would reset the ε
                spent).
        """
        (self._particles, gen_state, self._step, self._pool, self._last_drift_norm, self._mode, self._bound_n,
         self._bound_batch, ledger) = self._check_state(state)
        self._generator.set_state(gen_state)
        if self.private:
            self._ledger = ledger

    def _state_rows(self) -> int:
        """Rows of ``state['particles']``: all N here; a sharded flow's state holds its shard."""
        return self._config["num_particles"]

    def _check_state(self, state) -> tuple:
        """Validate a :meth:`state_dict` against this flow; return the values to assign ``(particles, generator
        state, step, pool, last_drift_norm, mode, bound_n, bound_batch, ledger)`` (nothing is assigned here;
        ``ledger`` is a new, loaded :class:`fastdpot.privacy.PrivacyLedger`, None for a non-private flow)."""
        require_state(state, _KEYS, "DPSlicedWassersteinFlow")
        if not isinstance(state["config"], dict):
            raise ValueError(f"state['config'] must be a dict, got {type(state['config']).__name__}")
        c = self._config
        # checkpoints older than `directions` / `release` / `num_bins` get their defaults
        if {"directions": "uniform", "release": "points", "num_bins": None, **state["config"]} != c:
            raise ValueError(f"state config {state['config']} does not match this flow's config {c}")
        parts = state["particles"]
        if not isinstance(parts, torch.Tensor) or not parts.is_floating_point():
            raise ValueError(f"state['particles'] must be a floating-point tensor, got {type(parts).__name__}")
        rows = self._state_rows()
        if tuple(parts.shape) != (rows, c["dim"]):
            raise ValueError(f"state['particles'] must have shape ({rows}, {c['dim']}), got {tuple(parts.shape)}")
        check_finite_tensor(parts, "state['particles']")
        gen_state = generator_state(state["generator"])
        step = state_int(state["step"], "step", 0, c["steps"] if self.private else None)
        pool = state["pool"]
        if self._pool is None:
            if pool is not None:
                raise ValueError(f"state['pool'] must be None for variant={c['variant']!r}, got a "
                                 f"{type(pool).__name__}")
        else:
            if not isinstance(pool, torch.Tensor) or tuple(pool.shape) != tuple(self._pool.shape):
                raise ValueError(f"state['pool'] must be a tensor of shape {tuple(self._pool.shape)}, got "
                                 f"{tuple(pool.shape) if isinstance(pool, torch.Tensor) else type(pool).__name__}")
            check_finite_tensor(pool, "state['pool']")
            pool = pool.clone().to(self._particles.dtype)
        drift = state_float(state["last_drift_norm"], "last_drift_norm", nan_ok=True)
        mode = state_choice(state["mode"], "mode", (None, "sampled", "full"))
        if mode is None and step > 0:
            raise ValueError(f"state['mode'] is None but state['step']={step}: steps without accounting mode")
        n = b = None
        if mode == "sampled":
            n = state_int(state["bound_n"], "bound_n", 1)
            b = self._resolve_batch(n)
            if state.get("bound_batch", b) != b:
                raise ValueError(f"state['bound_batch']={state.get('bound_batch')!r} disagrees with the config's "
                                 f"batch size for n={n} ({b})")
        elif state["bound_n"] is not None:
            raise ValueError(f"state['bound_n'] must be None for mode={mode!r}, got {state['bound_n']!r}")
        ledger = None
        if self.private:
            ledger = self._make_ledger()  # the accounting: checked (and loaded) by a fresh ledger
            ledger.load_state_dict(dict(noise_multiplier=state["noise_multiplier"],
                                        event=accounting_event(mode, n, b), accountant=state["accountant"],
                                        budget=state["budget"]))
            if mode is not None and ledger.steps_spent != step:
                raise ValueError(f"state's accountant holds {ledger.steps_spent} release(s) but state['step']={step}")
        elif state["noise_multiplier"] is not None:
            state_float(state["noise_multiplier"], "noise_multiplier", positive=True)
        return parts.clone().to(self.device), gen_state, step, pool, drift, mode, n, b, ledger

    def save(self, path: str) -> None:
        """``torch.save`` of :meth:`state_dict`, written atomically (a crash never corrupts the last checkpoint).

        Raises:
            TypeError, ValueError: ``path`` not a path, a directory, or not writable (checked before writing).
        """
        atomic_save(self.state_dict(), path)

    @classmethod
    def from_state_dict(cls, state: Dict[str, Any], *, device="cpu", backend="auto"):
        """A new flow rebuilt from :meth:`state_dict` (its config, particles, step counter and accounting).

        Raises:
            ValueError: not a flow's state dict (a ``ClassConditionalFlow`` one included), or any check of
                :meth:`load_state_dict`.
        """
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

    @classmethod
    def load(cls, path: str, *, device="cpu", backend="auto"):
        """Rebuild a flow from :meth:`save` (only load checkpoints you wrote: ``torch.load`` unpickles).

        Raises:
            FileNotFoundError: no file at ``path``.
            fastdpot.flow.CheckpointError: ``path`` is a directory, or the file is truncated / garbage / another
                kind of checkpoint (the message names the file; a ValueError).
            ValueError: the state fails a check of :meth:`load_state_dict`.
        """
        state = load_checkpoint(path, "DPSlicedWassersteinFlow")
        if isinstance(state, dict) and "flows" in state and "config" not in state:
            raise CheckpointError(f"{path!r} is a ClassConditionalFlow checkpoint; load it with "
                                  f"ClassConditionalFlow.load")
        try:
            return cls.from_state_dict(state, device=device, backend=backend)
        except ValueError as err:
            raise CheckpointError(f"DPSlicedWassersteinFlow checkpoint {path!r} is invalid: {err}") from err
