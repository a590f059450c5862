"""The main job's public stages around the private flow (:mod:`fastdpot.experiments.flow_stage`):

1. :func:`stage_data` — load the training and test images, split the training set into disjoint public and
   private halves with a recorded seed.
2. :func:`stage_autoencoder` — train (or load from cache) the auto-encoder on the PUBLIC half only; encode the
   private half to unit-sphere latents.
3. (the flow stage, :func:`fastdpot.experiments.flow_stage.stage_flow`, or a baseline,
   :func:`fastdpot.experiments.baselines.stage_baseline`)
4. :func:`calibrate_spread` (optional post-processing with public statistics), :func:`stage_decode` — decode the
   particles to images.
5. :func:`stage_metrics` — FID against the real test set and downstream classifier accuracy.

None of them touches private data through anything but the released particles (post-processing).
"""
from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, Dict, Optional, Tuple

import torch

from .._validate import check_int
from .autoencoder import AutoEncoderConfig, decode, encode, train_autoencoder
from .config import PipelineConfig
from .data import ImageData, load_dataset, public_private_split, to_float

__all__ = ["stage_data", "stage_autoencoder", "calibrate_spread", "stage_decode", "stage_metrics"]


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
    """(arch, latent d) by image size: 28/32 px: the batch-normalised conv AE (``"convbn"``) with d = 16 — chosen on
    the public half (docs/mainjob/tuning.md: against the DPSWflow code's conv AE at the same d its held-out
    reconstructions score FID 70.3 against 112.7, scripts/ae_public_recon.py, and the label-private flow in its
    latent space FID 171 against 201, CNN 70.1 % against 67.4 %); d = 16 rather than the papers' 8
    (results/mainjob/NOTES.md);
    64 px: DCGAN AE, d = 48 (Sebag et al., TMLR)."""
    H = images.shape[-1]
    if H == 64:
        return "dcgan", 48
    if H in (28, 32):
        return "convbn", 16
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
    arch, d = cfg.ae_arch or arch, cfg.latent_dim or d
    ae_cfg = AutoEncoderConfig(arch=arch, latent_dim=d, epochs=cfg.ae_epochs, seed=cfg.seed,
                               max_train=cfg.ae_max_train, width=cfg.ae_width)
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
                                    cnn_epochs=cfg.cnn_epochs, cnn_augment=cfg.cnn_augment,
                                    cnn_arch=cfg.cnn_arch)
        out.update({f"accuracy_{k}": v for k, v in acc.items()})
        out.update(downstream_train_samples=int(images.shape[0]), downstream_test_samples=len(test),
                   downstream_seconds=time.perf_counter() - t0)
    return out
