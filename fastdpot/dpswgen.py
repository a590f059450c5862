"""DPSWgen: a generator trained with the DP sliced Wasserstein loss (baseline of Sebag et al., TMLR; mechanism of Rakotomamonjy & Ralaivola, ICML 2021).

Each training step releases ``X_b Θᵀ + V`` for a fresh batch X_b of B private rows, drawn uniformly without
replacement (:class:`fastdpot.privacy.FixedSizeSampler`, a new subset every step, never a replayed epoch), rows
clipped to ``radius`` inside the loss, fresh directions Θ and fresh noise N(0, σ²). Every release is recorded in the
run's :class:`fastdpot.privacy.PrivacyLedger` (through its :class:`fastdpot.privacy.PrivacyBudget`) *before* it
happens (substitution neighbours, RDP for sampling without replacement, δ split between the accountant and the
per-step sensitivity tail over Θ, the tails of the releases made charged to δ); training stops when the next release
would exceed the target ε, and the ε actually spent is reported.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch
from torch import nn

from ._validate import (check_choice, check_delta, check_epsilon, check_int, check_positive, check_tensor,
                        resolve_alias)
from .sliced import _check_release, dp_sliced_wasserstein, dp_sliced_wasserstein_noise_std, sliced_wasserstein

__all__ = ["MLPGenerator", "ConvGenerator", "DPSWgenResult", "train_dpswgen"]


class MLPGenerator(nn.Module):
    """The DPSWgen generator of Sebag et al., TMLR: latent→256→ReLU→512→BN→ReLU→256→ReLU→out (linear output).

    Shape: (B, latent_dim) -> (B, out_dim).
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


@dataclass
class DPSWgenResult:
    """What :func:`train_dpswgen` returns.

    ``epsilon`` is the ε spent (accountant's value at ``delta_accountant``, plus the sensitivity tails in δ: the
    run is (epsilon, delta)-DP); ``steps`` the number of private releases made; ``losses`` the DP loss per step
    (computed from that step's noisy release and the generated rows only: post-processing, publishable).
    """
    generator: nn.Module
    epsilon: float
    delta: float
    target_epsilon: float
    steps: int
    noise_std: float
    details: dict
    losses: List[float] = field(default_factory=list)
    stopped_by_budget: bool = False

    def sample(self, num_samples: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``num_samples`` generated rows (eval mode; post-processing, no privacy cost)."""
        g = self.generator
        was = g.training
        g.eval()
        with torch.no_grad():
            z = torch.randn(num_samples, g.latent_dim, generator=generator)
            out = g(z)
        g.train(was)
        return out


def train_dpswgen(private_data: torch.Tensor, epsilon: Optional[float] = None, delta: Optional[float] = None, *,
                  steps: Optional[int] = None, batch_size: int = 250,
                  num_projections: int = 70, radius: float = 1.0, p: int = 2, latent_dim: int = 16,
                  model: str = "mlp", lr: float = 1e-3, bound: str = "chernoff", accountant: str = "rdp",
                  noise_std: Optional[float] = None, generator: Optional[torch.Generator] = None,
                  backend: str = "auto", budget_checks: int = 10, log_every: int = 0,
                  secure_mode: bool = True, release: str = "points", num_bins: Optional[int] = None,
                  progress: bool = True, target_epsilon: Optional[float] = None,
                  target_delta: Optional[float] = None, epochs: Optional[float] = None) -> DPSWgenResult:
    r"""Train a DPSWgen generator on private rows with the DP sliced Wasserstein loss.

    Per step: spend the step in the budget (before releasing), draw a fresh uniform batch of B rows without
    replacement, draw latents, and minimise DP-SW_p^p(clip(X_b), G(z)) (noise σ on both sides' projections; the
    gradient reaches G through the generated side only) with Adam.

    Args:
        private_data: (n, d) private rows (latents, or flattened images for ``model="conv"`` with shape (n, C, H, W)).
        epsilon: target ε (``math.inf``: non-private run, σ = 0, nothing accounted); Opacus' name
            ``target_epsilon=`` is an alias (give one of the two).
        delta: target δ of the whole run (alias ``target_delta=``).
        epochs: Opacus-style alternative to ``steps``: T = ⌈epochs · n / B⌉ (give one of the two).
        steps: T, the number of training steps the noise is calibrated for.
        batch_size: B (fixed; sample rate B/n).
        num_projections: k directions per step.
        radius: ℓ2 bound private rows are clipped to (inside the loss).
        p: 1 or 2.
        latent_dim: dimension of the generator's input noise.
        model: "mlp" (:class:`MLPGenerator`) or "conv" (:class:`ConvGenerator`, image data).
        lr: Adam learning rate.
        bound: sensitivity bound over Θ: "chernoff" (default, proven), "bernstein" or "clt" (approximation).
        accountant: "rdp" (sampling without replacement is accounted with RDP).
        noise_std: σ to use instead of the calibrated one (training then stops when the budget refuses a step).
        generator: torch.Generator of the initial weights and the latents (public draws); with ``secure_mode=False``
            also of the batches, directions and noise keys (a replayable run: same seed, same losses and weights).
        secure_mode: True (default): batches, directions and noise keys come from the operating system (secret,
            never stored, not replayable). False: from ``generator`` (no guarantee against anyone who holds its
            seed).
        backend: backend of the loss.
        release, num_bins: ``"points"`` (default) or ``"sketch"`` with L = ``num_bins`` bins: the private side of
            every step is released as a sliced quantile sketch (:func:`fastdpot.sliced.dp_sliced_wasserstein`); the
            same σ, sensitivity and accounting.
        budget_checks: the T steps are recorded in the budget in this many blocks, each *before* its steps run
            (a PLD/RDP evaluation per step would dominate the run time); a run cut short over-counts, never under.
        log_every: print the loss every this many steps (0: silent).
        progress: show a tqdm bar (steps, loss), redrawn at a bounded rate (every 30 s when stderr is not a
            terminal).

    Shape:
        private_data (n, d) or (n, C, H, W) -> a generator of rows of the same shape.

    Returns:
        :class:`DPSWgenResult` with the trained generator and the ε spent (≤ target).

    Raises:
        ValueError: invalid arguments (ε, δ, sizes, radius, model, B > n).

    References:
        Rakotomamonjy & Ralaivola, ICML 2021 (DP-SWD, Prop. 2); Sebag et al., TMLR (DPSWgen baseline, Table 1);
        dp-accounting ``SampledWithoutReplacementDpEvent``.
    """
    from .privacy import FixedSizeSampler, PrivacyLedger

    check_tensor(private_data, "private_data", dtypes=(torch.float32, torch.float64))
    eps_name = "epsilon" if target_epsilon is None else "target_epsilon"  # errors name what the caller passed
    delta_name = "delta" if target_delta is None else "target_delta"
    epsilon = resolve_alias(epsilon, target_epsilon, "epsilon", "target_epsilon")
    delta = resolve_alias(delta, target_delta, "delta", "target_delta")
    if epsilon is None or delta is None:
        raise TypeError("train_dpswgen() needs the target ε and δ: epsilon= / target_epsilon= and delta= / "
                        "target_delta=")
    if epochs is not None:
        if steps is not None:
            raise ValueError(f"give steps or epochs, not both (got steps={steps!r}, epochs={epochs!r})")
        check_positive(epochs, "epochs")
        steps = max(1, math.ceil(float(epochs) * private_data.shape[0] / check_int(batch_size, "batch_size")))
    if steps is None:
        raise TypeError("train_dpswgen() needs steps= (or epochs=)")
    private = not math.isinf(float(epsilon))
    epsilon = check_epsilon(epsilon, eps_name, allow_inf=True)
    delta = check_delta(delta, delta_name)
    T = check_int(steps, "steps")
    model = check_choice(model, "model", ("mlp", "conv"))
    n = private_data.shape[0]
    B = check_int(batch_size, "batch_size")
    if B > n:
        raise ValueError(f"batch_size must be <= number of private rows {n}, got {B}")
    radius = check_positive(radius, "radius")
    budget_checks = check_int(budget_checks, "budget_checks")
    _check_release(release, num_bins)
    if num_bins is not None and num_bins > B:
        raise ValueError(f"num_bins must be at most batch_size={B}, got {num_bins}")
    flat = private_data.reshape(n, -1)
    d = flat.shape[1]
    if model == "mlp" and private_data.dim() != 2:
        raise ValueError(f"private_data must be (n, d) for model='mlp', got shape {tuple(private_data.shape)}")
    if model != "mlp" and private_data.dim() != 4:
        raise ValueError(f"private_data must be (n, C, H, W) for model='conv', got {tuple(private_data.shape)}")
    if generator is None:
        generator = torch.Generator()
        generator.seed()
    init_seed = int(torch.randint(0, 2 ** 62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):  # the initial weights from `generator`, not the global RNG
        torch.manual_seed(init_seed)
        net = MLPGenerator(latent_dim, d) if model == "mlp" else ConvGenerator(latent_dim, private_data.shape[1:])
    net = net.to(private_data.dtype)

    if private and noise_std is None:
        sigma, details = dp_sliced_wasserstein_noise_std(epsilon, delta, B, n, T, num_projections, d, radius,
                                                         bound=bound, accountant=accountant)
    elif private:
        # the caller's σ: same δ split and sensitivity, multiplier σ/Δ; the budget decides how many steps run
        from .privacy import sliced_sensitivity, split_delta

        sigma = check_positive(noise_std, "noise_std")
        delta_acc, delta_tail = split_delta(delta, T)
        sens = sliced_sensitivity(check_int(num_projections, "num_projections"), d, delta_tail, bound=bound,
                                  diameter=2.0 * radius)
        details = dict(noise_multiplier=sigma / sens, sensitivity=sens, delta_accountant=delta_acc,
                       delta_tail=delta_tail, sample_rate=B / n, steps=T, batch_size=B, dataset_size=n,
                       num_projections=num_projections, dim=d, radius=radius, bound=bound, epsilon=epsilon,
                       delta=delta, accountant=accountant, calibrated=False)
    if private:  # the budget checks ε at δ minus the tails of the releases recorded so far ("spent" tails)
        ledger = PrivacyLedger(delta, T, delta_tail=details["delta_tail"], tails="spent", target_epsilon=epsilon,
                               noise_multiplier=details["noise_multiplier"], accountant=accountant)
        ledger.bind(B / n, "without_replacement", dataset_size=n, batch_size=B)
    else:
        sigma, details, ledger = 0.0, dict(noise_multiplier=0.0, note="epsilon=inf: non-private run"), None

    from .privacy.randomness import PrivacyRandomness

    if not isinstance(secure_mode, bool):
        raise ValueError(f"secure_mode must be a bool, got {secure_mode!r}")
    rng = PrivacyRandomness(True) if secure_mode else PrivacyRandomness(False, generator)
    sampler = FixedSizeSampler(n, B, generator=rng)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    losses: List[float] = []
    block = max(1, math.ceil(T / budget_checks))
    allowed = 0  # steps already recorded in the budget and not yet run
    stopped = False
    done = 0
    net.train()
    from ._progress import progress_bar

    bar = progress_bar(total=T, desc="DPSWgen" if private else "SWgen", disable=not progress)
    while done < T:
        if private and allowed == 0:
            want = ledger.max_steps(min(block, T - done))  # what the budget accepts of the next block
            if want == 0:
                stopped = True
                break
            ledger.record(want)  # the block's releases, recorded before any of them happens
            allowed = want
        idx = sampler.sample()
        x = flat[idx]
        lat = torch.randn(B, net.latent_dim, generator=generator, dtype=private_data.dtype)
        y = net(lat).reshape(B, -1)
        loss = dp_sliced_wasserstein(y, private=x, noise_std=sigma, num_projections=num_projections, p=p,
                                     generator=rng, backend=backend,
                                     radius=radius, release=release, num_bins=num_bins)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        done += 1
        allowed -= 1
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.4g}")
        if log_every and done % log_every == 0:
            print(f"[dpswgen] step {done}/{T} loss {losses[-1]:.4f}", flush=True)

    bar.close()
    eps_spent = ledger.epsilon() if private else math.inf
    if private:
        budget = ledger.budget
        details = dict(details, delta_accountant_final=budget.delta_accountant,
                       delta_tail_spent=budget.delta_tail_spent, steps_recorded=budget.steps)
    return DPSWgenResult(generator=net, epsilon=eps_spent, delta=delta, target_epsilon=epsilon, steps=done,
                         noise_std=sigma, details=details, losses=losses, stopped_by_budget=stopped)


def evaluate_sw(result_or_net, data: torch.Tensor, num_samples: int = 500, num_projections: int = 200,
                generator: Optional[torch.Generator] = None) -> float:
    """Non-private SW_2^2 between ``num_samples`` generated rows and (up to ``num_samples``) rows of ``data``.

    For evaluation on held-out / public data only: evaluating on private data is a release that is not accounted.
    """
    net = result_or_net.generator if isinstance(result_or_net, DPSWgenResult) else result_or_net
    was = net.training
    net.eval()
    with torch.no_grad():
        z = torch.randn(num_samples, net.latent_dim, generator=generator, dtype=data.dtype)
        y = net(z).reshape(num_samples, -1)
        x = data.reshape(data.shape[0], -1)[:num_samples]
        val = float(sliced_wasserstein(x, y, num_projections, generator=generator))
    net.train(was)
    return val


__all__.append("evaluate_sw")
