"""The KeOps formula builders of op ``"sinkhorn"``: the soft-min reductions of the log-domain Sinkhorn loop on pykeops
``LazyTensor`` s, for the ``"keops"`` row registered in :mod:`fastdpot.ops.sinkhorn`.

:func:`keops_softmin` builds the soft-min ``f_i = −ε log Σ_j exp(h_j − C(u_i, v_j)/ε)`` that
:func:`fastdpot.reference.sinkhorn.sinkhorn_loop` calls: for the squared-Euclidean costs a floored float64 Sum
reduction that also returns the gradient (:func:`_sqdist_lse_keops`, :class:`_SqDistSoftminKeOps`), for any other
cost with a KeOps form its formula ``cost.keops`` in KeOps' log-sum-exp. pykeops is imported on first use.

References:
    B. Charlier, J. Feydy, J. Glaunès, F.-D. Collin, G. Durif, "Kernel Operations on the GPU, with Autodiff,
    without Memory Overflows", JMLR 2021 (KeOps); J. Feydy, PhD thesis (2020), §3.3 (the soft-min of the loop).
"""
from __future__ import annotations

import math

import torch

__all__ = ["keops_softmin"]


#: The KeOps soft-min of the sqdist costs, given an estimate e_i of its result LSE_i (−prev_i/ε from the current
#: iterate, which the new value differs from by O(1)-O(10)), computes, with s_i = e_i − _LSE_SHIFT,
#: LSE_i = s_i + log Σ_j exp(max(F_ij, s_i − _LSE_FLOOR) − s_i) as a plain Sum reduction accumulated in float64,
#: instead of KeOps' online max-shifted log-sum-exp:
#:
#: * KeOps' CPU code takes one scalar ``exp`` per pair, and an ``exp`` that underflows (most pairs at small ε:
#:   exp(-10^4)) costs about twice one that does not. Raising the exponents to s_i − _LSE_FLOOR (400: no
#:   underflow in the generated code, which evaluates exp in double) removes that (it halves one 5000² reduction
#:   at ε = 0.0025 on 2 threads);
#: * the Sum reduction has no running max (no branch per pair) and, in float64 with ``direct_sum``, no block
#:   bookkeeping (the default ``block_sum`` takes an integer modulo per pair), and it is more accurate than the
#:   float32 block sum.
#:
#: Exactness: each row is checked to have a finite sum (no term exp(F − s) overflowed) and
#: LSE_i − s_i ≥ log M + max(_LSE_MARGIN − _LSE_FLOOR, log(tiny) + _LSE_TINY_MARGIN), so that the raised terms
#: (< M·exp(-_LSE_MARGIN) of the sum) and the terms below the dtype's smallest normal number (< exp(-36)) weigh
#: nothing at float64 precision; rows that fail are recomputed by the plain log-sum-exp. In float32 this accepts
#: LSE_i − e_i in about [-60, +65] for M ≤ 10^4 (seen in the ε-scaling loop: [-12, +23]).
_LSE_SHIFT = 20.0
_LSE_FLOOR = 400.0
_LSE_MARGIN = 80.0
_LSE_TINY_MARGIN = 36.0


class _SqDistSoftminKeOps(torch.autograd.Function):
    """f_i = −ε log Σ_j exp(h_j − c‖u_i − v_j‖²/ε) on KeOps, differentiable in u (N, d); v (M, d), h (M,) fixed.

    One reduction with weights [1, u_i − v_j] gives the log-sum-exp *and* ∂f_i/∂u_i = 2c Σ_j P_ij (u_i − v_j)
    (P the row soft-max) in the same pass, so backward costs no reduction (KeOps autograd would run a second
    N×M reduction). First derivatives only.
    """

    @staticmethod
    def forward(ctx, u, v, h, eps, coef, estimate):
        f, diff = _sqdist_lse_keops(u, v, h, eps, coef, estimate, want_diff=True)
        ctx.save_for_backward((2.0 * coef) * diff)
        return f

    @staticmethod
    def backward(ctx, grad_f):
        (dfdu,) = ctx.saved_tensors
        return grad_f[:, None] * dfdu, None, None, None, None, None


def _sqdist_lse_keops(u, v, h, eps, coef, estimate=None, want_diff=False):
    """f_i = −ε·LSE_j(h_j − c‖u_i − v_j‖²/ε) (and Σ_j P_ij (u_i − v_j) if ``want_diff``) by one KeOps reduction.

    Shape: u (N, d), v (M, d), h (M,), estimate (N,) or None (an estimate of the LSE) -> f (N,), diff (N, d).
    The points are pre-scaled by sqrt(c/ε) (no multiply per pair). With ``estimate``, the floored float64 Sum
    reduction described at ``_LSE_SHIFT``, rows that fail its check recomputed exactly; without, KeOps'
    log-sum-exp.
    """
    from pykeops.torch import LazyTensor

    u, v, h = u.detach(), v.detach(), h.detach()
    s = math.sqrt(coef / eps)
    v_j = LazyTensor((v * s)[None, :, :])
    h_j = LazyTensor(h.reshape(1, -1, 1).contiguous())
    ones_j = LazyTensor(torch.ones_like(v[:, :1])[None]) if want_diff else None

    def reduce(u, est):
        u_i = LazyTensor((u * s)[:, None, :])
        F = h_j - u_i.sqdist(v_j)
        if est is None:
            if want_diff:  # Max_SumShiftExpWeight gives (max, Σ exp(F − max)·[1, u_i − v_j])
                r = F.reduction("Max_SumShiftExpWeight", other=ones_j.concat(u_i - v_j), dim=1)
                return r[:, 0] + r[:, 1].log(), r[:, 2:] / (s * r[:, 1:2])
            return F.logsumexp(dim=1).reshape(-1), None
        s_i = LazyTensor(est.reshape(-1, 1, 1).contiguous())
        fl_i = LazyTensor((est - _LSE_FLOOR).reshape(-1, 1, 1).contiguous())
        E = (F.concat(fl_i).max(-1) - s_i).exp()  # a max of two numbers: exact
        acc = dict(dim=1, dtype_acc="float64", sum_scheme="direct_sum")
        if want_diff:
            r = (E * ones_j.concat(u_i - v_j)).sum(**acc)
            return est + r[:, 0].log(), r[:, 1:] / (s * r[:, :1])
        return est + E.sum(**acc).reshape(-1).log(), None

    if estimate is not None and u.dtype not in (torch.float32, torch.float64):
        estimate = None
    if estimate is not None:
        estimate = estimate - _LSE_SHIFT
    lse, diff = reduce(u, estimate)
    if estimate is not None:
        low = math.log(v.shape[0]) + max(_LSE_MARGIN - _LSE_FLOOR,
                                         math.log(torch.finfo(u.dtype).tiny) + _LSE_TINY_MARGIN)
        ok = (lse >= estimate + low) & torch.isfinite(lse)
        if not bool(ok.all()):  # the estimate was too far off for some rows: redo them by the plain log-sum-exp
            idx = (~ok).nonzero().squeeze(1)
            lse_b, diff_b = reduce(u[idx], None)
            lse = lse.index_put((idx,), lse_b)
            if want_diff:
                diff = diff.index_put((idx,), diff_b)
    return -eps * lse, diff


def keops_softmin(cost, pts):
    """The soft-min ``softmin(eps, pair, h, grad, prev)`` of :func:`fastdpot.reference.sinkhorn.sinkhorn_loop` on
    KeOps, for a :class:`fastdpot.ops.sinkhorn.Cost` with a KeOps form and the points ``pts = {"x": x, "y": y}``:
    the soft-min over ``pts[pair[1]]`` (detached) of ``h − C(pts[pair[0]], ·)/ε``, differentiable in
    ``pts[pair[0]]`` when ``grad`` (and autograd is on). ``prev``, the current iterate, estimates the new value for
    the squared-Euclidean costs (see ``_LSE_SHIFT``)."""
    from pykeops.torch import LazyTensor

    x = pts["x"]
    inv_eps = torch.empty(1, dtype=x.dtype, device=x.device)

    def softmin(eps, pair, h, grad, prev):
        u, v = pts[pair[0]], pts[pair[1]].detach()
        grad = grad and u.requires_grad and torch.is_grad_enabled()
        if cost.sqdist_coef is not None:
            # the current iterate's log-sum-exp −prev/ε estimates the new one (see _LSE_SHIFT)
            est = None if prev is None else prev.detach() / -eps
            if grad:
                return _SqDistSoftminKeOps.apply(u, v, h, eps, cost.sqdist_coef, est)
            return _sqdist_lse_keops(u, v, h, eps, cost.sqdist_coef, est)[0]
        if not grad:
            u = u.detach()
        u_i = LazyTensor(u[:, None, :])
        v_j = LazyTensor(v[None, :, :])
        h_j = LazyTensor(h.reshape(1, -1, 1).contiguous())
        # ε enters as a KeOps parameter (a 1-element tensor), so every ε of the schedule reuses one compiled formula
        C_ie = cost.keops(u_i, v_j) * LazyTensor(inv_eps.new_full((1,), 1.0 / eps))
        return -eps * (h_j - C_ie).logsumexp(dim=1).reshape(-1)

    return softmin
