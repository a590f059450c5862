r"""DP-SGD with fixed-size batches sampled without replacement, for the replace-one neighbouring relation.

The mechanism of Abadi et al. ("Deep Learning with Differential Privacy", CCS 2016), accounted under the relation
the flows use — replace one record (x, y) by any (x', y') — so that a representation trained with it and a flow run
on its codes compose in one accountant (:class:`fastdpot.privacy.composition.ComposedLedger`). Per step:

1. the step is recorded in the ledger before anything is computed (a step that would exceed ε is refused);
2. a batch of exactly B of the n records is drawn uniformly without replacement
   (:class:`fastdpot.privacy.FixedSizeSampler`, fresh every step, from the privacy randomness: secret OS draws by
   default);
3. the per-sample gradients g_i of the loss are computed (Opacus' ``GradSampleModule``, ``loss_reduction="sum"``) and
   each is clipped to ℓ2 norm at most C = ``clip_radius`` over all parameters together;
4. the released quantity is :math:`G = \sum_i \mathrm{clip}_C(g_i) + \mathcal N(0, \sigma^2 I)` with
   :math:`\sigma = z \cdot 2C`; the optimiser steps on G / B (post-processing).

Sensitivity: replacing one record of a fixed-size batch changes one summand, from clip_C(g) to clip_C(g'), so
:math:`\lVert G(X) - G(X') \rVert_2 \le \lVert \mathrm{clip}_C(g) \rVert + \lVert \mathrm{clip}_C(g') \rVert \le 2C`
(a record outside the batch changes nothing). The step is therefore a Gaussian mechanism of noise multiplier z on a
batch sampled without replacement: the event ``SampledWithoutReplacementDpEvent(n, B, GaussianDpEvent(z))`` of
dp-accounting under ``REPLACE_ONE`` (Wang, Balle & Kasiviswanathan, AISTATS 2019). (Opacus' default, Poisson
sampling, is accounted under add/remove neighbours, where the sensitivity is C: the same z there is half the noise
std; the two relations cannot share one accountant.)

Model constraints: per-sample gradients need layers whose output for one sample does not depend on the others
(no BatchNorm: use GroupNorm); Opacus' ``GradSampleModule`` refuses unsupported layers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch
from torch import nn

from ._validate import check_bool, check_int, check_positive, check_tensor

__all__ = ["DPSGDResult", "train_dp_sgd", "clip_and_sum"]


@dataclass
class DPSGDResult:
    """What :func:`train_dp_sgd` returns: the trained model (in place), the steps taken, the noise multiplier and
    std, the mean per-sample loss of every step's batch (computed on private data: NOT publishable; kept for the
    caller's diagnostics only) and the ledger's ε after training."""
    model: nn.Module
    steps: int
    noise_multiplier: float
    noise_std: float
    epsilon: float
    losses: List[float] = field(default_factory=list)


def clip_and_sum(grad_samples: List[torch.Tensor], clip_radius: float) -> List[torch.Tensor]:
    """Per-sample clipping over all parameters together, then the sum over the batch.

    Shape:
        grad_samples: one (B, *param_shape) tensor per parameter -> one param_shape tensor per parameter.
    """
    C = check_positive(clip_radius, "clip_radius")
    b = grad_samples[0].shape[0]
    sq = torch.zeros(b, dtype=torch.float64, device=grad_samples[0].device)
    for g in grad_samples:
        sq += g.reshape(b, -1).double().pow(2).sum(1)
    scale = (C / sq.sqrt().clamp_min(1e-12)).clamp(max=1.0)
    return [(g.double() * scale.view(-1, *([1] * (g.dim() - 1)))).sum(0).to(g.dtype) for g in grad_samples]


def train_dp_sgd(model: nn.Module, data: torch.Tensor, loss_fn: Callable[..., torch.Tensor], *, steps: int,
                 batch_size: int, clip_radius: float, noise_multiplier: Optional[float], ledger=None,
                 stage: str = "dp-sgd", targets: Optional[torch.Tensor] = None, lr: float = 1e-3,
                 optimizer: Optional[Callable] = None, scheduler: Optional[Callable] = None,
                 generator: Optional[torch.Generator] = None, secure_mode: bool = True,
                 progress: bool = False) -> DPSGDResult:
    """Train ``model`` in place with DP-SGD on the private ``data`` (module docstring).

    Args:
        model: the network (per-sample gradients by Opacus' ``GradSampleModule``; no BatchNorm).
        data: (n, ...) private inputs. targets: (n, ...) private targets or None.
        loss_fn: ``loss_fn(model, x_batch, y_batch)`` -> (B,) per-sample losses (y_batch None without targets).
        steps: T >= 1 steps. batch_size: B, 1 <= B <= n, fixed.
        clip_radius: C > 0, the ℓ2 bound of each per-sample gradient (Opacus' ``max_grad_norm``).
        noise_multiplier: z > 0, σ = z·2C on the clipped sum (the replace-one sensitivity is 2C); None trains
            without noise or clipping (non-private; then ``ledger`` must be None).
        ledger: a :class:`fastdpot.privacy.composition.ComposedLedger` the steps are recorded in (one call per step,
            before it), or None (the caller accounts). stage: the name the ledger records.
        lr: Adam's learning rate (when ``optimizer`` is None); optimizer: ``optimizer(params)`` -> a torch optimiser;
            scheduler: ``scheduler(optimizer)`` -> a learning-rate scheduler stepped after every step, or None.
        generator: CPU ``torch.Generator`` of the privacy draws when ``secure_mode=False`` (replayable; no guarantee
            against anyone who holds its seed).
        secure_mode: True (default): batches and noise from the operating system (secret, never stored).
        progress: a bool: show the progress (a tqdm bar on a terminal, plain lines in a log).

    Returns:
        :class:`DPSGDResult`.

    Raises:
        ValueError: bad sizes, C <= 0, z <= 0, a ledger with a non-private run, targets of another length, a
            non-finite ``data``, ``progress`` not a bool. fastdpot.privacy.BudgetExceededError: a step the ledger refuses (training stops
            before it; nothing of it is released).

    References:
        Abadi et al., "Deep Learning with Differential Privacy", CCS 2016; Yousefpour et al., "Opacus: User-Friendly
        Differential Privacy Library in PyTorch", 2021 (per-sample gradients); Wang, Balle & Kasiviswanathan,
        AISTATS 2019 (sampling without replacement).
    """
    from opacus import GradSampleModule

    from ._progress import progress_bar
    from .privacy import FixedSizeSampler
    from .privacy.randomness import privacy_randomness

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_tensor(data, "data")
    n = data.shape[0]
    if targets is not None and (not isinstance(targets, torch.Tensor) or targets.shape[0] != n):
        raise ValueError(f"targets must be a tensor with {n} rows (one per record), got "
                         f"{getattr(targets, 'shape', targets)!r}")
    steps = check_int(steps, "steps", 1)
    check_bool(progress, "progress")
    B = check_int(batch_size, "batch_size", 1)
    if B > n:
        raise ValueError(f"batch_size must be <= the {n} records, got {B}")
    C = check_positive(clip_radius, "clip_radius")
    private = noise_multiplier is not None
    if private:
        z = check_positive(noise_multiplier, "noise_multiplier")
    elif ledger is not None:
        raise ValueError("noise_multiplier=None trains without privacy: give no ledger")
    else:
        z = 0.0
    rng = privacy_randomness(secure_mode, generator, generator_for_public=True)
    sampler = FixedSizeSampler(n, B, generator=rng)
    gsm = GradSampleModule(model, loss_reduction="sum")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = optimizer(params) if optimizer is not None else torch.optim.Adam(params, lr=lr)
    sched = None if scheduler is None else scheduler(opt)
    with torch.no_grad():  # the loss's contract, checked before the first release (nothing is released here)
        probe = loss_fn(gsm, data[:2], None if targets is None else targets[:2])
    if not isinstance(probe, torch.Tensor) or tuple(probe.shape) != (min(2, n),):
        gsm.remove_hooks()
        raise ValueError(f"loss_fn(model, x, y) must return one loss per sample, shape ({min(2, n)},) for 2 rows, got "
                         f"{getattr(probe, 'shape', type(probe).__name__)}")
    sigma = z * 2.0 * C
    result = DPSGDResult(model, 0, z, sigma, 0.0)
    bar = progress_bar(total=steps, desc=stage, disable=not progress)
    model.train()
    try:
        for _ in range(steps):
            if ledger is not None:  # counted before anything is computed
                ledger.record(stage, z, 1, sampling="without_replacement", dataset_size=n, batch_size=B)
            idx = sampler.sample().to(data.device)
            xb = data[idx]
            yb = None if targets is None else targets[idx]
            per_sample = loss_fn(gsm, xb, yb)
            opt.zero_grad(set_to_none=True)
            for p in params:
                p.grad_sample = None
            per_sample.sum().backward()
            if private:
                sums = clip_and_sum([p.grad_sample for p in params], C)
                for p, g in zip(params, sums):
                    p.grad = (g + rng.normal(g.shape, dtype=g.dtype, device=g.device) * sigma) / B
            else:
                for p in params:
                    p.grad = p.grad_sample.sum(0) / B
            for p in params:
                p.grad_sample = None
            opt.step()
            if sched is not None:
                sched.step()
            result.steps += 1
            result.losses.append(float(per_sample.detach().mean()))
            bar.update(1)
    finally:
        bar.close()
        gsm.remove_hooks()
    result.epsilon = ledger.epsilon() if ledger is not None else (math.inf if not private else float("nan"))
    model.eval()
    return result
