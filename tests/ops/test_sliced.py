"""Tests of the (DP) sliced Wasserstein losses: reference vs POT, C++ kernel vs reference, autograd, noise."""
import math

import numpy as np
import ot
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import fastdpot
from fastdpot import sliced as S
from fastdpot._ext import cpp_status
from fastdpot.ops import sliced_wasserstein as op
from fastdpot.ops.sliced_wasserstein import SlicedWassersteinCPU
from fastdpot.reference.sliced import quantile_levels
from fastdpot.reference.sliced import sliced_wasserstein as ref_sw

HAS_CPP = cpp_status("sliced")[0]
needs_cpp = pytest.mark.skipif(not HAS_CPP, reason="C++ extension fastdpot._C_sliced not built")
BACKENDS = ["reference", pytest.param("cpu", marks=needs_cpp)]
#: a clipping bound above every row's norm in these tests: the rows are not changed by it
NO_CLIP = 1e6


def _data(n, m, d, k, dtype=torch.float64, seed=0, shift=0.5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randn(m, d, generator=g, dtype=torch.float64) * 1.3 + shift
    th = S.random_projections(k, d, generator=g, dtype=torch.float64)
    return x.to(dtype), y.to(dtype), th.to(dtype)


# ------------------------------------------------------------------------------------------------------------
# the reference against outside anchors
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("n,m", [(40, 40), (33, 57), (100, 7), (600, 450)])
def test_matches_pot_sliced(backend, p, n, m):
    x, y, th = _data(n, m, 5, 13)
    ours = S.sliced_wasserstein(x, y, projections=th, p=p, backend=backend)
    # POT returns the p-th root and takes projections as (d, k)
    pot = ot.sliced_wasserstein_distance(x.numpy(), y.numpy(), projections=th.T.numpy(), p=p)
    assert abs(float(ours) - pot ** p) <= 1e-12 * max(1.0, pot ** p)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("n,m", [(50, 50), (31, 74)])
def test_one_dimensional_equals_wasserstein_1d(backend, p, n, m):
    x, y, _ = _data(n, m, 1, 1)
    for sign in (1.0, -1.0):  # W_p is invariant under the reflection θ = -1
        th = torch.tensor([[sign]], dtype=torch.float64)
        ours = S.sliced_wasserstein(x, y, projections=th, p=p, backend=backend)
        exact = ot.wasserstein_1d(x[:, 0].numpy(), y[:, 0].numpy(), p=p)
        assert abs(float(ours) - exact) <= 1e-12 * max(1.0, exact)


def test_quantile_levels_exact():
    for n, m in [(3, 5), (4, 6), (7, 7), (1, 9), (12, 8)]:
        w, ix, iy = quantile_levels(n, m)
        assert abs(float(w.sum()) - 1.0) < 1e-15
        assert bool((w > 0).all())
        # each atom of x gets total weight 1/n, each atom of y 1/m
        assert torch.allclose(torch.zeros(n, dtype=torch.float64).index_add_(0, ix, w),
                              torch.full((n,), 1.0 / n, dtype=torch.float64), atol=1e-15)
        assert torch.allclose(torch.zeros(m, dtype=torch.float64).index_add_(0, iy, w),
                              torch.full((m,), 1.0 / m, dtype=torch.float64), atol=1e-15)
        assert len(w) <= n + m - 1


def test_gaussian_closed_form_1d():
    # W_2^2 between N(a, s^2) and N(b, t^2) is (a - b)^2 + (s - t)^2; sample version converges at ~1/sqrt(n)
    g = torch.Generator().manual_seed(1)
    n = 20000
    x = torch.randn(n, 1, generator=g, dtype=torch.float64)
    y = 0.5 * torch.randn(n, 1, generator=g, dtype=torch.float64) + 2.0
    th = torch.ones(1, 1, dtype=torch.float64)
    val = float(S.sliced_wasserstein(x, y, projections=th))
    assert abs(val - (4.0 + 0.25)) < 0.05


# ------------------------------------------------------------------------------------------------------------
# C++ kernel against the reference
# ------------------------------------------------------------------------------------------------------------
SHAPES = [(64, 64, 3, 5), (97, 41, 7, 19), (13, 200, 2, 3), (1, 5, 4, 2), (300, 300, 17, 33), (257, 513, 11, 9)]


@needs_cpp
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("n,m,d,k", SHAPES)
def test_cpu_matches_reference_float64(p, n, m, d, k):
    x, y, th = _data(n, m, d, k, seed=n + k)
    x.requires_grad_(True)
    y.requires_grad_(True)
    up = torch.tensor(-1.7, dtype=torch.float64)  # upstream gradient that is not one
    lc = S.sliced_wasserstein(x, y, projections=th, p=p, backend="cpu")
    gc = torch.autograd.grad(lc, [x, y], grad_outputs=up)
    lr = ref_sw(x, y, th, p=p)
    gr = torch.autograd.grad(lr, [x, y], grad_outputs=up)
    assert abs(lc.item() - lr.item()) <= 1e-12 * max(1.0, abs(lr.item()))
    for a, b in zip(gc, gr):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


@needs_cpp
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("n,m,d,k", [(97, 41, 7, 19), (300, 300, 17, 33), (1000, 733, 24, 40)])
def test_cpu_float32_error_within_torch_float32_error(p, n, m, d, k):
    """float32 kernel error against the float64 reference is bounded by a small multiple of the reference's own
    float32 error (same float32 inputs)."""
    x64, y64, th64 = _data(n, m, d, k, seed=7 * n + k)
    lr64 = ref_sw(x64.requires_grad_(True), y64.requires_grad_(True), th64, p=p)
    gr64 = torch.autograd.grad(lr64, [x64, y64])
    x32, y32, th32 = (t.detach().float() for t in (x64, y64, th64))
    x32.requires_grad_(True)
    y32.requires_grad_(True)
    lr32 = ref_sw(x32, y32, th32, p=p)
    gr32 = torch.autograd.grad(lr32, [x32, y32])
    lc32 = S.sliced_wasserstein(x32, y32, projections=th32, p=p, backend="cpu")
    gc32 = torch.autograd.grad(lc32, [x32, y32])
    assert lc32.dtype == torch.float32 and gc32[0].dtype == torch.float32
    eps32 = torch.finfo(torch.float32).eps
    ref_err = abs(float(lr32) - float(lr64))
    assert abs(float(lc32) - float(lr64)) <= 4 * ref_err + 8 * eps32 * abs(float(lr64))
    for c, r32, r64 in zip(gc32, gr32, gr64):
        ref_gerr = float((r32.double() - r64).abs().max())
        scale = float(r64.abs().max())
        assert float((c.double() - r64).abs().max()) <= 4 * ref_gerr + 8 * eps32 * scale


@needs_cpp
def test_cpu_chunking_does_not_change_result(monkeypatch):
    x, y, th = _data(211, 150, 6, 23, seed=3)
    y.requires_grad_(True)
    full = S.dp_sliced_wasserstein(y, private=x, noise_std=0.3, clip_radius=NO_CLIP, projections=th,
                                   secure_mode=False, generator=torch.Generator().manual_seed(5),
                                   backend="cpu", return_noise=True)
    g_full = torch.autograd.grad(full[0], y)[0]
    # force chunks of a few directions that do not divide k
    monkeypatch.setattr(op, "_CHUNK_BYTES", (211 + 150) * 8 * 4 * 4)
    assert op._chunk_size(211, 150, 23, 8, 4) == 4
    part = S.dp_sliced_wasserstein(y, private=x, noise_std=0.3, clip_radius=NO_CLIP, projections=th,
                                   secure_mode=False, generator=torch.Generator().manual_seed(5),
                                   backend="cpu", return_noise=True)
    g_part = torch.autograd.grad(part[0], y)[0]
    assert abs(float(full[0]) - float(part[0])) <= 1e-13
    torch.testing.assert_close(full[1], part[1], rtol=0, atol=0)
    torch.testing.assert_close(full[2], part[2], rtol=0, atol=0)
    torch.testing.assert_close(g_full, g_part, rtol=1e-12, atol=1e-15)


@needs_cpp
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("noise_std", [0.0, 0.4])
@pytest.mark.parametrize("n,m", [(9, 9), (8, 13)])
def test_gradcheck_cpu_function(p, noise_std, n, m):
    x, y, th = _data(n, m, 3, 4, seed=11)
    x.requires_grad_(True)
    y.requires_grad_(True)

    def f(a, b):
        return SlicedWassersteinCPU.apply(a, b, th, p, noise_std, 1234, False)

    assert torch.autograd.gradcheck(f, (x, y), eps=1e-7, atol=1e-6, rtol=1e-5)


@needs_cpp
def test_cpu_gradient_only_where_needed_and_projection_grad_refused():
    x, y, th = _data(20, 20, 3, 4)
    y.requires_grad_(True)
    loss = S.sliced_wasserstein(x, y, projections=th, backend="cpu")
    loss.backward()
    assert x.grad is None and y.grad is not None
    with pytest.raises(ValueError, match="projections"):
        S.sliced_wasserstein(x, y, projections=th.clone().requires_grad_(True), backend="cpu")
    with torch.no_grad():
        assert S.sliced_wasserstein(x, y, projections=th, backend="cpu").grad_fn is None


@needs_cpp
@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 60), m=st.integers(1, 60), d=st.integers(1, 6), k=st.integers(1, 8),
       p=st.sampled_from([1, 2]), seed=st.integers(0, 1000))
def test_property_cpu_equals_reference(n, m, d, k, p, seed):
    x, y, th = _data(n, m, d, k, seed=seed)
    a = S.sliced_wasserstein(x, y, projections=th, p=p, backend="cpu")
    b = ref_sw(x, y, th, p=p)
    assert abs(float(a) - float(b)) <= 1e-12 * max(1.0, abs(float(b)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_identity_symmetry_permutation(backend):
    x, y, th = _data(50, 70, 4, 10, seed=2)
    assert float(S.sliced_wasserstein(x, x, projections=th, backend=backend)) == 0.0
    xy = S.sliced_wasserstein(x, y, projections=th, backend=backend)
    yx = S.sliced_wasserstein(y, x, projections=th, backend=backend)
    perm = S.sliced_wasserstein(x[torch.randperm(50)], y[torch.randperm(70)], projections=th, backend=backend)
    assert abs(float(xy) - float(yx)) <= 1e-12 and abs(float(xy) - float(perm)) <= 1e-12


def test_auto_backend_choice():
    assert op.select_backend(60, 40, "cpu") == ("cpu" if HAS_CPP else "reference")


# ------------------------------------------------------------------------------------------------------------
# noise: replay and statistics
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n,m", [(120, 120), (90, 151), (400, 333)])
def test_noise_replay_into_reference(backend, n, m):
    x, y, th = _data(n, m, 5, 17, seed=4)
    y.requires_grad_(True)
    loss, nx, ny = S.dp_sliced_wasserstein(y, private=x, noise_std=0.8, clip_radius=NO_CLIP, projections=th,
                                           secure_mode=False, generator=torch.Generator().manual_seed(9),
                                           backend=backend, return_noise=True)
    assert nx.shape == (n, 17) and ny.shape == (m, 17)
    replay = ref_sw(x, y, th, noise_x=nx, noise_y=ny)
    assert abs(float(loss) - float(replay)) <= 1e-12 * max(1.0, float(replay))
    g = torch.autograd.grad(loss, y)[0]
    g_replay = torch.autograd.grad(replay, y)[0]
    torch.testing.assert_close(g, g_replay, rtol=1e-10, atol=1e-13)
    # the same generator state gives the same draw; a different one a different draw
    again = S.dp_sliced_wasserstein(y, private=x, noise_std=0.8, clip_radius=NO_CLIP, projections=th,
                                    secure_mode=False, generator=torch.Generator().manual_seed(9),
                                    backend=backend, return_noise=True)
    other = S.dp_sliced_wasserstein(y, private=x, noise_std=0.8, clip_radius=NO_CLIP, projections=th,
                                    secure_mode=False, generator=torch.Generator().manual_seed(10),
                                    backend=backend, return_noise=True)
    assert torch.equal(again[1], nx) and torch.equal(again[2], ny)
    assert not torch.equal(other[1], nx)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_noise_statistics(backend, dtype):
    sigma = 0.7
    x, y, th = _data(1500, 1300, 4, 20, dtype=dtype, seed=8)
    _, nx, ny = S.dp_sliced_wasserstein(y, private=x, noise_std=sigma, clip_radius=NO_CLIP, projections=th,
                                        secure_mode=False, generator=torch.Generator().manual_seed(21),
                                        backend=backend, return_noise=True)
    assert nx.dtype == dtype
    for v in (nx.double().flatten(), ny.double().flatten()):
        cnt = v.numel()
        assert abs(float(v.mean())) < 5 * sigma / math.sqrt(cnt)
        # var of the sample variance of a normal: 2 sigma^4 / (cnt - 1)
        assert abs(float(v.var()) - sigma ** 2) < 5 * sigma ** 2 * math.sqrt(2.0 / (cnt - 1))
        assert stats.kstest((v / sigma).numpy(), "norm").pvalue > 1e-4
    # the two sides are independent: correlation of the overlapping block ~ 0
    a, b = nx[:1300].double().flatten(), ny.double().flatten()
    corr = float(((a - a.mean()) * (b - b.mean())).mean() / (a.std() * b.std()))
    assert abs(corr) < 5 / math.sqrt(a.numel())
    # columns (directions) and rows are not correlated with each other
    c = np.corrcoef(nx.double().numpy()[:, :5].T)
    assert np.abs(c - np.eye(5)).max() < 5 / math.sqrt(1500)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_noise_std_equals_plain_and_noise_changes_value(backend):
    x, y, th = _data(80, 60, 3, 7)
    plain = S.sliced_wasserstein(x, y, projections=th, backend=backend)
    dp0 = S.dp_sliced_wasserstein(y, private=x, noise_std=0.0, projections=th, backend=backend)
    dp = S.dp_sliced_wasserstein(y, private=x, noise_std=1.0, clip_radius=NO_CLIP, projections=th,
                                 secure_mode=False, generator=torch.Generator().manual_seed(0),
                                 backend=backend)
    assert float(dp0) == pytest.approx(float(plain), rel=1e-13, abs=1e-15)
    assert abs(float(dp) - float(plain)) > 1e-6  # noise was added (it changes the value, not necessarily by much)


def test_radius_clips_private_rows_inside():
    privacy = pytest.importorskip("fastdpot.privacy")
    x, y, th = _data(60, 40, 4, 9, seed=6)
    x = x * 3.0
    got = S.dp_sliced_wasserstein(y, private=x, noise_std=0.0, projections=th, clip_radius=1.0, backend="reference")
    norms = x.norm(dim=1, keepdim=True)
    clipped = x * torch.clamp(1.0 / norms, max=1.0)
    assert float(got) == pytest.approx(float(ref_sw(clipped, y, th)), rel=1e-12)
    torch.testing.assert_close(privacy.clip_rows(x, 1.0), clipped)


# ------------------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input(backend):
    x, y, th = _data(10, 12, 3, 4)
    sw = S.sliced_wasserstein
    with pytest.raises(ValueError, match="same dimension"):
        sw(x, torch.randn(12, 4, dtype=torch.float64), projections=th, backend=backend)
    with pytest.raises(ValueError, match=r"projections must have shape \(k, d\)"):
        sw(x, y, projections=torch.ones(4, 5, dtype=torch.float64) / math.sqrt(5), backend=backend)
    with pytest.raises(ValueError, match="projections must have 2 dimensions"):
        sw(x, y, projections=th[0], backend=backend)
    with pytest.raises(ValueError, match="unit-norm"):
        sw(x, y, projections=2 * th, backend=backend)
    with pytest.raises(ValueError, match="p must be one of"):
        sw(x, y, projections=th, p=3, backend=backend)
    with pytest.raises(ValueError, match="non-finite"):
        sw(torch.full((10, 3), float("nan"), dtype=torch.float64), y, projections=th, backend=backend)
    with pytest.raises(ValueError, match="non-finite"):
        sw(x, y, projections=th.clone().fill_(float("inf")), backend=backend)
    with pytest.raises(ValueError, match="must not be empty"):
        sw(x[:0], y, projections=th, backend=backend)
    with pytest.raises(ValueError, match="dtype"):
        sw(x.long(), y.long(), projections=th, backend=backend)
    with pytest.raises(ValueError, match="dtype"):
        sw(x.half(), y.half(), projections=th, backend=backend)
    with pytest.raises(ValueError, match="same dtype"):
        sw(x.float(), y, projections=th, backend=backend)
    with pytest.raises(ValueError, match="num_projections or projections"):  # the op itself has no default
        op.sliced_wasserstein_op(x, y, backend=backend)
    with pytest.raises(ValueError, match="num_projections"):
        sw(x, y, num_projections=0, backend=backend)
    with pytest.raises(ValueError, match=r"k·d <= 2\^31"):  # refused before any (k, d) matrix is drawn
        sw(x, y, num_projections=10 ** 12, backend=backend)
    with pytest.raises(ValueError, match="disagrees"):
        sw(x, y, num_projections=5, projections=th, backend=backend)
    with pytest.raises(TypeError, match="both be torch tensors or both numpy arrays"):
        sw(x.numpy(), y, projections=th, backend=backend)
    with pytest.raises(TypeError, match="a holds the sample weights"):  # the former third positional argument k
        sw(x, y, 5, backend=backend)
    dp = S.dp_sliced_wasserstein
    with pytest.raises(ValueError, match="noise_std"):
        dp(y, private=x, noise_std=-0.1, projections=th, backend=backend)
    with pytest.raises(ValueError, match="noise_std"):
        dp(y, private=x, noise_std=float("nan"), projections=th, backend=backend)
    with pytest.raises(ValueError, match="clip_radius"):
        dp(y, private=x, noise_std=0.1, projections=th, clip_radius=0.0, backend=backend)
    with pytest.raises(ValueError, match="private"):
        dp(y, private=x[:, :, None], noise_std=0.1, projections=th, backend=backend)
    with pytest.raises(ValueError, match="backend"):
        sw(x, y, projections=th, backend="gpu")


# ------------------------------------------------------------------------------------------------------------
# modules and public exports
# ------------------------------------------------------------------------------------------------------------
def test_modules_match_functions():
    x, y, _ = _data(30, 30, 4, 1)
    m = S.SlicedWassersteinLoss(16, p=1, generator=torch.Generator().manual_seed(2))
    th = S.random_projections(16, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    assert float(m(x, y)) == pytest.approx(float(ref_sw(x, y, th, p=1)), rel=1e-12)
    dm = S.DPSlicedWassersteinLoss(0.5, 16, clip_radius=NO_CLIP, secure_mode=False,
                                   generator=torch.Generator().manual_seed(2))
    val = dm(y, private=x)
    g = torch.Generator().manual_seed(2)
    th = S.random_projections(16, 4, generator=g, dtype=torch.float64)
    want = S.dp_sliced_wasserstein(y, private=x, noise_std=0.5, clip_radius=NO_CLIP, projections=th, secure_mode=False,
                                   generator=g)
    assert float(val) == pytest.approx(float(want), rel=1e-12)
    assert fastdpot.sliced_wasserstein is S.sliced_wasserstein
    assert fastdpot.dp_sliced_wasserstein is S.dp_sliced_wasserstein


def test_noise_std_helper_and_private_module():
    privacy = pytest.importorskip("fastdpot.privacy")
    eps, delta, B, n, T, k, d, r = 5.0, 1e-5, 100, 5000, 200, 50, 8, 1.0
    sigma, det = S.dp_sliced_wasserstein_noise_std(eps, delta, B, n, T, k, d, r)
    d_acc, d_tail = privacy.split_delta(delta, T)
    sens = privacy.sliced_sensitivity(k, d, d_tail, bound="chernoff", diameter=2.0)  # the proven default
    assert det["sensitivity"] == pytest.approx(sens) and det["delta_tail"] == pytest.approx(d_tail)
    assert det["bound"] == "chernoff"
    assert sigma == pytest.approx(det["noise_multiplier"] * sens)
    # the calibrated multiplier spends at most ε over T steps, and not much less
    acc = privacy.PrivacyAccountant("rdp")
    acc.step(det["noise_multiplier"], B / n, num_steps=T, sampling="without_replacement", dataset_size=n,
             batch_size=B)
    spent = acc.get_epsilon(d_acc)
    assert spent <= eps * (1 + 1e-6) and spent > 0.9 * eps
    mod = S.DPSlicedWassersteinLoss.from_privacy(eps, delta, B, n, 2, k, d, r)
    assert mod.clip_radius == r and mod.privacy["steps"] == 2
    x, y, _ = _data(B, 80, d, 1)
    mod(y, private=x)
    with pytest.raises(ValueError, match="batch_size"):
        mod(y, private=x[:50])
    mod(y, private=x)
    with pytest.raises(RuntimeError, match="budget exhausted"):
        mod(y, private=x)
    with pytest.raises(ValueError, match="batch_size must be <= dataset_size"):
        S.dp_sliced_wasserstein_noise_std(eps, delta, n + 1, n, T, k, d, r)
    with pytest.raises(ValueError, match="bound"):
        S.dp_sliced_wasserstein_noise_std(eps, delta, B, n, T, k, d, r, bound="hoeffding")


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,m", [(700, 700), (640, 1031)])
def test_cpu_one_sided_gradient_and_ties(dtype, n, m):
    """Only y requires grad (the private side is sorted without indices); heavy ties and signed zeros."""
    x, y, th = _data(n, m, 5, 12, seed=n)
    x = torch.round(x * 2) / 2  # many exactly tied rows
    x[:20] = 0.0
    x[20:40] = -0.0
    th32, x32, y32 = th.to(dtype), x.to(dtype), y.to(dtype)
    y32.requires_grad_(True)
    lc = S.sliced_wasserstein(x32, y32, projections=th32, backend="cpu")
    gc = torch.autograd.grad(lc, y32)[0]
    yr = y32.detach().double().requires_grad_(True)
    lr = ref_sw(x32.double(), yr, th32.double())
    gr = torch.autograd.grad(lr, yr)[0]
    eps = torch.finfo(dtype).eps
    assert abs(lc.item() - lr.item()) <= 64 * eps * max(1.0, lr.item())
    # ties only on the x side: the gradient w.r.t. y does not depend on how they are broken
    torch.testing.assert_close(gc.double(), gr, rtol=64 * eps, atol=64 * eps * float(gr.abs().max()))


@needs_cpp
def test_kernel_refuses_bad_buffers():
    """The raw kernel writes in place: it must refuse (never silently convert) mismatched buffers."""
    from fastdpot._ext import load_cpp

    mod = load_cpp("sliced")
    px, py = torch.randn(3, 10), torch.randn(3, 7)
    ok = mod.sw_chunk_f32(px.numpy(), py.numpy(), 2, 0.0, 1, 0, 1.0, None, None, None, None)
    assert ok.shape == (3,)
    with pytest.raises(TypeError):  # float64 input to the float32 kernel: no conversion
        mod.sw_chunk_f32(px.double().numpy(), py.numpy(), 2, 0.0, 1, 0, 1.0, None, None, None, None)
    with pytest.raises(ValueError, match="dtype"):
        mod.sw_chunk_f32(px.numpy(), py.numpy(), 2, 0.0, 1, 0, 1.0, torch.empty(3, 10).double().numpy(),
                         None, None, None)
    with pytest.raises(ValueError, match="shape"):
        mod.sw_chunk_f32(px.numpy(), py.numpy(), 2, 0.0, 1, 0, 1.0, torch.empty(3, 11).numpy(), None, None, None)
    with pytest.raises(ValueError, match="p must be 1 or 2"):
        mod.sw_chunk_f32(px.numpy(), py.numpy(), 3, 0.0, 1, 0, 1.0, None, None, None, None)
    with pytest.raises(ValueError, match="same kc"):
        mod.sw_chunk_f32(px.numpy(), torch.randn(2, 7).numpy(), 2, 0.0, 1, 0, 1.0, None, None, None, None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_noise_replay_float32_private_side_without_grad(backend):
    x, y, th = _data(500, 420, 6, 9, dtype=torch.float32, seed=12)
    y.requires_grad_(True)
    loss, nx, ny = S.dp_sliced_wasserstein(y, private=x, noise_std=0.6, clip_radius=NO_CLIP, projections=th,
                                           secure_mode=False, generator=torch.Generator().manual_seed(4),
                                           backend=backend, return_noise=True)
    yr = y.detach().double().requires_grad_(True)
    replay = ref_sw(x.double(), yr, th.double(), noise_x=nx.double(), noise_y=ny.double())
    eps = torch.finfo(torch.float32).eps
    assert abs(loss.item() - replay.item()) <= 64 * eps * replay.item()
    g = torch.autograd.grad(loss, y)[0]
    gr = torch.autograd.grad(replay, yr)[0]
    torch.testing.assert_close(g.double(), gr, rtol=64 * eps, atol=64 * eps * float(gr.abs().max()))
