"""Data-independent initial particles of the flows (public draws: no privacy cost).

:func:`draw_init` draws them from a ``torch.Generator`` (one process); :func:`draw_init_keyed` draws rows
``[start, stop)`` of the same law from keyed normals, so every process of a sharded flow draws its own shard and the
particles do not depend on how they are sharded.
"""
from __future__ import annotations

import math

import torch

from .._validate import check_int, check_positive
from ..reference.philox import keyed_normals

__all__ = ["INIT_KINDS", "check_init_kind", "draw_init", "draw_init_keyed"]

_STREAM_INIT = 2 ** 63  # the keyed stream of initial particles (far from the steps' streams 0 .. 2k)

INIT_KINDS = ("gaussian", "sphere", "gaussian_scaled")


def check_init_kind(kind) -> None:
    """Raise ValueError unless ``kind`` is one of :data:`INIT_KINDS` (an ``init`` that is not a tensor)."""
    if not isinstance(kind, str) or kind not in INIT_KINDS:
        raise ValueError(f"init must be one of {list(INIT_KINDS)} or a tensor, got {kind!r}")


def draw_init(kind: str, num_particles: int, dim: int, generator: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Data-independent initial particles, drawn from ``generator`` only (no privacy cost).

    Every kind is a fixed map of the same N·d standard normals drawn from ``generator`` (so the generator advances
    identically, and ``"gaussian"`` with ``scale=1`` is the draw flows have always made):

    * ``"gaussian"``: N(0, scale²·I_d) (the papers' start at scale 1: E‖x‖² = d, ‖x‖ ≈ sqrt(d)).
    * ``"sphere"``: uniform on the sphere of radius ``scale`` centred at 0 (at scale 1 the sphere on which the
      normalised private rows lie).
    * ``"gaussian_scaled"``: N(0, (scale²/d)·I_d), so E‖x‖² = scale².

    Args:
        kind: one of :data:`INIT_KINDS`.
        num_particles, dim: N >= 1, d >= 1.
        generator: CPU ``torch.Generator``; the only source of randomness.
        scale: > 0, a length in the particles' units (see the kinds above).

    Shape:
        returns (N, d) float32 on the CPU.

    Raises:
        ValueError: ``kind`` not in :data:`INIT_KINDS`, ``scale`` <= 0 or not finite, sizes < 1.
    """
    check_init_kind(kind)
    n = check_int(num_particles, "num_particles", 1)
    d = check_int(dim, "dim", 1)
    scale = check_positive(scale, "init_scale")
    return _shape(kind, torch.randn(n, d, generator=generator, dtype=torch.float32), scale)


def _shape(kind: str, x: torch.Tensor, scale: float) -> torch.Tensor:
    if kind == "sphere":
        x = x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
    elif kind == "gaussian_scaled":
        x = x / math.sqrt(x.shape[1])
    return x * scale if scale != 1.0 else x


def draw_init_keyed(kind: str, key: int, start: int, stop: int, dim: int, scale: float = 1.0) -> torch.Tensor:
    """Rows ``[start, stop)`` of the initial particles of :func:`draw_init`'s ``kind``, from the keyed normals of
    :mod:`fastdpot.reference.philox` (row i, coordinate c: normal ``i·d + c`` of ``key``'s initial stream), so that
    the rows do not depend on which process draws them. Same law as :func:`draw_init`, other draws.

    Shape:
        returns (stop − start, d) float32 on the CPU.

    Raises:
        ValueError: as :func:`draw_init`, ``stop < start``.
    """
    check_init_kind(kind)
    d = check_int(dim, "dim", 1)
    scale = check_positive(scale, "init_scale")
    if stop < start or start < 0:
        raise ValueError(f"rows must satisfy 0 <= start <= stop, got [{start}, {stop})")
    x = keyed_normals(key, _STREAM_INIT, start * d, (stop - start) * d, per_block=4,
                      dtype=torch.float32).reshape(stop - start, d)
    return _shape(kind, x, scale)
