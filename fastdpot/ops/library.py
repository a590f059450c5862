"""The ops as PyTorch custom ops (``torch.library``, namespace ``torch.ops.fastdpot``): a loss or a flow step called
inside a ``torch.compile``d function is one node of its graph, with a fake (meta) kernel for the compiler and
registered autograd, instead of a graph break around an opaque C++ extension.

Ops (schemas inferred by :func:`torch.library.custom_op` from the annotations below):

* ``sliced_wasserstein(x, y, projections, p, noise_std, key, sketch_bins, orthogonal, backend, grad_x, grad_y) ->
  (loss, grad_x, grad_y)``: op ``"sliced_wasserstein"`` (:mod:`fastdpot.ops.sliced_wasserstein`) along given
  directions, its noise keyed by ``key``. The kernel checks the values (:func:`~fastdpot.ops.sliced_wasserstein.
  check_values`: finite inputs, unit rows, orthonormal blocks with ``orthogonal``), dispatches to a fused backend
  (``backend``: ``"auto"``, ``"cpu"``, ``"triton"``, ``"cuda"``: :func:`fused_backend`) and returns the loss with
  its gradients w.r.t. x and y, computed in the forward as those backends do (``grad_x`` / ``grad_y`` False: a
  (0, d) placeholder). Autograd scales them by the upstream gradient: exact first derivatives w.r.t. x and y, none
  w.r.t. ``projections``, no double backward. The ``reference`` backend (torch autograd through the sorts) is not
  an op: under ``torch.compile`` the losses run it eagerly, at a graph break.
* ``clip_rows(x, clip_radius) -> Tensor``: :func:`fastdpot.privacy.clip_rows` (its checks run in the kernel);
  autograd: the Jacobian of the radial projection, (R/‖x‖)(I − x̂x̂ᵀ) on the clipped rows, I on the others.
* ``privacy_draws(like, num_projections, orthogonal) -> (projections, key)``: k directions (k = 0: none) and a
  62-bit noise key from the operating system (:class:`fastdpot.privacy.randomness.PrivacyRandomness`, secure mode),
  in that order, as the eager losses draw them; tagged ``nondeterministic_seeded``.
* ``flow_step(particles, private, projections, table, levels, noise_std, step_size, diffusion, key, quantiles,
  num_quantiles, histogram_bins, backend) -> (new, drift)``: op ``flow_step`` (:func:`fastdpot.ops.flow_step`, all
  its checks in the kernel); not differentiable (the eager op detaches too).

Randomness: the key is an input of the loss and step ops (a 0-d int64 tensor, in [0, 2^63)), so they are
deterministic functions of their inputs, which the compiler's caches and :func:`torch.library.opcheck` assume. The
secret draw is its own op, run every time the graph runs and never while tracing: an ``os.urandom`` traced into a
graph would be a constant baked into it, the same noise at every call.

The losses (:func:`fastdpot.sliced_wasserstein`, :func:`fastdpot.dp_sliced_wasserstein`) and
:func:`fastdpot.ops.flow_step` call these ops when ``torch.compiler.is_compiling()``; their eager calls keep the
autograd Functions of the op modules.

References:
    PyTorch custom operators (``torch.library.custom_op``, ``register_fake``, ``register_autograd``, ``opcheck``);
    torchvision registers its C++ ops the same way (``TORCH_LIBRARY(torchvision, m)``).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .._ext import BackendUnavailableError
from .._validate import check_nonnegative, check_seed
from . import sliced_wasserstein as _sw
from .flow import flow_step as _flow_step

__all__ = ["keyed_sliced_wasserstein", "fused_backend", "clip_rows", "privacy_draws", "OPS", "FUSED"]

#: the ops this module registers, ``torch.ops.fastdpot.<name>``
OPS = ("sliced_wasserstein", "clip_rows", "privacy_draws", "flow_step")
#: the backends of op ``"sliced_wasserstein"`` that compute the gradients in the forward: the custom op's kernels
FUSED = ("cpu", "triton", "cuda")


def fused_backend(device_type: str, backend: str = "auto", size: int = 0) -> str:
    """The fused backend op ``"sliced_wasserstein"`` runs for ``backend`` on ``device_type`` ("cpu", "cuda") at
    problem size N + M = ``size``, or ``""`` when the call runs the ``reference`` backend (asked for, or the
    ``auto`` choice where no fused backend is built). Under ``torch.compile`` it is read while tracing and its answer
    is a constant of the graph (what is built does not change within a process), so ``size`` must be a plain
    integer: a traced caller, whose N + M may be symbolic (a ``SymInt``: dynamic shapes), passes
    :func:`fastdpot._dispatch.size_class` of it, a size with the same ``auto`` choice.

    Raises:
        ValueError: unknown backend name.
        BackendUnavailableError: an explicitly requested backend is not available.
    """
    name = _sw.select_backend(size, 0, device_type, backend)
    return name if name in FUSED else ""


# torch.compiler.assume_constant_result(fused_backend) without importing Dynamo at `import fastdpot` (1.7 s, Triton
# included): the marker that function sets (tests/ops/test_custom_ops.py checks that it still is)
fused_backend._dynamo_marked_constant = True


# ------------------------------------------------------------------------------------------------------------
# fastdpot::sliced_wasserstein
# ------------------------------------------------------------------------------------------------------------
@torch.library.custom_op("fastdpot::sliced_wasserstein", mutates_args=())
def _sliced_wasserstein(x: Tensor, y: Tensor, projections: Tensor, p: int, noise_std: float, key: Tensor,
                        sketch_bins: Optional[int], orthogonal: bool, backend: str, grad_x: bool,
                        grad_y: bool) -> Tuple[Tensor, Tensor, Tensor]:
    seed = _seed_of(key)
    _sw.check_static(x, y, p, None, projections)
    _sw.check_values(x, y, projections, orthogonal=orthogonal)
    noise_std = check_nonnegative(noise_std, "noise_std")
    extra = {}
    if sketch_bins is not None:
        if not 1 <= sketch_bins <= min(x.shape[0], y.shape[0]):
            raise ValueError(f"sketch_bins must be in [1, min(N, M)] = [1, {min(x.shape[0], y.shape[0])}], got "
                             f"{sketch_bins}")
        extra["sketch_bins"] = int(sketch_bins)
    name, fn = _sw._dispatch_for(x.shape[0], y.shape[0], x.device.type, backend)
    if name not in FUSED:
        raise BackendUnavailableError(
            f"torch.ops.fastdpot.sliced_wasserstein runs the fused backends {FUSED}; backend={backend!r} gives "
            f"{name!r} on {x.device.type} (build the C++ extension: `pip install -e .`; the reference backend is "
            f"the eager fastdpot.ops.sliced_wasserstein.sliced_wasserstein_op)")
    need_x, need_y = grad_x and sketch_bins is None, grad_y
    loss, gx, gy = fn(x, y, projections.to(x.dtype), p, noise_std, seed, False, grads=(need_x, need_y), **extra)
    _sw._check_overflow(loss, x.dtype)
    d = x.shape[1]
    return (loss.to(x.dtype).reshape(()), gx.to(x.dtype) if need_x else x.new_zeros((0, d)),
            gy.to(x.dtype) if need_y else x.new_zeros((0, d)))


@_sliced_wasserstein.register_fake
def _sliced_wasserstein_fake(x, y, projections, p, noise_std, key, sketch_bins, orthogonal, backend, grad_x, grad_y):
    d = x.shape[1]
    gx = x.new_empty((x.shape[0], d) if grad_x and sketch_bins is None else (0, d))
    gy = x.new_empty((y.shape[0], d) if grad_y else (0, d))
    return x.new_empty(()), gx, gy


def _sw_setup(ctx, inputs, output):
    ctx.need = (inputs[9] and inputs[6] is None, inputs[10])
    ctx.save_for_backward(output[1], output[2])


def _sw_backward(ctx, grad_loss, _grad_gx, _grad_gy):
    gx, gy = ctx.saved_tensors
    return ((grad_loss * gx if ctx.need[0] else None), (grad_loss * gy if ctx.need[1] else None)) + (None,) * 9


_sliced_wasserstein.register_autograd(_sw_backward, setup_context=_sw_setup)


def keyed_sliced_wasserstein(x: Tensor, y: Tensor, projections: Tensor, p: int, noise_std: float, key: Tensor, *,
                             sketch_bins: Optional[int] = None, orthogonal: bool = False,
                             backend: str = "auto") -> Tensor:
    """Op ``"sliced_wasserstein"`` through ``torch.ops.fastdpot.sliced_wasserstein``: the (noisy) SW_p^p of x and y
    along ``projections`` (:func:`fastdpot.ops.sliced_wasserstein.sliced_wasserstein_op`'s math and backends), its
    noise keyed by ``key``; differentiable w.r.t. x (points release) and y, whose gradients are computed in the
    forward only where they are needed (grad mode on and the tensor requires grad).

    Args:
        x: (N, d) float32 / float64, the private side of the DP uses (already clipped: the op clips nothing).
        y: (M, d), same dtype and device.
        projections: (k, d) unit rows (checked when the op runs; with ``orthogonal``, blocks of d orthonormal rows).
        p: 1 or 2. noise_std: σ >= 0 on every projected value (with ``sketch_bins``: on every private bin sum).
        key: 0-d int64 tensor in [0, 2^63), the key of the noise streams (the kernels' ``seed``).
        sketch_bins: L for the sketch release (1 <= L <= min(N, M)), None for the points release.
        backend: "auto", "cpu", "triton", "cuda" (:data:`FUSED`), resolved when the op runs.

    Shape:
        x (N, d), y (M, d), projections (k, d), key () -> 0-d tensor of x's dtype.

    Raises:
        ValueError / TypeError: as :func:`fastdpot.ops.sliced_wasserstein.sliced_wasserstein_op` (compiled: when the
            graph runs), a key out of range.
        BackendUnavailableError: no fused backend for ``backend`` on x's device.
    """
    grad = torch.is_grad_enabled()
    loss, _, _ = torch.ops.fastdpot.sliced_wasserstein(
        x, y, projections, p, float(noise_std), key, sketch_bins, orthogonal, backend,
        grad and x.requires_grad and sketch_bins is None, grad and y.requires_grad)
    return loss


def _seed_of(key: Tensor) -> int:
    if not isinstance(key, Tensor) or key.numel() != 1 or key.dtype.is_floating_point or key.dtype.is_complex:
        raise ValueError(f"key must be a one-element integer tensor, got {key!r}")
    return check_seed(int(key.reshape(()).item()), "key")


# ------------------------------------------------------------------------------------------------------------
# fastdpot::clip_rows
# ------------------------------------------------------------------------------------------------------------
@torch.library.custom_op("fastdpot::clip_rows", mutates_args=())
def clip_rows(x: Tensor, clip_radius: float) -> Tensor:
    """Rows of x (N, d) with ℓ2 norm > ``clip_radius`` scaled onto the sphere of that radius (the op of
    :func:`fastdpot.privacy.clip_rows`, whose checks run in the kernel: x finite, R > 0); differentiable.

    Shape: x (N, d) -> (N, d)."""
    from ..privacy import clip_rows as _clip

    return _clip(x, clip_radius)


@clip_rows.register_fake
def _clip_rows_fake(x, clip_radius):
    return torch.empty_like(x)


def _clip_setup(ctx, inputs, output):
    ctx.radius = inputs[1]
    ctx.save_for_backward(inputs[0])


def _clip_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    xd, g = x.double(), grad.double()
    norms = torch.linalg.vector_norm(xd, dim=1, keepdim=True)
    unit = xd / torch.clamp(norms, min=torch.finfo(torch.float64).tiny)
    inside = ctx.radius / torch.clamp(norms, min=ctx.radius) * (g - unit * (unit * g).sum(1, keepdim=True))
    return torch.where(norms > ctx.radius, inside, g).to(grad.dtype), None


clip_rows.register_autograd(_clip_backward, setup_context=_clip_setup)


# ------------------------------------------------------------------------------------------------------------
# fastdpot::privacy_draws
# ------------------------------------------------------------------------------------------------------------
@torch.library.custom_op("fastdpot::privacy_draws", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def privacy_draws(like: Tensor, num_projections: int, orthogonal: bool) -> Tuple[Tensor, Tensor]:
    """The secret draws of one private release, made when the op runs: ``num_projections`` = k unit directions
    ((k, d) in ``like``'s dtype and device, d = ``like.shape[1]``; uniform, or ``orthogonal`` blocks: as
    :func:`fastdpot._random.random_projections`) and then the noise key (0-d int64 CPU tensor, 62 bits), both from
    the operating system (:class:`fastdpot.privacy.randomness.PrivacyRandomness` in secure mode). k = 0 draws the
    key only ((0, d) directions). Nothing of ``like`` but its shape, dtype and device is read.

    Shape: like (N, d) -> ((k, d), ())."""
    from .._random import random_projections
    from ..privacy.randomness import PrivacyRandomness

    rng = PrivacyRandomness(secure_mode=True)
    d = like.shape[1]
    if num_projections > 0:
        theta = random_projections(num_projections, d, rng, orthogonal=orthogonal, dtype=like.dtype,
                                   device=like.device)
    else:
        theta = like.new_empty((0, d))
    return theta, torch.tensor(rng.seed(), dtype=torch.int64)


@privacy_draws.register_fake
def _privacy_draws_fake(like, num_projections, orthogonal):
    return like.new_empty((num_projections, like.shape[1])), torch.empty((), dtype=torch.int64)


# ------------------------------------------------------------------------------------------------------------
# fastdpot::flow_step
# ------------------------------------------------------------------------------------------------------------
@torch.library.custom_op("fastdpot::flow_step", mutates_args=())
def _flow_step_op(particles: Tensor, private: Optional[Tensor], projections: Tensor, table: Optional[Tensor],
                  levels: Optional[Tensor], noise_std: float, step_size: float, diffusion: float, key: Tensor,
                  quantiles: str, num_quantiles: Optional[int], histogram_bins: Optional[int],
                  backend: str) -> Tuple[Tensor, Tensor]:
    sketch = None if table is None else (table, levels)
    new, drift, _ = _flow_step(particles, private, projections, noise_std=noise_std, step_size=step_size,
                               diffusion=diffusion, seed=_seed_of(key), quantiles=quantiles,
                               num_quantiles=num_quantiles, histogram_bins=histogram_bins, backend=backend,
                               sketch=sketch)
    return new, drift


@_flow_step_op.register_fake
def _flow_step_fake(particles, private, projections, table, levels, noise_std, step_size, diffusion, key, quantiles,
                    num_quantiles, histogram_bins, backend):
    return torch.empty_like(particles), torch.empty_like(particles)
