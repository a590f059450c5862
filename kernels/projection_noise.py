"""Fused projection + in-kernel Philox Gaussian noise: ``P[c, i] = theta_{j0+c} . x_i + noise_std * randn``.

Output layout is (chunk of directions, rows) so that each direction is one contiguous row for ``torch.sort``.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ._common import acc_dtype, fast_noise_mode, proj_tile

__all__ = ["project_noise", "tile_config"]


def tile_config(dtype: torch.dtype, d: int):
    """(BLOCK_N, BLOCK_K, BLOCK_D, USE_DOT): tensor-core dot for float32 with ``input_precision="tf32x3"`` (three
    TF32 products with the split low parts: float32-level error, measured on an H100 1.06e-6 vs torch's IEEE
    1.15e-6 max abs on unit-variance projections, where plain TF32 gives 4e-3 and the IEEE FMA lowering is ≈ 7×
    slower than cuBLAS), a broadcast reduction for float64 (fp64 ``tl.dot`` is not available on every GPU).

    float32 keeps ``tl.dot``: a broadcast multiply + ``tl.sum`` is rewritten by Triton's compiler into a dot of
    default (TF32) precision, the 4e-3 error above (README, GPU section)."""
    if dtype == torch.float32:
        block_d = min(64, max(16, triton.next_power_of_2(d)))
        return 64, 32, block_d, True
    return 32, 16, min(16, triton.next_power_of_2(d)), False


@triton.jit(do_not_specialize=["seed"])  # a fresh seed per step must not recompile
def _project_noise_kernel(x_ptr, theta_ptr, out_ptr, noise_ptr, N, D, K, j0, KC,
                          stride_xn, stride_xd, stride_tk, stride_td, seed, noise_std_ptr,
                          HAS_NOISE: tl.constexpr, STORE_NOISE: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, USE_DOT: tl.constexpr, ACC: tl.constexpr,
                          FAST_NOISE: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_c = offs_c < KC
    acc = proj_tile(x_ptr, theta_ptr, noise_ptr, offs_n, offs_c, mask_n, mask_c, D, K, j0,
                    stride_xn, stride_xd, stride_tk, stride_td, seed, noise_std_ptr,
                    HAS_NOISE, STORE_NOISE, BLOCK_N, BLOCK_K, BLOCK_D, USE_DOT, ACC, FAST_NOISE)
    out = out_ptr + offs_c.to(tl.int64)[None, :] * N + offs_n[:, None]
    tl.store(out, acc, mask=mask_n[:, None] & mask_c[None, :])


def project_noise(x: torch.Tensor, projections: torch.Tensor, j0: int, kc: int, seed: int, noise_std: float,
                  noise_out: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None,
                  fast_noise: bool = False) -> torch.Tensor:
    """Projections of the rows of ``x`` (N, d) on directions ``j0 .. j0+kc-1`` of ``projections`` (k, d), plus
    ``noise_std`` times the standard normals of the fastdpot Triton noise convention (kernels/_common.py):
    ``randn_wide`` (privacy-grade, private rows) or, with ``fast_noise``, ``randn_fast`` (particles).

    Returns a (kc, N) tensor. With ``noise_out`` (N, k) the scaled noise of these directions is written into it.
    """
    n, d = x.shape
    k = projections.shape[0]
    if out is None:
        out = torch.empty((kc, n), dtype=x.dtype, device=x.device)
    bn, bk, bd, use_dot = tile_config(x.dtype, d)
    grid = (triton.cdiv(n, bn), triton.cdiv(kc, bk))
    has_noise = noise_std > 0
    _project_noise_kernel[grid](
        x, projections, out, noise_out if noise_out is not None else out, n, d, k, j0, kc,
        x.stride(0), x.stride(1), projections.stride(0), projections.stride(1), seed,
        torch.tensor([float(noise_std)], dtype=x.dtype, device=x.device),
        HAS_NOISE=has_noise, STORE_NOISE=has_noise and noise_out is not None, BLOCK_N=bn, BLOCK_K=bk,
        BLOCK_D=bd, USE_DOT=use_dot, ACC=acc_dtype(x.dtype), FAST_NOISE=fast_noise_mode(fast_noise, j0, bk))
    return out
