"""The losses under ``torch.compile``: what :func:`fastdpot.sliced_wasserstein` and
:func:`fastdpot.dp_sliced_wasserstein` put in the graph while Dynamo traces them (``torch.compiler.is_compiling()``).

While tracing, only the checks that read no tensor values run (types, shapes, dtypes, devices, the arguments:
:func:`fastdpot.ops.sliced_wasserstein.check_static`); the value checks (finite rows, unit directions, the loss's
overflow) run in the custom ops' kernels when the graph runs (:mod:`fastdpot.ops.library`). The graph holds:

* non-private: the directions drawn from torch's global generator by traced torch ops (the compiler's own random
  numbers, as for any ``torch.randn`` in a compiled function), then ``torch.ops.fastdpot.sliced_wasserstein`` with
  σ = 0;
* private, secure mode (the default): ``torch.ops.fastdpot.clip_rows``, then ``torch.ops.fastdpot.privacy_draws``
  (the directions and the secret key from the operating system, drawn when the graph runs, in the eager order),
  then the loss op with the key as an input.

What cannot be one node of a graph runs eagerly at a graph break (:func:`supported` says which calls): a
``torch.Generator`` (``generator=``, ``seed=``, or ``secure_mode=False``: replayable draws from a generator's
state), sample weights, ``log=True``, numpy inputs, ``return_noise=True``, and the ``reference`` backend (asked for,
or the only one built), whose gradient is torch's autograd through the sorts.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .. import _dispatch
from ..ops import library as _lib
from ..ops import sliced_wasserstein as _op

__all__ = ["supported", "compiled_sliced_wasserstein", "compiled_dp_sliced_wasserstein"]


def supported(x, y, backend: str, *, projections=None, eager_only: bool = False) -> str:
    """The fused backend a compiled call of the losses runs as a custom op, or ``""`` when it runs eagerly at a
    graph break: ``x`` or ``y`` not a tensor, ``eager_only`` (a feature above), ``projections`` that require grad
    (only the reference backend differentiates w.r.t. them), or no fused backend for ``backend`` on x's device.
    Errors of a bad ``backend`` are left to the eager call."""
    if eager_only or not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return ""
    if projections is not None and (not isinstance(projections, torch.Tensor) or projections.requires_grad):
        return ""
    if backend not in ("auto",) + _lib.FUSED:
        return ""
    # N + M may be symbolic (dynamic shapes): the constant fused_backend gets a plain size with the same choice
    size = _dispatch.size_class(_op.OP, x.device.type, x.shape[0] + y.shape[0])
    try:
        return _lib.fused_backend(x.device.type, backend, size)
    except (ValueError, RuntimeError):  # unknown or unavailable backend: the eager call raises it
        return ""


def compiled_sliced_wasserstein(x, y, num_projections: Optional[int], p: int, projections, fused: str):
    """:func:`fastdpot.sliced_wasserstein` in the graph (module docstring): ``fused`` from :func:`supported`, no
    generator (the directions come from torch's global generator)."""
    from .._random import random_projections

    k = _op.check_static(x, y, p, num_projections, projections)
    if projections is None:
        projections = random_projections(k, x.shape[1], None, dtype=x.dtype, device=x.device)
    return _lib.keyed_sliced_wasserstein(x, y, projections.to(x.dtype), p, 0.0, torch.zeros((), dtype=torch.int64),
                                         backend=fused)


def compiled_dp_sliced_wasserstein(x_private, y, *, noise_std: float, clip_radius: Optional[float],
                                   num_projections: Optional[int], p: int, projections, fused: str,
                                   sketch_bins: Optional[int], orthogonal: bool):
    """:func:`fastdpot.dp_sliced_wasserstein` in the graph, secure mode (module docstring): the sides, σ, the
    clipping bound, the release and the directions already checked by the caller; ``fused`` from :func:`supported`.
    """
    k = _op.check_static(x_private, y, p, num_projections, projections, ("private", "generated"))
    if sketch_bins is not None and sketch_bins > min(x_private.shape[0], y.shape[0]):
        raise ValueError(f"sketch_bins must be at most both batch sizes (private: {x_private.shape[0]}, generated: "
                         f"{y.shape[0]}), got {sketch_bins}")
    if clip_radius is not None and not math.isinf(clip_radius):
        x_private = _lib.clip_rows(x_private, clip_radius)
    theta, key = _lib.privacy_draws(x_private.detach(), 0 if projections is not None else k, orthogonal)
    if projections is not None:
        theta = projections.to(x_private.dtype)
    return _lib.keyed_sliced_wasserstein(x_private, y, theta, p, noise_std, key, sketch_bins=sketch_bins,
                                         orthogonal=orthogonal and projections is not None, backend=fused)
