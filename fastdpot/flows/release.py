"""The privacy half of a DP sliced-Wasserstein flow: what one step releases and how the flow's releases are counted.

:class:`PrivateSteps` is a base of :class:`fastdpot.flows.DPSlicedWassersteinFlow` (the particle loop, the public
properties and :meth:`~fastdpot.flows.DPSlicedWassersteinFlow.epsilon` stay there). It holds the privacy set-up --
the sensitivity Δ of one release, the clipping of the private rows, the :class:`fastdpot.privacy.PrivacyLedger` and
its binding to the flow's sampling at the first step (calibrating z for a target ε) -- and the step's release: the
directions drawn from the flow's privacy randomness, the step's secret key, and the op's target (the clipped batch
with σ = z·Δ, or the post-processed sketch table). The guarantee these pieces make up is stated in
:mod:`fastdpot.flows.flow`. A subclass changes the release by overriding these hooks (``_clip``,
``_release_points``, ``_sketch_clip_radius``, ...).

The flow object provides ``config`` (a :class:`fastdpot.flows.FlowConfig`), ``private``, ``device``, ``_rng``,
``_particles``, ``_pool``, ``_ledger``, ``_mode``, ``_bound_n``, ``_bound_batch``, ``row_diameter``, ``noise_std``
and ``delta_split``, all set by its ``_setup``.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from .._random import random_projections

__all__ = ["PrivateSteps", "privacy_core"]


def privacy_core():
    """The privacy core :mod:`fastdpot.privacy`, imported on first use (only private flows need it)."""
    from .. import privacy

    return privacy


class PrivateSteps:
    """The privacy set-up, the ledger binding and the one release per step of a DP sliced-Wasserstein flow (module
    docstring); a base class of :class:`fastdpot.flows.DPSlicedWassersteinFlow`, not used on its own."""

    def _compute_sensitivity(self) -> float:
        """Δ of one release for rows of diameter ``row_diameter`` (the flow's ``sensitivity``)."""
        c, p = self.config, privacy_core()
        if c.directions == "orthogonal":  # deterministic sensitivity: all of δ goes to the accountant
            return p.orthogonal_sliced_sensitivity(c.num_projections, c.dim, diameter=self.row_diameter)
        return p.sliced_sensitivity(c.num_projections, c.dim, self.delta_split[1], bound=c.bound,
                                    diameter=self.row_diameter)

    def _make_ledger(self):
        """The flow's :class:`fastdpot.privacy.PrivacyLedger`, unbound: T = ``steps``, δ split by
        :func:`fastdpot.privacy.split_delta` (uniform directions) or all of δ to the accountant (orthogonal)."""
        c = self.config
        tail = 0.0 if c.directions == "orthogonal" else None
        return privacy_core().PrivacyLedger(c.delta, c.steps, delta_tail=tail, target_epsilon=c.target_epsilon,
                                            noise_multiplier=c.noise_multiplier, accountant=c.accountant,
                                            name="the flow")

    def _clip(self, batch: torch.Tensor) -> torch.Tensor:
        """The batch clipped to the ball of radius ``clip_radius`` (or scaled onto its sphere: ``normalize``)."""
        p, c = privacy_core(), self.config
        if c.normalize:
            return p.normalize_rows(batch) * c.clip_radius
        return p.clip_rows(batch, c.clip_radius)

    def _sketch_clip_radius(self) -> float:
        """The radius the sketch mechanism clips the (already clipped) batch to (a no-op on it)."""
        return self.config.clip_radius

    def _bind(self, mode: str, n: Optional[int]):
        """Fix the sampling at the first step (and, for a private flow, bind the ledger: calibrate z for a
        target ε)."""
        if self._mode is None:
            # nothing is committed until the ledger has bound: a bad batch or a failed calibration leaves the flow
            # unbound, so the caller can fix it and retry
            bound = (n, self.config.resolve_batch(n)) if mode == "sampled" else (self._bound_n, self._bound_batch)
            if self.private:
                with _calibration_notice(self, bound):
                    show = getattr(self, "_calibration_progress", False) and self._shows_progress()
                    self._ledger.bind(**self.config.accounting_event(mode, *bound), progress=show,
                                      progress_delay=0.0)  # the run's first line: what it waits for
            self._mode = mode
            self._bound_n, self._bound_batch = bound
        elif mode != self._mode:
            raise ValueError(f"this flow's privacy accounting was bound to {self._mode!r} steps "
                             f"({'run()' if self._mode == 'sampled' else 'step()'}); mixing run() and step() is "
                             f"not supported")
        elif mode == "sampled" and n != self._bound_n:
            raise ValueError(f"private_data has n={n} rows but this flow's accounting was bound to "
                             f"n={self._bound_n}")

    def _draw_directions(self, k: int) -> torch.Tensor:
        """k unit directions (k, d) from the flow's privacy randomness (blocks of orthonormal rows: ``orthogonal``)."""
        c = self.config
        return random_projections(k, c.dim, self._rng, orthogonal=c.directions == "orthogonal",
                                 dtype=self._particles.dtype)

    def _directions(self) -> torch.Tensor:
        """The step's k directions (k, d): fresh, or drawn without replacement from the pool (``presampled``)."""
        k, d = self.config.num_projections, self.config.dim
        if self._pool is None:
            return self._draw_directions(k)
        if self.config.directions == "orthogonal":  # ⌈k/d⌉ whole blocks of the pool, then the first k rows
            blocks = self._pool.reshape(-1, d, d)
            idx = self._rng.subset(blocks.shape[0], -(-k // d))
            return blocks[idx].reshape(-1, d)[:k]
        idx = self._rng.subset(self._pool.shape[0], k)
        return self._pool[idx]

    def _release_sketch(self, batch: torch.Tensor, theta: torch.Tensor):
        """The sketch release of one step and its post-processing: ``(table (k, L), levels (L,))``.

        :func:`fastdpot.privacy.sliced_quantile_sketch` clips the batch inside, bins each direction's sorted
        projections into L rank bins and adds N(0, σ²), σ = z·Δ, to every bin sum; the noisy bin means are then
        fitted non-decreasing per direction (:func:`fastdpot.privacy.sketch.sketch_quantile_table`), which is
        post-processing. The noise comes from the flow's privacy randomness (secret OS draws unless
        ``secure_mode=False``)."""
        c, p = self.config, privacy_core()
        sketch = p.sliced_quantile_sketch(batch, theta, c.sketch_bins, float(self.noise_std),
                                          clip_radius=self._sketch_clip_radius(), normalize=False,
                                          generator=self._rng)
        return p.sketch.sketch_quantile_table(sketch)

    def _release_points(self, batch: torch.Tensor, theta: torch.Tensor):
        """The points release as op targets: the clipped batch and σ; op ``flow_step`` draws the privacy noise
        from the step's secret key (a sharded flow releases the noisy projections themselves instead)."""
        return dict(private=batch, noise_std=float(self.noise_std))

    def _release(self, batch: torch.Tensor):
        """The step's one release, counted by the caller: directions, the step's key, and the op's target
        (``private`` rows with σ, or a ``sketch`` table with no smoothing noise)."""
        batch = self._clip(batch.to(self.device, self._particles.dtype))
        theta = self._directions().to(self.device)
        key = self._rng.seed()  # the step's Philox key: fresh OS bits in secure mode, never stored
        if self.config.release == "sketch":
            target = dict(sketch=self._release_sketch(batch, theta), noise_std=0.0)
        else:
            target = self._release_points(batch, theta)
        return dict(projections=theta, seed=key, **target)


@contextlib.contextmanager
def _calibration_notice(flow, bound):
    """While the ledger binds: when it calibrates z for a target ε (bounded: :mod:`fastdpot.privacy.calibration`;
    its own progress line shows when it takes over a second and the run shows progress), an INFO record of logger
    ``fastdpot.flow`` with what was calibrated, the z found and the time taken."""
    if flow._ledger.noise_multiplier is not None:  # z given or already calibrated: nothing to wait for
        yield
        return
    import logging
    import time

    c = flow.config
    what = (f"calibrated the noise multiplier for ε={c.target_epsilon:g}, δ={c.delta:g} over T={c.steps} steps"
            + (f" (batches of {bound[1]} of n={bound[0]} rows)" if bound[0] is not None else ""))
    t0 = time.perf_counter()
    yield
    logging.getLogger("fastdpot.flow").info("%s: z = %.6g (%.1f s)", what, flow._ledger.noise_multiplier,
                                            time.perf_counter() - t0)
