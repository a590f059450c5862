"""One dispatch table for every op.

Each op (``"sliced_wasserstein"``, ``"flow_step"``, ``"sinkhorn"``, ...) maps backend names to implementations:

* ``reference`` -- pure torch (``fastdpot.reference``), always available, any device;
* ``cpu``       -- the C++/OpenMP extension ``fastdpot._C_<name>`` (CPU tensors);
* ``triton``    -- Triton kernels (CUDA tensors; CPU tensors under ``TRITON_INTERPRET=1``);
* ``cuda``      -- the Triton kernels with the compiled CUDA primitives of ``fastdpot._C_cuda_flow`` (CUB sorts with
  32-bit indices, shared-memory histograms), CUDA tensors; preferred over ``triton`` on CUDA where it is built;
* ``keops``     -- pykeops symbolic reductions.

``backend="auto"`` asks each registered ``auto`` rule (an ordered list of backends per device type, optionally with
a minimum problem size) and takes the first one that is available and has every feature the call needs (a row
declares the optional features it implements, e.g. op ``flow_step``'s ``"shard"``: a step over one process's rows of
sharded particles). Asking explicitly for a backend that is not
registered or not available raises :class:`~fastdpot._ext.BackendUnavailableError` naming what to install.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ._ext import BackendUnavailableError

__all__ = ["BACKENDS", "register", "set_auto", "dispatch", "available_backends", "registered_ops"]

BACKENDS = ("reference", "cpu", "triton", "cuda", "keops")


@dataclass
class _Impl:
    fn: Callable
    available: Callable[[], Tuple[bool, Optional[str]]]
    features: frozenset = frozenset()


@dataclass
class _Op:
    impls: Dict[str, _Impl] = field(default_factory=dict)
    # device type -> list of (backend, min_size); first available with size >= min_size wins
    auto: Dict[str, List[Tuple[str, int]]] = field(default_factory=dict)


_TABLE: Dict[str, _Op] = {}


def _always():
    return True, None


def register(op: str, backend: str, available: Callable[[], Tuple[bool, Optional[str]]] = _always,
             features: Tuple[str, ...] = ()):
    """Decorator: register ``fn`` as the ``backend`` implementation of ``op``.

    ``available()`` returns ``(ok, reason)``; it is called lazily at dispatch time. ``features``: the optional
    features of the op this row implements (:func:`dispatch`'s ``needs``).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")

    def deco(fn):
        _TABLE.setdefault(op, _Op()).impls[backend] = _Impl(fn, available, frozenset(features))
        return fn

    return deco


def set_auto(op: str, device_type: str, order: List[Tuple[str, int]]):
    """Set the ``backend="auto"`` preference of ``op`` on ``device_type`` ("cpu", "cuda").

    ``order`` is a list of ``(backend, min_size)``: the first registered, available backend whose ``min_size`` is
    at most the problem size is chosen; ``reference`` is the final fallback.
    """
    _TABLE.setdefault(op, _Op()).auto[device_type] = list(order)


def registered_ops():
    return sorted(_TABLE)


def available_backends(op: str) -> Dict[str, Tuple[bool, Optional[str]]]:
    """``{backend: (available, reason)}`` for every backend registered for ``op``."""
    entry = _TABLE.get(op)
    if entry is None:
        raise KeyError(f"unknown op {op!r}; registered: {registered_ops()}")
    return {b: impl.available() for b, impl in entry.impls.items()}


def dispatch(op: str, backend: str = "auto", device_type: str = "cpu", size: int = 0,
             needs: Tuple[str, ...] = ()) -> Tuple[str, Callable]:
    """Return ``(backend_name, implementation)`` of ``op``: the row asked for, or (``"auto"``) the first available
    row of the device's rule that has every feature in ``needs``, else ``reference``.

    Raises:
        ValueError: unknown backend name.
        BackendUnavailableError: an explicitly requested backend is not registered for ``op``, failed to load, or
            lacks a feature in ``needs``.
    """
    needs = frozenset(needs)
    entry = _TABLE.get(op)
    if entry is None:
        raise KeyError(f"unknown op {op!r}; registered: {registered_ops()}")
    if backend != "auto":
        if backend not in BACKENDS:
            raise ValueError(f"backend must be 'auto' or one of {BACKENDS}, got {backend!r}")
        impl = entry.impls.get(backend)
        if impl is None:
            raise BackendUnavailableError(
                f"op '{op}' has no '{backend}' backend; implemented: {sorted(entry.impls)}")
        ok, reason = impl.available()
        if not ok:
            raise BackendUnavailableError(f"backend '{backend}' for op '{op}' is unavailable: {reason}")
        if not needs <= impl.features:
            with_it = sorted(b for b, i in entry.impls.items() if needs <= i.features)
            raise BackendUnavailableError(f"backend '{backend}' for op '{op}' does not implement "
                                          f"{sorted(needs - impl.features)}; backends that do: {with_it}")
        return backend, impl.fn
    for name, min_size in entry.auto.get(device_type, []):
        impl = entry.impls.get(name)
        if impl is not None and size >= min_size and needs <= impl.features and impl.available()[0]:
            return name, impl.fn
    if "reference" in entry.impls:
        return "reference", entry.impls["reference"].fn
    raise BackendUnavailableError(f"no available backend for op '{op}' on device '{device_type}'")
