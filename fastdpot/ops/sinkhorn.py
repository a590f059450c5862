"""Op ``"sinkhorn"``: entropic OT and Sinkhorn divergences, log-domain Sinkhorn on KeOps (large) or dense torch (small).

.. math::
    \\mathrm{OT}_\\varepsilon(\\alpha, \\beta) = \\min_{\\pi \\in \\Pi(\\alpha, \\beta)} \\langle \\pi, C \\rangle
        + \\varepsilon\\, \\mathrm{KL}(\\pi \\,|\\, \\alpha \\otimes \\beta), \\qquad
    S_\\varepsilon(\\alpha, \\beta) = \\mathrm{OT}_\\varepsilon(\\alpha, \\beta)
        - \\tfrac12 \\mathrm{OT}_\\varepsilon(\\alpha, \\alpha) - \\tfrac12 \\mathrm{OT}_\\varepsilon(\\beta, \\beta)

Solver: the symmetric, averaged log-domain Sinkhorn loop with ε-scaling of GeomLoss (ε = blur^p, from the
diameter^p of the data down to blur^p by factors scaling^p; Cao et al., NeurIPS 2021), written here on two engines:

* ``"keops"`` -- pykeops ``LazyTensor`` log-sum-exp reductions: O(N + M) memory, any N, M;
* ``"tensorized"`` (the ``"reference"`` backend of op ``"sinkhorn"``) -- dense (N, M) cost matrices in torch.

``backend="auto"`` takes the dense engine while N·M ≤ 5000² on CUDA (as GeomLoss does) and ≤ 2048² on CPU (where
the two are about even from N = M ≈ 3000 in d = 2, see ``TENSORIZED_MAX_SIZE_CPU``), KeOps above -- except in
dimension d ≥ 32, where dense stays faster up to N·M = 8192² (``HIGH_DIM``).

This module is the op's single home: the validated entry point :func:`sinkhorn` (re-exported as
``fastdpot.sinkhorn.sinkhorn``), the ground costs (:class:`Cost`: a dense form for the ``reference`` row, a KeOps
form for the ``keops`` row), both rows (:mod:`fastdpot._dispatch`), the ``auto`` rules and :func:`select_backend`;
the ``keops`` row's soft-min reductions are built in :mod:`fastdpot.ops._keops_formulas`.
The losses built on it (``SinkhornLoss``, ``semi_debiased_sinkhorn_loss``, ``entropic_wasserstein``) live in
:mod:`fastdpot.sinkhorn`.

References:
    J. Feydy, T. Séjourné, F.-X. Vialard, S. Amari, A. Trouvé, G. Peyré, "Interpolating between Optimal
    Transport and MMD using Sinkhorn Divergences", AISTATS 2019; J. Feydy, PhD thesis (2020), §3.3;
    GeomLoss ``SamplesLoss("sinkhorn")`` (same semantics, used as the test anchor).
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from .._dispatch import dispatch, register, set_auto
from .._validate import (COMPUTE_DTYPES, check_bool, check_choice, check_int, check_nonnegative, check_positive,
                         check_same_dim, check_tensor)
from ..reference.sinkhorn import epsilon_schedule, sinkhorn_loop, sinkhorn_tensorized, sqdist_dense
from ._keops_formulas import keops_softmin

__all__ = ["sinkhorn", "select_backend", "Cost", "squared_euclidean", "euclidean", "l1", "squared_euclidean_l1",
           "custom_cost", "TENSORIZED_MAX_SIZE", "TENSORIZED_MAX_SIZE_CPU", "HIGH_DIM", "TENSORIZED_MAX_SIZE_HIGH_DIM",
           "SINKHORN_BACKENDS"]

#: largest N·M handled by the dense engine under ``backend="auto"`` on CUDA (GeomLoss' rule) ...
TENSORIZED_MAX_SIZE = 5000 * 5000
#: ... and on CPU, below which the dense engine (no subnormal exp, see ``softmin_dense``) beats KeOps. Measured
#: forward+backward, float32, 2 threads, interleaved on a shared machine, dense vs KeOps: d = 2, N = M = 1000:
#: 0.30 s vs 0.51 s; 2000: 2.4 s vs 3.8 s; 3000: 7.7 s vs 8.1 s; d = 8, N = M = 2000: 2.2 s vs 4.5 s.
TENSORIZED_MAX_SIZE_CPU = 2048 * 2048
#: in high dimension (d ≥ HIGH_DIM) the dense engine builds each cost matrix once by matmul while KeOps re-evaluates
#: the d-dimensional cost in every reduction: dense stays the auto choice up to this N·M (4 float32 matrices of
#: 8192² = 1 GB, plus one work buffer). Measured forward+backward, 2 threads (shared machine): d = 32,
#: N = M = 1500: dense 0.64 s vs KeOps 5.1 s.
HIGH_DIM = 32
TENSORIZED_MAX_SIZE_HIGH_DIM = 8192 * 8192

_KEOPS_TINY = 1e-20  # added under square roots in KeOps formulas so that the gradient at distance 0 is 0, not NaN


# ----------------------------------------------------------------------------------------------------------- costs
class Cost:
    """A ground cost C(x, y) with a dense and (optionally) a KeOps form.

    Args:
        name: label used in error messages and ``repr``.
        dense: ``dense(u, v) -> (len(u), len(v))`` cost matrix (torch, differentiable).
        keops: ``keops(u_i, v_j) -> LazyTensor`` symbolic cost on pykeops LazyTensors of shapes (N, 1, d) and
            (1, M, d); ``None`` means the cost has no KeOps form (``backend="keops"`` then raises).
        start: ``start(diameter, d) -> float``, an upper bound of the cost over a box of that diameter: the
            first ε of the ε-scaling schedule. Default ``diameter**p`` (GeomLoss).
    """

    def __init__(self, name: str, dense: Callable, keops: Optional[Callable] = None,
                 start: Optional[Callable[[float, int], float]] = None, sqdist_coef: Optional[float] = None):
        self.name = name
        self.dense = dense
        self.keops = keops
        self.start = start
        # C = sqdist_coef·‖x − y‖²: the KeOps engine then pre-scales the points by sqrt(c/ε) (no multiply per pair)
        # and takes the gradient in the forward reduction (_SqDistSoftminKeOps)
        self.sqdist_coef = sqdist_coef

    def __repr__(self):
        return f"Cost({self.name!r})"


def _euclid_dense(u, v):
    return torch.cdist(u, v, p=2.0, compute_mode="donot_use_mm_for_euclid_dist")


def squared_euclidean(half: bool = True) -> Cost:
    """C(x, y) = ½‖x − y‖² (``half=True``, GeomLoss' p = 2 cost) or ‖x − y‖² (``half=False``).

    Raises:
        ValueError: ``half`` not a bool.
    """
    c = 0.5 if check_bool(half, "half") else 1.0
    return Cost("squared_euclidean" + ("/2" if half else ""),
                dense=lambda u, v: c * sqdist_dense(u, v),
                keops=lambda ui, vj: c * ((ui - vj) ** 2).sum(-1),
                start=lambda D, d: D * D, sqdist_coef=c)


def euclidean() -> Cost:
    """C(x, y) = ‖x − y‖₂ (GeomLoss' p = 1 cost). The gradient at distance 0 is taken as 0."""
    return Cost("euclidean", dense=_euclid_dense,
                keops=lambda ui, vj: (((ui - vj) ** 2).sum(-1) + _KEOPS_TINY).sqrt(),
                start=lambda D, d: D)


def l1() -> Cost:
    """C(x, y) = ‖x − y‖₁ (the Laplace local mechanism's matching cost, Reshetova, Chen & Özgür)."""
    return Cost("l1", dense=lambda u, v: torch.cdist(u, v, p=1.0),
                keops=lambda ui, vj: (ui - vj).abs().sum(-1),
                start=lambda D, d: math.sqrt(d) * D)


def squared_euclidean_l1(m: float) -> Cost:
    """C(x, y) = ‖x − y‖₂² + m‖x − y‖₁ (DP-Sinkhorn's image cost; m = 1 MNIST, 3 Fashion-MNIST; Cao et al., NeurIPS 2021)."""
    m = check_nonnegative(m, "m")
    return Cost(f"squared_euclidean+{m:g}*l1",
                dense=lambda u, v: sqdist_dense(u, v) + m * torch.cdist(u, v, p=1.0),
                keops=lambda ui, vj: ((ui - vj) ** 2).sum(-1) + m * (ui - vj).abs().sum(-1),
                start=lambda D, d: D * D + m * math.sqrt(d) * D)


def custom_cost(dense: Callable, keops: Optional[Callable] = None, name: str = "custom",
                start: Optional[Callable[[float, int], float]] = None) -> Cost:
    """A user cost: ``dense(u, v)`` torch (N, M) matrix and optionally a KeOps formula ``keops(u_i, v_j)``.

    Both must describe the same function (the dense one is used below ``TENSORIZED_MAX_SIZE``); ``start`` bounds
    the cost for the ε-scaling start (default diameter^p).
    """
    if not callable(dense):
        raise ValueError(f"dense must be callable, got {dense!r}")
    if keops is not None and not callable(keops):
        raise ValueError(f"keops must be callable or None, got {keops!r}")
    return Cost(name, dense, keops, start)

_P_DEFAULT = {1: euclidean, 2: squared_euclidean}


# -------------------------------------------------------------------------------------------------------- engines
def _keops_available():
    from .._ext import import_pykeops

    try:
        import_pykeops()  # first import without KeOps' CUDA notice on CPU machines
        import pykeops.torch  # noqa: F401
    except Exception as exc:  # an import failure of an optional backend becomes its error message
        return False, f"pykeops could not be imported ({type(exc).__name__}: {exc}); pip install pykeops"
    return True, None


@register("sinkhorn", "reference")
def _sinkhorn_tensorized(x, y, a_log, b_log, cost: Cost, eps_list, debias, final_iters, rho=None):
    return sinkhorn_tensorized(x, y, a_log, b_log, cost.dense, eps_list, debias, final_iters, rho)


@register("sinkhorn", "keops", available=_keops_available)
def _sinkhorn_keops(x, y, a_log, b_log, cost: Cost, eps_list, debias, final_iters, rho=None):
    if cost.keops is None:
        from .._ext import BackendUnavailableError

        raise BackendUnavailableError(f"cost {cost.name!r} has no KeOps formula; pass keops= to custom_cost or "
                                      "use backend='tensorized'")
    return sinkhorn_loop(keops_softmin(cost, {"x": x, "y": y}), a_log, b_log, eps_list, debias, final_iters, rho)


set_auto("sinkhorn", "cpu", [("keops", TENSORIZED_MAX_SIZE_CPU + 1)])
set_auto("sinkhorn", "cuda", [("keops", TENSORIZED_MAX_SIZE + 1)])


# ------------------------------------------------------------------------------------------------------ public API
#: backend names of :func:`sinkhorn`: "online" is GeomLoss' name of the KeOps engine, "reference" a synonym of
#: "tensorized"; GeomLoss' "multiscale" (octree clustering) is not implemented and refused by name
SINKHORN_BACKENDS = ("auto", "keops", "online", "tensorized", "reference")


def _check_backend(backend):
    if backend == "multiscale":
        raise ValueError("backend='multiscale' (GeomLoss' clustered solver) is not implemented in fastdpot; use "
                         "'online' (= 'keops': O(N + M) memory, any size), 'tensorized' or 'auto'")
    return check_choice(backend, "backend", SINKHORN_BACKENDS)


def select_backend(n: int, m: int, d: int, device_type: str = "cpu", backend: str = "auto",
                   cost: Optional[Cost] = None) -> str:
    """The dispatch-table backend (``"keops"`` or ``"reference"`` = tensorized) that :func:`sinkhorn` uses for
    an (n, d) vs (m, d) problem: the size rule of the module doc; a cost without a KeOps formula stays dense.
    ``"online"`` is GeomLoss' name of ``"keops"``."""
    _check_backend(backend)
    if backend != "auto":
        return {"tensorized": "reference", "online": "keops"}.get(backend, backend)
    if cost is not None and cost.keops is None:
        return "reference"
    size = n * m
    if d >= HIGH_DIM and size <= TENSORIZED_MAX_SIZE_HIGH_DIM:
        size = 0  # dense is faster in high dimension while the matrices fit (see HIGH_DIM)
    return dispatch("sinkhorn", "auto", device_type=device_type, size=size)[0]


def _weights(w, n, name, like):
    if w is None:
        return torch.full((n,), 1.0 / n, dtype=like.dtype, device=like.device)
    check_tensor(w, name, ndim=1)
    if w.device != like.device:
        raise ValueError(f"{name} must be on {like.device}, got {w.device}")
    if w.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},) to match the points, got {tuple(w.shape)}")
    wd = w.detach()
    if bool((wd < 0).any()):
        raise ValueError(f"{name} must be nonnegative, got minimum {float(wd.min())!r}")
    if not float(wd.sum()) > 0:
        raise ValueError(f"{name} must have a positive total mass, got {float(wd.sum())!r}")
    return w.to(like.dtype)


def _diameter(x, y):
    lo = torch.minimum(x.detach().min(0).values, y.detach().min(0).values)
    hi = torch.maximum(x.detach().max(0).values, y.detach().max(0).values)
    return float((hi - lo).norm())


def sinkhorn(x: torch.Tensor, y: torch.Tensor, a: Optional[torch.Tensor] = None, b: Optional[torch.Tensor] = None,
             p: int = 2, blur: float = 0.05, scaling: float = 0.5, cost: Optional[Cost] = None, debias: bool = True,
             backend: str = "auto", diameter: Optional[float] = None, final_iters: int = 0,
             return_potentials: bool = False, reach: Optional[float] = None):
    """Entropic OT_ε (``debias=False``) or the Sinkhorn divergence S_ε (``debias=True``) between point clouds.

    .. math::
        \\mathrm{OT}_\\varepsilon(\\alpha,\\beta) = \\langle \\alpha, f \\rangle + \\langle \\beta, g \\rangle,
        \\quad \\varepsilon = \\text{blur}^p

    with (f, g) the dual potentials of the symmetric log-domain Sinkhorn loop with ε-scaling (GeomLoss semantics:
    the schedule runs from diameter^p down to blur^p by factors scaling^p, then one extrapolation step).

    Default cost (``cost=None``), as in GeomLoss: **½‖x − y‖²** for p = 2 (note the ½) and ‖x − y‖ for p = 1.
    Other costs: :func:`squared_euclidean` (``half=False`` for ‖x − y‖²), :func:`euclidean`, :func:`l1`,
    :func:`squared_euclidean_l1`, :func:`custom_cost` (own KeOps formula); class conditioning by
    :func:`class_conditional` on both inputs.

    Autograd: gradients flow through the last Sinkhorn update only, taken at the (detached) converged potentials
    -- the envelope theorem: for x the result is Σ_j π_ij ∇_x C(x_i, y_j), for the weights a the potential f
    (minus the OT_ε(α, α) potential when debiased). It is exact at convergence of the loop, not a derivative
    of the finite loop; second derivatives are not meaningful.

    Unbalanced OT (``reach`` given, GeomLoss semantics): the marginal constraints are replaced by the penalty
    ρ·KL(π₁ | α) + ρ·KL(π₂ | β) with ρ = reach^p; every soft-min update is damped by 1/(1 + ε/ρ), and the value is
    Séjourné et al.'s dual formula, ⟨α, (ρ + ε/2)(1 − e^{−f/ρ})⟩ + ⟨β, (ρ + ε/2)(1 − e^{−g/ρ})⟩ (debiased:
    ⟨α, (ρ + ε/2)(e^{−f_aa/ρ} − e^{−f/ρ})⟩ + ⟨β, (ρ + ε/2)(e^{−g_bb/ρ} − e^{−g/ρ})⟩), exactly what GeomLoss'
    ``SamplesLoss("sinkhorn", reach=...)`` returns (gradient included). Weights need not have equal mass.

    Batches (GeomLoss' (B, N, d) convention): x (B, N, d), y (B, M, d), a (B, N), b (B, M) give a (B,) vector,
    one independent problem per batch element, all with the ε-schedule of the common diameter of the batch.

    Args:
        x: (N, d) points of α (or (B, N, d)). y: (M, d) points of β (or (B, M, d)).
        a: (N,) nonnegative weights (default uniform 1/N). b: (M,) weights (default 1/M); a and b must have the
            same total mass (balanced OT) unless ``reach`` is given.
        p: exponent of the default cost and of ε = blur^p (1 or 2).
        blur: target length scale (> 0), in the unit of x; ε = blur^p.
        scaling: ratio between successive blurs in (0, 1); closer to 1 = more iterations, more accurate.
        cost: a :class:`Cost`, or None for the default cost of p.
        debias: return S_ε instead of OT_ε.
        backend: "auto", "keops" (GeomLoss' name "online" is a synonym) or "tensorized" ("reference" is a
            synonym); GeomLoss' "multiscale" is refused with a ValueError.
        diameter: upper bound of the distances (default: the diagonal of the bounding box of x and y).
        final_iters: extra symmetric iterations at ε = blur^p before the final step (0 = GeomLoss' loop).
        return_potentials: also return the potentials (f, g), shapes (N,), (M,) (debiased ones if debias).
        reach: None (balanced OT) or the length scale > 0 of unbalanced OT, ρ = reach^p (GeomLoss' ``reach``).

    Returns:
        0-dim tensor (or ``(value, f, g)``); (B,) for batched inputs.

    Raises:
        ValueError: bad shapes, non-finite values, a dtype other than float32/float64 (float16 and bfloat16 are
            refused, as by every fastdpot op), a tensor on an unsupported device (meta), negative or
            (balanced) unequal-mass weights, p not in {1, 2}, blur <= 0, reach <= 0, scaling outside (0, 1),
            ``debias`` or ``return_potentials`` not a bool,
            unknown backend name or "multiscale", data whose cost over their diameter overflows the dtype (e.g.
            float32 points of size 1e30), ``return_potentials`` with batched inputs.
        BackendUnavailableError: backend="keops" without pykeops or with a cost that has no KeOps formula.

    References:
        Feydy et al., AISTATS 2019 (Sinkhorn divergences); Feydy, PhD thesis §3.3 (Eq. 3.186, 3.207-3.209);
        Cao et al., NeurIPS 2021 (DP-Sinkhorn).
    """
    check_bool(debias, "debias")
    check_bool(return_potentials, "return_potentials")
    if isinstance(x, torch.Tensor) and x.dim() == 3:
        return _sinkhorn_batched(x, y, a, b, p=p, blur=blur, scaling=scaling, cost=cost, debias=debias,
                                 backend=backend, diameter=diameter, final_iters=final_iters,
                                 return_potentials=return_potentials, reach=reach)
    check_tensor(x, "x", ndim=2, dtypes=COMPUTE_DTYPES)  # float32/float64 (docs/api.md, "Dtypes")
    check_tensor(y, "y", ndim=2, dtypes=COMPUTE_DTYPES)
    d = check_same_dim(x, y, "x", "y")
    if x.device != y.device:
        raise ValueError(f"x and y must be on the same device, got {x.device} and {y.device}")
    check_choice(p, "p", (1, 2))
    blur = check_positive(blur, "blur")
    rho = None if reach is None else check_positive(reach, "reach") ** p
    scaling = float(scaling) if isinstance(scaling, (int, float)) and not isinstance(scaling, bool) else scaling
    if not isinstance(scaling, float) or not 0.0 < scaling < 1.0:
        raise ValueError(f"scaling must be in (0, 1), got {scaling!r}")
    _check_backend(backend)
    final_iters = check_int(final_iters, "final_iters", minimum=0)
    if cost is None:
        cost = _P_DEFAULT[p]()
    elif not isinstance(cost, Cost):
        raise ValueError(f"cost must be a fastdpot.sinkhorn.Cost or None, got {type(cost).__name__}")
    if x.dtype != y.dtype:
        raise ValueError(f"x and y must have the same dtype, got {x.dtype} and {y.dtype}")
    N, M = x.shape[0], y.shape[0]
    a = _weights(a, N, "a", x)
    b = _weights(b, M, "b", x)
    ma, mb = float(a.detach().sum()), float(b.detach().sum())
    if rho is None and abs(ma - mb) > 1e-5 * max(ma, mb):
        raise ValueError(f"a and b must have the same total mass (balanced OT), got {ma!r} and {mb!r}; pass "
                         f"reach= for unbalanced OT")

    if diameter is None:
        diameter = _diameter(x, y)
    else:
        diameter = check_positive(diameter, "diameter")
    start = cost.start(diameter, d) if cost.start is not None else diameter ** p
    big = torch.finfo(x.dtype).max
    if not (math.isfinite(diameter) and math.isfinite(start) and start < big):
        raise ValueError(f"the points of x and y span a diameter of {diameter:.3g}, whose cost ({cost.name}: "
                         f"{start:.3g}) overflows {x.dtype} (max {big:.3g}); rescale the data or use float64")
    start = max(start, blur ** p)  # identical or tiny inputs: the schedule is just [blur^p, blur^p]
    eps_list = epsilon_schedule(p, start, blur, scaling)

    _, impl = dispatch("sinkhorn", select_backend(N, M, d, x.device.type, backend, cost))
    a_log, b_log = a.log(), b.log()
    extra = {} if rho is None else dict(rho=rho)
    f_ba, g_ab, f_aa, g_bb = impl(x, y, a_log, b_log, cost, eps_list, debias, final_iters, **extra)
    if debias:
        f, g = f_ba - f_aa, g_ab - g_bb
    else:
        f, g = f_ba, g_ab
    if rho is None:
        value = (a * f).sum() + (b * g).sum()
    else:  # Séjourné et al., Proposition 12; GeomLoss' UnbalancedWeight scales by ρ + ε/2
        w = rho + eps_list[-1] / 2.0
        if debias:
            value = ((a * w * ((-f_aa / rho).exp() - (-f_ba / rho).exp())).sum()
                     + (b * w * ((-g_bb / rho).exp() - (-g_ab / rho).exp())).sum())
        else:
            value = (a * w * (1 - (-f_ba / rho).exp())).sum() + (b * w * (1 - (-g_ab / rho).exp())).sum()
    if return_potentials:
        return value, f, g
    return value


def _sinkhorn_batched(x, y, a, b, *, diameter, return_potentials, **kw):
    """GeomLoss' batched convention: x (B, N, d), y (B, M, d), a (B, N), b (B, M) -> (B,), one problem per batch
    element, all on the ε-schedule of the common diameter (as GeomLoss computes it over the whole batch)."""
    check_tensor(x, "x", ndim=3, dtypes=COMPUTE_DTYPES)
    check_tensor(y, "y", ndim=3, dtypes=COMPUTE_DTYPES)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y must have the same batch size B, got shapes {tuple(x.shape)} and "
                         f"{tuple(y.shape)}")
    check_same_dim(x, y, "x", "y")
    for w, name, n in ((a, "a", x.shape[1]), (b, "b", y.shape[1])):
        if w is not None:
            check_tensor(w, name, ndim=2)
            if tuple(w.shape) != (x.shape[0], n):
                raise ValueError(f"{name} must have shape ({x.shape[0]}, {n}) for batched points, got "
                                 f"{tuple(w.shape)}")
    if return_potentials:
        raise ValueError("return_potentials is not supported for batched (B, N, d) inputs; loop over the batch")
    if diameter is None:
        diameter = _diameter(x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1]))
        diameter = diameter if diameter > 0 else None
    return torch.stack([sinkhorn(x[i], y[i], None if a is None else a[i], None if b is None else b[i],
                                 diameter=diameter, **kw) for i in range(x.shape[0])])
