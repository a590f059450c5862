"""Sort-based quantile transport: rank -> target quantile by index interpolation, scattered back to particles.

For direction c, the particle of rank r (0-based, ``sorted[c, r]`` = its noisy projection, ``index[c, r]`` = its
row) sits at level ``u = r / (N - 1)`` of the empirical CDF of the noisy particle projections; its image under the
target quantile function is the linear interpolation of the sorted noisy private projections ``q[c]`` at position
``u (M - 1)`` (numpy's "linear" quantile). The kernel writes ``coef[c, index[c, r]] = sorted[c, r] - T``, the
per-direction coefficient of the drift ``v_i = (1/k) sum_j coef[j, i] theta_j`` (Sebag et al., TMLR).
The position is split exactly in integers: ``lo = (r (M-1)) // (N-1)``, ``frac = ((r (M-1)) mod (N-1)) / (N-1)``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["transport_exact", "transport_grid", "grid_quantiles", "target_at_level", "table_segments",
           "transport_table"]


@triton.jit
def target_at_level(q_ptr, num, den, M, mask):
    """Target quantile at level num/den (int64 tensors, 0 <= num <= den) of a sorted row ``q_ptr`` of length M."""
    pos = num * (M - 1)
    lo = pos // den
    frac = (pos - lo * den).to(tl.float64) / den.to(tl.float64)
    hi = tl.minimum(lo + 1, M - 1)
    q_lo = tl.load(q_ptr + lo, mask=mask, other=0.0)
    q_hi = tl.load(q_ptr + hi, mask=mask, other=0.0)
    return q_lo + frac.to(q_lo.dtype) * (q_hi - q_lo)


@triton.jit
def _transport_exact_kernel(sorted_ptr, index_ptr, q_ptr, coef_ptr, N, M, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    c = tl.program_id(1).to(tl.int64)
    r = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = r < N
    v = tl.load(sorted_ptr + c * N + r, mask=mask, other=0.0)
    idx = tl.load(index_ptr + c * N + r, mask=mask, other=0)
    den = tl.maximum(N - 1, 1).to(tl.int64) + r * 0
    t = target_at_level(q_ptr + c * M, r, den, M, mask)
    tl.store(coef_ptr + c * N + idx, v - t, mask=mask)


def transport_exact(sorted_proj: torch.Tensor, index: torch.Tensor, sorted_target: torch.Tensor,
                    coef: torch.Tensor) -> torch.Tensor:
    """Fill ``coef`` (kc, N) with ``noisy projection - transported target`` at each particle's row.

    Args: sorted_proj (kc, N) sorted noisy particle projections; index (kc, N) their rows (int32 or int64);
    sorted_target (kc, M) sorted noisy private projections. ``coef`` may alias the unsorted projection buffer.
    """
    kc, n = sorted_proj.shape
    m = sorted_target.shape[1]
    block = 1024 if sorted_proj.is_cuda else 256
    _transport_exact_kernel[(triton.cdiv(n, block), kc)](sorted_proj, index, sorted_target, coef, n, m, BLOCK=block)
    return coef


@triton.jit
def _transport_grid_kernel(sorted_ptr, index_ptr, j_ptr, xq_ptr, tq_ptr, lv_ptr, coef_ptr, N, num_quantiles,
                           BLOCK: tl.constexpr):
    """The authors' grid transport on sorted particles: cdf = interp(s; xq -> levels), T = interp(cdf; levels -> tq)
    with numpy.interp semantics (clamped outside the knots); ``j`` = searchsorted(xq, s, right=True) - 1."""
    pid = tl.program_id(0)
    c = tl.program_id(1).to(tl.int64)
    r = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = r < N
    v = tl.load(sorted_ptr + c * N + r, mask=mask, other=0.0)
    idx = tl.load(index_ptr + c * N + r, mask=mask, other=0)
    j = tl.load(j_ptr + c * N + r, mask=mask, other=0)
    j = tl.minimum(tl.maximum(j, 0), num_quantiles - 1)
    j1 = tl.minimum(j + 1, num_quantiles - 1)
    xrow = xq_ptr + c * num_quantiles
    x0 = tl.load(xrow + j, mask=mask, other=0.0)
    x1 = tl.load(xrow + j1, mask=mask, other=0.0)
    f0 = tl.load(lv_ptr + j, mask=mask, other=0.0)
    f1 = tl.load(lv_ptr + j1, mask=mask, other=0.0)
    den = x1 - x0
    safe = tl.where(den > 0, den, 1.0)
    cdf = f0 + tl.where(den > 0, (f1 - f0) / safe, 0.0) * (v - x0)
    first = tl.load(xrow + r * 0, mask=mask, other=0.0)
    last = tl.load(xrow + r * 0 + (num_quantiles - 1), mask=mask, other=0.0)
    lv_last = tl.load(lv_ptr + r * 0 + (num_quantiles - 1), mask=mask, other=1.0)
    lv_first = tl.load(lv_ptr + r * 0, mask=mask, other=0.0)
    cdf = tl.where(v < first, lv_first, cdf)
    cdf = tl.where(v >= last, lv_last, cdf)
    # second interp on the uniform levels: knot index from the level, then numpy.interp's formula on that knot
    k0 = tl.minimum(tl.maximum((cdf * (num_quantiles - 1)).to(tl.int64), 0), num_quantiles - 1)
    l0 = tl.load(lv_ptr + k0, mask=mask, other=0.0)
    k0 = tl.where((l0 > cdf) & (k0 > 0), k0 - 1, k0)  # rounding of linspace vs cdf*(num_quantiles-1)
    k1 = tl.minimum(k0 + 1, num_quantiles - 1)
    l0 = tl.load(lv_ptr + k0, mask=mask, other=0.0)
    l1 = tl.load(lv_ptr + k1, mask=mask, other=1.0)
    trow = tq_ptr + c * num_quantiles
    t0 = tl.load(trow + k0, mask=mask, other=0.0)
    t1 = tl.load(trow + k1, mask=mask, other=0.0)
    dl = l1 - l0
    t = t0 + tl.where(dl > 0, (t1 - t0) / tl.where(dl > 0, dl, 1.0), 0.0) * (cdf - l0)
    t = tl.where(cdf >= lv_last, tl.load(trow + r * 0 + (num_quantiles - 1), mask=mask, other=0.0), t)
    tl.store(coef_ptr + c * N + idx, v - t, mask=mask)


def grid_quantiles(sorted_rows: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """numpy "linear" quantiles of sorted rows (kc, n) at ``levels`` (Q,) -> (kc, Q) (position u (n-1))."""
    n = sorted_rows.shape[1]
    pos = levels.to(sorted_rows.dtype) * (n - 1)
    lo = pos.floor().clamp(0, n - 1).long()
    hi = (lo + 1).clamp(max=n - 1)
    frac = pos - lo.to(pos.dtype)
    a = sorted_rows[:, lo]
    return a + frac * (sorted_rows[:, hi] - a)


def transport_grid(sorted_proj: torch.Tensor, index: torch.Tensor, sorted_target: torch.Tensor,
                   num_quantiles: int, coef: torch.Tensor) -> torch.Tensor:
    """Grid (authors') transport of sorted particle projections with Q = ``num_quantiles`` levels; fills ``coef``.

    Shape: sorted_proj, index (kc, N); sorted_target (kc, M); coef (kc, N).
    """
    kc, n = sorted_proj.shape
    levels = torch.linspace(0, 1, num_quantiles, dtype=torch.float64, device=sorted_proj.device)
    xq = grid_quantiles(sorted_proj, levels).contiguous()
    tq = grid_quantiles(sorted_target, levels).contiguous()
    lv = levels.to(sorted_proj.dtype).contiguous()
    j = torch.searchsorted(xq, sorted_proj, right=True) - 1
    block = 1024 if sorted_proj.is_cuda else 256
    _transport_grid_kernel[(triton.cdiv(n, block), kc)](sorted_proj, index, j, xq, tq, lv, coef, n,
                                                        num_quantiles, BLOCK=block)
    return coef


def table_segments(n: int, levels: torch.Tensor):
    """Sketch mode: the table segment ``s_r`` and weight ``w_r = (u_r - lv[s_r]) / (lv[s_r+1] - lv[s_r])`` of every
    rank r at level ``u_r = r/(N-1)`` (the same for every direction), float64; L = 1 gives s = 0, w = 0.
    The piecewise-linear rule (end segments extended) is :mod:`fastdpot.reference.flow`'s.

    Shape: levels (L,) strictly increasing in [0, 1] -> (seg (N,) int64, w (N,) float64).
    """
    lv = levels.to(torch.float64)
    u = torch.arange(n, dtype=torch.float64, device=lv.device) / (n - 1)
    L = lv.shape[0]
    if L == 1:
        return torch.zeros(n, dtype=torch.int64, device=lv.device), torch.zeros(n, dtype=torch.float64,
                                                                                  device=lv.device)
    seg = (torch.searchsorted(lv, u, right=True) - 1).clamp(0, L - 2)
    return seg, (u - lv[seg]) / (lv[seg + 1] - lv[seg])


@triton.jit
def _transport_table_kernel(sorted_ptr, index_ptr, seg_ptr, w_ptr, tb_ptr, coef_ptr, N, L, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    c = tl.program_id(1).to(tl.int64)
    r = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = r < N
    v = tl.load(sorted_ptr + c * N + r, mask=mask, other=0.0)
    idx = tl.load(index_ptr + c * N + r, mask=mask, other=0)
    sg = tl.load(seg_ptr + r, mask=mask, other=0)
    w = tl.load(w_ptr + r, mask=mask, other=0.0)
    s1 = tl.minimum(sg + 1, L - 1)
    t0 = tl.load(tb_ptr + c * L + sg, mask=mask, other=0.0)
    t1 = tl.load(tb_ptr + c * L + s1, mask=mask, other=0.0)
    t = t0 + w * (t1 - t0)  # float64 (the table and weights are float64)
    tl.store(coef_ptr + c * N + idx, (v.to(tl.float64) - t).to(v.dtype), mask=mask)


def transport_table(sorted_proj: torch.Tensor, index: torch.Tensor, seg: torch.Tensor, w: torch.Tensor,
                    table: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """Sketch mode, exact levels: ``coef[c, index[c, r]] = sorted[c, r] - Q_c(r/(N-1))`` with Q_c the table row's
    piecewise-linear quantile function, from :func:`table_segments`' ``seg``, ``w``.

    Shape: sorted_proj, index, coef (kc, N); seg, w (N,); table (kc, L) float64.
    """
    kc, n = sorted_proj.shape
    block = 1024 if sorted_proj.is_cuda else 256
    _transport_table_kernel[(triton.cdiv(n, block), kc)](sorted_proj, index, seg, w, table, coef, n,
                                                         table.shape[1], BLOCK=block)
    return coef
