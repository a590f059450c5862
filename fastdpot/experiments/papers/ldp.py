"""The half-circle experiment of Reshetova, Chen & Özgür: generators trained on locally privatised 2-D points.

The training loop and the losses are the library's (:func:`fastdpot.ldp.train_generator`, :data:`fastdpot.ldp.LOSSES`);
this module holds the experiment around them: the clean data (:func:`half_circle`), the generator
(:class:`MLPGenerator2D`), the exact W₂ it is scored with (:func:`wasserstein2`), the whole run
(:func:`half_circle_experiment`) and its command line ``python -m fastdpot.experiments.papers.ldp``.

:func:`half_circle_experiment` reproduces the paper's 2-D experiment at a chosen size, on CPU or CUDA
(``device=``; the data are drawn and privatised on the CPU, so a seed gives the same release on either). At the
paper's 400 000 points the privatised set is trained on in minibatches (``data_batch``: a fresh shuffle per epoch,
``data_batch`` privatised rows and as many generated points per step), since every Sinkhorn engine here is
quadratic in the batch (the dense ``tensorized`` engine needs (B, B) matrices; KeOps is absent on some GPU
machines). W₂ is evaluated exactly between ``eval_points`` generated and as many fresh clean points.

References:
    D. Reshetova, W.-N. Chen, A. Özgür, "Training generative models from privatized data via entropic optimal
    transport" (preprint, 2023), §5 (the half-circle experiment).
"""
from __future__ import annotations

import math
import time
from typing import Dict, Optional, Union

import torch
from torch import nn

from ..._validate import (check_choice, check_device_available, check_int, check_positive, check_same_dim,
                         check_tensor)
from ...ldp import LOSSES, train_generator
from ...privacy import gaussian_local_mechanism
from ...sinkhorn import entropic_regularization_for_noise

__all__ = ["half_circle", "MLPGenerator2D", "wasserstein2", "half_circle_experiment", "main"]

W2_SOLVERS = ("auto", "pot", "assignment")


def half_circle(n: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """n points uniform on the upper unit half circle {(cos t, sin t): t ∈ [0, π]}. Shape (n, 2).

    Raises:
        ValueError: n < 1.
    """
    n = check_int(n, "n")
    t = torch.rand(n, generator=generator) * math.pi
    return torch.stack([t.cos(), t.sin()], dim=1)


class MLPGenerator2D(nn.Module):
    """A small generator R^latent_dim → R²: MLP with two hidden ReLU layers of width ``hidden``.

    Shape: z (n, latent_dim) -> (n, 2).

    Raises:
        ValueError: ``latent_dim`` or ``hidden`` < 1.
    """

    def __init__(self, latent_dim: int = 2, hidden: int = 64):
        super().__init__()
        self.latent_dim = check_int(latent_dim, "latent_dim")
        h = check_int(hidden, "hidden")
        self.net = nn.Sequential(nn.Linear(latent_dim, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 2))

    def forward(self, z):
        """Generated points: z (n, latent_dim) -> (n, 2)."""
        return self.net(z)

    def sample(self, n: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``n`` generated points (n, 2) from standard-normal latents drawn from ``generator`` (on the generator's
        device, then moved to the module's: a CPU generator gives the same latents for a CPU or a CUDA model)."""
        z = torch.randn(n, self.latent_dim, generator=generator,  # public draw: latents
                        device=generator.device if generator is not None else None)
        return self(z.to(self.net[0].weight.device))


def wasserstein2(x: torch.Tensor, y: torch.Tensor, solver: str = "auto") -> float:
    r"""Exact W₂ between two uniform empirical measures (squared-Euclidean cost), in the units of the points.

    .. math::
        W_2(x, y) = \Big(\min_{\pi \in \Pi(1/N, 1/M)} \sum_{ij} \pi_{ij} \|x_i - y_j\|^2\Big)^{1/2}

    ``solver``: ``"pot"`` (POT ``ot.emd2``, any N, M), ``"assignment"`` (N = M only: an optimal coupling of two
    uniform measures with as many atoms is a permutation (Birkhoff), found by scipy's
    ``linear_sum_assignment``, a dependency of fastdpot -- the same value as ``emd2``), or ``"auto"``: POT when it
    is installed, else the assignment. Both are O(N³)-ish in time and build the dense (N, M) float64 cost on the
    CPU: a few thousand points, not the experiment's 400 000.

    Shape: x (N, d), y (M, d) -> a float.

    Raises:
        TypeError: ``x`` or ``y`` not a tensor.
        ValueError: ``x`` or ``y`` empty, not 2-D, not floating point or with NaN / Inf (the message names the
            argument); different dimensions d; an unknown solver; ``"assignment"`` with N ≠ M; ``"auto"`` without
            POT and N ≠ M.
        ImportError: ``"pot"`` without POT.
    """
    return _wasserstein2(x, y, solver)[0]


def _wasserstein2(x, y, solver="auto"):
    """(W₂, name of the solver used) -- see :func:`wasserstein2`."""
    check_choice(solver, "solver", W2_SOLVERS)
    check_tensor(x, "x", ndim=2)
    check_tensor(y, "y", ndim=2)
    check_same_dim(x, y, "x", "y")
    xd, yd = x.detach().double().cpu(), y.detach().double().cpu()
    if solver == "auto":
        try:
            import ot as _pot  # noqa: F401  (only whether POT imports)
            solver = "pot"
        except ImportError:
            if xd.shape[0] != yd.shape[0]:
                raise ValueError(f"W2 without POT needs as many points on both sides (exact assignment), got "
                                 f"{xd.shape[0]} and {yd.shape[0]}; install POT (pip install pot)") from None
            solver = "assignment"
    C = torch.cdist(xd, yd) ** 2
    if solver == "pot":
        import ot

        a = torch.full((xd.shape[0],), 1.0 / xd.shape[0], dtype=torch.float64)
        b = torch.full((yd.shape[0],), 1.0 / yd.shape[0], dtype=torch.float64)
        val = float(ot.emd2(a.numpy(), b.numpy(), C.numpy(), numItermax=10 ** 7))
        return math.sqrt(max(val, 0.0)), "pot"
    if xd.shape[0] != yd.shape[0]:
        raise ValueError(f"solver='assignment' needs as many points on both sides, got {xd.shape[0]} and "
                         f"{yd.shape[0]}")
    from scipy.optimize import linear_sum_assignment

    Cn = C.numpy()
    rows, cols = linear_sum_assignment(Cn)
    return math.sqrt(max(float(Cn[rows, cols].mean()), 0.0)), "assignment"


def half_circle_experiment(num_points: int = 2000, epsilon: float = 5.0, delta: float = 1e-4,
                           clip_radius: float = 1.0, steps: int = 300, batch_size: Optional[int] = None,
                           eval_points: int = 2000, losses=LOSSES, seed: int = 0, backend: str = "auto",
                           lr: float = 5e-3, tiny_blur: float = 0.01, secure_mode: bool = True, *,
                           data_batch: Optional[int] = None, device: Union[str, torch.device, None] = None,
                           time_budget_s: Optional[float] = None, w2_solver: str = "auto") -> Dict:
    """The half-circle experiment of Reshetova, Chen & Özgür: privatise ``num_points`` clean points once with the
    Gaussian local mechanism (ε, δ; rows clipped to the ℓ2 ball of ``clip_radius``), train one
    :class:`MLPGenerator2D` per loss, report W₂ to fresh clean data.

    ``seed`` drives the synthetic data and training (every generator starts from the same initial weights, drawn
    from ``seed + 1``; the global RNG is left as it was); the mechanism's noise comes from the operating system
    unless ``secure_mode=False`` (then from ``seed``: replayable, no guarantee against anyone who holds it).
    Clean data, release and latents are drawn on the CPU; training runs on ``device`` ("cpu" (default), "cuda[:i]")
    with ``data_batch`` privatised rows per step (None: all of them, full batch) -- see
    :func:`fastdpot.ldp.train_generator`. ``time_budget_s``: the training time allowed over all losses, split
    evenly (a loss that spends its share stops early; ``steps_done`` says how many steps each took). W₂
    (:func:`wasserstein2`, exact, on the CPU) is computed between ``eval_points`` generated and ``eval_points``
    fresh clean points, and for the first ``eval_points`` privatised rows.

    Returns:
        {"sigma", "reg", "w2": {loss: W₂(generated, clean)}, "w2_privatized": W₂(privatised data, clean),
        "seconds": {loss: s}, "steps_done": {loss: steps}, "w2_solver", "device", "backend", sizes}.

    Raises:
        ValueError: bad sizes or losses, an unavailable device
            (:func:`fastdpot._validate.check_device_available`), ``data_batch`` above ``num_points``.
    """
    dev = check_device_available("cpu" if device is None else device)
    for kind in losses:
        check_choice(kind, "losses", LOSSES)
    g = torch.Generator().manual_seed(seed)
    clean = half_circle(num_points, g)
    priv, sigma = gaussian_local_mechanism(clean, epsilon, delta, clip_radius, generator=None if secure_mode else g,
                                           secure_mode=secure_mode)
    test = half_circle(eval_points, g)
    w2_priv, solver = _wasserstein2(priv[:eval_points], test, w2_solver)
    out = {"num_points": num_points, "epsilon": epsilon, "delta": delta, "sigma": sigma,
           "reg": entropic_regularization_for_noise(sigma), "steps": steps, "data_batch": data_batch,
           "batch_size": batch_size, "eval_points": eval_points, "device": str(dev), "backend": backend,
           "w2_solver": solver, "w2": {}, "seconds": {}, "steps_done": {}, "w2_privatized": w2_priv}
    priv = priv.to(dev)
    share = None if time_budget_s is None else check_positive(time_budget_s, "time_budget_s") / len(losses)
    for kind in losses:
        info = {}
        with torch.random.fork_rng(devices=[]):  # the same initial weights for every loss, from seed + 1
            torch.manual_seed(seed + 1)
            model = MLPGenerator2D().to(dev)
        train_generator(model, priv, sigma, kind, steps, batch_size, lr=lr, tiny_blur=tiny_blur, backend=backend,
                        seed=seed + 1, data_batch=data_batch, time_budget_s=share, info=info)
        out["seconds"][kind] = round(info["seconds"], 1)
        out["steps_done"][kind] = info["steps_done"]
        with torch.no_grad():
            fake = model.sample(eval_points, generator=g)  # public draw: the trained generator
            out["w2"][kind] = _wasserstein2(fake, test, solver)[0]
    return out


def _parser():
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m fastdpot.experiments.papers.ldp",
        description="Half-circle experiment with locally privatised data (Reshetova, Chen & Özgür): privatise "
                    "the points once (Gaussian local mechanism), train a generator per loss (entropic, "
                    "unregularized, debiased), print W2 to fresh clean points as JSON.")
    p.add_argument("--points", type=int, default=2000, help="privatised points (the paper: 400000)")
    p.add_argument("--steps", type=int, default=300, help="Adam steps per loss (default: %(default)s)")
    p.add_argument("--batch", type=int, default=None,
                   help="generated samples per step (default: as many as privatised rows per step)")
    p.add_argument("--data-batch", type=int, default=None,
                   help="privatised rows per step (minibatches, reshuffled every epoch; default: all of them)")
    p.add_argument("--eval-points", type=int, default=2000,
                   help="W2 is exact between this many generated and as many fresh clean points")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the clean data, the initial weights, latents and shuffles (and of the "
                        "mechanism's noise with --replayable-noise; default: %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:index] (training and the Sinkhorn loss)")
    p.add_argument("--backend", default="auto", choices=("auto", "tensorized", "keops"),
                   help="Sinkhorn engine (auto: tensorized unless pykeops is there and the batch is large)")
    p.add_argument("--lr", type=float, default=5e-3, help="Adam learning rate (default: %(default)s)")
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="training seconds over all three losses (split evenly; a loss stops early past its share)")
    p.add_argument("--out", default=None, help="also write the JSON summary to this file")
    p.add_argument("--replayable-noise", action="store_true",
                   help="draw the mechanism's noise from --seed (replayable: NO privacy guarantee against anyone who "
                        "holds the seed); default: secret noise from the operating system")
    return p


def main(argv=None):
    """``python -m fastdpot.experiments.papers.ldp --points 2000 --steps 300 [--device cuda --data-batch 4096 --out
    res.json]`` (``--help`` lists every option): runs :func:`half_circle_experiment`, prints its JSON summary (and
    writes it to ``--out``); returns it as a dict.

    Raises:
        SystemExit: bad options or an unavailable ``--device`` (argparse, exit code 2).
    """
    import json
    import os

    p = _parser()
    a = p.parse_args(argv)
    try:
        check_device_available(a.device, "--device")
    except ValueError as err:
        p.error(str(err))
    t0 = time.time()
    res = half_circle_experiment(a.points, steps=a.steps, batch_size=a.batch, eval_points=a.eval_points, seed=a.seed,
                                 secure_mode=not a.replayable_noise, backend=a.backend, lr=a.lr,
                                 data_batch=a.data_batch, device=a.device, time_budget_s=a.time_budget_s)
    res["total_seconds"] = round(time.time() - t0, 1)
    if torch.device(a.device).type == "cuda":
        res["gpu"] = torch.cuda.get_device_name(torch.device(a.device))
    res["torch"] = torch.__version__
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return res


if __name__ == "__main__":
    main()
