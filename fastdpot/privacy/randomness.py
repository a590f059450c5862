"""The source of privacy-protecting randomness: secret by default, replayable on request.

Every random draw that protects privacy -- batch sampling, random directions, mechanism noise and the Philox keys
handed to the C++/Triton kernels -- goes through one :class:`PrivacyRandomness` object, in one of two modes:

* **secure** (``secure_mode=True``, the default everywhere): every draw comes from the operating system's CSPRNG
  (``os.urandom`` / ``secrets``; getrandom(2) on Linux, a ChaCha20-based generator with far more than 128 bits of
  secret state). Nothing is seeded, so there is no seed to leak: the object holds no secret state at all, and
  nothing of it is ever written to outputs, logs, ``state_dict`` or checkpoints. Two runs with the same public seed
  give different outputs. Draws:

  - Gaussian noise (:meth:`PrivacyRandomness.normal`): Box--Muller in float64 from two 64-bit OS-random words per
    pair of normals. The radius uniform is ``u = (w + 1/2)·2^-64`` (never 0), so the radius reaches
    ``sqrt(2·ln 2^65) = 9.49σ`` (the reach of the kernels' ``randn_wide``), far beyond float32 ``torch.randn``'s
    cap of 5.77σ; the angle has 53 bits. Cast to the requested dtype afterwards.
  - Exponential (Laplace) draws: ``-ln u`` with the same 64-bit ``u`` (reach 45: tail mass e^-45 per draw).
  - Poisson inclusion tests: 53-bit uniform integers; fixed-size batches and subsets of a pool: partial
    Fisher--Yates with ``secrets.randbelow`` (exactly uniform, rejection sampling).
  - Kernel keys (:meth:`PrivacyRandomness.seed`): 62 fresh OS-random bits per release, the key of the C++/Triton
    Philox4x32-10 streams (and of the reference backends' ``torch.Generator``, which replays them). Philox is a
    counter-based generator, not a cryptographically proven one, and a 62-bit key is below 128 bits; what protects
    the noise is that every release gets a fresh secret key, drawn from the OS and never stored or returned. An
    attacker would have to search the key of each release separately. We state this plainly rather than claim a
    CSPRNG inside the kernels.

* **replayable** (``secure_mode=False``, explicit opt-in; ``--replayable-noise`` in the command-line tools): every
  draw comes from a ``torch.Generator`` exactly as before (same calls in the same order: batches, directions and
  kernel seeds are bit-identical to earlier versions), except that Gaussian noise is now always drawn in float64 and
  then cast (torch's float64 CPU normals use 53-bit uniforms and reach 8.57σ; float32 ones stop at 5.77σ). Anyone
  who holds the seed (or a checkpoint with the generator state) and the other rows can recompute the noise: there
  is **no privacy guarantee against such a party**. Use it for tests and debugging.

Floating-point caveat (both modes): the noise is sampled in floating point, whose low-order bits can leak
information about the noiseless value (Mironov, "On significance of the least significant bits for differential
privacy", CCS 2012). Secure mode removes seed predictability, not that channel.

References:
    Box & Muller, "A note on the generation of random normal deviates", Ann. Math. Stat. 1958; Salmon et al.,
    "Parallel random numbers: as easy as 1, 2, 3", SC 2011 (Philox); Python's ``secrets`` module (PEP 506).
"""
from __future__ import annotations

import math
import os
import secrets
from typing import Optional, Sequence, Union

import numpy as np
import torch

__all__ = ["PrivacyRandomness", "privacy_randomness", "wide_normal_from_words"]

_SEED_BITS = 62  # the kernels take seeds in [0, 2^62), as fastdpot.draw_seed
_TWO_PI_2_53 = 2.0 * math.pi * 2.0 ** -53


def wide_normal_from_words(w_radius: np.ndarray, w_angle: np.ndarray) -> np.ndarray:
    """Box--Muller pairs in float64 from 64-bit words: ``r = sqrt(-2 ln u)``, ``u = (w_r + 1/2)·2^-64``,
    angle ``2π·(w_a >> 11)·2^-53``; returns ``concat(r cos a, r sin a)``.

    ``u`` lies in [2^-65, 1] (the conversion of a word near 2^64 rounds to 1, giving r = 0), so ``|z|`` reaches
    ``sqrt(130 ln 2) = 9.49`` at the smallest word: the tail beyond is 2·10^-21 per draw.

    Shape:
        two uint64 arrays (m,) -> float64 array (2m,).
    """
    u = (w_radius.astype(np.float64) + 0.5) * 2.0 ** -64
    r = np.sqrt(-2.0 * np.log(u))
    a = (w_angle >> np.uint64(11)).astype(np.float64) * _TWO_PI_2_53
    return np.concatenate([r * np.cos(a), r * np.sin(a)])


def _os_words(n: int) -> np.ndarray:
    return np.frombuffer(os.urandom(8 * n), dtype=np.uint64) if n > 0 else np.zeros(0, dtype=np.uint64)


def _numel(shape) -> int:
    return int(np.prod(tuple(shape), dtype=np.int64))


class PrivacyRandomness:
    """Every privacy-protecting draw of fastdpot (see the module docstring for the generators used and why).

    Args:
        secure_mode: True (default): OS CSPRNG, not replayable, no stored secret. False: the ``torch.Generator``
            ``generator`` (replayable; no guarantee against anyone who holds its seed or state).
        generator: ``torch.Generator`` for the replayable mode (default: a freshly seeded one). Must be None in
            secure mode (a seeded generator there would be silently unused).

    Raises:
        ValueError: ``secure_mode`` not a bool, a generator given with ``secure_mode=True``, or not a
            ``torch.Generator``.
    """

    #: What :func:`fastdpot._validate.check_generator` recognises as a privacy source.
    is_privacy_source = True

    def __init__(self, secure_mode: bool = True, generator: Optional[torch.Generator] = None):
        if not isinstance(secure_mode, bool):
            raise ValueError(f"secure_mode must be a bool, got {secure_mode!r}")
        if secure_mode and generator is not None:
            raise ValueError("generator must be None for privacy draws in secure mode (they come from the operating "
                             "system); pass secure_mode=False to replay the noise from a torch.Generator")
        if not secure_mode:
            if generator is None:
                generator = torch.Generator(device="cpu")
                generator.seed()
            if not isinstance(generator, torch.Generator):
                raise ValueError(f"generator must be a torch.Generator, got {generator!r}")
        self.secure_mode = secure_mode
        self.generator = generator

    def __repr__(self):
        return f"PrivacyRandomness(secure_mode={self.secure_mode})"

    # -- primitive draws --------------------------------------------------------------------------------
    def seed(self) -> int:
        """A 62-bit key for a kernel's noise streams (fresh OS bits in secure mode; ``draw_seed`` otherwise)."""
        if self.secure_mode:
            return secrets.randbits(_SEED_BITS)
        from .._random import draw_seed

        return draw_seed(self.generator)

    def normal(self, shape: Sequence[int], dtype: torch.dtype = torch.float64,
               device: Union[str, torch.device] = "cpu") -> torch.Tensor:
        """Standard normals of ``shape``, drawn in float64 (wide tails, module docstring), then cast to ``dtype``.

        The one noise source of every private path in fastdpot (never float32 ``torch.randn``).
        """
        shape = tuple(int(s) for s in shape)
        n = _numel(shape)
        if self.secure_mode:
            m = (n + 1) // 2
            w = _os_words(2 * m)
            z = torch.from_numpy(wide_normal_from_words(w[:m], w[m:])[:n].copy()).reshape(shape)
        else:
            z = torch.randn(shape, generator=self.generator, dtype=torch.float64, device=self.generator.device)
        return z.to(dtype=dtype, device=device)

    def exponential(self, shape: Sequence[int], dtype: torch.dtype = torch.float64,
                    device: Union[str, torch.device] = "cpu") -> torch.Tensor:
        """Exp(1) draws of ``shape`` in float64, cast to ``dtype`` (for Laplace noise ``b·(E1 − E2)``)."""
        shape = tuple(int(s) for s in shape)
        if self.secure_mode:
            u = (_os_words(_numel(shape)).astype(np.float64) + 0.5) * 2.0 ** -64
            e = torch.from_numpy(-np.log(u)).reshape(shape)
        else:
            e = torch.empty(shape, dtype=torch.float64, device=self.generator.device).exponential_(
                1.0, generator=self.generator)
        return e.to(dtype=dtype, device=device)

    def uniform_int53(self, n: int) -> torch.Tensor:
        """n integers uniform in [0, 2^53) (int64), for Poisson inclusion tests."""
        if self.secure_mode:
            return torch.from_numpy((_os_words(n) >> np.uint64(11)).astype(np.int64))
        return torch.randint(0, 2 ** 53, (n,), generator=self.generator, dtype=torch.int64)

    def subset(self, n: int, k: int) -> torch.Tensor:
        """k distinct indices of [0, n), a uniformly random ordered subset (LongTensor (k,)).

        Secure: partial Fisher--Yates with ``secrets.randbelow`` (O(k)). Replayable: ``randperm(n)[:k]``.
        """
        if not self.secure_mode:
            return torch.randperm(n, generator=self.generator)[:k]
        swapped = {}
        out = []
        for i in range(k):
            j = i + secrets.randbelow(n - i)
            out.append(swapped.get(j, j))
            swapped[j] = swapped.get(i, i)
        return torch.tensor(out, dtype=torch.int64)

    def projections(self, num_projections: int, dim: int, *, orthogonal: bool = False,
                    dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Projections on the sphere, as :func:`fastdpot._random.random_projections` (float64 draws from this
        source). Shape (k, d)."""
        from .._random import random_projections

        return random_projections(num_projections, dim, self, orthogonal=orthogonal, dtype=dtype)


def privacy_randomness(secure_mode: bool = True, generator: Optional[torch.Generator] = None, *,
                       generator_for_public: bool = False) -> PrivacyRandomness:
    """The privacy source for an API that takes ``(secure_mode, generator)``; the rule every API follows:

    * ``secure_mode=False``: privacy draws come from ``generator`` (replayable).
    * ``secure_mode=True`` (default): privacy draws come from the OS. If the API also makes public draws
      (initial particles, latents: ``generator_for_public=True``), ``generator`` drives those only; an API whose
      every draw is private raises ValueError when given a generator (it would be silently unused).

    Raises:
        ValueError: see above; ``secure_mode`` not a bool.
    """
    if not isinstance(secure_mode, bool):
        raise ValueError(f"secure_mode must be a bool, got {secure_mode!r}")
    if secure_mode:
        if generator is not None and not generator_for_public:
            raise ValueError("generator is only used with secure_mode=False here (every draw of this function "
                             "protects privacy and comes from the operating system in secure mode); pass "
                             "secure_mode=False to replay the noise from the generator")
        return PrivacyRandomness(True)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    return PrivacyRandomness(False, generator)
