"""Op ``"sliced_wasserstein"``: the (noisy) sliced Wasserstein distance SW_p^p of two point clouds along given
directions, its validated entry point :func:`sliced_wasserstein_op` and its backends.

The losses of :mod:`fastdpot.sliced` (argument aliases, numpy in and out, privacy randomness, clipping, the
modules) call :func:`sliced_wasserstein_op`; it checks its arguments (:func:`check_inputs`, :func:`check_weights`),
draws the directions when none are given (:func:`fastdpot._random.random_projections`) and dispatches
(:mod:`fastdpot._dispatch`).

Backends (signature ``fn(x, y, projections, p, noise_std, seed, return_noise, *, sketch_bins=None)``;
every row implements both releases: the points release, noise on every projected value, and with ``sketch_bins`` the
sketch release, noise on the bin sums of the private side's sorted projections; the fused rows (cpu, triton, cuda)
also take ``grads=(need_x, need_y)`` and then return ``(loss, dloss/dx or None, dloss/dy or None)`` as values,
without autograd: the kernel of the PyTorch custom op ``torch.ops.fastdpot.sliced_wasserstein``,
:mod:`fastdpot.ops.library`):

* ``reference`` — :func:`fastdpot.reference.sliced.sliced_wasserstein` and
  :func:`~fastdpot.reference.sliced.sketch_sliced_wasserstein` (pure torch, autograd), with the C++ kernel's keyed
  noise (:func:`reference_noise`, :func:`sketch_noise`, defined in :mod:`fastdpot.ops._sliced_shared` beside
  :class:`GradientInForward`, which ``kernels/dpswd.py`` imports from there); also the only row for non-uniform
  sample weights;
* ``cpu`` — ``csrc/sliced.cpp``: projections by torch's BLAS per chunk of directions, then one fused C++ pass per
  direction (Philox noise, radix argsort with 32-bit indices, quantile matching — or bin sums, noise, isotonic fit
  and table lookup for the sketch —, gradient scattered through the permutation), OpenMP over directions, GIL
  released. The gradient w.r.t. x and y is computed *during* the forward (it is a by-product of the sorts) and
  saved as (N, d) + (M, d) tensors: that is less memory than saving the permutations ((N + M)·k 32-bit indices,
  400 MB at N = M = 10⁵, k = 500) and costs no second sort pass;
* ``triton`` — ``kernels/dpswd.py`` (:func:`fastdpot.ops._triton.register_triton`: imported on first use), the
  ``auto`` choice on CUDA where ``cuda`` (the same with CUB sorts) is not built.

``backend="auto"``: ``cpu`` for CPU tensors when the extension is built, ``cuda`` / ``triton`` on CUDA, else
``reference``.

References:
    Rakotomamonjy & Ralaivola, "Differentially private sliced Wasserstein distance", ICML 2021; Bonneel et al.,
    "Sliced and Radon Wasserstein barycenters", JMIV 2015.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .. import _dispatch
from .._ext import cpp_status, load_cpp
from .._validate import (check_choice, check_finite_tensor, check_int, check_nonnegative, check_num_projections,
                         check_same_dim, check_seed, check_tensor, check_unit_rows, unit_norm_tolerance)
from ..reference import sliced as _ref
from .._random import random_projections
from ._sliced_shared import GradientInForward, reference_noise, sketch_noise
from ._triton import register_cuda, register_triton

__all__ = ["sliced_wasserstein_op", "check_inputs", "check_static", "check_values", "check_weights", "select_backend",
           "GradientInForward",
           "SlicedWassersteinCPU", "SketchSlicedWassersteinCPU", "reference_noise", "sketch_noise"]

OP = "sliced_wasserstein"
_DTYPES = (torch.float32, torch.float64)
# bytes of (kc, N + M) scratch per chunk of directions in the cpu backend: memory O((N + M)(d + kc))
_CHUNK_BYTES = 64 * 2 ** 20


# ------------------------------------------------------------------------------------------------------------
# backends
# ------------------------------------------------------------------------------------------------------------
@_dispatch.register(OP, "reference")
def _sw_reference(x, y, projections, p, noise_std, seed, return_noise, *, sketch_bins=None):
    if sketch_bins is not None:
        noise = sketch_noise(projections.shape[0], sketch_bins, noise_std, seed, x.device)
        loss = _ref.sketch_sliced_wasserstein(x, y, projections, sketch_bins, p, noise if noise_std > 0 else None)
        return (loss, noise, None) if return_noise else loss
    noise_x = noise_y = None
    if noise_std > 0 or return_noise:
        noise_x, noise_y = reference_noise(x, y, projections.shape[0], noise_std, seed)
    loss = _ref.sliced_wasserstein(x, y, projections, p=p, noise_x=noise_x, noise_y=noise_y)
    if return_noise:
        return loss, noise_x, noise_y
    return loss


def _chunk_size(n, m, k, itemsize, buffers):
    per_dir = (n + m) * itemsize * buffers
    return max(1, min(k, _CHUNK_BYTES // per_dir))


def _cpu_points(x, y, projections, p, noise_std, seed, need_gx, need_gy, return_noise):
    """The fused C++ points release, chunk by chunk: ``(loss, dloss/dx or None, dloss/dy or None, noise_x or None,
    noise_y or None)`` (the gradients of the sorts' permutations, computed during the forward)."""
    mod = load_cpp("sliced")
    kern = mod.sw_chunk_f32 if x.dtype == torch.float32 else mod.sw_chunk_f64
    n, m, d = x.shape[0], y.shape[0], x.shape[1]
    k = projections.shape[0]
    xd, yd, th = x.detach(), y.detach(), projections.detach()
    kc = _chunk_size(n, m, k, x.element_size(), 2 + int(need_gx or need_gy) + 2 * int(bool(return_noise)))
    grad_x = torch.zeros(n, d, dtype=x.dtype) if need_gx else None
    grad_y = torch.zeros(m, d, dtype=x.dtype) if need_gy else None
    noise_x = torch.empty(n, k, dtype=x.dtype) if return_noise else None
    noise_y = torch.empty(m, k, dtype=x.dtype) if return_noise else None
    total = 0.0
    gxb = gyb = nxb = nyb = None
    for j0 in range(0, k, kc):
        th_c = th[j0:j0 + kc]
        c = th_c.shape[0]
        px = torch.mm(th_c, xd.T)  # (c, N) contiguous, torch BLAS
        pyv = torch.mm(th_c, yd.T)
        if need_gx and (gxb is None or gxb.shape[0] != c):
            gxb = torch.empty(c, n, dtype=x.dtype)
        if need_gy and (gyb is None or gyb.shape[0] != c):
            gyb = torch.empty(c, m, dtype=x.dtype)
        if return_noise and (nxb is None or nxb.shape[0] != c):
            nxb = torch.empty(c, n, dtype=x.dtype)
            nyb = torch.empty(c, m, dtype=x.dtype)
        losses = kern(px.numpy(), pyv.numpy(), int(p), float(noise_std), int(seed), int(j0), 1.0 / k,
                      gxb.numpy() if need_gx else None, gyb.numpy() if need_gy else None,
                      nxb.numpy() if return_noise else None, nyb.numpy() if return_noise else None)
        total += float(losses.sum())
        if need_gx:
            grad_x.addmm_(gxb.T, th_c)
        if need_gy:
            grad_y.addmm_(gyb.T, th_c)
        if return_noise:
            noise_x[:, j0:j0 + c] = nxb.T
            noise_y[:, j0:j0 + c] = nyb.T
    return torch.tensor(total / k, dtype=x.dtype), grad_x, grad_y, noise_x, noise_y


def _cpu_sketch(x, y, projections, p, noise_std, seed, need_gy, return_noise, sketch_bins):
    """The fused C++ sketch release (x private, y generated): ``(loss, dloss/dy or None, noise (k, L) float64 or
    None)``."""
    mod = load_cpp("sliced")
    kern = mod.sketch_chunk_f32 if x.dtype == torch.float32 else mod.sketch_chunk_f64
    m, n, d = x.shape[0], y.shape[0], x.shape[1]
    k = projections.shape[0]
    xd, yd, th = x.detach(), y.detach(), projections.detach()
    kc = _chunk_size(m, n, k, x.element_size(), 2 + int(need_gy))
    grad_y = torch.zeros(n, d, dtype=x.dtype) if need_gy else None
    noise = torch.zeros(k, sketch_bins, dtype=torch.float64) if return_noise else None
    total, gyb = 0.0, None
    for j0 in range(0, k, kc):
        th_c = th[j0:j0 + kc]
        c = th_c.shape[0]
        if need_gy and (gyb is None or gyb.shape[0] != c):
            gyb = torch.empty(c, n, dtype=x.dtype)
        losses = kern(torch.mm(th_c, xd.T).numpy(), torch.mm(th_c, yd.T).numpy(), int(p), int(sketch_bins),
                      float(noise_std), int(seed), int(j0), 1.0 / k, gyb.numpy() if need_gy else None,
                      noise[j0:j0 + c].numpy() if return_noise else None)
        total += float(losses.sum())
        if need_gy:
            grad_y.addmm_(gyb.T, th_c)
    return torch.tensor(total / k, dtype=x.dtype), grad_y, noise


class SlicedWassersteinCPU(GradientInForward):
    """Autograd wrapper of the fused C++ kernel (``cpu`` backend).

    The exact gradient w.r.t. ``x`` and ``y`` (a sub-gradient at tied projected values, the one of the stable
    sort) is computed in the forward pass and saved; backward multiplies it by the upstream gradient.
    Caveats: no gradient flows to ``projections`` (use the ``reference`` backend for that), and double backward is
    not supported (the saved gradient is treated as a constant).
    """

    @staticmethod
    def forward(ctx, x, y, projections, p, noise_std, seed, return_noise):
        loss, grad_x, grad_y, noise_x, noise_y = _cpu_points(x, y, projections, p, noise_std, seed,
                                                             ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                                                             return_noise)
        ctx.save_for_backward(grad_x, grad_y)
        if return_noise:
            ctx.mark_non_differentiable(noise_x, noise_y)
            return loss, noise_x, noise_y
        return loss


class SketchSlicedWassersteinCPU(GradientInForward):
    """Autograd wrapper of the fused C++ kernel of the sketch release (``cpu`` backend, ``sketch_bins`` given).

    Forward arguments (x private (M, d), y generated (N, d), projections, p, noise_std, seed, return_noise,
    sketch_bins). The gradient w.r.t. ``y`` is computed in the forward pass and saved; none flows to the private
    rows (the release is not differentiable w.r.t. them) or to ``projections``; no double backward.
    """

    @staticmethod
    def forward(ctx, x, y, projections, p, noise_std, seed, return_noise, sketch_bins):
        loss, grad_y, noise = _cpu_sketch(x, y, projections, p, noise_std, seed, ctx.needs_input_grad[1],
                                          return_noise, sketch_bins)
        ctx.save_for_backward(None, grad_y)
        if return_noise:
            ctx.mark_non_differentiable(noise)
            return loss, noise
        return loss


def _cpu_available():
    ok, err = cpp_status("sliced")
    if ok:
        return True, None
    return False, (f"{err}; build it with `FASTDPOT_EXT=sliced python setup.py build_ext --inplace` "
                   "or `pip install -e .`")


@_dispatch.register(OP, "cpu", available=_cpu_available)
def _sw_cpu(x, y, projections, p, noise_std, seed, return_noise, *, sketch_bins=None, grads=None):
    if x.device.type != "cpu" or y.device.type != "cpu" or projections.device.type != "cpu":
        raise ValueError(f"backend 'cpu' needs CPU tensors, got x on {x.device}, y on {y.device}")
    if projections.requires_grad and grads is None:
        raise ValueError("backend 'cpu' gives no gradient w.r.t. projections; use backend='reference' "
                         "or pass projections.detach()")
    args = (x.contiguous(), y.contiguous(), projections.contiguous(), p, noise_std, seed, return_noise)
    if grads is not None:  # the custom op's kernel: the gradients as values, no autograd
        if sketch_bins is not None:
            loss, grad_y, _ = _cpu_sketch(*args[:6], grads[1], False, sketch_bins)
            return loss, None, grad_y
        return _cpu_points(*args[:6], grads[0], grads[1], False)[:3]
    if sketch_bins is not None:
        out = SketchSlicedWassersteinCPU.apply(*args, sketch_bins)
        return (out[0], out[1], None) if return_noise else out
    out = SlicedWassersteinCPU.apply(*args)
    return tuple(out) if return_noise else out


_dispatch.set_auto(OP, "cpu", [("cpu", 0)])
register_triton(OP, "dpswd", "sliced_wasserstein_triton")  # kernels/dpswd.py, imported on first use
register_cuda(OP, "dpswd", "sliced_wasserstein_cuda")  # the same with CUB sorts (32-bit indices); preferred on CUDA


# ------------------------------------------------------------------------------------------------------------
# entry point
# ------------------------------------------------------------------------------------------------------------
def check_inputs(x: torch.Tensor, y: torch.Tensor, p: int = 2, num_projections: Optional[int] = None,
                 projections: Optional[torch.Tensor] = None, generator=None,
                 names: Sequence[str] = ("x", "y"), *, orthogonal: bool = False) -> torch.Tensor:
    """The op's argument checks; returns the directions: ``projections`` checked and cast to x's dtype, or, when
    None, ``num_projections`` directions drawn by :func:`fastdpot._random.random_projections` from ``generator``
    (``orthogonal``: blocks of d orthonormal rows; given ``projections`` must then be such blocks).

    ``names`` are the names of x and y in the error messages. Raises ValueError as :func:`sliced_wasserstein_op`.
    The checks are :func:`check_static` (what a compiled graph's guards fix) then :func:`check_values` (what the
    custom op checks when it runs).
    """
    k = check_static(x, y, p, num_projections, projections, names)
    if projections is None:
        check_values(x, y, None, names)
        return random_projections(k, x.shape[1], generator=generator, dtype=x.dtype, device=x.device,
                                  orthogonal=orthogonal)
    check_values(x, y, projections, names, orthogonal=orthogonal)
    return projections.to(x.dtype)


def check_static(x: torch.Tensor, y: torch.Tensor, p: int = 2, num_projections: Optional[int] = None,
                 projections: Optional[torch.Tensor] = None, names: Sequence[str] = ("x", "y")) -> int:
    """The checks of :func:`check_inputs` that read no tensor values (types, shapes, dtypes, devices, p, k): under
    ``torch.compile`` they run while tracing; returns k (``projections``' rows, else ``num_projections``).

    Raises:
        ValueError / TypeError: as :func:`sliced_wasserstein_op`, for what they check.
    """
    xname, yname = names
    check_tensor(x, xname, ndim=2, dtypes=_DTYPES, finite=False)
    check_tensor(y, yname, ndim=2, dtypes=_DTYPES, finite=False)
    if x.dtype != y.dtype:
        raise ValueError(f"{xname} and {yname} must have the same dtype, got {x.dtype} and {y.dtype}")
    if x.device != y.device:
        raise ValueError(f"{xname} and {yname} must be on the same device, got {x.device} and {y.device}")
    d = check_same_dim(x, y, xname, yname)
    check_choice(p, "p", (1, 2))
    if max(x.shape[0], y.shape[0]) >= 2 ** 32:
        raise ValueError(f"N and M must be < 2**32, got {x.shape[0]} and {y.shape[0]}")
    if projections is None:
        if num_projections is None:
            raise ValueError("one of num_projections or projections must be given (num_projections has the alias "
                             "n_projections), got neither")
        return check_num_projections(num_projections, d)
    check_tensor(projections, "projections", ndim=2, dtypes=_DTYPES, finite=False)
    if projections.shape[1] != d:
        raise ValueError(f"projections must have shape (k, d) = (k, {d}): one unit direction per row, got "
                         f"{tuple(projections.shape)} (POT's projections are (d, k) columns: pass their transpose)")
    if num_projections is not None and num_projections != projections.shape[0]:
        raise ValueError(f"num_projections={num_projections!r} disagrees with projections of shape "
                         f"{tuple(projections.shape)}")
    if projections.device != x.device:
        raise ValueError(f"projections must be on {x.device}, got {projections.device}")
    return projections.shape[0]


def check_values(x: torch.Tensor, y: torch.Tensor, projections: Optional[torch.Tensor] = None,
                 names: Sequence[str] = ("x", "y"), *, orthogonal: bool = False) -> None:
    """The checks of :func:`check_inputs` that read tensor values: x and y finite, ``projections`` (when given)
    finite with unit rows, and with ``orthogonal`` blocks of d orthonormal rows. The custom op runs them in its
    kernel, so a compiled call checks them too, when it runs.

    Raises:
        ValueError: a non-finite value (the message names the tensor, not how many: it may be private), rows that
            are not unit vectors or not orthonormal blocks.
    """
    check_finite_tensor(x, names[0])
    check_finite_tensor(y, names[1])
    if projections is not None:
        check_finite_tensor(projections, "projections")
        check_unit_rows(projections, "projections")
        if orthogonal:
            _check_orthogonal_blocks(projections)


def _check_orthogonal_blocks(theta):
    """``directions="orthogonal"`` with given projections: every block of d consecutive rows orthonormal (the
    assumption of :func:`fastdpot.privacy.orthogonal_sliced_sensitivity`)."""
    k, d = theta.shape
    th = theta.detach().to(torch.float64)
    tol = unit_norm_tolerance(theta.dtype, d)
    for j0 in range(0, k, d):
        blk = th[j0:j0 + d]
        gram = blk @ blk.T - torch.eye(blk.shape[0], dtype=torch.float64, device=blk.device)
        worst = float(gram.abs().max())
        if not worst <= tol:
            raise ValueError(f"projections are not blocks of d = {d} orthonormal rows (directions='orthogonal'): "
                             f"rows {j0}..{j0 + blk.shape[0] - 1} have |Θ_b Θ_bᵀ − I| up to {worst:.3g} > {tol:.2g}")


def check_weights(w, n: int, name: str, like: torch.Tensor) -> Optional[torch.Tensor]:
    """Sample weights of one side: None, or an (n,) nonnegative finite tensor of ``like``'s dtype and device with a
    positive sum; returns them divided by their sum, or None when they are uniform and need no gradient (the
    compiled backends then apply)."""
    if w is None:
        return None
    check_tensor(w, name, ndim=1, dtypes=_DTYPES)
    if w.shape[0] != n:
        raise ValueError(f"{name} must have one weight per row, shape ({n},), got {tuple(w.shape)}")
    if w.dtype != like.dtype or w.device != like.device:
        raise ValueError(f"{name} must have the points' dtype and device ({like.dtype}, {like.device}), got "
                         f"{w.dtype}, {w.device}")
    lo, total = float(w.detach().min()), float(w.detach().sum())
    if lo < 0 or not total > 0:
        raise ValueError(f"{name} must be nonnegative weights with a positive sum, got min {lo!r}, sum {total!r}")
    if not w.requires_grad and lo == float(w.detach().max()):
        return None
    return w / w.sum()


def _dispatch_for(n, m, device_type, backend):
    return _dispatch.dispatch(OP, backend, device_type=device_type, size=n + m)


def select_backend(n: int, m: int, device_type: str = "cpu", backend: str = "auto") -> str:
    """The backend :func:`sliced_wasserstein_op` runs for N = ``n`` and M = ``m`` points on ``device_type`` ("cpu",
    "cuda"): the ``auto`` rule of the module doc, or ``backend`` itself when it is available.

    Raises:
        ValueError: unknown backend name.
        BackendUnavailableError: an explicitly requested backend is not available.
    """
    return _dispatch_for(n, m, device_type, backend)[0]


def sliced_wasserstein_op(x: torch.Tensor, y: torch.Tensor, projections: Optional[torch.Tensor] = None, p: int = 2,
                          noise_std: float = 0.0, seed: Optional[int] = 0, return_noise: bool = False,
                          backend: str = "auto", *, num_projections: Optional[int] = None, generator=None,
                          names: Sequence[str] = ("x", "y"), orthogonal: bool = False,
                          a: Optional[torch.Tensor] = None, b: Optional[torch.Tensor] = None,
                          sketch_bins: Optional[int] = None):
    r"""Op ``"sliced_wasserstein"``: Monte-Carlo SW_p^p of x and y along k directions, with optional Gaussian
    noise on every projected value (the DP-SW mechanism of Rakotomamonjy & Ralaivola, ICML 2021) or on the bin sums
    of x's sorted projections (the sketch release), validated, then computed by the chosen backend.

    .. math::
        \frac1k \sum_{j=1}^k W_p^p\Big(\sum_i a_i\,\delta_{\theta_j^\top x_i + v_{ij}},
        \sum_i b_i\,\delta_{\theta_j^\top y_i + v'_{ij}}\Big),\quad v, v' \sim \mathcal N(0, \sigma^2)

    with 1-D W_p^p computed by sorting (a_i = 1/N, b_i = 1/M unless weights are given; N ≠ M: the merged quantile
    levels {i/N} ∪ {j/M}). This is the op without the losses' conventions: no clipping, no privacy randomness
    policy, no aliases; use :func:`fastdpot.sliced.sliced_wasserstein` and :func:`fastdpot.sliced.dp_sliced_wasserstein`.

    Args:
        x: (N, d) float32 / float64 (the private side of the DP uses).
        y: (M, d), same dtype and device as x.
        projections: (k, d) directions with unit-norm rows, or None: ``num_projections`` directions drawn from
            ``generator`` (:func:`fastdpot._random.random_projections`).
        p: 1 or 2.
        noise_std: σ >= 0 of the noise added to every projected value of both sides (0: no noise); with
            ``sketch_bins``, of the noise on every private bin sum.
        seed: key of the noise streams, an integer in [0, 2**63); None: drawn by ``generator.seed()`` after the
            directions (``generator`` a :class:`fastdpot.privacy.randomness.PrivacyRandomness`).
        return_noise: also return the noise added, (N, k) and (M, k) (sketch: (k, L) float64 and None), so the
            reference can replay the run.
        backend: "auto", "reference", "cpu", "triton", "cuda".
        num_projections: k, when ``projections`` is None (must agree with it otherwise; at most
            :data:`fastdpot._validate.MAX_PROJECTION_ENTRIES` / d).
        generator: None, a ``torch.Generator`` or a ``PrivacyRandomness``: the source of the drawn directions.
        names: the names of x and y in error messages.
        orthogonal: draw ⌈k/d⌉ blocks of orthonormal directions (given projections must be such blocks).
        a, b: optional (N,) / (M,) nonnegative sample weights (normalised to sum 1). Non-uniform weights are
            computed by the ``reference`` backend (``auto`` falls back to it; a compiled backend asked for
            explicitly raises), without noise or sketch.
        sketch_bins: L, 1 <= L <= min(N, M): the sketch release's loss
            (:func:`fastdpot.reference.sliced.sketch_sliced_wasserstein`; x is the private side, the gradient flows
            to y only), its noise on the bin sums from the keyed normals of ``seed``
            (:func:`sketch_noise`).

    Shape:
        x (N, d), y (M, d), projections (k, d), a (N,), b (M,) -> 0-d tensor [, noise_x (N, k), noise_y (M, k)].

    Returns:
        the loss, differentiable w.r.t. x and y (not w.r.t. ``projections`` on the compiled backends; w.r.t. y only
        with ``sketch_bins``); with ``return_noise`` a tuple (loss, noise_x, noise_y).

    Raises:
        ValueError: bad shapes / dtypes / non-finite or empty input, a tensor on an unsupported device (meta), N or
            M >= 2**32, p not in {1, 2}, projections not (k, d) with unit rows (tolerance
            :func:`fastdpot._validate.unit_norm_tolerance`), neither ``num_projections`` nor ``projections``, too
            many projections, σ < 0, a bad seed, an unknown backend, bad weights, weights with noise or a sketch or
            a compiled backend, ``sketch_bins`` out of range, a loss that overflows the dtype.
        BackendUnavailableError: an explicitly requested backend is not available.
    """
    theta = check_inputs(x, y, p, num_projections, projections, generator, names, orthogonal=orthogonal)
    noise_std = check_nonnegative(noise_std, "noise_std")
    a = check_weights(a, x.shape[0], "a", x)
    b = check_weights(b, y.shape[0], "b", x)
    if a is not None or b is not None:
        if noise_std > 0 or sketch_bins is not None or return_noise:
            raise ValueError("sample weights a, b are for the plain sliced Wasserstein distance (no noise, no sketch)")
        if backend not in ("auto", "reference"):
            raise ValueError(f"non-uniform sample weights are computed by the reference backend: backend must be "
                             f"'auto' or 'reference', got {backend!r}")
        return _check_overflow(_ref.sliced_wasserstein(x, y, theta, p, a=a, b=b), x.dtype)
    extra = {}
    if sketch_bins is not None:
        extra["sketch_bins"] = check_int(sketch_bins, "sketch_bins", 1)
        if sketch_bins > min(x.shape[0], y.shape[0]):
            raise ValueError(f"sketch_bins must be at most both batch sizes ({names[0]}: {x.shape[0]}, {names[1]}: "
                             f"{y.shape[0]}), got {sketch_bins}")
    if seed is None:
        if generator is None or isinstance(generator, torch.Generator):
            raise ValueError("seed=None draws the noise key from generator, which must then be a PrivacyRandomness, "
                             f"got {generator!r}")
        seed = generator.seed()
    seed = check_seed(seed, "seed")
    _, fn = _dispatch_for(x.shape[0], y.shape[0], x.device.type, backend)
    return _check_overflow(fn(x, y, theta, p, noise_std, seed, bool(return_noise), **extra), x.dtype)


def _check_overflow(loss, dtype):
    """A non-finite loss from finite inputs means the distances overflowed the dtype: say so."""
    value = loss[0] if isinstance(loss, tuple) else loss
    if not bool(torch.isfinite(value.detach()).all()):
        raise ValueError(f"the sliced Wasserstein loss overflows {dtype} (max {torch.finfo(dtype).max:.3g}): the "
                         f"inputs' projected distances raised to the power p are too large for the dtype; rescale "
                         f"the data or use float64")
    return loss
