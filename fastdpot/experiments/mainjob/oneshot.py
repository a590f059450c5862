"""The private-only protocol's one-shot generator (``generation.method="oneshot"``): release the whole sensitive set
once, then flow in pixel space as post-processing.

1. (``sketch_center="mean"``) the DP class means: :func:`fastdpot.privacy.moments.release_class_means` about the
   public grey image 0.5 (every image of [0, 1]^D lies within √D/2 of it: nothing is clipped), labels private;
2. the one-shot class sketch: :func:`fastdpot.privacy.class_sketch.class_quantile_sketch` of every class's images,
   centred on their class's released mean (or on 0.5) and clipped to ``sketch_radius`` inside, on the public blocks
   of orthonormal patch-DCT directions ``sketch_blocks`` (:func:`fastdpot.flows.directions.patch_dct_blocks`, fast
   blocks applied by their own transform; each block a full basis of the D pixels, or its
   ``sketch_block_directions`` lowest frequencies when that is set), with the quantile bins ``sketch_plan`` by
   frequency (:func:`fastdpot.flows.directions.bins_by_frequency`), then ``sketch_rotations`` random rotations of the
   whole image (randomised Hadamard blocks from the public seeds :data:`ROTATION_SEED` + b, ``sketch_rotation_bins``
   bins per direction: joint structure beyond patches);
3. the flows: :meth:`fastdpot.flows.ClassConditionalFlow.from_release`, particles per class from the released
   counts, started from the release's own block-0 marginals, ``sketch_rounds`` passes over the blocks (with rotation
   blocks, then one more pass over the patch blocks), towards the tables of
   :meth:`~fastdpot.privacy.class_sketch.ClassSketchRelease.quantile_tables` (the noisy bin means shrunk by
   ``sketch_shrink``: pooled empirical Bayes over each block's frequency bands, or James–Stein per direction), kept
   in the public pixel range [0, 1] after every step (``sketch_clamp="step"``) or clamped to it at the end
   (``"end"``): post-processing, no privacy cost;
4. (``sketch_floor`` t > 0) the images' pixels darker than t set to 0, the pixel range's floor: hard thresholding
   (Donoho & Johnstone, "Ideal spatial adaptation by wavelet shrinkage", Biometrika 1994, applied to pixels), which
   removes the tables' residual noise from dark backgrounds; post-processing, no privacy cost.

Both releases are full-batch Gaussian mechanisms recorded in the run's ledger; their noise multipliers z_m = z/√s and
z_s = z/√(1 − s) (s = ``sketch_mean_share``) compose to exactly one Gaussian of multiplier z, calibrated to the rest
of the run's budget over every seed.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import torch

__all__ = ["generate_oneshot", "parse_blocks", "parse_plan", "flow_steps", "ROTATION_SEED"]

#: the public seed of the one-shot method's random-rotation blocks (rotation b: ROTATION_SEED + b); public like the
#: patch grids: it depends on no image
ROTATION_SEED = 28_11_2026


def parse_blocks(spec: str) -> Optional[Tuple[Tuple[int, int, int], ...]]:
    """``"default"`` (None: :func:`fastdpot.flows.directions.default_patches` of the image size) or
    ``"p/sy/sx,p/sy/sx,..."``.

    Raises:
        ValueError: a malformed entry.
    """
    if spec == "default":
        return None
    out = []
    for item in str(spec).split(","):
        parts = item.strip().split("/")
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"sketch_blocks entries are patch/shift_y/shift_x, got {item!r}")
        out.append(tuple(int(p) for p in parts))
    return tuple(out)


def parse_plan(spec: str) -> List[Tuple[float, int]]:
    """``"3:16,8:8,inf:2"``: directions of frequency <= 3 cycles per side get 16 bins, <= 8 get 8, the rest 2.

    Raises:
        ValueError: a malformed entry.
    """
    out = []
    for item in str(spec).split(","):
        f, _, b = item.partition(":")
        try:
            out.append((float(f), int(b)))
        except ValueError:
            raise ValueError(f"sketch_plan entries are max_frequency:bins, got {item!r}") from None
    return out


def flow_steps(patch_blocks: int, rotations: int, rounds: int) -> int:
    """The one-shot flows' steps: ``rounds`` passes over the ``patch_blocks + rotations`` blocks, then, with rotation
    blocks, one more pass over the patch blocks (their shrunk tables hold a high spatial frequency's location only
    where its shape is below the noise, so the images end without the white texture that the noise of a rotation's
    directions spreads over every pixel)."""
    return rounds * (patch_blocks + rotations) + (patch_blocks if rotations else 0)


def generate_oneshot(cfg, codes: torch.Tensor, labels: torch.Tensor, num_particles: int, seed: int, *, ledger,
                     num_classes: int, image_shape: Tuple[int, ...], calibration_size: Optional[int] = None,
                     noise_multiplier: Optional[float] = None, progress: bool = False, **_) -> Dict[str, Any]:
    """The one-shot release of the sensitive ``codes`` (flattened images in [0, 1]) and the flows on it (module
    docstring); ``noise_multiplier``: the first seed's z for the later seeds (else calibrated here for all of them).

    Returns:
        dict with ``samples`` (N, D), ``sample_labels`` (N,), ``epsilon`` (the ledger's), ``privacy`` (the release's
        settings and noise), ``resumed`` False, and for the run folder's pictures ``release`` (the
        :class:`~fastdpot.privacy.class_sketch.ClassSketchRelease`, public: released without its noise).
    """
    from ...flows import ClassConditionalFlow
    from ...flows.directions import bins_by_frequency, hadamard_blocks, patch_dct_blocks
    from ...privacy.class_sketch import class_quantile_sketch
    from ...privacy.moments import release_class_means

    g = cfg.generation
    n, D = codes.shape
    n_cal = n if calibration_size is None else calibration_size
    scale = n / n_cal  # a stand-in's sums get the real run's noise relative to their size: noise multiplier z·scale
    secure = not cfg.replayable_noise
    gen = torch.Generator().manual_seed(int(seed))  # public draws (flows); the releases' noise only when replayable
    noise_gen = None if secure else gen
    C, H, W = (image_shape[0], image_shape[1], image_shape[2])
    blocks = patch_dct_blocks(H, W, C, parse_blocks(g.sketch_blocks), per_block=g.sketch_block_directions)
    per_block = blocks[0].size
    bins = bins_by_frequency(torch.cat([b.frequency for b in blocks]), parse_plan(g.sketch_plan))
    if g.sketch_rotations:  # random rotations of the whole image, from public seeds, after the patch blocks
        if per_block != D:
            raise ValueError("sketch_rotations needs full patch blocks (sketch_block_directions unset): every block "
                             "of one release has one size")
        blocks += hadamard_blocks(D, g.sketch_rotations, seed=ROTATION_SEED)
        bins = torch.cat([bins, torch.full((g.sketch_rotations * D,), g.sketch_rotation_bins, dtype=torch.int64)])
    half = torch.full((D,), 0.5, dtype=torch.float64)
    z = 0.0
    if ledger.private:
        z = ledger.calibrate(g.flow_seeds, sampling="full", dataset_size=n_cal) \
            if noise_multiplier is None else noise_multiplier
    share = g.sketch_mean_share if g.sketch_center == "mean" else 0.0
    info: Dict[str, Any] = dict(method="oneshot", private=ledger.private, noise_multiplier=z,
                                blocks=g.sketch_blocks, plan=g.sketch_plan, block_directions=per_block,
                                rotations=g.sketch_rotations, rotation_bins=g.sketch_rotation_bins,
                                clamp=g.sketch_clamp,
                                clip_radius=g.sketch_radius, center=g.sketch_center, mean_share=share,
                                rounds=g.sketch_rounds, step_size=g.step_size, directions=per_block * len(blocks),
                                shrinkage=g.sketch_shrink, floor=g.sketch_floor,
                                bins_histogram={int(b): int((bins == b).sum()) for b in bins.unique()})
    centers = half
    if g.sketch_center == "mean":
        z_m = z / math.sqrt(share) if z > 0 else 0.0
        if ledger.private:
            ledger.record("means", z_m, 1, sampling="full", dataset_size=n_cal)
        means = release_class_means(codes, labels, num_classes, z_m * scale, clip_radius=math.sqrt(D) / 2,
                                    center=half, generator=noise_gen, secure_mode=secure)
        centers = means["means"].clamp(0.0, 1.0)
        info.update(means_noise_multiplier=z_m, means_noise_std=means["noise_std"])
    z_s = z / math.sqrt(1.0 - share) if z > 0 else 0.0
    if ledger.private:
        ledger.record("sketch", z_s, 1, sampling="full", dataset_size=n_cal)
    release = class_quantile_sketch(codes, labels, blocks, num_classes=num_classes, sketch_bins=bins,
                                    noise_multiplier=z_s * scale, clip_radius=g.sketch_radius,
                                    centers=centers,
                                    generator=noise_gen, secure_mode=secure)
    flows = ClassConditionalFlow.from_release(release, num_particles, step_size=g.step_size,
                                              domain=(0.0, 1.0) if g.sketch_clamp == "step" else None,
                                              generator=gen, backend=cfg.backend, shrink=g.sketch_shrink)
    steps = flow_steps(len(blocks) - g.sketch_rotations, g.sketch_rotations, g.sketch_rounds)
    samples, sample_labels = flows.run(steps=steps, progress=progress)
    if g.sketch_clamp == "end":  # the images, in the public pixel range
        samples = samples.clamp(0.0, 1.0)
    if g.sketch_floor > 0:  # hard thresholding: pixels darker than the floor are the range's floor, 0
        samples = samples.masked_fill(samples < g.sketch_floor, 0.0)
    info.update(flow_steps=steps, sketch_noise_multiplier=z_s, sketch_noise_std=release.noise_std,
                sensitivity=release.sensitivity, count_noise_std=release.count_noise_std,
                released_counts=release.counts.tolist())
    return dict(samples=samples.float(), sample_labels=sample_labels, resumed=False,
                epsilon=ledger.epsilon() if ledger.private else math.inf, privacy=info, release=release)
