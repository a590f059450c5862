"""Injectable, replayable randomness.

Every random op in fastdpot takes a ``torch.Generator``. Fused kernels (C++ Philox, Triton ``tl.randn``) take a
64-bit seed drawn from that generator with :func:`draw_seed`, so the same generator state gives the same noise on
every backend run and a run can be replayed from a checkpointed generator state.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

__all__ = ["draw_seed", "make_generator"]

_SEED_HIGH = 2 ** 62


def draw_seed(generator: Optional[torch.Generator] = None) -> int:
    """One 62-bit integer seed from ``generator`` (the global CPU generator when None)."""
    return int(torch.randint(0, _SEED_HIGH, (1,), generator=generator, dtype=torch.int64).item())


def make_generator(seed: Optional[int] = None, *, secure_mode: bool = False, device="cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device``.

    Args:
        seed: integer seed; ``None`` seeds from ``torch.seed()``-style entropy (non-deterministic).
        secure_mode: seed from the operating system's CSPRNG (``os.urandom``); ``seed`` must then be None.
            Caveat (as in Opacus' ``secure_mode``): the Gaussian noise is still produced by floating-point
            sampling, whose low-order bits can leak information about the noiseless value (Mironov, CCS 2012);
            secure_mode removes seed predictability, not that floating-point attack surface.

    Raises:
        ValueError: ``seed`` given together with ``secure_mode=True``.
    """
    if secure_mode and seed is not None:
        raise ValueError(f"seed must be None when secure_mode=True, got seed={seed!r}")
    g = torch.Generator(device=device)
    if secure_mode:
        g.manual_seed(int.from_bytes(os.urandom(8), "little") & (2 ** 63 - 1))
    elif seed is None:
        g.seed()
    else:
        g.manual_seed(int(seed))
    return g

