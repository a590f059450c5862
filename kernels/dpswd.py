"""Triton backend of op ``"sliced_wasserstein"``: DP-SW_p^p forward and backward (Rakotomamonjy & Ralaivola, ICML 2021).

.. math::
    \\mathrm{DP\\text{-}SW}_p^p = \\frac1k \\sum_j \\int_0^1 |F_j^{-1}(u) - G_j^{-1}(u)|^p\\,du

between the empirical laws of ``x theta_j + v_j`` (N atoms) and ``y theta_j + v'_j`` (M atoms), with in-kernel
Philox noise of standard deviation σ on both sides. Per chunk of directions: fused projection + noise
(``project_noise``), ``torch.sort`` of both sides, then ``_w1d_kernel`` walks the atoms of the larger side L
(n_L atoms): atom a covers levels (a/n_L, (a+1)/n_L] and meets at most two atoms b, b+1 of the smaller side S; the
overlaps are computed exactly in integers on the grid 1/(n_L n_S) (the merged quantile levels of
``fastdpot.reference.sliced.quantile_levels``). The kernel writes the per-block partial losses and, when a
gradient is needed, the derivative with respect to every noisy projected value, scattered back to its row (the L
side directly, the S side with atomic adds). ``accumulate_drift`` then forms ``grad_x = (1/k) G_x^T Theta`` (and
``grad_y``) chunk by chunk, so the gradient is computed in the forward pass and only (N, d) + (M, d) are kept.

The sketch release (``sketch_bins=L``; reference :func:`fastdpot.reference.sliced.sketch_sliced_wasserstein`) runs per
chunk: projection without noise, ``torch.sort`` of both sides (the generated side with indices), ``_bin_means_kernel``
(the L rank-bin sums in float64, plus the bin-sum noise on the private side, divided by the bin sizes),
``_isotonic_kernel`` (weighted pool-adjacent-violators, one program per direction), then ``_sketch_loss_kernel``
(per generated bin: the table read at the bin's level, the loss term and the derivative 1/N·slope written to every
rank of the bin through the permutation), and ``accumulate_drift`` for the gradient. The bin-sum noise is the keyed
privacy-grade normals of :func:`fastdpot.ops.sliced_wasserstein.sketch_noise` (k·L float64 draws, made on the host
from the release's key: the same draws as the C++ kernel and the reference).

Autograd caveats: gradients flow to ``x`` and ``y`` only -- not to ``projections`` (a projections tensor that
requires grad is rejected; use the ``reference`` backend) -- and double backward is not supported. At tied
projected values the sub-gradient is the one of ``torch.sort``'s order. The S-side atomic adds make the gradient's
last bits depend on scheduling on a GPU (not its value beyond float rounding).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (STREAM_PARTICLES, STREAM_PRIVATE, check_launchable, device_guard, direction_chunk,
                      fast_noise_stream, stream_seed)
from fastdpot.ops._sliced_shared import GradientInForward, sketch_noise

from .drift import accumulate_drift
from .projection_noise import project_noise

__all__ = ["SlicedWassersteinTriton", "SketchSlicedWassersteinTriton", "sliced_wasserstein_triton",
           "sliced_wasserstein_cuda"]


@triton.jit
def _abs_pow(dlt, p, P_MODE: tl.constexpr):
    """(|d|^p, d/dd |d|^p) for P_MODE 1 (p = 1), 2 (p = 2), 0 (any p >= 1, through exp/log)."""
    a = tl.abs(dlt)
    sgn = tl.where(dlt > 0, 1.0, tl.where(dlt < 0, -1.0, 0.0))
    if P_MODE == 1:
        val = a
        der = sgn
    elif P_MODE == 2:
        val = dlt * dlt
        der = 2.0 * dlt
    else:
        safe = tl.where(a > 0, a, 1.0)
        lg = tl.log(safe)
        val = tl.where(a > 0, tl.exp(p * lg), 0.0)
        der = tl.where(a > 0, p * tl.exp((p - 1.0) * lg), 0.0) * sgn
    return val, der


@triton.jit
def _w1d_kernel(l_ptr, lidx_ptr, s_ptr, sidx_ptr, gl_ptr, gs_ptr, part_ptr, prm_ptr, NL, NS, NPROG,
                P_MODE: tl.constexpr, NEED_GL: tl.constexpr, NEED_GS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    c = tl.program_id(1).to(tl.int64)
    a = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = a < NL
    v = tl.load(l_ptr + c * NL + a, mask=mask, other=0.0)
    start = a * NS  # atom a of L covers (start, start + NS] on the grid 1/(NL NS)
    b = start // NL
    bound = (b + 1) * NL  # right edge of atom b of S
    split = bound < start + NS
    w1 = tl.where(split, bound - start, NS)
    w2 = tl.where(split, start + NS - bound, 0)
    b2 = tl.minimum(b + 1, NS - 1)
    s1 = tl.load(s_ptr + c * NS + b, mask=mask, other=0.0)
    s2 = tl.load(s_ptr + c * NS + b2, mask=mask, other=0.0)
    p = tl.load(prm_ptr).to(v.dtype)  # scalars in the data dtype: p and 1 / (NL NS)
    inv = tl.load(prm_ptr + 1).to(v.dtype)
    f1, g1 = _abs_pow(v - s1, p, P_MODE)
    f2, g2 = _abs_pow(v - s2, p, P_MODE)
    w1f = w1.to(v.dtype) * inv
    w2f = w2.to(v.dtype) * inv
    loss = tl.where(mask, w1f * f1 + w2f * f2, 0.0)
    tl.store(part_ptr + c * NPROG + pid, tl.sum(loss, axis=0))
    if NEED_GL:
        li = tl.load(lidx_ptr + c * NL + a, mask=mask, other=0)
        tl.store(gl_ptr + c * NL + li, w1f * g1 + w2f * g2, mask=mask)
    if NEED_GS:
        si1 = tl.load(sidx_ptr + c * NS + b, mask=mask, other=0)
        si2 = tl.load(sidx_ptr + c * NS + b2, mask=mask, other=0)
        tl.atomic_add(gs_ptr + c * NS + si1, -w1f * g1, mask=mask)
        tl.atomic_add(gs_ptr + c * NS + si2, -w2f * g2, mask=mask & split)


def _argsort_rows(v, prims):
    """(sorted copy, indices) of every row of v: ``torch.sort`` (int64 indices), or the primitive set's radix sort
    with int32 indices (float32; :mod:`fastdpot._cuda_prims`)."""
    if prims is None or v.dtype != torch.float32:
        return torch.sort(v, dim=1)
    s = v.clone()
    ix = torch.empty(v.shape, dtype=torch.int32, device=v.device)
    prims.argsort_rows_(s, ix)
    return s, ix


def _w1d_chunk(px, py, p, need_gx, need_gy, prims=None):
    """Loss sum over the chunk's directions (float64 scalar tensor) of W_p^p between rows of px (c, N) and
    py (c, M); fills px / py in place with d loss / d value when the gradient is needed (else leaves garbage).
    ``prims``: sort with :mod:`fastdpot._cuda_prims` (None: ``torch.sort``)."""
    c, n = px.shape
    m = py.shape[1]
    sx, ix = _argsort_rows(px, prims)
    sy, iy = _argsort_rows(py, prims)
    if n >= m:
        L, li, S, si, gl, gs, need_gl, need_gs, nl, ns = sx, ix, sy, iy, px, py, need_gx, need_gy, n, m
    else:
        L, li, S, si, gl, gs, need_gl, need_gs, nl, ns = sy, iy, sx, ix, py, px, need_gy, need_gx, m, n
    if need_gs:
        gs.zero_()
    block = 1024 if px.is_cuda else 128
    nprog = triton.cdiv(nl, block)
    part = torch.empty((c, nprog), dtype=px.dtype, device=px.device)
    p_mode = 1 if p == 1 else (2 if p == 2 else 0)
    prm = torch.tensor([float(p), 1.0 / (float(nl) * float(ns))], dtype=px.dtype, device=px.device)
    _w1d_kernel[(nprog, c)](L, li, S, si, gl, gs, part, prm,
                            nl, ns, nprog, P_MODE=p_mode, NEED_GL=need_gl, NEED_GS=need_gs, BLOCK=block)
    return part.sum(dtype=torch.float64)


def _triton_points(x, y, projections, p, noise_std, seed, need_gx, need_gy, return_noise, prims=None):
    """The points release chunk by chunk: ``(loss, dloss/dx or None, dloss/dy or None, noise_x or None, noise_y or
    None)``, the gradients computed in the forward pass."""
    xd, yd, th = x.detach(), y.detach(), projections.detach()
    n, d = xd.shape
    m, k = yd.shape[0], th.shape[0]
    dev, dt = xd.device, xd.dtype
    grad_x = torch.empty((n, d), dtype=dt, device=dev) if need_gx else None
    grad_y = torch.empty((m, d), dtype=dt, device=dev) if need_gy else None
    noise_x = torch.zeros((n, k), dtype=dt, device=dev) if return_noise else None
    noise_y = torch.zeros((m, k), dtype=dt, device=dev) if return_noise else None
    seed_x, seed_y = stream_seed(seed, STREAM_PRIVATE), stream_seed(seed, STREAM_PARTICLES)
    kc = direction_chunk(max(n, m), k)
    bx = torch.empty((kc, n), dtype=dt, device=dev)
    by = torch.empty((kc, m), dtype=dt, device=dev)
    total = torch.zeros((), dtype=torch.float64, device=dev)
    for j0 in range(0, k, kc):
        c = min(kc, k - j0)
        px = project_noise(xd, th, j0, c, seed_x, noise_std, noise_x, out=bx[:c])
        py = project_noise(yd, th, j0, c, seed_y, noise_std, noise_y, out=by[:c],
                           fast_noise=fast_noise_stream(STREAM_PARTICLES))
        total += _w1d_chunk(px, py, p, need_gx, need_gy, prims)
        last = j0 + c >= k
        if need_gx:
            accumulate_drift(px, th, j0, grad_x, 1.0 / k, first=j0 == 0, last=last)
        if need_gy:
            accumulate_drift(py, th, j0, grad_y, 1.0 / k, first=j0 == 0, last=last)
    return (total / k).to(dt), grad_x, grad_y, noise_x, noise_y


class SlicedWassersteinTriton(GradientInForward):
    """Autograd wrapper of the Triton DP-SW_p^p (``triton`` backend of op ``"sliced_wasserstein"``).

    The exact gradient w.r.t. ``x`` and ``y`` is computed in the forward pass (fused, chunk by chunk) and saved;
    backward multiplies it by the upstream gradient. No gradient flows to ``projections``; no double backward.
    """

    @staticmethod
    def forward(ctx, x, y, projections, p, noise_std, seed, return_noise, prims=None):
        loss, grad_x, grad_y, noise_x, noise_y = _triton_points(x, y, projections, p, noise_std, seed,
                                                                ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                                                                return_noise, prims)
        ctx.save_for_backward(grad_x, grad_y)
        if return_noise:
            ctx.mark_non_differentiable(noise_x, noise_y)
            return loss, noise_x, noise_y
        return loss


@triton.jit
def _bin_means_kernel(s_ptr, noise_ptr, out_ptr, B, L, HAS_NOISE: tl.constexpr, BLOCK: tl.constexpr):
    """out[j, l] = (sum of the sorted row j over rank bin l + noise[j, l]) / m_l, in float64; the bins of
    fastdpot.privacy.sketch.bin_sizes (the first B mod L hold ceil(B/L) ranks). Grid (L, chunk)."""
    l = tl.program_id(0)
    j = tl.program_id(1).to(tl.int64)
    q = B // L
    size = q + (l < B % L).to(tl.int32)
    start = l * q + tl.minimum(l, B % L)
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    for r0 in range(0, size, BLOCK):
        offs = r0 + tl.arange(0, BLOCK)
        v = tl.load(s_ptr + j * B + start + offs, mask=offs < size, other=0.0)
        acc += v.to(tl.float64)
    total = tl.sum(acc, axis=0)
    if HAS_NOISE:
        total += tl.load(noise_ptr + j * L + l)
    tl.store(out_ptr + j * L + l, total / size.to(tl.float64))


@triton.jit
def _isotonic_kernel(v_ptr, w_ptr, bv_ptr, bw_ptr, bn_ptr, out_ptr, L):
    """Weighted pool-adjacent-violators on row j of v (c, L) float64 with weights w (L,): out[j] = the
    non-decreasing least-squares fit (scipy.optimize.isotonic_regression). One program per row; the block stack
    (value, weight, count) lives in the scratch rows bv, bw, bn; barriers order its stores and loads across the
    program's threads."""
    j = tl.program_id(0).to(tl.int64)
    base = j * L
    nb = tl.program_id(0) * 0  # blocks on the stack (int32)
    for i in range(0, L):
        cv = tl.load(v_ptr + base + i)
        cw = tl.load(w_ptr + i)
        cn = nb * 0 + 1
        keep = nb > 0
        while keep:
            t = base + nb - 1
            pv = tl.load(bv_ptr + t)
            pw = tl.load(bw_ptr + t)
            pn = tl.load(bn_ptr + t)
            merge = pv > cv
            ww = pw + cw
            cv = tl.where(merge, (pw * pv + cw * cv) / ww, cv)
            cw = tl.where(merge, ww, cw)
            cn = tl.where(merge, pn + cn, cn)
            nb = tl.where(merge, nb - 1, nb)
            keep = merge & (nb > 0)
        tl.store(bv_ptr + base + nb, cv)
        tl.store(bw_ptr + base + nb, cw)
        tl.store(bn_ptr + base + nb, cn)
        tl.debug_barrier()
        nb += 1
    pos = nb * 0
    for b in range(0, nb):
        v = tl.load(bv_ptr + base + b)
        cnt = tl.load(bn_ptr + base + b)
        for r in range(0, cnt):
            tl.store(out_ptr + base + pos + r, v)
        pos += cnt


@triton.jit
def _sketch_loss_kernel(gm_ptr, table_ptr, seg_ptr, u_ptr, lv_ptr, idx_ptr, g_ptr, part_ptr, prm_ptr, N, L,
                        ONE_BIN: tl.constexpr, P_MODE: tl.constexpr, NEED_G: tl.constexpr, BLOCK: tl.constexpr):
    """Generated bin l of direction j: the private table Q_j (c, L) read at the bin's level u[l] (segment seg[l] of
    the private levels lv, end segments extended), part[j, l] = (m'_l/N)·|gm[j, l] − Q_j(u[l])|^p and, with NEED_G,
    d part / d value = slope/N written to every rank r of the bin at g[j, idx[j, r]]. Grid (L, chunk)."""
    l = tl.program_id(0)
    j = tl.program_id(1).to(tl.int64)
    q = N // L
    size = q + (l < N % L).to(tl.int32)
    start = l * q + tl.minimum(l, N % L)
    gm = tl.load(gm_ptr + j * L + l)
    if ONE_BIN:
        target = tl.load(table_ptr + j * L)
    else:
        s = tl.load(seg_ptr + l)
        u0 = tl.load(lv_ptr + s)
        u1 = tl.load(lv_ptr + s + 1)
        t0 = tl.load(table_ptr + j * L + s)
        t1 = tl.load(table_ptr + j * L + s + 1)
        target = t0 + (tl.load(u_ptr + l) - u0) * ((t1 - t0) / (u1 - u0))
    val, der = _abs_pow(gm - target, tl.load(prm_ptr), P_MODE)
    inv_n = tl.load(prm_ptr + 1)
    tl.store(part_ptr + j * L + l, val * size.to(tl.float64) * inv_n)
    if NEED_G:
        gv = (der * inv_n).to(g_ptr.dtype.element_ty)
        for r0 in range(0, size, BLOCK):
            offs = r0 + tl.arange(0, BLOCK)
            mask = offs < size
            idx = tl.load(idx_ptr + j * N + start + offs, mask=mask, other=0)
            tl.store(g_ptr + j * N + idx, tl.zeros((BLOCK,), dtype=g_ptr.dtype.element_ty) + gv, mask=mask)


def _sketch_tables(m, n, sketch_bins, device):
    """The public constants of a sketch with M private and N generated rows: private bin sizes (weights of the
    isotonic fit) and levels, the generated bins' levels u (clamped to [0, 1]) and their segments of the private
    levels (``torch.searchsorted(right=True) − 1`` clamped to [0, L − 2], as ``quantile_table_eval``)."""
    from fastdpot.privacy.sketch import bin_levels, bin_sizes

    sx = bin_sizes(m, sketch_bins)
    lv = bin_levels(sx)
    u = bin_levels(bin_sizes(n, sketch_bins)).clamp(0.0, 1.0)
    seg = (torch.searchsorted(lv, u, right=True) - 1).clamp(0, max(sketch_bins - 2, 0))
    return [t.to(device) for t in (sx.to(torch.float64), lv, u, seg)]


def _triton_sketch(x, y, projections, p, noise_std, seed, need_gy, return_noise, sketch_bins, prims=None):
    """The sketch release chunk by chunk (x private, y generated): ``(loss, dloss/dy or None, noise (k, L) float64
    or None)``."""
    xd, yd, th = x.detach(), y.detach(), projections.detach()
    m, d = xd.shape
    n, k = yd.shape[0], th.shape[0]
    L = int(sketch_bins)
    dev, dt = xd.device, xd.dtype
    noise = sketch_noise(k, L, noise_std, seed, dev)  # (k, L) float64, the release's keyed normals
    wts, lv, u, seg = _sketch_tables(m, n, L, dev)
    grad_y = torch.empty((n, d), dtype=dt, device=dev) if need_gy else None
    kc = direction_chunk(max(n, m), k)
    bx = torch.empty((kc, m), dtype=dt, device=dev)
    by = torch.empty((kc, n), dtype=dt, device=dev)
    f64 = dict(dtype=torch.float64, device=dev)
    means, gmeans, table = (torch.empty((kc, L), **f64) for _ in range(3))
    bv, bw = torch.empty((kc, L), **f64), torch.empty((kc, L), **f64)
    bn = torch.empty((kc, L), dtype=torch.int32, device=dev)
    part = torch.empty((kc, L), **f64)
    prm = torch.tensor([float(p), 1.0 / n], **f64)
    p_mode = 1 if p == 1 else (2 if p == 2 else 0)
    block = 1024 if xd.is_cuda else 64
    total = torch.zeros((), **f64)
    for j0 in range(0, k, kc):
        c = min(kc, k - j0)
        px = project_noise(xd, th, j0, c, 0, 0.0, out=bx[:c])
        py = project_noise(yd, th, j0, c, 0, 0.0, out=by[:c])
        sx, _ = _argsort_rows(px, prims)
        sy, iy = _argsort_rows(py, prims)
        nz = noise[j0:j0 + c] if noise_std > 0 else means
        _bin_means_kernel[(L, c)](sx, nz, means, m, L, HAS_NOISE=noise_std > 0, BLOCK=block)
        _bin_means_kernel[(L, c)](sy, means, gmeans, n, L, HAS_NOISE=False, BLOCK=block)
        _isotonic_kernel[(c,)](means, wts, bv, bw, bn, table, L, num_warps=1)
        _sketch_loss_kernel[(L, c)](gmeans, table, seg, u, lv, iy, py, part, prm, n, L, ONE_BIN=L == 1,
                                    P_MODE=p_mode, NEED_G=need_gy, BLOCK=block)
        total += part[:c].sum()
        if need_gy:
            accumulate_drift(py, th, j0, grad_y, 1.0 / k, first=j0 == 0, last=j0 + c >= k)
    return (total / k).to(dt), grad_y, (noise if return_noise else None)


class SketchSlicedWassersteinTriton(GradientInForward):
    """Autograd wrapper of the Triton sketch-release loss (``triton``/``cuda`` backends with ``sketch_bins``).

    Forward arguments (x private (M, d), y generated (N, d), projections, p, noise_std, seed, return_noise,
    sketch_bins, prims). The gradient w.r.t. ``y`` is computed in the forward pass and saved; none flows to the
    private rows or to ``projections``; no double backward.
    """

    @staticmethod
    def forward(ctx, x, y, projections, p, noise_std, seed, return_noise, sketch_bins, prims=None):
        loss, grad_y, noise = _triton_sketch(x, y, projections, p, noise_std, seed, ctx.needs_input_grad[1],
                                             return_noise, sketch_bins, prims)
        ctx.save_for_backward(None, grad_y)
        if return_noise:
            ctx.mark_non_differentiable(noise)
            return loss, noise
        return loss


def sliced_wasserstein_triton(x, y, projections, p, noise_std, seed, return_noise, prims=None, *, sketch_bins=None,
                              grads=None):
    """Backend function of op ``"sliced_wasserstein"`` (dispatch contract signature).

    Shape: x (N, d) private side (already clipped by the public function), y (M, d), projections (k, d);
    noise σ >= 0 is a standard deviation on projected values, added to both sides (x: stream "private",
    y: stream "particles" of kernels/_common.py). Returns the 0-d loss, or ``(loss, noise_x (N, k), noise_y (M, k))``
    with the exact σ-scaled draws when ``return_noise``. With ``sketch_bins=L`` the sketch release
    (:class:`SketchSlicedWassersteinTriton`): σ is the standard deviation of the noise on each private bin sum, the
    gradient flows to y only, and ``return_noise`` gives ``(loss, noise (k, L) float64, None)``.

    Raises:
        ValueError: p < 1 (p not in {1, 2} with ``sketch_bins``), unsupported dtype / device mix, ``projections``
            requiring grad, ``sketch_bins`` outside [1, min(N, M)].
        BackendUnavailableError: CPU tensors without TRITON_INTERPRET=1.

    Autograd: gradient w.r.t. x and y (sketch: y only), computed in the forward pass; none w.r.t. projections; no
    double backward. ``grads=(need_x, need_y)`` (the custom op ``torch.ops.fastdpot.sliced_wasserstein``, below
    autograd) returns ``(loss, dloss/dx or None, dloss/dy or None)`` as values instead, without autograd.

    References:
        Rakotomamonjy & Ralaivola, "Differentially private sliced Wasserstein distance", ICML 2021;
        merged quantile levels as ``fastdpot.reference.sliced.quantile_levels`` / POT ``wasserstein_1d``.
    """
    if isinstance(p, bool) or not float(p) >= 1.0:
        raise ValueError(f"p must be >= 1, got {p!r}")
    if projections.requires_grad and torch.is_grad_enabled() and grads is None:
        raise ValueError("the triton backend gives no gradient w.r.t. projections; got projections with "
                         "requires_grad=True (use backend='reference' to differentiate w.r.t. the directions)")
    y = y.to(x.dtype)
    projections = projections.to(x.dtype)
    check_launchable(x, y, projections)
    with device_guard(x):
        if sketch_bins is not None:
            if p not in (1, 2):
                raise ValueError(f"p must be 1 or 2 with sketch_bins, got {p!r}")
            if not 1 <= int(sketch_bins) <= min(x.shape[0], y.shape[0]):
                raise ValueError(f"sketch_bins must be in [1, min(N, M)] = [1, {min(x.shape[0], y.shape[0])}], got "
                                 f"{sketch_bins!r}")
            if grads is not None:
                loss, grad_y, _ = _triton_sketch(x, y, projections, p, float(noise_std), int(seed), grads[1], False,
                                                 int(sketch_bins), prims)
                return loss, None, grad_y
            out = SketchSlicedWassersteinTriton.apply(x, y, projections, p, float(noise_std), int(seed),
                                                      bool(return_noise), int(sketch_bins), prims)
            return (out[0], out[1], None) if return_noise else out
        if grads is not None:
            return _triton_points(x, y, projections, p, float(noise_std), int(seed), grads[0], grads[1], False,
                                  prims)[:3]
        out = SlicedWassersteinTriton.apply(x, y, projections, p, float(noise_std), int(seed), bool(return_noise),
                                            prims)
    return tuple(out) if return_noise else out


def sliced_wasserstein_cuda(x, y, projections, p, noise_std, seed, return_noise, prims=None, *, sketch_bins=None,
                            grads=None):
    """Backend function of op ``"sliced_wasserstein"``, backend ``cuda``: :func:`sliced_wasserstein_triton` with the
    projections of float32 inputs sorted by CUB radix sorts carrying 32-bit indices (``fastdpot._C_cuda_flow``)
    instead of ``torch.sort``'s int64 indices; same loss, noise and gradients (float64: ``torch.sort``), both
    releases. ``prims``: the primitive set (default :data:`fastdpot._cuda_prims.CUB`; the tests pass
    :data:`~fastdpot._cuda_prims.TORCH` to run this path on CPU)."""
    from fastdpot._cuda_prims import CUB

    return sliced_wasserstein_triton(x, y, projections, p, noise_std, seed, return_noise,
                                     CUB if prims is None else prims, sketch_bins=sketch_bins, grads=grads)
