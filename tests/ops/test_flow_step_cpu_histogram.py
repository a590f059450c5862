"""The sort-free (histogram) C++ flow step (csrc/cpu_histogram.cpp, fastdpot.flow_histogram): against the torch
reference with replayed noise (float64 tight, float32 with tolerances from the arithmetic), the same Philox draws as
the C++ exact step, sketch mode, chunking, the passes and index_offset (shards == the whole), bad input."""
import math

import pytest
import torch

import fastdpot.ops.flow as F  # the op module (flow_step, its backends, _CPU_MAX_CHUNK)
import fastdpot.ops.cpu_histogram as H
from fastdpot._ext import BackendUnavailableError
from fastdpot.reference.flow import flow_step as ref_step, histogram_levels

pytestmark = pytest.mark.skipif(not H.available()[0], reason="C++ extension fastdpot._C_flow_histogram not built")


def _inputs(n, m, d, k, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randn(m, d, generator=g, dtype=torch.float64) * 0.7 + 0.5
    th = torch.randn(k, d, generator=g, dtype=torch.float64)
    th = th / th.norm(dim=1, keepdim=True)
    return x.to(dtype), y.to(dtype), th.to(dtype)


SHAPES = [  # n, m, d, k, bins, reg
    (200, 50, 3, 5, 64, 0.0),
    (1001, 250, 8, 70, 100, 0.1),   # several 64-particle blocks and a tail
    (2, 1, 1, 1, 2, 0.0),           # the smallest step
    (67, 3, 5, 9, 7, 0.3),          # odd sizes everywhere
    (130, 20, 48, 20, 33, 0.1),     # d = 48, k not a multiple of the register tile
    (300, 40, 3, 1, 1, 0.0),        # one bin: u = frac
]


def test_draws_are_those_of_the_cpp_exact_step():
    """Same Philox streams as csrc/flow.cpp: particle noise (stream 2j), privacy-grade private noise (2j+1),
    Brownian (2k); the replay tests above would pass with any noise, this one pins the conventions."""
    x, y, th = _inputs(150, 30, 4, 6)
    kw = dict(noise_std=0.4, step_size=0.5, diffusion=0.2, seed=99, return_noise=True, backend="cpu")
    _, _, nh = F.flow_step(x, y, th, quantiles="histogram", histogram_bins=16, **kw)
    _, _, ne = F.flow_step(x, y, th, quantiles="exact", **kw)
    for key in ("particles", "private", "brownian"):
        torch.testing.assert_close(nh[key], ne[key], rtol=0, atol=0)
    assert abs(float(nh["particles"].std()) - 0.4) < 0.05


SEED32 = 5  # data with no projection within the float32 error of a bin edge (asserted below)


def test_float32_error_is_that_of_float32_arithmetic():
    """float32 kernel vs the float64 reference on the same inputs and draws. Tolerance from the arithmetic: the
    projection errs by <= (d + 2)·ε·Σ_c|x_c θ_c| (ε = 2^-24 per rounding, doubled), the bin coordinate t by
    B·(2Δs + 4ε·range)/range, the level u by max_b n_b/N·Δt + 4ε, the target by (M - 1)·max gap·Δu + 4ε|q|, and
    the drift (unit θ) by at most the largest residual error. The data are chosen so that no projection lies within
    the bin-coordinate error of a bin edge (asserted: otherwise a count could move by one, a different answer)."""
    n, m, d, k, bins = 300, 60, 6, 4, 16
    x, y, th = _inputs(n, m, d, k, dtype=torch.float32, seed=SEED32)
    new, drift, noise = H.histogram_flow_step(x, y, th, noise_std=0.3, step_size=0.5, diffusion=0.0, seed=11,
                                              histogram_bins=bins, return_noise=True)
    x64, y64, th64 = x.double(), y.double(), th.double()
    nx, ny = noise["particles"].double(), noise["private"].double()
    rn, rd = ref_step(x64, y64, th64, nx, ny, 0.5, histogram_bins=bins, quantiles="histogram")
    eps = 2.0 ** -23
    xp = x64 @ th64.t() + nx
    ds = (d + 2) * eps * float(((x64.abs() @ th64.abs().t()) + nx.abs()).max())
    rng = (xp.amax(0) - xp.amin(0))
    t = (xp - xp.amin(0)) / (rng / bins)
    dt = float((bins * (2 * ds + 4 * eps * rng) / rng).max())
    frac_edge = (t - t.round()).abs()[(t > 0.5) & (t < bins - 0.5)]
    assert float(frac_edge.min()) > 4 * dt, "test data: a projection lies on a bin edge; pick another seed"
    counts = torch.stack([torch.bincount(t[:, j].clamp(0, bins).long().clamp(max=bins - 1), minlength=bins)
                          for j in range(k)])
    du = float(counts.max()) / n * dt + 4 * eps
    q = torch.sort(y64 @ th64.t() + ny, dim=0).values
    gap = float((q[1:] - q[:-1]).max())
    dT = (m - 1) * gap * du + 4 * eps * float(q.abs().max())
    tol = 4 * (ds + dT)
    assert float((drift.double() - rd).abs().max()) <= tol
    assert float((new.double() - rn).abs().max()) <= 0.5 * tol + 4 * eps * float(rn.abs().max())
    assert tol < 1e-2 * float(rd.abs().max())  # the bound is meaningful: far below the drift's scale


def test_chunking_does_not_change_the_result(monkeypatch):
    x, y, th = _inputs(400, 30, 5, 11, seed=7)
    kw = dict(noise_std=0.3, step_size=0.5, diffusion=0.1, seed=3, quantiles="histogram", histogram_bins=40,
              return_noise=True, backend="cpu")
    whole = F.flow_step(x, y, th, **kw)
    monkeypatch.setattr(F, "_CPU_MAX_CHUNK", 3)  # 11 directions in chunks of 3, 3, 3, 2
    chunked = F.flow_step(x, y, th, **kw)
    torch.testing.assert_close(chunked[1], whole[1], rtol=1e-12, atol=1e-13)
    rn, rd = ref_step(x, y, th, chunked[2]["particles"], chunked[2]["private"], 0.5, diffusion=0.1, brownian=chunked[2]["brownian"], histogram_bins=40, quantiles="histogram")
    torch.testing.assert_close(chunked[0], rn, rtol=1e-10, atol=1e-11)


def test_passes_compose_to_the_fused_step():
    x, y, th = _inputs(250, 40, 4, 9, seed=9)
    kw = dict(noise_std=0.3, seed=21)
    new, drift, _ = H.histogram_flow_step(x, y, th, step_size=0.5, diffusion=0.2, histogram_bins=50, **kw)
    mn, mx, nx = H.histogram_minmax(x, th, return_noise=True, **kw)
    xp = x @ th.t() + nx
    torch.testing.assert_close(mn, xp.amin(0), rtol=0, atol=1e-14)
    torch.testing.assert_close(mx, xp.amax(0), rtol=0, atol=1e-14)
    counts = H.histogram_counts(x, th, mn, mx, 50, **kw)
    assert counts.dtype == torch.int64 and bool((counts.sum(1) == 250).all())
    u = histogram_levels(xp, 50)  # the reference's levels from these counts: C_b / N at each particle's bin
    assert float(u.min()) == 0.0 and abs(float(u.max()) - 1.0) < 1e-12
    target = H.private_targets(y, th, **kw)
    assert bool((target[:, 1:] >= target[:, :-1]).all())
    new2, drift2 = H.histogram_update(x, th, mn, mx, counts, step_size=0.5, diffusion=0.2, target=target, **kw)
    torch.testing.assert_close(new2, new, rtol=0, atol=0)
    torch.testing.assert_close(drift2, drift, rtol=0, atol=0)


def test_missing_module_makes_the_cpu_backend_unavailable(monkeypatch):
    # the cpu row needs both compiled modules: asked for, it names the missing one; "auto" takes the reference
    x, y, th = _inputs(100, 20, 3, 4)
    kw = dict(noise_std=0.3, step_size=0.5, seed=1, quantiles="histogram", histogram_bins=16)
    monkeypatch.setattr(H, "available", lambda: (False, "ImportError: simulated"))
    with pytest.raises(BackendUnavailableError, match="simulated"):
        F.flow_step(x, y, th, backend="cpu", **kw)
    auto = F.flow_step(x, y, th, backend="auto", **kw)
    ref = F.flow_step(x, y, th, backend="reference", **kw)
    torch.testing.assert_close(auto[0], ref[0], rtol=0, atol=0)


def test_bad_input():
    x, y, th = _inputs(50, 10, 3, 4)
    kw = dict(noise_std=0.3, seed=1)
    mn, mx = H.histogram_minmax(x, th, **kw)
    counts = H.histogram_counts(x, th, mn, mx, 8, **kw)
    target = H.private_targets(y, th, **kw)
    up = dict(step_size=0.5, **kw)
    with pytest.raises(ValueError, match="index_offset"):
        H.histogram_minmax(x, th, index_offset=-1, **kw)
    with pytest.raises(ValueError, match="histogram_bins"):
        H.histogram_counts(x, th, mn, mx, 0, **kw)
    with pytest.raises(ValueError, match="col_max"):
        H.histogram_counts(x, th, mx, mn - 1, 8, **kw)
    with pytest.raises(ValueError, match="same global number"):
        bad = counts.clone()
        bad[1, 0] += 1
        H.histogram_update(x, th, mn, mx, bad, target=target, **up)
    with pytest.raises(ValueError, match="exactly one target"):
        H.histogram_update(x, th, mn, mx, counts, **up)
    with pytest.raises(ValueError, match="counts"):
        H.histogram_update(x, th, mn, mx, counts.double(), target=target, **up)
    with pytest.raises(ValueError, match="float32/float64"):
        H.histogram_minmax(x.half(), th, **kw)
    with pytest.raises(ValueError, match="share d"):
        H.histogram_minmax(x[:, :2], th, **kw)
    with pytest.raises(ValueError, match="non-finite"):
        H.histogram_minmax(x.clone().index_fill_(0, torch.tensor([3]), math.nan), th, **kw)
    with pytest.raises(ValueError, match="N >= 2"):
        H.histogram_flow_step(x[:1], y, th, step_size=0.5, histogram_bins=4, **kw)
    with pytest.raises(ValueError, match="sketch"):
        H.histogram_flow_step(x, None, th, step_size=0.5, histogram_bins=4, sketch=(torch.zeros(3, 2), torch.tensor([0.2, 0.8])),
                              **kw)
    with pytest.raises(ValueError, match="step_size"):
        H.histogram_update(x, th, mn, mx, counts, target=target, noise_std=0.3, seed=1, step_size=0.0)
    with pytest.raises(ValueError, match="histogram_bins"):
        F.flow_step(x, y, th, noise_std=0.3, step_size=0.5, quantiles="histogram", backend="cpu")
    assert torch.isfinite(x).all()  # inputs untouched


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_materialized_projections_give_the_recomputed_step(dtype):
    """materialize=True stores pass 1's noisy projections and reads them back in passes 2 and 3: the same numbers
    as recomputing them (the default), bit for bit."""
    x, y, th = _inputs(300, 20, 5, 9, dtype=dtype, seed=13)
    kw = dict(noise_std=0.3, step_size=0.5, diffusion=0.1, seed=4, histogram_bins=30, return_noise=True)
    a = H.histogram_flow_step(x, y, th, materialize=False, **kw)
    b = H.histogram_flow_step(x, y, th, materialize=True, max_chunk=4, **kw)
    c = H.histogram_flow_step(x, y, th, materialize=True, **kw)
    torch.testing.assert_close(c[0], a[0], rtol=0, atol=0)
    torch.testing.assert_close(b[0], a[0], rtol=1e-12 if dtype == torch.float64 else 1e-5, atol=1e-6)
    torch.testing.assert_close(c[2]["particles"], a[2]["particles"], rtol=0, atol=0)


def test_the_kernel_names_a_simd_level_this_cpu_has():
    """Issue 45: ``_C_flow_histogram.simd`` is the level the kernel was compiled for (the bench rows record it beside
    the CPU's): one of fastdpot.env.SIMD_LEVELS, and no wider than what this CPU reports."""
    from fastdpot._ext import load_cpp
    from fastdpot.env import SIMD_LEVELS, cpu_simd

    level = load_cpp("flow_histogram").simd
    assert level in SIMD_LEVELS
    if cpu_simd() != "none":  # /proc/cpuinfo readable
        assert SIMD_LEVELS.index(level) <= SIMD_LEVELS.index(cpu_simd())


# the AVX2 build's outputs on fixed inputs (run in a subprocess that imports the AVX2 modules, not fastdpot)
_AVX2_SCRIPT = r"""
import glob, importlib.util, os, sys
import numpy as np
lib, out = sys.argv[1], sys.argv[2]
def load(name):
    (path,) = glob.glob(os.path.join(lib, "fastdpot", f"_C_{name}.*"))
    spec = importlib.util.spec_from_file_location(f"fastdpot._C_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
F, H = load("flow"), load("flow_histogram")
res = dict(simd=np.array(H.simd))
inp = np.load(os.path.join(out, "inputs.npz"))
for tag in ("f32", "f64"):
    x, y, th = inp["x_" + tag], inp["y_" + tag], inp["th_" + tag]
    for bins in (1, 64, 1000):
        new, drift = np.empty_like(x), np.empty_like(x)
        nx = np.empty((x.shape[0], th.shape[0]), x.dtype)
        H.hist_flow_step(x, y, th, 0.3, 0.5, 0.1, 7, bins, new, drift, nx)
        res.update({f"hist_{tag}_{bins}_new": new, f"hist_{tag}_{bins}_nx": nx})
    new, drift = np.empty_like(x), np.empty_like(x)
    F.flow_step(x, y, th, 0.3, 0.5, 0.1, 7, 0, new, drift, None, None, None)
    res[f"exact_{tag}_new"] = new
for smooth in (False, True):
    for off in (0, 5, 4 * (2 ** 32 - 3) + 1):  # the last: the low counter word wraps inside a batch
        res[f"normals_{smooth}_{off}"] = F._normals(2 ** 61 + 3, 11, off, 1000, smooth, False)[0]
np.savez(os.path.join(out, "avx2.npz"), **res)
"""


@pytest.mark.slow
def test_the_avx2_build_computes_what_this_build_computes(tmp_path):
    """Issue 45: the AVX2 code paths (AVX2 Philox, the 12-accumulator product tile, the pair lookups of pass 3) are
    compiled only without AVX-512, so on an AVX-512 machine the default tests never run them: build the two flow
    kernels with FASTDPOT_MARCH=x86-64-v3 and compare with this build on the same inputs: the normals bit for bit,
    the histogram step's noise bit for bit and its particles (and the exact step's) to float rounding (pass 3's
    level is a multiply-add where the AVX-512 path rounds twice; the exact step's drift tile differs)."""
    import os
    import shutil
    import subprocess
    import sys

    import numpy as np

    from fastdpot._ext import load_cpp
    from fastdpot.env import cpu_simd

    if cpu_simd() not in ("avx2", "avx512") or shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("needs an x86-64 CPU with AVX2 and a C++ compiler")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    lib = tmp_path / "lib"
    env = dict(os.environ, FASTDPOT_MARCH="x86-64-v3", FASTDPOT_EXT="flow,flow_histogram", FASTDPOT_CUDA="0")
    subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", str(lib), "--build-temp",
                    str(tmp_path / "tmp")], cwd=root, env=env, check=True, capture_output=True)
    inputs = {}
    for tag, dtype in (("f32", torch.float32), ("f64", torch.float64)):
        x, y, th = _inputs(1001, 37, 48, 70, dtype=dtype, seed=3)  # a tail block, k and d not tile multiples
        inputs.update({"x_" + tag: x.numpy(), "y_" + tag: y.numpy(), "th_" + tag: th.numpy()})
    np.savez(tmp_path / "inputs.npz", **inputs)
    subprocess.run([sys.executable, "-c", _AVX2_SCRIPT, str(lib), str(tmp_path)], check=True)
    got = np.load(tmp_path / "avx2.npz")
    assert str(got["simd"]) == "avx2"
    Fm, Hm = load_cpp("flow"), load_cpp("flow_histogram")
    for tag in ("f32", "f64"):
        x, y, th = inputs["x_" + tag], inputs["y_" + tag], inputs["th_" + tag]
        tol = dict(rtol=1e-5, atol=1e-5) if tag == "f32" else dict(rtol=1e-12, atol=1e-12)
        for bins in (1, 64, 1000):
            new, drift = np.empty_like(x), np.empty_like(x)
            nx = np.empty((x.shape[0], th.shape[0]), x.dtype)
            Hm.hist_flow_step(x, y, th, 0.3, 0.5, 0.1, 7, bins, new, drift, nx)
            np.testing.assert_array_equal(got[f"hist_{tag}_{bins}_nx"], nx)
            np.testing.assert_allclose(got[f"hist_{tag}_{bins}_new"], new, **tol)
        new, drift = np.empty_like(x), np.empty_like(x)
        Fm.flow_step(x, y, th, 0.3, 0.5, 0.1, 7, 0, new, drift, None, None, None)
        np.testing.assert_allclose(got[f"exact_{tag}_new"], new, **tol)
    for smooth in (False, True):
        for off in (0, 5, 4 * (2 ** 32 - 3) + 1):
            mine = Fm._normals(2 ** 61 + 3, 11, off, 1000, smooth, False)[0]
            np.testing.assert_array_equal(got[f"normals_{smooth}_{off}"], mine)
