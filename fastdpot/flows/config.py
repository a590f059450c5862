"""The settings of a DP sliced-Wasserstein flow: :class:`FlowConfig`, a frozen dataclass validated once.

Every flow keeps one (``flow.config``); its checkpoints save it (:meth:`FlowConfig.to_dict`) and a load compares it.
It also answers the questions every run loop asks of the settings: whether ``run()`` samples batches, the batch size
on n rows, the accountant's event of one step, and the keywords of op ``flow_step`` that it fixes
(:meth:`FlowConfig.step_kwargs`: a new keyword of the step is added there and in the op, nowhere else).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Optional

from .._validate import (check_choice, check_delta, check_epsilon, check_int, check_nonnegative, check_num_projections,
                         check_positive, check_probability)
from ..reference.flow import QUANTILE_MODES, check_quantile_sizes

__all__ = ["FlowConfig", "LabelledFlowConfig", "VARIANTS", "RELEASES", "DIRECTIONS", "BOUNDS"]

VARIANTS = ("resample", "presampled")
RELEASES = ("points", "sketch")
DIRECTIONS = ("uniform", "orthogonal")
BOUNDS = ("chernoff", "clt", "bernstein")


@dataclass(frozen=True)
class FlowConfig:
    """The settings of one :class:`~fastdpot.flows.DPSlicedWassersteinFlow` (the constructor's keywords, apart from
    the public draws, device and backend). Validated at construction; ``target_epsilon=inf`` is stored as None (the
    non-private flow). Privacy semantics: :mod:`fastdpot.flows.flow`.

    Attributes:
        num_particles: N >= 2.
        dim: d, the dimension of particles and private rows.
        num_projections: k >= 1 directions per step (k·d <= 2^31, :func:`fastdpot._validate.check_num_projections`).
        step_size: h > 0.
        diffusion: λ >= 0, the coefficient of the Brownian term sqrt(2λh)·ξ (the papers' entropic regularisation).
        noise_multiplier: z = σ/Δ. Give this or ``target_epsilon`` (not both).
        target_epsilon: ε budget: z is calibrated so that ``steps`` steps spend it (at the first ``run()``, when
            the data set size n is known), and the run stops before a step would exceed it. None/inf with no noise
            multiplier: non-private flow.
        delta: total δ of the guarantee, ``δ = δ_acc + T·δ_tail``.
        clip_radius: private rows are clipped to this ℓ2 radius inside the step (diameter ``2·clip_radius``).
        normalize: scale every private row onto the sphere of radius ``clip_radius`` (the authors' pipeline)
            instead of clipping.
        batch_size: B private rows per step (uniform without replacement). Give this or ``sample_rate``.
        sample_rate: q; then ``B = round(q·n)`` for a data set of n rows.
        steps: T, the planned number of steps (required for a private flow: the δ split and calibration use it).
        variant: ``"resample"`` (DPSWflow-r) or ``"presampled"`` (DPSWflow).
        pool_size: number of pooled directions for ``"presampled"`` (default 10·k).
        quantiles: ``"exact"``, ``"grid"`` or ``"histogram"`` (:func:`fastdpot.ops.flow_step`).
        num_quantiles: Q >= 2, the size of the ``"grid"`` mode's quantile grid (default N).
        histogram_bins: B >= 1, the ``"histogram"`` mode's bins per direction (required there).
        bound: tail bound of the sliced sensitivity (:func:`fastdpot.privacy.sliced_sensitivity`): ``"chernoff"``
            (default; proven, exact Beta moment generating function), ``"bernstein"`` (proven, looser) or ``"clt"``
            (the papers' normal approximation, k >= 31; its tail can exceed δ_tail, so it is not a guarantee).
            Unused with ``directions="orthogonal"``.
        directions: ``"uniform"`` (i.i.d. on the sphere, the papers') or ``"orthogonal"`` (blocks of d orthonormal
            directions, deterministic sensitivity ``2·clip_radius·sqrt(⌈k/d⌉)``; with ``"presampled"`` the pool is
            made of such blocks and each step takes ``⌈k/d⌉`` whole blocks).
        accountant: accountant kind of :class:`fastdpot.privacy.PrivacyAccountant` (``"rdp"``).
        release: ``"points"`` (default: the B·k noisy projections, the papers' release) or ``"sketch"`` (the
            sliced quantile sketch of the batch, L = ``sketch_bins`` noisy bin means per direction, isotonic fit,
            then a table target for :func:`fastdpot.ops.flow_step`; same Δ, σ and accounting; no smoothing noise on
            the particles). A flow whose backend's row of op ``flow_step`` takes no table target in its
            ``quantiles`` mode (the dispatch table's features; the triton and cuda rows: exact mode only) is
            refused when it is built.
        sketch_bins: L, 1 <= L <= B, the sketch's bins per direction (required with ``release="sketch"``).

    Raises:
        ValueError: a value out of range; both or inconsistent privacy arguments; a private flow without ``steps``
            or without ``batch_size``/``sample_rate``; ``sketch_bins`` / ``histogram_bins`` / ``num_quantiles`` /
            ``pool_size`` missing where required or given where unused.
    """

    num_particles: int
    dim: int
    num_projections: int
    step_size: float
    diffusion: float = 0.0
    noise_multiplier: Optional[float] = None
    target_epsilon: Optional[float] = None
    delta: float = 1e-5
    clip_radius: float = 1.0
    normalize: bool = False
    batch_size: Optional[int] = None
    sample_rate: Optional[float] = None
    steps: Optional[int] = None
    variant: str = "resample"
    pool_size: Optional[int] = None
    quantiles: str = "exact"
    num_quantiles: Optional[int] = None
    histogram_bins: Optional[int] = None
    bound: str = "chernoff"
    directions: str = "uniform"
    accountant: str = "rdp"
    release: str = "points"
    sketch_bins: Optional[int] = None

    def _set(self, **kw):
        for key, v in kw.items():
            object.__setattr__(self, key, v)

    def __post_init__(self):
        from ..privacy.accounting import ACCOUNTANTS

        k = check_num_projections(self.num_projections, check_int(self.dim, "dim", 1))  # k·d <= 2^31
        self._set(num_particles=check_int(self.num_particles, "num_particles", 2), dim=check_int(self.dim, "dim", 1),
                  num_projections=k, step_size=check_positive(self.step_size, "step_size"),
                  diffusion=check_nonnegative(self.diffusion, "diffusion"), delta=check_delta(self.delta),
                  clip_radius=check_positive(self.clip_radius, "clip_radius"))
        if not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be a bool, got {self.normalize!r}")
        check_choice(self.variant, "variant", VARIANTS)
        check_choice(self.quantiles, "quantiles", QUANTILE_MODES)
        check_choice(self.bound, "bound", BOUNDS)
        check_choice(self.directions, "directions", DIRECTIONS)
        check_choice(self.accountant, "accountant", ACCOUNTANTS)
        check_choice(self.release, "release", RELEASES)
        self._check_sizes(k)
        self._check_privacy()

    def _check_sizes(self, k: int):
        if self.release == "sketch":
            if self.sketch_bins is None:
                raise ValueError("sketch_bins (L, the sketch's bins per direction) is required for release='sketch'")
            self._set(sketch_bins=check_int(self.sketch_bins, "sketch_bins", 1))
            if isinstance(self.batch_size, int) and self.sketch_bins > self.batch_size:
                raise ValueError(f"sketch_bins must be <= batch_size = {self.batch_size} (each bin needs a row), "
                                 f"got {self.sketch_bins}")
        elif self.sketch_bins is not None:
            raise ValueError(f"sketch_bins is only used with release='sketch', got sketch_bins={self.sketch_bins!r}")
        nq, hb = check_quantile_sizes(self.quantiles, self.num_quantiles, self.histogram_bins)
        self._set(num_quantiles=nq, histogram_bins=hb)
        if self.variant == "presampled":
            self._set(pool_size=10 * k if self.pool_size is None else check_int(self.pool_size, "pool_size", k))
            check_num_projections(self.pool_size, self.dim, "pool_size")  # the pool is a (pool_size, d) matrix
        elif self.pool_size is not None:
            raise ValueError(f"pool_size is only used with variant='presampled', got pool_size={self.pool_size!r}")

    def _check_privacy(self):
        z, eps = self.noise_multiplier, self.target_epsilon
        if z is not None:
            z = check_positive(z, "noise_multiplier")
        if eps is not None:
            eps = check_epsilon(eps, "target_epsilon", allow_inf=True)
            if math.isinf(eps):
                if z is not None:
                    raise ValueError(f"target_epsilon=inf means a non-private flow; noise_multiplier must then be "
                                     f"None, got {z!r}")
                eps = None
        if z is not None and eps is not None:
            raise ValueError(f"give noise_multiplier or target_epsilon, not both (got {z!r} and {eps!r}): the noise "
                             f"multiplier is calibrated from target_epsilon")
        self._set(noise_multiplier=z, target_epsilon=eps)
        if self.batch_size is not None and self.sample_rate is not None:
            raise ValueError(f"give batch_size or sample_rate, not both (got {self.batch_size!r} and "
                             f"{self.sample_rate!r})")
        if self.batch_size is not None:
            self._set(batch_size=check_int(self.batch_size, "batch_size", 1))
        if self.sample_rate is not None:
            self._set(sample_rate=check_probability(self.sample_rate, "sample_rate"))
        if self.steps is not None:
            self._set(steps=check_int(self.steps, "steps", 1))
        if self.private:
            if self.steps is None:
                raise ValueError("steps (the planned number of steps T) is required for a private flow: the δ "
                                 "split δ = δ_acc + T·δ_tail and the noise calibration depend on it")
            if self.batch_size is None and self.sample_rate is None:
                raise ValueError("a private flow needs batch_size or sample_rate (how run() samples each step)")

    # -- derived ------------------------------------------------------------------------------------------
    @property
    def private(self) -> bool:
        """Whether the flow is private (a noise multiplier or a finite target ε)."""
        return self.noise_multiplier is not None or self.target_epsilon is not None

    @property
    def sampled(self) -> bool:
        """Whether ``run()`` samples a batch per step (``batch_size`` or ``sample_rate`` given); else (non-private
        flows only) every step uses the whole data set."""
        return self.batch_size is not None or self.sample_rate is not None

    def resolve_batch(self, n: int) -> int:
        """The batch size B on a data set of ``n`` rows (``batch_size``, or ``round(sample_rate·n)``).

        Raises:
            ValueError: B outside [1, n], or fewer rows than the sketch's ``sketch_bins``.
        """
        b = self.batch_size if self.batch_size is not None else int(round(self.sample_rate * n))
        if not 1 <= b <= n:
            raise ValueError(f"batch size must be in [1, n={n}], got {b} (batch_size={self.batch_size!r}, "
                             f"sample_rate={self.sample_rate!r})")
        if self.sketch_bins is not None and self.sketch_bins > b:
            raise ValueError(f"sketch_bins must be <= the batch size B = {b} (each bin needs a row), got "
                             f"{self.sketch_bins}")
        return b

    @staticmethod
    def accounting_event(mode: Optional[str], n: Optional[int], b: Optional[int]) -> Optional[Dict[str, Any]]:
        """The accountant event of one step of a flow bound to ``mode``: ``"sampled"`` (``run()``: B of n rows
        uniformly without replacement, q = B/n), ``"full"`` (``step()``: an unsampled release), None (not bound)."""
        if mode is None:
            return None
        if mode == "sampled":
            return dict(sample_rate=b / n, sampling="without_replacement", dataset_size=n, batch_size=b)
        return dict(sample_rate=1.0, sampling="poisson")

    def step_kwargs(self) -> Dict[str, Any]:
        """The keywords of op :func:`fastdpot.ops.flow_step` that the settings fix (the step adds its target,
        directions, noise and seed)."""
        return dict(step_size=self.step_size, diffusion=self.diffusion, quantiles=self.quantiles,
                    num_quantiles=self.num_quantiles, histogram_bins=self.histogram_bins)

    # -- checkpoints --------------------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """The fields as a plain dict (what checkpoints store)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "FlowConfig":
        """The config of :meth:`to_dict`.

        Raises:
            ValueError: not a dict, unknown or missing keys (a checkpoint of another flow kind or version), or a
                value that fails validation.
        """
        if not isinstance(d, dict):
            raise ValueError(f"a flow config must be a dict, got {type(d).__name__}")
        names = {f.name for f in fields(cls)}
        if set(d) != names:
            raise ValueError(f"not a {cls.__name__}: unknown keys {sorted(set(d) - names)}, missing keys "
                             f"{sorted(names - set(d))}")
        return cls(**d)


@dataclass(frozen=True)
class LabelledFlowConfig(FlowConfig):
    """:class:`FlowConfig` of a :class:`~fastdpot.flows.LabelledRowsFlow`: ``dim`` is D = d + C, plus the label
    domain C (``num_classes``, public) and the label block's length c (``label_scale`` > 0, public)."""

    num_classes: int = 1
    label_scale: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        C = check_int(self.num_classes, "num_classes", 1)
        if C >= self.dim:
            raise ValueError(f"num_classes must be < dim = d + C (at least one feature column), got {C} and "
                             f"{self.dim}")
        self._set(num_classes=C, label_scale=check_positive(self.label_scale, "label_scale"))
