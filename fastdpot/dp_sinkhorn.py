"""DP-Sinkhorn (Cao et al., NeurIPS 2021): a generator trained with the semi-debiased Sinkhorn loss
whose only contact with private data is a sanitised gradient w.r.t. the generated images.

Privacy argument, as enforced by :func:`train_dp_sinkhorn`:

* the released quantity of one step is the sanitised image gradient Ĝ = clip(∂L/∂G) + N(0, σ²) on the B
  generated rows G that enter OT_ε(G, real); the generator update is post-processing of Ĝ (the latents, labels
  and the debiasing rows are drawn from a generator independent of the data);
* real batches are Poisson subsamples (:class:`~fastdpot.privacy.PoissonSampler`, rate q) and every step is
  recorded as a Poisson-subsampled Gaussian (add/remove neighbours) *before* the release, in the run's
  :class:`~fastdpot.privacy.PrivacyLedger` through its :class:`~fastdpot.privacy.PrivacyBudget` -- the run stops
  when the next step would exceed (ε, δ);
* sensitivity of Ĝ to one real record. ∂L/∂G is not a sum of per-record terms: adding or removing one record
  changes every row. With ``clipping="joint"`` (the whole (B, D) gradient clipped to Frobenius norm C, as the
  authors' code does) the two neighbouring outputs lie in a ball of radius C, so Δ = 2C and σ = z·2C -- the
  paper's N(0, (2Cz)²). With ``clipping="per_sample"`` (each row clipped to C) each row may move by 2C, so
  Δ = 2C·√B and σ = z·2C·√B. Either way the accountant receives z = σ/Δ;
* the rB regenerated ("debiasing") rows enter only OT_ε(G, G'), never the real batch: their gradient is a
  function of generator outputs alone, so it is clipped (to C per row, for a consistent scale) but needs no noise.
  Their gradient still depends on G, which is fine: G is data-independent.
* randomness (``DPSinkhornConfig.secure_mode``, default True): the Poisson batches and the sanitiser's noise come
  from the operating system (:class:`~fastdpot.privacy.randomness.PrivacyRandomness`; secret, never stored, float64
  wide-tail normals cast to float32); ``seed`` drives only the public draws (parameter initialisation, latents,
  fake labels). ``secure_mode=False`` draws everything from ``seed`` (replayable; no guarantee against anyone who
  holds the seed);
* nothing computed from the private batch is returned unnoised: :class:`DPSinkhornResult` holds, per step, the
  norm of the released (sanitised) gradient, not the loss OT(G, real) (which is private).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from ._validate import check_choice, check_int, check_nonnegative, check_positive, check_probability, check_tensor
from .privacy import BudgetExceededError, PoissonSampler, PrivacyBudget, PrivacyLedger
from .privacy.randomness import PrivacyRandomness, privacy_randomness
from .sinkhorn import class_conditional, semi_debiased_sinkhorn_loss, sinkhorn, squared_euclidean_l1

__all__ = ["sensitivity_factor", "sanitize_image_gradient", "ConditionalDCGANGenerator", "DPSinkhornConfig",
           "DPSinkhornResult", "dp_sinkhorn_step", "train_dp_sinkhorn", "evaluate_generator"]

CLIPPINGS = ("joint", "per_sample")


def sensitivity_factor(clipping: str, num_rows: int) -> float:
    """Δ / C of the clipped (B, D) image gradient under add/remove of one real record: 2 (joint) or 2·√B
    (per_sample). σ = z·C·factor."""
    check_choice(clipping, "clipping", CLIPPINGS)
    num_rows = check_int(num_rows, "num_rows")
    return 2.0 if clipping == "joint" else 2.0 * math.sqrt(num_rows)


def sanitize_image_gradient(grad: torch.Tensor, num_private_rows: int, clip_norm: float, noise_multiplier: float,
                            clipping: str = "joint", generator: Optional[torch.Generator] = None,
                            return_noise: bool = False, *, secure_mode: bool = True):
    """Clip and noise the gradient of the loss w.r.t. the generated images (the DP-Sinkhorn release).

    Rows ``[:num_private_rows]`` touch the real data (they enter OT_ε(G, real)); they are clipped (``"joint"``:
    the block to Frobenius norm C; ``"per_sample"``: each row to C) and get N(0, σ²) noise with
    σ = z·C·:func:`sensitivity_factor`. The remaining (debiasing) rows are clipped per row to C, no noise
    (they are functions of generator outputs only).

    Shape: grad (B + rB, D) -> (B + rB, D). σ is a standard deviation per gradient entry.

    Noise: float64 wide-tail normals (:meth:`~fastdpot.privacy.randomness.PrivacyRandomness.normal`) cast to the
    gradient's dtype; from the operating system with ``secure_mode=True`` (default; a ``torch.Generator`` then
    raises), from ``generator`` with ``secure_mode=False`` (replayable). ``generator`` may also be a
    :class:`~fastdpot.privacy.randomness.PrivacyRandomness`.

    Returns:
        ``(sanitised, sigma)`` (plus the noise tensor if ``return_noise``, for replay in tests).

    Raises:
        ValueError: bad shapes or parameters, a ``torch.Generator`` with ``secure_mode=True``.

    References:
        Cao et al., NeurIPS 2021, §4.3 and Algorithm 1; the per-sample factor is derived in the module doc.
    """
    check_tensor(grad, "grad", ndim=2)
    B = check_int(num_private_rows, "num_private_rows")
    if B > grad.shape[0]:
        raise ValueError(f"num_private_rows must be <= grad.shape[0] = {grad.shape[0]}, got {B}")
    C = check_positive(clip_norm, "clip_norm")
    z = check_nonnegative(noise_multiplier, "noise_multiplier")
    check_choice(clipping, "clipping", CLIPPINGS)
    rng = generator if isinstance(generator, PrivacyRandomness) else privacy_randomness(secure_mode, generator)
    priv, extra = grad[:B], grad[B:]
    if clipping == "joint":
        priv = priv * (C / priv.norm().clamp_min(C))
    else:
        priv = priv * (C / priv.norm(dim=1, keepdim=True).clamp_min(C))
    extra = extra * (C / extra.norm(dim=1, keepdim=True).clamp_min(C))
    sigma = z * C * sensitivity_factor(clipping, B)
    noise = (rng.normal(priv.shape, dtype=torch.float64, device=priv.device) * sigma).to(priv.dtype)
    out = torch.cat([priv + noise, extra], dim=0)
    return (out, sigma, noise) if return_noise else (out, sigma)


class ConditionalDCGANGenerator(nn.Module):
    """Class-conditional DCGAN generator for 28×28 single-channel images (latent ‖ one-hot label → image).

    Linear → (2c, 7, 7) → ConvT(4, 2, 1) → BN → ReLU → (c, 14, 14) → ConvT(4, 2, 1) → sigmoid → (1, 28, 28).

    Shape: z (n, latent_dim), labels (n,) -> (n, 1, 28, 28) in [0, 1].
    """

    def __init__(self, latent_dim: int = 32, num_classes: int = 10, channels: int = 64):
        super().__init__()
        self.latent_dim, self.num_classes = check_int(latent_dim, "latent_dim"), check_int(num_classes, "num_classes")
        c = check_int(channels, "channels")
        self.fc = nn.Sequential(nn.Linear(latent_dim + num_classes, 2 * c * 7 * 7), nn.BatchNorm1d(2 * c * 7 * 7),
                                nn.ReLU(True))
        self.net = nn.Sequential(nn.ConvTranspose2d(2 * c, c, 4, 2, 1), nn.BatchNorm2d(c), nn.ReLU(True),
                                 nn.ConvTranspose2d(c, 1, 4, 2, 1), nn.Sigmoid())
        self.c = c

    def forward(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Images of the given classes: z (n, latent_dim) latent codes, labels (n,) integers in
        [0, num_classes) -> (n, 1, 28, 28) in [0, 1].
        """
        h = torch.cat([z, nn.functional.one_hot(labels.long(), self.num_classes).to(z.dtype)], dim=1)
        return self.net(self.fc(h).view(-1, 2 * self.c, 7, 7))

    def sample(self, labels: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Images of the classes ``labels`` (n,) from fresh standard-normal latents drawn from ``generator``
        -> (n, 1, 28, 28).
        """
        z = torch.randn(labels.shape[0], self.latent_dim, generator=generator)
        return self(z, labels)


@dataclass
class DPSinkhornConfig:
    """Hyper-parameters of :func:`train_dp_sinkhorn` (defaults: a short CPU run on Fashion-MNIST).

    ``noise_multiplier=None`` calibrates z so that ``max_steps`` steps reach exactly ``target_epsilon``.
    ``secure_mode`` (default True): batches and noise from the operating system, ``seed`` only for public draws;
    False: everything replayable from ``seed`` (no guarantee against anyone who holds it).
    Opacus' names are accepted as constructor aliases: ``max_grad_norm`` for ``clip_norm`` and ``target_delta`` for
    ``delta`` (giving an alias and a non-default canonical value that differ is a ValueError); after construction
    only the canonical fields hold the values (the aliases read None).
    """
    target_epsilon: float = 10.0
    delta: float = 1e-5
    expected_batch_size: int = 256       # q·n: Poisson rate q = expected_batch_size / n
    generated_batch_size: int = 256      # B generated rows per step
    ratio: float = 0.2                   # semi-debiasing ratio r (paper: grid-searched, 0.2 best on F-MNIST)
    clip_norm: float = 0.5               # C
    clipping: str = "joint"
    noise_multiplier: Optional[float] = None
    max_steps: int = 600
    lr: float = 1e-3
    blur: float = 1.0                    # ε = blur² on the cost ‖·‖² + m‖·‖₁ of pixel vectors in [0, 1]
    scaling: float = 0.5
    l1_weight: float = 3.0               # m (3 for Fashion-MNIST)
    class_scale: float = 15.0
    latent_dim: int = 32
    channels: int = 64
    accountant: str = "pld"
    seed: int = 0
    secure_mode: bool = True
    max_grad_norm: Optional[float] = None  # Opacus alias of clip_norm
    target_delta: Optional[float] = None   # Opacus alias of delta

    def __post_init__(self):
        for alias, name, default in (("max_grad_norm", "clip_norm", 0.5), ("target_delta", "delta", 1e-5)):
            value = getattr(self, alias)
            if value is None:
                continue
            if getattr(self, name) not in (default, value):
                raise ValueError(f"give {name} or its alias {alias}, not both (got {name}={getattr(self, name)!r}, "
                                 f"{alias}={value!r})")
            setattr(self, name, value)
            setattr(self, alias, None)


@dataclass
class DPSinkhornResult:
    generator: ConditionalDCGANGenerator
    config: DPSinkhornConfig
    noise_multiplier: float
    sigma: float
    steps: int
    epsilon: float
    delta: float
    stopped_by_budget: bool
    released_norms: List[float] = field(default_factory=list)  # ‖Ĝ_private‖_F per step (post-processing)
    seconds: float = 0.0

    def summary(self) -> Dict:
        """The run's headline numbers (steps, ε, δ, noise, stop reason, seconds) as a JSON-able dict."""
        return {"steps": self.steps, "epsilon": self.epsilon, "delta": self.delta,
                "noise_multiplier": self.noise_multiplier, "sigma": self.sigma,
                "stopped_by_budget": self.stopped_by_budget, "seconds": round(self.seconds, 1),
                "config": asdict(self.config)}


def dp_sinkhorn_step(gen: ConditionalDCGANGenerator, real: torch.Tensor, real_labels: torch.Tensor,
                     fake_labels: torch.Tensor, cfg: DPSinkhornConfig, noise_multiplier: float,
                     generator: torch.Generator, noise_source: Optional[PrivacyRandomness] = None
                     ) -> Tuple[float, float]:
    """One DP-Sinkhorn step: generate, compute the semi-debiased loss, sanitise ∂L/∂images, backpropagate the
    sanitised gradient into ``gen``'s parameters (post-processing). Leaves gradients in ``gen``'s ``.grad``.

    The caller must have recorded the release in the budget *before* calling. An empty Poisson batch releases
    pure noise on the private rows (the cross-term gradient is 0).

    ``generator`` draws the public latents; the sanitiser's noise comes from ``noise_source`` (default: the OS
    when ``cfg.secure_mode``, else ``generator``).

    Shape: real (M, 784) flattened images in [0, 1], real_labels (M,), fake_labels (B,). Returns
    ``(‖Ĝ_private‖_F, σ)``: the Frobenius norm of the released (noised) gradient rows, a function of the release
    only. The loss itself is computed on the private batch without noise and is not returned.
    """
    B = fake_labels.shape[0]
    k = int(round(cfg.ratio * B))
    z = torch.randn(B + k, gen.latent_dim, generator=generator)
    extra_labels = fake_labels[torch.randperm(B, generator=generator)[:k]] if k else fake_labels[:0]
    images = gen(z, torch.cat([fake_labels, extra_labels])).flatten(1)  # (B + rB, D)
    leaf = images.detach().requires_grad_()
    cost = squared_euclidean_l1(cfg.l1_weight)
    nc = gen.num_classes
    fake_c = class_conditional(leaf[:B], fake_labels, nc, cfg.class_scale)
    extra_c = class_conditional(leaf[B:], extra_labels, nc, cfg.class_scale)
    kw = dict(p=2, blur=cfg.blur, scaling=cfg.scaling, cost=cost)
    if real.shape[0] > 0:
        real_c = class_conditional(real, real_labels, nc, cfg.class_scale)
        loss = semi_debiased_sinkhorn_loss(fake_c, extra_c, real_c, cfg.ratio, **kw)
    else:  # nothing sampled: only the (data-independent) debiasing term
        g_prime = torch.cat([fake_c[k:], extra_c], dim=0)
        loss = -sinkhorn(fake_c, g_prime, debias=False, **kw)
    (grad,) = torch.autograd.grad(loss, leaf)
    if noise_source is None:
        noise_source = PrivacyRandomness(True) if cfg.secure_mode else PrivacyRandomness(False, generator)
    released, sigma = sanitize_image_gradient(grad, B, cfg.clip_norm, noise_multiplier, cfg.clipping, noise_source)
    images.backward(released)
    return float(released[:B].detach().norm()), sigma


def train_dp_sinkhorn(images: torch.Tensor, labels: torch.Tensor, config: Optional[DPSinkhornConfig] = None,
                      num_classes: int = 10, budget: Optional[PrivacyBudget] = None,
                      progress: bool = False) -> DPSinkhornResult:
    """Train a class-conditional generator with DP-Sinkhorn until the (ε, δ) budget refuses the next step.

    Every step: Poisson batch of the private data (rate q = expected_batch_size/n) → the step recorded in the
    run's :class:`~fastdpot.privacy.PrivacyLedger` (through ``budget``: a refusal stops training, nothing released)
    → one :func:`dp_sinkhorn_step` → Adam update. ``budget`` (default: a new ``PrivacyBudget(cfg.target_epsilon,
    cfg.delta)`` with a ``cfg.accountant`` accountant) may be shared: its earlier releases count.

    Shape: images (n, 1, 28, 28) or (n, 784) float in [0, 1]; labels (n,) in [0, num_classes).

    Returns:
        :class:`DPSinkhornResult` with the trained generator and the (ε, δ) actually spent (from the accountant).

    Raises:
        ValueError: bad inputs or configuration.
    """
    cfg = config or DPSinkhornConfig()
    check_tensor(images, "images")
    x = images.reshape(images.shape[0], -1).to(torch.float32)
    if float(x.min()) < 0 or float(x.max()) > 1:
        raise ValueError(f"images must lie in [0, 1], got range [{float(x.min())}, {float(x.max())}]")
    if labels.shape != (x.shape[0],):
        raise ValueError(f"labels must have shape ({x.shape[0]},), got {tuple(labels.shape)}")
    n = x.shape[0]
    check_choice(cfg.clipping, "clipping", CLIPPINGS)
    q = check_probability(cfg.expected_batch_size / n, "expected_batch_size / n")
    check_probability(cfg.ratio, "ratio", low_open=False)
    steps = check_int(cfg.max_steps, "max_steps")
    # deterministic sensitivity: all of δ to the accountant; "spent" tails: ε at the budget's δ minus any tails a
    # shared budget already holds. Without cfg.noise_multiplier, z is calibrated at bind for max_steps releases.
    ledger = PrivacyLedger(cfg.delta if budget is None else budget.delta, steps, delta_tail=0.0, tails="spent",
                           target_epsilon=cfg.target_epsilon if budget is None else None, budget=budget,
                           noise_multiplier=cfg.noise_multiplier, accountant=cfg.accountant)
    z = ledger.bind(q, "poisson")

    g = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # parameter initialisation only (data-independent)
    gen = ConditionalDCGANGenerator(cfg.latent_dim, num_classes, cfg.channels)
    opt = torch.optim.Adam(gen.parameters(), lr=cfg.lr, betas=(0.5, 0.999))
    if not isinstance(cfg.secure_mode, bool):
        raise ValueError(f"secure_mode must be a bool, got {cfg.secure_mode!r}")
    # privacy draws (batches, noise): the OS in secure mode; g otherwise (replayable). g: public draws.
    rng = PrivacyRandomness(True) if cfg.secure_mode else PrivacyRandomness(False, g)
    sampler = PoissonSampler(n, q, generator=rng)
    B = check_int(cfg.generated_batch_size, "generated_batch_size")
    res = DPSinkhornResult(gen, cfg, z, z * cfg.clip_norm * sensitivity_factor(cfg.clipping, B), 0,
                           0.0, ledger.delta, False)
    t0 = time.time()
    it = range(steps)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc="DP-Sinkhorn")
    for _ in it:
        idx = sampler.sample()
        try:
            ledger.record()  # the step's release, recorded before it is computed
        except BudgetExceededError:
            res.stopped_by_budget = True
            break
        fake_labels = torch.randint(0, num_classes, (B,), generator=g)
        opt.zero_grad(set_to_none=True)
        norm, _ = dp_sinkhorn_step(gen, x[idx], labels[idx], fake_labels, cfg, z, g, noise_source=rng)
        opt.step()
        res.released_norms.append(norm)
        res.steps += 1
    else:
        res.stopped_by_budget = not ledger.max_steps(1)
    res.epsilon = ledger.epsilon() if res.steps else 0.0
    res.seconds = time.time() - t0
    gen.eval()
    return res


@torch.no_grad()
def evaluate_generator(gen: ConditionalDCGANGenerator, test_images: torch.Tensor, test_labels: torch.Tensor,
                       num_samples: int = 2000, fid_samples: int = 1000, seed: int = 1,
                       metrics: Tuple[str, ...] = ("fid", "logreg", "mlp")) -> Dict[str, float]:
    """FID (generated vs real test images) and downstream accuracy (classifiers trained on generated labelled
    samples, tested on real test data) through :mod:`fastdpot.mainjob.metrics`.

    Shape: test_images (m, 1, 28, 28) in [0, 1], test_labels (m,). Returns {"fid", "logreg", "mlp", counts}.
    """
    from .mainjob import metrics as M

    g = torch.Generator().manual_seed(seed)
    gen.eval()
    labels = torch.arange(num_samples) % gen.num_classes
    fake = gen.sample(labels, generator=g)
    out: Dict[str, float] = {"num_generated": num_samples}
    if "fid" in metrics:
        out["fid"] = float(M.fid(fake[:fid_samples], test_images[:fid_samples]))
        out["fid_samples"] = min(fid_samples, num_samples)
    clf = tuple(c for c in metrics if c in ("logreg", "mlp"))
    if clf:
        acc = M.downstream_accuracy(fake.flatten(1), labels, test_images.flatten(1), test_labels, classifiers=clf)
        out.update({k: float(v) for k, v in acc.items()})
    return out


def main(argv=None):
    """Short default run: ``python -m fastdpot.dp_sinkhorn [--steps 600 --epsilon 10 ...]``."""
    import argparse
    import json

    from .mainjob.data.datasets import load_fashion_mnist, to_float

    p = argparse.ArgumentParser(description="DP-Sinkhorn on Fashion-MNIST (class-conditional DCGAN generator)")
    p.add_argument("--epsilon", type=float, default=10.0)
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--clipping", choices=CLIPPINGS, default="joint")
    p.add_argument("--ratio", type=float, default=0.2)
    p.add_argument("--eval-samples", type=int, default=2000)
    p.add_argument("--fid-samples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0, help="seed of the public draws (and of all draws with "
                   "--replayable-noise)")
    p.add_argument("--replayable-noise", action="store_true",
                   help="draw batches and noise from --seed (replayable: NO privacy guarantee against anyone who "
                        "holds the seed); default: secret noise from the operating system")
    p.add_argument("--out", default=None, help="write the summary JSON here")
    a = p.parse_args(argv)
    xtr, ytr = load_fashion_mnist("train")
    xte, yte = load_fashion_mnist("test")
    xtr, xte = to_float(xtr[:, None]), to_float(xte[:, None])
    cfg = DPSinkhornConfig(target_epsilon=a.epsilon, delta=a.delta, max_steps=a.steps, expected_batch_size=a.batch,
                           generated_batch_size=a.batch, clipping=a.clipping, ratio=a.ratio, seed=a.seed,
                           secure_mode=not a.replayable_noise)
    res = train_dp_sinkhorn(xtr, ytr, cfg, progress=True)
    summary = res.summary()
    summary["eval"] = evaluate_generator(res.generator, xte, yte, a.eval_samples, a.fid_samples)
    print(json.dumps(summary, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
