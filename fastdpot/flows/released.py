"""Flows that read only a release: particles moved towards the quantiles of a one-shot release, at no privacy cost.

:class:`ReleasedTargetFlow` moves the particles of one class towards that class's released quantile tables
(:class:`fastdpot.privacy.class_sketch.ClassSketchRelease`): every step takes the next block of the release's public
orthonormal directions (cycled in order, coarse to fine as the release lists them), maps each particle's rank on
each direction to the released quantile at that level, and moves it through op :func:`fastdpot.ops.flow_step` (the
sort-based exact transport, a sketch target, no smoothing noise). :class:`ReleasedClassFlows` runs one per class,
with particles per class from the released counts (:func:`fastdpot.flows.allocation.allocate_particles`).

Privacy, stated and enforced: the flows are post-processing of the release. They take no private data (``run``
refuses any), draw no privacy noise, record nothing; :meth:`ReleasedTargetFlow.epsilon` is the release's ε, whatever
the number of steps. Their randomness (the initial particles, the optional Brownian term) is public.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import List, Optional, Sequence, Tuple, Union

import torch

from .._progress import progress_bar
from .._random import make_generator
from .._validate import (COMPUTE_DTYPES, check_bool, check_generator, check_int, check_memory, check_nonnegative,
                         check_positive, check_tensor)
from ..ops import flow_step
from ..ops.flow import release_block_workspace
from ..privacy.class_sketch import ClassSketchRelease, check_shrinkage
from .allocation import allocate_particles

__all__ = ["ReleasedTargetFlow", "ReleasedClassFlows"]


def _check_release(release) -> ClassSketchRelease:
    if not isinstance(release, ClassSketchRelease):
        raise TypeError(f"release must be a fastdpot.privacy.class_sketch.ClassSketchRelease (made by "
                        f"class_quantile_sketch or release_class_sketch), got {type(release).__name__}")
    return release


def _check_domain(domain) -> Optional[Tuple[float, float]]:
    """None, or a pair (lo, hi) of finite real numbers with lo < hi."""
    if domain is None:
        return None
    ok = isinstance(domain, (tuple, list)) and len(domain) == 2 and \
        all(isinstance(v, Real) and not isinstance(v, bool) for v in domain)
    if not ok or not (math.isfinite(float(domain[0])) and math.isfinite(float(domain[1]))
                      and float(domain[0]) < float(domain[1])):
        raise ValueError(f"domain must be None or a pair (lo, hi) of finite numbers with lo < hi, got {domain!r}")
    return float(domain[0]), float(domain[1])


class ReleasedTargetFlow:
    """The particles of one class moved towards a release's quantiles (module docstring).

    Each step: x ← x − α·Σ_j (θ_jᵀx − Q_j(u(x)))·θ_j over one block of p orthonormal directions (op ``flow_step``
    with ``step_size = α·p``), u(x) the particle's rank level r/(N−1) on direction j, Q_j the released quantile
    function (piecewise linear through the release's levels); α = 1 moves every projection of the block onto its
    target. With ``domain=(lo, hi)`` the particles are then projected onto the box [lo, hi]^d of the data's public
    range (post-processing).

    Args:
        release: a :class:`fastdpot.privacy.class_sketch.ClassSketchRelease`. class_index: c, the class followed.
        num_particles: N >= 2.
        step_size: α in (0, 1], the fraction of the way to the block's targets per step.
        init: ``"marginals"`` (default: every coordinate of block ``init_block`` drawn independently from its
            released law: the product of the block's released one-dimensional laws, in the data's coordinates), or an
            (N, d) tensor in the data's coordinates.
        init_block: the block of ``"marginals"``.
        domain: ``(lo, hi)`` public bounds of every coordinate, or None.
        diffusion: λ >= 0, the Brownian term sqrt(2λ·step_size)·ξ of op ``flow_step`` (public noise).
        shrink: the tables' shrinkage by their known noise: True or "pooled" (empirical Bayes over a block's
            frequency bands, the default), "stein" (James–Stein per direction) or False
            (:meth:`ClassSketchRelease.quantile_tables`).
        generator: the public draws (initial particles, Brownian term). backend: op ``flow_step``'s backend.
        dtype: float32 (default) or float64.

    Shape:
        particles (N, d); :meth:`run` returns them in the data's coordinates.

    Raises:
        TypeError: ``release`` not a :class:`~fastdpot.privacy.class_sketch.ClassSketchRelease`; a ``generator`` that
            is not a ``torch.Generator``.
        ValueError: a class index outside [0, C), N < 2, α outside (0, 1], an init of the wrong shape, dtype
            (float16 / bfloat16) or non-finite, a domain that is not a pair of finite numbers lo < hi, a bad block, a
            flag that is not a bool, N particles that would not fit in memory.
    """

    def __init__(self, release, class_index: int, num_particles: int, step_size: float = 1.0, *,
                 init: Union[str, torch.Tensor] = "marginals", init_block: int = 0,
                 domain: Optional[Tuple[float, float]] = None, diffusion: float = 0.0,
                 shrink: Union[bool, str] = True,
                 tables=None, generator: Optional[torch.Generator] = None, backend: str = "auto",
                 dtype: torch.dtype = torch.float32):
        C = _check_release(release).num_classes
        self.class_index = check_int(class_index, "class_index", 0)
        if self.class_index >= C:
            raise ValueError(f"class_index must be in [0, {C}), got {class_index}")
        self.num_particles = check_int(num_particles, "num_particles", 2)
        alpha = check_positive(step_size, "step_size")
        if alpha > 1.0:
            raise ValueError(f"step_size must be in (0, 1] (the fraction of the way to the targets), got {alpha}")
        self.step_size = alpha
        self.diffusion = check_nonnegative(diffusion, "diffusion")
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        check_shrinkage(shrink)
        check_generator(generator, allow_privacy=False)
        domain = _check_domain(domain)
        if not isinstance(init, str):
            check_tensor(init, "init", 2, dtypes=COMPUTE_DTYPES)
        # the particles and the step's spare buffer (double buffering), the projections on a block of p (the fused
        # block step's workspace), with a dense block also their sort and the drift; the marginal start runs in chunks
        itemsize, dim, p = torch.empty((), dtype=dtype).element_size(), release.blocks[0].dim, release.block_size
        fast = all(b.spec() is not None for b in release.blocks)
        per = (2 * dim + p) * itemsize if fast else 3 * dim * itemsize + p * (2 * itemsize + 8)
        check_memory(self.num_particles * per, "num_particles", self.num_particles, "cpu",
                     f"the particles and their {p} projections per step")
        self.domain = domain
        self.release = release
        self.backend = backend
        self._generator = make_generator() if generator is None else generator
        p, B = release.block_size, release.num_blocks
        table, levels = (release.quantile_tables(shrink=shrink) if tables is None else tables)[self.class_index]
        self._center = release.centers[self.class_index].to(dtype)
        self._blocks = [(block, table[b * p:(b + 1) * p].contiguous(), levels)
                        for b, block in enumerate(release.blocks)]
        # the box in the centred coordinates the particles move in
        self._box = None if domain is None else (domain[0] - self._center, domain[1] - self._center)
        init_block = check_int(init_block, "init_block", 0)
        if init_block >= B:
            raise ValueError(f"init_block must be in [0, {B}), got {init_block}")
        d = release.blocks[0].dim
        if isinstance(init, str):
            if init != "marginals":
                raise ValueError(f"init must be 'marginals' or an (N, d) tensor, got {init!r}")
            x = self._marginals(init_block, dtype)
        else:
            if tuple(init.shape) != (self.num_particles, d):
                raise ValueError(f"init must have shape ({self.num_particles}, {d}), got {tuple(init.shape)}")
            x = init.detach().to(dtype) - self._center
        # kept coordinate-major (the transpose of a contiguous (d, N) tensor): the fast blocks' step then reads and
        # writes every tile without transposing it (op flow_step keeps the layout it is given)
        self._particles = self._project(x.t().contiguous().t())
        self._spare: Optional[torch.Tensor] = None  # the step's output buffer (double buffering, :meth:`step`)
        self._step = 0

    def _marginals(self, b: int, dtype: torch.dtype, chunk: int = 4096) -> torch.Tensor:
        """N particles with every coordinate of block b drawn independently from its released law (its quantile
        table at a uniform level), mapped back to the data's coordinates; in chunks of particles (the (N, p) levels
        are never formed at once)."""
        from ..privacy.sketch import quantile_table_eval

        theta, tab, lv = self._blocks[b]
        x = torch.empty(theta.dim, self.num_particles, dtype=dtype).t()  # coordinate-major
        for s in range(0, self.num_particles, chunk):
            m = min(chunk, self.num_particles - s)
            u = torch.rand(m, tab.shape[0], generator=self._generator, dtype=torch.float64)
            x[s:s + m] = theta.transpose(quantile_table_eval(tab.double(), lv.double(), u.t()).t().to(dtype))
        return x

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        if self._box is None:
            return x
        return torch.max(torch.min(x, self._box[1]), self._box[0])

    @property
    def particles(self) -> torch.Tensor:
        """The particles (N, d) in the data's coordinates."""
        return self._particles + self._center

    @property
    def steps_taken(self) -> int:
        """Steps taken so far."""
        return self._step

    def epsilon(self, delta: Optional[float] = None) -> float:
        """The release's ε (the flow adds nothing: it reads only the release). ``delta`` must be the release's δ or
        None.

        Raises:
            ValueError: the release states no (ε, δ) (built without :func:`fastdpot.privacy.class_sketch.
                release_class_sketch`), or another δ is asked for.
        """
        eps, dl = getattr(self.release, "epsilon", None), getattr(self.release, "delta", None)
        if eps is None:
            raise ValueError("this release states no (ε, δ): account it where it was made")
        if delta is not None and delta != dl:
            raise ValueError(f"the release is ({eps:g}, {dl:g})-DP; its ε at another δ is not recorded")
        return float(eps)

    def step(self) -> torch.Tensor:
        """One step on the next block; returns the particles (N, d) in the data's coordinates.

        The step writes into a spare buffer of the particles' shape and layout, kept between steps and swapped with
        the particles (double buffering: no (N, d) tensor is allocated per step; :meth:`run` frees the spare at
        its end); the particles keep their last value when a step fails.

        Raises:
            FloatingPointError: the step produced NaN or ±Inf (the particles keep their last value).
        """
        self._advance()
        return self.particles

    def _advance(self) -> None:
        """:meth:`step` without forming its return value (the particles plus the centre: one (N, d) tensor, which
        :meth:`run`'s steps do not need)."""
        theta, table, levels = self._blocks[self._step % len(self._blocks)]
        seed = int(torch.randint(0, 2 ** 62, (1,), generator=self._generator)) if self.diffusion > 0 else 0
        if self._spare is None:
            self._spare = torch.empty_like(self._particles)  # the particles' (coordinate-major) layout
        try:
            new, _, _ = flow_step(self._particles, None, theta, noise_std=0.0, step_size=self.step_size * theta.size,
                                  diffusion=self.diffusion, seed=seed, quantiles="exact",
                                  sketch=(table.to(self._particles.dtype), levels), backend=self.backend,
                                  domain=self._box, return_drift=False, out=self._spare, error_if_nonfinite=True)
        except FloatingPointError:
            raise FloatingPointError(f"step {self._step} produced non-finite particles; they keep their last "
                                     f"value") from None
        self._spare, self._particles = self._particles, new
        self._step += 1

    def run(self, private_data=None, steps: Optional[int] = None, progress: bool = False) -> torch.Tensor:
        """``steps`` steps (default: one per block); returns the particles (N, d).

        Raises:
            ValueError: any ``private_data``: this flow reads only its release; ``progress`` not a bool.
        """
        if private_data is not None:
            raise ValueError("a flow on a release reads only the release: pass no private data (it would not be "
                             "covered by the release's guarantee)")
        self._run_steps(steps, progress)
        return self.particles

    def _run_steps(self, steps: Optional[int], progress: bool) -> None:
        """:meth:`run`'s steps; the spare buffer and the fused step's workspace are freed at the end."""
        check_bool(progress, "progress")
        steps = len(self._blocks) if steps is None else check_int(steps, "steps", 0)
        bar = progress_bar(total=steps, desc=f"class {self.class_index}", disable=not progress)
        try:
            for _ in range(steps):
                self._advance()
                bar.update(1)
        finally:
            bar.close()
            release_block_workspace()
            self._spare = None  # the double buffer's other half: taken again by the next step


class ReleasedClassFlows:
    """One :class:`ReleasedTargetFlow` per class of a release, particles per class in proportion to the released
    counts (at least ``min_per_class`` each); :meth:`run` returns ``(samples (N, d), labels (N,))``.

    Args:
        release: a :class:`fastdpot.privacy.class_sketch.ClassSketchRelease`. num_particles: N, over all classes, or
            ``particles_per_class``: C public integers instead (with both, they must agree: N = their sum).
        **kwargs: :class:`ReleasedTargetFlow`'s (``step_size``, ``init``, ``domain``, ...; ``generator`` seeds every
            class's flow in turn).

    Raises:
        TypeError / ValueError: as :class:`ReleasedTargetFlow`; neither ``num_particles`` nor
            ``particles_per_class``, or both with N differing from their sum.
    """

    def __init__(self, release, num_particles: Optional[int] = None, *,
                 particles_per_class: Optional[Sequence[int]] = None, min_per_class: int = 2,
                 generator: Optional[torch.Generator] = None, shrink: Union[bool, str] = True, **kwargs):
        C = _check_release(release).num_classes
        check_shrinkage(shrink)
        check_generator(generator, allow_privacy=False)
        if particles_per_class is None:
            if num_particles is None:
                raise ValueError("give num_particles or particles_per_class")
            sizes = allocate_particles(num_particles, release.counts.clamp_min(0.0), C, minimum=min_per_class)
        else:
            sizes = [check_int(v, "particles_per_class", 2) for v in particles_per_class]
            if len(sizes) != C:
                raise ValueError(f"particles_per_class must have {C} entries, got {len(sizes)}")
            if num_particles is not None and check_int(num_particles, "num_particles", 2) != sum(sizes):
                raise ValueError(f"num_particles={num_particles!r} contradicts particles_per_class, whose sum is "
                                 f"{sum(sizes)}: give one of them (or both, agreeing)")
        g = make_generator() if generator is None else generator
        tables = release.quantile_tables(shrink=shrink)
        self.flows: List[ReleasedTargetFlow] = [
            ReleasedTargetFlow(release, c, n, generator=g, tables=tables, **kwargs) for c, n in enumerate(sizes)]
        self.release = release

    def epsilon(self, delta: Optional[float] = None) -> float:
        """The release's ε (:meth:`ReleasedTargetFlow.epsilon`)."""
        return self.flows[0].epsilon(delta)

    def run(self, private_data=None, labels=None, steps: Optional[int] = None, progress: bool = False):
        """Run every class's flow ``steps`` steps; returns ``(samples (N, d), labels (N,))``.

        Raises:
            ValueError: any private data or labels: these flows read only the release; ``progress`` not a bool.
        """
        if private_data is not None or labels is not None:
            raise ValueError("flows on a release read only the release: pass no private data or labels")
        # each class's particles go straight into their rows of the samples (no per-class copy and concatenation:
        # at the end of a run the flows' particles and the samples are the only (N, d) tensors)
        first = self.flows[0]._particles
        samples = torch.empty(sum(f.num_particles for f in self.flows), first.shape[1], dtype=first.dtype)
        start = 0
        for f in self.flows:
            f._run_steps(steps, progress)
            torch.add(f._particles, f._center, out=samples[start:start + f.num_particles])
            start += f.num_particles
        labels = torch.repeat_interleave(torch.arange(len(self.flows)),
                                         torch.tensor([f.num_particles for f in self.flows]))
        return samples, labels
