"""Keyed Gaussian streams: Philox4x32-10 and Box--Muller in numpy, the reference of the kernels' noise.

Every keyed draw of fastdpot -- the reference backends' noise, the sharded flows' per-particle draws, and the C++
kernels' (``csrc/common.h``, ``csrc/flow_normal.h``) -- is a pure function of ``(key, stream, index)``:

* the **key** is a 64-bit integer (a kernel key of :meth:`fastdpot.privacy.PrivacyRandomness.seed`: 62 secret OS
  bits per release in secure mode). All 64 bits enter Philox (a ``torch.Generator`` would keep only 32 of them);
* the **stream** (64 bits) and the block **counter** (64 bits) form Philox's 128-bit counter;
* normal number ``i`` of a stream is component ``i mod P`` of Philox block ``i div P``, with ``P`` normals per block:

  - ``per_block=2`` (privacy grade, ``common.h``'s ``normal2``): the radius uniform is the 64-bit word
    ``(r0, r1)``, ``u = (w + 1/2)·2^-64``, so the draws reach ``sqrt(2 ln 2^64) = 9.4σ``; the angle is
    ``2π(r2 + 1/2)·2^-32``;
  - ``per_block=4`` (``normal4``, for draws that protect nothing: the particles' smoothing noise, the Brownian term,
    initial particles): two Box--Muller pairs with 32-bit radius uniforms ``(r0, angle r1)``, ``(r2, angle r3)``
    (reach 6.7σ).

The arithmetic is exact integer arithmetic on uint64 arrays; the Box--Muller transform is float64 (the kernels' fast
single-precision transforms agree to about 1e-6). Where a draw lands does not depend on threads, chunking or how the
rows are sharded over processes: that is what lets a sharded flow move the same particles as one process.

References:
    Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011 (Philox4x32-10);
    Box & Muller, "A note on the generation of random normal deviates", Ann. Math. Stat. 1958.
"""
from __future__ import annotations

from typing import Union

import numpy as np
import torch

__all__ = ["philox4x32", "normals_from_words", "keyed_normals", "check_key"]

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_CHUNK = 1 << 18  # Philox blocks per vectorised pass (bounds the temporaries to a few MB)
_TWO_PI = 2.0 * np.pi


def check_key(key) -> int:
    """A Philox key: an integer in [0, 2^64) (negative int64 values are read modulo 2^64, as the kernels do)."""
    if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
        raise ValueError(f"key must be an integer, got {key!r}")
    key = int(key)
    if not -2 ** 63 <= key < 2 ** 64:
        raise ValueError(f"key must be an integer in [-2^63, 2^64), got {key!r}")
    return key % 2 ** 64


def philox4x32(key: int, stream: Union[int, np.ndarray], counter: np.ndarray):
    """The four 32-bit outputs of Philox4x32-10 (10 rounds) for ``key`` and the counters ``(counter, stream)``.

    Args:
        key: integer in [0, 2^64): key words ``(key mod 2^32, key >> 32)``.
        stream: integer or uint64 array broadcastable with ``counter``: counter words 2 and 3.
        counter: uint64 array: counter words 0 and 1 (the block index).

    Returns:
        ``(r0, r1, r2, r3)``: uint64 arrays of the broadcast shape holding values in [0, 2^32).
    """
    key = check_key(key)
    ctr = np.asarray(counter, dtype=np.uint64)
    st = np.asarray(stream, dtype=np.uint64)
    ctr, st = np.broadcast_arrays(ctr, st)
    c0, c1 = ctr & _MASK32, ctr >> _S32
    c2, c3 = st & _MASK32, st >> _S32
    k0, k1 = key & 0xFFFFFFFF, key >> 32
    for _ in range(10):
        p0 = c0 * _M0  # both factors < 2^32: the product is exact in uint64
        p1 = c2 * _M1
        c0, c1, c2, c3 = (p1 >> _S32) ^ c1 ^ np.uint64(k0), p1 & _MASK32, (p0 >> _S32) ^ c3 ^ np.uint64(k1), \
            p0 & _MASK32
        k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
    return c0, c1, c2, c3


def normals_from_words(r0, r1, r2, r3, per_block: int) -> np.ndarray:
    """Box--Muller of one Philox block's four 32-bit words (uint64 arrays of one shape) -> (..., per_block) float64
    (module docstring: ``per_block=2`` takes a 64-bit radius uniform from (r0, r1) and the angle from r2;
    ``per_block=4`` two pairs with 32-bit radius uniforms)."""
    if per_block == 2:
        u = ((r0 << _S32) | r1).astype(np.float64) + 0.5
        u *= 2.0 ** -64
        a = np.sqrt(-2.0 * np.log(u))
        t = _TWO_PI * ((r2.astype(np.float64) + 0.5) * 2.0 ** -32)
        return np.stack([a * np.cos(t), a * np.sin(t)], axis=-1)
    ua = (r0.astype(np.float64) + 0.5) * 2.0 ** -32
    ub = (r2.astype(np.float64) + 0.5) * 2.0 ** -32
    a, b = np.sqrt(-2.0 * np.log(ua)), np.sqrt(-2.0 * np.log(ub))
    ta = _TWO_PI * ((r1.astype(np.float64) + 0.5) * 2.0 ** -32)
    tb = _TWO_PI * ((r3.astype(np.float64) + 0.5) * 2.0 ** -32)
    return np.stack([a * np.cos(ta), a * np.sin(ta), b * np.cos(tb), b * np.sin(tb)], axis=-1)


def _block_normals(key: int, stream: np.ndarray, blocks: np.ndarray, per_block: int) -> np.ndarray:
    """Normals of whole Philox blocks: (S, nb) block indices and (S, 1) streams -> (S, nb·per_block) float64."""
    z = normals_from_words(*philox4x32(key, stream, blocks), per_block)
    return z.reshape(z.shape[0], -1)


def keyed_normals(key: int, streams, offset: int, count: int, *, per_block: int = 2,
                  dtype: torch.dtype = torch.float64, device: Union[str, torch.device] = "cpu") -> torch.Tensor:
    """Normals ``offset .. offset + count − 1`` of each of the ``streams`` of ``key`` (module docstring).

    Args:
        key: integer in [0, 2^64).
        streams: an integer stream, or a sequence of S integer streams.
        offset, count: the first normal's index and how many (integers >= 0).
        per_block: 2 (privacy grade, 9.4σ reach) or 4 (protects nothing).
        dtype, device: of the result (computed in float64 on the CPU, then cast and moved).

    Shape:
        returns (count,) for an integer stream, (S, count) for S streams.

    Raises:
        ValueError: a key, stream, offset or count out of range, ``per_block`` not 2 or 4.
    """
    key = check_key(key)
    if per_block not in (2, 4):
        raise ValueError(f"per_block must be 2 or 4, got {per_block!r}")
    scalar = isinstance(streams, (int, np.integer)) and not isinstance(streams, bool)
    st = [int(streams)] if scalar else [int(s) for s in streams]
    offset, count = int(offset), int(count)
    if offset < 0 or count < 0 or any(not 0 <= s < 2 ** 64 for s in st):
        raise ValueError(f"offset, count and streams must be >= 0 (streams < 2^64), got {offset}, {count}, {st}")
    out = np.empty((len(st), count), dtype=np.float64)
    if count and st:
        first, last = offset // per_block, (offset + count - 1) // per_block
        sv = np.asarray(st, dtype=np.uint64)[:, None]
        step = max(1, _CHUNK // len(st))
        pos = 0
        for b0 in range(first, last + 1, step):
            b1 = min(last + 1, b0 + step)
            z = _block_normals(key, sv, np.arange(b0, b1, dtype=np.uint64)[None, :], per_block)
            lo = offset - b0 * per_block if b0 == first else 0
            take = min(z.shape[1] - lo, count - pos)
            out[:, pos:pos + take] = z[:, lo:lo + take]
            pos += take
    t = torch.from_numpy(out[0] if scalar else out)
    return t.to(device=device, dtype=dtype)
