"""Op ``flow_step``: one Euler--Maruyama step of the DP sliced-Wasserstein particle flow (Sebag et al., TMLR).

This module owns the op: the validated public function :func:`flow_step` (exported as ``fastdpot.ops.flow_step``),
the :class:`Shard` a sharded step runs on (``fastdpot.ops.Shard``), the op's optional features (:func:`step_needs`)
and its dispatch rows (:mod:`fastdpot._dispatch`). Backends (the contract: ``fn(particles, private, projections, *,
noise_std, step_size, diffusion, seed, quantiles, num_quantiles, histogram_bins, return_noise, sketch, shard)``,
returning ``(new, drift, noise)``):

* ``reference`` (any device; features ``shard``, sketch in every mode): :func:`fastdpot.reference.flow.flow_step`
  with the keyed draws of :mod:`fastdpot.reference.philox`, the streams of the C++ kernels (below);
* ``cpu`` (features ``shard``, sketch in every mode): the fused C++/OpenMP exact and grid step (``csrc/flow.cpp``,
  ``fastdpot._C_flow``) and the sort-free histogram step (``csrc/flow_histogram.cpp`` through
  :mod:`fastdpot.ops.cpu_histogram`; a sharded histogram step runs its three passes around the shard's two
  all-reduces). A sharded exact or grid step needs the all-gathered projections and runs the reference's code;
* ``triton``: ``kernels/flow_step.py`` (``fastdpot.kernels.flow_step.flow_step_triton``, imported on first use);
* ``cuda``: the same launcher with the compiled CUDA primitives (CUB sorts, shared-memory histograms;
  ``csrc/cuda/flow.cu``). Neither GPU row takes a shard, nor a sketch outside exact mode.

Draws (reference and cpu; every one keyed by the step's ``seed`` and the particle's GLOBAL index, so the result does
not depend on threads, chunks or shards): the smoothing noise of particle i on direction j is normal i of stream 2j
(four normals per Philox block: it protects nothing); the privacy noise of private row m on direction j is normal m of
stream 2j + 1 (privacy grade, 64-bit radius uniforms); the Brownian term of particle i, coordinate c is normal
``i·d + c`` of stream 2k. The Triton kernels key their own streams (``kernels/_common.py``).

``backend="auto"``: ``cpu`` on CPU tensors, ``cuda`` (where built) then ``triton`` on CUDA tensors, among the rows
with every feature the call needs; else ``reference``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

import torch

from . import cpu_histogram as _hist
from .._blocks import is_block
from .._dispatch import describe_features, dispatch, register, set_auto
from .._ext import cpp_status, load_cpp
from .._validate import check_int, check_nonnegative, check_positive, check_tensor
from ..reference import flow as _ref
from ..reference.philox import keyed_normals
from ._flow_block import block_sketch_step, check_out, fused_block, nonfinite_error, release_block_workspace
from ._triton import register_cuda, register_triton

__all__ = ["flow_step", "Shard", "QUANTILE_MODES", "step_draws", "step_needs", "release_block_workspace"]

#: The particle-level modes of the step: sort-based ``"exact"``, the authors' ``"grid"``, the sort-free
#: ``"histogram"``.
QUANTILE_MODES = _ref.QUANTILE_MODES

# the op's optional features (a row declares those it implements; a call needs those of step_needs)
_FEATURES = ("shard", "sketch:grid", "sketch:histogram", "block")
describe_features("flow_step", {
    "block": "takes no direction block (fastdpot.flows.directions.PatchDCTBlock, RandomHadamardBlock, DenseBlock): "
             "the fast blocks run on CPU (backend 'cpu', or 'reference' through the materialised directions); pass "
             "block.matrix() as projections on a GPU",
    "shard": "takes no shard (a step on one process's rows of particles sharded over processes)",
    "sketch:grid": "takes no quantile-table target (release='sketch', or a sharded flow's release) with "
                   "quantiles='grid'; it takes one with quantiles='exact'",
    "sketch:histogram": "takes no quantile-table target (release='sketch', or a sharded flow's release) with "
                        "quantiles='histogram'; it takes one with quantiles='exact'",
})


def step_needs(*, quantiles: str = "exact", table: bool = False, shard: bool = False, block: bool = False,
               **step_keywords) -> Tuple[str, ...]:
    """The optional features of op ``flow_step`` that a step needs (what :func:`fastdpot._dispatch.dispatch` and
    :func:`fastdpot._dispatch.require` match against each row's ``features``): ``"shard"`` for a sharded step, and
    ``"sketch:<quantiles>"`` for a quantile-table target outside exact mode (every row takes one in exact mode).

    Args:
        quantiles: one of :data:`QUANTILE_MODES`.
        table: the target is a quantile table (``sketch=(table, levels)``), not private rows.
        shard: the step runs on one process's rows of sharded particles (a :class:`Shard`).
        block: the directions are a :class:`fastdpot.flows.directions.DirectionBlock` (feature ``"block"``).
        **step_keywords: the step's other keywords (a flow passes its ``config.step_kwargs()``); none of today's
            needs a feature.

    Returns a tuple of feature names (empty: every row can run the step).
    """
    needs = ("shard",) if shard else ()
    if table and quantiles != "exact":
        needs += (f"sketch:{quantiles}",)
    if block:
        needs += ("block",)
    return needs


@dataclass(frozen=True)
class Shard:
    """This process's place among particles sharded over processes (``torch.distributed`` ranks, or any
    collective the caller provides).

    Attributes:
        offset: global index of this process's first row (>= 0).
        num_particles: N, the number of particles over all processes (>= 2).
        all_reduce: ``all_reduce(tensor, op)`` reduces a CPU or device tensor in place over every process, op
            ``"sum"`` or ``"max"`` (a histogram step calls it twice: the extremes, then the counts).
        all_gather: ``all_gather(tensor)`` returns the rows of every process in global order (exact and grid modes
            gather the (n, k) projections; None where the caller only runs histogram steps).
    """

    offset: int
    num_particles: int
    all_reduce: Callable[[torch.Tensor, str], None]
    all_gather: Optional[Callable[[torch.Tensor], torch.Tensor]] = None

    def check(self, rows: int, quantiles: str) -> "Shard":
        """Validate against a step on ``rows`` local particles; returns self.

        Raises:
            ValueError: offset < 0, N < 2, rows beyond N, no ``all_gather`` for exact or grid mode.
        """
        check_int(self.offset, "shard.offset", 0)
        check_int(self.num_particles, "shard.num_particles", 2)
        if self.offset + rows > self.num_particles:
            raise ValueError(f"shard rows [{self.offset}, {self.offset + rows}) exceed num_particles = "
                             f"{self.num_particles}")
        if not callable(self.all_reduce):
            raise ValueError("shard.all_reduce must be callable(tensor, op)")
        if quantiles != "histogram" and not callable(self.all_gather):
            raise ValueError(f"a sharded step with quantiles={quantiles!r} needs shard.all_gather (the global ranks "
                             f"need every projection); use quantiles='histogram'")
        return self


# ------------------------------------------------------------------------------------------------------------
# the keyed draws (reference of the C++ kernels' streams)
# ------------------------------------------------------------------------------------------------------------
def step_draws(n: int, d: int, k: int, m: int, *, noise_std: float, diffusion: float, seed: int, offset: int = 0,
               dtype=torch.float64, device="cpu"):
    """The draws of one step (module docstring): ``(noise_particles (n, k) σ-scaled or None, noise_private (m, k)
    σ-scaled or None, brownian (n, d) standard normals or None)`` for rows ``offset .. offset + n − 1``."""
    kw = dict(dtype=dtype, device=device)
    nx = ny = br = None
    if noise_std > 0:
        nx = keyed_normals(seed, range(0, 2 * k, 2), offset, n, per_block=4, **kw).t() * noise_std
        if m:
            ny = keyed_normals(seed, range(1, 2 * k, 2), 0, m, per_block=2, **kw).t() * noise_std
    if diffusion > 0:
        br = keyed_normals(seed, 2 * k, offset * d, n * d, per_block=4, **kw).reshape(n, d)
    return nx, ny, br


# ------------------------------------------------------------------------------------------------------------
# backend "reference"
# ------------------------------------------------------------------------------------------------------------
@register("flow_step", "reference", features=_FEATURES)
def _flow_step_reference(particles, private, projections, *, noise_std, step_size, diffusion, seed, quantiles,
                         num_quantiles, histogram_bins, return_noise, sketch=None, shard=None, domain=None):
    """Reference backend: :func:`step_draws`, then :func:`fastdpot.reference.flow.flow_step` (a block's directions
    materialised), then the domain clamp."""
    if is_block(projections):
        projections = projections.matrix(particles.dtype, particles.device)
    n, d = particles.shape
    k, m = projections.shape[0], 0 if private is None else private.shape[0]
    nx, ny, br = step_draws(n, d, k, m, noise_std=noise_std, diffusion=diffusion, seed=seed,
                            offset=0 if shard is None else shard.offset, dtype=particles.dtype,
                            device=particles.device)
    new, drift = _ref.flow_step(particles, None if private is None else private.to(particles.dtype),
                                projections.to(particles.dtype), nx, ny, step_size, diffusion=diffusion, brownian=br,
                                quantiles=quantiles, num_quantiles=num_quantiles, histogram_bins=histogram_bins,
                                sketch=sketch, shard=shard)
    noise = dict(particles=nx, private=ny, brownian=br) if return_noise else None
    return _clamp(new, domain), drift, noise


def _clamp(x: torch.Tensor, domain) -> torch.Tensor:
    """x clamped in place to the validated ``domain`` (lo (d,), hi (d,)) coordinate-wise; x when None."""
    return x if domain is None else torch.max(torch.min(x, domain[1], out=x), domain[0], out=x)


# ------------------------------------------------------------------------------------------------------------
# backend "cpu": csrc/flow.cpp, and csrc/flow_histogram.cpp for quantiles="histogram"
# ------------------------------------------------------------------------------------------------------------
_CPU_MAX_CHUNK = 0  # > 0 caps the directions per chunk of the C++ steps (tests exercise chunking at small sizes)


def _cpu_available():
    """The exact / grid module and the histogram module must both be built (each mode needs its own)."""
    ok, reason = cpp_status("flow")
    if not ok:
        return ok, reason
    return _hist.available()


def _sharded_histogram_cpu(x, th, sketch, *, noise_std, step_size, diffusion, seed, histogram_bins, shard):
    """A sharded histogram step with the three C++ passes: extremes, all-reduce (MAX), counts, all-reduce (SUM),
    transport and update; the draws are keyed by global index (``shard.offset``)."""
    kw = dict(noise_std=noise_std, seed=seed, index_offset=shard.offset, max_chunk=_CPU_MAX_CHUNK)
    lo, hi = _hist.histogram_minmax(x, th, **kw)
    k = lo.shape[0]
    ext = torch.cat([hi, -lo]).double()
    shard.all_reduce(ext, "max")
    lo, hi = (-ext[k:]).to(x.dtype), ext[:k].to(x.dtype)
    counts = _hist.histogram_counts(x, th, lo, hi, histogram_bins, **kw)
    shard.all_reduce(counts, "sum")
    return _hist.histogram_update(x, th, lo, hi, counts, step_size=step_size, diffusion=diffusion, sketch=sketch,
                                  **kw)


@register("flow_step", "cpu", available=_cpu_available, features=_FEATURES)
def _flow_step_cpu(particles, private, projections, *, noise_std, step_size, diffusion, seed, quantiles,
                   num_quantiles, histogram_bins, return_noise, sketch=None, shard=None, domain=None,
                   return_drift=True, out=None, error_if_nonfinite=False):
    """Fused C++/OpenMP step: Philox noise of ``csrc/common.h`` (streams of the module docstring; vectorised
    single-precision Box-Muller of ``csrc/flow_normal.h``, equal to the reference's float64 draws to ~2e-6),
    radix sort per direction, rank -> target quantile by index interpolation (sketch mode: level -> the table's
    piecewise-linear Q_j, in float64), drift and Euler--Maruyama update, in chunks of directions (a sketch target at
    d >= 256 with no diffusion: projection and drift by torch.matmul around the C++ transport, :func:`_sketch_step_gemm`).
    Histogram mode:
    the sort-free kernel (:mod:`fastdpot.ops.cpu_histogram`). Sharded: histogram steps run the kernel's passes around
    the shard's all-reduces; exact and grid steps need every projection and run the reference's code.
    A fast direction block (patch DCT, randomised Hadamard) with a sketch target in exact mode and no smoothing noise:
    the fused block step of ``csrc/flow_block.cpp`` (transform, radix ranks, table lookup, inverse transform, step,
    clamp); any other block is materialised first. Every step then takes the domain clamp. ``out`` and
    ``error_if_nonfinite`` (:func:`flow_step`'s) are taken by the fused block step only: the kernel writes into
    ``out`` and reports the new particles' finiteness from its last pass; :func:`flow_step` does both for the other
    paths."""
    if particles.device.type != "cpu":
        raise ValueError(f"backend 'cpu' needs CPU tensors, got particles on {particles.device}")
    if particles.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"backend 'cpu' supports float32/float64 particles, got {particles.dtype}")
    kw = dict(noise_std=noise_std, step_size=step_size, diffusion=diffusion, seed=seed)
    if is_block(projections):
        if fused_block(projections, sketch, quantiles, noise_std, return_noise, shard):
            return block_sketch_step(particles, projections, sketch, step_size, diffusion, seed, domain,
                                      return_drift, out, error_if_nonfinite)
        projections = projections.matrix(particles.dtype)
    new, drift, noise = _flow_step_cpu_dense(particles, private, projections, quantiles=quantiles,
                                             num_quantiles=num_quantiles, histogram_bins=histogram_bins,
                                             return_noise=return_noise, sketch=sketch, shard=shard, **kw)
    return _clamp(new, domain), drift, noise


def _flow_step_cpu_dense(particles, private, projections, *, noise_std, step_size, diffusion, seed, quantiles,
                         num_quantiles, histogram_bins, return_noise, sketch=None, shard=None):
    """The cpu row on a (k, d) direction matrix (above)."""
    kw = dict(noise_std=noise_std, step_size=step_size, diffusion=diffusion, seed=seed)
    if shard is not None:
        if quantiles != "histogram" or private is not None or return_noise:
            return _flow_step_reference(particles, private, projections, quantiles=quantiles,
                                        num_quantiles=num_quantiles, histogram_bins=histogram_bins,
                                        return_noise=return_noise, sketch=sketch, shard=shard, **kw)
        x, th = particles.detach().contiguous(), projections.detach().to(particles.dtype).contiguous()
        new, drift = _sharded_histogram_cpu(x, th, sketch, histogram_bins=histogram_bins, shard=shard, **kw)
        return new, drift, None
    if quantiles == "histogram":
        return _hist.histogram_flow_step(particles, private, projections, histogram_bins=histogram_bins,
                                         return_noise=return_noise, sketch=sketch, max_chunk=_CPU_MAX_CHUNK, **kw)
    mod = load_cpp("flow")
    dt = particles.dtype
    x = particles.detach().contiguous()
    th = projections.detach().to(dt).contiguous()
    if sketch is not None and quantiles == "exact" and diffusion == 0 and not return_noise and \
            x.shape[1] >= _GEMM_MIN_DIM:
        return _sketch_step_gemm(mod, x, th, sketch, step_size)
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
        br = torch.empty(n, d, dtype=dt) if diffusion > 0 else None
    q = 0 if quantiles == "exact" else (n if num_quantiles is None else int(num_quantiles))
    mod.flow_step(x.numpy(), y.numpy(), th.numpy(), float(noise_std), float(step_size), float(diffusion),
                  int(seed), int(q), new.numpy(), drift.numpy(),
                  None if nx is None else nx.numpy(), None if ny is None else ny.numpy(),
                  None if br is None else br.numpy(), _CPU_MAX_CHUNK, table=tb, levels=lv)
    noise = dict(particles=nx, private=ny, brownian=br) if return_noise else None
    return new, drift, noise


#: from this dimension d on, a sketch-target exact step projects and accumulates the drift with torch.matmul (BLAS)
#: around the C++ transport: the fused kernel's register tiles are made for the latent dimensions of the papers
#: (d ~ 8-64), where the step is bandwidth-bound, not for pixel spaces (d = 784 and more), where it is a GEMM
_GEMM_MIN_DIM = 256


def _sketch_step_gemm(mod, x, th, sketch, step_size):
    """The cpu backend's sketch-target exact step at large d (no noise, no diffusion): P = Θ xᵀ (k, N) and
    drift = Pᵀ Θ / k by torch.matmul, the residual P − Q(rank/(N−1)) in place by the C++ radix transport
    (``fastdpot._C_flow.sketch_residuals``); the same step as the fused kernel, up to float rounding."""
    P = torch.matmul(th, x.t()).contiguous()
    tb = sketch[0].detach().to("cpu", torch.float64).contiguous().numpy()
    lv = sketch[1].detach().to("cpu", torch.float64).contiguous().numpy()
    mod.sketch_residuals(P.numpy(), tb, lv)
    drift = torch.matmul(P.t(), th).div_(th.shape[0])
    return x - step_size * drift, drift, None


set_auto("flow_step", "cpu", [("cpu", 0)])

# ------------------------------------------------------------------------------------------------------------
# backend "triton": kernels/flow_step.py, imported on first use; "cuda": the same step with CUB sorts and
# shared-memory histograms (fastdpot._C_cuda_flow); preferred on CUDA
# ------------------------------------------------------------------------------------------------------------
register_triton("flow_step", "flow_step", "flow_step_triton")
register_cuda("flow_step", "flow_step", "flow_step_cuda")


# ------------------------------------------------------------------------------------------------------------
# the public, validated entry point
# ------------------------------------------------------------------------------------------------------------
def flow_step(particles: torch.Tensor, private: Optional[torch.Tensor], projections: torch.Tensor, *,
              noise_std: float, step_size: float, diffusion: float = 0.0, seed: int = 0, quantiles: str = "exact",
              num_quantiles: Optional[int] = None, histogram_bins: Optional[int] = None, return_noise: bool = False,
              backend: str = "auto", sketch: Optional[Sequence[torch.Tensor]] = None,
              shard: Optional[Shard] = None, domain=None, return_drift: bool = True,
              out: Optional[torch.Tensor] = None, error_if_nonfinite: bool = False):
    """One flow step through the dispatch table (low level; :class:`fastdpot.flows.DPSlicedWassersteinFlow` is the
    private API, and calls this).

    This function releases nothing by itself and clips nothing: ``private`` must already be clipped, and the
    caller accounts the release (its noise is keyed by ``seed``: private only when the seed is secret).
    ``return_noise=True`` returns the exact draws so :func:`fastdpot.reference.flow.flow_step` can replay them.

    Sketch mode: ``private=None, sketch=(table, levels)``: the target of direction j is the released quantile table
    ``table[j]`` at ``levels`` (e.g. the post-processed :func:`fastdpot.privacy.sliced_quantile_sketch`, or a sharded
    flow's broadcast release): each particle's level u maps to ``Q_j(u)``, piecewise linear through
    ``(levels[l], table[j, l])``, the end segments extended, u clamped to [0, 1], constant when L = 1.
    ``noise_std`` is then only the particles' smoothing noise (no private draw happens).

    Direction blocks: ``projections`` may be a :class:`fastdpot.flows.directions.DirectionBlock` (k = its size) in
    place of the (k, d) matrix: the same step on its directions. On CPU, a fast block (patch DCT, randomised
    Hadamard) with a sketch target in exact mode and ``noise_std=0`` runs the fused block kernel (Θx and Θᵀy by the
    block's own transform: O(N·d) memory, no Θ); other modes and the reference materialise Θ; the GPU rows take no
    block yet (BackendUnavailableError).

    Args:
        particles, private, projections: see Shape; ``projections`` rows must be unit vectors (or a block).
        noise_std: σ >= 0, the noise standard deviation on every projected value (particles and private rows).
        step_size: h > 0. diffusion: λ >= 0, the Brownian term ``sqrt(2λh)·ξ``.
        seed: integer in [0, 2**63) keying every draw of the step (all 64 bits of the Philox key are used), or a
            0-d integer tensor holding it (the key input of the custom op ``torch.ops.fastdpot.flow_step``: under
            ``torch.compile`` a tensor key changes without recompiling, a Python integer is a constant of the graph).
        quantiles: one of :data:`QUANTILE_MODES`. num_quantiles: Q >= 2, the ``"grid"`` mode's grid (default N).
        histogram_bins: B >= 1, the ``"histogram"`` mode's bins per direction (required there).
        return_noise: also return the draws (below).
        backend: ``"auto"``, ``"reference"``, ``"cpu"``, ``"triton"`` or ``"cuda"`` (module docstring).
        sketch: None, or ``(table, levels)`` with ``private=None`` (sketch mode, above).
        shard: None (one process), or this process's :class:`Shard`: ``particles`` are then rows
            ``[shard.offset, shard.offset + n)`` of ``shard.num_particles``; every process calls this with its rows
            and the same target, projections and seed.
        domain: None, or ``(lo, hi)``: after the step every coordinate c is clamped to [lo_c, hi_c] (each a number or
            a (d,) tensor, finite, lo <= hi): the projection onto a box, e.g. the data's public range.
        return_drift: False returns None in place of the drift (the fused block step then never forms it: a flow
            that keeps only the particles saves one (N, d) tensor).
        out: None, or a tensor of the particles' shape, dtype and device, sharing no memory with them, that receives
            the new particles and is returned (as ``torch``'s ``out=``): a flow double-buffers its particles through
            it. The fused block step writes into it directly when it has the particles' layout (both C-contiguous,
            or both coordinate-major: a flow's layout); then no (N, d) tensor is allocated, whose first touch (page
            faults) costs about a fifth of a two-thread pixel-space step. Other paths copy into it.
        error_if_nonfinite: True raises FloatingPointError when a new particle is NaN or ±Inf (the particles given
            are unchanged; ``out``, when given, holds the failed step). The fused block step reads this from its last
            pass, and checks the input particles' finiteness in its first: that step makes no separate pass over
            the particles in Python (as ``torch.nn.utils.clip_grad_norm_``'s argument of the same name).

    Shape:
        particles (N, d) (n, d sharded); private (M, d) or None; projections (k, d); sketch: table (k, L), levels
        (L,) strictly increasing in [0, 1]. Returns ``(new_particles, drift, noise)`` of the particles' shape with
        ``noise`` None or ``dict(particles=(N, k), private=(M, k) or None, brownian=(N, d) or None)``.
        ``noise_std`` σ is a standard deviation on projected values; table values are in the projections' unit.

    Raises:
        ValueError: bad shapes / values (see :func:`fastdpot.reference.flow.flow_step`), projections whose rows
            are not unit vectors, ``seed`` not an integer in [0, 2**63), both or neither of ``private`` and
            ``sketch``, a bad table / levels, a bad ``shard``, an ``out`` of another shape, dtype or device, or
            sharing memory with ``particles``, or requiring grad.
        FloatingPointError: ``error_if_nonfinite=True`` and the step produced NaN or ±Inf.
        BackendUnavailableError: an explicitly requested backend is missing or lacks what the call needs (a shard,
            a sketch outside exact mode).

    Under ``torch.compile`` the step is the custom op ``torch.ops.fastdpot.flow_step``
    (:mod:`fastdpot.ops.library`): one node of the graph, its checks run when the graph runs; ``shard`` and
    ``return_noise`` are eager features there (ValueError).

    References:
        Sebag et al., "Differentially private gradient flow based on the sliced Wasserstein distance", TMLR
        (DPSWflow-r's step; the ``"grid"`` mode is the authors' procedure).
    """
    from .._validate import all_finite, check_bool, check_box, check_finite_tensor, check_seed, check_unit_rows

    if torch.compiler.is_compiling():
        if is_block(projections) or domain is not None or out is not None or error_if_nonfinite:
            raise ValueError("flow_step: direction blocks, domain, out and error_if_nonfinite are not supported under "
                             "torch.compile; call the step outside the compiled function")
        return _compiled_step(particles, private, projections, noise_std, step_size, diffusion, seed, quantiles,
                              num_quantiles, histogram_bins, return_noise, backend, sketch, shard)
    if isinstance(seed, torch.Tensor):
        if seed.numel() != 1 or seed.dtype.is_floating_point or seed.dtype.is_complex:
            raise ValueError(f"seed must be an integer or a one-element integer tensor, got {seed!r}")
        seed = int(seed.reshape(()).item())

    check_tensor(particles, "particles", 2, finite=False)  # finiteness below, or in the fused block step's kernel
    block = is_block(projections)
    if not block:
        check_tensor(projections, "projections", 2)
    if (private is None) == (sketch is None):
        raise ValueError("give exactly one target: private rows (private=...) or a quantile table "
                         "(private=None, sketch=(table, levels))")
    if sketch is not None:
        if not isinstance(sketch, (tuple, list)) or len(sketch) != 2:
            raise ValueError(f"sketch must be a pair (table (k, L), levels (L,)), got {type(sketch).__name__}")
        sketch = tuple(_ref.check_sketch_target(sketch[0], sketch[1], projections.shape[0]))
    else:
        check_tensor(private, "private", 2)
        if private.shape[1] != particles.shape[1]:
            raise ValueError(f"particles and private must share d, got {particles.shape[1]}, {private.shape[1]}")
    if projections.shape[1] != particles.shape[1]:
        raise ValueError(f"particles and projections must share d, got {particles.shape[1]}, "
                         f"{projections.shape[1]}")
    domain = check_box(domain, particles)
    num_quantiles, histogram_bins = _ref.check_quantile_sizes(quantiles, num_quantiles, histogram_bins)
    if shard is not None:
        if not isinstance(shard, Shard):
            raise ValueError(f"shard must be a fastdpot.ops.Shard or None, got {type(shard).__name__}")
        shard.check(particles.shape[0], quantiles)
    elif particles.shape[0] < 2:
        raise ValueError(f"particles must have at least 2 rows (N >= 2), got N={particles.shape[0]}")
    if not block:
        check_unit_rows(projections, "projections")
    seed = check_seed(seed, "seed")
    check_nonnegative(noise_std, "noise_std")
    check_positive(step_size, "step_size")
    check_nonnegative(diffusion, "diffusion")
    check_bool(return_drift, "return_drift")
    check_bool(error_if_nonfinite, "error_if_nonfinite")
    if out is not None:
        check_out(out, particles)
    needs = step_needs(quantiles=quantiles, table=sketch is not None, shard=shard is not None, block=block)
    row, fn = dispatch("flow_step", backend, particles.device.type, particles.shape[0] * projections.shape[0],
                       needs=needs)
    fused = row == "cpu" and fused_block(projections, sketch, quantiles, noise_std, return_noise, shard)
    if not fused:  # the fused block step's first pass refuses non-finite particles itself
        check_finite_tensor(particles, "particles")
    extra = {}
    if row in ("reference", "cpu"):  # the rows of this module clamp to the domain themselves
        extra = dict(domain=domain) if domain is not None else {}
        if row == "cpu" and not return_drift:
            extra["return_drift"] = False
        if fused:
            extra.update(out=out, error_if_nonfinite=error_if_nonfinite)
    new, drift, noise = fn(particles, private, projections, noise_std=float(noise_std), step_size=float(step_size),
                           diffusion=float(diffusion), seed=int(seed), quantiles=quantiles,
                           num_quantiles=num_quantiles, histogram_bins=histogram_bins, return_noise=return_noise,
                           sketch=sketch, shard=shard, **extra)
    if "domain" not in extra:
        new = _clamp(new, domain)
    if not fused:
        if out is not None:
            new = out.copy_(new)
        if error_if_nonfinite and not all_finite(new):
            raise nonfinite_error()
    return new, (drift if return_drift else None), noise


def _compiled_step(particles, private, projections, noise_std, step_size, diffusion, seed, quantiles, num_quantiles,
                   histogram_bins, return_noise, backend, sketch, shard):
    """:func:`flow_step` while Dynamo traces it: the custom op ``torch.ops.fastdpot.flow_step`` (registered by
    :mod:`fastdpot.ops.library`, whose kernel is :func:`flow_step` itself), the seed as a 0-d int64 key tensor."""
    if shard is not None or return_noise:
        raise ValueError("flow_step: shard and return_noise are not supported under torch.compile; call the step "
                         "outside the compiled function")
    if sketch is not None and (not isinstance(sketch, (tuple, list)) or len(sketch) != 2):
        raise ValueError(f"sketch must be a pair (table (k, L), levels (L,)), got {type(sketch).__name__}")
    table, levels = (None, None) if sketch is None else sketch
    key = seed if isinstance(seed, torch.Tensor) else torch.tensor(seed, dtype=torch.int64)
    new, drift = torch.ops.fastdpot.flow_step(particles, private, projections, table, levels, float(noise_std),
                                              float(step_size), float(diffusion), key, quantiles, num_quantiles,
                                              histogram_bins, backend)
    return new, drift, None
