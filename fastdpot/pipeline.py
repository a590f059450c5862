"""The main job: private image generation with a DP sliced-Wasserstein flow in an auto-encoder's latent space.

Stages (Sebag et al., TMLR, DPSWflow-r), each a function that can be run and tested on its own:

1. :func:`stage_data` — load the training and test images, split the training set into disjoint public and
   private halves with a recorded seed.
2. :func:`stage_autoencoder` — train (or load from cache) the auto-encoder on the PUBLIC half only; encode the
   private half to unit-sphere latents.
3. :func:`stage_flow` — the DP flow on the private latents (:class:`fastdpot.flow.ClassConditionalFlow` when the data
   are labelled, else :class:`fastdpot.flow.DPSlicedWassersteinFlow`), noise calibrated by the privacy core to
   (ε, δ); checkpointed, and resumed from its checkpoint when the run folder already holds one. With
   ``center="public"`` (:func:`public_centers`) each latent is first shifted by its class's PUBLIC mean latent
   and clipped to a small ball inside the step, which lowers the sensitivity from 2 to 2r.
4. :func:`calibrate_spread` (optional post-processing, ``spread="public"``) — scale each class's particles about
   their mean so that their spread on the unit sphere equals that of the PUBLIC latents of the class; then
   :func:`stage_decode` — decode the particles to images.
5. :func:`stage_metrics` — FID against the real test set and downstream classifier accuracy.
6. :func:`write_outputs` — ``samples.png``, ``metrics.json``, ``privacy.md`` in the run folder.

:func:`run_pipeline` chains them with wall-clock times per stage. Only the flow stage touches private data through a
privacy mechanism; the auto-encoder, the public half and the test set are public by assumption.
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from ._validate import (check_choice, check_delta, check_epsilon, check_int, check_nonnegative, check_positive,
                        check_tensor)
from .autoencoder import AutoEncoderConfig, decode, default_cache_dir, encode, train_autoencoder
from .data import ImageData, load_dataset, public_private_split, to_float
from .flow import INIT_KINDS
from .metrics import CLASSIFIERS

METHODS = ("flow", "gaussian", "public")
DEFAULT_NUM_BINS = 5  # L of the default sketch release: chosen by the public-only sweep (docs/mainjob/tuning.md)

__all__ = ["PipelineConfig", "run_pipeline", "stage_data", "stage_autoencoder", "stage_flow", "calibrate_spread",
           "stage_decode", "stage_metrics", "write_outputs", "samples_grid"]


@dataclass
class PipelineConfig:
    """Settings of one run (defaults: Sebag et al., TMLR, Fashion-MNIST DPSWflow-r at (ε, δ) = (10, 1e-5), except the
    release (the sliced quantile sketch with L = 5 bins, chosen on public data only, see ``release``), the
    flow's directions (one block of k = d orthogonal directions per step, deterministic sensitivity 2), h = 0.3,
    B = 100, 10 epochs, a small data-independent start N(0, 0.3²·I_d/d) with no spread calibration (``spread="flow"``:
    nothing taken from public statistics after the flow), and the auto-encoder's 10 epochs: chosen by the ε = 10
    sweeps recorded in docs/mainjob/README.md).

    Attributes:
        dataset: "auto", "fashion-mnist", "idx", "celeba", "digits", "lfw" (see :func:`fastdpot.data.load_dataset`).
        data_dir: folder of MNIST-format idx files; celeba_dir: folder of aligned CelebA JPEGs.
        epsilon: target ε (``inf``: the non-private flow, σ = 0). delta: total δ.
        latent_dim: d. num_projections: k. step_size: h. reg: λ. batch_size: B private rows per step.
        epochs: passes over the private half; T = round(epochs · n / B) steps (n per class when class-conditional).
        num_particles: N (None: the size of the real test set).
        class_conditional: a class-conditional flow when the data are labelled (see ``labels``).
        labels: how the class-conditional flow treats the labels (:class:`fastdpot.flow.ClassConditionalFlow`'s
            ``label_privacy``). ``"public"`` (default): one flow per label on its partition (parallel composition),
            for neighbours that differ in one image with its label unchanged; the labels and class sizes are
            ASSUMED PUBLIC. ``"private"``: one flow on the rows [latent, c·onehot(label)] in R^{d+C}, for neighbours
            that differ by the replacement of one labelled image, its label free to change (labels and class sizes
            protected; C is taken from the public half's labels; nothing computed from private class counts is
            used or published). label_scale: c > 0 for ``"private"`` (public; Δ = sqrt(4r² + 2c²)·sqrt(⌈k/(d+C)⌉)).
        ae_epochs, ae_max_train: auto-encoder training (public half only).
        fid_samples: generated images in FID; fid_real: real test images in FID (their statistics are cached).
        seed: master seed of the public work (split, auto-encoder, the flows' initial particles, evaluation);
            device: "cpu" or "cuda"; backend: flow backend.
        replayable_noise: False (default): the flows' privacy draws (batches, directions, noise keys) come from the
            operating system, secret and never stored (:mod:`fastdpot.privacy.randomness`). True: they come from
            ``seed`` (replayable: NO guarantee against anyone who holds the seed or the checkpoint; privacy.md
            and metrics.json say so).
        quick: a short run (small data, few steps, small FID) to check that everything works.
        checkpoint_every: flow checkpoint period in steps.
        directions: ``"orthogonal"`` (default): each step's k directions are ⌈k/d⌉ blocks of orthonormal directions,
            sensitivity 2·sqrt(⌈k/d⌉) for every draw (no tail, all of δ to the accountant); ``"uniform"``: i.i.d.
            uniform directions, the papers' choice, with the tail ``bound`` below.
        bound: tail bound of the sliced sensitivity over Θ (:func:`fastdpot.privacy.sliced_sensitivity`). Default
            "chernoff", the tightest proven bound; "bernstein" (paper Lemma 2) is proven but looser; "clt" is only a
            normal approximation whose tail exceeds δ_tail, so it is no guarantee and is not the default.
        decode_on_sphere: scale the particles onto the unit sphere (where every encoded latent lies and the decoder
            was trained) before decoding; post-processing of the released particles, no privacy cost.
        spread: ``"public"``: :func:`calibrate_spread` rescales each class's released particles about their mean so
            that their spread on the unit sphere matches the public half's latents of that class (post-processing
            with public statistics, no privacy cost; the spread of the samples then comes from public data, the
            class means and shapes from the private flow); ``"flow"``: the particles as the flow left them.
        center: ``"public"``: each private latent is shifted by the PUBLIC half's mean latent of its class
            (the public mean of all latents when the flow is not class-conditional) and clipped, inside the flow
            step, to the ball of radius ``clip_radius`` about 0, so one release's sensitivity is 2·clip_radius
            instead of the unit sphere's diameter 2; the particles live in the shifted space and the class's
            public mean is added back to them (post-processing). ``"none"`` (default): the authors' setting, every
            latent scaled onto the unit sphere inside the step (radius 1, sensitivity 2). At ε = 10 on
            Fashion-MNIST the 2.3 times smaller noise of ``"public"`` did not turn into better samples (three flow
            seeds each: FID 88.5 vs 89.2, MLP 64.3 % vs 65.3 %, within the seeds' spread; docs/mainjob/README.md).
        clip_radius: r > 0 for ``center="public"`` (latent units; the latents have norm 1). None: the median of the
            public half's distances to their class means (a public statistic; 0.43 for the default Fashion-MNIST
            auto-encoder, so about half of the private rows are clipped).
        release, num_bins: the flows' per-step release (:class:`fastdpot.flow.DPSlicedWassersteinFlow`):
            ``"sketch"`` (default: the sliced quantile sketch with L = ``num_bins`` bins per direction, <= the
            batch size; None: L = min(5, B)) or ``"points"`` (the B·k noisy projections; ``num_bins`` must be
            None); same Δ, σ and accounting. The defaults (sketch, L = 5, with h = 0.3) were chosen by the
            public-only sweep of docs/mainjob/tuning.md (``python -m fastdpot.tuning``; stand-in private and
            held-out parts of the public half, ε = 10, ranked by the held-out MLP accuracy: sketch L = 5 71.2 %,
            L = 10 70.8 %, points 63.4 % at h = 0.3; h = 0.1 was worse for both releases); before that sweep the
            default was ``"points"``, chosen on test-set scores.
        init, init_scale: the flows' data-independent start (:func:`fastdpot.flow.draw_init`, drawn from the
            flow's seeded generator, no privacy cost), s = init_scale > 0 (latent units; the latents have norm 1):
            ``"gaussian"`` N(0, s²·I_d), ``"sphere"`` uniform on the sphere of radius s, ``"gaussian_scaled"``
            N(0, (s²/d)·I_d) (E‖x‖² = s²).
        method: ``"flow"`` (the DP flow; ε = ∞ gives the non-private flow), ``"gaussian"`` (baseline: the DP
            Gaussian per class in the same latent space, :func:`fastdpot.baselines.dp_class_gaussians`, rows bounded
            as the flow's: unit sphere, or public centres and radius r with ``center="public"``) or ``"public"``
            (baseline: the public half's own labelled latents, decoded; no private data, no privacy cost).
        public_size: number of public training images (the auto-encoder's training set); None: half of them.
        flow_seeds: run the generation stage (flow or baseline) with this many seeds cfg.seed + 1, cfg.seed + 2, …
            on the same data split and auto-encoder; metrics.json reports each seed and their mean / spread.
        classifiers: comma-separated downstream classifiers (``logreg``, ``mlp``, ``cnn``); cnn_epochs: the CNN's.
    """
    dataset: str = "auto"
    data_dir: Optional[str] = None
    celeba_dir: Optional[str] = None
    epsilon: float = 10.0
    delta: float = 1e-5
    latent_dim: Optional[int] = None
    num_projections: Optional[int] = None
    step_size: Optional[float] = None
    reg: float = 0.0
    batch_size: int = 100
    epochs: float = 10.0
    num_particles: Optional[int] = None
    class_conditional: bool = True
    labels: str = "public"
    label_scale: float = 1.0
    ae_epochs: int = 10
    ae_max_train: Optional[int] = None
    fid_samples: int = 2000
    fid_real: int = 2000
    max_train: Optional[int] = None
    max_test: Optional[int] = None
    seed: int = 0
    device: str = "cpu"
    backend: str = "auto"
    quick: bool = False
    checkpoint_every: int = 100
    bound: str = "chernoff"
    directions: str = "orthogonal"
    decode_on_sphere: bool = True
    spread: str = "flow"
    init: str = "gaussian_scaled"
    init_scale: float = 0.3
    center: str = "none"
    clip_radius: Optional[float] = None
    replayable_noise: bool = False
    release: str = "sketch"
    num_bins: Optional[int] = None
    method: str = "flow"
    public_size: Optional[int] = None
    flow_seeds: int = 1
    classifiers: str = "logreg,mlp,cnn"
    cnn_epochs: int = 5

    def resolved(self) -> "PipelineConfig":
        """A copy with the --quick reductions and the data-dependent defaults applied, validated."""
        c = PipelineConfig(**asdict(self))
        if c.quick:
            c.max_train = min(c.max_train or 4000, 4000)
            c.max_test = min(c.max_test or 1000, 1000)
            c.ae_epochs = 1
            c.epochs = min(c.epochs, 2.0)
            c.batch_size = min(c.batch_size, 100)
            c.fid_samples = min(c.fid_samples, 100)
            c.fid_real = min(c.fid_real, 100)
            c.checkpoint_every = min(c.checkpoint_every, 10)
            c.cnn_epochs = min(c.cnn_epochs, 1)
        c.epsilon = check_epsilon(c.epsilon, "epsilon", allow_inf=True)
        c.delta = check_delta(c.delta)
        check_int(c.batch_size, "batch_size")
        check_positive(c.epochs, "epochs")
        check_int(c.ae_epochs, "ae_epochs")
        check_int(c.fid_samples, "fid_samples", 2)
        check_int(c.fid_real, "fid_real", 2)
        check_int(c.checkpoint_every, "checkpoint_every")
        check_choice(c.device.split(":")[0], "device", ("cpu", "cuda"))
        if c.num_particles is not None:
            check_int(c.num_particles, "num_particles", 2)
        check_nonnegative(c.reg, "reg")
        check_choice(c.spread, "spread", ("public", "flow"))
        check_choice(c.directions, "directions", ("orthogonal", "uniform"))
        check_choice(c.init, "init", INIT_KINDS)
        c.init_scale = check_positive(c.init_scale, "init_scale")
        check_choice(c.center, "center", ("public", "none"))
        if not isinstance(c.replayable_noise, bool):
            raise ValueError(f"replayable_noise must be a bool, got {c.replayable_noise!r}")
        check_choice(c.release, "release", ("points", "sketch"))
        if c.release == "sketch":
            if c.num_bins is None:
                c.num_bins = min(DEFAULT_NUM_BINS, c.batch_size)
            check_int(c.num_bins, "num_bins", 1)
            if c.num_bins > c.batch_size:
                raise ValueError(f"num_bins must be <= batch_size = {c.batch_size}, got {c.num_bins}")
        elif c.num_bins is not None:
            raise ValueError(f"num_bins is only used with release='sketch', got num_bins={c.num_bins!r}")
        check_choice(c.method, "method", METHODS)
        check_choice(c.labels, "labels", ("public", "private"))
        c.label_scale = check_positive(c.label_scale, "label_scale")
        if c.labels == "private" and c.method != "flow":
            raise ValueError(f"labels='private' is a mode of the flow (method='flow'), got method={c.method!r}")
        if c.public_size is not None:
            check_int(c.public_size, "public_size")
        check_int(c.flow_seeds, "flow_seeds")
        check_int(c.cnn_epochs, "cnn_epochs")
        names = [v.strip() for v in str(c.classifiers).split(",") if v.strip()]
        for v in names:
            check_choice(v, "classifiers", CLASSIFIERS)
        c.classifiers = ",".join(names)
        if c.clip_radius is not None:
            c.clip_radius = check_positive(c.clip_radius, "clip_radius")
            if c.center != "public":
                raise ValueError("clip_radius applies to center='public' (with center='none' the latents are scaled "
                                 "onto the unit sphere, r = 1)")
        return c


# ------------------------------------------------------------------------------------------------------------
# stages
# ------------------------------------------------------------------------------------------------------------
def stage_data(cfg: PipelineConfig) -> Dict[str, Any]:
    """Load train/test data and split the training set into disjoint public / private halves (seed ``cfg.seed``;
    ``cfg.public_size`` public images instead of half when given).

    Returns:
        dict with ``public`` and ``private`` (:class:`ImageData`), ``test`` (:class:`ImageData`), ``public_index``
        and ``private_index`` (into the training set), ``dataset`` (name).
    """
    train = load_dataset(cfg.dataset, "train", cfg.data_dir, cfg.celeba_dir, cfg.max_train)
    test = load_dataset(cfg.dataset, "test", cfg.data_dir, cfg.celeba_dir, cfg.max_test)
    if cfg.public_size is not None and not cfg.public_size < len(train):
        raise ValueError(f"public_size must be < the {len(train)} training images, got {cfg.public_size}")
    pub, priv = public_private_split(len(train), seed=cfg.seed, public_size=cfg.public_size)
    return dict(public=train.subset(pub), private=train.subset(priv), test=test, public_index=pub,
                private_index=priv, dataset=train.name)


def _ae_defaults(images: torch.Tensor) -> Tuple[str, int]:
    """(arch, latent d) by image size: 28/32 px: the conv AE of Sebag et al., TMLR with d = 16 (the papers use d = 8; at
    d = 8 this AE's own reconstructions score FID ≈ 100 on 2000 vs 2000 Fashion-MNIST images, which bounds any flow
    in its latent space; d = 16 gave FID 89.7 at ε = 10 against 111.5 at d = 8, docs/mainjob/README.md);
    64 px: DCGAN AE, d = 48 (Sebag et al., TMLR)."""
    H = images.shape[-1]
    if H == 64:
        return "dcgan", 48
    if H in (28, 32):
        return "conv", 16
    raise ValueError(f"images must be 28, 32 or 64 px square for the bundled auto-encoders, got {tuple(images.shape)}")


def stage_autoencoder(cfg: PipelineConfig, data: Dict[str, Any], progress: bool = True,
                      cache_dir: Optional[str] = None) -> Dict[str, Any]:
    """Train (or load) the auto-encoder on the public half; encode the private half to unit-sphere latents.

    Returns:
        dict with ``model``, ``info`` (cache hit, key, train loss, seconds), ``latents`` (n, d) float32,
        ``labels`` (n,) or None, ``public_latents`` / ``public_labels`` (the public half, encoded; only with
        ``cfg.center == "public"`` or ``cfg.spread == "public"``, which use them, else None),
        ``recon_mse`` (mean squared reconstruction error on up to 1000 test images).
    """
    arch, d = _ae_defaults(data["public"].images)
    d = cfg.latent_dim or d
    ae_cfg = AutoEncoderConfig(arch=arch, latent_dim=d, epochs=cfg.ae_epochs, seed=cfg.seed,
                               max_train=cfg.ae_max_train)
    model, info = train_autoencoder(data["public"].images, ae_cfg, cache_dir=cache_dir, device=cfg.device,
                                    progress=progress)
    latents = encode(model, data["private"].images, device=cfg.device)
    test = data["test"].images[:1000]
    recon = decode(model, encode(model, test, device=cfg.device), device=cfg.device)
    mse = float(((recon - to_float(test)) ** 2).mean())
    public = (encode(model, data["public"].images, device=cfg.device)
              if "public" in (cfg.spread, cfg.center) or cfg.method == "public" else None)
    return dict(model=model, info=info, latents=latents, labels=data["private"].labels, public_latents=public,
                public_labels=data["public"].labels, recon_mse=mse, config=asdict(ae_cfg))


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
    the rows [latent, c·onehot(label)] (:class:`fastdpot.flow.ClassConditionalFlow` with ``label_privacy="private"``),
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
    from .flow import ClassConditionalFlow, DPSlicedWassersteinFlow

    k, h = _flow_defaults(cfg, latents.shape[1])
    private = not math.isinf(cfg.epsilon)
    cond = labels is not None and cfg.class_conditional
    label_private = cond and cfg.labels == "private"
    if label_private:  # nothing from the private labels: C from the public half, B and T from n (public)
        if public_labels is None:
            raise ValueError("labels='private' needs public_labels (the label domain C comes from the public half)")
        n_classes = int(public_labels.max()) + 1
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
        if cond and int(labels.max()) >= centers.shape[0]:
            raise ValueError(f"label {int(labels.max())} has no centre (centers has {centers.shape[0]} rows)")
        shift = centers.to(latents.dtype)
        latents = latents - (shift[labels] if cond else shift[0])
    kw = dict(reg=cfg.reg, target_epsilon=cfg.epsilon if private else None, delta=cfg.delta,
              radius=1.0 if shift is None else clip_radius, normalize=shift is None, batch_size=batch, steps=steps,
              variant="resample", quantiles="exact",
              bound=cfg.bound, directions=cfg.directions, device=cfg.device, backend=cfg.backend,
              secure_mode=not cfg.replayable_noise,
              **({} if cfg.release == "points" else dict(release=cfg.release, num_bins=cfg.num_bins)))
    # public: initial particles (and every draw if replayable)
    gen = torch.Generator().manual_seed(cfg.seed + 1 if seed is None else int(seed))
    resumed = False
    from .distributed_jobs import pipeline_group  # `fastdpot flow --distributed` (docs/distributed.md)

    if pipeline_group() is not None:
        from .distributed_jobs import gather_class_samples, pipeline_flow

        flow = pipeline_flow(cond, (num_particles, latents.shape[1], k, h), dict(
            generator=gen, init=cfg.init, init_scale=cfg.init_scale, **kw,
            **(dict(particles_per_class=per_class, num_classes=n_classes, label_privacy=cfg.labels,
                    **(dict(label_scale=cfg.label_scale) if label_private else {})) if cond else {})))
        if cond:
            flow.run(latents, labels, progress=progress)
            samples, sample_labels = gather_class_samples(flow)
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
                             delta_tail_per_step=dt, epsilon=f.epsilon(), num_particles=int(f.config["num_particles"])))
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
                             replayable_noise=cfg.replayable_noise, release=cfg.release, num_bins=cfg.num_bins),
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
    """(k, h): the configured values, else d < 32: k = d, h = 0.3 (the ε = 10 sweeps of docs/mainjob/README.md, at
    d = 8; d = 16 and 32 were run with the same rule): with orthogonal directions one full block per step has
    sensitivity 2 -- the least noise per projected value, while the information per step, k/Δ², does not depend on
    the number of blocks -- and beat k = 70 uniform directions at σ ≈ 10.5 by 16 points of latent-space MLP accuracy;
    h = 0.3 from a small start keeps the particles' random walk under the noisy quantiles near the class spread,
    where h = 1 leaves them ≈ 1.6 times too spread);
    d = 48: k = 300, h = 5 (Sebag et al., TMLR, not swept)."""
    k_def, h_def = (300, 5.0) if dim >= 32 else (dim, 0.3)
    return cfg.num_projections or k_def, cfg.step_size or h_def


def _sphere_spread(x: torch.Tensor) -> float:
    """RMS distance of the rows of ``x``, scaled onto the unit sphere, to their mean."""
    u = x.double() / x.double().norm(dim=1, keepdim=True).clamp_min(1e-12)
    return float(((u - u.mean(0)) ** 2).sum(1).mean().sqrt())


def calibrate_spread(samples: torch.Tensor, labels: Optional[torch.Tensor], reference: torch.Tensor,
                     reference_labels: Optional[torch.Tensor], iters: int = 50) -> Tuple[torch.Tensor, list]:
    """Scale each class's particles about their mean so that their spread on the unit sphere equals the reference's.

    For each class c (one group when ``labels`` is None) with particles x and particle mean m, find s_c ≥ 0 by
    bisection such that the RMS distance of the unit-normalised rows of ``m + s_c (x − m)`` to their mean equals
    that of the unit-normalised reference rows of class c.

    Privacy: with ``reference`` the PUBLIC latents this is post-processing of the released particles with public
    statistics (no privacy cost). Why: at ε = 10 the per-class flows add σ ≈ 10–17 to projected values of spread
    ≈ 0.35, and the force that matches the variance of the noisy projections scales as 1/σ², so the flow moves the
    particle mean to the class mean but barely contracts the N(0, I_d) initial cloud (d-dimensional spread ≈ 1 per
    coordinate against ≈ 0.02 for the latents of one class).

    Shape:
        samples (N, d), labels (N,) or None, reference (M, d), reference_labels (M,) or None.
        Returns (calibrated samples (N, d) float32, [s_c per class]).

    Raises:
        ValueError: shapes disagree, or a class of ``labels`` has no reference row.
    """
    check_int(iters, "iters")
    if samples.dim() != 2 or reference.dim() != 2 or samples.shape[1] != reference.shape[1]:
        raise ValueError(f"samples (N, d) and reference (M, d) must agree in d, got {tuple(samples.shape)} and "
                         f"{tuple(reference.shape)}")
    if (labels is None) != (reference_labels is None):
        raise ValueError("give labels for both samples and reference, or for neither")
    groups = [None] if labels is None else [int(c) for c in torch.unique(labels)]
    out = samples.detach().clone().float()
    scales = []
    for c in groups:
        sel = slice(None) if c is None else labels == c
        ref = reference if c is None else reference[reference_labels == c]
        if ref.shape[0] < 2:
            raise ValueError(f"class {c} has {ref.shape[0]} reference rows; need at least 2")
        x = samples[sel].double()
        if x.shape[0] < 2:
            scales.append(1.0)
            continue
        target, m = _sphere_spread(ref), x.mean(0)
        dev = x - m
        spread = lambda s: _sphere_spread(m + s * dev)  # noqa: E731
        lo, hi = 0.0, 1.0
        while spread(hi) < target and hi < 1e6:
            lo, hi = hi, hi * 2.0
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if spread(mid) < target else (lo, mid)
        s_c = 0.5 * (lo + hi)
        out[sel] = (m + s_c * dev).float()
        scales.append(s_c)
    return out, scales


def stage_decode(model, samples: torch.Tensor, device="cpu", on_sphere: bool = True) -> torch.Tensor:
    """Decode (N, d) latent particles to (N, C, H, W) images in [0, 1].

    With ``on_sphere`` the particles are first scaled to unit norm: the auto-encoder's latents all lie on S^{d-1},
    while noisy private flows leave particles off it (post-processing; no privacy cost).
    """
    if on_sphere:
        samples = samples / samples.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return decode(model, samples, device=device).clamp_(0.0, 1.0)


def stage_metrics(cfg: PipelineConfig, images: torch.Tensor, labels: Optional[torch.Tensor], test: ImageData,
                  fid_cache: Optional[str] = None, progress: bool = True) -> Dict[str, Any]:
    """FID (``cfg.fid_samples`` generated vs ``cfg.fid_real`` real test images) and downstream accuracy (the
    ``cfg.classifiers``: LogReg / MLP / CNN trained on all generated labelled images, tested on the whole real test
    set).

    The generated subset is drawn with ``cfg.seed``; the real subset with a fixed seed, so its Inception statistics
    (cached in ``fid_cache``, keyed by the pixels) serve every run on the same test set.
    """
    from . import metrics as M

    g = torch.Generator().manual_seed(cfg.seed + 2)
    n_gen = min(cfg.fid_samples, images.shape[0])
    n_real = min(cfg.fid_real, len(test))
    gi = torch.randperm(images.shape[0], generator=g)[:n_gen]
    ri = torch.sort(torch.randperm(len(test), generator=torch.Generator().manual_seed(12345))[:n_real]).values
    t0 = time.perf_counter()
    real = to_float(test.images[ri])
    mu_r, sig_r, cached = M.real_statistics(real, device=cfg.device, cache=fid_cache, progress=progress)
    t_real = time.perf_counter() - t0
    t0 = time.perf_counter()
    mu_g, sig_g = M.feature_statistics(M.inception_features(images[gi], device=cfg.device, progress=progress,
                                                            desc="FID generated"))
    fid = M.frechet_distance(mu_r, sig_r, mu_g, sig_g)
    out = dict(fid=fid, fid_generated_samples=n_gen, fid_real_samples=n_real, fid_real_stats_cached=cached,
               fid_real_seconds=t_real, fid_generated_seconds=time.perf_counter() - t0)
    if labels is not None and test.labels is not None:
        t0 = time.perf_counter()
        acc = M.downstream_accuracy(images, labels, to_float(test.images), test.labels,
                                    classifiers=[v for v in cfg.classifiers.split(",") if v], seed=cfg.seed,
                                    cnn_epochs=cfg.cnn_epochs)
        out.update({f"accuracy_{k}": v for k, v in acc.items()})
        out.update(downstream_train_samples=int(images.shape[0]), downstream_test_samples=len(test),
                   downstream_seconds=time.perf_counter() - t0)
    return out


# ------------------------------------------------------------------------------------------------------------
# outputs
# ------------------------------------------------------------------------------------------------------------
def samples_grid(images: torch.Tensor, labels: Optional[torch.Tensor], per_class: int = 10,
                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """A (C, rows·H, cols·W) grid: one row per class (``per_class`` random samples each), or a square grid of
    unlabelled samples. Images (N, C, H, W) in [0, 1]."""
    g = generator or torch.Generator().manual_seed(0)
    if labels is not None:
        rows = []
        for c in range(int(labels.max()) + 1):
            idx = torch.nonzero(labels == c).flatten()
            idx = idx[torch.randperm(idx.numel(), generator=g)[:per_class]]
            row = images[idx]
            if row.shape[0] < per_class:
                row = torch.cat([row, images.new_zeros((per_class - row.shape[0],) + tuple(images.shape[1:]))])
            rows.append(row)
        tiles = torch.stack(rows)  # (R, cols, C, H, W)
    else:
        side = max(1, int(math.isqrt(min(images.shape[0], per_class * per_class))))
        idx = torch.randperm(images.shape[0], generator=g)[:side * side]
        tiles = images[idx].view(side, side, *images.shape[1:])
    R, K, C, H, W = tiles.shape
    return tiles.permute(2, 0, 3, 1, 4).reshape(C, R * H, K * W)


def _save_grid_png(grid: torch.Tensor, path: str, row_names=None, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img = grid.permute(1, 2, 0).numpy()
    fig_h = max(2.0, img.shape[0] / 40.0)
    fig, ax = plt.subplots(figsize=(fig_h * img.shape[1] / img.shape[0] + (1.4 if row_names else 0), fig_h))
    ax.imshow(img[..., 0] if img.shape[2] == 1 else img, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    if row_names:
        h = img.shape[0] / len(row_names)
        ax.set_yticks([h * (i + 0.5) for i in range(len(row_names))])
        ax.set_yticklabels(row_names, fontsize=8)
    else:
        ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _per_class(p: Dict[str, Any]) -> bool:
    """Whether the run used the per-class flows (labels and class sizes assumed public)."""
    return bool(p.get("class_conditional")) and p.get("labels", "public") != "private"


def _init_text(kind: str, s: float) -> str:
    """The start's law in words, e.g. ``N(0, 0.3²·I_d/d)``."""
    f = "" if s == 1.0 else f"{s:g}²·"
    return {"gaussian": f"N(0, {f}I_d)", "gaussian_scaled": f"N(0, {f}I_d/d)",
            "sphere": f"uniform on the sphere of radius {s:g}"}[kind]


def _privacy_md(cfg: PipelineConfig, result: Dict[str, Any]) -> str:
    p = result["privacy"]
    lines = ["# Privacy of this run", ""]
    if not p["private"]:
        lines += ["**Non-private run (`--epsilon inf`): no differential-privacy guarantee.** The flow used the "
                  "private latents without noise (σ = 0).", ""]
    f0 = p["flows"]
    cond = _per_class(p)  # per-class flows: labels and class sizes assumed public
    lp = bool(p["class_conditional"]) and not cond  # one label-private flow on [latent, c·onehot(label)]
    zs = sorted({round(f["noise_multiplier"], 6) for f in f0 if f["noise_multiplier"] is not None})
    if p.get("replayable_noise"):
        lines += ["**Replayable noise (`--replayable-noise`): the flow's batches, directions and noise were drawn from "
                  f"seed {cfg.seed}. There is NO privacy guarantee against anyone who holds that seed (or the flow "
                  "checkpoint): with it and the other rows, the noise can be recomputed and removed.** The "
                  "statements below hold only against parties who know neither.", ""]
    elif p["private"]:
        lines += ["* Randomness: the flow's batches, directions and per-step noise keys were drawn from the operating "
                  "system's CSPRNG (`fastdpot.privacy.randomness`); they were never stored. The seed "
                  f"{cfg.seed} drove only the public work (split, auto-encoder, initial particles, evaluation).", ""]
    diam = f"2r (r = {p['clip_radius']:.4g})" if p.get("center") == "public" else "2"
    if lp:
        r_txt = f"{p['clip_radius']:.4g}" if p.get("center") == "public" else "1"
        diam = f"sqrt(4r² + 2c²) (r = {r_txt}, c = {p['label_scale']:g})"
    lines += [
        "## What was released",
        "",
        f"* Data: `{result['dataset']}` training set, split with seed {cfg.seed} into a public half "
        f"({result['n_public']} images) and a disjoint private half ({result['n_private']} images).",
        f"* The private images enter ONLY through the DP sliced-Wasserstein flow (DPSWflow-r, Sebag et al., TMLR), in "
        f"the auto-encoder's latent space (d = {result['latent_dim']}); "
        + (f"each latent (on the unit sphere) is shifted by the PUBLIC half's mean latent of its class and clipped "
           f"inside the flow step to the ball of radius r = {p['clip_radius']:.4g} about 0 (‖y − y'‖ ≤ 2r"
           + ("; the shift is a public function of the record (x, y), and the clipped latents of any two records "
              "are at most 2r apart)." if lp else
              "; neighbours differ in one image with its label unchanged, so both rows get the same shift).")
           if p.get("center") == "public" else
           "each latent is scaled onto the unit sphere inside the flow step (‖y − y'‖ ≤ 2).")
        + (f" Label-private class conditioning: each private row is [latent, c·e_label] in R^(d+C) (C = "
           f"{p['num_classes']} from the public half's labels, c = {p['label_scale']:g}), the label block rebuilt "
           f"inside the step; two rows are at most sqrt(4r² + 2c²) apart, label change included. A particle's "
           f"label is the argmax of its label block, read at the end (post-processing)." if lp else ""),
        f"* Per step and per flow: k = {p['num_projections']} fresh {p['directions']} directions Θ"
        f"{' (blocks of ' + ('d + C' if lp else 'd') + ' orthonormal rows, each a Haar-random rotation)' if p['directions'] == 'orthogonal' else ''}"
        f"; a batch of B = "
        f"{p['batch_size']} private latents drawn uniformly without replacement (fresh every step, never a replayed "
        f"epoch); "
        + (f"the release is Y Θᵀ + V with V i.i.d. N(0, σ²) on each of the B·k projected values."
           if p.get("release", "points") == "points" else
           f"the release is the sliced quantile sketch (`fastdpot.privacy.sliced_quantile_sketch`): per direction "
           f"the B projected latents are sorted and summed in L = {p['num_bins']} rank bins whose sizes depend only "
           f"on B and L, and N(0, σ²) is added to each of the k·L bin sums; the flow's target is the isotonic fit "
           f"of the noisy bin means (post-processing). Its sensitivity is that of the per-point release (sorting "
           f"is an ℓ1 contraction, binning does not increase ℓ1; proof in the mechanism's docstring), so Δ, σ and "
           f"the accountant event below are the same; the particles get no smoothing noise."),
        f"* Number of releases: T = {p['steps']} steps per flow "
        f"({'one flow per class on disjoint label partitions: ' + str(len(f0)) + ' flows' if cond else 'one flow on the labelled rows' if lp else 'one flow'}); "
        f"steps actually taken: {[f['steps_taken'] for f in f0]}.",
        (f"* Sensitivity of one release (substitution of one row, every draw of Θ): Δ = {diam}·"
         f"sqrt(⌈k/{'(d+C)' if lp else 'd'}⌉) = "
         f"{f0[0]['sensitivity']:.6g}." if p["directions"] == "orthogonal" else
         f"* Sensitivity of one release (substitution of one row, probability ≥ 1 − δ_tail over Θ, {p['bound']} "
         f"bound): Δ = {diam}·sqrt(w(k, δ_tail)) = {f0[0]['sensitivity']:.6g}.") if p["private"] else
        "* Sensitivity: not applicable (no noise).",
        ("* Noise multiplier: each class flow's z_c = σ_c/Δ is calibrated by "
         "`fastdpot.privacy.calibrate_noise_multiplier` so that T steps at its sample rate q_c = B/n_c spend the "
         "target ε. z_c, σ_c and q_c are functions of the private class sizes n_c and are not published."
         if cond else
         f"* Noise multiplier z = σ/Δ: {zs} (calibrated by `fastdpot.privacy.calibrate_noise_multiplier` so that T "
         f"steps spend the target ε); σ = {[round(f['noise_std'], 6) for f in f0]}.") if p["private"] else "",
        "",
        "## Guarantee and accountant",
        "",
    ]
    if not p["private"]:
        lines += ["* None (ε = ∞): σ = 0 and nothing is accounted; the particles are a deterministic function of the "
                  "private latents, the batches and the directions."]
    if p["private"]:
        lines += [
            (f"* Target (ε, δ) = ({cfg.epsilon}, {cfg.delta}); **ε spent ≤ {cfg.epsilon}** at total δ = {cfg.delta} "
             "(every class flow's budget refuses a step that would exceed the target; the exact per-class ε depends "
             "on n_c and is not published)." if cond else
             f"* Target (ε, δ) = ({cfg.epsilon}, {cfg.delta}); **ε spent = {result['epsilon']:.4f}** at total "
             f"δ = {cfg.delta}."),
            (f"* δ: all of it ({f0[0]['delta_accountant']:.3g}) goes to the accountant; the sensitivity holds for "
             f"every Θ, so no tail is spent." if p["directions"] == "orthogonal" else
             f"* δ split: δ = δ_acc + T·δ_tail with δ_acc = {f0[0]['delta_accountant']:.3g} for the accountant and "
             f"δ_tail = {f0[0]['delta_tail_per_step']:.3g} per step for the sensitivity tail over Θ (union bound "
             f"over the T draws of Θ)."),
            "* Accountant: RDP (dp-accounting) of the Gaussian mechanism subsampled without replacement, sample rate "
            + ("q_c = B/n_c per class flow" if cond else f"q = B/n = {round(f0[0]['sample_rate'], 5)}")
            + ", composed over every step taken.",
        ]
        if cond:
            lines += ["* Class conditioning: one flow per label on its own partition. By parallel composition the "
                      "whole release is (ε, δ)-DP with the largest per-class ε, for neighbouring data sets that "
                      "differ in ONE IMAGE WITH ITS LABEL UNCHANGED (label-preserving replace-one). The labels and "
                      "the class sizes n_c (which set each flow's q_c and z_c) are ASSUMED PUBLIC. Under the "
                      "standard relations (add/remove one labelled image, or replace one with its label free to "
                      "change) the labels and class sizes are NOT protected. What this run publishes avoids them: "
                      "B = min(batch size, ⌊n/(2C)⌋), T from n/C, particles per class proportional to the PUBLIC "
                      "half's class counts; no per-class z, σ, q or ε is written."]
        if lp:
            lines += ["* Class conditioning (label-private): ONE flow on the rows [latent, c·e_label]. The whole "
                      "release is (ε, δ)-DP for neighbouring data sets that differ by the REPLACEMENT OF ONE "
                      "LABELLED IMAGE (x, y) BY ANY (x', y'), ITS LABEL FREE TO CHANGE (replace-one; the private "
                      "set's size n is public). The labels and the class sizes are protected: B, T, q = B/n, z, σ "
                      "and Δ are functions of n only; the number of classes C and the particles that start in each "
                      "class come from the PUBLIC half's labels; the generated class proportions come out of the "
                      "flow (post-processing). Nothing computed from the private class counts is used or written."]
    lines += [
        "",
        "## Outside the guarantee (public by assumption)",
        "",
        "* The public half of the training set and everything trained on it: the auto-encoder (architecture, "
        "weights, latent space) is fitted on the public half only and is public.",
        "* The real test set, used for FID and downstream accuracy, is public.",
        ("* The centres (the public half's mean latent of each class) are public statistics, and r "
         + ("is one too (the median distance of the public latents to their class centre)" if cfg.clip_radius is None
            else "was given")
         + "; the released particles live in the shifted space and get their class's centre added back "
           "(post-processing)." if p.get("center") == "public" else None),
        f"* The particle initialisation `{cfg.init}` ({_init_text(cfg.init, cfg.init_scale)}), drawn from the "
        "flow's seeded generator independently of the data (no privacy cost), and all randomness not applied to "
        "private data.",
        "* Post-processing of the released particles (no privacy cost): "
        + ("each class's particles are rescaled about their own mean by a factor s_c chosen so that their spread "
           "on the unit sphere equals that of the PUBLIC half's latents of the class (s_c = "
           f"{[round(v, 4) for v in result['metrics']['spread_scales']]}); the spread of the samples comes from "
           "public data, their class means and shapes from the private flow; " if cfg.spread == "public" else "")
        + ("the particles are scaled onto the unit sphere and decoded by the public decoder." if cfg.decode_on_sphere
           else "the particles are decoded by the public decoder."),
        "* Not claimed: amplification by the diffusion term (paper Thm. 3; λ = 0 here anyway); floating-point "
        "attacks on Gaussian sampling (Mironov 2012).",
        "",
    ]
    return "\n".join(ln for ln in lines if ln is not None)


def write_outputs(run_dir: str, cfg: PipelineConfig, result: Dict[str, Any], images: torch.Tensor,
                  labels: Optional[torch.Tensor], class_names=None) -> Dict[str, str]:
    """Write ``samples.png``, ``metrics.json`` and ``privacy.md`` into ``run_dir``; returns their paths."""
    os.makedirs(run_dir, exist_ok=True)
    grid = samples_grid(images, labels, generator=torch.Generator().manual_seed(cfg.seed + 3))
    names = None
    if labels is not None:
        C = int(labels.max()) + 1
        names = list(class_names) if class_names and len(class_names) == C else [str(c) for c in range(C)]
    eps_txt = ("inf (non-private)" if math.isinf(cfg.epsilon) else
               f"≤ {cfg.epsilon:g}" if _per_class(result["privacy"]) else f"{result['epsilon']:.2f}")
    what = {"flow": "DPSWflow-r", "gaussian": "DP Gaussian per class", "public": "public-only"}[cfg.method]
    title = (f"{result['dataset']}: {what}, ε = {eps_txt}, δ = {cfg.delta:g}" if cfg.method != "public" else
             f"{result['dataset']}: public-only baseline (no private data)")
    paths = dict(samples=os.path.join(run_dir, "samples.png"), metrics=os.path.join(run_dir, "metrics.json"),
                 privacy=os.path.join(run_dir, "privacy.md"))
    _save_grid_png(grid, paths["samples"], names, title)
    with open(paths["metrics"], "w") as f:
        json.dump(result["metrics"], f, indent=2, default=_json_default)
        f.write("\n")
    with open(paths["privacy"], "w") as f:
        if cfg.method == "flow":
            f.write(_privacy_md(cfg, result))
        else:
            from .baselines import baseline_privacy_md

            f.write(baseline_privacy_md(cfg, result))
    return paths


def _json_default(o):
    if isinstance(o, float) and math.isinf(o):
        return "inf"
    if isinstance(o, torch.Tensor):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _finite(v):
    """JSON has no inf: write it as the string "inf"."""
    if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
        return str(v)
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def seed_summary(rows) -> Dict[str, Dict[str, float]]:
    """{metric: {mean, std (sample, ddof 1; 0 for one seed), min, max, n}} over the per-seed rows' fid and
    accuracy_* values."""
    keys = [k for k in (rows[0] if rows else {}) if k == "fid" or k.startswith("accuracy_")]
    out = {}
    for k in keys:
        v = torch.tensor([float(r[k]) for r in rows], dtype=torch.float64)
        out[k] = dict(mean=float(v.mean()), std=float(v.std()) if v.numel() > 1 else 0.0, min=float(v.min()),
                      max=float(v.max()), n=int(v.numel()))
    return out


def run_pipeline(cfg: PipelineConfig, run_dir: str, progress: bool = True,
                 cache_dir: Optional[str] = None, data: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Run every stage and write the outputs into ``run_dir``; returns the metrics dict (also in metrics.json).

    The flow stage checkpoints to ``run_dir/private/flow_checkpoint.pt`` every ``cfg.checkpoint_every`` steps;
    calling again with the same ``run_dir`` and config resumes the flow from it (data split and auto-encoder are
    deterministic and cached). ``private/`` holds private artefacts (the checkpoint: particles mid-run, the
    generator state that replays every draw with ``replayable_noise``; ``flows.json``: per-class n_c, q_c, z_c, ε_c):
    keep it with the private data, never publish it. ``samples.png``, ``metrics.json``, ``privacy.md`` and
    ``config.json`` are the publishable outputs.
    ``data`` replaces :func:`stage_data`'s output (a dict with ``public``, ``private``, ``test`` and ``dataset``;
    :mod:`fastdpot.tuning` passes splits of the public half).

    Raises:
        ValueError: invalid configuration (see :meth:`PipelineConfig.resolved`).
    """
    from tqdm.auto import tqdm

    cfg = cfg.resolved()
    os.makedirs(run_dir, exist_ok=True)
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    times: Dict[str, float] = {}
    stages = tqdm(total=5, desc="pipeline", disable=not progress, position=0)

    def mark(name, t0):
        times[name] = round(time.perf_counter() - t0, 2)
        stages.update(1)
        stages.set_postfix_str(f"{name} done in {times[name]:.0f}s")

    cfg_path = os.path.join(run_dir, "config.json")
    private_dir = os.path.join(run_dir, "private")
    ckpt = os.path.join(private_dir, "flow_checkpoint.pt")
    legacy_ckpt = os.path.join(run_dir, "flow_checkpoint.pt")
    if os.path.isfile(legacy_ckpt) and not os.path.isfile(ckpt):  # folders older than private/: move it there
        os.makedirs(private_dir, exist_ok=True)
        os.replace(legacy_ckpt, ckpt)
    if os.path.isfile(ckpt):
        with open(cfg_path) as f:
            old = json.load(f)
        # folders older than `init` / `center` ran N(0, I_d) starts / unit-sphere latents; older than secure mode
        # drew every privacy draw from the seed (replayable); older than `release` released points
        legacy = {"init": "gaussian", "init_scale": 1.0, "center": "none", "clip_radius": None,
                  "replayable_noise": True, "release": "points", "num_bins": None, "method": "flow",
                  "public_size": None, "labels": "public", "label_scale": 1.0}
        scoring = ("flow_seeds", "classifiers", "cnn_epochs")  # do not change the checkpointed flow
        strip = lambda c: {k: v for k, v in c.items() if k not in scoring}  # noqa: E731
        if strip({**legacy, **old}) != strip(_finite(asdict(cfg))):
            raise ValueError(f"{run_dir!r} holds a flow checkpoint of a different config; use another --name or "
                             f"delete the folder")
    with open(cfg_path, "w") as f:
        json.dump(_finite(asdict(cfg)), f, indent=2)

    t0 = time.perf_counter()
    data = stage_data(cfg) if data is None else data  # given: the tuning protocol's stand-in split
    mark("data", t0)
    t0 = time.perf_counter()
    ae = stage_autoencoder(cfg, data, progress=progress, cache_dir=cache_dir)
    mark("autoencoder", t0)
    n_particles = cfg.num_particles or len(data["test"])
    labels = ae["labels"] if cfg.class_conditional else None
    centers, radius = None, None
    if cfg.center == "public" and cfg.method != "public":
        nc = (None if labels is None else int(ae["public_labels"].max()) + 1 if cfg.labels == "private" else
              int(max(int(labels.max()), int(ae["public_labels"].max()))) + 1)  # label-private: C from public labels
        centers, radius = public_centers(ae["public_latents"], None if labels is None else ae["public_labels"],
                                         cfg.clip_radius, num_classes=nc)
    fid_cache = os.path.join(cache_dir, "fid_real_stats",
                             f"{data['dataset'].replace(':', '_').replace('/', '_')}_n{cfg.fid_real}.npz")
    os.makedirs(private_dir, exist_ok=True)
    per_seed = []
    for i in range(cfg.flow_seeds):  # the first seed is the run's (its checkpoint, samples.png, top-level metrics)
        seed = cfg.seed + 1 + i
        t0 = time.perf_counter()
        if cfg.method == "flow":
            path = ckpt if i == 0 else os.path.join(private_dir, f"flow_checkpoint_seed{seed}.pt")
            fl_i = stage_flow(cfg, ae["latents"], labels, n_particles, checkpoint_path=path, progress=progress,
                              centers=centers, clip_radius=radius, seed=seed,
                              public_labels=ae["public_labels"] if labels is not None else None)
            if i == 0:  # per-flow values: private (they depend on the class sizes n_c)
                with open(os.path.join(private_dir, "flows.json"), "w") as f:
                    json.dump(_finite(fl_i["privacy"]["flows"]), f, indent=2, default=_json_default)
        else:
            from .baselines import stage_baseline

            fl_i = stage_baseline(cfg, ae, n_particles, seed, centers=centers, clip_radius=radius)
        if i == 0:
            mark("flow", t0)
        t0 = time.perf_counter()
        samples, scales_i = fl_i["samples"], None
        if cfg.spread == "public" and cfg.method == "flow":
            samples, scales_i = calibrate_spread(samples, fl_i["sample_labels"], ae["public_latents"],
                                                 ae["public_labels"] if fl_i["sample_labels"] is not None else None)
        images_i = stage_decode(ae["model"], samples, device=cfg.device, on_sphere=cfg.decode_on_sphere)
        if i == 0:
            mark("decode", t0)
        t0 = time.perf_counter()
        met_i = stage_metrics(cfg, images_i, fl_i["sample_labels"], data["test"], fid_cache=fid_cache,
                              progress=progress)
        if i == 0:
            mark("metrics", t0)
            fl, spread_scales, images, met = fl_i, scales_i, images_i, met_i
        per_seed.append(dict(flow_seed=seed, **{k: v for k, v in met_i.items()
                                                if k == "fid" or k.startswith("accuracy_")}))
    stages.close()

    p = fl["privacy"]
    cond = bool(p.get("class_conditional", cfg.class_conditional)) and (cfg.method != "flow" or _per_class(p))
    label_private = cfg.method == "flow" and bool(p.get("class_conditional")) and not cond
    private = bool(p["private"])
    # class-conditional: z_c, σ_c, q_c = B/n_c and the exact ε_c are functions of the private class sizes: not
    # published (they are in private/flows.json); ε spent is reported as the guaranteed bound, the target
    eps_spent = (cfg.epsilon if private else math.inf) if cond and cfg.method == "flow" else fl["epsilon"]
    common = dict(
        dataset=data["dataset"], method=cfg.method, n_public=len(data["public"]), n_private=len(data["private"]),
        public_size=cfg.public_size, n_test=len(data["test"]), split_seed=cfg.seed, seed=cfg.seed,
        flow_seed=cfg.seed + 1, quick=cfg.quick, private=private, epsilon_target=cfg.epsilon,
        epsilon_spent=eps_spent, epsilon_spent_is_bound=bool(cond and private and cfg.method == "flow"),
        delta=cfg.delta,
        noise="replayable from seed: NO privacy guarantee against anyone who holds the seed or the checkpoint"
              if cfg.replayable_noise else "secret (operating-system CSPRNG; not stored)",
        neighbouring_relation=("replace one image, its label unchanged (labels and class sizes assumed public)"
                               if cond else
                               "replace one labelled image (x, y) by any (x', y'), its label free to change (n "
                               "public; labels and class sizes protected)" if label_private else
                               "replace one image (substitution)"),
        num_particles=int(fl["samples"].shape[0]), latent_dim=int(ae["latents"].shape[1]), center=cfg.center,
        clip_radius=radius,
        autoencoder=dict(ae["config"], cached=ae["info"]["cached"], train_bce=ae["info"]["train_loss"],
                         test_recon_mse=ae["recon_mse"]),
        flow_resumed=fl["resumed"], wall_time_s=dict(times, total=round(sum(times.values()), 2)),
        device=cfg.device, torch_threads=torch.get_num_threads(), machine=platform.machine(),
        seeds=per_seed, seed_summary=seed_summary(per_seed))
    if cfg.method == "flow":
        per_flow = {} if cond else dict(noise_multiplier=p["flows"][0]["noise_multiplier"],
                                        noise_std=p["flows"][0]["noise_std"],
                                        sample_rate=p["flows"][0]["sample_rate"])
        specific = dict(
            steps=p["steps"], steps_taken=[f["steps_taken"] for f in p["flows"]], batch_size=p["batch_size"],
            **per_flow, sensitivity=p["flows"][0]["sensitivity"],
            accountant="rdp (dp-accounting), sampled without replacement, substitution neighbours",
            class_conditional=cond or label_private, labels=p.get("labels"), label_scale=p.get("label_scale"),
            num_projections=p["num_projections"], step_size=p["step_size"], reg=cfg.reg,
            epochs=cfg.epochs, init=cfg.init, init_scale=cfg.init_scale, release=cfg.release,
            num_bins=cfg.num_bins, spread=cfg.spread, spread_scales=spread_scales)
    else:
        specific = dict(class_conditional=cfg.class_conditional, noise_std=p.get("noise_std"),
                        sensitivity=p.get("sensitivity"),
                        accountant=("Gaussian mechanism, one release per class (analytic σ), parallel composition, "
                                    "replace-one neighbours keeping the label" if cfg.method == "gaussian" else
                                    "none: no private data used"))
    metrics = _finite(dict(common, **specific, **met))
    result = dict(metrics=metrics, privacy=p, epsilon=fl["epsilon"], dataset=data["dataset"],
                  n_public=len(data["public"]), n_private=len(data["private"]),
                  latent_dim=int(ae["latents"].shape[1]))
    write_outputs(run_dir, cfg, result, images, fl["sample_labels"], data["test"].class_names)
    return metrics
