"""Sort-free histogram mode of the flow step: per-direction histogram CDFs of the noisy particle projections.

Three passes over the particles per chunk of directions, each recomputing the projections and their noise in
registers (same Philox counters, so the same values), so no (N, k) projection array and no sort is needed:

1. ``_minmax_kernel``: per-block min / max of every noisy projected column (reduced on the host);
2. ``_hist_kernel``: ``B`` equal-width bins on ``[lo_j, hi_j]``, counts accumulated with atomics;
3. ``_hist_drift_kernel`` (d <= 128: fused with the drift and the Euler--Maruyama update, all k directions per
   block of particles, nothing of size N k stored) or ``_hist_transport_kernel`` (larger d, per chunk): the
   piecewise-linear CDF ``u = (C_b + frac * n_b) / N`` (``C_b`` particles in the
   bins below, ``n_b`` in the particle's bin, ``frac`` its position inside the bin) replaces the rank level
   ``r/(N-1)`` of exact mode; the target is the private quantile at level ``u`` as in exact mode; the unfused
   kernel writes ``coef[c, i] = s_ic - T`` in particle order (coalesced, no scatter) for ``accumulate_drift``.

Error against exact mode: ``|u - r_i/(N-1)| <= (n_b + 1)/N`` for every particle (the exact rank lies among the
``n_b`` particles of its bin), so the transported target moves by at most the private quantile function's
variation over that level interval (tested in tests/test_triton_flow.py). Reference:
``fastdpot.reference.flow.flow_step``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import acc_dtype, fast_noise_mode, proj_tile, randn_wide
from .projection_noise import tile_config

__all__ = ["histogram_coef", "histogram_step_fused", "bin_geometry", "FUSED_MAX_D"]


@triton.jit(do_not_specialize=["seed"])  # a fresh seed per step must not recompile
def _minmax_kernel(x_ptr, theta_ptr, noise_ptr, min_ptr, max_ptr, N, D, K, j0, KC,
                   stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr,
                   HAS_NOISE: tl.constexpr, STORE_NOISE: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, USE_DOT: tl.constexpr, ACC: tl.constexpr,
                   FAST_NOISE: tl.constexpr):
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_c = offs_c < KC
    s = proj_tile(x_ptr, theta_ptr, noise_ptr, offs_n, offs_c, mask_n, mask_c, D, K, j0,
                  stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr,
                  HAS_NOISE, STORE_NOISE, BLOCK_N, BLOCK_K, BLOCK_D, USE_DOT, ACC, FAST_NOISE)
    mn = tl.min(tl.where(mask_n[:, None], s, float("inf")), axis=0)
    mx = tl.max(tl.where(mask_n[:, None], s, float("-inf")), axis=0)
    tl.store(min_ptr + pid_n * KC + offs_c, mn, mask=mask_c)
    tl.store(max_ptr + pid_n * KC + offs_c, mx, mask=mask_c)


@triton.jit
def _bin_of(s, lo_ptr, width_ptr, offs_c, mask_c, HISTOGRAM_BINS: tl.constexpr):
    lo = tl.load(lo_ptr + offs_c, mask=mask_c, other=0.0)
    width = tl.load(width_ptr + offs_c, mask=mask_c, other=1.0)
    t = (s - lo[None, :]) / width[None, :]
    t = tl.minimum(tl.maximum(t, 0.0), HISTOGRAM_BINS * 1.0)
    b = tl.minimum(t.to(tl.int32), HISTOGRAM_BINS - 1)
    return b, t - b


@triton.jit
def _hist_target(s, lo_ptr, width_ptr, hist_ptr, cum_ptr, q_ptr, offs_c, mask_c, mask, N, M,
                 HISTOGRAM_BINS: tl.constexpr, ACC: tl.constexpr):
    """Private quantile at the histogram-CDF level of every entry of the (BLOCK_N, BLOCK_K) tile ``s``."""
    b, frac = _bin_of(s, lo_ptr, width_ptr, offs_c, mask_c, HISTOGRAM_BINS)
    hb = offs_c[None, :] * HISTOGRAM_BINS + b
    cnt = tl.load(hist_ptr + hb, mask=mask, other=0).to(ACC)
    below = tl.load(cum_ptr + hb, mask=mask, other=0).to(ACC)
    u = (below + frac * cnt) / N
    pos = u * (M - 1)
    lo = tl.minimum(tl.maximum(pos.to(tl.int32), 0), M - 1)
    hi = tl.minimum(lo + 1, M - 1)
    f = pos - lo
    qrow = q_ptr + offs_c.to(tl.int64)[None, :] * M
    q_lo = tl.load(qrow + lo, mask=mask, other=0.0)
    q_hi = tl.load(qrow + hi, mask=mask, other=0.0)
    t = q_lo + f * (q_hi - q_lo)
    return t


@triton.jit(do_not_specialize=["seed"])  # a fresh seed per step must not recompile
def _hist_kernel(x_ptr, theta_ptr, lo_ptr, width_ptr, hist_ptr, N, D, K, j0, KC,
                 stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr,
                 HAS_NOISE: tl.constexpr, HISTOGRAM_BINS: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, USE_DOT: tl.constexpr, ACC: tl.constexpr,
                 FAST_NOISE: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_c = offs_c < KC
    s = proj_tile(x_ptr, theta_ptr, x_ptr, offs_n, offs_c, mask_n, mask_c, D, K, j0,
                  stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr,
                  HAS_NOISE, False, BLOCK_N, BLOCK_K, BLOCK_D, USE_DOT, ACC, FAST_NOISE)
    b, _ = _bin_of(s, lo_ptr, width_ptr, offs_c, mask_c, HISTOGRAM_BINS)
    ones = tl.full(b.shape, 1, tl.int32)
    tl.atomic_add(hist_ptr + offs_c[None, :] * HISTOGRAM_BINS + b, ones, mask=mask_n[:, None] & mask_c[None, :])


@triton.jit(do_not_specialize=["seed"])  # a fresh seed per step must not recompile
def _hist_transport_kernel(x_ptr, theta_ptr, lo_ptr, width_ptr, hist_ptr, cum_ptr, q_ptr, coef_ptr,
                           N, M, D, K, j0, KC, stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr,
                           HAS_NOISE: tl.constexpr, HISTOGRAM_BINS: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, USE_DOT: tl.constexpr, ACC: tl.constexpr,
                           FAST_NOISE: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_c = offs_c < KC
    mask = mask_n[:, None] & mask_c[None, :]
    s = proj_tile(x_ptr, theta_ptr, x_ptr, offs_n, offs_c, mask_n, mask_c, D, K, j0,
                  stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr,
                  HAS_NOISE, False, BLOCK_N, BLOCK_K, BLOCK_D, USE_DOT, ACC, FAST_NOISE)
    t = _hist_target(s, lo_ptr, width_ptr, hist_ptr, cum_ptr, q_ptr, offs_c, mask_c, mask, N, M, HISTOGRAM_BINS, ACC)
    tl.store(coef_ptr + offs_c.to(tl.int64)[None, :] * N + offs_n[:, None], s - t, mask=mask)


@triton.jit(do_not_specialize=["seed", "seed_b"])  # a fresh seed per step must not recompile
def _hist_drift_kernel(x_ptr, theta_ptr, lo_ptr, width_ptr, hist_ptr, cum_ptr, q_ptr, drift_ptr, new_ptr, brown_ptr,
                       N, M, D, K, stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr, scalars_ptr, seed_b,
                       HAS_NOISE: tl.constexpr, HISTOGRAM_BINS: tl.constexpr, BROWNIAN: tl.constexpr,
                       STORE_BROWN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       BLOCK_D: tl.constexpr, USE_DOT: tl.constexpr, ACC: tl.constexpr, FAST_NOISE: tl.constexpr):
    """Pass 3 fused with the drift and the Euler--Maruyama update (d <= BLOCK_D): a block of particles loops over
    all k directions, keeping its (BLOCK_N, d) drift in registers; nothing of size N k is stored."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    acc = tl.zeros((BLOCK_N, BLOCK_D), dtype=ACC)
    for c0 in range(0, K, BLOCK_K):
        offs_c = c0 + tl.arange(0, BLOCK_K)
        mask_c = offs_c < K
        mask = mask_n[:, None] & mask_c[None, :]
        s = proj_tile(x_ptr, theta_ptr, x_ptr, offs_n, offs_c, mask_n, mask_c, D, K, 0,
                      stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr,
                      HAS_NOISE, False, BLOCK_N, BLOCK_K, BLOCK_D, USE_DOT, ACC, FAST_NOISE)
        t = _hist_target(s, lo_ptr, width_ptr, hist_ptr, cum_ptr, q_ptr, offs_c, mask_c, mask, N, M, HISTOGRAM_BINS,
                         ACC)
        coef = tl.where(mask, s - t, 0.0)
        th = tl.load(theta_ptr + offs_c.to(tl.int64)[:, None] * stride_tk + offs_d[None, :] * stride_td,
                     mask=mask_c[:, None] & mask_d[None, :], other=0.0).to(ACC)
        if USE_DOT:
            acc += tl.dot(coef, th, input_precision="tf32x3")
        else:
            acc += tl.sum(coef[:, :, None] * th[None, :, :], axis=1)
    acc = acc * tl.load(scalars_ptr).to(ACC)
    rows = offs_n.to(tl.int64)
    out = rows[:, None] * D + offs_d[None, :]
    mask2 = mask_n[:, None] & mask_d[None, :]
    tl.store(drift_ptr + out, acc, mask=mask2)
    x = tl.load(x_ptr + rows[:, None] * stride_xn + offs_d[None, :] * stride_xd, mask=mask2, other=0.0).to(ACC)
    new = x - tl.load(scalars_ptr + 1).to(ACC) * acc
    if BROWNIAN:
        z = randn_wide(seed_b, out).to(ACC)
        new += tl.load(scalars_ptr + 2).to(ACC) * z
        if STORE_BROWN:
            tl.store(brown_ptr + out, z, mask=mask2)
    tl.store(new_ptr + out, new, mask=mask2)


def bin_geometry(col_min: torch.Tensor, col_max: torch.Tensor, histogram_bins: int):
    """(lo, width) of ``histogram_bins`` equal bins on ``[min, max]`` per column (width 1 for a constant column)."""
    width = (col_max - col_min) / histogram_bins
    width = torch.where(width > 0, width, torch.ones_like(width))
    return col_min.contiguous(), width.contiguous()


def _histogram_pass12(x, projections, j0, kc, seed, noise_std, histogram_bins, noise_out, fast_noise=False):
    """Passes 1 and 2: bin geometry, counts and exclusive cumulative counts of directions j0..j0+kc-1."""
    n, d = x.shape
    k = projections.shape[0]
    bn, bk, bd, use_dot = tile_config(x.dtype, d)
    grid = (triton.cdiv(n, bn), triton.cdiv(kc, bk))
    has_noise = noise_std > 0
    std = torch.tensor([float(noise_std)], dtype=x.dtype, device=x.device)  # σ in the data dtype
    common = (n, d, k, j0, kc, x.stride(0), x.stride(1), projections.stride(0), projections.stride(1), seed, std)
    meta = dict(BLOCK_N=bn, BLOCK_K=bk, BLOCK_D=bd, USE_DOT=use_dot, ACC=acc_dtype(x.dtype),
                FAST_NOISE=fast_noise_mode(fast_noise, j0, bk))
    pmin = torch.empty((grid[0], kc), dtype=x.dtype, device=x.device)
    pmax = torch.empty_like(pmin)
    _minmax_kernel[grid](x, projections, noise_out if noise_out is not None else x, pmin, pmax, *common,
                         HAS_NOISE=has_noise, STORE_NOISE=has_noise and noise_out is not None, **meta)
    lo, width = bin_geometry(pmin.amin(0), pmax.amax(0), histogram_bins)
    hist = torch.zeros((kc, histogram_bins), dtype=torch.int32, device=x.device)
    _hist_kernel[grid](x, projections, lo, width, hist, *common, HAS_NOISE=has_noise, HISTOGRAM_BINS=histogram_bins,
                       **meta)
    cum = torch.cumsum(hist, dim=1, dtype=torch.int64) - hist  # particles in the bins strictly below
    return lo, width, hist, cum, grid, common, meta


def histogram_coef(x, projections, j0, kc, seed, noise_std, sorted_target, histogram_bins, coef, noise_out=None,
                   fast_noise=False):
    """Fill ``coef`` (kc, N) with ``s - T_hist(s)`` for the particles ``x`` (N, d) on directions j0..j0+kc-1.

    ``sorted_target`` (kc, M) holds the sorted noisy private projections of the chunk; ``noise_out`` (N, k)
    receives the particle noise draws when given; ``fast_noise``: the particles' cheap normals (``randn_fast``).
    """
    n, d = x.shape
    k = projections.shape[0]
    m = sorted_target.shape[1]
    lo, width, hist, cum, grid, common, meta = _histogram_pass12(x, projections, j0, kc, seed, noise_std,
                                                                 histogram_bins, noise_out, fast_noise)
    _hist_transport_kernel[grid](x, projections, lo, width, hist, cum, sorted_target, coef,
                                 n, m, d, k, j0, kc, *common[5:], HAS_NOISE=noise_std > 0,
                                 HISTOGRAM_BINS=histogram_bins, **meta)
    return coef


# largest d for which pass 3 keeps a (BLOCK_N, d) drift tile in registers (histogram_step_fused)
FUSED_MAX_D = 128


def histogram_step_fused(x, projections, seed, noise_std, sorted_target, histogram_bins, drift, new, step_size,
                         brownian_std, seed_b, noise_out=None, brownian_out=None, fast_noise=False):
    """Whole histogram-mode step for d <= FUSED_MAX_D: passes 1-2 over all k directions (only k * histogram_bins
    counters), then one fused pass computing the transport, the drift and the Euler--Maruyama update.

    ``sorted_target`` (k, M): sorted noisy private projections. Writes ``drift`` and ``new`` (N, d).
    ``brownian_std``: sqrt(2·diffusion·step_size), the Brownian term's standard deviation (derived from λ and h).
    """
    n, d = x.shape
    k = projections.shape[0]
    m = sorted_target.shape[1]
    lo, width, hist, cum, _, common, meta = _histogram_pass12(x, projections, 0, k, seed, noise_std, histogram_bins,
                                                              noise_out, fast_noise)
    bd = max(16, triton.next_power_of_2(d))
    if x.dtype == torch.float32:
        bn, bk, use_dot = 64, 32, True
    else:
        bn, bk, use_dot = 16, 8, False
    scalars = torch.tensor([1.0 / k, float(step_size), float(brownian_std)], dtype=x.dtype, device=x.device)
    _hist_drift_kernel[(triton.cdiv(n, bn),)](
        x, projections, lo, width, hist, cum, sorted_target, drift, new,
        brownian_out if brownian_out is not None else drift, n, m, d, k, *common[5:], scalars, seed_b,
        HAS_NOISE=noise_std > 0, HISTOGRAM_BINS=histogram_bins, BROWNIAN=brownian_std > 0,
        STORE_BROWN=brownian_out is not None,
        BLOCK_N=bn, BLOCK_K=bk, BLOCK_D=bd, USE_DOT=use_dot, ACC=meta["ACC"],
        FAST_NOISE=fast_noise_mode(fast_noise, 0, bk), num_warps=8 if bd >= 64 else 4)
