"""Op ``flow_step``: one Euler--Maruyama step of the DP sliced-Wasserstein particle flow (Sebag et al., TMLR).

This module owns the op: the validated public function :func:`flow_step` and its dispatch rows
(:mod:`fastdpot._dispatch`). Backends (the contract: ``fn(particles, private, projections, *, noise_std, step_size,
reg, seed, quantiles, num_quantiles, return_noise[, sketch])``, returning ``(new, drift, noise)``):

* ``reference``: the pure-torch math of :mod:`fastdpot.reference` (:func:`fastdpot.reference.flow.flow_step`, the
  histogram reference :func:`fastdpot.reference.flow_histogram.flow_step_histogram`, the sketch reference
  :func:`fastdpot.reference.flow_sketch.flow_step_sketch`), with noise from a ``torch.Generator`` seeded with ``seed``;
* ``cpu``: the fused C++/OpenMP step (``csrc/flow.cpp``, module ``fastdpot._C_flow``). ``quantiles="histogram"``
  goes to the sort-free C++ kernel (``csrc/flow_histogram.cpp`` through
  :func:`fastdpot.flow_histogram.histogram_flow_step`), or to the reference where that module is not built (then
  ``backend="cpu"`` asked for explicitly raises instead);
* ``triton``: ``kernels/flow_step.py`` (``fastdpot.kernels.flow_step.flow_step_triton``), imported on first use
  (:func:`fastdpot.ops._triton.register_triton`);
* ``cuda``: the same launcher with the compiled CUDA primitives (``fastdpot.kernels.flow_step.flow_step_cuda``: CUB
  sorts with 32-bit indices feeding the scattered transport, shared-memory histogram passes; ``csrc/cuda/flow.cu``).

``backend="auto"``: ``cpu`` on CPU tensors, ``cuda`` (where built) then ``triton`` on CUDA tensors, else
``reference``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .. import flow_histogram as _hist
from .._dispatch import dispatch, register, set_auto
from .._ext import cpp_status, load_cpp
from .._validate import check_choice, check_int, check_nonnegative, check_positive, check_tensor
from ..reference import flow as _ref
from ._triton import register_cuda, register_triton

__all__ = ["flow_step", "QUANTILE_MODES"]

#: The particle-CDF modes of the step: sort-based ``"exact"``, the authors' ``"grid"``, the sort-free ``"histogram"``.
QUANTILE_MODES = ("exact", "grid", "histogram")


# ------------------------------------------------------------------------------------------------------------
# backend "reference"
# ------------------------------------------------------------------------------------------------------------
def _draw_reference_noise(particles, private, projections, noise_std, reg, seed):
    """Noise of one reference step from a ``torch.Generator`` keyed by ``seed``: particles' smoothing noise
    (float-dtype ``randn``: protects nothing), then the private rows' noise through the privacy source (float64
    wide-tail draws, then a cast: never float32 ``randn``, capped at 5.77σ), then the Brownian term."""
    from ..privacy.randomness import PrivacyRandomness

    n, d = particles.shape
    m, k = private.shape[0], projections.shape[0]
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    dt = particles.dtype
    nx = torch.randn(n, k, generator=g, dtype=dt).to(particles.device)
    ny = PrivacyRandomness(False, g).normal((m, k), dtype=dt, device=particles.device)
    br = torch.randn(n, d, generator=g, dtype=dt).to(particles.device) if reg > 0 else None
    return nx * noise_std, ny * noise_std, br


def _sketch_step_reference(particles, projections, sketch, noise_std, step_size, reg, seed, quantiles,
                           num_quantiles, return_noise):
    """Sketch mode of the reference backend: the same generator order without the private draw (particles,
    Brownian), then :func:`fastdpot.reference.flow_sketch.flow_step_sketch`."""
    from ..reference.flow_sketch import flow_step_sketch

    n, d = particles.shape
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    dt = particles.dtype
    nx = (torch.randn(n, projections.shape[0], generator=g, dtype=dt) * noise_std).to(particles.device)
    br = torch.randn(n, d, generator=g, dtype=dt).to(particles.device) if reg > 0 else None
    table, levels = sketch
    new, drift = flow_step_sketch(particles, table, levels, projections.to(dt), nx, step_size, reg=reg, brownian=br,
                                  quantiles=quantiles, num_quantiles=num_quantiles)
    noise = dict(particles=nx, private=None, brownian=br) if return_noise else None
    return new, drift, noise


@register("flow_step", "reference")
def _flow_step_reference(particles, private, projections, *, noise_std, step_size, reg, seed, quantiles,
                         num_quantiles, return_noise, sketch=None):
    """Reference backend: noise from a ``torch.Generator`` seeded with ``seed`` (order: particles, private (float64
    draws, cast), Brownian), then :func:`fastdpot.reference.flow.flow_step` (or the histogram reference). Sketch mode
    (``sketch=(table, levels)``, ``private=None``): :func:`fastdpot.reference.flow_sketch.flow_step_sketch`."""
    if sketch is not None:
        return _sketch_step_reference(particles, projections, sketch, float(noise_std), step_size, reg, seed,
                                      quantiles, num_quantiles, return_noise)
    private = private.to(particles.dtype)
    projections = projections.to(particles.dtype)
    nx, ny, br = _draw_reference_noise(particles, private, projections, float(noise_std), float(reg), seed)
    if quantiles == "histogram":
        from ..reference.flow_histogram import flow_step_histogram

        new, drift = flow_step_histogram(particles, private, projections, nx, ny, step_size, reg=reg, brownian=br,
                                         num_bins=num_quantiles)
    else:
        new, drift = _ref.flow_step(particles, private, projections, nx, ny, step_size, reg=reg, brownian=br,
                                    quantiles=quantiles, num_quantiles=num_quantiles)
    noise = dict(particles=nx, private=ny, brownian=br) if return_noise else None
    return new, drift, noise


# ------------------------------------------------------------------------------------------------------------
# backend "cpu": csrc/flow.cpp, and csrc/flow_histogram.cpp for quantiles="histogram"
# ------------------------------------------------------------------------------------------------------------
_CPU_MAX_CHUNK = 0  # > 0 caps the directions per chunk of the C++ steps (tests exercise chunking at small sizes)


def _cpu_available():
    return cpp_status("flow")


def _histogram_available():
    """``(available, reason)`` of the sort-free C++ kernel (``fastdpot._C_flow_histogram``), read at call time."""
    return _hist.available()


@register("flow_step", "cpu", available=_cpu_available)
def _flow_step_cpu(particles, private, projections, *, noise_std, step_size, reg, seed, quantiles, num_quantiles,
                   return_noise, sketch=None):
    """Fused C++/OpenMP step (``csrc/flow.cpp``): Philox noise of ``csrc/common.h`` (particle noise of direction j
    on stream 2j, private noise on stream 2j+1, Brownian on stream 2k; vectorised single-precision Box-Muller of
    ``csrc/flow_normal.h``, equal to common.h's double-precision normals to ~2e-6: privacy-grade ``normal2`` for the
    private rows, four-per-block ``normal4`` for the particles' smoothing noise and the Brownian term, which protect
    nothing), radix sort per direction, rank -> target quantile by index
    interpolation (sketch mode: level -> the table's piecewise-linear Q_j, in float64), drift and Euler--Maruyama
    update, in chunks of directions. ``"histogram"`` mode: the sort-free C++ kernel
    (:func:`fastdpot.flow_histogram.histogram_flow_step`, ``csrc/flow_histogram.cpp``; same Philox streams, keyed
    by particle index), or the reference backend where that module is not built (``flow_step`` raises
    BackendUnavailableError instead when ``backend="cpu"`` was asked for explicitly)."""
    if quantiles == "histogram":
        if not _histogram_available()[0]:
            return _flow_step_reference(particles, private, projections, noise_std=noise_std, step_size=step_size,
                                        reg=reg, seed=seed, quantiles=quantiles, num_quantiles=num_quantiles,
                                        return_noise=return_noise, sketch=sketch)
        return _hist.histogram_flow_step(particles, private, projections, noise_std=noise_std, step_size=step_size,
                                         reg=reg, seed=seed, num_bins=num_quantiles, return_noise=return_noise,
                                         sketch=sketch, max_chunk=_CPU_MAX_CHUNK)
    if particles.device.type != "cpu":
        raise ValueError(f"backend 'cpu' needs CPU tensors, got particles on {particles.device}")
    if particles.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"backend 'cpu' supports float32/float64 particles, got {particles.dtype}")
    mod = load_cpp("flow")
    dt = particles.dtype
    x = particles.detach().contiguous()
    th = projections.detach().to(dt).contiguous()
    if sketch is None:
        y = private.detach().to(dt).contiguous()
        tb = lv = None
    else:  # no private rows: the C++ step reads the (k, L) table and its levels in float64
        y = torch.empty(0, x.shape[1], dtype=dt)
        tb = sketch[0].detach().to("cpu", torch.float64).contiguous().numpy()
        lv = sketch[1].detach().to("cpu", torch.float64).contiguous().numpy()
    n, d = x.shape
    m, k = y.shape[0], th.shape[0]
    new = torch.empty_like(x)
    drift = torch.empty_like(x)
    nx = ny = br = None
    if return_noise:
        nx = torch.empty(n, k, dtype=dt)
        ny = torch.empty(m, k, dtype=dt) if sketch is None else None
        br = torch.empty(n, d, dtype=dt) if reg > 0 else None
    q = 0 if quantiles == "exact" else (n if num_quantiles is None else int(num_quantiles))
    mod.flow_step(x.numpy(), y.numpy(), th.numpy(), float(noise_std), float(step_size), float(reg),
                  int(seed), int(q), new.numpy(), drift.numpy(),
                  None if nx is None else nx.numpy(), None if ny is None else ny.numpy(),
                  None if br is None else br.numpy(), _CPU_MAX_CHUNK, table=tb, levels=lv)
    noise = dict(particles=nx, private=ny, brownian=br) if return_noise else None
    return new, drift, noise


set_auto("flow_step", "cpu", [("cpu", 0)])

# ------------------------------------------------------------------------------------------------------------
# backend "triton": kernels/flow_step.py, imported on first use; preferred on CUDA
# ------------------------------------------------------------------------------------------------------------
register_triton("flow_step", "flow_step", "flow_step_triton")
# backend "cuda": the same step with CUB sorts and shared-memory histograms (fastdpot._C_cuda_flow); preferred on CUDA
register_cuda("flow_step", "flow_step", "flow_step_cuda")


# ------------------------------------------------------------------------------------------------------------
# the public, validated entry point
# ------------------------------------------------------------------------------------------------------------
def flow_step(particles: torch.Tensor, private: Optional[torch.Tensor], projections: torch.Tensor, *,
              noise_std: float, step_size: float, reg: float = 0.0, seed: int = 0, quantiles: str = "exact",
              num_quantiles: Optional[int] = None, return_noise: bool = False, backend: str = "auto",
              sketch: Optional[Sequence[torch.Tensor]] = None):
    """One flow step through the dispatch table (low level; :class:`fastdpot.flow.DPSlicedWassersteinFlow` is the
    private API, and calls this).

    This function releases nothing by itself and clips nothing: ``private`` must already be clipped, and the
    caller accounts the release. Noise is drawn from the integer ``seed`` (each backend its own generator;
    ``return_noise=True`` returns the exact draws so :func:`fastdpot.reference.flow.flow_step` can replay them).

    Sketch mode: ``private=None, sketch=(table, levels)``. The target of direction j is then the released quantile
    table ``table[j]`` at ``levels`` (e.g. the post-processed :func:`fastdpot.privacy.sliced_quantile_sketch`):
    each particle's level u (``"exact"``: r/(N-1) from its rank; ``"grid"``: the grid CDF; ``"histogram"``: the
    histogram CDF) maps to ``Q_j(u)``, piecewise linear through ``(levels[l], table[j, l])``, the first / last
    segment extended to u = 0 / 1, u clamped to [0, 1], constant when L = 1
    (:mod:`fastdpot.reference.flow_sketch`). ``noise_std`` is then only the particles' smoothing noise (no private
    draw happens); the flows pass 0 in sketch mode. The ``"triton"`` backend supports ``"exact"`` sketch mode only.

    Args:
        particles, private, projections: see Shape; ``projections`` rows must be unit vectors.
        noise_std: σ >= 0, the noise standard deviation on every projected value (particles and private rows).
        step_size: h > 0. reg: entropic regularisation λ >= 0 (Brownian term ``sqrt(2λh)·ξ``).
        seed: integer in [0, 2**63) keying every draw of the step.
        quantiles: one of :data:`QUANTILE_MODES`. num_quantiles: Q >= 2 for ``"grid"`` (default N), the number of
            bins for ``"histogram"`` (required there).
        return_noise: also return the draws (below).
        backend: ``"auto"``, ``"reference"``, ``"cpu"``, ``"triton"`` or ``"cuda"`` (module docstring).
        sketch: None, or ``(table, levels)`` with ``private=None`` (sketch mode, above).

    Shape:
        particles (N, d); private (M, d) or None; projections (k, d); sketch: table (k, L), levels (L,) strictly
        increasing in [0, 1]. Returns ``(new_particles (N, d), drift (N, d), noise)`` with ``noise`` None or
        ``dict(particles=(N, k), private=(M, k) or None in sketch mode, brownian=(N, d) or None)``.
        ``noise_std`` σ is a standard deviation on projected values; table values are in the projections' unit.

    Raises:
        ValueError: bad shapes / values (see :func:`fastdpot.reference.flow.flow_step`), projections whose rows
            are not unit vectors, ``seed`` not an integer in [0, 2**63), both or neither of
            ``private`` and ``sketch``, a bad table / levels
            (:func:`fastdpot.reference.flow_sketch.check_sketch_target`), a sketch on a backend/mode without it.
        BackendUnavailableError: an explicitly requested backend is missing.

    References:
        Sebag et al., "Differentially private gradient flow based on the sliced Wasserstein distance", TMLR
        (DPSWflow-r's step; the ``"grid"`` mode is the authors' procedure).
    """
    check_tensor(particles, "particles", 2)
    check_tensor(projections, "projections", 2)
    if (private is None) == (sketch is None):
        raise ValueError("give exactly one target: private rows (private=...) or a quantile table "
                         "(private=None, sketch=(table, levels))")
    if sketch is not None:
        from ..reference.flow_sketch import check_sketch_target

        if not isinstance(sketch, (tuple, list)) or len(sketch) != 2:
            raise ValueError(f"sketch must be a pair (table (k, L), levels (L,)), got {type(sketch).__name__}")
        sketch = tuple(check_sketch_target(sketch[0], sketch[1], projections.shape[0]))
        if projections.shape[1] != particles.shape[1]:
            raise ValueError(f"particles and projections must share d, got {particles.shape[1]}, "
                             f"{projections.shape[1]}")
    else:
        check_tensor(private, "private", 2)
        if private.shape[1] != particles.shape[1] or projections.shape[1] != particles.shape[1]:
            raise ValueError(f"particles, private and projections must share d, got {particles.shape[1]}, "
                             f"{private.shape[1]}, {projections.shape[1]}")
    if particles.shape[0] < 2:
        raise ValueError(f"particles must have at least 2 rows (N >= 2), got N={particles.shape[0]}")
    from .._validate import check_seed, check_unit_rows

    check_unit_rows(projections, "projections")
    seed = check_seed(seed, "seed")
    check_nonnegative(noise_std, "noise_std")
    check_positive(step_size, "step_size")
    check_nonnegative(reg, "reg")
    check_choice(quantiles, "quantiles", QUANTILE_MODES)
    if quantiles != "exact" and num_quantiles is not None:
        check_int(num_quantiles, "num_quantiles", 2)
    if quantiles == "histogram" and num_quantiles is None:
        raise ValueError("num_quantiles (the number of histogram bins) is required for quantiles='histogram'")
    _, fn = dispatch("flow_step", backend, particles.device.type, particles.shape[0] * projections.shape[0])
    if backend == "cpu" and quantiles == "histogram":  # the cpu backend's histogram kernel is its own module
        _hist.require_available()
    extra = {} if sketch is None else dict(sketch=sketch)  # backends without sketch mode keep their signature
    return fn(particles, private, projections, noise_std=float(noise_std), step_size=float(step_size),
              reg=float(reg), seed=int(seed), quantiles=quantiles, num_quantiles=num_quantiles,
              return_noise=return_noise, **extra)
