"""The private-only protocol's representation: an auto-encoder trained on the SENSITIVE images with DP-SGD.

:class:`GroupNormConvAutoEncoder` is the layout of the public-half protocol's batch-normalised auto-encoder
(:class:`fastdpot.experiments.autoencoder.BatchNormConvAutoEncoder`) with group normalisation instead of batch
normalisation (a sample's output must not depend on the other samples of its batch for per-sample gradients), and
an optional linear head on the unit-sphere latent that predicts the label (a *supervised* auto-encoder: the classes
separate in the latent space the flow runs in, and the head, a DP-trained classifier, can label generated latents).

:func:`train_dp_representation` trains it with :func:`fastdpot.dpsgd.train_dp_sgd` (fixed-size batches sampled
without replacement, per-sample clipping, replace-one sensitivity 2C), recorded as the stage ``"representation"`` of
the run's :class:`fastdpot.privacy.composition.ComposedLedger`. The trained weights are a DP release: caching them
is caching a release, and a run that loads them records the stage's releases in its ledger again (once).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

import torch
from torch import nn
import torch.nn.functional as F

from .._validate import check_int, check_nonnegative, check_positive, check_probability

__all__ = ["GroupNormConvAutoEncoder", "RepresentationConfig", "representation_loss", "train_dp_representation",
           "head_labels"]


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
        """Images: (n, d) -> (n, 1, 28, 28) in [0, 1]."""
        return torch.sigmoid(self.decode_logits(z))

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


@dataclass(frozen=True)
class RepresentationConfig:
    """DP-SGD training of the representation (every field enters the cache key with the data's hash and the seed).

    Attributes:
        latent_dim, width, groups: the auto-encoder (:class:`GroupNormConvAutoEncoder`).
        label_weight: λ >= 0 of the head's cross-entropy (0: an unsupervised auto-encoder, no head).
        epochs: passes over the n sensitive images (T = round(epochs·n/B) steps). batch_size: B.
        clip_radius: C > 0, the per-sample gradient bound. lr: Adam's learning rate (cosine-decayed to 0).
        share: the fraction of the run's ε this stage is calibrated to on its own (the flow gets the rest of the
            composed budget; RDP composition makes the two shares sum to more than the whole).
    """
    latent_dim: int = 16
    width: int = 16
    groups: int = 8
    label_weight: float = 0.5
    epochs: float = 10.0
    batch_size: int = 1024
    clip_radius: float = 1.0
    lr: float = 2e-3
    share: float = 0.9
    version: int = 1

    def __post_init__(self):
        check_int(self.latent_dim, "latent_dim", 2)
        check_int(self.width, "width")
        check_int(self.groups, "groups")
        check_nonnegative(self.label_weight, "label_weight")
        check_positive(self.epochs, "epochs")
        check_int(self.batch_size, "batch_size")
        check_positive(self.clip_radius, "clip_radius")
        check_positive(self.lr, "lr")
        check_probability(self.share, "share", low_open=True, high_open=True)

    def steps(self, n: int) -> int:
        return max(1, int(round(self.epochs * n / self.batch_size)))


def _key(images: torch.Tensor, labels: torch.Tensor, cfg: RepresentationConfig, epsilon: float, delta: float,
         seed: int) -> str:
    h = hashlib.sha256(str(tuple(images.shape)).encode())
    h.update(images.contiguous().numpy().tobytes())
    h.update(labels.contiguous().numpy().tobytes())
    h.update(json.dumps(dict(asdict(cfg), epsilon=str(epsilon), delta=delta, seed=seed), sort_keys=True).encode())
    return "dprep_" + h.hexdigest()[:24]


def train_dp_representation(images: torch.Tensor, labels: torch.Tensor, cfg: RepresentationConfig, ledger, *,
                            num_classes: int, seed: int, secure_mode: bool = True, cache_dir: Optional[str] = None,
                            progress: bool = True) -> Tuple[GroupNormConvAutoEncoder, dict]:
    """Train the representation on the sensitive ``images`` with DP-SGD, recorded in ``ledger`` (stage
    ``"representation"``, its noise multiplier calibrated so that the stage alone spends ``cfg.share`` of the run's
    ε); ``ledger.private`` False trains without noise or clipping (the ε = ∞ reference).

    Args:
        images: (n, 1, 28, 28) uint8 sensitive images. labels: (n,) their labels (used only with a head).
        cfg: :class:`RepresentationConfig`. ledger: the run's :class:`fastdpot.privacy.composition.ComposedLedger`.
        num_classes: C, the label domain (public: never read from the private labels).
        seed: the public seed of the weights' initialisation (and of every draw with ``secure_mode=False``).
        secure_mode: batches and noise from the operating system (default).
        cache_dir: where the trained weights (a release) are kept, keyed by data, labels, config, ε, δ and seed;
            "" or None: no cache.
        progress: a bar.

    Returns:
        (model in eval mode, info: steps, noise multiplier, noise std, seconds, cached, ε of the ledger after).

    Raises:
        ValueError: bad images / labels.
    """
    from ..dpsgd import train_dp_sgd

    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or tuple(images.shape[1:]) != (1, 28, 28):
        raise ValueError(f"images must be (n, 1, 28, 28) uint8, got {getattr(images, 'dtype', None)} "
                         f"{tuple(getattr(images, 'shape', ()))}")
    n = images.shape[0]
    if not isinstance(labels, torch.Tensor) or tuple(labels.shape) != (n,):
        raise ValueError(f"labels must be ({n},), got {tuple(getattr(labels, 'shape', ()))}")
    T, B = cfg.steps(n), min(cfg.batch_size, n)
    z = None
    if ledger.private:
        z = ledger.calibrate(T, dataset_size=n, batch_size=B, epsilon=cfg.share * ledger.target_epsilon)
    num_classes = check_int(num_classes, "num_classes", 2)
    key = _key(images, labels, cfg, ledger.target_epsilon, ledger.delta, seed)
    path = os.path.join(cache_dir, key + ".pt") if cache_dir else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the weights' initialisation: public
        model = GroupNormConvAutoEncoder(cfg.latent_dim, cfg.width, cfg.groups,
                                         None if cfg.label_weight == 0 else num_classes)
    t0 = time.perf_counter()
    if path and os.path.isfile(path):
        blob = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(blob["state_dict"])
        if ledger.private:  # the cached weights are this stage's release: its steps count in this run's ledger
            ledger.record("representation", float(blob["noise_multiplier"]), int(blob["steps"]),
                          sampling="without_replacement", dataset_size=n, batch_size=B)
        model.eval()
        return model, dict(steps=int(blob["steps"]), noise_multiplier=blob["noise_multiplier"],
                           noise_std=blob["noise_std"], seconds=time.perf_counter() - t0, cached=True,
                           epsilon=ledger.epsilon(), batch_size=B)
    x = images.float().div_(255.0)
    res = train_dp_sgd(model, x, lambda m, xb, yb: representation_loss(m, xb, yb, cfg.label_weight), targets=labels,
                       steps=T, batch_size=B, clip_radius=cfg.clip_radius, noise_multiplier=z,
                       ledger=ledger if ledger.private else None, stage="representation", lr=cfg.lr,
                       scheduler=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=T),
                       generator=None if secure_mode else torch.Generator().manual_seed(seed + 7),
                       secure_mode=secure_mode, progress=progress)
    info = dict(steps=res.steps, noise_multiplier=res.noise_multiplier, noise_std=res.noise_std,
                seconds=time.perf_counter() - t0, cached=False, epsilon=ledger.epsilon(), batch_size=B)
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = path + f".tmp{os.getpid()}"
        torch.save(dict(state_dict={k: v.cpu() for k, v in model.state_dict().items()}, steps=res.steps,
                        noise_multiplier=float(res.noise_multiplier), noise_std=float(res.noise_std)), tmp)
        os.replace(tmp, path)
    return model, info


@torch.no_grad()
def head_labels(model: GroupNormConvAutoEncoder, latents: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    """The head's labels of latents (n, d) -> (n,) int64: post-processing of the DP-trained model."""
    return torch.cat([model.classify(latents[s:s + batch_size].float()).argmax(1)
                      for s in range(0, latents.shape[0], batch_size)]) if latents.numel() else \
        torch.zeros(0, dtype=torch.long)
