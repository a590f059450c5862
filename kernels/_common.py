"""Shared pieces of the Triton kernels: the fused projection + Philox-noise tile, seed streams, direction chunking.

Noise convention (every Triton kernel of fastdpot): the standard normal added to the projection of row ``i`` on
direction ``j`` (global index, independent of chunking) is ``randn_wide(seed_s, i * k + j)`` --
Philox4x32-10 (``tl.randint4x``) with the 64-bit counter ``i*k + j`` and the key ``seed_s``, where ``seed_s = stream_seed(seed, s)``
separates the streams (particles / private rows / Brownian increments). The Brownian increment of particle ``i``,
coordinate ``l`` is ``randn_wide(seed_b, i * d + l)``.

Why not ``tl.randn``: it clamps its Box--Muller uniform at 1e-7, i.e. it samples a Gaussian truncated at
|z| <= 5.68. Bounded noise breaks the Gaussian mechanism's analysis: an output beyond the support of one neighbour
is impossible under it, an unaccounted failure probability of order phi(5.68) ~ 1e-7 per noisy coordinate (per
step, per private row), comparable to the delta = 1e-5 budgets of the papers over thousands of steps.
``randn_wide`` builds the radius uniform from 64 random bits, so its support reaches |z| = 9.49 (Gaussian tail
beyond: < 5e-21 per draw), and the angle from 32 more bits. The same ``seed`` therefore gives the same noise whatever the chunk size, and a
``return_noise`` path stores exactly these draws so the torch reference can replay them.

The particles' smoothing noise (stream "particles": synthetic rows, no privacy rests on it; also the generated
side of the DP-SWD loss) takes ``randn_fast`` instead: four normals per Philox call (counter
``i * ceil(k/4) + j // 4``, lane ``j % 4``, 32-bit Box--Muller uniforms, support |z| <= 6.8), a quarter of the
Philox work -- the same choice as the C++ kernels' ``normal4`` (csrc/flow_normal.h). Also independent of chunking.
"""
from __future__ import annotations

import contextlib
import os

import torch
import triton
import triton.language as tl

from fastdpot._ext import BackendUnavailableError, triton_interpret

__all__ = ["STREAM_PARTICLES", "STREAM_PRIVATE", "STREAM_BROWNIAN", "stream_seed", "direction_chunk",
           "check_launchable", "device_guard", "proj_tile", "randn_wide", "normal_from_uints",
           "DEFAULT_CHUNK_ELEMS", "randn_fast", "fast_noise_stream", "fast_noise_mode"]

STREAM_PARTICLES, STREAM_PRIVATE, STREAM_BROWNIAN = 0, 1, 2
_MASK62 = (1 << 62) - 1
_MASK64 = (1 << 64) - 1

# Elements of one (directions x rows) projection chunk: 2**29 float32 = 2 GiB for the projections; with the sorted
# copy and torch.sort's int64 indices about 16 bytes per element are live (8.6 GB), see kernels/flow_step.py.
DEFAULT_CHUNK_ELEMS = 1 << 29


def stream_seed(seed: int, stream: int) -> int:
    """Philox key of noise stream ``stream`` derived from the caller's 62-bit ``seed`` (SplitMix64 finaliser)."""
    z = (int(seed) + 0x9E3779B97F4A7C15 * (stream + 1)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & _MASK62


def fast_noise_mode(fast: bool, j0: int, block_k: int) -> int:
    """FAST_NOISE constexpr of :func:`proj_tile`: 0 (wide normals), 1 (cheap, aligned tiles), 2 (cheap, unaligned)."""
    if not fast:
        return 0
    return 1 if j0 % 4 == 0 and block_k % 4 == 0 else 2


def direction_chunk(num_rows: int, k: int, chunk_elems: int = None) -> int:
    """Directions per chunk so that ``num_rows * chunk <= chunk_elems`` (a multiple of 16 when k allows).

    ``chunk_elems`` defaults to the environment variable ``FASTDPOT_TRITON_CHUNK_ELEMS`` or 2**29.
    """
    if chunk_elems is None:
        chunk_elems = int(os.environ.get("FASTDPOT_TRITON_CHUNK_ELEMS", DEFAULT_CHUNK_ELEMS))
    kc = max(1, chunk_elems // max(num_rows, 1))
    if kc >= 16:
        kc -= kc % 16
    return int(min(k, kc))


def check_launchable(*tensors: torch.Tensor) -> None:
    """Triton needs CUDA tensors, or CPU tensors with ``TRITON_INTERPRET=1``; float32 or float64; one device."""
    dev = tensors[0].device
    for t in tensors:
        if t.device != dev:
            raise ValueError(f"all tensors must be on one device, got {dev} and {t.device}")
        if t.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"the triton backend supports float32 and float64, got dtype {t.dtype}")
        if t.dtype != tensors[0].dtype:
            raise ValueError(f"all tensors must share one dtype, got {tensors[0].dtype} and {t.dtype}")
    if dev.type == "cpu" and not triton_interpret():
        raise BackendUnavailableError("the triton backend needs CUDA tensors (CPU tensors run only under "
                                      "TRITON_INTERPRET=1, Triton's slow interpreter for testing)")
    if dev.type not in ("cpu", "cuda"):
        raise BackendUnavailableError(f"the triton backend runs on CUDA (or CPU under TRITON_INTERPRET=1), "
                                      f"got device {dev}")


def device_guard(t: torch.Tensor):
    """Launch on ``t``'s GPU (Triton launches on the current CUDA device); a no-op for CPU tensors."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


@triton.jit
def normal_from_uints(i1, i2, i3):
    """Box--Muller: standard normal (float32) from three uint32 blocks; i1:i2 form a 64-bit radius uniform
    ``u1 = (i1 + (i2 + 1/2) 2^-32) 2^-32`` in (0, 1] (so ``sqrt(-2 ln u1) <= 9.49``), i3 the angle."""
    two_m32: tl.constexpr = 2.3283064365386963e-10
    hi = i1.to(tl.uint32, bitcast=True).to(tl.float32)
    lo = i2.to(tl.uint32, bitcast=True).to(tl.float32)
    u1 = (hi + (lo + 0.5) * two_m32) * two_m32
    u1 = tl.minimum(u1, 1.0)
    u2 = i3.to(tl.uint32, bitcast=True).to(tl.float32) * two_m32
    r = tl.sqrt(-2.0 * tl.log(u1))
    return r * tl.cos(6.283185307179586 * u2)


@triton.jit
def randn_wide(seed, offset):
    """Standard normals (float32) for the int64 counters ``offset`` under key ``seed`` (Philox4x32-10)."""
    i1, i2, i3, _ = tl.randint4x(seed, offset)
    return normal_from_uints(i1, i2, i3)


def fast_noise_stream(stream: int) -> bool:
    """Whether noise stream ``stream`` takes the cheap normals of :func:`randn_fast`: the particles' (synthetic
    rows: their smoothing noise protects nothing). The private rows' stream -- the Gaussian mechanism -- always
    takes ``randn_wide``."""
    return stream == STREAM_PARTICLES


@triton.jit
def _box_muller32(ia, ib):
    """Two standard normals from two uint32 blocks (32-bit radius uniform: support |z| <= 6.8)."""
    two_m32: tl.constexpr = 2.3283064365386963e-10
    u1 = (ia.to(tl.uint32, bitcast=True).to(tl.float32) + 0.5) * two_m32
    u1 = tl.minimum(u1, 1.0)
    u2 = ib.to(tl.uint32, bitcast=True).to(tl.float32) * two_m32
    r = tl.sqrt(-2.0 * tl.log(u1))
    a = 6.283185307179586 * u2
    return r * tl.cos(a), r * tl.sin(a)


@triton.jit
def randn_fast(seed, rows, col0, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ALIGNED: tl.constexpr):
    """(BLOCK_N, BLOCK_K) standard normals for rows ``rows`` (int64, (BLOCK_N,)) and global columns
    ``col0 + arange(BLOCK_K)``: four per Philox4x32-10 call. Column ``j`` of row ``i`` is lane ``j % 4`` of the
    block with counter ``i * ceil(K/4) + j // 4`` (lanes 0, 1: Box--Muller of words 1, 2; lanes 2, 3: of words
    3, 4). With ``ALIGNED`` (``col0 % 4 == 0`` and ``BLOCK_K % 4 == 0``) one call serves four columns; otherwise
    every entry draws its own block and keeps its lane (same values, four times the Philox work).
    For the particles' noise only (synthetic rows; the 32-bit radius cuts the tail at 6.8σ)."""
    K4 = (K + 3) // 4
    if ALIGNED:
        q = col0 // 4 + tl.arange(0, BLOCK_K // 4)
        i1, i2, i3, i4 = tl.randint4x(seed, rows[:, None] * K4 + q[None, :])
        z0, z1 = _box_muller32(i1, i2)
        z2, z3 = _box_muller32(i3, i4)
        # interleave so that column 4q + l holds z_l: join -> (BN, BK/4, 2, 2) with [.., q, a, b] = z_{2a + b}
        z = tl.join(tl.join(z0, z2), tl.join(z1, z3))
        return tl.reshape(z, (BLOCK_N, BLOCK_K))
    else:
        cols = col0 + tl.arange(0, BLOCK_K)
        i1, i2, i3, i4 = tl.randint4x(seed, rows[:, None] * K4 + (cols // 4)[None, :])
        z0, z1 = _box_muller32(i1, i2)
        z2, z3 = _box_muller32(i3, i4)
        lane = (cols % 4)[None, :]
        return tl.where(lane == 0, z0, tl.where(lane == 1, z1, tl.where(lane == 2, z2, z3)))


def acc_dtype(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


@triton.jit
def proj_tile(x_ptr, theta_ptr, noise_ptr, offs_n, offs_c, mask_n, mask_c, D, K, j0,
              stride_xn, stride_xd, stride_tk, stride_td, seed, noise_std_ptr,
              HAS_NOISE: tl.constexpr, STORE_NOISE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_D: tl.constexpr, USE_DOT: tl.constexpr, ACC: tl.constexpr, FAST_NOISE: tl.constexpr = 0):
    """(BLOCK_N, BLOCK_K) tile of ``x[offs_n] @ theta[j0 + offs_c].T + noise_std * randn``; masked entries are 0.

    ``offs_c`` must be ``c_start + arange(BLOCK_K)`` (a tile of consecutive directions of the chunk).
    ``noise_std_ptr`` points to σ (noise_std) in the data dtype. With STORE_NOISE the scaled noise is written to
    ``noise_ptr`` in (N, K) row-major layout (global direction). FAST_NOISE: 0 = ``randn_wide`` (privacy-grade),
    1 = ``randn_fast`` with aligned tiles, 2 = ``randn_fast`` per entry (unaligned ``j0``).
    """
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=ACC)
    rows = offs_n.to(tl.int64)
    dirs = (j0 + offs_c).to(tl.int64)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        mask_d = offs_d < D
        xt = tl.load(x_ptr + rows[:, None] * stride_xn + offs_d[None, :] * stride_xd,
                     mask=mask_n[:, None] & mask_d[None, :], other=0.0).to(ACC)
        tt = tl.load(theta_ptr + dirs[None, :] * stride_tk + offs_d[:, None] * stride_td,
                     mask=mask_c[None, :] & mask_d[:, None], other=0.0).to(ACC)
        if USE_DOT:
            acc += tl.dot(xt, tt, input_precision="tf32x3")
        else:
            acc += tl.sum(xt[:, :, None] * tt[None, :, :], axis=1)
    if HAS_NOISE:
        offs = rows[:, None] * K + dirs[None, :]
        if FAST_NOISE == 0:
            z = randn_wide(seed, offs)
        else:
            z = randn_fast(seed, rows, j0 + tl.min(offs_c, axis=0), K, BLOCK_N, BLOCK_K, FAST_NOISE == 1)
        z = z.to(ACC) * tl.load(noise_std_ptr).to(ACC)
        acc += z
        if STORE_NOISE:
            tl.store(noise_ptr + offs, z, mask=mask_n[:, None] & mask_c[None, :])
    acc = tl.where(mask_n[:, None] & mask_c[None, :], acc, 0.0)
    return acc
