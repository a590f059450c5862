"""Injectable, replayable randomness for public draws and for the replayable mode.

Privacy draws of the private APIs go through :mod:`fastdpot.privacy.randomness` (secret OS randomness by default;
a ``torch.Generator`` only with ``secure_mode=False``). Every random op in fastdpot takes a ``torch.Generator``.
Fused kernels (C++ Philox, Triton) take a 62-bit seed; in replayable mode it is drawn from that generator with
:func:`draw_seed`, so the same generator state gives the same noise on every backend run and a run can be replayed
from a checkpointed generator state.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

__all__ = ["draw_seed", "make_generator", "random_projections"]

_SEED_HIGH = 2 ** 62


def draw_seed(generator: Optional[torch.Generator] = None) -> int:
    """One 62-bit integer seed from ``generator`` (the global CPU generator when None)."""
    return int(torch.randint(0, _SEED_HIGH, (1,), generator=generator, dtype=torch.int64).item())


def make_generator(seed: Optional[int] = None, *, secure_mode: bool = False, device="cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device``.

    Args:
        seed: integer seed; ``None`` seeds from ``torch.seed()``-style entropy (non-deterministic).
        secure_mode: seed from the operating system's CSPRNG (``os.urandom``, 63 bits); ``seed`` must then be None.
            The result is still an MT19937 ``torch.Generator`` (not a cryptographic generator, 63-bit seed): it is
            NOT what protects the private APIs, whose privacy draws come from
            :class:`fastdpot.privacy.randomness.PrivacyRandomness` (secure by default). Caveat (as in Opacus'
            ``secure_mode``): noise is produced by floating-point sampling, whose low-order bits can leak
            information about the noiseless value (Mironov, CCS 2012).

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



def random_projections(num_projections: int, dim: int, generator=None, *, orthogonal: bool = False,
                       dtype: torch.dtype = torch.float64, device=None) -> torch.Tensor:
    """Projections θ_1..θ_k on the unit sphere S^{d-1}, as rows of a (k, d) tensor: the one sampler of directions.

    ``orthogonal=False``: i.i.d. uniform (normalised standard Gaussians). ``orthogonal=True``: ``⌈k/d⌉`` independent
    blocks, each the first ``min(d, rows left)`` rows of a Haar-random orthogonal matrix (QR of a Gaussian matrix with
    the signs of R's diagonal folded in; Mezzadri, Notices AMS 2007); every direction is marginally uniform, rows
    within a block are orthonormal, so :func:`fastdpot.privacy.orthogonal_sliced_sensitivity` bounds the
    projection's sensitivity deterministically. Drawn and normalised in float64, returned in ``dtype``.

    Args:
        num_projections: k >= 1. dim: d >= 1.
        generator: a ``torch.Generator`` (``None``: torch's global one) or a
            :class:`fastdpot.privacy.randomness.PrivacyRandomness` (private directions: secret OS-random normals in
            secure mode, the same draws as its ``torch.Generator`` in replayable mode).
        orthogonal: blocks of orthonormal rows (above).
        dtype: of the result (float64 by default). device: of the result (default: the generator's).

    Shape:
        returns (k, d); unit rows.

    Raises:
        ValueError: k < 1 or d < 1 (or not integers), a generator of another type.
    """
    from ._validate import check_generator, check_int

    k = check_int(num_projections, "num_projections")
    d = check_int(dim, "dim")
    check_generator(generator)
    if device is None:
        device = generator.device if isinstance(generator, torch.Generator) else "cpu"
    if generator is None:  # torch.randn without generator=: the overload that takes symbolic sizes (torch.compile)
        def normal(*shape):
            return torch.randn(*shape, dtype=torch.float64, device=device)
    elif isinstance(generator, torch.Generator):
        def normal(*shape):
            return torch.randn(*shape, generator=generator, dtype=torch.float64, device=device)
    else:
        def normal(*shape):
            return generator.normal(shape, dtype=torch.float64, device=device)
    if not orthogonal:
        th = normal(k, d)
        return (th / th.norm(dim=1, keepdim=True)).to(dtype)
    nb = -(-k // d)
    g = normal(nb, d, d)
    q, r = torch.linalg.qr(g)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)  # Haar: columns times sign(R_ii)
    return q.transpose(-2, -1).reshape(nb * d, d)[:k].to(dtype)
