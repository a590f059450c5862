"""The generation stage: the generator run on the private codes, one function per ``generation.method``.

* :func:`generate_flow` — the DP sliced-Wasserstein flow (DPSWflow-r, :class:`fastdpot.flows.ClassConditionalFlow`
  or :class:`fastdpot.flows.DPSlicedWassersteinFlow`): label-private by default (one flow on [code, c·onehot(label)]),
  per-class flows with ``labels="public"``, one flow without labels;
* :func:`generate_gaussian` — the DP Gaussian per class in the same code space (labels public:
  :func:`fastdpot.privacy.moments.dp_class_gaussians`; labels private: :func:`~fastdpot.privacy.moments.
  release_class_moments`);
* :func:`generate_public` — the public half's own codes (no private data, public-half protocol);
* :func:`generate_decoded` — ANALYSIS, not private: the sensitive codes themselves (private-only protocol);
* ``"oneshot"`` — the private-only protocol's one-shot release and flows in pixel space
  (:func:`fastdpot.experiments.mainjob.oneshot.generate_oneshot`).

They share one call: ``(cfg, codes, labels, num_particles, seed, **keywords)``, each taking the keywords it needs
from the pipeline's common set (``ledger``, ``public_labels``, ``public_codes``, ``num_classes``, ``normalize``,
``centers``, ``clip_radius``, ``checkpoint_path``, ``calibration_size``, ``noise_multiplier``, ``image_shape``,
``progress``).

Budget. In the private-only protocol every release is recorded in the run's
:class:`fastdpot.privacy.composition.ComposedLedger` (``ledger``), which calibrates the stage to the rest of the
run's ε over ALL its seeds. In the public-half protocol the flows calibrate themselves (``target_epsilon``) and
:func:`seed_targets` gives each of the S seeds its share of the run's (ε, δ). Every noise draw happens inside a
mechanism of :mod:`fastdpot.privacy` or a flow; this module only calibrates, records and post-processes.
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, Optional, Tuple

import torch

from ..._validate import check_positive
from ...flows.allocation import allocate_particles

__all__ = ["generate_flow", "generate_gaussian", "generate_public", "generate_decoded", "flow_defaults",
           "seed_targets", "GENERATORS"]


def flow_defaults(generation, dim: int, num_classes: Optional[int], label_private: bool,
                  private_only: bool) -> Tuple[int, float]:
    """(k, h) of the flow: the configured values, else

    * private-only: one orthogonal block in R^{d+C} (k = d + C), h = 0.3 (docs/mainjob-private.md);
    * public-half, d < 32: k = d (d + C label-private: one full block, sensitivity 2r or sqrt(4r² + 2c²)), h = 0.3
      (results/mainjob/NOTES.md: with orthogonal directions one full block per step adds the least noise per
      projected value, and h = 0.3 from a small start keeps the particles' walk under the noisy quantiles near the
      class spread); d >= 32: k = 300, h = 5 (Sebag et al., TMLR, not swept).
    """
    if private_only:
        k_def, h_def = dim + num_classes, 0.3
    elif dim >= 32:
        k_def, h_def = 300, 5.0
    else:
        k_def, h_def = (dim + num_classes if label_private else dim), 0.3
    return generation.num_projections or k_def, generation.step_size or h_def


def seed_targets(cfg, batch: int, n_ref: float, steps: int, per_class: bool) -> Dict[str, Any]:
    """The flow keywords that give each of the S = ``generation.flow_seeds`` public-half flows its share of the
    run's (ε, δ), so that everything the run publishes is within them.

    * S = 1 or ``each_seed_at_epsilon``: ``target_epsilon=ε``, ``delta=δ`` (each seed alone at the run's budget; with
      S > 1 the published total is their composition, :func:`fastdpot.experiments.mainjob.report.released_epsilon`);
    * one flow per seed with orthogonal directions: the noise multiplier z calibrated for S·T steps at (ε, δ)
      (RDP of the Gaussian sampled without replacement, q = B/n): S flows of T steps at z compose exactly to one
      accountant of S·T steps, within (ε, δ);
    * per-class flows (labels public) or uniform directions: (ε/S, δ/S) each, by basic composition (Dwork & Roth,
      "The Algorithmic Foundations of Differential Privacy", Thm. 3.16): a bound that reads no class size and
      covers the S·T draws of Θ's tails.
    """
    g, S = cfg.generation, cfg.generation.flow_seeds
    if not cfg.private:
        return dict(target_epsilon=None, delta=cfg.delta)
    if S == 1 or g.each_seed_at_epsilon:
        return dict(target_epsilon=cfg.epsilon, delta=cfg.delta)
    if per_class or g.directions != "orthogonal":
        return dict(target_epsilon=cfg.epsilon / S, delta=cfg.delta / S)
    from ...privacy import calibrate_noise_multiplier

    z = calibrate_noise_multiplier(cfg.epsilon, cfg.delta, batch / n_ref, S * steps, sampling="without_replacement",
                                   accountant="rdp", dataset_size=int(round(n_ref)), batch_size=batch)
    return dict(noise_multiplier=z, delta=cfg.delta)


def _flow_setup(cfg, codes, labels, num_particles, public_labels, num_classes, ledger):
    """The flow's shape: (kind, labels, C, particles per class, n_ref, B) from public quantities only."""
    g = cfg.generation
    cond = labels is not None and g.class_conditional
    label_private = cond and g.labels == "private"
    n = codes.shape[0]
    if label_private:  # C from the public domain; B, T from n; particles per class from public counts
        if ledger is None and public_labels is None:
            raise ValueError("labels='private' needs public_labels (the label domain C comes from the public half)")
        C = num_classes if ledger is not None else int(public_labels.max()) + 1
        labels = torch.where((labels >= 0) & (labels < C), labels, torch.zeros_like(labels))  # before any use
        per_class = "equal" if ledger is not None else allocate_particles(
            num_particles, torch.bincount(public_labels.long(), minlength=C), C, minimum=2)
        return "label_private", labels, C, per_class, float(n), min(g.batch_size, n)
    if cond:
        C = int(labels.max()) + 1
        if public_labels is not None:
            C = max(C, int(public_labels.max()) + 1)
        per_class = "equal" if public_labels is None else allocate_particles(
            num_particles, torch.bincount(public_labels.long(), minlength=C), C, minimum=2)
        return "per_class", labels, C, per_class, n / C, min(g.batch_size, max(1, n // (2 * C)))
    return "single", None, None, None, float(n), min(g.batch_size, n)


def generate_flow(cfg, codes: torch.Tensor, labels: Optional[torch.Tensor], num_particles: int, seed: int, *,
                  ledger=None, public_labels: Optional[torch.Tensor] = None, num_classes: Optional[int] = None,
                  normalize: bool = True, centers: Optional[torch.Tensor] = None,
                  clip_radius: Optional[float] = None, checkpoint_path: Optional[str] = None,
                  calibration_size: Optional[int] = None, noise_multiplier: Optional[float] = None,
                  progress: bool = True, **_) -> Dict[str, Any]:
    """The DP flow on the private ``codes`` (generator seed ``seed``: the initial particles, and every draw with
    ``replayable_noise``).

    Label-private (the default with labels): ONE flow on the rows [code, c·onehot(label)]
    (:class:`fastdpot.flows.ClassConditionalFlow`, ``label_privacy="private"``); B = min(batch_size, n),
    T = round(epochs·n/B), C and the starting particles per class public (``num_classes`` with a ``ledger``, else
    from the public half's labels ``public_labels``). ``labels="public"``: one flow per class on its partition
    (parallel composition; labels and class sizes ASSUMED public), B = min(batch_size, ⌊n/(2C)⌋),
    T = round(epochs·n/(C·B)). Without labels: one flow.

    Budget: with a ``ledger`` (private-only), z is calibrated so that what the ledger holds, this flow and the other
    seeds' flows compose to the run's ε (or ``noise_multiplier``, the first seed's z, for the later seeds), and the
    flow's T releases are recorded before it runs; a stand-in (``calibration_size`` > n) takes the real run's T and
    z. Without one (public-half), :func:`seed_targets`.

    Rows: scaled onto the unit sphere (``normalize``) or clipped to the unit ball inside the step; with ``centers``
    ((C, d) public class centres) shifted by their class's centre and clipped to ``clip_radius``, the centres added
    back to the samples (post-processing). Resumes from ``checkpoint_path`` when it exists.

    Returns:
        dict with ``samples`` (N, d), ``sample_labels`` (N,) or None, ``flow``, ``epsilon`` (this flow's),
        ``privacy`` (the settings and per-flow n, B, q, T, z, σ, Δ, δ split), ``resumed``.
    """
    from ...flows import ClassConditionalFlow, DPSlicedWassersteinFlow
    from .distributed import pipeline_flow, pipeline_group
    from .settings import MAX_FLOW_STEPS, steps_duration

    g = cfg.generation
    kind, labels, C, per_class, n_ref, batch = _flow_setup(cfg, codes, labels, num_particles, public_labels,
                                                           num_classes, ledger)
    cond, label_private = kind != "single", kind == "label_private"
    k, h = flow_defaults(g, codes.shape[1], C, label_private, ledger is not None)
    n_cal = codes.shape[0] if calibration_size is None else calibration_size
    steps = max(1, int(round(g.epochs * (n_ref if ledger is None else n_cal) / batch)))
    if steps > MAX_FLOW_STEPS:  # before any release
        raise ValueError(f"epochs = {g.epochs:g} makes T = {steps:.3g} flow steps (epochs·n/B, B = {batch}): "
                         f"{steps_duration(steps * g.flow_seeds)}; a run takes at most {MAX_FLOW_STEPS:.0e} steps: "
                         f"lower epochs or raise batch_size")
    if ledger is not None:
        if ledger.private:  # the rest of the composed budget, shared by every seed; recorded before it runs
            z = ledger.calibrate(g.flow_seeds * steps, dataset_size=n_cal, batch_size=batch) \
                if noise_multiplier is None else noise_multiplier
            ledger.record("flow", z, steps, sampling="without_replacement", dataset_size=n_cal, batch_size=batch)
            budget = dict(noise_multiplier=z)
        else:
            budget = {}
        budget.update(delta=ledger.delta)
    else:
        budget = seed_targets(cfg, batch, n_ref, steps, kind == "per_class")
    shift = None
    if centers is not None:
        if clip_radius is None:
            raise ValueError("centers need a clip_radius")
        clip_radius = check_positive(clip_radius, "clip_radius")
        if centers.dim() != 2 or centers.shape[1] != codes.shape[1] or (not cond and centers.shape[0] != 1):
            raise ValueError(f"centers must be (C, {codes.shape[1]}) (C = 1 without labels), got "
                             f"{tuple(centers.shape)}")
        if kind == "per_class" and int(labels.max()) >= centers.shape[0]:  # public labels: checkable
            raise ValueError(f"label {int(labels.max())} has no centre (centers has {centers.shape[0]} rows)")
        if label_private and centers.shape[0] < C:
            raise ValueError(f"centers must have a row per public class (C = {C}), got {centers.shape[0]}")
        shift = centers.to(codes.dtype)
        codes = codes - (shift[labels] if cond else shift[0])
    kw = dict(diffusion=g.diffusion, clip_radius=1.0 if shift is None else clip_radius, normalize=shift is None and
              normalize, batch_size=batch, steps=steps, bound=g.bound, directions=g.directions, device=cfg.device,
              backend=cfg.backend, secure_mode=not cfg.replayable_noise, **budget,
              **({} if g.release == "points" else dict(release=g.release, sketch_bins=g.sketch_bins)))
    if ledger is None:
        kw.update(variant="resample", quantiles="exact")
    gen = torch.Generator().manual_seed(int(seed))
    cond_kw = dict(particles_per_class=per_class, num_classes=C, label_privacy=g.labels,
                   **(dict(label_scale=g.label_scale) if label_private else {})) if cond else {}
    resumed = False
    if pipeline_group() is not None:  # `fastdpot flow --distributed` (docs/distributed.md)
        flow = pipeline_flow(cond, (num_particles, codes.shape[1], k, h),
                             dict(generator=gen, init=g.init, init_scale=g.init_scale, **kw, **cond_kw))
        if cond:
            flow.run(codes, labels, progress=progress)
            samples, sample_labels = flow.gather_samples()
        else:
            flow.run(codes, progress=progress)
            samples, sample_labels = flow.gather_particles(), None
    else:
        cls = ClassConditionalFlow if cond else DPSlicedWassersteinFlow
        if checkpoint_path is not None and os.path.isfile(checkpoint_path):
            flow, resumed = cls.load(checkpoint_path, device=cfg.device, backend=cfg.backend), True
        else:
            flow = cls(num_particles, codes.shape[1], k, h, generator=gen, init=g.init, init_scale=g.init_scale,
                       **kw, **cond_kw)
        run_kw = dict(progress=progress, checkpoint_path=checkpoint_path,  # no path (private-only): no checkpoint
                      checkpoint_every=g.checkpoint_every if checkpoint_path else None)
        if cond:
            samples, sample_labels = flow.run(codes, labels, **run_kw)
        else:
            samples, sample_labels = flow.run(codes, **run_kw), None
    flows = flow.flows if cond else [flow]
    parts = [int(c) for c in torch.bincount(labels, minlength=C)] if kind == "per_class" else [codes.shape[0]]
    if shift is not None:  # back to the code space (post-processing with public centres)
        samples = samples + (shift.to(samples)[sample_labels.to(samples.device)] if cond else shift[0].to(samples))
    per_flow = []
    for f, n in zip(flows, parts):
        da, dt = f.delta_split
        per_flow.append(dict(n=n, batch_size=batch, sample_rate=batch / n, planned_steps=steps,
                             steps_taken=f.steps_taken, noise_multiplier=f.noise_multiplier, noise_std=f.noise_std,
                             sensitivity=f.sensitivity, delta_accountant=da, delta_tail_per_step=dt,
                             epsilon=f.epsilon(), num_particles=int(f.config.num_particles)))
    private = cfg.private
    return dict(samples=samples.detach().cpu().float(), sample_labels=sample_labels, flow=flow, epsilon=flow.epsilon(),
                resumed=resumed,
                privacy=dict(method="flow", private=private, class_conditional=cond, labels=g.labels if cond else None,
                             label_scale=g.label_scale if label_private else None,
                             num_classes=C if label_private else None, num_projections=k, step_size=h,
                             steps=steps, batch_size=batch, flows=per_flow, accountant="rdp",
                             sampling="uniform without replacement, fixed size B, fresh every step "
                                      "(substitution neighbours)",
                             bound=g.bound, directions=g.directions, init=g.init, init_scale=g.init_scale,
                             center="none" if shift is None else "public",
                             clip_radius=None if shift is None else clip_radius,
                             replayable_noise=cfg.replayable_noise, release=g.release, sketch_bins=g.sketch_bins,
                             budget={k_: v for k_, v in budget.items() if k_ != "delta"}))


def generate_gaussian(cfg, codes: torch.Tensor, labels: torch.Tensor, num_particles: int, seed: int, *,
                      ledger=None, num_classes: Optional[int] = None, normalize: bool = True,
                      centers: Optional[torch.Tensor] = None, clip_radius: Optional[float] = None,
                      calibration_size: Optional[int] = None, noise_multiplier: Optional[float] = None,
                      **_) -> Dict[str, Any]:
    """The DP Gaussian per class in the code space (post-processing: N samples drawn from the released Gaussians).

    Labels public (public-half protocol): :func:`fastdpot.privacy.moments.dp_class_gaussians` at the run's (ε, δ)
    (analytic σ; S seeds each at σ·√S, whose S releases compose to one at σ: within (ε, δ)), rows bounded as the
    flow's, samples per class in proportion to the public counts (at least 2). Labels private (private-only, with
    ``ledger``): one :func:`fastdpot.privacy.moments.release_class_moments` of noise multiplier z calibrated to the
    rest of the composed ε (over every seed) and recorded before the release, samples per class in proportion to the
    noisy counts. ``calibration_size``: a stand-in's real-run size (noise multiplier z·n/calibration_size).
    """
    from ...flows.allocation import sample_class_gaussians
    from ...privacy.moments import class_gaussians, dp_class_gaussians, release_class_moments

    g = cfg.generation
    gen = torch.Generator().manual_seed(int(seed))
    if ledger is not None:
        n = codes.shape[0]
        n_cal = n if calibration_size is None else calibration_size
        z = 0.0
        if ledger.private:
            z = ledger.calibrate(g.flow_seeds, sampling="full", dataset_size=n_cal) \
                if noise_multiplier is None else noise_multiplier
            ledger.record("gaussian", z, 1, sampling="full", dataset_size=n_cal)
        # a stand-in (n rows for n_cal) is released at its own noise multiplier z·n/n_cal (the real run's noise
        # relative to its sums); the ledger holds the real run's z
        rel = release_class_moments(codes, labels, num_classes, z * (n / n_cal),
                                    generator=gen if cfg.replayable_noise else None,
                                    secure_mode=not cfg.replayable_noise)
        means, covs = class_gaussians(rel["counts"], rel["sums"], rel["second"])
        x, y = sample_class_gaussians(means, covs, rel["counts"].clamp_min(1.0), num_particles, gen)
        return dict(samples=x, sample_labels=y, epsilon=ledger.epsilon(), resumed=False,
                    privacy=dict(method="gaussian", private=ledger.private, noise_std=rel["noise_std"],
                                 sensitivity=rel["sensitivity"], noise_multiplier=z))
    if labels is None or not g.class_conditional:
        raise ValueError("method='gaussian' needs labelled data and class_conditional=True")
    S = 1 if g.each_seed_at_epsilon else g.flow_seeds
    rel = dp_class_gaussians(codes, labels, cfg.epsilon, cfg.delta, clip_radius=1.0 if centers is None else clip_radius,
                             normalize=centers is None and normalize, centers=centers,
                             generator=gen if cfg.replayable_noise else None, secure_mode=not cfg.replayable_noise,
                             noise_scale=math.sqrt(S))
    x, y = sample_class_gaussians(rel["means"], rel["covs"], rel["counts"], num_particles, gen, minimum=2)
    return dict(samples=x, sample_labels=y, epsilon=cfg.epsilon if cfg.private else math.inf, resumed=False,
                privacy=dict(method="gaussian", private=cfg.private, uses_private_data=True,
                             noise_std=rel["noise_std"], sensitivity=rel["sensitivity"], counts=rel["counts"].tolist(),
                             center="none" if centers is None else "public",
                             clip_radius=1.0 if centers is None else clip_radius, seeds_share=S))


def generate_public(cfg, codes, labels, num_particles: int, seed: int, *, public_codes: torch.Tensor,
                    public_labels: Optional[torch.Tensor], **_) -> Dict[str, Any]:
    """The public-only baseline: ``num_particles`` rows of the PUBLIC codes with their labels (without replacement
    while they last, the rest with replacement); no private data, no privacy cost."""
    gen = torch.Generator().manual_seed(int(seed))
    M = public_codes.shape[0]
    if M == 0:
        raise ValueError("public codes are empty")
    idx = torch.randperm(M, generator=gen)[:num_particles]
    if num_particles > M:
        idx = torch.cat([idx, torch.randint(M, (num_particles - M,), generator=gen)])
    y = None if public_labels is None or not cfg.generation.class_conditional else public_labels[idx]
    return dict(samples=public_codes[idx].float(), sample_labels=y, epsilon=0.0, resumed=False,
                privacy=dict(method="public", private=True, uses_private_data=False))


def generate_decoded(cfg, codes, labels, num_particles: int, seed: int, **_) -> Dict[str, Any]:
    """ANALYSIS, NOT PRIVATE: ``num_particles`` of the sensitive codes themselves with their labels (what the
    representation caps); releases the sensitive data."""
    gen = torch.Generator().manual_seed(int(seed))
    n = codes.shape[0]
    pick = torch.randint(n, (num_particles,), generator=gen) if num_particles > n else \
        torch.randperm(n, generator=gen)[:num_particles]
    return dict(samples=codes[pick], sample_labels=labels[pick], epsilon=math.inf, resumed=False,
                privacy=dict(method="decoded", private=False, note="the sensitive images' own codes decoded: NOT "
                                                                    "private"))


def _oneshot(*args, **kwargs):
    from .oneshot import generate_oneshot

    return generate_oneshot(*args, **kwargs)


GENERATORS = dict(oneshot=_oneshot, flow=generate_flow, gaussian=generate_gaussian, public=generate_public,
                  decoded=generate_decoded)
