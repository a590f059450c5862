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


def _rows(x, name: str) -> np.ndarray:
    if hasattr(x, "particles") and not isinstance(x, (torch.Tensor, np.ndarray)):
        x = x.particles  # a flow
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"{name} must be (rows, d) with at least one row, got shape {x.shape}")
    return x
