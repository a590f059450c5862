"""What the backends of op ``"sliced_wasserstein"`` share: the keyed noise of the releases and the autograd base of
the fused backends.

Imported by the op module (:mod:`fastdpot.ops.sliced_wasserstein`: the ``reference`` and ``cpu`` rows) and by its
GPU launcher ``kernels/dpswd.py`` (``fastdpot.kernels.dpswd``); it imports neither, so the op module's lazy import
of the launcher closes no loop. The names are re-exported by the op module, where they are documented for users.
"""
from __future__ import annotations

import torch

from ..reference.philox import keyed_normals

__all__ = ["GradientInForward", "reference_noise", "sketch_noise"]


def reference_noise(x, y, k, noise_std, seed):
    """The ``reference`` backend's noise, ``(noise_x (N, k), noise_y (M, k))`` in x's dtype and device: the keyed
    privacy-grade normals of :mod:`fastdpot.reference.philox` (all 64 bits of ``seed`` key them) in the C++
    kernel's layout (``csrc/sliced.cpp``: element (i, j) of the x noise is normal ``j·N + i`` of stream 0, of the y
    noise normal ``j·M + i`` of stream 1), scaled by ``noise_std`` (σ, in the unit of the projected values). Also
    used by ``bench.gpu_flow``'s ``reference_compiled`` anchor, so that it adds exactly the reference's noise."""
    n, m = x.shape[0], y.shape[0]
    nx = keyed_normals(seed, 0, 0, k * n, per_block=2, device=x.device).reshape(k, n).t() * noise_std
    ny = keyed_normals(seed, 1, 0, k * m, per_block=2, device=x.device).reshape(k, m).t() * noise_std
    return nx.to(x.dtype), ny.to(x.dtype)


def sketch_noise(k, sketch_bins, noise_std, seed, device="cpu"):
    """The noise of the sketch release on the private bin sums, (k, L) float64 with L = ``sketch_bins``: normal
    ``j·L + l`` of stream 0 of the keyed privacy-grade normals of :mod:`fastdpot.reference.philox` (``per_block=2``,
    all 64 bits of ``seed``), times ``noise_std`` (σ) -- the draws of ``csrc/sliced.cpp``'s sketch kernel and of
    ``kernels/dpswd.py``."""
    z = keyed_normals(seed, 0, 0, k * sketch_bins, per_block=2, device=device).reshape(k, sketch_bins)
    return z * noise_std


class GradientInForward(torch.autograd.Function):
    """Base of the fused DP-SW autograd Functions (cpu, triton): their forward computes dloss/dx and dloss/dy
    alongside the loss and saves them with ``ctx.save_for_backward(grad_x, grad_y)`` (None for a side that needs
    no gradient); backward scales them by the upstream gradient. Forward arguments:
    (x, y, projections, p, noise_std, seed, return_noise). No double backward."""

    @staticmethod
    def backward(ctx, grad_out, *unused):
        """The saved dloss/dx and dloss/dy times the upstream gradient; None for every other input."""
        grad_x, grad_y = ctx.saved_tensors
        gx = grad_out * grad_x if grad_x is not None else None
        gy = grad_out * grad_y if grad_y is not None else None
        return (gx, gy) + (None,) * (len(ctx.needs_input_grad) - 2)
