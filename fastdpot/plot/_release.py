"""A one-shot release's quantile functions against the generated particles' (:func:`fastdpot.plot.quantiles`)."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .._validate import check_int
from ._common import _axes, _finish, _row_tensor


def quantiles(release, particles, labels=None, *, class_index: int = 0, direction: int = 0, shrink=True,
              tables=None, ax=None, path: Optional[str] = None, title: Optional[str] = None):
    """One direction of one class of a one-shot release, against the particles generated from it: the released
    quantile function (what the flows move the particles towards) and the particles' empirical one, in the release's
    centred coordinates θ_jᵀ(x − m_c).

    Drawn: the release's noisy bin means at their levels (l − ½)/L_j with ± one noise standard deviation
    (:meth:`~fastdpot.privacy.class_sketch.ClassSketchRelease.bin_means`, ``mean_noise_std``: released quantities
    only); the released quantile function after post-processing (``quantile_tables(shrink)``: shrunk, made
    non-decreasing, linear between levels); the particles' empirical quantile function (their sorted projections at
    levels (i + ½)/N_c) and their own bin means on the same L_j bins. Everything drawn is public when the particles
    are (a release and its post-processing); a picture of private rows passed as ``particles`` is not.

    Args:
        release: a :class:`~fastdpot.privacy.class_sketch.ClassSketchRelease`.
        particles: (N, d) rows in the data's coordinates (tensor or array), e.g. the samples of
            :meth:`fastdpot.flows.ClassConditionalFlow.from_release`'s ``run``.
        labels: (N,) class of each row (None: every row is of class ``class_index``).
        class_index: c in [0, C). direction: j in [0, k), the release's direction j (row j mod p of its block
            j // p; applied through the block, never materialising the others).
        shrink: the tables' shrinkage, as the flows used it (True, "pooled", "stein" or False).
        tables: ``release.quantile_tables(shrink)`` computed once for many pictures (default: computed here).
        ax: axes to draw into (default: a new figure). path: save and close. title: the axes' title.

    Shape:
        particles (N, d), labels (N,), d = the release's dimension (``release.centers.shape[1]``).

    Returns:
        the ``matplotlib.axes.Axes``.

    Raises:
        ValueError: a class or direction out of range, rows of another width, labels of another length, fewer than
            one particle of the class. TypeError: a release without the fields of a ``ClassSketchRelease``.
        ImportError: matplotlib is not installed (the ``plot`` extra).
    """
    from ..privacy.class_sketch import check_shrinkage, fractional_bin_sums

    if not all(hasattr(release, a) for a in ("blocks", "centers", "bins", "bin_means", "quantile_tables")):
        raise TypeError(f"release must be a ClassSketchRelease, got {type(release).__name__}")
    C, k, d = release.num_classes, int(release.bins.numel()), int(release.centers.shape[1])
    c = check_int(class_index, "class_index", 0)
    j = check_int(direction, "direction", 0)
    check_shrinkage(shrink)
    if c >= C:
        raise ValueError(f"class_index must be in [0, {C}), got {c}")
    if j >= k:
        raise ValueError(f"direction must be in [0, {k}) (the release's directions), got {j}")
    x = _row_tensor(particles, "particles")  # in its own dtype: no float64 copy of every row
    if x.shape[1] != d:
        raise ValueError(f"particles must have the release's d = {d} columns, got {x.shape[1]}")
    keep = None
    if labels is not None:
        y = np.asarray(labels.detach().cpu() if isinstance(labels, torch.Tensor) else labels).reshape(-1)
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"labels must have one entry per particle ({x.shape[0]}), got {y.shape[0]}")
        keep = torch.from_numpy(np.flatnonzero(y == c))
        if keep.numel() < 1:
            raise ValueError(f"no particle of class {c} to compare")
    p = release.block_size
    unit = torch.zeros(1, p, dtype=torch.float64)
    unit[0, j % p] = 1.0
    theta = release.blocks[j // p].transpose(unit)[0]  # θ_j = Θ_bᵀ e_(j mod p)
    center = release.centers[c].to(torch.float64)
    L = int(release.bins[j])
    levels = (np.arange(L) + 0.5) / L
    means = release.bin_means()[c, j, :L].numpy()
    noise = float(release.mean_noise_std()[c, j])
    table, grid = (release.quantile_tables(shrink=shrink) if tables is None else tables)[c]
    proj = np.sort(_projections(x, keep, theta, center))
    n = proj.shape[0]
    own = fractional_bin_sums(torch.from_numpy(proj[:, None]), L)[:, 0].numpy() * L / n  # the release's bins
    ax = _axes(ax, (4.2, 3.4))
    ax.plot((np.arange(n) + 0.5) / n, proj, color="tab:blue", lw=1.4, label=f"generated ({n}): empirical")
    ax.plot(levels, own, "x", color="tab:blue", ms=6, label="generated: bin means")
    ax.plot(grid.numpy(), table[j].numpy(), color="tab:orange", lw=1.2, ls="--", label="released (post-processed)")
    ax.errorbar(levels, means, yerr=noise, fmt="o", color="tab:orange", ms=4, capsize=2,
                label="released bin means ± noise s.d.")
    ax.set_xlim(0, 1)
    ax.set_xlabel("quantile level u")
    ax.set_ylabel(f"$\\theta_{{{j}}}^\\top(x - m_{{{c}}})$")
    ax.set_title(title or f"class {c}, direction {j} ({L} bins)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return _finish(ax, path)


def _projections(x: torch.Tensor, keep, theta: torch.Tensor, center: torch.Tensor) -> np.ndarray:
    """θᵀ(x_i − m) in float64 for the rows ``keep`` of x (all when None), a block of rows at a time (each block made
    float64 on its own: 16 MB of it at most)."""
    rows = x.shape[0] if keep is None else keep.numel()
    out = torch.empty(rows, dtype=torch.float64)
    step = max(1, (1 << 21) // x.shape[1])
    for s in range(0, rows, step):
        block = x[s:s + step] if keep is None else x[keep[s:s + step]]
        out[s:s + block.shape[0]] = (block.to(torch.float64) - center) @ theta
    return out.numpy()

