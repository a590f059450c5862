"""The flow step: reference semantics (vs a numpy transcription of the authors' grid procedure), exact == grid at
Q = N, the fused C++ step vs the reference (noise replayed), chunking, and the noise the C++ step draws."""
import math

import numpy as np
import pytest
import scipy.stats
import torch

import fastdpot.ops.flow as F  # the op module (flow_step, its backends, _CPU_MAX_CHUNK)
from fastdpot._ext import BackendUnavailableError, cpp_status, load_cpp
from fastdpot.reference.flow import flow_step as ref_step

HAVE_CPU = cpp_status("flow")[0]
needs_cpu = pytest.mark.skipif(not HAVE_CPU, reason="C++ extension fastdpot._C_flow not built")


def _inputs(n, m, d, k, dtype=torch.float64, seed=0, sigma=0.3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=dtype)
    y = torch.randn(m, d, generator=g, dtype=dtype) * 0.7 + 0.5
    th = torch.randn(k, d, generator=g, dtype=torch.float64)
    th = (th / th.norm(dim=1, keepdim=True)).to(dtype)
    nx = sigma * torch.randn(n, k, generator=g, dtype=dtype)
    ny = sigma * torch.randn(m, k, generator=g, dtype=dtype)
    br = torch.randn(n, d, generator=g, dtype=dtype)
    return x, y, th, nx, ny, br


def _authors_grid(x, y, th, nx, ny, h, Q):
    """Direct transcription of the authors' per-step procedure (numpy; Sebag et al., TMLR): (k, n) layout,
    numpy.quantile on a Q-level grid, two numpy.interp calls, drift (1/k) Σ_j (Xp_j − T_j) θ_j."""
    x, y, th, nx, ny = (t.numpy() for t in (x, y, th, nx, ny))
    k = th.shape[0]
    Xp = (x @ th.T).T + nx.T
    Yp = (y @ th.T).T + ny.T
    levels = np.linspace(0, 1, Q)
    tq = np.quantile(Yp, levels, axis=1)  # (Q, k), linear interpolation
    xq = np.quantile(Xp, levels, axis=1)
    T = np.empty_like(Xp)
    for j in range(k):
        cdf = np.interp(Xp[j], xq[:, j], levels)
        T[j] = np.interp(cdf, levels, tq[:, j])
    drift = (Xp - T).T @ th / k
    return x - h * drift, drift


@pytest.mark.parametrize("n,m,d,k,Q", [(50, 13, 3, 7, 10), (61, 250, 5, 4, 61), (200, 37, 2, 11, 1000), (2, 1, 1, 1, 2)])
def test_reference_grid_matches_authors_transcription(n, m, d, k, Q):
    x, y, th, nx, ny, _ = _inputs(n, m, d, k)
    new, drift = ref_step(x, y, th, nx, ny, 0.7, quantiles="grid", num_quantiles=Q)
    new_a, drift_a = _authors_grid(x, y, th, nx, ny, 0.7, Q)
    np.testing.assert_allclose(drift.numpy(), drift_a, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(new.numpy(), new_a, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("n,m", [(40, 40), (97, 13), (33, 250)])
def test_exact_equals_grid_at_q_equal_n(n, m):
    x, y, th, nx, ny, _ = _inputs(n, m, 4, 6, seed=1)
    _, d_exact = ref_step(x, y, th, nx, ny, 1.0, quantiles="exact")
    _, d_grid = ref_step(x, y, th, nx, ny, 1.0, quantiles="grid", num_quantiles=n)
    torch.testing.assert_close(d_exact, d_grid, rtol=1e-9, atol=1e-11)


@needs_cpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpu_exact_equals_cpu_grid_at_q_equal_n(dtype):
    x, y, th, _, _, _ = _inputs(777, 250, 8, 13, dtype=dtype, seed=12)
    _, d_exact, _ = F.flow_step(x, y, th, noise_std=0.3, step_size=1.0, seed=4, backend="cpu")
    _, d_grid, _ = F.flow_step(x, y, th, noise_std=0.3, step_size=1.0, seed=4, quantiles="grid", num_quantiles=777,
                               backend="cpu")
    torch.testing.assert_close(d_exact, d_grid, **_tol(dtype))


def test_exact_transport_is_the_rank_map():
    # equal sizes: rank r of the particles goes exactly to the r-th smallest private value
    x, y, th, nx, ny, _ = _inputs(30, 30, 3, 5, seed=2)
    xp, yp = x @ th.t() + nx, y @ th.t() + ny
    _, drift = ref_step(x, y, th, nx, ny, 1.0)
    order = xp.argsort(0)
    target = torch.empty_like(xp).scatter_(0, order, yp.sort(0).values)
    torch.testing.assert_close(drift, (xp - target) @ th / 5, rtol=1e-12, atol=1e-12)


def test_reference_one_dimensional_flow_moves_onto_target():
    # d = 1, k = 1, h = 1, no noise, N = M: one step maps the particles exactly onto the sorted target
    x = torch.randn(64, 1, dtype=torch.float64)
    y = torch.randn(64, 1, dtype=torch.float64) * 2 + 3
    th = torch.ones(1, 1, dtype=torch.float64)
    new, _ = ref_step(x, y, th, None, None, 1.0)
    torch.testing.assert_close(new.sort(0).values, y.sort(0).values, rtol=0, atol=1e-12)


def test_reference_brownian_term():
    x, y, th, nx, ny, br = _inputs(20, 10, 3, 4)
    new0, drift = ref_step(x, y, th, nx, ny, 0.5)
    new1, drift1 = ref_step(x, y, th, nx, ny, 0.5, diffusion=0.2, brownian=br)
    torch.testing.assert_close(drift, drift1)
    torch.testing.assert_close(new1 - new0, math.sqrt(2 * 0.2 * 0.5) * br)


def _tol(dtype):
    return dict(rtol=1e-10, atol=1e-11) if dtype == torch.float64 else dict(rtol=2e-4, atol=2e-5)


@needs_cpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n", [40, 700])  # below and above the radix-sort threshold
def test_cpu_ties_keep_input_order_like_the_reference(dtype, n):
    # repeated particles and no noise: tied projections; both sorts are stable, so the rank map agrees exactly.
    # Ties must be ties in every arithmetic: the oblique direction is (0.6, 0.8, 0) rounded to multiples of 2^-21
    # (unit to 1e-13), so its projections of integers in [-3, 3] are exact in float32 whatever the summation order
    # or FMA contraction (|p|, |q| < 2^21 and |value| < 2^3 need at most 24 bits). With (0.6, 0.8, 0) itself the
    # mathematically tied values 0.6·a + 0.8·b = 0.6·(a+4) + 0.8·(b−3) round differently in torch's matmul and in
    # the kernel's FMA tiles on some CPUs, and stable ranks flip between values that are not ties in float32.
    g = torch.Generator().manual_seed(11)
    x = torch.randint(-3, 4, (n, 3), generator=g).to(dtype)
    y = torch.randn(57, 3, generator=g, dtype=dtype)
    p, q = 1258292 / 2**21, 1677721 / 2**21
    th = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [p, q, 0.0]], dtype=dtype)
    assert (x @ th.t()).double().equal(x.double() @ th.double().t())  # every projection exact in this dtype
    new, drift, _ = F.flow_step(x, y, th, noise_std=0.0, step_size=1.0, backend="cpu")
    rn, rd = ref_step(x, y, th, None, None, 1.0)
    torch.testing.assert_close(drift, rd, **_tol(dtype))


@needs_cpu
@pytest.mark.parametrize("n", [5000, 65_536, 65_537, 3_000_001])
def test_cpu_float32_three_pass_ties_keep_input_order(n):
    # float32 keys whose three 11-bit digits all vary, with many exact ties, and indices on both sides of 2^16 (the
    # index sort's 2-byte / 4-byte indices) and above 2^21: radix_f32.h's three-pass sort_emit_f32 must give the
    # reference's stable ranks
    g = torch.Generator().manual_seed(12)
    values = torch.randn(97, generator=g) * 3.0
    x = values[torch.randint(0, 97, (n,), generator=g)].reshape(n, 1)
    y = torch.randn(40, 1, generator=g)
    th = torch.ones(1, 1)
    _, drift, _ = F.flow_step(x, y, th, noise_std=0.0, step_size=1.0, backend="cpu")
    _, rd = ref_step(x, y, th, None, None, 1.0)
    torch.testing.assert_close(drift, rd, **_tol(torch.float32))


@needs_cpu
@pytest.mark.parametrize("n,d,k", [(37, 3, 5), (1000, 48, 300), (999, 20, 17), (2001, 8, 70)])
def test_cpu_float32_projections_are_float32_accurate(n, d, k):
    # The kernel's projections, isolated from ranks: with every private row the same point c, every target quantile
    # is θ_jᵀc, so drift_i = (1/k) Σ_j θ_jᵀ(x_i − c) θ_j whatever the order of the projected values (no tie or
    # near-tie can move it). The float32 kernel must then be as close to float64 as float32 torch itself is: a
    # projection error (not a rank flip) fails this on any CPU, with or without FMA or AVX-512.
    x, _, th, _, _, _ = _inputs(n, 1, d, k, dtype=torch.float32, seed=5)
    c = torch.randn(1, d, generator=torch.Generator().manual_seed(6)) * 0.3
    y = c.expand(13, d).contiguous()
    _, drift, _ = F.flow_step(x, y, th, noise_std=0.0, step_size=1.0, backend="cpu")
    _, d64 = ref_step(x.double(), y.double(), th.double(), None, None, 1.0)
    _, d32 = ref_step(x, y, th, None, None, 1.0)
    err_cpu = (drift.double() - d64).abs().max().item()
    err_torch = (d32.double() - d64).abs().max().item()
    scale = d64.abs().max().item()
    # float32 rounding of a length-d dot and a length-k sum is a few ulps of the largest term; 4x torch's own
    # error (or 64 ulps of the drift's scale, if torch happens to be exact) leaves room for another summation order
    assert err_cpu <= 4 * err_torch + 64 * 2.0**-24 * scale, (err_cpu, err_torch, scale)


@needs_cpu
def test_cpu_float32_error_is_that_of_float32_arithmetic():
    # both float32 paths are compared to the float64 reference on the same (float32-representable) draws
    x, y, th, _, _, _ = _inputs(2000, 250, 8, 70, dtype=torch.float32, seed=4)
    new, drift, noise = F.flow_step(x, y, th, noise_std=0.5, step_size=1.0, seed=7, return_noise=True,
                                    backend="cpu")
    args64 = [t.double() for t in (x, y, th, noise["particles"], noise["private"])]
    _, d64 = ref_step(*args64, 1.0)
    _, d32 = ref_step(x, y, th, noise["particles"], noise["private"], 1.0)
    err_cpu = (drift.double() - d64).abs().max().item()
    err_torch = (d32.double() - d64).abs().max().item()
    assert err_cpu <= 10 * err_torch + 1e-6, (err_cpu, err_torch)


@needs_cpu
@pytest.mark.parametrize("mode,Q", [("exact", None), ("grid", 50)])
def test_cpu_chunking_does_not_change_the_result(monkeypatch, mode, Q):
    x, y, th, _, _, _ = _inputs(300, 40, 6, 11, seed=5)
    full = F.flow_step(x, y, th, noise_std=0.2, step_size=0.5, diffusion=0.1, seed=9, quantiles=mode, num_quantiles=Q,
                       backend="cpu")
    monkeypatch.setattr(F, "_CPU_MAX_CHUNK", 3)  # 11 directions in chunks of 3, 3, 3, 2
    chunked = F.flow_step(x, y, th, noise_std=0.2, step_size=0.5, diffusion=0.1, seed=9, quantiles=mode,
                          num_quantiles=Q, backend="cpu")
    torch.testing.assert_close(full[0], chunked[0], rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(full[1], chunked[1], rtol=1e-13, atol=1e-13)


@needs_cpu
def test_cpu_noise_is_replayable_and_gaussian():
    x, y, th, _, _, _ = _inputs(4000, 300, 4, 16, seed=6)
    a = F.flow_step(x, y, th, noise_std=0.7, step_size=0.5, diffusion=0.5, seed=11, return_noise=True, backend="cpu")
    b = F.flow_step(x, y, th, noise_std=0.7, step_size=0.5, diffusion=0.5, seed=11, return_noise=True, backend="cpu")
    c = F.flow_step(x, y, th, noise_std=0.7, step_size=0.5, diffusion=0.5, seed=12, return_noise=True, backend="cpu")
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    assert not torch.equal(a[0], c[0])
    for key, scale in (("particles", 0.7), ("private", 0.7), ("brownian", 1.0)):
        z = (a[2][key] / scale).flatten().numpy()
        assert abs(z.mean()) < 5 / math.sqrt(z.size)
        assert abs(z.var() - 1) < 6 * math.sqrt(2 / z.size)
        assert scipy.stats.kstest(z, "norm").pvalue > 1e-4
    # particle and private streams are different draws
    assert not torch.allclose(a[2]["particles"][:300], a[2]["private"])


def test_auto_backend_on_cpu():
    from fastdpot._dispatch import dispatch

    name, _ = dispatch("flow_step", "auto", "cpu", 10)
    assert name == ("cpu" if HAVE_CPU else "reference")


@pytest.mark.parametrize("kwargs,match", [
    (dict(step_size=0.0), "step_size"), (dict(step_size=-1.0), "step_size"), (dict(diffusion=-0.1), "diffusion"),
    (dict(noise_std=-1.0), "noise_std"), (dict(quantiles="median"), "quantiles"),
    (dict(quantiles="grid", num_quantiles=1), "num_quantiles"), (dict(quantiles="histogram"), "histogram_bins"),
    (dict(quantiles="exact", num_quantiles=5), "grid"), (dict(histogram_bins=5), "histogram_bins"),
])
def test_flow_step_bad_arguments(kwargs, match):
    x, y, th, _, _, _ = _inputs(10, 5, 3, 4)
    args = dict(noise_std=0.1, step_size=0.5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        F.flow_step(x, y, th, **args)


def test_flow_step_bad_shapes_and_values():
    x, y, th, _, _, _ = _inputs(10, 5, 3, 4)
    with pytest.raises(ValueError, match="share d"):
        F.flow_step(x, y[:, :2], th, noise_std=0.1, step_size=0.5)
    with pytest.raises(ValueError, match="N >= 2"):
        F.flow_step(x[:1], y, th, noise_std=0.1, step_size=0.5)
    bad = x.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="particles"):
        F.flow_step(bad, y, th, noise_std=0.1, step_size=0.5)
    with pytest.raises(ValueError, match="brownian"):
        ref_step(x, y, th, None, None, 0.5, diffusion=0.1)
    with pytest.raises(BackendUnavailableError):
        F.flow_step(x, y, th, noise_std=0.1, step_size=0.5, backend="keops")


@needs_cpu
def test_cpu_step_refuses_outputs_that_share_memory():
    # the kernel first-touches its outputs at the start of the step: an output aliasing an input would corrupt it
    mod = load_cpp("flow")
    x, y, th, _, _, _ = _inputs(40, 5, 3, 4)
    xn, yn, tn = x.numpy(), y.numpy(), th.numpy()
    keep = xn.copy()
    drift = np.empty_like(xn)
    with pytest.raises(ValueError, match="share memory with inputs"):
        mod.flow_step(xn, yn, tn, 0.1, 0.5, 0.0, 1, 0, xn, drift, None, None, None)
    assert np.array_equal(xn, keep)  # refused before anything was written
    new = np.empty_like(xn)
    with pytest.raises(ValueError, match="must not share memory"):
        mod.flow_step(xn, yn, tn, 0.1, 0.5, 0.0, 1, 0, new, new, None, None, None)
    mod.flow_step(xn, yn, tn, 0.1, 0.5, 0.0, 1, 0, new, drift, None, None, None)  # distinct outputs: fine
    assert np.isfinite(new).all()


@pytest.mark.skipif(not cpp_status("flow")[0], reason="needs the C++ extension")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpu_sketch_step_at_large_d_is_the_reference_step(dtype):
    # d >= F._GEMM_MIN_DIM: torch.matmul projects and accumulates, the C++ radix transport does the rest
    from fastdpot.flows.directions import patch_block

    th64, _ = patch_block(16, 18, 4)  # d = 288 >= 256: one orthonormal block of 288 patch-DCT directions
    assert th64.shape[1] >= F._GEMM_MIN_DIM
    g = torch.Generator().manual_seed(0)
    x64 = torch.rand(300, 288, generator=g, dtype=torch.float64)
    table = torch.sort(torch.randn(288, 6, generator=g, dtype=torch.float64), 1).values
    levels = (torch.arange(6, dtype=torch.float64) + 0.5) / 6
    kw = dict(noise_std=0.0, step_size=0.5 * 288, sketch=(table, levels))
    want, want_drift, _ = F.flow_step(x64, None, th64, backend="reference", **kw)
    got, drift, _ = F.flow_step(x64.to(dtype), None, th64.to(dtype), backend="cpu", **kw)
    # float64: rounding only; float32: a sum of d products per projection and per drift coordinate, plus rank swaps
    # of projections within float32's spacing, which move a target by at most the table's slope over one rank
    slope = float(((table[:, 1:] - table[:, :-1]) / (levels[1:] - levels[:-1])).abs().max())
    tol = 1e-10 if dtype == torch.float64 else 0.5 * slope / 299 + 1e-4  # one rank's swap, at α = 1/2
    torch.testing.assert_close(got.double(), want, rtol=0, atol=tol)
    torch.testing.assert_close(drift.double(), want_drift, rtol=0, atol=tol)
    if dtype == torch.float64:  # the rank map: every projection lands on its level's target (α = 1/2: half way)
        s = x64 @ th64.t()
        ranks = torch.argsort(torch.argsort(s, 0), 0).double() / 299
        from fastdpot.privacy.sketch import quantile_table_eval

        target = quantile_table_eval(table, levels, ranks.t()).t()
        torch.testing.assert_close(got @ th64.t(), s - 0.5 * (s - target), rtol=0, atol=1e-9)
