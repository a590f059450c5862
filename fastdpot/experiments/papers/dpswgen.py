"""DPSWgen experiments: the generator models of the baseline and a held-out evaluation.

The training loop is the library's :func:`fastdpot.dpswgen.train_dpswgen`; this module only holds what an
experiment plugs into it: :class:`MLPGenerator` (the MLP of Sebag et al., TMLR), :class:`ConvGenerator` (a small
image generator) and :func:`evaluate_sw` (non-private SW₂² to held-out data).

Example::

    with torch.random.fork_rng(devices=[]):      # initial weights from a seed, the global RNG left as it was
        torch.manual_seed(0)
        model = MLPGenerator(latent_dim=8, out_dim=private.shape[1])
    res = train_dpswgen(private, model, epsilon=10.0, delta=1e-5, steps=4200, batch_size=250)
    print(res.epsilon, evaluate_sw(res, public))
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from ..._validate import check_int, check_tensor
from ...dpswgen import DPSWgenResult
from ...sliced import sliced_wasserstein

__all__ = ["MLPGenerator", "ConvGenerator", "evaluate_sw"]


class MLPGenerator(nn.Module):
    """The DPSWgen generator: latent → 256 → ReLU → 512 → BN → ReLU → 256 → ReLU → out (linear output).

    Shape: (B, latent_dim) -> (B, out_dim).

    References:
        Sebag et al., "Differentially private gradient flow based on the sliced Wasserstein distance", TMLR
        (the DPSWgen baseline's generator).
    """

    def __init__(self, latent_dim: int, out_dim: int):
        super().__init__()
        self.latent_dim = check_int(latent_dim, "latent_dim")
        self.out_dim = check_int(out_dim, "out_dim")
        self.net = nn.Sequential(
            nn.Linear(latent_dim, 256), nn.ReLU(),
            nn.Linear(256, 512), nn.BatchNorm1d(512), nn.ReLU(),
            nn.Linear(512, 256), nn.ReLU(),
            nn.Linear(256, out_dim),
        )

    def forward(self, z):
        """Generated rows: z (B, latent_dim) latent codes -> (B, out_dim)."""
        return self.net(z)


class ConvGenerator(nn.Module):
    """A small transposed-convolution generator for images in [0, 1] (sigmoid output).

    latent → linear → (64, H/4, W/4) → ConvT(64→32, ×2) → BN → ReLU → ConvT(32→C, ×2) → sigmoid.

    Shape: (B, latent_dim) -> (B, C, H, W), H and W multiples of 4.

    Raises:
        ValueError: ``image_shape`` not (C, H, W) with H and W multiples of 4; ``latent_dim`` < 1.
    """

    def __init__(self, latent_dim: int, image_shape: Sequence[int]):
        super().__init__()
        if len(image_shape) != 3 or image_shape[1] % 4 or image_shape[2] % 4:
            raise ValueError(f"image_shape must be (C, H, W) with H, W multiples of 4, got {tuple(image_shape)}")
        self.latent_dim = check_int(latent_dim, "latent_dim")
        self.image_shape = tuple(int(s) for s in image_shape)
        c, h, w = self.image_shape
        self.h4, self.w4 = h // 4, w // 4
        self.fc = nn.Sequential(nn.Linear(latent_dim, 64 * self.h4 * self.w4), nn.ReLU())
        self.deconv = nn.Sequential(
            nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.ConvTranspose2d(32, c, 4, 2, 1), nn.Sigmoid(),
        )

    def forward(self, z):
        """Generated images: z (B, latent_dim) latent codes -> (B, C, H, W) in [0, 1]."""
        return self.deconv(self.fc(z).view(-1, 64, self.h4, self.w4))


def evaluate_sw(result_or_model, data: torch.Tensor, num_samples: int = 500, num_projections: int = 200,
                generator: Optional[torch.Generator] = None) -> float:
    """Non-private SW₂² between ``num_samples`` generated rows and the first ``num_samples`` rows of ``data``.

    For evaluation on held-out / public data only: evaluating on private data is a release that is not accounted.
    ``generator`` draws the latents, then the directions (the same generator state gives the same value).

    Shape: data (m, \\*S) with the generator's row shape S; rows are flattened. Returns a float (squared units of
    the data).

    Raises:
        TypeError: ``data`` not a tensor. ValueError: empty or non-finite ``data``, sizes < 1.
    """
    net = result_or_model.generator if isinstance(result_or_model, DPSWgenResult) else result_or_model
    check_tensor(data, "data")
    num_samples = check_int(num_samples, "num_samples")
    num_projections = check_int(num_projections, "num_projections")
    was = net.training
    net.eval()
    try:
        with torch.no_grad():
            z = torch.randn(num_samples, net.latent_dim, generator=generator, dtype=data.dtype)  # public draw: latents
            y = net(z.to(data.device)).reshape(num_samples, -1)
            x = data.reshape(data.shape[0], -1)[:num_samples]
            val = float(sliced_wasserstein(x, y, num_projections=num_projections, generator=generator))
    finally:
        net.train(was)
    return val
