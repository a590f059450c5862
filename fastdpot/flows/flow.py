"""DP sliced-Wasserstein particle flows: DPSWflow-r (``variant="resample"``) and DPSWflow (``"presampled"``).

Sebag et al., TMLR. Particles follow the Euler--Maruyama discretisation of the smoothed sliced-Wasserstein gradient
flow towards a private data set; the private data enter only through one release per step (their noisy projections
``Y Θᵀ + V``, a Gaussian mechanism, or the sliced quantile sketch of them).

Privacy guarantee (what the code enforces, and what it assumes)
----------------------------------------------------------------
* Every private row is clipped to the ball of radius ``clip_radius`` (or, with ``normalize=True``, scaled onto the
  sphere of that radius) inside the step, so two neighbouring rows differ by at most the diameter ``2·clip_radius``.
  Rows are never used raw.
* Neighbouring data sets differ by the substitution of one row (replace-one). Per step the release is the noisy
  projection of the batch's rows, a Gaussian mechanism with sensitivity ``Δ = 2·clip_radius·sqrt(w(k, δ_tail))``
  (:func:`fastdpot.privacy.sliced_sensitivity`), which holds with probability ``≥ 1 − δ_tail`` over the draw of the k
  directions; the noise std on every projected value is ``σ = z·Δ``.
* :meth:`DPSlicedWassersteinFlow.run` draws each step's batch with :class:`fastdpot.privacy.FixedSizeSampler` (``B``
  rows uniformly without replacement, fresh each step -- never a replayed epoch) and accounts it as a
  sampled-without-replacement Gaussian (RDP, substitution neighbours) with sample rate ``q = B/n``.
  :meth:`~DPSlicedWassersteinFlow.step` on a batch you chose yourself is accounted as an unsampled Gaussian release
  (sample rate 1, no amplification).
* Over the planned ``T = steps`` steps the guarantee is ``(ε, δ)`` with ``δ = δ_acc + T·δ_tail`` (union bound over
  the T draws of Θ; :func:`fastdpot.privacy.split_delta`, default ``δ_acc = δ/2``, ``δ_tail = δ/(2T)``); ε is the
  accountant's ε at ``δ_acc`` after the steps taken. The flow refuses to take more than T private steps (the δ
  split would no longer hold), and with ``target_epsilon`` a :class:`fastdpot.privacy.PrivacyBudget` refuses a
  step that would exceed it before anything is released. This bookkeeping is the flow's
  :class:`fastdpot.privacy.PrivacyLedger` (``flow.ledger``), which counts every step before its release.
* ``directions="orthogonal"``: each step's k directions are ``⌈k/d⌉`` blocks of orthonormal rows (Haar-random
  rotations; every direction still marginally uniform). Then ``Δ = 2·clip_radius·sqrt(⌈k/d⌉)`` holds for every draw
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
  L = ``sketch_bins`` rank bins whose sizes depend only on B and L, add N(0, σ²) to each bin sum). Its ℓ2
  sensitivity under replace-one neighbours is the same Δ as the per-point release (proof in the mechanism's
  docstring), so the same σ = z·Δ, the same sampler and the same accountant event apply, one release per step as
  above. The bin means are post-processed (isotonic fit) into a (k, L) quantile table, which is the step's target;
  the particles' projections get NO smoothing noise in this mode (the target is no longer the σ-smoothed private
  law, so smoothing the particles would only blur them).
* ``noise_multiplier=None`` with ``target_epsilon=None`` (or ``inf``) is the NON-PRIVATE flow: σ = 0 and
  :meth:`~DPSlicedWassersteinFlow.epsilon` returns ``inf``.
* Randomness (``secure_mode``, :mod:`fastdpot.privacy.randomness`): by default every privacy draw of a private
  flow (batches, directions, the per-step 62-bit Philox key of the noise) comes from the operating system and is
  never stored; ``generator`` then drives only the public initial particles. ``secure_mode=False`` replays every
  draw from ``generator`` (tests, debugging): there is no guarantee against anyone who holds its seed or a
  checkpoint. A checkpoint of a replayable flow holds that generator's state and is a private artefact.
* Not covered: the diffusion term's amplification (paper Thm. 3) is not claimed; floating-point noise sampling
  (Mironov 2012) is not hardened.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Union

import torch

from .._random import make_generator
from .._validate import COMPUTE_DTYPES, check_memory, check_tensor
from ..ops import flow_step, step_needs
from .checkpoint import FlowCheckpointing
from .config import FlowConfig
from .init import draw_init
from .release import PrivateSteps, privacy_core
from .run import FlowRunResult, run_flow

__all__ = ["DPSlicedWassersteinFlow", "NonFiniteParticlesError"]


class NonFiniteParticlesError(FloatingPointError):
    """A flow step produced NaN/Inf particles; the flow keeps its last good particles and checkpoint."""


class DPSlicedWassersteinFlow(FlowCheckpointing, PrivateSteps):
    """Differentially private sliced-Wasserstein particle flow (DPSWflow-r / DPSWflow), Sebag et al., TMLR.

    Each step: draw k unit directions Θ (fresh, or k of a fixed pool), release the private batch's noisy projections
    (or their sketch), map each noisy particle projection to the private quantile at its level (sort-based
    ``"exact"`` transport, the authors' ``"grid"``, or the sort-free ``"histogram"``), and move

    .. math::  x_i \\leftarrow x_i - h\\,\\frac1k\\sum_j (s_{ij} - T_{ij})\\,\\theta_j + \\sqrt{2\\lambda h}\\,\\xi_i .

    Args:
        num_particles, dim, num_projections, step_size: N >= 2 particles in R^d, k >= 1 directions per step, h > 0.
        **settings: every other field of :class:`fastdpot.flows.FlowConfig` (documented there): the privacy
            settings (``noise_multiplier`` or ``target_epsilon``, ``delta``, ``clip_radius``, ``normalize``,
            ``batch_size`` or ``sample_rate``, ``steps``, ``bound``, ``directions``, ``accountant``), the release
            (``release``, ``sketch_bins``), the variant (``variant``, ``pool_size``) and the step's own keywords
            (``diffusion``, ``quantiles``, ``num_quantiles``, ``histogram_bins``).
        init: initial particles: a tensor (N, d), or a data-independent kind drawn from ``generator``
            (:func:`fastdpot.flows.draw_init`, float32): ``"gaussian"`` (default, N(0, s²·I_d)), ``"sphere"``
            (uniform on the sphere of radius s) or ``"gaussian_scaled"`` (N(0, (s²/d)·I_d)), s = ``init_scale``.
            The kind is not part of the config: the particles are.
        init_scale: s > 0 for a string ``init`` (default 1); must stay 1 with a tensor ``init``.
        generator: CPU ``torch.Generator`` of the public draws (initial particles); with ``secure_mode=False`` (or
            a non-private flow) also of every privacy draw (directions, batches, noise keys). Default: a freshly
            seeded one.
        secure_mode: True (default): a private flow draws its batches, directions and per-step noise keys from the
            operating system (:class:`fastdpot.privacy.randomness.PrivacyRandomness`; secret, never stored, not
            replayable). False: from ``generator`` (replayable; no guarantee against anyone who holds its seed or a
            checkpoint). Ignored by a non-private flow (everything from ``generator``).
        device: device of the particles (``"cpu"`` or an available ``"cuda[:i]"``).
        backend: ``"auto"``, ``"reference"``, ``"cpu"``, ``"triton"`` or ``"cuda"`` for op ``flow_step``.

    A flow sharded over the ranks of a ``torch.distributed`` process group is
    :class:`fastdpot.flows.DistributedSlicedWassersteinFlow` (or :func:`fastdpot.flows.make_flow` with
    ``process_group=``).

    Shape:
        particles (N, d); private data (n, d); private batch (B, d).

    Raises:
        ValueError: every check of :class:`fastdpot.flows.FlowConfig` (step_size <= 0, diffusion < 0, k < 1, N < 2,
            both or inconsistent privacy arguments, a private flow without ``steps`` or without
            ``batch_size``/``sample_rate``, ``sketch_bins`` / ``histogram_bins`` / ``num_quantiles`` / ``pool_size``
            missing where required or given where unused), non-finite ``init`` or of the wrong shape or dtype
            (float32 and float64 only: :data:`fastdpot._validate.COMPUTE_DTYPES`), a ``num_particles`` whose particles
            and per-step projections do not fit in the memory available on ``device`` (before anything is
            allocated), an ``init``
            string not in :data:`fastdpot.flows.INIT_KINDS`, ``init_scale`` <= 0 (or != 1 with a tensor ``init``),
            a device that is not available; :class:`fastdpot._dispatch.MissingFeatureError` (a ValueError): a
            ``backend`` whose row of op ``flow_step`` lacks a feature the settings need (e.g. ``"sketch"`` with
            non-exact quantiles on the triton/cuda rows).

    References:
        Sebag et al., TMLR, DPSWflow-r / DPSWflow; Rakotomamonjy & Ralaivola, ICML 2021, Lemma 2 (sensitivity);
        dp-accounting (RDP of the sampled-without-replacement Gaussian); scipy.optimize.isotonic_regression
        (the sketch's post-processing).
    """

    _config_class = FlowConfig

    def __init__(self, num_particles: int, dim: int, num_projections: int, step_size: float, *,
                 init: Union[None, str, torch.Tensor] = None, init_scale: float = 1.0,
                 generator: Optional[torch.Generator] = None, device: Union[str, torch.device] = "cpu",
                 backend: str = "auto", secure_mode: bool = True, **settings):
        config = self._make_config(num_particles=num_particles, dim=dim, num_projections=num_projections,
                                   step_size=step_size, **settings)
        self._setup(config, init=init, init_scale=init_scale, generator=generator, device=device, backend=backend,
                    secure_mode=secure_mode)

    @classmethod
    def from_config(cls, config: FlowConfig, *, init=None, init_scale: float = 1.0,
                    generator: Optional[torch.Generator] = None, device="cpu", backend: str = "auto",
                    secure_mode: bool = True, **kwargs):
        """A flow with the settings ``config`` (a :class:`fastdpot.flows.FlowConfig` of this flow's kind); the other
        arguments as the constructor (a sharded flow also takes its own, e.g. ``process_group``).

        Raises:
            ValueError: ``config`` not of this flow's config class; the constructor's errors.
        """
        if type(config) is not cls._config_class:
            raise ValueError(f"config must be a {cls._config_class.__name__}, got {type(config).__name__}")
        obj = cls.__new__(cls)
        obj._pre_setup(**kwargs)
        obj._setup(config, init=init, init_scale=init_scale, generator=generator, device=device, backend=backend,
                   secure_mode=secure_mode)
        return obj

    def _make_config(self, **fields) -> FlowConfig:
        """The flow's config from the constructor's settings (a subclass adds its own fields).

        Raises:
            TypeError: a setting that is not a field of the config (the message names it).
        """
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(self._config_class)})
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword argument(s) {unknown}; the settings are "
                            f"the fields of {self._config_class.__name__}")
        return self._config_class(**fields)

    def _pre_setup(self):
        """Hook run before :meth:`_setup` by :meth:`from_config` (a sharded flow binds its process group here)."""

    def _step_needs(self, config: FlowConfig):
        """The features of op ``flow_step`` that this flow's steps need (:func:`fastdpot.ops.step_needs`): a table
        target with ``release="sketch"``."""
        return step_needs(table=config.release == "sketch", **config.step_kwargs())

    def _setup(self, config: FlowConfig, *, init, init_scale, generator, device, backend, secure_mode):
        from .._dispatch import BACKENDS, require
        from .._validate import check_choice, check_device_available, check_positive
        from ..privacy.randomness import PrivacyRandomness
        from .init import check_init_kind

        c = config
        check_choice(backend, "backend", ("auto",) + BACKENDS)
        require("flow_step", backend, self._step_needs(c))  # what the backend's dispatch row supports
        if isinstance(init, str):
            check_init_kind(init)
        init_scale = check_positive(init_scale, "init_scale")
        if isinstance(init, torch.Tensor) and init_scale != 1.0:
            raise ValueError(f"init_scale only applies to a string init; scale the init tensor yourself (got "
                             f"init_scale={init_scale!r})")
        if generator is None:
            generator = make_generator()
        if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
            raise ValueError(f"generator must be a CPU torch.Generator, got {generator!r}")
        if not isinstance(secure_mode, bool):
            raise ValueError(f"secure_mode must be a bool, got {secure_mode!r}")
        self.config = c
        self.private = c.private
        self.device = check_device_available(device, "device")
        self.backend = backend
        self._generator = generator
        self.secure_mode = secure_mode and self.private
        # every privacy draw goes through self._rng (OS randomness in secure mode, `generator` otherwise)
        self._rng = PrivacyRandomness(True) if self.secure_mode else PrivacyRandomness(False, generator)
        itemsize = init.element_size() if isinstance(init, torch.Tensor) else 4  # a drawn init is float32
        # particles (N, d) and the step's new particles and drift, projections (N, k), their sort and its indices
        check_memory(self._state_rows() * (3 * c.dim * itemsize + c.num_projections * (3 * itemsize + 8)),
                     "num_particles", c.num_particles, self.device, f"the particles and their {c.num_projections} "
                     f"projections per step")
        self._init_record = self._record_init(init, generator, init_scale)  # before the draw (checkpoints)
        self._particles = self._initial_particles(init, generator, init_scale).to(self.device)
        self._pool = None
        d, k = c.dim, c.num_projections
        if c.variant == "presampled":
            # orthogonal pools hold whole blocks of d rows, at least ⌈k/d⌉ of them
            self._pool = self._draw_directions(c.pool_size if c.directions == "uniform"
                                               else d * max(-(-c.pool_size // d), -(-k // d)))
        self._step = 0
        self._releases_lost = 0  # counted releases whose particles a crash lost (fastdpot.flows.checkpoint)
        self._in_flight = 0  # releases a run may make before its next checkpoint (set by the run loop)
        self._last_drift_norm = float("nan")
        self.last_run: Optional[FlowRunResult] = None  # what the last run() call did
        # the sampling the flow is bound to: "sampled" (run(): B of n rows) or "full" (step()), at the first step
        self._mode: Optional[str] = None
        self._bound_n: Optional[int] = None
        self._bound_batch: Optional[int] = None
        self._ledger = self._make_ledger() if self.private else None  # every release is counted there
        self._sensitivity = self._compute_sensitivity() if self.private else None

    # -- what a subclass changes: the rows' diameter, the particles' start (the clipping: PrivateSteps._clip) --
    @property
    def row_diameter(self) -> float:
        """The largest distance between two clipped private rows: ``2·clip_radius`` (the sensitivity's D)."""
        return 2.0 * self.config.clip_radius

    def _initial_particles(self, init, generator, init_scale) -> torch.Tensor:
        """The (N, d) start (a sharded flow draws its shard by global index instead)."""
        n, d = self.config.num_particles, self.config.dim
        if init is None or isinstance(init, str):
            return draw_init("gaussian" if init is None else init, n, d, generator, init_scale)
        check_tensor(init, "init", 2, dtypes=COMPUTE_DTYPES)
        if tuple(init.shape) != (n, d):
            raise ValueError(f"init must have shape ({n}, {d}), got {tuple(init.shape)}")
        return init.detach().clone()

    # -- properties ---------------------------------------------------------------------------------------
    @property
    def particles(self) -> torch.Tensor:
        """Current particles (N, d) (a sharded flow: this rank's shard)."""
        return self._particles

    @property
    def steps_taken(self) -> int:
        """Flow steps taken so far (a private step is counted before its release; one refused by the budget is
        not counted)."""
        return self._step

    @property
    def ledger(self):
        """The :class:`fastdpot.privacy.PrivacyLedger` that counts this flow's releases (None if non-private)."""
        return self._ledger

    @property
    def noise_multiplier(self) -> Optional[float]:
        """z = σ/Δ (0.0 for the non-private flow; None while a target ε is not calibrated yet)."""
        return 0.0 if not self.private else self._ledger.noise_multiplier

    @property
    def sensitivity(self) -> Optional[float]:
        """Δ, the ℓ2 sensitivity of one step's release on projected values (None for the non-private flow).

        Rows of diameter D (:meth:`row_diameter`) give Δ = D·sqrt(⌈k/d⌉) with orthogonal directions and
        D·sqrt(w(k, δ_tail)) with uniform ones (:func:`fastdpot.privacy.orthogonal_sliced_sensitivity`,
        :func:`fastdpot.privacy.sliced_sensitivity`)."""
        return self._sensitivity

    @property
    def noise_std(self) -> Optional[float]:
        """σ = z·Δ, a standard deviation on projected values (0.0 non-private; None before calibration)."""
        if not self.private:
            return 0.0
        z = self._ledger.noise_multiplier
        return None if z is None else z * self._sensitivity

    @property
    def delta_split(self):
        """(δ_acc, δ_tail): total δ = δ_acc + T·δ_tail ((None, None) for the non-private flow)."""
        return self._ledger.delta_split if self.private else (None, None)

    @property
    def last_drift_norm(self) -> float:
        """Mean ℓ2 norm of the drift of the last step."""
        return self._last_drift_norm

    @property
    def stop_reason(self) -> Optional[str]:
        """Why the last :meth:`run` stopped (see :class:`fastdpot.flows.FlowRunResult`); None before any run."""
        return None if self.last_run is None else self.last_run.stop_reason

    def can_step(self) -> bool:
        """Whether one more private step fits in the planned T steps and the ε budget."""
        if not self.private or self._mode is None:
            return True
        return self._ledger.can_spend()

    def epsilon(self, delta: Optional[float] = None) -> float:
        """ε spent so far at total δ (default: the configured ``delta``).

        The accountant is asked at ``delta − T·δ_tail`` (the sensitivity tail events of the planned T steps are
        charged in full). Returns ``inf`` for the non-private flow and 0.0 before the first step.

        Raises:
            ValueError: ``delta <= T·δ_tail``.
        """
        if not self.private:
            return math.inf
        return self._ledger.epsilon(delta)

    def get_epsilon(self, delta: float) -> float:
        """ε spent so far at total δ = ``delta`` (Opacus' accountant interface; :meth:`epsilon`)."""
        return self.epsilon(delta)

    # -- stepping (the release: fastdpot.flows.release) ---------------------------------------------------
    def _check_batch(self, x, name):
        check_tensor(x, name, 2, dtypes=COMPUTE_DTYPES)
        if x.shape[1] != self.config.dim:
            raise ValueError(f"{name} must have d={self.config.dim} columns, got shape {tuple(x.shape)}")

    def _exchange(self, release):
        """Hook: a sharded flow broadcasts the release from its data rank (one process: nothing to do)."""
        return release

    def _op_shard(self):
        """Hook: the :class:`fastdpot.ops.Shard` of a sharded flow (None: one process)."""
        return None

    def _take_step(self, batch: Optional[torch.Tensor]) -> torch.Tensor:
        """Release (where the data is), exchange, move: one step (the release is counted by the caller)."""
        release = self._exchange(self._release(batch) if batch is not None else None)
        new, drift, _ = flow_step(self._particles, release.pop("private", None), backend=self.backend,
                                  shard=self._op_shard(), **release, **self.config.step_kwargs())
        self._step += 1
        self._accept(new, drift)
        return self._particles

    def _accept(self, new: torch.Tensor, drift: torch.Tensor):
        if not bool(torch.isfinite(new).all()):
            raise NonFiniteParticlesError(
                f"flow step {self._step} produced non-finite particles (step_size={self.config.step_size!r}, "
                f"diffusion={self.config.diffusion!r}); the particles keep their last finite value and no "
                f"checkpoint was written")
        self._particles = new
        self._last_drift_norm = float(drift.norm(dim=1).mean())

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
        self._check_step_batch(private_batch)
        self._bind("full", None)
        if self.private:
            self._ledger.spend()  # counted before anything is computed: every release is accounted
        return self._take_step(private_batch)

    def _check_step_batch(self, private_batch):
        self._check_batch(private_batch, "private_batch")
        nb = self.config.sketch_bins
        if nb is not None and nb > private_batch.shape[0]:
            raise ValueError(f"sketch_bins must be <= the batch size, got sketch_bins={nb} and a private_batch of "
                             f"{private_batch.shape[0]} rows")

    # -- the run loop's hooks (fastdpot.flows.run) ----------------------------------------------------------
    def _shows_progress(self) -> bool:
        return True

    def _prepare_run(self, private_data, steps, checkpoint_path):
        """Validate everything a run needs and bind the sampling; returns ``(steps, sampler)``."""
        from .._checkpoint import check_checkpoint_path
        from .._validate import check_int

        self._check_batch(private_data, "private_data")
        c = self.config
        if steps is None:
            if c.steps is None:
                raise ValueError("steps is required: this flow has no planned number of steps")
            steps = c.steps - self._step  # the steps left to the plan (releases lost to a crash stop it earlier)
        else:
            steps = check_int(steps, "steps", 0)
        if checkpoint_path is not None:  # before any step is spent
            check_checkpoint_path(checkpoint_path)
        if not c.sampled:  # non-private flow without a batch size: the whole data set every step
            self._bind("full", None)
            return steps, None
        n = private_data.shape[0]
        self._bind("sampled", n)
        return steps, privacy_core().FixedSizeSampler(n, self._bound_batch, generator=self._rng)

    def _stop_reason(self) -> Optional[str]:
        if self.private and not self.can_step():
            return "budget" if self._ledger.steps_spent < self.config.steps else "planned_steps"
        return None

    def _run_step(self, private_data, sampler):
        if self.private:
            self._ledger.spend()  # counted before the batch is drawn
        batch = private_data if sampler is None else private_data[sampler.sample().to(private_data.device)]
        self._take_step(batch)

    def _finish_run(self):
        if self.private:
            self._ledger.flush()

    def _save_after_callback_error(self, path):
        self.save(path)

    def run(self, private_data: torch.Tensor, steps: Optional[int] = None, progress: bool = True,
            checkpoint_path: Optional[str] = None, checkpoint_every: Optional[int] = None,
            callback: Optional[Callable[["DPSlicedWassersteinFlow"], None]] = None,
            progress_epsilon: bool = True) -> torch.Tensor:
        """Run the flow on ``private_data``: each step samples a fresh batch of B rows uniformly without
        replacement (:class:`fastdpot.privacy.FixedSizeSampler`), clips it and takes one step.

        Args:
            private_data: the private data set (n, d).
            steps: number of steps to run in this call (default: until the planned T steps are done).
            progress: a bool: show the progress (step, ε spent, mean drift norm; a tqdm bar on a terminal, a line
                every 10 s otherwise; the calibration of a target ε shows its own line when it takes over a second).
            checkpoint_path: where :meth:`save` writes (atomically) every ``checkpoint_every`` steps and at the end;
                its folder must exist.
            checkpoint_every: checkpoint period in steps (default: only at the end); needs ``checkpoint_path`` (or a
                ``callback`` that checkpoints at that period: a crash then counts that many releases in flight).
            callback: called with the flow after every step. If it raises (``KeyboardInterrupt`` included), the step
                it saw is checkpointed first (with ``checkpoint_path``), then its exception propagates: resuming
                from that checkpoint takes the steps left.
            progress_epsilon: a bool: show the ε spent in the bar.

        Returns the particles (N, d). Stops early, without error, when the next step would exceed the ε budget or
        the planned T private releases (a run resumed after a crash, whose releases in flight were counted as spent,
        reaches them with fewer steps): it then logs a warning (logger ``fastdpot.flow``) saying which, and
        :attr:`last_run` (a :class:`fastdpot.flows.FlowRunResult`) / :attr:`stop_reason` hold the reason, the steps
        run and the ε spent. Every argument is checked before the first release.

        Raises:
            ValueError: bad data (not a finite float32/float64 (n, d) tensor), ``steps`` missing for a non-private
                flow without planned steps, n changed, ``checkpoint_path`` a directory, in a folder that does not
                exist or is not writable, ``checkpoint_every`` < 1 or without ``checkpoint_path``, ``progress`` or
                ``progress_epsilon`` not a bool; an unreachable ``target_epsilon`` for this n (the calibration's
                message names the reachable range).
            TypeError: ``checkpoint_path`` not a str or os.PathLike, ``callback`` not callable.
            NonFiniteParticlesError: see :meth:`step` (the last checkpoint written stays intact).
        """
        from .._validate import check_bool

        self._calibration_progress = check_bool(progress, "progress")  # the first run's calibration (_bind)
        try:
            return run_flow(self, private_data, steps, progress, checkpoint_path, checkpoint_every, callback,
                            progress_epsilon)
        finally:
            self._calibration_progress = False
