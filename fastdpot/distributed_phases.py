"""The per-step math of a sharded flow step (:mod:`fastdpot.distributed`): keyed per-particle normals and the
phases of a sharded histogram step, with the all-reduces between them.

A histogram step over W ranks is three phases around two all-reduces (Sebag et al., "Differentially private gradient
flow based on the sliced Wasserstein distance", TMLR, with the particle CDF of a histogram in place of a sort):

1. each rank projects its shard (noisy projections ``s = xΘᵀ + σξ``) and takes each direction's min / max;
   all-reduce (MAX) of the 2k extremes;
2. each rank counts its projections in the B equal bins of the GLOBAL ``[lo_j, hi_j]``; all-reduce (SUM) of the
   (k, B) counts;
3. each rank maps its projections through the global histogram CDF to levels u, takes the target quantile at u, the
   drift ``(s − T)Θ/k`` and the Euler--Maruyama update of its shard.

Communication is O(k·B) per step, independent of N. Two implementations of the phases:

* :class:`TorchHistogramPhases` (any device): the projections materialised, draws from :func:`keyed_normals`
  (smoothing noise element (i, j) = Philox normal i·k + j of stream 0, Brownian element (i, c) = normal i·d + c of
  stream 1);
* :class:`CppHistogramPhases` (CPU, float32/64, the ``cpu`` backend): the fused passes of ``csrc/flow_histogram.cpp``
  (:mod:`fastdpot.flow_histogram`), nothing of size n·k stored, with that kernel's draws (smoothing noise of direction
  j = stream 2j, element g; Brownian = stream 2k, element g·d + c), i.e. the single-process C++ histogram step's.

Both key every per-particle draw by the GLOBAL particle index, so a run gives the same particles for any world size
(within float tolerance); they draw different (equally distributed) normals, so a run is reproducible within one
implementation. These draws protect nothing (the privacy noise is the data rank's release).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ._ext import load_cpp
from .reference.flow_histogram import _target_at

__all__ = ["TorchHistogramPhases", "CppHistogramPhases", "histogram_phases", "reduce_extremes", "histogram_reduce",
           "histogram_transport", "transport_move", "keyed_normals"]

_STREAM_SMOOTH, _STREAM_BROWNIAN, _STREAM_INIT = 0, 1, 2


def keyed_normals(seed: int, stream: int, start: int, rows: int, cols: int,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normals of rows ``start .. start+rows-1`` of an infinite (·, cols) matrix keyed by (seed, stream):
    entry (i, j) is the Philox normal number ``i·cols + j`` of that stream (``csrc/flow_normal.h``), whatever shard
    asks for it. These draws protect nothing (particle smoothing noise, Brownian term, initial particles).

    Shape:
        returns (rows, cols) in ``dtype``.

    Raises:
        BackendUnavailableError: the C++ extension ``fastdpot._C_flow`` is not built.
    """
    if rows * cols == 0:
        return torch.empty(rows, cols, dtype=dtype)
    mod, a = load_cpp("flow"), (int(seed), int(stream), int(start) * int(cols), int(rows) * int(cols), True)
    try:
        fast, _ = mod._normals(*a, False)  # without the double-precision reference copy
    except TypeError:  # an extension built before `reference=` existed
        fast, _ = mod._normals(*a)
    return torch.from_numpy(fast).reshape(rows, cols).to(dtype)


class TorchHistogramPhases:
    """The three phases of a sharded histogram step, in torch (the fused C++ phases can replace them one by one).

    Phase 1, ``project``: s = xΘᵀ + noise and its per-direction (lo, hi); phase 2, ``counts``: the (k, bins)
    histogram of s on the GLOBAL [lo, hi]; phase 3, ``update``: each entry's level u through the GLOBAL counts
    (``levels``: the piecewise-linear CDF of :func:`fastdpot.reference.flow_histogram.histogram_levels`), the
    target quantile at u, the drift (s − T)Θ/k and the Euler--Maruyama update. The all-reduces sit between the
    phases (:func:`histogram_reduce`). Shapes: x (n, d), theta (k, d), s (n, k), lo/hi (k,), counts (k, bins)
    int64; ``target`` is ``("points", sorted (B, k))`` or ``("sketch", table (k, L), levels (L,))``.
    """

    def project(self, x, theta, noise):
        s = x @ theta.t()
        if noise is not None:
            s = s + noise
        return s, s.amin(0), s.amax(0)

    @staticmethod
    def _bins(s, lo, hi, num_bins):
        width = (hi - lo) / num_bins
        width = torch.where(width > 0, width, torch.ones_like(width))
        t = ((s - lo) / width).clamp(0, num_bins)
        return t, t.to(torch.int64).clamp(max=num_bins - 1)

    def counts(self, s, lo, hi, num_bins):
        _, b = self._bins(s, lo, hi, num_bins)
        c = torch.zeros(s.shape[1], num_bins, dtype=torch.int64)
        c.scatter_add_(1, b.t().cpu(), torch.ones_like(b.t().cpu()))
        return c

    def levels(self, s, lo, hi, counts, num_particles):
        t, b = self._bins(s, lo, hi, counts.shape[1])
        counts = counts.to(s.device)
        below = torch.cumsum(counts, dim=1) - counts
        cnt = counts.gather(1, b.t()).t().to(s.dtype)
        blw = below.gather(1, b.t()).t().to(s.dtype)
        return (blw + (t - b.to(t.dtype)) * cnt) / num_particles

    def update(self, x, s, theta, lo, hi, counts, num_particles, target, step_size, brownian_scale, brownian):
        return transport_move(x, s, theta, self.levels(s, lo, hi, counts, num_particles), target, step_size,
                              brownian_scale, brownian)

    def histogram_step(self, x, theta, target, sigma, seed, start, num_bins, num_particles, step_size, reg,
                       all_reduce):
        """One sharded histogram step of the shard x (rows ``start ..`` of the N particles): the three phases with
        ``all_reduce`` between them. Returns ``(new (n, d), drift (n, d))``."""
        n, d = x.shape
        noise = None
        if sigma > 0:
            noise = keyed_normals(seed, _STREAM_SMOOTH, start, n, theta.shape[0], x.dtype).to(x.device) * sigma
        s, lo, hi = self.project(x, theta, noise)
        br = keyed_normals(seed, _STREAM_BROWNIAN, start, n, d, x.dtype).to(x.device) if reg > 0 else None
        lo, hi, cnt = histogram_reduce(s, lo, hi, num_bins, all_reduce, self)
        return self.update(x, s, theta, lo, hi, cnt, num_particles, target, step_size, (2.0 * reg * step_size) ** 0.5,
                           br)


class CppHistogramPhases:
    """The three phases as the fused C++ passes (:func:`fastdpot.flow_histogram.histogram_minmax`,
    :func:`~fastdpot.flow_histogram.histogram_counts`, :func:`~fastdpot.flow_histogram.histogram_update`), each
    recomputing the shard's noisy projections in cache instead of storing the (n, k) matrix; the same definition of
    the bins, levels and targets as :class:`TorchHistogramPhases` (tested against it with replayed draws)."""

    @staticmethod
    def applies(backend: str, device, particles: torch.Tensor) -> bool:
        """Whether the flow's ``backend`` ("auto" or "cpu") and its CPU float32/64 particles use these passes (and
        the compiled module is there)."""
        from .flow_histogram import available

        return (backend in ("auto", "cpu") and torch.device(device).type == "cpu"
                and particles.dtype in (torch.float32, torch.float64) and available()[0])

    def histogram_step(self, x, theta, target, sigma, seed, start, num_bins, num_particles, step_size, reg,
                       all_reduce):
        """As :meth:`TorchHistogramPhases.histogram_step`, with the C++ kernel's draws."""
        from . import flow_histogram as fh

        kw = dict(noise_std=float(sigma), seed=int(seed), index_offset=int(start))
        x, theta = x.contiguous(), theta.contiguous()
        lo, hi = reduce_extremes(*fh.histogram_minmax(x, theta, **kw), all_reduce)
        counts = fh.histogram_counts(x, theta, lo, hi, num_bins, **kw)
        all_reduce(counts, dist.ReduceOp.SUM)
        if target[0] == "points":
            tg = dict(target=target[1].t().contiguous())  # (B, k) sorted columns -> (k, B) sorted rows
        else:
            tg = dict(sketch=(target[1], target[2]))
        return fh.histogram_update(x, theta, lo, hi, counts, step_size=step_size, reg=reg, **tg, **kw)


def histogram_phases(backend: str, device, particles: torch.Tensor):
    """The phases of a sharded histogram step, chosen as the single-process step chooses its kernel: the fused C++
    passes where :meth:`CppHistogramPhases.applies`, else the torch phases.

    Raises:
        BackendUnavailableError: ``backend="cpu"`` asked for explicitly on CPU while the compiled histogram module
            is missing (the message names the build command), as :func:`fastdpot.flow.flow_step` does; ``"auto"``
            falls back to the torch phases.
    """
    if CppHistogramPhases.applies(backend, device, particles):
        return CppHistogramPhases()
    if backend == "cpu" and torch.device(device).type == "cpu":
        from .flow_histogram import require_available

        require_available()
    return TorchHistogramPhases()


def transport_move(x, s, theta, u, target, step_size, brownian_scale=0.0, brownian=None):
    """Target quantiles at levels u (n, k), drift ``(s − T)Θ/k`` and ``x − h·drift + brownian_scale·ξ``.
    Returns ``(new (n, d), drift (n, d))``."""
    if target[0] == "points":
        tq = _target_at(target[1].to(x.device, x.dtype), u.to(x.dtype))
    else:
        from .reference.flow_sketch import table_quantiles

        tq = table_quantiles(target[1].to(x.device), target[2].to(x.device), u.double()).to(x.dtype)
    drift = (s - tq) @ theta / theta.shape[0]
    new = x - step_size * drift
    if brownian is not None:
        new = new + brownian_scale * brownian
    return new, drift


def reduce_extremes(lo, hi, all_reduce):
    """The GLOBAL per-direction ``(lo, hi)`` (k,) from a rank's local ones: one all-reduce (MAX) of the 2k values
    (hi, −lo) in float64 (exact for float32/64 extremes), returned in ``lo``'s dtype."""
    k = lo.shape[0]
    ext = torch.cat([hi, -lo]).double()
    all_reduce(ext, dist.ReduceOp.MAX)
    return (-ext[k:]).to(lo.dtype), ext[:k].to(lo.dtype)


def histogram_reduce(s, lo, hi, num_bins, all_reduce, phases=None):
    """The GLOBAL ``(lo, hi, counts)`` of the sharded projections from the local ``s`` (n_local, k) and its
    local extremes: one all-reduce (MAX) of the 2k values (hi, −lo), then one (SUM) of the (k, bins) counts.
    ``all_reduce(tensor, op)`` reduces in place (world size 1: identity)."""
    ph = phases or TorchHistogramPhases()
    lo, hi = reduce_extremes(lo, hi, all_reduce)
    c = ph.counts(s, lo, hi, num_bins)
    all_reduce(c, dist.ReduceOp.SUM)
    return lo, hi, c


def histogram_transport(s, lo, hi, num_bins, num_particles, all_reduce, phases=None):
    """Levels u (n_local, k) of the local projections ``s`` (with local extremes ``lo``, ``hi`` (k,)) through the
    GLOBAL histogram CDF (:func:`histogram_reduce`, then ``levels``). Equal to
    :func:`fastdpot.reference.flow_histogram.histogram_levels` of the concatenated shards."""
    ph = phases or TorchHistogramPhases()
    lo, hi, c = histogram_reduce(s, lo, hi, num_bins, all_reduce, ph)
    return ph.levels(s, lo, hi, c, num_particles)


