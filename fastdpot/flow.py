"""DP sliced-Wasserstein particle flows: DPSWflow-r (``variant="resample"``) and DPSWflow (``"presampled"``).

Sebag et al., TMLR. Particles follow the Euler--Maruyama discretisation of the smoothed
sliced-Wasserstein gradient flow towards a private data set; the private data enter only through their noisy
projections ``Y Θᵀ + V`` (a Gaussian mechanism), released once per step.

Privacy guarantee (what the code enforces, and what it assumes)
----------------------------------------------------------------
* Every private row is clipped to the ball of radius ``radius`` (or, with ``normalize=True``, scaled onto the sphere
  of that radius) inside :meth:`DPSlicedWassersteinFlow.step`, so two neighbouring rows differ by at most the
  diameter ``2·radius``. Rows are never used raw.
* Neighbouring data sets differ by the substitution of one row (replace-one). Per step the release is the noisy
  projection of the batch's rows, a Gaussian mechanism with sensitivity ``Δ = 2·radius·sqrt(w(k, δ_tail))``
  (:func:`fastdpot.privacy.sliced_sensitivity`), which holds with probability ``≥ 1 − δ_tail`` over the draw of
  the k directions; the noise std on every projected value is ``σ = z·Δ``.
* :meth:`run` draws each step's batch with :class:`fastdpot.privacy.FixedSizeSampler` (``B`` rows uniformly
  without replacement, fresh each step -- never a replayed epoch) and accounts it as a sampled-without-replacement
  Gaussian (RDP, substitution neighbours) with sample rate ``q = B/n``. :meth:`step` on a batch you chose yourself is
  accounted as an unsampled Gaussian release (sample rate 1, no amplification).
* Over the planned ``T = steps`` steps the guarantee is ``(ε, δ)`` with ``δ = δ_acc + T·δ_tail`` (union bound over
  the T draws of Θ; :func:`fastdpot.privacy.split_delta`, default ``δ_acc = δ/2``, ``δ_tail = δ/(2T)``); ε is the
  accountant's ε at ``δ_acc`` after the steps taken. The flow refuses to take more than T private steps (the δ
  split would no longer hold), and with ``target_epsilon`` a :class:`fastdpot.privacy.PrivacyBudget` refuses a
  step that would exceed it before anything is released.
* ``directions="orthogonal"``: each step's k directions are ``⌈k/d⌉`` blocks of orthonormal rows (Haar-random
  rotations; every direction still marginally uniform). Then ``Δ = 2·radius·sqrt(⌈k/d⌉)`` holds for every draw
  (:func:`fastdpot.privacy.orthogonal_sliced_sensitivity`): no tail, ``δ_tail = 0`` and the accountant gets all of
  δ. With k a multiple of d this is less noise than the uniform directions' tail bound (k = 72, d = 8: Δ = 6 vs
  8.5 at δ = 1e-5 over 420 steps).
* ``variant="presampled"`` (DPSWflow): a pool of ``pool_size`` directions is drawn once and every step uses k of
  them drawn uniformly without replacement, so each step's directions are marginally k i.i.d. uniform directions
  and the same per-step tail bound and union bound apply; every step's noisy release is composed like DPSWflow-r
  (the authors' code reports ε = 0 for this variant; fastdpot does not).
* The noisy particle projections use the same σ (the authors' smoothing); particles are public post-processing.
* ``release="sketch"``: instead of the B·k noisy projections, each step releases the sliced quantile sketch of the
  batch (:func:`fastdpot.privacy.sliced_quantile_sketch`: per direction, sort the projected clipped rows, sum them in
  L = ``num_bins`` rank bins whose sizes depend only on B and L, add N(0, σ²) to each bin sum). Its ℓ2 sensitivity
  under replace-one neighbours is the same Δ as the per-point release (proof in the mechanism's docstring), so the
  same σ = z·Δ, the same sampler and the same accountant event apply, one release per step as above. The bin means
  are post-processed (isotonic fit) into a (k, L) quantile table, which is the step's target; the particles'
  projections get NO smoothing noise in this mode (the target is no longer the σ-smoothed private law, so
  smoothing the particles would only blur them; noise 0 is also what the issue's prototype used).
* ``noise_multiplier=None`` with ``target_epsilon=None`` (or ``inf``) is the NON-PRIVATE flow: σ = 0 and
  :meth:`epsilon` returns ``inf``.
* Randomness (``secure_mode``, :mod:`fastdpot.privacy.randomness`): by default every privacy draw of a private
  flow (batches, directions, the per-step Philox key of the noise) comes from the operating system and is never
  stored; ``generator`` then drives only the public initial particles. ``secure_mode=False`` replays every draw
  from ``generator`` (tests, debugging): there is no guarantee against anyone who holds its seed or a checkpoint.
  A checkpoint of a replayable flow holds that generator's state and is a private artefact.
* Not covered: the diffusion term's amplification (paper Thm. 3) is not claimed; floating-point noise sampling
  (Mironov 2012) is not hardened.
"""
from __future__ import annotations

import logging
import inspect
import math
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Union

import torch

from ._checkpoint import CheckpointError  # noqa: F401  (raised by load; re-exported)
from .ops._triton import register_triton
from ._dispatch import dispatch, register, set_auto
from ._ext import BackendUnavailableError, cpp_status, load_cpp
from ._random import make_generator, random_directions
from ._validate import (check_choice, check_delta, check_epsilon, check_finite_tensor, check_int, check_nonnegative,
                        check_positive, check_probability, check_tensor)
from .reference import flow as _ref

__all__ = ["DPSlicedWassersteinFlow", "ClassConditionalFlow", "NonFiniteParticlesError", "flow_step", "draw_init",
           "INIT_KINDS", "FlowRunResult"]

_log = logging.getLogger(__name__)

_QUANTILE_MODES = ("exact", "grid", "histogram")
INIT_KINDS = ("gaussian", "sphere", "gaussian_scaled")


def _check_init_kind(kind) -> None:
    if not isinstance(kind, str) or kind not in INIT_KINDS:
        raise ValueError(f"init must be one of {list(INIT_KINDS)} or a tensor, got {kind!r}")


def draw_init(kind: str, num_particles: int, dim: int, generator: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Data-independent initial particles, drawn from ``generator`` only (no privacy cost).

    Every kind is a fixed map of the same N·d standard normals drawn from ``generator`` (so the generator advances
    identically, and ``"gaussian"`` with ``scale=1`` is the draw flows have always made):

    * ``"gaussian"``: N(0, scale²·I_d) (the papers' start at scale 1: E‖x‖² = d, ‖x‖ ≈ sqrt(d)).
    * ``"sphere"``: uniform on the sphere of radius ``scale`` centred at 0 (at scale 1 the sphere on which the
      normalised private rows lie).
    * ``"gaussian_scaled"``: N(0, (scale²/d)·I_d), so E‖x‖² = scale².

    Args:
        kind: one of :data:`INIT_KINDS`.
        num_particles, dim: N >= 1, d >= 1.
        generator: CPU ``torch.Generator``; the only source of randomness.
        scale: > 0, a length in the particles' units (see the kinds above).

    Shape:
        returns (N, d) float32 on the CPU.

    Raises:
        ValueError: ``kind`` not in :data:`INIT_KINDS`, ``scale`` <= 0 or not finite, sizes < 1.
    """
    _check_init_kind(kind)
    n = check_int(num_particles, "num_particles", 1)
    d = check_int(dim, "dim", 1)
    scale = check_positive(scale, "init_scale")
    x = torch.randn(n, d, generator=generator, dtype=torch.float32)
    if kind == "sphere":
        x = x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
    elif kind == "gaussian_scaled":
        x = x / math.sqrt(d)
    return x * scale if scale != 1.0 else x


class NonFiniteParticlesError(FloatingPointError):
    """A flow step produced NaN/Inf particles; the flow keeps its last good particles and checkpoint."""


#: Why a :meth:`DPSlicedWassersteinFlow.run` call stopped.
STOP_REASONS = ("completed", "budget", "planned_steps")


@dataclass(frozen=True)
class FlowRunResult:
    """What one :meth:`DPSlicedWassersteinFlow.run` call did (``flow.last_run``).

    Attributes:
        steps_requested: the steps asked for in this call (``steps``, or what was left of the planned T).
        steps_run: the steps taken in this call (<= ``steps_requested``).
        steps_taken: the flow's total after the call.
        stop_reason: ``"completed"`` (every requested step taken), ``"budget"`` (the next step would have
            exceeded ``target_epsilon``; nothing more was released) or ``"planned_steps"`` (the planned T private
            steps are used up: the δ split δ = δ_acc + T·δ_tail covers no more).
        epsilon: ε spent after the call at the configured δ (``inf`` non-private; None when the call was told not
            to compute it, as class flows are).
    """

    steps_requested: int
    steps_run: int
    steps_taken: int
    stop_reason: str
    epsilon: Optional[float]

    @property
    def stopped_early(self) -> bool:
        """Whether fewer steps than requested were taken."""
        return self.stop_reason != "completed"


# ------------------------------------------------------------------------------------------------------------
# op "flow_step": backends
# ------------------------------------------------------------------------------------------------------------
def _draw_reference_noise(particles, private, projections, noise_std, reg, seed):
    """Noise of one reference step from a ``torch.Generator`` keyed by ``seed``: particles' smoothing noise
    (float-dtype ``randn``: protects nothing), then the private rows' noise through the privacy source (float64
    wide-tail draws, then a cast: never float32 ``randn``, capped at 5.77σ), then the Brownian term."""
    from .privacy.randomness import PrivacyRandomness

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
    from .reference.flow_sketch import flow_step_sketch

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
        from .reference.flow_histogram import flow_step_histogram  # Triton engineer's reference (lazy)

        new, drift = flow_step_histogram(particles, private, projections, nx, ny, step_size, reg=reg, brownian=br,
                                         num_bins=num_quantiles)
    else:
        new, drift = _ref.flow_step(particles, private, projections, nx, ny, step_size, reg=reg, brownian=br,
                                    quantiles=quantiles, num_quantiles=num_quantiles)
    noise = dict(particles=nx, private=ny, brownian=br) if return_noise else None
    return new, drift, noise


_CPU_MAX_CHUNK = 0  # > 0 caps the directions per chunk of the C++ step (tests exercise chunking at small sizes)


def _cpu_available():
    return cpp_status("flow")


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
        from . import flow_histogram as _hist

        if not _hist.available()[0]:
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
register_triton("flow_step", "flow_step", "flow_step_triton")  # kernels/flow_step.py, imported on first use


def flow_step(particles: torch.Tensor, private: Optional[torch.Tensor], projections: torch.Tensor, *,
              noise_std: float, step_size: float, reg: float = 0.0, seed: int = 0, quantiles: str = "exact",
              num_quantiles: Optional[int] = None, return_noise: bool = False, backend: str = "auto",
              sketch: Optional[Sequence[torch.Tensor]] = None):
    """One flow step through the dispatch table (low level; :class:`DPSlicedWassersteinFlow` is the private API).

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
    """
    check_tensor(particles, "particles", 2)
    check_tensor(projections, "projections", 2)
    if (private is None) == (sketch is None):
        raise ValueError("give exactly one target: private rows (private=...) or a quantile table "
                         "(private=None, sketch=(table, levels))")
    if sketch is not None:
        from .reference.flow_sketch import check_sketch_target

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
    from ._validate import check_seed, check_unit_rows

    check_unit_rows(projections, "projections")
    seed = check_seed(seed, "seed")
    check_nonnegative(noise_std, "noise_std")
    check_positive(step_size, "step_size")
    check_nonnegative(reg, "reg")
    check_choice(quantiles, "quantiles", _QUANTILE_MODES)
    if quantiles != "exact" and num_quantiles is not None:
        check_int(num_quantiles, "num_quantiles", 2)
    if quantiles == "histogram" and num_quantiles is None:
        raise ValueError("num_quantiles (the number of histogram bins) is required for quantiles='histogram'")
    _, fn = dispatch("flow_step", backend, particles.device.type, particles.shape[0] * projections.shape[0])
    if backend == "cpu" and quantiles == "histogram":  # the histogram kernel is its own module
        from .flow_histogram import available as _hist_available

        ok, reason = _hist_available()
        if not ok:
            raise BackendUnavailableError(f"backend 'cpu' for op 'flow_step' (quantiles='histogram') is unavailable: "
                                          f"{reason}; build it with `FASTDPOT_EXT=flow_histogram python setup.py "
                                          "build_ext --inplace`")
    extra = {} if sketch is None else dict(sketch=sketch)  # backends without sketch mode keep their signature
    return fn(particles, private, projections, noise_std=float(noise_std), step_size=float(step_size),
              reg=float(reg), seed=int(seed), quantiles=quantiles, num_quantiles=num_quantiles,
              return_noise=return_noise, **extra)



# ------------------------------------------------------------------------------------------------------------
# DPSlicedWassersteinFlow
# ------------------------------------------------------------------------------------------------------------
from ._dispatch import BACKENDS as _BACKENDS  # noqa: E402  (the flow's backend is checked at construction)


def _privacy():
    from . import privacy  # the privacy core (imported lazily: only private flows need it)

    return privacy


def _atomic_save(obj, path):
    from ._checkpoint import check_checkpoint_path

    path = check_checkpoint_path(path, "path")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_ckpt_", suffix=".pt")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # the previous checkpoint stays intact until the new one is complete
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


class DPSlicedWassersteinFlow:
    """Differentially private sliced-Wasserstein particle flow (DPSWflow-r / DPSWflow), Sebag et al., TMLR.

    Each step: draw k unit directions Θ (fresh, or k of a fixed pool), project the particles and the private batch,
    add N(0, σ²) noise to every projected value, map each noisy particle projection to the private quantile at its
    level (sort-based ``"exact"`` transport, the authors' ``"grid"``, or the sort-free ``"histogram"``), and move

    .. math::  x_i \\leftarrow x_i - h\\,\\frac1k\\sum_j (s_{ij} - T_{ij})\\,\\theta_j + \\sqrt{2\\lambda h}\\,\\xi_i .

    Args:
        num_particles: N >= 2.
        dim: d, the dimension of particles and private rows.
        num_projections: k >= 1 directions per step.
        step_size: h > 0.
        reg: entropic regularisation λ >= 0 (Brownian term).
        noise_multiplier: z = σ/Δ. None with ``target_epsilon`` given: calibrated so that ``steps`` steps spend
            ``target_epsilon`` (at the first :meth:`run`, when the data set size n is known).
        target_epsilon: ε budget; the run stops before a step would exceed it. None/inf with no noise multiplier:
            non-private flow.
        delta: total δ of the guarantee, ``δ = δ_acc + T·δ_tail``.
        radius: private rows are clipped to this ℓ2 radius inside the step (diameter ``2·radius``).
        normalize: scale every private row onto the sphere of radius ``radius`` (the authors' pipeline) instead of
            clipping.
        batch_size: B private rows per step (uniform without replacement). Give this or ``sample_rate``.
        sample_rate: q; then ``B = round(q·n)`` for a data set of n rows.
        steps: T, the planned number of steps (required for a private flow: the δ split and calibration use it).
        variant: ``"resample"`` (DPSWflow-r) or ``"presampled"`` (DPSWflow).
        pool_size: number of pooled directions for ``"presampled"`` (default 10·k).
        quantiles: ``"exact"``, ``"grid"`` or ``"histogram"``.
        num_quantiles: Q for ``"grid"`` (default N), number of bins for ``"histogram"`` (required there).
        bound: tail bound of the sliced sensitivity (:func:`fastdpot.privacy.sliced_sensitivity`): ``"chernoff"``
            (default; proven, exact Beta moment generating function), ``"bernstein"`` (proven, looser) or ``"clt"``
            (the papers' normal approximation, k >= 31; its tail can exceed δ_tail, so it is not a guarantee).
            Unused with ``directions="orthogonal"``.
        directions: ``"uniform"`` (i.i.d. on the sphere, the papers') or ``"orthogonal"`` (blocks of d orthonormal
            directions, deterministic sensitivity ``2·radius·sqrt(⌈k/d⌉)``, see the module docstring; with
            ``"presampled"`` the pool is made of such blocks and each step takes ``⌈k/d⌉`` whole blocks).
        init: initial particles: a tensor (N, d), or a data-independent kind drawn from ``generator``
            (:func:`draw_init`, float32): ``"gaussian"`` (default, N(0, s²·I_d)), ``"sphere"`` (uniform on the
            sphere of radius s) or ``"gaussian_scaled"`` (N(0, (s²/d)·I_d)), s = ``init_scale``. None means
            ``"gaussian"``. The kind is not part of :meth:`state_dict`'s config: the particles are.
        init_scale: s > 0 for a string ``init`` (default 1); must stay 1 with a tensor ``init``.
        generator: CPU ``torch.Generator`` of the public draws (initial particles); with ``secure_mode=False`` (or
            a non-private flow) also of every privacy draw (directions, batches, noise seeds). Default: a freshly
            seeded one.
        secure_mode: True (default): a private flow draws its batches, directions and per-step noise keys from the
            operating system (:class:`fastdpot.privacy.randomness.PrivacyRandomness`; secret, never stored, not
            replayable). False: from ``generator`` (replayable; no guarantee against anyone who holds its seed or a
            checkpoint). Ignored by a non-private flow (everything from ``generator``).
        device: device of the particles.
        backend: ``"auto"``, ``"reference"``, ``"cpu"`` or ``"triton"`` for op ``flow_step``.
        accountant: accountant kind of :class:`fastdpot.privacy.PrivacyAccountant` (``"rdp"``).
        release: ``"points"`` (default: the B·k noisy projections, the papers' release) or ``"sketch"`` (the
            sliced quantile sketch of the batch, L = ``num_bins`` noisy bin means per direction, isotonic fit, then
            a table target for :func:`flow_step`; same Δ, σ and accounting; no smoothing noise on the particles;
            see the module docstring). The ``"triton"`` backend supports ``"sketch"`` with ``quantiles="exact"``.
        num_bins: L, 1 <= L <= B, the sketch's bins per direction (required with ``release="sketch"``, unused and
            refused with ``"points"``).
        process_group: None (default: one process), or a ``torch.distributed`` process group: the particles are
            then sharded over its ranks (:class:`fastdpot.distributed.DistributedSlicedWassersteinFlow`, which
            this call returns; its ``data_rank`` and ``exact_gather_limit`` arguments are accepted then).

    Shape:
        particles (N, d); private data (n, d); private batch (B, d).

    Raises:
        ValueError: step_size <= 0, reg < 0, k < 1, N < 2, inconsistent privacy arguments, a private flow without
            ``steps`` or without ``batch_size``/``sample_rate``, non-finite ``init`` or of the wrong shape, an ``init``
            string not in :data:`INIT_KINDS`, ``init_scale`` <= 0 (or != 1 with a tensor ``init``), ``release`` not
            ``"points"``/``"sketch"``, ``num_bins`` < 1, > the batch size, missing with ``"sketch"`` or given with
            ``"points"``, or ``"sketch"`` on the triton backend with non-exact quantiles.

    References:
        Sebag et al., TMLR, DPSWflow-r / DPSWflow; Rakotomamonjy & Ralaivola, ICML 2021, Lemma 2 (sensitivity);
        dp-accounting (RDP of the sampled-without-replacement Gaussian); scipy.optimize.isotonic_regression
        (the sketch's post-processing).
    """

    def __new__(cls, *args, process_group=None, **kwargs):
        # hook: a process group makes this a sharded flow (fastdpot.distributed; docs/distributed.md)
        if process_group is not None and cls is DPSlicedWassersteinFlow:
            from .distributed import DistributedSlicedWassersteinFlow

            cls = DistributedSlicedWassersteinFlow
        return super().__new__(cls)

    def __init__(self, num_particles: int, dim: int, num_projections: int, step_size: float, reg: float = 0.0,
                 noise_multiplier: Optional[float] = None, target_epsilon: Optional[float] = None,
                 delta: float = 1e-5, radius: float = 1.0, batch_size: Optional[int] = None,
                 sample_rate: Optional[float] = None, steps: Optional[int] = None, variant: str = "resample",
                 pool_size: Optional[int] = None, quantiles: str = "exact", num_quantiles: Optional[int] = None,
                 bound: str = "chernoff", directions: str = "uniform",
                 init: Union[None, str, torch.Tensor] = None, init_scale: float = 1.0,
                 generator: Optional[torch.Generator] = None, device: Union[str, torch.device] = "cpu",
                 backend: str = "auto", normalize: bool = False, accountant: str = "rdp",
                 secure_mode: bool = True, release: str = "points", num_bins: Optional[int] = None,
                 process_group=None):
        if process_group is not None:  # DPSlicedWassersteinFlow(..., process_group=pg) builds the subclass, which
            # does not pass it on; a user subclass of this class cannot be sharded
            raise ValueError("process_group is handled by fastdpot.distributed.DistributedSlicedWassersteinFlow")
        n = check_int(num_particles, "num_particles", 2)
        d = check_int(dim, "dim", 1)
        k = check_int(num_projections, "num_projections", 1)
        step_size = check_positive(step_size, "step_size")
        reg = check_nonnegative(reg, "reg")
        delta = check_delta(delta)
        radius = check_positive(radius, "radius")
        check_choice(variant, "variant", ("resample", "presampled"))
        check_choice(quantiles, "quantiles", _QUANTILE_MODES)
        check_choice(bound, "bound", ("chernoff", "clt", "bernstein"))
        check_choice(directions, "directions", ("uniform", "orthogonal"))
        check_choice(accountant, "accountant", _privacy().ACCOUNTANTS)
        check_choice(backend, "backend", ("auto",) + _BACKENDS)
        if isinstance(init, str):
            _check_init_kind(init)
        init_scale = check_positive(init_scale, "init_scale")
        if isinstance(init, torch.Tensor) and init_scale != 1.0:
            raise ValueError(f"init_scale only applies to a string init; scale the init tensor yourself (got "
                             f"init_scale={init_scale!r})")
        check_choice(release, "release", ("points", "sketch"))
        if release == "sketch":
            if num_bins is None:
                raise ValueError("num_bins (L, the sketch's bins per direction) is required for release='sketch'")
            num_bins = check_int(num_bins, "num_bins", 1)
            if batch_size is not None and isinstance(batch_size, int) and num_bins > batch_size:
                raise ValueError(f"num_bins must be <= batch_size = {batch_size} (each bin needs a row), got "
                                 f"{num_bins}")
            if backend == "triton" and quantiles != "exact":
                raise ValueError(f"release='sketch' on the triton backend needs quantiles='exact', got "
                                 f"{quantiles!r}")
        elif num_bins is not None:
            raise ValueError(f"num_bins is only used with release='sketch', got num_bins={num_bins!r}")
        if num_quantiles is not None:
            num_quantiles = check_int(num_quantiles, "num_quantiles", 2)
        if quantiles == "histogram" and num_quantiles is None:
            raise ValueError("num_quantiles (the number of histogram bins) is required for quantiles='histogram'")
        if variant == "presampled":
            pool_size = 10 * k if pool_size is None else check_int(pool_size, "pool_size", k)
        elif pool_size is not None:
            raise ValueError(f"pool_size is only used with variant='presampled', got pool_size={pool_size!r}")
        if noise_multiplier is not None:
            noise_multiplier = check_positive(noise_multiplier, "noise_multiplier")
        if target_epsilon is not None:
            target_epsilon = check_epsilon(target_epsilon, "target_epsilon", allow_inf=True)
            if math.isinf(target_epsilon):
                if noise_multiplier is not None:
                    raise ValueError(f"target_epsilon=inf means a non-private flow; noise_multiplier must then be "
                                     f"None, got {noise_multiplier!r}")
                target_epsilon = None
        self.private = noise_multiplier is not None or target_epsilon is not None
        if batch_size is not None and sample_rate is not None:
            raise ValueError(f"give batch_size or sample_rate, not both (got {batch_size!r} and {sample_rate!r})")
        if batch_size is not None:
            batch_size = check_int(batch_size, "batch_size", 1)
        if sample_rate is not None:
            sample_rate = check_probability(sample_rate, "sample_rate")
        if steps is not None:
            steps = check_int(steps, "steps", 1)
        if self.private:
            if steps is None:
                raise ValueError("steps (the planned number of steps T) is required for a private flow: the δ "
                                 "split δ = δ_acc + T·δ_tail and the noise calibration depend on it")
            if batch_size is None and sample_rate is None:
                raise ValueError("a private flow needs batch_size or sample_rate (how run() samples each step)")
        if generator is None:
            generator = make_generator()
        if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
            raise ValueError(f"generator must be a CPU torch.Generator, got {generator!r}")
        if not isinstance(secure_mode, bool):
            raise ValueError(f"secure_mode must be a bool, got {secure_mode!r}")
        self.device = torch.device(device)
        self._generator = generator
        from .privacy.randomness import PrivacyRandomness

        self.secure_mode = secure_mode and self.private
        # every privacy draw goes through self._rng (OS randomness in secure mode, `generator` otherwise)
        self._rng = PrivacyRandomness(True) if self.secure_mode else PrivacyRandomness(False, generator)
        self._config: Dict[str, Any] = dict(
            num_particles=n, dim=d, num_projections=k, step_size=step_size, reg=reg,
            noise_multiplier=noise_multiplier, target_epsilon=target_epsilon, delta=delta, radius=radius,
            batch_size=batch_size, sample_rate=sample_rate, steps=steps, variant=variant, pool_size=pool_size,
            quantiles=quantiles, num_quantiles=num_quantiles, bound=bound, directions=directions,
            normalize=bool(normalize),
            accountant=accountant, release=release, num_bins=num_bins)
        self.backend = backend
        self._particles = self._initial_particles(init, n, d, generator, init_scale).to(self.device)
        self._pool = None
        if variant == "presampled":
            # orthogonal pools hold whole blocks of d rows, at least ⌈k/d⌉ of them
            self._pool = self._draw_directions(pool_size if directions == "uniform"
                                               else d * max(-(-pool_size // d), -(-k // d)))
        self._step = 0
        self._last_drift_norm = float("nan")
        self.last_run: Optional[FlowRunResult] = None  # what the last run() call did
        # privacy state
        self._noise_multiplier = noise_multiplier
        self._bound_n: Optional[int] = None
        self._bound_batch: Optional[int] = None
        self._mode: Optional[str] = None  # "sampled" (run) or "full" (step)
        self._accountant = None
        self._budget = None
        self._pending = 0  # steps counted (and released) but not yet recorded in the accountant
        self._max_total = steps
        self._budget_limited = False
        if self.private:
            p = _privacy()
            if directions == "orthogonal":  # deterministic sensitivity: all of δ goes to the accountant
                self._delta_acc, self._delta_tail = delta, 0.0
                self._sensitivity = p.orthogonal_sliced_sensitivity(k, d, diameter=2.0 * radius)
            else:
                self._delta_acc, self._delta_tail = p.split_delta(delta, steps)
                self._sensitivity = p.sliced_sensitivity(k, d, self._delta_tail, bound=bound,
                                                         diameter=2.0 * radius)
        else:
            self._delta_acc, self._delta_tail, self._sensitivity = None, None, None

    def _initial_particles(self, init, n, d, generator, init_scale) -> torch.Tensor:
        """The (N, d) start (a distributed flow overrides this with its shard, drawn by global index)."""
        if init is None or isinstance(init, str):
            return draw_init("gaussian" if init is None else init, n, d, generator, init_scale)
        check_tensor(init, "init", 2)
        if tuple(init.shape) != (n, d):
            raise ValueError(f"init must have shape ({n}, {d}), got {tuple(init.shape)}")
        return init.detach().clone()

    # -- properties ---------------------------------------------------------------------------------------
    @property
    def particles(self) -> torch.Tensor:
        """Current particles (N, d)."""
        return self._particles

    @property
    def steps_taken(self) -> int:
        """Flow steps taken so far (a private step is counted before its release; one refused by the budget is
        not counted).
        """
        return self._step

    @property
    def config(self) -> Dict[str, Any]:
        """A copy of the flow's settings (the constructor arguments after validation; saved in :meth:`state_dict`)."""
        return dict(self._config)

    @property
    def noise_multiplier(self) -> Optional[float]:
        """z = σ/Δ (0.0 for the non-private flow; None while a target ε is not calibrated yet)."""
        return 0.0 if not self.private else self._noise_multiplier

    @property
    def sensitivity(self) -> Optional[float]:
        """Δ = 2·radius·sqrt(w(k, δ_tail)) of one step's release (None for the non-private flow)."""
        return self._sensitivity

    @property
    def noise_std(self) -> Optional[float]:
        """σ = z·Δ, a standard deviation on projected values (0.0 non-private; None before calibration)."""
        if not self.private:
            return 0.0
        if self._noise_multiplier is None:
            return None
        return self._noise_multiplier * self._sensitivity

    @property
    def delta_split(self):
        """(δ_acc, δ_tail): total δ = δ_acc + T·δ_tail."""
        return self._delta_acc, self._delta_tail

    @property
    def last_drift_norm(self) -> float:
        """Mean ℓ2 norm of the drift of the last step."""
        return self._last_drift_norm

    # -- privacy ------------------------------------------------------------------------------------------
    def _resolve_batch(self, n: int) -> int:
        c = self._config
        b = c["batch_size"] if c["batch_size"] is not None else int(round(c["sample_rate"] * n))
        if not 1 <= b <= n:
            raise ValueError(f"batch size must be in [1, n={n}], got {b} (batch_size={c['batch_size']!r}, "
                             f"sample_rate={c['sample_rate']!r})")
        if c["num_bins"] is not None and c["num_bins"] > b:
            raise ValueError(f"num_bins must be <= the batch size B = {b} (each bin needs a row), got "
                             f"{c['num_bins']}")
        return b

    def _event(self):
        """Keyword arguments of one step's accounting event."""
        if self._mode == "sampled":
            return dict(sample_rate=self._bound_batch / self._bound_n, sampling="without_replacement",
                        dataset_size=self._bound_n, batch_size=self._bound_batch)
        return dict(sample_rate=1.0, sampling="poisson")

    def _bind(self, mode: str, n: Optional[int], plan: bool = True):
        """Fix the sampling (and calibrate z for a target ε) at the first private step."""
        if self._mode is None:
            self._mode = mode
            if mode == "sampled":
                self._bound_n, self._bound_batch = n, self._resolve_batch(n)
            if not self.private:
                return
            p = _privacy()
            c = self._config
            if self._noise_multiplier is None:
                self._noise_multiplier = float(p.calibrate_noise_multiplier(
                    c["target_epsilon"], self._delta_acc, steps=c["steps"], accountant=c["accountant"],
                    **self._event()))
            self._accountant = p.PrivacyAccountant(accountant=c["accountant"])
            if c["target_epsilon"] is not None:
                self._budget = p.PrivacyBudget(c["target_epsilon"], self._delta_acc, accountant=self._accountant)
            if plan:
                self._plan()
        elif mode != self._mode:
            raise ValueError(f"this flow's privacy accounting was bound to {self._mode!r} steps "
                             f"({'run()' if self._mode == 'sampled' else 'step()'}); mixing run() and step() is "
                             f"not supported")
        elif mode == "sampled" and n != self._bound_n:
            raise ValueError(f"private_data has n={n} rows but this flow's accounting was bound to "
                             f"n={self._bound_n}")

    def _plan(self):
        """Number of private steps (in total) this flow may take: min(T, what the ε budget allows).

        The per-step event is identical, so the budget is asked once here (dp-accounting's RDP of the
        sampled-without-replacement Gaussian costs about 0.5 s per evaluation) instead of at every step.
        """
        T = self._config["steps"]
        left = T - self._step
        if self._budget is None or left <= 0:
            self._max_total = T
            return
        ev = self._event()
        if self._budget.can_spend(self._noise_multiplier, num_steps=left, **ev):
            self._max_total = T
        else:
            self._max_total = self._step + self._budget.max_steps(self._noise_multiplier, limit=left, **ev)
        self._budget_limited = self._max_total < T

    def can_step(self) -> bool:
        """Whether one more private step fits in the planned T steps and the ε budget."""
        if not self.private or self._mode is None:
            return True
        return self._step < self._max_total

    def _spend(self):
        """Count one release before it is computed (refuse it, releasing nothing, if it does not fit)."""
        if self._step >= self._max_total:
            if self._step < self._config["steps"]:
                raise _privacy().BudgetExceededError(
                    f"step {self._step + 1} would exceed target_epsilon={self._config['target_epsilon']!r} "
                    f"(noise_multiplier={self._noise_multiplier!r}); nothing was released")
            raise _privacy().BudgetExceededError(
                f"the flow has taken its planned {self._config['steps']} private steps; more would break the δ "
                f"split δ = δ_acc + T·δ_tail")
        self._pending += 1

    def _flush(self):
        """Record the counted steps in the accountant / budget (identical events compose in one call)."""
        if self._pending:
            if self._budget is not None:
                self._budget.spend(self._noise_multiplier, num_steps=self._pending, **self._event())
            else:
                self._accountant.step(self._noise_multiplier, num_steps=self._pending, **self._event())
            self._pending = 0

    def epsilon(self, delta: Optional[float] = None) -> float:
        """ε spent so far at total δ (default: the configured ``delta``).

        The accountant is asked at ``delta − T·δ_tail`` (the sensitivity tail events of the planned T steps are
        charged in full). Returns ``inf`` for the non-private flow and 0.0 before the first step.

        Raises:
            ValueError: ``delta <= T·δ_tail``.
        """
        if not self.private:
            return math.inf
        if delta is None:
            delta = self._config["delta"]
        delta = check_delta(delta)
        rest = delta - self._config["steps"] * self._delta_tail
        if not rest > 0:
            raise ValueError(f"delta must exceed T·δ_tail = {self._config['steps'] * self._delta_tail!r}, "
                             f"got {delta!r}")
        if self._accountant is None or self._step == 0:
            return 0.0
        self._flush()
        return float(self._accountant.get_epsilon(rest))

    # -- stepping -----------------------------------------------------------------------------------------
    def _draw_directions(self, k: int) -> torch.Tensor:
        c = self._config
        return random_directions(k, c["dim"], self._rng, orthogonal=c["directions"] == "orthogonal",
                                 dtype=self._particles.dtype)

    def _directions(self) -> torch.Tensor:
        k, d = self._config["num_projections"], self._config["dim"]
        if self._pool is None:
            return self._draw_directions(k)
        if self._config["directions"] == "orthogonal":  # ⌈k/d⌉ whole blocks of the pool, then the first k rows
            blocks = self._pool.reshape(-1, d, d)
            idx = self._rng.subset(blocks.shape[0], -(-k // d))
            return blocks[idx].reshape(-1, d)[:k]
        idx = self._rng.subset(self._pool.shape[0], k)
        return self._pool[idx]

    def _clip(self, batch: torch.Tensor) -> torch.Tensor:
        p = _privacy()
        r = self._config["radius"]
        if self._config["normalize"]:
            return p.normalize_rows(batch) * r
        return p.clip_rows(batch, r)

    def step(self, private_batch: torch.Tensor) -> torch.Tensor:
        """One flow step on ``private_batch`` (clipped inside), accounted as an unsampled Gaussian release.

        Use :meth:`run` to get the amplification by subsampling; a flow uses either ``step`` or ``run``.

        Shape:
            private_batch (M, d). Returns the new particles (N, d).

        Raises:
            ValueError: bad batch; fastdpot.privacy.BudgetExceededError: the planned T private steps are used up;
            fastdpot.privacy.BudgetExceededError: the step would exceed ``target_epsilon`` (nothing is released);
            NonFiniteParticlesError: the step produced NaN/Inf (particles keep their last good value; the step is
            still counted as spent).
        """
        self._check_batch(private_batch, "private_batch")
        nb = self._config["num_bins"]
        if nb is not None and nb > private_batch.shape[0]:
            raise ValueError(f"num_bins must be <= the batch size, got num_bins={nb} and a private_batch of "
                             f"{private_batch.shape[0]} rows")
        self._bind("full", None)
        return self._take_step(private_batch)

    def _check_batch(self, x, name):
        check_tensor(x, name, 2)
        if x.shape[1] != self._config["dim"]:
            raise ValueError(f"{name} must have d={self._config['dim']} columns, got shape {tuple(x.shape)}")

    def _take_step(self, batch: torch.Tensor, spent: bool = False) -> torch.Tensor:
        batch = self._clip(batch.to(self.device, self._particles.dtype))
        if self.private and not spent:
            self._spend()  # counted before anything is computed: every release is accounted
        c = self._config
        theta = self._directions().to(self.device)
        seed = self._rng.seed()  # the step's Philox key: fresh OS bits in secure mode, never stored
        _, fn = dispatch("flow_step", self.backend, self.device.type, self._particles.shape[0] * theta.shape[0])
        if c["release"] == "sketch":  # the step's one release: the sketch; the particles get no smoothing noise
            table = self._release_sketch(batch, theta)
            new, drift, _ = fn(self._particles, None, theta, noise_std=0.0, step_size=c["step_size"], reg=c["reg"],
                               seed=seed, quantiles=c["quantiles"], num_quantiles=c["num_quantiles"],
                               return_noise=False, sketch=table)
        else:
            new, drift, _ = fn(self._particles, batch, theta, noise_std=float(self.noise_std),
                               step_size=c["step_size"], reg=c["reg"], seed=seed, quantiles=c["quantiles"],
                               num_quantiles=c["num_quantiles"], return_noise=False)
        self._step += 1
        if not bool(torch.isfinite(new).all()):
            raise NonFiniteParticlesError(
                f"flow step {self._step} produced non-finite particles (step_size={c['step_size']!r}, "
                f"reg={c['reg']!r}); the particles keep their last finite value and no checkpoint was written")
        self._particles = new
        self._last_drift_norm = float(drift.norm(dim=1).mean())
        return new

    def _release_sketch(self, batch: torch.Tensor, theta: torch.Tensor):
        """The sketch release of one step and its post-processing: ``(table (k, L), levels (L,))``.

        :func:`fastdpot.privacy.sliced_quantile_sketch` clips (or normalises) ``batch`` inside, bins each
        direction's sorted projections into L rank bins and adds N(0, σ²), σ = z·Δ, to every bin sum; the noisy
        bin means are then fitted non-decreasing per direction
        (:func:`fastdpot.privacy.sketch.sketch_quantile_table`), which is post-processing.
        The noise comes from the flow's privacy randomness ``self._rng`` (secret OS draws unless
        ``secure_mode=False``).
        """
        c = self._config
        p = _privacy()
        sketch = p.sliced_quantile_sketch(batch, theta, c["num_bins"], float(self.noise_std), radius=c["radius"],
                                          normalize=c["normalize"], generator=self._rng)
        return p.sketch.sketch_quantile_table(sketch)

    def run(self, private_data: torch.Tensor, steps: Optional[int] = None, progress: bool = True,
            checkpoint_path: Optional[str] = None, checkpoint_every: Optional[int] = None,
            callback: Optional[Callable[["DPSlicedWassersteinFlow"], None]] = None,
            progress_epsilon: bool = True) -> torch.Tensor:
        """Run the flow on ``private_data``: each step samples a fresh batch of B rows uniformly without
        replacement (:class:`fastdpot.privacy.FixedSizeSampler`), clips it and takes one step.

        Args:
            private_data: the private data set (n, d).
            steps: number of steps to run in this call (default: until the planned T steps are done).
            progress: show a tqdm bar (step, ε spent, mean drift norm).
            checkpoint_path: where :meth:`save` writes (atomically) every ``checkpoint_every`` steps and at the end.
            checkpoint_every: checkpoint period in steps (default: only at the end).
            callback: called with the flow after every step.
            progress_epsilon: show the ε spent in the bar (False for class flows: ε_c depends on the private n_c).

        Returns the particles (N, d). Stops early, without error, when the next step would exceed the ε budget or
        the planned T private steps: it then logs a warning (logger ``fastdpot.flow``) saying which, and
        :attr:`last_run` (a :class:`FlowRunResult`) / :attr:`stop_reason` hold the reason, the steps run and the ε
        spent. The bar shows the ε spent after the step it displays.

        Raises:
            ValueError: bad data, ``steps`` missing for a non-private flow without planned steps, n changed,
                ``checkpoint_path`` a directory or not writable (checked before any step is spent).
            TypeError: ``checkpoint_path`` not a str or os.PathLike.
            NonFiniteParticlesError: see :meth:`step` (the last checkpoint written stays intact).
        """
        from ._progress import progress_bar as tqdm  # bounded redraw rate, no per-step redraw off a terminal

        self._check_batch(private_data, "private_data")
        n = private_data.shape[0]
        c = self._config
        sampled = c["batch_size"] is not None or c["sample_rate"] is not None
        if steps is None:
            if c["steps"] is None:
                raise ValueError("steps is required: this flow has no planned number of steps")
            steps = c["steps"] - self._step
        else:
            steps = check_int(steps, "steps", 0)
        if checkpoint_every is not None:
            checkpoint_every = check_int(checkpoint_every, "checkpoint_every", 1)
        if checkpoint_path is not None:  # before any step is spent
            from ._checkpoint import check_checkpoint_path

            checkpoint_path = check_checkpoint_path(checkpoint_path)
        if sampled:
            self._bind("sampled", n)
            sampler = _privacy().FixedSizeSampler(n, self._bound_batch, generator=self._rng)
        else:  # non-private flow without a batch size: the whole data set every step
            self._bind("full", None)
            sampler = None
        bar = tqdm(total=steps, disable=not progress, desc="DP-SW flow" if self.private else "SW flow")
        start, stop = self._step, "completed"
        if steps == 0 and self.private and not self.can_step():  # nothing left to run: say why
            stop = "budget" if self._step < c["steps"] else "planned_steps"
        try:
            for it in range(steps):
                if self.private:
                    if not self.can_step():  # planned T reached, or the next step would exceed the ε budget
                        stop = "budget" if self._step < c["steps"] else "planned_steps"
                        break
                    self._spend()  # counted before the batch is drawn
                batch = private_data if sampler is None else private_data[sampler.sample().to(private_data.device)]
                self._take_step(batch, spent=True)
                if callback is not None:
                    callback(self)
                if checkpoint_path is not None and checkpoint_every is not None and self._step % checkpoint_every == 0:
                    self.save(checkpoint_path)
                if progress:
                    bar.update(1)
                    bar.set_postfix(**self._progress_postfix(progress_epsilon))
        finally:
            bar.close()
            if self.private and self._mode is not None:
                self._flush()
        if checkpoint_path is not None:
            self.save(checkpoint_path)
        self.last_run = self._report_run(steps, self._step - start, stop, progress_epsilon)
        return self._particles

    def _progress_postfix(self, show_epsilon: bool) -> Dict[str, Any]:
        """The bar's fields, ε recomputed now (the RDP vector is composed incrementally: a cheap evaluation)."""
        fields = dict(step=self._step)
        if show_epsilon:
            fields["eps"] = f"{self.epsilon():.3g}"
        fields["drift"] = f"{self._last_drift_norm:.3g}"
        return fields

    def _report_run(self, requested: int, ran: int, stop: str, with_epsilon: bool) -> "FlowRunResult":
        """Log why a run() call stopped (a warning when it stopped early) and build its :class:`FlowRunResult`."""
        eps = self.epsilon() if with_epsilon else None
        spent = "" if eps is None else f"; ε spent {eps:.4g} at δ={self._config['delta']:g}"
        c = self._config
        if stop == "budget":
            _log.warning("DP-SW flow stopped after %d of %d requested steps (%d in total): the next step would "
                         "exceed target_epsilon=%g%s; nothing more was released", ran, requested, self._step,
                         c["target_epsilon"], spent)
        elif stop == "planned_steps":
            _log.warning("DP-SW flow stopped after %d of %d requested steps: the planned steps=%d private steps "
                         "are used up (the δ split δ = δ_acc + T·δ_tail covers no more)%s", ran, requested,
                         c["steps"], spent)
        else:
            _log.info("DP-SW flow ran %d steps (%d in total)%s", ran, self._step, spent)
        return FlowRunResult(requested, ran, self._step, stop, eps)

    @property
    def stop_reason(self) -> Optional[str]:
        """Why the last :meth:`run` stopped (see :class:`FlowRunResult`); None before any run."""
        return None if self.last_run is None else self.last_run.stop_reason

    # -- checkpointing ------------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """Everything needed to resume: config, particles, generator state, step counter, accounting.

        Secure mode: ``generator`` is the public generator's state (it drew the initial particles); the privacy
        draws came from the OS and nothing of them is stored. Replayable mode: ``generator`` is the state of the
        privacy source itself, so the state dict (and every checkpoint) is a private artefact: keep it with the
        private data, never with the published outputs.
        """
        if self.private and self._mode is not None:
            self._flush()
        return dict(
            config=dict(self._config), particles=self._particles.detach().cpu().clone(),
            generator=self._generator.get_state(), secure_mode=self.secure_mode, step=self._step,
            pool=None if self._pool is None else self._pool.cpu().clone(), noise_multiplier=self._noise_multiplier,
            mode=self._mode,
            bound_n=self._bound_n, bound_batch=self._bound_batch, last_drift_norm=self._last_drift_norm,
            accountant=None if self._accountant is None else self._accountant.state_dict(),
            budget=None if self._budget is None else self._budget.state_dict())

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` of a flow with the same config (resume a run).

        Atomic: the whole state — config, particles of shape (N, d), generator state, step counter in [0, T], mode,
        bound n, noise multiplier, accountant and budget (whose step counts must equal the step counter) — is
        checked before anything is assigned; on any error this flow is unchanged.

        Raises:
            ValueError: a key missing or invalid (the message names it), a config that does not match this flow's,
                or accounting missing from the state of a private flow that has taken steps (it would reset the ε
                spent).
        """
        new = self._check_state(state)
        (self._particles, gen_state, self._step, self._pool, self._last_drift_norm, self._noise_multiplier,
         self._mode, self._bound_n, self._bound_batch, self._accountant, self._budget) = new
        self._generator.set_state(gen_state)
        self._pending = 0
        if self.private and self._mode is not None:
            self._plan()
        elif self.private:
            self._max_total, self._budget_limited = self._config["steps"], False

    def _check_state(self, state) -> tuple:
        """Validate a :meth:`state_dict` against this flow; return the values to assign (nothing assigned here)."""
        from ._checkpoint import generator_state, require_state, state_choice, state_float, state_int

        require_state(state, ("config", "particles", "generator", "step", "pool", "noise_multiplier", "mode",
                              "bound_n", "last_drift_norm", "accountant", "budget"), "DPSlicedWassersteinFlow")
        if not isinstance(state["config"], dict):
            raise ValueError(f"state['config'] must be a dict, got {type(state['config']).__name__}")
        # checkpoints older than `directions` / `release` / `num_bins` get their defaults
        if {"directions": "uniform", "release": "points", "num_bins": None, **state["config"]} != self._config:
            raise ValueError(f"state config {state['config']} does not match this flow's config {self._config}")
        c = self._config
        parts = state["particles"]
        if not isinstance(parts, torch.Tensor) or not parts.is_floating_point():
            raise ValueError(f"state['particles'] must be a floating-point tensor, got {type(parts).__name__}")
        if tuple(parts.shape) != (c["num_particles"], c["dim"]):
            raise ValueError(f"state['particles'] must have shape ({c['num_particles']}, {c['dim']}), got "
                             f"{tuple(parts.shape)}")
        check_finite_tensor(parts, "state['particles']")
        gen_state = generator_state(state["generator"])
        step = state_int(state["step"], "step", 0, c["steps"] if self.private else None)
        pool = state["pool"]
        if self._pool is None:
            if pool is not None:
                raise ValueError(f"state['pool'] must be None for variant={c['variant']!r}, got a "
                                 f"{type(pool).__name__}")
        else:
            if not isinstance(pool, torch.Tensor) or tuple(pool.shape) != tuple(self._pool.shape):
                raise ValueError(f"state['pool'] must be a tensor of shape {tuple(self._pool.shape)}, got "
                                 f"{tuple(pool.shape) if isinstance(pool, torch.Tensor) else type(pool).__name__}")
            check_finite_tensor(pool, "state['pool']")
            pool = pool.clone().to(self._particles.dtype)
        drift = state_float(state["last_drift_norm"], "last_drift_norm", nan_ok=True)
        mode = state_choice(state["mode"], "mode", (None, "sampled", "full"))
        z = state["noise_multiplier"]
        if z is not None:
            z = state_float(z, "noise_multiplier", positive=True)
        if c["noise_multiplier"] is not None and z != c["noise_multiplier"]:
            raise ValueError(f"state['noise_multiplier']={z!r} differs from the config's {c['noise_multiplier']!r}")
        if self.private and mode is not None and z is None:
            raise ValueError("state['noise_multiplier'] is None but the flow's accounting was bound: the calibrated "
                             "noise multiplier is missing")
        if mode is None and step > 0:
            raise ValueError(f"state['mode'] is None but state['step']={step}: steps without accounting mode")
        n = b = None
        if mode == "sampled":
            n = state_int(state["bound_n"], "bound_n", 1)
            b = self._resolve_batch(n)
            if state.get("bound_batch", b) != b:
                raise ValueError(f"state['bound_batch']={state.get('bound_batch')!r} disagrees with the config's "
                                 f"batch size for n={n} ({b})")
        elif state["bound_n"] is not None:
            raise ValueError(f"state['bound_n'] must be None for mode={mode!r}, got {state['bound_n']!r}")
        acc = budget = None
        if self.private and mode is not None:
            p = _privacy()
            if state["accountant"] is None:
                raise ValueError("state['accountant'] is None for a private flow whose accounting was bound: loading "
                                 "it would reset the ε spent")
            acc = p.PrivacyAccountant.from_state_dict(state["accountant"])
            if c["target_epsilon"] is not None:
                if state["budget"] is None:
                    raise ValueError("state['budget'] is None for a flow with target_epsilon: loading it would reset "
                                     "the ε spent")
                budget = p.PrivacyBudget(c["target_epsilon"], self._delta_acc, accountant=acc)
                budget.load_state_dict(state["budget"])  # refuses another (ε, δ); acc takes the budget's history
            if acc.steps != step:
                raise ValueError(f"state's accountant holds {acc.steps} release(s) but state['step']={step}")
        return (parts.clone().to(self.device), gen_state, step, pool, drift, z, mode, n, b, acc, budget)

    def save(self, path: str) -> None:
        """``torch.save`` of :meth:`state_dict`, written atomically (a crash never corrupts the last checkpoint).

        Raises:
            TypeError, ValueError: ``path`` not a path, a directory, or not writable (checked before writing).
        """
        _atomic_save(self.state_dict(), path)

    @classmethod
    def from_state_dict(cls, state: Dict[str, Any], *, device="cpu", backend="auto") -> "DPSlicedWassersteinFlow":
        """A new flow rebuilt from :meth:`state_dict` (its config, particles, step counter and accounting).

        Raises:
            ValueError: not a flow's state dict (a ``ClassConditionalFlow`` one included), or any check of
                :meth:`load_state_dict`.
        """
        if isinstance(state, dict) and "flows" in state and "config" not in state:
            raise ValueError("this is a ClassConditionalFlow state; use ClassConditionalFlow.load / its state")
        from ._checkpoint import require_state

        require_state(state, ("config", "particles"), "DPSlicedWassersteinFlow")
        if not isinstance(state["config"], dict):
            raise ValueError(f"state['config'] must be a dict, got {type(state['config']).__name__}")
        gen = torch.Generator(device="cpu")
        # checkpoints older than secure mode were replayable
        try:
            flow = cls(**state["config"], init=state["particles"], generator=gen, device=device, backend=backend,
                       secure_mode=bool(state.get("secure_mode", False)))
        except TypeError as err:  # an unknown config key
            raise ValueError(f"state['config'] is not a DPSlicedWassersteinFlow config: {err}") from None
        flow.load_state_dict(state)
        return flow

    @classmethod
    def load(cls, path: str, *, device="cpu", backend="auto") -> "DPSlicedWassersteinFlow":
        """Rebuild a flow from :meth:`save` (only load checkpoints you wrote: ``torch.load`` unpickles).

        Raises:
            FileNotFoundError: no file at ``path``.
            fastdpot.flow.CheckpointError: ``path`` is a directory, or the file is truncated / garbage / another
                kind of checkpoint (the message names the file; a ValueError).
            ValueError: the state fails a check of :meth:`load_state_dict`.
        """
        from ._checkpoint import CheckpointError, load_checkpoint

        state = load_checkpoint(path, "DPSlicedWassersteinFlow")
        if isinstance(state, dict) and "flows" in state and "config" not in state:
            raise CheckpointError(f"{path!r} is a ClassConditionalFlow checkpoint; load it with "
                                  f"ClassConditionalFlow.load")
        try:
            return cls.from_state_dict(state, device=device, backend=backend)
        except ValueError as err:
            raise CheckpointError(f"DPSlicedWassersteinFlow checkpoint {path!r} is invalid: {err}") from err


# the class signature is __init__'s (inspect would otherwise show __new__'s (*args, **kwargs))
DPSlicedWassersteinFlow.__new__.__signature__ = inspect.signature(DPSlicedWassersteinFlow.__init__)


# ClassConditionalFlow lives in its own module; imported here last (it subclasses nothing here but uses this module's
# flow class and helpers), so ``from fastdpot.flow import ClassConditionalFlow`` keeps working.
from .class_flow import ClassConditionalFlow  # noqa: E402
