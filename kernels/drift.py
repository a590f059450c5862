"""Drift accumulation back to d dimensions, fused with the Euler--Maruyama update and its Brownian noise.

Chunk by chunk, ``drift[i] += scale * sum_c coef[c, i] theta_{j0+c}`` (a (N, kc) x (kc, d) product on tiles); the
last chunk also writes ``new_i = x_i - h drift_i + sqrt(2 lambda h) xi_i`` with ``xi_i = randn(seed_b, i d + l)``.
The same kernel accumulates the DP-SWD gradient ``grad_x = (1/k) G^T Theta`` (no update).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import acc_dtype, randn_wide

__all__ = ["accumulate_drift"]


@triton.jit(do_not_specialize=["seed_b"])  # a fresh seed per step must not recompile
def _drift_kernel(coef_ptr, theta_ptr, drift_ptr, x_ptr, new_ptr, brown_ptr, N, D, j0, KC,
                  stride_tk, stride_td, stride_xn, stride_xd, scalars_ptr, seed_b,
                  FIRST: tl.constexpr, LAST: tl.constexpr, UPDATE: tl.constexpr, BROWNIAN: tl.constexpr,
                  STORE_BROWN: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr,
                  USE_DOT: tl.constexpr, ACC: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_d = tl.program_id(1)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_n = offs_n < N
    mask_d = offs_d < D
    acc = tl.zeros((BLOCK_N, BLOCK_D), dtype=ACC)
    for c0 in range(0, KC, BLOCK_K):
        offs_c = c0 + tl.arange(0, BLOCK_K)
        mask_c = offs_c < KC
        g = tl.load(coef_ptr + offs_c.to(tl.int64)[None, :] * N + offs_n[:, None],
                    mask=mask_n[:, None] & mask_c[None, :], other=0.0).to(ACC)
        th = tl.load(theta_ptr + (j0 + offs_c).to(tl.int64)[:, None] * stride_tk + offs_d[None, :] * stride_td,
                     mask=mask_c[:, None] & mask_d[None, :], other=0.0).to(ACC)
        if USE_DOT:
            acc += tl.dot(g, th, input_precision="tf32x3")
        else:
            acc += tl.sum(g[:, :, None] * th[None, :, :], axis=1)
    # scalars in the data dtype (a Python float argument would be rounded to float32)
    scale = tl.load(scalars_ptr).to(ACC)
    step_size = tl.load(scalars_ptr + 1).to(ACC)
    brownian_std = tl.load(scalars_ptr + 2).to(ACC)
    acc = acc * scale
    mask = mask_n[:, None] & mask_d[None, :]
    out = offs_n[:, None] * D + offs_d[None, :]
    if not FIRST:
        acc += tl.load(drift_ptr + out, mask=mask, other=0.0).to(ACC)
    tl.store(drift_ptr + out, acc, mask=mask)
    if LAST:
        if UPDATE:
            x = tl.load(x_ptr + offs_n[:, None] * stride_xn + offs_d[None, :] * stride_xd, mask=mask,
                        other=0.0).to(ACC)
            new = x - step_size * acc
            if BROWNIAN:
                z = randn_wide(seed_b, out).to(ACC)
                new += brownian_std * z
                if STORE_BROWN:
                    tl.store(brown_ptr + out, z, mask=mask)
            tl.store(new_ptr + out, new, mask=mask)


def accumulate_drift(coef: torch.Tensor, projections: torch.Tensor, j0: int, drift: torch.Tensor, scale: float,
                     first: bool, last: bool, x: Optional[torch.Tensor] = None, new: Optional[torch.Tensor] = None,
                     step_size: float = 0.0, brownian_std: float = 0.0, seed_b: int = 0,
                     brownian_out: Optional[torch.Tensor] = None) -> None:
    """``drift (N, d) (+)= scale * coef.T @ projections[j0:j0+kc]``; on the last chunk with ``x`` given, also
    ``new = x - step_size * drift + brownian_std * xi`` (xi standard normal, stored in ``brownian_out`` if given;
    ``brownian_std = sqrt(2·diffusion·step_size)``, the Brownian term's standard deviation derived from λ and h)."""
    kc, n = coef.shape
    d = drift.shape[1]
    if coef.dtype == torch.float32:
        bn, bd, bk, use_dot = 64, min(64, max(16, triton.next_power_of_2(d))), 16, True
    else:
        bn, bd, bk, use_dot = 32, min(16, triton.next_power_of_2(d)), 8, False
    update = x is not None
    grid = (triton.cdiv(n, bn), triton.cdiv(d, bd))
    xs = x if update else drift
    _drift_kernel[grid](
        coef, projections, drift, xs, new if update else drift,
        brownian_out if brownian_out is not None else drift, n, d, j0, kc,
        projections.stride(0), projections.stride(1), xs.stride(0), xs.stride(1),
        torch.tensor([scale, step_size, brownian_std], dtype=coef.dtype, device=coef.device), seed_b,
        FIRST=first, LAST=last, UPDATE=update, BROWNIAN=update and brownian_std > 0,
        STORE_BROWN=brownian_out is not None, BLOCK_N=bn, BLOCK_D=bd, BLOCK_K=bk, USE_DOT=use_dot,
        ACC=acc_dtype(coef.dtype))
