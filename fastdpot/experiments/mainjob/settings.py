"""The stages' settings of the main job (one frozen dataclass per stage) and the private-only protocol's ε table;
:class:`~fastdpot.experiments.mainjob.config.MainJobConfig` holds one of each."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Optional

__all__ = ["DataSettings", "RepresentationSettings", "GenerationSettings", "EvaluationSettings", "METHODS",
           "PROTOCOLS", "AE_ARCHS", "REPRESENTATION_KINDS", "DEFAULT_SKETCH_BINS", "PRIVATE_ONLY_TABLE", "table_row",
           "PHOTO_DATASETS", "photographs",
           "PRIVATE_ONLY_SETTINGS", "PUBLIC_HALF_SETTINGS", "ONESHOT_SETTINGS", "SKETCH_CENTERS", "SKETCH_CLAMPS",
           "SKETCH_SHRINKS",
           "FLOW_ONLY_SETTINGS", "MAX_FLOW_STEPS", "QUICK_SKETCH_ROUNDS", "QUICK_SKETCH_BLOCKS", "steps_duration"]

#: ``"decoded"``: the private-only protocol's ANALYSIS of its representation (the sensitive codes decoded: NOT private)
METHODS = ("oneshot", "flow", "gaussian", "public", "decoded")
PROTOCOLS = ("public-half", "private-only")
AE_ARCHS = ("conv", "convbn", "dcgan")  # fastdpot.experiments.mainjob.autoencoder's architectures
REPRESENTATION_KINDS = ("pixels", "pca", "autoencoder", "dct")  # the private-only protocol's code spaces
DEFAULT_SKETCH_BINS = 5  # L of the default per-step sketch release: the public-only sweep (docs/mainjob/tuning.md)
SKETCH_CENTERS = ("mean", "half")  # the one-shot release's centres: the released class means, the grey image 0.5
SKETCH_CLAMPS = ("step", "end")  # the one-shot flows: clamp to [0, 1] after every step, or only the final images
SKETCH_SHRINKS = ("pooled", "stein")  # the one-shot tables' shrinkage (ClassSketchRelease.quantile_tables)


def _oneshot(text: str, choices=None, default_text: Optional[str] = None):
    """A setting of the one-shot method (default None: the ε table's value, or ``default_text``): it joins
    :data:`ONESHOT_SETTINGS` and :data:`PRIVATE_ONLY_SETTINGS`, and its help ``text`` and ``choices`` make it a named
    option of ``fastdpot flow``."""
    return field(default=None, metadata=dict(method="oneshot", help=text, choices=choices, default_text=default_text))


@dataclass(frozen=True)
class DataSettings:
    """The data and the split.

    Attributes:
        dataset: "auto", "fashion-mnist", "idx", "celeba", "digits", "lfw"
            (:func:`fastdpot.experiments.data.load_dataset`). data_dir: a folder of MNIST-format idx files;
            celeba_dir: a folder of aligned CelebA JPEGs. max_train / max_test: use the first N images only.
        public_size: public training images, the rest private (None: half; the public-half protocol).
            0 selects the private-only protocol (DPImageBench: no public image at all).
        validation_size: private-only: the validation (tuning) split taken from the training set.
    """
    dataset: str = "auto"
    data_dir: Optional[str] = None
    celeba_dir: Optional[str] = None
    max_train: Optional[int] = None
    max_test: Optional[int] = None
    public_size: Optional[int] = None
    validation_size: int = 5000


@dataclass(frozen=True)
class RepresentationSettings:
    """The code space the generator runs in.

    Attributes:
        latent_dim: d (None: 16 for the public auto-encoder at 28/32 px, 48 at 64 px; 32 for DP-PCA, 16 for the DP
            auto-encoder).
        ae_arch, ae_epochs, ae_width, ae_max_train: public-half: the auto-encoder trained on the public half
            (:mod:`fastdpot.experiments.mainjob.autoencoder`; arch None: by image size).
        kind, scale, lowpass, epochs, batch_size, clip_radius, lr, label_weight, share: private-only: the code space
            (None: ``"pixels"`` for the one-shot method, public and released nothing; ``"pca"`` for the others) and
            the DP representation's settings
            (:class:`fastdpot.experiments.mainjob.representation.RepresentationConfig` documents each; ``share``:
            the fraction of ε it is calibrated to alone; latent_dim and share None: the ε table
            :data:`PRIVATE_ONLY_TABLE` for DP-PCA, 16 and 0.9 for the auto-encoder).
    """
    latent_dim: Optional[int] = None
    ae_arch: Optional[str] = None
    ae_epochs: int = 10
    ae_width: Optional[int] = None
    ae_max_train: Optional[int] = None
    kind: Optional[str] = None
    scale: float = 16.0
    lowpass: Optional[int] = None
    epochs: float = 10.0
    batch_size: int = 1024
    clip_radius: float = 1.0
    lr: float = 2e-3
    label_weight: float = 0.5
    share: Optional[float] = None


@dataclass(frozen=True)
class GenerationSettings:
    """The generator run on the private codes.

    Attributes:
        method: None (``"oneshot"`` in the private-only protocol, ``"flow"`` in the public-half one),
            ``"oneshot"`` (private-only: the whole sensitive set released once as per-class sliced quantile sketches,
            then flows in pixel space: :mod:`fastdpot.experiments.mainjob.oneshot`), ``"flow"`` (the per-step DP
            flow, DPSWflow-r; ε = ∞ the non-private flow), ``"gaussian"`` (the DP Gaussian per class in the same code
            space), ``"public"`` (public-half: the public half's own codes decoded, no private data), ``"decoded"``
            (private-only ANALYSIS: the sensitive codes decoded, not private).
        num_particles: N (None: the size of the test set; 60 000 in the private-only protocol, as DPImageBench).
        class_conditional: one flow per class, or one label-private flow, when the data are labelled.
        labels: ``"private"`` (the flow's default: one flow on [code, c·onehot(label)], labels and class sizes
            protected) or ``"public"`` (per-class flows and baselines: labels and class sizes ASSUMED public).
        label_scale: c > 0 of the label-private flow's label block.
        num_projections, step_size, diffusion, batch_size, epochs, bound, directions, init, init_scale, release,
            sketch_bins: the flow's settings (init_scale None: 0.3 in the public-half protocol, the ε table's in the
            private-only one) (:class:`fastdpot.flows.FlowConfig`; k None: d for d < 32 (d + C
            label-private), 300 above; h None: 0.3 for d < 32, 5 above; T = round(epochs·n/B)).
        center, clip_radius: public-half: ``"public"`` shifts each private code by its class's public mean and clips
            it to r inside the flow; ``"none"``: codes on the unit sphere.
        decode_on_sphere, spread: post-processing of the public-half protocol's particles.
        labels_from: private-only: the samples' labels from the flow's label block or the DP auto-encoder's head.
        flow_seeds: S generation runs on the same split and representation, whose releases compose within the run's
            ε (each calibrated for its share, :func:`fastdpot.experiments.mainjob.generation.seed_budget`), unless
            ``each_seed_at_epsilon`` (then each seed alone is at ε and the published total is their composition).
        checkpoint_every: the flow's checkpoint period in steps.
        sketch_blocks, sketch_plan, sketch_radius, sketch_center, sketch_mean_share, sketch_rounds: the one-shot
            method's directions (``"default"`` or ``"p/sy/sx,..."``), bins by frequency (``"3:16,8:8,inf:2"``), clip
            radius r, centre (``"mean"``: the released class means, ``"half"``: the grey image 0.5), the means'
            share of the budget, and passes over the blocks (None: the ε table :data:`PRIVATE_ONLY_TABLE`);
            sketch_block_directions: directions kept per block (None: all D pixels, a full basis per block).
    """
    method: Optional[str] = None
    num_particles: Optional[int] = None
    class_conditional: bool = True
    labels: Optional[str] = None
    label_scale: float = 1.0
    num_projections: Optional[int] = None
    step_size: Optional[float] = None
    diffusion: float = 0.0
    batch_size: int = 100
    epochs: float = 10.0
    bound: str = "chernoff"
    directions: str = "orthogonal"
    init: str = "gaussian_scaled"
    init_scale: Optional[float] = None
    release: str = "sketch"
    sketch_bins: Optional[int] = None
    center: str = "none"
    clip_radius: Optional[float] = None
    decode_on_sphere: bool = True
    spread: str = "flow"
    labels_from: str = "flow"
    flow_seeds: int = 1
    each_seed_at_epsilon: bool = False
    checkpoint_every: int = 100
    # the one-shot method's settings: ``metadata["help"]`` (and ``"choices"``) make each a named option of
    # ``fastdpot flow`` (fastdpot.experiments.mainjob.cli), its default stated from the ε table
    sketch_blocks: Optional[str] = _oneshot("the blocks of image directions: 'default' (fastdpot.flows.directions."
                                            "default_patches of the image size: 8 blocks at 28 px, patch sides 28 "
                                            "to 2) or 'p/sy/sx,...' (patch side p on a grid shifted by (sy, sx))")
    sketch_plan: Optional[str] = _oneshot("the quantile bins by spatial frequency, 'f:L,...' (directions of frequency "
                                          "<= f cycles per side get L bins; e.g. '3:16,8:8,inf:2')")
    sketch_radius: Optional[float] = _oneshot("r > 0, the clip radius of each image about its centre")
    sketch_center: Optional[str] = _oneshot("each image's centre: mean (its class's released mean) or half (the grey "
                                            "image 0.5)", choices=SKETCH_CENTERS)
    sketch_mean_share: Optional[float] = _oneshot("the class means' share of the one-shot release's budget, in (0, 1) "
                                                  "(with --sketch-center mean)")
    sketch_rounds: Optional[int] = _oneshot("passes of the flows over the blocks (post-processing: no privacy cost)")
    sketch_block_directions: Optional[int] = _oneshot("directions kept per block, the lowest frequencies",
                                                      default_text="all D pixels: a full basis per block")
    sketch_rotations: Optional[int] = _oneshot("random-rotation blocks after the patch blocks (randomised Hadamard "
                                               "transforms, fastdpot.flows.directions.hadamard_blocks, from public "
                                               "seeds): joint structure beyond patches; 0 for none")
    sketch_rotation_bins: Optional[int] = _oneshot("quantile bins of every random-rotation direction (a rotation "
                                                   "mixes all frequencies: one count for all)")
    sketch_clamp: Optional[str] = _oneshot("when the particles are kept in the pixel range [0, 1]: after every flow "
                                           "step, or only at the end (the images)", choices=SKETCH_CLAMPS)
    sketch_shrink: Optional[str] = _oneshot("the shrinkage of the noisy quantile tables (post-processing): pooled "
                                            "(empirical Bayes over each block's frequency bands, locations from all "
                                            "blocks) or stein (James-Stein per direction)", choices=SKETCH_SHRINKS)
    sketch_floor: Optional[float] = _oneshot("t in [0, 1): the final images' pixels darker than t are set to 0, the "
                                             "pixel range's floor (hard thresholding: post-processing, no privacy "
                                             "cost); 0 for none")


@dataclass(frozen=True)
class EvaluationSettings:
    """What a run measures (not part of the release).

    Attributes:
        fid_samples, fid_real: generated and real images in FID (``fid_samples=0``: no FID).
        classifiers: comma-separated downstream classifiers (``logreg``, ``mlp``, ``cnn``; None: ``cnn`` in the
            private-only protocol, all three in the public-half one).
        cnn_epochs, cnn_augment, cnn_arch: the evaluation CNN (:func:`fastdpot.experiments.metrics.cnn_accuracy`;
            ``"small"``, ``"dropout"`` or ``"resnet20"``); ``cnn_epochs`` is its budget: the checkpoint of the best
            accuracy on the selection split within it is scored
            (:func:`fastdpot.experiments.mainjob.evaluation.selection_split`).
    """
    fid_samples: int = 2000
    fid_real: int = 2000
    classifiers: Optional[str] = None
    cnn_epochs: int = 10
    cnn_augment: bool = False
    cnn_arch: str = "small"


#: the one-shot method's own settings (the fields of :class:`GenerationSettings` made by ``_oneshot``)
ONESHOT_SETTINGS = tuple(f.name for f in fields(GenerationSettings) if f.metadata.get("method") == "oneshot")
#: settings that only the private-only protocol reads (``--public-size 0``)
PRIVATE_ONLY_SETTINGS = (("data", "validation_size"), ("representation", "kind"), ("representation", "scale"),
                         ("representation", "lowpass"), ("representation", "epochs"),
                         ("representation", "batch_size"), ("representation", "clip_radius"),
                         ("representation", "lr"), ("representation", "label_weight"), ("representation", "share"),
                         ("generation", "labels_from")) + tuple(("generation", n) for n in ONESHOT_SETTINGS)
#: the DP representation's settings (none of them read with representation kind "pixels")
_DP_REPRESENTATION = tuple(("representation", n) for n in ("latent_dim", "scale", "lowpass", "epochs", "batch_size",
                                                            "clip_radius", "lr", "label_weight", "share"))
#: the per-step flow's settings (none of them read by the one-shot method)
_PER_STEP_FLOW = tuple(("generation", n) for n in ("num_projections", "diffusion", "batch_size", "epochs", "bound",
                                                    "directions", "init", "init_scale", "release", "sketch_bins",
                                                    "label_scale", "labels_from", "checkpoint_every"))
#: the settings that only the per-step flow reads (refused with methods "gaussian", "public" and "decoded")
FLOW_ONLY_SETTINGS = tuple(s for s in _PER_STEP_FLOW if s[1] != "labels_from") + (("generation", "spread"),)
#: the most flow steps a run takes (T = epochs·n/B): more is refused with the time it would take
MAX_FLOW_STEPS = 10 ** 7
#: ``quick``'s one-shot release: at most this many passes over the whole image's and the 7-px blocks
QUICK_SKETCH_ROUNDS, QUICK_SKETCH_BLOCKS = 2, "28/0/0,7/0/0"


def steps_duration(steps: float, seconds_per_step: float = 1e-3) -> str:
    """How long ``steps`` flow steps take at ``seconds_per_step`` (1 ms: a fast step, so that the time stated is an
    estimate from below): ``steps_duration(1e12)`` is ``"at 1 ms a step, 31.7 years"``."""
    t = steps * seconds_per_step
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if t >= size:
            return f"at {seconds_per_step * 1e3:g} ms a step, {t / size:.3g} {unit}"
    return f"at {seconds_per_step * 1e3:g} ms a step, {t:.3g} s"


#: Where the ε table's settings came from, as its rows' ``origins`` say them (each run's privacy.md copies them).
_SWEPT_ONESHOT = ("validation split: the ε table's sweep of the one-shot method (docs/mainjob-private.md, \"The "
                  "one-shot method (2026-11-27)\")")
_SWEPT_PCA = ("validation split: the ε table's sweep of the representation (docs/mainjob-private.md, \"The per-step "
              "flow and the representation\")")
_BY_HAND_SHARE = ("set by hand, not swept (no sweep is recorded): the share of ε that centres the sketch on the DP "
                  "class means, fixed when centring was tried (docs/mainjob-private.md: \"10 % of the budget\", 15 % "
                  "at ε = 1); it reads no data")
_BY_HAND_ROUNDS = ("set by hand, not swept (no sweep is recorded): 4 passes over the blocks, a run-time choice; the "
                   "passes are post-processing of the release and read no data")
_BY_HAND_STEP = ("set by hand, not swept (no sweep is recorded): α = 1 moves every projection of a block onto its "
                 "released quantile (ReleasedTargetFlow), a data-independent choice")
_AT_10 = " (swept at ε = 10 only, where the row's value won; kept for ε = 1)"
_BY_HAND_ROTATION_BINS = "set by hand, not swept (unused while sketch_rotations = 0)"
_BY_HAND_CLAMP = ("set by hand, not swept: 'step', the images clamped to [0, 1] after every step as in the table's "
                  "sweep (post-processing; reads no data)")
_EXPLORED = ("validation split: the 2026-11-28 exploration of the one-shot method's ceiling (docs/mainjob-private.md, "
             "\"Raising the ceiling\": the validation split's fold 0 as the stand-in, the CNN's best epoch on the other "
             "2 500 images)")
_POOLED = ("validation split: the 2026-11-28 evening round on FID and accuracy together (docs/mainjob-private.md, "
           "\"Pooled shrinkage\": fold 0 as the stand-in, 1 000 particles per class, FID of 1 000 against 1 000 "
           "held-out images and the CNN on the 10 000 samples)")
_FLOOR = ("validation split: the 2026-11-28 night round (docs/mainjob-private.md, \"The pixel floor\": the evening's "
          "stand-in, thresholds 0.05 to 0.4 scored by FID of 1 000 against 1 000 held-out images and the CNN on the "
          "10 000 samples)")
#: the data sets of photographs, where the ε table's pixel floor (tuned on Fashion-MNIST's dark backgrounds) is off
#: unless given (``--sketch-floor``): a floor would blacken a face's shadows
PHOTO_DATASETS = ("celeba", "lfw")


def photographs(data: "DataSettings") -> bool:
    """Whether a run reads photographs: ``dataset`` in :data:`PHOTO_DATASETS`, or "auto" with a CelebA folder."""
    return data.dataset in PHOTO_DATASETS or (data.dataset == "auto" and data.celeba_dir is not None)


_NO_FLOOR = ("off for photographs (data sets " + ", ".join(PHOTO_DATASETS) + "): the table's floor is the prior of "
             "Fashion-MNIST's dark backgrounds, where it was tuned")
_ONESHOT_ORIGINS = {
    10.0: dict(sketch_blocks=_SWEPT_ONESHOT, sketch_plan=_EXPLORED, sketch_radius=_SWEPT_ONESHOT,
               sketch_center=_SWEPT_ONESHOT, sketch_mean_share=_BY_HAND_SHARE, sketch_rounds=_BY_HAND_ROUNDS,
               step_size=_BY_HAND_STEP, sketch_rotations=_EXPLORED, sketch_rotation_bins=_POOLED,
               sketch_clamp=_POOLED, sketch_shrink=_POOLED, sketch_floor=_FLOOR),
    1.0: dict(sketch_blocks=_EXPLORED, sketch_plan=_SWEPT_ONESHOT, sketch_radius=_SWEPT_ONESHOT,
              sketch_center=_SWEPT_ONESHOT + _AT_10, sketch_mean_share=_BY_HAND_SHARE, sketch_rounds=_BY_HAND_ROUNDS,
              step_size=_BY_HAND_STEP, sketch_rotations=_EXPLORED,
              sketch_rotation_bins=_BY_HAND_ROTATION_BINS, sketch_clamp=_BY_HAND_CLAMP, sketch_shrink=_POOLED,
              sketch_floor=_FLOOR)}
_SWEPT_INIT = ("validation split: the ε table's sweep of the per-step flow's start (0.1 against 0.3 and 1, "
               "docs/mainjob-private.md)")
_PCA_ORIGINS = dict(latent_dim=_SWEPT_PCA, share=_SWEPT_PCA)
#: The private-only protocol's settings that depend on ε; a run takes the row of the nearest ε (in log ε; ε = ∞: the
#: ε = 10 row), and a setting given explicitly wins over its row. Each row's ``origins`` says, per section and
#: setting, where the row's value came from (a sweep on the validation split's stand-in, docs/mainjob-private.md
#: "Tuning", or set by hand on public grounds): a row re-tuned states its new origins there, and privacy.md writes
#: them (tests/apps/test_oneshot.py checks that every setting of every row has one).
PRIVATE_ONLY_TABLE = {
    10.0: dict(representation=dict(latent_dim=32, share=0.3), flow=dict(init_scale=0.1),
               generation=dict(sketch_blocks="default", sketch_plan="inf:16", sketch_radius=7.0,
                               sketch_center="mean", sketch_mean_share=0.1, sketch_rounds=4, step_size=1.0,
                               sketch_rotations=8, sketch_rotation_bins=4, sketch_clamp="step",
                               sketch_shrink="pooled", sketch_floor=0.2),
               origins=dict(representation=_PCA_ORIGINS, flow=dict(init_scale=_SWEPT_INIT + " at ε = 10"),
                            generation=_ONESHOT_ORIGINS[10.0])),
    1.0: dict(representation=dict(latent_dim=16, share=0.6), flow=dict(init_scale=0.1),
              generation=dict(sketch_blocks="28/0/0,14/0/0,7/0/0,4/0/0", sketch_plan="inf:2", sketch_radius=7.0,
                              sketch_center="mean", sketch_mean_share=0.15, sketch_rounds=4, step_size=1.0,
                              sketch_rotations=0, sketch_rotation_bins=2, sketch_clamp="step",
                              sketch_shrink="stein", sketch_floor=0.25),
              origins=dict(representation=_PCA_ORIGINS, flow=dict(init_scale=_SWEPT_INIT + _AT_10),
                           generation=_ONESHOT_ORIGINS[1.0])),
}


def table_row(epsilon: float, data: Optional[DataSettings] = None) -> dict:
    """The :data:`PRIVATE_ONLY_TABLE` row of the ε nearest to ``epsilon`` in log ε (ε = ∞: the largest ε's row). For
    a run on photographs (``data``, :func:`photographs`) the row's pixel floor is 0, its origin saying why."""
    if math.isinf(epsilon):
        row = PRIVATE_ONLY_TABLE[max(PRIVATE_ONLY_TABLE)]
    else:
        row = PRIVATE_ONLY_TABLE[min(PRIVATE_ONLY_TABLE, key=lambda e: abs(math.log(e) - math.log(epsilon)))]
    if data is not None and photographs(data):
        origins = dict(row["origins"], generation=dict(row["origins"]["generation"], sketch_floor=_NO_FLOOR))
        row = dict(row, generation=dict(row["generation"], sketch_floor=0.0), origins=origins)
    return row
#: settings that only the public-half protocol reads (its public auto-encoder and the post-processing of its codes;
#: ``ae_width`` is read by both auto-encoders, the public one and the DP one)
PUBLIC_HALF_SETTINGS = (("representation", "ae_arch"), ("representation", "ae_epochs"),
                        ("representation", "ae_max_train"),
                        ("generation", "center"), ("generation", "clip_radius"), ("generation", "spread"),
                        ("generation", "decode_on_sphere"))
