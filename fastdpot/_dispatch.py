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

What a backend supports is declared here and nowhere else: a class above the ops that needs a feature asks
:func:`require` when it is built (before anything is released), with the same check and the same message as the
call's :func:`dispatch`.

Under ``torch.compile`` the problem size may be symbolic (a ``SymInt``: automatic dynamic shapes, or
``dynamic=True``); the ``auto`` choice depends on it only through the rule's thresholds, so a compiled caller asks
:func:`size_class` for a plain integer with the same choice, and the graph guards on the comparisons with those
thresholds, never on the size itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ._ext import BackendUnavailableError

__all__ = ["BACKENDS", "register", "set_auto", "describe_features", "dispatch", "require", "available_backends",
           "registered_ops", "MissingFeatureError", "auto_thresholds", "size_class"]

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
#: op -> feature -> what the feature is, in the words of an error (``"takes no shard (...)"``)
_FEATURE_TEXT: Dict[str, Dict[str, str]] = {}


class MissingFeatureError(BackendUnavailableError, ValueError):
    """An explicitly named backend's row lacks an optional feature that the call (or a flow's settings) needs.

    A :class:`~fastdpot._ext.BackendUnavailableError` (what :func:`dispatch` raises for a call) and a ``ValueError``
    (what a flow raises at construction for a setting its backend cannot honour)."""


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


def auto_thresholds(op: str, device_type: str) -> Tuple[int, ...]:
    """The problem sizes at which ``backend="auto"`` of ``op`` on ``device_type`` can change its choice: the positive
    ``min_size`` of its rule, sorted (empty: the choice does not depend on the size). Reads only the table, so its
    answer is a constant within a process once the ops are registered (under ``torch.compile``: a constant of the
    graph)."""
    entry = _TABLE.get(op)
    rule = entry.auto.get(device_type, []) if entry is not None else []
    return tuple(sorted({int(m) for _, m in rule if m > 0}))


# torch.compiler.assume_constant_result(auto_thresholds), without importing Dynamo at `import fastdpot`: the marker
# that function sets (tests/ops/test_custom_ops.py checks that it still is)
auto_thresholds._dynamo_marked_constant = True


def size_class(op: str, device_type: str, size) -> int:
    """A plain integer size with the same ``backend="auto"`` choice as ``size``: the largest threshold of
    :func:`auto_thresholds` that is at most ``size``, 0 below them all.

    Symbolic-shape safe: ``size`` may be a ``torch.SymInt`` (a traced batch size under ``torch.compile``); it is only
    compared with the thresholds, so a graph guards on those comparisons (none for a rule without thresholds), and
    the answer can be passed to a function the compiler treats as constant (``fastdpot.ops.library.fused_backend``).
    """
    cls = 0
    for threshold in auto_thresholds(op, device_type):
        if size >= threshold:
            cls = threshold
    return cls


def describe_features(op: str, texts: Dict[str, str]) -> None:
    """Name the optional features of ``op`` in the words of an error: ``texts[feature]`` completes "backend 'x' of
    op 'op' ..." (e.g. ``"takes no shard (...)"``); a feature without a text is named by itself."""
    _FEATURE_TEXT.setdefault(op, {}).update(texts)


def _check_features(op: str, entry: _Op, backend: str, impl: _Impl, needs: frozenset) -> None:
    missing = needs - impl.features
    if missing:
        texts = _FEATURE_TEXT.get(op, {})
        what = "; ".join(texts.get(f, f"does not implement {f!r}") for f in sorted(missing))
        with_it = sorted(b for b, i in entry.impls.items() if needs <= i.features)
        raise MissingFeatureError(f"backend '{backend}' of op '{op}' {what}; the backends that do: {with_it} "
                                  f"(backend='auto' picks one)")


def require(op: str, backend: str, needs: Tuple[str, ...]) -> None:
    """Check, before any call, that ``backend`` of ``op`` has every feature in ``needs`` (:func:`dispatch`'s check
    for an explicit backend, without its availability check: a missing install is reported by the call).

    ``"auto"`` always passes (it picks a row with the features, else ``reference``); so does a backend name that
    ``op`` does not register (:func:`dispatch` refuses it, naming the registered ones).

    Raises:
        MissingFeatureError: the backend's row lacks a feature in ``needs`` (the message says which, and which rows
            have them).
    """
    entry = _TABLE.get(op)
    if entry is None:
        raise KeyError(f"unknown op {op!r}; registered: {registered_ops()}")
    impl = entry.impls.get(backend)
    if backend != "auto" and impl is not None:
        _check_features(op, entry, backend, impl, frozenset(needs))


def registered_ops():
    """The names of the ops with at least one registered row, sorted."""
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
        BackendUnavailableError: an explicitly requested backend is not registered for ``op`` or failed to load;
            :class:`MissingFeatureError` (a subclass): it lacks a feature in ``needs``.
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
        _check_features(op, entry, backend, impl, needs)  # first: what the row is, whatever is installed
        ok, reason = impl.available()
        if not ok:
            raise BackendUnavailableError(f"backend '{backend}' for op '{op}' is unavailable: {reason}")
        return backend, impl.fn
    for name, min_size in entry.auto.get(device_type, []):
        impl = entry.impls.get(name)
        if impl is not None and size >= min_size and needs <= impl.features and impl.available()[0]:
            return name, impl.fn
    if "reference" in entry.impls:
        return "reference", entry.impls["reference"].fn
    raise BackendUnavailableError(f"no available backend for op '{op}' on device '{device_type}'")
