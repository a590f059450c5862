"""Auto-encoders whose latent space hosts the DP flow (Sebag et al., TMLR), trained on the PUBLIC half only.

* :class:`ConvAutoEncoder` — the conv AE of the DPSWflow code for 28/32 px images: encoder convs
  (C→3, k3 s1 p1), (3→32, k4 s2 p1), (32→32, k3 s1 p1), (32→32, k3 s1 p1) with ReLU, linear 8192→d;
  decoder linear d→8192, reshape (32, 16, 16), three convs with ×2 upsampling, final conv, sigmoid.
  28 px inputs are zero-padded to 32 px and the output is cropped back.
* :class:`BatchNormConvAutoEncoder` (``arch="convbn"``, the main job's default for 28/32 px) — two stride-2 convs
  down to a (4w, H/4, W/4) map with batch normalisation, linear to d; the decoder mirrors it with two stride-2
  transposed convs (DCGAN-style, Radford et al. 2016, at MNIST size). On the public half of Fashion-MNIST it
  reconstructs held-out images with a lower error and FID than the DPSWflow AE at the same d (docs/mainjob/tuning.md).
* :class:`DCGANAutoEncoder` — DCGAN encoder/decoder (Radford et al. 2016) for 64 px images.

Latents are normalised to the unit sphere S^{d-1}, so two private latents differ by at most 2 in ℓ2 norm — the
bound the flow's sensitivity uses (diameter = 2·radius with radius 1). The auto-encoder and the public half are
public by assumption: nothing here is private, and the private half is never seen by this module.

Trained models are cached under ``cache_dir`` keyed by a SHA-256 hash of the training pixels and the config, so a
second run with the same public half and config loads the weights instead of retraining.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Optional, Tuple

import torch
from torch import nn
import torch.nn.functional as F

from ..._validate import check_choice, check_int, check_positive
from .config import AE_ARCHS

_log = logging.getLogger("fastdpot.experiments")  # the main job's logger: per-epoch training loss at INFO

__all__ = ["ConvAutoEncoder", "BatchNormConvAutoEncoder", "DCGANAutoEncoder", "AutoEncoderConfig", "build_autoencoder",
           "train_autoencoder", "encode", "decode", "default_cache_dir", "data_hash"]


def default_cache_dir() -> str:
    """``$FASTDPOT_CACHE`` or ``~/.cache/fastdpot``."""
    return os.environ.get("FASTDPOT_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "fastdpot"))


def _sphere(z: torch.Tensor) -> torch.Tensor:
    return z / z.norm(dim=1, keepdim=True).clamp_min(1e-12)


class ConvAutoEncoder(nn.Module):
    """Conv auto-encoder for (n, C, 28|32, 28|32) images in [0, 1] with unit-sphere latents of dimension d.

    Shape:
        encode: (n, C, H, W) -> (n, d) with rows of norm 1; decode: (n, d) -> (n, C, H, W) in [0, 1].

    References:
        Sebag et al., "Differentially private gradient flow based on the sliced Wasserstein distance", TMLR
        (auto-encoder of the DPSWflow code; Sebag et al., TMLR).
    """

    def __init__(self, channels: int = 1, image_size: int = 28, latent_dim: int = 8):
        super().__init__()
        check_int(channels, "channels")
        check_choice(image_size, "image_size", (28, 32))
        check_int(latent_dim, "latent_dim", minimum=2)
        self.channels, self.image_size, self.latent_dim = channels, image_size, latent_dim
        self.pad = (32 - image_size) // 2
        self.enc = nn.Sequential(
            nn.Conv2d(channels, 3, 3, 1, 1), nn.ReLU(inplace=True),
            nn.Conv2d(3, 32, 4, 2, 1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, 3, 1, 1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, 3, 1, 1), nn.ReLU(inplace=True),
            nn.Flatten(), nn.Linear(32 * 16 * 16, latent_dim))
        self.fc = nn.Linear(latent_dim, 32 * 16 * 16)
        self.dec = nn.Sequential(
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, 3, 1, 1), nn.ReLU(inplace=True),
            nn.Upsample(scale_factor=2, mode="nearest"),
            nn.Conv2d(32, 32, 3, 1, 1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 32, 3, 1, 1), nn.ReLU(inplace=True),
            nn.Conv2d(32, channels, 3, 1, 1), nn.Sigmoid())

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents on the unit sphere: images (n, C, H, W) in [0, 1] -> (n, d), rows of norm 1."""
        if self.pad:
            x = F.pad(x, (self.pad,) * 4)
        return _sphere(self.enc(x))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Images from latents: (n, d) -> (n, C, H, W) in [0, 1]."""
        out = self.dec(self.fc(z).view(-1, 32, 16, 16))
        if self.pad:
            p = self.pad
            out = out[:, :, p:-p, p:-p]
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Reconstruction ``decode(encode(x))``: (n, C, H, W) -> (n, C, H, W)."""
        return self.decode(self.encode(x))


class BatchNormConvAutoEncoder(nn.Module):
    """Batch-normalised conv auto-encoder for (n, C, 28|32, 28|32) images in [0, 1] with unit-sphere latents.

    Encoder: conv (C→w, k3 s1), conv (w→2w, k4 s2), conv (2w→4w, k4 s2), each with batch norm and ReLU, then linear
    4w·(H/4)² → d and scaling onto the unit sphere. Decoder: linear d → (4w, H/4, H/4), batch norm + ReLU, transposed
    conv (4w→2w, k4 s2), conv (2w→2w, k3), transposed conv (2w→w, k4 s2), each with batch norm and ReLU, conv
    (w→C, k3), sigmoid. About as many multiply-adds per image as :class:`ConvAutoEncoder` (w = 32).

    Shape:
        encode: (n, C, H, W) -> (n, d) with rows of norm 1; decode: (n, d) -> (n, C, H, W) in [0, 1].

    Raises:
        ValueError: ``image_size`` not 28 or 32, ``channels``, ``latent_dim`` (< 2) or ``width`` not positive.

    References:
        Radford, Metz, Chintala, "Unsupervised representation learning with deep convolutional GANs", ICLR 2016
        (strided convs, batch normalisation), at 28/32 px.
    """

    def __init__(self, channels: int = 1, image_size: int = 28, latent_dim: int = 16, width: int = 32):
        super().__init__()
        check_int(channels, "channels")
        check_choice(image_size, "image_size", (28, 32))
        check_int(latent_dim, "latent_dim", minimum=2)
        w = check_int(width, "width")
        self.channels, self.image_size, self.latent_dim, self.width = channels, image_size, latent_dim, w
        self.side = image_size // 4
        flat = 4 * w * self.side ** 2

        def block(conv, c):
            return [conv, nn.BatchNorm2d(c), nn.ReLU(inplace=True)]

        self.enc = nn.Sequential(
            *block(nn.Conv2d(channels, w, 3, 1, 1), w),
            *block(nn.Conv2d(w, 2 * w, 4, 2, 1), 2 * w),          # H/2
            *block(nn.Conv2d(2 * w, 4 * w, 4, 2, 1), 4 * w),      # H/4
            nn.Flatten(), nn.Linear(flat, latent_dim))
        self.fc = nn.Linear(latent_dim, flat)
        self.dec = nn.Sequential(
            nn.BatchNorm2d(4 * w), nn.ReLU(inplace=True),
            *block(nn.ConvTranspose2d(4 * w, 2 * w, 4, 2, 1), 2 * w),  # H/2
            *block(nn.Conv2d(2 * w, 2 * w, 3, 1, 1), 2 * w),
            *block(nn.ConvTranspose2d(2 * w, w, 4, 2, 1), w),          # H
            nn.Conv2d(w, channels, 3, 1, 1), nn.Sigmoid())

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents on the unit sphere: images (n, C, H, W) in [0, 1] -> (n, d), rows of norm 1."""
        return _sphere(self.enc(x))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Images from latents: (n, d) -> (n, C, H, W) in [0, 1]."""
        return self.dec(self.fc(z).view(-1, 4 * self.width, self.side, self.side))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Reconstruction ``decode(encode(x))``: (n, C, H, W) -> (n, C, H, W)."""
        return self.decode(self.encode(x))


class DCGANAutoEncoder(nn.Module):
    """DCGAN-style auto-encoder for (n, C, 64, 64) images in [0, 1] with unit-sphere latents.

    Shape:
        encode: (n, C, 64, 64) -> (n, d), rows of norm 1; decode: (n, d) -> (n, C, 64, 64) in [0, 1].

    References:
        Radford, Metz, Chintala, "Unsupervised representation learning with deep convolutional GANs", ICLR 2016;
        used for CelebA 64×64 in Sebag et al., TMLR.
    """

    def __init__(self, channels: int = 3, image_size: int = 64, latent_dim: int = 48, width: int = 64):
        super().__init__()
        check_int(channels, "channels")
        check_choice(image_size, "image_size", (64,))
        check_int(latent_dim, "latent_dim", minimum=2)
        check_int(width, "width")
        self.channels, self.image_size, self.latent_dim = channels, image_size, latent_dim
        w = width
        self.enc = nn.Sequential(
            nn.Conv2d(channels, w, 4, 2, 1), nn.LeakyReLU(0.2, inplace=True),                       # 32
            nn.Conv2d(w, 2 * w, 4, 2, 1), nn.BatchNorm2d(2 * w), nn.LeakyReLU(0.2, inplace=True),   # 16
            nn.Conv2d(2 * w, 4 * w, 4, 2, 1), nn.BatchNorm2d(4 * w), nn.LeakyReLU(0.2, inplace=True),  # 8
            nn.Conv2d(4 * w, 8 * w, 4, 2, 1), nn.BatchNorm2d(8 * w), nn.LeakyReLU(0.2, inplace=True),  # 4
            nn.Conv2d(8 * w, latent_dim, 4, 1, 0), nn.Flatten())                                   # 1
        self.dec = nn.Sequential(
            nn.Unflatten(1, (latent_dim, 1, 1)),
            nn.ConvTranspose2d(latent_dim, 8 * w, 4, 1, 0), nn.BatchNorm2d(8 * w), nn.ReLU(inplace=True),
            nn.ConvTranspose2d(8 * w, 4 * w, 4, 2, 1), nn.BatchNorm2d(4 * w), nn.ReLU(inplace=True),
            nn.ConvTranspose2d(4 * w, 2 * w, 4, 2, 1), nn.BatchNorm2d(2 * w), nn.ReLU(inplace=True),
            nn.ConvTranspose2d(2 * w, w, 4, 2, 1), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
            nn.ConvTranspose2d(w, channels, 4, 2, 1), nn.Sigmoid())

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents on the unit sphere: images (n, C, H, W) in [0, 1] -> (n, d), rows of norm 1."""
        return _sphere(self.enc(x))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Images from latents: (n, d) -> (n, C, H, W) in [0, 1]."""
        return self.dec(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Reconstruction ``decode(encode(x))``: (n, C, H, W) -> (n, C, H, W)."""
        return self.decode(self.encode(x))


@dataclass
class AutoEncoderConfig:
    """Architecture and training settings; every field enters the cache key."""
    arch: str = "conv"          # "conv" or "convbn" (28/32 px), "dcgan" (64 px)
    latent_dim: int = 8
    epochs: int = 5
    batch_size: int = 128
    lr: float = 1e-3
    schedule: str = "cosine"          # "cosine" (per-batch cosine decay of lr to 0 over all epochs) or "constant"
    seed: int = 0
    max_train: Optional[int] = None   # use at most this many public images (None: all)
    width: Optional[int] = None       # base channels (None: the architecture's default; "conv" has none)
    version: int = 1                  # bump when the architecture code changes

    def validate(self) -> "AutoEncoderConfig":
        """Check every field; returns ``self``.

        Raises:
            ValueError: a field out of its range (the message names it).
        """
        check_choice(self.arch, "arch", AE_ARCHS)
        check_int(self.latent_dim, "latent_dim", minimum=2)
        check_int(self.epochs, "epochs")
        check_int(self.batch_size, "batch_size")
        check_positive(self.lr, "lr")
        check_choice(self.schedule, "schedule", ("cosine", "constant"))
        if self.max_train is not None:
            check_int(self.max_train, "max_train")
        if self.width is not None:
            check_int(self.width, "width")
            if self.arch == "conv":
                raise ValueError("width does not apply to arch='conv' (fixed width); leave it None")
        return self


def build_autoencoder(config: AutoEncoderConfig, channels: int, image_size: int) -> nn.Module:
    """The auto-encoder named by ``config.arch`` for images of ``channels`` × ``image_size``²."""
    config.validate()
    if config.arch == "conv":
        return ConvAutoEncoder(channels, image_size, config.latent_dim)
    width = {} if config.width is None else {"width": config.width}
    if config.arch == "convbn":
        return BatchNormConvAutoEncoder(channels, image_size, config.latent_dim, **width)
    return DCGANAutoEncoder(channels, image_size, config.latent_dim, **width)


def data_hash(images: torch.Tensor) -> str:
    """SHA-256 (hex, 16 chars) of a uint8 image tensor's shape and bytes."""
    h = hashlib.sha256(str(tuple(images.shape)).encode())
    h.update(images.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _cache_key(images: torch.Tensor, config: AutoEncoderConfig) -> str:
    fields = asdict(config)
    if fields["width"] is None:  # keys of caches written before the field existed stay valid
        del fields["width"]
    cfg = json.dumps(fields, sort_keys=True)
    return f"ae_{config.arch}_d{config.latent_dim}_{data_hash(images)}_{hashlib.sha256(cfg.encode()).hexdigest()[:12]}"


def train_autoencoder(public_images: torch.Tensor, config: Optional[AutoEncoderConfig] = None, *,
                      cache_dir: Optional[str] = None, device="cpu", progress: bool = True
                      ) -> Tuple[nn.Module, dict]:
    """Train (or load from cache) an auto-encoder on PUBLIC images with a binary cross-entropy loss.

    Args:
        public_images: (n, C, H, W) uint8 tensor — the public half only; never pass private data here.
        config: :class:`AutoEncoderConfig` (defaults: conv AE, d = 8, 5 epochs, Adam lr 1e-3 with a per-batch
            cosine decay to 0).
        cache_dir: where weights are cached; ``None`` uses :func:`default_cache_dir`; ``""`` disables caching.
        device: torch device for training.
        progress: show a tqdm bar per epoch.

    Returns:
        (model in eval mode on ``device``, info dict with ``cached``, ``key``, ``train_loss`` (mean BCE of the last
        epoch), ``train_loss_per_epoch`` (one mean BCE per epoch; empty for a cache file written before it was kept),
        ``seconds``). Each epoch's mean BCE is also logged (logger ``fastdpot.experiments``, INFO).

    Raises:
        ValueError: ``public_images`` not a (n, C, H, W) uint8 tensor, or a bad config field.
    """
    from tqdm.auto import tqdm

    config = (config or AutoEncoderConfig()).validate()
    if not isinstance(public_images, torch.Tensor) or public_images.dtype != torch.uint8 or public_images.dim() != 4:
        raise ValueError("public_images must be a (n, C, H, W) uint8 tensor, got "
                         f"{getattr(public_images, 'dtype', type(public_images))} "
                         f"{tuple(getattr(public_images, 'shape', ()))}")
    imgs = public_images if config.max_train is None else public_images[:config.max_train]
    _, C, H, _ = imgs.shape
    key = _cache_key(imgs, config)
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    path = os.path.join(cache_dir, key + ".pt") if cache_dir else None
    t0 = time.perf_counter()
    if path and os.path.isfile(path):
        model = build_autoencoder(config, C, H)
        blob = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(blob["state_dict"])
        model.to(device).eval()
        return model, {"cached": True, "key": key, "path": path, "train_loss": float(blob["train_loss"]),
                       "train_loss_per_epoch": [float(v) for v in blob.get("train_loss_per_epoch", [])],
                       "seconds": time.perf_counter() - t0}
    g = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)  # deterministic weight initialisation
    model = build_autoencoder(config, C, H).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    n = imgs.shape[0]
    total = config.epochs * -(-n // config.batch_size)
    sched = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total) if config.schedule == "cosine" else None)
    last, per_epoch = float("nan"), []
    model.train()
    for epoch in range(config.epochs):
        perm = torch.randperm(n, generator=g)
        tot, cnt = 0.0, 0
        bar = tqdm(range(0, n, config.batch_size), desc=f"auto-encoder epoch {epoch + 1}/{config.epochs}",
                   disable=not progress, leave=False)
        for s in bar:
            xb = imgs[perm[s:s + config.batch_size]].to(device=device, dtype=torch.float32).div_(255.0)
            loss = F.binary_cross_entropy(model(xb), xb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            tot += float(loss.detach()) * xb.shape[0]
            cnt += xb.shape[0]
            bar.set_postfix(bce=f"{tot / cnt:.4f}")
        last = tot / max(cnt, 1)
        per_epoch.append(last)
        _log.info("auto-encoder epoch %d/%d: train BCE %.5f", epoch + 1, config.epochs, last)
    model.eval()
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        tmp = path + f".tmp{os.getpid()}"
        torch.save({"state_dict": {k: v.cpu() for k, v in model.state_dict().items()}, "train_loss": last,
                    "train_loss_per_epoch": per_epoch, "config": asdict(config)}, tmp)
        os.replace(tmp, path)
    return model, {"cached": False, "key": key, "path": path, "train_loss": last, "train_loss_per_epoch": per_epoch,
                   "seconds": time.perf_counter() - t0}


@torch.no_grad()
def encode(model: nn.Module, images: torch.Tensor, batch_size: int = 1024, device="cpu") -> torch.Tensor:
    """uint8 (n, C, H, W) images -> (n, d) float32 unit-sphere latents (on CPU)."""
    model.eval()
    out = [model.encode(images[s:s + batch_size].to(device=device, dtype=torch.float32).div_(255.0)).cpu()
           for s in range(0, images.shape[0], batch_size)]
    return torch.cat(out)


@torch.no_grad()
def decode(model: nn.Module, latents: torch.Tensor, batch_size: int = 1024, device="cpu") -> torch.Tensor:
    """(n, d) latents -> (n, C, H, W) float32 images in [0, 1] (on CPU)."""
    model.eval()
    out = [model.decode(latents[s:s + batch_size].to(device=device, dtype=torch.float32)).cpu()
           for s in range(0, latents.shape[0], batch_size)]
    return torch.cat(out)
