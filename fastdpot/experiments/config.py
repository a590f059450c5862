"""The main job's settings: :class:`PipelineConfig` (one run of ``fastdpot flow``), its defaults and checks.

The same defaults serve the Python API (:func:`fastdpot.experiments.pipeline.run_pipeline`) and the command line
(:mod:`fastdpot.experiments.cli` builds its options from a default :class:`PipelineConfig`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from .._validate import check_choice, check_delta, check_epsilon, check_int, check_nonnegative, check_positive
from ..flows import INIT_KINDS
from .metrics import CLASSIFIERS, CNN_ARCHS

__all__ = ["PipelineConfig", "METHODS", "DEFAULT_SKETCH_BINS"]

METHODS = ("flow", "gaussian", "public", "decoded")  # "decoded": the private-only protocol's analysis (not private)
AE_ARCHS = ("conv", "convbn", "dcgan")  # fastdpot.experiments.autoencoder's architectures
DEFAULT_SKETCH_BINS = 5  # L of the default sketch release: chosen by the public-only sweep (docs/mainjob/tuning.md)


def resolve_labels(labels: Optional[str], method: str) -> Optional[str]:
    """The label mode a config runs: ``labels`` itself, or for None (the default) ``"private"`` for the flow (secure
    by default: labels and class sizes protected) and ``"public"`` for the per-class baselines, which have no
    label-private mode."""
    if labels is None:
        return "private" if method == "flow" else "public"
    return labels


@dataclass
class PipelineConfig:
    """Settings of one run (defaults: Sebag et al., TMLR, Fashion-MNIST DPSWflow-r at (ε, δ) = (10, 1e-5), except the
    release (the sliced quantile sketch with L = 5 bins, chosen on public data only, see ``release``), the
    flow's directions (one block of k = d orthogonal directions per step, deterministic sensitivity 2), h = 0.3,
    B = 100, 10 epochs, a small data-independent start N(0, 0.3²·I_d/d) with no spread calibration (``spread="flow"``:
    nothing taken from public statistics after the flow), and the auto-encoder's 10 epochs: chosen by the ε = 10
    sweeps recorded in results/mainjob/NOTES.md).

    Attributes:
        dataset: "auto", "fashion-mnist", "idx", "celeba", "digits", "lfw" (see
            :func:`fastdpot.experiments.data.load_dataset`).
        data_dir: folder of MNIST-format idx files; celeba_dir: folder of aligned CelebA JPEGs.
        epsilon: target ε (``inf``: the non-private flow, σ = 0). delta: total δ.
        latent_dim: d. num_projections: k. step_size: h. reg: λ. batch_size: B private rows per step.
        epochs: passes over the private half; T = round(epochs · n / B) steps (n per class when class-conditional).
        num_particles: N (None: the size of the real test set).
        class_conditional: a class-conditional flow when the data are labelled (see ``labels``).
        labels: how the class-conditional flow treats the labels (:class:`fastdpot.flows.ClassConditionalFlow`'s
            ``label_privacy``). ``None`` (default): ``"private"`` for the flow, ``"public"`` for the per-class
            baselines (``method="gaussian"``, which has no label-private mode). ``"public"``: one flow per label on
            its partition (parallel composition),
            for neighbours that differ in one image with its label unchanged; the labels and class sizes are
            ASSUMED PUBLIC. ``"private"``: one flow on the rows [latent, c·onehot(label)] in R^{d+C}, for neighbours
            that differ by the replacement of one labelled image, its label free to change (labels and class sizes
            protected; C is taken from the public half's labels; nothing computed from private class counts is
            used or published). label_scale: c > 0 for ``"private"`` (public; Δ = sqrt(4r² + 2c²)·sqrt(⌈k/(d+C)⌉)).
        ae_arch: the auto-encoder (:mod:`fastdpot.experiments.autoencoder`): ``"conv"`` (the DPSWflow code's AE) or
            ``"convbn"`` for 28/32 px images, ``"dcgan"`` for 64 px; None: the default for the image size.
        ae_epochs, ae_max_train: auto-encoder training (public half only).
        ae_width: the auto-encoder's base channel count w (``convbn``: w, 2w, 4w channels; ``dcgan``: w … 8w;
            None: the architecture's default, 32 for ``convbn``, 64 for ``dcgan``; ``conv`` has a fixed width).
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
            seeds each: FID 88.5 vs 89.2, MLP 64.3 % vs 65.3 %, within the seeds' spread; results/mainjob/NOTES.md).
        clip_radius: r > 0 for ``center="public"`` (latent units; the latents have norm 1). None: the median of the
            public half's distances to their class means (a public statistic; 0.43 for the default Fashion-MNIST
            auto-encoder, so about half of the private rows are clipped).
        release, sketch_bins: the flows' per-step release (:class:`fastdpot.flows.DPSlicedWassersteinFlow`):
            ``"sketch"`` (default: the sliced quantile sketch with L = ``sketch_bins`` bins per direction, <= the
            batch size; None: L = min(5, B)) or ``"points"`` (the B·k noisy projections; ``sketch_bins`` must be
            None); same Δ, σ and accounting. The defaults (sketch, L = 5, with h = 0.3) were chosen by the
            public-only sweep of docs/mainjob/tuning.md (``python -m fastdpot.experiments.tuning``; stand-in private and
            held-out parts of the public half, ε = 10, ranked by the held-out MLP accuracy: sketch L = 5 71.2 %,
            L = 10 70.8 %, points 63.4 % at h = 0.3; h = 0.1 was worse for both releases); before that sweep the
            default was ``"points"``, chosen on test-set scores.
        init, init_scale: the flows' data-independent start (:func:`fastdpot.flows.draw_init`, drawn from the
            flow's seeded generator, no privacy cost), s = init_scale > 0 (latent units; the latents have norm 1):
            ``"gaussian"`` N(0, s²·I_d), ``"sphere"`` uniform on the sphere of radius s, ``"gaussian_scaled"``
            N(0, (s²/d)·I_d) (E‖x‖² = s²).
        method: ``"flow"`` (the DP flow; ε = ∞ gives the non-private flow), ``"gaussian"`` (baseline: the DP
            Gaussian per class in the same latent space, :func:`fastdpot.experiments.baselines.dp_class_gaussians`, rows
            bounded as the flow's: unit sphere, or public centres and radius r with ``center="public"``) or ``"public"``
            (baseline: the public half's own labelled latents, decoded; no private data, no privacy cost).
        public_size: number of public training images (the auto-encoder's training set); None: half of them.
        flow_seeds: run the generation stage (flow or baseline) with this many seeds cfg.seed + 1, cfg.seed + 2, …
            on the same data split and auto-encoder; metrics.json reports each seed and their mean / spread.
        classifiers: comma-separated downstream classifiers (``logreg``, ``mlp``, ``cnn``); cnn_epochs: the CNN's;
            cnn_augment: train the CNN with shift/flip augmentation (:func:`fastdpot.experiments.metrics.cnn_accuracy`).
            cnn_arch: the evaluation CNN, ``"small"`` or ``"dropout"`` (:func:`fastdpot.experiments.metrics.cnn_accuracy`).
        public_size=0 selects the private-only protocol (:mod:`fastdpot.experiments.private_only`; δ = None there
            means DPImageBench's 1/(N ln N)); its settings: validation_size (the tuning split's size),
            representation_share (the fraction of ε the representation is calibrated to alone; None: 0.3 for
            DP-PCA, 0.9 for the auto-encoder), rep_lowpass (DP-PCA of the K × K lowest DCT frequencies), rep_kind
            (``"pca"``: DP-PCA, one release; ``"autoencoder"``: DP-SGD), rep_scale (PCA's image scale S), rep_epochs,
            rep_batch_size, rep_clip_radius, rep_lr, rep_label_weight (the auto-encoder's DP-SGD; all:
            :class:`fastdpot.experiments.dp_representation.RepresentationConfig`), labels_from (``"flow"``: the
            flow's label block; ``"head"``: the DP representation's head labels the decoded particles).
    """
    dataset: str = "auto"
    data_dir: Optional[str] = None
    celeba_dir: Optional[str] = None
    epsilon: float = 10.0
    delta: Optional[float] = None
    latent_dim: Optional[int] = None
    num_projections: Optional[int] = None
    step_size: Optional[float] = None
    diffusion: float = 0.0
    batch_size: int = 100
    epochs: float = 10.0
    num_particles: Optional[int] = None
    class_conditional: bool = True
    labels: Optional[str] = None
    label_scale: float = 1.0
    ae_arch: Optional[str] = None
    ae_epochs: int = 10
    ae_width: Optional[int] = None
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
    sketch_bins: Optional[int] = None
    method: str = "flow"
    public_size: Optional[int] = None
    flow_seeds: int = 1
    classifiers: str = "logreg,mlp,cnn"
    cnn_epochs: int = 5
    cnn_augment: bool = False
    cnn_arch: str = "small"
    validation_size: int = 5000
    representation_share: Optional[float] = None
    rep_kind: str = "pca"
    rep_scale: float = 16.0
    rep_lowpass: Optional[int] = None
    rep_epochs: float = 10.0
    rep_batch_size: int = 1024
    rep_clip_radius: float = 1.0
    rep_lr: float = 2e-3
    rep_label_weight: float = 0.5
    labels_from: str = "flow"

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
            c.validation_size = min(c.validation_size, 500)
            c.rep_epochs = min(c.rep_epochs, 1.0)
            c.rep_batch_size = min(c.rep_batch_size, 256)
        c.epsilon = check_epsilon(c.epsilon, "epsilon", allow_inf=True)
        private_only = c.public_size == 0
        if c.delta is None and not private_only:  # the public-half protocol's δ; private-only: 1/(N ln N) at run
            c.delta = 1e-5
        if c.delta is not None:
            c.delta = check_delta(c.delta)
        check_int(c.batch_size, "batch_size")
        check_positive(c.epochs, "epochs")
        check_int(c.ae_epochs, "ae_epochs")
        if c.ae_width is not None:
            check_int(c.ae_width, "ae_width")
            if c.ae_arch == "conv":
                raise ValueError("ae_width does not apply to ae_arch='conv' (fixed width); leave it None")
        if c.ae_arch is not None:
            check_choice(c.ae_arch, "ae_arch", AE_ARCHS)
        check_int(c.fid_samples, "fid_samples", 2)
        check_int(c.fid_real, "fid_real", 2)
        check_int(c.checkpoint_every, "checkpoint_every")
        check_choice(c.device.split(":")[0], "device", ("cpu", "cuda"))
        if c.num_particles is not None:
            check_int(c.num_particles, "num_particles", 2)
        check_nonnegative(c.diffusion, "diffusion")
        check_choice(c.spread, "spread", ("public", "flow"))
        check_choice(c.directions, "directions", ("orthogonal", "uniform"))
        check_choice(c.init, "init", INIT_KINDS)
        c.init_scale = check_positive(c.init_scale, "init_scale")
        check_choice(c.center, "center", ("public", "none"))
        if not isinstance(c.replayable_noise, bool):
            raise ValueError(f"replayable_noise must be a bool, got {c.replayable_noise!r}")
        check_choice(c.release, "release", ("points", "sketch"))
        if c.release == "sketch":
            if c.sketch_bins is None:
                c.sketch_bins = min(DEFAULT_SKETCH_BINS, c.batch_size)
            check_int(c.sketch_bins, "sketch_bins", 1)
            if c.sketch_bins > c.batch_size:
                raise ValueError(f"sketch_bins must be <= batch_size = {c.batch_size}, got {c.sketch_bins}")
        elif c.sketch_bins is not None:
            raise ValueError(f"sketch_bins is only used with release='sketch', got sketch_bins={c.sketch_bins!r}")
        check_choice(c.method, "method", METHODS)
        c.labels = "private" if private_only and c.labels is None else resolve_labels(c.labels, c.method)
        check_choice(c.labels, "labels", ("public", "private"))
        c.label_scale = check_positive(c.label_scale, "label_scale")
        if c.labels == "private" and c.method != "flow" and not private_only:
            raise ValueError(f"labels='private' is a mode of the flow (method='flow'), got method={c.method!r}")
        if c.public_size is not None:
            check_int(c.public_size, "public_size", 0)
        if private_only:
            check_int(c.validation_size, "validation_size")
            check_choice(c.labels_from, "labels_from", ("flow", "head"))
            check_choice(c.rep_kind, "rep_kind", ("pca", "autoencoder", "dct"))
            check_positive(c.rep_scale, "rep_scale")
            if c.labels != "private":
                raise ValueError("public_size=0 (the private-only protocol) protects the labels: labels='private'")
            if c.method == "public":
                raise ValueError("method='public' needs public images; public_size=0 has none")
            for name in ("rep_epochs", "rep_clip_radius", "rep_lr"):
                check_positive(getattr(c, name), name)
            check_int(c.rep_batch_size, "rep_batch_size")
            check_nonnegative(c.rep_label_weight, "rep_label_weight")
            if c.representation_share is None:  # tuned on the validation split (docs/mainjob-private.md)
                c.representation_share = 0.3 if c.rep_kind == "pca" else 0.9
            if not 0 < c.representation_share < 1:
                raise ValueError(f"representation_share must be in (0, 1), got {c.representation_share!r}")
        elif c.method == "decoded":
            raise ValueError("method='decoded' (an analysis of the representation) belongs to public_size=0")
        check_int(c.flow_seeds, "flow_seeds")
        check_int(c.cnn_epochs, "cnn_epochs")
        check_choice(c.cnn_arch, "cnn_arch", CNN_ARCHS)
        if not isinstance(c.cnn_augment, bool):
            raise ValueError(f"cnn_augment must be True or False, got {c.cnn_augment!r}")
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
