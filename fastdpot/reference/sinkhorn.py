"""Dense (tensorized) log-domain Sinkhorn in pure torch: the reference of :mod:`fastdpot.sinkhorn`.

Everything here works on full (N, M) cost matrices, so memory is O(N·M); it is the ``"reference"`` backend of
op ``"sinkhorn"`` (called ``backend="tensorized"`` in the public API, as in GeomLoss) and the baseline that the
KeOps backend is tested against. The ε-scaling loop :func:`sinkhorn_loop` is written once, over an abstract
soft-min, and shared by both backends; the dense soft-min and cost matrices, and an independent fixed-ε solver
(:func:`sinkhorn_fixed_epsilon`, plain alternating updates run to convergence), live here.

Notation (Cao et al., NeurIPS 2021): measures α = Σ_i a_i δ_{x_i}, β = Σ_j b_j δ_{y_j}; cost C(x, y); temperature ε;
OT_ε(α, β) = min_π ⟨π, C⟩ + ε KL(π | α⊗β) = ⟨α, f⟩ + ⟨β, g⟩ at the optimal dual potentials (f, g).

References:
    J. Feydy et al., "Interpolating between Optimal Transport and MMD using Sinkhorn Divergences", AISTATS 2019;
    J. Feydy, PhD thesis (2020), §3.3 (symmetric log-domain Sinkhorn with ε-scaling, Eq. 3.186, 3.207-3.209).
"""
from __future__ import annotations

import math
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch

__all__ = ["sqdist_dense", "softmin_dense", "DenseSoftmin", "epsilon_schedule", "dampening", "sinkhorn_loop",
           "sinkhorn_tensorized", "sinkhorn_fixed_epsilon", "entropic_ot_gaussians"]

Softmin = Callable[[float, str, torch.Tensor, bool, Optional[torch.Tensor]], torch.Tensor]


def sqdist_dense(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """‖x_i − y_j‖² as an (N, M) matrix, by the expansion ‖x‖² + ‖y‖² − 2 x·y (clamped at 0).

    The expansion costs one matmul instead of an (N, M, d) difference tensor; its float32 round-off near zero
    distance is ~ 1e-7·‖x‖², which is why the result is clamped at 0.
    """
    d2 = (x * x).sum(-1)[:, None] + (y * y).sum(-1)[None, :] - 2.0 * (x @ y.T)
    return d2.clamp_min(0.0)


def _exp_floor(dtype: torch.dtype) -> float:
    """log of the smallest normal number of ``dtype``, plus 1: exponents below it are clamped there.

    exp of a number below log(tiny) is subnormal (or underflows), and subnormal arithmetic is ~100x slower on x86
    CPUs; after the max-shift of a log-sum-exp every row holds a term exp(0) = 1, so clamping the others at
    exp(floor) ≈ 2.7·tiny changes a row sum by at most M·2.7·tiny (relative 1e-34 in float32, 1e-304 in
    float64): far below one rounding error, the result is the same number.
    """
    return math.log(torch.finfo(dtype).tiny) + 1.0


def softmin_dense(eps: float, C: torch.Tensor, h: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Soft-C-transform f_i = −ε log Σ_j exp(h_j − C_ij / ε) for an (N, M) cost matrix C and (M,) vector h.

    Max-shifted log-sum-exp done in place in one (N, M) work buffer (``out``, allocated when None), with the
    shifted exponents clamped at :func:`_exp_floor` (no subnormal arithmetic; same value to far below one
    rounding error). Not differentiable (use :class:`DenseSoftmin`); a row whose max is ±inf gives −ε·max,
    as :func:`torch.logsumexp`.
    """
    with torch.no_grad():
        return _lse_dense(eps, C, h, out).mul_(-eps)


def _lse_dense(eps, C, h, out):
    """LSE_j(h_j − C_ij/ε) (N,), in place in ``out`` (see :func:`softmin_dense`)."""
    W = torch.div(C, -eps) if out is None else torch.div(C, -eps, out=out)
    W.add_(h[None, :])
    m = W.amax(1)
    finite = torch.isfinite(m)
    shift = torch.where(finite, m, torch.zeros_like(m))
    W.sub_(shift[:, None]).clamp_(min=_exp_floor(W.dtype)).exp_()
    return torch.where(finite, W.sum(1).log_().add_(shift), m)


class DenseSoftmin(torch.autograd.Function):
    """Differentiable :func:`softmin_dense`: ``DenseSoftmin.apply(C, h, eps)``, C (N, M), h (M,) -> f (N,).

    ∂f_i/∂C_ij = P_ij and ∂f_i/∂h_j = −ε P_ij with P = softmax_j(h_j − C_ij/ε) the row-stochastic plan; backward
    recomputes P from (C, h, LSE) in one clamped exp pass (entries below exp(floor) set to 0) instead of keeping it,
    so the forward holds no (N, M) buffer. First derivatives only.
    """

    @staticmethod
    def forward(ctx, C, h, eps):
        lse = _lse_dense(eps, C, h, None)
        ctx.save_for_backward(C, h, lse)
        ctx.eps = eps
        return lse * -eps

    @staticmethod
    def backward(ctx, grad_f):
        C, h, lse = ctx.saved_tensors
        eps = ctx.eps
        P = torch.div(C, -eps)
        P.add_(h[None, :]).sub_(lse[:, None])  # the same rounding as torch.logsumexp's backward
        floor = _exp_floor(P.dtype)
        small = P < floor
        P.clamp_(min=floor).exp_().masked_fill_(small, 0.0)
        grad_C = P.mul_(grad_f[:, None]) if ctx.needs_input_grad[0] else None
        grad_h = None
        if ctx.needs_input_grad[1]:
            grad_h = -eps * (grad_C.sum(0) if grad_C is not None else (P * grad_f[:, None]).sum(0))
        return grad_C, grad_h, None


def epsilon_schedule(p: float, start: float, blur: float, scaling: float) -> List[float]:
    """The ε-scaling schedule: ``start`` (an upper bound of the cost, e.g. diameter^p) then
    exp(p·log(diameter) − k·p·log(1/scaling)) for k = 0, 1, ... while above blur^p, then blur^p.

    Same list as GeomLoss' ``epsilon_schedule`` when ``start = diameter^p`` (Feydy's thesis, §3.3.3).
    """
    steps = np.arange(math.log(start), p * math.log(blur), p * math.log(scaling))
    eps = [start] + [math.exp(float(e)) for e in steps]
    eps.append(blur ** p)
    return eps


def dampening(eps: float, rho: Optional[float]) -> float:
    """Damping factor of the soft-min updates for unbalanced OT with a ρ·KL penalty on the marginals:
    1/(1 + ε/ρ), 1 for balanced OT (ρ = None = ∞) (Séjourné et al., "Sinkhorn divergences for unbalanced optimal
    transport", Table 1; GeomLoss' ``dampening``)."""
    return 1.0 if rho is None else 1.0 / (1.0 + eps / rho)


def sinkhorn_loop(softmin: Softmin, a_log: torch.Tensor, b_log: torch.Tensor, eps_list: List[float],
                  debias: bool, final_iters: int = 0, rho: Optional[float] = None
                  ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Symmetric log-domain Sinkhorn with ε-scaling, then one differentiable extrapolation step.

    ``softmin(eps, pair, h, grad, prev)`` must return −ε log Σ_j exp(h_j − C(u_i, v_j)/ε) for ``pair`` in
    ``"xy"`` (u = x, v = y; output (N,)), ``"yx"``, ``"xx"``, ``"yy"``. With ``grad=True`` the cost must be
    differentiable in the *first* point set only (u), the second detached: then ⟨a, f⟩ + ⟨b, g⟩ has the
    envelope-theorem gradient of OT_ε (each side's gradient flows through its own potential exactly once).
    ``prev`` is the current iterate of the potential being updated (None for the first four calls): a hint of
    the result (an engine may use it to skip work, never to change the value).

    All iterations but the last run without autograd; the last update (at ε = blur^p) is taken with the
    potentials of the previous iterate *detached*, so backpropagation goes through that single step.

    Unbalanced OT (``rho`` = reach^p, the strength of the KL penalty on the marginals): every soft-min update is
    multiplied by :func:`dampening` (ε, ρ), as in GeomLoss; ``rho=None`` is balanced OT (factor 1).

    Returns (f_ba, g_ab, f_aa, g_bb); the last two are None without ``debias``.
    """
    if rho is None:
        sm = softmin
    else:
        def sm(eps, pair, h, grad, prev):
            return dampening(eps, rho) * softmin(eps, pair, h, grad, prev)
    with torch.no_grad():
        eps = eps_list[0]
        g_ab = sm(eps, "yx", a_log, False, None)
        f_ba = sm(eps, "xy", b_log, False, None)
        f_aa = sm(eps, "xx", a_log, False, None) if debias else None
        g_bb = sm(eps, "yy", b_log, False, None) if debias else None
        schedule = list(eps_list) + [eps_list[-1]] * int(final_iters)
        for eps in schedule:
            ft_ba = sm(eps, "xy", b_log + g_ab / eps, False, f_ba)
            gt_ab = sm(eps, "yx", a_log + f_ba / eps, False, g_ab)
            f_ba, g_ab = 0.5 * (f_ba + ft_ba), 0.5 * (g_ab + gt_ab)
            if debias:
                ft_aa = sm(eps, "xx", a_log + f_aa / eps, False, f_aa)
                gt_bb = sm(eps, "yy", b_log + g_bb / eps, False, g_bb)
                f_aa, g_bb = 0.5 * (f_aa + ft_aa), 0.5 * (g_bb + gt_bb)
    eps = eps_list[-1]
    f_ba, g_ab = f_ba.detach(), g_ab.detach()
    f_new = sm(eps, "xy", b_log.detach() + g_ab / eps, True, f_ba)
    g_new = sm(eps, "yx", a_log.detach() + f_ba / eps, True, g_ab)
    if debias:
        f_aa, g_bb = f_aa.detach(), g_bb.detach()
        f_aa = sm(eps, "xx", a_log.detach() + f_aa / eps, True, f_aa)
        g_bb = sm(eps, "yy", b_log.detach() + g_bb / eps, True, g_bb)
    return f_new, g_new, f_aa, g_bb


def sinkhorn_tensorized(x: torch.Tensor, y: torch.Tensor, a_log: torch.Tensor, b_log: torch.Tensor,
                        cost_dense: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], eps_list: List[float],
                        debias: bool, final_iters: int = 0, rho: Optional[float] = None):
    """Dense backend: build the (N, M) cost matrices once and run :func:`sinkhorn_loop` on them.

    ``cost_dense(u, v)`` returns the (len(u), len(v)) cost matrix. As in GeomLoss, each matrix is built with its
    second argument detached (C_xy = C(x, y.detach()), C_yx = C(y, x.detach()), ...). The no-grad iterations
    share one work buffer of max(N·M, N², M²) entries (:func:`softmin_dense` in place); the last step is
    :class:`DenseSoftmin` on the matrices that carry a graph.

    Returns (f_ba, g_ab, f_aa, g_bb) as :func:`sinkhorn_loop`.
    """
    mats = {"xy": cost_dense(x, y.detach()), "yx": cost_dense(y, x.detach())}
    if debias:
        mats["xx"] = cost_dense(x, x.detach())
        mats["yy"] = cost_dense(y, y.detach())
    work = torch.empty(max(C.numel() for C in mats.values()), dtype=mats["xy"].dtype, device=mats["xy"].device)

    def softmin(eps, pair, h, grad, prev):
        C = mats[pair]
        if grad and C.requires_grad and torch.is_grad_enabled():
            return DenseSoftmin.apply(C, h, eps)
        return softmin_dense(eps, C.detach(), h, out=work[:C.numel()].view(C.shape))

    return sinkhorn_loop(softmin, a_log, b_log, eps_list, debias, final_iters, rho)


def sinkhorn_fixed_epsilon(C: torch.Tensor, a: torch.Tensor, b: torch.Tensor, eps: float, iters: int = 2000,
                           tol: float = 1e-12) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain alternating log-domain Sinkhorn at a fixed ε, no ε-scaling, no averaging (an independent check).

    f ← −ε log Σ_j b_j exp((g_j − C_ij)/ε), g ← −ε log Σ_i a_i exp((f_i − C_ij)/ε), until the change of f is
    below ``tol`` (sup norm) or ``iters`` updates. Returns (OT_ε = ⟨a, f⟩ + ⟨b, g⟩, f, g). Not differentiable
    (runs under no_grad).
    """
    with torch.no_grad():
        a_log, b_log = a.log(), b.log()
        f = torch.zeros_like(a)
        g = torch.zeros_like(b)
        for _ in range(iters):
            f_old = f
            f = softmin_dense(eps, C, b_log + g / eps)
            g = softmin_dense(eps, C.T, a_log + f / eps)
            if float((f - f_old).abs().max()) < tol:
                break
        return (a * f).sum() + (b * g).sum(), f, g


def entropic_ot_gaussians(mean_a: torch.Tensor, cov_a: torch.Tensor, mean_b: torch.Tensor, cov_b: torch.Tensor,
                          eps: float) -> torch.Tensor:
    """Closed form of OT_ε(N(m_a, A), N(m_b, B)) for the cost ‖x − y‖² (no ½) and ε·KL(π | α⊗β).

    With σ² = ε/2 and D = (4 A^{1/2} B A^{1/2} + σ⁴ I)^{1/2} (Janati et al. 2020, Thm. 1 / Mallasto et al. 2021):

        OT_ε = ‖m_a − m_b‖² + tr A + tr B − tr D + d σ² (1 − log 2σ²) + σ² log det(D + σ² I).

    Shape: means (d,), covariances (d, d), symmetric positive definite.

    References:
        H. Janati, B. Muzellec, G. Peyré, M. Cuturi, "Entropic Optimal Transport between Unbalanced Gaussian
        Measures has a Closed Form", NeurIPS 2020, Theorem 1 (balanced case).
    """
    d = mean_a.shape[0]
    s2 = eps / 2.0

    def sqrtm(S):
        w, V = torch.linalg.eigh(S)
        return (V * w.clamp_min(0).sqrt()) @ V.T

    A_half = sqrtm(cov_a)
    eye = torch.eye(d, dtype=cov_a.dtype)
    D = sqrtm(4.0 * A_half @ cov_b @ A_half + s2 ** 2 * eye)
    return (((mean_a - mean_b) ** 2).sum() + torch.trace(cov_a) + torch.trace(cov_b) - torch.trace(D)
            + d * s2 * (1.0 - math.log(2.0 * s2)) + s2 * torch.logdet(D + s2 * eye))
