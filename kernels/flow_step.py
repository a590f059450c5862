"""Triton backend of op ``"flow_step"``: one step of the DP sliced-Wasserstein particle flow (Sebag et al., TMLR).

Per chunk of ``kc`` directions (``kernels._common.direction_chunk``):

1. ``project_noise`` -- fused projection + Philox noise of the private batch (kc, M), sorted with ``torch.sort``;
2. exact / grid mode: ``project_noise`` of the particles into a (kc, N) buffer, ``torch.sort`` along each direction,
   ``transport_exact`` / ``transport_grid`` writes ``coef = s - T`` back into the same buffer at each particle's row;
   histogram mode with d > 128: ``histogram_coef`` (three passes, no sort, no stored projections);
3. ``accumulate_drift`` adds ``coef^T theta / k`` to the drift; the last chunk fuses the Euler--Maruyama update and
   its Brownian noise.

Histogram mode with d <= 128 is not chunked: two passes build ``k x B`` counters, and one fused pass
(``histogram_step_fused``) computes transport, drift and update with the drift tile in registers.

Sort and indices: ``torch.sort`` of a (kc, N) block returns int64 indices; chunking over directions bounds that
array to ``8 * kc * N`` bytes instead of ``8 * k * N`` (N k = 1.28e9 at N = 1e7, k = 128 would be 10 GB of indices
alone). Within a row the index is < N < 2**31, so the kernels read it as a row offset only.

Peak device memory of exact mode (float32, beyond the inputs): drift + new particles ``2 * 4 N d`` plus, per chunk,
the projection/coefficient buffer ``4 kc N``, the sorted copy ``4 kc N``, the int64 indices ``8 kc N`` and
``torch.sort``'s temporary storage (CUB double buffers for keys and values, about ``12 kc N``), i.e. about
``28 kc N`` bytes. For N = 1e7, d = 48, k = 128 with the default chunk budget of 2**29 elements (kc = 48, three
chunks: 48 + 48 + 32): 1.92 GB input + 3.84 GB drift/new + 28 * 48 * 1e7 B = 13.4 GB, about 19 GB in all (without
chunking, kc = 128: about 42 GB). Histogram mode (d <= 128) stores nothing of size N k: the inputs, drift and
new particles (5.8 GB) plus ``k * B`` int32 counters and the per-block min/max partials (2 x 80 MB), about 5.9 GB.
Grid mode adds two (kc, Q) quantile tables and an int64 (kc, N) ``searchsorted`` index per chunk (12 kc N bytes
more at Q = N). Lower ``FASTDPOT_TRITON_CHUNK_ELEMS`` to trade speed for memory.
"""
from __future__ import annotations

import math

import torch

from ._common import (STREAM_BROWNIAN, STREAM_PARTICLES, STREAM_PRIVATE, check_launchable, device_guard,
                      direction_chunk, fast_noise_stream, stream_seed)
from .drift import accumulate_drift
from . import histogram
from .projection_noise import project_noise
from .quantile import table_segments, transport_exact, transport_grid, transport_table
from fastdpot._cuda_prims import CUB, MAX_HIST_BINS

__all__ = ["flow_step_triton", "flow_step_cuda"]


def flow_step_triton(particles, private, projections, *, noise_std, step_size, diffusion, seed, quantiles,
                     num_quantiles, histogram_bins, return_noise, sketch=None, shard=None, prims=None):
    """Backend function of op ``"flow_step"`` (signature of the dispatch contract).

    Args:
        particles: (N, d) CUDA tensor (or CPU under TRITON_INTERPRET=1), float32 / float64.
        private: (M, d) private batch, already clipped / normalised by the public function.
        projections: (k, d) directions.
        noise_std: σ >= 0, standard deviation of the noise on projected values (both sides).
        step_size: h > 0. diffusion: λ >= 0 (Brownian term sqrt(2 λ h) ξ).
        seed: 62-bit integer (``fastdpot.draw_seed``); noise streams per kernels/_common.py.
        quantiles: "exact" | "grid" | "histogram"; num_quantiles: Q for grid (default N); histogram_bins: B for
            histogram (default 1024).
        return_noise: also return ``dict(particles=(N, k) σ-scaled, private=(M, k) σ-scaled, brownian=(N, d)
            standard normals or None)``, the exact draws, so the torch reference replays the step.
        sketch: None, or ``(table (k, L), levels (L,))`` with ``private=None``: the target of the particle of rank
            r is the table's piecewise-linear ``Q_j(r/(N-1))`` (``fastdpot.reference.flow``; evaluated in
            float64). Only ``quantiles="exact"``; no private noise is drawn (``noise["private"]`` is None).
        prims: None (``torch.sort``, the histogram kernels of ``kernels/histogram.py``) or a primitive set of
            :mod:`fastdpot._cuda_prims` (see :func:`flow_step_cuda`).

    Returns:
        ``(new_particles (N, d), drift (N, d), noise or None)``; no autograd (inputs are detached).

    Raises:
        ValueError: unsupported dtype / device mix, bad ``quantiles``, N < 2, a sketch with ``quantiles`` other than
        ``"exact"`` (not implemented in Triton: use the ``cpu`` or ``reference`` backend). BackendUnavailableError:
        CPU tensors without TRITON_INTERPRET=1.

    References:
        Sebag et al., "Differentially private gradient flow based on the sliced Wasserstein distance", TMLR
        (Sebag et al., TMLR, Euler--Maruyama scheme and drift); the histogram mode is fastdpot's
        (``fastdpot.reference.flow``).
    """
    if quantiles not in ("exact", "grid", "histogram"):
        raise ValueError(f"quantiles must be one of ['exact', 'grid', 'histogram'], got {quantiles!r}")
    if sketch is not None and quantiles != "exact":
        raise ValueError(f"the triton backend supports sketch mode (a quantile-table target) only with "
                         f"quantiles='exact', got quantiles={quantiles!r}; use backend='cpu' or 'reference'")
    x = particles.detach()
    if sketch is not None:  # no private rows: an empty (0, d) batch keeps the launch checks and noise layout
        y = torch.empty((0, x.shape[1]), dtype=x.dtype, device=x.device)
    else:
        y = private.detach().to(x.dtype)
    theta = projections.detach().to(x.dtype)
    check_launchable(x, y, theta)
    n, d = x.shape
    m, k = y.shape[0], theta.shape[0]
    if n < 2:
        raise ValueError(f"particles must have at least 2 rows (N >= 2), got N={n}")
    with device_guard(x):
        return _flow_step(x, y, theta, n, d, m, k, noise_std, step_size, diffusion, seed, quantiles,
                          num_quantiles, histogram_bins, return_noise, sketch, prims=prims)


def flow_step_cuda(particles, private, projections, *, noise_std, step_size, diffusion, seed, quantiles,
                   num_quantiles, histogram_bins, return_noise, sketch=None, shard=None, prims=None):
    """Backend function of op ``"flow_step"``, backend ``cuda``: the Triton step with CUB sorts and the
    shared-memory histogram passes (``fastdpot._C_cuda_flow``, :mod:`fastdpot._cuda_prims`).

    Same contract, noise streams and results as :func:`flow_step_triton`. What changes (float32):

    * exact / grid / sketch: each chunk's projections are sorted in place by a CUB radix sort carrying 32-bit
      indices (not ``torch.sort``'s sorted copy with int64 indices and its double buffers); the transport reads the
      int32 indices and scatters ``s - T`` into a separate buffer. Device memory per chunk: 12 bytes per
      (direction, particle) plus two rows of scratch, against about 28 with ``torch.sort``. (Writing in rank order
      and sorting the coefficients back by index was measured slower on an H200: docs/gpu.md.)
    * histogram (``histogram_bins <= 6144``): the chunk's noisy projections are stored once (4 bytes per
      entry), counted into per-block shared-memory histograms and transported in place with the row's tables in
      shared memory, then reduced to the drift -- instead of three passes that each recompute projections and noise
      and count with global atomics.

    float64 and larger bin counts take the Triton step's own code. ``prims``: the primitive set
    (:data:`fastdpot._cuda_prims.CUB` by default; the tests pass :data:`~fastdpot._cuda_prims.TORCH` to run this
    code path on CPU under ``TRITON_INTERPRET=1``).
    """
    return flow_step_triton(particles, private, projections, noise_std=noise_std, step_size=step_size,
                            diffusion=diffusion, seed=seed, quantiles=quantiles, num_quantiles=num_quantiles,
                            histogram_bins=histogram_bins, return_noise=return_noise, shard=shard,
                            sketch=sketch, prims=CUB if prims is None else prims)


def _flow_step(x, y, theta, n, d, m, k, noise_std, step_size, diffusion, seed, quantiles, num_quantiles,
               histogram_bins, return_noise, sketch=None, prims=None):
    noise_std = float(noise_std)
    seed_p, seed_q, seed_b = (stream_seed(seed, s) for s in (STREAM_PARTICLES, STREAM_PRIVATE, STREAM_BROWNIAN))
    dev, dt = x.device, x.dtype
    drift = torch.empty((n, d), dtype=dt, device=dev)
    new = torch.empty((n, d), dtype=dt, device=dev)
    noise_p = torch.zeros((n, k), dtype=dt, device=dev) if return_noise else None
    noise_q = torch.zeros((m, k), dtype=dt, device=dev) if return_noise else None
    brown = torch.empty((n, d), dtype=dt, device=dev) if return_noise and diffusion > 0 else None
    # sqrt(2·diffusion·step_size): the Brownian term's standard deviation, a quantity derived from λ and h
    brownian_std = math.sqrt(2.0 * float(diffusion) * float(step_size))
    bins = 1024 if histogram_bins is None else int(histogram_bins)
    use_prims = prims is not None and dt == torch.float32  # the CUB sorts take float32 keys
    hist_prims = prims is not None and quantiles == "histogram" and bins <= MAX_HIST_BINS and n < 2 ** 31
    if quantiles == "histogram" and d <= histogram.FUSED_MAX_D and not hist_prims:
        # sort-free and buffer-free: counters for all k directions, then one fused transport + drift + update pass
        qs = torch.sort(project_noise(y, theta, 0, k, seed_q, noise_std, noise_q), dim=1).values
        histogram.histogram_step_fused(x, theta, seed_p, noise_std, qs, bins, drift, new, float(step_size),
                                       brownian_std, seed_b, noise_out=noise_p, brownian_out=brown,
                                       fast_noise=fast_noise_stream(STREAM_PARTICLES))
        noise = dict(particles=noise_p, private=noise_q, brownian=brown) if return_noise else None
        return new, drift, noise
    kc = direction_chunk(n, k)
    buf = torch.empty((kc, n), dtype=dt, device=dev)
    sort_prims = prims if use_prims and quantiles != "histogram" else None
    idx = torch.empty((kc, n), dtype=torch.int32, device=dev) if sort_prims is not None else None
    out = torch.empty((kc, n), dtype=dt, device=dev) if sort_prims is not None else None
    if sketch is not None:
        table = sketch[0].detach().to(dev, torch.float64).contiguous()
        seg, w = table_segments(n, sketch[1].detach().to(dev))
    for j0 in range(0, k, kc):
        c = min(kc, k - j0)
        coef = buf[:c]
        if sketch is not None:
            project_noise(x, theta, j0, c, seed_p, noise_std, noise_p, out=coef,
                          fast_noise=fast_noise_stream(STREAM_PARTICLES))
            coef = _sorted_transport(coef, idx, out, sort_prims,
                                     lambda ps, ix, dst: transport_table(ps, ix, seg, w, table[j0:j0 + c], dst))
            accumulate_drift(coef, theta, j0, drift, 1.0 / k, first=j0 == 0, last=j0 + c >= k, x=x, new=new,
                             step_size=float(step_size), brownian_std=brownian_std, seed_b=seed_b, brownian_out=brown)
            continue
        qs = torch.sort(project_noise(y, theta, j0, c, seed_q, noise_std, noise_q), dim=1).values
        if quantiles == "histogram" and hist_prims:
            project_noise(x, theta, j0, c, seed_p, noise_std, noise_p, out=coef,
                          fast_noise=fast_noise_stream(STREAM_PARTICLES))
            mn, mx = torch.aminmax(coef, dim=1)
            lo, width = histogram.bin_geometry(mn, mx, bins)
            hist = prims.hist_count(coef, lo, width, bins)
            cum = torch.cumsum(hist, dim=1, dtype=torch.int64) - hist  # particles in the bins strictly below
            prims.hist_coef_(coef, lo, width, hist, cum, qs.contiguous())
        elif quantiles == "histogram":
            histogram.histogram_coef(x, theta, j0, c, seed_p, noise_std, qs, bins, coef, noise_p,
                                     fast_noise=fast_noise_stream(STREAM_PARTICLES))
        else:
            project_noise(x, theta, j0, c, seed_p, noise_std, noise_p, out=coef,
                          fast_noise=fast_noise_stream(STREAM_PARTICLES))
            if quantiles == "exact":
                coef = _sorted_transport(coef, idx, out, sort_prims,
                                         lambda ps, ix, dst: transport_exact(ps, ix, qs, dst))
            else:
                q = n if num_quantiles is None else int(num_quantiles)
                coef = _sorted_transport(coef, idx, out, sort_prims,
                                         lambda ps, ix, dst: transport_grid(ps, ix, qs, q, dst))
        accumulate_drift(coef, theta, j0, drift, 1.0 / k, first=j0 == 0, last=j0 + c >= k, x=x, new=new,
                         step_size=float(step_size), brownian_std=brownian_std, seed_b=seed_b, brownian_out=brown)
    noise = dict(particles=noise_p, private=None if sketch is not None else noise_q,
                 brownian=brown) if return_noise else None
    return new, drift, noise


def _sorted_transport(coef, idx, out, prims, transport):
    """Sort each row of the projections ``coef`` (c, N) and write ``s - T`` at each particle's column; returns the
    (c, N) coefficients.

    ``transport(sorted, index, out)`` is one of :mod:`kernels.quantile`'s transports. Without ``prims``:
    ``torch.sort`` (a sorted copy with int64 indices), the coefficients overwrite ``coef``. With ``prims``: ``coef``
    is sorted in place carrying int32 indices (``idx``), the coefficients go to ``out`` (a scattered write into a
    buffer that no thread reads from).
    """
    c = coef.shape[0]
    if prims is None:
        ps, ix = torch.sort(coef, dim=1)
        transport(ps, ix, coef)
        return coef
    prims.argsort_rows_(coef, idx[:c])
    transport(coef, idx[:c], out[:c])
    return out[:c]
