"""fastdpot.sinkhorn against GeomLoss, POT, closed forms and its own dense reference.

KeOps compiles each new (formula, dtype, dimension) once into KEOPS_CACHE_FOLDER; these tests use few of them:
the p = 2 default cost in float64 and float32 (d = 2) and the mixture cost in float64 (d = 3).
"""
import math
import os

os.environ.setdefault("KEOPS_CACHE_FOLDER", os.path.join(os.path.dirname(__file__), "..", ".cache", "keops"))

import pytest
import torch

from fastdpot import BackendUnavailableError
from fastdpot._dispatch import available_backends
from fastdpot.reference.sinkhorn import (DenseSoftmin, entropic_ot_gaussians, epsilon_schedule, sinkhorn_fixed_epsilon,
                                        softmin_dense, sqdist_dense)
from fastdpot.sinkhorn import (TENSORIZED_MAX_SIZE_CPU, SinkhornLoss, class_conditional, custom_cost,
                               entropic_regularization_for_noise, entropic_wasserstein, euclidean, l1,
                               select_backend, semi_debiased_sinkhorn_loss, sinkhorn, squared_euclidean,
                               squared_euclidean_l1)

geomloss = pytest.importorskip("geomloss")
ot = pytest.importorskip("ot")
keops_ok = available_backends("sinkhorn")["keops"][0]
needs_keops = pytest.mark.skipif(not keops_ok, reason="pykeops unavailable")

F64 = torch.float64


def _clouds(N=37, M=53, d=2, dtype=F64, seed=0, weights=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, d, generator=g, dtype=dtype)
    y = 0.7 * torch.randn(M, d, generator=g, dtype=dtype) + 0.8
    if not weights:
        return x, y, None, None
    a = torch.rand(N, generator=g, dtype=dtype) + 0.2
    b = torch.rand(M, generator=g, dtype=dtype) + 0.2
    return x, y, a / a.sum(), b / b.sum()


def _grads(fn, *tensors):
    ts = [t.detach().clone().requires_grad_() for t in tensors]
    val = fn(*ts)
    # an upstream gradient that is not 1, so that a missing scale factor shows
    gs = torch.autograd.grad(1.7 * val, ts)
    return val.detach(), gs


# ------------------------------------------------------------------------------------------------ GeomLoss anchor
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("debias", [False, True])
def test_tensorized_matches_geomloss(p, debias):
    x, y, a, b = _clouds()
    kw = dict(p=p, blur=0.1, scaling=0.7, debias=debias)
    ref_loss = geomloss.SamplesLoss("sinkhorn", backend="tensorized", **kw)
    v_ref, g_ref = _grads(lambda a_, x_, y_: ref_loss(a_, x_, b, y_), a, x, y)
    v, g = _grads(lambda a_, x_, y_: sinkhorn(x_, y_, a_, b, backend="tensorized", **kw), a, x, y)
    # GeomLoss' p=1 tensorized cost is sqrt of the expanded squared distance: ~1e-8 round-off at zero distance
    tol = 1e-12 if (p == 2 or not debias) else 1e-4
    assert torch.allclose(v, v_ref, rtol=tol, atol=tol)
    for u, w in zip(g, g_ref):
        assert torch.allclose(u, w, rtol=tol, atol=tol)


@needs_keops
def test_keops_matches_geomloss_online():
    x, y, a, b = _clouds()
    kw = dict(p=2, blur=0.1, scaling=0.7, debias=True)
    ref_loss = geomloss.SamplesLoss("sinkhorn", backend="online", **kw)
    v_ref, g_ref = _grads(lambda a_, x_, y_: ref_loss(a_, x_, b, y_), a, x, y)
    v, g = _grads(lambda a_, x_, y_: sinkhorn(x_, y_, a_, b, backend="keops", **kw), a, x, y)
    assert torch.allclose(v, v_ref, rtol=1e-8)
    for u, w in zip(g, g_ref):
        assert torch.allclose(u, w, rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------------------------------------ KeOps vs tensorized
@needs_keops
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_keops_matches_tensorized(dtype, tol):
    x, y, a, b = _clouds(N=301, M=257, dtype=dtype, seed=1)
    kw = dict(blur=0.05, scaling=0.6, debias=True)
    v_k, g_k = _grads(lambda x_, y_, a_: sinkhorn(x_, y_, a_, b, backend="keops", **kw), x, y, a)
    # float32 is compared to the float64 dense reference: both engines' float32 error is ~ that of torch's
    x64, y64, a64, b64 = (t.double() for t in (x, y, a, b))
    v_t, g_t = _grads(lambda x_, y_, a_: sinkhorn(x_, y_, a_, b64, backend="tensorized", **kw), x64, y64, a64)
    scale = float(v_t.abs())
    assert abs(float(v_k) - float(v_t)) <= tol * max(scale, 1.0)
    for u, w in zip(g_k, g_t):
        assert torch.allclose(u.double(), w, rtol=tol * 10, atol=tol * 10 * float(w.abs().max()))


@needs_keops
def test_keops_mixture_cost_matches_tensorized():
    x, y, a, b = _clouds(N=40, M=31, d=3, seed=2)
    kw = dict(blur=0.3, scaling=0.6, debias=False, cost=squared_euclidean_l1(3.0))
    v_k, g_k = _grads(lambda x_, y_: sinkhorn(x_, y_, a, b, backend="keops", **kw), x, y)
    v_t, g_t = _grads(lambda x_, y_: sinkhorn(x_, y_, a, b, backend="tensorized", **kw), x, y)
    assert torch.allclose(v_k, v_t, rtol=1e-10)
    for u, w in zip(g_k, g_t):
        assert torch.allclose(u, w, rtol=1e-8, atol=1e-11)


def test_auto_dispatch_by_size():
    assert select_backend(100, 100, 2, "cpu") == "reference"
    if keops_ok:
        assert select_backend(TENSORIZED_MAX_SIZE_CPU + 1, 1, 2, "cpu") == "keops"
        # high dimension: auto stays dense (one matmul per cost matrix beats re-evaluating d-dim costs)
        assert select_backend(2100, 2100, 40) == "reference" and select_backend(2100, 2100, 2) == "keops"
        assert select_backend(600, 600, 2) == "reference"
    # a cost without a KeOps formula silently stays dense under auto, but an explicit keops request fails
    cost = custom_cost(lambda u, v: sqdist_dense(u, v))
    x, y, _, _ = _clouds(N=600, M=600, weights=False)
    assert torch.isfinite(sinkhorn(x, y, cost=cost, blur=0.5))
    with pytest.raises(BackendUnavailableError):
        sinkhorn(x[:5], y[:5], cost=cost, backend="keops")


# ------------------------------------------------------------------------------------------------- POT anchor
def test_converged_ot_matches_pot_sinkhorn_log():
    x, y, a, b = _clouds(N=23, M=17, seed=3)
    eps = 0.2
    C = sqdist_dense(x, y)  # ‖x − y‖² (no ½): the cost matrix handed to POT
    plan = torch.as_tensor(ot.sinkhorn(a.numpy(), b.numpy(), C.numpy(), reg=eps, method="sinkhorn_log",
                                       numItermax=100000, stopThr=1e-14))
    # POT regularises with Σ π log π (negative entropy); OT_ε uses ε·KL(π | a⊗b), the same minimiser, and a value
    # that differs by the constant ε·(Σ a log a + Σ b log b) since Σ_ij π_ij log(a_i b_j) only depends on a, b
    # ot.sinkhorn2 reports only the linear term <π, C> of the same plan
    lin = float(ot.sinkhorn2(a.numpy(), b.numpy(), C.numpy(), reg=eps, method="sinkhorn_log", numItermax=100000,
                             stopThr=1e-14))
    assert abs(lin - float((plan * C).sum())) < 1e-9
    pot_value = (plan * C).sum() + eps * ((plan * plan.log()).sum() - (a * a.log()).sum() - (b * b.log()).sum())
    ours = sinkhorn(x, y, a, b, p=2, blur=math.sqrt(eps), scaling=0.8, cost=squared_euclidean(half=False),
                    debias=False, final_iters=400)
    fixed, _, _ = sinkhorn_fixed_epsilon(C, a, b, eps, iters=20000, tol=1e-14)
    assert abs(float(ours) - float(pot_value)) < 1e-9
    assert abs(float(fixed) - float(pot_value)) < 1e-9


# ---------------------------------------------------------------------------------------------- closed forms
@pytest.mark.parametrize("dim", [1, 2])
def test_entropic_ot_between_gaussians_closed_form(dim):
    # Gaussians discretised on a grid (non-uniform weights = densities): Riemann error is far below the tolerance
    n = {1: 601, 2: 41}[dim]
    t = torch.linspace(-6.0, 7.0, n, dtype=F64)
    pts = torch.cartesian_prod(*([t] * dim)).reshape(-1, dim)
    m_a, m_b = torch.tensor([0.3, -0.2][:dim], dtype=F64), torch.tensor([1.0, 0.4][:dim], dtype=F64)
    s_a, s_b = torch.tensor([1.0, 0.8][:dim], dtype=F64), torch.tensor([0.6, 1.1][:dim], dtype=F64)

    def dens(m, s):
        w = torch.exp(-0.5 * (((pts - m) / s) ** 2).sum(1))
        return w / w.sum()

    eps = 0.5
    val = sinkhorn(pts, pts, dens(m_a, s_a), dens(m_b, s_b), blur=math.sqrt(eps), scaling=0.7,
                   cost=squared_euclidean(half=False), debias=False, final_iters=100, backend="tensorized")
    ref = entropic_ot_gaussians(m_a, torch.diag(s_a ** 2), m_b, torch.diag(s_b ** 2), eps)
    assert abs(float(val) - float(ref)) < 1e-3 * max(1.0, abs(float(ref)))


def test_gaussian_closed_form_vanishing_eps_is_w2():
    m_a, m_b = torch.tensor([0.0, 1.0], dtype=F64), torch.tensor([2.0, -1.0], dtype=F64)
    A = torch.tensor([[2.0, 0.3], [0.3, 0.5]], dtype=F64)
    B = torch.tensor([[1.0, -0.2], [-0.2, 0.7]], dtype=F64)
    w, V = torch.linalg.eigh(A)
    Ah = (V * w.sqrt()) @ V.T
    w2, V2 = torch.linalg.eigh(Ah @ B @ Ah)
    bures = torch.trace(A) + torch.trace(B) - 2 * (w2.sqrt()).sum()
    w2sq = ((m_a - m_b) ** 2).sum() + bures
    assert abs(float(entropic_ot_gaussians(m_a, A, m_b, B, 1e-9)) - float(w2sq)) < 1e-6


# ------------------------------------------------------------------------------------------------- properties
@pytest.mark.parametrize("p", [1, 2])
def test_divergence_of_measure_with_itself_is_zero_and_symmetric(p):
    x, y, a, b = _clouds(seed=4)
    assert abs(float(sinkhorn(x, x, a, a, p=p, blur=0.1))) < 1e-12
    for debias in (False, True):
        s_xy = sinkhorn(x, y, a, b, p=p, blur=0.1, scaling=0.9, debias=debias, final_iters=50)
        s_yx = sinkhorn(y, x, b, a, p=p, blur=0.1, scaling=0.9, debias=debias, final_iters=50)
        assert abs(float(s_xy) - float(s_yx)) < 1e-9
    assert float(sinkhorn(x, y, a, b, p=p, blur=0.1)) > 0


def test_permutation_invariance_and_potentials():
    x, y, a, b = _clouds(seed=5)
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    v, f, g = sinkhorn(x, y, a, b, blur=0.2, return_potentials=True)
    v2, f2, g2 = sinkhorn(x[perm], y, a[perm], b, blur=0.2, return_potentials=True)
    assert abs(float(v) - float(v2)) < 1e-12
    assert torch.allclose(f[perm], f2, atol=1e-12) and torch.allclose(g, g2, atol=1e-12)
    assert abs(float((a * f).sum() + (b * g).sum()) - float(v)) < 1e-12


def test_envelope_gradient_matches_finite_differences_at_convergence():
    x, y, a, b = _clouds(N=9, M=7, seed=6)
    kw = dict(blur=0.3, scaling=0.8, debias=True, final_iters=300, backend="tensorized")
    _, (gx, ga) = _grads(lambda x_, a_: sinkhorn(x_, y, a_, b, **kw) / 1.7, x, a)
    h = 1e-6
    for i, k in [(0, 0), (3, 1), (8, 0)]:
        dx = torch.zeros_like(x)
        dx[i, k] = h
        fd = (sinkhorn(x + dx, y, a, b, **kw) - sinkhorn(x - dx, y, a, b, **kw)) / (2 * h)
        assert abs(float(gx[i, k]) - float(fd)) < 1e-6
    # weights: the potential is the gradient up to a constant (mass is constrained): compare a mass-preserving move
    da = torch.zeros_like(a)
    da[1], da[4] = h, -h
    fd = (sinkhorn(x, y, a + da, b, **kw) - sinkhorn(x, y, a - da, b, **kw)) / (2 * h)
    assert abs(float(ga[1] - ga[4]) - float(fd)) < 1e-6


def test_scale_equivariance_large_coordinates():
    x, y, a, b = _clouds(seed=7)
    c = 1e4
    base = sinkhorn(x, y, a, b, blur=0.05)
    big = sinkhorn(c * x, c * y, a, b, blur=0.05 * c)
    assert abs(float(big) / c ** 2 - float(base)) < 1e-9 * max(1.0, abs(float(base)))
    v32 = sinkhorn((c * x).float().requires_grad_(), (c * y).float(), blur=1.0)
    assert torch.isfinite(v32)


# ------------------------------------------------------------------------------------------------- robustness
@pytest.mark.parametrize("backend", ["tensorized", pytest.param("keops", marks=needs_keops)])
def test_no_nan_small_blur_and_identical_inputs(backend):
    g = torch.Generator().manual_seed(8)
    x = torch.rand(120, 2, generator=g)  # unit-scale float32 data
    y = torch.rand(110, 2, generator=g)
    xr = x.clone().requires_grad_()
    v = sinkhorn(xr, y, blur=1e-3, backend=backend)
    (gx,) = torch.autograd.grad(v, xr)
    assert torch.isfinite(v) and torch.isfinite(gx).all()
    xr = x.clone().requires_grad_()
    v = sinkhorn(xr, x.clone(), blur=1e-3, backend=backend)
    (gx,) = torch.autograd.grad(v, xr)
    assert torch.isfinite(gx).all() and abs(float(v.detach())) < 1e-4 and float(gx.abs().max()) < 1e-4
    # identical points inside one cloud (distance exactly 0) with the Euclidean cost: gradient stays finite
    xd = torch.cat([x[:10], x[:10]]).double().requires_grad_()
    v = sinkhorn(xd, y[:15].double(), p=1, blur=1e-3, backend="tensorized")
    (gx,) = torch.autograd.grad(v, xd)
    assert torch.isfinite(gx).all()


# ------------------------------------------------------------------------------------------------- losses
def test_semi_debiased_loss_definition():
    g = torch.Generator().manual_seed(9)
    fake, real, extra = torch.randn(10, 3, generator=g, dtype=F64), torch.randn(12, 3, generator=g, dtype=F64), \
        torch.randn(10, 3, generator=g, dtype=F64)
    kw = dict(blur=0.3)

    def ot_(u, v):
        return sinkhorn(u, v, debias=False, **kw)

    assert torch.allclose(semi_debiased_sinkhorn_loss(fake, extra[:0], real, 0.0, **kw),
                          2 * ot_(fake, real) - ot_(fake, fake))
    assert torch.allclose(semi_debiased_sinkhorn_loss(fake, extra, real, 1.0, **kw),
                          2 * ot_(fake, real) - ot_(fake, extra))
    assert torch.allclose(semi_debiased_sinkhorn_loss(fake, extra[:3], real, 0.3, **kw),
                          2 * ot_(fake, real) - ot_(fake, torch.cat([fake[3:], extra[:3]])))
    with pytest.raises(ValueError, match="fake_extra"):
        semi_debiased_sinkhorn_loss(fake, extra[:2], real, 0.3, **kw)
    with pytest.raises(ValueError, match="ratio"):
        semi_debiased_sinkhorn_loss(fake, extra, real, 1.5, **kw)


def test_entropic_wasserstein_and_module():
    x, y, a, b = _clouds(seed=10)
    sigma = 0.3
    reg = entropic_regularization_for_noise(sigma, p=2)
    assert reg == pytest.approx(2 * sigma ** 2)
    w = entropic_wasserstein(x, y, p=2, reg=reg, a=a, b=b)
    ref = sinkhorn(x, y, a, b, p=2, blur=math.sqrt(reg), cost=squared_euclidean(half=False), debias=False)
    assert torch.allclose(w, ref)
    # p = 1: ℓ1 cost, ε = reg
    w1 = entropic_wasserstein(x, y, p=1, reg=0.2, final_iters=300, scaling=0.9)
    fixed, _, _ = sinkhorn_fixed_epsilon(torch.cdist(x, y, p=1), torch.full((37,), 1 / 37, dtype=F64),
                                         torch.full((53,), 1 / 53, dtype=F64), 0.2, iters=20000, tol=1e-13)
    assert abs(float(w1) - float(fixed)) < 1e-8
    loss = SinkhornLoss(p=2, blur=0.1)
    assert torch.allclose(loss(x, y), sinkhorn(x, y, blur=0.1)) and torch.allclose(loss(a, x, b, y),
                                                                                   sinkhorn(x, y, a, b, blur=0.1))


def test_class_conditional_cost_separates_classes():
    g = torch.Generator().manual_seed(11)
    x, y = torch.rand(20, 4, generator=g, dtype=F64), torch.rand(20, 4, generator=g, dtype=F64)
    lab = torch.arange(20) % 2
    xc, yc = class_conditional(x, lab, 2), class_conditional(y, lab, 2)
    assert xc.shape == (20, 6) and torch.all(xc[:, 4:].sum(1) == 15.0)
    # OT between class-conditioned clouds = mean of the per-class OTs (no mass crosses a 2·15² cost gap), plus
    # ε·log 2: the block-diagonal plan has KL(π | a⊗b) = mean of the per-class KLs + log(number of classes)
    kw = dict(blur=0.1, debias=False, scaling=0.8, final_iters=100)
    full = sinkhorn(xc, yc, **kw)
    per = 0.5 * (sinkhorn(x[lab == 0], y[lab == 0], **kw) + sinkhorn(x[lab == 1], y[lab == 1], **kw))
    assert abs(float(full) - float(per) - 0.1 ** 2 * math.log(2)) < 1e-6  # (different ε schedules: diameters differ)
    with pytest.raises(ValueError, match="labels"):
        class_conditional(x, lab + 1, 2)


def test_costs_dense_forms():
    x, y, _, _ = _clouds(N=5, M=4, d=3, weights=False)
    diff = x[:, None, :] - y[None, :, :]
    assert torch.allclose(squared_euclidean().dense(x, y), 0.5 * (diff ** 2).sum(-1))
    assert torch.allclose(squared_euclidean(half=False).dense(x, y), (diff ** 2).sum(-1))
    assert torch.allclose(euclidean().dense(x, y), (diff ** 2).sum(-1).sqrt())
    assert torch.allclose(l1().dense(x, y), diff.abs().sum(-1))
    assert torch.allclose(squared_euclidean_l1(3.0).dense(x, y), (diff ** 2).sum(-1) + 3 * diff.abs().sum(-1))


def test_epsilon_schedule_is_geomloss_schedule():
    from geomloss._legacy.sinkhorn_divergence import epsilon_schedule as geo_schedule

    for p, D, blur, s in [(2, 7.3, 0.05, 0.5), (1, 3.0, 0.01, 0.9), (2, 1.0, 0.3, 0.7)]:
        assert epsilon_schedule(p, D ** p, blur, s) == pytest.approx(geo_schedule(p, D, blur, s), rel=1e-12)


# ------------------------------------------------------------------------------ soft-min engines (issue 6 speed)
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_softmin_dense_is_logsumexp(dtype):
    # small ε puts most exponents in (and below) the subnormal range, which softmin_dense clamps
    g = torch.Generator().manual_seed(12)
    C = (torch.rand(37, 53, generator=g, dtype=F64) * 30).to(dtype)
    h = torch.randn(53, generator=g, dtype=F64).to(dtype)
    h[5] = -math.inf  # a zero weight
    tol = 1e-13 if dtype == F64 else 1e-6
    for eps in (10.0, 0.05, 1e-3, 1e-5):
        ref = -eps * torch.logsumexp(h.double()[None] - C.double() / eps, 1)
        assert torch.allclose(softmin_dense(eps, C, h).double(), ref, rtol=tol, atol=0)
    hinf = torch.full_like(h, -math.inf)  # a row with no finite term: +inf, as torch.logsumexp gives
    assert torch.equal(softmin_dense(0.1, C, hinf), -0.1 * torch.logsumexp(hinf[None] - C / 0.1, 1))


def test_dense_softmin_gradcheck():
    g = torch.Generator().manual_seed(13)
    C = (torch.rand(7, 5, generator=g, dtype=F64) * 3).requires_grad_()
    h = torch.randn(5, generator=g, dtype=F64).requires_grad_()
    for eps in (1.0, 0.05):
        assert torch.autograd.gradcheck(lambda C_, h_: DenseSoftmin.apply(C_, h_, eps), (C, h))
        ref = -eps * torch.logsumexp(h[None] - C / eps, 1)
        assert torch.allclose(DenseSoftmin.apply(C, h, eps), ref, rtol=1e-14)


@needs_keops
@pytest.mark.parametrize("dtype,tol", [(F64, 1e-12), (torch.float32, 2e-6)])
def test_keops_sqdist_softmin_estimate_and_fallback(dtype, tol):
    # the floored Sum reduction used with an estimate of the result equals the plain log-sum-exp, whether the
    # estimate is close, or so far off (either way) that every row, or some rows, go through the exact fallback
    from fastdpot.ops._keops_formulas import _sqdist_lse_keops

    x, y, _, _ = _clouds(N=41, M=29, dtype=dtype, seed=14, weights=False)
    h = torch.randn(29, generator=torch.Generator().manual_seed(15), dtype=F64).to(dtype)
    eps, c = 0.01, 0.5
    x64, y64, h64 = x.double(), y.double(), h.double()
    lse = torch.logsumexp(h64[None] - c * ((x64[:, None] - y64[None]) ** 2).sum(-1) / eps, 1)
    ref = -eps * lse
    diff_ref = (torch.softmax(h64[None] - c * ((x64[:, None] - y64[None]) ** 2).sum(-1) / eps, 1)[:, :, None]
                * (x64[:, None] - y64[None])).sum(1)
    shift = torch.zeros(41, dtype=F64)
    shift[::3] = 1000.0
    # (lse + 75: the largest terms would be float32 subnormals, lse − 75: float32 overflow)
    for est in (None, lse + 5.0, lse - 5.0, lse + 75.0, lse - 75.0, lse + 1000.0, lse - 1000.0, lse + shift,
                lse - shift):
        est = None if est is None else est.to(dtype)
        f, diff = _sqdist_lse_keops(x, y, h, eps, c, est, want_diff=True)
        f2, _ = _sqdist_lse_keops(x, y, h, eps, c, est)
        scale = float(ref.abs().max())
        assert torch.allclose(f.double(), ref, rtol=0, atol=tol * scale)
        assert torch.allclose(f2.double(), ref, rtol=0, atol=tol * scale)
        assert torch.allclose(diff.double(), diff_ref, rtol=0, atol=tol * 1e3 * float(diff_ref.abs().max()))


@needs_keops
def test_keops_sqdist_softmin_gradcheck():
    from fastdpot.ops._keops_formulas import _SqDistSoftminKeOps

    x, y, _, _ = _clouds(N=9, M=7, seed=16, weights=False)
    h = torch.randn(7, generator=torch.Generator().manual_seed(17), dtype=F64)
    u = x.clone().requires_grad_()
    for eps, c in [(0.5, 0.5), (0.05, 1.0)]:
        lse = torch.logsumexp(h[None] - c * sqdist_dense(x, y) / eps, 1)
        for est in (None, lse + 3.0):
            assert torch.autograd.gradcheck(lambda u_: _SqDistSoftminKeOps.apply(u_, y, h, eps, c, est), (u,))


# ------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs,match", [
    (dict(y=torch.randn(5, 3, dtype=F64)), "same dimension"),
    (dict(x=torch.tensor([[float("nan"), 0.0]] * 4, dtype=F64)), "non-finite"),
    (dict(a=-torch.ones(4, dtype=F64)), "nonnegative"),
    (dict(a=torch.ones(4, dtype=F64)), "same total mass"),
    (dict(a=torch.ones(3, dtype=F64) / 3), r"shape \(4,\)"),
    (dict(blur=0.0), "blur"),
    (dict(scaling=1.0), "scaling"),
    (dict(p=3), "p must"),
    (dict(backend="cuda"), "backend"),
    (dict(final_iters=-1), "final_iters"),
    (dict(cost="l1"), "cost"),
])
def test_bad_input_raises(kwargs, match):
    args = dict(x=torch.randn(4, 2, dtype=F64), y=torch.randn(5, 2, dtype=F64))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        sinkhorn(**args)
    with pytest.raises(TypeError):
        sinkhorn([[0.0, 1.0]], torch.randn(3, 2))
