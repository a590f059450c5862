"""Argument checks of :class:`fastdpot.flow.DPSlicedWassersteinFlow`: the constructor's arguments become the flow's
validated config (the dict saved in every checkpoint and compared on load)."""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch

from ._dispatch import BACKENDS
from ._flow_init import check_init_kind
from ._validate import (check_choice, check_delta, check_epsilon, check_int, check_nonnegative, check_positive,
                        check_probability)
from .ops.flow_step import QUANTILE_MODES

__all__ = ["flow_config"]


def flow_config(num_particles, dim, num_projections, step_size, reg, noise_multiplier, target_epsilon, delta, radius,
                batch_size, sample_rate, steps, variant, pool_size, quantiles, num_quantiles, bound, directions,
                normalize, accountant, release, num_bins, *, backend: str, init,
                init_scale: float) -> Tuple[Dict[str, Any], float]:
    """``(config, init_scale)``: the validated settings (keys: the constructor's arguments that define the flow)
    and the checked ``init_scale``. A flow is private when its config has a ``noise_multiplier`` or a
    ``target_epsilon`` (``target_epsilon=inf`` becomes None: the non-private flow).

    Raises:
        ValueError: every argument error of :class:`~fastdpot.flow.DPSlicedWassersteinFlow` (its docstring).
    """
    from .privacy import ACCOUNTANTS

    n = check_int(num_particles, "num_particles", 2)
    d = check_int(dim, "dim", 1)
    k = check_int(num_projections, "num_projections", 1)
    step_size = check_positive(step_size, "step_size")
    reg = check_nonnegative(reg, "reg")
    delta = check_delta(delta)
    radius = check_positive(radius, "radius")
    check_choice(variant, "variant", ("resample", "presampled"))
    check_choice(quantiles, "quantiles", QUANTILE_MODES)
    check_choice(bound, "bound", ("chernoff", "clt", "bernstein"))
    check_choice(directions, "directions", ("uniform", "orthogonal"))
    check_choice(accountant, "accountant", ACCOUNTANTS)
    check_choice(backend, "backend", ("auto",) + BACKENDS)
    if isinstance(init, str):
        check_init_kind(init)
    init_scale = check_positive(init_scale, "init_scale")
    if isinstance(init, torch.Tensor) and init_scale != 1.0:
        raise ValueError(f"init_scale only applies to a string init; scale the init tensor yourself (got "
                         f"init_scale={init_scale!r})")
    check_choice(release, "release", ("points", "sketch"))
    if release == "sketch":
        if num_bins is None:
            raise ValueError("num_bins (L, the sketch's bins per direction) is required for release='sketch'")
        num_bins = check_int(num_bins, "num_bins", 1)
        if batch_size is not None and isinstance(batch_size, int) and num_bins > batch_size:
            raise ValueError(f"num_bins must be <= batch_size = {batch_size} (each bin needs a row), got "
                             f"{num_bins}")
        if backend in ("triton", "cuda") and quantiles != "exact":
            raise ValueError(f"release='sketch' on the {backend} backend needs quantiles='exact', got "
                             f"{quantiles!r}")
    elif num_bins is not None:
        raise ValueError(f"num_bins is only used with release='sketch', got num_bins={num_bins!r}")
    if num_quantiles is not None:
        num_quantiles = check_int(num_quantiles, "num_quantiles", 2)
    if quantiles == "histogram" and num_quantiles is None:
        raise ValueError("num_quantiles (the number of histogram bins) is required for quantiles='histogram'")
    if variant == "presampled":
        pool_size = 10 * k if pool_size is None else check_int(pool_size, "pool_size", k)
    elif pool_size is not None:
        raise ValueError(f"pool_size is only used with variant='presampled', got pool_size={pool_size!r}")
    if noise_multiplier is not None:
        noise_multiplier = check_positive(noise_multiplier, "noise_multiplier")
    if target_epsilon is not None:
        target_epsilon = check_epsilon(target_epsilon, "target_epsilon", allow_inf=True)
        if math.isinf(target_epsilon):
            if noise_multiplier is not None:
                raise ValueError(f"target_epsilon=inf means a non-private flow; noise_multiplier must then be "
                                 f"None, got {noise_multiplier!r}")
            target_epsilon = None
    private = noise_multiplier is not None or target_epsilon is not None
    if batch_size is not None and sample_rate is not None:
        raise ValueError(f"give batch_size or sample_rate, not both (got {batch_size!r} and {sample_rate!r})")
    if batch_size is not None:
        batch_size = check_int(batch_size, "batch_size", 1)
    if sample_rate is not None:
        sample_rate = check_probability(sample_rate, "sample_rate")
    if steps is not None:
        steps = check_int(steps, "steps", 1)
    if private:
        if steps is None:
            raise ValueError("steps (the planned number of steps T) is required for a private flow: the δ "
                             "split δ = δ_acc + T·δ_tail and the noise calibration depend on it")
        if batch_size is None and sample_rate is None:
            raise ValueError("a private flow needs batch_size or sample_rate (how run() samples each step)")
    config = dict(
        num_particles=n, dim=d, num_projections=k, step_size=step_size, reg=reg,
        noise_multiplier=noise_multiplier, target_epsilon=target_epsilon, delta=delta, radius=radius,
        batch_size=batch_size, sample_rate=sample_rate, steps=steps, variant=variant, pool_size=pool_size,
        quantiles=quantiles, num_quantiles=num_quantiles, bound=bound, directions=directions,
        normalize=bool(normalize), accountant=accountant, release=release, num_bins=num_bins)
    return config, init_scale


def is_sampled(config: Dict[str, Any]) -> bool:
    """Whether ``run()`` samples a batch per step (``batch_size`` or ``sample_rate`` given); else (non-private flows
    only) every step uses the whole data set."""
    return config["batch_size"] is not None or config["sample_rate"] is not None


def resolve_batch(config: Dict[str, Any], n: int) -> int:
    """The batch size B of a flow with ``config`` on a data set of ``n`` rows (``batch_size``, or
    ``round(sample_rate·n)``).

    Raises:
        ValueError: B outside [1, n], or fewer rows than the sketch's ``num_bins``.
    """
    c = config
    b = c["batch_size"] if c["batch_size"] is not None else int(round(c["sample_rate"] * n))
    if not 1 <= b <= n:
        raise ValueError(f"batch size must be in [1, n={n}], got {b} (batch_size={c['batch_size']!r}, "
                         f"sample_rate={c['sample_rate']!r})")
    if c["num_bins"] is not None and c["num_bins"] > b:
        raise ValueError(f"num_bins must be <= the batch size B = {b} (each bin needs a row), got "
                         f"{c['num_bins']}")
    return b


def accounting_event(mode: Optional[str], n: Optional[int], b: Optional[int]) -> Optional[Dict[str, Any]]:
    """The accountant event of one step of a flow bound to ``mode``: ``"sampled"`` (:meth:`run`: B of n rows
    uniformly without replacement, q = B/n), ``"full"`` (:meth:`step`: an unsampled release), None (not bound)."""
    if mode is None:
        return None
    if mode == "sampled":
        return dict(sample_rate=b / n, sampling="without_replacement", dataset_size=n, batch_size=b)
    return dict(sample_rate=1.0, sampling="poisson")
