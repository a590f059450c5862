"""Generative models from locally privatised data with the entropic Wasserstein loss (Reshetova, Chen & Özgür).

Each user releases Y = clip(X) + N(0, σ² I) once (:func:`fastdpot.privacy.gaussian_local_mechanism`, (ε, δ)-LDP).
A generator trained on Y with the *entropic* loss W_{2, 2σ²}(P_G, Q_Y) -- regularisation matched to the noise and
*not* debiased -- has the clean distribution P_X as population minimiser (Reshetova, Chen & Özgür, Theorem 1):
the entropy term deconvolves. The unregularised loss (tiny blur) or the Sinkhorn divergence (debiased) fit the
noisy Q_Y instead. The guarantee is (ε, δ)-LDP for every user, independent of the number of training steps
(the data are released once; training is post-processing).

:func:`half_circle_experiment` reproduces the paper's 2-D experiment at a chosen size.
"""
from __future__ import annotations

import math
import time
from typing import Dict, Optional

import torch
from torch import nn

from ._validate import check_choice, check_int, check_positive
from .privacy import gaussian_local_mechanism
from .sinkhorn import entropic_regularization_for_noise, entropic_wasserstein, sinkhorn, squared_euclidean

__all__ = ["half_circle", "MLPGenerator2D", "train_generator", "wasserstein2", "half_circle_experiment", "LOSSES"]

#: training losses compared in the experiment
LOSSES = ("entropic", "unregularized", "debiased")


def half_circle(n: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """n points uniform on the upper unit half circle {(cos t, sin t): t ∈ [0, π]}. Shape (n, 2)."""
    n = check_int(n, "n")
    t = torch.rand(n, generator=generator) * math.pi
    return torch.stack([t.cos(), t.sin()], dim=1)


class MLPGenerator2D(nn.Module):
    """A small generator R^latent_dim → R²: MLP with two hidden ReLU layers. Shape: z (n, k) -> (n, 2)."""

    def __init__(self, latent_dim: int = 2, hidden: int = 64):
        super().__init__()
        self.latent_dim = check_int(latent_dim, "latent_dim")
        h = check_int(hidden, "hidden")
        self.net = nn.Sequential(nn.Linear(latent_dim, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 2))

    def forward(self, z):
        """Generated points: z (n, latent_dim) -> (n, 2)."""
        return self.net(z)

    def sample(self, n: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``n`` generated points (n, 2) from standard-normal latents drawn from ``generator``."""
        return self(torch.randn(n, self.latent_dim, generator=generator))


def _loss(kind: str, fake: torch.Tensor, data: torch.Tensor, sigma: float, tiny_blur: float, scaling: float,
          backend: str) -> torch.Tensor:
    reg = entropic_regularization_for_noise(sigma, p=2)
    if kind == "entropic":  # W_{2, 2σ²}: cost ‖·‖², ε = 2σ², not debiased
        return entropic_wasserstein(fake, data, p=2, reg=reg, scaling=scaling, backend=backend)
    cost = squared_euclidean(half=False)
    if kind == "unregularized":  # W_2² approximated by a tiny blur
        return sinkhorn(fake, data, blur=tiny_blur, cost=cost, debias=False, scaling=scaling, backend=backend)
    # the Sinkhorn divergence at the same ε = 2σ²: a divergence, so its minimiser is the noisy Q_Y itself
    return sinkhorn(fake, data, blur=math.sqrt(reg), cost=cost, debias=True, scaling=scaling, backend=backend)


def train_generator(data: torch.Tensor, sigma: float, loss: str = "entropic", steps: int = 300,
                    batch_size: Optional[int] = None, lr: float = 5e-3, tiny_blur: float = 0.01,
                    scaling: float = 0.7, backend: str = "auto", seed: int = 0,
                    latent_dim: int = 2, hidden: int = 64) -> MLPGenerator2D:
    """Train :class:`MLPGenerator2D` on privatised ``data`` with one of :data:`LOSSES` (full batch of the
    privatised data each step, ``batch_size`` generated samples, default as many as data rows).

    Shape: data (n, 2). σ: the local mechanism's noise standard deviation (sets λ = 2σ²).

    Raises:
        ValueError: unknown loss or bad sizes.
    """
    check_choice(loss, "loss", LOSSES)
    sigma = check_positive(sigma, "sigma")
    steps = check_int(steps, "steps")
    m = check_int(batch_size if batch_size is not None else data.shape[0], "batch_size")
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    gen = MLPGenerator2D(latent_dim, hidden)
    opt = torch.optim.Adam(gen.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        val = _loss(loss, gen.sample(m, generator=g), data, sigma, tiny_blur, scaling, backend)
        val.backward()
        opt.step()
    return gen


def wasserstein2(x: torch.Tensor, y: torch.Tensor) -> float:
    """Exact W₂ between two uniform empirical measures (POT ``ot.emd2``, squared-Euclidean cost). Shape (N, d),
    (M, d)."""
    import ot

    xd, yd = x.detach().double(), y.detach().double()
    C = torch.cdist(xd, yd) ** 2
    a = torch.full((xd.shape[0],), 1.0 / xd.shape[0], dtype=torch.float64)
    b = torch.full((yd.shape[0],), 1.0 / yd.shape[0], dtype=torch.float64)
    return math.sqrt(max(float(ot.emd2(a.numpy(), b.numpy(), C.numpy(), numItermax=10 ** 7)), 0.0))


def half_circle_experiment(num_points: int = 2000, epsilon: float = 5.0, delta: float = 1e-4, radius: float = 1.0,
                           steps: int = 300, batch_size: Optional[int] = None, eval_points: int = 2000,
                           losses=LOSSES, seed: int = 0, backend: str = "auto", lr: float = 5e-3,
                           tiny_blur: float = 0.01, secure_mode: bool = True) -> Dict:
    """The half-circle experiment of Reshetova, Chen & Özgür: privatise ``num_points`` clean points once with the Gaussian
    local mechanism (ε, δ; ℓ2 radius), train one generator per loss, report W₂ to fresh clean data.

    ``seed`` drives the synthetic data and training; the mechanism's noise comes from the operating system unless
    ``secure_mode=False`` (then from ``seed``: replayable, no guarantee against anyone who holds it).

    Returns:
        {"sigma", "reg", "w2": {loss: W₂(generated, clean)}, "w2_privatized": W₂(privatised data, clean),
        "seconds": {loss: s}, sizes}.
    """
    g = torch.Generator().manual_seed(seed)
    clean = half_circle(num_points, g)
    priv, sigma = gaussian_local_mechanism(clean, epsilon, delta, radius, generator=None if secure_mode else g,
                                           secure_mode=secure_mode)
    test = half_circle(eval_points, g)
    out = {"num_points": num_points, "epsilon": epsilon, "delta": delta, "sigma": sigma,
           "reg": entropic_regularization_for_noise(sigma), "steps": steps, "w2": {}, "seconds": {},
           "w2_privatized": wasserstein2(priv[:eval_points], test)}
    for kind in losses:
        t0 = time.time()
        gen = train_generator(priv, sigma, kind, steps, batch_size, lr=lr, tiny_blur=tiny_blur, backend=backend,
                              seed=seed + 1)
        out["seconds"][kind] = round(time.time() - t0, 1)
        with torch.no_grad():
            out["w2"][kind] = wasserstein2(gen.sample(eval_points, generator=g), test)
    return out


def main(argv=None):
    """``python -m fastdpot.ldp --points 2000 --steps 300``: prints the experiment's JSON summary."""
    import argparse
    import json

    p = argparse.ArgumentParser(description="Half-circle experiment with locally privatised data (Reshetova, Chen & Özgür)")
    p.add_argument("--points", type=int, default=2000)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--eval-points", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replayable-noise", action="store_true",
                   help="draw the mechanism's noise from --seed (replayable: NO privacy guarantee against anyone who "
                        "holds the seed); default: secret noise from the operating system")
    a = p.parse_args(argv)
    res = half_circle_experiment(a.points, steps=a.steps, batch_size=a.batch, eval_points=a.eval_points, seed=a.seed,
                                 secure_mode=not a.replayable_noise)
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
