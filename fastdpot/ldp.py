"""Generative models from locally privatised data with the entropic Wasserstein loss (Reshetova, Chen & Özgür).

Each user releases Y = clip(X) + N(0, σ² I) once (:func:`fastdpot.privacy.gaussian_local_mechanism`, (ε, δ)-LDP).
A generator trained on Y with the *entropic* loss W_{2, 2σ²}(P_G, Q_Y) -- regularisation matched to the noise and
*not* debiased -- has the clean distribution P_X as population minimiser (Reshetova, Chen & Özgür, Theorem 1):
the entropy term deconvolves. The unregularised loss (tiny blur) or the Sinkhorn divergence (debiased) fit the
noisy Q_Y instead. The guarantee is (ε, δ)-LDP for every user, independent of the number of training steps
(the data are released once; training is post-processing).

:func:`train_generator` trains the caller's generator module on the privatised rows with one of :data:`LOSSES`,
full batch or in minibatches (``data_batch``: a fresh shuffle per epoch), since every Sinkhorn engine here is
quadratic in the batch. The paper's 2-D half-circle experiment (data, generator, exact W₂, command line) is
:mod:`fastdpot.experiments.papers.ldp`.

References:
    D. Reshetova, W.-N. Chen, A. Özgür, "Training generative models from privatized data via entropic optimal
    transport" (preprint, 2023).
"""
from __future__ import annotations

import math
import time
from typing import Optional

import torch
from torch import nn

from ._validate import check_choice, check_int, check_positive, check_probability, check_seed, check_tensor
from .generators import check_generator_model, check_generator_output, model_dtype_device
from .sinkhorn import (SINKHORN_BACKENDS, entropic_regularization_for_noise, entropic_wasserstein, sinkhorn,
                       squared_euclidean)

__all__ = ["train_generator", "LOSSES"]

#: training losses compared in the experiment: "entropic" (W_{2,2σ²}, not debiased), "unregularized" (W₂² by a
#: tiny blur), "debiased" (the Sinkhorn divergence at ε = 2σ²)
LOSSES = ("entropic", "unregularized", "debiased")


def _loss(kind: str, fake: torch.Tensor, data: torch.Tensor, sigma: float, tiny_blur: float, scaling: float,
          backend: str) -> torch.Tensor:
    """The training loss ``kind`` of :data:`LOSSES` between generated (m, d) and privatised (r, d) rows."""
    reg = entropic_regularization_for_noise(sigma, p=2)
    if kind == "entropic":  # W_{2, 2σ²}: cost ‖·‖², ε = 2σ², not debiased
        return entropic_wasserstein(fake, data, p=2, reg=reg, scaling=scaling, backend=backend)
    cost = squared_euclidean(half=False)
    if kind == "unregularized":  # W_2² approximated by a tiny blur
        return sinkhorn(fake, data, blur=tiny_blur, cost=cost, debias=False, scaling=scaling, backend=backend)
    # the Sinkhorn divergence at the same ε = 2σ²: a divergence, so its minimiser is the noisy Q_Y itself
    return sinkhorn(fake, data, blur=math.sqrt(reg), cost=cost, debias=True, scaling=scaling, backend=backend)


def train_generator(model: nn.Module, data: torch.Tensor, sigma: float, loss: str = "entropic", steps: int = 300,
                    batch_size: Optional[int] = None, lr: float = 5e-3, tiny_blur: float = 0.01,
                    scaling: float = 0.7, backend: str = "auto", seed: int = 0, *, data_batch: Optional[int] = None,
                    time_budget_s: Optional[float] = None, info: Optional[dict] = None) -> nn.Module:
    """Train the caller's generator ``model`` (in place, Adam) on privatised ``data`` with one of :data:`LOSSES`.

    Each step compares ``batch_size`` generated samples (default: as many as privatised rows per step) with the
    privatised data: all of it (``data_batch=None``, full batch), or ``data_batch`` rows of it (minibatches: the
    rows are reshuffled at the start of every epoch and taken in consecutive chunks of ``data_batch``; a last
    chunk shorter than ``data_batch`` is skipped). Latents and shuffles come from a CPU generator seeded with
    ``seed`` (same draws on any device); the global torch RNG is left as the caller had it (training runs under
    ``torch.random.fork_rng``). The model and the Sinkhorn loss run on the model's device; ``data`` is moved
    there. No privacy is spent here: ``data`` is already privatised (training is post-processing).

    Args:
        model: the generator, an ``nn.Module`` with an integer attribute ``latent_dim`` mapping (m, latent_dim)
            standard-normal latents to (m, d) points (e.g.
            :class:`fastdpot.experiments.papers.ldp.MLPGenerator2D`); its initial weights are the caller's.
        data: (n, d) privatised rows.
        sigma: σ > 0, the local mechanism's noise standard deviation per coordinate (sets λ = 2σ²).
        loss: one of :data:`LOSSES`.
        steps: number of Adam steps (learning rate ``lr``).
        tiny_blur: the blur of ``"unregularized"`` (ε = tiny_blur²).
        scaling: ε-scaling ratio of the Sinkhorn solver, in (0, 1).
        backend: Sinkhorn engine (:data:`fastdpot.sinkhorn.SINKHORN_BACKENDS`).
        seed: seed of the latents and of the shuffles.
        time_budget_s: stop after the step during which this many seconds of training have passed (None: run
            all ``steps``); the number of steps taken goes to ``info["steps_done"]``.
        info: optional dict that receives ``steps_done`` and ``seconds``.

    Shape: data (n, d); model: (m, latent_dim) -> (m, d).

    Returns:
        ``model``, trained.

    Raises:
        TypeError: ``model`` not an ``nn.Module``, ``data`` not a tensor.
        ValueError: an unknown loss or backend, bad sizes, ``data_batch`` above the number of rows, non-finite or
            empty data, a model without ``latent_dim`` or whose points have another dimension than the data.

    References:
        Reshetova, Chen & Özgür, "Training generative models from privatized data via entropic optimal
        transport" (Theorem 1: the population minimiser of W_{2,2σ²} is the clean distribution).
    """
    check_choice(loss, "loss", LOSSES)
    sigma = check_positive(sigma, "sigma")
    check_generator_model(model, "model", ("latent_dim",))
    dtype, dev = model_dtype_device(model)
    check_tensor(data, "data", ndim=2)
    steps = check_int(steps, "steps")
    lr = check_positive(lr, "lr")
    tiny_blur = check_positive(tiny_blur, "tiny_blur")
    scaling = check_probability(scaling, "scaling", high_open=True)
    check_choice(backend, "backend", SINKHORN_BACKENDS)
    seed = check_seed(seed, "seed")
    n = data.shape[0]
    if data_batch is not None:
        data_batch = check_int(data_batch, "data_batch")
        if data_batch > n:
            raise ValueError(f"data_batch must be at most the number of privatised rows {n}, got {data_batch}")
    rows = n if data_batch is None else data_batch
    m = check_int(batch_size if batch_size is not None else rows, "batch_size")
    if time_budget_s is not None:
        time_budget_s = check_positive(time_budget_s, "time_budget_s")
    if info is not None and not isinstance(info, dict):
        raise ValueError(f"info must be a dict or None, got {type(info).__name__}")
    check_generator_output(model, (torch.zeros(2, model.latent_dim, dtype=dtype, device=dev),), (data.shape[1],), "model",
                  "(m, latent_dim) latents")
    g = torch.Generator().manual_seed(seed)
    data = data.to(device=dev, dtype=dtype)
    opt = torch.optim.Adam([q for q in model.parameters() if q.requires_grad], lr=lr)
    perm, pos = None, n
    t0 = time.perf_counter()
    done = 0
    model.train()
    with torch.random.fork_rng(devices=[]):  # whatever the model draws from the global RNG is not kept
        for _ in range(steps):
            if data_batch is None:
                target = data
            else:
                if pos + data_batch > n:  # a new epoch
                    perm, pos = torch.randperm(n, generator=g).to(dev), 0
                target = data[perm[pos:pos + data_batch]]
                pos += data_batch
            opt.zero_grad(set_to_none=True)
            z = torch.randn(m, model.latent_dim, generator=g).to(device=dev, dtype=dtype)  # drawn on the CPU
            val = _loss(loss, model(z), target, sigma, tiny_blur, scaling, backend)
            val.backward()
            opt.step()
            done += 1
            if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
                break
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    if info is not None:
        info.update(steps_done=done, seconds=round(time.perf_counter() - t0, 2))
    return model
