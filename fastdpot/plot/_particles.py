"""Particles against data on two chosen directions (:func:`fastdpot.plot.particles`)."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from .._validate import check_int
from ._common import _axes, _finish, _rows


def particles(source, data=None, directions=None, *, ax=None, path: Optional[str] = None, max_points: int = 5000,
              labels: Tuple[str, str] = ("particles", "data"), title: Optional[str] = None):
    """Scatter of particles against data on two chosen directions.

    Args:
        source: the particles, (N, d): a tensor, an array, or an object with a ``particles`` attribute (a flow).
        data: optional (M, d) rows drawn beneath (grey), e.g. the private data, a held-out set.
        directions: the two directions of the picture: None (coordinates 0 and 1), a pair of coordinate indices
            ``(i, j)``, or a (2, d) tensor / array of directions (each row normalised to unit length).
        ax: axes to draw into (default: a new figure). path: save the figure there (PNG, 100 dpi) and close it.
        max_points: at most this many rows of each cloud are drawn (an integer >= 1; a seeded public subsample: a
            display choice).
        labels: legend names of the particles and the data. title: the axes' title.

    Shape:
        source (N, d), data (M, d), directions (2, d) -> the picture of θ_1ᵀx against θ_2ᵀx.

    Returns:
        the ``matplotlib.axes.Axes``.

    Raises:
        ValueError: shapes that disagree, d < 2 without directions, coordinates out of range, a zero direction,
            ``max_points`` not an integer >= 1 (0 would draw nothing).
        ImportError: matplotlib is not installed (the ``plot`` extra).
    """
    max_points = check_int(max_points, "max_points", 1)
    x = _rows(source, "particles")
    d = x.shape[1]
    y = None if data is None else _rows(data, "data")
    if y is not None and y.shape[1] != d:
        raise ValueError(f"particles and data must share d, got {d} and {y.shape[1]}")
    theta, names = _directions(directions, d)
    ax = _axes(ax, (4.5, 4.5))
    g = np.random.default_rng(0)
    for pts, label, color in ((y, labels[1], "tab:gray"), (x, labels[0], "tab:blue")):
        if pts is None:
            continue
        if pts.shape[0] > max_points:
            pts = pts[g.choice(pts.shape[0], max_points, replace=False)]
        proj = pts @ theta.T
        ax.scatter(proj[:, 0], proj[:, 1], s=2, c=color, label=label, alpha=0.6 if color == "tab:gray" else 0.8)
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    ax.legend(fontsize=8, markerscale=4)
    ax.set_title(title or f"{x.shape[0]} particles" + ("" if y is None else f" against {y.shape[0]} data rows"),
                 fontsize=9)
    return _finish(ax, path)


def _directions(directions, d: int):
    if directions is None:
        directions = (0, 1)
    if isinstance(directions, (tuple, list)) and len(directions) == 2 and all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in directions):
        if d < 2:
            raise ValueError(f"the rows have d = {d} < 2 coordinates: give directions=(2, d) rows")
        for i in directions:
            if not 0 <= i < d:
                raise ValueError(f"coordinate {i} out of range for d = {d}")
        theta = np.zeros((2, d))
        theta[0, directions[0]] = theta[1, directions[1]] = 1.0
        return theta, [f"coordinate {directions[0]}", f"coordinate {directions[1]}"]
    theta = _rows(directions, "directions")
    if theta.shape != (2, d):
        raise ValueError(f"directions must be two coordinates (i, j) or a (2, d) = (2, {d}) array, got shape "
                         f"{theta.shape}")
    norms = np.linalg.norm(theta, axis=1, keepdims=True)
    if not (norms > 0).all():
        raise ValueError("directions must be non-zero rows")
    return theta / norms, ["θ₁ᵀx", "θ₂ᵀx"]
