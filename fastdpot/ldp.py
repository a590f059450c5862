"""Generative models from locally privatised data with the entropic Wasserstein loss (Reshetova, Chen & Özgür).

Each user releases Y = clip(X) + N(0, σ² I) once (:func:`fastdpot.privacy.gaussian_local_mechanism`, (ε, δ)-LDP).
A generator trained on Y with the *entropic* loss W_{2, 2σ²}(P_G, Q_Y) -- regularisation matched to the noise and
*not* debiased -- has the clean distribution P_X as population minimiser (Reshetova, Chen & Özgür, Theorem 1):
the entropy term deconvolves. The unregularised loss (tiny blur) or the Sinkhorn divergence (debiased) fit the
noisy Q_Y instead. The guarantee is (ε, δ)-LDP for every user, independent of the number of training steps
(the data are released once; training is post-processing).

:func:`half_circle_experiment` reproduces the paper's 2-D experiment at a chosen size, on CPU or CUDA
(``device=``; the data are drawn and privatised on the CPU, so a seed gives the same release on either). At the
paper's 400 000 points the privatised set is trained on in minibatches (``data_batch``: a fresh shuffle per epoch,
``data_batch`` privatised rows and as many generated points per step), since every Sinkhorn engine here is
quadratic in the batch (the dense ``tensorized`` engine needs (B, B) matrices; KeOps is absent on some GPU machines).
W₂ is evaluated exactly between ``eval_points`` generated and as many fresh clean points (:func:`wasserstein2`).
"""
from __future__ import annotations

import math
import time
from typing import Dict, Optional, Union

import torch
from torch import nn

from ._validate import check_choice, check_int, check_positive
from .privacy import gaussian_local_mechanism
from .sinkhorn import entropic_regularization_for_noise, entropic_wasserstein, sinkhorn, squared_euclidean

__all__ = ["half_circle", "MLPGenerator2D", "train_generator", "wasserstein2", "half_circle_experiment", "LOSSES",
           "check_device"]

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
        """``n`` generated points (n, 2) from standard-normal latents drawn from ``generator`` (on the generator's
        device, then moved to the module's: a CPU generator gives the same latents for a CPU or a CUDA model)."""
        z = torch.randn(n, self.latent_dim, generator=generator,
                        device=generator.device if generator is not None else None)
        return self(z.to(self.net[0].weight.device))


def check_device(device: Union[str, torch.device, None]) -> torch.device:
    """``device`` as a ``torch.device`` ("cpu", "cuda", "cuda:1"; None = "cpu").

    Raises:
        ValueError: a device type other than cpu / cuda, or a CUDA device while ``torch.cuda.is_available()`` is
            False (a CPU-only torch build or no visible GPU), or a CUDA index that does not exist.
    """
    try:
        dev = torch.device("cpu" if device is None else device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be 'cpu' or 'cuda[:index]', got {device!r} ({err})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda[:index]', got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={str(device)!r} but CUDA is not available here (torch {torch.__version__}, "
                             f"torch.cuda.is_available() is False); use device='cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device={str(device)!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return dev


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
                    latent_dim: int = 2, hidden: int = 64, *, data_batch: Optional[int] = None,
                    device: Union[str, torch.device, None] = None, time_budget_s: Optional[float] = None,
                    info: Optional[dict] = None) -> MLPGenerator2D:
    """Train :class:`MLPGenerator2D` on privatised ``data`` with one of :data:`LOSSES`.

    Each step compares ``batch_size`` generated samples (default: as many as privatised rows per step) with the
    privatised data: all of it (``data_batch=None``, full batch), or ``data_batch`` rows of it (minibatches: the
    rows are reshuffled at the start of every epoch and taken in consecutive chunks of ``data_batch``; a last
    chunk shorter than ``data_batch`` is skipped). Latents and shuffles come from a CPU generator seeded with
    ``seed`` (same draws on any device); the model and the Sinkhorn loss run on ``device`` (default: the device of
    ``data``).

    Shape: data (n, 2). σ: the local mechanism's noise standard deviation (sets λ = 2σ²).

    Args:
        time_budget_s: stop after the step during which this many seconds of training have passed (None: run
            all ``steps``); the number of steps taken goes to ``info["steps_done"]``.
        info: optional dict that receives ``steps_done`` and ``seconds``.

    Raises:
        ValueError: unknown loss or bad sizes, ``data_batch`` above the number of rows, a bad or unavailable
            ``device`` (:func:`check_device`).
    """
    check_choice(loss, "loss", LOSSES)
    sigma = check_positive(sigma, "sigma")
    steps = check_int(steps, "steps")
    dev = check_device(device) if device is not None else data.device
    n = data.shape[0]
    if data_batch is not None:
        data_batch = check_int(data_batch, "data_batch")
        if data_batch > n:
            raise ValueError(f"data_batch must be at most the number of privatised rows {n}, got {data_batch}")
    rows = n if data_batch is None else data_batch
    m = check_int(batch_size if batch_size is not None else rows, "batch_size")
    if time_budget_s is not None:
        time_budget_s = check_positive(time_budget_s, "time_budget_s")
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    gen = MLPGenerator2D(latent_dim, hidden).to(dev)
    data = data.to(dev)
    opt = torch.optim.Adam(gen.parameters(), lr=lr)
    perm, pos = None, n
    t0 = time.perf_counter()
    done = 0
    for _ in range(steps):
        if data_batch is None:
            target = data
        else:
            if pos + data_batch > n:  # a new epoch
                perm, pos = torch.randperm(n, generator=g).to(dev), 0
            target = data[perm[pos:pos + data_batch]]
            pos += data_batch
        opt.zero_grad(set_to_none=True)
        val = _loss(loss, gen.sample(m, generator=g), target, sigma, tiny_blur, scaling, backend)
        val.backward()
        opt.step()
        done += 1
        if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            break
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    if info is not None:
        info.update(steps_done=done, seconds=round(time.perf_counter() - t0, 2))
    return gen


def wasserstein2(x: torch.Tensor, y: torch.Tensor, solver: str = "auto") -> float:
    """Exact W₂ between two uniform empirical measures (squared-Euclidean cost). Shape (N, d), (M, d).

    ``solver``: ``"pot"`` (POT ``ot.emd2``, any N, M), ``"assignment"`` (N = M only: an optimal coupling of two
    uniform measures with as many atoms is a permutation (Birkhoff), found by scipy's
    ``linear_sum_assignment``, a dependency of fastdpot -- the same value as ``emd2``), or ``"auto"``: POT when it
    is installed, else the assignment. Both are O(N³)-ish in time and build the dense (N, M) float64 cost on the
    CPU: a few thousand points, not the experiment's 400 000.

    Raises:
        ValueError: an unknown solver, ``"assignment"`` with N ≠ M, ``"auto"`` without POT and N ≠ M.
        ImportError: ``"pot"`` without POT.
    """
    return _wasserstein2(x, y, solver)[0]


def _wasserstein2(x, y, solver="auto"):
    """(W₂, name of the solver used) -- see :func:`wasserstein2`."""
    check_choice(solver, "solver", ("auto", "pot", "assignment"))
    xd, yd = x.detach().double().cpu(), y.detach().double().cpu()
    if solver == "auto":
        try:
            import ot  # noqa: F401
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


def half_circle_experiment(num_points: int = 2000, epsilon: float = 5.0, delta: float = 1e-4, radius: float = 1.0,
                           steps: int = 300, batch_size: Optional[int] = None, eval_points: int = 2000,
                           losses=LOSSES, seed: int = 0, backend: str = "auto", lr: float = 5e-3,
                           tiny_blur: float = 0.01, secure_mode: bool = True, *, data_batch: Optional[int] = None,
                           device: Union[str, torch.device, None] = None, time_budget_s: Optional[float] = None,
                           w2_solver: str = "auto") -> Dict:
    """The half-circle experiment of Reshetova, Chen & Özgür: privatise ``num_points`` clean points once with the Gaussian
    local mechanism (ε, δ; ℓ2 radius), train one generator per loss, report W₂ to fresh clean data.

    ``seed`` drives the synthetic data and training; the mechanism's noise comes from the operating system unless
    ``secure_mode=False`` (then from ``seed``: replayable, no guarantee against anyone who holds it). Clean data,
    release and latents are drawn on the CPU; training runs on ``device`` ("cpu", "cuda"; :func:`check_device`)
    with ``data_batch`` privatised rows per step (None: all of them, full batch) -- see :func:`train_generator`.
    ``time_budget_s``: the training time allowed over all losses, split evenly (a loss that spends its share
    stops early; ``steps_done`` says how many steps each took). W₂ (:func:`wasserstein2`, exact, on the CPU) is
    computed between ``eval_points`` generated and ``eval_points`` fresh clean points, and for the first
    ``eval_points`` privatised rows.

    Returns:
        {"sigma", "reg", "w2": {loss: W₂(generated, clean)}, "w2_privatized": W₂(privatised data, clean),
        "seconds": {loss: s}, "steps_done": {loss: steps}, "w2_solver", "device", "backend", sizes}.

    Raises:
        ValueError: bad sizes, an unavailable device, ``data_batch`` above ``num_points``.
    """
    dev = check_device(device)
    g = torch.Generator().manual_seed(seed)
    clean = half_circle(num_points, g)
    priv, sigma = gaussian_local_mechanism(clean, epsilon, delta, radius, generator=None if secure_mode else g,
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
        gen = train_generator(priv, sigma, kind, steps, batch_size, lr=lr, tiny_blur=tiny_blur, backend=backend,
                              seed=seed + 1, data_batch=data_batch, device=dev, time_budget_s=share, info=info)
        out["seconds"][kind] = round(info["seconds"], 1)
        out["steps_done"][kind] = info["steps_done"]
        with torch.no_grad():
            out["w2"][kind] = _wasserstein2(gen.sample(eval_points, generator=g), test, solver)[0]
    return out


def main(argv=None):
    """``python -m fastdpot.ldp --points 2000 --steps 300 [--device cuda --data-batch 4096 --out res.json]``: runs
    :func:`half_circle_experiment`, prints its JSON summary (and writes it to ``--out``)."""
    import argparse
    import json
    import os

    p = argparse.ArgumentParser(description="Half-circle experiment with locally privatised data (Reshetova, Chen & Özgür)")
    p.add_argument("--points", type=int, default=2000, help="privatised points (the paper: 400000)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=None,
                   help="generated samples per step (default: as many as privatised rows per step)")
    p.add_argument("--data-batch", type=int, default=None,
                   help="privatised rows per step (minibatches, reshuffled every epoch; default: all of them)")
    p.add_argument("--eval-points", type=int, default=2000,
                   help="W2 is exact between this many generated and as many fresh clean points")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:index] (training and the Sinkhorn loss)")
    p.add_argument("--backend", default="auto", choices=("auto", "tensorized", "keops"),
                   help="Sinkhorn engine (auto: tensorized unless pykeops is there and the batch is large)")
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="training seconds over all three losses (split evenly; a loss stops early past its share)")
    p.add_argument("--out", default=None, help="also write the JSON summary to this file")
    p.add_argument("--replayable-noise", action="store_true",
                   help="draw the mechanism's noise from --seed (replayable: NO privacy guarantee against anyone who "
                        "holds the seed); default: secret noise from the operating system")
    a = p.parse_args(argv)
    try:
        check_device(a.device)
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
