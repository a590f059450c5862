"""The pictures' shared plumbing: matplotlib imported on first use, axes, saving, rows as float64 arrays."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:  # the optional extra
        raise ImportError(f"fastdpot.plot draws with matplotlib, an optional extra: pip install 'fastdpot[plot]' "
                          f"(or pip install matplotlib); {err}") from err
    return plt


def _axes(ax, figsize):
    if ax is not None:
        return ax
    _, ax = _pyplot().subplots(figsize=figsize)
    return ax


def _finish(ax, path: Optional[str]):
    if path is not None:
        fig = ax.figure
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        _pyplot().close(fig)
    return ax


def _row_tensor(x, name: str) -> torch.Tensor:
    """The (rows, d) values of ``x`` (a tensor, an array or a flow) as a CPU tensor in its own floating dtype
    (integers as float64): no copy of a CPU tensor or a float array."""
    if hasattr(x, "particles") and not isinstance(x, (torch.Tensor, np.ndarray)):
        x = x.particles  # a flow
    x = x.detach().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if not x.is_floating_point():
        x = x.double()
    if x.dim() != 2 or x.shape[0] == 0:
        raise ValueError(f"{name} must be (rows, d) with at least one row, got shape {tuple(x.shape)}")
    return x


def _rows(x, name: str) -> np.ndarray:
    """:func:`_row_tensor` as a float64 array."""
    return _row_tensor(x, name).to(torch.float64).numpy()
