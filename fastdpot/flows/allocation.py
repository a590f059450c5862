"""How many particles each class gets: one allocator for every caller (flows, baselines, the main job).

:func:`allocate_particles` splits N particles over C classes in proportion to C non-negative weights (public class
counts, released noisy counts, or equal shares) with largest-remainder rounding and a floor per class. The weights
must be public or released: the allocation is then post-processing, and the counts it returns may be published.
"""
from __future__ import annotations

from typing import List, Sequence, Union

import torch

from .._validate import check_int

__all__ = ["allocate_particles"]


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
