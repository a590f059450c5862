"""Sort-free (histogram) flow step on the CPU: the fused C++/OpenMP kernel and its passes, for torch tensors.

The step is the one of :func:`fastdpot.reference.flow.flow_step` with ``quantiles="histogram"`` (Sebag et al., TMLR: the
Euler--Maruyama step of the smoothed sliced-Wasserstein flow; the histogram CDF is fastdpot's sort-free
approximation of the rank map): per direction j, a ``B``-bin histogram of the noisy particle projections
``s_ij = <x_i, θ_j> + σ ξ_ij`` on ``[min_i s_ij, max_i s_ij]`` gives each particle the level
``u = (C_jb + frac · n_jb) / N``, whose target is the private quantile at u (or, in sketch mode, ``Q_j(u)`` of a
released quantile table). The kernel (``csrc/flow_histogram.cpp``, module ``fastdpot._C_flow_histogram``) stores
nothing of size N·k: each pass recomputes the projections of a block of particles in cache.

Passes, and the contract for a caller whose particles are sharded over processes (rank r holds rows
``[off_r, off_r + n_r)`` of the global (N, d) array):

1. :func:`histogram_minmax` on the shard → per-direction min / max; all-reduce with MIN / MAX.
2. :func:`histogram_counts` with the GLOBAL min / max → (k, B) counts; all-reduce with SUM.
3. :func:`private_targets` once, on the process that holds the private batch (privacy-grade noise; one release),
   then broadcast the (k, M) sorted noisy private projections (or use a released sketch table).
4. :func:`histogram_update` with the global min / max and counts → the shard's new particles and drift.

Every per-particle draw (smoothing noise, Brownian term) is keyed by the particle's global index
``index_offset + i``, with the Philox streams of the C++ exact step (particle noise of direction j: stream 2j;
private noise: stream 2j+1, privacy-grade; Brownian: stream 2k, element ``g·d + c``), so the shards together
compute bit for bit what :func:`histogram_flow_step` computes on the whole array (every pass works per particle;
the shards share only min / max, which reduce exactly, and integer counts).

Communication per step: 2k values (min / max) and k·B integers (counts), independent of N.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from .._ext import cpp_status, load_cpp
from .._validate import check_int, check_nonnegative, check_positive, check_tensor

__all__ = ["available", "require_available", "histogram_minmax", "histogram_counts", "private_targets",
           "histogram_update", "histogram_flow_step"]

_NAME = "flow_histogram"


def available() -> Tuple[bool, Optional[str]]:
    """(available, reason) of the compiled module ``fastdpot._C_flow_histogram``."""
    return cpp_status(_NAME)


def require_available() -> None:
    """Raise :class:`~fastdpot._ext.BackendUnavailableError` (naming the build command) when the compiled module is
    missing: what an explicit ``backend="cpu"`` histogram step (single-process or sharded) does instead of falling
    back to the torch reference."""
    ok, reason = available()
    if not ok:
        from .._ext import _CPP_HINT, BackendUnavailableError

        raise BackendUnavailableError(f"backend 'cpu' for op 'flow_step' (quantiles='histogram') is unavailable "
                                      f"({reason}); " + _CPP_HINT.format(name=_NAME))


def _mod():
    return load_cpp(_NAME)  # BackendUnavailableError naming the build command when missing


def _particles(particles, projections):
    check_tensor(particles, "particles", 2)
    check_tensor(projections, "projections", 2)
    if particles.device.type != "cpu":
        raise ValueError(f"the CPU histogram kernel needs CPU tensors, got particles on {particles.device}")
    if particles.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"the CPU histogram kernel supports float32/float64 particles, got {particles.dtype}")
    if projections.shape[1] != particles.shape[1]:
        raise ValueError(f"particles and projections must share d, got {particles.shape[1]}, {projections.shape[1]}")
    if particles.shape[0] < 1:
        raise ValueError("particles must have at least one row")
    dt = particles.dtype
    return particles.detach().contiguous(), projections.detach().to("cpu", dt).contiguous()


def _common(noise_std, seed, index_offset):
    check_nonnegative(noise_std, "noise_std")
    off = check_int(index_offset, "index_offset", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not -2 ** 63 <= seed < 2 ** 64:
        raise ValueError(f"seed must be an integer in [-2^63, 2^64) (used modulo 2^64), got {seed!r}")
    return float(noise_std), int(seed) if seed < 2 ** 63 else int(seed - 2 ** 64), off


def _geometry(col_min, col_max, k, dt):
    for t, name in ((col_min, "col_min"), (col_max, "col_max")):
        check_tensor(t, name, 1)
        if t.shape[0] != k:
            raise ValueError(f"{name} must have shape ({k},), got {tuple(t.shape)}")
    lo = col_min.detach().to("cpu", dt).contiguous()
    hi = col_max.detach().to("cpu", dt).contiguous()
    if bool((hi < lo).any()):
        raise ValueError("col_max must be >= col_min in every direction")
    return lo, hi


def histogram_minmax(particles: torch.Tensor, projections: torch.Tensor, *, noise_std: float, seed: int,
                     index_offset: int = 0, return_noise: bool = False, max_chunk: int = 0):
    """Pass 1: min and max over the (shard of the) particles of every noisy projection ``<x_i, θ_j> + σ ξ_ij``.

    Args:
        particles: the shard, whose row 0 is global particle ``index_offset``.
        projections: directions θ (rows; unit length expected, not checked).
        noise_std: σ >= 0 of the particles' smoothing noise, in the unit of the projected values.
        seed: integer key of the step's Philox streams (shared by every shard).
        index_offset: global index of row 0 (>= 0).
        return_noise: also return the (n, k) noise draws σ ξ.
        max_chunk: > 0 caps the directions per chunk (testing).

    Shape:
        particles (n, d); projections (k, d). Returns ``(col_min (k,), col_max (k,))`` in the particles' dtype, plus
        the noise (n, k) when ``return_noise``.

    Raises:
        ValueError: not 2-D / not finite, mismatched d, non-CPU or non-float32/64 particles, σ < 0, a negative
            ``index_offset``, a seed outside [0, 2^64).
        BackendUnavailableError: the compiled module is missing.
    """
    x, th = _particles(particles, projections)
    sigma, seed, off = _common(noise_std, seed, index_offset)
    k = th.shape[0]
    mn = torch.empty(k, dtype=x.dtype)
    mx = torch.empty(k, dtype=x.dtype)
    nx = torch.empty(x.shape[0], k, dtype=x.dtype) if return_noise else None
    _mod().hist_minmax(x.numpy(), th.numpy(), sigma, seed, off, mn.numpy(), mx.numpy(),
                       None if nx is None else nx.numpy(), int(max_chunk))
    return (mn, mx, nx) if return_noise else (mn, mx)


def histogram_counts(particles: torch.Tensor, projections: torch.Tensor, col_min: torch.Tensor,
                     col_max: torch.Tensor, histogram_bins: int, *, noise_std: float, seed: int, index_offset: int = 0,
                     max_chunk: int = 0) -> torch.Tensor:
    """Pass 2: counts of ``histogram_bins`` equal bins on ``[col_min_j, col_max_j]`` (the GLOBAL extremes) of every noisy
    projection of the shard (bin ``min(⌊(s - lo)/w⌋, B-1)``, ``w = (hi - lo)/B``, 1 for a constant direction).

    Shape:
        col_min, col_max (k,); returns (k, histogram_bins) int64. Other arguments as :func:`histogram_minmax`.

    Raises:
        ValueError: as :func:`histogram_minmax`, plus ``histogram_bins`` < 1 and bad / non-finite extremes.
    """
    x, th = _particles(particles, projections)
    sigma, seed, off = _common(noise_std, seed, index_offset)
    b = check_int(histogram_bins, "histogram_bins", 1)
    lo, hi = _geometry(col_min, col_max, th.shape[0], x.dtype)
    counts = torch.empty(th.shape[0], b, dtype=torch.int64)
    _mod().hist_counts(x.numpy(), th.numpy(), sigma, seed, off, lo.numpy(), hi.numpy(), counts.numpy(),
                       int(max_chunk))
    return counts


def private_targets(private: torch.Tensor, projections: torch.Tensor, *, noise_std: float, seed: int,
                    return_noise: bool = False):
    """Sorted noisy private projections ``sort_m(<y_m, θ_j> + σ ν_mj)`` per direction: the Gaussian mechanism's
    release of the step. ν is the privacy-grade Philox stream 2j+1 of ``seed`` (64-bit radius uniforms) -- so this
    is private only when ``seed`` is secret (the flows draw it from the privacy randomness source). Compute it ONCE
    per step (one release), on the process that holds the private batch; it clips nothing (clip before).

    Shape:
        private (M, d); projections (k, d). Returns (k, M) sorted along dim 1, plus the noise (M, k) when
        ``return_noise``.

    Raises:
        ValueError: bad shapes / dtypes / values as :func:`histogram_minmax`.
    """
    y, th = _particles(private, projections)
    sigma, seed, _ = _common(noise_std, seed, 0)
    out = torch.empty(th.shape[0], y.shape[0], dtype=y.dtype)
    ny = torch.empty(y.shape[0], th.shape[0], dtype=y.dtype) if return_noise else None
    _mod().hist_private_targets(y.numpy(), th.numpy(), sigma, seed, out.numpy(), None if ny is None else ny.numpy())
    return (out, ny) if return_noise else out


def _sketch_arrays(sketch, k):
    from ..reference.flow import check_sketch_target

    if not isinstance(sketch, (tuple, list)) or len(sketch) != 2:
        raise ValueError(f"sketch must be a pair (table (k, L), levels (L,)), got {type(sketch).__name__}")
    table, levels = check_sketch_target(sketch[0], sketch[1], k)
    return (table.detach().to("cpu", torch.float64).contiguous().numpy(),
            levels.detach().to("cpu", torch.float64).contiguous().numpy())


def histogram_update(particles: torch.Tensor, projections: torch.Tensor, col_min: torch.Tensor,
                     col_max: torch.Tensor, counts: torch.Tensor, *, noise_std: float, seed: int, step_size: float,
                     diffusion: float = 0.0, target: Optional[torch.Tensor] = None,
                     sketch: Optional[Sequence[torch.Tensor]] = None, index_offset: int = 0,
                     return_noise: bool = False, max_chunk: int = 0):
    """Pass 3: each particle's level through the GLOBAL counts, its target, the drift and the Euler--Maruyama
    update ``x - h·drift + sqrt(2λh)·ξ`` of the shard (ξ keyed by global index).

    Args:
        col_min, col_max, counts: the all-reduced outputs of passes 1 and 2 (every row of ``counts`` sums to the
            global N, the level's denominator).
        target: (k, M) sorted noisy private projections (:func:`private_targets`), or
        sketch: ``(table (k, L), levels (L,))`` a released quantile table (as :func:`fastdpot.ops.flow_step`).
        step_size: h > 0. diffusion: λ >= 0 (Brownian term sqrt(2λh)·ξ).
        return_noise: also return the Brownian draws ξ (n, d) (None when λ = 0).
        Other arguments as :func:`histogram_minmax`.

    Shape:
        returns ``(new_particles (n, d), drift (n, d))`` (+ brownian) in the particles' dtype.

    Raises:
        ValueError: as :func:`histogram_minmax`; counts not (k, B) or rows with different sums or a sum < 2; both
            or neither of ``target`` and ``sketch``; a bad table (:func:`fastdpot.reference.flow.check_sketch_target`);
            h <= 0 or λ < 0.
    """
    x, th = _particles(particles, projections)
    sigma, seed, off = _common(noise_std, seed, index_offset)
    h = check_positive(step_size, "step_size")
    lam = check_nonnegative(diffusion, "diffusion")
    k = th.shape[0]
    lo, hi = _geometry(col_min, col_max, k, x.dtype)
    check_tensor(counts, "counts", 2, floating=False,
                 dtypes=(torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8))
    if counts.shape[0] != k:
        raise ValueError(f"counts must have shape ({k}, histogram_bins), got {tuple(counts.shape)}")
    cnt = counts.detach().to("cpu", torch.int64).contiguous()
    if (target is None) == (sketch is None):
        raise ValueError("give exactly one target: target=(k, M) sorted private projections, or sketch=(table, levels)")
    kw = {}
    if target is not None:
        check_tensor(target, "target", 2)
        if target.shape[0] != k:
            raise ValueError(f"target must have shape ({k}, M), got {tuple(target.shape)}")
        kw["sorted"] = target.detach().to("cpu", x.dtype).contiguous().numpy()
    else:
        kw["table"], kw["levels"] = _sketch_arrays(sketch, k)
    new, drift = torch.empty_like(x), torch.empty_like(x)
    br = torch.empty_like(x) if return_noise and lam > 0 else None
    _mod().hist_transport(x.numpy(), th.numpy(), sigma, seed, off, lo.numpy(), hi.numpy(), cnt.numpy(), h, lam,
                          new.numpy(), drift.numpy(), brownian=None if br is None else br.numpy(),
                          max_chunk=int(max_chunk), **kw)
    return (new, drift, br) if return_noise else (new, drift)


def histogram_flow_step(particles: torch.Tensor, private: Optional[torch.Tensor], projections: torch.Tensor, *,
                        noise_std: float, step_size: float, diffusion: float = 0.0, seed: int = 0,
                        histogram_bins: int,
                        index_offset: int = 0, return_noise: bool = False,
                        sketch: Optional[Sequence[torch.Tensor]] = None, max_chunk: int = 0,
                        materialize: Optional[bool] = None):
    """The fused step on one array (passes 1, 2, the private targets and 3 in one call, no N·k storage).

    Same semantics as :func:`fastdpot.ops.flow_step` with ``quantiles="histogram"`` on the ``cpu`` backend (which
    calls this); ``index_offset`` keys the per-particle draws by global index. It
    releases nothing by itself and clips nothing.

    Shape:
        particles (N, d); private (M, d) or None with ``sketch=(table (k, L), levels (L,))``; projections (k, d).
        Returns ``(new (N, d), drift (N, d), noise)`` with noise None or
        ``dict(particles=(N, k), private=(M, k) or None, brownian=(N, d) or None)``.

    Raises:
        ValueError: N < 2, ``histogram_bins`` < 1, both or neither of ``private`` and ``sketch``, and as
            :func:`histogram_update`.
        BackendUnavailableError: the compiled module is missing.
    """
    x, th = _particles(particles, projections)
    sigma, seed, off = _common(noise_std, seed, index_offset)
    h = check_positive(step_size, "step_size")
    lam = check_nonnegative(diffusion, "diffusion")
    b = check_int(histogram_bins, "histogram_bins", 1)
    n, d = x.shape
    k = th.shape[0]
    if n < 2:
        raise ValueError(f"particles must have at least 2 rows (N >= 2), got N={n}")
    if (private is None) == (sketch is None):
        raise ValueError("give exactly one target: private rows, or private=None and sketch=(table, levels)")
    kw = {}
    y = None
    if private is not None:
        check_tensor(private, "private", 2)
        if private.shape[1] != d:
            raise ValueError(f"particles and private must share d, got {d}, {private.shape[1]}")
        y = private.detach().to("cpu", x.dtype).contiguous()
    else:
        kw["table"], kw["levels"] = _sketch_arrays(sketch, k)
    new, drift = torch.empty_like(x), torch.empty_like(x)
    nx = ny = br = None
    if return_noise:
        nx = torch.empty(n, k, dtype=x.dtype)
        ny = torch.empty(y.shape[0], k, dtype=x.dtype) if y is not None else None
        br = torch.empty(n, d, dtype=x.dtype) if lam > 0 else None
    _mod().hist_flow_step(x.numpy(), None if y is None else y.numpy(), th.numpy(), sigma, h, lam, seed, b,
                          new.numpy(), drift.numpy(), None if nx is None else nx.numpy(),
                          None if ny is None else ny.numpy(), None if br is None else br.numpy(), off,
                          max_chunk=int(max_chunk), materialize=-1 if materialize is None else int(bool(materialize)),
                          **kw)
    noise = dict(particles=nx, private=ny, brownian=br) if return_noise else None
    return new, drift, noise
