"""The main job's two protocols, as values of one setting (``MainJobConfig.protocol``): where the data and the code
space come from.

* ``"public-half"`` (the papers' protocol, Sebag et al., TMLR): the training set is split with ``seed`` into a
  PUBLIC part (``public_size`` images, default half), which trains the auto-encoder whose latent space hosts the
  generator, and a PRIVATE part, the only data a mechanism reads. FID and accuracy are measured on the real test
  set; δ = 1e-5.
* ``"private-only"`` (DPImageBench: Gong et al., "DPImageBench: A Unified Benchmark for Differentially Private Image
  Synthesis", CCS 2025): no public image. The training set is split, with one fixed public seed shared by every run
  (:data:`SPLIT_SEED`), into the SENSITIVE set and a VALIDATION split of ``validation_size`` images (the explicit
  tuning split, disjoint from the sensitive set; it also trains the label-fidelity judge, an evaluation model). The
  code space is a DP representation of the sensitive images (:mod:`fastdpot.experiments.mainjob.representation`),
  charged to the run's :class:`fastdpot.privacy.composition.ComposedLedger`; δ = 1/(N ln N).

:func:`load_data` gives both the same shape (``private`` is the private part or the sensitive set), and
:func:`stage_representation` the same code space interface (``model.encode`` / ``model.decode``, ``codes``).
"""
from __future__ import annotations

import math
import os
import uuid
from dataclasses import asdict
from typing import Any, Dict, Optional, Tuple

import torch

from ..data import load_dataset, public_private_split, to_float

__all__ = ["load_data", "stage_representation", "private_split", "protocol_delta", "run_owner",
           "representation_config", "num_classes_of", "NUM_CLASSES", "SPLIT_SEED"]

NUM_CLASSES = 10  # the label domain of the private-only protocol's data sets (Fashion-MNIST): public
#: the seed of THE private-only split: every run and every tuning job uses the same sensitive / validation split
SPLIT_SEED = 0


def num_classes_of(images) -> int:
    """C of the private-only protocol: the data set's class names when it has them, else :data:`NUM_CLASSES` for
    labelled data, 1 for unlabelled data (public properties of the data set, never its labels' values)."""
    if images.labels is None:
        return 1
    return len(images.class_names) if images.class_names else NUM_CLASSES


def protocol_delta(n: int) -> float:
    """DPImageBench's δ = 1 / (N ln N) for N sensitive records (1.66e-6 for N = 55 000)."""
    return 1.0 / (n * math.log(n))


def private_split(n_train: int, validation_size: int, seed: int = SPLIT_SEED):
    """``(sensitive_index, validation_index)``: a seeded permutation of the training indices; the last
    ``validation_size`` are the validation split (public randomness: the split depends on no image)."""
    if not 0 < validation_size < n_train:
        raise ValueError(f"validation_size must be in (0, {n_train}), got {validation_size}")
    perm = torch.randperm(n_train, generator=torch.Generator().manual_seed(seed))
    return perm[:-validation_size], perm[-validation_size:]


def load_data(cfg) -> Dict[str, Any]:
    """The run's data: ``private`` (the private part, or the sensitive set), ``public`` (public-half) or
    ``validation`` (private-only), ``test``, ``dataset`` (name) and the index tensors into the training set.

    Raises:
        ValueError: a ``public_size`` or ``validation_size`` that leaves no private image. FileNotFoundError: data.
    """
    d = cfg.data
    train = load_dataset(d.dataset, "train", d.data_dir, d.celeba_dir, d.max_train)
    test = load_dataset(d.dataset, "test", d.data_dir, d.celeba_dir, d.max_test)
    if cfg.protocol == "private-only":
        sens, val = private_split(len(train), d.validation_size)
        return dict(private=train.subset(sens), validation=train.subset(val), public=None, test=test,
                    dataset=train.name, private_index=sens, validation_index=val)
    if d.public_size is not None and not d.public_size < len(train):
        raise ValueError(f"public_size must be < the {len(train)} training images, got {d.public_size}")
    pub, priv = public_private_split(len(train), seed=cfg.seed, public_size=d.public_size)
    return dict(public=train.subset(pub), private=train.subset(priv), validation=None, test=test,
                public_index=pub, private_index=priv, dataset=train.name)


def representation_config(cfg):
    """The private-only protocol's :class:`~fastdpot.experiments.mainjob.representation.RepresentationConfig`."""
    from .representation import RepresentationConfig

    r = cfg.representation
    d = r.lowpass ** 2 if r.kind == "dct" and r.lowpass else r.latent_dim or (32 if r.kind == "pca" else 16)
    return RepresentationConfig(kind=r.kind, latent_dim=d, scale=r.scale, width=r.ae_width or 16,
                                label_weight=r.label_weight, epochs=r.epochs, batch_size=r.batch_size,
                                clip_radius=r.clip_radius, lr=r.lr, share=r.share, lowpass=r.lowpass)


def run_owner(run_dir: Optional[str]) -> Optional[str]:
    """The run folder's id (a random UUID written once to ``private/run_id``): the owner of the releases the run
    keeps for its own resumption. None without a run folder."""
    if not run_dir:
        return None
    path = os.path.join(run_dir, "private", "run_id")
    if not os.path.isfile(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(uuid.uuid4().hex)
    with open(path) as f:
        return f.read().strip()


def _ae_defaults(images: torch.Tensor) -> Tuple[str, int]:
    """(arch, latent d) by image size: 28/32 px: the batch-normalised conv AE (``"convbn"``) with d = 16 — chosen on
    the public half (docs/mainjob/tuning.md: against the DPSWflow code's conv AE at the same d its held-out
    reconstructions score FID 70.3 against 112.7, and the label-private flow in its latent space FID 171 against 201,
    CNN 70.1 % against 67.4 %); 64 px: DCGAN AE, d = 48 (Sebag et al., TMLR)."""
    H = images.shape[-1]
    if H == 64:
        return "dcgan", 48
    if H in (28, 32):
        return "convbn", 16
    raise ValueError(f"images must be 28, 32 or 64 px square for the bundled auto-encoders, got {tuple(images.shape)}")


def _public_autoencoder(cfg, data, progress: bool, cache_dir: Optional[str]) -> Dict[str, Any]:
    from .autoencoder import AutoEncoderConfig, decode, encode, train_autoencoder

    r = cfg.representation
    arch, d = _ae_defaults(data["public"].images)
    ae_cfg = AutoEncoderConfig(arch=r.ae_arch or arch, latent_dim=r.latent_dim or d, epochs=r.ae_epochs,
                               seed=cfg.seed, max_train=r.ae_max_train, width=r.ae_width)
    model, info = train_autoencoder(data["public"].images, ae_cfg, cache_dir=cache_dir, device=cfg.device,
                                    progress=progress)
    codes = encode(model, data["private"].images, device=cfg.device)
    test = data["test"].images[:1000]
    mse = float(((decode(model, encode(model, test, device=cfg.device), device=cfg.device) - to_float(test)) ** 2)
                .mean())
    g = cfg.generation
    public = (encode(model, data["public"].images, device=cfg.device)
              if "public" in (g.spread, g.center) or g.method == "public" else None)
    return dict(model=model, info=dict(info, kind="public autoencoder"), codes=codes, labels=data["private"].labels,
                public_codes=public, public_labels=data["public"].labels, recon_mse=mse, config=asdict(ae_cfg),
                normalize=True, num_classes=None,
                decode=lambda z: decode(model, z, device=cfg.device))


def stage_representation(cfg, data, ledger=None, *, progress: bool = True, cache_dir: Optional[str] = None,
                         owner: Optional[str] = None, calibration_size: Optional[int] = None) -> Dict[str, Any]:
    """The code space and the private codes.

    public-half: the auto-encoder trained (or loaded from ``cache_dir``) on the PUBLIC part; the private part encoded
    to unit-sphere codes. private-only: :func:`~fastdpot.experiments.mainjob.representation.train_dp_representation`
    on the sensitive set, recorded in ``ledger`` (its release kept under ``cache_dir`` for ``owner`` only: see there).

    Returns:
        dict with ``model``, ``codes`` (n, d), ``labels`` (n,) or None (private-only: mapped into [0, C)),
        ``public_codes`` / ``public_labels`` (public-half), ``info``, ``normalize`` (codes on the unit sphere),
        ``num_classes`` (private-only: C), ``decode`` (codes -> images in [0, 1]).
    """
    if cfg.protocol == "public-half":
        return _public_autoencoder(cfg, data, progress, cache_dir)
    from ...privacy.moments import domain_labels
    from .representation import train_dp_representation

    images = data["private"].images
    num_classes = num_classes_of(data["private"])
    labels = torch.zeros(images.shape[0], dtype=torch.int64) if data["private"].labels is None else \
        domain_labels(data["private"].labels, num_classes)
    if cfg.representation.kind == "pixels":  # the one-shot flow's pixel space: public, nothing released
        from .representation import PixelRepresentation

        model = PixelRepresentation(images.shape[1:])
        codes = model.encode(to_float(images))
        return dict(model=model, info=dict(kind="pixels", latent_dim=model.latent_dim, cached=False, steps=0),
                    codes=codes, labels=labels, public_codes=None, public_labels=None, normalize=False,
                    num_classes=num_classes, decode=model.decode, config=dict(kind="pixels"))
    if data["private"].labels is None:
        raise ValueError(f"the private-only protocol's method {cfg.generation.method!r} needs labelled images; "
                         f"unlabelled ones (a CelebA folder) run the one-shot method")
    rep_cfg = representation_config(cfg)
    model, info = train_dp_representation(images, labels, rep_cfg, ledger, num_classes=NUM_CLASSES, seed=cfg.seed,
                                          secure_mode=not cfg.replayable_noise, calibration_size=calibration_size,
                                          cache_dir=cache_dir, owner=owner, progress=progress)
    with torch.no_grad():
        codes = torch.cat([model.encode(to_float(images[s:s + 4096])) for s in range(0, images.shape[0], 4096)])

    def decode(z):
        with torch.no_grad():
            return torch.cat([model.decode(z[s:s + 4096]) for s in range(0, z.shape[0], 4096)]).clamp_(0, 1)

    return dict(model=model, info=dict(asdict(rep_cfg), **info), codes=codes, labels=labels, public_codes=None,
                public_labels=None, normalize=model.on_sphere, num_classes=NUM_CLASSES, decode=decode,
                config=asdict(rep_cfg))
