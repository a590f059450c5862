"""The main job's private stage: the DP sliced-Wasserstein flow (DPSWflow-r) on the private latents.

:func:`stage_flow` runs :class:`fastdpot.flows.ClassConditionalFlow` when the data are labelled, else
:class:`fastdpot.flows.DPSlicedWassersteinFlow`, noise calibrated by the privacy core to (ε, δ); checkpointed, and
resumed from its checkpoint when the run folder already holds one; sharded over the ranks under
``fastdpot flow --distributed`` (:mod:`fastdpot.experiments.distributed_stage`). With ``center="public"``
(:func:`public_centers`) each latent is first shifted by its class's PUBLIC mean latent and clipped to a small ball
inside the step, which lowers the sensitivity from 2 to 2r. This is the only stage that touches private data
through a privacy mechanism.
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Tuple

import torch

from .._validate import check_int, check_positive, check_tensor
from .config import PipelineConfig

__all__ = ["stage_flow", "public_centers"]


def public_centers(public_latents: torch.Tensor, public_labels: Optional[torch.Tensor],
                   clip_radius: Optional[float] = None, num_classes: Optional[int] = None
                   ) -> Tuple[torch.Tensor, float]:
    """Centres and clipping radius of ``center="public"``, from PUBLIC latents only (no privacy cost).

    Args:
        public_latents: (n, d) latents of the public half. public_labels: (n,) labels, or None for one centre.
        clip_radius: r > 0, or None for the median distance of the public latents to their class's centre.
        num_classes: C (default: max public label + 1); every class 0..C-1 must have at least one public row.

    Returns:
        (centers (C, d) float32 — the class means of the public latents, or (1, d) without labels —, r).

    Raises:
        ValueError: empty or non-finite latents, a class without public rows, r <= 0.
    """
    check_tensor(public_latents, "public_latents", 2)
    if public_latents.shape[0] == 0:
        raise ValueError("public_latents is empty")
    z = public_latents.double()
    if public_labels is None:
        centers = z.mean(0, keepdim=True)
        dist = (z - centers).norm(dim=1)
    else:
        c = int(public_labels.max()) + 1 if num_classes is None else check_int(num_classes, "num_classes")
        counts = torch.bincount(public_labels, minlength=c)[:c]
        if bool((counts == 0).any()):
            raise ValueError(f"classes {torch.nonzero(counts == 0).flatten().tolist()} have no public rows to "
                             f"centre on")
        centers = torch.zeros(c, z.shape[1], dtype=torch.float64).index_add_(0, public_labels, z)
        centers /= counts[:, None].double()
        dist = (z - centers[public_labels]).norm(dim=1)
    r = float(dist.median()) if clip_radius is None else check_positive(clip_radius, "clip_radius")
    if not r > 0:
        raise ValueError("the public latents all sit on their centres: give clip_radius")
    return centers.float(), r


def _flow_steps(n: int, epochs: float, batch: int) -> int:
    return max(1, int(round(epochs * n / batch)))


def stage_flow(cfg: PipelineConfig, latents: torch.Tensor, labels: Optional[torch.Tensor], num_particles: int,
               checkpoint_path: Optional[str] = None, progress: bool = True,
               centers: Optional[torch.Tensor] = None, clip_radius: Optional[float] = None,
               public_labels: Optional[torch.Tensor] = None, seed: Optional[int] = None) -> Dict[str, Any]:
    """The DP sliced-Wasserstein flow (DPSWflow-r) on the private latents (generator seed ``seed``, default
    ``cfg.seed + 1``).

    With ``cfg.labels == "private"`` (and ``labels`` given, ``cfg.class_conditional``): ONE label-private flow on
    the rows [latent, c·onehot(label)] (:class:`fastdpot.flows.ClassConditionalFlow` with ``label_privacy="private"``),
    B = min(batch_size, n), T = round(epochs · n / B), C and the initial particles per class from the PUBLIC half's
    labels (``public_labels``, required); q = B/n, z, σ and Δ depend on n only. Otherwise:
    class-conditional (one flow per label on its partition; parallel composition) when ``labels`` is given and
    ``cfg.class_conditional``; T = round(epochs · n̄ / B) with n̄ = n/C the mean class size (one T shared by all
    class flows, each calibrated to ε on its own n_c). Only public quantities shape what is published: B =
    min(batch_size, ⌊n/(2C)⌋), the particles per class proportional to the PUBLIC half's class counts
    (``public_labels``; equal shares without them). The class flows' own z_c and q_c = B/n_c depend on the private
    class sizes (assumed public by the label-preserving relation, but not published). Resumes from
    ``checkpoint_path`` when it exists. Privacy draws are secret unless ``cfg.replayable_noise``.

    With ``centers`` ((C, d), or (1, d) for an unconditional flow; from :func:`public_centers`) each private latent
    is shifted by its class's centre and the flow clips it to the ball of radius ``clip_radius`` (required then)
    inside the step, so Δ = 2·clip_radius·sqrt(⌈k/d⌉); the centres are added back to the returned samples. Without,
    the latents are scaled onto the unit sphere inside the step (Δ = 2·sqrt(⌈k/d⌉)).

    Returns:
        dict with ``samples`` (N, d), ``sample_labels`` (N,) or None, ``flow``, ``epsilon`` (spent),
        ``privacy`` (per-flow: n, B, q, T, steps taken, z, σ, Δ, δ split), ``resumed``.
    """
    from ..flows import ClassConditionalFlow, DPSlicedWassersteinFlow

    k, h = _flow_defaults(cfg, latents.shape[1])
    private = not math.isinf(cfg.epsilon)
    cond = labels is not None and cfg.class_conditional
    label_private = cond and cfg.labels == "private"
    if label_private:  # nothing from the private labels: C from the public half, B and T from n (public)
        if public_labels is None:
            raise ValueError("labels='private' needs public_labels (the label domain C comes from the public half)")
        n_classes = int(public_labels.max()) + 1
        # a private label outside the public domain [0, C) is mapped to class 0 here, before any use (the centring
        # below, the mechanism): no label value can abort the run or show in a message (labelled.label_rows)
        labels = torch.where((labels >= 0) & (labels < n_classes), labels, torch.zeros_like(labels))
        if cfg.num_projections is None and latents.shape[1] < 32:  # one full block in R^{d+C}: Δ = sqrt(4r² + 2c²)
            k = latents.shape[1] + n_classes
        n_ref = float(latents.shape[0])
        batch = min(cfg.batch_size, latents.shape[0])
        per_class = _largest_remainder(torch.bincount(public_labels.long(), minlength=n_classes), num_particles)
    elif cond:
        counts = torch.bincount(labels, minlength=int(labels.max()) + 1)
        n_classes = counts.numel()
        if public_labels is not None:
            n_classes = max(n_classes, int(public_labels.max()) + 1)
            counts = torch.bincount(labels, minlength=n_classes)
        n_ref = latents.shape[0] / n_classes  # n and C are public; the class sizes n_c are not published
        batch = min(cfg.batch_size, max(1, latents.shape[0] // (2 * n_classes)))
        if public_labels is not None:
            pub = torch.bincount(public_labels.long(), minlength=n_classes)
            per_class = _largest_remainder(pub, num_particles)
        else:
            per_class = "equal"
    else:
        n_ref = float(latents.shape[0])
        batch = min(cfg.batch_size, latents.shape[0])
    steps = _flow_steps(int(round(n_ref)), cfg.epochs, batch)
    shift = None
    if centers is not None:
        if clip_radius is None:
            raise ValueError("centers need a clip_radius")
        clip_radius = check_positive(clip_radius, "clip_radius")
        if centers.dim() != 2 or centers.shape[1] != latents.shape[1] or (not cond and centers.shape[0] != 1):
            raise ValueError(f"centers must be (C, {latents.shape[1]}) (C = 1 without labels), got "
                             f"{tuple(centers.shape)}")
        if cond and not label_private and int(labels.max()) >= centers.shape[0]:  # public labels: checkable
            raise ValueError(f"label {int(labels.max())} has no centre (centers has {centers.shape[0]} rows)")
        if label_private and centers.shape[0] < n_classes:
            raise ValueError(f"centers must have a row per public class (C = {n_classes}), got {centers.shape[0]}")
        shift = centers.to(latents.dtype)
        latents = latents - (shift[labels] if cond else shift[0])
    kw = dict(diffusion=cfg.diffusion, target_epsilon=cfg.epsilon if private else None, delta=cfg.delta,
              clip_radius=1.0 if shift is None else clip_radius, normalize=shift is None, batch_size=batch, steps=steps,
              variant="resample", quantiles="exact",
              bound=cfg.bound, directions=cfg.directions, device=cfg.device, backend=cfg.backend,
              secure_mode=not cfg.replayable_noise,
              **({} if cfg.release == "points" else dict(release=cfg.release, sketch_bins=cfg.sketch_bins)))
    # public: initial particles (and every draw if replayable)
    gen = torch.Generator().manual_seed(cfg.seed + 1 if seed is None else int(seed))
    resumed = False
    from .distributed_stage import pipeline_group  # `fastdpot flow --distributed` (docs/distributed.md)

    if pipeline_group() is not None:
        from .distributed_stage import pipeline_flow

        flow = pipeline_flow(cond, (num_particles, latents.shape[1], k, h), dict(
            generator=gen, init=cfg.init, init_scale=cfg.init_scale, **kw,
            **(dict(particles_per_class=per_class, num_classes=n_classes, label_privacy=cfg.labels,
                    **(dict(label_scale=cfg.label_scale) if label_private else {})) if cond else {})))
        if cond:
            flow.run(latents, labels, progress=progress)
            samples, sample_labels = flow.gather_samples()
            flows, parts = flow.flows, [int(c) for c in counts]
        else:
            flow.run(latents, progress=progress)
            samples, sample_labels, flows, parts = flow.gather_particles(), None, [flow], [latents.shape[0]]
    elif checkpoint_path is not None and os.path.isfile(checkpoint_path):
        flow = (ClassConditionalFlow if cond else DPSlicedWassersteinFlow).load(
            checkpoint_path, device=cfg.device, backend=cfg.backend)
        resumed = True
    elif cond:
        flow = ClassConditionalFlow(num_particles, latents.shape[1], k, h, particles_per_class=per_class,
                                    num_classes=n_classes, generator=gen, init=cfg.init, init_scale=cfg.init_scale,
                                    label_privacy=cfg.labels,
                                    **(dict(label_scale=cfg.label_scale) if label_private else {}), **kw)
    else:
        flow = DPSlicedWassersteinFlow(num_particles, latents.shape[1], k, h, generator=gen, init=cfg.init,
                                       init_scale=cfg.init_scale, **kw)
    if pipeline_group() is not None:
        pass
    elif cond:
        samples, sample_labels = flow.run(latents, labels, progress=progress, checkpoint_path=checkpoint_path,
                                          checkpoint_every=cfg.checkpoint_every)
        flows = flow.flows
        parts = [latents.shape[0]] if label_private else [int(c) for c in counts]
    else:
        samples = flow.run(latents, progress=progress, checkpoint_path=checkpoint_path,
                           checkpoint_every=cfg.checkpoint_every)
        sample_labels, flows, parts = None, [flow], [latents.shape[0]]
    if shift is not None:  # back to the auto-encoder's latent space (post-processing with public centres)
        samples = samples + (shift.to(samples)[sample_labels.to(samples.device)] if cond else shift[0].to(samples))
    per_flow = []
    for f, n in zip(flows, parts):
        da, dt = f.delta_split
        per_flow.append(dict(n=n, batch_size=batch, sample_rate=batch / n, planned_steps=steps,
                             steps_taken=f.steps_taken, noise_multiplier=f.noise_multiplier,
                             noise_std=f.noise_std, sensitivity=f.sensitivity, delta_accountant=da,
                             delta_tail_per_step=dt, epsilon=f.epsilon(), num_particles=int(f.config.num_particles)))
    eps = flow.epsilon()
    return dict(samples=samples.detach().cpu().float(), sample_labels=sample_labels, flow=flow, epsilon=eps,
                privacy=dict(private=private, class_conditional=cond,
                             labels=cfg.labels if cond else None, label_scale=cfg.label_scale if label_private else None,
                             num_classes=n_classes if label_private else None, num_projections=k, step_size=h,
                             steps=steps, batch_size=batch, flows=per_flow, accountant="rdp",
                             sampling="uniform without replacement, fixed size B, fresh every step "
                                      "(substitution neighbours)",
                             bound=kw["bound"], directions=cfg.directions, init=cfg.init,
                             init_scale=cfg.init_scale, center="none" if shift is None else "public",
                             clip_radius=None if shift is None else clip_radius,
                             replayable_noise=cfg.replayable_noise, release=cfg.release, sketch_bins=cfg.sketch_bins),
                resumed=resumed)


def _largest_remainder(counts: torch.Tensor, total: int) -> List[int]:
    """``total`` split proportionally to ``counts`` (at least 2 each; largest-remainder rounding)."""
    C = counts.numel()
    if total < 2 * C:
        raise ValueError(f"num_particles must be >= 2·num_classes = {2 * C}, got {total}")
    w = counts.double().clamp_min(0)
    w = w if float(w.sum()) > 0 else torch.ones(C, dtype=torch.float64)
    share = w / w.sum() * (total - 2 * C)
    base = share.floor().long()
    order = torch.argsort(share - base.double(), descending=True, stable=True)
    base[order[: total - 2 * C - int(base.sum())]] += 1
    return [int(v) + 2 for v in base]


def _flow_defaults(cfg: PipelineConfig, dim: int) -> Tuple[int, float]:
    """(k, h): the configured values, else d < 32: k = d, h = 0.3 (the ε = 10 sweeps of results/mainjob/NOTES.md, at
    d = 8; d = 16 and 32 were run with the same rule): with orthogonal directions one full block per step has
    sensitivity 2 -- the least noise per projected value, while the information per step, k/Δ², does not depend on
    the number of blocks -- and beat k = 70 uniform directions at σ ≈ 10.5 by 16 points of latent-space MLP accuracy;
    h = 0.3 from a small start keeps the particles' random walk under the noisy quantiles near the class spread,
    where h = 1 leaves them ≈ 1.6 times too spread);
    d = 48: k = 300, h = 5 (Sebag et al., TMLR, not swept)."""
    k_def, h_def = (300, 5.0) if dim >= 32 else (dim, 0.3)
    return cfg.num_projections or k_def, cfg.step_size or h_def
