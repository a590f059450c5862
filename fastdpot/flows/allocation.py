"""How many particles each class gets: one allocator for every caller (flows, baselines, the main job), and the
labelled samples of released per-class Gaussians drawn that way.

:func:`allocate_particles` splits N particles over C classes in proportion to C non-negative weights (public class
counts, released noisy counts, or equal shares) with largest-remainder rounding and a floor per class. The weights
must be public or released: the allocation is then post-processing, and the counts it returns may be published.
:func:`sample_class_gaussians` draws the samples of per-class Gaussians (e.g. those of a release of
:mod:`fastdpot.privacy.moments`, through :func:`~fastdpot.privacy.moments.class_gaussians`) with that allocation:
post-processing too, so it lives here with the flows, above the mechanisms (:mod:`fastdpot.privacy` imports nothing
of :mod:`fastdpot.flows`).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch

from .._validate import check_int

__all__ = ["allocate_particles", "sample_class_gaussians"]


def allocate_particles(num_particles: int, weights: Union[str, Sequence[float], torch.Tensor], num_classes: int,
                       minimum: int = 0) -> List[int]:
    """Particles per class: ``minimum`` each, the rest in proportion to ``weights``, largest-remainder rounding.

    The spare ``N − minimum·C`` particles are shared as ``w_c / Σw · spare``; every class gets the floor of its share
    and the classes with the largest remainders (ties: the lower class index first) one more, so the counts sum to
    N exactly and differ from the exact shares by less than one.

    Args:
        num_particles: N >= minimum·C.
        weights: ``"equal"``, or C finite non-negative weights (a sequence or a tensor), not all 0.
        num_classes: C >= 1.
        minimum: the floor per class (>= 0).

    Returns:
        C integers summing to N.

    Raises:
        ValueError: N < minimum·C, a wrong number of weights, negative, non-finite or all-zero weights, a string
            other than ``"equal"``.
    """
    C = check_int(num_classes, "num_classes", 1)
    floor = check_int(minimum, "minimum", 0)
    n = check_int(num_particles, "num_particles", max(1, floor * C))
    if isinstance(weights, str):
        if weights != "equal":
            raise ValueError(f"weights must be 'equal' or {C} public weights, got {weights!r}")
        w = torch.ones(C, dtype=torch.float64)
    else:
        w = torch.as_tensor(weights.detach().cpu() if isinstance(weights, torch.Tensor) else
                            [float(v) for v in weights], dtype=torch.float64).flatten()
        if w.numel() != C or not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or not float(w.sum()) > 0:
            raise ValueError(f"weights must be {C} finite non-negative numbers, not all 0, got {w.tolist()!r}")
    spare = n - floor * C
    share = w / w.sum() * spare
    base = share.floor().long()
    order = torch.argsort(share - base.double(), descending=True, stable=True)
    base[order[: spare - int(base.sum())]] += 1
    return [int(v) + floor for v in base]


def sample_class_gaussians(means: torch.Tensor, covs: torch.Tensor, weights: Union[torch.Tensor, Sequence[float]],
                           num_particles: int, generator: Optional[torch.Generator] = None, *, minimum: int = 0):
    """N labelled samples, class c drawn from N(means[c], covs[c]), ``minimum`` per class and the rest in proportion
    to the public or released ``weights`` (:func:`allocate_particles`; all-zero weights: equal shares):
    post-processing of a release, no privacy cost.

    Shape:
        means (C, d), covs (C, d, d) PSD, weights (C,) -> (samples (N, d) float32, labels (N,) int64).

    Raises:
        ValueError: the errors of :func:`allocate_particles` (N < minimum·C, a wrong number of weights).
    """
    C, d = means.shape
    w = torch.as_tensor(weights, dtype=torch.float64).clamp_min(0.0)
    sizes = allocate_particles(num_particles, w if float(w.sum()) > 0 else "equal", C, minimum=minimum)
    xs, ys = [], []
    for c in range(C):
        if sizes[c] == 0:
            continue
        evals, evecs = torch.linalg.eigh(covs[c].double())
        root = evecs * evals.clamp_min(0.0).sqrt()[None, :]
        z = torch.randn(sizes[c], d, dtype=torch.float64, generator=generator)
        xs.append(means[c].double() + z @ root.T)
        ys.append(torch.full((sizes[c],), c, dtype=torch.int64))
    return torch.cat(xs).float(), torch.cat(ys)
