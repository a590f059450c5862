"""The fused block step of op ``flow_step``'s cpu row (``csrc/flow_block.cpp``, ``fastdpot._C_flow_block``): when it
applies, its call with ``out=`` and the finiteness it reports, the op's ``out`` check, and the workspace it keeps
between a flow's steps. :mod:`fastdpot.ops.flow` owns the op and its dispatch rows; this module is its block kernel's
Python side."""
from __future__ import annotations

import torch

from .._blocks import coordinate_major, is_block
from .._ext import cpp_status, load_cpp

__all__ = ["release_block_workspace"]


def fused_block(projections, sketch, quantiles, noise_std, return_noise, shard) -> bool:
    """Whether the cpu row runs this step as the fused block step (:func:`block_sketch_step`): a fast block, a
    sketch target in exact mode, no smoothing noise, no draws returned, one process, the module built."""
    return (is_block(projections) and sketch is not None and quantiles == "exact" and noise_std == 0
            and not return_noise and shard is None and projections.spec() is not None
            and cpp_status("flow_block")[0])


def block_sketch_step(particles, block, sketch, step_size, diffusion, seed, domain, return_drift=True, out=None,
                       error_if_nonfinite=False):
    """The fused sketch-target exact step on a fast block (``fastdpot._C_flow_block.sketch_step``); without
    ``return_drift`` no drift is written (its memory is not taken). The kernel refuses non-finite particles
    (ValueError, nothing written) and returns the new particles' finiteness; it writes into ``out`` when ``out`` has
    the particles' layout (a flow's spare buffer: no fresh (N, d) tensor, no page faults), else into a fresh tensor
    copied to ``out``."""
    cm = coordinate_major(particles)  # particles kept transposed (a flow's layout): no tile is transposed
    x = particles.detach().t() if cm else particles.detach().contiguous()
    direct = out is not None and (coordinate_major(out) if cm else out.is_contiguous())
    new = (out.t() if cm else out) if direct else torch.empty_like(x)
    drift = torch.empty_like(x) if return_drift else None
    tb = sketch[0].detach().to("cpu", torch.float64).contiguous().numpy()
    lv = sketch[1].detach().to("cpu", torch.float64).contiguous().numpy()
    lo, hi = (None, None) if domain is None else (domain[0].contiguous().numpy(), domain[1].contiguous().numpy())
    finite = load_cpp("flow_block").sketch_step(block.spec(), x.numpy(), tb, lv, float(step_size), float(diffusion),
                                                int(seed), lo, hi, new.detach().numpy(),
                                                None if drift is None else drift.numpy(), cm)
    if cm:
        new, drift = new.t(), None if drift is None else drift.t()
    if out is not None and not direct:
        new = out.copy_(new)
    elif direct:
        new = out
    if error_if_nonfinite and not finite:
        raise nonfinite_error()
    return new, drift, None


def nonfinite_error() -> FloatingPointError:
    """The error of ``error_if_nonfinite=True`` (every path of op ``flow_step`` raises this one)."""
    return FloatingPointError("flow_step produced non-finite particles (NaN or Inf; e.g. an overflow without a "
                              "domain); the input particles are unchanged")


def release_block_workspace() -> None:
    """Free the fused block step's projections buffer, which it keeps between calls of one size (a flow's steps):
    a flow calls this when its run ends."""
    if cpp_status("flow_block")[0]:
        load_cpp("flow_block").release_workspace()


def check_out(out, particles: torch.Tensor) -> None:
    """Refuse an ``out`` that cannot receive the new particles (:func:`fastdpot.ops.flow_step`).

    Raises:
        ValueError: ``out`` is not a tensor, differs in shape, dtype or device, requires grad, or shares memory
            with ``particles``.
    """
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out.shape != particles.shape or out.dtype != particles.dtype or out.device != particles.device:
        raise ValueError(f"out must have the particles' shape, dtype and device {tuple(particles.shape)}, "
                         f"{particles.dtype}, {particles.device}; got {tuple(out.shape)}, {out.dtype}, {out.device}")
    if out.requires_grad:
        raise ValueError("out must not require grad (the step is not differentiable)")
    if out.untyped_storage().data_ptr() == particles.untyped_storage().data_ptr():
        raise ValueError("out must not share memory with particles (the step reads them while it writes out)")
