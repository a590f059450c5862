"""Checkpoints of the flows: the methods of :class:`FlowCheckpointing` (one process: one file) and
:class:`ShardedCheckpointing` (a sharded flow: a folder with one file per rank's shard and the data rank's
``main.pt``), which the flow classes inherit.

State layout (``state_dict``): ``format`` (3), ``kind`` (the flow class), ``config``
(:meth:`fastdpot.flows.FlowConfig.to_dict`), ``particles`` (N, d), ``generator``, ``secure_mode``, ``step``,
``pool``, ``mode``, ``bound_n``, ``bound_batch``, ``last_drift_norm``, ``init`` (how the initial particles were
made: ``kind``, ``scale`` and the public generator's state before the draw, or ``kind="tensor"``),
``releases_lost`` and ``releases_in_flight`` (see below) and the ledger's ``noise_multiplier``, ``accountant``,
``budget`` (its ``event`` is rebuilt from ``mode``, ``bound_n`` and ``bound_batch``). Only tensors and plain Python
values: files are read with ``torch.load(weights_only=True)``, which runs nothing.

A state is validated whole before anything is assigned; on any error the flow is unchanged. What a state of a
private flow must satisfy (anything else is refused as an inconsistent checkpoint, naming the field): the config,
``secure_mode`` and shapes are this flow's; the ledger's checks (:meth:`fastdpot.privacy.PrivacyLedger.load_state_dict`:
every history event is this flow's mechanism -- z, n, B, sampling, relation --, z is the configured or calibrated
one, the budget matches); the counted releases equal ``step + releases_lost``, at most T with those in flight; a
state at step 0 holds the initial particles that its ``init`` record reproduces; a live flow never moves backwards
(the state's step and history extend its own).

Crashes: the steps a run takes after its last checkpoint are releases too, and a callback may have published them.
A checkpoint written during :meth:`run` records ``releases_in_flight``, the releases the run may make before its
next checkpoint; loading it counts them as spent (``releases_lost``: released, their particles lost), so a run
resumed after a crash reports at least the ε of everything it may have released. A checkpoint written when a run
ends (or outside a run) has none in flight.
"""
from __future__ import annotations

import glob
import os
from typing import Any, Dict, Optional

import torch

from .._checkpoint import (CheckpointError, atomic_save, check_checkpoint_path, generator_state, load_checkpoint,
                           require_state, state_choice, state_float, state_int)
from .._validate import check_finite_tensor
from .init import INIT_KINDS, draw_init

__all__ = ["FlowCheckpointing", "ShardedCheckpointing", "STATE_FORMAT"]

#: Version of the flows' state layout; states of another version are refused.
STATE_FORMAT = 3

_KEYS = ("format", "kind", "config", "particles", "generator", "secure_mode", "step", "pool", "noise_multiplier",
         "mode", "bound_n", "bound_batch", "last_drift_norm", "init", "releases_lost", "releases_in_flight",
         "accountant", "budget")


class FlowCheckpointing:
    """The checkpoint methods of :class:`fastdpot.flows.DPSlicedWassersteinFlow` (a mixin: it reads the flow's
    config, particles, generator, step counter, pool, sampling binding and ledger)."""

    def state_dict(self) -> Dict[str, Any]:
        """Everything needed to resume: config, particles, generator state, step counter, accounting.

        Secure mode: ``generator`` is the public generator's state (it drew the initial particles); the privacy
        draws came from the OS and nothing of them is stored. Replayable mode: ``generator`` is the state of the
        privacy source itself, so the state dict (and every checkpoint) is a private artefact: keep it with the
        private data, never with the published outputs.
        """
        led = self._ledger.state_dict() if self._ledger is not None else dict(noise_multiplier=None, accountant=None,
                                                                              budget=None)
        init = dict(self._init_record)
        if init["generator"] is not None:
            init["generator"] = init["generator"].clone()
        return dict(
            format=STATE_FORMAT, kind=type(self).__name__, config=self.config.to_dict(),
            particles=self._particles.detach().cpu().clone(), generator=self._generator.get_state(),
            secure_mode=self.secure_mode, step=self._step,
            pool=None if self._pool is None else self._pool.cpu().clone(), noise_multiplier=led["noise_multiplier"],
            mode=self._mode, bound_n=self._bound_n, bound_batch=self._bound_batch,
            last_drift_norm=self._last_drift_norm, init=init, releases_lost=self._releases_lost,
            releases_in_flight=self._in_flight, accountant=led["accountant"], budget=led["budget"])

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` of a flow with the same config (resume a run).

        Atomic: the whole state is checked before anything is assigned; on any error this flow is unchanged. The
        checks are listed in :mod:`fastdpot.flows.checkpoint`; releases in flight are counted as spent.

        Raises:
            ValueError: a key missing or invalid (the message names it), another state format or flow kind, a
                config that does not match this flow's, accounting missing from the state of a private flow that has
                taken steps (it would reset the ε spent), a history that is not this flow's mechanism, release
                counts that disagree with the step counter, a step-0 state whose particles are not the initial ones
                its ``init`` record reproduces, a state behind this flow's own steps or history.
        """
        v = self._check_state(state)
        self._particles, self._step, self._pool, self._last_drift_norm = v["particles"], v["step"], v["pool"], \
            v["drift"]
        self._mode, self._bound_n, self._bound_batch = v["mode"], v["n"], v["b"]
        self._init_record, self._releases_lost, self._in_flight = v["init"], v["lost"], 0
        self._generator.set_state(v["generator"])
        if self.private:
            self._ledger = v["ledger"]

    # -- the initial particles: what a step-0 state is checked against --------------------------------------
    def _record_init(self, init, generator, init_scale) -> Dict[str, Any]:
        """How the initial particles are made, recorded before the draw: a kind of :func:`fastdpot.flows.draw_init`
        with its scale and the public generator's state, or ``kind="tensor"`` (given particles: nothing to
        reproduce)."""
        if isinstance(init, torch.Tensor):
            return dict(kind="tensor", scale=1.0, generator=None)
        return dict(kind="gaussian" if init is None else init, scale=float(init_scale),
                    generator=generator.get_state())

    def _reproduce_init(self, record: Dict[str, Any]) -> Optional[torch.Tensor]:
        """The initial particles (this process's rows) that ``record`` reproduces, None for a given tensor."""
        if record["kind"] == "tensor":
            return None
        g = torch.Generator(device="cpu")
        g.set_state(record["generator"])
        return draw_init(record["kind"], self.config.num_particles, self.config.dim, g, record["scale"])

    def _check_init(self, record, particles: torch.Tensor, step: int) -> Dict[str, Any]:
        if not isinstance(record, dict) or not {"kind", "scale", "generator"} <= set(record):
            raise ValueError(f"state['init'] must be a dict with kind, scale and generator, got {record!r}")
        record = dict(record)
        state_choice(record["kind"], "init.kind", INIT_KINDS + ("tensor",))
        record["scale"] = state_float(record["scale"], "init.scale", positive=True)
        if record["kind"] == "tensor":
            if record["generator"] is not None:
                raise ValueError("state['init']['generator'] must be None for a tensor init")
        else:
            record["generator"] = generator_state(record["generator"], "init.generator").clone()
        if step == 0 and self.private:  # trained particles cannot be passed off as a fresh start
            try:
                expected = self._reproduce_init(record)
            except (ValueError, TypeError, KeyError, RuntimeError) as err:
                raise ValueError(f"state['init'] cannot reproduce the initial particles: {err}") from None
            if expected is not None and not torch.allclose(particles.detach().cpu().double(), expected.double(),
                                                           rtol=1e-5, atol=1e-6 * record["scale"]):
                raise ValueError("state['particles'] at state['step']=0 are not the initial particles that "
                                 "state['init'] reproduces (an inconsistent checkpoint: a state of a flow that has "
                                 "taken no step holds its initial particles)")
        return record

    def _state_rows(self) -> int:
        """Rows of ``state['particles']``: all N here; a sharded flow's state holds its shard."""
        return self.config.num_particles

    def _check_state(self, state) -> Dict[str, Any]:
        """Validate a :meth:`state_dict` against this flow; return the values to assign (nothing is assigned here;
        ``ledger`` is a new, loaded :class:`fastdpot.privacy.PrivacyLedger` with the releases in flight counted,
        None for a non-private flow)."""
        kind = type(self).__name__
        _check_header(state, kind)
        c = self.config
        if state["config"] != c.to_dict():
            diff = sorted(key for key, v in c.to_dict().items() if state["config"].get(key, object()) != v)
            raise ValueError(f"state['config'] does not match this flow's config (keys {diff})")
        if not isinstance(state["secure_mode"], bool) or state["secure_mode"] != self.secure_mode:
            raise ValueError(f"state['secure_mode']={state['secure_mode']!r} differs from this flow's secure_mode="
                             f"{self.secure_mode!r}")
        parts = state["particles"]
        if not isinstance(parts, torch.Tensor) or not parts.is_floating_point():
            raise ValueError(f"state['particles'] must be a floating-point tensor, got {type(parts).__name__}")
        rows = self._state_rows()
        if tuple(parts.shape) != (rows, c.dim):
            raise ValueError(f"state['particles'] must have shape ({rows}, {c.dim}), got {tuple(parts.shape)}")
        check_finite_tensor(parts, "state['particles']")
        gen_state = generator_state(state["generator"])
        step = state_int(state["step"], "step", 0, c.steps if self.private else None)
        lost = state_int(state["releases_lost"], "releases_lost", 0)
        flying = state_int(state["releases_in_flight"], "releases_in_flight", 0)
        if not self.private and (lost or flying):
            raise ValueError("a non-private flow's state must hold no releases (releases_lost, releases_in_flight 0)")
        if self.private and step + lost + flying > c.steps:
            raise ValueError(f"state['step'] + releases_lost + releases_in_flight = {step + lost + flying} exceeds "
                             f"the planned T = {c.steps}")
        init = self._check_init(state["init"], parts, step)
        pool = state["pool"]
        if self._pool is None:
            if pool is not None:
                raise ValueError(f"state['pool'] must be None for variant={c.variant!r}, got a {type(pool).__name__}")
        else:
            if not isinstance(pool, torch.Tensor) or tuple(pool.shape) != tuple(self._pool.shape):
                raise ValueError(f"state['pool'] must be a tensor of shape {tuple(self._pool.shape)}, got "
                                 f"{tuple(pool.shape) if isinstance(pool, torch.Tensor) else type(pool).__name__}")
            check_finite_tensor(pool, "state['pool']")
            pool = pool.clone().to(self._particles.dtype)
        drift = state_float(state["last_drift_norm"], "last_drift_norm", nan_ok=True)
        mode = state_choice(state["mode"], "mode", (None, "sampled", "full"))
        if mode is None and step + lost > 0:
            raise ValueError(f"state['mode'] is None but state['step']={step}: steps without accounting mode")
        n = b = None
        if mode == "sampled":
            n = state_int(state["bound_n"], "bound_n", 1)
            b = c.resolve_batch(n)
            if state["bound_batch"] != b:
                raise ValueError(f"state['bound_batch']={state['bound_batch']!r} disagrees with the config's batch "
                                 f"size for n={n} ({b})")
        elif state["bound_n"] is not None or state["bound_batch"] is not None:
            raise ValueError(f"state['bound_n'] and state['bound_batch'] must be None for mode={mode!r}")
        ledger = None
        if self.private:
            ledger = self._make_ledger()  # the accounting: checked (and loaded) by a fresh ledger
            ledger.load_state_dict(dict(noise_multiplier=state["noise_multiplier"],
                                        event=c.accounting_event(mode, n, b), accountant=state["accountant"],
                                        budget=state["budget"]))
            if ledger.steps_spent != step + lost:
                raise ValueError(f"state's accountant holds {ledger.steps_spent} release(s) but state['step'] + "
                                 f"state['releases_lost'] = {step + lost}")
            if flying:  # released after this checkpoint by a run that did not reach its next one: spent
                ledger.record_lost(flying)
                lost += flying
            self._check_not_behind(step, ledger)
        elif any(state[key] is not None for key in ("noise_multiplier", "accountant", "budget")):
            raise ValueError("a non-private flow's state must hold no accounting (noise_multiplier, accountant, "
                             "budget None)")
        return dict(particles=parts.clone().to(self.device), generator=gen_state, step=step, pool=pool, drift=drift,
                    mode=mode, n=n, b=b, ledger=ledger, init=init, lost=lost)

    def _check_not_behind(self, step: int, ledger) -> None:
        """A live flow never moves backwards: the state's step and counted releases must extend its own."""
        mine = self._ledger
        if step < self._step:
            raise ValueError(f"state['step']={step} is behind this flow's {self._step} steps: a live flow never moves "
                             f"backwards (load an older state into a new flow only, see docs/privacy.md)")
        if mine is not None and mine.steps_spent:
            if ledger.accountant is None:
                raise ValueError(f"the state holds no releases but this flow has counted {mine.steps_spent}: a live "
                                 f"flow never moves backwards")
            mine.flush()
            mine.accountant.check_extended_by(ledger.accountant, "state['accountant']['history']")

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
            ValueError: not a state of this flow class, or any check of :meth:`load_state_dict`.
        """
        _check_header(state, cls.__name__)
        try:
            config = cls._config_class.from_dict(state["config"])
        except TypeError as err:
            raise ValueError(f"state['config'] is not a {cls._config_class.__name__}: {err}") from None
        if not isinstance(state["secure_mode"], bool):
            raise ValueError(f"state['secure_mode'] must be a bool, got {state['secure_mode']!r}")
        flow = cls.from_config(config, init=state["particles"], generator=torch.Generator(device="cpu"),
                               device=device, backend=backend, secure_mode=state["secure_mode"] or not config.private)
        flow.load_state_dict(state)
        return flow

    @classmethod
    def load(cls, path: str, *, device="cpu", backend="auto"):
        """Rebuild a flow from :meth:`save` (``torch.load(weights_only=True)``: tensors and plain values only, nothing
        in the file runs; the state is then checked as :meth:`load_state_dict` says).

        Raises:
            FileNotFoundError: no file at ``path``.
            fastdpot.flows.CheckpointError: ``path`` is a directory, or the file is truncated / garbage / another
                kind of checkpoint, or fails a check of :meth:`load_state_dict` (the message names the file; a
                ValueError).
        """
        state = load_checkpoint(path, cls.__name__)
        try:
            return cls.from_state_dict(state, device=device, backend=backend)
        except ValueError as err:
            raise CheckpointError(f"{cls.__name__} checkpoint {path!r} is invalid: {err}") from err


def _check_header(state, kind: str) -> None:
    if isinstance(state, dict) and state.get("kind", kind) != kind:
        raise ValueError(f"this is a {state['kind']} checkpoint; load it with {state['kind']}.load")
    require_state(state, ("format", "kind"), kind)
    if state["format"] != STATE_FORMAT:
        raise ValueError(f"state['format']={state['format']!r}: this fastdpot reads flow states of format "
                         f"{STATE_FORMAT} (a checkpoint of another version; re-run the flow)")
    require_state(state, _KEYS, kind, exact=True)
    if not isinstance(state["config"], dict):
        raise ValueError(f"state['config'] must be a dict, got {type(state['config']).__name__}")


def _ckpt_files(path: str, rank: int, world: int):
    return os.path.join(path, "main.pt"), os.path.join(path, f"shard-{rank:05d}-of-{world:05d}-step")


class ShardedCheckpointing:
    """The checkpoint methods of a sharded flow (a mixin before :class:`FlowCheckpointing`: it uses the flow's rank,
    world size, shard, collectives and, on the data rank, :meth:`FlowCheckpointing.state_dict` /
    :meth:`~FlowCheckpointing.load_state_dict`). A checkpoint is a FOLDER."""

    def _check_checkpoint_path(self, path):
        """The folder must exist and be writable, or be creatable in an existing writable folder (checked before
        any step is spent; :meth:`save` creates it, never its parents)."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"checkpoint_path must be a str or os.PathLike, got {type(path).__name__}")
        path = os.fspath(path)
        if os.path.exists(path) and not os.path.isdir(path):
            raise ValueError(f"checkpoint_path={path!r} of a sharded flow is a folder; a file is there")
        check_checkpoint_path(os.path.join(path, "main.pt") if os.path.isdir(path) else path.rstrip(os.sep) or path)
        return path

    def save(self, path: str) -> None:
        """Write a checkpoint to the FOLDER ``path`` (a collective). Every rank writes its shard
        ``shard-<rank>-of-<W>-step<S>.pt``; after a barrier the data rank writes ``main.pt`` (config, world size,
        step S, accountant, its generator state), atomically; after a second barrier older shard files are
        removed. ``main.pt`` always names a step whose shards are complete, so a rank that dies at any point leaves
        the last checkpoint intact. Replayable mode: the files are private artefacts."""
        main, prefix = _ckpt_files(path, self.rank, self.world_size)
        S = self._step
        os.makedirs(path, exist_ok=True)  # the checkpoint's own folder (its parent exists: _check_checkpoint_path)
        atomic_save(dict(rank=self.rank, world_size=self.world_size, step=S, shard=self._shard,
                         particles=self._particles.detach().cpu().clone(), last_drift_norm=self._last_drift_norm),
                    f"{prefix}{S:09d}.pt")
        self._barrier()
        if self._is_data():
            state = self.state_dict()
            state.pop("particles")
            state.update(world_size=self.world_size, data_rank=self.data_rank)
            atomic_save(state, main)
        self._barrier()
        for f in glob.glob(f"{glob.escape(prefix)}*.pt"):
            if not f.endswith(f"{S:09d}.pt"):
                os.remove(f)

    @classmethod
    def from_state_dict(cls, state, *, device="cpu", backend="auto"):
        """Not for sharded flows: build the flow on every rank, then :meth:`load_checkpoint`.

        Raises:
            TypeError: always.
        """
        raise TypeError("a sharded flow resumes with flow.load_checkpoint(folder) after building it on every rank")

    @classmethod
    def load(cls, path, *, device="cpu", backend="auto"):
        """Not for sharded flows (see :meth:`from_state_dict`). Raises: TypeError: always."""
        cls.from_state_dict(None)

    def _state_rows(self) -> int:
        return self._shard[1] - self._shard[0]  # the data rank's state carries its own shard's particles

    def load_checkpoint(self, path: str) -> int:
        """Resume from the folder ``path`` written by :meth:`save` (a collective; only the data rank reads
        ``main.pt``, each rank reads its own shard). Returns the step resumed at.

        Raises:
            ValueError (on EVERY rank, nothing changed or released): no checkpoint, a different config, world size
                or data rank than the checkpoint's, a missing or inconsistent shard.
        """
        main, prefix = _ckpt_files(path, self.rank, self.world_size)
        meta, state = None, None
        if self._is_data():
            try:
                state = load_checkpoint(main, type(self).__name__)
                require_state(state, ("config", "world_size", "step", "data_rank"), type(self).__name__)
                meta = dict(config=state["config"], world_size=state["world_size"], step=state["step"],
                            data_rank=state["data_rank"])
            except (FileNotFoundError, ValueError) as err:
                meta = str(err)
        meta = self._broadcast_object(meta)
        err = ""
        if isinstance(meta, str):
            err = meta
        elif meta["world_size"] != self.world_size:
            err = (f"the checkpoint was written by {meta['world_size']} ranks, this run has {self.world_size}; "
                   f"resume with the same world size")
        elif meta["config"] != self.config.to_dict() or meta["data_rank"] != self.data_rank:
            diff = sorted(k for k, v in self.config.to_dict().items() if meta["config"].get(k) != v)
            err = f"the checkpoint's config differs from this flow's (keys {diff}, data_rank {meta['data_rank']})"
        shard = None
        if not err:
            f = f"{prefix}{int(meta['step']):09d}.pt"
            try:
                shard = load_checkpoint(f, "shard")
                if tuple(shard["shard"]) != tuple(self._shard) or shard["step"] != meta["step"] or \
                        not bool(torch.isfinite(shard["particles"]).all()):
                    err = f"shard file {f} does not match rank {self.rank}'s shard {self._shard}"
            except (FileNotFoundError, ValueError, KeyError, TypeError) as e:
                err = f"missing or unreadable shard file {f}: {e}"
        self._agree_errors(err)
        if self._is_data():
            state["particles"] = shard["particles"]
            for extra in ("world_size", "data_rank"):
                state.pop(extra)
            try:
                self.load_state_dict(state)
                err = ""
            except ValueError as e:
                err = f"rank {self.rank}: {e}"
        self._agree_errors(err if self._is_data() else "")
        if not self._is_data():
            self._particles = shard["particles"].clone().to(self.device)
            self._step = int(shard["step"])
        self._last_drift_norm = float(shard["last_drift_norm"])
        return self._step
