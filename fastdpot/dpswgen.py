"""DPSWgen: a generator trained with the DP sliced Wasserstein loss (baseline of Sebag et al., TMLR; mechanism of
Rakotomamonjy & Ralaivola, ICML 2021).

The caller brings the generator, as Opacus' ``make_private`` takes the caller's model: any ``nn.Module`` with an
integer ``latent_dim`` attribute that maps (B, latent_dim) latents to B rows of the private data's shape
(:mod:`fastdpot.experiments.papers.dpswgen` has the MLP of Sebag et al. and a small convolutional one).
:func:`train_dpswgen` trains it in place and returns it in a :class:`DPSWgenResult` with the ε spent.

Each training step releases ``X_b Θᵀ + V`` for a fresh batch X_b of B private rows, drawn uniformly without
replacement (:class:`fastdpot.privacy.FixedSizeSampler`, a new subset every step, never a replayed epoch), rows
clipped to ``clip_radius`` inside the loss, fresh directions Θ and fresh noise N(0, σ²). Every release is recorded
in the run's :class:`fastdpot.privacy.PrivacyLedger` *before* it happens (substitution neighbours, RDP for sampling
without replacement, δ split between the accountant and the per-step sensitivity tail over Θ, the tails of the
releases made charged to δ). Either σ is calibrated so that T steps spend a target ε (training stops if the next
release would exceed it), or σ is given and the ε the T steps spent is reported, as in Opacus.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch
from torch import nn

from . import _dispatch
from ._validate import (check_choice, check_delta, check_epsilon, check_generator, check_int, check_positive,
                        check_tensor, resolve_alias)
from .privacy.accounting import ACCOUNTANTS
from .privacy.sensitivity import BOUNDS
from .generators import check_generator_model, check_generator_output, model_dtype_device
from .sliced import check_release, dp_sliced_wasserstein, dp_sliced_wasserstein_noise_std

__all__ = ["DPSWgenResult", "train_dpswgen"]


def _latents(num: int, latent_dim: int, generator: Optional[torch.Generator], dtype: torch.dtype,
             device: torch.device) -> torch.Tensor:
    """(num, latent_dim) standard normals drawn on ``generator``'s device (the global CPU RNG when None), moved
    to ``device``: a CPU generator gives the same latents for a CPU or a CUDA model."""
    src = generator.device if generator is not None else None
    return torch.randn(num, latent_dim, generator=generator, dtype=dtype, device=src).to(device)


@dataclass
class DPSWgenResult:
    """What :func:`train_dpswgen` returns.

    ``generator`` is the caller's module, trained in place. ``epsilon`` is the ε spent (accountant's value at δ
    minus the sensitivity tails of the releases made: the run is (epsilon, delta)-DP; ``math.inf`` for a
    non-private run); ``target_epsilon`` the ε σ was calibrated for (None when ``noise_std`` was given);
    ``steps`` the number of private releases made; ``noise_std`` σ, the standard deviation of the noise on each
    projected value; ``losses`` the DP loss per step (computed from that step's noisy release and the generated
    rows only: post-processing, publishable); ``stopped_by_budget`` whether the target ε refused a step.
    """
    generator: nn.Module
    epsilon: float
    delta: float
    target_epsilon: Optional[float]
    steps: int
    noise_std: float
    details: dict
    losses: List[float] = field(default_factory=list)
    stopped_by_budget: bool = False

    def sample(self, num_samples: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``num_samples`` generated rows (eval mode; post-processing, no privacy cost).

        Shape: -> (num_samples, *row shape of the training data), on the generator module's device.
        """
        g = self.generator
        dtype, device = model_dtype_device(g)
        was = g.training
        g.eval()
        try:
            with torch.no_grad():
                out = g(_latents(check_int(num_samples, "num_samples"), g.latent_dim, generator, dtype, device))
        finally:
            g.train(was)
        return out


def train_dpswgen(private_data: torch.Tensor, model: nn.Module, epsilon: Optional[float] = None,
                  delta: Optional[float] = None, *, steps: Optional[int] = None, batch_size: int = 250,
                  num_projections: int = 70, clip_radius: float = 1.0, p: int = 2, lr: float = 1e-3,
                  bound: str = "chernoff", accountant: str = "rdp", noise_std: Optional[float] = None,
                  generator: Optional[torch.Generator] = None, backend: str = "auto", budget_checks: int = 10,
                  log_every: int = 0, secure_mode: bool = True, release: str = "points",
                  sketch_bins: Optional[int] = None, progress: bool = True, target_epsilon: Optional[float] = None,
                  target_delta: Optional[float] = None, epochs: Optional[float] = None) -> DPSWgenResult:
    r"""Train the caller's generator ``model`` on private rows with the DP sliced Wasserstein loss.

    Per step: record the step in the ledger (before releasing), draw a fresh uniform batch of B rows without
    replacement, draw B latents, and minimise DP-SW_p^p(clip(X_b), G(z)) (noise σ on both sides' projections; the
    gradient reaches G through the generated side only) with Adam (learning rate ``lr``).

    .. math::
        \mathrm{DP\text{-}SW}_p^p = \frac1k\sum_{j=1}^k W_p^p\big(\theta_j^\top X_b + v_j,\;
        \theta_j^\top G(z) + w_j\big), \qquad v_j, w_j \sim \mathcal N(0, \sigma^2 I_B)

    The noise is given by exactly one of ``epsilon`` (σ calibrated so that the T steps spend ε at δ; training
    stops if the ledger refuses a block) or ``noise_std`` (σ fixed; all T steps run and the ε they spent at δ is
    reported, as Opacus' ``make_private(noise_multiplier=...)`` does).

    Args:
        private_data: (n, d) private rows, or (n, \*S) for any row shape S (e.g. images (n, C, H, W)); float32 or
            float64, on the device of ``model``.
        model: the generator to train, in place: an ``nn.Module`` with an integer attribute ``latent_dim``,
            mapping (B, latent_dim) latents to (B, \*S) rows; its floating parameters of the data's dtype. Its
            initial weights are the caller's (initialise it from a seed for a replayable run).
        epsilon: target ε (``math.inf``: non-private run, σ = 0, nothing accounted); Opacus' name
            ``target_epsilon=`` is an alias (give one of the two). Not with ``noise_std``.
        delta: δ of the whole run (alias ``target_delta=``).
        steps: T, the number of training steps (and of releases); or ``epochs``: T = ⌈epochs · n / B⌉ (Opacus
            style; give one of the two).
        batch_size: B (fixed; sample rate B/n).
        num_projections: k directions per step.
        clip_radius: ℓ2 radius the private rows (flattened) are clipped to, inside the loss.
        p: 1 or 2.
        lr: Adam learning rate.
        bound: sensitivity bound over Θ: "chernoff" (default, proven), "bernstein" or "clt" (approximation).
        accountant: "rdp" or "pld" (the calibration targets it; sampling without replacement is accounted with
            RDP).
        noise_std: σ (standard deviation of the noise on each projected value) instead of a calibrated one; not
            with ``epsilon``.
        generator: torch.Generator of the latents (public draws); with ``secure_mode=False`` also of the batches,
            directions and noise keys (a replayable run: same seed and same initial weights, same losses and
            weights). None: a generator seeded from fresh entropy.
        secure_mode: True (default): batches, directions and noise keys come from the operating system (secret,
            never stored, not replayable). False: from ``generator`` (no guarantee against anyone who holds its
            seed).
        backend: backend of the loss ("auto" or one of :data:`fastdpot._dispatch.BACKENDS`).
        release, sketch_bins: ``"points"`` (default) or ``"sketch"`` with L = ``sketch_bins`` bins per direction:
            the private side of every step is released as a sliced quantile sketch
            (:func:`fastdpot.sliced.dp_sliced_wasserstein`); the same σ, sensitivity and accounting.
        budget_checks: the T steps are recorded in the ledger in this many blocks, each *before* its steps run
            (a PLD/RDP evaluation per step would dominate the run time); a run cut short over-counts, never under.
        log_every: print the loss every this many steps (0: silent).
        progress: show the progress (steps, loss): a tqdm bar on a terminal, redrawn at most every 0.5 s; plain
            lines at most every 10 s when stderr is a file or pipe.

    Shape:
        private_data (n, \*S), model: (B, latent_dim) -> (B, \*S).

    Returns:
        :class:`DPSWgenResult` with ``model`` (trained) and the ε spent (≤ ``epsilon`` when one was given).

    Raises:
        TypeError: ``model`` not an ``nn.Module``, ``private_data`` not a tensor; no ε / σ, δ or T given.
        ValueError: every invalid argument, before anything is released: ε, δ, sizes, ``clip_radius``, both
            ``noise_std`` and ``epsilon``, B > n, a model without ``latent_dim`` or whose output does not have the
            rows' shape, dtype or device mismatches, unknown bound / accountant / backend / release.
        BackendUnavailableError: an explicitly requested ``backend`` that is not available here.

    References:
        Rakotomamonjy & Ralaivola, "Differentially Private Sliced Wasserstein Distance", ICML 2021 (DP-SWD,
        Prop. 2); Sebag et al., "Differentially private gradient flow based on the sliced Wasserstein distance",
        TMLR (DPSWgen baseline, Table 1); dp-accounting ``SampledWithoutReplacementDpEvent``.
    """
    from ._progress import progress_bar
    from .privacy import (FixedSizeSampler, PrivacyAccountant, PrivacyBudget, PrivacyLedger, sliced_sensitivity,
                          split_delta)
    from .privacy.randomness import PrivacyRandomness

    # ---- every argument is checked here, before the ledger records anything
    check_tensor(private_data, "private_data", dtypes=(torch.float32, torch.float64))
    if private_data.dim() < 2:
        raise ValueError(f"private_data must be (n, d) or (n, *row_shape), got shape {tuple(private_data.shape)}")
    check_generator_model(model, "model", ("latent_dim",), dtype=private_data.dtype, device=private_data.device)
    eps_name = "epsilon" if target_epsilon is None else "target_epsilon"  # errors name what the caller passed
    delta_name = "delta" if target_delta is None else "target_delta"
    epsilon = resolve_alias(epsilon, target_epsilon, "epsilon", "target_epsilon")
    delta = resolve_alias(delta, target_delta, "delta", "target_delta")
    if noise_std is not None and epsilon is not None:
        raise ValueError(f"give {eps_name} (σ calibrated so that the steps spend it) or noise_std (σ fixed, the "
                         f"ε spent is reported), not both: got {eps_name}={epsilon!r}, noise_std={noise_std!r}")
    if noise_std is None and epsilon is None:
        raise TypeError("train_dpswgen() needs the privacy target: epsilon= (or target_epsilon=), or noise_std=")
    if delta is None:
        raise TypeError("train_dpswgen() needs delta= (or target_delta=)")
    delta = check_delta(delta, delta_name)
    if noise_std is not None:
        sigma = check_positive(noise_std, "noise_std")
        private = True
    else:
        epsilon = check_epsilon(epsilon, eps_name, allow_inf=True)
        private = not math.isinf(epsilon)
    n = private_data.shape[0]
    B = check_int(batch_size, "batch_size")
    if B > n:
        raise ValueError(f"batch_size must be <= number of private rows {n}, got {B}")
    if epochs is not None:
        if steps is not None:
            raise ValueError(f"give steps or epochs, not both (got steps={steps!r}, epochs={epochs!r})")
        steps = max(1, math.ceil(check_positive(epochs, "epochs") * n / B))
    if steps is None:
        raise TypeError("train_dpswgen() needs steps= (or epochs=)")
    T = check_int(steps, "steps")
    k = check_int(num_projections, "num_projections")
    clip_radius = check_positive(clip_radius, "clip_radius")
    check_choice(p, "p", (1, 2))
    lr = check_positive(lr, "lr")
    check_choice(bound, "bound", BOUNDS)
    check_choice(accountant, "accountant", ACCOUNTANTS)
    check_generator(generator, "generator", allow_privacy=False)
    check_choice(backend, "backend", ("auto",) + _dispatch.BACKENDS)
    budget_checks = check_int(budget_checks, "budget_checks")
    log_every = check_int(log_every, "log_every", 0)
    for flag, value in (("secure_mode", secure_mode), ("progress", progress)):
        if not isinstance(value, bool):
            raise ValueError(f"{flag} must be a bool, got {value!r}")
    check_release(release, sketch_bins)
    if sketch_bins is not None and sketch_bins > B:
        raise ValueError(f"sketch_bins must be at most batch_size={B}, got {sketch_bins}")
    if release == "points" and backend != "auto":
        from .ops.sliced_wasserstein import select_backend

        select_backend(B, B, private_data.device.type, backend)  # BackendUnavailableError now, not at step 1
    check_generator_output(model, (torch.zeros(2, model.latent_dim, dtype=private_data.dtype, device=private_data.device),),
                  private_data.shape[1:], "model", "(B, latent_dim) latents")
    flat = private_data.reshape(n, -1)
    d = flat.shape[1]

    # ---- noise and ledger (the calibration may still refuse an unreachable ε: nothing released yet)
    if private and noise_std is None:
        sigma, details = dp_sliced_wasserstein_noise_std(  # its errors name ε and δ as the caller spelled them
            **{eps_name: epsilon, delta_name: delta}, batch_size=B, dataset_size=n, steps=T, num_projections=k, dim=d,
            clip_radius=clip_radius, bound=bound, accountant=accountant)
    elif private:  # the caller's σ: same δ split and sensitivity, multiplier σ/Δ; all T steps run
        delta_acc, delta_tail = split_delta(delta, T)
        sens = sliced_sensitivity(k, d, delta_tail, bound=bound, diameter=2.0 * clip_radius)
        details = dict(noise_multiplier=sigma / sens, sensitivity=sens, delta_accountant=delta_acc,
                       delta_tail=delta_tail, sample_rate=B / n, steps=T, batch_size=B, dataset_size=n,
                       num_projections=k, dim=d, clip_radius=clip_radius, bound=bound, epsilon=None,
                       delta=delta, accountant=accountant, calibrated=False)
    if private:  # ε is checked / reported at δ minus the tails of the releases recorded so far ("spent" tails)
        # z is known (calibrated above, or the caller's σ/Δ); a calibrated run is capped at its target ε by a budget
        budget = None if epsilon is None else PrivacyBudget(epsilon, delta, PrivacyAccountant(accountant))
        ledger = PrivacyLedger(delta, T, delta_tail=details["delta_tail"], tails="spent", budget=budget,
                               noise_multiplier=details["noise_multiplier"], accountant=accountant)
        ledger.bind(B / n, "without_replacement", dataset_size=n, batch_size=B)
    else:
        sigma, details, ledger = 0.0, dict(noise_multiplier=0.0, note="epsilon=inf: non-private run"), None

    if generator is None:
        generator = torch.Generator()
        generator.seed()
    rng = PrivacyRandomness(True) if secure_mode else PrivacyRandomness(False, generator)
    sampler = FixedSizeSampler(n, B, generator=rng)
    opt = torch.optim.Adam([q for q in model.parameters() if q.requires_grad], lr=lr)
    losses: List[float] = []
    block = max(1, math.ceil(T / budget_checks))
    allowed = 0  # steps already recorded in the ledger and not yet run
    stopped = False
    done = 0
    model.train()
    bar = progress_bar(total=T, desc="DPSWgen" if private else "SWgen", disable=not progress)
    while done < T:
        if private and allowed == 0:
            want = ledger.max_steps(min(block, T - done))  # what the target ε accepts of the next block
            if want == 0:
                stopped = True
                break
            ledger.record(want)  # the block's releases, recorded before any of them happens
            allowed = want
        x = flat[sampler.sample()]
        y = model(_latents(B, model.latent_dim, generator, private_data.dtype, private_data.device)).reshape(B, -1)
        loss = dp_sliced_wasserstein(y, private=x, noise_std=sigma, num_projections=k, p=p, generator=rng,
                                     backend=backend, clip_radius=clip_radius, release=release,
                                     sketch_bins=sketch_bins)
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
        acc = ledger.accountant
        details = dict(details, delta_accountant_final=delta - ledger.delta_tail * acc.steps,
                       delta_tail_spent=ledger.delta_tail * acc.steps, steps_recorded=acc.steps)
    return DPSWgenResult(generator=model, epsilon=eps_spent, delta=delta, target_epsilon=epsilon, steps=done,
                         noise_std=sigma, details=details, losses=losses, stopped_by_budget=stopped)
