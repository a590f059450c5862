"""Sort-free histogram mode of the flow step: per-direction histogram CDFs of the noisy particle projections.

Three passes over the particles per chunk of directions, each recomputing the projections and their noise in
registers (same Philox counters, so the same values), so no (N, k) projection array and no sort is needed:

1. ``_minmax_kernel``: per-block min / max of every noisy projected column (reduced on the host);
2. ``_hist_kernel``: ``B`` equal-width bins on ``[lo_j, hi_j]``, counts accumulated with atomics;
3. ``_hist_transport_kernel``: the piecewise-linear CDF ``u = (C_b + frac * n_b) / N`` (``C_b`` particles in the
   bins below, ``n_b`` in the particle's bin, ``frac`` its position inside the bin) replaces the rank level
   ``r/(N-1)`` of exact mode; the target is the private quantile at level ``u`` as in exact mode; the kernel
   writes ``coef[c, i] = s_ic - T`` in particle order (coalesced, no scatter).

Error against exact mode: ``|u - r_i/(N-1)| <= (n_b + 1)/N`` for every particle (the exact rank lies among the
``n_b`` particles of its bin), so the transported target moves by at most the private quantile function's
variation over that level interval (tested in tests/test_triton_flow.py). Reference:
``fastdpot.reference.flow_histogram.flow_step_histogram``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import acc_dtype, proj_tile
from .projection_noise import tile_config

__all__ = ["histogram_coef", "bin_geometry"]


@triton.jit
def _minmax_kernel(x_ptr, theta_ptr, noise_ptr, min_ptr, max_ptr, N, D, K, j0, KC,
                   stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr,
                   HAS_NOISE: tl.constexpr, STORE_NOISE: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, USE_DOT: tl.constexpr, ACC: tl.constexpr):
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_c = offs_c < KC
    s = proj_tile(x_ptr, theta_ptr, noise_ptr, offs_n, offs_c, mask_n, mask_c, D, K, j0,
                  stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr,
                  HAS_NOISE, STORE_NOISE, BLOCK_N, BLOCK_K, BLOCK_D, USE_DOT, ACC)
    mn = tl.min(tl.where(mask_n[:, None], s, float("inf")), axis=0)
    mx = tl.max(tl.where(mask_n[:, None], s, float("-inf")), axis=0)
    tl.store(min_ptr + pid_n * KC + offs_c, mn, mask=mask_c)
    tl.store(max_ptr + pid_n * KC + offs_c, mx, mask=mask_c)


@triton.jit
def _bin_of(s, lo_ptr, width_ptr, offs_c, mask_c, NUM_BINS: tl.constexpr):
    lo = tl.load(lo_ptr + offs_c, mask=mask_c, other=0.0)
    width = tl.load(width_ptr + offs_c, mask=mask_c, other=1.0)
    t = (s - lo[None, :]) / width[None, :]
    t = tl.minimum(tl.maximum(t, 0.0), NUM_BINS * 1.0)
    b = tl.minimum(t.to(tl.int32), NUM_BINS - 1)
    return b, t - b


@triton.jit
def _hist_kernel(x_ptr, theta_ptr, lo_ptr, width_ptr, hist_ptr, N, D, K, j0, KC,
                 stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr,
                 HAS_NOISE: tl.constexpr, NUM_BINS: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, USE_DOT: tl.constexpr, ACC: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_c = offs_c < KC
    s = proj_tile(x_ptr, theta_ptr, x_ptr, offs_n, offs_c, mask_n, mask_c, D, K, j0,
                  stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr,
                  HAS_NOISE, False, BLOCK_N, BLOCK_K, BLOCK_D, USE_DOT, ACC)
    b, _ = _bin_of(s, lo_ptr, width_ptr, offs_c, mask_c, NUM_BINS)
    ones = tl.full(b.shape, 1, tl.int32)
    tl.atomic_add(hist_ptr + offs_c[None, :] * NUM_BINS + b, ones, mask=mask_n[:, None] & mask_c[None, :])


@triton.jit
def _hist_transport_kernel(x_ptr, theta_ptr, lo_ptr, width_ptr, hist_ptr, cum_ptr, q_ptr, coef_ptr,
                           N, M, D, K, j0, KC, stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr,
                           HAS_NOISE: tl.constexpr, NUM_BINS: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, USE_DOT: tl.constexpr, ACC: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_c = offs_c < KC
    mask = mask_n[:, None] & mask_c[None, :]
    s = proj_tile(x_ptr, theta_ptr, x_ptr, offs_n, offs_c, mask_n, mask_c, D, K, j0,
                  stride_xn, stride_xd, stride_tk, stride_td, seed, sig_ptr,
                  HAS_NOISE, False, BLOCK_N, BLOCK_K, BLOCK_D, USE_DOT, ACC)
    b, frac = _bin_of(s, lo_ptr, width_ptr, offs_c, mask_c, NUM_BINS)
    hb = offs_c[None, :] * NUM_BINS + b
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
    tl.store(coef_ptr + offs_c.to(tl.int64)[None, :] * N + offs_n[:, None], s - t, mask=mask)


def bin_geometry(col_min: torch.Tensor, col_max: torch.Tensor, num_bins: int):
    """(lo, width) of ``num_bins`` equal bins on ``[min, max]`` per column (width 1 for a constant column)."""
    width = (col_max - col_min) / num_bins
    width = torch.where(width > 0, width, torch.ones_like(width))
    return col_min.contiguous(), width.contiguous()


def histogram_coef(x, projections, j0, kc, seed, noise_std, sorted_target, num_bins, coef, noise_out=None):
    """Fill ``coef`` (kc, N) with ``s - T_hist(s)`` for the particles ``x`` (N, d) on directions j0..j0+kc-1.

    ``sorted_target`` (kc, M) holds the sorted noisy private projections of the chunk; ``noise_out`` (N, k)
    receives the particle noise draws when given.
    """
    n, d = x.shape
    k = projections.shape[0]
    m = sorted_target.shape[1]
    bn, bk, bd, use_dot = tile_config(x.dtype, d)
    grid = (triton.cdiv(n, bn), triton.cdiv(kc, bk))
    has_noise = noise_std > 0
    sig = torch.tensor([float(noise_std)], dtype=x.dtype, device=x.device)
    common = (n, d, k, j0, kc, x.stride(0), x.stride(1), projections.stride(0), projections.stride(1), seed, sig)
    meta = dict(BLOCK_N=bn, BLOCK_K=bk, BLOCK_D=bd, USE_DOT=use_dot, ACC=acc_dtype(x.dtype))
    pmin = torch.empty((grid[0], kc), dtype=x.dtype, device=x.device)
    pmax = torch.empty_like(pmin)
    _minmax_kernel[grid](x, projections, noise_out if noise_out is not None else x, pmin, pmax, *common,
                         HAS_NOISE=has_noise, STORE_NOISE=has_noise and noise_out is not None, **meta)
    lo, width = bin_geometry(pmin.amin(0), pmax.amax(0), num_bins)
    hist = torch.zeros((kc, num_bins), dtype=torch.int32, device=x.device)
    _hist_kernel[grid](x, projections, lo, width, hist, *common, HAS_NOISE=has_noise, NUM_BINS=num_bins, **meta)
    cum = torch.cumsum(hist, dim=1, dtype=torch.int64) - hist  # particles in the bins strictly below
    _hist_transport_kernel[grid](x, projections, lo, width, hist, cum, sorted_target, coef,
                                 n, m, d, k, j0, kc, *common[5:], HAS_NOISE=has_noise, NUM_BINS=num_bins, **meta)
    return coef
