"""Checkpoint files and state dicts: shared checks for every ``save`` / ``load`` / ``load_state_dict``.

The rule every loader follows: validate the whole state first (with these helpers), then assign. A state that fails
a check raises ``ValueError`` naming the key and leaves the object unchanged.
"""
from __future__ import annotations

import math
import os
import pickle
import tempfile
import zipfile
from numbers import Integral, Real
from typing import Any, Iterable, Optional

import torch

from ._validate import check_int

__all__ = ["CheckpointError", "check_checkpoint_path", "check_checkpoint_every", "atomic_save", "load_checkpoint",
           "require_state", "state_int", "state_float", "state_choice"]


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read (truncated, garbage, not a torch file, or of another kind)."""


def check_checkpoint_every(every, path, needs_path: bool = True) -> Optional[int]:
    """``checkpoint_every`` checked before any work: None, or an int >= 1 that needs ``path`` (``needs_path``:
    without a path nothing would be saved; a run with a callback passes False, the callback sees the cadence).

    Raises:
        ValueError / TypeError: not an int >= 1, or given without ``path`` where it needs one.
    """
    if every is None:
        return None
    every = check_int(every, "checkpoint_every", 1)
    if needs_path and path is None:
        raise ValueError(f"checkpoint_every={every} needs checkpoint_path (where the checkpoints are written); "
                         f"without one nothing would be saved")
    return every


def check_checkpoint_path(path, name: str = "checkpoint_path") -> str:
    """Check that a checkpoint can be written at ``path`` *before* any work (or privacy) is spent on it.

    Returns the path as ``str``. Its folder must exist and be writable: a missing folder is an error (a mistyped
    path would otherwise create folders wherever it points, e.g. at the root), never created here or when saving.

    Raises:
        TypeError: ``path`` not a str or ``os.PathLike``.
        ValueError: ``path`` empty, an existing directory, in a folder that does not exist, or in a folder that
            cannot be written.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if not path:
        raise ValueError(f"{name} must not be empty")
    if os.path.isdir(path):
        raise ValueError(f"{name}={path!r} is a directory; give a file path such as {os.path.join(path, 'flow.pt')!r}")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"{name}={path!r} exists and is not writable")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{name}={path!r} cannot be created: {folder!r} is not a directory")
    if not os.path.isdir(folder):
        raise ValueError(f"{name}={path!r} is in a folder that does not exist ({folder!r}); create it first (a "
                         f"checkpoint never creates folders)")
    try:  # the check that counts: can a file be created here (permissions, read-only mounts)?
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_probe_")
    except OSError as err:
        raise ValueError(f"{name}={path!r} is not writable: cannot create a file in {folder!r} ({err})") from None
    os.close(fd)
    os.remove(tmp)
    return path


def atomic_save(obj, path) -> None:
    """``torch.save`` of ``obj`` (tensors and plain Python values, what :func:`load_checkpoint` reads back) to
    ``path`` through a temporary file in the same folder, then ``os.replace``: the previous checkpoint stays intact
    until the new one is complete (a crash never corrupts it).

    Raises:
        TypeError, ValueError: as :func:`check_checkpoint_path` (checked before writing: the folder must exist).
    """
    path = check_checkpoint_path(path, "path")
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_ckpt_", suffix=".pt")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # the previous checkpoint stays intact until the new one is complete
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_checkpoint(path, what: str) -> Any:
    """``torch.load(weights_only=True)`` of a checkpoint written by ``save``: tensors and plain Python values
    (dicts, lists, tuples, str, numbers, bool, None) only. Nothing in the file is executed: a file that holds any
    other object (a pickled class, a function, a payload) is refused before any of it runs. There is no opt-in to
    full unpickling.

    Raises:
        TypeError: ``path`` not a str or ``os.PathLike``.
        FileNotFoundError: no file at ``path``.
        CheckpointError: ``path`` is a directory, or the file is truncated / garbage / not a torch checkpoint, or
            holds objects other than tensors and plain values; the message names the file and ``what`` was
            expected.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if os.path.isdir(path):
        raise CheckpointError(f"{what} checkpoint {path!r} is a directory, not a file written by save()")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what} checkpoint {path!r} does not exist")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except (EOFError, pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, OSError, ValueError, KeyError,
            AttributeError, ImportError, IndexError, TypeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{what} checkpoint {path!r} is corrupt or not a checkpoint written by save() "
                              f"(truncated or overwritten?): {type(err).__name__}: {err}") from err


def require_state(state, keys: Iterable[str], what: str, *, exact: bool = False) -> dict:
    """``state`` must be a dict holding every key of ``keys`` (and, with ``exact``, no other: an unknown key is a
    state of another kind or version, or an edited one, refused rather than ignored)."""
    if not isinstance(state, dict):
        raise ValueError(f"state must be a dict from {what}.state_dict(), got {type(state).__name__}")
    keys = list(keys)
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"state is missing key(s) {missing} of {what}.state_dict()")
    unknown = sorted(str(k) for k in state if k not in keys)
    if exact and unknown:
        raise ValueError(f"state has unknown key(s) {unknown}: not keys of {what}.state_dict() (a state of another "
                         f"kind or version, or an edited one)")
    return state


def state_int(v, name: str, lo: int = 0, hi: Optional[int] = None) -> int:
    """An integer entry in [lo, hi] (no bools, no strings, no floats)."""
    if isinstance(v, bool) or not isinstance(v, Integral):
        raise ValueError(f"state[{name!r}] must be an integer, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"state[{name!r}] must be {rng}, got {v!r}")
    return int(v)


def state_float(v, name: str, *, nan_ok: bool = False, positive: bool = False) -> float:
    """A real entry (NaN only with ``nan_ok``; > 0 and finite with ``positive``)."""
    if isinstance(v, bool) or not isinstance(v, Real):
        raise ValueError(f"state[{name!r}] must be a real number, got {v!r}")
    v = float(v)
    if math.isnan(v) and not nan_ok:
        raise ValueError(f"state[{name!r}] must not be NaN")
    if positive and not (v > 0 and math.isfinite(v)):
        raise ValueError(f"state[{name!r}] must be finite and > 0, got {v!r}")
    return v


def state_choice(v, name: str, choices) -> Any:
    if not any(v is c or (type(v) is type(c) and v == c) for c in choices):
        raise ValueError(f"state[{name!r}] must be one of {list(choices)}, got {v!r}")
    return v


def generator_state(v, name: str = "generator") -> torch.Tensor:
    """A CPU ``torch.Generator`` state (checked by setting it on a scratch generator)."""
    if not isinstance(v, torch.Tensor) or v.dtype != torch.uint8:
        raise ValueError(f"state[{name!r}] must be a torch.Generator state (uint8 tensor), got "
                         f"{type(v).__name__ if not isinstance(v, torch.Tensor) else v.dtype}")
    try:
        torch.Generator(device="cpu").set_state(v)
    except (RuntimeError, ValueError, TypeError) as err:
        raise ValueError(f"state[{name!r}] is not a valid CPU torch.Generator state: {err}") from None
    return v
