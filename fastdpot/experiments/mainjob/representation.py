"""The private-only protocol's representation, learnt from the SENSITIVE images under differential privacy.

Two kinds (``RepresentationConfig.kind``):

* ``"pca"`` (the default): :class:`DPPCARepresentation`, the top-d eigenvectors of one Gaussian-noised second-moment
  matrix of the scaled, clipped images (Dwork, Talwar, Thakurta & Zhang, "Analyze Gauss: optimal bounds for
  privacy-preserving principal component analysis", STOC 2014), codes in the unit ball;
* ``"autoencoder"``: a group-normalised supervised auto-encoder trained with DP-SGD, codes on the unit sphere.

:class:`GroupNormConvAutoEncoder` is the layout of the public-half protocol's batch-normalised auto-encoder
(:class:`fastdpot.experiments.mainjob.autoencoder.BatchNormConvAutoEncoder`) with group normalisation instead of batch
normalisation (a sample's output must not depend on the other samples of its batch for per-sample gradients), and
an optional linear head on the unit-sphere latent that predicts the label (a *supervised* auto-encoder: the classes
separate in the latent space the flow runs in, and the head, a DP-trained classifier, can label generated latents).

:func:`train_dp_representation` fits either kind, recorded as the stage ``"representation"`` of the run's
:class:`fastdpot.privacy.composition.ComposedLedger`: DP-PCA as one Gaussian release
(:func:`fastdpot.privacy.moments.dp_second_moment`,
sensitivity sqrt(2)), the auto-encoder with :func:`fastdpot.dpsgd.train_dp_sgd` (fixed-size batches sampled without
replacement, per-sample clipping, replace-one sensitivity 2C). The fitted basis or weights are a DP release: caching
them is caching a release, and a run that loads them records the stage's releases in its ledger again (once).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

import torch
from torch import nn
import torch.nn.functional as F

from ..._validate import check_int, check_nonnegative, check_positive, check_probability
from ...privacy.moments import dp_second_moment

__all__ = ["GroupNormConvAutoEncoder", "DPPCARepresentation", "RepresentationConfig", "representation_loss",
           "train_dp_representation", "dct_lowpass_matrix", "head_labels", "REPRESENTATION_KINDS", "PixelRepresentation"]

#: the representations :func:`train_dp_representation` trains
REPRESENTATION_KINDS = ("pca", "autoencoder", "dct")  # learnt or fixed maps to a code space (pixels: no map)


def _sphere(z: torch.Tensor) -> torch.Tensor:
    return z / z.norm(dim=1, keepdim=True).clamp_min(1e-12)


class GroupNormConvAutoEncoder(nn.Module):
    """Group-normalised conv auto-encoder for (n, 1, 28, 28) images in [0, 1], unit-sphere latents, optional head.

    Encoder: conv (1→w, k3), conv (w→2w, k4 s2), conv (2w→4w, k4 s2), each with GroupNorm(min(g, c), c) and ReLU,
    linear 4w·7·7 → d, scaled onto the unit sphere. Decoder: linear d → (4w, 7, 7), norm + ReLU, transposed conv
    (4w→2w, k4 s2), conv (2w→2w, k3), transposed conv (2w→w, k4 s2), each with norm and ReLU, conv (w→1, k3);
    :meth:`decode_logits` returns the pre-sigmoid map, :meth:`decode` the image. Head: linear d → C on the latent.

    Shape:
        encode: (n, 1, 28, 28) -> (n, d), rows of norm 1; decode: (n, d) -> (n, 1, 28, 28) in [0, 1];
        classify: (n, d) -> (n, C) logits.

    Raises:
        ValueError: ``latent_dim`` < 2, ``width`` / ``groups`` < 1, ``num_classes`` < 2.

    References:
        Wu & He, "Group Normalization", ECCV 2018; Le, Patterson & White, "Supervised autoencoders: improving
        generalization performance with unsupervised regularizers", NeurIPS 2018 (the head).
    """

    #: codes live on the unit sphere (the flow normalises its rows; generated codes are projected back)
    on_sphere = True

    def __init__(self, latent_dim: int = 16, width: int = 16, groups: int = 8, num_classes: Optional[int] = 10):
        super().__init__()
        d = check_int(latent_dim, "latent_dim", 2)
        w = check_int(width, "width")
        g = check_int(groups, "groups")
        self.latent_dim, self.width = d, w

        def block(conv, c):
            return [conv, nn.GroupNorm(min(g, c), c), nn.ReLU()]

        self.enc = nn.Sequential(
            *block(nn.Conv2d(1, w, 3, 1, 1), w),
            *block(nn.Conv2d(w, 2 * w, 4, 2, 1), 2 * w),
            *block(nn.Conv2d(2 * w, 4 * w, 4, 2, 1), 4 * w),
            nn.Flatten(), nn.Linear(4 * w * 49, d))
        self.fc = nn.Linear(d, 4 * w * 49)
        self.dec = nn.Sequential(
            nn.GroupNorm(min(g, 4 * w), 4 * w), nn.ReLU(),
            *block(nn.ConvTranspose2d(4 * w, 2 * w, 4, 2, 1), 2 * w),
            *block(nn.Conv2d(2 * w, 2 * w, 3, 1, 1), 2 * w),
            *block(nn.ConvTranspose2d(2 * w, w, 4, 2, 1), w),
            nn.Conv2d(w, 1, 3, 1, 1))
        self.head = None if num_classes is None else nn.Linear(d, check_int(num_classes, "num_classes", 2))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents on the unit sphere: (n, 1, 28, 28) in [0, 1] -> (n, d)."""
        return _sphere(self.enc(x))

    def decode_logits(self, z: torch.Tensor) -> torch.Tensor:
        """Pre-sigmoid reconstructions: (n, d) -> (n, 1, 28, 28)."""
        return self.dec(self.fc(z).view(-1, 4 * self.width, 7, 7))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Images of codes projected onto the unit sphere: (n, d) -> (n, 1, 28, 28) in [0, 1]."""
        return torch.sigmoid(self.decode_logits(_sphere(z)))

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Label logits of latents (n, d) -> (n, C). Raises: RuntimeError without a head."""
        if self.head is None:
            raise RuntimeError("this auto-encoder has no head (num_classes=None)")
        return self.head(z)

    def forward(self, x: torch.Tensor):
        """``(reconstruction logits (n, 1, 28, 28), label logits (n, C) or None)``."""
        z = self.encode(x)
        return self.decode_logits(z), None if self.head is None else self.head(z)


def representation_loss(model: nn.Module, x: torch.Tensor, y: Optional[torch.Tensor],
                        label_weight: float = 0.0) -> torch.Tensor:
    """Per-sample loss: mean pixel binary cross-entropy of the reconstruction, plus ``label_weight`` times the
    head's cross-entropy on the label. Shape: x (B, 1, 28, 28) in [0, 1], y (B,) -> (B,)."""
    logits, cls = model(x)
    loss = F.binary_cross_entropy_with_logits(logits, x, reduction="none").flatten(1).mean(1)
    if label_weight > 0 and cls is not None:
        loss = loss + label_weight * F.cross_entropy(cls, y, reduction="none")
    return loss


def dct_lowpass_matrix(size: int, side: int = 28) -> torch.Tensor:
    """The K × K lowest frequencies of the orthonormal 2-D DCT-II of side × side images, as a (K², side²) float64
    matrix L with orthonormal rows: ``L @ x.flatten()`` are the coefficients (row u·K + v: vertical frequency u,
    horizontal v), ``L.T @ c`` the image of coefficients c with every higher frequency zero. ‖L x‖ <= ‖x‖.

    Raises:
        ValueError: K not in [1, side].

    References:
        Ahmed, Natarajan & Rao, "Discrete cosine transform", IEEE Transactions on Computers, 1974 (DCT-II).
    """
    check_int(side, "side")
    check_int(size, "size")
    if size > side:
        raise ValueError(f"size must be at most side = {side}, got {size}")
    k = torch.arange(side, dtype=torch.float64)
    d = torch.cos(math.pi * (2 * k[None, :] + 1) * k[:, None] / (2 * side)) * math.sqrt(2.0 / side)
    d[0] /= math.sqrt(2.0)
    return torch.kron(d[:size], d[:size])


class DPPCARepresentation(nn.Module):
    """A linear representation of (n, 1, 28, 28) images: codes c = Vᵀ x / S, images S·V c clamped to [0, 1].

    V (p × d, orthonormal columns, p = 784) are the top-d eigenvectors of a DP second-moment matrix
    (:func:`fastdpot.privacy.moments.dp_second_moment`) of the images scaled by 1/S and clipped to the unit ball; the codes of the images
    whose norm is <= S lie in the unit ball (the flow clips the others, ``clip_radius=1``).

    Shape:
        encode: (n, 1, 28, 28) in [0, 1] -> (n, d); decode: (n, d) -> (n, 1, 28, 28) in [0, 1].
    """

    #: codes live in the unit ball, not on the sphere (the flow clips its rows instead of normalising them)
    on_sphere = False
    head = None

    def __init__(self, basis: torch.Tensor, scale: float):
        super().__init__()
        self.register_buffer("basis", basis.float().contiguous())
        self.scale = float(check_positive(scale, "scale"))
        self.latent_dim = basis.shape[1]

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Codes: (n, 1, 28, 28) -> (n, d) (no clipping: the mechanisms that read them clip)."""
        return x.flatten(1).float() @ self.basis / self.scale

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Images: (n, d) -> (n, 1, 28, 28), clamped to [0, 1]."""
        return (z.float() @ self.basis.t() * self.scale).clamp(0, 1).view(-1, 1, 28, 28)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Raises RuntimeError: the PCA representation has no label head (use ``labels_from="flow"``)."""
        raise RuntimeError("the PCA representation has no label head: use labels_from='flow'")


class PixelRepresentation(nn.Module):
    """The identity representation: codes are the flattened pixels in [0, 1] (the one-shot flow runs in pixel
    space); public, data-independent, nothing released.

    Shape:
        encode: (n, C, H, W) -> (n, C·H·W); decode: (n, C·H·W) -> (n, C, H, W) clamped to [0, 1].
    """

    on_sphere = False
    head = None

    def __init__(self, image_shape):
        super().__init__()
        self.image_shape = tuple(int(v) for v in image_shape)
        self.latent_dim = int(torch.tensor(self.image_shape).prod())

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The flattened pixels (n, C·H·W) (float32)."""
        return x.flatten(1).float()

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Images (n, C, H, W) in [0, 1]."""
        return z.float().clamp(0, 1).view(-1, *self.image_shape)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        """Raises RuntimeError: pixels have no label head."""
        raise RuntimeError("the pixel representation has no label head: use labels_from='flow'")


@dataclass(frozen=True)
class RepresentationConfig:
    """The representation's settings (every field enters the cache key with the data's hash and the seed).

    Attributes:
        kind: ``"pca"`` (:class:`DPPCARepresentation`, one release), ``"autoencoder"``
            (:class:`GroupNormConvAutoEncoder` trained with DP-SGD) or ``"dct"`` (the K × K lowest frequencies of
            the 2-D DCT, K = ``lowpass``, d = K²: a fixed public transform that reads no image and releases
            nothing; the flow gets the whole budget).
        latent_dim: d, the code dimension.
        scale: S > 0, PCA only: the images (pixels in [0, 1], norm up to 28) are divided by S before clipping to the
            unit ball (Fashion-MNIST's image norms: median about 12, 90% under 17: S = 16 clips one in six mildly).
        width, groups: the auto-encoder (:class:`GroupNormConvAutoEncoder`).
        label_weight: auto-encoder only: λ >= 0 of the head's cross-entropy (0: no head).
        epochs, batch_size, clip_radius, lr: auto-encoder only (DP-SGD). epochs: passes over the n sensitive
            images (T = round(epochs·n/B) steps). batch_size: B.
        clip_radius: C > 0, the per-sample gradient bound. lr: Adam's learning rate (cosine-decayed to 0).
        share: the fraction of the run's ε this stage is calibrated to on its own (the flow gets the rest of the
            composed budget; RDP composition makes the two shares sum to more than the whole).
        lowpass: ``"dct"``: K (required, d = K²). ``"pca"``: None (PCA of the pixels), or K in [1, 28] with
            K² >= d: PCA of the K × K lowest
            frequencies of each image's orthonormal 2-D DCT-II (:func:`dct_lowpass_matrix`, a public,
            data-independent map). The noise of the second-moment release then never reaches the higher
            frequencies: the basis, and every decoded image, is smooth (measured on the validation split:
            docs/mainjob-private.md).
    """
    kind: str = "pca"
    latent_dim: int = 32
    scale: float = 16.0
    width: int = 16
    groups: int = 8
    label_weight: float = 0.5
    epochs: float = 10.0
    batch_size: int = 1024
    clip_radius: float = 1.0
    lr: float = 2e-3
    share: float = 0.9
    lowpass: Optional[int] = None
    version: int = 3

    def __post_init__(self):
        if self.kind not in REPRESENTATION_KINDS:
            raise ValueError(f"kind must be one of {list(REPRESENTATION_KINDS)}, got {self.kind!r}")
        check_int(self.latent_dim, "latent_dim", 2)
        check_positive(self.scale, "scale")
        if self.kind == "pca" and self.latent_dim > 784:
            raise ValueError(f"latent_dim must be <= 784 for the PCA representation, got {self.latent_dim}")
        check_int(self.width, "width")
        check_int(self.groups, "groups")
        check_nonnegative(self.label_weight, "label_weight")
        check_positive(self.epochs, "epochs")
        check_int(self.batch_size, "batch_size")
        check_positive(self.clip_radius, "clip_radius")
        check_positive(self.lr, "lr")
        check_probability(self.share, "share", low_open=True, high_open=True)
        if self.kind == "dct" and (self.lowpass is None or self.lowpass ** 2 != self.latent_dim):
            raise ValueError(f"kind='dct' needs lowpass = K with K² = latent_dim, got lowpass={self.lowpass!r}, "
                             f"latent_dim={self.latent_dim}")
        if self.lowpass is not None:
            if self.kind == "autoencoder":
                raise ValueError("lowpass is a setting of kind='pca' and kind='dct', not of the auto-encoder")
            check_int(self.lowpass, "lowpass")
            if not 1 <= self.lowpass <= 28 or self.lowpass ** 2 < self.latent_dim:
                raise ValueError(f"lowpass must be K in [1, 28] with K² >= latent_dim = {self.latent_dim}, got "
                                 f"{self.lowpass!r}")

    def steps(self, n: int) -> int:
        """DP-SGD's steps T = round(epochs·n/B) (at least 1) for n sensitive images."""
        return max(1, int(round(self.epochs * n / self.batch_size)))


def _key(images: torch.Tensor, labels: torch.Tensor, cfg: RepresentationConfig, epsilon: float, delta: float,
         seed: int, secure_mode: bool, owner: Optional[str]) -> str:
    h = hashlib.sha256(str(tuple(images.shape)).encode())
    h.update(images.contiguous().numpy().tobytes())
    h.update(labels.contiguous().numpy().tobytes())
    h.update(json.dumps(dict(asdict(cfg), epsilon=str(epsilon), delta=delta, seed=seed, secure_mode=secure_mode,
                             owner=owner), sort_keys=True).encode())
    return "dprep_" + h.hexdigest()[:24]


def train_dp_representation(images: torch.Tensor, labels: torch.Tensor, cfg: RepresentationConfig, ledger, *,
                            num_classes: int, seed: int, calibration_size: Optional[int] = None,
                            secure_mode: bool = True, cache_dir: Optional[str] = None,
                            owner: Optional[str] = None, progress: bool = True) -> Tuple[nn.Module, dict]:
    """Learn the representation from the sensitive ``images`` under DP, recorded in ``ledger`` as the stage
    ``"representation"``, its noise multiplier calibrated so that the stage alone spends ``cfg.share`` of the run's ε;
    ``ledger.private`` False learns it without noise or clipping (the ε = ∞ reference).

    ``kind="pca"``: one :func:`fastdpot.privacy.moments.dp_second_moment` release on all n images (sampling ``"full"``), basis = its top-d
    eigenvectors. ``kind="autoencoder"``: :func:`fastdpot.dpsgd.train_dp_sgd` (fixed-size batches sampled without
    replacement, per-sample clipping, replace-one sensitivity 2C).

    Args:
        images: (n, 1, 28, 28) uint8 sensitive images. labels: (n,) their labels (used only by a head).
        cfg: :class:`RepresentationConfig`. ledger: the run's :class:`fastdpot.privacy.composition.ComposedLedger`.
        num_classes: C, the label domain (public: never read from the private labels).
        seed: the public seed of the weights' initialisation (and of every draw with ``secure_mode=False``).
        calibration_size: the data-set size the noise is calibrated and recorded for (default n). A STAND-IN run
            (tuning on public data, ``fastdpot.experiments.mainjob.tuning``) passes the real run's size: the
            auto-encoder takes the real run's steps and noise multiplier, the PCA's noise is scaled by
            n / calibration_size (the same noise relative to the sum of n rows).
        secure_mode: noise (and batches) from the operating system (default).
        cache_dir, owner: where the learnt weights (a release) are kept and whose release they are. The file is
            keyed by data, labels, config, ε, δ, seed, calibration size, the noise's mode and ``owner``, and is read
            back only by a call with the same key: a secure run never reuses another run's secret release, and never
            a replayable one (the main job keeps a secure run's release in its own run folder, owner = the run's id,
            so only that run, resumed, reuses it; a replayable release, rebuildable from its seed, may be shared).
            In secure mode without an ``owner`` nothing is cached. "" or None: no cache.
        progress: a bar.

    Returns:
        (model in eval mode with ``encode``, ``decode`` and ``on_sphere``; info: steps, noise multiplier, noise std,
        seconds, cached (whether the release was read back), cache_owner, ε of the ledger after).

    Raises:
        ValueError: bad images / labels / calibration size.
    """
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or tuple(images.shape[1:]) != (1, 28, 28):
        raise ValueError(f"images must be (n, 1, 28, 28) uint8, got {getattr(images, 'dtype', None)} "
                         f"{tuple(getattr(images, 'shape', ()))}")
    n = images.shape[0]
    if n == 0:
        raise ValueError("images is empty")
    if not isinstance(labels, torch.Tensor) or tuple(labels.shape) != (n,):
        raise ValueError(f"labels must be ({n},), got {tuple(getattr(labels, 'shape', ()))}")
    n_cal = n if calibration_size is None else check_int(calibration_size, "calibration_size", n)
    num_classes = check_int(num_classes, "num_classes", 2)
    if cfg.kind == "dct":  # public and data-independent: no image read, nothing released, nothing recorded
        model = DPPCARepresentation(dct_lowpass_matrix(cfg.lowpass).t(), cfg.scale).eval()
        return model, dict(steps=0, noise_multiplier=None, noise_std=None, cached=False, kind="dct", seconds=0.0,
                           epsilon=ledger.epsilon() if ledger.private else float("inf"), calibration_size=n_cal,
                           batch_size=0)
    key = _key(images, labels, cfg, ledger.target_epsilon, ledger.delta, seed, secure_mode, owner) + \
        ("" if n_cal == n else f"_c{n_cal}")
    path = os.path.join(cache_dir, key + ".pt") if cache_dir and (owner or not secure_mode) else None
    fit = _fit_pca if cfg.kind == "pca" else _fit_autoencoder
    event = dict(sampling="full", dataset_size=n_cal) if cfg.kind == "pca" else \
        dict(sampling="without_replacement", dataset_size=n_cal, batch_size=min(cfg.batch_size, n))
    steps = 1 if cfg.kind == "pca" else cfg.steps(n_cal)
    z = ledger.calibrate(steps, epsilon=cfg.share * ledger.target_epsilon, **event) if ledger.private else None
    t0 = time.perf_counter()
    blob = torch.load(path, map_location="cpu", weights_only=True) if path and os.path.isfile(path) else None
    if blob is not None and (blob.get("secure_mode") != secure_mode or blob.get("owner") != owner):
        blob = None  # a file of another mode or owner under this name: never reused, this run draws its own
    if blob is not None:
        model = _build(cfg, num_classes, seed, blob["state_dict"])
        if ledger.private:  # the cached weights are this stage's release: its steps count in this run's ledger
            ledger.record("representation", float(blob["noise_multiplier"]), int(blob["steps"]), **event)
        info = dict(steps=int(blob["steps"]), noise_multiplier=blob["noise_multiplier"], noise_std=blob["noise_std"],
                    cached=True)
    else:
        model, info = fit(images, labels, cfg, ledger, z, steps, n_cal, num_classes, seed, secure_mode, progress)
        info["cached"] = False
        if path:
            os.makedirs(cache_dir, exist_ok=True)
            tmp = path + f".tmp{os.getpid()}"
            torch.save(dict(state_dict={k: v.cpu() for k, v in model.state_dict().items()}, steps=info["steps"],
                            noise_multiplier=float(info["noise_multiplier"] or 0.0),
                            noise_std=float(info["noise_std"] or 0.0), secure_mode=secure_mode, owner=owner), tmp)
            os.replace(tmp, path)
    model.eval()
    return model, dict(info, kind=cfg.kind, seconds=time.perf_counter() - t0, epsilon=ledger.epsilon(),
                       calibration_size=n_cal, batch_size=event.get("batch_size", n_cal), cache_owner=owner,
                       secure_mode=secure_mode)


def _build(cfg: RepresentationConfig, num_classes: int, seed: int, state_dict=None) -> nn.Module:
    if cfg.kind == "pca":
        model = DPPCARepresentation(torch.zeros(784, cfg.latent_dim), cfg.scale)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # the weights' initialisation: public
            model = GroupNormConvAutoEncoder(cfg.latent_dim, cfg.width, cfg.groups,
                                             None if cfg.label_weight == 0 else num_classes)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model


def _fit_pca(images, labels, cfg, ledger, z, steps, n_cal, num_classes, seed, secure_mode, progress):
    from ...privacy.randomness import privacy_randomness

    n = images.shape[0]
    std = 0.0 if z is None else z * math.sqrt(2.0) * n / n_cal
    rng = privacy_randomness(secure_mode, None if secure_mode else torch.Generator().manual_seed(seed + 7))
    x = images.flatten(1).double().div_(255.0 * cfg.scale)
    lp = None if cfg.lowpass is None else dct_lowpass_matrix(cfg.lowpass)
    if lp is not None:
        x = x @ lp.t()  # the low frequencies (a public linear map; norms do not grow)
    if ledger.private:  # recorded before the release is computed
        ledger.record("representation", z, 1, sampling="full", dataset_size=n_cal)
    m = dp_second_moment(x, std, rng)
    _, vecs = torch.linalg.eigh(m)
    basis = vecs[:, -cfg.latent_dim:].flip(1)  # largest eigenvalue first
    if lp is not None:
        basis = lp.t() @ basis  # back to pixels: still orthonormal columns (L has orthonormal rows)
    return DPPCARepresentation(basis, cfg.scale), dict(steps=1, noise_multiplier=z, noise_std=std)


def _fit_autoencoder(images, labels, cfg, ledger, z, steps, n_cal, num_classes, seed, secure_mode, progress):
    from ...dpsgd import train_dp_sgd

    model = _build(cfg, num_classes, seed)
    x = images.float().div_(255.0)
    B, stand_in = min(cfg.batch_size, images.shape[0]), n_cal != images.shape[0]
    if stand_in and ledger.private:  # a stand-in records the real run's steps (its own size is not the claim)
        ledger.record("representation", z, steps, sampling="without_replacement", dataset_size=n_cal, batch_size=B)
    res = train_dp_sgd(model, x, lambda m, xb, yb: representation_loss(m, xb, yb, cfg.label_weight), targets=labels,
                       steps=steps, batch_size=B, clip_radius=cfg.clip_radius, noise_multiplier=z,
                       ledger=ledger if ledger.private and not stand_in else None, stage="representation", lr=cfg.lr,
                       scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps),
                       generator=None if secure_mode else torch.Generator().manual_seed(seed + 7),
                       secure_mode=secure_mode, progress=progress)
    return model, dict(steps=res.steps, noise_multiplier=res.noise_multiplier, noise_std=res.noise_std)


@torch.no_grad()
def head_labels(model: GroupNormConvAutoEncoder, latents: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    """The head's labels of latents (n, d) -> (n,) int64: post-processing of the DP-trained model."""
    return torch.cat([model.classify(_sphere(latents[s:s + batch_size].float())).argmax(1)
                      for s in range(0, latents.shape[0], batch_size)]) if latents.numel() else \
        torch.zeros(0, dtype=torch.long)
