"""DP-Sinkhorn (Cao et al., NeurIPS 2021): a generator trained with the semi-debiased Sinkhorn loss
whose only contact with private data is a sanitised gradient w.r.t. the generated images.

The caller brings the class-conditional generator, as Opacus' ``make_private`` takes the caller's model: an
``nn.Module`` called as ``model(z, labels)`` with z (n, latent_dim) and integer labels (n,) in [0, num_classes),
returning (n, D) or (n, C, H, W) images with D = C·H·W pixels, and integer attributes ``latent_dim`` and
``num_classes`` (:class:`fastdpot.experiments.papers.dp_sinkhorn.ConditionalDCGANGenerator` is the paper's;
``python -m fastdpot.experiments.papers.dp_sinkhorn`` runs it on Fashion-MNIST). :func:`train_dp_sinkhorn` trains it in
place; its initial weights are the caller's.

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
  wide-tail normals cast to float32); ``seed`` drives only the public draws (latents, fake labels, the debiasing
  rows' labels). ``secure_mode=False`` draws everything from ``seed`` (replayable; no guarantee against anyone who
  holds the seed). The initial weights are the caller's; the global torch RNG is left as the caller had it;
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

from ._validate import (check_choice, check_delta, check_epsilon, check_int, check_nonnegative, check_positive,
                        check_probability, check_seed, check_tensor)
from .generators import check_generator_model, check_generator_output, model_dtype_device
from .privacy import BudgetExceededError, PoissonSampler, PrivacyAccountant, PrivacyBudget, PrivacyLedger
from .privacy.accounting import ACCOUNTANTS
from .privacy.randomness import PrivacyRandomness, privacy_randomness
from .sinkhorn import class_conditional, semi_debiased_sinkhorn_loss, sinkhorn, squared_euclidean_l1

__all__ = ["sensitivity_factor", "sanitize_image_gradient", "DPSinkhornConfig", "DPSinkhornResult",
           "dp_sinkhorn_step", "train_dp_sinkhorn"]

CLIPPINGS = ("joint", "per_sample")


def sensitivity_factor(clipping: str, num_rows: int) -> float:
    """Δ / C of the clipped (B, D) image gradient under add/remove of one real record: 2 (joint) or 2·√B
    (per_sample). σ = z·C·factor."""
    check_choice(clipping, "clipping", CLIPPINGS)
    num_rows = check_int(num_rows, "num_rows")
    return 2.0 if clipping == "joint" else 2.0 * math.sqrt(num_rows)


def sanitize_image_gradient(grad: torch.Tensor, num_private_rows: int, clip_radius: float, noise_multiplier: float,
                            clipping: str = "joint", generator: Optional[torch.Generator] = None,
                            return_noise: bool = False, *, secure_mode: bool = True):
    """Clip and noise the gradient of the loss w.r.t. the generated images (the DP-Sinkhorn release).

    Rows ``[:num_private_rows]`` touch the real data (they enter OT_ε(G, real)); they are clipped (``"joint"``:
    the block to Frobenius norm C; ``"per_sample"``: each row to C) and get N(0, σ²) noise with
    σ = z·C·:func:`sensitivity_factor`, with C = ``clip_radius`` (Opacus' ``max_grad_norm``) and z =
    ``noise_multiplier``. The remaining (debiasing) rows are clipped per row to C, no noise (they are functions of
    generator outputs only).

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
    C = check_positive(clip_radius, "clip_radius")
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


@dataclass
class DPSinkhornConfig:
    """Hyper-parameters of :func:`train_dp_sinkhorn` (defaults: a short CPU run on Fashion-MNIST), validated at
    construction and again when training starts (the fields stay assignable).

    ``clip_radius`` is C, the radius the image gradient is clipped to: Opacus' ``max_grad_norm``, accepted as a
    constructor alias (as is ``target_delta`` for ``delta``; giving an alias and a non-default canonical value that
    differ is a ValueError; after construction only the canonical fields hold the values, the aliases read None).
    ``noise_multiplier=None`` calibrates z = σ/Δ so that ``max_steps`` steps reach exactly ``target_epsilon``.
    ``secure_mode`` (default True): batches and noise from the operating system, ``seed`` only for public draws;
    False: everything replayable from ``seed`` (no guarantee against anyone who holds it). The generator's
    architecture and initial weights are not here: they are the caller's module's.

    Raises:
        ValueError: a field out of range (the message names it), an alias that disagrees with its field.
    """
    target_epsilon: float = 10.0
    delta: float = 1e-5
    expected_batch_size: int = 256       # q·n: Poisson rate q = expected_batch_size / n
    generated_batch_size: int = 256      # B generated rows per step
    ratio: float = 0.2                   # semi-debiasing ratio r in [0, 1] (paper: grid-searched, 0.2 on F-MNIST)
    clip_radius: float = 0.5             # C, the image gradient's clipping radius: Opacus' max_grad_norm
    clipping: str = "joint"              # "joint": the (B, D) block to Frobenius norm C; "per_sample": each row
    noise_multiplier: Optional[float] = None  # z = σ/Δ; None: calibrated for target_epsilon over max_steps
    max_steps: int = 600
    lr: float = 1e-3                     # Adam, betas (0.5, 0.999)
    blur: float = 1.0                    # ε = blur² on the cost ‖·‖² + m‖·‖₁ of pixel vectors in [0, 1]
    scaling: float = 0.5                 # ε-scaling ratio of the Sinkhorn solver, in (0, 1)
    l1_weight: float = 3.0               # m (3 for Fashion-MNIST)
    class_scale: float = 15.0            # label one-hot scale appended to every image (class conditioning)
    accountant: str = "pld"
    seed: int = 0                        # public draws (latents, fake labels); all draws if not secure_mode
    secure_mode: bool = True
    max_grad_norm: Optional[float] = None  # Opacus' name of clip_radius (constructor alias)
    target_delta: Optional[float] = None   # Opacus' name of delta (constructor alias)

    def __post_init__(self):
        for alias, name, default in (("max_grad_norm", "clip_radius", 0.5), ("target_delta", "delta", 1e-5)):
            value = getattr(self, alias)
            if value is None:
                continue
            if getattr(self, name) not in (default, value):
                raise ValueError(f"give {name} or its alias {alias}, not both (got {name}={getattr(self, name)!r}, "
                                 f"{alias}={value!r})")
            setattr(self, name, value)
            setattr(self, alias, None)
        self.validate()

    def validate(self) -> "DPSinkhornConfig":
        """Check every field (see the class doc); returns self.

        Raises:
            ValueError: the first field out of range, by name.
        """
        check_epsilon(self.target_epsilon, "target_epsilon")
        check_delta(self.delta, "delta")
        check_int(self.expected_batch_size, "expected_batch_size")
        check_int(self.generated_batch_size, "generated_batch_size")
        check_probability(self.ratio, "ratio", low_open=False)
        check_positive(self.clip_radius, "clip_radius")
        check_choice(self.clipping, "clipping", CLIPPINGS)
        if self.noise_multiplier is not None:
            check_positive(self.noise_multiplier, "noise_multiplier")
        check_int(self.max_steps, "max_steps")
        check_positive(self.lr, "lr")
        check_positive(self.blur, "blur")
        check_probability(self.scaling, "scaling", high_open=True)
        check_nonnegative(self.l1_weight, "l1_weight")
        check_nonnegative(self.class_scale, "class_scale")
        check_choice(self.accountant, "accountant", ACCOUNTANTS)
        check_seed(self.seed, "seed")
        if not isinstance(self.secure_mode, bool):
            raise ValueError(f"secure_mode must be a bool, got {self.secure_mode!r}")
        for alias, name in (("max_grad_norm", "clip_radius"), ("target_delta", "delta")):
            if getattr(self, alias) is not None:
                raise ValueError(f"{alias} is a constructor alias of {name}; after construction set {name}, got "
                                 f"{alias}={getattr(self, alias)!r}")
        return self


@dataclass
class DPSinkhornResult:
    """What :func:`train_dp_sinkhorn` returns.

    ``generator`` is the caller's module, trained in place (left in eval mode); ``noise_multiplier`` z = σ/Δ;
    ``sigma`` σ, the standard deviation of the noise on each entry of the released image gradient; ``steps`` the
    releases made; ``epsilon`` the ε spent at ``delta`` by the run's accountant (a shared budget's earlier
    releases included); ``released_norms`` ‖Ĝ_private‖_F per step (a function of the releases only);
    ``seconds`` the training time.
    """
    generator: nn.Module
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


def dp_sinkhorn_step(model: nn.Module, real: torch.Tensor, real_labels: torch.Tensor,
                     fake_labels: torch.Tensor, cfg: DPSinkhornConfig, noise_multiplier: float,
                     generator: torch.Generator, noise_source: Optional[PrivacyRandomness] = None
                     ) -> Tuple[float, float]:
    """One DP-Sinkhorn step: generate, compute the semi-debiased loss, sanitise ∂L/∂images, backpropagate the
    sanitised gradient into ``model``'s parameters (post-processing). Leaves gradients in ``model``'s ``.grad``.

    The caller must have recorded the release in the budget *before* calling. An empty Poisson batch releases
    pure noise on the private rows (the cross-term gradient is 0).

    ``model`` is the conditional generator (``model(z, labels)``, attributes ``latent_dim``, ``num_classes``; see
    the module doc). ``generator`` (a CPU ``torch.Generator``) draws the public latents and the debiasing rows'
    labels; the sanitiser's noise comes from ``noise_source`` (default: the OS when ``cfg.secure_mode``, else
    ``generator``).

    Shape: real (M, D) flattened images in [0, 1] on the model's device and dtype, real_labels (M,), fake_labels
    (B,). Returns ``(‖Ĝ_private‖_F, σ)``: the Frobenius norm of the released (noised) gradient rows, a function of
    the release only, and the noise standard deviation per entry. The loss itself is computed on the private batch
    without noise and is not returned.

    References:
        Cao et al., "Don't Generate Me: Training Differentially Private Generative Models with Sinkhorn
        Divergence", NeurIPS 2021 (Algorithm 1, Eq. 6).
    """
    B = fake_labels.shape[0]
    k = int(round(cfg.ratio * B))
    dev = real.device
    z = torch.randn(B + k, model.latent_dim, generator=generator).to(device=dev, dtype=real.dtype)
    extra_labels = fake_labels[torch.randperm(B, generator=generator)[:k]] if k else fake_labels[:0]
    images = model(z, torch.cat([fake_labels, extra_labels]).to(dev)).flatten(1)  # (B + rB, D)
    leaf = images.detach().requires_grad_()
    cost = squared_euclidean_l1(cfg.l1_weight)
    nc = model.num_classes
    fake_c = class_conditional(leaf[:B], fake_labels.to(dev), nc, cfg.class_scale)
    extra_c = class_conditional(leaf[B:], extra_labels.to(dev), nc, cfg.class_scale)
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
    released, sigma = sanitize_image_gradient(grad, B, cfg.clip_radius, noise_multiplier, cfg.clipping, noise_source)
    images.backward(released)
    return float(released[:B].detach().norm()), sigma


def train_dp_sinkhorn(images: torch.Tensor, labels: torch.Tensor, model: nn.Module,
                      config: Optional[DPSinkhornConfig] = None, budget: Optional[PrivacyBudget] = None,
                      progress: bool = False) -> DPSinkhornResult:
    """Train the caller's class-conditional generator ``model`` with DP-Sinkhorn until the (ε, δ) budget refuses
    the next step or ``config.max_steps`` steps have run.

    Every step: Poisson batch of the private data (rate q = expected_batch_size/n) → the step recorded in the
    run's :class:`~fastdpot.privacy.PrivacyLedger` (through ``budget``: a refusal stops training, nothing released)
    → one :func:`dp_sinkhorn_step` → Adam update of ``model`` (in place). ``budget`` (default: a new
    ``PrivacyBudget(cfg.target_epsilon, cfg.delta)`` with a ``cfg.accountant`` accountant) may be shared: its
    earlier releases count. The global torch RNG is left as the caller had it (training runs under
    ``torch.random.fork_rng``); the public draws come from ``cfg.seed``.

    Args:
        images: (n, C, H, W) or (n, D) private images with values in [0, 1].
        labels: (n,) integer class labels in [0, model.num_classes).
        model: the generator to train: ``model(z, labels)`` maps z (B, model.latent_dim) and labels (B,) to
            (B, D) or (B, C, H, W) images (see the module doc); its initial weights are the caller's.
        config: :class:`DPSinkhornConfig` (default: its defaults).
        budget: a :class:`~fastdpot.privacy.PrivacyBudget` to spend through, or None.
        progress: show a tqdm bar.

    Returns:
        :class:`DPSinkhornResult` with ``model`` (trained, eval mode) and the (ε, δ) spent (from the accountant).

    Raises:
        TypeError: ``model`` not an ``nn.Module``, ``images`` / ``labels`` not tensors.
        ValueError: bad images (range, shape), labels (dtype, shape, range), model (missing attributes, no
            trainable parameter, output of another size than the images), configuration or budget; all before
            the first release.

    References:
        Cao et al., "Don't Generate Me: Training Differentially Private Generative Models with Sinkhorn
        Divergence", NeurIPS 2021 (Algorithm 1).
    """
    from ._progress import progress_bar

    cfg = DPSinkhornConfig() if config is None else config
    if not isinstance(cfg, DPSinkhornConfig):
        raise ValueError(f"config must be a DPSinkhornConfig or None, got {type(cfg).__name__}")
    cfg.validate()
    if budget is not None and not isinstance(budget, PrivacyBudget):
        raise ValueError(f"budget must be a PrivacyBudget or None, got {type(budget).__name__}")
    check_tensor(images, "images")
    if images.dim() not in (2, 4):
        raise ValueError(f"images must be (n, D) or (n, C, H, W), got shape {tuple(images.shape)}")
    check_generator_model(model, "model", ("latent_dim", "num_classes"))
    dtype, dev = model_dtype_device(model)
    x = images.reshape(images.shape[0], -1).to(device=dev, dtype=dtype)
    if float(x.min()) < 0 or float(x.max()) > 1:  # private values: the message shows none of them
        raise ValueError("images must lie in [0, 1] (some pixel values lie outside; the values are private data "
                         "and are not shown)")
    n, D = x.shape
    num_classes = model.num_classes
    if not isinstance(labels, torch.Tensor) or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels must be an integer tensor, got {getattr(labels, 'dtype', type(labels).__name__)}")
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape ({n},), got {tuple(labels.shape)}")
    if int(labels.min()) < 0 or int(labels.max()) >= num_classes:  # private labels: none is echoed
        raise ValueError(f"labels must lie in [0, model.num_classes = {num_classes}) (some do not; the labels are "
                         f"private data and their values are not shown)")
    labels = labels.to(dev)
    if not isinstance(progress, bool):
        raise ValueError(f"progress must be a bool, got {progress!r}")
    check_generator_output(model, (torch.zeros(2, model.latent_dim, dtype=dtype, device=dev),
                          torch.zeros(2, dtype=torch.long, device=dev)), (D,), "model",
                  "(B, latent_dim) latents and (B,) labels", flat=True)
    q = check_probability(cfg.expected_batch_size / n, "expected_batch_size / n")
    steps = cfg.max_steps
    B = cfg.generated_batch_size
    # deterministic sensitivity: all of δ to the accountant; "spent" tails: ε at the budget's δ minus any tails a
    # shared budget already holds. Without cfg.noise_multiplier, z is calibrated at bind for max_steps releases.
    # a given z runs under a budget of the target ε (a new one unless shared): no calibration, the run stops at ε
    if budget is None and cfg.noise_multiplier is not None:
        budget = PrivacyBudget(cfg.target_epsilon, cfg.delta, PrivacyAccountant(cfg.accountant))
    ledger = PrivacyLedger(cfg.delta if budget is None else budget.delta, steps, delta_tail=0.0, tails="spent",
                           target_epsilon=cfg.target_epsilon if budget is None else None, budget=budget,
                           noise_multiplier=cfg.noise_multiplier, accountant=cfg.accountant)
    z = ledger.bind(q, "poisson")

    g = torch.Generator().manual_seed(cfg.seed)  # public draws
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.5, 0.999))
    # privacy draws (batches, noise): the OS in secure mode; g otherwise (replayable)
    rng = PrivacyRandomness(True) if cfg.secure_mode else PrivacyRandomness(False, g)
    sampler = PoissonSampler(n, q, generator=rng)
    res = DPSinkhornResult(model, cfg, z, z * cfg.clip_radius * sensitivity_factor(cfg.clipping, B), 0,
                           0.0, ledger.delta, False)
    t0 = time.time()
    model.train()
    bar = progress_bar(total=steps, desc="DP-Sinkhorn", disable=not progress)
    with torch.random.fork_rng(devices=[]):  # whatever the model draws from the global RNG is not kept
        for _ in range(steps):
            idx = sampler.sample()
            try:
                ledger.record()  # the step's release, recorded before it is computed
            except BudgetExceededError:
                res.stopped_by_budget = True
                break
            fake_labels = torch.randint(0, num_classes, (B,), generator=g)
            opt.zero_grad(set_to_none=True)
            norm, _ = dp_sinkhorn_step(model, x[idx.to(dev)], labels[idx.to(dev)], fake_labels, cfg, z, g,
                                       noise_source=rng)
            opt.step()
            res.released_norms.append(norm)
            res.steps += 1
            bar.update(1)
        else:
            res.stopped_by_budget = not ledger.max_steps(1)
    bar.close()
    res.epsilon = ledger.epsilon()
    res.seconds = time.time() - t0
    model.eval()
    return res
